"""GET and PUT over a Unix socket with shared memory (``hurray+unix``) against TCP loopback, same run.

    python benchmarks/ipc.py [--gib 1] [--mid-mib 64] [--put-mib 256] [--rounds 7] [--settle 0.3]
                             [--prefault-gib 4] [--no-cold]

One ``.hrry`` file is written to a temporary folder: ``big``, a [rows, 1 Mi / 4] float32 tensor
of ``--gib`` GiB, and ``mid``, one of ``--mid-mib`` MiB (every element distinct: the bits of
consecutive integers).  Two servers run, each in a process of its own (``multiprocessing``,
spawn):

* ``file``  -- ``hs.serve([file], port=0, unix=SOCKET)``: one server, listening on TCP loopback
  and on a Unix socket, so every GET competitor is answered by the same process from the same
  file;
* ``store`` -- ``hs.serve([], port=0, unix=SOCKET, memory_store=True)``: PUTs held in memory, each
  in a sealed memfd that Unix-socket clients map.

The competitors, each one ``hs.connect`` session in this process:

* ``unix, shm``    -- ``hs.connect(unix_url)``: shared memory (the default over a Unix socket):
  the GET answers with a sealed memfd (``SCM_RIGHTS``) holding the tensor -- a copy of the served
  file's bytes the server made at the first GET and keeps (the file itself could shrink under a
  mapping) -- and the client maps the tensor's range read-only; a PUT copies the array once into a
  sealed memfd and passes that;
* ``unix, frames`` -- ``hs.connect(unix_url, shm=False)``: the plain frames over the Unix socket
  (for reference);
* ``tcp``          -- ``hs.connect(tcp_url)``: the plain frames over TCP loopback (the baseline).

Figures:

1. GET: wall time of ``numpy.asarray(session.get(key))`` for ``big`` and ``mid``, ``--rounds``
   rounds, the (competitor, size) order reversed every other round (ABC.., ..CBA), with
   ``gc.collect()``, ``os.sync()`` and a ``--settle`` pause before each transfer; min and
   median, and the ratios unix / TCP at min and at median (acceptance for ``big``, shm:
   <= 0.05).  Beside it, not part of the GET time, the first read of one byte in every page of
   the array received (a mapping's page faults come due there, not in the GET); and, as a
   reference row timed in the same order, ``fresh buffer``: ``numpy.ones`` of the tensor's size,
   the page faults any copying receiver pays for its destination (on a VM that hands freed
   memory back to the host, they swing the copying competitors' times from round to round);
2. size: the ``big`` time beside the ``mid`` time per competitor, and the ratio big / mid
   (acceptance for shm: about the same, no cost grows with size; read here as a ratio of
   medians between 0.5 and 2; the sizes' own ratio is what a copy would show);
3. PUT: wall time of ``session.put(key, array)`` of a ``--put-mib`` MiB float32 array into the
   ``store`` server, per competitor, same rounds and order rule; the ratio unix shm / TCP; and
   after each PUT a second client process (one ``hs.connect(store_unix_url)`` session, shm)
   GETs the key just pushed: the wall time of that GET;
4. cold: each client in a fresh Python process (its caches in a new empty folder): the
   process's wall time, its import of ``hurray_schema``, connect, first and second GET of
   ``big`` and of ``mid`` -- first = cold, second = warm in the same process.

Everything received is checked outside the timing: the CRC-32 of 64 KiB at seven places against
the source's every time, and the bytes equal to the source's (``numpy.array_equal`` of the raw
bytes) once per competitor and size (the second process does the same for what it GETs after a
PUT).  For each, also printed: ``arr.flags.writeable``, whether it can be set True (it cannot
over a read-only buffer: a mapping), and the mapping of ``/proc/self/maps`` that holds the
array's first byte (the served file, a ``/memfd:``, or none: anonymous memory, a copy).  Times
are wall times; nothing is asserted.

Before anything is timed the file is synced to disk and ``--prefault-gib`` GiB of memory is
touched once (on a VM that backs guest memory at first touch, memory never used since boot
costs several times more to fault in, and would land on whichever copy used it first).  The
load average at the start and the end is printed: on a shared machine, a noisy run shows.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from caches import caches_in
from transport_support import (
    GiB, MiB, HEAVY, Processes, await_stop, cold_run, heavy_modules, prefault, probe, settle, verdict,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGE = mmap.PAGESIZE
COLS = (1 << 20) // 4
STARTS = {"big": 0, "mid": 1 << 30, "put": 1 << 31}
"""The first integer of each source's bits (the sources differ, so a wrong key shows)."""
COMPETITORS = ("unix, shm", "unix, frames", "tcp")
FRESH = "fresh buffer"
"""The reference row: ``numpy.ones`` of the tensor's size (allocate and touch every page)."""


# ------------------------------------------------------------------------------------
# Sources and checking what arrived
# ------------------------------------------------------------------------------------


def source(name: str, rows: int):
    """The [rows, COLS] float32 source ``name``: the bits of consecutive integers."""
    import numpy as np

    start = STARTS[name]
    return np.arange(start, start + rows * COLS, dtype=np.uint32).view(np.float32).reshape(rows, COLS)


def rows_of(nbytes: float) -> int:
    return max(1, round(nbytes / (COLS * 4)))


def raw_bytes(arr):
    """The array's bytes as a flat uint8 view (no copy): compared as bytes, a NaN is equal too."""
    import numpy as np

    return np.asarray(arr).reshape(-1).view(np.uint8)


def backing(arr) -> str:
    """The mapping of ``/proc/self/maps`` that holds ``arr``'s first byte: a file's path, a
    ``/memfd:NAME``, or ``anonymous`` (private memory: the bytes were copied into it)."""
    address = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                name = fields[5].strip() if len(fields) == 6 else ""
                return f"{fields[1]} {name or 'anonymous'}"
    return "not mapped?"


def read_only_facts(arr) -> dict:
    """``writeable``: ``arr.flags.writeable``; ``settable``: whether a view of it can be made
    writeable (no when the buffer under it is read-only); ``backing``: see :func:`backing`."""
    view = arr.view()
    try:
        view.flags.writeable = True
        settable = True
    except ValueError:
        settable = False
    return {"writeable": bool(arr.flags.writeable), "settable": settable, "backing": backing(arr)}


def touch_pages(arr) -> float:
    """Seconds to read one byte in every page of ``arr`` (a mapping's page faults come due here)."""
    flat = raw_bytes(arr)
    started = time.perf_counter()
    int(flat[::PAGE].sum())
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------
# Processes of their own: send ("ready", address), work until "stop" comes on the pipe, then
# send ("modules", heavy modules imported) and exit
# ------------------------------------------------------------------------------------


def file_server(path: str, sock: str, pipe) -> None:
    try:
        import hurray_schema as hs

        with hs.serve([path], host="127.0.0.1", port=0, unix=sock) as server:
            pipe.send(("ready", (server.tcp_url, server.unix_url)))
            await_stop(pipe)
        pipe.send(("modules", heavy_modules()))
    except (KeyboardInterrupt, BrokenPipeError, EOFError):
        pass


def store_server(sock: str, pipe) -> None:
    try:
        import hurray_schema as hs

        with hs.serve([], host="127.0.0.1", port=0, unix=sock, memory_store=True) as server:
            pipe.send(("ready", (server.tcp_url, server.unix_url)))
            await_stop(pipe)
        pipe.send(("modules", heavy_modules()))
    except (KeyboardInterrupt, BrokenPipeError, EOFError):
        pass


def reader(url: str, put_rows: int, pipe) -> None:
    """The second client process: one session (shm) to the store; on ``("get", key)`` GETs it
    and answers ``("got", report)`` (its wall time, then the checks, outside the timing)."""
    try:
        import numpy as np

        import hurray_schema as hs

        want = raw_bytes(source("put", put_rows))
        want_probe = probe(want)
        compared = set()
        with hs.connect(url) as session:
            pipe.send(("ready", session.shared))
            while True:
                try:
                    message = pipe.recv()
                except EOFError:
                    break
                if message == "stop":
                    break
                _, key = message
                started = time.perf_counter()
                arr = np.asarray(session.get(key))
                took = time.perf_counter() - started
                report = {"time": took, "probe_ok": probe(arr) == want_probe, **read_only_facts(arr)}
                if key not in compared:
                    report["equal"] = bool(np.array_equal(raw_bytes(arr), want))
                    compared.add(key)
                del arr
                pipe.send(("got", report))
        pipe.send(("modules", heavy_modules()))
    except (KeyboardInterrupt, BrokenPipeError, EOFError):
        pass


# ------------------------------------------------------------------------------------
# Cold: each client in a fresh process
# ------------------------------------------------------------------------------------

CHILD = r'''
timed("import", lambda: __import__("hurray_schema"))
import hurray_schema as hs, numpy as np
session = timed("connect", lambda: hs.connect(URL, **OPTIONS))
report["shared"] = session.shared
for name, key in (("big1", "big"), ("big2", "big"), ("mid1", "mid"), ("mid2", "mid")):
    arr = timed(name, lambda: np.asarray(session.get(key)))
    report["probes"][name] = probe(arr)
    del arr
session.close()
'''
"""A cold client's body (:func:`transport_support.cold_run`), given ``URL`` and ``OPTIONS``."""


# ------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big tensor in GiB")
    parser.add_argument("--mid-mib", type=float, default=64, help="size of the second tensor in MiB")
    parser.add_argument("--put-mib", type=float, default=256, help="size of the array PUT in MiB")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the GETs and of the PUTs")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds of pause before each timed transfer")
    parser.add_argument("--prefault-gib", type=float, default=4,
                        help="GiB of memory touched once before anything is measured (0: none)")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process (cold) clients")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the processes are stopped, the folder removed

    import numpy as np

    scratch = Path(tempfile.mkdtemp(prefix="hurray-ipc-"))
    os.environ.update(caches_in(tempfile.mkdtemp(prefix="caches-", dir=scratch)))  # every process starts empty
    procs = Processes("ipc")
    sessions = []
    run_started = time.perf_counter()
    try:
        import hurray_schema as hs

        rows = {"big": rows_of(args.gib * GiB), "mid": rows_of(args.mid_mib * MiB)}
        sources = {key: source(key, n) for key, n in rows.items()}
        put_rows = rows_of(args.put_mib * MiB)
        put_source = source("put", put_rows)
        path = scratch / "ipc.hrry"
        started = time.perf_counter()
        hs.save(path, sources)
        os.sync()  # nothing left to write back while transfers are timed
        wrote = time.perf_counter() - started
        want_bytes = {key: raw_bytes(a) for key, a in sources.items()}
        want = {key: probe(b) for key, b in want_bytes.items()}
        size = {key: a.nbytes for key, a in sources.items()}
        print(f"file: big [{rows['big']}, {COLS}] float32 = {size['big'] / GiB:.3f} GiB, mid [{rows['mid']}, {COLS}] "
              f"= {size['mid'] / MiB:.0f} MiB; written in {wrote:.1f} s; PUT array [{put_rows}, {COLS}] float32 = "
              f"{put_source.nbytes / MiB:.0f} MiB; {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
              f"page {PAGE} B")
        load_before = os.getloadavg()[0]
        print(f"prefault {args.prefault_gib:g} GiB: {prefault(args.prefault_gib):.1f} s; "
              f"load average (1 min) at the start {load_before:.2f}")

        tcp_url, unix_url = procs.start("file", file_server, str(path), str(scratch / "file.sock"))
        store_tcp, store_unix = procs.start("store", store_server, str(scratch / "store.sock"))
        urls = {"unix, shm": (unix_url, {}), "unix, frames": (unix_url, {"shm": False}), "tcp": (tcp_url, {})}
        store_urls = {"unix, shm": (store_unix, {}), "unix, frames": (store_unix, {"shm": False}),
                      "tcp": (store_tcp, {})}

        # --- cold: fresh client processes, a server that answered nothing yet -------------
        cold = {}
        if not args.no_cold:
            for name in COMPETITORS:
                settle(args.settle)
                url, options = urls[name]
                cold[name] = report = cold_run(name, CHILD, {"URL": url, "OPTIONS": options}, scratch)
                for step, got in report["probes"].items():
                    if tuple(got) != want[step[:3]]:
                        raise AssertionError(f"cold {name} {step}: the bytes received differ from the source")

        # --- GET: warm sessions in this process -------------------------------------------
        for name in COMPETITORS:
            url, options = urls[name]
            sessions.append(hs.connect(url, **options))
        gets = dict(zip(COMPETITORS, sessions))
        shared = {name: s.shared for name, s in gets.items()}
        pairs = [(name, key) for key in ("big", "mid") for name in (*COMPETITORS, FRESH)]
        get_times = {pair: [] for pair in pairs}
        touch_times = {pair: [] for pair in pairs}
        facts = {}
        for r in range(args.rounds):
            for name, key in (pairs if r % 2 == 0 else pairs[::-1]):
                settle(args.settle)
                if name == FRESH:  # what any copying receiver pays for its destination, this round
                    started = time.perf_counter()
                    np.ones(size[key], np.uint8)
                    get_times[name, key].append(time.perf_counter() - started)
                    continue
                started = time.perf_counter()
                arr = np.asarray(gets[name].get(key))
                took = time.perf_counter() - started
                touch_times[name, key].append(touch_pages(arr))
                if probe(arr) != want[key]:
                    raise AssertionError(f"{name} {key}: the bytes received differ from the source")
                if (name, key) not in facts:
                    facts[name, key] = {"equal": bool(np.array_equal(raw_bytes(arr), want_bytes[key])),
                                        "shape": arr.shape == sources[key].shape and arr.dtype == np.float32,
                                        **read_only_facts(arr)}
                    if not facts[name, key]["equal"]:
                        raise AssertionError(f"{name} {key}: the bytes received differ from the source")
                get_times[name, key].append(took)
                del arr

        # --- PUT into the memory store; a second process GETs what was pushed ------------
        for name in COMPETITORS:
            url, options = store_urls[name]
            sessions.append(hs.connect(url, **options))
        puts = dict(zip(COMPETITORS, sessions[len(COMPETITORS):]))
        put_shared = {name: s.shared for name, s in puts.items()}
        reader_shared = procs.start("reader", reader, store_unix, put_rows)
        put_keys = {name: "put-" + name.replace(", ", "-") for name in COMPETITORS}
        put_times = {name: [] for name in COMPETITORS}
        reader_times = {name: [] for name in COMPETITORS}
        reader_facts = {}
        for r in range(args.rounds):
            for name in (COMPETITORS if r % 2 == 0 else COMPETITORS[::-1]):
                settle(args.settle)
                started = time.perf_counter()
                puts[name].put(put_keys[name], put_source)
                put_times[name].append(time.perf_counter() - started)
                settle(args.settle)
                report = procs.ask("reader", ("get", put_keys[name]))
                if not report["probe_ok"] or report.get("equal") is False:
                    raise AssertionError(f"the second process's GET of {put_keys[name]}: the bytes differ from "
                                         "the array PUT")
                reader_times[name].append(report["time"])
                reader_facts.setdefault(name, report)
        client_heavy = sorted(m for m in HEAVY if m in sys.modules)
    finally:
        for session in sessions:
            try:
                session.close()
            except Exception:  # noqa: BLE001, S110 -- a session already broken: its server is stopped next
                pass
        procs.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    # --- report -------------------------------------------------------------------------
    med = statistics.median
    label = {"big": f"{size['big'] / GiB:g} GiB", "mid": f"{size['mid'] / MiB:g} MiB"}
    print("\nsessions: shared memory agreed -- " + ", ".join(f"{n}: {shared[n]}" for n in COMPETITORS)
          + f"; file server {tcp_url} and {unix_url}")

    print(f"\n1. GET, numpy.asarray(session.get(key)), {args.rounds} rounds, order reversed every other round; "
          f"milliseconds (touch: one byte per page read afterwards, not in the GET time)")
    print(f"{'':<14}{'size':>9}{'min ms':>11}{'median ms':>11}{'GiB/s med':>11}{'touch med ms':>14}")
    for name, key in pairs:
        t = get_times[name, key]
        touched = ms(med(touch_times[name, key])) if touch_times[name, key] else "-"
        print(f"{name:<14}{label[key]:>9}{ms(min(t)):>11}{ms(med(t)):>11}{size[key] / med(t) / GiB:>11.2f}"
              f"{touched:>14}")
    print(f"({FRESH}: numpy.ones of the same size, timed in the same order -- the page faults any copying "
          "receiver pays for its destination; on a VM that hands freed memory back to the host they vary a lot)")

    def ratio(a, b, key):
        ta, tb = get_times[a, key], get_times[b, key]
        return min(ta) / min(tb), med(ta) / med(tb)

    print("\ntime ratios against TCP loopback (lower is faster)")
    for key in ("big", "mid"):
        for name in ("unix, shm", "unix, frames"):
            at_min, at_med = ratio(name, "tcp", key)
            goal = (f"   acceptance <= 0.05 ({verdict(at_med <= 0.05)})"
                    if (name, key) == ("unix, shm", "big") else "")
            print(f"{name + ' / tcp, ' + label[key]:<30}{at_min:>9.4f} at min {at_med:>9.4f} at median{goal}")

    print(f"\n2. size: {label['big']} beside {label['mid']} (a copy would take {size['big'] / size['mid']:g} times "
          "as long)")
    print(f"{'':<14}{'big med ms':>12}{'mid med ms':>12}{'big/mid min':>13}{'big/mid med':>13}")
    for name in (*COMPETITORS, FRESH):
        tb, tm = get_times[name, "big"], get_times[name, "mid"]
        print(f"{name:<14}{ms(med(tb)):>12}{ms(med(tm)):>12}{min(tb) / min(tm):>13.2f}{med(tb) / med(tm):>13.2f}")
    shm_ratio = med(get_times["unix, shm", "big"]) / med(get_times["unix, shm", "mid"])
    print(f"unix, shm: {label['big']} {ms(med(get_times['unix, shm', 'big']))} ms against {label['mid']} "
          f"{ms(med(get_times['unix, shm', 'mid']))} ms; acceptance about the same (read: median ratio within "
          f"0.5..2): {verdict(0.5 <= shm_ratio <= 2)}")

    put_mib = put_source.nbytes / MiB
    print(f"\n3. PUT of a {put_mib:g} MiB array into the memory_store server, {args.rounds} rounds, order reversed "
          f"every other round; then a second process GETs it over unix (shm: {reader_shared}); milliseconds")
    print(f"{'':<14}{'PUT min':>10}{'PUT med':>10}{'GiB/s med':>11}{'2nd proc GET min':>18}{'med':>9}{'first':>9}")
    for name in COMPETITORS:
        t, g = put_times[name], reader_times[name]
        print(f"{name:<14}{ms(min(t)):>10}{ms(med(t)):>10}{put_source.nbytes / med(t) / GiB:>11.2f}"
              f"{ms(min(g)):>18}{ms(med(g)):>9}{ms(g[0]):>9}")
    for name in ("unix, shm", "unix, frames"):
        a, b = put_times[name], put_times["tcp"]
        print(f"PUT {name} / tcp: {min(a) / min(b):.3f} at min, {med(a) / med(b):.3f} at median "
              f"(shared memory agreed on the PUT session: {put_shared[name]})")

    if cold:
        print("\n4. cold (first GET in a fresh process, empty caches, a server that answered nothing yet) "
              "beside warm (second GET, same process); milliseconds")
        print(f"{'':<14}{'process':>9}{'import':>9}{'connect':>9}{'big 1st':>10}{'big 2nd':>10}{'mid 1st':>10}"
              f"{'mid 2nd':>10}  shm  heavy modules in the client")
        for name, c in cold.items():
            print(f"{name:<14}{ms(c['process']):>9}{ms(c['import']):>9}{ms(c['connect']):>9}{ms(c['big1']):>10}"
                  f"{ms(c['big2']):>10}{ms(c['mid1']):>10}{ms(c['mid2']):>10}  {c['shared']!s:<6}"
                  f"{', '.join(c['heavy']) or 'none'}")
    print("\n5. checks (outside the timing): bytes equal to the source (numpy.array_equal, once each); "
          "flags.writeable; can a view be made writeable; the mapping holding the first byte")
    for (name, key), f in facts.items():
        print(f"GET {name:<13} {label[key]:>8}: equal {f['equal']}, shape/dtype {f['shape']}, writeable "
              f"{f['writeable']}, settable {f['settable']}, {f['backing']}")
    for name, f in reader_facts.items():
        print(f"2nd process GET of the PUT via {name:<13}: equal {f.get('equal')}, writeable {f['writeable']}, "
              f"settable {f['settable']}, {f['backing']}")
    shm_read_only = all(not facts["unix, shm", key]["writeable"] and not facts["unix, shm", key]["settable"]
                        for key in ("big", "mid")) and all(
        not f["writeable"] and not f["settable"] for f in reader_facts.values())
    print(f"arrays from the shm path read-only (flags.writeable is False, and cannot be set): {shm_read_only}")

    print(f"heavy modules in this process: {', '.join(client_heavy) or 'none'}")
    for name, heavy in procs.modules.items():
        print(f"heavy modules in the {name} process at its end: {', '.join(heavy) or 'none'}")
    print(f"\nload average (1 min) at the end {os.getloadavg()[0]:.2f} (this run's own load counts too); "
          f"whole run {time.perf_counter() - run_started:.1f} s")


if __name__ == "__main__":
    main()
