"""hurray_schema: read, write, validate and evaluate Hurray tensors.

The top level lists what a user calls and holds: readers and writers, ``audit``, ``convert``,
``serve``/``connect``, the builders, ``Tensor``/``Composite``, the limits and the two base
errors.  Model types live in :mod:`hurray_schema.model`, errors in :mod:`hurray_schema.errors`;
their former top-level names still resolve but are not listed.  Every name is imported on first
use (:mod:`._lazy`), so ``import hurray_schema`` costs next to nothing: reading a file loads
neither the evaluator (numba) nor the transport nor the tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".io": (
        "load", "save", "read_file", "read_stream", "write_file", "write_stream", "Tensor", "Composite",
        "HurrayFile", "StreamReader", "StreamWriter",
    ),
    ".io.native": ("from_hurray",),
    ".codec": ("decode_descriptor", "encode_descriptor"),
    ".audit": ("audit",),
    ".conversion": ("convert",),
    ".export": ("export_npy", "export_zarr"),
    ".net": ("serve", "connect"),
    ".builders": (
        "partition", "overlay", "group", "quantize", "spqr", "sparse_coo", "sparse_csr", "sparse_csc", "from_scipy",
        "per_block_from_codes", "per_block_from_packed",
    ),
    ".limits": ("Limits", "DEFAULT_LIMITS"),
    ".errors": ("HurraySchemaError", "SpecViolation"),
}, unlisted={  # former top-level names: reached from their modules now
    ".audit": ("AuditReport",),
    ".codec": ("parse_descriptor",),
    ".errors": (
        "LimitExceeded", "EncodeError", "FieldRangeError", "DeviceUnavailable", "InvalidMessage", "LayoutUnavailable",
        "MessageTooLarge", "ProtocolVersionMismatch", "SessionError", "SessionTimeout", "ShardMismatch",
        "TranscodeLimitExceeded", "UnknownTensor", "AdvancedIndexUnsupported", "CopyRequired", "DLPackUnsupported",
        "IndexRangeError", "IndexTypeError", "InvalidDtype", "NotAnArray", "NoSuchItem", "ClosedFileError",
        "RemoteError", "DecodedTypeMismatch", "UnsupportedEvaluation", "NoExactForm",
        "NativeProtocolError", "NativeAbiUnavailable", "CapsuleError", "CapsuleConsumed", "AbiVersionMismatch",
        "CapsuleBufferError",
    ),
    ".io": ("IndexEntry", "TensorSlice", "UInt64"),
    ".model": (
        "DYNAMIC_DIMENSION", "BlockPagedLayout", "BlockTableIndexType", "BufferHandle", "ColumnMajorLayout",
        "CombineOp", "CompositeLayout", "CompositeMember", "CompositionRule", "CooLayout", "CscLayout", "CsfLayout",
        "CsrLayout", "DescriptorFlag", "DeviceTag", "ElementType", "ExtensionLayout", "ExtensionType",
        "HilbertLayout", "KvRole", "LayoutTag", "MemberRole", "MemoryClass", "MortonLayout", "Mxfp", "Nf4",
        "PerBlockAffine", "PerChannelAffine", "PerTensorAffine", "QuantFlag", "QuantScheme", "RowMajorLayout",
        "Shard", "Statistics", "StatisticsMask", "StridedLayout", "SyncMode", "TensorDescriptor", "TiledLayout",
        "UnknownLayout", "UnknownQuantization",
    ),
    ".rules.composite": ("CompositeValidator",),
    ".rules.engine": ("Finding", "Level", "Mode", "Report"),
    ".evaluate": ("lookup", "materialize", "tensor_to_numpy"),  # methods of Tensor and Composite
    ".conversion": ("ConvertReport", "TensorReport"),
    ".export": ("Exported",),
    ".net": ("Server", "Session"),
}, submodules=True)

if TYPE_CHECKING:  # what static analysis sees: the listed names imported eagerly
    from .audit import audit  # noqa: F401
    from .builders import (  # noqa: F401 (listed, imported lazily)
        from_scipy, group, overlay, partition, per_block_from_codes, per_block_from_packed, quantize, sparse_coo,
        sparse_csc, sparse_csr, spqr,
    )
    from .codec import decode_descriptor, encode_descriptor  # noqa: F401
    from .conversion import convert  # noqa: F401
    from .errors import HurraySchemaError, SpecViolation  # noqa: F401
    from .export import export_npy, export_zarr  # noqa: F401
    from .io import (  # noqa: F401 (listed, imported lazily)
        Composite, HurrayFile, StreamReader, StreamWriter, Tensor, load, read_file, read_stream, save, write_file,
        write_stream,
    )
    from .io.native import from_hurray  # noqa: F401
    from .limits import DEFAULT_LIMITS, Limits  # noqa: F401
    from .net import connect, serve  # noqa: F401
