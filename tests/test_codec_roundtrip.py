"""Round-trip properties of the descriptor codec, and agreement of the two codecs a
declaration gives (the fast plan and ``construct``'s own ``parse``/``build``).

Properties: for every generated valid descriptor ``d`` (every layout tag, every optional
section, empty and dynamic shapes), ``decode(encode(d)) == d``; for the bytes ``b`` of
such a descriptor, and for any mutation of them that still decodes,
``encode(decode(b)) == b``.
"""

from __future__ import annotations

import importlib
import pkgutil
import struct

import construct as c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_schema.codec import decode_descriptor as decode_checked
from hurray_schema.codec import encode_descriptor, parse_descriptor
from hurray_schema.errors import SpecViolation
from hurray_schema.model import (
    DYNAMIC_DIMENSION, OPEN_COMPOSITE, BlockPagedLayout, BufferHandle, ColumnMajorLayout, CompositeLayout,
    CompositeMember, CooLayout, CscLayout, CsfLayout, CsrLayout, ElementType, ExtensionLayout, ExtensionType,
    HilbertLayout, LayoutTag, MortonLayout, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine,
    RowMajorLayout, Shard, Statistics, StridedLayout, TensorDescriptor, TiledLayout,
)
import hurray_schema.structs as structs_pkg
from hurray_schema.structs import descriptor as D
from hurray_schema.structs import layouts as L
from hurray_schema.structs import quantization as Q
from hurray_schema.structs import sections as X
from hurray_schema.structs._declare import Field, plan
from hurray_schema.structs.wire import descriptor_spans
from support.sizes import size

U8, U16, U32, U64 = (st.integers(0, 2**b - 1) for b in (8, 16, 32, 64))
I64 = st.integers(-(2**63), 2**63 - 1)
F64 = st.floats(allow_nan=True, allow_infinity=True)
F32 = st.floats(width=32, allow_nan=False, allow_infinity=True)

# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------

DIM = st.one_of(st.integers(0, 16), st.just(0), st.just(DYNAMIC_DIMENSION), U64)
SHAPES = st.one_of(st.lists(DIM, min_size=0, max_size=5), st.lists(DIM, min_size=64, max_size=64))


def zeros_or(n: int):
    """Reserved bytes: zeros, as a valid writer emits them."""
    return st.just(bytes(n))


def tiled(rank: int, depth: int = 1):
    simple = st.sampled_from([0x01, 0x02, 0x03])
    inner_choices = [0x01, 0x02, 0x03] + ([0x04] if depth < L.MAX_TILED_DEPTH else [])

    @st.composite
    def build(draw):
        outer = draw(simple)
        inner_layout = draw(st.sampled_from(inner_choices))
        strides = st.lists(I64, min_size=rank, max_size=rank)
        return TiledLayout(
            tile_shape=draw(st.lists(st.integers(1, 2**64 - 1), min_size=rank, max_size=rank)),
            outer_layout=outer,
            inner_layout=inner_layout,
            outer_strides=draw(strides) if outer == 0x03 else None,
            inner_strides=draw(strides) if inner_layout == 0x03 else None,
            inner=draw(tiled(rank, depth + 1)) if inner_layout == 0x04 else None,
        )

    return build()


def layouts(rank: int):
    """Every layout tag's fields for a tensor of ``rank`` (structurally valid)."""
    n = st.integers(0, 2**64 - 1)
    choices = [
        st.just(RowMajorLayout()),
        st.just(ColumnMajorLayout()),
        st.builds(StridedLayout, st.lists(I64, min_size=rank, max_size=rank)),
        tiled(rank),
        st.builds(MortonLayout, st.lists(U32, min_size=rank, max_size=rank)),
        st.builds(CooLayout, n, st.sampled_from([0, 1])),
        st.builds(CsrLayout, n),
        st.builds(CscLayout, n),
        st.builds(CsfLayout, n, st.permutations(range(rank))),
        st.builds(BlockPagedLayout, page_size=U32, num_pages=U64, num_seqs=U32, paged_axis=st.just(0),
                  kv_role=st.sampled_from([0, 1, 2]), layer_index=U32, block_table_index_type=st.sampled_from([0, 1])),
        st.builds(CompositeLayout, st.sampled_from([1, 2, 3]), st.integers(0, OPEN_COMPOSITE - 1),
                  st.sampled_from([0, 1, 2])),
        st.builds(HilbertLayout, U32, U32),
        st.builds(ExtensionLayout, st.integers(0xF0, 0xFE), U64, st.binary(max_size=24)),
    ]
    return st.one_of(choices)


HANDLES = st.builds(
    BufferHandle, byte_size=U64, alignment=st.integers(0, 31).map(lambda e: 1 << e),
    device_tag=st.integers(0, 8) | st.integers(0xF0, 0xFE), sync_mode=st.sampled_from([0, 1, 2]),
    memory_class=st.sampled_from([0, 1, 2, 3]),
)

PADDING = st.one_of(st.just(b""), st.binary(max_size=12))
QUANTIZATIONS = st.one_of(
    st.builds(PerTensorAffine, scale=F32.filter(lambda x: x != 0), zero_point=st.integers(-(2**31), 2**31 - 1),
              padding=PADDING),
    st.builds(PerChannelAffine, axis=U32, scale_buffer_index=U32, zero_point_buffer_index=U32,
              flags=st.sampled_from([0, 1]), padding=PADDING),
    st.builds(PerBlockAffine, axis=U32, block_size=U32, scale_buffer_index=U32, zero_point_buffer_index=U32,
              flags=st.sampled_from([0, 1]), scale_type_tag=st.sampled_from([1, 2, 3]), padding=PADDING),
    st.builds(Nf4, axis=U32, block_size=U32, scale_buffer_index=U32, padding=PADDING),
    st.builds(Mxfp, axis=U32, block_size=U32, scale_buffer_index=U32, padding=PADDING),
)

STATISTICS = st.builds(
    Statistics, computed_mask=st.integers(0, 0x3F), nnz=U64, sparsity_ratio=F64, value_min=F64, value_max=F64,
    value_abs_max=F64, value_mean=F64, value_stddev=F64, nm_n=U8, nm_m=U8, has_nan=st.sampled_from([0, 1]),
    has_inf=st.sampled_from([0, 1]),
)

EXTENSION_TYPES = st.builds(
    ExtensionType, bit_width=st.integers(1, 2**32 - 1), packing_factor=U8, is_float=st.sampled_from([0, 1]),
    is_signed=st.sampled_from([0, 1]), sign_bits=st.sampled_from([0, 1]), exponent_bits=U8, mantissa_bits=U8,
    exponent_bias=U32, has_nan=st.sampled_from([0, 1]), has_inf=st.sampled_from([0, 1]),
)


@st.composite
def descriptors(draw, layout=None):
    """A structurally valid descriptor; ``layout`` pins one layout strategy."""
    shape = draw(SHAPES)
    rank = len(shape)
    lay = draw(layout(rank) if layout is not None else layouts(rank))
    private_type = draw(st.integers(0, 3)) == 0
    type_tag = draw(st.integers(0xF0, 0xFE)) if private_type else draw(st.sampled_from(list(ElementType)))
    is_head = lay.tag == LayoutTag.COMPOSITE
    maybe = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    return TensorDescriptor(
        type_tag=type_tag,
        shape=shape,
        layout=lay,
        buffers=() if is_head else draw(st.lists(HANDLES, min_size=1, max_size=6)),
        byte_offset=draw(U64),
        quantization=maybe(QUANTIZATIONS),
        shard=maybe(st.builds(Shard, st.lists(U64, min_size=rank, max_size=rank),
                              st.lists(U64, min_size=rank, max_size=rank))),
        statistics=maybe(STATISTICS),
        extension_type=draw(EXTENSION_TYPES) if private_type else None,
        composite_member=maybe(st.builds(CompositeMember, st.sampled_from([0, 1]))),
    )


def _mode(desc: TensorDescriptor) -> str:
    """Private extension layouts are unknown to a strict reader (metadata.md § Extension Layouts)."""
    return "permissive" if isinstance(desc.layout, ExtensionLayout) else "strict"


def decode_descriptor(data, mode="strict"):
    """The structural codec alone: generated descriptors are structurally valid, while
    their field values (sizes, indices) are arbitrary, so the semantic rules that
    :func:`hurray_schema.decode_descriptor` runs afterwards are not applied here."""
    return parse_descriptor(data, mode=mode)[0]


SETTINGS = settings(max_examples=size(60, 150), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------

def _nested_tiled(depth: int) -> TiledLayout:
    """``depth`` tiling levels of 1x1 tiles, innermost row-major."""
    level = TiledLayout((1, 1))
    for _ in range(depth - 1):
        level = TiledLayout((1, 1), inner_layout=0x04, inner=level)
    return level


EDGE_CASES = {
    "empty-1d": TensorDescriptor(ElementType.FLOAT32, (0,), buffers=[BufferHandle(0)]),
    "empty-3x0x5": TensorDescriptor(ElementType.FLOAT32, (3, 0, 5), buffers=[BufferHandle(0)]),
    "scalar": TensorDescriptor(ElementType.FLOAT64, (), buffers=[BufferHandle(8)]),
    "scalar-strided": TensorDescriptor(ElementType.INT8, (), StridedLayout(()), buffers=[BufferHandle(1)]),
    "csr-nnz0": TensorDescriptor(ElementType.FLOAT32, (3, 3), CsrLayout(0),
                                 buffers=[BufferHandle(0), BufferHandle(0), BufferHandle(32)]),
    "int4-zero-elements": TensorDescriptor(ElementType.INT4, (7, 0), buffers=[BufferHandle(0)]),
    "bool-zero-elements": TensorDescriptor(ElementType.BOOL, (0,), buffers=[BufferHandle(0, alignment=1)]),
    "float6-zero-elements": TensorDescriptor(ElementType.FLOAT6_E2M3, (0, 3), buffers=[BufferHandle(0)]),
    "per-block-axis-0": TensorDescriptor(ElementType.INT4, (0, 64), buffers=[BufferHandle(0), BufferHandle(0)],
                                         quantization=PerBlockAffine(0, 32, 1, flags=1, scale_type_tag=1)),
    "dynamic": TensorDescriptor(ElementType.FLOAT32, (DYNAMIC_DIMENSION, 4), buffers=[BufferHandle(0)]),
    "dynamic-and-zero": TensorDescriptor(ElementType.FLOAT32, (DYNAMIC_DIMENSION, 0), buffers=[BufferHandle(0)]),
    "rank-64": TensorDescriptor(ElementType.UINT8, (1,) * 64, buffers=[BufferHandle(1)]),
    "tiled-depth-8": TensorDescriptor(ElementType.FLOAT32, (2, 2), buffers=[BufferHandle(16)],
                                      layout=_nested_tiled(8)),
    "composite-head": TensorDescriptor(ElementType.FLOAT32, (8, 8), CompositeLayout(1, 2)),
    "all-sections": TensorDescriptor(0xF3, (2,), buffers=[BufferHandle(3)], quantization=Nf4(0, 64, 1),
                                     shard=Shard((4,), (2,)), statistics=Statistics(0x3F, nnz=1),
                                     extension_type=ExtensionType(12), composite_member=CompositeMember(1)),
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_round_trip(name):
    desc = EDGE_CASES[name]
    wire = encode_descriptor(desc)
    assert len(wire) == desc.encoded_length
    back = decode_descriptor(wire)
    assert back == desc
    assert encode_descriptor(back) == wire


STRUCTURE_ONLY = {"scalar-strided", "all-sections"}  # break descriptor rules on purpose


@pytest.mark.parametrize("name", sorted(set(EDGE_CASES) - STRUCTURE_ONLY))
def test_edge_cases_are_valid_descriptors(name):
    """ADR-007: empty tensors, scalars and the dynamic sentinel pass every descriptor rule."""
    assert decode_checked(encode_descriptor(EDGE_CASES[name])) == EDGE_CASES[name]


def test_zero_and_dynamic_sentinel_are_distinct_on_the_wire():
    zero = encode_descriptor(EDGE_CASES["empty-1d"])
    dyn = encode_descriptor(TensorDescriptor(ElementType.FLOAT32, (DYNAMIC_DIMENSION,), buffers=[BufferHandle(0)]))
    assert zero[20:28] == bytes(8) and dyn[20:28] == b"\xff" * 8
    assert decode_descriptor(zero).shape == (0,) and decode_descriptor(zero).is_empty
    back = decode_descriptor(dyn)
    assert back.shape == (DYNAMIC_DIMENSION,) and not back.is_empty and back.element_count is None


def test_tiled_depth_8_has_8_levels():
    assert decode_descriptor(encode_descriptor(EDGE_CASES["tiled-depth-8"])).layout.depth == 8


@SETTINGS
@given(descriptors())
def test_decode_encode_round_trip(desc):
    wire = encode_descriptor(desc)
    assert len(wire) == desc.encoded_length
    assert int.from_bytes(wire[6:10], "little") == len(wire)
    back, findings = parse_descriptor(wire, mode=_mode(desc))
    assert back == desc
    assert encode_descriptor(back) == wire
    spans = descriptor_spans(desc)  # contiguous, in wire order, covering every byte
    assert [start for _, start, _ in spans] == [0] + [end for _, _, end in spans[:-1]]
    assert spans[-1][2] == len(wire)
    order = [part.name for part in D.DESCRIPTOR_PARTS]
    assert [order.index(name) for name, _, _ in spans] == sorted(order.index(name) for name, _, _ in spans)
    assert [f.rule_id for f in findings] == (["descriptor.layout.extension_unknown"] if _mode(desc) != "strict" else [])


LAYOUT_STRATEGIES = {
    "tiled": lambda rank: tiled(rank),
    "csf": lambda rank: st.builds(CsfLayout, U64, st.permutations(range(rank))),
    "block-paged": lambda rank: st.builds(BlockPagedLayout, U32, U64, U32),
    "composite": lambda rank: st.builds(CompositeLayout, st.sampled_from([1, 2, 3]), U32, st.sampled_from([0, 1, 2])),
    "extension": lambda rank: st.builds(ExtensionLayout, st.integers(0xF0, 0xFE), U64, st.binary(max_size=64)),
}


@pytest.mark.parametrize("kind", sorted(LAYOUT_STRATEGIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_round_trip_per_layout(kind, data):
    """Each structurally richer layout gets its own budget of examples."""
    desc = data.draw(descriptors(layout=LAYOUT_STRATEGIES[kind]))
    wire = encode_descriptor(desc)
    back = decode_descriptor(wire, mode=_mode(desc))
    assert back == desc and encode_descriptor(back) == wire


@SETTINGS
@given(descriptors(), st.data())
def test_any_mutation_that_decodes_reencodes_identically(desc, data):
    """Flip one byte of a valid descriptor: the decoder raises SpecViolation (and nothing
    else) or returns a descriptor that encodes back to exactly the mutated bytes."""
    wire = bytearray(encode_descriptor(desc))
    pos = data.draw(st.integers(0, len(wire) - 1))
    wire[pos] = data.draw(U8.filter(lambda v: v != wire[pos]))
    wire = bytes(wire)
    for mode in ("strict", "permissive"):
        try:
            back = decode_checked(wire, mode=mode)
        except SpecViolation as exc:
            assert exc.offset is None or 0 <= exc.offset <= len(wire)
            continue
        assert encode_descriptor(back) == wire


@SETTINGS
@given(st.binary(min_size=0, max_size=200), st.sampled_from(["strict", "permissive"]))
def test_arbitrary_bytes_raise_only_spec_violation(raw, mode):
    framed = b"HRRY\x01\x00" + struct.pack("<I", len(raw) + 10) + raw  # past the magic/length checks
    for data in (raw, framed):
        try:
            back = decode_checked(data, mode=mode)
        except SpecViolation:
            continue
        length = int.from_bytes(data[6:10], "little")
        assert encode_descriptor(back) == data[:length]


# --------------------------------------------------------------------------------------
# The fast plan and construct's own codec agree for every declaration
# --------------------------------------------------------------------------------------


def _is_declaration(obj) -> bool:
    return isinstance(obj, c.Struct) and bool(obj.subcons) and all(isinstance(s, Field) for s in obj.subcons)


PARSED_BY_CONSTRUCT = {"session"}
"""Modules whose tables are decoded by construct itself, never by the fast plan: the session's
(``hurray_schema/net/messages.py``; round-tripped against the independent peers' encoders in
``tests/test_net_messages.py``)."""


def _declarations():
    """Every table declared in a module of ``hurray_schema.structs`` (also inside
    module-level dicts such as tag -> table maps) that the fast plan decodes."""
    seen = {}
    for info in pkgutil.iter_modules(structs_pkg.__path__):
        if info.name in PARSED_BY_CONSTRUCT:
            continue
        module = importlib.import_module(f"{structs_pkg.__name__}.{info.name}")
        short = info.name
        for name, obj in vars(module).items():
            if _is_declaration(obj):
                seen.setdefault(id(obj), (f"{short}.{name}", obj))
            elif isinstance(obj, dict):
                for key, value in obj.items():
                    if _is_declaration(value):
                        seen.setdefault(id(value), (f"{short}.{name}[{key!r}]", value))
    return sorted(seen.values(), key=lambda item: item[0])


DECLARATIONS = _declarations()


def test_every_wire_table_is_covered():
    names = {n for n, _ in DECLARATIONS}
    for expected in ("descriptor.FIXED_HEADER", "descriptor.BUFFER_HANDLE", "descriptor.SHAPE",
                     "layouts.TILED", "layouts.EXTENSION", "layouts.COMPOSITE", "quantization.PER_BLOCK_AFFINE",
                     "quantization.MXFP", "sections.STATISTICS_SECTION", "sections.COMPOSITE_MEMBER_SECTION"):
        assert expected in names
    assert len(DECLARATIONS) >= 25


def _value_strategy(sub: c.Construct):
    if isinstance(sub, c.Rebuild):  # a length an encoder derives: any value of its wire type
        return _value_strategy(sub.subcon)
    if isinstance(sub, c.FormatField):
        char = sub.fmtstr[-1]
        if char in "fd":
            return st.floats(width=32 if char == "f" else 64, allow_nan=False)
        bits = 8 * struct.calcsize("<" + char)
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if char.islower() else st.integers(0, 2**bits - 1)
    if isinstance(sub, c.Bytes) and isinstance(sub.length, int):
        return st.binary(min_size=sub.length, max_size=sub.length)
    raise TypeError(sub)


@st.composite
def _values(draw, decl: c.Struct, context: dict):
    """Field values for ``decl`` drawn from the declaration itself (every branch taken)."""
    values = dict(context)
    for sub in decl.subcons:
        inner = sub.subcon
        if isinstance(inner, c.Const):
            values[sub.name] = inner.value
        elif isinstance(inner, c.IfThenElse):
            values[sub.name] = (draw(st.lists(_value_strategy(inner.thensubcon.subcon), min_size=values["rank"],
                                              max_size=values["rank"]))
                                if inner.condfunc(values) else None)
        elif isinstance(inner, c.Array):
            n = inner.count(values) if callable(inner.count) else inner.count
            values[sub.name] = draw(st.lists(_value_strategy(inner.subcon), min_size=n, max_size=n))
        elif isinstance(inner, c.Bytes) and callable(inner.length):
            data = draw(st.binary(max_size=40))
            length_field = repr(inner.length).split("'")[1]  # this['<name>']
            values[length_field] = len(data)
            values[sub.name] = data
        elif sub.name in ("outer_layout", "inner_layout"):
            values[sub.name] = draw(st.sampled_from([1, 2, 3, 4]))
        else:
            values[sub.name] = draw(_value_strategy(inner))
    return values


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("name,decl", DECLARATIONS, ids=[n for n, _ in DECLARATIONS])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_plan_agrees_with_construct(name, decl, data):
    context = {"rank": data.draw(st.sampled_from([0, 1, 3]))}
    values = data.draw(_values(decl, context))
    fast = plan(decl)
    wire = fast.pack(**values)
    # ``this.rank`` names a sibling field: a table that uses it is parsed by construct
    # inside a struct whose first (zero-byte) field is the rank passed as a parameter.
    names = [sub.name for sub in decl.subcons]
    own = decl if "rank" in names else c.Struct("rank" / c.Computed(c.this._.rank), *decl.subcons)
    assert own.build(values, **context) == wire
    parsed = own.parse(wire, **context)
    decoded, end = fast.unpack(wire + b"\xEE" * 3, 0, **context)
    assert end == len(wire)
    for sub in decl.subcons:
        assert _plain(decoded[sub.name]) == _plain(parsed[sub.name]), sub.name
        assert _plain(decoded[sub.name]) == _plain(values[sub.name]), sub.name
    if fast.fixed_size is not None:
        assert fast.fixed_size == decl.sizeof() == len(wire)


def test_declared_sizes_match_the_spec_tables():
    """Sizes stated by the spec (literals here): header 20, handle 16, statistics 72,
    extension type 20, composite member 16, composite head fields 8."""
    assert plan(D.FIXED_HEADER).fixed_size == 20
    assert plan(D.BUFFER_HANDLE).fixed_size == 16
    assert plan(X.STATISTICS_SECTION).fixed_size == 72
    assert plan(X.EXTENSION_TYPE_SECTION).fixed_size == 20
    assert plan(X.COMPOSITE_MEMBER_SECTION).fixed_size == 16
    assert plan(L.COMPOSITE).fixed_size == 8
    assert plan(Q.QUANTIZATION_HEADER).fixed_size == 4
    sizes = {tag: plan(decl).fixed_size for tag, decl in Q.SCHEMES.items()}
    assert sizes == {1: 16, 2: 20, 3: 24, 4: 16, 5: 16}
