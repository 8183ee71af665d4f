"""What a server serves, and how one request is answered.

A :class:`Catalog` holds the top-level items of the served files by name, and those of the
writable store.  :func:`plan_response` turns a request into the tensors to send: the layout
chosen by ``interchange.md § Server Layout Selection`` (the stored layout, or a transcoded
one within the transcoding limit, ``§ On-the-Fly Transcoding``), the item's pre-order
sequence of descriptors (``§ Composite Tensor Streaming``), or shards of a dense tensor along
dimension 0 for a parallel transfer (``§ Parallel Transfers``).  The data of a stored tensor is
named as byte ranges of its file, for ``sendfile``.
"""

from __future__ import annotations

import math
import os
import threading
import urllib.parse
from typing import Iterator, Optional, Sequence

import attrs

from ..codec import encode_descriptor
from ..errors import HurraySchemaError
from ..io.file import HurrayFile, read_file
from ..io.tensor import Composite, Item, Tensor, walk
from ..model import COLUMN_MAJOR, Shard, TensorDescriptor
from ..structs.session import RequestFlag
from ..structs.tags import CompositionRule, LayoutTag
from . import messages as m

__all__ = ["Node", "Catalog", "Answer", "plan_response", "TRANSCODE_TARGETS", "store_file_name"]

TRANSCODE_TARGETS = (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR)
"""The layouts this server transcodes into."""
_DENSE_SOURCES = frozenset({LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.COO, LayoutTag.CSR,
                            LayoutTag.CSC})
"""Layouts whose values the transcoder reads exactly (sparse and dense; not quantized)."""
_MERGEABLE = frozenset({CompositionRule.PARTITION, CompositionRule.OVERLAY})


@attrs.frozen(slots=True)
class Node:
    """One tensor of a response: its descriptor bytes, and its data plane as pieces (memory,
    or ``(fd, file offset, length)`` ranges of a served file)."""

    descriptor: bytes
    desc: TensorDescriptor
    pieces: tuple
    total: int
    shard_index: int = 0
    total_shards: int = 1
    segments: Optional[tuple] = None
    """``(fd, ((offset, size), ...))``: where each buffer lies in a file or memfd another process
    can map (``interchange.md § IPC``), when it lies in one."""

    def frames(self, limit: int) -> Iterator[tuple[int, list]]:
        """``(byte_offset_in_buffer, pieces)`` of each TENSOR_DATA frame of at most ``limit``
        data bytes (``interchange.md § TENSOR_DATA Payload``: contiguous and ascending)."""
        pos, frame, room = 0, [], limit
        for piece in self.pieces:
            size = piece[2] if isinstance(piece, tuple) else len(piece)
            start = 0
            while start < size:
                k = min(room, size - start)
                frame.append((piece[0], piece[1] + start, k) if isinstance(piece, tuple)
                             else memoryview(piece)[start : start + k])
                start += k
                room -= k
                if not room:
                    yield pos, frame
                    pos += limit
                    frame, room = [], limit
        if frame:
            yield pos, frame


@attrs.frozen(slots=True)
class Answer:
    """The response to one request: the nodes in send order and the layout chosen."""

    nodes: tuple[Node, ...]
    layout: int
    transcoded: bool = False
    parallel: bool = False


class _Served:
    """One served file: the open reader (its memory map and descriptor) and who uses it."""

    def __init__(self, path: str):
        self.path = path
        self.file: HurrayFile = read_file(path)
        self.fd = self.file.fileno()
        self.users = 0
        self.retired = False
        self.entries = {e.name: e for e in self.file.entries()}

    def release(self) -> None:
        self.users -= 1
        if self.retired and not self.users:
            self.file.close()

    def close(self) -> None:
        self.file.close()

    def buffer_ranges(self, tensor: Tensor) -> Optional[tuple]:
        """``(offset, size)`` of each of ``tensor``'s buffers in this file, if it is this file's."""
        origin = getattr(tensor, "_origin", None)
        if origin is None or origin[0] != os.path.abspath(self.path):
            return None
        return tuple((int(o), int(n)) for o, n in origin[2])


class _Held:
    """An item the server holds in memory: every buffer in one sealed memfd
    (:class:`~.shm.Segment`) that clients over a Unix socket map as it is."""

    path = None
    entries: dict = {}

    def __init__(self, segment, ranges: dict):
        self.segment = segment
        self.fd = segment.fd
        self.ranges = ranges  # id(leaf tensor) -> ((offset, size), ...)
        self.users = 0
        self.retired = False

    def release(self) -> None:
        self.users -= 1
        if self.retired and not self.users:
            self.close()

    def close(self) -> None:
        self.segment.close()

    def buffer_ranges(self, tensor: Tensor) -> Optional[tuple]:
        return self.ranges.get(id(tensor))


def held(item: Item, segment=None, ranges: Optional[list] = None) -> tuple[Item, _Held]:
    """``item`` held in a sealed memfd: ``segment`` as given with each leaf's buffer ``ranges``
    (a client's, pushed by SHM_PUT: the leaves already view it), or a new segment holding a copy
    of every leaf's buffers, the item rebuilt over it."""
    from .shm import new_segment

    leaves = [node for _, node in walk(item) if isinstance(node, Tensor)]
    if segment is None:
        segment, offsets = new_segment([b for leaf in leaves for b in leaf.buffers], name="hurray-store")
        flat = iter(zip(offsets, (len(b) for leaf in leaves for b in leaf.buffers)))
        ranges = [tuple(next(flat) for _ in leaf.buffers) for leaf in leaves]
        views = iter([tuple(segment.view(o, n) for o, n in r) for r in ranges])
        item = _rebuilt(item, views)
        leaves = [node for _, node in walk(item) if isinstance(node, Tensor)]
    return item, _Held(segment, {id(leaf): tuple(r) for leaf, r in zip(leaves, ranges)})


def _rebuilt(item: Item, views) -> Item:
    """``item`` with each leaf's buffers replaced by the next of ``views`` (pre-order)."""
    if isinstance(item, Composite):
        members = [_rebuilt(member, views) for member in item.members]
        out = Composite.from_binder(item.descriptor, item.name, members, True)
        return out
    tensor = Tensor.bound(item.descriptor, list(next(views)))
    tensor.name = item.name
    return tensor


class Catalog:
    """The items served by name: every top-level item of ``paths`` (a later file's name wins),
    then the writable store's (``store``: a folder of one ``.hrry`` file per key)."""

    def __init__(self, paths: Sequence[str], store: Optional[str] = None, memory: bool = False):
        self._lock = threading.Lock()
        self.memory = memory
        """PUTs are held in memory (a sealed memfd each), not written to ``store``."""
        self._items: dict[str, tuple[Item, Optional[_Served]]] = {}
        self._writers: dict[str, threading.Lock] = {}
        """Per store file, the lock of its writes (one PUT of a key stored at a time)."""
        self.read_only: set[str] = set()
        self.store = None if store is None else os.fspath(store)
        for path in paths:
            self._add_file(os.fspath(path), read_only=True)
        if self.store is not None:
            os.makedirs(self.store, exist_ok=True)
            for name in sorted(os.listdir(self.store)):
                if name.endswith(".hrry") and not name.startswith("."):
                    self._add_file(os.path.join(self.store, name), read_only=False)

    def _add_file(self, path: str, *, read_only: bool) -> None:
        served = _Served(path)
        for name, item in served.file.items():
            self._items[name] = (item, served)
            if read_only:
                self.read_only.add(name)

    def layouts(self) -> list[int]:
        """Layout tags this server can produce: the stored ones, and the transcoding targets."""
        with self._lock:
            tags = {int(item.descriptor.layout_tag) for item, _ in self._items.values()}
        return [int(t) for t in TRANSCODE_TARGETS] + sorted(tags - {int(t) for t in TRANSCODE_TARGETS})

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def acquire(self, key: str) -> Optional[tuple[Item, Optional[_Served]]]:
        """The item of ``key`` and its file, held until :meth:`release` (a replaced file stays
        open while a response reads it)."""
        with self._lock:
            found = self._items.get(key)
            if found is not None and found[1] is not None:
                found[1].users += 1
            return found

    def release(self, served: Optional[_Served]) -> None:
        if served is not None:
            with self._lock:
                served.release()

    @property
    def writable(self) -> bool:
        return self.store is not None or self.memory

    def store_item(self, key: str, item: Item, segment=None, ranges: Optional[list] = None) -> None:
        """Serve ``item`` by ``key`` from now on: held in a sealed memfd (``memory``; ``segment``
        and ``ranges``: the client's, see :func:`held`), or written to the store's file for
        ``key`` (atomically: the old file, if any, stays whole until the new one replaces it) and
        served from that file."""
        if self.memory:
            item, holder = held(item, segment, ranges)
            return self._register(key, item, holder)
        if self.store is None:
            raise HurraySchemaError("this server has no writable store")
        from ..io.file import write_file

        path = os.path.join(self.store, store_file_name(key))
        with self._writer(path):  # write, open and serve as one step: what is served is what is stored
            write_file(path, {key: item})
            served = _Served(path)
            self._register(key, served.file[key], served)
        return None

    def _register(self, key: str, item: Item, holder) -> None:
        """``key`` names ``item`` (held by ``holder``) from now on; what it named before is released
        once no response reads it."""
        with self._lock:
            old = self._items.get(key)
            self._items[key] = (item, holder)
            if old is not None and old[1] is not None and old[1] is not holder:
                old[1].retired = True
                if not old[1].users:
                    old[1].close()

    def _writer(self, path: str) -> threading.Lock:
        """The lock of ``path``'s writes: of two PUTs of one key at once, the one that renamed
        its file first could otherwise register it last, serving a tensor the store no longer
        holds."""
        with self._lock:
            return self._writers.setdefault(path, threading.Lock())

    def close(self) -> None:
        with self._lock:
            files = {id(s): s for _, s in self._items.values() if s is not None}
            self._items.clear()
        for served in files.values():
            served.close()


def store_file_name(key: str) -> str:
    """The store's file name of ``key``: every byte outside ``[A-Za-z0-9_-]`` percent-encoded,
    so no key can name a path outside the store (``..``, ``/``, NUL) or a hidden file."""
    quoted = urllib.parse.quote(key, safe="").replace(".", "%2E")
    if len(quoted) > 200:  # a file name has at most 255 bytes
        import hashlib

        quoted = quoted[:120] + "~" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return quoted + ".hrry"


# --------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------


def plan_response(item: Item, served: Optional[_Served], request: m.Request, *, transcoding: bool,
                  transcode_limit: int, parallel: bool, parallel_shards: int, parallel_min_bytes: int) -> Answer:
    """The answer to ``request`` for ``item`` (``interchange.md § Server Layout Selection``):
    the first preferred layout the item is stored in, or that it may be transcoded to within
    ``transcode_limit`` bytes; else the stored layout."""
    native = int(item.descriptor.layout_tag)
    allow = transcoding and bool(request.flags & RequestFlag.ALLOW_TRANSCODE)
    for entry in request.layouts:
        if entry.tag == native:
            break
        if allow:
            nodes = transcoded(item, entry.tag, transcode_limit)
            if nodes is not None:
                return Answer(nodes, entry.tag, transcoded=True)
    wants_shards = parallel and bool(request.flags & RequestFlag.PARALLEL_OK)
    if wants_shards and isinstance(item, Tensor):
        shards = dense_shards(item, served, parallel_shards, parallel_min_bytes)
        if shards is not None:
            return Answer(shards, native, parallel=True)
    return Answer(tuple(stored_nodes(item, served)), native)


def stored_nodes(item: Item, served: Optional[_Served]) -> Iterator[Node]:
    """The item as stored, in pre-order: descriptor bytes as in the file, data as file ranges."""
    for name, node in walk(item, item.name):
        desc = node.descriptor
        raw = _stored_descriptor(served, name) if served is not None else None
        if raw is None:
            raw = encode_descriptor(desc)
        total = sum(b.byte_size for b in desc.buffers)
        if not isinstance(node, Tensor):
            yield Node(raw, desc, (), total)
            continue
        ranges = served.buffer_ranges(node) if served is not None else None
        segments = (served.fd, ranges) if ranges is not None else None
        yield Node(raw, desc, tuple(_pieces(node, served)), total, segments=segments)


def _stored_descriptor(served: _Served, name: Optional[str]) -> Optional[bytes]:
    entry = served.entries.get(name) if name is not None else None
    if entry is None:
        return None
    view = served.file._view
    return bytes(view[entry.descriptor_offset : entry.descriptor_offset + entry.descriptor_length])


def _pieces(tensor: Tensor, served) -> Iterator:
    """A tensor's data plane: ranges of the file or memfd it lies in (for ``sendfile``), else its
    buffers in memory."""
    ranges = served.buffer_ranges(tensor) if served is not None else None
    if ranges is not None:
        for offset, size in ranges:
            if size:
                yield (served.fd, offset, size)
        return
    for buf in tensor.buffers:
        if len(buf):
            yield memoryview(buf).cast("B")


# --------------------------------------------------------------------------------------
# Transcoding (``interchange.md § On-the-Fly Transcoding``)
# --------------------------------------------------------------------------------------


def transcoded(item: Item, target: int, limit: int) -> Optional[tuple[Node, ...]]:
    """``item`` as one dense tensor in ``target`` layout, or None when this server cannot make
    it element for element (a group, a quantized or private-typed tensor, a layout it does not
    read exactly) or when the output would exceed ``limit`` bytes."""
    if target not in TRANSCODE_TARGETS or not _transcodable(item):
        return None
    desc = item.descriptor
    if _dense_bytes(desc) > limit:
        return None
    array = _logical_array(item)
    if array is None:
        return None
    tensor = Tensor.from_numpy(array, shard=desc.shard if isinstance(item, Tensor) else None)
    if int(tensor.descriptor.type_tag) != int(desc.type_tag):
        return None
    if target == LayoutTag.COLUMN_MAJOR:
        tensor = _column_major(array, tensor)
        if tensor is None:
            return None
    raw = encode_descriptor(tensor.descriptor)
    data = tuple(memoryview(b).cast("B") for b in tensor.buffers if len(b))
    return (Node(raw, tensor.descriptor, data, sum(len(b) for b in data)),)


def _transcodable(item: Item) -> bool:
    desc = item.descriptor
    if isinstance(item, Composite):
        return desc.layout.composition_rule in _MERGEABLE
    return desc.quantization is None and desc.extension_type is None and desc.layout_tag in _DENSE_SOURCES


def _dense_bytes(desc: TensorDescriptor) -> int:
    from ..structs.element_types import element_type_info

    info = element_type_info(desc.type_tag)
    if info is None:
        return 1 << 62
    return info.buffer_bytes(math.prod(desc.shape))


def _logical_array(item: Item):
    from ..errors import UnsupportedEvaluation

    try:
        return item.materialize() if isinstance(item, Composite) else item.to_numpy()
    except UnsupportedEvaluation:
        return None


def _column_major(array, tensor: Tensor) -> Optional[Tensor]:
    """The column-major tensor of ``array``: the same elements, the first index fastest
    (``layouts/column-major.md``); whole-byte types only."""
    import numpy as np

    if array.dtype.itemsize * 8 != _bits(tensor.descriptor) or array.dtype == np.bool_:
        return None
    data = np.asfortranarray(array).ravel(order="F").view(np.uint8) if array.size else b""
    desc = attrs.evolve(tensor.descriptor, layout=COLUMN_MAJOR)
    return Tensor(desc, (data,))


def _bits(desc: TensorDescriptor) -> int:
    from ..structs.element_types import element_type_info

    return element_type_info(desc.type_tag).bit_width


# --------------------------------------------------------------------------------------
# Parallel shards (``interchange.md § Parallel Transfers``)
# --------------------------------------------------------------------------------------


def dense_shards(tensor: Tensor, served: Optional[_Served], count: int,
                 min_bytes: int) -> Optional[tuple[Node, ...]]:
    """A dense row-major tensor cut along dimension 0 into up to ``count`` shards of whole rows,
    each a row-major tensor with a shard section (``parent_shape``, ``shard_offset``); None
    when the tensor is not such a tensor, is smaller than ``min_bytes`` or has too few rows."""
    desc = tensor.descriptor
    if (desc.layout_tag != LayoutTag.ROW_MAJOR or desc.quantization is not None or desc.shard is not None
            or desc.composite_member is not None or desc.extension_type is not None or len(desc.buffers) != 1
            or desc.rank < 1 or count < 2):
        return None
    total = desc.buffers[0].byte_size
    rows = desc.shape[0]
    row_bits = _bits(desc) * math.prod(desc.shape[1:])
    if total < min_bytes or rows < 2 or row_bits % 8 or not row_bits:
        return None
    row_bytes = row_bits // 8
    (piece,) = tuple(_pieces(tensor, served)) or (b"",)
    n = min(count, rows)
    bounds = [rows * i // n for i in range(n + 1)]
    nodes = []
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        shape = (hi - lo,) + tuple(desc.shape[1:])
        shard = Shard(tuple(desc.shape), (lo,) + (0,) * (desc.rank - 1))
        handle = attrs.evolve(desc.buffers[0], byte_size=(hi - lo) * row_bytes)
        sub = attrs.evolve(desc, shape=shape, shard=shard, buffers=(handle,), statistics=None)
        if isinstance(piece, tuple):
            data = (piece[0], piece[1] + lo * row_bytes, (hi - lo) * row_bytes)
        else:
            data = memoryview(piece)[lo * row_bytes : hi * row_bytes]
        nodes.append(Node(encode_descriptor(sub), sub, (data,) if handle.byte_size else (), handle.byte_size,
                          shard_index=i, total_shards=n))
    return tuple(nodes)


def advertised_layouts(catalog: Catalog) -> tuple[m.LayoutEntry, ...]:
    return m.layout_entries(catalog.layouts())



