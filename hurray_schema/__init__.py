"""hurray_schema: read, write, validate and evaluate Hurray tensors.

The public API is re-exported here; see README.md.  Every name is imported on first use
(PEP 562), so ``import hurray_schema`` costs next to nothing and a program pays only for what
it touches: reading a file loads neither the evaluator (numba) nor the transport nor the tools.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    ".audit": ("audit", "AuditReport"),
    ".codec": ("decode_descriptor", "encode_descriptor", "parse_descriptor"),
    ".errors": (
        "HurraySchemaError", "LimitExceeded", "SpecViolation", "EncodeError", "FieldRangeError", "DeviceUnavailable",
        "InvalidMessage", "LayoutUnavailable", "MessageTooLarge", "ProtocolVersionMismatch", "SessionError",
        "SessionTimeout", "ShardMismatch", "TranscodeLimitExceeded", "UnknownTensor", "AdvancedIndexUnsupported",
        "CopyRequired", "DLPackUnsupported", "IndexRangeError", "IndexTypeError", "InvalidDtype", "NotAnArray",
        "NoSuchItem",
    ),
    ".limits": ("DEFAULT_LIMITS", "Limits"),
    ".io": (
        "ClosedFileError", "Composite", "HurrayFile", "IndexEntry", "RemoteError", "StreamReader", "StreamWriter",
        "Tensor", "TensorSlice", "UInt64", "load", "read_file", "read_stream", "save", "write_file", "write_stream"
    ),
    ".builders": (
        "from_scipy", "group", "overlay", "partition", "per_block_from_codes", "per_block_from_packed", "quantize",
        "sparse_coo", "sparse_csc", "sparse_csr", "spqr"
    ),
    ".model": (
        "DYNAMIC_DIMENSION", "BlockPagedLayout", "BlockTableIndexType", "BufferHandle", "ColumnMajorLayout",
        "CombineOp", "CompositeLayout", "CompositeMember", "CompositionRule", "CooLayout", "CscLayout", "CsfLayout",
        "CsrLayout", "DescriptorFlag", "DeviceTag", "ElementType", "ExtensionLayout", "ExtensionType",
        "HilbertLayout", "KvRole", "LayoutTag", "MemberRole", "MemoryClass", "MortonLayout", "Mxfp", "Nf4",
        "PerBlockAffine", "PerChannelAffine", "PerTensorAffine", "QuantFlag", "QuantScheme", "RowMajorLayout",
        "Shard", "Statistics", "StatisticsMask", "StridedLayout", "SyncMode", "TensorDescriptor", "TiledLayout",
        "UnknownLayout", "UnknownQuantization"
    ),
    ".rules.composite": ("CompositeValidator",),
    ".rules.engine": ("Finding", "Level", "Mode", "Report"),
    ".evaluate": ("DecodedTypeMismatch", "UnsupportedEvaluation", "lookup", "materialize", "tensor_to_numpy"),
    ".conversion": ("convert", "ConvertReport", "TensorReport", "NoExactForm"),
    ".export": ("export_npy", "export_zarr", "Exported"),
    ".net": ("serve", "connect", "Server", "Session"),
}
"""Where each public name lives: module (relative to this package) -> names."""

_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    """A public name, imported from its module on first use (then kept here); a subpackage by its name."""
    module = _HOME.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)  # a submodule (``hs.rules``), imported on first use
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package, whose public function ``audit`` keeps its name when the submodule of the same
    name is first imported (the import system binds a submodule on its package as it loads it); the
    submodule stays ``sys.modules["hurray_schema.audit"]``, as ``from .audit import ...`` finds it."""

    def __setattr__(self, name: str, value) -> None:
        if name in _HOME and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what static analysis sees: the names imported eagerly
    from .audit import audit, AuditReport
    from .codec import decode_descriptor, encode_descriptor, parse_descriptor
    from .errors import (
        HurraySchemaError, LimitExceeded, SpecViolation, EncodeError, FieldRangeError, DeviceUnavailable,
        InvalidMessage, LayoutUnavailable, MessageTooLarge, ProtocolVersionMismatch, SessionError, SessionTimeout,
        ShardMismatch, TranscodeLimitExceeded, UnknownTensor, AdvancedIndexUnsupported, CopyRequired,
        DLPackUnsupported, IndexRangeError, IndexTypeError, InvalidDtype, NotAnArray, NoSuchItem
    )
    from .limits import DEFAULT_LIMITS, Limits
    from .io import (
        ClosedFileError, Composite, HurrayFile, IndexEntry, RemoteError, StreamReader, StreamWriter, Tensor,
        TensorSlice, UInt64, load, read_file, read_stream, save, write_file, write_stream
    )
    from .builders import (
        from_scipy, group, overlay, partition, per_block_from_codes, per_block_from_packed, quantize, sparse_coo,
        sparse_csc, sparse_csr, spqr
    )
    from .model import (
        DYNAMIC_DIMENSION, BlockPagedLayout, BlockTableIndexType, BufferHandle, ColumnMajorLayout, CombineOp,
        CompositeLayout, CompositeMember, CompositionRule, CooLayout, CscLayout, CsfLayout, CsrLayout, DescriptorFlag,
        DeviceTag, ElementType, ExtensionLayout, ExtensionType, HilbertLayout, KvRole, LayoutTag, MemberRole,
        MemoryClass, MortonLayout, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine, QuantFlag,
        QuantScheme, RowMajorLayout, Shard, Statistics, StatisticsMask, StridedLayout, SyncMode, TensorDescriptor,
        TiledLayout, UnknownLayout, UnknownQuantization
    )
    from .rules.composite import CompositeValidator
    from .rules.engine import Finding, Level, Mode, Report
    from .evaluate import DecodedTypeMismatch, UnsupportedEvaluation, lookup, materialize, tensor_to_numpy
    from .conversion import convert, ConvertReport, TensorReport, NoExactForm
    from .export import export_npy, export_zarr, Exported
    from .net import serve, connect, Server, Session

__all__ = [
    "Composite", "HurrayFile", "IndexEntry", "RemoteError", "StreamReader", "Tensor", "UInt64",
    "read_file", "read_stream", "write_file", "write_stream", "load", "save", "StreamWriter", "ClosedFileError",
    "TensorSlice",
    "quantize", "per_block_from_codes", "per_block_from_packed", "spqr", "sparse_coo", "sparse_csr", "sparse_csc", "from_scipy", "partition", "overlay", "group",
    "DEFAULT_LIMITS", "Limits", "DecodedTypeMismatch", "UnsupportedEvaluation", "lookup", "materialize", "tensor_to_numpy",
    "audit", "AuditReport", "CompositeValidator", "Finding", "Level", "Mode", "Report", "parse_descriptor",
    "decode_descriptor", "encode_descriptor", "HurraySchemaError", "LimitExceeded", "SpecViolation",
    "DYNAMIC_DIMENSION", "BlockPagedLayout", "BlockTableIndexType", "BufferHandle", "ColumnMajorLayout",
    "CombineOp", "CompositeLayout", "CompositeMember", "CompositionRule", "CooLayout", "CscLayout",
    "CsfLayout", "CsrLayout", "DescriptorFlag", "DeviceTag", "ElementType", "ExtensionLayout",
    "ExtensionType", "HilbertLayout", "KvRole", "LayoutTag", "MemberRole", "MemoryClass", "MortonLayout",
    "Mxfp", "Nf4", "PerBlockAffine", "PerChannelAffine", "PerTensorAffine", "QuantFlag", "QuantScheme",
    "RowMajorLayout", "Shard", "Statistics", "StatisticsMask", "StridedLayout", "SyncMode",
    "TensorDescriptor", "TiledLayout", "UnknownLayout", "UnknownQuantization",
    "EncodeError", "FieldRangeError",
    "AdvancedIndexUnsupported", "CopyRequired", "DLPackUnsupported", "IndexRangeError", "IndexTypeError",
    "InvalidDtype", "NotAnArray",
    "convert", "ConvertReport", "TensorReport", "NoExactForm", "export_npy", "export_zarr", "Exported", "NoSuchItem",
    "serve", "connect", "Server", "Session", "SessionError", "SessionTimeout", "ProtocolVersionMismatch",
    "UnknownTensor", "LayoutUnavailable", "TranscodeLimitExceeded", "DeviceUnavailable", "InvalidMessage",
    "MessageTooLarge", "ShardMismatch",
]
