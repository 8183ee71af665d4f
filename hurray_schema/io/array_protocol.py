"""What :class:`~hurray_schema.io.tensor.Tensor` and :class:`~hurray_schema.io.tensor.Composite`
share to behave like NumPy arrays: the logical array's ``ndim``, ``size`` and ``nbytes``, NumPy
basic indexing and :meth:`~ArrayProtocol.read` (a box read through the evaluator), NumPy's
``__array__`` and DLPack's ``__dlpack__`` export."""

from __future__ import annotations

import contextlib
import math

from ..errors import CopyRequired, DLPackUnsupported, NotAnArray

__all__ = ["ArrayProtocol", "DLPACK_CPU_DEVICE"]

DLPACK_CPU_DEVICE = (1, 0)
"""``__dlpack_device__`` of every array here: DLPack's ``kDLCPU`` device type, device 0."""


class ArrayProtocol:
    """What :class:`~hurray_schema.io.tensor.Tensor` and :class:`~hurray_schema.io.tensor.Composite`
    share to behave like NumPy arrays.

    ``shape``, ``dtype`` (the NumPy / ``ml_dtypes`` dtype of the decoded values), ``ndim``,
    ``size`` and ``nbytes`` (``size * dtype.itemsize``: the decoded array's bytes, as NumPy counts
    them) describe the logical array; ``t[index]`` takes a NumPy basic index and equals
    ``numpy.asarray(t)[index]``, reading only the box the index spans
    (:mod:`hurray_schema.evaluate.indexing`); :meth:`read` is the same with ``(start, stop)``
    pairs allowed and a ``limits=`` budget; :meth:`shard` reads the box of one rank of ``M``
    (:mod:`.shards`).  ``__array__`` and ``__dlpack__`` hand the array to
    NumPy, torch, JAX...  The evaluator is imported at call time, so that a read that
    evaluates nothing does not load it.
    An object is always true (``bool`` does not look at its length).
    """

    __slots__ = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded array (``size * dtype.itemsize``, NumPy's meaning)."""
        return self.size * self.dtype.itemsize

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        self._require_array()
        if not self.shape:
            raise NotAnArray("len() of a 0-d array")
        return int(self.shape[0])

    def __getitem__(self, index):
        """``numpy.asarray(self)[index]`` for a NumPy basic index (integers, slices with steps,
        ``Ellipsis``, ``None``), reading only the box it spans; advanced indexing raises
        :class:`~hurray_schema.errors.AdvancedIndexUnsupported`, an integer out of range
        :class:`~hurray_schema.errors.IndexRangeError` (an ``IndexError``)."""
        from ..evaluate.indexing import basic_index, read_index

        self._require_array()
        selection = basic_index(index, self.shape)
        with self._scales_located():
            return read_index(self._fetched(selection.lo, selection.hi, selection.steps), selection)

    def read(self, region, *, limits=None):
        """``self[region]`` where an entry may also be a ``(start, stop)`` pair (a unit-step slice
        that must lie inside its axis), read within ``limits`` (:class:`~hurray_schema.Limits`;
        the box is charged like :meth:`to_numpy` / :meth:`materialize`).  The region is a tuple or
        a list of entries; integers drop their axis as in NumPy."""
        from ..evaluate.indexing import read_index, region_index

        self._require_array()
        selection = region_index(region, self.shape)
        with self._scales_located():
            return read_index(self._fetched(selection.lo, selection.hi, selection.steps), selection, limits=limits)

    @contextlib.contextmanager
    def _scales_located(self):
        """A scale fault the evaluator raises, located where a tensor read from a file has its buffers
        (:func:`hurray_schema.rules.values.relocated`; a composite's members are other tensors)."""
        from ..rules.values import ScaleViolation, relocated

        try:
            yield
        except ScaleViolation as exc:
            offsets = getattr(self, "buffer_offsets", None)
            raise relocated(exc, offsets() if offsets is not None else None) from None

    def shard_box(self, *, rank, of, dim=0):
        """The box rank ``rank`` of ``of`` reads, cut along ``dim`` (a :class:`~.shards.ShardBox`:
        ``offset`` and ``shape``; :func:`~.shards.rank_box` says the split rule); nothing is read."""
        from .shards import rank_box

        self._require_array()
        return rank_box(self.shape, rank, of, dim)

    def shard(self, *, rank, of, dim=0, limits=None):
        """The array of the box rank ``rank`` of ``of`` reads along ``dim`` (:meth:`shard_box`), read
        as :meth:`read` reads a region: a partition reads only the members that meet the box, each
        over its part of it; a tensor or an overlay reads the box as its layout allows.  A group
        has no one array: :class:`~hurray_schema.errors.NotAnArray` (shard its members)."""
        return self.read(self.shard_box(rank=rank, of=of, dim=dim).region, limits=limits)

    def __array__(self, dtype=None, copy=None):
        """NumPy 2's array protocol: ``numpy.asarray(self, dtype, copy=copy)``."""
        return self._logical_array(dtype, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return DLPACK_CPU_DEVICE

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the logical array through DLPack (``numpy.from_dlpack``, ``torch.from_dlpack``...).

        A tensor :meth:`Tensor.to_numpy` can view without a copy is exported as that read-only
        view (DLPack 1.0 consumers get the read-only flag; an older consumer, which cannot be told,
        gets a private copy instead, or :class:`~hurray_schema.errors.DLPackUnsupported` when it
        asked for ``copy=False``); any other item is decoded (materialized) first and the new
        array exported.  Only the dtypes NumPy's exporter knows (bool, integers, floats, complex:
        not bfloat16, float8 or the sub-byte ``ml_dtypes`` types) can be exported."""
        try:
            array = self._logical_array(None, False if copy is False else None)
        except CopyRequired as exc:
            raise DLPackUnsupported(f"no zero-copy export: {exc}") from None
        return _export_dlpack(array, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def _require_array(self) -> None:
        """Raise :class:`NotAnArray` unless the item has one logical array (overridden by groups)."""

    def _fetched(self, lo, hi, steps):
        """The item ready for the evaluator to read the box ``[lo, hi)`` (stepped; ``None``: all
        of it): itself, unless some buffer of it is read by range (overridden where one can be)."""
        return self


def _export_dlpack(array, *, stream, max_version, dl_device, copy):
    """NumPy's DLPack export of ``array``, with the fall-backs :meth:`ArrayProtocol.__dlpack__` documents."""
    if array.dtype.kind not in "biufc":
        raise DLPackUnsupported(f"DLPack (NumPy's exporter) has no type code for {array.dtype}; "
                                "use numpy.asarray or to_numpy() instead")
    if not array.flags.writeable and (max_version is None or tuple(max_version)[0] < 1):
        if copy is False:
            raise DLPackUnsupported("the array is a read-only view and the consumer cannot be told so "
                                    "(DLPack < 1.0); a copy is needed but copy=False was asked")
        array, copy = array.copy(), None
    try:
        return array.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
    except BufferError as exc:
        raise DLPackUnsupported(str(exc)) from exc
