"""Dequantization kernels: per-tensor, per-channel, per-block affine, NF4 and MXFP.

Each formula is applied exactly as its page states it (``quantization/*.md § Dequantization
Formula``): ``q - zero_point`` in signed 32-bit integer arithmetic, cast to float32, times
the float32 scale (float16/bfloat16 scales widened losslessly first); NF4 ``s * nf4[q]`` and
MXFP ``2**(e - 127) * value(q)`` in float32.  The float32 result is then rounded once to
the decoded type asked for (float16 or bfloat16 bits, or kept as float32).

Parameter indices follow ``quantization/per-block-affine.md § Block Layout``:
``b = outer * ceil(S / K) + i_axis // K`` with ``outer`` the row-major index over the other
dimensions.  A per-block (or NF4) tensor whose axis is not a multiple of ``K`` is stored with
the axis padded to whole blocks (``§ Padding``); the padding is addressed but never read.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np

from ..errors import HurraySchemaError
from ..model import (NO_BUFFER_INDEX, CombineOp, ElementType, Mxfp, Nf4, PerBlockAffine, PerChannelAffine,
                     PerTensorAffine, QuantFlag)
from ..structs._declare import power_of_two
from ..structs.element_types import element_type_info
from ..structs.quantization import NF4_LEVELS
from ..rules import values as value_rules
from . import jit
from .jit import claim_span, search_left, slot
from .elements import (UnsupportedEvaluation, bf16_add, bf16_to_f32, codes_at, f16_add, f16_to_f32_fast,
                       f32_to_bf16, f32_to_f16_fast, f32_to_f16_not_nan, load_code, minifloat_table, numpy_dtype,
                       sign_extend)
from .dequantize_simd import LANES, int4x32, vector_f16

__all__ = ["QuantParams", "quant_params", "param_byte_spans", "decode_rows", "decode_rows_lut", "decode_rows_int4", "decode_gather",
           "OUT_F32", "OUT_F16", "OUT_BF16", "storage_shape", "param_indices", "param_indices_at", "int4_vector_ok",
           "NO_PATCH", "PATCH_REPLACE", "PATCH_ADD", "decode_rows_numpy", "rows_kernel", "ROWS_ANY", "ROWS_LUT",
           "ROWS_INT4", "DECODE_COMPILE_ELEMENTS"]

OUT_F32, OUT_F16, OUT_BF16 = 0, 1, 2
OUT = OUT_F32
"""The output kind a decode kernel is compiled for: a compile-time constant of each of its variants
(``kernel.variant(OUT=...)``), so that each kind's machine code holds only its own rounding."""
PK_TENSOR, PK_CHANNEL, PK_BLOCK = 0, 1, 2
VAL_INT, VAL_TABLE = 0, 1

NF4_TABLE = np.zeros(256, np.float32)
NF4_TABLE[:16] = np.array(NF4_LEVELS, np.float32)
NF4_TABLE.flags.writeable = False

_AFFINE_STORAGE = {ElementType.INT8, ElementType.UINT8, ElementType.INT16, ElementType.UINT16, ElementType.INT32,
                   ElementType.UINT32, ElementType.INT4, ElementType.UINT4, ElementType.INT2, ElementType.UINT2}
_BLOCK_STORAGE = {ElementType.INT8, ElementType.UINT8, ElementType.INT4, ElementType.UINT4, ElementType.INT2,
                  ElementType.UINT2}
_MXFP_FLOAT = {ElementType.FLOAT8_E4M3, ElementType.FLOAT8_E5M2, ElementType.FLOAT4_E2M1, ElementType.FLOAT6_E2M3,
               ElementType.FLOAT6_E3M2}
_MXFP_INT = {ElementType.INT8, ElementType.INT4}


class QuantParams:
    """Everything a kernel needs to turn codes into float32 values."""

    __slots__ = ("valmode", "table", "scales", "zps", "pk", "axis", "block", "nb", "bits", "signed")

    def __init__(self, valmode, table, scales, zps, pk, axis, block, nb, bits, signed):
        self.valmode, self.table, self.scales, self.zps = valmode, table, scales, zps
        self.pk, self.axis, self.block, self.nb, self.bits, self.signed = pk, axis, block, nb, bits, signed


def _buffer(buffers, index, need, what):
    if index >= len(buffers):
        raise HurraySchemaError(f"{what}: buffer index {index} is past the buffer table")
    buf = buffers[index]
    if len(buf) < need:
        raise HurraySchemaError(f"{what}: needs {need} bytes, buffer {index} has {len(buf)}")
    return buf


def _array(buffers, index, dtype, count, what, skip=0):
    dt = np.dtype(dtype)
    buf = _buffer(buffers, index, skip + count * dt.itemsize, what)
    return np.frombuffer(buf, dt, count, skip)


WIDEN_BF16 = False
"""Whether :func:`_widen` is compiled for bfloat16 bits (else float16): a constant of its variants."""


@jit.kernel("void(u16[:], f32[:])")
def _widen(bits, out):
    """float16 / bfloat16 bits -> float32 values, exact (a float16 NaN keeps its payload)."""
    for i in range(bits.size):
        out[i] = bf16_to_f32(bits[i]) if WIDEN_BF16 else f16_to_f32_fast(bits[i])


NUMPY_WIDEN_MAX = 1 << 16
"""At most this many scales are widened by NumPy (a one-off as fast as a kernel); more by :func:`_widen`
where its machine code is at hand or worth compiling (:data:`WIDEN_COMPILE_SCALES`)."""

WIDEN_COMPILE_SCALES = 1 << 24
"""Scales widened by NumPy in a process before :func:`_widen` is compiled (:meth:`.jit.Kernel.worth_it`)."""


def widened_scales(bits: np.ndarray, scale_type) -> np.ndarray:
    """float16 / bfloat16 scale bits as float32, exact.

    bfloat16 is the high half of a float32.  Few float16 scales go through NumPy's cast, exact for
    every value; a signalling NaN may come out quieted there, which changes no result: a scale is
    only ever multiplied, and the product of a NaN is that NaN quieted either way."""
    kernel = _widen.variant(WIDEN_BF16=scale_type == ElementType.BFLOAT16)
    if bits.size > NUMPY_WIDEN_MAX and kernel.worth_it(bits.size, WIDEN_COMPILE_SCALES):
        out = np.empty(bits.size, np.float32)
        kernel(np.ascontiguousarray(bits), out)
        return out
    if scale_type == ElementType.BFLOAT16:
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def storage_shape(desc) -> tuple[int, ...]:
    """Shape buffer 0 is laid out for: the block axis padded to whole blocks (per-block affine, NF4)."""
    shape = tuple(desc.shape)
    q = desc.quantization
    if isinstance(q, (PerBlockAffine, Nf4)) and q.axis < len(shape) and q.block_size > 0:
        s = list(shape)
        s[q.axis] = -(-s[q.axis] // q.block_size) * q.block_size
        return tuple(s)
    return shape


def _selected(raw: np.ndarray, index) -> np.ndarray:
    """``raw`` (one entry per parameter) at ``index`` only (``None``: all of it); a one-entry array
    (a symmetric scheme's shared zero point) is kept whole."""
    if index is None or raw.size <= 1:
        return raw
    return np.ascontiguousarray(raw[index])


_CHANNEL_SCALE, _ZERO_POINT = np.dtype("<f4"), np.dtype("<i4")
_NF4_ABSMAX, _MXFP_SCALE = np.dtype("<f4"), np.dtype(np.uint8)
"""How each parameter array is stored (``quantization/*.md``): read by :func:`quant_params`, located by
:func:`param_byte_spans`."""
_BLOCK_SCALE = {ElementType.FLOAT32: np.dtype("<f4"), ElementType.FLOAT16: np.dtype("<u2"),
                ElementType.BFLOAT16: np.dtype("<u2")}
"""Per-block scale_type_tag -> how its scales are read (16-bit floats as their bits, widened after)."""


def _index_spans(buffer: int, index: np.ndarray, width: int, skip: int) -> list[tuple[int, int, int]]:
    """``(buffer, start, stop)`` of the parameters ``index`` (``width`` bytes each, from ``skip``),
    neighbours joined."""
    index = np.unique(np.asarray(index, np.int64))
    if not index.size:
        return []
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    firsts = index[np.concatenate([[0], breaks])]
    lasts = index[np.concatenate([breaks - 1, [index.size - 1]])]
    return [(buffer, skip + int(first) * width, skip + (int(last) + 1) * width)
            for first, last in zip(firsts.tolist(), lasts.tolist())]


def param_byte_spans(desc, select) -> Optional[list[tuple[int, int, int]]]:
    """``(buffer, start, stop)`` byte spans of the parameters :func:`quant_params` reads with
    ``select`` (the same selection, the same buffers and offsets: a superset of its reads), or None
    when it would read them all (no selection, a scheme or type it does not decode here)."""
    q = desc.quantization
    shape = tuple(desc.shape)
    if isinstance(q, PerTensorAffine):
        return []
    if select is None or not isinstance(q, (PerChannelAffine, PerBlockAffine, Nf4, Mxfp)) or int(q.axis) >= len(shape):
        return None
    axis = int(q.axis)
    if isinstance(q, PerChannelAffine):
        n, index = shape[axis], select(PK_CHANNEL, axis, 1, 1)
        spans = _index_spans(q.scale_buffer_index, index, _CHANNEL_SCALE.itemsize, 0)
        if not q.flags & QuantFlag.SYMMETRIC:
            skip = n * _CHANNEL_SCALE.itemsize if q.zero_point_buffer_index == q.scale_buffer_index else 0
            spans += _index_spans(q.zero_point_buffer_index, index, _ZERO_POINT.itemsize, skip)
        return spans
    block = int(q.block_size)
    if not power_of_two(block):
        return None
    nb = -(-shape[axis] // block)
    count = nb * (math.prod(shape) // shape[axis]) if shape[axis] else 0
    index = select(PK_BLOCK, axis, block, nb)
    if isinstance(q, PerBlockAffine):
        scale = _BLOCK_SCALE.get(q.scale_type_tag)
        if scale is None:
            return None
        spans = _index_spans(q.scale_buffer_index, index, scale.itemsize, 0)
        if not (q.flags & QuantFlag.SYMMETRIC or q.zero_point_buffer_index == NO_BUFFER_INDEX):
            skip = count * scale.itemsize if q.zero_point_buffer_index == q.scale_buffer_index else 0
            spans += _index_spans(q.zero_point_buffer_index, index, _ZERO_POINT.itemsize, skip)
        return spans
    return _index_spans(q.scale_buffer_index, index, (_NF4_ABSMAX if isinstance(q, Nf4) else _MXFP_SCALE).itemsize, 0)


def _which(index, selected: np.ndarray):
    """Which scale of the buffer each of ``selected`` is: ``index`` when :func:`_selected` took those
    (None: all of them, in order)."""
    return None if index is None or np.asarray(index).size != selected.size else index


def quant_params(desc, buffers, param_count=None, select=None) -> QuantParams:
    """Decode scales / zero points of ``desc.quantization``; ``param_count`` overrides the block count
    (block-paged tensors keep one parameter per page slot).

    ``select(pk, axis, block, nb)``, when given, returns the parameter indices a caller needs (the
    blocks or channels of a region) or ``None`` for all; only those parameters are then widened and
    returned, in that order (``nb`` stays the tensor's).  Parameters outside the selection are not
    read, so a fault among them is not seen.

    A scale that breaks its scheme's rule on the values (zero, infinite or NaN, a negative NF4
    absmax, a reserved MXFP byte: :mod:`hurray_schema.rules.values`) raises that rule's
    :class:`~hurray_schema.rules.values.ScaleViolation`, located in its buffer (the caller that
    knows where the buffer lies in the input relocates it), before any value is computed."""
    q = desc.quantization
    tag = desc.type_tag
    info = element_type_info(tag)
    if info is None:
        raise UnsupportedEvaluation(f"element type 0x{int(tag):02X} cannot be dequantized here")
    bits, signed = info.bit_width, int(info.is_signed)
    shape = tuple(desc.shape)
    rank = len(shape)
    if isinstance(q, PerTensorAffine):
        if tag not in _AFFINE_STORAGE:
            raise HurraySchemaError(f"per-tensor affine cannot decode storage type {info.name}")
        return QuantParams(VAL_INT, NF4_TABLE, np.array([q.scale], np.float32), np.array([q.zero_point], np.int32),
                           PK_TENSOR, 0, 1, 1, bits, signed)
    if not isinstance(q, (PerChannelAffine, PerBlockAffine, Nf4, Mxfp)):  # kept opaque by a permissive reader
        raise UnsupportedEvaluation(f"quantization scheme 0x{int(q.scheme):02X} is not evaluated here")
    axis = int(q.axis)
    if axis >= rank:
        raise HurraySchemaError("quantization axis must be < rank")
    if isinstance(q, PerChannelAffine):
        if tag not in _AFFINE_STORAGE:
            raise HurraySchemaError(f"per-channel affine cannot decode storage type {info.name}")
        n = shape[axis] if param_count is None else param_count
        index = None if select is None else select(PK_CHANNEL, axis, 1, 1)
        scales = _selected(_array(buffers, q.scale_buffer_index, _CHANNEL_SCALE, n, "per-channel scales"), index)
        value_rules.check_scales(value_rules.PER_CHANNEL_SCALES, ElementType.FLOAT32, q.scale_buffer_index, scales,
                                 _which(index, scales))
        skip = n * _CHANNEL_SCALE.itemsize if q.zero_point_buffer_index == q.scale_buffer_index else 0
        zps = (np.zeros(1, np.int32) if q.flags & QuantFlag.SYMMETRIC
               else _selected(_array(buffers, q.zero_point_buffer_index, _ZERO_POINT, n, "per-channel zero points",
                                     skip),
                              index))
        return QuantParams(VAL_INT, NF4_TABLE, scales.astype(np.float32), zps.astype(np.int32),
                           PK_CHANNEL, axis, 1, 1, bits, signed)
    block = int(q.block_size)
    if not power_of_two(block):
        raise HurraySchemaError("block_size must be a power of two")
    nb = -(-shape[axis] // block)
    count = nb * (math.prod(shape) // shape[axis]) if shape[axis] else 0
    if param_count is not None:
        count = param_count
    index = None if select is None else select(PK_BLOCK, axis, block, nb)
    if isinstance(q, PerBlockAffine):
        if tag not in _BLOCK_STORAGE:
            raise HurraySchemaError(f"per-block affine cannot decode storage type {info.name}")
        stt = q.scale_type_tag
        scale = _BLOCK_SCALE.get(stt)
        if scale is None:
            raise HurraySchemaError(f"per-block scale_type_tag 0x{int(stt):02X} is not float16/bfloat16/float32")
        raw = _selected(_array(buffers, q.scale_buffer_index, scale, count, "per-block scales"), index)
        scales = raw.astype(np.float32) if stt == ElementType.FLOAT32 else widened_scales(raw, stt)
        value_rules.check_scales(value_rules.PER_BLOCK_SCALES, stt, q.scale_buffer_index, scales, _which(index, raw))
        skip = count * scale.itemsize if q.zero_point_buffer_index == q.scale_buffer_index else 0
        zps = (np.zeros(1, np.int32) if q.flags & QuantFlag.SYMMETRIC or q.zero_point_buffer_index == NO_BUFFER_INDEX
               else _selected(_array(buffers, q.zero_point_buffer_index, _ZERO_POINT, count, "per-block zero points",
                                     skip),
                              index))
        return QuantParams(VAL_INT, NF4_TABLE, scales, zps.astype(np.int32), PK_BLOCK, axis, block, nb, bits, signed)
    if isinstance(q, Nf4):
        if tag != ElementType.UINT4:
            raise HurraySchemaError("NF4 storage type must be uint4")
        scales = _selected(_array(buffers, q.scale_buffer_index, _NF4_ABSMAX, count, "NF4 absmax"),
                           index).astype(np.float32)
        value_rules.check_scales(value_rules.NF4_ABSMAX, ElementType.FLOAT32, q.scale_buffer_index, scales,
                                 _which(index, scales))
        return QuantParams(VAL_TABLE, NF4_TABLE, scales, np.zeros(1, np.int32), PK_BLOCK, axis, block, nb, bits, 0)
    if isinstance(q, Mxfp):
        if shape[axis] % block:
            raise HurraySchemaError("MXFP: shape[axis] must be a multiple of block_size (no partial block)")
        codes = _selected(_array(buffers, q.scale_buffer_index, _MXFP_SCALE, count, "MXFP scales"), index)
        value_rules.check_scales(value_rules.MXFP_RESERVED, ElementType.FLOAT8_E8M0, q.scale_buffer_index, codes,
                                 _which(index, codes))
        scales = minifloat_table(ElementType.FLOAT8_E8M0)[codes]
        if tag in _MXFP_FLOAT:
            return QuantParams(VAL_TABLE, minifloat_table(tag), scales, np.zeros(1, np.int32),
                               PK_BLOCK, axis, block, nb, bits, 0)
        if tag in _MXFP_INT:
            return QuantParams(VAL_INT, NF4_TABLE, scales, np.zeros(1, np.int32), PK_BLOCK, axis, block, nb, bits, 1)
        raise HurraySchemaError(f"MXFP cannot decode storage type {info.name}")
    raise UnsupportedEvaluation(f"quantization scheme 0x{int(q.scheme):02X} is not evaluated here")


def param_indices(p: QuantParams, shape) -> np.ndarray:
    """Parameter index of every logical element (C order), vectorized."""
    shape = tuple(shape)
    if p.pk == PK_TENSOR:
        return np.zeros(shape, np.int64)
    idx = np.indices(shape, dtype=np.int64, sparse=True)
    if p.pk == PK_CHANNEL:
        return np.broadcast_to(idx[p.axis], shape)
    outer = np.zeros((), np.int64)
    for d in range(len(shape)):
        if d != p.axis:
            outer = outer * np.int64(shape[d]) + idx[d]
    return np.broadcast_to(outer * np.int64(p.nb) + idx[p.axis] // p.block, shape)


def param_indices_at(p: QuantParams, shape, coords: np.ndarray) -> np.ndarray:
    """Parameter index of the elements at ``coords`` ((n, rank) int64) only: what
    ``param_indices(p, shape)[tuple(coords.T)]`` gives, without a table of the whole shape."""
    count = coords.shape[0]
    if p.pk == PK_TENSOR:
        return np.zeros(count, np.int64)
    if p.pk == PK_CHANNEL:
        return np.ascontiguousarray(coords[:, p.axis])
    outer = np.zeros(count, np.int64)
    for d, n in enumerate(shape):
        if d != p.axis:
            outer = outer * np.int64(n) + coords[:, d]
    return outer * np.int64(p.nb) + coords[:, p.axis] // p.block


# ------------------------------------------------------------------------------------
# Kernels (two signatures each: float32 output, or uint16 float16/bfloat16 bits)
# ------------------------------------------------------------------------------------


def _signatures(arguments: str) -> tuple[str, str]:
    """The float32-output and the 16-bit-output signature of a decode kernel (``OUT`` stands for an array of
    the output type, ``OUT_SCRATCH`` for per-thread scratch of it: :class:`.jit.Scratch`)."""
    return tuple(f"void({arguments.replace('OUT_SCRATCH', out + '[:, :]').replace('OUT', out + '[:]')})"
                 for out in ("f32", "u16"))


_PARAMETERS = "i64, i64, i64, f32[:], f32[:], i32[:]"
"""valmode, bits, signed, table, scales, zps (:class:`QuantParams`)."""

PARALLEL_MIN_ELEMENTS = 1 << 15
"""A decode of fewer elements runs on the calling thread alone: waking others costs more than the work."""

ROW_UNITS = 64
"""Runs of rows a parallel decode is cut into; a thread takes the next one when it is free, so a thread
sharing its core with other load holds up less (dynamic scheduling)."""


def _units(rows: int, elements: int) -> tuple[int, int]:
    """(units of work, threads at most) for a decode of ``rows`` rows and ``elements`` elements."""
    if elements < PARALLEL_MIN_ELEMENTS or rows < 2:
        return 1, 1
    return min(rows, ROW_UNITS), jit.threads()


@jit.helper
def _value(code, pi, valmode, bits, signed, table, scales, zps):
    s = scales[pi]
    if valmode == VAL_INT:
        v = sign_extend(code, bits) if signed else np.int64(code)
        z = np.int64(zps[pi]) if zps.size > 1 else np.int64(zps[0])
        d = np.int32(v - z)  # int32 wrap-around arithmetic
        return np.float32(np.float32(d) * s)
    return np.float32(s * table[code])


@jit.helper(inline="always")
def _store(out, i, x):
    if OUT == OUT_F16:
        out[i] = f32_to_f16_fast(x)
    elif OUT == OUT_BF16:
        out[i] = f32_to_bf16(x)
    else:
        out[i] = x


@jit.helper
def _row_origin(row, shape, strides, axis):
    """(element offset of the row start, its index on ``axis``, row-major index over the other leading dims)."""
    rem = row
    off = np.int64(0)
    i_axis = np.int64(0)
    outer_na = np.int64(0)
    mult = np.int64(1)
    for d in range(shape.size - 2, -1, -1):
        i = rem % shape[d]
        rem //= shape[d]
        off += i * strides[d]
        if d == axis:
            i_axis = i
        else:
            outer_na += i * mult
            mult *= shape[d]
    return off, i_axis, outer_na


@jit.helper
def _row_params(row, i_axis, outer_na, cols, pk, axis, last, nb, block):
    """Parameter index of element j of a row is ``base + j * step + (j // block) * bstep``."""
    if pk == PK_TENSOR:
        return np.int64(0), np.int64(0), np.int64(0)
    if axis == last:
        if pk == PK_BLOCK:
            return row * nb, np.int64(0), np.int64(1)
        return np.int64(0), np.int64(1), np.int64(0)  # per-channel along the row
    if pk == PK_CHANNEL:
        return i_axis, np.int64(0), np.int64(0)
    return outer_na * cols * nb + i_axis // block, nb, np.int64(0)


@jit.kernel(*_signatures(f"i64[:], u8[:], i64, i64[:], i64[:], {_PARAMETERS}, i64, i64, i64, i64, OUT"))
def _decode_rows(work, buf, base, shape, strides, valmode, bits, signed, table, scales, zps,
                 pk, axis, block, nb, out):
    r = shape.size
    cols = shape[r - 1]
    rows = out.size // cols if cols else 0
    sl = strides[r - 1]
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for row in range(first, stop):
            off, i_axis, outer_na = _row_origin(row, shape, strides, axis)
            pbase, pstep, bstep = _row_params(row, i_axis, outer_na, cols, pk, axis, r - 1, nb, block)
            o = row * cols
            for j in range(cols):
                pi = pbase + j * pstep + (j // block) * bstep
                _store(out, o + j, _value(load_code(buf, base, off + j * sl, bits), pi, valmode, bits, signed,
                                          table, scales, zps))


DECODE_COMPILE_ELEMENTS = 1 << 22
"""Elements decoded by NumPy (:func:`decode_rows_numpy`) in a process before the affine-layout decode
kernel it stands for is compiled, while the kernel cache does not hold it (:meth:`.jit.Kernel.worth_it`)."""

NUMPY_DECODE_STEP = 1 << 16
"""Elements :func:`decode_rows_numpy` decodes at a time (its temporaries stay a few megabytes)."""


def decode_rows_numpy(buf, base, shape, strides, p: QuantParams, axis: int, out_kind: int, out) -> None:
    """What the affine-layout decode kernels write into ``out`` (:func:`decode_rows`, :func:`decode_rows_lut`,
    :func:`decode_rows_int4`), computed with NumPy: the same formula in the same types (``q - zero_point``
    wrapping in int32, its float32 times the float32 scale, or the scale times the table's float32
    value), then one rounding to float16 / bfloat16 by NumPy's and ml_dtypes' casts (to nearest even,
    the kernels' rounding).  For a process whose kernel cache does not hold the kernel: a one-off decode.
    Whole rows (last-axis runs) at a time, about :data:`NUMPY_DECODE_STEP` elements."""
    shape = tuple(int(n) for n in shape)
    strides = [int(n) for n in strides]
    cols = shape[-1]
    rows = out.size // cols if cols else 0
    flat = out.reshape(-1)
    step = max(1, NUMPY_DECODE_STEP // max(cols, 1))
    columns = np.arange(cols, dtype=np.int64)
    for first in range(0, rows, step):
        row = np.arange(first, min(rows, first + step), dtype=np.int64)
        lead = np.unravel_index(row, shape[:-1]) if len(shape) > 1 else ()
        start = sum((c * s for c, s in zip(lead, strides)), np.zeros(row.size, np.int64))
        codes = codes_at(buf, base, start[:, None] + columns[None, :] * strides[-1], p.bits)
        values = _dequantized(codes, _row_param_indices(p, axis, shape, row, lead, columns), p)
        flat[first * cols:(first + row.size) * cols] = _rounded(values, out_kind).reshape(-1)


def _row_param_indices(p: QuantParams, axis: int, shape, row, lead, columns) -> np.ndarray:
    """Parameter index of each element of rows ``row`` (their leading coordinates ``lead``), broadcastable
    to (rows, columns): ``quantization/per-block-affine.md § Block Layout``'s ``outer * nb + i // K``."""
    last = len(shape) - 1
    if p.pk == PK_TENSOR:
        return np.zeros((1, 1), np.int64)
    if p.pk == PK_CHANNEL:
        return columns[None, :] if axis == last else lead[axis][:, None]
    if axis == last:
        return row[:, None] * p.nb + (columns // p.block)[None, :]
    outer = np.zeros(row.size, np.int64)
    for d in range(last):
        if d != axis:
            outer = outer * shape[d] + lead[d]
    return (outer[:, None] * shape[last] + columns[None, :]) * p.nb + (lead[axis] // p.block)[:, None]


def _dequantized(codes: np.ndarray, pi: np.ndarray, p: QuantParams) -> np.ndarray:
    """float32 values of ``codes`` under parameter sets ``pi`` (:func:`_value`'s formula)."""
    if p.valmode != VAL_INT:
        return p.scales[pi] * p.table[codes.astype(np.intp)]
    value = codes.astype(np.int64)
    if p.signed and p.bits < 64:
        value -= ((value >> (p.bits - 1)) & 1) << p.bits
    zero = p.zps[pi] if p.zps.size > 1 else p.zps[0]
    return (value - zero).astype(np.int32).astype(np.float32) * p.scales[pi]


def _rounded(values: np.ndarray, out_kind: int) -> np.ndarray:
    """float32 ``values`` as the kernels store them: float32, or float16 / bfloat16 bits."""
    if out_kind == OUT_F32:
        return values
    half = numpy_dtype(ElementType.FLOAT16 if out_kind == OUT_F16 else ElementType.BFLOAT16)
    return values.astype(half).view(np.uint16)


def decode_rows(buf, base, shape, strides, valmode, bits, signed, table, scales, zps, pk, axis, block, nb,
                out_kind, out) -> None:
    """Affine-layout decode: logical C order ``out`` from codes at ``base`` + sum(i_k * strides[k])."""
    rows = out.size // int(shape[-1]) if shape[-1] else 0
    units, count = _units(rows, out.size)
    jit.run_parallel(rows_kernel(ROWS_ANY, out_kind), units, buf, np.int64(base), shape, strides, valmode, bits,
                     signed, table, scales, zps, pk, axis, block, nb, out, count=count)


@jit.kernel(*_signatures(f"i64[:], u8[:], i64, i64[:], i64[:], {_PARAMETERS}, OUT"))
def _decode_gather(work, buf, base, offsets, pidx, valmode, bits, signed, table, scales, zps, out):
    while True:
        first, stop = claim_span(work, out.size)
        if first == stop:
            break
        for i in range(first, stop):
            _store(out, i, _value(load_code(buf, base, offsets[i], bits), pidx[i], valmode, bits, signed,
                                  table, scales, zps))


def decode_gather(buf, base, offsets, pidx, valmode, bits, signed, table, scales, zps, out_kind, out) -> None:
    """Decode ``out[i]`` from the code at element ``offsets[i]`` with parameters ``pidx[i]``."""
    units, count = _units(out.size, out.size)
    jit.run_parallel(_decode_gather.variant(OUT=out_kind), units, buf, np.int64(base), offsets, pidx, valmode, bits,
                     signed, table, scales, zps, out, count=count)


@jit.helper
def _build_lut(lut, pi, ncode, valmode, signed, table, scales, zps):
    """The decoded value of every code under parameter set ``pi`` (same formula as :func:`_value`)."""
    s = scales[pi]
    z = np.int64(zps[pi]) if zps.size > 1 else np.int64(zps[0])
    half = ncode >> 1
    if OUT == OUT_F16 and valmode == VAL_INT and np.abs(s) <= np.float32(3.4028235e38):
        # finite scale times a finite integer is never NaN: straight-line conversion
        for c in range(ncode):
            v = np.int64(c - ncode) if (signed and c >= half) else np.int64(c)
            lut[c] = f32_to_f16_not_nan(np.float32(np.float32(np.int32(v - z)) * s))
        return
    for c in range(ncode):
        if valmode == VAL_INT:
            v = np.int64(c - ncode) if (signed and c >= half) else np.int64(c)
            x = np.float32(np.float32(np.int32(v - z)) * s)
        else:
            x = np.float32(s * table[c])
        _store(lut, c, x)


LUT_SIZE = 16
"""Entries of a lookup table: the codes of a 4-bit type (1- and 2-bit types use the first ones)."""


@jit.kernel(*_signatures(f"i64[:], u8[:], i64, i64[:], i64[:], {_PARAMETERS}, i64, i64, i64, i64, OUT, OUT_SCRATCH"))
def _decode_rows_lut(work, buf, base, shape, strides, valmode, bits, signed, table, scales, zps,
                     pk, axis, block, nb, out, luts):
    r = shape.size
    cols = shape[r - 1]
    rows = out.size // cols if cols else 0
    sl = strides[r - 1]
    ncode = 1 << bits
    shift = 3 if bits == 1 else (2 if bits == 2 else 1)  # log2(elements per byte)
    emask = (1 << shift) - 1
    cmask = np.uint8(ncode - 1)
    mine = slot(work)
    lut = luts[mine]
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for row in range(first, stop):
            off, i_axis, outer_na = _row_origin(row, shape, strides, axis)
            o = row * cols
            j = np.int64(0)
            while j < cols:
                if pk == PK_BLOCK:
                    pi = row * nb + j // block
                    end = min(cols, (j // block + 1) * block)
                elif pk == PK_CHANNEL:
                    pi = i_axis
                    end = cols
                else:
                    pi = np.int64(0)
                    end = cols
                _build_lut(lut, pi, ncode, valmode, signed, table, scales, zps)
                jj = j
                if bits == 4 and sl == 1:
                    e = off + jj
                    if e & 1:  # odd start: one high nibble first
                        out[o + jj] = lut[buf[base + (e >> 1)] >> np.uint8(4)]
                        jj += 1
                    e = np.uint64(base + ((off + jj) >> 1))  # unsigned indices: no wrap-around checks
                    npairs = (end - jj) >> 1
                    d = np.uint64(o + jj)
                    for k in range(np.uint64(npairs)):  # two elements per byte: low nibble first
                        b = buf[e + k]
                        out[d + 2 * k] = lut[b & np.uint8(15)]
                        out[d + 2 * k + np.uint64(1)] = lut[b >> np.uint8(4)]
                    jj += 2 * npairs
                for jx in range(jj, end):
                    e = off + jx * sl
                    b = buf[base + (e >> shift)]
                    out[o + jx] = lut[(b >> np.uint8((e & emask) * bits)) & cmask]
                j = end


def decode_rows_lut(buf, base, shape, strides, valmode, bits, signed, table, scales, zps, pk, axis, block, nb,
                    out_kind, out) -> None:
    """Affine-layout decode of 1/2/4-bit codes whose parameters are constant over runs of a row
    (per-tensor, per-channel off the last axis, per-block along the last axis): per run, the
    ``2**bits`` possible results are computed once (same formula, same rounding as
    :func:`decode_rows`), then every element is a table lookup."""
    rows = out.size // int(shape[-1]) if shape[-1] else 0
    units, count = _units(rows, out.size)
    jit.run_parallel(rows_kernel(ROWS_LUT, out_kind), units, buf, np.int64(base), shape, strides, valmode,
                     bits, signed, table, scales, zps, pk, axis, block, nb, out, count=count,
                     scratch=(jit.Scratch(LUT_SIZE, out.dtype),))  # the lookup tables, a row per thread


# ------------------------------------------------------------------------------------
# 4-bit codes, vector steps (dequantize_simd.py), with an optional sparse patch fused in
# ------------------------------------------------------------------------------------

NO_PATCH, PATCH_REPLACE, PATCH_ADD = int(CombineOp.NONE), int(CombineOp.REPLACE), int(CombineOp.ADD)
"""``patch_combine`` of :func:`decode_rows_int4`: no patch, or the head's ``combine_op`` (plain ints
for the kernel)."""
_FLT_MAX = np.float32(3.4028235e38)


def int4_vector_ok(p: QuantParams, axis_is_last: bool, last_stride: int, out_kind: int) -> bool:
    """:func:`decode_rows_int4` applies: 4-bit integer codes contiguous along the last axis, parameters
    constant over runs of a row (per-tensor, per-channel off the last axis, per-block along it),
    and a vector step for the output type on this host.  Blocks shorter than a step go to
    :func:`decode_rows_lut`."""
    runs = p.pk == PK_TENSOR or (p.pk == PK_CHANNEL and not axis_is_last) \
        or (p.pk == PK_BLOCK and axis_is_last and p.block >= LANES)
    return (p.bits == 4 and p.valmode == VAL_INT and last_stride == 1 and runs
            and (out_kind != OUT_F16 or vector_f16()))


@jit.helper
def _int4_scalar(buf, e, s, z, signed, out, o):
    """Code at nibble ``e`` -> ``out[o]``: the formula of :func:`_value`, rounded as :func:`_store` does."""
    b = buf[e >> 1]
    q = np.int64(b >> np.uint8(4)) if e & 1 else np.int64(b & np.uint8(15))
    if signed and q >= 8:
        q -= 16
    _store(out, o, np.float32(np.float32(np.int32(q - np.int64(z))) * s))


@jit.helper
def _int4_run(buf, e, n, signed, s, z, out, o):
    """Decode the ``n`` codes from nibble ``e`` of ``buf`` into ``out[o:o + n]`` under scale ``s`` and zero
    point ``z``: vector steps over whole 16-byte groups; the exact scalar formula for an odd first nibble,
    the tail, and a non-finite scale (whose NaN rules the steps do not model)."""
    k = np.int64(0)
    if np.abs(s) <= _FLT_MAX:
        if e & 1:
            _int4_scalar(buf, e, s, z, signed, out, o)
            k = np.int64(1)
        byte = (e + k) >> 1
        while k + LANES <= n:
            int4x32(buf, byte, s, z, out, o + k, signed)
            byte += LANES // 2
            k += LANES
    for i in range(k, n):
        _int4_scalar(buf, e + i, s, z, signed, out, o + i)


@jit.helper
def _patch_row(out, lo, hi, lin, vals):
    """The entries of a sparse correction whose flat indices lie in ``[lo, hi)`` (``lin`` strictly
    increasing) applied to ``out`` (``layouts/composite.md § Overlay``): replace, or add rounded to the
    head type (float16 / bfloat16 bits, or float32 with NumPy's NaN choice made explicit, like
    merge._add_native)."""
    k = search_left(lin, lo)
    while k < lin.size and lin[k] < hi:
        i = lin[k]
        if PATCH == PATCH_REPLACE:
            out[i] = vals[k]
        elif OUT == OUT_F16:
            out[i] = f16_add(out[i], vals[k])
        elif OUT == OUT_BF16:
            out[i] = bf16_add(out[i], vals[k])
        else:
            a, b = out[i], vals[k]
            out[i] = b + b if b != b else (a + a if a != a else a + b)
        k += 1


PATCH = NO_PATCH
"""The sparse correction a 4-bit decode kernel applies as it goes: a compile-time constant of each
variant (``variant(PATCH=...)``), so that a plain decode holds no correction code."""


@jit.kernel(*_signatures("i64[:], u8[:], i64, i64[:], i64[:], i64, f32[:], i32[:], i64, i64, i64, i64, OUT, "
                         "i64[:], OUT"))
def _decode_rows_int4(work, buf, base, shape, strides, signed, scales, zps, pk, axis, block, nb, out,
                      patch_lin, patch_vals):
    r = shape.size
    cols = shape[r - 1]
    rows = out.size // cols if cols else 0
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for row in range(first, stop):
            off, i_axis, outer_na = _row_origin(row, shape, strides, axis)
            o = row * cols
            e = 2 * base + off  # nibble index of the row's first code
            if pk == PK_BLOCK:  # along the row: block bk holds columns [bk * block, (bk + 1) * block)
                for bk in range(nb):
                    pi = row * nb + bk
                    j = bk * block
                    z = zps[pi] if zps.size > 1 else zps[0]
                    _int4_run(buf, e + j, min(block, cols - j), signed, scales[pi], z, out, o + j)
            else:
                pi = i_axis if pk == PK_CHANNEL else np.int64(0)
                z = zps[pi] if zps.size > 1 else zps[0]
                _int4_run(buf, e, cols, signed, scales[pi], z, out, o)
            if PATCH != NO_PATCH:
                _patch_row(out, o, o + cols, patch_lin, patch_vals)


def decode_rows_int4(buf, base, shape, strides, signed, scales, zps, pk, axis, block, nb, out_kind, out,
                     patch_lin, patch_vals, patch_combine) -> None:
    """:func:`decode_rows_lut` for 4-bit integer codes (see :func:`int4_vector_ok`), in vector steps.

    With ``patch_combine`` != ``NO_PATCH``, the entries of a sparse correction (flat indices into
    ``out``, strictly increasing, and values) that fall in a row are applied right after the row is
    decoded, while it is still in cache: the output is written in one pass.
    """
    rows = out.size // int(shape[-1]) if shape[-1] else 0
    units, count = _units(rows, out.size)
    kernel = rows_kernel(ROWS_INT4, out_kind, patch_combine)
    jit.run_parallel(kernel, units, buf, np.int64(base), shape, strides, signed, scales, zps, pk, axis, block, nb,
                     out, patch_lin, patch_vals, count=count)


ROWS_ANY, ROWS_LUT, ROWS_INT4 = "any", "lut", "int4"
"""The affine-layout decode kernels: :func:`decode_rows`, :func:`decode_rows_lut`, :func:`decode_rows_int4`."""


@functools.cache
def rows_kernel(which: str, out_kind: int, patch_combine: int = NO_PATCH) -> jit.Kernel:
    """The kernel variant an affine-layout decode runs (``which``: :data:`ROWS_ANY`, ...); kept, as a
    region read asks for it on every call."""
    if which == ROWS_INT4:
        return _decode_rows_int4.variant(OUT=out_kind, PATCH=int(patch_combine))
    return (_decode_rows_lut if which == ROWS_LUT else _decode_rows).variant(OUT=out_kind)
