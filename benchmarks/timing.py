"""Wall-clock helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``,
which puts this folder on ``sys.path``)."""

from __future__ import annotations

import statistics
import time


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
