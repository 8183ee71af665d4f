"""Each declared table once (:class:`StructDoc`), with where it starts inside a descriptor and
what selects it (a flag bit, a tag value, a count), from the walk of the declarations
(:func:`~hurray_schema.structs.walker.walk_declarations`)."""

from __future__ import annotations

from typing import Optional

import construct

from ..structs._declare import Field, fields
from ..structs.walker import DeclarationVisitor, walk_declarations
from .catalog import _is_table, struct_modules
from .notes import attribute_notes
from .wire_types import _expr, _private_range, _Size, entry_table, table_size

__all__ = ["StructDoc", "struct_docs"]


class StructDoc:
    """One declared wire table and where it sits."""

    def __init__(self, module: str, name: str, decl: construct.Construct, note: str):
        self.module = module  # e.g. "layouts"
        self.name = name  # e.g. "COMPOSITE"
        self.decl = decl
        self.note = note  # the attribute docstring in the module, if any
        self.fields: list[Field] = list(fields(decl))
        self.start: Optional[_Size] = None  # start inside the descriptor, where fixed
        self.context: str = ""  # e.g. "layout_tag 0x0B (COMPOSITE)"

    @property
    def anchor(self) -> str:
        return self.name.lower()

    @property
    def page(self) -> str:
        return f"{self.module.replace('_', '-')}.md"

    @property
    def refs(self) -> list[str]:
        seen: list[str] = []
        for f in self.fields:
            if f.ref and f.ref not in seen:
                seen.append(f.ref)
        return seen


def struct_docs() -> list[StructDoc]:
    """Every declared table, each once, in module order then declaration order.

    A struct made of fields already shown in an earlier table (``select``, or a prefix
    such as ``EXTENSION_HEAD``) is the same declaration and is not repeated.
    """
    docs: list[StructDoc] = []
    shown: set[int] = set()
    for module in struct_modules():
        notes = attribute_notes(module)
        short = module.__name__.rsplit(".", 1)[1]
        for name, value in vars(module).items():
            if not _is_table(value) or name.startswith("_"):
                continue
            ids = {id(f) for f in fields(value)}
            if ids and ids <= shown:
                continue
            shown |= ids
            docs.append(StructDoc(short, name, value, notes.get(name, "")))
    _place(docs)
    _place_entries(docs)
    return docs


def _place_entries(docs: list[StructDoc]) -> None:
    """The context of a table other tables repeat (the layout entry): where its entries are."""
    by_decl = {id(d.decl): d for d in docs}
    users: dict[int, dict[str, list[str]]] = {}
    for d in docs:
        for f in d.fields:
            entry = entry_table(f)
            if entry is not None and id(entry) in by_decl:
                place = f"[`{d.name}.{f.name}`]({d.page}#{d.anchor})"
                users.setdefault(id(entry), {}).setdefault(_expr(f.subcon.count), []).append(place)
    for key, by_count in users.items():
        by_decl[key].context = " ".join(f"The entries of {', '.join(places)}: `{count}` of them, after `{count}`."
                                        for count, places in by_count.items())


class _Placer(DeclarationVisitor):
    """Where each table of a descriptor starts (while that does not depend on values) and
    what selects it: a flag bit, a tag value, a count.  Each method returns the start of
    its part (``None``: it depends on values)."""

    def __init__(self, by_decl: dict):
        self.by_decl = by_decl
        self.start: Optional[_Size] = _Size()

    def _advance(self, part) -> Optional[_Size]:
        start = self.start
        self.start = _part_end(part, start)
        return start

    def table_part(self, part) -> Optional[_Size]:
        doc = self.by_decl.get(id(part.decl))
        if doc is not None:
            if part.flag is not None:
                doc.context = f"Present when flag bit {part.flag.bit_length() - 1} ({part.flag.name}) is set."
            if self.start is not None:
                doc.start = self.start
        return self._advance(part)

    def repeated_part(self, part) -> Optional[_Size]:
        doc = self.by_decl.get(id(part.decl))
        if doc is not None:
            count = part.prefix_field
            doc.context = f"Repeated `{count}` times after `{count}`."
        return self._advance(part)

    def chosen_part(self, part, cases) -> Optional[_Size]:
        for case in cases:
            doc = self.by_decl.get(id(case.decl)) if case.decl is not None else None
            if doc is None:
                continue
            doc.start = self.start
            if case.private:
                doc.context = f"Present when `{part.chosen_by}` is in {_private_range()} (implementation-private)."
            else:
                doc.context = f"Present when `{part.chosen_by}` is 0x{int(case.tag):02X} ({case.tag.name})."
        return self._advance(part)

    def sized_part(self, part, head, cases) -> Optional[_Size]:
        for case in cases:
            doc = self.by_decl.get(id(case.decl))
            if doc is not None and not case.private:
                doc.context = (f"The {part.name} descriptor when `{part.chosen_by}` is 0x{int(case.tag):02X} "
                               f"({case.tag.name}); it follows `{part.prefix_field}`.")
        return self._advance(part)


def _place(docs: list[StructDoc]) -> None:
    """Start offsets inside a descriptor and the tag/flag that selects each table, from the
    walk of the declarations (:func:`~hurray_schema.structs.walker.walk_declarations`)."""
    list(walk_declarations(_Placer({id(d.decl): d for d in docs})))


def _part_end(part, start: Optional[_Size]) -> Optional[_Size]:
    """Where the part after ``part`` starts, while that does not depend on values."""
    if start is None or part.decl is None or part.prefix is not None or part.flag is not None:
        return None
    size = table_size(part.decl)
    return start + size if size is not None else None
