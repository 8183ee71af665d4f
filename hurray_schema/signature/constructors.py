"""Constructors of the frozen value classes taking every field positionally, generated once per
class: what the compiled decoders build descriptors, layouts, handles and sections with."""

from __future__ import annotations

from typing import Callable, Optional

import attrs

from ..codecache import compiled as compiled_code
from ..memo import MEMO
from ..model import TensorDescriptor

__all__ = ["slot_constructor", "TWIN_MIN_FIELDS"]


def slot_constructor(cls, trusted: frozenset = frozenset()) -> Callable:
    """A constructor of the frozen slotted attrs class ``cls`` taking every field positionally.

    It stores the same values ``cls(...)`` would -- each field's attrs converter applied --
    but not through the frozen ``__init__``, which pays a ``object.__setattr__`` call per
    field.  Fields named in ``trusted`` skip their converter: the caller guarantees the
    value is already what the converter returns (a tuple of ints straight from
    :mod:`struct`, a tuple it built itself).  The model has no validators (checked here),
    so nothing else is bypassed.

    A class of at least :data:`TWIN_MIN_FIELDS` fields is filled as an instance of its
    *twin* -- a plain class with the same slots, whose attribute stores are plain slot
    stores -- and then given its class (the two have one memory layout, so CPython allows
    the ``__class__`` assignment).  That assignment costs about as much as writing two
    slots through their descriptors, so smaller classes are filled through the slot
    descriptors directly.
    """
    fields = attrs.fields(cls)
    if any(f.validator is not None for f in fields) or hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} has validators or a post-init hook")
    twin = _twin_of(cls) if len(fields) >= TWIN_MIN_FIELDS else None
    namespace: dict = {"_new": object.__new__, "_cls": cls, "_twin": twin}
    lines = [f"def new_{cls.__name__}({', '.join(f'a{i}' for i in range(len(fields)))}):",
             f"    s = _new({'_cls' if twin is None else '_twin'})"]
    for i, f in enumerate(fields):
        value = f"a{i}"
        if f.converter is not None and f.name not in trusted:
            namespace[f"_convert{i}"] = f.converter
            value = f"_convert{i}(a{i})"
        if twin is None:
            namespace[f"_set{i}"] = cls.__dict__[f.name].__set__
            lines.append(f"    _set{i}(s, {value})")
        else:
            lines.append(f"    s.{f.name} = {value}")
    if twin is not None:
        lines.append("    s.__class__ = _cls")
    lines.append("    return s")
    exec(compiled_code("\n".join(lines) + "\n", f"<hurray_schema constructor {cls.__qualname__}>"), namespace)
    return namespace[f"new_{cls.__name__}"]


TWIN_MIN_FIELDS = 3
"""Fewest fields of a value class that :func:`slot_constructor` fills through its twin
(measured on CPython 3.11: one ``__class__`` assignment costs about two slot-descriptor calls)."""


def _twin_of(cls) -> Optional[type]:
    """A plain class with the slots of ``cls`` (same names, same order), or None when an
    instance of it cannot become a ``cls`` (another base, a ``__weakref__`` or ``__dict__`` slot)."""
    if cls.__bases__ != (object,):
        return None
    twin = type(f"_{cls.__name__}Twin", (), {"__slots__": tuple(cls.__slots__), "__module__": __name__})
    probe = object.__new__(twin)
    try:
        probe.__class__ = cls
    except TypeError:
        return None
    return twin


_CONSTRUCTORS = MEMO.constructors
_AS_UNPACKED = (attrs.fields_dict(TensorDescriptor)["shape"].converter, bytes)
"""Converters that give back what :mod:`struct` unpacks for their fields (a tuple of ints, a
bytes): the compiled decoders pass those values as they are."""


def _constructor(cls) -> Callable:
    made = _CONSTRUCTORS.get(cls)
    if made is None:
        trusted = frozenset(f.name for f in attrs.fields(cls) if f.converter in _AS_UNPACKED)
        made = _CONSTRUCTORS[cls] = slot_constructor(cls, trusted)
    return made


_NEW_DESCRIPTOR = slot_constructor(TensorDescriptor, frozenset({"type_tag", "shape", "buffers", "trailing"}))
"""The descriptor's converters are skipped: the compiled decoder passes the converted
type_tag, the shape as unpacked (a tuple of ints), a tuple of handles and ``b''``."""
