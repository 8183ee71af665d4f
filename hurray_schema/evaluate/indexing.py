"""NumPy basic indexing of a tensor's or a composite's logical array, reduced to one box read.

A basic index -- integers (negative ones count from the end), slices with any non-zero step,
one ``Ellipsis``, ``None`` (a new axis of length 1), fewer entries than the rank -- selects
elements inside a bounding box: per dimension, an integer ``i`` keeps ``[i, i + 1)`` and a
slice the span from its lowest to its highest selected position.  :func:`basic_index` turns
the index into that box (``lo``, ``hi``) plus a *residual* basic index, which, applied by
NumPy to the box's C-ordered array, gives exactly ``numpy.asarray(item)[index]``: integers
become 0, a slice keeps its step and starts at its first position inside the box, ``None``
stays, the ``Ellipsis`` is expanded.  :func:`read_index` reads the box with
:func:`.region.read_box` (which reads only what the box needs) and applies the residual.

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

__all__ = ["BoxSelection", "basic_index", "region_index", "element_index", "read_index"]


@attrs.frozen(slots=True)
class BoxSelection:
    """A basic index resolved against a shape: the box ``lo[d] <= i[d] < hi[d]`` to read and
    the basic index (``residual``) NumPy applies to the box's array."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    residual: tuple

    def apply(self, box: np.ndarray):
        """The selected elements of ``box`` (the array of shape ``hi - lo``)."""
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


def _integer_box(position: int, size: int, dimension: int) -> tuple[int, int, int]:
    if not -size <= position < size:
        raise IndexRangeError(f"index {position} is out of bounds for axis {dimension} with size {size}")
    position = position + size if position < 0 else position
    return position, position + 1, 0


def _slice_box(entry: slice, size: int) -> tuple[int, int, slice]:
    start, stop, step = entry.indices(size)
    count = len(range(start, stop, step))
    if count == 0:
        return 0, 0, slice(0, 0)
    last = start + (count - 1) * step
    low = min(start, last)
    return low, max(start, last) + 1, slice(start - low, None, step)


def basic_index(index, shape: Sequence[int]) -> BoxSelection:
    """The box and residual selection of the NumPy basic index ``index`` on an array of ``shape``
    (module docstring).  The Ellipsis stays in the residual (NumPy returns an array, never a
    scalar, for an index holding one); without one, the unindexed axes are implied at the end."""
    shape = tuple(int(n) for n in shape)
    entries = _entries(index)
    implied = _implied_axes(entries, len(shape))
    if implied and Ellipsis not in entries:
        entries.append(Ellipsis)  # the implied axes: the result keeps them, so it is an array anyway
    lo, hi, residual = [], [], []
    dimension = 0
    for entry in entries:
        if entry is None:
            residual.append(None)
            continue
        if entry is Ellipsis:
            lo += [0] * implied
            hi += list(shape[dimension:dimension + implied])
            residual.append(Ellipsis)
            dimension += implied
            continue
        size = shape[dimension]
        if isinstance(entry, slice):
            low, high, rest = _slice_box(entry, size)
        else:
            low, high, rest = _integer_box(entry, size, dimension)
        lo.append(low)
        hi.append(high)
        residual.append(rest)
        dimension += 1
    return BoxSelection(tuple(lo), tuple(hi), tuple(residual))


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
    """``numpy.asarray(item)[index]`` for the ``selection`` of ``index``, reading only its box
    (:func:`.region.read_box`, charged against ``limits`` like any box read)."""
    box = read_box(item, selection.lo, selection.hi, limits=limits)
    extent = tuple(high - low for low, high in zip(selection.lo, selection.hi))
    if box.shape != extent:  # np.ascontiguousarray turns a 0-d box into shape (1,)
        box = box.reshape(extent)
    return selection.apply(box)
