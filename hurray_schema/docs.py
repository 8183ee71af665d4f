"""Format documentation generated from the wire-table declarations.

Every page under ``docs/format/`` is written by :func:`write_docs` from the same
``construct`` declarations the codec runs (``hurray_schema/structs/``): their fields,
the tag table attached to each field, the descriptor's parts
(:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`), and the rule registry, so
the documentation cannot drift from the code: a test regenerates the pages and compares
them with the committed ones.

* one page per ``structs`` module (one spec area), with a table per declared struct:
  offset inside the table (a formula in ``rank`` where the size of an earlier field
  depends on it), offset inside the descriptor where that is fixed, field, wire type in
  the spec's vocabulary (``uint32``, ``uint8[2]``, ``uint64[rank]``), our one-line
  description and the spec citation;
* ``session.md`` also lists each session message's payload table (an empty one where it
  has none); a table other tables repeat (the layout entry) says where, a field a payload may
  end before (a hello's memory class list) says so;
* ``element-types.md``: the element type table;
* ``tags.md``: every tag table (``IntEnum`` / ``IntFlag`` of ``structs/tags.py`` and of
  the container modules), with this implementation's values of a table's
  implementation-defined range (``PrivateErrorCode`` beside ``ErrorCode``);
* ``index.md``: the pages, the parts of a descriptor, and every rule linked to the
  struct(s) it constrains and to its conformance vectors;
* ``vectors.md``: every rule with its conformance vectors (:mod:`hurray_schema.vectors`):
  file, our readers' verdicts, and the hex of the bytes around the fault.

Nothing here reads the spec text; descriptions are the project's own (``field(...)``).
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Iterable, Optional

import construct

from .structs import descriptor as descriptor_structs
from .structs import session as session_structs
from .structs import tags as tag_tables
from .structs.stream import MessageType
from .structs._declare import Field, fields, static_size
from .vectors import NO_VECTOR, build_corpus, hex_around

__all__ = [
    "spec_type", "presence", "entry_table", "table_name", "optional_fields", "private_values", "session_payloads",
    "attribute_notes", "member_notes", "tag_table", "StructDoc", "struct_docs", "render_pages", "write_docs",
    "check_docs",
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
# Field → tag table
# ------------------------------------------------------------------------------------

_DECLARATIONS: dict[str, construct.Construct] = {}


def declarations() -> dict[str, construct.Construct]:
    """Every declared table of ``hurray_schema.structs`` by its module-level name."""
    if not _DECLARATIONS:
        for module in struct_modules():
            for name, value in vars(module).items():
                if _is_table(value) and not name.startswith("_"):
                    _DECLARATIONS.setdefault(name, value)
    return _DECLARATIONS


def table_name(decl: construct.Construct) -> Optional[str]:
    """The module-level name of a declared table (``LAYOUT_ENTRY``), else ``None``."""
    for name, value in declarations().items():
        if value is decl:
            return name
    return None


def tag_table(decl_name: str, field_name: str) -> Optional[type[enum.IntEnum]]:
    """The tag table attached to field ``field_name`` of the table named ``decl_name``
    (``None``: an unknown table or field, or a field without a tag table)."""
    decl = declarations().get(decl_name)
    if decl is None:
        return None
    for f in fields(decl):
        if f.name == field_name:
            return f.tags
    return None


# ------------------------------------------------------------------------------------
# Discovering the declarations
# ------------------------------------------------------------------------------------


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


def attribute_notes(module) -> dict[str, str]:
    """Attribute docstrings (a string right after ``NAME = ...``) of a module."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    return _body_notes(tree.body)


def _body_notes(body: list) -> dict[str, str]:
    """Attribute docstrings of the statements ``body`` (a module's or a class's)."""
    notes = {}
    group: list[str] = []  # one-line assignments on consecutive lines: a docstring after them documents them all
    last_line = 0  # the line of the last one-line assignment, 0 after anything else
    for node in body:
        if isinstance(node, ast.Assign):
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            one_line = node.lineno == node.end_lineno
            group = group + names if one_line and node.lineno == last_line + 1 else names
            last_line = node.lineno if one_line else 0
            continue
        last_line = 0
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for name in group:
                notes[name] = _plain(" ".join(node.value.value.split()))
        group = []
    return notes


_ROLE = re.compile(r":\w+:`~?[\w.]*?(\w+)`")


def _plain(text: str) -> str:
    """A docstring's text for Markdown: a Sphinx cross-reference (``:mod:`.stream```) as code."""
    return _ROLE.sub(r"`\1`", text)


def _module_summary(module) -> str:
    doc = inspect.getdoc(module) or ""
    return _plain(doc.split("\n\n")[0].replace("\n", " ").strip())


def struct_modules() -> list:
    """The modules of ``hurray_schema.structs`` that declare wire tables, in name order."""
    from . import structs

    found = []
    for info in sorted(pkgutil.iter_modules(structs.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{structs.__name__}.{info.name}")
        if any(_is_table(v) for v in vars(module).values()):
            found.append(module)
    return found


def _is_table(value) -> bool:
    return isinstance(value, construct.Struct) and any(isinstance(s, Field) for s in value.subcons)


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


def _private_range() -> str:
    return f"0x{tag_tables.PRIVATE_TAG_FIRST:02X}–0x{tag_tables.PRIVATE_TAG_LAST:02X}"


def _invalid_tags() -> str:
    return " and ".join(f"0x{tag:02X}" for tag in tag_tables.INVALID_TAGS)


def _place(docs: list[StructDoc]) -> None:
    """Start offsets inside a descriptor and the tag/flag that selects each table, from
    :data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`."""
    by_decl = {id(d.decl): d for d in docs}
    start: Optional[_Size] = _Size()
    for part in descriptor_structs.DESCRIPTOR_PARTS:
        if part.tables is not None:
            _place_chosen(part, start, by_decl)
        elif part.flag is not None and id(part.decl) in by_decl:
            flag = part.flag
            by_decl[id(part.decl)].context = f"Present when flag bit {flag.bit_length() - 1} ({flag.name}) is set."
        if part.prefix is not None and part.tables is None and id(part.decl) in by_decl:
            count = part.prefix_field
            by_decl[id(part.decl)].context = f"Repeated `{count}` times after `{count}`."
        if start is not None and part.decl is not None and part.prefix is None and id(part.decl) in by_decl:
            by_decl[id(part.decl)].start = start
        start = _part_end(part, start)


def _place_chosen(part, start: Optional[_Size], by_decl: dict) -> None:
    """Where the tables of a part chosen by a tag start, and which tag value selects each."""
    for tag, decl in part.tables.items():
        doc = by_decl.get(id(decl)) if decl is not None else None
        if doc is None:
            continue
        if part.prefix is None:
            doc.start = start
            doc.context = f"Present when `{part.chosen_by}` is 0x{int(tag):02X} ({tag.name})."
        else:
            doc.context = (f"The {part.name} descriptor when `{part.chosen_by}` is 0x{int(tag):02X} "
                           f"({tag.name}); it follows `{part.prefix_field}`.")
    doc = by_decl.get(id(part.private)) if part.private is not None else None
    if doc is not None:
        doc.start = start
        doc.context = f"Present when `{part.chosen_by}` is in {_private_range()} (implementation-private)."


def _part_end(part, start: Optional[_Size]) -> Optional[_Size]:
    """Where the part after ``part`` starts, while that does not depend on values."""
    if start is None or part.decl is None or part.prefix is not None or part.flag is not None:
        return None
    size = table_size(part.decl)
    return start + size if size is not None else None


# ------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------

GENERATED = "<!-- Generated by `hurray-schema docs` from hurray_schema/structs; do not edit. -->"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
    return lines


def _enum_link(e: type[enum.IntEnum]) -> str:
    return f"[{e.__name__}](tags.md#{e.__name__.lower()})"


def _field_notes(doc: StructDoc, f: Field) -> str:
    """What a field's description adds from its declaration: when it is present, the table
    of its entries, the tag table(s) of its values."""
    notes = ""
    cond = presence(f)
    if cond:
        notes += f" Present when `{cond}`."
    if f.name in optional_fields(doc.decl):
        notes += " May be absent: the payload can end before it."
    entry = entry_table(f)
    if entry is not None:
        name = table_name(entry)
        notes += f" Entries: [`{name}`](#{name.lower()})."
    if f.tags is not None:
        notes += f" Values: {_enum_link(f.tags)}"
        private = private_values(f.tags)
        if private is not None:
            notes += f"; this implementation's, in the implementation-defined range: {_enum_link(private)}"
        notes += "."
    return notes


def _struct_rows(doc: StructDoc) -> list[list[str]]:
    rows = []
    offset: Optional[_Size] = _Size()
    for f in doc.fields:
        at = str(offset) if offset is not None else "—"
        absolute = str(doc.start + offset) if (doc.start is not None and offset is not None) else "—"
        typ = f"`{spec_type(f)}`"
        desc = f.doc + _field_notes(doc, f)
        row = [at]
        if doc.start is not None:
            row.append(absolute)
        rows.append(row + [f"`{f.name}`", typ, desc, f.ref])
        size = _field_size(f)
        offset = offset + size if (offset is not None and size is not None) else None
    return rows


def _struct_section(doc: StructDoc, rules: list = ()) -> list[str]:
    size = table_size(doc.decl)
    size_text = f"{size} bytes" if size is not None else "variable size"
    out = [f'<a id="{doc.anchor}"></a>', "", f"## `{doc.name}`", ""]
    if doc.note:
        out += [doc.note, ""]
    if size is not None and str(size) == "1":
        size_text = "1 byte"
    facts = [f"Size: {size_text}."]
    if doc.start is not None:
        facts.append(f"Starts at descriptor byte {doc.start}.")
    if doc.context:
        facts.append(doc.context)
    out += [" ".join(facts), ""]
    header = ["Offset"] + (["In descriptor"] if doc.start is not None else []) + [
        "Field", "Type", "Description", "Citation",
    ]
    out += _table(header, _struct_rows(doc))
    out.append("")
    if rules:
        links = ", ".join(f"[`{r.id}`](index.md#{_rule_anchor(r)})" for r in rules)
        out += [f"Rules: {links}.", ""]
    return out


def _rule_anchor(rule) -> str:
    return "rule-" + re.sub(r"[^\w-]", "-", rule.id)


def _page_title(module: str) -> str:
    return {
        "descriptor": "Descriptor core: fixed header, shape, byte_offset, buffer table",
        "layouts": "Layout-specific fields",
        "quantization": "Quantization section",
        "sections": "Optional sections: shard, statistics, extension type, composite member",
        "element_types": "Element types",
        "file": "File container: header, KV metadata, index, trailer",
        "stream": "Message stream framing",
        "session": "Transport session: hellos, requests, PUT, errors, keepalives, RDMA",
    }.get(module, module.replace("_", " ").capitalize())


def _payloads_section(docs: list[StructDoc]) -> list[str]:
    """The session page's table of message types: each session message's payload table (or
    an empty payload), the private and the invalid message types."""
    by_decl = {id(d.decl): d for d in docs}
    notes = attribute_notes(session_structs)
    rows = []
    for kind, decl in session_payloads().items():
        doc = by_decl.get(id(decl))
        if doc is not None:
            payload, note = f"[`{doc.name}`](#{doc.anchor})", doc.note
        else:
            payload, note = "empty", notes.get(kind.name, "")
        rows.append([f"0x{int(kind):08X}", f"`{kind.name}`", payload, note])
    first, last = session_structs.PRIVATE_MESSAGE_FIRST, session_structs.PRIVATE_MESSAGE_LAST
    rows.append([f"0x{first:08X}–0x{last:08X}", "(private extension)", "agreed between the peers",
                 "Sent only to a peer that agreed to it."])
    rows.append([f"0x{session_structs.INVALID_MESSAGE_TYPE:08X}", "(invalid)", "—", "Never used."])
    framing = [f"`{k.name}`" for k in MessageType if k not in session_payloads()]
    out = ['<a id="payloads"></a>', "", "## Payloads by message type", ""]
    out += [f"The payload of each session message (`message_type` of "
            f"[`MESSAGE_HEADER`](stream.md#message_header)); the tensor frames ({', '.join(framing)}) are on the "
            f"[{_page_title('stream')}](stream.md) page.", ""]
    out += _table(["Type", "Name", "Payload", "Note"], rows)
    return out + [""]


def _struct_page(module, docs: list[StructDoc], rules_of: dict) -> str:
    short = module.__name__.rsplit(".", 1)[1]
    out = [GENERATED, "", f"# {_page_title(short)}", ""]
    out += [f"Declared in `hurray_schema/structs/{short}.py`. {_module_summary(module)}", ""]
    note = "Offsets are in bytes from the start of the table"
    if any(d.start is not None or "rank" in str(table_size(d.decl)) for d in docs):
        note += "; `rank` is the descriptor's rank"
    if any(d.start is not None for d in docs):
        note += (". \"In descriptor\" is the offset from the first byte of the descriptor, where it "
                 "does not depend on earlier variable fields")
    out += [note + ". All multi-byte fields are little-endian.", ""]
    if module is session_structs:
        out += _payloads_section(docs)
    for doc in docs:
        out += _struct_section(doc, rules_of.get(id(doc), []))
    return "\n".join(out).rstrip() + "\n"


def _packed_size(info) -> str:
    """Buffer bytes of ``n`` elements as a formula, checked against ``buffer_bytes``."""
    bits = info.bit_width
    if bits % 8 == 0:
        text, f = (f"{bits // 8}·n" if bits > 8 else "n"), (lambda n: bits // 8 * n)
    elif 8 % bits == 0:
        text, f = f"⌈n/{8 // bits}⌉", (lambda n: -(-n // (8 // bits)))
    else:  # 6-bit: 4 elements in 3 bytes
        text, f = "3·⌈n/4⌉", (lambda n: 3 * -(-n // 4))
    if any(f(n) != info.buffer_bytes(n) for n in range(0, 65)):
        raise AssertionError(f"size formula of {info.name} disagrees with buffer_bytes")
    return text


def _element_types_page() -> str:
    from .structs import element_types

    out = [GENERATED, "", "# Element types", ""]
    out += [f"Declared in `hurray_schema/structs/element_types.py` ({element_types.REF}). {_module_summary(element_types)}", ""]
    rows = []
    for info in element_types.ELEMENT_TYPES.values():
        rows.append([
            f"0x{int(info.tag):02X}", f"`{info.name}`", str(info.tier), str(info.bit_width),
            str(info.alignment), "yes" if info.is_float else "no", "yes" if info.is_signed else "no",
            _packed_size(info),
        ])
    out += _table(["Tag", "Name", "Tier", "Bits", "Alignment", "Float", "Signed", "Bytes for n elements"], rows)
    out += ["", f"Tag 0x{element_types.RESERVED_TYPE_TAG:02X} is reserved; {_private_range()} are implementation-private "
            f"(described by the extension type section); {_invalid_tags()} are invalid.", ""]
    return "\n".join(out)


def model_enums() -> list[type[enum.IntEnum]]:
    """The tag tables of ``structs/tags.py`` then of the other ``structs`` modules, in
    declaration order."""
    found = []
    for module in [tag_tables, *struct_modules()]:
        for value in vars(module).values():
            if (
                isinstance(value, type) and issubclass(value, (enum.IntEnum, enum.IntFlag))
                and value.__module__ == module.__name__ and value not in found
            ):
                found.append(value)
    return found


def member_notes(table: type) -> dict[str, str]:
    """The docstrings of a tag table's members (a string right after ``NAME = value``)."""
    try:
        tree = ast.parse(inspect.getsource(table))
    except (OSError, TypeError):
        return {}
    return _body_notes(tree.body[0].body)


def _tags_page(docs: list[StructDoc]) -> str:
    users: dict[type, list[str]] = {}
    for doc in docs:
        for f in doc.fields:
            if f.tags is not None:
                link = f"[`{doc.name}.{f.name}`]({doc.page}#{doc.anchor})"
                users.setdefault(f.tags, []).append(link)
                private = private_values(f.tags)
                if private is not None:
                    users.setdefault(private, []).append(f"{link} (this implementation's values, in the range "
                                                         f"{_enum_link(f.tags)} leaves implementation-defined)")
    out = [GENERATED, "", "# Tag tables", ""]
    out += ["Declared as `IntEnum` / `IntFlag` classes in `hurray_schema/structs/tags.py` and the "
            "`hurray_schema/structs/` container modules, and attached to the fields that carry them.", ""]
    for e in model_enums():
        out += [f'<a id="{e.__name__.lower()}"></a>', "", f"## `{e.__name__}`", ""]
        doc = " ".join((e.__doc__ or "").split())
        if doc:
            out += [doc, ""]
        if users.get(e):
            out += ["Used by: " + ", ".join(users[e]) + ".", ""]
        private = private_values(e)
        if private is not None:
            out += [f"This implementation's values in the implementation-defined range: {_enum_link(private)}.", ""]
        is_flag = issubclass(e, enum.IntFlag)
        meanings = member_notes(e)
        rows = []
        for member in e:
            v = int(member)
            if is_flag:
                row = [str(v.bit_length() - 1), f"0x{v:08X}", f"`{member.name}`"]
            else:
                row = [f"0x{v:02X}", f"`{member.name}`"]
            rows.append(row + ([meanings.get(member.name, "")] if meanings else []))
        header = ["Bit", "Mask", "Name"] if is_flag else ["Value", "Name"]
        out += _table(header + (["Meaning"] if meanings else []), rows)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------------------
# Rules → structs
# ------------------------------------------------------------------------------------


def _section_of(ref: str) -> str:
    """``"metadata.md § Statistics Section › Field Encoding"`` → ``"metadata.md § Statistics Section"``."""
    return ref.split(" › ")[0].strip()


def rule_structs(rule, docs: list[StructDoc]) -> list[StructDoc]:
    """The struct(s) a rule constrains, best first: a field citing the rule's section
    weighs most, then a field or struct named by a word of the rule id (after its area
    prefix), then a field citing the same spec page; among equals, those of the module the
    rule's area names (``stream.*``: ``structs/stream.py``) when there are any."""
    words = set(rule.id.split(".")[1:])
    section = _section_of(rule.citation)
    page = rule.citation.split(" § ")[0]
    scored = []
    for d in docs:
        score = 0
        if any(_section_of(r) == section for r in d.refs):
            score += 4
        if words & {f.name for f in d.fields}:
            score += 2
        if words & set(d.name.lower().split("_")):
            score += 2
        if any(r.split(" § ")[0] == page for r in d.refs):
            score += 1
        if score:
            scored.append((score, d))
    if not scored:
        return []
    best = max(score for score, _ in scored)
    found = [d for score, d in scored if score == best]
    area = [d for d in found if d.module == rule.id.split(".")[0]]
    return area or found


def _part_presence(part) -> str:
    if part.flag is not None:
        return f"flag bit {part.flag.bit_length() - 1} ({part.flag.name})"
    if part.chosen_by is not None:
        return f"depends on `{part.chosen_by}`"
    return "always"


def _part_declaration(part, by_decl: dict) -> str:
    """Links to the declaration(s) of a part of the descriptor."""
    def link(decl) -> Optional[str]:
        d = by_decl.get(id(decl))
        return f"[`{d.name}`]({d.page}#{d.anchor})" if d is not None else None

    if part.tables is not None:
        pages = [by_decl[id(d)].page for d in part.tables.values() if d is not None and id(d) in by_decl]
        return f"[{part.name} tables]({pages[0]})" if pages else "—"
    links = [link(decl) for decl in (part.prefix, part.decl) if decl is not None]
    return ", ".join(x for x in links if x) or "—"


def _index_page(docs: list[StructDoc], pages: list[tuple[str, str]], covered: frozenset = frozenset()) -> str:
    from .rules.engine import registry

    out = [GENERATED, "", "# Hurray wire format (generated)", ""]
    out += [
        "These pages are generated from the `construct` declarations the codec runs "
        "(`hurray_schema/structs/`), the tag tables attached to their fields and the rule "
        "registry. Regenerate them with `hurray-schema docs docs/format`.",
        "",
        "## Pages",
        "",
    ]
    out += [f"- [{title}]({page})" for page, title in pages]
    out += ["", "## Parts of a descriptor", ""]
    by_decl = {id(d.decl): d for d in docs}
    rows = []
    start: Optional[_Size] = _Size()
    for part in descriptor_structs.DESCRIPTOR_PARTS:
        rows.append([f"`{part.name}`", str(start) if start is not None else "—", _part_presence(part),
                     _part_declaration(part, by_decl)])
        start = _part_end(part, start)
    out += _table(["Part", "Starts at", "Present", "Declaration"], rows)
    out += ["", "## Rules", "", "Each rule of the registry with the struct(s) it constrains and its conformance "
            f"vectors ([{VECTORS_PAGE}]({VECTORS_PAGE})).", ""]
    rows = []
    for rule in registry():
        targets = rule_structs(rule, docs)
        links = ", ".join(f"[`{d.name}`]({d.page}#{d.anchor})" for d in targets[:6]) or "—"
        if len(targets) > 6:
            links += f" (+{len(targets) - 6})"
        vectors = f"[{'vectors' if rule.id in covered else 'none'}]({VECTORS_PAGE}#{_vector_anchor(rule)})"
        rows.append([f'<a id="{_rule_anchor(rule)}"></a>`{rule.id}`', rule.level.value, rule.citation, links,
                     rule.summary, vectors])
    out += _table(["Rule", "Level", "Citation", "Struct", "Summary", "Vectors"], rows)
    out.append("")
    return "\n".join(out)


VECTORS_PAGE = "vectors.md"


def _vector_anchor(rule) -> str:
    return "vectors-" + re.sub(r"[^\w-]", "-", rule.id)


def _verdict_cell(verdict) -> str:
    if verdict.rule_id is None:
        return verdict.to_json()["verdict"]
    return f"{verdict.to_json()['verdict']} `{verdict.rule_id}` @ {verdict.offset}"


def _vector_lines(vector) -> list[str]:
    """One vector: its file, our verdicts and, for a violating one, the bytes around the fault."""
    line = (f"- `{vector.file}` ({vector.kind}, {len(vector.data)} bytes): strict {_verdict_cell(vector.strict)}; "
            f"permissive {_verdict_cell(vector.permissive)}")
    if vector.note:
        line += f" -- {vector.note}"
    out = [line]
    if vector.role == "fail":
        start, text = hex_around(vector.data, vector.offset)
        out.append(f"  `{start:#06x}: {text}`")
    return out


def _vectors_page(corpus) -> str:
    """Every rule with its vectors (``hurray-schema vectors OUTDIR`` writes the files)."""
    from .rules.engine import registry

    out = [GENERATED, "", "# Conformance vectors", ""]
    out += [
        "For every rule, the inputs `hurray-schema vectors OUTDIR` writes: a passing one (`.pass.`) and one "
        "that violates that rule and nothing before it (`.fail.`), as a descriptor (`.desc`), a bare stream "
        "(`.stream`), a message stream (`.msgs`) or a file (`.hrry`). Each line gives our strict and permissive "
        "readers' verdicts (the rule and byte offset of the first finding); under a violating vector, the "
        "16-byte row holding the fault (the next row too when the fault is in the row's second half), the "
        "faulty byte in brackets. The manifest (`manifest.json`) also carries pyhurray's verdicts. "
        f"Rules no input can trigger: {len(NO_VECTOR)}; see their reasons below.",
        "",
    ]
    for rule in registry():
        out += [f'## <a id="{_vector_anchor(rule)}"></a>`{rule.id}`', "",
                f"{rule.level.value} ({rule.citation}): {rule.summary} [Rule]({'index.md'}#{_rule_anchor(rule)}).", ""]
        vectors = corpus.of_rule(rule.id)
        if vectors:
            for vector in vectors:
                out += _vector_lines(vector)
        else:
            reason = NO_VECTOR.get(rule.id) or corpus.missing.get(rule.id, "")
            out.append(f"No violating vector: {reason}")
        out.append("")
    return "\n".join(out)


def render_pages() -> dict[str, str]:
    """File name → Markdown text of every page."""
    from .rules.engine import registry

    docs = struct_docs()
    rules_of: dict[int, list] = {}
    for rule in registry():
        for d in rule_structs(rule, docs)[:6]:
            rules_of.setdefault(id(d), []).append(rule)
    pages: dict[str, str] = {}
    titles: list[tuple[str, str]] = []
    for module in struct_modules():
        short = module.__name__.rsplit(".", 1)[1]
        mine = [d for d in docs if d.module == short]
        if not mine:
            continue
        name = f"{short.replace('_', '-')}.md"
        pages[name] = _struct_page(module, mine, rules_of)
        titles.append((name, _page_title(short)))
    pages["element-types.md"] = _element_types_page()
    titles.append(("element-types.md", "Element types"))
    pages["tags.md"] = _tags_page(docs)
    titles.append(("tags.md", "Tag tables"))
    corpus = build_corpus()
    pages[VECTORS_PAGE] = _vectors_page(corpus)
    titles.append((VECTORS_PAGE, "Conformance vectors"))
    pages["index.md"] = _index_page(docs, titles, frozenset(corpus.covered))
    return dict(sorted(pages.items()))


def write_rendered(outdir, texts: dict[str, str]) -> list[Path]:
    """Write each ``name: text`` of a fresh render into ``outdir`` (created if needed); returns the
    paths written."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_rendered(outdir, texts: dict[str, str], suffix: str) -> list[str]:
    """Names of files in ``outdir`` that differ from (or are missing against) a fresh render ``texts``,
    then the files ending in ``suffix`` there that the render does not make."""
    out = Path(outdir)
    stale = [n for n, text in texts.items() if not (out / n).is_file() or (out / n).read_text(encoding="utf-8") != text]
    extra = sorted(p.name for p in out.glob("*" + suffix) if p.name not in texts)
    return stale + extra


def write_docs(outdir) -> list[Path]:
    """Write every page into ``outdir`` (created if needed); returns the paths written."""
    return write_rendered(outdir, render_pages())


def check_docs(outdir) -> list[str]:
    """Names of pages in ``outdir`` that differ from (or are missing against) a fresh render."""
    return stale_rendered(outdir, render_pages(), ".md")
