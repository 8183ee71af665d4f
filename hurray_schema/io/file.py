"""Read and write ``.hrry`` files (``file-format.md``).

Reading follows the random-access protocol (``§ Reader Protocol``): header, trailer,
index (CRC-checked), KV, then every descriptor -- but no data.  The file is memory-
mapped; a tensor's buffers are ``memoryview`` slices of the map, so bytes are paged in
only when used.  Composite membership is recovered from descriptor-offset order
(``§ Composite Tensors``) whether or not the index is sorted.

Writing is one forward pass (``§ Writer Protocol``): header, tensors (descriptor 8-aligned,
data buffers aligned to ``data_buffer_alignment``, no padding after a composite head),
KV section, index, CRC-32C of the index, trailer -- into a temporary file renamed over
the target once complete, after every tensor passed the strict reader's rules
(:mod:`hurray_schema.io._write`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, Optional, Union

import attrs
import crc32c as _crc32c

from ..codec import parse_descriptor, peek_descriptor_length
from ..errors import HurraySchemaError
from ..limits import Limits, resolve_limits
from ..model import TensorDescriptor
from ..rules import container as C
from ..rules.composite import CompositeBinder
from ..rules.descriptor import first_error
from ..rules.engine import Finding, as_mode
from ..structs._declare import plan, static_offset
from ..structs.descriptor import FIXED_HEADER_SIZE
from ..structs.file import (
    DESCRIPTOR_ALIGNMENT, FILE_HEADER, FILE_HEADER_SIZE, FILE_MAGIC, INDEX_COUNT, INDEX_ENTRY_FIELDS,
    INDEX_NAME_LENGTH, KNOWN_FILE_FLAGS, MAX_DATA_BUFFER_ALIGNMENT, MIN_DATA_BUFFER_ALIGNMENT, SECTION_ALIGNMENT,
    SUPPORTED_CONTAINER_MAJOR, SUPPORTED_CONTAINER_MINOR, TRAILER, TRAILER_MAGIC, TRAILER_SIZE, FileFlag,
)
from ._write import EncodedNode, Sink, check_nodes, encode_nodes, replacing
from .kv import decode_kv, encode_kv
from .tensor import Composite, Item, Tensor, walk

__all__ = ["HurrayFile", "IndexEntry", "read_file", "write_file"]

_HEADER = plan(FILE_HEADER)
_TRAILER = plan(TRAILER)
_COUNT = plan(INDEX_COUNT)
_NAME_LEN = plan(INDEX_NAME_LENGTH)
_ENTRY = plan(INDEX_ENTRY_FIELDS)
_MIN_ENTRY = _NAME_LEN.fixed_size + 1 + _ENTRY.fixed_size
_H = {name: static_offset(FILE_HEADER, name) for name in (
    "container_version_major", "_reserved", "file_flags", "data_buffer_alignment", "first_descriptor_offset",
    "_reserved_header")}
_T = {name: static_offset(TRAILER, name) for name in (
    "index_offset", "index_length", "kv_offset", "kv_length", "index_crc32c", "_reserved", "trailer_magic")}
_E = {name: static_offset(INDEX_ENTRY_FIELDS, name) for name in (
    "descriptor_offset", "descriptor_length", "data_offset", "data_length", "flags")}


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def buffer_spans(desc: TensorDescriptor, data_offset: int, alignment: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each data buffer of ``desc`` placed from ``data_offset``:
    the first at ``data_offset``, each next one at the following alignment boundary."""
    spans, pos = [], data_offset
    for i, handle in enumerate(desc.buffers):
        if i:
            pos = _align(pos, alignment)
        spans.append((pos, handle.byte_size))
        pos += handle.byte_size
    return spans


@attrs.frozen(slots=True)
class IndexEntry:
    """One index entry (``file-format.md § Index Encoding``), plus where it sits."""

    name: str
    descriptor_offset: int
    descriptor_length: int
    data_offset: int
    data_length: int
    flags: int = 0
    entry_offset: int = attrs.field(default=0, eq=False, repr=False)
    """Absolute offset of the entry's name_length field inside the index."""


# --------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------


class HurrayFile(Mapping):
    """A read-only mapping ``name -> Tensor | Composite`` over a ``.hrry`` file.

    Composite members are reachable through their composite (and by
    :meth:`tensor`), not as keys.  ``entries()`` lists every index entry.  ``kv`` is the
    decoded KV section; ``findings`` what the mode tolerated plus SHOULD-level notes.
    """

    def __init__(self, path, *, mode="strict", limits: Optional[Limits] = None, validate_composites: bool = True):
        self.path = os.fspath(path)
        self.mode = as_mode(mode)
        self.limits = resolve_limits(limits)
        self.findings: list[Finding] = []
        self._file = open(self.path, "rb")
        self._map: Optional[mmap.mmap] = None
        try:
            self._open(validate_composites)
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------------
    def _open(self, validate_composites: bool) -> None:
        size = os.fstat(self._file.fileno()).st_size
        self.size = size
        head = self._file.read(FILE_HEADER_SIZE)
        if len(head) >= len(FILE_MAGIC) and head[: len(FILE_MAGIC)] != FILE_MAGIC:
            raise C.FILE_MAGIC.violation(f"the file starts with {head[:len(FILE_MAGIC)]!r}, not {FILE_MAGIC!r}", 0)
        if size < FILE_HEADER_SIZE + TRAILER_SIZE:
            raise C.FILE_TOO_SHORT.violation(
                f"{size} bytes cannot hold the {FILE_HEADER_SIZE}-byte header and {TRAILER_SIZE}-byte trailer", size)
        self._map = mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(mm)
        h, _ = _HEADER.unpack(mm, 0)
        self.header = h
        self._check_header(h, size)
        t, _ = _TRAILER.unpack(mm, size - TRAILER_SIZE)
        self.trailer = t
        self._check_trailer(h, t, size)
        self._entries = self._read_index(h, t)
        self.kv = self._read_kv(h, t)
        region_end = min(t["index_offset"], t["kv_offset"] if t["kv_length"] else t["index_offset"])
        self._descriptors: dict[str, TensorDescriptor] = {}
        self._spans: dict[str, list] = {}
        ordered = sorted(self._entries, key=lambda e: e.descriptor_offset)
        self._check_tensors(ordered, h["first_descriptor_offset"], region_end)
        self._bind(ordered, validate_composites)

    def _check_header(self, h: dict, size: int) -> None:
        if h["container_version_major"] > SUPPORTED_CONTAINER_MAJOR:
            raise C.FILE_VERSION.violation(
                f"container_version_major {h['container_version_major']} is newer than {SUPPORTED_CONTAINER_MAJOR}",
                _H["container_version_major"])
        for name in ("_reserved", "_reserved_header"):
            if any(h[name]):
                raise C.FILE_HEADER_RESERVED.violation(f"header field {name} is not zero", _H[name])
        flags = h["file_flags"]
        if flags & ~KNOWN_FILE_FLAGS:
            raise C.FILE_FLAGS_RESERVED.violation(
                f"reserved file_flags bits 0x{flags & ~KNOWN_FILE_FLAGS:08X} are set", _H["file_flags"])
        a = h["data_buffer_alignment"]
        if a & (a - 1) or not MIN_DATA_BUFFER_ALIGNMENT <= a <= MAX_DATA_BUFFER_ALIGNMENT:
            raise C.FILE_ALIGNMENT.violation(
                f"data_buffer_alignment {a} is not a power of two in [{MIN_DATA_BUFFER_ALIGNMENT}, "
                f"{MAX_DATA_BUFFER_ALIGNMENT}]", _H["data_buffer_alignment"])
        first = h["first_descriptor_offset"]
        if first < FILE_HEADER_SIZE or first % DESCRIPTOR_ALIGNMENT or first > size - TRAILER_SIZE:
            raise C.FILE_FIRST_DESCRIPTOR.violation(
                f"first_descriptor_offset {first} is not an 8-aligned offset in [64, {size - TRAILER_SIZE}]",
                _H["first_descriptor_offset"])

    def _check_trailer(self, h: dict, t: dict, size: int) -> None:
        base = size - TRAILER_SIZE
        if t["trailer_magic"] != TRAILER_MAGIC:
            raise C.TRAILER_MAGIC.violation(
                f"trailer_magic is {t['trailer_magic']!r}, not {TRAILER_MAGIC!r}", base + _T["trailer_magic"])
        if any(t["_reserved"]):
            raise C.TRAILER_RESERVED.violation("trailer _reserved is not zero", base + _T["_reserved"])
        io_, il = t["index_offset"], t["index_length"]
        if io_ < FILE_HEADER_SIZE or io_ + il > base or il < _COUNT.fixed_size:
            raise C.INDEX_BOUNDS.violation(
                f"index at {io_} length {il} is not between the header and the trailer at {base}",
                base + _T["index_offset"])
        if io_ % SECTION_ALIGNMENT:
            raise C.INDEX_ALIGNMENT.violation(f"index_offset {io_} is not a multiple of 8", base + _T["index_offset"])
        self.limits.check("max_index_bytes", il, base + _T["index_length"])
        crc = t["index_crc32c"]
        if h["file_flags"] & FileFlag.HAS_INDEX_CRC32C:
            actual = _crc32c.crc32c(self._view[io_ : io_ + il])
            if actual != crc:
                raise C.INDEX_CRC.violation(
                    f"index_crc32c is 0x{crc:08X}, the index bytes give 0x{actual:08X}", base + _T["index_crc32c"])
        elif crc:
            raise C.INDEX_CRC_UNSET.violation(
                f"index_crc32c is 0x{crc:08X} although HAS_INDEX_CRC32C is clear", base + _T["index_crc32c"])

    def _read_index(self, h: dict, t: dict) -> list[IndexEntry]:
        io_, il = t["index_offset"], t["index_length"]
        view, end = self._view, io_ + il
        count = _COUNT.unpack(view, io_)[0]["index_entry_count"]
        pos = io_ + _COUNT.fixed_size
        if count * _MIN_ENTRY > end - pos:
            raise C.INDEX_TRUNCATED.violation(
                f"index_entry_count {count} cannot fit in the {end - pos} bytes of index that follow", io_)
        self.limits.check("max_index_entries", count, io_)
        entries, seen = [], set()
        for _ in range(count):
            at = pos
            if pos + _NAME_LEN.fixed_size > end:
                raise C.INDEX_TRUNCATED.violation("an index entry runs past index_length", pos)
            n = _NAME_LEN.unpack(view, pos)[0]["name_length"]
            pos += _NAME_LEN.fixed_size
            if pos + n + _ENTRY.fixed_size > end:
                raise C.INDEX_TRUNCATED.violation("an index entry runs past index_length", at)
            raw = bytes(view[pos : pos + n])
            pos += n
            if not raw:
                raise C.INDEX_NAME.violation("name_length is 0", at)
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise C.INDEX_NAME.violation(f"tensor name is not valid UTF-8 ({exc.reason})", at + _NAME_LEN.fixed_size) from None
            if raw in seen:
                raise C.INDEX_DUPLICATE.violation(f"tensor name {name!r} appears twice in the index", at)
            seen.add(raw)
            f, pos = _ENTRY.unpack(view, pos)
            if f["flags"]:
                raise C.INDEX_FLAGS.violation(
                    f"entry {name!r} has flags 0x{f['flags']:08X}", at + _NAME_LEN.fixed_size + n + _E["flags"])
            entries.append(IndexEntry(name, f["descriptor_offset"], f["descriptor_length"], f["data_offset"],
                                      f["data_length"], f["flags"], at))
        if pos != end:
            raise C.INDEX_TRUNCATED.violation(
                f"{end - pos} bytes follow the last of the {count} index entries inside index_length", pos)
        if h["file_flags"] & FileFlag.SORTED_INDEX:
            for prev, nxt in zip(entries, entries[1:]):
                if prev.name.encode("utf-8") > nxt.name.encode("utf-8"):
                    raise C.INDEX_SORTED.violation(
                        f"SORTED_INDEX is set but {prev.name!r} comes before {nxt.name!r}", nxt.entry_offset)
        return entries

    def _read_kv(self, h: dict, t: dict) -> dict:
        ko, kl = t["kv_offset"], t["kv_length"]
        base = self.size - TRAILER_SIZE
        has_flag = bool(h["file_flags"] & FileFlag.HAS_KV_METADATA)
        if has_flag != bool(kl):
            self.findings.append(C.KV_FLAG.finding(
                f"HAS_KV_METADATA is {'set' if has_flag else 'clear'} but kv_length is {kl}",
                _H["file_flags"], self.mode))
        if not kl:
            return {}
        if ko < FILE_HEADER_SIZE or ko % SECTION_ALIGNMENT or ko + kl > t["index_offset"]:
            raise C.KV_BOUNDS.violation(
                f"KV section at {ko} length {kl} is not an 8-aligned range between the header and the index",
                base + _T["kv_offset"])
        self.limits.check("max_kv_bytes", kl, base + _T["kv_length"])
        return decode_kv(self._view[ko : ko + kl], ko, self.limits)

    def _check_tensors(self, ordered: list[IndexEntry], first: int, region_end: int) -> None:
        view, a = self._view, self.header["data_buffer_alignment"]
        previous_end, previous = first, None
        for e in ordered:
            at = e.entry_offset + 2 + len(e.name.encode("utf-8"))
            off = e.descriptor_offset
            if off % DESCRIPTOR_ALIGNMENT:
                raise C.DESCRIPTOR_ALIGNMENT.violation(
                    f"descriptor of {e.name!r} at {off} is not 8-aligned", at + _E["descriptor_offset"])
            if off < first or off + FIXED_HEADER_SIZE > region_end:
                raise C.INDEX_DESCRIPTOR_BOUNDS.violation(
                    f"descriptor of {e.name!r} at {off} is outside the tensor region [{first}, {region_end})",
                    at + _E["descriptor_offset"])
            if off < previous_end:
                raise C.INDEX_OVERLAP.violation(
                    f"descriptor of {e.name!r} at {off} lies inside the tensor {previous!r} (which ends at "
                    f"{previous_end})", at + _E["descriptor_offset"])
            length = peek_descriptor_length(view[off : off + FIXED_HEADER_SIZE], off)
            if length != e.descriptor_length:
                raise C.INDEX_DESCRIPTOR_LENGTH.violation(
                    f"index says descriptor_length {e.descriptor_length} for {e.name!r}, the descriptor says {length}",
                    at + _E["descriptor_length"])
            if off + length > region_end:
                raise C.INDEX_DESCRIPTOR_BOUNDS.violation(
                    f"descriptor of {e.name!r} ({length} bytes at {off}) runs past the tensor region end {region_end}",
                    at + _E["descriptor_offset"])
            desc, findings = parse_descriptor(view[off : off + length], mode=self.mode, base=off, limits=self.limits)
            self.findings.extend(findings)
            error = first_error(desc, self.mode, base=off)
            if error is not None:
                raise error.to_violation()
            end = off + length
            if desc.buffers:
                if e.data_offset % a:
                    raise C.DATA_ALIGNMENT.violation(
                        f"data of {e.name!r} at {e.data_offset} is not a multiple of data_buffer_alignment {a}",
                        at + _E["data_offset"])
                if e.data_offset < end:
                    raise C.INDEX_OVERLAP.violation(
                        f"data of {e.name!r} at {e.data_offset} starts inside its descriptor (ends at {end})",
                        at + _E["data_offset"])
                spans = buffer_spans(desc, e.data_offset, a)
                last, size = spans[-1]
                if e.data_length != last + size - e.data_offset:
                    raise C.DATA_LENGTH.violation(
                        f"data_length of {e.name!r} is {e.data_length}, its buffers span {last + size - e.data_offset}",
                        at + _E["data_length"])
                if last + size > region_end:
                    raise C.DATA_BOUNDS.violation(
                        f"buffers of {e.name!r} end at {last + size}, past the tensor region end {region_end} "
                        "(truncated data)", at + _E["data_length"])
                end = max(end, last + size)
                self._spans[e.name] = spans
            else:
                if e.data_length:
                    raise C.DATA_LENGTH.violation(
                        f"{e.name!r} has no buffers but data_length {e.data_length}", at + _E["data_length"])
                self._spans[e.name] = []
                if end <= e.data_offset <= region_end:
                    end = max(end, e.data_offset)  # a writer that padded after the head (the reference)
            self._descriptors[e.name] = desc
            previous_end, previous = end, e.name

    def _bind(self, ordered: list[IndexEntry], validate: bool) -> None:
        binder = CompositeBinder(mode=self.mode, validate=validate, limits=self.limits, findings=self.findings,
                                 leaf=lambda desc, name: Tensor(desc, self._buffers(name), name=name),
                                 assemble=Composite.from_binder)
        self._items: dict[str, Item] = {}
        for e in ordered:
            for item in binder.add(self._descriptors[e.name], e.descriptor_offset, e.name):
                self._items[item.name] = item
        for item in binder.finish():
            self._items[item.name] = item
        order = {e.name: i for i, e in enumerate(self._entries)}
        self._names = sorted(self._items, key=order.__getitem__)

    def _buffers(self, name: str) -> list:
        view = self._view
        return [view[off : off + size] for off, size in self._spans[name]]

    # -- mapping -------------------------------------------------------------------
    def __getitem__(self, name: str) -> Item:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._items

    def entries(self) -> tuple[IndexEntry, ...]:
        """Every index entry, in index order (composite heads and members included)."""
        return tuple(self._entries)

    def descriptor(self, name: str) -> TensorDescriptor:
        """The descriptor of any index entry (members included)."""
        return self._descriptors[name]

    def tensor(self, name: str) -> Tensor:
        """Any non-head entry as a :class:`Tensor` (members included)."""
        return Tensor(self._descriptors[name], self._buffers(name), name=name)

    @property
    def data_buffer_alignment(self) -> int:
        return self.header["data_buffer_alignment"]

    @property
    def file_flags(self) -> FileFlag:
        return FileFlag(self.header["file_flags"])

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Release the file.  The map itself is released once no tensor view is alive."""
        self._items = {}
        view, self._view = getattr(self, "_view", None), None
        if view is not None:
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
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "HurrayFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HurrayFile({self.path!r}, {len(self._names)} items, {len(self._entries)} index entries)"


def read_file(path, *, mode="strict", limits: Optional[Limits] = None,
              validate_composites: bool = True) -> HurrayFile:
    """Open a ``.hrry`` file: checks the container and every descriptor, reads no data.

    ``limits`` (:class:`~hurray_schema.limits.Limits`) bounds the index, the KV section,
    descriptors and composite nesting; ``validate_composites=False`` skips the composite
    rules (binding still happens)."""
    return HurrayFile(path, mode=mode, limits=limits, validate_composites=validate_composites)


# --------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------


def _named_items(items) -> list[tuple[str, Item]]:
    if isinstance(items, Mapping):
        pairs = [(name, item) for name, item in items.items()]
    else:
        if isinstance(items, (Tensor, Composite)):
            items = (items,)
        pairs = [(item.name, item) for item in items]
    for name, item in pairs:
        if not isinstance(item, (Tensor, Composite)):
            raise HurraySchemaError(f"{name!r}: {type(item).__name__} is neither a Tensor nor a Composite")
        if not name:
            raise HurraySchemaError(f"{item!r} has no name; a file needs one for every tensor")
    return pairs


def _file_nodes(items) -> list[tuple[str, Item]]:
    """Every tensor of the file in pre-order, named, each name used once."""
    nodes: list[tuple[str, Item]] = []
    seen: set[str] = set()
    for name, item in _named_items(items):
        for node_name, node in walk(item, name):
            if node_name in seen:
                raise HurraySchemaError(f"tensor name {node_name!r} is used twice")
            if not node_name.encode("utf-8") or len(node_name.encode("utf-8")) > 0xFFFF:
                raise HurraySchemaError(f"tensor name {node_name!r} must be 1 to 65535 UTF-8 bytes")
            seen.add(node_name)
            nodes.append((node_name, node))
    return nodes


def _write_body(out: Sink, encoded: list[EncodedNode], flags: FileFlag, alignment: int, pad_after_head: bool,
                kv_bytes: bytes, sorted_index: bool) -> list[IndexEntry]:
    """Header, tensors, KV section, index and trailer (``file-format.md § Writer
    Protocol``) into ``out``; the index entries in index order.  A :class:`Sink` without
    a file lays the same file out without writing it."""
    out.write(_HEADER.pack(
        magic=FILE_MAGIC, container_version_major=SUPPORTED_CONTAINER_MAJOR,
        container_version_minor=SUPPORTED_CONTAINER_MINOR, _reserved=bytes(2), file_flags=int(flags),
        data_buffer_alignment=alignment, first_descriptor_offset=FILE_HEADER_SIZE, tensor_count_hint=len(encoded),
        _reserved_header=bytes(28)))
    entries: list[IndexEntry] = []
    for item in encoded:
        out.pad(DESCRIPTOR_ALIGNMENT)
        desc_off = out.pos
        out.write(item.descriptor)
        if item.node.descriptor.buffers or pad_after_head:
            out.pad(alignment)  # an empty tensor still has one (0-byte) buffer to align
        data_off = out.pos
        for i, b in enumerate(item.buffers):
            if i:
                out.pad(alignment)
            out.write(b)
        entries.append(IndexEntry(item.name, desc_off, len(item.descriptor), data_off, out.pos - data_off))
    kv_off = 0
    if kv_bytes:
        out.pad(SECTION_ALIGNMENT)
        kv_off = out.pos
        out.write(kv_bytes)
    out.pad(SECTION_ALIGNMENT)
    index_off = out.pos
    ordered = sorted(entries, key=lambda e: e.name.encode("utf-8")) if sorted_index else entries
    index = _COUNT.pack(index_entry_count=len(ordered)) + b"".join(
        _NAME_LEN.pack(name_length=len(e.name.encode("utf-8"))) + e.name.encode("utf-8")
        + _ENTRY.pack(descriptor_offset=e.descriptor_offset, descriptor_length=e.descriptor_length,
                      data_offset=e.data_offset, data_length=e.data_length, flags=0)
        for e in ordered)
    out.write(index)
    out.write(_TRAILER.pack(
        index_offset=index_off, index_length=len(index), kv_offset=kv_off, kv_length=len(kv_bytes),
        index_crc32c=_crc32c.crc32c(index), _reserved=bytes(4), trailer_magic=TRAILER_MAGIC))
    return ordered


def write_file(path, items: Union[Mapping[str, Item], Iterable[Item]], *, kv: Optional[Mapping[str, Any]] = None,
               sorted_index: bool = False, data_buffer_alignment: int = MIN_DATA_BUFFER_ALIGNMENT,
               pad_after_composite_head: bool = False, validate: bool = True) -> list[IndexEntry]:
    """Write a ``.hrry`` file in one forward pass and return its index entries.

    ``items`` maps names to tensors and composites (or is an iterable of named ones);
    composite members are written after their head, named ``<name>.<i>`` unless they
    carry a name.

    Nothing is lost: the file is written to a temporary file beside ``path``, flushed,
    fsynced and renamed over ``path``; on any error the previous file is untouched and
    the temporary file is removed.  Tensors read from ``path`` itself (memory-mapped) may
    be written back to it.

    Nothing invalid is written: before the first byte, every descriptor must decode and
    pass the strict reader's rules and every composite ``layouts/composite.md
    § Validation``; the first fault raises the :class:`~hurray_schema.errors.SpecViolation`
    :func:`read_file` would raise for it (same rule id), at the byte offset it would have
    in the file.  Buffers that do not match their handles raise
    :class:`~hurray_schema.errors.EncodeError`, values that do not fit their wire field
    :class:`~hurray_schema.errors.FieldRangeError` (also with ``validate=False``).
    ``validate=False`` skips the rules and the buffer check: it exists to produce faulty
    test inputs.  ``pad_after_composite_head=True`` reproduces the reference writer's
    padding after a head, which the spec forbids -- only for interop experiments.
    """
    a = data_buffer_alignment
    if a & (a - 1) or not MIN_DATA_BUFFER_ALIGNMENT <= a <= MAX_DATA_BUFFER_ALIGNMENT:
        raise HurraySchemaError(f"data_buffer_alignment {a} is not a power of two in [4096, 2 MiB]")
    nodes = _file_nodes(items)
    kv_bytes = encode_kv(kv) if kv else b""
    if len(kv_bytes) > 0xFFFF_FFFF:
        raise HurraySchemaError("the KV section exceeds the 4 GiB kv_length can express")
    flags = FileFlag.HAS_INDEX_CRC32C
    if kv_bytes:
        flags |= FileFlag.HAS_KV_METADATA
    if sorted_index:
        flags |= FileFlag.SORTED_INDEX
    encoded = list(encode_nodes(nodes, validate))
    layout = (encoded, flags, a, pad_after_composite_head, kv_bytes, sorted_index)
    if validate:
        placed = {e.name: e.descriptor_offset for e in _write_body(Sink(), *layout)}
        check_nodes(encoded, [placed[item.name] for item in encoded], descriptors_first=True)
    with replacing(path) as f:
        return _write_body(Sink(f), *layout)
