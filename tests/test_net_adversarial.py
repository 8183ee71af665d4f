"""The transport tried as an attacker would (README § Limits and guarantees): every deadline and
budget of the server and the client, held on loopback against peers built from the spec's tables
(:mod:`support.peers`) and raw sockets.

1. Slowloris: hellos and messages that trickle are cut at their deadline, and do not keep a
   legitimate client waiting past the handshake deadline; a steady but slow message passes.
2. Length bombs: declared lengths commit no memory (the server's RSS, measured in a process of
   its own); PUT data in flight is bounded for the whole server; shared-memory PUTs count their
   segment's real size; stores have item and byte limits; closed streams cost bounded memory.
3. Files that shrink: under the server (a typed ERROR, frames never shorter than declared, the
   session goes on) and under a shared-memory client (no SIGBUS).
4. Hostile servers against the client: a PING flood, a trickle, a stall, huge declared sizes.
5. Descriptors: a store of many keys under a low descriptor limit; stray descriptors closed.
6. The smaller defects: the transcode fallback, injective store names, TLS busy refusals.

Loops are bounded (:mod:`support.sizes`); every socket, process and thread is closed again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from support.peers import spec_server as ss
from support.peers import spec_wire as w
from support.peers.spec_client import PeerClosed, SpecClient
from support.sizes import size

import hurray_schema as hs
from hurray_schema.net.catalog import store_file_name
from hurray_schema.net.options import limits_table

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, memfd and SCM_RIGHTS: Linux")

TIMEOUT = 10.0
MiB, GiB = 1 << 20, 1 << 30
HELLO = w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello())
A = np.arange(48, dtype=np.float32).reshape(6, 8)


# --------------------------------------------------------------------------------------
# Helpers: a server in a process of its own, raw connections
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def server_process(*args: str, descriptors: int = None):
    """``hurray-schema serve ARGS --port 0`` in a process of its own (its RSS is its own);
    yields ``(process, port)``; stopped by SIGTERM, which it must obey."""
    def limit():
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    proc = subprocess.Popen([sys.executable, "-m", "hurray_schema", "serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving hurray://"), (line, proc.stderr.read() if proc.poll() is not None else "")
        yield proc, int(line.rsplit(":", 1)[1])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def rss(pid: int) -> int:
    """The resident memory of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def descriptors_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def raw(port: int, timeout: float = TIMEOUT) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_message(sock: socket.socket) -> tuple[int, int, bytes]:
    """One whole message, its payload exactly as long as its header says (else an error)."""
    head = _exactly(sock, w.HEADER_SIZE)
    kind, sid, n = w.decode_header(head)
    return kind, sid, _exactly(sock, n)


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise PeerClosed(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def error_of(message: tuple[int, int, bytes]) -> int:
    kind, _, payload = message
    assert kind == w.ERROR, w.message_type_name(kind)
    return w.decode_error(payload)[0]


def settled_rss(pid: int) -> int:
    """RSS once the process is quiet (two readings 0.2 s apart agree within 1 MiB)."""
    last = rss(pid)
    for _ in range(25):
        time.sleep(0.2)
        now = rss(pid)
        if abs(now - last) < MiB:
            return now
        last = now
    return last


@pytest.fixture
def served_file(tmp_path):
    path = tmp_path / "s.hrry"
    hs.save(path, {"w": A})
    return path


# --------------------------------------------------------------------------------------
# 1. Slowloris
# --------------------------------------------------------------------------------------


def _trickle(socks: list, stop: threading.Event, every: float) -> None:
    """One byte of a CLIENT_HELLO to each socket every ``every`` seconds, until ``stop``."""
    i = 0
    while not stop.wait(every):
        for sock in socks:
            try:
                sock.send(HELLO[i % len(HELLO) : i % len(HELLO) + 1])
            except OSError:
                pass
        i += 1


def test_trickling_hellos_do_not_keep_a_legitimate_client_past_the_handshake_deadline(served_file):
    """64 connections that trickle their hello hold every slot (64, the default); a legitimate
    GET arriving after them is served within the handshake deadline, and the tricklers are cut
    there with ERROR TIMEOUT (0xF3)."""
    deadline = 1.5
    with hs.serve([served_file], handshake_timeout=deadline) as server:
        socks = [raw(server.port) for _ in range(64)]
        stop = threading.Event()
        trickler = threading.Thread(target=_trickle, args=(socks, stop, 0.3))
        trickler.start()
        try:
            time.sleep(0.2)
            began = time.monotonic()
            with hs.connect(server.url, timeout=TIMEOUT) as session:
                np.testing.assert_array_equal(np.asarray(session.get("w")), A)
            assert time.monotonic() - began < deadline + 1.0
            codes = set()
            for sock in socks[:8]:
                sock.settimeout(deadline + 2)
                try:
                    codes.add(error_of(read_message(sock)))
                except (PeerClosed, ConnectionError, socket.timeout):
                    codes.add(None)
            assert codes == {0xF3}, codes
        finally:
            stop.set()
            trickler.join()
            for sock in socks:
                sock.close()


def _put_header(sid: int, key: str, desc: bytes, total: int) -> bytes:
    return w.encode_message(w.TENSOR_PUT, sid, w.encode_tensor_put(key, desc, total))


def test_a_trickled_message_is_cut_at_its_deadline(tmp_path):
    """After its hello, a frame whose bytes trickle (a byte every 0.2 s, far below ``min_rate``)
    ends the connection with ERROR TIMEOUT once ``message_timeout`` passed; a frame that is slow
    but keeps ``min_rate`` goes on past ``message_timeout`` and is stored."""
    data = np.arange(64 * 1024, dtype=np.float32)  # 256 KiB
    desc = w.dense_descriptor("float32", data.shape)
    with hs.serve([], writable=tmp_path / "store", message_timeout=1.0, min_rate=256 * 1024) as server:
        with raw(server.port) as sock:
            sock.sendall(HELLO)
            read_message(sock)
            sock.sendall(_put_header(3, "slow", desc, data.nbytes))
            frame = w.encode_message(w.TENSOR_DATA, 3, w.encode_tensor_data(0, data.tobytes()))
            began = time.monotonic()
            try:
                for byte in range(40):
                    sock.send(frame[byte : byte + 1])
                    time.sleep(0.2)
                    if time.monotonic() - began > 4:
                        break
            except OSError:
                pass
            sock.settimeout(TIMEOUT)
            assert error_of(read_message(sock)) == 0xF3
            assert time.monotonic() - began < 1.0 + 2.0
        with raw(server.port) as sock:  # 512 KiB/s for 2 s: twice min_rate, past message_timeout
            sock.sendall(HELLO)
            read_message(sock)
            sock.sendall(_put_header(3, "steady", desc, data.nbytes))
            for start in range(0, len(frame), 32 * 1024):
                sock.sendall(frame[start : start + 32 * 1024])
                time.sleep(1 / 16)  # 32 KiB per 1/16 s
            sock.sendall(w.encode_message(w.TENSOR_DATA_END, 3))
            kind, sid, _ = read_message(sock)
            assert (kind, sid) == (w.TENSOR_PUT_ACK, 3)
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            np.testing.assert_array_equal(np.asarray(session.get("steady")), data)


def test_a_client_that_reads_slowly_is_cut_at_its_answers_deadline(tmp_path):
    """The answer to a GET has a deadline of its own from its first byte sent (``message_timeout``
    plus a second per ``min_rate`` bytes): a client that asks for 64 MiB and reads a few KiB at a
    time does not keep its slot -- the server closes the connection and the one slot serves the
    next client while the slow one still reads what was queued; the answer ends cut short."""
    path = tmp_path / "big.hrry"
    hs.save(path, {"big": np.ones(16 * MiB, np.float32)})
    with hs.serve([path], message_timeout=1.0, min_rate=16 * MiB, max_connections=1) as server:
        with raw(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            sock.sendall(HELLO)
            read_message(sock)
            sock.sendall(w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request("big")))
            got = 0
            for _ in range(20):  # 80 KiB/s for a second
                got += len(sock.recv(4096))
                time.sleep(0.05)
            with hs.connect(server.url, timeout=TIMEOUT) as session:  # the one slot is free again
                assert session.ping(b"next") == b"next"
            while chunk := sock.recv(1 << 20):  # what was queued before the cut, then the end
                got += len(chunk)
    assert got < 16 * MiB


def test_a_connection_silent_past_idle_timeout_is_closed(served_file):
    with hs.serve([served_file], idle_timeout=0.5) as server:
        with raw(server.port) as sock:
            sock.sendall(HELLO)
            read_message(sock)
            sock.settimeout(TIMEOUT)
            assert sock.recv(1) == b""  # closed at a boundary: nothing to say


# --------------------------------------------------------------------------------------
# 2. Length bombs and budgets
# --------------------------------------------------------------------------------------


def test_hello_headers_declaring_64_mib_commit_nothing(served_file):
    """32 connections each send a 12-byte CLIENT_HELLO header declaring 64 MiB (and one byte):
    refused at once past ``max_hello_bytes``; raised to 64 MiB, each payload's buffer grows only
    with what arrives.  The server's RSS rises by less than 64 MiB in all."""
    declared = w.encode_header(w.CLIENT_HELLO, 1, 64 * MiB - 1) + b"\1"
    for extra in ([], ["--max-hello-bytes", "64M"]):
        with server_process(str(served_file), *extra) as (proc, port):
            before = settled_rss(proc.pid)
            socks = [raw(port) for _ in range(32)]
            try:
                for sock in socks:
                    sock.sendall(declared)
                time.sleep(0.5)
                grown = settled_rss(proc.pid) - before
                if not extra:
                    assert {error_of(read_message(s)) for s in socks} == {w.ERR_MESSAGE_TOO_LARGE}
            finally:
                for sock in socks:
                    sock.close()
            assert grown < 64 * MiB, grown


def test_a_put_declaring_1_gib_commits_nothing(tmp_path):
    """About 110 bytes -- a hello, then a TENSOR_PUT declaring a 1 GiB buffer, no data -- commit
    less than 64 MiB of the server's memory (its buffers take pages as frames write them)."""
    desc = w.dense_descriptor("uint8", (GiB,))
    put = _put_header(3, "bomb", desc, GiB)
    hs.save(tmp_path / "s.hrry", {"w": A})
    with server_process(str(tmp_path / "s.hrry"), "--writable", str(tmp_path / "store")) as (proc, port):
        before = settled_rss(proc.pid)
        socks = [raw(port) for _ in range(4)]
        try:
            for sock in socks:
                sock.sendall(HELLO + put)
                read_message(sock)
            grown = settled_rss(proc.pid) - before
        finally:
            for sock in socks:
                sock.close()
    assert len(put) < 120 and grown < 64 * MiB, grown


def _end(sid: int) -> bytes:
    return w.encode_message(w.TENSOR_DATA_END, sid)


def _frames(sid: int, data: bytes, frame: int = 256 * 1024) -> bytes:
    return b"".join(w.encode_message(w.TENSOR_DATA, sid, w.encode_tensor_data(i, data[i : i + frame]))
                    for i in range(0, len(data), frame))


def test_put_data_in_flight_is_bounded_for_the_whole_server(tmp_path):
    """``max_inflight_bytes`` (1 MiB here) bounds the PUT data held across connections: a second
    connection's PUT that would pass it gets SERVER_BUSY on its stream; once the first is stored,
    the budget is back."""
    data = np.arange(192 * 1024, dtype=np.float32).tobytes()  # 768 KiB
    desc = w.dense_descriptor("float32", (192 * 1024,))
    with hs.serve([], writable=tmp_path / "store", max_inflight_bytes=MiB) as server:
        with raw(server.port) as one, raw(server.port) as two:
            for sock in (one, two):
                sock.sendall(HELLO)
                read_message(sock)
            one.sendall(_put_header(3, "one", desc, len(data)) + _frames(3, data))  # all but its end
            time.sleep(0.3)
            two.sendall(_put_header(3, "two", desc, len(data)) + _frames(3, data) + _end(3))
            assert error_of(read_message(two)) == 0xF0
            one.sendall(_end(3))
            assert read_message(one)[0] == w.TENSOR_PUT_ACK
            two.sendall(_put_header(5, "two", desc, len(data)) + _frames(5, data) + _end(5))
            assert read_message(two)[:2] == (w.TENSOR_PUT_ACK, 5)
        assert server.inflight.used == 0


def test_a_connection_holds_at_most_max_put_streams_open(tmp_path):
    """Composite heads that never get their members keep their streams open: past
    ``max_put_streams`` a new PUT stream is refused (PUT_REFUSED), so they cannot pile up."""
    head = w.group_head("float32", (4,), 2)
    with hs.serve([], writable=tmp_path / "store", max_put_streams=4) as server:
        with raw(server.port) as sock:
            sock.sendall(HELLO)
            read_message(sock)
            for i in range(6):
                sid = 2 * i + 1
                sock.sendall(_put_header(sid, f"g{i}", head, 0) + w.encode_message(w.TENSOR_DATA_END, sid))
            replies = [read_message(sock) for _ in range(6)]
    assert [k for k, _, _ in replies[:4]] == [w.TENSOR_PUT_ACK] * 4
    assert [error_of(r) for r in replies[4:]] == [0xF1, 0xF1]


def test_closed_streams_cost_bounded_memory(served_file):
    """A client that ends stream after stream with an ERROR: the server remembers closed streams
    in bounded memory (RSS flat), still refuses a recent one, and serves a new one."""
    count = size(20_000, 240_000)
    errors = [w.encode_message(w.ERROR, sid, w.encode_error(w.ERR_INVALID_MESSAGE, "x")) for sid in range(2, 2 + count)]
    with server_process(str(served_file)) as (proc, port):
        with raw(port) as sock:
            sock.sendall(HELLO)
            read_message(sock)
            sock.sendall(b"".join(errors[: count // 10]))
            sock.sendall(w.encode_message(w.PING, 2 + count // 10, b"a"))  # a new stream: above every closed one
            assert read_message(sock)[0] == w.PONG
            before = settled_rss(proc.pid)
            sock.sendall(b"".join(errors[count // 10 :]))
            sock.sendall(w.encode_message(w.PING, count + 2, b"b"))
            assert read_message(sock)[:2] == (w.PONG, count + 2)
            grown = settled_rss(proc.pid) - before
            sock.sendall(w.encode_message(w.PING, count, b"c"))  # a stream an ERROR closed lately
            assert error_of(read_message(sock)) == w.ERR_INVALID_MESSAGE
    assert grown < 4 * MiB, grown


SHM_REQUEST, SHM_DATA, SHM_PUT = 0xF0, 0xF1, 0xF2
"""Our private shared-memory message types (spec-map.md § Interpretations)."""


def _shm_put_message(sid: int, desc: bytes, total: int) -> bytes:
    """An SHM_PUT of key "k": a TENSOR_PUT's payload under our private type."""
    return w.encode_message(SHM_PUT, sid, w.encode_tensor_put("k", desc, total))


def _shm_put(sock: socket.socket, sid: int, desc: bytes, total: int, fd: int) -> None:
    sock.sendmsg([_shm_put_message(sid, desc, total)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])


def _sealed(data: bytes, size: int) -> int:
    fd = os.memfd_create("test-put", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    os.pwrite(fd, data, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


@pytest.mark.parametrize("segment", [256 * MiB, 1 << 40], ids=["256MiB", "1TiB-sparse"])
def test_a_shared_memory_put_larger_than_its_tensor_is_refused(tmp_path, segment):
    """A 16-byte tensor in a sealed memfd of 256 MiB, or a sparse one of 1 TiB: refused
    (``session.shm.sealed``), nothing kept; the same tensor in a memfd of its size is stored."""
    data = np.arange(4, dtype=np.float32).tobytes()
    desc = w.dense_descriptor("float32", (4,))
    with hs.serve([], unix=tmp_path / "s.sock", memory_store=True) as server:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(str(tmp_path / "s.sock"))
            sock.sendall(HELLO)
            read_message(sock)
            big = _sealed(data, segment)
            try:
                _shm_put(sock, 3, desc, len(data), big)
            finally:
                os.close(big)
            kind, sid, payload = read_message(sock)
            assert (kind, sid) == (w.ERROR, 3) and "session.shm.sealed" in w.decode_error(payload)[1]
            right = _sealed(data, 64)
            try:
                _shm_put(sock, 5, desc, len(data), right)
            finally:
                os.close(right)
            assert read_message(sock)[:2] == (w.TENSOR_PUT_ACK, 5)
        assert server.catalog.stored_bytes == 64


def test_an_shm_put_takes_only_the_descriptor_sent_with_it(tmp_path):
    """A descriptor passed with a PING is not the memory file of the SHM_PUT after it: the PUT
    has none (refused), and the stray descriptor is closed by the server."""
    data = np.arange(4, dtype=np.float32).tobytes()
    desc = w.dense_descriptor("float32", (4,))
    with hs.serve([], unix=tmp_path / "s.sock", memory_store=True) as server:
        fds_before = descriptors_of(os.getpid())
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(str(tmp_path / "s.sock"))
            sock.sendall(HELLO)
            read_message(sock)
            fd = _sealed(data, 64)
            try:
                ping = w.encode_message(w.PING, 1, b"p")
                sock.sendmsg([ping], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
                assert read_message(sock)[0] == w.PONG
                sock.sendall(_shm_put_message(3, desc, len(data)))
                kind, sid, payload = read_message(sock)
            finally:
                os.close(fd)
            assert (kind, sid) == (w.ERROR, 3) and "without a memory file" in w.decode_error(payload)[1]
        assert "k" not in server.catalog.keys()
        for _ in range(50):
            if descriptors_of(os.getpid()) <= fds_before:
                break
            time.sleep(0.05)
        assert descriptors_of(os.getpid()) <= fds_before


@pytest.mark.parametrize("store", ["memory", "writable"])
def test_a_full_store_refuses_with_store_full(tmp_path, store):
    """``store_max_items`` and ``store_max_bytes``: a PUT past either is refused with STORE_FULL
    (0xF4) and the store is unchanged; replacing a key frees its old bytes first."""
    kind = {"memory_store": True} if store == "memory" else {"writable": tmp_path / "store"}
    small = np.zeros(16, np.float32)
    with hs.serve([], store_max_items=2, **kind) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            session.put("a", small)
            session.put("b", small)
            session.put("a", small + 1)  # a replacement: no new item
            with pytest.raises(hs.RemoteError) as info:
                session.put("c", small)
            assert info.value.error_code == 0xF4 and "store_max_items" in str(info.value)
            np.testing.assert_array_equal(np.asarray(session.get("a")), small + 1)
    with hs.serve([], store_max_bytes=64 * 1024, **({"memory_store": True} if store == "memory"
                                                    else {"writable": tmp_path / "store2"})) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            session.put("x", np.zeros(4096, np.float32))  # 16 KiB
            with pytest.raises(hs.RemoteError) as info:
                session.put("y", np.zeros(64 * 1024, np.float32))  # 256 KiB
            assert info.value.error_code == 0xF4 and "store_max_bytes" in str(info.value)
            with pytest.raises(hs.UnknownTensor):
                session.get("y")


# --------------------------------------------------------------------------------------
# 3. Files that shrink
# --------------------------------------------------------------------------------------


def _cut_inside(path, name: str, keep: int = 20) -> None:
    """Truncate ``path`` ``keep`` bytes into the data of its tensor ``name``."""
    with hs.read_file(path) as f:
        (offset, _), *_ = f.buffer_ranges(name)
    os.truncate(path, offset + keep)


def test_a_served_file_cut_under_the_server_gives_a_typed_error(tmp_path):
    """A served file truncated inside a tensor's data, then inside its descriptors: each GET of it
    gets ERROR SOURCE_CHANGED (0xF5) on its stream, the session goes on, the server lives."""
    cut, whole = tmp_path / "cut.hrry", tmp_path / "whole.hrry"
    hs.save(cut, {"w": np.arange(66, dtype=np.float32), "v": A})
    hs.save(whole, {"u": A})
    with hs.serve([cut, whole]) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            np.testing.assert_array_equal(np.asarray(session.get("w")), np.arange(66, dtype=np.float32))
            _cut_inside(cut, "w")
            for _ in range(2):
                with pytest.raises(hs.RemoteError) as info:
                    session.get("w")
                assert info.value.error_code == 0xF5
            os.truncate(cut, 100)
            with pytest.raises(hs.RemoteError) as info:
                session.get("v")
            assert info.value.error_code == 0xF5
            np.testing.assert_array_equal(np.asarray(session.get("u")), A)
            assert session.ping(b"alive") == b"alive"


def test_a_file_cut_while_its_frames_go_out_keeps_the_framing(tmp_path):
    """A 64 MiB tensor sent in 1 MiB frames; the file is cut while the frames go out (the client
    reads slowly): every frame is as long as its header says (the missing bytes are zeros), the
    stream ends with ERROR SOURCE_CHANGED instead of TENSOR_DATA_END, and a PING is answered."""
    path = tmp_path / "big.hrry"
    hs.save(path, {"big": np.ones(16 * MiB, np.float32)})
    with hs.serve([path], frame_bytes=MiB) as server:
        with SpecClient(("127.0.0.1", server.port), timeout=TIMEOUT) as peer:
            peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            peer.hello()
            peer.request("big", stream_id=3)
            kind, sid, _ = peer.recv()
            assert kind == w.TENSOR_DESCRIPTOR
            _, first = w.decode_tensor_data(peer.recv()[2])
            _cut_inside(path, "big", keep=8 * MiB)
            frames, tail = [first], None
            while True:
                kind, sid, payload = peer.recv()
                if kind != w.TENSOR_DATA:
                    tail = (kind, sid, payload)
                    break
                frames.append(w.decode_tensor_data(payload)[1])
            assert all(len(f) == MiB for f in frames)
            assert tail[0] == w.ERROR and tail[1] == 3 and w.decode_error(tail[2])[0] == 0xF5
            assert peer.ping(b"still here").type == w.PONG


def test_a_file_cut_during_a_parallel_transfer_ends_every_open_shard_stream(tmp_path):
    """The same cut during a parallel transfer (4 shards of 16 MiB, frames of 1 MiB): every frame
    whole, and each shard stream ends with TENSOR_DATA_END or ERROR SOURCE_CHANGED -- never
    both, never neither -- then a PING is answered."""
    path = tmp_path / "big.hrry"
    hs.save(path, {"big": np.ones((64, 256 * 1024), np.float32)})
    with hs.serve([path], frame_bytes=MiB, parallel_min_bytes=MiB) as server:
        with raw(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.sendall(HELLO)
            read_message(sock)
            sock.sendall(w.encode_message(w.TENSOR_REQUEST, 3, w.encode_tensor_request(
                "big", request_flags=w.REQ_PARALLEL_OK)))
            ends: dict = {}
            for count in range(10_000):
                kind, sid, payload = read_message(sock)  # every message whole, or this raises
                if count == 8:
                    _cut_inside(path, "big", keep=4 * MiB)
                if kind in (w.TENSOR_DATA_END, w.ERROR):
                    assert sid not in ends, (sid, kind)
                    ends[sid] = kind if kind == w.TENSOR_DATA_END else error_of((kind, sid, payload))
                if len(ends) == 4:
                    break
            assert sorted(ends) == [3, 4, 5, 6] and 0xF5 in ends.values(), ends
            sock.sendall(w.encode_message(w.PING, 9, b"after"))
            assert read_message(sock)[:2] == (w.PONG, 9)


_SHRINKING_CLIENT = textwrap.dedent("""
    import os, sys, numpy as np, hurray_schema as hs
    url, path = sys.argv[1], sys.argv[2]
    with hs.connect(url) as session:
        arrays = [np.asarray(session.get(k)) for k in ("w", "v")]
        os.truncate(path, 64)  # the served file, cut under whatever this process maps
        total = sum(float(a.sum()) for a in arrays)  # every page of both arrays read after the cut
    print(total, flush=True)
""")


def test_a_shared_memory_client_outlives_a_served_file_cut_under_it(tmp_path):
    """A client over the Unix socket holds arrays of a served file; the file is truncated; the
    client reads every byte of them and exits normally (it maps sealed copies, not the file)."""
    path = tmp_path / "s.hrry"
    w_, v = np.arange(100_000, dtype=np.float32), np.ones(5000, np.float64)
    hs.save(path, {"w": w_, "v": v})
    with hs.serve([path], unix=tmp_path / "s.sock") as server:
        done = subprocess.run([sys.executable, "-c", _SHRINKING_CLIENT, server.unix_url, str(path)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert float(done.stdout) == float(w_.sum()) + float(v.sum())


_UNSEALED_CLIENT = textwrap.dedent("""
    import sys, numpy as np, hurray_schema as hs
    with hs.connect(sys.argv[1], timeout=10) as session:
        arr = np.asarray(session.get("w"))
    print(float(arr.sum()), flush=True)
""")


def test_a_hostile_server_cannot_cut_an_unsealed_memfd_under_the_client(tmp_path):
    """A server passes an unsealed memfd in SHM_DATA, then truncates it: the client copied it
    (it maps only sealed memory files), so it neither dies nor sees the cut."""
    data = np.arange(1 << 16, dtype=np.float32)
    desc = w.dense_descriptor("float32", data.shape)

    def answer(kind, sid, payload, conn):
        if kind != SHM_REQUEST:
            return None
        fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
        os.write(fd, data.tobytes())
        conn.send_raw(ss.msg(w.TENSOR_DESCRIPTOR, sid, w.encode_descriptor_message(desc, data.nbytes)))
        shm_data = struct.pack("<I", 1) + struct.pack("<QQ", 0, data.nbytes)
        message = ss.msg(SHM_DATA, sid, shm_data)
        conn.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
        conn.send_raw(ss.msg(w.TENSOR_DATA_END, sid))
        time.sleep(0.3)
        os.ftruncate(fd, 0)
        os.close(fd)
        return None

    with ss.SpecServer(answer, unix_path=str(tmp_path / "h.sock"), timeout=TIMEOUT) as server:
        done = subprocess.run([sys.executable, "-c", _UNSEALED_CLIENT, f"hurray+unix://{server.unix_path}"],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert float(done.stdout) == float(data.sum())


# --------------------------------------------------------------------------------------
# 4. Hostile servers against the client
# --------------------------------------------------------------------------------------

SERVER_HELLO = ss.msg(w.SERVER_HELLO, 1, w.encode_hello(
    max_message_size=1 << 20, capability_flags=w.CAP_TRANSCODING, layouts=(w.LAYOUT_ROW_MAJOR,),
    devices=(w.DEVICE_CPU,), memory_classes=(w.MEM_STANDARD,)))


def _answering(build):
    def script(kind, sid, payload, conn):
        if kind == w.TENSOR_REQUEST:
            build(sid, conn)
        return None
    return script


def _ping_flood(sid, conn):
    while not conn.closed and not conn.server._stop.is_set():
        conn.send(w.PING, 7, b"still here")
        conn.stall(0.25)


def _trickle_frame(sid, conn):
    data = np.arange(1024, dtype=np.float32)
    messages = ss.tensor_messages(sid, w.dense_descriptor("float32", data.shape), data.tobytes())
    conn.send_raw(messages[0])
    for i in range(len(messages[1])):
        if conn.closed or conn.server._stop.is_set():
            return
        conn.send_raw(messages[1][i : i + 1])
        conn.stall(0.1)


def _huge(sid, conn):
    desc = w.dense_descriptor("uint8", (100 * GiB,))
    conn.send_raw(ss.msg(w.TENSOR_DESCRIPTOR, sid, w.encode_descriptor_message(desc, 100 * GiB)))
    conn.stall(30)


@pytest.mark.parametrize("build", [_ping_flood, _trickle_frame], ids=["ping-flood", "trickle"])
def test_a_call_ends_at_its_timeout_whatever_the_server_sends(build):
    """``timeout`` bounds a call as a whole: PINGs every 0.25 s, or a frame trickled a byte every
    0.1 s, do not extend it; the call raises SessionTimeout within the timeout and a small margin."""
    with ss.SpecServer(_answering(build), hello_reply=SERVER_HELLO, timeout=TIMEOUT) as server:
        with hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=1.5) as session:
            began = time.monotonic()
            with pytest.raises(hs.SessionTimeout):
                session.get("w")
            assert time.monotonic() - began < 1.5 + 0.75


def test_a_huge_declared_size_is_a_typed_error_before_any_allocation():
    """A TENSOR_DESCRIPTOR of 100 GiB: past this machine's memory (the default) or a
    ``max_response_bytes`` given, the client raises LimitExceeded, never NumPy's MemoryError."""
    with ss.SpecServer(_answering(_huge), hello_reply=SERVER_HELLO, timeout=TIMEOUT) as server:
        for options in ({}, {"max_response_bytes": 1 << 20}):
            with hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=TIMEOUT, **options) as session:
                with pytest.raises(hs.LimitExceeded):
                    session.get("w")


def test_opening_a_session_is_bounded_by_the_timeout_too():
    def trickle_hello(conn, payload):
        for i in range(len(SERVER_HELLO)):
            if conn.closed or conn.server._stop.is_set():
                return
            conn.send_raw(SERVER_HELLO[i : i + 1])
            conn.stall(0.2)

    with ss.SpecServer(lambda *a: None, hello_reply=trickle_hello, timeout=TIMEOUT) as server:
        began = time.monotonic()
        with pytest.raises(hs.SessionTimeout):
            hs.connect(f"hurray://127.0.0.1:{server.port}", timeout=1.0)
        assert time.monotonic() - began < 1.0 + 0.75


# --------------------------------------------------------------------------------------
# 5. Descriptors
# --------------------------------------------------------------------------------------


def test_a_store_of_many_keys_restarts_under_a_low_descriptor_limit(tmp_path, monkeypatch):
    """A ``--writable`` store of 10,000 keys (3,000 by default here: past the 2,048 descriptors two
    per key took) starts and serves with ``ulimit -n`` 1024: files are opened on demand and the
    least recently used idle ones closed."""
    store = tmp_path / "store"
    store.mkdir()
    count = size(3_000, 10_000)
    with monkeypatch.context() as quick:
        quick.setattr(os, "fsync", lambda fd: None)  # the fixture's files need not reach the disk
        for i in range(count):
            hs.save(store / store_file_name(f"k{i}"), {f"k{i}": np.full(4, i, np.int32)})
    hs.save(tmp_path / "s.hrry", {"w": A})
    with server_process(str(tmp_path / "s.hrry"), "--writable", str(store), descriptors=1024) as (proc, port):
        with hs.connect(f"hurray://127.0.0.1:{port}", timeout=60) as session:
            for i in np.random.default_rng(7).choice(count, 300, replace=False).tolist() + [0, count - 1]:
                np.testing.assert_array_equal(np.asarray(session.get(f"k{i}")), np.full(4, i, np.int32))
            session.put("new", np.ones(3, np.int8))
            np.testing.assert_array_equal(np.asarray(session.get("new")), np.ones(3, np.int8))
            assert descriptors_of(proc.pid) < 1024 // 2


# --------------------------------------------------------------------------------------
# 6. The smaller defects
# --------------------------------------------------------------------------------------


def test_two_keys_never_share_a_store_file(tmp_path):
    """A key past 200 encoded characters is stored as its first 120 and ``~`` + its SHA-256; a
    key spelled exactly so (its ``~`` encoded) is another file: both are kept across a restart."""
    import hashlib
    import urllib.parse

    long_key = "x" * 130
    lookalike = urllib.parse.quote(long_key, safe="")[:120] + "~" + hashlib.sha256(long_key.encode()).hexdigest()
    assert store_file_name(long_key) != store_file_name(lookalike)
    store = tmp_path / "store"
    with hs.serve([], writable=store) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            session.put(long_key, np.zeros(2, np.int8))
            session.put(lookalike, np.ones(2, np.int8))
    with hs.serve([], writable=store) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            np.testing.assert_array_equal(np.asarray(session.get(long_key)), np.zeros(2, np.int8))
            np.testing.assert_array_equal(np.asarray(session.get(lookalike)), np.ones(2, np.int8))


def test_a_transcode_the_evaluator_refuses_falls_through_to_the_stored_layout(tmp_path):
    """interchange.md § On-the-Fly Transcoding: a COO tensor of 2**31 booleans with one value,
    row-major preferred, the default limits: its packed row-major output (256 MiB) is within the
    transcoding limit, but evaluating it (a byte per boolean) is not; the server serves the stored
    COO tensor (it used to end the connection with INTERNAL)."""
    shape = (1 << 31,)
    path = tmp_path / "coo.hrry"
    hs.save(path, {"s": hs.sparse_coo(np.array([[7]]), np.array([True]), shape)})
    with hs.serve([path]) as server:
        with hs.connect(server.url, timeout=TIMEOUT) as session:
            got = session.get("s", layouts=[hs.LayoutTag.ROW_MAJOR])
            assert got.descriptor.layout_tag == hs.LayoutTag.COO and got.shape == shape
            assert session.ping(b"on") == b"on"


def test_a_busy_refusal_on_a_tls_port_is_read_as_busy(tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    hs.save(tmp_path / "s.hrry", {"w": A})
    with hs.serve([tmp_path / "s.hrry"], tls_cert=tmp_path / "server.pem", max_connections=1, max_waiting=0) as server:
        with hs.connect(server.url, timeout=TIMEOUT, tls_ca=tmp_path / "ca.pem", server_hostname="localhost"):
            with pytest.raises(hs.RemoteError) as info:
                hs.connect(server.url, timeout=TIMEOUT, tls_ca=tmp_path / "ca.pem", server_hostname="localhost")
    assert info.value.error_code == 0xF0 and "busy" in str(info.value)


def test_the_readme_states_every_limit_as_declared():
    """README § Limits and guarantees holds the table made from the declarations, as it is now."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("<!-- limits table")
    start = readme.index("\n", start) + 1
    assert readme[start : readme.index("<!-- end of limits table -->")] == limits_table()
