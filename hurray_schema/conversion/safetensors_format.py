"""safetensors files in and out.

In: the ``safetensors`` package opens the file (``safe_open``: the header is parsed and checked
there -- offsets in order, inside the file, sizes matching shapes and dtypes), lists the
tensors and gives ``__metadata__``; the bytes themselves are then taken from a memory map of
the file at the header's offsets, so a dense tensor goes to the Hurray writer without a copy.

Out: the format is an 8-byte little-endian header length, a JSON header (dtype, shape and
``data_offsets`` per tensor, ``__metadata__`` strings), padded with spaces to 8 bytes, then
the tensors' bytes back to back.  It is written here tensor by tensor (the header is known
before any tensor is decoded), so a model larger than memory converts.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from typing import Iterator, Optional

import numpy as np

from ..errors import HurraySchemaError
from ..model import ElementType
from ..structs.element_types import numpy_dtype_of
from .source import SourceTensor

__all__ = ["SAFETENSORS_TYPES", "read_safetensors", "write_safetensors"]

SAFETENSORS_TYPES = {
    "BOOL": ElementType.BOOL, "U8": ElementType.UINT8, "I8": ElementType.INT8, "U16": ElementType.UINT16,
    "I16": ElementType.INT16, "U32": ElementType.UINT32, "I32": ElementType.INT32, "U64": ElementType.UINT64,
    "I64": ElementType.INT64, "F16": ElementType.FLOAT16, "BF16": ElementType.BFLOAT16, "F32": ElementType.FLOAT32,
    "F64": ElementType.FLOAT64, "F8_E4M3": ElementType.FLOAT8_E4M3, "F8_E5M2": ElementType.FLOAT8_E5M2,
    "F8_E8M0": ElementType.FLOAT8_E8M0, "C64": ElementType.COMPLEX64,
}
"""safetensors dtype -> Hurray element type: every safetensors dtype with one byte or more per
element.  (The packed F4 / F6 dtypes are refused: their bit order within a byte is not pinned
down by a reader available here.)"""

_NAME_OF_TYPE = {tag: name for name, tag in SAFETENSORS_TYPES.items()}

_HEADER_LENGTH = struct.Struct("<Q")
HEADER_ALIGNMENT = 8
"""The header is padded with spaces so that the data starts 8-byte aligned (as safetensors writes it)."""


def _memory_bytes() -> int:
    """Physical memory (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


def _library_error(path, exc: Exception) -> HurraySchemaError:
    return HurraySchemaError(f"{path}: not a readable safetensors file ({exc})")


def _header(view, path) -> tuple[dict, int]:
    """(the parsed header, the offset of the data) -- after ``safe_open`` accepted the file."""
    (length,) = _HEADER_LENGTH.unpack_from(view, 0)
    start = _HEADER_LENGTH.size + length
    header = json.loads(bytes(view[_HEADER_LENGTH.size:start]))
    if not isinstance(header, dict):
        raise HurraySchemaError(f"{path}: the safetensors header is not a JSON object")
    return header, start


def read_safetensors(path) -> tuple[dict, list[SourceTensor], "mmap.mmap"]:
    """(``__metadata__``, the tensors in file order, the memory map holding their bytes)."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - optional dependency
        raise HurraySchemaError("reading safetensors needs the safetensors package: "
                                "pip install 'hurray_schema[safetensors]'") from None
    try:
        with safe_open(os.fspath(path), framework="numpy") as opened:
            names = list(opened.keys())
            metadata = dict(opened.metadata() or {})
    except Exception as exc:  # the library's own error types (SafetensorError, OSError ...)
        raise _library_error(path, exc) from None
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # read ahead: the pages are faulted in at once rather than one by one as the writer copies them
        # (twice as fast for a file in the page cache) -- unless the file would not stay in memory
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if size <= _memory_bytes() // 4 else 0)
        mapped = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ) if size else None
    if mapped is None:
        raise HurraySchemaError(f"{path}: empty file")
    view = memoryview(mapped)
    header, start = _header(view, path)
    order = sorted(names, key=lambda name: tuple(header[name]["data_offsets"]))
    tensors = [_source_tensor(name, header[name], view, start, path) for name in order]
    return metadata, tensors, mapped


def _source_tensor(name: str, entry: dict, view: memoryview, start: int, path) -> SourceTensor:
    dtype = entry["dtype"]
    shape = tuple(int(n) for n in entry["shape"])
    begin, end = (int(n) for n in entry["data_offsets"])
    tag = SAFETENSORS_TYPES.get(dtype)
    if tag is None:
        raise HurraySchemaError(f"{path}: tensor {name!r} has dtype {dtype}, which has no Hurray element type here")
    data = view[start + begin:start + end]

    def values() -> np.ndarray:
        return np.frombuffer(data, numpy_dtype_of(tag)).reshape(shape)

    def build():
        from ..io import Tensor

        if tag == ElementType.BOOL:  # one byte per value in safetensors, 8 per byte in Hurray
            return Tensor.from_numpy(values() != 0), False
        return Tensor.dense(tag, shape, data), True

    is_float = tag in (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32)
    return SourceTensor(name, dtype, len(data), shape, build, values, is_float)


# --------------------------------------------------------------------------------------
# Out
# --------------------------------------------------------------------------------------


def output_type(dtype: np.dtype) -> tuple[str, np.dtype]:
    """(safetensors dtype, NumPy dtype written) for decoded values of ``dtype``: its own where
    safetensors has it, else widened exactly (sub-byte integers to int8 / uint8, float4 / float6
    to float32); complex128 has no safetensors type."""
    from ..structs.element_types import element_type_of

    tag = element_type_of(dtype)
    if tag in _NAME_OF_TYPE:
        return _NAME_OF_TYPE[tag], np.dtype(dtype)
    if tag in (ElementType.INT4, ElementType.INT2):
        return "I8", np.dtype(np.int8)
    if tag in (ElementType.UINT4, ElementType.UINT2):
        return "U8", np.dtype(np.uint8)
    if tag in (ElementType.FLOAT4_E2M1, ElementType.FLOAT6_E2M3, ElementType.FLOAT6_E3M2):
        return "F32", np.dtype(np.float32)
    raise HurraySchemaError(f"decoded values of {dtype} have no safetensors dtype")


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return json.dumps(value)


def write_safetensors(out, entries: list, metadata: Optional[dict], decode) -> Iterator[tuple]:
    """Write ``entries`` -- ``(name, shape, decoded dtype)`` -- to the binary file ``out``, calling
    ``decode(i)`` for the array of entry ``i`` only when its bytes are due; yields
    ``(i, type out, bytes out, array)`` after each.  ``metadata`` becomes ``__metadata__`` (values
    that are not strings as their JSON text, bytes as hex)."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): _text(v) for k, v in metadata.items()}
    offset = 0
    written = []
    for name, shape, dtype in entries:
        type_name, out_dtype = output_type(dtype)
        nbytes = math.prod(shape) * out_dtype.itemsize
        header[name] = {"dtype": type_name, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        written.append((type_name, out_dtype, nbytes))
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(len(raw) + _HEADER_LENGTH.size) % HEADER_ALIGNMENT)
    out.write(_HEADER_LENGTH.pack(len(raw)))
    out.write(raw)
    for i, (type_name, out_dtype, nbytes) in enumerate(written):
        array = np.ascontiguousarray(decode(i))
        if array.dtype != out_dtype:
            array = array.astype(out_dtype)
        array = array.astype(out_dtype.newbyteorder("<"), copy=False)
        data = array.reshape(-1).view(np.uint8)
        if data.size != nbytes:  # pragma: no cover - a decoder that disagrees with the descriptor
            raise HurraySchemaError(f"{entries[i][0]!r} decoded to {data.size} bytes, not {nbytes}")
        out.write(data)
        yield i, type_name, nbytes, array
