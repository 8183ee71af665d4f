"""The same machine (``interchange.md § IPC``): the protocol over a Unix socket, and tensors
handed over as shared memory (our private extension: spec-map.md § Interpretations).

Real servers and client processes on this machine; what a process maps is read from
``/proc/PID/maps``, what it holds from ``/proc/PID/fd``."""

from __future__ import annotations

import array
import gc
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.net import shm
from support.peers import spec_wire as w
from support.peers.spec_client import SpecClient

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd and SCM_RIGHTS: Linux")

A = np.arange(48, dtype=np.float32).reshape(6, 8)


@pytest.fixture
def served(tmp_path):
    path = tmp_path / "items.hrry"
    hs.save(path, {"w": A, "p": hs.partition(A, grid=(2, 2)), "empty": np.zeros((0, 4), np.int8),
                   "coo": hs.sparse_coo(np.array([[1, 2]]), np.array([5.0], np.float32), (6, 8))})
    sock = tmp_path / "s.sock"
    with hs.serve([path], unix=sock, memory_store=True) as server:
        server.folder = tmp_path
        yield server


def _mapping_of(array_: np.ndarray, pid: int = None) -> str:
    """The /proc/PID/maps line of the mapping that holds ``array_``'s first byte."""
    address = array_.__array_interface__["data"][0]
    with open(f"/proc/{pid or os.getpid()}/maps") as f:
        for line in f:
            span = line.split()[0]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return line.strip()
    raise AssertionError("no mapping holds the array")


# --------------------------------------------------------------------------------------
# Unix sockets
# --------------------------------------------------------------------------------------


def test_unix_socket_serves_every_kind(served):
    with hs.connect(served.unix_url) as session:
        assert session.shared
        np.testing.assert_array_equal(np.asarray(session.get("w")), A)
        np.testing.assert_array_equal(session.get("p").materialize(), A)
        assert np.asarray(session.get("empty")).shape == (0, 4)
        dense = session.get("coo", layouts=[hs.LayoutTag.ROW_MAJOR])  # transcoded: copied into a memfd once
        assert np.asarray(dense)[1, 2] == 5.0 and np.asarray(dense).sum() == 5.0
    with hs.connect(served.unix_url, shm=False) as plain:  # the plain frames over the same socket
        assert not plain.shared
        got = np.asarray(plain.get("w"))
        np.testing.assert_array_equal(got, A)
        assert _mapping_of(got).split()[-1] != str(served.folder / "items.hrry")  # received, not mapped


def test_a_get_maps_a_sealed_copy_of_the_servers_file_read_only(served):
    """A served file never reaches a client's mapping (it could shrink under it: SIGBUS): the
    server copies the file's chunk into a sealed memfd once, and every client maps that copy,
    read-only, with no copy of its own."""
    with hs.connect(served.unix_url) as one, hs.connect(served.unix_url) as two:
        a, b = np.asarray(one.get("w")), np.asarray(two.get("w"))
        member = np.asarray(one.get("p").members[0])
    np.testing.assert_array_equal(a, A)
    assert not a.flags.writeable
    line = _mapping_of(a)
    assert line.split()[-2:] == ["/memfd:hurray-copy", "(deleted)"] and line.split()[1].startswith("r--s")
    assert line.split()[4] == _mapping_of(b).split()[4] == _mapping_of(member).split()[4]  # one copy, one inode
    with pytest.raises(ValueError):
        a[0, 0] = 1


@pytest.mark.parametrize("trusted", [False, True])
def test_a_served_file_itself_is_mapped_only_by_a_client_that_trusts_it(tmp_path, trusted):
    """With no room for copies (``shm_cache_bytes=0``) the server passes the file's descriptor; a
    client maps it only with ``trust_server_files=True``, else copies its bytes by ``pread``."""
    path = tmp_path / "f.hrry"
    hs.save(path, {"w": A})
    with hs.serve([path], unix=tmp_path / "s.sock", shm_cache_bytes=0) as server:
        with hs.connect(server.unix_url, trust_server_files=trusted) as session:
            got = np.asarray(session.get("w"))
    np.testing.assert_array_equal(got, A)
    assert (_mapping_of(got).split()[-1] == str(path)) is trusted


def test_socket_file_permissions_and_removal(tmp_path):
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    sock = tmp_path / "a.sock"
    with hs.serve([path], unix=sock) as server:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(sock).st_mode)
        assert server.urls == (f"hurray+unix://{sock}",)  # --unix alone: no TCP listener
    assert not sock.exists()
    with hs.serve([path], unix=sock, unix_mode=0o660, port=0) as server:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        assert server.url.startswith("hurray://127.0.0.1:") and server.unix_url == f"hurray+unix://{sock}"
        with hs.connect(server.tcp_url) as tcp:
            np.testing.assert_array_equal(np.asarray(tcp.get("x")), A)
    assert not sock.exists()


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    sock = str(tmp_path / "s.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock)
    stale.close()  # the file stays, nobody listens: a killed server's
    with hs.serve([path], unix=sock) as server:
        with pytest.raises(hs.HurraySchemaError, match="another server listens"):
            hs.serve([path], unix=sock)
        with hs.connect(server.unix_url) as session:
            assert session.ping(b"x") == b"x"
    (tmp_path / "file").write_text("not a socket")
    with pytest.raises(hs.HurraySchemaError, match="not a socket"):
        hs.serve([path], unix=tmp_path / "file")
    assert (tmp_path / "file").read_text() == "not a socket"


def test_serve_command_over_a_unix_socket(tmp_path):
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    sock = tmp_path / "c.sock"
    proc = subprocess.Popen([sys.executable, "-m", "hurray_schema", "serve", str(path), "--unix", str(sock)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == f"serving hurray+unix://{sock}"
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        done = subprocess.run([sys.executable, "-m", "hurray_schema", "get", f"hurray+unix://{sock}", "x", "-o",
                               str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), A)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert not sock.exists()


def test_the_independent_client_holds_a_session_over_the_unix_socket(served):
    """The plain protocol (no private types: they need agreement) over the Unix socket."""
    with SpecClient(str(served.unix)) as client:
        hello = client.hello()
        assert hello["protocol_version"] == 1
        (tensor,) = client.get("w")
        assert tensor.data == A.tobytes() and tensor.shape == (6, 8)
        assert client.ping(b"unix").payload == b"unix"


def test_private_types_are_refused_over_tcp(tmp_path):
    """``session.message.private``: the shared-memory types are agreed over a Unix socket only."""
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    with hs.serve([path]) as server, SpecClient((server.host, server.port)) as client:
        client.hello()
        client.send(0xF0, 3, w.encode_tensor_request("x"))
        kind, sid, payload = client.recv()
        assert (kind, sid) == (w.ERROR, 3) and "[session.message.private]" in w.decode_error(payload)[1]


# --------------------------------------------------------------------------------------
# Shared memory between processes
# --------------------------------------------------------------------------------------


_CONSUMER = textwrap.dedent("""
    import sys, numpy as np, hurray_schema as hs
    with hs.connect(sys.argv[1]) as session:
        arr = np.asarray(session.get("shared"))
    address = arr.__array_interface__["data"][0]
    line = next(l for l in open("/proc/self/maps")
                if int(l.split()[0].split("-")[0], 16) <= address < int(l.split()[0].split("-")[1], 16))
    print(float(arr.sum()), arr.flags.writeable, line.split()[-2] if "(deleted)" in line else line.split()[-1])
""")


def test_two_processes_share_a_tensor_with_no_copy(served, tmp_path):
    """A producer PUTs (one copy: into its sealed memfd); a consumer process GETs and maps that
    very memfd (its mapping names the producer's ``memfd:hurray-put``)."""
    data = np.arange(1 << 16, dtype=np.float64)
    producer = subprocess.run([sys.executable, "-c",
                               "import sys, numpy as np, hurray_schema as hs\n"
                               "with hs.connect(sys.argv[1]) as s: s.put('shared', np.arange(1 << 16, dtype=np.float64))",
                               served.unix_url], capture_output=True, text=True, timeout=60)
    assert producer.returncode == 0, producer.stderr
    consumer = subprocess.run([sys.executable, "-c", _CONSUMER, served.unix_url], capture_output=True, text=True,
                              timeout=60)
    assert consumer.returncode == 0, consumer.stderr
    total, writeable, mapped = consumer.stdout.split()
    assert float(total) == float(data.sum()) and writeable == "False"
    assert mapped == "/memfd:hurray-put"


def test_a_tcp_put_is_held_in_one_memfd_every_unix_client_maps(tmp_path):
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    with hs.serve([path], port=0, unix=tmp_path / "s.sock", memory_store=True) as server:
        with hs.connect(server.tcp_url) as tcp:
            tcp.put("held", A * 2)
        with hs.connect(server.unix_url) as one, hs.connect(server.unix_url) as two:
            a, b = np.asarray(one.get("held")), np.asarray(two.get("held"))
    np.testing.assert_array_equal(a, A * 2)
    assert _mapping_of(a).split()[-2:] == ["/memfd:hurray-store", "(deleted)"]
    assert _mapping_of(a).split()[4] == _mapping_of(b).split()[4]  # the same inode


def test_a_replaced_file_leaves_a_held_mapping_unchanged(served):
    path = served.folder / "items.hrry"
    with hs.connect(served.unix_url) as session:
        held = np.asarray(session.get("w"))
        hs.save(path, {"w": -A})  # atomically replaced under the mapping
        np.testing.assert_array_equal(held, A)
        os.unlink(path)
        np.testing.assert_array_equal(held, A)
        np.testing.assert_array_equal(np.asarray(session.get("w")), A)  # the server keeps what it opened
    np.testing.assert_array_equal(held, A)


def _memfds(pid: int = None) -> set[int]:
    """Inodes of the memfds a process holds open or mapped."""
    pid = pid or os.getpid()
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:hurray"):
                found.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/memfd:hurray" in line:
                found.add(int(line.split()[4]))
    return found


def test_a_segment_is_freed_when_its_last_holder_releases_it(served):
    before = _memfds()
    with hs.connect(served.unix_url) as session:
        session.put("k", A)
        first = np.asarray(session.get("k"))
        (old,) = _memfds() - before
        session.put("k", A + 1)  # the server drops the old segment: this client still maps it
        np.testing.assert_array_equal(first, A)
        second = np.asarray(session.get("k"))
        np.testing.assert_array_equal(second, A + 1)
        assert old in _memfds()
        del first
        gc.collect()
        assert old not in _memfds()  # no holder left (the server's and this process's are gone)
        del second
        gc.collect()


def test_a_killed_client_leaks_nothing_on_the_server(served):
    fds_before = len(os.listdir("/proc/self/fd"))
    script = textwrap.dedent("""
        import sys, os, signal, numpy as np, hurray_schema as hs
        s = hs.connect(sys.argv[1])
        arr = np.asarray(s.get("w")); s.put("dying", np.ones(1000))
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script, served.unix_url], capture_output=True, text=True,
                              timeout=60)
        assert proc.stdout.strip() == "ready" and proc.returncode == -signal.SIGKILL
    with hs.connect(served.unix_url) as session:
        np.testing.assert_array_equal(np.asarray(session.get("w")), A)
        np.testing.assert_array_equal(np.asarray(session.get("dying")), np.ones(1000))
    for _ in range(100):
        if not served._connections:
            break
        import time

        time.sleep(0.05)
    assert not served._connections
    # the store's one memory file for "dying", and the copy of the served file's chunk that every
    # shared-memory GET of "w" maps: the same one each time
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2


# --------------------------------------------------------------------------------------
# The extension's rules
# --------------------------------------------------------------------------------------


def _raw_session(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    sock.connect(path)
    sock.sendall(w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello()))
    _recv_message(sock)
    return sock


def _recv_message(sock: socket.socket) -> tuple[int, int, bytes]:
    head = b""
    while len(head) < 12:
        head += sock.recv(12 - len(head))
    kind, sid, n = struct.unpack("<III", head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return kind, sid, body


def _shm_put(sock, sid: int, descriptor: bytes, data: bytes, *, seal: bool) -> tuple[int, int, bytes]:
    fd = os.memfd_create("test-put", os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, data)
        if seal:
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        payload = w.encode_tensor_put("raw", descriptor, len(data))
        sock.sendmsg([w.encode_message(0xF2, sid, payload)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    finally:
        os.close(fd)
    return _recv_message(sock)


def test_shm_put_needs_a_sealed_memory_file(served):
    """``session.shm.sealed``: an unsealed memfd could change after it was validated."""
    descriptor = w.dense_descriptor("float32", (6, 8))
    with _raw_session(str(served.unix)) as sock:
        kind, sid, payload = _shm_put(sock, 5, descriptor, A.tobytes(), seal=False)
        assert (kind, sid) == (w.ERROR, 5)
        code, text = w.decode_error(payload)
        assert text.startswith("[session.shm.sealed]") and code == w.ERR_INVALID_MESSAGE
        assert "session.shm.sealed" in {r.id for r in hs.rules.registry()}
        kind, sid, _ = _shm_put(sock, 7, descriptor, A.tobytes(), seal=True)
        assert (kind, sid) == (w.TENSOR_PUT_ACK, 7)
    with hs.connect(served.unix_url) as session:
        np.testing.assert_array_equal(np.asarray(session.get("raw")), A)


def test_shared_memory_puts_of_a_stream_bind_as_audit_binds_them(tmp_path):
    """SHM_PUTs on one stream push one item, a partition's head and then its members (bound as
    each arrives): overlapping members are one fault at the head's descriptor, in the server's
    ERROR and in audit of the Unix-socket recording."""
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A})
    head, first, second = w.partition_descriptors("float32", (4,), [((0,), (2,)), ((1,), (3,))])
    with hs.serve([path], unix=tmp_path / "s.sock", memory_store=True, record=tmp_path / "rec") as server:
        with _raw_session(str(server.unix)) as sock:
            replies = [_shm_put(sock, 5, d, bytes(n), seal=True) for d, n in ((head, 0), (first, 8), (second, 12))]
    assert [(k, sid) for k, sid, _ in replies] == [(w.TENSOR_PUT_ACK, 5), (w.TENSOR_PUT_ACK, 5), (w.ERROR, 5)]
    head_at = len(w.encode_message(w.CLIENT_HELLO, 1, w.encode_hello())) + w.HEADER_SIZE + 4 + len(b"raw") + 4
    assert w.decode_error(replies[-1][2])[1].startswith("[composite.close.partition_overlap] ")
    assert f" at byte {head_at} " in w.decode_error(replies[-1][2])[1]
    (recorded,) = (tmp_path / "rec").glob("*-unix.client.msgs")
    assert [(f.rule_id, f.offset) for f in hs.audit(recorded).findings] == [("composite.close.partition_overlap",
                                                                             head_at)]


def test_shm_data_must_match_the_buffers(tmp_path):
    """``session.shm.segments``, on the client: a scripted Unix-socket server answers an
    SHM_REQUEST with segments that do not fit the descriptor's buffers, or without a file."""
    from support.peers import spec_server as ss

    path = tmp_path / "data.bin"
    path.write_bytes(A.tobytes())

    def answer(sizes, with_fd=True):
        def script(kind, sid, payload, conn):
            if kind != 0xF0:
                return
            desc = w.dense_descriptor("float32", (6, 8))
            conn.send(w.TENSOR_DESCRIPTOR, sid, w.encode_descriptor_message(desc, A.nbytes))
            segs = struct.pack("<I", len(sizes)) + b"".join(struct.pack("<QQ", 0, n) for n in sizes)
            message = w.encode_message(0xF1, sid, segs)
            if with_fd:
                with open(path, "rb") as f:
                    conn.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                   array.array("i", [f.fileno()]))])
            else:
                conn.send_raw(message)
            conn.send(w.TENSOR_DATA_END, sid)
        return script

    for sizes, with_fd in (([A.nbytes - 4], True), ([A.nbytes, 0], True), ([A.nbytes], False)):
        with ss.SpecServer(answer(sizes, with_fd), unix_path=str(tmp_path / "p.sock")) as peer:
            with pytest.raises(hs.SpecViolation) as info:
                with hs.connect(f"hurray+unix://{tmp_path / 'p.sock'}", timeout=5) as session:
                    session.get("x")
        assert info.value.rule_id == "session.shm.segments"
    with ss.SpecServer(answer([A.nbytes]), unix_path=str(tmp_path / "p.sock")) as peer:
        with hs.connect(f"hurray+unix://{tmp_path / 'p.sock'}", timeout=5) as session:
            got = np.asarray(session.get("x"))
    np.testing.assert_array_equal(got, A)
    assert not got.flags.writeable
    _ = peer


def test_a_client_maps_each_file_once(served):
    """Every buffer of a file is a view of one mapping of it: descriptors do not grow with tensors."""
    with hs.connect(served.unix_url) as session:
        fds = len(os.listdir("/proc/self/fd"))
        arrays = [np.asarray(session.get("w")) for _ in range(50)] + [session.get("p") for _ in range(20)]
        assert len(os.listdir("/proc/self/fd")) <= fds + 2  # the client's one mapping, the server's one copy
        assert len({_mapping_of(a).split()[0] for a in arrays[:50]}) == 1


def test_segment_helpers_seal_and_refuse():
    fd, offsets, total = shm.sealed_memfd([A.tobytes(), b"", b"xyz"], "hurray")
    segment = shm.Segment(fd, total)
    assert offsets == [0, A.nbytes, A.nbytes] and bytes(segment.view(offsets[2], 3)) == b"xyz"
    assert shm.check_sealed(segment.fd, [A.nbytes, 0, 3], 0) == segment.size
    with pytest.raises(hs.SpecViolation):
        shm.check_sealed(segment.fd, [1 << 40], 0)  # smaller than its buffers need
    with pytest.raises(hs.SpecViolation):
        shm.check_sealed(segment.fd, [3], 0)  # larger than its buffers need
    segment.close()


def test_recorded_shared_memory_sessions_audit_clean(tmp_path):
    """A Unix-socket recording (named so) is audited with the extension agreed; over TCP the same
    private types are ``session.message.private``."""
    path = tmp_path / "x.hrry"
    hs.save(path, {"x": A, "p": hs.partition(A, grid=(2, 1))})
    with hs.serve([path], unix=tmp_path / "s.sock", memory_store=True, record=tmp_path / "rec") as server:
        with hs.connect(server.unix_url, record=tmp_path / "crec") as session:
            session.get("x")
            session.get("p")
            session.put("mine", A)
            session.get("mine")
    recordings = sorted((tmp_path / "rec").iterdir()) + sorted((tmp_path / "crec").iterdir())
    assert len(recordings) == 4 and all("-unix." in p.name for p in recordings)
    for recording in recordings:
        assert hs.audit(recording).findings == (), recording
    renamed = tmp_path / "tcp.client.msgs"
    renamed.write_bytes(next(p for p in recordings if p.name.endswith(".client.msgs")).read_bytes())
    (tmp_path / "tcp.server.msgs").write_bytes(next(p for p in recordings if p.name.endswith(".server.msgs")).read_bytes())
    assert {f.rule_id for f in hs.audit(renamed).findings} == {"session.message.private"}


def test_get_into_a_callers_buffer_over_shared_memory(served):
    """``out=`` over the Unix socket: one copy, from the mapping into the caller's array."""
    out = np.zeros_like(A)
    with hs.connect(served.unix_url) as session:
        got = session.get("w", out=out)
    np.testing.assert_array_equal(out, A)
    assert np.shares_memory(np.asarray(got), out)
