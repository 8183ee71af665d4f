"""Tensor / Composite objects, the stream and file APIs, and their delegation to the
rule engine's composite validator and to ``hurray_schema.evaluate``."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hurray_schema.rules.composite as composite_rules
from hurray_schema.errors import HurraySchemaError, LimitExceeded, SpecViolation
from hurray_schema.limits import Limits
from hurray_schema.model import Shard
from hurray_schema.io import (
    Composite, RemoteError, Tensor, read_file, read_stream, write_file, write_stream,
)

F32 = 0x03


def t(values, name=None, **kw):
    return Tensor.dense(F32, [len(values)], struct.pack(f"<{len(values)}f", *values), name=name, **kw)


# --------------------------------------------------------------------------------------
# Tensor / Composite
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tag", [
    ("float16", 0x01), ("float32", 0x03), ("float64", 0x04), ("int8", 0x10), ("uint8", 0x11), ("int16", 0x12),
    ("uint16", 0x13), ("int32", 0x14), ("uint32", 0x15), ("int64", 0x16), ("uint64", 0x17),
    ("complex64", 0x50), ("complex128", 0x51),
])
def test_from_numpy_is_a_view_of_the_array_bytes(dtype, tag):
    arr = (np.arange(12) % 7).astype(dtype).reshape(3, 4)
    x = Tensor.from_numpy(arr, name="a")
    assert int(x.type_tag) == tag and x.shape == (3, 4) and x.name == "a"
    assert bytes(x.buffers[0]) == arr.tobytes()
    assert x.descriptor.buffers[0].byte_size == arr.nbytes


def test_from_numpy_bool_is_bit_packed_lsb_first():
    x = Tensor.from_numpy(np.array([1, 0, 0, 0, 0, 0, 0, 0, 1, 1], dtype=bool))
    assert int(x.type_tag) == 0x20 and bytes(x.buffers[0]) == b"\x01\x03"


def test_from_numpy_packs_sub_byte_types_lsb_first():
    """``element-types.md § Sub-Byte Integer Types``: element 0 in the low bits of byte 0."""
    import ml_dtypes

    x = Tensor.from_numpy(np.array([1, -2, 3], dtype=ml_dtypes.int4))
    assert int(x.type_tag) == 0x48 and x.shape == (3,) and bytes(x.buffers[0]) == b"\xe1\x03"
    y = Tensor.from_numpy(np.array([3, 0, 1, 2, 1], dtype=ml_dtypes.uint2))
    assert bytes(y.buffers[0]) == bytes([3 | 0 << 2 | 1 << 4 | 2 << 6, 1])


def test_from_numpy_empty_and_big_endian():
    e = Tensor.from_numpy(np.zeros((0, 4), np.float32))
    assert e.shape == (0, 4) and e.descriptor.buffers[0].byte_size == 0 and e.stored_nbytes == 0
    b = Tensor.from_numpy(np.array([1.0, 2.0], dtype=">f4"))
    assert bytes(b.buffers[0]) == struct.pack("<2f", 1, 2)


def test_dense_checks_size():
    with pytest.raises(HurraySchemaError):
        Tensor.dense(F32, [4], bytes(15))
    assert Tensor.dense(0x48, [3], bytes(2)).stored_nbytes == 2  # int4: 3 elements -> 2 bytes


def test_buffers_are_zero_copy():
    data = bytearray(16)
    x = Tensor.dense(F32, [4], data)
    data[0] = 7
    assert x.buffers[0][0] == 7


def test_composite_accessors_and_member_count_check():
    c = Composite.build("partition", [t([1, 2], shard=_shard(0)), t([3, 4], shard=_shard(2))], shape=[4],
                        type_tag=F32)
    assert c.rule == 0x01 and c.combine_op == 0x00 and len(c.members) == 2 and c.shape == (4,)
    with pytest.raises(HurraySchemaError):
        Composite(c.descriptor, c.members[:1])
    with pytest.raises(HurraySchemaError):
        Tensor(c.descriptor)
    o = Composite.build("overlay", [t([1, 2, 3, 4], shard=_shard(0, 4)), t([9], shard=_shard(1, 4))],
                        shape=[4], type_tag=F32, combine_op="add")
    assert [m.descriptor.composite_member.member_role for m in o.members] == [1, 0]
    assert o.combine_op == 0x02


def _shard(offset, parent=4):
    from hurray_schema.model import Shard

    return Shard((parent,), (offset,))


def test_to_numpy_with_the_real_evaluator():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = Tensor.from_numpy(arr).to_numpy()
    assert np.array_equal(got, arr)


# --------------------------------------------------------------------------------------
# Composite validator delegation
# --------------------------------------------------------------------------------------


class RecordingValidator(composite_rules.CompositeValidator):
    """The rule engine's validator, logging what the binder asks of it."""

    log: list = []

    def __init__(self, head, **options):
        super().__init__(head, **options)
        self.log.append(("open", head.layout.member_count, self.mode.value))

    def push_member(self, desc, *, base=None):
        self.log.append(("member", desc.shape))
        return super().push_member(desc, base=base)

    def close(self):
        self.log.append(("close",))
        return super().close()


def _group():
    inner = Composite.build("group", [t([1])], shape=[1], type_tag=F32)
    return Composite.build("group", [inner, t([1, 2])], shape=[2], type_tag=F32)


# The tests below patch the composite validator to watch the readers; the writers that make
# their input (which validate through the same rules) run with validate=False.
def test_stream_binding_uses_the_validator(monkeypatch):
    monkeypatch.setattr(composite_rules, "CompositeValidator", RecordingValidator)
    RecordingValidator.log = []
    (c,) = read_stream(write_stream(None, [_group()], validate=False))
    assert isinstance(c.members[0], Composite) and isinstance(c.members[1], Tensor)
    assert RecordingValidator.log == [
        ("open", 2, "strict"), ("member", (1,)), ("open", 1, "strict"), ("member", (1,)), ("close",),
        ("member", (2,)), ("close",)]


def test_file_binding_uses_the_validator(monkeypatch, tmp_path):
    monkeypatch.setattr(composite_rules, "CompositeValidator", RecordingValidator)
    RecordingValidator.log = []
    write_file(tmp_path / "g.hrry", {"g": _group()}, validate=False)
    with read_file(tmp_path / "g.hrry", mode="permissive") as f:
        assert f["g"].members[0].members[0].name == "g.0.0"
    assert RecordingValidator.log[0] == ("open", 2, "permissive") and RecordingValidator.log[-1] == ("close",)


def test_validator_violation_propagates(monkeypatch):
    class Rejecting(RecordingValidator):
        def push_member(self, desc, *, base=None):
            raise SpecViolation("composite.test", "layouts/composite.md § Validation", base, "no")

    monkeypatch.setattr(composite_rules, "CompositeValidator", Rejecting)
    with pytest.raises(SpecViolation, match="composite.test"):
        list(read_stream(write_stream(None, [_group()], validate=False)))
    assert len(list(read_stream(write_stream(None, [_group()], validate=False), validate_composites=False))) == 1


def test_validator_findings_get_container_offsets(monkeypatch):
    class Rejecting(RecordingValidator):
        def close(self):
            raise SpecViolation("composite.test", "layouts/composite.md § Validation", self.base, "no")

    monkeypatch.setattr(composite_rules, "CompositeValidator", Rejecting)
    data = write_stream(None, [t([1]), _group()], validate=False)
    with pytest.raises(SpecViolation) as info:
        list(read_stream(data))
    # the inner composite closes first: the violation points at the inner head
    assert info.value.offset == len(write_stream(None, [t([1])])) + len(_encode(_group()))


def test_unvalidated_composite_is_validated_on_first_evaluation():
    """validate_composites=False binds without the checks; the evaluator then runs them
    (a partition whose one member leaves a gap)."""
    half = t([1, 2], shard=Shard((4,), (0,)))
    gap = Composite.build("partition", [half], shape=[4], type_tag=F32)
    (c,) = read_stream(write_stream(None, [gap], validate=False), validate_composites=False)
    with pytest.raises(SpecViolation) as info:
        c.materialize()
    assert info.value.rule_id == "composite.close.partition_gap"
    with pytest.raises(SpecViolation) as info:
        list(read_stream(write_stream(None, [gap], validate=False)))
    assert info.value.rule_id == "composite.close.partition_gap"


def test_file_is_not_a_stream(tmp_path):
    write_file(tmp_path / "f.hrry", {"x": t([1])})
    with pytest.raises(SpecViolation) as info:
        list(read_stream(tmp_path / "f.hrry"))
    assert info.value.rule_id == "descriptor.magic" and "read_file" in info.value.message


# --------------------------------------------------------------------------------------
# Stream API
# --------------------------------------------------------------------------------------


class Trickle(io.RawIOBase):
    """A file object that hands out at most 3 bytes per read (like a slow pipe)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def readable(self):
        return True

    def read(self, n=-1):
        n = 3 if n is None or n < 0 else min(n, 3)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_stream_destinations_and_sources(tmp_path, framing):
    items = [t([1, 2, 3], name="x"), _group(), Tensor.dense(F32, [0, 3])]
    data = write_stream(None, items, framing=framing)
    write_stream(tmp_path / "s", items, framing=framing)
    buf = io.BytesIO()
    assert write_stream(buf, iter(items), framing=framing) is None
    assert (tmp_path / "s").read_bytes() == buf.getvalue() == data
    for source in (data, bytearray(data), memoryview(data), tmp_path / "s", str(tmp_path / "s"),
                   io.BytesIO(data), Trickle(data)):
        got = list(read_stream(source, framing=framing))
        assert len(got) == 3 and all(a.same_content(b) for a, b in zip(got, items))


def test_bare_stream_is_descriptor_then_buffers():
    x = t([1, 2])
    assert write_stream(None, x) == bytes(_encode(x)) + struct.pack("<2f", 1, 2)


def _encode(x):
    from hurray_schema.codec import encode_descriptor

    return encode_descriptor(x.descriptor)


def test_message_frames_are_split():
    data = write_stream(None, [t(list(range(10)))], framing="messages", max_frame_bytes=16)
    kinds = []
    pos = 0
    while pos < len(data):
        kind, _sid, n = struct.unpack_from("<III", data, pos)
        kinds.append(kind)
        pos += 12 + n
    assert kinds == [4, 5, 5, 5, 6]  # 40 data bytes in frames of 16, 16, 8


def test_bad_arguments():
    with pytest.raises(ValueError):
        read_stream(b"", framing="nope")
    with pytest.raises(ValueError):
        write_stream(None, [], framing="nope")
    with pytest.raises(ValueError):
        write_stream(None, [], framing="messages", stream_id=0)
    with pytest.raises(ValueError):
        read_stream(b"", mode="lenient")
    with pytest.raises(TypeError):
        read_stream(12)


def test_writer_refuses_inconsistent_tensors():
    x = t([1, 2])
    bad = Tensor(x.descriptor, [bytes(7)])
    with pytest.raises(HurraySchemaError):
        write_stream(None, [bad])
    with pytest.raises(HurraySchemaError):
        write_stream(None, [Tensor(x.descriptor, [])])


def test_limits():
    data = write_stream(None, [t([1, 2])])
    with pytest.raises(LimitExceeded):
        list(read_stream(data, limits=Limits(max_descriptor_bytes=40)))
    with pytest.raises(LimitExceeded):
        list(read_stream(data, limits=Limits(max_buffer_bytes=4)))
    with pytest.raises(LimitExceeded):
        list(read_stream(write_stream(None, [t([1, 2])], framing="messages"), framing="messages",
                         limits=Limits(max_message_bytes=16)))
    with pytest.raises(LimitExceeded):
        list(read_stream(data + data, limits=Limits(max_stream_tensors=1)))
    with pytest.raises(LimitExceeded):
        list(read_stream(write_stream(None, [_group()]), limits=Limits(max_composite_depth=1)))
    with pytest.raises(LimitExceeded):
        list(read_stream(write_stream(None, [_group()]), limits=Limits(max_composite_members=1)))


def test_file_limits(tmp_path):
    write_file(tmp_path / "l.hrry", {"g": _group(), "x": t([1])}, metadata={"k": "value", "a": [1, 2, 3]})
    for limits in (Limits(max_index_entries=3), Limits(max_index_bytes=20), Limits(max_kv_bytes=10),
                   Limits(max_kv_entries=1), Limits(max_kv_value_bytes=2), Limits(max_descriptor_bytes=30),
                   Limits(max_composite_depth=1)):
        with pytest.raises(LimitExceeded):
            read_file(tmp_path / "l.hrry", limits=limits)
    with read_file(tmp_path / "l.hrry", limits=Limits(max_kv_value_bytes=5)) as f:
        assert f.kv == {"k": "value", "a": [1, 2, 3]}


def test_hostile_buffer_size_from_a_file_object_does_not_allocate_it():
    x = t([1, 2])
    desc = bytearray(_encode(x))
    desc[37:45] = struct.pack("<Q", 1 << 62)  # byte_size: header 20 + shape 8 + byte_offset 8 + count 1
    with pytest.raises(SpecViolation) as info:
        list(read_stream(io.BytesIO(bytes(desc) + bytes(100))))
    assert info.value.rule_id == "stream.truncated"


def test_remote_error_message():
    payload = struct.pack("<II", 2, 5) + b"nope!"
    with pytest.raises(RemoteError) as info:
        list(read_stream(struct.pack("<III", 9, 1, len(payload)) + payload, framing="messages"))
    assert info.value.error_code == 2 and info.value.remote_message == "nope!"


# --------------------------------------------------------------------------------------
# File API
# --------------------------------------------------------------------------------------


def test_hurray_file_mapping(tmp_path):
    g = _group()
    write_file(tmp_path / "f.hrry", [t([1, 2], name="x"), g.with_name("g")], metadata={"k": 1})
    with read_file(tmp_path / "f.hrry") as f:
        assert list(f) == ["x", "g"] and len(f) == 2 and "g.0" not in f and "x" in f
        assert [e.name for e in f.entries()] == ["x", "g", "g.0", "g.0.0", "g.1"]
        assert f.get_item("g.1").same_content(g.members[1]) and f.descriptor("g").is_composite_head
        assert f.kv == {"k": 1} and f.data_buffer_alignment == 4096
        x = f["x"]
        assert bytes(x.buffers[0]) == struct.pack("<2f", 1, 2)
    assert bytes(x.buffers[0]) == struct.pack("<2f", 1, 2)  # views stay valid after close


def test_write_file_layout(tmp_path):
    items = {"h": Composite.build("group", [t([1]), Tensor.dense(F32, [0])], shape=[1], type_tag=F32),
             "z": t([5, 6])}
    entries = write_file(tmp_path / "l.hrry", items, data_buffer_alignment=8192)
    by = {e.name: e for e in entries}
    assert all(e.descriptor_offset % 8 == 0 for e in entries)
    head = by["h"]
    assert by["h.0"].descriptor_offset == head.descriptor_offset + head.descriptor_length + (-head.descriptor_length % 8)
    assert head.data_length == 0
    assert by["h.0"].data_offset % 8192 == 0 and by["h.1"].data_offset % 8192 == 0  # empty tensor still aligned
    assert by["h.1"].data_length == 0 and by["z"].data_offset % 8192 == 0
    raw = (tmp_path / "l.hrry").read_bytes()
    assert struct.unpack_from("<I", raw, 16)[0] == 8192


def test_write_file_refuses_bad_items(tmp_path):
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", [t([1])])  # no name
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", {"a": t([1]), "b": Composite.build("group", [t([1], name="a")], shape=[1],
                                                                         type_tag=F32)})
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", {"a": t([1])}, data_buffer_alignment=1000)
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", {"a": t([1])}, metadata={"x": []})
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", {"a": t([1])}, metadata={"x": [1, "a"]})
    with pytest.raises(HurraySchemaError):
        write_file(tmp_path / "a", {"a": "not a tensor"})


# --------------------------------------------------------------------------------------
# Round trips (hypothesis)
# --------------------------------------------------------------------------------------

DTYPES = [0x01, 0x03, 0x04, 0x10, 0x11, 0x16, 0x20, 0x43, 0x44, 0x48, 0x4A, 0x51]


@st.composite
def tensors(draw):
    from hurray_schema.structs.element_types import element_type_info

    tag = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    n = element_type_info(tag).buffer_bytes(int(np.prod(shape)) if shape else 1)
    return Tensor.dense(tag, shape, draw(st.binary(min_size=n, max_size=n)))


items_strategy = st.lists(
    st.one_of(tensors(), st.lists(tensors(), min_size=0, max_size=3).map(
        lambda ms: Composite.build("group", ms, shape=[1], type_tag=F32))),
    min_size=0, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=items_strategy, framing=st.sampled_from(["bare", "messages"]), frame=st.integers(1, 64))
def test_stream_round_trip(items, framing, frame):
    data = write_stream(None, items, framing=framing, max_frame_bytes=frame)
    got = list(read_stream(data, framing=framing))
    assert len(got) == len(items) and all(a.same_content(b) for a, b in zip(got, items))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=items_strategy, sorted_index=st.booleans())
def test_file_round_trip(tmp_path, items, sorted_index):
    named = {f"t{i}": item for i, item in enumerate(items)}
    write_file(tmp_path / "r.hrry", named, sorted_index=sorted_index)
    with read_file(tmp_path / "r.hrry") as f:
        assert list(f) == (sorted(named) if sorted_index else list(named))
        assert all(f[n].same_content(named[n]) for n in named)


def test_stream_reader_holds_one_tensor_at_a_time(tmp_path):
    """Reading a 10 MiB stream of 256 KiB tensors from a path, dropping each item, never
    has more than a couple of tensors' bytes allocated (tracemalloc peak)."""
    import tracemalloc

    size = 256 * 1024
    items = [Tensor.dense(0x11, [size], bytes([i]) * size) for i in range(40)]
    items.insert(20, Composite.build("group", items[:2], shape=[1], type_tag=F32))
    write_stream(tmp_path / "big.stream", items)
    tracemalloc.start()
    try:
        count = 0
        for item in read_stream(tmp_path / "big.stream"):
            count += 1
            del item
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 41
    assert peak < 4 * size, peak  # the composite (2 members) plus one tensor being read


def test_composite_methods_evaluate_the_seed_partition():
    """The seed's [8, 8] partition built from numpy arrays: materialize, lookup([3, 6]) -> member 1 at
    [3, 2], and read of a box crossing both members (layouts/composite.md § Example)."""
    import numpy as np

    from hurray_schema import Composite, Shard, Tensor

    left = np.arange(32, dtype=np.float32).reshape(8, 4)
    right = 100 + np.arange(32, dtype=np.float32).reshape(8, 4)
    members = [Tensor.from_numpy(left, shard=Shard((8, 8), (0, 0))),
               Tensor.from_numpy(right, shard=Shard((8, 8), (0, 4)))]
    comp = Composite.build("partition", members, shape=(8, 8), type_tag=0x03)
    expected = np.concatenate([left, right], axis=1)
    assert np.array_equal(comp.materialize(), expected)
    assert comp.lookup([3, 6]) == right[3, 2]
    assert np.array_equal(comp.read([(2, 5), (3, 6)]), expected[2:5, 3:6])
    assert np.array_equal(members[1].to_numpy(), right)
