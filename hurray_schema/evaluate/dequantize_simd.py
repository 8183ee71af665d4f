"""Explicit vector code for the hot dequantization loop: 32 packed 4-bit codes per step.

One step loads 16 bytes, splits every byte into its two nibbles (element ``2k`` in the low
nibble, ``element-types.md § 4-bit packing``), sign-extends them for int4, then applies the
affine formula of ``quantization/per-block-affine.md § Dequantization Formula`` lane by lane,
in the reference's order: ``q - z`` in wrapping int32 arithmetic, converted to float32,
times the float32 scale ``s``.  The float32 products are rounded once to the decoded type:

* float16 -- LLVM ``fptrunc <32 x float> to <32 x half>`` (``vcvtps2ph`` with F16C),
  round to nearest even, the bits NumPy gives for every non-NaN value;
* bfloat16 -- the integer round-to-nearest-even of :func:`elements.f32_to_bf16` for
  non-NaN values;
* float32 -- stored as is.

A finite scale times a finite integer is never NaN, so the callers use these steps only for
blocks whose scale is finite (the NaN rules then never matter) and the exact scalar code
otherwise.  Written as LLVM vector IR (llvmlite) rather than a loop left to the
auto-vectorizer, whose output depends on the index arithmetic numba emits (wrap-around
checks on signed indices kept the plain loop scalar).  Without F16C the float16 step is the
scalar software conversion, since LLVM would lower ``fptrunc`` to a compiler-runtime call;
:data:`VECTOR_F16` tells the dispatcher which one it got.
"""

from __future__ import annotations

import numpy as np

from . import jit
from .elements import f32_to_bf16, f32_to_f16_fast, has_f16c

__all__ = ["LANES", "vector_f16", "int4x32", "int4x32_scalar", "STEP_F32", "STEP_F16", "STEP_BF16"]

LANES = 32
"""Elements decoded per step (16 packed bytes)."""

STEP_F32, STEP_F16, STEP_BF16 = 0, 1, 2  # same numbering as dequantize.OUT_F32 / OUT_F16 / OUT_BF16

def vector_f16() -> bool:
    """The float16 step is vector code (the host converts float32 -> float16 in hardware)."""
    return has_f16c()

_BYTES = LANES // 2


def _splat(builder, value, vty):
    """A vector of type ``vty`` with every lane equal to ``value``."""
    from llvmlite import ir

    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, vty.count), [0] * vty.count))


def _element_pointer(context, builder, aty, array, index):
    """Address of ``array[index]`` (no bounds or wrap-around check: the caller guarantees the range)."""
    from numba.core import cgutils

    a = context.make_array(aty)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, aty, a, [index], wraparound=False, boundscheck=False)


def _affine_lanes(builder, packed, signed, s, z):
    """<16 x i8> packed codes -> <32 x float> ``float32(int32(q - z)) * s``, lanes in element order."""
    from llvmlite import ir

    i32, f32 = ir.IntType(32), ir.FloatType()
    four = ir.Constant(packed.type, [4] * _BYTES)
    if signed:  # two's-complement nibbles: arithmetic shifts sign-extend them
        lo = builder.ashr(builder.shl(packed, four), four)
        hi = builder.ashr(packed, four)
    else:
        lo = builder.and_(packed, ir.Constant(packed.type, [15] * _BYTES))
        hi = builder.lshr(packed, four)
    interleave = [lane for k in range(_BYTES) for lane in (k, k + _BYTES)]  # low nibble first
    codes = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(i32, LANES), interleave))
    extend = builder.sext if signed else builder.zext
    q = extend(codes, ir.VectorType(i32, LANES))
    d = builder.sub(q, _splat(builder, z, q.type))  # plain `sub`: wraps like int32
    x = builder.sitofp(d, ir.VectorType(f32, LANES))
    return builder.fmul(x, _splat(builder, s, x.type))  # no fast-math flags: IEEE float32 product


def _round_bf16(builder, x):
    """float32 lanes -> bfloat16 bits, round to nearest even (:func:`elements.f32_to_bf16` without its NaN branch)."""
    from llvmlite import ir

    i32 = ir.IntType(32)
    vi = ir.VectorType(i32, LANES)
    f = builder.bitcast(x, vi)
    lsb = builder.and_(builder.lshr(f, ir.Constant(vi, [16] * LANES)), ir.Constant(vi, [1] * LANES))
    r = builder.add(builder.add(f, ir.Constant(vi, [0x7FFF] * LANES)), lsb)
    return builder.trunc(builder.lshr(r, ir.Constant(vi, [16] * LANES)), ir.VectorType(ir.IntType(16), LANES))


def _make_step(signed: bool, kind: int):
    """The intrinsic ``step(buf, byte, s, z, out, o)``: decode the 32 codes in ``buf[byte:byte + 16]``
    into ``out[o:o + 32]``.  ``buf`` is uint8, ``out`` float32 (``STEP_F32``) or uint16 (bits)."""

    @jit.intrinsic
    def step(typingctx, buf, byte, s, z, out, o):
        from numba import types

        want = types.float32 if kind == STEP_F32 else types.uint16
        if not (isinstance(out, types.Array) and out.dtype == want and isinstance(buf, types.Array)
                and buf.dtype == types.uint8):
            return None

        def codegen(context, builder, sig, args):
            from llvmlite import ir

            bty, _, sty, zty, oty, _ = sig.args
            src = _element_pointer(context, builder, bty, args[0], args[1])
            packed = builder.load(builder.bitcast(src, ir.VectorType(ir.IntType(8), _BYTES).as_pointer()), align=1)
            s_ = context.cast(builder, args[2], sty, types.float32)
            z_ = context.cast(builder, args[3], zty, types.int32)
            x = _affine_lanes(builder, packed, signed, s_, z_)
            if kind == STEP_F16:
                value = builder.bitcast(builder.fptrunc(x, ir.VectorType(ir.HalfType(), LANES)),
                                        ir.VectorType(ir.IntType(16), LANES))
            elif kind == STEP_BF16:
                value = _round_bf16(builder, x)
            else:
                value = x
            dst = _element_pointer(context, builder, oty, args[4], args[5])
            builder.store(value, builder.bitcast(dst, value.type.as_pointer()), align=oty.dtype.bitwidth // 8)
            return context.get_dummy_value()

        return types.void(buf, byte, s, z, out, o), codegen

    return step


_S_F32, _S_F16, _S_BF16 = _make_step(True, STEP_F32), _make_step(True, STEP_F16), _make_step(True, STEP_BF16)
_U_F32, _U_F16, _U_BF16 = _make_step(False, STEP_F32), _make_step(False, STEP_F16), _make_step(False, STEP_BF16)


@jit.helper(inline="always")
def _lane(b, high, signed):
    """One nibble of byte ``b`` as int32 (sign-extended for int4)."""
    c = np.int32(b >> np.uint8(4)) if high else np.int32(b & np.uint8(15))
    if signed and c >= 8:
        c -= np.int32(16)
    return c


OUT = STEP_F32
"""The output a step is compiled for: a compile-time constant of the calling kernel's variant (the same
name as the decode kernels' ``dequantize.OUT``, whose numbering the steps share)."""


@jit.helper
def int4x32_scalar(buf, byte, s, z, out, o, signed):
    """Element by element what one vector step computes (exact for any scale, NaN rules included)."""
    s = np.float32(s)
    for k in range(LANES):
        q = _lane(buf[byte + (k >> 1)], k & 1, signed)
        x = np.float32(np.float32(np.int32(q - np.int32(z))) * s)
        if OUT == STEP_F16:
            out[o + k] = f32_to_f16_fast(x)
        elif OUT == STEP_BF16:
            out[o + k] = f32_to_bf16(x)
        else:
            out[o + k] = x


@jit.helper(inline="always")
def _half_step_vector(buf, byte, s, z, out, o, signed):
    if signed:
        _S_F16(buf, byte, s, z, out, o)
    else:
        _U_F16(buf, byte, s, z, out, o)


_half_step = jit.choose(lambda: _half_step_vector if vector_f16() else int4x32_scalar, _half_step_vector.py_func)
"""The float16 step: vector code where the host converts float32 -> float16 in hardware, else scalar."""


@jit.helper(inline="always")
def int4x32(buf, byte, s, z, out, o, signed):
    """Decode the 32 codes in ``buf[byte:byte + 16]`` into ``out[o:o + 32]`` (jitted code only).

    ``out`` is float32 (``OUT == STEP_F32``), or uint16 holding float16 (``STEP_F16``) or bfloat16
    bits (``STEP_BF16``).  Same bits as :func:`int4x32_scalar` whenever ``s`` is finite; no bounds checks.
    """
    if OUT == STEP_F16:
        _half_step(buf, byte, s, z, out, o, signed)
    elif OUT == STEP_BF16:
        if signed:
            _S_BF16(buf, byte, s, z, out, o)
        else:
            _U_BF16(buf, byte, s, z, out, o)
    elif signed:
        _S_F32(buf, byte, s, z, out, o)
    else:
        _U_F32(buf, byte, s, z, out, o)
