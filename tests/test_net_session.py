"""The transport end to end: a real server on 127.0.0.1 (in this process, and as the
``hurray-schema serve`` command), the project's client, values compared with local reads and
NumPy (``interchange.md`` § Network Transport Protocol through § Error Handling)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema import LayoutTag
from hurray_schema.structs.session import CapabilityFlag, PrivateErrorCode

RNG = np.random.default_rng(7)
A = RNG.standard_normal((64, 48)).astype(np.float32)


def _items() -> dict:
    """One item of every kind the acceptance list names."""
    dense = np.arange(60, dtype=np.int16).reshape(5, 12)
    coo_idx = np.array([[0, 1], [3, 7], [4, 11]])
    return {
        "dense": dense,
        "empty": np.zeros((0, 7), dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float64),
        "coo": hs.sparse_coo(coo_idx, np.array([1.5, -2.0, 4.25], dtype=np.float32), (5, 12)),
        "quantized": hs.quantize(A, "per_block", storage="int4", block_size=16),
        "spqr": hs.spqr(A, bits=4, block_size=16, outliers=0.02),
        "partition": hs.partition(A, grid=(2, 3)),
        "group": hs.group([dense, np.ones(3, dtype=np.float32)]),
        "nested": hs.partition(A, grid=(2, 1), member=lambda box: hs.partition(box, grid=(1, 2)))
        if _nested_supported() else hs.partition(A, grid=(4, 1)),
    }


def _nested_supported() -> bool:
    import inspect

    return "member" in inspect.signature(hs.partition).parameters


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    path = folder / "items.hrry"
    hs.save(path, _items())
    local = hs.read_file(path)
    with hs.serve([path], writable=folder / "store", parallel_min_bytes=1024) as server:
        yield server, local


def _array(item):
    if isinstance(item, hs.Composite):
        out = item.materialize()
        return out if not isinstance(out, tuple) else out
    return item.to_numpy()


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("key", ["dense", "empty", "scalar", "coo", "quantized", "spqr", "partition", "group",
                                 "nested"])
def test_values_bit_identical_to_local_reads(served, key):
    server, local = served
    with hs.connect(server.url) as session:
        got = session.get(key)
    want = local[key]
    assert type(got) is type(want)
    assert got.descriptor == want.descriptor
    assert _same(_array(got), _array(want))


def test_dense_values_equal_numpy(served):
    server, _ = served
    with hs.connect(server.url) as session:
        got = session.get("dense")
    np.testing.assert_array_equal(np.asarray(got), np.arange(60, dtype=np.int16).reshape(5, 12))
    assert np.asarray(got).ctypes.data % 64 == 0


def test_buffers_honour_min_alignment(served):
    server, _ = served
    with hs.connect(server.url) as session:
        got = session.get("coo", min_alignment=4096)
    assert all(np.frombuffer(b, np.uint8).ctypes.data % 4096 == 0 for b in got.buffers)


def test_transcode_sparse_to_row_major(served):
    server, local = served
    with hs.connect(server.url) as session:
        got = session.get("coo", layouts=[LayoutTag.ROW_MAJOR])
        refused = session.get("coo", layouts=[LayoutTag.ROW_MAJOR], transcode=False)
    assert got.descriptor.layout_tag == LayoutTag.ROW_MAJOR
    expect = np.zeros((5, 12), np.float32)
    expect[0, 1], expect[3, 7], expect[4, 11] = 1.5, -2.0, 4.25
    np.testing.assert_array_equal(np.asarray(got), expect)
    assert refused.descriptor.layout_tag == LayoutTag.COO  # no ALLOW_TRANSCODE: the stored layout


def test_transcode_row_to_column_major(served):
    server, _ = served
    with hs.connect(server.url) as session:
        got = session.get("dense", layouts=[LayoutTag.COLUMN_MAJOR, LayoutTag.ROW_MAJOR])
    assert got.descriptor.layout_tag == LayoutTag.COLUMN_MAJOR
    dense = np.arange(60, dtype=np.int16).reshape(5, 12)
    assert bytes(got.buffers[0]) == np.asfortranarray(dense).tobytes(order="F")
    np.testing.assert_array_equal(got.to_numpy(), dense)


def test_composite_merged_when_row_major_preferred(served):
    server, local = served
    with hs.connect(server.url) as session:
        merged = session.get("spqr", layouts=[LayoutTag.ROW_MAJOR])
        group = session.get("group", layouts=[LayoutTag.ROW_MAJOR])
    assert isinstance(merged, hs.Tensor) and merged.descriptor.layout_tag == LayoutTag.ROW_MAJOR
    assert _same(np.asarray(merged), local["spqr"].materialize())
    assert isinstance(group, hs.Composite)  # a group has no single array: its own layout


def test_first_satisfiable_preference_wins(served):
    """``§ Server Layout Selection`` rule 1: the stored layout satisfies an entry with no transcoding."""
    server, _ = served
    with hs.connect(server.url) as session:
        got = session.get("coo", layouts=[0xF3, LayoutTag.COO, LayoutTag.ROW_MAJOR])
    assert got.descriptor.layout_tag == LayoutTag.COO


def test_transcode_limit_falls_through(tmp_path):
    path = tmp_path / "t.hrry"
    hs.save(path, {"coo": hs.sparse_coo(np.array([[0, 0]]), np.array([1.0], np.float32), (100, 100))})
    with hs.serve([path], transcode_limit=100 * 100 * 4 - 1) as server, hs.connect(server.url) as session:
        got = session.get("coo", layouts=[LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR])
    assert got.descriptor.layout_tag == LayoutTag.COO  # both targets need 40,000 bytes: the stored layout
    with hs.serve([path], transcode_limit=100 * 100 * 4) as server, hs.connect(server.url) as session:
        assert session.get("coo", layouts=[LayoutTag.ROW_MAJOR]).descriptor.layout_tag == LayoutTag.ROW_MAJOR


def test_parallel_shards_reassembled(served, tmp_path):
    big = RNG.standard_normal((37, 129)).astype(np.float32)
    path = tmp_path / "big.hrry"
    hs.save(path, {"big": big})
    with hs.serve([path], parallel_min_bytes=1, parallel_shards=5) as server, hs.connect(server.url) as session:
        got = session.get("big", parallel=True)
        single = session.get("big")
    np.testing.assert_array_equal(np.asarray(got), big)
    assert got.descriptor.shape == (37, 129) and got.descriptor.shard is None
    np.testing.assert_array_equal(np.asarray(single), big)


def test_unknown_key_is_typed_and_session_survives(served):
    server, _ = served
    with hs.connect(server.url) as session:
        with pytest.raises(hs.UnknownTensor) as info:
            session.get("no such key")
        assert info.value.error_code == 0x02 and "no such key" in info.value.remote_message
        assert session.get("dense").shape == (5, 12)


def test_device_negotiation(tmp_path, served):
    server, _ = served
    with hs.connect(server.url) as session:
        with pytest.raises(hs.DeviceUnavailable):
            session.get("dense", device="cuda")  # rule 3: not served, no silent fallback
    path = tmp_path / "d.hrry"
    hs.save(path, {"x": np.ones(4, np.float32)})
    with hs.serve([path], devices=("cpu", "cuda")) as both:
        with hs.connect(both.url) as session:  # rule 4: advertised, unavailable, the client takes CPU
            got = session.get("x", device="cuda")
            assert all(b.device_tag == hs.DeviceTag.CPU for b in got.descriptor.buffers)
        with hs.connect(both.url, devices=("cuda",)) as session:  # no CPU advertised: refused
            with pytest.raises(hs.DeviceUnavailable):
                session.get("x", device="cuda")


def test_put_then_get(served):
    server, _ = served
    arr = RNG.standard_normal((33, 17)).astype(np.float32)
    with hs.connect(server.url) as session:
        session.put("pushed", arr)
        session.put("pushed-spqr", hs.spqr(A, bits=4, block_size=16))
    with hs.connect(server.url) as session:
        np.testing.assert_array_equal(np.asarray(session.get("pushed")), arr)
        got = session.get("pushed-spqr")
    assert isinstance(got, hs.Composite)
    assert _same(got.materialize(), hs.spqr(A, bits=4, block_size=16).materialize())


def test_put_is_refused_without_writable(tmp_path):
    path = tmp_path / "r.hrry"
    hs.save(path, {"x": np.ones(4, np.float32)})
    with hs.serve([path]) as server, hs.connect(server.url) as session:
        with pytest.raises(hs.RemoteError) as info:
            session.put("y", np.ones(3))
        assert info.value.error_code == PrivateErrorCode.PUT_REFUSED
        assert session.ping(b"still here") == b"still here"


def test_put_keys_never_leave_the_store(tmp_path):
    store = tmp_path / "store"
    path = tmp_path / "r.hrry"
    hs.save(path, {"x": np.ones(4, np.float32)})
    keys = ["../escape", "/etc/passwd", "a/b", ".hidden", "..", "nul\x00byte", "é" * 300]
    with hs.serve([path], writable=store) as server, hs.connect(server.url) as session:
        for i, key in enumerate(keys):
            session.put(key, np.full(3, i, np.float32))
        for i, key in enumerate(keys):
            np.testing.assert_array_equal(np.asarray(session.get(key)), np.full(3, i, np.float32))
        with pytest.raises(hs.RemoteError):
            session.put("x", np.zeros(4, np.float32))  # a served file's item is read-only
    written = sorted(os.listdir(store))
    assert len(written) == len(keys) and all(not n.startswith(".") and "/" not in n for n in written)
    assert sorted(os.listdir(tmp_path)) == ["r.hrry", "store"]


def test_stored_puts_are_served_after_restart(tmp_path):
    path = tmp_path / "r.hrry"
    hs.save(path, {"x": np.ones(4, np.float32)})
    with hs.serve([path], writable=tmp_path / "s") as server, hs.connect(server.url) as session:
        session.put("kept", np.arange(5))
    with hs.serve([path], writable=tmp_path / "s") as server, hs.connect(server.url) as session:
        np.testing.assert_array_equal(np.asarray(session.get("kept")), np.arange(5))


def test_ping_and_capabilities(served):
    server, _ = served
    with hs.connect(server.url) as session:
        assert session.ping() == b""
        assert session.ping(b"x" * 1000) == b"x" * 1000
        caps = session.capabilities
        assert caps & CapabilityFlag.TRANSCODING and caps & CapabilityFlag.PARALLEL_STREAMS
        assert LayoutTag.ROW_MAJOR in session.server_layouts


def test_connection_refused_is_typed():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(hs.SessionError):
        hs.connect(f"hurray://127.0.0.1:{port}", timeout=2)


def test_bad_urls_are_typed():
    for url in ("http://127.0.0.1:1", "hurray://127.0.0.1", "hurray://:80", "hurray://host:notaport"):
        with pytest.raises(hs.HurraySchemaError):
            hs.connect(url)


def test_server_stops_cleanly_with_open_sessions(tmp_path):
    path = tmp_path / "r.hrry"
    hs.save(path, {"x": np.ones(4, np.float32)})
    server = hs.serve([path])
    session = hs.connect(server.url, timeout=5)
    server.close()
    with pytest.raises(hs.SessionError):
        session.get("x")
    session.close()


# --------------------------------------------------------------------------------------
# The command line, as a real process
# --------------------------------------------------------------------------------------


def _start(args, **kw) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "hurray_schema", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)
    line = proc.stdout.readline()
    assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split()[1]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hurray_schema", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_command_get_put_and_signal(tmp_path, signum):
    path = tmp_path / "c.hrry"
    hs.save(path, {"w": A, "p": hs.partition(A, grid=(2, 2))})
    np.save(tmp_path / "in.npy", np.arange(12, dtype=np.uint8).reshape(3, 4))
    proc, url = _start([str(path), "--port", "0", "--writable", str(tmp_path / "store")])
    try:
        assert url.startswith("hurray://127.0.0.1:")
        done = _cli("get", url, "p", "-o", str(tmp_path / "p.npy"))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"wrote {tmp_path / 'p.npy'}: float32 [64, 48]"
        np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), A)
        done = _cli("put", url, "mine", str(tmp_path / "in.npy"))
        assert done.returncode == 0, done.stderr
        assert _cli("get", url, "mine", "-o", str(tmp_path / "m.npy")).returncode == 0
        np.testing.assert_array_equal(np.load(tmp_path / "m.npy"), np.arange(12, dtype=np.uint8).reshape(3, 4))
        missing = _cli("get", url, "absent", "-o", str(tmp_path / "a.npy"))
        assert missing.returncode == 2 and "ERROR 0x00000002" in missing.stderr
    finally:
        proc.send_signal(signum)
        assert proc.wait(timeout=15) == 0
    assert sorted(os.listdir(tmp_path / "store")) == ["mine.hrry"]


def test_serve_command_refuses_bad_input(tmp_path):
    bad = tmp_path / "bad.hrry"
    bad.write_bytes(b"not a hurray file at all" * 10)
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "serve", str(bad)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "file.header.magic" in done.stderr


# --------------------------------------------------------------------------------------
# TLS and mutual TLS
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    trustme = pytest.importorskip("trustme", reason="trustme (the test extra) makes the certificates")
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("client@example.test")
    other = trustme.CA().issue_cert("client@example.test")
    paths = {}
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server_cert.private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    client_cert.private_key_and_cert_chain_pem.write_to_path(str(folder / "client.pem"))
    other.private_key_and_cert_chain_pem.write_to_path(str(folder / "other.pem"))
    for name in ("ca", "server", "client", "other"):
        paths[name] = str(folder / f"{name}.pem")
    return paths


def test_tls(pki, tmp_path):
    path = tmp_path / "t.hrry"
    hs.save(path, {"w": A})
    with hs.serve([path], tls_cert=pki["server"]) as server:
        assert server.url.startswith("hurrays://")
        with hs.connect(server.url, tls_ca=pki["ca"]) as session:
            np.testing.assert_array_equal(np.asarray(session.get("w")), A)
        with pytest.raises(hs.SessionError):
            hs.connect(server.url, timeout=5)  # the system's CAs do not sign the test certificate


def test_mutual_tls_refuses_clients_without_a_valid_certificate(pki, tmp_path):
    path = tmp_path / "t.hrry"
    hs.save(path, {"w": A})
    with hs.serve([path], tls_cert=pki["server"], tls_client_ca=pki["ca"]) as server:
        with hs.connect(server.url, tls_ca=pki["ca"], tls_cert=pki["client"]) as session:
            np.testing.assert_array_equal(np.asarray(session.get("w")), A)
        for cert in (None, pki["other"]):
            with pytest.raises(hs.SessionError):
                with hs.connect(server.url, tls_ca=pki["ca"], tls_cert=cert, timeout=5) as session:
                    session.get("w")  # TLS 1.3 reports the refused certificate at the first read


def test_tls_command_line(pki, tmp_path):
    path = tmp_path / "t.hrry"
    hs.save(path, {"w": A})
    proc, url = _start([str(path), "--tls-cert", pki["server"], "--tls-client-ca", pki["ca"]])
    try:
        assert url.startswith("hurrays://")
        ok = _cli("get", url, "w", "-o", str(tmp_path / "w.npy"), "--tls-ca", pki["ca"], "--tls-cert", pki["client"])
        assert ok.returncode == 0, ok.stderr
        refused = _cli("get", url, "w", "-o", str(tmp_path / "x.npy"), "--tls-ca", pki["ca"])
        assert refused.returncode == 2
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    _ = time


def test_get_into_a_callers_buffer(served, tmp_path):
    """``out=``: the answer's data lands in the caller's array, straight from the socket."""
    server, _ = served
    big = RNG.standard_normal((40, 33)).astype(np.float32)
    path = tmp_path / "b.hrry"
    hs.save(path, {"big": big})
    out = np.empty_like(big)
    with hs.serve([path], parallel_min_bytes=1) as srv, hs.connect(srv.url) as session:
        for parallel in (False, True):
            out[:] = 0
            got = session.get("big", out=out, parallel=parallel)
            np.testing.assert_array_equal(out, big)
            assert np.shares_memory(np.asarray(got), out)
        with pytest.raises(hs.HurraySchemaError, match="out="):
            session.get("big", out=np.empty(3, np.float32))  # not its size: left as it was
        np.testing.assert_array_equal(np.asarray(session.get("big")), big)  # the session goes on
    with hs.connect(server.url) as session:
        with pytest.raises(hs.HurraySchemaError):
            session.get("partition", out=np.empty(A.shape, np.float32))  # a composite is no one buffer
        with pytest.raises(hs.HurraySchemaError):
            session.get("dense", out=np.empty((12, 5), np.int16).T)  # not C-contiguous


@pytest.mark.parametrize("kind", ["csr", "csc", "column_major"])
def test_transcode_csr_csc_and_column_major_to_row_major(tmp_path, kind):
    """``interchange.md § On-the-Fly Transcoding``: element for element, the layout alone changes."""
    import scipy.sparse as sp

    dense = np.zeros((7, 5), np.float32)
    dense[0, 1], dense[3, 4], dense[6, 0], dense[2, 2] = 1.5, -2.0, 3.25, 7.0
    if kind == "csr":
        m = sp.csr_matrix(dense)
        item = hs.sparse_csr(m.data, m.indices, m.indptr, dense.shape)
    elif kind == "csc":
        m = sp.csc_matrix(dense)
        item = hs.sparse_csc(m.data, m.indices, m.indptr, dense.shape)
    else:
        import attrs

        desc = attrs.evolve(hs.Tensor.from_numpy(dense).descriptor, layout=hs.ColumnMajorLayout())
        item = hs.Tensor(desc, [np.asfortranarray(dense).ravel(order="F").view(np.uint8)])
    path = tmp_path / "t.hrry"
    hs.save(path, {"t": item})
    with hs.serve([path]) as server, hs.connect(server.url) as session:
        got = session.get("t", layouts=[LayoutTag.ROW_MAJOR])
        native = session.get("t")
    assert got.descriptor.layout_tag == LayoutTag.ROW_MAJOR and got.descriptor.shape == (7, 5)
    assert np.asarray(got).tobytes() == dense.tobytes()
    assert native.descriptor.layout_tag != LayoutTag.ROW_MAJOR
    np.testing.assert_array_equal(native.to_numpy(), dense)
