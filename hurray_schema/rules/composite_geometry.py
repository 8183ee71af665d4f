"""The geometry of a partition's member boxes: exact cover and non-overlap of the head
(``layouts/composite.md § Composition Semantics › Partition``), and where they fail.

:func:`partition_faults` is exact for any rank and any box shapes, and costs
``O(N * 2**r * log N)`` for ``N`` boxes of effective rank ``r`` instead of the ``O(N**2)`` of
comparing every pair.  It rests on an identity: the coverage count ``c(x) = number of member
boxes containing x`` equals the indicator of the head box everywhere iff the *corner measures*
agree, where the corner measure of a box ``[a, b)`` puts weight ``(-1)**(number of upper
coordinates)`` on each of its ``2**r`` corners (``c`` is the prefix sum of the corner measure,
and the prefix sum is invertible).  "Every index covered exactly once" is precisely
``c == 1_head``, i.e. exact cover *and* no overlap.  So: add up the signed corners of all boxes
(a sort and a segmented sum in numpy), subtract the head's, and the partition is valid iff
nothing remains.  When something remains, the residual points locate a fault: a non-zero
residual at ``p`` means ``c - 1_head`` is non-zero at one of the ``2**r`` points ``p - s``
(``s`` in ``{0,1}**r``); counting the boxes containing those points names a gap or the
overlapping members.  Dimensions every box spans fully are dropped first.  An empty box (a zero
extent) contains no index, so it covers nothing; whether it overlaps is decided by the spec's
own non-overlap formula, which an empty box strictly inside another box meets
(``spec-map.md § Interpretations``).  Above an effective rank of 16 an exact sort-and-sweep
fallback is used.

Faults come back as ``(kind, message)``: :data:`GAP` or :data:`OVERLAP`; the composite
validator (:mod:`.composite`) turns them into its close-time findings.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

__all__ = ["partition_faults", "takes_rows", "GAP", "OVERLAP", "INT_LIMIT"]

GAP, OVERLAP = "gap", "overlap"
"""The two faults of boxes that do not partition their head: an index of the head that no box covers
(exact cover), an index two boxes share or an empty box the non-overlap formula puts inside another
(non-overlap)."""

_MAX_CORNER_RANK = 16
"""Largest effective rank the corner identity is used for (a box has ``2**r`` corners); above it, the sweep."""
_MAX_CORNERS = 1 << 26
"""Most corners (``N * 2**r``) the corner identity sorts at once; above it, the sweep."""
INT_LIMIT = 1 << 62
"""int64 headroom: a head extent, a corner key range or a volume this large is computed with exact Python
integers (or by the sweep), never in int64."""
_GRID_CELLS = 1 << 22
"""Largest compressed grid (cells between distinct box boundaries) a faulty partition is
diagnosed on; beyond it the diagnosis falls back to a sweep and a bounded search."""
_SEARCH_NODES = 1 << 14
"""Regions the fallback gap search may split before it gives up locating a gap."""
_PAIR_BLOCK = 1 << 22
"""Box pairs compared at once by the empty-box overlap test (bounds its memory)."""


def partition_faults(head_shape: Sequence[int], offsets, shapes) -> list[tuple[str, str]]:
    """``[(kind, message)]`` for the gap / overlap faults of in-bounds boxes; [] when they partition the head.

    Boxes are ``[offsets[i][k], offsets[i][k] + shapes[i][k])`` (sequences of rows, or
    ``(N, rank)`` integer arrays); every box must already be inside the head (per-member
    check 1).  A gap is reported with one uncovered index and the number of head indices
    the members cover; an overlap with one shared index and the members containing it.
    Each is reported only when it exists.  Overlap is the formula of
    ``layouts/composite.md § Composition Semantics › Partition`` taken literally, so an
    empty box whose offset lies strictly inside another box along its zero extents overlaps
    that box although it holds no index (see ``spec-map.md`` § Interpretations).
    """
    head = tuple(int(h) for h in head_shape)
    rank = len(head)
    head_volume = math.prod(head)
    if head_volume == 0:
        # in-bounds boxes are empty along the head's empty dimension, where the overlap
        # formula cannot hold for any pair; there is no index to cover
        return []
    if rank == 0:
        return _scalar_head_faults(len(offsets))
    if len(offsets) <= _FEW_BOXES and _few_boxes_tile(head, head_volume, offsets, shapes):
        return []
    huge = max(head) >= INT_LIMIT
    dtype = object if huge else np.int64
    off = np.array([[int(v) for v in row] for row in offsets] if huge else offsets, dtype=dtype).reshape(-1, rank)
    shp = np.array([[int(v) for v in row] for row in shapes] if huge else shapes, dtype=dtype).reshape(-1, rank)
    nonempty = np.all(shp > 0, axis=1)
    keep = np.flatnonzero(nonempty)
    gap, overlap = _cover_faults(head, head_volume, off[keep], shp[keep], keep, huge)
    if overlap is None:
        overlap = _empty_box_overlap(head, off, shp, np.flatnonzero(~nonempty))
    out = []
    if overlap is not None:
        out.append((OVERLAP, overlap))
    if gap is not None:
        out.append((GAP, gap))
    return out


def _scalar_head_faults(count: int) -> list[tuple[str, str]]:
    """The faults of ``count`` boxes over a scalar head: every box is its single index, so one box
    partitions it, none leaves it uncovered and any two overlap."""
    if count == 1:
        return []
    if count == 0:
        return [(GAP, "no member covers the scalar head (members cover 0 of 1 indices)")]
    return [(OVERLAP, f"members [0, 1] overlap: each contains the scalar head ({count} members)")]


_FEW_BOXES = 8
"""Up to this many boxes a clean partition is recognised pairwise in plain Python, faster
than setting up the corner sort (a faulty one still goes through it, which names the fault)."""


def takes_rows(count: int) -> bool:
    """Whether :func:`partition_faults` takes ``count`` boxes fastest as rows of ints rather than arrays:
    a few it shows to tile in plain Python, iterating them."""
    return count <= _FEW_BOXES


def _few_boxes_tile(head, head_volume: int, offsets, shapes) -> bool:
    """True when no two boxes meet the spec's overlap formula and the volumes add up to the
    head's: then they cover every index exactly once (disjoint boxes inside the head whose
    total volume is the head's leave no gap).  False means "not shown here", not a fault."""
    spans = []  # per box: (start, end) per dimension
    volume = 0
    for o, d in zip(offsets, shapes):
        spans.append([(int(a), int(a) + int(c)) for a, c in zip(o, d)])
        volume += math.prod(int(c) for c in d)
    if volume != head_volume:
        return False
    for i, box in enumerate(spans):
        for other in spans[i + 1:]:
            for (a0, a1), (b0, b1) in zip(box, other):
                if a1 <= b0 or b1 <= a0:
                    break  # the overlap formula fails along this dimension
            else:
                return False  # the formula holds in every dimension (an empty box may be the one)
    return True


def _cover_faults(head, head_volume: int, off, shp, keep, huge: bool):
    """``(gap message or None, overlap message or None)`` for the non-empty boxes ``off``/``shp``
    (rows of ``keep``): exact cover decided by the corner identity (module docstring), or by
    the sweep where it does not apply; a fault is then located by :func:`_diagnose`."""
    rank = len(head)
    n = len(off)
    if n == 0:
        return _gap_message([0] * rank, 0, head_volume), None
    full = np.all((off == 0) & (shp == np.asarray(head, dtype=off.dtype)), axis=0)
    dims = [k for k in range(rank) if not full[k]]
    if not dims:  # every box is the whole head
        if n == 1:
            return None, None
        return None, _overlap_message([0] * rank, [int(keep[0]), int(keep[1])])
    r = len(dims)
    total = math.prod(head[k] + 1 for k in dims)
    pair = ()  # not searched yet
    if huge or r > _MAX_CORNER_RANK or n << r > _MAX_CORNERS or total >= INT_LIMIT:
        pair = _sweep_overlap(off, shp)
        if pair is None and _volume_sum(shp) == head_volume:
            return None, None  # disjoint boxes inside the head, as large as the head
    elif _corner_residual_is_zero(head, dims, off[:, dims], shp[:, dims]):
        return None, None
    return _diagnose(head, head_volume, dims, off, shp, keep, pair)


def _corner_residual_is_zero(head, dims, o, s) -> bool:
    """True iff the boxes (restricted to the effective dimensions ``dims``) cover every index
    of the head exactly once: their signed corner measures add up to the head's."""
    n, r = o.shape
    hd = np.asarray([head[k] for k in dims], dtype=np.int64)
    strides = np.ones(r, dtype=np.int64)
    for j in range(r - 2, -1, -1):
        strides[j] = strides[j + 1] * (hd[j + 1] + 1)
    base2 = (o @ strides) << 1
    ext2 = (s * strides) << 1
    # each corner as one sortable int64: (point key << 1) | (sign is +1); sorting brings the
    # +1 and -1 weights of one point together, and the weight of a point is (#plus - #minus)
    keys = np.empty((n << r) + (1 << r), dtype=np.int64)
    for corner in range(1 << r):
        pick = np.asarray([(corner >> j) & 1 for j in range(r)], dtype=np.int64)
        plus = 0 if bin(corner).count("1") & 1 else 1
        np.add(base2, ext2 @ pick + plus, out=keys[corner * n:(corner + 1) * n])
        keys[(n << r) + corner] = (int((hd * pick) @ strides) << 1) | (1 - plus)  # the head, negated
    keys.sort()
    points = keys >> 1
    weight = (keys & 1) * 2 - 1
    starts = np.flatnonzero(np.concatenate(([True], points[1:] != points[:-1])))
    return not np.any(np.add.reduceat(weight, starts))


def _diagnose(head, head_volume: int, dims, off, shp, keep, pair=()):
    """Locate the faults of non-empty boxes known not to partition the head: exactly on the
    compressed grid of their boundaries when it is small enough, else by a sweep for an
    overlapping pair (``pair`` when already swept) and a search for an uncovered index."""
    rank = len(head)
    grid = _grid_diagnose([head[k] for k in dims], off[:, dims], off[:, dims] + shp[:, dims])
    spanned = math.prod(head[k] for k in range(rank) if k not in dims)  # fully spanned dimensions

    def full_index(q):
        idx = [0] * rank
        for j, k in enumerate(dims):
            idx[k] = int(q[j])
        return idx

    if grid is not None:
        covered, gap_at, overlap_at = grid
        gap = None if gap_at is None else _gap_message(full_index(gap_at), covered * spanned, head_volume)
        overlap = None
        if overlap_at is not None:
            q = full_index(overlap_at)
            inside = np.flatnonzero(np.all((off <= q) & (np.asarray(q, dtype=off.dtype) < off + shp), axis=1))
            overlap = _overlap_message(q, [int(keep[i]) for i in inside[:4]])
        return gap, overlap
    if pair == ():
        pair = _sweep_overlap(off, shp)
    overlap = None
    if pair is not None:
        i, j = pair
        overlap = _overlap_message([int(max(a, b)) for a, b in zip(off[i], off[j])], [int(keep[i]), int(keep[j])])
    volume = _volume_sum(shp)
    lo = [0] * len(dims)
    hi = [head[k] for k in dims]
    o, e = off[:, dims], off[:, dims] + shp[:, dims]
    gap_at = _find_uncovered(lo, hi, o, e, disjoint=pair is None)
    if pair is None:  # disjoint boxes cover exactly their volume
        return (None if volume == head_volume else
                _gap_message(full_index(gap_at) if gap_at is not None else None, volume, head_volume)), overlap
    if gap_at is not None:
        return (f"no member covers index {full_index(gap_at)} (the member boxes overlap; their volumes add up "
                f"to {volume} of {head_volume} indices, the covered volume was not computed)"), overlap
    if volume <= head_volume:  # overlapping boxes cover less than their volume sum
        return f"member boxes leave a gap (they overlap; their volumes add up to {volume} of {head_volume})", overlap
    return None, overlap  # not decided within the search budget (the overlap already rejects the composite)


def _gap_message(index, covered: int, head_volume: int) -> str:
    where = f"no member covers index {index}" if index is not None else "member boxes leave a gap"
    return f"{where} (members cover {covered} of {head_volume} indices)"


def _overlap_message(index, members) -> str:
    return f"members {members} overlap: each contains index {index}"


def _grid_diagnose(hd, o, e):
    """Exact faults of boxes ``[o, e)`` inside ``[0, hd)`` on their compressed grid:
    ``(covered volume, an uncovered index or None, a doubly covered index or None)``, or
    None when the grid has more than ``_GRID_CELLS`` cells."""
    r = len(hd)
    bounds = []
    cells = 1
    for j in range(r):
        b = np.unique(np.concatenate((np.asarray([0, hd[j]], dtype=o.dtype), o[:, j], e[:, j])))
        bounds.append(b)
        cells *= len(b)
        if cells > _GRID_CELLS:
            return None
    lows = [np.searchsorted(bounds[j], o[:, j]) for j in range(r)]
    highs = [np.searchsorted(bounds[j], e[:, j]) for j in range(r)]
    count = np.zeros([len(b) for b in bounds], dtype=np.int64)
    for corner in range(1 << r):
        at = tuple(highs[j] if (corner >> j) & 1 else lows[j] for j in range(r))
        np.add.at(count, at, -1 if bin(corner).count("1") & 1 else 1)
    for j in range(r):
        np.cumsum(count, axis=j, out=count)
    count = count[(slice(0, -1),) * r]  # one entry per cell [bounds[j][c], bounds[j][c + 1])
    covered = count > 0
    volume = covered.astype(object if math.prod(hd) >= INT_LIMIT else np.int64)
    for b in reversed(bounds):
        volume = np.dot(volume, np.diff(b).astype(volume.dtype))  # contract the last dimension with its widths

    def corner_of(flat):
        """The index at the lower corner of cell number ``flat`` (C order)."""
        cell = np.unravel_index(int(flat), count.shape)
        return [bounds[j][c] for j, c in enumerate(cell)]

    holes = np.flatnonzero(~covered)
    doubles = np.flatnonzero(count > 1)
    return (int(volume), corner_of(holes[0]) if holes.size else None,
            corner_of(doubles[0]) if doubles.size else None)


def _sweep_overlap(off, shp) -> Optional[tuple[int, int]]:
    """Exact overlap search: sort by the start along dimension 0 and compare each box only
    with boxes still open there; the first overlapping pair of rows, or None."""
    r = off.shape[1]
    off, shp = off.tolist(), shp.tolist()  # plain ints: this loop indexes single elements
    order = sorted(range(len(off)), key=lambda i: off[i][0])
    active: list[int] = []
    for i in order:
        start = off[i][0]
        active = [j for j in active if off[j][0] + shp[j][0] > start]
        for j in active:
            if all(off[i][k] < off[j][k] + shp[j][k] and off[j][k] < off[i][k] + shp[i][k] for k in range(r)):
                return j, i
        active.append(i)
    return None


def _find_uncovered(lo, hi, o, e, *, disjoint: bool):
    """One index of ``[lo, hi)`` outside every box ``[o, e)``, found by splitting regions at box
    boundaries; a region is settled when a box contains it or, for disjoint boxes, when their
    volumes inside it fill it (then a region left unsettled always holds a gap, so the search
    goes straight down to one).  None when there is none -- or, for overlapping boxes, when
    ``_SEARCH_NODES`` regions did not find one."""
    stack = [(np.asarray(lo, dtype=o.dtype), np.asarray(hi, dtype=o.dtype), np.arange(len(o)))]
    nodes = 0
    while stack and (disjoint or nodes < _SEARCH_NODES):
        nodes += 1
        lo, hi, rows = stack.pop()
        rows = rows[np.all((o[rows] < hi) & (e[rows] > lo), axis=1)]
        if rows.size == 0:
            return [int(v) for v in lo]
        ro, re_ = np.maximum(o[rows], lo), np.minimum(e[rows], hi)
        if np.any(np.all((ro == lo) & (re_ == hi), axis=1)):
            continue
        if disjoint and _volume_sum(re_ - ro) == math.prod(int(v) for v in hi - lo):
            continue
        k, at = _split_point(lo, hi, ro, re_)
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[k], right_lo[k] = at, at
        stack.append((right_lo, hi, rows))
        stack.append((lo, left_hi, rows))
    return None


def _volume_sum(extents) -> int:
    """Exact sum of the row products of an ``(N, r)`` array of non-negative extents."""
    if extents.dtype != object and len(extents) and int(extents.max()) ** extents.shape[1] * len(extents) < INT_LIMIT:
        return int(np.prod(extents, axis=1).sum())  # no int64 overflow possible
    return sum(math.prod(int(v) for v in row) for row in extents)


def _split_point(lo, hi, ro, re_):
    """``(dimension, coordinate)``: a box boundary strictly inside ``(lo[k], hi[k])`` -- the median
    one along the dimension that has most of them (a region no box contains has one)."""
    best = None
    for k in range(len(lo)):
        inside = np.concatenate((ro[:, k], re_[:, k]))
        inside = inside[(inside > lo[k]) & (inside < hi[k])]
        if inside.size and (best is None or inside.size > best[0]):
            best = (inside.size, k, np.sort(inside)[inside.size // 2])
    return best[1], best[2]


def _empty_box_overlap(head, off, shp, empty_rows) -> Optional[str]:
    """The first pair (an empty box, any other box) that meets the spec's overlap formula
    (``layouts/composite.md § Composition Semantics › Partition``), as a message.

    Along a zero extent the formula asks the other box to start before the empty box's offset
    and end after it, so only an empty box whose offset lies strictly inside the head along
    each of its zero extents can meet it.  Such boxes are taken in blocks sorted along one
    dimension; each block is compared only with the boxes whose span there reaches the block's."""
    if not len(empty_rows):
        return None
    head_arr = np.asarray(head, dtype=off.dtype)
    zero = shp[empty_rows] == 0
    inner = np.all(~zero | ((off[empty_rows] > 0) & (off[empty_rows] < head_arr)), axis=1)
    candidates = empty_rows[inner]
    if not candidates.size:
        return None
    end = off + shp
    dim = max(range(len(head)), key=lambda k: len(np.unique(off[:, k])))
    candidates = candidates[np.argsort(off[candidates, dim], kind="stable")]
    by_start = np.argsort(off[:, dim], kind="stable")
    starts = off[by_start, dim]
    block = 64
    for first in range(0, candidates.size, block):
        rows = candidates[first:first + block]
        low, high = off[rows, dim].min(), end[rows, dim].max()
        partners = by_start[:np.searchsorted(starts, high, side="right")]
        partners = partners[end[partners, dim] >= low]
        for chunk in range(0, partners.size, _PAIR_BLOCK // (block * len(head))):
            other = partners[chunk:chunk + _PAIR_BLOCK // (block * len(head))]
            meets = np.all((off[other][None, :, :] < end[rows][:, None, :]) &
                           (off[rows][:, None, :] < end[other][None, :, :]), axis=2)
            meets &= rows[:, None] != other[None, :]
            hits = np.argwhere(meets)
            if hits.size:
                a, b = int(rows[hits[0][0]]), int(other[hits[0][1]])
                return (f"members {sorted([a, b])} overlap by the non-overlap formula: member {a}'s box "
                        f"(shard_offset {[int(v) for v in off[a]]}, shape {[int(v) for v in shp[a]]}) is empty "
                        f"but lies strictly inside member {b}'s box along its zero extents")
    return None
