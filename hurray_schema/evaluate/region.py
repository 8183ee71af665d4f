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

:func:`needed_spans` says, from descriptors alone, which byte ranges of which leaves a box read
may touch: what a reader that fetches buffers by range (a URL) fetches before calling
:func:`read_box`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..limits import Limits
from ..model import CompositionRule
from .merge import read
from .tensor_box import box_byte_spans, check_box, tensor_box

__all__ = ["read_box", "needed_spans"]


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
    if _is_composite(item):
        check_box(lo, hi, item.descriptor.shape)
        return read(item, tuple(zip(lo, hi)), steps=steps, limits=limits)
    return tensor_box(item.descriptor, item.buffers, lo, hi, steps=steps, limits=limits)  # which checks the box


def needed_spans(item, lo: Optional[Sequence[int]] = None, hi: Optional[Sequence[int]] = None,
                 steps: Optional[Sequence[int]] = None) -> list:
    """``(leaf, [(buffer index, start, stop), ...])`` for every leaf tensor whose bytes
    :func:`read_box` may read for the box ``[lo, hi)`` of ``item`` (``None``: the whole view;
    every buffer of every leaf), from descriptors alone (a leaf's ``.buffers`` are not touched):
    :func:`.tensor_box.box_byte_spans` of each leaf over its part of the box.  Inside a partition
    or overlay a member whose box meets the box's bounding box is read over the intersection
    (at unit step when its first selected position is not the intersection's first); a group's
    members whole.  A superset of what the read decodes, never less."""
    out: list = []
    _needed(item, None if lo is None else [int(x) for x in lo], None if hi is None else [int(x) for x in hi],
            None if steps is None else [int(s) for s in steps], out)
    return out


def _needed(item, lo, hi, steps, out: list) -> None:
    desc = item.descriptor
    members = getattr(item, "members", None)
    if members is None:
        if lo is None:
            out.append((item, [(i, 0, int(h.byte_size)) for i, h in enumerate(desc.buffers)]))
        else:
            out.append((item, box_byte_spans(desc, lo, hi, steps)))
        return
    rule = getattr(desc.layout, "composition_rule", None)
    for member in members:
        shard = member.descriptor.shard
        if lo is None or shard is None or rule not in (CompositionRule.PARTITION, CompositionRule.OVERLAY):
            _needed(member, None, None, None, out)
            continue
        offset = [int(o) for o in shard.shard_offset]
        extent = [int(n) for n in member.descriptor.shape]
        first = [max(a, o) for a, o in zip(lo, offset)]
        last = [min(b, o + n) for b, o, n in zip(hi, offset, extent)]
        if any(b <= a for a, b in zip(first, last)):
            continue
        local_steps = None
        if steps is not None:
            phase = all((a - l) % s == 0 for a, l, s in zip(first, lo, steps))
            local_steps = steps if phase else None
        _needed(member, [a - o for a, o in zip(first, offset)], [b - o for b, o in zip(last, offset)],
                local_steps, out)
