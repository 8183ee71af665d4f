"""Exceptions raised on bad input.

Every error this library raises because of the *input* (bytes, files, streams,
arguments describing tensors) derives from :class:`HurraySchemaError`.  A breach of a
normative statement of the Hurray specification is a :class:`SpecViolation`, which
names the rule, the spec section it comes from and the byte offset of the fault.
"""

from __future__ import annotations

__all__ = ["HurraySchemaError", "SpecViolation", "LimitExceeded", "UnsupportedEvaluation"]


class HurraySchemaError(Exception):
    """Base class of every error raised on bad input."""


class SpecViolation(HurraySchemaError):
    """The input breaks a normative statement (MUST / MUST NOT) of the spec.

    Attributes:
        rule_id: stable dotted id of the rule (see ``hurray_schema.rules.registry()``).
        citation: spec file and section, e.g. ``"metadata.md § Fixed Header"``.
        offset: byte offset of the faulty field from the start of the input that was
            being decoded (a descriptor, a stream or a file), or ``None`` when the fault
            has no single location (for example a partition gap).
        message: human-readable explanation.
    """

    def __init__(self, rule_id: str, citation: str, offset: int | None, message: str):
        self.rule_id = rule_id
        self.citation = citation
        self.offset = offset
        self.message = message
        where = "" if offset is None else f" at byte {offset}"
        super().__init__(f"[{rule_id}] {message}{where} ({citation})")

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working
        return (type(self), (self.rule_id, self.citation, self.offset, self.message))


class LimitExceeded(HurraySchemaError):
    """The input exceeds a limit this reader enforces (a configurable safety bound)."""

    def __init__(self, limit: str, value: int, maximum: int, offset: int | None = None):
        self.limit = limit
        self.value = value
        self.maximum = maximum
        self.offset = offset
        where = "" if offset is None else f" at byte {offset}"
        super().__init__(f"{limit} = {value} exceeds the configured maximum {maximum}{where}")

    def __reduce__(self):
        return (type(self), (self.limit, self.value, self.maximum, self.offset))


class UnsupportedEvaluation(HurraySchemaError):
    """The tensor is valid but this evaluator cannot compute its values: float128, a private element
    type whose codes are not 8, 16, 32 or 64 bits wide, a tag no table row describes, or a shape
    NumPy cannot hold (see :mod:`hurray_schema.evaluate.tensor`)."""
