"""Reading an array M ways: the box rank ``r`` of ``M`` reads, cut along one dimension.

A checkpoint saved N ways (a partition composite of N members, ``layouts/composite.md
§ Composition Semantics``) is read by M ranks, each reading only its own box: :func:`rank_box`
names the box, ``item.shard(rank=r, of=M, dim=d)`` and ``HurrayFile.shard(name, ...)`` read it.

**The split rule** is :func:`numpy.array_split`'s: along ``dim``, of extent ``n``, rank ``r``
of ``M`` gets ``n // M`` positions plus one more when ``r < n % M`` -- the first ``n % M``
ranks one more than the others -- in rank order, so the boxes of ranks ``0 .. M-1`` cover the
dimension once, in order; every other dimension is whole.  With ``M > n`` the last ranks get
empty boxes.  It is the rule :meth:`~hurray_schema.io.tensor.Composite.partition` cuts a grid by,
so a partition written with ``grid=M`` along ``dim`` and read ``M`` ways along it gives each rank
exactly one member.

A rank, a rank count or a dimension that is no integer raises
:class:`~hurray_schema.errors.IndexTypeError`; a rank outside ``[0, M)``, ``M < 1`` or a
dimension outside ``[-ndim, ndim)`` (negative ones count from the end, as NumPy's ``axis``)
:class:`~hurray_schema.errors.IndexRangeError`.
"""

from __future__ import annotations

import operator
from typing import Sequence

import attrs

from ..errors import IndexRangeError, IndexTypeError

__all__ = ["ShardBox", "rank_box"]


@attrs.frozen(slots=True)
class ShardBox:
    """The box of one rank: ``offset`` (its first position along every dimension) and ``shape``
    (its extent along every dimension), in the array's index space."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def index(self) -> tuple[slice, ...]:
        """The NumPy basic index of the box (``array[box.index]`` is the rank's part of ``array``)."""
        return tuple(slice(start, start + extent) for start, extent in zip(self.offset, self.shape))

    @property
    def region(self) -> tuple[tuple[int, int], ...]:
        """The box as ``(start, stop)`` pairs, the region :meth:`~hurray_schema.io.tensor.Tensor.read` takes."""
        return tuple((start, start + extent) for start, extent in zip(self.offset, self.shape))


def _integer(value, what: str) -> int:
    """``value`` as an int (NumPy integers too); a bool or anything else is an IndexTypeError."""
    if isinstance(value, bool):
        raise IndexTypeError(f"{what} must be an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise IndexTypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def split_extent(extent: int, rank: int, of: int) -> tuple[int, int]:
    """``(start, size)`` of rank ``rank``'s share of ``extent`` positions cut ``of`` ways
    (:func:`numpy.array_split`'s rule: the first ``extent % of`` ranks one position more)."""
    size, extra = divmod(extent, of)
    return rank * size + min(rank, extra), size + (1 if rank < extra else 0)


def rank_box(shape: Sequence[int], rank, of, dim=0) -> ShardBox:
    """The box rank ``rank`` of ``of`` reads of an array of ``shape``, cut along ``dim`` (module
    docstring: the split rule and the errors)."""
    shape = tuple(int(n) for n in shape)
    rank, of, dim = _integer(rank, "rank"), _integer(of, "of (the number of ranks)"), _integer(dim, "dim")
    if of < 1:
        raise IndexRangeError(f"an array is read by at least one rank, not of={of}")
    if not 0 <= rank < of:
        raise IndexRangeError(f"rank {rank} is outside [0, {of})")
    if not -len(shape) <= dim < len(shape):
        raise IndexRangeError(f"dim {dim} is out of range for a rank-{len(shape)} array")
    dim %= len(shape)
    start, size = split_extent(shape[dim], rank, of)
    offset = tuple(start if d == dim else 0 for d in range(len(shape)))
    extent = tuple(size if d == dim else n for d, n in enumerate(shape))
    return ShardBox(offset, extent)
