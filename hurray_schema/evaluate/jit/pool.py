"""Parallel kernels: the pool of kernel threads, the thread settings, the work array whose units the
calls share out, and the per-thread scratch a call makes."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import _thread
from typing import Callable, Optional

import numpy as np

from .lazy import helper, intrinsic


_thread_setting = [0]
_local = threading.local()
_pool_lock = threading.Lock()


@functools.cache
def _default_threads() -> int:
    configured = os.environ.get("NUMBA_NUM_THREADS")
    if configured:
        return max(1, int(configured))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def threads() -> int:
    """Threads a parallel kernel runs on from the calling thread."""
    limit = getattr(_local, "limit", None)
    count = _thread_setting[0] or _default_threads()
    return min(count, limit) if limit else count


def set_threads(count: int) -> None:
    """Set the threads of parallel kernels for the whole process (``0``: the default)."""
    if count < 0:
        raise ValueError("thread count must be >= 0")
    _thread_setting[0] = int(count)


@contextlib.contextmanager
def thread_limit(count: int):
    """At most ``count`` threads for the parallel kernels the calling thread runs inside the block."""
    previous = getattr(_local, "limit", None)
    _local.limit = max(1, int(count)) if previous is None else max(1, min(previous, int(count)))
    try:
        yield
    finally:
        _local.limit = previous


class _Worker:
    """A kernel thread: it waits on a lock of its own for a call, runs it (the call releases the GIL),
    then releases a second lock.  Two plain locks wake a thread sooner than a pool's queue and
    futures (about 0.1 ms against 0.15 ms, with rarer stalls), which a kernel of a few milliseconds
    feels."""

    def __init__(self):
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._call: Optional[tuple] = None
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._loop, name="hurray-kernel", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            function, packed = self._call
            try:
                function(*packed)
            except BaseException as error:  # handed to the caller by wait()
                self._error = error
            self._done.release()

    def start(self, function: Callable, packed: tuple) -> None:
        self._call = (function, packed)
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()
        self._call = None
        error, self._error = self._error, None
        if error is not None:
            raise error


_idle: list = []
"""Kernel threads waiting for a call; a call takes what it needs and gives them back."""
_started = [0]
"""Kernel threads started in this process (idle or busy)."""


def _pool_size() -> int:
    """Kernel threads the process keeps at most: the helpers of one call on every thread the process is
    set to use (:func:`set_threads`, else the default); a larger earlier setting keeps its threads."""
    return (_thread_setting[0] or _default_threads()) - 1


def _take_workers(count: int) -> list:
    """Up to ``count`` kernel threads: idle ones first, then new ones while the pool has room.  Callers
    running at the same time share the pool: one whose share is taken gets fewer (or none) and runs
    its units on fewer threads."""
    with _pool_lock:
        taken = [_idle.pop() for _ in range(min(count, len(_idle)))]
        new = max(0, min(count - len(taken), _pool_size() - _started[0]))
        _started[0] += new
    return taken + [_Worker() for _ in range(new)]


def _give_back(workers: list) -> None:
    with _pool_lock:
        _idle.extend(workers)


def _forget_pool() -> None:
    """In a forked child the parent's kernel threads do not exist: start new ones when needed."""
    global _pool_lock
    _pool_lock = threading.Lock()
    _idle.clear()
    _started[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


WORK_NEXT, WORK_UNITS, WORK_SLOT = 0, 1, 2
"""Entries of a work array: the next unclaimed unit, the number of units, the next scratch slot."""


Scratch = collections.namedtuple("Scratch", ("count", "dtype", "zeros"), defaults=(False,))
Scratch.__doc__ = """Scratch :func:`run_parallel` allocates for one call: a row of ``count`` items of ``dtype`` for each
thread that takes part (the kernel indexes it with :func:`slot`), zero-filled when ``zeros``.  (A plain
named tuple: ``typing.NamedTuple`` would compile its annotations at import, on the read path.)"""


def run_parallel(kernel_, units: int, *args, count: Optional[int] = None, scratch: tuple = ()) -> None:
    """Run ``kernel_(work, *args, *scratch arrays)`` on up to ``count`` (default :func:`threads`) threads
    at once; ``work`` is the int64 array ``[next unit, units, next slot]`` whose units the calls share
    out with :func:`claim`; each call may take a row of every scratch array (:func:`slot`: 0, 1, ...).
    The calling thread runs one of the calls.

    The threads come from a bounded pool (:func:`_take_workers`): the call runs on the caller and the
    helpers it gets, which may be fewer than asked for.  The scratch arrays (``scratch``:
    :class:`Scratch`) are made here, once the helpers are known, with one row per call that runs, so
    that no slot a call takes can fall outside them, whatever other threads set meanwhile."""
    wanted = 1 if units <= 1 or count == 1 else min(threads() if count is None else count, units)
    helpers = _take_workers(wanted - 1) if wanted > 1 else []
    calls = 1 + len(helpers)
    try:
        arrays = tuple(_scratch_rows(spec.count, spec.dtype, calls, spec.zeros) for spec in scratch)
        assert all(array.shape[0] >= calls for array in arrays)  # a slot per call: slot() stays below calls
        function, packed = kernel_.prepare((np.array([0, units, 0], np.int64),) + args + arrays)
    except BaseException:
        _give_back(helpers)
        raise
    if not helpers:
        function(*packed)
        return
    for worker in helpers:
        worker.start(function, packed)
    try:
        function(*packed)
    finally:
        errors = []
        for worker in helpers:  # every helper has finished before any error goes on
            try:
                worker.wait()
            except BaseException as error:
                errors.append(error)
        _give_back(helpers)
        if errors:
            raise errors[0]


@intrinsic
def _fetch_add(typingctx, counter, index, value):
    """``counter[index] += value`` as one atomic step (LLVM ``atomicrmw add``, monotonic) on an int64
    array; returns the value before."""
    from numba import types
    from numba.core import cgutils

    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        array = context.make_array(aty)(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.int64)
        pointer = cgutils.get_item_pointer(context, builder, aty, array, [i], wraparound=False, boundscheck=False)
        return builder.atomic_rmw("add", pointer, context.cast(builder, args[2], sig.args[2], types.int64),
                                  "monotonic")

    return types.int64(counter, index, value), codegen


fetch_add = _fetch_add


@helper(inline="always")
def claim(work):
    """The next unit of ``work`` for the calling thread, or -1 when none is left."""
    unit = _fetch_add(work, WORK_NEXT, 1)
    return unit if unit < work[WORK_UNITS] else -1


@helper(inline="always")
def slot(work):
    """A scratch slot of its own for the calling thread's run of the kernel (0, 1, ...)."""
    return _fetch_add(work, WORK_SLOT, 1)


@helper(inline="always")
def search_left(a, value):
    """The first position of the sorted ``a`` whose entry is ``>= value`` (``np.searchsorted``, left),
    written out: numba's own compiles several functions."""
    lo, hi = 0, a.size
    while lo < hi:
        middle = (lo + hi) >> 1
        if a[middle] < value:
            lo = middle + 1
        else:
            hi = middle
    return lo


@helper(inline="always")
def search_right(a, value):
    """The first position of the sorted ``a`` whose entry is ``> value`` (``np.searchsorted``, right)."""
    lo, hi = 0, a.size
    while lo < hi:
        middle = (lo + hi) >> 1
        if a[middle] <= value:
            lo = middle + 1
        else:
            hi = middle
    return lo


CACHE_LINE = 64
"""Bytes of a cache line: each thread's scratch starts on a line of its own (:func:`scratch`)."""


def _scratch_rows(count: int, dtype, rows: int, zeros: bool = False) -> np.ndarray:
    """``(rows, stride)`` items of ``dtype``, each row of at least ``count`` items starting on a cache
    line and padded to whole lines -- threads writing their own rows never share a line (false sharing
    slows both down)."""
    dtype = np.dtype(dtype)
    rows = max(1, rows)
    per_line = CACHE_LINE // dtype.itemsize
    stride = max(1, -(-max(count, 1) // per_line)) * per_line
    raw = (np.zeros if zeros else np.empty)(rows * stride * dtype.itemsize + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start:start + rows * stride * dtype.itemsize].view(dtype).reshape(rows, stride)


@helper
def claim_span(work, count):
    """``[start, stop)`` of the next unit of ``work`` over ``count`` items for the calling thread (units
    of equal runs, :func:`unit_span`); an empty span when none is left."""
    unit = claim(work)
    if unit < 0:
        return count, count
    return unit_span(unit, work[WORK_UNITS], count)


@helper(inline="always")
def unit_span(unit, units, count):
    """``[start, stop)`` of unit ``unit`` of ``units`` equal runs over ``count`` items."""
    per = (count + units - 1) // units
    start = unit * per
    return start, min(count, start + per)
