"""The element-type tag table with bit width, packing and alignment.

Spec: ``element-types.md § Type Properties Summary`` and ``§ Buffer Size Calculation``.
"""

from __future__ import annotations

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
