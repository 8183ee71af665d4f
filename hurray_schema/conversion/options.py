"""The options of a conversion into Hurray, checked once: :class:`ConvertOptions`, the parsing of
``"SCHEME[:storage]"`` and ``"2x2"`` grids, and which tensors quantize / spqr / partition apply to."""

from __future__ import annotations

import fnmatch
from typing import Optional

import attrs

from ..errors import HurraySchemaError
from .source import SourceTensor

__all__ = ["ConvertOptions", "scheme_option", "grid_option", "selected", "KEPT_AS_THEY_ARE"]

KEPT_AS_THEY_ARE = ("embed", "embd", "norm", "bias")
"""Name parts of tensors ``quantize`` / ``spqr`` / ``partition`` leave alone unless named."""


@attrs.frozen(slots=True)
class ConvertOptions:
    """How tensors go into Hurray: ``dequantize`` / ``requantize`` (GGUF types without an exact
    form), ``quantize`` / ``spqr`` / ``partition`` on the tensors ``select`` names, ``verify``."""

    dequantize: bool
    requantize: Optional[tuple]
    quantize: Optional[tuple]
    spqr: Optional[float]
    partition: Optional[tuple]
    select: Optional[tuple]
    verify: bool

    @property
    def transforms(self) -> bool:
        return self.quantize is not None or self.spqr is not None or self.partition is not None


def scheme_option(value, what: str) -> Optional[tuple]:
    """"SCHEME[:storage]" -> (scheme, storage or None)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return value
    scheme, _, storage = str(value).partition(":")
    from ..builders import SCHEME_NAMES

    if scheme.lower() not in SCHEME_NAMES:
        raise HurraySchemaError(f"{what} {value!r}: the scheme is one of {sorted(SCHEME_NAMES)}")
    return scheme.lower(), (storage or None)


def grid_option(value) -> Optional[tuple]:
    """"2x2" (or pieces per dimension) -> (2, 2)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = tuple(int(n) for n in value.lower().split("x"))
        except ValueError:
            raise HurraySchemaError(f"partition {value!r}: pieces per dimension, like 2x2") from None
    grid = tuple(int(n) for n in (value if isinstance(value, (tuple, list)) else (value,)))
    if not grid or any(n < 1 for n in grid):
        raise HurraySchemaError(f"partition {value!r}: pieces per dimension, each at least 1")
    return grid


def selected(source: SourceTensor, options: ConvertOptions) -> bool:
    """Whether quantize / spqr / partition apply to ``source``: a name matching ``select`` (a glob),
    else a 2-D float weight whose name is no embedding, norm or bias."""
    if options.select:
        return any(fnmatch.fnmatchcase(source.name, pattern) for pattern in options.select)
    lowered = source.name.lower()
    return source.is_float and len(source.shape) == 2 and not any(part in lowered for part in KEPT_AS_THEY_ARE)
