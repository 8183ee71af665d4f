"""Read and write Hurray streams, in two framings.

* ``"bare"`` -- what the reference's ``StreamWriter`` produces and
  ``interchange.md § Scope`` calls the canonical multi-tensor encoding: each tensor's
  descriptor followed by its buffers (buffer-table order, no padding), back to back.
* ``"messages"`` -- the interchange message framing (``interchange.md § Message
  Framing`` and ``§ Streaming: Tensor Descriptor and Data Frames``): per tensor a
  ``TENSOR_DESCRIPTOR`` message, ``TENSOR_DATA`` frames, ``TENSOR_DATA_END``.  A tensor's
  data plane is its buffers concatenated in buffer-table order, so ``total_data_bytes``
  is the sum of their ``byte_size`` s (our reading of the spec; see ``specmap_io.md``).

Composite heads bind the next ``member_count`` tensors as they arrive
(``interchange.md § Composite Tensor Streaming``).  The reader keeps only the composite
being bound plus the buffers of the tensor being read.
"""

from __future__ import annotations

import io
import os
from typing import Iterable, Iterator, Optional

from ..codec import parse_descriptor, peek_descriptor_length
from ..errors import HurraySchemaError
from ..limits import Limits, resolve_limits
from ..model import SyncMode, TensorDescriptor
from ..rules import container as C
from ..rules import structure as S
from ..rules.composite import CompositeBinder
from ..rules.descriptor import first_error
from ..rules.engine import Finding, as_mode
from ..structs._declare import plan, static_offset
from ..structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE
from ..structs.file import FILE_MAGIC
from ..structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, ERROR_HEADER, MessageType,
)
from ._write import EncodedNode, Sink, check_nodes, checked_buffers, encode_nodes, replacing
from .tensor import Composite, Item, Tensor, walk

_DESCRIPTOR_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")

__all__ = ["read_stream", "write_stream", "StreamReader", "RemoteError", "FRAMINGS"]

FRAMINGS = ("bare", "messages")
DEFAULT_FRAME_BYTES = 16 * 1024 * 1024
_CHUNK = 8 * 1024 * 1024
_FIRST_CHUNK = 64 * 1024

_MSG = plan(MESSAGE_HEADER)
_MSG_AT = {name: static_offset(MESSAGE_HEADER, name) for name in ("stream_id", "payload_length")}
_SHARD_INDEX_AT = static_offset(TENSOR_DESCRIPTOR_FIELDS, "shard_index")
_MSG_SIZE = _MSG.fixed_size
_TRANSPORT = plan(TENSOR_DESCRIPTOR_FIELDS)
_TRANSPORT_SIZE = _TRANSPORT.fixed_size
_DATA = plan(TENSOR_DATA_HEADER)
_DATA_SIZE = _DATA.fixed_size
_ERROR = plan(ERROR_HEADER)


class RemoteError(HurraySchemaError):
    """The peer sent an ``ERROR`` message (``interchange.md § Error Handling``)."""

    def __init__(self, error_code: int, message: str, offset: int):
        self.error_code = error_code
        self.remote_message = message
        self.offset = offset
        super().__init__(f"peer sent ERROR 0x{error_code:08X} at byte {offset}: {message}")


# --------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------


class _Source:
    """Bytes, a path or a binary file object, read forward with a running offset."""

    def __init__(self, source):
        self.pos = 0
        self._owned = None
        self._pending = b""
        self.data: Optional[memoryview] = None
        self.file = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source)
            self.data = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        elif isinstance(source, (str, os.PathLike)):
            self.file = self._owned = open(source, "rb")
        elif hasattr(source, "read"):
            self.file = source
        else:
            raise TypeError(f"read_stream needs bytes, a path or a binary file object, not {type(source).__name__}")

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def at_eof(self) -> bool:
        if self.data is not None:
            return self.pos >= len(self.data)
        if self._pending:
            return False
        self._pending = self.file.read(1) or b""
        return not self._pending

    def read(self, n: int):
        """Up to ``n`` bytes (fewer only at end of input), zero-copy for bytes input."""
        if self.data is not None:
            out = self.data[self.pos : self.pos + n]
            self.pos += len(out)
            return out
        buf = bytearray()
        if self._pending and n:
            buf += self._pending
            self._pending = b""
        step = _FIRST_CHUNK  # grows with what has arrived: a length that lies costs no big read-ahead
        while len(buf) < n:
            chunk = self.file.read(min(n - len(buf), step))
            if not chunk:
                break
            buf += chunk
            step = min(2 * step, _CHUNK)
        self.pos += len(buf)
        return memoryview(buf) if len(buf) == n else buf

    def skip(self, n: int) -> int:
        got = 0
        while got < n:
            part = self.read(min(n - got, _CHUNK))
            if not part:
                break
            got += len(part)
        return got


# --------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------


class StreamReader:
    """Iterator over the :class:`Tensor` and :class:`Composite` items of a stream.

    ``findings`` collects what a permissive reader tolerated (and SHOULD-level notes).
    """

    def __init__(self, source, *, framing: str = "bare", mode="strict", limits: Optional[Limits] = None,
                 cross_machine: bool = False, validate_composites: bool = True):
        if framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {FRAMINGS}, not {framing!r}")
        self.mode = as_mode(mode)
        self.framing = framing
        self.limits = resolve_limits(limits)
        self.cross_machine = cross_machine
        self.findings: list[Finding] = []
        self._count = 0
        self._src = _Source(source)
        self._binder = CompositeBinder(mode=self.mode, validate=validate_composites, limits=self.limits,
                                       findings=self.findings, leaf=Tensor, assemble=Composite.from_binder)
        self._gen = self._bare() if framing == "bare" else self._messages()

    def __iter__(self) -> "StreamReader":
        return self

    def __next__(self) -> Item:
        try:
            item = next(self._gen)
        except BaseException:
            self._src.close()
            raise
        self._count += 1
        self.limits.check("max_stream_tensors", self._count, self._src.pos)
        return item

    def close(self) -> None:
        self._gen.close()
        self._src.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- common --------------------------------------------------------------------
    def _descriptor(self, buf, base: int) -> TensorDescriptor:
        desc, findings = parse_descriptor(buf, mode=self.mode, base=base, limits=self.limits)
        self.findings.extend(findings)
        error = first_error(desc, self.mode, base=base)
        if error is not None:
            raise error.to_violation()
        if self.cross_machine:
            for i, h in enumerate(desc.buffers):
                if h.sync_mode != SyncMode.PRODUCER_SYNCED:
                    raise C.CROSS_MACHINE_SYNC.violation(
                        f"buffer {i} declares sync_mode 0x{int(h.sync_mode):02X} on a cross-machine stream", base)
        return desc

    def _check_buffer_size(self, size: int, offset: int) -> None:
        self.limits.check("max_buffer_bytes", size, offset)

    def _finish(self) -> Iterator[Item]:
        yield from self._binder.finish()

    # -- bare framing --------------------------------------------------------------
    def _bare(self) -> Iterator[Item]:
        src = self._src
        while not src.at_eof():
            start = src.pos
            head = src.read(FIXED_HEADER_SIZE)
            if len(head) < FIXED_HEADER_SIZE:
                raise C.STREAM_TRUNCATED.violation(
                    f"the stream ends {len(head)} bytes into a descriptor (a descriptor has at least "
                    f"{FIXED_HEADER_SIZE})", src.pos)
            if start == 0 and bytes(head[: len(FILE_MAGIC)]) == FILE_MAGIC:
                raise S.MAGIC.violation("the input starts with \"HRRYFILE\": it is a .hrry file, not a stream "
                                        "(use read_file)", 0)
            length = peek_descriptor_length(head, start)
            self.limits.check("max_descriptor_bytes", length, start + _DESCRIPTOR_LENGTH_AT)
            rest = src.read(length - FIXED_HEADER_SIZE)
            if len(rest) < length - FIXED_HEADER_SIZE:
                raise C.STREAM_TRUNCATED.violation(
                    f"the stream ends inside the descriptor at byte {start}: descriptor_length {length}, "
                    f"{FIXED_HEADER_SIZE + len(rest)} bytes present", src.pos)
            desc = self._descriptor(bytes(head) + bytes(rest), start)
            buffers = []
            for i, handle in enumerate(desc.buffers):
                self._check_buffer_size(handle.byte_size, start)
                at = src.pos
                data = src.read(handle.byte_size)
                if len(data) < handle.byte_size:
                    raise C.STREAM_TRUNCATED.violation(
                        f"buffer {i} of the tensor at byte {start} needs {handle.byte_size} bytes, "
                        f"the stream has {len(data)} left", at + len(data))
                buffers.append(data)
            yield from self._binder.add(desc, start, buffers)
        yield from self._finish()

    # -- message framing -----------------------------------------------------------
    def _message_header(self):
        src = self._src
        at = src.pos
        raw = src.read(_MSG_SIZE)
        if len(raw) < _MSG_SIZE:
            raise C.MESSAGE_TRUNCATED.violation(
                f"the stream ends {len(raw)} bytes into a {_MSG_SIZE}-byte message header", src.pos)
        h, _ = _MSG.unpack(raw)
        if h["stream_id"] == RESERVED_STREAM_ID:
            raise C.MESSAGE_STREAM_ID.violation("stream_id 0 is reserved", at + _MSG_AT["stream_id"])
        self.limits.check("max_message_bytes", h["payload_length"], at + _MSG_AT["payload_length"])
        try:
            h["message_type"] = MessageType(h["message_type"])
        except ValueError:
            raise C.MESSAGE_TYPE.violation(
                f"message_type 0x{h['message_type']:08X} is not a message type this reader knows", at) from None
        return at, h

    def _payload(self, n: int, at: int):
        data = self._src.read(n)
        if len(data) < n:
            raise C.MESSAGE_TRUNCATED.violation(
                f"the message at byte {at} announces {n} payload bytes, the stream has {len(data)}",
                self._src.pos)
        return data

    def _messages(self) -> Iterator[Item]:
        src = self._src
        current = None  # (desc, start, total, frames, received)
        while not src.at_eof():
            at, h = self._message_header()
            kind, plen = h["message_type"], h["payload_length"]
            pstart = at + _MSG_SIZE
            if kind in (MessageType.PING, MessageType.PONG):
                self._payload(plen, at)
                continue
            if kind == MessageType.ERROR:
                payload = bytes(self._payload(plen, at))
                code, message = 0, payload.decode("utf-8", "replace")
                if len(payload) >= _ERROR.fixed_size:
                    e, _ = _ERROR.unpack(payload)
                    code = e["error_code"]
                    message = payload[_ERROR.fixed_size : _ERROR.fixed_size + e["message_length"]].decode(
                        "utf-8", "replace")
                raise RemoteError(code, message, at)
            if kind == MessageType.TENSOR_DESCRIPTOR:
                if current is not None:
                    raise C.MESSAGE_ORDER.violation(
                        f"TENSOR_DESCRIPTOR before the TENSOR_DATA_END of the tensor at byte {current[1]}", at)
                payload = self._payload(plen, at)
                if plen < FIXED_HEADER_SIZE + _TRANSPORT_SIZE:
                    raise C.DESCRIPTOR_PAYLOAD.violation(
                        f"payload_length {plen} cannot hold a descriptor and the {_TRANSPORT_SIZE} transport bytes", at + _MSG_AT["payload_length"])
                length = peek_descriptor_length(payload, pstart)
                if length + _TRANSPORT_SIZE != plen:
                    raise C.DESCRIPTOR_PAYLOAD.violation(
                        f"payload_length {plen} is not descriptor_length {length} + {_TRANSPORT_SIZE}", at + _MSG_AT["payload_length"])
                desc = self._descriptor(payload[:length], pstart)
                t, _ = _TRANSPORT.unpack(payload, length)
                if t["total_shards"] < 1 or t["shard_index"] >= t["total_shards"]:
                    raise C.TRANSPORT_SHARDS.violation(
                        f"shard_index {t['shard_index']} / total_shards {t['total_shards']}", pstart + length + _SHARD_INDEX_AT)
                expected = sum(b.byte_size for b in desc.buffers)
                if t["total_data_bytes"] != expected:
                    raise C.TOTAL_DATA_BYTES.violation(
                        f"total_data_bytes {t['total_data_bytes']} but the buffers hold {expected} bytes",
                        pstart + length)
                for b in desc.buffers:
                    self._check_buffer_size(b.byte_size, pstart)
                current = [desc, at, expected, [], 0]
                continue
            if kind == MessageType.TENSOR_DATA:
                if current is None:
                    raise C.MESSAGE_ORDER.violation("TENSOR_DATA outside a tensor (no TENSOR_DESCRIPTOR before it)", at)
                if plen < _DATA_SIZE:
                    raise C.DATA_FRAME.violation(
                        f"a TENSOR_DATA payload of {plen} bytes cannot hold byte_offset_in_buffer", at + _MSG_AT["payload_length"])
                payload = self._payload(plen, at)
                offset_in_buffer = _DATA.unpack(payload)[0]["byte_offset_in_buffer"]
                n = plen - _DATA_SIZE
                if offset_in_buffer != current[4]:
                    raise C.DATA_FRAME.violation(
                        f"byte_offset_in_buffer {offset_in_buffer}, expected {current[4]} (frames are contiguous "
                        "and ascending)", pstart)
                if current[4] + n > current[2]:
                    raise C.DATA_FRAME.violation(
                        f"frame ends at {current[4] + n}, past total_data_bytes {current[2]}", pstart)
                if n:
                    current[3].append(payload[_DATA_SIZE:])
                current[4] += n
                continue
            if kind == MessageType.TENSOR_DATA_END:
                if current is None:
                    raise C.MESSAGE_ORDER.violation("TENSOR_DATA_END outside a tensor", at)
                if plen:
                    raise C.DATA_END_PAYLOAD.violation(f"TENSOR_DATA_END carries {plen} payload bytes", at + _MSG_AT["payload_length"])
                desc, start, total, frames, received = current
                if received != total:
                    raise C.DATA_SUM.violation(
                        f"frames carried {received} bytes, total_data_bytes is {total}", at)
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                view = memoryview(data)
                buffers, pos = [], 0
                for handle in desc.buffers:
                    buffers.append(view[pos : pos + handle.byte_size])
                    pos += handle.byte_size
                current = None
                yield from self._binder.add(desc, start + _MSG_SIZE, buffers)  # the descriptor, not its message
                continue
            raise C.MESSAGE_ORDER.violation(f"{kind.name} does not belong in a tensor data stream", at)
        if current is not None:
            raise C.STREAM_TRUNCATED.violation(
                f"the stream ends before the TENSOR_DATA_END of the tensor at byte {current[1]}", src.pos)
        yield from self._finish()


def read_stream(source, *, framing: str = "bare", mode="strict", **options) -> StreamReader:
    """Iterate over the tensors and composites of a stream (bytes, path or binary file).

    Composites are bound as their members arrive and validated per member and at close;
    a torn composite raises ``composite.torn`` in strict mode, and in permissive
    mode its arrived members come out as independent items (never the composite).
    Options: ``limits`` (:class:`~hurray_schema.limits.Limits`), ``cross_machine`` (reject
    buffers not producer-synced), ``validate_composites`` (False skips the composite rules).
    """
    return StreamReader(source, framing=framing, mode=mode, **options)


# --------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------


def tensor_parts(item: Item):
    """``(node, descriptor_bytes, buffers)`` of each tensor of ``item`` in pre-order, after
    checking that every buffer matches its handle's ``byte_size``."""
    for part in encode_nodes(walk(item)):
        yield part.node, part.descriptor, part.buffers


node_buffers = checked_buffers
"""The buffers of a node once they match its handles (see :func:`hurray_schema.io._write.checked_buffers`)."""


def _write_parts(sink: Sink, encoded: Iterable[EncodedNode], framing: str, stream_id: int,
                 max_frame: int) -> list[int]:
    """Write each encoded tensor in ``framing``; the offset of each descriptor (where a
    reader decodes it from) in order."""
    bases = []
    for part in encoded:
        if framing == "bare":
            bases.append(sink.pos)
            sink.write(part.descriptor)
            for b in part.buffers:
                sink.write(b)
        else:
            bases.append(sink.pos + _MSG_SIZE)
            _write_messages(sink, part.descriptor, part.buffers, stream_id, max_frame)
    return bases


def write_stream(dest, items: Iterable[Item], *, framing: str = "bare", stream_id: int = 1,
                 max_frame_bytes: int = DEFAULT_FRAME_BYTES, validate: bool = True):
    """Write ``items`` (tensors and composites, pre-order) to ``dest`` -- a path, a
    binary file object, or ``None`` to get the bytes back.

    Before the first byte, every descriptor must decode and pass the strict reader's
    rules and every composite ``layouts/composite.md § Validation``; the first fault
    raises the :class:`~hurray_schema.errors.SpecViolation` :func:`read_stream` would
    raise for it (same rule id), at the byte offset it would have in the output (from
    the first byte this call writes).  An iterator of items is therefore consumed
    before writing (the tensors are kept, not copies of their bytes).  Buffers that do
    not match their handles raise :class:`~hurray_schema.errors.EncodeError`, values that
    do not fit their wire field :class:`~hurray_schema.errors.FieldRangeError`.
    ``validate=False`` skips the rules and the buffer check and writes item by item: it
    exists to produce faulty test inputs.

    A path is written through a temporary file renamed over it once complete, so an
    error leaves the previous file untouched.  A file object cannot be protected that
    way: what was written before an error (an I/O error, or any error with
    ``validate=False``) stays in it.
    """
    if framing not in FRAMINGS:
        raise ValueError(f"framing must be one of {FRAMINGS}, not {framing!r}")
    if framing == "messages" and stream_id == RESERVED_STREAM_ID:
        raise ValueError("stream_id 0 is reserved")
    if max_frame_bytes < 1:
        raise ValueError("max_frame_bytes must be positive")
    if isinstance(items, (Tensor, Composite)):
        items = (items,)
    nodes = (node for item in items for node in walk(item))
    if validate:
        encoded = list(encode_nodes(nodes))
        check_nodes(encoded, _write_parts(Sink(), encoded, framing, stream_id, max_frame_bytes), descriptors_first=False)
    else:
        encoded = encode_nodes(nodes, validate=False)
    if isinstance(dest, (str, os.PathLike)):
        with replacing(dest) as f:
            _write_parts(Sink(f), encoded, framing, stream_id, max_frame_bytes)
        return None
    out = io.BytesIO() if dest is None else None
    _write_parts(Sink(out or dest), encoded, framing, stream_id, max_frame_bytes)
    return out.getvalue() if out is not None else None


def _write_messages(sink, desc: bytes, buffers, stream_id: int, max_frame: int) -> None:
    total = sum(len(b) for b in buffers)
    sink.write(_MSG.pack(message_type=MessageType.TENSOR_DESCRIPTOR, stream_id=stream_id,
                         payload_length=len(desc) + _TRANSPORT_SIZE))
    sink.write(desc)
    sink.write(_TRANSPORT.pack(total_data_bytes=total, shard_index=0, total_shards=1))
    offset = 0
    for b in buffers:
        view = memoryview(b)
        for pos in range(0, len(view), max_frame):
            part = view[pos : pos + max_frame]
            sink.write(_MSG.pack(message_type=MessageType.TENSOR_DATA, stream_id=stream_id,
                                 payload_length=_DATA_SIZE + len(part)))
            sink.write(_DATA.pack(byte_offset_in_buffer=offset))
            sink.write(part)
            offset += len(part)
    sink.write(_MSG.pack(message_type=MessageType.TENSOR_DATA_END, stream_id=stream_id, payload_length=0))
