"""Command-line audit and inspect of many small tensors, against plain reading, same run.

    python benchmarks/cli.py [--tensors 20000] [--repeat 3] [--big-mb 1024]

Workloads, each run in this process through the ``hurray-schema`` command (output
captured, not printed) and timed as the median of ``--repeat`` runs:

* ``audit file`` / ``inspect --brief file`` of a ``.hrry`` file of ``--tensors`` small
  tensors (every fourth one a two-member partition composite), divided by the time of
  ``read_file`` + iterating every item and touching its buffers;
* ``audit stream`` / ``inspect --brief stream`` of the same items as a bare stream,
  divided by ``read_stream`` + iterating.

The issue's target is a ratio of at most 3.  Then the peak resident memory of
``hurray-schema audit`` of a ``--big-mb`` MiB bare stream (large tensors) is measured in
a child process (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a small launcher),
next to the peak of a child that only imports the package; the target is under 300 MB.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file, write_stream  # noqa: E402
from hurray_schema.model import CompositionRule, ElementType, Shard  # noqa: E402
from support import median_time, run_cli  # noqa: E402

MiB = 1024 * 1024


def small_items(n: int) -> dict:
    items = {}
    for i in range(n):
        if i % 4 == 3:
            members = [Tensor.dense(ElementType.FLOAT32, [2, 2], shard=Shard((2, 4), (0, 2 * j))) for j in range(2)]
            items[f"c{i}"] = Composite.build(CompositionRule.PARTITION, members, shape=(2, 4),
                                             type_tag=ElementType.FLOAT32)
        else:
            items[f"t{i}"] = Tensor.dense(ElementType.FLOAT32, [2, 2])
    return items


def touch(item) -> None:
    if isinstance(item, Composite):
        for member in item.members:
            touch(member)
        return
    for buffer in item.buffers:
        len(memoryview(buffer))


def read_all_file(path: str) -> None:
    with read_file(path) as f:
        for name in f:
            touch(f[name])


def read_all_stream(path: str) -> None:
    for item in read_stream(path):
        touch(item)


def write_big_stream(path: str, megabytes: int) -> None:
    chunk = 16 * MiB
    count = max(1, megabytes * MiB // chunk)
    with open(path, "wb") as out:
        for _ in range(count):
            write_stream(out, [Tensor.dense(ElementType.UINT8, [chunk])])


_LAUNCHER = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def child_peak_mb(args: list[str]) -> float:
    """Peak resident memory of ``python ARGS``, measured by a small launcher process (a
    child forked from this big process would start with this process's pages counted)."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, sys.executable, *args], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    return int(done.stdout.strip()) / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=1024)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    file_path, stream_path = os.path.join(tmp, "many.hrry"), os.path.join(tmp, "many.stream")
    items = small_items(args.tensors)
    write_file(file_path, items)
    write_stream(stream_path, list(items.values()))
    print(f"{args.tensors} items, file {os.path.getsize(file_path)} bytes, stream {os.path.getsize(stream_path)} "
          f"bytes, median of {args.repeat}")
    print(f"{'workload':<24}{'ms':>10}{'baseline ms':>13}{'ratio':>8}")
    for label, path, baseline in (("file", file_path, read_all_file), ("stream", stream_path, read_all_stream)):
        base = median_time(lambda: baseline(path), args.repeat)
        for command in (["audit"], ["inspect", "--brief"]):
            took = median_time(lambda: run_cli(*command, path), args.repeat)
            name = f"{' '.join(command)} {label}"
            print(f"{name:<24}{took * 1e3:>10.1f}{base * 1e3:>13.1f}{took / base:>8.2f}")
    if args.big_mb > 0:
        big = os.path.join(tmp, "big.stream")
        write_big_stream(big, args.big_mb)
        idle = child_peak_mb(["-c", "import hurray_schema.cli, hurray_schema.audit"])
        peak = child_peak_mb(["-m", "hurray_schema", "audit", big])
        print(f"audit of a {os.path.getsize(big) // MiB} MiB stream: peak RSS {peak:.0f} MB "
              f"(a child that only imports: {idle:.0f} MB)")
        os.unlink(big)
    for path in (file_path, stream_path):
        os.unlink(path)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
