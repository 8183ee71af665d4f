"""Quantization kernels: the exact counterpart of the dequantization in :mod:`.dequantize`.

Arrays in, codes / scales / zero points out; descriptors are built by
:mod:`hurray_schema.builders`.  Every value is first taken to float32 (float16 / bfloat16
inputs widened exactly on their bits), as the dequantization formulas compute in float32
(``quantization/per-block-affine.md § Dequantization Formula``).

* Affine (per-tensor, per-channel, per-block): the scale is the smallest value of the scale
  type at or above ``absmax / hi`` (symmetric) or ``(max - min) / (hi - lo)`` over a range
  widened to contain 0 (asymmetric), so no element is clipped; ``z = lo - rint(min / s)``;
  the code is ``clamp(rint(x / s) + z, lo, hi)`` in float32 with ties to even -- the inverse
  of ``float32(int32(q - z)) * s``.  A block without a non-zero value gets scale 1.
* NF4 (``quantization/nf4.md``): ``s`` = the block's float32 absmax (1 for an all-zero
  block); the code is the one whose decoded value ``s * nf4[q]`` (float32) is nearest to
  ``x``, the lower code on a tie.
* MXFP (``quantization/mxfp.md``): the shared exponent is the smallest ``e`` in [1, 254]
  with ``absmax <= 2**(e - 127) * max_element`` (127 for an all-zero block); ``y = x / s``
  is rounded to the nearest element value, ties to the even code (round to nearest even
  for the float element types), integers with :func:`numpy.rint` and clamped.

Blocks run along the last axis of a ``rows x cols`` view (``b = row * nb + col // K``,
``quantization/per-block-affine.md § Block Layout``); :func:`block_view` moves the
quantized axis there and :func:`restore_layout` moves the codes back.  Codes are written
straight into their packed storage (``element-types.md § Sub-Byte Integer Types``: LSB
first, 6-bit types four in three bytes) with the block axis padded to whole blocks and the
padding left as zero bytes (``per-block-affine.md § Padding``).

This module is the producers' entry: it gathers the public names of the modules that do
the work, a module per job -- :mod:`.quantize_common` (inputs as rows, element loads, packed
storage, row kernels on threads), :mod:`.quantize_affine` (affine scales, zero points and
codes, the fused 4-bit kernel and its vector steps in :mod:`.quantize_simd`, SpQR outliers),
:mod:`.quantize_nf4_mxfp` (the table-valued schemes) and :mod:`.nibble_records` (scaled
nibble records such as GGUF's Q4_0 turned into per-block int4).
"""

from __future__ import annotations

from .nibble_records import (RECORD_EXACT, RECORD_NOT_FINITE, RECORD_ZERO_BOTH_SIGNS, RECORD_ZERO_SCALE,
                             nibble_records)
from .quantize_affine import (SCALE_KINDS, affine_block_params, affine_block_stats, affine_codes, affine_quantize,
                              code_range, spqr_outliers)
from .quantize_common import (IN_BF16, IN_F16, IN_F32, block_view, input_kind, pack_codes, restore_layout,
                              storage_bytes)
from .quantize_nf4_mxfp import NF4_TABLE, mxfp_element_max, mxfp_quantize, nf4_quantize

__all__ = ["IN_F32", "IN_F16", "IN_BF16", "SCALE_KINDS", "input_kind", "block_view", "restore_layout",
           "storage_bytes", "code_range", "affine_block_stats", "affine_block_params", "affine_codes",
           "affine_quantize", "spqr_outliers", "nf4_quantize", "mxfp_quantize", "mxfp_element_max", "pack_codes",
           "NF4_TABLE", "nibble_records", "RECORD_EXACT", "RECORD_ZERO_SCALE",
           "RECORD_ZERO_BOTH_SIGNS", "RECORD_NOT_FINITE"]
