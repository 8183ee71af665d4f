"""Semantic rules of one tensor descriptor.

Each rule below is one reader-side normative statement of ``metadata.md``, the layout
pages, the quantization pages, ``element-types.md``, ``buffer-protocol.md``,
``data-model.md`` or ADR-007 that can be decided from a single decoded descriptor.
The structural rules (the ones the decoder fires itself) are in
:mod:`hurray_schema.rules.structure`.

A check is ``check(desc, ctx)`` and yields :class:`~hurray_schema.rules.engine.Finding` s.
The byte offset of a finding is derived from the wire declarations
(:func:`hurray_schema.structs.wire.descriptor_spans` for where each part starts, the
declared tables for where a field sits inside its part); offsets are only computed when
a rule fires, so a clean descriptor costs no re-encoding.

Interpretations (see ``spec-map.md``):

* The ADR-007 zero-byte rule ("the data buffer(s) of an empty tensor have byte size 0")
  is applied to the data buffer of dense layouts (buffer 0) and to the values buffer of
  sparse layouts (buffer 0); index buffers keep their own sizes (a CSR ``row_ptr`` of an
  ``[0, 5]`` matrix still holds one entry).  Morton is exempt: its page always holds
  ``2**sum(morton_bits)`` elements.
* An empty MXFP quantization axis is accepted (ADR-007 § 8 wins over the
  "positive multiple" wording of ``quantization/mxfp.md``); its scale buffer is empty.
* The "only row-major for scalars" rule does not apply to a composite head (which owns
  no data) nor to private/unknown layouts.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, Optional

from ..model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, BlockPagedLayout, ColumnMajorLayout, CompositeLayout,
    CooLayout, CscLayout, CsfLayout, CsrLayout, DescriptorFlag, DeviceTag, ElementType,
    ExtensionLayout, HilbertLayout, LayoutTag, MemoryClass, MortonLayout, Mxfp, Nf4,
    PerBlockAffine, PerChannelAffine, PerTensorAffine, QuantFlag, RowMajorLayout, StatisticsMask,
    StridedLayout, TensorDescriptor, TiledLayout, UnknownLayout, UnknownQuantization,
)
from ..structs import layouts as L
from ..structs import quantization as Q
from ..structs import sections as X
from ..structs._declare import plan, static_offset
from ..structs.descriptor import BUFFER_COUNT, BUFFER_HANDLE, BYTE_OFFSET, FIXED_HEADER, SHAPE
from ..structs.element_types import element_type_info, is_private_type
from ..structs.wire import descriptor_spans, values_of
from .engine import Finding, Level, Mode, Rule, as_mode, declare

__all__ = [
    "check_descriptor", "first_error", "DescriptorContext", "DESCRIPTOR_RULES", "storage_bytes",
    "layout_buffer_count", "quantization_buffer_indices",
]

MUST, MUST_NOT, SHOULD = Level.MUST, Level.MUST_NOT, Level.SHOULD

DESCRIPTOR_RULES: list[Rule] = []
"""The rules :func:`check_descriptor` runs, in declaration order (roughly wire order)."""

_RAW: dict[str, Callable] = {}
"""Rule id -> its check yielding ``(message, offset)`` (the registered check wraps it into Findings)."""

_DYN = DYNAMIC_DIMENSION
_HANDLE_SIZE = plan(BUFFER_HANDLE).fixed_size
_COUNT_SIZE = plan(BUFFER_COUNT).fixed_size
_QLEN_SIZE = plan(Q.QUANTIZATION_LENGTH).fixed_size
_TILED_PLAN = plan(L.TILED)


# ------------------------------------------------------------------------------------
# Where a field sits: offsets from the declarations
# ------------------------------------------------------------------------------------


def _subfield(decl, name: str):
    for sub in decl.subcons:
        if getattr(sub, "name", None) == name:
            return sub
    raise KeyError(name)


def _field_offset(decl, name: str, context: dict) -> int:
    """Offset of ``name`` inside table ``decl``; variable-size fields are sized with ``context``."""
    try:
        return static_offset(decl, name)
    except ValueError:
        pass
    offset = 0
    for sub in decl.subcons:
        if getattr(sub, "name", None) == name:
            return offset
        offset += sub.sizeof(**context)
    raise KeyError(name)


def _element_width(decl, name: str) -> int:
    """Byte width of one element of the array field ``name`` of ``decl``."""
    array = _subfield(decl, name).subcon
    while not hasattr(array, "count") and hasattr(array, "subcon"):
        array = array.subcon  # through If(...)
    return array.subcon.sizeof()


class DescriptorContext:
    """What a check needs besides the descriptor: the mode and where each field sits."""

    __slots__ = ("desc", "mode", "base", "_spans")

    def __init__(self, desc: TensorDescriptor, mode: Mode = Mode.STRICT, base: int = 0):
        self.desc = desc
        self.mode = mode
        self.base = base
        self._spans: Optional[dict] = None

    def part(self, name: str) -> int:
        """Absolute offset of the first byte of descriptor part ``name``."""
        if self._spans is None:
            self._spans = {part: start for part, start, _ in descriptor_spans(self.desc)}
        return self.base + self._spans[name]

    def header(self, name: str) -> int:
        return self.part("fixed_header") + static_offset(FIXED_HEADER, name)

    def shape(self, k: int = 0) -> int:
        return self.part("shape") + k * _element_width(SHAPE, "shape")

    def byte_offset(self) -> int:
        return self.part("byte_offset") + static_offset(BYTE_OFFSET, "byte_offset")

    def buffer(self, i: int, name: str = "byte_size") -> int:
        return self.part("buffer_table") + _COUNT_SIZE + i * _HANDLE_SIZE + static_offset(BUFFER_HANDLE, name)

    def buffer_count(self) -> int:
        return self.part("buffer_table") + static_offset(BUFFER_COUNT, "buffer_count")

    def layout(self, name: str, index: int = 0, level: int = 0) -> int:
        """A layout-specific field (``index``: array element; ``level``: tiled nesting level)."""
        layout = self.desc.layout
        rank = self.desc.rank
        start = self.part("layout")
        if isinstance(layout, TiledLayout):
            decl = L.TILED
            for _ in range(level):
                start += len(_TILED_PLAN.pack(rank=rank, **values_of(layout)))
                layout = layout.inner
        else:
            decl = L.LAYOUT_FIELDS[LayoutTag(layout.tag)]
        context = dict(values_of(layout), rank=rank)
        at = start + _field_offset(decl, name, context)
        return at + index * _element_width(decl, name) if index else at

    def quantization(self, name: str) -> int:
        q = self.desc.quantization
        decl = Q.SCHEMES[q.scheme]
        return self.part("quantization") + _QLEN_SIZE + static_offset(decl, name)

    def section(self, part: str, decl, name: str, index: int = 0) -> int:
        at = self.part(part) + _field_offset(decl, name, {"rank": self.desc.rank})
        return at + index * _element_width(decl, name) if index else at


# ------------------------------------------------------------------------------------
# Declaring a rule with its check
# ------------------------------------------------------------------------------------


def _rule(id: str, level: Level, citation: str, summary: str, *, scope: str = "descriptor",
          permissive: bool = False):
    """Declare a descriptor rule whose check yields ``(message, offset)`` pairs."""

    def wrap(fn: Callable[[TensorDescriptor, DescriptorContext], Iterator[tuple[str, Optional[int]]]]) -> Rule:
        holder: list[Rule] = []

        def check(desc: TensorDescriptor, ctx: DescriptorContext) -> Iterator[Finding]:
            rule = holder[0]
            for message, offset in fn(desc, ctx):
                yield rule.finding(message, offset, ctx.mode)

        rule = declare(id, level, citation, summary, scope=scope, permissive=permissive, check=check)
        holder.append(rule)
        DESCRIPTOR_RULES.append(rule)
        _RAW[id] = fn
        return rule

    return wrap


# ------------------------------------------------------------------------------------
# Helpers shared by the rules
# ------------------------------------------------------------------------------------

_DENSE = {LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.STRIDED, LayoutTag.TILED,
          LayoutTag.MORTON, LayoutTag.HILBERT}
_SPARSE = (CooLayout, CsrLayout, CscLayout, CsfLayout)
_HAS_COMPOSITE_MEMBER = int(DescriptorFlag.HAS_COMPOSITE_MEMBER)
# plain ints: IntFlag arithmetic costs a microsecond per operation on the decode path
_SYMMETRIC = int(QuantFlag.SYMMETRIC)
_NNZ_VALID = int(StatisticsMask.NNZ_VALID)
_VALUE_STATS_VALID = int(StatisticsMask.VALUE_STATS_VALID)
_NM_SPARSITY_VALID = int(StatisticsMask.NM_SPARSITY_VALID)


def _known_layout(desc) -> bool:
    return not isinstance(desc.layout, (UnknownLayout, ExtensionLayout))


def _dynamic(desc) -> bool:
    return _DYN in desc.shape


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def storage_bytes(desc: TensorDescriptor, count: int) -> Optional[int]:
    """Bytes holding ``count`` packed elements of the descriptor's storage type, or None if unknown."""
    info = element_type_info(desc.type_tag)
    if info is not None:
        return info.buffer_bytes(count)
    ext = desc.extension_type
    if ext is not None and is_private_type(desc.type_tag) and ext.bit_width > 0:
        if ext.bit_width >= 8:
            return count * (-(-ext.bit_width // 8))
        if ext.bit_width in (1, 2, 4):
            return -(-count * ext.bit_width // 8)
    return None


def layout_buffer_count(desc: TensorDescriptor) -> Optional[int]:
    """Buffers the layout itself uses (data, values, indices, pointers), None if not fixed."""
    layout = desc.layout
    tag = layout.tag
    if tag in _DENSE:
        return 1
    if isinstance(layout, CooLayout):
        return 2
    if isinstance(layout, (CsrLayout, CscLayout)):
        return 3
    if isinstance(layout, CsfLayout):
        return 2 * desc.rank + 1
    if isinstance(layout, BlockPagedLayout):
        return 3
    if isinstance(layout, CompositeLayout):
        return 0
    return None


def quantization_buffer_indices(q) -> list[tuple[str, int]]:
    """``(field name, buffer index)`` of every parameter buffer the scheme references."""
    if isinstance(q, (PerChannelAffine, PerBlockAffine)):
        out = [("scale_buffer_index", q.scale_buffer_index)]
        if not q.flags & _SYMMETRIC:
            out.append(("zero_point_buffer_index", q.zero_point_buffer_index))
        return out
    if isinstance(q, (Nf4, Mxfp)):
        return [("scale_buffer_index", q.scale_buffer_index)]
    return []


def _quant_param_count(q) -> int:
    if q is None or isinstance(q, UnknownQuantization):
        return 0
    return len({index for _, index in quantization_buffer_indices(q)})


def _axis_ok(desc) -> bool:
    q = desc.quantization
    return hasattr(q, "axis") and q.axis < desc.rank


def _num_blocks(desc) -> Optional[int]:
    """Blocks of a per-block / NF4 / MXFP scheme (partial trailing block counted), None if unknown."""
    q = desc.quantization
    if not _axis_ok(desc) or _dynamic(desc) or q.block_size <= 0:
        return None
    size = desc.shape[q.axis]
    others = math.prod(d for k, d in enumerate(desc.shape) if k != q.axis)
    return -(-size // q.block_size) * others


def _data_handle(desc):
    return desc.buffers[0] if desc.buffers else None


# ------------------------------------------------------------------------------------
# data-model.md, metadata.md § Flags / § Core Variable Fields
# ------------------------------------------------------------------------------------

DM = "data-model.md"


@_rule("data_model.scalar.layout", MUST_NOT, "data-model.md § Scalar Tensors",
       "A rank-0 tensor uses the row-major layout only (no strided, tiled, sparse or other layout).")
def _scalar_layout(desc, ctx):
    if desc.rank == 0 and _known_layout(desc) and not isinstance(desc.layout, (RowMajorLayout, CompositeLayout)):
        yield f"a scalar (rank 0) tensor carries layout 0x{desc.layout.tag:02X}; only row-major (0x01) is allowed", \
            ctx.header("layout_tag")


@_rule("data_model.shard.dynamic", MUST_NOT, "data-model.md § Dynamic Dimensions",
       "A tensor with a shard section has no dynamic dimension, in its shape or in the shard's parent_shape.")
def _shard_dynamic(desc, ctx):
    if desc.shard is None or (_DYN not in desc.shape and _DYN not in desc.shard.parent_shape):
        return
    for k, d in enumerate(desc.shape):
        if d == _DYN:
            yield f"shape[{k}] is the dynamic sentinel in a sharded tensor", ctx.shape(k)
            return
    for k, d in enumerate(desc.shard.parent_shape):
        if d == _DYN:
            yield f"parent_shape[{k}] is the dynamic sentinel", ctx.section("shard", X.SHARD_SECTION, "parent_shape", k)
            return


@_rule("metadata.flags.extension_type", MUST, "metadata.md § Flags",
       "HAS_EXTENSION_TYPE is set if and only if type_tag is a private type (0xF0-0xFE).")
def _ext_flag(desc, ctx):
    private = is_private_type(desc.type_tag)
    if private and desc.extension_type is None and not desc.unparsed_flags:
        yield f"private type_tag 0x{desc.type_tag:02X} without an Extension Type section", ctx.header("flags")
    elif desc.extension_type is not None and not private:
        yield f"Extension Type section present but type_tag 0x{desc.type_tag:02X} is not private", ctx.header("flags")


@_rule("metadata.byte_offset.bounds", MUST, "metadata.md § byte_offset",
       "byte_offset is at most the byte size of buffer 0.")
def _byte_offset_bounds(desc, ctx):
    h = _data_handle(desc)
    if h is not None and desc.byte_offset > h.byte_size:
        yield f"byte_offset {desc.byte_offset} exceeds buffer 0's byte_size {h.byte_size}", ctx.byte_offset()


# ------------------------------------------------------------------------------------
# Layout-specific fields (layouts/*.md, metadata.md § Layout-Specific Fields)
# ------------------------------------------------------------------------------------


def _byte_offset_zero(layout_cls, page: str, name: str):
    @_rule(f"layout.{name}.byte_offset", MUST, f"layouts/{page}.md § Buffer Size" if name not in ("block_paged",)
           else "layouts/block-paged.md § byte_offset",
           f"A {name.replace('_', '-')} tensor has byte_offset 0.")
    def check(desc, ctx):
        if isinstance(desc.layout, layout_cls) and desc.byte_offset != 0:
            yield f"byte_offset is {desc.byte_offset}, not 0, for a {name.replace('_', '-')} tensor", ctx.byte_offset()

    return check


def _reserved_zero(layout_cls, page: str, name: str):
    @_rule(f"layout.{name}.reserved", MUST, f"layouts/{page}.md § Additional Descriptor Fields",
           f"The _reserved bytes of the {name.replace('_', '-')} layout fields are zero.")
    def check(desc, ctx):
        if isinstance(desc.layout, layout_cls) and any(desc.layout._reserved):
            yield f"{name.replace('_', '-')} _reserved bytes are {desc.layout._reserved.hex()}", ctx.layout("_reserved")

    return check


def _buffer_count_exact(layout_cls, page: str, name: str, base: Callable[[TensorDescriptor], int], words: str):
    @_rule(f"layout.{name}.buffer_count", MUST, f"layouts/{page}.md § Buffer Table",
           f"A {name.replace('_', '-')} descriptor has buffer_count {words} (plus the quantization-parameter "
           "buffers of its scheme, if quantized).")
    def check(desc, ctx):
        if not isinstance(desc.layout, layout_cls):
            return
        want = base(desc) + _quant_param_count(desc.quantization)
        if len(desc.buffers) != want:
            yield f"buffer_count is {len(desc.buffers)}, expected {want}", ctx.buffer_count()

    return check


def _rank_rule(layout_cls, page: str, name: str, ok: Callable[[int], bool], words: str, section: str = "Description"):
    @_rule(f"layout.{name}.rank", MUST, f"layouts/{page}.md § {section}",
           f"A {name.replace('_', '-')} tensor has rank {words}.")
    def check(desc, ctx):
        if isinstance(desc.layout, layout_cls) and not ok(desc.rank):
            yield f"{name.replace('_', '-')} tensor of rank {desc.rank}; rank {words} required", ctx.header("rank")

    return check


def _no_shard(layout_cls, page: str, name: str):
    @_rule(f"layout.{name}.shard", MUST_NOT, f"layouts/{page}.md § Sharding",
           f"A {name.replace('_', '-')} tensor carries no shard section in this version.")
    def check(desc, ctx):
        if isinstance(desc.layout, layout_cls) and desc.shard is not None:
            yield f"a {name.replace('_', '-')} tensor carries a shard section", ctx.part("shard")

    return check


# --- tiled ---------------------------------------------------------------------------

def _tiled_levels(layout):
    level, depth = layout, 0
    while level is not None:
        yield depth, level
        level, depth = level.inner, depth + 1


@_rule("layout.tiled.tile_shape", MUST, "layouts/tiled.md § Additional Descriptor Fields",
       "Every tile_shape value is greater than 0, at every tiling level.")
def _tile_shape(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            for k, t in enumerate(level.tile_shape):
                if t == 0:
                    yield f"tile_shape[{k}] is 0 (tiling level {depth})", ctx.layout("tile_shape", k, depth)
                    return


@_rule("layout.tiled.outer_layout", MUST, "layouts/tiled.md § Additional Descriptor Fields",
       "outer_layout is 0x01, 0x02 or 0x03.")
def _tiled_outer(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if level.outer_layout not in (1, 2, 3):
                yield f"outer_layout 0x{level.outer_layout:02X} (tiling level {depth})", ctx.layout("outer_layout", 0, depth)


@_rule("layout.tiled.inner_layout", MUST, "layouts/tiled.md § Additional Descriptor Fields",
       "inner_layout is 0x01, 0x02, 0x03 or 0x04 (tile again).")
def _tiled_inner(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if level.inner_layout not in (1, 2, 3, 4):
                yield f"inner_layout 0x{level.inner_layout:02X} (tiling level {depth})", ctx.layout("inner_layout", 0, depth)


@_rule("layout.tiled.reserved", MUST, "layouts/tiled.md § Additional Descriptor Fields",
       "The _reserved bytes of every tiling level are zero.")
def _tiled_reserved(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if any(level._reserved):
                yield f"tiled _reserved bytes are {level._reserved.hex()} (tiling level {depth})", \
                    ctx.layout("_reserved", 0, depth)


# --- morton --------------------------------------------------------------------------

@_rule("layout.morton.bits", MUST, "layouts/morton.md § Additional Descriptor Fields",
       "Every morton_bits value is greater than 0.")
def _morton_bits(desc, ctx):
    if isinstance(desc.layout, MortonLayout):
        for k, b in enumerate(desc.layout.morton_bits):
            if b == 0:
                yield f"morton_bits[{k}] is 0", ctx.layout("morton_bits", k)
                return


@_rule("layout.morton.shape", MUST, "layouts/morton.md § Dimension Size Constraints",
       "shape[k] is at most 2**morton_bits[k] for every dimension.")
def _morton_shape(desc, ctx):
    if isinstance(desc.layout, MortonLayout):
        for k, (d, b) in enumerate(zip(desc.shape, desc.layout.morton_bits)):
            if d != _DYN and b < 64 and d > (1 << b):
                yield f"shape[{k}] = {d} exceeds 2**morton_bits[{k}] = {1 << b}", ctx.shape(k)
                return


# --- sparse --------------------------------------------------------------------------

_reserved_zero(CooLayout, "coo", "coo")
_reserved_zero(CsrLayout, "csr", "csr")
_reserved_zero(CscLayout, "csc", "csc")
_reserved_zero(CsfLayout, "csf", "csf")
_reserved_zero(BlockPagedLayout, "block-paged", "block_paged")
_byte_offset_zero(CooLayout, "coo", "coo")
_byte_offset_zero(CsrLayout, "csr", "csr")
_byte_offset_zero(CscLayout, "csc", "csc")
_byte_offset_zero(CsfLayout, "csf", "csf")
_byte_offset_zero(BlockPagedLayout, "block-paged", "block_paged")
_buffer_count_exact(CooLayout, "coo", "coo", lambda d: 2, "2")
_buffer_count_exact(CsrLayout, "csr", "csr", lambda d: 3, "3")
_buffer_count_exact(CscLayout, "csc", "csc", lambda d: 3, "3")
_buffer_count_exact(CsfLayout, "csf", "csf", lambda d: 2 * d.rank + 1, "2*rank+1")
_rank_rule(CsrLayout, "csr", "csr", lambda r: r == 2, "2")
_rank_rule(CscLayout, "csc", "csc", lambda r: r == 2, "2")
_rank_rule(CsfLayout, "csf", "csf", lambda r: r >= 3, ">= 3")
_rank_rule(BlockPagedLayout, "block-paged", "block_paged", lambda r: r == 3, "3")
_no_shard(CsfLayout, "csf", "csf")
_no_shard(BlockPagedLayout, "block-paged", "block_paged")


@_rule("layout.csf.mode_order", MUST, "layouts/csf.md § Mode Ordering",
       "mode_order is a permutation of 0..rank-1.")
def _csf_mode_order(desc, ctx):
    if isinstance(desc.layout, CsfLayout):
        order = desc.layout.mode_order
        if sorted(order) != list(range(desc.rank)):
            seen: set[int] = set()
            bad = next((k for k, m in enumerate(order) if m >= desc.rank or m in seen or seen.add(m)), 0)
            yield f"mode_order {list(order)} is not a permutation of 0..{desc.rank - 1}", ctx.layout("mode_order", bad)


@_rule("layout.block_paged.paged_axis", MUST, "layouts/block-paged.md § Additional Descriptor Fields",
       "paged_axis is 0 in this version.")
def _paged_axis(desc, ctx):
    if isinstance(desc.layout, BlockPagedLayout) and desc.layout.paged_axis != 0:
        yield f"paged_axis is {desc.layout.paged_axis}, not 0", ctx.layout("paged_axis")


@_rule("layout.block_paged.page_size", MUST, "layouts/block-paged.md § Additional Descriptor Fields",
       "page_size is at least 1.")
def _page_size(desc, ctx):
    if isinstance(desc.layout, BlockPagedLayout) and desc.layout.page_size < 1:
        yield "page_size is 0", ctx.layout("page_size")


@_rule("layout.block_paged.buffer_count", MUST, "layouts/block-paged.md § Buffer Table",
       "A block-paged descriptor has buffer_count >= 3 (page pool, block table, seq_ptr), plus its "
       "quantization-parameter buffers.")
def _paged_count(desc, ctx):
    if isinstance(desc.layout, BlockPagedLayout):
        want = 3 + _quant_param_count(desc.quantization)
        if len(desc.buffers) < want:
            yield f"buffer_count is {len(desc.buffers)}, at least {want} required", ctx.buffer_count()


@_rule("layout.block_paged.quantization", MUST, "layouts/block-paged.md § Per-scheme composition",
       "A block-paged tensor quantized per-block-affine uses axis 0 and block_size equal to page_size.")
def _paged_quant(desc, ctx):
    q = desc.quantization
    if isinstance(desc.layout, BlockPagedLayout) and isinstance(q, PerBlockAffine):
        if q.axis != 0:
            yield f"per-block-affine axis is {q.axis}, not 0, on a block-paged tensor", ctx.quantization("axis")
        elif q.block_size != desc.layout.page_size:
            yield f"block_size {q.block_size} differs from page_size {desc.layout.page_size}", \
                ctx.quantization("block_size")


# --- hilbert -------------------------------------------------------------------------

@_rule("layout.hilbert.order", MUST, "layouts/hilbert.md § Validity Constraints",
       "hilbert_order is greater than 0.")
def _hilbert_order(desc, ctx):
    if isinstance(desc.layout, HilbertLayout) and desc.layout.hilbert_order == 0:
        yield "hilbert_order is 0", ctx.layout("hilbert_order")


@_rule("layout.hilbert.rank", MUST, "layouts/hilbert.md § Validity Constraints",
       "hilbert_rank equals the tensor's rank and is at least 2.")
def _hilbert_rank(desc, ctx):
    if isinstance(desc.layout, HilbertLayout):
        hr = desc.layout.hilbert_rank
        if hr != desc.rank or hr < 2:
            yield f"hilbert_rank {hr} with tensor rank {desc.rank} (must be equal and >= 2)", ctx.layout("hilbert_rank")


@_rule("layout.hilbert.shape", MUST, "layouts/hilbert.md § Validity Constraints",
       "Every dimension equals 2**hilbert_order.")
def _hilbert_shape(desc, ctx):
    if isinstance(desc.layout, HilbertLayout):
        order = desc.layout.hilbert_order
        side = 1 << order if order < 64 else None
        for k, d in enumerate(desc.shape):
            if d != side:
                yield f"shape[{k}] = {d} is not 2**hilbert_order", ctx.shape(k)
                return


# ------------------------------------------------------------------------------------
# Buffer table (metadata.md § Buffer Table, buffer-protocol.md)
# ------------------------------------------------------------------------------------

BP = "buffer-protocol.md"


@_rule("metadata.buffer_count.minimum", MUST, "metadata.md § Buffer Table",
       "buffer_count is at least 1 for every layout but the composite head.")
def _count_min(desc, ctx):
    if isinstance(desc.layout, (UnknownLayout, CompositeLayout)):
        return
    if not desc.buffers:
        yield "buffer_count is 0 for a tensor that is not a composite head", ctx.buffer_count()


@_rule("metadata.buffer_count.dense", MUST, "metadata.md § Buffer Table",
       "A dense layout (0x01-0x05, 0x40) has exactly one buffer, plus the parameter buffers its "
       "quantization scheme requires.")
def _count_dense(desc, ctx):
    if desc.layout.tag in _DENSE and not isinstance(desc.quantization, UnknownQuantization):
        want = 1 + _quant_param_count(desc.quantization)
        if len(desc.buffers) != want:
            yield f"buffer_count is {len(desc.buffers)}, expected {want}", ctx.buffer_count()


def _per_handle(field: str, bad: Callable[[int], bool], what: str):
    """A check that fires once per buffer handle whose ``field`` value ``bad`` accepts."""

    def check(desc, ctx):
        for i, h in enumerate(desc.buffers):
            value = getattr(h, field)
            if bad(value):
                yield f"buffer {i} {field} 0x{value:02X} {what}", ctx.buffer(i, field)

    return check


_rule("buffer.reserved", MUST, "buffer-protocol.md § Buffer Handle",
      "The reserved byte of every buffer handle is zero.")(
    _per_handle("_reserved", lambda v: v != 0, "is not zero"))


@_rule("buffer.alignment.power_of_two", MUST, "buffer-protocol.md § Buffer Handle",
       "alignment is a power of two (empty buffers included).")
def _align_pow2(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if not _pow2(h.alignment):
            yield f"buffer {i} alignment {h.alignment} is not a power of two", ctx.buffer(i, "alignment")


@_rule("buffer.alignment.minimum", MUST, "buffer-protocol.md § Buffer Handle",
       "alignment is at least 64 for a non-empty buffer; an empty buffer (byte_size 0) may declare any "
       "power of two (ADR-007 § 4).")
def _align_min(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.byte_size > 0 and _pow2(h.alignment) and h.alignment < 64:
            yield f"buffer {i} alignment {h.alignment} is below 64 for a {h.byte_size}-byte buffer", \
                ctx.buffer(i, "alignment")


_rule("buffer.device_tag.invalid", MUST, "buffer-protocol.md § Device Tags",
      "device_tag 0xFF is rejected.")(
    _per_handle("device_tag", lambda v: v == 0xFF, "is invalid"))

_rule("buffer.device_tag.reserved", MUST_NOT, "buffer-protocol.md § Device Tags",
      "device_tag 0x09-0xEF is reserved for future versions and is not used.")(
    _per_handle("device_tag", lambda v: 0x09 <= v <= 0xEF, "is reserved"))

_rule("buffer.sync_mode.invalid", MUST, "buffer-protocol.md § Stream and Event Synchronisation",
      "sync_mode 0xFF is rejected.")(
    _per_handle("sync_mode", lambda v: v == 0xFF, "is invalid"))

_rule("buffer.sync_mode.reserved", MUST, "buffer-protocol.md § Stream and Event Synchronisation",
      "sync_mode 0x03-0xFE is reserved and rejected.")(
    _per_handle("sync_mode", lambda v: 0x03 <= v <= 0xFE, "is reserved"))


@_rule("buffer.sync_mode.cpu", MUST, "buffer-protocol.md § Producer Requirement",
       "A CPU buffer (device_tag 0x00) has sync_mode 0x00 (producer-synced).")
def _sync_cpu(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.device_tag == DeviceTag.CPU and h.sync_mode in (1, 2):
            yield f"buffer {i} is on the CPU but declares sync_mode 0x{h.sync_mode:02X}", ctx.buffer(i, "sync_mode")


_rule("buffer.memory_class.invalid", MUST, "buffer-protocol.md § Memory Class Values",
      "memory_class 0xFF is rejected.")(
    _per_handle("memory_class", lambda v: v == 0xFF, "is invalid"))

_rule("buffer.memory_class.reserved", MUST, "buffer-protocol.md § Memory Class Values",
      "memory_class 0x04-0xEF is reserved and rejected.")(
    _per_handle("memory_class", lambda v: 0x04 <= v <= 0xEF, "is reserved"))


@_rule("buffer.memory_class.private", MUST, "buffer-protocol.md § Memory Class Values",
       "A private memory_class (0xF0-0xFE) on a private device is rejected by a reader that does not know "
       "it, unless permissive (out-of-band agreement).", permissive=True)
def _mc_private(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if 0xF0 <= h.memory_class <= 0xFE and 0xF0 <= h.device_tag <= 0xFE:
            yield f"buffer {i} private memory_class 0x{h.memory_class:02X} is not known here", \
                ctx.buffer(i, "memory_class")


_NOT_VALID = {
    DeviceTag.CPU: {MemoryClass.PEER}, DeviceTag.METAL: {MemoryClass.PEER},
    DeviceTag.WEBGPU: {MemoryClass.HOST_PINNED, MemoryClass.UNIFIED, MemoryClass.PEER},
    DeviceTag.HEXAGON: {MemoryClass.PEER}, DeviceTag.OPENCL: {MemoryClass.PEER},
}


@_rule("buffer.memory_class.device", MUST, "buffer-protocol.md § Per-Device Validity",
       "The (device_tag, memory_class) pair is one the per-device table lists as valid (a private class "
       "needs a private device; a private device takes STANDARD or a private class).")
def _mc_device(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.memory_class in _NOT_VALID.get(h.device_tag, ()):
            yield (f"buffer {i}: memory_class {MemoryClass(h.memory_class).name} is not valid on device "
                   f"{DeviceTag(h.device_tag).name}"), ctx.buffer(i, "memory_class")
        elif 0xF0 <= h.device_tag <= 0xFE and 0x01 <= h.memory_class <= 0x03:
            yield (f"buffer {i}: private device 0x{h.device_tag:02X} pairs only with STANDARD or a private "
                   f"memory class, not 0x{h.memory_class:02X}"), ctx.buffer(i, "memory_class")
        elif 0xF0 <= h.memory_class <= 0xFE and not 0xF0 <= h.device_tag <= 0xFE:
            yield (f"buffer {i}: private memory_class 0x{h.memory_class:02X} on non-private device "
                   f"0x{h.device_tag:02X}"), ctx.buffer(i, "memory_class")


@_rule("buffer.colocation", MUST, "buffer-protocol.md § Device Colocation",
       "All buffers of one descriptor share the same device_tag and the same memory_class.")
def _colocation(desc, ctx):
    if not desc.buffers:
        return
    first = desc.buffers[0]
    for i, h in enumerate(desc.buffers[1:], 1):
        if h.device_tag != first.device_tag:
            yield f"buffer {i} device_tag 0x{h.device_tag:02X} differs from buffer 0's 0x{first.device_tag:02X}", \
                ctx.buffer(i, "device_tag")
            return
        if h.memory_class != first.memory_class:
            yield (f"buffer {i} memory_class 0x{h.memory_class:02X} differs from buffer 0's "
                   f"0x{first.memory_class:02X}"), ctx.buffer(i, "memory_class")
            return


# --- buffer sizes --------------------------------------------------------------------


def _dense_elements(desc) -> Optional[int]:
    """Elements the data buffer must hold past byte_offset for a dense layout (None: not computable)."""
    if _dynamic(desc):
        return None
    layout = desc.layout
    if isinstance(layout, (RowMajorLayout, ColumnMajorLayout)):
        return math.prod(desc.shape)
    if isinstance(layout, TiledLayout):
        if 0 in desc.shape:
            return 0
        if 0 in layout.tile_shape:
            return None
        return math.prod(-(-d // t) * t for d, t in zip(desc.shape, layout.tile_shape))
    return None


@_rule("layout.dense.buffer_size", MUST, "layouts/row-major.md § Buffer Size",
       "The data buffer of a row-major, column-major or tiled tensor holds byte_offset plus every "
       "(padded) element; not checked while a dimension is dynamic.")
def _dense_size(desc, ctx):
    h = _data_handle(desc)
    if h is None or desc.layout.tag not in _DENSE:
        return
    n = _dense_elements(desc)
    if n is None:
        return
    need = storage_bytes(desc, n)
    if need is not None and desc.byte_offset + need > h.byte_size:
        yield f"buffer 0 holds {h.byte_size} bytes, {desc.byte_offset + need} needed for {n} elements", ctx.buffer(0)


@_rule("layout.strided.buffer_bounds", MUST, "layouts/strided.md § Element Address",
       "Every element a strided tensor addresses lies inside buffer 0 (negative strides included).")
def _strided_bounds(desc, ctx):
    h = _data_handle(desc)
    layout = desc.layout
    if h is None or not isinstance(layout, StridedLayout) or _dynamic(desc) or 0 in desc.shape:
        return
    info = element_type_info(desc.type_tag)
    if info is None or info.sub_byte:
        return
    lo = sum(min(0, s * (d - 1)) for s, d in zip(layout.strides, desc.shape))
    hi = sum(max(0, s * (d - 1)) for s, d in zip(layout.strides, desc.shape))
    width = info.byte_width
    if desc.byte_offset + lo * width < 0:
        yield f"a negative stride reaches {-(desc.byte_offset + lo * width)} bytes before buffer 0", ctx.byte_offset()
    elif desc.byte_offset + (hi + 1) * width > h.byte_size:
        yield f"the last addressed element ends at byte {desc.byte_offset + (hi + 1) * width}, past buffer 0's " \
              f"{h.byte_size} bytes", ctx.buffer(0)


@_rule("layout.morton.buffer_size", MUST, "layouts/morton.md § Buffer Size",
       "The data buffer of a Morton tensor holds 2**sum(morton_bits) elements.")
def _morton_size(desc, ctx):
    h = _data_handle(desc)
    if h is None or not isinstance(desc.layout, MortonLayout) or 0 in desc.layout.morton_bits:
        return
    bits = sum(desc.layout.morton_bits)
    if bits >= 80:
        yield f"2**{bits} elements cannot fit a buffer", ctx.buffer(0)
        return
    need = storage_bytes(desc, 1 << bits)
    if need is not None and desc.byte_offset + need > h.byte_size:
        yield f"buffer 0 holds {h.byte_size} bytes, {need} needed for 2**{bits} elements", ctx.buffer(0)


@_rule("layout.hilbert.buffer_size", MUST, "layouts/hilbert.md § Buffer Size",
       "The data buffer of a Hilbert tensor holds 2**(hilbert_rank*hilbert_order) elements.")
def _hilbert_size(desc, ctx):
    h = _data_handle(desc)
    layout = desc.layout
    if h is None or not isinstance(layout, HilbertLayout) or layout.hilbert_order == 0:
        return
    bits = layout.hilbert_rank * layout.hilbert_order
    if bits >= 80:
        yield f"2**{bits} elements cannot fit a buffer", ctx.buffer(0)
        return
    need = storage_bytes(desc, 1 << bits)
    if need is not None and desc.byte_offset + need > h.byte_size:
        yield f"buffer 0 holds {h.byte_size} bytes, {need} needed for 2**{bits} elements", ctx.buffer(0)


def _sparse_needs(desc) -> list[tuple[int, int, str, tuple]]:
    """``(buffer index, minimum bytes, what, arguments of what)`` for the layout buffers of a
    sparse / paged tensor; ``what.format(*arguments)`` names the need (formatted only on a finding)."""
    layout, shape, rank = desc.layout, desc.shape, desc.rank
    values = storage_bytes(desc, layout.nnz) if hasattr(layout, "nnz") else None
    out = []
    if values is not None:
        out.append((0, values, "{} values", (layout.nnz,)))
    if isinstance(layout, CooLayout):
        out.append((1, layout.nnz * rank * 8, "{}x{} uint64 indices", (layout.nnz, rank)))
    elif isinstance(layout, (CsrLayout, CscLayout)) and rank == 2:
        out.append((1, layout.nnz * 8, "{} uint64 indices", (layout.nnz,)))
        axis = 0 if isinstance(layout, CsrLayout) else 1
        if shape[axis] != _DYN:
            out.append((2, (shape[axis] + 1) * 8, "{} uint64 pointers", (shape[axis] + 1,)))
    elif isinstance(layout, CsfLayout) and rank >= 3:
        out.append((1, 16, "pos_0 (2 uint64)", ()))
        out.append((2 * rank, layout.nnz * 8, "{} leaf coordinates", (layout.nnz,)))
    elif isinstance(layout, BlockPagedLayout) and rank == 3 and not _dynamic(desc):
        n = layout.num_pages * layout.page_size * shape[1] * shape[2]
        pool = storage_bytes(desc, n)
        if pool is not None:
            out.append((0, pool, "{} page-pool elements", (n,)))
        width = 8 if layout.block_table_index_type == 1 else 4
        out.append((2, (layout.num_seqs + 1) * width, "{} seq_ptr entries", (layout.num_seqs + 1,)))
    return out


@_rule("layout.sparse.buffer_size", MUST, "layouts/coo.md § Buffer Size",
       "Each buffer of a COO, CSR, CSC, CSF or block-paged tensor is large enough for the elements its "
       "layout page assigns to it (values for nnz, index arrays, pointer arrays, page pool).")
def _sparse_size(desc, ctx):
    if not isinstance(desc.layout, (*_SPARSE, BlockPagedLayout)):
        return
    buffers = desc.buffers
    for index, need, what, args in _sparse_needs(desc):
        if index < len(buffers) and buffers[index].byte_size < need:
            yield f"buffer {index} holds {buffers[index].byte_size} bytes, {need} needed for {what.format(*args)}", \
                ctx.buffer(index)
            return


@_rule("adr007.empty.data_buffer_size", MUST, "ADR-007 § Decision (4, 7)",
       "The data buffer of an empty tensor (a dimension is 0) has byte_size 0 -- sub-byte types "
       "included, with no partial trailing byte; for sparse layouts this is the values buffer.")
def _empty_size(desc, ctx):
    h = _data_handle(desc)
    if h is None or not desc.is_empty or h.byte_size == 0:
        return
    layout = desc.layout
    if isinstance(layout, (MortonLayout, UnknownLayout, ExtensionLayout, BlockPagedLayout, CompositeLayout)):
        return
    yield f"empty tensor (shape {list(desc.shape)}) but buffer 0 holds {h.byte_size} bytes", ctx.buffer(0)


# ------------------------------------------------------------------------------------
# Quantization (quantization.md and quantization/*.md)
# ------------------------------------------------------------------------------------

_SCHEME_PAGE = {
    PerTensorAffine: "per-tensor-affine", PerChannelAffine: "per-channel-affine",
    PerBlockAffine: "per-block-affine", Nf4: "nf4", Mxfp: "mxfp",
}


@_rule("quantization.flags.reserved", MUST, "quantization.md § Descriptor Header",
       "Quantization flag bits the scheme does not define are 0 (bits 1-15 for per-channel and per-block "
       "affine, every bit for per-tensor affine, NF4 and MXFP).")
def _qflags(desc, ctx):
    q = desc.quantization
    if q is None or isinstance(q, UnknownQuantization):
        return
    allowed = _SYMMETRIC if isinstance(q, (PerChannelAffine, PerBlockAffine)) else 0
    if q.flags & ~allowed:
        yield f"reserved quantization flag bits 0x{q.flags & ~allowed:04X} are set", ctx.quantization("flags")


@_rule("quantization.scheme_version.value", MUST, "quantization/per-tensor-affine.md § Binary Encoding",
       "scheme_version of every scheme defined here is 0x01 (a newer one is the structural rule "
       "quantization.scheme_version; 0x00 is not a version).")
def _qversion(desc, ctx):
    q = desc.quantization
    if q is not None and not isinstance(q, UnknownQuantization) and q.scheme_version == 0:
        yield "scheme_version is 0x00, not 0x01", ctx.quantization("scheme_version")


@_rule("quantization.reserved", MUST, "quantization/per-channel-affine.md § Validity Constraints",
       "The _reserved bytes of a per-tensor, per-channel or per-block affine descriptor are zero.")
def _qreserved(desc, ctx):
    q = desc.quantization
    if isinstance(q, (PerTensorAffine, PerChannelAffine, PerBlockAffine)) and any(q._reserved):
        yield f"quantization _reserved bytes are {q._reserved.hex()}", ctx.quantization("_reserved")


@_rule("quantization.axis", MUST, "quantization/per-block-affine.md § Validity Constraints",
       "The quantization axis of a per-channel, per-block, NF4 or MXFP descriptor is below rank.")
def _qaxis(desc, ctx):
    q = desc.quantization
    if hasattr(q, "axis") and q.axis >= desc.rank:
        yield f"quantization axis {q.axis} is not below rank {desc.rank}", ctx.quantization("axis")


@_rule("quantization.axis.dynamic", MUST, "data-model.md § Dynamic Dimensions",
       "A scheme needing the size of its axis rejects a dynamic shape[axis].")
def _qaxis_dynamic(desc, ctx):
    q = desc.quantization
    if _axis_ok(desc) and desc.shape[q.axis] == _DYN:
        yield f"shape[{q.axis}] (the quantization axis) is dynamic", ctx.shape(q.axis)


def _block_size_rule(cls, page: str, name: str, low: int, high: Optional[int]):
    words = f"a power of two >= {low}" if high is None else f"a power of two in [{low}, {high}]"

    @_rule(f"quantization.{name}.block_size", MUST, f"quantization/{page}.md § Validity Constraints",
           f"block_size is {words}.")
    def check(desc, ctx):
        q = desc.quantization
        if isinstance(q, cls):
            b = q.block_size
            if not _pow2(b) or b < low or (high is not None and b > high):
                yield f"block_size {b} is not {words}", ctx.quantization("block_size")

    return check


_block_size_rule(PerBlockAffine, "per-block-affine", "per_block", 2, None)
_block_size_rule(Nf4, "nf4", "nf4", 8, None)
_block_size_rule(Mxfp, "mxfp", "mxfp", 16, 2048)


@_rule("quantization.block_size.upper", MUST, "quantization/per-block-affine.md § Validity Constraints",
       "For per-block affine and NF4, block_size is at most shape[axis] when shape[axis] > 0; the bound "
       "is waived for an empty axis (ADR-007 § 8).")
def _block_upper(desc, ctx):
    q = desc.quantization
    if isinstance(q, (PerBlockAffine, Nf4)) and _axis_ok(desc):
        size = desc.shape[q.axis]
        if 0 < size != _DYN and q.block_size > size:
            yield f"block_size {q.block_size} exceeds shape[{q.axis}] = {size}", ctx.quantization("block_size")


@_rule("quantization.block_padding", MUST, "quantization/per-block-affine.md § Padding",
       "With per-block affine or NF4 and a partial trailing block, the data buffer of a row- or column-major "
       "tensor still holds full blocks: ceil(shape[axis] / block_size) * block_size elements along the axis.")
def _block_padding(desc, ctx):
    q = desc.quantization
    h = _data_handle(desc)
    if (h is None or not isinstance(q, (PerBlockAffine, Nf4)) or not _axis_ok(desc) or _dynamic(desc)
            or q.block_size <= 0 or not isinstance(desc.layout, (RowMajorLayout, ColumnMajorLayout))):
        return
    size = desc.shape[q.axis]
    if size % q.block_size == 0:
        return
    padded = -(-size // q.block_size) * q.block_size
    n = padded * math.prod(d for k, d in enumerate(desc.shape) if k != q.axis)
    need = storage_bytes(desc, n)
    if need is not None and desc.byte_offset + need > h.byte_size:
        yield (f"buffer 0 holds {h.byte_size} bytes; shape[{q.axis}] = {size} padded to {padded} needs "
               f"{desc.byte_offset + need}"), ctx.buffer(0)


@_rule("quantization.mxfp.multiple", MUST, "quantization/mxfp.md § Validity Constraints",
       "shape[axis] of an MXFP tensor is a multiple of block_size (no partial block); an empty axis is "
       "accepted per ADR-007 § 8.")
def _mxfp_multiple(desc, ctx):
    q = desc.quantization
    if isinstance(q, Mxfp) and _axis_ok(desc) and q.block_size > 0:
        size = desc.shape[q.axis]
        if size != _DYN and size % q.block_size:
            yield f"shape[{q.axis}] = {size} is not a multiple of block_size {q.block_size}", ctx.shape(q.axis)


@_rule("quantization.per_tensor.scale", MUST, "quantization/per-tensor-affine.md § Validity Constraints",
       "The per-tensor scale is finite and non-zero.")
def _pt_scale(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerTensorAffine) and (not math.isfinite(q.scale) or q.scale == 0.0):
        yield f"scale {q.scale!r} is not finite and non-zero", ctx.quantization("scale")


_INT_RANGE = {
    ElementType.INT8: (-128, 127), ElementType.UINT8: (0, 255), ElementType.INT16: (-(1 << 15), (1 << 15) - 1),
    ElementType.UINT16: (0, (1 << 16) - 1), ElementType.INT32: (-(1 << 31), (1 << 31) - 1),
    ElementType.UINT32: (0, (1 << 32) - 1), ElementType.INT4: (-8, 7), ElementType.UINT4: (0, 15),
    ElementType.INT2: (-2, 1), ElementType.UINT2: (0, 3),
}


@_rule("quantization.per_tensor.zero_point", MUST, "quantization/per-tensor-affine.md § Validity Constraints",
       "The per-tensor zero_point lies in the range of the storage type.")
def _pt_zero(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerTensorAffine) and desc.type_tag in _INT_RANGE:
        lo, hi = _INT_RANGE[desc.type_tag]
        if not lo <= q.zero_point <= hi:
            yield f"zero_point {q.zero_point} is outside [{lo}, {hi}]", ctx.quantization("zero_point")


@_rule("quantization.per_channel.scale_type", MUST, "quantization/per-channel-affine.md § Validity Constraints",
       "scale_type_tag of per-channel affine version 1 is 0x03 (float32).")
def _pc_scale_type(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerChannelAffine) and q.scale_type_tag != ElementType.FLOAT32:
        yield f"scale_type_tag 0x{q.scale_type_tag:02X} is not 0x03", ctx.quantization("scale_type_tag")


@_rule("quantization.per_block.scale_type", MUST, "quantization/per-block-affine.md § Validity Constraints",
       "scale_type_tag of per-block affine is 0x01, 0x02 or 0x03.")
def _pb_scale_type(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerBlockAffine) and q.scale_type_tag not in (1, 2, 3):
        yield f"scale_type_tag 0x{q.scale_type_tag:02X} is not 0x01, 0x02 or 0x03", ctx.quantization("scale_type_tag")


@_rule("quantization.per_channel.symmetric_index", MUST, "quantization/per-channel-affine.md § Binary Encoding",
       "With the SYMMETRIC flag, zero_point_buffer_index is 0xFFFFFFFF.")
def _pc_sym(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerChannelAffine) and q.symmetric and q.zero_point_buffer_index != NO_BUFFER_INDEX:
        yield f"symmetric but zero_point_buffer_index is {q.zero_point_buffer_index}", \
            ctx.quantization("zero_point_buffer_index")


@_rule("quantization.per_block.symmetric_index", SHOULD, "quantization/per-block-affine.md § Binary Encoding",
       "With the SYMMETRIC flag, zero_point_buffer_index is ignored and should be 0xFFFFFFFF.")
def _pb_sym(desc, ctx):
    q = desc.quantization
    if isinstance(q, PerBlockAffine) and q.symmetric and q.zero_point_buffer_index != NO_BUFFER_INDEX:
        yield f"symmetric but zero_point_buffer_index is {q.zero_point_buffer_index}", \
            ctx.quantization("zero_point_buffer_index")


_STORAGE = {
    PerTensorAffine: {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x48, 0x49, 0x4A, 0x4B},
    PerChannelAffine: {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x48, 0x49, 0x4A, 0x4B},
    PerBlockAffine: {0x10, 0x11, 0x48, 0x49, 0x4A, 0x4B},
    Nf4: {0x49},
    Mxfp: {0x40, 0x41, 0x43, 0x44, 0x45, 0x10, 0x48},
}


def _storage_rule(cls, page: str, name: str):
    allowed = ", ".join(f"0x{t:02X}" for t in sorted(_STORAGE[cls]))

    @_rule(f"quantization.{name}.storage_type", MUST, f"quantization/{page}.md § Valid Storage Types",
           f"The storage type_tag of a {page} tensor is one of {allowed}.")
    def check(desc, ctx):
        if isinstance(desc.quantization, cls) and desc.type_tag not in _STORAGE[cls]:
            yield f"storage type 0x{desc.type_tag:02X} is not valid for {page}", ctx.header("type_tag")

    return check


_storage_rule(PerTensorAffine, "per-tensor-affine", "per_tensor")
_storage_rule(PerChannelAffine, "per-channel-affine", "per_channel")
_storage_rule(PerBlockAffine, "per-block-affine", "per_block")
_storage_rule(Nf4, "nf4", "nf4")
_storage_rule(Mxfp, "mxfp", "mxfp")


@_rule("quantization.buffer_index.range", MUST, "quantization/per-channel-affine.md § Referenced Buffers",
       "Every parameter buffer index (scale, and zero point unless symmetric) is below buffer_count.")
def _qindex_range(desc, ctx):
    for name, index in quantization_buffer_indices(desc.quantization):
        if index >= len(desc.buffers):
            yield f"{name} {index} is not below buffer_count {len(desc.buffers)}", ctx.quantization(name)
            return


@_rule("quantization.buffer_index.data", MUST, "quantization.md § Buffer Table Placement Rules",
       "A quantization-parameter buffer is distinct from the buffers the layout uses for the tensor data.")
def _qindex_data(desc, ctx):
    base = layout_buffer_count(desc)
    if base is None:
        return
    for name, index in quantization_buffer_indices(desc.quantization):
        if index < base:
            yield f"{name} {index} points at a buffer the layout uses for data", ctx.quantization(name)
            return


@_rule("quantization.buffer.device", MUST, "quantization.md § Buffer Table Placement Rules",
       "A quantization-parameter buffer has the same device_tag as the tensor data buffer.")
def _qdevice(desc, ctx):
    h = _data_handle(desc)
    if h is None:
        return
    for name, index in quantization_buffer_indices(desc.quantization):
        if 0 < index < len(desc.buffers) and desc.buffers[index].device_tag != h.device_tag:
            yield f"parameter buffer {index} is on device 0x{desc.buffers[index].device_tag:02X}, data on " \
                  f"0x{h.device_tag:02X}", ctx.buffer(index, "device_tag")
            return


def _param_sizes(desc) -> dict[int, int]:
    """Exact byte size each parameter buffer index must have (empty when not computable)."""
    q = desc.quantization
    shape = desc.shape
    axis = getattr(q, "axis", None)
    if axis is None or axis >= len(shape) or _DYN in shape:
        return {}
    cls = q.__class__
    if cls is PerChannelAffine:
        per_param, count = 4, shape[axis]
    else:
        if q.block_size <= 0 or cls not in _BLOCK_PARAM_WIDTH:
            return {}
        others = 1
        for k, d in enumerate(shape):
            if k != axis:
                others *= d
        count = -(-shape[axis] // q.block_size) * others  # partial trailing block counted
        if cls is PerBlockAffine:
            if q.scale_type_tag not in (1, 2, 3):
                return {}
            per_param = element_type_info(q.scale_type_tag).byte_width
        else:
            per_param = _BLOCK_PARAM_WIDTH[cls]
    sizes = {q.scale_buffer_index: count * per_param}
    if cls in (PerChannelAffine, PerBlockAffine) and not q.flags & _SYMMETRIC:  # int32 zero points
        index = q.zero_point_buffer_index  # one shared entry holds [scales | zero_points] end to end
        sizes[index] = sizes.get(index, 0) + count * 4
    return sizes


_BLOCK_PARAM_WIDTH = {PerBlockAffine: None, Nf4: 4, Mxfp: 1}
"""Bytes per block of the scale buffer: NF4 float32 absmax, MXFP float8_e8m0; per-block
affine takes the width of its scale_type_tag."""


@_rule("quantization.buffer.size", MUST, "quantization/per-block-affine.md § Referenced Buffers",
       "Each scale / zero-point buffer has exactly the byte size its scheme derives from the shape "
       "(0 bytes when the quantization axis is empty, ADR-007 § 8); not checked while a dimension is dynamic "
       "or for block-paged tensors.")
def _qsize(desc, ctx):
    if isinstance(desc.layout, BlockPagedLayout):
        return  # per-page-slot parameters: sized by the page pool (layouts/block-paged.md)
    for index, size in _param_sizes(desc).items():
        if index < len(desc.buffers) and desc.buffers[index].byte_size != size:
            yield f"parameter buffer {index} holds {desc.buffers[index].byte_size} bytes, exactly {size} required", \
                ctx.buffer(index)
            return


# ------------------------------------------------------------------------------------
# Optional sections (metadata.md)
# ------------------------------------------------------------------------------------


@_rule("metadata.shard.bounds", MUST, "metadata.md § Shard Section",
       "shard_offset[k] + shape[k] <= parent_shape[k] for every dimension.")
def _shard_bounds(desc, ctx):
    s = desc.shard
    if s is None or _DYN in desc.shape or _DYN in s.parent_shape:
        return
    for k, (o, d, p) in enumerate(zip(s.shard_offset, desc.shape, s.parent_shape)):
        if o + d > p:
            yield f"shard_offset[{k}] + shape[{k}] = {o + d} exceeds parent_shape[{k}] = {p}", \
                ctx.section("shard", X.SHARD_SECTION, "shard_offset", k)
            return


_STATS_KNOWN = 0x3F


@_rule("metadata.statistics.mask_reserved", MUST, "metadata.md § computed_mask",
       "computed_mask bits 6-31 are 0.")
def _stats_mask(desc, ctx):
    s = desc.statistics
    if s is not None and s.computed_mask & ~_STATS_KNOWN:
        yield f"reserved computed_mask bits 0x{s.computed_mask & ~_STATS_KNOWN:08X}", \
            ctx.section("statistics", X.STATISTICS_SECTION, "computed_mask")


@_rule("metadata.statistics.reserved", MUST, "metadata.md § Statistics Section › Field Encoding",
       "The _reserved and _reserved2 fields of the statistics section are zero.")
def _stats_reserved(desc, ctx):
    s = desc.statistics
    if s is None:
        return
    if s._reserved:
        yield f"statistics _reserved is 0x{s._reserved:08X}", ctx.section("statistics", X.STATISTICS_SECTION, "_reserved")
    elif any(s._reserved2):
        yield f"statistics _reserved2 is {s._reserved2.hex()}", \
            ctx.section("statistics", X.STATISTICS_SECTION, "_reserved2")


@_rule("metadata.statistics.nm", MUST, "metadata.md § Statistics Section › Field Encoding",
       "With NM_SPARSITY_VALID, nm_n <= nm_m.")
def _stats_nm(desc, ctx):
    s = desc.statistics
    if s is not None and s.computed_mask & _NM_SPARSITY_VALID and s.nm_n > s.nm_m:
        yield f"nm_n {s.nm_n} exceeds nm_m {s.nm_m}", ctx.section("statistics", X.STATISTICS_SECTION, "nm_n")


@_rule("metadata.statistics.stddev", MUST, "metadata.md § Statistics Section › Field Encoding",
       "With VALUE_STATS_VALID, value_stddev >= 0.0 (a NaN is not).")
def _stats_stddev(desc, ctx):
    s = desc.statistics
    if s is not None and s.computed_mask & _VALUE_STATS_VALID and not s.value_stddev >= 0.0:
        yield f"value_stddev {s.value_stddev!r} is not >= 0", \
            ctx.section("statistics", X.STATISTICS_SECTION, "value_stddev")


@_rule("layout.sparse.statistics_nnz", MUST, "layouts/coo.md § Interaction with Statistics Section",
       "For COO, CSR, CSC and CSF, a valid statistics nnz equals the layout's nnz (which is authoritative).")
def _stats_nnz(desc, ctx):
    s = desc.statistics
    if s is not None and isinstance(desc.layout, _SPARSE) and s.computed_mask & _NNZ_VALID:
        if s.nnz != desc.layout.nnz:
            yield f"statistics nnz {s.nnz} differs from the layout's nnz {desc.layout.nnz}", \
                ctx.section("statistics", X.STATISTICS_SECTION, "nnz")


E = "metadata.md § Extension Type Section"


@_rule("metadata.extension_type.bit_width", MUST, E, "bit_width is greater than 0.")
def _ext_width(desc, ctx):
    e = desc.extension_type
    if e is not None and e.bit_width == 0:
        yield "bit_width is 0", ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "bit_width")


@_rule("metadata.extension_type.packing", MUST, E,
       "packing_factor is 1 for bit_width >= 8; a sub-byte bit_width is 1, 2 or 4 with packing_factor 8/bit_width.")
def _ext_packing(desc, ctx):
    e = desc.extension_type
    if e is None or e.bit_width == 0:
        return
    if e.bit_width >= 8:
        if e.packing_factor != 1:
            yield f"packing_factor {e.packing_factor} for a {e.bit_width}-bit type (must be 1)", \
                ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "packing_factor")
    elif e.bit_width not in (1, 2, 4):
        yield f"sub-byte bit_width {e.bit_width} is not 1, 2 or 4", \
            ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "bit_width")
    elif e.packing_factor != 8 // e.bit_width:
        yield f"packing_factor {e.packing_factor} is not 8/{e.bit_width}", \
            ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "packing_factor")


@_rule("metadata.extension_type.float_fields", MUST, E,
       "A float type has is_signed 0 and sign_bits 0 or 1; an integer type has sign_bits, exponent_bits, "
       "mantissa_bits and exponent_bias all 0.")
def _ext_fields(desc, ctx):
    e = desc.extension_type
    if e is None:
        return
    at = lambda name: ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, name)  # noqa: E731
    if e.is_float:
        if e.is_signed:
            yield "is_signed is set on a float type", at("is_signed")
        elif e.sign_bits > 1:
            yield f"sign_bits {e.sign_bits} is not 0 or 1", at("sign_bits")
    else:
        for name in ("sign_bits", "exponent_bits", "mantissa_bits", "exponent_bias"):
            if getattr(e, name):
                yield f"{name} is {getattr(e, name)} on an integer type (must be 0)", at(name)
                return


@_rule("metadata.extension_type.reserved", MUST, E,
       "The _reserved and _reserved2 bytes of the Extension Type section are zero.")
def _ext_reserved(desc, ctx):
    e = desc.extension_type
    if e is None:
        return
    if any(e._reserved):
        yield f"_reserved is {e._reserved.hex()}", ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "_reserved")
    elif any(e._reserved2):
        yield f"_reserved2 is {e._reserved2.hex()}", \
            ctx.section("extension_type", X.EXTENSION_TYPE_SECTION, "_reserved2")


M = "metadata.md § Composite Member Section"


@_rule("metadata.composite_member.role", MUST, M, "member_role is 0x00 (correction) or 0x01 (base).")
def _member_role(desc, ctx):
    m = desc.composite_member
    if m is not None and m.member_role not in (0, 1):
        yield f"member_role 0x{m.member_role:02X} is reserved", \
            ctx.section("composite_member", X.COMPOSITE_MEMBER_SECTION, "member_role")


@_rule("metadata.composite_member.reserved", MUST, M, "The 15 _reserved bytes of the Composite Member section are zero.")
def _member_reserved(desc, ctx):
    m = desc.composite_member
    if m is not None and any(m._reserved):
        yield f"_reserved is {m._reserved.hex()}", ctx.section("composite_member", X.COMPOSITE_MEMBER_SECTION, "_reserved")


# ------------------------------------------------------------------------------------
# Composite head (layouts/composite.md § Head Descriptor / § Head Layout-Specific Fields)
# ------------------------------------------------------------------------------------

HD = "layouts/composite.md § Head Descriptor"
HF = "layouts/composite.md § Head Layout-Specific Fields"


def _head(desc) -> Optional[CompositeLayout]:
    return desc.layout if isinstance(desc.layout, CompositeLayout) else None


@_rule("composite.head.buffer_count_zero", MUST, HD, "A composite head has buffer_count 0.", scope="composite.head")
def _head_buffers(desc, ctx):
    if _head(desc) and desc.buffers:
        yield f"composite head has buffer_count {len(desc.buffers)}", ctx.buffer_count()


@_rule("composite.head.byte_offset_zero", MUST, HD, "A composite head has byte_offset 0.", scope="composite.head")
def _head_offset(desc, ctx):
    if _head(desc) and desc.byte_offset:
        yield f"composite head has byte_offset {desc.byte_offset}", ctx.byte_offset()


@_rule("composite.head.no_member_section", MUST_NOT, HD,
       "A composite head does not set HAS_COMPOSITE_MEMBER.", scope="composite.head")
def _head_member(desc, ctx):
    if _head(desc) and (desc.composite_member is not None or desc.unparsed_flags & _HAS_COMPOSITE_MEMBER):
        yield "composite head sets HAS_COMPOSITE_MEMBER", ctx.header("flags")


@_rule("composite.head.no_quantization", MUST_NOT, HD,
       "A composite head does not set HAS_QUANTIZATION.", scope="composite.head")
def _head_quant(desc, ctx):
    if _head(desc) and desc.quantization is not None:
        yield "composite head sets HAS_QUANTIZATION", ctx.header("flags")


@_rule("composite.head.rule_reserved", MUST, HF,
       "composition_rule 0x00, 0xFF and 0x04-0xEF are rejected.", scope="composite.head")
def _head_rule(desc, ctx):
    h = _head(desc)
    if h and (h.composition_rule in (0x00, 0xFF) or 0x04 <= h.composition_rule <= 0xEF):
        yield f"composition_rule 0x{h.composition_rule:02X} is reserved or invalid", ctx.layout("composition_rule")


@_rule("composite.head.rule_private", MUST, HF,
       "A private composition_rule (0xF0-0xFE) is rejected unless permissive with an out-of-band agreement.",
       scope="composite.head", permissive=True)
def _head_private(desc, ctx):
    h = _head(desc)
    if h and 0xF0 <= h.composition_rule <= 0xFE:
        yield f"private composition_rule 0x{h.composition_rule:02X} is not known here", ctx.layout("composition_rule")


@_rule("composite.head.combine_op", MUST, HF,
       "combine_op is 0x00 for partition and group, 0x01 or 0x02 for overlay.", scope="composite.head")
def _head_combine(desc, ctx):
    h = _head(desc)
    if not h:
        return
    rule, op = h.composition_rule, h.combine_op
    if rule in (1, 3) and op != 0:
        yield f"combine_op 0x{op:02X} for composition_rule 0x{rule:02X} (must be 0x00)", ctx.layout("combine_op")
    elif rule == 2 and op not in (1, 2):
        yield f"combine_op 0x{op:02X} for an overlay (must be 0x01 or 0x02)", ctx.layout("combine_op")


@_rule("composite.head.reserved", MUST, HF, "The head's _reserved bytes are zero.", scope="composite.head")
def _head_reserved(desc, ctx):
    h = _head(desc)
    if h and any(h._reserved):
        yield f"composite head _reserved bytes are {h._reserved.hex()}", ctx.layout("_reserved")


@_rule("composite.head.open_sentinel", MUST, HF,
       "member_count 0xFFFFFFFF (open composite, reserved for a future version) is rejected.", scope="composite.head")
def _head_open(desc, ctx):
    h = _head(desc)
    if h and h.member_count == 0xFFFF_FFFF:
        yield "member_count is the reserved open-composite sentinel 0xFFFFFFFF", ctx.layout("member_count")


# ------------------------------------------------------------------------------------
# Running the rules
# ------------------------------------------------------------------------------------


_LAYOUT_TOPICS = {
    "tiled": {LayoutTag.TILED}, "morton": {LayoutTag.MORTON}, "coo": {LayoutTag.COO}, "csr": {LayoutTag.CSR},
    "csc": {LayoutTag.CSC}, "csf": {LayoutTag.CSF}, "block_paged": {LayoutTag.BLOCK_PAGED},
    "hilbert": {LayoutTag.HILBERT}, "strided": {LayoutTag.STRIDED}, "dense": set(_DENSE),
    "sparse": {LayoutTag.COO, LayoutTag.CSR, LayoutTag.CSC, LayoutTag.CSF, LayoutTag.BLOCK_PAGED},
}


_SCHEME_TOPICS = {"per_tensor": PerTensorAffine, "per_channel": PerChannelAffine, "per_block": PerBlockAffine,
                  "nf4": Nf4, "mxfp": Mxfp}

_FACT_TOPICS = {
    # rule id -> the facts of which at least one must hold for the rule to be able to fire
    "data_model.scalar.layout": {"scalar"},
    "data_model.shard.dynamic": {"shard"},
    "metadata.flags.extension_type": {"private_type", "extension_type"},
    "adr007.empty.data_buffer_size": {"empty"},
    "layout.sparse.statistics_nnz": {"statistics"},
}


def _layout_topics(kind: str) -> set:
    return {("layout", tag) for tag in _LAYOUT_TOPICS[kind]}


def _topics(rule_id: str) -> set:
    """When a rule can fire at all: a cheap pre-filter so a decode runs only the relevant checks.

    A topic is a fact of the descriptor (:func:`_facts`); a rule runs when one of its
    topics holds.  Each rule's test with a rejected input goes through this filter, so a
    topic that missed a case would fail that test.
    """
    if rule_id in _FACT_TOPICS:
        return _FACT_TOPICS[rule_id]
    if rule_id == "metadata.buffer_count.dense":
        return _layout_topics("dense")
    parts = rule_id.split(".")
    if parts[0] == "layout":
        return _layout_topics(parts[1])
    if parts[0] == "quantization":
        scheme = _SCHEME_TOPICS.get(parts[1])
        return {("quantization", scheme)} if scheme is not None else {"quantization"}
    if parts[0] == "buffer":
        return {"buffers"}
    if parts[0] == "composite":
        return {("layout", LayoutTag.COMPOSITE)}
    if parts[0] == "metadata" and parts[1] in ("statistics", "extension_type", "composite_member", "shard"):
        return {parts[1]}
    return {"always"}


def _plain_buffers(handles) -> bool:
    """True when no ``buffer.*`` rule can fire: every handle is a CPU-or-named-device, producer-synced,
    STANDARD-memory handle with a valid alignment and zero reserved byte, all on one device."""
    if not handles:
        return True
    device = handles[0].device_tag
    for h in handles:
        a = h.alignment
        if (h.device_tag != device or h.sync_mode or h.memory_class or h._reserved or device > 0x08
                or a <= 0 or a & (a - 1) or (a < 64 and h.byte_size)):
            return False
    return True


_RULE_TOPICS = None
_PLANS: dict = {}


def _facts(key: tuple) -> set:
    """The topics that hold for a descriptor whose :func:`_rules_for` key is ``key``."""
    (layout_tag, scheme, odd_buffers, statistics, extension_type, composite_member, shard,
     scalar, empty, private_type) = key
    have = {"always", ("layout", layout_tag)}
    if scheme is not None:
        have.update(("quantization", ("quantization", scheme)))
    for name, present in (("buffers", odd_buffers), ("statistics", statistics), ("extension_type", extension_type),
                          ("composite_member", composite_member), ("shard", shard), ("scalar", scalar),
                          ("empty", empty), ("private_type", private_type)):
        if present:
            have.add(name)
    return have


def _rules_for(desc: TensorDescriptor) -> list:
    """The rules that can fire on ``desc``, in declaration order (cached per combination of facts)."""
    global _RULE_TOPICS
    if _RULE_TOPICS is None:
        _RULE_TOPICS = [(rule, _topics(rule.id), _RAW[rule.id]) for rule in DESCRIPTOR_RULES]
    q = desc.quantization
    shape = desc.shape
    key = (desc.layout.tag, None if q is None else q.__class__, not _plain_buffers(desc.buffers),
           desc.statistics is not None, desc.extension_type is not None, desc.composite_member is not None,
           desc.shard is not None, not shape, 0 in shape, is_private_type(desc.type_tag))
    plan_ = _PLANS.get(key)
    if plan_ is None:
        have = _facts(key)
        plan_ = _PLANS[key] = [(rule, raw) for rule, topics, raw in _RULE_TOPICS if topics & have]
    return plan_


def check_descriptor(desc: TensorDescriptor, mode="strict", *, base: int = 0) -> list[Finding]:
    """Every finding of the semantic rules on ``desc`` (offsets relative to ``base``)."""
    ctx = DescriptorContext(desc, as_mode(mode), base)
    out: list[Finding] = []
    for rule, raw in _rules_for(desc):
        for message, offset in raw(desc, ctx):
            out.append(rule.finding(message, offset, ctx.mode))
    return out


def first_error(desc: TensorDescriptor, mode="strict", *, base: int = 0) -> Optional[Finding]:
    """The first finding the mode does not tolerate (a MUST breach), or None; stops there."""
    ctx = DescriptorContext(desc, as_mode(mode), base)
    for rule, raw in _rules_for(desc):
        for message, offset in raw(desc, ctx):
            finding = rule.finding(message, offset, ctx.mode)
            if finding.is_error:
                return finding
    return None
