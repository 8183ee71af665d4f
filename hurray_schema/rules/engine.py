"""The rule engine: named, spec-cited rules, their findings, and reading modes.

A :class:`Rule` is one normative statement of the spec (a MUST, MUST NOT or SHOULD)
with a stable dotted id, the section it comes from and a one-line summary in our own
words.  Rules are declared once, at import time of the module of their spec area, and
listed by :func:`registry`.

Some rules are *structural*: the decoder itself fires them because it cannot go on
(bad magic, truncation).  The others have a ``check`` function run on a decoded object
(``hurray_schema.rules.descriptor`` and friends) that yields :class:`Finding` s, and may
say with ``when`` which inputs they can fire on at all (the dispatch of their scope reads
it; see :class:`hurray_schema.rules.descriptor.When`).

This module is the bottom of the rules layer: it imports no spec-area module.  Importing
the package :mod:`hurray_schema.rules` declares every rule (``rules/all_rules.py``), so
:func:`registry` is complete for anyone who imported anything under ``rules``.
"""

from __future__ import annotations

import enum
import sys
from typing import Callable, Iterable, Iterator, Optional

import attrs

from ..errors import SpecViolation

__all__ = [
    "Level", "Mode", "Rule", "Finding", "Report", "declare", "registry", "get_rule", "as_mode",
]


class Level(str, enum.Enum):
    """RFC 2119 level of a rule."""

    MUST = "MUST"
    MUST_NOT = "MUST NOT"
    SHOULD = "SHOULD"
    SHOULD_NOT = "SHOULD NOT"

    @property
    def is_requirement(self) -> bool:
        """MUST / MUST NOT: a violation is an error; SHOULD-level ones are warnings."""
        return self in (Level.MUST, Level.MUST_NOT)


class Mode(str, enum.Enum):
    """How a reader treats what the spec lets a permissive reader keep."""

    STRICT = "strict"
    PERMISSIVE = "permissive"


_MODES = {"strict": Mode.STRICT, "permissive": Mode.PERMISSIVE}


def as_mode(mode) -> Mode:
    if mode.__class__ is Mode:
        return mode
    found = _MODES.get(mode) if isinstance(mode, str) else None
    if found is not None:
        return found
    try:
        return Mode(mode)
    except ValueError:
        raise ValueError(f"mode must be 'strict' or 'permissive', not {mode!r}") from None


@attrs.frozen(slots=True)
class Finding:
    """One breach of one rule, located in the input."""

    rule_id: str
    level: Level
    citation: str
    message: str
    offset: Optional[int] = None
    tolerated: bool = False
    """True when the reader's mode lets it keep the input despite this finding."""

    @property
    def is_error(self) -> bool:
        return self.level.is_requirement and not self.tolerated

    def to_violation(self) -> SpecViolation:
        return SpecViolation(self.rule_id, self.citation, self.offset, self.message)

    def to_json(self) -> dict:
        return {
            "rule_id": self.rule_id,
            "level": self.level.value,
            "citation": self.citation,
            "message": self.message,
            "offset": self.offset,
            "tolerated": self.tolerated,
        }


@attrs.frozen(slots=True)
class Rule:
    """A normative statement of the spec, as a named, checkable rule."""

    id: str
    level: Level
    citation: str
    summary: str
    scope: str = "descriptor"
    """Where the rule applies: descriptor, composite.head, composite.member,
    composite.close, stream, file."""
    permissive: bool = False
    """The spec lets a permissive reader keep input that breaks this rule."""
    check: Optional[Callable[..., Iterable[Finding]]] = attrs.field(default=None, eq=False, repr=False)
    when: Optional[object] = attrs.field(default=None, eq=False, repr=False)
    """On which inputs ``check`` can fire at all, in the terms of the scope's dispatch
    (``None``: always)."""
    enforced_by: tuple[str, ...] = attrs.field(default=(), eq=False, repr=False)
    """Where a rule without ``check`` is enforced: the functions that raise it (or, for a rule
    that binds a server's own choice, make that choice), each as ``"module:qualname"``
    (``"hurray_schema.net.checker:SessionChecker.request"``).  Strings, not references, so the
    rules layer never imports the layers that fire its rules; :func:`hurray_schema.rules.enforcer`
    resolves one."""

    def finding(self, message: str, offset: Optional[int] = None, mode: Mode = Mode.STRICT) -> Finding:
        tolerated = self.permissive and mode is Mode.PERMISSIVE
        return Finding(self.id, self.level, self.citation, message, offset, tolerated)

    def violation(self, message: str, offset: Optional[int] = None) -> SpecViolation:
        return SpecViolation(self.id, self.citation, offset, message)


_REGISTRY: dict[str, Rule] = {}
_AREA: dict[str, int] = {}

AREA_ORDER = ("descriptor", "composite", "structure", "container", "values", "interop", "session")
"""The spec areas (modules under ``hurray_schema.rules``) in the registry's order: one descriptor,
composite, descriptor structure, then containers, the values of quantization parameters, the
interop lints and the transport.  Within an area, rules keep
their declaration order; the areas are ordered so whatever order they were imported in."""


def declare(
    id: str, level: Level, citation: str, summary: str, *, scope: str = "descriptor",
    permissive: bool = False, check: Optional[Callable[..., Iterable[Finding]]] = None,
    when: Optional[object] = None, enforced_by: str | tuple[str, ...] = (),
) -> Rule:
    """Create and register a rule; ids are unique.  ``when`` says on which inputs ``check``
    can fire (read by the dispatch of the rule's scope, never parsed from the id);
    ``enforced_by`` names the function (or functions) that enforce a rule without ``check``
    (:attr:`Rule.enforced_by`)."""
    if id in _REGISTRY:
        raise ValueError(f"rule {id!r} declared twice")
    if isinstance(enforced_by, str):
        enforced_by = (enforced_by,)
    rule = Rule(id, level, citation, summary, scope, permissive, check, when, tuple(enforced_by))
    _REGISTRY[id] = rule
    _AREA[id] = _area_of(sys._getframe(1).f_globals.get("__name__", ""))
    return rule


def _area_of(module: str) -> int:
    """The place of the spec area that ``module`` (a module under ``hurray_schema.rules``) belongs
    to in the registry's order (:data:`AREA_ORDER`); unknown areas last."""
    area = module.split(".")[2] if module.count(".") >= 2 else module
    return AREA_ORDER.index(area) if area in AREA_ORDER else len(AREA_ORDER)


def _nothing_to_declare() -> None:
    pass


declare_every_rule: Callable[[], None] = _nothing_to_declare
"""Declares every spec area's rules (:mod:`.all_rules`).  The package (``hurray_schema.rules``, which
runs before this module can be used) sets it; called on the first question about the whole
registry, not at import, so that a reader loads only the areas whose rules it checks."""


def registry() -> tuple[Rule, ...]:
    """Every rule of every spec area, in declaration order."""
    declare_every_rule()
    return tuple(sorted(_REGISTRY.values(), key=lambda rule: _AREA[rule.id]))  # stable: declaration order kept


def get_rule(rule_id: str) -> Rule:
    """The rule ``rule_id`` (``KeyError`` when no spec area declares it)."""
    rule = _REGISTRY.get(rule_id)
    if rule is None:
        declare_every_rule()
        rule = _REGISTRY[rule_id]
    return rule


@attrs.frozen(slots=True)
class Report:
    """What an audit found."""

    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        """No MUST-level finding that the mode does not tolerate."""
        return not any(f.is_error for f in self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_error)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.is_error)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def to_json(self) -> dict:
        return {"ok": self.ok, "findings": [f.to_json() for f in self.findings]}
