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

import collections
import math
import os
import threading
import time
import urllib.parse
from typing import Iterator, Optional, Sequence

import attrs

from ..codec import encode_descriptor
from ..errors import HurraySchemaError, LimitExceeded, SourceChanged, UnsupportedEvaluation
from ..io.file import HurrayFile, read_file
from ..io.source import LocalFileSource, RangeReader, SourcedBuffers
from ..io.tensor import Composite, Item, SourcedTensor, Tensor, walk
from ..limits import DEFAULT_LIMITS
from ..model import COLUMN_MAJOR, Shard, TensorDescriptor
from ..structs.session import RequestFlag
from ..structs.tags import CompositionRule, LayoutTag
from . import messages as m
from .options import ServerOptions
from .shm import SHARED_CHUNK_BYTES, layout, read_ranges, sealed_copy, sealed_memfd

__all__ = ["Node", "Catalog", "Answer", "plan_response", "TRANSCODE_TARGETS", "store_file_name", "StoreFull",
           "read_copy"]

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


class StoreFull(HurraySchemaError):
    """Storing an item would take the store past ``store_max_items`` or ``store_max_bytes``."""


class _Holder:
    """What the items a response reads lie in -- an open file or a memory file -- read by range
    (``reader``: their leaves are :class:`~hurray_schema.io.tensor.SourcedTensor`), from descriptor
    ``fd``; closed once retired and no response reads it any more."""

    path: Optional[str] = None
    reader = None
    fd = -1

    def __init__(self):
        self.users = 0
        self.retired = False

    def release(self) -> None:
        self.users -= 1
        if self.retired and not self.users:
            self.close()

    def close(self) -> None:
        raise NotImplementedError

    def buffer_ranges(self, tensor: Tensor) -> Optional[tuple]:
        """``(offset, size)`` of each of ``tensor``'s buffers in this holder's file, if it is one of its."""
        source = getattr(tensor, "_source", None)
        return source.ranges if source is not None and source.reader is self.reader else None

    def stored_descriptor(self, name: Optional[str]) -> Optional[bytes]:
        """The descriptor bytes of entry ``name`` as stored, when there are some."""
        return None


class _Served(_Holder):
    """One served file, open: its reader (by ``pread``: the server never maps a served file, so
    a file cut under it is a typed error, not SIGBUS), its descriptor and the identity it had when
    opened."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.file: HurrayFile = read_file(path, mmap=False)
        try:
            self.fd = self.file.fileno()
            self.reader = self.file._reader
            self.identity = _identity(os.fstat(self.fd))
            self.checked = time.monotonic()
            entries = self.file.entries()
            self.descriptors = {e.name: self._descriptor_bytes(e) for e in entries}
        except BaseException:
            self.file.close()
            raise

    def _descriptor_bytes(self, entry) -> bytes:
        """The descriptor as stored, read once at open (what a response sends as it is)."""
        return bytes(self.file._view[entry.descriptor_offset : entry.descriptor_offset + entry.descriptor_length])

    def current(self) -> bool:
        """The file is as it was when opened (same size and modification time): not cut or
        rewritten in place since.  Looked at once per :data:`RECHECK_SECONDS` at most (a response
        reading past a cut is refused anyway: :class:`~hurray_schema.errors.ShortRead`)."""
        now = time.monotonic()
        if now < self.checked + RECHECK_SECONDS:
            return True
        try:
            same = _identity(os.fstat(self.fd)) == self.identity
        except OSError:
            return False
        self.checked = now
        return same

    def item(self, key: str) -> Item:
        return self.file[key]

    def close(self) -> None:
        self.file.close()

    def stored_descriptor(self, name: Optional[str]) -> Optional[bytes]:
        return self.descriptors.get(name) if name is not None else None


RECHECK_SECONDS = 0.05
"""How often a served file's size and modification time are looked at, at most (on a GET)."""


def _identity(st: os.stat_result) -> tuple:
    return st.st_ino, st.st_size, st.st_mtime_ns


class _FileEntry:
    """A file the catalog serves from (a served one, or one of the store's): its path, the keys
    it holds, and the open :class:`_Served` while it is open (files are opened on demand and the
    least recently used idle ones closed)."""

    def __init__(self, path: str, read_only: bool):
        self.path = path
        self.read_only = read_only
        self.opened: Optional[_Served] = None
        self.keys: tuple[str, ...] = ()
        self.layouts: frozenset = frozenset()
        self.size = 0

    @classmethod
    def of(cls, served: _Served, read_only: bool) -> "_FileEntry":
        """The entry of the file ``served`` has open: what it holds (its top-level keys, their
        layouts, its size), kept open."""
        entry = cls(served.path, read_only)
        entry.keys = tuple(served.file.keys())
        entry.layouts = frozenset(int(served.file.descriptor(k).layout_tag) for k in entry.keys)
        entry.size = served.identity[1]
        entry.opened = served
        return entry

    def open(self) -> _Served:
        """The open file, opened again when it changed in place since (cut or rewritten); a file
        that no longer opens, or no longer holds its keys, is :class:`~hurray_schema.errors.SourceChanged`."""
        served = self.opened
        if served is not None and served.current():
            return served
        if served is not None:
            self.drop()
        try:
            served = _Served(self.path)
        except (HurraySchemaError, OSError) as exc:
            raise SourceChanged(f"the served file {self.path} changed and cannot be read: {exc}") from None
        self.opened = served
        return served

    def drop(self) -> None:
        """Close the open file once no response reads it."""
        served, self.opened = self.opened, None
        if served is not None:
            served.retired = True
            if not served.users:
                served.close()


class _Held(_Holder):
    """An item the server holds in memory: every buffer in one sealed memfd, read by ``pread``
    and never mapped here: one descriptor per item, which shared-memory clients are handed and map
    as it is."""

    def __init__(self, item: Item, source, reader):
        super().__init__()
        self.held_item = item
        self.source = source
        self.reader = reader
        self.fd = source.fileno()
        self.size = source.size

    def item(self, key: str) -> Item:
        return self.held_item

    def close(self) -> None:
        self.source.close()


def held(item: Item, fd: Optional[int] = None, ranges: Optional[list] = None) -> _Held:
    """``item`` held in a sealed memfd: ``fd`` as given with each leaf's buffer ``ranges`` in it
    (a client's, pushed by SHM_PUT; the caller keeps its own descriptor), or a new memfd holding a
    copy of every leaf's buffers.  The item is rebuilt over the memfd, read by range."""

    leaves = [node for _, node in walk(item) if isinstance(node, Tensor)]
    if fd is None:
        fd, offsets, _ = sealed_memfd([b for leaf in leaves for b in leaf.buffers], name="hurray-store")
        flat = iter(zip(offsets, (len(b) for leaf in leaves for b in leaf.buffers)))
        ranges = [tuple(next(flat) for _ in leaf.buffers) for leaf in leaves]
    else:
        fd = os.dup(fd)
    source = LocalFileSource.adopt(fd, "memfd:hurray-store")
    reader = RangeReader(source)
    spans = iter(ranges)
    item = _rebuilt(item, lambda leaf: SourcedTensor.over(leaf.descriptor, SourcedBuffers(reader, next(spans)),
                                                          name=leaf.name))
    return _Held(item, source, reader)


def _rebuilt(item: Item, leaf_of) -> Item:
    """``item`` with each leaf replaced by ``leaf_of(leaf)`` (pre-order)."""
    if isinstance(item, Composite):
        members = [_rebuilt(member, leaf_of) for member in item.members]
        return Composite.from_binder(item.descriptor, item.name, members, True)
    return leaf_of(item)


def read_copy(item: Item, holder, limit: int) -> Optional[Item]:
    """``item`` with every leaf's buffers read into memory of this process (``pread`` from its
    file or memfd: a file cut meanwhile is :class:`~hurray_schema.errors.ShortRead`), or None when
    they hold more than ``limit`` bytes.  What the transcoder computes from: the held leaves keep
    no bytes they fetched."""
    leaves = [node for _, node in walk(item) if isinstance(node, Tensor)]
    spans = [holder.buffer_ranges(leaf) for leaf in leaves]
    if any(s is None for s in spans):
        return item
    if sum(size for ranges in spans for _, size in ranges) > limit:
        return None
    views = iter([read_ranges(holder.fd, ranges) for ranges in spans])

    def leaf_of(leaf):
        tensor = Tensor.bound(leaf.descriptor, list(next(views)))
        tensor.name = leaf.name
        return tensor

    return _rebuilt(item, leaf_of)


class Catalog:
    """The items served by name: every top-level item of ``paths`` (a later file's name wins),
    then the writable store's (``store``: a folder of one ``.hrry`` file per key), or the items
    pushed into memory (``memory``).  ``options`` (:class:`~.options.ServerOptions`) bounds the
    store, the files open at once and the shared copies."""

    def __init__(self, paths: Sequence[str], store: Optional[str] = None, memory: bool = False,
                 options: Optional[ServerOptions] = None):
        self._lock = threading.Lock()
        self.options = options if options is not None else ServerOptions()
        self.memory = memory
        """PUTs are held in memory (a sealed memfd each), not written to ``store``."""
        self._items: dict[str, object] = {}
        """key -> the :class:`_FileEntry` or :class:`_Held` that holds it."""
        self._open: "collections.OrderedDict[str, _FileEntry]" = collections.OrderedDict()
        """The entries whose file is open, least recently used first."""
        self._writers: dict[str, threading.Lock] = {}
        """Per store file, the lock of its writes (one PUT of a key stored at a time)."""
        self._copies = SharedCopies(self.options.shm_cache_bytes, self.options.max_open_files)
        self.read_only: set[str] = set()
        self.store = None if store is None else os.fspath(store)
        self.store_limit = self.options.store_bytes(memory)
        self.item_limit = self.options.store_items(memory)
        self.stored_bytes = 0
        self.stored_items = 0
        self._served_layouts: set[int] = set()
        try:
            for path in paths:
                self._add_file(os.fspath(path), read_only=True)
            if self.store is not None:
                os.makedirs(self.store, exist_ok=True)
                for name in sorted(os.listdir(self.store)):
                    if name.endswith(".hrry") and not name.startswith("."):
                        self._add_store_file(name)
        except BaseException:
            self.close()
            raise

    def _add_file(self, path: str, *, read_only: bool, served: Optional[_Served] = None) -> _FileEntry:
        """Serve the top-level items of ``path`` (``served``: already open): opened once to learn
        them, then kept open while fewer than ``max_open_files`` are."""
        entry = _FileEntry.of(_Served(path) if served is None else served, read_only)
        for key in entry.keys:
            self._items[key] = entry
            if read_only:
                self.read_only.add(key)
        if read_only:
            self._served_layouts |= entry.layouts
        self._open[path] = entry
        self._close_idle()
        return entry

    def _add_store_file(self, name: str) -> None:
        """One file of the store: its key served, its bytes counted.  A file named as an earlier
        version named its key is renamed to the key's name, or removed when a file of that name
        holds the key already (a PUT since wrote it)."""
        path = os.path.join(self.store, name)
        served = _Served(path)
        keys = tuple(served.file.keys())
        if len(keys) == 1 and store_file_name(keys[0]) != name:
            served.close()
            canonical = os.path.join(self.store, store_file_name(keys[0]))
            if os.path.exists(canonical):
                os.unlink(path)
                return
            os.replace(path, canonical)
            path, served = canonical, _Served(canonical)
        entry = self._add_file(path, read_only=False, served=served)
        self.stored_bytes += entry.size
        self.stored_items += len(entry.keys)

    def _close_idle(self) -> None:
        """Close the least recently used open files past ``max_open_files`` (those a response
        reads stay open until it is done)."""
        excess = len(self._open) - self.options.max_open_files
        if excess <= 0:
            return
        idle = [path for path, entry in self._open.items() if entry.opened is None or not entry.opened.users]
        for path in idle[:excess]:
            self._open.pop(path).drop()

    def layouts(self) -> list[int]:
        """Layout tags this server can produce: the transcoding targets, every layout a served
        file holds, and every layout a writable server may be pushed."""
        with self._lock:
            tags = set(self._served_layouts)
            if self.writable:
                tags |= {int(t) for t in LayoutTag}
            else:
                tags |= {int(e.held_item.descriptor.layout_tag) for e in self._items.values() if isinstance(e, _Held)}
        targets = [int(t) for t in TRANSCODE_TARGETS]
        return targets + sorted(tags - set(targets))

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def acquire(self, key: str) -> Optional[tuple[Item, object]]:
        """The item of ``key`` and its holder (an open file or a memfd), held until
        :meth:`release` (a replaced file stays open while a response reads it); None for an unknown
        key.  A served file that changed and no longer holds the key is
        :class:`~hurray_schema.errors.SourceChanged`."""
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                return None
            if isinstance(entry, _FileEntry):
                served = entry.open()
                self._open[entry.path] = entry
                self._open.move_to_end(entry.path)
                self._close_idle()
                try:
                    item = served.item(key)
                except KeyError:
                    raise SourceChanged(f"the served file {entry.path} no longer holds {key!r}") from None
                holder = served
            else:
                holder, item = entry, entry.held_item
            holder.users += 1
            return item, holder

    def release(self, holder) -> None:
        if holder is not None:
            with self._lock:
                holder.release()

    def shared_copy(self, holder, ranges) -> Optional[tuple[int, tuple]]:
        """A sealed memfd holding the bytes of ``ranges`` of ``holder``'s file, and each range's
        place in it, for a shared-memory client (a copy kept in the bounded cache); None when
        they are larger than the cache.  The descriptor is the caller's to close."""
        return self._copies.get(holder.fd, holder.identity, ranges)

    @property
    def writable(self) -> bool:
        return self.store is not None or self.memory

    def store_item(self, key: str, item: Item, segment=None, ranges: Optional[list] = None) -> None:
        """Serve ``item`` by ``key`` from now on: held in a sealed memfd (``memory``; ``segment``
        and ``ranges``: the client's, see :func:`held`), or written to the store's file for
        ``key`` (atomically: the old file, if any, stays whole until the new one replaces it) and
        served from that file.  :class:`StoreFull` when the store's limits would be passed."""
        if self.memory:
            self._room(key, _layout_bytes(item) if segment is None else segment.size)
            return self._register(key, held(item, None if segment is None else segment.fd, ranges))
        if self.store is None:
            raise HurraySchemaError("this server has no writable store")
        from ..io.file import write_file

        path = os.path.join(self.store, store_file_name(key))
        with self._writer(path):  # write, open and serve as one step: what is served is what is stored
            self._room(key, _data_bytes(item))
            write_file(path, {key: item})
            self._register(key, _FileEntry.of(_Served(path), read_only=False))
        return None

    def _room(self, key: str, size: int) -> None:
        """:class:`StoreFull` unless the store can take ``size`` more bytes (less what ``key``'s
        old item frees) and, for a new key, one more item."""
        with self._lock:
            old = self._items.get(key)
            freed = old.size if old is not None and key not in self.read_only else 0
            items = self.stored_items + (old is None)
            if items > self.item_limit:
                raise StoreFull(f"the store holds {self.stored_items} items, store_max_items is {self.item_limit}")
            if self.stored_bytes - freed + size > self.store_limit:
                raise StoreFull(f"the store holds {self.stored_bytes} bytes; {size} more would pass store_max_bytes "
                                f"{self.store_limit}")

    def _register(self, key: str, holder) -> None:
        """``key`` names the item ``holder`` holds from now on; what it named before is released
        once no response reads it."""
        with self._lock:
            old = self._items.get(key)
            self._items[key] = holder
            self.stored_bytes += holder.size - (old.size if old is not None else 0)
            self.stored_items += old is None
            if isinstance(holder, _FileEntry):
                self._open[holder.path] = holder
                self._open.move_to_end(holder.path)
            if old is not None and old is not holder:
                if isinstance(old, _FileEntry):
                    if old.path != getattr(holder, "path", None):
                        self._open.pop(old.path, None)
                    old.drop()
                else:
                    old.retired = True
                    if not old.users:
                        old.close()
            self._close_idle()

    def _writer(self, path: str) -> threading.Lock:
        """The lock of ``path``'s writes: of two PUTs of one key at once, the one that renamed
        its file first could otherwise register it last, serving a tensor the store no longer
        holds."""
        with self._lock:
            return self._writers.setdefault(path, threading.Lock())

    def close(self) -> None:
        with self._lock:
            holders = {id(h): h for h in self._items.values()}
            self._items.clear()
            self._open.clear()
        for holder in holders.values():
            if isinstance(holder, _FileEntry):
                holder.drop()
            else:
                holder.close()
        self._copies.close()


def _data_bytes(item: Item) -> int:
    return sum(b.byte_size for _, node in walk(item) for b in node.descriptor.buffers)


def _layout_bytes(item: Item) -> int:
    return layout(b.byte_size for _, node in walk(item) for b in node.descriptor.buffers)[1]


PLANS_KEPT = 4096
"""The copy plans :class:`SharedCopies` remembers (forgotten all at once past this many)."""


class SharedCopies:
    """Sealed memfd copies of served files, for shared-memory clients: at most ``budget`` bytes
    and ``count`` memfds, least recently used dropped first (a client keeps what it mapped).  A
    copy is made in the kernel (:func:`~.shm.sealed_copy`: a file cut meanwhile is a typed error)
    and found again by the file's identity (inode, size, modification time) and what it holds."""

    def __init__(self, budget: int, count: int):
        self.budget = budget
        self.count = count
        self._copies: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
        self._plans: dict = {}
        """What a request's ranges are copied as (:func:`_copy_plan`), by file identity and ranges."""
        self.bytes = 0
        self._lock = threading.Lock()

    def get(self, fd: int, identity: tuple, ranges) -> Optional[tuple[int, tuple]]:
        """A descriptor of the copy holding ``ranges`` of file ``fd`` (the caller closes it), and
        each range's ``(offset, size)`` in it; None when the copy would not fit the cache."""
        asked = (identity, tuple(ranges))
        with self._lock:
            plan = self._plans.get(asked)
            found = self._copies.get(plan[0]) if plan is not None else None
            if found is not None:
                self._copies.move_to_end(plan[0])
                return os.dup(found[0]), plan[4]
        key, spans, offsets, total, placed = plan = _copy_plan(*asked)
        if total > self.budget or not self.count:
            return None
        copy = sealed_copy(fd, spans, offsets, total)
        with self._lock:
            if key in self._copies:  # made twice at once: keep the first
                os.close(copy)
                copy = self._copies[key][0]
            else:
                self._copies[key] = (copy, total)
                self.bytes += total
                self._evict()
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[asked] = plan
            return os.dup(copy), placed

    def _evict(self) -> None:
        while self._copies and (self.bytes > self.budget or len(self._copies) > self.count):
            _, (fd, size) = self._copies.popitem(last=False)
            os.close(fd)
            self.bytes -= size

    def close(self) -> None:
        with self._lock:
            while self._copies:
                os.close(self._copies.popitem()[1][0])
            self.bytes = 0


def _copy_plan(identity: tuple, ranges) -> tuple:
    """``(key, spans copied, their offsets in the copy, its size, each range's place in it)``:
    the chunk of the file that holds every range, or the ranges alone laid out one after another."""
    used = [(o, n) for o, n in ranges if n]
    size = identity[1]
    if used:
        first = min(o for o, _ in used) // SHARED_CHUNK_BYTES
        start = first * SHARED_CHUNK_BYTES
        if max(o + n for o, n in used) <= start + SHARED_CHUNK_BYTES:
            stop = min(size, start + SHARED_CHUNK_BYTES)
            placed = tuple((o - start, n) if n else (0, 0) for o, n in ranges)
            return (identity, first), [(start, stop - start)], [0], stop - start, placed
    offsets, total = layout(n for _, n in ranges)
    return (identity, tuple(ranges)), list(ranges), offsets, total, tuple(zip(offsets, (n for _, n in ranges)))


def store_file_name(key: str) -> str:
    """The store's file name of ``key``: every byte outside ``[A-Za-z0-9_-]`` percent-encoded
    (``.`` and ``~`` too), so no key can name a path outside the store (``..``, ``/``, NUL) or a
    hidden file; a name past 200 characters is cut to 120 and ends with ``~`` and the key's
    SHA-256, and since no encoded key holds ``~``, two keys never share a name."""
    quoted = urllib.parse.quote(key, safe="").replace(".", "%2E").replace("~", "%7E")
    if len(quoted) > 200:  # a file name has at most 255 bytes
        import hashlib

        quoted = quoted[:120] + "~" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return quoted + ".hrry"


# --------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------


def plan_response(item: Item, holder, request: m.Request, *, transcoding: bool, transcode_limit: int, parallel: bool,
                  parallel_shards: int, parallel_min_bytes: int) -> Answer:
    """The answer to ``request`` for ``item`` held by ``holder`` (an open file, a memfd, or None)
    (``interchange.md § Server Layout Selection``): the first preferred layout the item is stored in,
    or that it may be transcoded to within ``transcode_limit`` bytes; else the stored layout
    (``session.layout.selection``)."""
    native = int(item.descriptor.layout_tag)
    allow = transcoding and bool(request.flags & RequestFlag.ALLOW_TRANSCODE)
    for entry in request.layouts:
        if entry.tag == native:
            break
        if allow:
            nodes = transcoded(item, holder, entry.tag, transcode_limit)
            if nodes is not None:
                return Answer(nodes, entry.tag, transcoded=True)
    wants_shards = parallel and bool(request.flags & RequestFlag.PARALLEL_OK)
    if wants_shards and isinstance(item, Tensor):
        shards = dense_shards(item, holder, parallel_shards, parallel_min_bytes)
        if shards is not None:
            return Answer(shards, native, parallel=True)
    return Answer(tuple(stored_nodes(item, holder)), native)


def stored_nodes(item: Item, holder) -> Iterator[Node]:
    """The item as stored, in pre-order: descriptor bytes as in the file, data as file ranges."""
    for name, node in walk(item, item.name):
        desc = node.descriptor
        raw = holder.stored_descriptor(name) if holder is not None else None
        if raw is None:
            raw = encode_descriptor(desc)
        total = sum(b.byte_size for b in desc.buffers)
        if not isinstance(node, Tensor):
            yield Node(raw, desc, (), total)
            continue
        ranges = holder.buffer_ranges(node) if holder is not None else None
        segments = (holder.fd, ranges) if ranges is not None else None
        yield Node(raw, desc, tuple(_pieces(node, holder, ranges)), total, segments=segments)


def _pieces(tensor: Tensor, holder, ranges: Optional[tuple]) -> Iterator:
    """A tensor's data plane: its ``ranges`` of the file or memfd ``holder`` reads (for
    ``sendfile``), else its buffers in memory."""
    if ranges is not None:
        for offset, size in ranges:
            if size:
                yield (holder.fd, offset, size)
        return
    for buf in tensor.buffers:
        if len(buf):
            yield memoryview(buf).cast("B")


# --------------------------------------------------------------------------------------
# Transcoding (``interchange.md § On-the-Fly Transcoding``)
# --------------------------------------------------------------------------------------


def transcoded(item: Item, holder, target: int, limit: int) -> Optional[tuple[Node, ...]]:
    """``item`` as one dense tensor in ``target`` layout, or None when this server cannot make
    it element for element (a group, a quantized or private-typed tensor, a layout it does not
    read exactly) or not within ``limit`` bytes: the output, the stored bytes it is computed from
    (read into memory first: :func:`read_copy`) and what the evaluation allocates
    (``session.transcode.limit``: the caller falls through to the next layout).  The output keeps the
    item's shape and element type and every value (``session.transcode.elements``): anything else is None."""
    if target not in TRANSCODE_TARGETS or not _transcodable(item):
        return None
    desc = item.descriptor
    if _dense_bytes(desc) > limit:
        return None
    source = read_copy(item, holder, limit) if holder is not None else item
    array = _logical_array(source, limit) if source is not None else None
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


def _logical_array(item: Item, limit: int):
    """The item's values, the evaluation bounded by ``limit`` bytes; None when the evaluator
    cannot make them or would need more (``LimitExceeded``: a fall-through, not a failure)."""
    limits = DEFAULT_LIMITS.evolve(max_evaluation_bytes=limit)
    try:
        return item.materialize(limits=limits) if isinstance(item, Composite) else item.to_numpy(limits=limits)
    except (UnsupportedEvaluation, LimitExceeded):
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


def dense_shards(tensor: Tensor, holder, count: int,
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
    ranges = holder.buffer_ranges(tensor) if holder is not None else None
    (piece,) = tuple(_pieces(tensor, holder, ranges)) or (b"",)
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
