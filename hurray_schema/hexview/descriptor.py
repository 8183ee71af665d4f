"""The annotated view of one descriptor.

A descriptor is walked part by part as
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` lists them (which parts, in
which order, gated by which flag, read with which table): :class:`_ViewVisitor` is the
visitor of :func:`~hurray_schema.structs.walker.walk_descriptor` that turns each part into
nodes, and a tag is named from the tag table of the field that carries it
(:attr:`~hurray_schema.structs._declare.Field.tags`).  The brief view keeps the errors of
the field walk only, cached per distinct descriptor.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Optional

from ..errors import HurraySchemaError
from ..memo import MEMO
from ..model import CompositionRule, ElementType, LayoutTag
from ..structs._declare import Field, fields, plan, select, static_offset
from ..structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE, MAGIC, MAX_RANK
from ..structs.layouts import MAX_TILED_DEPTH
from ..structs.walker import (
    BODY_PARTS, HEADER_PART, NOTHING, Choice, DescriptorVisitor, PartKind, kind_of,
)
from ..structs.walker import walk_descriptor as walk_parts
from .nodes import Node, _render, _Stop, _Walker

__all__ = ["annotate_descriptor", "descriptor_extent", "descriptor_text", "peek_descriptor"]

DESCRIPTOR_WALK_ORDER = (HEADER_PART, *BODY_PARTS)

_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")
_LENGTH_FIELD = plan(select(FIXED_HEADER, "descriptor_length")).steps[0].codec
_MAGIC_LEN = len(MAGIC)
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
    from ..codec import parse_descriptor

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


_FIELD_ERRORS = MEMO.field_errors
_FIELD_ERRORS_KEPT = MEMO.limit("field_errors")


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


class _ViewVisitor(DescriptorVisitor):
    """The annotated view of one descriptor, as :func:`~hurray_schema.structs.walker.walk_descriptor`
    walks it: a section per part (per entry, level and chosen scheme), a node per field.  A
    field that does not fit raises :class:`_Stop`; the sections open around it are closed
    as far as their content reached."""

    def __init__(self, w: _Walker, depth: int):
        self.w = w
        self.pos = 0
        self.depth = depth  # of the sections opened next; their fields one deeper

    @contextlib.contextmanager
    def _section(self, label: str, ref: str = ""):
        w, depth = self.w, self.depth
        index = w.section(label, self.pos, self.pos, depth, ref=ref)
        self.depth = depth + 1
        try:
            with w.opened(index):
                yield
        finally:
            self.depth = depth
        w.close(index, self.pos)

    def table(self, part, decl, context: dict) -> dict:
        values, self.pos = self.w.table(decl, self.pos, self.depth, context)
        return values

    def header(self, values: dict) -> bool:
        rank = values["rank"]
        if rank > MAX_RANK:
            self.w.error(f"rank {rank} exceeds {MAX_RANK}; the rest is not walked", self.pos, self.depth)
            return False
        return True

    def part(self, part, choice: Optional[Choice] = None):
        if choice is None:
            return self._section(part.name, ref=part.ref if kind_of(part) is PartKind.REPEATED else "")
        if choice.decl is None:
            return NOTHING
        if choice.private:
            return self._section(f"{part.name} (extension)")
        if part.head is not None:
            return self._section(f"scheme ({_tag_name(part, choice.tag)})")
        ref = _field_ref(choice.decl, choice.nested_by) if choice.nested_by is not None else ""
        return self._section(f"{part.name} ({_tag_name(part, choice.tag)})", ref=ref)

    def entry(self, part, index: int):
        return self._section(f"{part.attribute}[{index}]", ref=_field_ref(part.decl))

    def level(self, part, choice: Choice, depth: int):
        return self._section(f"level {depth}")

    def deeper(self, part, choice: Choice, depth: int) -> bool:
        return depth <= MAX_TILED_DEPTH  # the levels shown

    def unknown(self, part, tag: int) -> None:
        self.w.opaque(f"{part.name} (unknown, opaque)", self.pos, len(self.w.view) - self.pos, self.depth,
                      doc=f"Unknown {part.name}: nothing after {_before(part).name} can be located.",
                      ref=_field_ref(HEADER_PART.decl, part.chosen_by))
        self.pos = len(self.w.view)

    @contextlib.contextmanager
    def sized(self, part, context: dict):
        """The prefix's length bounds a walker of its own; a field that does not fit in it
        ends the part, not the descriptor."""
        w = self.w
        with self._section(part.name, ref=part.ref):
            length = self.table(part, part.prefix, context)[part.prefix_field]
            if length > len(w.view) - self.pos:
                w.error(f"{part.prefix_field} {length} runs past the descriptor", self.pos, self.depth)
                raise _Stop
            self.end = end = self.pos + length
            self.w = w.sub(end)
            try:
                yield
            except _Stop:
                pass
            finally:
                self.w = w
            self.pos = end

    def chosen_tag(self, part) -> Optional[int]:
        at, codec = _tag_reader(part)
        if self.end - self.pos < at + codec.size:
            return None
        return codec.unpack_from(self.w.view, self.pos + at)[0]

    def unknown_sized(self, part, tag: Optional[int], context: dict) -> None:
        self.table(part, part.head, context)
        self.pos = self.w.opaque(f"payload (unknown {part.chosen_by.removesuffix('_tag')})", self.pos,
                                 self.end - self.pos, self.depth, ref=_field_ref(part.head))

    def padding(self, part) -> None:
        if self.pos < self.end:
            self.pos = self.w.opaque("padding", self.pos, self.end - self.pos, self.depth,
                                     doc="Bytes after the scheme's fields.", ref=part.ref)

    def trailing(self) -> None:
        if self.pos < len(self.w.view):
            self.w.opaque("trailing", self.pos, len(self.w.view) - self.pos, self.depth,
                          doc="Bytes after the sections this reader knows (a newer minor version, or an error).",
                          ref="metadata.md § Version Compatibility")


def _walk_descriptor(w: _Walker, depth: int) -> None:
    """Nodes of every part the header's flags select, in wire order
    (``metadata.md § Overall Descriptor Structure``), then any trailing bytes."""
    walk_parts(_ViewVisitor(w, depth))


def _tag_field(part) -> Field:
    """The field holding the tag that chooses a part's table (the header's, or the part's own)."""
    decl = part.head if part.head is not None else HEADER_PART.decl
    return next(f for f in fields(decl) if f.name == part.chosen_by)


def _tag_name(part, tag: int) -> str:
    """The lower-case name of ``tag`` in the tag table of the field that chooses ``part``'s table."""
    return _tag_field(part).tags(tag).name.lower()


def _tag_reader(part) -> tuple[int, struct.Struct]:
    """Offset and codec of the tag field inside a sized part's head."""
    return static_offset(part.head, part.chosen_by), plan(select(part.head, part.chosen_by)).steps[0].codec


def _field_ref(decl, name: Optional[str] = None) -> str:
    """The citation of field ``name`` of ``decl`` (its first field when ``None``)."""
    return next(f.ref for f in fields(decl) if name is None or f.name == name)


def _before(part):
    """The part before ``part`` in wire order."""
    return DESCRIPTOR_WALK_ORDER[DESCRIPTOR_WALK_ORDER.index(part) - 1]
