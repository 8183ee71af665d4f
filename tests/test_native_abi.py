"""Where the native protocol's C ABI comes from (``hurray_schema/io/native_abi.py``): an installed
pyhurray's extension module, or the library ``HURRAY_SCHEMA_FFI_LIBRARY`` names; without either,
or with a library that is not the hurray-ffi C ABI, the protocol's calls raise
``NativeAbiUnavailable`` saying how to get one, and nothing else changes.  Each case runs in a
fresh interpreter, so what a test loads is what that interpreter found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

hurray = pytest.importorskip("hurray")

ROOT = Path(__file__).resolve().parents[1]
EXTENSION = str(next(Path(hurray.__file__).parent.glob("hurray*.so")))

TRY_BOTH_WAYS = """
import json, sys
import numpy as np
import hurray_schema as hs
out = {"loaded_at_import": sorted(m for m in sys.modules if m in ("hurray", "hurray_schema.io.native_abi"))}
t = hs.Tensor.from_numpy(np.arange(6, dtype=np.int32))
out["read"] = t.to_numpy().tolist()  # what does not use the protocol works as ever
for name, call in (("export", lambda: t.__hurray__()), ("import", lambda: hs.from_hurray(t))):
    try:
        call()
        out[name] = "ok"
    except hs.errors.NativeAbiUnavailable as exc:
        out[name] = ["NativeAbiUnavailable", str(exc), isinstance(exc, hs.HurraySchemaError)]
if out.get("import") == "ok":
    from hurray_schema.io.native_abi import native_abi
    out["path"] = native_abi().path
print(json.dumps(out))
"""


def _run(tmp_path, env_library=None, hide_pyhurray=False) -> dict:
    path = [str(ROOT)]
    if hide_pyhurray:  # a package named hurray without the extension module shadows pyhurray
        fake = tmp_path / "shadow" / "hurray"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("")
        path.insert(0, str(fake.parent))
    env = {"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"}
    if env_library is not None:
        env["HURRAY_SCHEMA_FFI_LIBRARY"] = env_library
    done = subprocess.run([sys.executable, "-c", TRY_BOTH_WAYS], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_hurray_schema_loads_neither_pyhurray_nor_the_abi(tmp_path):
    out = _run(tmp_path)
    assert out["loaded_at_import"] == []
    assert out["read"] == [0, 1, 2, 3, 4, 5]
    assert out["export"] == out["import"] == "ok"
    assert out["path"] == EXTENSION


def test_the_library_the_variable_names_is_taken(tmp_path):
    out = _run(tmp_path, env_library=EXTENSION, hide_pyhurray=True)
    assert out["export"] == out["import"] == "ok"
    assert out["path"] == EXTENSION


def test_without_a_library_the_calls_say_how_to_get_one(tmp_path):
    out = _run(tmp_path, hide_pyhurray=True)
    assert out["read"] == [0, 1, 2, 3, 4, 5]
    for side in ("export", "import"):
        kind, message, is_ours = out[side]
        assert kind == "NativeAbiUnavailable" and is_ours
        assert "pip install pyhurray" in message and "HURRAY_SCHEMA_FFI_LIBRARY" in message


def test_a_library_that_is_not_the_c_abi_is_refused(tmp_path):
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                            "/lib64/libm.so.6") if Path(p).exists())
    out = _run(tmp_path, env_library=libm)
    kind, message, _ = out["import"]
    assert kind == "NativeAbiUnavailable" and "does not export the hurray-ffi C ABI" in message
    missing = _run(tmp_path, env_library=str(tmp_path / "no-such-library.so"))
    assert "cannot load" in missing["export"][1]
