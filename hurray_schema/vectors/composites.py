"""Composite vectors (``layouts/composite.md § Validation``, ``§ Binding``): bare streams of a head and its members."""

from __future__ import annotations

__all__ = ["composite_cases"]


def composite_cases() -> list:
    return []
