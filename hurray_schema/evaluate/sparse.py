"""Sparse layouts: stored entries (logical coordinates + values) and densification.

COO (``layouts/coo.md § Storage Order``), CSR (``layouts/csr.md § Row Iteration``), CSC
(``layouts/csc.md § Column Iteration``) and CSF (``layouts/csf.md § Iteration``, any
``mode_order``).  Unstored coordinates are zero (``layouts/coo.md § Element Lookup``).
Coordinates are bound-checked before use; duplicate coordinates are rejected
(``layouts/coo.md § Validity Constraints``).  :func:`densify` charges its output against
the evaluation budget before reading a coordinate (:mod:`hurray_schema.evaluate.common`).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import HurraySchemaError
from ..limits import resolve_limits
from ..model import CooLayout, CscLayout, CsfLayout, CsrLayout, ElementType
from ..structs.element_types import element_type_info
from .common import (as_bytes, as_evaluated, charge, check_representable, check_shape, decode_target, new_array,
                     tensor_stored_bytes)
from . import jit
from .elements import CODE_VIEW_TYPES, UnsupportedEvaluation, gather_codes, numpy_dtype
from .dequantize import OUT_BF16, OUT_F16, OUT_F32, decode_gather, param_indices_at, quant_params

__all__ = ["sparse_entries", "sparse_linear", "densify", "linear_indices", "entry_values"]


def _u64(buffers, index, count, what) -> np.ndarray:
    if index >= len(buffers):
        raise HurraySchemaError(f"{what}: buffer {index} is missing")
    buf = as_bytes(buffers[index])
    if count < 0 or buf.size < count * 8:
        raise HurraySchemaError(f"{what}: needs {count * 8} bytes, buffer {index} has {buf.size}")
    return np.frombuffer(buf, "<u8", count)


def _check_ptr(ptr, n_children, what):
    if ptr.size == 0 or ptr[0] != 0 or ptr[-1] != n_children or np.any(ptr[1:] < ptr[:-1]):
        raise HurraySchemaError(f"{what} must start at 0, be non-decreasing and end at {n_children}")


def _bounded(coord_u64, bound, what) -> np.ndarray:
    if coord_u64.size and coord_u64.max() >= np.uint64(bound):
        raise HurraySchemaError(f"{what}: coordinate out of bounds (>= {bound})")
    return coord_u64.astype(np.int64)


def _coordinates(desc, buffers) -> np.ndarray:
    """(nnz, rank) int64 logical coordinates, in storage order."""
    layout, shape = desc.layout, check_shape(desc.shape)
    rank, nnz = len(shape), int(layout.nnz)
    if isinstance(layout, CooLayout):
        if rank == 0:
            raise HurraySchemaError("COO needs rank >= 1")
        idx = _u64(buffers, 1, nnz * rank, "COO indices").reshape(nnz, rank)
        return np.stack([_bounded(idx[:, d], shape[d], "COO indices") for d in range(rank)], axis=1) \
            if nnz else np.zeros((0, rank), np.int64)
    if isinstance(layout, (CsrLayout, CscLayout)):
        if rank != 2:
            raise HurraySchemaError("CSR/CSC need rank 2")
        major = 0 if isinstance(layout, CsrLayout) else 1
        minor = _bounded(_u64(buffers, 1, nnz, "minor indices"), shape[1 - major], "minor indices")
        ptr = _u64(buffers, 2, shape[major] + 1, "pointer array").astype(np.int64)
        _check_ptr(ptr, nnz, "pointer array")
        majors = np.repeat(np.arange(shape[major], dtype=np.int64), np.diff(ptr))
        return np.stack([majors, minor] if major == 0 else [minor, majors], axis=1)
    if isinstance(layout, CsfLayout):
        order = tuple(int(m) for m in layout.mode_order)
        if rank < 3 or sorted(order) != list(range(rank)):
            raise HurraySchemaError("CSF needs rank >= 3 and mode_order a permutation of 0..rank-1")
        parents, crds, n_prev = [], [], 1
        for level in range(rank):
            pos = _u64(buffers, 2 * level + 1, n_prev + 1, f"CSF pos_{level}").astype(np.int64)
            n_here = int(pos[-1]) if pos.size else 0
            if n_here < 0 or n_here > (1 << 40):
                raise HurraySchemaError(f"CSF pos_{level} ends at an impossible count")
            _check_ptr(pos, n_here, f"CSF pos_{level}")
            crd = _bounded(_u64(buffers, 2 * level + 2, n_here, f"CSF crd_{level}"), shape[order[level]],
                           f"CSF crd_{level}")
            parents.append(np.repeat(np.arange(n_prev, dtype=np.int64), np.diff(pos)))
            crds.append(crd)
            n_prev = n_here
        if n_prev != nnz:
            raise HurraySchemaError(f"CSF leaf level holds {n_prev} entries, nnz is {nnz}")
        coords = np.empty((nnz, rank), np.int64)
        node = np.arange(nnz, dtype=np.int64)
        for level in range(rank - 1, -1, -1):
            coords[:, order[level]] = crds[level][node]
            node = parents[level][node]
        return coords
    raise UnsupportedEvaluation(f"layout 0x{int(layout.tag):02X} is not sparse")


def linear_indices(coords: np.ndarray, shape) -> np.ndarray:
    """Row-major linear index of each coordinate row."""
    lin = np.zeros(coords.shape[0], np.int64)
    for d, n in enumerate(shape):
        lin = lin * np.int64(n) + coords[:, d]
    return lin


def _values(desc, buffers, coords, target, positions=None) -> np.ndarray:
    """Values of the stored entries (all, or those at storage ``positions``), decoded to ``target``;
    ``coords`` are the entries' logical coordinates (used by a quantized tensor's parameters)."""
    nnz = int(desc.layout.nnz)
    info = element_type_info(desc.type_tag)
    if info is None or desc.type_tag == ElementType.FLOAT128:
        raise UnsupportedEvaluation(f"element type 0x{int(desc.type_tag):02X} is not evaluated here")
    out_dtype = numpy_dtype(target)
    if nnz == 0:
        return np.zeros(0, out_dtype)
    if not buffers:
        raise HurraySchemaError("a sparse tensor needs its values buffer")
    buf = as_bytes(buffers[0])
    bits = info.bit_width
    need = info.buffer_bytes(nnz)
    if buf.size < need:
        raise HurraySchemaError(f"values: needs {need} bytes, buffer 0 has {buf.size}")
    entries = np.arange(nnz, dtype=np.int64) if positions is None else np.asarray(positions, np.int64)
    count = entries.size
    if desc.quantization is not None:
        p = quant_params(desc, buffers)
        pidx = param_indices_at(p, desc.shape, coords)
        if pidx.size and (pidx.max() >= p.scales.size or (p.zps.size > 1 and pidx.max() >= p.zps.size)):
            raise HurraySchemaError("quantization parameter buffer is too short for the tensor")
        work = np.dtype(np.float32) if target in (ElementType.FLOAT32, ElementType.FLOAT64) else out_dtype
        out = np.empty(count, work)
        kind = OUT_F32 if work == np.float32 else (OUT_F16 if target == ElementType.FLOAT16 else OUT_BF16)
        decode_gather(buf, np.int64(0), entries, pidx, p.valmode, p.bits, p.signed, p.table,
                      p.scales, p.zps, kind, out if kind == OUT_F32 else out.view(np.uint16))
        return out.astype(out_dtype, copy=False)
    if bits >= 8 and desc.type_tag not in CODE_VIEW_TYPES:
        values = np.frombuffer(buf, out_dtype, nnz)
        return values if positions is None else values[entries]
    out = np.empty(count, out_dtype)
    gather_codes(buf, np.int64(0), entries, np.int64(bits), out.view(np.uint8))
    return out


def entry_values(desc, buffers, positions, coords, target) -> np.ndarray:
    """Values of the entries at storage ``positions`` (int64) of a sparse tensor ``desc`` (already
    ``as_evaluated``), whose logical coordinates are ``coords`` ((n, rank) int64), decoded to
    ``target``: only those entries' values (and quantization parameters) are read."""
    return _values(desc, buffers, coords, target, positions)


def sparse_entries(desc, buffers, target=None, *, check_duplicates=True) -> tuple[np.ndarray, np.ndarray]:
    """(coords (nnz, rank) int64, values (nnz,) decoded to ``target``) in storage order."""
    desc = as_evaluated(desc)
    target = decode_target(desc, target)
    coords = _coordinates(desc, buffers)
    if check_duplicates and coords.shape[0] > 1:
        lin = linear_indices(coords, desc.shape)
        sorted_ok = isinstance(desc.layout, CooLayout) and desc.layout.is_sorted == 1
        if sorted_ok:
            if np.any(lin[1:] <= lin[:-1]):
                raise HurraySchemaError("COO marked sorted is not in strictly increasing lexicographic order")
        elif np.unique(lin).size != lin.size:
            raise HurraySchemaError("sparse tensor stores the same coordinate twice")
    return coords, _values(desc, buffers, coords, target)


@jit.kernel("i64(u64[:], i64, i64[:], i64[:], i64[:], i64, i64[:])")
def _coo_linear(idx, rank, mshape, offset, hshape, check_sorted, lin):
    """Head-space row-major linear index of every COO entry into ``lin``; returns 0, or 1 for a coordinate
    out of bounds, 2 for entries not strictly sorted."""
    nnz = idx.size // rank
    prev = np.int64(-1)
    for k in range(nnz):
        ml = np.int64(0)
        hl = np.int64(0)
        for d in range(rank):
            c = idx[k * rank + d]
            if c >= np.uint64(mshape[d]):
                return 1
            ci = np.int64(c)
            ml = ml * mshape[d] + ci
            hl = hl * hshape[d] + ci + offset[d]
        if check_sorted and ml <= prev:
            return 2
        prev = ml
        lin[k] = hl
    return 0


@jit.kernel("i64(u64[:], i64[:], i64[:], i64[:], i64, i64[:])")
def _coo_linear_2d(idx, mshape, offset, hshape, check_sorted, lin):
    """:func:`_coo_linear` for rank 2 (matrices), with the dimension loop written out."""
    nnz = idx.size // 2
    m0, m1 = np.uint64(mshape[0]), np.uint64(mshape[1])
    h1 = hshape[1]
    base = offset[0] * h1 + offset[1]
    prev = np.int64(-1)
    for k in range(nnz):
        c0, c1 = idx[2 * k], idx[2 * k + 1]
        if c0 >= m0 or c1 >= m1:
            return 1
        ml = np.int64(c0 * m1 + c1)
        if check_sorted and ml <= prev:
            return 2
        prev = ml
        lin[k] = np.int64(c0) * h1 + np.int64(c1) + base
    return 0


COO_COMPILE_ENTRIES = 1 << 22
"""COO entries linearized by NumPy (:func:`_coo_linear_numpy`) in a process before the kernels
(:func:`_coo_linear_2d`, :func:`_coo_linear`) are compiled, while the kernel cache does not hold them
(:meth:`.jit.Kernel.worth_it`)."""


def _coo_linear_numpy(idx, rank, mshape, offset, hshape, check_sorted, lin) -> int:
    """What :func:`_coo_linear` returns and writes, with NumPy: the first fault in storage order wins (a
    coordinate out of bounds at entry k, entries before it not sorted).  Coordinates within the bounds
    are read as int64 in place."""
    coords = idx.reshape(-1, rank)
    outside = coords[:, 0] >= np.uint64(mshape[0])
    for d in range(1, rank):
        outside |= coords[:, d] >= np.uint64(mshape[d])
    first_outside = int(outside.argmax()) if outside.any() else coords.shape[0]
    if check_sorted and first_outside > 1:
        member = linear_indices(coords[:first_outside].view(np.int64), mshape)
        if np.any(member[1:] <= member[:-1]):
            return 2
    if first_outside < coords.shape[0]:
        return 1
    lin[:] = linear_indices(coords.view(np.int64) + offset, hshape)
    return 0


def sparse_linear(desc, buffers, target, offset, head_shape) -> tuple[np.ndarray, np.ndarray]:
    """(row-major linear index in ``head_shape`` of every stored entry shifted by ``offset``, values)."""
    desc = as_evaluated(desc)
    shape = check_shape(desc.shape)
    if isinstance(desc.layout, CooLayout) and desc.quantization is None and len(shape) >= 1:
        target = decode_target(desc, target)
        rank, nnz = len(shape), int(desc.layout.nnz)
        idx = _u64(buffers, 1, nnz * rank, "COO indices")
        sorted_flag = desc.layout.is_sorted == 1
        lin = np.empty(nnz, np.int64)
        args = (np.ascontiguousarray(idx), np.asarray(shape, np.int64), np.asarray(offset, np.int64),
                np.asarray(head_shape, np.int64), int(sorted_flag), lin)
        kernel = _coo_linear_2d if rank == 2 else _coo_linear
        if not kernel.worth_it(nnz, COO_COMPILE_ENTRIES):
            err = _coo_linear_numpy(args[0], rank, *args[1:])
        elif rank == 2:
            err = _coo_linear_2d(*args)
        else:
            err = _coo_linear(args[0], rank, *args[1:])
        if err == 1:
            raise HurraySchemaError("COO indices: coordinate out of bounds")
        if err == 2:
            raise HurraySchemaError("COO marked sorted is not in strictly increasing lexicographic order")
        if not sorted_flag and nnz > 1 and np.unique(lin).size != nnz:
            raise HurraySchemaError("sparse tensor stores the same coordinate twice")
        return lin, _values(desc, buffers, None, target)
    coords, values = sparse_entries(desc, buffers, target)
    return linear_indices(coords + np.asarray(offset, np.int64), head_shape), values


def densify(desc, buffers, target=None, *, limits=None) -> np.ndarray:
    """Dense logical array of a sparse tensor; unstored elements are zero.

    The dense array's bytes are charged against ``limits`` (``None``: the default limits) and the
    bytes of ``buffers`` before anything is read or allocated: :class:`LimitExceeded` if they exceed
    both the budget and the expansion allowance (:mod:`hurray_schema.evaluate.common`).
    """
    desc = as_evaluated(desc)
    target = decode_target(desc, target)
    shape = check_shape(desc.shape)
    dtype = numpy_dtype(target)
    charge(math.prod(shape) * dtype.itemsize, resolve_limits(limits), stored=tensor_stored_bytes(buffers))
    check_representable(shape, dtype)
    coords, values = sparse_entries(desc, buffers, target)
    out = new_array(shape, dtype, zeros=True)
    if values.size:
        out[tuple(coords.T)] = values
    return out
