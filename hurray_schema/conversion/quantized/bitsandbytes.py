"""bitsandbytes 4-bit checkpoints (``quant_method`` ``bitsandbytes``, ``load_in_4bit``) as
transformers saves them, into Hurray NF4 (``quantization/nf4.md``) and back.

One quantized linear is saved as ``<w>`` (the packed codes, uint8 ``[(n + 1) // 2, 1]``, element
``2k`` in the high nibble of byte ``k``, element ``2k + 1`` in the low one), ``<w>.absmax``,
``<w>.quant_map`` (the 16 levels) and ``<w>.quant_state.bitsandbytes__nf4`` (or ``__fp4``: a
uint8 tensor holding JSON ``quant_type``, ``blocksize``, ``dtype``, ``shape``).  With double
quantization ``<w>.absmax`` is uint8 codes into ``<w>.nested_quant_map`` (256 levels), scaled
per ``nested_blocksize`` codes by ``<w>.nested_absmax`` and shifted by ``nested_offset``.

bitsandbytes cuts the flattened weight into blocks of ``blocksize`` elements and dequantizes
``code[q] * absmax[block]`` in float32, rounded once to ``dtype``; its NF4 table is the spec's
(``quantization/nf4.md § Lookup Table``) bit for bit.  So an NF4 weight whose rows are whole
blocks (``in_features % blocksize == 0``) is a Hurray NF4 tensor blocked along its last axis
(``quantization/per-block-affine.md § Block Layout``), its codes the same, only their nibbles
swapped (``element-types.md § Sub-Byte Integer Types``).  Double quantization has no scheme of its
own (``quantization.md § Open Questions``): the float32 absmax bitsandbytes computes from it is
stored instead (exact, 3 bytes more per block).  FP4 has no exact form.
"""

from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np

from ...errors import HurraySchemaError, NoExactForm
from ..source import SourceTensor
from .checkpoint import MODEL_DTYPE_KEY, QuantizedLinear, integer
from .packing import FLOAT_NAMES, float_dtype, unpack_words

__all__ = ["linears", "source", "dequantized", "parts_of", "NF4_CODE", "FP4_CODE", "STATE_KEY"]

STATE_KEY = ".quant_state.bitsandbytes__"
"""What the packed quantization state's name adds to the weight's (then ``nf4`` or ``fp4``)."""

NF4_CODE = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                     0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                     0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
"""bitsandbytes' NF4 table (``functional.get_4bit_type("nf4")``, the CPU kernels' ``nf4_lut``)."""

FP4_CODE = (np.array([0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0],
                     np.float32) / np.float32(12.0)).astype(np.float32)
"""bitsandbytes' FP4 table (``get_4bit_type("fp4")``: its values over 12 in float32, code 8 +0.0 as
in its ``quant_map``, its default kernel and its AVX-512 CPU kernel; its scalar CPU kernel has -0.0)."""

_CODES = {"nf4": NF4_CODE, "fp4": FP4_CODE}
_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
"""The block sizes bitsandbytes' 4-bit kernels take."""
_STATE_KEYS = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset"}
_NESTED_KEYS = {"nested_blocksize", "nested_dtype", "nested_offset"}
_STATE_BYTES = 1 << 16
"""The largest quantization state read (a few hundred bytes in practice)."""


# --------------------------------------------------------------------------------------
# In
# --------------------------------------------------------------------------------------


def linears(sources: Mapping[str, SourceTensor], config: dict) -> dict:
    """Each 4-bit linear of the checkpoint: the weight named by its packed quantization state, its
    parts (``weight``, ``absmax``, ``quant_map``, ``quant_state`` and, double-quantized,
    ``nested_absmax``, ``nested_quant_map``), scheme text and shape from that state."""
    if config.get("load_in_8bit") and not config.get("load_in_4bit"):
        raise HurraySchemaError("bitsandbytes: load_in_8bit (LLM.int8) checkpoints are not read here; "
                                "only load_in_4bit (nf4, fp4)")
    out = {}
    for name in sources:
        cut = name.rfind(STATE_KEY)
        if cut < 0:
            continue
        weight, kind = name[:cut], name[cut + len(STATE_KEY):]
        if kind not in _CODES:
            raise HurraySchemaError(f"{weight}: quantization state {name!r} names quant_type {kind!r}; "
                                    "bitsandbytes' are nf4 and fp4")
        state = _state(weight, sources[name].values())
        if state["quant_type"] != kind:
            raise HurraySchemaError(f"{weight}: the state {name!r} says quant_type {state['quant_type']!r}")
        parts = {"weight": weight, "absmax": weight + ".absmax", "quant_map": weight + ".quant_map",
                 "quant_state": name}
        nested = "nested_blocksize" in state
        if nested:
            parts.update(nested_absmax=weight + ".nested_absmax", nested_quant_map=weight + ".nested_quant_map")
        for part, part_name in parts.items():
            if part_name not in sources:
                raise HurraySchemaError(f"{weight}: its {part} {part_name!r} is not in the checkpoint")
        scheme = f"bitsandbytes {kind} b{state['blocksize']} {state['dtype']}" + (" double-quant" if nested else "")
        out[weight] = QuantizedLinear(parts, scheme, tuple(state["shape"]))
    return out


def _state(weight: str, array) -> dict:
    """The JSON quantization state of ``weight`` (a uint8 tensor of UTF-8 bytes), checked."""
    raw = np.asarray(array)
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size > _STATE_BYTES:
        raise HurraySchemaError(f"{weight}: the quantization state is {raw.dtype}{list(raw.shape)}, "
                                "not a uint8 vector of JSON bytes")
    try:
        state = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise HurraySchemaError(f"{weight}: the quantization state is not JSON") from None
    if not isinstance(state, dict):
        raise HurraySchemaError(f"{weight}: the quantization state is not a JSON object")
    unknown = set(state) - _STATE_KEYS
    missing = {"quant_type", "blocksize", "dtype", "shape"} - set(state)
    if unknown or missing:
        raise HurraySchemaError(f"{weight}: the quantization state has unknown keys {sorted(unknown)} "
                                f"or lacks {sorted(missing)}")
    if state["quant_type"] not in _CODES:
        raise HurraySchemaError(f"{weight}: quant_type {state['quant_type']!r}; one of nf4, fp4")
    if not integer(state["blocksize"]) or state["blocksize"] not in _BLOCKSIZES:
        raise HurraySchemaError(f"{weight}: blocksize {state['blocksize']!r}; bitsandbytes takes {_BLOCKSIZES}")
    if state["dtype"] not in FLOAT_NAMES:
        raise HurraySchemaError(f"{weight}: dtype {state['dtype']!r}; one of {FLOAT_NAMES}")
    shape = state["shape"]
    if not isinstance(shape, list) or not shape or not all(integer(n) and n >= 0 for n in shape) \
            or math.prod(shape) >= 1 << 62:
        raise HurraySchemaError(f"{weight}: shape {shape!r} is no list of dimensions")
    present = _NESTED_KEYS & set(state)
    if present and present != _NESTED_KEYS:
        raise HurraySchemaError(f"{weight}: the nested state lacks {sorted(_NESTED_KEYS - present)}")
    if present:
        if not integer(state["nested_blocksize"]) or state["nested_blocksize"] < 1:
            raise HurraySchemaError(f"{weight}: nested_blocksize {state['nested_blocksize']!r}")
        if state["nested_dtype"] != "float32":
            raise HurraySchemaError(f"{weight}: nested_dtype {state['nested_dtype']!r}; float32 expected")
        offset = state["nested_offset"]
        if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
            raise HurraySchemaError(f"{weight}: nested_offset {offset!r} is no finite number")
    return state


def _checked(weight: str, arrays: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    """(state, packed bytes, float32 absmax as bitsandbytes computes it) of one linear, every part's
    size checked against the state."""
    state = _state(weight, arrays["quant_state"])
    count = math.prod(state["shape"])
    block = state["blocksize"]
    packed = np.ascontiguousarray(arrays["weight"])
    if packed.size * packed.dtype.itemsize != (count + 1) // 2:
        raise HurraySchemaError(f"{weight}: {packed.size * packed.dtype.itemsize} packed bytes, the state's shape "
                                f"{state['shape']} needs {(count + 1) // 2}")
    packed = packed.reshape(-1).view(np.uint8)
    quant_map = np.asarray(arrays["quant_map"])
    code = _CODES[state["quant_type"]]
    if quant_map.dtype != np.float32 or quant_map.shape != (16,) \
            or not np.array_equal(quant_map.view(np.uint32), code.view(np.uint32)):
        raise HurraySchemaError(f"{weight}: quant_map is not bitsandbytes' {state['quant_type']} table, which its "
                                "kernels use whatever the file says")
    blocks = -(-count // block)
    absmax = np.asarray(arrays["absmax"])
    if "nested_blocksize" not in state:
        if absmax.dtype != np.float32 or absmax.shape != (blocks,):
            raise HurraySchemaError(f"{weight}: absmax is {absmax.dtype}{list(absmax.shape)}, "
                                    f"float32[{blocks}] expected for {count} elements in blocks of {block}")
        return state, packed, absmax
    return state, packed, _nested_absmax(weight, state, absmax, arrays, blocks)


def _nested_absmax(weight: str, state: dict, codes: np.ndarray, arrays: dict, blocks: int) -> np.ndarray:
    """The float32 absmax of a double-quantized weight as bitsandbytes computes it
    (``functional.dequantize_4bit``): ``nested_code[q] * nested_absmax[i // nested_blocksize]`` in
    float32 (``dequantize_blockwise``), then ``+ nested_offset`` in float32."""
    nested_block = state["nested_blocksize"]
    nested_absmax = np.asarray(arrays["nested_absmax"])
    nested_code = np.asarray(arrays["nested_quant_map"])
    nested_blocks = -(-blocks // nested_block)
    if codes.dtype != np.uint8 or codes.shape != (blocks,):
        raise HurraySchemaError(f"{weight}: double-quantized absmax is {codes.dtype}{list(codes.shape)}, "
                                f"uint8[{blocks}] expected")
    if nested_absmax.dtype != np.float32 or nested_absmax.shape != (nested_blocks,):
        raise HurraySchemaError(f"{weight}: nested_absmax is {nested_absmax.dtype}{list(nested_absmax.shape)}, "
                                f"float32[{nested_blocks}] expected")
    if nested_code.dtype != np.float32 or nested_code.shape != (256,):
        raise HurraySchemaError(f"{weight}: nested_quant_map is {nested_code.dtype}{list(nested_code.shape)}, "
                                "float32[256] expected")
    scales = nested_absmax[np.arange(blocks) // nested_block]
    with np.errstate(over="ignore", invalid="ignore"):
        absmax = nested_code[codes] * scales
        absmax += np.float32(state["nested_offset"])
    return absmax


def _require_unsigned_nested(weight: str, absmax: np.ndarray) -> None:
    """:class:`NoExactForm` for a negative absmax computed from double quantization: bitsandbytes
    multiplies its table by it, flipping that block's signs, which NF4 cannot say (its absmax are
    non-negative, ``quantization/nf4.md § Validity Constraints``).  A stored absmax, or computed
    ones of which any is NaN or infinite, are the tensor's as they are: ``quantization.nf4.absmax_values``
    rejects them when the tensor is decoded or written."""
    negative = int((absmax < 0).sum())
    if negative and np.isfinite(absmax).all():
        raise NoExactForm(f"{weight}: {negative} absmax value(s) computed from double quantization are negative; "
                          "NF4 absmax are non-negative (quantization/nf4.md § Validity Constraints)")


def source(weight: str, arrays: dict, config: dict):
    """The Hurray NF4 tensor of one bitsandbytes 4-bit linear (codes and float32 absmax as they
    are), or :class:`NoExactForm`: FP4, or rows that are not whole blocks."""
    from ...builders import quantized_from_codes

    state, packed, absmax = _checked(weight, arrays)
    shape, block = tuple(state["shape"]), state["blocksize"]
    if "nested_blocksize" in state:
        _require_unsigned_nested(weight, absmax)
    if state["quant_type"] == "fp4":
        raise NoExactForm(f"{weight}: bitsandbytes fp4 is absmax / 6 (a float32) times float4_e2m1 values whose "
                          "smallest non-zero is 1/32, not 0.5; MXFP has e2m1's own levels and power-of-two scales "
                          "(quantization/mxfp.md § Dequantization Formula), NF4 fixed levels (quantization/nf4.md "
                          "§ Lookup Table)")
    if shape[-1] % block:
        raise NoExactForm(f"{weight}: bitsandbytes cuts the flattened {list(shape)} weight into blocks of {block}, "
                          f"which straddle its rows of {shape[-1]}; NF4 blocks run along one axis within a row "
                          "(quantization/per-block-affine.md § Block Layout)")
    codes = _unpacked(packed, math.prod(shape)).reshape(shape)
    scales = absmax.reshape(shape[:-1] + (shape[-1] // block,))
    return quantized_from_codes(codes, "nf4", storage="uint4", axis=len(shape) - 1, scales=scales,
                                block_size=block)


HIGH_NIBBLE_FIRST = (1, 0)
"""bitsandbytes' order of the two codes of a byte: element ``2k`` in the high nibble, ``2k + 1`` in the low."""


def _unpacked(packed: np.ndarray, count: int) -> np.ndarray:
    """One code per element, uint8, the first ``count`` of the bytes ``packed``."""
    return unpack_words(packed.reshape(-1), 4, axis=0, order=HIGH_NIBBLE_FIRST)[:count]


def dequantized(weight: str, arrays: dict, config: dict) -> np.ndarray:
    """The weight as ``bitsandbytes.functional.dequantize_4bit`` gives it: ``code[q] * absmax`` in
    float32 over blocks of the flattened weight, rounded once to the state's dtype."""
    state, packed, absmax = _checked(weight, arrays)
    shape, block = tuple(state["shape"]), state["blocksize"]
    count = math.prod(shape)
    codes = _unpacked(packed, count)
    scales = np.repeat(absmax, block)[:count]
    with np.errstate(over="ignore", invalid="ignore"):
        values = _CODES[state["quant_type"]][codes] * scales
    return values.astype(float_dtype(state["dtype"])).reshape(shape)


# --------------------------------------------------------------------------------------
# Out
# --------------------------------------------------------------------------------------


def parts_of(weight: str, tensor, config: dict) -> dict:
    """A Hurray NF4 tensor as bitsandbytes' parts (not double-quantized): the packed codes, the
    float32 absmax, the NF4 table and the JSON state (``dtype``: the carried ``config.json``'s, else
    ``bnb_4bit_compute_dtype``, else float32).  :class:`NoExactForm` for any other scheme, a block
    axis other than the last, rows that are not whole blocks, or a block size bitsandbytes'
    kernels do not take."""
    from ...model import Nf4, RowMajorLayout

    desc = tensor.descriptor
    q = desc.quantization
    shape = tuple(int(n) for n in desc.shape)
    if not isinstance(q, Nf4):
        raise NoExactForm(f"{weight}: bitsandbytes 4-bit holds NF4 (and its own FP4), not {type(q).__name__}")
    if not isinstance(desc.layout, RowMajorLayout):
        raise NoExactForm(f"{weight}: bitsandbytes packs codes in row-major order; this NF4 tensor is laid out "
                          f"{type(desc.layout).__name__}")
    if len(shape) < 1 or q.axis != len(shape) - 1:
        raise NoExactForm(f"{weight}: bitsandbytes blocks run along the flattened weight; the NF4 blocks of "
                          f"{list(shape)} run along axis {q.axis}, not the last")
    if q.block_size not in _BLOCKSIZES:
        raise NoExactForm(f"{weight}: NF4 block size {q.block_size}; bitsandbytes' kernels take {_BLOCKSIZES}")
    if shape[-1] % q.block_size:
        raise NoExactForm(f"{weight}: rows of {shape[-1]} are not whole blocks of {q.block_size}; bitsandbytes' "
                          "blocks would straddle them")
    count = math.prod(shape)
    buffers = tensor.buffers
    data = np.frombuffer(buffers[0], np.uint8)[:(count + 1) // 2]
    absmax = np.frombuffer(buffers[q.scale_buffer_index], "<f4").astype(np.float32)
    swapped = ((data << 4) | (data >> 4)).astype(np.uint8)
    if count % 2:
        swapped[-1] &= 0xF0  # the odd last element alone, in the high nibble
    dtype = str(config.get(MODEL_DTYPE_KEY) or config.get("bnb_4bit_compute_dtype") or "float32")
    if dtype not in FLOAT_NAMES:
        raise HurraySchemaError(f"{weight}: dtype {dtype!r}; bitsandbytes records one of {FLOAT_NAMES}")
    state = {"quant_type": "nf4", "blocksize": int(q.block_size), "dtype": dtype, "shape": list(shape)}
    text = json.dumps(state).encode("utf-8")
    return {weight: swapped.reshape(-1, 1), weight + ".absmax": absmax, weight + ".quant_map": NF4_CODE.copy(),
            weight + STATE_KEY + "nf4": np.frombuffer(text, np.uint8).copy()}
