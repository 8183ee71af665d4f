"""The session vectors of the conformance corpus, re-read by the independent judge of
tests/support/peers/spec_session.py (written from the spec with ``struct``, never importing the
project).

For every session vector whose rule the judge covers, the judge must place the fault where the
manifest does: the violating direction (``fail``) gives the manifest's rule at the manifest's
``first_finding`` offset, and every other file of the rule's sessions (``pass``, and the ``peer``
direction of a violating session) gives nothing, each direction judged by its receiver with the
other direction beside it.  The corpus is written as ``hurray-schema vectors`` writes it and read
back from ``manifest.json``: the judge sees what a third party sees.

The judge is first tried on sessions built here from the spec's tables (``spec_wire``), so that
its agreement with the corpus is not its only evidence.
"""

from __future__ import annotations

import json
import struct

import pytest

from support.corpus import corpus
from support.peers import spec_server as ss
from support.peers import spec_session
from support.peers import spec_wire as w

MIN_RULES = 15
"""The sample must reach this many distinct rules (a judge that covers nothing cannot pass)."""
CLIENT_SUFFIX, SERVER_SUFFIX = ".client.msgs", ".server.msgs"


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    """``(folder, manifest)`` of the corpus written to a temporary folder."""
    from hurray_schema.conformance import MANIFEST, write_corpus

    folder = tmp_path_factory.mktemp("session-vectors")
    write_corpus(folder, reference=False, corpus=corpus())
    return folder, json.loads((folder / MANIFEST).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sample(vectors):
    """The manifest's session entries whose rule the judge covers."""
    _, manifest = vectors
    return [e for e in manifest["vectors"] if e["kind"] == "session" and e["rule_id"] in spec_session.COVERED]


def _other_direction(name: str) -> str:
    if name.endswith(CLIENT_SUFFIX):
        return name[: -len(CLIENT_SUFFIX)] + SERVER_SUFFIX
    assert name.endswith(SERVER_SUFFIX), name
    return name[: -len(SERVER_SUFFIX)] + CLIENT_SUFFIX


def _judged(vectors, entry) -> tuple | None:
    """The judge's verdict on ``entry``'s file: its receiver reads it with the other direction of
    its session beside it; a server reads with the limit the recording server was configured with."""
    folder, manifest = vectors
    data = (folder / entry["file"]).read_bytes()
    peer = (folder / _other_direction(entry["file"])).read_bytes()
    limit = manifest["sessions"]["server_options"]["max_message_bytes"] if entry["receiver"] == "server" else None
    return spec_session.judge(data, entry["receiver"], peer, max_message_size=limit)


def _expected(entry) -> tuple | None:
    found = entry["first_finding"]
    return None if found is None else (found["rule_id"], found["offset"])


# --------------------------------------------------------------------------------------
# The judge on sessions built here, from the spec's tables (spec_wire), not from the corpus
# --------------------------------------------------------------------------------------

DATA = bytes(range(48))
"""The bytes of a float32 (3, 4) tensor."""


def _hello(**fields) -> bytes:
    return w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello(**fields))


def _server_hello(**fields) -> bytes:
    return w.encode_message(w.SERVER_HELLO, 1, w.encode_hello(**fields))


def _request(stream: int = 3, **fields) -> bytes:
    return w.encode_message(w.TENSOR_REQUEST, stream, w.encode_tensor_request("x", **fields))


def _tensor(stream: int = 3, **placement) -> bytes:
    return b"".join(ss.tensor_messages(stream, w.dense_descriptor("float32", (3, 4), **placement), DATA))


def _shards(rows) -> bytes:
    return b"".join(ss.shard_descriptor_messages([3, 4], "float32", (3, 4), DATA, rows, interleave=False))


def _at_second(data: bytes, kind: int) -> int:
    """The offset of the second message of type ``kind`` in ``data``."""
    at, seen = 0, 0
    while at < len(data):
        t, _, n = w.decode_header(data[at:at + w.HEADER_SIZE])
        if t == kind:
            seen += 1
            if seen == 2:
                return at
        at += w.HEADER_SIZE + n
    raise AssertionError("no second message of that type")


CLIENT = _hello() + _request()
PARALLEL_CLIENT = _hello() + _request(request_flags=w.REQ_PARALLEL_OK)
SERVER = _server_hello(capability_flags=w.CAP_PARALLEL_STREAMS)


def _client_cases():
    """``(name, server direction, client direction, expected)``: what the client judges."""
    bad_text = w.encode_message(w.ERROR, 3, struct.pack("<II", w.ERR_UNKNOWN_TENSOR, 3) + b"a\xc3(")
    gap = SERVER + _shards([(0, 1), (2, 3)])
    return [
        ("clean", SERVER + _tensor(), CLIENT, None),
        ("clean parallel", SERVER + _shards([(0, 2), (2, 3)]), PARALLEL_CLIENT, None),
        ("cpu fallback of rule 4", _server_hello(devices=(0, 1)) + _tensor(),
         _hello(devices=(0, 1)) + _request(preferred_device=w.DEVICE_CUDA), None),
        ("newer server version", _server_hello(protocol_version=2), CLIENT, (spec_session.HELLO_VERSION, 12)),
        ("reserved server capability", _server_hello(capability_flags=1 << 5), CLIENT,
         (spec_session.CAPABILITIES_RESERVED, 20)),
        ("error text not utf-8", SERVER + bad_text, CLIENT, (spec_session.KEY_UTF8, len(SERVER) + 12 + 8 + 1)),
        ("ack without a put", SERVER + w.encode_message(w.TENSOR_PUT_ACK, 9), CLIENT,
         (spec_session.PUT_FLOW, len(SERVER))),
        ("request from the server", SERVER + _request(), CLIENT, (spec_session.MESSAGE_DIRECTION, len(SERVER))),
        ("shards leave a gap", gap, PARALLEL_CLIENT, (spec_session.SHARDS_CONSISTENCY,
                                                      _at_second(gap, w.TENSOR_DESCRIPTOR))),
        ("shards unasked", SERVER + _shards([(0, 2), (2, 3)]), CLIENT, (spec_session.SHARDS_REQUESTED, len(SERVER))),
        ("host-pinned memory class", SERVER + _tensor(memory_class=w.MEM_HOST_PINNED), CLIENT,
         (spec_session.MEMORY_CLASS, len(SERVER) + 12)),
        ("too large for the client", SERVER + w.encode_message(w.PING, 5, bytes(65)),
         _hello(max_message_size=64) + _request(), (spec_session.MESSAGE_SIZE, len(SERVER) + 8)),
    ]


def _server_cases():
    """``(name, client direction, expected)``: what the server judges (its limit: 1 KiB)."""
    put = w.encode_message(w.TENSOR_PUT, 9, w.encode_tensor_put("k", w.dense_descriptor("float32", (3, 4)), 48))
    data = w.encode_message(w.TENSOR_DATA, 9, w.encode_tensor_data(0, DATA))
    end = w.encode_message(w.TENSOR_DATA_END, 9)
    error = w.encode_message(w.ERROR, 3, w.encode_error(w.ERR_INVALID_MESSAGE, "gives up"))
    twice = _hello() + _hello()
    return [
        ("clean put", _hello() + put + data + end, None),
        ("hello twice", twice, (spec_session.HELLO_FIRST, _at_second(twice, w.CLIENT_HELLO))),
        ("ping on a stream the client closed", _hello() + error + w.encode_message(w.PING, 3),
         (spec_session.ERROR_CLOSES, len(_hello() + error))),
        ("descriptor from the client", _hello() + _tensor(), (spec_session.MESSAGE_DIRECTION, len(_hello()))),
        ("request cut short", _hello() + w.encode_message(w.TENSOR_REQUEST, 3, b"\x05\x00\x00\x00x"),
         (spec_session.PAYLOAD_LENGTH, len(_hello()) + 8)),
        # two faults in one request: the one placed at the earlier byte is reported (spec_session docstring)
        ("misaligned request with reserved flags", _hello() + _request(min_alignment=3, request_flags=1 << 9),
         (spec_session.REQUEST_ALIGNMENT, len(_hello()) + 12 + 4 + 1 + 2 + 1)),
        ("too large for the server", _hello() + w.encode_header(w.PING, 5, 1025),
         (spec_session.MESSAGE_SIZE, len(_hello()) + 8)),
    ]


@pytest.mark.parametrize("name, data, peer, expected", _client_cases(), ids=[c[0] for c in _client_cases()])
def test_the_judge_as_client(name, data, peer, expected):
    assert spec_session.judge(data, "client", peer) == expected


@pytest.mark.parametrize("name, data, expected", _server_cases(), ids=[c[0] for c in _server_cases()])
def test_the_judge_as_server(name, data, expected):
    peer = _server_hello(max_message_size=1 << 20)
    assert spec_session.judge(data, "server", peer, max_message_size=1024) == expected


# --------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------


def test_the_sample_is_not_empty_and_spans_the_rules(sample):
    rules = {e["rule_id"] for e in sample if e["role"] == "fail"}
    assert len(rules) >= MIN_RULES, sorted(rules)
    for rule in rules:  # every rule of the sample has both sessions
        roles = {e["role"] for e in sample if e["rule_id"] == rule}
        assert roles == {"pass", "fail", "peer"}, (rule, roles)


def test_the_direction_and_receiver_of_each_file_agree_with_its_name(sample):
    for entry in sample:
        assert entry["file"] == entry["session"] + (CLIENT_SUFFIX if entry["direction"] == "client" else SERVER_SUFFIX)
        assert entry["receiver"] == ("server" if entry["direction"] == "client" else "client")


def test_each_violating_direction_fires_the_manifests_rule_at_the_manifests_offset(vectors, sample):
    wrong = []
    for entry in (e for e in sample if e["role"] == "fail"):
        expected = _expected(entry)
        assert expected is not None and expected[0] == entry["rule_id"], entry["file"]
        got = _judged(vectors, entry)
        if got != expected:
            wrong.append((entry["file"], expected, got))
    assert wrong == []


def test_the_passing_sessions_and_the_peer_directions_are_clean(vectors, sample):
    wrong = []
    for entry in (e for e in sample if e["role"] != "fail"):
        assert _expected(entry) is None, entry["file"]
        got = _judged(vectors, entry)
        if got is not None:
            wrong.append((entry["file"], entry["role"], got))
    assert wrong == []


def test_the_judge_needs_the_peer_where_the_spec_says_so(vectors, sample):
    """A client-side rule that depends on what the client sent is not judged without it: the
    placement, memory class and shard rules read the client's hello and requests."""
    folder, _ = vectors
    needs_peer = {spec_session.DEVICE_ACCEPT, spec_session.DEVICE_SELECTION, spec_session.MEMORY_CLASS}
    checked = 0
    for entry in (e for e in sample if e["role"] == "fail" and e["rule_id"] in needs_peer):
        data = (folder / entry["file"]).read_bytes()
        assert spec_session.judge(data, entry["receiver"], None) is None, entry["file"]
        checked += 1
    assert checked
