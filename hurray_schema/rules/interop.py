"""Interop hazards: inputs every reader rule accepts but that another implementation reads
differently, or that a writer was not allowed to produce.  Audit reports them; readers
do not reject them (no reader rule is broken) and do not run them (:data:`AUDIT_ONLY`).

* ``element_types.boolean.unpacked`` -- ``element-types.md § Boolean Type`` packs ``bool``
  8 elements per byte, LSB-first, and (``§ Buffer Size``) only sets a *minimum* buffer
  size.  A dense ``bool`` buffer of exactly one byte per element, every byte ``0x00`` or
  ``0x01``, whose packed reading differs from its byte-wise reading, looks written one
  byte per element (as pyhurray 0.1.0 writes it): read as the spec says, its values are
  not the ones the writer meant.  A lint (SHOULD level), since the bytes are valid.
* ``file.composite.head_padding`` -- ``file-format.md § Composite Tensors``: a writer
  MUST NOT insert ``data_buffer_alignment`` padding after a composite head's descriptor;
  the head's first member follows at the next 8-byte boundary.  Readers recover
  membership by position, so they read such files (pyhurray 0.1.0 writes them).

The detection functions are pure: they take descriptors, offsets and bytes and return
:class:`~hurray_schema.rules.engine.Finding` s.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from ..model import ElementType, LayoutTag, TensorDescriptor
from ..structs.file import DESCRIPTOR_ALIGNMENT
from .engine import Finding, Level, declare

__all__ = [
    "BOOL_UNPACKED", "HEAD_PADDING", "bool_packing_findings", "head_padding_findings", "file_findings",
    "stream_tensor_findings", "BOOL_SCAN_BYTES", "AUDIT_ONLY",
]

BOOL_UNPACKED = declare(
    "element_types.boolean.unpacked", Level.SHOULD, "element-types.md § Boolean Type",
    "A bool buffer is packed 8 elements per byte, LSB-first; a dense bool buffer of exactly one byte per "
    "element whose bytes are all 0x00/0x01 and whose packed reading differs from its byte-wise reading looks "
    "written unpacked (lint: the bytes are valid, the buffer size is only a minimum).", scope="data",
    enforced_by="hurray_schema.rules.interop:bool_packing_findings")
HEAD_PADDING = declare(
    "file.composite.head_padding", Level.MUST_NOT, "file-format.md § Composite Tensors",
    "A writer does not pad after a composite head's descriptor: its first member's descriptor follows at the "
    "next 8-byte boundary (readers still read such files: membership is positional).", scope="file",
    enforced_by="hurray_schema.rules.interop:head_padding_findings")

AUDIT_ONLY = frozenset({BOOL_UNPACKED.id, HEAD_PADDING.id})
"""The rules only ``audit`` runs (the one list of them): lints on inputs every reader rule
accepts.  ``element_types.boolean.unpacked`` reads a tensor's data bytes, which a reader
hands out without looking at them; ``file.composite.head_padding`` binds the writer of a
layout readers read by position.  For every other rule but those a reader checks when it
decodes a tensor's values (:data:`hurray_schema.rules.values.AT_DECODE`: MUST-level rules on the
quantization scales, deferred as the spec allows) a reader's ``findings``
(:class:`~hurray_schema.io.StreamReader`, :class:`~hurray_schema.io.HurrayFile`) hold what
``audit`` reports on the same input that the reader accepted: same rule, level and offset."""

BOOL_SCAN_BYTES = 1 << 20
"""At most this many leading bytes of a bool buffer are looked at (the lint reads no more)."""

_DENSE = (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR)


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def bool_packing_findings(desc: TensorDescriptor, buffer0, offset: Optional[int] = None) -> list[Finding]:
    """``element_types.boolean.unpacked`` for a dense, unquantized ``bool`` tensor whose data
    buffer ``buffer0`` (its bytes, or a prefix of at least ``BOOL_SCAN_BYTES``) looks
    written one byte per element; ``offset`` is where the buffer starts in the input."""
    if int(desc.type_tag) != ElementType.BOOL or desc.layout.tag not in _DENSE or desc.quantization is not None:
        return []
    count = desc.element_count
    if count is None or count < 2 or desc.byte_offset or not desc.buffers or desc.buffers[0].byte_size != count:
        return []
    scanned = min(count, BOOL_SCAN_BYTES, len(buffer0))
    data = np.frombuffer(buffer0, dtype=np.uint8, count=scanned)
    if scanned < 2 or int(data.max()) > 1:
        return []
    packed = np.unpackbits(data[: -(-scanned // 8)], bitorder="little")[:scanned].astype(bool)
    bytewise = data.astype(bool)
    if np.array_equal(packed, bytewise):
        return []
    first = int(np.flatnonzero(packed != bytewise)[0])
    return [BOOL_UNPACKED.finding(
        f"bool buffer of {count} bytes for {count} elements, every byte 0x00 or 0x01: it looks written one byte "
        f"per element; packed 8 per byte LSB-first (as the spec says) element {first} reads "
        f"{bool(packed[first])}, byte {first} says {bool(bytewise[first])}", offset)]


def head_padding_findings(placements: Iterable[tuple[TensorDescriptor, int, int]]) -> list[Finding]:
    """``file.composite.head_padding`` for each composite head whose next descriptor (in
    descriptor-offset order) does not start at the head's 8-byte-aligned end.

    ``placements`` are ``(descriptor, descriptor_offset, descriptor_length)`` of the tensors
    of a file's tensor region, in descriptor-offset order."""
    found = []
    previous = None
    for desc, offset, length in placements:
        if previous is not None:
            head_end = _align(previous[1] + previous[2], DESCRIPTOR_ALIGNMENT)
            if offset > head_end:
                found.append(HEAD_PADDING.finding(
                    f"{offset - head_end} bytes of padding after the composite head at {previous[1]}: its first "
                    f"member's descriptor is at {offset}, not at the next 8-byte boundary {head_end}", head_end))
        previous = (desc, offset, length) if desc.is_composite_head else None
    return found


def file_findings(entries: Sequence, descriptor_of: Callable[[str], TensorDescriptor],
                  buffers_of: Callable[[str], Sequence]) -> list[Finding]:
    """Both lints over a file's tensors: ``entries`` are index entries (``name``,
    ``descriptor_offset``, ``descriptor_length``, ``data_offset``), ``descriptor_of(name)``
    their descriptors, ``buffers_of(name)`` the buffers of a tensor that has some."""
    ordered = sorted(entries, key=lambda e: e.descriptor_offset)
    found = head_padding_findings((descriptor_of(e.name), e.descriptor_offset, e.descriptor_length) for e in ordered)
    for e in ordered:
        desc = descriptor_of(e.name)
        if int(desc.type_tag) == ElementType.BOOL and desc.buffers:
            found += bool_packing_findings(desc, buffers_of(e.name)[0], e.data_offset)
    return found


def stream_tensor_findings(desc: TensorDescriptor, data, data_offset: int) -> list[Finding]:
    """The bool lint for a tensor of a bare stream: its buffers follow its descriptor at
    ``data_offset`` of ``data``, buffer 0 first."""
    if int(desc.type_tag) != ElementType.BOOL or not desc.buffers:
        return []
    size = min(desc.buffers[0].byte_size, BOOL_SCAN_BYTES)
    return bool_packing_findings(desc, memoryview(data)[data_offset:data_offset + size], data_offset)
