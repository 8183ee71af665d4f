"""Shared test fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CONFORMANCE = Path(__file__).resolve().parents[1].parent / "shared" / "conformance"


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    """``../shared/conformance`` beside the checkout (the reference project's golden vectors)."""
    if not (CONFORMANCE / "manifest.json").is_file():
        pytest.skip(f"golden vectors not found at {CONFORMANCE} (the shared/ folder is absent)")
    return CONFORMANCE


@pytest.fixture(scope="session")
def manifest(conformance_dir) -> dict:
    return json.loads((conformance_dir / "manifest.json").read_text())
