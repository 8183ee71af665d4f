"""``hurray_descriptor.ksy``: a descriptor part by part, as the walk of the declarations
(:func:`~hurray_schema.structs.walker.walk_declarations`) hands the parts over -- each part a
type made of its declaration's fields, an optional section gated by its flag bit, the
layout-specific table switched on ``layout_tag`` (the private range read as the extension
table, the tiled levels nested), the quantization scheme switched on ``scheme_tag`` inside
the substream its length prefix bounds.
"""

from __future__ import annotations

import enum

from ..structs import descriptor as descriptor_structs
from ..structs import tags as tag_tables
from ..structs._declare import Field, fields, static_offset
from ..structs.walker import HEADER_PART, DeclarationVisitor, walk_declarations
from .builder import (
    GENERATED, _decl_name, _decl_note, _enum_value, _field_of, _hex, _meta, _params, _primitive, _Schema, _Scope,
    ksy_id, spec_link,
)


def _flag_field(flag: enum.IntFlag) -> Field:
    """The fixed-header field that carries the flag table of ``flag``."""
    for f in fields(descriptor_structs.FIXED_HEADER):
        if f.tags is type(flag):
            return f
    raise KeyError(type(flag).__name__)


class _KsyParts(DeclarationVisitor):
    """The ``seq`` attributes of each part of a descriptor, as the walk of the declarations
    (:func:`~hurray_schema.structs.walker.walk_declarations`) hands the parts over."""

    def __init__(self, schema: "_Schema", root: "_Scope"):
        self.schema, self.root = schema, root

    def _attribute(self, part, kind) -> list[dict]:
        spec = {"id": part.name, "type": kind}
        if part.flag is not None:
            flag_field = _flag_field(part.flag)
            self.schema.use_enum(type(part.flag))
            spec["if"] = f"({self.root.names[flag_field.name]} & {_enum_value(part.flag)}.to_i) != 0"
        spec["doc"] = _part_doc(part)
        spec["doc-ref"] = spec_link(part.ref)
        return [spec]

    def table_part(self, part) -> list[dict]:
        name = part.name if part is HEADER_PART else None
        return self._attribute(part, self.schema.call(part.decl, self.root, name, ref=part.ref))

    def repeated_part(self, part) -> list[dict]:
        return self._attribute(part, _repeated_part(self.schema, part, self.root))

    def chosen_part(self, part, cases) -> list[dict]:
        return _chosen_part(self.schema, part, cases, self.root)

    def sized_part(self, part, head, cases) -> list[dict]:
        return self._attribute(part, _sized_choice_part(self.schema, part, head, cases, self.root))


def _descriptor_schema() -> dict:
    schema = _Schema()
    header_name = HEADER_PART.name
    root = _Scope({f.name: f"{header_name}.{ksy_id(f.name)}" for f in fields(HEADER_PART.decl)})
    seq: list[dict] = [spec for _, specs in walk_declarations(_KsyParts(schema, root)) for spec in specs]
    seq.append({
        "id": "trailing", "size-eos": True,
        "doc": "Bytes after the parts this version defines (a newer minor version adds them at the end).",
        "doc-ref": spec_link("metadata.md § Version Compatibility"),
    })
    return {
        "meta": _meta("hurray_descriptor", "Hurray tensor descriptor", "desc"),
        "doc": ("A Hurray tensor descriptor: the fixed header, shape, byte_offset, the layout-specific fields, "
                f"the buffer table, then the optional sections its flags select. {GENERATED}"),
        "doc-ref": spec_link(descriptor_structs.OVERALL_REF),
        "seq": seq,
        "types": schema.types,
        "enums": schema.enum_specs(),
    }


def _part_doc(part) -> str:
    if part.flag is not None:
        return f"Present when flag bit {part.flag.bit_length() - 1} ({part.flag.name}) is set."
    if part.chosen_by is not None:
        return f"Chosen by {part.chosen_by}."
    if part.prefix is not None:
        return f"{part.prefix_field}, then that many entries."
    return _decl_note(part.decl) or part.name.replace("_", " ").capitalize() + "."


def _chosen_part(schema: _Schema, part, cases, root: _Scope) -> list[dict]:
    """The layout-specific table: switched on the header's tag, the private range read as
    the extension table (a second attribute), a nested level where :data:`NESTED_BY` says."""
    tag_expr = root.names[part.chosen_by]
    tag_table = _field_of(descriptor_structs.FIXED_HEADER, part.chosen_by).tags
    schema.use_enum(tag_table)
    switch = {}
    for case in cases:
        tag, decl, nested = case.tag, case.decl, case.nested_by
        if decl is None or case.private:
            continue
        extra = ()
        name = _decl_name(decl)
        if nested is not None:
            args = ", ".join(ksy_id(p) for p in _params(decl))
            extra = ({
                "id": "next_level",
                "type": f"{name}({args})" if args else name,
                "if": f"{ksy_id(nested)} == {_enum_value(tag)}",
                "doc": f"The next level, present when {nested} is 0x{int(tag):02X} ({tag.name}).",
                "doc-ref": spec_link(_field_of(decl, nested).ref),
            },)
        switch[_enum_value(tag)] = schema.call(decl, root, ref=part.ref, extra=extra)
    out = [{
        "id": part.name,
        "type": {"switch-on": tag_expr, "cases": switch},
        "doc": f"The table of the {part.chosen_by}; none for a layout without fields.",
        "doc-ref": spec_link(part.ref),
    }]
    for case in (c for c in cases if c.private):
        private = schema.call(case.decl, root)
        first, last = _hex(_private_range()[0]), _hex(_private_range()[1])
        out.append({
            "id": f"{part.name}_{_decl_name(case.decl)}",
            "type": private,
            "if": f"{tag_expr}.to_i >= {first} and {tag_expr}.to_i <= {last}",
            "doc": f"Present when {part.chosen_by} is in the implementation-private range {first}-{last}.",
            "doc-ref": spec_link(_field_of(case.decl, _first_field(case.decl)).ref),
        })
    return out


def _private_range() -> tuple[int, int]:
    return tag_tables.PRIVATE_TAG_FIRST, tag_tables.PRIVATE_TAG_LAST


def _first_ref(decl) -> str:
    """The citation of the first field of ``decl``."""
    return next(iter(fields(decl))).ref


def _first_field(decl) -> str:
    return next(iter(fields(decl))).name


def _repeated_part(schema: _Schema, part, root: _Scope) -> str:
    """A count and that many entries (the buffer table)."""
    entry = schema.call(part.decl, root, ref=part.ref)
    count = part.prefix_field
    name = part.name
    if name not in schema.types:
        scope = _Scope({f.name: ksy_id(f.name) for f in fields(part.prefix)})
        schema.types[name] = {
            "doc-ref": spec_link(part.ref),
            "seq": [schema.attribute(f, scope) for f in fields(part.prefix)] + [{
                "id": part.attribute, "type": entry, "repeat": "expr", "repeat-expr": ksy_id(count),
                "doc": f"{ksy_id(count)} entries.", "doc-ref": spec_link(part.ref),
            }],
        }
    return name


def _sized_choice_part(schema: _Schema, part, header, cases, root: _Scope) -> str:
    """A length, then the table its first field selects inside that many bytes (the
    quantization section): the tag is peeked at its offset in the substream."""
    tag_field = _field_of(header, part.chosen_by)
    tag_enum = schema.use_enum(tag_field.tags)
    switch = {_enum_value(c.tag): schema.call(c.decl, root, ref=part.ref) for c in cases if not c.private}
    header_type = schema.table(header, ref=_first_ref(header))
    switch["_"] = header_type
    known = " and ".join(f"{ksy_id(part.chosen_by)} != {_enum_value(c.tag)}" for c in cases if not c.private)
    body = f"{part.name}_body"
    schema.types[body] = {
        "doc": f"The {part.prefix_field} bytes: a scheme's table, then padding.",
        "doc-ref": spec_link(part.ref),
        "seq": [
            {"id": "scheme", "type": {"switch-on": ksy_id(part.chosen_by), "cases": switch},
             "doc": f"The table of the {part.chosen_by}; an unknown scheme shows its header alone.",
             "doc-ref": spec_link(_first_ref(header))},
            {"id": "payload", "size-eos": True, "if": known,
             "doc": "The payload of a scheme this version does not define, opaque.",
             "doc-ref": spec_link(_first_ref(header))},
            {"id": "padding", "size-eos": True, "doc": "Bytes after the scheme's fields.",
             "doc-ref": spec_link(part.ref)},
        ],
        "instances": {ksy_id(part.chosen_by): {
            "pos": static_offset(header, part.chosen_by), "type": _primitive(tag_field.subcon), "enum": tag_enum,
            "doc": tag_field.doc, "doc-ref": spec_link(tag_field.ref),
        }},
    }
    name = part.name
    scope = _Scope({f.name: ksy_id(f.name) for f in fields(part.prefix)})
    schema.types[name] = {
        "doc-ref": spec_link(part.ref),
        "seq": [schema.attribute(f, scope) for f in fields(part.prefix)] + [{
            "id": "body", "size": ksy_id(part.prefix_field), "type": body,
            "doc": f"Exactly {part.prefix_field} bytes.", "doc-ref": spec_link(part.ref),
        }],
    }
    return name
