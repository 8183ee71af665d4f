"""What an audit returns: its findings, how the input was read, and the two renderings the
``hurray-schema audit`` command prints -- the text (:meth:`AuditReport.to_text`) and the JSON
object of schema ``hurray-schema/audit/1`` (:meth:`AuditReport.to_json`, :data:`AUDIT_JSON_FIELDS`).

Both renderings end with one newline: ``to_text()`` and ``to_json_text()`` are byte for byte
what the command writes to standard output (UTF-8), which writes them as they are.
"""

from __future__ import annotations

import json
from typing import Callable, Optional

import attrs

from ..rules.engine import Report
from ..io.walk.kinds import KIND_NAMES
from .groups import Group, group_of

__all__ = ["AuditReport", "AUDIT_JSON_SCHEMA", "AUDIT_JSON_FIELDS", "KIND_NAMES", "EXIT_OK", "EXIT_FINDINGS",
           "EXIT_UNREADABLE", "unreadable_json", "json_text"]

EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2
"""The exit codes of ``hurray-schema audit``: clean, MUST-level findings, unreadable input."""

AUDIT_JSON_SCHEMA = "hurray-schema/audit/1"
AUDIT_JSON_FIELDS = {
    "schema": "Always \"hurray-schema/audit/1\".",
    "input": "The PATH argument (\"-\" for standard input).",
    "kind": "What the input was read as: descriptor, stream, messages, file (or unknown).",
    "kind_source": "How kind was decided: \"option\" (--kind), \"content\" (the first bytes), \"extension\" (the "
                   "first bytes name no kind, the path's extension does: .hrry, .msgs, .stream, .desc) or "
                   "\"default\" (neither: read as a bare stream, kind \"unknown\"); null when the input could not "
                   "be opened.",
    "kind_reason": "One sentence saying why the input was read as it was (null when it could not be opened).",
    "mode": "\"strict\" or \"permissive\".",
    "ok": "true when no finding is a MUST-level error the mode does not tolerate.",
    "exit_code": "0 clean, 1 MUST-level findings, 2 unreadable input.",
    "summary": "Counts: findings, errors (MUST / MUST NOT, not tolerated), warnings (SHOULD), tolerated, tensors.",
    "groups": "Parts of the input in byte order: label, start, end (bytes, end exclusive), depth (composite "
              "nesting), text (element type, shape, layout), tensor (false for a file's header, kv metadata, "
              "index and trailer, and for the messages of a message stream).",
    "findings": "Each finding: rule_id, level, citation, message, offset (byte, or null), tolerated, "
                "error (bool), group (label of the tensor / composite holding the offset; \"input\" when the "
                "finding has no offset, \"outside any tensor\" when its offset is in no tensor's bytes).",
    "error": "Only when exit_code is 2: why the input could not be read.",
}
"""Keys of the ``audit --json`` object and their meaning (stable: keys are only ever added,
never renamed or removed)."""

@attrs.frozen(slots=True)
class AuditReport(Report):
    """The findings of :func:`hurray_schema.audit` and how the input was read.

    ``input`` is the name the renderings show (the path, or ``name=``); ``kind`` what the input
    was read as, ``"unknown"`` when neither its first bytes nor its extension named one (it is
    then read as a bare stream: ``read_as``); ``kind_source`` and ``kind_reason`` how that was
    decided (:class:`hurray_schema.io.walk.KindChoice`, or ``"option"`` when ``kind=`` was given);
    ``mode`` "strict" or "permissive".

    :attr:`groups` (the tensors and sections the findings are listed under) are located on first
    use, from the input again: a path is mapped again, bytes are kept by reference (and must not
    change meanwhile); those of a file object, which may not be read twice, are located at once."""

    input: str = "<bytes>"
    kind: str = "unknown"
    read_as: str = "stream"
    kind_source: Optional[str] = None
    kind_reason: Optional[str] = None
    mode: str = "strict"
    _locate: Optional[Callable[[], tuple]] = attrs.field(default=None, eq=False, repr=False)
    _located: list = attrs.field(factory=list, init=False, eq=False, repr=False)

    @property
    def groups(self) -> tuple[Group, ...]:
        """The parts of the input in byte order (:func:`hurray_schema.audit.groups.groups_of`)."""
        if not self._located:
            self._located.append(self._locate() if self._locate is not None else ())
        return self._located[0]

    @property
    def exit_code(self) -> int:
        """What ``hurray-schema audit`` exits with: :data:`EXIT_OK` or :data:`EXIT_FINDINGS`."""
        return EXIT_OK if self.ok else EXIT_FINDINGS

    def rows(self) -> list[dict]:
        """Each finding as ``audit --json`` lists it, with the label of the group holding it."""
        groups = self.groups
        return [_row(f, group_of(groups, f.offset)) for f in self.findings]

    def summary(self) -> dict:
        """The counts of ``audit --json``: findings, errors, warnings, tolerated, tensors."""
        errors = sum(f.is_error for f in self.findings)
        tolerated = sum(f.tolerated for f in self.findings)
        return {"findings": len(self.findings), "errors": errors, "warnings": len(self.findings) - errors - tolerated,
                "tolerated": tolerated, "tensors": sum(g.tensor for g in self.groups)}

    def to_json(self) -> dict:
        """The object ``audit --json`` prints (schema :data:`AUDIT_JSON_SCHEMA`); its ``ok`` and
        ``findings`` keys extend those of :meth:`Report.to_json`."""
        return {**self._heading(), "ok": self.ok, "exit_code": self.exit_code, "summary": self.summary(),
                "groups": [g.to_json() for g in self.groups], "findings": self.rows()}

    def to_json_text(self) -> str:
        """:meth:`to_json` as ``hurray-schema audit --json`` prints it, final newline included."""
        return json_text(self.to_json())

    def to_text(self) -> str:
        """What ``hurray-schema audit`` prints, final newline included: a heading, the findings
        under the tensor / composite (or section) holding each, then the verdict and counts."""
        lines = [f"audit of {self.input} ({KIND_NAMES.get(self.kind, self.kind)}, {self.mode})"]
        if self.kind_source in ("extension", "default"):  # the first bytes did not say: say what was assumed
            lines.append(f"kind assumed: {self.kind_reason}")
        by_group: dict[str, list[dict]] = {}
        for row in self.rows():
            by_group.setdefault(row["group"], []).append(row)
        described = {g.label: g for g in self.groups}
        order = [g.label for g in self.groups if g.label in by_group]
        order += [label for label in by_group if label not in order]
        for label in order:
            lines += _group_lines(label, described.get(label), by_group[label], self.mode)
        lines += ["", _verdict_line(self.summary(), self.exit_code)]
        return "\n".join(lines) + "\n"

    def _heading(self) -> dict:
        return {"schema": AUDIT_JSON_SCHEMA, "input": self.input, "kind": self.kind, "kind_source": self.kind_source,
                "kind_reason": self.kind_reason, "mode": self.mode}


def _row(finding, group: Optional[Group]) -> dict:
    where = group.label if group is not None else ("input" if finding.offset is None else "outside any tensor")
    return {"rule_id": finding.rule_id, "level": finding.level.value, "citation": finding.citation,
            "message": finding.message, "offset": finding.offset, "tolerated": finding.tolerated,
            "error": finding.is_error, "group": where}


def _group_lines(label: str, group: Optional[Group], rows: list[dict], mode: str) -> list[str]:
    """A blank line, the group's heading (its span and text), then each of its findings and citation."""
    if group is not None:
        where = f" @{group.start}-{group.end - 1}  {group.text}".rstrip()
    else:
        where = " (no byte offset)" if label == "input" else ""
    depth = group.depth if group is not None else 0
    pad = "  " * (depth + 1)
    lines = ["", f"{'  ' * depth}{label}{where}"]
    for row in rows:
        at = f" at byte {row['offset']}" if row["offset"] is not None else ""
        kept = f" [tolerated: {mode}]" if row["tolerated"] else ""
        lines.append(f"{pad}{row['level']:<9} {row['rule_id']}{at}: {row['message']}{kept}")
        lines.append(f"{pad}{'':<9} ↳ {row['citation']}")
    return lines


def _verdict_line(s: dict, exit_code: int) -> str:
    verdict = "FAIL" if exit_code else "OK"
    return (f"{verdict}: {s['findings']} finding{'s' if s['findings'] != 1 else ''} "
            f"({s['errors']} MUST-level, {s['warnings']} warning{'s' if s['warnings'] != 1 else ''}, "
            f"{s['tolerated']} tolerated) in {s['tensors']} tensor{'s' if s['tensors'] != 1 else ''}")


def unreadable_json(input: str, mode: str, error: str, report: Optional[AuditReport] = None) -> dict:
    """The ``audit --json`` object of an input that could not be read (exit code 2): ``error``
    says why; no groups or findings, and no kind unless ``report`` (the audit that was under
    way when the input failed) says how the input was being read."""
    heading = report._heading() if report is not None else AuditReport(input=input, mode=mode)._heading()
    return {**heading, "input": input, "mode": mode, "ok": False, "exit_code": EXIT_UNREADABLE, "error": error,
            "summary": {"findings": 0, "errors": 0, "warnings": 0, "tolerated": 0, "tensors": 0},
            "groups": [], "findings": []}


def json_text(obj: dict) -> str:
    """``obj`` as ``audit --json`` prints it: indented by two, non-ASCII kept, one final newline."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
