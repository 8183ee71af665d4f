"""What a located walk yields: :class:`Part` s, and the :class:`Faults` policy that says
what happens at a fault (see :mod:`hurray_schema.io.walk`)."""

from __future__ import annotations

import enum
import functools
from typing import Any, NamedTuple, Optional

from ..rules.engine import Finding, Mode

__all__ = ["Faults", "Part", "fault", "as_view", "part_from_fields"]


def as_view(data) -> memoryview:
    """``data`` as a flat byte view (no copy)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Faults(enum.Enum):
    """What a walk does at a fault: ``RAISE`` the violation (readers), ``COLLECT`` it as a
    ``fault`` part and go on while parts can be located (audit), ``ANNOTATE`` as ``COLLECT``
    with a ``note`` for the annotated view."""

    RAISE = "raise"
    COLLECT = "collect"
    ANNOTATE = "annotate"


# kinds of part
TABLE = "table"
ENTRY = "entry"
ENTRY_START = "entry start"
NAME = "name"
VALUE = "value"
DESCRIPTOR = "descriptor"
BUFFER = "buffer"
MESSAGE = "message"
MESSAGE_HEADER_PART = "message header"
TRANSPORT = "transport"
DATA_HEADER = "data header"
DATA = "data"
PAYLOAD = "payload"
TENSOR_END = "tensor end"
FAULT = "fault"


class Part(NamedTuple):
    """One located part of a container.

    An immutable named tuple rather than a frozen attrs class: the walks build a few per
    tensor on every read, and a tuple costs a quarter as much to build."""

    kind: str
    start: int
    end: int
    decl: Any = None
    """The declaration the bytes follow (a ``structs`` table), when there is one."""
    value: Any = None
    """The decoded value: a ``TensorDescriptor``, a dict of fields, a buffer view, ..."""
    fault: Optional[Finding] = None
    """The rule the bytes break here (``fault`` parts), as a finding."""
    note: str = ""
    """What the annotated view says about a fault, or the label of the part."""
    findings: tuple = ()
    """Tolerated and SHOULD-level findings of a descriptor part (and every one under COLLECT)."""
    index: int = 0
    """Which one: buffer number, message number, tensor number."""
    depth: int = 0
    """Composite nesting depth of a descriptor (``layouts/composite.md § Binding``)."""


part_from_fields = functools.partial(tuple.__new__, Part)
"""``part_from_fields((kind, start, end, decl, value, fault, note, findings, index, depth))``:
the :class:`Part` of these ten fields, in declaration order, built without the keyword
handling of ``Part(...)`` (a third of its cost: the readers' walks build one per buffer,
message and descriptor)."""


def fault(faults: Faults, rule, message: str, offset: int, mode: Mode, note: str = "", at: Optional[int] = None):
    """Raise (``RAISE``) or return the fault part of ``rule`` at ``offset`` (the part sits
    at ``at``, default ``offset``)."""
    if faults is Faults.RAISE:
        raise rule.violation(message, offset)
    where = offset if at is None else at
    return Part(FAULT, where, where, fault=rule.finding(message, offset, mode), note=note)
