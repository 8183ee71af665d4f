"""Composite tensors: :func:`partition`, :func:`overlay` and :func:`group` -- the builders
:meth:`~hurray_schema.io.tensor.Composite.partition`, :meth:`~hurray_schema.io.tensor.Composite.overlay`
and :meth:`~hurray_schema.io.tensor.Composite.group` (shard and Composite Member sections set,
``layouts/composite.md § Members``) -- and :func:`spqr`, the SpQR-style overlay of
``layouts/composite.md § Example``."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import HurraySchemaError
from ..model import CombineOp, ElementType
from ..io.tensor import Composite, Tensor
from .common import float_type
from .quantized import per_block_parts
from .sparse import sparse_coo

__all__ = ["partition", "overlay", "group", "spqr", "SPQR_MAX_PER_BLOCK"]


partition = Composite.partition
"""A partition composite of an array, one member per box (:meth:`Composite.partition`)."""

overlay = Composite.overlay
"""A sealed overlay of a base and its corrections (:meth:`Composite.overlay`)."""

group = Composite.group
"""A group composite of tensors, composites or arrays (:meth:`Composite.group`)."""


def _combine(value) -> CombineOp:
    return CombineOp[value.upper()] if isinstance(value, str) else CombineOp(int(value))




_SPQR_STORAGE = {2: ElementType.INT2, 4: ElementType.INT4, 8: ElementType.INT8}
SPQR_MAX_PER_BLOCK = 8
"""At most this many outliers per block: each block's reference scale leaves out its 8 largest elements."""


def spqr(weight, bits: int = 4, block_size: int = 64, outliers: float = 0.01, combine_op="replace", *,
         name: Optional[str] = None) -> Composite:
    """The SpQR-style overlay of ``layouts/composite.md § Example``: a symmetric per-block ``int{bits}``
    base along the last axis whose scales have the weight's type (so it decodes to it), plus a
    sorted COO correction holding the outliers.

    Outliers are the elements with the largest quantization error under a robust scale of their
    block -- the scale it gets once its :data:`SPQR_MAX_PER_BLOCK` largest elements are left out
    -- among those whose error there exceeds half a step; at most ``round(outliers * size)`` of
    them (:func:`hurray_schema.evaluate.quantize.spqr_outliers`).  They are then left out of
    their block's statistics before its scale is chosen, so one large weight does not coarsen
    the rest of its block.  ``combine_op="replace"`` stores the outliers' exact values;
    ``"add"`` the residual ``x - base`` rounded to the weight's type.
    """
    from ..evaluate import quantize as kernels

    w = np.asarray(weight)
    head_type = float_type(w.dtype)
    if head_type is None or w.ndim < 1:
        raise HurraySchemaError("spqr takes a float16, bfloat16 or float32 array of rank >= 1")
    if bits not in _SPQR_STORAGE:
        raise HurraySchemaError(f"spqr bits is one of {sorted(_SPQR_STORAGE)}")
    storage = _SPQR_STORAGE[bits]
    op = _combine(combine_op)
    block = int(block_size)
    rows2d = kernels.block_view(w, -1)
    _, hi = kernels.code_range(storage, True)
    mask = kernels.spqr_outliers(rows2d, block, hi, int(round(float(outliers) * w.size)), SPQR_MAX_PER_BLOCK)
    base = Tensor(*per_block_parts(w, storage, -1, block, True, head_type, None, mask=mask))
    flat = np.flatnonzero(mask)
    coords = np.stack(np.unravel_index(flat, w.shape), axis=1) if flat.size else np.zeros((0, w.ndim), np.int64)
    values = w.reshape(-1)[flat]
    if op == CombineOp.ADD:
        decoded = base.to_numpy().reshape(-1)[flat].astype(np.float32)
        values = (values.astype(np.float32) - decoded).astype(w.dtype)
    correction = sparse_coo(coords, values, w.shape)
    return overlay(base, [correction], op, type_tag=head_type, name=name)
