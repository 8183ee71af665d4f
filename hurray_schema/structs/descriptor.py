"""Tensor descriptor core: fixed header, shape, byte_offset, buffer table.

Spec: ``metadata.md § Fixed Header``, ``§ Core Variable Fields``, ``§ Buffer Table``;
the 16-byte buffer handle as refined by ``buffer-protocol.md § Buffer Handle``
(``sync_mode`` and ``memory_class`` occupy what ``metadata.md`` still shows as reserved).

How a whole descriptor is put together (``metadata.md § Overall Descriptor Structure``)
is :data:`DESCRIPTOR_PARTS`: every part in wire order with its declaration, the flag
that gates it, the :class:`~hurray_schema.model.TensorDescriptor` attribute it fills and
the value class it decodes to.  :mod:`hurray_schema.structs.walker` is the one walk of that
table: the decoder, the encoder, the annotated view, the documentation and the Kaitai schema
are its visitors; the compiled fast path is generated from the same parts.  The optional sections are declared in
:mod:`hurray_schema.structs.sections` and :mod:`hurray_schema.structs.quantization`, the
layout-specific fields in :mod:`hurray_schema.structs.layouts`.
"""

from __future__ import annotations

from typing import Mapping, Optional

import attrs
from construct import Array, Bytes, Const, Int8ul, Int32ul, Int64ul, Struct, this

from . import layouts, quantization, sections
from ._declare import Valid, field, plan, reserved
from .tags import DescriptorFlag, DeviceTag, ElementType, LayoutTag, MemoryClass, SyncMode

MAGIC = b"HRRY"
SUPPORTED_VERSION_MAJOR = 1
SUPPORTED_VERSION_MINOR = 0
MAX_RANK = 64
"""Normative rank cap (``data-model.md § Rank``, ADR-008)."""
MIN_BUFFER_ALIGNMENT = 64
"""Least alignment of a non-empty buffer (``buffer-protocol.md § Buffer Handle``; ADR-007 § 4 frees an
empty one)."""

OVERALL_REF = "metadata.md § Overall Descriptor Structure"
HEADER = "metadata.md § Fixed Header"
CORE = "metadata.md § Core Variable Fields"
BUFFER_TABLE_REF = "metadata.md § Buffer Table"
HANDLE_REF = "buffer-protocol.md § Buffer Handle"

FIXED_HEADER = Struct(
    field("magic", Const(MAGIC, Bytes(4)), "ASCII \"HRRY\" identifying a Hurray descriptor.", HEADER),
    field("version_major", Int8ul, "Major format version; a reader rejects a newer one.", HEADER),
    field("version_minor", Int8ul, "Minor format version; newer minors only add.", HEADER),
    field("descriptor_length", Int32ul, "Whole descriptor length in bytes, header included.", HEADER,
          valid=Valid(size_of="the whole descriptor")),
    field("flags", Int32ul, "Which optional sections follow (bits 0-4); bits 5-31 reserved.", "metadata.md § Flags",
          tags=DescriptorFlag),
    field("type_tag", Int8ul, "Element type tag.", "element-types.md § Type Identifier Encoding",
          tags=ElementType),
    field("layout_tag", Int8ul, "Memory layout tag.", "memory-layout.md § Layout Taxonomy", tags=LayoutTag),
    field("rank", Int32ul, "Number of dimensions; 0 is a scalar, at most 64.", HEADER, bounds=(0, MAX_RANK)),
)
"""The 20 bytes every descriptor starts with."""

SHAPE = Struct(
    field(
        "shape", Array(this.rank, Int64ul),
        "Size of each dimension, dimension 0 first; 0 is an empty dimension, "
        "0xFFFFFFFFFFFFFFFF the dynamic-dimension sentinel.", "metadata.md § shape",
    ),
)

BYTE_OFFSET = Struct(
    field(
        "byte_offset", Int64ul,
        "Bytes from the start of buffer 0 to element [0, ..., 0]; 0 for sparse, indirect "
        "and composite layouts.", "metadata.md § byte_offset",
    ),
)

BUFFER_COUNT = Struct(
    field(
        "buffer_count", Int8ul,
        "Number of buffer handles that follow; 0 only for a composite head.", BUFFER_TABLE_REF,
        valid=Valid(count_of="buffer handles"),
    ),
)

BUFFER_HANDLE = Struct(
    field("byte_size", Int64ul, "Buffer size in bytes; 0 for an empty buffer.", HANDLE_REF),
    field("alignment", Int32ul, f"Guaranteed base alignment, a power of two, >= {MIN_BUFFER_ALIGNMENT} unless empty.",
          HANDLE_REF, valid=Valid(power_of_two=True)),
    field("device_tag", Int8ul, "Device holding the buffer.", "buffer-protocol.md § Device Tags", tags=DeviceTag),
    field("sync_mode", Int8ul, "How the producer synchronised before hand-off.",
          "buffer-protocol.md § Stream and Event Synchronisation", tags=SyncMode),
    field("memory_class", Int8ul, "Memory access class.", "buffer-protocol.md § Memory Class", tags=MemoryClass),
    reserved("_reserved", Int8ul, HANDLE_REF),
)
"""One 16-byte entry of the buffer table."""


@attrs.frozen(slots=True, eq=False)
class DescriptorPart:
    """One part of a descriptor as :data:`DESCRIPTOR_PARTS` lists it.

    A part is read with ``decl`` (repeated ``prefix``'s count times when it has a
    ``prefix``), or with the table ``tables[tag]`` that the value of field ``chosen_by``
    selects (tags in the private range read ``private`` when it is set, and are opaque
    otherwise).  It is present when ``flag`` is set in the header's ``flags`` (always
    when ``flag`` is ``None``), fills the descriptor attribute ``attribute`` and is decoded
    into ``value_class``, the name of a class of :mod:`hurray_schema.model` (a name, as the
    declarations sit below the model; the model resolves every one at import).  A part
    without a value class gives its attribute the value of the table's field of that name.
    """

    name: str
    decl: Optional[Struct]
    attribute: Optional[str]
    value_class: Optional[str]
    ref: str
    flag: Optional[DescriptorFlag] = None
    prefix: Optional[Struct] = None
    """A table read before the part's entries: the count of a repeated part, a length."""
    chosen_by: Optional[str] = None
    tables: Optional[Mapping[int, Optional[Struct]]] = None
    private: Optional[Struct] = None
    head: Optional[Struct] = None
    """The fields every table of ``tables`` starts with, ``chosen_by`` among them, where the
    tag is read inside the part (the quantization header)."""

    @property
    def prefix_field(self) -> Optional[str]:
        """Name of the one field of ``prefix`` (``buffer_count``, ``quantization_length``)."""
        if self.prefix is None:
            return None
        (name,) = [sub.name for sub in self.prefix.subcons]
        return name

    @property
    def label(self) -> str:
        """The part as decoder messages name it (``"composite member section"``)."""
        return self.name.replace("_", " ") + (" section" if self.flag is not None else "")

    @property
    def is_section(self) -> bool:
        """A flag-gated part read with one fixed declaration (the optional sections after
        the buffer table, quantization excepted)."""
        return self.flag is not None and self.decl is not None and self.tables is None


DESCRIPTOR_PARTS: tuple[DescriptorPart, ...] = (
    DescriptorPart("fixed_header", FIXED_HEADER, None, None, HEADER),
    DescriptorPart("shape", SHAPE, "shape", None, CORE),
    DescriptorPart("byte_offset", BYTE_OFFSET, "byte_offset", None, CORE),
    DescriptorPart("layout", None, "layout", "Layout", "metadata.md § Layout-Specific Fields",
                   chosen_by="layout_tag", tables=layouts.LAYOUT_FIELDS, private=layouts.EXTENSION),
    DescriptorPart("buffer_table", BUFFER_HANDLE, "buffers", "BufferHandle", BUFFER_TABLE_REF, prefix=BUFFER_COUNT),
    DescriptorPart("quantization", None, "quantization", "Quantization", quantization.SECTION_REF,
                   flag=DescriptorFlag.HAS_QUANTIZATION, prefix=quantization.QUANTIZATION_LENGTH,
                   chosen_by="scheme_tag", tables=quantization.SCHEMES, head=quantization.QUANTIZATION_HEADER),
    DescriptorPart("shard", sections.SHARD_SECTION, "shard", "Shard", sections.SHARD_REF,
                   flag=DescriptorFlag.HAS_SHARD),
    DescriptorPart("statistics", sections.STATISTICS_SECTION, "statistics", "Statistics", sections.STATS_REF,
                   flag=DescriptorFlag.HAS_STATISTICS),
    DescriptorPart("extension_type", sections.EXTENSION_TYPE_SECTION, "extension_type", "ExtensionType",
                   sections.EXT_REF, flag=DescriptorFlag.HAS_EXTENSION_TYPE),
    DescriptorPart("composite_member", sections.COMPOSITE_MEMBER_SECTION, "composite_member", "CompositeMember",
                   sections.MEMBER_REF, flag=DescriptorFlag.HAS_COMPOSITE_MEMBER),
)
"""Every part of a descriptor in wire order (``metadata.md § Overall Descriptor Structure``;
the section order after the buffer table is the spec's, not the order of the flag bits)."""

FIXED_HEADER_SIZE = plan(FIXED_HEADER).fixed_size
BUFFER_HANDLE_SIZE = plan(BUFFER_HANDLE).fixed_size

