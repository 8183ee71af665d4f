"""What our readers say about a vector: accept or reject, and the first finding.

For each container kind, the reader an application would call: ``decode_descriptor``
(a lone descriptor), ``read_stream`` iterated to the end (both framings), ``read_file``
(the container and every descriptor).  A rejection is the
:class:`~hurray_schema.errors.SpecViolation` raised: its rule id and byte offset.  An
acceptance may still carry findings -- what the mode tolerated and SHOULD-level notes
(``StreamReader.findings``, ``HurrayFile.findings``, the descriptor rules' findings):
the first of them is the first finding.  After them come the interoperability lints
``audit`` runs on what a reader accepted (:mod:`hurray_schema.rules.interop`: a bool
buffer that looks written one byte per element, padding after a composite head in a
file), which no reader reports: readers accept such inputs.  ``audit`` gives the same
first finding (the corpus test checks it); it sits above this layer, so it is not
called here.

A reader checks the values of a tensor's quantization scales when it decodes them, not when
it opens the input (:mod:`hurray_schema.rules.values`, which the spec allows): an input the
reader accepted is rejected with the first scale that breaks its rule, located as ``audit``
locates it, since an application that reads its values gets that
:class:`~hurray_schema.errors.SpecViolation`.
"""

from __future__ import annotations

import tempfile
from typing import Optional

import attrs

from ..codec import decode_descriptor, parse_descriptor
from ..errors import SpecViolation
from ..io import read_file, read_stream
from ..io.walk.common import DESCRIPTOR, Faults
from ..io.walk import Window, collect_descriptor, walk_bare
from ..rules import interop, values
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


def _bare_tensors(data: bytes, mode: Mode) -> tuple[list, list]:
    """The scale faults (the values' rules) and the bool lint of every tensor of a bare stream (its
    buffers follow its descriptor)."""
    describe = lambda buf, base, depth: collect_descriptor(buf, base, depth, mode)  # noqa: E731
    faults, lints = [], []
    for part in walk_bare(Window(data), describe, faults=Faults.COLLECT, mode=mode):
        if part.kind == DESCRIPTOR and part.value is not None:
            faults += values.stream_tensor_findings(part.value, data, part.end)
            lints += interop.stream_tensor_findings(part.value, data, part.end)
    return faults, lints


def _decoded(findings, faults) -> Verdict:
    """The verdict on an input a reader accepted with ``findings``, once its tensors' values are
    decoded: rejected at the first scale fault, if any."""
    if faults:
        return Verdict(False, faults[0].rule_id, faults[0].offset)
    return _accepted(findings)


def _stream(data: bytes, mode: Mode, framing: str) -> Verdict:
    reader = read_stream(data, framing=framing, mode=mode)
    for _item in reader:
        pass
    faults, lints = _bare_tensors(data, mode) if framing == "bare" else ([], [])
    return _decoded(list(reader.findings) + lints, faults)


def _file(data: bytes, mode: Mode) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="hurray-vectors-") as scratch:
        with read_file(scratch_file(data, scratch), mode=mode) as opened:
            findings = list(opened.findings)
            faults = []
            for entry in sorted(opened.entries(), key=lambda e: e.descriptor_offset):
                desc = opened.descriptor(entry.name)
                if desc.quantization is not None and desc.buffers:
                    tensor = opened.tensor_of(desc, entry.name)
                    faults += values.tensor_findings(desc, tensor.buffers, tensor.buffer_offsets())
            findings += interop.file_findings(opened.entries(), opened.descriptor,
                                              lambda name: opened.tensor_of(opened.descriptor(name), name).buffers)
    return _decoded(findings, faults)


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
