"""Files read by URL over loopback HTTP (nginx), counted by the server, against downloading them.

    python benchmarks/remote.py [--n-dense 16384] [--small 999] [--n-spqr 4096] [--repeat 3]

Cases (issue 25, acceptance):

* ``1 GiB file``  -- a file of 1,000 tensors: 999 small ones and one [16384, 16384] float32
  (1 GiB), served by nginx on 127.0.0.1.  Opening it with ``read_file(url)``: requests and bytes
  nginx served (its access log), against the targets <= 3 requests and <= 1 % of the file; then
  one row of the large tensor: further requests and bytes, against <= 2 and <= 1 % of the tensor;
  then one [64, 64] box of it (64 ranges a row apart);
* ``spqr``        -- a [--n-spqr]^2 SpQR overlay (``hurray_schema.spqr`` of float16 data) in its
  own file: open + one row + one [64, 64] box (not aligned to the blocks) by URL, as requests,
  bytes and wall time, against downloading the whole file first (one GET to a local file), then
  opening it and reading the same; the ratio is by URL / download first.

Every value read by URL is checked bit-identical to the local read first.  nginx must be
installed (``apt-get install nginx-light``).  Nothing is asserted: the figures are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

os.environ.setdefault("HURRAY_SCHEMA_COMPILE", "eager")  # the kernels' speed is measured: each compiles at its
# first use (NumPy would stand in for one while a process has not given it enough work)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, and tests.support beside it

import numpy as np  # noqa: E402

import hurray_schema as hs  # noqa: E402
from tests.support.remote_servers import Nginx  # noqa: E402


def served(nginx: Nginx, name: str) -> tuple[int, int]:
    """(requests, body bytes) nginx served for ``name`` so far."""
    log = nginx.requests(name)
    return len(log), sum(sent for _, _, sent, _ in log)


def verdict(value: float, target: float) -> str:
    return "meets" if value <= target else "misses"


def big_file(nginx: Nginx, n: int, small: int) -> None:
    name = f"{uuid.uuid4().hex}.hrry"
    path = nginx.root / name
    values = np.empty((n, n), np.float32)
    values[:] = np.arange(n, dtype=np.float32)
    values[:, 0] = -np.arange(n, dtype=np.float32)
    items = {f"t{i:04d}": hs.Tensor.from_numpy(np.full(16, i, np.float32)) for i in range(small)}
    items["w"] = hs.Tensor.from_numpy(values)
    hs.write_file(path, items)
    del items
    size = path.stat().st_size
    tensor_bytes = n * n * 4
    row = n // 3
    want = values[row].copy()
    want_box = values[5000:5064, 7000:7064].copy()
    del values
    print(f"file: {small + 1} tensors, {size / 2 ** 30:.3f} GiB; tensor [{n}, {n}] float32")
    started = time.perf_counter()
    with hs.read_file(nginx.url(name)) as f:
        opened = time.perf_counter() - started
        open_requests, open_bytes = served(nginx, name)
        print(f"open       {open_requests:3d} requests  {open_bytes:12,d} bytes  {open_bytes / size * 100:7.4f}% of "
              f"the file  {opened * 1e3:8.1f} ms   target <= 3 requests ({verdict(open_requests, 3)}), <= 1% "
              f"({verdict(open_bytes / size, 0.01)})")
        started = time.perf_counter()
        got = f["w"][row]
        took = time.perf_counter() - started
        assert got.tobytes() == want.tobytes()
        requests, sent = served(nginx, name)
        requests, sent = requests - open_requests, sent - open_bytes
        print(f"one row    {requests:3d} requests  {sent:12,d} bytes  {sent / tensor_bytes * 100:7.4f}% of "
              f"the tensor {took * 1e3:8.1f} ms   target <= 2 requests ({verdict(requests, 2)}), <= 1% "
              f"({verdict(sent / tensor_bytes, 0.01)})")
        before = served(nginx, name)
        started = time.perf_counter()
        box = f["w"][5000:5064, 7000:7064]
        took = time.perf_counter() - started
        assert box.tobytes() == np.ascontiguousarray(want_box).tobytes()
        requests, sent = (after - earlier for after, earlier in zip(served(nginx, name), before))
        print(f"[64,64]    {requests:3d} requests  {sent:12,d} bytes  {sent / tensor_bytes * 100:7.4f}% of "
              f"the tensor {took * 1e3:8.1f} ms")
    path.unlink()


def spqr_reads(f, n: int):
    lo = (n // 4 + 7, n // 2 + 13)
    return f["s"][n // 2], f["s"][lo[0]:lo[0] + 64, lo[1]:lo[1] + 64]


def spqr_case(nginx: Nginx, n: int, repeat: int, scratch: Path) -> None:
    rng = np.random.default_rng(1)
    overlay = hs.spqr(rng.standard_normal((n, n)).astype(np.float16))
    local = scratch / "spqr.hrry"
    hs.write_file(local, {"s": overlay})
    size = local.stat().st_size
    with hs.read_file(local) as f:
        want = [a.copy() for a in spqr_reads(f, n)]
    by_url, download_first, counts = [], [], []
    for _ in range(repeat):
        name = f"{uuid.uuid4().hex}.hrry"  # a fresh name: nothing cached on either side
        shutil.copyfile(local, nginx.root / name)
        started = time.perf_counter()
        with hs.read_file(nginx.url(name)) as f:
            got = spqr_reads(f, n)
        by_url.append(time.perf_counter() - started)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        counts.append(served(nginx, name))
        target = scratch / name
        started = time.perf_counter()
        with urllib.request.urlopen(nginx.url(name)) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out, 8 << 20)
        with hs.read_file(target) as f:
            got = [a.copy() for a in spqr_reads(f, n)]
        download_first.append(time.perf_counter() - started)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        target.unlink()
        (nginx.root / name).unlink()
    requests, sent = counts[0]
    url_time, download_time = statistics.median(by_url), statistics.median(download_first)
    print(f"spqr [{n}, {n}] overlay, {size:,d}-byte file: open + one row + one [64, 64] box")
    print(f"  by URL        {requests:3d} requests  {sent:12,d} bytes ({sent / size * 100:6.2f}% of the file)  "
          f"{url_time * 1e3:8.1f} ms")
    print(f"  download first  1 request   {size:12,d} bytes (100.00% of the file)  {download_time * 1e3:8.1f} ms")
    print(f"  ratio by URL / download first: time {url_time / download_time * 100:6.1f}%   "
          f"bytes {sent / size * 100:6.2f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-dense", type=int, default=16384)
    parser.add_argument("--small", type=int, default=999)
    parser.add_argument("--n-spqr", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    nginx = Nginx(binary)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            spqr_case(nginx, args.n_spqr, args.repeat, Path(scratch))
        big_file(nginx, args.n_dense, args.small)
    finally:
        nginx.stop()


if __name__ == "__main__":
    main()
