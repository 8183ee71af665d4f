"""Wire encoders and decoders of the Hurray network transport, from the spec's tables.

Written with :mod:`struct` only, independently of ``hurray_schema`` (see the package
docstring).  Every function names the spec table it follows; sections are cited as
``file.md § Section`` of the reference repository's ``docs/spec``.

Conventions of this module:

* encoders take plain Python values and return ``bytes``; they accept out-of-range or
  deliberately wrong values where a test needs to send them (a hostile peer), so they
  check nothing beyond what :mod:`struct` refuses;
* decoders take ``bytes`` and return plain values, dicts or small dataclasses, and raise
  :class:`WireFormatError` on anything the table does not allow (short input, trailing
  bytes, bad UTF-8, bad magic ...).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Union


class WireFormatError(ValueError):
    """Bytes that do not decode as the spec table says."""


# ---------------------------------------------------------------------------------------
# Message framing
# ---------------------------------------------------------------------------------------

HEADER = struct.Struct("<III")
"""message_type u32, stream_id u32, payload_length u32 (interchange.md § Message Framing)."""
HEADER_SIZE = HEADER.size  # 12

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF

PROTOCOL_VERSION = 0x00000001
"""The current protocol version (interchange.md § CLIENT_HELLO Payload)."""


def encode_header(message_type: int, stream_id: int, payload_length: int) -> bytes:
    """The 12-byte message header (interchange.md § Message Framing)."""
    return HEADER.pack(message_type, stream_id, payload_length)


def decode_header(data: bytes) -> tuple[int, int, int]:
    """``(message_type, stream_id, payload_length)`` of a 12-byte header
    (interchange.md § Message Framing)."""
    if len(data) != HEADER_SIZE:
        raise WireFormatError(f"a message header is {HEADER_SIZE} bytes, got {len(data)}")
    return HEADER.unpack(data)


def encode_message(message_type: int, stream_id: int, payload: bytes = b"") -> bytes:
    """Header plus payload, ``payload_length`` set to the payload's size
    (interchange.md § Message Framing)."""
    payload = bytes(payload)
    return encode_header(message_type, stream_id, len(payload)) + payload


# Message types (interchange.md § Message Types)
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
PRIVATE_MESSAGE_TYPES = range(0xF0, 0xFF)
"""Implementation-private extension message types; never to be sent unagreed."""
INVALID_MESSAGE_TYPE = 0xFF

MESSAGE_TYPE_NAMES = {
    CLIENT_HELLO: "CLIENT_HELLO", SERVER_HELLO: "SERVER_HELLO", TENSOR_REQUEST: "TENSOR_REQUEST",
    TENSOR_DESCRIPTOR: "TENSOR_DESCRIPTOR", TENSOR_DATA: "TENSOR_DATA", TENSOR_DATA_END: "TENSOR_DATA_END",
    TENSOR_PUT: "TENSOR_PUT", TENSOR_PUT_ACK: "TENSOR_PUT_ACK", ERROR: "ERROR", PING: "PING", PONG: "PONG",
    RDMA_REGISTER: "RDMA_REGISTER", RDMA_READY: "RDMA_READY",
}


def message_type_name(message_type: int) -> str:
    """A readable name for a message type, ``0x...`` for an unknown one."""
    return MESSAGE_TYPE_NAMES.get(message_type, f"0x{message_type:08X}")


# Error codes (interchange.md § ERROR Payload)
ERR_PROTOCOL_VERSION_MISMATCH = 0x01
ERR_UNKNOWN_TENSOR = 0x02
ERR_LAYOUT_UNAVAILABLE = 0x03
ERR_TRANSCODE_LIMIT_EXCEEDED = 0x04
ERR_DEVICE_UNAVAILABLE = 0x05
ERR_INVALID_MESSAGE = 0x06
ERR_MESSAGE_TOO_LARGE = 0x07
ERR_SHARD_MISMATCH = 0x08
IMPLEMENTATION_ERROR_CODES = range(0xF0, 0xFF)

ERROR_CODE_NAMES = {
    ERR_PROTOCOL_VERSION_MISMATCH: "PROTOCOL_VERSION_MISMATCH", ERR_UNKNOWN_TENSOR: "UNKNOWN_TENSOR",
    ERR_LAYOUT_UNAVAILABLE: "LAYOUT_UNAVAILABLE", ERR_TRANSCODE_LIMIT_EXCEEDED: "TRANSCODE_LIMIT_EXCEEDED",
    ERR_DEVICE_UNAVAILABLE: "DEVICE_UNAVAILABLE", ERR_INVALID_MESSAGE: "INVALID_MESSAGE",
    ERR_MESSAGE_TOO_LARGE: "MESSAGE_TOO_LARGE", ERR_SHARD_MISMATCH: "SHARD_MISMATCH",
}

# Capability flags, a u64 (interchange.md § Capability Flags)
CAP_TRANSCODING = 1 << 0
CAP_PARALLEL_STREAMS = 1 << 1
CAP_RDMA_DATA_PLANE = 1 << 2
CAP_RDMA_GPUDIRECT = 1 << 3
CAP_DEFINED_MASK = 0xF
CAP_RESERVED_MASK = U64_MAX & ~CAP_DEFINED_MASK
"""Bits 4-63: must be zero."""

# Request flags, a u32 (interchange.md § TENSOR_REQUEST Payload, "Request flags")
REQ_ALLOW_TRANSCODE = 1 << 0
REQ_PARALLEL_OK = 1 << 1
REQ_DEFINED_MASK = 0x3
REQ_RESERVED_MASK = U32_MAX & ~REQ_DEFINED_MASK
"""Bits 2-31: must be zero."""

# Device tags (buffer-protocol.md § Device Tags; interchange.md § Device Tags)
DEVICE_CPU = 0x00
DEVICE_CUDA = 0x01
DEVICE_ROCM = 0x02
DEVICE_METAL = 0x03
DEVICE_VULKAN = 0x04
DEVICE_WEBGPU = 0x05
DEVICE_HEXAGON = 0x06
DEVICE_LEVEL_ZERO = 0x07
DEVICE_OPENCL = 0x08

# Memory classes (buffer-protocol.md § Memory Class Values)
MEM_STANDARD = 0x00
MEM_HOST_PINNED = 0x01
MEM_UNIFIED = 0x02
MEM_PEER = 0x03

# Sync modes (buffer-protocol.md § sync_mode Values)
SYNC_PRODUCER_SYNCED = 0x00
SYNC_EVENT = 0x01
SYNC_CONSUMER_STREAM = 0x02

# Layout tags (memory-layout.md § Named Layout Tags)
LAYOUT_ROW_MAJOR = 0x01
LAYOUT_COLUMN_MAJOR = 0x02
LAYOUT_STRIDED = 0x03
LAYOUT_TILED = 0x04
LAYOUT_MORTON = 0x05
LAYOUT_COO = 0x06
LAYOUT_CSR = 0x07
LAYOUT_CSC = 0x08
LAYOUT_CSF = 0x09
LAYOUT_BLOCK_PAGED = 0x0A
LAYOUT_COMPOSITE = 0x0B
LAYOUT_HILBERT = 0x40


def is_extension_layout(tag: int) -> bool:
    """Tags 0xF0-0xFE: implementation-private layouts, which in a layout list carry a
    length-prefixed metadata blob (interchange.md § Layout Entry Encoding)."""
    return 0xF0 <= tag <= 0xFE


# Descriptor flags, a u32 (metadata.md § Flags)
FLAG_HAS_QUANTIZATION = 1 << 0
FLAG_HAS_SHARD = 1 << 1
FLAG_HAS_EXTENSION_TYPE = 1 << 2
FLAG_HAS_STATISTICS = 1 << 3
FLAG_HAS_COMPOSITE_MEMBER = 1 << 4
FLAG_RESERVED_MASK = U32_MAX & ~0x1F

# Composite head values (layouts/composite.md § Head Layout-Specific Fields)
RULE_PARTITION = 0x01
RULE_OVERLAY = 0x02
RULE_GROUP = 0x03
COMBINE_NONE = 0x00
COMBINE_REPLACE = 0x01
COMBINE_ADD = 0x02
OPEN_COMPOSITE_MEMBER_COUNT = U32_MAX
ROLE_CORRECTION = 0x00
ROLE_BASE = 0x01

# Element types: name -> (type_tag, bit width) (element-types.md § Tier 1, § Tier 2)
ELEMENT_TYPES: dict[str, tuple[int, int]] = {
    "float16": (0x01, 16), "bfloat16": (0x02, 16), "float32": (0x03, 32), "float64": (0x04, 64),
    "int8": (0x10, 8), "uint8": (0x11, 8), "int16": (0x12, 16), "uint16": (0x13, 16),
    "int32": (0x14, 32), "uint32": (0x15, 32), "int64": (0x16, 64), "uint64": (0x17, 64),
    "bool": (0x20, 1),
    "float8_e4m3": (0x40, 8), "float8_e5m2": (0x41, 8), "float8_e8m0": (0x42, 8),
    "float4_e2m1": (0x43, 4), "float6_e2m3": (0x44, 6), "float6_e3m2": (0x45, 6),
    "float128": (0x46, 128),
    "int4": (0x48, 4), "uint4": (0x49, 4), "int2": (0x4A, 2), "uint2": (0x4B, 2),
}
TYPE_BITS: dict[int, int] = {tag: bits for tag, bits in ELEMENT_TYPES.values()}
TYPE_NAMES: dict[int, str] = {tag: name for name, (tag, _) in ELEMENT_TYPES.items()}


def type_tag(element_type: Union[int, str]) -> int:
    """The type tag of an element type given by tag or by name (numpy dtype names of
    the types numpy has agree with the spec's names: ``"float32"``, ``"int8"``, ``"bool"``)."""
    if isinstance(element_type, int):
        return element_type
    try:
        return ELEMENT_TYPES[str(element_type)][0]
    except KeyError:
        raise WireFormatError(f"no element type named {element_type!r} in this peer's table") from None


def element_bytes(element_type: Union[int, str], count: int) -> int:
    """Bytes of a contiguous buffer of ``count`` elements (element-types.md § Buffer Size
    Calculation): whole-byte types ``count * bits / 8``; 1/2/4-bit types rounded up to
    whole bytes; the 6-bit types in whole groups of 4 elements per 3 bytes."""
    tag = type_tag(element_type)
    bits = TYPE_BITS.get(tag)
    if bits is None:
        raise WireFormatError(f"element type 0x{tag:02X} has no width in this peer's table")
    if bits == 6:
        return -(-count // 4) * 3
    return -(-count * bits // 8)


def element_count(shape: Sequence[int]) -> int:
    n = 1
    for extent in shape:
        n *= int(extent)
    return n


# ---------------------------------------------------------------------------------------
# Small helpers: length-prefixed strings and a cursor
# ---------------------------------------------------------------------------------------

def _utf8(value: Union[str, bytes]) -> bytes:
    return value if isinstance(value, (bytes, bytearray)) else value.encode("utf-8")


def _u32_bytes(value: Union[str, bytes]) -> bytes:
    raw = bytes(_utf8(value))
    return struct.pack("<I", len(raw)) + raw


class _Cursor:
    """Reads little-endian fields off a bytes object, raising :class:`WireFormatError`
    when the input is too short."""

    def __init__(self, data: bytes, offset: int = 0, what: str = "payload"):
        self.data = memoryview(bytes(data)) if not isinstance(data, memoryview) else data
        self.pos = offset
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise WireFormatError(f"{self.what}: needs {n} bytes at offset {self.pos}, "
                                  f"{len(self.data) - self.pos} left")
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def unpack(self, fmt: str):
        s = struct.Struct("<" + fmt)
        values = s.unpack(self.take(s.size))
        return values[0] if len(values) == 1 else values

    def u8(self) -> int:
        return self.unpack("B")

    def u16(self) -> int:
        return self.unpack("H")

    def u32(self) -> int:
        return self.unpack("I")

    def u64(self) -> int:
        return self.unpack("Q")

    def u64s(self, n: int) -> tuple[int, ...]:
        s = struct.Struct(f"<{n}Q")
        return s.unpack(self.take(s.size))

    def text(self) -> str:
        raw = self.take(self.u32())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireFormatError(f"{self.what}: string is not UTF-8 ({exc})") from None

    def blob(self) -> bytes:
        return self.take(self.u32())

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def finish(self) -> None:
        if self.left:
            raise WireFormatError(f"{self.what}: {self.left} trailing bytes at offset {self.pos}")


def expect_empty(payload: bytes, what: str) -> None:
    """Messages whose payload the spec defines as empty (TENSOR_DATA_END,
    TENSOR_PUT_ACK, RDMA_READY) must have ``payload_length = 0``."""
    if len(payload):
        raise WireFormatError(f"{what} has an empty payload, got {len(payload)} bytes")


# ---------------------------------------------------------------------------------------
# Layout entry lists (interchange.md § Layout Entry Encoding)
# ---------------------------------------------------------------------------------------

class LayoutEntry(NamedTuple):
    """One layout entry: a tag, and for an extension tag its opaque metadata."""

    tag: int
    ext_metadata: Optional[bytes] = None


LayoutLike = Union[int, LayoutEntry, tuple]


def encode_layout_entry(entry: LayoutLike) -> bytes:
    """One entry (interchange.md § Layout Entry Encoding): a u8 tag; a tag in 0xF0-0xFE
    is followed by a u16 ``ext_metadata_length`` and that many bytes (empty if none given)."""
    if isinstance(entry, int):
        tag, meta = entry, None
    else:
        tag, meta = entry[0], (entry[1] if len(entry) > 1 else None)
    out = struct.pack("<B", tag)
    if is_extension_layout(tag):
        meta = bytes(meta or b"")
        out += struct.pack("<H", len(meta)) + meta
    elif meta:
        raise WireFormatError(f"layout tag 0x{tag:02X} is not an extension tag and carries no metadata")
    return out


def encode_layouts(entries: Iterable[LayoutLike]) -> bytes:
    """A layout list: u16 count then the entries (interchange.md § Layout Entry Encoding)."""
    entries = list(entries)
    return struct.pack("<H", len(entries)) + b"".join(encode_layout_entry(e) for e in entries)


def decode_layouts(data: bytes, offset: int = 0, *,
                   understands: Optional[Callable[[int, bytes], bool]] = None,
                   ) -> tuple[list[LayoutEntry], int]:
    """A layout list at ``offset``; returns ``(entries, offset after the list)``.

    Extension entries are advanced over with their ``ext_metadata_length``.  With
    ``understands(tag, metadata)`` given, an extension entry it answers False for is
    skipped (left out of the result) rather than rejected, as interchange.md § Layout
    Entry Encoding requires of a reader; without it every entry is returned."""
    cur = data if isinstance(data, _Cursor) else _Cursor(data, offset, "layout list")
    entries = []
    for _ in range(cur.u16()):
        tag = cur.u8()
        if is_extension_layout(tag):
            meta = cur.take(cur.u16())
            if understands is not None and not understands(tag, meta):
                continue
            entries.append(LayoutEntry(tag, meta))
        else:
            entries.append(LayoutEntry(tag))
    return entries, cur.pos


def _u8_list(values: Iterable[int]) -> bytes:
    values = list(values)
    return struct.pack("<H", len(values)) + bytes(values)


# ---------------------------------------------------------------------------------------
# Session establishment (interchange.md § CLIENT_HELLO Payload, § SERVER_HELLO Payload)
# ---------------------------------------------------------------------------------------

def encode_hello(*, protocol_version: int = PROTOCOL_VERSION, max_message_size: int = 1 << 24,
                 capability_flags: int = 0, layouts: Iterable[LayoutLike] = (LAYOUT_ROW_MAJOR,),
                 devices: Iterable[int] = (DEVICE_CPU,), memory_classes: Iterable[int] = (MEM_STANDARD,),
                 omit_memory_classes: bool = False) -> bytes:
    """CLIENT_HELLO and SERVER_HELLO share one table (interchange.md § CLIENT_HELLO Payload,
    § SERVER_HELLO Payload): protocol_version u32, max_message_size u32, capability_flags u64,
    layouts (u16 count + entries), devices (u16 count + u8s), memory classes (u16 count + u8s).
    ``omit_memory_classes`` leaves the last list out, which the table allows ("if absent")."""
    out = struct.pack("<IIQ", protocol_version, max_message_size, capability_flags)
    out += encode_layouts(layouts) + _u8_list(devices)
    if not omit_memory_classes:
        out += _u8_list(memory_classes)
    return out


encode_client_hello = encode_hello
encode_server_hello = encode_hello


def decode_hello(payload: bytes, *, understands=None) -> dict:
    """The fields of a CLIENT_HELLO or SERVER_HELLO (interchange.md § CLIENT_HELLO Payload).
    An absent memory-class list reads as ``[STANDARD]`` with ``memory_classes_present``
    False, as the table says; bytes after the last list are an error."""
    cur = _Cursor(payload, 0, "HELLO")
    version, max_size, caps = cur.unpack("IIQ")
    layouts, _ = decode_layouts(cur, understands=understands)
    devices = list(cur.take(cur.u16()))
    present = cur.left > 0
    classes = list(cur.take(cur.u16())) if present else []
    cur.finish()
    return {
        "protocol_version": version, "max_message_size": max_size, "capability_flags": caps,
        "layouts": layouts, "devices": devices,
        "memory_classes": classes or [MEM_STANDARD], "memory_classes_present": present,
    }


decode_client_hello = decode_hello
decode_server_hello = decode_hello


# ---------------------------------------------------------------------------------------
# Requests (interchange.md § TENSOR_REQUEST Payload)
# ---------------------------------------------------------------------------------------

def encode_tensor_request(key: Union[str, bytes], layouts: Iterable[LayoutLike] = (),
                          preferred_device: int = DEVICE_CPU, min_alignment: int = 64,
                          request_flags: int = 0) -> bytes:
    """tensor_key (u32 length + UTF-8), preferred_layouts (u16 count + entries),
    preferred_device u8, min_alignment u32, request_flags u32
    (interchange.md § TENSOR_REQUEST Payload)."""
    return (_u32_bytes(key) + encode_layouts(layouts)
            + struct.pack("<BII", preferred_device, min_alignment, request_flags))


def decode_tensor_request(payload: bytes, *, understands=None) -> dict:
    """The fields of a TENSOR_REQUEST (interchange.md § TENSOR_REQUEST Payload)."""
    cur = _Cursor(payload, 0, "TENSOR_REQUEST")
    key = cur.text()
    layouts, _ = decode_layouts(cur, understands=understands)
    device, alignment, flags = cur.unpack("BII")
    cur.finish()
    return {"key": key, "layouts": layouts, "preferred_device": device, "min_alignment": alignment,
            "request_flags": flags}


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


# ---------------------------------------------------------------------------------------
# Data plane (interchange.md § Streaming: Tensor Descriptor and Data Frames; § TENSOR_PUT)
# ---------------------------------------------------------------------------------------

DESCRIPTOR_TRANSPORT = struct.Struct("<QII")
"""total_data_bytes u64, shard_index u32, total_shards u32, after the descriptor
(interchange.md § TENSOR_DESCRIPTOR Payload)."""


def encode_descriptor_message(descriptor: bytes, total_data_bytes: int, shard_index: int = 0,
                              total_shards: int = 1) -> bytes:
    """TENSOR_DESCRIPTOR payload: the descriptor bytes, then total_data_bytes u64,
    shard_index u32, total_shards u32 (interchange.md § TENSOR_DESCRIPTOR Payload)."""
    return bytes(descriptor) + DESCRIPTOR_TRANSPORT.pack(total_data_bytes, shard_index, total_shards)


def decode_descriptor_message(payload: bytes) -> dict:
    """Splits a TENSOR_DESCRIPTOR payload by the descriptor's own ``descriptor_length``
    (bytes 6-9, metadata.md § Fixed Header); exactly 16 transport bytes must follow
    (interchange.md § TENSOR_DESCRIPTOR Payload)."""
    payload = bytes(payload)
    if len(payload) < 10:
        raise WireFormatError(f"TENSOR_DESCRIPTOR payload of {len(payload)} bytes holds no descriptor_length")
    (length,) = struct.unpack_from("<I", payload, 6)
    if length < 20 or length + DESCRIPTOR_TRANSPORT.size != len(payload):
        raise WireFormatError(f"TENSOR_DESCRIPTOR payload of {len(payload)} bytes does not hold a "
                              f"{length}-byte descriptor plus {DESCRIPTOR_TRANSPORT.size} transport bytes")
    total, index, shards = DESCRIPTOR_TRANSPORT.unpack_from(payload, length)
    return {"descriptor": payload[:length], "total_data_bytes": total, "shard_index": index,
            "total_shards": shards}


def encode_tensor_data(byte_offset_in_buffer: int, data: bytes) -> bytes:
    """TENSOR_DATA payload: byte_offset_in_buffer u64 then the bytes
    (interchange.md § TENSOR_DATA Payload)."""
    return struct.pack("<Q", byte_offset_in_buffer) + bytes(data)


def decode_tensor_data(payload: bytes) -> tuple[int, bytes]:
    """``(byte_offset_in_buffer, data)`` of a TENSOR_DATA payload (interchange.md
    § TENSOR_DATA Payload); the data are the ``payload_length - 8`` bytes after the offset."""
    if len(payload) < 8:
        raise WireFormatError(f"TENSOR_DATA payload of {len(payload)} bytes has no byte_offset_in_buffer")
    (offset,) = struct.unpack_from("<Q", payload, 0)
    return offset, bytes(payload[8:])


def encode_tensor_put(key: Union[str, bytes], descriptor: bytes, total_data_bytes: int) -> bytes:
    """TENSOR_PUT payload: tensor_key (u32 length + UTF-8), descriptor (u32 length + bytes),
    total_data_bytes u64 (interchange.md § TENSOR_PUT Payload)."""
    return _u32_bytes(key) + _u32_bytes(bytes(descriptor)) + struct.pack("<Q", total_data_bytes)


def decode_tensor_put(payload: bytes) -> dict:
    """The fields of a TENSOR_PUT (interchange.md § TENSOR_PUT Payload)."""
    cur = _Cursor(payload, 0, "TENSOR_PUT")
    key = cur.text()
    descriptor = cur.blob()
    total = cur.u64()
    cur.finish()
    return {"key": key, "descriptor": descriptor, "total_data_bytes": total}


def encode_error(error_code: int, message: Union[str, bytes] = "") -> bytes:
    """ERROR payload: error_code u32, message (u32 length + UTF-8)
    (interchange.md § ERROR Payload)."""
    return struct.pack("<I", error_code) + _u32_bytes(message)


def decode_error(payload: bytes) -> tuple[int, str]:
    """``(error_code, message)`` of an ERROR payload (interchange.md § ERROR Payload)."""
    cur = _Cursor(payload, 0, "ERROR")
    code = cur.u32()
    message = cur.text()
    cur.finish()
    return code, message


def encode_rdma_register(remote_addr: int, length: int, rkey: bytes) -> bytes:
    """RDMA_REGISTER payload: remote_addr u64, length u64, rkey (u32 length + bytes)
    (interchange.md § RDMA_REGISTER Payload)."""
    return struct.pack("<QQ", remote_addr, length) + _u32_bytes(bytes(rkey))


def decode_rdma_register(payload: bytes) -> dict:
    """The fields of an RDMA_REGISTER (interchange.md § RDMA_REGISTER Payload)."""
    cur = _Cursor(payload, 0, "RDMA_REGISTER")
    addr, length = cur.unpack("QQ")
    rkey = cur.blob()
    cur.finish()
    return {"remote_addr": addr, "length": length, "rkey": rkey}


# Messages with an empty payload: TENSOR_DATA_END (interchange.md § TENSOR_DATA_END Payload),
# TENSOR_PUT_ACK (§ TENSOR_PUT_ACK Payload), RDMA_READY (§ RDMA_READY Payload).
def encode_data_end() -> bytes:
    return b""


def encode_put_ack() -> bytes:
    return b""


def encode_rdma_ready() -> bytes:
    return b""


def encode_ping(payload: bytes = b"") -> bytes:
    """PING / PONG payload.  interchange.md § Message Types lists them as keepalives and
    gives no payload table; this peer sends whatever bytes it is given (empty by default)."""
    return bytes(payload)


# ---------------------------------------------------------------------------------------
# Tensor descriptors (metadata.md; buffer-protocol.md § Buffer Handle;
# layouts/composite.md § Head Layout-Specific Fields)
# ---------------------------------------------------------------------------------------

MAGIC = b"HRRY"
FIXED_HEADER = struct.Struct("<4sBBIIBBI")
"""magic, version_major, version_minor, descriptor_length, flags, type_tag, layout_tag,
rank: 20 bytes (metadata.md § Fixed Header)."""
BUFFER_HANDLE = struct.Struct("<QIBBBB")
"""byte_size u64, alignment u32, device_tag u8, sync_mode u8, memory_class u8, reserved u8:
16 bytes (buffer-protocol.md § Buffer Handle)."""
COMPOSITE_HEAD = struct.Struct("<BBHI")
"""composition_rule u8, combine_op u8, reserved u8[2] (read here as one u16), member_count
u32: 8 bytes (layouts/composite.md § Head Layout-Specific Fields)."""
STATISTICS_SIZE = 72  # metadata.md § Statistics Section
EXTENSION_TYPE_SIZE = 20  # metadata.md § Extension Type Section
COMPOSITE_MEMBER_SIZE = 16  # metadata.md § Composite Member Section


class BufferSpec(NamedTuple):
    """One 16-byte buffer handle (buffer-protocol.md § Buffer Handle)."""

    byte_size: int
    alignment: int = 64
    device_tag: int = DEVICE_CPU
    sync_mode: int = SYNC_PRODUCER_SYNCED
    memory_class: int = MEM_STANDARD
    reserved: int = 0

    def encode(self) -> bytes:
        return BUFFER_HANDLE.pack(self.byte_size, self.alignment, self.device_tag, self.sync_mode,
                                  self.memory_class, self.reserved)


class ShardSpec(NamedTuple):
    """The shard section: parent_shape then shard_offset, u64[rank] each
    (metadata.md § Shard Section)."""

    parent_shape: tuple
    shard_offset: tuple


class CompositeHead(NamedTuple):
    """The composite head's layout-specific fields (layouts/composite.md § Head
    Layout-Specific Fields)."""

    composition_rule: int
    combine_op: int
    reserved: int
    member_count: int


def _u64s(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *[int(v) for v in values])


def build_descriptor(element_type: Union[int, str], shape: Sequence[int], *,
                     layout_tag: int = LAYOUT_ROW_MAJOR, byte_offset: int = 0,
                     layout_fields: bytes = b"", buffers: Iterable[BufferSpec] = (),
                     quantization: Optional[bytes] = None, shard: Optional[Sequence] = None,
                     statistics: Optional[bytes] = None, extension_type: Optional[bytes] = None,
                     member_role: Optional[int] = None, member_reserved: bytes = bytes(15),
                     extra_flags: int = 0, flags: Optional[int] = None, version: tuple = (1, 0),
                     descriptor_length: Optional[int] = None, magic: bytes = MAGIC) -> bytes:
    """A tensor descriptor, section by section as metadata.md § Overall Descriptor Structure
    orders them: fixed header, shape, byte_offset, layout-specific fields, buffer table,
    then the optional quantization, shard, statistics, extension type and composite member
    sections.  Flags are derived from the sections given (metadata.md § Flags), OR-ed with
    ``extra_flags``, unless ``flags`` overrides them; ``descriptor_length`` and ``magic``
    can be overridden to build broken descriptors."""
    shape = tuple(int(s) for s in shape)
    derived = extra_flags
    tail = b""
    if quantization is not None:
        derived |= FLAG_HAS_QUANTIZATION
        tail += _u32_bytes(bytes(quantization))
    if shard is not None:
        parent_shape, shard_offset = shard
        derived |= FLAG_HAS_SHARD
        tail += _u64s(parent_shape) + _u64s(shard_offset)
    if statistics is not None:
        derived |= FLAG_HAS_STATISTICS
        tail += bytes(statistics)
    if extension_type is not None:
        derived |= FLAG_HAS_EXTENSION_TYPE
        tail += bytes(extension_type)
    if member_role is not None:
        derived |= FLAG_HAS_COMPOSITE_MEMBER
        tail += struct.pack("<B", member_role) + bytes(member_reserved)
    buffers = list(buffers)
    body = (_u64s(shape) + struct.pack("<Q", byte_offset) + bytes(layout_fields)
            + struct.pack("<B", len(buffers)) + b"".join(BufferSpec(*b).encode() for b in buffers) + tail)
    length = FIXED_HEADER.size + len(body) if descriptor_length is None else descriptor_length
    header = FIXED_HEADER.pack(magic, version[0], version[1], length, derived if flags is None else flags,
                               type_tag(element_type), layout_tag, len(shape))
    return header + body


def dense_descriptor(element_type: Union[int, str], shape: Sequence[int], *,
                     layout_tag: int = LAYOUT_ROW_MAJOR, alignment: int = 64,
                     device_tag: int = DEVICE_CPU, memory_class: int = MEM_STANDARD,
                     sync_mode: int = SYNC_PRODUCER_SYNCED, byte_size: Optional[int] = None,
                     shard: Optional[Sequence] = None, member_role: Optional[int] = None) -> bytes:
    """A dense tensor of one buffer (metadata.md § Buffer Table: a dense layout without
    quantization has exactly one), its ``byte_size`` the contiguous size of the shape
    (element-types.md § Buffer Size Calculation) unless given; a shape with a zero extent
    makes an empty tensor with a 0-byte buffer (data-model.md § Empty Tensors)."""
    if byte_size is None:
        byte_size = element_bytes(element_type, element_count(shape))
    buffer = BufferSpec(byte_size, alignment, device_tag, sync_mode, memory_class)
    return build_descriptor(element_type, shape, layout_tag=layout_tag, buffers=[buffer], shard=shard,
                            member_role=member_role)


def composite_head(element_type: Union[int, str], shape: Sequence[int], composition_rule: int,
                   member_count: int, *, combine_op: int = COMBINE_NONE, reserved: int = 0,
                   shard: Optional[Sequence] = None, buffers: Iterable[BufferSpec] = (),
                   byte_offset: int = 0) -> bytes:
    """A composite head (layouts/composite.md § Head Descriptor): layout 0x0B, the 8 bytes of
    § Head Layout-Specific Fields, no buffer, byte_offset 0; ``shard`` when the head is
    itself a member of a partition or overlay."""
    fields = COMPOSITE_HEAD.pack(composition_rule, combine_op, reserved, member_count)
    return build_descriptor(element_type, shape, layout_tag=LAYOUT_COMPOSITE, layout_fields=fields,
                            buffers=buffers, shard=shard, byte_offset=byte_offset)


def partition_head(element_type, shape, member_count, **kw) -> bytes:
    return composite_head(element_type, shape, RULE_PARTITION, member_count, **kw)


def group_head(element_type, shape, member_count, **kw) -> bytes:
    return composite_head(element_type, shape, RULE_GROUP, member_count, **kw)


def split_rows(extent: int, pieces: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``pieces`` slices of ``extent`` rows, sizes differing by at most
    one, the larger first."""
    base, extra = divmod(extent, pieces)
    out, start = [], 0
    for i in range(pieces):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def dim0_boxes(shape: Sequence[int], pieces: int) -> list[tuple[tuple, tuple]]:
    """``(offset, shape)`` boxes cutting ``shape`` along dimension 0 into ``pieces``."""
    shape = tuple(shape)
    return [((start,) + (0,) * (len(shape) - 1), (stop - start,) + shape[1:])
            for start, stop in split_rows(shape[0], pieces)]


def partition_descriptors(element_type, shape: Sequence[int], boxes, **member_kw) -> list[bytes]:
    """Head then one row-major member per ``(offset, shape)`` box, each member with the
    shard section a partition member must carry (layouts/composite.md § Members › Shard
    section) and no composite member section (§ Composite Member Section)."""
    shape = tuple(int(s) for s in shape)
    out = [partition_head(element_type, shape, len(boxes))]
    for offset, box in boxes:
        out.append(dense_descriptor(element_type, box, shard=(shape, tuple(offset)), **member_kw))
    return out


@dataclass
class ParsedDescriptor:
    """A descriptor read by :func:`parse_descriptor`; field names follow metadata.md."""

    version: tuple
    descriptor_length: int
    flags: int
    type_tag: int
    layout_tag: int
    rank: int
    shape: tuple
    byte_offset: int
    layout_fields: bytes
    buffers: list = field(default_factory=list)
    composite: Optional[CompositeHead] = None
    quantization: Optional[bytes] = None
    shard: Optional[ShardSpec] = None
    statistics: Optional[bytes] = None
    extension_type: Optional[bytes] = None
    member_role: Optional[int] = None
    member_reserved: Optional[bytes] = None
    parsed_length: int = 0

    @property
    def is_composite_head(self) -> bool:
        return self.layout_tag == LAYOUT_COMPOSITE

    @property
    def member_count(self) -> int:
        """The head's member_count; 0 for a tensor that is not a composite head."""
        return self.composite.member_count if self.composite else 0

    @property
    def buffer_sizes(self) -> list[int]:
        return [b.byte_size for b in self.buffers]

    @property
    def device_tags(self) -> list[int]:
        return [b.device_tag for b in self.buffers]

    @property
    def total_buffer_bytes(self) -> int:
        return sum(self.buffer_sizes)

    @property
    def element_count(self) -> int:
        return element_count(self.shape)


def _layout_fields_size(tag: int, rank: int, cur: _Cursor) -> int:
    """Byte size of the layout-specific fields this peer can delimit (metadata.md
    § Layout-Specific Fields); other layouts raise."""
    if tag in (LAYOUT_ROW_MAJOR, LAYOUT_COLUMN_MAJOR):
        return 0
    if tag == LAYOUT_STRIDED:
        return 8 * rank
    if tag == LAYOUT_MORTON:
        return 4 * rank
    if tag in (LAYOUT_COO, LAYOUT_CSR, LAYOUT_CSC):
        return 16
    if tag in (LAYOUT_COMPOSITE, LAYOUT_HILBERT):
        return 8
    if is_extension_layout(tag):
        if cur.left < 12:
            raise WireFormatError("extension layout fields are cut short")
        (length,) = struct.unpack_from("<I", cur.data, cur.pos + 8)
        return 12 + length
    raise WireFormatError(f"layout 0x{tag:02X} is beyond this peer's minimal descriptor reader")


def parse_descriptor(data: bytes, offset: int = 0, *, strict: bool = True) -> ParsedDescriptor:
    """Reads the descriptor at ``offset`` (metadata.md § Overall Descriptor Structure).

    ``strict`` checks what every reader must: the magic, ``descriptor_length >= 20`` and
    within the input, no reserved flag bit, the sections ending exactly at
    ``descriptor_length``, zero reserved bytes in buffer handles, and a composite head's
    ``buffer_count = 0`` and ``byte_offset = 0`` (layouts/composite.md § Head Descriptor).
    Without ``strict`` it reads what is there and stops at ``descriptor_length``."""
    data = bytes(data)
    if len(data) - offset < FIXED_HEADER.size:
        raise WireFormatError(f"descriptor: {len(data) - offset} bytes, the fixed header alone is 20")
    magic, major, minor, length, flags, ttag, ltag, rank = FIXED_HEADER.unpack_from(data, offset)
    if strict:
        if magic != MAGIC:
            raise WireFormatError(f"descriptor magic {magic!r}, expected {MAGIC!r}")
        if length < FIXED_HEADER.size:
            raise WireFormatError(f"descriptor_length {length} < 20")
        if flags & FLAG_RESERVED_MASK:
            raise WireFormatError(f"descriptor flags 0x{flags:08X} set reserved bits")
    if offset + length > len(data):
        raise WireFormatError(f"descriptor_length {length} runs past the {len(data) - offset} bytes given")
    cur = _Cursor(data[offset:offset + length], FIXED_HEADER.size, "descriptor")
    if rank > cur.left // 8:
        raise WireFormatError(f"rank {rank} does not fit in descriptor_length {length}")
    shape = cur.u64s(rank)
    byte_offset = cur.u64()
    layout_fields = cur.take(_layout_fields_size(ltag, rank, cur))
    composite = CompositeHead(*COMPOSITE_HEAD.unpack(layout_fields)) if ltag == LAYOUT_COMPOSITE else None
    buffers = [BufferSpec(*cur.unpack("QIBBBB")) for _ in range(cur.u8())]
    out = ParsedDescriptor(version=(major, minor), descriptor_length=length, flags=flags, type_tag=ttag,
                           layout_tag=ltag, rank=rank, shape=shape, byte_offset=byte_offset,
                           layout_fields=layout_fields, buffers=buffers, composite=composite)
    if flags & FLAG_HAS_QUANTIZATION:
        out.quantization = cur.blob()
    if flags & FLAG_HAS_SHARD:
        out.shard = ShardSpec(cur.u64s(rank), cur.u64s(rank))
    if flags & FLAG_HAS_STATISTICS:
        out.statistics = cur.take(STATISTICS_SIZE)
    if flags & FLAG_HAS_EXTENSION_TYPE:
        out.extension_type = cur.take(EXTENSION_TYPE_SIZE)
    if flags & FLAG_HAS_COMPOSITE_MEMBER:
        out.member_role = cur.u8()
        out.member_reserved = cur.take(COMPOSITE_MEMBER_SIZE - 1)
    out.parsed_length = cur.pos
    if strict:
        if cur.left:
            raise WireFormatError(f"descriptor sections end at {cur.pos}, descriptor_length is {length}")
        for i, b in enumerate(buffers):
            if b.reserved:
                raise WireFormatError(f"buffer {i} reserved byte is 0x{b.reserved:02X}")
        if composite is not None and (buffers or byte_offset):
            raise WireFormatError("a composite head has buffer_count 0 and byte_offset 0")
    return out


def descriptor_length_of(data: bytes, offset: int = 0) -> int:
    """``descriptor_length`` from bytes 6-9 (metadata.md § Fixed Header)."""
    (length,) = struct.unpack_from("<I", data, offset + 6)
    return length


# ---------------------------------------------------------------------------------------
# Box geometry (layouts/composite.md § Partition; interchange.md § Shard Consistency)
# ---------------------------------------------------------------------------------------

def boxes_overlap(a_offset, a_shape, b_offset, b_shape) -> bool:
    """Two boxes overlap when their half-open ranges intersect along every dimension
    (layouts/composite.md § Partition, "Non-overlap constraint")."""
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_offset, a_shape, b_offset, b_shape))


def cover_verdict(parent_shape: Sequence[int], boxes) -> str:
    """``"ok"`` when ``(offset, shape)`` boxes tile ``parent_shape`` exactly, else
    ``"out_of_bounds"``, ``"overlap"`` or ``"gap"``.  In-bounds boxes without pairwise
    overlap cover everything exactly when their volumes add up to the parent's."""
    parent_shape = tuple(parent_shape)
    boxes = [(tuple(o), tuple(s)) for o, s in boxes]
    for offset, shape in boxes:
        if len(offset) != len(parent_shape) or len(shape) != len(parent_shape) or any(
                o + s > p for o, s, p in zip(offset, shape, parent_shape)):
            return "out_of_bounds"
    nonempty = [b for b in boxes if element_count(b[1])]
    for i, (ao, as_) in enumerate(nonempty):
        for bo, bs in nonempty[i + 1:]:
            if boxes_overlap(ao, as_, bo, bs):
                return "overlap"
    if sum(element_count(s) for _, s in nonempty) != element_count(parent_shape):
        return "gap"
    return "ok"
