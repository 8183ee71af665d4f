"""``hurray_file.ksy`` and ``hurray_stream.ksy``.

A file: the file header, the trailer read from the end, the index (each entry's descriptor
and data reached through its offsets) and the KV section.  A stream: a bare stream
(descriptor, then its buffers) or a message stream (message header, payload per message
type), told apart by the first bytes; each session message's payload is a type made of its
table (:data:`~hurray_schema.structs.session.SESSION_TABLES`), then the bytes after it.
"""

from __future__ import annotations

from ..docs import session_payloads
from ..structs import descriptor as descriptor_structs
from ..structs.walker import BUFFER_PART
from ..structs import file as file_structs
from ..structs import session as session_structs
from ..structs import stream as stream_structs
from ..structs._declare import Field, fields, static_offset
from .builder import (
    GENERATED, _enum_value, _field_of, _hex, _meta, _note, _primitive, _Schema, _Scope, ksy_id, spec_link,
)


def _counted(schema, ref: str, count: Field, entry_type: str, doc: str) -> dict:
    """A section of ``count`` then that many ``entry_type`` entries."""
    return {
        "doc-ref": spec_link(ref),
        "seq": [schema.attribute(count, _Scope({})), {
            "id": "entries", "type": entry_type, "repeat": "expr", "repeat-expr": ksy_id(count.name),
            "doc": doc, "doc-ref": spec_link(count.ref)}],
    }


def _file_schema() -> dict:
    s = file_structs
    schema = _Schema()
    empty = _Scope({})
    header = schema.table(s.FILE_HEADER, doc=_note(s, "FILE_HEADER"), ref=s.HEADER_REF)
    trailer = schema.table(s.TRAILER, doc=_note(s, "TRAILER"), ref=s.TRAILER_REF)
    name_length = _field_of(s.INDEX_NAME_LENGTH, "name_length")
    entry_scope = _Scope({f.name: ksy_id(f.name) for f in fields(s.INDEX_NAME_LENGTH)})
    schema.types["index_entry"] = {
        "doc": "One index entry: the tensor's name, then where its descriptor and data are.",
        "doc-ref": spec_link(name_length.ref),
        "seq": [schema.attribute(f, entry_scope) for f in fields(s.INDEX_NAME_LENGTH)] + [
            {"id": "name", "type": "str", "size": ksy_id(name_length.name), "encoding": "UTF-8",
             "doc": "The tensor's name, UTF-8.", "doc-ref": spec_link(name_length.ref)},
        ] + [schema.attribute(f, empty) for f in fields(s.INDEX_ENTRY_FIELDS)],
        "instances": {
            "descriptor": {"io": "_root._io", "pos": "descriptor_offset", "size": "descriptor_length",
                           "type": "hurray_descriptor", "doc": "The tensor's descriptor.",
                           "doc-ref": spec_link("file-format.md § Descriptor Placement")},
            "data": {"io": "_root._io", "pos": "data_offset", "size": "data_length", "if": "data_length != 0",
                     "doc": "The tensor's data buffers and the padding between them.",
                     "doc-ref": spec_link("file-format.md § Data Buffer Placement")},
        },
    }
    schema.types["index_section"] = _counted(schema, s.INDEX_REF, _field_of(s.INDEX_COUNT, "index_entry_count"),
                                             "index_entry", "One entry per tensor.")
    _kv_types(schema)
    schema.types["kv_section"] = _counted(schema, s.KV_REF, _field_of(s.KV_COUNT, "kv_count"), "kv_entry",
                                          "The key-value entries.")
    trailer_size = s.TRAILER_SIZE
    return {
        "meta": {**_meta("hurray_file", "Hurray tensor file", "hrry"), "imports": ["hurray_descriptor"]},
        "doc": (f"A Hurray file: the {s.FILE_HEADER_SIZE}-byte header, the tensor region (each tensor's descriptor, "
                f"then its data buffers), an optional KV metadata section, the index and the {trailer_size}-byte "
                f"trailer. The trailer gives the index, the index each tensor's descriptor and data. {GENERATED}"),
        "doc-ref": spec_link("file-format.md § Reader Protocol"),
        "seq": [{"id": "file_header", "type": header, "doc-ref": spec_link(s.HEADER_REF)}],
        "instances": {
            "trailer": {"pos": f"_io.size - {trailer_size}", "type": trailer,
                        "doc": f"The last {trailer_size} bytes.", "doc-ref": spec_link(s.TRAILER_REF)},
            "index": {"pos": "trailer.index_offset", "size": "trailer.index_length", "type": "index_section",
                      "doc": "The index: one entry per tensor.", "doc-ref": spec_link(s.INDEX_REF)},
            "kv": {"pos": "trailer.kv_offset", "size": "trailer.kv_length", "type": "kv_section",
                   "if": "trailer.kv_length != 0", "doc": "The KV metadata section, when there is one.",
                   "doc-ref": spec_link(s.KV_REF)},
        },
        "types": schema.types,
        "enums": schema.enum_specs(),
    }


def _kv_types(schema: _Schema) -> None:
    """A KV entry and its value: a fixed table per scalar tag, a length-prefixed run for
    strings and bytes, an array header then elements for arrays
    (``file-format.md § KV Value Types``)."""
    s = file_structs
    empty = _Scope({})
    tag_field = _field_of(s.KV_VALUE_TAG, "value_tag")
    tag_enum = schema.use_enum(tag_field.tags)
    cases = {}
    length = _field_of(s.KV_LENGTH_PREFIX, "length")
    for tag in s.KvTag:
        name = f"kv_{tag.name.lower()}"
        if tag in s.KV_SCALAR_VALUES:
            cases[_enum_value(tag)] = schema.table(s.KV_SCALAR_VALUES[tag], name, ref=s.KV_TYPES_REF)
        elif tag == s.KvTag.ARRAY:
            header = s.KV_ARRAY_HEADER
            element_tag = _field_of(header, "element_tag")
            schema.types[name] = {
                "doc-ref": spec_link(s.KV_TYPES_REF),
                "seq": [schema.attribute(f, empty) for f in fields(header)] + [{
                    "id": "elements", "type": f"kv_value({ksy_id(element_tag.name)})", "repeat": "expr",
                    "repeat-expr": ksy_id(_field_of(header, "element_count").name),
                    "doc": "The element payloads, each of element_tag's type.", "doc-ref": spec_link(s.KV_TYPES_REF)}],
            }
            cases[_enum_value(tag)] = name
        else:
            value = {"id": "value", "size": ksy_id(length.name)}
            if tag == s.KvTag.STRING:
                value.update({"type": "str", "encoding": "UTF-8"})
            value.update({"doc": f"The {tag.name.lower()} value.", "doc-ref": spec_link(s.KV_TYPES_REF)})
            schema.types[name] = {"doc-ref": spec_link(s.KV_TYPES_REF),
                                  "seq": [schema.attribute(length, empty), value]}
            cases[_enum_value(tag)] = name
    schema.types["kv_value"] = {
        "doc-ref": spec_link(s.KV_TYPES_REF),
        "params": [{"id": "tag", "type": _primitive(tag_field.subcon), "enum": tag_enum,
                    "doc": "The value's tag."}],
        "seq": [{"id": "payload", "type": {"switch-on": "tag", "cases": cases},
                 "doc": "The value, read as its tag says.", "doc-ref": spec_link(s.KV_TYPES_REF)}],
    }
    key_length = _field_of(s.KV_KEY_LENGTH, "key_length")
    schema.types["kv_entry"] = {
        "doc-ref": spec_link(key_length.ref),
        "seq": [schema.attribute(key_length, empty),
                {"id": "key", "type": "str", "size": ksy_id(key_length.name), "encoding": "UTF-8",
                 "doc": "The key, UTF-8.", "doc-ref": spec_link(key_length.ref)},
                schema.attribute(tag_field, empty),
                {"id": "value", "type": f"kv_value({ksy_id(tag_field.name)})", "doc": "The value.",
                 "doc-ref": spec_link(s.KV_TYPES_REF)}],
    }


# ------------------------------------------------------------------------------------
# hurray_stream.ksy
# ------------------------------------------------------------------------------------


def _peeked_descriptor() -> tuple[dict, dict]:
    """The ``descriptor`` attribute of a stream (a descriptor sized by its own
    ``descriptor_length``, peeked where the descriptor starts) and that peek."""
    header = descriptor_structs.FIXED_HEADER
    length = _field_of(header, "descriptor_length")
    attribute = {"id": "descriptor", "size": "descriptor_length", "type": "hurray_descriptor",
                 "doc": "The tensor's descriptor, descriptor_length bytes.",
                 "doc-ref": spec_link(descriptor_structs.OVERALL_REF)}
    peek = {"descriptor_length": {
        "pos": f"_io.pos + {static_offset(header, 'descriptor_length')}", "type": _primitive(length.subcon),
        "doc": "descriptor_length of the descriptor that starts here (read before the descriptor).",
        "doc-ref": spec_link(length.ref)}}
    return attribute, peek


def _stream_schema() -> dict:
    s = stream_structs
    schema = _Schema()
    empty = _Scope({})
    descriptor, peek = _peeked_descriptor()
    buffer_part = BUFFER_PART
    handle_size = _field_of(buffer_part.decl, "byte_size")
    schema.types["bare_tensor"] = {
        "doc": "One tensor of a bare stream: its descriptor, then its buffers back to back.",
        "doc-ref": spec_link("interchange.md § Scope"),
        "seq": [descriptor, {
            "id": "buffers",
            "size": f"descriptor.{buffer_part.name}.{buffer_part.attribute}[_index].{ksy_id(handle_size.name)}",
            "repeat": "expr", "repeat-expr": f"descriptor.{buffer_part.name}.{ksy_id(buffer_part.prefix_field)}",
            "doc": "The buffers, in buffer-table order, without padding.",
            "doc-ref": spec_link("interchange.md § Scope")}],
        "instances": peek,
    }
    descriptor_payload = "tensor_descriptor_payload"
    schema.types[descriptor_payload] = {
        "doc-ref": spec_link(s.DESC_REF),
        "seq": [descriptor] + [schema.attribute(f, empty) for f in fields(s.TENSOR_DESCRIPTOR_FIELDS)],
        "instances": peek,
    }
    data_payload = "tensor_data_payload"
    schema.types[data_payload] = {
        "doc-ref": spec_link(s.DATA_REF),
        "seq": [schema.attribute(f, empty) for f in fields(s.TENSOR_DATA_HEADER)] + [{
            "id": "data", "size-eos": True, "doc": "This frame's bytes.", "doc-ref": spec_link(s.DATA_REF)}],
    }
    message_type = _field_of(s.MESSAGE_HEADER, "message_type")
    length = _field_of(s.MESSAGE_HEADER, "payload_length")
    cases = {_enum_value(s.MessageType.TENSOR_DESCRIPTOR): descriptor_payload,
             _enum_value(s.MessageType.TENSOR_DATA): data_payload}
    cases.update(_session_payload_types(schema))
    schema.types["message"] = {
        "doc": "One message: its header, then payload_length bytes of payload.",
        "doc-ref": spec_link(s.FRAMING_REF),
        "seq": [schema.attribute(f, empty) for f in fields(s.MESSAGE_HEADER)] + [{
            "id": "payload", "size": ksy_id(length.name),
            "type": {"switch-on": ksy_id(message_type.name), "cases": cases},
            "doc": "The payload; raw bytes for the message types without a table here.",
            "doc-ref": spec_link(s.FRAMING_REF)}],
    }
    magic = descriptor_structs.MAGIC
    return {
        "meta": {**_meta("hurray_stream", "Hurray tensor stream", "stream"), "imports": ["hurray_descriptor"]},
        "doc": ("A Hurray stream: a bare stream (descriptor then buffers, tensor after tensor) when it starts "
                "with the descriptor magic, else a message stream (message header then payload)."),
        "doc-ref": spec_link("interchange.md § Scope"),
        "seq": [
            {"id": "tensors", "type": "bare_tensor", "repeat": "eos", "if": "is_bare",
             "doc": "The tensors of a bare stream.", "doc-ref": spec_link("interchange.md § Scope")},
            {"id": "messages", "type": "message", "repeat": "eos", "if": "not is_bare",
             "doc": "The messages of a message stream.", "doc-ref": spec_link(s.FRAMING_REF)},
        ],
        "instances": {
            "first_word": {"pos": 0, "type": "u4", "if": f"_io.size >= {len(magic)}",
                           "doc": "The first four bytes, as a number (the descriptor magic says a bare stream)."},
            "is_bare": {"value": f"_io.size >= {len(magic)} and first_word == {_hex(int.from_bytes(magic, 'little'))}",
                        "doc": "The stream starts with the descriptor magic."},
        },
        "types": schema.types,
        "enums": schema.enum_specs(),
    }


_TRAILING_DOC = ("Payload bytes after the table's fields: none in a valid message (the session.payload.length rule), "
                 "but for a PING's and its PONG's (the PONG echoes them).")


def _session_payload_types(schema: _Schema) -> dict[str, str]:
    """``message_type`` case → the type of its payload, for every session message
    (:func:`~hurray_schema.docs.session_payloads`): the table's fields, then the bytes after them."""
    trailing = {"id": "trailing", "size-eos": True, "doc": _TRAILING_DOC,
                "doc-ref": spec_link(stream_structs.FRAMING_REF)}
    cases = {}
    for kind, decl in session_payloads().items():
        first = next(iter(fields(decl)), None)
        ref = first.ref if first is not None else session_structs.TYPES_REF
        cases[_enum_value(kind)] = schema.table(decl, ref=ref, extra=(trailing,))
    return cases
