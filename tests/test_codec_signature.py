"""The decoders compiled per header signature (``hurray_schema.signature``) agree with the
general decoder on every input: same descriptor, same findings, same error.

Each property clears the signature tables, decodes a descriptor twice (so its header is
compiled), then compares what :func:`parse_descriptor` returns for the original and for
mutated copies with what the general decoder alone returns.
"""

from __future__ import annotations

import struct

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hurray_schema import signature
from hurray_schema.codec import DECODER, _parse_general, encode_descriptor, parse_descriptor
from hurray_schema.errors import FieldRangeError, HurraySchemaError, LimitExceeded
from hurray_schema.limits import DEFAULT_LIMITS, Limits
from hurray_schema.model import (
    BufferHandle, CsrLayout, ElementType, PerBlockAffine, Shard, Statistics, TensorDescriptor, TiledLayout,
)
from hurray_schema.rules.engine import Mode
from hurray_schema.structs._declare import static_offset
from hurray_schema.structs.descriptor import BUFFER_COUNT, FIXED_HEADER_SIZE
from hurray_schema.structs.wire import descriptor_spans

from support.rule_cases import DESCRIPTOR_CASES
from support.strategies import DESCRIPTOR_SETTINGS, U8, descriptors, reader_mode


def _general(data, mode: str):
    """What the general decoder says: ``("ok", desc, findings)`` or ``("error", type, rule_id)``."""
    try:
        desc, findings = _parse_general(memoryview(data), Mode(mode), 0, DEFAULT_LIMITS)
    except HurraySchemaError as exc:
        return ("error", type(exc), getattr(exc, "rule_id", None))
    return ("ok", desc, [(f.rule_id, f.offset) for f in findings])


def _public(data, mode: str, limits=None):
    try:
        desc, findings = parse_descriptor(data, mode=mode, limits=limits)
    except HurraySchemaError as exc:
        return ("error", type(exc), getattr(exc, "rule_id", None))
    return ("ok", desc, [(f.rule_id, f.offset) for f in findings])


def _warm(wire: bytes, mode: str) -> None:
    DECODER.reset()
    parse_descriptor(wire, mode=mode)
    parse_descriptor(wire, mode=mode)


def _same_repr(a, b) -> bool:
    """Equal, and equal down to the types (an IntEnum member stays one)."""
    return a == b and repr(a) == repr(b)


@DESCRIPTOR_SETTINGS
@given(descriptors(), st.data())
def test_compiled_decoder_agrees_with_the_general_decoder(desc, data):
    mode = reader_mode(desc)
    wire = encode_descriptor(desc)
    _warm(wire, mode)
    compiled = signature.lookup(wire[:FIXED_HEADER_SIZE])
    want = _general(wire, mode)
    assert want[0] == "ok" and want[1] == desc
    if compiled is not None:
        assert want[2] == [] and _same_repr(compiled.decode(wire), want[1])
    assert _public(wire, mode)[0] == "ok"
    assert _same_repr(_public(wire, mode)[1], want[1]) and _public(wire, mode)[2] == want[2]
    # any byte after the header changed: the compiled path (or its fallback) still agrees
    mutated = bytearray(wire)
    if len(mutated) > FIXED_HEADER_SIZE:
        pos = data.draw(st.integers(FIXED_HEADER_SIZE, len(mutated) - 1))
        mutated[pos] = data.draw(U8.filter(lambda v: v != mutated[pos]))
    for variant in (bytes(mutated), bytes(mutated) + b"\xAA" * 7, memoryview(bytearray(mutated))):
        for m in ("strict", "permissive"):
            want, got = _general(variant, m), _public(variant, m)
            assert got[0] == want[0]
            if want[0] == "ok":
                assert _same_repr(got[1], want[1]) and got[2] == want[2]
            else:
                assert got[1:] == want[1:]


def _per_block() -> TensorDescriptor:
    return TensorDescriptor(
        ElementType.INT4, (128, 128), buffers=(BufferHandle(8192), BufferHandle(256)),
        quantization=PerBlockAffine(axis=1, block_size=128, scale_buffer_index=1, flags=1,
                                    scale_type_tag=ElementType.FLOAT16),
        shard=Shard((256, 128), (128, 0)),
    )


def test_every_common_layout_is_compiled():
    for desc in (_per_block(),
                 TensorDescriptor(ElementType.FLOAT32, (3, 3), CsrLayout(nnz=3),
                                  (BufferHandle(12), BufferHandle(24), BufferHandle(32)))):
        wire = encode_descriptor(desc)
        _warm(wire, "strict")
        compiled = signature.lookup(wire[:FIXED_HEADER_SIZE])
        assert compiled is not None and compiled.length == len(wire)
        assert "_unpack(data" in compiled.source


def test_a_header_is_compiled_only_the_second_time():
    wire = encode_descriptor(_per_block())
    DECODER.reset()
    parse_descriptor(wire)
    assert signature.lookup(wire[:FIXED_HEADER_SIZE]) is None
    parse_descriptor(wire)
    assert signature.lookup(wire[:FIXED_HEADER_SIZE]) is not None


def test_tiled_layout_stays_with_the_general_decoder():
    desc = TensorDescriptor(ElementType.FLOAT32, (4, 4), TiledLayout(tile_shape=(2, 2)), (BufferHandle(64),))
    wire = encode_descriptor(desc)
    _warm(wire, "strict")
    assert signature.lookup(wire[:FIXED_HEADER_SIZE]) is None
    assert parse_descriptor(wire)[0] == desc


def test_a_different_buffer_count_under_the_same_header_falls_back():
    """buffer_count is a guard: same header (length included), other count -> general decoder."""
    desc = _per_block()
    wire = encode_descriptor(desc)
    _warm(wire, "strict")
    count_at = dict((part, start) for part, start, _ in descriptor_spans(desc))["buffer_table"] + static_offset(
        BUFFER_COUNT, "buffer_count")
    assert wire[count_at] == 2
    forged = wire[:count_at] + b"\x01" + wire[count_at + 1:]
    assert _public(forged, "strict") == _general(forged, "strict")
    assert _public(forged, "strict")[0] == "error"


def test_a_lower_limit_is_still_enforced_on_a_compiled_header():
    wire = encode_descriptor(_per_block())
    _warm(wire, "strict")
    with pytest.raises(LimitExceeded):
        parse_descriptor(wire, limits=Limits(max_buffer_count=1))
    with pytest.raises(LimitExceeded):
        parse_descriptor(wire, limits=Limits(max_rank=1))
    assert parse_descriptor(wire, limits=Limits(max_rank=2))[0] == _per_block()


def test_truncated_input_under_a_compiled_header_is_reported_truncated():
    wire = encode_descriptor(_per_block())
    _warm(wire, "strict")
    assert _public(wire[:-1], "strict") == _general(wire[:-1], "strict")
    assert _public(wire[:-1], "strict")[0] == "error"


def test_the_signature_tables_stay_bounded():
    """More distinct headers than MAX_SIGNATURES (rank x type_tag): the tables are emptied
    and refilled, never larger than the bound, and decoding stays correct throughout."""
    types = list(ElementType)
    headers = [(t, rank) for rank in range(1, 61) for t in types]
    assert len(headers) > signature.MAX_SIGNATURES
    for t, rank in headers:
        desc = TensorDescriptor(t, (0,) * rank, buffers=(BufferHandle(0),))
        wire = encode_descriptor(desc)
        assert parse_descriptor(wire)[0] == desc
        assert parse_descriptor(wire)[0] == desc
        held = DECODER.stats()
        assert held["compiled"][0] + held["seen"][0] + held["refused"][0] <= signature.MAX_SIGNATURES


def test_slot_constructor_stores_what_the_attrs_constructor_stores():
    make = signature.slot_constructor(BufferHandle)
    assert _same_repr(make(64, 64, 0, 0, 0, 0), BufferHandle(64, 64, 0, 0, 0, 0))
    assert _same_repr(make(64, 64, 0x42, 0x09, 0xF5, 1), BufferHandle(64, 64, 0x42, 0x09, 0xF5, 1))
    with pytest.raises(AttributeError):
        make(1, 64, 0, 0, 0, 0).byte_size = 2  # still frozen


def test_classes_of_many_fields_are_filled_through_their_twin_and_become_the_frozen_class():
    """``TWIN_MIN_FIELDS`` fields or more: filled as the plain twin, then given the class."""
    assert len(attrs.fields(Statistics)) >= signature.TWIN_MIN_FIELDS > len(attrs.fields(Shard))
    make = signature.slot_constructor(Statistics)
    values = (0x7F, 30, 0.0625, -1.0, 2.0, 2.0, 0.5, 0.25, 2, 4, 1, 0, 0, b"\0" * 4)
    made, built = make(*values), Statistics(*values)
    assert type(made) is Statistics and _same_repr(made, built)
    with pytest.raises(AttributeError):
        made.nnz = 1  # still frozen
    assert signature._twin_of(Statistics) is not None


def test_pack_calls_split_a_long_format_into_calls_that_give_the_same_bytes():
    """A compiled encoder packs at most ``MAX_PACK_ARGUMENTS`` values per call; the calls'
    bytes joined are the bytes of the whole format."""
    fmt = "<4sBBLL" + "Q" * 40 + "2Q3x2sxB"
    values = [b"HRRY", 1, 0, 7, 9] + list(range(40)) + [5, 6, b"ab", 255]
    assert signature._format_items(fmt)[-4:] == ["Q", "Q3x", "2sx", "B"]
    assert signature._format_items("<B0QL") == ["B", "L"] and signature._items("0Q4s") == 1
    calls = signature._pack_calls(fmt, [repr(v) for v in values])
    assert len(calls) == 2 and all(len(args) <= signature.MAX_PACK_ARGUMENTS for _, args in calls)
    joined, start = b"", 0
    for codec, args in calls:
        joined += codec.pack(*values[start:start + len(args)])
        start += len(args)
    assert joined == struct.pack(fmt, *values)


def test_struct_item_count_helper():
    assert signature._items("QQ4Q") == 6
    assert signature._items("B3sI") == 3
    assert signature._items("") == 0
    assert struct.calcsize("<B3sI") == 8


# --------------------------------------------------------------------------------------
# Compiled encoders
# --------------------------------------------------------------------------------------

from hurray_schema.structs.wire import encode_descriptor_bytes  # noqa: E402


def _encode_outcome(fn, desc):
    try:
        return ("ok", fn(desc))
    except Exception as exc:  # noqa: BLE001 -- both encoders must fail the same way
        return ("error", type(exc))


@DESCRIPTOR_SETTINGS
@given(descriptors())
def test_compiled_encoder_gives_the_general_encoders_bytes(desc):
    want = encode_descriptor_bytes(desc)
    assert encode_descriptor(desc) == want  # compiles
    assert encode_descriptor(desc) == want  # compiled
    compiled = signature.compiled_encoder(desc)
    if compiled is not None:  # None: a layout or scheme the general encoder keeps
        assert compiled(desc) == want


@DESCRIPTOR_SETTINGS
@given(st.lists(descriptors(), min_size=2, max_size=6))
def test_encoders_of_one_layout_class_tell_each_others_descriptors_apart(descs):
    """Encoders are tried by layout class, each refusing a descriptor of another key: a run
    of descriptors of several keys (rank, buffer count, scheme, sections), encoded twice in
    turn without clearing, gives the general encoder's bytes every time."""
    for desc in descs + descs:
        assert _encode_outcome(encode_descriptor, desc) == _encode_outcome(encode_descriptor_bytes, desc)


def test_a_dense_descriptor_is_not_encoded_by_the_encoder_of_a_sharded_one():
    dense = TensorDescriptor(ElementType.FLOAT32, (8, 4), buffers=(BufferHandle(128),))
    sharded = TensorDescriptor(ElementType.FLOAT32, (8, 4), buffers=(BufferHandle(128),),
                               shard=Shard((8, 8), (0, 4)))
    DECODER.reset()
    assert encode_descriptor(sharded) == encode_descriptor_bytes(sharded)
    assert signature.compiled_encoder(sharded)(dense) is signature.MISS
    assert encode_descriptor(dense) == encode_descriptor_bytes(dense)
    assert encode_descriptor(sharded) == encode_descriptor_bytes(sharded)


def test_arrays_of_another_length_than_the_rank_fall_back_to_the_general_encoder():
    """Lengths rank+1 and rank-1 add up to the compiled format's item count: a guard, not
    the struct module, must send them to the general encoder."""
    good = _per_block()
    DECODER.reset()
    encode_descriptor(good)
    odd = TensorDescriptor(good.type_tag, good.shape, buffers=good.buffers, quantization=good.quantization,
                           shard=Shard((256, 128, 1), (128,)))
    assert signature.encoder_key(odd) == signature.encoder_key(good)
    assert _encode_outcome(encode_descriptor, odd) == _encode_outcome(encode_descriptor_bytes, odd)


def test_a_value_out_of_range_fails_as_in_the_general_encoder():
    good = _per_block()
    DECODER.reset()
    encode_descriptor(good)
    bad = TensorDescriptor(good.type_tag, good.shape, buffers=(BufferHandle(-1), BufferHandle(256)),
                           quantization=good.quantization, shard=good.shard)
    want = _encode_outcome(encode_descriptor_bytes, bad)
    assert want[0] == "error"
    assert _encode_outcome(encode_descriptor, bad) == want


def test_trailing_bytes_of_a_newer_minor_are_encoded_by_the_general_encoder():
    good = _per_block()
    newer = TensorDescriptor(good.type_tag, good.shape, buffers=good.buffers, quantization=good.quantization,
                             shard=good.shard, version_minor=1, trailing=b"\x01\x02")
    DECODER.reset()
    encode_descriptor(good)
    assert signature.encoder_key(newer) == signature.encoder_key(good)
    assert encode_descriptor(newer) == encode_descriptor_bytes(newer)
    assert encode_descriptor(newer).endswith(b"\x01\x02")


def test_a_first_descriptor_that_does_not_encode_leaves_its_shape_compilable():
    good = _per_block()
    bad = TensorDescriptor(good.type_tag, good.shape, buffers=(BufferHandle(-1), BufferHandle(256)),
                           quantization=good.quantization, shard=good.shard)
    DECODER.reset()
    with pytest.raises(FieldRangeError) as info:
        encode_descriptor(bad)
    assert info.value.field == "byte_size"
    assert encode_descriptor(good) == encode_descriptor_bytes(good)
    assert signature.compiled_encoder(good) is not None


def test_a_header_compiled_under_raised_limits_still_meets_the_default_ones():
    """A 16 MiB + 64 byte descriptor (long quantization padding) compiled while
    max_descriptor_bytes was raised is still refused under the default limits."""
    big = TensorDescriptor(ElementType.INT4, (128, 128), buffers=(BufferHandle(8192), BufferHandle(256)),
                           quantization=PerBlockAffine(axis=1, block_size=128, scale_buffer_index=1, flags=1,
                                                       scale_type_tag=ElementType.FLOAT16,
                                                       padding=bytes(DEFAULT_LIMITS.max_descriptor_bytes)))
    wire = encode_descriptor(big)
    raised = Limits(max_descriptor_bytes=2 * DEFAULT_LIMITS.max_descriptor_bytes)
    DECODER.reset()
    parse_descriptor(wire, limits=raised)
    parse_descriptor(wire, limits=raised)
    assert signature.lookup(wire[:FIXED_HEADER_SIZE]) is not None
    with pytest.raises(LimitExceeded):
        parse_descriptor(wire)


# --------------------------------------------------------------------------------------
# The by-value tables (a repeated descriptor is decoded, checked and encoded once)
# --------------------------------------------------------------------------------------


def _reference(data, mode: str):
    """decode_descriptor's outcome from the general decoder and every rule run one by one."""
    from hurray_schema.rules.descriptor import DESCRIPTOR_RULES, DescriptorContext

    try:
        desc, _ = _parse_general(memoryview(data), Mode(mode), 0, DEFAULT_LIMITS)
    except HurraySchemaError as exc:
        return ("error", type(exc), getattr(exc, "rule_id", None), getattr(exc, "offset", None), str(exc))
    ctx = DescriptorContext(desc, Mode(mode))
    for rule in DESCRIPTOR_RULES:
        for f in rule.check(desc, ctx):
            if f.is_error:
                exc = f.to_violation()
                return ("error", type(exc), exc.rule_id, exc.offset, str(exc))
    return ("ok", desc, repr(desc))


def _decoded(data, mode: str):
    from hurray_schema.codec import decode_descriptor

    try:
        desc = decode_descriptor(data, mode=mode)
    except HurraySchemaError as exc:
        return ("error", type(exc), getattr(exc, "rule_id", None), getattr(exc, "offset", None), str(exc))
    return ("ok", desc, repr(desc))


@DESCRIPTOR_SETTINGS
@given(descriptors(), st.data())
def test_the_value_tables_change_no_outcome(desc, data):
    """A descriptor decoded again and again (compiled header, by-value table, passed-rules
    table) and a one-byte mutation of it decode -- or fail, with the same rule, offset and
    message -- as the general decoder followed by every rule, in both modes, the tables on
    and off; and the encoded-bytes table gives the general encoder's bytes."""
    wire = encode_descriptor(desc)
    mutated = bytearray(wire)
    if len(mutated) > FIXED_HEADER_SIZE:
        pos = data.draw(st.integers(FIXED_HEADER_SIZE, len(mutated) - 1))
        mutated[pos] = data.draw(U8.filter(lambda v: v != mutated[pos]))
    try:
        for tables in (True, False):
            DECODER.reset()
            signature.use_value_tables(tables)
            for variant in (wire, bytes(mutated), bytes(mutated) + b"\xAA" * 3):
                for mode in ("strict", "permissive", "strict"):
                    want = _reference(variant, mode)
                    for _ in range(3):  # first-seen header, compiled, then the tables
                        assert _decoded(variant, mode) == want
                        assert _decoded(memoryview(bytearray(variant)), mode) == want
            for _ in range(2):
                assert encode_descriptor(desc) == encode_descriptor_bytes(desc)
    finally:
        signature.use_value_tables(True)


def test_a_repeated_descriptor_is_the_object_decoded_first():
    from hurray_schema.codec import decode_descriptor

    wire = encode_descriptor(_per_block())
    first = [decode_descriptor(wire) for _ in range(3)][-1]  # compiled the second time, kept the third
    assert decode_descriptor(wire) is first
    assert decode_descriptor(bytearray(wire) + b"next tensor") is first
    other = parse_descriptor(wire[:-1] + bytes([wire[-1] ^ 1]))[0]
    assert other is not first and other != first


def test_the_value_tables_stay_bounded():
    base = _per_block()
    for i in range(signature.MAX_VALUES + 10):
        desc = TensorDescriptor(base.type_tag, base.shape, buffers=(BufferHandle(8192 + 64 * i), BufferHandle(256)),
                                quantization=base.quantization, shard=base.shard)
        parse_descriptor(encode_descriptor(desc))
        held = DECODER.stats()
        assert held["values"][0] <= signature.MAX_VALUES and held["encoded"][0] <= signature.MAX_VALUES


def test_long_descriptors_are_not_remembered_by_value():
    """A compiled header may declare a long descriptor (quantization padding): such bytes
    are decoded every time, never kept, so the tables stay small whatever the input."""
    import attrs

    from hurray_schema.codec import decode_descriptor

    base = _per_block()
    long = attrs.evolve(base, quantization=attrs.evolve(base.quantization, padding=bytes(signature.MAX_VALUE_BYTES)))
    wire = encode_descriptor(long)
    assert len(wire) > signature.MAX_VALUE_BYTES
    decoded = [decode_descriptor(wire) for _ in range(3)]
    assert decoded[-1] == long and signature.lookup(wire[:FIXED_HEADER_SIZE]) is not None
    assert signature.remembered(wire) is None and decoded[-1] is not decoded[-2]
    assert signature.accepted(wire) is None and signature.parsed(wire) is None
    assert DECODER.stats()["encoded"][0] == 0


# --------------------------------------------------------------------------------------
# The checked decoder of a compiled header (the rules' conditions, compiled per header) against the general engine
# --------------------------------------------------------------------------------------


def _rule_cases():
    return DESCRIPTOR_CASES


def _checked_agrees(wire: bytes) -> None:
    for mode in ("strict", "permissive"):
        want = _reference(wire, mode)
        assert _decoded(wire, mode) == want
        assert _decoded(memoryview(bytearray(wire)), mode) == want


@pytest.mark.parametrize("tables", [True, False], ids=["tables on", "tables off"])
def test_checked_decoders_agree_with_the_general_engine_on_every_rule_case(tables):
    """For each rule's passing and firing descriptor: once its header is compiled, it
    decodes -- or fails with the same rule, offset and message -- as the general decoder
    followed by every rule, in both modes, again and again.  Both read each rule's one
    condition (``descriptor_rule(passes=...)``); what could still differ is how each binds a
    descriptor's values, which the generated descriptors below also try byte by byte."""
    previous = signature.use_value_tables(tables)
    try:
        for rule_id, good, bad in _rule_cases():
            for desc in (good, bad):
                wire = encode_descriptor(desc)
                DECODER.reset()
                for _ in range(3):
                    _checked_agrees(wire)
    finally:
        signature.use_value_tables(previous)


def test_every_valid_rule_case_takes_the_checked_decoder():
    """A valid descriptor under a compiled header is decoded and checked by the generated
    code: the rules' conditions (or the whole checks of the rules written without one) let it
    through.  That code holds no condition of its own: its last test is the conjunction the
    rules' plans are built from, for the signature of that header."""
    from hurray_schema.rules.descriptor.dispatch import signature_of, signature_pass_source

    taken = 0
    for _, good, _bad in _rule_cases():
        wire = encode_descriptor(good)
        DECODER.reset()
        parse_descriptor(wire)
        parse_descriptor(wire)
        compiled = signature.lookup(wire[:FIXED_HEADER_SIZE])
        if compiled is None or compiled.checked is None:
            assert compiled is None or not signature.plain_buffers(good.buffers)
            continue
        assert compiled.checked(wire) == good
        assert _same_repr(compiled.checked(wire), _general(wire, "strict")[1])
        expression, _ = signature_pass_source(signature_of(good))
        assert f"    if not ({expression}):\n        return None\n    return desc\n" in compiled.checked_source
        taken += 1
    assert taken > 40


def test_a_checked_decoder_refuses_what_a_rule_refuses():
    desc = _per_block()
    wire = encode_descriptor(desc)
    DECODER.reset()
    parse_descriptor(wire)
    parse_descriptor(wire)
    compiled = signature.lookup(wire[:FIXED_HEADER_SIZE])
    assert compiled.checked(wire) == desc
    spans = dict((part, start) for part, start, _ in descriptor_spans(desc))
    size_at = spans["buffer_table"] + static_offset(BUFFER_COUNT, "buffer_count") + 1  # buffer 0 byte_size
    small = wire[:size_at] + struct.pack("<Q", 64) + wire[size_at + 8:]
    assert compiled.checked(small) is None  # 64 bytes cannot hold 128x128 int4 values
    assert _decoded(small, "strict") == _reference(small, "strict")
    assert _decoded(small, "strict")[2] == "layout.dense.buffer_size"


@DESCRIPTOR_SETTINGS
@given(descriptors(), st.data())
def test_checked_decoders_agree_on_generated_descriptors(desc, data):
    """Generated descriptors (most break some rule) and one-byte changes of them, under a
    compiled header, tables off: decode_descriptor gives the general engine's outcome."""
    wire = encode_descriptor(desc)
    previous = signature.use_value_tables(False)
    try:
        DECODER.reset()
        for mode in ("strict", "permissive"):
            for _ in range(3):
                assert _decoded(wire, mode) == _reference(wire, mode)
        if len(wire) > FIXED_HEADER_SIZE:
            pos = data.draw(st.integers(FIXED_HEADER_SIZE, len(wire) - 1))
            mutated = bytearray(wire)
            mutated[pos] = data.draw(U8.filter(lambda v: v != mutated[pos]))
            _checked_agrees(bytes(mutated))
    finally:
        signature.use_value_tables(previous)


def test_a_descriptor_every_rule_passed_on_is_returned_by_its_bytes_and_still_limited():
    """``decode_descriptor`` keeps what it accepted under the default limits by its exact bytes:
    the same object in either mode, the same bytes read in both public decoders; raised or
    lowered limits still go through the checks."""
    from hurray_schema.codec import decode_descriptor

    wire = encode_descriptor(_per_block())
    for _ in range(3):  # seen, compiled, then taken by the checked decoder
        first = decode_descriptor(wire)
    assert signature.accepted(wire) is first
    assert decode_descriptor(wire, mode="permissive") is first
    assert signature.parsed(wire) is first  # every accepted descriptor parses cleanly
    assert parse_descriptor(wire) == (first, [])
    with pytest.raises(LimitExceeded):
        decode_descriptor(wire, limits=Limits(max_rank=1))
    with pytest.raises(LimitExceeded):
        parse_descriptor(wire, limits=Limits(max_rank=1))
    DECODER.reset()  # a rule declared later makes every kept verdict stale: the tables go together
    assert signature.accepted(wire) is None and signature.parsed(wire) is None


def test_a_descriptor_some_rule_fires_on_is_never_kept():
    from hurray_schema.codec import decode_descriptor

    # a per-block scale buffer index past the buffer table: a MUST of the scheme
    desc = attrs.evolve(_per_block(), quantization=attrs.evolve(_per_block().quantization, scale_buffer_index=7))
    wire = encode_descriptor(desc)  # the encoder writes what it is given; the decoder judges
    for _ in range(3):
        with pytest.raises(HurraySchemaError):
            decode_descriptor(wire)
    assert signature.accepted(wire) is None
    parse_descriptor(wire)
    parse_descriptor(wire)  # structurally sound: the parse keeps it, the decode still refuses it
    assert signature.parsed(wire) is not None
    with pytest.raises(HurraySchemaError):
        decode_descriptor(wire)
