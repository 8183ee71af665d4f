"""read_box: one box of a tensor's or a composite's logical array, reading only what it needs.

Every box read equals the logical array sliced, bit for bit, over hypothesis-drawn boxes (empty
ones and ones on the edges included).  The logical array never comes from the code under test: it
is the array the fixture was built from, or, where the fixture's values pass through a lossy step
(quantization) or a composite, the plain-NumPy decoding of its descriptors and buffers written from
the spec (``tests/support/reference_decode.py``).  That only what the box
needs is read is shown by buffers whose pages outside the needed rows / blocks / members are
unreadable (``mprotect``), in a child process: a read outside would kill it, and the whole
decode does.  The budget is charged on the box: a small box of a huge logical tensor reads
under a small limit.

Stepped boxes (``read_box(..., steps=...)``: every ``step``-th position from ``lo``) equal the
logical array sliced ``lo:hi:steps``, and stepped NumPy indexing (negative steps, steps beyond
the axis) equals NumPy on the logical array; a stepped read of a native affine tensor is a view
of its buffer, charged for the selected elements only.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hurray_schema as hs
from support.descriptors import MEMBER_KINDS, column_major, member_builder
from support.evaluate_reference import dense_tensor
from support.reference_decode import code_values, reference_array
from support.strategies import (SMALL_SHAPES, boxes, overlay_composites, quantized_tensors, sparse_tensors,
                                stepped_boxes)
from hurray_schema.errors import HurraySchemaError, LimitExceeded
from hurray_schema.evaluate import basic_index, materialize, read_box, read_index, tensor_to_numpy
from hurray_schema.evaluate import tensor as tensor_module
from hurray_schema.limits import Limits
from hurray_schema.model import ElementType, MortonLayout, StridedLayout, TensorDescriptor, TiledLayout

E = ElementType
QUIET = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------


def assert_stepped_box_of(whole: np.ndarray, got: np.ndarray, lo, hi, steps) -> None:
    """``got`` is ``whole[lo:hi:steps]``, bit for bit, of the same dtype (C-ordered when unit-step)."""
    if steps is None:
        assert_box_of(whole, got, lo, hi)
        return
    want = whole[tuple(slice(a, b, s) for a, b, s in zip(lo, hi, steps)) + (Ellipsis,)]
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def assert_box_of(whole: np.ndarray, got: np.ndarray, lo, hi) -> None:
    """``got`` is ``whole[lo:hi]``, bit for bit, C-ordered, of the same dtype."""
    want = np.ascontiguousarray(whole[tuple(slice(a, b) for a, b in zip(lo, hi)) + (Ellipsis,)])
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()


def _read(item, lo, hi, steps):
    return read_box(item, lo, hi) if steps is None else read_box(item, lo, hi, steps=steps)


def check_box(whole: np.ndarray, item, lo, hi, steps=None) -> None:
    """The box of ``item`` is the box of ``whole``, the logical array ``item`` was built from."""
    assert_stepped_box_of(whole, _read(item, lo, hi, steps), lo, hi, steps)


def check_tensor(t, lo, hi, steps=None) -> None:
    """The box of ``t`` is the box of its reference decoding (:func:`reference_array`)."""
    check_box(reference_array(t), t, lo, hi, steps)


def check_composite(c, lo, hi, steps=None) -> None:
    """The box of ``c`` is the box of its reference decoding (:func:`reference_array`)."""
    check_box(reference_array(c), c, lo, hi, steps)


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """Sub-byte codes packed LSB-first in C order (``element-types.md § Sub-Byte Types``)."""
    flat = np.asarray(codes, np.uint8).reshape(-1) & ((1 << bits) - 1)
    per = 8 // bits
    padded = np.zeros(-(-flat.size // per) * per, np.uint8)
    padded[:flat.size] = flat
    groups = padded.reshape(-1, per).astype(np.uint16)
    return (groups << (np.arange(per) * bits)).sum(axis=1).astype(np.uint8).tobytes()


# ------------------------------------------------------------------------------------
# Dense layouts
# ------------------------------------------------------------------------------------

WHOLE_BYTE = {E.FLOAT32: np.float32, E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16, E.INT8: np.int8,
              E.INT64: np.int64, E.UINT16: np.uint16, E.FLOAT64: np.float64}
SUB_BYTE = {E.INT4: 4, E.UINT4: 4, E.INT2: 2, E.UINT2: 2, E.FLOAT4_E2M1: 4, E.FLOAT8_E4M3: 8, E.FLOAT8_E5M2: 8}


@settings(QUIET, max_examples=120)
@given(data=st.data(), shape=SMALL_SHAPES, tag=st.sampled_from(sorted(WHOLE_BYTE)),
       layout=st.sampled_from(["row", "col", "strided_rev", "strided_bcast"]))
def test_whole_byte_affine_boxes(data, shape, tag, layout):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    values = (rng.standard_normal(shape) * 50).astype(WHOLE_BYTE[tag])
    if layout == "strided_bcast":
        values = np.broadcast_to(values[:1], shape).copy()
    t = dense_tensor(values, tag, layout)
    check_box(values, t, *data.draw(stepped_boxes(shape)))


@settings(QUIET, max_examples=120)
@given(data=st.data(), shape=SMALL_SHAPES, tag=st.sampled_from(sorted(SUB_BYTE) + [E.BOOL]), col=st.booleans())
def test_code_type_boxes(data, shape, tag, col):
    """Sub-byte and narrow-float codes: a box starting inside a byte included (odd shapes)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    stored = tuple(reversed(shape)) if col else shape
    if tag == E.BOOL:
        whole = rng.random(stored) < 0.5
        t = hs.Tensor.from_numpy(whole)
    else:
        bits = SUB_BYTE[tag]
        codes = rng.integers(0, 1 << bits, size=stored)
        data_bytes = pack_codes(codes, bits) if bits < 8 else codes.astype(np.uint8).tobytes()
        t = hs.Tensor.dense(tag, stored, data_bytes)
        whole = code_values(codes, tag)  # the values of the codes written (element-types.md)
    check_box(whole.T if col else whole, column_major(t) if col else t, *data.draw(stepped_boxes(shape)))


def morton_tensor(side: int):
    """A [side, side] float32 Morton tensor: element (i, j) at the bit interleave of i and j
    (``layouts/morton.md § Morton Index Computation``), dimension 0 in the low bit."""
    bits = side.bit_length() - 1
    values = np.arange(side * side, dtype=np.float32).reshape(side, side) * 0.5
    storage = np.zeros(side * side, np.float32)
    for i in range(side):
        for j in range(side):
            code = sum((((i >> b) & 1) << (2 * b)) | (((j >> b) & 1) << (2 * b + 1)) for b in range(bits))
            storage[code] = values[i, j]
    data = np.frombuffer(storage.tobytes(), np.uint8)
    desc = TensorDescriptor(E.FLOAT32, (side, side), MortonLayout((bits, bits)), (hs.BufferHandle(data.size),))
    return hs.Tensor(desc, [data]), values


def tiled_tensor():
    """A [6, 4] float32 tensor in [3, 2] tiles, tiles and elements row-major (``layouts/tiled.md``)."""
    values = np.arange(24, dtype=np.float32).reshape(6, 4) - 7
    tiles = values.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)  # (tile row, tile col, in-tile row, in-tile col)
    data = np.frombuffer(np.ascontiguousarray(tiles).tobytes(), np.uint8)
    desc = TensorDescriptor(E.FLOAT32, (6, 4), TiledLayout((3, 2)), (hs.BufferHandle(data.size),))
    return hs.Tensor(desc, [data]), values


@settings(QUIET, max_examples=40)
@given(data=st.data())
def test_indirect_layouts_decode_whole_then_slice(data):
    """Tiled and Morton tensors are decoded whole, then sliced: the box still equals the reference."""
    for t, values in (morton_tensor(8), tiled_tensor()):
        assert tensor_to_numpy(t.descriptor, t.buffers).tobytes() == values.tobytes()  # the fixture is right
        lo, hi, steps = data.draw(stepped_boxes(values.shape))
        assert_stepped_box_of(values, _read(t, lo, hi, steps), lo, hi, steps)


def test_rank0_tensor():
    t = hs.Tensor.dense(E.FLOAT32, (), np.array(3.5, np.float32).tobytes())
    got = read_box(t, (), ())
    assert got.shape == () and got.dtype == np.float32 and float(got) == 3.5


# ------------------------------------------------------------------------------------
# Quantized tensors
# ------------------------------------------------------------------------------------


@settings(QUIET, max_examples=200)
@given(data=st.data(), item=quantized_tensors(), vector=st.booleans())
def test_quantized_boxes(data, item, vector):
    t, shape = item
    saved = tensor_module.INT4_VECTOR
    tensor_module.INT4_VECTOR = vector  # both the vector and the table-lookup kernels
    try:
        check_tensor(t, *data.draw(stepped_boxes(shape)))
    finally:
        tensor_module.INT4_VECTOR = saved


def test_per_block_box_decodes_whole_blocks_with_the_row_kernel():
    """A [64, 256] int4 per-block tensor (block 64): a box inside one block row is its block decoded."""
    rng = np.random.default_rng(5)
    t = hs.quantize(rng.standard_normal((64, 256)).astype(np.float16), "per_block", block_size=64)
    check_tensor(t, (3, 70), (9, 100))
    check_tensor(t, (0, 255), (64, 256))


# ------------------------------------------------------------------------------------
# Sparse tensors
# ------------------------------------------------------------------------------------


@settings(QUIET, max_examples=150)
@given(data=st.data(), item=sparse_tensors())
def test_sparse_boxes(data, item):
    t, dense = item
    check_box(dense, t, *data.draw(stepped_boxes(dense.shape)))


def test_sparse_box_reads_the_box_entries_only():
    """Coordinates outside the box are out of bounds: the whole decode refuses the tensor, the
    box read -- which reads only the box's rows (CSR pointers, sorted COO bisection) -- does not."""
    dense = np.zeros((8, 8), np.float32)
    dense[np.arange(8), np.arange(8)] = np.arange(1, 9)
    csr = hs.sparse_csr(dense[np.arange(8), np.arange(8)], np.arange(8), np.arange(9), (8, 8))
    minor = bytearray(csr.buffers[1])
    minor[0:8] = (99).to_bytes(8, "little")  # row 0's column: out of bounds
    bad_csr = hs.Tensor(csr.descriptor, (csr.buffers[0], bytes(minor), csr.buffers[2]))
    coo = hs.sparse_coo(np.stack([np.arange(8)] * 2, axis=1), np.arange(1, 9, dtype=np.float32), (8, 8))
    indices = bytearray(coo.buffers[1])
    indices[-8:] = (99).to_bytes(8, "little")  # the last entry's column: out of bounds
    bad_coo = hs.Tensor(coo.descriptor, (coo.buffers[0], bytes(indices)))
    for bad in (bad_csr, bad_coo):
        with pytest.raises(HurraySchemaError, match="out of bounds"):
            tensor_to_numpy(bad.descriptor, bad.buffers)
        assert_box_of(dense, read_box(bad, (2, 0), (6, 8)), (2, 0), (6, 8))
        with pytest.raises(HurraySchemaError, match="out of bounds"):
            read_box(bad, (0, 0), (8, 8))


def test_a_sorted_coo_box_checks_the_order_of_the_box_rows_only():
    """``layouts/coo.md § Storage Order``: a COO marked sorted whose entries 4 and 5 are swapped is
    refused by a box holding both rows and by the whole decode, not by a box of other rows."""
    dense = np.zeros((8, 8), np.float32)
    dense[np.arange(8), np.arange(8)] = np.arange(1, 9)
    coo = hs.sparse_coo(np.stack([np.arange(8)] * 2, axis=1), np.arange(1, 9, dtype=np.float32), (8, 8))
    assert coo.descriptor.layout.is_sorted == 1
    entries = np.frombuffer(coo.buffers[1], "<u8").reshape(8, 2).copy()
    entries[[4, 5]] = entries[[5, 4]]
    values = np.frombuffer(coo.buffers[0], np.float32).copy()
    values[[4, 5]] = values[[5, 4]]
    bad = hs.Tensor(coo.descriptor, (values.tobytes(), entries.tobytes()))
    with pytest.raises(HurraySchemaError, match="lexicographic"):
        read_box(bad, (3, 0), (7, 8))
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(bad.descriptor, bad.buffers)
    assert_box_of(dense, read_box(bad, (0, 0), (4, 8)), (0, 0), (4, 8))
    assert_box_of(dense, read_box(bad, (6, 1), (8, 7)), (6, 1), (8, 7))


# ------------------------------------------------------------------------------------
# Composites
# ------------------------------------------------------------------------------------

@settings(QUIET, max_examples=80)
@given(data=st.data(), shape=st.lists(st.integers(2, 10), min_size=2, max_size=2).map(tuple),
       dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]),
       grid=st.tuples(st.integers(1, 3), st.integers(1, 3)))
def test_partition_boxes(data, shape, dtype, grid):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    values = (rng.standard_normal(shape) * 2).astype(dtype)
    kinds = [data.draw(st.sampled_from(MEMBER_KINDS)) for _ in range(grid[0] * grid[1])]
    pieces = iter(kinds)
    c = hs.partition(values, grid=grid, member=lambda sub: member_builder(next(pieces))(sub))
    check_composite(c, *data.draw(stepped_boxes(shape)))


@settings(QUIET, max_examples=60)
@given(data=st.data(), rows=st.integers(1, 12), cols=st.sampled_from([4, 8, 12, 64, 72]),
       dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32]),
       combine=st.sampled_from(["replace", "add"]), bits=st.sampled_from([2, 4, 8]))
def test_spqr_overlay_boxes(data, rows, cols, dtype, combine, bits):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    weight = (rng.standard_normal((rows, cols)) * rng.choice([1, 30], size=(rows, cols))).astype(dtype)
    c = hs.spqr(weight, bits=bits, block_size=4, outliers=0.05, combine_op=combine)
    check_composite(c, *data.draw(stepped_boxes((rows, cols))))


@settings(QUIET, max_examples=60)
@given(data=st.data(), c=overlay_composites())
def test_overlay_boxes_dense_and_sparse_corrections(data, c):
    """Corrections of every kind at random offsets, applied in emission order; float16 / bfloat16
    additions round at every step (``layouts/composite.md § Overlay``)."""
    check_composite(c, *data.draw(stepped_boxes(tuple(c.shape))))


def without_buffers(item):
    """``item`` with every leaf's buffers emptied (its descriptors kept): any read of it fails."""
    if isinstance(item, hs.Composite):
        return hs.Composite(item.descriptor, [without_buffers(m) for m in item.members])
    return hs.Tensor(item.descriptor, tuple(b"" for _ in item.buffers))


def holds_a_selected_position(member, lo, hi, steps) -> bool:
    """Whether the member's shard box holds a position of the stepped box (per dimension a common
    element of ``range(lo, hi, step)`` and ``range(offset, offset + n)``)."""
    offset = member.descriptor.shard.shard_offset
    return all(set(range(a, b, s)) & set(range(o, o + n))
               for a, b, s, o, n in zip(lo, hi, steps, offset, member.shape))


@settings(QUIET, max_examples=80)
@given(data=st.data(), rule=st.sampled_from(["partition", "overlay"]))
def test_stepped_reads_skip_members_holding_no_selected_position(data, rule):
    """A stepped read of a partition or overlay reads no member whose box holds none of the
    selected positions (even one inside the bounding box): those members, their buffers emptied,
    do not change the result, which is the whole view sliced ``lo:hi:steps``."""
    if rule == "overlay":
        c = data.draw(overlay_composites())
    else:
        rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
        values = (rng.standard_normal(data.draw(st.tuples(st.integers(2, 10), st.integers(2, 10)))) * 2)
        pieces = iter(data.draw(st.lists(st.sampled_from(MEMBER_KINDS), min_size=9, max_size=9)))
        c = hs.partition(values.astype(np.float16), grid=data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3))),
                         member=lambda sub: member_builder(next(pieces))(sub))
    lo, hi = data.draw(boxes(tuple(c.shape)))
    steps = tuple(data.draw(st.integers(1, n + 1)) for n in c.shape)
    members = [m if holds_a_selected_position(m, lo, hi, steps) else without_buffers(m) for m in c.members]
    assert_stepped_box_of(reference_array(c), read_box(hs.Composite(c.descriptor, members), lo, hi, steps=steps),
                          lo, hi, steps)


def test_overlay_inside_partition():
    rng = np.random.default_rng(11)
    values = rng.standard_normal((16, 32)).astype(np.float16)
    c = hs.partition(values, grid=(2, 2), member=lambda sub: hs.spqr(sub, block_size=8, outliers=0.05))
    for lo, hi in [((0, 0), (16, 32)), ((3, 5), (13, 29)), ((8, 16), (9, 17)), ((4, 4), (4, 9))]:
        check_composite(c, lo, hi)


def test_box_outside_the_shape_is_refused():
    t = hs.Tensor.from_numpy(np.zeros((3, 4), np.float32))
    c = hs.partition(np.zeros((3, 4), np.float32), grid=(3, 1))
    for item in (t, c):
        for lo, hi in [((0, 0), (4, 4)), ((2, 0), (1, 4)), ((0,), (3,)), ((-1, 0), (2, 2))]:
            with pytest.raises(HurraySchemaError):
                read_box(item, lo, hi)


# ------------------------------------------------------------------------------------
# Only what the box needs is read
# ------------------------------------------------------------------------------------


def test_native_box_is_a_read_only_view_of_the_buffer():
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    t = hs.Tensor.from_numpy(values)
    got = read_box(t, (10, 0), (12, 32))
    assert np.shares_memory(got, np.frombuffer(t.buffers[0], np.uint8))
    assert not got.flags.writeable
    assert got.tobytes() == values[10:12].tobytes()


def test_partition_reads_only_the_members_it_meets():
    """A member outside the box whose buffer is empty: the whole view fails, the box does not."""
    values = np.arange(36, dtype=np.float32).reshape(6, 6)
    c = hs.partition(values, grid=(3, 1))
    broken = hs.Tensor(c.members[2].descriptor, (b"",))
    bad = hs.Composite(c.descriptor, [c.members[0], c.members[1], broken])
    with pytest.raises(HurraySchemaError):
        materialize(bad)
    assert_box_of(values, read_box(bad, (1, 2), (4, 6)), (1, 2), (4, 6))


GUARDED_CHILD = textwrap.dedent('''
    import ctypes, mmap, sys
    import numpy as np
    import hurray_schema as hs
    from hurray_schema.evaluate import read_box, materialize
    sys.path.insert(0, "tests")
    from support.reference_decode import reference_array  # the expected arrays: never the code under test

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    KEEP = []

    def guarded(data, readable):
        """``data`` copied into fresh pages; only the pages meeting the byte ranges ``readable`` stay
        readable (a read of any other page kills the process)."""
        data = bytes(data)
        size = -(-max(len(data), 1) // PAGE) * PAGE
        mm = mmap.mmap(-1, size)
        mm[:len(data)] = data
        KEEP.append(mm)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        allowed = set()
        for start, stop in readable:
            allowed.update(range(start // PAGE, -(-stop // PAGE)))
        for page in range(size // PAGE):
            if page not in allowed:
                assert libc.mprotect(address + page * PAGE, PAGE, 0) == 0
        return memoryview(mm)[:len(data)]

    def same(got, want):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()

    rng = np.random.default_rng(0)
    cases = []

    # row-major float32 [64, 4096]: rows 20..23 (16 KiB a row)
    values = rng.standard_normal((64, 4096)).astype(np.float32)
    t = hs.Tensor.from_numpy(values)
    row = 4096 * 4
    cases.append((hs.Tensor(t.descriptor, [guarded(t.buffers[0], [(20 * row, 24 * row)])]), values,
                  (20, 100), (24, 3000)))

    # column-major float32 [4096, 64]: columns 5..6
    stored = rng.standard_normal((64, 4096)).astype(np.float32)
    t = hs.Tensor.from_numpy(stored)
    import attrs
    desc = attrs.evolve(t.descriptor, shape=(4096, 64), layout=hs.ColumnMajorLayout())
    cases.append((hs.Tensor(desc, [guarded(t.buffers[0], [(5 * row, 7 * row)])]), stored.T, (0, 5), (4096, 7)))

    # int4 per-block (block 64) [64, 8192] -> float16: rows 30..33, blocks 10..12 (4 KiB a row)
    weight = rng.standard_normal((64, 8192)).astype(np.float16)
    q = hs.quantize(weight, "per_block", block_size=64)
    whole = reference_array(q)
    row = 8192 // 2
    needed = [(r * row + 10 * 32, r * row + 13 * 32) for r in range(30, 34)]
    cases.append((hs.Tensor(q.descriptor, [guarded(q.buffers[0], needed)] + list(q.buffers[1:])), whole,
                  (30, 10 * 64 + 5), (34, 13 * 64 - 3)))

    # CSR [512, 512], 128 entries a row: rows 100..103 of the indices and values only
    dense = np.zeros((512, 512), np.float32)
    cols = np.stack([rng.choice(512, 128, replace=False) for _ in range(512)])
    dense[np.arange(512)[:, None], cols] = rng.standard_normal((512, 128)).astype(np.float32) + 5
    coords = np.argwhere(dense != 0)
    indptr = np.arange(0, 512 * 128 + 1, 128)
    csr = hs.sparse_csr(dense[tuple(coords.T)], coords[:, 1], indptr, (512, 512))
    span = (100 * 128, 104 * 128)
    cases.append((hs.Tensor(csr.descriptor, [guarded(csr.buffers[0], [(span[0] * 4, span[1] * 4)]),
                                             guarded(csr.buffers[1], [(span[0] * 8, span[1] * 8)]),
                                             csr.buffers[2]]), dense, (100, 7), (104, 400)))

    # sorted COO, same entries: the bisection reads a few first coordinates, then rows 100..103
    coo = hs.sparse_coo(coords, dense[tuple(coords.T)], (512, 512))
    probes = set()
    a = 0
    for target in (100, 104):  # the entries a bisection touches (the second starts where the first ended)
        b = coords.shape[0]
        while a < b:
            mid = (a + b) // 2
            probes.add(mid)
            if coords[mid, 0] < target:
                a = mid + 1
            else:
                b = mid
    readable = [(k * 16, k * 16 + 16) for k in probes] + [(span[0] * 16, span[1] * 16)]
    cases.append((hs.Tensor(coo.descriptor, [guarded(coo.buffers[0], [(span[0] * 4, span[1] * 4)]),
                                             guarded(coo.buffers[1], readable)]), dense, (100, 7), (104, 400)))

    # partition of four [32, 1024] float32 members: only member 1 may be read
    values = rng.standard_normal((128, 1024)).astype(np.float32)
    part = hs.partition(values, grid=(4, 1))
    members = [m if k == 1 else hs.Tensor(m.descriptor, [guarded(m.buffers[0], [])])
               for k, m in enumerate(part.members)]
    cases.append((hs.Composite(part.descriptor, members), values, (40, 3), (60, 900)))

    # SpQR overlay [256, 8192] float16: the base's needed blocks and the correction's box entries
    weight = rng.standard_normal((256, 8192)).astype(np.float16)
    spqr = hs.spqr(weight, block_size=64)
    whole = reference_array(spqr)
    base, corr = spqr.members
    row = 8192 // 2
    needed = [(r * row + 2 * 32, r * row + 4 * 32) for r in range(128, 132)]
    base = hs.Tensor(base.descriptor, [guarded(base.buffers[0], needed)] + list(base.buffers[1:]))
    overlay = hs.Composite(spqr.descriptor, [base, corr])
    cases.append((overlay, whole, (128, 130), (132, 250)))

    which = sys.argv[1]
    if which == "boxes":
        for item, want, lo, hi in cases:
            same(read_box(item, lo, hi), want[tuple(slice(a, b) for a, b in zip(lo, hi))])
        print("ok", len(cases))
    else:  # the whole decode of one guarded case: must die
        item = cases[int(which)][0]
        (materialize(item) if hasattr(item, "members") else item.to_numpy()).sum()
        print("read everything")
''')


def run_guarded(argument: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", GUARDED_CHILD, argument], cwd=root, capture_output=True, text=True,
                          timeout=900)


def test_box_reads_touch_only_the_needed_pages():
    """Dense rows / columns, per-block quantized blocks, CSR rows, sorted COO rows, one partition
    member and an SpQR overlay box, each read from buffers whose other pages are unreadable."""
    done = run_guarded("boxes")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "7"]


@pytest.mark.parametrize("case", ["0", "2", "5"])
def test_whole_decode_of_a_guarded_buffer_dies(case):
    """The guard works: decoding the whole tensor (composite) reads a protected page."""
    done = run_guarded(case)
    assert done.returncode != 0 and "read everything" not in done.stdout


# ------------------------------------------------------------------------------------
# Evaluation budget: the box is charged, not the whole
# ------------------------------------------------------------------------------------

SMALL = Limits(max_evaluation_bytes=4096)


def huge_broadcast():
    """A [2**24, 2**24] float32 tensor of strides [0, 0]: 2**48 logical elements, every one the 1.5
    its 4-byte buffer stores (``layouts/strided.md``: zero strides allowed)."""
    data = np.frombuffer(np.array([1.5], np.float32).tobytes(), np.uint8)
    desc = TensorDescriptor(E.FLOAT32, (2 ** 24, 2 ** 24), StridedLayout((0, 0)), (hs.BufferHandle(data.size),))
    return hs.Tensor(desc, [data])


def test_small_box_of_a_huge_tensor_reads_under_a_small_limit():
    t = huge_broadcast()
    with pytest.raises(LimitExceeded):
        tensor_to_numpy(t.descriptor, t.buffers, limits=SMALL)
    got = read_box(t, (5, 2 ** 24 - 4), (9, 2 ** 24), limits=SMALL)
    assert got.shape == (4, 4) and np.all(got == 1.5)
    with pytest.raises(LimitExceeded):  # the box itself is charged
        read_box(t, (0, 0), (64, 2 ** 10), limits=SMALL)


def test_small_box_of_a_huge_sparse_tensor_and_overlay():
    n = 10 ** 9
    coo = hs.sparse_coo([[5, 7], [n - 1, n - 2]], np.array([1.5, 2.5], np.float32), (n, n))
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(coo.descriptor, coo.buffers, limits=SMALL)
    got = read_box(coo, (n - 4, n - 4), (n, n), limits=SMALL)
    assert got.shape == (4, 4) and got[3, 2] == 2.5 and np.count_nonzero(got) == 1
    with pytest.raises(LimitExceeded):
        read_box(coo, (0, 0), (1024, 1024), limits=SMALL)

    side = 2 ** 24
    correction = hs.sparse_coo([[1, 1], [side - 1, side - 1]], np.array([4.0, 8.0], np.float32), (side, side))
    ov = hs.overlay(huge_broadcast(), [correction], "add")
    with pytest.raises(HurraySchemaError):
        materialize(ov, limits=SMALL)
    got = read_box(ov, (side - 2, side - 2), (side, side), limits=SMALL)
    assert got.tolist() == [[1.5, 1.5], [1.5, 9.5]]
    assert read_box(ov, (0, 0), (3, 3), limits=SMALL)[1, 1] == 5.5


# ------------------------------------------------------------------------------------
# Stepped reads: NumPy indexing with steps, views and the budget
# ------------------------------------------------------------------------------------


@st.composite
def stepped_indices(draw, shape):
    """A NumPy basic index of ``shape`` rich in steps: per axis of a prefix an integer or a slice
    whose step is any non-zero integer up to beyond the axis (negative ones included), an optional
    Ellipsis before a suffix, ``None`` anywhere."""
    def entry(n):
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        step = st.integers(-n - 5, n + 5).filter(bool)
        return st.one_of(st.builds(slice, bound, bound, step), st.integers(-n, n - 1))
    prefix = draw(st.integers(0, len(shape)))
    entries = [draw(entry(n)) for n in shape[:prefix]]
    if prefix < len(shape) and draw(st.booleans()):
        entries += [Ellipsis] + [draw(entry(n)) for n in shape[len(shape) - draw(st.integers(0, len(shape) - prefix)):]]
    if draw(st.booleans()):
        entries.insert(draw(st.integers(0, len(entries))), None)
    return tuple(entries)


@st.composite
def indexed_items(draw):
    """(item, its logical array): a tensor of a whole-byte or code type on an affine layout, a
    quantized or sparse tensor, a partition of mixed members or an overlay (:func:`overlay_composites`).
    The array is the one the item was built from, or its reference decoding (:func:`reference_array`)."""
    kind = draw(st.sampled_from(["whole_byte", "code", "quantized", "sparse", "partition", "overlay"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if kind == "whole_byte":
        shape = draw(SMALL_SHAPES)
        tag = draw(st.sampled_from(sorted(WHOLE_BYTE)))
        layout = draw(st.sampled_from(["row", "col", "strided_rev", "strided_bcast"]))
        values = (rng.standard_normal(shape) * 50).astype(WHOLE_BYTE[tag])
        if layout == "strided_bcast":
            values = np.broadcast_to(values[:1], shape).copy()
        reference = dense_tensor(values, tag, layout)
        return hs.Tensor(reference.descriptor, reference.buffers), values
    elif kind == "code":
        shape = draw(SMALL_SHAPES)
        tag = draw(st.sampled_from(sorted(SUB_BYTE)))
        codes = rng.integers(0, 1 << SUB_BYTE[tag], size=shape)
        bits = SUB_BYTE[tag]
        item = hs.Tensor.dense(tag, shape, pack_codes(codes, bits) if bits < 8 else codes.astype(np.uint8).tobytes())
        return item, code_values(codes, tag)
    elif kind == "quantized":
        item = draw(quantized_tensors())[0]
    elif kind == "sparse":
        return draw(sparse_tensors())
    elif kind == "partition":
        values = (rng.standard_normal(draw(st.tuples(st.integers(2, 9), st.integers(2, 9)))) * 2).astype(np.float16)
        pieces = iter(draw(st.lists(st.sampled_from(MEMBER_KINDS), min_size=4, max_size=4)))
        composite = hs.partition(values, grid=(2, 2), member=lambda sub: member_builder(next(pieces))(sub))
        return composite, reference_array(composite)
    else:
        composite = draw(overlay_composites())
        return composite, reference_array(composite)
    return item, reference_array(item)


@settings(QUIET, max_examples=150)
@given(data=st.data(), item=indexed_items())
def test_stepped_indexing_equals_numpy(data, item):
    """``item[index]`` is NumPy's ``whole[index]`` (same type, dtype, shape and bytes), and the
    stepped box it reads holds exactly the elements NumPy selects."""
    item, whole = item
    index = data.draw(stepped_indices(whole.shape))
    expected = whole[index]
    got = item[index]
    assert type(got) is type(expected)
    assert np.asarray(got).dtype == expected.dtype and np.shape(got) == np.shape(expected)
    assert np.asarray(got).tobytes() == np.asarray(expected).tobytes()
    assert math.prod(basic_index(index, whole.shape).counts) == np.size(expected)


def test_basic_index_steps_and_residual():
    """A negative step is the progression from its lowest position, reversed by the residual."""
    selection = basic_index((slice(None, None, -3), 2, slice(1, None, 100), None), (10, 4, 7))
    assert (selection.lo, selection.hi, selection.steps) == ((0, 2, 1), (10, 3, 2), (3, 1, 100))
    assert selection.counts == (4, 1, 1)
    assert selection.residual == (slice(None, None, -1), 0, slice(None), None)


def test_stepped_native_read_is_a_view_of_the_buffer():
    """A stepped box of a row-major float32 tensor is a strided view of buffer 0, not a copy."""
    values = np.arange(512 * 384, dtype=np.float32).reshape(512, 384)
    t = hs.Tensor.from_numpy(values)
    buffer = np.frombuffer(t.buffers[0], np.uint8)
    for index in (np.s_[1::100, 3::7], np.s_[::-64, 5], np.s_[::100]):
        got = t[index]
        assert np.shares_memory(got, buffer)
        assert got.shape == values[index].shape and got.tobytes() == values[index].tobytes()
    box = read_box(t, (1, 3), (512, 384), steps=(100, 7))
    assert np.shares_memory(box, buffer) and not box.flags.writeable


def broadcast_rows(rows: int, row: np.ndarray) -> hs.Tensor:
    """A [rows, len(row)] float32 tensor every row of which is ``row`` (strides [0, 1] over one
    stored row: ``layouts/strided.md``, zero strides allowed)."""
    data = np.frombuffer(row.astype(np.float32).tobytes(), np.uint8)
    desc = TensorDescriptor(E.FLOAT32, (rows, row.size), StridedLayout((0, 1)), (hs.BufferHandle(data.size),))
    return hs.Tensor(desc, [data])


def test_stepped_read_is_charged_for_the_selected_elements_only():
    """``[::65536, 1::2]`` of a [2**20, 4096] float32 tensor (16 GiB logical, one 16 KiB row
    stored) selects 16 x 2048 elements: read under a small budget, as a view of the buffer, where
    its bounding box is refused; a stepped box beyond the budget is still refused."""
    row = np.arange(4096, dtype=np.float32) * 0.25
    t = broadcast_rows(2 ** 20, row)
    selection = basic_index(np.s_[::65536, 1::2], t.shape)
    with pytest.raises(LimitExceeded):
        read_box(t, selection.lo, selection.hi, limits=SMALL)
    got = read_index(t, selection, limits=SMALL)
    assert got.shape == (16, 2048) and got.tobytes() == np.broadcast_to(row[1::2], (16, 2048)).tobytes()
    assert np.shares_memory(got, np.frombuffer(t.buffers[0], np.uint8))
    with pytest.raises(LimitExceeded):  # 2**14 x 2048 selected elements: beyond both the budget and the allowance
        read_box(t, (0, 0), (2 ** 20, 4096), steps=(64, 2), limits=SMALL)


def test_stepped_int4_read_gathers_the_selected_codes():
    """An int4 [37, 53] tensor (codes packed two a byte, boxes starting inside a byte): stepped boxes
    and stepped indexing equal NumPy on the whole decode."""
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 16, size=(37, 53))
    t = hs.Tensor.dense(E.INT4, (37, 53), pack_codes(codes, 4))
    whole = code_values(codes, E.INT4)
    for lo, hi, steps in [((1, 3), (37, 53), (5, 3)), ((0, 0), (37, 53), (36, 60)), ((7, 1), (8, 52), (1, 2))]:
        assert_stepped_box_of(whole, read_box(t, lo, hi, steps=steps), lo, hi, steps)
    for index in (np.s_[3::5, ::-4], np.s_[::-7, 50:0:-9], np.s_[-1, 1::2]):
        assert t[index].tobytes() == whole[index].tobytes() and t[index].shape == whole[index].shape


@pytest.mark.parametrize("steps", [(0, 1), (1, -2), (1,), (1, 1, 1)])
def test_bad_steps_are_refused(steps):
    t = hs.Tensor.from_numpy(np.zeros((3, 4), np.float32))
    c = hs.partition(np.zeros((3, 4), np.float32), grid=(3, 1))
    for item in (t, c):
        with pytest.raises(HurraySchemaError, match="step"):
            read_box(item, (0, 0), (3, 4), steps=steps)


def broadcast_partition(row_blocks: int, rows: int, row_values: list[list[np.ndarray]]) -> hs.Composite:
    """A partition whose member (i, j) is ``broadcast_rows(rows, row_values[i][j])`` at offset
    ``(i * rows, j * width)``: a large logical array stored as one row per member."""
    width = row_values[0][0].size
    shape = (row_blocks * rows, len(row_values[0]) * width)
    members = []
    for i, blocks in enumerate(row_values):
        for j, row in enumerate(blocks):
            member = broadcast_rows(rows, row)
            members.append(hs.Tensor(attrs.evolve(member.descriptor, shard=hs.Shard(shape, (i * rows, j * width))),
                                     member.buffers))
    c = hs.Composite.build("partition", members, shape=shape, type_tag=E.FLOAT32)
    c.validate()
    return c


def test_stepped_read_of_a_large_partition_is_charged_for_the_selected_elements():
    """``[::65536, 3::64]`` of a [2**21, 8192] float32 partition (64 GiB logical, four broadcast
    members of one stored row each) selects 32 x 128 elements: read under a small budget, where
    its bounding box is refused; negative steps and steps beyond the axis too."""
    rng = np.random.default_rng(3)
    row_values = [[rng.standard_normal(4096).astype(np.float32) for _ in range(2)] for _ in range(2)]
    c = broadcast_partition(2, 2 ** 20, row_values)
    full_rows = [np.concatenate(blocks) for blocks in row_values]  # the head's row in each row block

    def expected(row_positions, column_index):
        return np.stack([full_rows[r // 2 ** 20][column_index] for r in row_positions])

    selection = basic_index(np.s_[::65536, 3::64], c.shape)
    with pytest.raises(LimitExceeded):
        read_box(c, selection.lo, selection.hi, limits=SMALL)
    got = read_index(c, selection, limits=SMALL)
    assert got.shape == (32, 128) and got.tobytes() == expected(range(0, 2 ** 21, 65536), np.s_[3::64]).tobytes()
    got = read_index(c, basic_index(np.s_[::-65536, 8000::-64], c.shape), limits=SMALL)
    want = expected(range(2 ** 21 - 1, -1, -65536), np.s_[8000::-64])
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
    got = read_index(c, basic_index(np.s_[2 ** 20 - 1::2 ** 22, 4095::2 ** 20], c.shape), limits=SMALL)
    assert got.shape == (1, 1) and got[0, 0] == row_values[0][0][4095]
    with pytest.raises(LimitExceeded):  # 2**15 x 128 selected elements: beyond both the budget and the allowance
        read_box(c, (0, 0), c.shape, steps=(64, 64), limits=SMALL)


def test_stepped_read_of_a_huge_overlay_applies_the_selected_corrections_only():
    """``[::2**19, ::2**19]`` (32 x 32) of a [2**24, 2**24] overlay: a broadcast base, a sparse
    correction whose entries off the progression are left out, a dense (broadcast) correction
    meeting 16 selected positions and one meeting none, whose buffer is empty and is not read.
    Read under a small budget its bounding box exceeds; equal to the stepped values, added in order."""
    side, step = 2 ** 24, 2 ** 19
    coords = [[0, 0], [step, 3 * step], [5, 7], [step + 1, step], [side - 1, side - 1]]
    sparse = hs.sparse_coo(coords, np.array([4.0, 8.0, 100.0, 200.0, 300.0], np.float32), (side, side))
    row = np.arange(64, dtype=np.float32) + 0.5
    dense = broadcast_rows(2 ** 23, row)
    missed = broadcast_rows(100, row)
    missed = hs.Tensor(missed.descriptor, (b"",))
    ov = hs.overlay(huge_broadcast(), [sparse, (dense, (2 ** 22 + 5, 3 * step - 7)), (missed, (1, 1))], "add")
    selection = basic_index(np.s_[::step, ::step], ov.shape)
    with pytest.raises(LimitExceeded):
        read_box(ov, selection.lo, selection.hi, limits=SMALL)
    got = read_index(ov, selection, limits=SMALL)
    want = np.full((32, 32), 1.5, np.float32)
    want[0, 0] += 4.0
    want[1, 3] += 8.0
    want[9:25, 3] += row[7]  # rows 9 * 2**19 .. 24 * 2**19 lie in [2**22 + 5, 3 * 2**22 + 5)
    assert got.shape == (32, 32) and got.tobytes() == want.tobytes()
    got = read_index(ov, basic_index(np.s_[side - step::-step, 3 * step::-step], ov.shape), limits=SMALL)
    assert got.tobytes() == want[::-1, 3::-1].tobytes()


def broadcast_quantized_rows(rows: int, row: np.ndarray) -> tuple[hs.Tensor, np.ndarray]:
    """(a [rows, len(row)] int4 per-block tensor, block axis 1, one block per row, every row of
    which stores the codes of ``row`` quantized (strides [0, 1] over one stored row:
    ``layouts/strided.md``) under the same scale; that row's reference decoding)."""
    one = hs.quantize(row.reshape(1, -1), "per_block", axis=1, block_size=row.size)
    codes = np.frombuffer(one.buffers[0], np.uint8)
    scales = np.frombuffer(np.tile(np.frombuffer(one.buffers[1], np.uint8), rows).tobytes(), np.uint8)
    desc = attrs.evolve(one.descriptor, shape=(rows, row.size), layout=StridedLayout((0, 1)),
                        buffers=(hs.BufferHandle(codes.size), hs.BufferHandle(scales.size)))
    return hs.Tensor(desc, [codes, scales]), reference_array(one)[0]


def test_stepped_quantized_read_decodes_the_selected_rows_only():
    """``[::64]`` (and ``[::64, 5::3]``) of a [2**20, 256] int4 per-block tensor (block axis 1; 2 MiB
    stored, 1 GiB decoded) decodes the 2**14 selected rows only: read under a small budget, where
    its bounding box (and a stepped box of 2**19 rows) is refused; along the block axis the
    whole blocks are decoded, then stepped."""
    row = np.random.default_rng(11).standard_normal(256).astype(np.float16)
    t, decoded_row = broadcast_quantized_rows(2 ** 20, row)
    with pytest.raises(LimitExceeded):
        read_box(t, (0, 0), t.shape, limits=SMALL)
    got = read_box(t, (0, 0), t.shape, steps=(64, 1), limits=SMALL)
    assert got.shape == (2 ** 14, 256) and got.tobytes() == np.broadcast_to(decoded_row, got.shape).tobytes()
    got = read_box(t, (3, 5), t.shape, steps=(64, 3), limits=SMALL)
    want = np.broadcast_to(decoded_row[5::3], (2 ** 14, len(range(5, 256, 3))))
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
    with pytest.raises(LimitExceeded):  # 2**19 selected rows: beyond both the budget and the allowance
        read_box(t, (0, 0), t.shape, steps=(2, 1), limits=SMALL)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_one_integer_index_selects_what_numpy_selects(shape, data):
    """A lone Python int (the most common index, which ``basic_index`` takes on a short path)
    selects NumPy's row, and refuses an out-of-range position as NumPy does."""
    array = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    tensor = hs.Tensor.from_numpy(array)
    position = data.draw(st.integers(-shape[0], shape[0] - 1))
    np.testing.assert_array_equal(tensor[position], array[position])
    assert np.asarray(tensor[position]).shape == array[position].shape
    with pytest.raises(IndexError):
        tensor[shape[0]]
