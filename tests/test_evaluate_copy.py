"""The streaming copy used to assemble partitions writes exactly what np.copyto writes."""

from __future__ import annotations

import numpy as np
import pytest

from hurray_schema.evaluate import copy as copy_module
from hurray_schema.evaluate import jit
from hurray_schema.evaluate.copy import copy_into


@pytest.fixture(autouse=True)
def stream_small_copies(monkeypatch):
    monkeypatch.setattr(copy_module, "STREAMING_MIN_BYTES", 1)  # exercise the streaming kernel on small arrays
    monkeypatch.setattr(copy_module, "STREAMING_COMPILE_BYTES", 0)  # compiled at once when not in the cache


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.float16, np.float64])
@pytest.mark.parametrize("box", [((0, 0), (64, 64)), ((3, 5), (50, 37)), ((1, 1), (1, 130)), ((7, 0), (9, 200))])
def test_box_copy_matches_copyto(dtype, box):
    rng = np.random.default_rng(0)
    (r0, c0), (rows, cols) = box
    out = np.zeros((80, 200), dtype)
    expected = out.copy()
    src = rng.integers(0, 100, size=(rows, cols)).astype(dtype)
    copy_into(out[r0:r0 + rows, c0:c0 + cols], src)
    expected[r0:r0 + rows, c0:c0 + cols] = src
    assert out.tobytes() == expected.tobytes()  # inside the box and nothing outside it


def test_three_dimensional_box_and_fallbacks():
    rng = np.random.default_rng(1)
    out = np.zeros((6, 10, 70), np.float32)
    src = rng.random((3, 4, 33), dtype=np.float32)
    copy_into(out[1:4, 2:6, 5:38], src)  # rows of a 3-D box are not one 2-D view: falls back, same result
    expected = np.zeros_like(out)
    expected[1:4, 2:6, 5:38] = src
    assert np.array_equal(out, expected)
    transposed = rng.random((33, 4), dtype=np.float32).T  # not C-contiguous: np.copyto path
    copy_into(out[0, :4, :33], transposed)
    assert np.array_equal(out[0, :4, :33], transposed)


def _record_jobs(monkeypatch):
    """(rows, row bytes) of every streamed copy, in the order they reach the kernel."""
    calls = []
    original = copy_module._stream_jobs

    def spy(jobs):
        calls.extend((int(r), int(w)) for r, w in jobs[:, [copy_module.JOB_ROWS, copy_module.JOB_WIDTH]])
        return original(jobs)

    monkeypatch.setattr(copy_module, "_stream_jobs", spy)
    return calls


def test_streaming_kernel_is_used_for_large_copies(monkeypatch):
    calls = _record_jobs(monkeypatch)
    out = np.zeros((16, 4096), np.float32)
    src = np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096)
    copy_into(out[4:12], src)
    assert calls == [(8, 4096 * 4)]
    assert np.array_equal(out[4:12], src) and not out[:4].any() and not out[12:].any()


def test_three_dimensional_box_whose_rows_nest_is_streamed(monkeypatch):
    calls = _record_jobs(monkeypatch)
    out = np.zeros((5, 6, 40), np.int16)
    src = np.arange(2 * 6 * 17, dtype=np.int16).reshape(2, 6, 17)
    copy_into(out[2:4, :, 3:20], src)  # full middle axis: rows nest, 12 rows of 34 bytes
    assert calls == [(12, 34)]
    expected = np.zeros_like(out)
    expected[2:4, :, 3:20] = src
    assert np.array_equal(out, expected)


def test_many_boxes_stream_in_one_kernel_call(monkeypatch):
    """A partition's boxes reach the kernel together: rows of several boxes, odd start addresses,
    a row longer than a work piece."""
    calls = _record_jobs(monkeypatch)
    rng = np.random.default_rng(3)
    out = np.zeros((40, 3001), np.uint8)
    pairs = [(out[0:10, 1:2900], rng.integers(0, 255, (10, 2899), dtype=np.uint8)),
             (out[10:40, 0:3001], rng.integers(0, 255, (30, 3001), dtype=np.uint8)),
             (out[0:10, 2900:3001], rng.integers(0, 255, (10, 101), dtype=np.uint8))]
    long_out = np.zeros(3 * copy_module._PIECE + 1003, np.uint8)
    long_src = rng.integers(0, 255, long_out.size - 3, dtype=np.uint8)
    pairs.append((long_out[3:], long_src))
    copy_module.copy_boxes(pairs)
    assert calls == [(10, 2899), (30, 3001), (10, 101), (1, long_src.size)]
    for dst, src in pairs:
        assert dst.tobytes() == src.tobytes()
    assert long_out[:3].tobytes() == bytes(3)
    assert not out[0:10, 0].any()  # the byte left of the first box is untouched


def test_small_copies_keep_copyto(monkeypatch):
    monkeypatch.setattr(copy_module, "STREAMING_MIN_BYTES", 1 << 20)
    calls = _record_jobs(monkeypatch)
    out = np.zeros((8, 8), np.float32)
    copy_into(out[2:4], np.ones((2, 8), np.float32))
    assert calls == [] and out[2:4].all() and not out[:2].any()


def test_streaming_waits_for_enough_bytes_while_its_kernel_is_not_compiled(monkeypatch):
    """Without the kernel's machine code, copies go through np.copyto until those it would have streamed
    reach STREAMING_COMPILE_BYTES; the copy that reaches it streams (the kernel is compiled then)."""
    monkeypatch.setattr(copy_module, "STREAMING_COMPILE_BYTES", 3 * 4096 * 4)
    monkeypatch.setattr(copy_module._stream_jobs_kernel, "deferred_work", 0)
    monkeypatch.setattr(jit.kernels, "COMPILE_EAGERLY", False)
    monkeypatch.setattr(copy_module._stream_jobs_kernel, "ready", lambda index=0: False)
    calls = _record_jobs(monkeypatch)
    out = np.zeros((4, 4096), np.float32)
    rows = [np.full((1, 4096), r + 1, np.float32) for r in range(4)]
    for r in range(2):
        copy_into(out[r:r + 1], rows[r])
    assert calls == [] and np.array_equal(out[:2], np.vstack(rows[:2])) and not out[2:].any()
    copy_into(out[2:3], rows[2])
    assert calls == [(1, 4096 * 4)]
    assert np.array_equal(out[:3], np.vstack(rows[:3])) and not out[3].any()


def test_a_kernel_in_the_cache_is_ready_without_compiling(tmp_path, monkeypatch):
    """ready() loads a cached kernel and never compiles one: a fresh cache holds nothing until a call
    compiles it."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit.cache, "_the_cache", [])
    def kernel():  # a new kernel object: nothing loaded in this process yet
        return jit.Kernel(copy_module._stream_jobs_kernel.py_func, ("void(i64[:], i64[:, :], i64[:])",), {})

    compiled = jit.compile_count()
    first = kernel()
    assert not first.ready() and not first.ready() and jit.compile_count() == compiled
    first.function(0)
    assert jit.compile_count() == compiled + 1 and first.ready()
    assert kernel().ready() and jit.compile_count() == compiled + 1  # loaded from the cache

