"""Composite binding shared by the stream and file readers.

A head with ``member_count = N`` binds the next ``N`` self-delimiting tensors, pre-order
(``layouts/composite.md § Binding``).  :class:`Binder` receives tensors in container
order and hands back the top-level items as soon as they are complete; it keeps only the
composites still being bound.  Per-member and close-time checks are delegated to
``hurray_schema.rules.composite.CompositeValidator`` when that module provides it.
"""

from __future__ import annotations

from typing import Optional

import attrs

from ..errors import SpecViolation
from ..limits import DEFAULT_LIMITS, Limits
from ..model import TensorDescriptor
from ..rules import container as C
from ..rules.engine import Finding, Mode
from .tensor import Composite, Tensor

__all__ = ["Binder", "MAX_COMPOSITE_DEPTH", "new_validator", "absorb"]

MAX_COMPOSITE_DEPTH = 8
"""Deepest composite nesting a reader accepts (``layouts/composite.md § Binding``)."""


def new_validator(head: TensorDescriptor, mode: Mode):
    """The rule engine's composite validator for ``head``, or None while it does not exist."""
    try:
        from ..rules.composite import CompositeValidator
    except ImportError:
        return None
    return CompositeValidator(head, mode=mode)


def absorb(call, findings: list, offset: int) -> None:
    """Run one validator call; keep the findings it returns, raise the first untolerated
    one.  A finding or violation without an offset gets ``offset`` (the descriptor it is
    about, from the start of the container)."""
    try:
        result = call()
    except SpecViolation as exc:
        if exc.offset is None:
            raise SpecViolation(exc.rule_id, exc.citation, offset, exc.message) from None
        raise
    if result is None or isinstance(result, (bool, str, bytes)):
        return
    try:
        items = list(result)
    except TypeError:
        return
    for f in items:
        if isinstance(f, Finding):
            if f.offset is None:
                f = attrs.evolve(f, offset=offset)
            if f.is_error:
                raise f.to_violation()
            findings.append(f)


class _Frame:
    __slots__ = ("head", "name", "offset", "members", "validator")

    def __init__(self, head, name, offset, validator):
        self.head = head
        self.name = name
        self.offset = offset
        self.members: list = []
        self.validator = validator


class Binder:
    """Binds composites as tensors arrive; see the module docstring."""

    def __init__(self, mode: Mode, torn_rule, findings: list, validate: bool = True,
                 limits: Limits = DEFAULT_LIMITS):
        self.mode = mode
        self.limits = limits
        self.torn_rule = torn_rule
        self.findings = findings
        self.validate = validate
        self.stack: list[_Frame] = []

    @property
    def depth(self) -> int:
        return len(self.stack)

    def add(self, desc: TensorDescriptor, buffers, name: Optional[str], offset: int) -> list:
        """Feed one tensor (a head has no buffers); returns the items it completed."""
        if self.stack and self.stack[-1].validator is not None:
            absorb(lambda: self.stack[-1].validator.push_member(desc), self.findings, offset)
        if desc.is_composite_head:
            depth = len(self.stack) + 1
            if depth > MAX_COMPOSITE_DEPTH:
                raise C.COMPOSITE_DEPTH.violation(
                    f"composite nesting reaches {depth} levels; at most {MAX_COMPOSITE_DEPTH} are allowed", offset)
            self.limits.check("max_composite_depth", depth, offset)
            self.limits.check("max_composite_members", desc.layout.member_count, offset)
            validator = new_validator(desc, self.mode) if self.validate else None
            self.stack.append(_Frame(desc, name, offset, validator))
            return self._settle([])
        tensor = Tensor(desc, buffers, name=name)
        if not self.stack:
            return [tensor]
        self.stack[-1].members.append(tensor)
        return self._settle([])

    def _settle(self, out: list) -> list:
        while self.stack and len(self.stack[-1].members) >= self.stack[-1].head.layout.member_count:
            frame = self.stack.pop()
            if frame.validator is not None:
                absorb(frame.validator.close, self.findings, frame.offset)
            comp = Composite(frame.head, frame.members, name=frame.name)
            if self.stack:
                self.stack[-1].members.append(comp)
            else:
                out.append(comp)
        return out

    def finish(self, end_offset: int, what: str = "the input") -> list:
        """End of input: nothing open, or a torn composite (strict: violation; permissive:
        the members that arrived, as independent items, and a tolerated finding)."""
        if not self.stack:
            return []
        outer = self.stack[0]
        finding = self.torn_rule.finding(
            f"{what} ends before composite head at byte {outer.offset} (member_count "
            f"{outer.head.layout.member_count}) has all its members: {len(outer.members)} arrived"
            + (f", {len(self.stack) - 1} nested composite(s) also open" if len(self.stack) > 1 else ""),
            end_offset, self.mode)
        if not finding.tolerated:
            raise finding.to_violation()
        self.findings.append(finding)
        loose = [m for frame in self.stack for m in frame.members]
        self.stack.clear()
        return loose
