"""One container fault, one rule id, one byte offset -- whichever entry point finds it.

The companion of ``test_composite_verdicts.py`` for faults of the containers themselves:
a bare stream, a message stream or a file of two plain tensors is damaged in one place
(cut short inside a descriptor or a buffer, a descriptor magic broken mid-stream, a
message cut or out of order, a trailer magic, an index CRC, overlapping index entries,
...) and read by the strict reader (``read_stream`` in its framing, ``read_file``) and by
``audit``.  The reader's first violation and the first error the audit reports must be
the same rule at the same byte, and the audit must not name the fault a second time
under another rule.

Expected offsets are not taken from the code under test: they are typed from the spec's
tables (the 20-byte descriptor fixed header with ``descriptor_length`` at 6,
``metadata.md § Fixed Header``; the 12-byte message header, ``interchange.md § Message
Framing``; the 40-byte trailer and the index entry fields, ``file-format.md § Trailer``,
``§ Index Encoding``), and a descriptor is found by searching the container for its
encoded bytes.
"""

from __future__ import annotations

import io
import struct
from typing import Callable, NamedTuple, Optional

import pytest

from fuzz.mutate import refresh_index_crc
from hurray_schema import audit
from hurray_schema.codec import encode_descriptor
from hurray_schema.errors import HurraySchemaError, LimitExceeded, SpecViolation
from hurray_schema.io import Tensor, read_file, read_stream, write_file, write_stream
from hurray_schema.limits import Limits
from hurray_schema.model import ElementType

F32 = ElementType.FLOAT32

# metadata.md § Fixed Header
DESCRIPTOR_HEADER_BYTES, DESCRIPTOR_LENGTH_AT = 20, 6
# interchange.md § Message Framing, § Message Types
MESSAGE_HEADER_BYTES, STREAM_ID_AT, PAYLOAD_LENGTH_AT = 12, 4, 8
TENSOR_DESCRIPTOR, TENSOR_DATA, TENSOR_DATA_END = 4, 5, 6
# file-format.md § Trailer, § Index Encoding
TRAILER_BYTES, INDEX_OFFSET_AT, INDEX_LENGTH_AT, INDEX_CRC_AT, TRAILER_MAGIC_AT = 40, 0, 8, 28, 36
NAME_LENGTH_BYTES = 2  # then the name, then descriptor_offset (u64) and descriptor_length (u32)
ENTRY_DESCRIPTOR_LENGTH_AT = 8  # from the end of the name


def tensors() -> list[Tensor]:
    return [Tensor.dense(F32, [3], struct.pack("<3f", 1, 2, 3)),
            Tensor.dense(F32, [2, 2], struct.pack("<4f", 1, 2, 3, 4))]


def bare() -> bytes:
    return write_stream(None, tensors())


def messages() -> bytes:
    return write_stream(None, tensors(), framing="messages")


def hrry(tmp_path) -> bytes:
    path = tmp_path / "clean.hrry"
    write_file(path, {"a": tensors()[0], "b": tensors()[1]}, metadata={"k": "v"})
    return path.read_bytes()


def descriptor_at(data: bytes, index: int) -> int:
    """Where the ``index``-th tensor's descriptor starts in ``data``."""
    return data.index(encode_descriptor(tensors()[index].descriptor))


def message_starts(data: bytes) -> list[tuple[int, int]]:
    """``(offset, message_type)`` of every message, from the headers' own fields."""
    found, pos = [], 0
    while pos + MESSAGE_HEADER_BYTES <= len(data):
        kind, _stream, length = struct.unpack_from("<3I", data, pos)
        found.append((pos, kind))
        pos += MESSAGE_HEADER_BYTES + length
    return found


def first_message(data: bytes, kind: int, nth: int = 0) -> int:
    return [at for at, k in message_starts(data) if k == kind][nth]


def put_u32(data: bytes, at: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, at, value)
    return bytes(out)


def put_u64(data: bytes, at: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<Q", out, at, value)
    return bytes(out)


def xor(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


def entry_name_end(data: bytes, name: str) -> int:
    """Where the index entry of ``name`` has its name end (its fixed fields follow)."""
    (index_at,) = struct.unpack_from("<Q", data, len(data) - TRAILER_BYTES + INDEX_OFFSET_AT)
    encoded = name.encode()
    at = data.index(struct.pack("<H", len(encoded)) + encoded, index_at)
    return at + NAME_LENGTH_BYTES + len(encoded)


# --------------------------------------------------------------------------------------
# The faults: damaged bytes and the (rule id, offset) the spec gives them
# --------------------------------------------------------------------------------------


class Fault(NamedTuple):
    container: str
    """``bare``, ``messages`` or ``file``."""
    damage: Callable[[bytes], tuple[bytes, str, int]]
    """From the clean container: the damaged bytes, the rule id, the offset."""


def _cut(at: Callable[[bytes], int], rule: str = "stream.truncated"):
    """Cut the input at ``at(data)``: the fault is where the bytes end."""
    def damage(data):
        n = at(data)
        return data[:n], rule, n
    return damage


def _bare_magic(data):
    at = descriptor_at(data, 1)
    return xor(data, at), "descriptor.magic", at


def _bare_length_minimum(data):
    at = descriptor_at(data, 1)
    return put_u32(data, at + DESCRIPTOR_LENGTH_AT, DESCRIPTOR_HEADER_BYTES - 1), "descriptor.length.minimum", \
        at + DESCRIPTOR_LENGTH_AT


def _bare_length_past_end(data):
    at = descriptor_at(data, 1)
    return put_u32(data, at + DESCRIPTOR_LENGTH_AT, len(data)), "stream.truncated", len(data)


def _file_as_stream(_data):
    return FILE_BYTES[0], "descriptor.magic", 0


def _messages_order(data):
    at = first_message(data, TENSOR_DATA)
    return data[at:], "stream.message.order", 0  # TENSOR_DATA before any TENSOR_DESCRIPTOR


def _messages_end_first(data):
    at = first_message(data, TENSOR_DATA_END)
    return data[at:], "stream.message.order", 0


def _messages_descriptor_length(data):
    """The descriptor inside the TENSOR_DESCRIPTOR payload claims 8 more bytes than the
    payload holds: the message's payload_length is then wrong for its descriptor."""
    at = MESSAGE_HEADER_BYTES + DESCRIPTOR_LENGTH_AT
    (length,) = struct.unpack_from("<I", data, at)
    return put_u32(data, at, length + 8), "stream.descriptor.payload", PAYLOAD_LENGTH_AT


def _messages_payload_short(data):
    (length,) = struct.unpack_from("<I", data, PAYLOAD_LENGTH_AT)
    return put_u32(data, PAYLOAD_LENGTH_AT, length - 4), "stream.descriptor.payload", PAYLOAD_LENGTH_AT


def _messages_magic(data):
    at = MESSAGE_HEADER_BYTES
    return xor(data, at), "descriptor.magic", at


def _messages_magic_second(data):
    at = first_message(data, TENSOR_DESCRIPTOR, 1) + MESSAGE_HEADER_BYTES
    return xor(data, at), "descriptor.magic", at


def _messages_stream_id(data):
    at = first_message(data, TENSOR_DATA) + STREAM_ID_AT
    return put_u32(data, at, 0), "stream.message.stream_id", at


def _trailer_field(data, at):
    return len(data) - TRAILER_BYTES + at


def _file_trailer_magic(data):
    at = _trailer_field(data, TRAILER_MAGIC_AT)
    return xor(data, at), "file.trailer.magic", at


def _file_truncated(data):
    short = data[:-300]
    return short, "file.trailer.magic", _trailer_field(short, TRAILER_MAGIC_AT)


def _file_index_crc(data):
    at = _trailer_field(data, INDEX_CRC_AT)
    return xor(data, at), "file.index.crc", at


def _file_index_byte(data):
    """A byte of the index itself changes (the second entry's name): the CRC no longer matches."""
    return xor(data, entry_name_end(data, "b") - 1), "file.index.crc", _trailer_field(data, INDEX_CRC_AT)


def _file_index_overlap(data):
    """Entry "b" points at the descriptor of "a" (index CRC refreshed)."""
    (a_at,) = struct.unpack_from("<Q", data, entry_name_end(data, "a"))
    at = entry_name_end(data, "b")
    return refresh_index_crc(put_u64(data, at, a_at)), "file.index.overlap", at


def _file_index_descriptor_length(data):
    at = entry_name_end(data, "b") + ENTRY_DESCRIPTOR_LENGTH_AT
    (length,) = struct.unpack_from("<I", data, at)
    return refresh_index_crc(put_u32(data, at, length + 8)), "file.index.descriptor_length", at


def _file_index_past_trailer(data):
    at = _trailer_field(data, INDEX_LENGTH_AT)
    return put_u64(data, at, len(data)), "file.index.bounds", _trailer_field(data, INDEX_OFFSET_AT)


FILE_BYTES: list[bytes] = []  # the clean file, for the one bare-stream fault that is a file


FAULTS = {
    "bare: truncated inside the first fixed header": Fault("bare", _cut(lambda d: 10)),
    "bare: truncated inside the first descriptor": Fault("bare", _cut(lambda d: DESCRIPTOR_HEADER_BYTES + 5)),
    "bare: truncated inside a buffer": Fault("bare", _cut(lambda d: descriptor_at(d, 1) - 5)),
    "bare: truncated inside the second fixed header": Fault("bare", _cut(lambda d: descriptor_at(d, 1) + 3)),
    "bare: truncated inside the second descriptor": Fault(
        "bare", _cut(lambda d: descriptor_at(d, 1) + DESCRIPTOR_HEADER_BYTES + 4)),
    "bare: truncated inside the last buffer": Fault("bare", _cut(lambda d: len(d) - 1)),
    "bare: descriptor_length past the end": Fault("bare", _bare_length_past_end),
    "bare: bad descriptor magic mid-stream": Fault("bare", _bare_magic),
    "bare: descriptor_length below the fixed header": Fault("bare", _bare_length_minimum),
    "bare: a file read as a stream": Fault("bare", _file_as_stream),
    "messages: truncated inside a message header": Fault("messages", _cut(lambda d: 5, "stream.message.truncated")),
    "messages: truncated inside a payload": Fault(
        "messages", _cut(lambda d: first_message(d, TENSOR_DATA) + MESSAGE_HEADER_BYTES + 3,
                         "stream.message.truncated")),
    "messages: TENSOR_DATA_END missing": Fault("messages", _cut(lambda d: len(d) - MESSAGE_HEADER_BYTES)),
    "messages: TENSOR_DATA before a descriptor": Fault("messages", _messages_order),
    "messages: TENSOR_DATA_END before a descriptor": Fault("messages", _messages_end_first),
    "messages: descriptor longer than its payload": Fault("messages", _messages_descriptor_length),
    "messages: payload shorter than its descriptor": Fault("messages", _messages_payload_short),
    "messages: bad descriptor magic": Fault("messages", _messages_magic),
    "messages: bad descriptor magic in the second tensor": Fault("messages", _messages_magic_second),
    "messages: reserved stream_id": Fault("messages", _messages_stream_id),
    "file: trailer magic": Fault("file", _file_trailer_magic),
    "file: truncated": Fault("file", _file_truncated),
    "file: index CRC field": Fault("file", _file_index_crc),
    "file: index byte under the CRC": Fault("file", _file_index_byte),
    "file: index entries overlap": Fault("file", _file_index_overlap),
    "file: index descriptor_length": Fault("file", _file_index_descriptor_length),
    "file: index past the trailer": Fault("file", _file_index_past_trailer),
}


# --------------------------------------------------------------------------------------
# The entry points
# --------------------------------------------------------------------------------------


def read_verdict(data: bytes, container: str, tmp_path) -> tuple[str, Optional[int]]:
    """The strict reader's violation: the whole stream iterated, or the file opened."""
    with pytest.raises(SpecViolation) as info:
        if container == "file":
            path = tmp_path / "damaged.hrry"
            path.write_bytes(data)
            read_file(path).close()
        else:
            for _ in read_stream(data, framing=container):
                pass
    return info.value.rule_id, info.value.offset


def audit_errors(data: bytes, container: str, tmp_path) -> list[tuple[str, Optional[int]]]:
    """The MUST-level findings of ``audit``, in report order."""
    if container == "file":
        path = tmp_path / "audited.hrry"
        path.write_bytes(data)
        report = audit(path)
    else:
        report = audit(data, kind="stream" if container == "bare" else "messages")
    return [(f.rule_id, f.offset) for f in report.findings if f.is_error]


def clean(container: str, tmp_path) -> bytes:
    return {"bare": bare, "messages": messages}[container]() if container != "file" else hrry(tmp_path)


@pytest.mark.parametrize("name", list(FAULTS))
def test_one_rule_one_offset(name, tmp_path):
    fault = FAULTS[name]
    if not FILE_BYTES:
        FILE_BYTES.append(hrry(tmp_path))
    damaged, rule_id, offset = fault.damage(clean(fault.container, tmp_path))
    want = (rule_id, offset)
    assert read_verdict(damaged, fault.container, tmp_path) == want
    errors = audit_errors(damaged, fault.container, tmp_path)
    assert errors[:1] == [want]
    # the audit names the fault once: no other rule at the fault's offset
    assert [e for e in errors if e[1] == offset] == [want]


@pytest.mark.parametrize("container", ["bare", "messages", "file"])
def test_the_clean_containers_pass(container, tmp_path):
    data = clean(container, tmp_path)
    assert audit_errors(data, container, tmp_path) == []
    if container == "file":
        path = tmp_path / "clean.hrry"
        with read_file(path) as f:
            assert sorted(f.keys()) == ["a", "b"]
    else:
        assert len(list(read_stream(data, framing=container))) == 2


def test_an_empty_bare_stream_holds_zero_tensors():
    """``interchange.md § Scope``: a stream holds zero or more tensors; an empty one is
    read as none and audited clean (a lone descriptor that is empty is truncated)."""
    assert list(read_stream(b"")) == []
    assert audit(b"", kind="stream").ok
    assert [f.rule_id for f in audit(b"", kind="descriptor").findings] == ["descriptor.truncated"]


def test_a_lone_descriptor_is_not_a_stream_missing_its_buffers():
    """The same bytes, two questions: as a descriptor they are complete; as a bare stream
    the buffer the descriptor announces never arrives (``stream.truncated`` at the end)."""
    desc = encode_descriptor(tensors()[0].descriptor)
    assert audit(desc, kind="descriptor").ok
    assert audit_errors(desc, "bare", None) == [("stream.truncated", len(desc))]
    with pytest.raises(SpecViolation) as info:
        list(read_stream(desc))
    assert (info.value.rule_id, info.value.offset) == ("stream.truncated", len(desc))


@pytest.mark.parametrize("as_file", [False, True], ids=["bytes", "file object"])
def test_a_cut_descriptor_is_truncated_before_the_descriptor_limit(as_file):
    """A descriptor cut off by the end of the stream is ``stream.truncated`` (what audit,
    which sets no limit, says too) as long as the stream ends within
    ``max_descriptor_bytes``; past that the reader stops at the limit without reading on."""
    data = bare()
    second = descriptor_at(data, 1)
    length_at = second + DESCRIPTOR_LENGTH_AT
    (length,) = struct.unpack_from("<I", data, length_at)

    def verdict(stream: bytes, limit: int):
        source = io.BytesIO(stream) if as_file else stream
        with pytest.raises(HurraySchemaError) as info:
            list(read_stream(source, limits=Limits(max_descriptor_bytes=limit)))
        return getattr(info.value, "rule_id", None) or f"limit.{info.value.limit}", info.value.offset

    cut = data[: second + length - 1]
    assert verdict(cut, length) == ("stream.truncated", len(cut))
    assert verdict(cut, length - 1) == ("stream.truncated", len(cut))  # the stream ends within the limit
    assert verdict(cut, length - 2) == ("limit.max_descriptor_bytes", length_at)  # the limit comes first
    assert audit_errors(cut, "bare", None) == [("stream.truncated", len(cut))]


def test_a_message_past_the_message_limit_is_reported_by_audit():
    """The reader stops at ``max_message_bytes`` before reading the payload; audit of the
    same message stream reports that stop, not a clean stream."""
    data = put_u32(messages(), PAYLOAD_LENGTH_AT, 2**32 - 1)
    with pytest.raises(LimitExceeded) as info:
        list(read_stream(data, framing="messages"))
    assert (info.value.limit, info.value.offset) == ("max_message_bytes", PAYLOAD_LENGTH_AT)
    assert audit_errors(data, "messages", None)[:1] == [("limit.max_message_bytes", PAYLOAD_LENGTH_AT)]


def test_audit_of_messages_lists_the_readers_stop_first():
    """Two faults: a reserved stream_id in the first TENSOR_DATA, a broken magic in the
    second descriptor.  The reader stops at the first; audit reports both, that one first."""
    data = messages()
    stream_id_at = first_message(data, TENSOR_DATA) + STREAM_ID_AT
    magic_at = first_message(data, TENSOR_DESCRIPTOR, 1) + MESSAGE_HEADER_BYTES
    damaged = xor(put_u32(data, stream_id_at, 0), magic_at)
    assert read_verdict(damaged, "messages", None) == ("stream.message.stream_id", stream_id_at)
    assert audit_errors(damaged, "messages", None) == [("stream.message.stream_id", stream_id_at),
                                                        ("descriptor.magic", magic_at)]
