"""The pickles of a PyTorch Distributed Checkpoint, read without torch and without running them.

A DCP folder holds pickles in two places: the ``.metadata`` file (protocol 4; the
checkpoint's index: torch.distributed.checkpoint's ``Metadata`` dataclasses, ``torch.Size``,
dtypes, ``_StorageInfo``) and the ``data.pkl`` of each torch.save record in the ``.distcp``
files (protocol 2; ``torch._utils._rebuild_tensor_v2`` over a persistent storage id, or a plain
value for a non-tensor entry).  Each is read by a :class:`pickle.Unpickler` whose
``find_class`` admits only an explicit allow-list of ``(module, name)`` pairs, each mapped to a
small stand-in of ours: the real class is never looked up and torch is never imported.  Any
other global raises :class:`RefusedGlobal` naming it, before anything is called.

The stand-ins cannot be changed by the pickle (no instance dictionary, a ``__setstate__`` that
keeps only the fields DCP writes, callables that check their arguments), so a pickle can only
build data: the opcodes allocate no more than the bytes they are read from, and those are
checked against a budget before they are read (:mod:`.dcp_format`).
"""

from __future__ import annotations

import io
import pickle
from typing import Callable, Optional

from ..errors import HurraySchemaError

__all__ = ["DcpError", "RefusedGlobal", "load_metadata", "load_record", "load_value", "TorchDtype",
           "StorageRef", "TensorRef", "StandIn", "TORCH_DTYPES"]


class DcpError(HurraySchemaError):
    """A Distributed Checkpoint folder that cannot be read as DCP writes it."""


class RefusedGlobal(DcpError):
    """A pickle named a class or function outside the allow-list; ``name`` is ``module.name``."""

    def __init__(self, where: str, name: str):
        self.name = name
        super().__init__(f"{where}: the pickle names {name}, which is not on the allow-list of DCP's "
                         "own classes; nothing was run")


TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                "uint32", "int64", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
                "float8_e8m0fnu")
"""The torch dtypes a checkpoint may name (``torch.<name>``); each maps to a Hurray element type."""

LEGACY_STORAGES = {"HalfStorage": "float16", "BFloat16Storage": "bfloat16", "FloatStorage": "float32",
                   "DoubleStorage": "float64", "CharStorage": "int8", "ByteStorage": "uint8",
                   "ShortStorage": "int16", "IntStorage": "int32", "LongStorage": "int64", "BoolStorage": "bool",
                   "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128"}
"""torch.save's typed storage classes (``torch.<name>`` in a record's persistent id) -> their dtype."""


def _fail(message: str):
    raise DcpError(message)


class StandIn:
    """A stand-in for one of DCP's dataclasses: built empty by NEWOBJ, filled by BUILD with the
    fields listed in ``FIELDS`` (anything else is refused), immutable afterwards."""

    __slots__ = ("state",)
    FIELDS: tuple = ()

    def __new__(cls, *args):
        if args:
            _fail(f"{cls.__name__} built with arguments")
        instance = object.__new__(cls)
        object.__setattr__(instance, "state", {})
        return instance

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]  # (None, slot state): how a slotted frozen dataclass pickles
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            _fail(f"{type(self).__name__}: the state is not a dict of field names")
        unknown = set(state) - set(self.FIELDS)
        if unknown:
            _fail(f"{type(self).__name__}: unknown fields {sorted(unknown)}")
        object.__setattr__(self, "state", dict(state))

    def __setattr__(self, name, value):
        _fail(f"{type(self).__name__} is read-only")

    def get(self, field: str, default=None):
        """The field's value as the pickle gave it (``default`` when absent)."""
        return self.state.get(field, default)


class Metadata(StandIn):
    """torch.distributed.checkpoint.metadata.Metadata."""

    __slots__ = ()
    FIELDS = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class TensorStorageMetadata(StandIn):
    """...metadata.TensorStorageMetadata: properties, global size, chunks."""

    __slots__ = ()
    FIELDS = ("properties", "size", "chunks")


class ChunkStorageMetadata(StandIn):
    """...metadata.ChunkStorageMetadata: the chunk's offsets and sizes."""

    __slots__ = ()
    FIELDS = ("offsets", "sizes")


class BytesStorageMetadata(StandIn):
    """...metadata.BytesStorageMetadata: a non-tensor entry (no fields)."""

    __slots__ = ()


class MetadataIndex(StandIn):
    """...metadata.MetadataIndex: the key of ``storage_data`` (fqn, chunk offset, index hint)."""

    __slots__ = ()
    FIELDS = ("fqn", "offset", "index")


class StorageMeta(StandIn):
    """...metadata.StorageMeta (checkpoint id, save id ...; not used)."""

    __slots__ = ()
    FIELDS = ("checkpoint_id", "save_id", "load_id", "modules")


class StorageInfo(StandIn):
    """...filesystem._StorageInfo: where a record lies (relative_path, offset, length)."""

    __slots__ = ()
    FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


class TensorProperties(StandIn):
    """...metadata.TensorProperties, pickled as the tuple (dtype, layout, requires_grad,
    memory format encoding, pin_memory)."""

    __slots__ = ()
    FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")

    def __setstate__(self, state) -> None:
        if not isinstance(state, tuple) or len(state) != len(self.FIELDS):
            _fail("TensorProperties: the state is not its 5-tuple")
        super().__setstate__(dict(zip(self.FIELDS, state)))


class _Frozen:
    """A value or callable the pickle may name but never change (BUILD on it is refused)."""

    __slots__ = ()

    def __setattr__(self, name, value):
        _fail(f"{type(self).__name__} is read-only")

    def __setstate__(self, state):
        _fail(f"{self!r} cannot be given a state")


class TorchDtype(_Frozen):
    """``torch.<name>``: a dtype, known by its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        object.__setattr__(self, "name", name)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class StorageType(_Frozen):
    """A storage class named in a record's persistent id: a typed one (its dtype) or
    ``torch.storage.UntypedStorage`` (dtype None: the dtype comes with ``_rebuild_tensor_v3``)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: Optional[str]):
        object.__setattr__(self, "dtype", dtype)


class Checked(_Frozen):
    """A function the pickle may call (REDUCE): ``check(*args)`` gives its result or raises."""

    __slots__ = ("label", "check")

    def __init__(self, label: str, check: Callable):
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "check", check)

    def __call__(self, *args):
        return self.check(*args)

    def __repr__(self) -> str:
        return self.label


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(values, what: str) -> tuple:
    """A tuple of non-negative ints (a ``torch.Size``), else an error."""
    if not isinstance(values, (tuple, list)) or not all(_is_int(v) and v >= 0 for v in values):
        _fail(f"{what} is not a sequence of non-negative integers")
    return tuple(values)


def _torch_size(*args) -> tuple:
    """``torch.Size((...))``: the dimensions, as a tuple of ints."""
    if len(args) != 1:
        _fail("torch.Size takes one sequence")
    return _ints(args[0], "torch.Size")


_LAYOUTS = {"torch.strided": "strided"}


def _get_layout(name) -> str:
    """``torch.serialization._get_layout("torch.strided")``: only the strided layout."""
    if name not in _LAYOUTS:
        _fail(f"layout {name!r}: only torch.strided tensors are read")
    return _LAYOUTS[name]


def _memory_format(code) -> int:
    """``_MEM_FORMAT_ENCODING(n)``: 0 contiguous, 1 channels last, 2 preserve."""
    if not _is_int(code) or code not in (0, 1, 2):
        _fail(f"memory format encoding {code!r}")
    return code


def _path(*parts) -> str:
    """``pathlib.PosixPath(*parts)`` (the checkpoint id DCP records): the joined text, no path made."""
    if not all(isinstance(p, str) for p in parts):
        _fail("a path of non-string parts")
    return "/".join(parts)


def _latin1(text, encoding="latin1") -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocol 2 pickles bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        _fail("_codecs.encode other than of a str to latin1")
    return text.encode("latin1")


def _ordered_dict(*args) -> dict:
    """``collections.OrderedDict()``: the empty backward hooks of a saved tensor."""
    if args:
        _fail("OrderedDict with arguments")
    return {}


class TensorRef(_Frozen):
    """What ``_rebuild_tensor_v2/v3`` describes: a storage, an offset into it, a size and a stride
    (in elements), and the dtype (v3; v2 takes the storage's)."""

    __slots__ = ("storage", "storage_offset", "size", "stride", "dtype")

    def __init__(self, storage, storage_offset, size, stride, dtype: Optional[str]):
        for name, value in (("storage", storage), ("storage_offset", storage_offset), ("size", size),
                            ("stride", stride), ("dtype", dtype)):
            object.__setattr__(self, name, value)


class StorageRef(_Frozen):
    """A record's persistent storage id: its type, its key (the member ``data/<key>``) and its
    element count (bytes for an untyped storage)."""

    __slots__ = ("storage_type", "key", "numel")

    def __init__(self, storage_type: StorageType, key: str, numel: int):
        object.__setattr__(self, "storage_type", storage_type)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "numel", numel)


def _rebuild(storage, storage_offset, size, stride, requires_grad, backward_hooks, *rest, dtype=None) -> TensorRef:
    """The checked arguments of a tensor rebuild (metadata, when given, must be empty)."""
    if not isinstance(storage, StorageRef):
        _fail("a tensor rebuilt over something that is not a storage")
    if not _is_int(storage_offset) or storage_offset < 0:
        _fail(f"storage offset {storage_offset!r}")
    size, stride = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if len(size) != len(stride) or not isinstance(requires_grad, bool) or backward_hooks != {}:
        _fail("a tensor rebuild with mismatched size and stride, or with hooks")
    if rest and rest[0]:
        _fail("a tensor rebuild with tensor metadata")
    return TensorRef(storage, storage_offset, size, stride, dtype)


def _rebuild_v2(*args) -> TensorRef:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])``."""
    if len(args) not in (6, 7):
        _fail("_rebuild_tensor_v2 takes 6 or 7 arguments")
    return _rebuild(*args)


def _rebuild_v3(*args) -> TensorRef:
    """``torch._utils._rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])``."""
    if len(args) not in (7, 8) or not isinstance(args[6], TorchDtype):
        _fail("_rebuild_tensor_v3 takes 7 or 8 arguments, the 7th a dtype")
    return _rebuild(*args[:6], *args[7:], dtype=args[6].name)


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"

_DTYPES = {("torch", name): TorchDtype(name) for name in TORCH_DTYPES}

METADATA_GLOBALS = {
    (_METADATA_MODULE, "Metadata"): Metadata,
    (_METADATA_MODULE, "TensorStorageMetadata"): TensorStorageMetadata,
    (_METADATA_MODULE, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_METADATA_MODULE, "BytesStorageMetadata"): BytesStorageMetadata,
    (_METADATA_MODULE, "MetadataIndex"): MetadataIndex,
    (_METADATA_MODULE, "TensorProperties"): TensorProperties,
    (_METADATA_MODULE, "StorageMeta"): StorageMeta,
    (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"): Checked("_MEM_FORMAT_ENCODING", _memory_format),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): Checked("torch.Size", _torch_size),
    ("torch.serialization", "_get_layout"): Checked("torch.serialization._get_layout", _get_layout),
    ("pathlib", "PosixPath"): Checked("pathlib.PosixPath", _path),
    ("pathlib", "PurePosixPath"): Checked("pathlib.PurePosixPath", _path),
    **_DTYPES,
}
"""What DCP's ``.metadata`` is made of (torch/distributed/checkpoint/metadata.py, filesystem.py;
torch.serialization pickles a layout by ``_get_layout``), each mapped to its stand-in."""

RECORD_GLOBALS = {
    ("torch._utils", "_rebuild_tensor_v2"): Checked("torch._utils._rebuild_tensor_v2", _rebuild_v2),
    ("torch._utils", "_rebuild_tensor_v3"): Checked("torch._utils._rebuild_tensor_v3", _rebuild_v3),
    ("collections", "OrderedDict"): Checked("collections.OrderedDict", _ordered_dict),
    ("torch.storage", "UntypedStorage"): StorageType(None),
    **{("torch", name): StorageType(dtype) for name, dtype in LEGACY_STORAGES.items()},
    **_DTYPES,
}
"""What torch.save writes in the ``data.pkl`` of one tensor (torch/_utils.py, torch/serialization.py)."""

VALUE_GLOBALS = {
    ("_codecs", "encode"): Checked("_codecs.encode", _latin1),
}
"""What a plain value's ``data.pkl`` may name: protocol 2 pickles bytes by ``_codecs.encode``."""


class _Restricted(pickle.Unpickler):
    """An unpickler resolving globals only through ``allowed``; persistent ids (a record's
    storages) only where ``storages`` is given."""

    def __init__(self, data: bytes, where: str, allowed: dict, storages: bool):
        super().__init__(io.BytesIO(data))
        self.where = where
        self.allowed = allowed
        self.storages = storages

    def find_class(self, module, name):
        found = self.allowed.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
        if found is None:
            raise RefusedGlobal(self.where, f"{module}.{name}")
        return found

    def persistent_load(self, pid):
        if not self.storages:
            _fail(f"{self.where}: a persistent id in a pickle that holds no tensor")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], StorageType) and isinstance(pid[2], str) and isinstance(pid[3], str)
                and _is_int(pid[4]) and pid[4] >= 0):
            _fail(f"{self.where}: a persistent id that is not ('storage', type, key, location, numel)")
        return StorageRef(pid[1], pid[2], pid[4])


def _load(data: bytes, where: str, allowed: dict, storages: bool = False):
    """The object the pickle ``data`` builds from stand-ins; every failure a :class:`DcpError`."""
    try:
        return _Restricted(data, where, allowed, storages).load()
    except HurraySchemaError:
        raise
    except RecursionError:
        raise DcpError(f"{where}: the pickle nests too deeply") from None
    except Exception as exc:  # UnpicklingError, EOFError, ValueError, TypeError ... of a malformed pickle
        raise DcpError(f"{where}: not a readable pickle ({type(exc).__name__}: {exc})") from None


def load_metadata(data: bytes, where: str) -> Metadata:
    """The checkpoint's ``.metadata`` as stand-ins (``Metadata`` at the top)."""
    metadata = _load(data, where, METADATA_GLOBALS)
    if not isinstance(metadata, Metadata):
        _fail(f"{where}: the pickle is not a DCP Metadata")
    return metadata


def load_record(data: bytes, where: str) -> TensorRef:
    """The tensor a record's ``data.pkl`` rebuilds, as a :class:`TensorRef`."""
    tensor = _load(data, where, RECORD_GLOBALS, storages=True)
    if not isinstance(tensor, TensorRef):
        _fail(f"{where}: the record holds no single tensor")
    return tensor


PLAIN_DEPTH = 32
"""How deep a non-tensor value may nest (lists and dicts)."""


def load_value(data: bytes, where: str):
    """A non-tensor entry's value: ints, floats, str, bytes, bools, None, and lists, tuples and
    dicts of them (no other object), at most :data:`PLAIN_DEPTH` deep."""
    value = _load(data, where, VALUE_GLOBALS)
    _check_plain(value, where, [len(data) + 1])
    return value


def _check_plain(value, where: str, budget: list, depth: int = 0) -> None:
    """``value`` is plain data.  ``budget`` counts the nodes visited, shared ones each time they are
    met: a tree built by a pickle has no more nodes than the pickle has bytes, while one object
    referenced twice at every level of a deep nest would take exponential time to walk or to write."""
    budget[0] -= 1
    if budget[0] < 0 or depth > PLAIN_DEPTH:
        _fail(f"{where}: the value nests deeper than {PLAIN_DEPTH} or shares more parts than its pickle has bytes")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(item, where, budget, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where, budget, depth + 1)
            _check_plain(item, where, budget, depth + 1)
        return
    _fail(f"{where}: a non-tensor value of type {type(value).__name__}")
