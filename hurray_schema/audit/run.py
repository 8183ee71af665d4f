""":func:`audit`: read an input, tell its kind, run every applicable rule on it
(:mod:`.findings`) and return the :class:`~.report.AuditReport` that renders it."""

from __future__ import annotations

import mmap
import os
from typing import Optional

from ..io.walk import KindChoice, choose_kind, memory_input
from ..rules.engine import as_mode
from .findings import find, input_name
from .groups import groups_of
from .report import AuditReport

__all__ = ["audit"]

_BYTES_LIKE = (bytes, bytearray, memoryview, mmap.mmap)


def audit(source, *, mode="strict", kind: str = "auto", progress=None, name: Optional[str] = None) -> AuditReport:
    """Every finding of every applicable rule on ``source`` (bytes or a path), each with its byte offset.

    ``kind`` is one of :data:`~.findings.KINDS` or ``"auto"``: sniffed from the first bytes, and
    when they name no kind (a damaged magic, an invalid or cut first message header) decided by
    the extension (``.hrry``, ``.msgs``, ``.stream``, ``.desc``) of the path (or of ``name``),
    else read as a bare stream (:func:`hurray_schema.io.walk.choose_kind`).  ``progress``, when
    given, is called with the number of bytes audited so far.  A path is memory-mapped: only
    the bytes a rule looks at are read.

    ``name`` names bytes that came from somewhere (``"-"`` for standard input, a URL): the
    report shows it and its extension is read as a path's would be.  ``mode`` decides which
    findings are tolerated (``Finding.tolerated``), so ``report.ok`` is the verdict a reader in
    that mode would reach; ``report.to_text()`` and ``report.to_json()`` are what
    ``hurray-schema audit`` prints.
    """
    mode = as_mode(mode)
    if not isinstance(source, (*_BYTES_LIKE, str, os.PathLike)) and not hasattr(source, "read"):
        raise TypeError(f"audit() takes bytes or a path, not {type(source).__name__}")
    path = input_name(source)
    with memory_input(source) as data:
        choice = _kind_choice(data, kind, path if name is None else name)
        shown = "unknown" if choice.source == "default" else choice.kind
        findings = find(data, mode, choice.kind, path, progress)
        locate = _locator(source, data, shown)
    return AuditReport(findings, input=_label(source, name), kind=shown, read_as=choice.kind,
                       kind_source=choice.source, kind_reason=choice.reason, mode=mode.value, locate=locate)


def _kind_choice(data, kind: str, name) -> KindChoice:
    """How the input is read: as ``kind`` says, else as its first bytes say, else as the extension
    of ``name`` says, else as a bare stream."""
    if kind != "auto":
        return KindChoice(kind, "option", f"--kind {kind} was given")
    return choose_kind(data, name)


def _label(source, name: Optional[str]) -> str:
    """The name the report shows: ``name``, else the path, else ``"<bytes>"``."""
    if name is not None:
        return name
    path = input_name(source)
    return os.fsdecode(path) if path is not None else "<bytes>"


def _locator(source, data, kind: str):
    """How the report finds its groups when first asked: a path mapped again, bytes by
    reference; a file object (which may not be read twice) now."""
    if isinstance(source, _BYTES_LIKE):
        return lambda: groups_of(source, kind)
    if isinstance(source, (str, os.PathLike)):
        return lambda: _groups_at(source, kind)
    located = groups_of(data, kind)
    return lambda: located


def _groups_at(path, kind: str):
    with memory_input(path) as data:
        return groups_of(data, kind)
