"""The element-type tag table with bit width, packing and alignment.

Spec: ``element-types.md § Type Properties Summary`` and ``§ Buffer Size Calculation``.
"""

from __future__ import annotations

import functools
import sys
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


_NUMPY_NAMES = {
    ElementType.FLOAT16: "float16", ElementType.FLOAT32: "float32", ElementType.FLOAT64: "float64",
    ElementType.INT8: "int8", ElementType.UINT8: "uint8", ElementType.INT16: "<i2", ElementType.UINT16: "<u2",
    ElementType.INT32: "<i4", ElementType.UINT32: "<u4", ElementType.INT64: "<i8", ElementType.UINT64: "<u8",
    ElementType.BOOL: "bool", ElementType.COMPLEX64: "<c8", ElementType.COMPLEX128: "<c16",
}
"""Element types whose decoded arrays NumPy itself holds: their dtypes by name."""

_ML_DTYPES_NAMES = {
    ElementType.BFLOAT16: "bfloat16", ElementType.FLOAT8_E4M3: "float8_e4m3fn",
    ElementType.FLOAT8_E5M2: "float8_e5m2", ElementType.FLOAT8_E8M0: "float8_e8m0fnu",
    ElementType.FLOAT4_E2M1: "float4_e2m1fn", ElementType.FLOAT6_E2M3: "float6_e2m3fn",
    ElementType.FLOAT6_E3M2: "float6_e3m2fn", ElementType.INT4: "int4", ElementType.UINT4: "uint4",
    ElementType.INT2: "int2", ElementType.UINT2: "uint2",
}
"""Element types whose decoded arrays are ``ml_dtypes`` arrays (one element per item; the sub-byte
and narrow-float items hold one code in their low bits), by ``ml_dtypes`` name."""


@functools.cache
def numpy_dtype_of(tag) -> Optional["np.dtype"]:
    """The NumPy / ``ml_dtypes`` dtype of a decoded array of ``tag``, or ``None`` (float128, private
    types).  ``ml_dtypes`` is imported only for the types it holds (importing it takes a while)."""
    import numpy as np

    name = _NUMPY_NAMES.get(tag)
    if name is not None:
        return np.dtype(name)
    name = _ML_DTYPES_NAMES.get(tag)
    if name is None:
        return None
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


@functools.cache
def _plain_element_types() -> dict:
    return {numpy_dtype_of(tag): tag for tag in _NUMPY_NAMES}


def element_type_of(dtype) -> Optional[ElementType]:
    """The element type whose decoded arrays have ``dtype`` (either byte order), or ``None``.  A dtype
    NumPy does not hold itself can only come from a loaded ``ml_dtypes``: only then is it looked up there."""
    import numpy as np

    dtype = np.dtype(dtype)
    dtype = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    tag = _plain_element_types().get(dtype)
    if tag is not None or "ml_dtypes" not in sys.modules:
        return tag
    return {numpy_dtype_of(t): t for t in _ML_DTYPES_NAMES}.get(dtype)
