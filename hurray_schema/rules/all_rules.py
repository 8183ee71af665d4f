"""Imports every spec-area rule module so that their rules are declared.

Imported by the package ``__init__`` (never by :mod:`.engine`).  The order is the
registry's order: one descriptor, composite, descriptor structure, then containers.
"""

from . import descriptor  # noqa: F401  (first: its rules come first in the registry)
from . import composite, structure, container, interop, session  # noqa: F401,I001
