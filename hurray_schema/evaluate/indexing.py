"""NumPy basic indexing of a tensor's or a composite's logical array, reduced to one stepped box read.

A basic index -- integers (negative ones count from the end), slices with any non-zero step,
one ``Ellipsis``, ``None`` (a new axis of length 1), fewer entries than the rank -- selects,
per dimension, an arithmetic progression of positions: an integer ``i`` the one position
``i``, a slice its positions ``low, low + s, ..., last`` taken in increasing order (``s`` the
magnitude of its step, whatever its sign).  :func:`basic_index` turns the index into that
*stepped box* -- the bounding box ``[lo, hi)`` (``hi`` one past the last position) and the
positive ``steps`` -- plus a *residual* basic index, which, applied by NumPy to the stepped
box's array (shape :attr:`BoxSelection.counts`), gives exactly ``numpy.asarray(item)[index]``:
integers become 0, a slice of negative step becomes the reversal ``slice(None, None, -1)`` and
any other slice ``slice(None)``, ``None`` stays, the ``Ellipsis`` is expanded.
:func:`read_index` reads the stepped box with :func:`.region.read_box` (which reads only the
selected elements where the layout allows it) and applies the residual.

Advanced indexing (integer or boolean arrays, lists, a boolean scalar) is refused with
:class:`~hurray_schema.errors.AdvancedIndexUnsupported`; any other entry that is no basic
index kind with :class:`~hurray_schema.errors.IndexTypeError`; an integer out of range, too
many indices or two ellipses with :class:`~hurray_schema.errors.IndexRangeError` (an
``IndexError``, as in NumPy).
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence

import attrs
import numpy as np

from ..errors import AdvancedIndexUnsupported, IndexRangeError, IndexTypeError
from ..limits import Limits
from .region import read_box
from .tensor_box import stepped_extent

__all__ = ["BoxSelection", "basic_index", "region_index", "element_index", "read_index"]


@attrs.frozen(slots=True)
class BoxSelection:
    """A basic index resolved against a shape: the stepped box to read -- the positions
    ``lo[d], lo[d] + steps[d], ...`` below ``hi[d]`` per dimension (``steps`` all 1 unless
    given) -- and the basic index (``residual``) NumPy applies to that box's array."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    residual: tuple
    steps: tuple[int, ...] = attrs.field(default=attrs.Factory(lambda self: (1,) * len(self.lo), takes_self=True))

    @property
    def counts(self) -> tuple[int, ...]:
        """The stepped box's shape: how many positions each dimension selects."""
        return stepped_extent(self.lo, self.hi, self.steps)

    def apply(self, box: np.ndarray):
        """The selected elements of ``box`` (the stepped box's array, of shape :attr:`counts`)."""
        return box[self.residual]


def _as_integer(entry) -> Optional[int]:
    """``entry`` as an int if it is an integer index (not a boolean), else None."""
    if isinstance(entry, (bool, np.bool_)):
        raise AdvancedIndexUnsupported("a boolean index is NumPy advanced indexing, which is not supported")
    if isinstance(entry, np.ndarray) and entry.ndim:
        raise AdvancedIndexUnsupported("an array index is NumPy advanced indexing, which is not supported")
    try:
        return operator.index(entry)
    except TypeError:
        return None


def _classify(entry):
    """``entry`` as an int, a slice, ``Ellipsis`` or ``None``; anything else is refused."""
    if entry is None or entry is Ellipsis:
        return entry
    if isinstance(entry, slice):
        try:
            entry.indices(0)  # checks that start, stop and step are integers or None
        except TypeError:
            raise IndexTypeError(f"slice {entry} has a bound that is no integer") from None
        except ValueError:
            raise IndexTypeError("slice step cannot be zero") from None
        return entry
    integer = _as_integer(entry)
    if integer is not None:
        return integer
    if isinstance(entry, (list, tuple, np.ndarray)) or hasattr(entry, "__array__"):
        raise AdvancedIndexUnsupported(f"index entry {entry!r} is NumPy advanced indexing, which is not supported; "
                                       "index numpy.asarray(item) instead")
    raise IndexTypeError(f"index entry {entry!r} ({type(entry).__name__}) is not an integer, a slice, "
                         "Ellipsis or None")


def _entries(index) -> list:
    entries = list(index) if isinstance(index, tuple) else [index]
    return [_classify(entry) for entry in entries]


def _implied_axes(entries: list, rank: int) -> int:
    """How many axes the Ellipsis (or, without one, the end of the index) stands for."""
    consumed = sum(1 for entry in entries if entry is not None and entry is not Ellipsis)
    if consumed > rank:
        raise IndexRangeError(f"too many indices: {consumed} given for a rank-{rank} array")
    if sum(1 for entry in entries if entry is Ellipsis) > 1:
        raise IndexRangeError("an index can only have a single ellipsis ('...')")
    return rank - consumed


FORWARD, REVERSED = slice(None), slice(None, None, -1)
"""Residual entries of a slice: its positions in the stepped box's order, or reversed (a negative step)."""


def _integer_box(position: int, size: int, dimension: int) -> tuple[int, int, int, int]:
    if not -size <= position < size:
        raise IndexRangeError(f"index {position} is out of bounds for axis {dimension} with size {size}")
    position = position + size if position < 0 else position
    return position, position + 1, 1, 0


def _slice_box(entry: slice, size: int) -> tuple[int, int, int, slice]:
    """(low, high, step, residual) of a slice: its positions as the progression from ``low`` by
    the positive ``step`` below ``high``, and how NumPy orders them back."""
    start, stop, step = entry.indices(size)
    count = len(range(start, stop, step))
    if count == 0:
        return 0, 0, 1, FORWARD
    last = start + (count - 1) * step
    low = min(start, last)
    return low, max(start, last) + 1, abs(step), REVERSED if step < 0 else FORWARD


def basic_index(index, shape: Sequence[int]) -> BoxSelection:
    """The stepped box and residual selection of the NumPy basic index ``index`` on an array of
    ``shape`` (module docstring).  The Ellipsis stays in the residual (NumPy returns an array, never a
    scalar, for an index holding one); without one, the unindexed axes are implied at the end."""
    shape = tuple(map(int, shape))
    if index.__class__ is int and shape:  # one integer: the most common index, spelled out
        rest = len(shape) - 1
        low, high, _, _ = _integer_box(index, shape[0], 0)
        return BoxSelection((low,) + (0,) * rest, (high,) + shape[1:], (0, Ellipsis) if rest else (0,),
                            (1,) * len(shape))
    entries = _entries(index)
    implied = _implied_axes(entries, len(shape))
    if implied and Ellipsis not in entries:
        entries.append(Ellipsis)  # the implied axes: the result keeps them, so it is an array anyway
    lo, hi, steps, residual = [], [], [], []
    dimension = 0
    for entry in entries:
        if entry is None:
            residual.append(None)
            continue
        if entry is Ellipsis:
            lo += [0] * implied
            hi += list(shape[dimension:dimension + implied])
            steps += [1] * implied
            residual.append(Ellipsis)
            dimension += implied
            continue
        size = shape[dimension]
        if isinstance(entry, slice):
            low, high, step, rest = _slice_box(entry, size)
        else:
            low, high, step, rest = _integer_box(entry, size, dimension)
        lo.append(low)
        hi.append(high)
        steps.append(step)
        residual.append(rest)
        dimension += 1
    return BoxSelection(tuple(lo), tuple(hi), tuple(residual), tuple(steps))


def _pair_as_slice(entry, size: int, dimension: int):
    """A ``(start, stop)`` pair of :meth:`Composite.read` as the unit-step slice it means (strict:
    ``0 <= start <= stop <= size``, as before slices were accepted)."""
    if not isinstance(entry, (tuple, list)):
        return entry
    if len(entry) != 2:
        raise IndexTypeError(f"a region bound is a (start, stop) pair, not {entry!r}")
    start, stop = (_as_integer(value) for value in entry)
    if start is None or stop is None:
        raise IndexTypeError(f"region bounds {entry!r} are not integers")
    if not 0 <= start <= stop <= size:
        raise IndexRangeError(f"region bounds ({start}, {stop}) lie outside axis {dimension} of size {size}")
    return slice(start, stop)


def region_index(region, shape: Sequence[int]) -> BoxSelection:
    """:func:`basic_index` of a region as :meth:`read` takes it: a basic index whose entries may
    also be ``(start, stop)`` pairs (the region a sequence -- tuple or list -- of entries)."""
    shape = tuple(int(n) for n in shape)
    entries = list(region) if isinstance(region, (tuple, list)) else [region]
    converted, dimension = [], 0
    for entry in entries:
        if isinstance(entry, (tuple, list)):
            if not 0 <= dimension < len(shape):
                raise IndexRangeError(f"too many indices for a rank-{len(shape)} array")
            entry = _pair_as_slice(entry, shape[dimension], dimension)
        converted.append(entry)
        if entry is Ellipsis:
            dimension = len(shape) - sum(1 for e in entries[len(converted):] if e is not None and e is not Ellipsis)
        elif entry is not None:
            dimension += 1
    return basic_index(tuple(converted), shape)


def element_index(index, shape: Sequence[int]) -> tuple[int, ...]:
    """One element's index (an integer per dimension, negative ones counting from the end) as
    non-negative ints; :class:`IndexRangeError` when out of range or of the wrong rank."""
    shape = tuple(int(n) for n in shape)
    entries = list(index) if isinstance(index, (tuple, list)) else [index]
    if len(entries) != len(shape):
        raise IndexRangeError(f"an element of a rank-{len(shape)} array needs {len(shape)} indices, "
                              f"{len(entries)} given")
    positions = []
    for dimension, (entry, size) in enumerate(zip(entries, shape)):
        position = _as_integer(entry)
        if position is None:
            raise IndexTypeError(f"an element index is integers, not {entry!r}")
        positions.append(_integer_box(position, size, dimension)[0])
    return tuple(positions)


def read_index(item, selection: BoxSelection, *, limits: Optional[Limits] = None):
    """``numpy.asarray(item)[index]`` for the ``selection`` of ``index``, reading only its stepped
    box (:func:`.region.read_box`, charged against ``limits`` like any box read: the selected
    elements where the layout reads them alone, else the bounding box)."""
    box = read_box(item, selection.lo, selection.hi, steps=selection.steps, limits=limits)
    extent = selection.counts
    if box.shape != extent:  # np.ascontiguousarray turns a 0-d box into shape (1,)
        box = box.reshape(extent)
    return selection.apply(box)
