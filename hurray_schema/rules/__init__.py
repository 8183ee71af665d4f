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


def _where(function: Callable) -> str:
    """``path:line`` of a function's definition, the path relative to the package's parent."""
    import inspect
    from pathlib import Path

    target = inspect.unwrap(function)
    code = getattr(target, "__code__", None)
    if code is None:
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}"
    root = Path(__file__).resolve().parents[2]
    path = Path(code.co_filename).resolve()
    return f"{path.relative_to(root) if path.is_relative_to(root) else path}:{code.co_firstlineno}"


def located(rule_id: str) -> dict[str, object]:
    """Where the rule ``rule_id`` lives, in one step: for a descriptor rule, the function declared
    with it (its report behind its one condition, or its whole check) and whether it has a
    condition; for every other rule, the functions that enforce it (:attr:`Rule.enforced_by`)."""
    from .descriptor import dispatch

    rule = get_rule(rule_id)
    if rule_id in dispatch._CHECKS:
        return {"rule": rule, "declared": [_where(dispatch._CHECKS[rule_id])],
                "condition": rule_id in dispatch._FORMS, "enforced_by": []}
    return {"rule": rule, "declared": [], "condition": False,
            "enforced_by": [f"{path} ({_where(enforcer(path))})" for path in rule.enforced_by]}


__all__ = ["Finding", "Level", "Mode", "Report", "Rule", "get_rule", "registry", "enforcer", "located"]
