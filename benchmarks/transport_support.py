"""What the transport benchmarks (``network.py``, ``ipc.py``) share: checks of what arrived,
the servers' stop signal, settling the machine between transfers.  It imports nothing of
hurray_schema, so a benchmark's child processes can report which heavy modules they loaded."""

from __future__ import annotations

import gc
import os
import sys
import time
import zlib

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
