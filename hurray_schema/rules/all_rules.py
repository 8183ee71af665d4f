"""Imports every spec-area rule module so that their rules are declared."""

from . import composite, container, descriptor, interop, structure  # noqa: F401
