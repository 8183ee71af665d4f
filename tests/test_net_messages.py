"""The session payloads (``hurray_schema/net/messages.py``, from ``structs/session.py``) against
the independent peers' ``struct`` encoders (``tests/support/peers/spec_wire.py``): the same bytes for the
same values, and each decoded back to what was encoded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hurray_schema.errors import SpecViolation
from hurray_schema.net import messages as m
from hurray_schema.structs import session as S
from support.peers import spec_wire as w
from support.strategies import U8, U32, U64

TAGS = st.one_of(st.integers(0, 0xEF), st.integers(0xFF, 0xFF))
EXT = st.tuples(st.integers(0xF0, 0xFE), st.binary(max_size=40))
ENTRIES = st.lists(st.one_of(TAGS.map(lambda t: (t, None)), EXT), max_size=6)
KEYS = st.text(max_size=30)


def _ours(entries):
    return tuple(m.LayoutEntry(t, meta) for t, meta in entries)


def _theirs(entries):
    return [w.LayoutEntry(t, meta) for t, meta in entries]


@settings(max_examples=200, deadline=None)
@given(version=U32, size=U32, caps=U64, entries=ENTRIES, devices=st.lists(U8, max_size=5),
       classes=st.lists(U8, max_size=4), server=st.booleans())
def test_hello_bytes_match_the_peer(version, size, caps, entries, devices, classes, server):
    ours = m.encode_hello(m.Hello(version, size, caps, _ours(entries), tuple(devices), tuple(classes)), server=server)
    theirs = w.encode_hello(protocol_version=version, max_message_size=size, capability_flags=caps,
                            layouts=_theirs(entries), devices=devices, memory_classes=classes)
    assert ours == theirs
    back = m.decode_hello(ours, 0, server=server)
    assert (back.protocol_version, back.max_message_size, back.capability_flags) == (version, size, caps)
    assert back.layouts == _ours(entries) and back.devices == tuple(devices) and back.memory_classes == tuple(classes)


def test_hello_without_memory_classes_reads_as_standard_only():
    raw = w.encode_hello(omit_memory_classes=True)
    hello = m.decode_hello(raw, 0, server=False)
    assert hello.memory_classes == () and hello.accepted_memory_classes == (0,)


@settings(max_examples=200, deadline=None)
@given(key=KEYS, entries=ENTRIES, device=U8, alignment=U32, flags=U32)
def test_request_bytes_match_the_peer(key, entries, device, alignment, flags):
    ours = m.encode_request(m.Request(key, _ours(entries), device, alignment, flags))
    theirs = w.encode_tensor_request(key, _theirs(entries), device, alignment, flags)
    assert ours == theirs
    assert m.decode_request(ours, 0) == m.Request(key, _ours(entries), device, alignment, flags)


@settings(max_examples=100, deadline=None)
@given(key=KEYS, descriptor=st.binary(max_size=64), total=U64)
def test_put_bytes_match_the_peer(key, descriptor, total):
    ours = m.encode_put(key, descriptor, total)
    assert ours == w.encode_tensor_put(key, descriptor, total)
    put = m.decode_put(ours, 0)
    assert (put.key, put.descriptor, put.total_data_bytes) == (key, descriptor, total)
    assert ours[put.descriptor_at - m.HEADER_SIZE:][: len(descriptor)] == descriptor


@settings(max_examples=100, deadline=None)
@given(code=U32, text=st.text(max_size=50))
def test_error_bytes_match_the_peer(code, text):
    ours = m.encode_error(code, text)
    assert ours == w.encode_error(code, text)
    assert m.decode_error(ours, 0) == (code, text)


def test_rdma_register_decodes():
    assert m.decode_rdma_register(w.encode_rdma_register(7, 48, b"key"), 0) == {"remote_addr": 7, "length": 48,
                                                                                 "rkey": b"key"}


@pytest.mark.parametrize("table, payload", [
    (S.TENSOR_REQUEST, w.encode_tensor_request("k")[:-1]),
    (S.TENSOR_REQUEST, w.encode_tensor_request("k") + b"\x00"),
    (S.TENSOR_PUT, w.encode_tensor_put("k", b"d", 1)[:-3]),
    (S.CLIENT_HELLO, w.encode_hello()[:7]),
])
def test_cut_or_long_payloads_are_the_length_rule(table, payload):
    decode = {S.TENSOR_REQUEST: lambda p: m.decode_request(p, 100), S.TENSOR_PUT: lambda p: m.decode_put(p, 100),
              S.CLIENT_HELLO: lambda p: m.decode_hello(p, 100, server=False)}[table]
    with pytest.raises(SpecViolation) as info:
        decode(payload)
    assert info.value.rule_id == "session.payload.length" and info.value.offset == 108


def test_frame_and_header_helpers_match_the_peer():
    assert m.message(5, 9, b"abc") == w.encode_message(5, 9, b"abc")
    assert m.data_header(9, 16, 3) + b"abc" == w.encode_message(w.TENSOR_DATA, 9, w.encode_tensor_data(16, b"abc"))
    assert m.transport_fields(48, 1, 3) == w.encode_descriptor_message(b"", 48, 1, 3)
