"""hurray_schema: read, write, validate and evaluate Hurray tensors.

The public API is re-exported here; see README.md.
"""

from .audit import audit
from .codec import decode_descriptor, encode_descriptor, parse_descriptor
from .errors import HurraySchemaError, LimitExceeded, SpecViolation
from .errors import EncodeError, FieldRangeError
from .errors import (DeviceUnavailable, InvalidMessage, LayoutUnavailable, MessageTooLarge, ProtocolVersionMismatch,
                     SessionError, SessionTimeout, ShardMismatch, TranscodeLimitExceeded, UnknownTensor)
from .errors import (AdvancedIndexUnsupported, CopyRequired, DLPackUnsupported, IndexRangeError, IndexTypeError,
                     InvalidDtype, NotAnArray)
from .limits import DEFAULT_LIMITS, Limits
from .io import (
    ClosedFileError, Composite, HurrayFile, IndexEntry, RemoteError, StreamReader, StreamWriter, Tensor,
    TensorSlice, UInt64, load, read_file, read_stream, save, write_file, write_stream,
)
from .io.produce import (from_scipy, group, overlay, partition, per_block_from_codes, per_block_from_packed, quantize,
                         sparse_coo, sparse_csc, sparse_csr, spqr)
from .model import (
    DYNAMIC_DIMENSION, BlockPagedLayout, BlockTableIndexType, BufferHandle, ColumnMajorLayout,
    CombineOp, CompositeLayout, CompositeMember, CompositionRule, CooLayout, CscLayout, CsfLayout,
    CsrLayout, DescriptorFlag, DeviceTag, ElementType, ExtensionLayout, ExtensionType, HilbertLayout,
    KvRole, LayoutTag, MemberRole, MemoryClass, MortonLayout, Mxfp, Nf4, PerBlockAffine,
    PerChannelAffine, PerTensorAffine, QuantFlag, QuantScheme, RowMajorLayout, Shard, Statistics,
    StatisticsMask, StridedLayout, SyncMode, TensorDescriptor, TiledLayout, UnknownLayout,
    UnknownQuantization,
)

from .rules.composite import CompositeValidator
from .rules.engine import Finding, Level, Mode, Report

__version__ = "0.1.0"

_EVALUATOR_NAMES = frozenset({"DecodedTypeMismatch", "UnsupportedEvaluation", "lookup", "materialize",
                              "tensor_to_numpy"})
_CONVERSION_NAMES = frozenset({"convert", "ConvertReport", "TensorReport", "NoExactForm"})
_NET_NAMES = frozenset({"serve", "connect", "Server", "Session"})


def __getattr__(name):
    """The evaluator's names, imported on first use: parsing and auditing need no numba; and
    :func:`convert` (:mod:`hurray_schema.conversion`); :func:`serve` and :func:`connect`
    (:mod:`hurray_schema.net`)."""
    if name in _NET_NAMES:
        from . import net

        return getattr(net, name)
    if name in _CONVERSION_NAMES:
        from . import conversion

        return getattr(conversion, name)
    if name in _EVALUATOR_NAMES:
        from . import evaluate

        return getattr(evaluate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Composite", "HurrayFile", "IndexEntry", "RemoteError", "StreamReader", "Tensor", "UInt64",
    "read_file", "read_stream", "write_file", "write_stream", "load", "save", "StreamWriter", "ClosedFileError",
    "TensorSlice",
    "quantize", "per_block_from_codes", "per_block_from_packed", "spqr", "sparse_coo", "sparse_csr", "sparse_csc", "from_scipy", "partition", "overlay", "group",
    "DEFAULT_LIMITS", "Limits", "DecodedTypeMismatch", "UnsupportedEvaluation", "lookup", "materialize", "tensor_to_numpy",
    "audit", "CompositeValidator", "Finding", "Level", "Mode", "Report", "parse_descriptor",
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
    "convert", "ConvertReport", "TensorReport", "NoExactForm",
    "serve", "connect", "Server", "Session", "SessionError", "SessionTimeout", "ProtocolVersionMismatch",
    "UnknownTensor", "LayoutUnavailable", "TranscodeLimitExceeded", "DeviceUnavailable", "InvalidMessage",
    "MessageTooLarge", "ShardMismatch",
]
