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

from ..errors import UnsupportedEvaluation
from ..model import ElementType
from ..structs.element_types import element_type_info, numpy_dtype_of
from . import jit
from .jit import claim_span

__all__ = [
    "UnsupportedEvaluation", "numpy_dtype", "f16_to_f32", "f32_to_f16", "bf16_to_f32", "f32_to_bf16",
    "f16_add", "bf16_add", "f32_to_f16_fast", "has_f16c", "minifloat_table", "load_code", "gather_codes", "codes_at",
    "sign_extend",
    "f16_bits_to_f32_array", "f32_to_f16_bits_array", "bf16_bits_to_f32_array", "f32_to_bf16_bits_array",
]


CODE_VIEW_TYPES = frozenset({
    ElementType.FLOAT8_E4M3, ElementType.FLOAT8_E5M2, ElementType.FLOAT8_E8M0, ElementType.FLOAT4_E2M1,
    ElementType.FLOAT6_E2M3, ElementType.FLOAT6_E3M2, ElementType.INT4, ElementType.UINT4, ElementType.INT2,
    ElementType.UINT2,
})
"""Types whose ml_dtypes item is one byte holding the raw code in its low bits (a uint8 view)."""


def numpy_dtype(type_tag: int) -> np.dtype:
    """The dtype a decoded array of ``type_tag`` has; raises for types without one (float128, private)."""
    dtype = numpy_dtype_of(type_tag)
    if dtype is None:
        name = getattr(element_type_info(type_tag), "name", f"0x{int(type_tag):02X}")
        raise UnsupportedEvaluation(f"element type {name} has no array representation here")
    return dtype


# ------------------------------------------------------------------------------------
# float16 / bfloat16 <-> float32 on bits
# ------------------------------------------------------------------------------------


@jit.intrinsic
def float32_bits(typingctx, x):
    """The bits of a float32 as uint32 (LLVM ``bitcast``: what ``np.float32(x).view(np.uint32)`` gives,
    without the function numba compiles for each such view)."""
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, signature, args):
        return builder.bitcast(context.cast(builder, args[0], signature.args[0], types.float32), ir.IntType(32))

    return types.uint32(x), codegen


@jit.intrinsic
def float32_from_bits(typingctx, bits):
    """The float32 whose bits are the uint32 ``bits`` (LLVM ``bitcast``)."""
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, signature, args):
        return builder.bitcast(context.cast(builder, args[0], signature.args[0], types.uint32), ir.FloatType())

    return types.float32(bits), codegen


@jit.helper
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
    return float32_from_bits(bits)


@jit.helper
def f32_to_f16(x):
    """float32 value -> float16 bits (uint16), round to nearest even; NaN keeps its top payload bits."""
    f = float32_bits(x)
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


def has_f16c() -> bool:
    """The host CPU converts float32 <-> float16 in hardware (x86 F16C); numba compiles for the host."""
    return jit.host_has("f16c")


@jit.intrinsic
def _f32_to_f16_hw(typingctx, x):
    """LLVM ``fptrunc float -> half`` (round to nearest even), bits returned as uint16."""
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@jit.intrinsic
def _f16_to_f32_hw(typingctx, h):
    """LLVM ``fpext half -> float`` of float16 bits (exact)."""
    from llvmlite import ir
    from numba import types

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@jit.helper(inline="always")
def _f16_nan_to_f32(h):
    """The float32 of a float16 NaN pattern, payload kept (what :func:`f16_to_f32` gives it)."""
    h = np.uint32(h)
    return float32_from_bits(((h & np.uint32(0x8000)) << np.uint32(16)) | np.uint32(0x7F800000)
                             | ((h & np.uint32(0x03FF)) << np.uint32(13)))


@jit.helper(inline="always")
def _f32_nan_to_f16(x):
    """The float16 bits of a float32 NaN: its top payload bits, kept a NaN (what :func:`f32_to_f16` gives it)."""
    f = float32_bits(x)
    ret = np.uint32(0x7C00) + ((f & np.uint32(0x007FFFFF)) >> np.uint32(13))
    if ret == np.uint32(0x7C00):
        ret += np.uint32(1)
    return np.uint16(((f >> np.uint32(16)) & np.uint32(0x8000)) + ret)


@jit.helper(inline="always")
def _f16_to_f32_hw_path(h):
    """:func:`f16_to_f32` in hardware for non-NaN patterns (exact either way); a NaN keeps its payload
    bit for bit (the hardware would quiet a signalling NaN)."""
    h = np.uint16(h)
    if (h & np.uint16(0x7C00)) == np.uint16(0x7C00) and (h & np.uint16(0x03FF)) != 0:
        return _f16_nan_to_f32(h)
    return _f16_to_f32_hw(h)


@jit.helper(inline="always")
def _f32_to_f16_hw_path(x):
    """:func:`f32_to_f16` using the hardware conversion for non-NaN values (identical bits: both
    round to nearest even); NaNs take the software path, which keeps NumPy's payload rule."""
    x = np.float32(x)
    if x != x:
        return _f32_nan_to_f16(x)
    return _f32_to_f16_hw(x)


@jit.helper(inline="always")
def _f32_to_f16_hw_not_nan(x):
    """Hardware conversion of a float32 known not to be NaN (branch-free, vectorizable)."""
    return _f32_to_f16_hw(np.float32(x))


@jit.helper(inline="always")
def _f16_to_f32_hw_not_nan(h):
    """Hardware conversion of float16 bits known not to be NaN (branch-free, vectorizable)."""
    return _f16_to_f32_hw(np.uint16(h))


def _with_f16c(hardware, software):
    return lambda: hardware if has_f16c() else software


f16_to_f32_fast = jit.choose(_with_f16c(_f16_to_f32_hw_path, f16_to_f32), _f16_to_f32_hw_path.py_func)
"""float16 bits -> float32 value: in hardware where the host has F16C, else :func:`f16_to_f32`."""
f32_to_f16_fast = jit.choose(_with_f16c(_f32_to_f16_hw_path, f32_to_f16), _f32_to_f16_hw_path.py_func)
"""float32 value -> float16 bits: in hardware where the host has F16C, else :func:`f32_to_f16`."""
f16_to_f32_not_nan = jit.choose(_with_f16c(_f16_to_f32_hw_not_nan, f16_to_f32), _f16_to_f32_hw_not_nan.py_func)
"""float16 bits known not to be NaN -> float32 value, branch-free where the host has F16C."""
f32_to_f16_not_nan = jit.choose(_with_f16c(_f32_to_f16_hw_not_nan, f32_to_f16), _f32_to_f16_hw_not_nan.py_func)
"""float32 value known not to be NaN -> float16 bits, branch-free where the host has F16C."""


@jit.helper(inline="always")
def bf16_to_f32(h):
    """bfloat16 bits -> float32 value (exact, payload kept)."""
    return float32_from_bits(np.uint32(h) << np.uint32(16))


@jit.helper(inline="always")
def f32_to_bf16(x):
    """float32 value -> bfloat16 bits, round to nearest even; NaN -> quiet NaN 0x7FC0 with its sign."""
    f = float32_bits(x)
    if (f & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (f & np.uint32(0x007FFFFF)) != 0:
        return np.uint16(((f >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    lsb = (f >> np.uint32(16)) & np.uint32(1)
    f = f + np.uint32(0x7FFF) + lsb
    return np.uint16(f >> np.uint32(16))


@jit.helper(inline="always")
def _quiet_f32(x):
    return float32_from_bits(float32_bits(x) | np.uint32(0x00400000))


@jit.helper(inline="always")
def _add_f32(a, b):
    """a + b in float32 with x86 NumPy's NaN choice made explicit (right operand's NaN, quieted, wins)."""
    if b != b:
        return _quiet_f32(b)
    if a != a:
        return _quiet_f32(a)
    return np.float32(a + b)


@jit.helper
def f16_add(a, b):
    """float16 bits a + b, one float16 rounding: NumPy's float16 arithmetic (float32 sum, then round)."""
    return f32_to_f16_fast(_add_f32(f16_to_f32_fast(a), f16_to_f32_fast(b)))


@jit.helper
def bf16_add(a, b):
    """bfloat16 bits a + b, one bfloat16 rounding (ml_dtypes arithmetic)."""
    return f32_to_bf16(_add_f32(bf16_to_f32(a), bf16_to_f32(b)))


WIDEN_F16, NARROW_F16, NARROW_F16_FAST, WIDEN_BF16, NARROW_BF16 = range(5)
"""What :func:`_convert_bits` does: float16 / bfloat16 bits <-> float32 values, element by element."""


@jit.kernel("void(u16[:], f32[:], i64)", "void(f32[:], u16[:], i64)")
def _convert_bits(src, out, how):
    for i in range(src.size):
        if how == WIDEN_F16:
            out[i] = f16_to_f32_fast(src[i])
        elif how == WIDEN_BF16:
            out[i] = bf16_to_f32(src[i])
        elif how == NARROW_F16:
            out[i] = f32_to_f16(src[i])
        elif how == NARROW_F16_FAST:
            out[i] = f32_to_f16_fast(src[i])
        else:
            out[i] = f32_to_bf16(src[i])


def _converted(src, dtype, how) -> np.ndarray:
    src = np.ascontiguousarray(src).reshape(-1)
    out = np.empty(src.size, dtype)
    _convert_bits(src, out, how)
    return out


def f16_bits_to_f32_array(h) -> np.ndarray:
    """float16 bits (uint16) -> float32 values, exact (NaN payloads kept)."""
    return _converted(h, np.float32, WIDEN_F16)


def f32_to_f16_bits_array(x) -> np.ndarray:
    """float32 -> float16 bits, round to nearest even (:func:`f32_to_f16`)."""
    return _converted(x, np.uint16, NARROW_F16)


def f32_to_f16_bits_array_fast(x) -> np.ndarray:
    """:func:`f32_to_f16_bits_array` through the hardware conversion where the host has it."""
    return _converted(x, np.uint16, NARROW_F16_FAST)


def bf16_bits_to_f32_array(h) -> np.ndarray:
    """bfloat16 bits -> float32 values, exact."""
    return _converted(h, np.float32, WIDEN_BF16)


def f32_to_bf16_bits_array(x) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (:func:`f32_to_bf16`)."""
    return _converted(x, np.uint16, NARROW_BF16)


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


def _table(ebits, mbits, bias, nan_rule, n):
    out = np.empty(256, np.float32)
    out[:] = np.nan
    for c in range(n):
        out[c] = _decode_minifloat(c, ebits, mbits, bias, nan_rule)
    return out


def _e8m0_table():
    out = np.empty(256, np.float32)
    out[:] = np.nan  # 0x00 and 0xFF are reserved (element-types.md § float8_e8m0)
    for c in range(1, 255):
        out[c] = np.float32(2.0 ** (c - 127))
    return out


_TABLES: dict = {}


def minifloat_table(type_tag: int) -> np.ndarray:
    """float32[256]: value of every code of a float8/float6/float4 type (codes past the width are NaN),
    computed once per process (256 codes: no kernel)."""
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


@jit.helper
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


@jit.kernel("void(i64[:], u8[:], i64, i64[:], i64, u8[:])")
def _gather_codes(work, buf, base, offsets, bits, out):
    """``out[i]`` = code at element ``offsets[i]``, for the units of ``work`` this thread claims."""
    while True:
        start, stop = claim_span(work, out.size)
        if start == stop:
            break
        for i in range(start, stop):
            out[i] = load_code(buf, base, offsets[i], bits)


PARALLEL_GATHER_MIN = 1 << 14
"""Fewer codes than this are gathered on one thread: waking other threads costs more than the work."""

GATHER_UNITS = 64
"""Runs of codes a parallel gather is cut into (threads take the next run when free)."""


def codes_at(buf, base: int, offsets: np.ndarray, bits: int) -> np.ndarray:
    """The raw codes (uint64) at element ``offsets`` from byte ``base``: :func:`load_code`'s packing,
    vectorized (NumPy)."""
    data = np.asarray(buf).reshape(-1)
    if bits < 8 and bits != 6:
        per = 8 // bits
        byte = data[base + offsets // per].astype(np.uint64)
        return (byte >> ((offsets % per) * bits).astype(np.uint64)) & np.uint64((1 << bits) - 1)
    if bits == 6:
        group = base + (offsets // 4) * 3
        word = (data[group].astype(np.uint64) | (data[group + 1].astype(np.uint64) << np.uint64(8))
                | (data[group + 2].astype(np.uint64) << np.uint64(16)))
        return (word >> (6 * (offsets % 4)).astype(np.uint64)) & np.uint64(63)
    width = bits // 8
    start = base + offsets * width
    code = np.zeros(offsets.shape, np.uint64)
    for k in range(width):
        code |= data[start + k].astype(np.uint64) << np.uint64(8 * k)
    return code


GATHER_COMPILE_CODES = 1 << 22
"""Codes gathered by NumPy (:func:`codes_at`) in a process before :func:`_gather_codes` is compiled, while
the kernel cache does not hold it (:meth:`.jit.Kernel.worth_it`)."""


def gather_codes(buf, base, offsets, bits, out) -> None:
    """``out[i]`` = the code at element offset ``offsets[i]`` (:func:`load_code`)."""
    if not _gather_codes.worth_it(out.size, GATHER_COMPILE_CODES):
        out[...] = codes_at(buf, int(base), np.asarray(offsets, np.int64), int(bits)).astype(out.dtype)
        return
    parallel = out.size >= PARALLEL_GATHER_MIN
    jit.run_parallel(_gather_codes, GATHER_UNITS if parallel else 1, buf, np.int64(base), offsets, np.int64(bits), out,
                     count=None if parallel else 1)


@jit.helper(inline="always")
def sign_extend(code, bits):
    """Two's-complement value (int64) of a ``bits``-wide code."""
    v = np.int64(code)
    if bits < 64 and (v >> (bits - 1)) & 1:
        v -= np.int64(1) << bits
    return v


@jit.kernel("void(u16[:], u16[:], u16[:], i64)")
def _add_bits_arrays(a, b, out, bfloat):
    for i in range(a.size):
        out[i] = bf16_add(a[i], b[i]) if bfloat else f16_add(a[i], b[i])


def f16_add_arrays(a, b) -> np.ndarray:
    """Element-wise float16 a + b on bits (uint16 arrays of one size)."""
    out = np.empty(a.size, np.uint16)
    _add_bits_arrays(np.ascontiguousarray(a), np.ascontiguousarray(b), out, 0)
    return out


def bf16_add_arrays(a, b) -> np.ndarray:
    """Element-wise bfloat16 a + b on bits (uint16 arrays of one size)."""
    out = np.empty(a.size, np.uint16)
    _add_bits_arrays(np.ascontiguousarray(a), np.ascontiguousarray(b), out, 1)
    return out
