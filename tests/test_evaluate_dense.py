"""Dense and indirect layouts: row/column-major, strided (negative, zero), tiled (nested),
Morton, Hilbert (Skilling, conformance table), block-paged."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.evaluate_reference import dense_tensor, described, handles
from hurray_schema.errors import HurraySchemaError
from hurray_schema.evaluate import tensor_to_numpy
from hurray_schema.evaluate.dense import hilbert_coords, hilbert_index
from hurray_schema.model import (BlockPagedLayout, ColumnMajorLayout, ElementType, HilbertLayout, LayoutTag,
                                 MortonLayout, StridedLayout, TensorDescriptor, TiledLayout)

E = ElementType


def place(values: np.ndarray, offset_of, size: int, byte_offset_elems: int = 0, fill=0):
    """Buffer of ``size`` elements with ``values[idx]`` stored at ``offset_of(idx)`` (reference placement)."""
    buf = np.full(size, fill, values.dtype)
    for idx in itertools.product(*(range(n) for n in values.shape)):
        buf[byte_offset_elems + offset_of(idx)] = values[idx]
    return buf


def tensor(tag, shape, layout, buf: np.ndarray, byte_offset=0):
    return described(tag, shape, [buf], layout, byte_offset=byte_offset)


@pytest.mark.parametrize("layout", ["row", "col", "strided_rev"])
@pytest.mark.parametrize("tag", [E.FLOAT32, E.FLOAT16, E.INT8, E.BFLOAT16])
def test_affine_layouts_round_trip(layout, tag):
    ref = (np.arange(24).reshape(2, 3, 4) - 5).astype(np.float32).astype(
        {E.FLOAT32: np.float32, E.FLOAT16: np.float16, E.INT8: np.int8, E.BFLOAT16: ml_dtypes.bfloat16}[tag])
    t = dense_tensor(ref, tag, layout)
    got = tensor_to_numpy(t.descriptor, t.buffers)
    assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes()


def test_strided_spec_example():
    """layouts/strided.md § Example: shape [3, 4], strides [-4, 1]: element [2, 3] at offset -5.

    The example's "offset -8 to 0 (9 elements)" disagrees with its own § Buffer Size formula
    (max_offset counts the last dimension: 3 * 1), so the buffer spans offsets -8..3, 12 elements."""
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert 2 * -4 + 3 * 1 == -5
    buf = place(ref, lambda i: i[0] * -4 + i[1], 12, 8)
    got = tensor_to_numpy(*tensor(E.FLOAT32, (3, 4), StridedLayout([-4, 1]), buf, byte_offset=8 * 4))
    assert np.array_equal(got, ref)


def test_zero_stride_broadcasts():
    row = np.array([1, 2, 3], np.int32)
    got = tensor_to_numpy(*tensor(E.INT32, (4, 3), StridedLayout([0, 1]), row))
    assert np.array_equal(got, np.broadcast_to(row, (4, 3)))


@pytest.mark.parametrize("tag,bits", [(E.UINT4, 4), (E.UINT2, 2), (E.BOOL, 1)])
def test_sub_byte_strided_negative(tag, bits):
    """memory-layout.md § Sub-Byte Types: strides in elements, then the packing formula."""
    per = 8 // bits
    n = 2 * per + 1  # element 0 (buffer element n - 1) falls on a byte boundary
    codes = (np.arange(n) * 3) % (1 << bits)
    # logical i lives at linear offset -(i) relative to byte_offset's element 0 = buffer element n-1
    lin = (n - 1) - np.arange(n)
    packed = np.zeros(-(-n // per), np.uint8)
    for c, o in zip(codes, lin):
        packed[o // per] |= np.uint8(c << ((o % per) * bits))
    d = TensorDescriptor(tag, (n,), StridedLayout([-1]), handles([packed]), byte_offset=(n - 1) // per)
    got = tensor_to_numpy(d, [memoryview(packed)])
    assert got.astype(np.int64).tolist() == codes.tolist()


def test_column_major_spec_example():
    """layouts/column-major.md § Example: [3, 4], element [1, 2] at offset 7."""
    ref = np.arange(12, dtype=np.int16).reshape(3, 4)
    buf = place(ref, lambda i: i[0] + 3 * i[1], 12)
    assert buf[7] == ref[1, 2]
    assert np.array_equal(tensor_to_numpy(*tensor(E.INT16, (3, 4), ColumnMajorLayout(), buf)), ref)


def tiled_offset(idx, shape, tile):
    """layouts/tiled.md § Element Address with row-major outer and inner orders."""
    grid = [-(-n // t) for n, t in zip(shape, tile)]
    tnum = 0
    for i, t, g in zip(idx, tile, grid):
        tnum = tnum * g + i // t
    inner = 0
    for i, t in zip(idx, tile):
        inner = inner * t + i % t
    return tnum * int(np.prod(tile)) + inner


def test_tiled_spec_example():
    """layouts/tiled.md § Example: [6, 8], tiles [2, 4]: element [3, 5] at offset 29."""
    assert tiled_offset((3, 5), (6, 8), (2, 4)) == 29
    ref = np.arange(48, dtype=np.float32).reshape(6, 8)
    buf = place(ref, lambda i: tiled_offset(i, (6, 8), (2, 4)), 48)
    assert buf[29] == ref[3, 5]
    assert np.array_equal(tensor_to_numpy(*tensor(E.FLOAT32, (6, 8), TiledLayout((2, 4)), buf)), ref)


def test_tiled_with_boundary_padding_and_orders():
    shape, tile = (5, 7), (2, 3)
    grid = (3, 3)
    ref = np.arange(35, dtype=np.int32).reshape(shape)

    def off(i):  # column-major tile grid, column-major inside tiles
        t = (i[0] // tile[0]) + grid[0] * (i[1] // tile[1])
        e = (i[0] % tile[0]) + tile[0] * (i[1] % tile[1])
        return t * 6 + e

    buf = place(ref, off, 9 * 6, fill=-1)
    lay = TiledLayout(tile, outer_layout=LayoutTag.COLUMN_MAJOR, inner_layout=LayoutTag.COLUMN_MAJOR)
    assert np.array_equal(tensor_to_numpy(*tensor(E.INT32, shape, lay, buf)), ref)


def test_nested_tiling():
    shape, t1, t2 = (8, 8), (4, 4), (2, 2)
    ref = np.arange(64, dtype=np.float32).reshape(shape)

    def off(i):
        outer = tiled_offset((i[0] // 4, i[1] // 4), (2, 2), (1, 1))
        e = (i[0] % 4, i[1] % 4)
        return outer * 16 + tiled_offset(e, t1, t2)

    buf = place(ref, off, 64)
    lay = TiledLayout(t1, inner_layout=LayoutTag.TILED, inner=TiledLayout(t2))
    assert np.array_equal(tensor_to_numpy(*tensor(E.FLOAT32, shape, lay, buf)), ref)


def morton(idx, bits):
    code, rank = 0, len(idx)
    for b in range(max(bits)):
        for d in range(rank):
            if b < bits[d]:
                code |= ((idx[d] >> b) & 1) << (b * rank + d)
    return code


def test_morton_spec_example_and_decode():
    """layouts/morton.md § Example: [2, 3] with 2 bits each -> 14."""
    assert morton((2, 3), (2, 2)) == 14
    shape, bits = (3, 4, 2), (2, 2, 1)
    ref = np.arange(24, dtype=np.float64).reshape(shape)
    buf = place(ref, lambda i: morton(i, bits), 1 << sum(bits))
    assert np.array_equal(tensor_to_numpy(*tensor(E.FLOAT64, shape, MortonLayout(bits), buf)), ref)


HILBERT_TABLE = {0: (0, 0), 1: (1, 0), 2: (1, 1), 3: (0, 1), 4: (0, 2), 5: (0, 3), 6: (1, 3), 7: (1, 2),
                 8: (2, 2), 9: (2, 3), 10: (3, 3), 11: (3, 2), 12: (3, 1), 13: (2, 1), 14: (2, 0), 15: (3, 0)}


def test_hilbert_conformance_table():
    """layouts/hilbert.md § Conformance Check: r = 2, p = 2; the algorithm agrees with every row."""
    for h, x in HILBERT_TABLE.items():
        assert hilbert_coords(h, 2, 2) == x
        assert hilbert_index(x, 2) == h


@pytest.mark.parametrize("r,p", [(2, 3), (3, 2), (4, 1), (2, 5)])
def test_hilbert_bijective_and_adjacent(r, p):
    seen = []
    for h in range(1 << (r * p)):
        x = hilbert_coords(h, r, p)
        assert hilbert_index(x, p) == h
        seen.append(x)
    assert len(set(seen)) == 1 << (r * p)
    steps = np.abs(np.diff(np.array(seen), axis=0)).sum(axis=1)
    assert np.all(steps == 1)  # consecutive indices are neighbours (layouts/hilbert.md § Description)


def test_hilbert_layout_decodes():
    r, p = 2, 3
    shape = (8, 8)
    ref = np.arange(64, dtype=np.uint16).reshape(shape)
    buf = place(ref, lambda i: hilbert_index(i, p), 64)
    assert np.array_equal(tensor_to_numpy(*tensor(E.UINT16, shape, HilbertLayout(p, r), buf)), ref)


def test_hilbert_rejects_bad_shape():
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(*tensor(E.UINT16, (8, 4), HilbertLayout(3, 2), np.zeros(64, np.uint16)))


def block_paged_example():
    """layouts/block-paged.md § Example: 2 sequences (6 and 3 tokens), page 0 shared."""
    page_size, num_pages, heads, dim = 4, 5, 2, 8
    pool = np.random.default_rng(0).standard_normal(num_pages * page_size * heads * dim).astype(np.float16)
    table = np.array([0, 1, 0], np.uint32)
    seq_ptr = np.array([0, 2, 3], np.uint32)
    bufs = [np.frombuffer(b.tobytes(), np.uint8) for b in (pool, table, seq_ptr)]
    lay = BlockPagedLayout(page_size, num_pages, 2)
    d = TensorDescriptor(E.FLOAT16, (9, heads, dim), lay, handles(bufs))
    pages = pool.reshape(num_pages, page_size, heads, dim)
    ref = np.concatenate([pages[0], pages[1][:2], pages[0][:3]])
    return d, [memoryview(b) for b in bufs], ref


def test_block_paged_example_with_seq_lens():
    d, bufs, ref = block_paged_example()
    got = tensor_to_numpy(d, bufs, seq_lens=[6, 3])
    assert got.tobytes() == ref.tobytes()


def test_block_paged_needs_seq_lens_when_ambiguous():
    d, bufs, _ = block_paged_example()
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, bufs)


def test_block_paged_full_pages_need_no_seq_lens():
    d, bufs, _ = block_paged_example()
    pool = np.frombuffer(bufs[0], np.float16).reshape(5, 4, 2, 8)
    d2 = TensorDescriptor(E.FLOAT16, (12, 2, 8), d.layout, d.buffers)
    got = tensor_to_numpy(d2, bufs)
    assert got.tobytes() == np.concatenate([pool[0], pool[1], pool[0]]).tobytes()


def test_block_paged_rejects_page_out_of_range():
    d, bufs, _ = block_paged_example()
    bad = np.frombuffer(np.array([0, 7, 0], np.uint32).tobytes(), np.uint8)
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, [bufs[0], memoryview(bad), bufs[2]], seq_lens=[6, 3])


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_random_strides_match_numpy_as_strided(shape, data):
    """Random signed strides (zero included) over a padded buffer equal NumPy's strided view."""
    rank = len(shape)
    strides = [data.draw(st.integers(-7, 7)) for _ in range(rank)]
    lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape))
    hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape))
    buf = np.arange(hi - lo + 1, dtype=np.float32)
    ref = np.lib.stride_tricks.as_strided(buf[-lo:], shape=shape, strides=[s * 4 for s in strides])
    got = tensor_to_numpy(*tensor(E.FLOAT32, tuple(shape), StridedLayout(strides), buf, byte_offset=-lo * 4))
    assert np.array_equal(got, ref)


def test_block_paged_per_block_quantized_scales_follow_pages():
    """layouts/block-paged.md § Per-page-slot parameters: scale of physical page p, slot i at p * page_size + i."""
    from hurray_schema.model import PerBlockAffine
    page_size, num_pages, heads, dim = 2, 3, 1, 4
    rng = np.random.default_rng(2)
    pool = rng.integers(-100, 100, num_pages * page_size * heads * dim).astype(np.int8)
    scales = (rng.random(num_pages * page_size, np.float32) + np.float32(0.5)).astype(np.float32)
    table = np.array([2, 0], np.uint32)
    seq_ptr = np.array([0, 2], np.uint32)
    bufs = [np.frombuffer(b.tobytes(), np.uint8) for b in (pool, table, seq_ptr, scales)]
    q = PerBlockAffine(axis=0, block_size=page_size, scale_buffer_index=3, zero_point_buffer_index=0xFFFFFFFF,
                       flags=1)
    d = TensorDescriptor(E.INT8, (3, heads, dim), BlockPagedLayout(page_size, num_pages, 1), handles(bufs),
                         quantization=q)
    got = tensor_to_numpy(d, [memoryview(b) for b in bufs])
    pages = pool.reshape(num_pages, page_size, heads, dim).astype(np.float32)
    slot_scales = scales.reshape(num_pages, page_size)
    ref = np.concatenate([pages[2] * slot_scales[2][:, None, None], pages[0][:1] * slot_scales[0][:1, None, None]])
    assert got.tobytes() == ref.astype(np.float32).tobytes()


def test_tiled_strided_grid_with_negative_strides():
    """A tile grid walked backwards (outer strides -1 in tiles): offsets below byte_offset."""
    shape, tile = (4, 4), (2, 2)
    ref = np.arange(16, dtype=np.float32).reshape(shape)
    # tile grid [2, 2]; outer strides [-2, -1] tiles: tile (1, 1) first in memory
    def off(i):
        t = -2 * (i[0] // 2) - (i[1] // 2)
        return t * 4 + (i[0] % 2) * 2 + (i[1] % 2)
    buf = place(ref, off, 16, byte_offset_elems=12)
    lay = TiledLayout(tile, outer_layout=LayoutTag.STRIDED, outer_strides=(-2, -1))
    got = tensor_to_numpy(*tensor(E.FLOAT32, shape, lay, buf, byte_offset=12 * 4))
    assert np.array_equal(got, ref)
