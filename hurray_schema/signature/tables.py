"""The bounded tables of the fast path live in one object, :data:`hurray_schema.memo.MEMO`
(the compiled decoders by header bytes, the headers seen once or refused, the compiled encoders
by descriptor shape, and the by-value tables -- descriptors by their exact bytes, decoded,
accepted and parsed, and the bytes of the descriptor objects encoded).  This module reads and
fills the by-value ones for the codec (:func:`accepted`, :func:`parsed`) and forgets them all
(:func:`clear`)."""

from __future__ import annotations

from typing import Optional

from ..memo import MAX_SHAPES_PER_LAYOUT, MAX_SIGNATURES, MAX_VALUE_BYTES, MAX_VALUES, MEMO
from ..model import TensorDescriptor

__all__ = [
    "MAX_SIGNATURES", "MAX_VALUES", "MAX_VALUE_BYTES", "MAX_SHAPES_PER_LAYOUT", "accepted", "remember_accepted",
    "parsed", "remember_parsed", "use_value_tables", "clear",
]

_ACCEPTED = MEMO.accepted
_PARSED = MEMO.parsed


def accepted(data) -> Optional[TensorDescriptor]:
    """The descriptor the bytes ``data`` (exactly one descriptor) were decoded to before, under the
    default limits, when every semantic rule passed on it; None when not known.  What
    :func:`~hurray_schema.codec.decode_descriptor` and :func:`~hurray_schema.codec.parse_descriptor`
    return for them in either mode, with no finding: one table lookup before any other work."""
    return _ACCEPTED.get(data)


def remember_accepted(data: bytes, desc: TensorDescriptor) -> None:
    """Keep ``desc`` as what the bytes ``data`` (exactly its descriptor) decode to, every rule passing
    within the default limits (bounded as the other tables)."""
    if MEMO.values_on and len(data) <= MAX_VALUE_BYTES:
        if len(_ACCEPTED) >= MAX_VALUES:
            _ACCEPTED.clear()
        if len(_PARSED) >= MAX_VALUES:
            _PARSED.clear()
        _ACCEPTED[data] = _PARSED[data] = desc


def parsed(data) -> Optional[TensorDescriptor]:
    """The descriptor the bytes ``data`` (exactly one descriptor) were decoded to before, under the
    default limits, without a structural finding; None when not known.  What
    :func:`~hurray_schema.codec.parse_descriptor` returns for them in either mode, with no finding."""
    return _PARSED.get(data)


def remember_parsed(data: bytes, desc: TensorDescriptor) -> None:
    """Keep ``desc`` as the clean structural decode of the bytes ``data`` (exactly its descriptor)."""
    if MEMO.values_on and len(data) <= MAX_VALUE_BYTES:
        if len(_PARSED) >= MAX_VALUES:
            _PARSED.clear()
        _PARSED[data] = desc


def use_value_tables(enabled: bool) -> bool:
    """Turn the by-value tables on or off, emptying them (:meth:`hurray_schema.memo.Memo.use_value_tables`);
    returns the previous setting.  Off, every call does the whole work (``benchmarks/decode.py``
    measures both)."""
    return MEMO.use_value_tables(enabled)


def clear() -> None:
    """Forget everything the fast path keeps (:meth:`hurray_schema.memo.Memo.reset`)."""
    MEMO.reset()
