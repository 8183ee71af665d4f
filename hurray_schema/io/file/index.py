"""A file's index held as arrays, and the open-time checks run on them at once.

What a file reader checks when it opens a file (``file-format.md § Reader Protocol``) splits in two:

* **at open**, whole-file structure: the header, the trailer, the index (CRC, every entry's name,
  flags and order, ``§ Index Encoding``), the KV section, and the placement of every tensor --
  each descriptor 8-aligned inside the tensor region, after the tensor before it, its magic and
  ``descriptor_length`` as its index entry says (``§ Descriptor Placement``), and each tensor's
  data aligned, after its descriptor and inside the region (``§ Data Buffer Placement``);
  composites are bound (``layouts/composite.md § Binding``), so every head and member
  descriptor is decoded and checked now, as is every tensor whose entry declares no data;
* **on a tensor's first read** (``HurrayFile._check``), the rest of that tensor: its
  descriptor decoded and every descriptor rule run, and its buffers against the entry's
  ``data_length``.

Both halves are :func:`~.walk.check_tensor`, the reader's own per-tensor code: here the index is
parsed, and the placement checked, as NumPy arrays, and anything those find wrong -- or a file
they cannot vouch for -- is handed to the exact per-entry code, which raises the rule and byte
offset ``audit`` reports (or, in permissive mode, records what the mode tolerates).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...limits import Limits
from ...structs._declare import plan
from ...structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE
from ...structs.descriptor import MAGIC as DESCRIPTOR_MAGIC
from ...structs.file import DESCRIPTOR_ALIGNMENT
from ...structs.tags import LayoutTag
from .walk import (
    COUNT_PLAN, ENTRY_PLAN, MIN_ENTRY_SIZE, NAME_LENGTH_CODEC, NAME_LENGTH_PLAN, SORTED_INDEX, IndexEntry, TensorRegion,
    check_ends, check_index, check_kv,
)

__all__ = ["FileIndex", "Placement", "front_sections", "place_tensors", "read_index"]

_ENTRY_DTYPE = ENTRY_PLAN.numpy_dtype()
_HEADER_DTYPE = plan(FIXED_HEADER).numpy_dtype()
_NAME_LENGTH_SIZE = NAME_LENGTH_PLAN.fixed_size
assert NAME_LENGTH_CODEC.format == "<H", NAME_LENGTH_CODEC.format  # _entries reads it as two bytes
_COUNT_SIZE = COUNT_PLAN.fixed_size
_ENTRY_SIZE = ENTRY_PLAN.fixed_size
_MAGIC_WORD = np.frombuffer(DESCRIPTOR_MAGIC, "<u4")[0]  # the magic compared as one 32-bit word
_PLACED_DTYPE = np.dtype({  # the fixed header's fields placement reads, the magic as that word
    "names": ["magic", "descriptor_length", "layout_tag"],
    "formats": [_MAGIC_WORD.dtype] + [_HEADER_DTYPE.fields[name][0] for name in ("descriptor_length", "layout_tag")],
    "offsets": [_HEADER_DTYPE.fields[name][1] for name in ("magic", "descriptor_length", "layout_tag")],
    "itemsize": _HEADER_DTYPE.itemsize})
_DESCRIPTOR_MISALIGNED = DESCRIPTOR_ALIGNMENT - 1  # the low bits of an offset off an 8-byte boundary
_COMPOSITE = int(LayoutTag.COMPOSITE)  # compared with a uint8 array: an IntEnum member costs a slow conversion


class FileIndex:
    """The index entries of a file in index order: ``names`` (a list), ``position`` (name ->
    index position), ``fields`` (a structured array of the fixed entry fields, the declaration's
    names) and ``fields_at`` (the absolute offset of each entry's fixed fields, after its name).
    :meth:`entry` builds one :class:`~.walk.IndexEntry` when a caller needs it."""

    __slots__ = ("names", "position", "fields", "fields_at")

    def __init__(self, names: list, position: dict, fields: np.ndarray, fields_at):
        self.names = names
        self.position = position
        self.fields = fields
        self.fields_at = fields_at

    @classmethod
    def of(cls, entries: list) -> "FileIndex":
        """The index of entries parsed one by one (:func:`~.walk.check_index`)."""
        fields = np.zeros(len(entries), _ENTRY_DTYPE)
        for name in _ENTRY_DTYPE.names:
            fields[name] = [getattr(e, name) for e in entries]
        names = [e.name for e in entries]
        return cls(names, {name: i for i, name in enumerate(names)}, fields,
                   [e.entry_offset + _NAME_LENGTH_SIZE + _name_bytes(e.name) for e in entries])

    def __len__(self) -> int:
        return len(self.names)

    def entry(self, i: int) -> IndexEntry:
        name = self.names[i]
        entry_at = int(self.fields_at[i]) - _name_bytes(name) - _NAME_LENGTH_SIZE
        return IndexEntry(name, *self.fields[i].tolist(), entry_at)  # the fields in declaration order, as ints

    def entries(self) -> list:
        return [self.entry(i) for i in range(len(self.names))]


def _name_bytes(name: str) -> int:
    """Bytes of an entry name on the wire (a name that is not UTF-8 keeps its bytes as lone surrogates)."""
    return len(name.encode("utf-8", "surrogateescape"))


def read_index(view, header: dict, trailer: dict, limits: Limits) -> FileIndex:
    """The index section (``file-format.md § Index Encoding``) as a :class:`FileIndex`, every
    entry rule checked: parsed in one pass over its bytes, then checked as arrays; when anything is
    off, the section is parsed again entry by entry (:func:`~.walk.check_index`), which raises
    the first fault as the reader always has."""
    index = _fast_index(view, header, trailer, limits)
    if index is None:
        return FileIndex.of(check_index(view, header, trailer, limits))
    return index


def _fast_index(view, header: dict, trailer: dict, limits: Limits) -> Optional[FileIndex]:
    """The index when every entry is plainly well formed, else None (the exact parse decides)."""
    index_at = trailer["index_offset"]
    section = bytes(view[index_at : index_at + trailer["index_length"]])
    count = COUNT_PLAN.unpack(section, 0)[0]["index_entry_count"]
    if count * MIN_ENTRY_SIZE > len(section) - _COUNT_SIZE or count > limits.max_index_entries:
        return None
    names, fields_at = _entries(section, count)
    if names is None:
        return None
    position = dict(zip(names, range(count)))
    if len(position) != count or "" in position:
        return None
    if header["file_flags"] & SORTED_INDEX and any(a > b for a, b in zip(names, names[1:])):
        return None  # UTF-8 keeps code-point order, so the strings sort as their bytes do
    fields_at = np.array(fields_at, np.int64)
    fields = _gather(section, fields_at, _ENTRY_DTYPE)
    if fields["flags"].any():
        return None
    return FileIndex(names, position, fields, fields_at + index_at)


def _entries(section: bytes, count: int):
    """Each entry's name and where its fixed fields start (``file-format.md § Index Encoding``);
    ``(None, None)`` when the entries do not exactly fill the section or a name is not UTF-8.

    One pass over the name lengths, each name cut from the section read as Latin-1 (one character
    per byte); names that are all ASCII are then their UTF-8 decoding as they stand, any other is
    decoded from its bytes."""
    text = section.decode("latin-1")
    names = [""] * count
    fields_at = [0] * count
    pos, length_size, entry_size = _COUNT_SIZE, _NAME_LENGTH_SIZE, _ENTRY_SIZE
    try:
        for i in range(count):
            at = pos + length_size
            pos = at + (section[pos] | section[pos + 1] << 8)  # name_length, little-endian uint16
            names[i] = text[at:pos]
            fields_at[i] = pos
            pos += entry_size
    except IndexError:  # a name length past the end: the exact parse names the fault
        return None, None
    if pos != len(section):
        return None, None
    if not "".join(names).isascii():
        try:
            names = [name.encode("latin-1").decode("utf-8") for name in names]
        except UnicodeDecodeError:  # the exact parse names the entry
            return None, None
    return names, fields_at


def _gather(data, positions, dtype: np.dtype) -> np.ndarray:
    """The records of ``dtype`` at each byte position of ``data``, copied into one array."""
    size = len(data) - dtype.itemsize + 1
    if not len(positions) or size <= 0:
        return np.zeros(0, dtype)
    # a record-sized run of plain bytes starting at every byte (a view, the runs overlapping); the
    # positions' runs are copied out, then read as records
    runs = np.ndarray((size,), np.dtype((np.void, dtype.itemsize)), buffer=data, strides=(1,))
    return runs[positions].view(dtype)


class Placement:
    """The tensors in descriptor order (``order``: index positions; ``rank``: each position's place
    in that order), where each one ends (``end``, by its index entry: :meth:`previous_end` is where
    the tensor before it ends) and which must be decoded at open (``at_open``: composite heads,
    and entries declaring no data)."""

    __slots__ = ("order", "rank", "first", "end", "at_open")

    def __init__(self, order: np.ndarray, first: int, end: np.ndarray, at_open: np.ndarray, in_order: bool = False):
        self.order = order
        if in_order:  # the index lists the tensors in descriptor order: ranks and positions coincide
            self.rank = order
        else:
            self.rank = np.empty_like(order)
            self.rank[order] = np.arange(len(order))
        self.first = first
        self.end = end
        self.at_open = at_open

    def previous_end(self, rank: int) -> int:
        """Where the tensor before the one of descriptor rank ``rank`` ends (the region's start for the first)."""
        return int(self.end[rank - 1]) if rank else self.first


def place_tensors(view, index: FileIndex, region: TensorRegion) -> Optional[Placement]:
    """Every tensor's placement checked from the index and each descriptor's fixed header,
    read as arrays (``file-format.md § Descriptor Placement``, ``§ Data Buffer Placement``);
    None when any check fails (the caller walks the file entry by entry, which raises the fault).

    Tried in index order first (as writers lay files out); when the tensors do not pass there and
    their descriptors are not in index order, again in descriptor order (the exact walk's
    ``sorted()``: ties keep index order)."""
    fields = index.fields
    if not len(fields):
        order = np.arange(0)
        return Placement(order, region.first, fields["descriptor_offset"], order.astype(bool), True)
    placed = _placed(view, fields, region)
    if placed is not None:
        return Placement(np.arange(len(fields)), region.first, *placed, True)
    offset = fields["descriptor_offset"]
    if (offset[1:] >= offset[:-1]).all():
        return None  # in descriptor order already: what failed is the placement itself
    order = np.argsort(offset, kind="stable")
    placed = _placed(view, fields[order], region)
    return None if placed is None else Placement(order, region.first, *placed)


def _placed(view, fields: np.ndarray, region: TensorRegion) -> Optional[tuple]:
    """``(end, at_open)`` of the entries ``fields`` taken as descriptor order, or None when they are
    not in that order or any is misplaced.

    Most rules are one test: the tensor region's start, then per tensor its descriptor's offset and
    end, where its data starts (its descriptor's end when it has none) and where it ends, then the
    region's end never decrease -- each descriptor after the tensor before it and inside the region,
    each tensor's data after its descriptor and inside the region.  A data-less tensor ends at its
    descriptor's end, or where its data would start when that lies between it and the region's end
    (a writer that padded).  Sums stay unsigned 64-bit: one that wraps around breaks the order.
    Then the alignments, the smallest descriptor, and each fixed header's magic and length."""
    offset, length = fields["descriptor_offset"], fields["descriptor_length"]
    data_at, data_length = fields["data_offset"], fields["data_length"]
    count, region_end = len(offset), region.end
    chain = np.empty(4 * count + 2, np.uint64)
    chain[0], chain[-1] = region.first, region_end
    steps = chain[1:-1].reshape(count, 4)  # per tensor: offset, descriptor end, data start, end
    steps[:, 0] = offset
    descriptor_end = steps[:, 1]
    np.add(offset, length, out=descriptor_end)
    has_data = data_length != 0
    data_end = data_at + data_length
    steps[:, 2] = np.where(has_data, data_at, descriptor_end)
    end = np.where(has_data | ((descriptor_end <= data_at) & (data_at <= region_end)), data_end, descriptor_end)
    steps[:, 3] = end
    if not (chain[1:] >= chain[:-1]).all():
        return None
    if ((offset & _DESCRIPTOR_MISALIGNED) | np.where(has_data, data_at & (region.alignment - 1), 0)).any() \
            or length.min() < FIXED_HEADER_SIZE:
        return None
    headers = _gather(view, offset, _PLACED_DTYPE)  # inside the region: the order above holds
    if ((headers["magic"] != _MAGIC_WORD) | (headers["descriptor_length"] != length)).any():
        return None
    return end, ~has_data | (headers["layout_tag"] == _COMPOSITE)


def front_sections(view, mode, limits: Limits):
    """The sections a reader checks before any tensor (``file-format.md § Reader Protocol``): the
    header, the trailer (with the index CRC), the index and the KV section, each raising its
    first fault as :func:`~.walk.walk_file` does.  Returns the header and trailer fields, the
    :class:`FileIndex`, the KV part and the :class:`~.walk.TensorRegion`."""
    header, trailer = check_ends(view, limits)
    index = read_index(view, header, trailer, limits)
    kv_part = check_kv(view, header, trailer, mode, limits)
    return header, trailer, index, kv_part, TensorRegion.of(header, trailer)
