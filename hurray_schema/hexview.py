"""Annotated view of Hurray bytes, built from the wire-table declarations.

:func:`annotate` walks a single descriptor, a bare stream, a message stream or a
``.hrry`` file and returns a flat list of :class:`Node` s in byte order: one per section
(with its depth in the tree) and one per field, carrying its absolute byte range, raw
bytes, decoded value, wire type, our description and the spec citation -- all taken from
the ``field(...)`` declarations in :mod:`hurray_schema.structs`, decoded one field at a
time with the same fast plans the codec uses.  :func:`render_tree` and
:func:`render_hex` turn the nodes into text (``hurray-schema inspect`` / ``--hex``).

A descriptor is walked part by part as
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` lists them (which parts, in
which order, gated by which flag, read with which table), and a tag is named from the tag
table of the field that carries it (:attr:`~hurray_schema.structs._declare.Field.tags`).
Where each part of a stream or file sits comes from the located walks of
:mod:`hurray_schema.io.walk` and :mod:`hurray_schema.io.kv` (fault policy ``ANNOTATE``);
this module turns each located part into nodes, field by field; the payload of a session
message is decoded with its table (:data:`~hurray_schema.structs.session.SESSION_TABLES`).
Every count and length is checked against the bytes that remain before it is used, and a
field that does not fit ends the walk of its section with an ``error`` node instead of an
exception.  It shows what the bytes say; judging them is the job of ``hurray-schema audit``.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import struct
from typing import Any, Iterable, Optional

import attrs
import construct

from .docs import entry_table, optional_fields, presence, private_values, session_payloads, spec_type
from .errors import HurraySchemaError
from .io.kv import walk_kv
from .io.walk import (
    BUFFER, DATA, DATA_HEADER, DESCRIPTOR, ENTRY, ENTRY_START, FAULT, FILE_HEADER_PART, INDEX_PART, KV_PART,
    MESSAGE, MESSAGE_HEADER_PART, NAME, PAYLOAD, TABLE, TENSOR_DATA, TRAILER_PART, TRANSPORT, VALUE, Faults, Part,
    Window, as_view, detect_kind, walk_bare, walk_descriptor, walk_file, walk_index, walk_messages,
)
from .model import DYNAMIC_DIMENSION, CompositionRule, ElementType, LayoutTag
from .rules.engine import Mode
from .structs import file as file_structs
from .structs import stream as stream_structs
from .structs._declare import Field, Plan, fields, plan, select, static_offset, static_size, tags_of
from .structs.descriptor import (
    DESCRIPTOR_PARTS, FIXED_HEADER, FIXED_HEADER_SIZE, HANDLE_REF, MAGIC, MAX_RANK, PARTS, DescriptorPart,
)
from .structs.layouts import MAX_TILED_DEPTH, NESTED_BY
from .structs.quantization import HEADER_REF as QUANTIZATION_HEADER_REF
from .structs.quantization import QUANTIZATION_HEADER
from .structs.tags import is_private_tag

__all__ = ["Node", "annotate", "annotate_descriptor", "detect_kind", "in_brief", "render_tree", "render_hex",
           "render_value", "session_payload_nodes",
           "descriptor_extent", "descriptor_text", "peek_descriptor"]


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


_FIELD_PLANS: dict[int, tuple[Field, Plan]] = {}


def _field_plan(f: Field) -> Plan:
    entry = _FIELD_PLANS.get(id(f))
    if entry is None or entry[0] is not f:
        entry = _FIELD_PLANS[id(f)] = (f, Plan(construct.Struct(f)))
    return entry[1]


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


# ------------------------------------------------------------------------------------
# One descriptor
# ------------------------------------------------------------------------------------

_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")
_LENGTH_FIELD = plan(select(FIXED_HEADER, "descriptor_length")).steps[0].codec
_MAGIC_LEN = len(MAGIC)
_SCHEME_TAG_AT = static_offset(QUANTIZATION_HEADER, PARTS["quantization"].chosen_by)
_DESCRIPTOR_REF = "metadata.md § Overall Descriptor Structure"



def _descriptor_summary(desc) -> str:
    try:
        dtype = ElementType(desc.type_tag).name.lower()
    except ValueError:
        dtype = f"type 0x{int(desc.type_tag):02X}"
    try:
        layout = LayoutTag(desc.layout.tag).name.lower()
    except ValueError:
        layout = f"layout 0x{int(desc.layout.tag):02X}"
    shape = _render("shape", tuple(desc.shape))
    text = f"{dtype} {shape} {layout}"
    if desc.is_composite_head:
        rule = _render("composition_rule", int(desc.layout.composition_rule), tags=CompositionRule)
        text += f", {rule.split('(')[-1].rstrip(')').lower()} of {desc.layout.member_count}"
    else:
        n = len(desc.buffers)
        text += f", {n} buffer{'s' if n != 1 else ''}"
    return text


def descriptor_extent(view) -> int:
    """Bytes the descriptor at the start of ``view`` occupies in the view:
    ``descriptor_length`` when the magic is there and the length fits, else all of it."""
    if len(view) >= FIXED_HEADER_SIZE and bytes(view[:_MAGIC_LEN]) == MAGIC:
        (length,) = _LENGTH_FIELD.unpack_from(view, _LENGTH_AT)
        if FIXED_HEADER_SIZE <= length <= len(view):
            return length
    return len(view)


def peek_descriptor(view, base: int = 0):
    """``(descriptor or None, problem or None)``: the permissive decode the view shows."""
    from .codec import parse_descriptor

    try:
        return parse_descriptor(view, mode="permissive", base=base)[0], None
    except HurraySchemaError as exc:
        return None, str(exc)


def descriptor_text(desc) -> str:
    """The one-line summary of a descriptor section (``undecodable`` for None)."""
    return _descriptor_summary(desc) if desc is not None else "undecodable"


def annotate_descriptor(data, base: int = 0, depth: int = 0, label: str = "descriptor",
                        nodes: Optional[list[Node]] = None, brief: bool = False):
    """Annotate the descriptor at the start of ``data`` (offsets reported from ``base``).

    Returns ``(nodes, descriptor_or_None, end)`` where ``end`` is the number of bytes
    the descriptor occupies in ``data`` (``descriptor_length`` when it can be read).
    ``brief`` keeps only the descriptor's section and the errors of its fields.
    """
    nodes = [] if nodes is None else nodes
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    desc, problem = peek_descriptor(view, base)
    limit = descriptor_extent(view)
    if brief:
        nodes.append(Node("section", depth, label, base, base + limit, text=descriptor_text(desc),
                          ref=_DESCRIPTOR_REF))
        for start, d, text in _field_errors(view[:limit], problem is None):
            nodes.append(Node("error", depth + d, "error", base + start, base + start, text=text))
        if problem is not None:
            nodes.append(Node("error", depth + 1, "error", base + limit, base + limit, text=problem))
        return nodes, desc, limit
    w = _Walker(view[:limit], base, nodes)
    top = w.section(label, 0, limit, depth, text=descriptor_text(desc), ref=_DESCRIPTOR_REF)
    end = limit
    try:
        _walk_descriptor(w, depth + 1)
    except _Stop:
        pass
    if problem is not None:
        w.error(problem, limit, depth + 1)
    w.close(top, end)
    return nodes, desc, end


_FIELD_ERRORS: dict[bytes, tuple] = {}
_FIELD_ERRORS_KEPT = 4096


def _field_errors(view: memoryview, cacheable: bool) -> tuple:
    """``(offset, depth, text)`` of the error nodes the field walk of a descriptor gives,
    relative to it (its section at depth 0).  They depend on the descriptor's bytes only,
    so a descriptor the codec decodes is walked once per distinct byte string."""
    key = bytes(view) if cacheable else None
    found = _FIELD_ERRORS.get(key) if key is not None else None
    if found is not None:
        return found
    scratch: list[Node] = []
    try:
        _walk_descriptor(_Walker(view, 0, scratch, quiet=True), 1)
    except _Stop:
        pass
    found = tuple((n.start, n.depth, n.text) for n in scratch if n.kind == "error")
    if key is not None:
        if len(_FIELD_ERRORS) >= _FIELD_ERRORS_KEPT:
            _FIELD_ERRORS.clear()
        _FIELD_ERRORS[key] = found
    return found


def _table_part(w: _Walker, name: str, decl, pos: int, depth: int, context: dict) -> tuple[dict, int]:
    """A section ``name`` holding the fields of one table ``decl``."""
    index = w.section(name, pos, pos, depth)
    with w.opened(index):
        values, end = w.table(decl, pos, depth + 1, context)
    w.close(index, end)
    return values, end


def _walk_descriptor(w: _Walker, depth: int) -> None:
    """Every part of :data:`DESCRIPTOR_PARTS` the header's flags select, in wire order
    (``metadata.md § Overall Descriptor Structure``), then any trailing bytes."""
    header_part, *parts = DESCRIPTOR_PARTS
    header, pos = _table_part(w, header_part.name, header_part.decl, 0, depth, {})
    rank = header["rank"]
    if rank > MAX_RANK:
        w.error(f"rank {rank} exceeds {MAX_RANK}; the rest is not walked", pos, depth)
        return
    context = {"rank": rank}
    for part in parts:
        if part.flag is not None and not header["flags"] & part.flag:
            continue
        pos = _walk_part(w, part, header, pos, depth, context)
        if pos is None:
            return
    if pos < len(w.view):
        w.opaque("trailing", pos, len(w.view) - pos, depth,
                 doc="Bytes after the sections this reader knows (a newer minor version, or an error).",
                 ref="metadata.md § Version Compatibility")


def _walk_part(w: _Walker, part: DescriptorPart, header: dict, pos: int, depth: int,
               context: dict) -> Optional[int]:
    """Nodes of one part at ``pos``; returns where it ends (``None``: nothing after it can be
    located).  How a part is read follows from its entry in :data:`DESCRIPTOR_PARTS`."""
    if part.tables is not None and part.prefix is not None:
        return _walk_sized_choice(w, part, pos, depth, context)
    if part.tables is not None:
        return _walk_choice(w, part, header[part.chosen_by], pos, depth, context)
    if part.prefix is not None:
        return _walk_repeated(w, part, pos, depth, context)
    _, end = _table_part(w, part.name, part.decl, pos, depth, context)
    return end


def _tag_name(decl, name: str, tag: int) -> str:
    """The lower-case name of ``tag`` in the tag table of field ``name`` of ``decl``."""
    return tags_of(decl, name)(tag).name.lower()


def _walk_repeated(w: _Walker, part: DescriptorPart, pos: int, depth: int, context: dict) -> int:
    """A count (``part.prefix``) and that many ``part.decl`` entries (the buffer table)."""
    index = w.section(part.name, pos, pos, depth, ref=part.ref)
    with w.opened(index):
        values, pos = w.table(part.prefix, pos, depth + 1, context)
        for i in range(values[part.prefix_field]):
            entry = w.section(f"{part.attribute}[{i}]", pos, pos, depth + 1, ref=HANDLE_REF)
            with w.opened(entry):
                _, pos = w.table(part.decl, pos, depth + 2, context)
            w.close(entry, pos)
    w.close(index, pos)
    return pos


def _walk_choice(w: _Walker, part: DescriptorPart, tag: int, pos: int, depth: int,
                 context: dict) -> Optional[int]:
    """The table of ``part.tables`` that ``tag`` (the header's ``part.chosen_by``) selects:
    the layout-specific fields.  A tiled level repeats while its inner layout is tiled;
    a private tag reads ``part.private``; any other unknown tag leaves the rest opaque."""
    if tag in part.tables:
        decl = part.tables[tag]
        if decl is None:
            return pos
        label = f"{part.name} ({_tag_name(FIXED_HEADER, part.chosen_by, tag)})"
        nested_by = NESTED_BY.get(tag)
        if nested_by is not None:
            return _walk_nested(w, label, decl, tag, nested_by, pos, depth, context)
        _, end = _table_part(w, label, decl, pos, depth, context)
        return end
    if is_private_tag(tag) and part.private is not None:
        _, end = _table_part(w, f"{part.name} (extension)", part.private, pos, depth, context)
        return end
    w.opaque(f"{part.name} (unknown, opaque)", pos, len(w.view) - pos, depth,
             doc="Unknown layout: nothing after byte_offset can be located.", ref="memory-layout.md § Layout Taxonomy")
    return None


def _walk_nested(w: _Walker, label: str, decl, tag: int, nested_by: str, pos: int, depth: int,
                 context: dict) -> int:
    """A layout table that repeats while its field ``nested_by`` holds the layout's own ``tag``
    (:data:`NESTED_BY`: a tiled level tiled again, ``layouts/tiled.md § Recursive Tiling``), one
    section per level; at most :data:`MAX_TILED_DEPTH` levels are shown."""
    ref = next(f.ref for f in fields(decl) if f.name == nested_by)
    index = w.section(label, pos, pos, depth, ref=ref)
    level = 1
    with w.opened(index):
        while True:
            sub = w.section(f"level {level}", pos, pos, depth + 1)
            with w.opened(sub):
                values, pos = w.table(decl, pos, depth + 2, context)
            w.close(sub, pos)
            if values[nested_by] != tag or level >= MAX_TILED_DEPTH:
                break
            level += 1
    w.close(index, pos)
    return pos


def _walk_sized_choice(w: _Walker, part: DescriptorPart, pos: int, depth: int, context: dict) -> int:
    """A length (``part.prefix``), then the table of ``part.tables`` its first field selects
    (the quantization scheme); an unknown scheme shows its header and an opaque payload,
    and bytes the table leaves over are padding (``metadata.md § Quantization Section``)."""
    index = w.section(part.name, pos, pos, depth, ref=part.ref)
    with w.opened(index):
        values, pos = w.table(part.prefix, pos, depth + 1, context)
        length = values[part.prefix_field]
        end = pos + length
        if length > len(w.view) - pos:
            w.error(f"{part.prefix_field} {length} runs past the descriptor", pos, depth + 1)
            raise _Stop
    inner = w.sub(end)
    tag = w.view[pos + _SCHEME_TAG_AT] if length > _SCHEME_TAG_AT else None
    decl = part.tables.get(tag) if tag is not None else None
    try:
        if decl is not None:
            sub = inner.section(f"scheme ({_tag_name(QUANTIZATION_HEADER, part.chosen_by, tag)})", pos, pos, depth + 1)
            with inner.opened(sub):
                _, p = inner.table(decl, pos, depth + 2, context)
            inner.close(sub, p)
        else:
            _, p = inner.table(QUANTIZATION_HEADER, pos, depth + 1, context)
            p = inner.opaque("payload (unknown scheme)", p, end - p, depth + 1, ref=QUANTIZATION_HEADER_REF)
        if p < end:
            inner.opaque("padding", p, end - p, depth + 1, doc="Bytes after the scheme's fields.", ref=part.ref)
    except _Stop:
        pass
    w.close(index, end)
    return end


# ------------------------------------------------------------------------------------
# Files and streams
# ------------------------------------------------------------------------------------


def annotate(data, kind: Optional[str] = None, *, brief: bool = False) -> list[Node]:
    """Annotate ``data`` (bytes-like) as ``kind`` (detected when ``None``).

    ``brief``: only the tree of sections -- the top-level ones, each tensor and message,
    data runs and errors (no field lines); the same nodes the full view has."""
    kind = kind or detect_kind(data)
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if kind == "file":
        nodes = _annotate_file(view, brief)
    elif kind == "stream":
        nodes = _annotate_bare_stream(view, brief)
    elif kind == "messages":
        nodes = _annotate_messages(view, brief)
    elif kind == "descriptor":
        nodes = _annotate_descriptor_input(view, brief)
    else:
        raise HurraySchemaError("not a Hurray descriptor, stream or file (no known magic at byte 0)")
    return [n for n in nodes if in_brief(n)] if brief else nodes


def in_brief(node: Node) -> bool:
    """Whether the brief view keeps ``node``: errors, data runs, top-level sections,
    tensors and messages."""
    return (node.kind == "error" or node.kind == "opaque" and node.label.endswith("data")
            or node.kind == "section" and (node.depth == 0 or node.label.startswith(("tensor", "message"))))


def _describer(nodes: list[Node], label, brief: bool):
    """The annotated view's descriptor step for a walk: each descriptor's field nodes go
    to ``nodes`` under the section ``label()`` names."""

    def describe(buf, base: int, depth: int) -> Part:
        _, desc, end = annotate_descriptor(buf, base=base, depth=depth, label=label(), nodes=nodes, brief=brief)
        return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)

    return describe


def _annotate_descriptor_input(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    list(walk_descriptor(view, _describer(nodes, lambda: "descriptor", brief)))
    return nodes


def _annotate_bare_stream(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    numbers = itertools.count()
    describe = _describer(nodes, lambda: f"tensor {next(numbers)}", brief)
    depth = 0
    for part in walk_bare(Window(view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        if part.kind == DESCRIPTOR:
            depth = part.depth
        elif part.kind == BUFFER:
            w.opaque(f"buffer {part.index} data", part.start, part.end - part.start, depth + 1,
                     ref="buffer-protocol.md § Buffer Handle")
        elif part.kind == FAULT:
            w.error(part.note, part.start, depth + 1)
    return nodes


def _annotate_messages(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    inner, section, complete = w, None, None
    describe = _describer(nodes, lambda: "descriptor", brief)
    payload_table = None  # the session table of the current message's payload, if it has one
    for part in walk_messages(Window(view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == MESSAGE:
            if complete is not None:
                w.close(section, complete)
            section = w.section(f"message {part.index}", part.start, part.start, 0, ref=stream_structs.FRAMING_REF)
            complete = part.end if part.end > part.start else None
            inner = w.sub(part.end)
            payload_table = _SESSION_PAYLOADS.get(part.value["message_type"]) if part.value else None
        elif kind == MESSAGE_HEADER_PART:
            w.table(stream_structs.MESSAGE_HEADER, part.start, 1)
        elif kind == FAULT and part.decl is not None:
            with contextlib.suppress(_Stop):
                w.table(stream_structs.MESSAGE_HEADER, part.start, 1)
        elif kind == FAULT:
            w.error(part.note, part.start, 1)
        elif kind == TRANSPORT:
            with contextlib.suppress(_Stop):
                inner.table(stream_structs.TENSOR_DESCRIPTOR_FIELDS, part.start, 1)
        elif kind == DATA_HEADER:
            with contextlib.suppress(_Stop):
                inner.table(stream_structs.TENSOR_DATA_HEADER, part.start, 1)
        elif kind == DATA:
            inner.opaque("data", part.start, part.end - part.start, 1, ref=stream_structs.DATA_REF)
        elif kind == PAYLOAD and payload_table is not None:
            _session_payload(inner, payload_table, part.start, part.end, 1)
        elif kind == PAYLOAD:
            inner.opaque("payload", part.start, part.end - part.start, 1, ref=stream_structs.FRAMING_REF)
    if complete is not None:
        w.close(section, complete)
    return nodes


_SESSION_PAYLOADS = {int(kind): (kind.name, decl) for kind, decl in session_payloads().items()}
"""``message_type`` → ``(name, table)`` of the session messages' payloads."""

_TRAILING_DOC = "Payload bytes after the table's fields (none in a valid message, but for a PING's and its PONG's)."


def session_payload_nodes(view, message_type: int, start: int, end: int, depth: int = 1) -> Optional[list[Node]]:
    """The nodes of the payload ``[start, end)`` of a message of ``message_type`` in ``view``
    (offsets of ``view``), as ``inspect`` shows it; ``None`` when it is no session message."""
    payload_table = _SESSION_PAYLOADS.get(message_type)
    if payload_table is None:
        return None
    nodes: list[Node] = []
    _session_payload(_Walker(as_view(view)[:end], 0, nodes), payload_table, start, end, depth)
    return nodes


def _session_payload(w: _Walker, payload_table: tuple, start: int, end: int, depth: int) -> None:
    """The payload ``[start, end)`` of a session message, field by field as its table
    (``(name, decl)``) declares it, then any bytes after the table; a payload the table does
    not fit stays opaque, with the reason."""
    name, decl = payload_table
    trial = w.trial(full_width=True)
    try:
        _, pos = trial.table(decl, start, depth)
    except _Stop:
        w.opaque("payload", start, end - start, depth, ref=stream_structs.FRAMING_REF)
        failed = next(n for n in reversed(trial.nodes) if n.kind == "error")
        w.error(f"the payload is not a {name} table: {failed.text}", failed.start - w.base, depth)
        return
    w.nodes.extend(trial.nodes)
    if pos < end:
        w.opaque("trailing", pos, end - pos, depth, doc=_TRAILING_DOC, ref=stream_structs.FRAMING_REF)


def _annotate_file(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    size = len(view)
    label, desc = "", None

    def describe(buf, base: int, depth: int) -> Part:
        nonlocal desc
        _, desc, end = annotate_descriptor(buf, base=base, depth=depth, label=label, nodes=nodes, brief=brief)
        return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)

    for part in walk_file(view, describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == FILE_HEADER_PART or kind == FAULT and part.decl is not None:
            section = w.section("file header", 0, 0, 0, ref=file_structs.HEADER_REF)
            try:
                _, pos = w.table(file_structs.FILE_HEADER, 0, 1)
            except _Stop:
                return nodes
            w.close(section, pos)
        elif kind == FAULT:
            w.error(part.note, part.start, 0)
        elif kind == ENTRY:
            label = f"tensor {part.value.name!r}"
        elif kind == TENSOR_DATA:
            d0, dl = part.start, part.end - part.start
            end = min(size, d0 + dl) if d0 <= size else d0
            raw = bytes(view[d0 : min(end, d0 + OPAQUE_KEEP)]) if d0 < size else b""
            n_buf = len(desc.buffers)
            nodes.append(Node("opaque", part.depth + 1, "data", d0, max(end, d0), raw=raw,
                              text=f"{dl} bytes in {n_buf} buffer{'' if n_buf == 1 else 's'}",
                              ref="file-format.md § Data Buffer Placement"))
        elif kind == KV_PART:
            _walk_kv(w, part.start, part.end - part.start)
        elif kind == INDEX_PART:
            _walk_index(w, part.start, part.end - part.start)
        elif kind == TRAILER_PART:
            section = w.section("trailer", part.start, part.start, 0, ref=file_structs.TRAILER_REF)
            with contextlib.suppress(_Stop):
                _, end = w.table(file_structs.TRAILER, part.start, 1)
                w.close(section, end)
    return nodes


def _show_parts(w: _Walker, parts, fields: dict) -> None:
    """Nodes of the located parts of an index or KV section: each table field by field
    (one that does not fit ends with its error), named byte runs, an ``entry i`` section
    per entry (depth 1; the parts' own depth counts from 2).  ``fields`` gives the
    ``(doc, ref)`` of each named byte run."""
    entry = None
    for part in parts:
        depth = 2 + part.depth
        kind = part.kind
        if kind == TABLE or kind == FAULT and part.decl is not None:
            w.table(part.decl, part.start, depth)
        elif kind == FAULT:
            w.error(part.note, part.start, depth)
            raise _Stop
        elif kind == ENTRY_START:
            entry = w.section(f"entry {part.index}", part.start, part.start, 1)
        elif kind in (NAME, VALUE):
            label = part.note or "name"
            doc, ref = fields[label]
            if not w.quiet:
                w.nodes.append(Node("field", depth, label, part.start, part.end, raw=part.value, value=part.value,
                                    text=_render("key" if label in ("key", "value") else label, part.value),
                                    type=f"uint8[{part.end - part.start}]" if label != "name" else "uint8[name_length]",
                                    doc=doc, ref=ref))
        elif kind == ENTRY:
            w.close(entry, part.end)


_INDEX_FIELDS = {"name": ("UTF-8 tensor name.", "file-format.md § Index Encoding")}


def _walk_index(w: _Walker, off: int, n: int) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"index section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("index", off, off + n, 0, ref=file_structs.INDEX_REF)
    with contextlib.suppress(_Stop):
        _show_parts(w.sub(off + n, 0), walk_index(w.view[: off + n], off), _INDEX_FIELDS)
    w.close(sec, off + n)


_KV_FIELDS = {"key": ("UTF-8 key.", "file-format.md § KV Section Encoding"),
              "value": ("Value bytes.", file_structs.KV_TYPES_REF)}


def _walk_kv(w: _Walker, off: int, n: int) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"KV section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("kv metadata", off, off + n, 0, ref=file_structs.KV_REF)
    with contextlib.suppress(_Stop):
        _show_parts(w.sub(off + n, 0), walk_kv(w.view[off : off + n], off, faults=Faults.ANNOTATE), _KV_FIELDS)
    w.close(sec, off + n)


# ------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------


def _range(node: Node) -> str:
    if node.end <= node.start:
        return f"{node.start}"
    if node.end - node.start == 1:
        return f"{node.start}"
    return f"{node.start}-{node.end - 1}"


def _hexbytes(raw: bytes, total: int, limit: int = 8) -> str:
    text = raw[:limit].hex(" ")
    if total > limit:
        text += f" …(+{total - limit})"
    return text


def _shared_refs(nodes: list[Node]) -> dict[int, str]:
    """Section index → the citation of a section: its own, else the one most of its direct
    fields share (printed once, on the section line, and left off those fields).

    One pass: a field or opaque run counts for the innermost open section one level up."""
    shared: dict[int, str] = {}
    open_sections: list[tuple[int, int, dict[str, int]]] = []  # (depth, index, ref counts)
    for i, n in enumerate(nodes):
        while open_sections and open_sections[-1][0] >= n.depth:
            _settle_ref(shared, open_sections.pop())
        if n.kind == "section":
            if n.ref:
                shared[i] = n.ref
            open_sections.append((n.depth, i, {} if not n.ref else None))
            continue
        if open_sections and open_sections[-1][0] == n.depth - 1 and n.kind in ("field", "opaque") and n.ref:
            refs = open_sections[-1][2]
            if refs is not None:
                refs[n.ref] = refs.get(n.ref, 0) + 1
    while open_sections:
        _settle_ref(shared, open_sections.pop())
    return shared


def _settle_ref(shared: dict[int, str], section: tuple) -> None:
    _depth, index, refs = section
    if refs:
        shared[index] = max(refs, key=lambda r: refs[r])


def render_tree(nodes: Iterable[Node], *, citations: bool = True) -> str:
    """Indented tree: each section with its byte range, then per field
    ``range  raw bytes  name = value  type  · citation`` (a citation every field of a
    section shares is printed once, on the section line)."""
    nodes = list(nodes)
    shared = _shared_refs(nodes) if citations else {}
    fieldw = max([len(n.label) + 2 * n.depth for n in nodes if n.kind != "section"] + [10])
    rangew = max([len(_range(n)) for n in nodes if n.kind in ("field", "opaque")] + [9]) + 2
    lines = []
    parents: list[tuple[int, str]] = []  # (depth, shared citation) of the enclosing sections
    for i, n in enumerate(nodes):
        while parents and parents[-1][0] >= n.depth:
            parents.pop()
        pad = "  " * n.depth
        if n.kind == "section":
            ref = shared.get(i, "")
            parents.append((n.depth, ref))
            extra = f"  {n.text}" if n.text else ""
            cite = f"  ({ref})" if citations and ref else ""
            size = n.end - n.start
            lines.append(f"{pad}{n.label} @{_range(n)} [{size} byte{'' if size == 1 else 's'}]{extra}{cite}")
        elif n.kind == "error":
            lines.append(f"{pad}! {n.text}")
        else:
            inherited = parents[-1][1] if parents and parents[-1][0] == n.depth - 1 else ""
            rng = _range(n) if n.end > n.start else f"{n.start} (0 bytes)"
            name = (pad + n.label).ljust(fieldw)
            value = n.text if n.kind == "field" else f"<{n.text}>"
            typ = f"  {n.type}" if n.type else ""
            cite = f"  · {n.ref}" if citations and n.ref and n.ref != inherited else ""
            lines.append(f"{rng:>{rangew}}  {_hexbytes(n.raw, n.end - n.start):<32} {name} = {value}{typ}{cite}")
    return "\n".join(lines)


def render_hex(nodes: Iterable[Node], *, width: int = 16, citations: bool = True) -> str:
    """Byte table: offset, up to ``width`` hex bytes per line, and the field they belong to."""
    lines = [f"{'offset':>8}  {' '.join(f'{i:02x}' for i in range(width))}  field = value"]
    for n in nodes:
        if n.kind == "section":
            lines.append(f"{'':>8}  {'':<{3 * width - 1}}  {'  ' * n.depth}# {n.label}" + (f" — {n.text}" if n.text else ""))
            continue
        if n.kind == "error":
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  ! {n.text}")
            continue
        raw = n.raw
        label = f"{'  ' * n.depth}{n.label} = {n.text if n.kind == 'field' else '<' + n.text + '>'}"
        if citations and n.ref:
            label += f"  ({n.ref})"
        if not raw:
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  {label} (0 bytes)")
            continue
        size = n.end - n.start
        rows = math.ceil(size / width)
        shown = rows if rows <= 4 else 3
        for r in range(shown):
            chunk = raw[r * width:(r + 1) * width]
            lines.append(f"{n.start + r * width:08x}  {chunk.hex(' '):<{3 * width - 1}}  {label if r == 0 else ''}".rstrip())
        if shown < rows:
            lines.append(f"{'':>8}  … {size - shown * width} more bytes")
    return "\n".join(lines)
