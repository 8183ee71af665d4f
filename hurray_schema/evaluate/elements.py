"""Element decoding: bit patterns to values, written once.

* float16 / bfloat16 <-> float32 conversions on raw bits (numba has no float16), with
  the same bits NumPy (float16) and ``ml_dtypes`` (bfloat16) produce: round to nearest,
  ties to even; NaN payloads kept on widening; overflow to infinity.
* float8 / float6 / float4 codes decoded from their sign/exponent/mantissa fields
  (``element-types.md § Tier 2 -- Extended Types``) into 256-entry float32 tables.
* Code extraction from packed buffers: LSB-first 1/2/4-bit packing and the 4-in-3-bytes
  6-bit packing (``element-types.md § Sub-Byte Integer Types``, ``§ 6-bit packing``,
  ``memory-layout.md § Sub-Byte Types``), little-endian whole-byte codes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..errors import UnsupportedEvaluation
from ..model import ElementType
from ..structs.element_types import element_type_info, numpy_dtypes

__all__ = [
    "UnsupportedEvaluation", "numpy_dtype", "f16_to_f32", "f32_to_f16", "bf16_to_f32", "f32_to_bf16",
    "f16_add", "bf16_add", "f32_to_f16_fast", "HAS_F16C", "minifloat_table", "load_code", "gather_codes",
    "sign_extend",
    "f16_bits_to_f32_array", "f32_to_f16_bits_array", "bf16_bits_to_f32_array", "f32_to_bf16_bits_array",
]


_NUMPY_DTYPES = numpy_dtypes()
"""Element type -> the NumPy / ml_dtypes dtype of its decoded array (one element per item)."""

CODE_VIEW_TYPES = frozenset({
    ElementType.FLOAT8_E4M3, ElementType.FLOAT8_E5M2, ElementType.FLOAT8_E8M0, ElementType.FLOAT4_E2M1,
    ElementType.FLOAT6_E2M3, ElementType.FLOAT6_E3M2, ElementType.INT4, ElementType.UINT4, ElementType.INT2,
    ElementType.UINT2,
})
"""Types whose ml_dtypes item is one byte holding the raw code in its low bits (a uint8 view)."""


def numpy_dtype(type_tag: int) -> np.dtype:
    """The dtype a decoded array of ``type_tag`` has; raises for types without one (float128, private)."""
    try:
        return _NUMPY_DTYPES[type_tag]
    except KeyError:
        name = getattr(element_type_info(type_tag), "name", f"0x{int(type_tag):02X}")
        raise UnsupportedEvaluation(f"element type {name} has no array representation here") from None


# ------------------------------------------------------------------------------------
# float16 / bfloat16 <-> float32 on bits
# ------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def f16_to_f32(h):
    """float16 bits (uint16) -> float32 value; exact, NaN payload kept (``element-types.md § float16``)."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = h & np.uint32(0x7C00)
    mant = h & np.uint32(0x03FF)
    if exp == 0:
        if mant == 0:
            bits = sign
        else:  # subnormal: normalise
            e = np.uint32(0)
            mant <<= np.uint32(1)
            while (mant & np.uint32(0x0400)) == 0:
                mant <<= np.uint32(1)
                e += np.uint32(1)
            bits = sign | ((np.uint32(112) - e) << np.uint32(23)) | ((mant & np.uint32(0x03FF)) << np.uint32(13))
    elif exp == 0x7C00:
        bits = sign | np.uint32(0x7F800000) | (mant << np.uint32(13))
    else:
        bits = sign | (((h & np.uint32(0x7FFF)) + np.uint32(0x1C000)) << np.uint32(13))
    return np.uint32(bits).view(np.float32)


@njit(cache=True, nogil=True, inline="always")
def f32_to_f16(x):
    """float32 value -> float16 bits (uint16), round to nearest even; NaN keeps its top payload bits."""
    f = np.float32(x).view(np.uint32)
    sign = np.uint32((f >> np.uint32(16)) & np.uint32(0x8000))
    fexp = f & np.uint32(0x7F800000)
    fsig = f & np.uint32(0x007FFFFF)
    if fexp >= np.uint32(0x47800000):
        if fexp == np.uint32(0x7F800000) and fsig != 0:
            ret = np.uint32(0x7C00) + (fsig >> np.uint32(13))
            if ret == np.uint32(0x7C00):
                ret += np.uint32(1)  # keep it a NaN
            return np.uint16(sign + ret)
        return np.uint16(sign + np.uint32(0x7C00))  # infinity or overflow
    if fexp <= np.uint32(0x38000000):
        if fexp < np.uint32(0x33000000):
            return np.uint16(sign)  # underflow to signed zero
        e = fexp >> np.uint32(23)
        sig = np.uint32(0x00800000) + fsig
        shift = np.uint32(113) - e
        # bits shifted out beyond the half-way bit decide ties (sticky)
        sticky = (sig & ((np.uint32(1) << shift) - np.uint32(1))) != 0
        sig >>= shift
        if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or sticky:
            sig += np.uint32(0x1000)
        return np.uint16(sign + (sig >> np.uint32(13)))
    hexp = (fexp - np.uint32(0x38000000)) >> np.uint32(13)
    if (fsig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        fsig += np.uint32(0x1000)
    return np.uint16(sign + hexp + (fsig >> np.uint32(13)))


def _host_has_f16c() -> bool:
    try:
        from llvmlite import binding
        return bool(binding.get_host_cpu_features().get("f16c", False))
    except Exception:  # pragma: no cover - any failure means: use the portable code
        return False


HAS_F16C = _host_has_f16c()
"""The host CPU converts float32 -> float16 in hardware (x86 F16C); numba compiles for the host."""


@intrinsic
def _f32_to_f16_hw(typingctx, x):
    """LLVM ``fptrunc float -> half`` (round to nearest even), bits returned as uint16."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def _f16_to_f32_hw(typingctx, h):
    """LLVM ``fpext half -> float`` of float16 bits (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


if HAS_F16C:
    @njit(cache=True, nogil=True, inline="always")
    def f16_to_f32_fast(h):
        """:func:`f16_to_f32` in hardware for non-NaN patterns (exact either way); NaNs keep the
        software path so a signalling NaN's payload is not quieted."""
        h = np.uint16(h)
        if (h & np.uint16(0x7C00)) == np.uint16(0x7C00) and (h & np.uint16(0x03FF)) != 0:
            return f16_to_f32(h)
        return _f16_to_f32_hw(h)

    @njit(cache=True, nogil=True, inline="always")
    def f32_to_f16_fast(x):
        """:func:`f32_to_f16` using the hardware conversion for non-NaN values (identical bits: both
        round to nearest even); NaNs take the software path, which keeps NumPy's payload rule."""
        x = np.float32(x)
        if x != x:
            return f32_to_f16(x)
        return _f32_to_f16_hw(x)
    @njit(cache=True, nogil=True, inline="always")
    def f32_to_f16_not_nan(x):
        """Hardware conversion of a float32 known not to be NaN (branch-free, vectorizable)."""
        return _f32_to_f16_hw(np.float32(x))
else:  # pragma: no cover - depends on the host CPU
    f32_to_f16_fast = f32_to_f16
    f16_to_f32_fast = f16_to_f32
    f32_to_f16_not_nan = f32_to_f16


@njit(cache=True, nogil=True, inline="always")
def bf16_to_f32(h):
    """bfloat16 bits -> float32 value (exact, payload kept)."""
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@njit(cache=True, nogil=True, inline="always")
def f32_to_bf16(x):
    """float32 value -> bfloat16 bits, round to nearest even; NaN -> quiet NaN 0x7FC0 with its sign."""
    f = np.float32(x).view(np.uint32)
    if (f & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (f & np.uint32(0x007FFFFF)) != 0:
        return np.uint16(((f >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    lsb = (f >> np.uint32(16)) & np.uint32(1)
    f = f + np.uint32(0x7FFF) + lsb
    return np.uint16(f >> np.uint32(16))


@njit(cache=True, nogil=True, inline="always")
def _quiet_f32(x):
    return np.uint32(np.float32(x).view(np.uint32) | np.uint32(0x00400000)).view(np.float32)


@njit(cache=True, nogil=True, inline="always")
def _add_f32(a, b):
    """a + b in float32 with x86 NumPy's NaN choice made explicit (right operand's NaN, quieted, wins)."""
    if b != b:
        return _quiet_f32(b)
    if a != a:
        return _quiet_f32(a)
    return np.float32(a + b)


@njit(cache=True, nogil=True, inline="always")
def f16_add(a, b):
    """float16 bits a + b, one float16 rounding: NumPy's float16 arithmetic (float32 sum, then round)."""
    return f32_to_f16_fast(_add_f32(f16_to_f32_fast(a), f16_to_f32_fast(b)))


@njit(cache=True, nogil=True, inline="always")
def bf16_add(a, b):
    """bfloat16 bits a + b, one bfloat16 rounding (ml_dtypes arithmetic)."""
    return f32_to_bf16(_add_f32(bf16_to_f32(a), bf16_to_f32(b)))


@njit(cache=True, parallel=False)
def f16_bits_to_f32_array(h):
    out = np.empty(h.size, np.float32)
    for i in range(h.size):
        out[i] = f16_to_f32_fast(h[i])
    return out


@njit(cache=True, parallel=False)
def f32_to_f16_bits_array(x):
    out = np.empty(x.size, np.uint16)
    for i in range(x.size):
        out[i] = f32_to_f16(x[i])
    return out


@njit(cache=True, parallel=False)
def f32_to_f16_bits_array_fast(x):
    out = np.empty(x.size, np.uint16)
    for i in range(x.size):
        out[i] = f32_to_f16_fast(x[i])
    return out


@njit(cache=True, parallel=False)
def bf16_bits_to_f32_array(h):
    out = np.empty(h.size, np.float32)
    for i in range(h.size):
        out[i] = bf16_to_f32(h[i])
    return out


@njit(cache=True, parallel=False)
def f32_to_bf16_bits_array(x):
    out = np.empty(x.size, np.uint16)
    for i in range(x.size):
        out[i] = f32_to_bf16(x[i])
    return out


# ------------------------------------------------------------------------------------
# Narrow floats: sign / exponent / mantissa fields -> float32
# ------------------------------------------------------------------------------------

NAN_NONE, NAN_IEEE, NAN_ALL_ONES = 0, 1, 2

_MINIFLOAT_FORMATS = {
    # tag: (sign bits, exponent bits, mantissa bits, bias, NaN rule)
    ElementType.FLOAT8_E4M3: (1, 4, 3, 7, NAN_ALL_ONES),   # OCP OFP8 E4M3: 0x7F / 0xFF NaN, no infinity
    ElementType.FLOAT8_E5M2: (1, 5, 2, 15, NAN_IEEE),      # IEEE-style: infinities and NaNs
    ElementType.FLOAT4_E2M1: (1, 2, 1, 1, NAN_NONE),
    ElementType.FLOAT6_E2M3: (1, 2, 3, 1, NAN_NONE),
    ElementType.FLOAT6_E3M2: (1, 3, 2, 3, NAN_NONE),
}


@njit(cache=True)
def _decode_minifloat(code, ebits, mbits, bias, nan_rule):
    sign = -1.0 if (code >> (ebits + mbits)) & 1 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    emax = (1 << ebits) - 1
    if nan_rule == NAN_IEEE and e == emax:
        return np.float32(np.nan) if m != 0 else np.float32(sign * np.inf)
    if nan_rule == NAN_ALL_ONES and e == emax and m == (1 << mbits) - 1:
        return np.float32(np.nan)
    if e == 0:  # zero or subnormal: (m / 2^mbits) * 2^(1 - bias)
        return np.float32(sign * (m / (1 << mbits)) * 2.0 ** (1 - bias))
    return np.float32(sign * (1.0 + m / (1 << mbits)) * 2.0 ** (e - bias))


@njit(cache=True)
def _table(ebits, mbits, bias, nan_rule, n):
    out = np.empty(256, np.float32)
    out[:] = np.nan
    for c in range(n):
        out[c] = _decode_minifloat(c, ebits, mbits, bias, nan_rule)
    return out


@njit(cache=True)
def _e8m0_table():
    out = np.empty(256, np.float32)
    out[:] = np.nan  # 0x00 and 0xFF are reserved (element-types.md § float8_e8m0)
    for c in range(1, 255):
        out[c] = np.float32(2.0 ** (c - 127))
    return out


_TABLES: dict = {}


def minifloat_table(type_tag: int) -> np.ndarray:
    """float32[256]: value of every code of a float8/float6/float4 type (codes past the width are NaN)."""
    table = _TABLES.get(type_tag)
    if table is None:
        if type_tag == ElementType.FLOAT8_E8M0:
            table = _e8m0_table()
        else:
            s, e, m, bias, rule = _MINIFLOAT_FORMATS[type_tag]
            table = _table(e, m, bias, rule, 1 << (s + e + m))
        table.flags.writeable = False
        _TABLES[type_tag] = table
    return table


# ------------------------------------------------------------------------------------
# Codes in packed buffers
# ------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def load_code(buf, base, offset, bits):
    """Raw code (uint64) of the element at linear element ``offset`` from byte ``base``.

    ``bits`` in {1, 2, 4}: LSB-first packing, byte ``base + offset // P``, bit
    ``(offset % P) * bits``; 6: group of 4 in 3 bytes; 8/16/32/64: little-endian bytes.
    """
    if bits == 8:
        return np.uint64(buf[base + offset])
    if bits < 8:
        if bits == 6:
            g = base + (offset // 4) * 3
            w = np.uint64(buf[g]) | (np.uint64(buf[g + 1]) << np.uint64(8)) | (np.uint64(buf[g + 2]) << np.uint64(16))
            return (w >> np.uint64(6 * (offset % 4))) & np.uint64(63)
        per = 8 // bits
        b = np.uint64(buf[base + offset // per])
        return (b >> np.uint64((offset % per) * bits)) & np.uint64((1 << bits) - 1)
    nbytes = bits // 8
    start = base + offset * nbytes
    v = np.uint64(0)
    for k in range(nbytes):
        v |= np.uint64(buf[start + k]) << np.uint64(8 * k)
    return v


@njit(cache=True, parallel=True)
def _gather_codes_parallel(buf, base, offsets, bits, out):
    for i in prange(out.size):
        out[i] = load_code(buf, base, offsets[i], bits)


@njit(cache=True)
def _gather_codes_serial(buf, base, offsets, bits, out):
    for i in range(out.size):
        out[i] = load_code(buf, base, offsets[i], bits)


PARALLEL_GATHER_MIN = 1 << 14
"""Fewer codes than this are gathered on one thread: starting numba's thread pool costs more
than the work (milliseconds on a loaded machine)."""


def gather_codes(buf, base, offsets, bits, out) -> None:
    """``out[i]`` = the code at element offset ``offsets[i]`` (:func:`load_code`)."""
    kernel = _gather_codes_parallel if out.size >= PARALLEL_GATHER_MIN else _gather_codes_serial
    kernel(buf, base, offsets, bits, out)


@njit(cache=True, nogil=True, inline="always")
def sign_extend(code, bits):
    """Two's-complement value (int64) of a ``bits``-wide code."""
    v = np.int64(code)
    if bits < 64 and (v >> (bits - 1)) & 1:
        v -= np.int64(1) << bits
    return v


@njit(cache=True)
def f16_add_arrays(a, b):
    """Element-wise float16 a + b on bits (uint16 arrays of one size)."""
    out = np.empty(a.size, np.uint16)
    for i in range(a.size):
        out[i] = f16_add(a[i], b[i])
    return out


@njit(cache=True)
def bf16_add_arrays(a, b):
    """Element-wise bfloat16 a + b on bits (uint16 arrays of one size)."""
    out = np.empty(a.size, np.uint16)
    for i in range(a.size):
        out[i] = bf16_add(a[i], b[i])
    return out
