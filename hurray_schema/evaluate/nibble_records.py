"""Scaled nibble records (GGUF's Q4_0 layout among them) to per-block int4 codes and float32 scales.

A record holds a float16 scale ``d`` and 32 4-bit codes stored as ``code + 8``; its values are
``d * code``, which is per-block affine with int4 codes, block 32 and zero point 0
(``quantization/per-block-affine.md § Dequantization Formula``).  :func:`nibble_records` rewrites
the codes in int4 two's complement, element order (``element-types.md § Sub-Byte Integer Types``)
and widens the scales, and classifies the records by whether that form is exact
(``RECORD_*``).
"""

from __future__ import annotations

import numpy as np

from ..errors import HurraySchemaError
from . import jit
from .elements import f16_to_f32_not_nan, float32_bits
from .jit import claim_span, slot
from .quantize_common import ROW_UNITS

__all__ = ["nibble_records", "RECORD_EXACT", "RECORD_ZERO_SCALE", "RECORD_ZERO_BOTH_SIGNS", "RECORD_NOT_FINITE",
           "RECORDS_PARALLEL_MIN"]


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

    from .dequantize_simd import _element_pointer

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
        from .dequantize_simd import _element_pointer, _splat

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
