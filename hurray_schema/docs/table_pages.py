"""The pages of the declarations: one per ``structs`` module (a table per declared struct, the
session's payloads by message type), the element types and the tag tables."""

from __future__ import annotations

import enum
from typing import Optional

from ..structs import session as session_structs
from ..structs._declare import Field
from ..structs.stream import MessageType
from .catalog import model_enums, table_name
from .markdown import GENERATED, _enum_link, _page_title, _rule_anchor, _table
from .notes import _module_summary, attribute_notes, member_notes
from .tables import StructDoc
from .wire_types import (
    _field_size, _invalid_tags, _private_range, _Size, entry_table, optional_fields, presence, private_values,
    session_payloads, spec_type, table_size,
)


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
    valid = f.valid.text() if f.valid is not None and not f.reserved else ""  # reserved: the doc says it
    if valid:
        notes += f" Valid: {valid}."
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
    from ..structs import element_types

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
