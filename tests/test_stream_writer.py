"""``StreamWriter`` and the framing detection of ``read_stream``.

* ``read_stream`` without ``framing=`` reads bare and message streams (from bytes, a path,
  a seekable file object, a pipe, a reader that returns one byte at a time) like it does
  with the framing given; a given framing is used as it is.
* ``StreamWriter`` writes what pyhurray's stream writer writes for the same items (bare
  framing), whole composites and composites whose members come one by one alike; it is
  checked like ``write_stream`` (the strict reader's rule id for each fault, reported
  once), and to a path it is atomic: an exception, a torn or an invalid composite leave
  the previous file byte for byte and no temporary file.
"""

from __future__ import annotations

import io
import os
import threading

import numpy as np
import pytest

from hurray_schema.codec import encode_descriptor
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.io import Composite, StreamWriter, Tensor, read_stream, write_stream
from hurray_schema.io.stream import detect_framing
from hurray_schema.model import CompositeMember, ElementType, MemberRole, Shard

hurray = pytest.importorskip("hurray")

F32 = ElementType.FLOAT32


def dense(values, shape, offset=None, parent=None, **fields) -> Tensor:
    data = np.asarray(values, np.float32).reshape(shape)
    return Tensor.dense(F32, shape, data.tobytes(), shard=None if offset is None else Shard(parent, offset), **fields)


def good_partition() -> Composite:
    return Composite.build("partition", [dense(range(12), (4, 3), (0, 0), (4, 6)),
                                         dense(range(12, 24), (4, 3), (0, 3), (4, 6))], shape=(4, 6), type_tag=F32)


def gap_partition() -> Composite:
    return Composite.build("partition", [dense(range(12), (4, 3), (0, 0), (4, 6)),
                                         dense(range(8), (4, 2), (0, 3), (4, 6))], shape=(4, 6), type_tag=F32)


def items() -> list:
    overlay = Composite.build("overlay", [dense(range(16), (4, 4), (0, 0), (4, 4)),
                                          dense([9, 9], (1, 2), (2, 1), (4, 4))],
                              shape=(4, 4), type_tag=F32, combine_op="add")
    group = Composite.build("group", [dense([1, 2, 3], (3,)), good_partition()], shape=(3,), type_tag=F32)
    return [dense([1.5, -2.0], (2,)), good_partition(), overlay, group, dense([7.0], (1, 1))]


def py_item(item):
    """The same item built with pyhurray (from our descriptor's fields)."""
    if isinstance(item, Composite):
        return hurray.Composite(item.rule.name.lower(), shape=list(item.shape), dtype=hurray.float32,
                                members=[py_item(m) for m in item.members],
                                **({"combine_op": item.combine_op.name.lower()}
                                   if item.rule.name == "OVERLAY" else {}))
    shard = item.descriptor.shard
    return hurray.Tensor(bytes(item.buffers[0]), hurray.float32, list(item.shape),
                         shard=None if shard is None else hurray.Shard(list(shard.parent_shape),
                                                                      list(shard.shard_offset)))


def pyhurray_stream(things) -> bytes:
    with hurray.StreamWriter() as w:
        for item in things:
            py = py_item(item)
            (w.write_composite if isinstance(py, hurray.Composite) else w.write)(py)
    return w.getvalue()


def same(got, expected) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.same_content(b), (a, b)


# --------------------------------------------------------------------------------------
# Framing detection
# --------------------------------------------------------------------------------------


class OneByteAtATime(io.RawIOBase):
    """A non-seekable reader returning one byte per read (a slow pipe)."""

    def __init__(self, data: bytes):
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n=-1) -> bytes:
        if self._pos >= len(self._data) or n == 0:
            return b""
        self._pos += 1
        return self._data[self._pos - 1 : self._pos]


def _pipe(data: bytes):
    read_end, write_end = os.pipe()

    def feed():
        with os.fdopen(write_end, "wb") as out:
            out.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return os.fdopen(read_end, "rb", buffering=0)


SOURCES = {
    "bytes": lambda data, tmp: data,
    "memoryview": lambda data, tmp: memoryview(data),
    "path": lambda data, tmp: (tmp / "s.bin").write_bytes(data) and tmp / "s.bin",
    "str path": lambda data, tmp: (tmp / "s.bin").write_bytes(data) and str(tmp / "s.bin"),
    "file object": lambda data, tmp: io.BytesIO(data),
    "pipe": lambda data, tmp: _pipe(data),
    "one byte at a time": lambda data, tmp: OneByteAtATime(data),
}


@pytest.mark.parametrize("framing", ["bare", "messages"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_framing_is_read_from_the_first_bytes(tmp_path, framing, source):
    written = items() + [Tensor.dense(F32, (0, 4))]  # an empty tensor last: its stream ends on a descriptor
    data = write_stream(None, written, framing=framing, max_frame_bytes=5)
    reader = read_stream(SOURCES[source](data, tmp_path))
    got = list(reader)
    reader.close()
    assert reader.framing == framing
    same(got, written)


def test_a_seekable_file_object_is_read_from_where_it_stands():
    data = write_stream(None, items(), framing="messages")
    f = io.BytesIO(b"prefix" + data)
    f.seek(len(b"prefix"))
    same(list(read_stream(f)), items())


def test_a_given_framing_wins():
    data = write_stream(None, items(), framing="messages")
    with pytest.raises(SpecViolation):
        list(read_stream(data, framing="bare"))
    bare = write_stream(None, items())
    assert read_stream(bare, framing="bare").framing == "bare"
    with pytest.raises(ValueError, match="framing"):
        read_stream(bare, framing="chunks")


def test_detect_framing_on_first_bytes():
    bare = write_stream(None, [dense([1], (1,))])
    messages = write_stream(None, [dense([1], (1,))], framing="messages")
    assert detect_framing(bare) == "bare"
    assert detect_framing(bare[:16]) == "bare"
    assert detect_framing(messages[:16]) == "messages"
    assert detect_framing(b"") == "bare"  # an empty stream has no tensors in either framing
    assert list(read_stream(b"")) == []


def test_pyhurray_streams_are_read_without_a_framing():
    data = pyhurray_stream(items())
    same(list(read_stream(data)), list(read_stream(data, framing="bare")))


# --------------------------------------------------------------------------------------
# StreamWriter
# --------------------------------------------------------------------------------------


def test_one_item_at_a_time_equals_pyhurray(tmp_path):
    with StreamWriter(tmp_path / "s.bin") as w:
        for item in items():
            w.write(item)
    assert (tmp_path / "s.bin").read_bytes() == pyhurray_stream(items())
    with StreamWriter(None) as memory:
        for item in items():
            memory.write(item)
    assert memory.getvalue() == pyhurray_stream(items())


def test_members_as_they_come(tmp_path):
    """Head first, then each member (a nested composite whole or member by member)."""
    group = items()[3]
    partition = group.members[1]
    with StreamWriter(None) as w:
        w.write(items()[0])
        w.begin_composite(group.descriptor)
        assert w.open_composites == 1
        w.write(group.members[0])
        w.begin_composite(partition.descriptor)
        assert w.open_composites == 2
        for member in partition.members:
            w.write(member)
        assert w.open_composites == 0
        w.write(items()[4])
    assert w.getvalue() == pyhurray_stream([items()[0], group, items()[4]])
    same(list(read_stream(w.getvalue())), [items()[0], group, items()[4]])


def test_messages_and_arrays(tmp_path):
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    with StreamWriter(tmp_path / "m.bin", framing="messages", stream_id=7, max_frame_bytes=4) as w:
        w.write(array)
        w.write(good_partition())
    got = list(read_stream(tmp_path / "m.bin"))
    assert np.array_equal(got[0].to_numpy(), [[0, 1, 2], [3, 4, 5]])
    assert got[1].same_content(good_partition())
    data = (tmp_path / "m.bin").read_bytes()
    assert data[4:8] == (7).to_bytes(4, "little")  # stream_id of the first message header


def test_a_file_object_gets_what_was_written(tmp_path):
    sink = io.BytesIO()
    with StreamWriter(sink) as w:
        w.write(items()[0])
    assert sink.getvalue() == pyhurray_stream(items()[:1])
    assert not sink.closed  # the caller's file stays open


@pytest.fixture
def previous(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"previous content")
    return path


def _unchanged(path) -> None:
    assert path.read_bytes() == b"previous content"
    assert os.listdir(path.parent) == [path.name]  # no temporary file left


def test_an_exception_in_the_block_keeps_the_previous_file(previous):
    with pytest.raises(RuntimeError, match="producer failed"):
        with StreamWriter(previous) as w:
            w.write(items()[0])
            w.write(good_partition())
            raise RuntimeError("producer failed")
    _unchanged(previous)
    with pytest.raises(HurraySchemaError, match="failed"):
        w.write(items()[0])


def test_a_composite_still_open_at_close_is_torn(previous):
    partition = good_partition()
    with pytest.raises(SpecViolation) as torn:
        with StreamWriter(previous) as w:
            w.begin_composite(partition.descriptor)
            w.write(partition.members[0])
    assert torn.value.rule_id == "composite.torn" and torn.value.offset == 0
    _unchanged(previous)
    reader_says = _reader_violation(write_stream(None, [partition.members[0]], validate=False),
                                    head=partition.descriptor)
    assert reader_says.rule_id == "composite.torn"


def _reader_violation(data: bytes, head=None) -> SpecViolation:
    if head is not None:
        data = encode_descriptor(head) + data
    with pytest.raises(SpecViolation) as info:
        list(read_stream(data))
    return info.value


@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_an_invalid_composite_raises_the_readers_rule_once(previous, framing):
    first = items()[0]
    with pytest.raises(SpecViolation) as refused:
        with StreamWriter(previous, framing=framing) as w:
            w.write(first)
            w.write(gap_partition())
    _unchanged(previous)
    assert refused.value.rule_id == "composite.close.partition_gap"
    assert refused.value.__context__ is None  # one fault, one rule: no torn composite reported after it
    faulty = write_stream(None, [first, gap_partition()], framing=framing, validate=False)
    reader_says = _reader_violation(faulty)
    assert (refused.value.rule_id, refused.value.offset) == (reader_says.rule_id, reader_says.offset)


def test_an_invalid_member_is_refused_before_its_first_byte():
    partition = good_partition()
    stray = dense(range(12), (4, 3), (0, 3), (4, 6), composite_member=CompositeMember(MemberRole.CORRECTION))
    sink = io.BytesIO()
    with pytest.raises(SpecViolation) as refused:
        with StreamWriter(sink) as w:
            w.begin_composite(partition.descriptor)
            w.write(partition.members[0])
            written = sink.getvalue()
            w.write(stray)
    assert sink.getvalue() == written  # the refused member wrote nothing
    reader_says = _reader_violation(write_stream(None, [partition.members[0], stray], validate=False),
                                    head=partition.descriptor)
    assert refused.value.rule_id == reader_says.rule_id


def test_validate_false_writes_what_it_is_given():
    with StreamWriter(None, validate=False) as w:
        w.write(gap_partition())
    assert w.getvalue() == write_stream(None, [gap_partition()], validate=False)
    assert _reader_violation(w.getvalue()).rule_id == "composite.close.partition_gap"


def test_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="framing"):
        StreamWriter(None, framing="chunks")
    with pytest.raises(ValueError, match="stream_id"):
        StreamWriter(None, framing="messages", stream_id=0)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        StreamWriter(None, max_frame_bytes=0)
    with pytest.raises(TypeError):
        StreamWriter(42)
    with StreamWriter(None) as w:
        with pytest.raises(HurraySchemaError, match="composite head"):
            w.begin_composite(items()[0].descriptor)
        with pytest.raises(HurraySchemaError, match="list"):
            w.write([1.0, 2.0])
    with pytest.raises(HurraySchemaError, match="closed"):
        w.write(items()[0])
    assert os.listdir(tmp_path) == []


def test_write_stream_takes_arrays_and_one_array_is_one_tensor():
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    got = list(read_stream(write_stream(None, array)))
    assert len(got) == 1 and np.array_equal(got[0].to_numpy(), array)
    got = list(read_stream(write_stream(None, [array, array[0]], framing="messages")))
    assert [t.shape for t in got] == [(2, 3), (3,)] and np.array_equal(got[1].to_numpy(), [0.0, 1.0, 2.0])
