"""Tensor descriptor core: fixed header, shape, byte_offset, buffer table.

Spec: ``metadata.md § Fixed Header``, ``§ Core Variable Fields``, ``§ Buffer Table``;
the 16-byte buffer handle as refined by ``buffer-protocol.md § Buffer Handle``
(``sync_mode`` and ``memory_class`` occupy what ``metadata.md`` still shows as reserved).

The overall order of a descriptor (``metadata.md § Overall Descriptor Structure``) is
:data:`DESCRIPTOR_ORDER`; the optional sections are declared in
:mod:`hurray_schema.structs.sections` and :mod:`hurray_schema.structs.quantization`,
the layout-specific fields in :mod:`hurray_schema.structs.layouts`.
"""

from __future__ import annotations

from construct import Array, Bytes, Const, Int8ul, Int32ul, Int64ul, Struct, this

from ._declare import field, plan

MAGIC = b"HRRY"
SUPPORTED_VERSION_MAJOR = 1
SUPPORTED_VERSION_MINOR = 0
MAX_RANK = 64
"""Normative rank cap (``data-model.md § Rank``, ADR-008)."""

HEADER = "metadata.md § Fixed Header"
CORE = "metadata.md § Core Variable Fields"
BUFFER_TABLE_REF = "metadata.md § Buffer Table"
HANDLE_REF = "buffer-protocol.md § Buffer Handle"

FIXED_HEADER = Struct(
    field("magic", Const(MAGIC, Bytes(4)), "ASCII \"HRRY\" identifying a Hurray descriptor.", HEADER),
    field("version_major", Int8ul, "Major format version; a reader rejects a newer one.", HEADER),
    field("version_minor", Int8ul, "Minor format version; newer minors only add.", HEADER),
    field("descriptor_length", Int32ul, "Whole descriptor length in bytes, header included.", HEADER),
    field("flags", Int32ul, "Which optional sections follow (bits 0-4); bits 5-31 reserved.", "metadata.md § Flags"),
    field("type_tag", Int8ul, "Element type tag.", "element-types.md § Type Identifier Encoding"),
    field("layout_tag", Int8ul, "Memory layout tag.", "memory-layout.md § Layout Taxonomy"),
    field("rank", Int32ul, "Number of dimensions; 0 is a scalar, at most 64.", HEADER),
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
    ),
)

BUFFER_HANDLE = Struct(
    field("byte_size", Int64ul, "Buffer size in bytes; 0 for an empty buffer.", HANDLE_REF),
    field("alignment", Int32ul, "Guaranteed base alignment, a power of two, >= 64 unless empty.", HANDLE_REF),
    field("device_tag", Int8ul, "Device holding the buffer.", "buffer-protocol.md § Device Tags"),
    field("sync_mode", Int8ul, "How the producer synchronised before hand-off.", "buffer-protocol.md § Stream and Event Synchronisation"),
    field("memory_class", Int8ul, "Memory access class.", "buffer-protocol.md § Memory Class"),
    field("_reserved", Int8ul, "Must be 0x00.", HANDLE_REF),
)
"""One 16-byte entry of the buffer table."""

DESCRIPTOR_ORDER = (
    ("fixed_header", FIXED_HEADER),
    ("shape", SHAPE),
    ("byte_offset", BYTE_OFFSET),
    ("layout", None),  # layout-specific fields: structs.layouts
    ("buffer_table", None),  # BUFFER_COUNT then buffer_count x BUFFER_HANDLE
    ("quantization", None),  # structs.quantization.QUANTIZATION_SECTION, flag bit 0
    ("shard", None),  # structs.sections.SHARD_SECTION, flag bit 1
    ("statistics", None),  # structs.sections.STATISTICS_SECTION, flag bit 3
    ("extension_type", None),  # structs.sections.EXTENSION_TYPE_SECTION, flag bit 2
    ("composite_member", None),  # structs.sections.COMPOSITE_MEMBER_SECTION, flag bit 4
)
"""Wire order of a descriptor's parts (``metadata.md § Overall Descriptor Structure``)."""

FIXED_HEADER_SIZE = plan(FIXED_HEADER).fixed_size
BUFFER_HANDLE_SIZE = plan(BUFFER_HANDLE).fixed_size

