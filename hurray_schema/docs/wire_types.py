"""The declared fields in the spec's vocabulary: wire types (``uint64[rank]``), when a field is
present, the table it repeats, the values a tag table leaves to implementations, and sizes
written as ``a + b·rank``."""

from __future__ import annotations

import enum
import functools
import importlib
import re
from typing import Optional

import construct

from ..structs import session as session_structs
from ..structs import tags as tag_tables
from ..structs.stream import MessageType
from ..structs._declare import fields, static_size
from .catalog import _is_table, table_name

__all__ = [
    "spec_type", "entry_table", "presence", "optional_fields", "private_values", "session_payloads", "table_size",
]


# ------------------------------------------------------------------------------------
# Wire types in the spec's vocabulary
# ------------------------------------------------------------------------------------

_FORMAT_NAMES = {
    "B": "uint8", "H": "uint16", "I": "uint32", "L": "uint32", "Q": "uint64",
    "b": "int8", "h": "int16", "i": "int32", "l": "int32", "q": "int64",
    "e": "float16", "f": "float32", "d": "float64",
}

_THIS = re.compile(r"this\[['\"](\w+)['\"]\]")


_COMPARED = re.compile(r"(==|!=|>=|<=|<|>) (\d+)\b")
_RANGE = re.compile(r"\((\w+) >= (\w+)\) & \(\1 <= (\w+)\)")


def _expr(e) -> str:
    """A construct context expression (``this.rank``) as ``rank``; a number compared with a
    field in hexadecimal (``layout_tag == 0x03``), a range test as ``0xF0 <= layout_tag <= 0xFE``."""
    text = _THIS.sub(r"\1", str(e))
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    text = _COMPARED.sub(lambda m: f"{m.group(1)} 0x{int(m.group(2)):02X}", text)
    text = _RANGE.sub(r"\2 <= \1 <= \3", text)
    return text.replace(" & ", " and ").replace(" | ", " or ")


def spec_type(sub: construct.Construct) -> str:
    """The wire type of a declared field, written as the spec's tables write it."""
    if isinstance(sub, construct.Renamed):
        return spec_type(sub.subcon)
    if isinstance(sub, construct.Const):
        inner = sub.subcon
        if isinstance(inner, construct.Bytes) and isinstance(inner.length, int):
            return f"bytes[{inner.length}]"
        return spec_type(inner)
    if isinstance(sub, construct.FormatField):
        return _FORMAT_NAMES.get(sub.fmtstr[1:], sub.fmtstr)
    if isinstance(sub, construct.Bytes):
        if isinstance(sub.length, int):
            return f"uint8[{sub.length}]"
        return f"bytes[{_expr(sub.length)}]"
    if isinstance(sub, construct.Array):
        count = sub.count if isinstance(sub.count, int) else _expr(sub.count)
        return f"{spec_type(sub.subcon)}[{count}]"
    if isinstance(sub, construct.IfThenElse):
        return spec_type(sub.thensubcon)
    if isinstance(sub, construct.Rebuild):  # a count or length an encoder derives: its wire type
        return spec_type(sub.subcon)
    if isinstance(sub, construct.Struct) and table_name(sub) is not None:
        return table_name(sub).lower()  # the spec's tables write ``layout_entry[layout_count]``
    return type(sub).__name__


def entry_table(sub: construct.Construct) -> Optional[construct.Struct]:
    """The declared table a field repeats (``Array(this.layout_count, LAYOUT_ENTRY)``), else ``None``."""
    inner = sub.subcon if isinstance(sub, construct.Renamed) else sub
    if isinstance(inner, construct.Array) and _is_table(inner.subcon):
        return inner.subcon
    return None


def presence(sub: construct.Construct) -> Optional[str]:
    """The condition under which a field is present (``If`` fields), else ``None``."""
    inner = sub.subcon if isinstance(sub, construct.Renamed) else sub
    if isinstance(inner, construct.IfThenElse):
        return _expr(inner.condfunc)
    return None


@functools.lru_cache(maxsize=256)
def optional_fields(decl: construct.Construct) -> frozenset:
    """Names of the fields a payload of ``decl`` may end before: a hello's memory class list may
    be absent (``interchange.md § CLIENT_HELLO Payload``), the payload ending where
    :data:`~hurray_schema.structs.session.HELLO_WITHOUT_CLASSES` ends."""
    short = [f.name for f in fields(session_structs.HELLO_WITHOUT_CLASSES)]
    names = [f.name for f in fields(decl)]
    if decl is session_structs.HELLO_WITHOUT_CLASSES or names[: len(short)] != short:
        return frozenset()
    return frozenset(names[len(short):])


def private_values(table: type) -> Optional[type]:
    """This implementation's values of a tag table in the range the spec leaves to
    implementations: the table ``Private<Name>`` declared beside ``<Name>``
    (:class:`~hurray_schema.structs.session.PrivateErrorCode` for ``ErrorCode``), else ``None``."""
    found = getattr(importlib.import_module(table.__module__), "Private" + table.__name__, None)
    return found if isinstance(found, type) and issubclass(found, enum.IntEnum) else None


def session_payloads() -> dict:
    """Message type → the declared table of its payload, for the session's messages
    (:data:`~hurray_schema.structs.session.SESSION_TABLES`, named as the message types); the
    tensor frames (TENSOR_DESCRIPTOR, TENSOR_DATA, TENSOR_DATA_END) are the stream's."""
    names = MessageType.__members__
    return {MessageType[name]: decl for name, decl in session_structs.SESSION_TABLES.items() if name in names}


# ------------------------------------------------------------------------------------
# Symbolic sizes and offsets: ``a + b·rank`` or unknown
# ------------------------------------------------------------------------------------


class _Size:
    """``const + per_rank·rank`` bytes, or unknown (``None``)."""

    __slots__ = ("const", "per_rank")

    def __init__(self, const: int = 0, per_rank: int = 0):
        self.const = const
        self.per_rank = per_rank

    def __add__(self, other: "_Size") -> "_Size":
        return _Size(self.const + other.const, self.per_rank + other.per_rank)

    def __str__(self) -> str:
        if not self.per_rank:
            return str(self.const)
        term = "rank" if self.per_rank == 1 else f"{self.per_rank}·rank"
        return term if not self.const else f"{self.const} + {term}"


def _field_size(sub: construct.Construct) -> Optional[_Size]:
    inner = sub.subcon if isinstance(sub, construct.Renamed) else sub
    size = static_size(inner)
    if size is not None:
        return _Size(size)
    if isinstance(inner, construct.Array) and not isinstance(inner.count, int) and _expr(inner.count) == "rank":
        item = static_size(inner.subcon)
        if item is not None:
            return _Size(0, item)
    return None


def table_size(decl: construct.Construct) -> Optional[_Size]:
    """Size of a whole table as ``a + b·rank``, or ``None`` when it depends on its values."""
    total = _Size()
    for f in fields(decl):
        size = _field_size(f)
        if size is None:
            return None
        total = total + size
    return total


# ------------------------------------------------------------------------------------
# Tag ranges
# ------------------------------------------------------------------------------------


def _private_range() -> str:
    return f"0x{tag_tables.PRIVATE_TAG_FIRST:02X}–0x{tag_tables.PRIVATE_TAG_LAST:02X}"


def _invalid_tags() -> str:
    return " and ".join(f"0x{tag:02X}" for tag in tag_tables.INVALID_TAGS)
