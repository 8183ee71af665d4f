"""The streaming copy used to assemble partitions writes exactly what np.copyto writes."""

from __future__ import annotations

import numpy as np
import pytest

from hurray_schema.evaluate import copy as copy_module
from hurray_schema.evaluate.copy import copy_into


@pytest.fixture(autouse=True)
def stream_small_copies(monkeypatch):
    monkeypatch.setattr(copy_module, "STREAMING_MIN_BYTES", 1)  # exercise the streaming kernel on small arrays


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


def test_streaming_kernel_is_used_for_large_copies(monkeypatch):
    calls = []
    original = copy_module._stream_rows
    monkeypatch.setattr(copy_module, "_stream_rows", lambda d, s: (calls.append(d.shape), original(d, s)))
    out = np.zeros((16, 4096), np.float32)
    src = np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096)
    copy_into(out[4:12], src)
    assert calls == [(8, 4096 * 4)]
    assert np.array_equal(out[4:12], src) and not out[:4].any() and not out[12:].any()


def test_three_dimensional_box_whose_rows_nest_is_streamed(monkeypatch):
    calls = []
    original = copy_module._stream_rows
    monkeypatch.setattr(copy_module, "_stream_rows", lambda d, s: (calls.append(d.shape), original(d, s)))
    out = np.zeros((5, 6, 40), np.int16)
    src = np.arange(2 * 6 * 17, dtype=np.int16).reshape(2, 6, 17)
    copy_into(out[2:4, :, 3:20], src)  # full middle axis: rows nest, 12 rows of 34 bytes
    assert calls == [(12, 34)]
    expected = np.zeros_like(out)
    expected[2:4, :, 3:20] = src
    assert np.array_equal(out, expected)
