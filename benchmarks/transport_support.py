"""What the transport benchmarks (``network.py``, ``ipc.py``) share: checks of what arrived,
the server processes and their stop signal, the fresh client processes of the cold runs,
settling the machine between transfers.  It imports nothing of hurray_schema, so a benchmark's
child processes import it too and report which heavy modules they loaded."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from caches import caches_in

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

GiB = 1 << 30
MiB = 1 << 20
PROBE = 64 * 1024
"""Bytes checked at each of the seven places :func:`probe` looks at."""
HEAVY = ("numba", "llvmlite", "scipy", "pyarrow", "pandas", "ml_dtypes", "dask")
"""Modules a client that only reads tensors should not need."""


def probe(buf) -> tuple:
    """``(length, CRC-32 of 64 KiB at seven places)`` of a bytes-like (or NumPy) object."""
    view = memoryview(buf).cast("B")
    n = len(view)
    places = sorted({min(max(0, int(n * f)), max(0, n - PROBE)) for f in (0, 1 / 7, 2 / 7, 0.5, 5 / 7, 6 / 7, 1)})
    return (n, *(zlib.crc32(view[p : p + PROBE]) for p in places))


def heavy_modules() -> list[str]:
    """The :data:`HEAVY` modules this process has imported."""
    return sorted(name for name in HEAVY if name in sys.modules)


def await_stop(pipe) -> None:
    """A server process's main thread: wait until the parent says "stop" (or goes away)."""
    try:
        while pipe.recv() != "stop":
            pass
    except (EOFError, KeyboardInterrupt):
        pass


def settle(pause: float) -> None:
    """Before a timed transfer: collect garbage, flush the page cache's dirty pages, pause."""
    gc.collect()
    os.sync()
    time.sleep(pause)


def prefault(gib: float) -> float:
    """Touch ``gib`` GiB once and free it; returns the seconds it took.  On a VM whose memory
    the host backs at first touch, never-touched memory costs far more to fault in (here up to
    2.6 s/GiB against 0.2) and would land on whichever transfer first needs it."""
    import numpy as np

    started = time.perf_counter()
    for _ in range(round(gib)):
        np.ones(GiB, np.uint8)
    return time.perf_counter() - started


def verdict(ok: bool) -> str:
    return "meets" if ok else "misses"


class Processes:
    """Server (and helper) processes, each told "stop" by :meth:`stop` and terminated if it does
    not go.  A process's target takes its arguments and then a pipe: it sends ``("ready",
    address)`` once it serves, answers what it is asked with ``(kind, value)``, and on "stop"
    sends the heavy modules it imported (kept in ``modules``)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[str, tuple] = {}
        self.modules: dict[str, list] = {}

    def start(self, name: str, target, *args):
        """Start ``target(*args, pipe)`` as process ``name``; returns the address it is ready at."""
        mine, theirs = self.ctx.Pipe()
        proc = self.ctx.Process(target=target, args=(*args, theirs), name=f"{self.prefix}-{name}", daemon=True)
        proc.start()
        self.procs[name] = (proc, mine)
        if not mine.poll(120):
            raise RuntimeError(f"the {name} process did not start")
        kind, address = mine.recv()
        if kind != "ready":
            raise RuntimeError(f"the {name} process answered {kind!r}")
        return address

    def ask(self, name: str, message, timeout: float = 300):
        _, pipe = self.procs[name]
        pipe.send(message)
        if not pipe.poll(timeout):
            raise RuntimeError(f"the {name} process did not answer within {timeout} s")
        return pipe.recv()[1]

    def stop(self) -> None:
        for name, (proc, pipe) in self.procs.items():
            try:
                pipe.send("stop")
                if pipe.poll(10):
                    self.modules[name] = pipe.recv()[1]
            except (OSError, EOFError):
                pass
        for proc, _ in self.procs.values():
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs.clear()


CHILD_PREFIX = r'''
import json, sys, time
started = time.perf_counter()
from transport_support import heavy_modules, probe
report = {"probes": {}}
def timed(name, fn):
    t = time.perf_counter()
    value = fn()
    report[name] = time.perf_counter() - t
    return value
'''
"""The start of a cold client's code: ``timed(name, fn)`` records ``fn``'s wall time in ``report``."""

CHILD_SUFFIX = r'''
report["heavy"] = heavy_modules()
report["total_in_process"] = time.perf_counter() - started
print(json.dumps(report))
'''


def cold_run(name: str, body: str, settings: dict, scratch: Path) -> dict:
    """Client ``name`` in a fresh process with empty caches (:func:`caches.caches_in`): ``body`` (which fills
    ``report``) after :data:`CHILD_PREFIX` and a line per setting (``NAME = value``).  Its report,
    plus ``process``: its wall time from spawn to exit."""
    code = (CHILD_PREFIX + "".join(f"{key} = {value!r}\n" for key, value in settings.items())
            + body + CHILD_SUFFIX)
    path = os.pathsep.join(filter(None, [str(ROOT), str(HERE), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, **caches_in(tempfile.mkdtemp(prefix="caches-cold-", dir=scratch)), PYTHONPATH=path)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=False)  # on Ctrl-C, run() kills the child before re-raising
    took = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"the cold {name} client failed:\n{done.stderr}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["process"] = took
    return report
