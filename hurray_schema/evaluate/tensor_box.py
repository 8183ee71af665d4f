"""One box of one (non-composite) tensor's logical array, reading only what the box needs.

:func:`tensor_box` returns the elements ``lo[d] <= i[d] < hi[d]`` of a tensor in its decoded
type, as a C-ordered array, bit for bit what :func:`.tensor.tensor_to_numpy` gives sliced:

* row-major, column-major and strided tensors (``layouts/strided.md § Element Address``) of
  a whole-byte type NumPy holds natively: a read-only view of buffer 0 over the box (copied,
  box-sized, only when the view is not C-contiguous);
* the same layouts with sub-byte or narrow-float codes: the codes of the box's elements only;
* quantized tensors on those layouts: the codes of the box widened to whole quantization
  blocks along the block axis (``quantization/per-block-affine.md § Block Layout``), with the
  parameters of those blocks (channels) only, decoded by the row kernels; when the box does
  not start on a byte of buffer 0 (sub-byte codes), its elements are gathered one by one;
* COO (``layouts/coo.md``): a sorted COO reads the entries whose first coordinate lies in the
  box (found by bisection), an unsorted one scans every coordinate; CSR / CSC
  (``layouts/csr.md § Row Iteration``, ``layouts/csc.md § Column Iteration``) read the pointer
  entries and entries of the box's rows / columns only; values are read for the entries in
  the box only; CSF decodes its entries whole, then keeps those in the box;
* tiled, Morton, Hilbert, block-paged and rank-0 tensors are decoded whole
  (:func:`.tensor.tensor_to_numpy`, which charges the whole decode), then sliced.

**Stepped boxes** (``steps``: per dimension only the positions ``lo, lo + step, ...`` below
``hi``): unquantized row-major, column-major and strided tensors read the selected elements
alone -- a whole-byte type NumPy holds natively as a read-only view of buffer 0 whose strides
are the layout's times the steps (not C-contiguous; charged for the selected elements, as the
unit-step view is), sub-byte and narrow-float codes by gathering the selected codes only.
Quantized tensors on those layouts decode a window holding only the selected positions along every
dimension but the quantization block axis (per-block affine, NF4, MXFP), whose codes are the
layout's strides times the steps apart, with the parameters of those positions only; along the
block axis the window keeps whole blocks (unit step) and every ``step``-th element of it is kept
after the decode (charged for the decoded window plus the stepped box).  A gathered quantized box,
and every other tensor (sparse, tiled, Morton, Hilbert, block-paged), reads the unit-step box as
above, with the same budget, and keeps every ``step``-th element of it.

What is read is checked as the whole decode checks it (buffer bounds, coordinate bounds,
pointer order, duplicates, sort order); entries and codes outside the box are not read, so a
fault there is not seen.

**Evaluation budget** (the rule: :mod:`.common`): before allocating, the box's array is
charged against ``limits`` and the bytes of the tensor's buffers, plus the tables its decode
builds (:func:`.tensor.decode_cost` of the decoded window; 16 bytes per element for a gathered
quantized box) -- never the whole tensor's size (but for the layouts decoded whole).  The
whole shape is not bounded by ``dense.MAX_ELEMENTS``: only the box is.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..limits import Limits, resolve_limits
from ..model import DYNAMIC_DIMENSION, CooLayout, CscLayout, CsrLayout, ElementType, LayoutTag, Mxfp, Nf4, PerBlockAffine
from ..structs.element_types import element_type_info
from . import jit
from . import tensor as tensor_module
from .common import (OFFSET_BYTES, SPARSE_TAGS, as_bytes, as_evaluated, charge, check_representable, check_shape,
                     decode_target, new_array, tensor_stored_bytes)
from .dense import affine_strides
from .dequantize import (OUT_BF16, OUT_F16, OUT_F32, PK_BLOCK, PK_CHANNEL, PK_TENSOR, QuantParams, decode_gather,
                         decode_rows, decode_rows_lut, int4_vector_ok, param_byte_spans, quant_params, storage_shape)
from .elements import CODE_VIEW_TYPES, UnsupportedEvaluation, gather_codes, numpy_dtype
from .sparse import _u64, entry_values, linear_indices, sparse_entries
from .tensor import (_affine_offsets, _check_bounds, _check_quant_axis, _decode_int4, _element_range, _owned,
                     _precheck_dense, decode_cost, tensor_to_numpy)

__all__ = ["tensor_box", "box_byte_spans", "sparse_box_entries", "resolved_shape", "check_box", "check_steps", "step_through",
           "stepped_extent"]


# ------------------------------------------------------------------------------------
# Shapes and boxes
# ------------------------------------------------------------------------------------


def resolved_shape(shape) -> tuple[int, ...]:
    """``shape`` as ints, refused if a dimension is dynamic (the element count is not bounded here)."""
    shape = tuple(map(int, shape))
    if DYNAMIC_DIMENSION in shape:
        raise HurraySchemaError("a dynamic dimension must be resolved before the tensor is evaluated")
    return shape


def _box_slices(lo, hi):
    """Index of a box; the trailing ``...`` keeps a rank-0 box a (0-d) view."""
    return tuple(slice(a, b) for a, b in zip(lo, hi)) + (Ellipsis,)


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous (a copy only if it is not), keeping its shape."""
    return np.asarray(a, order="C")


def check_box(lo, hi, shape) -> None:
    """Refuse (:class:`HurraySchemaError`) a box whose rank differs from the shape's or that leaves it."""
    if not len(lo) == len(hi) == len(shape):
        raise HurraySchemaError(f"a box of a rank-{len(shape)} array needs {len(shape)} bounds per side")
    for start, stop, size in zip(lo, hi, shape):
        if not 0 <= start <= stop <= size:
            raise HurraySchemaError(f"box [{tuple(lo)}, {tuple(hi)}) lies outside shape {tuple(shape)}")


def check_steps(steps, rank: int) -> Optional[tuple[int, ...]]:
    """``steps`` as positive ints, one per dimension; ``None`` when absent or all 1 (a unit-step
    box).  Anything else is refused (:class:`HurraySchemaError`)."""
    if steps is None:
        return None
    steps = tuple(map(int, steps))
    if len(steps) != rank:
        raise HurraySchemaError(f"a box of a rank-{rank} array needs {rank} steps, {len(steps)} given")
    if rank and min(steps) < 1:
        raise HurraySchemaError(f"box steps {steps} must be positive")
    return None if steps.count(1) == rank else steps


def step_through(box: np.ndarray, steps: Optional[tuple[int, ...]]) -> np.ndarray:
    """Every ``steps[d]``-th element of the box's array ``box`` from its first (a view)."""
    if steps is None:
        return box
    return box[tuple(slice(None, None, step) for step in steps) + (Ellipsis,)]


def stepped_extent(lo, hi, steps) -> tuple[int, ...]:
    """The shape of the stepped box: how many positions ``lo, lo + step, ...`` lie below ``hi``
    per dimension (``steps`` None: all 1)."""
    if steps is None:
        return tuple(b - a for a, b in zip(lo, hi))
    return tuple(len(range(a, b, step)) for a, b, step in zip(lo, hi, steps))


AFFINE_TAGS = (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.STRIDED)


def _reads_steps_alone(desc) -> bool:
    """Whether a stepped box of ``desc`` is read at the selected positions (all of them, or all but
    those along a quantization block axis) rather than stepped through after a unit-step read
    (module docstring)."""
    return desc.layout.tag in AFFINE_TAGS


# ------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------


def tensor_box(desc, buffers: Sequence, lo: Sequence[int], hi: Sequence[int], target=None, *,
               steps: Optional[Sequence[int]] = None, limits: Optional[Limits] = None) -> np.ndarray:
    """The box ``[lo, hi)`` of the tensor ``desc`` / ``buffers``, decoded to ``target`` (an
    :class:`ElementType`, default its decoded type; as :func:`.tensor.tensor_to_numpy` takes it),
    reading only what the box needs (module docstring).  The result may be a read-only view of
    buffer 0.

    ``steps`` (positive ints, one per dimension; ``None``: all 1) keeps every ``steps[d]``-th
    position from ``lo[d]``: the result is the whole decode sliced ``lo:hi:steps``, C-ordered
    for unit steps, else possibly a strided view (module docstring: *Stepped boxes*)."""
    if desc.layout.tag == LayoutTag.COMPOSITE:
        raise HurraySchemaError("a composite head has no data; use materialize()")
    limits = resolve_limits(limits)
    desc = as_evaluated(desc)
    shape = resolved_shape(desc.shape)
    lo, hi = tuple(map(int, lo)), tuple(map(int, hi))
    check_box(lo, hi, shape)
    steps = check_steps(steps, len(shape))
    if steps is not None and not _reads_steps_alone(desc):
        return step_through(tensor_box(desc, buffers, lo, hi, target, limits=limits), steps)
    box = check_shape(stepped_extent(lo, hi, steps))
    _check_quant_axis(desc)
    target = decode_target(desc, target)
    out_dtype = numpy_dtype(target)
    if desc.layout.tag in SPARSE_TAGS:
        return _sparse_box(desc, buffers, lo, hi, box, target, out_dtype, limits)
    strides = affine_strides(desc.layout, storage_shape(desc)) if shape else None
    if strides is None:
        return _whole_then_box(desc, buffers, lo, hi, box, target, out_dtype, limits)
    return _affine_box(desc, buffers, shape, strides, lo, hi, box, target, out_dtype, limits, steps)


def _whole_then_box(desc, buffers, lo, hi, box, target, out_dtype, limits) -> np.ndarray:
    """Layouts addressed through an offset table of the whole tensor: decoded whole, then sliced."""
    whole = tensor_to_numpy(desc, buffers, target, limits=limits)
    if whole.shape == box:
        return whole
    charge(math.prod(box) * out_dtype.itemsize, limits, stored=tensor_stored_bytes(buffers))
    return np.array(whole[_box_slices(lo, hi)], order="C")


# ------------------------------------------------------------------------------------
# Affine layouts
# ------------------------------------------------------------------------------------


def _byte_shift(origin: int, bits: int) -> Optional[int]:
    """Bytes from the tensor's first code to element ``origin``, if that element starts a byte
    (a 6-bit code starts one at every fourth element: ``element-types.md``), else ``None``."""
    if bits >= 8:
        return origin * (bits // 8)
    if bits == 6:
        return (origin // 4) * 3 if origin % 4 == 0 else None
    return (origin * bits) // 8 if (origin * bits) % 8 == 0 else None


def _affine_box(desc, buffers, shape, strides, lo, hi, box, target, out_dtype, limits, steps=None) -> np.ndarray:
    """An affine box; ``box`` its (stepped) shape.  The selected elements of an unquantized tensor
    are ``steps`` times the layout's strides apart; a quantized one is read by :func:`_quantized_box`."""
    info = element_type_info(desc.type_tag)
    if info is None or desc.type_tag == ElementType.FLOAT128:
        raise UnsupportedEvaluation(f"element type 0x{int(desc.type_tag):02X} is not evaluated here")
    stored = tensor_stored_bytes(buffers)
    bits = info.bit_width
    native = desc.quantization is None and bits >= 8 and desc.type_tag not in CODE_VIEW_TYPES
    if native:
        charge(math.prod(box) * out_dtype.itemsize, limits, stored=stored)
    elif desc.quantization is None:
        charge(decode_cost(desc, box, out_dtype, target), limits, stored=stored)
    check_representable(box, out_dtype)
    buf = as_bytes(buffers[0]) if buffers else None
    _precheck_dense(desc, buffers, shape, None if buf is None else buf.size)
    if 0 in box or 0 in shape:
        return new_array(box, out_dtype, zeros=True)
    if buf is None:
        raise HurraySchemaError("a dense tensor needs buffer 0")
    _check_bounds(desc.byte_offset, bits, *_element_range(strides, None, shape), buf.size)
    origin = sum(a * s for a, s in zip(lo, strides))
    apart = strides if steps is None else tuple(s * step for s, step in zip(strides, steps))
    if native:
        width = bits // 8
        view = np.ndarray(box, out_dtype, buffer=buf, offset=desc.byte_offset + origin * width,
                          strides=tuple(s * width for s in apart))
        return _c_order(view) if steps is None else view
    if desc.quantization is None:
        out = new_array(box, out_dtype)
        codes = out.reshape(-1).view(np.uint8)
        gather_codes(buf, np.int64(desc.byte_offset), _owned(origin + _affine_offsets(apart, box)), np.int64(bits),
                     codes)
        if desc.type_tag == ElementType.BOOL:
            np.minimum(codes, 1, out=codes)  # as the whole decode keeps bool items canonical
        return out
    return _quantized_box(desc, buffers, buf, shape, strides, lo, hi, box, target, out_dtype, limits, stored, steps)


def _kernel_kind(target) -> int:
    return {ElementType.FLOAT16: OUT_F16, ElementType.BFLOAT16: OUT_BF16}.get(target, OUT_F32)


def _work_array(shape, target, out_dtype):
    """(array the kernels write, its kernel view): float32 for a float32 / float64 target."""
    work = new_array(shape, np.float32 if _kernel_kind(target) == OUT_F32 else out_dtype)
    flat = work.reshape(-1)
    return work, (flat if _kernel_kind(target) == OUT_F32 else flat.view(np.uint16))


def _finished(work, target, out_dtype):
    return work.astype(np.float64) if target == ElementType.FLOAT64 else work


def _block_axis(desc, shape) -> Optional[int]:
    """The quantization block axis (per-block affine, NF4, MXFP: ``quantization/per-block-affine.md
    § Block Layout``), along which a window keeps whole blocks; ``None`` for per-tensor and
    per-channel parameters, which hold for single elements."""
    q = desc.quantization
    if isinstance(q, (PerBlockAffine, Nf4, Mxfp)) and q.axis < len(shape) and q.block_size > 0:
        return int(q.axis)
    return None


def _block_window(desc, shape, lo, hi) -> tuple[list[int], list[int]]:
    """The box ``[lo, hi)`` widened to whole quantization blocks along the block axis
    (:func:`_block_axis`; NF4 and MXFP block alike): the window the row kernels decode, whose
    blocks are the tensor's."""
    win_lo, win_hi = list(lo), list(hi)
    axis = _block_axis(desc, shape)
    if axis is not None:
        block = desc.quantization.block_size
        win_lo[axis] = lo[axis] // block * block
        win_hi[axis] = min(-(-hi[axis] // block) * block, shape[axis])
    return win_lo, win_hi


def _quantized_box(desc, buffers, buf, shape, strides, lo, hi, box, target, out_dtype, limits, stored,
                   steps=None) -> np.ndarray:
    """A quantized affine box (``box`` its stepped shape): decoded by the row kernels as a window
    of whole blocks along the block axis holding only the selected positions along every other
    dimension (its codes ``steps`` times the layout's strides apart there), with the window's
    parameters only, then stepped along the block axis; or gathered (the unit-step box, then
    stepped through)."""
    steps = steps or (1,) * len(shape)
    block_axis = _block_axis(desc, shape)
    window_steps = tuple(1 if d == block_axis else step for d, step in enumerate(steps))
    stop = [a + (n - 1) * step + 1 for a, n, step in zip(lo, box, steps)]  # past the last selected position
    win_lo, win_hi = _block_window(desc, shape, lo, stop)
    origin = sum(a * s for a, s in zip(win_lo, strides))
    shift = _byte_shift(origin, element_type_info(desc.type_tag).bit_width)
    if shift is None:
        p = quant_params(desc, buffers)
        unit = tuple(b - a for a, b in zip(lo, stop))
        gathered = _gathered_box(desc, buf, p, shape, strides, lo, unit, target, out_dtype, limits, stored)
        return step_through(gathered, None if unit == box else steps)
    window = stepped_extent(win_lo, win_hi, window_steps)
    sliced = window != box
    charge(decode_cost(desc, window, out_dtype, target) + (math.prod(box) * out_dtype.itemsize if sliced else 0),
           limits, stored=stored)
    p = _window_params(quant_params(desc, buffers, select=_window_selector(shape, win_lo, win_hi, window_steps)),
                       win_lo, win_hi)
    work, kout = _work_array(window, target, out_dtype)
    apart = tuple(s * step for s, step in zip(strides, window_steps))
    with _threads_for(math.prod(window)):
        _decode_window(buf, np.int64(desc.byte_offset + shift), window, apart, p, _kernel_kind(target), kout)
    if sliced:
        work = _c_order(work[_kept_of_window(lo, stop, win_lo, steps, window_steps)])
    return _finished(work, target, out_dtype)


def _kept_of_window(lo, stop, win_lo, steps, window_steps) -> tuple:
    """Index of the stepped box in a decoded window: along a dimension the window holds at unit
    step, the box's range stepped; along one it holds stepped, all of it."""
    return tuple(slice(a - w, b - w, step) if window_step == 1 else slice(None)
                 for a, b, w, step, window_step in zip(lo, stop, win_lo, steps, window_steps)) + (Ellipsis,)


def _window_selector(shape, win_lo, win_hi, steps=None):
    """For :func:`.dequantize.quant_params`: the parameter indices of the window's positions
    ``win_lo[d], win_lo[d] + steps[d], ...`` below ``win_hi[d]``, in the order the kernels index
    those of a tensor of the window's shape (``quantization/per-block-affine.md § Block Layout``:
    ``b = outer * ceil(S / K) + i_axis // K``); the window starts on a block along the block
    axis, where its step is 1."""
    steps = steps or (1,) * len(shape)

    def positions(d):
        return np.arange(win_lo[d], win_hi[d], steps[d], dtype=np.int64)

    def select(pk, axis, block, nb):
        if pk == PK_CHANNEL:
            return positions(axis)
        first_block = win_lo[axis] // block
        index = np.arange(first_block, first_block - (-(win_hi[axis] - win_lo[axis]) // block), dtype=np.int64)
        weight = nb  # of the innermost dimension other than the axis; then times each one's size
        for d in reversed([d for d in range(len(shape)) if d != axis]):
            index = np.add.outer(positions(d) * weight, index)
            weight *= shape[d]
        return index.reshape(-1)
    return select


def _window_params(p: QuantParams, win_lo, win_hi) -> QuantParams:
    """``p`` (the window's parameters already selected) with the window's block count."""
    if p.pk != PK_BLOCK:
        return p
    window_nb = -(-(win_hi[p.axis] - win_lo[p.axis]) // p.block)
    return QuantParams(p.valmode, p.table, p.scales, p.zps, p.pk, p.axis, p.block, window_nb, p.bits, p.signed)


SERIAL_ELEMENTS = 1 << 16
"""A window of at most this many elements is decoded on the calling thread alone: waking the
other threads of a parallel kernel costs more than such a window's work (and, on a busy machine,
waits for a core)."""


def _threads_for(elements: int):
    """One thread for a small window (:data:`SERIAL_ELEMENTS`), the configured threads otherwise."""
    return jit.thread_limit(1) if elements <= SERIAL_ELEMENTS else contextlib.nullcontext()


def _decode_window(buf, base, window, strides, p: QuantParams, kind, kout) -> None:
    """The row kernels over a window whose first code is at byte ``base`` (as ``tensor.decode_into``
    chooses them for a whole tensor)."""
    rshape = np.array(window, np.int64)
    rstr = np.array(strides, np.int64)
    axis, last = p.axis, len(window) - 1
    if tensor_module.INT4_VECTOR and int4_vector_ok(p, axis == last, int(rstr[-1]), kind):
        _decode_int4(buf, base, rshape, rstr, p, axis, kind, kout, None)
        return
    lut_ok = p.bits in (1, 2, 4) and (p.pk != PK_BLOCK or axis == last) \
        and (p.pk != PK_CHANNEL or axis != last) and (p.pk != PK_BLOCK or p.block >= 16)
    kernel = decode_rows_lut if lut_ok else decode_rows
    kernel(buf, base, rshape, rstr, p.valmode, p.bits, p.signed, p.table, p.scales, p.zps, p.pk, axis, p.block, p.nb,
           kind, kout)


def _box_param_indices(p: QuantParams, shape, lo, box) -> np.ndarray:
    """Parameter index of every element of the box (C order) in the tensor's parameter arrays."""
    if p.pk == PK_TENSOR:
        return np.zeros(math.prod(box), np.int64)
    idx = [g + a for g, a in zip(np.indices(box, dtype=np.int64, sparse=True), lo)]
    if p.pk == PK_CHANNEL:
        return _owned(np.broadcast_to(idx[p.axis], box))
    outer = np.zeros((), np.int64)
    for d in range(len(shape)):
        if d != p.axis:
            outer = outer * np.int64(shape[d]) + idx[d]
    return _owned(np.broadcast_to(outer * np.int64(p.nb) + idx[p.axis] // p.block, box))


def _gathered_box(desc, buf, p, shape, strides, lo, box, target, out_dtype, limits, stored) -> np.ndarray:
    """A quantized box whose first code does not start a byte: one offset and parameter index per element."""
    count = math.prod(box)
    charge(decode_cost(desc, box, out_dtype, target) + 2 * OFFSET_BYTES * count, limits, stored=stored)
    work, kout = _work_array(box, target, out_dtype)
    offsets = _owned(sum(a * s for a, s in zip(lo, strides)) + _affine_offsets(strides, box))
    decode_gather(buf, np.int64(desc.byte_offset), offsets, _box_param_indices(p, shape, lo, box), p.valmode, p.bits,
                  p.signed, p.table, p.scales, p.zps, _kernel_kind(target), kout)
    return _finished(work, target, out_dtype)


# ------------------------------------------------------------------------------------
# Sparse layouts
# ------------------------------------------------------------------------------------


def _bounded(coords: np.ndarray, bounds, what) -> np.ndarray:
    """``coords`` ((n, k) uint64) as int64, each column below its bound."""
    if coords.size and any(column.max() >= np.uint64(bound) for column, bound in zip(coords.T, bounds)):
        raise HurraySchemaError(f"{what}: coordinate out of bounds")
    return coords.astype(np.int64)


def _inside(coords: np.ndarray, lo, hi) -> np.ndarray:
    """Which coordinate rows lie in the box (one column at a time: NumPy reduces a narrow
    axis slowly)."""
    keep = np.ones(coords.shape[0], bool)
    for column, first, stop in zip(coords.T, lo, hi):
        keep &= (column >= first) & (column < stop)
    return keep


def _no_duplicates(coords: np.ndarray, lo, hi) -> None:
    if coords.shape[0] > 1:
        lin = linear_indices(coords - np.asarray(lo, np.int64), [b - a for a, b in zip(lo, hi)])
        if np.unique(lin).size != lin.size:
            raise HurraySchemaError("sparse tensor stores the same coordinate twice")


_OUT_OF_BOUNDS, _UNORDERED = -1, -2
"""What :func:`_sorted_coo_box` returns instead of a count for a coordinate past the shape, and for
entries not in strictly increasing lexicographic order."""


@jit.helper
def _first_at_least(idx, start, stop, value):
    """The first storage position in ``[start, stop)`` whose first coordinate is ``>= value``
    (the first coordinates being non-decreasing there)."""
    while start < stop:
        middle = (start + stop) // 2
        if idx[middle, 0] < value:
            start = middle + 1
        else:
            stop = middle
    return start


@jit.kernel("i64(u64[:, :], u64[:], u64[:], u64[:], i64[:])")
def _sorted_coo_box(idx, shape, lo, hi, keep):
    """The entries of a sorted COO (``layouts/coo.md § Storage Order``: lexicographic, so the first
    coordinate is non-decreasing) in the box ``[lo, hi)``: bisects the rows of the box, checks their
    coordinates against ``shape`` (all of them first, as :func:`_bounded` does), then their strictly
    increasing order, and writes the storage positions of those inside the box to ``keep``; returns
    their count, or ``_OUT_OF_BOUNDS`` / ``_UNORDERED``."""
    rank = idx.shape[1]
    first = _first_at_least(idx, 0, idx.shape[0], lo[0])
    stop = _first_at_least(idx, first, idx.shape[0], hi[0])
    for e in range(first, stop):
        for d in range(1, rank):  # the first coordinate lies in [lo[0], hi[0]) by the bisection
            if idx[e, d] >= shape[d]:
                return _OUT_OF_BOUNDS
    count = 0
    for e in range(first, stop):
        if e > first:
            order = 0
            for d in range(rank):
                if idx[e, d] != idx[e - 1, d]:
                    order = 1 if idx[e, d] > idx[e - 1, d] else -1
                    break
            if order <= 0:
                return _UNORDERED
        inside = True
        for d in range(1, rank):
            if idx[e, d] < lo[d] or idx[e, d] >= hi[d]:
                inside = False
        if inside:
            keep[count] = e
            count += 1
    return count


def _coo_in_box(desc, buffers, shape, lo, hi):
    """(storage positions, coordinates) of the COO entries in the box: a sorted COO by
    :func:`_sorted_coo_box`, an unsorted one by a scan of every coordinate."""
    rank, nnz = len(shape), int(desc.layout.nnz)
    if rank == 0:
        raise HurraySchemaError("COO needs rank >= 1")
    idx = _u64(buffers, 1, nnz * rank, "COO indices").reshape(nnz, rank)
    if desc.layout.is_sorted == 1:
        keep = np.empty(nnz, np.int64)
        count = _sorted_coo_box(idx, np.asarray(shape, np.uint64), np.asarray(lo, np.uint64),
                                np.asarray(hi, np.uint64), keep)
        if count == _OUT_OF_BOUNDS:
            raise HurraySchemaError("COO indices: coordinate out of bounds")
        if count == _UNORDERED:
            raise HurraySchemaError("COO marked sorted is not in strictly increasing lexicographic order")
        positions = keep[:count]
        return positions, idx[positions].astype(np.int64)
    read = _bounded(idx, shape, "COO indices")
    keep = np.flatnonzero(_inside(read, lo, hi))
    coords = read if keep.size == read.shape[0] else read[keep]
    _no_duplicates(coords, lo, hi)
    return keep, coords


def _compressed_in_box(desc, buffers, shape, lo, hi):
    """(storage positions, coordinates) of the CSR / CSC entries in the box: the pointer entries and
    minor indices of the box's rows (columns) only."""
    if len(shape) != 2:
        raise HurraySchemaError("CSR/CSC need rank 2")
    nnz = int(desc.layout.nnz)
    major = 0 if isinstance(desc.layout, CsrLayout) else 1
    ptr = _u64(buffers, 2, shape[major] + 1, "pointer array")
    window = ptr[lo[major]:hi[major] + 1].astype(np.int64)
    if ptr[0] != 0 or int(ptr[-1]) != nnz or np.any(window[1:] < window[:-1]) \
            or window.min(initial=0) < 0 or window.max(initial=0) > nnz:
        raise HurraySchemaError(f"pointer array must start at 0, be non-decreasing and end at {nnz}")
    first, stop = (int(window[0]), int(window[-1])) if window.size else (0, 0)
    minor = _bounded(_u64(buffers, 1, nnz, "minor indices")[first:stop].reshape(-1, 1), [shape[1 - major]],
                     "minor indices")[:, 0]
    majors = np.repeat(np.arange(lo[major], lo[major] + window.size - 1, dtype=np.int64), np.diff(window))
    coords = np.stack([majors, minor] if major == 0 else [minor, majors], axis=1)
    keep = np.flatnonzero(_inside(coords, lo, hi))
    coords = coords[keep]
    _no_duplicates(coords, lo, hi)
    return keep + first, coords


def sparse_box_entries(desc, buffers, lo: Sequence[int], hi: Sequence[int], target=None) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """(coordinates relative to ``lo`` ((n, rank) int64), values decoded to ``target``) of the stored
    entries of a sparse tensor that lie in the box ``[lo, hi)``, in storage order (module
    docstring: which coordinates are read)."""
    desc = as_evaluated(desc)
    target = decode_target(desc, target)
    shape = resolved_shape(desc.shape)
    lo, hi = tuple(int(x) for x in lo), tuple(int(x) for x in hi)
    layout = desc.layout
    if isinstance(layout, CooLayout):
        positions, coords = _coo_in_box(desc, buffers, shape, lo, hi)
    elif isinstance(layout, (CsrLayout, CscLayout)):
        positions, coords = _compressed_in_box(desc, buffers, shape, lo, hi)
    else:
        coords, values = sparse_entries(desc, buffers, target)
        keep = _inside(coords, lo, hi)
        return coords[keep] - np.asarray(lo, np.int64), values[keep]
    values = entry_values(desc, buffers, positions, coords, target)
    return coords - np.asarray(lo, np.int64), values


def _sparse_box(desc, buffers, lo, hi, box, target, out_dtype, limits) -> np.ndarray:
    charge(math.prod(box) * out_dtype.itemsize, limits, stored=tensor_stored_bytes(buffers))
    check_representable(box, out_dtype)
    coords, values = sparse_box_entries(desc, buffers, lo, hi, target)
    out = new_array(box, out_dtype, zeros=True)
    if values.size:
        out[tuple(coords.T)] = values
    return out


# ------------------------------------------------------------------------------------
# Which bytes a box read decodes
# ------------------------------------------------------------------------------------

MAX_SPAN_LINES = 1 << 16
"""Above this many separate lines of codes, a box's codes are taken as one span (their extent)."""


def _whole_buffers(desc) -> list[tuple[int, int, int]]:
    return [(index, 0, int(handle.byte_size)) for index, handle in enumerate(desc.buffers)]


def box_byte_spans(desc, lo: Sequence[int], hi: Sequence[int], steps: Optional[Sequence[int]] = None
                   ) -> list[tuple[int, int, int]]:
    """``(buffer index, start, stop)`` byte spans that hold everything :func:`tensor_box` reads for
    the box ``[lo, hi)`` (stepped by ``steps``) of ``desc``, from the descriptor alone: for an
    affine tensor the box's codes (a quantized one's over its window of whole blocks along the
    block axis) and a quantized tensor's parameter buffers whole; every buffer whole for the
    layouts read whole or through tables (sparse, tiled, block-paged...).  A superset, never less:
    a reader that fetches buffers by range fetches these before the evaluator reads them."""
    try:
        return _box_byte_spans(desc, lo, hi, steps)
    except Exception:  # a descriptor the evaluator will refuse: all of it, and let the evaluator say why
        return _whole_buffers(desc)


def _box_byte_spans(desc, lo, hi, steps) -> list[tuple[int, int, int]]:
    if not desc.buffers:
        return []
    desc = as_evaluated(desc)
    shape = resolved_shape(desc.shape)
    lo, hi = [int(x) for x in lo], [int(x) for x in hi]
    info = element_type_info(desc.type_tag)
    strides = affine_strides(desc.layout, storage_shape(desc)) if shape and desc.layout.tag not in SPARSE_TAGS else None
    if strides is None or info is None:
        return _whole_buffers(desc)  # even for an empty box: a sparse one still reads its tables
    if any(b <= a for a, b in zip(lo, hi)) or 0 in shape:
        return []  # an affine read of an empty box reads no byte
    steps = [1] * len(shape) if steps is None else [int(s) for s in steps]
    params = None
    if desc.quantization is not None:
        stop = [a + ((b - a - 1) // s) * s + 1 for a, b, s in zip(lo, hi, steps)]
        lo, hi = _block_window(desc, shape, lo, stop)
        axis = _block_axis(desc, shape)
        steps = [1 if d == axis else s for d, s in enumerate(steps)]
        if _byte_shift(sum(a * s for a, s in zip(lo, strides)), info.bit_width) is None:
            steps = [1] * len(shape)  # the gathered read: the unit-step box, every parameter
        else:  # the window's parameters, as _quantized_box selects them
            params = param_byte_spans(desc, _window_selector(shape, lo, hi, steps))
    margin = 0 if desc.quantization is None and info.bit_width % 8 == 0 else WORD_MARGIN
    codes = _code_spans(strides, lo, hi, steps, info.bit_width, int(desc.byte_offset),
                        int(desc.buffers[0].byte_size), margin)
    spans = [(0, start, stop) for start, stop in codes]
    if params is None:
        return spans + _whole_buffers(desc)[1:]
    held = {index for index, _, _ in params}
    sizes = [int(handle.byte_size) for handle in desc.buffers]
    return spans + [(index, max(0, start), min(sizes[index], stop)) for index, start, stop in params
                    if 0 < index < len(sizes)] + [span for span in _whole_buffers(desc)[1:] if span[0] not in held]


def _code_spans(strides, lo, hi, steps, bits: int, byte_offset: int, size: int,
                margin: int) -> list[tuple[int, int]]:
    """Byte spans of buffer 0 holding the codes of the stepped box: one span per line along the
    dimension of smallest stride (when read at unit step), every selected element else; each
    widened by ``margin`` bytes either side."""
    counts = [-(-(b - a) // s) for a, b, s in zip(lo, hi, steps)]
    inner = min(range(len(strides)), key=lambda d: (abs(strides[d]) if counts[d] > 1 else 1 << 62, -d))
    line = counts[inner] if steps[inner] == 1 else 1
    outer = [d for d in range(len(strides)) if not (d == inner and line > 1)]
    if math.prod(counts[d] for d in outer) > MAX_SPAN_LINES:
        offsets = [sum(x * s for x, s in zip(corner, strides))
                   for corner in _corners(lo, [a + (n - 1) * s for a, n, s in zip(lo, counts, steps)])]
        return [_byte_span(min(offsets), max(offsets) + 1, bits, byte_offset, size, margin)]
    starts = np.zeros(1, np.int64) + sum(a * s for a, s in zip(lo, strides))
    for d in outer:
        starts = (starts[:, None] + np.arange(counts[d], dtype=np.int64)[None, :] * (steps[d] * strides[d])).reshape(-1)
    reach = (line - 1) * strides[inner] if line > 1 else 0
    firsts, lasts = np.minimum(starts, starts + reach), np.maximum(starts, starts + reach)
    return [_byte_span(int(f), int(l) + 1, bits, byte_offset, size, margin)
            for f, l in zip(firsts.tolist(), lasts.tolist())]


def _corners(lo, last):
    import itertools

    return itertools.product(*[(a, b) for a, b in zip(lo, last)])


WORD_MARGIN = 8
"""Bytes a span of packed (sub-byte) or quantized codes is widened by either side: a margin for the
decoders of codes that share bytes or are decoded a block at a time.  An unquantized whole-byte
type is read element by element (a view of the buffer, or its codes gathered one by one): its
spans are exact."""


def _byte_span(first: int, stop: int, bits: int, byte_offset: int, size: int, margin: int) -> tuple[int, int]:
    """Bytes of buffer 0 holding elements ``[first, stop)`` (a 6-bit code packs four to three bytes),
    widened by ``margin`` bytes either side and kept inside the buffer."""
    if bits == 6:
        start, end = (first // 4) * 3, -(-stop // 4) * 3
    else:
        start, end = (first * bits) // 8, -(-(stop * bits) // 8)
    return max(0, byte_offset + start - margin), min(size, byte_offset + end + margin)
