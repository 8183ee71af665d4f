"""Container vectors: bare streams, message streams and ``.hrry`` files.

A clean container of two small tensors is written by the project's writers; the fault
is then one field changed, one message removed or the input cut, every place found by
the located walks (:mod:`hurray_schema.io.walk`, :func:`hurray_schema.io.walk.kv.walk_kv`)
and every field's offset and width by its declaration (``structs/stream.py``,
``structs/file.py``).  A changed index is given its CRC-32C again
(``file-format.md § Trailer``) so that only the targeted rule breaks.
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import numpy

from ..io import Composite, Tensor
from ..io.crc import crc32c
from ..io.walk.kv import walk_kv
from ..limits import MAX_COMPOSITE_DEPTH
from ..io.walk.common import ENTRY_START, NAME, TABLE, VALUE, Faults, Part, as_view
from ..io.file.walk import walk_index
from ..io.walk import Window, collect_descriptor, walk_bare, walk_messages
from ..model import CompositeLayout, CompositionRule, ElementType, Shard, TensorDescriptor
from ..rules.engine import Mode
from ..structs._declare import static_offset
from ..structs.descriptor import FIXED_HEADER
from ..structs.file import (
    DESCRIPTOR_ALIGNMENT, FILE_HEADER, FILE_HEADER_SIZE, INDEX_COUNT, INDEX_ENTRY_FIELDS, KNOWN_FILE_FLAGS,
    KV_ARRAY_HEADER, KV_BOOL, KV_COUNT, KV_VALUE_TAG, MIN_DATA_BUFFER_ALIGNMENT,
    SECTION_ALIGNMENT, SUPPORTED_CONTAINER_MAJOR, TRAILER, TRAILER_SIZE, FileFlag, KvTag,
)
from ..structs.stream import (
    MESSAGE_HEADER, MESSAGE_HEADER_SIZE, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from .case import Case
from .patch import bare, cut, hrry, messages, put, read_field

__all__ = ["container_cases"]

F32 = ElementType.FLOAT32


def tensors() -> list[Tensor]:
    """Two small float32 tensors, [3] and [2, 2], holding 1, 2, 3, ..."""
    return [Tensor.dense(F32, shape, numpy.arange(1, math.prod(shape) + 1, dtype="<f4").tobytes())
            for shape in ([3], [2, 2])]


def _describe(buf, base: int, depth: int) -> Part:
    return collect_descriptor(buf, base, depth, Mode.PERMISSIVE)


# -- streams -----------------------------------------------------------------------------------


def _stream_parts(data: bytes, framing: str) -> list[Part]:
    walk = walk_bare if framing == "bare" else walk_messages
    return list(walk(Window(data), _describe, faults=Faults.COLLECT, mode=Mode.PERMISSIVE))


def _tables(parts, decl) -> list[Part]:
    return [p for p in parts if p.decl is decl and p.kind != "fault"]


def _message_headers(data: bytes) -> list[Part]:
    return _tables(_stream_parts(data, "messages"), MESSAGE_HEADER)


def _message_of(data: bytes, message_type: MessageType, nth: int = 0) -> Part:
    """The header part of the ``nth`` message of ``message_type``."""
    return [p for p in _message_headers(data) if p.value["message_type"] == message_type][nth]


def _patched_message(message_type: MessageType, name: str, change: Callable[[int], int], decl=MESSAGE_HEADER,
                     nth: int = 0) -> Callable[[], tuple[bytes, bytes]]:
    """Field ``name`` (of the message header, or of the table ``decl`` in the payload) of the
    ``nth`` ``message_type`` message changed by ``change``."""
    def build():
        good = messages(tensors())
        header = _message_of(good, message_type, nth)
        at = header.start + static_offset(MESSAGE_HEADER, name) if decl is MESSAGE_HEADER else \
            header.end + _payload_offset(good, header, decl) + static_offset(decl, name)
        return good, put(good, at, decl, name, change(read_field(good, at, decl, name)))
    return build


def _payload_offset(data: bytes, header: Part, decl) -> int:
    """Where table ``decl`` starts in the payload that follows ``header``."""
    if decl is TENSOR_DESCRIPTOR_FIELDS:  # after the descriptor (interchange.md § TENSOR_DESCRIPTOR Payload)
        return read_field(data, header.end + static_offset(FIXED_HEADER, "descriptor_length"), FIXED_HEADER,
                          "descriptor_length")
    return 0


def _bare_cut():
    good = bare(tensors())
    return good, cut(good, len(good) - 1)


def _message_cut():
    good = messages(tensors())
    return good, cut(good, MESSAGE_HEADER_SIZE - 1)


def _message_order():
    """The first TENSOR_DESCRIPTOR message removed: TENSOR_DATA comes first."""
    good = messages(tensors())
    return good, good[_message_of(good, MessageType.TENSOR_DATA).start:]


def _descriptor_payload():
    """The descriptor in the first TENSOR_DESCRIPTOR payload claims more bytes than the payload holds."""
    good = messages(tensors())
    at = _message_of(good, MessageType.TENSOR_DESCRIPTOR).end + static_offset(FIXED_HEADER, "descriptor_length")
    length = read_field(good, at, FIXED_HEADER, "descriptor_length")
    return good, put(good, at, FIXED_HEADER, "descriptor_length", length + DESCRIPTOR_ALIGNMENT)


def _data_sum():
    """The second TENSOR_DATA frame of the first tensor removed: the frames fall short of total_data_bytes."""
    good = messages(tensors(), max_frame_bytes=8)
    frames = [p for p in _stream_parts(good, "messages") if p.kind == "message"
              and p.value["message_type"] == MessageType.TENSOR_DATA]
    second = frames[1]
    return good, good[:second.start] + good[second.end:]


def _data_end_payload():
    """A TENSOR_DATA_END message carrying a payload."""
    good = messages(tensors())
    end = _message_of(good, MessageType.TENSOR_DATA_END)
    padding = bytes(DESCRIPTOR_ALIGNMENT)
    longer = good[:end.end] + padding + good[end.end:]
    at = end.start + static_offset(MESSAGE_HEADER, "payload_length")
    return good, put(longer, at, MESSAGE_HEADER, "payload_length", len(padding))


UNKNOWN_MESSAGE_TYPE = max(int(m) for m in MessageType) + 1


def stream_cases() -> list[Case]:
    return [
        Case("stream.truncated", "stream", _bare_cut, "the last buffer byte cut off"),
        Case("stream.message.type", "messages",
             _patched_message(MessageType.TENSOR_DESCRIPTOR, "message_type", lambda _: UNKNOWN_MESSAGE_TYPE)),
        Case("stream.message.stream_id", "messages",
             _patched_message(MessageType.TENSOR_DATA, "stream_id", lambda _: RESERVED_STREAM_ID)),
        Case("stream.message.truncated", "messages", _message_cut, "cut inside the first message header"),
        Case("stream.message.order", "messages", _message_order, "TENSOR_DATA before any TENSOR_DESCRIPTOR"),
        Case("stream.descriptor.payload", "messages", _descriptor_payload),
        Case("stream.descriptor.shards", "messages",
             _patched_message(MessageType.TENSOR_DESCRIPTOR, "shard_index", lambda _: 1, TENSOR_DESCRIPTOR_FIELDS)),
        Case("stream.data.total_bytes", "messages",
             _patched_message(MessageType.TENSOR_DESCRIPTOR, "total_data_bytes", lambda n: n + 1,
                              TENSOR_DESCRIPTOR_FIELDS)),
        Case("stream.data.frame", "messages",
             _patched_message(MessageType.TENSOR_DATA, "byte_offset_in_buffer", lambda n: n + 1, TENSOR_DATA_HEADER)),
        Case("stream.data.sum", "messages", _data_sum, "one TENSOR_DATA frame missing"),
        Case("stream.data_end.payload", "messages", _data_end_payload),
    ]


# -- files -------------------------------------------------------------------------------------

KV = {"k": "v", "flag": True, "list": [1, 2]}
NAMES = ("a", "b")


def clean_file(**options) -> bytes:
    """Two tensors "a" and "b" and a KV section of a string, a bool and an array."""
    return hrry(dict(zip(NAMES, tensors())), metadata=KV, **options)


def _trailer_at(data: bytes, name: str) -> int:
    return len(data) - TRAILER_SIZE + static_offset(TRAILER, name)


def _trailer(data: bytes, name: str) -> int:
    return read_field(data, _trailer_at(data, name), TRAILER, name)


def _header_at(name: str) -> int:
    return static_offset(FILE_HEADER, name)


def _header(data: bytes, name: str):
    return read_field(data, _header_at(name), FILE_HEADER, name)


def _index_parts(data: bytes) -> list[Part]:
    at, length = _trailer(data, "index_offset"), _trailer(data, "index_length")
    return list(walk_index(as_view(data)[:at + length], at))


def _entry_at(data: bytes, name: str, field: str) -> int:
    """Where field ``field`` of the index entry of tensor ``name`` sits."""
    parts = _index_parts(data)
    names = [p for p in parts if p.kind == NAME]
    entry = next(i for i, p in enumerate(names) if bytes(p.value) == name.encode())
    fields = [p for p in _tables(parts, INDEX_ENTRY_FIELDS) if p.kind == TABLE]
    return fields[entry].start + static_offset(INDEX_ENTRY_FIELDS, field)


def _entry(data: bytes, name: str, field: str) -> int:
    return read_field(data, _entry_at(data, name, field), INDEX_ENTRY_FIELDS, field)


def _name_at(data: bytes, name: str) -> int:
    return next(p.start for p in _index_parts(data) if p.kind == NAME and bytes(p.value) == name.encode())


def with_index_crc(data: bytes) -> bytes:
    """``data`` with index_crc32c recomputed over its index section."""
    at, length = _trailer(data, "index_offset"), _trailer(data, "index_length")
    return put(data, _trailer_at(data, "index_crc32c"), TRAILER, "index_crc32c", crc32c(data[at:at + length]))


def _header_patch(name: str, value: Callable) -> Callable[[], tuple[bytes, bytes]]:
    def build():
        good = clean_file()
        return good, put(good, _header_at(name), FILE_HEADER, name, value(_header(good, name)))
    return build


def _trailer_patch(name: str, value: Callable) -> Callable[[], tuple[bytes, bytes]]:
    def build():
        good = clean_file()
        return good, put(good, _trailer_at(good, name), TRAILER, name, value(_trailer(good, name), good))
    return build


def _entry_patch(tensor: str, field: str, value: Callable) -> Callable[[], tuple[bytes, bytes]]:
    """Field ``field`` of the index entry of ``tensor`` changed, the index CRC refreshed."""
    def build():
        good = clean_file()
        at = _entry_at(good, tensor, field)
        return good, with_index_crc(put(good, at, INDEX_ENTRY_FIELDS, field, value(_entry(good, tensor, field), good)))
    return build


def _renamed(tensor: str, name: bytes) -> Callable[[], tuple[bytes, bytes]]:
    """The index name of ``tensor`` replaced by ``name`` (same length), the index CRC refreshed."""
    def build():
        good = clean_file()
        at = _name_at(good, tensor)
        return good, with_index_crc(good[:at] + name + good[at + len(name):])
    return build


def _file_cut():
    good = clean_file()
    return good, cut(good, FILE_HEADER_SIZE)


def _index_count():
    good = clean_file()
    at = _trailer(good, "index_offset") + static_offset(INDEX_COUNT, "index_entry_count")
    count = read_field(good, at, INDEX_COUNT, "index_entry_count")
    return good, with_index_crc(put(good, at, INDEX_COUNT, "index_entry_count", count + 1))


def _index_misaligned():
    """index_offset one byte later (and index_length one byte shorter): the section is no longer 8-aligned."""
    good = clean_file()
    at, length = _trailer(good, "index_offset"), _trailer(good, "index_length")
    bad = put(good, _trailer_at(good, "index_offset"), TRAILER, "index_offset", at + 1)
    return good, put(bad, _trailer_at(bad, "index_length"), TRAILER, "index_length", length - 1)


def _unsorted_sorted_index():
    """SORTED_INDEX set over an index written in the order "b", "a"."""
    good = hrry({"b": tensors()[0], "a": tensors()[1]}, metadata=KV)
    flags = _header(good, "file_flags") | FileFlag.SORTED_INDEX
    return good, put(good, _header_at("file_flags"), FILE_HEADER, "file_flags", flags)


def _overlap():
    """Entry "b" points at the descriptor of "a"."""
    return _entry_patch("b", "descriptor_offset", lambda _, data: _entry(data, "a", "descriptor_offset"))()


def _data_bounds():
    """The last buffer cut short: the file ends (trailer and all) inside tensor "b"'s data."""
    items = dict(zip(NAMES, tensors()))
    good = hrry(items)
    data_at = _entry(good, "b", "data_offset")
    head = good[:data_at + 1]
    # a file whose tensor region ends one byte into "b"'s data: index and trailer re-written after it
    return good, _rebuilt(good, head)


def _rebuilt(good: bytes, region: bytes) -> bytes:
    """``region`` (header and tensor region) followed by ``good``'s index and a trailer pointing at it."""
    index_at, length = _trailer(good, "index_offset"), _trailer(good, "index_length")
    index = good[index_at:index_at + length]
    padded = region + bytes(-len(region) % SECTION_ALIGNMENT)
    trailer = good[-TRAILER_SIZE:]
    out = padded + index + trailer
    out = put(out, _trailer_at(out, "index_offset"), TRAILER, "index_offset", len(padded))
    out = put(out, _trailer_at(out, "kv_offset"), TRAILER, "kv_offset", 0)
    out = put(out, _trailer_at(out, "kv_length"), TRAILER, "kv_length", 0)
    return with_index_crc(out)


def _kv_parts(data: bytes) -> list[Part]:
    at, length = _trailer(data, "kv_offset"), _trailer(data, "kv_length")
    return list(walk_kv(as_view(data)[at:at + length], at, faults=Faults.ANNOTATE))


def _kv_entry_parts(data: bytes, key: str) -> list[Part]:
    """The located parts of KV entry ``key`` (from its start to its end)."""
    parts = _kv_parts(data)
    starts = [i for i, p in enumerate(parts) if p.kind == ENTRY_START] + [len(parts)]
    for first, last in zip(starts, starts[1:]):
        entry = parts[first:last]
        if any(p.kind == NAME and bytes(p.value) == key.encode() for p in entry):
            return entry
    raise KeyError(key)


def _kv_patch(key: str, locate: Callable[[list], int], replace: Callable[[bytes, int], bytes]):
    def build():
        good = clean_file()
        return good, replace(good, locate(_kv_entry_parts(good, key)))
    return build


def _kv_name(parts) -> int:
    return next(p.start for p in parts if p.kind == NAME)


def _kv_table(decl) -> Callable[[list], int]:
    return lambda parts: next(p.start for p in parts if p.decl is decl)


def _kv_value(parts) -> int:
    return next(p.start for p in parts if p.kind == VALUE)


def _set(decl, name: str, value) -> Callable[[bytes, int], bytes]:
    return lambda data, at: put(data, at, decl, name, value)


def _bytes(value: bytes) -> Callable[[bytes, int], bytes]:
    return lambda data, at: data[:at] + value + data[at + len(value):]


def _kv_count():
    good = clean_file()
    at = _trailer(good, "kv_offset") + static_offset(KV_COUNT, "kv_count")
    return good, put(good, at, KV_COUNT, "kv_count", read_field(good, at, KV_COUNT, "kv_count") + 1)


def _kv_flag():
    good = clean_file()
    flags = _header(good, "file_flags") & ~FileFlag.HAS_KV_METADATA
    return good, put(good, _header_at("file_flags"), FILE_HEADER, "file_flags", flags)


def _kv_misplaced():
    """kv_offset moved into the index section."""
    return _trailer_patch("kv_offset", lambda _, data: _trailer(data, "index_offset"))()


UNKNOWN_KV_TAG = max(int(t) for t in KvTag) + 1
NEXT_FILE_FLAG = 1 << KNOWN_FILE_FLAGS.bit_length()


def file_cases() -> list[Case]:
    return [
        Case("file.size", "file", _file_cut, "only the file header"),
        Case("file.header.magic", "file", _header_patch("magic", lambda _: b"XRRYFILE")),
        Case("file.header.version", "file", _header_patch("container_version_major",
                                                          lambda _: SUPPORTED_CONTAINER_MAJOR + 1)),
        Case("file.header.reserved", "file", _header_patch("_reserved", lambda v: b"\x01" + v[1:])),
        Case("file.flags.reserved", "file", _header_patch("file_flags", lambda v: v | NEXT_FILE_FLAG)),
        Case("file.header.alignment", "file", _header_patch("data_buffer_alignment",
                                                            lambda _: MIN_DATA_BUFFER_ALIGNMENT // 2)),
        Case("file.header.first_descriptor_offset", "file",
             _header_patch("first_descriptor_offset", lambda v: v + 1)),
        Case("file.trailer.magic", "file", _trailer_patch("trailer_magic", lambda *_: b"HRRX")),
        Case("file.trailer.reserved", "file", _trailer_patch("_reserved", lambda v, _: b"\x01" + v[1:])),
        Case("file.index.bounds", "file", _trailer_patch("index_length", lambda _, data: len(data))),
        Case("file.index.alignment", "file", _index_misaligned),
        Case("file.index.crc", "file", _trailer_patch("index_crc32c", lambda v, _: v ^ 1)),
        Case("file.index.crc_unset", "file",
             _header_patch("file_flags", lambda v: v & ~FileFlag.HAS_INDEX_CRC32C)),
        Case("file.index.truncated", "file", _index_count, "index_entry_count one more than the entries"),
        Case("file.index.name", "file", _renamed("a", b"\xff"), "a name that is not UTF-8"),
        Case("file.index.duplicate", "file", _renamed("b", b"a"), "two entries named a"),
        Case("file.index.flags", "file", _entry_patch("a", "flags", lambda *_: 1)),
        Case("file.index.sorted", "file", _unsorted_sorted_index),
        Case("file.index.descriptor_length", "file",
             _entry_patch("b", "descriptor_length", lambda v, _: v + DESCRIPTOR_ALIGNMENT)),
        Case("file.index.descriptor_bounds", "file",
             _entry_patch("a", "descriptor_offset", lambda _, data: _trailer(data, "kv_offset"))),
        Case("file.index.overlap", "file", _overlap),
        Case("file.descriptor.alignment", "file",
             _entry_patch("b", "descriptor_offset", lambda v, _: v + DESCRIPTOR_ALIGNMENT // 2)),
        Case("file.data.alignment", "file", _entry_patch("b", "data_offset", lambda v, _: v + DESCRIPTOR_ALIGNMENT)),
        Case("file.data.length", "file", _entry_patch("b", "data_length", lambda v, _: v + 1)),
        Case("file.data.bounds", "file", _data_bounds, "the file ends one byte into the last buffer"),
        Case("file.kv.flag", "file", _kv_flag, "a KV section without HAS_KV_METADATA"),
        Case("file.kv.bounds", "file", _kv_misplaced),
        Case("file.kv.truncated", "file", _kv_count, "kv_count one more than the entries"),
        Case("file.kv.key", "file", _kv_patch("k", _kv_name, _bytes(b"\xff")), "a key that is not UTF-8"),
        Case("file.kv.duplicate", "file", _kv_patch("flag", _kv_name, _bytes(b"list")), "two keys named list"),
        Case("file.kv.value_tag", "file",
             _kv_patch("k", _kv_table(KV_VALUE_TAG), _set(KV_VALUE_TAG, "value_tag", UNKNOWN_KV_TAG))),
        Case("file.kv.bool", "file", _kv_patch("flag", _kv_table(KV_BOOL), _set(KV_BOOL, "value", 2))),
        Case("file.kv.array_tag", "file",
             _kv_patch("list", _kv_table(KV_ARRAY_HEADER), _set(KV_ARRAY_HEADER, "element_tag", KvTag.ARRAY))),
        Case("file.kv.string", "file", _kv_patch("k", _kv_value, _bytes(b"\xc3")), "a value that is not UTF-8"),
    ]


# -- interoperability lints (rules/interop.py) ---------------------------------------------------


def _bool_unpacked():
    """bool [3] written one byte per element (01 00 01) instead of packed (0b101)."""
    values = (True, False, True)
    packed = sum(1 << i for i, v in enumerate(values) if v).to_bytes(1, "little")
    bytewise = bytes(int(v) for v in values)
    good = Tensor.dense(ElementType.BOOL, [len(values)], packed)
    bad = Tensor(attrs.evolve(good.descriptor, buffers=(attrs.evolve(good.descriptor.buffers[0],
                                                                      byte_size=len(bytewise)),)), [bytewise])
    return bare([good]), bare([bad])


def _head_padding():
    """A partition written with the reference's padding after its head
    (``write_file(pad_after_composite_head=True)``)."""
    shape = (2, 4)
    members = [Tensor.dense(F32, (2, 2), shard=Shard(shape, (0, column))) for column in (0, 2)]
    item = {"p": Composite(TensorDescriptor(F32, shape, CompositeLayout(CompositionRule.PARTITION, 2)), members)}
    return hrry(item), hrry(item, pad_after_composite_head=True)


# -- the values of quantization scales (rules/values.py) -------------------------------------------


def _codes(shape, values) -> numpy.ndarray:
    return numpy.array(values, dtype=numpy.int8).reshape(shape)


def _scaled(build, scales, bad_scales, container=bare):
    """The tensor ``build(scales)`` in a ``container`` (a bare stream, or a file as ``"q"``), and the
    same with ``bad_scales``."""
    wrap = (lambda t: container([t])) if container is bare else (lambda t: container({"q": t}))
    return wrap(build(scales)), wrap(build(bad_scales))


def _per_block(scales, scale_type="float32"):
    """int4 [2, 4] in blocks of 2 along axis 1, symmetric: four scales."""
    from ..builders.quantized import quantized_from_codes

    return quantized_from_codes(_codes((2, 4), [1, -2, 3, -4, 5, -6, 7, 0]), "per_block", storage="int4", axis=1,
                                block_size=2, scales=numpy.array(scales, dtype=scale_type).reshape(2, 2),
                                scale_type=scale_type)


def _per_channel(scales):
    """int8 [3, 2] per channel along axis 0, asymmetric, scales and zero points in one buffer."""
    from ..builders.quantized import quantized_from_codes

    tensor = quantized_from_codes(_codes((3, 2), [1, 2, 3, 4, 5, 6]), "per_channel", storage="int8", axis=0,
                                  scales=numpy.array(scales, dtype="<f4"),
                                  zero_points=numpy.array([0, 1, -1], dtype="<i4"))
    return _shared_parameters(tensor)


def _shared_parameters(tensor: Tensor) -> Tensor:
    """``tensor`` (data, scales, zero points) with its scales and zero points in one buffer, scales first
    (``quantization.md § Buffer Table Placement Rules`` 3)."""
    desc = tensor.descriptor
    data, scales, zero_points = tensor.buffers
    joined = bytes(scales) + bytes(zero_points)
    q = attrs.evolve(desc.quantization, zero_point_buffer_index=desc.quantization.scale_buffer_index)
    handles = (desc.buffers[0], attrs.evolve(desc.buffers[1], byte_size=len(joined)))
    return Tensor(attrs.evolve(desc, quantization=q, buffers=handles), [data, joined])


def _nf4(absmax):
    """uint4 [2, 8] NF4 in blocks of 8 along axis 1: two absmax scales."""
    from ..builders.quantized import quantized_from_codes

    return quantized_from_codes(numpy.arange(16, dtype=numpy.uint8).reshape(2, 8), "nf4", storage="uint4", axis=1,
                                block_size=8, scales=numpy.array(absmax, dtype="<f4").reshape(2, 1))


def _mxfp(scale_bytes):
    """float8_e4m3 [2, 16] MXFP in blocks of 16 along axis 1: two float8_e8m0 scale bytes."""
    from ..builders.quantized import quantize

    tensor = quantize(numpy.ones((2, 16), dtype=numpy.float32), "mxfp", block_size=16)
    return Tensor(tensor.descriptor, [tensor.buffers[0], bytes(scale_bytes)])


def value_cases() -> list[Case]:
    return [
        Case("quantization.per_block.scale_values", "stream",
             lambda: _scaled(_per_block, [0.5, 1.0, 2.0, 0.25], [0.5, 1.0, 0.0, 0.25]), "scale 2 of 4 is 0.0"),
        Case("quantization.per_block.scale_values", "file",
             lambda: _scaled(lambda s: _per_block(s, "float16"), [0.5, 1.0, 2.0, 0.25],
                             [0.5, float("inf"), 2.0, 0.25], hrry), "float16 scale 1 of 4 is infinite"),
        Case("quantization.per_channel.scale_values", "stream",
             lambda: _scaled(_per_channel, [0.5, 1.0, 2.0], [0.5, 1.0, float("nan")]),
             "scale 2 of 3 is NaN, zero points after the scales in one buffer"),
        Case("quantization.nf4.absmax_values", "stream",
             lambda: _scaled(_nf4, [0.0, 3.0], [3.0, -0.5]), "absmax 1 of 2 is -0.5"),
        Case("quantization.mxfp.scale_reserved", "stream",
             lambda: _scaled(_mxfp, [127, 128], [127, 0xFF]), "scale byte 1 of 2 is 0xFF"),
    ]


def lint_cases() -> list[Case]:
    return [
        Case("element_types.boolean.unpacked", "stream", _bool_unpacked, "bool [3] as bytes 01 00 01"),
        Case("file.composite.head_padding", "file", _head_padding, "padding after the composite head"),
    ]


# -- one fault, one rule, one offset, whichever container holds it ----------------------------------


def _second_descriptor_magic():
    """The magic of the second descriptor of a bare stream broken."""
    good = bare(tensors())
    base = [p for p in _stream_parts(good, "bare") if p.kind == "descriptor"][1].start
    return good, put(good, base + static_offset(FIXED_HEADER, "magic"), FIXED_HEADER, "magic", b"HRRX")


def _message_descriptor_magic():
    """The magic of the descriptor in the second TENSOR_DESCRIPTOR payload broken."""
    good = messages(tensors())
    base = _message_of(good, MessageType.TENSOR_DESCRIPTOR, 1).end
    return good, put(good, base + static_offset(FIXED_HEADER, "magic"), FIXED_HEADER, "magic", b"HRRX")


def _in_file(good_item, bad_item) -> Callable[[], tuple[bytes, bytes]]:
    return lambda: (hrry({"t": good_item()}), hrry({"t": bad_item()}))


def _in_messages(good_item, bad_item) -> Callable[[], tuple[bytes, bytes]]:
    return lambda: (messages([good_item()]), messages([bad_item()]))


def _zeros(desc: TensorDescriptor) -> Tensor:
    return Tensor(desc, [bytes(handle.byte_size) for handle in desc.buffers])


def placement_cases() -> list[Case]:
    """Faults of the other cases, held by other containers: the rule and its offset in
    that container are the same whichever reader finds them."""
    from . import composites, descriptors

    partition = (composites.PARTITION, [composites.LEFT, composites.RIGHT])
    gap = (composites.PARTITION, [composites.LEFT, composites.member((8, 3), (0, 4))])
    torn = (composites.head(count=3), [composites.LEFT, composites.RIGHT])
    reserved = descriptors.dense(buffers=[descriptors.BufferHandle(64, reserved=1)])

    def item(head_and_members):
        return lambda: composites.composite(*head_and_members)

    return [
        Case("descriptor.magic", "stream", _second_descriptor_magic, "in the second descriptor of a bare stream"),
        Case("descriptor.magic", "messages", _message_descriptor_magic, "in the second TENSOR_DESCRIPTOR payload"),
        Case("buffer.reserved", "file", _in_file(lambda: _zeros(descriptors.GOOD), lambda: _zeros(reserved)),
             "a descriptor fault inside a file"),
        Case("composite.close.partition_gap", "messages", _in_messages(item(partition), item(gap))),
        Case("composite.close.partition_gap", "file", _in_file(item(partition), item(gap))),
        Case("composite.torn", "file", _in_file(item(partition), item(torn)), "the head promises 3 members, 2 follow"),
        Case("composite.nesting.depth", "file",
             _in_file(lambda: composites.nested(MAX_COMPOSITE_DEPTH),
                      lambda: composites.nested(MAX_COMPOSITE_DEPTH + 1)),
             "nine nested partition heads"),
    ]


def container_cases() -> list[Case]:
    return stream_cases() + file_cases() + value_cases() + lint_cases() + placement_cases()
