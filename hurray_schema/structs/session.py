"""Wire tables of a transport session (``interchange.md`` § Session Establishment through
§ Error Handling): the hellos, the layout entry, requests, PUT, errors, keepalives and the
RDMA handshake.  The message header and the tensor data frames are in :mod:`.stream`.

Every variable-length piece is declared with its count or length field before it, as the
spec's tables say ("preceded by a uint16 count"), with ``Rebuild`` so an encoder derives
the count from the list.  A UTF-8 string is declared as its bytes: whether they are valid
UTF-8 is a rule (``session.key.utf8``), not a decode failure.  The tables are decoded by
:mod:`hurray_schema.net.messages`, which turns a short or long payload into the rule
``session.payload.length``.
"""

from __future__ import annotations

import enum

from construct import Array, Bytes, If, Int8ul, Int16ul, Int32ul, Int64ul, Rebuild, Struct, len_, this

from ._declare import Valid, field
from .layouts import is_extension_layout
from .tags import PRIVATE_TAG_FIRST, PRIVATE_TAG_LAST, DeviceTag, LayoutTag, MemoryClass

__all__ = [
    "PROTOCOL_VERSION", "CapabilityFlag", "KNOWN_CAPABILITY_FLAGS", "RequestFlag", "KNOWN_REQUEST_FLAGS",
    "ErrorCode", "PrivateErrorCode", "EXTENSION_LAYOUT_FIRST", "EXTENSION_LAYOUT_LAST", "is_extension_layout", "LAYOUT_ENTRY",
    "CLIENT_HELLO", "SERVER_HELLO", "HELLO_WITHOUT_CLASSES", "TENSOR_REQUEST", "TENSOR_PUT", "TENSOR_PUT_ACK",
    "ERROR", "ERROR_HEADER", "PING", "PONG", "RDMA_REGISTER", "RDMA_READY", "PRIVATE_MESSAGE_FIRST",
    "PRIVATE_MESSAGE_LAST", "INVALID_MESSAGE_TYPE", "SESSION_TABLES", "ShmMessageType", "SHM_SEGMENT", "SHM_DATA",
]

SESSION_REF = "interchange.md § Session Establishment"
CLIENT_REF = "interchange.md § CLIENT_HELLO Payload"
SERVER_REF = "interchange.md § SERVER_HELLO Payload"
CAPS_REF = "interchange.md § Capability Flags"
ENTRY_REF = "interchange.md § Layout Entry Encoding"
REQUEST_REF = "interchange.md § TENSOR_REQUEST Payload"
PUT_REF = "interchange.md § TENSOR_PUT Payload"
ACK_REF = "interchange.md § TENSOR_PUT_ACK Payload"
ERROR_REF = "interchange.md § ERROR Payload"
TYPES_REF = "interchange.md § Message Types"
RDMA_REF = "interchange.md § RDMA_REGISTER Payload"
READY_REF = "interchange.md § RDMA_READY Payload"

PROTOCOL_VERSION = 1
"""The protocol version this implementation speaks (``interchange.md § CLIENT_HELLO Payload``)."""

PRIVATE_MESSAGE_FIRST, PRIVATE_MESSAGE_LAST = PRIVATE_TAG_FIRST, PRIVATE_TAG_LAST
INVALID_MESSAGE_TYPE = 0xFF
"""Message types kept for private extensions (the private range of every tag table,
:data:`~.tags.PRIVATE_TAG_FIRST`), and the one never used (``§ Message Types``)."""

EXTENSION_LAYOUT_FIRST, EXTENSION_LAYOUT_LAST = PRIVATE_TAG_FIRST, PRIVATE_TAG_LAST
"""The extension layouts of a layout entry, whose entries carry a length and metadata
(:func:`~.layouts.is_extension_layout`)."""


class CapabilityFlag(enum.IntFlag):
    """``capability_flags`` bits of both hellos (``interchange.md § Capability Flags``)."""

    TRANSCODING = 1 << 0
    PARALLEL_STREAMS = 1 << 1
    RDMA_DATA_PLANE = 1 << 2
    RDMA_GPUDIRECT = 1 << 3


KNOWN_CAPABILITY_FLAGS = int(
    CapabilityFlag.TRANSCODING | CapabilityFlag.PARALLEL_STREAMS | CapabilityFlag.RDMA_DATA_PLANE
    | CapabilityFlag.RDMA_GPUDIRECT
)


class RequestFlag(enum.IntFlag):
    """``request_flags`` bits of a TENSOR_REQUEST (``interchange.md § TENSOR_REQUEST Payload``)."""

    ALLOW_TRANSCODE = 1 << 0
    PARALLEL_OK = 1 << 1


KNOWN_REQUEST_FLAGS = int(RequestFlag.ALLOW_TRANSCODE | RequestFlag.PARALLEL_OK)


class ErrorCode(enum.IntEnum):
    """``error_code`` of an ERROR message (``interchange.md § ERROR Payload``); 0xF0-0xFE are
    implementation-defined."""

    PROTOCOL_VERSION_MISMATCH = 0x01
    UNKNOWN_TENSOR = 0x02
    LAYOUT_UNAVAILABLE = 0x03
    TRANSCODE_LIMIT_EXCEEDED = 0x04
    DEVICE_UNAVAILABLE = 0x05
    INVALID_MESSAGE = 0x06
    MESSAGE_TOO_LARGE = 0x07
    SHARD_MISMATCH = 0x08


class PrivateErrorCode(enum.IntEnum):
    """This implementation's ``error_code`` values, in the range the spec leaves to
    implementations (``interchange.md § ERROR Payload``: 0xF0-0xFE)."""

    SERVER_BUSY = 0xF0
    """No slot came free before the connection's handshake deadline, or too many wait already (sent
    instead of SERVER_HELLO); or a PUT's data would take the server past the memory it holds for
    unfinished PUTs (on the PUT's stream)."""
    PUT_REFUSED = 0xF1
    """The server does not accept this TENSOR_PUT: no writable store, a read-only key, too large, or the
    store could not be written."""
    INTERNAL = 0xF2
    """The server failed on its side; the connection ends."""
    TIMEOUT = 0xF3
    """The hello or a message did not arrive whole within its deadline; the connection ends."""
    STORE_FULL = 0xF4
    """Storing this PUT would take the store past its item or byte limit; the store is unchanged."""
    SOURCE_CHANGED = 0xF5
    """The file the item is served from changed or was cut under the server: the stream ends (a frame
    already under way was padded to its declared length and must be discarded); the session goes on."""


_extension = this.layout_tag >= EXTENSION_LAYOUT_FIRST
_in_range = _extension & (this.layout_tag <= EXTENSION_LAYOUT_LAST)

LAYOUT_ENTRY = Struct(
    field("layout_tag", Int8ul, "A layout the sender can consume or produce.", ENTRY_REF, tags=LayoutTag),
    field("ext_metadata_length",
          If(_in_range, Rebuild(Int16ul, len_(this.ext_metadata))),
          "Extension tags only: byte length of the metadata that follows (may be 0).", ENTRY_REF),
    field("ext_metadata", If(_in_range, Bytes(this.ext_metadata_length)),
          "Extension tags only: opaque hardware or implementation parameters.", ENTRY_REF),
)
"""One entry of a layout list: a tag byte, and for an extension tag its length-prefixed metadata."""


def _hello(ref: str, who: str, version_doc: str) -> Struct:
    """CLIENT_HELLO and SERVER_HELLO share one table; only the descriptions differ."""
    return Struct(
        field("protocol_version", Int32ul, version_doc, ref),
        field("max_message_size", Int32ul, f"Largest payload_length the {who} accepts.", ref),
        field("capability_flags", Int64ul, f"What the {who} can do (bits 4-63 are zero).", CAPS_REF,
              tags=CapabilityFlag),
        field("layout_count", Rebuild(Int16ul, len_(this.supported_layouts)), "Entries in supported_layouts.", ref),
        field("supported_layouts", Array(this.layout_count, LAYOUT_ENTRY),
              f"Layouts the {who} handles, most preferred first.", ref),
        field("device_count", Rebuild(Int16ul, len_(this.supported_devices)), "Entries in supported_devices.", ref),
        field("supported_devices", Array(this.device_count, Int8ul), f"Device tags the {who} handles.", ref,
              tags=DeviceTag),
        field("class_count", Rebuild(Int16ul, len_(this.supported_memory_classes)),
              "Entries in supported_memory_classes; the list may be absent (STANDARD only).", ref),
        field("supported_memory_classes", Array(this.class_count, Int8ul),
              f"Memory classes the {who} handles.", ref, tags=MemoryClass),
    )


CLIENT_HELLO = _hello(CLIENT_REF, "client", "The protocol version the client speaks (1).")
"""The first message of every connection, client to server."""

SERVER_HELLO = _hello(SERVER_REF, "server", "The version the server will use, at most the client's.")
"""The server's answer to CLIENT_HELLO, before anything else it sends."""

HELLO_WITHOUT_CLASSES = Struct(*CLIENT_HELLO.subcons[:-2])
"""A hello whose memory class list is absent: it ends after the devices (STANDARD only)."""

TENSOR_REQUEST = Struct(
    field("key_length", Rebuild(Int32ul, len_(this.tensor_key)), "Byte length of tensor_key.", REQUEST_REF),
    field("tensor_key", Bytes(this.key_length), "The requested tensor's identifier, UTF-8.", REQUEST_REF),
    field("layout_count", Rebuild(Int16ul, len_(this.preferred_layouts)),
          "Entries in preferred_layouts; 0: no preference.", REQUEST_REF),
    field("preferred_layouts", Array(this.layout_count, LAYOUT_ENTRY),
          "Layouts the client wants, most preferred first.", REQUEST_REF),
    field("preferred_device", Int8ul, "Where the client wants the response buffer.", REQUEST_REF, tags=DeviceTag),
    field("min_alignment", Int32ul, "Smallest buffer alignment the client needs; a power of two.", REQUEST_REF,
          valid=Valid(power_of_two=True)),
    field("request_flags", Int32ul, "What the client allows (bits 2-31 are zero).", REQUEST_REF, tags=RequestFlag),
)
"""Client to server: one tensor, by key, with layout and device preferences."""

TENSOR_PUT = Struct(
    field("key_length", Rebuild(Int32ul, len_(this.tensor_key)), "Byte length of tensor_key.", PUT_REF),
    field("tensor_key", Bytes(this.key_length), "The pushed tensor's identifier, UTF-8.", PUT_REF),
    field("descriptor_length", Rebuild(Int32ul, len_(this.descriptor)), "Byte length of descriptor.", PUT_REF),
    field("descriptor", Bytes(this.descriptor_length), "The tensor descriptor (metadata.md).", PUT_REF),
    field("total_data_bytes", Int64ul, "Bytes the TENSOR_DATA frames that follow carry in total.", PUT_REF),
)
"""Client to server: a tensor pushed by key; its data frames follow on the same stream."""

TENSOR_PUT_ACK = Struct()
"""The server accepted the whole pushed tensor; the payload is empty."""

ERROR = Struct(
    field("error_code", Int32ul, "What went wrong (ErrorCode; 0xF0-0xFE implementation-defined).", ERROR_REF,
          tags=ErrorCode),
    field("message_length", Rebuild(Int32ul, len_(this.message)), "Byte length of message.", ERROR_REF),
    field("message", Bytes(this.message_length), "A description for people, UTF-8.", ERROR_REF),
)
"""Either direction: the stream it travels on is over."""

ERROR_HEADER = Struct(*ERROR.subcons[:2])
"""The fixed part of :data:`ERROR`, read before the message's length is checked."""

PING = Struct()
PONG = Struct()
"""Keepalives.  The spec gives them no payload table: we send them empty and answer a PING
with a PONG that echoes its payload (``spec-map.md § Interpretations``)."""

RDMA_REGISTER = Struct(
    field("remote_addr", Int64ul, "Address of the registered region on the sender's side.", RDMA_REF),
    field("length", Int64ul, "Region size; equals the preceding descriptor's total_data_bytes.", RDMA_REF),
    field("rkey_length", Rebuild(Int32ul, len_(this.rkey)), "Byte length of rkey.", RDMA_REF),
    field("rkey", Bytes(this.rkey_length), "Opaque RDMA memory key of the RDMA library.", RDMA_REF),
)
"""An RDMA memory registration.  This implementation advertises no RDMA capability, so it
parses the message and answers ERROR (``session.rdma.agreed``)."""

RDMA_READY = Struct()
"""The peer is ready for the RDMA transfer; the payload is empty."""

# --------------------------------------------------------------------------------------
# Our private extension: shared memory over a Unix socket (``interchange.md § IPC``)
# --------------------------------------------------------------------------------------

SHM_REF = "interchange.md § IPC (this implementation's private extension; spec-map.md § Interpretations)"


class ShmMessageType(enum.IntEnum):
    """This implementation's private message types (``interchange.md § Message Types``: 0xF0-0xFE),
    used only over a Unix socket and only after agreement: a client that sends SHM_REQUEST or
    SHM_PUT has agreed (it was told so by its options), and the server answers SHM_DATA only to it."""

    SHM_REQUEST = 0xF0
    """Client to server: a TENSOR_REQUEST (same table) whose data is to come as shared memory."""
    SHM_DATA = 0xF1
    """Server to client, between a TENSOR_DESCRIPTOR and its TENSOR_DATA_END, in place of the
    TENSOR_DATA frames: one file descriptor passed with the message (``SCM_RIGHTS``) and where each
    buffer lies in it."""
    SHM_PUT = 0xF2
    """Client to server: a TENSOR_PUT (same table) whose data is the sealed memory file passed with
    the message; no frames follow."""


SHM_SEGMENT = Struct(
    field("segment_offset", Int64ul, "Where the buffer starts in the passed file (its byte_offset there).",
          SHM_REF),
    field("byte_size", Int64ul, "The buffer's bytes; equals its handle's byte_size.", SHM_REF),
)
"""One buffer's place in the passed file."""

SHM_DATA = Struct(
    field("buffer_count", Rebuild(Int32ul, len_(this.segments)), "Entries that follow; the descriptor's buffer_count.",
          SHM_REF),
    field("segments", Array(this.buffer_count, SHM_SEGMENT), "Each buffer's place, in buffer-table order.",
          SHM_REF),
)
"""The payload of SHM_DATA; the file itself travels as ancillary data."""

SESSION_TABLES = {
    "CLIENT_HELLO": CLIENT_HELLO,
    "SERVER_HELLO": SERVER_HELLO,
    "LAYOUT_ENTRY": LAYOUT_ENTRY,
    "TENSOR_REQUEST": TENSOR_REQUEST,
    "TENSOR_PUT": TENSOR_PUT,
    "TENSOR_PUT_ACK": TENSOR_PUT_ACK,
    "ERROR": ERROR,
    "PING": PING,
    "PONG": PONG,
    "RDMA_REGISTER": RDMA_REGISTER,
    "RDMA_READY": RDMA_READY,
    "SHM_DATA": SHM_DATA,
    "SHM_SEGMENT": SHM_SEGMENT,
}
"""The session's tables by name, for the generated documentation and schemas."""
