"""The HTML page of a file of many small tensors, against the text views, same run.

    python benchmarks/htmlview.py [--tensors 20000] [--repeat 3]

The file is the one of ``benchmarks/cli.py`` (small tensors, every fourth one a
two-member partition composite).  Each command runs in this process through the
``hurray-schema`` command (output captured) and is timed as the median of ``--repeat``
runs.  Printed:

* size: the bytes of the page ``inspect --html`` writes, divided by the bytes of
  ``inspect --brief``'s text (the issue's target: under 5);
* time: ``inspect --html`` and ``audit --html`` (audit, its report and the page), each
  divided by the time of ``audit`` (the issue's target: under 3).

Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli import small_items  # noqa: E402  (benchmarks/cli.py: the same workload)

from hurray_schema.io import write_file  # noqa: E402
from support import median_time, run_cli  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, page = os.path.join(tmp, "many.hrry"), os.path.join(tmp, "many.html")
        write_file(path, small_items(args.tensors))
        print(f"{args.tensors} items, file {os.path.getsize(path)} bytes, median of {args.repeat}")
        brief = len(run_cli("inspect", "--brief", path).encode("utf-8"))
        run_cli("inspect", "--html", page, path)
        size = os.path.getsize(page)
        print(f"size: page {size} bytes, inspect --brief {brief} bytes, ratio {size / brief:.2f} (target < 5)")
        base = median_time(lambda: run_cli("audit", path), args.repeat)
        print(f"{'workload':<16}{'ms':>10}{'audit ms':>10}{'ratio':>8}")
        for command in ("inspect", "audit"):
            took = median_time(lambda: run_cli(command, "--html", page, path), args.repeat)
            print(f"{command + ' --html':<16}{took * 1e3:>10.1f}{base * 1e3:>10.1f}{took / base:>8.2f} (target < 3)")


if __name__ == "__main__":
    main()
