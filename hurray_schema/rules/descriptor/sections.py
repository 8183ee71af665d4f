"""Rules on the optional sections after the buffer table (``metadata.md``): shard,
statistics, extension type (a private element type's description) and composite member."""

from __future__ import annotations


from ...model import DYNAMIC_DIMENSION, StatisticsMask
from ...structs import sections as section_tables
from ...structs._declare import valid_source
from ..engine import Level
from .dispatch import Fact, When, descriptor_rule
from .sizes import SPARSE_LAYOUTS

MUST = Level.MUST
_DYNAMIC = DYNAMIC_DIMENSION
# plain ints: IntFlag arithmetic costs a microsecond per operation on the decode path
_NNZ_VALID = int(StatisticsMask.NNZ_VALID)
_VALUE_STATS_VALID = int(StatisticsMask.VALUE_STATS_VALID)
_NM_SPARSITY_VALID = int(StatisticsMask.NM_SPARSITY_VALID)
_STATS_KNOWN = int(sum(StatisticsMask))
_SHARD_SECTION = section_tables.SHARD_SECTION
_STATISTICS_SECTION = section_tables.STATISTICS_SECTION
_EXTENSION_TYPE_SECTION = section_tables.EXTENSION_TYPE_SECTION
_COMPOSITE_MEMBER_SECTION = section_tables.COMPOSITE_MEMBER_SECTION


def _all_valid(decl, section: str, *names: str) -> str:
    """The constraints the section's declaration ``decl`` puts on its fields ``names``, as one condition."""
    return " and ".join(f"({valid_source(decl, name, f'{section}.{name}')})" for name in names)


def _on_section(section: str, form):
    """A condition that holds where ``section`` is absent (its rules then pass) and is ``form`` otherwise."""
    return lambda s: not s.has(section) or form(s)


# --- shard ---------------------------------------------------------------------------


def _shard_within(s):
    bounds = " and ".join(f"shard.shard_offset[{k}] + shape[{k}] <= shard.parent_shape[{k}]" for k in range(s.rank))
    return f"({_DYNAMIC} in shape or {_DYNAMIC} in shard.parent_shape or {bounds or 'True'})"


@descriptor_rule("metadata.shard.bounds", MUST, "metadata.md § Shard Section",
                 "shard_offset[k] + shape[k] <= parent_shape[k] for every dimension.", when=When(facts={Fact.SHARD}),
                 passes=_on_section("shard", _shard_within))
def _shard_bounds(desc, ctx):
    s = desc.shard
    for k, (o, d, p) in enumerate(zip(s.shard_offset, desc.shape, s.parent_shape)):
        if o + d > p:
            return f"shard_offset[{k}] + shape[{k}] = {o + d} exceeds parent_shape[{k}] = {p}", \
                ctx.section("shard", _SHARD_SECTION, "shard_offset", k)


# --- statistics ----------------------------------------------------------------------

_STATISTICS = When(facts={Fact.STATISTICS})


def _statistics_field(ctx, name: str) -> int:
    return ctx.section("statistics", _STATISTICS_SECTION, name)


@descriptor_rule("metadata.statistics.mask_reserved", MUST, "metadata.md § computed_mask",
                 "computed_mask bits 6-31 are 0.", when=_STATISTICS,
                 passes=_on_section("statistics", lambda s: f"not statistics.computed_mask & {~_STATS_KNOWN}"))
def _stats_mask(desc, ctx):
    return f"reserved computed_mask bits 0x{desc.statistics.computed_mask & ~_STATS_KNOWN:08X}", \
        _statistics_field(ctx, "computed_mask")


@descriptor_rule("metadata.statistics.reserved", MUST, "metadata.md § Statistics Section › Field Encoding",
                 "The _reserved and _reserved2 fields of the statistics section are zero.", when=_STATISTICS,
                 passes=_on_section("statistics", lambda s: _all_valid(_STATISTICS_SECTION, "statistics",
                                                                          "_reserved", "_reserved2")))
def _stats_reserved(desc, ctx):
    s = desc.statistics
    if s._reserved:
        return f"statistics _reserved is 0x{s._reserved:08X}", _statistics_field(ctx, "_reserved")
    return f"statistics _reserved2 is {s._reserved2.hex()}", _statistics_field(ctx, "_reserved2")


@descriptor_rule("metadata.statistics.nm", MUST, "metadata.md § Statistics Section › Field Encoding",
                 "With NM_SPARSITY_VALID, nm_n <= nm_m.", when=_STATISTICS,
                 passes=_on_section("statistics", lambda s: f"(not statistics.computed_mask & {_NM_SPARSITY_VALID} "
                                    "or statistics.nm_n <= statistics.nm_m)"))
def _stats_nm(desc, ctx):
    s = desc.statistics
    return f"nm_n {s.nm_n} exceeds nm_m {s.nm_m}", _statistics_field(ctx, "nm_n")


@descriptor_rule("metadata.statistics.stddev", MUST, "metadata.md § Statistics Section › Field Encoding",
                 "With VALUE_STATS_VALID, value_stddev >= 0.0 (a NaN is not).", when=_STATISTICS,
                 passes=_on_section("statistics", lambda s: f"(not statistics.computed_mask & {_VALUE_STATS_VALID} "
                                    "or statistics.value_stddev >= 0.0)"))
def _stats_stddev(desc, ctx):
    return f"value_stddev {desc.statistics.value_stddev!r} is not >= 0", _statistics_field(ctx, "value_stddev")


@descriptor_rule("layout.sparse.statistics_nnz", MUST, "layouts/coo.md § Interaction with Statistics Section",
                 "For COO, CSR, CSC and CSF, a valid statistics nnz equals the layout's nnz (which is "
                 "authoritative).", when=When(layouts=SPARSE_LAYOUTS, facts={Fact.STATISTICS}),
                 passes=_on_section("statistics", lambda s: not issubclass(s.layout, SPARSE_LAYOUTS)
                                    or f"(not statistics.computed_mask & {_NNZ_VALID} or statistics.nnz == layout.nnz)"))
def _stats_nnz(desc, ctx):
    return f"statistics nnz {desc.statistics.nnz} differs from the layout's nnz {desc.layout.nnz}", \
        _statistics_field(ctx, "nnz")


# --- extension type ------------------------------------------------------------------

EXTENSION_TYPE_REF = "metadata.md § Extension Type Section"
_EXTENSION_TYPE = When(facts={Fact.EXTENSION_TYPE})
_SUB_BYTE_WIDTHS = (1, 2, 4)


def _extension_field(ctx, name: str) -> int:
    return ctx.section("extension_type", _EXTENSION_TYPE_SECTION, name)


@descriptor_rule("metadata.extension_type.bit_width", MUST, EXTENSION_TYPE_REF, "bit_width is greater than 0.",
                 when=_EXTENSION_TYPE, passes=_on_section("extension_type", lambda s: "extension_type.bit_width != 0"))
def _ext_width(desc, ctx):
    return "bit_width is 0", _extension_field(ctx, "bit_width")


@descriptor_rule("metadata.extension_type.packing", MUST, EXTENSION_TYPE_REF,
                 "packing_factor is 1 for bit_width >= 8; a sub-byte bit_width is 1, 2 or 4 with packing_factor "
                 "8/bit_width.", when=_EXTENSION_TYPE,
                 passes=_on_section("extension_type", lambda s: "(extension_type.bit_width == 0 or ("
                                    "extension_type.packing_factor == 1 if extension_type.bit_width >= 8 else "
                                    f"extension_type.bit_width in {_SUB_BYTE_WIDTHS} and extension_type.packing_factor"
                                    " == 8 // extension_type.bit_width))"))
def _ext_packing(desc, ctx):
    e = desc.extension_type
    if e.bit_width >= 8:
        return f"packing_factor {e.packing_factor} for a {e.bit_width}-bit type (must be 1)", \
            _extension_field(ctx, "packing_factor")
    if e.bit_width not in _SUB_BYTE_WIDTHS:
        return f"sub-byte bit_width {e.bit_width} is not 1, 2 or 4", _extension_field(ctx, "bit_width")
    return f"packing_factor {e.packing_factor} is not 8/{e.bit_width}", _extension_field(ctx, "packing_factor")


_INTEGER_ZERO_FIELDS = ("sign_bits", "exponent_bits", "mantissa_bits", "exponent_bias")


@descriptor_rule("metadata.extension_type.float_fields", MUST, EXTENSION_TYPE_REF,
                 "A float type has is_signed 0 and sign_bits 0 or 1; an integer type has sign_bits, exponent_bits, "
                 "mantissa_bits and exponent_bias all 0.", when=_EXTENSION_TYPE,
                 passes=_on_section("extension_type", lambda s: "(not extension_type.is_signed and "
                                    "extension_type.sign_bits <= 1 if extension_type.is_float else not ("
                                    + " or ".join(f"extension_type.{name}" for name in _INTEGER_ZERO_FIELDS) + "))"))
def _ext_fields(desc, ctx):
    e = desc.extension_type
    if e.is_float:
        if e.is_signed:
            return "is_signed is set on a float type", _extension_field(ctx, "is_signed")
        return f"sign_bits {e.sign_bits} is not 0 or 1", _extension_field(ctx, "sign_bits")
    name = next(name for name in _INTEGER_ZERO_FIELDS if getattr(e, name))
    return f"{name} is {getattr(e, name)} on an integer type (must be 0)", _extension_field(ctx, name)


@descriptor_rule("metadata.extension_type.reserved", MUST, EXTENSION_TYPE_REF,
                 "The _reserved and _reserved2 bytes of the Extension Type section are zero.", when=_EXTENSION_TYPE,
                 passes=_on_section("extension_type", lambda s: _all_valid(_EXTENSION_TYPE_SECTION, "extension_type",
                                                                              "_reserved", "_reserved2")))
def _ext_reserved(desc, ctx):
    e = desc.extension_type
    if any(e._reserved):
        return f"_reserved is {e._reserved.hex()}", _extension_field(ctx, "_reserved")
    return f"_reserved2 is {e._reserved2.hex()}", _extension_field(ctx, "_reserved2")


# --- composite member ----------------------------------------------------------------

COMPOSITE_MEMBER_REF = "metadata.md § Composite Member Section"
_COMPOSITE_MEMBER = When(facts={Fact.COMPOSITE_MEMBER})


@descriptor_rule("metadata.composite_member.role", MUST, COMPOSITE_MEMBER_REF,
                 "member_role is 0x00 (correction) or 0x01 (base).", when=_COMPOSITE_MEMBER,
                 passes=_on_section("composite_member",
                                    lambda s: _all_valid(_COMPOSITE_MEMBER_SECTION, "composite_member", "member_role")))
def _member_role(desc, ctx):
    return f"member_role 0x{desc.composite_member.member_role:02X} is reserved", \
        ctx.section("composite_member", _COMPOSITE_MEMBER_SECTION, "member_role")


@descriptor_rule("metadata.composite_member.reserved", MUST, COMPOSITE_MEMBER_REF,
                 "The 15 _reserved bytes of the Composite Member section are zero.", when=_COMPOSITE_MEMBER,
                 passes=_on_section("composite_member", lambda s: _all_valid(_COMPOSITE_MEMBER_SECTION,
                                                                                "composite_member", "_reserved")))
def _member_reserved(desc, ctx):
    return f"_reserved is {desc.composite_member._reserved.hex()}", \
        ctx.section("composite_member", _COMPOSITE_MEMBER_SECTION, "_reserved")
