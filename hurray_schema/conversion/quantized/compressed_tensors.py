"""compressed-tensors checkpoints (``quant_method`` "compressed-tensors", format ``pack-quantized``)
into Hurray's per-block and per-channel affine schemes, and back.

What compressed-tensors writes for one quantized linear ``<m>`` (its ``PackedQuantizationCompressor``):

* ``<m>.weight_packed``: int32 ``[out, ceil(in * bits / 32)]``; code ``q`` (signed, within
  ``[-2**(bits-1), 2**(bits-1) - 1]``) stored as ``q + 2**(bits-1)`` unsigned, element ``i`` of a
  row at bit ``i * bits`` of the row's words, least significant first (dense: 3-bit codes cross
  words); the last word's unused bits are zero;
* ``<m>.weight_scale``: the model's float type, ``[out, in / group]`` (group), ``[out, 1]``
  (channel) or ``[1]`` (tensor);
* ``<m>.weight_zero_point`` (asymmetric only): group / channel strategies pack it as the codes,
  ``z + 2**(bits-1)``, along the *output* axis: int32 ``[ceil(out * bits / 32), scale columns]``;
* ``<m>.weight_shape``: int64 ``[out, in]``.

Its dequantization (``quantization/lifecycle/forward.py::_dequantize``) is, in the scales' dtype:
``q.to(s.dtype) - z.to(s.dtype)``, then ``* s``.  ``q - z`` is a small integer, exact in float16
and bfloat16, and its product with ``s`` is exact in float32, so the library's result is that
float32 product rounded once to the scales' dtype: ``quantization/per-block-affine.md
§ Dequantization Formula`` with ``scale_type`` = the scales' dtype, decoded in it.

* group strategy, 2 / 4 / 8 bits, group a power of two -> per-block affine ``[out, in]``, axis 1,
  ``block_size`` = group, scales as stored, int codes (``q``) and int32 zero points (``z``) when
  asymmetric (SYMMETRIC otherwise): the values the library holds, unchanged;
* channel (and tensor) strategy -> per-channel affine along axis 0 (``per-channel-affine.md``),
  scales widened exactly to float32 (a tensor scale repeated per row); decoded in float32 and
  rounded once to the library's dtype, that is again the library's result.

The ``int-quantized`` / ``naive-quantized`` formats (W8A8: ``<m>.weight`` int8 as the codes are,
zero points int8 shaped like the scales, no ``weight_shape``) are read the same way.  Their
float-typed weights (FP8 ``float-quantized``) are left as the tensors they are; packed float
formats (``nvfp4-pack-quantized`` ...) are refused, not read here.

No exact form (:class:`NoExactForm`): 1, 3, 5, 6 and 7 bits (``element-types.md § Sub-Byte Integer
Types`` has 2- and 4-bit integers besides int8; 3-bit codes widened to int4 would cost 4/3 of their
bytes), a group that is no power of two (``per-block-affine.md § Validity Constraints``), the
block strategy (2-D blocks).

The way back (:func:`parts_of`) writes the parts above from a per-block (axis 1) or per-channel
(axis 0) integer tensor; unsigned codes (another library's ``q`` with zero points ``z``) become
``q - 2**(bits-1)`` and ``z - 2**(bits-1)``, the same differences.  Per-channel scales return
to the model's dtype (the carried ``config.json``'s ``dtype``) when every one is exact in it,
else stay float32.  :func:`config_for` writes the ``quantization_config`` of a file whose
quantized tensors come from elsewhere (GPTQ, AWQ ...), one config group per scheme, its targets
the modules' names.
"""

from __future__ import annotations

import json
import math
import re
from typing import Mapping, Optional

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from .checkpoint import CONFIG_KEY, MODEL_DTYPE_KEY, QuantizedLinear
from .packing import pack_words, unpack_words

__all__ = ["linears", "source", "dequantized", "parts_of", "config_for", "FORMAT", "PACKED_BITS"]

FORMAT = "pack-quantized"
"""The compressed-tensors format written here (and read)."""

UNPACKED = ("int-quantized", "naive-quantized")
"""Formats that keep integer weights as they are (``<m>.weight`` int8, zero points unpacked), also read."""

PACKED_BITS = {2: "int2", 4: "int4", 8: "int8"}
"""Bit widths with a Hurray integer storage type (``element-types.md § Sub-Byte Integer Types``)."""

_STRATEGIES = ("group", "channel", "tensor")
_SCALE_DTYPES = ("float16", "bfloat16", "float32")


# -- the scheme of one module -------------------------------------------------------------------

class _Args:
    """The weight quantization arguments of one module (a config group's ``weights``)."""

    __slots__ = ("bits", "strategy", "group", "symmetric", "fmt")

    @property
    def packed(self) -> bool:
        return self.fmt == FORMAT

    def __init__(self, bits, strategy, group, symmetric, fmt):
        self.bits, self.strategy, self.group, self.symmetric, self.fmt = bits, strategy, group, symmetric, fmt

    def text(self) -> str:
        parts = [f"compressed-tensors {self.fmt} int{self.bits}"]
        parts.append(f"g{self.group}" if self.strategy == "group" else self.strategy)
        parts.append("sym" if self.symmetric else "asym")
        return " ".join(parts)


def _groups(config: dict) -> dict:
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise HurraySchemaError("compressed-tensors quantization_config: config_groups is not a non-empty object")
    for key, group in groups.items():
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list) \
                or not all(isinstance(t, str) for t in group["targets"]):
            raise HurraySchemaError(f"compressed-tensors quantization_config: config group {key!r} has no list "
                                    "of target strings")
    return groups


def _matches(target: str, module: str) -> bool:
    """compressed-tensors' ``match_name``: ``re:<pattern>`` matched from the start, else the exact name."""
    if target.startswith("re:"):
        try:
            return re.match(target[3:], module) is not None
        except re.error:
            raise HurraySchemaError(f"compressed-tensors quantization_config: target {target!r} is no regular "
                                    "expression") from None
    return target == module


def _ignored(config: dict, module: str) -> bool:
    ignore = config.get("ignore") or []
    if not isinstance(ignore, list):
        raise HurraySchemaError("compressed-tensors quantization_config: ignore is not a list")
    return any(isinstance(t, str) and _matches(t, module) for t in ignore)


def _class_target(target: str) -> bool:
    """A target naming a module class ("Linear"; CamelCase), which takes any linear."""
    return target.isidentifier() and target[:1].isupper()


def _group_of(config: dict, module: str) -> dict:
    """The config group whose targets take ``module``: a name / regex target before a class-name
    one ("Linear", taking any linear: only names are seen here), as compressed-tensors prefers
    the narrowest match."""
    groups = _groups(config)
    by_name = [g for g in groups.values() if any(_matches(t, module) for t in g["targets"])]
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        raise HurraySchemaError(f"{module}: more than one compressed-tensors config group names it")
    by_class = [g for g in groups.values() if any(_class_target(t) for t in g["targets"])]
    if len(by_class) == 1:
        return by_class[0]
    raise HurraySchemaError(f"{module}: no single compressed-tensors config group targets it "
                            f"(groups {sorted(groups)})")


def _format(config: dict, module: str) -> Optional[str]:
    group = _group_of(config, module)
    return group.get("format") or config.get("format")


def _int_weights(config: dict, module: str) -> bool:
    weights = _group_of(config, module).get("weights")
    return isinstance(weights, dict) and weights.get("type", "int") == "int"


def _args(config: dict, module: str) -> _Args:
    group = _group_of(config, module)
    fmt = group.get("format") or config.get("format")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise HurraySchemaError(f"{module}: its compressed-tensors config group quantizes no weights")
    bits = weights.get("num_bits")
    strategy = weights.get("strategy")
    group_size = weights.get("group_size")
    symmetric = weights.get("symmetric", True)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise HurraySchemaError(f"{module}: compressed-tensors num_bits {bits!r} is not 1 to 8")
    if not isinstance(symmetric, bool):
        raise HurraySchemaError(f"{module}: compressed-tensors symmetric {symmetric!r} is not a boolean")
    if strategy is None:  # QuantizationArgs' inference
        strategy = "tensor" if group_size is None else "channel" if group_size == -1 else "group"
    if strategy == "group":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise HurraySchemaError(f"{module}: compressed-tensors group strategy with group_size {group_size!r}")
    elif not isinstance(strategy, str):
        raise HurraySchemaError(f"{module}: compressed-tensors strategy {strategy!r} is not a name")
    if weights.get("type", "int") != "int":
        raise HurraySchemaError(f"{module}: compressed-tensors weights of type {weights.get('type')!r}; "
                                "pack-quantized holds integers")
    return _Args(bits, strategy, group_size if strategy == "group" else None, symmetric, fmt or FORMAT)


# -- linears -----------------------------------------------------------------------------------

def linears(sources: Mapping, config: dict) -> dict:
    """dense weight name -> :class:`QuantizedLinear` of every ``<m>.weight_packed`` the checkpoint
    holds (and of every ``<m>.weight`` with a ``<m>.weight_scale`` of an int-quantized /
    naive-quantized integer scheme), its parts' names, shapes and dtypes checked against the
    config's scheme (the tiny ``weight_shape`` tensor read).  Other tensors (float-quantized FP8
    weights and their scales ...) are left as they are."""
    _groups(config)
    out = {}
    for name in sources:
        if name.endswith(".weight_scale") and name[: -len("_scale")] in sources \
                and name[: -len("_scale")] + "_packed" not in sources:
            module = name[: -len(".weight_scale")]
            if not _ignored(config, module) and _format(config, module) in UNPACKED and _int_weights(config, module):
                out[module + ".weight"] = _unpacked_linear(module, sources, config)
            continue
        if not name.endswith(".weight_packed"):
            continue
        module = name[: -len(".weight_packed")]
        if _ignored(config, module):
            raise HurraySchemaError(f"{module}: packed weights, but the compressed-tensors config ignores it")
        args = _args(config, module)
        if args.fmt != FORMAT:
            raise HurraySchemaError(f"{module}: packed weights, but its compressed-tensors format is {args.fmt!r}")
        parts = {"weight_packed": name, "weight_scale": module + ".weight_scale",
                 "weight_shape": module + ".weight_shape"}
        if not args.symmetric:
            parts["weight_zero_point"] = module + ".weight_zero_point"
        for part, part_name in parts.items():
            if part_name not in sources:
                raise HurraySchemaError(f"{module}: {part} ({part_name!r}) is not in the checkpoint")
        shape = _weight_shape(module, sources[parts["weight_shape"]].values())
        _check_shapes(module, args, shape, {part: (tuple(sources[n].shape), _dtype_name(sources[n]))
                                             for part, n in parts.items()})
        out[module + ".weight"] = QuantizedLinear(parts, args.text(), shape)
    return out


def _unpacked_linear(module: str, sources: Mapping, config: dict) -> QuantizedLinear:
    args = _args(config, module)
    parts = {"weight": module + ".weight", "weight_scale": module + ".weight_scale"}
    if not args.symmetric:
        parts["weight_zero_point"] = module + ".weight_zero_point"
        if parts["weight_zero_point"] not in sources:
            raise HurraySchemaError(f"{module}: weight_zero_point ({parts['weight_zero_point']!r}) is not in the "
                                    "checkpoint")
    shape = tuple(sources[parts["weight"]].shape)
    if len(shape) != 2:
        raise HurraySchemaError(f"{module}: weight of shape {list(shape)}; a linear's is [out, in]")
    _check_shapes(module, args, shape, {part: (tuple(sources[n].shape), _dtype_name(sources[n]))
                                        for part, n in parts.items()})
    return QuantizedLinear(parts, args.text(), shape)


def _dtype_name(source) -> str:
    """A source tensor's dtype name (its values are a view of the input: nothing is read)."""
    return np.dtype(source.values().dtype).name


def _weight_shape(module: str, values) -> tuple:
    shape = np.asarray(values)
    if shape.dtype.kind not in "iu" or shape.shape != (2,) or int(shape.min()) <= 0:
        raise HurraySchemaError(f"{module}: weight_shape {shape.tolist()} ({shape.dtype}) is not two positive "
                                "integers [out_features, in_features]")
    return int(shape[0]), int(shape[1])


def _scale_shape(args: _Args, out: int, inn: int) -> tuple:
    if args.strategy == "group":
        return out, inn // args.group
    return (out, 1) if args.strategy == "channel" else (1,)


def _check_shapes(module: str, args: _Args, shape: tuple, parts: dict) -> None:
    """Each part's (shape, dtype name) against the weight's ``[out, in]`` and the scheme."""
    out, inn = shape
    words = math.ceil(inn * args.bits / 32)
    if args.packed and parts["weight_packed"] != ((out, words), "int32"):
        raise HurraySchemaError(f"{module}: weight_packed is {parts['weight_packed'][1]}{list(parts['weight_packed'][0])}; "
                                f"{args.bits}-bit codes of a [{out}, {inn}] weight pack into int32[{out}, {words}]")
    if not args.packed and parts["weight"] != ((out, inn), "int8"):
        raise HurraySchemaError(f"{module}: weight is {parts['weight'][1]}{list(parts['weight'][0])}; "
                                f"{args.fmt} keeps int8[{out}, {inn}]")
    if args.strategy == "group" and inn % args.group:
        raise HurraySchemaError(f"{module}: group size {args.group} does not divide in_features {inn}")
    scale_shape, scale_dtype = parts["weight_scale"]
    expected = _scale_shape(args, out, inn)
    if args.strategy in ("group", "channel", "tensor") and scale_shape != expected:
        raise HurraySchemaError(f"{module}: weight_scale of shape {list(scale_shape)}, {list(expected)} expected "
                                f"({args.strategy} strategy)")
    if scale_dtype not in _SCALE_DTYPES:
        raise HurraySchemaError(f"{module}: weight_scale is {scale_dtype}, not float16, bfloat16 or float32")
    if "weight_zero_point" in parts:
        zero_shape, zero_dtype = parts["weight_zero_point"]
        if args.packed and args.strategy in ("group", "channel"):
            zexpected = (math.ceil(out * args.bits / 32), expected[1]), "int32"
        else:
            zexpected = expected, "int8"
        if (zero_shape, zero_dtype) != zexpected:
            raise HurraySchemaError(f"{module}: weight_zero_point is {zero_dtype}{list(zero_shape)}, "
                                    f"{zexpected[1]}{list(zexpected[0])} expected")


# -- into Hurray -------------------------------------------------------------------------------

def _module(weight: str) -> str:
    if not weight.endswith(".weight"):
        raise HurraySchemaError(f"{weight}: a quantized linear's weight name ends with .weight")
    return weight[: -len(".weight")]


def _checked_arrays(weight: str, arrays: dict, config: dict):
    """(args, [out, in], parts as arrays) with shapes and dtypes checked."""
    module = _module(weight)
    args = _args(config, module)
    if args.packed:
        shape = _weight_shape(module, arrays.get("weight_shape"))
    else:
        shape = tuple(np.shape(arrays.get("weight")))
        if len(shape) != 2:
            raise HurraySchemaError(f"{module}: weight of shape {list(shape)}; a linear's is [out, in]")
    if not args.symmetric and "weight_zero_point" not in arrays:
        raise HurraySchemaError(f"{module}: asymmetric, but no weight_zero_point")
    parts = {part: (tuple(np.shape(a)), np.asarray(a).dtype.name) for part, a in arrays.items()}
    for part in ("weight_packed" if args.packed else "weight", "weight_scale"):
        if part not in parts:
            raise HurraySchemaError(f"{module}: no {part}")
    _check_shapes(module, args, shape, parts)
    return args, shape


def _unpacked(words: np.ndarray, bits: int, count: int, what: str) -> np.ndarray:
    """The signed codes of int32 ``words`` (rows of densely packed ``bits``-bit codes, the first
    ``count`` of each row), ``q = stored - 2**(bits-1)``; the unused bits must be zero."""
    if 32 % bits:
        raise NoExactForm(f"{what}: {bits}-bit codes have no Hurray storage type (element-types.md § Sub-Byte "
                          "Integer Types has 2-, 4- and 8-bit integers)")
    stored = unpack_words(np.ascontiguousarray(words), bits, axis=1)
    if stored.shape[1] > count and stored[:, count:].any():
        raise HurraySchemaError(f"{what}: the padding bits after the {count} codes of a row are not zero")
    return (stored[:, :count].astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def _zero_points(weight: str, args: _Args, arrays: dict, shape: tuple) -> Optional[np.ndarray]:
    """The signed zero points shaped like the scales, or None (symmetric)."""
    if args.symmetric:
        return None
    zero = np.asarray(arrays["weight_zero_point"])
    if args.packed and args.strategy in ("group", "channel"):
        return _unpacked(zero.T, args.bits, shape[0], f"{weight}: weight_zero_point").T
    lo, hi = -(1 << (args.bits - 1)), (1 << (args.bits - 1)) - 1
    if zero.size and (int(zero.min()) < lo or int(zero.max()) > hi):
        raise HurraySchemaError(f"{weight}: zero points outside [{lo}, {hi}]")
    return zero.astype(np.int8)


def _exact_scheme(weight: str, args: _Args) -> None:
    if args.bits not in PACKED_BITS:
        raise NoExactForm(f"{weight}: {args.bits}-bit codes have no Hurray storage type (element-types.md "
                          "§ Sub-Byte Integer Types: 2-, 4- and 8-bit integers)")
    if args.strategy == "group" and (args.group < 2 or args.group & (args.group - 1)):
        raise NoExactForm(f"{weight}: group size {args.group} is no power of two "
                          "(quantization/per-block-affine.md § Validity Constraints)")
    if args.strategy not in _STRATEGIES:
        raise NoExactForm(f"{weight}: the compressed-tensors {args.strategy} strategy has no Hurray scheme read "
                          "here (per-block affine blocks run along one axis: quantization/per-block-affine.md "
                          "§ Block Layout)")


def _codes(weight: str, args: _Args, arrays: dict, inn: int) -> np.ndarray:
    """The signed codes: unpacked (pack-quantized) or the int8 weight, within the bit width."""
    if args.packed:
        return _unpacked(arrays["weight_packed"], args.bits, inn, f"{weight}: weight_packed")
    codes = np.asarray(arrays["weight"])
    lo, hi = -(1 << (args.bits - 1)), (1 << (args.bits - 1)) - 1
    if codes.size and (int(codes.min()) < lo or int(codes.max()) > hi):
        raise HurraySchemaError(f"{weight}: codes outside [{lo}, {hi}] in a {args.bits}-bit scheme")
    return codes


def source(weight: str, arrays: dict, config: dict):
    """The Hurray tensor of one packed linear: per-block affine (group) or per-channel affine
    (channel, tensor) of the library's own codes, scales and zero points."""
    from ...builders import quantized_from_codes

    args, (out, inn) = _checked_arrays(weight, arrays, config)
    _exact_scheme(weight, args)
    codes = _codes(weight, args, arrays, inn)
    zeros = _zero_points(weight, args, arrays, (out, inn))
    scales = np.asarray(arrays["weight_scale"])
    storage = PACKED_BITS[args.bits]
    if args.strategy == "group":
        return quantized_from_codes(codes, "per_block", storage=storage, axis=1, scales=scales,
                                    zero_points=None if zeros is None else zeros.astype(np.int32),
                                    block_size=args.group, scale_type=scales.dtype.name)
    rows = np.broadcast_to(scales.reshape(-1), (out,)) if args.strategy == "tensor" else scales.reshape(out)
    zero_rows = None
    if zeros is not None:
        zero_rows = np.broadcast_to(zeros.reshape(-1), (out,)) if args.strategy == "tensor" else zeros.reshape(out)
        zero_rows = zero_rows.astype(np.int32)
    return quantized_from_codes(codes, "per_channel", storage=storage, axis=0, scales=rows.astype(np.float32),
                                zero_points=zero_rows)


def dequantized(weight: str, arrays: dict, config: dict) -> np.ndarray:
    """compressed-tensors' ``decompress`` of one packed linear in NumPy: ``q`` and ``z`` in the
    scales' dtype, ``(q - z) * s`` rounded once to it (every step before the product is exact;
    the product is exact in float32).  Any bit width 1 to 8 (3-bit codes cross words)."""
    args, (out, inn) = _checked_arrays(weight, arrays, config)
    if args.strategy not in _STRATEGIES:
        raise NoExactForm(f"{weight}: the compressed-tensors {args.strategy} strategy is not read here")
    if args.packed:
        codes = _dense_unpacked(np.asarray(arrays["weight_packed"]), args.bits, inn).astype(np.float32)
    else:
        codes = np.asarray(arrays["weight"]).astype(np.float32)
    scales = np.asarray(arrays["weight_scale"])
    if args.symmetric:
        zeros = np.zeros((1, 1), np.float32)
    elif args.packed and args.strategy in ("group", "channel"):
        zeros = _dense_unpacked(np.asarray(arrays["weight_zero_point"]).T, args.bits, out).T.astype(np.float32)
    else:
        zeros = np.asarray(arrays["weight_zero_point"]).astype(np.float32).reshape(scales.shape)
    s = scales.astype(np.float32)
    if args.strategy == "group":
        s = np.repeat(s, args.group, axis=1)
        zeros = np.repeat(zeros, args.group, axis=1) if zeros.shape == scales.shape else zeros
    else:
        s = s.reshape(-1, 1)
        zeros = zeros.reshape(-1, 1)
    with np.errstate(invalid="ignore", over="ignore"):  # inf or NaN scales give what torch gives, silently
        return ((codes - zeros) * s).astype(scales.dtype)


def _dense_unpacked(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """compressed-tensors' ``unpack_from_int32`` along rows: element ``i`` at bit ``i * bits`` of
    the row's words (crossing a word boundary where it falls there), minus ``2**(bits-1)``."""
    raw = np.ascontiguousarray(words, dtype=np.int32).view(np.uint32).astype(np.uint64)
    rows = raw.shape[0]
    padded = np.concatenate([raw, np.zeros((rows, 1), np.uint64)], axis=1)
    start = np.arange(count, dtype=np.int64) * bits
    word, offset = start // 32, (start % 32).astype(np.uint64)
    pair = padded[:, word] | (padded[:, word + 1] << np.uint64(32))
    codes = (pair >> offset) & np.uint64((1 << bits) - 1)
    return codes.astype(np.int16) - (1 << (bits - 1))


# -- back out ----------------------------------------------------------------------------------

def _signed_parts(weight: str, tensor):
    """(kind, bits, block, signed codes [out, in], scales, signed zero points or None) of a
    per-block (axis 1) or per-channel (axis 0) integer Hurray tensor."""
    from ...model import PerBlockAffine, PerChannelAffine, QuantFlag
    from ...structs.element_types import element_type_info
    from ...evaluate.elements import numpy_dtype

    desc = tensor.descriptor
    q = desc.quantization
    if len(desc.shape) != 2:
        raise NoExactForm(f"{weight}: compressed-tensors packs linears' [out, in] weights; this tensor has shape "
                          f"{list(desc.shape)}")
    info = element_type_info(desc.type_tag)
    bits = info.bit_width if info is not None and not info.is_float else None
    if bits not in PACKED_BITS:
        raise NoExactForm(f"{weight}: {getattr(desc.type_tag, 'name', desc.type_tag)} codes are not 2-, 4- or "
                          "8-bit integers")
    if isinstance(q, PerBlockAffine):
        if q.axis != 1:
            raise NoExactForm(f"{weight}: per-block along axis {q.axis}; compressed-tensors groups run along "
                              "in_features (axis 1)")
        if desc.shape[1] % q.block_size:
            raise NoExactForm(f"{weight}: blocks of {q.block_size} do not divide in_features {desc.shape[1]}; "
                              "compressed-tensors groups must")
        kind, scale_dtype = "group", numpy_dtype(q.scale_type_tag)
        count = desc.shape[0] * (desc.shape[1] // q.block_size)
        scale_shape = (desc.shape[0], desc.shape[1] // q.block_size)
    elif isinstance(q, PerChannelAffine):
        if q.axis != 0:
            raise NoExactForm(f"{weight}: per-channel along axis {q.axis}; compressed-tensors channels are rows "
                              "(axis 0)")
        kind, scale_dtype, count, scale_shape = "channel", np.dtype(np.float32), desc.shape[0], (desc.shape[0], 1)
    else:
        raise NoExactForm(f"{weight}: {type(q).__name__} has no compressed-tensors pack-quantized form "
                          "(per-block and per-channel integer affine only)")
    buffers = tensor.buffers
    scales = np.frombuffer(buffers[q.scale_buffer_index], dtype=np.dtype(scale_dtype).newbyteorder("<"),
                           count=count).astype(scale_dtype).reshape(scale_shape)
    zeros = None
    if not q.flags & QuantFlag.SYMMETRIC:
        zeros = np.frombuffer(buffers[q.zero_point_buffer_index], dtype="<i4", count=count).astype(np.int64)
        zeros = zeros.reshape(scale_shape)
    codes = np.asarray(tensor.to_numpy(raw=True)).astype(np.int64)
    offset = 1 << (bits - 1)
    if not info.is_signed:
        codes = codes - offset
        zeros = (np.zeros(scale_shape, np.int64) if zeros is None else zeros) - offset
    if zeros is not None and zeros.size and (int(zeros.min()) < -offset or int(zeros.max()) >= offset):
        raise NoExactForm(f"{weight}: zero points outside the {bits}-bit range have no compressed-tensors form")
    block = q.block_size if kind == "group" else None
    return kind, bits, block, codes, scales, zeros


def _packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Signed codes [rows, n] as compressed-tensors packs them: ``q + 2**(bits-1)``, int32 words,
    the last word's unused codes zero."""
    per = 32 // bits
    rows, n = codes.shape
    stored = (codes + (1 << (bits - 1))).astype(np.uint8)
    pad = -n % per
    if pad:
        stored = np.concatenate([stored, np.zeros((rows, pad), np.uint8)], axis=1)
    return pack_words(stored, bits, axis=1, dtype=np.int32)


def _model_dtype(config: dict) -> Optional[str]:
    dtype = config.get(MODEL_DTYPE_KEY)
    return dtype if dtype in _SCALE_DTYPES else None


def _narrowed(scales: np.ndarray, dtype: Optional[str]) -> np.ndarray:
    """float32 per-channel scales in ``dtype`` when every one is exact in it, else float32."""
    if dtype is None or dtype == "float32":
        return scales
    from ...evaluate.elements import numpy_dtype
    from ...builders.common import element_type

    target = numpy_dtype(element_type(dtype))
    narrow = scales.astype(target)
    if np.array_equal(narrow.astype(np.float32).view(np.uint32), scales.view(np.uint32)):
        return narrow
    return scales


def parts_of(weight: str, tensor, config: dict) -> dict:
    """The pack-quantized parts (``<m>.weight_packed``, ``weight_scale``, ``weight_zero_point``
    when asymmetric, ``weight_shape``) of a per-block (axis 1) or per-channel (axis 0) integer
    tensor; :class:`NoExactForm` for any other scheme, or one the config's scheme for this module
    disagrees with."""
    module = _module(weight)
    kind, bits, block, codes, scales, zeros = _signed_parts(weight, tensor)
    out, inn = codes.shape
    args = _args(config, module)
    strategy = args.strategy
    if (args.bits, args.symmetric, args.group) != (bits, zeros is None, block) or \
            (strategy == "group") != (kind == "group"):
        raise NoExactForm(f"{weight}: the config's scheme ({args.text()}) is not this tensor's "
                          f"({kind}, {bits} bits, {'sym' if zeros is None else 'asym'}, block {block})")
    if kind == "channel":
        scales = _narrowed(scales.astype(np.float32), _model_dtype(config))
        if strategy == "tensor":
            if scales.size and not (scales == scales.reshape(-1)[0]).all() or \
                    zeros is not None and zeros.size and not (zeros == zeros.reshape(-1)[0]).all():
                raise NoExactForm(f"{weight}: the config's tensor strategy holds one scale, the tensor has several")
            scales = scales.reshape(-1)[:1]
            zeros = None if zeros is None else zeros.reshape(-1)[:1]
    if not args.packed:  # int-quantized / naive-quantized: int8 codes and zero points as they are
        parts = {module + ".weight": codes.astype(np.int8), module + ".weight_scale": np.ascontiguousarray(scales)}
        if zeros is not None:
            parts[module + ".weight_zero_point"] = np.ascontiguousarray(zeros.astype(np.int8))
        return parts
    parts = {module + ".weight_packed": _packed(codes, bits), module + ".weight_scale": np.ascontiguousarray(scales)}
    if zeros is not None:
        if strategy == "tensor":
            parts[module + ".weight_zero_point"] = zeros.astype(np.int8)
        else:
            parts[module + ".weight_zero_point"] = np.ascontiguousarray(_packed(zeros.T, bits).T)
    parts[module + ".weight_shape"] = np.array([out, inn], np.int64)
    return parts


def config_for(leaves: list, metadata: dict) -> tuple:
    """(metadata, quantization_config) of a model folder written as compressed-tensors
    ``pack-quantized`` from a Hurray file whose quantized tensors came from elsewhere: one config
    group per (bits, strategy, group, symmetry), its targets the modules' names; the carried
    ``config.json`` gets that ``quantization_config`` (the model's other keys kept)."""
    schemes: dict = {}
    for name, item in leaves:
        if getattr(getattr(item, "descriptor", None), "quantization", None) is None:
            continue
        kind, bits, block, _codes, _scales, zeros = _signed_parts(name, item)
        key = (bits, kind, block, zeros is None)
        schemes.setdefault(key, []).append(_module(name))
    groups = {}
    for i, ((bits, kind, block, symmetric), modules) in enumerate(sorted(schemes.items(), key=lambda kv: kv[0][:2])):
        weights = {"dynamic": False, "group_size": block, "num_bits": bits, "strategy": kind,
                   "symmetric": symmetric, "type": "int"}
        groups[f"group_{i}"] = {"format": FORMAT, "input_activations": None, "output_activations": None,
                                "targets": sorted(modules), "weights": weights}
    quant = {"config_groups": groups, "format": FORMAT, "global_compression_ratio": None, "ignore": [],
             "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
             "sparsity_config": {}, "transform_config": {}}
    text = metadata.get(CONFIG_KEY)
    try:
        model_config = json.loads(text) if text is not None else {}
    except (TypeError, ValueError):
        raise HurraySchemaError("config.json: not a JSON document") from None
    if not isinstance(model_config, dict):
        raise HurraySchemaError("config.json: not a JSON object")
    model_config["quantization_config"] = quant
    metadata = dict(metadata)
    metadata[CONFIG_KEY] = json.dumps(model_config, indent=2, sort_keys=True)
    return metadata, quant
