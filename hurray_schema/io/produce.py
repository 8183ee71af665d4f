"""Producers: NumPy arrays to quantized, sparse and composite tensors.

* :func:`quantize` -- per-tensor, per-channel and per-block affine, NF4 and MXFP
  (``quantization/*.md``); the arithmetic is :mod:`hurray_schema.evaluate.quantize`, the
  counterpart of the evaluator's dequantization.
* :func:`sparse_coo`, :func:`sparse_csr`, :func:`sparse_csc` from index and value arrays
  (``layouts/coo.md``, ``layouts/csr.md``, ``layouts/csc.md``), :func:`from_scipy` from
  ``scipy.sparse`` matrices.
* :func:`partition`, :func:`overlay`, :func:`group` -- the composite builders
  :meth:`Composite.partition`, :meth:`Composite.overlay`, :meth:`Composite.group` (shard and
  Composite Member sections set, ``layouts/composite.md § Members``), and :func:`spqr`, the
  SpQR-style overlay of ``layouts/composite.md § Example``.

Every descriptor built here is checked by the descriptor rules (strict mode) and every
composite by the composite binder (:meth:`Composite.validate`) before it is returned: a
producer never hands out what a strict reader rejects.  The kernels live in the
evaluator's package, a layer above this one, and are imported at call time (as
:meth:`Tensor.to_numpy` does).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..model import (NO_BUFFER_INDEX, BufferHandle, CombineOp, CooLayout, CscLayout, CsrLayout, ElementType, Mxfp,
                     Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine, QuantFlag, QuantScheme, RowMajorLayout,
                     Shard, TensorDescriptor)
from ..rules.descriptor import first_error
from ..structs.element_types import element_type_info, element_type_of
from .tensor import DEFAULT_BUFFER_ALIGNMENT, Composite, ProducedBuffer, ProducedTensor, Tensor

__all__ = ["quantize", "per_block_from_codes", "per_block_from_packed", "per_block_produced", "sparse_coo",
           "sparse_csr", "sparse_csc", "from_scipy", "partition", "overlay", "group", "spqr", "SCHEME_NAMES"]

SCHEME_NAMES = {
    "per_tensor": QuantScheme.PER_TENSOR_AFFINE,
    "per_channel": QuantScheme.PER_CHANNEL_AFFINE,
    "per_block": QuantScheme.PER_BLOCK_AFFINE,
    "nf4": QuantScheme.NF4,
    "mxfp": QuantScheme.MXFP,
}
"""The ``scheme`` names :func:`quantize` takes (a :class:`QuantScheme` works too)."""

DEFAULT_STORAGE = {
    QuantScheme.PER_TENSOR_AFFINE: ElementType.INT8,
    QuantScheme.PER_CHANNEL_AFFINE: ElementType.INT8,
    QuantScheme.PER_BLOCK_AFFINE: ElementType.INT4,
    QuantScheme.NF4: ElementType.UINT4,
    QuantScheme.MXFP: ElementType.FLOAT8_E4M3,
}

DEFAULT_BLOCK_SIZE = {QuantScheme.PER_BLOCK_AFFINE: 64, QuantScheme.NF4: 64, QuantScheme.MXFP: 32}
"""GGUF / bitsandbytes' 64 and OCP MX v1.0's canonical 32 (``quantization/mxfp.md § Description``)."""

_SCALE_TYPES = (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32)


# ------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------


_element_type = Composite._element_type
"""An :class:`ElementType` from itself, its number or its name (the composite builders' parser)."""


def _scheme(value) -> QuantScheme:
    if isinstance(value, str):
        try:
            return SCHEME_NAMES[value.lower()]
        except KeyError:
            raise HurraySchemaError(f"unknown scheme {value!r}; one of {sorted(SCHEME_NAMES)}") from None
    return QuantScheme(int(value))


def _handle(nbytes: int) -> BufferHandle:
    return BufferHandle(int(nbytes), DEFAULT_BUFFER_ALIGNMENT)


def _checked(desc: TensorDescriptor) -> TensorDescriptor:
    """``desc`` if the strict descriptor rules accept it, else their first error as SpecViolation."""
    finding = first_error(desc)
    if finding is not None:
        raise finding.to_violation()
    return desc


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise HurraySchemaError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _float_type(dtype) -> Optional[ElementType]:
    """The scale type an input dtype suggests: its own float16 / bfloat16 / float32, else None."""
    tag = element_type_of(dtype)
    return tag if tag in (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32) else None


def _block_size(scheme, block_size, size: int) -> int:
    if block_size is not None:
        return int(block_size)
    block = DEFAULT_BLOCK_SIZE[scheme]
    if scheme != QuantScheme.MXFP and 0 < size < block:
        block = 1 << (size.bit_length() - 1)  # the largest power of two within the axis
    return block


def _require_finite(finite: bool, what: str) -> None:
    if not finite:
        raise HurraySchemaError(f"{what}: NaN or infinity cannot be quantized")


def _le(values: np.ndarray, dtype) -> np.ndarray:
    """Little-endian bytes of ``values`` as ``dtype``, as a flat uint8 array."""
    return np.ascontiguousarray(values, np.dtype(dtype).newbyteorder("<")).reshape(-1).view(np.uint8)


# ------------------------------------------------------------------------------------
# quantize
# ------------------------------------------------------------------------------------


def quantize(array, scheme="per_block", *, storage=None, axis: int = -1, block_size: Optional[int] = None,
             symmetric: Optional[bool] = None, scale_type=None, name: Optional[str] = None,
             shard: Optional[Shard] = None) -> Tensor:
    """A row-major quantized tensor of ``array``.

    ``scheme``: "per_tensor", "per_channel", "per_block", "nf4" or "mxfp" (or a
    :class:`QuantScheme`).  ``storage``: an element-type name or :class:`ElementType`
    (default int8 for per-tensor / per-channel, int4 per-block, uint4 NF4, float8_e4m3
    MXFP).  ``axis``: the channel or block axis.  ``block_size``: default 64 (per-block,
    NF4; the largest power of two within a shorter axis) or 32 (MXFP).  ``symmetric``:
    zero point 0 (default for signed storage; unsigned storage defaults to asymmetric).
    ``scale_type``: float16 / bfloat16 / float32 per-block scales (default the input's
    float type, else float32; a per-block tensor decodes to its scale type).

    Each element decodes (``Tensor.to_numpy``) to within half a quantization step of its
    float32 value (see :mod:`hurray_schema.evaluate.quantize` for the rounding).
    """
    arr = np.asarray(array)
    if arr.dtype.kind not in "fiub" and _float_type(arr.dtype) is None:
        raise HurraySchemaError(f"cannot quantize an array of {arr.dtype}")
    scheme = _scheme(scheme)
    storage = DEFAULT_STORAGE[scheme] if storage is None else _element_type(storage)
    info = element_type_info(storage)
    if info is None:
        raise HurraySchemaError(f"element type 0x{int(storage):02X} has no built-in size")
    if symmetric is None:
        symmetric = bool(info.is_signed)
    build = {QuantScheme.PER_TENSOR_AFFINE: _per_tensor, QuantScheme.PER_CHANNEL_AFFINE: _per_channel,
             QuantScheme.PER_BLOCK_AFFINE: _per_block, QuantScheme.NF4: _nf4, QuantScheme.MXFP: _mxfp}[scheme]
    desc, buffers = build(arr, storage, axis, block_size, bool(symmetric), scale_type, shard)
    return Tensor(desc, buffers, name=name)


def _affine_range(arr, storage, symmetric):
    from ..evaluate.quantize import code_range

    lo, hi = code_range(storage, symmetric)
    if symmetric and lo == 0 and arr.size and np.min(arr) < 0:
        raise HurraySchemaError("symmetric quantization to unsigned storage cannot hold negative values; "
                                "pass symmetric=False")
    return lo, hi


def _code_dtype(storage):
    from ..evaluate.elements import numpy_dtype

    info = element_type_info(storage)
    return numpy_dtype(storage) if info.bit_width >= 8 else np.uint8


def _descriptor(storage, shape, data_bytes: int, params: Sequence[int], quantization, shard) -> TensorDescriptor:
    handles = [_handle(data_bytes)] + [_handle(n) for n in params]
    return _checked(TensorDescriptor(storage, tuple(shape), RowMajorLayout(), tuple(handles),
                                     quantization=quantization, shard=shard))


def _check_scales(over: int, scale_type) -> None:
    if over:
        name = element_type_info(scale_type).name
        raise HurraySchemaError(f"{over} scale(s) exceed the range of {name}; pass scale_type='float32'")


def _per_tensor(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and _element_type(scale_type) != ElementType.FLOAT32:
        raise HurraySchemaError("per-tensor affine keeps a float32 scale (quantization/per-tensor-affine.md)")
    info = element_type_info(storage)
    lo, hi = _affine_range(arr, storage, symmetric)
    count = arr.size
    probe = PerTensorAffine(scale=1.0, zero_point=0)
    _descriptor(storage, arr.shape, info.buffer_bytes(count), (), probe, shard)
    rows = arr.shape[0] if arr.ndim and count else 1
    rows2d = arr.reshape(rows, count // rows if rows else 0) if count else arr.reshape(1, 0)
    scale, zero = np.float32(1.0), 0
    data = np.zeros(0, np.uint8)
    if count:
        mins, maxs, finite = kernels.affine_block_stats(rows2d, rows2d.shape[1])
        _require_finite(finite, "per-tensor affine")
        scales, zps, over = kernels.affine_block_params(mins.min(keepdims=True), maxs.max(keepdims=True), lo, hi,
                                                        symmetric, ElementType.FLOAT32)
        _check_scales(over, ElementType.FLOAT32)
        scale, zero = scales[0], int(zps[0])
        cols = rows2d.shape[1]
        data = kernels.affine_codes(rows2d, cols, cols, np.full(rows, scale, np.float32),
                                    np.full(rows, zero, np.int32), lo, hi, info.bit_width, _code_dtype(storage))
    q = PerTensorAffine(scale=float(scale), zero_point=int(zero))
    desc = _descriptor(storage, arr.shape, info.buffer_bytes(count), (), q, shard)
    return desc, [_le(data, _code_dtype(storage))]


def _per_channel(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and _element_type(scale_type) != ElementType.FLOAT32:
        raise HurraySchemaError("per-channel affine keeps float32 scales (quantization/per-channel-affine.md)")
    info = element_type_info(storage)
    axis = _axis(axis, arr.ndim)
    lo, hi = _affine_range(arr, storage, symmetric)
    channels = arr.shape[axis]
    params = (channels * 4,) if symmetric else (channels * 4, channels * 4)
    q = PerChannelAffine(axis=axis, scale_buffer_index=1,
                         zero_point_buffer_index=NO_BUFFER_INDEX if symmetric else 2,
                         flags=QuantFlag.SYMMETRIC if symmetric else 0)
    desc = _descriptor(storage, arr.shape, info.buffer_bytes(arr.size), params, q, shard)
    moved = np.moveaxis(arr, axis, 0)
    rows2d = np.ascontiguousarray(moved).reshape(channels, -1) if channels else moved.reshape(0, 0)
    cols = rows2d.shape[1]
    mins, maxs, finite = kernels.affine_block_stats(rows2d, max(cols, 1))
    _require_finite(finite, "per-channel affine")
    scales, zps, over = kernels.affine_block_params(mins, maxs, lo, hi, symmetric, ElementType.FLOAT32)
    _check_scales(over, ElementType.FLOAT32)
    code_dtype = _code_dtype(storage)
    if axis == 0 or arr.size == 0:
        data = kernels.affine_codes(rows2d, max(cols, 1), cols, scales, zps, lo, hi, info.bit_width, code_dtype)
    else:
        codes = kernels.affine_codes(rows2d, cols, cols, scales, zps, lo, hi, max(info.bit_width, 8), code_dtype)
        codes = np.moveaxis(codes.reshape(moved.shape), 0, axis)
        data = kernels.pack_codes(np.ascontiguousarray(codes), info.bit_width)
    buffers = [_le(data, code_dtype), _le(scales, np.float32)] + ([] if symmetric else [_le(zps, np.int32)])
    return desc, buffers


def _blocked(arr, axis, block):
    """(axis, rows x cols view with the axis last, padded axis length)."""
    from ..evaluate.quantize import block_view

    axis = _axis(axis, arr.ndim)
    size = arr.shape[axis]
    padded = -(-size // block) * block if block > 0 else size
    return axis, block_view(arr, axis), padded


def _storage_codes(codes, arr, axis, padded, bits):
    """Codes computed one per item on rows x padded, in the storage order of the (padded) shape, packed."""
    from ..evaluate.quantize import pack_codes, restore_layout

    return pack_codes(restore_layout(codes, arr.shape, axis), bits)


def _per_block_descriptor(arr, storage, axis, block_size, symmetric, scale_type, shard):
    """(checked descriptor, rows x cols view with the axis last, padded axis length, scale type, lo, hi)."""
    info = element_type_info(storage)
    rank_axis = _axis(axis, arr.ndim)
    block = _block_size(QuantScheme.PER_BLOCK_AFFINE, block_size, arr.shape[rank_axis])
    if scale_type is None:
        scale_type = _float_type(arr.dtype) or ElementType.FLOAT32
    scale_type = _element_type(scale_type)
    if scale_type not in _SCALE_TYPES:
        raise HurraySchemaError("per-block scales are float16, bfloat16 or float32")
    lo, hi = _affine_range(arr, storage, symmetric)
    axis, rows2d, padded = _blocked(arr, rank_axis, block)
    nblocks = rows2d.shape[0] * (padded // block if block > 0 else 0)
    width = element_type_info(scale_type).bit_width // 8
    params = (nblocks * width,) if symmetric else (nblocks * width, nblocks * 4)
    q = PerBlockAffine(axis=axis, block_size=block, scale_buffer_index=1,
                       zero_point_buffer_index=NO_BUFFER_INDEX if symmetric else 2,
                       flags=QuantFlag.SYMMETRIC if symmetric else 0, scale_type_tag=scale_type)
    stored = padded * (arr.size // arr.shape[axis]) if arr.shape[axis] else 0
    desc = _descriptor(storage, arr.shape, info.buffer_bytes(stored), params, q, shard)
    return desc, rows2d, padded, scale_type, lo, hi


def _per_block(arr, storage, axis, block_size, symmetric, scale_type, shard, mask=None):
    from ..evaluate import quantize as kernels
    from ..evaluate.elements import numpy_dtype

    info = element_type_info(storage)
    desc, rows2d, padded, scale_type, lo, hi = _per_block_descriptor(arr, storage, axis, block_size, symmetric,
                                                                     scale_type, shard)
    q = desc.quantization
    last = q.axis == arr.ndim - 1
    codes, scales, zps, finite, over = kernels.affine_quantize(rows2d, q.block_size, padded, lo, hi, symmetric,
                                                               scale_type, info.bit_width, _code_dtype(storage),
                                                               mask=mask, unpacked=not last)
    _require_finite(finite, "per-block affine")
    _check_scales(over, scale_type)
    if not last:
        codes = _storage_codes(codes, arr, q.axis, padded, info.bit_width)
    scale_dtype = numpy_dtype(scale_type)
    buffers = [_le(codes, _code_dtype(storage)), _le(scales.astype(scale_dtype), scale_dtype)]
    if not symmetric:
        buffers.append(_le(zps, np.int32))
    return desc, buffers


_PACKED_INTEGERS = {ElementType.INT8: 8, ElementType.INT4: 4, ElementType.INT2: 2}


def per_block_from_codes(codes, scales, storage="int8", block_size: int = 32, *,
                         name: Optional[str] = None) -> Tensor:
    """A symmetric per-block affine tensor (``quantization/per-block-affine.md``) of codes and
    float32 scales already chosen: ``codes`` an integer array of the tensor's shape (block axis
    last, its length a multiple of ``block_size``), ``scales`` one float32 per block in block
    order (``§ Block Layout``).  Each element decodes to ``scales[b] * codes[...]`` in float32.

    ``storage`` is int8, int4 or int2 (``§ Valid Storage Types``); the codes must fit it, every
    scale must be finite and non-zero (``§ Validity Constraints``) -- the descriptor rules
    check what the bytes say, this function what they cannot: the codes' range.  Sub-byte
    codes are packed LSB-first (``element-types.md § Sub-Byte Integer Types``)."""
    storage = _element_type(storage)
    if storage not in _PACKED_INTEGERS:
        raise HurraySchemaError("per_block_from_codes stores int8, int4 or int2 codes")
    bits = _PACKED_INTEGERS[storage]
    codes = np.asarray(codes)
    if codes.ndim < 1 or codes.dtype.kind not in "iu":
        raise HurraySchemaError("codes must be an integer array of rank >= 1")
    block = int(block_size)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if codes.size and (int(codes.min()) < lo or int(codes.max()) > hi):
        raise HurraySchemaError(f"codes outside [{lo}, {hi}] do not fit {storage.name.lower()}")
    return per_block_from_packed(_packed(codes.reshape(-1), bits), scales, codes.shape, storage, block, name=name)


def per_block_from_packed(data, scales, shape: Sequence[int], storage="int8", block_size: int = 32, *,
                          name: Optional[str] = None) -> Tensor:
    """:func:`per_block_from_codes` with the codes already packed: ``data`` the data buffer's bytes
    (``shape``'s elements in row-major order, the block axis last, ``8 // bits`` to a byte the first
    in the lowest bits), ``scales`` one finite non-zero float32 per block.  Every code a storage
    type's bits can hold is in its range, so nothing but the sizes is checked here."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    scale_values = np.ascontiguousarray(scales, np.float32).reshape(-1)
    desc = _per_block_packed(storage, shape, block_size, raw.size, scale_values.size)
    if scale_values.size and not (np.all(np.isfinite(scale_values)) and np.all(scale_values != 0)):
        raise HurraySchemaError("every per-block scale must be finite and non-zero")
    return Tensor(desc, [raw, _le(scale_values, np.float32)], name=name)


def per_block_produced(data, scales, shape: Sequence[int], storage="int8", block_size: int = 32, *,
                       name: Optional[str] = None) -> ProducedTensor:
    """:func:`per_block_from_packed` whose buffers are made while the file is written
    (:class:`~.tensor.ProducedBuffer` s: ``data`` the packed codes, ``scales`` the little-endian float32
    scales).  Their bytes are not seen here: the producer answers for every scale being finite and
    non-zero (``quantization/per-block-affine.md § Validity Constraints``); only the sizes are checked."""
    if not (isinstance(data, ProducedBuffer) and isinstance(scales, ProducedBuffer)):
        raise HurraySchemaError("per_block_produced takes ProducedBuffers; arrays go to per_block_from_packed")
    if scales.size % 4:
        raise HurraySchemaError(f"{scales.size} scale bytes are not whole float32 scales")
    desc = _per_block_packed(storage, shape, block_size, data.size, scales.size // 4)
    return ProducedTensor.over(desc, (data, scales), name=name)


def _per_block_packed(storage, shape: Sequence[int], block_size: int, data_bytes: int, scale_count: int):
    """The descriptor of symmetric per-block affine codes packed in ``data_bytes`` with ``scale_count``
    float32 scales, once the sizes agree with ``shape`` and ``block_size``."""
    storage = _element_type(storage)
    if storage not in _PACKED_INTEGERS:
        raise HurraySchemaError("per-block codes are int8, int4 or int2")
    shape = tuple(int(n) for n in shape)
    block = int(block_size)
    if not shape or block < 2 or shape[-1] % block:
        raise HurraySchemaError(f"the last axis of {shape} is not a multiple of block_size {block}")
    info = element_type_info(storage)
    count = math.prod(shape)
    if data_bytes != info.buffer_bytes(count):
        raise HurraySchemaError(f"{data_bytes} data bytes given, {count} {storage.name.lower()} codes need "
                                f"{info.buffer_bytes(count)}")
    nblocks = count // block
    if scale_count != nblocks:
        raise HurraySchemaError(f"{scale_count} scales given, the codes have {nblocks} blocks")
    q = PerBlockAffine(axis=len(shape) - 1, block_size=block, scale_buffer_index=1,
                       zero_point_buffer_index=NO_BUFFER_INDEX, flags=QuantFlag.SYMMETRIC,
                       scale_type_tag=ElementType.FLOAT32)
    return _descriptor(storage, shape, data_bytes, (scale_count * 4,), q, None)


def _packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Signed codes as bytes, ``8 // bits`` to a byte, the first in the lowest bits."""
    raw = codes.astype(np.int8, copy=False).view(np.uint8)
    if bits == 8:
        return raw
    per_byte = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    if raw.size % per_byte:
        raw = np.concatenate([raw, np.zeros(per_byte - raw.size % per_byte, np.uint8)])
    lanes = raw.reshape(-1, per_byte)
    out = lanes[:, 0] & mask
    for i in range(1, per_byte):
        out |= (lanes[:, i] & mask) << np.uint8(i * bits)
    return out


def _nf4(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and _element_type(scale_type) != ElementType.FLOAT32:
        raise HurraySchemaError("NF4 keeps float32 absmax scales (quantization/nf4.md)")
    info = element_type_info(storage)
    rank_axis = _axis(axis, arr.ndim)
    block = _block_size(QuantScheme.NF4, block_size, arr.shape[rank_axis])
    axis, rows2d, padded = _blocked(arr, rank_axis, block)
    nblocks = rows2d.shape[0] * (padded // block if block > 0 else 0)
    q = Nf4(axis=axis, block_size=block, scale_buffer_index=1)
    stored = padded * (arr.size // arr.shape[axis]) if arr.shape[axis] else 0
    desc = _descriptor(storage, arr.shape, info.buffer_bytes(stored), (nblocks * 4,), q, shard)
    last = axis == arr.ndim - 1
    codes, scales, finite = kernels.nf4_quantize(rows2d, block, padded, unpacked=not last)
    _require_finite(finite, "NF4")
    if not last:
        codes = _storage_codes(codes, arr, axis, padded, info.bit_width)
    return desc, [codes, _le(scales, np.float32)]


def _mxfp(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and _element_type(scale_type) != ElementType.FLOAT8_E8M0:
        raise HurraySchemaError("MXFP scales are float8_e8m0 (quantization/mxfp.md)")
    info = element_type_info(storage)
    rank_axis = _axis(axis, arr.ndim)
    block = _block_size(QuantScheme.MXFP, block_size, arr.shape[rank_axis])
    axis, rows2d, padded = _blocked(arr, rank_axis, block)
    nblocks = rows2d.shape[0] * (padded // block if block > 0 else 0)
    q = Mxfp(axis=axis, block_size=block, scale_buffer_index=1)
    desc = _descriptor(storage, arr.shape, info.buffer_bytes(arr.size), (nblocks,), q, shard)
    last = axis == arr.ndim - 1
    codes, exps, finite = kernels.mxfp_quantize(rows2d, block, storage, unpacked=not last)
    _require_finite(finite, "MXFP")
    if not last:
        codes = _storage_codes(codes, arr, axis, padded, info.bit_width)
    return desc, [codes, exps]


# ------------------------------------------------------------------------------------
# Sparse builders
# ------------------------------------------------------------------------------------


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
    idx = _le(coords.astype(np.uint64), np.uint64)
    layout = CooLayout(nnz=int(coords.shape[0]), is_sorted=1 if sort else 0)
    desc = _checked(TensorDescriptor(tag, shape, layout, (_handle(len(data)), _handle(idx.size)), shard=shard))
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
    ind, pointers = _le(minor.astype(np.uint64), np.uint64), _le(ptr.astype(np.uint64), np.uint64)
    desc = _checked(TensorDescriptor(tag, shape, layout_cls(nnz=nnz),
                                     (_handle(len(data)), _handle(ind.size), _handle(pointers.size)), shard=shard))
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


# ------------------------------------------------------------------------------------
# Composites
# ------------------------------------------------------------------------------------


partition = Composite.partition
"""A partition composite of an array, one member per box (:meth:`Composite.partition`)."""

overlay = Composite.overlay
"""A sealed overlay of a base and its corrections (:meth:`Composite.overlay`)."""

group = Composite.group
"""A group composite of tensors, composites or arrays (:meth:`Composite.group`)."""


def _combine(value) -> CombineOp:
    return CombineOp[value.upper()] if isinstance(value, str) else CombineOp(int(value))


# ------------------------------------------------------------------------------------
# SpQR
# ------------------------------------------------------------------------------------

_SPQR_STORAGE = {2: ElementType.INT2, 4: ElementType.INT4, 8: ElementType.INT8}
SPQR_MAX_PER_BLOCK = 8
"""At most this many outliers per block: each block's reference scale leaves out its 8 largest elements."""


def spqr(weight, bits: int = 4, block_size: int = 64, outliers: float = 0.01, combine_op="replace", *,
         name: Optional[str] = None) -> Composite:
    """The SpQR-style overlay of ``layouts/composite.md § Example``: a symmetric per-block ``int{bits}``
    base along the last axis whose scales have the weight's type (so it decodes to it), plus a
    sorted COO correction holding the outliers.

    Outliers are the elements with the largest quantization error under a robust scale of their
    block -- the scale it gets once its :data:`SPQR_MAX_PER_BLOCK` largest elements are left out
    -- among those whose error there exceeds half a step; at most ``round(outliers * size)`` of
    them (:func:`hurray_schema.evaluate.quantize.spqr_outliers`).  They are then left out of
    their block's statistics before its scale is chosen, so one large weight does not coarsen
    the rest of its block.  ``combine_op="replace"`` stores the outliers' exact values;
    ``"add"`` the residual ``x - base`` rounded to the weight's type.
    """
    from ..evaluate import quantize as kernels

    w = np.asarray(weight)
    head_type = _float_type(w.dtype)
    if head_type is None or w.ndim < 1:
        raise HurraySchemaError("spqr takes a float16, bfloat16 or float32 array of rank >= 1")
    if bits not in _SPQR_STORAGE:
        raise HurraySchemaError(f"spqr bits is one of {sorted(_SPQR_STORAGE)}")
    storage = _SPQR_STORAGE[bits]
    op = _combine(combine_op)
    block = int(block_size)
    rows2d = kernels.block_view(w, -1)
    _, hi = kernels.code_range(storage, True)
    mask = kernels.spqr_outliers(rows2d, block, hi, int(round(float(outliers) * w.size)), SPQR_MAX_PER_BLOCK)
    base = Tensor(*_per_block(w, storage, -1, block, True, head_type, None, mask=mask))
    flat = np.flatnonzero(mask)
    coords = np.stack(np.unravel_index(flat, w.shape), axis=1) if flat.size else np.zeros((0, w.ndim), np.int64)
    values = w.reshape(-1)[flat]
    if op == CombineOp.ADD:
        decoded = base.to_numpy().reshape(-1)[flat].astype(np.float32)
        values = (values.astype(np.float32) - decoded).astype(w.dtype)
    correction = sparse_coo(coords, values, w.shape)
    return overlay(base, [correction], op, type_tag=head_type, name=name)
