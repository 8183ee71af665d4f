"""GGUF's block types whose values are a scale times an integer, as integer codes and float32 scales.

Each unpacker takes the blocks of one tensor as a ``(blocks, type_size)`` uint8 array and
returns ``(codes, scales)``: ``codes`` int8 ``(blocks, values_per_block)`` in element order,
``scales`` float32 ``(blocks, sub_blocks)``, such that value ``j`` of block ``i`` is
``scales[i, j // sub_block] * codes[i, j]`` -- one float32 product, the product GGUF's own
dequantization computes.  Where a GGUF scale is itself a product (``d * sc`` of the K types),
it is formed in float32 exactly: a float16 ``d`` has 11 significant bits, a 6- or 8-bit
``sc`` at most 8, so the product needs at most 19 of float32's 24.

That is what per-block affine quantization holds (``quantization/per-block-affine.md
§ Dequantization Formula``: ``s * (q - z)`` in float32, symmetric here so ``z = 0``), with the
block axis last (``§ Block Layout``: GGUF's rows are its blocks' order).

The byte layouts are GGUF's (ggml's ``block_q4_0`` and friends); they are read here with
NumPy, independently of the ``gguf`` package, whose ``gguf.quants.dequantize`` the tests
compare against bit for bit.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, NamedTuple, Optional

import numpy as np

from ..io.tensor import ProducedBuffer
from ..model import ElementType

__all__ = ["BlockMapping", "BLOCK_MAPPINGS", "OFFSET_TYPES", "SUPER_BLOCK"]

SUPER_BLOCK = 256
"""Values per super-block of the K, TQ and IQ types (ggml's ``QK_K``)."""

OFFSET_TYPES = frozenset({"Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"})
"""Types decoding to ``d * q + m`` (or ``d * q - m``) with a float offset ``m``: per-block affine's zero
points are integers (``§ Referenced Buffers``: int32), so these have no exact per-block form."""


class BlockMapping(NamedTuple):
    """How one GGUF block type becomes per-block affine.

    ``pack``, where given, is the short way for the common case: ``(data, scales)`` with ``data``
    the Hurray data buffer's bytes of the blocks (``(blocks, bytes)``, codes packed LSB-first)
    made straight from GGUF's bytes; it is used when every scale is finite and non-zero, and must
    give the bytes ``unpack``'s codes pack to.

    ``produce``, where given, is the short way made while the output is written: ``(data, scales)``
    as :class:`~hurray_schema.io.tensor.ProducedBuffer` s (the bytes ``unpack``'s codes pack to, zero scales
    settled as :func:`.gguf_format.settle_zero_scales` does), or None when some block has no exact
    form (``unpack``'s way then says which)."""

    sub_block: int  # Hurray's block_size: values sharing one scale
    storage: ElementType  # smallest signed storage holding every code
    unpack: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    pack: Optional[Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = None
    produce: Optional[Callable[[np.ndarray], Optional[tuple[ProducedBuffer, ProducedBuffer]]]] = None


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte ``start`` of every block, as float32 ``(blocks, 1)``."""
    blocks = np.ascontiguousarray(blocks)
    field = np.ndarray((blocks.shape[0], 1), "<f2", buffer=blocks, offset=start, strides=(blocks.shape[1], 2))
    return field.astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF's 4-bit halves of ``qs`` ``(blocks, n)``: the low nibbles of all bytes, then the high ones."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _q8_0(blocks):
    """``block_q8_0``: d (f16), 32 int8 codes."""
    return blocks[:, 2:34].view(np.int8), _f16(blocks, 0)


Q4_0_D, Q4_0_QS = 0, 2
"""``block_q4_0``: byte offsets of d (f16) and of its 16 bytes of nibbles."""


def _q4_0(blocks):
    """``block_q4_0``: d (f16), 16 bytes; value j < 16 is the low nibble of byte j, j >= 16 the high
    nibble of byte j - 16; code = nibble - 8."""
    return _nibbles(blocks[:, Q4_0_QS:Q4_0_QS + 16]).astype(np.int8) - np.int8(8), _f16(blocks, Q4_0_D)


def _q8_0_packed(blocks):
    """Q8_0's codes are Hurray's int8 bytes already."""
    return np.ascontiguousarray(blocks[:, 2:34]), _f16(blocks, 0)


PIECE_BLOCKS = 1 << 16
"""Blocks per piece of a produced buffer: 1 MiB of Q4_0 codes, made into memory that stays in the cache
until the file's write takes it."""

_SPARE: list = []
"""Memory of finished productions (pieces, a tensor's scales), for the next ones: re-used memory costs no
page faults, which fresh memory does on every page."""


_SPARE_LOCK = threading.Lock()


def _borrow(nbytes: int) -> np.ndarray:
    """``nbytes`` of spare memory (uint8), or new memory."""
    with _SPARE_LOCK:
        for i, spare in enumerate(_SPARE):
            if spare.size >= nbytes:
                return _SPARE.pop(i)[:nbytes]
    return np.empty(nbytes, np.uint8)


def _give_back(memory: np.ndarray) -> None:
    base = memory.base if isinstance(memory.base, np.ndarray) else memory
    with _SPARE_LOCK:
        _SPARE.append(base)
        if len(_SPARE) > 4:  # keep the largest few
            _SPARE.pop(min(range(len(_SPARE)), key=lambda i: _SPARE[i].size))


def _q4_0_produced(blocks):
    """Q4_0 the short way, made while the file is written (:class:`BlockMapping`'s ``produce``).

    One pass over the blocks first classifies their scales (any with no exact form: None).  The data
    buffer is then made :data:`PIECE_BLOCKS` blocks at a time by one kernel of the evaluator's quantizers
    (:func:`~hurray_schema.evaluate.quantize.nibble_records`: Hurray's byte k holds values 2k (low) and
    2k + 1 (high); values 0-15 are the low nibbles of GGUF's 16 bytes, 16-31 the high ones;
    ``nibble - 8`` in 4-bit two's complement is ``nibble ^ 8``), each piece written before the next is made, filling the tensor's scales in the same pass; the scales
    buffer, written next, hands those over (or, taken first or alone, makes them itself).  (Making the
    next piece on a helper thread while the current one was written measured slower on the shared
    two-core machine: the threads wait on each other for the GIL.)  The kernel reads the records in the
    host's byte order: on a big-endian host, None."""
    from ..evaluate.quantize import RECORD_ZERO_SCALE, nibble_records

    blocks = np.ascontiguousarray(blocks)
    if sys.byteorder != "little" or nibble_records(blocks, Q4_0_D, Q4_0_QS) > RECORD_ZERO_SCALE:
        return None
    count = blocks.shape[0]
    made_scales: list = []  # the scales the last pass over the data made, until the scales buffer takes them

    def data_pieces():
        piece, scales = _borrow(16 * PIECE_BLOCKS), _borrow(4 * count)
        try:
            for first in range(0, count, PIECE_BLOCKS):
                stop = min(count, first + PIECE_BLOCKS)
                out = piece[:16 * (stop - first)]
                nibble_records(blocks[first:stop], Q4_0_D, Q4_0_QS, out, scales[4 * first:4 * stop],
                               parallel=False, classify=False)
                yield out
        except BaseException:
            _give_back(scales)
            raise
        finally:
            _give_back(piece)
        made_scales[:] = [scales]

    def scale_pieces():
        if made_scales:
            scales = made_scales.pop()
            try:
                yield scales
            finally:
                _give_back(scales)
            return
        piece = _borrow(4 * PIECE_BLOCKS)
        try:
            for first in range(0, count, PIECE_BLOCKS):
                stop = min(count, first + PIECE_BLOCKS)
                out = piece[:4 * (stop - first)]
                nibble_records(blocks[first:stop], Q4_0_D, Q4_0_QS, scales=out, parallel=False,
                               classify=False)
                yield out
        finally:
            _give_back(piece)

    return ProducedBuffer(16 * count, data_pieces), ProducedBuffer(4 * count, scale_pieces)


def _q5_0(blocks):
    """``block_q5_0``: d (f16), qh (32 high bits, little-endian uint32, bit j for value j), 16 bytes of
    low nibbles as in Q4_0; code = (low | high << 4) - 16."""
    high = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")
    low = _nibbles(blocks[:, 6:22])
    return (low | (high << np.uint8(4))).astype(np.int8) - np.int8(16), _f16(blocks, 0)


def _q6_k(blocks):
    """``block_q6_K``: ql (128 bytes), qh (64), 16 int8 sub-block scales, d (f16); 16 sub-blocks of 16.

    Each half of 128 values takes 64 bytes of ql (low nibbles: values 0-63, high: 64-127 of the
    half) and 32 of qh (2-bit fields at shifts 0, 2, 4, 6: four runs of 32); code = (low | high << 4) - 32."""
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(0x0F)).reshape(n, 8, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & np.uint8(0x03)).reshape(n, 8, 32)
    codes = (ql | (qh << np.uint8(4))).astype(np.int8).reshape(n, SUPER_BLOCK) - np.int8(32)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    return codes, _f16(blocks, 208) * sc


def _q3_k(blocks):
    """``block_q3_K``: hmask (32 bytes), qs (64), 12 bytes of 6-bit scales, d (f16); 16 sub-blocks of 16.

    The 2-bit low parts are 4 fields per qs byte (shifts 0, 2, 4, 6; runs of 32 per 128 values),
    the high bit comes from hmask (bit b of byte j for value 32 * b + j) and subtracts 4 when it is
    clear: code = low - 4 * (1 - high).  Scale k: its low nibble from byte k % 8 (shift 4 for k >= 8),
    its two high bits from byte 8 + k % 4 (shift 2 * (k // 4)); scale = d * (sc - 32)."""
    n = blocks.shape[0]
    low = blocks[:, 32:96].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    low = (low & np.uint8(3)).reshape(n, SUPER_BLOCK)
    high = blocks[:, :32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = (high & np.uint8(1)).reshape(n, SUPER_BLOCK)
    codes = low.astype(np.int8) - ((high ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    packed = blocks[:, 96:108]
    lo = (packed[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (packed[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & np.uint8(0x0F)) | ((hi & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return codes, _f16(blocks, 108) * sc.astype(np.float32)


def _tq2_0(blocks):
    """``block_tq2_0``: 64 bytes of 2-bit fields (shifts 0, 2, 4, 6; runs of 32 per 128 values), d (f16);
    code = field - 1 (ternary -1, 0, 1; the field 3 gives 2)."""
    n = blocks.shape[0]
    q = blocks[:, :64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & np.uint8(3)).reshape(n, SUPER_BLOCK).astype(np.int8) - np.int8(1), _f16(blocks, 64)


def _tq1_0(blocks):
    """``block_tq1_0``: 48 bytes of five base-3 digits each (32 bytes for values 0-159 as five runs of 32,
    16 for 160-239 as five runs of 16), 4 bytes of four digits (240-255, four runs of 4), d (f16).
    Digit k of byte x is ``((x * 3**k mod 256) * 3) >> 8`` (ggml's fixed-point ternary); code = digit - 1."""
    n = blocks.shape[0]

    def digits(qs, count, run):
        powers = np.array([1, 3, 9, 27, 81][:count], np.uint8).reshape(1, 1, count, 1)
        scaled = qs.reshape(n, -1, 1, run) * powers  # uint8 arithmetic: mod 256
        return ((scaled.reshape(n, -1).astype(np.uint16) * 3) >> 8).astype(np.int8)

    codes = np.concatenate([digits(blocks[:, :32], 5, 32), digits(blocks[:, 32:48], 5, 16),
                            digits(blocks[:, 48:52], 4, 4)], axis=1) - np.int8(1)
    return codes, _f16(blocks, 52)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
"""The non-linear 4-bit codebook of IQ4_NL and IQ4_XS (ggml's ``kvalues_iq4nl``)."""


def _iq4_nl(blocks):
    """``block_iq4_nl``: d (f16), 16 bytes of nibbles ordered as Q4_0's; code = the codebook's value."""
    return IQ4_VALUES[_nibbles(blocks[:, 2:18])], _f16(blocks, 0)


def _iq4_xs(blocks):
    """``block_iq4_xs``: d (f16), scales_h (uint16: 2 high bits per sub-block), scales_l (4 bytes: a
    nibble per sub-block, low first), 128 bytes (16 per sub-block of 32, nibbles ordered as Q4_0's);
    scale = d * (sc - 32), code = the codebook's value."""
    n = blocks.shape[0]
    high = np.ascontiguousarray(blocks[:, 2:4]).view("<u2")
    high = (high >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)) & np.uint16(3)
    low = (blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], np.uint8).reshape(1, 1, 2)).reshape(n, 8)
    sc = ((low & np.uint8(0x0F)) | (high.astype(np.uint8) << np.uint8(4))).astype(np.int8) - np.int8(32)
    qs = blocks[:, 8:136].reshape(n * 8, 16)
    codes = IQ4_VALUES[_nibbles(qs)].reshape(n, SUPER_BLOCK)
    return codes, _f16(blocks, 0) * sc.astype(np.float32)


MXFP4_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
"""Twice the float4 e2m1 values of the 16 codes (ggml's ``kvalues_mxfp4``; both zero codes give +0)."""


def e8m0_half(exponents: np.ndarray) -> np.ndarray:
    """ggml's MXFP4 scale: ``2**(e - 128)`` as float32 (half the e8m0 value, since the codebook is
    doubled); 0 and 1 give the subnormals 2**-128 and 2**-127, 255 gives 2**127 -- never zero, never
    infinite, so every block has a valid per-block scale."""
    e = exponents.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x0020_0000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _mxfp4(blocks):
    """``block_mxfp4``: e (e8m0), 16 bytes of nibbles ordered as Q4_0's; code = twice the e2m1 value,
    scale = 2**(e - 128) -- an int8 per-block affine form that keeps e8m0 0xFF (a NaN for MXFP) and
    ggml's +0 for the code 8 (-0 for MXFP), both outside ``quantization/mxfp.md``'s decode."""
    return MXFP4_DOUBLED[_nibbles(blocks[:, 1:17])], e8m0_half(blocks[:, :1])


# --------------------------------------------------------------------------------------
# The IQ types: codebooks of 8 (or 4) magnitudes, a sign per value
# --------------------------------------------------------------------------------------


def _grid(kind: str) -> np.ndarray:
    """The codebook of an IQ type, ``(entries, values)`` int8: the ``gguf`` package's tables
    (ggml's ``iq2xxs_grid`` ...), whose entries are small integers."""
    from gguf import quants

    table = getattr(quants, kind)
    table.init_grid()
    grid = np.asarray(table.grid, np.float32).reshape(table.grid_shape)
    return grid.astype(np.int8)


def _even_signs() -> np.ndarray:
    """ggml's ``ksigns_iq2xs``: 7 sign bits, the 8th making the count of minus signs even."""
    index = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(index[:, None], axis=1).sum(axis=1) & 1
    return index | (parity.astype(np.uint8) << np.uint8(7))


def _sign_bits(sign_bytes: np.ndarray) -> np.ndarray:
    """Each byte's 8 bits, lowest first, as booleans (set: negative)."""
    return np.unpackbits(sign_bytes[..., None], axis=-1, bitorder="little").astype(bool)


def _signed(magnitudes: np.ndarray, negative: np.ndarray) -> np.ndarray:
    return np.where(negative, -magnitudes, magnitudes).astype(np.int8)


def _iq2_xxs(blocks):
    """``block_iq2_xxs``: d (f16), 8 sub-blocks of 32 as two uint32 each: 4 grid indices (bytes), then
    4 x 7 bits of sign index and a 4-bit scale s; scale = d * (0.5 + s) / 4 (exact)."""
    n = blocks.shape[0]
    words = np.ascontiguousarray(blocks[:, 2:66]).view("<u4").reshape(n, 8, 2)
    indices = np.ascontiguousarray(words[..., 0]).view(np.uint8).reshape(n, 8, 4)
    sign_index = (words[..., 1][..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F)
    negative = _sign_bits(_even_signs()[sign_index])
    codes = _signed(_grid("IQ2_XXS")[indices], negative).reshape(n, SUPER_BLOCK)
    s = (words[..., 1] >> np.uint32(28)).astype(np.float32)
    return codes, _f16(blocks, 0) * (np.float32(0.5) + s) * np.float32(0.25)


def _nibble_scales(scale_bytes: np.ndarray) -> np.ndarray:
    """4-bit sub-block scales, the low nibble of each byte first, as float32."""
    n = scale_bytes.shape[0]
    return np.stack([scale_bytes & np.uint8(0x0F), scale_bytes >> np.uint8(4)], axis=-1).reshape(n, -1) \
        .astype(np.float32)


def _iq2_xs(blocks):
    """``block_iq2_xs``: d (f16), 32 uint16 (9-bit grid index, 7-bit sign index per 8 values), 8 bytes of
    4-bit scales (16 sub-blocks of 16); scale = d * (0.5 + s) / 4."""
    n = blocks.shape[0]
    words = np.ascontiguousarray(blocks[:, 2:66]).view("<u2").reshape(n, 32)
    negative = _sign_bits(_even_signs()[words >> np.uint16(9)])
    codes = _signed(_grid("IQ2_XS")[words & np.uint16(511)], negative).reshape(n, SUPER_BLOCK)
    return codes, _f16(blocks, 0) * (np.float32(0.5) + _nibble_scales(blocks[:, 66:74])) * np.float32(0.25)


def _iq2_s(blocks):
    """``block_iq2_s``: d (f16), 32 grid index bytes, 32 sign bytes (a bit per value), 8 bytes of 2 high
    index bits per group (lowest first), 8 bytes of 4-bit scales (16 sub-blocks of 16)."""
    n = blocks.shape[0]
    high = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)
    indices = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << np.uint16(8))
    codes = _signed(_grid("IQ2_S")[indices], _sign_bits(blocks[:, 34:66])).reshape(n, SUPER_BLOCK)
    return codes, _f16(blocks, 0) * (np.float32(0.5) + _nibble_scales(blocks[:, 74:82])) * np.float32(0.25)


def _iq3_xxs(blocks):
    """``block_iq3_xxs``: d (f16), 64 grid index bytes (4 values each), 8 uint32 (4 x 7-bit sign index,
    4-bit scale s per sub-block of 32); scale = d * (0.5 + s) / 2."""
    n = blocks.shape[0]
    words = np.ascontiguousarray(blocks[:, 66:98]).view("<u4").reshape(n, 8)
    sign_index = (words[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F)
    negative = _sign_bits(_even_signs()[sign_index]).reshape(n, SUPER_BLOCK)
    codes = _signed(_grid("IQ3_XXS")[blocks[:, 2:66]].reshape(n, SUPER_BLOCK), negative)
    s = (words >> np.uint32(28)).astype(np.float32)
    return codes, _f16(blocks, 0) * (np.float32(0.5) + s) * np.float32(0.5)


def _iq3_s(blocks):
    """``block_iq3_s``: d (f16), 64 grid index bytes, 8 bytes of a 9th index bit per group (lowest first),
    32 sign bytes, 4 bytes of 4-bit scales (8 sub-blocks of 32); scale = d * (1 + 2 s)."""
    n = blocks.shape[0]
    high = _sign_bits(blocks[:, 66:74]).reshape(n, 64).astype(np.uint16)
    indices = blocks[:, 2:66].astype(np.uint16) | (high << np.uint16(8))
    negative = _sign_bits(blocks[:, 74:106]).reshape(n, SUPER_BLOCK)
    codes = _signed(_grid("IQ3_S")[indices].reshape(n, SUPER_BLOCK), negative)
    return codes, _f16(blocks, 0) * (np.float32(1) + np.float32(2) * _nibble_scales(blocks[:, 106:110]))


IQ1_DELTA_EIGHTHS = 1
"""IQ1's offset, 0.125, in eighths: a value ``dl * (g + delta)`` is ``(dl / 8) * (8 g + 8 delta)``, the
product of the same real numbers (``dl / 8`` is exact: ``dl`` is at least 2**-24), so one rounding gives
the same float32."""


def _iq1_s(blocks):
    """``block_iq1_s``: d (f16), 32 grid index bytes, 8 uint16 per sub-block of 32: 4 x 3 high index bits,
    a 3-bit scale s, the offset's sign (bit 15); value = d * (2 s + 1) * (g + delta), g in {-1, 0, 1}."""
    n = blocks.shape[0]
    qh = np.ascontiguousarray(blocks[:, 34:50]).view("<u2").reshape(n, 8)
    high = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)
    indices = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << np.uint16(8))
    delta = np.where((qh & np.uint16(0x8000)) == 0, IQ1_DELTA_EIGHTHS, -IQ1_DELTA_EIGHTHS).astype(np.int8)
    codes = (_grid("IQ1_S")[indices].reshape(n, 8, 32) * np.int8(8) + delta[..., None]).reshape(n, SUPER_BLOCK)
    s = ((qh >> np.uint16(12)) & np.uint16(7)).astype(np.float32)
    return codes, _f16(blocks, 0) * (np.float32(2) * s + np.float32(1)) / np.float32(8)


def _iq1_m(blocks):
    """``block_iq1_m``: 32 grid index bytes, 16 bytes (per group of 8: 3 high index bits and the offset's
    sign, low nibble first), 4 uint16 holding 16 x 3-bit scales (sub-blocks of 16) and, in their top
    nibbles, d (f16); value = d * (2 s + 1) * (g + delta)."""
    n = blocks.shape[0]
    words = np.ascontiguousarray(blocks[:, 48:56]).view("<u2").reshape(n, 4)
    d_bits = (words >> np.uint16(12)) << np.array([0, 4, 8, 12], np.uint16)
    d = np.bitwise_or.reduce(d_bits, axis=1).astype(np.uint16).view(np.float16).astype(np.float32)[:, None]
    s = ((words[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)).reshape(n, 16).astype(np.float32)
    qh = np.stack([blocks[:, 32:48] & np.uint8(0x0F), blocks[:, 32:48] >> np.uint8(4)], axis=-1).reshape(n, 32)
    indices = blocks[:, :32].astype(np.uint16) | ((qh & np.uint8(7)).astype(np.uint16) << np.uint16(8))
    delta = np.where((qh & np.uint8(8)) == 0, IQ1_DELTA_EIGHTHS, -IQ1_DELTA_EIGHTHS).astype(np.int8)
    codes = (_grid("IQ1_M")[indices] * np.int8(8) + delta[..., None]).reshape(n, SUPER_BLOCK)
    return codes, d * (np.float32(2) * s + np.float32(1)) / np.float32(8)


BLOCK_MAPPINGS: dict[str, BlockMapping] = {
    "Q8_0": BlockMapping(32, ElementType.INT8, _q8_0, _q8_0_packed),
    "Q4_0": BlockMapping(32, ElementType.INT4, _q4_0, produce=_q4_0_produced),
    "Q5_0": BlockMapping(32, ElementType.INT8, _q5_0),
    "Q6_K": BlockMapping(16, ElementType.INT8, _q6_k),
    "Q3_K": BlockMapping(16, ElementType.INT4, _q3_k),
    "TQ2_0": BlockMapping(SUPER_BLOCK, ElementType.INT4, _tq2_0),
    "TQ1_0": BlockMapping(SUPER_BLOCK, ElementType.INT2, _tq1_0),
    "IQ4_NL": BlockMapping(32, ElementType.INT8, _iq4_nl),
    "IQ4_XS": BlockMapping(32, ElementType.INT8, _iq4_xs),
    "MXFP4": BlockMapping(32, ElementType.INT8, _mxfp4),
    "IQ2_XXS": BlockMapping(32, ElementType.INT8, _iq2_xxs),
    "IQ2_XS": BlockMapping(16, ElementType.INT8, _iq2_xs),
    "IQ2_S": BlockMapping(16, ElementType.INT8, _iq2_s),
    "IQ3_XXS": BlockMapping(32, ElementType.INT8, _iq3_xxs),
    "IQ3_S": BlockMapping(32, ElementType.INT8, _iq3_s),
    "IQ1_S": BlockMapping(32, ElementType.INT8, _iq1_s),
    "IQ1_M": BlockMapping(16, ElementType.INT8, _iq1_m),
}
"""GGUF type name -> its per-block affine form."""
