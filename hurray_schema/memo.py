"""Every table the decoder's fast path keeps, in one object (:class:`Memo`).

Descriptors are immutable values and the rules are functions of them, so work done once for
some bytes, a header, a signature or a binding can be reused.  Each such table is declared
here with its bound and what it maps; the decode path reads and fills them through the one
instance :data:`MEMO`, which :class:`hurray_schema.codec.Decoder` owns.  Nothing else in the
package keeps state a decode fills: ``memo.reset()`` forgets everything at once, and
``memo.stats()`` says what is held.

Every table is bounded: past its bound it is emptied and fills again, so hostile input costs
one entry per item at most.  The input picks the keys (headers, bytes, signatures), never the
size of a key: descriptors are remembered by value only up to :data:`MAX_VALUE_BYTES`.

The tables are plain dicts and sets, emptied in place, so the hot paths may bind their
methods once (``MEMO.compiled.get``).  Two tables remember *objects* rather than values (the
bytes encoded for a descriptor object, the members a head object bound cleanly): hashing a
descriptor by value costs more than the work they spare, so they are :class:`IdentityTable`
s, which keep the object with its entry -- the only place an object's ``id`` is a key.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["Memo", "IdentityTable", "MEMO", "MAX_VALUES", "MAX_VALUE_BYTES", "MAX_SIGNATURES"]

MAX_SIGNATURES = 1024
"""Most headers remembered at once (seen, compiled or refused) and most signatures planned."""
MAX_VALUES = 4096
"""Most descriptors remembered by value at once in each by-value table."""
MAX_VALUE_BYTES = 1024
"""Only descriptors of at most this many bytes are remembered by value (typical ones have a few
hundred), so a by-value table holds at most ``MAX_VALUES * MAX_VALUE_BYTES`` bytes of keys."""
MAX_SHAPES_PER_LAYOUT = 8
"""Most compiled encoders tried by layout class before an encoder's key is built."""
MAX_CODE = 8192
"""Most code objects held (each compiled once per process, or loaded from the cache folder)."""
MAX_TILINGS = 256
MAX_BINDINGS = 1024


class IdentityTable(dict):
    """A bounded table of objects -> values, by identity: ``id(obj) -> (obj, value)``, an entry
    answering only for the very object it was made for (it keeps that object alive, so its
    ``id`` is not reused).  A hot path may inline :meth:`lookup` (one ``get`` and one ``is``)."""

    __slots__ = ("limit",)

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def lookup(self, obj) -> Optional[Any]:
        entry = self.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def remember(self, obj, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[id(obj)] = (obj, value)


_TABLES = {
    # the decoders compiled per header (hurray_schema.signature)
    "compiled": (dict, MAX_SIGNATURES, "header bytes -> the decoder compiled for them"),
    "seen": (set, MAX_SIGNATURES, "headers decoded cleanly once (compiled the second time)"),
    "refused": (set, MAX_SIGNATURES, "headers the general decoder keeps"),
    "values": (dict, MAX_VALUES, "exact descriptor bytes -> the descriptor a compiled decoder made of them"),
    "accepted": (dict, MAX_VALUES, "exact descriptor bytes -> the descriptor every rule passed on (default limits)"),
    "parsed": (dict, MAX_VALUES, "exact descriptor bytes -> their clean structural decode (default limits)"),
    "constructors": (dict, None, "value class -> its positional constructor (one per class)"),
    # the encoders compiled per descriptor shape
    "encoders": (dict, MAX_SIGNATURES, "encoder key -> compiled encoder, or None for the general encoder"),
    "by_layout": (dict, None, "layout class -> its compiled encoders (at most MAX_SHAPES_PER_LAYOUT)"),
    "last_hit": (dict, None, "layout class -> the compiled encoder of its last descriptor"),
    "encoded": (IdentityTable, MAX_VALUES, "descriptor object -> its wire bytes"),
    # the rules (hurray_schema.rules)
    "plans": (dict, MAX_SIGNATURES, "signature and facts -> the plan of the rules that can fire"),
    "conditions": (dict, MAX_SIGNATURES, "(rule or report, signature) -> its expression compiled"),
    "prefixes": (dict, None, "(declaration, field) -> the plan of the fields before it (one per field)"),
    "field_names": (dict, None, "value class -> its wire field names (one per class)"),
    "tilings": (set, MAX_TILINGS, "partition boxes found to tile their head exactly"),
    "bindings": (IdentityTable, MAX_BINDINGS, "composite head object -> the members it bound cleanly, per check"),
    # the annotated views (hurray_schema.hexview, hurray_schema.htmlview)
    "field_errors": (dict, MAX_VALUES, "descriptor bytes -> the field errors of its annotated view"),
    "view_plans": (dict, None, "declared field -> its codec alone (one per field)"),
    "view_layouts": (dict, None, "fixed table -> where each field sits (one per table)"),
    "view_prefixes": (dict, None, "(table, field count) -> the codec of its first fields (one per table and count)"),
    # generated code (hurray_schema.codecache): decoders, encoders, plans, conditions, constructors
    "code": (dict, MAX_CODE, "hash of (name, source) -> its code object"),
    # the writers (hurray_schema.io)
    "written": (dict, MAX_VALUES, "descriptor bytes a strict reader accepted -> the descriptor"),
}
"""Name -> (kind, bound or None for a table keyed by the package's own classes, what it maps)."""


class Memo:
    """The tables of :data:`_TABLES`, as attributes of one object, with the switch of the
    by-value tables (:meth:`use_value_tables`)."""

    __slots__ = (*_TABLES, "values_on")

    def __init__(self):
        for name, (kind, limit, _) in _TABLES.items():
            setattr(self, name, kind(limit) if kind is IdentityTable else kind())
        self.values_on = True

    @staticmethod
    def limit(name: str) -> Optional[int]:
        """The bound of table ``name`` (None: keyed by the package's own classes)."""
        return _TABLES[name][1]

    def reset(self) -> None:
        """Forget everything every table holds (the switch stays as it is)."""
        for name in _TABLES:
            getattr(self, name).clear()

    def stats(self) -> dict[str, tuple[int, Optional[int], str]]:
        """Table name -> (entries held, bound, what it maps)."""
        return {name: (len(getattr(self, name)), limit, doc) for name, (_, limit, doc) in _TABLES.items()}

    def use_value_tables(self, enabled: bool) -> bool:
        """Turn the by-value tables (decoded, accepted, parsed, encoded bytes) on or off, emptying
        them; returns the previous setting.  Off, every call does the whole work."""
        previous = self.values_on
        self.values_on = bool(enabled)
        for name in ("values", "accepted", "parsed", "encoded", "written"):
            getattr(self, name).clear()
        return previous


MEMO = Memo()
"""The one memo: the default decoder's (:data:`hurray_schema.codec.DECODER`)."""
