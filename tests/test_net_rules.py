"""Every session rule (``hurray_schema.rules.session``) with a passing session and a firing one.

The server's rules are driven by the independent ``struct`` client (``tests/support/peers``), the
client's by the independent scripted server; in both cases the session is recorded and
``audit`` of the recording must name the same rule at the same byte offset as the live peer
(one fault, one rule id, one offset, whichever entry point found it)."""

from __future__ import annotations

import glob
import os
import re
import struct

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.io import Composite, Tensor
from hurray_schema.model import ElementType, Shard
from hurray_schema.net.messages import LayoutEntry
from hurray_schema.rules import registry
from hurray_schema.rules.session import SESSION_RULES
from support.peers import spec_server as ss
from support.peers import spec_wire as w
from support.peers.spec_client import SpecClient

DATA = np.arange(12, dtype=np.float32).reshape(3, 4)
HELLO = w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello())


# --------------------------------------------------------------------------------------
# The server's rules, through the independent client
# --------------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": DATA, "ünïcødé ✓": DATA})
    with hs.serve([path], record=tmp_path / "rec", writable=tmp_path / "store", max_message_bytes=1 << 16) as srv:
        srv.folder = tmp_path
        yield srv


def _exchange(server, data: bytes) -> list[tuple[int, int, bytes]]:
    """Send ``data`` and collect every reply until the server has answered (or closed)."""
    with SpecClient((server.host, server.port)) as client:
        # one write, ending with a marker whose PONG says everything before was answered: a server
        # that closes the connection after its ERROR cannot cut the sending short
        client.send_raw(data + w.encode_message(w.PING, 0x7777, b"end"))
        replies = []
        while True:
            try:
                msg = client.recv(eof_ok=True)
            except ConnectionResetError:  # closed with our marker unread
                return replies
            if msg is None or (msg[0] == w.PONG and msg[1] == 0x7777):
                return replies
            replies.append(msg)


_FAULT = re.compile(r"^\[(?P<rule>[a-z0-9_.]+)\] .* at byte (?P<offset>\d+) \(")


def _server_fault(server, data: bytes) -> tuple[int, str, int]:
    """The first ERROR the server answers ``data`` with: (code, rule id, byte offset) from its text."""
    errors = [w.decode_error(p) for t, _, p in _exchange(server, data) if t == w.ERROR]
    assert errors, "the server answered no ERROR"
    code, text = errors[0]
    found = _FAULT.match(text)
    assert found, text
    return code, found["rule"], int(found["offset"])


def _recording(server, suffix: str) -> str:
    (path,) = glob.glob(os.path.join(server.folder, "rec", f"*{suffix}"))
    return path


def _audited(path: str) -> set[tuple[str, int]]:
    return {(f.rule_id, f.offset) for f in hs.audit(path).findings}


def _server_fires(server, data: bytes, rule_id: str, offset: int, code: int = w.ERR_INVALID_MESSAGE) -> None:
    got = _server_fault(server, data)
    assert got == (code, rule_id, offset)
    server.close()  # the recording is complete once the connection's thread ended
    assert (rule_id, offset) in _audited(_recording(server, ".client.msgs"))


def _server_passes(server, data: bytes) -> list:
    replies = _exchange(server, data)
    assert all(t != w.ERROR for t, _, _ in replies), [w.decode_error(p) for t, _, p in replies if t == w.ERROR]
    server.close()
    assert hs.audit(_recording(server, ".client.msgs")).findings == ()
    return replies


def _request(key="x", **kw) -> bytes:
    return w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request(key, **kw))


def test_hello_first(server):
    _server_fires(server, _request() + HELLO, "session.hello.first", 0)


def test_hello_first_passes(server):
    _server_passes(server, HELLO + _request())


def test_hello_version(server):
    _server_fires(server, w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(protocol_version=0)),
                  "session.hello.version", 12, code=w.ERR_PROTOCOL_VERSION_MISMATCH)


def test_hello_version_passes(server):
    replies = _server_passes(server, w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(protocol_version=7)))
    assert w.decode_hello(replies[0][2])["protocol_version"] == 1  # at most the client's


@pytest.mark.parametrize("caps, rule", [(1 << 4, "session.capabilities.reserved"), (1 << 63, "session.capabilities.reserved"),
                                        (1 << 3, "session.capabilities.gpudirect")])
def test_capabilities(server, caps, rule):
    _server_fires(server, w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(capability_flags=caps)), rule, 20)


def test_capabilities_pass(server):
    _server_passes(server, w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(capability_flags=0b1111)))


def test_extension_layout_entries_are_skipped(server):
    """``session.layouts.extension_skip``: unknown extension entries in a hello and a request are
    skipped, and the first entry this server can satisfy is served."""
    ext = [w.LayoutEntry(0xF3, b"\x01\x02\x03"), w.LayoutEntry(0xFE, b"")]
    replies = _server_passes(server, w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(layouts=ext))
                             + _request(layouts=ext + [w.LAYOUT_COLUMN_MAJOR], request_flags=w.REQ_ALLOW_TRANSCODE))
    desc = w.decode_descriptor_message(replies[1][2])
    assert w.parse_descriptor(desc["descriptor"]).layout_tag == w.LAYOUT_COLUMN_MAJOR
    assert "session.layouts.extension_skip" in {r.id for r in registry()}


def test_payload_length(server):
    bad = w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request("x") + b"\x00")
    _server_fires(server, HELLO + bad, "session.payload.length", len(HELLO) + 8)


def test_message_size(server):
    big = w.encode_header(w.TENSOR_REQUEST, 3, (1 << 16) + 1)
    _server_fires(server, HELLO + big, "session.message.size", len(HELLO) + 8, code=w.ERR_MESSAGE_TOO_LARGE)


def test_message_size_passes_at_the_limit(server):
    padded = w.encode_message(w.PING, 3, bytes(1 << 16))
    _server_passes(server, HELLO + padded)


def test_message_direction(server):
    _server_fires(server, HELLO + w.encode_message(w.SERVER_HELLO, 3, w.encode_hello()),
                  "session.message.direction", len(HELLO))


@pytest.mark.parametrize("kind, rule", [(0xF0, "session.message.private"), (0xFE, "session.message.private"),
                                        (0x0E, "stream.message.type"), (0xFF, "stream.message.type")])
def test_unrecognised_message_types(server, kind, rule):
    _server_fires(server, HELLO + w.encode_message(kind, 3, b"abc"), rule, len(HELLO))


def test_key_utf8(server):
    payload = struct.pack("<I", 2) + b"\xff\xfe" + w.encode_tensor_request("x")[5:]
    _server_fires(server, HELLO + w.encode_message(w.TENSOR_REQUEST, 3, payload), "session.key.utf8",
                  len(HELLO) + 12 + 4)


def test_key_utf8_passes(server):
    _server_passes(server, HELLO + _request("ünïcødé ✓"))


def test_error_closes_the_stream(server):
    error = w.encode_message(w.ERROR, 3, w.encode_error(w.ERR_INVALID_MESSAGE, "client gives up"))
    _server_fires(server, HELLO + error + _request(), "session.error.closes", len(HELLO) + len(error))


def test_error_closes_only_that_stream(server):
    error = w.encode_message(w.ERROR, 5, w.encode_error(w.ERR_INVALID_MESSAGE, "client gives up"))
    _server_passes(server, HELLO + error + _request())


@pytest.mark.parametrize("flags", [1 << 2, 1 << 31])
def test_request_flags_reserved(server, flags):
    req = _request(request_flags=flags)
    _server_fires(server, HELLO + req, "session.request.flags.reserved", len(HELLO) + len(req) - 4)


@pytest.mark.parametrize("alignment", [0, 3, 48, 0xFFFFFFFF])
def test_request_alignment(server, alignment):
    req = _request(min_alignment=alignment)
    _server_fires(server, HELLO + req, "session.request.alignment", len(HELLO) + len(req) - 8)


def test_request_passes(server):
    _server_passes(server, HELLO + _request(min_alignment=1 << 20, request_flags=w.REQ_ALLOW_TRANSCODE | w.REQ_PARALLEL_OK))


def _put_messages(sid=9, data=None, frames=None) -> list[bytes]:
    data = DATA.tobytes() if data is None else data
    desc = w.dense_descriptor("float32", (3, 4))
    out = [w.encode_message(w.TENSOR_PUT, sid, w.encode_tensor_put("mine", desc, len(data)))]
    for off, chunk in (frames if frames is not None else [(0, data)]):
        out.append(w.encode_message(w.TENSOR_DATA, sid, w.encode_tensor_data(off, chunk)))
    return out + [w.encode_message(w.TENSOR_DATA_END, sid)]


def test_put_flow(server):
    put = _put_messages()
    interleaved = HELLO + put[0] + w.encode_message(w.TENSOR_REQUEST, 9, w.encode_tensor_request("x"))
    _server_fires(server, interleaved, "session.put.flow", len(HELLO) + len(put[0]))


def test_put_flow_passes_and_is_acknowledged(server):
    replies = _server_passes(server, HELLO + b"".join(_put_messages()))
    assert [t for t, _, _ in replies] == [w.SERVER_HELLO, w.TENSOR_PUT_ACK]


def test_put_accepted_only_when_it_can_be_stored(tmp_path):
    """``session.put.accepted``: a PUT the server cannot accept gets ERROR, never an ACK."""
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": DATA})
    with hs.serve([path]) as read_only:
        replies = _exchange(read_only, HELLO + b"".join(_put_messages()))
    kinds = [t for t, _, _ in replies]
    assert w.TENSOR_PUT_ACK not in kinds and kinds.count(w.ERROR) == 1
    assert w.decode_error(replies[kinds.index(w.ERROR)][2])[0] == 0xF1
    assert "session.put.accepted" in {r.id for r in SESSION_RULES}


def test_put_frames_follow_the_container_rules(server):
    gap = _put_messages(frames=[(0, DATA.tobytes()[:8]), (16, DATA.tobytes()[16:])])
    _server_fires(server, HELLO + b"".join(gap), "stream.data.frame", len(HELLO) + len(gap[0]) + len(gap[1]) + 12)


# --------------------------------------------------------------------------------------
# Pushed items: bound per stream and audited as the server takes them
# --------------------------------------------------------------------------------------


PUT_DESCRIPTOR_AT = w.HEADER_SIZE + 4 + len(b"mine") + 4
"""Where the descriptor of a TENSOR_PUT of key "mine" starts in its message (§ TENSOR_PUT Payload)."""


def _pushed(sid: int, desc: bytes, data: bytes = b"", total=None) -> bytes:
    """A whole PUT of key "mine": TENSOR_PUT, one frame when there is data, TENSOR_DATA_END."""
    put = w.encode_message(w.TENSOR_PUT, sid, w.encode_tensor_put("mine", desc, len(data) if total is None else total))
    frame = w.encode_message(w.TENSOR_DATA, sid, w.encode_tensor_data(0, data)) if data else b""
    return put + frame + w.encode_message(w.TENSOR_DATA_END, sid)


def _partition_put(sid: int, boxes) -> bytes:
    """A partition of a float32 (4,) vector pushed on ``sid``: its head, then a member per box."""
    head, *members = w.partition_descriptors("float32", (4,), boxes)
    return _pushed(sid, head) + b"".join(_pushed(sid, d, bytes(4 * box[0])) for d, (_, box) in zip(members, boxes))


def _audited_findings(server, mode="strict") -> list:
    """Audit of the recorded client direction: ``(rule id, offset, tolerated)`` of every finding."""
    server.close()
    findings = hs.audit(_recording(server, ".client.msgs"), mode=mode).findings
    return [(f.rule_id, f.offset, f.tolerated) for f in findings]


def test_pushed_partition_members_that_overlap(server):
    """The server binds a stream's PUTs into one item; audit of the recording binds them the same
    way: the overlap is one fault, at the head's descriptor, live and audited."""
    head_at = len(HELLO) + PUT_DESCRIPTOR_AT
    assert _server_fault(server, HELLO + _partition_put(9, [((0,), (2,)), ((1,), (3,))])) == (
        w.ERR_INVALID_MESSAGE, "composite.close.partition_overlap", head_at)
    assert _audited_findings(server) == [("composite.close.partition_overlap", head_at, False)]
    assert hs.audit(_recording(server, ".client.msgs"), mode="permissive").findings[0].tolerated


def test_pushed_partition_that_tiles_is_stored(server):
    """Each PUT of the item is acknowledged, and the item stored is the partition pushed."""
    replies = _server_passes(server, HELLO + _partition_put(9, [((0,), (2,)), ((2,), (2,))]) + _request("mine"))
    assert [(t, s) for t, s, _ in replies[:4]] == [(w.SERVER_HELLO, 1)] + [(w.TENSOR_PUT_ACK, 9)] * 3
    served = [w.parse_descriptor(w.decode_descriptor_message(p)["descriptor"])
              for t, s, p in replies if (t, s) == (w.TENSOR_DESCRIPTOR, 3)]
    assert [(d.is_composite_head, d.composite and d.composite.member_count) for d in served] == [
        (True, 2), (False, None), (False, None)]


@pytest.mark.parametrize("desc, rules", [
    (w.build_descriptor("float32", (3, 4), buffers=[w.BufferSpec(48)], extra_flags=1 << 9),
     ["descriptor.flags.reserved"]),
    (w.build_descriptor("float32", (3, 4), buffers=[w.BufferSpec(48)], version=(1, 1)), ["descriptor.version_minor"]),
    (w.build_descriptor("float32", (3, 4), buffers=[w.BufferSpec(48, alignment=48, reserved=1)]),
     ["buffer.reserved", "buffer.alignment.power_of_two"]),
], ids=["reserved-flag", "minor-version", "two-faults"])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_a_pushed_descriptor_is_audited_where_the_server_found_it(server, desc, rules, mode):
    """A TENSOR_PUT's descriptor gets the descriptor rules in audit as a TENSOR_DESCRIPTOR's
    does, every finding at its offset in the recording: the first is the server's ERROR, reported
    once, and a second PUT's descriptor (past the first fault, where the checker stops) is audited too."""
    second = w.build_descriptor("float32", (3, 4), buffers=[w.BufferSpec(48, reserved=2)])
    data = HELLO + _pushed(9, desc, DATA.tobytes())
    first_at, second_at = len(HELLO) + PUT_DESCRIPTOR_AT, len(data) + PUT_DESCRIPTOR_AT
    _, rule, offset = _server_fault(server, data + _pushed(11, second, DATA.tobytes()))
    assert rule == rules[0] and first_at <= offset < first_at + len(desc)
    audited = _audited_findings(server, mode)
    assert [r for r, _, _ in audited] == rules + ["buffer.reserved"]
    assert audited[0][:2] == (rule, offset) and [a[:2] for a in audited].count((rule, offset)) == 1
    assert second_at <= audited[-1][1] < second_at + len(second)
    assert all(tolerated == (mode == "permissive" and r == "descriptor.version_minor") for r, _, tolerated in audited)


def _renamed_local(recording: str, folder) -> str:
    """Both directions of ``recording`` copied under a name made over a Unix socket; returns the
    copy of ``recording``."""
    base = recording.rsplit(".", 2)[0]  # NAME of NAME.client.msgs / NAME.server.msgs
    os.makedirs(folder, exist_ok=True)
    for direction in (".client.msgs", ".server.msgs"):
        with open(base + direction, "rb") as src, open(os.path.join(folder, "x-unix" + direction), "wb") as dst:
            dst.write(src.read())
    return os.path.join(folder, "x-unix" + recording[len(base):])


def test_a_pushed_descriptor_crosses_machines_over_tcp(server):
    """A TCP connection crosses machines (spec-map § Interpretations): a PUT whose buffer is not
    producer-synced fires ``stream.sync_mode.cross_machine`` live and in audit of the recording;
    audited as a Unix-socket recording, it does not."""
    desc = w.dense_descriptor("float32", (3, 4), device_tag=w.DEVICE_CUDA, sync_mode=w.SYNC_EVENT)
    _server_fires(server, HELLO + _pushed(9, desc, DATA.tobytes()), "stream.sync_mode.cross_machine",
                  len(HELLO) + PUT_DESCRIPTOR_AT)
    local = _renamed_local(_recording(server, ".client.msgs"), os.path.join(server.folder, "local"))
    assert hs.audit(local).findings == ()


def test_nothing_more_is_answered_on_a_stream_the_server_ended(server):
    """``session.error.closes``: once the server answered a stream with ERROR it sends nothing
    more on it; what the client had pipelined there (the composite's members, a PING, a message
    of an unknown type) is dropped unanswered, and the other streams are served."""
    head, first, second = w.partition_descriptors("float32", (4,), [((0,), (2,)), ((2,), (2,))])
    pipelined = (_pushed(9, head, total=4) + _pushed(9, first, bytes(8)) + _pushed(9, second, bytes(8))
                 + w.encode_message(w.PING, 9, b"p") + w.encode_message(0x0E, 9, b"?") + _request())
    replies = _exchange(server, HELLO + pipelined)
    assert [t for t, s, _ in replies if s == 9] == [w.ERROR]
    answer = [t for t, s, _ in replies if s == 3]
    assert (answer[0], answer[-1]) == (w.TENSOR_DESCRIPTOR, w.TENSOR_DATA_END)
    fault = _FAULT.match(next(w.decode_error(p)[1] for t, s, p in replies if s == 9))
    assert _audited_findings(server)[0][:2] == (fault["rule"], int(fault["offset"])) == (
        "stream.data.total_bytes", len(HELLO) + PUT_DESCRIPTOR_AT + len(head))
    assert hs.audit(_recording(server, ".server.msgs")).findings == ()


def test_rdma_agreed(server):
    reg = w.encode_message(w.RDMA_REGISTER, 3, w.encode_rdma_register(0x1000, 48, b"key"))
    _server_fires(server, HELLO + reg, "session.rdma.agreed", len(HELLO))


def test_rdma_messages_pass_a_recording_where_both_hellos_agreed_to_it(tmp_path):
    """``session.rdma.agreed`` forbids RDMA messages only where RDMA_DATA_PLANE was not advertised by
    both peers (spec-map § Interpretations): a recorded pair where both hellos advertised it is clean
    for that rule (this server advertises none, so live it always refuses them: test_rdma_agreed)."""
    rdma = w.CAP_RDMA_DATA_PLANE
    client = (w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(capability_flags=rdma))
              + w.encode_message(w.RDMA_REGISTER, 3, w.encode_rdma_register(0x1000, 48, b"key")))
    for served_caps, expected in ((rdma, set()), (0, {("session.rdma.agreed", len(HELLO))})):
        (tmp_path / "s.client.msgs").write_bytes(client)
        (tmp_path / "s.server.msgs").write_bytes(w.encode_message(w.SERVER_HELLO, 1,
                                                                  w.encode_hello(capability_flags=served_caps)))
        found = {f for f in _audited(str(tmp_path / "s.client.msgs")) if f[0] == "session.rdma.agreed"}
        assert found == expected


def test_an_error_text_that_is_not_utf8_still_ends_the_stream_with_its_code(tmp_path):
    """The ERROR table types its text as UTF-8 without a rule of its own: a receiver keeps the code
    and reads the text with replacement characters (spec-map § Interpretations), live and in audit."""
    bad_text = struct.pack("<II", w.ERR_UNKNOWN_TENSOR, 2) + b"\xff\xfe"
    peer = _respond(lambda sid: [w.encode_message(w.ERROR, sid, bad_text)])
    with peer, hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5, record=tmp_path / "rec") as session:
        with pytest.raises(hs.errors.RemoteError) as info:
            session.get("x")
    assert info.value.error_code == w.ERR_UNKNOWN_TENSOR and "\ufffd" in str(info.value)
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    assert hs.audit(recorded).findings == ()


# --------------------------------------------------------------------------------------
# The client's rules, through the independent server
# --------------------------------------------------------------------------------------


def _respond(items_for_request, hello_fields=None):
    """A scripted server answering the first TENSOR_REQUEST with ``items_for_request(stream)``."""

    def script(message_type, stream_id, payload, conn):
        if message_type == w.TENSOR_REQUEST:
            conn.play(items_for_request(stream_id))
        elif message_type == w.PING:
            conn.send(w.PONG, stream_id, payload)

    return ss.SpecServer(script, hello_fields=hello_fields)


def _client_fires(tmp_path, peer, rule_id: str, *, get=lambda s: s.get("x"), **options) -> hs.SpecViolation:
    with peer:
        with pytest.raises(hs.SpecViolation) as info:
            with hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5, record=tmp_path / "rec", **options) as s:
                get(s)
    fault = info.value
    assert fault.rule_id == rule_id, fault
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    assert (rule_id, fault.offset) in _audited(recorded)
    return fault


def _client_passes(tmp_path, peer, *, get=lambda s: s.get("x"), **options):
    with peer, hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5, record=tmp_path / "rec", **options) as s:
        value = get(s)
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    assert hs.audit(recorded).findings == ()
    return value


def _dense(sid, **kw):
    return ss.tensor_messages(sid, w.dense_descriptor("float32", (3, 4), **kw), DATA.tobytes())


def test_server_hello_first(tmp_path):
    peer = _respond(_dense)
    peer.hello_reply = w.encode_message(w.PONG, 1) + w.encode_message(w.SERVER_HELLO, 1, w.encode_hello())
    with peer, pytest.raises(hs.SpecViolation) as info:
        hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5)
    assert info.value.rule_id == "session.hello.server_first" and info.value.offset == 0


def test_server_hello_version_and_capabilities(tmp_path):
    for fields, rule in (({"protocol_version": 2}, "session.hello.version"),
                         ({"protocol_version": 0}, "session.hello.version"),
                         ({"capability_flags": 1 << 9}, "session.capabilities.reserved")):
        peer = _respond(_dense, hello_fields=fields)
        with peer, pytest.raises(hs.SpecViolation) as info:
            hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5)
        assert info.value.rule_id == rule


def test_client_passes_a_conforming_server(tmp_path):
    got = _client_passes(tmp_path, _respond(_dense))
    np.testing.assert_array_equal(np.asarray(got), DATA)


def test_device_accept(tmp_path):
    fault = _client_fires(tmp_path, _respond(lambda sid: _dense(sid, device_tag=w.DEVICE_CUDA)), "session.device.accept")
    assert fault.offset > 0


def test_device_selection(tmp_path):
    """A server that advertised only CPU places a CPU request on CUDA: not the preferred device, and
    not the CPU fallback of rule 4."""
    _client_fires(tmp_path, _respond(lambda sid: _dense(sid, device_tag=w.DEVICE_CUDA)),
                  "session.device.selection", devices=("cpu", "cuda"))


def test_device_fallback_to_cpu_passes(tmp_path):
    peer = _respond(_dense, hello_fields={"devices": [w.DEVICE_CPU, w.DEVICE_CUDA]})
    got = _client_passes(tmp_path, peer, get=lambda s: s.get("x", device="cuda"))  # rule 4
    np.testing.assert_array_equal(np.asarray(got), DATA)


def test_memory_class(tmp_path):
    _client_fires(tmp_path, _respond(lambda sid: _dense(sid, memory_class=w.MEM_UNIFIED)), "session.memory_class")


def test_shards_requested(tmp_path):
    peer = _respond(lambda sid: ss.shard_descriptor_messages([sid, sid + 1], "float32", (4, 3),
                                                              np.ones((4, 3), np.float32).tobytes(), [(0, 2), (2, 4)]),
                    hello_fields={"capability_flags": w.CAP_PARALLEL_STREAMS})
    _client_fires(tmp_path, peer, "session.shards.requested")


def test_shards_consistency(tmp_path):
    peer = _respond(lambda sid: ss.overlapping_shards([sid, sid + 1], "float32", (4, 3),
                                                      np.ones((4, 3), np.float32).tobytes()),
                    hello_fields={"capability_flags": w.CAP_PARALLEL_STREAMS})
    _client_fires(tmp_path, peer, "session.shards.consistency", get=lambda s: s.get("x", parallel=True))


def test_shards_pass(tmp_path):
    whole = np.arange(12, dtype=np.float32).reshape(4, 3)
    peer = _respond(lambda sid: ss.shard_descriptor_messages([sid, sid + 1], "float32", (4, 3), whole.tobytes(),
                                                              [(0, 3), (3, 4)]),
                    hello_fields={"capability_flags": w.CAP_PARALLEL_STREAMS})
    got = _client_passes(tmp_path, peer, get=lambda s: s.get("x", parallel=True))
    np.testing.assert_array_equal(np.asarray(got), whole)


def test_client_message_size(tmp_path):
    peer = _respond(lambda sid: [w.encode_header(w.TENSOR_DATA, sid, 1 << 20)])
    _client_fires(tmp_path, peer, "session.message.size", max_message_bytes=1 << 16)


def test_a_received_descriptor_crosses_machines_over_tcp(tmp_path):
    """The client over TCP, and audit of its recording, take a descriptor whose buffer is not
    producer-synced as ``stream.sync_mode.cross_machine``; audited as a Unix-socket recording,
    the rule does not fire."""
    peer = _respond(lambda sid: _dense(sid, device_tag=w.DEVICE_CUDA, sync_mode=w.SYNC_EVENT))
    _client_fires(tmp_path, peer, "stream.sync_mode.cross_machine", devices=("cpu", "cuda"))
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    local = _renamed_local(recorded, tmp_path / "local")
    assert "stream.sync_mode.cross_machine" not in {f.rule_id for f in hs.audit(local).findings}


def test_client_rejects_a_put_ack_in_a_response(tmp_path):
    peer = _respond(lambda sid: [w.encode_message(w.TENSOR_PUT_ACK, sid)] + _dense(sid))
    _client_fires(tmp_path, peer, "session.put.flow")


# --------------------------------------------------------------------------------------
# What the server did with the client's own messages: read from the client's side
# --------------------------------------------------------------------------------------


def _acking_server(hello_reply=None):
    """A scripted server that stores and acknowledges every PUT, whatever it holds."""
    return ss.SpecServer(ss.StoreScript(), hello_reply=hello_reply)


def _rank_65() -> Tensor:
    return Tensor.dense(ElementType.FLOAT32, (1,) * 65, bytes(4))


def _box(offset, parent) -> Tensor:
    """A 4 x 3 float32 member at ``offset`` of a ``parent``-shaped partition."""
    return Tensor.dense(ElementType.FLOAT32, (4, 3), bytes(48), shard=Shard(parent, offset))


def _server_recording(tmp_path) -> bytes:
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    with open(recorded, "rb") as f:
        return f.read()


def test_put_accepted_client_side(tmp_path):
    """``session.put.accepted``: a server that ACKs a PUT every reader rejects (rank 65), at the ACK
    (the last message the server sent), live and in audit of the recording with the client's beside it."""
    fault = _client_fires(tmp_path, _acking_server(), "session.put.accepted",
                          get=lambda s: s.put("bad", _rank_65(), validate=False))
    assert "descriptor.rank.cap" in fault.message
    assert fault.offset == len(_server_recording(tmp_path)) - w.HEADER_SIZE


def test_put_accepted_judges_a_composite_at_its_last_put(tmp_path):
    """A partition whose first member names another parent shape (a fault in every mode): the head's and
    that member's ACKs pass (a server may hold its verdict until the composite is whole), the last
    member's completes the composite and is the fault."""
    mismatched = Composite.build("partition", [_box((0, 0), (4, 7)), _box((0, 3), (4, 6))], shape=(4, 6),
                                 type_tag=ElementType.FLOAT32)
    fault = _client_fires(tmp_path, _acking_server(), "session.put.accepted",
                          get=lambda s: s.put("bad", mismatched, validate=False))
    assert "composite.member.parent_shape" in fault.message
    data = _server_recording(tmp_path)
    assert data[-w.HEADER_SIZE:] == w.encode_message(w.TENSOR_PUT_ACK, 1)
    assert fault.offset == len(data) - w.HEADER_SIZE
    assert data.count(w.encode_message(w.TENSOR_PUT_ACK, 1)) == 3


def test_put_accepted_passes_what_a_permissive_server_may_take(tmp_path):
    """A valid PUT, and a partition with a gap (a strict reader rejects it, a permissive one may keep
    it), acknowledged: no fault, live or in audit."""
    gap = Composite.build("partition", [_box((0, 0), (4, 7)), _box((0, 4), (4, 7))], shape=(4, 7),
                          type_tag=ElementType.FLOAT32)

    def push(session):
        session.put("good", DATA)
        session.put("gap", gap, validate=False)

    _client_passes(tmp_path, _acking_server(), get=push)


EXTENSIONS = [LayoutEntry(0xF3, b"\x01\x02\x03"), LayoutEntry(0xFE, b""), LayoutEntry(w.LAYOUT_ROW_MAJOR)]
"""A layout list with two extension entries, then row-major."""
WIRE_EXTENSIONS = [w.LayoutEntry(e.tag, e.metadata) for e in EXTENSIONS]
"""The same entries, as the struct peer writes them."""


def _refusing_hello(code):
    return ss.error_reply(1, code, "no")[0]


def test_extension_skip_client_side_hello(tmp_path):
    """``session.layouts.extension_skip``: ERROR INVALID_MESSAGE in place of SERVER_HELLO for a valid hello
    carrying extension entries, at the ERROR (byte 0 of what the server sent)."""
    fault = _client_fires(tmp_path, _acking_server(_refusing_hello(w.ERR_INVALID_MESSAGE)),
                          "session.layouts.extension_skip", get=lambda s: None, layouts=EXTENSIONS)
    assert fault.offset == 0


@pytest.mark.parametrize("code, layouts", [(w.ERR_INVALID_MESSAGE, [w.LAYOUT_ROW_MAJOR]),
                                           (w.ERR_PROTOCOL_VERSION_MISMATCH, EXTENSIONS),
                                           (w.ERR_LAYOUT_UNAVAILABLE, EXTENSIONS)])
def test_extension_skip_client_side_hello_other_refusals(tmp_path, code, layouts):
    """A hello without extension entries refused, or one with them refused for another reason: the
    server's ERROR, not the rule, live and in audit."""
    with _acking_server(_refusing_hello(code)) as peer, pytest.raises(hs.RemoteError) as info:
        hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5, record=tmp_path / "rec", layouts=layouts)
    assert info.value.error_code == code
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    assert hs.audit(recorded).findings == ()


def _answer_requests(code):
    """A scripted server answering every TENSOR_REQUEST with ERROR ``code``."""

    def script(message_type, stream_id, payload, conn):
        if message_type == w.TENSOR_REQUEST:
            conn.play(ss.error_reply(stream_id, code))
        elif message_type == w.PING:
            conn.send(w.PONG, stream_id, payload)

    return ss.SpecServer(script)


def test_extension_skip_client_side_request(tmp_path):
    """ERROR INVALID_MESSAGE for a valid request carrying extension entries, at the ERROR."""
    fault = _client_fires(tmp_path, _answer_requests(w.ERR_INVALID_MESSAGE), "session.layouts.extension_skip",
                          get=lambda s: s.get("x", layouts=EXTENSIONS))
    assert fault.offset == len(_server_recording(tmp_path)) - len(ss.error_reply(1, w.ERR_INVALID_MESSAGE)[0])


@pytest.mark.parametrize("code, layouts", [(w.ERR_INVALID_MESSAGE, [w.LAYOUT_ROW_MAJOR]),
                                           (w.ERR_INVALID_MESSAGE, EXTENSIONS + [LayoutEntry(0xFF)]),
                                           (w.ERR_UNKNOWN_TENSOR, EXTENSIONS),
                                           (w.ERR_LAYOUT_UNAVAILABLE, EXTENSIONS)])
def test_extension_skip_client_side_request_other_refusals(tmp_path, code, layouts):
    """No extension entry, an entry the spec calls invalid (0xFF) beside them, or a refusal for another
    reason: the server's ERROR, not the rule, live and in audit; the session goes on."""
    with _answer_requests(code) as peer, hs.connect(f"hurray://127.0.0.1:{peer.port}", timeout=5,
                                                    record=tmp_path / "rec") as s:
        with pytest.raises(hs.RemoteError) as info:
            s.get("x", layouts=layouts)
        assert s.ping(b"on") == b"on"  # the stream ended, not the session
    assert info.value.error_code == code
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.server.msgs"))
    assert hs.audit(recorded).findings == ()


def test_extension_skip_passes_a_server_that_skips_them(tmp_path):
    got = _client_passes(tmp_path, _respond(_dense), get=lambda s: s.get("x", layouts=EXTENSIONS),
                         layouts=EXTENSIONS)
    np.testing.assert_array_equal(np.asarray(got), DATA)


def _pair(tmp_path, client: list, server: list) -> str:
    """A recorded pair written by hand from the struct peer's messages: the server's direction's path."""
    (tmp_path / "pair.client.msgs").write_bytes(b"".join(client))
    (tmp_path / "pair.server.msgs").write_bytes(b"".join(server))
    return str(tmp_path / "pair.server.msgs")


def test_extension_skip_audit_of_a_foreign_client(tmp_path):
    """A client of another making: its valid hello or request with extension entries refused
    INVALID_MESSAGE is the rule; the same hello with a reserved capability bit, the same request with
    min_alignment 3, or followed on its stream by a stray frame (the server's answer may be right) is not."""
    refused = ss.error_reply(1, w.ERR_INVALID_MESSAGE)[0]
    ext_hello = w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(layouts=WIRE_EXTENSIONS))
    assert _audited(_pair(tmp_path, [ext_hello], [refused])) == {("session.layouts.extension_skip", 0)}
    bad_hello = w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(layouts=WIRE_EXTENSIONS, capability_flags=1 << 9))
    assert hs.audit(_pair(tmp_path, [bad_hello], [refused])).findings == ()
    hello = w.encode_message(w.SERVER_HELLO, 1, w.encode_hello())
    refusal = ss.error_reply(3, w.ERR_INVALID_MESSAGE)[0]
    valid = w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request("x", layouts=WIRE_EXTENSIONS))
    path = _pair(tmp_path, [HELLO, valid], [hello, refusal])
    assert _audited(path) == {("session.layouts.extension_skip", len(hello))}
    invalid = w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request("x", layouts=WIRE_EXTENSIONS,
                                                                          min_alignment=3))
    assert hs.audit(_pair(tmp_path, [HELLO, invalid], [hello, refusal])).findings == ()
    stray = w.encode_message(w.TENSOR_DATA, 3, w.encode_tensor_data(0, b"x"))  # INVALID_MESSAGE may answer it
    assert hs.audit(_pair(tmp_path, [HELLO, valid, stray], [hello, refusal])).findings == ()


# --------------------------------------------------------------------------------------
# Coverage: every session rule is exercised above, and listed in spec-map.md
# --------------------------------------------------------------------------------------


_BEHAVIOUR_TESTS = {
    "session.layout.selection": "test_net_session.py::test_first_satisfiable_preference_wins",
    "session.transcode.limit": "test_net_session.py::test_transcode_limit_falls_through",
    "session.transcode.elements": "test_net_session.py::test_transcode_sparse_to_row_major",
}
"""Rules that bind the server's own choices: shown by what it serves, not by a fault it reports."""


def test_every_session_rule_is_exercised():
    here = os.path.dirname(__file__)
    source = "".join(open(os.path.join(here, name), encoding="utf-8").read()
                     for name in ("test_net_rules.py", "test_net_ipc.py"))
    untested = [r.id for r in SESSION_RULES if f'"{r.id}"' not in source.replace(
        "_BEHAVIOUR_TESTS = {", "")]
    assert not untested
    for rule_id in _BEHAVIOUR_TESTS:
        assert rule_id in {r.id for r in SESSION_RULES}
