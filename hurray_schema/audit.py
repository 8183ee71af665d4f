"""Audit: run every applicable rule and list every finding instead of stopping at the first.

:func:`audit` takes bytes (or a path) and sniffs what they are:

* a **descriptor** (starts with ``"HRRY"`` and is exactly ``descriptor_length`` long):
  the structural decode, then every semantic rule of
  :mod:`hurray_schema.rules.descriptor` (and the composite-head rules for a head);
* a **bare stream** (``"HRRY"`` followed by more bytes: ``descriptor ‖ buffers ‖ …``):
  every descriptor as above, offsets from the start of the stream, then the composites
  bound pre-order and validated per member and at close
  (:func:`hurray_schema.rules.composite.validate_preorder`, collecting);
* a **file** (``"HRRYFILE"``): delegated to :func:`hurray_schema.io.read_file` when the
  io package provides it; the file reader stops at its first untolerated violation, which
  becomes the last finding of the report.

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


def audit(source, *, mode="strict") -> Report:
    """Every finding of every applicable rule on ``source`` (bytes or a path), each with its byte offset."""
    mode = as_mode(mode)
    data, path = _read_source(source)
    if data[: len(FILE_MAGIC)] == FILE_MAGIC:
        return _audit_file(path if path is not None else data, mode)
    return _audit_stream(data, mode)


def _audit_stream(data: bytes, mode: Mode) -> Report:
    findings: list[Finding] = []
    descs, bases = [], []
    pos = 0
    while True:
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
    try:
        from .io import read_file
    except ImportError:  # pragma: no cover - the io package is part of the library
        return Report((Finding("audit.unsupported", Level.SHOULD, "file-format.md",
                               "file audits need hurray_schema.io.read_file"),))
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
            findings[:0] = list(getattr(reader, "findings", ()))
            close = getattr(reader, "close", None)
            if close is not None:
                close()
    finally:
        if temporary is not None:
            os.unlink(temporary)
    return Report(tuple(findings))
