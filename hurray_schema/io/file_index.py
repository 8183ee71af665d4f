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

import re
from typing import Optional

import numpy as np

from ..limits import Limits
from ..structs._declare import plan
from ..structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE
from ..structs.descriptor import MAGIC as DESCRIPTOR_MAGIC
from ..structs.file import DESCRIPTOR_ALIGNMENT, FileFlag
from ..structs.tags import LayoutTag
from .walk import (
    _COUNT, _ENTRY, _MIN_ENTRY, _NAME_LEN, _NAME_LENGTH_CODEC, IndexEntry, TensorRegion, _strict_index, _strict_kv,
    check_ends,
)

__all__ = ["FileIndex", "Placement", "front_sections", "place_tensors", "read_index"]

_ENTRY_DTYPE = _ENTRY.numpy_dtype()
_HEADER_DTYPE = plan(FIXED_HEADER).numpy_dtype()
_NAME_LENGTH_SIZE = _NAME_LEN.fixed_size
_ENTRY_SIZE = _ENTRY.fixed_size


class FileIndex:
    """The index entries of a file in index order: ``names`` (a list), ``position`` (name ->
    index position), ``fields`` (a structured array of the fixed entry fields, the declaration's
    names) and ``entry_at`` (each entry's absolute offset).  :meth:`entry` builds one
    :class:`~.walk.IndexEntry` when a caller needs it."""

    __slots__ = ("names", "position", "fields", "entry_at")

    def __init__(self, names: list, position: dict, fields: np.ndarray, entry_at: np.ndarray):
        self.names = names
        self.position = position
        self.fields = fields
        self.entry_at = entry_at

    @classmethod
    def of(cls, entries: list) -> "FileIndex":
        """The index of entries parsed one by one (:func:`~.walk._strict_index`)."""
        fields = np.zeros(len(entries), _ENTRY_DTYPE)
        for name in _ENTRY_DTYPE.names:
            fields[name] = [getattr(e, name) for e in entries]
        names = [e.name for e in entries]
        return cls(names, {name: i for i, name in enumerate(names)}, fields,
                   np.array([e.entry_offset for e in entries], np.int64))

    def __len__(self) -> int:
        return len(self.names)

    def entry(self, i: int) -> IndexEntry:
        row = self.fields[i]
        return IndexEntry(self.names[i], *(int(row[name]) for name in _ENTRY_DTYPE.names), int(self.entry_at[i]))

    def entries(self) -> list:
        return [self.entry(i) for i in range(len(self.names))]


def read_index(view, header: dict, trailer: dict, limits: Limits) -> FileIndex:
    """The index section (``file-format.md § Index Encoding``) as a :class:`FileIndex`, every
    entry rule checked: parsed in one pass over its bytes, then checked as arrays; when anything is
    off, the section is parsed again entry by entry (:func:`~.walk._strict_index`), which raises
    the first fault as the reader always has."""
    index = _fast_index(view, header, trailer, limits)
    if index is None:
        return FileIndex.of(_strict_index(view, header, trailer, limits))
    return index


def _fast_index(view, header: dict, trailer: dict, limits: Limits) -> Optional[FileIndex]:
    """The index when every entry is plainly well formed, else None (the exact parse decides)."""
    index_at = trailer["index_offset"]
    section = bytes(view[index_at : index_at + trailer["index_length"]])
    count = _COUNT.unpack(section, 0)[0]["index_entry_count"]
    if count * _MIN_ENTRY > len(section) - _COUNT.fixed_size or count > limits.max_index_entries:
        return None
    starts, fields_at, names = _entries_and_names(section, count)
    if starts is None:
        return None
    position = dict(zip(names, range(count)))
    if len(position) != count or "" in position:
        return None
    if header["file_flags"] & FileFlag.SORTED_INDEX and any(a > b for a, b in zip(names, names[1:])):
        return None  # UTF-8 keeps code-point order, so the strings sort as their bytes do
    fields = _gather(section, fields_at, _ENTRY_DTYPE)
    if fields["flags"].any():
        return None
    return FileIndex(names, position, fields, np.asarray(starts, np.int64) + index_at)


def _entries_and_names(section: bytes, count: int):
    """Where each entry starts, where its fixed fields start, and its name; ``(None, None, None)``
    when the entries do not exactly fill the section or a name is not UTF-8."""
    starts, fields_at, raw = [0] * count, [0] * count, [b""] * count
    unpack, pos = _NAME_LENGTH_CODEC.unpack_from, _COUNT.fixed_size
    try:
        for i in range(count):
            starts[i] = pos
            pos += _NAME_LENGTH_SIZE
            end = pos + unpack(section, pos - _NAME_LENGTH_SIZE)[0]
            raw[i] = section[pos:end]
            fields_at[i] = end
            pos = end + _ENTRY_SIZE
    except Exception:  # noqa: BLE001 - a name length past the end: the exact parse names the fault
        return None, None, None
    if pos != len(section):
        return None, None, None
    # one decode of every name: 0xFF never occurs in UTF-8, so it separates them, and any byte that
    # is not UTF-8 (0xFF in a name included) leaves a lone surrogate behind
    text = _SEPARATOR.join(raw).decode("utf-8", "surrogateescape")
    names = text.split(_SEPARATOR_DECODED)
    if len(names) != count or _NOT_UTF8.search(text.replace(_SEPARATOR_DECODED, "")):
        return None, None, None
    return starts, fields_at, names


_SEPARATOR = b"\xff"
_SEPARATOR_DECODED = _SEPARATOR.decode("utf-8", "surrogateescape")
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _gather(data, positions, dtype: np.dtype) -> np.ndarray:
    """The records of ``dtype`` at each byte position of ``data``, copied into one array."""
    size = len(data) - dtype.itemsize + 1
    if not len(positions) or size <= 0:
        return np.zeros(0, dtype)
    # every record-sized window of the bytes, as rows (a view), of which the positions' rows are copied out
    windows = np.ndarray((size,), dtype, buffer=data, strides=(1,))
    return windows[np.asarray(positions, np.int64)]


class Placement:
    """The tensors in descriptor order (``order``: index positions), where the tensor before
    each one ends (``previous_end``, by its index entry) and which must be decoded at open
    (``at_open``: composite heads, and entries declaring no data)."""

    __slots__ = ("order", "rank", "previous_end", "at_open")

    def __init__(self, order: np.ndarray, previous_end: np.ndarray, at_open: np.ndarray):
        self.order = order
        self.rank = np.empty_like(order)
        self.rank[order] = np.arange(len(order))
        self.previous_end = previous_end
        self.at_open = at_open


_OFFSETS_AND_LENGTHS = ("descriptor_offset", "data_offset", "data_length")


def place_tensors(view, index: FileIndex, region: TensorRegion) -> Optional[Placement]:
    """Every tensor's placement checked from the index and each descriptor's fixed header,
    read as arrays (``file-format.md § Descriptor Placement``, ``§ Data Buffer Placement``);
    None when any check fails (the caller walks the file entry by entry, which raises the fault)."""
    fields, size = index.fields, len(view)
    if len(fields) and max(int(fields[name].max()) for name in _OFFSETS_AND_LENGTHS) > size:
        return None  # (which also keeps every sum below inside int64)
    order = np.argsort(fields["descriptor_offset"], kind="stable")  # the exact walk's sorted(): ties keep index order
    placed = fields[order]
    offset = placed["descriptor_offset"].astype(np.int64)
    length = placed["descriptor_length"].astype(np.int64)
    data_at = placed["data_offset"].astype(np.int64)
    data_length = placed["data_length"].astype(np.int64)
    descriptor_end = offset + length
    if (((offset % DESCRIPTOR_ALIGNMENT) != 0) | (offset < region.first) | (length < FIXED_HEADER_SIZE)
            | (descriptor_end > region.end)).any():
        return None
    headers = _gather(view, offset, _HEADER_DTYPE)
    has_data = data_length > 0
    data_end = data_at + data_length
    padded = (descriptor_end <= data_at) & (data_at <= region.end)  # a data-less tensor may end where its data would
    end = np.where(has_data, data_end, np.where(padded, np.maximum(descriptor_end, data_at), descriptor_end))
    previous_end = np.empty_like(end)
    previous_end[:1] = region.first
    previous_end[1:] = end[:-1]
    if ((headers["magic"] != DESCRIPTOR_MAGIC) | (headers["descriptor_length"] != length) | (offset < previous_end)
            | (has_data & ((data_at % region.alignment != 0) | (data_at < descriptor_end) | (data_end > region.end)))
            ).any():
        return None
    at_open = ~has_data | (headers["layout_tag"] == LayoutTag.COMPOSITE)
    return Placement(order, previous_end, at_open)


def front_sections(view, mode, limits: Limits):
    """The sections a reader checks before any tensor (``file-format.md § Reader Protocol``): the
    header, the trailer (with the index CRC), the index and the KV section, each raising its
    first fault as :func:`~.walk.walk_file` does.  Returns the header and trailer fields, the
    :class:`FileIndex`, the KV part and the :class:`~.walk.TensorRegion`."""
    header, trailer = check_ends(view, limits)
    index = read_index(view, header, trailer, limits)
    kv_part = _strict_kv(view, header, trailer, mode, limits)
    return header, trailer, index, kv_part, TensorRegion.of(header, trailer)
