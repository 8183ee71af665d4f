"""Rules on the core fields of a descriptor: ``data-model.md`` (scalars, dynamic
dimensions) and ``metadata.md`` (§ Flags, § byte_offset)."""

from __future__ import annotations

from ...model import DYNAMIC_DIMENSION, CompositeLayout, ExtensionLayout, RowMajorLayout, UnknownLayout
from ...structs import sections as section_tables
from ...structs.element_types import is_private_type
from ..engine import Level
from .dispatch import ALWAYS, Fact, When, descriptor_rule

_DYNAMIC = DYNAMIC_DIMENSION


@descriptor_rule("data_model.scalar.layout", Level.MUST_NOT, "data-model.md § Scalar Tensors",
                 "A rank-0 tensor uses the row-major layout only (no strided, tiled, sparse or other layout).",
                 when=When(facts={Fact.SCALAR}),
                 passes=lambda s: s.rank != 0 or issubclass(s.layout, (RowMajorLayout, CompositeLayout, UnknownLayout,
                                                                        ExtensionLayout)))
def _scalar_layout(desc, ctx):
    return f"a scalar (rank 0) tensor carries layout 0x{desc.layout.tag:02X}; only row-major (0x01) is allowed", \
        ctx.header("layout_tag")


@descriptor_rule("data_model.shard.dynamic", Level.MUST_NOT, "data-model.md § Dynamic Dimensions",
                 "A tensor with a shard section has no dynamic dimension, in its shape or in the shard's "
                 "parent_shape.", when=When(facts={Fact.SHARD}),
                 passes=lambda s: not s.has("shard") or f"{_DYNAMIC} not in shape and {_DYNAMIC} not in shard.parent_shape")
def _shard_dynamic(desc, ctx):
    if _DYNAMIC in desc.shape:
        k = desc.shape.index(_DYNAMIC)
        return f"shape[{k}] is the dynamic sentinel in a sharded tensor", ctx.shape(k)
    k = desc.shard.parent_shape.index(_DYNAMIC)
    return f"parent_shape[{k}] is the dynamic sentinel", ctx.section("shard", section_tables.SHARD_SECTION, "parent_shape", k)


def _extension_flag(s):
    """A private type has the Extension Type section (unless a newer minor version's flag bits
    are kept unparsed); any other type has none."""
    private = is_private_type(s.type_tag)
    if s.has("extension_type"):
        return private
    return not private or "desc.unparsed_flags != 0"


@descriptor_rule("metadata.flags.extension_type", Level.MUST, "metadata.md § Flags",
                 "HAS_EXTENSION_TYPE is set if and only if type_tag is a private type (0xF0-0xFE).",
                 when=When(facts={Fact.PRIVATE_TYPE, Fact.EXTENSION_TYPE}), passes=_extension_flag)
def _ext_flag(desc, ctx):
    if desc.extension_type is None:
        return f"private type_tag 0x{desc.type_tag:02X} without an Extension Type section", ctx.header("flags")
    return f"Extension Type section present but type_tag 0x{desc.type_tag:02X} is not private", ctx.header("flags")


@descriptor_rule("metadata.byte_offset.bounds", Level.MUST, "metadata.md § byte_offset",
                 "byte_offset is at most the byte size of buffer 0.", when=ALWAYS,
                 passes=lambda s: not s.buffer_count or "byte_offset <= h0.byte_size")
def _byte_offset_bounds(desc, ctx):
    return f"byte_offset {desc.byte_offset} exceeds buffer 0's byte_size {desc.buffers[0].byte_size}", ctx.byte_offset()
