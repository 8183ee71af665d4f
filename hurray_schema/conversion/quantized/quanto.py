"""optimum-quanto checkpoints as ``QuantizedModelForCausalLM.save_pretrained`` writes them: the
model's ``model.safetensors`` (each quantized module's weight flattened by
``QTensor.save_to_state_dict``) and ``quanto_qmap.json`` beside it (module -> ``{"weights": qtype,
"activations": qtype}``); ``config.json`` names no ``quantization_config``
(:data:`.checkpoint.QUANTO_MAP_KEY`).  transformers' ``QuantoConfig`` quantizes but does not save.

* ``qint8`` (``WeightQBytesTensor``): ``<m>.weight._data`` int8 ``[out, in]`` and
  ``<m>.weight._scale`` ``[out, 1]`` in the weight's dtype; dequantized as ``scale * data``, one
  rounding to the scale's dtype.  That is per-channel affine along axis 0, symmetric
  (``quantization/per-channel-affine.md § Dequantization Formula``), the scale widened exactly to
  float32 (``§ Referenced Buffers``): the float32 product of an int8 and a float16 / bfloat16 is
  exact, so rounding it once to quanto's dtype gives quanto's bits.
* ``qint4`` / ``qint2`` (``WeightQBitsTensor``): ``<m>.weight._data._data`` uint8, the unsigned codes
  grouped as ``[out * in / group, group]`` (``group`` = ``in`` when quanto chose no group size)
  and packed along dim 0, row ``i`` in the low bits of byte row ``i``, row ``i + rows / 2`` in
  the next bits (``8 // bits`` rows to a byte); ``<m>.weight._scale`` and ``<m>.weight._shift``
  ``[out * in / group, 1]``.  With a float shift (quanto's default ``MaxOptimizer``) it dequantizes
  ``scale * q - shift``, two roundings to the weight's dtype: no spec scheme subtracts a float
  after a rounded product (per-block affine is ``s * (q - z)`` with an int32 ``z``,
  ``quantization/per-block-affine.md § Dequantization Formula``), and the shift is in general no
  integer multiple of the scale.  With an integer shift (``zeropoint=True``) it is
  ``scale * (q - shift)``: per-block affine along axis 1.

quanto does not record a module's ``in_features``; it takes it from the model it rebuilds.  When
the grouped shape leaves it open (a group of 32, 64, 96 or 128 could be the whole row), it is read
from ``config.json`` for the module names of Llama-like models (:func:`_in_features`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from .checkpoint import QuantizedLinear

__all__ = ["linears", "source", "dequantized", "parts_of"]

BITS = {"qint2": 2, "qint4": 4, "qint8": 8}
"""The weight qtypes read here (quanto's integer ones)."""

_FLOATS = ("float16", "bfloat16", "float32")


def _qmap(config: dict) -> dict:
    qmap = config.get("quantization_map")
    if not isinstance(qmap, dict):
        raise HurraySchemaError("quanto_qmap.json: not a JSON object of modules")
    for module, entry in qmap.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("weights"), str):
            raise HurraySchemaError(f"quanto_qmap.json: {module!r} has no 'weights' qtype name")
    return qmap


def linears(sources: Mapping, config: dict) -> dict:
    """``{<m>.weight: QuantizedLinear}`` for each module the quantization map quantizes whose weight
    the checkpoint holds flattened."""
    out = {}
    for module, entry in _qmap(config).items():
        qtype = entry["weights"]
        if qtype == "none":
            continue
        weight = module + ".weight"
        if weight in sources:
            continue  # saved unfrozen: a plain weight, copied as it is
        if qtype not in BITS:
            raise HurraySchemaError(f"{weight}: quanto weights {qtype!r} are not read here; one of {sorted(BITS)}")
        names = ({"data": weight + "._data", "scale": weight + "._scale"} if BITS[qtype] == 8 else
                 {"data": weight + "._data._data", "scale": weight + "._scale", "shift": weight + "._shift"})
        missing = [name for name in names.values() if name not in sources]
        if missing:
            raise HurraySchemaError(f"{weight}: quanto {qtype} parts {missing} are not in the checkpoint")
        shapes = {part: tuple(sources[name].shape) for part, name in names.items()}
        shape = _shape(weight, qtype, shapes, config)
        group = "" if BITS[qtype] == 8 else f" g{_group(shape, shapes['scale'])}"
        out[weight] = QuantizedLinear(names, f"quanto {qtype}{group}", shape)
    return out


def _group(shape: tuple, scale_shape: tuple) -> int:
    return shape[0] * shape[1] // scale_shape[0]


def quanto_group_size(in_features: int):
    """The group size quanto's ``QModuleMixin`` picks for a 2- or 4-bit weight of ``in_features``
    (128, else the largest of 96, 64, 32 dividing it, when ``in_features > 128``); None: no groups."""
    group = 128
    if in_features > group:
        while in_features % group and group > 32:
            group -= 32
        if in_features % group == 0:
            return group
    return None


def _shape(weight: str, qtype: str, shapes: dict, config: dict) -> tuple:
    """The dense ``[out, in]`` of the parts' shapes (the qbits grouping undone)."""
    data, scale = shapes["data"], shapes["scale"]
    if len(data) != 2 or len(scale) != 2 or scale[1] != 1:
        raise HurraySchemaError(f"{weight}: quanto {qtype} data {list(data)} and scale {list(scale)} are not "
                                "[rows, cols] and [rows, 1]")
    if BITS[qtype] == 8:
        if scale[0] != data[0]:
            raise HurraySchemaError(f"{weight}: quanto qint8 scale {list(scale)} for data {list(data)}; "
                                    f"[{data[0]}, 1] expected")
        return tuple(data)
    rows, cols = scale[0], data[1]
    per = 8 // BITS[qtype]
    if shapes["shift"] != scale or data[0] != -(-rows // per) or cols <= 0:
        raise HurraySchemaError(f"{weight}: quanto {qtype} data {list(data)}, scale {list(scale)}, shift "
                                f"{list(shapes['shift'])}: {rows} rows of codes pack into [{-(-rows // per)}, "
                                f"cols] and the shift has the scale's shape")
    if quanto_group_size(cols) is not None or cols > 128 or cols % 32:
        return rows, cols  # no group size: one row of codes per output feature
    inp = _in_features(weight, config.get("model_config") or {})
    if inp is None:
        raise HurraySchemaError(f"{weight}: quanto {qtype} codes in rows of {cols} are whole rows or groups of "
                                "longer ones; config.json gives no in_features for this module")
    if inp == cols and quanto_group_size(inp) is None:
        return rows, cols
    if quanto_group_size(inp) == cols and (rows * cols) % inp == 0:
        return rows * cols // inp, inp
    raise HurraySchemaError(f"{weight}: quanto {qtype} codes in rows of {cols} do not fit {inp} in_features")


def _in_features(weight: str, model_config: dict):
    """``in_features`` of a Llama-like model's linear named ``weight``, from ``config.json``."""
    hidden = model_config.get("hidden_size")
    suffix = weight.rsplit(".", 2)[-2] if weight.count(".") >= 1 else ""
    if suffix in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"):
        return hidden if isinstance(hidden, int) else None
    if suffix == "o_proj":
        heads = model_config.get("num_attention_heads")
        head_dim = model_config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else None)
        return heads * head_dim if isinstance(heads, int) and isinstance(head_dim, int) else None
    if suffix == "down_proj":
        inter = model_config.get("intermediate_size")
        return inter if isinstance(inter, int) else None
    return None


def _qtype(weight: str, config: dict) -> str:
    module = weight[: -len(".weight")]
    entry = _qmap(config).get(module)
    if entry is None or entry["weights"] not in BITS:
        raise HurraySchemaError(f"{weight}: quanto_qmap.json gives no integer weight qtype for {module!r}")
    return entry["weights"]


def _float_dtype(weight: str, part: str, array) -> np.dtype:
    array = np.asarray(array)
    if array.dtype.name not in _FLOATS:
        raise HurraySchemaError(f"{weight}: quanto {part} is {array.dtype}; float16, bfloat16 or float32 expected")
    return array.dtype


def _checked(weight: str, arrays: Mapping, config: dict):
    """(qtype, dense shape, codes as ``[rows, cols]`` uint8 or int8, scale, shift or None)."""
    qtype = _qtype(weight, config)
    data = np.asarray(arrays["data"])
    scale = np.asarray(arrays["scale"])
    shift = np.asarray(arrays["shift"]) if "shift" in arrays else None
    shapes = {"data": data.shape, "scale": scale.shape}
    if shift is not None:
        shapes["shift"] = shift.shape
    shape = _shape(weight, qtype, shapes, config)
    dtype = _float_dtype(weight, "scale", scale)
    if BITS[qtype] == 8:
        if data.dtype != np.int8:
            raise HurraySchemaError(f"{weight}: quanto qint8 data is {data.dtype}, not int8")
        return qtype, shape, data, scale, None
    if data.dtype != np.uint8:
        raise HurraySchemaError(f"{weight}: quanto {qtype} data is {data.dtype}, not packed uint8")
    if shift.dtype.kind == "f":
        if shift.dtype != dtype:
            raise HurraySchemaError(f"{weight}: quanto shift is {shift.dtype}, its scale {dtype}")
    elif shift.dtype != np.uint8 and shift.dtype != np.int8:
        raise HurraySchemaError(f"{weight}: quanto shift is {shift.dtype}; a float or an integer zero point expected")
    bits = BITS[qtype]
    per = 8 // bits
    mask = (1 << bits) - 1
    codes = np.concatenate([(data >> (bits * i)) & mask for i in range(per)], axis=0)[: scale.shape[0]]
    return qtype, shape, codes, scale, shift


def dequantized(weight: str, arrays: Mapping, config: dict) -> np.ndarray:
    """quanto's ``dequantize()`` in NumPy: ``scale * data`` (qint8); ``scale * q - shift`` (float
    shift) or ``scale * (q - shift)`` (integer shift), each operation rounded to the scale's dtype,
    then the groups put back into ``[out, in]``."""
    qtype, shape, codes, scale, shift = _checked(weight, arrays, config)
    dtype = scale.dtype
    wide = scale.astype(np.float32)
    if shift is None:
        return (wide * codes.astype(np.float32)).astype(dtype)
    if shift.dtype.kind == "f":
        product = (wide * codes.astype(np.float32)).astype(dtype)
        return (product.astype(np.float32) - shift.astype(np.float32)).astype(dtype).reshape(shape)
    centred = codes.astype(np.int8) - shift.astype(np.int8)
    return (wide * centred.astype(np.float32)).astype(dtype).reshape(shape)


def _require_scales(weight: str, scale: np.ndarray, section: str) -> None:
    wide = scale.astype(np.float32)
    if not (np.all(np.isfinite(wide)) and np.all(wide != 0)):
        raise HurraySchemaError(f"{weight}: quanto scales hold zero or non-finite values; every scale must be finite "
                                f"and non-zero ({section})")


def source(weight: str, arrays: Mapping, config: dict):
    """qint8: per-channel affine along axis 0, symmetric, the scales widened to float32.  qint4 /
    qint2 with an integer shift: per-block affine along axis 1; with a float shift:
    :class:`NoExactForm`."""
    from ...builders.quantized import quantized_from_codes

    qtype, shape, codes, scale, shift = _checked(weight, arrays, config)
    if shift is None:
        _require_scales(weight, scale, "quantization/per-channel-affine.md § Validity Constraints")
        return quantized_from_codes(codes, "per_channel", storage="int8", axis=0, scales=scale.reshape(-1),
                                    name=weight)
    if shift.dtype.kind == "f":
        raise NoExactForm(f"{weight}: quanto {qtype} dequantizes scale * q - shift with a float shift, rounding the "
                          "product and then the difference; per-block affine is s * (q - z) with an int32 z rounded "
                          "once (quantization/per-block-affine.md § Referenced Buffers, § Dequantization Formula), "
                          "and the shift is no integer multiple of the scale in general")
    cols = codes.shape[1]
    out, inp = shape
    if cols < 2 or cols & (cols - 1):
        raise NoExactForm(f"{weight}: quanto {qtype} groups of {cols} are not a power of two, which a per-block "
                          "affine block size must be (quantization/per-block-affine.md § Binary Encoding)")
    _require_scales(weight, scale, "quantization/per-block-affine.md § Validity Constraints")
    blocks = inp // cols
    return quantized_from_codes(codes.reshape(shape), "per_block", storage=f"uint{BITS[qtype]}", axis=1,
                                scales=scale.reshape(out, blocks), zero_points=shift.astype(np.int32).reshape(out, blocks),
                                block_size=cols, scale_type=scale.dtype.name, name=weight)


def _scale_dtype(weight: str, config: dict) -> np.dtype:
    """The weights' dtype of the model (``config.json``'s ``dtype`` / ``torch_dtype``,
    :data:`.checkpoint.MODEL_DTYPE_KEY`), quanto's scale dtype."""
    from .checkpoint import MODEL_DTYPE_KEY

    name = config.get(MODEL_DTYPE_KEY)
    if name not in _FLOATS:
        raise NoExactForm(f"{weight}: config.json's dtype {name!r} is no quanto scale dtype (float16, bfloat16, "
                          "float32): the scales' dtype is unknown")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def parts_of(weight: str, tensor, config: dict) -> dict:
    """A per-channel affine int8 tensor along axis 0, symmetric, as quanto's qint8 parts
    (``_data`` int8, ``_scale`` ``[out, 1]`` in the model's dtype, which must hold each float32
    scale exactly); any other scheme :class:`NoExactForm` (quanto's 2- and 4-bit weights carry a
    float shift the Hurray schemes do not)."""
    from ...model import NO_BUFFER_INDEX, ElementType, PerChannelAffine

    q = getattr(tensor.descriptor, "quantization", None)
    if not (isinstance(q, PerChannelAffine) and q.axis == 0 and q.zero_point_buffer_index == NO_BUFFER_INDEX
            and tensor.descriptor.type_tag == ElementType.INT8 and len(tensor.shape) == 2):
        raise NoExactForm(f"{weight}: quanto's layout holds per-channel affine int8 along axis 0, symmetric "
                          "(qint8); this tensor's scheme has no quanto form")
    dtype = _scale_dtype(weight, config)
    scales = np.frombuffer(tensor.buffers[q.scale_buffer_index], "<f4")
    narrowed = scales.astype(dtype)
    if not np.array_equal(narrowed.astype(np.float32).view(np.uint32), scales.view(np.uint32)):
        raise NoExactForm(f"{weight}: float32 scales that {dtype.name} does not hold exactly have no quanto form")
    codes = tensor.to_numpy(raw=True).astype(np.int8)
    return {weight + "._data": codes, weight + "._scale": narrowed.reshape(-1, 1)}

