"""PyTorch Distributed Checkpoint folders in, without torch and without running their pickles.

``torch.distributed.checkpoint.save`` with the default FileSystemWriter writes a folder: a
``.metadata`` pickle (every entry of the state dict: a tensor's dtype, global size and chunks --
offsets and sizes -- or a non-tensor entry; and for each chunk or entry where its record lies:
``relative_path``, ``offset``, ``length``) and ``__<rank>_<n>.distcp`` files holding the records
back to back.  Each record is what ``torch.save`` writes for one tensor or value: a zip archive
(stored, not compressed) of ``<prefix>/data.pkl`` (``_rebuild_tensor_v2`` over a persistent
storage id), ``<prefix>/data/<key>`` (the storage's bytes) and small text members
(``byteorder`` ...).

Both pickles are read by the restricted unpicklers of :mod:`.dcp_pickle`.  Every length is
checked against what remains before it is used: a record against its file, a zip member
against its record, the pickles against budgets of :class:`~hurray_schema.limits.Limits`
(``max_index_bytes`` for ``.metadata``, ``max_descriptor_bytes`` for a tensor's ``data.pkl``,
``max_kv_value_bytes`` for a value's), the entries against ``max_index_entries`` and the chunks
of a tensor against ``max_composite_members``.  A chunk's bytes are the storage's bytes as they
are, a view of the ``.distcp`` file's memory map (no copy until the writer's).

The mapping (spec-map.md § Interpretations): a tensor saved in one chunk covering it is a plain
tensor; in N chunks, a partition composite of N members, each carrying the shard of its chunk
(``layouts/composite.md § Composition Semantics › Partition``, ``§ Members › Shard section``); chunks saved twice with the same offsets and sizes
(replicated) once; non-tensor entries go to the KV section.  Whether the chunks tile the tensor
is left to the composite binder (``layouts/composite.md § Validation``).
"""

from __future__ import annotations

import io
import json
import math
import mmap
import os
import struct
import zipfile
from typing import Optional

import attrs
import numpy as np

from ..limits import Limits, resolve_limits
from ..model import ElementType
from .dcp_pickle import (BytesStorageMetadata, ChunkStorageMetadata, DcpError, MetadataIndex, StorageInfo,
                         TensorProperties, TensorStorageMetadata, TorchDtype, load_metadata, load_record,
                         load_value)
from .source import SourceTensor

__all__ = ["METADATA_FILE", "is_dcp_folder", "read_dcp", "TORCH_ELEMENT_TYPES", "DcpChunk", "DcpTensor",
           "RecordLocation"]

METADATA_FILE = ".metadata"
"""The index of a checkpoint folder (torch/distributed/checkpoint/filesystem.py ``_metadata_fn``)."""

TORCH_ELEMENT_TYPES = {
    "float16": (ElementType.FLOAT16, 2), "bfloat16": (ElementType.BFLOAT16, 2),
    "float32": (ElementType.FLOAT32, 4), "float64": (ElementType.FLOAT64, 8),
    "int8": (ElementType.INT8, 1), "uint8": (ElementType.UINT8, 1), "int16": (ElementType.INT16, 2),
    "uint16": (ElementType.UINT16, 2), "int32": (ElementType.INT32, 4), "uint32": (ElementType.UINT32, 4),
    "int64": (ElementType.INT64, 8), "uint64": (ElementType.UINT64, 8), "bool": (ElementType.BOOL, 1),
    "complex64": (ElementType.COMPLEX64, 8), "complex128": (ElementType.COMPLEX128, 16),
    "float8_e4m3fn": (ElementType.FLOAT8_E4M3, 1), "float8_e5m2": (ElementType.FLOAT8_E5M2, 1),
    "float8_e8m0fnu": (ElementType.FLOAT8_E8M0, 1),
}
"""torch dtype name -> (Hurray element type, bytes per element in a torch storage)."""

RECORD_DIRECTORY_BYTES = 1 << 20
"""Most bytes read from a record for its zip directory (a one-tensor record's is under 1 KiB):
what the ``zipfile`` module reads is bounded by this, not by what the record claims."""

_LOCAL_HEADER = struct.Struct("<4s22xHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"


def is_dcp_folder(path) -> bool:
    """Whether ``path`` is a folder holding a DCP ``.metadata``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, METADATA_FILE))


@attrs.frozen(slots=True)
class RecordLocation:
    """Where a record lies: a file of the folder, a byte offset in it, a length."""

    relative_path: str
    offset: int
    length: int


@attrs.frozen(slots=True)
class DcpChunk:
    """One saved chunk of a tensor: its box in the tensor and where its record lies."""

    offsets: tuple
    sizes: tuple
    location: RecordLocation


@attrs.frozen(slots=True)
class DcpTensor:
    """A tensor entry of the checkpoint: its dtype name, its global shape, its distinct chunks."""

    name: str
    dtype: str
    shape: tuple
    chunks: tuple


# --------------------------------------------------------------------------------------
# The folder's files
# --------------------------------------------------------------------------------------


class _Folder:
    """The checkpoint folder's files, each mapped once; a record is a bounds-checked view."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        self.maps: dict = {}

    def path_of(self, relative_path: str) -> str:
        """The file ``relative_path`` names, refused unless it lies inside the folder."""
        if not relative_path or "\x00" in relative_path or os.path.isabs(relative_path):
            raise DcpError(f"{self.root}: record path {relative_path!r} is not a path inside the folder")
        path = os.path.realpath(os.path.join(self.root, relative_path))
        if os.path.commonpath([self.root, path]) != self.root or path == self.root:
            raise DcpError(f"{self.root}: record path {relative_path!r} leaves the checkpoint folder")
        if not os.path.isfile(path):
            raise DcpError(f"{self.root}: record file {relative_path!r} does not exist")
        return path

    def view(self, location: RecordLocation) -> memoryview:
        """The record's bytes, checked to lie inside its file."""
        mapped = self._mapped(location.relative_path)
        size = len(mapped) if mapped is not None else 0
        if location.offset + location.length > size:
            raise DcpError(f"{location.relative_path}: a record at byte {location.offset} of {location.length} "
                           f"bytes ends past the file's {size} bytes")
        if mapped is None:
            return memoryview(b"")
        return memoryview(mapped)[location.offset:location.offset + location.length]

    def _mapped(self, relative_path: str):
        if relative_path not in self.maps:
            with open(self.path_of(relative_path), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self.maps[relative_path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        return self.maps[relative_path]


# --------------------------------------------------------------------------------------
# The index: .metadata
# --------------------------------------------------------------------------------------


def _read_metadata(folder: str, limits: Limits):
    """The ``.metadata`` stand-ins, its size checked against ``max_index_bytes`` before reading."""
    path = os.path.join(folder, METADATA_FILE)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        limits.check("max_index_bytes", size)
        data = f.read(size)
    return load_metadata(data, path)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _locations(metadata, where: str, limits: Limits) -> dict:
    """``storage_data`` as {(fqn, offsets or None): RecordLocation}."""
    storage = metadata.get("storage_data")
    if not isinstance(storage, dict):
        raise DcpError(f"{where}: storage_data is not the FileSystemWriter's dict of record locations")
    limits.check("max_index_entries", len(storage))
    found = {}
    for key, info in storage.items():
        if not isinstance(key, MetadataIndex) or not isinstance(info, StorageInfo):
            raise DcpError(f"{where}: a storage_data entry is not MetadataIndex -> _StorageInfo")
        fqn, offset = key.get("fqn"), key.get("offset")
        path, start, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(fqn, str) or not isinstance(path, str) or not _is_count(start) or not _is_count(length):
            raise DcpError(f"{where}: a storage_data entry without fqn, relative_path, offset and length")
        if info.get("transform_descriptors"):
            raise DcpError(f"{where}: {fqn!r} was saved through the transforms {info.get('transform_descriptors')} "
                           "(compression ...), which are not read here")
        found[(fqn, offset)] = RecordLocation(path, start, length)
    return found


def _entries(metadata, where: str, limits: Limits):
    """(the tensor entries, the non-tensor entries' names) of ``state_dict_metadata``."""
    entries = metadata.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise DcpError(f"{where}: state_dict_metadata is not a dict")
    limits.check("max_index_entries", len(entries))
    locations = _locations(metadata, where, limits)
    tensors, values = [], []
    chunk_budget = [limits.max_index_entries]
    for name, entry in entries.items():
        if not isinstance(name, str):
            raise DcpError(f"{where}: an entry named by a {type(name).__name__}, not a str")
        if isinstance(entry, TensorStorageMetadata):
            tensors.append(_tensor_entry(name, entry, locations, where, limits, chunk_budget))
        elif isinstance(entry, BytesStorageMetadata):
            values.append((name, _location(locations, name, None, where)))
        else:
            raise DcpError(f"{where}: entry {name!r} is neither tensor nor bytes storage metadata")
    return tensors, values


def _location(locations: dict, name: str, offsets, where: str) -> RecordLocation:
    found = locations.get((name, offsets))
    if found is None:
        at = "" if offsets is None else f" at offset {list(offsets)}"
        raise DcpError(f"{where}: no record location for {name!r}{at}")
    return found


def _tensor_entry(name: str, entry, locations: dict, where: str, limits: Limits, budget: list) -> DcpTensor:
    """A tensor entry, checked: a known dtype, a strided layout, chunks of its rank with records;
    chunks saved more than once with the same box kept once."""
    properties, shape, chunks = entry.get("properties"), entry.get("size"), entry.get("chunks")
    if not isinstance(properties, TensorProperties) or not isinstance(shape, tuple) or not isinstance(chunks, list):
        raise DcpError(f"{where}: tensor {name!r} lacks properties, size or chunks")
    dtype = properties.get("dtype")
    if not isinstance(dtype, TorchDtype) or properties.get("layout") not in (None, "strided"):
        raise DcpError(f"{where}: tensor {name!r} is not a strided tensor of a known dtype")
    limits.check("max_composite_members", len(chunks))
    budget[0] -= len(chunks)
    if budget[0] < 0:
        limits.check("max_index_entries", limits.max_index_entries - budget[0])
    kept: dict = {}
    for chunk in chunks:
        if not isinstance(chunk, ChunkStorageMetadata):
            raise DcpError(f"{where}: a chunk of {name!r} is not ChunkStorageMetadata")
        offsets, sizes = chunk.get("offsets"), chunk.get("sizes")
        if not isinstance(offsets, tuple) or not isinstance(sizes, tuple) or not len(offsets) == len(sizes) == len(shape):
            raise DcpError(f"{where}: a chunk of {name!r} has no offsets and sizes of the tensor's rank")
        if (offsets, sizes) not in kept:  # replicated: the same box saved by several ranks
            kept[(offsets, sizes)] = DcpChunk(offsets, sizes, _location(locations, name, offsets, where))
    return DcpTensor(name, dtype.name, shape, tuple(kept.values()))


# --------------------------------------------------------------------------------------
# The records: torch.save zip archives
# --------------------------------------------------------------------------------------


class _BoundedReader(io.RawIOBase):
    """A read-only file over a record's bytes for ``zipfile``: a read past
    :data:`RECORD_DIRECTORY_BYTES` is refused rather than made."""

    def __init__(self, view: memoryview, where: str):
        super().__init__()
        self.view = view
        self.where = where
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.view)}[whence]
        if base + offset < 0:
            raise OSError("seek before the record's start")
        self.pos = base + offset
        return self.pos

    def read(self, size: int = -1) -> bytes:
        end = len(self.view) if size is None or size < 0 else min(len(self.view), self.pos + size)
        if end - self.pos > RECORD_DIRECTORY_BYTES:
            raise DcpError(f"{self.where}: the record's zip directory claims {end - self.pos} bytes, more than the "
                           f"{RECORD_DIRECTORY_BYTES} read for it")
        data = bytes(self.view[self.pos:max(end, self.pos)])
        self.pos += len(data)
        return data


def _members(record: memoryview, where: str) -> dict:
    """{member name: (start, size)} of a torch.save record, each member stored (not compressed,
    not encrypted) and lying inside the record."""
    try:
        with zipfile.ZipFile(_BoundedReader(record, where)) as archive:
            infos = archive.infolist()
    except DcpError:
        raise
    except Exception as exc:  # BadZipFile, struct.error, ValueError, OSError ... of a damaged record
        raise DcpError(f"{where}: not a torch.save record ({type(exc).__name__}: {exc})") from None
    members = {}
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1 or info.file_size != info.compress_size:
            raise DcpError(f"{where}: member {info.filename!r} is compressed or encrypted (torch.save stores them)")
        members[info.filename] = _member_span(record, info, where)
    return members


def _member_span(record: memoryview, info: zipfile.ZipInfo, where: str) -> tuple:
    """(start, size) of a member's bytes, from its local header; both checked against the record."""
    at = info.header_offset
    if at < 0 or at + _LOCAL_HEADER.size > len(record):
        raise DcpError(f"{where}: member {info.filename!r} has its header past the record's {len(record)} bytes")
    signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(record, at)
    if signature != _LOCAL_SIGNATURE:
        raise DcpError(f"{where}: member {info.filename!r} has no local header at byte {at}")
    start = at + _LOCAL_HEADER.size + name_length + extra_length
    if start + info.file_size > len(record):
        raise DcpError(f"{where}: member {info.filename!r} claims {info.file_size} bytes from byte {start}, past "
                       f"the record's {len(record)}")
    return start, info.file_size


def _pickle_of(record: memoryview, members: dict, where: str, limit: str, limits: Limits) -> tuple:
    """(the archive's prefix, its ``data.pkl`` bytes -- their size checked against ``limit``)."""
    pickles = [name for name in members if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise DcpError(f"{where}: the record has {len(pickles)} data.pkl members, not one")
    prefix = pickles[0][:-len("/data.pkl")]
    order = members.get(f"{prefix}/byteorder")
    if order is not None and bytes(record[order[0]:order[0] + order[1]]) != b"little":
        raise DcpError(f"{where}: the record was saved big-endian; only little-endian records are read")
    start, size = members[pickles[0]]
    limits.check(limit, size)
    return prefix, bytes(record[start:start + size])


def _contiguous(sizes: tuple, strides: tuple) -> bool:
    """Whether ``strides`` are the row-major strides of ``sizes`` (dimensions of one element aside)."""
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _chunk_bytes(record: memoryview, where: str, dtype: str, sizes: tuple, limits: Limits) -> memoryview:
    """The bytes of one chunk's values: a slice of the record's storage member, as stored."""
    members = _members(record, where)
    prefix, data = _pickle_of(record, members, where, "max_descriptor_bytes", limits)
    tensor = load_record(data, where)
    storage = tensor.storage
    saved_dtype = tensor.dtype if storage.storage_type.dtype is None else storage.storage_type.dtype
    if saved_dtype != dtype:
        raise DcpError(f"{where}: the record holds {saved_dtype}, the metadata says {dtype}")
    itemsize = TORCH_ELEMENT_TYPES[dtype][1]
    storage_bytes = storage.numel if storage.storage_type.dtype is None else storage.numel * itemsize
    span = members.get(f"{prefix}/data/{storage.key}")
    if span is None or span[1] != storage_bytes:
        raise DcpError(f"{where}: the storage {storage.key!r} of {storage_bytes} bytes is not in the record")
    if tensor.size != sizes or not _contiguous(tensor.size, tensor.stride):
        raise DcpError(f"{where}: the record holds a tensor of size {list(tensor.size)} and stride "
                       f"{list(tensor.stride)}, not a contiguous chunk of size {list(sizes)}")
    begin = tensor.storage_offset * itemsize
    end = begin + math.prod(sizes) * itemsize
    if end > storage_bytes:
        raise DcpError(f"{where}: the chunk's {end - begin} bytes from byte {begin} run past its storage's "
                       f"{storage_bytes}")
    return record[span[0] + begin:span[0] + end]


def _value(record: memoryview, where: str, limits: Limits):
    """A non-tensor entry's value, read by the plain-value unpickler."""
    members = _members(record, where)
    _prefix, data = _pickle_of(record, members, where, "max_kv_value_bytes", limits)
    return load_value(data, where)


def kv_value(name: str, value):
    """A non-tensor value as the KV section holds it: a bool, int, float, str or bytes, or a
    non-empty list of one of them, as it is; anything else (dicts, mixed or empty lists, None) as
    its JSON text."""
    if isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (list, tuple)) and value and len({type(v) for v in value}) == 1 \
            and isinstance(value[0], (bool, int, float, str, bytes)):
        return list(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise DcpError(f"non-tensor entry {name!r} holds {type(value).__name__} the KV section cannot hold "
                       f"({exc})") from None


# --------------------------------------------------------------------------------------
# The tensors
# --------------------------------------------------------------------------------------


def _member(tag: ElementType, sizes: tuple, data: memoryview, shard):
    """A Hurray tensor over a chunk's bytes (bool re-packed 8 to a byte, the others as they are)."""
    from ..io import Tensor

    if tag == ElementType.BOOL:
        return Tensor.from_numpy(np.frombuffer(data, np.uint8).reshape(sizes) != 0, shard=shard)
    return Tensor.dense(tag, sizes, data, shard=shard)


def _source(tensor: DcpTensor, pieces: list) -> SourceTensor:
    """The :class:`SourceTensor` of a tensor entry whose chunks' bytes are ``pieces``."""
    from ..structs.element_types import numpy_dtype_of

    tag = TORCH_ELEMENT_TYPES[tensor.dtype][0]
    shape = tensor.shape
    whole = len(pieces) == 1 and tensor.chunks[0].sizes == shape and not any(tensor.chunks[0].offsets)
    dtype = np.dtype(np.uint8) if tag == ElementType.BOOL else numpy_dtype_of(tag)

    def build():
        if whole:
            return _member(tag, shape, pieces[0], None), tag != ElementType.BOOL
        from ..io import Composite
        from ..model import CompositionRule, Shard

        members = [_member(tag, chunk.sizes, data, Shard(shape, chunk.offsets))
                   for chunk, data in zip(tensor.chunks, pieces)]
        return Composite.build(CompositionRule.PARTITION, members, shape=shape, type_tag=tag), \
            tag != ElementType.BOOL

    def values() -> np.ndarray:
        """The chunks placed in one array (refused unless their bytes add up to the tensor's)."""
        if math.prod(shape) * dtype.itemsize > sum(len(p) for p in pieces):
            raise DcpError(f"tensor {tensor.name!r}: its chunks hold fewer bytes than the tensor")
        out = np.zeros(shape, dtype)
        for chunk, data in zip(tensor.chunks, pieces):
            region = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))
            out[region] = np.frombuffer(data, dtype).reshape(chunk.sizes)
        return out != 0 if tag == ElementType.BOOL else out

    label = f"torch.{tensor.dtype}" + (f" ({len(pieces)} chunks)" if len(pieces) != 1 else "")
    is_float = tag in (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32)
    return SourceTensor(tensor.name, label, sum(len(p) for p in pieces), shape, build, values, is_float)


def read_dcp(folder, limits: Optional[Limits] = None) -> tuple[dict, list, object]:
    """(the non-tensor entries for the KV section, the tensors in ``.metadata`` order, the files'
    memory maps holding their bytes) of the checkpoint folder ``folder``.  Every record is read
    and checked here, before anything is written."""
    limits = resolve_limits(limits)
    folder = os.fspath(folder)
    metadata = _read_metadata(folder, limits)
    where = os.path.join(folder, METADATA_FILE)
    tensors, values = _entries(metadata, where, limits)
    files = _Folder(folder)
    sources = []
    for tensor in tensors:
        if tensor.dtype not in TORCH_ELEMENT_TYPES:
            raise DcpError(f"{where}: tensor {tensor.name!r} has dtype torch.{tensor.dtype}, not one read here")
        pieces = [_chunk_bytes(files.view(chunk.location), _record_name(tensor.name, chunk), tensor.dtype,
                               chunk.sizes, limits) for chunk in tensor.chunks]
        sources.append(_source(tensor, pieces))
    kv = {name: kv_value(name, _value(files.view(location), f"{location.relative_path} ({name!r})", limits))
          for name, location in values}
    return kv, sources, files.maps


def _record_name(name: str, chunk: DcpChunk) -> str:
    """How an error names a chunk's record: its file, its tensor and its offsets."""
    return f"{chunk.location.relative_path} ({name!r} at {list(chunk.offsets)})"
