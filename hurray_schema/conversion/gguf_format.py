"""GGUF files in, through the ``gguf`` package's ``GGUFReader``.

Names are kept, the shape is GGUF's ``ne`` reversed (row-major, the block axis last), the
metadata goes to the KV section (``GGUF.*`` pseudo-fields left out).  Dense types (F32, F16,
BF16, F64, I8 ... I64) are the file's bytes, not copied.  The types whose values are a scale
times an integer become per-block affine tensors (:mod:`.gguf_blocks`: the Q*_0 types, Q6_K,
Q3_K, TQ1_0, TQ2_0, the IQ types and MXFP4).  The others -- a float offset (Q4_1, Q5_1, Q2_K,
Q4_K, Q5_K), or a type not mapped here (NVFP4, Q1_0, Q8_1, Q8_K) -- have no exact form here:
:class:`~.source.NoExactForm`.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from ..errors import HurraySchemaError
from ..io.walk.kv import UInt64
from ..model import ElementType
from .gguf_blocks import BLOCK_MAPPINGS, OFFSET_TYPES
from .source import NoExactForm, SourceTensor

__all__ = ["read_gguf", "DENSE_TYPES", "GGUF_MAGIC"]

GGUF_MAGIC = b"GGUF"

DENSE_TYPES = {
    "F32": ElementType.FLOAT32, "F16": ElementType.FLOAT16, "BF16": ElementType.BFLOAT16,
    "F64": ElementType.FLOAT64, "I8": ElementType.INT8, "I16": ElementType.INT16, "I32": ElementType.INT32,
    "I64": ElementType.INT64,
}
"""GGUF's plain element types: stored as they are."""


def _gguf():
    try:
        import gguf
    except ImportError:  # pragma: no cover - optional dependency
        raise HurraySchemaError("reading GGUF needs the gguf package: pip install 'hurray_schema[gguf]'") from None
    return gguf


def read_gguf(path) -> tuple[dict, list[SourceTensor], object]:
    """(metadata for the KV section, the tensors in file order, the reader keeping the map open)."""
    gguf = _gguf()
    size = os.path.getsize(path)
    try:
        reader = gguf.GGUFReader(os.fspath(path))
    except ValueError as exc:
        raise HurraySchemaError(f"{path}: not a readable GGUF file ({_reason(exc)})") from None
    except Exception as exc:  # NumPy's errors on a file cut short, struct errors ...
        raise HurraySchemaError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    tensors = []
    for tensor in reader.tensors:
        end = tensor.data_offset + tensor.n_bytes
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise HurraySchemaError(f"{path}: tensor {tensor.name!r} ends at byte {end}, the file has {size}")
        tensors.append(_source_tensor(gguf, tensor))
    return _metadata(gguf, reader), tensors, reader


def _reason(exc: ValueError) -> str:
    text = str(exc)
    if "GGMLQuantizationType" in text:
        return f"a tensor has a type this gguf package does not know: {text}"
    return text


def _metadata(gguf, reader) -> dict:
    """The GGUF key-value pairs as KV values: uint64 kept as uint64, an empty or nested array as its
    JSON text (a KV array needs one element type and at least one element)."""
    import json

    kv: dict = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        kind = field.types[0] if field.types else None
        if kind == gguf.GGUFValueType.ARRAY:
            nested = len(field.types) > 2
            if nested or not value:
                value = json.dumps(value)
            elif field.types[-1] == gguf.GGUFValueType.UINT64:
                value = [UInt64(v) for v in value]
        elif kind == gguf.GGUFValueType.UINT64:
            value = UInt64(value)
        kv[name] = value
    return kv


def _source_tensor(gguf, tensor) -> SourceTensor:
    kind = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    data = tensor.data

    def values() -> np.ndarray:
        if kind in DENSE_TYPES:
            from ..structs.element_types import numpy_dtype_of

            return np.frombuffer(data, numpy_dtype_of(DENSE_TYPES[kind])).reshape(shape)
        try:
            return gguf.quants.dequantize(data, tensor.tensor_type).reshape(shape)
        except NotImplementedError:
            raise HurraySchemaError(f"tensor {tensor.name!r}: the gguf package cannot decode {kind}") from None

    def build():
        from ..io import Tensor

        if kind in DENSE_TYPES:
            return Tensor.dense(DENSE_TYPES[kind], shape, memoryview(np.ascontiguousarray(data)).cast("B")), True
        return _per_block(gguf, tensor, kind, shape)

    is_float = kind in ("F32", "F16", "BF16")
    return SourceTensor(tensor.name, kind, int(tensor.n_bytes), shape, build, values, is_float)


def _per_block(gguf, tensor, kind: str, shape):
    """(the per-block affine tensor of a GGUF block type, whether its buffers are made from the input's
    map as the file is written)."""
    from ..builders import per_block_from_codes, per_block_from_packed, per_block_produced

    mapping = BLOCK_MAPPINGS.get(kind)
    if mapping is None:
        why = ("its values carry a float offset (d * q + m), per-block affine zero points are integers"
               if kind in OFFSET_TYPES else "it has no scale-times-integer form here")
        raise NoExactForm(f"tensor {tensor.name!r} is {kind}: {why}")
    _, type_size = gguf.constants.GGML_QUANT_SIZES[tensor.tensor_type]
    blocks = np.asarray(tensor.data).reshape(-1, type_size)
    sub = mapping.sub_block
    if mapping.produce is not None:
        made = mapping.produce(blocks)
        if made is not None:
            return per_block_produced(*made, shape, mapping.storage, sub), True
    elif mapping.pack is not None:
        data, scales = mapping.pack(blocks)
        if np.all(np.isfinite(scales)) and np.all(scales != 0):
            return per_block_from_packed(data.reshape(-1), scales, shape, mapping.storage, sub), False
    codes, scales = mapping.unpack(blocks)
    codes = np.ascontiguousarray(codes).reshape(scales.shape[0], scales.shape[1], sub)
    if not codes.flags.writeable:  # a view of the file's map
        codes = codes.copy()
    scales = np.ascontiguousarray(scales, np.float32)
    problem = settle_zero_scales(codes, scales)
    if problem is not None:
        raise NoExactForm(f"tensor {tensor.name!r} is {kind}: {problem}")
    return per_block_from_codes(codes.reshape(shape), scales, mapping.storage, sub), False


def settle_zero_scales(codes: np.ndarray, scales: np.ndarray) -> Optional[str]:
    """Make every scale a valid per-block scale (``per-block-affine.md § Validity Constraints``:
    finite and non-zero), in place, without changing a decoded bit; or say why it cannot.

    ``codes`` is ``(blocks, sub-blocks, size)``, ``scales`` ``(blocks, sub-blocks)``.  A zero
    scale ``d`` gives ``d * q``: a zero whose sign is ``d``'s, flipped where ``q < 0``.  When
    every value of the block has the same sign, its codes become 0 and its scale 1 or -1 of that
    sign (``s * 0`` is a zero of ``s``'s sign: -0.0 survives).  Zeros of both signs in one block,
    or a non-finite scale, have no such form."""
    if not np.all(np.isfinite(scales)):
        return "a block scale is infinite or NaN"
    zero = scales == 0
    if not zero.any():
        return None
    negative = np.signbit(scales)[..., None] ^ (codes < 0)
    all_negative = negative.all(axis=-1)
    all_positive = ~negative.any(axis=-1)
    if np.any(zero & ~(all_negative | all_positive)):
        return "a block with a zero scale holds zeros of both signs"
    scales[zero] = np.where(all_negative[zero], np.float32(-1), np.float32(1))
    codes[zero] = 0
    return None
