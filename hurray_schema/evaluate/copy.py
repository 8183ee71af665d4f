"""Streaming (non-temporal) copy of members' bytes into their boxes of a large output.

Assembling a partition is a copy per member.  For a box of a few megabytes the C
library's ``memcpy`` uses ordinary stores, which first read every destination line into
the cache; only very large copies switch to non-temporal stores.  A partition of many
mid-sized members therefore moves about 1.5x the bytes of one big copy.  This module
writes the destination with 64-byte (one cache line) non-temporal vector stores (LLVM
``!nontemporal``), so a partition of N members costs about one output-sized copy.

All the boxes of a partition are copied by one parallel kernel (:func:`copy_boxes`): the
rows (and pieces of long rows) of every box are shared among numba's threads, because
one core does not saturate the memory bus, and one parallel region per partition (not per
member) waits for the slowest thread once.  Small copies keep ``np.copyto`` (their
destination is better left in the cache).

The kernel saves about a third of a large copy's time, and compiling it costs about a second: a
process whose kernel cache does not hold it copies with ``np.copyto`` until the copies it would have
streamed add up to :data:`STREAMING_COMPILE_BYTES`, then compiles it (once for every later process).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from . import jit
from .jit import WORK_UNITS, claim, search_right

__all__ = ["STREAMING_MIN_BYTES", "copy_into", "copy_boxes"]

STREAMING_MIN_BYTES = 1 << 20
"""Below this many bytes a copy goes through ``np.copyto``."""

STREAMING_COMPILE_BYTES = 1 << 28
"""While the streaming kernel is neither loaded nor in the kernel cache, copies that would stream go
through ``np.copyto`` until they add up to this many bytes in the process (this call's included)."""


_VECTOR = 64  # bytes per non-temporal store: one cache line
_PIECE = 1 << 18  # a thread copies at most this many bytes of a row at a time
_TASKS = 64  # the work is split into this many runs of consecutive rows / pieces, handed out dynamically
JOB_DST, JOB_DST_STRIDE, JOB_SRC, JOB_ROWS, JOB_WIDTH = range(5)  # columns of a job table


def _pointer(builder, address, width):
    from llvmlite import ir

    return builder.inttoptr(address, ir.VectorType(ir.IntType(8), width).as_pointer())


@jit.intrinsic
def _stream_line(typingctx, dst, src):
    """Copy the 64 bytes at address ``src`` to address ``dst`` (64-byte aligned) with a non-temporal store."""

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        value = builder.load(_pointer(builder, args[1], _VECTOR), align=1)
        store = builder.store(value, _pointer(builder, args[0], _VECTOR), align=_VECTOR)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    from numba import types

    return types.void(types.int64, types.int64), codegen


@jit.intrinsic
def _copy_line(typingctx, dst, src):
    """The 64 bytes at address ``src`` to address ``dst`` (any alignment), an ordinary store."""

    def codegen(context, builder, sig, args):
        value = builder.load(_pointer(builder, args[1], _VECTOR), align=1)
        builder.store(value, _pointer(builder, args[0], _VECTOR), align=1)
        return context.get_dummy_value()

    from numba import types

    return types.void(types.int64, types.int64), codegen


@jit.intrinsic
def _copy_byte(typingctx, dst, src):
    """One byte from address ``src`` to address ``dst``."""

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        ptr = ir.IntType(8).as_pointer()
        builder.store(builder.load(builder.inttoptr(args[1], ptr)), builder.inttoptr(args[0], ptr))
        return context.get_dummy_value()

    from numba import types

    return types.void(types.int64, types.int64), codegen


@jit.intrinsic
def _store_fence(typingctx):
    """Order the non-temporal stores before anything that follows (they are weakly ordered)."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    from numba import types

    return types.void(), codegen


@jit.helper
def _stream_span(dst, src, n):
    """``n`` bytes from address ``src`` to address ``dst``: whole destination lines streamed; the partial
    lines at both ends by one ordinary unaligned 64-byte copy each (overlapping the streamed part, same
    bytes); spans shorter than a line byte by byte."""
    if n < _VECTOR:
        for c in range(n):
            _copy_byte(dst + c, src + c)
        return
    _copy_line(dst, src)
    c = _VECTOR - dst % _VECTOR  # first line-aligned destination offset
    while c + 4 * _VECTOR <= n:  # four lines per turn keep the write-combining buffers busy
        _stream_line(dst + c, src + c)
        _stream_line(dst + c + _VECTOR, src + c + _VECTOR)
        _stream_line(dst + c + 2 * _VECTOR, src + c + 2 * _VECTOR)
        _stream_line(dst + c + 3 * _VECTOR, src + c + 3 * _VECTOR)
        c += 4 * _VECTOR
    while c + _VECTOR <= n:
        _stream_line(dst + c, src + c)
        c += _VECTOR
    if c < n:
        _copy_line(dst + n - _VECTOR, src + n - _VECTOR)


def _first_items(jobs: np.ndarray) -> np.ndarray:
    """``first[j]``: number of the first work item (row, or piece of a long row) of job ``j``; ``first[-1]``
    is the item count."""
    pieces = (jobs[:, JOB_WIDTH] + _PIECE - 1) // _PIECE
    return np.concatenate([[0], np.cumsum(jobs[:, JOB_ROWS] * pieces)]).astype(np.int64)


@jit.kernel("void(i64[:], i64[:, :], i64[:])")
def _stream_jobs_kernel(work, jobs, first):
    """Run a job table: job ``j`` copies ``jobs[j, JOB_ROWS]`` rows of ``jobs[j, JOB_WIDTH]`` bytes from
    the contiguous source at address ``jobs[j, JOB_SRC]`` to rows ``JOB_DST_STRIDE`` bytes apart from
    address ``jobs[j, JOB_DST]``.  Work items are rows, or :data:`_PIECE`-byte pieces of long rows,
    numbered across jobs (``first``: :func:`_first_items`); each unit of ``work`` is a run of
    consecutive items, and a thread fences its streamed stores once it has no unit left."""
    items = first[first.size - 1]
    tasks = work[WORK_UNITS]
    while True:
        t = claim(work)
        if t < 0:
            break
        lo = items * t // tasks
        hi = items * (t + 1) // tasks
        j = search_right(first, lo) - 1
        for item in range(lo, hi):
            while item >= first[j + 1]:
                j += 1
            width = jobs[j, JOB_WIDTH]
            pieces = (width + _PIECE - 1) // _PIECE
            r = (item - first[j]) // pieces
            c = (item - first[j]) % pieces * _PIECE
            _stream_span(jobs[j, JOB_DST] + r * jobs[j, JOB_DST_STRIDE] + c, jobs[j, JOB_SRC] + r * width + c,
                         min(width - c, _PIECE))
    _store_fence()  # a thread orders its own streamed stores


def _stream_jobs(jobs: np.ndarray) -> None:
    """Run the job table ``jobs`` (int64, one row per copy) on the threads: a free thread takes the next
    of at most :data:`_TASKS` runs of work items, so a thread sharing a busy core holds up less."""
    first = _first_items(jobs)
    jit.run_parallel(_stream_jobs_kernel, int(min(first[-1], _TASKS)), jobs, first)


def _byte_rows(a: np.ndarray):
    """``a`` as a 2-D uint8 matrix of its last-axis rows, a view (never a copy), or None."""
    if a.ndim == 0 or a.strides[-1] != a.itemsize:
        return None
    b = a.view(np.uint8)
    if b.ndim == 1:
        return b[None, :]
    for k in range(b.ndim - 2):  # the leading axes collapse into one row axis only if they nest evenly
        if b.strides[k] != b.strides[k + 1] * b.shape[k + 1]:
            return None
    rows = int(np.prod(b.shape[:-1]))
    return np.lib.stride_tricks.as_strided(b, (rows, b.shape[-1]), (b.strides[-2], 1))


def _job(dst: np.ndarray, src: np.ndarray):
    """The job-table row streaming ``src`` into ``dst``, or None when it goes through ``np.copyto``."""
    if src.nbytes < STREAMING_MIN_BYTES or src.shape != dst.shape or src.dtype != dst.dtype \
            or not src.flags.c_contiguous or not dst.flags.writeable:
        return None
    d, s = _byte_rows(dst), _byte_rows(src)
    if d is None or s is None:
        return None
    return (d.ctypes.data, d.strides[0], s.ctypes.data, d.shape[0], d.shape[1])


def copy_boxes(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
    """``np.copyto(dst, src)`` for every pair (the destinations must not overlap), the large ones
    streamed together by one parallel kernel.

    A pair streams when both arrays have the same dtype and shape, ``src`` is C-contiguous, the
    rows of ``dst`` are contiguous along the last axis and the copy is at least
    :data:`STREAMING_MIN_BYTES`; otherwise it is ``np.copyto``.
    """
    jobs, keep = [], []
    for dst, src in pairs:
        job = _job(dst, src)
        if job is None:
            np.copyto(dst, src)
        else:
            jobs.append(job)
            keep.append((dst, src))  # the kernel works on raw addresses: the arrays stay alive until it returns
    if jobs and _stream_jobs_kernel.worth_it(sum(dst.nbytes for dst, _ in keep), STREAMING_COMPILE_BYTES):
        _stream_jobs(np.array(jobs, np.int64))
    else:
        for dst, src in keep:
            np.copyto(dst, src)
    del keep


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``, streaming the stores when the copy is large (see :func:`copy_boxes`)."""
    copy_boxes([(dst, src)])
