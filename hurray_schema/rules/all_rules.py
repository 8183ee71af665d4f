"""Imports every spec-area rule module so that their rules are declared.

Imported by :func:`.engine.registry` and :func:`.engine.get_rule` when asked about the whole
registry, not at package import: a file reader loads only the areas it checks.  The registry's
order is :data:`.engine.AREA_ORDER`, whatever order the areas were imported in.
"""

from . import descriptor  # noqa: F401  (first: its rules come first in the registry)
from . import composite, structure, container, values, interop, session  # noqa: F401,I001
