"""Time to first result: each public operation in a fresh process, cold and warm.

    python benchmarks/startup.py [--ops NAME,...] [--warm-runs 3] [--keep DIR] [--top 25]

Every operation runs in new Python processes, as a user's command, notebook or worker
meets it:

* ``cold`` -- the caches empty (numba's and the generated code's: :func:`caches.caches_in` of a new
  empty folder, as after a fresh install): every kernel the operation needs is compiled;
* ``warm`` -- the same folder again, filled by the cold run (median of ``--warm-runs``
  processes): kernels are loaded from the cache.

For each it prints the whole process's wall time, the part spent in ``import hurray_schema``,
the first call of the operation, and the operation's second call in the same process (the
work itself, once nothing is left to compile or load).  Where the time goes is printed
beside it: numba compiling (seconds, and how many kernel specializations), numba loading
kernels from its cache, and importing the heavy modules (numba, llvmlite, ml_dtypes, scipy,
dask) -- each measured inside the child process.  After the table, the kernels whose
compilation cost most over all cold runs, each specialization on its own line.

Baselines measured in the same run: an empty ``python -c pass``, and ``numpy.load`` of a
``.npy`` of the SpQR overlay's merged array (what a user would compare the ``merge``
command with).  The inputs are made once in this process (``--keep DIR`` keeps them).  The package's bytecode
is compiled first and the children may write bytecode, as after a ``pip install`` (which
compiles it): what is measured is numba's cache, not Python's.
Nothing asserts; the acceptance figures of the startup issue are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from caches import caches_in

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------
# The child: runs one operation and reports where its time went, as JSON on stdout
# ------------------------------------------------------------------------------------

CHILD = r'''
import json, sys, time
started = time.perf_counter()
import importlib.abc, importlib.machinery

HEAVY = ("numba", "llvmlite", "ml_dtypes", "scipy", "dask", "distributed", "zarr")
report = {"imports": {}, "compiles": [], "cache_loads": 0, "cache_load_s": 0.0}
_importing = []


def _instrument_numba():
    from numba.core import caching, event

    stack = []

    class CompileTimes(event.Listener):
        def on_start(self, ev):
            stack.append([time.perf_counter(), 0.0])

        def on_end(self, ev):
            start, nested = stack.pop()
            total = time.perf_counter() - start
            if stack:
                stack[-1][1] += total
            fn = ev.data["dispatcher"].py_func
            report["compiles"].append([total - nested, f"{fn.__module__}.{fn.__qualname__}",
                                       ", ".join(str(a) for a in ev.data["args"])])

    event.register("numba:compile", CompileTimes())
    load = caching.Cache.load_overload

    def timed_load(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return load(self, *args, **kwargs)
        finally:
            report["cache_loads"] += 1
            report["cache_load_s"] += time.perf_counter() - start

    caching.Cache.load_overload = timed_load


class Watch(importlib.abc.MetaPathFinder):
    """Times the import of each heavy top-level module; instruments numba once it is imported."""

    def find_spec(self, name, path, target=None):
        top = name.partition(".")[0]
        if top not in HEAVY and name != "numba.core.dispatcher":
            return None
        if name != top and name != "numba.core.dispatcher":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def timed(module):
            start = time.perf_counter()
            try:
                exec_module(module)
            finally:
                if name == top:
                    report["imports"][top] = time.perf_counter() - start
            if name == "numba.core.dispatcher":
                _instrument_numba()

        loader.exec_module = timed
        return spec


sys.meta_path.insert(0, Watch())
report["python_s"] = started - float(sys.argv[1])
t = time.perf_counter()
import hurray_schema as hs
report["import_s"] = time.perf_counter() - t
namespace = {"hs": hs, "FIX": sys.argv[2]}
exec(compile(sys.argv[3], "<setup>", "exec"), namespace)
call = compile(sys.argv[4], "<call>", "exec")
t = time.perf_counter()
exec(call, namespace)
report["first_s"] = time.perf_counter() - t
t = time.perf_counter()
exec(call, namespace)
report["work_s"] = time.perf_counter() - t
report["in_process_s"] = time.perf_counter() - started
report["modules"] = sorted(m for m in HEAVY if m in sys.modules)
kernels = sys.modules.get("hurray_schema.evaluate.jit")
report["kernels"] = kernels.timings() if kernels is not None else {"compiled": [], "loaded": []}
print("\n" + json.dumps(report))
'''


# ------------------------------------------------------------------------------------
# The operations: (setup, call) run by the child with ``hs`` imported and FIX the inputs' folder
# ------------------------------------------------------------------------------------

def _decode(name: str) -> tuple[str, str]:
    return f"f = hs.read_file(FIX + '/families.hrry')\nitem = f[{name!r}]", "item.to_numpy()"


FAMILIES = ["f32", "f16", "bf16", "int8", "bool", "int4_codes", "float8_codes", "column_major", "strided",
            "tiled", "morton", "hilbert", "block_paged", "coo", "csr", "csc", "csf",
            "per_tensor_int8", "per_channel_int8", "per_block_int4", "per_block_int4_bf16", "per_block_int8",
            "per_block_uint4_asym", "per_block_int2", "nf4", "mxfp_e4m3", "mxfp_e2m1", "mxfp_int8"]
"""One tensor per storage family (scheme, layout, element type) in ``families.hrry``."""

QUANTIZE = {
    "per_tensor": "hs.quantize(w, 'per_tensor')",
    "per_channel": "hs.quantize(w, 'per_channel', storage='int8', axis=0)",
    "per_block": "hs.quantize(w, 'per_block')",
    "per_block_int8_f32": "hs.quantize(w32, 'per_block', storage='int8', scale_type='float32')",
    "nf4": "hs.quantize(w, 'nf4', block_size=64)",
    "mxfp": "hs.quantize(w, 'mxfp', storage='float4_e2m1')",
}

_LOAD_W = "import numpy as np\nw = np.load(FIX + '/w16.npy')\nw32 = w.astype(np.float32)"

_CLI = """\
import contextlib, io
from hurray_schema.cli import main as cli
def command(argv):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(argv, standalone_mode=False)
        except SystemExit:
            pass
"""


def operations() -> dict[str, tuple[str, str]]:
    ops = {"import": ("", "pass")}
    ops["load int4 [512,512]"] = ("", "hs.load(FIX + '/int4.hrry')")
    for name in FAMILIES:
        ops[f"decode {name}"] = _decode(name)
    ops["merge partition f32"] = ("f = hs.read_file(FIX + '/composites.hrry')\nitem = f['partition']",
                                  "item.materialize()")
    ops["merge partition int4"] = ("f = hs.read_file(FIX + '/composites.hrry')\nitem = f['partition_int4']",
                                   "item.materialize()")
    ops["merge overlay add f16"] = ("f = hs.read_file(FIX + '/composites.hrry')\nitem = f['overlay_add']",
                                    "item.materialize()")
    ops["merge overlay spqr"] = ("f = hs.read_file(FIX + '/composites.hrry')\nitem = f['spqr']",
                                 "item.materialize()")
    ops["slice spqr [64,64] box"] = ("f = hs.read_file(FIX + '/composites.hrry')\ns = f.get_item('spqr')",
                                     "s[64:128, 64:128]")
    for name, call in QUANTIZE.items():
        ops[f"quantize {name}"] = (_LOAD_W, call)
    ops["spqr"] = (_LOAD_W, "q = hs.spqr(w, bits=4, block_size=64, outliers=0.01)")
    ops["spqr + materialize"] = (_LOAD_W, "hs.spqr(w, bits=4, block_size=64, outliers=0.01).materialize()")
    ops["to_dask spqr"] = ("f = hs.read_file(FIX + '/composites.hrry')",
                           "f.to_dask('spqr').compute(scheduler='threads')")
    ops["audit command"] = (_CLI, "command(['audit', FIX + '/spqr.hrry'])")
    ops["merge command"] = (_CLI, "command(['merge', FIX + '/spqr.hrry', 'w', '-o', FIX + '/out.npy'])")
    return ops


# the whole-process commands (no child instrumentation): what a user types
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "numpy.load of the merged SpQR .npy": [sys.executable, "-c", "import numpy as np; np.load({merged!r})"],
    "hurray-schema merge SpQR [4096,4096]": [sys.executable, "-m", "hurray_schema", "merge", "{spqr}", "w",
                                             "-o", "{out}"],
    "hurray-schema audit SpQR file": [sys.executable, "-m", "hurray_schema", "audit", "{spqr}"],
    "import + read_file + materialize": [sys.executable, "-c", textwrap.dedent("""\
        import hurray_schema as hs
        with hs.read_file({spqr!r}) as f:
            f['w'].materialize()""")],
}


# ------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------

def _tensor(tag, shape, layout, buffers, **fields):
    import numpy as np

    from hurray_schema.io import Tensor
    from hurray_schema.model import BufferHandle, TensorDescriptor

    raw = [np.ascontiguousarray(b).reshape(-1).view(np.uint8) for b in buffers]
    desc = TensorDescriptor(tag, shape, layout, tuple(BufferHandle(b.size) for b in raw), **fields)
    return Tensor(desc, raw)


def families() -> dict:
    """One small tensor of every storage family the decoder distinguishes."""
    import ml_dtypes
    import numpy as np

    import hurray_schema as hs
    from hurray_schema.model import (BlockPagedLayout, ColumnMajorLayout, CsfLayout, ElementType, HilbertLayout,
                                     MortonLayout, StridedLayout, TiledLayout)

    rng = np.random.default_rng(0)
    n = 256
    w = rng.standard_normal((n, n)).astype(np.float32)
    sparse = np.where(rng.random((n, n)) < 0.05, w, 0).astype(np.float32)
    coords = np.argwhere(sparse)
    csr = _csr(sparse)
    csc = _csr(sparse.T)
    cube = rng.standard_normal((8, 16, 16)).astype(np.float32)
    cube_coords = np.argwhere(np.abs(cube) > 1.5)
    page, pages, heads, dim = 16, 8, 4, 32
    pool = rng.standard_normal((pages * page, heads, dim)).astype(np.float32)
    table = np.array([3, 1, 4, 0, 2, 7, 6, 5], np.uint32)
    seq_ptr = np.array([0, 8], np.uint32)
    e4m3 = rng.integers(0, 0x7E, n * n, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(n, n)
    items = {
        "f32": w,
        "f16": w.astype(np.float16),
        "bf16": w.astype(ml_dtypes.bfloat16),
        "int8": (w * 30).astype(np.int8),
        "bool": w > 0,
        "int4_codes": rng.integers(-8, 8, (n, n)).astype(ml_dtypes.int4),
        "float8_codes": e4m3,
        "column_major": _tensor(ElementType.FLOAT32, (n, n), ColumnMajorLayout(), [np.asfortranarray(w).T]),
        "strided": _tensor(ElementType.FLOAT32, (n, n), StridedLayout((-n, 1)), [w[::-1]], byte_offset=(n - 1) * n * 4),
        "tiled": _tensor(ElementType.FLOAT32, (n, n), TiledLayout((16, 16)), [_tiles(w, 16)]),
        "morton": _tensor(ElementType.FLOAT32, (n, n), MortonLayout((8, 8)), [np.zeros(n * n, np.float32)]),
        "hilbert": _tensor(ElementType.FLOAT32, (n, n), HilbertLayout(8, 2), [np.zeros(n * n, np.float32)]),
        "block_paged": _tensor(ElementType.FLOAT32, (pages * page, heads, dim), BlockPagedLayout(page, pages, 1),
                               [pool, table, seq_ptr]),
        "coo": hs.sparse_coo(coords, sparse[tuple(coords.T)], (n, n)),
        "csr": hs.sparse_csr(*csr, (n, n)),
        "csc": hs.sparse_csc(*csc, (n, n)),
        "csf": _csf(cube, cube_coords),
        "per_tensor_int8": hs.quantize(w, "per_tensor"),
        "per_channel_int8": hs.quantize(w, "per_channel", storage="int8", axis=0),
        "per_block_int4": hs.quantize(w.astype(np.float16), "per_block"),
        "per_block_int4_bf16": hs.quantize(w.astype(ml_dtypes.bfloat16), "per_block"),
        "per_block_int8": hs.quantize(w, "per_block", storage="int8", scale_type="float32"),
        "per_block_uint4_asym": hs.quantize(w, "per_block", storage="uint4"),
        "per_block_int2": hs.quantize(w, "per_block", storage="int2"),
        "nf4": hs.quantize(w, "nf4", block_size=64),
        "mxfp_e4m3": hs.quantize(w, "mxfp", storage="float8_e4m3"),
        "mxfp_e2m1": hs.quantize(w, "mxfp", storage="float4_e2m1"),
        "mxfp_int8": hs.quantize(w, "mxfp", storage="int8"),
    }
    assert list(items) == FAMILIES
    return items


def _csr(dense):
    import numpy as np

    rows, cols = np.nonzero(dense)
    indptr = np.searchsorted(rows, np.arange(dense.shape[0] + 1)).astype(np.int64)
    return dense[rows, cols], cols.astype(np.int64), indptr


def _tiles(w, t):
    import numpy as np

    n = w.shape[0]
    return np.ascontiguousarray(w.reshape(n // t, t, n // t, t).transpose(0, 2, 1, 3))


def _csf(cube, coords):
    """A CSF tensor in mode order (0, 1, 2) of the entries at ``coords`` (C order, as argwhere gives)."""
    import numpy as np

    from hurray_schema.model import CsfLayout, ElementType

    values = cube[tuple(coords.T)].astype(np.float32)
    return _tensor(ElementType.FLOAT32, cube.shape, CsfLayout(len(values), (0, 1, 2)), [values] + _fibers(coords))


def _fibers(coords):
    """CSF's buffers after the values (``layouts/csf.md``): per level its pos and crd arrays, uint64."""
    import numpy as np

    buffers, parents = [], [()]
    for level in range(coords.shape[1]):
        nodes = sorted({tuple(c[:level + 1]) for c in coords})
        counts = [sum(1 for node in nodes if node[:level] == parent) for parent in parents]
        buffers.append(np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64))
        buffers.append(np.array([node[-1] for node in nodes], np.uint64))
        parents = nodes
    return buffers


def composites() -> dict:
    import numpy as np

    import hurray_schema as hs

    rng = np.random.default_rng(1)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    w16 = w.astype(np.float16)
    patch = rng.standard_normal((256, 256)).astype(np.float16)
    return {
        "partition": hs.partition(w, grid=(2, 2)),
        "partition_int4": hs.partition(w16, grid=(2, 2), member=lambda a: hs.quantize(a, "per_block")),
        "overlay_add": hs.overlay(w16, [(patch, (128, 256))], "add"),
        "spqr": hs.spqr(w16, bits=4, block_size=64, outliers=0.01),
    }


def make_inputs(folder: Path) -> None:
    import numpy as np

    import hurray_schema as hs

    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512)).astype(np.float16)
    np.save(folder / "w16.npy", w)
    hs.save(folder / "int4.hrry", {"w": hs.quantize(w, "per_block")})
    hs.save(folder / "families.hrry", families())
    hs.save(folder / "composites.hrry", composites())
    big = rng.standard_normal((4096, 4096)).astype(np.float16)
    spqr = hs.spqr(big, bits=4, block_size=64, outliers=0.01)
    hs.save(folder / "spqr.hrry", {"w": spqr})
    np.save(folder / "merged.npy", spqr.materialize())


# ------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------

def _environment(cache: Path) -> dict:
    """A user's environment: Python keeps bytecode (as after ``pip install``, which compiles it), numba's
    cache folder is ``cache``."""
    env = dict(os.environ, **caches_in(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_child(op: str, cache: Path, fixtures: Path) -> dict:
    setup, call = operations()[op]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, repr(time.perf_counter()), str(fixtures), setup, call],
                          env=_environment(cache), capture_output=True, text=True, cwd=fixtures)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{op}: the child failed\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["wall_s"] = wall
    return report


def run_command(argv: list[str], cache: Path, fixtures: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=_environment(cache), check=True, capture_output=True, cwd=fixtures)
    return time.perf_counter() - start


def _kernel_summary(report: dict, what: str) -> str:
    """Seconds and count of the kernel signatures the process compiled or loaded."""
    entries = report["kernels"][what]
    return f"{sum(e[2] for e in entries):6.2f} s /{len(entries):3d}"


def _imports(report: dict) -> str:
    return " ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(report["imports"].items()))


def measure(ops: list[str], warm_runs: int, fixtures: Path, caches: Path, top: int) -> dict:
    header = (f"{'operation':28s} | {'cold s':>7s} {'compiled s / n':>14s} | {'warm s':>6s} {'import':>6s} "
              f"{'1st call':>8s} {'loaded s / n':>13s} | {'work ms':>8s} | heavy imports, warm (s)")
    print(header)
    print("-" * len(header))
    results, hot, numba_hot = {}, {}, {}
    for op in ops:
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=caches))
        cold = run_child(op, cache, fixtures)
        warm = [run_child(op, cache, fixtures) for _ in range(warm_runs)]
        mid = sorted(warm, key=lambda r: r["wall_s"])[len(warm) // 2]
        results[op] = {"cold": cold, "warm": mid}
        for kernel, signature, seconds in cold["kernels"]["compiled"]:
            key = (kernel.replace("hurray_schema.evaluate.", ""), signature)
            hot[key] = max(hot.get(key, 0.0), seconds)
        for self_s, function, args in cold["compiles"]:
            key = ("numba: " + function.replace("hurray_schema.evaluate.", ""), args)
            numba_hot[key] = max(numba_hot.get(key, 0.0), self_s)
        print(f"{op:28s} | {cold['wall_s']:7.2f} {_kernel_summary(cold, 'compiled'):>14s} | {mid['wall_s']:6.2f} "
              f"{mid['import_s']:6.2f} {mid['first_s']:8.3f} {_kernel_summary(mid, 'loaded'):>13s} "
              f"| {mid['work_s'] * 1e3:8.2f} | {_imports(mid)}", flush=True)
    if hot and top:
        print("\nkernel signatures by compile time (cold, the first operation to need each; numba's own setup, "
              "some 0.5-1 s, falls on the first):")
        for (kernel, signature), seconds in sorted(hot.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {seconds:7.2f} s  {kernel} {signature[:110]}")
    if numba_hot and top:
        print("\nnumba functions by compile time, self (helpers and numba's own overloads, nested compiles apart):")
        for (function, args), seconds in sorted(numba_hot.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {seconds:7.2f} s  {function}({args[:110]})")
    return results


def measure_commands(warm_runs: int, fixtures: Path, caches: Path) -> dict:
    print(f"\n{'whole command':40s} {'cold s':>7s} {'warm s (median, min-max)':>26s}")
    values = {"merged": str(fixtures / "merged.npy"), "spqr": str(fixtures / "spqr.hrry"),
              "out": str(fixtures / "out.npy")}
    figures = {}
    for name, argv in COMMANDS.items():
        argv = [a.format(**values) for a in argv]
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=caches))
        cold = run_command(argv, cache, fixtures)
        warm = [run_command(argv, cache, fixtures) for _ in range(max(warm_runs, 3))]
        figures[name] = (cold, statistics.median(warm))
        print(f"{name:40s} {cold:7.2f} {statistics.median(warm):9.3f} ({min(warm):.3f}-{max(warm):.3f})", flush=True)
    return figures


def acceptance(results: dict, figures: dict) -> None:
    print("\nacceptance (startup issue):")
    worst = max((r["cold"]["wall_s"], op) for op, r in results.items()) if results else (0, "-")
    print(f"  cold, slowest first call of any operation: {worst[0]:.2f} s ({worst[1]})   target <= 10 s")
    decode = [(r["cold"]["wall_s"], op) for op, r in results.items()
              if op.startswith(("decode ", "merge partition", "merge overlay"))]
    if decode:
        slowest = max(decode)
        print(f"  cold, slowest decode / merge of one family: {slowest[0]:.2f} s ({slowest[1]})   target <= 3 s")
    for name, target in (("hurray-schema merge SpQR [4096,4096]", 0.5), ("import + read_file + materialize", 0.4)):
        if name in figures:
            print(f"  warm, {name}: {figures[name][1]:.3f} s   target <= {target} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated operation names (default: all); 'list' lists them")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="make (or reuse) the inputs in this folder")
    parser.add_argument("--top", type=int, default=25, help="kernels listed by compile cost")
    parser.add_argument("--no-commands", action="store_true", help="skip the whole-command table")
    args = parser.parse_args()
    names = list(operations())
    if args.ops == "list":
        print("\n".join(names))
        return
    ops = names if not args.ops else [op.strip() for op in args.ops.split(",")]
    unknown = [op for op in ops if op not in names]
    if unknown:
        raise SystemExit(f"unknown operations {unknown}; --ops list lists them")
    work = Path(tempfile.mkdtemp(prefix="hurray-startup-"))
    fixtures = args.keep or work / "inputs"
    fixtures.mkdir(parents=True, exist_ok=True)
    if not (fixtures / "merged.npy").exists():
        sys.path.insert(0, str(ROOT))
        start = time.perf_counter()
        make_inputs(fixtures)
        print(f"inputs made in {time.perf_counter() - start:.1f} s in {fixtures}")
    caches = work / "caches"
    caches.mkdir()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "hurray_schema")], check=True,
                   env=_environment(caches))  # what pip install does
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    results = measure(ops, args.warm_runs, fixtures, caches, args.top)
    figures = {} if args.no_commands else measure_commands(args.warm_runs, fixtures, caches)
    acceptance(results, figures)


if __name__ == "__main__":
    main()
