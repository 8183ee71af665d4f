"""One conformance case: the rule it exercises, the container kind, and how to build its
passing and violating inputs."""

from __future__ import annotations

from typing import Callable, Optional

import attrs

from ..io.walk import KIND_EXTENSIONS

__all__ = ["Case", "KINDS", "EXTENSIONS"]

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
