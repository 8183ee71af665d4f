"""Self-tests of the independent spec peers in tests/support/peers/.

The peers must be right before they can judge the project's server: their descriptor bytes
are checked against the spec's worked example and against the reference implementation
(pyhurray), their message codecs round-trip, and SpecClient and SpecServer hold a normal
session with each other and each catch the other's deliberate protocol breaches.
"""

from __future__ import annotations

import ast
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import hurray
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.peers import spec_server as ss
from support.peers import spec_wire as w
from support.peers.spec_client import PeerError, PeerViolation, SpecClient, place_boxes

PEERS = Path(__file__).parent / "support" / "peers"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WHOLE_BYTE = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
              "uint32", "int64", "uint64", "float8_e4m3", "float8_e5m2", "float128"]
ALL_TYPES = WHOLE_BYTE + ["bool", "int4", "uint4", "int2", "uint2", "float4_e2m1", "float6_e2m3", "float6_e3m2"]
shapes = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple)


# ---------------------------------------------------------------------------------------
# Independence
# ---------------------------------------------------------------------------------------

def test_peers_never_import_the_project():
    for path in PEERS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.split(".")[0] in ("hurray_schema", "hurray") for n in names), (path, names)


def test_importing_the_peers_loads_no_project_module():
    code = ("import sys; sys.path.insert(0, 'tests'); "
            "import support.peers.spec_wire, support.peers.spec_client, support.peers.spec_server, "
            "support.peers.spec_session; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hurray_schema', 'hurray')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------
# Descriptors
# ---------------------------------------------------------------------------------------

def test_worked_example_of_metadata_md():
    # metadata.md § Worked Example: float32 [3, 4], row-major, one 192-byte buffer, 61 bytes.
    expected = bytes.fromhex(
        "48525259" "01" "00" "3d000000" "00000000" "03" "01" "02000000"
        "0300000000000000" "0400000000000000" "0000000000000000"
        "01" "c000000000000000" "40000000" "00" "000000")
    built = w.dense_descriptor("float32", (3, 4), byte_size=192)
    assert built == expected
    parsed = w.parse_descriptor(built)
    assert (parsed.descriptor_length, parsed.shape, parsed.buffer_sizes) == (61, (3, 4), [192])


@SETTINGS
@given(st.sampled_from(ALL_TYPES), shapes, st.sampled_from([0, 1, 3, 8]),
       st.sampled_from([64, 128, 4096]), st.booleans())
def test_dense_builder_reader_round_trip(name, shape, device, alignment, sharded):
    shard = None
    if sharded and shape:
        shard = (tuple(s + 2 for s in shape), tuple(1 for _ in shape))
    data = w.dense_descriptor(name, shape, device_tag=device, alignment=alignment, shard=shard)
    p = w.parse_descriptor(data)
    assert p.descriptor_length == len(data) == p.parsed_length
    assert p.type_tag == w.ELEMENT_TYPES[name][0]
    assert (p.layout_tag, p.rank, p.shape) == (w.LAYOUT_ROW_MAJOR, len(shape), shape)
    assert p.buffer_sizes == [w.element_bytes(name, int(np.prod(shape, dtype=np.int64)))]
    assert p.device_tags == [device] and p.buffers[0].alignment == alignment
    assert p.flags == (w.FLAG_HAS_SHARD if shard else 0)
    assert (p.shard is None) == (shard is None)
    if shard:
        assert (p.shard.parent_shape, p.shard.shard_offset) == shard
    # descriptor_length sits at bytes 6-9 (metadata.md § Fixed Header)
    assert w.descriptor_length_of(data) == len(data)


@SETTINGS
@given(st.sampled_from(ALL_TYPES), shapes, st.sampled_from(["cpu", "cuda", "metal"]))
def test_dense_descriptor_bytes_equal_pyhurray(name, shape, device):
    n = w.element_bytes(name, int(np.prod(shape, dtype=np.int64)))
    tensor = hurray.Tensor(bytes(n), getattr(hurray.dtype, name), list(shape),
                           device=getattr(hurray.device, device))
    reference = tensor.descriptor.encode()
    alignment = tensor.descriptor.buffer_handles[0].alignment  # pyhurray writes 1 for an empty buffer
    device_tag = {"cpu": w.DEVICE_CPU, "cuda": w.DEVICE_CUDA, "metal": w.DEVICE_METAL}[device]
    ours = w.dense_descriptor(name, shape, alignment=alignment, device_tag=device_tag)
    assert ours == reference
    decoded = hurray.Descriptor.decode(ours)
    assert decoded.dtype.tag == w.ELEMENT_TYPES[name][0]
    assert decoded.shape == shape
    assert [h.byte_size for h in decoded.buffer_handles] == [n]


def test_empty_tensor_descriptor():
    data = w.dense_descriptor("float32", (0, 5))
    p = w.parse_descriptor(data)
    assert p.shape == (0, 5) and p.buffer_sizes == [0] and p.element_count == 0
    decoded = hurray.Descriptor.decode(data)
    assert decoded.shape == (0, 5) and decoded.size == 0


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), st.integers(1, 4),
       st.sampled_from(["float32", "int8", "float16"]))
def test_partition_descriptors_equal_pyhurray(shape, pieces, name):
    pieces = min(pieces, shape[0])
    boxes = w.dim0_boxes(shape, pieces)
    built = w.partition_descriptors(name, shape, boxes)
    dtype = getattr(hurray.dtype, name)
    members = [hurray.Tensor(bytes(w.element_bytes(name, int(np.prod(s)))), dtype, list(s),
                             shard=hurray.Shard(list(shape), list(o))) for o, s in boxes]
    composite = hurray.Composite("partition", shape=list(shape), dtype=dtype, members=members)
    assert built[0] == composite.descriptor.encode()
    assert built[1:] == [m.descriptor.encode() for m in members]
    head = w.parse_descriptor(built[0])
    assert head.is_composite_head and head.member_count == pieces and head.buffers == []
    assert head.composite == w.CompositeHead(w.RULE_PARTITION, w.COMBINE_NONE, 0, pieces)
    decoded = hurray.Descriptor.decode(built[0])
    assert decoded.layout.composition_rule == "partition" and decoded.layout.member_count == pieces
    for data, (offset, box) in zip(built[1:], boxes):
        p = w.parse_descriptor(data)
        assert p.shard == (shape, offset) and p.shape == box
        ref = hurray.Descriptor.decode(data).shard
        assert (ref.parent_shape, ref.shard_offset) == (shape, offset)
    assert w.cover_verdict(shape, boxes) == "ok"


def test_group_head_equals_pyhurray():
    members = [hurray.Tensor(bytes(16), hurray.float32, [4]), hurray.Tensor(bytes(3), hurray.int8, [3])]
    composite = hurray.Composite("group", shape=[4], dtype=hurray.float32, members=members)
    head = w.group_head("float32", (4,), 2)
    assert head == composite.descriptor.encode()
    assert w.parse_descriptor(head).composite.composition_rule == w.RULE_GROUP


def test_composite_head_table_of_composite_md():
    # layouts/composite.md § Head Layout-Specific Fields: rule u8, combine_op u8, reserved u8[2],
    # member_count u32, right after byte_offset.
    head = w.composite_head("float16", (2, 3), w.RULE_OVERLAY, 5, combine_op=w.COMBINE_ADD)
    after_offset = 20 + 8 * 2 + 8
    assert head[after_offset:after_offset + 8] == bytes([2, 2, 0, 0, 5, 0, 0, 0])
    assert head[after_offset + 8] == 0  # buffer_count
    assert len(head) == after_offset + 9


def test_overlay_member_section_and_flags():
    data = w.dense_descriptor("float32", (2, 2), shard=((4, 4), (0, 0)), member_role=w.ROLE_BASE)
    p = w.parse_descriptor(data)
    assert p.flags == w.FLAG_HAS_SHARD | w.FLAG_HAS_COMPOSITE_MEMBER
    assert p.member_role == w.ROLE_BASE and p.member_reserved == bytes(15)
    assert data[-16:] == bytes([1]) + bytes(15)


@pytest.mark.parametrize("broken, fragment", [
    (lambda: w.build_descriptor("float32", (2,), buffers=[w.BufferSpec(8)], magic=b"HRRX"), "magic"),
    (lambda: w.build_descriptor("float32", (2,), buffers=[w.BufferSpec(8)], extra_flags=1 << 7), "reserved"),
    (lambda: w.build_descriptor("float32", (2,), buffers=[w.BufferSpec(8)], descriptor_length=19), "< 20"),
    (lambda: w.build_descriptor("float32", (2,), buffers=[w.BufferSpec(8, reserved=1)]), "reserved byte"),
    (lambda: w.composite_head("float32", (2,), w.RULE_GROUP, 1, buffers=[w.BufferSpec(8)]), "composite head"),
    (lambda: w.build_descriptor("float32", (2,), buffers=[w.BufferSpec(8)])
     + b"\0", None),  # a trailing byte past descriptor_length is not part of it
])
def test_strict_reader_rejects(broken, fragment):
    data = broken()
    if fragment is None:
        assert w.parse_descriptor(data).descriptor_length == len(data) - 1
        return
    with pytest.raises(w.WireFormatError, match=fragment):
        w.parse_descriptor(data)


def test_sections_must_end_at_descriptor_length():
    data = bytearray(w.dense_descriptor("float32", (2,)))
    data[6:10] = struct.pack("<I", len(data) + 4)
    data += bytes(4)
    with pytest.raises(w.WireFormatError, match="sections end"):
        w.parse_descriptor(bytes(data))
    assert w.parse_descriptor(bytes(data), strict=False).shape == (2,)


# ---------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------

layout_entries = st.lists(st.one_of(
    st.integers(0x01, 0x0B),
    st.tuples(st.integers(0xF0, 0xFE), st.binary(max_size=12)),
), max_size=5)


def _normal(entries):
    return [w.LayoutEntry(e) if isinstance(e, int) else w.LayoutEntry(*e) for e in entries]


def test_header_layout():
    assert w.encode_header(w.TENSOR_DATA, 7, 300) == bytes.fromhex("05000000" "07000000" "2c010000")
    assert w.decode_header(w.encode_header(0xFF, 0, w.U32_MAX)) == (0xFF, 0, w.U32_MAX)
    assert w.encode_message(w.PING, 3, b"ab") == w.encode_header(w.PING, 3, 2) + b"ab"


@SETTINGS
@given(layout_entries)
def test_layout_list_round_trip_and_skipping(entries):
    data = w.encode_layouts(entries) + b"tail"
    decoded, end = w.decode_layouts(data)
    assert decoded == _normal(entries) and data[end:] == b"tail"
    kept, end2 = w.decode_layouts(data, understands=lambda tag, meta: False)
    assert kept == [e for e in _normal(entries) if not w.is_extension_layout(e.tag)] and end2 == end


def test_layout_entry_bytes():
    # interchange.md § Layout Entry Encoding: 0x01 alone; 0xF3 + u16 length + metadata.
    assert w.encode_layouts([0x01, (0xF3, b"\xaa\xbb")]) == bytes([2, 0, 0x01, 0xF3, 2, 0, 0xAA, 0xBB])


@SETTINGS
@given(st.integers(0, w.U32_MAX), st.integers(0, w.U32_MAX), st.integers(0, w.U64_MAX), layout_entries,
       st.lists(st.integers(0, 255), max_size=4), st.lists(st.integers(0, 255), max_size=4), st.booleans())
def test_hello_round_trip(version, max_size, caps, layouts, devices, classes, omit):
    data = w.encode_hello(protocol_version=version, max_message_size=max_size, capability_flags=caps,
                          layouts=layouts, devices=devices, memory_classes=classes, omit_memory_classes=omit)
    h = w.decode_hello(data)
    assert (h["protocol_version"], h["max_message_size"], h["capability_flags"]) == (version, max_size, caps)
    assert h["layouts"] == _normal(layouts) and h["devices"] == devices
    assert h["memory_classes"] == ((classes or [w.MEM_STANDARD]) if not omit else [w.MEM_STANDARD])
    assert h["memory_classes_present"] == (not omit)
    with pytest.raises(w.WireFormatError):
        w.decode_hello(data + b"\0")


def test_hello_byte_layout():
    data = w.encode_hello(protocol_version=1, max_message_size=0x1000, capability_flags=3, layouts=[1],
                          devices=[0], memory_classes=[0, 2])
    assert data == (struct.pack("<IIQ", 1, 0x1000, 3) + bytes([1, 0, 1]) + bytes([1, 0, 0])
                    + bytes([2, 0, 0, 2]))


@SETTINGS
@given(st.text(max_size=20), layout_entries, st.integers(0, 255), st.integers(0, w.U32_MAX),
       st.integers(0, w.U32_MAX))
def test_request_round_trip(key, layouts, device, alignment, flags):
    data = w.encode_tensor_request(key, layouts, device, alignment, flags)
    assert w.decode_tensor_request(data) == {"key": key, "layouts": _normal(layouts), "preferred_device": device,
                                             "min_alignment": alignment, "request_flags": flags}
    raw = key.encode()
    assert data[:4 + len(raw)] == struct.pack("<I", len(raw)) + raw


def test_request_with_bad_utf8_is_refused():
    with pytest.raises(w.WireFormatError, match="UTF-8"):
        w.decode_tensor_request(w.encode_tensor_request(b"\xff\xfe"))


@SETTINGS
@given(st.text(max_size=10), st.binary(max_size=40), st.integers(0, w.U64_MAX), st.integers(0, 5),
       st.integers(1, 6), st.integers(0, w.U64_MAX), st.binary(max_size=30))
def test_data_plane_round_trips(key, blob, total, index, shards, offset, data):
    assert w.decode_tensor_put(w.encode_tensor_put(key, blob, total)) == {
        "key": key, "descriptor": blob, "total_data_bytes": total}
    descriptor = w.dense_descriptor("int8", (len(blob),))
    assert w.decode_descriptor_message(w.encode_descriptor_message(descriptor, total, index, shards)) == {
        "descriptor": descriptor, "total_data_bytes": total, "shard_index": index, "total_shards": shards}
    assert w.decode_tensor_data(w.encode_tensor_data(offset, data)) == (offset, data)
    assert w.decode_error(w.encode_error(index, key)) == (index, key)
    assert w.decode_rdma_register(w.encode_rdma_register(offset, total, blob)) == {
        "remote_addr": offset, "length": total, "rkey": blob}


def test_descriptor_message_needs_exactly_16_transport_bytes():
    descriptor = w.dense_descriptor("int8", (3,))
    payload = w.encode_descriptor_message(descriptor, 3)
    assert len(payload) == len(descriptor) + 16
    for bad in (payload[:-1], payload + b"\0"):
        with pytest.raises(w.WireFormatError):
            w.decode_descriptor_message(bad)


def test_flag_masks():
    assert w.CAP_RESERVED_MASK == 0xFFFFFFFFFFFFFFF0 and w.REQ_RESERVED_MASK == 0xFFFFFFFC
    assert w.FLAG_RESERVED_MASK == 0xFFFFFFE0
    assert w.is_power_of_two(64) and not w.is_power_of_two(0) and not w.is_power_of_two(48)


# ---------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------

@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), st.data())
def test_place_and_extract_boxes_agree_with_numpy(shape, data):
    arr = np.arange(int(np.prod(shape)), dtype=np.int16).reshape(shape)
    offset = tuple(data.draw(st.integers(0, s - 1)) for s in shape)
    box = tuple(data.draw(st.integers(0, s - o)) for s, o in zip(shape, offset))
    region = arr[tuple(slice(o, o + b) for o, b in zip(offset, box))]
    extracted = ss.extract_box(shape, 2, arr.tobytes(), offset, box)
    assert extracted == region.tobytes()
    placed = np.frombuffer(place_boxes(shape, 2, [(offset, box, extracted)]), np.int16).reshape(shape)
    expected = np.zeros_like(arr)
    expected[tuple(slice(o, o + b) for o, b in zip(offset, box))] = region
    assert np.array_equal(placed, expected)


def test_cover_verdicts():
    assert w.cover_verdict((4, 2), [((0, 0), (2, 2)), ((2, 0), (2, 2))]) == "ok"
    assert w.cover_verdict((4, 2), [((0, 0), (3, 2)), ((2, 0), (2, 2))]) == "overlap"
    assert w.cover_verdict((4, 2), [((0, 0), (1, 2)), ((2, 0), (2, 2))]) == "gap"
    assert w.cover_verdict((4, 2), [((0, 0), (5, 2))]) == "out_of_bounds"


# ---------------------------------------------------------------------------------------
# SpecClient against SpecServer
# ---------------------------------------------------------------------------------------

ARR = np.arange(24, dtype=np.float32).reshape(6, 4) * 0.5


def _store():
    grp = [(w.dense_descriptor("int8", (3,)), b"\x01\x02\x03"),
           ss.partition_messages(1, "float32", ARR.shape, ARR.tobytes(), w.dim0_boxes(ARR.shape, 2))]

    return {
        "w": (w.dense_descriptor("float32", ARR.shape), ARR.tobytes()),
        "empty": (w.dense_descriptor("float32", (0, 4)), b""),
        "p": lambda sid, req: ss.partition_messages(sid, "float32", ARR.shape, ARR.tobytes(),
                                                    w.dim0_boxes(ARR.shape, 3), frame_bytes=20),
        "g": lambda sid, req: ss.composite_messages(sid, w.group_head("float32", (3,), 2),
                                                    [grp[0], ss.partition_messages(
                                                        sid, "float32", ARR.shape, ARR.tobytes(),
                                                        w.dim0_boxes(ARR.shape, 2))]),
        "sharded": lambda sid, req: ss.shard_descriptor_messages(
            [sid, sid + 100, sid + 200], "float32", ARR.shape, ARR.tobytes(), w.split_rows(6, 3), frame_bytes=16),
    }


@pytest.fixture
def store_server():
    with ss.SpecServer(ss.StoreScript(_store(), frame_bytes=24)) as server:
        yield server
    assert not server.errors


def test_normal_session(store_server):
    with SpecClient(store_server.address) as c:
        hello = c.hello(capability_flags=w.CAP_PARALLEL_STREAMS, layouts=[1, (0xF5, b"panel")])
        assert hello["protocol_version"] == 1
        assert hello["capability_flags"] == w.CAP_TRANSCODING | w.CAP_PARALLEL_STREAMS
        got = c.get("w", stream_id=5)
        assert len(got) == 1
        t = got[0]
        assert t.stream_id == 5 and t.shape == (6, 4) and t.total_data_bytes == 96
        assert (t.shard_index, t.total_shards) == (0, 1)
        assert t.frames == [(0, 24), (24, 24), (48, 24), (72, 24)]
        assert np.array_equal(np.frombuffer(t.data, np.float32).reshape(t.shape), ARR)

        empty, = c.get("empty", stream_id=6)
        assert empty.frames == [] and empty.data == b"" and empty.shape == (0, 4)

        ping = c.ping(b"hi", stream_id=9)
        assert (ping.type, ping.stream_id, ping.payload) == (w.PONG, 9, b"hi")

        with pytest.raises(PeerError) as info:
            c.get("nope", stream_id=7)
        assert info.value.code == w.ERR_UNKNOWN_TENSOR and info.value.stream_id == 7
        assert c.get("nope", stream_id=8, raise_errors=False).name == "UNKNOWN_TENSOR"

    (_, _, _, payload), = store_server.messages(w.CLIENT_HELLO)
    sent = w.decode_hello(payload)
    assert sent["capability_flags"] == w.CAP_PARALLEL_STREAMS
    assert sent["layouts"] == [w.LayoutEntry(1), w.LayoutEntry(0xF5, b"panel")]
    assert [m[1] for m in store_server.messages()] == [w.CLIENT_HELLO, w.TENSOR_REQUEST, w.TENSOR_REQUEST,
                                                       w.PING, w.TENSOR_REQUEST, w.TENSOR_REQUEST]


def test_partition_response(store_server):
    with SpecClient(store_server.address) as c:
        c.hello()
        items = c.get("p", stream_id=3)
    head, *members = items
    assert head.is_composite_head and head.parsed.member_count == 3 and head.data == b"" and head.frames == []
    assert [m.depth for m in members] == [1, 1, 1]
    pieces = [(m.parsed.shard.shard_offset, m.shape, m.data) for m in members]
    assert all(m.parsed.shard.parent_shape == ARR.shape for m in members)
    assert np.array_equal(np.frombuffer(place_boxes(ARR.shape, 4, pieces), np.float32).reshape(ARR.shape), ARR)


def test_nested_composite_response(store_server):
    with SpecClient(store_server.address) as c:
        c.hello()
        items = c.get("g")
        assert c.ping().type == w.PONG  # the response was read exactly: nothing is left over
    assert [i.depth for i in items] == [0, 1, 1, 2, 2]
    assert items[1].data == b"\x01\x02\x03"
    assert items[2].parsed.member_count == 2


def test_parallel_shards_are_demultiplexed(store_server):
    with SpecClient(store_server.address) as c:
        c.hello()
        shards = c.get("sharded", stream_id=2, flags=w.REQ_PARALLEL_OK)
    assert [s.shard_index for s in shards] == [0, 1, 2]
    assert [s.stream_id for s in shards] == [2, 102, 202]
    pieces = [(s.parsed.shard.shard_offset, s.shape, s.data) for s in shards]
    assert np.array_equal(np.frombuffer(place_boxes(ARR.shape, 4, pieces), np.float32).reshape(ARR.shape), ARR)


def test_put_then_get(store_server):
    data = np.linspace(-1, 1, 10, dtype=np.float32)
    descriptor = w.dense_descriptor("float32", (10,))
    with SpecClient(store_server.address) as c:
        c.hello()
        reply = c.put("new", descriptor, data.tobytes(), stream_id=4, frame_bytes=12)
        assert (reply.type, reply.stream_id, reply.payload, reply.error) == (w.TENSOR_PUT_ACK, 4, b"", None)
        got, = c.get("new", stream_id=11)
    assert got.descriptor == descriptor and got.data == data.tobytes()
    frames = [w.decode_tensor_data(p)[0] for _, t, _, p in store_server.messages(w.TENSOR_DATA)]
    assert frames == [0, 12, 24, 36]


def test_unix_socket_session():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.sock")
        with ss.SpecServer(ss.StoreScript(_store()), unix_path=path) as server:
            assert server.address == path and server.port is None
            with SpecClient(path) as c:
                assert not c.cross_machine
                assert c.hello()["protocol_version"] == 1
                t, = c.get("w")
                assert t.data == ARR.tobytes()
        assert not os.path.exists(path)


def test_client_refuses_frames_over_its_max_message_size():
    with ss.SpecServer(ss.StoreScript(_store(), frame_bytes=96)) as server:
        with SpecClient(server.address, max_message_size=80) as c:
            c.hello()
            with pytest.raises(PeerViolation) as info:
                c.get("w")  # a 77-byte TENSOR_DESCRIPTOR, then one frame of 8 + 96 bytes
            assert info.value.kind == "too_large"
        assert w.decode_hello(server.messages(w.CLIENT_HELLO)[0][3])["max_message_size"] == 80


# -- the client catches a hostile server ----------------------------------------------------

DESC = w.dense_descriptor("float32", ARR.shape)
DATA = ARR.tobytes()
HEAD = w.partition_head("float32", ARR.shape, 3)
MEMBERS = [(d, ss.extract_box(ARR.shape, 4, DATA, o, s))
           for d, (o, s) in zip(w.partition_descriptors("float32", ARR.shape, w.dim0_boxes(ARR.shape, 3))[1:],
                                w.dim0_boxes(ARR.shape, 3))]


def _one_shot(items_for):
    def script(message_type, stream_id, payload, conn):
        conn.play(items_for(stream_id))
    return script


@pytest.mark.parametrize("items_for, kind", [
    (lambda sid: ss.torn_composite(sid, HEAD, MEMBERS, 2), "torn"),
    (lambda sid: ss.torn_composite(sid, HEAD, MEMBERS, 0), "torn"),
    (lambda sid: ss.frame_gap(sid, DESC, DATA, 16), "gap"),
    (lambda sid: ss.frame_overlap(sid, DESC, DATA, 16), "overlap"),
    (lambda sid: ss.oversized_header(sid), "too_large"),
    (lambda sid: ss.unknown_message(sid, 0x0E), "unexpected_message"),
    (lambda sid: ss.unknown_message(sid, 0xF0), "unexpected_message"),
    (lambda sid: ss.data_before_descriptor(sid, DESC, DATA), "data_before_descriptor"),
    (lambda sid: ss.wrong_total(sid, DESC, DATA, +1), "total_mismatch"),
    (lambda sid: ss.wrong_total(sid, DESC, DATA, -1), "total_mismatch"),
    (lambda sid: ss.overlapping_shards([sid, sid + 1], "float32", ARR.shape, DATA), "shard_overlap"),
    (lambda sid: ss.gapped_shards([sid, sid + 1], "float32", ARR.shape, DATA), "shard_gap"),
    (lambda sid: ss.tensor_messages(sid + 1, DESC, DATA), "stream_id"),
    (lambda sid: [ss.CLOSE], "closed"),
    (lambda sid: ss.tensor_messages(sid, w.dense_descriptor("float32", (2,))[:-1] + b"\x07", bytes(8)),
     "malformed"),
    (lambda sid: ss.tensor_messages(sid, w.dense_descriptor("float32", (2,), sync_mode=w.SYNC_EVENT), bytes(8)),
     "sync_mode"),
])
def test_client_catches_broken_responses(items_for, kind):
    with ss.SpecServer(_one_shot(items_for)) as server:
        with SpecClient(server.address) as c:
            c.hello()
            with pytest.raises(PeerViolation) as info:
                c.get("x", stream_id=1)
            assert info.value.kind == kind, info.value
    assert not server.errors


@pytest.mark.parametrize("code", list(range(1, 9)) + [0xF0])
def test_client_reports_each_error_code(code):
    with ss.SpecServer(_one_shot(lambda sid: ss.error_reply(sid, code, "nope"))) as server:
        with SpecClient(server.address) as c:
            c.hello()
            with pytest.raises(PeerError) as info:
                c.get("x", stream_id=3)
    assert (info.value.code, info.value.message, info.value.stream_id) == (code, "nope", 3)


def test_error_inside_a_composite_ends_the_response():
    def items(sid):  # the head, one member, then an ERROR instead of the second member
        return ss.composite_messages(sid, HEAD, MEMBERS[:1]) + ss.error_reply(sid, w.ERR_SHARD_MISMATCH)
    with ss.SpecServer(_one_shot(items)) as server:
        with SpecClient(server.address) as c:
            c.hello()
            err = c.get("x", raise_errors=False)
    assert isinstance(err, PeerError) and err.name == "SHARD_MISMATCH"


def test_stalled_server_times_out_the_client():
    def script(message_type, stream_id, payload, conn):
        conn.stall(5)
    with ss.SpecServer(script) as server:
        with SpecClient(server.address, timeout=0.3) as c:
            c.hello()
            with pytest.raises(TimeoutError):
                c.get("x")


def test_hello_answered_with_error():
    reply = ss.error_reply(1, w.ERR_PROTOCOL_VERSION_MISMATCH, "too old")[0]
    with ss.SpecServer(ss.StoreScript(), hello_reply=reply) as server:
        with SpecClient(server.address) as c:
            err = c.hello(protocol_version=0)
    assert isinstance(err, PeerError) and err.code == w.ERR_PROTOCOL_VERSION_MISMATCH
    assert w.decode_hello(server.messages(w.CLIENT_HELLO)[0][3])["protocol_version"] == 0


# -- the server side of the peers ------------------------------------------------------------

def test_server_refuses_a_request_before_hello():
    with ss.SpecServer(ss.StoreScript(_store())) as server:
        with SpecClient(server.address) as c:
            c.request("w", stream_id=2)
            (t, sid, payload), = c.recv_until_closed()
    assert t == w.ERROR and sid == 2 and w.decode_error(payload)[0] == w.ERR_INVALID_MESSAGE


def test_server_refuses_an_oversized_message():
    with ss.SpecServer(ss.StoreScript(_store()), max_message_size=64) as server:
        with SpecClient(server.address) as c:
            assert c.hello()["max_message_size"] == 64
            c.send_raw(w.encode_header(w.TENSOR_REQUEST, 4, 65))
            (t, sid, payload), = c.recv_until_closed()
    assert (t, sid, w.decode_error(payload)[0]) == (w.ERROR, 4, w.ERR_MESSAGE_TOO_LARGE)
    assert server.messages()[-1] == (0, w.TENSOR_REQUEST, 4, None)


def test_server_answers_unknown_messages_and_keeps_other_connections():
    with ss.SpecServer(ss.StoreScript(_store())) as server:
        with SpecClient(server.address) as bad, SpecClient(server.address) as good:
            bad.hello()
            good.hello()
            bad.send(0xFF, 3, b"")
            t, sid, payload = bad.recv()
            assert (t, sid, w.decode_error(payload)[0]) == (w.ERROR, 3, w.ERR_INVALID_MESSAGE)
            assert good.get("w")[0].data == DATA
    assert {m[0] for m in server.received} == {0, 1}


def test_check_shards_requires_shard_sections():
    def items(sid):  # two "shards" of a parallel transfer whose descriptors carry no shard section
        out = []
        for index, stream in enumerate((sid, sid + 1)):
            out += ss.tensor_messages(stream, DESC, DATA, shard_index=index, total_shards=2)
        return out
    with ss.SpecServer(_one_shot(items)) as server:
        with SpecClient(server.address) as c:
            c.hello()
            with pytest.raises(PeerViolation) as info:
                c.get("x")
    assert info.value.kind == "shard_mismatch"


def test_put_stops_at_an_early_error():
    def script(message_type, stream_id, payload, conn):
        if message_type == w.TENSOR_PUT:
            conn.play(ss.error_reply(stream_id, w.ERR_INVALID_MESSAGE, "read-only"))
    with ss.SpecServer(script) as server:
        with SpecClient(server.address) as c:
            c.hello()
            reply = c.put("k", DESC, DATA)
    assert reply.type == w.ERROR and reply.error.code == w.ERR_INVALID_MESSAGE
