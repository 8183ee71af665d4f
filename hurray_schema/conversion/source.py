"""What every input format hands the converter: one :class:`SourceTensor` per tensor."""

from __future__ import annotations

from typing import Callable

import attrs

from ..errors import HurraySchemaError

__all__ = ["SourceTensor", "NoExactForm"]


class NoExactForm(HurraySchemaError):
    """A tensor whose values Hurray cannot hold exactly in its own form (a GGUF type with a float
    offset, a zero scale over zeros of both signs, a non-finite scale): the caller decides whether to
    store it decoded (``dequantize``) or to quantize it again (``requantize``)."""


@attrs.frozen(slots=True)
class SourceTensor:
    """One tensor of an input file.

    ``build()`` gives ``(item, backed)``: the Hurray tensor holding exactly the input's values
    (``backed``: its buffers are views of the input's memory map, nothing was allocated), or
    raises :class:`NoExactForm`.  ``values()`` gives the values as the input format's own
    library decodes them (float32 for GGUF's block types) -- what the report's errors are
    measured against and what ``quantize`` / ``spqr`` start from."""

    name: str
    type_in: str
    bytes_in: int
    shape: tuple
    build: Callable
    values: Callable
    is_float: bool
