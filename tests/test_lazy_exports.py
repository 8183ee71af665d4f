"""The lazy exports of the packages (``hurray_schema/_lazy.py``): every listed name resolves, former
top-level names still resolve without being listed, and ``import hurray_schema`` stays cheap."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import hurray_schema as hs
from hurray_schema._lazy import lazy_exports

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = ["hurray_schema", "hurray_schema.io", "hurray_schema.io.walk", "hurray_schema.net"]
FORMER_TOP_LEVEL = [  # a sample of the names the top level listed before it was made small
    "PerBlockAffine", "TensorDescriptor", "ElementType", "DYNAMIC_DIMENSION", "LimitExceeded", "FieldRangeError",
    "ClosedFileError", "NoSuchItem", "SessionTimeout", "materialize", "tensor_to_numpy", "lookup", "AuditReport",
    "CompositeValidator", "Finding", "Report", "ConvertReport", "NoExactForm", "Exported", "Server", "Session",
    "UInt64", "TensorSlice", "IndexEntry", "parse_descriptor", "DecodedTypeMismatch", "UnsupportedEvaluation",
]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_listed_name_resolves_and_is_in_dir(package):
    module = importlib.import_module(package)
    assert module.__getattr__.__module__ == "hurray_schema._lazy"  # the one mechanism
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))


def test_the_top_level_lists_only_verbs_and_nouns():
    assert {"load", "save", "read_file", "write_file", "read_stream", "write_stream", "audit", "convert", "serve",
            "connect", "partition", "quantize", "Tensor", "Composite", "HurraySchemaError"} <= set(hs.__all__)
    assert len(hs.__all__) <= 40
    assert callable(hs.audit) and hs.audit.__module__ == "hurray_schema.audit.run"  # the function, not the module


@pytest.mark.parametrize("name", FORMER_TOP_LEVEL)
def test_former_top_level_names_resolve_unlisted(name):
    value = getattr(hs, name)
    assert name not in hs.__all__ and name not in dir(hs)  # not listed, even once resolved
    homes = {"hurray_schema.model", "hurray_schema.errors", "hurray_schema.evaluate", "hurray_schema.io",
             "hurray_schema.audit", "hurray_schema.rules", "hurray_schema.rules.composite", "hurray_schema.conversion",
             "hurray_schema.export", "hurray_schema.net", "hurray_schema.codec"}
    assert any(getattr(importlib.import_module(home), name, None) is value for home in homes), name


def test_errors_and_model_types_are_listed_where_they_live():
    import hurray_schema.errors as errors
    import hurray_schema.model as model

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.HurraySchemaError), name
    assert {"ClosedFileError", "DecodedTypeMismatch", "NoExactForm", "LimitExceeded"} <= set(errors.__all__)
    assert {"PerBlockAffine", "TensorDescriptor", "ElementType", "DYNAMIC_DIMENSION"} <= set(model.__all__)
    assert all(hasattr(model, name) for name in model.__all__)


def test_an_unknown_name_is_an_attribute_error():
    for package in LAZY_PACKAGES:
        with pytest.raises(AttributeError, match="no_such_name"):
            getattr(importlib.import_module(package), "no_such_name")


def test_the_helper_refuses_a_name_listed_twice(monkeypatch):
    monkeypatch.setitem(sys.modules, "lazy_probe", types.ModuleType("lazy_probe"))
    with pytest.raises(ValueError, match="'x'"):
        lazy_exports("lazy_probe", {"os": ("x",), "sys": ("x",)})
    with pytest.raises(ValueError, match="listed and unlisted"):
        lazy_exports("lazy_probe", {"os": ("sep",)}, unlisted={"os": ("sep",)})


def test_the_helper_resolves_caches_and_hides(monkeypatch):
    probe = types.ModuleType("lazy_probe")
    monkeypatch.setitem(sys.modules, "lazy_probe", probe)
    probe.__getattr__, probe.__dir__, probe.__all__ = lazy_exports("lazy_probe", {"os.path": ("join",)},
                                                                   unlisted={"os": ("sep",)})
    import os

    assert probe.__all__ == ["join"] and probe.join is os.path.join and probe.sep == os.sep
    assert "join" in vars(probe) and "sep" in vars(probe)  # kept after the first use
    assert "join" in dir(probe) and "sep" not in dir(probe)


def test_import_hurray_schema_loads_neither_numba_nor_the_transport():
    code = ("import json, sys, hurray_schema as hs; hs.__all__; dir(hs); hs.Tensor; hs.read_file; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite') "
            "or m.startswith(('hurray_schema.net', 'hurray_schema.evaluate', 'hurray_schema.audit', "
            "'hurray_schema.conversion')))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
