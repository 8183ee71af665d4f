"""Out-of-core merge through dask, and an overlay through dask against ``materialize()``, same run.

    python benchmarks/dask.py [--gib 8] [--budget 1GiB] [--members 64] [--folder DIR] [--spqr-n 4096]
                              [--repeat 9]

1. A file holding a float32 partition whose merged view is ``--gib`` GiB (row bands of
   ``--members`` dense members) is written *sparsely* in a temporary folder: the members'
   bytes are holes, so the file takes no disk space.  ``hurray-schema merge --memory BUDGET``
   then writes its ``.npy`` in a subprocess; printed: its wall time (interpreter start
   included), its peak resident memory (``wait4``'s ``ru_maxrss``) and its throughput as a
   ratio to copying the same number of bytes file to file (the same sparse file, 64 MiB
   reads and writes, fsynced like the merge's output).  Targets (issue 14): peak under
   1.5 GiB, throughput ratio >= 0.5.
2. ``hs.spqr`` of a [n, n] float16 array: median ``to_dask().compute()`` time as a ratio to
   ``materialize()`` (target <= 1.5x); the results are checked bit-identical first.  Then, for
   information, the same overlay cut in chunks of 8 MiB.

Nothing asserts; run it alone (the machine's other work shows in the times).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
# this file is named like the package it benchmarks: its folder must not shadow ``dask``
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

import numpy as np  # noqa: E402

import hurray_schema as hs  # noqa: E402
import hurray_schema.io.file as file_module  # noqa: E402
from hurray_schema.cli.common import Bytes  # noqa: E402
from hurray_schema.io import Composite, Tensor  # noqa: E402
from hurray_schema.model import CompositionRule, ElementType, Shard  # noqa: E402

COPY_BLOCK = 64 * 1024 * 1024
SEVERAL_CHUNK_BYTES = 8 * 1024 * 1024
"""Chunk size of the second overlay figure (several chunks, as an out-of-core merge evaluates them)."""


class _HoleWriter:
    """A file whose writes of ``zeros`` (identity) become holes: seeks past them."""

    def __init__(self, f, zeros):
        self.f, self.zeros = f, zeros

    def write(self, data):
        if isinstance(data, memoryview) and data.obj is self.zeros:
            self.f.seek(len(data), os.SEEK_CUR)
            return len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


@contextlib.contextmanager
def _sparse_writes(zeros):
    """``write_file`` with its output file wrapped in :class:`_HoleWriter` (benchmark only)."""
    original = file_module.replacing

    @contextlib.contextmanager
    def replacing(path):
        with original(path) as f:
            yield _HoleWriter(f, zeros)

    file_module.replacing = replacing
    try:
        yield
    finally:
        file_module.replacing = original


def write_partition(path: Path, gib: int, members: int) -> tuple[int, ...]:
    columns = 32768
    rows = gib * 2**30 // (columns * 4)
    band = rows // members
    zeros = np.zeros(band * columns * 4, np.uint8)  # never touched: no memory, no disk
    shape = (rows, columns)
    parts = [Tensor.dense(ElementType.FLOAT32, (band, columns), zeros, shard=Shard(shape, (k * band, 0)))
             for k in range(members)]
    item = Composite.build(CompositionRule.PARTITION, parts, shape=shape, type_tag=ElementType.FLOAT32)
    with _sparse_writes(zeros):
        hs.write_file(path, {"p": item})
    return shape


def run_merge(source: Path, target: Path, budget: str, log: Path) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit status) of ``hurray-schema merge --memory`` in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "hurray_schema", "merge", str(source), "p", "-o", str(target), "--memory",
               budget]
    with open(log, "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=err, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, usage.ru_maxrss * 1024, child.returncode


def copy_file(source: Path, target: Path, nbytes: int) -> float:
    """Seconds to copy ``nbytes`` of ``source`` to ``target`` in 64 MiB reads and writes, fsynced."""
    buffer = bytearray(COPY_BLOCK)
    view = memoryview(buffer)
    start = time.perf_counter()
    with open(source, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        left = nbytes
        while left:
            got = src.readinto(view[:min(left, COPY_BLOCK)])
            if not got:
                src.seek(0)  # the source is shorter than the output: go round again
                continue
            dst.write(view[:got])
            left -= got
        os.fsync(dst.fileno())
    return time.perf_counter() - start


def out_of_core(args) -> None:
    folder = tempfile.TemporaryDirectory(dir=args.folder, prefix="hurray-dask-bench-")
    with folder as where:
        where = Path(where)
        source = where / "partition.hrry"
        shape = write_partition(source, args.gib, args.members)
        print(f"partition {list(shape)} float32 = {args.gib} GiB in {args.members} members; file "
              f"{source.stat().st_size / 2**30:.2f} GiB apparent, {source.stat().st_blocks * 512 / 2**20:.1f} MiB "
              "on disk")
        warm = where / "warm.hrry"
        hs.write_file(warm, {"p": hs.partition(np.zeros((64, 64), np.float32), grid=(2, 1))})
        run_merge(warm, where / "warm.npy", "1K", where / "warm.log")  # compile / load the kernels once
        target = where / "merged.npy"
        os.sync()
        seconds, peak, status = run_merge(source, target, args.budget, where / "merge.log")
        if status:
            print((where / "merge.log").read_text()[-2000:])
            raise SystemExit(f"merge failed with exit status {status}")
        written = target.stat().st_size
        check = np.load(target, mmap_mode="r")
        assert check.shape == shape and check.dtype == np.float32 and not check[::4099, ::977].any()
        del check
        target.unlink()
        os.sync()
        baseline = copy_file(source, where / "copy.bin", written)
        (where / "copy.bin").unlink()
        budget = Bytes().convert(args.budget, None, None)
        print(f"merge --memory {args.budget}: {seconds:.1f} s ({written / seconds / 2**30:.2f} GiB/s, interpreter "
              f"start included), peak RSS {peak / 2**30:.2f} GiB (target < 1.5 GiB; budget {budget / 2**30:.2f} GiB)")
        print(f"copy of {written / 2**30:.2f} GiB file to file: {baseline:.1f} s ({written / baseline / 2**30:.2f} "
              f"GiB/s)")
        print(f"throughput ratio merge/copy: {baseline / seconds:.2f} (target >= 0.5)")


def median_times(functions, repeat: int) -> list[float]:
    """Median seconds of each of ``functions``, timed in turn within every round (so that the
    machine's other work weighs on them alike)."""
    times = [[] for _ in functions]
    for _ in range(repeat):
        for fn, seen in zip(functions, times):
            start = time.perf_counter()
            fn()
            seen.append(time.perf_counter() - start)
    return [statistics.median(seen) for seen in times]


def overlay(args) -> None:
    weight = np.random.default_rng(0).standard_normal((args.spqr_n, args.spqr_n)).astype(np.float16)
    item = hs.spqr(weight)
    lazy = item.to_dask()
    want, got = item.materialize(), lazy.compute()
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    several = item.to_dask(chunk_bytes=SEVERAL_CHUNK_BYTES)
    assert several.compute().tobytes() == want.tobytes()
    whole, chunked, cut = median_times([item.materialize, lazy.compute, several.compute], args.repeat)
    print(f"spqr [{args.spqr_n}, {args.spqr_n}] float16: materialize {whole * 1e3:.1f} ms, to_dask().compute() "
          f"{chunked * 1e3:.1f} ms in {lazy.npartitions} chunk(s): ratio {chunked / whole:.2f} (target <= 1.5)")
    print(f"  the same cut in {several.npartitions} chunks of {SEVERAL_CHUNK_BYTES >> 20} MiB: {cut * 1e3:.1f} ms, ratio "
          f"{cut / whole:.2f} (no target: each chunk allocates its own output and reads the base's parameters)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=8)
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--folder", default=None, help="where the temporary folder goes (default: the system's)")
    parser.add_argument("--spqr-n", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--skip-merge", action="store_true")
    args = parser.parse_args()
    overlay(args)
    if not args.skip_merge:
        out_of_core(args)


if __name__ == "__main__":
    main()
