"""Imports every spec-area rule module so that their rules are declared."""

from . import structure  # noqa: F401
