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

import functools
import io
import os
from typing import Iterable, Iterator, Optional

from ..codec import encode_descriptor
from ..errors import HurraySchemaError
from ..limits import Limits, resolve_limits
from ..rules import container as C
from ..rules.engine import Finding, as_mode
from ..structs._declare import plan
from ..structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from ._bind import Binder
from .tensor import Composite, Item, Tensor, walk
from .walk import (
    BUFFER, DATA, DESCRIPTOR, TENSOR_END, Faults, RemoteError, Window, strict_descriptor, walk_bare,
    walk_messages,
)

__all__ = ["read_stream", "write_stream", "StreamReader", "RemoteError", "FRAMINGS"]

FRAMINGS = ("bare", "messages")
DEFAULT_FRAME_BYTES = 16 * 1024 * 1024
_MSG = plan(MESSAGE_HEADER)
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
        self._binder = Binder(self.mode, C.STREAM_COMPOSITE_TORN, self.findings, validate_composites, self.limits)
        self._describe = functools.partial(strict_descriptor, mode=self.mode, limits=self.limits,
                                           cross_machine=cross_machine, findings=self.findings)
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


    def _finish(self) -> Iterator[Item]:
        yield from self._binder.finish(self._src.pos, "the stream")

    def _bare(self) -> Iterator[Item]:
        desc, start, buffers = None, 0, []
        for part in walk_bare(self._src, self._describe, faults=Faults.RAISE, mode=self.mode, limits=self.limits):
            if part.kind == BUFFER:
                buffers.append(part.value)
            else:
                desc, start, buffers = part.value, part.start, []
            if len(buffers) == len(desc.buffers):  # the tensor is complete: bind it
                yield from self._binder.add(desc, buffers, None, start)
        yield from self._finish()

    def _messages(self) -> Iterator[Item]:
        frames: list = []
        for part in walk_messages(self._src, self._describe, faults=Faults.RAISE, mode=self.mode,
                                  limits=self.limits):
            if part.kind == DATA:
                frames.append(part.value)
            elif part.kind == DESCRIPTOR:
                frames = []
            elif part.kind == TENSOR_END:
                desc = part.value
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                view = memoryview(data)
                buffers, pos = [], 0
                for handle in desc.buffers:
                    buffers.append(view[pos : pos + handle.byte_size])
                    pos += handle.byte_size
                frames = []
                yield from self._binder.add(desc, buffers, None, part.index)
        yield from self._finish()


def read_stream(source, *, framing: str = "bare", mode="strict", **options) -> StreamReader:
    """Iterate over the tensors and composites of a stream (bytes, path or binary file).

    Composites are bound as their members arrive and validated per member and at close;
    a torn composite raises ``stream.composite.torn`` in strict mode, and in permissive
    mode its arrived members come out as independent items (never the composite).
    Options: ``limits`` (:class:`~hurray_schema.limits.Limits`), ``cross_machine`` (reject
    buffers not producer-synced), ``validate_composites`` (False skips the composite rules).
    """
    return StreamReader(source, framing=framing, mode=mode, **options)


# --------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------


def tensor_parts(item: Item):
    """``(descriptor_bytes, buffers)`` of each tensor of ``item`` in pre-order, after
    checking that every buffer matches its handle's ``byte_size``."""
    for _name, node in walk(item):
        yield node, encode_descriptor(node.descriptor), node_buffers(node)


def node_buffers(node: Item) -> tuple:
    if isinstance(node, Composite):
        return ()
    handles = node.descriptor.buffers
    if len(handles) != len(node.buffers):
        raise HurraySchemaError(
            f"{node!r}: the descriptor lists {len(handles)} buffers, {len(node.buffers)} were given")
    for i, (h, b) in enumerate(zip(handles, node.buffers)):
        if len(b) != h.byte_size:
            raise HurraySchemaError(f"{node!r}: buffer {i} holds {len(b)} bytes, its handle says {h.byte_size}")
    return node.buffers


def write_stream(dest, items: Iterable[Item], *, framing: str = "bare", stream_id: int = 1,
                 max_frame_bytes: int = DEFAULT_FRAME_BYTES):
    """Write ``items`` (tensors and composites, pre-order) to ``dest`` -- a path, a
    binary file object, or ``None`` to get the bytes back."""
    if framing not in FRAMINGS:
        raise ValueError(f"framing must be one of {FRAMINGS}, not {framing!r}")
    if framing == "messages" and stream_id == RESERVED_STREAM_ID:
        raise ValueError("stream_id 0 is reserved")
    if max_frame_bytes < 1:
        raise ValueError("max_frame_bytes must be positive")
    if isinstance(items, (Tensor, Composite)):
        items = (items,)
    out = io.BytesIO() if dest is None else None
    owned = open(dest, "wb") if isinstance(dest, (str, os.PathLike)) else None
    sink = out or owned or dest
    try:
        for item in items:
            for _node, desc, buffers in tensor_parts(item):
                if framing == "bare":
                    sink.write(desc)
                    for b in buffers:
                        sink.write(b)
                else:
                    _write_messages(sink, desc, buffers, stream_id, max_frame_bytes)
    finally:
        if owned is not None:
            owned.close()
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
