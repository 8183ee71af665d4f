"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``, which puts
this folder on ``sys.path``; the script puts the checkout first before importing this)."""

from __future__ import annotations

import io
import statistics
import time
from contextlib import redirect_stdout

from hurray_schema.cli import main as cli_main


def wall_times(fn, repeat: int) -> list[float]:
    """The wall time of each of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_time(fn, repeat: int) -> float:
    """The median wall time of ``repeat`` calls of ``fn``."""
    return statistics.median(wall_times(fn, repeat))


def best_time(fn, repeat: int) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn``."""
    return min(wall_times(fn, repeat))


def run_cli(*args: str) -> str:
    """Run one ``hurray-schema`` command in this process; returns what it printed."""
    sink = io.StringIO()
    with redirect_stdout(sink):
        try:
            cli_main.main(list(args), standalone_mode=False)
        except SystemExit:
            pass
    return sink.getvalue()
