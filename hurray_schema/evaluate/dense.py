"""Dense and indirect addressing: logical index -> linear element offset in buffer 0.

Row-major, column-major and strided layouts are affine (a stride per dimension, in
logical elements, negative and zero allowed: ``layouts/strided.md § Element Address``).
Tiled (``layouts/tiled.md § Element Address``, recursive), Morton
(``layouts/morton.md § Morton Index Computation``), Hilbert (``layouts/hilbert.md
§ Normative Index Mapping``, Skilling's algorithm) and block-paged
(``layouts/block-paged.md § Element Lookup``) give one offset per logical element, as an
``int64`` array in logical C order.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..model import (BlockPagedLayout, BlockTableIndexType, ColumnMajorLayout, HilbertLayout, LayoutTag,
                     MortonLayout, RowMajorLayout, StridedLayout, TiledLayout)
from . import jit
from .elements import UnsupportedEvaluation

__all__ = ["row_major_strides", "column_major_strides", "affine_strides", "element_offsets",
           "tiled_offsets", "morton_offsets", "hilbert_index", "hilbert_coords", "hilbert_offsets",
           "block_paged_offsets", "MAX_ELEMENTS"]

MAX_ELEMENTS = 1 << 32
"""Largest logical element count this evaluator will materialize (a safety bound on hostile shapes;
raise it by assigning ``hurray_schema.evaluate.dense.MAX_ELEMENTS``)."""


ADDRESS_MAX = (1 << 62) - 1
"""Largest tile volume or stride magnitude the offset arithmetic takes (int64, with headroom)."""


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


def column_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in shape:
        strides.append(acc)
        acc *= int(n)
    return tuple(strides)


def affine_strides(layout, storage_shape: Sequence[int]) -> Optional[tuple[int, ...]]:
    """Element strides of an affine layout over ``storage_shape``; ``None`` for other layouts."""
    if isinstance(layout, RowMajorLayout):
        return row_major_strides(storage_shape)
    if isinstance(layout, ColumnMajorLayout):
        return column_major_strides(storage_shape)
    if isinstance(layout, StridedLayout):
        if len(layout.strides) != len(storage_shape):
            raise HurraySchemaError("strided layout: one stride per dimension is required")
        return tuple(layout.strides)
    return None


def _indices(shape):
    """Per-dimension int64 index grids (broadcastable, logical C order)."""
    return np.indices(tuple(shape), dtype=np.int64, sparse=True)


def _linear(idx, strides):
    out = np.zeros((), np.int64)
    for i, s in zip(idx, strides):
        out = out + i * np.int64(s)
    return out


def tiled_offsets(layout: TiledLayout, shape: Sequence[int], idx=None) -> np.ndarray:
    """Offsets of a (possibly recursively) tiled layout (``layouts/tiled.md § Element Address``)."""
    shape = tuple(int(n) for n in shape)
    rank = len(shape)
    tile = tuple(layout.tile_shape)
    if len(tile) != rank or any(t <= 0 for t in tile):
        raise HurraySchemaError("tiled layout: tile_shape needs one positive extent per dimension")
    for what, values in (("tile element count", (math.prod(tile),)), ("outer_strides", layout.outer_strides or ()),
                         ("inner_strides", layout.inner_strides or ())):
        if any(abs(int(v)) > ADDRESS_MAX for v in values):
            raise HurraySchemaError(f"tiled layout: {what} beyond the 64-bit element offsets this evaluator computes")
    if idx is None:
        idx = _indices(shape)
    grid = tuple(-(-n // t) for n, t in zip(shape, tile))
    tile_elems = math.prod(tile)
    t = [i // ts for i, ts in zip(idx, tile)]
    e = [i % ts for i, ts in zip(idx, tile)]
    if layout.outer_layout == LayoutTag.ROW_MAJOR:
        outer = _linear(t, row_major_strides(grid))
    elif layout.outer_layout == LayoutTag.COLUMN_MAJOR:
        outer = _linear(t, column_major_strides(grid))
    elif layout.outer_layout == LayoutTag.STRIDED and layout.outer_strides is not None:
        outer = _linear(t, layout.outer_strides)
    else:
        raise HurraySchemaError(f"tiled layout: outer_layout 0x{int(layout.outer_layout):02X} is not addressable")
    if layout.inner_layout == LayoutTag.ROW_MAJOR:
        inner = _linear(e, row_major_strides(tile))
    elif layout.inner_layout == LayoutTag.COLUMN_MAJOR:
        inner = _linear(e, column_major_strides(tile))
    elif layout.inner_layout == LayoutTag.STRIDED and layout.inner_strides is not None:
        inner = _linear(e, layout.inner_strides)
    elif layout.inner_layout == LayoutTag.TILED and layout.inner is not None:
        inner = tiled_offsets(layout.inner, tile, e)
    else:
        raise HurraySchemaError(f"tiled layout: inner_layout 0x{int(layout.inner_layout):02X} is not addressable")
    return outer * np.int64(tile_elems) + inner


def morton_offsets(layout: MortonLayout, shape: Sequence[int]) -> np.ndarray:
    """Morton codes, bits interleaved LSB first starting with dimension 0 (``layouts/morton.md``)."""
    rank = len(shape)
    bits = tuple(layout.morton_bits)
    if len(bits) != rank or any(b <= 0 for b in bits) or sum(bits) > 62:
        raise HurraySchemaError("morton layout: morton_bits must be positive, one per dimension, sum <= 62")
    for n, b in zip(shape, bits):
        if n > (1 << b):
            raise HurraySchemaError("morton layout: shape[k] exceeds 2**morton_bits[k]")
    code = np.zeros((), np.int64)
    for d, i in enumerate(_indices(shape)):
        for b in range(bits[d]):
            code = code | (((i >> b) & 1) << (b * rank + d))
    return code


@jit.helper
def _coords_to_hilbert(x, r, p):
    """Skilling's CoordsToHilbert (``layouts/hilbert.md § Normative Index Mapping``); x is modified."""
    m = np.int64(1) << (p - 1)
    q = m
    while q > 1:
        pm = q - 1
        for i in range(r):
            if x[i] & q:
                x[0] ^= pm
            else:
                t = (x[0] ^ x[i]) & pm
                x[0] ^= t
                x[i] ^= t
        q >>= 1
    for i in range(1, r):
        x[i] ^= x[i - 1]
    t = np.int64(0)
    q = m
    while q > 1:
        if x[r - 1] & q:
            t ^= q - 1
        q >>= 1
    for i in range(r):
        x[i] ^= t
    h = np.int64(0)
    for b in range(p):
        for d in range(r):
            h |= ((x[d] >> b) & 1) << (b * r + (r - 1 - d))
    return h


def _hilbert_to_coords(h, r, p):
    """Skilling's HilbertToCoords (``layouts/hilbert.md § Normative Index Mapping``); one index, in Python."""
    x = np.zeros(r, np.int64)
    h = np.int64(h)
    for b in range(p):
        for d in range(r):
            x[d] |= ((h >> (b * r + (r - 1 - d))) & 1) << b
    t = x[r - 1] >> 1
    for i in range(r - 1, 0, -1):
        x[i] ^= x[i - 1]
    x[0] ^= t
    q = np.int64(2)
    while q != (np.int64(1) << p):
        pm = q - 1
        for i in range(r - 1, -1, -1):
            if x[i] & q:
                x[0] ^= pm
            else:
                t = (x[0] ^ x[i]) & pm
                x[0] ^= t
                x[i] ^= t
        q <<= 1
    return x


@jit.kernel("void(i64, i64, i64[:], i64[:])")
def _hilbert_offsets(r, p, x, out):
    """``out[lin]``: the Hilbert index of the element at row-major position ``lin`` (``x``: scratch of ``r``)."""
    n = out.size
    side = np.int64(1) << p
    for lin in range(n):
        rem = lin
        for d in range(r - 1, -1, -1):
            x[d] = rem % side
            rem //= side
        out[lin] = _coords_to_hilbert(x, r, p)


def hilbert_index(coords: Sequence[int], order: int) -> int:
    """Hilbert index ``h`` of ``coords`` at curve order ``order`` (one index: in Python, no kernel)."""
    x = np.array(coords, np.int64)
    with np.errstate(over="ignore"):
        return int(_coords_to_hilbert.py_func(x, len(x), np.int64(order)))


def hilbert_coords(h: int, rank: int, order: int) -> tuple[int, ...]:
    return tuple(int(v) for v in _hilbert_to_coords(np.int64(h), int(rank), int(order)))


def hilbert_offsets(layout: HilbertLayout, shape: Sequence[int]) -> np.ndarray:
    r, p = int(layout.hilbert_rank), int(layout.hilbert_order)
    if r != len(shape) or r < 2 or p < 1 or r * p > 62 or any(n != (1 << p) for n in shape):
        raise HurraySchemaError("hilbert layout: every dimension must be 2**hilbert_order, rank == hilbert_rank >= 2")
    out = np.empty(1 << (r * p), np.int64)
    _hilbert_offsets(np.int64(r), np.int64(p), np.empty(r, np.int64), out)
    return out.reshape(tuple(shape))


def _index_array(buffer, index_type, count, name):
    dt = np.dtype("<u4") if index_type == BlockTableIndexType.UINT32 else np.dtype("<u8")
    need = count * dt.itemsize
    if len(buffer) < need:
        raise HurraySchemaError(f"block-paged {name}: needs {need} bytes, buffer has {len(buffer)}")
    return np.frombuffer(buffer, dt, count).astype(np.int64)


def block_paged_offsets(layout: BlockPagedLayout, shape: Sequence[int], buffers,
                        seq_lens: Optional[Sequence[int]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(element offsets in ``page_pool``, page-slot index of each token) (``layouts/block-paged.md``).

    The descriptor carries how many pages each sequence owns, not how many tokens: the
    logical token axis is the concatenation of the sequences' valid tokens.  Pass
    ``seq_lens`` (tokens per sequence) unless it follows from the descriptor: one
    sequence, or every sequence's pages full (``shape[0] == pages * page_size``).
    """
    if len(shape) != 3:
        raise HurraySchemaError("block-paged layout: rank must be 3")
    total, heads, dim = (int(n) for n in shape)
    ps, num_pages, ns = int(layout.page_size), int(layout.num_pages), int(layout.num_seqs)
    if ps < 1 or layout.paged_axis != 0:
        raise HurraySchemaError("block-paged layout: page_size >= 1 and paged_axis == 0 required")
    seq_ptr = _index_array(buffers[2], layout.block_table_index_type, ns + 1, "seq_ptr")
    if seq_ptr[0] != 0 or np.any(np.diff(seq_ptr) < 0):
        raise HurraySchemaError("block-paged seq_ptr must start at 0 and be non-decreasing")
    pages_per_seq = np.diff(seq_ptr)
    table = _index_array(buffers[1], layout.block_table_index_type, int(seq_ptr[-1]), "block_table")
    if table.size and (table.min() < 0 or table.max() >= num_pages):
        raise HurraySchemaError("block-paged block_table names a page >= num_pages")
    if seq_lens is None:
        if ns == 1:
            seq_lens = [total]
        elif total == int(pages_per_seq.sum()) * ps:
            seq_lens = list(pages_per_seq * ps)
        elif total == 0:
            seq_lens = [0] * ns
        else:
            raise UnsupportedEvaluation(
                "block-paged: the per-sequence token counts do not follow from the descriptor; pass seq_lens")
    seq_lens = np.asarray(seq_lens, np.int64)
    if seq_lens.shape != (ns,) or int(seq_lens.sum()) != total or np.any(seq_lens < 0) \
            or np.any(seq_lens > pages_per_seq * ps):
        raise HurraySchemaError("block-paged: seq_lens must sum to shape[0] and fit each sequence's pages")
    seq_of_token = np.repeat(np.arange(ns, dtype=np.int64), seq_lens)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int64)
    t = np.arange(total, dtype=np.int64) - starts[seq_of_token]
    phys_page = table[seq_ptr[seq_of_token] + t // ps] if total else np.zeros(0, np.int64)
    slot = phys_page * ps + t % ps
    h = np.arange(heads, dtype=np.int64)[None, :, None]
    d = np.arange(dim, dtype=np.int64)[None, None, :]
    offsets = (slot[:, None, None] * heads + h) * dim + d
    return offsets, slot


def element_offsets(layout, shape: Sequence[int], storage_shape: Sequence[int], buffers=None,
                    seq_lens=None) -> tuple[Optional[tuple[int, ...]], Optional[np.ndarray], Optional[np.ndarray]]:
    """(affine strides or None, offsets array or None, page slots for block-paged or None)."""
    strides = affine_strides(layout, storage_shape)
    if strides is not None:
        return strides, None, None
    if isinstance(layout, TiledLayout):
        return None, np.broadcast_to(tiled_offsets(layout, storage_shape, _indices(shape)), tuple(shape)), None
    if isinstance(layout, MortonLayout):
        return None, np.broadcast_to(morton_offsets(layout, shape), tuple(shape)), None
    if isinstance(layout, HilbertLayout):
        return None, hilbert_offsets(layout, shape), None
    if isinstance(layout, BlockPagedLayout):
        offsets, slots = block_paged_offsets(layout, shape, buffers, seq_lens)
        return None, offsets, slots
    raise UnsupportedEvaluation(f"layout 0x{int(layout.tag):02X} is not a dense layout this evaluator addresses")
