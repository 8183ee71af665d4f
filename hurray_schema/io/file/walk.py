"""The walk of a ``.hrry`` file (``file-format.md``): its front -- file header, trailer, index,
KV section -- then each tensor in descriptor order, its descriptor and then its data.

One walk serves every reader of a file, in the order of the reader protocol (``§ Reader
Protocol``); the fault policy chooses its two steps:

* **the front** -- ``RAISE`` (the file reader) checks every container rule of the header, the
  trailer with the index CRC (:func:`check_ends`), each index entry (:func:`check_index`) and
  the KV section (:func:`check_kv`), the first fault raising, and yields those parts first;
  ``COLLECT`` and ``ANNOTATE`` (audit, the annotated view) only locate: the index as far as it
  can be read (:func:`walk_index`), else the tensor region walked from
  ``first_descriptor_offset``; their parts follow the tensors, where the sections sit;
* **each tensor** -- ``RAISE`` checks its placement against its index entry and the tensor
  before it, its descriptor and its data (:func:`check_tensor`, which the reader also runs on
  a tensor's first read); the other policies yield an ``entry`` part, the descriptor part at its
  composite nesting depth and the ``tensor data`` part, a ``fault`` part where an entry points
  past the end of the file.
"""

from __future__ import annotations

import struct
from typing import Iterator, Optional

import attrs

from ...codec import parse_descriptor, peek_descriptor_length
from ...errors import HurraySchemaError
from ...limits import DEFAULT_LIMITS, Limits
from ...model import TensorDescriptor
from ...rules import container as container_rules
from ...rules.engine import Mode
from ...structs._declare import plan, power_of_two, static_offset
from ...structs.descriptor import FIXED_HEADER_SIZE
from ...structs.descriptor import MAGIC as DESCRIPTOR_MAGIC
from ...structs.file import (
    DESCRIPTOR_ALIGNMENT, FILE_HEADER, FILE_HEADER_SIZE, FILE_MAGIC, INDEX_COUNT, INDEX_ENTRY_FIELDS,
    INDEX_NAME_LENGTH, KNOWN_FILE_FLAGS, KV_COUNT, MAX_DATA_BUFFER_ALIGNMENT, MIN_DATA_BUFFER_ALIGNMENT,
    SECTION_ALIGNMENT, SUPPORTED_CONTAINER_MAJOR, TRAILER, TRAILER_MAGIC, TRAILER_SIZE, FileFlag,
)
from ..crc import crc32c
from ..walk.kv import decode_kv
from ..walk.common import (
    DESCRIPTOR, ENTRY, ENTRY_START, FAULT, NAME, TABLE, Describe, Faults, Nesting, Part, part_from_fields,
)

__all__ = ["walk_file", "walk_index", "check_ends", "check_index", "check_kv", "check_tensor", "buffer_spans",
           "check_data_buffer_alignment", "CheckedFile", "checked_file",
           "IndexEntry", "TensorRegion", "FILE_HEADER_PART", "TRAILER_PART", "INDEX_PART", "KV_PART", "TENSOR_DATA"]

FILE_HEADER_PART = "file header"
TRAILER_PART = "trailer"
INDEX_PART = "index"
KV_PART = "kv"
TENSOR_DATA = "tensor data"

_HEADER = plan(FILE_HEADER)
_TRAILER = plan(TRAILER)
COUNT_PLAN = plan(INDEX_COUNT)
NAME_LENGTH_PLAN = plan(INDEX_NAME_LENGTH)
ENTRY_PLAN = plan(INDEX_ENTRY_FIELDS)
MIN_ENTRY_SIZE = NAME_LENGTH_PLAN.fixed_size + 1 + ENTRY_PLAN.fixed_size
"""The smallest index entry: its ``name_length``, a one-byte name and the entry fields."""
NAME_LENGTH_CODEC = NAME_LENGTH_PLAN.steps[0].codec
_ENTRY_FORMAT, _ENTRY_SLOTS = ENTRY_PLAN.flat_layout()
_ENTRY_CODEC = struct.Struct("<" + _ENTRY_FORMAT)
"""The entry fields in one unpack (the reader's index loop); their order is the declaration's."""
assert tuple(name for name, _, _ in _ENTRY_SLOTS) == (
    "descriptor_offset", "descriptor_length", "data_offset", "data_length", "flags"), _ENTRY_SLOTS
_H = {name: static_offset(FILE_HEADER, name) for name in (
    "container_version_major", "_reserved", "file_flags", "data_buffer_alignment", "first_descriptor_offset",
    "_reserved_header")}
_T = {name: static_offset(TRAILER, name) for name in (
    "index_offset", "index_length", "kv_offset", "kv_length", "index_crc32c", "_reserved", "trailer_magic")}
_E = {name: static_offset(INDEX_ENTRY_FIELDS, name) for name in (
    "descriptor_offset", "descriptor_length", "data_offset", "data_length", "flags")}
_UNKNOWN_FILE_FLAGS = ~int(KNOWN_FILE_FLAGS)
_HAS_INDEX_CRC32C = int(FileFlag.HAS_INDEX_CRC32C)
SORTED_INDEX = int(FileFlag.SORTED_INDEX)
"""The file flags as plain ints: ``IntFlag`` arithmetic runs in Python, and a reader tests them on every open."""


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def buffer_spans(desc: TensorDescriptor, data_offset: int, alignment: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each data buffer of ``desc`` placed from ``data_offset``:
    the first at ``data_offset``, each next one at the following alignment boundary
    (``file-format.md § Data Buffer Placement``)."""
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


@attrs.frozen(slots=True)
class TensorRegion:
    """Where a file's tensors may lie (``file-format.md § Descriptor Placement``): from
    ``first_descriptor_offset`` to the first of the KV section and the index, buffers on
    ``data_buffer_alignment`` boundaries."""

    first: int
    end: int
    alignment: int

    @classmethod
    def of(cls, header: dict, trailer: dict) -> "TensorRegion":
        """The region of the file with this header and trailer (fields checked already)."""
        index_at = trailer["index_offset"]
        end = min(index_at, trailer["kv_offset"]) if trailer["kv_length"] else index_at
        return cls(header["first_descriptor_offset"], end, header["data_buffer_alignment"])


# --------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------


def walk_file(view: memoryview, describe: Describe, *, faults: Faults, mode: Mode,
              limits: Limits = DEFAULT_LIMITS) -> Iterator[Part]:
    """Parts of a ``.hrry`` file in the order of the reader protocol (``file-format.md §
    Reader Protocol``): the front, then per tensor in descriptor order its descriptor part
    and ``tensor data`` (``note``: the tensor's name).  A ``fault`` part whose ``decl`` is set
    is a table that does not fit in what remains.

    ``RAISE`` is the reader: every container rule is checked, the first fault raises; the
    front is ``file header``, ``trailer``, ``index`` (value: the entries) and ``kv``, and a
    ``tensor data`` part's value is the ``(offset, size)`` of each buffer.  ``COLLECT`` and
    ``ANNOTATE`` only locate: the ``file header``, then the tensors (through the index as far
    as it can be read, else by walking the tensor region; an ``entry`` part before each
    descriptor), then the ``kv`` and ``index`` sections and the ``trailer``, yielding a
    ``fault`` part where the bytes do not hold what they must."""
    return _walk(view, describe, faults, mode, limits)


def _walk(view: memoryview, describe: Describe, faults: Faults, mode: Mode, limits: Limits) -> Iterator[Part]:
    """The walk itself: the front (:func:`_checked_front` or :func:`_located_front`, which
    return the entries in descriptor order, the :class:`TensorRegion` and the parts that follow
    the tensors, or None when nothing more can be located), then each tensor in turn -- checked
    (:func:`check_tensor`) or located (an ``entry`` part before its descriptor is described, the
    descriptor decoded from everything that follows it under ``COLLECT``, from what its entry
    gives it under ``ANNOTATE``, at its composite nesting depth).  The tensors' step is written
    here, not as a generator of its own, so that each part passes through one generator."""
    strict = faults is Faults.RAISE
    taken = yield from (_checked_front(view, mode, limits) if strict else _located_front(view))
    if taken is None:
        return
    entries, region, back = taken
    previous_end, previous = (region.first, None) if strict else (0, None)
    size, nesting, collect = len(view), Nesting(), faults is Faults.COLLECT
    for e in entries:
        if strict:
            part, spans, previous_end = check_tensor(view, e, describe, region, previous_end, previous)
            yield part
            yield part_from_fields((TENSOR_DATA, e.data_offset, e.data_offset + e.data_length, None, spans, None,
                                    e.name, (), 0, 0))
            previous = e.name
            continue
        off, n = e.descriptor_offset, e.descriptor_length
        if off >= size:
            yield Part(FAULT, off, off, note=f"index entry {e.name!r} points past the end of the file")
            continue
        yield Part(ENTRY, off, off, INDEX_ENTRY_FIELDS, e)  # before the descriptor is described
        part = describe(view[off:] if n == 0 or collect else view[off : min(size, off + max(n, 0))], off,
                        nesting.depth())
        yield part._replace(note=e.name)
        if part.value is not None:
            if e.data_length:
                yield Part(TENSOR_DATA, e.data_offset, e.data_offset + e.data_length, value=None, note=e.name,
                           depth=part.depth)
            nesting.arrive(part.value)
    yield from back


# --------------------------------------------------------------------------------------
# RAISE: the reader
# --------------------------------------------------------------------------------------


class CheckedFile:
    """What the checked walk of a file (``RAISE``) found, taken off its parts as they pass
    (:func:`checked_file`): the header and trailer fields, the index entries in index order,
    the ``kv`` part (value: the metadata; its findings) and per tensor, in descriptor order,
    ``name -> (descriptor, buffer spans, descriptor offset, findings)``.  The file reader's walked
    open and ``audit`` both read a file through it."""

    __slots__ = ("header", "trailer", "entries", "kv", "tensors")

    def __init__(self):
        self.header: dict = {}
        self.trailer: dict = {}
        self.entries: tuple = ()
        self.kv: Optional[Part] = None
        self.tensors: dict[str, tuple] = {}


def checked_file(view: memoryview, describe: Describe, *, mode: Mode, limits: Limits = DEFAULT_LIMITS) -> CheckedFile:
    """The file walked once under ``RAISE`` (:func:`walk_file`: every container rule, each
    descriptor through ``describe``; the first fault raises) and what its parts hold."""
    found = CheckedFile()
    tensors = found.tensors
    described = None
    for part in walk_file(view, describe, faults=Faults.RAISE, mode=mode, limits=limits):
        kind = part.kind
        if kind == DESCRIPTOR:
            described = part
        elif kind == TENSOR_DATA:
            tensors[part.note] = (described.value, part.value, described.start, described.findings)
        elif kind == FILE_HEADER_PART:
            found.header = part.value
        elif kind == TRAILER_PART:
            found.trailer = part.value
        elif kind == INDEX_PART:
            found.entries = part.value
        elif kind == KV_PART:
            found.kv = part
    return found



def _checked_front(view: memoryview, mode: Mode, limits: Limits):
    """The parts before the tensors (header, trailer, index, kv), checked; returns the index
    entries in descriptor order, the :class:`TensorRegion` and no parts after the tensors."""
    h, t = check_ends(view, limits)
    size = len(view)
    yield Part(FILE_HEADER_PART, 0, FILE_HEADER_SIZE, FILE_HEADER, h)
    yield Part(TRAILER_PART, size - TRAILER_SIZE, size, TRAILER, t)
    entries = check_index(view, h, t, limits)
    yield Part(INDEX_PART, t["index_offset"], t["index_offset"] + t["index_length"], INDEX_ENTRY_FIELDS,
               tuple(entries))
    yield check_kv(view, h, t, mode, limits)
    return sorted(entries, key=lambda e: e.descriptor_offset), TensorRegion.of(h, t), ()


def check_ends(view, limits: Limits) -> tuple[dict, dict]:
    """The file header and the trailer (with the index CRC) checked, the first fault raised
    (``file-format.md § File Header``, ``§ Trailer``); their fields."""
    size = len(view)
    head = bytes(view[:FILE_HEADER_SIZE])
    if len(head) >= len(FILE_MAGIC) and head[: len(FILE_MAGIC)] != FILE_MAGIC:
        raise container_rules.FILE_MAGIC.violation(
            f"the file starts with {head[:len(FILE_MAGIC)]!r}, not {FILE_MAGIC!r}", 0)
    if size < FILE_HEADER_SIZE + TRAILER_SIZE:
        raise container_rules.FILE_TOO_SHORT.violation(
            f"{size} bytes cannot hold the {FILE_HEADER_SIZE}-byte header and {TRAILER_SIZE}-byte trailer", size)
    h, _ = _HEADER.unpack(head, 0)
    _check_header(h, size)
    t, _ = _TRAILER.unpack(view[size - TRAILER_SIZE:size], 0)
    _check_trailer(view, h, t, limits)
    return h, t


def _check_header(h: dict, size: int) -> None:
    """The file header's rules (``file-format.md § File Header``)."""
    if h["container_version_major"] > SUPPORTED_CONTAINER_MAJOR:
        raise container_rules.FILE_VERSION.violation(
            f"container_version_major {h['container_version_major']} is newer than {SUPPORTED_CONTAINER_MAJOR}",
            _H["container_version_major"])
    for name in ("_reserved", "_reserved_header"):
        if any(h[name]):
            raise container_rules.FILE_HEADER_RESERVED.violation(f"header field {name} is not zero", _H[name])
    flags = h["file_flags"]
    if flags & _UNKNOWN_FILE_FLAGS:
        raise container_rules.FILE_FLAGS_RESERVED.violation(
            f"reserved file_flags bits 0x{flags & _UNKNOWN_FILE_FLAGS:08X} are set", _H["file_flags"])
    check_data_buffer_alignment(h["data_buffer_alignment"])
    first = h["first_descriptor_offset"]
    if first < FILE_HEADER_SIZE or first % DESCRIPTOR_ALIGNMENT or first > size - TRAILER_SIZE:
        raise container_rules.FILE_FIRST_DESCRIPTOR.violation(
            f"first_descriptor_offset {first} is not an 8-aligned offset in [{FILE_HEADER_SIZE}, "
            f"{size - TRAILER_SIZE}]", _H["first_descriptor_offset"])


def check_data_buffer_alignment(a: int) -> None:
    """The header's ``data_buffer_alignment`` (``file-format.md § File Header``): a power of two
    within the bounds :mod:`hurray_schema.structs.file` declares, else the rule raises at the
    header field -- for the reader of a header and for the writer about to lay one out alike."""
    if not power_of_two(a) or not MIN_DATA_BUFFER_ALIGNMENT <= a <= MAX_DATA_BUFFER_ALIGNMENT:
        raise container_rules.FILE_ALIGNMENT.violation(
            f"data_buffer_alignment {a} is not a power of two in [{MIN_DATA_BUFFER_ALIGNMENT}, "
            f"{MAX_DATA_BUFFER_ALIGNMENT}]", _H["data_buffer_alignment"])


def _check_trailer(view: memoryview, h: dict, t: dict, limits: Limits) -> None:
    """The trailer's rules and the index CRC (``file-format.md § Trailer``)."""
    base = len(view) - TRAILER_SIZE
    if t["trailer_magic"] != TRAILER_MAGIC:
        raise container_rules.TRAILER_MAGIC.violation(
            f"trailer_magic is {t['trailer_magic']!r}, not {TRAILER_MAGIC!r}", base + _T["trailer_magic"])
    if any(t["_reserved"]):
        raise container_rules.TRAILER_RESERVED.violation("trailer _reserved is not zero", base + _T["_reserved"])
    index_at, index_length = t["index_offset"], t["index_length"]
    if index_at < FILE_HEADER_SIZE or index_at + index_length > base or index_length < COUNT_PLAN.fixed_size:
        raise container_rules.INDEX_BOUNDS.violation(
            f"index at {index_at} length {index_length} is not between the header and the trailer at {base}",
            base + _T["index_offset"])
    if index_at % SECTION_ALIGNMENT:
        raise container_rules.INDEX_ALIGNMENT.violation(
            f"index_offset {index_at} is not a multiple of {SECTION_ALIGNMENT}", base + _T["index_offset"])
    limits.check("max_index_bytes", index_length, base + _T["index_length"])
    crc = t["index_crc32c"]
    if h["file_flags"] & _HAS_INDEX_CRC32C:
        actual = crc32c(view[index_at : index_at + index_length])
        if actual != crc:
            raise container_rules.INDEX_CRC.violation(
                f"index_crc32c is 0x{crc:08X}, the index bytes give 0x{actual:08X}", base + _T["index_crc32c"])
    elif crc:
        raise container_rules.INDEX_CRC_UNSET.violation(
            f"index_crc32c is 0x{crc:08X} although HAS_INDEX_CRC32C is clear", base + _T["index_crc32c"])


def check_index(view: memoryview, h: dict, t: dict, limits: Limits) -> list[IndexEntry]:
    """The index entries, each entry rule checked, the first fault raised (``file-format.md §
    Index Encoding``): every entry inside ``index_length`` and filling it, names non-empty
    UTF-8 and unique, ``flags`` zero, names in byte order when ``SORTED_INDEX`` is set."""
    index_at, end = t["index_offset"], t["index_offset"] + t["index_length"]
    section = view[index_at:end]  # read at pos - index_at: offsets stay the file's
    count = COUNT_PLAN.unpack(section, 0)[0]["index_entry_count"]
    pos = index_at + COUNT_PLAN.fixed_size
    if count * MIN_ENTRY_SIZE > end - pos:
        raise container_rules.INDEX_TRUNCATED.violation(
            f"index_entry_count {count} cannot fit in the {end - pos} bytes of index that follow", index_at)
    limits.check("max_index_entries", count, index_at)
    entries, seen = [], set()
    for _ in range(count):
        at = pos
        if pos + NAME_LENGTH_PLAN.fixed_size > end:
            raise container_rules.INDEX_TRUNCATED.violation("an index entry runs past index_length", pos)
        (n,) = NAME_LENGTH_CODEC.unpack_from(section, pos - index_at)
        pos += NAME_LENGTH_PLAN.fixed_size
        if pos + n + ENTRY_PLAN.fixed_size > end:
            raise container_rules.INDEX_TRUNCATED.violation("an index entry runs past index_length", at)
        raw = bytes(section[pos - index_at : pos - index_at + n])
        pos += n
        name = _entry_name(raw, seen, at)
        descriptor_offset, descriptor_length, data_offset, data_length, flags = _ENTRY_CODEC.unpack_from(
            section, pos - index_at)
        pos += ENTRY_PLAN.fixed_size
        if flags:
            raise container_rules.INDEX_FLAGS.violation(
                f"entry {name!r} has flags 0x{flags:08X}", at + NAME_LENGTH_PLAN.fixed_size + n + _E["flags"])
        entries.append(IndexEntry(name, descriptor_offset, descriptor_length, data_offset, data_length, flags, at))
    if pos != end:
        raise container_rules.INDEX_TRUNCATED.violation(
            f"{end - pos} bytes follow the last of the {count} index entries inside index_length", pos)
    if h["file_flags"] & FileFlag.SORTED_INDEX:
        for prev, nxt in zip(entries, entries[1:]):
            if prev.name.encode("utf-8") > nxt.name.encode("utf-8"):
                raise container_rules.INDEX_SORTED.violation(
                    f"SORTED_INDEX is set but {prev.name!r} comes before {nxt.name!r}", nxt.entry_offset)
    return entries


def _entry_name(raw: bytes, seen: set, at: int) -> str:
    """The name of the index entry at ``at``: non-empty, UTF-8, not one of ``seen`` (then added)."""
    if not raw:
        raise container_rules.INDEX_NAME.violation("name_length is 0", at)
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise container_rules.INDEX_NAME.violation(f"tensor name is not valid UTF-8 ({exc.reason})",
                                                   at + NAME_LENGTH_PLAN.fixed_size) from None
    if raw in seen:
        raise container_rules.INDEX_DUPLICATE.violation(f"tensor name {name!r} appears twice in the index", at)
    seen.add(raw)
    return name


def check_kv(view: memoryview, h: dict, t: dict, mode: Mode, limits: Limits) -> Part:
    """The KV section's ``kv`` part (value: the decoded metadata), its placement and the
    ``HAS_KV_METADATA`` flag checked (``file-format.md § KV Metadata Section``)."""
    kv_at, kv_length = t["kv_offset"], t["kv_length"]
    base = len(view) - TRAILER_SIZE
    findings = []
    has_flag = bool(h["file_flags"] & FileFlag.HAS_KV_METADATA)
    if has_flag != bool(kv_length):
        findings.append(container_rules.KV_FLAG.finding(
            f"HAS_KV_METADATA is {'set' if has_flag else 'clear'} but kv_length is {kv_length}", _H["file_flags"], mode))
    if not kv_length:
        return Part(KV_PART, kv_at, kv_at, KV_COUNT, {}, findings=tuple(findings))
    if kv_at < FILE_HEADER_SIZE or kv_at % SECTION_ALIGNMENT or kv_at + kv_length > t["index_offset"]:
        raise container_rules.KV_BOUNDS.violation(
            f"KV section at {kv_at} length {kv_length} is not an 8-aligned range between the header and the index",
            base + _T["kv_offset"])
    limits.check("max_kv_bytes", kv_length, base + _T["kv_length"])
    value = decode_kv(view[kv_at : kv_at + kv_length], kv_at, limits)
    return Part(KV_PART, kv_at, kv_at + kv_length, KV_COUNT, value, findings=tuple(findings))


def check_tensor(view, e: IndexEntry, describe: Describe, region: TensorRegion, previous_end: int,
                 previous: Optional[str]) -> tuple[Part, list, int]:
    """One tensor of a file as the reader takes it, after the tensor before it in descriptor
    order (``previous``, which ends at ``previous_end``): its descriptor's placement and length
    against its index entry (``file-format.md § Descriptor Placement``: 8-aligned inside the
    tensor region, after the tensor before it), the descriptor itself (``describe``), then its
    data's placement (``§ Data Buffer Placement``: aligned, after the descriptor, inside the
    region, ``data_length`` what its buffers span); the first fault raises.  Returns the
    descriptor part, the ``(offset, size)`` of each buffer and where the tensor ends.  The file
    reader runs it on every tensor at open, or on a tensor's first read
    (:mod:`.index`), with the same rule and offset either way.  One
    function, not one per placement: it runs once per tensor on the reader's path."""
    off, first, region_end, a = e.descriptor_offset, region.first, region.end, region.alignment
    if off % DESCRIPTOR_ALIGNMENT:
        raise container_rules.DESCRIPTOR_ALIGNMENT.violation(
            f"descriptor of {e.name!r} at {off} is not {DESCRIPTOR_ALIGNMENT}-aligned",
            _entry_field(e, "descriptor_offset"))
    if off < first or off + FIXED_HEADER_SIZE > region_end:
        raise container_rules.INDEX_DESCRIPTOR_BOUNDS.violation(
            f"descriptor of {e.name!r} at {off} is outside the tensor region [{first}, {region_end})",
            _entry_field(e, "descriptor_offset"))
    if off < previous_end:
        raise container_rules.INDEX_OVERLAP.violation(
            f"descriptor of {e.name!r} at {off} lies inside the tensor {previous!r} (which ends at "
            f"{previous_end})", _entry_field(e, "descriptor_offset"))
    length = peek_descriptor_length(view[off : off + FIXED_HEADER_SIZE].tobytes(), off)
    if length != e.descriptor_length:
        raise container_rules.INDEX_DESCRIPTOR_LENGTH.violation(
            f"index says descriptor_length {e.descriptor_length} for {e.name!r}, the descriptor says {length}",
            _entry_field(e, "descriptor_length"))
    if off + length > region_end:
        raise container_rules.INDEX_DESCRIPTOR_BOUNDS.violation(
            f"descriptor of {e.name!r} ({length} bytes at {off}) runs past the tensor region end {region_end}",
            _entry_field(e, "descriptor_offset"))
    part = describe(view[off : off + length].tobytes(), off, 0)  # as bytes: a header compiled before decodes it
    end = off + length
    data_offset, data_length = e.data_offset, e.data_length
    if part.value.buffers:
        if data_offset % a:
            raise container_rules.DATA_ALIGNMENT.violation(
                f"data of {e.name!r} at {data_offset} is not a multiple of data_buffer_alignment {a}",
                _entry_field(e, "data_offset"))
        if data_offset < end:
            raise container_rules.INDEX_OVERLAP.violation(
                f"data of {e.name!r} at {data_offset} starts inside its descriptor (ends at {end})",
                _entry_field(e, "data_offset"))
        spans = buffer_spans(part.value, data_offset, a)
        last, size = spans[-1]
        if data_length != last + size - data_offset:
            raise container_rules.DATA_LENGTH.violation(
                f"data_length of {e.name!r} is {data_length}, its buffers span {last + size - data_offset}",
                _entry_field(e, "data_length"))
        if last + size > region_end:
            raise container_rules.DATA_BOUNDS.violation(
                f"buffers of {e.name!r} end at {last + size}, past the tensor region end {region_end} "
                "(truncated data)", _entry_field(e, "data_length"))
        if last + size > end:
            end = last + size
    else:
        spans = []
        if data_length:
            raise container_rules.DATA_LENGTH.violation(
                f"{e.name!r} has no buffers but data_length {data_length}", _entry_field(e, "data_length"))
        if end <= data_offset <= region_end:
            end = data_offset  # a writer that padded after the head (the reference)
    return part, spans, end


def _entry_field(e: IndexEntry, field: str) -> int:
    """Absolute offset of ``field`` in the index entry ``e`` (after its name)."""
    return e.entry_offset + NAME_LENGTH_PLAN.fixed_size + len(e.name.encode("utf-8")) + _E[field]


# --------------------------------------------------------------------------------------
# COLLECT and ANNOTATE: audit, the annotated view
# --------------------------------------------------------------------------------------


def _located_front(view: memoryview):
    """The ``file header`` part (or the fault that ends the walk), the trailer read and the
    index entries located; returns them in descriptor order, no region, and the ``kv``,
    ``index`` and ``trailer`` parts that follow the tensors."""
    size = len(view)
    if FILE_HEADER_SIZE > size:
        yield Part(FAULT, 0, 0, FILE_HEADER, note="the file header does not fit")
        return None
    header, _ = _HEADER.unpack(view, 0)
    yield Part(FILE_HEADER_PART, 0, FILE_HEADER_SIZE, FILE_HEADER, header)
    if size < FILE_HEADER_SIZE + TRAILER_SIZE:
        yield Part(FAULT, size, size, note="the file is too short to hold a trailer")
        return None
    trailer_at = size - TRAILER_SIZE
    trailer, _ = _TRAILER.unpack(view, trailer_at)
    entries = _located_index(view, trailer)
    if not entries:
        entries = _scan_region(view, header, trailer_at)
        if entries:
            yield Part(FAULT, header["first_descriptor_offset"], header["first_descriptor_offset"],
                       note="the index cannot be read: tensors found by walking the tensor region from "
                            "first_descriptor_offset (file-format.md § Descriptor Placement)")
    back = []
    if trailer["kv_length"]:
        back.append(Part(KV_PART, trailer["kv_offset"], trailer["kv_offset"] + trailer["kv_length"], KV_COUNT))
    back.append(Part(INDEX_PART, trailer["index_offset"], trailer["index_offset"] + trailer["index_length"],
                     INDEX_COUNT))
    back.append(Part(TRAILER_PART, trailer_at, size, TRAILER, trailer))
    return sorted(entries, key=lambda e: e.descriptor_offset), None, back  # descriptor order: the write order


def _located_index(view: memoryview, trailer: dict) -> list[IndexEntry]:
    """The index entries as far as they can be read (no rule checked); none when an entry
    is cut off inside the index section."""
    off, n = trailer["index_offset"], trailer["index_length"]
    if off > len(view) or n > len(view) - off:
        return []
    entries = []
    for part in walk_index(view[: off + n], off):
        if part.kind == ENTRY:
            entries.append(part.value)
        elif part.kind == FAULT and (part.depth >= 0 or part.decl is not None):
            return []
    return entries


def walk_index(view: memoryview, off: int) -> Iterator[Part]:
    """Located parts of the index section at ``off`` (``file-format.md § Index Encoding``),
    ``view`` ending where the section ends; locating only (the reader's checks are
    :func:`check_index`).  The ``index_entry_count`` table, then per entry ``entry start``, the
    ``name_length`` table, the ``name``, the entry fields table and an ``entry`` part (value:
    the :class:`IndexEntry`).  A ``fault`` part ends the walk: with a ``decl``, that table
    does not fit; at depth -1 the next entry is missing, at depth 0 an entry is cut off."""
    end = len(view)
    if COUNT_PLAN.fixed_size > end - off:
        yield Part(FAULT, off, off, INDEX_COUNT, depth=-1)
        return
    values, pos = COUNT_PLAN.unpack(view, off)
    yield Part(TABLE, off, pos, INDEX_COUNT, values, depth=-1)
    for i in range(values["index_entry_count"]):
        if pos >= end:
            yield Part(FAULT, pos, pos, note=f"index entry {i} starts past the index section", depth=-1)
            return
        at = pos
        yield Part(ENTRY_START, at, at, index=i, depth=-1)
        if NAME_LENGTH_PLAN.fixed_size > end - pos:
            yield Part(FAULT, pos, pos, INDEX_NAME_LENGTH)
            return
        v, pos = NAME_LENGTH_PLAN.unpack(view, pos)
        yield Part(TABLE, pos - NAME_LENGTH_PLAN.fixed_size, pos, INDEX_NAME_LENGTH, v)
        length = v["name_length"]
        if length > end - pos:
            yield Part(FAULT, pos, pos, note=f"name needs {length} bytes, {end - pos} remain")
            return
        name = bytes(view[pos : pos + length])
        yield Part(NAME, pos, pos + length, value=name)
        pos += length
        if ENTRY_PLAN.fixed_size > end - pos:
            yield Part(FAULT, pos, pos, INDEX_ENTRY_FIELDS)
            return
        f, pos = ENTRY_PLAN.unpack(view, pos)
        yield Part(TABLE, pos - ENTRY_PLAN.fixed_size, pos, INDEX_ENTRY_FIELDS, f)
        entry = IndexEntry(name.decode("utf-8", "replace"), f["descriptor_offset"], f["descriptor_length"],
                           f["data_offset"], f["data_length"], f["flags"], at)
        yield Part(ENTRY, at, pos, INDEX_ENTRY_FIELDS, entry, index=i)


def _scan_region(view: memoryview, header: dict, end: int) -> list[IndexEntry]:
    """Pseudo index entries found by walking descriptors from ``first_descriptor_offset``:
    each descriptor on an 8-byte boundary, its buffers each on ``data_buffer_alignment``
    (``file-format.md § Descriptor Placement``, ``§ Data Buffer Placement``)."""
    align = header["data_buffer_alignment"]
    if not power_of_two(align):
        return []
    pos, found = header["first_descriptor_offset"], []
    while pos + FIXED_HEADER_SIZE <= end and bytes(view[pos : pos + len(DESCRIPTOR_MAGIC)]) == DESCRIPTOR_MAGIC:
        try:
            desc, _ = parse_descriptor(view[pos:end], mode="permissive", base=pos)
        except HurraySchemaError:
            break
        n = desc.encoded_length
        spans = buffer_spans(desc, _align(pos + n, align), align)
        data = spans[0][0] if spans else pos + n
        cursor = spans[-1][0] + spans[-1][1] if spans else pos + n
        found.append(IndexEntry(f"@{pos}", pos, n, data, cursor - data if spans else 0))
        pos = _align(cursor, DESCRIPTOR_ALIGNMENT)
    return found
