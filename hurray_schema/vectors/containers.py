"""Container vectors: bare streams, message streams and files."""

from __future__ import annotations

__all__ = ["container_cases"]


def container_cases() -> list:
    return []
