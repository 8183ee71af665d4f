"""What the tensor builders share: the element-type parser, buffer handles at our alignment,
the strict descriptor check every built descriptor passes, and little-endian bytes of arrays."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model import BufferHandle, ElementType, TensorDescriptor
from ..rules.descriptor import first_error
from ..structs.element_types import element_type_of
from ..io.tensor import DEFAULT_BUFFER_ALIGNMENT, Composite

__all__ = ["element_type", "handle", "checked", "float_type", "little_endian", "SCALE_TYPES"]

SCALE_TYPES = (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32)
"""The element types a scale may have: a quantized tensor decodes to its scales' type."""


element_type = Composite._element_type
"""An :class:`ElementType` from itself, its number or its name (the composite builders' parser)."""


def handle(nbytes: int) -> BufferHandle:
    """The handle of a buffer of ``nbytes`` at our alignment (``buffer-protocol.md § Buffer Handle``)."""
    return BufferHandle(int(nbytes), DEFAULT_BUFFER_ALIGNMENT)


def checked(desc: TensorDescriptor) -> TensorDescriptor:
    """``desc`` if the strict descriptor rules accept it, else their first error as SpecViolation."""
    finding = first_error(desc)
    if finding is not None:
        raise finding.to_violation()
    return desc


def float_type(dtype) -> Optional[ElementType]:
    """The scale type an input dtype suggests: its own float16 / bfloat16 / float32, else None."""
    tag = element_type_of(dtype)
    return tag if tag in SCALE_TYPES else None


def little_endian(values: np.ndarray, dtype) -> np.ndarray:
    """Little-endian bytes of ``values`` as ``dtype``, as a flat uint8 array."""
    return np.ascontiguousarray(values, np.dtype(dtype).newbyteorder("<")).reshape(-1).view(np.uint8)
