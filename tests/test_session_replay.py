"""Session vectors replayed at live peers (issue #48 item 3).

* Every passing session, its client direction played at our server (serving the corpus'
  ``session.served.hrry`` with the manifest's options), draws the recorded server direction,
  byte for byte.
* Every violating session whose fault is in the client's direction draws the ERROR code the spec
  requires for that fault (the table below is typed from ``interchange.md § Error Codes`` and
  § Session Establishment, not taken from the recordings).
* Every violating session whose fault is in the server's direction, played to our client by
  the recorded-server player, makes the client raise the manifest's rule at the manifest's offset.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import hurray_schema as hs
from hurray_schema.cli import main
from hurray_schema.conformance import MANIFEST, write_corpus
from hurray_schema.conformance.replay import RecordedServer, replay_at
from hurray_schema.net.messages import LayoutEntry
from support.corpus import corpus

INVALID_MESSAGE, PROTOCOL_VERSION_MISMATCH, MESSAGE_TOO_LARGE = 0x06, 0x01, 0x07
SPEC_ERROR_CODE = {
    "session.hello.version": PROTOCOL_VERSION_MISMATCH,
    "session.message.size": MESSAGE_TOO_LARGE,
}
"""The ERROR code the spec names for a client's fault; every other fault of a message is INVALID_MESSAGE."""

CLIENT_CALLS = {
    "session.device.selection": ({"devices": ("cpu", "cuda")}, lambda s: s.get("x")),
    "session.shards.consistency": ({}, lambda s: s.get("x", parallel=True)),
    "session.layouts.extension_skip": ({"layouts": [LayoutEntry(0xF3, b"\x01\x02\x03"), LayoutEntry(0x01)]},
                                       lambda s: s.get("x")),
}
"""How our client is driven to send what a vector's client direction holds (default: ``get("x")``)."""

NOT_PLAYED_TO_OUR_CLIENT = {
    "session.shm.segments": "its server direction carries a memory file beside SHM_DATA (SCM_RIGHTS) over a Unix "
                            "socket, which the TCP player cannot pass; audit and the struct peers judge it",
    "session.put.accepted": "its client direction pushes a buffer aligned on 48 bytes, which our writers cannot "
                            "build; the client's own judgement of an ACK is test_net_rules.py::test_put_accepted_client_side",
}


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    out = tmp_path_factory.mktemp("session-vectors")
    write_corpus(out, reference=False, corpus=corpus())
    return out


@pytest.fixture(scope="module")
def manifest(vectors) -> dict:
    return json.loads((vectors / MANIFEST).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def served(vectors, manifest, tmp_path_factory):
    """Our server serving the corpus' file as the recording server did, on TCP and a Unix socket."""
    sessions = manifest["sessions"]
    scratch = tmp_path_factory.mktemp("replay-server")
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in sessions["server_options"].items()}
    path = vectors / sessions["served_file"]
    with hs.serve([path], writable=scratch / "store", **options) as tcp, \
            hs.serve([path], unix=str(scratch / "s.sock"), writable=scratch / "store-unix", **options) as unix:
        yield {"tcp": (tcp.host, tcp.port), "unix": str(scratch / "s.sock")}


def _sessions(manifest, role: str, direction: str) -> list[dict]:
    """The manifest entries of ``role`` in ``direction`` (one per session)."""
    return [e for e in manifest["vectors"] if e.get("session") and e["role"] == role and e["direction"] == direction]


def _address(served, name: str):
    return served["unix"] if "-unix" in name else served["tcp"]


def test_every_passing_session_reproduces_the_recorded_server_direction(vectors, manifest, served):
    passing = _sessions(manifest, "pass", "client")
    assert len(passing) >= 20
    for entry in passing:
        result = replay_at(vectors / entry["session"], _address(served, entry["session"]))
        assert result.agrees, (entry["session"], result.differences)
        assert result.same_bytes, entry["session"]


def test_every_client_fault_draws_the_error_code_the_spec_requires(vectors, manifest, served):
    faults = _sessions(manifest, "fail", "client")
    assert len(faults) >= 14
    for entry in faults:
        result = replay_at(vectors / entry["session"], _address(served, entry["session"]))
        required = SPEC_ERROR_CODE.get(entry["rule_id"], INVALID_MESSAGE)
        assert result.error_codes()[:1] == [required] == [entry["error_code"]], entry["session"]
        assert result.agrees, (entry["session"], result.differences)


def test_every_server_fault_played_to_our_client_raises_the_manifest_rule(vectors, manifest):
    faults = [e for e in _sessions(manifest, "fail", "server") if e["rule_id"] not in NOT_PLAYED_TO_OUR_CLIENT]
    assert len(faults) >= 6
    for entry in faults:
        options, call = CLIENT_CALLS.get(entry["rule_id"], ({}, lambda s: s.get("x")))
        with RecordedServer(vectors / entry["session"]) as player:
            host, port = player.address
            with pytest.raises(hs.SpecViolation) as info:
                with hs.connect(f"hurray://{host}:{port}", timeout=5, **options) as session:
                    call(session)
        expected = entry["first_finding"]
        assert (info.value.rule_id, info.value.offset) == (expected["rule_id"], expected["offset"]), entry["session"]


def test_the_sessions_left_out_of_the_client_replay_have_vectors(manifest):
    covered = {e["rule_id"] for e in _sessions(manifest, "fail", "server")}
    assert set(NOT_PLAYED_TO_OUR_CLIENT) <= covered


def invoke(args):
    return CliRunner().invoke(main, args)


def test_replay_command_over_the_folder(vectors, served):
    result = invoke( ["replay", str(vectors), "--server", "%s:%d" % served["tcp"], "--unix", served["unix"]])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and all(line.endswith("agrees (the same bytes)") for line in lines), result.output


def test_replay_command_reports_a_server_that_answers_otherwise(vectors, tmp_path):
    """A server serving other data draws other answers: the command says where and exits 1."""
    import numpy as np

    other = tmp_path / "other.hrry"
    hs.save(other, {"x": np.zeros((2, 2), np.float64)})
    with hs.serve([other], max_message_bytes=1 << 16) as srv:
        result = invoke(["replay", os.fspath(vectors / "session.request.alignment.pass"),
                               "--server", f"{srv.host}:{srv.port}"])
    assert result.exit_code == 1, result.output
    assert "differs" in result.output and "audit" not in result.output.split("differs")[0]


def test_a_server_that_never_stops_sending_is_cut_at_the_replay_budget(vectors):
    """A hostile server announcing a 4 GiB message and streaming it: the replay reads at most twice
    the recording plus a slack, and reports the difference instead of holding what it is sent."""
    import socket
    import struct
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def flood():
        conn, _ = listener.accept()
        with conn:
            try:
                conn.sendall(struct.pack("<III", 0x02, 1, 0xFFFFFFFF))
                while not stop.is_set():
                    conn.sendall(bytes(1 << 16))
            except OSError:
                pass

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        base = vectors / "session.request.alignment.pass"
        recorded = (vectors / "session.request.alignment.pass.server.msgs").read_bytes()
        result = replay_at(base, listener.getsockname()[:2], timeout=30)
    finally:
        stop.set()
        listener.close()
        thread.join(5)
    assert len(result.received) <= 2 * len(recorded) + (1 << 20)
    assert not result.agrees and "messages (type, stream)" in result.differences[0]


def test_a_connection_from_elsewhere_during_the_recording_is_caught(monkeypatch):
    """Recordings are matched to the sessions played in order: a client the generator did not start
    would shift them, and the generation says so instead of writing vectors under the wrong names."""
    from hurray_schema.conformance import sessions

    real = sessions._play

    def with_a_stranger(address, data, timeout=10.0):
        real(address, sessions.hello())
        return real(address, data, timeout)

    monkeypatch.setattr(sessions, "_play", with_a_stranger)
    with pytest.raises(hs.HurraySchemaError, match="another process connected"):
        sessions.record_sessions(sessions.session_cases()[:1])


def test_replay_command_plays_the_server_direction_to_a_client(vectors, manifest):
    """``replay NAME --client-port PORT``: the next client to connect gets the recorded server
    direction, and our client raises the manifest's rule at the manifest's offset."""
    import socket
    import threading

    entry = next(e for e in _sessions(manifest, "fail", "server") if e["rule_id"] == "session.memory_class")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("result", invoke(
        ["replay", os.fspath(vectors / entry["session"]), "--client-port", str(port)])), daemon=True)
    thread.start()
    fault = None
    for _ in range(400):  # until the command listens: a refused connection is tried again
        try:
            with hs.connect(f"hurray://127.0.0.1:{port}", timeout=5) as session:
                session.get("x")
        except hs.SpecViolation as exc:
            fault = exc
            break
        except (OSError, hs.HurraySchemaError):
            threading.Event().wait(0.025)
    thread.join(10)
    assert done["result"].exit_code == 0, done["result"].output
    expected = entry["first_finding"]
    assert fault is not None and (fault.rule_id, fault.offset) == (expected["rule_id"], expected["offset"])
