"""The kernel threads (``evaluate/jit/pool.py``: ``run_parallel``, ``set_threads``, ``thread_limit``, the pool).

* a call's scratch has a row for every thread that takes part, whatever another thread sets meanwhile;
* callers running at once share a bounded pool (one whose share is taken runs on fewer threads);
* ``thread_limit`` keeps a call on the threads it allows;
* an error in one of a call's threads reaches the caller and leaves the pool whole;
* a forked child starts threads of its own;
* eight threads quantizing, decoding and merging while another changes the thread count get the
  bits they get alone.

Most tests hand ``run_parallel`` a stand-in for a kernel whose calls are Python functions: they run on
the kernel threads as a kernel's do (holding the GIL, which a compiled kernel releases), so the
threads' bookkeeping can be watched.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.evaluate import jit


class StandIn:
    """What ``run_parallel`` needs of a kernel: ``prepare(args) -> (function, packed args)``."""

    def __init__(self, function):
        self.function = function

    def prepare(self, args):
        return self.function, args


_slot_lock = threading.Lock()


def _take_slot(work) -> int:
    """:func:`jit.slot` for Python stand-ins: the next slot, atomically."""
    with _slot_lock:
        taken = int(work[jit.WORK_SLOT])
        work[jit.WORK_SLOT] += 1
    return taken


def _take_unit(work) -> int:
    with _slot_lock:
        unit = int(work[jit.WORK_NEXT])
        work[jit.WORK_NEXT] += 1
    return unit if unit < work[jit.WORK_UNITS] else -1


@pytest.fixture
def threads_set():
    """``jit.set_threads`` restored to the default after the test."""
    yield jit.set_threads
    jit.set_threads(0)


def _while_the_count_changes(target, count: int = 8, pause: float = 0.0) -> None:
    """``target(k)`` in ``count`` threads at once while another thread keeps setting the thread
    count between 1 and 8 (``pause`` seconds between changes)."""
    stop = threading.Event()

    def flip():
        n = 0
        while not stop.is_set():
            jit.set_threads(1 + n % 8)
            n += 1
            if pause:
                time.sleep(pause)

    flipper = threading.Thread(target=flip)
    flipper.start()
    workers = [threading.Thread(target=target, args=(k,)) for k in range(count)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    flipper.join()


def test_thread_limit_keeps_a_call_on_the_callers_thread(threads_set):
    threads_set(4)
    seen: set = set()

    def record(work):
        while _take_unit(work) >= 0:
            seen.add(threading.get_ident())
            time.sleep(0.001)

    with jit.thread_limit(1):
        jit.run_parallel(StandIn(record), 16)
    assert seen == {threading.get_ident()}
    seen.clear()
    jit.run_parallel(StandIn(record), 16)
    assert 1 <= len(seen) <= 4


def test_every_call_has_a_scratch_row_while_another_thread_changes_the_setting(threads_set):
    """Scratch made by run_parallel has a row per call that runs: no slot falls outside it, while a
    thread keeps changing the thread count between 1 and 8."""
    outside: list = []

    def use_row(work, rows):
        row = _take_slot(work)
        if row >= rows.shape[0]:
            outside.append((row, rows.shape[0]))
        while _take_unit(work) >= 0:
            rows[min(row, rows.shape[0] - 1), 0] += 1

    def caller(k):
        for _ in range(40):
            jit.run_parallel(StandIn(use_row), 8, scratch=(jit.Scratch(1, np.int64, zeros=True),))

    _while_the_count_changes(caller)
    assert outside == []


def test_callers_at_once_share_a_bounded_pool(threads_set):
    threads_set(4)
    before = jit.pool._started[0]
    done = []

    def slow(work):
        while _take_unit(work) >= 0:
            time.sleep(0.002)

    def caller():
        jit.run_parallel(StandIn(slow), 12)
        done.append(1)

    callers = [threading.Thread(target=caller) for _ in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(done) == 8
    assert jit.pool._started[0] <= max(before, 3)  # helpers of one call on four threads, shared by all eight


def test_an_error_in_a_helper_reaches_the_caller_and_the_pool_stays_whole(threads_set):
    threads_set(4)
    caller = threading.get_ident()

    def fail_off_the_caller(work):
        while _take_unit(work) >= 0:
            time.sleep(0.002)
            if threading.get_ident() != caller:
                raise ValueError("a helper failed")

    jit.run_parallel(StandIn(lambda work: None), 8)  # the pool's threads exist
    idle = len(jit.pool._idle)
    with pytest.raises(ValueError, match="a helper failed"):
        jit.run_parallel(StandIn(fail_off_the_caller), 64)
    assert len(jit.pool._idle) == idle
    total = []
    jit.run_parallel(StandIn(lambda work: total.append(_take_unit(work))), 8)
    assert total


def _parallel_in_child(queue) -> None:
    seen: set = set()

    def record(work):
        while _take_unit(work) >= 0:
            seen.add(threading.get_ident())
            time.sleep(0.002)

    jit.set_threads(3)
    jit.run_parallel(StandIn(record), 12)
    queue.put(len(seen))


def test_a_forked_child_starts_threads_of_its_own(threads_set):
    threads_set(3)
    jit.run_parallel(StandIn(lambda work: time.sleep(0.01)), 6)  # the parent's pool has threads
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_parallel_in_child, args=(queue,))
    child.start()
    seen = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and 1 <= seen <= 3


def test_eight_threads_get_their_bits_while_the_thread_count_changes(threads_set):
    """Quantizing (int4 and NF4: kernels with per-thread scratch), decoding them (lookup tables per
    thread) and merging an overlay, each in eight threads at once, while another thread changes the
    thread count: every result is the bits the work gives alone."""
    rng = np.random.default_rng(11)
    weights = rng.standard_normal((256, 512)).astype(np.float32)
    correction = np.zeros((256, 512), np.float32)
    correction[::7, ::5] = 1.5
    jobs = {
        "int4": lambda: hs.quantize(weights, "per_block", storage=hs.ElementType.INT4, block_size=64),
        "nf4": lambda: hs.quantize(weights, "nf4", block_size=64),
        "overlay": lambda: hs.overlay(hs.Tensor.from_numpy(weights), [hs.Tensor.from_numpy(correction)],
                                      combine_op="add"),
    }

    def result(job):
        item = jobs[job]()
        return np.asarray(item).tobytes()

    alone = {job: result(job) for job in jobs}
    wrong: list = []

    def worker(k):
        for i in range(6):
            job = sorted(jobs)[(k + i) % len(jobs)]
            if result(job) != alone[job]:
                wrong.append(job)

    _while_the_count_changes(worker, pause=0.0005)
    assert wrong == []
