"""The bounded tables of the fast path, all in this one module: the compiled decoders by header
bytes (and the headers seen once or refused), the compiled encoders by descriptor shape, and the
by-value tables -- descriptors by their exact bytes (decoded, accepted, parsed) and the bytes of
the descriptor objects encoded -- with the switch that turns the by-value tables off
(:func:`use_value_tables`) and :func:`clear`."""

from __future__ import annotations

from typing import Optional

from ..model import TensorDescriptor
from ..rules.descriptor.dispatch import on_declare, remember_passed

__all__ = [
    "MAX_SIGNATURES", "MAX_VALUES", "MAX_VALUE_BYTES", "MAX_SHAPES_PER_LAYOUT", "accepted", "remember_accepted",
    "parsed", "remember_parsed", "use_value_tables", "clear",
]


MAX_SIGNATURES = 1024
"""Most headers remembered at once (seen, compiled or refused); the input picks the headers,
so the tables are bounded."""


MAX_VALUES = 4096
"""Most descriptors remembered by value at once (decoded ones by their bytes, encoded ones
with their bytes); past it a table is emptied and fills again."""
MAX_VALUE_BYTES = 1024
"""Only descriptors of at most this many bytes are remembered (typical ones have a few
hundred), so the tables hold at most ``MAX_VALUES * MAX_VALUE_BYTES`` bytes of keys whatever
the input: a compiled header may declare a long descriptor (quantization padding)."""

_VALUES: dict = {}  # exact descriptor bytes -> the TensorDescriptor a compiled decoder made of them
_ENCODED: dict = {}  # id(descriptor) -> (descriptor, its wire bytes); the entry keeps the descriptor alive
_ACCEPTED: dict = {}
"""Exact descriptor bytes -> the descriptor every semantic rule passed on, within the default limits
(:func:`accepted`)."""
_PARSED: dict = {}
"""Exact descriptor bytes -> the descriptor their structural decode gave without a finding, within
the default limits (:func:`parsed`); every accepted descriptor is one."""
_TABLES_ON = [True]


def accepted(data) -> Optional[TensorDescriptor]:
    """The descriptor the bytes ``data`` (exactly one descriptor) were decoded to before, under the
    default limits, when every semantic rule passed on it; None when not known.  What
    :func:`~hurray_schema.codec.decode_descriptor` and :func:`~hurray_schema.codec.parse_descriptor`
    return for them in either mode, with no finding: one table lookup before any other work."""
    return _ACCEPTED.get(data)


def remember_accepted(data: bytes, desc: TensorDescriptor) -> None:
    """Keep ``desc`` as what the bytes ``data`` (exactly its descriptor) decode to, every rule passing
    within the default limits (bounded as the other tables)."""
    if _TABLES_ON[0] and len(data) <= MAX_VALUE_BYTES:
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
    if _TABLES_ON[0] and len(data) <= MAX_VALUE_BYTES:
        if len(_PARSED) >= MAX_VALUES:
            _PARSED.clear()
        _PARSED[data] = desc


def use_value_tables(enabled: bool) -> bool:
    """Turn the by-value tables on or off, emptying them: :func:`~hurray_schema.signature.decode_known`'s, the
    encoded-bytes table of :func:`~hurray_schema.signature.encode` and the passed-descriptor table of the rules
    (:func:`hurray_schema.rules.descriptor.dispatch.remember_passed`); returns the previous
    setting.  Off, every call does the whole work (``benchmarks/decode.py`` measures both)."""
    previous = _TABLES_ON[0]
    _TABLES_ON[0] = bool(enabled)
    _VALUES.clear()
    _ENCODED.clear()
    _ACCEPTED.clear()
    _PARSED.clear()
    remember_passed(enabled)
    return previous


_COMPILED: dict = {}  # header bytes -> CompiledDecoder
_SEEN: set = set()  # headers decoded cleanly once (compiled the second time)
_REFUSED: set = set()  # headers the general decoder keeps


_ENCODERS: dict = {}  # encoder_key -> compiled encoder, or None where the general encoder is used
_BY_LAYOUT: dict = {}  # layout class -> the compiled encoders of its keys, as a tuple (at most MAX_SHAPES_PER_LAYOUT)
_LAST_HIT: dict = {}  # layout class -> the compiled encoder that encoded its last descriptor
MAX_SHAPES_PER_LAYOUT = 8
"""Most compiled encoders :func:`~hurray_schema.signature.encode` tries by layout class before building the key."""


def clear() -> None:
    """Forget every signature, compiled encoder and remembered value (tests use it to compare both paths)."""
    _VALUES.clear()
    _ACCEPTED.clear()
    _PARSED.clear()
    _ENCODED.clear()
    _ENCODERS.clear()
    _BY_LAYOUT.clear()
    _LAST_HIT.clear()
    _COMPILED.clear()
    _SEEN.clear()
    _REFUSED.clear()


on_declare(clear)  # a decoder compiled with the rules of a plan is stale once another rule is declared
