"""The door to numba's internals (``evaluate/jit/internals.py``): kernels compiled through numba's public
API (``HURRAY_SCHEMA_NUMBA_INTERNALS=0``, or a numba outside the tested range) give the bits the
internals' compilation gives, for the decode of every scheme, quantizing, SpQR (replace and add),
partitions and groups -- each mode in a fresh process with an empty cache.  The default policy (NumPy
standing in until a kernel is worth compiling) gives them too; a numba outside the tested range (the
public API path again) runs one scheme and a partition, with one warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WORK = r"""
import hashlib, json, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    if len(sys.argv) > 1:  # a numba that reports another version, as an untested release would
        import importlib.metadata
        real = importlib.metadata.version
        importlib.metadata.version = lambda name: sys.argv[1] if name == "numba" else real(name)
    import numpy as np
    import hurray_schema as hs
    from hurray_schema.evaluate import jit

    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    results = {}
    schemes = (("per_block", {"storage": hs.ElementType.INT4, "block_size": 64}),
               ("per_block", {"storage": hs.ElementType.INT8, "block_size": 32}),
               ("per_channel", {"storage": hs.ElementType.INT8}),
               ("per_tensor", {"storage": hs.ElementType.INT8}),
               ("nf4", {"block_size": 64}),
               ("mxfp", {"storage": hs.ElementType.FLOAT4_E2M1}))
    brief = len(sys.argv) > 1  # the untested numba: the public API path is the public mode's; one scheme shows it runs
    for scheme, options in schemes[:1] if brief else schemes:
        q = hs.quantize(x, scheme, **options)
        key = scheme + str(options.get("storage", ""))
        results["quantize " + key] = [bytes(b).hex() for b in q.buffers]
        results["decode " + key] = np.asarray(q).tobytes().hex()
        results["decode f16 " + key] = q.to_numpy(dtype=np.float16).tobytes().hex() if scheme != "per_tensor" else ""
    for combine in () if brief else ("replace", "add"):
        results["spqr " + combine] = np.asarray(hs.spqr(x, combine_op=combine)).tobytes().hex()
    results["partition"] = np.asarray(hs.partition(x, grid=(2, 4))).tobytes().hex()
    if not brief:
        group = hs.group({"a": hs.Tensor.from_numpy(x), "b": hs.quantize(x, "nf4", block_size=64)})
        results["group"] = [np.asarray(m).tobytes().hex() for m in group.members]
digest = {k: hashlib.sha256(json.dumps(v).encode()).hexdigest() for k, v in results.items()}
print(json.dumps({"results": digest, "compiled": jit.compile_count(), "numba": "numba" in sys.modules,
                  "warnings": [str(w.message) for w in caught if "hurray_schema" in str(w.message)]}))
"""


def _run(tmp_path: Path, mode: str, *argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HURRAY_SCHEMA_CACHE_DIR=str(tmp_path / mode))
    env.pop("NUMBA_CACHE_DIR", None)
    env.update({"default": {"HURRAY_SCHEMA_COMPILE": "default"},
                "eager": {"HURRAY_SCHEMA_COMPILE": "eager"},
                "public": {"HURRAY_SCHEMA_COMPILE": "eager", "HURRAY_SCHEMA_NUMBA_INTERNALS": "0"},
                "untested": {"HURRAY_SCHEMA_COMPILE": "eager"}}[mode])
    done = subprocess.run([sys.executable, "-c", WORK, *argv], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("modes")
    return {mode: _run(tmp, mode, *(("9.0.0",) if mode == "untested" else ())) for mode in
            ("eager", "public", "default", "untested")}


def test_the_public_api_gives_the_bits_of_the_internals(runs):
    assert runs["public"]["results"] == runs["eager"]["results"]
    assert runs["public"]["compiled"] >= 1 and not runs["public"]["warnings"]  # the switch warns of nothing


def test_the_default_policy_gives_the_same_bits(runs):
    assert runs["default"]["results"] == runs["eager"]["results"]


def test_a_numba_outside_the_tested_range_works_with_one_warning(runs):
    untested = runs["untested"]
    assert len(untested["results"]) == 4 and untested["results"].items() <= runs["eager"]["results"].items()
    assert len(untested["warnings"]) == 1 and "numba 9.0.0 is outside the tested range" in untested["warnings"][0]
