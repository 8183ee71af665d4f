"""Composite merge speed: copy floor vs NumPy reference vs the numba evaluator, same run.

    python benchmarks/merge.py [--repeat 7] [--n-overlay 4096] [--n-partition 8192] [--threads N]

For each case it prints the median wall time of

* ``copy``  -- one ``np.copyto`` of an output-sized array into a preallocated output
  (the memory-bandwidth floor),
* ``numpy`` -- the vectorized NumPy reference (``tests/support/evaluate_reference.py``: unpack,
  dequantize, overlay / assemble with whole-array operations),
* ``numba`` -- ``hurray_schema.evaluate.materialize`` (allocates its output),

and the ratios numba/copy and numpy/numba.  Targets (issue 5): SpQR overlay within 2.5x of
the copy and >= 30x faster than the reference; the partition within 1.5x of the copy.
JIT compilation (first call, or loading the on-disk cache) is timed separately.
Results are checked bit-identical to the reference before timing.  Nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, and tests.support beside it

import numpy as np  # noqa: E402

from hurray_schema.evaluate import materialize  # noqa: E402
from hurray_schema.model import CombineOp  # noqa: E402
from support import median_time  # noqa: E402
from tests.support.evaluate_reference import (band_partition, bits_equal, grid_partition,  # noqa: E402
                                              ref_block_affine, ref_overlay, ref_partition, ref_unpack_int4, spqr)


def numpy_spqr(comp, combine):
    """Reference evaluation straight from the buffers (what a user would write by hand)."""
    base, corr = comp.members
    n, m = base.descriptor.shape
    q = base.descriptor.quantization
    nb = -(-m // q.block_size)
    data = np.frombuffer(base.buffers[0], np.uint8)
    scales = np.frombuffer(base.buffers[1], np.float16)  # scale_type_tag float16: decodes to the head type
    zps = np.frombuffer(base.buffers[2], np.int32)
    codes = ref_unpack_int4(data, n * nb * q.block_size, True).reshape(n, nb * q.block_size)
    out = ref_block_affine(codes, scales, zps, q.block_size, np.float16)[:, :m]
    nnz = corr.descriptor.layout.nnz
    coords = np.frombuffer(corr.buffers[1], np.uint64).reshape(nnz, 2).astype(np.int64)
    vals = np.frombuffer(corr.buffers[0], np.float16)
    return ref_overlay(out, [("sparse", (0, 0), coords, vals)], combine)


def numpy_partition(comp):
    parts = []
    for mem in comp.members:
        d = mem.descriptor
        parts.append((d.shard.shard_offset, np.frombuffer(mem.buffers[0], np.float32).reshape(d.shape)))
    return ref_partition(comp.descriptor.shape, np.float32, parts)


def report(name, copy_t, ref_t, ev_t, out_t, jit_t, targets):
    print(f"{name}")
    print(f"  copy          {copy_t * 1e3:9.2f} ms   (np.copyto into a preallocated output)")
    print(f"  numpy         {ref_t * 1e3:9.2f} ms")
    print(f"  numba         {ev_t * 1e3:9.2f} ms   (fresh output array: includes first-touch page faults)")
    print(f"  numba (out=)  {out_t * 1e3:9.2f} ms   (into a preallocated output, like the copy)")
    print(f"  first call incl. JIT / cache load: {jit_t * 1e3:.0f} ms")
    tgt = f"  (target >= {targets[1]}x)" if targets[1] else ""
    print(f"  numba(out=)/copy = {out_t / copy_t:5.2f}x  (target <= {targets[0]}x)   numba/copy = {ev_t / copy_t:5.2f}x")
    print(f"  numpy/numba(out=) = {ref_t / out_t:6.1f}x{tgt}   numpy/numba = {ref_t / ev_t:6.1f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--n-overlay", type=int, default=4096)
    ap.add_argument("--n-partition", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (default: the CPUs this process may use)")
    args = ap.parse_args()
    from hurray_schema.evaluate import jit
    if args.threads:
        jit.set_threads(args.threads)
    print(f"kernel threads: {jit.threads()}")

    for combine in (CombineOp.REPLACE, CombineOp.ADD):
        comp, _, _ = spqr(args.n_overlay, 0.01, combine)
        t0 = time.perf_counter()
        got = materialize(comp)
        jit = time.perf_counter() - t0
        ref = numpy_spqr(comp, combine)
        print(f"bit-identical to the NumPy reference: {bits_equal(got, ref)}")
        dst = np.empty_like(ref)
        np.copyto(dst, ref)
        copy_t = median_time(lambda: np.copyto(dst, ref), args.repeat)
        ref_t = median_time(lambda: numpy_spqr(comp, combine), max(3, args.repeat // 2))
        ev_t = median_time(lambda: materialize(comp), args.repeat)
        out_t = median_time(lambda: materialize(comp, out=dst), args.repeat)
        report(f"SpQR overlay [{args.n_overlay}, {args.n_overlay}] int4 per-block -> float16 + 1% float16 COO, "
               f"{combine.name.lower()}", copy_t, ref_t, ev_t, out_t, jit, (2.5, 30))

    for label, build in (("4 x 4 grid of [n/4, n/4] boxes", lambda: grid_partition(args.n_partition, 4)),
                         ("16 full-width row bands", lambda: band_partition(args.n_partition, 16))):
        comp, _ = build()
        t0 = time.perf_counter()
        got = materialize(comp)
        jit = time.perf_counter() - t0
        ref = numpy_partition(comp)
        print(f"bit-identical to the NumPy reference: {bits_equal(got, ref)}")
        del got
        dst = np.empty_like(ref)
        np.copyto(dst, ref)
        copy_t = median_time(lambda: np.copyto(dst, ref), args.repeat)
        ref_t = median_time(lambda: numpy_partition(comp), max(3, args.repeat // 2))
        ev_t = median_time(lambda: materialize(comp), args.repeat)
        out_t = median_time(lambda: materialize(comp, out=dst), args.repeat)
        report(f"partition [{args.n_partition}, {args.n_partition}] float32, 16 row-major members ({label})",
               copy_t, ref_t, ev_t, out_t, jit, (1.5, None))
        del comp, ref, dst


if __name__ == "__main__":
    main()
