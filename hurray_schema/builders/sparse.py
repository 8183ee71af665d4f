"""Sparse tensors from index and value arrays: :func:`sparse_coo`, :func:`sparse_csr`,
:func:`sparse_csc` (``layouts/coo.md``, ``layouts/csr.md``, ``layouts/csc.md``) and
:func:`from_scipy` from ``scipy.sparse`` matrices."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..model import CooLayout, CscLayout, CsrLayout, ElementType, Shard, TensorDescriptor
from ..io.tensor import Tensor
from .common import checked, handle, little_endian

__all__ = ["sparse_coo", "sparse_csr", "sparse_csc", "from_scipy"]


def _values(values) -> tuple[ElementType, memoryview]:
    """(element type, packed bytes) of a 1-D value array, as :meth:`Tensor.from_numpy` stores it."""
    dense = Tensor.from_numpy(np.ascontiguousarray(np.asarray(values).reshape(-1)))
    return dense.type_tag, dense.buffers[0]


def _coordinates(indices, rank: int) -> np.ndarray:
    if isinstance(indices, tuple):
        indices = np.stack([np.asarray(i).reshape(-1) for i in indices], axis=1) if indices else np.zeros((0, rank))
    idx = np.asarray(indices)
    if idx.size == 0:
        return np.zeros((0, rank), np.int64)
    if idx.ndim != 2 or idx.shape[1] != rank or idx.dtype.kind not in "iu":
        raise HurraySchemaError(f"indices must be an integer (nnz, {rank}) array or a tuple of {rank} arrays")
    return idx.astype(np.int64)


def _linear(coords: np.ndarray, shape) -> np.ndarray:
    if coords.size and (coords.min() < 0 or np.any(coords.max(axis=0) >= np.asarray(shape, np.int64))):
        raise HurraySchemaError("a sparse index is out of bounds")
    return np.ravel_multi_index(tuple(coords.T), tuple(shape)) if coords.size else np.zeros(0, np.int64)


def sparse_coo(indices, values, shape: Sequence[int], *, sort: bool = True, name: Optional[str] = None,
               shard: Optional[Shard] = None) -> Tensor:
    """A COO tensor (``layouts/coo.md``): ``indices`` an integer ``(nnz, rank)`` array (or a tuple
    of ``rank`` coordinate arrays), ``values`` one per entry.  ``sort=True`` stores the entries in
    lexicographic order and sets ``is_sorted``; ``sort=False`` keeps their order (``is_sorted`` 0).
    A coordinate given twice is an error (``§ Validity Constraints``)."""
    shape = tuple(int(n) for n in shape)
    coords = _coordinates(indices, len(shape))
    vals = np.asarray(values).reshape(-1)
    if vals.size != coords.shape[0]:
        raise HurraySchemaError(f"{coords.shape[0]} coordinates but {vals.size} values")
    lin = _linear(coords, shape)
    order = np.argsort(lin, kind="stable")
    if lin.size > 1 and np.any(lin[order][1:] == lin[order][:-1]):
        raise HurraySchemaError("a sparse coordinate is given twice")
    if sort:
        coords, vals = coords[order], vals[order]
    tag, data = _values(vals)
    idx = little_endian(coords.astype(np.uint64), np.uint64)
    layout = CooLayout(nnz=int(coords.shape[0]), is_sorted=1 if sort else 0)
    desc = checked(TensorDescriptor(tag, shape, layout, (handle(len(data)), handle(idx.size)), shard=shard))
    return Tensor(desc, (data, idx), name=name)


def _compressed(values, indices, indptr, shape, major: int, layout_cls, name, shard) -> Tensor:
    shape = tuple(int(n) for n in shape)
    if len(shape) != 2:
        raise HurraySchemaError("CSR / CSC tensors are rank 2")
    ptr = np.asarray(indptr).astype(np.int64).reshape(-1)
    minor = np.asarray(indices).astype(np.int64).reshape(-1)
    vals = np.asarray(values).reshape(-1)
    nnz = minor.size
    if vals.size != nnz:
        raise HurraySchemaError(f"{nnz} indices but {vals.size} values")
    if ptr.size != shape[major] + 1 or ptr[0] != 0 or ptr[-1] != nnz or np.any(np.diff(ptr) < 0):
        raise HurraySchemaError(f"the pointer array must have {shape[major] + 1} non-decreasing entries "
                                f"from 0 to {nnz}")
    if nnz and (minor.min() < 0 or minor.max() >= shape[1 - major]):
        raise HurraySchemaError("a sparse index is out of bounds")
    majors = np.repeat(np.arange(shape[major], dtype=np.int64), np.diff(ptr))
    order = np.lexsort((minor, majors))  # within each row (column): strictly increasing (§ Validity)
    minor, vals, majors = minor[order], vals[order], majors[order]
    if nnz > 1 and np.any((majors[1:] == majors[:-1]) & (minor[1:] == minor[:-1])):
        raise HurraySchemaError("a sparse coordinate is given twice")
    tag, data = _values(vals)
    ind, pointers = little_endian(minor.astype(np.uint64), np.uint64), little_endian(ptr.astype(np.uint64), np.uint64)
    desc = checked(TensorDescriptor(tag, shape, layout_cls(nnz=nnz),
                                     (handle(len(data)), handle(ind.size), handle(pointers.size)), shard=shard))
    return Tensor(desc, (data, ind, pointers), name=name)


def sparse_csr(values, indices, indptr, shape: Sequence[int], *, name: Optional[str] = None,
               shard: Optional[Shard] = None) -> Tensor:
    """A CSR matrix (``layouts/csr.md``): row ``i`` holds ``values[indptr[i]:indptr[i+1]]`` at columns
    ``indices[...]`` (SciPy's arrays); columns are sorted within each row, a repeat is an error."""
    return _compressed(values, indices, indptr, shape, 0, CsrLayout, name, shard)


def sparse_csc(values, indices, indptr, shape: Sequence[int], *, name: Optional[str] = None,
               shard: Optional[Shard] = None) -> Tensor:
    """A CSC matrix (``layouts/csc.md``): column ``j`` holds ``values[indptr[j]:indptr[j+1]]`` at rows
    ``indices[...]``; rows are sorted within each column, a repeat is an error."""
    return _compressed(values, indices, indptr, shape, 1, CscLayout, name, shard)


def from_scipy(matrix, *, layout: Optional[str] = None, name: Optional[str] = None,
               shard: Optional[Shard] = None) -> Tensor:
    """A sparse tensor of a ``scipy.sparse`` matrix or array: COO, CSR and CSC keep their format
    (``layout`` -- "coo", "csr" or "csc" -- converts), any other format becomes CSR.  Duplicate
    entries are summed first, as SciPy's own conversions do."""
    try:
        from scipy import sparse
    except ImportError:  # pragma: no cover - SciPy is an optional dependency
        raise HurraySchemaError("from_scipy needs SciPy (pip install hurray_schema[scipy])") from None
    if not sparse.issparse(matrix):
        raise HurraySchemaError("from_scipy takes a scipy.sparse matrix or array")
    kind = (layout or matrix.format).lower()
    if kind not in ("coo", "csr", "csc"):
        kind = "csr"
    converted = matrix.asformat(kind, copy=True)
    converted.sum_duplicates()
    if kind == "coo":
        return sparse_coo(tuple(converted.coords), converted.data, converted.shape, name=name, shard=shard)
    build = sparse_csr if kind == "csr" else sparse_csc
    return build(converted.data, converted.indices, converted.indptr, converted.shape, name=name, shard=shard)
