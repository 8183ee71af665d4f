"""Value objects → wire bytes, part by part, through the declarations' fast plans.

:func:`encode_parts` yields each part of a descriptor in wire order
(:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_ORDER`) with its bytes; the
encoder, ``descriptor_length`` and the byte span of every part (used to locate a
finding) all come from it, so they cannot disagree.
"""

from __future__ import annotations

from typing import Iterator

import attrs

from ..model import (
    ExtensionLayout, TensorDescriptor, TiledLayout, UnknownLayout, UnknownQuantization,
)
from . import layouts, quantization, sections
from ._declare import plan, select, static_offset
from .descriptor import BUFFER_COUNT, BUFFER_HANDLE, BYTE_OFFSET, FIXED_HEADER, MAGIC, SHAPE

__all__ = ["encode_parts", "descriptor_spans", "encoded_length", "values_of", "encode_descriptor_bytes"]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def values_of(obj) -> dict:
    """The wire field values of a value object: attrs field names are the spec names."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return {name: getattr(obj, name) for name in names}


def _layout_bytes(layout, rank: int) -> bytes:
    if isinstance(layout, UnknownLayout):
        return layout.payload
    if isinstance(layout, ExtensionLayout):
        data = layout.extension_data
        return plan(layouts.EXTENSION).pack(
            extension_layout_id=layout.extension_layout_id, extension_data_length=len(data), extension_data=data,
        )
    if isinstance(layout, TiledLayout):
        return _tiled_bytes(layout, rank)
    decl = layouts.LAYOUT_FIELDS[layout.tag]  # IntEnum keys: a plain int finds them
    if decl is None:
        return b""
    return plan(decl).pack(**values_of(layout))


def _tiled_bytes(layout: TiledLayout, rank: int) -> bytes:
    parts = []
    level = layout
    while level is not None:
        parts.append(plan(layouts.TILED).pack(rank=rank, **values_of(level)))
        level = level.inner
    return b"".join(parts)


def _quantization_bytes(q) -> bytes:
    if isinstance(q, UnknownQuantization):
        body = plan(quantization.QUANTIZATION_HEADER).pack(
            scheme_tag=q.scheme_tag, scheme_version=q.scheme_version, flags=q.flags,
        ) + q.payload
    else:
        values = values_of(q)
        values["scheme_tag"] = q.scheme
        body = plan(quantization.SCHEMES[q.scheme]).pack(**values) + q.padding
    return plan(quantization.QUANTIZATION_LENGTH).pack(quantization_length=len(body)) + body


_P_HEADER, _P_SHAPE, _P_BYTE_OFFSET = plan(FIXED_HEADER), plan(SHAPE), plan(BYTE_OFFSET)
_P_BUFFER_COUNT, _P_HANDLE = plan(BUFFER_COUNT), plan(BUFFER_HANDLE)
_P_SHARD, _P_STATISTICS = plan(sections.SHARD_SECTION), plan(sections.STATISTICS_SECTION)
_P_EXTENSION_TYPE, _P_MEMBER = plan(sections.EXTENSION_TYPE_SECTION), plan(sections.COMPOSITE_MEMBER_SECTION)


def encode_parts(desc: TensorDescriptor, descriptor_length: int = 0) -> Iterator[tuple[str, bytes]]:
    """Each part of ``desc`` with its bytes; the header carries ``descriptor_length``."""
    rank = desc.rank
    yield "fixed_header", _P_HEADER.pack(
        magic=MAGIC, version_major=desc.version_major, version_minor=desc.version_minor,
        descriptor_length=descriptor_length, flags=desc.flags, type_tag=desc.type_tag,
        layout_tag=desc.layout.tag, rank=rank,
    )
    yield "shape", _P_SHAPE.pack(shape=desc.shape)
    yield "byte_offset", _P_BYTE_OFFSET.pack(byte_offset=desc.byte_offset)
    yield "layout", _layout_bytes(desc.layout, rank)
    if isinstance(desc.layout, UnknownLayout):
        return  # everything after the layout fields is inside the opaque payload
    handle = _P_HANDLE
    yield "buffer_table", _P_BUFFER_COUNT.pack(buffer_count=len(desc.buffers)) + b"".join(
        [handle.pack(**values_of(b)) for b in desc.buffers]
    )
    if desc.quantization is not None:
        yield "quantization", _quantization_bytes(desc.quantization)
    if desc.shard is not None:
        yield "shard", _P_SHARD.pack(**values_of(desc.shard))
    if desc.statistics is not None:
        yield "statistics", _P_STATISTICS.pack(**values_of(desc.statistics))
    if desc.extension_type is not None:
        yield "extension_type", _P_EXTENSION_TYPE.pack(**values_of(desc.extension_type))
    if desc.composite_member is not None:
        yield "composite_member", _P_MEMBER.pack(**values_of(desc.composite_member))
    if desc.trailing:
        yield "trailing", desc.trailing


def descriptor_spans(desc: TensorDescriptor) -> list[tuple[str, int, int]]:
    """``(part, start, end)`` byte spans of every part of the encoded descriptor."""
    spans, start = [], 0
    for name, data in encode_parts(desc):
        spans.append((name, start, start + len(data)))
        start += len(data)
    return spans


def encoded_length(desc: TensorDescriptor) -> int:
    return sum(len(data) for _, data in encode_parts(desc))


_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")
_LENGTH_CODEC = plan(select(FIXED_HEADER, "descriptor_length"))


def encode_descriptor_bytes(desc: TensorDescriptor) -> bytes:
    """The descriptor's wire bytes, ``descriptor_length`` filled in."""
    parts = [data for _, data in encode_parts(desc)]
    total = sum(len(p) for p in parts)
    header = parts[0]
    parts[0] = header[:_LENGTH_AT] + _LENGTH_CODEC.pack(descriptor_length=total) + header[_LENGTH_AT + _LENGTH_CODEC.fixed_size :]
    return b"".join(parts)
