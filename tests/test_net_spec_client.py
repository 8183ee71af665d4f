"""The project's transport server (hurray_schema.net), judged by the independent SpecClient.

Every exchange goes through tests/support/peers/spec_client.py, which knows the wire only from the
spec's tables; every value is compared with the NumPy arrays saved into the served file,
never with anything the project computes.  Spec sections are cited as ``file.md § Section``.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from support.peers import spec_wire as w
from support.peers.spec_client import (
    PeerClosed,
    PeerError,
    PeerViolation,
    SpecClient,
    place_boxes,
)

import hurray_schema as hs

TIMEOUT = 5.0
RNG = np.random.default_rng(20240611)
W = RNG.standard_normal((5, 7)).astype(np.float32)
I8 = RNG.integers(-128, 128, size=(4, 3), dtype=np.int8)
H = RNG.standard_normal((3, 2, 2)).astype(np.float16)
BIG = RNG.standard_normal((300, 100)).astype(np.float32)  # 120000 bytes
SCALAR = np.array(2.5, dtype=np.float64)
EMPTY = np.zeros((0, 4), dtype=np.float32)
P = RNG.standard_normal((6, 4)).astype(np.float32)
GA = np.arange(3, dtype=np.int8)
GB = RNG.standard_normal((2, 2)).astype(np.float16)
NP_ = RNG.standard_normal((4, 3)).astype(np.float32)
NC = np.arange(5, dtype=np.int32)

DENSE = {"w": W, "i8": I8, "h": H, "big": BIG, "scalar": SCALAR}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("net") / "model.hrry"
    hs.save(str(path), {
        **DENSE, "empty": EMPTY,
        "part": hs.partition(P, grid=(2, 2)),
        "grp": hs.group({"a": GA, "b": GB}),
        "nest": hs.group({"np": hs.partition(NP_, grid=2), "nc": NC}),
    })
    return str(path)


@pytest.fixture(scope="module")
def server(model):
    with hs.serve([model], host="127.0.0.1", port=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_server(model):
    with hs.serve([model], host="127.0.0.1", port=0, max_message_bytes=1024) as srv:
        yield srv


@pytest.fixture(scope="module")
def writable_server(model, tmp_path_factory):
    with hs.serve([model], host="127.0.0.1", port=0, writable=str(tmp_path_factory.mktemp("put"))) as srv:
        yield srv


def connect(srv, **kw) -> SpecClient:
    return SpecClient((srv.host, srv.port), timeout=TIMEOUT, **kw)


def session(srv, **hello):
    c = connect(srv)
    reply = c.hello(**hello)
    assert isinstance(reply, dict), reply
    return c


def check_dense(t, arr, stream_id=1):
    """A whole dense tensor as interchange.md § TENSOR_DESCRIPTOR Payload and metadata.md
    describe it, compared with the array that was saved."""
    p = t.parsed
    assert t.stream_id == stream_id
    assert (t.shard_index, t.total_shards) == (0, 1)
    assert p.type_tag == w.type_tag(arr.dtype.name)
    assert p.layout_tag == w.LAYOUT_ROW_MAJOR
    assert p.shape == arr.shape and p.rank == arr.ndim
    assert p.byte_offset == 0
    assert p.buffer_sizes == [arr.nbytes]
    assert t.total_data_bytes == sum(p.buffer_sizes)
    assert p.device_tags == [w.DEVICE_CPU]
    assert [b.memory_class for b in p.buffers] == [w.MEM_STANDARD]  # all this client advertised
    assert all(w.is_power_of_two(b.alignment) for b in p.buffers)
    assert t.data == arr.tobytes()
    if arr.nbytes:
        assert t.frames and t.frames[0][0] == 0
    else:
        assert t.frames == []


def pong_or_closed(c: SpecClient, stream_id: int) -> bool:
    """After an ERROR the connection may stay open (interchange.md § ERROR Payload).  If it
    did, a PING must get a well-framed PONG; returns whether it stayed open."""
    try:
        c.send(w.PING, stream_id, b"")
        reply = c.recv(eof_ok=True)
    except (PeerClosed, BrokenPipeError, ConnectionResetError):
        return False
    if reply is None:
        return False
    assert (reply[0], reply[1]) == (w.PONG, stream_id), reply
    return True


# ---------------------------------------------------------------------------------------
# Session establishment (interchange.md § Session Establishment)
# ---------------------------------------------------------------------------------------

def test_url(server):
    assert server.url == f"hurray://127.0.0.1:{server.port}"
    assert server.host == "127.0.0.1" and server.port > 0


def test_server_hello(server):
    with connect(server) as c:
        hello = c.hello()
    assert hello["protocol_version"] == w.PROTOCOL_VERSION
    caps = hello["capability_flags"]
    assert caps & w.CAP_TRANSCODING and caps & w.CAP_PARALLEL_STREAMS
    assert caps & w.CAP_RESERVED_MASK == 0
    assert not caps & w.CAP_RDMA_GPUDIRECT or caps & w.CAP_RDMA_DATA_PLANE  # bit 3 implies bit 2
    assert hello["max_message_size"] > 0
    assert w.DEVICE_CPU in hello["devices"]
    assert w.MEM_STANDARD in hello["memory_classes"]


def test_server_version_is_at_most_the_clients(server):
    with connect(server) as c:
        hello = c.hello(protocol_version=2)
    assert isinstance(hello, dict) and 1 <= hello["protocol_version"] <= 2


def test_hello_with_extension_layout_entries_is_accepted(server):
    # interchange.md § Layout Entry Encoding: unrecognised extension entries are skipped, not rejected.
    with connect(server) as c:
        hello = c.hello(layouts=[(0xF7, b"\x01\x02\x03"), (0xFE, b""), w.LAYOUT_ROW_MAJOR])
        assert isinstance(hello, dict)
        check_dense(c.get("w")[0], W)


def test_hello_without_memory_classes_is_accepted(server):
    with connect(server) as c:
        assert isinstance(c.hello(omit_memory_classes=True), dict)
        check_dense(c.get("i8")[0], I8)


def test_protocol_version_zero_is_refused_and_closed(server):
    with connect(server) as c:
        err = c.hello(protocol_version=0)
        assert isinstance(err, PeerError) and err.code == w.ERR_PROTOCOL_VERSION_MISMATCH
        assert c.recv_until_closed() == []


@pytest.mark.parametrize("caps", [1 << 4, 1 << 63])
def test_reserved_capability_bits_are_refused(server, caps):
    with connect(server) as c:
        err = c.hello(capability_flags=caps)
    assert isinstance(err, PeerError) and err.code == w.ERR_INVALID_MESSAGE


@pytest.mark.parametrize("first", [
    (w.TENSOR_REQUEST, w.encode_tensor_request("w")),
    (w.PING, b""),
    (w.SERVER_HELLO, w.encode_hello()),
])
def test_message_before_client_hello_is_refused_and_closed(server, first):
    with connect(server) as c:
        c.send(first[0], 1, first[1])
        messages = c.recv_until_closed()
    assert [m[0] for m in messages] == [w.ERROR]
    code, _ = w.decode_error(messages[0][2])
    assert code in w.ERROR_CODE_NAMES


# ---------------------------------------------------------------------------------------
# Dense responses (interchange.md § Streaming: Tensor Descriptor and Data Frames)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(DENSE))
def test_dense_tensor(server, key):
    with session(server) as c:
        got = c.get(key, stream_id=7)
        assert len(got) == 1
        check_dense(got[0], DENSE[key], stream_id=7)
        assert c.ping(stream_id=8).type == w.PONG  # nothing was left over after TENSOR_DATA_END


def test_frames_respect_the_clients_max_message_size(server):
    # interchange.md § CLIENT_HELLO Payload: max_message_size is what the client accepts; the
    # client raises PeerViolation("too_large") on any bigger message.
    with connect(server, max_message_size=4096) as c:
        assert isinstance(c.hello(), dict)
        t, = c.get("big")
    check_dense(t, BIG)
    assert len(t.frames) >= len(BIG.tobytes()) // 4096
    assert all(length <= 4096 - 8 for _, length in t.frames)


def test_empty_tensor_has_no_frames(server):
    with session(server) as c:
        t, = c.get("empty", stream_id=3)
    check_dense(t, EMPTY, stream_id=3)
    assert t.total_data_bytes == 0 and t.frames == []


def test_several_requests_on_one_connection(server):
    with session(server) as c:
        for sid, key in enumerate(["w", "h", "i8", "w"], start=11):
            check_dense(c.get(key, stream_id=sid)[0], DENSE[key], stream_id=sid)


def test_large_min_alignment_is_valid(server):
    with session(server) as c:
        check_dense(c.get("w", min_alignment=4096)[0], W)


def test_unrecognised_extension_preference_falls_through(server):
    # interchange.md § Server Layout Selection: the first satisfiable preference wins.
    with session(server) as c:
        check_dense(c.get("w", layouts=[(0xF3, b"\x10\x20"), w.LAYOUT_ROW_MAJOR])[0], W)


def test_preference_without_allow_transcode_gives_the_stored_layout(server):
    with session(server) as c:
        check_dense(c.get("w", layouts=[w.LAYOUT_COLUMN_MAJOR], flags=0)[0], W)


def test_transcode_to_column_major_when_advertised(server):
    with connect(server) as c:
        hello = c.hello()
        t, = c.get("w", layouts=[w.LAYOUT_COLUMN_MAJOR], flags=w.REQ_ALLOW_TRANSCODE)
    advertised = w.LayoutEntry(w.LAYOUT_COLUMN_MAJOR) in hello["layouts"]
    if advertised:  # rule 1b: a TRANSCODING server that can produce the layout selects it
        assert t.parsed.layout_tag == w.LAYOUT_COLUMN_MAJOR
        assert t.parsed.shape == W.shape
        assert t.data == W.tobytes(order="F")
    else:
        check_dense(t, W)


# ---------------------------------------------------------------------------------------
# Composites (interchange.md § Composite Tensor Streaming)
# ---------------------------------------------------------------------------------------

def check_head(t, rule, member_count, stream_id=1):
    p = t.parsed
    assert t.stream_id == stream_id
    assert p.layout_tag == w.LAYOUT_COMPOSITE and p.buffers == [] and p.byte_offset == 0
    assert p.composite.composition_rule == rule and p.composite.member_count == member_count
    assert t.total_data_bytes == 0 and t.frames == [] and t.data == b""
    assert (t.shard_index, t.total_shards) == (0, 1)


def check_member(t, stream_id=1):
    assert t.stream_id == stream_id and (t.shard_index, t.total_shards) == (0, 1)
    assert t.total_data_bytes == sum(t.parsed.buffer_sizes) == len(t.data)


def test_partition(server):
    with session(server) as c:
        head, *members = c.get("part", stream_id=4)
        assert c.ping(stream_id=5).type == w.PONG
    check_head(head, w.RULE_PARTITION, 4, stream_id=4)
    assert head.parsed.shape == P.shape and head.parsed.type_tag == w.type_tag("float32")
    assert len(members) == 4
    pieces = []
    for m in members:
        check_member(m, stream_id=4)
        assert m.parsed.shard.parent_shape == P.shape
        assert not m.parsed.flags & w.FLAG_HAS_COMPOSITE_MEMBER
        pieces.append((m.parsed.shard.shard_offset, m.shape, m.data))
    assert w.cover_verdict(P.shape, [(o, s) for o, s, _ in pieces]) == "ok"
    merged = np.frombuffer(place_boxes(P.shape, 4, pieces), np.float32).reshape(P.shape)
    assert np.array_equal(merged, P)


def test_group(server):
    with session(server) as c:
        head, a, b = c.get("grp", stream_id=2)
    check_head(head, w.RULE_GROUP, 2, stream_id=2)
    for m, arr in ((a, GA), (b, GB)):
        check_member(m, stream_id=2)
        assert m.parsed.type_tag == w.type_tag(arr.dtype.name) and m.shape == arr.shape
        assert m.data == arr.tobytes()


def test_nested_composite(server):
    with session(server) as c:
        items = c.get("nest")
        assert c.ping().type == w.PONG
    assert [i.depth for i in items] == [0, 1, 2, 2, 1]
    check_head(items[0], w.RULE_GROUP, 2)
    check_head(items[1], w.RULE_PARTITION, 2)
    pieces = [(m.parsed.shard.shard_offset, m.shape, m.data) for m in items[2:4]]
    assert np.array_equal(np.frombuffer(place_boxes(NP_.shape, 4, pieces), np.float32).reshape(NP_.shape), NP_)
    assert items[4].data == NC.tobytes() and items[4].shape == NC.shape


# ---------------------------------------------------------------------------------------
# Errors (interchange.md § Error Handling)
# ---------------------------------------------------------------------------------------

def test_unknown_tensor(server):
    with session(server) as c:
        with pytest.raises(PeerError) as info:
            c.get("no such tensor", stream_id=9)
    assert info.value.code == w.ERR_UNKNOWN_TENSOR and info.value.stream_id == 9


def test_unknown_tensor_then_other_streams(server):
    with session(server) as c:
        err = c.get("missing", stream_id=3, raise_errors=False)
        assert isinstance(err, PeerError) and err.code == w.ERR_UNKNOWN_TENSOR
        if pong_or_closed(c, 4):
            check_dense(c.get("w", stream_id=5)[0], W, stream_id=5)


def test_cuda_is_unavailable(server):
    # interchange.md § Server Device Selection, rule 3: no silent fallback.
    with session(server) as c:
        with pytest.raises(PeerError) as info:
            c.get("w", stream_id=6, device=w.DEVICE_CUDA)
    assert info.value.code == w.ERR_DEVICE_UNAVAILABLE and info.value.stream_id == 6


@pytest.mark.parametrize("flags", [1 << 2, 1 << 31, w.REQ_PARALLEL_OK | 1 << 5])
def test_reserved_request_flags(server, flags):
    with session(server) as c:
        with pytest.raises(PeerError) as info:
            c.get("w", stream_id=2, flags=flags)
    assert info.value.code == w.ERR_INVALID_MESSAGE and info.value.stream_id == 2


@pytest.mark.parametrize("alignment", [0, 3, 48, 65, 0x80000001])
def test_min_alignment_not_a_power_of_two(server, alignment):
    with session(server) as c:
        with pytest.raises(PeerError) as info:
            c.get("w", stream_id=2, min_alignment=alignment)
    assert info.value.code == w.ERR_INVALID_MESSAGE and info.value.stream_id == 2


def test_truncated_request_is_invalid(server):
    with session(server) as c:
        c.send(w.TENSOR_REQUEST, 3, w.encode_tensor_request("w")[:-2])
        t, sid, payload = c.recv()
    assert (t, sid, w.decode_error(payload)[0]) == (w.ERROR, 3, w.ERR_INVALID_MESSAGE)


@pytest.mark.parametrize("message_type", [0x0E, 0x0F, 0xF0, 0xFE, 0xFF, 0x1234])
def test_unknown_message_type(server, message_type):
    with session(server) as c:
        c.send(message_type, 3, b"xyz")  # a payload the server must read past to stay framed
        t, sid, payload = c.recv()
        assert (t, sid, w.decode_error(payload)[0]) == (w.ERROR, 3, w.ERR_INVALID_MESSAGE)
        pong_or_closed(c, 4)


def test_oversized_payload_length(small_server):
    with connect(small_server) as c:
        hello = c.hello()
        assert hello["max_message_size"] == 1024
        c.send_raw(w.encode_header(w.TENSOR_REQUEST, 5, 1025))  # no payload follows
        t, sid, payload = c.recv()
    assert (t, sid, w.decode_error(payload)[0]) == (w.ERROR, 5, w.ERR_MESSAGE_TOO_LARGE)


def test_payload_at_the_limit_is_read(small_server):
    key = "k" * (1024 - 15)  # u32 + key + u16 + u8 + u32 + u32 = 1024 bytes
    assert len(w.encode_tensor_request(key)) == 1024
    with connect(small_server) as c:
        c.hello()
        with pytest.raises(PeerError) as info:
            c.get(key, stream_id=6)
    assert info.value.code == w.ERR_UNKNOWN_TENSOR


def test_small_server_still_serves(small_server):
    with connect(small_server) as c:
        c.hello()
        check_dense(c.get("big")[0], BIG)


# ---------------------------------------------------------------------------------------
# PING (interchange.md § Message Types)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [b"", b"keepalive"])
def test_ping(server, payload):
    with session(server) as c:
        reply = c.ping(payload, stream_id=12)
    assert (reply.type, reply.stream_id) == (w.PONG, 12)


# ---------------------------------------------------------------------------------------
# TENSOR_PUT (interchange.md § TENSOR_PUT)
# ---------------------------------------------------------------------------------------

def test_put_on_a_read_only_server(server):
    data = np.ones((2, 3), np.float32)
    with session(server) as c:
        reply = c.put("new", w.dense_descriptor("float32", data.shape), data.tobytes(), stream_id=3)
    assert reply.type == w.ERROR and reply.stream_id == 3


def test_put_then_get(writable_server):
    data = RNG.standard_normal((8, 16)).astype(np.float32)
    descriptor = w.dense_descriptor("float32", data.shape)
    with session(writable_server) as c:
        reply = c.put("pushed", descriptor, data.tobytes(), stream_id=3, frame_bytes=100)
        assert (reply.type, reply.stream_id, reply.payload) == (w.TENSOR_PUT_ACK, 3, b"")
        t, = c.get("pushed", stream_id=4)
    check_dense(t, data, stream_id=4)


def test_put_empty_tensor(writable_server):
    # interchange.md § Ordering Invariant: total_data_bytes = 0 means zero TENSOR_DATA frames.
    descriptor = w.dense_descriptor("float32", (0, 3))
    with session(writable_server) as c:
        reply = c.put("pushed-empty", descriptor, b"", stream_id=5)
        assert reply.type == w.TENSOR_PUT_ACK, reply
        t, = c.get("pushed-empty", stream_id=6)
    check_dense(t, np.zeros((0, 3), np.float32), stream_id=6)


def test_put_with_short_data_is_refused(writable_server):
    # interchange.md § TENSOR_DATA Payload: the frames add up to total_data_bytes.
    data = np.ones(10, np.float32).tobytes()
    with session(writable_server) as c:
        reply = c.put("short", w.dense_descriptor("float32", (10,)), data[:-4], stream_id=7,
                      total_data_bytes=len(data))
    assert reply.type == w.ERROR and reply.stream_id == 7


def test_put_with_a_bad_descriptor_is_refused(writable_server):
    data = np.ones(4, np.float32).tobytes()
    bad = b"HRRX" + w.dense_descriptor("float32", (4,))[4:]
    with session(writable_server) as c:
        reply = c.put("bad", bad, data, stream_id=8)
    assert reply.type == w.ERROR and reply.stream_id == 8


def test_put_with_gapped_frames_is_refused(writable_server):
    data = np.arange(32, dtype=np.float32).tobytes()
    with session(writable_server) as c:
        c.send(w.TENSOR_PUT, 9, w.encode_tensor_put("gap", w.dense_descriptor("float32", (32,)), len(data)))
        c.send(w.TENSOR_DATA, 9, w.encode_tensor_data(0, data[:64]))
        c.send(w.TENSOR_DATA, 9, w.encode_tensor_data(96, data[96:]))
        c.send(w.TENSOR_DATA_END, 9)
        t, sid, _ = c.recv()
    assert (t, sid) == (w.ERROR, 9)


# ---------------------------------------------------------------------------------------
# Parallel transfers (interchange.md § Parallel Transfers)
# ---------------------------------------------------------------------------------------

def test_parallel_ok(server):
    with session(server, capability_flags=w.CAP_PARALLEL_STREAMS) as c:
        items = c.get("big", stream_id=20, flags=w.REQ_PARALLEL_OK)
        assert c.ping(stream_id=21).type == w.PONG
    if len(items) == 1:
        check_dense(items[0], BIG, stream_id=20)
        return
    # the client has checked shard consistency: shared parent shape, type, layout, exact cover
    assert all(t.total_shards == len(items) for t in items)
    assert [t.shard_index for t in items] == list(range(len(items)))
    for t in items:
        assert t.parsed.shard.parent_shape == BIG.shape
        assert t.parsed.type_tag == w.type_tag("float32") and t.parsed.layout_tag == w.LAYOUT_ROW_MAJOR
        assert t.total_data_bytes == sum(t.parsed.buffer_sizes) == len(t.data)
    pieces = [(t.parsed.shard.shard_offset, t.shape, t.data) for t in items]
    merged = np.frombuffer(place_boxes(BIG.shape, 4, pieces), np.float32).reshape(BIG.shape)
    assert np.array_equal(merged, BIG)


def test_no_shards_without_parallel_ok(server):
    with session(server, capability_flags=w.CAP_PARALLEL_STREAMS) as c:
        check_dense(c.get("big", stream_id=22, flags=0)[0], BIG, stream_id=22)


# ---------------------------------------------------------------------------------------
# Robustness: hostile connections do not stop the server
# ---------------------------------------------------------------------------------------

def _hostile_connect_and_close(srv):
    socket.create_connection((srv.host, srv.port), timeout=TIMEOUT).close()


def _hostile_half_header(srv):
    with socket.create_connection((srv.host, srv.port), timeout=TIMEOUT) as s:
        s.sendall(w.encode_header(w.CLIENT_HELLO, 1, 20)[:7])


def _hostile_huge_payload_length(srv):
    with connect(srv) as c:
        c.send_raw(w.encode_header(w.CLIENT_HELLO, 1, w.U32_MAX) + b"\0" * 32)
        try:
            c.recv_until_closed()
        except (PeerViolation, TimeoutError):
            pass


def _hostile_garbage(srv):
    with connect(srv) as c:
        c.send_raw(bytes(range(256)) * 4)


def _hostile_torn_put(srv):
    with session(srv) as c:
        c.send(w.TENSOR_PUT, 1, w.encode_tensor_put("x", w.dense_descriptor("float32", (100,)), 400))
        c.send(w.TENSOR_DATA, 1, w.encode_tensor_data(0, bytes(40)))


@pytest.mark.parametrize("hostile", [_hostile_connect_and_close, _hostile_half_header,
                                     _hostile_huge_payload_length, _hostile_garbage, _hostile_torn_put])
def test_server_survives_hostile_connections(server, hostile):
    hostile(server)
    with session(server) as c:
        check_dense(c.get("w")[0], W)


def test_an_idle_connection_does_not_block_others(server):
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT):  # says nothing
        with session(server) as c:
            check_dense(c.get("w")[0], W)
            items = c.get("grp")
            assert len(items) == 3 and items[0].is_composite_head
