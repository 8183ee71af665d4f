"""The findings of an audit: every applicable rule run on an input of a known kind, every
finding kept instead of stopping at the first.

* a **descriptor**: the structural decode, then every semantic rule of
  :mod:`hurray_schema.rules.descriptor` (and the composite-head rules for a head);
* a **bare stream** (``descriptor ‖ buffers ‖ …``): every descriptor as above, offsets from
  the start of the stream, then the composites bound pre-order and validated per member and
  at close (:func:`hurray_schema.rules.composite.validate_preorder`, collecting);
* a **message stream** (``interchange.md`` message framing): every descriptor of its
  TENSOR_DESCRIPTOR messages and the composites they bind, and every descriptor a TENSOR_PUT
  carries, then the framing rules as :func:`hurray_schema.io.read_stream` sees them (a recorded
  session direction: the checks its receiver ran live, pushed composites bound per stream as the
  server binds them, :func:`hurray_schema.net.checker.check_recorded`);
* a **file** (``file-format.md``): the container rules of :func:`hurray_schema.io.read_file`,
  taken from the findings of the reader's walk of the file (one pass, no reader opened on it);
  when that walk stops at a fault, every descriptor of the tensor region (located through
  the index, or by walking the region) is audited as in a stream and the composites are
  bound in descriptor order, so one report lists every fault.

In a bare stream and a file, the scales of every quantized tensor are checked too
(:mod:`hurray_schema.rules.values`: the rules a reader checks when it decodes the values), each
finding at the first offending scale's byte; a message stream's data frames are not read for it.

Close-time composite findings (a partition gap or overlap, a torn composite) are located at
the composite's head descriptor.  Every kind is read through its located walk
(:mod:`hurray_schema.io.walk`, fault policy ``COLLECT``; the file reader's own pass uses
``RAISE``): a structural fault (truncation, bad magic, ...) ends the walk, since nothing after
it can be located.
"""

from __future__ import annotations

import os
from typing import Iterable

from ..errors import HurraySchemaError, LimitExceeded, SpecViolation
from ..rules.composite import CompositeBinder, validate_preorder  # first: the rule registry lists rules in import order
from ..rules.engine import Finding, Level, Mode, as_mode
from ..io.file.walk import checked_file, walk_file
from ..net.checker import check_recorded, other_direction, recorded_locally, recorded_puts, recorded_side_of
from ..io.stream import read_stream
from ..io.walk import (
    DESCRIPTOR, FAULT, Faults, Part, Window, as_view, collect_descriptor, strict_describer,
    violation_finding, walk_bare, walk_descriptor, walk_messages,
)
from ..rules import interop, values
from ..codec import peek_descriptor_length
from ..limits import DEFAULT_LIMITS
from ..structs.descriptor import FIXED_HEADER_SIZE

__all__ = ["KINDS", "find", "audit_descriptor", "input_name"]


def _limit_finding(exc: LimitExceeded) -> Finding:
    return Finding(f"limit.{exc.limit}", Level.MUST, "hurray_schema limits (not a spec rule)", str(exc),
                   exc.offset, False)


def audit_descriptor(data, *, mode="strict", base: int = 0):
    """``(descriptor or None, findings, end)`` for the descriptor at the start of ``data``."""
    part = collect_descriptor(data, base, 0, as_mode(mode))
    end = part.end - base if part.value is not None else None
    return part.value, list(part.findings), end


KINDS = ("descriptor", "stream", "messages", "file")


def find(data, mode: Mode, kind: str, name=None, progress=None) -> tuple[Finding, ...]:
    """Every finding on ``data`` read as ``kind`` (one of :data:`KINDS`; anything else is read as a
    bare stream), in byte order.  ``name``, the path the bytes came from, finds the other
    direction of a recorded session beside a message stream; ``progress`` is called with the
    bytes audited so far (bare streams and descriptors)."""
    if kind == "file":
        return _audit_file(data, mode)
    if kind == "messages":
        return _audit_messages(data, mode, name)
    return _audit_stream(data, mode, progress, lone=kind == "descriptor")


def input_name(source):
    """The path ``source`` names (a path, or a file object opened from one), else None: what
    :func:`~hurray_schema.io.walk.choose_kind` reads the extension of."""
    if isinstance(source, (str, os.PathLike)):
        return source
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def _collect(mode: Mode):
    return lambda buf, base, depth: collect_descriptor(buf, base, depth, mode)


def _audit_stream(data, mode: Mode, progress=None, lone: bool = False) -> tuple[Finding, ...]:
    """A bare stream, or (``lone``) a descriptor: the input is that descriptor (no buffers
    follow it; an empty or short input is ``descriptor.truncated``), or, when more bytes
    follow it, the first tensor of a bare stream."""
    findings: list[Finding] = []
    first = next(walk_descriptor(data, _collect(mode))) if lone else None
    if first is not None and (first.value is None or first.end >= len(data)):
        parts = iter((first,))
    else:
        parts = walk_bare(Window(data), _collect(mode), faults=Faults.COLLECT, mode=mode, progress=progress)
    descs, bases = _descriptors(parts, findings)
    for desc, base in zip(descs, bases):  # a bare stream's buffers follow their descriptor
        data_offset = base + peek_descriptor_length(data[base:base + FIXED_HEADER_SIZE], base)
        findings += values.stream_tensor_findings(desc, data, data_offset)  # reads the scale buffer if whole
        if data_offset + sum(h.byte_size for h in desc.buffers) <= len(data):
            findings += interop.stream_tensor_findings(desc, data, data_offset)
    if any(d.is_composite_head for d in descs):
        findings.extend(validate_preorder(descs, mode=mode, collect=True, bases=bases, check_heads=False))
    return tuple(findings)


def _descriptors(parts: Iterable[Part], findings: list) -> tuple[list, list]:
    """The decoded descriptors of ``parts`` and their offsets, each located once, in byte
    order; every finding on the way goes to ``findings``."""
    descs, bases, last = [], [], None
    for part in parts:
        if part.kind == FAULT and part.fault is not None:
            findings.append(part.fault)
        if part.kind != DESCRIPTOR or part.start == last:
            continue
        last = part.start
        findings.extend(part.findings)
        if part.value is not None:
            descs.append(part.value)
            bases.append(part.start)
    return descs, bases


def _audit_file(data, mode: Mode) -> tuple[Finding, ...]:
    """The container rules as the file reader checks them, up to its first fault: the findings of
    the reader's own walk (:func:`~hurray_schema.io.file.walk.walk_file`, fault policy ``RAISE``),
    taken from its parts -- no reader is opened on top of it; after a fault, every tensor the file
    locates is audited and the composites bound in descriptor order, so one report lists every fault."""
    findings: list[Finding] = []
    try:
        findings = _checked_file(memoryview(as_view(data)), mode)
    except SpecViolation as exc:
        findings = [violation_finding(exc)]
    except LimitExceeded as exc:
        findings = [_limit_finding(exc)]
    except HurraySchemaError as exc:
        findings = [Finding("file.unreadable", Level.MUST, "file-format.md", str(exc))]
    if any(f.is_error for f in findings):  # the reader stopped at its first fault: audit every tensor
        located: list[Finding] = []
        parts = walk_file(data, _collect(mode), faults=Faults.COLLECT, mode=mode)
        descs, bases = _descriptors((p for p in parts if p.kind == DESCRIPTOR), located)
        if descs:
            located += validate_preorder(descs, mode=mode, collect=True, bases=bases, check_heads=False)
        findings += _dedup(findings, located)
    return tuple(findings)


def _checked_file(view: memoryview, mode: Mode) -> list[Finding]:
    """What the file reader reports on ``view`` (``HurrayFile.findings``), read off the parts of its
    walk (:func:`~hurray_schema.io.file.walk.checked_file`): the KV section's findings, each
    descriptor's in descriptor order, then those of binding the composites
    (``layouts/composite.md § Binding``, as the reader binds them), then the rules on the values of
    each tensor's quantization scales (:mod:`hurray_schema.rules.values`, which a reader checks when it
    decodes the values), then the lints audit alone runs
    (:func:`~hurray_schema.rules.interop.file_findings`).  The first fault the mode does not
    tolerate raises, as it does in the reader."""
    found = checked_file(view, strict_describer(mode=mode), mode=mode)
    tensors = found.tensors
    binder = CompositeBinder(mode=mode, limits=DEFAULT_LIMITS)
    findings = list(found.kv.findings)
    for desc, _, offset, described in tensors.values():
        findings.extend(described)
        binder.add(desc, offset)
    binder.finish()
    scales = []
    for desc, spans, _, _ in tensors.values():
        if desc.quantization is not None and spans:
            scales += values.tensor_findings(desc, [view[at : at + size] for at, size in spans],
                                             [at for at, _ in spans])
    return findings + binder.findings + scales + interop.file_findings(
        found.entries, lambda name: tensors[name][0],
        lambda name: [view[at : at + size] for at, size in tensors[name][1]])


def _stream_framing(data, mode: Mode) -> list[Finding]:
    """The framing as the stream reader sees it, up to its first fault."""
    framing: list[Finding] = []
    reader = read_stream(data, framing="messages", mode=mode)
    try:
        for _ in reader:
            pass
    except SpecViolation as exc:
        framing.append(violation_finding(exc))
    except LimitExceeded as exc:  # the reader stops there (a payload_length past the limit)
        framing.append(_limit_finding(exc))
    except HurraySchemaError:
        pass
    return list(getattr(reader, "findings", [])) + framing


def _session_framing(parts: Iterable[Part], data, side, mode: Mode, name=None) -> list[Finding]:
    """A recorded session direction (it starts with a hello): the checks the receiving side ran
    live (:func:`hurray_schema.net.checker.check_recorded`, over the walk's ``parts``), up to the
    first fault; the
    receiver's own hello comes from the other direction's recording beside it, when there is one
    (``NAME.client.msgs`` / ``NAME.server.msgs``, as ``serve --record`` writes them).  A
    recording made over TCP crosses machines, as the live peers take it; one over a Unix socket
    does not (:func:`~hurray_schema.net.checker.recorded_locally`)."""
    findings: list[Finding] = []
    local = recorded_locally(name)
    describe = strict_describer(mode=mode, findings=findings, cross_machine=not local)
    try:
        check_recorded(parts, data, side, describe, peer=other_direction(name), local=local, mode=mode,
                       findings=findings)
    except SpecViolation as exc:
        findings.append(violation_finding(exc))
    except LimitExceeded as exc:
        findings.append(_limit_finding(exc))
    except HurraySchemaError:
        pass
    return findings


def _audit_messages(data, mode: Mode, name=None) -> tuple[Finding, ...]:
    """A message stream: every descriptor of its TENSOR_DESCRIPTOR messages and the composites
    they bind, every descriptor its TENSOR_PUT messages carry, and the framing as the stream
    reader sees it, or a recorded session direction as its receiver checked it (up to the
    first fault: a pushed composite bound per stream, as the server binds it), in byte order."""
    found: list[Finding] = []

    def walked():  # walked again by each pass: a walk's parts are never all held at once
        return walk_messages(Window(data), _collect(mode), faults=Faults.COLLECT, mode=mode)

    descs, bases = _descriptors((p for p in walked() if p.kind == DESCRIPTOR), found)
    if descs:
        found += validate_preorder(descs, mode=mode, collect=True, bases=bases, check_heads=False)
    found += _put_descriptors(walked(), data, mode)
    side = recorded_side_of(data, name)
    if side is None:  # descriptor and composite rules are reported above: the reader's own framing rules
        framing = [f for f in _stream_framing(data, mode) if _framing_rule(f) and "composite" not in f.rule_id]
    else:  # the checker binds no TENSOR_DESCRIPTOR composite: its descriptor faults are those above, once
        framing = [f for f in _session_framing(walked(), data, side, mode, name)
                   if _framing_rule(f) or not f.rule_id.startswith("limit.")]
    return tuple(_merged(found, _dedup(found, framing)))


def _framing_rule(f: Finding) -> bool:
    """A rule of the message framing or of the session (or the message size limit)."""
    return f.rule_id.startswith(("stream.", "session.", "limit.max_message_bytes"))


def _put_descriptors(parts: Iterable[Part], data, mode: Mode) -> list[Finding]:
    """Every finding of the descriptor each TENSOR_PUT (or SHM_PUT) carries, at its offset in
    the input (``interchange.md § TENSOR_PUT Payload``), as a TENSOR_DESCRIPTOR's descriptor is
    audited; a payload that does not decode is the session checker's finding."""
    found: list[Finding] = []
    for put in recorded_puts(parts, data):
        found.extend(collect_descriptor(put.descriptor, put.descriptor_at, 0, mode).findings)
    return found


def _merged(found: list[Finding], framing: list[Finding]) -> list[Finding]:
    """``found`` in its order, each framing finding placed before the first of ``found``
    located after it: a framing fault the stream reader stops at comes before the faults
    of the descriptors behind it."""
    merged = list(found)
    for f in framing:
        at = next((i for i, g in enumerate(merged) if f.offset is not None and g.offset is not None
                   and g.offset > f.offset), len(merged))
        merged.insert(at, f)
    return merged


def _dedup(known: list[Finding], extra: list[Finding]) -> list[Finding]:
    """``extra`` without the findings (same rule, same offset) already in ``known``."""
    seen = {(f.rule_id, f.offset) for f in known}
    fresh = []
    for f in extra:
        if (f.rule_id, f.offset) not in seen:
            seen.add((f.rule_id, f.offset))
            fresh.append(f)
    return fresh
