"""Affine quantization (per-tensor, per-channel, per-block): the exact inverse of
``x = float32(int32(q - z)) * s`` (``quantization/per-block-affine.md § Dequantization Formula``).

The scale is the smallest value of the scale type at or above ``absmax / hi`` (symmetric) or
``(max - min) / (hi - lo)`` over a range widened to contain 0 (asymmetric), so no element is
clipped; ``z = lo - rint(min / s)``; the code is ``clamp(rint(x / s) + z, lo, hi)`` in float32
with ties to even.  A block without a non-zero value gets scale 1.  Per-tensor and per-channel
parameters are the one-block and whole-axis cases of the per-block ones.

Two ways through: statistics, parameters and codes as three kernels (:func:`affine_block_stats`,
:func:`affine_block_params`, :func:`affine_codes`), or, for packed 4-bit codes, one fused kernel
(:func:`_affine_rows_int4`) that takes the explicit vector steps of :mod:`.quantize_simd` where
they apply.  :func:`spqr_outliers` picks the elements a symmetric per-block quantizer leaves to the
sparse correction of a SpQR-style overlay (``layouts/composite.md § Example``).
"""

from __future__ import annotations

import numpy as np

from ..model import ElementType
from ..structs.element_types import element_type_info
from . import jit
from .elements import (_f16_to_f32_hw, _f32_to_f16_hw, bf16_to_f32, f16_to_f32_fast, f32_to_bf16, f32_to_f16_fast,
                       float32_bits, float32_from_bits, has_f16c)
from .jit import claim_span, slot
from .quantize_common import (_FLT_MAX, IN, IN_BF16, IN_F16, MINMAX_FLAGS, PARALLEL_MIN_ELEMENTS, _finite, _load,
                              _load_finite, _minmax, _output, _put, _run_rows, _x_signatures,
                              input_kind, pack_codes)
from .quantize_simd import LANES as SIMD_LANES
from .quantize_simd import (block_codes_bf16, block_codes_f16, block_minmax_bf16, block_minmax_f16,
                            block_minmax_masked_bf16, block_minmax_masked_f16, vector_f16)

__all__ = ["SCALE_KINDS", "code_range", "affine_block_stats", "affine_block_params", "affine_codes",
           "affine_quantize", "spqr_outliers", "INT4_CHUNKS"]

SCALE_F32, SCALE_F16, SCALE_BF16 = 0, 1, 2
SCALE, SYMMETRIC = SCALE_F32, True
"""The scale type and the symmetry an affine kernel is compiled for, besides its input kind
(:data:`.quantize_common.IN`): compile-time constants of each of its variants
(``kernel.variant(IN=..., SCALE=..., SYMMETRIC=...)``), so that its loops are specialized to them
and hold no code for the others."""
SCALE_KINDS = {ElementType.FLOAT32: SCALE_F32, ElementType.FLOAT16: SCALE_F16, ElementType.BFLOAT16: SCALE_BF16}
"""Scale element type -> the kernels' code for it."""

_FLOAT32_INTEGERS = 1 << 24
"""float32 represents every integer up to this magnitude (24-bit significand)."""


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
# Scalar steps: scale, zero point and code
# ------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------
# Row kernels
# ------------------------------------------------------------------------------------

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
    """(mask array, whether to use it) as the kernels take them: a placeholder and False for no mask."""
    if mask is None:
        return np.zeros(1, np.bool_), False
    return np.ascontiguousarray(mask, np.bool_).reshape(-1), True


def _affine_int4(rows2d, block, padded, lo, hi, symmetric, scale_type, mask, vector=True):
    """:func:`affine_quantize` into packed 4-bit codes by the fused kernel :func:`_affine_rows_int4`."""
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
