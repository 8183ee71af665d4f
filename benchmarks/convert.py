"""convert throughput against copying the input file, same run.

    python benchmarks/convert.py [--size-mib 1024] [--repeat 3] [--dir DIR]

Workloads (inputs written once into a temporary folder under ``--dir``, default the system's):

* ``safetensors -> hurray``: a file of float32 / float16 / bfloat16 matrices (16 MiB each) of
  ``--size-mib`` in all, through ``hurray_schema.convert`` (dense tensors: the input's bytes
  from its memory map straight into the output);
* ``gguf Q4_0 -> hurray``: a GGUF file of Q4_0 matrices (random blocks, finite scales) of the
  same size, converted to per-block affine int4 with float32 scales (codes re-packed).

The baseline is copying the same input file (``shutil.copyfile``) and fsyncing the copy, as the
converter fsyncs its output.  Each round times a copy and a conversion (in turn first), each into a path that
does not exist (the previous round's outputs are removed untimed: replacing a 1 GiB file costs
its unlink), each after ``sync`` and a second's pause (the disk's write-back of the step before
is not timed in the next); the disk is shared with other work, so the ratio is taken within each round.
Prints the median wall times of ``--repeat`` rounds and the median of the rounds' ratios copy /
convert (1.0: as fast as a copy; the target for safetensors is at least 0.5).  Page cache: each
input is read once before timing, so both sides read it from memory.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from hurray_schema.conversion import convert  # noqa: E402

MATRIX = (4096, 1024)
"""Each tensor: 4M elements."""

SETTLE_SECONDS = 1.0
"""Pause after ``sync`` before each timed step."""


def write_safetensors(path: Path, size: int) -> None:
    import ml_dtypes
    import safetensors

    rng = np.random.default_rng(0)
    kinds = [np.float32, np.float16, ml_dtypes.bfloat16]
    arrays, total, i = {}, 0, 0
    while total < size:
        dtype = kinds[i % len(kinds)]
        array = rng.standard_normal(MATRIX, dtype=np.float32).astype(dtype)
        arrays[f"layers.{i}.weight"] = array
        total += array.nbytes
        i += 1
    specs = {name: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data,
                                          data_len=a.nbytes) for name, a in arrays.items()}
    safetensors.serialize_file(specs, str(path), metadata={"benchmark": "convert"})


def write_gguf_q4_0(path: Path, size: int) -> None:
    import gguf

    rng = np.random.default_rng(1)
    block_bytes = 18
    per_row = MATRIX[1] // 32
    writer = gguf.GGUFWriter(str(path), "benchmark", use_temp_file=False)
    total, i = 0, 0
    while total < size:
        blocks = rng.integers(0, 256, (MATRIX[0] * per_row, block_bytes), dtype=np.uint8)
        d = rng.standard_normal(len(blocks)).astype(np.float16) * np.float16(0.01)
        d[d == 0] = np.float16(0.01)
        blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
        writer.add_tensor(f"blk.{i}.weight", blocks.reshape(MATRIX[0], per_row * block_bytes),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        total += blocks.nbytes
        i += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def copy_with_fsync(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())


def settle() -> None:
    """Let the disk take what is still in flight (the previous step's unlinked or written blocks) before
    the next step is timed, so that neither side pays for the other's write-back."""
    os.sync()
    time.sleep(SETTLE_SECONDS)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rounds(path: Path, folder: Path, repeat: int) -> tuple[float, float, float]:
    """(median copy seconds, median convert seconds, median of the rounds' copy / convert)."""
    copies, converts = [], []
    copy_to, convert_to = folder / "copy.bin", folder / "out.hrry"
    for round_number in range(repeat):
        for leftover in (copy_to, convert_to):
            if leftover.exists():
                os.unlink(leftover)
        steps = [(copies, lambda: copy_with_fsync(path, copy_to)), (converts, lambda: convert(path, convert_to))]
        for times, step in steps[::-1] if round_number % 2 else steps:
            settle()
            times.append(timed(step))
    for leftover in (copy_to, convert_to):
        os.unlink(leftover)
    ratios = [c / v for c, v in zip(copies, converts)]
    return statistics.median(copies), statistics.median(converts), statistics.median(ratios)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        folder = Path(folder)
        cases = [("safetensors -> hurray", folder / "model.safetensors", write_safetensors),
                 ("gguf Q4_0 -> hurray", folder / "model.gguf", write_gguf_q4_0)]
        print(f"input ~{args.size_mib} MiB, median of {args.repeat} rounds (wall time; ratio: median of the rounds')")
        print(f"{'workload':<24}{'input MiB':>10}{'copy s':>9}{'convert s':>11}{'copy/convert':>14}")
        for label, path, make in cases:
            make(path, size)
            warm(path)
            copy_s, convert_s, ratio = rounds(path, folder, args.repeat)
            mib = path.stat().st_size / (1 << 20)
            print(f"{label:<24}{mib:>10.0f}{copy_s:>9.2f}{convert_s:>11.2f}{ratio:>14.2f}")
            os.unlink(path)


if __name__ == "__main__":
    main()
