"""What our readers say about a vector: accept or reject, and the first finding.

For each container kind, the reader an application would call: ``decode_descriptor``
(a lone descriptor), ``read_stream`` iterated to the end (both framings), ``read_file``
(the container and every descriptor).  A rejection is the
:class:`~hurray_schema.errors.SpecViolation` raised: its rule id and byte offset.  An
acceptance may still carry findings -- what the mode tolerated and SHOULD-level notes
(``StreamReader.findings``, ``HurrayFile.findings``, the descriptor rules' findings):
the first of them is the first finding.  ``audit`` gives the same first finding (the
corpus test checks it); it sits above this layer, so it is not called here.
"""

from __future__ import annotations

import tempfile
from typing import Optional

import attrs

from ..codec import decode_descriptor, parse_descriptor
from ..errors import SpecViolation
from ..io import read_file, read_stream
from ..rules.descriptor import check_descriptor
from ..rules.engine import Mode
from .patch import scratch_file

__all__ = ["Verdict", "read_verdict"]

_FRAMING = {"stream": "bare", "messages": "messages"}


@attrs.frozen(slots=True)
class Verdict:
    """A reader's verdict on one input in one mode."""

    accepted: bool
    rule_id: Optional[str] = None
    """The rule of the violation raised, or of the first finding when accepted (None: no finding)."""
    offset: Optional[int] = None

    def to_json(self) -> dict:
        return {"verdict": "accept" if self.accepted else "reject", "rule_id": self.rule_id, "offset": self.offset}


def _accepted(findings) -> Verdict:
    first = next(iter(findings), None)
    return Verdict(True) if first is None else Verdict(True, first.rule_id, first.offset)


def _descriptor(data: bytes, mode: Mode) -> Verdict:
    desc = decode_descriptor(data, mode=mode)
    _, structural = parse_descriptor(data, mode=mode)
    return _accepted(list(structural) + check_descriptor(desc, mode))


def _stream(data: bytes, mode: Mode, framing: str) -> Verdict:
    reader = read_stream(data, framing=framing, mode=mode)
    for _item in reader:
        pass
    return _accepted(reader.findings)


def _file(data: bytes, mode: Mode) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="hurray-vectors-") as scratch:
        with read_file(scratch_file(data, scratch), mode=mode) as opened:
            findings = list(opened.findings)
    return _accepted(findings)


def read_verdict(kind: str, data: bytes, mode) -> Verdict:
    """Our reader's verdict on ``data``, a ``kind`` container, in ``mode``."""
    mode = Mode(mode)
    try:
        if kind == "descriptor":
            return _descriptor(data, mode)
        if kind == "file":
            return _file(data, mode)
        return _stream(data, mode, _FRAMING[kind])
    except SpecViolation as exc:
        return Verdict(False, exc.rule_id, exc.offset)
