"""Rules on the quantization section (``quantization.md`` and ``quantization/*.md``).

What each scheme accepts (storage types, scale types, block sizes, flags) and which
parameter buffers it references are data beside the scheme declarations
(:mod:`hurray_schema.structs.quantization`); the rules here read them.
"""

from __future__ import annotations

import math
from typing import Optional

import attrs

from ...model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, SCHEMES, BlockPagedLayout, ColumnMajorLayout, Mxfp, Nf4, PerBlockAffine,
    PerChannelAffine, PerTensorAffine, QuantScheme, RowMajorLayout, UnknownQuantization,
)
from ...structs import quantization as quantization_tables
from ...structs._declare import valid_source
from ...structs.element_types import element_type_info
from ..engine import Level
from .dispatch import When, descriptor_rule, evaluated
from .sizes import (
    SYMMETRIC, layout_class_buffer_count,
    failing_parameter_index, parameter_indices_source, storage_bytes,
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


def _known(s) -> bool:
    """A scheme this reader knows is present under ``s`` (the conditions' first question)."""
    return s.scheme is not None and s.scheme is not UnknownQuantization


def _with_axis(s) -> bool:
    return s.scheme is not None and "axis" in attrs.fields_dict(s.scheme)


def _hex_list(tags) -> str:
    """``0x01, 0x02 or 0x03``."""
    names = [f"0x{tag:02X}" for tag in sorted(tags)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@descriptor_rule("quantization.flags.reserved", MUST, "quantization.md § Descriptor Header",
                 "Quantization flag bits the scheme does not define are 0 (bits 1-15 for per-channel and per-block "
                 "affine, every bit for per-tensor affine, NF4 and MXFP).", when=_KNOWN,
                 passes=lambda s: not _known(s) or f"not q.flags & {~quantization_tables.DEFINED_FLAGS[s.scheme.scheme]}")
def _qflags(desc, ctx):
    q = desc.quantization
    return f"reserved quantization flag bits 0x{q.flags & ~quantization_tables.DEFINED_FLAGS[q.scheme]:04X} are set", \
        ctx.quantization("flags")


@descriptor_rule("quantization.scheme_version.value", MUST, "quantization/per-tensor-affine.md § Binary Encoding",
                 "scheme_version of every scheme defined here is 0x01 (a newer one is the structural rule "
                 "quantization.scheme_version; 0x00 is not a version).", when=_KNOWN,
                 passes=lambda s: not _known(s) or s.scheme_version != 0)
def _qversion(desc, ctx):
    return "scheme_version is 0x00, not 0x01", ctx.quantization("scheme_version")


@descriptor_rule("quantization.reserved", MUST, "quantization/per-channel-affine.md § Validity Constraints",
                 "The _reserved bytes of a per-tensor, per-channel or per-block affine descriptor are zero.",
                 when=_AFFINE, passes=lambda s: s.scheme not in (PerTensorAffine, PerChannelAffine, PerBlockAffine)
                 or valid_source(quantization_tables.SCHEMES[s.scheme.scheme], "_reserved", "q._reserved"))
def _qreserved(desc, ctx):
    return f"quantization _reserved bytes are {desc.quantization._reserved.hex()}", ctx.quantization("_reserved")


@descriptor_rule("quantization.axis", MUST, "quantization/per-block-affine.md § Validity Constraints",
                 "The quantization axis of a per-channel, per-block, NF4 or MXFP descriptor is below rank.",
                 when=_WITH_AXIS, passes=lambda s: not _with_axis(s) or f"q.axis < {s.rank}")
def _qaxis(desc, ctx):
    return f"quantization axis {desc.quantization.axis} is not below rank {desc.rank}", ctx.quantization("axis")


@descriptor_rule("quantization.axis.dynamic", MUST, "data-model.md § Dynamic Dimensions",
                 "A scheme needing the size of its axis rejects a dynamic shape[axis].", when=_WITH_AXIS,
                 passes=lambda s: not _with_axis(s) or f"(q.axis >= {s.rank} or shape[q.axis] != {_DYNAMIC})")
def _qaxis_dynamic(desc, ctx):
    axis = desc.quantization.axis
    return f"shape[{axis}] (the quantization axis) is dynamic", ctx.shape(axis)


def _block_size_rule(scheme: QuantScheme, name: str):
    cls, page = SCHEMES[scheme], _PAGES[scheme]
    low, high = quantization_tables.BLOCK_SIZE_BOUNDS[scheme]
    words = f"a power of two >= {low}" if high is None else f"a power of two in [{low}, {high}]"

    @descriptor_rule(f"quantization.{name}.block_size", MUST, f"quantization/{page}.md § Validity Constraints",
                     f"block_size is {words}.", when=When(schemes={cls}),
                     passes=lambda s: s.scheme is not cls or f"(q.block_size >= {low} and "
                     f"{valid_source(quantization_tables.SCHEMES[scheme], 'block_size', 'q.block_size')}"
                     f"{'' if high is None else f' and q.block_size <= {high}'})")
    def report(desc, ctx):
        return f"block_size {desc.quantization.block_size} is not {words}", ctx.quantization("block_size")

    return report


_block_size_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block")
_block_size_rule(QuantScheme.NF4, "nf4")
_block_size_rule(QuantScheme.MXFP, "mxfp")


@descriptor_rule("quantization.block_size.upper", MUST, "quantization/per-block-affine.md § Validity Constraints",
                 "For per-block affine and NF4, block_size is at most shape[axis] when shape[axis] > 0; the bound "
                 "is waived for an empty axis (ADR-007 § 8).", when=_BLOCKED_AFFINE_OR_NF4,
                 passes=lambda s: s.scheme not in (PerBlockAffine, Nf4)
                 or f"(q.axis >= {s.rank} or not 0 < shape[q.axis] != {_DYNAMIC} or q.block_size <= shape[q.axis])")
def _block_upper(desc, ctx):
    q = desc.quantization
    return f"block_size {q.block_size} exceeds shape[{q.axis}] = {desc.shape[q.axis]}", ctx.quantization("block_size")


@descriptor_rule("quantization.block_padding", MUST, "quantization/per-block-affine.md § Padding",
                 "With per-block affine or NF4 and a partial trailing block, the data buffer of a row- or "
                 "column-major tensor still holds full blocks: ceil(shape[axis] / block_size) * block_size "
                 "elements along the axis.",
                 when=When(layouts={RowMajorLayout, ColumnMajorLayout}, schemes={PerBlockAffine, Nf4}),
                 passes=lambda s: _block_padding_form(s))
def _block_padding(desc, ctx):
    q = desc.quantization
    size, padded, need = desc.shape[q.axis], *_padded_need(desc)
    return (f"buffer 0 holds {desc.buffers[0].byte_size} bytes; shape[{q.axis}] = {size} padded to {padded} needs "
            f"{desc.byte_offset + need}"), ctx.buffer(0)


def _padded_need(desc) -> tuple[int, Optional[int]]:
    """The padded length of the quantization axis and the bytes of every element of the padded tensor
    (None where only an extension type describes the storage)."""
    q = desc.quantization
    padded = -(-desc.shape[q.axis] // q.block_size) * q.block_size
    return padded, storage_bytes(desc, padded * math.prod(d for k, d in enumerate(desc.shape) if k != q.axis))


def _block_padding_form(s):
    """No partial trailing block (nothing to pad), or buffer 0 holds the padded tensor after byte_offset."""
    if s.scheme not in (PerBlockAffine, Nf4) or not s.buffer_count or not issubclass(
            s.layout, (RowMajorLayout, ColumnMajorLayout)):
        return True
    return (f"(q.axis >= {s.rank} or q.block_size <= 0 or {_DYNAMIC} in shape or shape[q.axis] % q.block_size == 0"
            f" or (m := {s.const(_padded_need)}(desc)[1]) is None or byte_offset + m <= h0.byte_size)")


@descriptor_rule("quantization.mxfp.multiple", MUST, "quantization/mxfp.md § Validity Constraints",
                 "shape[axis] of an MXFP tensor is a multiple of block_size (no partial block); an empty axis is "
                 "accepted per ADR-007 § 8.", when=When(schemes={Mxfp}),
                 passes=lambda s: s.scheme is not Mxfp or f"(q.axis >= {s.rank} or q.block_size <= 0 or "
                 f"shape[q.axis] == {_DYNAMIC} or shape[q.axis] % q.block_size == 0)")
def _mxfp_multiple(desc, ctx):
    q = desc.quantization
    return f"shape[{q.axis}] = {desc.shape[q.axis]} is not a multiple of block_size {q.block_size}", ctx.shape(q.axis)


_PER_TENSOR = When(schemes={PerTensorAffine})


@descriptor_rule("quantization.per_tensor.scale", MUST, "quantization/per-tensor-affine.md § Validity Constraints",
                 "The per-tensor scale is finite and non-zero.", when=_PER_TENSOR,
                 passes=lambda s: s.scheme is not PerTensorAffine or f"{s.const(math.isfinite)}(q.scale) and q.scale != 0.0")
def _pt_scale(desc, ctx):
    return f"scale {desc.quantization.scale!r} is not finite and non-zero", ctx.quantization("scale")


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
                 "The per-tensor zero_point lies in the range of the storage type.", when=_PER_TENSOR,
                 passes=lambda s: s.scheme is not PerTensorAffine or s.type_tag not in _ZERO_POINT_RANGE
                 or "{} <= q.zero_point <= {}".format(*_ZERO_POINT_RANGE[s.type_tag]))
def _pt_zero(desc, ctx):
    lo, hi = _ZERO_POINT_RANGE[desc.type_tag]
    return f"zero_point {desc.quantization.zero_point} is outside [{lo}, {hi}]", ctx.quantization("zero_point")


def _scale_type_rule(scheme: QuantScheme, name: str, summary: str):
    cls, page, allowed = SCHEMES[scheme], _PAGES[scheme], _SCALE_TYPES[scheme]
    words = _hex_list(allowed)

    @descriptor_rule(f"quantization.{name}.scale_type", MUST, f"quantization/{page}.md § Validity Constraints",
                     summary, when=When(schemes={cls}),
                     passes=lambda s: s.scheme is not cls or f"q.scale_type_tag in {s.const(allowed)}")
    def report(desc, ctx):
        return f"scale_type_tag 0x{desc.quantization.scale_type_tag:02X} is not {words}", \
            ctx.quantization("scale_type_tag")

    return report


_scale_type_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel",
                 "scale_type_tag of per-channel affine version 1 is 0x03 (float32).")
_scale_type_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block", "scale_type_tag of per-block affine is 0x01, 0x02 or 0x03.")


def _symmetric_index_rule(scheme: QuantScheme, name: str, level: Level, summary: str):
    cls, page = SCHEMES[scheme], _PAGES[scheme]

    @descriptor_rule(f"quantization.{name}.symmetric_index", level, f"quantization/{page}.md § Binary Encoding",
                     summary, when=When(schemes={cls}),
                     passes=lambda s: s.scheme is not cls
                     or f"(not q.flags & {SYMMETRIC} or q.zero_point_buffer_index == {NO_BUFFER_INDEX})")
    def report(desc, ctx):
        return f"symmetric but zero_point_buffer_index is {desc.quantization.zero_point_buffer_index}", \
            ctx.quantization("zero_point_buffer_index")

    return report


_symmetric_index_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel", MUST,
                      "With the SYMMETRIC flag, zero_point_buffer_index is 0xFFFFFFFF.")
_symmetric_index_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block", SHOULD,
                      "With the SYMMETRIC flag, zero_point_buffer_index is ignored and should be 0xFFFFFFFF.")


def _storage_rule(scheme: QuantScheme, name: str):
    cls, page, storage = SCHEMES[scheme], _PAGES[scheme], _STORAGE[scheme]
    allowed = ", ".join(f"0x{t:02X}" for t in sorted(storage))

    @descriptor_rule(f"quantization.{name}.storage_type", MUST, f"quantization/{page}.md § Valid Storage Types",
                     f"The storage type_tag of a {page} tensor is one of {allowed}.", when=When(schemes={cls}),
                     passes=lambda s: s.scheme is not cls or s.type_tag in storage)
    def report(desc, ctx):
        return f"storage type 0x{desc.type_tag:02X} is not valid for {page}", ctx.header("type_tag")

    return report


_storage_rule(QuantScheme.PER_TENSOR_AFFINE, "per_tensor")
_storage_rule(QuantScheme.PER_CHANNEL_AFFINE, "per_channel")
_storage_rule(QuantScheme.PER_BLOCK_AFFINE, "per_block")
_storage_rule(QuantScheme.NF4, "nf4")
_storage_rule(QuantScheme.MXFP, "mxfp")


@descriptor_rule("quantization.buffer_index.range", MUST, "quantization/per-channel-affine.md § Referenced Buffers",
                 "Every parameter buffer index (scale, and zero point unless symmetric) is below buffer_count.",
                 when=_WITH_AXIS, passes=lambda s: parameter_indices_source(s, _below_count(s)) or True)
def _qindex_range(desc, ctx):
    name, index = failing_parameter_index(desc, "quantization.buffer_index.range", _below_count)
    return f"{name} {index} is not below buffer_count {len(desc.buffers)}", ctx.quantization(name)


def _below_count(s) -> str:
    return f"{{index}} < {s.buffer_count}"


@descriptor_rule("quantization.buffer_index.data", MUST, "quantization.md § Buffer Table Placement Rules",
                 "A quantization-parameter buffer is distinct from the buffers the layout uses for the tensor data.",
                 when=_WITH_AXIS, passes=lambda s: _index_data_form(s))
def _qindex_data(desc, ctx):
    name, index = failing_parameter_index(desc, "quantization.buffer_index.data", _past_layout_buffers)
    return f"{name} {index} points at a buffer the layout uses for data", ctx.quantization(name)


def _past_layout_buffers(s) -> str:
    return f"{{index}} >= {layout_class_buffer_count(s.layout, s.rank)}"


def _index_data_form(s):
    return layout_class_buffer_count(s.layout, s.rank) is None or parameter_indices_source(
        s, _past_layout_buffers(s)) or True


def _on_data_device_test(s) -> str:
    """A parameter buffer index inside the table, other than 0, names a buffer on buffer 0's device."""
    return f"(not 0 < {{index}} < {s.buffer_count} or buffers[{{index}}].device_tag == h0.device_tag)"


def _on_data_device(s):
    return not s.buffer_count or parameter_indices_source(s, _on_data_device_test(s)) or True


@descriptor_rule("quantization.buffer.device", MUST, "quantization.md § Buffer Table Placement Rules",
                 "A quantization-parameter buffer has the same device_tag as the tensor data buffer.",
                 when=_WITH_AXIS, passes=_on_data_device)
def _qdevice(desc, ctx):
    buffers = desc.buffers
    _, index = failing_parameter_index(desc, "quantization.buffer.device", _on_data_device_test)
    return f"parameter buffer {index} is on device 0x{buffers[index].device_tag:02X}, data on " \
        f"0x{buffers[0].device_tag:02X}", ctx.buffer(index, "device_tag")


def _width(element_type) -> int:
    return element_type_info(element_type).byte_width


_BLOCK_CLASSES = _classes(*quantization_tables.BLOCK_SIZE_BOUNDS)
_SCALE_WIDTH = {SCHEMES[scheme]: None if element_type is None else _width(element_type)
                for scheme, element_type in quantization_tables.SCALE_BUFFER_TYPES.items()}
"""Scheme class -> bytes of one scale (``None``: the width of its scale_type_tag)."""
_SCALE_TYPE_WIDTH = {SCHEMES[scheme]: {tag: _width(tag) for tag in tags} for scheme, tags in _SCALE_TYPES.items()}
_ZERO_POINT_WIDTH = {SCHEMES[scheme]: _width(element_type)
                     for scheme, element_type in quantization_tables.ZERO_POINT_BUFFER_TYPES.items()}


def _qsize_parts(s) -> tuple[str, list[tuple[str, str, str]]]:
    """The exemption and the ``(holds, buffer index, size)`` clauses of ``quantization.buffer.size``
    under ``s``, as expressions: the scale buffer holds ``count * width`` bytes; a zero-point
    buffer (unless symmetric) ``count * zero-point width``, and one entry shared by both holds the
    two end to end.  ``count`` is one parameter per channel, or per block with a partial trailing
    block counted.  Exempt: no axis below the rank, a dynamic dimension, a block size of 0 or a
    scale type whose width is not known."""
    cls, rank, count_ = s.scheme, s.rank, s.buffer_count
    exempt = f"q.axis >= {rank} or {_DYNAMIC} in shape"
    count = "shape[q.axis]"
    if cls in _BLOCK_CLASSES:
        exempt += " or q.block_size <= 0"
        others = " * ".join(f"(1 if q.axis == {k} else shape[{k}])" for k in range(rank))
        count = f"-(-shape[q.axis] // q.block_size) * {others}"
    width = _SCALE_WIDTH[cls]
    if width is None:
        exempt += f" or (w := {s.const(_SCALE_TYPE_WIDTH[cls])}.get(q.scale_type_tag)) is None"
        width = "w"
    scale = f"({count}) * {width}"
    zero_point_width = _ZERO_POINT_WIDTH.get(cls)
    if zero_point_width is None:
        return exempt, [(f"(q.scale_buffer_index >= {count_} or buffers[q.scale_buffer_index].byte_size == {scale})",
                         "q.scale_buffer_index", scale)]
    separate = f"(q.flags & {SYMMETRIC} or q.zero_point_buffer_index != q.scale_buffer_index)"
    zero_points = f"({count}) * {zero_point_width}"
    scale = f"({scale} + (0 if {separate} else {zero_points}))"
    return exempt, [
        (f"(q.scale_buffer_index >= {count_} or buffers[q.scale_buffer_index].byte_size == {scale})",
         "q.scale_buffer_index", scale),
        (f"(q.flags & {SYMMETRIC} or q.zero_point_buffer_index == q.scale_buffer_index or "
         f"q.zero_point_buffer_index >= {count_} or buffers[q.zero_point_buffer_index].byte_size == {zero_points})",
         "q.zero_point_buffer_index", zero_points),
    ]


def _sized_here(s) -> bool:
    """Whether ``quantization.buffer.size`` sizes parameter buffers under ``s`` (not for a block-paged
    tensor, whose per-page-slot parameters the page pool sizes: ``layouts/block-paged.md``)."""
    return s.scheme in _SCALE_WIDTH and not issubclass(s.layout, BlockPagedLayout) and s.rank > 0


def _qsize_form(s):
    if not _sized_here(s):
        return True
    exempt, clauses = _qsize_parts(s)
    return f"({exempt} or ({' and '.join(holds for holds, _, _ in clauses)}))"


def _qsize_report_form(s) -> str:
    exempt, clauses = _qsize_parts(s)
    return f"([] if ({exempt}) else [{', '.join(f'({h}, {i}, {n})' for h, i, n in clauses)}])"


@descriptor_rule("quantization.buffer.size", MUST, "quantization/per-block-affine.md § Referenced Buffers",
                 "Each scale / zero-point buffer has exactly the byte size its scheme derives from the shape "
                 "(0 bytes when the quantization axis is empty, ADR-007 § 8); not checked while a dimension is "
                 "dynamic or for block-paged tensors.", when=_WITH_AXIS, passes=_qsize_form)
def _qsize(desc, ctx):
    for holds, index, size in evaluated("quantization.buffer.size", desc, _qsize_report_form):
        if not holds:
            return f"parameter buffer {index} holds {desc.buffers[index].byte_size} bytes, exactly {size} required", \
                ctx.buffer(index)
