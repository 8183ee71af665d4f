"""HQQ (Half-Quadratic Quantization, the ``hqq`` library) checkpoints as ``HQQLinear.state_dict``
writes them to safetensors (hqq's ``save_to_safetensors``; transformers' HQQ integration keeps the
same keys and writes ``quantization_config = {"quant_method": "hqq", "quant_config": ...}``).

Each quantized linear ``<prefix>`` holds:

* ``<prefix>.W_q`` uint8: the codes grouped (``axis`` 1: the weight's row-major elements cut into
  rows of ``group_size``, ``[out * in / group_size, group_size]``; ``axis`` 0: ``[group_size,
  out * in / group_size]``, group ``j`` the column ``j``), packed along dim 0 with the first rows in
  the high bits: 4 bits (``4bit_u8``) row ``i`` in the high nibble of byte row ``i`` and row
  ``i + rows / 2`` in its low nibble; likewise 2 and 1 bits (``2bit_u8``, ``1bit_u8``, four and
  eight rows to a byte) and 8, 6 or 5 bits one code a byte (``8bit_u8``).  3 bits (``3bit_32``,
  int32 words) are not read here;
* ``<prefix>.scale`` / ``<prefix>.zero``: one per group (``[groups, 1]`` for axis 1, ``[1, groups]``
  for axis 0), in the compute dtype; the zero is a float;
* metadata as tiny tensors: ``nbits``, ``group_size``, ``axis`` (int32), ``shape`` (int64
  ``[out, in]``), ``packing`` / ``compute_dtype`` / ``unpack_view_dtype`` (uint8 text), booleans as
  uint8 (``view_as_float``, ``quant_scale``, ``quant_zero``, ``channel_wise``, ``optimize``,
  ``round_zero``, ``offload_meta``, ``encoded_state_dict``, ``stores_quant_config``).

hqq dequantizes ``((q - zero) * scale).reshape(shape)`` in the compute dtype, each operation
rounded to it (``Quantizer.dequantize``).  The spec's per-block affine is ``s * (q - z)`` in float32
with an int32 ``z`` (``quantization/per-block-affine.md § Referenced Buffers``, ``§ Dequantization
Formula``): the same bits when every zero is an integer (``q - zero`` then exact in the compute
dtype, and the float32 product rounds once to it, as hqq's product does) and the groups are blocks
along one axis of the weight (``§ Block Layout``): ``axis`` 1 with ``group_size`` a power of two
dividing ``in``, or ``axis`` 0 with ``group_size == out``.  hqq's optimizer (``optimize=True``, its
default) leaves float zeros: those tensors have no exact form.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from .checkpoint import QuantizedLinear

__all__ = ["linears", "source", "dequantized", "parts_of"]

META = ("nbits", "group_size", "shape", "axis", "packing", "unpack_view_dtype", "view_as_float", "quant_scale",
        "quant_zero", "compute_dtype", "offload_meta", "encoded_state_dict", "stores_quant_config", "channel_wise",
        "optimize", "round_zero")
"""The metadata tensors ``HQQLinear.state_dict`` writes beside ``W_q``, ``scale`` and ``zero``."""

REQUIRED = ("W_q", "scale", "zero", "nbits", "group_size", "shape", "axis", "packing")

UNREAD = ("zero_scale", "scale_q", "zero_q", "meta_scale", "meta_zero")
"""hqq's quantized-metadata parts (deprecated, not serializable by hqq itself): refused."""

PACKINGS = {8: "8bit_u8", 6: "8bit_u8", 5: "8bit_u8", 4: "4bit_u8", 2: "2bit_u8", 1: "1bit_u8"}
"""nbits -> hqq's packing of them (``Quantizer.bit_to_packing``), the ones read here."""

PACKED_BITS = {"8bit_u8": 8, "4bit_u8": 4, "2bit_u8": 2, "1bit_u8": 1}

STORAGE = {8: "uint8", 4: "uint4", 2: "uint2", 1: "uint2"}
"""The per-block affine storage type of each packing's codes (``quantization/per-block-affine.md
§ Valid Storage Types`` has no 1-bit type: 1-bit codes are held by uint2)."""

COMPUTE_TYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}

_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24}
"""Significant bits of each compute dtype: integers up to ``2 ** bits`` are exact in it."""


def linears(sources: Mapping, config: dict) -> dict:
    """``{prefix.weight: QuantizedLinear}`` for each ``<prefix>.W_q`` of the checkpoint."""
    out = {}
    for name in sources:
        if not name.endswith(".W_q"):
            continue
        prefix = name[: -len(".W_q")]
        weight = prefix + ".weight"
        for part in UNREAD:
            if prefix + "." + part in sources:
                raise HurraySchemaError(f"{weight}: HQQ's quantized scale / zero ({prefix}.{part}) is not read here")
        parts = {part: prefix + "." + part for part in ("W_q", "scale", "zero") + META if prefix + "." + part in sources}
        missing = [part for part in REQUIRED if part not in parts]
        if missing:
            raise HurraySchemaError(f"{weight}: HQQ parts {missing} are missing beside {name}")
        meta = {part: sources[parts[part]].values() for part in ("nbits", "group_size", "axis", "shape")}
        shape = _shape(weight, meta["shape"])
        nbits, group_size, axis = (_int(weight, part, meta[part]) for part in ("nbits", "group_size", "axis"))
        out[weight] = QuantizedLinear(parts, f"hqq int{nbits} g{group_size} axis{axis}", shape)
    return out


def _int(weight: str, part: str, array) -> int:
    array = np.asarray(array)
    if array.size != 1 or array.dtype.kind not in "iu":
        raise HurraySchemaError(f"{weight}: HQQ {part} is not one integer ({array.dtype}{array.shape})")
    return int(array.reshape(-1)[0])


def _flag(weight: str, part: str, arrays: Mapping) -> bool:
    if part not in arrays:
        return False
    value = _int(weight, part, arrays[part])
    if value not in (0, 1):
        raise HurraySchemaError(f"{weight}: HQQ {part} is {value}, not a boolean")
    return bool(value)


def _text(weight: str, part: str, array) -> str:
    array = np.asarray(array)
    if array.ndim != 1 or array.dtype != np.uint8:
        raise HurraySchemaError(f"{weight}: HQQ {part} is not text (uint8 characters), {array.dtype}{array.shape}")
    return bytes(array.tolist()).decode("latin-1")


def _shape(weight: str, array) -> tuple:
    array = np.asarray(array)
    if array.shape != (2,) or array.dtype.kind not in "iu" or int(array.min()) <= 0:
        raise HurraySchemaError(f"{weight}: HQQ shape {array.tolist()} is not [out_features, in_features]")
    return tuple(int(n) for n in array)


def _layout(weight: str, arrays: Mapping) -> dict:
    """The linear's metadata checked against its parts' shapes and dtypes: ``shape``, ``group_size``,
    ``axis``, ``groups``, ``compute`` (the compute dtype's name) and the grouped codes ``[rows, cols]``."""
    nbits = _int(weight, "nbits", arrays["nbits"])
    group_size = _int(weight, "group_size", arrays["group_size"])
    axis = _int(weight, "axis", arrays["axis"])
    shape = _shape(weight, arrays["shape"])
    packing = _text(weight, "packing", arrays["packing"])
    if PACKINGS.get(nbits) != packing:
        raise HurraySchemaError(f"{weight}: HQQ nbits {nbits} packed {packing!r}; read here: "
                                + ", ".join(f"{bits} bits packed {name!r}" for bits, name in PACKINGS.items()))
    if axis not in (0, 1):
        raise HurraySchemaError(f"{weight}: HQQ axis {axis}, not 0 or 1")
    if _flag(weight, "view_as_float", arrays) or _flag(weight, "quant_scale", arrays) or \
            _flag(weight, "quant_zero", arrays):
        raise HurraySchemaError(f"{weight}: HQQ codes viewed as float, or quantized scales / zeros, are not read here")
    if "channel_wise" in arrays and not _flag(weight, "channel_wise", arrays):
        raise HurraySchemaError(f"{weight}: HQQ channel_wise=False (one scale for the tensor) is not read here")
    compute = "float16"
    if "compute_dtype" in arrays:
        text = _text(weight, "compute_dtype", arrays["compute_dtype"])
        if text not in COMPUTE_TYPES:
            raise HurraySchemaError(f"{weight}: HQQ compute_dtype {text!r}; one of {sorted(COMPUTE_TYPES)}")
        compute = COMPUTE_TYPES[text]
    out, inp = shape
    count = out * inp
    if group_size <= 0 or count % group_size:
        raise HurraySchemaError(f"{weight}: HQQ group size {group_size} does not divide the {count} elements of {shape}")
    groups = count // group_size
    rows, cols = (groups, group_size) if axis == 1 else (group_size, groups)
    codes = np.asarray(arrays["W_q"])
    per = 8 // PACKED_BITS[packing]
    if codes.dtype != np.uint8 or rows % per or codes.shape != (rows // per, cols):
        raise HurraySchemaError(f"{weight}: HQQ W_q is {codes.dtype}{list(codes.shape)}; {shape} in groups of "
                                f"{group_size} along axis {axis} packs into uint8{[rows // per, cols]}")
    grouped = (groups, 1) if axis == 1 else (1, groups)
    for part in ("scale", "zero"):
        array = np.asarray(arrays[part])
        if array.shape != grouped or _float_name(array) is None:
            raise HurraySchemaError(f"{weight}: HQQ {part} is {array.dtype}{list(array.shape)}; one float per group "
                                    f"{list(grouped)} expected")
    return {"shape": shape, "group_size": group_size, "axis": axis, "groups": groups, "compute": compute,
            "rows": rows, "cols": cols, "nbits": nbits, "packed_bits": PACKED_BITS[packing]}


def _float_name(array) -> str | None:
    name = np.asarray(array).dtype.name
    return name if name in _MANTISSA else None


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _grouped(arrays: Mapping, layout: dict) -> np.ndarray:
    """The codes ``[rows, cols]`` (hqq's ``BitPack.unpack_<n>bit_u8``: the first rows in the high bits)."""
    packed = np.asarray(arrays["W_q"])
    bits = layout["packed_bits"]
    mask = (1 << bits) - 1
    return np.concatenate([(packed >> (8 - bits * (i + 1))) & mask for i in range(8 // bits)], axis=0)


def _codes(arrays: Mapping, layout: dict) -> np.ndarray:
    """The codes in the weight's shape (unpacked, then hqq's ``reshape``)."""
    return _grouped(arrays, layout).reshape(layout["shape"])


def dequantized(weight: str, arrays: Mapping, config: dict) -> np.ndarray:
    """hqq's ``Quantizer.dequantize``: ``(q - zero) * scale`` in the compute dtype, each operation
    rounded to it (the scale and zero cast to it first, as ``HQQLinear`` does when it loads)."""
    layout = _layout(weight, arrays)
    dtype = _dtype(layout["compute"])
    grouped = _grouped(arrays, layout).astype(np.float32)
    zero = np.asarray(arrays["zero"]).astype(dtype).astype(np.float32)
    scale = np.asarray(arrays["scale"]).astype(dtype).astype(np.float32)
    shifted = (grouped - zero).astype(dtype).astype(np.float32)
    return (shifted * scale).astype(dtype).reshape(layout["shape"])


def source(weight: str, arrays: Mapping, config: dict):
    """The per-block affine tensor of a linear whose zeros are integers and whose groups are blocks
    along one axis of the weight; :class:`NoExactForm` otherwise."""
    from ...builders.quantized import quantized_from_codes

    layout = _layout(weight, arrays)
    out, inp = layout["shape"]
    group_size, axis, compute = layout["group_size"], layout["axis"], layout["compute"]
    if group_size < 2 or group_size & (group_size - 1):
        raise NoExactForm(f"{weight}: HQQ group size {group_size} is not a power of two, which a per-block affine "
                          "block size must be (quantization/per-block-affine.md § Binary Encoding)")
    if axis == 1 and inp % group_size:
        raise NoExactForm(f"{weight}: HQQ groups of {group_size} along axis 1 run across rows of {inp} input features; "
                          "per-block affine blocks lie within one row (quantization/per-block-affine.md § Block Layout)")
    if axis == 0 and group_size != out:
        raise NoExactForm(f"{weight}: HQQ axis-0 groups of {group_size} take every {out * inp // group_size}-th element "
                          f"of {out}x{inp}, not consecutive elements along an axis (quantization/per-block-affine.md "
                          "§ Block Layout)")
    dtype = _dtype(compute)
    zero = np.asarray(arrays["zero"]).astype(dtype).astype(np.float64)
    scale = np.asarray(arrays["scale"]).astype(dtype)
    whole = np.isfinite(zero) & (zero == np.round(zero))
    if not whole.all():
        first = int(np.argmin(whole.reshape(-1)))
        raise NoExactForm(f"{weight}: HQQ's zero is a float ({float(zero.reshape(-1)[first])!r} in group {first}); "
                          "per-block affine zero points are int32 (quantization/per-block-affine.md § Referenced "
                          "Buffers), so (q - zero) * scale has no exact form")
    reach = float(np.max(np.abs(zero))) + (1 << layout["nbits"]) - 1 if zero.size else 0.0
    if reach > 2.0 ** _MANTISSA[compute] or reach >= 2.0 ** 31:
        raise NoExactForm(f"{weight}: HQQ's zeros reach {reach:g}, where q - zero rounds in {compute}; per-block "
                          "affine subtracts exactly (quantization/per-block-affine.md § Dequantization Formula)")
    wide = scale.astype(np.float32)
    if not (np.all(np.isfinite(wide)) and np.all(wide != 0)):
        raise HurraySchemaError(f"{weight}: HQQ scales hold zero or non-finite values; every per-block affine scale "
                                "must be finite and non-zero (quantization/per-block-affine.md § Validity Constraints)")
    codes = _codes(arrays, layout)
    if axis == 1:
        scales = scale.reshape(out, inp // group_size)
        zeros = zero.astype(np.int32).reshape(out, inp // group_size)
        block_axis = 1
    else:
        scales = scale.reshape(1, inp)
        zeros = zero.astype(np.int32).reshape(1, inp)
        block_axis = 0
    return quantized_from_codes(codes, "per_block", storage=STORAGE[layout["packed_bits"]], axis=block_axis, scales=scales,
                                zero_points=zeros, block_size=group_size, scale_type=compute, name=weight)


def parts_of(weight: str, tensor, config: dict) -> dict:
    """The way back to HQQ's layout is not written: :class:`NoExactForm`."""
    raise NoExactForm(f"{weight}: writing HQQ's layout back is not supported; its checkpoints load through hqq's "
                      "own serialization, which a Hurray file does not replace")

