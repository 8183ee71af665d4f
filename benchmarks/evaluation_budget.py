"""How fast the evaluation budget refuses the hostile inputs of issue 12, beside reading them.

    python benchmarks/evaluation_budget.py [--repeat 200]

Inputs (built once, not timed): the 153-byte COO stream of shape [536870915, 3] with three
float32 entries (written by pyhurray), and the 65-byte stride-0 float32 stream asking for
512 MiB or 16 GiB from a 4-byte buffer (all refused under the default limits).

What is timed (``time.perf_counter``, best of ``--repeat``):

* ``read``    -- ``read_stream`` of the bytes to the one tensor (the baseline);
* ``refuse``  -- ``to_numpy()`` of that tensor raising ``LimitExceeded``;
* ``peak``    -- the ``tracemalloc`` peak of one refusing ``to_numpy()`` (a separate run).

The ratio is refuse / read.  Nothing here asserts; it only measures.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tracemalloc
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hurray_schema import BufferHandle, LimitExceeded, StridedLayout, Tensor, TensorDescriptor  # noqa: E402
from hurray_schema.model import ElementType  # noqa: E402
from hurray_schema.io.stream import read_stream, write_stream  # noqa: E402
from support import best_time as best  # noqa: E402


def coo_stream() -> bytes:
    import hurray

    values = np.array([1.0, 2.0, 3.0], np.float32)
    indices = np.array([[0, 0], [1, 1], [536870914, 2]], np.uint64)
    with hurray.StreamWriter() as w:
        w.write(hurray.sparse_coo(values, indices, [536870915, 3]))
    return w.getvalue()


def stride0_stream(count: int) -> bytes:
    desc = TensorDescriptor(ElementType.FLOAT32, (count,), StridedLayout((0,)), buffers=(BufferHandle(4),))
    sink = io.BytesIO()
    write_stream(sink, [Tensor(desc, [bytes(4)])])
    return sink.getvalue()


def refuse(tensor, limits):
    def run():
        try:
            tensor.to_numpy(limits=limits)
        except LimitExceeded:
            return
        raise SystemExit("not refused")
    return run


def peak_of(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    cases = [
        ("COO [536870915, 3], default budget", coo_stream(), None),
        ("stride-0 512 MiB, default budget", stride0_stream(1 << 27), None),
        ("stride-0 16 GiB, default budget", stride0_stream(1 << 32), None),
    ]
    print(f"{'input':40} {'bytes':>5} {'read ms':>8} {'refuse ms':>9} {'ratio':>6} {'peak KiB':>9}")
    for label, data, limits in cases:
        tensor = next(iter(read_stream(data)))
        run = refuse(tensor, limits)
        run()  # first call compiles nothing, but imports the evaluator
        read_s = best(lambda: next(iter(read_stream(data))), args.repeat)
        refuse_s = best(run, args.repeat)
        peak = peak_of(run)
        print(f"{label:40} {len(data):5} {read_s * 1e3:8.3f} {refuse_s * 1e3:9.3f} {refuse_s / read_s:6.2f} "
              f"{peak / 1024:9.1f}")


if __name__ == "__main__":
    main()
