"""Hostile peers against the transport (``hurray_schema.net``).

1. A hostile server (:class:`support.peers.spec_server.SpecServer`, written from the spec) against our
   client: every breach raises the rule's :class:`hs.SpecViolation` at the byte offset the test
   computes from the bytes it sent (never from the client under test); an ERROR is its typed
   :class:`hs.RemoteError` and leaves the session usable; a stalled server is a
   :class:`hs.SessionTimeout` within the timeout.
1b. Hostile clients: the server faults the sweep below found, pinned one by one.
2. Mutation sweeps, both ways: seeded mutations of valid client sessions sent to one long-lived
   server (which must go on serving, with no thread, connection or memory left behind and no
   exception escaping a thread), and of valid server responses replayed to our client (which
   raises only :class:`hs.HurraySchemaError` subclasses, and returns only what an independent
   decoder of the same bytes gives).
3. Load: 64 concurrent clients, concurrent PUTs of one key, and the connections past
   ``max_connections`` refused with ERROR 0xF0 (SERVER_BUSY) without disturbing the others.
4. A server process SIGKILLed while a client PUTs ~200 MB over an older tensor: the store keeps
   the old file whole and no temporary file.

Spec sections are cited as ``interchange.md § Section``.  Sizes: :mod:`sizes` (``--thorough``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support.peers import spec_server as ss
from support.peers import spec_wire as w
from support.peers.spec_client import (
    PeerClosed,
    PeerError,
    PeerViolation,
    SpecClient,
    place_boxes,
)
from support.sizes import size

import hurray_schema as hs

TIMEOUT = 5.0
"""Every socket wait of these tests, ours and the client's under test, is at most this."""
RNG = np.random.default_rng(20250101)

# --------------------------------------------------------------------------------------
# What the hostile server sends, built with the spec peers only
# --------------------------------------------------------------------------------------

DENSE = RNG.standard_normal((4, 6)).astype(np.float32)  # 96 bytes: three 32-byte frames
DENSE_DESC = w.dense_descriptor("float32", DENSE.shape)
PART = RNG.standard_normal((6, 4)).astype(np.float32)
PART_BOXES = w.dim0_boxes(PART.shape, 3)
HELLO_FIELDS = {"protocol_version": 1, "max_message_size": 1 << 20,
                "capability_flags": w.CAP_TRANSCODING | w.CAP_PARALLEL_STREAMS,
                "layouts": (w.LAYOUT_ROW_MAJOR, w.LAYOUT_COMPOSITE), "devices": (w.DEVICE_CPU,),
                "memory_classes": (w.MEM_STANDARD,)}


def server_hello(**fields) -> bytes:
    """A whole SERVER_HELLO message (interchange.md § SERVER_HELLO Payload)."""
    return ss.msg(w.SERVER_HELLO, 1, w.encode_hello(**{**HELLO_FIELDS, **fields}))


HELLO = server_hello()


def dense_messages(sid: int, frame_bytes: int = 32) -> list[bytes]:
    return ss.tensor_messages(sid, DENSE_DESC, DENSE.tobytes(), frame_bytes=frame_bytes)


def partition_parts() -> tuple[bytes, list]:
    descs = w.partition_descriptors("float32", PART.shape, PART_BOXES)
    members = [(d, ss.extract_box(PART.shape, 4, PART.tobytes(), o, s)) for d, (o, s) in zip(descs[1:], PART_BOXES)]
    return descs[0], members


def at(items: list, index: int, base: int = len(HELLO)) -> int:
    """Offset, in what the client receives, of message ``index`` of ``items`` sent after ``base`` bytes."""
    return base + sum(len(i) for i in items[:index] if isinstance(i, (bytes, bytearray)))


def sent(items: list, base: int = len(HELLO)) -> int:
    return at(items, len(items), base)


class Script:
    """Answers the n-th request (TENSOR_REQUEST, TENSOR_PUT or PING) with ``answers[n](sid)``'s
    items (the last answer repeats); a PUT's frames are read first."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.count = 0

    def __call__(self, kind, sid, payload, conn):
        if kind in (w.TENSOR_DATA, w.ERROR, w.PONG):
            return None
        if kind == w.TENSOR_PUT:
            while True:
                nxt = conn.recv()
                if nxt is None:
                    return "close"
                if nxt[0] == w.TENSOR_DATA_END:
                    break
        answer = self.answers[min(self.count, len(self.answers) - 1)]
        self.count += 1
        conn.play(answer(sid))
        return None


@contextlib.contextmanager
def hostile(*answers, hello: bytes = HELLO, max_message_bytes: int = 1 << 20, timeout: float = TIMEOUT):
    """A SpecServer sending ``hello`` as it is, then answering as :class:`Script` does, and a
    session of our client with it; yields ``(session, server)``."""
    with ss.SpecServer(Script(*answers), hello_reply=hello, timeout=TIMEOUT) as server:
        with hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=timeout,
                        max_message_bytes=max_message_bytes) as session:
            yield session, server


def check(excinfo, rule: str, offset=None) -> None:
    fault = excinfo.value
    assert isinstance(fault, hs.SpecViolation), repr(fault)
    assert fault.rule_id == rule, fault
    if offset is not None:
        assert fault.offset == offset, fault


def dense_value(item) -> np.ndarray:
    assert isinstance(item, hs.Tensor)
    return np.asarray(item)


# --------------------------------------------------------------------------------------
# 1. A hostile server
# --------------------------------------------------------------------------------------


def test_a_conforming_spec_server_is_read_right():
    head, members = partition_parts()
    shards = lambda sid: ss.shard_descriptor_messages([sid, sid + 1], "float32", PART.shape, PART.tobytes(),
                                                      w.split_rows(6, 2))
    with hostile(dense_messages, lambda sid: ss.composite_messages(sid, head, members), shards) as (session, _):
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)
        np.testing.assert_array_equal(session.get("p").materialize(), PART)
        np.testing.assert_array_equal(dense_value(session.get("s", parallel=True)), PART)


@pytest.mark.parametrize("arrived", [0, 1, 2])
def test_torn_composite(arrived):
    """layouts/composite.md § Validation: the connection closes after ``arrived`` of 3 members
    (at a message boundary): ``composite.torn`` at the head's descriptor."""
    head, members = partition_parts()
    items = ss.torn_composite(1, head, members, arrived)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("p")
    check(info, "composite.torn", at(items, 0) + w.HEADER_SIZE)


def test_torn_inside_a_member():
    """The connection closes between a member's frames: the tensor is cut (``stream.truncated``
    at the end of what arrived)."""
    head, members = partition_parts()
    items = ss.composite_messages(1, head, members, frame_bytes=8)[:-3] + [ss.CLOSE]
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("p")
    check(info, "stream.truncated", sent(items))


@pytest.mark.parametrize("frames", [ss.frame_gap, ss.frame_overlap], ids=["gap", "overlap"])
def test_frames_that_do_not_tile_the_data(frames):
    items = frames(1, DENSE_DESC, DENSE.tobytes(), 32)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.data.frame", at(items, 2) + w.HEADER_SIZE)


def test_frame_past_total_data_bytes():
    items = ss.tensor_messages(1, DENSE_DESC, DENSE.tobytes() + b"\1" * 8, frame_bytes=32,
                               total_data_bytes=DENSE.nbytes)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.data.frame", at(items, 4) + w.HEADER_SIZE)


def test_frames_short_of_total_data_bytes():
    items = ss.tensor_messages(1, DENSE_DESC, DENSE.tobytes()[:-4], frame_bytes=32, total_data_bytes=DENSE.nbytes)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.data.sum", at(items, len(items) - 1))


@pytest.mark.parametrize("delta", [-1, 1, 1 << 40])
def test_wrong_total_data_bytes(delta):
    items = ss.wrong_total(1, DENSE_DESC, DENSE.tobytes(), delta=delta)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.data.total_bytes", at(items, 0) + w.HEADER_SIZE + len(DENSE_DESC))


def test_data_before_descriptor():
    items = ss.data_before_descriptor(1, DENSE_DESC, DENSE.tobytes())
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.order", at(items, 0))


def test_data_end_before_descriptor():
    items = [ss.msg(w.TENSOR_DATA_END, 1)] + dense_messages(1)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.order", at(items, 0))


@pytest.mark.parametrize("payload_length", [4097, w.U32_MAX - 1, w.U32_MAX])
@pytest.mark.parametrize("kind", [w.TENSOR_DESCRIPTOR, w.TENSOR_DATA, w.PING])
def test_payload_length_over_the_clients_maximum(kind, payload_length):
    """interchange.md § Message Framing: over the max_message_size the client advertised."""
    prefix = dense_messages(1)[:2] if kind == w.TENSOR_DATA else []
    items = prefix + ss.oversized_header(1, kind, payload_length)
    with hostile(lambda sid: items, max_message_bytes=4096) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "session.message.size", at(items, len(prefix)) + 8)


@pytest.mark.parametrize("kind", [0x0E, 0x0F, 0xEF, 0xFF, 0x100, 0x1234, w.U32_MAX])
def test_unknown_message_type(kind):
    items = ss.unknown_message(1, kind, b"xyz")
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.type", at(items, 0))


@pytest.mark.parametrize("kind", [0xF0, 0xF7, 0xFE])
@pytest.mark.parametrize("where", ["response", "inside a tensor"])
def test_private_message_type_not_agreed(kind, where):
    prefix = dense_messages(1)[:2] if where == "inside a tensor" else []
    items = prefix + ss.unknown_message(1, kind, b"private")
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "session.message.private", at(items, len(prefix)))


@pytest.mark.parametrize("kind", [w.SERVER_HELLO, w.TENSOR_REQUEST, w.TENSOR_PUT, w.CLIENT_HELLO])
def test_message_of_the_wrong_direction_or_hello_again(kind):
    items = [ss.msg(kind, 1, w.encode_hello(**HELLO_FIELDS))]
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    rule = "session.hello.server_first" if kind == w.SERVER_HELLO else "session.message.direction"
    check(info, rule, at(items, 0))


def test_stream_id_zero():
    items = dense_messages(0)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.stream_id", at(items, 0) + 4)


def test_response_on_another_stream():
    items = dense_messages(7)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.order", at(items, 0))


ERROR_CLASSES = {
    0x01: hs.ProtocolVersionMismatch, 0x02: hs.UnknownTensor, 0x03: hs.LayoutUnavailable,
    0x04: hs.TranscodeLimitExceeded, 0x05: hs.DeviceUnavailable, 0x06: hs.InvalidMessage,
    0x07: hs.MessageTooLarge, 0x08: hs.ShardMismatch,
    0x00: hs.RemoteError, 0x09: hs.RemoteError, 0xF0: hs.RemoteError, 0xF1: hs.RemoteError, 0xFE: hs.RemoteError,
    0xFF: hs.RemoteError, w.U32_MAX: hs.RemoteError,
}


@pytest.mark.parametrize("code", sorted(ERROR_CLASSES))
def test_error_codes_are_typed_and_the_session_goes_on(code):
    """interchange.md § Error Handling: an ERROR closes its stream; the connection may go on."""
    errors = lambda sid: ss.error_reply(sid, code, f"code {code} é")
    with hostile(errors, dense_messages) as (session, _):
        with pytest.raises(hs.RemoteError) as info:
            session.get("missing")
        assert type(info.value) is ERROR_CLASSES[code]
        assert info.value.error_code == code and info.value.remote_message == f"code {code} é"
        assert info.value.offset == len(HELLO)
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)


@pytest.mark.parametrize("where", [1, 2, 3])
def test_error_inside_a_tensor_ends_only_that_request(where):
    """An ERROR after ``where`` messages of a tensor: typed, and the next request is served."""
    cut = lambda sid: dense_messages(sid)[:where] + ss.error_reply(sid, 0x06, "gave up")
    with hostile(cut, dense_messages) as (session, _):
        with pytest.raises(hs.InvalidMessage):
            session.get("d")
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)


def test_error_inside_a_composite_ends_only_that_request():
    head, members = partition_parts()
    cut = lambda sid: ss.composite_messages(sid, head, members)[:5] + ss.error_reply(sid, 0x03)
    with hostile(cut, lambda sid: ss.composite_messages(sid, head, members)) as (session, _):
        with pytest.raises(hs.LayoutUnavailable):
            session.get("p")
        np.testing.assert_array_equal(session.get("p").materialize(), PART)


def test_error_answering_put_and_ping():
    with hostile(lambda sid: ss.error_reply(sid, 0xF1, "no"), lambda sid: [ss.msg(w.PONG, sid, b"hi")],
                 lambda sid: ss.error_reply(sid, 0x06), lambda sid: [ss.msg(w.TENSOR_PUT_ACK, sid)]) as (session, _):
        with pytest.raises(hs.RemoteError) as info:
            session.put("k", DENSE)
        assert info.value.error_code == 0xF1
        assert session.ping(b"hi") == b"hi"
        with pytest.raises(hs.InvalidMessage):
            session.ping(b"x")
        assert session.put("k", DENSE) is None


def test_anything_after_an_error_on_its_stream_is_refused():
    """interchange.md § Error Handling: after an ERROR nothing more travels on that stream."""
    items = ss.error_reply(1, 0x02) + dense_messages(1)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.UnknownTensor):
            session.get("d")
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "session.error.closes", at(items, 1))


@pytest.mark.parametrize("code", [0x01, 0xF0])
def test_error_instead_of_server_hello(code):
    """interchange.md § Session Establishment: ERROR instead of SERVER_HELLO, then close."""
    hello = ss.error_reply(1, code, "go away")[0]
    with ss.SpecServer(Script(dense_messages), hello_reply=hello, timeout=TIMEOUT) as server:
        with pytest.raises(hs.RemoteError) as info:
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT)
    assert type(info.value) is ERROR_CLASSES[code] and info.value.offset == 0


def _shard_answer(builder):
    return lambda sid: builder([sid, sid + 1], "float32", PART.shape, PART.tobytes())


@pytest.mark.parametrize("builder", [ss.overlapping_shards, ss.gapped_shards], ids=["overlap", "gap"])
def test_inconsistent_shards(builder):
    """interchange.md § Shard Consistency: checked once every TENSOR_DESCRIPTOR arrived (the
    second shard's, the interleaved stream's second message)."""
    items = _shard_answer(builder)(1)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("s", parallel=True)
    check(info, "session.shards.consistency", at(items, 1))


def _shards(sid, ranges, overrides=None):
    """Shards of PART by rows; ``overrides`` override a shard's descriptor fields by index:
    ``{index: dict(element_type=..., shard_index=..., total_shards=...)}``."""
    out = []
    for i, (lo, hi) in enumerate(ranges):
        o = (overrides or {}).get(i, {})
        etype = o.get("element_type", "float32")
        shape = (hi - lo,) + PART.shape[1:]
        shard = None if o.get("no_shard") else (o.get("parent", PART.shape), (lo, 0))
        desc = w.dense_descriptor(etype, shape, shard=shard)
        data = PART[lo:hi].tobytes()
        out += ss.tensor_messages(sid + i, desc, data, shard_index=o.get("shard_index", i),
                                  total_shards=o.get("total_shards", len(ranges)))
    return out


@pytest.mark.parametrize("case", ["type", "parent", "no_shard", "total_shards", "index"])
def test_shards_that_disagree(case):
    overrides = {"type": {1: {"element_type": "int32"}}, "parent": {1: {"parent": (7, 4)}},
                 "no_shard": {1: {"no_shard": True}}, "total_shards": {1: {"total_shards": 3}},
                 "index": {1: {"shard_index": 0}}}[case]
    items = _shards(1, [(0, 3), (3, 6)], overrides)
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("s", parallel=True)
    assert info.value.rule_id == "session.shards.consistency", info.value
    assert info.value.offset == at(items, 3)  # the second shard's descriptor


def test_shards_not_requested():
    items = ss.shard_descriptor_messages([1, 2], "float32", PART.shape, PART.tobytes(), w.split_rows(6, 2))
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("s")  # no PARALLEL_OK
    check(info, "session.shards.requested", at(items, 0))


@pytest.mark.parametrize("stream", [1, 2])
def test_error_inside_a_parallel_transfer_ends_the_session(stream):
    """An ERROR on one shard's stream while another shard is open: the typed error; what the
    server sends next on the open stream could not be told from a later answer, so the session
    ends (a typed SessionError afterwards, never another exception)."""
    good = ss.shard_descriptor_messages([1, 2], "float32", PART.shape, PART.tobytes(), w.split_rows(6, 2))
    items = good[:2] + ss.error_reply(stream, 0x08) + good[2:]
    with hostile(lambda sid: items, dense_messages) as (session, _):
        with pytest.raises(hs.ShardMismatch) as info:
            session.get("s", parallel=True)
        assert info.value.offset == at(items, 2)
        with pytest.raises(hs.SessionError):
            session.get("d")


def test_answer_on_an_earlier_requests_stream():
    """interchange.md § Overview: a request is answered on its own stream; a tensor on the
    stream of an earlier, answered request is not the answer to this one."""
    other = np.full(DENSE.shape, 7, np.float32)
    stale = ss.tensor_messages(1, DENSE_DESC, other.tobytes())
    with hostile(dense_messages, lambda sid: stale) as (session, _):
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)
        with pytest.raises(hs.SpecViolation) as info:
            session.get("e")
    check(info, "stream.message.order", sent(dense_messages(1)) + at(stale, 0, 0))


def test_new_requests_avoid_streams_an_error_closed():
    """interchange.md § Error Handling: after an ERROR on a stream, neither side sends on it."""
    pong = lambda sid: [ss.msg(w.PONG, sid, b"p")]
    first = lambda sid: ss.error_reply(sid + 1, 0x02) + dense_messages(sid)  # an ERROR on stream 2, then the answer
    with hostile(first, dense_messages, pong) as (session, server):
        np.testing.assert_array_equal(dense_value(session.get("a")), DENSE)  # stream 2's end is not this answer's
        np.testing.assert_array_equal(dense_value(session.get("d")), DENSE)
        assert session.ping(b"p") == b"p"
    assert [m[2] for m in server.received if m[1] in (w.TENSOR_REQUEST, w.PING)] == [1, 3, 4]


@pytest.mark.parametrize("version", [0, 2, 0x100, w.U32_MAX])
def test_server_hello_version(version):
    """interchange.md § SERVER_HELLO Payload: 1 <= protocol_version <= the client's (1)."""
    hello = server_hello(protocol_version=version)
    with ss.SpecServer(Script(dense_messages), hello_reply=hello, timeout=TIMEOUT) as server:
        with pytest.raises(hs.SpecViolation) as info:
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT)
    check(info, "session.hello.version", w.HEADER_SIZE)


@pytest.mark.parametrize("caps", [1 << 4, 1 << 33, 1 << 63, w.U64_MAX])
def test_server_hello_reserved_capability_bits(caps):
    hello = server_hello(capability_flags=caps)
    with ss.SpecServer(Script(dense_messages), hello_reply=hello, timeout=TIMEOUT) as server:
        with pytest.raises(hs.SpecViolation) as info:
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT)
    check(info, "session.capabilities.reserved", w.HEADER_SIZE + 4 + 4)  # after version, max_message_size


def test_server_hello_gpudirect_without_rdma():
    hello = server_hello(capability_flags=w.CAP_RDMA_GPUDIRECT)
    with ss.SpecServer(Script(dense_messages), hello_reply=hello, timeout=TIMEOUT) as server:
        with pytest.raises(hs.SpecViolation) as info:
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT)
    check(info, "session.capabilities.gpudirect", w.HEADER_SIZE + 8)


@pytest.mark.parametrize("cut", [0, 5, w.HEADER_SIZE, w.HEADER_SIZE + 3, len(HELLO) - 1])
def test_server_closes_inside_the_hello(cut):
    def reply(conn, _payload):
        conn.send_raw(HELLO[:cut])
        conn.close()

    with ss.SpecServer(Script(dense_messages), hello_reply=reply, timeout=TIMEOUT) as server:
        with pytest.raises(hs.HurraySchemaError) as info:
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT)
    if cut == 0:
        assert isinstance(info.value, hs.SessionError)
    else:
        check(info, "stream.message.truncated", cut)


@pytest.mark.parametrize("cut", [1, 11, 12, 13, 19, 20, 40])
def test_server_closes_inside_a_frame(cut):
    """interchange.md § Message Framing: the connection ends inside a message (its header or
    its payload): ``stream.message.truncated`` where the bytes end."""
    messages = dense_messages(1)
    items = messages[:2] + [messages[2][:cut], ss.CLOSE]
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.truncated", sent(items))


@pytest.mark.parametrize("cut", [1, 12, 30])
def test_server_closes_inside_a_descriptor(cut):
    items = [dense_messages(1)[0][:cut], ss.CLOSE]
    with hostile(lambda sid: items) as (session, _):
        with pytest.raises(hs.SpecViolation) as info:
            session.get("d")
    check(info, "stream.message.truncated", sent(items))


STALL = 1.0


def _stalls(where):
    messages = dense_messages(1)
    return {"before any answer": [ss.Stall(30)],
            "between frames": messages[:2] + [ss.Stall(30)],
            "inside a header": messages[:2] + [messages[2][:5], ss.Stall(30)],
            "inside a frame": messages[:2] + [messages[2][:20], ss.Stall(30)]}[where]


@pytest.mark.parametrize("where", ["before any answer", "between frames", "inside a header", "inside a frame"])
def test_stalled_server_times_out(where):
    items = _stalls(where)
    with hostile(lambda sid: items, timeout=STALL) as (session, _):
        start = time.monotonic()
        with pytest.raises(hs.SessionTimeout):
            session.get("d")
        assert time.monotonic() - start < STALL + 2
        with pytest.raises(hs.SessionError):
            session.get("d")  # the session is over


def test_server_stalls_before_its_hello():
    with ss.SpecServer(Script(dense_messages), hello_reply=lambda conn, _: conn.stall(30), timeout=TIMEOUT) as srv:
        start = time.monotonic()
        with pytest.raises(hs.SessionTimeout):
            hs.connect(f"hurray://127.0.0.1:{srv.port}", timeout=STALL)
        assert time.monotonic() - start < STALL + 2


def test_server_hello_with_a_tiny_max_message_size_refuses_put_typed():
    """A SERVER_HELLO whose max_message_size cannot hold a data frame: a PUT is refused by a
    typed error before anything is sent, never another exception."""
    for limit in (0, 8, 9):
        hello = server_hello(max_message_size=limit)
        with hostile(lambda sid: [ss.msg(w.TENSOR_PUT_ACK, sid)], hello=hello) as (session, server):
            with pytest.raises(hs.HurraySchemaError):
                session.put("k", DENSE)
            assert not server.messages(w.TENSOR_DATA)


# --------------------------------------------------------------------------------------
# 1b. Hostile clients: what the sweep below found, pinned
# --------------------------------------------------------------------------------------

CLIENT_HELLO = ss.msg(w.CLIENT_HELLO, 1, w.encode_hello())


def _messages(reply: bytes) -> list[tuple[int, int, bytes]]:
    out, pos = [], 0
    while pos < len(reply):
        kind, sid, n = w.decode_header(reply[pos:pos + w.HEADER_SIZE])
        out.append((kind, sid, reply[pos + w.HEADER_SIZE:pos + w.HEADER_SIZE + n]))
        pos += w.HEADER_SIZE + n
    return out


@pytest.fixture(scope="module")
def put_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-clients")
    hs.save(folder / "s.hrry", {"w": DENSE})
    with hs.serve([folder / "s.hrry"], writable=folder / "store", max_put_bytes=1000, idle_timeout=TIMEOUT) as server:
        yield server


@pytest.mark.parametrize("first", [
    ss.msg(w.CLIENT_HELLO, 1, w.encode_hello()[:-1]),  # a payload that does not hold its table
    ss.msg(w.CLIENT_HELLO, 1, w.encode_hello() + b"\0"),
    ss.msg(0xF0, 1, b"private"), ss.msg(0x0E, 1, b""),  # not a hello at all
], ids=["hello-cut", "hello-long", "private", "unknown"])
def test_a_session_that_never_started_ends_at_its_first_fault(put_server, first):
    """interchange.md § Session Establishment: a server that cannot start the session answers
    ERROR and closes; nothing after it is served (a request after a broken hello found no
    session and failed inside the server)."""
    request = ss.msg(w.TENSOR_REQUEST, 3, w.encode_tensor_request("w"))
    reply, _ = _exchange(put_server.port, first + CLIENT_HELLO + request)
    (only,) = _messages(reply)
    assert only[0] == w.ERROR and w.decode_error(only[2])[0] == w.ERR_INVALID_MESSAGE


def test_a_refused_put_is_answered_once(put_server):
    """interchange.md § Error Handling: the PUT's ERROR closes its stream; its frames and
    TENSOR_DATA_END, already on their way, are not answered with more ERRORs on that stream."""
    data = np.arange(40, dtype=np.float32).tobytes()
    bad = b"HRRX" + w.dense_descriptor("float32", (40,))[4:]
    reply, _ = _exchange(put_server.port, b"".join([CLIENT_HELLO] + _put_messages(3, "k", bad, data)
                                                   + [ss.msg(w.PING, 5, b"p")]))
    assert [(k, s) for k, s, _ in _messages(reply)] == [(w.SERVER_HELLO, 1), (w.ERROR, 3), (w.PONG, 5)]


def test_max_put_bytes_bounds_what_a_connection_holds(put_server):
    """``max_put_bytes`` (1000 here) bounds the bytes a connection's unfinished PUTs hold: two
    PUT streams of 600 bytes at once, or a composite whose members add up past it, are refused."""
    vec = np.arange(150, dtype=np.float32).tobytes()
    a = _put_messages(3, "a", w.dense_descriptor("float32", (150,)), vec, frame=100)
    b = _put_messages(5, "b", w.dense_descriptor("float32", (150,)), vec, frame=100)
    both = [CLIENT_HELLO, a[0], b[0]] + [x for pair in zip(a[1:], b[1:]) for x in pair]
    got = _messages(_exchange(put_server.port, b"".join(both))[0])
    assert [(k, s) for k, s, _ in got] == [(w.SERVER_HELLO, 1), (w.ERROR, 5), (w.TENSOR_PUT_ACK, 3)]
    assert w.decode_error(got[1][2])[0] == 0xF1
    member = np.arange(100, dtype=np.float32).tobytes()
    group = _put_messages(7, "g", w.group_head("float32", (100,), 3), b"")
    for _ in range(3):
        group += _put_messages(7, "g", w.dense_descriptor("float32", (100,)), member)
    got = _messages(_exchange(put_server.port, b"".join([CLIENT_HELLO] + group))[0])
    assert [k for k, _, _ in got] == [w.SERVER_HELLO] + [w.TENSOR_PUT_ACK] * 3 + [w.ERROR]
    assert w.decode_error(got[-1][2])[0] == 0xF1
    with hs.connect(put_server.url, timeout=TIMEOUT) as session:  # each PUT on its own is taken
        session.put("g", hs.group([np.arange(100, dtype=np.float32)] * 2))
        assert len(session.get("g").members) == 2


@pytest.mark.parametrize("case", ["hello cut", "header cut", "frame cut", "unknown type cut"])
def test_a_connection_cut_inside_a_message_is_recorded_to_its_last_byte(tmp_path, case):
    """The server and ``audit`` of its recording name the same fault at the same byte when the
    client's bytes end inside a message: the bytes of the message cut short are recorded too,
    and a refused message's header fault is answered before its payload is skipped."""
    import glob

    hs.save(tmp_path / "s.hrry", {"w": DENSE})
    data = np.arange(40, dtype=np.float32).tobytes()
    put = _put_messages(3, "k", w.dense_descriptor("float32", (40,)), data, frame=64)
    sent_bytes, rule, offset = {
        "hello cut": (CLIENT_HELLO[:20], "stream.message.truncated", 20),
        "header cut": (CLIENT_HELLO + put[0][:7], "stream.message.truncated", len(CLIENT_HELLO) + 7),
        "frame cut": (b"".join([CLIENT_HELLO, put[0], put[1][:30]]), "stream.message.truncated",
                      len(CLIENT_HELLO) + len(put[0]) + 30),
        "unknown type cut": (CLIENT_HELLO + ss.msg(0x0E, 5, b"xyz" * 10)[:20], "stream.message.type",
                             len(CLIENT_HELLO)),
    }[case]
    with hs.serve([tmp_path / "s.hrry"], writable=tmp_path / "store", record=tmp_path / "rec") as server:
        reply, _ = _exchange(server.port, sent_bytes)
    errors = [w.decode_error(p)[1] for k, _, p in _messages(reply) if k == w.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"[{rule}]") and f" at byte {offset} " in errors[0], errors
    (recorded,) = glob.glob(str(tmp_path / "rec" / "*.client.msgs"))
    assert os.path.getsize(recorded) == len(sent_bytes)
    assert (rule, offset) in {(f.rule_id, f.offset) for f in hs.audit(recorded).findings}


# --------------------------------------------------------------------------------------
# 2. Mutation sweeps
# --------------------------------------------------------------------------------------

INTERESTING_U32 = (0, 1, 2, 3, 4, 7, 8, 9, 12, 16, 20, 0x3F, 0x40, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000,
                   0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)
INTERESTING_BYTES = (0x00, 0x01, 0x02, 0x03, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x10, 0x20,
                     0x40, 0x7F, 0x80, 0xF0, 0xFE, 0xFF)


def mutate(rng: random.Random, messages: list[bytes], others: list[list[bytes]]) -> bytes:
    """One to three seeded mutations of a message sequence: bit flips, byte replacements,
    header fields and payload words set to edge values, length edits, truncation, duplication,
    deletion, reordering, splices of other sequences' messages, garbage."""
    msgs = [bytearray(x) for x in messages]
    data = None  # once the sequence is flattened, mutations work on the bytes

    def flat() -> bytearray:
        return bytearray(b"".join(msgs)) if data is None else data

    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        op = rng.choice(("flip", "flip", "byte", "header", "header", "length", "word", "word", "truncate",
                         "duplicate", "delete", "swap", "splice", "garbage"))
        if data is None and op in ("header", "length", "word", "duplicate", "delete", "swap", "splice") and msgs:
            i = rng.randrange(len(msgs))
            m_ = msgs[i]
            if op == "header" and len(m_) >= 12:
                field = rng.randrange(3)
                value = rng.choice(INTERESTING_U32 + (len(m_) - 12, rng.getrandbits(32), rng.randrange(16)))
                m_[4 * field:4 * field + 4] = struct.pack("<I", value)
            elif op == "length" and len(m_) >= 12:
                (n,) = struct.unpack_from("<I", m_, 8)
                m_[8:12] = struct.pack("<I", max(0, min(w.U32_MAX, n + rng.choice((-9, -8, -4, -1, 1, 4, 8, 100)))))
            elif op == "word" and len(m_) > 16:
                pos = rng.randrange(12, len(m_) - 4)
                if rng.random() < 0.3 and pos + 8 <= len(m_):
                    m_[pos:pos + 8] = struct.pack("<Q", rng.choice((0, 1, 1 << 32, 1 << 40, 1 << 63, w.U64_MAX)))
                else:
                    m_[pos:pos + 4] = struct.pack("<I", rng.choice(INTERESTING_U32))
            elif op == "duplicate":
                msgs.insert(rng.randrange(len(msgs) + 1), bytearray(m_))
            elif op == "delete" and len(msgs) > 1:
                del msgs[i]
            elif op == "swap":
                j = rng.randrange(len(msgs))
                msgs[i], msgs[j] = msgs[j], msgs[i]
            elif op == "splice":
                other = rng.choice(others)
                msgs.insert(rng.randrange(len(msgs) + 1), bytearray(rng.choice(other)))
            continue
        data = flat()
        if not data:
            continue
        pos = rng.randrange(len(data))
        if op == "flip":
            data[pos] ^= 1 << rng.randrange(8)
        elif op == "byte":
            data[pos] = rng.choice(INTERESTING_BYTES + (rng.randrange(256),))
        elif op == "truncate":
            del data[pos:]
        elif op == "garbage":
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24)))
        elif op == "duplicate":
            end = min(len(data), pos + rng.randrange(1, 64))
            data[end:end] = data[pos:end]
        else:  # a message-level mutation after flattening: cut a span out
            del data[pos:pos + rng.randrange(1, 16)]
    return bytes(flat())


# --- (a) mutated client sessions against one long-lived server -------------------------

SWEEP_CLIENT = size(1500, 20000)
SERVED = {"w": RNG.standard_normal((5, 7)).astype(np.float32),
          "big": RNG.standard_normal((64, 32)).astype(np.float32),
          "i16": np.arange(24, dtype=np.int16).reshape(4, 6)}


def _put_messages(sid: int, key: str, descriptor: bytes, data: bytes, frame: int = 16) -> list[bytes]:
    return ([ss.msg(w.TENSOR_PUT, sid, w.encode_tensor_put(key, descriptor, len(data)))]
            + [ss.msg(w.TENSOR_DATA, sid, w.encode_tensor_data(i, data[i:i + frame])) for i in range(0, len(data), frame)]
            + [ss.msg(w.TENSOR_DATA_END, sid)])


def client_sessions() -> list[list[bytes]]:
    """Valid client→server byte sequences (spec peers only)."""
    hello = ss.msg(w.CLIENT_HELLO, 1, w.encode_hello(max_message_size=1 << 20, capability_flags=w.CAP_PARALLEL_STREAMS,
                                                     layouts=(w.LAYOUT_ROW_MAJOR, (0xF3, b"\1\2"))))
    req = lambda sid, key, flags=0, layouts=(): ss.msg(w.TENSOR_REQUEST, sid, w.encode_tensor_request(
        key, layouts, w.DEVICE_CPU, 64, flags))
    i16 = SERVED["i16"]
    dense = _put_messages(3, "k-dense", w.dense_descriptor("int16", i16.shape), i16.tobytes())
    boxes = w.dim0_boxes(PART.shape, 2)
    descs = w.partition_descriptors("float32", PART.shape, boxes)
    composite = _put_messages(5, "k-part", descs[0], b"")
    for d, (o, s) in zip(descs[1:], boxes):
        composite += _put_messages(5, "k-part", d, ss.extract_box(PART.shape, 4, PART.tobytes(), o, s))
    return [
        [hello, req(1, "w"), ss.msg(w.PING, 2, b"ping")],
        [hello, req(3, "part", w.REQ_ALLOW_TRANSCODE, (w.LAYOUT_ROW_MAJOR,)), req(4, "w", 0, (w.LAYOUT_COLUMN_MAJOR,))],
        [hello, req(1, "big", w.REQ_PARALLEL_OK), ss.msg(w.PING, 9)],
        [hello] + dense + [req(4, "k-dense")],
        [hello] + composite + [req(6, "k-part")],
        [hello, ss.msg(w.ERROR, 1, w.encode_error(6, "bye")), ss.msg(w.PING, 2, b"x"), req(3, "nope")],
    ]


def _exchange(port: int, data: bytes) -> tuple[bytes, float]:
    """Send ``data``, end our direction, and read the server's answer until it closes."""
    start = time.monotonic()
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may have refused and closed already
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - start


SERVER_TYPES = {w.SERVER_HELLO, w.TENSOR_DESCRIPTOR, w.TENSOR_DATA, w.TENSOR_DATA_END, w.TENSOR_PUT_ACK, w.ERROR,
                w.PONG, w.PING}
INTERNAL = 0xF2


def _answer_faults(reply: bytes) -> list[str]:
    """What is wrong with a server's answer: every message whole, of a type a server sends, an
    ERROR decodable and never INTERNAL (an exception the server did not foresee)."""
    faults, pos = [], 0
    while pos < len(reply):
        if len(reply) - pos < w.HEADER_SIZE:
            return faults + [f"a header cut at byte {pos}"]
        kind, sid, n = w.decode_header(reply[pos:pos + w.HEADER_SIZE])
        payload = reply[pos + w.HEADER_SIZE:pos + w.HEADER_SIZE + n]
        if len(payload) < n:
            return faults + [f"a payload cut at byte {pos}"]
        if kind not in SERVER_TYPES or sid == 0:
            faults.append(f"message type 0x{kind:X} on stream {sid}")
        if kind == w.ERROR:
            try:
                code, text = w.decode_error(payload)
            except w.WireFormatError as exc:
                faults.append(f"an ERROR that does not decode: {exc}")
            else:
                if code == INTERNAL:
                    faults.append(f"ERROR INTERNAL: {text}")
        pos += w.HEADER_SIZE + n
    return faults


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def thread_exceptions():
    """Every exception that escapes a thread while the block runs."""
    caught, previous = [], threading.excepthook
    threading.excepthook = lambda args: caught.append((args.thread.name if args.thread else "?", args.exc_value))
    try:
        yield caught
    finally:
        threading.excepthook = previous


def _settle(server, threads: int, seconds: float = TIMEOUT) -> tuple[int, int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with server._lock:
            open_ = len(server._connections)
        if not open_ and threading.active_count() <= threads:
            break
        time.sleep(0.02)
    with server._lock:
        return len(server._connections), threading.active_count()


RSS_BOUND = 48 << 20
"""What the sweep may leave in the process: no connection keeps anything once closed, so what
stays is the bounded caches of decoded descriptors (signature.MAX_SIGNATURES compiled header
decoders, MAX_VALUES descriptors of at most MAX_VALUE_BYTES: a few MiB each), the store's
few accepted PUTs (each a small mapped file) and the allocator's retained arenas, well under
this.  A leak of one payload buffer (max_message_bytes, 1 MiB) or PUT buffer per mutated
session would be gigabytes past it."""


def test_mutated_client_sessions_leave_the_server_serving(tmp_path):
    path = tmp_path / "served.hrry"
    hs.save(path, {**SERVED, "part": hs.partition(PART, grid=(2, 1))})
    bases = client_sessions()
    rng = random.Random(0x5EED)
    with thread_exceptions() as escaped:
        with hs.serve([path], writable=tmp_path / "store", max_message_bytes=1 << 20, max_put_bytes=16 << 20,
                      idle_timeout=TIMEOUT, parallel_min_bytes=1024, max_connections=8) as server:
            threads = threading.active_count()
            for base in bases:  # the unmutated sessions are answered without fault
                reply, _ = _exchange(server.port, b"".join(base))
                assert not _answer_faults(reply) and reply[:4] == struct.pack("<I", w.SERVER_HELLO), reply[:64]
            faults, slowest, rss0 = [], 0.0, 0
            for n in range(SWEEP_CLIENT):
                if n == SWEEP_CLIENT // 10:
                    gc.collect()
                    rss0 = _rss()
                base = rng.choice(bases)
                data = mutate(rng, base, bases)
                reply, took = _exchange(server.port, data)
                slowest = max(slowest, took)
                for fault in _answer_faults(reply):
                    faults.append((n, fault, data[:96].hex()))
            gc.collect()
            grown = _rss() - rss0
            assert not faults, faults[:5]
            assert slowest < TIMEOUT, slowest
            with hs.connect(server.url, timeout=TIMEOUT) as session:  # still serving, and right
                np.testing.assert_array_equal(np.asarray(session.get("w")), SERVED["w"])
                np.testing.assert_array_equal(np.asarray(session.get("big", parallel=True)), SERVED["big"])
            with SpecClient(("127.0.0.1", server.port), timeout=TIMEOUT) as peer:
                assert isinstance(peer.hello(), dict)
                (t,) = peer.get("w", stream_id=5)
                assert t.data == SERVED["w"].tobytes()
            assert _settle(server, threads) == (0, threads)
    assert not escaped, escaped[:5]
    assert grown < RSS_BOUND, f"RSS grew by {grown / 2**20:.1f} MiB over {SWEEP_CLIENT} mutated sessions"


# --- (b) mutated server responses replayed to our client --------------------------------

SWEEP_SERVER = size(1500, 20000)


def _group_messages(sid: int) -> list[bytes]:
    """A group (int16 vector, then a nested partition): interchange.md § Composite Tensor Streaming."""
    vec = np.arange(5, dtype=np.int16)
    head, members = partition_parts()
    nested = ss.composite_messages(sid, head, members, frame_bytes=40)
    return ss.composite_messages(sid, w.group_head("int16", (5,), 2),
                                 [(w.dense_descriptor("int16", vec.shape), vec.tobytes()), nested])


def server_responses() -> dict:
    """Valid server→client byte sequences (hello, then the answer to one request), by what
    the client does."""
    head, members = partition_parts()
    return {
        "dense": [HELLO] + dense_messages(1),
        "partition": [HELLO] + ss.composite_messages(1, head, members, frame_bytes=40),
        "group": [HELLO] + _group_messages(1),
        "parallel": [HELLO] + ss.shard_descriptor_messages([1, 2], "float32", PART.shape, PART.tobytes(),
                                                           w.split_rows(6, 2), frame_bytes=40),
        "ping": [HELLO, ss.msg(w.PONG, 1, b"abc")],
        "put": [HELLO, ss.msg(w.TENSOR_PUT_ACK, 1)],
    }


def _do(session, what: str):
    if what == "ping":
        return session.ping(b"abc")
    if what == "put":
        return session.put("k", np.arange(6, dtype=np.int16))
    return session.get("k", parallel=what == "parallel")


def _canonical(item) -> list:
    """What a response means: per node in pre-order, element type, layout, shape, shard and the
    bytes of each buffer."""
    from hurray_schema.io.tensor import walk

    out = []
    for _, node in walk(item):
        d = node.descriptor
        shard = None if d.shard is None else (tuple(d.shard.parent_shape), tuple(d.shard.shard_offset))
        bufs = tuple(bytes(memoryview(b).cast("B")) for b in node.buffers) if isinstance(node, hs.Tensor) else ()
        out.append((int(d.type_tag), int(d.layout_tag), tuple(d.shape), shard, bufs))
    return out


class OracleRefused(Exception):
    """The independent decoder does not accept the stream."""


def _peer_node(t) -> tuple:
    p = t.parsed
    shard = None if p.shard is None else (tuple(p.shard.parent_shape), tuple(p.shard.shard_offset))
    bufs, pos = [], 0
    for n in p.buffer_sizes:
        bufs.append(t.data[pos:pos + n])
        pos += n
    return (p.type_tag, p.layout_tag, tuple(p.shape), shard, tuple(bufs))


def _without_keepalives(stream: bytes) -> bytes:
    """``stream`` less its whole PING and PONG messages: keepalives, which the project's readers
    (the stream reader's and the client's) let pass anywhere and the spec peer only between
    responses."""
    out, pos = [], 0
    while len(stream) - pos >= w.HEADER_SIZE:
        kind, _, n = w.decode_header(stream[pos:pos + w.HEADER_SIZE])
        end = pos + w.HEADER_SIZE + n
        if end > len(stream):
            break
        if kind not in (w.PING, w.PONG):
            out.append(stream[pos:end])
        pos = end
    return b"".join(out) + stream[pos:]


def oracle(stream: bytes, what: str):
    """What the spec peers read from ``stream`` (hello, then the answer): the canonical value,
    or :class:`OracleRefused`."""
    if what not in ("ping", "put"):
        stream = _without_keepalives(stream)
    a, b = socket.socketpair()
    try:
        a.sendall(stream)
        a.shutdown(socket.SHUT_WR)
        peer = SpecClient.__new__(SpecClient)
        peer.sock, peer.timeout, peer.max_message_size, peer.cross_machine = b, TIMEOUT, 1 << 16, True
        b.settimeout(TIMEOUT)
        try:
            kind, sid, payload = peer.recv()
            if kind != w.SERVER_HELLO:
                raise OracleRefused("no SERVER_HELLO")
            hello = w.decode_hello(payload)
            caps = hello["capability_flags"]
            if (hello["protocol_version"] != 1 or caps & w.CAP_RESERVED_MASK
                    or (caps & w.CAP_RDMA_GPUDIRECT and not caps & w.CAP_RDMA_DATA_PLANE)):
                raise OracleRefused("hello")
            if what == "ping":
                kind, sid, payload = peer.recv()
                if (kind, sid) != (w.PONG, 1):
                    raise OracleRefused("no PONG")
                return bytes(payload)
            if what == "put":
                return None
            items = peer.read_response(1)
        except (PeerClosed, PeerError, PeerViolation, w.WireFormatError, TimeoutError, OSError, ValueError) as exc:
            raise OracleRefused(repr(exc)) from None
        if items[0].total_shards > 1:
            first = items[0].parsed
            if w.TYPE_BITS.get(first.type_tag, 0) % 8:
                raise OracleRefused("a sub-byte shard")
            itemsize = w.element_bytes(first.type_tag, 1)
            try:
                merged = place_boxes(first.shard.parent_shape, itemsize,
                                     [(t.parsed.shard.shard_offset, t.parsed.shape, t.data) for t in items])
            except ValueError as exc:
                raise OracleRefused(repr(exc)) from None
            return [(first.type_tag, w.LAYOUT_ROW_MAJOR, tuple(first.shard.parent_shape), None, (merged,))]
        return [_peer_node(t) for t in items]
    finally:
        a.close()
        b.close()


def test_mutated_server_responses_raise_only_typed_errors():
    bases = server_responses()
    names = sorted(bases)
    others = list(bases.values())
    rng = random.Random(0xC0FFEE)
    state = {"stream": b""}

    def reply(conn, _payload):
        conn.send_raw(state["stream"])
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    expected = {}
    faults = []
    with thread_exceptions() as escaped, ss.SpecServer(lambda *a: None, hello_reply=reply, timeout=TIMEOUT) as server:
        url = f"hurray://127.0.0.1:{server.port}"

        def run(stream: bytes, what: str):
            state["stream"] = stream
            start = time.monotonic()
            try:
                with hs.connect(url, timeout=TIMEOUT, max_message_bytes=1 << 16, max_response_bytes=1 << 24) as s:
                    value = _do(s, what)
                outcome = ("value", value if what in ("ping", "put") else _canonical(value))
            except hs.HurraySchemaError as exc:
                outcome = ("raised", exc)
            except Exception as exc:  # noqa: BLE001 -- what the sweep looks for
                outcome = ("untyped", exc)
            return outcome, time.monotonic() - start

        for what in names:
            (kind, value), _ = run(b"".join(bases[what]), what)
            assert kind == "value", (what, value)
            assert value == oracle(b"".join(bases[what]), what), what
            expected[what] = value
        for n in range(SWEEP_SERVER):
            what = names[n % len(names)]
            stream = mutate(rng, bases[what], others)
            (kind, value), took = run(stream, what)
            if took > TIMEOUT + 1:
                faults.append((n, what, f"took {took:.1f} s", stream.hex()))
            if kind == "untyped":
                faults.append((n, what, repr(value), stream.hex()))
            if kind != "value":
                continue
            try:
                want = oracle(stream, what)
            except OracleRefused as refused:
                if str(refused) == "hello" or value != expected[what]:
                    faults.append((n, what, f"accepted what the peer refuses ({refused})", stream.hex()))
                continue
            if value != want:
                faults.append((n, what, "a value the bytes do not hold", stream.hex()))
    assert not faults, faults[:5]
    assert not escaped and not server.errors, (escaped[:3], server.errors[:3])


# --------------------------------------------------------------------------------------
# 3. Load
# --------------------------------------------------------------------------------------

CLIENTS = 64
LOAD_ROUNDS = size(2, 8)
LOAD = {"w": RNG.standard_normal((48, 40)).astype(np.float32),
        "big": RNG.standard_normal((256, 96)).astype(np.float32)}  # 96 KiB: sent in 4 shards


@pytest.fixture(scope="module")
def load_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("load")
    hs.save(folder / "load.hrry", {**LOAD, "part": hs.partition(LOAD["w"], grid=(3, 2))})
    with hs.serve([folder / "load.hrry"], writable=folder / "store", max_connections=CLIENTS + 8,
                  parallel_min_bytes=4096, parallel_shards=4, idle_timeout=30) as server:
        yield server


def _client_work(url: str, i: int, start: threading.Barrier) -> None:
    mine = np.arange(i, i + 300, dtype=np.float64).reshape(20, 15) * (i + 1)
    start.wait(timeout=60)
    with hs.connect(url, timeout=30) as session:
        for r in range(LOAD_ROUNDS):
            np.testing.assert_array_equal(np.asarray(session.get("w")), LOAD["w"])
            np.testing.assert_array_equal(session.get("part").materialize(), LOAD["w"])
            np.testing.assert_array_equal(np.asarray(session.get("big", parallel=True)), LOAD["big"])
            session.put(f"client-{i}", mine + r)
            np.testing.assert_array_equal(np.asarray(session.get(f"client-{i}")), mine + r)


def test_64_concurrent_clients(load_server):
    start = threading.Barrier(CLIENTS)
    failures: list = []

    def run(i):
        try:
            _client_work(load_server.url, i, start)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            failures.append((i, repr(exc)))

    threads = [threading.Thread(target=run, args=(i,), name=f"load-{i}") for i in range(CLIENTS)]
    began = time.monotonic()
    with thread_exceptions() as escaped:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    took = time.monotonic() - began
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert not failures, failures[:5]
    assert not escaped, escaped[:5]
    assert took < 90, took
    with hs.connect(load_server.url, timeout=TIMEOUT) as session:  # every PUT is there, whole
        for i in (0, CLIENTS // 2, CLIENTS - 1):
            want = np.arange(i, i + 300, dtype=np.float64).reshape(20, 15) * (i + 1) + LOAD_ROUNDS - 1
            np.testing.assert_array_equal(np.asarray(session.get(f"client-{i}")), want)


def test_concurrent_puts_of_one_key_serve_what_the_store_holds(tmp_path, monkeypatch):
    """Two PUTs of one key at once: the tensor served afterwards is the one the store holds (the
    first PUT is held, by the test, between opening its stored file and serving it)."""
    from hurray_schema.net import catalog

    second_done, paused = threading.Event(), threading.Event()

    class HeldOpen(catalog._Served):
        def __init__(self, path):
            super().__init__(path)
            if path.endswith("shared.hrry") and not paused.is_set():
                paused.set()
                second_done.wait(1.0)

    monkeypatch.setattr(catalog, "_Served", HeldOpen)
    hs.save(tmp_path / "s.hrry", {"w": DENSE})
    first, second = np.zeros(8, np.float32), np.ones(8, np.float32)
    with hs.serve([tmp_path / "s.hrry"], writable=tmp_path / "store") as server:
        def put_first():
            with hs.connect(server.url, timeout=TIMEOUT) as session:
                session.put("shared", first)

        pusher = threading.Thread(target=put_first)
        pusher.start()
        assert paused.wait(TIMEOUT)
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            session.put("shared", second)
        second_done.set()
        pusher.join(TIMEOUT)
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            served = np.asarray(session.get("shared"))
    stored = hs.read_file(tmp_path / "store" / "shared.hrry")["shared"].to_numpy()
    np.testing.assert_array_equal(served, stored)


def _busy_error(url: str):
    """What a connection that found no slot gets: ERROR 0xF0 (SERVER_BUSY) instead of
    SERVER_HELLO (interchange.md § Session Establishment), as a typed RemoteError."""
    with pytest.raises(hs.RemoteError) as info:
        hs.connect(url, timeout=TIMEOUT)
    return info.value


def test_connections_past_max_connections_wait_for_a_slot_until_their_handshake_deadline(tmp_path):
    """Past ``max_connections`` a connection waits for a slot; at its handshake deadline it is
    refused with SERVER_BUSY; a slot that frees meanwhile goes to the connection waiting longest."""
    path = tmp_path / "b.hrry"
    hs.save(path, {"w": LOAD["w"]})
    with hs.serve([path], max_connections=3, handshake_timeout=0.5) as server:
        held = [hs.connect(server.url, timeout=TIMEOUT) for _ in range(3)]
        try:
            for _ in range(size(3, 20)):
                began = time.monotonic()
                busy = _busy_error(server.url)
                assert busy.error_code == 0xF0 and type(busy) is hs.RemoteError and busy.offset == 0
                assert time.monotonic() - began >= 0.45  # it waited for its deadline, not refused at once
            with SpecClient(("127.0.0.1", server.port), timeout=TIMEOUT) as peer:  # as an independent peer sees it
                reply = peer.hello()
                assert isinstance(reply, PeerError) and reply.code == 0xF0
            for session in held:  # the sessions held are not disturbed
                np.testing.assert_array_equal(np.asarray(session.get("w")), LOAD["w"])
            got: list = []
            waiter = threading.Thread(target=lambda: got.append(hs.connect(server.url, timeout=TIMEOUT)))
            waiter.start()
            time.sleep(0.1)
            held.pop().close()  # its slot goes to the waiting connection, before that one's deadline
            waiter.join(TIMEOUT)
            (session,) = got
            with session:
                np.testing.assert_array_equal(np.asarray(session.get("w")), LOAD["w"])
        finally:
            for session in held:
                session.close()


def test_sequential_clients_each_find_the_one_slot(tmp_path):
    """``max_connections=1``: a client that closes cleanly leaves its slot to the next one, which
    never sees SERVER_BUSY (it waits while the closed connection's thread ends)."""
    path = tmp_path / "b.hrry"
    hs.save(path, {"w": LOAD["w"]})
    with hs.serve([path], max_connections=1) as server:
        for _ in range(size(100, 1000)):
            with hs.connect(server.url, timeout=TIMEOUT) as session:
                assert session.ping(b"x") == b"x"


def test_past_max_waiting_a_connection_is_refused_at_once(tmp_path):
    path = tmp_path / "b.hrry"
    hs.save(path, {"w": LOAD["w"]})
    with hs.serve([path], max_connections=1, max_waiting=0, handshake_timeout=30) as server:
        with hs.connect(server.url, timeout=TIMEOUT):
            began = time.monotonic()
            assert _busy_error(server.url).error_code == 0xF0
            assert time.monotonic() - began < 10  # long before the 30 s handshake deadline


def test_busy_refusals_under_load_do_not_disturb_sessions(tmp_path):
    """More connections at once than slots and places to wait: those past both are refused with
    SERVER_BUSY, every other one is served right (those that waited too)."""
    path = tmp_path / "b.hrry"
    hs.save(path, {"w": LOAD["w"]})
    slots, places, clients = 8, 8, 40
    results: list = []
    start = threading.Barrier(clients)

    def run(url):
        try:
            start.wait(timeout=60)
            with hs.connect(url, timeout=30) as session:
                np.testing.assert_array_equal(np.asarray(session.get("w")), LOAD["w"])
                time.sleep(0.5)  # hold the slot while the others arrive
                np.testing.assert_array_equal(np.asarray(session.get("w")), LOAD["w"])
            results.append("served")
        except hs.RemoteError as exc:
            results.append("busy" if exc.error_code == 0xF0 else repr(exc))
        except BaseException as exc:  # noqa: BLE001
            results.append(repr(exc))

    with hs.serve([path], max_connections=slots, max_waiting=places) as server:
        threads = [threading.Thread(target=run, args=(server.url,)) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert set(results) <= {"busy", "served"}, [r for r in results if r not in ("busy", "served")][:5]
    assert results.count("served") >= slots + places and results.count("busy") >= 1, results.count("served")


# --------------------------------------------------------------------------------------
# 4. A server killed while a client PUTs
# --------------------------------------------------------------------------------------

TEMPORARY = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{12}\.hrry-tmp\Z")
BIG_ELEMENTS = 50 * 2**20  # float32: 200 MiB


def _start(args) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "hurray_schema", "serve", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("serving hurray://"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[1]


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _writing_into(pid: int, folder: str) -> bool:
    """The process holds its temporary file in ``folder`` open: unnamed (``O_TMPFILE`` shows as
    ``folder/#inode (deleted)``) or named (``.NAME.PID.HEX.hrry-tmp``), not yet renamed."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        name = os.path.basename(target.removesuffix(" (deleted)"))
        if os.path.dirname(target) == folder and (name.startswith("#") or TEMPORARY.fullmatch(name)):
            return True
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc: Linux")
@pytest.mark.parametrize("moment", ["receiving", "writing"])
def test_server_killed_during_a_put_keeps_the_old_tensor(tmp_path, moment):
    served, store = tmp_path / "served.hrry", tmp_path / "store"
    hs.save(served, {"x": np.ones(4, np.float32)})
    old = np.arange(1000, dtype=np.float32) - 500
    proc, url = _start([served, "--port", "0", "--writable", store])
    try:
        with hs.connect(url, timeout=TIMEOUT) as session:
            session.put("weights", old)
        (stored,) = os.listdir(store)
        big = np.arange(BIG_ELEMENTS, dtype=np.float32)
        outcome: list = []

        def push():
            try:
                with hs.connect(url, timeout=60) as session:
                    session.put("weights", big)
                outcome.append("acknowledged")
            except BaseException as exc:  # noqa: BLE001 -- judged below
                outcome.append(exc)

        rss0 = _rss_of(proc.pid)
        pusher = threading.Thread(target=push)
        pusher.start()
        deadline = time.monotonic() + 60
        caught = False
        while not caught and time.monotonic() < deadline and pusher.is_alive():
            if moment == "receiving":
                caught = _rss_of(proc.pid) - rss0 > big.nbytes // 2
            else:
                caught = _writing_into(proc.pid, str(store))
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        pusher.join(60)
        assert caught and not pusher.is_alive(), f"the moment ({moment}) was not seen"
        assert len(outcome) == 1 and isinstance(outcome[0], hs.HurraySchemaError), outcome  # never acknowledged
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    left = sorted(os.listdir(store))
    assert [n for n in left if not TEMPORARY.fullmatch(n)] == [stored], left
    np.testing.assert_array_equal(hs.read_file(store / stored)["weights"].to_numpy(), old)  # the old file, whole
    if moment == "writing":  # the kill landed while the temporary was open, unnamed: nothing named remains
        assert left == [stored], left

    proc, url = _start([served, "--port", "0", "--writable", store])
    try:
        newer = np.linspace(0, 1, 3 << 20, dtype=np.float32)
        with hs.connect(url, timeout=TIMEOUT) as session:
            np.testing.assert_array_equal(np.asarray(session.get("weights")), old)
            session.put("weights", newer)
            np.testing.assert_array_equal(np.asarray(session.get("weights")), newer)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert sorted(os.listdir(store)) == [stored]  # a temporary a dead writer left is swept by the next write
    np.testing.assert_array_equal(hs.read_file(store / stored)["weights"].to_numpy(), newer)
