"""Partition validation time: hurray_schema's CompositeValidator beside pyhurray's
``Composite("partition", ...)``, same run, same boxes.

    python benchmarks/partition_validation.py [--sizes 1000 10000 100000 1000000]
                                              [--pyhurray-max 30000] [--seed 0]

Members are irregular boxes: a random guillotine (k-d) subdivision of the head, each cut
at a random position along a randomly weighted dimension, so boxes have all sizes and
do not form a grid.  Rank 2 uses a [4096, 4096] head, rank 3 a [256, 256, 256] head.

What is timed (``time.perf_counter``, member objects built beforehand, not timed):

* ``ours total``  -- ``CompositeValidator(head)``, ``push_member`` for every member
  descriptor (per-member checks 1-5) and ``close()`` (exact cover + non-overlap);
* ``ours close``  -- the ``close()`` call alone (the close-time check over N boxes);
* ``pyhurray``    -- ``hurray.Composite("partition", shape=, dtype=uint8, members=)``, which
  runs pyhurray's per-member checks and its pairwise partition check.  It runs only for
  sizes up to ``--pyhurray-max`` (its cost grows with N**2); above that the figure is an
  estimate ``t(largest measured) * (N / N_measured)**2``, marked ``~``.

The ratio is pyhurray / ours-total.  Nothing here asserts; it only measures.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hurray_schema.model import (  # noqa: E402
    BufferHandle, CompositeLayout, CompositionRule, ElementType, Shard, TensorDescriptor,
)
from hurray_schema.rules.composite import CompositeValidator  # noqa: E402

HEADS = {2: (4096, 4096), 3: (256, 256, 256)}


def guillotine(shape, n, rng):
    """``n`` boxes (offset, shape) exactly partitioning ``shape`` by random axis cuts."""
    boxes = [((0,) * len(shape), tuple(shape))]
    splittable = [0]
    while len(boxes) < n and splittable:
        pick = rng.randrange(len(splittable))
        i = splittable[pick]
        off, shp = boxes[i]
        dims = [k for k in range(len(shp)) if shp[k] > 1]
        if not dims:
            splittable[pick] = splittable[-1]
            splittable.pop()
            continue
        k = max(dims, key=lambda d: shp[d] * rng.random())
        cut = rng.randrange(1, shp[k])
        a = list(shp)
        a[k] = cut
        b_off = list(off)
        b_off[k] += cut
        b = list(shp)
        b[k] -= cut
        boxes[i] = (off, tuple(a))
        boxes.append((tuple(b_off), tuple(b)))
        splittable.append(len(boxes) - 1)
    return boxes


def ours(head_shape, boxes):
    head = TensorDescriptor(ElementType.UINT8, head_shape, CompositeLayout(CompositionRule.PARTITION, len(boxes)))
    members = [TensorDescriptor(ElementType.UINT8, s, buffers=(BufferHandle(_prod(s)),),
                                shard=Shard(head_shape, o)) for o, s in boxes]
    t0 = time.perf_counter()
    v = CompositeValidator(head)
    for m in members:
        v.push_member(m)
    t1 = time.perf_counter()
    v.close()
    t2 = time.perf_counter()
    assert v.ok
    return t2 - t0, t2 - t1


def theirs(head_shape, boxes):
    import hurray

    u8 = hurray.uint8
    members = [hurray.Tensor(bytes(_prod(s)), u8, list(s), shard=hurray.Shard(list(head_shape), list(o)))
               for o, s in boxes]
    t0 = time.perf_counter()
    hurray.Composite("partition", shape=list(head_shape), dtype=u8, members=members)
    return time.perf_counter() - t0


def _prod(s):
    out = 1
    for d in s:
        out *= d
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--pyhurray-max", type=int, default=30_000,
                    help="largest member count given to pyhurray (its check is quadratic)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        import hurray  # noqa: F401
        have_pyhurray = True
    except ImportError:
        have_pyhurray = False
    print(f"{'rank':>4} {'members':>9} {'ours total s':>13} {'ours close s':>13} {'pyhurray s':>12} {'ratio':>8}")
    for rank in args.ranks:
        head_shape = HEADS[rank]
        measured = None  # (n, seconds) of the largest pyhurray run
        for n in args.sizes:
            rng = random.Random(args.seed * 1000 + rank * 100 + n)
            boxes = guillotine(head_shape, n, rng)
            total, close = ours(head_shape, boxes)
            py, mark = None, ""
            if have_pyhurray and n <= args.pyhurray_max:
                py = theirs(head_shape, boxes)
                measured = (n, py)
            elif measured is not None:
                py, mark = measured[1] * (n / measured[0]) ** 2, "~"
            py_s = f"{mark}{py:.3f}" if py is not None else "-"
            ratio = f"{mark}{py / total:.1f}x" if py is not None else "-"
            print(f"{rank:>4} {n:>9} {total:>13.3f} {close:>13.3f} {py_s:>12} {ratio:>8}", flush=True)


if __name__ == "__main__":
    main()
