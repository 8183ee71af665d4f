"""The nodes of the annotated view and the walker that makes them.

A :class:`Node` is one line of the view: a section, a field, an opaque run of bytes or an
error, with its absolute byte range.  :class:`_Walker` decodes the declared tables field by
field over a bounded view, with the fast plans the codec uses, checking every count and
length against the bytes that remain (a field that does not fit ends the walk of its part
with an ``error`` node, :class:`_Stop`).  :func:`render_value` writes a decoded value as the
view shows it.
"""

from __future__ import annotations

import contextlib
import enum
import struct
from typing import Any, Optional

import attrs
import construct

from ..docs import entry_table, optional_fields, presence, private_values, spec_type
from ..memo import MEMO
from ..model import DYNAMIC_DIMENSION
from ..structs._declare import Field, Plan, fields, static_size

__all__ = ["Node", "OPAQUE_KEEP", "render_value"]


@attrs.frozen
class Node:
    """One line of the annotated view."""

    kind: str
    """``section``, ``field``, ``opaque`` (bytes without fields) or ``error``."""
    depth: int
    label: str
    start: int
    end: int
    raw: bytes = b""
    value: Any = None
    text: str = ""
    type: str = ""
    doc: str = ""
    ref: str = ""


OPAQUE_KEEP = 4096
"""Bytes of an opaque run (data, padding, unknown payload) kept in its node."""


class _Stop(Exception):
    """A field does not fit in what remains: the walk of this part ends here."""


_FIELD_PLANS = MEMO.view_plans


def _field_plan(f: Field) -> Plan:
    plan_ = _FIELD_PLANS.get(f)
    if plan_ is None:
        plan_ = _FIELD_PLANS[f] = Plan(construct.Struct(f))
    return plan_


_TEXT_FIELDS = ("magic", "trailer_magic", "key", "name", "tensor_key", "message")
"""Byte fields shown as UTF-8 text when they decode as such."""


def _render(name: str, value, size: int = 4, tags: Optional[type] = None, full_width: bool = False) -> str:
    """A decoded value of field ``name`` as text, with the name of its tag where the field
    carries a tag table (``tags``, the field's :attr:`Field.tags`).  ``full_width`` writes a
    tag with every hex digit of its ``size`` bytes (``0x00000002``), as the session tables
    of the spec write their codes."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        if not value:
            return "empty"
        if name in _TEXT_FIELDS:
            try:
                return '"' + bytes(value).decode("utf-8") + '"'
            except UnicodeDecodeError:
                pass
        if not any(value):
            return f"all zero ({len(value)} bytes)" if len(value) > 1 else "0"
        return "0x" + bytes(value).hex()
    if isinstance(value, tuple):
        if name in ("shape", "parent_shape"):
            return "[" + ", ".join("dynamic" if v == DYNAMIC_DIMENSION else str(v) for v in value) + "]"
        return "[" + ", ".join(_render("", v, 1, tags) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if "crc" in name and isinstance(value, int):
        return f"0x{value:08X}"
    if isinstance(value, int) and tags is not None:
        if issubclass(tags, enum.IntFlag):
            names = [m.name for m in tags if value & int(m)]
            rest = value & ~sum(int(m) for m in tags)
            if rest:
                names.append(f"reserved 0x{rest:X}")
            return f"0x{value:0{2 * size}X} ({'|'.join(names) or 'none'})"
        return f"0x{value:0{2 * size if full_width else 2}X} ({_tag_text(tags, value)})"
    return str(value)


def _tag_text(tags: type, value: int) -> str:
    """The name of ``value`` in tag table ``tags``, or in this implementation's values of its
    implementation-defined range (:func:`~hurray_schema.docs.private_values`); else ``unassigned``."""
    for table, note in ((tags, ""), (private_values(tags), ", implementation-defined")):
        try:
            return table(value).name + note if table is not None else "unassigned"
        except ValueError:
            continue
    return "unassigned"


render_value = _render
"""How the annotated view writes a field's decoded value (the HTML page writes it the same way)."""


class _Walker:
    """Decodes tables field by field over a bounded view; offsets reported from ``base``.

    A ``quiet`` walker decodes and bounds-checks the same way but keeps no field nodes
    (the brief view: sections, opaque runs and errors only)."""

    def __init__(self, view: memoryview, base: int, nodes: list[Node], quiet: bool = False,
                 full_width: bool = False):
        self.view = view
        self.base = base
        self.nodes = nodes
        self.quiet = quiet
        self.full_width = full_width  # tags written with all their hex digits (session payloads)

    def sub(self, end: int, base: Optional[int] = None) -> "_Walker":
        """A walker over the first ``end`` bytes of this one's view, into the same nodes."""
        return _Walker(self.view[:end], self.base if base is None else base, self.nodes, self.quiet, self.full_width)

    def trial(self, full_width: bool = False) -> "_Walker":
        """A walker over the same bytes into nodes of its own, to keep only if its walk succeeds."""
        return _Walker(self.view, self.base, [], self.quiet, full_width)

    def section(self, label: str, start: int, end: int, depth: int, text: str = "", ref: str = "") -> int:
        self.nodes.append(Node("section", depth, label, self.base + start, self.base + end, text=text, ref=ref))
        return len(self.nodes) - 1

    def close(self, index: int, end: Optional[int] = None) -> None:
        """Set the end of the section node at ``index`` once its content is walked
        (``None``: as far as the nodes after it reach, when the walk stopped early)."""
        node = self.nodes[index]
        if end is None:
            absolute = max([n.end for n in self.nodes[index + 1:]] + [node.start])
        else:
            absolute = self.base + end
        self.nodes[index] = attrs.evolve(node, end=absolute)

    @contextlib.contextmanager
    def opened(self, index: int):
        """Close section ``index`` as far as its content reached if the walk stops inside it."""
        try:
            yield
        except _Stop:
            self.close(index)
            raise

    def error(self, message: str, pos: int, depth: int) -> None:
        self.nodes.append(Node("error", depth, "error", self.base + pos, self.base + pos, text=message))

    def opaque(self, label: str, pos: int, n: int, depth: int, doc: str = "", ref: str = "") -> int:
        n = max(0, min(n, len(self.view) - pos))
        raw = bytes(self.view[pos : pos + min(n, OPAQUE_KEEP)])  # data can be huge: keep a prefix
        self.nodes.append(Node("opaque", depth, label, self.base + pos, self.base + pos + n, raw=raw,
                               text=f"{n} bytes", doc=doc, ref=ref))
        return pos + n

    def table(self, decl: construct.Construct, pos: int, depth: int, ctx: Optional[dict] = None,
              prefix: str = "") -> tuple[dict, int]:
        """Decode every field of ``decl`` at ``pos``; raises :class:`_Stop` on a field that does not fit."""
        ctx = dict(ctx or {})
        optional = optional_fields(decl)
        for f in fields(decl):
            cond = presence(f)
            inner = f.subcon
            if cond is not None and not inner.condfunc(ctx) or f.name in optional and pos >= len(self.view):
                ctx[f.name] = None
                continue
            entry = entry_table(f)
            if entry is not None:
                ctx[f.name], pos = self.entries(f, entry, ctx, pos, depth, prefix)
                continue
            start = pos
            if isinstance(inner, construct.Bytes) and not isinstance(inner.length, int):
                n = int(inner.length(ctx))
                if n > len(self.view) - pos:
                    self.error(f"{prefix}{f.name} needs {n} bytes, {len(self.view) - pos} remain", pos, depth)
                    raise _Stop
                value = bytes(self.view[pos : pos + n])
                pos += n
            else:
                need = self._need(f, ctx)
                if need is not None and need > len(self.view) - pos:
                    self.error(f"{prefix}{f.name} needs {need} bytes, {len(self.view) - pos} remain", pos, depth)
                    raise _Stop
                try:
                    values, pos = _field_plan(f).unpack(self.view, pos, **ctx)
                except (struct.error, KeyError, TypeError) as exc:
                    self.error(f"{prefix}{f.name} cannot be decoded: {exc}", pos, depth)
                    raise _Stop from None
                value = values[f.name]
            ctx[f.name] = value
            if self.quiet:
                continue
            self.nodes.append(Node(
                "field", depth, prefix + f.name, self.base + start, self.base + pos,
                raw=bytes(self.view[start:pos]), value=value,
                text=_render(f.name, value, pos - start, f.tags, self.full_width),
                type=spec_type(f), doc=f.doc, ref=f.ref,
            ))
        return ctx, pos

    def entries(self, f: Field, entry: construct.Construct, ctx: dict, pos: int, depth: int,
                prefix: str = "") -> tuple[list, int]:
        """A field repeating the declared table ``entry`` (``Array(this.layout_count, LAYOUT_ENTRY)``):
        a section for the field, holding a section per entry with the entry's fields; no entry,
        a field line ``= []``."""
        count = int(f.subcon.count(ctx))
        if count == 0:
            if not self.quiet:
                self.nodes.append(Node("field", depth, prefix + f.name, self.base + pos, self.base + pos, value=(),
                                       text="[]", type=spec_type(f), doc=f.doc, ref=f.ref))
            return [], pos
        index = self.section(prefix + f.name, pos, pos, depth, text=f"{count} entr{'y' if count == 1 else 'ies'}",
                             ref=f.ref)
        values = []
        with self.opened(index):
            for i in range(count):
                sub = self.section(f"{f.name}[{i}]", pos, pos, depth + 1)
                with self.opened(sub):
                    value, pos = self.table(entry, pos, depth + 2)
                self.close(sub, pos)
                values.append(value)
        self.close(index, pos)
        return values, pos

    @staticmethod
    def _need(f: Field, ctx: dict) -> Optional[int]:
        inner = f.subcon
        if isinstance(inner, construct.IfThenElse):
            inner = inner.thensubcon
        size = static_size(inner)
        if size is not None:
            return size
        if isinstance(inner, construct.Array):
            count = inner.count(ctx) if callable(inner.count) else inner.count
            item = static_size(inner.subcon)
            if item is not None:
                return int(count) * item
        return None
