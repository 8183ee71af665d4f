"""Layout-specific fields, one table per layout tag.

Spec: ``metadata.md § Layout-Specific Fields`` and each ``layouts/*.md`` page
(§ Additional Descriptor Fields).  Row-major and column-major have no fields.  The
tiled layout is recursive: when ``inner_layout`` is ``0x04`` another :data:`TILED`
table follows (depth-limited, ``layouts/tiled.md § Recursive Tiling``).
"""

from __future__ import annotations

from construct import Array, Bytes, If, Int8ul, Int32ul, Int64sl, Int64ul, Struct, this

from ._declare import Valid, field, reserved
from .tags import BlockTableIndexType, CombineOp, CompositionRule, KvRole, LayoutTag, is_private_tag

TILED_REF = "layouts/tiled.md § Additional Descriptor Fields"

STRIDED = Struct(
    field("strides", Array(this.rank, Int64sl), "Stride of each dimension in logical elements; may be negative or zero.",
          "layouts/strided.md § Additional Descriptor Fields"),
)

TILED = Struct(
    field("tile_shape", Array(this.rank, Int64ul), "Tile extent along each dimension, each > 0.", TILED_REF),
    field("outer_layout", Int8ul, "Order of the tile grid: 0x01, 0x02 or 0x03.", TILED_REF,
          tags=LayoutTag),
    field("inner_layout", Int8ul, "Order inside a tile: 0x01, 0x02, 0x03, or 0x04 to tile again.", TILED_REF,
          tags=LayoutTag),
    reserved("_reserved", Bytes(2), TILED_REF),
    field("outer_strides", If(this.outer_layout == LayoutTag.STRIDED, Array(this.rank, Int64sl)),
          "Tile-grid strides in tiles; present when outer_layout is strided.", TILED_REF),
    field("inner_strides", If(this.inner_layout == LayoutTag.STRIDED, Array(this.rank, Int64sl)),
          "In-tile strides in elements; present when inner_layout is strided.", TILED_REF),
)
"""One tiling level; a nested level follows when ``inner_layout == 0x04``."""

MORTON = Struct(
    field("morton_bits", Array(this.rank, Int32ul), "Bits of the Morton code per dimension, each > 0.",
          "layouts/morton.md § Additional Descriptor Fields"),
)

COO = Struct(
    field("nnz", Int64ul, "Number of stored elements; may be 0.", "layouts/coo.md § Additional Descriptor Fields"),
    field("is_sorted", Int8ul, "0x01 when indices are in lexicographic order, else 0x00.",
          "layouts/coo.md § Additional Descriptor Fields"),
    reserved("_reserved", Bytes(7), "layouts/coo.md § Additional Descriptor Fields"),
)

CSR = Struct(
    field("nnz", Int64ul, "Number of stored elements; may be 0.", "layouts/csr.md § Additional Descriptor Fields"),
    reserved("_reserved", Bytes(8), "layouts/csr.md § Additional Descriptor Fields"),
)

CSC = Struct(
    field("nnz", Int64ul, "Number of stored elements; may be 0.", "layouts/csc.md § Additional Descriptor Fields"),
    reserved("_reserved", Bytes(8), "layouts/csc.md § Additional Descriptor Fields"),
)

CSF = Struct(
    field("nnz", Int64ul, "Number of stored elements; may be 0.", "layouts/csf.md § Additional Descriptor Fields"),
    field("mode_order", Array(this.rank, Int32ul), "Logical dimension stored at each tree level; a permutation.",
          "layouts/csf.md § Additional Descriptor Fields"),
    reserved("_reserved", Bytes(8), "layouts/csf.md § Additional Descriptor Fields"),
)

BLOCK_PAGED_REF = "layouts/block-paged.md § Additional Descriptor Fields"
BLOCK_PAGED = Struct(
    field("page_size", Int32ul, "Tokens per page, >= 1.", BLOCK_PAGED_REF),
    field("num_pages", Int64ul, "Physical pages in the page pool.", BLOCK_PAGED_REF),
    field("paged_axis", Int32ul, "Axis cut into pages; 0 in this version.", BLOCK_PAGED_REF),
    field("num_seqs", Int32ul, "Sequences in the batch; may be 0.", BLOCK_PAGED_REF),
    field("kv_role", Int8ul, "0x00 key, 0x01 value, 0x02 fused or generic.", BLOCK_PAGED_REF, tags=KvRole),
    field("layer_index", Int32ul, "Transformer layer, 0xFFFFFFFF when not layer-scoped.", BLOCK_PAGED_REF),
    field("block_table_index_type", Int8ul, "Index width of buffers 1 and 2: 0x00 uint32, 0x01 uint64.",
          BLOCK_PAGED_REF, tags=BlockTableIndexType),
    reserved("_reserved", Bytes(6), BLOCK_PAGED_REF),
)

COMPOSITE_REF = "layouts/composite.md § Head Layout-Specific Fields"
COMPOSITE = Struct(
    field("composition_rule", Int8ul, "0x01 partition, 0x02 overlay, 0x03 group; 0xF0-0xFE private.",
          COMPOSITE_REF, tags=CompositionRule),
    field("combine_op", Int8ul, "Overlay only: 0x01 replace, 0x02 add; 0x00 otherwise.", COMPOSITE_REF,
          tags=CombineOp, valid=Valid(any_of=CombineOp)),
    reserved("_reserved", Bytes(2), COMPOSITE_REF),
    field("member_count", Int32ul, "How many following tensors are members; 0xFFFFFFFF reserved.",
          COMPOSITE_REF),
)
"""Composite head fields (the head itself owns no buffer)."""

HILBERT = Struct(
    field("hilbert_order", Int32ul, "Curve order; every dimension is 2**order.",
          "layouts/hilbert.md § Additional Descriptor Fields"),
    field("hilbert_rank", Int32ul, "Curve dimensions; equals rank, >= 2.",
          "layouts/hilbert.md § Additional Descriptor Fields"),
)

EXTENSION_REF = "metadata.md § Extension Layouts (0xF0–0xFE)"
EXTENSION = Struct(
    field("extension_layout_id", Int64ul, "Implementation-defined layout identifier.", EXTENSION_REF),
    field("extension_data_length", Int32ul, "Length of the opaque metadata that follows.", EXTENSION_REF,
          valid=Valid(size_of="extension_data")),
    field("extension_data", Bytes(this.extension_data_length), "Opaque layout metadata.", EXTENSION_REF),
)
"""Fields of an implementation-private layout tag ``0xF0``–``0xFE``."""

EXTENSION_HEAD = Struct(*EXTENSION.subcons[:2])
"""The fixed part of :data:`EXTENSION`, read before the length is checked."""

LAYOUT_FIELDS = {
    LayoutTag.ROW_MAJOR: None,
    LayoutTag.COLUMN_MAJOR: None,
    LayoutTag.STRIDED: STRIDED,
    LayoutTag.TILED: TILED,
    LayoutTag.MORTON: MORTON,
    LayoutTag.COO: COO,
    LayoutTag.CSR: CSR,
    LayoutTag.CSC: CSC,
    LayoutTag.CSF: CSF,
    LayoutTag.BLOCK_PAGED: BLOCK_PAGED,
    LayoutTag.COMPOSITE: COMPOSITE,
    LayoutTag.HILBERT: HILBERT,
}
"""Layout tag → its layout-specific table (``None``: the layout has no fields)."""

NESTED_BY = {LayoutTag.TILED: "inner_layout"}
"""Layout tag → the field of its table that, when it holds that same tag, says another level
of the table follows (``layouts/tiled.md § Recursive Tiling``)."""

MAX_TILED_DEPTH = 8
"""RECOMMENDED tiled recursion limit, which this reader enforces (``layouts/tiled.md``)."""


def is_extension_layout(tag: int) -> bool:
    """Implementation-private layout range (``memory-layout.md § Layout Taxonomy``)."""
    return is_private_tag(tag)
