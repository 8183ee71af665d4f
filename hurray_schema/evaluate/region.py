"""Reading one box of a tensor's or a composite's logical array.

:func:`read_box` is the one entry point for region reads: the array indexing of
``Tensor`` / ``Composite`` (``__getitem__``) and the Dask graphs both reduce a request
to a box ``[lo, hi)`` per dimension and call it.  A box of a composite reads only the
members that intersect it (:func:`.merge.read`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..limits import Limits
from .merge import read
from .tensor import tensor_to_numpy

__all__ = ["read_box"]


def _is_composite(item) -> bool:
    return hasattr(item, "members")


def _check_box(lo: Sequence[int], hi: Sequence[int], shape: Sequence[int]) -> None:
    if not len(lo) == len(hi) == len(shape):
        raise HurraySchemaError(f"a box of a rank-{len(shape)} array needs {len(shape)} bounds per side")
    for start, stop, size in zip(lo, hi, shape):
        if not 0 <= start <= stop <= size:
            raise HurraySchemaError(f"box [{tuple(lo)}, {tuple(hi)}) lies outside shape {tuple(shape)}")


def read_box(item, lo: Sequence[int], hi: Sequence[int], *, limits: Optional[Limits] = None) -> np.ndarray:
    """The elements ``lo[d] <= i[d] < hi[d]`` of ``item``'s logical array, in its decoded
    type, as a C-ordered array of shape ``hi - lo`` (a plain tensor: ``.descriptor`` and
    ``.buffers``; a partition or overlay composite: ``.descriptor`` and ``.members``).
    Charged against ``limits`` like :func:`.tensor.tensor_to_numpy` and :func:`.merge.read`."""
    shape = item.descriptor.shape
    _check_box(lo, hi, shape)
    if _is_composite(item):
        return read(item, tuple(zip(lo, hi)), limits=limits)
    whole = tensor_to_numpy(item.descriptor, item.buffers, limits=limits)
    return np.ascontiguousarray(whole[tuple(slice(start, stop) for start, stop in zip(lo, hi))])
