"""Tensors built from NumPy arrays: quantized, sparse and composite.

* :mod:`.quantized` -- :func:`quantize` (per-tensor, per-channel and per-block affine, NF4,
  MXFP; ``quantization/*.md``) and per-block affine tensors of codes and scales chosen
  elsewhere (:func:`per_block_from_codes`, :func:`per_block_from_packed`,
  :func:`per_block_produced`);
* :mod:`.sparse` -- :func:`sparse_coo`, :func:`sparse_csr`, :func:`sparse_csc` from index and
  value arrays (``layouts/coo.md``, ``layouts/csr.md``, ``layouts/csc.md``), :func:`from_scipy`
  from ``scipy.sparse`` matrices;
* :mod:`.composites` -- :func:`partition`, :func:`overlay`, :func:`group` (shard and Composite
  Member sections set, ``layouts/composite.md § Members``) and :func:`spqr`, the SpQR-style
  overlay of ``layouts/composite.md § Example``.

Every descriptor built here is checked by the descriptor rules (strict mode) and every
composite by the composite binder before it is returned: a builder never hands out what a
strict reader rejects.  The arithmetic (:mod:`hurray_schema.evaluate.quantize`, the
counterpart of the evaluator's dequantization) is imported at call time.
"""

from __future__ import annotations

from .composites import SPQR_MAX_PER_BLOCK, group, overlay, partition, spqr
from .quantized import (
    DEFAULT_BLOCK_SIZE, DEFAULT_STORAGE, SCHEME_NAMES, per_block_from_codes, quantized_from_codes, per_block_from_packed, per_block_produced,
    quantize,
)
from .sparse import from_scipy, sparse_coo, sparse_csc, sparse_csr

__all__ = ["quantize", "quantized_from_codes", "per_block_from_codes", "per_block_from_packed", "per_block_produced", "sparse_coo",
           "sparse_csr", "sparse_csc", "from_scipy", "partition", "overlay", "group", "spqr", "SCHEME_NAMES",
           "DEFAULT_STORAGE", "DEFAULT_BLOCK_SIZE", "SPQR_MAX_PER_BLOCK"]
