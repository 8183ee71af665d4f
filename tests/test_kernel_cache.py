"""The kernel cache (evaluate/jit.py): machine code compiled by several processes, loaded by one.

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
from evaluate_reference import block_affine_int4_tensor
from hurray_schema.model import ElementType as E

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
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
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
    """A kernel compiles with a trimmed set of numba's implementations (jit._kernel_registries); numba
    code the process compiles afterwards still has them all: typed lists, strings, NumPy's random."""
    rng = np.random.default_rng(4)
    f16, _ = block_affine_int4_tensor(4, 64, 32, rng, scale_tag=E.FLOAT16, out_dtype=np.float16)
    path = tmp_path / "one.hrry"
    hs.save(path, {"f16": hs.Tensor(f16.descriptor, [np.frombuffer(b, np.uint8) for b in f16.buffers])})
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"), PYTHONPATH=str(ROOT))
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

    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), HURRAY_SCHEMA_SHARED_KERNELS="1")
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
