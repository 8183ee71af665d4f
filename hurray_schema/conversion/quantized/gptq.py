"""GPTQ checkpoints as gptqmodel and auto-gptq write them (``quant_method: "gptq"``) into one
per-block affine tensor per linear (``quantization/per-block-affine.md``), and back.

A linear ``<prefix>`` of a GPTQ checkpoint is stored as

* ``<prefix>.qweight`` int32 ``[in * bits / 32, out]``: ``32 // bits`` codes to a word along
  in_features, code ``k`` of a word at bits ``[bits * k, bits * (k + 1))``;
* ``<prefix>.qzeros`` int32 ``[groups, out * bits / 32]``: the zero points packed the same way
  along out_features.  ``checkpoint_format: "gptq"`` (v1, the default) stores each *word* minus
  ``0x11111111`` (for 4 bits; one unit in every lane): the libraries add it back word-wise on
  load (gptqmodel's ``convert_gptq_v1_to_v2_format_module``), so a zero point 0 borrows from the
  next lane and still comes back.  (auto-gptq writes the same bytes except where a zero point is
  0: it ORs ``0 - 1`` into the word and reads each lane plus one, 16 for that lane; gptqmodel's
  reading is the one followed here.)  ``"gptq_v2"`` stores the zero points as they are;
* ``<prefix>.scales`` float16 ``[groups, out]``;
* ``<prefix>.g_idx`` int32 ``[in]``: the group of each input column (``i // group_size``
  without act-order; a permutation's order with act-order, ``desc_act``).

The library's dequantization (gptqmodel ``TorchLinear.dequantize_weight``) is
``scales[g_idx] * (q - zeros[g_idx])``, ``[in, out]`` in the scales' dtype: one float32 product of
a float16 scale and a small integer, rounded once -- the spec's ``s * (q - z)``
(``quantization/per-block-affine.md § Dequantization Formula``) read back in float16.

Hurray's blocks are contiguous runs along the axis (``§ Block Layout``), so the tensor is
``[out, in]`` with ``axis = 1``, the block size the longest power of two (at most the group size)
over whose aligned runs ``g_idx`` is constant -- the group size itself without act-order.  An
act-order ``g_idx`` whose neighbouring columns fall into different groups has no such run of two
(``block_size`` is at least 2, ``§ Binary Encoding``): :class:`~...errors.NoExactForm`.  Zero
points all ``2 ** (bits - 1)`` (``sym: true``) become signed codes ``q - 2 ** (bits - 1)`` with the
``SYMMETRIC`` flag, any other zero points unsigned codes with int32 zero points.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from .checkpoint import QuantizedLinear
from .packing import pack_words, unpack_words

__all__ = ["linears", "source", "dequantized", "parts_of", "config_for", "FORMATS", "PARTS"]

PARTS = ("qweight", "qzeros", "scales", "g_idx")
"""The parts of one linear; ``g_idx`` may be missing (old auto-gptq files: ``i // group_size``)."""

FORMATS = ("gptq", "gptq_v2")
"""The ``checkpoint_format`` values read here: v1 (zeros stored minus one) and v2 (as they are)."""

_BITS = (2, 3, 4, 8)
_SPEC = "quantization/per-block-affine.md"


# --------------------------------------------------------------------------------------
# config


class _Config:
    __slots__ = ("bits", "group_size", "sym", "desc_act", "v1")

    def __init__(self, bits, group_size, sym, desc_act, v1):
        self.bits, self.group_size, self.sym, self.desc_act, self.v1 = bits, group_size, sym, desc_act, v1


def _config(config: Mapping) -> _Config:
    """The fields of a GPTQ ``quantization_config`` used here, each checked."""
    bits = config.get("bits")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in _BITS:
        raise HurraySchemaError(f"gptq quantization_config: bits {bits!r}; GPTQ packs {list(_BITS)} bits")
    group = config.get("group_size", -1)
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group > 0):
        raise HurraySchemaError(f"gptq quantization_config: group_size {group!r} is neither -1 nor a positive integer")
    checkpoint_format = config.get("checkpoint_format")
    other = config.get("format")
    if checkpoint_format is None:
        checkpoint_format = other if other is not None else "gptq"
    elif other is not None and other != checkpoint_format:
        raise HurraySchemaError(f"gptq quantization_config: checkpoint_format {checkpoint_format!r} and format "
                                f"{other!r} disagree")
    if checkpoint_format not in FORMATS:
        raise HurraySchemaError(f"gptq quantization_config: checkpoint_format {checkpoint_format!r}; the GPTQ layouts "
                                f"read here are {list(FORMATS)} (v1, zeros stored minus one; v2, as they are)")
    pack_dtype = config.get("pack_dtype", "int32")
    if pack_dtype not in ("int32", "torch.int32"):
        raise HurraySchemaError(f"gptq quantization_config: pack_dtype {pack_dtype!r}; only int32 words are read")
    if config.get("dynamic"):
        raise HurraySchemaError("gptq quantization_config: per-module overrides (dynamic) are not read")
    for key in ("sym", "desc_act"):
        if not isinstance(config.get(key, False), bool):
            raise HurraySchemaError(f"gptq quantization_config: {key} {config.get(key)!r} is not true or false")
    return _Config(bits, group, bool(config.get("sym", True)), bool(config.get("desc_act", False)),
                   checkpoint_format == "gptq")


def _scheme_text(cfg: _Config) -> str:
    group = "per-channel" if cfg.group_size == -1 else f"g{cfg.group_size}"
    text = f"gptq{'' if cfg.v1 else '_v2'} int{cfg.bits} {group} {'sym' if cfg.sym else 'asym'}"
    return text + (" act-order" if cfg.desc_act else "")


def linears(sources: Mapping, config: dict) -> dict:
    """Each ``<prefix>.qweight`` of the checkpoint with its ``qzeros``, ``scales`` and ``g_idx``,
    keyed by the dense weight ``<prefix>.weight`` of shape ``[out, in]``."""
    cfg = _config(config)
    out = {}
    for name in sources:
        if not name.endswith(".qweight"):
            continue
        prefix = name[:-len(".qweight")]
        weight = prefix + ".weight"
        if weight in sources:
            raise HurraySchemaError(f"{weight}: both a dense weight and GPTQ parts ({name})")
        parts = {}
        for part in PARTS:
            part_name = f"{prefix}.{part}"
            if part_name in sources:
                parts[part] = part_name
            elif part != "g_idx":
                raise HurraySchemaError(f"{weight}: the GPTQ part {part_name!r} is missing")
        shape = tuple(sources[name].shape)
        if len(shape) != 2:
            raise HurraySchemaError(f"{weight}: qweight of shape {list(shape)} is not 2-D")
        out[weight] = QuantizedLinear(parts, _scheme_text(cfg), (shape[1], shape[0] * 32 // cfg.bits))
    return out


# --------------------------------------------------------------------------------------
# parts -> codes and parameters


class _Linear:
    """A linear's parts read and checked: codes ``[in, out]`` (uint8), zero points
    ``[groups, out]`` (int64, v1's minus one undone), scales ``[groups, out]``, ``g_idx`` ``[in]``."""

    __slots__ = ("codes", "zeros", "scales", "g_idx", "group", "bits")


def _array(weight: str, arrays: Mapping, part: str, kind: str) -> np.ndarray:
    if part not in arrays:
        raise HurraySchemaError(f"{weight}: the GPTQ part {part} is missing")
    array = np.asarray(arrays[part])
    if array.dtype.kind not in kind:
        raise HurraySchemaError(f"{weight}: {part} is {array.dtype}, "
                                f"{'int32' if kind == 'i' else 'float16'} expected")
    return array


def _read(weight: str, arrays: Mapping, cfg: _Config) -> _Linear:
    bits = cfg.bits
    qweight = _array(weight, arrays, "qweight", "i")
    qzeros = _array(weight, arrays, "qzeros", "i")
    scales = _array(weight, arrays, "scales", "f")
    if qweight.dtype != np.int32 or qzeros.dtype != np.int32:
        raise HurraySchemaError(f"{weight}: qweight {qweight.dtype} and qzeros {qzeros.dtype}; GPTQ packs int32 words")
    if scales.dtype not in (np.float16, np.float32) and scales.dtype.name != "bfloat16":
        raise HurraySchemaError(f"{weight}: scales of {scales.dtype}; float16, bfloat16 or float32 expected")
    if qweight.ndim != 2 or qzeros.ndim != 2 or scales.ndim != 2:
        raise HurraySchemaError(f"{weight}: qweight {list(qweight.shape)}, qzeros {list(qzeros.shape)} and scales "
                                f"{list(scales.shape)} are not all 2-D")
    if bits == 3:
        raise NoExactForm(f"{weight}: 3-bit GPTQ codes have no per-block affine storage type (uint2, uint4 and "
                          f"uint8 are, {_SPEC} § Valid Storage Types)")
    per = 32 // bits
    in_features, out_features = qweight.shape[0] * per, qweight.shape[1]
    group = in_features if cfg.group_size == -1 else cfg.group_size
    if in_features == 0 or in_features % group:
        raise HurraySchemaError(f"{weight}: group size {cfg.group_size} does not divide the {in_features} input "
                                f"features of qweight {list(qweight.shape)}")
    groups = in_features // group
    if scales.shape != (groups, out_features):
        raise HurraySchemaError(f"{weight}: scales of shape {list(scales.shape)} do not match qweight "
                                f"{list(qweight.shape)} ({groups} groups of {group}, {out_features} outputs: "
                                f"[{groups}, {out_features}] expected)")
    if out_features % per or qzeros.shape != (groups, out_features // per):
        raise HurraySchemaError(f"{weight}: qzeros of shape {list(qzeros.shape)} do not match scales "
                                f"{list(scales.shape)} ([{groups}, {out_features} / {per}] expected)")
    if "g_idx" in arrays and arrays["g_idx"] is not None:
        g_idx = _array(weight, arrays, "g_idx", "iu")
        if g_idx.shape != (in_features,):
            raise HurraySchemaError(f"{weight}: g_idx of shape {list(g_idx.shape)}, [{in_features}] expected")
        if g_idx.size and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            bad = int(np.flatnonzero((g_idx < 0) | (g_idx >= groups))[0])
            raise HurraySchemaError(f"{weight}: g_idx[{bad}] = {int(g_idx[bad])} is out of range for {groups} groups")
        g_idx = g_idx.astype(np.int64)
    else:
        g_idx = np.arange(in_features, dtype=np.int64) // group
    words = qzeros.view(np.uint32)
    if cfg.v1:  # undo the minus one word-wise, as gptqmodel does (a borrow comes back too)
        ones = sum(1 << (bits * k) for k in range(per))
        words = ((words.astype(np.uint64) + ones) & 0xFFFFFFFF).astype(np.uint32)
    linear = _Linear()
    linear.codes = unpack_words(qweight, bits, axis=0)
    linear.zeros = unpack_words(words, bits, axis=1).astype(np.int64)
    linear.scales, linear.g_idx, linear.group, linear.bits = scales, g_idx, group, bits
    return linear


def _block_size(g_idx: np.ndarray, group: int) -> int:
    """The longest power of two ``K`` (at most ``group``, dividing ``in``) over whose aligned runs
    ``g_idx`` is constant; 1 when there is none of two or more."""
    size = g_idx.shape[0]
    block = 1 << (min(group, size).bit_length() - 1)
    while block >= 2:
        if size % block == 0:
            runs = g_idx.reshape(-1, block)
            if (runs == runs[:, :1]).all():
                return block
        block //= 2
    return 1


def _check_scales(weight: str, scales: np.ndarray) -> None:
    wide = scales.astype(np.float32)
    bad = ~np.isfinite(wide) | (wide == 0)
    if bad.any():
        g, o = (int(i) for i in np.argwhere(bad)[0])
        raise NoExactForm(f"{weight}: scale [{g}, {o}] = {wide[g, o]!r}: per-block scales must be finite and "
                          f"non-zero ({_SPEC} § Validity Constraints)")


def source(weight: str, arrays: Mapping, config: dict):
    """The per-block affine tensor ``[out, in]`` (axis 1) of one GPTQ linear, equal to the
    library's dequantization; :class:`NoExactForm` when ``g_idx`` has no aligned runs of two."""
    from ...builders.quantized import quantized_from_codes

    cfg = _config(config)
    linear = _read(weight, arrays, cfg)
    block = _block_size(linear.g_idx, linear.group)
    if block < 2:
        i = int(np.flatnonzero(linear.g_idx[0::2] != linear.g_idx[1::2])[0]) * 2
        raise NoExactForm(f"{weight}: act-order g_idx puts input columns {i} and {i + 1} into groups "
                          f"{int(linear.g_idx[i])} and {int(linear.g_idx[i + 1])}; per-block affine blocks are runs "
                          f"of at least 2 contiguous elements along the axis ({_SPEC} § Block Layout, "
                          f"§ Binary Encoding)")
    _check_scales(weight, linear.scales)
    of_block = linear.g_idx[::block]  # the group of each block of input columns
    scales = linear.scales[of_block].T  # [out, blocks]
    zeros = linear.zeros[of_block].T
    codes = linear.codes.T  # [out, in]
    middle = 1 << (cfg.bits - 1)
    if zeros.size and (zeros == middle).all():
        signed = codes.astype(np.int8) - np.int8(middle)
        return quantized_from_codes(signed, "per_block", storage=f"int{cfg.bits}", axis=1, scales=scales,
                                    block_size=block)
    return quantized_from_codes(codes, "per_block", storage=f"uint{cfg.bits}", axis=1, scales=scales,
                                zero_points=zeros.astype(np.int32), block_size=block)


def dequantized(weight: str, arrays: Mapping, config: dict) -> np.ndarray:
    """The dense weight ``[out, in]`` as gptqmodel's ``TorchLinear.dequantize_weight`` computes
    it: ``scales[g_idx] * (q - zeros[g_idx])`` in the scales' dtype (a float32 product rounded
    once), transposed."""
    cfg = _config(config)
    linear = _read(weight, arrays, cfg)
    scale = linear.scales[linear.g_idx]
    diff = linear.codes.astype(np.int64) - linear.zeros[linear.g_idx]
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite scale decodes as the library's does
        product = scale.astype(np.float32) * diff.astype(np.float32)
    return np.ascontiguousarray(product.astype(linear.scales.dtype).T)


# --------------------------------------------------------------------------------------
# the way back


def parts_of(weight: str, tensor, config: dict) -> dict:
    """The GPTQ parts (``qweight``, ``qzeros``, ``scales``, ``g_idx``; v1 or v2 as ``config``
    says) of a per-block affine tensor ``[out, in]`` blocked along axis 1 with float16 scales
    and ``bits``-bit codes; :class:`NoExactForm` when GPTQ's layout cannot hold it."""
    from ...model import ElementType, PerBlockAffine, QuantFlag
    from ...structs.element_types import element_type_info

    cfg = _config(config)
    if not weight.endswith(".weight"):
        raise NoExactForm(f"{weight}: a GPTQ linear's weight is named <prefix>.weight")
    prefix = weight[:-len(".weight")]
    desc = tensor.descriptor
    q = desc.quantization
    if not isinstance(q, PerBlockAffine):
        raise NoExactForm(f"{weight}: {type(q).__name__} has no GPTQ form (GPTQ holds per-block affine codes)")
    shape = tuple(desc.shape)
    if len(shape) != 2 or q.axis != 1:
        raise NoExactForm(f"{weight}: GPTQ blocks a 2-D [out, in] weight along in_features (axis 1); this tensor "
                          f"has shape {list(shape)} and axis {q.axis}")
    info = element_type_info(desc.type_tag)
    if info is None or info.is_float or info.bit_width != cfg.bits or cfg.bits == 3:
        raise NoExactForm(f"{weight}: {ElementType(desc.type_tag).name.lower()} codes do not fit "
                          f"{cfg.bits}-bit GPTQ words")
    if q.scale_type_tag != ElementType.FLOAT16:
        raise NoExactForm(f"{weight}: {ElementType(q.scale_type_tag).name.lower()} scales; GPTQ stores float16")
    out_features, in_features = shape
    per = 32 // cfg.bits
    group = in_features if cfg.group_size == -1 else cfg.group_size
    if in_features % per or out_features % per or in_features % group:
        raise NoExactForm(f"{weight}: shape {list(shape)} does not fill whole int32 words and groups of {group}")
    block = q.block_size
    blocks = in_features // block
    codes, scales, zeros = _stored_parts(tensor, shape, blocks)
    lo = -(1 << (cfg.bits - 1)) if info.is_signed else 0
    unsigned = (codes.astype(np.int64) - lo)
    zero = (np.zeros(scales.shape, np.int64) if q.flags & QuantFlag.SYMMETRIC else zeros.astype(np.int64)) - lo
    # one scale and zero point per GPTQ group: each group's blocks must agree
    column_block = np.arange(in_features) // block
    column_group = np.arange(in_features) // group
    groups = in_features // group
    first = np.zeros(groups, np.int64)
    first[column_group[::-1]] = column_block[::-1]  # the first block of each group
    group_scale = scales[:, first]
    group_zero = zero[:, first]
    if not (np.array_equal(scales[:, column_block].view(np.uint16), group_scale[:, column_group].view(np.uint16))
            and np.array_equal(zero[:, column_block], group_zero[:, column_group])):
        raise NoExactForm(f"{weight}: blocks of {block} with their own scales or zero points do not fit GPTQ "
                          f"groups of {group}")
    top = (1 << cfg.bits) - 1
    if group_zero.size and (group_zero.min() < 0 or group_zero.max() > top):
        raise NoExactForm(f"{weight}: zero points outside the {cfg.bits}-bit codes [0, {top}] GPTQ packs")
    zero_words = pack_words(group_zero.T.astype(np.uint8), cfg.bits, axis=1).view(np.uint32)
    if cfg.v1:
        ones = sum(1 << (cfg.bits * k) for k in range(per))
        zero_words = ((zero_words.astype(np.int64) - ones) & 0xFFFFFFFF).astype(np.uint32)
    # in the order gptqmodel registers (and saves) a linear's buffers
    return {
        f"{prefix}.g_idx": (np.arange(in_features) // group).astype(np.int32),
        f"{prefix}.scales": np.ascontiguousarray(group_scale.T),
        f"{prefix}.qweight": pack_words(unsigned.T.astype(np.uint8), cfg.bits, axis=0),
        f"{prefix}.qzeros": zero_words.view(np.int32),
    }


def _stored_parts(tensor, shape, blocks):
    """(codes ``[out, in]`` as stored, float16 scales ``[out, blocks]``, int32 zero points or
    None) of a per-block tensor, read from its buffers."""
    from ...io.tensor import fetched
    from ...model import QuantFlag

    tensor = fetched(tensor)
    q = tensor.descriptor.quantization
    codes = np.asarray(tensor.to_numpy(raw=True)).reshape(shape)
    scales = np.frombuffer(tensor.buffers[q.scale_buffer_index], "<f2").reshape(shape[0], blocks)
    zeros = None
    if not q.flags & QuantFlag.SYMMETRIC:
        zeros = np.frombuffer(tensor.buffers[q.zero_point_buffer_index], "<i4").reshape(shape[0], blocks)
    return codes, scales.astype(np.float16), zeros


def config_for(leaves, metadata):
    """Refused: a GPTQ folder is written back only from a file that carries its GPTQ
    ``config.json`` (the group size, the v1 or v2 zeros, ``desc_act`` and ``sym`` it names)."""
    raise HurraySchemaError("a GPTQ folder is written only from a Hurray file carrying a GPTQ config.json "
                            "(quantization_config with quant_method 'gptq')")
