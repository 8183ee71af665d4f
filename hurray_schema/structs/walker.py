"""The one walk of a descriptor's parts (``metadata.md § Overall Descriptor Structure``).

:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` declares the parts; this module
is the one place that interprets that table: which parts a header's ``flags`` select
(flag gating), a count read before repeated entries (prefix and repeat), the table a tag
selects (choices), the implementation-private range (private tables), a table that nests
while one of its fields names its own tag (``layouts/tiled.md § Recursive Tiling``), and a
length read before a table chosen by its first field (the quantization section).

Two walks, two visitor interfaces:

* :func:`walk_descriptor` walks the *bytes* (or values) of one descriptor, asking a
  :class:`DescriptorVisitor` for each table's values: the decoder reads them
  (:mod:`hurray_schema.codec`), the encoder packs them (:mod:`hurray_schema.structs.wire`),
  the annotated view shows them (:mod:`hurray_schema.hexview`).  The walk decides what comes
  next from the values the visitor returns, so all three read the same parts in the same order.
* :func:`walk_declarations` walks the *declarations* for tools that describe every case at
  once: the documentation (:mod:`hurray_schema.docs`) and the Kaitai Struct schema
  (:mod:`hurray_schema.ksy`) are :class:`DeclarationVisitor` s.

The compiled fast path (:mod:`hurray_schema.signature`) is generated from the same parts.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, ContextManager, Iterator, Optional

import attrs

from . import descriptor as _descriptor
from .descriptor import DESCRIPTOR_PARTS, DescriptorPart
from .layouts import NESTED_BY
from .tags import is_private_tag

__all__ = ["PartKind", "Choice", "kind_of", "choose", "choices", "walk_descriptor", "walk_declarations",
           "DescriptorVisitor", "DeclarationVisitor", "HEADER_PART", "BODY_PARTS", "LAYOUT_PART", "BUFFER_PART",
           "QUANTIZATION_PART", "SECTION_PARTS", "OPTIONAL_PARTS", "part_named", "NOTHING", "RUNS"]


class PartKind(enum.Enum):
    """How a part is laid out on the wire."""

    TABLE = "one table"
    REPEATED = "a count, then that many entries"
    CHOICE = "the table a header tag selects"
    SIZED_CHOICE = "a length, then the table its first field selects, then padding"


def kind_of(part: DescriptorPart) -> PartKind:
    """The :class:`PartKind` of ``part``, from the fields of its declaration."""
    if part.tables is not None:
        return PartKind.SIZED_CHOICE if part.prefix is not None else PartKind.CHOICE
    if part.prefix is not None:
        return PartKind.REPEATED
    return PartKind.TABLE


@attrs.frozen(slots=True)
class Choice:
    """The table a tag selects in a part chosen by tag.

    ``decl`` is ``None`` for a tag whose part has no fields (row-major, column-major).
    ``nested_by`` names the field that, holding ``tag`` again, makes the table repeat one
    level deeper; ``private`` marks the implementation-private range's table."""

    tag: int
    decl: Any
    nested_by: Optional[str] = None
    private: bool = False


@functools.lru_cache(maxsize=None)  # a tag is one byte: a few hundred choices at most, each made once
def choose(part: DescriptorPart, tag: Optional[int]) -> Optional[Choice]:
    """The :class:`Choice` ``tag`` selects in ``part``; ``None`` for a tag with no table
    (an unknown layout or scheme: a reader keeps the rest opaque)."""
    if tag is None:
        return None
    tables = part.tables
    if tag in tables:
        key = next(k for k in tables if k == tag)  # the table's own key: a tag enum member
        return Choice(key, tables[key], NESTED_BY.get(key) if part.prefix is None else None)
    if part.private is not None and is_private_tag(tag):
        return Choice(tag, part.private, private=True)
    return None


def choices(part: DescriptorPart) -> tuple[Choice, ...]:
    """Every declared table of a part chosen by tag, in declaration order (the private
    range's table last)."""
    found = [choose(part, tag) for tag in part.tables]
    if part.private is not None:
        found.append(Choice(-1, part.private, private=True))
    return tuple(found)


HEADER_PART, *_BODY = DESCRIPTOR_PARTS
BODY_PARTS: tuple[DescriptorPart, ...] = tuple(_BODY)
"""The parts after the fixed header, in wire order."""
KINDS = {part.name: kind_of(part) for part in DESCRIPTOR_PARTS}
_BY_NAME = {part.name: part for part in DESCRIPTOR_PARTS}


def part_named(name: str) -> DescriptorPart:
    """The part called ``name`` (``"layout"``, ``"buffer_table"``, ...)."""
    return _BY_NAME[name]


LAYOUT_PART = next(p for p in BODY_PARTS if KINDS[p.name] is PartKind.CHOICE)
BUFFER_PART = next(p for p in BODY_PARTS if KINDS[p.name] is PartKind.REPEATED)
QUANTIZATION_PART = next(p for p in BODY_PARTS if KINDS[p.name] is PartKind.SIZED_CHOICE)
OPTIONAL_PARTS = tuple(p for p in BODY_PARTS if p.flag is not None)
"""Quantization and the sections, in wire order."""
SECTION_PARTS = tuple(p for p in OPTIONAL_PARTS if KINDS[p.name] is PartKind.TABLE)
"""The flag-gated sections read with one fixed declaration."""


# ------------------------------------------------------------------------------------
# The walk of one descriptor's bytes
# ------------------------------------------------------------------------------------


class _Nothing:
    """A context that does nothing, made once (cheaper than ``contextlib.nullcontext()`` per
    part: the decoder walks every descriptor it has not seen)."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


NOTHING = _Nothing()
"""What a visitor's context methods return when they have nothing to do around a part."""


class DescriptorVisitor:
    """What :func:`walk_descriptor` asks of whoever reads, writes or shows a descriptor.

    :meth:`table` is the one method a visitor must give: the values of one declared table at
    the cursor.  The others have defaults in terms of it; a visitor overrides one to do more
    (report a rule, bound a read, make a section of the view) or to do it faster."""

    marks_parts = True
    """False: :meth:`part` does nothing around a part without a choice, and the walk does not
    call it there (the decoder's general path, on every descriptor it has not seen)."""

    def table(self, part: DescriptorPart, decl, context: dict) -> dict:
        """The values of table ``decl`` of ``part`` at the cursor, the cursor moved past it."""
        raise NotImplementedError

    def header(self, values: dict) -> bool:
        """The fixed header was read; False stops the walk (nothing after it can be located)."""
        return True

    def part(self, part: DescriptorPart, choice: Optional[Choice] = None) -> ContextManager:
        """Around one part (and, for a part chosen by tag, the table chosen)."""
        return NOTHING

    def run(self, parts: tuple, context: dict) -> None:
        """Consecutive one-table parts that are always present (``shape``, ``byte_offset``), each
        in turn; a visitor may read them at once."""
        for part in parts:
            with self.part(part):
                self.table(part, part.decl, context)

    def entries(self, part: DescriptorPart, count: int, context: dict) -> None:
        """``count`` entries of ``part.decl`` (the buffer handles)."""
        for index in range(count):
            with self.entry(part, index):
                self.table(part, part.decl, context)

    def entry(self, part: DescriptorPart, index: int) -> ContextManager:
        """Around entry ``index`` of a repeated part."""
        return NOTHING

    def level(self, part: DescriptorPart, choice: Choice, depth: int) -> ContextManager:
        """Around level ``depth`` (1 first) of a nesting table."""
        return NOTHING

    def deeper(self, part: DescriptorPart, choice: Choice, depth: int) -> bool:
        """Whether level ``depth`` (2 or more) is walked; a visitor bounds the depth here."""
        return True

    def private(self, part: DescriptorPart, choice: Choice, context: dict) -> None:
        """The private range's table (an extension layout)."""
        self.table(part, choice.decl, context)

    def unknown(self, part: DescriptorPart, tag: int) -> None:
        """A tag with no table: the rest of the descriptor is opaque to this reader."""

    def sized(self, part: DescriptorPart, context: dict) -> ContextManager:
        """Around a part read inside the length its prefix gives; the visitor reads (or
        writes) the prefix and bounds what follows by it."""
        return NOTHING

    def chosen_tag(self, part: DescriptorPart) -> Optional[int]:
        """The tag that chooses the table of a sized part (its first field), unread."""
        raise NotImplementedError

    def unknown_sized(self, part: DescriptorPart, tag: Optional[int], context: dict) -> None:
        """A sized part whose tag has no table: its header, then an opaque payload."""

    def padding(self, part: DescriptorPart) -> None:
        """Whatever a sized part's table leaves of its length."""

    def trailing(self) -> None:
        """Bytes after the last part this version defines."""


_RUN = "run"
"""The walk's step for consecutive one-table parts that are always present (``shape``, ``byte_offset``)."""


def _steps() -> tuple:
    """``(part or run of parts, kind, gating flag bit as a plain int, 0: always)`` after the header."""
    steps: list = []
    for part in BODY_PARTS:
        kind, flag = KINDS[part.name], int(part.flag) if part.flag is not None else 0
        if kind is PartKind.TABLE and not flag:
            if steps and steps[-1][1] is _RUN:
                steps[-1] = (steps[-1][0] + (part,), _RUN, 0)
                continue
            steps.append(((part,), _RUN, 0))
            continue
        steps.append((part, kind, flag))
    return tuple(steps)


_WALK = _steps()
RUNS = tuple(parts for parts, kind, _ in _WALK if kind is _RUN)
"""The runs of always-present one-table parts the walk hands over at once (:meth:`DescriptorVisitor.run`)."""


_TABLE, _REPEATED, _CHOICE = PartKind.TABLE, PartKind.REPEATED, PartKind.CHOICE


def walk_descriptor(v: DescriptorVisitor) -> None:
    """Walk every part the fixed header selects, in wire order, with visitor ``v``."""
    marks = v.marks_parts
    with v.part(HEADER_PART):
        header = v.table(HEADER_PART, HEADER_PART.decl, {})
    if not v.header(header):
        return
    context = {"rank": header["rank"]}
    flags = header["flags"]
    for part, kind, flag in _WALK:
        if flag and not flags & flag:  # a section the header's flags leave out (metadata.md § Flags)
            continue
        if kind is _RUN:
            v.run(part, context)
        elif kind is _TABLE:
            if marks:
                with v.part(part):
                    v.table(part, part.decl, context)
            else:
                v.table(part, part.decl, context)
        elif kind is _REPEATED:
            with v.part(part):
                count = v.table(part, part.prefix, context)[part.prefix_field]
                v.entries(part, count, context)
        elif kind is _CHOICE:
            if not _walk_choice(v, part, header[part.chosen_by], context):
                return
        else:
            _walk_sized_choice(v, part, context)
    v.trailing()


def _walk_choice(v: DescriptorVisitor, part: DescriptorPart, tag: int, context: dict) -> bool:
    choice = choose(part, tag)
    if choice is None:
        v.unknown(part, tag)
        return False
    with v.part(part, choice):
        if choice.private:
            v.private(part, choice, context)
        elif choice.nested_by is not None:
            _walk_levels(v, part, choice, context)
        elif choice.decl is not None:
            v.table(part, choice.decl, context)
    return True


def _walk_levels(v: DescriptorVisitor, part: DescriptorPart, choice: Choice, context: dict) -> None:
    """A table repeated one level deeper while its ``nested_by`` field holds its own tag."""
    depth = 1
    while True:
        with v.level(part, choice, depth):
            values = v.table(part, choice.decl, context)
        if values[choice.nested_by] != choice.tag:
            return
        depth += 1
        if not v.deeper(part, choice, depth):
            return


def _walk_sized_choice(v: DescriptorVisitor, part: DescriptorPart, context: dict) -> None:
    with v.sized(part, context):
        tag = v.chosen_tag(part)
        choice = choose(part, tag)
        if choice is None:
            v.unknown_sized(part, tag, context)
        else:
            with v.part(part, choice):
                v.table(part, choice.decl, context)
        v.padding(part)


# ------------------------------------------------------------------------------------
# The walk of the declarations
# ------------------------------------------------------------------------------------


class DeclarationVisitor:
    """What :func:`walk_declarations` asks of a tool that describes every part at once.
    Each method returns what the tool makes of the part (a row, a Kaitai attribute...)."""

    def table_part(self, part: DescriptorPart) -> Any:
        raise NotImplementedError

    def repeated_part(self, part: DescriptorPart) -> Any:
        raise NotImplementedError

    def chosen_part(self, part: DescriptorPart, cases: tuple[Choice, ...]) -> Any:
        raise NotImplementedError

    def sized_part(self, part: DescriptorPart, header, cases: tuple[Choice, ...]) -> Any:
        """``header``: the fields every table of the part starts with (the tag among them)."""
        raise NotImplementedError


def walk_declarations(v: DeclarationVisitor) -> Iterator[tuple[DescriptorPart, Any]]:
    """Each part in wire order with what visitor ``v`` makes of it (the parts as the
    declaration module holds them when called)."""
    for part in _descriptor.DESCRIPTOR_PARTS:
        kind = kind_of(part)
        if kind is PartKind.TABLE:
            made = v.table_part(part)
        elif kind is PartKind.REPEATED:
            made = v.repeated_part(part)
        elif kind is PartKind.CHOICE:
            made = v.chosen_part(part, choices(part))
        else:
            made = v.sized_part(part, part.head, choices(part))
        yield part, made
