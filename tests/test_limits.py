"""Stated limits and crafted hostile inputs.

Each crafted input lies about a size or a count (a rank of 2**32-1, 255 buffers in a
short descriptor, nnz = 2**63, an index of 2**60 entries, a 4 GiB KV string, composites
nested 9 deep, a stream promising 10**9 members).  Every reader must reject it with a
``HurraySchemaError`` while allocating little: the peak traced by ``tracemalloc`` stays
below 1 MiB plus a few times the input's size.

A reader missing from this build fails its tests (``fuzz.targets.entry_point`` raises
``MissingEntryPoint``), never skips them.
"""

from __future__ import annotations

import struct
import tracemalloc

import attrs
import pytest

import hurray_schema as hs
from fuzz import targets
from fuzz.mutate import refresh_index_crc
from hurray_schema.limits import DEFAULT_LIMITS, HARD_MAXIMUM, Limits
from hurray_schema.model import (
    BufferHandle, CompositeLayout, CooLayout, TensorDescriptor, TiledLayout,
)
from hurray_schema.structs._declare import plan, static_offset
from hurray_schema.structs.descriptor import BUFFER_COUNT, FIXED_HEADER
from hurray_schema.structs.file import (
    INDEX_COUNT, KV_COUNT, KV_KEY_LENGTH, KV_VALUE_TAG, TRAILER, TRAILER_SIZE,
)
from hurray_schema.structs.wire import descriptor_spans
from support.descriptors import dense, head

F32 = 0x03
GROUP = 0x03
MEMORY_SLACK = 1 << 20
MEMORY_FACTOR = 4


def rejected_small(fn, *args, size: int, **kw) -> hs.HurraySchemaError:
    """Run ``fn``; it must raise a HurraySchemaError with a small traced peak allocation.

    It runs once untraced first, so lazy imports and caches (a one-off cost, not a
    function of the input) are not counted."""
    try:
        fn(*args, **kw)
    except hs.HurraySchemaError:
        pass
    tracemalloc.start()
    try:
        fn(*args, **kw)
    except hs.HurraySchemaError as exc:
        error = exc
    else:
        error = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert error is not None, "the crafted input was accepted"
    assert peak < MEMORY_SLACK + MEMORY_FACTOR * size, f"peak allocation {peak} bytes for a {size}-byte input"
    return error


def need(name: str):
    return targets.entry_point(name)


def rule_of(exc) -> str:
    return getattr(exc, "rule_id", None) or f"limit:{exc.limit}"


# ---------------------------------------------------------------------------------------
# The Limits value
# ---------------------------------------------------------------------------------------


def test_defaults_are_the_documented_ones():
    assert DEFAULT_LIMITS.max_rank == 64  # data-model.md § Rank
    assert DEFAULT_LIMITS.max_composite_depth == 8  # layouts/composite.md § Binding
    assert DEFAULT_LIMITS.max_tiled_depth == 8  # layouts/tiled.md § Recursive Tiling (recommended)
    assert DEFAULT_LIMITS.max_buffer_count == 255  # uint8 on the wire
    assert DEFAULT_LIMITS.max_descriptor_bytes == 16 << 20
    for f in attrs.fields(Limits):
        assert f.metadata["doc"], f.name  # every limit is documented
        assert getattr(DEFAULT_LIMITS, f.name) <= HARD_MAXIMUM[f.name]


@pytest.mark.parametrize("name, value", [
    ("max_rank", 65), ("max_composite_depth", 9), ("max_buffer_count", 256), ("max_tiled_depth", 65),
    ("max_descriptor_bytes", 2**32), ("max_kv_bytes", 2**32), ("max_composite_members", 2**32 - 1),
])
def test_limits_cannot_be_raised_past_the_spec_or_the_wire(name, value):
    with pytest.raises(ValueError):
        Limits(**{name: value})
    with pytest.raises(ValueError):
        DEFAULT_LIMITS.evolve(**{name: -1})


def test_limits_reject_non_integers():
    with pytest.raises(TypeError):
        Limits(max_rank=8.0)
    with pytest.raises(TypeError):
        hs.decode_descriptor(hs.encode_descriptor(TensorDescriptor(F32, (2,), buffers=(BufferHandle(8),))),
                             limits={"max_rank": 1})


def test_lowered_rank_limit_is_a_limit_and_the_spec_cap_a_violation():
    desc = TensorDescriptor(F32, (1,) * 5, buffers=(BufferHandle(4),))
    data = hs.encode_descriptor(desc)
    assert hs.decode_descriptor(data) == desc
    with pytest.raises(hs.LimitExceeded) as info:
        hs.decode_descriptor(data, limits=Limits(max_rank=4))
    assert (info.value.limit, info.value.value, info.value.maximum) == ("max_rank", 5, 4)
    assert info.value.offset == static_offset(FIXED_HEADER, "rank")


def test_lowered_buffer_count_and_descriptor_size():
    desc = TensorDescriptor(F32, (3, 3), CooLayout(2, 1), (BufferHandle(8), BufferHandle(32)))
    data = hs.encode_descriptor(desc)
    with pytest.raises(hs.LimitExceeded) as info:
        hs.decode_descriptor(data, limits=Limits(max_buffer_count=1))
    assert info.value.limit == "max_buffer_count"
    count_at = dict((n, a) for n, a, _ in descriptor_spans(desc))["buffer_table"]
    assert info.value.offset == count_at
    with pytest.raises(hs.LimitExceeded) as info:
        hs.decode_descriptor(data, limits=Limits(max_descriptor_bytes=len(data) - 1))
    assert info.value.limit == "max_descriptor_bytes"
    assert hs.decode_descriptor(data, limits=Limits(max_descriptor_bytes=len(data))) == desc


def _tiled(levels: int) -> TensorDescriptor:
    layout = None
    for _ in range(levels):
        layout = TiledLayout((1, 1), 1, 4 if layout is not None else 1, inner=layout)
    return TensorDescriptor(F32, (2, 2), layout, (BufferHandle(16),))


def test_tiled_depth_is_the_configured_limit():
    nine = hs.encode_descriptor(_tiled(9))
    assert hs.decode_descriptor(hs.encode_descriptor(_tiled(8))).layout.tag == 0x04
    with pytest.raises(hs.SpecViolation) as info:
        hs.decode_descriptor(nine)
    assert info.value.rule_id == "descriptor.tiled.depth"
    with pytest.raises(hs.SpecViolation):
        hs.decode_descriptor(hs.encode_descriptor(_tiled(3)), limits=Limits(max_tiled_depth=2))
    # the spec leaves the limit to the reader, so it may be raised
    assert hs.decode_descriptor(nine, limits=Limits(max_tiled_depth=9)).layout.tag == 0x04


# ---------------------------------------------------------------------------------------
# Crafted descriptors
# ---------------------------------------------------------------------------------------


def _patch(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


def crafted_rank() -> bytes:
    """A fixed header announcing rank 2**32 - 1 (and nothing after it)."""
    data = hs.encode_descriptor(dense(()))
    return _patch(data, static_offset(FIXED_HEADER, "rank"), struct.pack("<I", 2**32 - 1))


def crafted_buffer_count() -> bytes:
    """A 61-byte descriptor whose buffer_count says 255 (4080 bytes of handles)."""
    desc = dense((3, 4))
    at = dict((n, a) for n, a, _ in descriptor_spans(desc))["buffer_table"]
    return _patch(hs.encode_descriptor(desc), at, plan(BUFFER_COUNT).pack(buffer_count=255))


def crafted_nnz() -> bytes:
    """A COO tensor claiming nnz = 2**63 with 8 + 32 bytes of buffers."""
    return hs.encode_descriptor(TensorDescriptor(F32, (3, 3), CooLayout(2**63, 0), (BufferHandle(8), BufferHandle(32))))


DESCRIPTORS = {
    "rank_2**32-1": (crafted_rank, {"descriptor.rank.cap"}),
    "buffer_count_255": (crafted_buffer_count, {"descriptor.length.bounds"}),
    "nnz_2**63": (crafted_nnz, {"layout.sparse.buffer_size"}),
}


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_crafted_descriptor_rejected_small(name, mode):
    build, rules = DESCRIPTORS[name]
    data = build()
    exc = rejected_small(hs.decode_descriptor, data, mode=mode, size=len(data))
    assert rule_of(exc) in rules, exc


def _bare(*parts) -> bytes:
    return b"".join(parts)


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_crafted_descriptor_in_a_stream_rejected_small(name, framing):
    need("read_stream")
    build, rules = DESCRIPTORS[name]
    desc = build()
    data = desc + bytes(40) if framing == "bare" else _messages(desc, bytes(40))
    exc = rejected_small(targets.run_read_stream, data, "strict", framing, size=len(data))
    assert isinstance(exc, (hs.SpecViolation, hs.LimitExceeded)), exc


def test_a_huge_buffer_in_a_short_stream_file_is_not_read_into_memory(tmp_path):
    """A bare stream read from a file whose handle promises 2**40 bytes: the reader must
    not allocate for the promise (nor a big read-ahead) before finding the stream short."""
    need("read_stream")
    desc = TensorDescriptor(0x11, (2**40,), buffers=(BufferHandle(2**40),))
    path = tmp_path / "s.hrrs"
    path.write_bytes(hs.encode_descriptor(desc) + bytes(100))
    exc = rejected_small(targets.run_read_stream, str(path), "strict", "bare", size=path.stat().st_size)
    assert isinstance(exc, (hs.SpecViolation, hs.LimitExceeded)), exc


# ---------------------------------------------------------------------------------------
# Streams: deep nesting, a huge member_count
# ---------------------------------------------------------------------------------------


def _head(members: int) -> bytes:
    return hs.encode_descriptor(head(GROUP, members, (4,)))


def _leaf() -> tuple[bytes, bytes]:
    return hs.encode_descriptor(TensorDescriptor(F32, (4,), buffers=(BufferHandle(16),))), bytes(16)


def _messages(desc: bytes, data: bytes = b"") -> bytes:
    """One tensor in the interchange message framing, built from the declarations."""
    from hurray_schema.structs.stream import MESSAGE_HEADER, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType

    msg, fields, dh = plan(MESSAGE_HEADER), plan(TENSOR_DESCRIPTOR_FIELDS), plan(TENSOR_DATA_HEADER)
    out = msg.pack(message_type=MessageType.TENSOR_DESCRIPTOR, stream_id=1,
                   payload_length=len(desc) + fields.fixed_size)
    out += desc + fields.pack(total_data_bytes=len(data), shard_index=0, total_shards=1)
    if data:
        out += msg.pack(message_type=MessageType.TENSOR_DATA, stream_id=1, payload_length=dh.fixed_size + len(data))
        out += dh.pack(byte_offset_in_buffer=0) + data
    return out + msg.pack(message_type=MessageType.TENSOR_DATA_END, stream_id=1, payload_length=0)


def nested_stream(depth: int, framing: str) -> bytes:
    desc, data = _leaf()
    if framing == "bare":
        return _head(1) * depth + desc + data
    return _messages(_head(1)) * depth + _messages(desc, data)


@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_composites_nested_nine_deep_are_rejected(framing):
    need("read_stream")
    data = nested_stream(9, framing)
    exc = rejected_small(targets.run_read_stream, data, "strict", framing, size=len(data))
    assert rule_of(exc) in {"composite.nesting.depth", "limit:max_composite_depth"}, exc
    assert targets.run_read_stream(nested_stream(8, framing), "strict", framing) == 1
    with pytest.raises(hs.LimitExceeded):
        targets.run_read_stream(nested_stream(3, framing), "strict", framing, limits=Limits(max_composite_depth=2))


@pytest.mark.parametrize("framing", ["bare", "messages"])
@pytest.mark.parametrize("raised", [False, True], ids=["default-limits", "limit-raised"])
def test_a_stream_promising_a_billion_members_is_rejected(framing, raised):
    """Default limits stop it at the head; with the member limit raised the reader binds
    the one member present and finds the composite torn at the end -- without ever
    allocating for the 10**9 promised members."""
    need("read_stream")
    desc, data = _leaf()
    head = _head(10**9)
    stream = head + desc + data if framing == "bare" else _messages(head) + _messages(desc, data)
    kw = {"limits": Limits(max_composite_members=10**9)} if raised else {}
    exc = rejected_small(targets.run_read_stream, stream, "strict", framing, size=len(stream), **kw)
    if raised:
        assert isinstance(exc, hs.SpecViolation) and "torn" in exc.rule_id, exc
    else:
        assert rule_of(exc) == "limit:max_composite_members", exc


# ---------------------------------------------------------------------------------------
# Files: a huge index, a 4 GiB KV string, deep nesting
# ---------------------------------------------------------------------------------------


def _trailer(data: bytes) -> dict:
    values, _ = plan(TRAILER).unpack(data, len(data) - TRAILER_SIZE)
    return values


def _small_file(tmp_path, kv=None) -> bytes:
    from hurray_schema.io.file import write_file
    from hurray_schema.io.tensor import Tensor

    path = tmp_path / "seed.hrry"
    write_file(path, {"t": Tensor.dense(F32, (4,), bytes(16))}, metadata=kv)
    return path.read_bytes()


def test_an_index_of_2_60_entries_is_rejected_small(tmp_path):
    need("read_file")
    data = bytearray(_small_file(tmp_path))
    at = _trailer(data)["index_offset"]
    data[at:at + plan(INDEX_COUNT).fixed_size] = plan(INDEX_COUNT).pack(index_entry_count=2**60)
    data = refresh_index_crc(bytes(data))  # the CRC is right: only the count lies
    path = targets.write_scratch(tmp_path / "index.hrry", data)
    for limits in (None, Limits(max_index_entries=HARD_MAXIMUM["max_index_entries"])):
        exc = rejected_small(targets.run_read_file, path, "strict", limits=limits, size=len(data))
        assert rule_of(exc) in {"file.index.truncated", "limit:max_index_entries"}, exc


def test_a_4_gib_kv_string_is_rejected_small(tmp_path):
    need("read_file")
    data = bytearray(_small_file(tmp_path, kv={"s": "x"}))
    t = _trailer(data)
    assert t["kv_offset"] > 0
    at = (t["kv_offset"] + plan(KV_COUNT).fixed_size + plan(KV_KEY_LENGTH).fixed_size + len("s")
          + plan(KV_VALUE_TAG).fixed_size)
    assert data[at:at + 4] == struct.pack("<I", 1)  # the length prefix of "x"
    data[at:at + 4] = struct.pack("<I", 2**32 - 1)
    path = targets.write_scratch(tmp_path / "kv.hrry", bytes(data))
    for limits in (None, Limits(max_kv_value_bytes=HARD_MAXIMUM["max_kv_value_bytes"])):
        exc = rejected_small(targets.run_read_file, path, "strict", limits=limits, size=len(data))
        assert isinstance(exc, (hs.SpecViolation, hs.LimitExceeded)), exc


def test_a_file_with_composites_nested_nine_deep_is_rejected(tmp_path):
    need("read_file")
    from hurray_schema.io.file import write_file
    from hurray_schema.io.tensor import Composite, Tensor

    def nest(depth):
        item = Tensor.dense(F32, (4,), bytes(16))
        for _ in range(depth):
            item = Composite(TensorDescriptor(F32, (4,), CompositeLayout(GROUP, 1)), [item])
        return item

    ok, bad = tmp_path / "eight.hrry", tmp_path / "nine.hrry"
    write_file(ok, {"c": nest(8)})
    assert targets.run_read_file(ok, "strict") == 1
    write_file(bad, {"c": nest(9)}, validate=False)  # the writer refuses 9 levels unless told not to check
    exc = rejected_small(targets.run_read_file, bad, "strict", size=bad.stat().st_size)
    assert rule_of(exc) in {"composite.nesting.depth", "limit:max_composite_depth"}, exc
