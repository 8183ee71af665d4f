"""Named, spec-cited rules (``engine``) and the rules of each spec area.

Each spec area's module declares its rules when it is imported; :func:`registry` and
:func:`get_rule` declare every area's first (:mod:`.all_rules`), so the registry they answer
from is complete whichever modules were imported before.
"""

import importlib
from typing import Callable

from . import engine
from .engine import Finding, Level, Mode, Report, Rule, get_rule, registry


def _declare_every_rule() -> None:
    from . import all_rules  # noqa: F401  (declares the rules of every spec area)


engine.declare_every_rule = _declare_every_rule


def enforcer(path: str) -> Callable:
    """The function a :attr:`Rule.enforced_by` entry names (``"package.module:Class.method"``),
    imported when asked for (the rules layer imports nothing above it)."""
    module, _, qualname = path.partition(":")
    target = importlib.import_module(module)
    for name in qualname.split("."):
        target = getattr(target, name)
    return target


__all__ = ["Finding", "Level", "Mode", "Report", "Rule", "get_rule", "registry", "enforcer"]
