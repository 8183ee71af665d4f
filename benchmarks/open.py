"""Open a weight file and read one row of one tensor, hurray_schema beside safetensors, same run.

    python benchmarks/open.py [--counts 124,10000,100000] [--repeat 9] [--runs 7] [--mem-runs 3]
                              [--shape 16,16] [--big 4096,64] [--row 1234] [--keep DIR]

The issue "Open a file as fast as safetensors".  For each count N the same float16 tensors are
written twice: N - 1 small ones (``--shape``, [16, 16] by default) and one larger one
(``--big``, [4096, 64]) in the middle of the name order, ours with ``hs.save``, theirs with
``safetensors.numpy.save_file``.  The task, on both sides inside a ``with`` block:

* ours   -- ``hs.read_file(path)`` then ``f.get_item("big")[row]``
  (also ``f["big"][row]``, the top-level mapping without ``get_item``'s member lookup);
* theirs -- ``safetensors.safe_open(path, framework="numpy")`` then ``get_slice("big")[row]``.

The rows are checked equal (value and dtype) outside any timing.  Four parts:

1. in process -- open + one row, wall time (``perf_counter``), median of ``--repeat`` rounds,
   ours and theirs in turn within each round (after one untimed call of each), and the
   ratio ours/theirs (the issue's acceptance target <= 2x, moonshot 1x);
2. whole process -- ``python -c "import ...; open; read row"`` for each side, warm: median of
   ``--runs`` processes run in turn, with numba's cache (``NUMBA_CACHE_DIR``) filled by a first
   run; cold: median of ``--runs`` processes, each with a new empty ``NUMBA_CACHE_DIR`` and
   generated-code cache (as after a fresh install; ours only -- safetensors has no such cache),
   run in turn with the warm ones.
   ``python -c pass`` is the baseline;
3. at the largest count, in fresh processes (median of ``--mem-runs``): the open's time and
   its memory growth -- VmRSS before/after the open (after the imports, the file still open)
   split into anonymous memory and file-backed pages of the map touched (RssAnon / RssFile),
   and the Python heap it allocates (``tracemalloc``, current and peak; safetensors' header
   is parsed in Rust, which tracemalloc does not see, so RSS is the comparable figure);
4. ``import hurray_schema`` under ``-X importtime`` in a fresh process: whether numba,
   llvmlite and pdb are imported (and by whom), the 10 modules of largest self time, then
   what the first and a second open + row import and compile: calls of the builtins
   ``compile`` and ``exec`` (with source text) counted by wrappers, and whether numba is
   loaded by the end.

Nothing is asserted.  The files live in a temporary folder removed at the end (``--keep DIR``
writes, or reuses, them there instead and keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from caches import caches_in

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

BIG = "big"

# what a user types, in a fresh process: {path!r} and {row} filled in
OURS_CMD = "import hurray_schema as hs\nwith hs.read_file({path!r}) as f:\n    f.get_item({big!r})[{row}]"
THEIRS_CMD = ("from safetensors import safe_open\nwith safe_open({path!r}, framework='numpy') as f:\n"
              "    f.get_slice({big!r})[{row}]")

# part 3: one open in a fresh process, its time and memory; argv: side, path, row, tracemalloc (0/1)
MEMORY_CHILD = r'''
import json, sys, time, gc
side, path, row, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields

if side == "ours":
    import hurray_schema as hs
    opener = hs.read_file
else:
    import numpy
    from safetensors import safe_open
    opener = lambda p: safe_open(p, framework="numpy")
gc.collect()
if traced:
    import tracemalloc
    tracemalloc.start()
before = status()
start = time.perf_counter()
f = opener(path)
opened = time.perf_counter()
value = (f.get_item if side == "ours" else f.get_slice)(BIG)[row]
done = time.perf_counter()
after = status()
report = {"open_s": opened - start, "row_s": done - opened, "rss": after["VmRSS"] - before["VmRSS"],
          "hwm": after["VmHWM"] - before["VmHWM"], "anon": after["RssAnon"] - before["RssAnon"],
          "file": after["RssFile"] - before["RssFile"], "rss_after": after["VmRSS"]}
if traced:
    report["heap"], report["heap_peak"] = tracemalloc.get_traced_memory()
print(json.dumps(report))
'''.replace("BIG", repr(BIG))

# part 4: argv: path, row.  Markers on stderr delimit -X importtime's lines.
IMPORT_CHILD = r"""
import builtins, json, sys, time
path, row = sys.argv[1], int(sys.argv[2])
calls = []
real_compile, real_exec = builtins.compile, builtins.exec

def counting_compile(source, filename, *args, **kwargs):
    calls.append(["compile", str(filename)])
    return real_compile(source, filename, *args, **kwargs)

def counting_exec(source, *args, **kwargs):
    if isinstance(source, (str, bytes)):
        calls.append(["exec(str)", "<string>"])
    return real_exec(source, *args, **kwargs)

builtins.compile, builtins.exec = counting_compile, counting_exec
print("@@ import hurray_schema", file=sys.stderr, flush=True)
start = time.perf_counter()
import hurray_schema as hs
hs.read_file  # the package imports a name's module on first use: this loads the read path
imported = time.perf_counter() - start
report = {"import_s": imported, "import_calls": list(calls), "passes": []}
for n in range(2):
    print("@@ second open" if n else "@@ first open", file=sys.stderr, flush=True)
    calls.clear()
    before = set(sys.modules)
    start = time.perf_counter()
    with hs.read_file(path) as f:
        f.get_item(BIG)[row]
    report["passes"].append({"s": time.perf_counter() - start, "calls": list(calls),
                             "new_modules": len(set(sys.modules) - before)})
builtins.compile, builtins.exec = real_compile, real_exec
report["numba_loaded"] = "numba" in sys.modules
report["llvmlite_loaded"] = "llvmlite" in sys.modules
jit = sys.modules.get("hurray_schema.evaluate.jit")
report["kernels"] = jit.timings() if jit is not None and hasattr(jit, "timings") else None
print(json.dumps(report))
""".replace("BIG", repr(BIG))


# ------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------

def tensors(count: int, shape: tuple, big: tuple) -> dict:
    """``count - 1`` small float16 tensors and the big one, in the middle of the name order."""
    rng = np.random.default_rng(count)
    small = rng.standard_normal((count - 1, *shape)).astype(np.float16)
    names = [f"model.layers.{i}.weight" for i in range(count - 1)]
    items = {name: small[i] for i, name in enumerate(names[: (count - 1) // 2])}
    items[BIG] = rng.standard_normal(big).astype(np.float16)
    items.update((name, small[i]) for i, name in enumerate(names) if i >= (count - 1) // 2)
    return items


def make_files(folder: Path, count: int, shape: tuple, big: tuple) -> tuple[Path, Path, float, float]:
    """Both files for ``count`` tensors (reused when ``--keep`` already holds them); the seconds
    each write took (0 when reused)."""
    from safetensors.numpy import save_file

    import hurray_schema as hs

    ours, theirs = folder / f"{count}.hrry", folder / f"{count}.safetensors"
    if ours.exists() and theirs.exists():
        return ours, theirs, 0.0, 0.0
    items = tensors(count, shape, big)
    start = time.perf_counter()
    hs.save(ours, items)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    save_file({k: np.ascontiguousarray(v) for k, v in items.items()}, str(theirs))
    return ours, theirs, ours_s, time.perf_counter() - start


# ------------------------------------------------------------------------------------
# 1. In process
# ------------------------------------------------------------------------------------

def our_row(path: Path, row: int):
    import hurray_schema as hs

    with hs.read_file(path) as f:
        return np.array(f.get_item(BIG)[row])


def our_row_by_key(path: Path, row: int):
    import hurray_schema as hs

    with hs.read_file(path) as f:
        return np.array(f[BIG][row])


def their_row(path: Path, row: int):
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.get_slice(BIG)[row]


def in_process(fns: list, repeat: int) -> list[float]:
    """Median wall time of each of ``fns`` over ``repeat`` rounds, timed in turn in every round
    (after one untimed call of each)."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


# ------------------------------------------------------------------------------------
# Children
# ------------------------------------------------------------------------------------

def environment(cache: Path) -> dict:
    """A user's environment: the checkout first on the path, bytecode kept, numba's cache in ``cache``
    and the generated-code cache (``hurray_schema/codecache.py``) in a folder inside it."""
    env = dict(os.environ, **caches_in(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_process(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def whole_process(ours: Path, theirs: Path, row: int, runs: int, caches: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="numba-", dir=caches))
    env = environment(cache)
    argv = {"ours": [sys.executable, "-c", OURS_CMD.format(path=str(ours), big=BIG, row=row)],
            "theirs": [sys.executable, "-c", THEIRS_CMD.format(path=str(theirs), big=BIG, row=row)]}
    run_process(argv["ours"], env)  # the cache empty: fills it (and the page cache)
    run_process(argv["theirs"], env)  # the page cache for theirs
    warm: dict = {"ours": [], "theirs": [], "cold": []}
    for _ in range(runs):
        for side in ("ours", "theirs"):
            warm[side].append(run_process(argv[side], env))
        fresh = Path(tempfile.mkdtemp(prefix="numba-cold-", dir=caches))  # as after a fresh install
        warm["cold"].append(run_process(argv["ours"], environment(fresh)))
    return {"cold": statistics.median(warm["cold"]), "ours": statistics.median(warm["ours"]),
            "theirs": statistics.median(warm["theirs"]),
            "ours_range": (min(warm["ours"]), max(warm["ours"])),
            "theirs_range": (min(warm["theirs"]), max(warm["theirs"]))}


def memory(ours: Path, theirs: Path, row: int, runs: int, caches: Path) -> dict:
    env = environment(caches / "numba-memory")
    out: dict = {}
    for traced in (False, True):
        samples: dict = {"ours": [], "theirs": []}
        for _ in range(runs if not traced else 1):
            for side, path in (("ours", ours), ("theirs", theirs)):
                done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, side, str(path), str(row),
                                       "1" if traced else "0"], env=env, capture_output=True, text=True,
                                      check=False)
                if done.returncode:
                    raise SystemExit(f"memory child ({side}) failed:\n{done.stderr[-3000:]}")
                samples[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
        for side, reports in samples.items():
            key = "traced" if traced else "plain"
            out.setdefault(side, {})[key] = {k: statistics.median(r[k] for r in reports) for k in reports[0]}
    return out


def imports(ours: Path, row: int, caches: Path) -> list[dict]:
    """Two processes running :data:`IMPORT_CHILD` one after the other with the same caches, empty
    before the first (a fresh install, then the user's next process)."""
    env = environment(Path(tempfile.mkdtemp(prefix="numba-", dir=caches)))
    return [_import_child(ours, row, env) for _ in range(2)]


def _import_child(ours: Path, row: int, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORT_CHILD, str(ours), str(row)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"import child failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    phases: dict = {}
    phase = None
    for line in done.stderr.splitlines():
        if line.startswith("@@ "):
            phase = line[3:]
            phases[phase] = []
        elif phase and line.startswith("import time:") and "|" in line:
            self_us, cumulative, name = line[len("import time:"):].split("|", 2)
            if self_us.strip().isdigit():
                phases[phase].append((int(self_us), int(cumulative), name.rstrip()))
    report["phases"] = phases
    return report


def generated(calls: list) -> list:
    """The compilations of this package's generated code among ``calls`` (``[kind, file name]``)."""
    return [where for kind, where in calls if where.startswith("<hurray_schema")]


def _parents(lines: list, target: str) -> list[str]:
    """The chain of modules whose import imported ``target`` (importtime prints children before
    their parent, one indentation level deeper)."""
    for i, (_, _, name) in enumerate(lines):
        if name.strip() == target:
            depth = len(name) - len(name.lstrip())
            chain = []
            for _, _, later in lines[i + 1:]:
                level = len(later) - len(later.lstrip())
                if level < depth:
                    chain.append(later.strip())
                    depth = level
            return chain
    return []


# ------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------

def _mb(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="124,10000,100000", help="tensors per file, comma-separated")
    ap.add_argument("--repeat", type=int, default=9, help="in-process rounds per count")
    ap.add_argument("--runs", type=int, default=7, help="warm processes per side and count")
    ap.add_argument("--mem-runs", type=int, default=3, help="fresh processes per side for the memory figures")
    ap.add_argument("--shape", default="16,16", help="shape of the small tensors")
    ap.add_argument("--big", default="4096,64", help="shape of the tensor whose row is read")
    ap.add_argument("--row", type=int, default=1234)
    ap.add_argument("--keep", type=Path, help="write (or reuse) the files in this folder and keep them")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    shape = tuple(int(s) for s in args.shape.split(","))
    big = tuple(int(s) for s in args.big.split(","))

    import safetensors

    import hurray_schema

    work = Path(tempfile.mkdtemp(prefix="hurray-open-"))
    try:
        folder = args.keep or work / "files"
        folder.mkdir(parents=True, exist_ok=True)
        caches = work / "caches"
        caches.mkdir()
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; hurray_schema {getattr(hurray_schema, '__version__', '?')}, "
              f"safetensors {safetensors.__version__}")
        print(f"float16 tensors: N-1 of {list(shape)} + {BIG!r} {list(big)}, row {args.row} of {BIG!r}\n")

        files = {}
        print(f"{'N':>7} {'ours MB':>9} {'theirs MB':>10} {'ours write s':>13} {'theirs write s':>15}  rows equal")
        for count in counts:
            ours, theirs, ours_w, theirs_w = make_files(folder, count, shape, big)
            files[count] = (ours, theirs)
            a, b = our_row(ours, args.row), their_row(theirs, args.row)
            same = a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            same_key = np.array_equal(our_row_by_key(ours, args.row), b)
            print(f"{count:7d} {_mb(ours.stat().st_size):>9} {_mb(theirs.stat().st_size):>10} {ours_w:13.2f} "
                  f"{theirs_w:15.2f}  {'yes' if same and same_key else 'NO'} ({a.dtype}, {a.shape})", flush=True)

        verdicts: list = []  # (what, ratio, goal) for the summary at the end
        print(f"\n1. in process: open + one row, median of {args.repeat} (ms); ratio ours/theirs, "
              "target <= 2x, moonshot 1x")
        print(f"{'N':>7} {'ours get_item':>15} {'ours f[name]':>13} {'safetensors':>12} {'ratio':>7} "
              f"{'ratio f[name]':>14}")
        for count in counts:
            ours, theirs = files[count]
            a, k, b = in_process([partial(our_row, ours, args.row), partial(our_row_by_key, ours, args.row),
                                  partial(their_row, theirs, args.row)], args.repeat)
            print(f"{count:7d} {a * 1e3:15.2f} {k * 1e3:13.2f} {b * 1e3:12.2f} {a / b:6.1f}x {k / b:13.1f}x",
                  flush=True)
            verdicts.append((f"in process, N = {count}: open + row <= 2x safetensors", a / b, 2.0))

        print(f"\n2. whole process: python -c 'import; open; row' (s), warm median of {args.runs} (min-max); "
              "cold = ours with empty caches")
        env = environment(caches / "numba-pass")
        base = statistics.median(run_process([sys.executable, "-c", "pass"], env) for _ in range(args.runs))
        print(f"  python -c pass: {base:.3f} s")
        print(f"{'N':>7} {'ours warm':>22} {'safetensors warm':>22} {'ratio':>7} {'ours cold':>10} {'cold ratio':>11}")
        for count in counts:
            w = whole_process(*files[count], args.row, args.runs, caches)
            print(f"{count:7d} {w['ours']:8.3f} ({w['ours_range'][0]:.3f}-{w['ours_range'][1]:.3f}) "
                  f"{w['theirs']:8.3f} ({w['theirs_range'][0]:.3f}-{w['theirs_range'][1]:.3f}) "
                  f"{w['ours'] / w['theirs']:6.1f}x {w['cold']:10.3f} {w['cold'] / w['theirs']:10.1f}x", flush=True)
            verdicts.append((f"whole process, N = {count}, warm: <= 2x safetensors", w["ours"] / w["theirs"], 2.0))
            verdicts.append((f"whole process, N = {count}, cold: <= 2x safetensors", w["cold"] / w["theirs"], 2.0))

        largest = max(counts)
        print(f"\n3. N = {largest}, one open in a fresh process (median of {args.mem_runs}): time and memory growth "
              "of the open + row (MB)")
        m = memory(*files[largest], args.row, args.mem_runs, caches)
        print(f"{'':12} {'open ms':>8} {'row ms':>7} {'RSS +':>8} {'anon +':>8} {'file +':>8} {'peak RSS +':>11} "
              f"{'RSS after':>10} {'py heap':>8} {'py peak':>8}")
        for side in ("ours", "theirs"):
            p, t = m[side]["plain"], m[side]["traced"]
            print(f"{side:12} {p['open_s'] * 1e3:8.1f} {p['row_s'] * 1e3:7.2f} {_mb(p['rss'])} {_mb(p['anon'])} "
                  f"{_mb(p['file'])} {_mb(p['hwm']):>11} "
                  f"{_mb(p['rss_after']):>10} {_mb(t['heap'])} {_mb(t['heap_peak'])}")
        o, t = m["ours"]["plain"], m["theirs"]["plain"]
        verdicts.append((f"N = {largest}: open in a fresh process <= 2x safetensors", o["open_s"] / t["open_s"], 2.0))
        print(f"ratio ours/theirs: open {o['open_s'] / t['open_s']:.1f}x, RSS growth "
              f"{o['rss'] / max(t['rss'], 1):.1f}x ({(o['rss'] - t['rss']) / largest:.0f} bytes more per tensor; "
              f"anonymous {o['anon'] / max(t['anon'], 1):.1f}x, file-backed (pages of the map touched) "
              f"{o['file'] / max(t['file'], 1):.1f}x)")

        print("\n4. import hurray_schema + hs.read_file (-X importtime, fresh process, empty caches); "
              f"then open + row of the N = {min(counts)} and N = {largest} files")
        for count in sorted({min(counts), largest}):
            reports = imports(files[count][0], args.row, caches)
            r = reports[0]
            lines = r["phases"].get("import hurray_schema", [])
            if count == min(counts):
                names = {name.strip() for _, _, name in lines}
                total = sum(s for s, _, _ in lines)
                print(f"  import: {r['import_s']:.3f} s wall, {len(lines)} modules, {total / 1e6:.3f} s self in all")
                for module in ("numba", "llvmlite", "pdb"):
                    chain = _parents(lines, module) if module in names else []
                    print(f"  imports {module:9s} {'yes' if module in names else 'no'}"
                          + (f"  (by {' <- '.join(chain[:6])})" if chain else ""))
                print("  top 10 modules by self time (ms, cumulative ms):")
                for self_us, cumulative, name in sorted(lines, key=lambda l: -l[0])[:10]:
                    print(f"    {self_us / 1e3:8.2f} {cumulative / 1e3:9.2f}  {name.strip()}")
            for which, r in zip(("first process (empty caches)", "next process (same caches)"), reports):
                print(f"  N = {count}, {which}: import compiled {len(generated(r['import_calls']))} "
                      "generated functions of ours")
                for n, phase in enumerate(("first open", "second open")):
                    p = r["passes"][n]
                    new = r["phases"].get(phase, [])
                    by_file: dict = {}
                    for kind, where in p["calls"]:
                        key = f"{kind} {where}"
                        by_file[key] = by_file.get(key, 0) + 1
                    print(f"    {phase} + row: {p['s'] * 1e3:.1f} ms, {p['new_modules']} modules imported "
                          f"({sum(s for s, _, _ in new) / 1e3:.1f} ms self), {len(p['calls'])} compile/exec(str) calls"
                          + "".join(f"\n      {c:5d}  {k}" for k, c in sorted(by_file.items(), key=lambda kv: -kv[1])))
                    heavy = [name.strip() for _, _, name in new
                             if name.strip().split(".")[0] in ("numba", "llvmlite") and "." not in name.strip()]
                    if heavy:
                        print(f"      imported here: {', '.join(heavy)}")
                kernels = r.get("kernels") or {}
                print(f"    numba loaded by the end: {'yes' if r['numba_loaded'] else 'no'}, llvmlite: "
                      f"{'yes' if r['llvmlite_loaded'] else 'no'}, kernels compiled "
                      f"{len(kernels.get('compiled', []))}, loaded {len(kernels.get('loaded', []))}")
            later = reports[1]
            compiled_later = len(generated(later["import_calls"] + [c for p in later["passes"] for c in p["calls"]]))
            verdicts.append((f"N = {count}: generated functions the read path compiles in a later process "
                             "(import, two opens + rows) == 0", compiled_later, 0))
        print("\nacceptance (the issue's ratios, this run):")
        for what, ratio, goal in verdicts:
            print(f"  {'met ' if ratio <= goal else 'MISSED'} {ratio:5.2f}  {what}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
