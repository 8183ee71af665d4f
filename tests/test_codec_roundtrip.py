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
    DYNAMIC_DIMENSION, BlockPagedLayout, BufferHandle, CompositeLayout, CsfLayout, ElementType, ExtensionLayout,
    TensorDescriptor,
)
import hurray_schema.structs as structs_pkg
from hurray_schema.structs import descriptor as D
from hurray_schema.structs import layouts as L
from hurray_schema.structs import quantization as Q
from hurray_schema.structs import sections as X
from hurray_schema.structs._declare import Field, plan
from hurray_schema.structs.wire import descriptor_spans
from support.descriptors import EDGE_CASES
from support.strategies import DESCRIPTOR_SETTINGS, U8, U32, U64, descriptors, reader_mode, tiled


def decode_descriptor(data, mode="strict"):
    """The structural codec alone: generated descriptors are structurally valid, while
    their field values (sizes, indices) are arbitrary, so the semantic rules that
    :func:`hurray_schema.decode_descriptor` runs afterwards are not applied here."""
    return parse_descriptor(data, mode=mode)[0]


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------

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


@DESCRIPTOR_SETTINGS
@given(descriptors())
def test_decode_encode_round_trip(desc):
    wire = encode_descriptor(desc)
    assert len(wire) == desc.encoded_length
    assert int.from_bytes(wire[6:10], "little") == len(wire)
    back, findings = parse_descriptor(wire, mode=reader_mode(desc))
    assert back == desc
    assert encode_descriptor(back) == wire
    spans = descriptor_spans(desc)  # contiguous, in wire order, covering every byte
    assert [start for _, start, _ in spans] == [0] + [end for _, _, end in spans[:-1]]
    assert spans[-1][2] == len(wire)
    order = [part.name for part in D.DESCRIPTOR_PARTS]
    assert [order.index(name) for name, _, _ in spans] == sorted(order.index(name) for name, _, _ in spans)
    assert [f.rule_id for f in findings] == (["descriptor.layout.extension_unknown"] if reader_mode(desc) != "strict" else [])


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
    back = decode_descriptor(wire, mode=reader_mode(desc))
    assert back == desc and encode_descriptor(back) == wire


@DESCRIPTOR_SETTINGS
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


@DESCRIPTOR_SETTINGS
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
