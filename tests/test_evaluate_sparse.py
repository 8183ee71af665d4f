"""Sparse layouts densified: COO (sorted / unsorted), CSR, CSC, CSF (any mode_order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.evaluate_reference import coo_tensor, csr_tensor, handles
from hurray_schema.errors import HurraySchemaError
from hurray_schema.evaluate import tensor_to_numpy
from hurray_schema.model import CscLayout, CsfLayout, CsrLayout, ElementType, TensorDescriptor

E = ElementType


def make(tag, shape, layout, arrays):
    bufs = [np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8) for a in arrays]
    return TensorDescriptor(tag, shape, layout, handles(bufs)), [memoryview(b) for b in bufs]


def test_coo_spec_example():
    """layouts/coo.md § Example."""
    t = coo_tensor([[0, 1], [2, 0], [3, 3]], [1.5, -0.5, 2.0], (4, 4), E.FLOAT32)
    ref = np.zeros((4, 4), np.float32)
    ref[0, 1], ref[2, 0], ref[3, 3] = 1.5, -0.5, 2.0
    assert np.array_equal(tensor_to_numpy(t.descriptor, t.buffers), ref)


def test_coo_unsorted():
    t = coo_tensor([[3, 3], [0, 1], [2, 0]], [2.0, 1.5, -0.5], (4, 4), E.FLOAT16, sorted_=False)
    got = tensor_to_numpy(t.descriptor, t.buffers)
    assert got.dtype == np.float16 and got[3, 3] == 2.0 and got[0, 1] == 1.5 and got[2, 0] == -0.5
    assert np.count_nonzero(got) == 3


def test_coo_sorted_flag_checked():
    t = coo_tensor([[3, 3], [0, 1]], [2.0, 1.5], (4, 4), E.FLOAT32, sorted_=True)
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(t.descriptor, t.buffers)


def test_coo_duplicates_and_bounds_rejected():
    dup = coo_tensor([[1, 1], [1, 1]], [1.0, 2.0], (4, 4), E.FLOAT32, sorted_=False)
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(dup.descriptor, dup.buffers)
    oob = coo_tensor([[4, 0]], [1.0], (4, 4), E.FLOAT32)
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(oob.descriptor, oob.buffers)


def test_coo_empty():
    t = coo_tensor(np.zeros((0, 2)), np.zeros(0), (3, 5), E.INT32)
    got = tensor_to_numpy(t.descriptor, t.buffers)
    assert got.shape == (3, 5) and got.dtype == np.int32 and not got.any()


CSR_DENSE = np.array([[1, 0, 0, 2, 0], [0, 0, 3, 0, 0], [0, 4, 0, 0, 5], [0, 0, 0, 0, 0]], np.float32)


def test_csr_spec_example():
    """layouts/csr.md § Example."""
    d, b = make(E.FLOAT32, (4, 5), CsrLayout(5), [np.array([1, 2, 3, 4, 5], np.float32),
                                                 np.array([0, 3, 2, 1, 4], np.uint64),
                                                 np.array([0, 2, 3, 5, 5], np.uint64)])
    assert np.array_equal(tensor_to_numpy(d, b), CSR_DENSE)


def test_csc_spec_example():
    """layouts/csc.md § Example (the same matrix)."""
    d, b = make(E.FLOAT32, (4, 5), CscLayout(5), [np.array([1, 4, 3, 2, 5], np.float32),
                                                 np.array([0, 2, 1, 0, 2], np.uint64),
                                                 np.array([0, 1, 2, 3, 4, 5], np.uint64)])
    assert np.array_equal(tensor_to_numpy(d, b), CSR_DENSE)


def test_csr_bad_pointer_rejected():
    d, b = make(E.FLOAT32, (4, 5), CsrLayout(5), [np.array([1, 2, 3, 4, 5], np.float32),
                                                 np.array([0, 3, 2, 1, 4], np.uint64),
                                                 np.array([0, 3, 2, 5, 5], np.uint64)])
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, b)


def test_csf_spec_example():
    """layouts/csf.md § Example: [2, 3, 4], 4 non-zeros, identity mode order."""
    arrays = [np.array([1, 2, 3, 4], np.float32),
              np.array([0, 2], np.uint64), np.array([0, 1], np.uint64),
              np.array([0, 2, 3], np.uint64), np.array([0, 2, 1], np.uint64),
              np.array([0, 1, 2, 4], np.uint64), np.array([1, 3, 0, 2], np.uint64)]
    d, b = make(E.FLOAT32, (2, 3, 4), CsfLayout(4, (0, 1, 2)), arrays)
    ref = np.zeros((2, 3, 4), np.float32)
    ref[0, 0, 1], ref[0, 2, 3], ref[1, 1, 0], ref[1, 1, 2] = 1, 2, 3, 4
    assert np.array_equal(tensor_to_numpy(d, b), ref)


def csf_encode(dense, order):
    """CSF buffers of ``dense`` with levels in ``order`` (reference encoder, vectorized)."""
    perm = np.transpose(dense, order)
    coords = np.argwhere(perm != 0)  # lexicographic in storage order
    values = perm[tuple(coords.T)]
    arrays = [values]
    nnz, rank = coords.shape
    parent_count = 1
    parent_of = np.zeros(nnz, np.int64)
    for level in range(rank):
        keys = coords[:, :level + 1]
        _, first = np.unique(keys, axis=0, return_index=True)
        first = np.sort(first)
        node_parent = parent_of[first]
        pos = np.concatenate([[0], np.cumsum(np.bincount(node_parent, minlength=parent_count))]).astype(np.uint64)
        arrays += [pos, coords[first, level].astype(np.uint64)]
        node_id = np.cumsum(np.isin(np.arange(nnz), first)) - 1
        parent_of = node_id
        parent_count = first.size
    return values.size, arrays


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=3, max_size=4), data=st.data())
def test_csf_random_mode_orders(shape, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    dense = (rng.random(shape) < 0.3) * rng.integers(1, 9, size=shape).astype(np.float32)
    order = data.draw(st.permutations(range(len(shape))))
    nnz, arrays = csf_encode(dense.astype(np.float32), order)
    d, b = make(E.FLOAT32, tuple(shape), CsfLayout(nnz, tuple(order)), arrays)
    assert np.array_equal(tensor_to_numpy(d, b), dense)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 6), seed=st.integers(0, 1000))
def test_csr_and_coo_random(rows, cols, seed):
    rng = np.random.default_rng(seed)
    dense = ((rng.random((rows, cols)) < 0.4) * rng.standard_normal((rows, cols))).astype(np.float32)
    t = csr_tensor(dense, E.FLOAT32)
    assert np.array_equal(tensor_to_numpy(t.descriptor, t.buffers), dense)
    coords = np.argwhere(dense != 0)
    perm = rng.permutation(len(coords))
    t = coo_tensor(coords[perm], dense[tuple(coords[perm].T)], (rows, cols), E.FLOAT32, sorted_=False)
    assert np.array_equal(tensor_to_numpy(t.descriptor, t.buffers), dense)


def _linear_or_error(t, offset, head_shape):
    from hurray_schema.evaluate.sparse import sparse_linear

    try:
        lin, values = sparse_linear(t.descriptor, t.buffers, None, offset, head_shape)
    except HurraySchemaError as exc:
        return str(exc)
    return lin.tolist(), values.tolist()


@settings(max_examples=60, deadline=None)
@given(rank=st.integers(1, 3), data=st.data())
def test_coo_linear_indices_numpy_and_kernel_agree(rank, data):
    """The COO linearization of an overlay's patch (sparse_linear) gives the same indices, or the same
    first fault in storage order (out of bounds, not sorted), through NumPy (a process whose kernel
    cache lacks the kernel) and through the kernels (rank 2 and any rank)."""
    from hurray_schema.evaluate import sparse

    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    nnz = data.draw(st.integers(0, 12))
    coords = data.draw(st.lists(st.tuples(*[st.integers(0, n) for n in shape]), min_size=nnz, max_size=nnz))
    sorted_flag = data.draw(st.booleans())
    if sorted_flag and data.draw(st.booleans()):
        coords = sorted(set(coords))  # mostly valid sorted inputs, some faulty ones
    offset = tuple(data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank)))
    head_shape = tuple(n + 3 for n in shape)
    t = coo_tensor(np.asarray(coords, np.uint64).reshape(-1, rank), np.arange(len(coords), dtype=np.float32),
                   shape, E.FLOAT32, sorted_=sorted_flag)
    results = {}
    for path, kernel_at_hand in (("numpy", False), ("kernel", True)):
        with pytest.MonkeyPatch.context() as patch:
            for kernel in (sparse._coo_linear_2d, sparse._coo_linear):
                patch.setattr(kernel, "worth_it", lambda work, compile_after, index=0, at_hand=kernel_at_hand: at_hand)
            results[path] = _linear_or_error(t, offset, head_shape)
    assert results["numpy"] == results["kernel"]
    if not isinstance(results["kernel"], str):
        expected = [sum((c + o) * int(np.prod(head_shape[d + 1:])) for d, (c, o) in enumerate(zip(entry, offset)))
                    for entry in coords]
        assert results["kernel"][0] == expected
