"""What every input format hands the converter: one :class:`SourceTensor` per tensor."""

from __future__ import annotations

from typing import Callable

import attrs

from ..errors import NoExactForm

__all__ = ["SourceTensor", "NoExactForm"]


@attrs.frozen(slots=True)
class SourceTensor:
    """One tensor of an input file.

    ``build()`` gives ``(item, backed)``: the Hurray tensor holding exactly the input's values
    (``backed``: its buffers are views of the input's memory map, nothing was allocated), or
    raises :class:`NoExactForm`.  ``values()`` gives the values as the input format's own
    library decodes them (float32 for GGUF's block types) -- what the report's errors are
    measured against and what ``quantize`` / ``spqr`` start from.  ``ulp``: the output is always
    measured against ``values()``, in units in the last place of their dtype (a quantized
    checkpoint's linear against its library's dequantization, :mod:`.quantized`)."""

    name: str
    type_in: str
    bytes_in: int
    shape: tuple
    build: Callable
    values: Callable
    is_float: bool
    ulp: bool = False
