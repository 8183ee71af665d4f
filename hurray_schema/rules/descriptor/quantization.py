"""Rules on the quantization section (``quantization.md`` and ``quantization/*.md``).

What each scheme accepts (storage types, scale types, block sizes, flags) and which
parameter buffers it references are data beside the scheme declarations
(:mod:`hurray_schema.structs.quantization`); the rules here read them.
"""

from __future__ import annotations

import math
from ...model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, SCHEMES, BlockPagedLayout, ColumnMajorLayout, Mxfp, Nf4, PerBlockAffine,
    PerChannelAffine, PerTensorAffine, QuantScheme, RowMajorLayout, UnknownQuantization,
)
from ...structs import quantization as quantization_tables
from ...structs.element_types import element_type_info
from ..engine import Level
from .dispatch import When, descriptor_rule
from .sizes import (
    SYMMETRIC, axis_in_rank, data_handle, dynamic, layout_buffer_count, power_of_two, quantization_buffer_indices,
    storage_bytes,
)

MUST, SHOULD = Level.MUST, Level.SHOULD
_DYNAMIC = DYNAMIC_DIMENSION
_PAGES = quantization_tables.SCHEME_PAGES
_STORAGE = quantization_tables.STORAGE_TYPES
_SCALE_TYPES = quantization_tables.SCALE_TYPES


def _classes(*schemes: QuantScheme) -> frozenset:
    return frozenset(SCHEMES[scheme] for scheme in schemes)


_KNOWN = When(schemes=SCHEMES.values())
_AFFINE = When(schemes={PerTensorAffine, PerChannelAffine, PerBlockAffine})
_WITH_AXIS = When(schemes=_classes(*quantization_tables.SCALE_BUFFER_TYPES))
"""The schemes with an axis are the ones with a scale buffer."""
_BLOCKED_AFFINE_OR_NF4 = When(schemes={PerBlockAffine, Nf4})


def _hex_list(tags) -> str:
    """``0x01, 0x02 or 0x03``."""
    names = [f"0x{tag:02X}" for tag in sorted(tags)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@descriptor_rule("quantization.flags.reserved", MUST, "quantization.md § Descriptor Header",
                 "Quantization flag bits the scheme does not define are 0 (bits 1-15 for per-channel and per-block "
                 "affine, every bit for per-tensor affine, NF4 and MXFP).", when=_KNOWN)
def _qflags(desc, ctx):
    q = desc.quantization
    if q is None or isinstance(q, UnknownQuantization):
        return
    allowed = quantization_tables.DEFINED_FLAGS[q.scheme]
    if q.flags & ~allowed:
        return f"reserved quantization flag bits 0x{q.flags & ~allowed:04X} are set", ctx.quantization("flags")


@descriptor_rule("quantization.scheme_version.value", MUST, "quantization/per-tensor-affine.md § Binary Encoding",
                 "scheme_version of every scheme defined here is 0x01 (a newer one is the structural rule "
                 "quantization.scheme_version; 0x00 is not a version).", when=_KNOWN)
def _qversion(desc, ctx):
    q = desc.quantization
    if q is not None and not isinstance(q, UnknownQuantization) and q.scheme_version == 0:
        return "scheme_version is 0x00, not 0x01", ctx.quantization("scheme_version")


@descriptor_rule("quantization.reserved", MUST, "quantization/per-channel-affine.md § Validity Constraints",
                 "The _reserved bytes of a per-tensor, per-channel or per-block affine descriptor are zero.",
                 when=_AFFINE)
def _qreserved(desc, ctx):
    q = desc.quantization
    if isinstance(q, (PerTensorAffine, PerChannelAffine, PerBlockAffine)) and any(q._reserved):
        return f"quantization _reserved bytes are {q._reserved.hex()}", ctx.quantization("_reserved")


@descriptor_rule("quantization.axis", MUST, "quantization/per-block-affine.md § Validity Constraints",
                 "The quantization axis of a per-channel, per-block, NF4 or MXFP descriptor is below rank.",
                 when=_WITH_AXIS)
def _qaxis(desc, ctx):
    q = desc.quantization
    if hasattr(q, "axis") and q.axis >= desc.rank:
        return f"quantization axis {q.axis} is not below rank {desc.rank}", ctx.quantization("axis")


@descriptor_rule("quantization.axis.dynamic", MUST, "data-model.md § Dynamic Dimensions",
                 "A scheme needing the size of its axis rejects a dynamic shape[axis].", when=_WITH_AXIS)
def _qaxis_dynamic(desc, ctx):
    q = desc.quantization
    if axis_in_rank(desc) and desc.shape[q.axis] == _DYNAMIC:
        return f"shape[{q.axis}] (the quantization axis) is dynamic", ctx.shape(q.axis)


def _block_size_rule(scheme: QuantScheme, name: str):
    cls, page = SCHEMES[scheme], _PAGES[scheme]
    low, high = quantization_tables.BLOCK_SIZE_BOUNDS[scheme]
    words = f"a power of two >= {low}" if high is None else f"a power of two in [{low}, {high}]"

    @descriptor_rule(f"quantization.{name}.block_size", MUST, f"quantization/{page}.md § Validity Constraints",
                     f"block_size is {words}.", when=When(schemes={cls}))
    def check(desc, ctx):
        q = desc.quantization
        if isinstance(q, cls):
            b = q.block_size
            if not power_of_two(b) or b < low or (high is not None and b > high):
                return f"block_size {b} is not {words}", ctx.quantization("block_size")

    return check


_block_size_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block")
_block_size_rule(QuantScheme.NF4, "nf4")
_block_size_rule(QuantScheme.MXFP, "mxfp")


@descriptor_rule("quantization.block_size.upper", MUST, "quantization/per-block-affine.md § Validity Constraints",
                 "For per-block affine and NF4, block_size is at most shape[axis] when shape[axis] > 0; the bound "
                 "is waived for an empty axis (ADR-007 § 8).", when=_BLOCKED_AFFINE_OR_NF4)
def _block_upper(desc, ctx):
    q = desc.quantization
    if isinstance(q, (PerBlockAffine, Nf4)) and axis_in_rank(desc):
        size = desc.shape[q.axis]
        if 0 < size != _DYNAMIC and q.block_size > size:
            return f"block_size {q.block_size} exceeds shape[{q.axis}] = {size}", ctx.quantization("block_size")


@descriptor_rule("quantization.block_padding", MUST, "quantization/per-block-affine.md § Padding",
                 "With per-block affine or NF4 and a partial trailing block, the data buffer of a row- or "
                 "column-major tensor still holds full blocks: ceil(shape[axis] / block_size) * block_size "
                 "elements along the axis.",
                 when=When(layouts={RowMajorLayout, ColumnMajorLayout}, schemes={PerBlockAffine, Nf4}))
def _block_padding(desc, ctx):
    q = desc.quantization
    h = data_handle(desc)
    if (h is None or not isinstance(q, (PerBlockAffine, Nf4)) or not axis_in_rank(desc) or dynamic(desc)
            or q.block_size <= 0 or not isinstance(desc.layout, (RowMajorLayout, ColumnMajorLayout))):
        return
    size = desc.shape[q.axis]
    if size % q.block_size == 0:
        return
    padded = -(-size // q.block_size) * q.block_size
    n = padded * math.prod(d for k, d in enumerate(desc.shape) if k != q.axis)
    need = storage_bytes(desc, n)
    if need is not None and desc.byte_offset + need > h.byte_size:
        return (f"buffer 0 holds {h.byte_size} bytes; shape[{q.axis}] = {size} padded to {padded} needs "
                f"{desc.byte_offset + need}"), ctx.buffer(0)


@descriptor_rule("quantization.mxfp.multiple", MUST, "quantization/mxfp.md § Validity Constraints",
                 "shape[axis] of an MXFP tensor is a multiple of block_size (no partial block); an empty axis is "
                 "accepted per ADR-007 § 8.", when=When(schemes={Mxfp}))
def _mxfp_multiple(desc, ctx):
    q = desc.quantization
    if isinstance(q, Mxfp) and axis_in_rank(desc) and q.block_size > 0:
        size = desc.shape[q.axis]
        if size != _DYNAMIC and size % q.block_size:
            return f"shape[{q.axis}] = {size} is not a multiple of block_size {q.block_size}", ctx.shape(q.axis)


_PER_TENSOR = When(schemes={PerTensorAffine})


@descriptor_rule("quantization.per_tensor.scale", MUST, "quantization/per-tensor-affine.md § Validity Constraints",
                 "The per-tensor scale is finite and non-zero.", when=_PER_TENSOR)
def _pt_scale(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerTensorAffine) and (not math.isfinite(q.scale) or q.scale == 0.0):
        return f"scale {q.scale!r} is not finite and non-zero", ctx.quantization("scale")


def _integer_range(tag: int) -> tuple[int, int]:
    """Smallest and largest value of an integer element type."""
    info = element_type_info(tag)
    if info.is_signed:
        return -(1 << (info.bit_width - 1)), (1 << (info.bit_width - 1)) - 1
    return 0, (1 << info.bit_width) - 1


_ZERO_POINT_RANGE = {tag: _integer_range(tag) for tag in _STORAGE[QuantScheme.PER_TENSOR_AFFINE]}
"""Storage type of a per-tensor affine tensor (all integers) -> the range of its zero point."""


@descriptor_rule("quantization.per_tensor.zero_point", MUST,
                 "quantization/per-tensor-affine.md § Validity Constraints",
                 "The per-tensor zero_point lies in the range of the storage type.", when=_PER_TENSOR)
def _pt_zero(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerTensorAffine) and desc.type_tag in _ZERO_POINT_RANGE:
        lo, hi = _ZERO_POINT_RANGE[desc.type_tag]
        if not lo <= q.zero_point <= hi:
            return f"zero_point {q.zero_point} is outside [{lo}, {hi}]", ctx.quantization("zero_point")


def _scale_type_rule(scheme: QuantScheme, name: str, summary: str):
    cls, page, allowed = SCHEMES[scheme], _PAGES[scheme], _SCALE_TYPES[scheme]
    words = _hex_list(allowed)

    @descriptor_rule(f"quantization.{name}.scale_type", MUST, f"quantization/{page}.md § Validity Constraints",
                     summary, when=When(schemes={cls}))
    def check(desc, ctx):
        q = desc.quantization
        if isinstance(q, cls) and q.scale_type_tag not in allowed:
            return f"scale_type_tag 0x{q.scale_type_tag:02X} is not {words}", ctx.quantization("scale_type_tag")

    return check


_scale_type_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel",
                 "scale_type_tag of per-channel affine version 1 is 0x03 (float32).")
_scale_type_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block", "scale_type_tag of per-block affine is 0x01, 0x02 or 0x03.")


def _symmetric_index_rule(scheme: QuantScheme, name: str, level: Level, summary: str):
    cls, page = SCHEMES[scheme], _PAGES[scheme]

    @descriptor_rule(f"quantization.{name}.symmetric_index", level, f"quantization/{page}.md § Binary Encoding",
                     summary, when=When(schemes={cls}))
    def check(desc, ctx):
        q = desc.quantization
        if isinstance(q, cls) and q.symmetric and q.zero_point_buffer_index != NO_BUFFER_INDEX:
            return f"symmetric but zero_point_buffer_index is {q.zero_point_buffer_index}", \
                ctx.quantization("zero_point_buffer_index")

    return check


_symmetric_index_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel", MUST,
                      "With the SYMMETRIC flag, zero_point_buffer_index is 0xFFFFFFFF.")
_symmetric_index_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block", SHOULD,
                      "With the SYMMETRIC flag, zero_point_buffer_index is ignored and should be 0xFFFFFFFF.")


def _storage_rule(scheme: QuantScheme, name: str):
    cls, page, storage = SCHEMES[scheme], _PAGES[scheme], _STORAGE[scheme]
    allowed = ", ".join(f"0x{t:02X}" for t in sorted(storage))

    @descriptor_rule(f"quantization.{name}.storage_type", MUST, f"quantization/{page}.md § Valid Storage Types",
                     f"The storage type_tag of a {page} tensor is one of {allowed}.", when=When(schemes={cls}))
    def check(desc, ctx):
        if isinstance(desc.quantization, cls) and desc.type_tag not in storage:
            return f"storage type 0x{desc.type_tag:02X} is not valid for {page}", ctx.header("type_tag")

    return check


_storage_rule(QuantScheme.PER_TENSOR_AFFINE, "per_tensor")
_storage_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel")
_storage_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block")
_storage_rule(QuantScheme.NF4, "nf4")
_storage_rule(QuantScheme.MXFP, "mxfp")


@descriptor_rule("quantization.buffer_index.range", MUST, "quantization/per-channel-affine.md § Referenced Buffers",
                 "Every parameter buffer index (scale, and zero point unless symmetric) is below buffer_count.",
                 when=_WITH_AXIS)
def _qindex_range(desc, ctx):
    for name, index in quantization_buffer_indices(desc.quantization):
        if index >= len(desc.buffers):
            return f"{name} {index} is not below buffer_count {len(desc.buffers)}", ctx.quantization(name)


@descriptor_rule("quantization.buffer_index.data", MUST, "quantization.md § Buffer Table Placement Rules",
                 "A quantization-parameter buffer is distinct from the buffers the layout uses for the tensor data.",
                 when=_WITH_AXIS)
def _qindex_data(desc, ctx):
    base = layout_buffer_count(desc)
    if base is None:
        return
    for name, index in quantization_buffer_indices(desc.quantization):
        if index < base:
            return f"{name} {index} points at a buffer the layout uses for data", ctx.quantization(name)


@descriptor_rule("quantization.buffer.device", MUST, "quantization.md § Buffer Table Placement Rules",
                 "A quantization-parameter buffer has the same device_tag as the tensor data buffer.",
                 when=_WITH_AXIS)
def _qdevice(desc, ctx):
    h = data_handle(desc)
    if h is None:
        return
    for name, index in quantization_buffer_indices(desc.quantization):
        if 0 < index < len(desc.buffers) and desc.buffers[index].device_tag != h.device_tag:
            return f"parameter buffer {index} is on device 0x{desc.buffers[index].device_tag:02X}, data on " \
                  f"0x{h.device_tag:02X}", ctx.buffer(index, "device_tag")


def _width(element_type) -> int:
    return element_type_info(element_type).byte_width


_BLOCK_CLASSES = _classes(*quantization_tables.BLOCK_SIZE_BOUNDS)
_SCALE_WIDTH = {SCHEMES[scheme]: None if element_type is None else _width(element_type)
                for scheme, element_type in quantization_tables.SCALE_BUFFER_TYPES.items()}
"""Scheme class -> bytes of one scale (``None``: the width of its scale_type_tag)."""
_SCALE_TYPE_WIDTH = {SCHEMES[scheme]: {tag: _width(tag) for tag in tags} for scheme, tags in _SCALE_TYPES.items()}
_ZERO_POINT_WIDTH = {SCHEMES[scheme]: _width(element_type)
                     for scheme, element_type in quantization_tables.ZERO_POINT_BUFFER_TYPES.items()}


def _param_sizes(desc) -> dict[int, int]:
    """Exact byte size each parameter buffer index must have (empty when not computable)."""
    q = desc.quantization
    shape = desc.shape
    axis = getattr(q, "axis", None)
    if axis is None or axis >= len(shape) or _DYNAMIC in shape:
        return {}
    cls = q.__class__
    if cls in _BLOCK_CLASSES:
        if q.block_size <= 0:
            return {}
        others = 1
        for k, d in enumerate(shape):
            if k != axis:
                others *= d
        count = -(-shape[axis] // q.block_size) * others  # partial trailing block counted
    else:  # one parameter per channel
        count = shape[axis]
    width = _SCALE_WIDTH[cls]
    if width is None:
        width = _SCALE_TYPE_WIDTH[cls].get(q.scale_type_tag)
        if width is None:
            return {}
    sizes = {q.scale_buffer_index: count * width}
    zero_point_width = _ZERO_POINT_WIDTH.get(cls)
    if zero_point_width is not None and not q.flags & SYMMETRIC:
        index = q.zero_point_buffer_index  # one shared entry holds [scales | zero_points] end to end
        sizes[index] = sizes.get(index, 0) + count * zero_point_width
    return sizes


@descriptor_rule("quantization.buffer.size", MUST, "quantization/per-block-affine.md § Referenced Buffers",
                 "Each scale / zero-point buffer has exactly the byte size its scheme derives from the shape "
                 "(0 bytes when the quantization axis is empty, ADR-007 § 8); not checked while a dimension is "
                 "dynamic or for block-paged tensors.", when=_WITH_AXIS)
def _qsize(desc, ctx):
    if isinstance(desc.layout, BlockPagedLayout):
        return  # per-page-slot parameters: sized by the page pool (layouts/block-paged.md)
    for index, size in _param_sizes(desc).items():
        if index < len(desc.buffers) and desc.buffers[index].byte_size != size:
            return f"parameter buffer {index} holds {desc.buffers[index].byte_size} bytes, exactly {size} required", \
                ctx.buffer(index)
