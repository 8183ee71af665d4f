"""Value objects and tag tables of the Hurray tensor descriptor.

The tag tables (``enum.IntEnum`` / ``IntFlag``) are declared in
:mod:`hurray_schema.structs.tags` and re-exported here; a field that carries a tag takes
its table from the wire declaration of that field (``field(..., tags=...)``).  Value
objects are frozen, slotted ``attrs`` classes.  Field names follow the spec's field names.  Fields the spec
calls ``_reserved`` are kept (as ``_reserved``, constructor argument ``reserved``) so
that a descriptor decoded from bytes re-encodes to the same bytes and so that the rule
engine can report a non-zero reserved byte with its offset; they default to zeros.

A tag the spec reserves or leaves to private use is kept as a plain ``int`` where no
enumeration member matches, so a permissive reader can carry it.
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional, Union

import attrs

from .structs import descriptor as _descriptor
from .structs import layouts as _layouts
from .structs import sections as _sections
from .structs._declare import tags_of as _tags_of
from .structs.tags import (  # noqa: F401  (re-exported: the tag tables belong to the model's API)
    KNOWN_DESCRIPTOR_FLAGS, PRIVATE_TAG_FIRST, PRIVATE_TAG_LAST, BlockTableIndexType, CombineOp, CompositionRule,
    DescriptorFlag, DeviceTag, ElementType, KvRole, LayoutTag, MemberRole, MemoryClass, QuantFlag, QuantScheme,
    StatisticsMask, SyncMode, is_private_tag,
)
from .structs.wire import encoded_length as _encoded_length

__all__ = [
    "BlockTableIndexType", "CombineOp", "CompositionRule", "DescriptorFlag", "DeviceTag", "ElementType", "KvRole",
    "LayoutTag", "MemberRole", "MemoryClass", "QuantFlag", "QuantScheme", "StatisticsMask", "SyncMode",
    "DYNAMIC_DIMENSION", "OPEN_COMPOSITE", "NO_BUFFER_INDEX", "NOT_LAYER_SCOPED", "BufferHandle", "RowMajorLayout",
    "ColumnMajorLayout", "StridedLayout", "TiledLayout", "MortonLayout", "CooLayout", "CsrLayout", "CscLayout",
    "CsfLayout", "BlockPagedLayout", "CompositeLayout", "HilbertLayout", "ExtensionLayout", "UnknownLayout", "Layout",
    "PerTensorAffine", "PerChannelAffine", "PerBlockAffine", "Nf4", "Mxfp", "UnknownQuantization", "Quantization",
    "Shard", "Statistics", "ExtensionType", "CompositeMember", "TensorDescriptor",
]

DYNAMIC_DIMENSION = 0xFFFF_FFFF_FFFF_FFFF
"""The dynamic-dimension sentinel (``metadata.md § shape``); never the same as ``0``."""

OPEN_COMPOSITE = 0xFFFF_FFFF
"""Reserved open-composite ``member_count`` (``layouts/composite.md § Head Layout-Specific Fields``)."""

NO_BUFFER_INDEX = 0xFFFF_FFFF
"""``zero_point_buffer_index`` of a symmetric scheme (``quantization/per-block-affine.md``)."""

NOT_LAYER_SCOPED = 0xFFFF_FFFF
"""``layer_index`` of a block-paged tensor that belongs to no layer (``layouts/block-paged.md``)."""


# ------------------------------------------------------------------------------------
# Tag tables (declared in structs/tags.py)
# ------------------------------------------------------------------------------------

_GATED_ATTRIBUTES = tuple((part.attribute, int(part.flag))  # plain ints: IntFlag arithmetic is slow
                          for part in _descriptor.DESCRIPTOR_PARTS if part.flag is not None)
"""``(descriptor attribute, flag bit)`` of every flag-gated part: ``flags`` follows from them."""
_SYMMETRIC = int(QuantFlag.SYMMETRIC)  # plain int: IntFlag arithmetic is slow on hot paths


def _tag(enum_type):
    """attrs converter: enum member when assigned, plain int otherwise (a dict lookup, no enum call)."""
    members = {int(m): m for m in enum_type}
    get = members.get
    return lambda value: get(value, value)


def _tag_field(decl, name: str, **kwargs):
    """An attrs field converting to the tag table attached to field ``name`` of ``decl``."""
    return attrs.field(converter=_tag(_tags_of(decl, name)), **kwargs)


def _ints(value) -> tuple[int, ...]:
    return tuple(map(int, value))


def _tuple(values) -> tuple:
    """``tuple(values)``, as a Python function: attrs reads a converter's signature, and the built-in
    ``tuple``'s costs the import a tokenizer regex (milliseconds, every process)."""
    return tuple(values)


def _zeros(n: int):
    return attrs.field(default=bytes(n), converter=bytes, repr=False)


value = attrs.frozen(slots=True, cache_hash=False, weakref_slot=False)
"""Decorator of every value object: frozen, slotted attrs class."""


# ------------------------------------------------------------------------------------
# Buffer table
# ------------------------------------------------------------------------------------


@value
class BufferHandle:
    """One 16-byte buffer table entry (``buffer-protocol.md § Buffer Handle``)."""

    byte_size: int
    alignment: int = 64
    device_tag: Union[DeviceTag, int] = _tag_field(_descriptor.BUFFER_HANDLE, "device_tag", default=DeviceTag.CPU)
    sync_mode: Union[SyncMode, int] = _tag_field(
        _descriptor.BUFFER_HANDLE, "sync_mode", default=SyncMode.PRODUCER_SYNCED
    )
    memory_class: Union[MemoryClass, int] = _tag_field(
        _descriptor.BUFFER_HANDLE, "memory_class", default=MemoryClass.STANDARD
    )
    _reserved: int = attrs.field(default=0, repr=False)


# ------------------------------------------------------------------------------------
# Layouts (layout-specific fields, ``metadata.md § Layout-Specific Fields``)
# ------------------------------------------------------------------------------------


@value
class RowMajorLayout:
    """Row-major (C order): no layout-specific fields (``layouts/row-major.md``)."""

    tag: ClassVar[int] = LayoutTag.ROW_MAJOR


@value
class ColumnMajorLayout:
    """Column-major (Fortran order): no layout-specific fields (``layouts/column-major.md``)."""

    tag: ClassVar[int] = LayoutTag.COLUMN_MAJOR


@value
class StridedLayout:
    """Explicit strides in logical elements, negative and zero allowed (``layouts/strided.md``)."""

    tag: ClassVar[int] = LayoutTag.STRIDED
    strides: tuple[int, ...] = attrs.field(converter=_ints)


@value
class TiledLayout:
    """Tiled / blocked, possibly recursive (``layouts/tiled.md``).

    ``inner`` is the nested tiling when ``inner_layout`` is ``0x04``.
    """

    tag: ClassVar[int] = LayoutTag.TILED
    tile_shape: tuple[int, ...] = attrs.field(converter=_ints)
    outer_layout: int = LayoutTag.ROW_MAJOR
    inner_layout: int = LayoutTag.ROW_MAJOR
    outer_strides: Optional[tuple[int, ...]] = attrs.field(
        default=None, converter=attrs.converters.optional(_ints)
    )
    inner_strides: Optional[tuple[int, ...]] = attrs.field(
        default=None, converter=attrs.converters.optional(_ints)
    )
    inner: Optional["TiledLayout"] = None
    _reserved: bytes = _zeros(2)

    @property
    def depth(self) -> int:
        """Number of tiling levels (1 for a plain tiled layout)."""
        return 1 + (self.inner.depth if self.inner is not None else 0)


@value
class MortonLayout:
    """Morton / Z-order curve (``layouts/morton.md``)."""

    tag: ClassVar[int] = LayoutTag.MORTON
    morton_bits: tuple[int, ...] = attrs.field(converter=_ints)


@value
class CooLayout:
    """COO sparse (``layouts/coo.md``); ``is_sorted`` is the raw byte (``0x01`` sorted)."""

    tag: ClassVar[int] = LayoutTag.COO
    nnz: int
    is_sorted: int = 0
    _reserved: bytes = _zeros(7)


@value
class CsrLayout:
    """CSR sparse, rank 2 (``layouts/csr.md``)."""

    tag: ClassVar[int] = LayoutTag.CSR
    nnz: int
    _reserved: bytes = _zeros(8)


@value
class CscLayout:
    """CSC sparse, rank 2 (``layouts/csc.md``)."""

    tag: ClassVar[int] = LayoutTag.CSC
    nnz: int
    _reserved: bytes = _zeros(8)


@value
class CsfLayout:
    """CSF sparse fiber tree, rank >= 3 (``layouts/csf.md``)."""

    tag: ClassVar[int] = LayoutTag.CSF
    nnz: int
    mode_order: tuple[int, ...] = attrs.field(converter=_ints)
    _reserved: bytes = _zeros(8)


@value
class BlockPagedLayout:
    """Block-paged KV-cache layout, rank 3 (``layouts/block-paged.md``)."""

    tag: ClassVar[int] = LayoutTag.BLOCK_PAGED
    page_size: int
    num_pages: int
    num_seqs: int
    paged_axis: int = 0
    kv_role: Union[KvRole, int] = _tag_field(_layouts.BLOCK_PAGED, "kv_role", default=KvRole.GENERIC)
    layer_index: int = NOT_LAYER_SCOPED
    block_table_index_type: Union[BlockTableIndexType, int] = _tag_field(
        _layouts.BLOCK_PAGED, "block_table_index_type", default=BlockTableIndexType.UINT32
    )
    _reserved: bytes = _zeros(6)


@value
class CompositeLayout:
    """Composite head fields (``metadata.md § Composite / Virtual``, ``layouts/composite.md``)."""

    tag: ClassVar[int] = LayoutTag.COMPOSITE
    composition_rule: Union[CompositionRule, int] = _tag_field(_layouts.COMPOSITE, "composition_rule")
    member_count: int
    combine_op: Union[CombineOp, int] = _tag_field(_layouts.COMPOSITE, "combine_op", default=CombineOp.NONE)
    _reserved: bytes = _zeros(2)


@value
class HilbertLayout:
    """Hilbert curve, Tier 2 (``layouts/hilbert.md``)."""

    tag: ClassVar[int] = LayoutTag.HILBERT
    hilbert_order: int
    hilbert_rank: int


@value
class ExtensionLayout:
    """Implementation-private layout ``0xF0``–``0xFE`` (``metadata.md § Extension Layouts``)."""

    layout_tag: int
    extension_layout_id: int
    extension_data: bytes = attrs.field(default=b"", converter=bytes)

    @property
    def tag(self) -> int:
        return self.layout_tag


@value
class UnknownLayout:
    """A layout tag this reader does not know, kept by a permissive reader.

    Nothing after ``byte_offset`` can be located without knowing the layout, so the rest
    of the descriptor is kept opaque in ``payload`` and the data MUST NOT be dereferenced
    (``memory-layout.md § Layout Taxonomy``).
    """

    layout_tag: int
    payload: bytes = attrs.field(default=b"", converter=bytes, repr=False)

    @property
    def tag(self) -> int:
        return self.layout_tag


Layout = Union[
    RowMajorLayout, ColumnMajorLayout, StridedLayout, TiledLayout, MortonLayout, CooLayout,
    CsrLayout, CscLayout, CsfLayout, BlockPagedLayout, CompositeLayout, HilbertLayout,
    ExtensionLayout, UnknownLayout,
]

TABLE_LAYOUTS: dict = {cls.tag: cls for cls in (
    StridedLayout, MortonLayout, CooLayout, CsrLayout, CscLayout, CsfLayout, BlockPagedLayout, CompositeLayout,
    HilbertLayout,
)}
"""layout_tag -> class, for the layouts whose fields are exactly one declared table
(row- and column-major have none; tiled nests; private layouts carry opaque data)."""

ROW_MAJOR = RowMajorLayout()
COLUMN_MAJOR = ColumnMajorLayout()


# ------------------------------------------------------------------------------------
# Quantization (``quantization.md`` and ``quantization/*.md``)
# ------------------------------------------------------------------------------------


@value
class PerTensorAffine:
    """One scale and zero point for the whole tensor (``quantization/per-tensor-affine.md``)."""

    scheme: ClassVar[int] = QuantScheme.PER_TENSOR_AFFINE
    scale: float
    zero_point: int = 0
    scheme_version: int = 1
    flags: int = 0
    _reserved: bytes = _zeros(4)
    padding: bytes = attrs.field(default=b"", converter=bytes, repr=False)


@value
class PerChannelAffine:
    """One float32 scale (and zero point) per index of ``axis`` (``quantization/per-channel-affine.md``)."""

    scheme: ClassVar[int] = QuantScheme.PER_CHANNEL_AFFINE
    axis: int
    scale_buffer_index: int
    zero_point_buffer_index: int = NO_BUFFER_INDEX
    flags: int = 0
    scale_type_tag: int = ElementType.FLOAT32
    scheme_version: int = 1
    _reserved: bytes = _zeros(3)
    padding: bytes = attrs.field(default=b"", converter=bytes, repr=False)

    @property
    def symmetric(self) -> bool:
        return bool(self.flags & _SYMMETRIC)


@value
class PerBlockAffine:
    """One scale (and zero point) per block of ``block_size`` along ``axis`` (``quantization/per-block-affine.md``)."""

    scheme: ClassVar[int] = QuantScheme.PER_BLOCK_AFFINE
    axis: int
    block_size: int
    scale_buffer_index: int
    zero_point_buffer_index: int = NO_BUFFER_INDEX
    flags: int = 0
    scale_type_tag: int = ElementType.FLOAT32
    scheme_version: int = 1
    _reserved: bytes = _zeros(3)
    padding: bytes = attrs.field(default=b"", converter=bytes, repr=False)

    @property
    def symmetric(self) -> bool:
        return bool(self.flags & _SYMMETRIC)


@value
class Nf4:
    """NormalFloat4 with a float32 absmax per block (``quantization/nf4.md``)."""

    scheme: ClassVar[int] = QuantScheme.NF4
    axis: int
    block_size: int
    scale_buffer_index: int
    flags: int = 0
    scheme_version: int = 1
    padding: bytes = attrs.field(default=b"", converter=bytes, repr=False)


@value
class Mxfp:
    """OCP microscaling with a float8_e8m0 scale per block (``quantization/mxfp.md``)."""

    scheme: ClassVar[int] = QuantScheme.MXFP
    axis: int
    block_size: int
    scale_buffer_index: int
    flags: int = 0
    scheme_version: int = 1
    padding: bytes = attrs.field(default=b"", converter=bytes, repr=False)


@value
class UnknownQuantization:
    """A scheme this reader does not know (private or newer), kept opaque by a permissive reader."""

    scheme_tag: int
    scheme_version: int
    flags: int
    payload: bytes = attrs.field(default=b"", converter=bytes, repr=False)

    @property
    def scheme(self) -> int:
        return self.scheme_tag


Quantization = Union[PerTensorAffine, PerChannelAffine, PerBlockAffine, Nf4, Mxfp, UnknownQuantization]

SCHEMES: dict = {cls.scheme: cls for cls in (PerTensorAffine, PerChannelAffine, PerBlockAffine, Nf4, Mxfp)}
"""scheme_tag -> class of every quantization scheme the spec defines."""


# ------------------------------------------------------------------------------------
# Optional sections
# ------------------------------------------------------------------------------------


@value
class Shard:
    """Position of this tensor inside a parent tensor (``metadata.md § Shard Section``)."""

    parent_shape: tuple[int, ...] = attrs.field(converter=_ints)
    shard_offset: tuple[int, ...] = attrs.field(converter=_ints)


@value
class Statistics:
    """Advisory statistics, 72 bytes (``metadata.md § Statistics Section``)."""

    computed_mask: int = 0
    nnz: int = 0
    sparsity_ratio: float = 0.0
    value_min: float = 0.0
    value_max: float = 0.0
    value_abs_max: float = 0.0
    value_mean: float = 0.0
    value_stddev: float = 0.0
    nm_n: int = 0
    nm_m: int = 0
    has_nan: int = 0
    has_inf: int = 0
    _reserved: int = attrs.field(default=0, repr=False)
    _reserved2: bytes = _zeros(4)

    def __eq__(self, other):  # NaN-safe, bit-level equality of the float fields
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in attrs.fields(Statistics))

    __hash__ = None  # type: ignore[assignment]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@value
class ExtensionType:
    """Inline description of a private element type ``0xF0``–``0xFE`` (``metadata.md § Extension Type Section``)."""

    bit_width: int
    packing_factor: int = 1
    is_float: int = 0
    is_signed: int = 0
    sign_bits: int = 0
    exponent_bits: int = 0
    mantissa_bits: int = 0
    exponent_bias: int = 0
    has_nan: int = 0
    has_inf: int = 0
    _reserved: bytes = _zeros(2)
    _reserved2: bytes = _zeros(2)


@value
class CompositeMember:
    """Role of an overlay member (``metadata.md § Composite Member Section``)."""

    member_role: Union[MemberRole, int] = _tag_field(_sections.COMPOSITE_MEMBER_SECTION, "member_role")
    _reserved: bytes = _zeros(15)


# ------------------------------------------------------------------------------------
# The descriptor
# ------------------------------------------------------------------------------------


@value
class TensorDescriptor:
    """A decoded tensor descriptor (``metadata.md § Overall Descriptor Structure``).

    ``flags`` is not stored: it follows from which optional sections are present, plus
    ``unparsed_flags`` -- bits a permissive reader kept without interpreting them (a newer
    minor version, or the sections behind an unknown layout).  ``trailing`` holds bytes a
    newer minor version appended after the sections this reader knows.
    """

    type_tag: Union[ElementType, int] = _tag_field(_descriptor.FIXED_HEADER, "type_tag")
    shape: tuple[int, ...] = attrs.field(converter=_ints)
    layout: Layout = ROW_MAJOR
    buffers: tuple[BufferHandle, ...] = attrs.field(default=(), converter=_tuple)
    byte_offset: int = 0
    quantization: Optional[Quantization] = None
    shard: Optional[Shard] = None
    statistics: Optional[Statistics] = None
    extension_type: Optional[ExtensionType] = None
    composite_member: Optional[CompositeMember] = None
    version_major: int = 1
    version_minor: int = 0
    unparsed_flags: int = 0
    trailing: bytes = attrs.field(default=b"", converter=bytes, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def layout_tag(self) -> int:
        return self.layout.tag

    @property
    def flags(self) -> int:
        """The wire ``flags`` value this descriptor encodes to."""
        bits = int(self.unparsed_flags)  # plain ints: IntFlag arithmetic is slow
        for attribute, flag in _GATED_ATTRIBUTES:
            if getattr(self, attribute) is not None:
                bits |= flag
        return bits

    @property
    def has_dynamic_dimension(self) -> bool:
        return DYNAMIC_DIMENSION in self.shape

    @property
    def element_count(self) -> Optional[int]:
        """Product of the shape, ``None`` while a dimension is dynamic (``data-model.md § Total Element Count``)."""
        if self.has_dynamic_dimension:
            return None
        return math.prod(self.shape)

    @property
    def is_empty(self) -> bool:
        """True when a dimension is ``0`` (ADR-007); a dynamic dimension is not empty."""
        return 0 in self.shape

    @property
    def is_composite_head(self) -> bool:
        return self.layout.tag == LayoutTag.COMPOSITE

    @property
    def encoded_length(self) -> int:
        """``descriptor_length`` of this descriptor once encoded."""
        return _encoded_length(self)


VALUE_CLASSES: dict = {part.value_class: globals()[part.value_class]
                       for part in _descriptor.DESCRIPTOR_PARTS if part.value_class is not None}
"""The value class (or union of classes) each part of
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` names, by name; a name missing
here fails the import."""
