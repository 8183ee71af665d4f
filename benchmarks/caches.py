"""The caches a fresh install starts with, for the benchmarks' cold processes."""

from __future__ import annotations

from pathlib import Path


def caches_in(folder) -> dict:
    """Environment variables putting both caches a process fills into ``folder``: numba's (and the
    kernels', ``NUMBA_CACHE_DIR``) and the generated Python code's (``HURRAY_SCHEMA_CACHE_DIR``), each
    in a folder of its own.  An empty ``folder`` is a fresh install."""
    folder = Path(folder)
    return {"NUMBA_CACHE_DIR": str(folder / "numba"), "HURRAY_SCHEMA_CACHE_DIR": str(folder / "hurray_schema")}
