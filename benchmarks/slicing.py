"""Region reads against whole reads, same run.

    python benchmarks/slicing.py [--n-dense 16384] [--n-spqr 4096] [--n-partition 8192] [--repeat 7]

Cases (issue 13, acceptance):

* ``dense row``  -- a [16384, 16384] float32 row-major tensor written with ``write_file`` into a
  temporary folder; open it with ``read_file`` and read one row (``read_box``, copied out of
  the map before the file closes), against opening it and reading the whole tensor
  (``to_numpy()``; a read-only view of the map is copied, so that every element is read);
* ``stepped``    -- the same file tensor indexed ``[::64, ::64]`` and ``[1::64, 1::64]`` (a stepped
  box read: a strided view of the map, copied out before the file closes), against NumPy
  indexing a ``numpy.memmap`` of the tensor's bytes the same way, copied (NumPy's own cost of
  the same selection);
* ``spqr box``   -- one [64, 64] box, not aligned to the quantization blocks, of a [4096, 4096]
  SpQR overlay (``hurray_schema.spqr`` of float16 data: int4 per-block base, sorted COO
  outliers), against ``materialize()``;
* ``stepped composite`` -- that SpQR overlay, and a [--n-partition]^2 float32 partition of 4 x 4
  row-major members, indexed ``[::64, ::64]`` and ``[1::64, 1::64]``, against NumPy indexing the
  materialized array the same way, copied.

Each read is checked bit-identical to the whole read sliced before timing.  Prints the median
wall time of ``--repeat`` runs of each and the ratio region / whole; targets <= 1% (dense row)
and <= 5% (SpQR box); the stepped cases print the ratio ours / NumPy's (memmap, or materialized
array).  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import hurray_schema as hs  # noqa: E402
from hurray_schema.evaluate import materialize, read_box  # noqa: E402
from support import median_time  # noqa: E402


def every_element(array: np.ndarray) -> np.ndarray:
    """``array`` owned: a read-only view of a mapped file is copied (its bytes read)."""
    return array if array.flags.writeable else array.copy()


def report(name: str, region: float, whole: float, target: float) -> None:
    ratio = region / whole
    verdict = "meets" if ratio <= target else "misses"
    print(f"{name:<11} region {region * 1e3:9.3f} ms   whole {whole * 1e3:9.3f} ms   "
          f"ratio {ratio * 100:6.3f}%   target <= {target * 100:.0f}% ({verdict})")


def report_against_numpy(name: str, ours: float, numpy_time: float) -> None:
    print(f"{name:<34} ours {ours * 1e3:9.3f} ms   numpy {numpy_time * 1e3:9.3f} ms   "
          f"ratio {ours / numpy_time * 100:6.1f}% (ours / numpy memmap)")


def stepped(path: Path, n: int, repeat: int) -> None:
    with hs.read_file(path) as f:
        offset = f.buffer_ranges("w")[0][0]
    def memmap():
        return np.memmap(path, np.float32, "r", offset=offset, shape=(n, n))

    for label, index in (("[::64,::64]", np.s_[::64, ::64]), ("[1::64,1::64]", np.s_[1::64, 1::64])):
        def ours():
            with hs.read_file(path) as f:
                return np.array(f["w"][index])

        def with_numpy():
            return np.array(memmap()[index])

        assert ours().tobytes() == with_numpy().tobytes()
        report_against_numpy(f"stepped {label} open+index", median_time(ours, repeat * 5),
                             median_time(with_numpy, repeat * 5))
        with hs.read_file(path) as f:
            tensor, mapped = f["w"], memmap()
            ours_time = median_time(lambda: np.array(tensor[index]), repeat * 5)
            report_against_numpy(f"stepped {label} index only", ours_time,
                                 median_time(lambda: np.array(mapped[index]), repeat * 5))
            del tensor, mapped


def dense_row(n: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    values = rng.random((n, n), dtype=np.float32)
    row = n // 3
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dense.hrry"
        hs.write_file(path, {"w": hs.Tensor.from_numpy(values)})
        del values
        stepped(path, n, repeat)

        def read_row():
            with hs.read_file(path) as f:
                return np.array(read_box(f["w"], (row, 0), (row + 1, n)))

        def read_whole():
            with hs.read_file(path) as f:
                return every_element(f["w"].to_numpy())

        whole = read_whole()
        assert read_row().tobytes() == whole[row:row + 1].tobytes()
        del whole
        region_time = median_time(read_row, repeat * 5)
        whole_time = median_time(read_whole, repeat)
    report("dense row", region_time, whole_time, 0.01)


def spqr_box(n: int, repeat: int) -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((n, n)).astype(np.float16)
    overlay = hs.spqr(weight)
    lo, hi = (n // 4 + 7, n // 2 + 13), (n // 4 + 71, n // 2 + 77)
    whole = materialize(overlay)
    box = read_box(overlay, lo, hi)
    assert box.tobytes() == np.ascontiguousarray(whole[lo[0]:hi[0], lo[1]:hi[1]]).tobytes()
    del whole
    region_time = median_time(lambda: read_box(overlay, lo, hi), repeat * 5)
    whole_time = median_time(lambda: materialize(overlay), repeat)
    report("spqr box", region_time, whole_time, 0.05)


def report_against_materialized(name: str, ours: float, numpy_time: float) -> None:
    print(f"{name:<34} ours {ours * 1e3:9.3f} ms   numpy {numpy_time * 1e3:9.3f} ms   "
          f"ratio {ours / numpy_time * 100:6.1f}% (ours / numpy on the materialized array)")


def stepped_composite(name: str, composite, repeat: int) -> None:
    """``composite`` indexed with steps, against NumPy indexing its materialized array, copied."""
    whole = materialize(composite)
    for label, index in (("[::64,::64]", np.s_[::64, ::64]), ("[1::64,1::64]", np.s_[1::64, 1::64])):
        assert composite[index].tobytes() == np.array(whole[index]).tobytes()
        report_against_materialized(f"stepped {name} {label}", median_time(lambda: composite[index], repeat * 5),
                                    median_time(lambda: np.array(whole[index]), repeat * 5))


def stepped_composites(n_spqr: int, n_partition: int, repeat: int) -> None:
    rng = np.random.default_rng(1)
    stepped_composite("spqr", hs.spqr(rng.standard_normal((n_spqr, n_spqr)).astype(np.float16)), repeat)
    values = rng.random((n_partition, n_partition), dtype=np.float32)
    stepped_composite("partition", hs.partition(values, grid=(4, 4)), repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-dense", type=int, default=16384)
    parser.add_argument("--n-spqr", type=int, default=4096)
    parser.add_argument("--n-partition", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    spqr_box(args.n_spqr, args.repeat)
    stepped_composites(args.n_spqr, args.n_partition, args.repeat)
    dense_row(args.n_dense, args.repeat)


if __name__ == "__main__":
    main()
