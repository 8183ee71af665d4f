"""Interop lints (hurray_schema/rules/interop.py): each fires on what the reference writes,
passes on what the spec says, and is reported by audit without any reader rejecting the input."""

from __future__ import annotations

import hurray  # the reference implementation (pyhurray), an interop peer
import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.audit import audit
from hurray_schema.codec import encode_descriptor
from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file
from hurray_schema.model import (
    BufferHandle, CompositeLayout, CompositionRule, CooLayout, ElementType, PerTensorAffine, Shard, TensorDescriptor,
)
from hurray_schema.rules.engine import Level, get_rule
from hurray_schema.rules.interop import (
    BOOL_SCAN_BYTES, bool_packing_findings, head_padding_findings, stream_tensor_findings,
)

BOOL = ElementType.BOOL
UNPACKED, PADDING = "element_types.boolean.unpacked", "file.composite.head_padding"


def _bool(shape, size):
    return TensorDescriptor(BOOL, shape, buffers=[BufferHandle(size)])


def _ids(report) -> list[str]:
    return [f.rule_id for f in report.findings]


def test_rules_are_declared_with_their_level_and_citation():
    unpacked, padding = get_rule(UNPACKED), get_rule(PADDING)
    assert unpacked.level is Level.SHOULD and unpacked.citation == "element-types.md § Boolean Type"
    assert padding.level is Level.MUST_NOT and padding.citation == "file-format.md § Composite Tensors"


# -- element_types.boolean.unpacked -------------------------------------------------------------


def test_bool_one_byte_per_element_fires():
    (found,) = bool_packing_findings(_bool((3,), 3), bytes([1, 0, 1]), 100)
    assert found.rule_id == UNPACKED and found.offset == 100 and not found.is_error
    assert "element 2 reads False" in found.message


@pytest.mark.parametrize("shape, data", [
    ((3,), bytes([0b101])),  # packed, the minimum size
    ((3,), bytes([0b101, 0, 0])),  # packed, a larger buffer: bytes beyond 0x01
    ((3,), bytes([0b101, 7, 0])),  # a byte above 0x01: not one byte per element
    ((3,), bytes([1, 0, 0])),  # both readings agree ([True, False, False]): no hazard
    ((1,), bytes([1])),  # one element: packed and unpacked are the same byte
    ((2, 8), bytes(16)),  # all false either way
    ((0, 4), b""),
])
def test_bool_packing_passes(shape, data):
    assert bool_packing_findings(_bool(shape, len(data)), data) == []


def test_bool_lint_only_looks_at_dense_unquantized_bool():
    data = bytes([1, 0, 1, 1])
    assert bool_packing_findings(TensorDescriptor(ElementType.UINT8, (4,), buffers=[BufferHandle(4)]), data) == []
    coo = TensorDescriptor(BOOL, (4,), CooLayout(2), [BufferHandle(4), BufferHandle(16)])
    assert bool_packing_findings(coo, data) == []
    quantized = TensorDescriptor(BOOL, (4,), buffers=[BufferHandle(4)], quantization=PerTensorAffine(1.0))
    assert bool_packing_findings(quantized, data) == []


def test_bool_lint_reads_a_bounded_prefix():
    count = BOOL_SCAN_BYTES * 4
    data = np.zeros(count, dtype=np.uint8)
    data[1] = 1
    (found,) = stream_tensor_findings(_bool((count,), count), data.tobytes(), 0)
    assert found.rule_id == UNPACKED


def test_audit_reports_our_packed_bool_as_clean(tmp_path):
    values = np.array([True, False, True])
    packed = np.packbits(values, bitorder="little").tobytes()
    path = tmp_path / "packed.hrry"
    write_file(path, {"flags": Tensor.dense(BOOL, (3,), packed)})
    report = audit(path)
    assert report.ok and report.findings == ()
    stream = encode_descriptor(_bool((3,), 1)) + packed
    assert audit(stream).findings == ()


def test_reference_bool_file_and_stream_fire(tmp_path):
    t = hurray.from_numpy(np.array([True, False, True]))
    path = str(tmp_path / "ref_bool.hrry")
    hurray.save(path, {"flags": t})
    with read_file(path) as f:  # no reader rule is broken; we read the bits as the spec packs them
        assert f.descriptor("flags").buffers[0].byte_size == 3
    report = audit(path)
    assert report.ok and _ids(report) == [UNPACKED]
    with hurray.StreamWriter() as w:
        w.write(t)
    data = w.getvalue()
    assert len(list(read_stream(data, framing="bare"))) == 1
    report = audit(data)
    assert report.ok and _ids(report) == [UNPACKED]
    assert report.findings[0].offset == len(data) - 3  # the data buffer right after the descriptor


# -- file.composite.head_padding -------------------------------------------------------------


def _partition():
    head = TensorDescriptor(ElementType.FLOAT32, (8, 8), CompositeLayout(CompositionRule.PARTITION, 2))
    members = [Tensor.dense(ElementType.FLOAT32, (8, 4), bytes(128), shard=Shard((8, 8), (0, c))) for c in (0, 4)]
    return Composite(head, members)


def test_head_padding_fires_and_passes_on_placements():
    head = TensorDescriptor(ElementType.FLOAT32, (8, 8), CompositeLayout(CompositionRule.PARTITION, 1))
    member = TensorDescriptor(ElementType.FLOAT32, (8, 8), buffers=[BufferHandle(256)], shard=Shard((8, 8), (0, 0)))
    (found,) = head_padding_findings([(head, 64, 53), (member, 4096, 93)])
    assert found.rule_id == PADDING and found.offset == 120 and found.is_error
    assert head_padding_findings([(head, 64, 53), (member, 120, 93)]) == []
    # after a tensor with data, the gap to the next descriptor is data, not head padding
    assert head_padding_findings([(member, 64, 93), (member, 8192, 93)]) == []


def test_audit_of_our_file_passes_and_of_a_padded_one_fires(tmp_path):
    ours, padded = tmp_path / "ours.hrry", tmp_path / "padded.hrry"
    write_file(ours, {"p": _partition()})
    write_file(padded, {"p": _partition()}, pad_after_composite_head=True)
    assert audit(ours).findings == ()
    with read_file(padded) as f:  # readers accept it: membership is positional
        assert list(f) == ["p"]
    report = audit(padded)
    assert not report.ok and _ids(report) == [PADDING]


def test_reference_composite_file_fires(tmp_path):
    tile = hurray.Tensor(bytes(128), hurray.float32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    other = hurray.Tensor(bytes(128), hurray.float32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    path = str(tmp_path / "ref_part.hrry")
    hurray.save(path, {"w": hurray.Composite("partition", shape=[8, 8], dtype=hurray.float32, members=[tile, other])})
    with read_file(path) as f:
        assert list(f) == ["w"]
        head = f.entries()[0]
    report = audit(path)
    assert _ids(report) == [PADDING] and not report.ok
    assert report.findings[0].offset == -(-(head.descriptor_offset + head.descriptor_length) // 8) * 8
    assert isinstance(report.findings[0].to_violation(), hs.SpecViolation)
