"""Rules on the core fields of a descriptor: ``data-model.md`` (scalars, dynamic
dimensions) and ``metadata.md`` (§ Flags, § byte_offset)."""

from __future__ import annotations

from ...model import DYNAMIC_DIMENSION, CompositeLayout, RowMajorLayout
from ...structs import sections as section_tables
from ...structs.element_types import is_private_type
from ..engine import Level
from .dispatch import ALWAYS, Fact, When, descriptor_rule
from .sizes import data_handle, known_layout

_DYNAMIC = DYNAMIC_DIMENSION


@descriptor_rule("data_model.scalar.layout", Level.MUST_NOT, "data-model.md § Scalar Tensors",
                 "A rank-0 tensor uses the row-major layout only (no strided, tiled, sparse or other layout).",
                 when=When(facts={Fact.SCALAR}))
def _scalar_layout(desc, ctx):
    if desc.rank == 0 and known_layout(desc) and not isinstance(desc.layout, (RowMajorLayout, CompositeLayout)):
        return f"a scalar (rank 0) tensor carries layout 0x{desc.layout.tag:02X}; only row-major (0x01) is allowed", \
            ctx.header("layout_tag")


@descriptor_rule("data_model.shard.dynamic", Level.MUST_NOT, "data-model.md § Dynamic Dimensions",
                 "A tensor with a shard section has no dynamic dimension, in its shape or in the shard's "
                 "parent_shape.", when=When(facts={Fact.SHARD}))
def _shard_dynamic(desc, ctx):
    if desc.shard is None or (_DYNAMIC not in desc.shape and _DYNAMIC not in desc.shard.parent_shape):
        return
    for k, d in enumerate(desc.shape):
        if d == _DYNAMIC:
            return f"shape[{k}] is the dynamic sentinel in a sharded tensor", ctx.shape(k)
    for k, d in enumerate(desc.shard.parent_shape):
        if d == _DYNAMIC:
            return f"parent_shape[{k}] is the dynamic sentinel", \
                ctx.section("shard", section_tables.SHARD_SECTION, "parent_shape", k)


@descriptor_rule("metadata.flags.extension_type", Level.MUST, "metadata.md § Flags",
                 "HAS_EXTENSION_TYPE is set if and only if type_tag is a private type (0xF0-0xFE).",
                 when=When(facts={Fact.PRIVATE_TYPE, Fact.EXTENSION_TYPE}))
def _ext_flag(desc, ctx):
    private = is_private_type(desc.type_tag)
    if private and desc.extension_type is None and not desc.unparsed_flags:
        return f"private type_tag 0x{desc.type_tag:02X} without an Extension Type section", ctx.header("flags")
    elif desc.extension_type is not None and not private:
        return f"Extension Type section present but type_tag 0x{desc.type_tag:02X} is not private", ctx.header("flags")


@descriptor_rule("metadata.byte_offset.bounds", Level.MUST, "metadata.md § byte_offset",
                 "byte_offset is at most the byte size of buffer 0.", when=ALWAYS)
def _byte_offset_bounds(desc, ctx):
    h = data_handle(desc)
    if h is not None and desc.byte_offset > h.byte_size:
        return f"byte_offset {desc.byte_offset} exceeds buffer 0's byte_size {h.byte_size}", ctx.byte_offset()
