"""GET over loopback: ``hs.serve`` / ``hs.connect`` against a raw socket and Arrow Flight, same run.

    python benchmarks/network.py [--gib 1] [--rounds 7] [--small-gets 1000] [--shards 4]
                                 [--flight-batch-mib 0] [--settle 0.3] [--prefault-gib 6] [--no-cold]

One ``.hrry`` file is written to a temporary folder: ``big``, a [rows, 1 Mi / 4] float32
tensor of ``--gib`` GiB (every element distinct: the bits of 0, 1, 2, ...), and ``small``, a
1 KiB float32 tensor.  Three servers serve the same bytes of that file, each in a process of
its own (``multiprocessing``, spawn):

* ``raw``    -- the physical limit: a thread per connection answers a 16-byte request
  (offset, length) with ``os.sendfile`` of that range of the file; the client ``recv_into``'s
  a buffer allocated and touched once, before timing (``raw, fresh buffer`` allocates a new
  one per GET, as our client does, and pays its page faults);
* ``ours``   -- ``hs.serve([file], parallel_shards=--shards)``; the client is one
  ``hs.connect`` session, ``numpy.asarray(session.get(key))`` (and ``parallel=True``; and
  ``out=`` a buffer allocated and touched once, before timing, as raw's);
* ``flight`` -- a ``pyarrow.flight.FlightServerBase`` whose ``do_get`` answers a table of one
  float32 column built zero-copy (``pa.py_buffer``) over a ``numpy.memmap`` of the same file
  range (one record batch, or batches of ``--flight-batch-mib``); the client is one
  ``FlightClient``, ``do_get(ticket).read_all()``.

Figures:

1. ``big``: wall time of one GET of the whole tensor, ``--rounds`` rounds, the competitors'
   order reversed every other round (ABC.., ..CBA, ...), ``gc.collect()``, ``os.sync()`` and
   a ``--settle`` pause before each transfer; min and median, as GiB/s, and the ratios ours /
   raw (goal >= 0.8), ours / Flight (goal >= 1.0) and parallel / single stream (ours);
2. ``small``: latency of ``--small-gets`` GETs of the 1 KiB tensor on one connection / session
   / client per competitor (raw, ours, Flight), interleaved request by request, the order
   reversed every other request (after 20 untimed each): p50, p90, ratio ours / Flight (goal
   <= 1.0);
3. ``cold``: each client in a fresh Python process (its caches in a new empty folder)
   against a server that has answered nothing yet: the process's wall time, its imports,
   connect, first and second GET of ``big`` (and of ``small``, and for ours the parallel
   GET) -- first GET = cold, second = warm in the same process; and which heavy modules
   (numba, llvmlite, ...) the client process and our server process had imported.

Every received tensor is checked (outside the timing): the CRC-32 of 64 KiB at seven places
against the source's, every time; and ``numpy.array_equal`` with the source once per
competitor.  Times are wall times (what a user waits for); nothing is asserted.

Before anything is timed the file is synced to disk and ``--prefault-gib`` GiB of memory is
touched once (on a VM that backs guest memory at first touch, memory never used since boot
costs several times more to fault in, and would land on whichever transfer used it first).
The load average at the start and the end is printed: on a shared machine, a noisy run shows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from caches import caches_in
from transport_support import (
    GiB, HEAVY, Processes, await_stop, cold_run, heavy_modules, prefault, probe, settle, verdict,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_REQUEST = struct.Struct("<QQ")


# ------------------------------------------------------------------------------------
# Checking what arrived
# ------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------
# Servers, each in a process of its own: send ("ready", address), answer until "stop" comes on
# the pipe, then send ("modules", heavy modules imported) and exit
# ------------------------------------------------------------------------------------


def _raw_answer(conn: socket.socket, fd: int) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = bytearray(_REQUEST.size)
    try:
        while True:
            got = 0
            while got < len(head):
                k = conn.recv_into(memoryview(head)[got:])
                if not k:
                    return
                got += k
            offset, n = _REQUEST.unpack(head)
            end = offset + n
            while offset < end:
                offset += os.sendfile(conn.fileno(), fd, offset, end - offset)
    except OSError:
        pass
    finally:
        conn.close()


def raw_server(path: str, pipe) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        listener = socket.create_server(("127.0.0.1", 0))
        pipe.send(("ready", listener.getsockname()[:2]))

        def accept():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=_raw_answer, args=(conn, fd), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        await_stop(pipe)
        listener.close()
        pipe.send(("modules", heavy_modules()))
    except KeyboardInterrupt:
        pass


def our_server(path: str, shards: int, pipe) -> None:
    try:
        import hurray_schema as hs

        with hs.serve([path], host="127.0.0.1", port=0, parallel_shards=shards) as server:
            pipe.send(("ready", server.url))
            await_stop(pipe)
        pipe.send(("modules", heavy_modules()))
    except KeyboardInterrupt:
        pass


def flight_server(path: str, ranges: dict, batch_bytes: int, pipe) -> None:
    try:
        import numpy as np
        import pyarrow as pa
        import pyarrow.flight as fl

        tables = {}
        for key, (offset, length) in ranges.items():
            values = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(length,))
            column = pa.Array.from_buffers(pa.float32(), length // 4, [None, pa.py_buffer(values)])
            step = (batch_bytes // 4) if batch_bytes else len(column)
            batches = [pa.record_batch([column.slice(i, step)], names=[key]) for i in range(0, len(column), step)]
            tables[key.encode()] = pa.Table.from_batches(batches)

        class Server(fl.FlightServerBase):
            def do_get(self, context, ticket):
                return fl.RecordBatchStream(tables[ticket.ticket])

        server = Server("grpc://127.0.0.1:0")
        pipe.send(("ready", server.port))
        await_stop(pipe)
        server.shutdown()
        pipe.send(("modules", heavy_modules()))
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------------------
# Clients in this process
# ------------------------------------------------------------------------------------


class RawClient:
    def __init__(self, address, big_range, small_range):
        import numpy as np

        self.np = np
        self.sock = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ranges = {"big": big_range, "small": small_range}
        self.buffers = {key: np.ones(n, np.uint8) for key, (_, n) in self.ranges.items()}  # touched once

    def get(self, key: str, fresh: bool = False):
        offset, n = self.ranges[key]
        buf = self.np.empty(n, self.np.uint8) if fresh else self.buffers[key]
        view = memoryview(buf)
        self.sock.sendall(_REQUEST.pack(offset, n))
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("the raw server closed the connection")
            got += k
        return buf

    def close(self):
        self.sock.close()


def flight_arrays(table):
    """The received column's chunks as NumPy views (no copy)."""
    import numpy as np

    return [np.frombuffer(chunk.buffers()[1], np.uint8, len(chunk) * 4, chunk.offset * 4)
            for chunk in table.column(0).chunks]


# ------------------------------------------------------------------------------------
# Cold: each client in a fresh process
# ------------------------------------------------------------------------------------

CHILD = {
    "raw": r'''
import socket, struct
timed("import", lambda: __import__("numpy"))
import numpy as np
sock = timed("connect", lambda: socket.create_connection(tuple(ADDRESS)))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def get(offset, n):
    buf = np.empty(n, np.uint8)
    view = memoryview(buf)
    sock.sendall(struct.pack("<QQ", offset, n))
    got = 0
    while got < n:
        got += sock.recv_into(view[got:])
    return buf
for name, key in (("big1", "big"), ("big2", "big"), ("small1", "small"), ("small2", "small")):
    report["probes"][name] = probe(timed(name, lambda: get(*RANGES[key])))
''',
    "ours": r'''
timed("import", lambda: __import__("hurray_schema"))
import hurray_schema as hs, numpy as np
session = timed("connect", lambda: hs.connect(URL))
for name, key, par in (("big1", "big", False), ("big2", "big", False), ("small1", "small", False),
                       ("small2", "small", False), ("par1", "big", True), ("par2", "big", True)):
    report["probes"][name] = probe(timed(name, lambda: np.asarray(session.get(key, parallel=par))))
session.close()
''',
    "flight": r'''
timed("import", lambda: __import__("pyarrow.flight"))
import pyarrow.flight as fl, numpy as np
def connect():
    client = fl.connect(f"grpc://127.0.0.1:{PORT}")
    client.wait_for_available()
    return client
client = timed("connect", connect)
def get(key):
    return client.do_get(fl.Ticket(key.encode())).read_all()
for name, key in (("big1", "big"), ("big2", "big"), ("small1", "small"), ("small2", "small")):
    table = timed(name, lambda: get(key))
    chunks = [np.frombuffer(c.buffers()[1], np.uint8, len(c) * 4, c.offset * 4) for c in table.column(0).chunks]
    report["probes"][name] = probe(chunks[0] if len(chunks) == 1 else np.concatenate(chunks))
client.close()
''',
}


# ------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------


def pct(values, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big tensor in GiB")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the big transfers")
    parser.add_argument("--small-gets", type=int, default=1000, help="timed GETs of the 1 KiB tensor each")
    parser.add_argument("--shards", type=int, default=4, help="our server's parallel_shards")
    parser.add_argument("--flight-batch-mib", type=int, default=0,
                        help="Flight record batch size in MiB (0: the whole column in one batch)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds of pause before each big transfer")
    parser.add_argument("--prefault-gib", type=float, default=6,
                        help="GiB of memory touched once before anything is measured (0: none)")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process (cold) clients")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers are stopped, the folder removed

    import numpy as np

    scratch = Path(tempfile.mkdtemp(prefix="hurray-network-"))
    os.environ.update(caches_in(tempfile.mkdtemp(prefix="caches-", dir=scratch)))  # every process starts empty
    servers = Processes("network")
    clients = []
    run_started = time.perf_counter()
    try:
        import hurray_schema as hs

        cols = (1 << 20) // 4
        rows = max(1, round(args.gib * GiB / (cols * 4)))
        source = np.arange(rows * cols, dtype=np.uint32).view(np.float32).reshape(rows, cols)
        small = np.arange(256, dtype=np.float32) * 0.5
        path = scratch / "network.hrry"
        started = time.perf_counter()
        hs.save(path, {"big": source, "small": small})
        os.sync()  # nothing left to write back while transfers are timed
        wrote = time.perf_counter() - started
        entries = {e.name: e for e in hs.read_file(path).entries()}
        ranges = {key: (entries[key].data_offset, entries[key].data_length) for key in ("big", "small")}
        source_bytes = source.reshape(-1).view(np.uint8)
        with open(path, "rb") as f:  # the ranges name the very bytes of the arrays
            f.seek(ranges["small"][0])
            assert f.read(ranges["small"][1]) == small.tobytes()
        want = {"big": probe(source_bytes), "small": probe(small)}
        size = source.nbytes
        print(f"file: big [{rows}, {cols}] float32 = {size / GiB:.3f} GiB, small [256] float32 = 1 KiB; "
              f"written in {wrote:.1f} s; loopback, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
              f"pyarrow {__import__('pyarrow').__version__}")
        load_before = os.getloadavg()[0]
        print(f"prefault {args.prefault_gib:g} GiB: {prefault(args.prefault_gib):.1f} s; "
              f"load average (1 min) at the start {load_before:.2f}")

        raw_address = servers.start("raw", raw_server, str(path))
        url = servers.start("ours", our_server, str(path), args.shards)
        flight_port = servers.start("flight", flight_server, str(path), ranges, args.flight_batch_mib << 20)

        # --- cold: fresh client processes, servers that answered nothing yet -------------
        cold = {}
        if not args.no_cold:
            settings = {"raw": {"ADDRESS": list(raw_address), "RANGES": ranges}, "ours": {"URL": url},
                        "flight": {"PORT": flight_port}}
            for name in ("raw", "ours", "flight"):
                settle(args.settle)
                cold[name] = report = cold_run(name, textwrap.dedent(CHILD[name]), settings[name], scratch)
                for step, got in report["probes"].items():
                    key = "small" if step.startswith("small") else "big"
                    if tuple(got) != want[key]:
                        raise AssertionError(f"cold {name} {step}: the bytes received differ from the source")

        # --- warm clients in this process -------------------------------------------------
        import pyarrow.flight as fl

        raw = RawClient(raw_address, ranges["big"], ranges["small"])
        clients.append(raw)
        session = hs.connect(url)
        clients.append(session)
        flight = fl.connect(f"grpc://127.0.0.1:{flight_port}")
        flight.wait_for_available()
        clients.append(flight)
        tickets = {key: fl.Ticket(key.encode()) for key in ("big", "small")}

        into = np.ones_like(source)  # allocated and touched once, as raw's buffer is

        competitors = {
            "raw": lambda key: raw.get(key),
            "raw, fresh buffer": lambda key: raw.get(key, fresh=True),
            "ours": lambda key: np.asarray(session.get(key)),
            "ours, into a buffer": lambda key: np.asarray(session.get(key, out=into)),
            "ours, parallel": lambda key: np.asarray(session.get(key, parallel=True)),
            "flight": lambda key: flight.do_get(tickets[key]).read_all(),
        }

        def as_bytes(name, got):
            if name == "flight":
                chunks = flight_arrays(got)
                return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
            return np.asarray(got).reshape(-1).view(np.uint8)

        # --- big --------------------------------------------------------------------------
        big_times = {name: [] for name in competitors}
        compared = set()
        order = list(competitors)
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                settle(args.settle)
                started = time.perf_counter()
                got = competitors[name]("big")
                took = time.perf_counter() - started
                data = as_bytes(name, got)
                if probe(data) != want["big"]:
                    raise AssertionError(f"{name}: the bytes received differ from the source")
                if name not in compared:
                    if not np.array_equal(data, source_bytes):
                        raise AssertionError(f"{name}: the bytes received differ from the source")
                    compared.add(name)
                big_times[name].append(took)
                del got, data

        # --- small ------------------------------------------------------------------------
        small_names = ["raw", "ours", "flight"]
        for name in small_names:
            for _ in range(20):
                if probe(as_bytes(name, competitors[name]("small"))) != want["small"]:
                    raise AssertionError(f"{name}: the small tensor received differs from the source")
        small_times = {name: [] for name in small_names}
        for i in range(args.small_gets):
            for name in (small_names if i % 2 == 0 else small_names[::-1]):
                started = time.perf_counter()
                competitors[name]("small")
                small_times[name].append(time.perf_counter() - started)
        for name in small_names:
            if probe(as_bytes(name, competitors[name]("small"))) != want["small"]:
                raise AssertionError(f"{name}: the small tensor received differs from the source")
        client_heavy = sorted(m for m in HEAVY if m in sys.modules)
    finally:
        for client in clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110 -- a client already broken: its server is stopped next
                pass
        servers.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    # --- report -------------------------------------------------------------------------
    gbs = {name: (size / min(t) / GiB, size / statistics.median(t) / GiB) for name, t in big_times.items()}
    print(f"\n1 GET of big ({size / GiB:.3f} GiB), {args.rounds} rounds, order reversed every other round; "
          f"wall time min / median, GiB/s at min / median")
    print(f"{'':<20}{'min s':>9}{'median s':>10}{'GiB/s best':>12}{'GiB/s med':>11}")
    for name, t in big_times.items():
        print(f"{name:<20}{min(t):>9.3f}{statistics.median(t):>10.3f}{gbs[name][0]:>12.2f}{gbs[name][1]:>11.2f}")
    flight_mode = "one record batch" if not args.flight_batch_mib else f"{args.flight_batch_mib} MiB batches"
    print(f"(flight: {flight_mode}; ours: parallel_shards={args.shards}, the server's default frame size)")

    def ratio_line(label, a, b, goal, higher_is_better=True):
        best, med = gbs[a][0] / gbs[b][0], gbs[a][1] / gbs[b][1]
        ok = med >= goal if higher_is_better else med <= goal
        print(f"{label:<38}{best:>7.2f} at min {med:>7.2f} at median   goal >= {goal:.1f} ({verdict(ok)})")

    print("\nthroughput ratios")
    ratio_line("ours / raw", "ours", "raw", 0.8)
    ratio_line("ours, into a buffer / raw", "ours, into a buffer", "raw", 0.8)
    ratio_line("ours / raw, fresh buffer", "ours", "raw, fresh buffer", 0.8)
    ratio_line("ours / flight", "ours", "flight", 1.0)
    ratio_line("ours, parallel / ours", "ours, parallel", "ours", 1.0)
    ratio_line("ours, parallel / raw", "ours, parallel", "raw", 0.8)

    print(f"\n{args.small_gets} GETs of small (1 KiB) each, interleaved request by request; latency in microseconds")
    print(f"{'':<20}{'p50':>10}{'p90':>10}{'min':>10}{'max':>10}")
    for name, t in small_times.items():
        print(f"{name:<20}{pct(t, .5) * 1e6:>10.1f}{pct(t, .9) * 1e6:>10.1f}{min(t) * 1e6:>10.1f}{max(t) * 1e6:>10.1f}")
    p50 = pct(small_times["ours"], .5) / pct(small_times["flight"], .5)
    p90 = pct(small_times["ours"], .9) / pct(small_times["flight"], .9)
    print(f"ours / flight: p50 {p50:.2f}, p90 {p90:.2f}   goal <= 1.0 ({verdict(p50 <= 1.0)})")

    if cold:
        print("\ncold (first GET in a fresh process, empty caches, servers that answered nothing yet) "
              "beside warm (second GET, same process); seconds")
        print(f"{'':<8}{'process':>9}{'import':>9}{'connect':>9}{'big 1st':>9}{'big 2nd':>9}{'small 1st':>11}"
              f"{'small 2nd':>11}{'par 1st':>9}{'par 2nd':>9}  heavy modules in the client")
        for name, c in cold.items():
            par = (f"{c['par1']:>9.3f}{c['par2']:>9.3f}" if "par1" in c else f"{'-':>9}{'-':>9}")
            print(f"{name:<8}{c['process']:>9.3f}{c['import']:>9.3f}{c['connect']:>9.4f}{c['big1']:>9.3f}"
                  f"{c['big2']:>9.3f}{c['small1'] * 1e3:>9.2f}ms{c['small2'] * 1e3:>9.2f}ms{par}  "
                  f"{', '.join(c['heavy']) or 'none'}")
        ours_cold = cold["ours"]
        print(f"numba imported by hs.connect + get (cold client process): {'numba' in ours_cold['heavy']}")
    print(f"numba imported in this process (hs.save, hs.connect + get, flight client): {'numba' in client_heavy}")
    for name, heavy in servers.modules.items():
        print(f"heavy modules in the {name} server process at its end: {', '.join(heavy) or 'none'}")
    print(f"\nload average (1 min) at the end {os.getloadavg()[0]:.2f} (this run's own load counts too); "
          f"whole run {time.perf_counter() - run_started:.1f} s")


if __name__ == "__main__":
    main()
