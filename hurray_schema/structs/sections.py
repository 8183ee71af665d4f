"""Optional descriptor sections after the buffer table: shard, statistics, extension
type, composite member.  Each is present when its ``flags`` bit is set
(``metadata.md § Flags``); they appear in the order of
:data:`hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`.
"""

from __future__ import annotations

from construct import Array, Bytes, Float64l, Int8ul, Int32ul, Int64ul, Struct, this

from ._declare import Valid, field, reserved
from .tags import MemberRole, StatisticsMask

SHARD_REF = "metadata.md § Shard Section"
SHARD_SECTION = Struct(
    field("parent_shape", Array(this.rank, Int64ul), "Shape of the logical parent tensor.", SHARD_REF),
    field("shard_offset", Array(this.rank, Int64ul), "Index of this shard's first element in the parent.", SHARD_REF),
)

STATS_REF = "metadata.md § Statistics Section › Field Encoding"
STATISTICS_SECTION = Struct(
    field("computed_mask", Int32ul, "Which statistics below are valid (bits 0-5).", "metadata.md § computed_mask",
          tags=StatisticsMask),
    reserved("_reserved", Int32ul, STATS_REF, "Must be 0."),
    field("nnz", Int64ul, "Non-zero elements (NNZ_VALID).", STATS_REF),
    field("sparsity_ratio", Float64l, "Fraction of zeros in [0, 1] (SPARSITY_VALID).", STATS_REF),
    field("value_min", Float64l, "Smallest value, dequantized (VALUE_RANGE_VALID).", STATS_REF),
    field("value_max", Float64l, "Largest value, dequantized (VALUE_RANGE_VALID).", STATS_REF),
    field("value_abs_max", Float64l, "Largest magnitude (VALUE_RANGE_VALID).", STATS_REF),
    field("value_mean", Float64l, "Arithmetic mean (VALUE_STATS_VALID).", STATS_REF),
    field("value_stddev", Float64l, "Population standard deviation, >= 0 (VALUE_STATS_VALID).", STATS_REF),
    field("nm_n", Int8ul, "N of N:M structured sparsity (NM_SPARSITY_VALID).", STATS_REF),
    field("nm_m", Int8ul, "M of N:M structured sparsity, >= nm_n (NM_SPARSITY_VALID).", STATS_REF),
    field("has_nan", Int8ul, "0x01 when a NaN is present (NAN_INF_VALID).", STATS_REF),
    field("has_inf", Int8ul, "0x01 when an infinity is present (NAN_INF_VALID).", STATS_REF),
    reserved("_reserved2", Bytes(4), STATS_REF),
)
"""72 bytes of advisory statistics."""

EXT_REF = "metadata.md § Extension Type Section"
EXTENSION_TYPE_SECTION = Struct(
    field("bit_width", Int32ul, "Bits per element, > 0.", EXT_REF),
    field("packing_factor", Int8ul, "Elements per byte: 1 for >= 8 bits, else 8 / bit_width.", EXT_REF),
    field("is_float", Int8ul, "0x01 floating point, 0x00 integer.", EXT_REF),
    field("is_signed", Int8ul, "0x01 signed integer; 0x00 for floats.", EXT_REF),
    field("sign_bits", Int8ul, "Sign bits of a float (0 or 1); 0 for integers.", EXT_REF),
    field("exponent_bits", Int8ul, "Exponent bits of a float; 0 for integers.", EXT_REF),
    field("mantissa_bits", Int8ul, "Mantissa bits of a float; 0 for integers.", EXT_REF),
    reserved("_reserved", Bytes(2), EXT_REF),
    field("exponent_bias", Int32ul, "Exponent bias of a float; 0 for integers.", EXT_REF),
    field("has_nan", Int8ul, "0x01 when NaN is representable.", EXT_REF),
    field("has_inf", Int8ul, "0x01 when infinity is representable.", EXT_REF),
    reserved("_reserved2", Bytes(2), EXT_REF),
)
"""20-byte inline description of a private element type (ADR-001)."""

MEMBER_REF = "metadata.md § Composite Member Section"
COMPOSITE_MEMBER_SECTION = Struct(
    field("member_role", Int8ul, "0x00 correction, 0x01 base; 0x02-0xFF reserved.", MEMBER_REF,
          tags=MemberRole, valid=Valid(any_of=MemberRole)),
    reserved("_reserved", Bytes(15), MEMBER_REF, "Must be 0x00 (room for a future member_version)."),
)
"""16-byte section carried by overlay members."""
