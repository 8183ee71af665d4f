"""Audit: run every applicable rule and list every finding instead of stopping at the first.

:func:`audit` takes bytes (or a path) and sniffs what they are:

* a **descriptor** (starts with ``"HRRY"`` and is exactly ``descriptor_length`` long):
  the structural decode, then every semantic rule of
  :mod:`hurray_schema.rules.descriptor` (and the composite-head rules for a head);
* a **bare stream** (``"HRRY"`` followed by more bytes: ``descriptor ‖ buffers ‖ …``):
  every descriptor as above, offsets from the start of the stream, then the composites
  bound pre-order and validated per member and at close
  (:func:`hurray_schema.rules.composite.validate_preorder`, collecting);
* a **message stream** (interchange message framing): every descriptor of its
  TENSOR_DESCRIPTOR messages and the composites they bind, then the framing rules as
  :func:`hurray_schema.io.read_stream` sees them;
* a **file** (``"HRRYFILE"``): the container rules of :func:`hurray_schema.io.read_file`;
  when the reader stops at a fault, every descriptor of the tensor region (located
  through the index, or by walking the region) is audited as in a stream and the
  composites are bound in descriptor order, so one report lists every fault.

Close-time composite findings (a partition gap or overlap, a torn composite) are located
at the composite's head descriptor.

A structural fault (truncation, bad magic, ...) ends the walk: nothing after it can be
located.  ``mode`` decides which findings are tolerated (``Finding.tolerated``), so
``Report.ok`` is the verdict a reader in that mode would reach.
"""

from __future__ import annotations

import os
from typing import Optional

from .errors import HurraySchemaError, LimitExceeded, SpecViolation
from .rules.composite import validate_preorder
from .rules.descriptor import check_descriptor
from .rules.engine import Finding, Level, Mode, Report, as_mode, get_rule
from .rules import interop

__all__ = ["audit", "audit_descriptor"]

DESCRIPTOR_MAGIC = b"HRRY"
FILE_MAGIC = b"HRRYFILE"


def _violation_finding(exc: SpecViolation) -> Finding:
    try:
        level = get_rule(exc.rule_id).level
    except KeyError:
        level = Level.MUST
    return Finding(exc.rule_id, level, exc.citation, exc.message, exc.offset, False)


def _limit_finding(exc: LimitExceeded) -> Finding:
    return Finding(f"limit.{exc.limit}", Level.MUST, "hurray_schema limits (not a spec rule)", str(exc),
                   exc.offset, False)


def audit_descriptor(data, *, mode="strict", base: int = 0):
    """``(descriptor or None, findings, end)`` for the descriptor at the start of ``data``."""
    from .codec import parse_descriptor

    mode = as_mode(mode)
    try:
        desc, findings = parse_descriptor(data, mode=mode, base=base)
    except SpecViolation as exc:
        return None, [_violation_finding(exc)], None
    findings = list(findings) + check_descriptor(desc, mode, base=base)
    return desc, findings, desc.encoded_length


def _read_source(source) -> tuple[Optional[bytes], Optional[str]]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        with open(path, "rb") as fh:
            head = fh.read(len(FILE_MAGIC))
            if head == FILE_MAGIC:
                return head, path
            return head + fh.read(), path
    if hasattr(source, "read"):
        return bytes(source.read()), None
    raise TypeError(f"audit() takes bytes or a path, not {type(source).__name__}")


KINDS = ("descriptor", "stream", "messages", "file")


def audit(source, *, mode="strict", kind: str = "auto", progress=None) -> Report:
    """Every finding of every applicable rule on ``source`` (bytes or a path), each with its byte offset.

    ``kind`` is one of :data:`KINDS` or ``"auto"`` (sniffed from the first bytes);
    ``progress``, when given, is called with the number of bytes audited so far.
    """
    mode = as_mode(mode)
    data, path = _read_source(source)
    if kind == "auto":
        kind = "file" if data[: len(FILE_MAGIC)] == FILE_MAGIC else _sniff(data)
    if kind == "file":
        return _audit_file(path if path is not None else data, mode)
    if path is not None and data == FILE_MAGIC:  # a file read as another kind: it needs all its bytes
        with open(path, "rb") as fh:
            data = fh.read()
    if kind == "messages":
        return _audit_messages(data, mode)
    return _audit_stream(data, mode, progress)


def _sniff(data) -> str:
    from .hexview import detect_kind

    found = detect_kind(data)
    return found if found in KINDS else "stream"


def _audit_stream(data: bytes, mode: Mode, progress=None) -> Report:
    findings: list[Finding] = []
    descs, bases = [], []
    pos = 0
    while True:
        if progress is not None:
            progress(pos)
        desc, found, length = audit_descriptor(memoryview(data)[pos:], mode=mode, base=pos)
        findings.extend(found)
        if desc is None:
            break
        descs.append(desc)
        bases.append(pos)
        pos += length
        if pos == len(data) and len(descs) == 1:
            break  # a lone descriptor: no buffers follow it
        data_bytes = sum(h.byte_size for h in desc.buffers)
        if data_bytes > len(data) - pos:
            findings.append(_stream_truncated(pos, data_bytes, len(data) - pos, mode))
            break
        findings += interop.stream_tensor_findings(desc, data, pos)  # INTEROP HOOK (rules/interop.py)
        pos += data_bytes
        if pos >= len(data):
            break
    if any(d.is_composite_head for d in descs):
        findings.extend(validate_preorder(descs, mode=mode, collect=True, bases=bases, check_heads=False))
    return Report(tuple(findings))


def _stream_truncated(pos: int, need: int, have: int, mode: Mode) -> Finding:
    message = f"the buffers of the tensor need {need} bytes, {have} remain"
    try:
        return get_rule("stream.truncated").finding(message, pos + have, mode)
    except KeyError:  # pragma: no cover - the io rules are always declared
        return Finding("stream.truncated", Level.MUST, "interchange.md", message, pos + have)


def _audit_file(source, mode: Mode) -> Report:
    from .io import read_file

    temporary = None
    if not isinstance(source, str):
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".hrry", delete=False) as fh:
            fh.write(source)
            source = temporary = fh.name
    findings: list[Finding] = []
    reader = None
    try:
        try:
            reader = read_file(source, mode=mode)
        except SpecViolation as exc:
            findings.append(_violation_finding(exc))
        except LimitExceeded as exc:
            findings.append(_limit_finding(exc))
        except HurraySchemaError as exc:
            findings.append(Finding("file.unreadable", Level.MUST, "file-format.md", str(exc)))
        if reader is not None:
            findings[:0] = list(reader.findings)
            findings += interop.file_findings(  # INTEROP HOOK (rules/interop.py)
                reader.entries(), reader.descriptor, lambda name: reader.tensor(name).buffers)
            reader.close()
        if any(f.is_error for f in findings):  # the reader stopped at its first fault: audit every tensor
            findings += _dedup(findings, _file_tensor_findings(source, mode))
    finally:
        if temporary is not None:
            os.unlink(temporary)
    return Report(tuple(findings))


def _section_starts(data, kind: str, label: str) -> list[int]:
    """Start offsets of the sections the annotated view labels ``label…`` (descriptors located
    through the index, or by walking the tensor region when the index cannot be read)."""
    from .hexview import annotate

    try:
        nodes = annotate(data, kind)
    except HurraySchemaError:
        return []
    return sorted({n.start for n in nodes if n.kind == "section" and n.label.startswith(label)})


def _descriptors_findings(data, mode: Mode, starts: list[int]) -> list[Finding]:
    """Each descriptor at ``starts`` audited (offsets from the start of ``data``), then the
    composites bound in that order and validated, collecting every finding."""
    found, descs, bases = [], [], []
    for start in starts:
        desc, more, _ = audit_descriptor(memoryview(data)[start:], mode=mode, base=start)
        found += more
        if desc is not None:
            descs.append(desc)
            bases.append(start)
    if descs:
        found += validate_preorder(descs, mode=mode, collect=True, bases=bases, check_heads=False)
    return found


def _file_tensor_findings(source: str, mode: Mode) -> list[Finding]:
    import mmap

    with open(source, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _descriptors_findings(data, mode, _section_starts(data, "file", "tensor"))


def _audit_messages(data: bytes, mode: Mode) -> Report:
    """A message stream: every descriptor of its TENSOR_DESCRIPTOR messages and the composites
    they bind, then the framing as the stream reader sees it (up to its first fault)."""
    from .io.stream import read_stream

    found = _descriptors_findings(data, mode, _section_starts(data, "messages", "descriptor"))
    framing: list[Finding] = []
    reader = read_stream(bytes(data), framing="messages", mode=mode)
    try:
        for _ in reader:
            pass
    except SpecViolation as exc:
        framing.append(_violation_finding(exc))
    except HurraySchemaError:
        pass
    framing = list(getattr(reader, "findings", [])) + framing
    # descriptor and composite rules are reported above; keep the stream's own framing rules
    framing = [f for f in framing if f.rule_id.startswith("stream.") and "composite" not in f.rule_id]
    return Report(tuple(found + _dedup(found, framing)))


def _dedup(known: list[Finding], extra: list[Finding]) -> list[Finding]:
    """``extra`` without the findings (same rule, same offset) already in ``known``."""
    seen = {(f.rule_id, f.offset) for f in known}
    fresh = []
    for f in extra:
        if (f.rule_id, f.offset) not in seen:
            seen.add((f.rule_id, f.offset))
            fresh.append(f)
    return fresh
