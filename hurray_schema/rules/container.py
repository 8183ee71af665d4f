"""Rules of the containers: ``.hrry`` files (``file-format.md``), bare streams and the
interchange message framing (``interchange.md``).  Composite binding inside them (a torn
composite, the nesting depth, the per-member and close-time checks) is one set of rules
whatever the container: :mod:`hurray_schema.rules.composite`.

These are structural rules: the readers in :mod:`hurray_schema.io` fire them while
walking a container, with the byte offset (from the start of the file or stream) of the
faulty field.
"""

from __future__ import annotations

from .engine import Level, declare

MUST, MUST_NOT, SHOULD = Level.MUST, Level.MUST_NOT, Level.SHOULD

H = "file-format.md § File Header"
FL = "file-format.md § File Flags"
TR = "file-format.md § Trailer"
IX = "file-format.md § Index Section"
KV = "file-format.md § KV Metadata Section"
KVT = "file-format.md § KV Value Types"
TREG = "file-format.md § Tensor Region"

# --- file: header ---------------------------------------------------------------------
FILE_TOO_SHORT = declare(
    "file.size", MUST, "file-format.md § File Layout",
    "A file holds at least the 64-byte header and the 40-byte trailer.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_ends")
FILE_MAGIC = declare(
    "file.header.magic", MUST, H, "A file starts with the eight bytes \"HRRYFILE\".", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_ends")
FILE_VERSION = declare(
    "file.header.version", MUST, H,
    "A container_version_major newer than the reader's (1) is rejected.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_header")
FILE_HEADER_RESERVED = declare(
    "file.header.reserved", MUST, H, "The header's reserved bytes are zero.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_header")
FILE_FLAGS_RESERVED = declare(
    "file.flags.reserved", MUST, FL, "file_flags bits 3-31 are zero.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_header")
FILE_ALIGNMENT = declare(
    "file.header.alignment", MUST, H,
    "data_buffer_alignment is a power of two between 4096 and 2 MiB.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_data_buffer_alignment")
FILE_FIRST_DESCRIPTOR = declare(
    "file.header.first_descriptor_offset", MUST, H,
    "first_descriptor_offset is at least 64, a multiple of 8 and inside the file.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_header")

# --- file: trailer, index, KV ---------------------------------------------------------
TRAILER_MAGIC = declare(
    "file.trailer.magic", MUST, TR, "The file's last 4 bytes are \"HRRY\" (checked before any trailer field).",
    scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
TRAILER_RESERVED = declare(
    "file.trailer.reserved", MUST, TR, "The trailer's reserved bytes are zero.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
INDEX_BOUNDS = declare(
    "file.index.bounds", MUST, TR,
    "The index lies after the header and ends before the trailer (index_offset + index_length <= size - 40).",
    scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
INDEX_ALIGNMENT = declare(
    "file.index.alignment", MUST, IX, "The index section starts on a multiple of 8.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
INDEX_CRC = declare(
    "file.index.crc", MUST, FL,
    "With HAS_INDEX_CRC32C set, index_crc32c equals the CRC-32C of the index bytes.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
INDEX_CRC_UNSET = declare(
    "file.index.crc_unset", MUST, TR,
    "With HAS_INDEX_CRC32C clear, index_crc32c is zero.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_check_trailer")
INDEX_TRUNCATED = declare(
    "file.index.truncated", MUST, IX,
    "The index entries announced by index_entry_count fit exactly in index_length bytes.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_index")
INDEX_NAME = declare(
    "file.index.name", MUST, IX, "A tensor name is 1 or more bytes of valid UTF-8.", scope="file",
    enforced_by="hurray_schema.io.file.walk:_entry_name")
INDEX_DUPLICATE = declare(
    "file.index.duplicate", MUST, IX, "Tensor names are unique (byte-exact).", scope="file",
    enforced_by="hurray_schema.io.file.walk:_entry_name")
INDEX_FLAGS = declare(
    "file.index.flags", MUST, IX, "An index entry's flags field is zero.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_index")
INDEX_SORTED = declare(
    "file.index.sorted", MUST_NOT, FL,
    "SORTED_INDEX is not set unless the entries are in UTF-8 byte order of name.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_index")
INDEX_DESCRIPTOR_LENGTH = declare(
    "file.index.descriptor_length", MUST, IX,
    "An entry's descriptor_length equals the descriptor's own descriptor_length.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
INDEX_DESCRIPTOR_BOUNDS = declare(
    "file.index.descriptor_bounds", MUST, TREG,
    "A descriptor lies inside the tensor region (after first_descriptor_offset, before the KV/index sections).",
    scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
INDEX_OVERLAP = declare(
    "file.index.overlap", MUST, TREG,
    "Two entries do not share a descriptor_offset, and no tensor's data overlaps the next descriptor.",
    scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
DESCRIPTOR_ALIGNMENT = declare(
    "file.descriptor.alignment", MUST, "file-format.md § Descriptor Placement",
    "Every descriptor starts on a multiple of 8.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
DATA_ALIGNMENT = declare(
    "file.data.alignment", MUST, "file-format.md § Data Buffer Placement",
    "Every data buffer (an empty one too) starts on a multiple of data_buffer_alignment.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
DATA_LENGTH = declare(
    "file.data.length", MUST, IX,
    "data_length equals the buffers' byte sizes plus the alignment padding between them.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
DATA_BOUNDS = declare(
    "file.data.bounds", MUST, TREG,
    "A tensor's data buffers lie inside the tensor region (no truncated buffer).", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_tensor")
KV_FLAG = declare(
    "file.kv.flag", SHOULD, FL,
    "HAS_KV_METADATA is set exactly when the trailer locates a KV section (pyhurray never sets it).",
    scope="file",
    enforced_by="hurray_schema.io.file.walk:check_kv")
KV_BOUNDS = declare(
    "file.kv.bounds", MUST, KV,
    "The KV section lies after the header, before the index, and starts on a multiple of 8.", scope="file",
    enforced_by="hurray_schema.io.file.walk:check_kv")
KV_TRUNCATED = declare(
    "file.kv.truncated", MUST, "file-format.md § KV Section Encoding",
    "The KV entries announced by kv_count fit exactly in kv_length bytes.", scope="file",
    enforced_by=("hurray_schema.io.walk.kv:_Cursor.require", "hurray_schema.io.walk.kv:walk_kv"))
KV_KEY = declare(
    "file.kv.key", MUST, "file-format.md § KV Section Encoding",
    "A KV key is 1 or more bytes of valid UTF-8.", scope="file",
    enforced_by="hurray_schema.io.walk.kv:_check_key")
KV_DUPLICATE = declare(
    "file.kv.duplicate", MUST, "file-format.md § KV Section Encoding",
    "KV keys are unique (byte-exact).", scope="file",
    enforced_by="hurray_schema.io.walk.kv:_check_key")
KV_VALUE_TAG = declare(
    "file.kv.value_tag", MUST, KVT,
    "A KV value tag is one of 0x01-0x07 (reserved, invalid and unagreed private tags are rejected).",
    scope="file",
    enforced_by="hurray_schema.io.walk.kv:_value")
KV_BOOL = declare(
    "file.kv.bool", MUST, KVT, "A bool value is 0x00 or 0x01.", scope="file",
    enforced_by="hurray_schema.io.walk.kv:_payload_parts")
KV_ARRAY_TAG = declare(
    "file.kv.array_tag", MUST, KVT, "An array's element type tag is 0x01-0x06.", scope="file",
    enforced_by="hurray_schema.io.walk.kv:_value")
KV_STRING = declare(
    "file.kv.string", MUST, KVT, "A string value is valid UTF-8.", scope="file",
    enforced_by="hurray_schema.io.walk.kv:_payload_parts")

# --- streams --------------------------------------------------------------------------
STREAM_TRUNCATED = declare(
    "stream.truncated", MUST, "interchange.md § Scope",
    "A stream does not end inside a descriptor or inside the buffers it announces.", scope="stream",
    enforced_by=(
        "hurray_schema.io.walk.bare:_strict_buffer",
        "hurray_schema.io.walk.bare:_cut_in_descriptor",
        "hurray_schema.io.walk.messages:_walk",
        "hurray_schema.net.client:_Response._torn",
    ))
MESSAGE_TYPE = declare(
    "stream.message.type", MUST, "interchange.md § Message Types",
    "A message_type outside the defined table (or an unagreed private one) ends the stream.", scope="stream",
    enforced_by="hurray_schema.io.walk.messages:check_message_header")
MESSAGE_STREAM_ID = declare(
    "stream.message.stream_id", MUST_NOT, "interchange.md § Message Framing",
    "stream_id 0 is reserved and not used.", scope="stream",
    enforced_by="hurray_schema.io.walk.messages:check_message_header")
MESSAGE_TRUNCATED = declare(
    "stream.message.truncated", MUST, "interchange.md § Message Framing",
    "A message carries the full 12-byte header and payload_length payload bytes.", scope="stream",
    enforced_by=("hurray_schema.net.checker:recorded_messages", "hurray_schema.net.wire:Wire.read_into"))
MESSAGE_ORDER = declare(
    "stream.message.order", MUST, "interchange.md § Ordering Invariant",
    "Each tensor is TENSOR_DESCRIPTOR, then TENSOR_DATA frames, then TENSOR_DATA_END; nothing else interleaves.",
    scope="stream",
    enforced_by=(
        "hurray_schema.io.walk.messages:_walk",
        "hurray_schema.net.checker:SessionChecker.descriptor",
        "hurray_schema.net.checker:SessionChecker._open",
        "hurray_schema.net.checker:SessionChecker._response_of",
        "hurray_schema.net.client:Session._ping",
        "hurray_schema.net.client:_Response.receive",
    ))
DESCRIPTOR_PAYLOAD = declare(
    "stream.descriptor.payload", MUST, "interchange.md § TENSOR_DESCRIPTOR Payload",
    "A TENSOR_DESCRIPTOR payload is the descriptor followed by exactly the 16 transport bytes.", scope="stream",
    enforced_by=(
        "hurray_schema.io.walk.messages:_descriptor_length_in_payload",
        "hurray_schema.io.walk.messages:_located_descriptor_length",
    ))
TRANSPORT_SHARDS = declare(
    "stream.descriptor.shards", MUST, "interchange.md § TENSOR_DESCRIPTOR Payload",
    "total_shards is at least 1 and shard_index is below it.", scope="stream",
    enforced_by="hurray_schema.io.walk.messages:TensorFrames.open")
TOTAL_DATA_BYTES = declare(
    "stream.data.total_bytes", MUST, "interchange.md § TENSOR_DESCRIPTOR Payload",
    "total_data_bytes equals the sum of the descriptor's buffer byte sizes (0 for a head or an empty tensor); "
    "the buffers travel concatenated in buffer-table order.", scope="stream",
    enforced_by=("hurray_schema.io.walk.messages:TensorFrames.open", "hurray_schema.net.checker:described"))
DATA_FRAME = declare(
    "stream.data.frame", MUST, "interchange.md § TENSOR_DATA Payload",
    "A TENSOR_DATA payload holds the 8-byte byte_offset_in_buffer; frames are contiguous, ascending, "
    "non-overlapping and stay within total_data_bytes.", scope="stream",
    enforced_by=(
        "hurray_schema.io.walk.messages:TensorFrames.frame",
        "hurray_schema.net.checker:SessionChecker.shm_data",
    ))
DATA_SUM = declare(
    "stream.data.sum", MUST, "interchange.md § TENSOR_DATA Payload",
    "At TENSOR_DATA_END the frames' lengths add up to total_data_bytes.", scope="stream",
    enforced_by="hurray_schema.io.walk.messages:TensorFrames.end")
DATA_END_PAYLOAD = declare(
    "stream.data_end.payload", MUST, "interchange.md § TENSOR_DATA_END Payload",
    "A TENSOR_DATA_END payload is empty.", scope="stream",
    enforced_by="hurray_schema.io.walk.messages:TensorFrames.end")
CROSS_MACHINE_SYNC = declare(
    "stream.sync_mode.cross_machine", MUST, "interchange.md § Completion",
    "A cross-machine TENSOR_DESCRIPTOR declares sync_mode PRODUCER_SYNCED (0x00) in every buffer handle.",
    scope="stream",
    enforced_by="hurray_schema.io.walk.descriptor:_check_producer_synced")

CONTAINER_RULES = tuple(
    rule for name, rule in dict(globals()).items() if name.isupper() and hasattr(rule, "violation")
)
"""Every rule of this module, for the coverage tests."""
