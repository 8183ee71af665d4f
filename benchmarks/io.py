"""Stream and file throughput, hurray_schema beside pyhurray, same run.

    python benchmarks/io.py [--tensors 200] [--repeat 5]

Workloads (built with pyhurray so both sides handle the same bytes):

* ``stream read``  -- iterate a bare stream of small tensors and partition composites
  (``read_stream`` vs ``hurray.StreamReader``);
* ``stream write`` -- write them back (``write_stream`` vs ``hurray.StreamWriter``);
* ``file open``    -- open a file and list its tensors (``read_file`` vs ``hurray.load``,
  which also builds every tensor);
* ``file write``   -- ``write_file`` vs ``hurray.save``;
* ``audit``        -- ``hurray_schema.audit`` of the file beside reading every tensor of it as an
  array (ours both: the audit checks everything a read checks, plus the rules only it runs).

``stream read, tables off`` reads the same stream with the by-value tables off
(``signature.use_value_tables(False)``): every descriptor decoded and checked as if never
seen.  ``distinct read`` reads a stream of the same kinds of tensors whose descriptors all
differ (each its own shape and buffer sizes, as pages of different lengths have), tables on:
the tables find nothing there, every descriptor is decoded and checked by the decoder
compiled for its header.

Prints the median of ``--repeat`` runs and the ratio ours/theirs.  Times are process CPU
time, ours and theirs timed in turn within each round, so that other load on a shared
machine skews the ratios as little as possible.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hurray  # noqa: E402
import numpy as np  # noqa: E402

from hurray_schema import signature  # noqa: E402
from hurray_schema import audit  # noqa: E402
from hurray_schema.io import read_file, read_stream, write_file, write_stream  # noqa: E402


def workload(n: int, distinct: bool = False) -> dict:
    """``n`` items: three dense f32 tensors, then a partition of two sharded halves, and so on.
    ``distinct``: the i-th item's shape is its own (about the same number of elements), so that
    no two descriptors are the same bytes."""
    f32 = hurray.float32
    items = {}
    for i in range(n):
        rows, cols = (28 + i % 8, 30 + i // 8) if distinct else (32, 32)
        if i % 4 == 3:
            half, rows = cols // 8, rows // 4  # [8, 4] halves of an [8, 8] head when not distinct
            a = hurray.Tensor(bytes(4 * rows * half), f32, [rows, half], shard=hurray.Shard([rows, 2 * half], [0, 0]))
            b = hurray.Tensor(bytes(4 * rows * half), f32, [rows, half],
                              shard=hurray.Shard([rows, 2 * half], [0, half]))
            items[f"c{i}"] = hurray.Composite("partition", shape=[rows, 2 * half], dtype=f32, members=[a, b])
        else:
            items[f"t{i}"] = hurray.Tensor(bytes(4 * rows * cols), f32, [rows, cols])
    return items


def _stream(items: dict) -> bytes:
    with hurray.StreamWriter() as w:
        for t in items.values():
            w.write(t)
    return w.getvalue()


def median_times(ours, theirs, repeat: int) -> tuple[float, float]:
    """Median CPU time of ``ours`` and of ``theirs`` over ``repeat`` rounds, the two timed in
    turn in every round (after one untimed call of each)."""
    ours(), theirs()
    samples: tuple[list, list] = ([], [])
    for _ in range(repeat):
        for fn, times in zip((ours, theirs), samples):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
    return statistics.median(samples[0]), statistics.median(samples[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    items = workload(args.tensors)
    stream = _stream(items)
    distinct = _stream(workload(args.tensors, distinct=True))
    ours_items = list(read_stream(stream))
    tmp = tempfile.mkdtemp()
    py_file, our_file = os.path.join(tmp, "py.hrry"), os.path.join(tmp, "ours.hrry")
    hurray.save(py_file, items)

    def our_open():
        with read_file(py_file) as f:
            return list(f)

    rows = [
        ("stream read", lambda: list(read_stream(stream)), lambda: list(hurray.StreamReader(stream))),
        ("  tables off", lambda: _without_tables(lambda: list(read_stream(stream))),
         lambda: list(hurray.StreamReader(stream))),
        ("distinct read", lambda: _fresh_tables(lambda: list(read_stream(distinct))),
         lambda: list(hurray.StreamReader(distinct))),
        ("  tables off", lambda: _without_tables(lambda: list(read_stream(distinct))),
         lambda: list(hurray.StreamReader(distinct))),
        ("stream write", lambda: write_stream(None, ours_items), lambda: _py_write(items)),
        ("file open+list", our_open, lambda: list(hurray.load(py_file))),
        ("file write", lambda: write_file(our_file, dict(zip(items, ours_items))),
         lambda: hurray.save(py_file + ".2", items)),
    ]
    print(f"{args.tensors} items ({len(stream)} stream bytes), median of {args.repeat}")
    print(f"{'workload':<16}{'ours ms':>10}{'pyhurray ms':>13}{'ratio':>8}")
    for name, ours, theirs in rows:
        a, b = median_times(ours, theirs, args.repeat)
        print(f"{name:<16}{a * 1e3:>10.2f}{b * 1e3:>13.2f}{a / b:>8.1f}")

    def read_every_tensor():
        with read_file(py_file) as f:
            return [np.asarray(f[name]) for name in f]

    audit_ms, read_ms = median_times(lambda: audit(py_file), read_every_tensor, args.repeat)
    print("\naudit of the file beside reading it (ours both; target audit <= 2x reading)")
    print(f"{'audit':<16}{audit_ms * 1e3:>10.2f}\n{'read every tensor':<16}{read_ms * 1e3:>10.2f}"
          f"\n{'ratio':<16}{audit_ms / read_ms:>10.2f}")


def _without_tables(fn):
    signature.use_value_tables(False)
    try:
        return fn()
    finally:
        signature.use_value_tables(True)


def _fresh_tables(fn):
    """``fn()`` with the by-value tables on but emptied first: a stream read for the first time."""
    signature.use_value_tables(True)
    return fn()


def _py_write(items) -> bytes:
    with hurray.StreamWriter() as w:
        for t in items.values():
            w.write(t)
    return w.getvalue()


if __name__ == "__main__":
    main()
