"""Wire tables of the interchange message framing (``interchange.md``).

Every message is the 12-byte :data:`MESSAGE_HEADER` followed by ``payload_length``
bytes.  A tensor travels as ``TENSOR_DESCRIPTOR`` (descriptor, then the
:data:`TENSOR_DESCRIPTOR_FIELDS` transport fields), zero or more ``TENSOR_DATA``
(:data:`TENSOR_DATA_HEADER` then raw bytes) and an empty ``TENSOR_DATA_END``.
The bare stream (descriptor followed by its buffers, tensor after tensor) has no table
of its own.
"""

from __future__ import annotations

import enum

from construct import Int32ul, Int64ul, Struct

from ._declare import field, plan

__all__ = [
    "MessageType", "MESSAGE_HEADER", "MESSAGE_HEADER_SIZE", "TENSOR_DESCRIPTOR_FIELDS",
    "TENSOR_DESCRIPTOR_FIELDS_SIZE", "TENSOR_DATA_HEADER", "TENSOR_DATA_HEADER_SIZE", "TENSOR_DATA_END",
    "RESERVED_STREAM_ID",
]

FRAMING_REF = "interchange.md § Message Framing"
DESC_REF = "interchange.md § TENSOR_DESCRIPTOR Payload"
DATA_REF = "interchange.md § TENSOR_DATA Payload"

RESERVED_STREAM_ID = 0


class MessageType(enum.IntEnum):
    """``message_type`` tags (``interchange.md § Message Types``)."""

    CLIENT_HELLO = 0x01
    SERVER_HELLO = 0x02
    TENSOR_REQUEST = 0x03
    TENSOR_DESCRIPTOR = 0x04
    TENSOR_DATA = 0x05
    TENSOR_DATA_END = 0x06
    TENSOR_PUT = 0x07
    TENSOR_PUT_ACK = 0x08
    ERROR = 0x09
    PING = 0x0A
    PONG = 0x0B
    RDMA_REGISTER = 0x0C
    RDMA_READY = 0x0D


MESSAGE_HEADER = Struct(
    field("message_type", Int32ul, "What the payload is (MessageType).", FRAMING_REF, tags=MessageType),
    field("stream_id", Int32ul, "Opaque stream identifier; 0 is reserved.", FRAMING_REF),
    field("payload_length", Int32ul, "Payload bytes after this header.", FRAMING_REF),
)
"""The 12 bytes every message starts with."""

TENSOR_DESCRIPTOR_FIELDS = Struct(
    field("total_data_bytes", Int64ul, "Bytes the following TENSOR_DATA frames carry in total.", DESC_REF),
    field("shard_index", Int32ul, "This shard's index in a parallel transfer; 0 otherwise.", DESC_REF),
    field("total_shards", Int32ul, "Shard count of a parallel transfer; 1 otherwise.", DESC_REF),
)
"""Transport fields after the descriptor inside a TENSOR_DESCRIPTOR payload."""

TENSOR_DATA_HEADER = Struct(
    field("byte_offset_in_buffer", Int64ul, "Where this frame's bytes start in the tensor's data.", DATA_REF),
)
"""Start of a TENSOR_DATA payload; the data bytes fill the rest of the payload."""

TENSOR_DATA_END = Struct()
"""The TENSOR_DATA_END payload is empty (``interchange.md § TENSOR_DATA_END Payload``)."""


MESSAGE_HEADER_SIZE = plan(MESSAGE_HEADER).fixed_size
TENSOR_DESCRIPTOR_FIELDS_SIZE = plan(TENSOR_DESCRIPTOR_FIELDS).fixed_size
TENSOR_DATA_HEADER_SIZE = plan(TENSOR_DATA_HEADER).fixed_size
