"""AWQ checkpoints in autoawq's GEMM layout (``quantization_config``: ``quant_method`` "awq",
``version`` "gemm", ``bits`` 4, ``group_size``, ``zero_point`` true), as autoawq's
``WQLinear_GEMM`` stores a linear of ``in`` inputs and ``out`` outputs in groups of ``g`` inputs:

* ``qweight`` int32 ``[in, out / 8]``: row ``i`` holds input ``i``'s codes, eight outputs to a word;
  the nibble at bits ``[4k, 4k + 4)`` of word ``j`` holds output ``8j + [0, 2, 4, 6, 1, 3, 5, 7][k]``;
* ``qzeros`` int32 ``[in / g, out / 8]``: the zero points packed the same way (stored as they
  are, not minus one);
* ``scales`` float16 ``[in / g, out]``.

autoawq dequantizes (``awq.utils.packing_utils.dequantize_gemm``) as ``(q - z) * s``: the codes and
zero points unpacked into int8 and subtracted, the difference multiplied by the float16 scale,
the result float16 ``[in, out]`` (the dense weight is its transpose).  An int8 difference within
``[-15, 15]`` times a float16 scale is exact in float32, so that float16 is the float32 product
rounded once: a per-block affine tensor ``[out, in]`` blocked along the inputs (axis 1,
``block_size = g``) with uint4 codes, int32 zero points and float16 scales, which decodes to
float16 (``quantization/per-block-affine.md § Dequantization Formula``), holds it bit for bit.

A group size that is not a power of two has no exact form (``block_size`` must be one,
``§ Validity Constraints``); the other AWQ layouts (GEMV, GEMV-fast, Marlin, ExLlama, IPEX) and
other bit widths are not read here.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ...errors import HurraySchemaError, NoExactForm, SpecViolation
from .checkpoint import QuantizedLinear
from .packing import pack_words, unpack_words

__all__ = ["linears", "source", "dequantized", "parts_of", "config_for", "AWQ_ORDER", "CODE_ORDER", "PARTS"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Nibble ``k`` of a word holds output column ``AWQ_ORDER[k]`` of its eight (autoawq's ``order_map``)."""

CODE_ORDER = tuple(AWQ_ORDER.index(column) for column in range(8))
"""Output column ``c`` of a word is at nibble ``CODE_ORDER[c]`` (autoawq's ``AWQ_REVERSE_ORDER``,
``0, 4, 1, 5, 2, 6, 3, 7``): the ``order`` of :func:`.packing.unpack_words`."""

PARTS = ("qweight", "qzeros", "scales")
"""A GEMM linear's tensors, ``<module>.<part>``."""

BITS = 4
PER_WORD = 32 // BITS

SCALE_RULE = ("quantization.per_block.scale_values", "quantization/per-block-affine.md § Validity Constraints")
"""The rule a zero or non-finite scale breaks."""


def _settings(config: Mapping) -> tuple[int, int]:
    """(bits, group size; -1 for one group over the inputs) of an AWQ ``quantization_config``,
    refused unless it is autoawq's GEMM layout with zero points."""
    version = config.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise HurraySchemaError(f"config.json: AWQ version {version!r} is not read here; only the GEMM layout is "
                                "(GEMV, GEMV-fast, Marlin, ExLlama and IPEX pack their codes otherwise)")
    bits = config.get("bits", config.get("w_bit", BITS))
    if isinstance(bits, bool) or bits != BITS:
        raise HurraySchemaError(f"config.json: AWQ bits {bits!r}; autoawq's GEMM layout packs 4-bit codes only")
    group = config.get("group_size", config.get("q_group_size", 128))
    if isinstance(group, bool) or not isinstance(group, int) or not (group > 0 or group == -1):
        raise HurraySchemaError(f"config.json: AWQ group_size {group!r} is neither a positive integer nor -1")
    zero_point = config.get("zero_point", True)
    if zero_point is not True:
        raise HurraySchemaError(f"config.json: AWQ zero_point {zero_point!r}; autoawq's GEMM layout always "
                                "packs zero points (zero_point true)")
    return bits, group


def _prefix(weight: str) -> str:
    if not weight.endswith(".weight"):
        raise HurraySchemaError(f"{weight}: an AWQ linear's dense weight is named <module>.weight")
    return weight[: -len(".weight")]


def _dims(weight: str, shapes: Mapping[str, tuple], group: int) -> tuple[int, int, int]:
    """(out, in, group size) of a linear from its parts' shapes, refused where they do not match
    the GEMM packing."""
    qweight, qzeros, scales = (tuple(shapes[part]) for part in PARTS)
    if len(qweight) != 2 or len(qzeros) != 2 or len(scales) != 2:
        raise HurraySchemaError(f"{weight}: qweight {qweight}, qzeros {qzeros} and scales {scales} are not "
                                "all matrices")
    in_features, out_features = qweight[0], scales[1]
    if qweight[1] * PER_WORD != out_features:
        raise HurraySchemaError(f"{weight}: qweight {qweight} packs {qweight[1] * PER_WORD} outputs, scales {scales} "
                                f"give {out_features}")
    size = in_features if group == -1 else group
    if size < 1 or in_features % size:
        raise HurraySchemaError(f"{weight}: group size {group} does not divide the {in_features} input features")
    groups = in_features // size
    if scales[0] != groups:
        raise HurraySchemaError(f"{weight}: scales {scales} has {scales[0]} groups; {in_features} inputs in groups "
                                f"of {size} make {groups}")
    if qzeros != (groups, qweight[1]):
        raise HurraySchemaError(f"{weight}: qzeros {qzeros} given, {(groups, qweight[1])} expected")
    return out_features, in_features, size


def linears(sources: Mapping, config: dict) -> dict:
    """Each ``<module>.qweight`` with its ``qzeros`` and ``scales``, as the linear ``<module>.weight``."""
    _, group = _settings(config)
    found = {}
    for name in sources:
        if not name.endswith(".qweight"):
            continue
        module = name[: -len(".qweight")]
        weight = module + ".weight"
        parts = {part: f"{module}.{part}" for part in PARTS}
        missing = [n for n in parts.values() if n not in sources]
        if missing:
            raise HurraySchemaError(f"{weight}: the AWQ part(s) {missing} are not in the checkpoint")
        out_features, in_features, size = _dims(weight, {p: sources[n].shape for p, n in parts.items()}, group)
        found[weight] = QuantizedLinear(parts, f"awq gemm uint4 g{size}", (out_features, in_features))
    return found


def _checked(weight: str, arrays: Mapping[str, np.ndarray], config: Mapping):
    """(qweight, qzeros, scales, group size) once their types and shapes are the GEMM layout's."""
    _, group = _settings(config)
    qweight, qzeros, scales = (np.asarray(arrays[part]) for part in PARTS)
    for part, array, dtype in (("qweight", qweight, np.int32), ("qzeros", qzeros, np.int32),
                               ("scales", scales, np.float16)):
        if array.dtype != dtype:
            raise HurraySchemaError(f"{weight}: AWQ {part} is {array.dtype}; autoawq's GEMM layout keeps "
                                    f"{np.dtype(dtype).name}")
    _, _, size = _dims(weight, {"qweight": qweight.shape, "qzeros": qzeros.shape, "scales": scales.shape}, group)
    return qweight, qzeros, scales, size


def _unpacked(words: np.ndarray) -> np.ndarray:
    """The 4-bit codes of GEMM words, one per output column in column order (``[rows, out]``)."""
    return unpack_words(words, BITS, axis=1, order=CODE_ORDER)


def source(weight: str, arrays: Mapping[str, np.ndarray], config: Mapping):
    """The per-block affine tensor ``[out, in]`` (uint4 codes, int32 zero points, float16 scales, blocks
    of ``group_size`` inputs) holding the linear's codes and parameters as they are."""
    from ...builders.quantized import quantized_from_codes

    qweight, qzeros, scales, size = _checked(weight, arrays, config)
    if size < 2 or size & (size - 1):
        raise NoExactForm(f"{weight}: AWQ group size {size} is not a power of two, which a per-block block_size "
                          "must be (quantization/per-block-affine.md § Validity Constraints)")
    bad = ~np.isfinite(scales) | (scales == 0)
    if bad.any():
        group, column = (int(i) for i in np.argwhere(bad)[0])
        raise SpecViolation(*SCALE_RULE, None, f"{weight}: AWQ scale {float(scales[group, column])!r} of output "
                            f"{column}, group {group} is not finite and non-zero ({int(bad.sum())} such)")
    codes = _unpacked(qweight).T  # [out, in]
    zeros = _unpacked(qzeros).T.astype(np.int32)  # [out, groups]
    return quantized_from_codes(codes, "per_block", storage="uint4", axis=1, scales=scales.T,
                                zero_points=zeros, block_size=size, scale_type="float16", name=weight)


def dequantized(weight: str, arrays: Mapping[str, np.ndarray], config: Mapping) -> np.ndarray:
    """The dense weight ``[out, in]`` as autoawq's ``dequantize_gemm`` computes it (its ``[in, out]``
    result transposed): codes and zero points unpacked into int8, masked to 4 bits, subtracted,
    the difference times the float16 scale in float16."""
    qweight, qzeros, scales, size = _checked(weight, arrays, config)
    mask = np.int8((1 << BITS) - 1)
    codes = _unpacked(qweight).astype(np.int8) & mask
    zeros = _unpacked(qzeros).astype(np.int8) & mask
    difference = codes - np.repeat(zeros, size, axis=0)
    return (difference.astype(np.float16) * np.repeat(scales, size, axis=0)).T


def parts_of(weight: str, tensor, config: Mapping) -> dict:
    """``<module>.qweight`` / ``qzeros`` / ``scales`` of a per-block affine tensor ``[out, in]`` with uint4
    codes, float16 scales and zero points (or symmetric), blocked along axis 1 by the config's group
    size; NoExactForm for any other scheme."""
    from ...model import ElementType, PerBlockAffine, QuantFlag

    _, group = _settings(config)
    module = _prefix(weight)
    desc = tensor.descriptor
    q = desc.quantization
    shape = tuple(desc.shape)

    def refuse(why: str):
        raise NoExactForm(f"{weight}: {why}; autoawq's GEMM layout holds per-block affine uint4 codes [out, in] "
                          "blocked along the inputs, float16 scales, zero points within 4 bits")

    if not isinstance(q, PerBlockAffine):
        refuse(f"{type(q).__name__} quantization")
    if len(shape) != 2 or q.axis != 1:
        refuse(f"shape {shape}, block axis {q.axis}")
    if desc.type_tag != ElementType.UINT4:
        refuse(f"{ElementType(desc.type_tag).name.lower()} codes")
    if q.scale_type_tag != ElementType.FLOAT16:
        refuse(f"{ElementType(q.scale_type_tag).name.lower()} scales")
    out_features, in_features = shape
    size = in_features if group == -1 else group
    if q.block_size != size or in_features % size:
        refuse(f"blocks of {q.block_size} for {in_features} inputs where the config's group_size is {group}")
    if out_features % PER_WORD:
        refuse(f"{out_features} outputs are not whole int32 words of {PER_WORD}")
    groups = in_features // size
    codes = np.asarray(tensor.to_numpy(raw=True)).reshape(out_features, in_features)
    raw = [np.frombuffer(memoryview(buffer).cast("B"), np.uint8) for buffer in tensor.buffers]
    scales = raw[q.scale_buffer_index][: 2 * out_features * groups].view("<f2").reshape(out_features, groups)
    if q.flags & QuantFlag.SYMMETRIC:
        zeros = np.zeros((out_features, groups), np.int64)
    else:
        zeros = raw[q.zero_point_buffer_index][: 4 * out_features * groups].view("<i4").reshape(out_features, groups)
        if zeros.size and (int(zeros.min()) < 0 or int(zeros.max()) >= 1 << BITS):
            refuse(f"zero points within [{int(zeros.min())}, {int(zeros.max())}]")
    return {
        f"{module}.qweight": pack_words(codes.T, BITS, axis=1, order=CODE_ORDER),
        f"{module}.qzeros": pack_words(zeros.T, BITS, axis=1, order=CODE_ORDER),
        f"{module}.scales": np.ascontiguousarray(scales.T).astype(np.float16),
    }


def config_for(leaves, metadata):
    """AWQ is written back only into the checkpoint it came from (its config.json carried)."""
    raise HurraySchemaError("a Hurray file is written in AWQ's layout only when it carries an AWQ checkpoint's "
                            "config.json; write this one as compressed-tensors or dequantized")
