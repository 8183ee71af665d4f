"""The suite's own shape: test modules share code through tests/support only, and the
tests run in a random order.

A test module that imports another runs that module's top level (its fixtures, its
hypothesis settings, its module-level state) wherever it is imported, and makes the order of
collection matter; what two modules share lives in ``tests/support/``.  pytest-randomly (the
``test`` extra) shuffles the tests at every run, and nothing in the README's test command or
in .ci/run switches it off.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MODULES = sorted(TESTS.glob("test_*.py"))


def _is_test_module(name: str) -> bool:
    """``test_x``, ``tests.test_x`` or ``tests`` (from which a test module could be imported)."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return not parts or parts[0].startswith("test_")


def imported_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports, anywhere in it (also inside functions and ``try``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import test_x / from .test_x import y
                names = [node.module] if node.module else [alias.name for alias in node.names]
                found += [f"{'.' * node.level}{n}" for n in names if n.split(".")[0].startswith("test_")]
            elif node.module == "tests":
                found += [f"tests.{alias.name}" for alias in node.names if alias.name.startswith("test_")]
            elif _is_test_module(node.module):
                found.append(node.module)
    return found


def test_there_are_test_modules_to_check():
    assert len(MODULES) > 50 and Path(__file__).resolve() in MODULES


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_test_module_imports_another(path):
    assert imported_test_modules(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source", [
    "import test_cli",
    "import test_rules_composite as TC",
    "from test_region import stepped_boxes",
    "from tests.test_cli import run",
    "from tests import test_rules_descriptor",
    "from . import test_cli",
    "from .test_cli import out",
    "import tests.test_ksy",
    "def f():\n    from test_cli_hexview import session_stream\n",
    "try:\n    import test_a\nexcept ImportError:\n    from tests import test_a\n",
])
def test_the_check_finds_every_form_of_import(source):
    assert imported_test_modules(source)


@pytest.mark.parametrize("source", [
    "from support.strategies import descriptors",
    "from support import kaitai",
    "import hurray_schema.testing",
    "from hypothesis import strategies as st",
    "import pytest",
])
def test_the_check_lets_support_and_libraries_pass(source):
    assert imported_test_modules(source) == []


def test_the_tests_run_in_a_random_order():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert any(re.match(r"pytest-randomly\b", need) for need in project["project"]["optional-dependencies"]["test"])
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"]
    commands = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if "pytest" in line and not line.lstrip().startswith("#")]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    test_command = readme.split("Run the tests:", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    assert "python -m pytest" in test_command
    assert len(commands) >= 3
    for command in [addopts, test_command, *commands]:
        assert "no:randomly" not in command and "randomly-dont-reorganize" not in command, command
