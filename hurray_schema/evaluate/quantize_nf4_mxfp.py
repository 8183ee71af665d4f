"""NF4 and MXFP quantization: each element coded as the nearest value of a fixed table, scaled per block.

* NF4 (``quantization/nf4.md``): ``s`` = the block's float32 absmax (1 for an all-zero block);
  the code is the one whose decoded value ``s * nf4[q]`` (float32) is nearest to ``x``, the
  lower code on a tie.
* MXFP (``quantization/mxfp.md``): the shared exponent is the smallest ``e`` in [1, 254] with
  ``absmax <= 2**(e - 127) * max_element`` (127 for an all-zero block); ``y = x / s`` is rounded
  to the nearest element value, ties to the even code (round to nearest even for the float
  element types), integers with :func:`numpy.rint` and clamped.  MXFP has no partial trailing
  block (``quantization/mxfp.md § Validity Constraints``).
"""

from __future__ import annotations

import numpy as np

from ..structs.element_types import element_type_info
from ..structs.quantization import NF4_LEVELS
from . import jit
from .elements import float32_bits, minifloat_table
from .jit import claim_span, search_left, slot
from .quantize_common import _finite, _load, _output, _put, _run_rows, _x_signatures, input_kind, pack_codes

__all__ = ["NF4_TABLE", "nf4_quantize", "mxfp_quantize", "mxfp_element_max"]

NF4_TABLE = np.array(NF4_LEVELS, np.float32)
NF4_TABLE.flags.writeable = False


# ------------------------------------------------------------------------------------
# Row kernels
# ------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------
# Entry points: a rows x cols view in, codes and scales out
# ------------------------------------------------------------------------------------

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
