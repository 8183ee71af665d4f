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

import contextlib
from typing import Iterator

import attrs

from ..memo import MEMO
from ._declare import plan, select, static_offset
from .descriptor import FIXED_HEADER, MAGIC
from .walker import HEADER_PART, LAYOUT_PART, NOTHING as _NOTHING, DescriptorVisitor
from .walker import walk_descriptor as walk_parts

__all__ = ["encode_parts", "descriptor_spans", "encoded_length", "values_of", "encode_descriptor_bytes"]


_FIELD_NAMES = MEMO.field_names


def values_of(obj) -> dict:
    """The wire field values of a value object: attrs field names are the spec names."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return {name: getattr(obj, name) for name in names}


class _Encoder(DescriptorVisitor):
    """The encoder as a visitor of the walk: each table's values are taken from the
    descriptor's value objects and packed with the table's fast plan; counts and lengths
    are those of what follows (construct's ``Rebuild``), the tags those of the objects."""

    def __init__(self, desc, descriptor_length: int):
        self.desc = desc
        self.descriptor_length = descriptor_length
        self.parts: list[tuple[str, list]] = []
        self.current = None

    def _open(self, name: str) -> None:
        self.parts.append((name, []))

    def _put(self, data: bytes) -> None:
        self.parts[-1][1].append(data)

    def part(self, part, choice=None):
        if part.head is None:  # a sized part's chosen table is inside the part sized() opened
            self._open(part.name)
        return _NOTHING

    def table(self, part, decl, context: dict) -> dict:
        values = self._values(part, decl)
        self._put(plan(decl).pack(**context, **values))
        return values

    def _values(self, part, decl) -> dict:
        desc = self.desc
        if part is HEADER_PART:
            return dict(magic=MAGIC, version_major=desc.version_major, version_minor=desc.version_minor,
                        descriptor_length=self.descriptor_length, flags=desc.flags, type_tag=desc.type_tag,
                        layout_tag=desc.layout.tag, rank=desc.rank)
        if decl is part.prefix:
            return {part.prefix_field: len(getattr(desc, part.attribute))}
        if part.value_class is None:
            return {part.attribute: getattr(desc, part.attribute)}
        if part is LAYOUT_PART:
            return values_of(self.current if self.current is not None else desc.layout)
        obj = getattr(desc, part.attribute)
        values = values_of(obj)
        if part.head is not None:  # the tag of a sized part's table is its value object's kind
            values[part.chosen_by] = obj.scheme
        return values

    def entries(self, part, count: int, context: dict) -> None:
        handle = plan(part.decl)
        self._put(b"".join([handle.pack(**values_of(b)) for b in getattr(self.desc, part.attribute)]))

    def level(self, part, choice, depth: int):
        self.current = self.desc.layout if depth == 1 else self.current.inner
        return _NOTHING

    def deeper(self, part, choice, depth: int) -> bool:
        return self.current.inner is not None

    def private(self, part, choice, context: dict) -> None:
        layout = self.desc.layout
        data = layout.extension_data
        self._put(plan(choice.decl).pack(extension_layout_id=layout.extension_layout_id,
                                         extension_data_length=len(data), extension_data=data))

    def unknown(self, part, tag: int) -> None:
        """A tag this encoder does not know: the value object keeps the rest of the descriptor."""
        self._open(part.name)
        self._put(getattr(self.desc, part.attribute).payload)

    @contextlib.contextmanager
    def sized(self, part, context: dict):
        self._open(part.name)
        body = self.parts[-1][1]
        yield
        data = b"".join(body)
        body[:] = [plan(part.prefix).pack(**{part.prefix_field: len(data)}), data]

    def chosen_tag(self, part) -> int:
        return getattr(self.desc, part.attribute).scheme

    def unknown_sized(self, part, tag: int, context: dict) -> None:
        """An unknown scheme: its header fields, then the payload kept opaque."""
        obj = getattr(self.desc, part.attribute)
        self._put(plan(part.head).pack(**values_of(obj)))
        self._put(obj.payload)

    def padding(self, part) -> None:
        obj = getattr(self.desc, part.attribute)
        if part.tables.get(obj.scheme) is not None:
            self._put(obj.padding)

    def trailing(self) -> None:
        if self.desc.trailing:
            self._open("trailing")
            self._put(self.desc.trailing)


def encode_parts(desc, descriptor_length: int = 0) -> Iterator[tuple[str, bytes]]:
    """Each part of ``desc`` (a :class:`~hurray_schema.model.TensorDescriptor`) with its
    bytes, as the walk of the parts visits them; the header carries ``descriptor_length``."""
    encoder = _Encoder(desc, descriptor_length)
    walk_parts(encoder)
    for name, chunks in encoder.parts:
        yield name, b"".join(chunks)


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
