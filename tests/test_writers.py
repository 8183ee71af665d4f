"""Writer safety: nothing lost, nothing invalid written, no foreign encoder error.

* ``write_file`` / ``write_stream`` to a path replace the target only with a complete
  file: a failure mid-write, an item that does not encode and a refused item all keep the
  previous file byte for byte and leave no temporary file; a file can be rewritten from
  its own memory-mapped tensors.
* Both writers refuse, before the first byte, every invalid composite and descriptor a
  strict reader rejects, with the reader's rule id -- compared with what ``read_file`` /
  ``read_stream`` say about the same items written with ``validate=False``.
* A value that does not fit its wire field raises ``FieldRangeError`` naming the field,
  from ``encode_descriptor`` and from both writers.
* Hypothesis: whatever the writers accept reads back in strict mode with the same
  content; whatever they refuse, the strict reader refuses with the same rule id.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import struct

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hurray_schema import signature
from hurray_schema.codec import encode_descriptor, peek_descriptor_length
from hurray_schema.errors import EncodeError, FieldRangeError, HurraySchemaError, SpecViolation
from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file, write_stream
from hurray_schema.io import _write as writer_internals
from hurray_schema.io.tensor import walk
from hurray_schema.model import (
    BufferHandle, CombineOp, CompositeLayout, CompositeMember, CompositionRule, ElementType, MemberRole,
    PerTensorAffine, Shard, TensorDescriptor,
)
from hurray_schema.structs._declare import plan
from hurray_schema.structs.descriptor import FIXED_HEADER_SIZE, MAGIC
from hurray_schema.structs.file import FILE_HEADER
from hurray_schema.structs.stream import MESSAGE_HEADER

F32, I8 = ElementType.FLOAT32, ElementType.INT8
MESSAGE_HEADER_SIZE = plan(MESSAGE_HEADER).fixed_size


def dense(shape, offset=None, parent=(4, 6), tag=F32, fill=0, **fields) -> Tensor:
    n = int(np.prod(shape)) * (1 if tag == I8 else 4)
    return Tensor.dense(tag, shape, bytes([fill]) * n, shard=None if offset is None else Shard(parent, offset),
                        **fields)


def partition(*members, shape=(4, 6)) -> Composite:
    return Composite.build("partition", list(members), shape=shape, type_tag=F32)


def overlay(*members, shape=(4, 4)) -> Composite:
    return Composite.build("overlay", list(members), shape=shape, type_tag=F32, combine_op="add")


def nest(levels: int):
    item = dense((1,))
    for _ in range(levels):
        item = Composite.build("group", [item], shape=[1], type_tag=F32)
    return item


def good_partition() -> Composite:
    return partition(dense((4, 3), (0, 0), fill=1), dense((4, 3), (0, 3), fill=2))


CORRECTION = CompositeMember(MemberRole.CORRECTION)

INVALID = {
    "partition gap": lambda: partition(dense((4, 3), (0, 0)), dense((4, 2), (0, 3))),
    "partition overlap": lambda: partition(dense((4, 4), (0, 0)), dense((4, 3), (0, 3))),
    "wrong parent shape": lambda: partition(dense((4, 3), (0, 0)), dense((4, 3), (0, 3), parent=(4, 7))),
    "wrong member type": lambda: partition(dense((4, 3), (0, 0)), dense((4, 3), (0, 3), tag=I8)),
    "box outside the head": lambda: partition(dense((4, 3), (0, 0)), dense((4, 3), (0, 4))),
    "member without shard": lambda: partition(dense((4, 3), (0, 0)), dense((4, 3))),
    "partition member with a member section": lambda: partition(
        dense((4, 3), (0, 0)), dense((4, 3), (0, 3), composite_member=CORRECTION)),
    "overlay whose first member is not the base": lambda: overlay(
        dense((4, 4), (0, 0), parent=(4, 4), composite_member=CORRECTION), dense((1, 1), (1, 1), parent=(4, 4))),
    "overlay base not spanning": lambda: overlay(dense((2, 4), (0, 0), parent=(4, 4)),
                                                 dense((1, 1), (1, 1), parent=(4, 4))),
    "overlay without members": lambda: overlay(),
    "undersized buffer": lambda: Tensor(TensorDescriptor(F32, (4,), buffers=(BufferHandle(8, 64),)), [bytes(8)]),
    "rank 65": lambda: dense((1,) * 65),
    "nested 9 deep": lambda: nest(9),
    "unknown type tag": lambda: Tensor(TensorDescriptor(0x7E, (4,), buffers=(BufferHandle(4, 64),)), [bytes(4)]),
    "reserved handle byte": lambda: Tensor(TensorDescriptor(F32, (1,), buffers=(BufferHandle(4, 64, reserved=1),)),
                                           [bytes(4)]),
    "invalid member deep inside a group": lambda: Composite.build(
        "group", [dense((2,)), partition(dense((4, 3), (0, 0)), dense((4, 2), (0, 3)))], shape=(2,), type_tag=F32),
}

KINDS = ("file", "bare", "messages")


def _written(kind, path, items: dict, **options):
    """Write ``items`` with one of the writers; the bytes written."""
    if kind == "file":
        write_file(path, items, **options)
        return path.read_bytes()
    return write_stream(None, list(items.values()), framing=kind, **options)


def _read_all(kind, path, data):
    """Read ``data`` strictly back: the items (file: with their names)."""
    if kind == "file":
        path.write_bytes(data)
        f = read_file(path)
        return {name: f[name] for name in f}, f  # the caller closes f
    return list(read_stream(data, framing=kind)), None


def _reader_violation(kind, path, data) -> SpecViolation:
    with pytest.raises(SpecViolation) as info:
        _read_all(kind, path, data)
    return info.value


def _same_place(writer: SpecViolation, reader: SpecViolation, data: bytes) -> bool:
    """The writer's offset is the reader's, or lies inside the descriptor the reader
    names (a reader locates composite-member faults at the member's descriptor -- in a
    message stream at its message -- where the writer names the field)."""
    if writer.offset == reader.offset:
        return True
    if writer.offset is None or reader.offset is None:
        return False
    start = reader.offset
    if data[start:start + len(MAGIC)] != MAGIC:
        start += MESSAGE_HEADER_SIZE
    if data[start:start + len(MAGIC)] != MAGIC:
        return False
    end = start + peek_descriptor_length(data[start:start + FIXED_HEADER_SIZE])
    return start <= writer.offset < end


# --------------------------------------------------------------------------------------
# Nothing invalid written
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(INVALID))
def test_writers_refuse_what_the_strict_reader_rejects_with_its_rule(tmp_path, kind, case):
    target = tmp_path / "out.hrry"
    with pytest.raises(SpecViolation) as refused:
        _written(kind, target, {"x": INVALID[case]()})
    assert not target.exists() and os.listdir(tmp_path) == []  # not one byte, no temporary file
    data = _written(kind, tmp_path / "faulty.hrry", {"x": INVALID[case]()}, validate=False)
    rejected = _reader_violation(kind, tmp_path / "read.hrry", data)
    assert refused.value.rule_id == rejected.rule_id, (refused.value, rejected)
    assert refused.value.offset is not None and _same_place(refused.value, rejected, data), (refused.value, rejected)


@pytest.mark.parametrize("kind", KINDS)
def test_the_offset_is_where_the_fault_sits_in_the_output(tmp_path, kind):
    """A gap in the second top-level item: the offset is the head's, after the first item."""
    first, gap = dense((6,)), INVALID["partition gap"]()
    with pytest.raises(SpecViolation) as refused:
        _written(kind, tmp_path / "o.hrry", {"a": first, "g": gap})
    data = _written(kind, tmp_path / "o.hrry", {"a": first, "g": gap}, validate=False)
    head = encode_descriptor(gap.descriptor)
    assert data.count(head) == 1
    assert refused.value.rule_id == "composite.close.partition_gap"
    assert refused.value.offset == data.index(head)


def test_a_stream_to_a_file_object_is_refused_before_the_first_byte():
    sink = io.BytesIO()

    def items():
        yield dense((6,))
        yield INVALID["partition overlap"]()

    with pytest.raises(SpecViolation):
        write_stream(sink, items())
    assert sink.getvalue() == b""
    write_stream(sink, items(), validate=False)  # item by item, as asked
    assert sink.getvalue().startswith(encode_descriptor(dense((6,)).descriptor))


def test_a_file_reports_a_composite_fault_at_open_before_a_later_read_fault(tmp_path):
    """The file reader checks composites (and data-less tensors) at open and every other tensor
    on its first read; the stream reader checks each tensor as it arrives: the writers look for
    the first fault in the same order."""
    items = {"r": INVALID["rank 65"](), "g": INVALID["partition gap"]()}  # a tensor with data, then a composite
    with pytest.raises(SpecViolation) as file_refusal:
        write_file(tmp_path / "f.hrry", items)
    with pytest.raises(SpecViolation) as stream_refusal:
        write_stream(None, list(items.values()))
    assert file_refusal.value.rule_id == "composite.close.partition_gap"
    assert stream_refusal.value.rule_id == "descriptor.rank.cap"
    data = _written("file", tmp_path / "w.hrry", items, validate=False)
    (tmp_path / "r.hrry").write_bytes(data)
    with pytest.raises(SpecViolation) as at_open:
        read_file(tmp_path / "r.hrry")
    assert at_open.value.rule_id == "composite.close.partition_gap"
    with read_file(tmp_path / "r.hrry", validate_composites=False) as f:  # the composite unchecked: r's fault on read
        with pytest.raises(SpecViolation) as on_read:
            f["r"]
    assert on_read.value.rule_id == "descriptor.rank.cap"


def test_a_data_less_tensor_is_checked_at_open(tmp_path):
    """A tensor with no data bytes is decoded at open (it may be a composite head), so its
    descriptor fault comes before a composite's that follows it, as the writer reports."""
    items = {"r": dense((0,) * 65), "g": INVALID["partition gap"]()}
    with pytest.raises(SpecViolation) as file_refusal:
        write_file(tmp_path / "f.hrry", items)
    assert file_refusal.value.rule_id == "descriptor.rank.cap"
    assert _reader_violation("file", tmp_path / "r.hrry", _written(
        "file", tmp_path / "w.hrry", items, validate=False)).rule_id == "descriptor.rank.cap"


@pytest.mark.parametrize("kind", KINDS)
def test_valid_composites_are_written_and_read_back(tmp_path, kind):
    items = {"p": good_partition(), "o": overlay(dense((4, 4), (0, 0), parent=(4, 4)), dense((1, 2), (2, 1),
                                                                                             parent=(4, 4), fill=3)),
             "n": nest(8)}
    data = _written(kind, tmp_path / "ok.hrry", items)
    got, f = _read_all(kind, tmp_path / "ok.hrry", data)
    try:
        values = list(got.values()) if isinstance(got, dict) else got
        assert all(a.same_content(b) for a, b in zip(values, items.values())) and len(values) == len(items)
    finally:
        if f is not None:
            f.close()


def test_buffers_that_do_not_match_their_handles_are_an_encode_error(tmp_path):
    x = dense((4,))
    for bad in (Tensor(x.descriptor, [bytes(15)]), Tensor(x.descriptor, [])):
        with pytest.raises(EncodeError):
            write_file(tmp_path / "b.hrry", {"x": bad})
        with pytest.raises(EncodeError):
            write_stream(None, [bad], framing="messages")
    assert os.listdir(tmp_path) == []
    data = write_stream(None, [Tensor(x.descriptor, [bytes(15)])], validate=False)  # a truncated stream
    assert _reader_violation("bare", None, data).rule_id == "stream.truncated"


# --------------------------------------------------------------------------------------
# Nothing lost
# --------------------------------------------------------------------------------------


def _previous(tmp_path):
    path = tmp_path / "model.hrry"
    write_file(path, {"w": good_partition(), "b": dense((6,), fill=7)}, metadata={"k": "v"})
    return path, path.read_bytes()


def _fail_after(monkeypatch, exc, after: int = 100):
    """Make the real (not the laying-out) writes fail once ``after`` bytes are written."""
    real = writer_internals.Sink.write

    def write(self, data):
        if self.f is not None and self.pos >= after:
            raise exc
        real(self, data)

    monkeypatch.setattr(writer_internals.Sink, "write", write)


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_mid_write_keeps_the_previous_file(tmp_path, monkeypatch, exc):
    path, before = _previous(tmp_path)
    _fail_after(monkeypatch, exc)
    with pytest.raises(type(exc)):
        write_file(path, {"a": dense((4096,)), "b": dense((4096,))})
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.hrry"]
    with pytest.raises(type(exc)):
        write_stream(path, [dense((4096,)), dense((4096,))])
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.hrry"]


def test_a_failing_fsync_keeps_the_previous_file(tmp_path, monkeypatch):
    path, before = _previous(tmp_path)

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):
        write_file(path, {"b": dense((6,))})
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.hrry"]


@pytest.mark.parametrize("validate", [True, False])
def test_an_item_that_does_not_encode_keeps_the_previous_file(tmp_path, validate):
    path, before = _previous(tmp_path)
    bad = Tensor(TensorDescriptor(300, (1,), buffers=(BufferHandle(4, 64),)), [bytes(4)])
    with pytest.raises(FieldRangeError):
        write_file(path, {"first": dense((6,)), "bad": bad}, validate=validate)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.hrry"]


def test_a_refused_item_keeps_the_previous_file(tmp_path):
    path, before = _previous(tmp_path)
    with pytest.raises(SpecViolation):
        write_file(path, {"first": dense((6,)), "gap": INVALID["partition gap"]()})
    with pytest.raises(SpecViolation):
        write_stream(path, [dense((6,)), INVALID["partition gap"]()])
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.hrry"]


def test_a_file_is_rewritten_from_its_own_mapped_tensors(tmp_path):
    path, before = _previous(tmp_path)
    with read_file(path) as f:
        items = {name: f[name] for name in f}
        bias = f["b"].to_numpy()
        write_file(path, items, metadata=f.kv)  # the views map the file being replaced
        assert path.read_bytes() == before  # same content, same layout
        write_file(path, {**items, "extra": dense((3,), fill=9)})
        np.testing.assert_array_equal(f["b"].to_numpy(), bias)  # the old maps still see the old bytes
        after = path.read_bytes()
        with pytest.raises(SpecViolation):  # a refused rewrite from the maps keeps the file
            write_file(path, {**items, "gap": INVALID["partition gap"]()})
        assert path.read_bytes() == after
    assert os.listdir(tmp_path) == ["model.hrry"]
    with read_file(path) as g:
        assert sorted(g) == ["b", "extra", "w"]
        assert g["w"].same_content(good_partition()) and g["b"].same_content(dense((6,), fill=7))
        assert g["extra"].same_content(dense((3,), fill=9))


def test_a_stream_file_is_rewritten_from_what_was_read(tmp_path):
    path = tmp_path / "s.stream"
    write_stream(path, [good_partition(), dense((6,), fill=7)])
    before = path.read_bytes()
    with open(path, "rb") as source:
        items = list(read_stream(source))
        write_stream(path, items)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["s.stream"]


def test_permissions_are_kept_and_links_followed(tmp_path):
    path, _ = _previous(tmp_path)
    os.chmod(path, 0o640)
    link = tmp_path / "link.hrry"
    link.symlink_to(path.name)
    write_file(link, {"only": dense((2,))})
    assert link.is_symlink() and stat.S_IMODE(os.stat(path).st_mode) == 0o640
    with read_file(path) as f:
        assert list(f) == ["only"]
    assert sorted(os.listdir(tmp_path)) == ["link.hrry", "model.hrry"]


# --------------------------------------------------------------------------------------
# Out-of-range fields
# --------------------------------------------------------------------------------------

H = (BufferHandle(4, 64),)
OUT_OF_RANGE = {
    "shape[0]": TensorDescriptor(F32, (2 ** 64,), buffers=H),
    "byte_size": TensorDescriptor(F32, (1,), buffers=(BufferHandle(-1, 64),)),
    "type_tag": TensorDescriptor(300, (1,), buffers=H),
    "buffer_count": TensorDescriptor(F32, (1,), buffers=(BufferHandle(0, 64),) * 256),
    "alignment": TensorDescriptor(F32, (1,), buffers=(BufferHandle(4, 2 ** 32),)),
    "shard_offset[1]": TensorDescriptor(F32, (1, 1), buffers=H, shard=Shard((2, 2), (0, -1))),
    "scale": TensorDescriptor(I8, (4,), buffers=H, quantization=PerTensorAffine(1e39, 0)),
    "zero_point": TensorDescriptor(I8, (4,), buffers=H, quantization=PerTensorAffine(0.5, 2 ** 40)),
}


def _tensor_of(desc: TensorDescriptor) -> Tensor:
    return Tensor(desc, [bytes(h.byte_size) if h.byte_size >= 0 else b"" for h in desc.buffers])


@pytest.mark.parametrize("field", sorted(OUT_OF_RANGE))
def test_an_out_of_range_field_is_named(field):
    desc = OUT_OF_RANGE[field]
    with pytest.raises(FieldRangeError) as info:
        encode_descriptor(desc)
    assert info.value.field == field and field in str(info.value) and info.value.citation
    assert isinstance(info.value, HurraySchemaError) and not isinstance(info.value, struct.error)


@pytest.mark.parametrize("field", sorted(set(OUT_OF_RANGE) - {"buffer_count"}))  # 256 handles never encode
def test_the_compiled_encoder_gives_the_same_error(field):
    """Once a well-formed descriptor of the same shape compiled an encoder, the bad one
    still comes out of the general encoder's check."""
    bad = OUT_OF_RANGE[field]
    good = attrs.evolve(bad, type_tag=bad.type_tag if field != "type_tag" else F32,
                        shape=tuple(1 for _ in bad.shape),
                        buffers=tuple(BufferHandle(4, 64) for _ in bad.buffers),
                        shard=None if bad.shard is None else Shard((2, 2), (0, 0)),
                        quantization=None if bad.quantization is None else PerTensorAffine(0.5, 0))
    encode_descriptor(good)
    assert signature.encode(good, lambda d: b"general") == encode_descriptor(good)  # the compiled path
    with pytest.raises(FieldRangeError) as info:
        encode_descriptor(bad)
    assert info.value.field == field


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("field", sorted(OUT_OF_RANGE))
def test_writers_name_the_out_of_range_field(tmp_path, kind, validate, field):
    with pytest.raises(FieldRangeError) as info:
        _written(kind, tmp_path / "x.hrry", {"x": _tensor_of(OUT_OF_RANGE[field])}, validate=validate)
    assert info.value.field == field
    assert os.listdir(tmp_path) == []


def test_container_fields_are_checked_too():
    header = plan(FILE_HEADER)
    values = dict(magic=b"HRRYFILE", container_version_major=1, container_version_minor=0, _reserved=bytes(2),
                  file_flags=0, data_buffer_alignment=4096, first_descriptor_offset=64, tensor_count_hint=0,
                  _reserved_header=bytes(28))
    assert len(header.pack(**values)) == header.fixed_size
    for name, value, why in (("_reserved", bytes(3), "3 bytes"), ("tensor_count_hint", -1, "out of range"),
                             ("file_flags", "x", "not an integer")):
        with pytest.raises(FieldRangeError) as info:
            header.pack(**{**values, name: value})
        assert info.value.field == name and why in str(info.value), info.value


@settings(max_examples=150, deadline=None)
@given(st.integers(-2 ** 70, 2 ** 70), st.integers(-2 ** 70, 2 ** 70), st.integers(-400, 400),
       st.integers(0, 300), st.floats(allow_nan=True, width=64))
def test_encoding_gives_bytes_or_a_named_field(dim, size, tag, count, scale):
    quant = PerTensorAffine(scale, 0) if tag % 2 else None
    desc = TensorDescriptor(tag if tag % 3 else I8, (dim, 1), buffers=(BufferHandle(size, 64),) * min(count, 300),
                            quantization=quant)
    try:
        data = encode_descriptor(desc)
    except FieldRangeError as exc:
        assert exc.field is not None and exc.field.split("[")[0] in {
            "shape", "byte_size", "type_tag", "buffer_count", "scale"}, exc
    else:
        assert data.startswith(MAGIC)


# --------------------------------------------------------------------------------------
# Property: accepted means readable; refused means the reader refuses it too
# --------------------------------------------------------------------------------------


def _member(shape, tag, fill, shard, role) -> Tensor:
    n = int(np.prod(shape)) * (1 if tag == I8 else 4)
    return Tensor.dense(tag, shape, bytes([fill]) * n, shard=shard,
                        composite_member=None if role is None else CompositeMember(role))


@st.composite
def composites(draw):
    rank = draw(st.integers(1, 2))
    head = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    rule = draw(st.sampled_from([CompositionRule.PARTITION, CompositionRule.OVERLAY, CompositionRule.GROUP]))
    if draw(st.booleans()):  # a tiling along dimension 0: valid unless altered below
        cuts = sorted(set(draw(st.lists(st.integers(1, head[0] - 1), max_size=2)))) if head[0] > 1 else []
        bounds = [0, *cuts, head[0]]
        boxes = [((a,) + (0,) * (rank - 1), (b - a,) + head[1:]) for a, b in zip(bounds, bounds[1:])]
    else:
        boxes = [(tuple(draw(st.integers(0, h)) for h in head), tuple(draw(st.integers(0, h)) for h in head))
                 for _ in range(draw(st.integers(0, 3)))]
    members = []
    for i, (offset, shape) in enumerate(boxes):
        tag = draw(st.sampled_from([F32, F32, F32, I8]))
        parent = head if draw(st.integers(0, 9)) else tuple(h + 1 for h in head)
        shard = Shard(parent, offset) if draw(st.integers(0, 9)) else None
        if rule == CompositionRule.OVERLAY and draw(st.integers(0, 5)):
            role = MemberRole.BASE if i == 0 else MemberRole.CORRECTION
        else:
            role = draw(st.sampled_from([None] * 6 + [MemberRole.BASE, MemberRole.CORRECTION]))
        if rule == CompositionRule.OVERLAY and i == 0 and draw(st.integers(0, 3)):
            offset, shape, shard = (0,) * rank, head, Shard(head, (0,) * rank)
        members.append(_member(shape, tag, i, shard, role))
    op = CombineOp.ADD if rule == CompositionRule.OVERLAY else CombineOp.NONE
    layout = CompositeLayout(composition_rule=rule, member_count=len(members), combine_op=op)
    item = Composite(TensorDescriptor(F32, head, layout), members)
    if draw(st.integers(0, 4)) == 0:
        item = Composite.build("group", [item, dense((2,))], shape=(2,), type_tag=F32)
    return item


def _flat(items) -> list:
    return [node for item in items for _, node in walk(item)]


def _same(read, written) -> bool:
    a, b = _flat(read), _flat(written)
    return len(a) == len(b) and all(
        x.descriptor == y.descriptor and (isinstance(x, Composite) or x.same_content(y)) for x, y in zip(a, b))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(composites(), min_size=1, max_size=2), st.sampled_from(KINDS))
def test_accepted_reads_back_strictly_and_refused_is_refused_by_the_reader(tmp_path, items, kind):
    named = {f"i{n}": item for n, item in enumerate(items)}
    target, scratch = tmp_path / "p.hrry", tmp_path / "q.hrry"
    try:
        data = _written(kind, target, named)
    except SpecViolation as refused:
        event(f"refused: {refused.rule_id}")
        faulty = _written(kind, scratch, named, validate=False)
        rejected = _reader_violation(kind, scratch, faulty)
        assert rejected.rule_id == refused.rule_id, (refused, rejected)
        assert _same_place(refused, rejected, faulty), (refused, rejected)
        return
    event("accepted")
    got, f = _read_all(kind, scratch, data)
    try:
        assert _same(list(got.values()) if isinstance(got, dict) else got, items)
    finally:
        if f is not None:
            f.close()


def test_a_uint64_kv_value_out_of_range_is_a_named_field_error():
    """KV values are bad arguments like any other field: a typed error naming the field."""
    from hurray_schema.io.walk.kv import UInt64

    with pytest.raises(FieldRangeError) as info:
        UInt64(1 << 64)
    assert info.value.field == "UInt64" and info.value.width == "uint64"
    with pytest.raises(FieldRangeError):
        UInt64(-1)
    assert UInt64((1 << 64) - 1) == (1 << 64) - 1
