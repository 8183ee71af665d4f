"""One conformance case (the rule it exercises, the container kind, how to build its passing and
violating inputs) and one vector of the corpus (an input and what our readers say about it)."""

from __future__ import annotations

from typing import Callable, Optional

import attrs

from ..io.walk import KIND_EXTENSIONS
from .verdicts import Verdict

__all__ = ["Case", "Vector", "KINDS", "EXTENSIONS"]

KINDS = ("descriptor", "stream", "messages", "file")
"""The smallest containers a rule can need: a lone descriptor, a bare stream, a message
stream (``interchange.md § Message Framing``), a ``.hrry`` file."""

EXTENSIONS = {kind: suffix.lstrip(".") for suffix, kind in KIND_EXTENSIONS.items()}
"""File extension of each kind (without the dot): the ones ``audit`` reads the kind from when
the first bytes name none (:func:`hurray_schema.io.walk.choose_kind`)."""


@attrs.frozen(slots=True)
class Case:
    """``build()`` returns ``(passing, violating)`` bytes for ``rule_id`` in a ``kind`` container.

    ``passing`` is fully valid (no finding at all in either mode); ``violating`` breaks
    ``rule_id`` and, for every reader, nothing before it."""

    rule_id: str
    kind: str
    build: Callable[[], tuple[bytes, bytes]] = attrs.field(eq=False, repr=False)
    note: Optional[str] = None
    """What the violating input does, in a few words (kept in the manifest)."""


@attrs.frozen(slots=True)
class Vector:
    """One input of the corpus and what our readers say about it."""

    file: str
    kind: str
    rule_id: str
    role: str
    """``fail``: violates ``rule_id`` (and nothing before it); ``pass``: fully valid; ``peer``: the
    other direction of a violating session (what its faulty direction answers or is answered by)."""
    data: bytes = attrs.field(repr=False)
    strict: Verdict
    permissive: Verdict
    note: Optional[str] = None
    session: Optional[str] = None
    """A session vector's name: its two direction files are ``<session>.client.msgs`` and
    ``<session>.server.msgs`` (:mod:`.sessions`); None for a one-file vector."""
    direction: Optional[str] = None
    """Which direction of its session this file is: ``client`` (what the client sent) or ``server``."""
    error_code: Optional[int] = None
    """The ERROR code the recording server refused a violating client direction with."""

    @property
    def offset(self) -> Optional[int]:
        return self.strict.offset

    @property
    def container(self) -> str:
        """The container kind the bytes are (a session direction is a message stream)."""
        return "messages" if self.kind == "session" else self.kind
