"""Rules on the layout-specific fields (``layouts/*.md``, ``metadata.md § Layout-Specific Fields``).

The rules shared by several layouts (reserved bytes, byte_offset, buffer_count, rank,
shard) are made per layout by one factory each; every rule names the layout classes it
applies to in its ``when``.  The buffer-size rules of the layouts are in
:mod:`.buffers`, the statistics one in :mod:`.sections`.
"""

from __future__ import annotations

import operator
from typing import Callable


from ...model import (
    DYNAMIC_DIMENSION, BlockPagedLayout, CooLayout, CscLayout, CsfLayout, CsrLayout, HilbertLayout, LayoutTag,
    MortonLayout, PerBlockAffine, TiledLayout,
)
from ...structs._declare import fields, valid_source
from ...structs.layouts import LAYOUT_FIELDS
from ..engine import Level
from .dispatch import Fact, When, descriptor_rule
from .sizes import parameter_count_source, quantization_parameter_count

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT
_DYNAMIC = DYNAMIC_DIMENSION
_TILED_OUTER = frozenset(int(tag) for tag in (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.STRIDED))
"""The orders of a tile grid (``layouts/tiled.md § Additional Descriptor Fields``)."""
_TILED_INNER = _TILED_OUTER | {int(LayoutTag.TILED)}
"""The orders inside a tile, or tile again."""


def _words(name: str) -> str:
    return name.replace("_", "-")


def _byte_offset_zero(layout_cls, page: str, name: str):
    citation = "layouts/block-paged.md § byte_offset" if layout_cls is BlockPagedLayout else \
        f"layouts/{page}.md § Buffer Size"

    @descriptor_rule(f"layout.{name}.byte_offset", MUST, citation, f"A {_words(name)} tensor has byte_offset 0.",
                     when=When(layouts={layout_cls}), passes=lambda s: s.layout is not layout_cls or "byte_offset == 0")
    def report(desc, ctx):
        return f"byte_offset is {desc.byte_offset}, not 0, for a {_words(name)} tensor", ctx.byte_offset()

    return report


def _reserved_zero(layout_cls, page: str, name: str):
    """The rule that the field its layout table declares reserved (:data:`~...structs._declare.ZERO`) is zero."""
    (reserved,) = [f.name for f in fields(LAYOUT_FIELDS[layout_cls.tag]) if f.reserved]
    condition = valid_source(LAYOUT_FIELDS[layout_cls.tag], reserved, f"layout.{reserved}")

    @descriptor_rule(f"layout.{name}.reserved", MUST, f"layouts/{page}.md § Additional Descriptor Fields",
                     f"The {reserved} bytes of the {_words(name)} layout fields are zero.",
                     when=When(layouts={layout_cls}), passes=lambda s: s.layout is not layout_cls
                     or condition)
    def report(desc, ctx):
        return f"{_words(name)} {reserved} bytes are {getattr(desc.layout, reserved).hex()}", ctx.layout(reserved)

    return report


_RELATIONS = {"==": operator.eq, ">=": operator.ge}


def _count_source(count: int, relation: str, base: int, s):
    """``count <relation> base + the scheme's parameter buffers`` under ``s``: a bool, or source."""
    params = parameter_count_source(s)
    if isinstance(params, int):
        return _RELATIONS[relation](count, base + params)
    return f"{count} {relation} {base} + {params}"


def _buffer_count_exact(layout_cls, page: str, name: str, base: Callable[[int], int], words: str):
    """``base(rank)``: the buffers the layout itself uses."""
    @descriptor_rule(f"layout.{name}.buffer_count", MUST, f"layouts/{page}.md § Buffer Table",
                     f"A {_words(name)} descriptor has buffer_count {words} (plus the quantization-parameter "
                     "buffers of its scheme, if quantized).", when=When(layouts={layout_cls}),
                     passes=lambda s: s.layout is not layout_cls or _count_source(s.buffer_count, "==", base(s.rank), s))
    def report(desc, ctx):
        want = base(desc.rank) + quantization_parameter_count(desc.quantization)
        return f"buffer_count is {len(desc.buffers)}, expected {want}", ctx.buffer_count()

    return report


def _rank_rule(layout_cls, page: str, name: str, ok: Callable[[int], bool], words: str, section: str = "Description"):
    @descriptor_rule(f"layout.{name}.rank", MUST, f"layouts/{page}.md § {section}",
                     f"A {_words(name)} tensor has rank {words}.", when=When(layouts={layout_cls}),
                     passes=lambda s: s.layout is not layout_cls or ok(s.rank))
    def report(desc, ctx):
        return f"{_words(name)} tensor of rank {desc.rank}; rank {words} required", ctx.header("rank")

    return report


def _no_shard(layout_cls, page: str, name: str):
    @descriptor_rule(f"layout.{name}.shard", MUST_NOT, f"layouts/{page}.md § Sharding",
                     f"A {_words(name)} tensor carries no shard section in this version.",
                     when=When(layouts={layout_cls}, facts={Fact.SHARD}),
                     passes=lambda s: s.layout is not layout_cls or not s.has("shard"))
    def report(desc, ctx):
        return f"a {_words(name)} tensor carries a shard section", ctx.part("shard")

    return report


# --- tiled ---------------------------------------------------------------------------

_TILED = When(layouts={TiledLayout})


def _tiled_levels(layout):
    level, depth = layout, 0
    while level is not None:
        yield depth, level
        level, depth = level.inner, depth + 1


@descriptor_rule("layout.tiled.tile_shape", MUST, "layouts/tiled.md § Additional Descriptor Fields",
                 "Every tile_shape value is greater than 0, at every tiling level.", when=_TILED)
def _tile_shape(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            for k, t in enumerate(level.tile_shape):
                if t == 0:
                    return f"tile_shape[{k}] is 0 (tiling level {depth})", ctx.layout("tile_shape", k, depth)


@descriptor_rule("layout.tiled.outer_layout", MUST, "layouts/tiled.md § Additional Descriptor Fields",
                 "outer_layout is 0x01, 0x02 or 0x03.", when=_TILED)
def _tiled_outer(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if level.outer_layout not in _TILED_OUTER:
                yield f"outer_layout 0x{level.outer_layout:02X} (tiling level {depth})", \
                    ctx.layout("outer_layout", 0, depth)


@descriptor_rule("layout.tiled.inner_layout", MUST, "layouts/tiled.md § Additional Descriptor Fields",
                 "inner_layout is 0x01, 0x02, 0x03 or 0x04 (tile again).", when=_TILED)
def _tiled_inner(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if level.inner_layout not in _TILED_INNER:
                yield f"inner_layout 0x{level.inner_layout:02X} (tiling level {depth})", \
                    ctx.layout("inner_layout", 0, depth)


@descriptor_rule("layout.tiled.reserved", MUST, "layouts/tiled.md § Additional Descriptor Fields",
                 "The _reserved bytes of every tiling level are zero.", when=_TILED)
def _tiled_reserved(desc, ctx):
    if isinstance(desc.layout, TiledLayout):
        for depth, level in _tiled_levels(desc.layout):
            if any(level._reserved):
                yield f"tiled _reserved bytes are {level._reserved.hex()} (tiling level {depth})", \
                    ctx.layout("_reserved", 0, depth)


# --- morton --------------------------------------------------------------------------

_MORTON = When(layouts={MortonLayout})


@descriptor_rule("layout.morton.bits", MUST, "layouts/morton.md § Additional Descriptor Fields",
                 "Every morton_bits value is greater than 0.", when=_MORTON,
                 passes=lambda s: s.layout is not MortonLayout or "0 not in layout.morton_bits")
def _morton_bits(desc, ctx):
    k = desc.layout.morton_bits.index(0)
    return f"morton_bits[{k}] is 0", ctx.layout("morton_bits", k)


@descriptor_rule("layout.morton.shape", MUST, "layouts/morton.md § Dimension Size Constraints",
                 "shape[k] is at most 2**morton_bits[k] for every dimension.", when=_MORTON)
def _morton_shape(desc, ctx):
    if isinstance(desc.layout, MortonLayout):
        for k, (d, b) in enumerate(zip(desc.shape, desc.layout.morton_bits)):
            if d != _DYNAMIC and b < 64 and d > (1 << b):
                return f"shape[{k}] = {d} exceeds 2**morton_bits[{k}] = {1 << b}", ctx.shape(k)


# --- sparse and block-paged ----------------------------------------------------------

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
_buffer_count_exact(CooLayout, "coo", "coo", lambda rank: 2, "2")
_buffer_count_exact(CsrLayout, "csr", "csr", lambda rank: 3, "3")
_buffer_count_exact(CscLayout, "csc", "csc", lambda rank: 3, "3")
_buffer_count_exact(CsfLayout, "csf", "csf", lambda rank: 2 * rank + 1, "2*rank+1")
_rank_rule(CsrLayout, "csr", "csr", lambda r: r == 2, "2")
_rank_rule(CscLayout, "csc", "csc", lambda r: r == 2, "2")
_rank_rule(CsfLayout, "csf", "csf", lambda r: r >= 3, ">= 3")
_rank_rule(BlockPagedLayout, "block-paged", "block_paged", lambda r: r == 3, "3")
_no_shard(CsfLayout, "csf", "csf")
_no_shard(BlockPagedLayout, "block-paged", "block_paged")

_PAGED = When(layouts={BlockPagedLayout})


@descriptor_rule("layout.csf.mode_order", MUST, "layouts/csf.md § Mode Ordering",
                 "mode_order is a permutation of 0..rank-1.", when=When(layouts={CsfLayout}))
def _csf_mode_order(desc, ctx):
    if isinstance(desc.layout, CsfLayout):
        order = desc.layout.mode_order
        if sorted(order) != list(range(desc.rank)):
            seen: set[int] = set()
            bad = next((k for k, m in enumerate(order) if m >= desc.rank or m in seen or seen.add(m)), 0)
            return f"mode_order {list(order)} is not a permutation of 0..{desc.rank - 1}", ctx.layout("mode_order", bad)


@descriptor_rule("layout.block_paged.paged_axis", MUST, "layouts/block-paged.md § Additional Descriptor Fields",
                 "paged_axis is 0 in this version.", when=_PAGED,
                 passes=lambda s: s.layout is not BlockPagedLayout or "layout.paged_axis == 0")
def _paged_axis(desc, ctx):
    return f"paged_axis is {desc.layout.paged_axis}, not 0", ctx.layout("paged_axis")


@descriptor_rule("layout.block_paged.page_size", MUST, "layouts/block-paged.md § Additional Descriptor Fields",
                 "page_size is at least 1.", when=_PAGED,
                 passes=lambda s: s.layout is not BlockPagedLayout or "layout.page_size >= 1")
def _page_size(desc, ctx):
    return "page_size is 0", ctx.layout("page_size")


@descriptor_rule("layout.block_paged.buffer_count", MUST, "layouts/block-paged.md § Buffer Table",
                 "A block-paged descriptor has buffer_count >= 3 (page pool, block table, seq_ptr), plus its "
                 "quantization-parameter buffers.", when=_PAGED,
                 passes=lambda s: s.layout is not BlockPagedLayout or _count_source(s.buffer_count, ">=", 3, s))
def _paged_count(desc, ctx):
    want = 3 + quantization_parameter_count(desc.quantization)
    return f"buffer_count is {len(desc.buffers)}, at least {want} required", ctx.buffer_count()


@descriptor_rule("layout.block_paged.quantization", MUST, "layouts/block-paged.md § Per-scheme composition",
                 "A block-paged tensor quantized per-block-affine uses axis 0 and block_size equal to page_size.",
                 when=When(layouts={BlockPagedLayout}, schemes={PerBlockAffine}))
def _paged_quant(desc, ctx):
    q = desc.quantization
    if isinstance(desc.layout, BlockPagedLayout) and isinstance(q, PerBlockAffine):
        if q.axis != 0:
            return f"per-block-affine axis is {q.axis}, not 0, on a block-paged tensor", ctx.quantization("axis")
        elif q.block_size != desc.layout.page_size:
            return f"block_size {q.block_size} differs from page_size {desc.layout.page_size}", \
                ctx.quantization("block_size")


# --- hilbert -------------------------------------------------------------------------

_HILBERT = When(layouts={HilbertLayout})


@descriptor_rule("layout.hilbert.order", MUST, "layouts/hilbert.md § Validity Constraints",
                 "hilbert_order is greater than 0.", when=_HILBERT,
                 passes=lambda s: s.layout is not HilbertLayout or "layout.hilbert_order != 0")
def _hilbert_order(desc, ctx):
    return "hilbert_order is 0", ctx.layout("hilbert_order")


@descriptor_rule("layout.hilbert.rank", MUST, "layouts/hilbert.md § Validity Constraints",
                 "hilbert_rank equals the tensor's rank and is at least 2.", when=_HILBERT,
                 passes=lambda s: s.layout is not HilbertLayout or (s.rank >= 2 and f"layout.hilbert_rank == {s.rank}"))
def _hilbert_rank(desc, ctx):
    return (f"hilbert_rank {desc.layout.hilbert_rank} with tensor rank {desc.rank} (must be equal and >= 2)",
            ctx.layout("hilbert_rank"))


@descriptor_rule("layout.hilbert.shape", MUST, "layouts/hilbert.md § Validity Constraints",
                 "Every dimension equals 2**hilbert_order.", when=_HILBERT)
def _hilbert_shape(desc, ctx):
    if isinstance(desc.layout, HilbertLayout):
        order = desc.layout.hilbert_order
        side = 1 << order if order < 64 else None
        for k, d in enumerate(desc.shape):
            if d != side:
                return f"shape[{k}] = {d} is not 2**hilbert_order", ctx.shape(k)
