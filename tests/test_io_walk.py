"""The located walks of io/walk.py: which parts each container kind yields, where they
sit, and what each fault policy does at a fault.

Expected byte ranges are typed from the spec tables (a 61-byte float32 [3, 4] descriptor
from metadata.md § Worked Example, the 12-byte message header of interchange.md §
Message Framing, the 64-byte file header and 40-byte trailer of file-format.md).
"""

from __future__ import annotations

import mmap
import tempfile

import numpy as np
import pytest

from hurray_schema import SpecViolation, audit
from hurray_schema.io import walk as located
from hurray_schema.io.file import write_file
from hurray_schema.io.stream import write_stream
from hurray_schema.io.tensor import Composite, Tensor
from hurray_schema.model import CompositionRule, ElementType
from hurray_schema.rules.engine import Mode

# A float32 [3, 4] row-major tensor with one 48-byte buffer (metadata.md § Worked Example).
ROW_MAJOR_F32_3X4 = bytes.fromhex(
    "4852525901003d000000000000000301020000000300000000000000"
    "040000000000000000000000000000000130000000000000004000000000000000"
)
DESCRIPTOR_BYTES, BUFFER_BYTES = 61, 48
MESSAGE_HEADER_BYTES, TRANSPORT_BYTES, DATA_HEADER_BYTES = 12, 16, 8
FILE_HEADER_BYTES, TRAILER_BYTES, FILE_ALIGNMENT = 64, 40, 4096


def strict(buf, base, depth):
    return located.strict_descriptor(buf, base, depth, mode=Mode.STRICT)


def collect(buf, base, depth):
    return located.collect_descriptor(buf, base, depth, Mode.STRICT)


def kinds_and_ranges(parts):
    return [(p.kind, p.start, p.end) for p in parts]


def test_bare_stream_parts_are_located():
    stream = ROW_MAJOR_F32_3X4 + bytes(range(BUFFER_BYTES))
    for faults, describe in ((located.Faults.RAISE, strict), (located.Faults.COLLECT, collect)):
        parts = list(located.walk_bare(located.Window(stream), describe, faults=faults, mode=Mode.STRICT))
        assert kinds_and_ranges(parts) == [("descriptor", 0, 61), ("buffer", 61, 109)], faults
        assert bytes(parts[1].value) == bytes(range(BUFFER_BYTES))
        assert parts[0].value.shape == (3, 4)


def test_bare_stream_truncated_buffer_under_each_policy():
    stream = ROW_MAJOR_F32_3X4 + bytes(40) + ROW_MAJOR_F32_3X4  # the second descriptor eats into the buffer
    short = ROW_MAJOR_F32_3X4 + bytes(40)
    with pytest.raises(SpecViolation) as caught:
        list(located.walk_bare(located.Window(short), strict, faults=located.Faults.RAISE, mode=Mode.STRICT))
    assert (caught.value.rule_id, caught.value.offset) == ("stream.truncated", 101)
    collected = list(located.walk_bare(located.Window(short), collect, faults=located.Faults.COLLECT,
                                       mode=Mode.STRICT))
    fault = collected[-1]
    assert fault.kind == "fault" and fault.start == 61
    assert (fault.fault.rule_id, fault.fault.offset) == ("stream.truncated", 101)
    assert fault.note == "buffer 0 needs 48 bytes, 40 remain"
    # the walk goes on past a buffer that fits (the second descriptor's 61 bytes hold 48)
    parts = list(located.walk_bare(located.Window(stream), collect, faults=located.Faults.COLLECT,
                                   mode=Mode.STRICT))
    assert [p.kind for p in parts][:3] == ["descriptor", "buffer", "descriptor"]


def test_bare_stream_per_tensor_pairs_each_descriptor_with_its_buffer_views(tmp_path):
    """``per_tensor``: the descriptors of the part-by-part walk and their offsets, each with the
    values of its buffer parts (flat byte views, in a tuple); the same fault where a buffer is cut
    off; RAISE only.  Over bytes, over a memoryview and over a memory map alike."""
    stream = 3 * (ROW_MAJOR_F32_3X4 + bytes(range(BUFFER_BYTES)))
    strict_describe = located.strict_describer(mode=Mode.STRICT)  # the readers' describer (header lookup shared)
    (tmp_path / "s.bin").write_bytes(stream)
    with open(tmp_path / "s.bin", "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    for source in (stream, memoryview(stream), bytearray(stream), mapped):
        for describe in (strict, strict_describe):
            parts = list(located.walk_bare(located.Window(source), describe, faults=located.Faults.RAISE,
                                           mode=Mode.STRICT))
            triples = list(located.walk_bare(located.Window(source), describe, faults=located.Faults.RAISE,
                                             mode=Mode.STRICT, per_tensor=True))
            descriptors = [p for p in parts if p.kind == "descriptor"]
            assert [desc for desc, _, _ in triples] == [p.value for p in descriptors]
            assert [start for _, start, _ in triples] == [p.start for p in descriptors] == [0, 109, 218]
            assert [[bytes(v) for v in views] for _, _, views in triples] == [[bytes(range(BUFFER_BYTES))]] * 3
            assert all(type(views) is tuple and all(v.format == "B" and v.ndim == 1 for v in views)
                       for _, _, views in triples)
    short = stream[:-8]
    with pytest.raises(SpecViolation) as caught:
        list(located.walk_bare(located.Window(short), strict_describe, faults=located.Faults.RAISE,
                               mode=Mode.STRICT, per_tensor=True))
    assert (caught.value.rule_id, caught.value.offset) == ("stream.truncated", len(short))
    with pytest.raises(ValueError):
        located.walk_bare(located.Window(stream), collect, faults=located.Faults.COLLECT, mode=Mode.STRICT,
                          per_tensor=True)


def test_nesting_depth_follows_binding():
    def t(n):
        return Tensor.from_numpy(np.zeros(n, np.float32))

    inner = Composite.build(CompositionRule.GROUP, [t(2), t(3)], shape=(2,), type_tag=ElementType.FLOAT32)
    outer = Composite.build(CompositionRule.GROUP, [t(1), inner], shape=(2,), type_tag=ElementType.FLOAT32)
    stream = write_stream(None, [outer, t(4)])
    parts = located.walk_bare(located.Window(stream), collect, faults=located.Faults.COLLECT, mode=Mode.STRICT)
    assert [p.depth for p in parts if p.kind == "descriptor"] == [0, 1, 1, 2, 2, 0]


def test_message_stream_parts_under_raise_and_annotate():
    tensor = Tensor(strict(ROW_MAJOR_F32_3X4, 0, 0).value, [bytes(BUFFER_BYTES)])
    stream = write_stream(None, [tensor], framing="messages")
    descriptor_at = MESSAGE_HEADER_BYTES
    data_message = descriptor_at + DESCRIPTOR_BYTES + TRANSPORT_BYTES
    data_at = data_message + MESSAGE_HEADER_BYTES + DATA_HEADER_BYTES
    end_message = data_at + BUFFER_BYTES
    raised = list(located.walk_messages(located.Window(stream), strict, faults=located.Faults.RAISE,
                                        mode=Mode.STRICT))
    assert kinds_and_ranges(raised) == [
        ("message", 0, data_message), ("descriptor", descriptor_at, descriptor_at + DESCRIPTOR_BYTES),
        ("transport", descriptor_at + DESCRIPTOR_BYTES, data_message),
        ("message", data_message, end_message), ("data", data_at, end_message),
        ("message", end_message, end_message + MESSAGE_HEADER_BYTES),
        ("tensor end", end_message, end_message + MESSAGE_HEADER_BYTES),
    ]
    annotated = list(located.walk_messages(located.Window(stream), collect, faults=located.Faults.ANNOTATE,
                                           mode=Mode.STRICT))
    assert [p.kind for p in annotated] == [
        "message", "message header", "descriptor", "transport", "message", "message header", "data header", "data",
        "message", "message header"]


def test_message_stream_cut_inside_a_payload():
    tensor = Tensor(strict(ROW_MAJOR_F32_3X4, 0, 0).value, [bytes(BUFFER_BYTES)])
    stream = write_stream(None, [tensor], framing="messages")[:MESSAGE_HEADER_BYTES + 30]
    with pytest.raises(SpecViolation) as caught:
        list(located.walk_messages(located.Window(stream), strict, faults=located.Faults.RAISE, mode=Mode.STRICT))
    assert caught.value.rule_id == "stream.message.truncated"
    parts = list(located.walk_messages(located.Window(stream), collect, faults=located.Faults.ANNOTATE,
                                       mode=Mode.STRICT))
    assert parts[-1].kind == "fault" and parts[-1].start == MESSAGE_HEADER_BYTES
    assert parts[-1].note == "payload_length 77 runs past the end (30 bytes remain)"


def test_file_parts_in_reader_protocol_order(tmp_path):
    path = tmp_path / "f.hrry"
    tensor = Tensor(strict(ROW_MAJOR_F32_3X4, 0, 0).value, [bytes(BUFFER_BYTES)])
    write_file(path, {"w": tensor})
    data = path.read_bytes()
    parts = list(located.walk_file(memoryview(data), strict, faults=located.Faults.RAISE, mode=Mode.STRICT))
    assert [p.kind for p in parts] == ["file header", "trailer", "index", "kv", "descriptor", "tensor data"]
    assert (parts[0].start, parts[0].end) == (0, FILE_HEADER_BYTES)
    assert (parts[1].start, parts[1].end) == (len(data) - TRAILER_BYTES, len(data))
    descriptor, spans = parts[4], parts[5]
    assert (descriptor.start, descriptor.end) == (FILE_HEADER_BYTES, FILE_HEADER_BYTES + 61)
    assert (spans.note, spans.value) == ("w", [(FILE_ALIGNMENT, BUFFER_BYTES)])
    assert [e.name for e in parts[2].value] == ["w"]


def test_file_with_unreadable_index_is_located_by_the_region():
    from pathlib import Path

    data = bytearray((Path(__file__).resolve().parents[1] / "hurray_schema" / "samples" / "sample.hrry").read_bytes())
    data[-TRAILER_BYTES : -TRAILER_BYTES + 8] = (10**9).to_bytes(8, "little")  # index_offset past the end
    with pytest.raises(SpecViolation) as caught:
        list(located.walk_file(memoryview(bytes(data)), strict, faults=located.Faults.RAISE, mode=Mode.STRICT))
    assert caught.value.rule_id == "file.index.bounds"
    parts = list(located.walk_file(memoryview(bytes(data)), collect, faults=located.Faults.COLLECT,
                                   mode=Mode.STRICT))
    assert [p.start for p in parts if p.kind == "descriptor"] == [64, 120, 4144, 8240]
    assert [p.depth for p in parts if p.kind == "descriptor"] == [0, 1, 1, 0]
    assert any(p.kind == "fault" and "index cannot be read" in p.note for p in parts)


def test_detect_kind_is_the_walks():
    from hurray_schema import hexview

    assert hexview.detect_kind is located.detect_kind
    assert located.detect_kind(ROW_MAJOR_F32_3X4) == "descriptor"
    assert located.detect_kind(ROW_MAJOR_F32_3X4 + bytes(BUFFER_BYTES)) == "stream"
    assert located.detect_kind(b"HRRYFILE" + bytes(100)) == "file"
    assert located.detect_kind(b"nothing we know") == "unknown"


def test_memory_input_maps_a_path(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4)
    with located.memory_input(str(path)) as view:
        assert isinstance(view.obj, mmap.mmap) and bytes(view) == ROW_MAJOR_F32_3X4
    with open(path, "rb") as fh, located.memory_input(fh) as view:
        assert isinstance(view.obj, mmap.mmap)
    with located.memory_input(ROW_MAJOR_F32_3X4) as view:
        assert view.obj is ROW_MAJOR_F32_3X4


def test_audit_of_a_file_in_memory_writes_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "f.hrry"
    tensor = Tensor(strict(ROW_MAJOR_F32_3X4, 0, 0).value, [bytes(BUFFER_BYTES)])
    write_file(path, {"w": tensor})
    raw = path.read_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("audit wrote a temporary file")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert audit(raw).ok
    broken = audit(raw[:-8] + bytes(8))  # trailer_magic zeroed
    assert [f.rule_id for f in broken.findings] == ["file.trailer.magic"]


def test_the_index_crc_is_the_crc32c_packages():
    """io.crc loads the crc32c package's function without the package's slow __init__: the same CRC,
    continued from a value as the package continues it (the check value of ``123456789`` included)."""
    import crc32c as package

    from hurray_schema.io.crc import crc32c

    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C check value
    data = np.random.default_rng(5).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    assert crc32c(data) == package.crc32c(data)
    assert crc32c(data[5000:], crc32c(data[:5000])) == package.crc32c(data)
    assert crc32c(memoryview(data)[10:99]) == package.crc32c(data[10:99])
