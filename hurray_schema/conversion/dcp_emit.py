"""The pickles and records of a PyTorch Distributed Checkpoint, written without torch.

The reverse of :mod:`.dcp_pickle`: objects of ours that pickle as torch's own.  A class or value
of torch is named by a :class:`TorchName` (its module and name), which :class:`TorchPickler`
writes as the global opcode pickle itself writes for it (``STACK_GLOBAL`` at protocol 4,
``GLOBAL`` at protocol 2) -- without importing the module, which pickle's own ``save_global``
would do to check the name.  Everything else (memoization, framing, ``NEWOBJ`` + ``BUILD`` of a
dataclass instance, ``REDUCE`` of a ``__reduce__``) is pickle's own code: the stand-ins below
reduce exactly as torch's classes do (torch/distributed/checkpoint/metadata.py, filesystem.py),
so the bytes are those ``pickle.dump`` writes for torch's objects of the same state.

:func:`tensor_record` and :func:`value_record` are what ``torch.save`` writes into a ``.distcp``
file for one tensor chunk or one non-tensor value: a zip archive as torch's
``PyTorchStreamWriter`` lays it out -- members stored, each one's data aligned to
:data:`STORAGE_ALIGNMENT` bytes from the record's start by an ``FB`` extra field of ``Z``
padding, sizes and CRC-32 in a data descriptor after the data, then the central directory and the
zip64 end records.  The member names and contents are those torch 2.x writes
(``archive/data.pkl``, ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/0``,
``version``, ``.data/serialization_id``).
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zlib
from typing import Iterable, Optional

from .dcp_pickle import DcpError, LEGACY_STORAGES

__all__ = ["TorchName", "TorchPickler", "dumps", "Size", "TensorProperties", "TensorStorageMetadata",
           "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex", "StorageInfo", "StorageMeta",
           "Metadata", "dtype", "tensor_record", "value_record", "contiguous_strides", "MAX_MEMBER_BYTES",
           "STORAGE_ALIGNMENT", "DCP_VERSION", "METADATA_PROTOCOL", "RECORD_PROTOCOL"]

METADATA_PROTOCOL = 4
"""What ``pickle.dump`` uses by default on Python 3.8 to 3.13, as FileSystemWriter's ``finish`` calls it."""

RECORD_PROTOCOL = 2
"""torch.save's ``DEFAULT_PROTOCOL``."""

DCP_VERSION = "1.0.0"
"""FileSystemWriter's ``CURRENT_DCP_VERSION``, recorded in ``Metadata.version``."""

STORAGE_ALIGNMENT = 64
"""``kFieldAlignment`` of torch's zip writer: every member's data starts at a multiple of it."""

MAX_MEMBER_BYTES = 0xFFFFFFFF - 1
"""The largest member written: past it torch's writer adds zip64 extra fields, not written here."""

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_FILESYSTEM_MODULE = "torch.distributed.checkpoint.filesystem"
_TORCH = "torch"
# torch.Size's ``__module__`` is a string object of its own (pickle writes it again rather than
# referring to the dtypes' "torch"): a distinct object keeps the memo as torch's.
_SIZE_MODULE = "".join(("tor", "ch"))


# --------------------------------------------------------------------------------------
# Naming torch's globals without importing torch
# --------------------------------------------------------------------------------------


class TorchName(type):
    """The metaclass of our stand-ins for torch's classes: ``torch_name`` is (module, name)."""

    torch_name: tuple = ("", "")


class TorchValue:
    """A torch global that is not a class (a dtype, a function) named by (module, name)."""

    __slots__ = ("torch_name",)

    def __init__(self, module: str, name: str):
        self.torch_name = (module, name)

    def __repr__(self) -> str:
        return ".".join(self.torch_name)

    def __call__(self, *args):
        """Never called: pickle requires what it reduces by to be callable."""
        raise DcpError(f"{self!r} is a name written into a pickle, not torch's function")


class TorchPickler(pickle._Pickler):  # the Python pickler: its save_global can be replaced, the C one's not
    """A pickler writing :class:`TorchName` classes and :class:`TorchValue` s as the globals they
    name; everything else as :class:`pickle.Pickler` does."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_torch_global(self, obj) -> None:
        """The global opcode of ``obj.torch_name`` (pickle's ``save_global`` without the import)."""
        module, name = obj.torch_name
        if self.proto >= 4:
            self.save(module)
            self.save(name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode("utf-8"))
        self.memoize(obj)

    dispatch[TorchName] = save_torch_global
    dispatch[TorchValue] = save_torch_global


def dumps(obj, protocol: int) -> bytes:
    """``obj`` pickled by :class:`TorchPickler` at ``protocol``."""
    out = io.BytesIO()
    TorchPickler(out, protocol=protocol).dump(obj)
    return out.getvalue()


_DTYPES: dict = {}


def dtype(name: str) -> TorchValue:
    """``torch.<name>`` (one object per name, as torch's dtypes are: pickle refers back to it)."""
    if name not in _DTYPES:
        _DTYPES[name] = TorchValue(_TORCH, name)
    return _DTYPES[name]


_SIZE = TorchValue(_SIZE_MODULE, "Size")
_GET_LAYOUT = TorchValue("torch.serialization", "_get_layout")
_POSIX_PATH = TorchValue("pathlib", "PosixPath")


class Size:
    """``torch.Size``: reduces to ``torch.Size((d0, d1, ...))``."""

    __slots__ = ("dims",)

    def __init__(self, dims: Iterable[int]):
        self.dims = tuple(int(d) for d in dims)

    def __reduce__(self):
        return _SIZE, (tuple(list(self.dims)),)  # a new tuple each time, as tuple(torch.Size) is


class _Layout:
    """``torch.strided``: reduces to ``torch.serialization._get_layout("torch.strided")``."""

    __slots__ = ()

    def __reduce__(self):
        return _GET_LAYOUT, ("torch.strided",)


STRIDED = _Layout()


class _MemoryFormatClass(metaclass=TorchName):
    """``_MEM_FORMAT_ENCODING`` (an Enum): its members reduce to ``_MEM_FORMAT_ENCODING(value)``."""

    torch_name = (_METADATA_MODULE, "_MEM_FORMAT_ENCODING")


class _MemoryFormat:
    """``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT``."""

    __slots__ = ()

    def __reduce__(self):
        return _MemoryFormatClass, (0,)


CONTIGUOUS = _MemoryFormat()


class PosixPath:
    """``pathlib.PosixPath`` of the checkpoint folder: reduces to ``PosixPath(*parts)``."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple):
        self.parts = tuple(parts)

    def __reduce__(self):
        return _POSIX_PATH, self.parts


class _Dataclass:
    """A stand-in for one of DCP's dataclasses: its fields in ``__dict__`` in declaration order,
    so that ``object.__reduce_ex__`` gives ``NEWOBJ`` of the class and ``BUILD`` of that dict."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class TensorProperties(_Dataclass, metaclass=TorchName):
    """``TensorProperties(dtype)`` of a strided, contiguous tensor; ``__getstate__`` as torch's: a 5-tuple."""

    torch_name = (_METADATA_MODULE, "TensorProperties")

    def __init__(self, dtype_name: str):
        super().__init__(dtype=dtype(dtype_name))

    def __getstate__(self):
        return self.dtype, STRIDED, False, CONTIGUOUS, False


class ChunkStorageMetadata(_Dataclass, metaclass=TorchName):
    """One chunk: ``offsets`` and ``sizes`` (torch.Size each)."""

    torch_name = (_METADATA_MODULE, "ChunkStorageMetadata")

    def __init__(self, offsets, sizes):
        super().__init__(offsets=Size(offsets), sizes=Size(sizes))


class TensorStorageMetadata(_Dataclass, metaclass=TorchName):
    """A tensor entry: properties, global size, chunks."""

    torch_name = (_METADATA_MODULE, "TensorStorageMetadata")

    def __init__(self, dtype_name: str, size, chunks: list):
        super().__init__(properties=TensorProperties(dtype_name), size=Size(size), chunks=list(chunks))


class BytesStorageMetadata(_Dataclass, metaclass=TorchName):
    """A non-tensor entry (no fields)."""

    torch_name = (_METADATA_MODULE, "BytesStorageMetadata")


class MetadataIndex(_Dataclass, metaclass=TorchName):
    """The key of ``storage_data``: ``fqn``, then ``index`` (the chunk's position in its entry), then
    ``offset`` only for a tensor chunk -- the order and the omission of torch's ``__init__``."""

    torch_name = (_METADATA_MODULE, "MetadataIndex")

    def __init__(self, fqn: str, offset=None, index: Optional[int] = None):
        super().__init__(fqn=fqn, index=index)
        if offset is not None:
            self.offset = Size(offset)


class StorageInfo(_Dataclass, metaclass=TorchName):
    """``_StorageInfo(relative_path, offset, length)`` (no transforms: the field is left out, as
    torch's ``__getstate__`` leaves out None)."""

    torch_name = (_FILESYSTEM_MODULE, "_StorageInfo")

    def __init__(self, relative_path: str, offset: int, length: int):
        super().__init__(relative_path=relative_path, offset=offset, length=length)


class StorageMeta(_Dataclass, metaclass=TorchName):
    """``StorageMeta(checkpoint_id, save_id)`` as FileSystemWriter's ``storage_meta`` makes it."""

    torch_name = (_METADATA_MODULE, "StorageMeta")

    def __init__(self, checkpoint_parts: tuple, save_id: str):
        super().__init__(checkpoint_id=PosixPath(checkpoint_parts), save_id=save_id, load_id=None, modules=[])


class Metadata(_Dataclass, metaclass=TorchName):
    """The checkpoint's ``Metadata``."""

    torch_name = (_METADATA_MODULE, "Metadata")

    def __init__(self, state_dict_metadata: dict, planner_data: dict, storage_data: dict, storage_meta: StorageMeta):
        super().__init__(state_dict_metadata=state_dict_metadata, planner_data=planner_data,
                         storage_data=storage_data, storage_meta=storage_meta, version=DCP_VERSION)


# --------------------------------------------------------------------------------------
# torch.save records
# --------------------------------------------------------------------------------------

_REBUILD_V2 = TorchValue("torch._utils", "_rebuild_tensor_v2")
_REBUILD_V3 = TorchValue("torch._utils", "_rebuild_tensor_v3")
_UNTYPED_STORAGE = TorchValue("torch.storage", "UntypedStorage")
_ORDERED_DICT = TorchValue("collections", "OrderedDict")
_TYPED_STORAGES = {dtype_name: TorchValue(_TORCH, storage) for storage, dtype_name in LEGACY_STORAGES.items()}
"""dtype -> torch.save's typed storage class; the other dtypes go through ``_rebuild_tensor_v3``
over an ``UntypedStorage`` (uint16/32/64, the float8 types), as torch.save writes them."""

_STORAGE_KEY = "0"
_LOCATION = "cpu"


class _EmptyOrderedDict:
    """``collections.OrderedDict()``: the backward hooks of a saved tensor."""

    __slots__ = ()

    def __reduce__(self):
        return _ORDERED_DICT, ()


class _Rebuild:
    """``_rebuild_tensor_v2/v3(storage, 0, size, stride, False, OrderedDict()[, dtype])``."""

    __slots__ = ("args", "v3")

    def __init__(self, args: tuple, v3: bool):
        self.args = args
        self.v3 = v3

    def __reduce__(self):
        return (_REBUILD_V3 if self.v3 else _REBUILD_V2), self.args


class _RecordPickler(TorchPickler):
    """torch.save's pickler: the storage a persistent id ``('storage', type, key, location, numel)``."""

    def persistent_id(self, obj):
        if isinstance(obj, tuple) and len(obj) == 2 and obj[0] is _STORAGE_MARK:
            return obj[1]
        return None


_STORAGE_MARK = object()


def contiguous_strides(sizes: tuple) -> tuple:
    """Row-major strides in elements, as torch computes them (a dimension of 0 counted as 1)."""
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _tensor_pickle(dtype_name: str, sizes: tuple, itemsize: int) -> bytes:
    """The ``data.pkl`` torch.save writes for a contiguous tensor of ``sizes`` over its own storage."""
    numel = math.prod(sizes)
    typed = _TYPED_STORAGES.get(dtype_name)
    storage_id = ("storage", typed or _UNTYPED_STORAGE, _STORAGE_KEY, _LOCATION,
                  numel if typed is not None else numel * itemsize)
    args = [(_STORAGE_MARK, storage_id), 0, tuple(list(sizes)), contiguous_strides(sizes), False,  # new tuples
            _EmptyOrderedDict()]
    if typed is None:
        args.append(dtype(dtype_name))
    out = io.BytesIO()
    _RecordPickler(out, protocol=RECORD_PROTOCOL).dump(_Rebuild(tuple(args), typed is None))
    return out.getvalue()


def tensor_record(dtype_name: str, sizes: tuple, itemsize: int, data) -> list:
    """The pieces (bytes and the chunk's own buffer) of the torch.save record of one chunk."""
    return _zip_record(_tensor_pickle(dtype_name, sizes, itemsize), data)


def value_record(value) -> list:
    """The pieces of the torch.save record of a plain value (no storage)."""
    return _zip_record(pickle.dumps(value, protocol=RECORD_PROTOCOL), None)


# --------------------------------------------------------------------------------------
# The zip archive torch's writer lays out
# --------------------------------------------------------------------------------------

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_DESCRIPTOR = struct.Struct("<4sIII")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_END = struct.Struct("<4sHHHHIIH")
_UTF8_NAMES = 0x0800
_FLAGS = 0x0808  # sizes in a data descriptor; UTF-8 names
_ZIP64_MADE_BY, _ZIP64_NEEDED = 0x031E, 0x002D
_ARCHIVE = "archive"


def _members(data_pkl: bytes, storage) -> list:
    """(name, content) in torch's order."""
    members = [("data.pkl", data_pkl), (".format_version", b"1"),
               (".storage_alignment", str(STORAGE_ALIGNMENT).encode("ascii")), ("byteorder", b"little")]
    if storage is not None:
        members.append((f"data/{_STORAGE_KEY}", storage))
    members.append(("version", b"3\n"))
    members = [(name, memoryview(content).cast("B")) for name, content in members]
    members.append((".data/serialization_id", _serialization_id(members)))
    return [(f"{_ARCHIVE}/{name}".encode("utf-8"), content) for name, content in members]


_WORD = (1 << 64) - 1
_MURMUR_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_STD_HASH_SEED = 0xC70F6907


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def _std_hash(data: bytes) -> int:
    """libstdc++'s ``std::hash<std::string>`` on a 64-bit platform (``_Hash_bytes``, MurmurHash2 64)."""
    whole = len(data) & ~7
    value = (_STD_HASH_SEED ^ (len(data) * _MURMUR_MUL)) & _WORD
    for at in range(0, whole, 8):
        word = (_shift_mix(int.from_bytes(data[at:at + 8], "little") * _MURMUR_MUL & _WORD) * _MURMUR_MUL) & _WORD
        value = ((value ^ word) * _MURMUR_MUL) & _WORD
    if len(data) & 7:
        value = ((value ^ int.from_bytes(data[whole:], "little")) * _MURMUR_MUL) & _WORD
    return _shift_mix((_shift_mix(value) * _MURMUR_MUL) & _WORD)


def _hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit words."""
    return (seed ^ ((value + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _WORD)) & _WORD


def _serialization_id(members: list) -> bytes:
    """What torch's writer records as ``.data/serialization_id``: 20 digits of its record names'
    hashes combined, in the order its ``unordered_set`` gives them back (for these few names, the
    reverse of the order written), then 20 digits of the CRC-32s of its data descriptors combined in
    order (an empty member has none)."""
    names = 0
    for name, _content in reversed(members):
        names = _hash_combine(names, _std_hash(name.encode("utf-8")))
    crcs = 0
    for _name, content in members:
        if len(content):  # torch's writer counts the CRC-32 of each data descriptor it writes
            crcs = _hash_combine(crcs, zlib.crc32(content))
    return f"{names:020d}{crcs:020d}".encode("ascii")


def _zip_record(data_pkl: bytes, storage) -> list:
    """The record's pieces: each member's local header, data and descriptor, then the directory."""
    pieces: list = []
    entries = []
    cursor = 0
    for name, content in _members(data_pkl, storage):
        if len(content) > MAX_MEMBER_BYTES:
            raise DcpError(f"a chunk of {len(content)} bytes: torch writes a member of 4 GiB or more with zip64 "
                           "fields, not written here (partition the tensor into smaller members)")
        start = cursor + _LOCAL.size + len(name) + 4
        padding = -start % STORAGE_ALIGNMENT
        extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding
        crc = zlib.crc32(content)
        flags = _FLAGS if len(content) else _UTF8_NAMES  # an empty member has no data descriptor
        pieces += [_LOCAL.pack(b"PK\x03\x04", 0, flags, 0, 0, 0, 0, 0, 0, len(name), len(extra)) + name + extra,
                   content]
        if len(content):
            pieces.append(_DESCRIPTOR.pack(b"PK\x07\x08", crc, len(content), len(content)))
        entries.append((name, flags, crc, len(content), cursor))
        cursor += _LOCAL.size + len(name) + len(extra) + len(content) + (_DESCRIPTOR.size if len(content) else 0)
    directory = b"".join(_CENTRAL.pack(b"PK\x01\x02", 0, 0, flags, 0, 0, 0, crc, size, size, len(name), 0, 0,
                                       0, 0, 0, offset) + name for name, flags, crc, size, offset in entries)
    end64 = cursor + len(directory)
    count = len(entries)
    pieces.append(directory
                  + _ZIP64_END.pack(b"PK\x06\x06", _ZIP64_END.size - 12, _ZIP64_MADE_BY, _ZIP64_NEEDED, 0, 0,
                                    count, count, len(directory), cursor)
                  + _ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, end64, 1)
                  + _END.pack(b"PK\x05\x06", 0, 0, count, count, len(directory), cursor, 0))
    return pieces
