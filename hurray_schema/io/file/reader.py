"""Read ``.hrry`` files (``file-format.md``): :class:`HurrayFile` and :func:`read_file`.

Reading follows the random-access protocol (``§ Reader Protocol``): header, trailer,
index (CRC-checked), KV, then every descriptor -- but no data.  The file is memory-
mapped; a tensor's buffers are ``memoryview`` slices of the map, so bytes are paged in
only when used (and a file cut short under the map kills the process with ``SIGBUS`` when
those pages are touched).  With ``mmap=False`` a local file is read by range instead, as a
URL is (:mod:`..source`, :class:`~hurray_schema.io.source.LocalFileSource`: ``os.pread`` into
the reader's own memory), and a file cut short or changed raises a typed error.  Composite
membership is recovered from descriptor-offset order (``§ Composite Tensors``) whether or not
the index is sorted.

The reader takes the index and placement checks of :mod:`.index` and, where those cannot vouch
for a file, the walk of :mod:`.walk`; neither imports this module.
"""

from __future__ import annotations

import errno
import io
import mmap as _mmap  # "mmap" is also the readers' keyword argument
import os
import stat
from collections.abc import Mapping
from typing import Iterator, Optional

import numpy as np

from ..._deprecation import deprecated
from ...errors import ClosedFileError, HurraySchemaError, NoSuchItem, NotAnArray
from ...limits import Limits, resolve_limits
from ...model import CompositionRule, TensorDescriptor
from ...rules.composite import CompositeBinder
from ...rules.engine import Finding, as_mode
from ...structs.file import FILE_HEADER_SIZE, TRAILER, TRAILER_SIZE, FileFlag
from ...structs._declare import plan
from ..tensor import Composite, Item, SourcedTensor, Tensor, locate_buffers, walk
from ..walk.common import ENTRY, as_view, is_url
from ..walk.descriptor import strict_describer
from .index import FileIndex, front_sections, place_tensors
from .walk import IndexEntry, check_tensor, checked_file, walk_index

__all__ = ["ClosedFileError", "HurrayFile", "IndexEntry", "TensorSlice", "item_array", "read_file"]

_TRAILER = plan(TRAILER)


class TensorSlice:
    """What :meth:`HurrayFile.get_slice` returns: the item's ``shape`` and ``dtype`` (also
    as ``get_shape()`` / ``get_dtype()``, as safetensors spells them) without reading data,
    and ``slice[index]``, which is the item's own indexing (only what the index needs is
    read)."""

    __slots__ = ("_item",)

    def __init__(self, item: Item):
        self._item = item

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._item.shape)

    @property
    def dtype(self):
        """The NumPy / ``ml_dtypes`` dtype of the decoded value."""
        return self._item.dtype

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def get_dtype(self) -> str:
        return str(self.dtype)

    def __getitem__(self, index):
        return self._item[index]

    def __repr__(self) -> str:
        return f"TensorSlice({self._item!r})"


class HurrayFile(Mapping):
    """A read-only mapping ``name -> Tensor | Composite`` over a ``.hrry`` file.

    Composite members are reachable through their composite (and by
    :meth:`get_item`), not as keys.  ``entries()`` lists every index entry.  ``kv`` is the
    decoded KV section; ``findings`` what the mode tolerated plus SHOULD-level notes, of
    the container, descriptor and composite rules alike: what ``audit`` reports on the file
    (same rule, level and offset, each descriptor's in audit's order), but for the rules
    only audit runs (:data:`hurray_schema.rules.interop.AUDIT_ONLY`) and those checked when a
    tensor's values are decoded (:data:`hurray_schema.rules.values.AT_DECODE`).

    Items are read lazily: ``f[name]`` (a top-level item) and :meth:`get_item` (members too)
    read no data; indexing an item reads only what the index needs.  :meth:`metadata` is a
    copy of the KV section.  ``tensor``, ``get_tensor`` and ``get_slice`` are deprecated.
    After :meth:`close` (the end of a ``with`` block) every access raises :class:`ClosedFileError`.

    A local path is memory-mapped, or with ``mmap=False`` read by range through a
    :class:`~.source.LocalFileSource` (``os.pread``, never mapped: see :func:`read_file`).
    """

    def __init__(self, path, *, mode="strict", limits: Optional[Limits] = None, validate_composites: bool = True,
                 storage_options: Optional[dict] = None, block_size: Optional[int] = None,
                 cache_bytes: Optional[int] = None, timeout: Optional[float] = None, mmap: bool = True):
        if is_url(path) or (hasattr(path, "fs") and hasattr(path, "path")):  # a URL, an open fsspec file
            self._open_by_range(path, mode, limits, validate_composites, storage_options, block_size, cache_bytes,
                                timeout)
            return
        if not mmap:
            self._open_unmapped(os.fspath(path), mode, limits, validate_composites, block_size, cache_bytes)
            return
        self._setup(os.fspath(path), mode, limits)
        self._fd, self._map = _map_file(self.path)
        try:
            self._open(memoryview(self._map if self._map is not None else b""), validate_composites)
        except BaseException:
            self.close()
            raise

    @classmethod
    def over(cls, data, *, mode="strict", limits: Optional[Limits] = None,
             validate_composites: bool = True) -> "HurrayFile":
        """The file whose bytes are ``data`` (bytes or a memory map already open); ``path`` is None."""
        self = cls.__new__(cls)
        self._setup(None, mode, limits)
        try:
            self._open(memoryview(as_view(data)), validate_composites)  # its own view: close() releases it
        except BaseException:
            self.close()
            raise
        return self

    def _open_by_range(self, url, mode, limits, validate_composites, storage_options, block_size, cache_bytes,
                       timeout) -> None:
        """A URL or an open fsspec file, read by byte range (:mod:`.source`): the trailer, index, KV
        section and every descriptor fetched first in few requests, then the same walk as a local
        file's over those bytes; buffers are fetched when a read needs them."""
        from .. import source as sources

        opened = sources.open_source(url, storage_options,
                                     timeout=sources.DEFAULT_TIMEOUT if timeout is None else timeout)
        self._setup(opened.ref.url, mode, limits)
        self._read_by_range(opened, validate_composites, block_size, cache_bytes)

    def _open_unmapped(self, path: str, mode, limits, validate_composites, block_size, cache_bytes) -> None:
        """A local path read by range and never mapped (``mmap=False``): a :class:`~.source.LocalFileSource`
        (``os.pread`` on one descriptor, which :meth:`fileno` gives and :meth:`close` closes) under the
        reader a URL has; no fsspec."""
        from ..source import LocalFileSource

        self._setup(path, mode, limits)
        self._local_source = LocalFileSource(path)
        self._read_by_range(self._local_source, validate_composites, block_size, cache_bytes)

    def _read_by_range(self, opened, validate_composites, block_size, cache_bytes) -> None:
        """The file whose bytes the :class:`~.source.ByteSource` ``opened`` gives, through a
        :class:`~.source.RangeReader` (this process's reader of it): sections prefetched, then the walk."""
        from .. import source as sources

        self.source = opened.ref
        options = {"block_size": block_size, "cache_bytes": cache_bytes}
        try:
            self._reader = sources.RangeReader(opened, **{k: v for k, v in options.items() if v is not None})
            sources.register(self._reader)
            self._prefetch_sections(sources)
            self._open(sources.SourceView(self._reader), validate_composites)
        except BaseException:
            self.close()
            raise

    def _prefetch_sections(self, sources) -> None:
        """The bytes the walk will read, fetched in as few requests as the layout allows, each exactly
        (:meth:`~.source.RangeReader.pin`: no block rounding, so no tensor's data comes along but
        those of a few KiB between descriptors): the file's tail (the trailer, and the index and KV
        section when they fit: :func:`~.source.tail_bytes`), the index if it lies elsewhere, then
        the header, the KV section and every descriptor the index locates, in one batch.  No rule is
        checked here (the walk checks them); a section over its budget is not fetched (the walk
        refuses it)."""
        reader, size = self._reader, self._reader.size
        reader.pin([(size - sources.tail_bytes(size, reader.block_size), size)])
        if size < FILE_HEADER_SIZE + TRAILER_SIZE:
            return
        trailer, _ = _TRAILER.unpack(reader.read(size - TRAILER_SIZE, size), 0)
        kv_at, kv_length = trailer["kv_offset"], trailer["kv_length"]
        hints = [(0, FILE_HEADER_SIZE)]
        if 0 <= kv_at < kv_at + kv_length <= size - TRAILER_SIZE and kv_length <= self.limits.max_kv_bytes:
            hints.append((kv_at, kv_at + kv_length))
        index_at, index_length = trailer["index_offset"], trailer["index_length"]
        if not 0 <= index_at < index_at + index_length <= size - TRAILER_SIZE or index_length > self.limits.max_index_bytes:
            reader.pin(hints)
            return
        reader.pin([(index_at, index_at + index_length)])
        index = memoryview(reader.read(index_at, index_at + index_length))
        for part in walk_index(index, 0):
            if part.kind == ENTRY:
                entry = part.value
                start, stop = entry.descriptor_offset, entry.descriptor_offset + entry.descriptor_length
                if 0 <= start < stop <= size:
                    hints.append((start, stop))
        reader.pin(hints)

    @property
    def requests(self) -> int:
        """Requests made to the source of a file read by range (0 for a mapped local file)."""
        reader = getattr(self, "_reader", None)
        return 0 if reader is None else reader.requests

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched from the source of a file read by range (0 for a mapped local file)."""
        reader = getattr(self, "_reader", None)
        return 0 if reader is None else reader.bytes_fetched

    def _setup(self, path, mode, limits) -> None:
        self.path = path
        self.source = None
        self._reader = None
        self._abspath = os.path.abspath(path) if path is not None and not is_url(path) else None
        self.mode = as_mode(mode)
        self.limits = resolve_limits(limits)
        self._fd: Optional[int] = None  # a mapped file's descriptor
        self._local_source = None  # a local file read by range (mmap=False): its LocalFileSource
        self._index: Optional[FileIndex] = None
        self._placement = None  # the index's Placement, when the open checked it as arrays
        self._checked: dict[str, tuple] = {}  # name -> (descriptor, buffer spans, findings), once checked
        self._members: set[str] = set()  # entries that are not top-level items
        self._map: Optional[_mmap.mmap] = None
        self._closed = False
        self._by_name: Optional[dict[str, Item]] = None

    # -- opening -------------------------------------------------------------------
    def _open(self, view, validate_composites: bool) -> None:
        """The sections, the index and every tensor's placement checked, and the composites bound
        (:mod:`.index`); the other tensors' descriptors are decoded and checked on first read.
        A file read by range, or one whose placement the arrays cannot vouch for, is walked tensor by
        tensor (:func:`~hurray_schema.io.file.walk.walk_file`), which raises the first fault."""
        self._view = view
        self.size = len(view)
        self._describe = strict_describer(mode=self.mode, limits=self.limits)
        self._bind_findings: list[Finding] = []
        self._items: dict[str, Item] = {}
        if isinstance(view, memoryview):
            self._open_indexed(view, validate_composites)
        if self._placement is None:
            self._open_walked(view, validate_composites)
        members = self._members
        self._names = (self._index.names if not members
                       else [name for name in self._index.names if name not in members])

    def _open_indexed(self, view: memoryview, validate_composites: bool) -> None:
        """The index as arrays, the placement checked on them; only composites (heads and members)
        and data-less entries decoded now.  Leaves ``_placement`` None when the arrays found
        something wrong: the walk then names it."""
        self.header, self.trailer, self._index, self._kv_part, region = front_sections(view, self.mode, self.limits)
        self._region = region
        placement = place_tensors(view, self._index, region)
        if placement is None:
            return
        self._placement = placement
        if placement.at_open.any():
            self._bind_at_open(placement, validate_composites)

    def _bind_at_open(self, placement, validate_composites: bool) -> None:
        """The tensors the open decodes (``placement.at_open``: composite heads, entries declaring no
        data), in descriptor order, each with the members that follow it, through the binder."""
        binder = self._binder(validate_composites)
        order, names, count = placement.order, self._index.names, len(placement.order)
        bound_to = -1  # descriptor rank up to which tensors were bound already (a composite run)
        bound: list[str] = []
        for rank in np.flatnonzero(placement.at_open).tolist():
            if rank <= bound_to:
                continue
            while True:
                name = names[order[rank]]
                desc = self._check(name)[0]
                for item in binder.add(desc, int(self._index.fields["descriptor_offset"][order[rank]]), name):
                    self._items[item.name] = item
                bound.append(name)
                bound_to = rank
                rank += 1
                if binder.depth == 0 or rank >= count:
                    break
        self._finish_binding(binder, bound)

    def _open_walked(self, view, validate_composites: bool) -> None:
        """Every tensor walked and checked in descriptor order (the reader protocol as written:
        :func:`~hurray_schema.io.file.walk.checked_file`), then the composites bound."""
        found = checked_file(view, self._describe, mode=self.mode, limits=self.limits)
        self.header, self.trailer, self._kv_part = found.header, found.trailer, found.kv
        self._index = FileIndex.of(list(found.entries))
        binder = self._binder(validate_composites)
        for name, (desc, spans, offset, findings) in found.tensors.items():
            self._checked[name] = (desc, spans, findings)
            for item in binder.add(desc, offset, name):
                self._items[item.name] = item
        self._finish_binding(binder, list(found.tensors))

    def _finish_binding(self, binder: CompositeBinder, bound: list) -> None:
        """The binder closed (a composite still open is torn), and which of the ``bound`` entries
        are not top-level items: members of composites, and a torn composite's head."""
        for item in binder.finish():
            self._items[item.name] = item
        items = self._items
        self._members = {name for name in bound if name not in items}

    def _binder(self, validate: bool) -> CompositeBinder:
        return CompositeBinder(mode=self.mode, validate=validate, limits=self.limits, findings=self._bind_findings,
                               leaf=self.tensor_of, assemble=Composite.from_binder)

    def _check(self, name: str) -> tuple:
        """``(descriptor, buffer spans, findings)`` of entry ``name``, its descriptor decoded and
        checked with its placement on first use (:func:`~hurray_schema.io.file.walk.check_tensor`:
        the rule and offset the walk at open, and ``audit``, report)."""
        checked = self._checked.get(name)
        if checked is None:
            index, placement = self._index, self._placement
            i = index.position[name]
            rank = int(placement.rank[i])
            previous = index.names[placement.order[rank - 1]] if rank else None
            part, spans, _ = check_tensor(self._view, index.entry(i), self._describe, self._region,
                                          placement.previous_end(rank), previous)
            checked = self._checked[name] = (part.value, spans, part.findings)
        return checked

    def _check_all(self) -> None:
        """Every tensor checked, in descriptor order (what ``findings`` reports on)."""
        if self._placement is not None and len(self._checked) < len(self._index):
            names = self._index.names
            for i in self._placement.order.tolist():
                self._check(names[i])

    @property
    def findings(self) -> list[Finding]:
        """What the mode tolerated and the SHOULD-level notes, of the container, descriptor and
        composite rules alike, in ``audit``'s order.  Reading it checks every tensor not read yet
        (raising the first fault, as opening would had every tensor been checked at open); after
        :meth:`close`, what was known then."""
        if self._closed:
            return self._known_findings() if self._index is not None else []
        self._check_all()
        return self._known_findings()

    def _known_findings(self) -> list[Finding]:
        """The findings of the sections, of every tensor checked so far (descriptor order) and of
        the composites."""
        found = list(self._kv_part.findings)
        checked = self._checked
        if self._placement is not None:
            names = self._index.names
            sequence = (names[i] for i in self._placement.order.tolist() if names[i] in checked)
        else:
            sequence = iter(checked)
        for name in sequence:
            found.extend(checked[name][2])
        return found + self._bind_findings

    def tensor_of(self, desc: TensorDescriptor, name: str) -> Tensor:
        """The tensor of entry ``name`` with descriptor ``desc``: views of the memory map (knowing
        its file, path and byte ranges, when there is one), or a :class:`SourcedTensor` whose
        buffers are fetched by range."""
        spans = self._check(name)[1]
        if self._reader is not None:
            from ..source import SourcedBuffers

            return SourcedTensor.over(desc, SourcedBuffers(self._reader, spans), name=name)
        view = self._view
        tensor = Tensor(desc, [view[off : off + size] for off, size in spans], name=name)
        if self._abspath is not None:
            tensor._origin = (self._abspath, self.size, tuple(spans))  # buffer_ranges(name)
        return tensor

    # -- mapping -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedFileError(f"{self.path or 'the file'} is closed")

    def __getitem__(self, name: str) -> Item:
        self._check_open()
        item = self._items.get(name)
        if item is None:
            if name not in self._index.position or name in self._members:
                raise KeyError(name)
            item = self._items[name] = self.tensor_of(self._check(name)[0], name)
        return item

    def __iter__(self) -> Iterator[str]:
        self._check_open()
        return iter(self._names)

    def __len__(self) -> int:
        self._check_open()
        return len(self._names)

    def __contains__(self, name) -> bool:
        self._check_open()
        return name in self._index.position and name not in self._members

    def keys(self):
        """The top-level names (tensors and composites, not members), in index order."""
        self._check_open()
        return super().keys()

    def items(self):
        self._check_open()
        return super().items()

    def values(self):
        self._check_open()
        return super().values()

    def entries(self) -> tuple[IndexEntry, ...]:
        """Every index entry, in index order (composite heads and members included)."""
        self._check_open()
        return tuple(self._index.entries())

    def descriptor(self, name: str) -> TensorDescriptor:
        """The descriptor of any index entry (members included)."""
        self._check_open()
        return self._check(name)[0]

    def tensor(self, name: str) -> Tensor:
        """Deprecated: :meth:`get_item` (any item, members included)."""
        deprecated("HurrayFile.tensor(name) is now HurrayFile.get_item(name)")
        self._check_open()
        return self.tensor_of(self._check(name)[0], name)

    @property
    def kv(self) -> dict:
        """The decoded KV section (``file-format.md § KV Metadata Section``); empty when there is none."""
        self._check_open()
        return self._kv_part.value

    def metadata(self) -> dict:
        """A copy of the KV section as a dict (what ``save(..., metadata=)`` wrote)."""
        return dict(self.kv)

    def get_item(self, name: str) -> Item:
        """The tensor or composite called ``name``: a top-level one or a member at any depth."""
        self._check_open()
        if name in self:
            return self[name]
        if self._by_name is None:  # members, reached through their composites
            self._by_name = {node_name: node for top, item in self._items.items() if isinstance(item, Composite)
                             for node_name, node in walk(item, top) if node_name is not None}
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def get_tensor(self, name: str, *, limits: Optional[Limits] = None):
        """Deprecated: ``np.asarray(f.get_item(name))`` (or the item's ``to_numpy`` / ``materialize``)."""
        deprecated("HurrayFile.get_tensor(name) is now np.asarray(HurrayFile.get_item(name))")
        return item_array(self.get_item(name), limits=limits)

    def get_slice(self, name: str) -> TensorSlice:
        """Deprecated: ``f.get_item(name)[index]`` reads only what the index needs."""
        deprecated("HurrayFile.get_slice(name)[index] is now HurrayFile.get_item(name)[index]")
        return TensorSlice(self.get_item(name))

    @property
    def data_buffer_alignment(self) -> int:
        self._check_open()
        return self.header["data_buffer_alignment"]

    @property
    def file_flags(self) -> FileFlag:
        self._check_open()
        return FileFlag(self.header["file_flags"])

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        """The OS file descriptor of a local file, mapped or not (as a file object's ``fileno()``: for
        ``sendfile``, ``os.pread``); valid until :meth:`close`.  A file read from a URL or from bytes has none."""
        self._check_open()
        if self._fd is not None:
            return self._fd
        if self._local_source is not None:
            return self._local_source.fileno()
        raise io.UnsupportedOperation("fileno: the file was not opened from a local path")

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Release the file.  The map itself is released once no tensor view is alive; a file read with
        ``mmap=False`` closes its descriptor (its items then read only the bytes they fetched already).
        Later accesses raise :class:`ClosedFileError`; closing again does nothing."""
        self._closed = True
        self._items = {}
        self._by_name = None
        view, self._view = getattr(self, "_view", None), None
        if isinstance(view, memoryview):
            try:
                view.release()
            except BufferError:
                pass
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views handed out are still alive; the GC closes the map
                pass
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._close_local_source()

    def _close_local_source(self) -> None:
        """The descriptor of a file read with ``mmap=False`` closed, and its reader no longer this
        process's reader of the file (an item unpickled later opens the file again)."""
        local, self._local_source = self._local_source, None
        if local is None:
            return
        if self._reader is not None:
            from ..source import unregister

            unregister(self._reader)
        local.close()

    def __enter__(self) -> "HurrayFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"HurrayFile({self.path!r}, closed)"
        return f"HurrayFile({self.path!r}, {len(self._names)} items, {len(self._index)} index entries)"

    def buffer_ranges(self, name: str) -> tuple[tuple[int, int], ...]:
        """``(file offset, byte size)`` of each buffer of the non-head entry ``name``."""
        return tuple((int(offset), int(size)) for offset, size in self._check(name)[1])

    def shard(self, name: str, *, rank, of, dim=0, limits: Optional[Limits] = None):
        """The array of the box rank ``rank`` of ``of`` reads of item ``name`` (a top-level item or a
        member), cut along ``dim`` by :func:`numpy.array_split`'s rule (:mod:`..shards`): of a
        partition, only the members that meet the box are read, each over its part of the box
        (their descriptors were read at open); of a tensor or an overlay, the box as their
        :meth:`~..tensor.Tensor.read` reads it.  The same for a local file, mapped or not, and a
        URL (its byte ranges fetched: :attr:`bytes_fetched`).  A group has no one array:
        :class:`~hurray_schema.errors.NotAnArray` naming its members; a name the file lacks
        :class:`~hurray_schema.errors.NoSuchItem`; a bad rank, count or dimension
        :class:`~hurray_schema.errors.IndexRangeError` / ``IndexTypeError``."""
        return self._array_item(name).shard(rank=rank, of=of, dim=dim, limits=limits)

    def shard_box(self, name: str, *, rank, of, dim=0):
        """The :class:`~..shards.ShardBox` (``offset``, ``shape``) :meth:`shard` reads; nothing is read."""
        return self._array_item(name).shard_box(rank=rank, of=of, dim=dim)

    def _array_item(self, name: str) -> Item:
        """Item ``name`` (any entry), which must have one array: NoSuchItem when the file has no entry
        by that name, NotAnArray naming the members of a group."""
        try:
            item = self.get_item(name)
        except KeyError:
            raise NoSuchItem(f"{self.path or 'the file'} has no tensor, composite or member named {name!r}") from None
        if isinstance(item, Composite) and item.rule == CompositionRule.GROUP:
            members = ", ".join(repr(member.name) for member in item.members)
            raise NotAnArray(f"{name!r} is a group, not one array; read its members one by one: {members}")
        return item

    def to_dask(self, name: str, chunks=None, *, chunk_bytes=None, limits=None):
        """Item ``name`` (or any member entry) as a lazy ``dask.array.Array`` (a tuple for a
        group; the ``[dask]`` extra) whose tasks map this file by path and read their buffers'
        byte ranges: the graph holds descriptors and offsets, no data
        (:func:`hurray_schema.evaluate.dask_graph.to_dask`); for a URL (or a path read with
        ``mmap=False``), tasks that fetch their own byte ranges (:class:`~.source.RemoteBuffers`).
        ``f[name].to_dask()`` is the same graph.  A partition without ``chunks=`` or
        ``chunk_bytes=`` is chunked along its members: one chunk per member where the members
        form a grid; otherwise at every member edge, each chunk inside one member (a member
        spanning several cells is read as several chunks)."""
        from ...evaluate.dask_graph import to_dask

        item = self[name] if name in self else self.tensor_of(self.descriptor(name), name)
        return to_dask(item, chunks, chunk_bytes=chunk_bytes, limits=limits, locate=locate_buffers)


def item_array(item: Item, *, limits: Optional[Limits] = None):
    """The array of a tensor (``to_numpy``), a partition or an overlay (``materialize``);
    a group, which has no single array, raises :class:`HurraySchemaError` naming its members."""
    if isinstance(item, Composite):
        if item.rule == CompositionRule.GROUP:
            members = ", ".join(repr(member.name) for member in item.members)
            raise HurraySchemaError(f"{item.name!r} is a group, not one array; read its members: {members}")
        return item.materialize(limits=limits)
    return item.to_numpy(limits=limits)


def _map_file(path: str) -> tuple[int, Optional[_mmap.mmap]]:
    """The OS file descriptor of the file at ``path``, opened for reading, and a read-only memory
    map of the whole file (None for an empty file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        return fd, (_mmap.mmap(fd, 0, access=_mmap.ACCESS_READ) if status.st_size else None)
    except BaseException:
        os.close(fd)
        raise


def read_file(path, *, mode="strict", limits: Optional[Limits] = None, validate_composites: bool = True,
              storage_options: Optional[dict] = None, block_size: Optional[int] = None,
              cache_bytes: Optional[int] = None, timeout: Optional[float] = None, mmap: bool = True) -> HurrayFile:
    """Open a ``.hrry`` file: checks the container and every descriptor, reads no data.

    ``path``: a local path, a URL (``https://...``, ``s3://bucket/key``, any fsspec protocol; the
    ``[remote]`` extra) with fsspec's ``storage_options``, or an open fsspec file.  A URL is read
    by byte range (:mod:`hurray_schema.io.source`): opening fetches the tail of the file (trailer,
    index, KV section) and then the header and descriptors; buffers are fetched when a read needs
    them, only the ranges it decodes.  ``block_size`` and ``cache_bytes`` size the reader's block
    cache, ``timeout`` bounds each connection and read (seconds).

    ``mmap`` (a local path): True maps the file, and its tensors' buffers are views of the map -- a
    file cut short under them kills the process with ``SIGBUS`` when those pages are touched;
    False reads it by range like a URL, by ``os.pread`` into the reader's own memory
    (:class:`~hurray_schema.io.source.LocalFileSource`, no fsspec), and a file cut short or changed
    since it was opened raises :class:`~hurray_schema.errors.ShortRead` or
    :class:`~hurray_schema.errors.SourceChanged`.  A URL is never mapped.

    ``limits`` (:class:`~hurray_schema.limits.Limits`) bounds the index, the KV section,
    descriptors and composite nesting; ``validate_composites=False`` skips the composite
    rules (binding still happens)."""
    return HurrayFile(path, mode=mode, limits=limits, validate_composites=validate_composites,
                      storage_options=storage_options, block_size=block_size, cache_bytes=cache_bytes,
                      timeout=timeout, mmap=mmap)
