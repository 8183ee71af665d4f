"""Per-block int4 quantization of a [4096, 4096] float16 array, against a copy and NumPy, same run.

    python benchmarks/quantize.py [--size 4096] [--repeat 9]

Prints the best wall time over interleaved rounds of

* ``copy``   -- ``np.copyto`` of the array into a preallocated one (the memory-bound floor);
* ``kernel`` -- ``hurray_schema.evaluate.quantize.affine_quantize``: symmetric int4 codes,
  packed two per byte, and float16 scales per block of 64 along the last axis (the kernels
  alone);
* ``1 thread`` -- the kernel on one thread (``jit.thread_limit(1)``): NumPy's quantizer runs
  on one core, so this is the per-core comparison, and the one least disturbed by other load on a
  shared machine (a parallel region waits for its slowest thread);
* ``scalar`` -- the same kernel kept on its scalar path (``vector=False``), for comparison;
* ``quantize`` -- ``hs.quantize(w, "per_block")``: the same through the public API (descriptor
  built and checked, buffers wrapped);
* ``numpy``  -- a vectorized NumPy quantizer computing the same codes and scales (its codes
  are checked equal to the kernel's, so the two do the same work),

with the ratios ``kernel / copy`` (target <= 4) and ``numpy / kernel`` (target >= 20), then
the time of ``hs.spqr(w)`` (1 % outliers) and of ``materialize()`` of its result.
Nothing here asserts: it only measures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import hurray_schema as hs  # noqa: E402
from hurray_schema.evaluate import jit  # noqa: E402
from hurray_schema.evaluate import quantize as kernels  # noqa: E402
from hurray_schema.model import ElementType  # noqa: E402

BLOCK = 64
LO, HI = kernels.code_range(ElementType.INT4, True)


def numpy_quantizer(w: np.ndarray):
    """Vectorized NumPy: scale = absmax / 7 rounded up to float16, codes = clip(rint(x / s)), packed."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(rows, cols // BLOCK, BLOCK)
    s64 = np.abs(x).max(axis=2).astype(np.float64) / HI
    s = s64.astype(np.float16)
    low = s.astype(np.float64) < s64
    s[low] = np.nextafter(s[low], np.float16(np.inf))
    s[s64 == 0] = 1
    q = np.clip(np.rint(x / s.astype(np.float32)[:, :, None]), LO, HI).astype(np.int8).reshape(rows, cols)
    nib = q.view(np.uint8) & 15
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).reshape(-1), s


def best_of_rounds(functions: dict, rounds: int) -> dict:
    """The best wall time of each function over ``rounds`` rounds, the functions interleaved in every
    round so that other load on a shared machine falls on all of them alike."""
    best = {name: float("inf") for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    n = args.size
    w = (np.random.default_rng(0).standard_normal((n, n)) * 0.02).astype(np.float16)
    dst = np.empty_like(w)

    def kernel():
        return kernels.affine_quantize(w, BLOCK, n, LO, HI, True, ElementType.FLOAT16, 4, np.uint8)

    def one_thread():
        with jit.thread_limit(1):
            return kernel()

    def scalar():
        return kernels.affine_quantize(w, BLOCK, n, LO, HI, True, ElementType.FLOAT16, 4, np.uint8, vector=False)

    codes, scales = kernel()[:2]
    scalar()  # compile
    ref_codes, ref_scales = numpy_quantizer(w)
    same = np.array_equal(codes, ref_codes) and np.array_equal(scales.astype(np.float16), ref_scales.reshape(-1))
    hs.quantize(w, "per_block", block_size=BLOCK)  # compile
    best = best_of_rounds({
        "copy": lambda: np.copyto(dst, w),
        "kernel": kernel,
        "1 thread": one_thread,
        "scalar": scalar,
        "quantize": lambda: hs.quantize(w, "per_block", block_size=BLOCK),
        "numpy": lambda: numpy_quantizer(w),
    }, args.repeat)
    t_copy, t_kernel, t_api, t_numpy = best["copy"], best["kernel"], best["quantize"], best["numpy"]
    t_scalar, t_one = best["scalar"], best["1 thread"]
    print(f"per-block int4, float16 [{n}, {n}], block {BLOCK}  (codes equal to NumPy's: {same})")
    print(f"  load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, {jit.threads()} threads"
          "  (other load slows the parallel kernel more than NumPy's one core)")
    print(f"  copy      {t_copy * 1e3:8.2f} ms")
    print(f"  kernel    {t_kernel * 1e3:8.2f} ms   {t_kernel / t_copy:6.2f} x copy   (target <= 4)")
    print(f"  1 thread  {t_one * 1e3:8.2f} ms   {t_one / t_copy:6.2f} x copy   "
          f"(numpy {t_numpy / t_one:.1f} x slower)")
    print(f"  scalar    {t_scalar * 1e3:8.2f} ms   {t_scalar / t_copy:6.2f} x copy   (the kernel without its vector steps)")
    print(f"  quantize  {t_api * 1e3:8.2f} ms   {t_api / t_copy:6.2f} x copy")
    print(f"  numpy     {t_numpy * 1e3:8.2f} ms   {t_numpy / t_kernel:6.1f} x slower than the kernel   (target >= 20)")
    composite = hs.spqr(w[:256, :256])  # compile
    composite = hs.spqr(w)
    spqr_best = best_of_rounds({"spqr": lambda: hs.spqr(w), "materialize": composite.materialize}, 3)
    t_spqr, t_mat = spqr_best["spqr"], spqr_best["materialize"]
    nnz = composite.members[1].descriptor.layout.nnz
    print(f"  spqr      {t_spqr * 1e3:8.2f} ms   ({nnz} outliers, {nnz / w.size:.3%})")
    print(f"  spqr materialize {t_mat * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
