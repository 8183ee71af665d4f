"""Tag tables of the Hurray format: every one-byte tag and flag word, as ``enum`` classes.

The bottom of the package: the wire declarations (:mod:`hurray_schema.structs`) attach these
to the fields that carry them (``field(..., tags=...)``), and :mod:`hurray_schema.model`
re-exports them with the value objects.  Nothing here imports another module of the project.
"""

from __future__ import annotations

import enum

__all__ = [
    "ElementType", "PRIVATE_TAG_FIRST", "PRIVATE_TAG_LAST", "is_private_tag", "INVALID_TAGS", "is_invalid_tag",
    "RESERVED_TAG_FIRST", "RESERVED_TAG_LAST", "is_reserved_tag", "LayoutTag", "DescriptorFlag",
    "KNOWN_DESCRIPTOR_FLAGS", "CompositionRule", "CombineOp", "MemberRole", "DeviceTag", "SyncMode", "MemoryClass",
    "QuantScheme", "QuantFlag", "StatisticsMask", "KvRole", "BlockTableIndexType",
]


class ElementType(enum.IntEnum):
    """``type_tag`` values (``element-types.md § Type Properties Summary``)."""

    FLOAT16 = 0x01
    BFLOAT16 = 0x02
    FLOAT32 = 0x03
    FLOAT64 = 0x04
    INT8 = 0x10
    UINT8 = 0x11
    INT16 = 0x12
    UINT16 = 0x13
    INT32 = 0x14
    UINT32 = 0x15
    INT64 = 0x16
    UINT64 = 0x17
    BOOL = 0x20
    FLOAT8_E4M3 = 0x40
    FLOAT8_E5M2 = 0x41
    FLOAT8_E8M0 = 0x42
    FLOAT4_E2M1 = 0x43
    FLOAT6_E2M3 = 0x44
    FLOAT6_E3M2 = 0x45
    FLOAT128 = 0x46
    INT4 = 0x48
    UINT4 = 0x49
    INT2 = 0x4A
    UINT2 = 0x4B
    COMPLEX64 = 0x50
    COMPLEX128 = 0x51


PRIVATE_TAG_FIRST = 0xF0
PRIVATE_TAG_LAST = 0xFE
"""The tag range the spec leaves to implementations, the same for every one-byte tag table
(``element-types.md § Type Identifier Encoding``, ``memory-layout.md § Layout Taxonomy``,
``layouts/composite.md``, ``buffer-protocol.md``)."""


def is_private_tag(tag: int) -> bool:
    """``tag`` lies in the implementation-private range 0xF0-0xFE (an element type described
    by the extension type section, an extension layout, a private device, ...)."""
    return PRIVATE_TAG_FIRST <= tag <= PRIVATE_TAG_LAST


INVALID_TAGS = (0x00, 0xFF)
"""The two values a ``type_tag``, ``layout_tag`` or ``scheme_tag`` never holds; a reader
rejects them (``element-types.md § Type Identifier Encoding``, ``memory-layout.md § Layout
Taxonomy``, ``quantization.md § Scheme Tag Space``)."""


def is_invalid_tag(tag: int) -> bool:
    """``tag`` is one of :data:`INVALID_TAGS` (for the element type, layout and scheme tables)."""
    return tag in INVALID_TAGS


RESERVED_TAG_FIRST = 0x80
RESERVED_TAG_LAST = 0xEF
"""The range the element type, layout and scheme tag tables hold back for later versions of
the spec; no implementation gives them a meaning (same citations as :data:`INVALID_TAGS`)."""


def is_reserved_tag(tag: int) -> bool:
    """``tag`` lies in the range 0x80-0xEF reserved for future spec versions (element type,
    layout and scheme tags; the device, sync and memory class tables reserve from their last
    assigned value instead)."""
    return RESERVED_TAG_FIRST <= tag <= RESERVED_TAG_LAST


class LayoutTag(enum.IntEnum):
    """``layout_tag`` values (``memory-layout.md § Named Layout Tags``)."""

    ROW_MAJOR = 0x01
    COLUMN_MAJOR = 0x02
    STRIDED = 0x03
    TILED = 0x04
    MORTON = 0x05
    COO = 0x06
    CSR = 0x07
    CSC = 0x08
    CSF = 0x09
    BLOCK_PAGED = 0x0A
    COMPOSITE = 0x0B
    HILBERT = 0x40


class DescriptorFlag(enum.IntFlag):
    """Bits of the descriptor ``flags`` field (``metadata.md § Flags``)."""

    HAS_QUANTIZATION = 1 << 0
    HAS_SHARD = 1 << 1
    HAS_EXTENSION_TYPE = 1 << 2
    HAS_STATISTICS = 1 << 3
    HAS_COMPOSITE_MEMBER = 1 << 4


KNOWN_DESCRIPTOR_FLAGS = int(
    DescriptorFlag.HAS_QUANTIZATION
    | DescriptorFlag.HAS_SHARD
    | DescriptorFlag.HAS_EXTENSION_TYPE
    | DescriptorFlag.HAS_STATISTICS
    | DescriptorFlag.HAS_COMPOSITE_MEMBER
)


class CompositionRule(enum.IntEnum):
    """``composition_rule`` of a composite head (``metadata.md § Composite / Virtual``)."""

    PARTITION = 0x01
    OVERLAY = 0x02
    GROUP = 0x03


class CombineOp(enum.IntEnum):
    """``combine_op`` of a composite head; ``NONE`` for partition and group."""

    NONE = 0x00
    REPLACE = 0x01
    ADD = 0x02


class MemberRole(enum.IntEnum):
    """``member_role`` of the Composite Member section (``metadata.md § Composite Member Section``)."""

    CORRECTION = 0x00
    BASE = 0x01


class DeviceTag(enum.IntEnum):
    """Buffer ``device_tag`` values (``buffer-protocol.md § Device Tags``)."""

    CPU = 0x00
    CUDA = 0x01
    ROCM = 0x02
    METAL = 0x03
    VULKAN = 0x04
    WEBGPU = 0x05
    HEXAGON = 0x06
    LEVEL_ZERO = 0x07
    OPENCL = 0x08


class SyncMode(enum.IntEnum):
    """Buffer ``sync_mode`` values (``buffer-protocol.md § Stream and Event Synchronisation``)."""

    PRODUCER_SYNCED = 0x00
    EVENT = 0x01
    CONSUMER_STREAM = 0x02


class MemoryClass(enum.IntEnum):
    """Buffer ``memory_class`` values (``buffer-protocol.md § Memory Class``)."""

    STANDARD = 0x00
    HOST_PINNED = 0x01
    UNIFIED = 0x02
    PEER = 0x03


class QuantScheme(enum.IntEnum):
    """``scheme_tag`` values (``quantization.md § Assigned Scheme Tags``)."""

    PER_TENSOR_AFFINE = 0x01
    PER_CHANNEL_AFFINE = 0x02
    PER_BLOCK_AFFINE = 0x03
    NF4 = 0x04
    MXFP = 0x05


class QuantFlag(enum.IntFlag):
    """Scheme flags of per-channel and per-block affine (``quantization/per-block-affine.md``)."""

    SYMMETRIC = 1 << 0


class StatisticsMask(enum.IntFlag):
    """``computed_mask`` bits of the Statistics section (``metadata.md § computed_mask``)."""

    NNZ_VALID = 1 << 0
    SPARSITY_VALID = 1 << 1
    VALUE_RANGE_VALID = 1 << 2
    VALUE_STATS_VALID = 1 << 3
    NM_SPARSITY_VALID = 1 << 4
    NAN_INF_VALID = 1 << 5


class KvRole(enum.IntEnum):
    """``kv_role`` of a block-paged tensor (``layouts/block-paged.md``)."""

    KEY = 0x00
    VALUE = 0x01
    GENERIC = 0x02


class BlockTableIndexType(enum.IntEnum):
    """``block_table_index_type`` of a block-paged tensor (``layouts/block-paged.md``)."""

    UINT32 = 0x00
    UINT64 = 0x01
