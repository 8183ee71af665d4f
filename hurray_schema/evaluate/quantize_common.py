"""What every quantizer shares: its input as bits in ``rows x cols``, element loads and block
statistics, codes stored into packed storage, and row kernels run on threads.

Every value is first taken to float32 (float16 / bfloat16 inputs widened exactly on their bits),
as the dequantization formulas compute in float32 (``quantization/per-block-affine.md §
Dequantization Formula``).  Blocks run along the last axis of a ``rows x cols`` view
(``b = row * nb + col // K``, ``quantization/per-block-affine.md § Block Layout``):
:func:`block_view` moves the quantized axis there and :func:`restore_layout` moves the codes back.
Codes are written straight into their packed storage (``element-types.md § Sub-Byte Integer
Types``: LSB first, 6-bit types four in three bytes) with the block axis padded to whole blocks
and the padding left as zero bytes (``per-block-affine.md § Padding``): :func:`_put` stores one,
:func:`pack_codes` packs one code per byte afterwards where rows do not own whole bytes.

The scheme modules build on this one: :mod:`.quantize_affine`, :mod:`.quantize_nf4_mxfp`.
"""

from __future__ import annotations

import math

import numpy as np

from ..model import ElementType
from ..structs.element_types import element_type_of
from . import jit
from .elements import _f16_to_f32_hw, bf16_to_f32, f16_to_f32_fast, float32_from_bits, has_f16c
from .jit import claim_span

__all__ = ["IN_F32", "IN_F16", "IN_BF16", "input_kind", "block_view", "restore_layout", "storage_bytes",
           "pack_codes", "MINMAX_FLAGS", "ROW_UNITS", "PARALLEL_MIN_ELEMENTS"]

IN_F32, IN_F16, IN_BF16 = 0, 1, 2
IN = IN_F32
"""The input kind a quantizer kernel is compiled for: a compile-time constant of each of its variants
(``kernel.variant(IN=...)``, read by the element loads below), so that its loops are specialized to
it and hold no code for the others."""

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
    """Bytes of ``count`` packed codes of ``bits`` bits (``element-types.md § Sub-Byte Integer Types``)."""
    return -(-count // 4) * 3 if bits == 6 else -(-count * bits // 8)


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
    """The exponent bits of the input kind's pattern: all set for an infinity or a NaN."""
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
    """Whether float32 ``v`` is neither infinite nor NaN."""
    return np.abs(v) <= _FLT_MAX


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
