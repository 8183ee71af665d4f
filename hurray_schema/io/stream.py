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

from ..limits import Limits, resolve_limits
from ..rules.composite import CompositeBinder
from ..rules.engine import Finding, as_mode
from ..structs._declare import plan
from ..structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from ._write import EncodedNode, Sink, check_nodes, checked_buffers, encode_nodes, replacing
from .tensor import Composite, Item, Tensor, walk
from .walk import (
    BUFFER, DATA, TENSOR_END, Faults, RemoteError, Window, strict_describer, walk_bare,
    walk_messages,
)

__all__ = ["read_stream", "write_stream", "StreamReader", "RemoteError", "FRAMINGS"]

FRAMINGS = ("bare", "messages")
DEFAULT_FRAME_BYTES = 16 * 1024 * 1024
_MSG = plan(MESSAGE_HEADER)
_MSG_SIZE = _MSG.fixed_size
_TRANSPORT = plan(TENSOR_DESCRIPTOR_FIELDS)
_TRANSPORT_SIZE = _TRANSPORT.fixed_size
_DATA = plan(TENSOR_DATA_HEADER)
_DATA_SIZE = _DATA.fixed_size


# --------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------


class StreamReader:
    """Iterator over the :class:`Tensor` and :class:`Composite` items of a stream.

    The bytes are walked by :func:`~hurray_schema.io.walk.walk_bare` or
    :func:`~hurray_schema.io.walk.walk_messages` (fault policy ``RAISE``); this class
    gathers each tensor's buffers and binds the composites.
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
        self._src = Window(source)
        self._binder = CompositeBinder(mode=self.mode, validate=validate_composites, limits=self.limits,
                                       findings=self.findings, leaf=Tensor, assemble=Composite.from_binder)
        self._describe = strict_describer(mode=self.mode, limits=self.limits, cross_machine=cross_machine,
                                          findings=self.findings)
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
        if self._count > self.limits.max_stream_tensors:
            self.limits.check("max_stream_tensors", self._count, self._src.pos)
        return item

    def close(self) -> None:
        self._gen.close()
        self._src.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


    def _finish(self) -> Iterator[Item]:
        yield from self._binder.finish()

    def _bare(self) -> Iterator[Item]:
        desc, start, buffers = None, 0, []
        for part in walk_bare(self._src, self._describe, faults=Faults.RAISE, mode=self.mode, limits=self.limits):
            if part.kind == BUFFER:
                buffers.append(part.value)
            else:
                desc, start, buffers = part.value, part.start, []
            if len(buffers) == len(desc.buffers):  # the tensor is complete: bind it
                yield from self._binder.add(desc, start, buffers)
        yield from self._finish()

    def _messages(self) -> Iterator[Item]:
        frames: list = []  # the data frames of the tensor being read (the walk allows them only inside one)
        for part in walk_messages(self._src, self._describe, faults=Faults.RAISE, mode=self.mode,
                                  limits=self.limits):
            kind = part.kind
            if kind == DATA:
                frames.append(part.value)
            elif kind == TENSOR_END:
                desc = part.value
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                view = memoryview(data)
                buffers, pos = [], 0
                for handle in desc.buffers:
                    buffers.append(view[pos : pos + handle.byte_size])
                    pos += handle.byte_size
                frames = []
                yield from self._binder.add(desc, part.index + _MSG_SIZE, buffers)  # the descriptor, not its message
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
