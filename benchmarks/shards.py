"""A checkpoint saved N ways read M ways: what each rank fetches and how long it takes.

    python benchmarks/shards.py [--rows 8192] [--cols 4096] [--members 8] [--dim 0] [--ranks 1,2,4,3]

A [rows, cols] float32 array is written as a partition of ``--members`` members cut along
dimension 0 (``hs.partition(grid=N)``, the way a checkpoint saved by N ranks is cut), then read
M ways along ``--dim`` for every M of ``--ranks``: each rank is a process of its own that opens the
file and reads its box with ``HurrayFile.shard(name, rank=r, of=M, dim=d)``, from the local path
read by range (``mmap=False``: its reader counts the bytes) and from nginx on loopback (its access
log counts them: the bytes of every ``Range`` asked).  Per rank it prints

* the box's own bytes, the bytes the open fetched (trailer, index, descriptors: the tail read
  first is 64 KiB to 1 MiB), the bytes the box read fetched and their ratio to the box (goal:
  <= 1.05, plus the open's);
* the wall time of the whole process (start-up, imports, open, read, exit): cold (a fresh
  process with empty NUMBA_CACHE_DIR / HURRAY_SCHEMA_CACHE_DIR) and warm (a fresh process after
  one filled them);
* the baseline in the same run: the rank reads the whole tensor (``materialize()``) and slices
  its box -- its bytes and warm time, and the ratios of the shard read to it.

Every rank's array is checked against the full array's ``numpy.array_split`` part first.  nginx
must be installed (``apt-get install nginx-light``).  Nothing is asserted: the figures are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, and tests.support beside it

import numpy as np  # noqa: E402

import hurray_schema as hs  # noqa: E402
from caches import caches_in  # noqa: E402 (beside this script)
from tests.support.remote_servers import Nginx  # noqa: E402

CHILD = r'''
import hashlib, json, sys, time
where, name, rank, of, dim, how = sys.argv[1:]
rank, of, dim = int(rank), int(of), int(dim)
import hurray_schema as hs
options = {"mmap": False} if "://" not in where else {}
start = time.perf_counter()
with hs.read_file(where, **options) as f:
    opened, opened_requests = f.bytes_fetched, f.requests
    if how == "shard":
        part = f.shard(name, rank=rank, of=of, dim=dim)
    else:  # the baseline: the whole tensor, then the box
        part = f[name].materialize()[f.shard_box(name, rank=rank, of=of, dim=dim).index]
    io = time.perf_counter() - start
    print(json.dumps({"opened": opened, "read": f.bytes_fetched - opened, "requests": f.requests - opened_requests,
                      "box": int(part.nbytes), "io": io, "digest": hashlib.sha256(part.tobytes()).hexdigest()}))
'''


def run_rank(where: str, rank: int, of: int, dim: int, how: str, cache: Path) -> dict:
    """One rank as a process of its own: its report, with the process's wall time (``wall``)."""
    env = dict(os.environ, **caches_in(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, where, "p", str(rank), str(of), str(dim), how],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"rank {rank} of {of} ({how}, {where}) failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["wall"] = wall
    return report


def asked_bytes(log) -> int:
    """The bytes of the file the logged GETs asked for (every range of their ``Range`` headers)."""
    total = 0
    for method, _status, _sent, asked in log:
        if method == "GET" and asked.startswith("bytes="):
            for part in asked[len("bytes="):].split(","):
                first, _, last = part.partition("-")
                total += int(last) - int(first) + 1
    return total


def digest(array: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def measure(where: str, full: np.ndarray, of: int, dim: int, scratch: Path, nginx: Nginx, name: str) -> list[dict]:
    """Every rank of ``of`` read from ``where``: cold, warm, and the baseline (warm)."""
    rows = []
    for rank, want in enumerate(np.array_split(full, of, axis=dim)):
        cold_cache = scratch / f"cold-{uuid.uuid4().hex}"
        warm_cache = scratch / "warm"
        served_before = len(nginx.requests(name))
        cold = run_rank(where, rank, of, dim, "shard", cold_cache)
        warm = run_rank(where, rank, of, dim, "shard", warm_cache)
        base = run_rank(where, rank, of, dim, "whole", warm_cache)
        shutil.rmtree(cold_cache, ignore_errors=True)
        if "://" in where:  # nginx's count, in the order the processes ran
            time.sleep(0.2)  # nginx logs a request once it has sent the answer
            log = nginx.requests(name)[served_before:]
            if asked_bytes(log) != sum(r["opened"] + r["read"] for r in (cold, warm, base)):
                raise SystemExit("nginx's log and the readers' counts disagree")
        for report in (cold, warm, base):
            if report["digest"] != digest(want):
                raise SystemExit(f"rank {rank} of {of} read other values than numpy.array_split's")
        rows.append({"rank": rank, "box": warm["box"], "opened": warm["opened"], "read": warm["read"],
                     "requests": warm["requests"], "cold": cold["wall"], "warm": warm["wall"], "io": warm["io"],
                     "base_read": base["read"], "base_warm": base["wall"], "base_io": base["io"]})
    return rows


HEADER = ("        M rank   box MiB  open KiB  read MiB  req  read/box | cold s  warm s (open+read s)"
          " | whole+slice: read MiB  warm s (open+read s) | shard/whole: bytes  time  open+read")


def print_rows(label: str, of: int, rows: list[dict]) -> None:
    """One line per rank (:data:`HEADER` names the columns)."""
    for row in rows:
        ratio = row["read"] / row["box"] if row["box"] else 0.0
        print(f"{label:5} {of:3d} {row['rank']:4d} {row['box'] / 2**20:9.2f} {row['opened'] / 1024:9.1f}"
              f" {row['read'] / 2**20:9.2f} {row['requests']:4d} {ratio:9.4f} | {row['cold']:6.2f} {row['warm']:7.2f}"
              f" ({row['io']:5.3f})       | {row['base_read'] / 2**20:20.2f} {row['base_warm']:7.2f} ({row['base_io']:5.3f})"
              f"       | {row['read'] / max(row['base_read'], 1):18.3f} {row['warm'] / row['base_warm']:5.2f}"
              f" {row['io'] / row['base_io']:10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--dim", type=int, default=0)
    parser.add_argument("--ranks", default="1,2,4,3")
    args = parser.parse_args()
    counts = [int(m) for m in args.ranks.split(",")]
    nginx = Nginx(shutil.which("nginx") or "/usr/sbin/nginx")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            scratch = Path(scratch)
            full = np.random.default_rng(49).standard_normal((args.rows, args.cols)).astype(np.float32)
            name = f"{uuid.uuid4().hex}.hrry"
            path = nginx.root / name
            hs.write_file(path, {"p": hs.partition(full, grid=args.members)})
            print(f"[{args.rows}, {args.cols}] float32 ({full.nbytes / 2**20:.0f} MiB) saved {args.members} ways "
                  f"along dim 0 ({os.path.getsize(path) / 2**20:.2f} MiB file); read M ways along dim {args.dim}")
            run_rank(str(path), 0, 1, args.dim, "shard", scratch / "warm")  # fills the warm caches
            print(HEADER)
            for of in counts:
                print_rows("local", of, measure(str(path), full, of, args.dim, scratch, nginx, name))
                print_rows("http", of, measure(nginx.url(name), full, of, args.dim, scratch, nginx, name))
    finally:
        nginx.stop()


if __name__ == "__main__":
    main()
