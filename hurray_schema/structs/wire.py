"""Value objects → wire bytes, part by part, through the declarations' fast plans.

:func:`encode_parts` yields each part of a descriptor in the wire order of
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` with its bytes; the encoder,
``descriptor_length`` and the byte span of every part (used to locate a finding) all
come from it, so they cannot disagree.

The value objects are read by their attrs field names, which are the spec's field
names; this module does not import :mod:`hurray_schema.model` (the model imports it).
A layout or quantization scheme is encoded by its tag, the way the decoder chose its
class: a tag with a declared table, a private layout tag (extension layout fields), or
an unknown tag whose bytes the value object keeps opaque.
"""

from __future__ import annotations

from typing import Iterator, Optional

import attrs

from ._declare import plan, select, static_offset
from .descriptor import CORE_PARTS, FIXED_HEADER, MAGIC, PARTS
from .layouts import NESTED_BY, is_extension_layout
from .quantization import QUANTIZATION_HEADER

__all__ = ["encode_parts", "descriptor_spans", "encoded_length", "values_of", "encode_descriptor_bytes"]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def values_of(obj) -> dict:
    """The wire field values of a value object: attrs field names are the spec names."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return {name: getattr(obj, name) for name in names}


_LAYOUT = PARTS["layout"]
_BUFFER_TABLE = PARTS["buffer_table"]
_QUANTIZATION = PARTS["quantization"]
_OPTIONAL_PARTS = tuple(part for part in PARTS.values() if part.flag is not None)
"""Quantization and the sections, in wire order."""


def _layout_bytes(layout, rank: int) -> Optional[bytes]:
    """The layout-specific fields of ``layout``; ``None`` for a layout tag this encoder
    does not know, whose value object keeps the rest of the descriptor as ``payload``."""
    tag = layout.tag
    tables = _LAYOUT.tables
    if tag in NESTED_BY:
        return _nested_bytes(layout, tables[tag], rank)
    if tag in tables:  # IntEnum keys: a plain int finds them
        decl = tables[tag]
        return b"" if decl is None else plan(decl).pack(**values_of(layout))
    if is_extension_layout(tag):
        data = layout.extension_data
        return plan(_LAYOUT.private).pack(
            extension_layout_id=layout.extension_layout_id, extension_data_length=len(data), extension_data=data,
        )
    return None


def _nested_bytes(layout, decl, rank: int) -> bytes:
    """A layout whose table repeats (:data:`~.layouts.NESTED_BY`): one table per level, the value
    object's ``inner`` holding the next (``layouts/tiled.md § Recursive Tiling``)."""
    parts = []
    level = layout
    table = plan(decl)
    while level is not None:
        parts.append(table.pack(rank=rank, **values_of(level)))
        level = level.inner
    return b"".join(parts)


_QUANTIZATION_HEADER = plan(QUANTIZATION_HEADER)


def _quantization_bytes(q) -> bytes:
    decl = _QUANTIZATION.tables.get(q.scheme)
    if decl is None:  # an unknown scheme: its header fields, then the payload kept opaque
        body = _QUANTIZATION_HEADER.pack(scheme_tag=q.scheme_tag, scheme_version=q.scheme_version, flags=q.flags)
        body += q.payload
    else:
        values = values_of(q)
        values["scheme_tag"] = q.scheme
        body = plan(decl).pack(**values) + q.padding
    return _QUANTIZATION_LENGTH.pack(quantization_length=len(body)) + body


_QUANTIZATION_LENGTH = plan(_QUANTIZATION.prefix)
_P_HEADER = plan(FIXED_HEADER)
_P_BUFFER_COUNT, _P_HANDLE = plan(_BUFFER_TABLE.prefix), plan(_BUFFER_TABLE.decl)
_CORE = tuple((part.name, part.attribute, plan(part.decl)) for part in CORE_PARTS)


def _section_bytes(part, obj) -> bytes:
    if part is _QUANTIZATION:
        return _quantization_bytes(obj)
    return plan(part.decl).pack(**values_of(obj))


def encode_parts(desc, descriptor_length: int = 0) -> Iterator[tuple[str, bytes]]:
    """Each part of ``desc`` (a :class:`~hurray_schema.model.TensorDescriptor`) with its
    bytes; the header carries ``descriptor_length``."""
    rank = desc.rank
    yield "fixed_header", _P_HEADER.pack(
        magic=MAGIC, version_major=desc.version_major, version_minor=desc.version_minor,
        descriptor_length=descriptor_length, flags=desc.flags, type_tag=desc.type_tag,
        layout_tag=desc.layout.tag, rank=rank,
    )
    for name, attribute, codec in _CORE:
        yield name, codec.pack(**{attribute: getattr(desc, attribute)})
    layout = _layout_bytes(desc.layout, rank)
    if layout is None:
        yield _LAYOUT.name, desc.layout.payload
        return  # everything after the layout fields is inside the opaque payload
    yield _LAYOUT.name, layout
    handle = _P_HANDLE
    yield _BUFFER_TABLE.name, _P_BUFFER_COUNT.pack(buffer_count=len(desc.buffers)) + b"".join(
        [handle.pack(**values_of(b)) for b in desc.buffers]
    )
    for part in _OPTIONAL_PARTS:
        obj = getattr(desc, part.attribute)
        if obj is not None:
            yield part.name, _section_bytes(part, obj)
    if desc.trailing:
        yield "trailing", desc.trailing


def descriptor_spans(desc) -> list[tuple[str, int, int]]:
    """``(part, start, end)`` byte spans of every part of the encoded descriptor."""
    spans, start = [], 0
    for name, data in encode_parts(desc):
        spans.append((name, start, start + len(data)))
        start += len(data)
    return spans


def encoded_length(desc) -> int:
    return sum(len(data) for _, data in encode_parts(desc))


_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")
_LENGTH_CODEC = plan(select(FIXED_HEADER, "descriptor_length"))


def encode_descriptor_bytes(desc) -> bytes:
    """The descriptor's wire bytes, ``descriptor_length`` filled in."""
    parts = [data for _, data in encode_parts(desc)]
    total = sum(len(p) for p in parts)
    header = parts[0]
    parts[0] = header[:_LENGTH_AT] + _LENGTH_CODEC.pack(descriptor_length=total) + header[_LENGTH_AT + _LENGTH_CODEC.fixed_size :]
    return b"".join(parts)
