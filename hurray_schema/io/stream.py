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
being bound plus the buffers of the tensor being read; without ``framing=`` it tells the
framing from the first bytes (:func:`~hurray_schema.io.walk.kinds.detect_kind`).

:class:`StreamWriter` writes one item at a time (composites whole, or head first and
members as they come); :func:`write_stream` is that writer over an iterable.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
from typing import Iterable, Iterator, Optional

import numpy as np

from ..codec import encode_descriptor
from ..errors import HurraySchemaError
from ..limits import Limits, resolve_limits
from ..model import TensorDescriptor
from ..rules.composite import CompositeBinder
from ..rules.engine import Finding, as_mode
from ..structs._declare import plan
from ..structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from ._write import EncodedNode, Sink, as_item, check_values, decoded, encode_nodes, replacing
from .tensor import Composite, Item, Tensor, walk
from ..errors import RemoteError
from .walk.bare import walk_bare
from .walk.common import DATA, TENSOR_END, Faults, Window
from .walk.descriptor import strict_describer
from .walk.kinds import DETECT_BYTES, detect_kind

__all__ = ["read_stream", "write_stream", "StreamReader", "StreamWriter", "RemoteError", "FRAMINGS",
           "detect_framing"]

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

    The bytes are walked by :func:`~hurray_schema.io.walk.bare.walk_bare` or
    :func:`~hurray_schema.io.walk.messages.walk_messages` (fault policy ``RAISE``); this class
    gathers each tensor's buffers and binds the composites.
    ``findings`` collects what a permissive reader tolerated and the SHOULD-level notes, of
    the descriptor, composite and stream rules alike: what ``audit`` reports on the stream
    (same rule, level and offset, each descriptor's in audit's order), but for the rules
    only audit runs (:data:`hurray_schema.rules.interop.AUDIT_ONLY`) and those checked when a
    tensor's values are decoded (:data:`hurray_schema.rules.values.AT_DECODE`).
    ``framing`` None (the default) reads the framing from the first bytes
    (:func:`detect_framing`); ``framing`` is then the one found.
    """

    def __init__(self, source, *, framing: Optional[str] = None, mode="strict", limits: Optional[Limits] = None,
                 cross_machine: bool = False, validate_composites: bool = True):
        if framing is not None and framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {FRAMINGS} or None, not {framing!r}")
        self.mode = as_mode(mode)
        self.limits = resolve_limits(limits)
        self.cross_machine = cross_machine
        self.findings: list[Finding] = []
        self._count = 0
        if framing is None:
            source, framing = _with_framing(source)
        self.framing = framing
        self._src = Window(source)
        self._binder = CompositeBinder(mode=self.mode, validate=validate_composites, limits=self.limits,
                                       findings=self.findings, leaf=Tensor.viewing, assemble=Composite.from_binder)
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
        add = self._binder.add
        for desc, start, views in walk_bare(self._src, self._describe, faults=Faults.RAISE, mode=self.mode,
                                            limits=self.limits, per_tensor=True):
            nodes = add(desc, start, views)  # the tensor is complete: bind it
            if nodes:
                yield from nodes
        yield from self._finish()

    def _messages(self) -> Iterator[Item]:
        from .walk.messages import walk_messages  # with the session's tables: a bare stream needs neither

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


# --------------------------------------------------------------------------------------
# Framing detection
# --------------------------------------------------------------------------------------


def detect_framing(first_bytes) -> str:
    """``"messages"`` when the first bytes open a message (a known ``message_type``), else
    ``"bare"`` (a descriptor, or input the bare reader refuses with its own rule):
    :func:`~hurray_schema.io.walk.kinds.detect_kind` read for a stream reader."""
    return "messages" if detect_kind(first_bytes) == "messages" else "bare"


class _Replayed:
    """A forward-only binary file whose first bytes were already read: they are served
    again before the rest (peeking a pipe or socket loses nothing)."""

    def __init__(self, first: bytes, rest):
        self._first = first
        self._rest = rest

    def read(self, n: int = -1) -> bytes:
        if not self._first:
            return self._rest.read(n)
        if n is None or n < 0:
            data, self._first = self._first + self._rest.read(), b""
            return data
        data, self._first = self._first[:n], self._first[n:]
        return data


def _read_up_to(f, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer only at its end), across short reads."""
    got = bytearray()
    while len(got) < n:
        chunk = f.read(n - len(got))
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _seekable(f) -> bool:
    try:
        return bool(f.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _with_framing(source):
    """``(source, framing)``: the framing its first bytes show, and a source that still
    yields every byte (a non-seekable file object comes back wrapped)."""
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        return source, detect_framing(memoryview(source)[:DETECT_BYTES])
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return source, detect_framing(_read_up_to(f, DETECT_BYTES))
    if not hasattr(source, "read"):
        return source, "bare"  # the reader's window refuses it, with its own message
    if _seekable(source):
        at = source.tell()
        first = _read_up_to(source, DETECT_BYTES)
        source.seek(at)
        return source, detect_framing(first)
    first = _read_up_to(source, DETECT_BYTES)
    return _Replayed(first, source), detect_framing(first)


def read_stream(source, *, framing: Optional[str] = None, mode="strict", **options) -> StreamReader:
    """Iterate over the tensors and composites of a stream (bytes, path or binary file).

    ``framing``: ``"bare"`` or ``"messages"``; None (the default) reads it from the first
    bytes (:func:`detect_framing`: a known ``message_type`` means messages, anything else
    bare).  A non-seekable file object is peeked without losing a byte; a given framing
    is used as it is.

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


_COUNT_ONLY = object()
"""A :class:`StreamWriter` destination that writes nothing: the writer lays the stream out
and checks it (what :func:`write_stream` does before its first byte)."""


class StreamWriter:
    """Write a stream one item at a time: ``with StreamWriter(dest) as w: w.write(item)``.

    ``dest`` is a path, a binary file object, or None (the bytes: :meth:`getvalue` after
    the block).  ``framing``: ``"bare"`` (default) or ``"messages"`` (``stream_id``, data
    frames of at most ``max_frame_bytes``).  :meth:`write` takes a :class:`Tensor`, a
    NumPy array (as :func:`~hurray_schema.io._write.as_item` makes it a tensor) or a
    whole :class:`Composite` (head, then its members in pre-order).  For a producer whose
    members come one by one, :meth:`begin_composite` writes a head; each later
    :meth:`write` is its next member (a nested composite included), and the composite
    closes at its ``member_count``-th member (``interchange.md § Composite Tensor
    Streaming``).

    Checked like :func:`write_stream`, item by item (``validate=False`` skips it): each
    descriptor is decoded strictly and passes the descriptor rules, each quantization scale
    its scheme's rule on the values (:mod:`hurray_schema.rules.values`; located in a bare stream,
    ``offset`` None in a message stream, whose data frames ``audit`` does not read), and every
    tensor goes through the readers' one composite binder
    (:class:`~hurray_schema.rules.composite.CompositeBinder`), which checks each member as
    it arrives and the composite when it closes (``layouts/composite.md § Validation``);
    :meth:`close` reports a composite still open as torn (``composite.torn``).  A fault
    raises the :class:`~hurray_schema.errors.SpecViolation` :func:`read_stream` would raise
    on the output, before the offending tensor's first byte.

    To a path the stream goes to a temporary file renamed over the path at a clean close;
    when the block ends with an exception (or :meth:`close` finds a fault) nothing
    replaces the path.  A file object keeps what was written before a fault.
    """

    def __init__(self, dest, *, framing: str = "bare", stream_id: int = 1,
                 max_frame_bytes: int = DEFAULT_FRAME_BYTES, validate: bool = True):
        if framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {FRAMINGS}, not {framing!r}")
        if framing == "messages" and stream_id == RESERVED_STREAM_ID:
            raise ValueError("stream_id 0 is reserved")
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be positive")
        self.framing = framing
        self.stream_id = stream_id
        self.max_frame_bytes = max_frame_bytes
        self.validate = validate
        self._binder = CompositeBinder(mode="strict", check_heads=False) if validate else None
        self._state = "open"  # then "closed" or "failed"
        self._value: Optional[bytes] = None
        self._resources = contextlib.ExitStack()
        self._memory = None
        if dest is _COUNT_ONLY:
            out = None
        elif isinstance(dest, (str, os.PathLike)):
            out = self._resources.enter_context(replacing(dest))
        elif dest is None:
            out = self._memory = io.BytesIO()
        elif hasattr(dest, "write"):
            out = dest
        else:
            raise TypeError(f"StreamWriter needs a path, a binary file object or None, not {type(dest).__name__}")
        self._sink = Sink(out)

    # -- writing -------------------------------------------------------------------
    def write(self, item) -> None:
        """Write a tensor, an array or a whole composite (or, after :meth:`begin_composite`,
        the open composite's next member)."""
        self._check_open()
        item = as_item(item)
        self._guarded(lambda: [self._put(part.descriptor, part.buffers)
                               for part in encode_nodes(walk(item), self.validate)])

    def begin_composite(self, head: TensorDescriptor) -> None:
        """Write a composite head (a :class:`~hurray_schema.model.TensorDescriptor` with a
        composite layout); the next ``member_count`` items written are its members."""
        self._check_open()
        if not isinstance(head, TensorDescriptor) or not head.is_composite_head:
            raise HurraySchemaError("begin_composite takes a composite head descriptor (layout_tag 0x0B)")
        self._guarded(lambda: self._put(encode_descriptor(head), ()))

    @property
    def open_composites(self) -> int:
        """How many composites are waiting for members (0 when not validating)."""
        return self._binder.depth if self._binder is not None else 0

    @property
    def bytes_written(self) -> int:
        return self._sink.pos

    def _check_open(self) -> None:
        if self._state != "open":
            raise HurraySchemaError(f"this StreamWriter is {self._state}")

    def _guarded(self, step) -> None:
        """Run a write step; after an error the writer is failed (a path is left untouched)."""
        try:
            step()
        except BaseException:
            self._abort()
            raise

    def _put(self, descriptor: bytes, buffers) -> None:
        """Check one encoded tensor (its descriptor bytes and buffers) where it will sit,
        then write it."""
        sink = self._sink
        base = sink.pos if self.framing == "bare" else sink.pos + _MSG_SIZE  # where a reader decodes it
        if self._binder is not None:
            desc = decoded(descriptor, base)
            self._binder.add(desc, base)
            if desc.quantization is not None and buffers:  # scales: where a bare stream has them
                check_values(desc, buffers, _back_to_back(base + len(descriptor), buffers)
                             if self.framing == "bare" else None)
        if self.framing == "bare":
            sink.write(descriptor)
            for data in buffers:
                sink.write(data)
        else:
            _write_messages(sink, descriptor, buffers, self.stream_id, self.max_frame_bytes)

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """End the stream: a composite still open is torn (raised, nothing replaces a
        path); else a path is replaced by the complete stream.  Closing twice is harmless."""
        if self._state != "open":
            return
        self._guarded(self._finish)
        self._state = "closed"
        self._resources.close()  # a path: flushed, fsynced, renamed over the target
        if self._memory is not None:
            self._value = self._memory.getvalue()

    def _finish(self) -> None:
        if self._binder is not None:
            self._binder.finish()

    def _abort(self) -> None:
        if self._state != "open":
            return
        self._state = "failed"
        fault = HurraySchemaError("the stream was abandoned")
        self._resources.__exit__(type(fault), fault, None)  # a path: the temporary file is removed

    def getvalue(self) -> bytes:
        """The bytes written (``dest`` None), once closed."""
        if self._value is None:
            raise HurraySchemaError("getvalue() needs a StreamWriter to None that was closed")
        return self._value

    def __enter__(self) -> "StreamWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()

    def __repr__(self) -> str:
        return f"StreamWriter({self.framing}, {self._state}, {self._sink.pos} bytes)"


def _back_to_back(at: int, buffers) -> list[int]:
    """Where each of ``buffers`` starts in a bare stream when the first starts at ``at``."""
    starts = []
    for b in buffers:
        starts.append(at)
        at += len(b)
    return starts


def write_stream(dest, items: Iterable[Item], *, framing: str = "bare", stream_id: int = 1,
                 max_frame_bytes: int = DEFAULT_FRAME_BYTES, validate: bool = True):
    """Write ``items`` (tensors, NumPy arrays and composites, pre-order) to ``dest`` -- a
    path, a binary file object, or ``None`` to get the bytes back -- with one
    :class:`StreamWriter`.

    Before the first byte, every descriptor must decode and pass the strict reader's
    rules and every composite ``layouts/composite.md § Validation``; the first fault
    raises the :class:`~hurray_schema.errors.SpecViolation` :func:`read_stream` would
    raise for it (same rule id), at the byte offset it would have in the output (from
    the first byte this call writes): a writer that writes nothing lays the stream out
    and checks it first.  An iterator of items is therefore consumed before writing (the
    tensors are kept, not copies of their bytes).  Buffers that do not match their
    handles raise :class:`~hurray_schema.errors.EncodeError`, values that do not fit their
    wire field :class:`~hurray_schema.errors.FieldRangeError`.  ``validate=False`` skips
    the rules and the buffer check and writes item by item: it exists to produce faulty
    test inputs.

    A path is written through a temporary file renamed over it once complete, so an
    error leaves the previous file untouched.  A file object cannot be protected that
    way: what was written before an error (an I/O error, or any error with
    ``validate=False``) stays in it.
    """
    options = dict(framing=framing, stream_id=stream_id, max_frame_bytes=max_frame_bytes)
    if isinstance(items, (Tensor, Composite, np.ndarray)):
        items = (items,)  # one item (an array is one tensor, not its rows)
    nodes = (node for item in items for node in walk(as_item(item)))
    if validate:
        encoded: Iterable[EncodedNode] = list(encode_nodes(nodes))
        with StreamWriter(_COUNT_ONLY, **options) as layout:
            for part in encoded:
                layout._put(part.descriptor, part.buffers)
    else:
        encoded = encode_nodes(nodes, validate=False)
    with StreamWriter(dest, validate=False, **options) as writer:
        for part in encoded:
            writer._put(part.descriptor, part.buffers)
    return writer.getvalue() if dest is None else None


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
