"""The rules on the values of quantization scales (hurray_schema/rules/values.py): one passing and
one firing input per rule, and the same rule id and byte offset from every entry point that
finds the fault -- ``audit`` of a file and of a bare stream, the strict writers, and the decode
of the values (``to_numpy``, indexing).

Expected offsets are typed from the spec, not taken from the code under test: a bare stream's
buffers follow their descriptor back to back (``interchange.md § Scope``), whose length is the
uint32 at byte 6 of its fixed header (``metadata.md § Fixed Header``); a file's buffers start at
its index entry's data_offset, each later one at the next data_buffer_alignment boundary
(``file-format.md § Data Buffer Placement``); scale k of a buffer is at k times its width.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.builders.quantized import quantize, quantized_from_codes
from hurray_schema.io import Tensor
from hurray_schema.rules.engine import Level, get_rule
from hurray_schema.rules.values import AT_DECODE, scale_fault

PER_BLOCK = "quantization.per_block.scale_values"
PER_CHANNEL = "quantization.per_channel.scale_values"
NF4 = "quantization.nf4.absmax_values"
MXFP = "quantization.mxfp.scale_reserved"
DESCRIPTOR_LENGTH_AT = 6  # metadata.md § Fixed Header
NAN, INF = float("nan"), float("inf")


def _per_block(scales, scale_type="float32", shape=(2, 4), block=2):
    codes = np.arange(int(np.prod(shape)), dtype=np.int8).reshape(shape) % 8 - 4
    blocks = -(-shape[1] // block) if shape[1] else 0
    return quantized_from_codes(codes, "per_block", storage="int4", axis=1, block_size=block,
                                scales=np.array(scales, dtype=np.float32).reshape(shape[0], blocks),
                                scale_type=scale_type)


def _per_channel(scales, shared=False):
    t = quantized_from_codes(np.arange(6, dtype=np.int8).reshape(3, 2), "per_channel", storage="int8", axis=0,
                             scales=np.array(scales, dtype=np.float32), zero_points=np.zeros(3, dtype=np.int32))
    if not shared:
        return t
    import attrs

    desc = t.descriptor
    data, s, z = t.buffers
    q = attrs.evolve(desc.quantization, zero_point_buffer_index=desc.quantization.scale_buffer_index)
    joined = bytes(s) + bytes(z)
    return Tensor(attrs.evolve(desc, quantization=q, buffers=(desc.buffers[0], attrs.evolve(
        desc.buffers[1], byte_size=len(joined)))), [data, joined])


def _nf4(absmax):
    return quantized_from_codes(np.arange(16, dtype=np.uint8).reshape(2, 8), "nf4", storage="uint4", axis=1,
                                block_size=8, scales=np.array(absmax, dtype=np.float32).reshape(2, 1))


def _mxfp(scale_bytes):
    t = quantize(np.ones((2, 16), dtype=np.float32), "mxfp", block_size=16)
    return Tensor(t.descriptor, [t.buffers[0], bytes(scale_bytes)])


# (rule, the tensor, the first offending scale's index and width); None: a passing input
FIRING = {
    "per_block_zero_f32": (PER_BLOCK, lambda: _per_block([1.0, 0.5, 0.0, 2.0]), 2, 4),
    "per_block_minus_zero_f32": (PER_BLOCK, lambda: _per_block([1.0, -0.0, 0.0, 2.0]), 1, 4),
    "per_block_inf_f16": (PER_BLOCK, lambda: _per_block([1.0, INF, 0.5, 2.0], "float16"), 1, 2),
    "per_block_nan_bf16": (PER_BLOCK, lambda: _per_block([1.0, 0.5, 2.0, NAN], "bfloat16"), 3, 2),
    "per_channel_zero": (PER_CHANNEL, lambda: _per_channel([0.5, 0.0, 1.0]), 1, 4),
    "per_channel_nan_shared": (PER_CHANNEL, lambda: _per_channel([0.5, 1.0, NAN], shared=True), 2, 4),
    "nf4_negative": (NF4, lambda: _nf4([1.0, -0.5]), 1, 4),
    "nf4_inf": (NF4, lambda: _nf4([INF, 1.0]), 0, 4),
    "mxfp_00": (MXFP, lambda: _mxfp([0x00, 127]), 0, 1),
    "mxfp_ff": (MXFP, lambda: _mxfp([127, 0xFF]), 1, 1),
}
PASSING = {
    "per_block_f32": lambda: _per_block([1.0, 0.5, -3.0, 2.0]),
    "per_block_f16_subnormal": lambda: _per_block([2.0 ** -24, 1.0, 0.5, -2.0], "float16"),
    "per_block_bf16": lambda: _per_block([1.0, 0.5, 3.0, 2.0], "bfloat16"),
    "per_block_empty_axis": lambda: _per_block([], shape=(2, 0)),
    "per_channel": lambda: _per_channel([0.5, -1.0, 3.0]),
    "per_channel_shared_zero_points_zero": lambda: _per_channel([0.5, 1.0, 2.0], shared=True),
    "nf4_zero_and_minus_zero": lambda: _nf4([0.0, -0.0]),
    "mxfp": lambda: _mxfp([1, 130]),
}


def _stream_offset(data: bytes, desc, buffer: int, index: int, width: int) -> int:
    (length,) = struct.unpack_from("<I", data, DESCRIPTOR_LENGTH_AT)
    return length + sum(h.byte_size for h in desc.buffers[:buffer]) + index * width


def _file_offset(path, name: str, desc, buffer: int, index: int, width: int) -> int:
    with hs.read_file(path) as f:
        (entry,) = [e for e in f.entries() if e.name == name]
        alignment = f.data_buffer_alignment
    at = entry.data_offset
    for handle in desc.buffers[:buffer]:
        at += handle.byte_size
        at += -at % alignment
    return at + index * width


def test_the_rules_are_declared_as_the_spec_says():
    expected = {PER_BLOCK: (Level.MUST, "quantization/per-block-affine.md § Validity Constraints"),
                PER_CHANNEL: (Level.MUST, "quantization/per-channel-affine.md § Validity Constraints"),
                NF4: (Level.MUST, "quantization/nf4.md § Validity Constraints"),
                MXFP: (Level.MUST_NOT, "quantization/mxfp.md § Referenced Buffer")}
    assert set(expected) == AT_DECODE
    for rule_id, (level, citation) in expected.items():
        rule = get_rule(rule_id)
        assert (rule.level, rule.citation, rule.scope, rule.permissive) == (level, citation, "data", False)


@pytest.mark.parametrize("name", sorted(PASSING))
def test_a_valid_tensor_passes_everywhere(name, tmp_path):
    t = PASSING[name]()
    assert scale_fault(t.descriptor, t.buffers) is None
    path = tmp_path / "ok.hrry"
    hs.write_file(path, {"t": t})
    assert hs.audit(path).findings == ()
    data = hs.write_stream(None, [t])
    assert hs.audit(data).findings == ()
    with hs.read_file(path) as f:
        values = f["t"].to_numpy(np.float32)
    assert values.shape == tuple(t.shape) and np.isfinite(values).all()


@pytest.mark.parametrize("name", sorted(FIRING))
def test_audit_of_a_stream_fires_at_the_first_offending_scale(name):
    rule_id, build, index, width = FIRING[name]
    t = build()
    data = hs.write_stream(None, [t], validate=False)
    expected = _stream_offset(data, t.descriptor, t.descriptor.quantization.scale_buffer_index, index, width)
    report = hs.audit(data)
    assert [(f.rule_id, f.offset) for f in report.findings] == [(rule_id, expected)]
    assert not report.ok


@pytest.mark.parametrize("name", sorted(FIRING))
def test_one_fault_one_rule_one_offset_in_a_file(name, tmp_path):
    """audit, the strict file writer, to_numpy and indexing of the file's tensor all name the
    rule, its citation and the scale's offset in the file."""
    rule_id, build, index, width = FIRING[name]
    t = build()
    path = tmp_path / "bad.hrry"
    hs.write_file(path, {"t": t}, validate=False)
    expected = _file_offset(path, "t", t.descriptor, t.descriptor.quantization.scale_buffer_index, index, width)
    citation = get_rule(rule_id).citation
    assert [(f.rule_id, f.citation, f.offset) for f in hs.audit(path).findings] == [(rule_id, citation, expected)]
    with pytest.raises(hs.SpecViolation) as written:
        hs.write_file(tmp_path / "refused.hrry", {"t": t})
    assert not (tmp_path / "refused.hrry").exists()
    with hs.read_file(path) as f:  # opened: the check is deferred to the decode of the values
        assert f.findings == []
        with pytest.raises(hs.SpecViolation) as decoded:
            f["t"].to_numpy()
        with pytest.raises(hs.SpecViolation) as indexed:
            f["t"][(slice(None),) * len(t.shape)]
    with hs.read_file(path, mmap=False) as f:
        with pytest.raises(hs.SpecViolation) as unmapped:
            f["t"].to_numpy()
    for raised in (written, decoded, indexed, unmapped):
        assert (raised.value.rule_id, raised.value.citation, raised.value.offset) == (rule_id, citation, expected)


@pytest.mark.parametrize("name", sorted(FIRING))
def test_the_stream_writers_refuse_it(name):
    rule_id, build, index, width = FIRING[name]
    t = build()
    faulty = hs.write_stream(None, [t], validate=False)
    expected = _stream_offset(faulty, t.descriptor, t.descriptor.quantization.scale_buffer_index, index, width)
    with pytest.raises(hs.SpecViolation) as bare:
        hs.write_stream(None, [t])
    assert (bare.value.rule_id, bare.value.offset) == (rule_id, expected)
    with pytest.raises(hs.SpecViolation) as framed:
        hs.write_stream(None, [t], framing="messages")
    assert framed.value.rule_id == rule_id


@pytest.mark.parametrize("name", sorted(FIRING))
def test_a_stream_reader_accepts_it_and_its_decode_raises(name):
    rule_id, build, _, _ = FIRING[name]
    data = hs.write_stream(None, [build()], validate=False)
    reader = hs.read_stream(data)
    (item,) = list(reader)
    assert reader.findings == []
    with pytest.raises(hs.SpecViolation) as raised:
        item.to_numpy()
    assert raised.value.rule_id == rule_id


def test_a_selection_reads_only_its_scales(tmp_path):
    """Row 0 of a per-block tensor whose row 1 has a zero scale decodes; row 1 raises."""
    t = _per_block([1.0, 0.5, 0.0, 2.0])
    path = tmp_path / "rows.hrry"
    hs.write_file(path, {"t": t}, validate=False)
    expected = _file_offset(path, "t", t.descriptor, 1, 2, 4)
    with hs.read_file(path) as f:
        assert np.isfinite(f["t"][0]).all()
        with pytest.raises(hs.SpecViolation) as raised:
            f["t"][1]
    assert (raised.value.rule_id, raised.value.offset) == (PER_BLOCK, expected)


def test_zero_points_after_the_scales_are_not_read_as_scales():
    """Scales [0.5, 1, 2] then zero points [0, 0, 0] in one buffer: the zeros are zero points."""
    t = _per_channel([0.5, 1.0, 2.0], shared=True)
    assert t.descriptor.buffers[1].byte_size == 24
    assert scale_fault(t.descriptor, t.buffers) is None
    assert hs.audit(hs.write_stream(None, [t])).findings == ()


def test_a_scale_buffer_cut_off_by_the_end_of_the_stream_is_not_read():
    t = _per_block([1.0, 0.5, 0.0, 2.0])
    data = hs.write_stream(None, [t], validate=False)
    cut = data[:-4]  # the last scale is gone: the stream is truncated, the zero scale still there
    assert [f.rule_id for f in hs.audit(cut).findings] == ["stream.truncated"]


def test_quantized_from_codes_with_a_zero_scale_is_refused_by_the_writer(tmp_path):
    t = quantized_from_codes(np.array([[1, -1, 2, -2]], dtype=np.int8), "per_block", storage="int4", axis=1,
                             block_size=2, scales=np.array([[0.25, 0.0]], dtype=np.float16))
    with pytest.raises(hs.SpecViolation) as raised:
        hs.write_file(tmp_path / "z.hrry", {"w": t})
    assert raised.value.rule_id == PER_BLOCK
    hs.write_file(tmp_path / "z.hrry", {"w": t}, validate=False)  # what a faulty producer would write
    assert [f.rule_id for f in hs.audit(tmp_path / "z.hrry").findings] == [PER_BLOCK]


def test_the_mxfp_decode_raises_the_rule_the_audit_reports(tmp_path):
    """The evaluator's reserved-byte check is the rule's (it raised a bare error before)."""
    path = tmp_path / "m.hrry"
    t = _mxfp([127, 0x00])
    hs.write_file(path, {"m": t}, validate=False)
    (finding,) = hs.audit(path).findings
    with hs.read_file(path) as f:
        with pytest.raises(hs.SpecViolation) as raised:
            f["m"].to_numpy()
    assert (raised.value.rule_id, raised.value.citation, raised.value.offset) == (
        finding.rule_id, finding.citation, finding.offset) == (MXFP, "quantization/mxfp.md § Referenced Buffer",
                                                               _file_offset(path, "m", t.descriptor, 1, 1, 1))
