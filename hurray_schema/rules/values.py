"""Rules on the values of the quantization parameters: the scales a per-channel, per-block,
NF4 or MXFP tensor keeps in a buffer (every other rule reads descriptors only).

* ``quantization.per_block.scale_values`` -- every scale finite and non-zero, in its
  ``scale_type_tag`` (float16, bfloat16 or float32; ``quantization/per-block-affine.md
  § Validity Constraints``);
* ``quantization.per_channel.scale_values`` -- every scale a finite, non-zero float32
  (``quantization/per-channel-affine.md § Validity Constraints``);
* ``quantization.nf4.absmax_values`` -- every absmax a finite, non-negative float32
  (``quantization/nf4.md § Validity Constraints``);
* ``quantization.mxfp.scale_reserved`` -- no float8_e8m0 scale byte is 0x00 or 0xFF
  (``quantization/mxfp.md § Referenced Buffer``; ``element-types.md § float8_e8m0``).

A finding is located at the first offending scale: where the scale buffer starts in the input
plus its index times the scale's width.  The scales come first in a buffer the scale and the zero
point share (``quantization.md § Buffer Table Placement Rules``, rule 3); an empty quantization
axis has none.  Only what the scale buffer holds is read, and no more scales than the scheme
derives from the shape.

Where they run (:data:`AT_DECODE`): ``audit`` (files and bare streams; a message stream's data
frames and a recorded session's TENSOR_PUT payloads are not read for them), the strict writers
(:func:`hurray_schema.write_file`, the stream writers: a scale held by a
:class:`~hurray_schema.io.tensor.ProducedBuffer` is its producer's to answer for) and every decode
of the values (the evaluator's dequantization raises the rule's
:class:`~hurray_schema.errors.SpecViolation` instead of returning inf or NaN, located at the
scale's byte in the file for a tensor read from one -- :func:`relocated` -- and with ``offset``
None for a tensor of a stream or built in memory).  The readers do not run them when they open an input or
hand out a tensor: ``quantization/per-channel-affine.md § Validity Constraints`` lets a reader
defer the per-element check of the parameter arrays to the first dequantization, and
:class:`~hurray_schema.io.HurrayFile` reads no data at open (a file read by range would have to
fetch every scale buffer).  Their ``findings`` therefore hold what ``audit`` reports on an input
they accepted but for these rules and :data:`hurray_schema.rules.interop.AUDIT_ONLY`; unlike
those lints, these are MUST-level: the tensor is rejected when its values are read.

The checks are pure: descriptors and bytes in, :class:`ScaleFault` or findings out.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from ..errors import SpecViolation
from ..model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, BlockPagedLayout, ElementType, Mxfp, Nf4, PerBlockAffine, PerChannelAffine,
    QuantFlag,
)
from ..structs._declare import power_of_two
from .descriptor.sizes import layout_buffer_count
from .engine import Finding, Level, Rule, declare

__all__ = [
    "PER_BLOCK_SCALES", "PER_CHANNEL_SCALES", "NF4_ABSMAX", "MXFP_RESERVED", "AT_DECODE", "ScaleFault",
    "ScaleViolation", "scale_fault", "scale_span", "check_scales", "tensor_findings", "stream_tensor_findings",
    "relocated", "SCAN_SCALES", "scheme_rule",
]

_ENFORCED = ("hurray_schema.rules.values:scheme_rule", "hurray_schema.evaluate.dequantize:quant_params")
"""Where each rule is enforced: :func:`scheme_rule` picks it for :func:`scale_fault` (``audit``, the
writers), the evaluator checks the scales it decodes with it (:func:`check_scales`)."""

PER_BLOCK_SCALES = declare(
    "quantization.per_block.scale_values", Level.MUST, "quantization/per-block-affine.md § Validity Constraints",
    "Every per-block scale is finite and non-zero in its scale_type_tag (float16, bfloat16 or float32).",
    scope="data", enforced_by=_ENFORCED)
PER_CHANNEL_SCALES = declare(
    "quantization.per_channel.scale_values", Level.MUST, "quantization/per-channel-affine.md § Validity Constraints",
    "Every per-channel scale is a finite, non-zero float32.",
    scope="data", enforced_by=_ENFORCED)
NF4_ABSMAX = declare(
    "quantization.nf4.absmax_values", Level.MUST, "quantization/nf4.md § Validity Constraints",
    "Every NF4 absmax scale is a finite, non-negative float32.",
    scope="data", enforced_by=_ENFORCED)
MXFP_RESERVED = declare(
    "quantization.mxfp.scale_reserved", Level.MUST_NOT, "quantization/mxfp.md § Referenced Buffer",
    "No MXFP float8_e8m0 scale byte is 0x00 or 0xFF (reserved patterns).",
    scope="data", enforced_by=_ENFORCED)

AT_DECODE = frozenset({PER_BLOCK_SCALES.id, PER_CHANNEL_SCALES.id, NF4_ABSMAX.id, MXFP_RESERVED.id})
"""The rules a reader checks when it decodes a tensor's values, not when it opens the input
(module docstring): ``audit`` and the writers check them on every tensor."""

SCAN_SCALES = 1 << 20
"""Scales looked at per step (the check's scratch memory stays a few MiB whatever the buffer)."""

_WORDS = {ElementType.FLOAT32: np.dtype("<u4"), ElementType.FLOAT16: np.dtype("<u2"),
          ElementType.BFLOAT16: np.dtype("<u2")}
"""Scale type -> how its bits are read (the checks test bits: no float arithmetic, no warnings)."""
_EXPONENT = {ElementType.FLOAT32: 0x7F800000, ElementType.FLOAT16: 0x7C00, ElementType.BFLOAT16: 0x7F80}
_MAGNITUDE = {ElementType.FLOAT32: 0x7FFFFFFF, ElementType.FLOAT16: 0x7FFF, ElementType.BFLOAT16: 0x7FFF}
_ZERO_POINT_WIDTH = 4  # int32 zero points (per-channel and per-block affine § Referenced Buffers)


class ScaleFault(NamedTuple):
    """The first offending scale of a tensor: its rule, the buffer holding it, its byte in that
    buffer, what it is."""

    rule: Rule
    buffer: int
    at: int
    message: str

    def finding(self, buffer_offset: Optional[int]) -> Finding:
        return self.rule.finding(self.message, None if buffer_offset is None else buffer_offset + self.at)

    def violation(self, buffer_offset: Optional[int] = None) -> "ScaleViolation":
        return ScaleViolation(self, None if buffer_offset is None else buffer_offset + self.at)


class ScaleViolation(SpecViolation):
    """The :class:`~hurray_schema.errors.SpecViolation` of a :class:`ScaleFault`, which remembers the
    buffer and byte of the fault so that whoever knows where the buffer lies in the input can
    locate it (:func:`relocated`)."""

    def __init__(self, fault: ScaleFault, offset: Optional[int]):
        super().__init__(fault.rule.id, fault.rule.citation, offset, fault.message)
        self.fault = fault

    def __reduce__(self):
        return (type(self), (self.fault, self.offset))


def relocated(exc: ScaleViolation, buffer_offsets: Optional[Sequence[int]]) -> SpecViolation:
    """``exc`` located in the input whose buffers start at ``buffer_offsets`` (None: unknown,
    ``exc`` as it is)."""
    if buffer_offsets is None or exc.fault.buffer >= len(buffer_offsets):
        return exc
    return exc.fault.violation(buffer_offsets[exc.fault.buffer])


def scheme_rule(q):
    """``(rule, scale type, width)`` of a scheme with a scale buffer, or None."""
    if isinstance(q, PerBlockAffine):
        stt = q.scale_type_tag
        return (PER_BLOCK_SCALES, stt, _WORDS[stt].itemsize) if stt in _WORDS else None
    if isinstance(q, PerChannelAffine):
        return PER_CHANNEL_SCALES, ElementType.FLOAT32, 4
    if isinstance(q, Nf4):
        return NF4_ABSMAX, ElementType.FLOAT32, 4
    if isinstance(q, Mxfp):
        return MXFP_RESERVED, ElementType.FLOAT8_E8M0, 1
    return None


def _shares_buffer(q) -> bool:
    """The zero points follow the scales in the scale buffer (``quantization.md § Buffer Table
    Placement Rules`` 3)."""
    if not isinstance(q, (PerBlockAffine, PerChannelAffine)) or q.flags & QuantFlag.SYMMETRIC:
        return False
    return q.zero_point_buffer_index == q.scale_buffer_index and q.zero_point_buffer_index != NO_BUFFER_INDEX


def _derived_count(desc) -> Optional[int]:
    """Scales the scheme derives from the shape (None: not derivable here)."""
    q, shape = desc.quantization, tuple(desc.shape)
    axis = int(q.axis)
    if axis >= len(shape) or DYNAMIC_DIMENSION in shape or isinstance(desc.layout, BlockPagedLayout):
        return None
    if isinstance(q, PerChannelAffine):
        return shape[axis]
    block = int(q.block_size)
    if not power_of_two(block):
        return None
    if not shape[axis]:
        return 0
    others = 1
    for k, n in enumerate(shape):
        if k != axis:
            others *= n
    return -(-shape[axis] // block) * others


def scale_span(desc, scale_bytes: int) -> Optional[tuple]:
    """``(rule, scale type, buffer index, width, count)`` of the scales of ``desc`` whose scale buffer
    holds ``scale_bytes`` bytes, or None when the descriptor has no scale buffer these rules read
    (no such scheme, an index past the table or at the data buffer, an unknown scale type).
    ``count`` is the number of scales the scheme derives from the shape, never more than the
    buffer holds (a block-paged tensor's: what the buffer holds)."""
    q = desc.quantization
    words = scheme_rule(q) if q is not None else None
    if words is None:
        return None
    rule, scale_type, width = words
    index = int(q.scale_buffer_index)
    if index < (layout_buffer_count(desc) or 1) or index >= len(desc.buffers):  # data: quantization.buffer_index.*
        return None
    per_scale = width + (_ZERO_POINT_WIDTH if _shares_buffer(q) else 0)
    held = scale_bytes // per_scale
    derived = _derived_count(desc)
    count = held if derived is None else min(derived, held)
    return rule, scale_type, index, width, count


def _first_bad(raw, rule: Rule, scale_type, count: int, width: int) -> Optional[int]:
    """Index of the first scale of ``raw`` (the scale buffer's bytes) that breaks ``rule``."""
    dtype = np.dtype(np.uint8) if width == 1 else _WORDS[scale_type]
    for start in range(0, count, SCAN_SCALES):
        n = min(SCAN_SCALES, count - start)
        words = np.frombuffer(raw, dtype, n, start * width)
        bad = _breaks(words, rule, scale_type)
        hit = np.flatnonzero(bad)
        if hit.size:
            return start + int(hit[0])
    return None


def _breaks(words: np.ndarray, rule: Rule, scale_type) -> np.ndarray:
    """Which scales (their bits, ``scale_type``) break ``rule``."""
    if rule is MXFP_RESERVED:
        return (words == 0) | (words == 0xFF)
    exponent, magnitude = _EXPONENT[scale_type], _MAGNITUDE[scale_type]
    bad = (words & words.dtype.type(exponent)) == exponent  # infinity or NaN
    if rule is NF4_ABSMAX:  # non-negative: the sign bit clear, or a zero (-0.0 is 0)
        return bad | (((words & words.dtype.type(0x80000000)) != 0) & ((words & words.dtype.type(magnitude)) != 0))
    return bad | ((words & words.dtype.type(magnitude)) == 0)  # non-zero: +0.0 and -0.0 both are zero


_WHAT = {PER_BLOCK_SCALES.id: "finite and non-zero", PER_CHANNEL_SCALES.id: "finite and non-zero",
         NF4_ABSMAX.id: "finite and non-negative"}


def _value(bits: bytes, scale_type) -> float:
    """The value of one scale's little-endian ``bits``."""
    if scale_type == ElementType.BFLOAT16:
        return float(np.frombuffer(bytes(2) + bits, "<f4")[0])
    return float(np.frombuffer(bits, "<f2" if scale_type == ElementType.FLOAT16 else "<f4")[0])


def _message(rule: Rule, index: int, value) -> str:
    """What is wrong with scale ``index`` (its byte, for MXFP; else its value)."""
    if rule is MXFP_RESERVED:
        return f"MXFP scale {index} is the reserved float8_e8m0 pattern 0x{int(value):02X}"
    return f"scale {index} is {float(value)!r}, not {_WHAT[rule.id]}"


def scale_fault(desc, buffers: Sequence) -> Optional[ScaleFault]:
    """The first scale of ``desc`` (whose buffers, in buffer-table order, are ``buffers``: byte
    buffers or prefixes of them) that breaks ``quantization.per_block.scale_values``,
    ``quantization.per_channel.scale_values``, ``quantization.nf4.absmax_values`` or
    ``quantization.mxfp.scale_reserved``; None when every scale is valid or the descriptor has
    no scale buffer these rules read (:func:`scale_span`)."""
    q = desc.quantization
    if q is None or not isinstance(q, (PerBlockAffine, PerChannelAffine, Nf4, Mxfp)):
        return None
    index = int(q.scale_buffer_index)
    if index >= len(buffers):
        return None
    raw = buffers[index]
    span = scale_span(desc, len(raw))
    if span is None:
        return None
    rule, scale_type, index, width, count = span
    first = _first_bad(raw, rule, scale_type, count, width)
    if first is None:
        return None
    bits = bytes(raw[first * width:(first + 1) * width])
    value = bits[0] if rule is MXFP_RESERVED else _value(bits, scale_type)
    return ScaleFault(rule, index, first * width, _message(rule, first, value))


def check_scales(rule: Rule, scale_type, buffer: int, scales: np.ndarray, index=None) -> None:
    """Raise ``rule``'s :class:`ScaleViolation` (located in its buffer) for the first scale of
    ``scales`` -- decoded float32 values of the scale buffer's ``scale_type`` scales, or the
    float8_e8m0 bytes of an MXFP one, read from buffer ``buffer`` -- that breaks it; ``index`` (None: the scales are the first
    ones in order) says which scale each one is.  What the evaluator calls on the scales it
    decoded, before any value is computed with them."""
    values = np.asarray(scales)
    if rule is MXFP_RESERVED:
        bad = (values == 0) | (values == 0xFF)
    else:
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | ((values < 0) if rule is NF4_ABSMAX else (values == 0))
    hit = np.flatnonzero(bad)
    if not hit.size:
        return
    first = int(hit[0])
    if index is not None:
        first = int(np.asarray(index).reshape(-1)[first])
    width = 1 if rule is MXFP_RESERVED else (_WORDS[scale_type].itemsize if scale_type in _WORDS else 4)
    value = values.reshape(-1)[int(hit[0])]
    raise ScaleFault(rule, buffer, first * width, _message(rule, first, value)).violation()


def tensor_findings(desc, buffers: Sequence, buffer_offsets: Sequence[int]) -> list[Finding]:
    """The finding of the first offending scale of a tensor whose buffers ``buffers`` start at
    ``buffer_offsets`` in the input (none when every scale is valid)."""
    fault = scale_fault(desc, buffers)
    if fault is None:
        return []
    return [fault.finding(buffer_offsets[fault.buffer])]


def stream_tensor_findings(desc, data, data_offset: int) -> list[Finding]:
    """:func:`tensor_findings` for a tensor of a bare stream, whose buffers follow its descriptor back
    to back from ``data_offset`` of ``data`` (``interchange.md § Scope``).  Only a scale buffer
    that lies whole in ``data`` is read."""
    q = desc.quantization
    if q is None or not isinstance(q, (PerBlockAffine, PerChannelAffine, Nf4, Mxfp)):
        return []
    index = int(q.scale_buffer_index)
    if index >= len(desc.buffers):
        return []
    starts, at = [], data_offset
    for handle in desc.buffers[:index + 1]:
        starts.append(at)
        at += handle.byte_size
    if at > len(data):  # the scale buffer runs past the bytes there are: stream.truncated's
        return []
    view = memoryview(data)
    empty = view[0:0]
    buffers = [empty] * index + [view[starts[index]:at]]
    return tensor_findings(desc, buffers, starts)
