"""The kernel cache (evaluate/jit/cache.py): machine code compiled by several processes, loaded by one.

Kernels are compiled in whichever process first needs them -- test workers, a user's programs --
and a later process loads them all into one engine.  Each kernel's code must stay its own there:
its helpers are internal to its module, so a helper that two processes compiled under one name
(numba names helpers by a per-process counter) cannot be swapped for another kernel's.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hurray_schema as hs
from support.evaluate_reference import block_affine_int4_tensor
from hurray_schema.model import ElementType as E
from support.caches import PLANTED, shared_root_with_planted

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys
import numpy as np
import hurray_schema as hs
from hurray_schema.evaluate import jit

path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with hs.read_file(path) as f:
    for name in names:
        np.save(f"{out}/{name}.npy", f[name].to_numpy().view(np.uint16))
print(jit.compile_count())
"""


def _run(cache: Path, path: Path, out: Path, *names: str) -> int:
    """Decode ``names`` of ``path`` in a new process with the kernel cache ``cache``; how many kernels
    it compiled."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), HURRAY_SCHEMA_COMPILE="eager")
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), *names], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_kernels_compiled_in_separate_processes_keep_their_own_helpers(tmp_path):
    """Two variants of one kernel (int4 per-block decoding to float16 and to bfloat16), each compiled in
    its own process, then loaded side by side by a third: each gives its own type's values."""
    rng = np.random.default_rng(3)
    f16, f16_ref = block_affine_int4_tensor(16, 256, 64, rng, scale_tag=E.FLOAT16, out_dtype=np.float16)
    bf16, bf16_ref = block_affine_int4_tensor(16, 256, 64, rng, scale_tag=E.BFLOAT16,
                                              out_dtype=ml_dtypes.bfloat16)
    path = tmp_path / "two.hrry"
    hs.save(path, {name: hs.Tensor(t.descriptor, [np.frombuffer(b, np.uint8) for b in t.buffers])
                   for name, t in (("f16", f16), ("bf16", bf16))})
    cache, out = tmp_path / "kernels", tmp_path / "out"
    out.mkdir()

    assert _run(cache, path, out, "f16") >= 1
    assert _run(cache, path, out, "bf16") >= 1
    assert _run(cache, path, out, "f16", "bf16") == 0  # both loaded from the cache
    assert np.array_equal(np.load(out / "f16.npy"), f16_ref.view(np.uint16))
    assert np.array_equal(np.load(out / "bf16.npy"), bf16_ref.view(np.uint16))
    assert _run(cache, path, out, "bf16", "f16") == 0  # the other order of loading
    assert np.array_equal(np.load(out / "f16.npy"), f16_ref.view(np.uint16))
    assert np.array_equal(np.load(out / "bf16.npy"), bf16_ref.view(np.uint16))


USER_NUMBA_AFTER_A_KERNEL = r"""
import sys
import numpy as np
import hurray_schema as hs
from hurray_schema.evaluate import jit
from numba import njit
from numba.typed import List

with hs.read_file(sys.argv[1]) as f:
    f["f16"].to_numpy()
assert jit.compile_count() == 1, jit.compile_count()


@njit
def user_code(n):
    np.random.seed(n)
    words = List()
    for i in range(n):
        words.append(str(i) + "!")
    return len(words), words[n - 1], np.random.randint(0, 1000)


print(user_code(3))
"""


def test_numba_code_of_the_user_compiles_after_a_kernel(tmp_path):
    """A kernel compiles with a trimmed set of numba's implementations (jit.kernels._kernel_registries); numba
    code the process compiles afterwards still has them all: typed lists, strings, NumPy's random."""
    rng = np.random.default_rng(4)
    f16, _ = block_affine_int4_tensor(4, 64, 32, rng, scale_tag=E.FLOAT16, out_dtype=np.float16)
    path = tmp_path / "one.hrry"
    hs.save(path, {"f16": hs.Tensor(f16.descriptor, [np.frombuffer(b, np.uint8) for b in f16.buffers])})
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"), PYTHONPATH=str(ROOT),
               HURRAY_SCHEMA_COMPILE="eager")
    done = subprocess.run([sys.executable, "-c", USER_NUMBA_AFTER_A_KERNEL, str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    count, last, drawn = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert (count, last) == (3, "2!") and 0 <= drawn < 1000


LOAD_AND_REPORT = r"""
import json, sys
import numpy as np
import hurray_schema as hs
from hurray_schema.evaluate import jit

with hs.read_file(sys.argv[1]) as f:
    np.save(sys.argv[2], f["f16"].to_numpy().view(np.uint16))
print(json.dumps({"compiled": jit.compile_count(), "llvm": "llvmlite.binding" in sys.modules}))
"""


def _load_and_report(cache: Path, path: Path, out: Path) -> dict:
    import json

    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), HURRAY_SCHEMA_SHARED_KERNELS="1",
               HURRAY_SCHEMA_COMPILE="eager")
    done = subprocess.run([sys.executable, "-c", LOAD_AND_REPORT, str(path), str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cached_kernel_loads_as_a_shared_library_without_llvm(tmp_path):
    """Where the compiling process could link one (Linux, a C compiler driver), the cache holds each kernel
    as a shared library too: a later process loads it with the dynamic loader, LLVM never loaded, and
    gets the same bits.  A shared library that changed on disk is not loaded: its object code is (MCJIT)."""
    import shutil

    if not sys.platform.startswith("linux") or not any(map(shutil.which, ("cc", "gcc", "clang"))):
        pytest.skip("kernels are linked as shared libraries on Linux with a C compiler driver only")
    rng = np.random.default_rng(6)
    f16, f16_ref = block_affine_int4_tensor(16, 256, 64, rng, scale_tag=E.FLOAT16, out_dtype=np.float16)
    path = tmp_path / "one.hrry"
    hs.save(path, {"f16": hs.Tensor(f16.descriptor, [np.frombuffer(b, np.uint8) for b in f16.buffers])})
    cache = tmp_path / "kernels"
    assert _load_and_report(cache, path, tmp_path / "a.npy") == {"compiled": 1, "llvm": True}
    shared = sorted(cache.rglob("*.so"))
    assert len(shared) == 1
    assert _load_and_report(cache, path, tmp_path / "b.npy") == {"compiled": 0, "llvm": False}
    data = shared[0].read_bytes()
    shared[0].write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # no longer the library the cache recorded
    assert _load_and_report(cache, path, tmp_path / "c.npy") == {"compiled": 0, "llvm": True}
    for name in "abc":
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), f16_ref.view(np.uint16))


TRUST_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("always")
import numpy as np
import hurray_schema as hs
from hurray_schema.evaluate import jit

with warnings.catch_warnings(record=True) as caught:
    with hs.read_file(sys.argv[1]) as f:
        np.save(sys.argv[2], f["f16"].to_numpy().view(np.uint16))
print(json.dumps({"compiled": jit.compile_count(), "warnings": [str(w.message) for w in caught]}))
"""


def _trust_run(path: Path, out: Path, **env) -> dict:
    import json

    environment = dict(os.environ, PYTHONPATH=str(ROOT), HURRAY_SCHEMA_COMPILE="eager", **env)
    done = subprocess.run([sys.executable, "-c", TRUST_CHILD, str(path), str(out)], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def small_file(tmp_path):
    rng = np.random.default_rng(9)
    f16, reference = block_affine_int4_tensor(4, 64, 32, rng, scale_tag=E.FLOAT16, out_dtype=np.float16)
    path = tmp_path / "one.hrry"
    hs.save(path, {"f16": hs.Tensor(f16.descriptor, [np.frombuffer(b, np.uint8) for b in f16.buffers])})
    return path, reference.view(np.uint16)


def _files_in(folder: Path) -> list:
    return [Path(root) / name for root, _, names in os.walk(folder) for name in names]


def test_a_shared_numba_cache_folder_gets_a_private_folder_of_ours(tmp_path, small_file):
    """``NUMBA_CACHE_DIR`` world-writable and fresh: kernels go to a 0700 ``hurray_schema/`` of ours
    in it (files 0600) and a later process loads them from there."""
    path, reference = small_file
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    first = _trust_run(path, tmp_path / "a.npy", NUMBA_CACHE_DIR=str(shared))
    second = _trust_run(path, tmp_path / "b.npy", NUMBA_CACHE_DIR=str(shared))
    assert first["compiled"] >= 1 and second["compiled"] == 0 and not first["warnings"] + second["warnings"]
    for name in "ab":
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), reference)
    assert [p.name for p in shared.iterdir()] == ["hurray_schema"]
    for folder, _, _ in os.walk(shared / "hurray_schema"):
        assert os.stat(folder).st_mode & 0o777 == 0o700
    assert _files_in(shared) and all(p.stat().st_mode & 0o777 == 0o600 for p in _files_in(shared))


@pytest.mark.parametrize("planted", PLANTED)
def test_a_planted_kernel_folder_is_neither_read_nor_written(tmp_path, small_file, planted):
    """Another user planted ``hurray_schema/`` in the shared ``NUMBA_CACHE_DIR`` first: nothing is loaded
    from it or written to it (one warning), and the kernels are compiled in memory, right."""
    path, reference = small_file
    shared, trap = shared_root_with_planted(tmp_path, "hurray_schema", planted)
    for name in "ab":
        run = _trust_run(path, tmp_path / f"{name}.npy", NUMBA_CACHE_DIR=str(shared))
        assert run["compiled"] >= 1  # nothing loaded: compiled again by each process
        assert len(run["warnings"]) == 1 and "not cached" in run["warnings"][0]
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), reference)
    assert not _files_in(trap)


def test_the_default_kernel_cache_is_the_users_cache_folder(tmp_path, small_file):
    """Without ``NUMBA_CACHE_DIR``, kernels go to ``$XDG_CACHE_HOME/hurray_schema/kernels`` (never into
    the installed package); a version folder left by another build is removed when a new one is made."""
    path, reference = small_file
    old = tmp_path / "xdg" / "hurray_schema" / "kernels" / "0123456789abcdef0123"
    old.mkdir(parents=True, mode=0o700)
    for folder in (tmp_path / "xdg", tmp_path / "xdg" / "hurray_schema", old.parent):
        folder.chmod(0o700)
    (old / "stale.o").write_bytes(b"old machine code")
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("NUMBA_CACHE_DIR", "HURRAY_SCHEMA_CACHE_DIR")}
    environment.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT), HURRAY_SCHEMA_COMPILE="eager")
    package = ROOT / "hurray_schema"
    before = {p: p.stat().st_mtime_ns for p in package.rglob("*") if p.suffix in (".o", ".so", ".json")}
    done = subprocess.run([sys.executable, "-c", TRUST_CHILD, str(path), str(tmp_path / "a.npy")], env=environment,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp_path / "a.npy"), reference)
    kept = [p for p in old.parent.iterdir()]
    assert len(kept) == 1 and kept[0] != old and any(p.suffix == ".o" for p in kept[0].iterdir())
    after = {p: p.stat().st_mtime_ns for p in package.rglob("*") if p.suffix in (".o", ".so", ".json")}
    assert after == before  # nothing written inside the package


def test_a_kernel_folder_loosened_after_it_was_checked_is_no_longer_used(tmp_path, monkeypatch):
    """The version folder is checked again before every load and save: made group-writable after the
    process opened it, the cache stops there (one warning) instead of loading from it."""
    from hurray_schema.evaluate import jit

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    cache = jit.cache._Cache()
    assert cache._folder() is not None
    version = next((tmp_path / "hurray_schema").iterdir())
    version.chmod(0o770)
    with pytest.warns(RuntimeWarning, match="not cached"):
        assert cache._folder() is None
    assert cache._folder() is None
