"""Shared test fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

CONFORMANCE = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"


def pytest_addoption(parser):
    parser.addoption("--thorough", action="store_true",
                     help="run the slow property runs and mutation sweeps at full size (tests/sizes.py)")


def pytest_configure(config):
    if config.getoption("--thorough"):
        os.environ["HURRAY_THOROUGH"] = "1"  # read by tests/sizes.py when the test modules are imported


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    """``../shared/conformance`` beside the checkout (the reference project's golden vectors)."""
    if not (CONFORMANCE / "manifest.json").is_file():
        pytest.skip(f"golden vectors not found at {CONFORMANCE} (the shared/ folder is absent)")
    return CONFORMANCE


@pytest.fixture(scope="session")
def manifest(conformance_dir) -> dict:
    return json.loads((conformance_dir / "manifest.json").read_text())
