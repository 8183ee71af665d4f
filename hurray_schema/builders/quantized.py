"""Quantized tensors from NumPy arrays (``quantization/*.md``): :func:`quantize` (per-tensor,
per-channel and per-block affine, NF4, MXFP) and the per-block affine tensors of codes and scales
chosen elsewhere (:func:`per_block_from_codes`, :func:`per_block_from_packed`,
:func:`per_block_produced`).  The arithmetic is :mod:`hurray_schema.evaluate.quantize`, the
counterpart of the evaluator's dequantization, imported at call time."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..errors import HurraySchemaError
from ..model import (NO_BUFFER_INDEX, ElementType, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine,
                     QuantFlag, QuantScheme, RowMajorLayout, Shard, TensorDescriptor)
from ..structs._declare import power_of_two
from ..structs.element_types import element_type_info
from ..structs.quantization import BLOCK_SIZE_BOUNDS
from ..io.tensor import ProducedBuffer, ProducedTensor, Tensor
from .common import SCALE_TYPES, checked, element_type, float_type, handle, little_endian

__all__ = ["quantize", "quantized_from_codes", "per_block_from_codes", "per_block_from_packed", "per_block_produced", "per_block_parts",
           "SCHEME_NAMES", "DEFAULT_STORAGE", "DEFAULT_BLOCK_SIZE"]

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

def _scheme(value) -> QuantScheme:
    if isinstance(value, str):
        try:
            return SCHEME_NAMES[value.lower()]
        except KeyError:
            raise HurraySchemaError(f"unknown scheme {value!r}; one of {sorted(SCHEME_NAMES)}") from None
    return QuantScheme(int(value))


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise HurraySchemaError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


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
    if arr.dtype.kind not in "fiub" and float_type(arr.dtype) is None:
        raise HurraySchemaError(f"cannot quantize an array of {arr.dtype}")
    scheme = _scheme(scheme)
    storage = DEFAULT_STORAGE[scheme] if storage is None else element_type(storage)
    info = element_type_info(storage)
    if info is None:
        raise HurraySchemaError(f"element type 0x{int(storage):02X} has no built-in size")
    if symmetric is None:
        symmetric = bool(info.is_signed)
    build = {QuantScheme.PER_TENSOR_AFFINE: _per_tensor, QuantScheme.PER_CHANNEL_AFFINE: _per_channel,
             QuantScheme.PER_BLOCK_AFFINE: per_block_parts, QuantScheme.NF4: _nf4, QuantScheme.MXFP: _mxfp}[scheme]
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
    handles = [handle(data_bytes)] + [handle(n) for n in params]
    return checked(TensorDescriptor(storage, tuple(shape), RowMajorLayout(), tuple(handles),
                                     quantization=quantization, shard=shard))


def _check_scales(over: int, scale_type) -> None:
    if over:
        name = element_type_info(scale_type).name
        raise HurraySchemaError(f"{over} scale(s) exceed the range of {name}; pass scale_type='float32'")


def _per_tensor(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and element_type(scale_type) != ElementType.FLOAT32:
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
    return desc, [little_endian(data, _code_dtype(storage))]


def _per_channel(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and element_type(scale_type) != ElementType.FLOAT32:
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
    buffers = [little_endian(data, code_dtype), little_endian(scales, np.float32)] + ([] if symmetric else [little_endian(zps, np.int32)])
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
        scale_type = float_type(arr.dtype) or ElementType.FLOAT32
    scale_type = element_type(scale_type)
    if scale_type not in SCALE_TYPES:
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


def per_block_parts(arr, storage, axis, block_size, symmetric, scale_type, shard, mask=None):
    """The descriptor and buffers of ``arr`` quantized per block (``quantization/per-block-affine.md``),
    the elements of ``mask`` (when given) left out of their block's statistics."""
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
    buffers = [little_endian(codes, _code_dtype(storage)), little_endian(scales.astype(scale_dtype), scale_dtype)]
    if not symmetric:
        buffers.append(little_endian(zps, np.int32))
    return desc, buffers


_PACKED_INTEGERS = {ElementType.INT8: 8, ElementType.INT4: 4, ElementType.INT2: 2}


_CODE_SCHEMES = (QuantScheme.PER_CHANNEL_AFFINE, QuantScheme.PER_BLOCK_AFFINE, QuantScheme.NF4)


def quantized_from_codes(codes, scheme, *, storage, axis: int, scales, zero_points=None,
                         block_size: Optional[int] = None, scale_type=None, name: Optional[str] = None) -> Tensor:
    """A row-major quantized tensor of codes and parameters chosen elsewhere (another library's
    checkpoint), stored as they are: nothing is rounded or re-derived.

    ``codes``: an integer array of the tensor's shape, each code within ``storage`` (an integer
    type of the scheme, ``quantization/<page>.md § Valid Storage Types``; uint4 for NF4).
    ``scheme``: "per_channel", "per_block" or "nf4".  ``axis``: the channel or block axis.
    ``scales``: one per channel (per-channel: ``(shape[axis],)``), or the tensor's shape with
    ``axis`` replaced by the block count along it (per-block, NF4), so that block ``b`` of
    ``§ Block Layout`` is ``scales`` with the axis moved last, flattened.  ``zero_points``: integers of the same shape
    (affine schemes; None: symmetric).  ``block_size``: a power of two dividing ``shape[axis]``.
    ``scale_type``: float16, bfloat16 or float32 (per-block; default the scales' own type);
    per-channel scales and NF4 absmax are float32 (a float16 or bfloat16 scale widens exactly).

    The descriptor is checked by the descriptor rules here; the scale values (finite, non-zero)
    are the buffer rules', checked when the file is written."""
    scheme = _scheme(scheme)
    if scheme not in _CODE_SCHEMES:
        raise HurraySchemaError("quantized_from_codes builds per-channel, per-block and NF4 tensors")
    codes = np.asarray(codes)
    if codes.ndim < 1 or codes.dtype.kind not in "iu":
        raise HurraySchemaError("codes must be an integer array of rank >= 1")
    storage = element_type(storage)
    info = element_type_info(storage)
    axis = _axis(axis, codes.ndim)
    lo, hi = _storage_range(storage, info)
    if codes.size and (int(codes.min()) < lo or int(codes.max()) > hi):
        raise HurraySchemaError(f"codes outside [{lo}, {hi}] do not fit {storage.name.lower()}")
    per_axis = codes.shape[axis]
    if scheme != QuantScheme.PER_CHANNEL_AFFINE:
        block = int(block_size or 0)
        lowest, highest = BLOCK_SIZE_BOUNDS[scheme]
        if not power_of_two(block) or block < lowest or (highest is not None and block > highest) or per_axis % block:
            raise HurraySchemaError(f"block size {block_size} is not a power of two dividing the {per_axis} elements "
                                    f"of axis {axis}")
        per_axis //= block
    expected = (per_axis,) if scheme == QuantScheme.PER_CHANNEL_AFFINE \
        else codes.shape[:axis] + (per_axis,) + codes.shape[axis + 1:]
    scale_values = np.asarray(scales)
    if scale_values.shape != expected:
        raise HurraySchemaError(f"scales of shape {scale_values.shape} given, {expected} expected")
    block_order = 0 if scheme == QuantScheme.PER_CHANNEL_AFFINE else axis
    flat_scales = np.moveaxis(scale_values, block_order, -1).reshape(-1)
    if scheme == QuantScheme.PER_BLOCK_AFFINE:
        scale_type = element_type(scale_type) if scale_type is not None else float_type(scale_values.dtype)
        if scale_type not in SCALE_TYPES:
            raise HurraySchemaError("per-block scales are float16, bfloat16 or float32")
    else:
        scale_type = ElementType.FLOAT32
    from ..evaluate.elements import numpy_dtype

    scale_dtype = numpy_dtype(scale_type)
    scale_buffer = little_endian(flat_scales.astype(scale_dtype), scale_dtype)
    buffers = [_packed(codes.reshape(-1), info.bit_width) if info.bit_width < 8
               else little_endian(codes, _code_dtype(storage)), scale_buffer]
    if zero_points is not None:
        zero_values = np.asarray(zero_points)
        if zero_values.shape != expected or zero_values.dtype.kind not in "iu":
            raise HurraySchemaError(f"zero points must be integers of shape {expected}")
        if scheme == QuantScheme.NF4:
            raise HurraySchemaError("NF4 has no zero points (quantization/nf4.md)")
        buffers.append(little_endian(np.moveaxis(zero_values, block_order, -1).reshape(-1), np.int32))
    zero_index = NO_BUFFER_INDEX if zero_points is None else 2
    flags = QuantFlag.SYMMETRIC if zero_points is None else 0
    if scheme == QuantScheme.PER_CHANNEL_AFFINE:
        q = PerChannelAffine(axis=axis, scale_buffer_index=1, zero_point_buffer_index=zero_index, flags=flags)
    elif scheme == QuantScheme.PER_BLOCK_AFFINE:
        q = PerBlockAffine(axis=axis, block_size=block, scale_buffer_index=1, zero_point_buffer_index=zero_index,
                           flags=flags, scale_type_tag=scale_type)
    else:
        q = Nf4(axis=axis, block_size=block, scale_buffer_index=1)
    desc = _descriptor(storage, codes.shape, buffers[0].size, [b.size for b in buffers[1:]], q, None)
    return Tensor(desc, buffers, name=name)


def _storage_range(storage, info) -> tuple[int, int]:
    """The codes an integer storage type holds."""
    if info.is_float or info.bit_width > 32:
        raise HurraySchemaError(f"{storage.name.lower()} is no integer storage type")
    if info.is_signed:
        return -(1 << (info.bit_width - 1)), (1 << (info.bit_width - 1)) - 1
    return 0, (1 << info.bit_width) - 1


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
    storage = element_type(storage)
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
    return Tensor(desc, [raw, little_endian(scale_values, np.float32)], name=name)


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
    storage = element_type(storage)
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

    if scale_type is not None and element_type(scale_type) != ElementType.FLOAT32:
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
    return desc, [codes, little_endian(scales, np.float32)]


def _mxfp(arr, storage, axis, block_size, symmetric, scale_type, shard):
    from ..evaluate import quantize as kernels

    if scale_type is not None and element_type(scale_type) != ElementType.FLOAT8_E8M0:
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
