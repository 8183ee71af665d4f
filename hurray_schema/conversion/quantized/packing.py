"""Packed codes as quantization libraries store them, opened and closed with NumPy.

Most layouts put ``32 // bits`` codes into one int32 word along an axis, code ``i`` of a word at
bits ``[bits * i, bits * (i + 1))`` (least significant first); AWQ permutes the codes within a
word (``order``).  Hurray packs sub-byte codes LSB-first along the row-major element order
(``element-types.md § Sub-Byte Integer Types``), which :func:`~hurray_schema.builders.quantized_from_codes`
does from one code per element.

Besides: the one test of a group size that becomes a per-block ``block_size``
(:func:`require_block_size`), the float dtypes the layouts keep scales in by name
(:data:`FLOAT_NAMES`, :func:`float_dtype`), and codes packed in planes of rows along axis 0
(:func:`unpack_planes`, HQQ's and optimum-quanto's byte packing)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from ...structs._declare import power_of_two
from ...model import QuantScheme
from ...structs.quantization import BLOCK_SIZE_BOUNDS

__all__ = ["unpack_words", "pack_words", "unpack_planes", "ulp_distance", "require_block_size", "FLOAT_NAMES",
           "float_dtype"]

FLOAT_NAMES = ("float16", "bfloat16", "float32")
"""The float dtypes (by NumPy name) the layouts keep scales and compute in, and per-block scales'
``scale_type`` (``quantization/per-block-affine.md § Referenced Buffers``)."""


def float_dtype(name: str) -> np.dtype:
    """The NumPy dtype of one of :data:`FLOAT_NAMES` (bfloat16: ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def require_block_size(weight: str, size: int, what: str) -> None:
    """:class:`NoExactForm` unless ``size`` (a layout's group, described as ``what``: "AWQ group
    size" ...) may be a per-block affine ``block_size``: a power of two within the scheme's bounds
    (:data:`~hurray_schema.structs.quantization.BLOCK_SIZE_BOUNDS`)."""
    lowest, highest = BLOCK_SIZE_BOUNDS[QuantScheme.PER_BLOCK_AFFINE]
    if power_of_two(size) and size >= lowest and (highest is None or size <= highest):
        return
    bounds = f"of at least {lowest}" if highest is None else f"from {lowest} to {highest}"
    raise NoExactForm(f"{weight}: {what} {size} is not a power of two {bounds}, which a per-block affine "
                      "block_size must be (quantization/per-block-affine.md § Validity Constraints)")


def unpack_words(words: np.ndarray, bits: int, axis: int, order: Optional[Sequence[int]] = None) -> np.ndarray:
    """The codes of integer ``words`` (int32 or uint8 ...), ``per = width // bits`` to a word along
    ``axis``: the result's ``axis`` is ``per`` times longer, code ``per * j + k`` taken from word
    ``j`` at bits ``bits * order[k]`` (``order`` default ``0, 1, ...``).  Codes are unsigned, uint8."""
    words = np.asarray(words)
    width = words.dtype.itemsize * 8
    if words.dtype.kind not in "iu" or width % bits:
        raise HurraySchemaError(f"{words.dtype} words do not hold whole {bits}-bit codes")
    per = width // bits
    order = tuple(range(per)) if order is None else tuple(order)
    if sorted(order) != list(range(per)):
        raise HurraySchemaError(f"code order {order} is not a permutation of {per} codes")
    unsigned = words.view(np.dtype(f"u{words.dtype.itemsize}"))
    moved = np.moveaxis(unsigned, axis, -1)
    mask = (1 << bits) - 1
    shifts = np.array([bits * k for k in order], dtype=unsigned.dtype)
    codes = (moved[..., None] >> shifts) & unsigned.dtype.type(mask)
    codes = codes.reshape(moved.shape[:-1] + (moved.shape[-1] * per,)).astype(np.uint8)
    return np.moveaxis(codes, -1, axis)


def pack_words(codes: np.ndarray, bits: int, axis: int, dtype=np.int32,
               order: Optional[Sequence[int]] = None) -> np.ndarray:
    """The inverse of :func:`unpack_words`: unsigned ``codes`` into ``dtype`` words along ``axis``."""
    codes = np.asarray(codes)
    out_dtype = np.dtype(dtype)
    width = out_dtype.itemsize * 8
    per = width // bits
    order = tuple(range(per)) if order is None else tuple(order)
    if codes.shape[axis] % per:
        raise HurraySchemaError(f"{codes.shape[axis]} codes along axis {axis} are not whole {dtype} words")
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= (1 << bits)):
        raise HurraySchemaError(f"codes outside [0, {(1 << bits) - 1}] do not fit {bits} bits")
    unsigned = np.dtype(f"u{out_dtype.itemsize}")
    moved = np.moveaxis(codes.astype(unsigned), axis, -1)
    lanes = moved.reshape(moved.shape[:-1] + (moved.shape[-1] // per, per))
    words = np.zeros(lanes.shape[:-1], unsigned)
    for k, position in enumerate(order):
        words |= lanes[..., k] << unsigned.type(bits * position)
    return np.moveaxis(words, -1, axis).view(out_dtype)


def unpack_planes(packed: np.ndarray, bits: int, high_first: bool) -> np.ndarray:
    """The codes of uint8 ``packed`` rows holding ``8 // bits`` planes of rows each: the result has
    ``8 // bits`` times the rows, plane ``i`` (rows ``[i * n, (i + 1) * n)``) taken from bits
    ``[8 - bits * (i + 1), 8 - bits * i)`` of each byte (``high_first``: the first rows in the high
    bits, HQQ's ``BitPack``) or from bits ``[bits * i, bits * (i + 1))`` (optimum-quanto's)."""
    packed = np.asarray(packed)
    mask = (1 << bits) - 1
    per = 8 // bits
    shifts = [8 - bits * (i + 1) if high_first else bits * i for i in range(per)]
    return np.concatenate([(packed >> shift) & mask for shift in shifts], axis=0)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between ``a`` and ``b`` (one float dtype, float16 / bfloat16 / float32)
    in units in the last place: how many representable values lie between them (0: the same bits,
    or zeros of either sign; NaN against NaN counts as 0, NaN against a number as the dtype's whole
    range)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        raise HurraySchemaError(f"ULP distance of {a.dtype}{a.shape} and {b.dtype}{b.shape}")
    if a.size == 0:
        return 0
    width = a.dtype.itemsize * 8
    signed = np.dtype(f"i{a.dtype.itemsize}")
    sign = np.int64(1) << (width - 1)

    def ordered(x):
        bits = x.view(signed).astype(np.int64)
        return np.where(bits < 0, -(bits & (sign - 1)), bits)  # a monotonic integer line, -0 == +0

    distance = np.abs(ordered(a) - ordered(b))
    nan_a, nan_b = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
    distance = np.where(nan_a & nan_b, 0, np.where(nan_a | nan_b, (1 << width) - 1, distance))
    return int(distance.max())
