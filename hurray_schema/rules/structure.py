"""Structural descriptor rules: the ones the decoder fires itself because it cannot read
on (or must not interpret what follows).  Their checks live in
:mod:`hurray_schema.codec`; here they are declared with their level and citation.
"""

from __future__ import annotations

from .engine import Level, declare

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT

TRUNCATED = declare(
    "descriptor.truncated", MUST_NOT, "metadata.md § Fixed Header",
    "The input ends before the descriptor_length bytes the header announces (or before the 20-byte header).",
    enforced_by=("hurray_schema.codec:peek_descriptor_length", "hurray_schema.codec:_parse_general"),
)
MAGIC = declare(
    "descriptor.magic", MUST, "metadata.md § Fixed Header",
    "A descriptor starts with the four bytes \"HRRY\".",
    enforced_by=("hurray_schema.codec:peek_descriptor_length", "hurray_schema.io.walk.bare:_refuse_file"),
)
VERSION_MAJOR = declare(
    "descriptor.version_major", MUST, "metadata.md § Version Compatibility",
    "A descriptor with a newer major version than the reader's (1) is rejected.",
    enforced_by="hurray_schema.codec:_check_header",
)
VERSION_MINOR = declare(
    "descriptor.version_minor", MUST_NOT, "metadata.md § Version Compatibility",
    "Fields of a newer minor version are not interpreted; strict mode rejects the descriptor, "
    "permissive mode keeps what version 1.0 defines and carries the rest opaque.",
    permissive=True,
    enforced_by="hurray_schema.codec:_check_header",
)
LENGTH_MINIMUM = declare(
    "descriptor.length.minimum", MUST, "metadata.md § Fixed Header",
    "descriptor_length is at least 20, the fixed header's size.",
    enforced_by="hurray_schema.codec:peek_descriptor_length",
)
LENGTH_BOUNDS = declare(
    "descriptor.length.bounds", MUST_NOT, "metadata.md § Fixed Header",
    "No field is read beyond descriptor_length: every field the header and flags announce fits inside it.",
    enforced_by=(
        "hurray_schema.codec:_Reader.read",
        "hurray_schema.codec:_Reader.take",
        "hurray_schema.codec:_Decoder.table",
        "hurray_schema.codec:_Decoder.entries",
        "hurray_schema.codec:_Decoder.sized",
    ),
)
LENGTH_EXACT = declare(
    "descriptor.length.exact", MUST, "metadata.md § Fixed Header",
    "descriptor_length is the total length: no unexplained bytes follow the last section of a 1.0 descriptor.",
    enforced_by="hurray_schema.codec:_Decoder.trailing",
)
FLAGS_RESERVED = declare(
    "descriptor.flags.reserved", MUST, "metadata.md § Flags",
    "Flag bits 5-31 are zero.",
    enforced_by="hurray_schema.codec:_check_header",
)
RANK_CAP = declare(
    "descriptor.rank.cap", MUST, "data-model.md § Rank",
    "rank is at most 64.",
    enforced_by="hurray_schema.codec:_check_header",
)
TYPE_TAG_INVALID = declare(
    "descriptor.type_tag.invalid", MUST, "element-types.md § Type Identifier Encoding",
    "type_tag 0x00 and 0xFF are invalid.",
    enforced_by="hurray_schema.codec:_check_type_tag",
)
TYPE_TAG_UNKNOWN = declare(
    "descriptor.type_tag.unknown", MUST, "element-types.md § Type Identifier Encoding",
    "An unassigned type_tag is rejected, unless a permissive reader keeps it without reading the data.",
    permissive=True,
    enforced_by="hurray_schema.codec:_check_type_tag",
)
LAYOUT_TAG_INVALID = declare(
    "descriptor.layout_tag.invalid", MUST, "memory-layout.md § Layout Taxonomy",
    "layout_tag 0x00 and 0xFF are invalid.",
    enforced_by="hurray_schema.codec:_check_header",
)
LAYOUT_TAG_UNKNOWN = declare(
    "descriptor.layout_tag.unknown", MUST, "memory-layout.md § Layout Taxonomy",
    "An unassigned layout_tag is rejected, unless a permissive reader keeps it without reading the data.",
    permissive=True,
    enforced_by="hurray_schema.codec:_Decoder.unknown",
)
EXTENSION_LAYOUT_UNKNOWN = declare(
    "descriptor.layout.extension_unknown", MUST, "metadata.md § Extension Layouts (0xF0–0xFE)",
    "A private layout whose extension_layout_id the reader does not know is rejected, unless permissive.",
    permissive=True,
    enforced_by="hurray_schema.codec:_Decoder.private",
)
TILED_DEPTH = declare(
    "descriptor.tiled.depth", MUST, "layouts/tiled.md § Recursive Tiling",
    "Nested tiling deeper than the reader's limit (8 levels) is rejected.",
    enforced_by="hurray_schema.codec:_Decoder.level",
)
SCHEME_TAG_INVALID = declare(
    "quantization.scheme_tag.invalid", MUST, "quantization.md § Scheme Tag Space",
    "scheme_tag 0x00 and 0xFF are invalid.",
    enforced_by="hurray_schema.codec:_Decoder.chosen_tag",
)
SCHEME_TAG_UNKNOWN = declare(
    "quantization.scheme_tag.unknown", MUST, "quantization.md § Descriptor Header",
    "An unknown scheme_tag is rejected, unless a permissive reader skips it by quantization_length.",
    permissive=True,
    enforced_by="hurray_schema.codec:_Decoder.unknown_sized",
)
SCHEME_VERSION = declare(
    "quantization.scheme_version", MUST, "quantization.md § Descriptor Header",
    "A scheme_version newer than the spec defines for that scheme is rejected.",
    enforced_by="hurray_schema.codec:_Decoder._check_scheme_version",
)
QUANTIZATION_LENGTH = declare(
    "quantization.length.bounds", MUST_NOT, "quantization.md § Descriptor Header",
    "The scheme's fields fit inside quantization_length; nothing is read beyond it.",
    enforced_by=("hurray_schema.codec:_Decoder.chosen_tag", "hurray_schema.codec:_Decoder._scheme_table"),
)
