"""Quantization kernels: the exact counterpart of the dequantization in :mod:`.quant`.

Arrays in, codes / scales / zero points out; descriptors are built by
:mod:`hurray_schema.io.produce`.  Every value is first taken to float32 (float16 / bfloat16
inputs widened exactly on their bits), as the dequantization formulas compute in float32
(``quantization/per-block-affine.md § Dequantization Formula``).

* Affine (per-tensor, per-channel, per-block): the scale is the smallest value of the scale
  type at or above ``absmax / hi`` (symmetric) or ``(max - min) / (hi - lo)`` over a range
  widened to contain 0 (asymmetric), so no element is clipped; ``z = lo - rint(min / s)``;
  the code is ``clamp(rint(x / s) + z, lo, hi)`` in float32 with ties to even -- the inverse
  of ``float32(int32(q - z)) * s``.  A block without a non-zero value gets scale 1.
* NF4 (``quantization/nf4.md``): ``s`` = the block's float32 absmax (1 for an all-zero
  block); the code is the one whose decoded value ``s * nf4[q]`` (float32) is nearest to
  ``x``, the lower code on a tie.
* MXFP (``quantization/mxfp.md``): the shared exponent is the smallest ``e`` in [1, 254]
  with ``absmax <= 2**(e - 127) * max_element`` (127 for an all-zero block); ``y = x / s``
  is rounded to the nearest element value, ties to the even code (round to nearest even
  for the float element types), integers with :func:`numpy.rint` and clamped.

Blocks run along the last axis of a ``rows x cols`` view (``b = row * nb + col // K``,
``quantization/per-block-affine.md § Block Layout``); :func:`block_view` moves the
quantized axis there and :func:`restore_layout` moves the codes back.  Codes are written
straight into their packed storage (``element-types.md § Sub-Byte Integer Types``: LSB
first, 6-bit types four in three bytes) with the block axis padded to whole blocks and the
padding left as zero bytes (``per-block-affine.md § Padding``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import HurraySchemaError
from ..model import ElementType
from ..structs.element_types import element_type_info, element_type_of
from ..structs.quantization import NF4_LEVELS
from . import jit
from .jit import claim_span, search_left, slot
from .elements import (_f16_to_f32_hw, _f32_to_f16_hw, bf16_to_f32, f16_to_f32_fast, f16_to_f32_not_nan, f32_to_bf16,
                       f32_to_f16_fast, float32_bits, float32_from_bits, has_f16c, minifloat_table)
from .quantize_simd import LANES as SIMD_LANES
from .quantize_simd import (block_codes_bf16, block_codes_f16, block_minmax_bf16, block_minmax_f16,
                            block_minmax_masked_bf16, block_minmax_masked_f16, vector_f16)

__all__ = ["IN_F32", "IN_F16", "IN_BF16", "SCALE_KINDS", "input_kind", "block_view", "restore_layout",
           "storage_bytes", "code_range", "affine_block_stats", "affine_block_params", "affine_codes",
           "affine_quantize", "spqr_outliers", "nf4_quantize", "mxfp_quantize", "mxfp_element_max", "pack_codes",
           "NF4_TABLE", "nibble_records", "RECORD_EXACT", "RECORD_ZERO_SCALE",
           "RECORD_ZERO_BOTH_SIGNS", "RECORD_NOT_FINITE"]

IN_F32, IN_F16, IN_BF16 = 0, 1, 2
SCALE_F32, SCALE_F16, SCALE_BF16 = 0, 1, 2
IN, SCALE, SYMMETRIC = IN_F32, SCALE_F32, True
"""The input kind, the scale type and the symmetry a quantizer kernel is compiled for: compile-time
constants of each of its variants (``kernel.variant(IN=..., SCALE=..., SYMMETRIC=...)``), so that its
loops are specialized to them and hold no code for the others."""
SCALE_KINDS = {ElementType.FLOAT32: SCALE_F32, ElementType.FLOAT16: SCALE_F16, ElementType.BFLOAT16: SCALE_BF16}
"""Scale element type -> the kernels' code for it."""

NF4_TABLE = np.array(NF4_LEVELS, np.float32)
NF4_TABLE.flags.writeable = False

_FLOAT32_INTEGERS = 1 << 24
"""float32 represents every integer up to this magnitude (24-bit significand)."""
_FLT_MAX = np.float32(3.4028235e38)


# ------------------------------------------------------------------------------------
# Arrays to rows x cols and back
# ------------------------------------------------------------------------------------


_INPUT_KINDS = {ElementType.FLOAT16: IN_F16, ElementType.BFLOAT16: IN_BF16}
"""The 16-bit float types the kernels read as bits."""


def input_kind(array: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat C-order bit patterns the kernels read, their kind): float16 / bfloat16 as uint16,
    float32 as uint32; any other type is converted to float32 first."""
    arr = np.ascontiguousarray(array)
    kind = _INPUT_KINDS.get(element_type_of(arr.dtype))
    if kind is not None:
        return arr.reshape(-1).view(np.uint16), kind
    return np.ascontiguousarray(arr, np.float32).reshape(-1).view(np.uint32), IN_F32


def block_view(array: np.ndarray, axis: int) -> np.ndarray:
    """``array`` with ``axis`` moved last and the other axes flattened in row-major order into rows
    (the ``outer`` index of ``§ Block Layout``); a copy only when the axis is not last already."""
    moved = np.moveaxis(np.asarray(array), axis, -1)
    cols = moved.shape[-1] if moved.ndim else 1
    rows = math.prod(moved.shape[:-1]) if moved.ndim else 1
    return np.ascontiguousarray(moved).reshape(rows, cols)


def restore_layout(codes: np.ndarray, shape, axis: int) -> np.ndarray:
    """Codes computed on :func:`block_view` rows (``rows x padded``) back in row-major order of
    ``shape`` with ``axis`` padded to ``codes.shape[1]``."""
    moved = list(np.moveaxis(np.empty(tuple(shape), np.uint8), axis, -1).shape)
    moved[-1] = codes.shape[1]
    return np.ascontiguousarray(np.moveaxis(codes.reshape(moved), -1, axis))


def storage_bytes(count: int, bits: int) -> int:
    return -(-count // 4) * 3 if bits == 6 else -(-count * bits // 8)


def code_range(storage, symmetric: bool) -> tuple[int, int]:
    """[lo, hi] codes the affine quantizer uses: the storage type's range, narrowed for 32-bit types
    so that every quotient ``x / s`` it rounds is below 2**24 in magnitude, where float32 still holds
    every integer (then ``q - z`` is an int32 too, as the formula subtracts in int32)."""
    info = element_type_info(storage)
    bits = info.bit_width
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if info.is_signed else (0, (1 << bits) - 1)
    if symmetric:
        return max(lo, -_FLOAT32_INTEGERS), min(hi, _FLOAT32_INTEGERS - 1)
    if hi - lo > _FLOAT32_INTEGERS - 1:
        lo, hi = (-(_FLOAT32_INTEGERS >> 1), (_FLOAT32_INTEGERS >> 1) - 1) if info.is_signed \
            else (0, _FLOAT32_INTEGERS - 1)
    return lo, hi


# ------------------------------------------------------------------------------------
# Scalar steps (helpers of the kernels)
# ------------------------------------------------------------------------------------

MINMAX_FLAGS = frozenset({"nnan", "nsz"})
"""Fast-math flags of the kernels that reduce min / max: no NaN reaches their float arithmetic (NaN and
infinity are detected on the bits and the block is refused) and the sign of a zero never changes a
code, so the compiler may vectorize the reductions; no flag that would reorder or approximate the
quantization arithmetic itself (``x / s`` stays a correctly rounded division)."""



@jit.helper
def _load(x, i):
    """float32 value of element ``i`` (exact; a NaN keeps its payload)."""
    if IN == IN_F16:
        return f16_to_f32_fast(np.uint16(x[i]))
    if IN == IN_BF16:
        return bf16_to_f32(np.uint16(x[i]))
    return float32_from_bits(x[i])


@jit.helper
def _load_finite_hw(x, i):
    """:func:`_load` for an element known to be finite: branch-free, so loops over it vectorize."""
    if IN == IN_F16:
        return _f16_to_f32_hw(np.uint16(x[i]))
    if IN == IN_BF16:
        return bf16_to_f32(np.uint16(x[i]))
    return float32_from_bits(x[i])


_load_finite = jit.choose(lambda: _load_finite_hw if has_f16c() else _load, _load_finite_hw.py_func)
"""The value of an element known to be finite: branch-free where the host widens float16 in hardware."""


@jit.helper
def _exponent_mask():
    if IN == IN_F16:
        return np.uint32(0x7C00)
    if IN == IN_BF16:
        return np.uint32(0x7F80)
    return np.uint32(0x7F800000)


@jit.helper(fastmath=set(MINMAX_FLAGS))
def _minmax(x, start, n, mask, use_mask):
    """(min, max, any NaN / infinity) of ``x[start:start + n]`` leaving out masked elements (min > max
    when none is left).  Branch-free, NaN and infinity found on the bits (an exponent of all ones),
    so that the loops vectorize in kernels compiled with :data:`MINMAX_FLAGS`."""
    lo = np.float32(np.inf)
    hi = np.float32(-np.inf)
    emask = _exponent_mask()
    special = np.uint32(0)
    first = np.int64(start)
    if use_mask:
        for k in range(np.int64(n)):
            b = np.uint32(x[first + k])
            v = _load_finite(x, first + k)
            keep = not mask[first + k]
            lo = min(lo, v if keep else np.float32(np.inf))
            hi = max(hi, v if keep else np.float32(-np.inf))
            special |= np.uint32(((b & emask) == emask) and keep)
    else:
        for k in range(np.int64(n)):
            b = np.uint32(x[first + k])
            v = _load_finite(x, first + k)
            lo = min(lo, v)
            hi = max(hi, v)
            special |= np.uint32((b & emask) == emask)
    return lo, hi, special != 0


@jit.helper
def _finite(v):
    return np.abs(v) <= _FLT_MAX


@jit.helper
def _round_up_scale(s64):
    """The smallest value of the scale type (float32 / float16 / bfloat16) >= ``s64`` > 0, as float32
    (infinity when ``s64`` is past the type's range)."""
    if SCALE == SCALE_F16:
        h = f32_to_f16_fast(np.float32(s64))
        if np.float64(f16_to_f32_fast(h)) < s64:
            h = np.uint16(h + np.uint16(1))
        return f16_to_f32_fast(h)
    if SCALE == SCALE_BF16:
        h = f32_to_bf16(np.float32(s64))
        if np.float64(bf16_to_f32(h)) < s64:
            h = np.uint16(h + np.uint16(1))
        return bf16_to_f32(h)
    v = np.float32(s64)
    if np.float64(v) < s64:
        v = float32_from_bits(float32_bits(v) + np.uint32(1))
    return v


@jit.helper
def _affine_param(mn, mx, lo, hi):
    """(scale as float32, zero point) of one parameter set from the min / max of its elements
    (``mn > mx`` when it has none)."""
    if mn > mx:
        mn = np.float32(0.0)
        mx = np.float32(0.0)
    if SYMMETRIC:
        s64 = max(abs(np.float64(mn)), abs(np.float64(mx))) / np.float64(hi)
    else:
        mn = min(mn, np.float32(0.0))
        mx = max(mx, np.float32(0.0))
        s64 = (np.float64(mx) - np.float64(mn)) / np.float64(hi - lo)
    s = np.float32(1.0) if s64 == 0.0 else _round_up_scale(s64)
    z = np.int64(0)
    if not SYMMETRIC and _finite(s):
        z = min(max(np.int64(lo) - np.int64(np.rint(mn / s)), np.int64(lo)), np.int64(hi))
    return s, z


@jit.helper
def _f16_round_lanes_hw(x):
    """float32 -> float16 bits, round to nearest even: :func:`f32_to_f16_fast` for a non-NaN ``x``, branch-free."""
    return _f32_to_f16_hw(x)


@jit.helper
def _f16_widen_lanes_hw(h):
    """float16 bits -> float32: :func:`f16_to_f32_fast` for a non-NaN pattern, branch-free."""
    return _f16_to_f32_hw(h)


_f16_round_lanes = jit.choose(lambda: _f16_round_lanes_hw if has_f16c() else f32_to_f16_fast,
                              _f16_round_lanes_hw.py_func)
_f16_widen_lanes = jit.choose(lambda: _f16_widen_lanes_hw if has_f16c() else f16_to_f32_fast,
                              _f16_widen_lanes_hw.py_func)


@jit.helper
def _round_up_scale_lanes(s64):
    """:func:`_round_up_scale` for a non-NaN ``s64`` >= 0 written without branches (a comparison added as
    0 or 1 to the bits), so that a loop over blocks vectorizes; the same rounding steps, the same result."""
    if SCALE == SCALE_F16:
        h = _f16_round_lanes(np.float32(s64))
        h = np.uint16(h + np.uint16(np.float64(_f16_widen_lanes(h)) < s64))
        return _f16_widen_lanes(h)
    if SCALE == SCALE_BF16:
        f = float32_bits(np.float32(s64))  # f32_to_bf16's rounding, its NaN case left out
        h = np.uint16((f + np.uint32(0x7FFF) + ((f >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
        h = np.uint16(h + np.uint16(np.float64(bf16_to_f32(h)) < s64))
        return bf16_to_f32(h)
    v = np.float32(s64)
    return float32_from_bits(float32_bits(v) + np.uint32(np.float64(v) < s64))


@jit.helper
def _affine_param_lanes(mn, mx, lo, hi):
    """:func:`_affine_param` for finite ``mn``, ``mx`` (or ``mn > mx``: no element), with selects for its
    branches: the same scale and zero point."""
    empty = mn > mx
    mn = np.float32(0.0) if empty else mn
    mx = np.float32(0.0) if empty else mx
    if SYMMETRIC:
        s64 = max(abs(np.float64(mn)), abs(np.float64(mx))) / np.float64(hi)
    else:
        mn = min(mn, np.float32(0.0))
        mx = max(mx, np.float32(0.0))
        s64 = (np.float64(mx) - np.float64(mn)) / np.float64(hi - lo)
    s = _round_up_scale_lanes(s64)
    s = np.float32(1.0) if s64 == 0.0 else s
    z = np.int64(0)
    if not SYMMETRIC:
        fine = _finite(s)
        q = np.rint(mn / s)
        q = q if fine else q - q  # an overflowed scale has zero point 0 (q - q: 0 of q's type)
        z = min(max(np.int64(lo) - np.int64(q), np.int64(lo)), np.int64(hi))
        z = z if fine else np.int64(0)
    return s, z


@jit.helper
def _affine_params_row(mins, maxs, nb, lo, hi, scales, zps, first):
    """Scale and zero point of the ``nb`` blocks of a row (statistics ``mins[:nb]``, ``maxs[:nb]``, all
    finite) into ``scales`` / ``zps`` from ``first`` on: one branch-free loop (the symmetry and the scale
    type are constants of the kernel's variant), so that it vectorizes."""
    for b in range(nb):
        s, z = _affine_param_lanes(mins[b], maxs[b], lo, hi)
        scales[first + b] = s
        zps[first + b] = z


@jit.helper
def _affine_code(v, s, z, lo, hi):
    """``clamp(rint(v / s) + z, lo, hi)``: v / s in float32, ties to even."""
    q = np.int64(np.rint(np.float32(v / s))) + z
    return min(max(q, np.int64(lo)), np.int64(hi))


@jit.helper
def _put(out, e, code, bits):
    """Store ``code`` (its low ``bits`` bits) as element ``e`` of a zeroed packed byte buffer; whole-byte
    and wider codes as ``bits // 8`` little-endian bytes (``out`` is the storage array's bytes)."""
    if bits >= 8:
        v = np.uint64(code)
        width = bits // 8
        for k in range(width):
            out[e * width + k] = np.uint8((v >> np.uint64(8 * k)) & np.uint64(255))
    elif bits == 6:
        g = (e >> 2) * 3
        w = (np.uint32(code) & np.uint32(63)) << np.uint32(6 * (e & 3))
        out[g] |= np.uint8(w & np.uint32(255))
        out[g + 1] |= np.uint8((w >> np.uint32(8)) & np.uint32(255))
        out[g + 2] |= np.uint8(w >> np.uint32(16))
    else:
        shift = 3 if bits == 1 else (2 if bits == 2 else 1)
        c = np.uint8(np.uint64(code) & np.uint64((1 << bits) - 1))
        out[e >> shift] |= np.uint8(c << np.uint8((e & ((1 << shift) - 1)) * bits))


# ------------------------------------------------------------------------------------
# Row kernels: threads claim units of rows (whole rows own whole bytes of the output; where
# they do not, one thread runs them all)
# ------------------------------------------------------------------------------------

ROW_UNITS = 64
"""Runs of rows a parallel row kernel is cut into (a thread takes the next one when it is free)."""

PARALLEL_MIN_ELEMENTS = 1 << 15
"""Fewer elements than this are quantized on the calling thread alone."""


def _x_signatures(arguments: str) -> tuple[str, ...]:
    """A row kernel's signatures: its input ``X`` as float16 / bfloat16 bits, or as float32 bits."""
    return tuple(f"void({arguments.replace('X', bits)})" for bits in ("u16[:]", "u32[:]"))


def _run_rows(kernel, rows: int, cols: int, parallel: bool, *args, scratch: tuple = ()) -> None:
    """``kernel`` over ``rows`` rows: in units of rows on the configured threads, or on one thread
    (``scratch``: :class:`~.jit.Scratch` rows the kernel takes per thread, after ``args``)."""
    if parallel and rows > 1 and rows * cols >= PARALLEL_MIN_ELEMENTS:
        jit.run_parallel(kernel, min(rows, ROW_UNITS), *args, scratch=scratch)
    else:
        jit.run_parallel(kernel, 1, *args, count=1, scratch=scratch)


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, b1[:], b1, f32[:], f32[:], u8[:]"), fastmath=set(MINMAX_FLAGS))
def _affine_stats(work, x, rows, cols, block, mask, use_mask, mins, maxs, bad):
    """Min / max of every block of every row (masked elements left out), NaN / infinity flagged."""
    nb = (cols + block - 1) // block if cols else 0
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for r in range(first, stop):
            for b in range(nb):
                j0 = b * block
                mn, mx, special = _minmax(x, r * cols + j0, min(cols, j0 + block) - j0, mask, use_mask)
                if special:
                    bad[0] = 1
                mins[r * nb + b] = mn
                maxs[r * nb + b] = mx


@jit.kernel("i64(f32[:], f32[:], i64, i64, f32[:], i32[:])")
def _affine_params(mins, maxs, lo, hi, scales, zps):
    """Scale and zero point of every parameter set; returns how many scales overflowed their type."""
    over = 0
    for k in range(mins.size):
        s, z = _affine_param(mins[k], maxs[k], lo, hi)
        scales[k] = s
        zps[k] = z
        if not _finite(s):
            over += 1
    return over


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, i64, f32[:], i32[:], i64, i64, i64, u8[:]"))
def _affine_codes(work, x, rows, cols, block, padded, scales, zps, lo, hi, bits, out):
    """Codes of every element (row ``r`` holds parameters ``r * nb + j // block``) into ``out``."""
    nb = (cols + block - 1) // block if cols else 0
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for r in range(first, stop):
            for b in range(nb):
                s = scales[r * nb + b]
                z = np.int64(zps[r * nb + b])
                for j in range(b * block, min(cols, (b + 1) * block)):
                    _put(out, r * padded + j, _affine_code(_load(x, r * cols + j), s, z, lo, hi), bits)


@jit.helper
def _int4_block(x, start, n, mask, use_mask, lo, hi, codes, out, dst):
    """One block of :func:`_affine_rows_int4`: returns (scale, zero point, all finite)."""
    mn, mx, special = _minmax(x, start, n, mask, use_mask)
    if special:
        return np.float32(1.0), np.int64(0), False
    s, z = _affine_param(mn, mx, lo, hi)
    qlo = np.float32(lo - z)
    qhi = np.float32(hi - z)
    z32 = np.int32(z)
    src = np.uint64(start)
    for k in range(np.uint64(n)):
        y = np.rint(np.float32(_load_finite(x, src + k) / s))
        codes[k] = np.int32(min(max(y, qlo), qhi)) + z32
    codes[n] = 0  # the high nibble of an odd-length block's last byte
    for k in range(np.uint64((n + 1) // 2)):
        out[dst + k] = np.uint8((codes[2 * k] & 15) | ((codes[2 * k + 1] & 15) << 4))
    return s, z, True


@jit.helper
def _vector_minmax(x, start, n, mask, use_mask):
    """(min, max, NaN / infinity among the kept elements, among all elements) by the vector steps (a 32-bit
    ``x`` holds float32 whichever step reads it)."""
    if use_mask:
        if IN == IN_BF16:
            return block_minmax_masked_bf16(x, start, n, mask)
        return block_minmax_masked_f16(x, start, n, mask)
    if IN == IN_BF16:
        return block_minmax_bf16(x, start, n)
    return block_minmax_f16(x, start, n)


_BLOCK_VECTOR, _BLOCK_SCALAR, _BLOCK_REFUSED = 0, 1, 2
"""How :func:`_affine_rows_int4` codes a block once its parameters are known: by the vector steps
(scale and zero point already stored), by :func:`_int4_block` (which finds them itself), or not at
all (a NaN or an infinity among its kept elements)."""


@jit.helper
def _int4_row_params(x, row_start, cols, block, nb, mask, use_mask, lo, hi,
                     vector, f16_vector, scales, zps, first, paths, mins, maxs):
    """First pass over a row: each block's statistics by the vector steps of :mod:`.quantize_simd` where
    they apply (``vector``, the block length a multiple of their lanes, a float16 input only on hosts
    that widen float16 in hardware: ``f16_vector``), then the parameters of the row's blocks in one vectorized loop
    (:func:`_affine_params_row`), stored at ``first + b``, and the path each block's codes take.  A
    block refused here (a NaN or an infinity among its kept elements) gets scale 1 and zero point 0,
    as :func:`_int4_block` gives it; one whose only such elements are masked, or whose scale
    overflowed, is left to :func:`_int4_block`, which defines what it gets (the parameters of
    blocks off the vector path are computed from no element, then replaced)."""
    for b in range(nb):
        j0 = b * block
        n = min(cols, j0 + block) - j0
        path = _BLOCK_SCALAR
        mn = np.float32(np.inf)
        mx = np.float32(-np.inf)
        if vector and n % SIMD_LANES == 0 and (IN != IN_F16 or f16_vector):
            lo_, hi_, special, any_special = _vector_minmax(x, row_start + j0, n, mask, use_mask)
            if special:
                path = _BLOCK_REFUSED
            elif not any_special:
                path = _BLOCK_VECTOR
                mn = lo_
                mx = hi_
        mins[b] = mn
        maxs[b] = mx
        paths[b] = path
    _affine_params_row(mins, maxs, nb, lo, hi, scales, zps, first)
    for b in range(nb):
        if paths[b] == _BLOCK_REFUSED:
            scales[first + b] = np.float32(1.0)
            zps[first + b] = 0
        elif paths[b] == _BLOCK_VECTOR and not _finite(scales[first + b]):
            paths[b] = _BLOCK_SCALAR


@jit.helper
def _int4_row_codes(x, row_start, cols, block, nb, mask, use_mask, lo, hi,
                    scales, zps, first, paths, codes, out, row_dst):
    """Second pass over a row (still in cache): the codes of each block along its path, the vector steps
    prefetching the next row; returns whether no block was refused."""
    ok = True
    for b in range(nb):
        j0 = b * block
        n = min(cols, j0 + block) - j0
        dst = np.uint64(row_dst + j0 // 2)
        path = paths[b]
        if path == _BLOCK_VECTOR:
            s = scales[first + b]
            z = zps[first + b]
            qlo = np.float32(lo - z)
            qhi = np.float32(hi - z)
            if IN == IN_BF16:
                block_codes_bf16(x, row_start + j0, n, s, qlo, qhi, np.int32(z), out, dst, cols)
            else:
                block_codes_f16(x, row_start + j0, n, s, qlo, qhi, np.int32(z), out, dst, cols)
        else:
            fine = False
            if path == _BLOCK_SCALAR:
                s, z, fine = _int4_block(x, row_start + j0, n, mask, use_mask, lo, hi, codes, out, dst)
                scales[first + b] = s
                zps[first + b] = z
            if not fine:  # refused: zero bytes, whichever path refused it
                for k in range(np.uint64((n + 1) // 2)):
                    out[dst + k] = 0
            ok = ok and fine
    return ok


@jit.helper
def _int4_rows(x, r0, r1, cols, block, nb, row_bytes, mask, use_mask, lo, hi,
               vector, f16_vector, scales, zps, out, paths, mins, maxs, codes):
    """Rows ``r0 .. r1 - 1``, each its blocks' parameters then their codes, with one set of scratch arrays
    (``paths``, ``mins``, ``maxs`` of ``nb``, ``codes`` of ``block + 1``); every byte of each row's
    ``row_bytes`` is written (the padding past its codes as zeros), so ``out`` need not be zeroed.
    Returns whether no block was refused."""
    ok = True
    for r in range(r0, r1):
        _int4_row_params(x, r * cols, cols, block, nb, mask, use_mask, lo, hi,
                         vector, f16_vector, scales, zps, r * nb, paths, mins, maxs)
        fine = _int4_row_codes(x, r * cols, cols, block, nb, mask, use_mask, lo, hi, scales, zps, r * nb, paths, codes,
                               out, r * row_bytes)
        for k in range(r * row_bytes + (cols + 1) // 2, (r + 1) * row_bytes):
            out[k] = 0  # per-block-affine.md § Padding
        ok = ok and fine
    return ok


INT4_CHUNKS = 256
"""The fused 4-bit kernel cuts its rows into up to this many runs of whole rows, which its threads
take one at a time from a shared counter: a thread that other load on the machine holds up takes
fewer, instead of the others waiting for its fixed share."""


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, i64, b1[:], b1, i64, i64, f32[:], i32[:], u8[:], u8[:], b1, "
                           "b1, u8[:, :], f32[:, :], f32[:, :], i32[:, :]"), fastmath=set(MINMAX_FLAGS))
def _affine_rows_int4(work, x, rows, cols, block, padded, mask, use_mask, lo, hi,
                      scales, zps, bad, out, vector, f16_vector, paths, mins, maxs, codes):
    """Per-block affine along rows with 4-bit codes, two passes per row while it is in cache: the
    statistics (:func:`_minmax`) and parameters (:func:`_affine_param`) of every block of the row,
    then their codes (:func:`_affine_code`, here with the clamp done on the float32 quotient -- the
    same integers, as ``z`` and the bounds are small integers -- so that the loop vectorizes), two
    per byte.  Doing a row's parameters first lets them run as one vector loop instead of stalling
    each block's codes; every block gets the same values as in one pass.  ``block`` is even, so
    every block starts on a byte.  The threads take runs of whole rows (:data:`INT4_CHUNKS`), each
    with scratch arrays of its own (a slot of ``paths``, ``mins``, ``maxs`` and ``codes``).
    ``vector`` lets whole blocks take the explicit vector steps (:func:`_int4_row_params`, the same
    results); ``False`` keeps every block on the scalar path (:func:`_int4_block`)."""
    nb = (cols + block - 1) // block if cols else 0
    row_bytes = padded // 2
    mine = slot(work)
    own_paths, own_mins, own_maxs, own_codes = paths[mine], mins[mine], maxs[mine], codes[mine]
    while True:
        r0, r1 = claim_span(work, rows)
        if r0 == r1:
            break
        ok = _int4_rows(x, r0, r1, cols, block, nb, row_bytes, mask, use_mask, lo, hi, vector, f16_vector, scales, zps,
                        out, own_paths, own_mins, own_maxs, own_codes)
        if not ok:
            bad[0] = 1


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, i64, f32[:], f32[:], i64, u8[:], u8[:], f32[:, :]"))
def _nf4_rows(work, x, rows, cols, block, padded, table, scales, bits, bad, out, candidates):
    """NF4 absmax per block, then the nearest level of every element (``quantization/nf4.md``);
    ``candidates``: 16 values of scratch per thread."""
    nb = (cols + block - 1) // block if cols else 0
    mine = slot(work)
    cand = candidates[mine]
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for r in range(first, stop):
            _nf4_row(x, r, cols, block, nb, padded, table, scales, bits, bad, out, cand)


@jit.helper
def _nf4_row(x, r, cols, block, nb, padded, table, scales, bits, bad, out, cand):
    """Row ``r`` of :func:`_nf4_rows`."""
    for b in range(nb):
        j0, j1 = b * block, min(cols, (b + 1) * block)
        amax = np.float32(0.0)
        for j in range(j0, j1):
            v = _load(x, r * cols + j)
            if not _finite(v):
                bad[0] = 1
            amax = max(amax, np.abs(v))
        s = amax if amax > 0 else np.float32(1.0)
        scales[r * nb + b] = s
        for c in range(16):
            cand[c] = np.float32(s * table[c])
        for j in range(j0, j1):
            v = _load(x, r * cols + j)
            best = 0
            err = np.abs(cand[0] - v)
            for c in range(1, 16):
                d = np.abs(cand[c] - v)
                if d < err:
                    err = d
                    best = c
            _put(out, r * padded + j, best, bits)


@jit.helper
def _mx_exponent(amax, emax_value):
    """Smallest e in [1, 254] with amax <= 2**(e - 127) * emax_value (127 for amax == 0)."""
    if amax == 0:
        return np.int64(127)
    a = np.float64(amax)
    k = np.int64(np.ceil(np.log2(a / emax_value)))
    while a > emax_value * 2.0 ** k:
        k += 1
    while k > -126 and a <= emax_value * 2.0 ** (k - 1):
        k -= 1
    return min(max(np.int64(127) + k, np.int64(1)), np.int64(254))


@jit.helper
def _nearest_magnitude(a, mags):
    """Index of the value of ``mags`` (ascending) nearest to ``a`` >= 0, the even index on a tie."""
    k = search_left(mags, a)
    if k == 0:
        return np.int64(0)
    if k >= mags.size:
        return np.int64(mags.size - 1)
    below, above = a - mags[k - 1], mags[k] - a
    if below < above:
        return np.int64(k - 1)
    if above < below:
        return np.int64(k)
    return np.int64(k - 1) if (k - 1) % 2 == 0 else np.int64(k)


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, i64, f64, f32[:], i64, b1, i64, i64, i64, u8[:], u8[:], "
                           "u8[:]"))
def _mxfp_rows(work, x, rows, cols, block, padded, emax_value, mags, sign_code, is_int, lo, hi, bits,
               exps, bad, out):
    """MXFP shared exponent per block, then each element's code (``quantization/mxfp.md``)."""
    nb = cols // block if cols else 0
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for r in range(first, stop):
            _mxfp_row(x, r, cols, block, nb, padded, emax_value, mags, sign_code, is_int, lo, hi, bits,
                      exps, bad, out)


@jit.helper
def _mxfp_row(x, r, cols, block, nb, padded, emax_value, mags, sign_code, is_int, lo, hi, bits, exps,
              bad, out):
    """Row ``r`` of :func:`_mxfp_rows`."""
    for b in range(nb):
        j0, j1 = b * block, (b + 1) * block
        amax = np.float32(0.0)
        for j in range(j0, j1):
            v = _load(x, r * cols + j)
            if not _finite(v):
                bad[0] = 1
            amax = max(amax, np.abs(v))
        e = _mx_exponent(amax, emax_value)
        exps[r * nb + b] = e
        s = np.float32(2.0 ** (e - 127))
        for j in range(j0, j1):
            y = np.float32(_load(x, r * cols + j) / s)
            if is_int:
                code = min(max(np.int64(np.rint(y)), np.int64(lo)), np.int64(hi))
            else:
                code = _nearest_magnitude(np.abs(y), mags)
                if float32_bits(y) >> np.uint32(31):
                    code |= sign_code
            _put(out, r * padded + j, code, bits)


@jit.kernel(*_x_signatures("i64[:], X, i64, i64, i64, i64, f32[:], f32[:, :]"))
def _block_reference(work, x, rows, cols, block, rank, ref, tops):
    """Per block: the ``rank``-th largest magnitude (0 when the block has fewer elements); ``tops``:
    ``rank`` values of scratch per thread."""
    nb = (cols + block - 1) // block if cols else 0
    mine = slot(work)
    top = tops[mine]  # descending
    while True:
        first, stop = claim_span(work, rows)
        if first == stop:
            break
        for r in range(first, stop):
            _reference_row(x, r, cols, block, nb, rank, ref, top)


@jit.helper
def _reference_row(x, r, cols, block, nb, rank, ref, top):
    """Row ``r`` of :func:`_block_reference`."""
    for b in range(nb):
        top[:] = 0
        for j in range(b * block, min(cols, (b + 1) * block)):
            a = np.abs(_load(x, r * cols + j))
            if a > top[rank - 1]:
                k = rank - 1
                while k > 0 and top[k - 1] < a:
                    top[k] = top[k - 1]
                    k -= 1
                top[k] = a
        ref[r * nb + b] = top[rank - 1]


@jit.kernel("void(i64[:], u8[:], i64, u8[:])")
def _pack(work, codes, bits, out):
    """Pack one code per byte (``codes``, element order) into ``out`` (zeroed), by whole output groups."""
    per = 4 if bits == 6 else 8 // bits
    groups = (codes.size + per - 1) // per
    while True:
        first, stop = claim_span(work, groups)
        if first == stop:
            break
        for g in range(first, stop):
            for k in range(g * per, min(codes.size, (g + 1) * per)):
                _put(out, k, codes[k], bits)


RECORD_EXACT, RECORD_ZERO_SCALE, RECORD_ZERO_BOTH_SIGNS, RECORD_NOT_FINITE = 0, 1, 2, 3
"""Classes of a scaled nibble record (:func:`nibble_records`), in the order of precedence of a run's worst:
its float16 scale finite and non-zero; zero over codes of one sign; zero over codes of both signs;
infinite or NaN.  The first two have an exact per-block form, the others none."""

RECORD_BYTES, SCALE_AT, CODES_AT = 0, 0, 0
"""The record layout :func:`_nibble_records` is compiled for: compile-time constants of its variant
(a constant stride lets the compiler keep the loop tight: a stride passed as an argument made it ~3x
slower)."""

RECORDS_PARALLEL_MIN = 1 << 18
"""Fewer records than this are gone through on the calling thread alone: the loop is bound by memory
(a few GB/s), so waking other threads costs more than it saves on smaller runs."""

_NIBBLE_TOPS = 0x8888_8888_8888_8888  # bit 3 of every nibble: set where nibble - 8 >= 0


def _byte_pointer(context, builder, sig, args, bits):
    """An ``i{bits}*`` to ``args[0][args[1]]`` (a uint8 array, a byte index; no bounds check)."""
    from llvmlite import ir

    from .simd import _element_pointer

    pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1])
    return builder.bitcast(pointer, ir.IntType(bits).as_pointer())


@jit.intrinsic
def _load_u64(typingctx, array, byte):
    """The little-endian uint64 at ``array[byte:byte + 8]`` of a uint8 array, at any alignment (one load,
    unchecked: the caller guarantees the range)."""
    from numba import types

    def codegen(context, builder, sig, args):
        return builder.load(_byte_pointer(context, builder, sig, args, 64), align=1)

    return types.uint64(array, byte), codegen


@jit.intrinsic
def _load_u16(typingctx, array, byte):
    """The little-endian uint16 at ``array[byte:byte + 2]`` of a uint8 array, at any alignment (unchecked)."""
    from numba import types

    def codegen(context, builder, sig, args):
        return builder.load(_byte_pointer(context, builder, sig, args, 16), align=1)

    return types.uint16(array, byte), codegen


@jit.intrinsic
def _store_u32(typingctx, array, byte, value):
    """``value`` (uint32) into ``array[byte:byte + 4]`` of a uint8 array, little-endian, at any alignment
    (unchecked).  Stores through numba's array indexing (whose negative-index select it keeps) made the
    record loop ~3x slower."""
    from numba import types

    def codegen(context, builder, sig, args):
        builder.store(context.cast(builder, args[2], sig.args[2], types.uint32),
                      _byte_pointer(context, builder, sig, args, 32), align=1)
        return context.get_dummy_value()

    return types.void(array, byte, types.uint32), codegen


@jit.intrinsic
def _halves_to_pairs16(typingctx, records, at, codes, to, keep):
    """The 32 4-bit codes of the 16 bytes at ``records[at:]`` (codes 0-15 in the low nibbles, 16-31 in the
    high ones, each ``code + 8``) into ``codes[to:to + 16]`` in int4 two's complement, two to a byte, the
    first in the low nibble, each byte ANDed with ``keep`` (0 writes the codes 0).  One 16-byte vector:
    nibbles split, even and odd ones gathered by two shuffles, joined, ``^ 0x88``.  Unchecked ranges."""
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, sig, args):
        from .simd import _element_pointer, _splat

        vector = ir.VectorType(ir.IntType(8), 16)

        def splat(value):
            return ir.Constant(vector, [value] * 16)

        src = _element_pointer(context, builder, sig.args[0], args[0], args[1])
        packed = builder.load(builder.bitcast(src, vector.as_pointer()), align=1)
        low = builder.and_(packed, splat(0x0F))  # codes 0-15 (+ 8)
        high = builder.lshr(packed, splat(4))  # codes 16-31 (+ 8)
        i32 = ir.IntType(32)
        even = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(i32, 16), list(range(0, 32, 2))))
        odd = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(i32, 16), list(range(1, 32, 2))))
        pairs = builder.xor(builder.or_(even, builder.shl(odd, splat(4))), splat(0x88))
        mask = _splat(builder, context.cast(builder, args[4], sig.args[4], types.uint8), vector)
        dst = _element_pointer(context, builder, sig.args[2], args[2], args[3])
        builder.store(builder.and_(pairs, mask), builder.bitcast(dst, vector.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(records, at, codes, to, types.uint8), codegen


@jit.helper
def _record_codes(records, first, stop, codes):
    """:func:`_nibble_records`' codes of records ``[first, stop)`` (:func:`_halves_to_pairs16`; a zero
    scale's codes masked to 0, branch-free)."""
    for r in range(first, stop):
        at = r * RECORD_BYTES
        scaled = (_load_u16(records, at + SCALE_AT) & np.uint16(0x7FFF)) != 0
        _halves_to_pairs16(records, at + CODES_AT, codes, 16 * r, np.uint8(0) - np.uint8(scaled))


@jit.helper
def _record_scales(records, first, stop, scales):
    """:func:`_nibble_records`' scales of records ``[first, stop)``, branch-free (vectorized) as the codes.
    A zero scale's replacement is 1.0 with the sign of its values: ``d``'s, flipped where the codes are
    negative (nibbles' top bits clear)."""
    tops, one = np.uint64(_NIBBLE_TOPS), np.uint32(0x3F80_0000)
    for r in range(first, stop):
        at = r * RECORD_BYTES
        h = _load_u16(records, at + SCALE_AT)
        bits = float32_bits(f16_to_f32_not_nan(h))
        negative_codes = ((_load_u64(records, at + CODES_AT) | _load_u64(records, at + CODES_AT + 8)) & tops) == 0
        sign = (np.uint32(h >> np.uint16(15)) ^ np.uint32(negative_codes)) << np.uint32(31)
        zero = np.uint32(0) - np.uint32((h & np.uint16(0x7FFF)) == 0)  # all ones for a zero scale
        _store_u32(scales, 4 * r, (bits & ~zero) | ((one | sign) & zero))


@jit.helper
def _records_worst(records, first, stop):
    """The worst ``RECORD_*`` class of records ``[first, stop)``: a scale not finite; zero over codes of
    both signs (nibbles' top bits neither all set nor all clear); zero over codes of one sign."""
    worst = RECORD_EXACT
    tops = np.uint64(_NIBBLE_TOPS)
    for r in range(first, stop):
        at = r * RECORD_BYTES
        h = _load_u16(records, at + SCALE_AT)
        if (h & np.uint16(0x7C00)) == np.uint16(0x7C00):
            return RECORD_NOT_FINITE
        if (h & np.uint16(0x7FFF)) == 0:
            low, high = _load_u64(records, at + CODES_AT), _load_u64(records, at + CODES_AT + 8)
            one_sign = (low & high & tops) == tops or ((low | high) & tops) == 0
            worst = max(worst, RECORD_ZERO_SCALE if one_sign else RECORD_ZERO_BOTH_SIGNS)
    return worst


@jit.kernel("void(i64[:], u8[:], u8[:], u8[:], i64[:])")
def _nibble_records(work, records, codes, scales, found):
    """Records of ``RECORD_BYTES`` bytes, each a float16 scale ``d`` at ``SCALE_AT`` and 32 4-bit codes
    stored as ``nibble = code + 8`` in the 16 bytes at ``CODES_AT`` (codes 0-15 in the low nibbles, 16-31 in
    the high ones).  Record ``r`` gives ``codes[16 r:16 r + 16]`` (unless ``codes`` is empty): its codes in
    int4 two's complement (``nibble ^ 8``), element order, two to a byte, the first in the low nibble; and
    ``scales[4 r:4 r + 4]`` (unless empty): ``d`` as little-endian float32.  A zero ``d`` over codes of one
    sign gives the codes 0 and the scale 1 or -1 of the sign of its values ``d * code``
    (``RECORD_ZERO_SCALE``); the classes without an exact form give codes and scales of no meaning.
    ``found[slot]`` (unless empty) gets the worst class among the records the calling thread saw."""
    n = records.size // RECORD_BYTES
    worst = RECORD_EXACT
    while True:
        first, stop = claim_span(work, n)
        if first == stop:
            break
        if codes.size:
            _record_codes(records, first, stop, codes)
        if scales.size:
            _record_scales(records, first, stop, scales)
        if found.size:
            worst = max(worst, _records_worst(records, first, stop))
    if found.size:
        found[slot(work)] = worst


def nibble_records(records: np.ndarray, scale_at: int, codes_at: int, codes: np.ndarray = None,
                   scales: np.ndarray = None, *, parallel: bool = True, classify: bool = True) -> int:
    """Run :func:`_nibble_records` over ``records`` (``(n, size)`` uint8, C-contiguous; its variant for
    this layout): the packed int4 codes into ``codes`` (at least ``16 n`` bytes) and the little-endian
    float32 scales into ``scales`` (at least ``4 n`` bytes), each skipped when None; returns the worst
    ``RECORD_*`` class found (``RECORD_EXACT`` with ``classify=False``, which spares that loop).  Without
    outputs it only classifies.  ``parallel=False`` keeps the work on
    the calling thread (a piece of a larger run), as do runs under :data:`RECORDS_PARALLEL_MIN`."""
    n, size = records.shape
    if not 0 <= scale_at <= size - 2 or not 0 <= codes_at <= size - 16:
        raise HurraySchemaError(f"fields at {scale_at} and {codes_at} do not fit records of {size} bytes")
    arrays = [records] + [a for a in (codes, scales) if a is not None]
    if not all(a.flags.c_contiguous for a in arrays):
        raise HurraySchemaError("nibble_records reads and writes C-contiguous arrays only")
    codes = np.empty(0, np.uint8) if codes is None else codes.reshape(-1).view(np.uint8)
    scales = np.empty(0, np.uint8) if scales is None else scales.reshape(-1).view(np.uint8)
    if (codes.size and codes.size < 16 * n) or (scales.size and scales.size < 4 * n):
        raise HurraySchemaError(f"outputs of {codes.size} code bytes and {scales.size} scale bytes for {n} records")
    if n == 0:
        return RECORD_EXACT
    kernel = _nibble_records.variant(RECORD_BYTES=int(size), SCALE_AT=int(scale_at), CODES_AT=int(codes_at))
    units = min(n, ROW_UNITS) if parallel and n >= RECORDS_PARALLEL_MIN else 1
    found = np.zeros((max(1, jit.threads()) if units > 1 else 1) if classify else 0, np.int64)
    jit.run_parallel(kernel, units, records.reshape(-1), codes, scales, found, count=None if units > 1 else 1)
    return int(found.max()) if classify else RECORD_EXACT


def _rows_own_bytes(padded: int, bits: int) -> bool:
    """Rows of ``padded`` elements start on a byte (a 6-bit group) boundary: rows may run in parallel."""
    return padded % 4 == 0 if bits == 6 else (padded * bits) % 8 == 0


def _output(rows: int, padded: int, bits: int, dtype) -> tuple[np.ndarray, bool]:
    """(zeroed output, packed directly): rows that own whole bytes get the packed buffer, others one
    byte per code, packed afterwards by :func:`pack_codes`."""
    if bits >= 8:
        return np.zeros(rows * padded * np.dtype(dtype).itemsize, np.uint8), True
    if _rows_own_bytes(padded, bits):
        return np.zeros(storage_bytes(rows * padded, bits), np.uint8), True
    return np.zeros(rows * padded, np.uint8), False


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Packed bytes of one-code-per-byte ``codes`` (element order); whole-byte codes returned as is."""
    flat = np.ascontiguousarray(codes).reshape(-1)
    if bits >= 8:
        return flat
    out = np.zeros(storage_bytes(flat.size, bits), np.uint8)
    groups = -(-flat.size // (4 if bits == 6 else 8 // bits))
    parallel = flat.size >= PARALLEL_MIN_ELEMENTS
    jit.run_parallel(_pack, min(groups, ROW_UNITS) if parallel else 1, flat.view(np.uint8), np.int64(bits), out,
                     count=None if parallel else 1)
    return out


# ------------------------------------------------------------------------------------
# Entry points: a rows x cols view in, codes and parameters out
# ------------------------------------------------------------------------------------


def affine_block_stats(rows2d: np.ndarray, block: int, mask=None) -> tuple[np.ndarray, np.ndarray, bool]:
    """(mins, maxs, all finite) of the blocks of ``rows2d`` (``rows * nb`` each, masked elements --
    ``mask`` a flat bool array over ``rows2d`` -- left out)."""
    rows, cols = rows2d.shape
    x, kind = input_kind(rows2d)
    nb = -(-cols // block) if cols else 0
    mins = np.empty(rows * nb, np.float32)
    maxs = np.empty(rows * nb, np.float32)
    bad = np.zeros(1, np.uint8)
    m, use_mask = _mask_argument(mask)
    _run_rows(_affine_stats.variant(IN=kind), rows, cols, True, x, np.int64(rows), np.int64(cols), np.int64(block), m,
              use_mask, mins, maxs, bad)
    return mins, maxs, not bad[0]


def affine_block_params(mins, maxs, lo: int, hi: int, symmetric: bool, scale_type) -> tuple[np.ndarray, np.ndarray, int]:
    """(scales float32, zero points int32, count of scales past the scale type's range)."""
    scales = np.empty(mins.size, np.float32)
    zps = np.empty(mins.size, np.int32)
    kernel = _affine_params.variant(SYMMETRIC=bool(symmetric), SCALE=SCALE_KINDS[scale_type])
    over = kernel(mins, maxs, np.int64(lo), np.int64(hi), scales, zps)
    return scales, zps, int(over)


def affine_codes(rows2d: np.ndarray, block: int, padded: int, scales, zps, lo: int, hi: int, bits: int,
                 dtype) -> np.ndarray:
    """Codes of ``rows2d`` under per-(row, block) parameters, ``rows x padded`` elements: packed bytes
    for sub-byte storage, else items of ``dtype``."""
    rows, cols = rows2d.shape
    x, kind = input_kind(rows2d)
    out, direct = _output(rows, padded, bits, dtype)
    _run_rows(_affine_codes.variant(IN=kind), rows, cols, direct, x, np.int64(rows), np.int64(cols), np.int64(block),
              np.int64(padded), scales, zps, np.int64(lo), np.int64(hi), np.int64(bits if direct else 8), out)
    if bits >= 8:
        return out.view(dtype)
    return out if direct else pack_codes(out, bits)


def _mask_argument(mask):
    if mask is None:
        return np.zeros(1, np.bool_), False
    return np.ascontiguousarray(mask, np.bool_).reshape(-1), True


def _affine_int4(rows2d, block, padded, lo, hi, symmetric, scale_type, mask, vector=True):
    rows, cols = rows2d.shape
    x, kind = input_kind(rows2d)
    nb = -(-cols // block) if cols else 0
    scales = np.empty(rows * nb, np.float32)
    zps = np.zeros(rows * nb, np.int32)
    bad = np.zeros(1, np.uint8)
    out = np.empty(rows * padded // 2, np.uint8)  # the kernel writes every byte
    m, use_mask = _mask_argument(mask)
    scratch = (jit.Scratch(nb, np.uint8), jit.Scratch(nb, np.float32), jit.Scratch(nb, np.float32),
               jit.Scratch(block + 1, np.int32, zeros=True))
    units = min(rows, INT4_CHUNKS) if rows * cols >= PARALLEL_MIN_ELEMENTS else 1
    kernel = _affine_rows_int4.variant(IN=kind, SYMMETRIC=bool(symmetric), SCALE=SCALE_KINDS[scale_type])
    jit.run_parallel(kernel, units, x, np.int64(rows), np.int64(cols), np.int64(block), np.int64(padded), m, use_mask,
                     np.int64(lo), np.int64(hi), scales, zps, bad, out, bool(vector), vector_f16(),
                     count=None if units > 1 else 1, scratch=scratch)
    finite = not bad[0]
    over = int(np.count_nonzero(~(np.abs(scales) <= _FLT_MAX))) if finite else 0
    return out, scales, zps, finite, over


def affine_quantize(rows2d, block: int, padded: int, lo: int, hi: int, symmetric: bool, scale_type, bits: int,
                    dtype, mask=None, unpacked: bool = False, vector: bool = True):
    """Per-(row, block) affine quantization of ``rows2d``: (codes, scales, zero points, all finite,
    overflowed scales).  ``unpacked=True`` returns one code per item (``rows x padded``, for layouts
    the caller still has to rearrange) instead of the packed bytes.  ``vector=False`` keeps the fused
    4-bit kernel on its scalar path (the same results; tests compare the two)."""
    if bits == 4 and not unpacked and block % 2 == 0:
        return _affine_int4(rows2d, block, padded, lo, hi, symmetric, scale_type, mask, vector)
    mins, maxs, finite = affine_block_stats(rows2d, block, mask)
    scales, zps, over = affine_block_params(mins, maxs, lo, hi, symmetric, scale_type)
    if unpacked:
        codes = affine_codes(rows2d, block, padded, scales, zps, lo, hi, max(bits, 8),
                             dtype if bits >= 8 else np.uint8)
        if bits < 8:
            codes &= np.uint8((1 << bits) - 1)
        return codes.reshape(rows2d.shape[0], padded), scales, zps, finite, over
    return affine_codes(rows2d, block, padded, scales, zps, lo, hi, bits, dtype), scales, zps, finite, over


def spqr_outliers(rows2d, block: int, hi: int, budget: int, per_block: int) -> np.ndarray:
    """Outlier mask (flat bool over ``rows2d``) for a symmetric per-block quantizer with top code ``hi``.

    Each block's reference magnitude ``m`` is its ``(per_block + 1)``-th largest: the absmax it
    keeps once its ``per_block`` largest elements are taken out, whose scale is ``m / hi``.  An
    element's score is its quantization (clipping) error under that scale, ``|x| - m``; elements
    whose score exceeds half that scale's step are candidates, and the ``budget`` largest scores
    over the whole array are the outliers."""
    rows, cols = rows2d.shape
    x, kind = input_kind(rows2d)
    nb = -(-cols // block) if cols else 0
    mask = np.zeros(rows * cols, np.bool_)
    rank = max(1, min(int(per_block) + 1, block))
    if budget <= 0 or rows * cols == 0 or rank >= min(block, cols) + 1:
        return mask
    ref = np.zeros(rows * nb, np.float32)
    _run_rows(_block_reference.variant(IN=kind), rows, cols, True, x, np.int64(rows), np.int64(cols), np.int64(block),
              np.int64(rank), ref, scratch=(jit.Scratch(rank, np.float32, zeros=True),))  # each thread's top values
    magnitude = np.abs(np.ascontiguousarray(rows2d, np.float32))
    block_ref = np.repeat(ref.reshape(rows, nb), block, axis=1)[:, :cols]
    score = (magnitude - block_ref).reshape(-1)
    candidates = np.flatnonzero(score > (block_ref / np.float32(2 * hi)).reshape(-1))
    if candidates.size > budget:
        candidates = candidates[np.argpartition(-score[candidates], budget - 1)[:budget]]
    mask[candidates] = True
    return mask


def nf4_quantize(rows2d, block: int, padded: int, unpacked: bool = False):
    """NF4 of ``rows2d`` per (row, block): (codes, float32 absmax scales, all finite)."""
    rows, cols = rows2d.shape
    x, kind = input_kind(rows2d)
    nb = -(-cols // block) if cols else 0
    scales = np.empty(rows * nb, np.float32)
    bad = np.zeros(1, np.uint8)
    bits = 8 if unpacked else 4
    out, direct = _output(rows, padded, bits, np.uint8)
    _run_rows(_nf4_rows.variant(IN=kind), rows, cols, direct, x, np.int64(rows), np.int64(cols), np.int64(block),
              np.int64(padded), NF4_TABLE, scales, np.int64(bits), bad, out,
              scratch=(jit.Scratch(16, np.float32),))  # each thread's candidate codes
    if unpacked:
        out = out.reshape(rows, padded)
    elif not direct:
        out = pack_codes(out, 4)
    return out, scales, not bad[0]


def mxfp_element_max(storage) -> float:
    """Largest finite magnitude of an MXFP element type (integers: ``2**(bits-1) - 1``)."""
    info = element_type_info(storage)
    if not info.is_float:
        return float((1 << (info.bit_width - 1)) - 1)
    table = minifloat_table(storage)[: 1 << info.bit_width]
    return float(np.nanmax(np.where(np.isfinite(table), np.abs(table), np.nan)))


def _positive_magnitudes(storage) -> np.ndarray:
    """Finite values of the positive codes 0, 1, ... (ascending: sign-magnitude codes), float32."""
    info = element_type_info(storage)
    table = minifloat_table(storage)[: 1 << (info.bit_width - 1)]
    finite = np.isfinite(table)
    count = int(np.argmin(finite)) if not finite.all() else table.size
    return np.ascontiguousarray(table[:count], np.float32)


def mxfp_quantize(rows2d, block: int, storage, unpacked: bool = False):
    """MXFP of ``rows2d`` per (row, block): (codes, float8_e8m0 scale bytes, all finite)."""
    rows, cols = rows2d.shape
    info = element_type_info(storage)
    x, kind = input_kind(rows2d)
    nb = cols // block if cols else 0
    exps = np.empty(rows * nb, np.uint8)
    bad = np.zeros(1, np.uint8)
    bits = 8 if unpacked else info.bit_width
    out, direct = _output(rows, cols, bits, np.uint8)
    is_int = not info.is_float
    lo, hi = (-(1 << (info.bit_width - 1)), (1 << (info.bit_width - 1)) - 1)
    mags = np.zeros(1, np.float32) if is_int else _positive_magnitudes(storage)
    _run_rows(_mxfp_rows.variant(IN=kind), rows, cols, direct, x, np.int64(rows), np.int64(cols), np.int64(block),
              np.int64(cols), mxfp_element_max(storage), mags, np.int64(1 << (info.bit_width - 1)), is_int,
              np.int64(lo), np.int64(hi), np.int64(bits), exps, bad, out)
    if unpacked:
        out = out.reshape(rows, cols) & np.uint8((1 << info.bit_width) - 1) if info.bit_width < 8 \
            else out.reshape(rows, cols)
    elif not direct:
        out = pack_codes(out, info.bit_width)
    return out, exps, not bad[0]
