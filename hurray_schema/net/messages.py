"""Session payloads to and from bytes, through their declarations
(:mod:`hurray_schema.structs.session`), and the messages' framing.

A payload that does not hold exactly its table is ``session.payload.length``; a key or an
error text that is not UTF-8 is ``session.key.utf8``.  Each violation names the byte offset in
the received direction: ``at`` is the offset of the message's first header byte.
"""

from __future__ import annotations

import io
from typing import Optional

import attrs
import construct

from ..errors import SpecViolation
from ..rules import session as rules
from ..structs._declare import plan, static_offset, static_size
from ..structs.descriptor import MIN_BUFFER_ALIGNMENT
from ..structs.session import (
    CLIENT_HELLO, ERROR, HELLO_WITHOUT_CLASSES, RDMA_REGISTER, SHM_DATA, SERVER_HELLO, TENSOR_PUT,
    TENSOR_REQUEST, ErrorCode, is_extension_layout,
)
from ..structs.stream import (
    MESSAGE_HEADER, MESSAGE_HEADER_SIZE, TENSOR_DATA_HEADER, TENSOR_DATA_HEADER_SIZE, TENSOR_DESCRIPTOR_FIELDS,
    MessageType,
)
from ..structs.tags import MemoryClass

__all__ = [
    "LayoutEntry", "Hello", "Request", "Put", "decode_hello", "encode_hello", "decode_request", "encode_request",
    "decode_put", "encode_put", "decode_error", "encode_error", "decode_rdma_register", "message", "header",
    "data_header", "unpack_offset_in_buffer", "tail_offset", "transport_fields", "HEADER", "HEADER_SIZE", "DATA_HEADER_SIZE", "PAYLOAD_LENGTH_AT",
    "TRANSPORT_SIZE",
]

HEADER = plan(MESSAGE_HEADER)
HEADER_SIZE = MESSAGE_HEADER_SIZE
DATA_HEADER_SIZE = TENSOR_DATA_HEADER_SIZE
PAYLOAD_LENGTH_AT = static_offset(MESSAGE_HEADER, "payload_length")
_HEADER_CODEC = HEADER.steps[0].codec
assert HEADER.steps[0].names == ("message_type", "stream_id", "payload_length")  # the header in one (un)pack
_DATA_CODEC = plan(TENSOR_DATA_HEADER).steps[0].codec
assert plan(TENSOR_DATA_HEADER).steps[0].names == ("byte_offset_in_buffer",)
_DESCRIPTOR_LENGTH_SIZE = static_size(TENSOR_PUT.subcons[2])
assert TENSOR_PUT.subcons[2].name == "descriptor_length"
_TRANSPORT = plan(TENSOR_DESCRIPTOR_FIELDS)
TRANSPORT_SIZE = static_size(TENSOR_DESCRIPTOR_FIELDS)
"""Bytes of the transport fields after a TENSOR_DESCRIPTOR's descriptor (``§ TENSOR_DESCRIPTOR Payload``)."""
_KEY_AT = static_offset(TENSOR_REQUEST, "tensor_key")


@attrs.frozen(slots=True)
class LayoutEntry:
    """One entry of a layout list: a layout tag, and an extension tag's opaque metadata."""

    tag: int
    metadata: Optional[bytes] = None

    def as_fields(self) -> dict:
        ext = is_extension_layout(self.tag)
        return {"layout_tag": self.tag, "ext_metadata_length": None,
                "ext_metadata": (self.metadata or b"") if ext else None}


@attrs.frozen(slots=True)
class Hello:
    """CLIENT_HELLO or SERVER_HELLO (``interchange.md § Session Establishment``)."""

    protocol_version: int
    max_message_size: int
    capability_flags: int
    layouts: tuple[LayoutEntry, ...] = ()
    devices: tuple[int, ...] = (0,)
    memory_classes: tuple[int, ...] = ()

    @property
    def accepted_memory_classes(self) -> tuple[int, ...]:
        """The memory classes this side handles: STANDARD when it listed none."""
        return self.memory_classes or (int(MemoryClass.STANDARD),)


@attrs.frozen(slots=True)
class Request:
    """A TENSOR_REQUEST (``interchange.md § TENSOR_REQUEST Payload``)."""

    key: str
    layouts: tuple[LayoutEntry, ...] = ()
    device: int = 0
    min_alignment: int = MIN_BUFFER_ALIGNMENT
    flags: int = 0


@attrs.frozen(slots=True)
class Put:
    """A TENSOR_PUT's payload (``interchange.md § TENSOR_PUT Payload``)."""

    key: str
    descriptor: bytes
    total_data_bytes: int
    descriptor_at: int = 0
    """Offset of the descriptor's first byte in the received direction."""


def header(message_type: int, stream_id: int, payload_length: int) -> bytes:
    """The 12-byte message header (``interchange.md § Message Framing``)."""
    return _HEADER_CODEC.pack(message_type, stream_id, payload_length)


def unpack_header(raw) -> tuple[int, int, int]:
    """``(message_type, stream_id, payload_length)`` of a 12-byte header."""
    return _HEADER_CODEC.unpack(raw)


def message(message_type: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A whole message: header and payload."""
    return header(message_type, stream_id, len(payload)) + payload


def unpack_offset_in_buffer(raw) -> int:
    """``byte_offset_in_buffer`` of a TENSOR_DATA payload's first bytes."""
    return _DATA_CODEC.unpack_from(raw)[0]


def tail_offset(decl: construct.Struct, name: str) -> int:
    """How many bytes before the end of a ``decl`` payload field ``name`` starts, when it and every
    field after it have a fixed size (the tail of a TENSOR_REQUEST)."""
    back = 0
    for sub in reversed(decl.subcons):
        back += static_size(sub)
        if sub.name == name:
            return back
    raise KeyError(name)


def data_header(stream_id: int, offset_in_buffer: int, n: int) -> bytes:
    """The header of a TENSOR_DATA message carrying ``n`` data bytes, and its
    ``byte_offset_in_buffer`` (``interchange.md § TENSOR_DATA Payload``)."""
    return header(MessageType.TENSOR_DATA, stream_id, DATA_HEADER_SIZE + n) + _DATA_CODEC.pack(offset_in_buffer)


def transport_fields(total_data_bytes: int, shard_index: int = 0, total_shards: int = 1) -> bytes:
    """The 16 bytes after the descriptor in a TENSOR_DESCRIPTOR payload."""
    return _TRANSPORT.pack(total_data_bytes=total_data_bytes, shard_index=shard_index, total_shards=total_shards)


# --------------------------------------------------------------------------------------
# Decoding: exactly the table, or the rule
# --------------------------------------------------------------------------------------


def _parse(decl: construct.Struct, payload, at: int, name: str):
    """``payload`` decoded as ``decl``, every byte used; else ``session.payload.length`` at the
    header's ``payload_length``."""
    data = bytes(payload)
    stream = io.BytesIO(data)
    try:
        value = decl.parse_stream(stream)
        used = stream.tell()
    except (construct.ConstructError, ValueError, OverflowError) as exc:
        raise rules.PAYLOAD_LENGTH.violation(
            f"the {len(data)}-byte {name} payload does not hold its table ({type(exc).__name__})",
            at + PAYLOAD_LENGTH_AT) from None
    if used != len(data):
        raise rules.PAYLOAD_LENGTH.violation(
            f"the {name} payload has {len(data) - used} bytes after its table", at + PAYLOAD_LENGTH_AT)
    return value


def _text(raw: bytes, at: int, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise rules.KEY_UTF8.violation(f"{what} is not valid UTF-8 (byte {exc.start})", at + exc.start) from None


def _entries(values) -> tuple[LayoutEntry, ...]:
    return tuple(LayoutEntry(v.layout_tag, v.ext_metadata) for v in values)


def decode_hello(payload, at: int, *, server: bool) -> Hello:
    """A CLIENT_HELLO (``server=False``) or SERVER_HELLO payload; the memory class list may be
    absent (the payload ends after the devices).  An extension layout entry is kept whether or
    not this side knows it, read past by its ext_metadata_length (``session.layouts.extension_skip``)."""
    decl = SERVER_HELLO if server else CLIENT_HELLO
    name = "SERVER_HELLO" if server else "CLIENT_HELLO"
    try:
        v = _parse(decl, payload, at, name)
    except SpecViolation as whole:
        try:
            v = _parse(HELLO_WITHOUT_CLASSES, payload, at, name)
        except SpecViolation:
            raise whole from None
        v.supported_memory_classes = []
    return Hello(v.protocol_version, v.max_message_size, v.capability_flags, _entries(v.supported_layouts),
                 tuple(v.supported_devices), tuple(v.supported_memory_classes))


def encode_hello(hello: Hello, *, server: bool) -> bytes:
    decl = SERVER_HELLO if server else CLIENT_HELLO
    return decl.build({
        "protocol_version": hello.protocol_version, "max_message_size": hello.max_message_size,
        "capability_flags": hello.capability_flags, "supported_layouts": [e.as_fields() for e in hello.layouts],
        "supported_devices": list(hello.devices), "supported_memory_classes": list(hello.memory_classes),
    })


def decode_request(payload, at: int) -> Request:
    v = _parse(TENSOR_REQUEST, payload, at, "TENSOR_REQUEST")
    key = _text(v.tensor_key, at + HEADER_SIZE + _KEY_AT, "tensor_key")
    return Request(key, _entries(v.preferred_layouts), v.preferred_device, v.min_alignment, v.request_flags)


def encode_request(request: Request) -> bytes:
    return TENSOR_REQUEST.build({
        "tensor_key": request.key.encode("utf-8"), "preferred_layouts": [e.as_fields() for e in request.layouts],
        "preferred_device": request.device, "min_alignment": request.min_alignment,
        "request_flags": request.flags,
    })


def decode_put(payload, at: int) -> Put:
    v = _parse(TENSOR_PUT, payload, at, "TENSOR_PUT")
    key = _text(v.tensor_key, at + HEADER_SIZE + _KEY_AT, "tensor_key")
    descriptor_at = at + HEADER_SIZE + _KEY_AT + len(v.tensor_key) + _DESCRIPTOR_LENGTH_SIZE
    return Put(key, bytes(v.descriptor), v.total_data_bytes, descriptor_at)


def encode_put(key: str, descriptor: bytes, total_data_bytes: int) -> bytes:
    return TENSOR_PUT.build({"tensor_key": key.encode("utf-8"), "descriptor": descriptor,
                             "total_data_bytes": total_data_bytes})


def decode_error(payload, at: int) -> tuple[int, str]:
    """``(error_code, message)``; an undecodable text is kept with replacement characters (an
    ERROR ends the stream whatever it says)."""
    v = _parse(ERROR, payload, at, "ERROR")
    return v.error_code, bytes(v.message).decode("utf-8", "replace")


def encode_error(code: ErrorCode | int, text: str) -> bytes:
    raw = text.encode("utf-8")[:4096]
    return ERROR.build({"error_code": int(code), "message": raw.decode("utf-8", "ignore").encode("utf-8")})


def decode_shm_data(payload, at: int) -> list[tuple[int, int]]:
    """``(segment_offset, byte_size)`` per buffer of an SHM_DATA payload."""
    v = _parse(SHM_DATA, payload, at, "SHM_DATA")
    return [(seg.segment_offset, seg.byte_size) for seg in v.segments]


def encode_shm_data(segments) -> bytes:
    return SHM_DATA.build({"segments": [{"segment_offset": o, "byte_size": n} for o, n in segments]})


def decode_rdma_register(payload, at: int) -> dict:
    v = _parse(RDMA_REGISTER, payload, at, "RDMA_REGISTER")
    return {"remote_addr": v.remote_addr, "length": v.length, "rkey": bytes(v.rkey)}


def layout_entries(tags) -> tuple[LayoutEntry, ...]:
    """Layout entries from tags, or from entries given as they are."""
    return tuple(t if isinstance(t, LayoutEntry) else LayoutEntry(int(t)) for t in tags)

