"""Wire tables of the Hurray file container (``file-format.md``).

A ``.hrry`` file is: the 64-byte :data:`FILE_HEADER`, the tensor region (descriptor,
padding, data buffers, repeated), an optional KV metadata section, the index and the
40-byte :data:`TRAILER`.  Variable-length records (KV entries, index entries) are
declared as their fixed-size pieces; the reader and writer in
:mod:`hurray_schema.io.file` walk them with the plans derived from these declarations.
"""

from __future__ import annotations

import enum

from construct import Bytes, Const, Float64l, Int8ul, Int16ul, Int32ul, Int64sl, Int64ul, Struct

from ._declare import Valid, field, plan, reserved

__all__ = [
    "FILE_MAGIC", "TRAILER_MAGIC", "FileFlag", "KNOWN_FILE_FLAGS", "KvTag", "FILE_HEADER", "FILE_HEADER_SIZE",
    "TRAILER", "TRAILER_SIZE", "KV_COUNT", "KV_KEY_LENGTH", "KV_VALUE_TAG", "KV_LENGTH_PREFIX", "KV_INT64",
    "KV_UINT64", "KV_FLOAT64", "KV_BOOL", "KV_ARRAY_HEADER", "KV_SCALAR_VALUES", "INDEX_COUNT",
    "INDEX_NAME_LENGTH", "INDEX_ENTRY_FIELDS", "DESCRIPTOR_ALIGNMENT", "SECTION_ALIGNMENT",
    "MIN_DATA_BUFFER_ALIGNMENT", "MAX_DATA_BUFFER_ALIGNMENT", "UNKNOWN_TENSOR_COUNT",
    "SUPPORTED_CONTAINER_MAJOR", "SUPPORTED_CONTAINER_MINOR",
]

FILE_MAGIC = b"HRRYFILE"
TRAILER_MAGIC = b"HRRY"
SUPPORTED_CONTAINER_MAJOR = 1
SUPPORTED_CONTAINER_MINOR = 0
UNKNOWN_TENSOR_COUNT = 0xFFFF_FFFF_FFFF_FFFF
"""``tensor_count_hint`` of a writer that does not know the count upfront."""

DESCRIPTOR_ALIGNMENT = 8
"""Every descriptor starts on a multiple of 8 (``file-format.md § Descriptor Placement``)."""
SECTION_ALIGNMENT = 8
"""KV and index sections start on a multiple of 8 (``file-format.md § Alignment and Padding Summary``)."""
MIN_DATA_BUFFER_ALIGNMENT = 4096
MAX_DATA_BUFFER_ALIGNMENT = 2 * 1024 * 1024
"""Bounds of ``data_buffer_alignment`` (``file-format.md § File Header``)."""

HEADER_REF = "file-format.md § File Header"
FLAGS_REF = "file-format.md § File Flags"
TRAILER_REF = "file-format.md § Trailer"
KV_REF = "file-format.md § KV Metadata Section"
KV_TYPES_REF = "file-format.md § KV Value Types"
INDEX_REF = "file-format.md § Index Section"


class FileFlag(enum.IntFlag):
    """``file_flags`` bits (``file-format.md § File Flags``)."""

    HAS_KV_METADATA = 1 << 0
    SORTED_INDEX = 1 << 1
    HAS_INDEX_CRC32C = 1 << 2


KNOWN_FILE_FLAGS = int(FileFlag.HAS_KV_METADATA | FileFlag.SORTED_INDEX | FileFlag.HAS_INDEX_CRC32C)


class KvTag(enum.IntEnum):
    """KV ``value_tag`` values (``file-format.md § KV Value Types``)."""

    STRING = 0x01
    INT64 = 0x02
    UINT64 = 0x03
    FLOAT64 = 0x04
    BOOL = 0x05
    BYTES = 0x06
    ARRAY = 0x07


FILE_HEADER = Struct(
    field("magic", Const(FILE_MAGIC, Bytes(8)), "ASCII \"HRRYFILE\" identifying a Hurray file.", HEADER_REF),
    field("container_version_major", Int8ul, "Container major version; a newer one is rejected.", HEADER_REF),
    field("container_version_minor", Int8ul, "Container minor version.", HEADER_REF),
    reserved("_reserved", Bytes(2), HEADER_REF),
    field("file_flags", Int32ul, "File-level flag bits 0-2; bits 3-31 reserved.", FLAGS_REF, tags=FileFlag),
    field("data_buffer_alignment", Int32ul, "Alignment of every data buffer: a power of two in [4096, 2 MiB].", HEADER_REF,
          valid=Valid(lowest=MIN_DATA_BUFFER_ALIGNMENT, highest=MAX_DATA_BUFFER_ALIGNMENT, power_of_two=True)),
    field("first_descriptor_offset", Int64ul, "Absolute offset of the first descriptor, >= 64 and 8-aligned.", HEADER_REF),
    field("tensor_count_hint", Int64ul, "Tensor count if known when writing, else all ones; advisory.", HEADER_REF),
    reserved("_reserved_header", Bytes(28), HEADER_REF),
)
"""The 64 bytes a file starts with."""

TRAILER = Struct(
    field("index_offset", Int64ul, "Absolute offset of the index section.", TRAILER_REF),
    field("index_length", Int64ul, "Byte length of the index section.", TRAILER_REF),
    field("kv_offset", Int64ul, "Absolute offset of the KV section, 0 when there is none.", TRAILER_REF),
    field("kv_length", Int32ul, "Byte length of the KV section, 0 when there is none.", TRAILER_REF),
    field("index_crc32c", Int32ul, "CRC-32C of the index bytes when HAS_INDEX_CRC32C is set, else 0.", TRAILER_REF),
    reserved("_reserved", Bytes(4), TRAILER_REF),
    field("trailer_magic", Const(TRAILER_MAGIC, Bytes(4)), "ASCII \"HRRY\" closing the file.", TRAILER_REF),
)
"""The 40 bytes a file ends with."""

# --- KV metadata section -------------------------------------------------------------

KV_COUNT = Struct(field("kv_count", Int32ul, "Number of KV entries that follow.", "file-format.md § KV Section Encoding"))
KV_KEY_LENGTH = Struct(field("key_length", Int16ul, "Key length in bytes, >= 1; the UTF-8 key follows.", "file-format.md § KV Section Encoding"))
KV_VALUE_TAG = Struct(field("value_tag", Int8ul, "Type of the value that follows (KvTag).", "file-format.md § KV Section Encoding",
                           tags=KvTag))
KV_LENGTH_PREFIX = Struct(field("length", Int32ul, "Byte length of a string or byte-sequence value.", KV_TYPES_REF))
KV_INT64 = Struct(field("value", Int64sl, "Signed 64-bit integer value.", KV_TYPES_REF))
KV_UINT64 = Struct(field("value", Int64ul, "Unsigned 64-bit integer value.", KV_TYPES_REF))
KV_FLOAT64 = Struct(field("value", Float64l, "IEEE 754 binary64 value.", KV_TYPES_REF))
KV_BOOL = Struct(field("value", Int8ul, "0x00 false, 0x01 true; anything else is rejected.", KV_TYPES_REF))
KV_ARRAY_HEADER = Struct(
    field("element_tag", Int8ul, "Element value tag, 0x01-0x06.", KV_TYPES_REF, tags=KvTag),
    field("element_count", Int32ul, "Number of element payloads that follow.", KV_TYPES_REF),
)
KV_SCALAR_VALUES = {KvTag.INT64: KV_INT64, KvTag.UINT64: KV_UINT64, KvTag.FLOAT64: KV_FLOAT64, KvTag.BOOL: KV_BOOL}
"""Fixed-size value payloads; STRING and BYTES are a :data:`KV_LENGTH_PREFIX` then bytes."""

# --- Index section -------------------------------------------------------------------

INDEX_COUNT = Struct(field("index_entry_count", Int64ul, "Number of index entries (one per tensor).", "file-format.md § Index Encoding"))
INDEX_NAME_LENGTH = Struct(field("name_length", Int16ul, "Name length in bytes, >= 1; the UTF-8 name follows.", "file-format.md § Index Encoding"))
INDEX_ENTRY_FIELDS = Struct(
    field("descriptor_offset", Int64ul, "Absolute offset of the tensor's descriptor.", "file-format.md § Index Encoding"),
    field("descriptor_length", Int32ul, "Must equal the descriptor's own descriptor_length.", "file-format.md § Index Encoding"),
    field("data_offset", Int64ul, "Absolute offset of the tensor's first data buffer.", "file-format.md § Index Encoding"),
    field("data_length", Int64ul, "Buffers' byte sizes plus the padding between them.", "file-format.md § Index Encoding"),
    field("flags", Int32ul, "Reserved, must be 0.", "file-format.md § Index Encoding"),
)
"""The fixed part of an index entry, after its name."""

FILE_HEADER_SIZE = plan(FILE_HEADER).fixed_size
TRAILER_SIZE = plan(TRAILER).fixed_size
