"""Reading one box of a tensor's or a composite's logical array.

:func:`read_box` is the one entry point for region reads: the array indexing of
``Tensor`` / ``Composite`` (``__getitem__``) and the Dask graphs both reduce a request
to a box ``[lo, hi)`` per dimension and call it.  It reads only what the box needs:

* a plain tensor: :func:`.tensor_box.tensor_box` -- for row-major, column-major and strided
  tensors the box's elements only (a read-only view of the mapped bytes when NumPy holds the
  type natively), for quantized ones the blocks (channels) the box touches, for COO / CSR /
  CSC the entries in the box; tiled, Morton, Hilbert and block-paged tensors are decoded
  whole, then sliced (that module's docstring says what each layout reads);
* a partition: only the members that intersect the box, each read over its intersection
  (nested composites recursively); an overlay: the base over the box, then only the
  corrections that intersect it, in emission order, in the head's type (:func:`.merge.read`).

With ``steps``, the box is stepped: per dimension only the positions ``lo, lo + step, ...``
below ``hi``.  A row-major, column-major or strided tensor reads those elements alone
(:func:`.tensor_box.tensor_box`), a quantized one with whole blocks along its quantization
block axis; every other tensor reads the unit-step box, charged as it, and keeps every
``step``-th element of it.  A partition or overlay is charged for the
selected elements and reads each member at the selected positions inside it, by those same
rules (:func:`.merge.read`).

A composite is validated by the binder once per call (``layouts/composite.md § Validation``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..limits import Limits
from .merge import read
from .tensor_box import check_box, tensor_box

__all__ = ["read_box"]


def _is_composite(item) -> bool:
    return hasattr(item, "members")


def read_box(item, lo: Sequence[int], hi: Sequence[int], *, steps: Optional[Sequence[int]] = None,
             limits: Optional[Limits] = None) -> np.ndarray:
    """The elements ``lo[d] <= i[d] < hi[d]`` of ``item``'s logical array, in its decoded
    type, as a C-ordered array of shape ``hi - lo`` (a plain tensor: ``.descriptor`` and
    ``.buffers``; a partition or overlay composite: ``.descriptor`` and ``.members``), bit for
    bit the whole decode sliced.  The result may be a read-only view of the tensor's buffer.

    ``steps`` (positive, one per dimension; ``None``: all 1) keeps only every ``steps[d]``-th
    position from ``lo[d]``: the result is the whole decode sliced ``lo:hi:steps``, of shape
    ``ceil((hi - lo) / steps)``, not necessarily C-contiguous when a step exceeds 1 (module
    docstring: which reads take the selected elements alone).

    The box's array (and the tables its decode builds; the whole decode for the layouts decoded
    whole) is charged against ``limits`` (``None``: the default limits) before anything is
    allocated: :class:`~hurray_schema.errors.LimitExceeded` beyond both the budget and the
    expansion allowance (:mod:`.common`).  A box outside the shape is a
    :class:`~hurray_schema.errors.HurraySchemaError`.
    """
    check_box(lo, hi, item.descriptor.shape)
    if _is_composite(item):
        return read(item, tuple(zip(lo, hi)), steps=steps, limits=limits)
    return tensor_box(item.descriptor, item.buffers, lo, hi, steps=steps, limits=limits)
