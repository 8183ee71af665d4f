"""The element-type tag table with bit width, packing and alignment.

Spec: ``element-types.md § Type Properties Summary`` and ``§ Buffer Size Calculation``.
"""

from __future__ import annotations

import functools
from typing import Optional

import attrs

from .tags import ElementType, is_private_tag

REF = "element-types.md § Type Properties Summary"


@attrs.frozen(slots=True)
class ElementTypeInfo:
    """One row of the type properties table."""

    tag: ElementType
    name: str
    tier: int
    bit_width: int
    alignment: int
    is_float: bool
    is_signed: bool

    @property
    def sub_byte(self) -> bool:
        return self.bit_width < 8

    @property
    def byte_width(self) -> Optional[int]:
        """Bytes per element, ``None`` for sub-byte types."""
        return None if self.sub_byte else self.bit_width // 8

    @property
    def packing_factor(self) -> Optional[int]:
        """Elements per byte for 1/2/4-bit types; ``None`` for 6-bit (4 per 3 bytes) and whole-byte types."""
        return 8 // self.bit_width if self.bit_width in (1, 2, 4) else None

    def buffer_bytes(self, element_count: int) -> int:
        """Bytes needed for ``element_count`` packed elements (``element-types.md § Buffer Size Calculation``).

        A zero-element tensor needs zero bytes, with no partial trailing byte (ADR-007 § 7).
        """
        if self.bit_width == 6:
            return -(-element_count // 4) * 3
        return -(-element_count * self.bit_width // 8)


def _row(tag, tier, bits, align, is_float, signed):
    return ElementTypeInfo(tag, tag.name.lower(), tier, bits, align, is_float, signed)


ELEMENT_TYPES: dict[ElementType, ElementTypeInfo] = {
    info.tag: info
    for info in (
        _row(ElementType.FLOAT16, 1, 16, 2, True, True),
        _row(ElementType.BFLOAT16, 1, 16, 2, True, True),
        _row(ElementType.FLOAT32, 1, 32, 4, True, True),
        _row(ElementType.FLOAT64, 1, 64, 8, True, True),
        _row(ElementType.INT8, 1, 8, 1, False, True),
        _row(ElementType.UINT8, 1, 8, 1, False, False),
        _row(ElementType.INT16, 1, 16, 2, False, True),
        _row(ElementType.UINT16, 1, 16, 2, False, False),
        _row(ElementType.INT32, 1, 32, 4, False, True),
        _row(ElementType.UINT32, 1, 32, 4, False, False),
        _row(ElementType.INT64, 1, 64, 8, False, True),
        _row(ElementType.UINT64, 1, 64, 8, False, False),
        _row(ElementType.BOOL, 1, 1, 1, False, False),
        _row(ElementType.FLOAT8_E4M3, 2, 8, 1, True, True),
        _row(ElementType.FLOAT8_E5M2, 2, 8, 1, True, True),
        _row(ElementType.FLOAT8_E8M0, 2, 8, 1, True, False),
        _row(ElementType.FLOAT4_E2M1, 2, 4, 1, True, True),
        _row(ElementType.FLOAT6_E2M3, 2, 6, 1, True, True),
        _row(ElementType.FLOAT6_E3M2, 2, 6, 1, True, True),
        _row(ElementType.FLOAT128, 2, 128, 16, True, True),
        _row(ElementType.INT4, 2, 4, 1, False, True),
        _row(ElementType.UINT4, 2, 4, 1, False, False),
        _row(ElementType.INT2, 2, 2, 1, False, True),
        _row(ElementType.UINT2, 2, 2, 1, False, False),
        _row(ElementType.COMPLEX64, 2, 64, 4, True, True),
        _row(ElementType.COMPLEX128, 2, 128, 8, True, True),
    )
}

RESERVED_TYPE_TAG = 0x47
"""Held back by the spec; no implementation may use it (``element-types.md``)."""


is_private_type = is_private_tag
"""Implementation-private element types (``element-types.md § Type Identifier Encoding``):
the private tag range of :mod:`hurray_schema.structs.tags`."""


def element_type_info(tag: int) -> Optional[ElementTypeInfo]:
    """The table row of ``tag``, or ``None`` when the spec assigns no built-in type to it."""
    return ELEMENT_TYPES.get(tag)


@functools.cache
def numpy_dtypes() -> dict:
    """Element type -> the NumPy / ``ml_dtypes`` dtype of its decoded array, one element per
    item (the sub-byte and narrow-float ``ml_dtypes`` items hold one code in their low bits).
    Types without one (float128, private types) are absent.  NumPy and ``ml_dtypes`` are
    imported on first use, not with the package."""
    import ml_dtypes
    import numpy as np

    return {
        ElementType.FLOAT16: np.dtype(np.float16), ElementType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
        ElementType.FLOAT32: np.dtype(np.float32), ElementType.FLOAT64: np.dtype(np.float64),
        ElementType.INT8: np.dtype(np.int8), ElementType.UINT8: np.dtype(np.uint8),
        ElementType.INT16: np.dtype("<i2"), ElementType.UINT16: np.dtype("<u2"),
        ElementType.INT32: np.dtype("<i4"), ElementType.UINT32: np.dtype("<u4"),
        ElementType.INT64: np.dtype("<i8"), ElementType.UINT64: np.dtype("<u8"),
        ElementType.BOOL: np.dtype(np.bool_),
        ElementType.FLOAT8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn), ElementType.FLOAT8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
        ElementType.FLOAT8_E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
        ElementType.FLOAT4_E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
        ElementType.FLOAT6_E2M3: np.dtype(ml_dtypes.float6_e2m3fn), ElementType.FLOAT6_E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
        ElementType.INT4: np.dtype(ml_dtypes.int4), ElementType.UINT4: np.dtype(ml_dtypes.uint4),
        ElementType.INT2: np.dtype(ml_dtypes.int2), ElementType.UINT2: np.dtype(ml_dtypes.uint2),
        ElementType.COMPLEX64: np.dtype("<c8"), ElementType.COMPLEX128: np.dtype("<c16"),
    }


@functools.cache
def _element_types_by_dtype() -> dict:
    return {dtype: tag for tag, dtype in numpy_dtypes().items()}


def element_type_of(dtype) -> Optional[ElementType]:
    """The element type whose decoded arrays have ``dtype`` (either byte order), or ``None``."""
    import numpy as np

    dtype = np.dtype(dtype)
    return _element_types_by_dtype().get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
