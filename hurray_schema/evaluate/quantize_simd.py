"""Explicit vector code for the per-block 4-bit affine quantizer: 16 elements per step.

Two steps, each a loop over a block of ``count`` elements (``count`` a multiple of
:data:`LANES`) written as LLVM vector IR (llvmlite), the technique of :mod:`.dequantize_simd`:

* ``block_minmax_*`` -- the block's float32 minimum and maximum (masked elements left out)
  and whether it holds a NaN or an infinity, found on the bits (an exponent of all ones), as
  :func:`.quantize_common._minmax` does;
* ``block_codes_*`` -- ``clamp(rint(v / s), lo - z, hi - z) + z`` lane by lane (an IEEE
  ``fdiv``: correctly rounded per lane, no fast-math flag; ``llvm.rint``: ties to even), two
  codes per byte, element ``2k`` in the low nibble (``element-types.md § Sub-Byte Integer
  Types``).  The clamped quotients are narrowed to bytes before ``z`` is added: a nibble is
  ``(q + z) mod 16`` either way.  Each step also prefetches the input ``ahead`` elements past
  the lanes it loads (the caller passes a row's length, so the next row arrives in cache while
  this one is coded; a prefetch never faults, wherever it points).

The inputs are the kernels' bit patterns: a 16-bit array holds float16 (``bfloat=False``,
widened by ``fpext half -> float``, ``vcvtph2ps`` with F16C) or bfloat16 (``bfloat=True``,
shifted into the high half of a float32); a 32-bit array holds float32 whatever ``bfloat``
says.  Every conversion is exact.  Without F16C LLVM would lower the float16 widening to a
runtime call per lane, so callers use the float16 steps only when :data:`VECTOR_F16`.

The quotient stays a division.  A product with the reciprocal ``fl(1 / s)`` is within
``2**-22 |y|`` of ``fl(v / s)``, so it rounds to the same integer unless it lies within
``2**-17`` of a half-integer (for ``|y| < 32``; beyond, both clamp alike), and such a block can
be redone by division; but on the hosts measured (AMD Zen 3, AVX2) that check per lane cost
more than the pipelined ``vdivps`` it saved, so the exact division is kept.

The minimum and maximum may differ from the scalar reduction only in the sign of a zero,
which changes no scale, zero point or code; the code steps are only defined for blocks of
finite elements and a finite, non-zero scale (the caller takes the scalar path otherwise).
The ``_f16`` / ``_bf16`` suffix is the 16-bit input's type.
"""

from __future__ import annotations

from llvmlite import ir

from . import jit
from .elements import has_f16c

__all__ = ["LANES", "vector_f16", "block_minmax_f16", "block_minmax_bf16", "block_minmax_masked_f16",
           "block_minmax_masked_bf16", "block_codes_f16", "block_codes_bf16"]

LANES = 16
"""Elements per vector step."""


def vector_f16() -> bool:
    """float16 inputs may take the vector steps (the host widens float16 in hardware)."""
    return has_f16c()

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_VI32 = ir.VectorType(_I32, LANES)
_VI8 = ir.VectorType(_I8, LANES)
_EXPONENT_F16, _EXPONENT_BF16, _EXPONENT_F32 = 0x7C00, 0x7F80, 0x7F800000


def _splat(vty, value):
    return ir.Constant(vty, [value] * vty.count)


def _splat_value(builder, value, vty):
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _pointer(context, builder, aty, array, index, vty):
    """``array[index]`` as a pointer to ``vty`` (no bounds or wrap-around check: the caller owns the range)."""
    from numba.core import cgutils

    a = context.make_array(aty)(context, builder, array)
    p = cgutils.get_item_pointer(context, builder, aty, a, [index], wraparound=False, boundscheck=False)
    return builder.bitcast(p, vty.as_pointer())


def _width(xty):
    """Bits of one input element: 16 or 32 (None for anything else)."""
    from numba import types

    if isinstance(xty, types.Array) and isinstance(xty.dtype, types.Integer) and xty.dtype.bitwidth in (16, 32):
        return xty.dtype.bitwidth
    return None


def _load_lanes(context, builder, xty, x, index, bfloat):
    """(LANES input bit patterns as integers, the same as float32 values) at ``x[index]``."""
    width = xty.dtype.bitwidth
    bty = ir.VectorType(ir.IntType(width), LANES)
    bits = builder.load(_pointer(context, builder, xty, x, index, bty), align=width // 8)
    if width == 32:
        return bits, builder.bitcast(bits, _VF)
    if bfloat:
        wide = builder.shl(builder.zext(bits, _VI32), _splat(_VI32, 16))
        return bits, builder.bitcast(wide, _VF)
    return bits, builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), _VF)


def _is_special(builder, bits, width, bfloat):
    """Lanes whose exponent is all ones (NaN or infinity), as <LANES x i1>."""
    mask = _EXPONENT_F32 if width == 32 else (_EXPONENT_BF16 if bfloat else _EXPONENT_F16)
    emask = _splat(bits.type, mask)
    return builder.icmp_unsigned("==", builder.and_(bits, emask), emask)


def _reduce(builder, v, combine):
    """Fold the lanes of ``v`` pairwise with ``combine(builder, a, b)``; the single result."""
    n = v.type.count
    while n > 1:
        n //= 2
        low = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        high = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = combine(builder, low, high)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _fmin(builder, a, b):
    return builder.select(builder.fcmp_ordered("<", a, b), a, b)


def _fmax(builder, a, b):
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


def _any_lane(builder, flags):
    """<LANES x i8> of 0 / 1 -> i1: some lane is set."""
    return builder.icmp_unsigned("!=", builder.bitcast(flags, ir.IntType(8 * LANES)), ir.Constant(ir.IntType(8 * LANES), 0))


def _make_minmax(bfloat: bool, masked: bool):
    """The intrinsic ``(min, max, special kept, special any) = step(x, start, count[, mask])``."""

    def typer(typingctx, x, start, count, *mask):
        from numba import types

        if _width(x) is None or len(mask) != int(masked):
            return None
        rty = types.Tuple((types.float32, types.float32, types.boolean, types.boolean))
        return rty(x, start, count, *mask), codegen

    def codegen(context, builder, sig, args):
        from numba import types
        from numba.core import cgutils

        xty = sig.args[0]
        width = xty.dtype.bitwidth
        start = context.cast(builder, args[1], sig.args[1], types.int64)
        count = context.cast(builder, args[2], sig.args[2], types.int64)
        chunks = builder.lshr(count, ir.Constant(_I64, 4))
        lo_acc = cgutils.alloca_once_value(builder, _splat(_VF, float("inf")))
        hi_acc = cgutils.alloca_once_value(builder, _splat(_VF, float("-inf")))
        kept_acc = cgutils.alloca_once_value(builder, _splat(_VI8, 0))
        any_acc = cgutils.alloca_once_value(builder, _splat(_VI8, 0))
        with cgutils.for_range(builder, chunks) as loop:
            index = builder.add(start, builder.shl(loop.index, ir.Constant(_I64, 4)))
            bits, v = _load_lanes(context, builder, xty, args[0], index, bfloat)
            special = _is_special(builder, bits, width, bfloat)
            v_lo = v_hi = v
            kept = special
            if masked:
                m = builder.load(_pointer(context, builder, sig.args[3], args[3], index, _VI8), align=1)
                keep = builder.icmp_unsigned("==", m, _splat(_VI8, 0))
                v_lo = builder.select(keep, v, _splat(_VF, float("inf")))
                v_hi = builder.select(keep, v, _splat(_VF, float("-inf")))
                kept = builder.and_(special, keep)
                builder.store(builder.or_(builder.load(any_acc), builder.zext(special, _VI8)), any_acc)
            builder.store(_fmin(builder, v_lo, builder.load(lo_acc)), lo_acc)
            builder.store(_fmax(builder, v_hi, builder.load(hi_acc)), hi_acc)
            builder.store(builder.or_(builder.load(kept_acc), builder.zext(kept, _VI8)), kept_acc)
        mn = _reduce(builder, builder.load(lo_acc), _fmin)
        mx = _reduce(builder, builder.load(hi_acc), _fmax)
        special_kept = _any_lane(builder, builder.load(kept_acc))
        special_any = _any_lane(builder, builder.load(any_acc)) if masked else special_kept
        return context.make_tuple(builder, sig.return_type, [mn, mx, special_kept, special_any])

    if masked:
        def step(typingctx, x, start, count, mask):
            return typer(typingctx, x, start, count, mask)
    else:
        def step(typingctx, x, start, count):
            return typer(typingctx, x, start, count)
    return jit.intrinsic(step)


def _rint(builder, v):
    from numba.core import cgutils

    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF]), "llvm.rint.v16f32")
    return builder.call(fn, [v])


def _prefetch(builder, pointer):
    """``llvm.prefetch`` of ``pointer`` for reading, into all cache levels (a hint: never faults)."""
    from numba.core import cgutils

    i8p = _I8.as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(pointer, i8p), ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                      ir.Constant(_I32, 1)])


def _pack_nibbles(builder, q, z8):
    """<LANES x i32> codes ``q - z`` (small integers) and <LANES x i8> ``z`` -> <LANES/2 x i8>: byte ``k`` holds
    code ``2k`` in its low nibble and code ``2k + 1`` in its high one.  Seen as 16-bit lanes, the nibble
    bytes ``c`` give ``c | c >> 4`` = the packed byte in the low half."""
    half = LANES // 2
    nib = builder.and_(builder.add(builder.trunc(q, _VI8), z8), _splat(_VI8, 15))
    pairs = builder.bitcast(nib, ir.VectorType(_I16, half))
    pairs = builder.or_(pairs, builder.lshr(pairs, ir.Constant(pairs.type, [4] * half)))
    return builder.trunc(pairs, ir.VectorType(_I8, half))


def _make_codes(bfloat: bool):
    """The intrinsic ``step(x, start, count, s, qlo, qhi, z, out, dst, ahead)``: the 4-bit codes of
    ``x[start:start + count]`` packed into ``out[dst:dst + count // 2]``, prefetching ``ahead`` elements on."""

    @jit.intrinsic
    def step(typingctx, x, start, count, s, qlo, qhi, z, out, dst, ahead):
        from numba import types
        from numba.core import cgutils

        if _width(x) is None or not (isinstance(out, types.Array) and out.dtype == types.uint8):
            return None

        def codegen(context, builder, sig, args):
            xty, oty = sig.args[0], sig.args[7]
            start_ = context.cast(builder, args[1], sig.args[1], types.int64)
            count_ = context.cast(builder, args[2], sig.args[2], types.int64)
            dst_ = context.cast(builder, args[8], sig.args[8], types.int64)
            ahead_ = context.cast(builder, args[9], sig.args[9], types.int64)
            s_ = _splat_value(builder, context.cast(builder, args[3], sig.args[3], types.float32), _VF)
            qlo_ = _splat_value(builder, context.cast(builder, args[4], sig.args[4], types.float32), _VF)
            qhi_ = _splat_value(builder, context.cast(builder, args[5], sig.args[5], types.float32), _VF)
            z8 = _splat_value(builder, builder.trunc(context.cast(builder, args[6], sig.args[6], types.int32), _I8),
                              _VI8)
            data = context.make_array(xty)(context, builder, args[0]).data
            vbytes = ir.VectorType(_I8, LANES // 2)
            chunks = builder.lshr(count_, ir.Constant(_I64, 4))
            with cgutils.for_range(builder, chunks) as loop:
                index = builder.add(start_, builder.shl(loop.index, ir.Constant(_I64, 4)))
                _prefetch(builder, builder.gep(data, [builder.add(index, ahead_)]))  # no inbounds: any address
                _, v = _load_lanes(context, builder, xty, args[0], index, bfloat)
                y = _rint(builder, builder.fdiv(v, s_))  # no fast-math flags: IEEE quotient
                y = builder.select(builder.fcmp_ordered(">", y, qlo_), y, qlo_)
                y = builder.select(builder.fcmp_ordered("<", y, qhi_), y, qhi_)
                packed = _pack_nibbles(builder, builder.fptosi(y, _VI32), z8)
                o = builder.add(dst_, builder.shl(loop.index, ir.Constant(_I64, 3)))
                builder.store(packed, _pointer(context, builder, oty, args[7], o, vbytes), align=1)
            return context.get_dummy_value()

        return types.void(x, start, count, s, qlo, qhi, z, out, dst, ahead), codegen

    return step


_MINMAX = {(b, m): _make_minmax(b, m) for b in (False, True) for m in (False, True)}
block_minmax_f16, block_minmax_bf16 = _MINMAX[False, False], _MINMAX[True, False]
block_minmax_masked_f16, block_minmax_masked_bf16 = _MINMAX[False, True], _MINMAX[True, True]
block_codes_f16, block_codes_bf16 = _make_codes(False), _make_codes(True)
