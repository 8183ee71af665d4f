"""``hurray_schema.audit``: every finding, each with its byte offset, instead of the first one."""

from __future__ import annotations

import struct

import pytest

from hurray_schema.audit import audit
from hurray_schema.codec import encode_descriptor
from hurray_schema.model import (
    BufferHandle as B, CombineOp, CompositeLayout, CompositeMember, CompositionRule, ElementType as T, Shard,
    Statistics, TensorDescriptor as D, TiledLayout,
)

F32 = T.FLOAT32


def test_a_descriptor_with_several_faults_lists_them_all_with_offsets():
    bad = D(F32, (4, 4), TiledLayout((2, 2), outer_layout=0x07),
            buffers=[B(64, alignment=48, device_tag=1, sync_mode=0x09, reserved=3)],
            statistics=Statistics(computed_mask=0x18, nm_n=5, nm_m=1, value_stddev=-1.0))
    data = encode_descriptor(bad)
    report = audit(data)
    assert not report.ok
    got = {f.rule_id: f.offset for f in report.findings}
    assert set(got) == {
        "layout.tiled.outer_layout", "buffer.reserved", "buffer.alignment.power_of_two",
        "buffer.sync_mode.reserved", "metadata.statistics.nm", "metadata.statistics.stddev",
    }
    assert data[got["layout.tiled.outer_layout"]] == 0x07
    assert data[got["buffer.reserved"]] == 3
    assert struct.unpack_from("<I", data, got["buffer.alignment.power_of_two"])[0] == 48
    assert data[got["buffer.sync_mode.reserved"]] == 0x09
    assert data[got["metadata.statistics.nm"]] == 5
    assert struct.unpack_from("<d", data, got["metadata.statistics.stddev"])[0] == -1.0
    assert all(f.citation for f in report.findings)
    assert report.to_json()["ok"] is False


def test_a_clean_descriptor_and_a_path(tmp_path):
    data = encode_descriptor(D(F32, (3, 4), buffers=[B(48)]))
    assert audit(data).ok and audit(data).findings == ()
    p = tmp_path / "d.bin"
    p.write_bytes(data)
    assert audit(p).ok and audit(str(p)).ok


def test_a_structural_fault_is_the_one_finding():
    data = encode_descriptor(D(F32, (3, 4), buffers=[B(48)]))
    report = audit(b"XRRY" + data[4:])
    (f,) = report.findings
    assert f.rule_id == "descriptor.magic" and f.offset == 0


def test_mode_decides_what_is_tolerated():
    data = encode_descriptor(D(F32, (8, 8), CompositeLayout(0xF3, 0)))
    assert not audit(data).ok
    report = audit(data, mode="permissive")
    assert report.ok and [f.rule_id for f in report.findings] == ["composite.head.rule_private"]


def test_a_bare_stream_with_a_composite():
    head = D(F32, (8, 8), CompositeLayout(CompositionRule.PARTITION, 2))
    m0 = D(F32, (8, 4), buffers=[B(128)], shard=Shard((8, 8), (0, 0)))
    m1 = D(F32, (8, 3), buffers=[B(96, reserved=1)], shard=Shard((8, 8), (0, 4)),
           composite_member=CompositeMember(0))
    parts = [encode_descriptor(head), encode_descriptor(m0), bytes(128), encode_descriptor(m1), bytes(96)]
    stream = b"".join(parts)
    report = audit(stream)
    ids = [f.rule_id for f in report.findings]
    assert ids == ["buffer.reserved", "composite.member.no_member_section", "composite.close.partition_gap"]
    m1_at = len(parts[0]) + len(parts[1]) + 128
    assert stream[report.findings[0].offset] == 1 and report.findings[0].offset > m1_at
    assert report.findings[1].offset == m1_at  # no single field: the member descriptor
    ok = b"".join([encode_descriptor(head), encode_descriptor(m0), bytes(128),
                   encode_descriptor(D(F32, (8, 4), buffers=[B(128)], shard=Shard((8, 8), (0, 4)))), bytes(128)])
    assert audit(ok).ok and audit(ok).findings == ()


def test_a_torn_stream():
    head = D(F32, (4,), CompositeLayout(CompositionRule.OVERLAY, 2, CombineOp.ADD))
    base = D(F32, (4,), buffers=[B(16)], shard=Shard((4,), (0,)), composite_member=CompositeMember(1))
    stream = encode_descriptor(head) + encode_descriptor(base) + bytes(16)
    assert [f.rule_id for f in audit(stream).findings] == ["composite.torn"]
    assert audit(stream, mode="permissive").ok
    short = encode_descriptor(base) + bytes(10) + b"x"
    assert "stream.truncated" in {f.rule_id for f in audit(short).findings}


def test_a_file_is_delegated_to_the_file_reader(tmp_path):
    hurray = pytest.importorskip("hurray")
    p = tmp_path / "m.hrry"
    hurray.save(str(p), {"t": hurray.Tensor(bytes(48), hurray.float32, [3, 4])})
    assert audit(p).ok
    raw = p.read_bytes()
    report = audit(raw[:-8] + b"\x00" * 8)
    assert not report.ok and report.findings[-1].rule_id.startswith("file.")


def _first(report):
    return report.findings[0].rule_id, report.findings[0].offset


def test_when_the_first_bytes_name_no_kind_the_extension_decides(tmp_path):
    """A damaged file magic, an invalid first message_type and a first message header cut
    short name no kind: ``kind="auto"`` reads a path by its extension (``.hrry``, ``.msgs``),
    so the fault is the kind's own rule, as with the kind given (issue 28, item 3); without
    a known extension (or as bytes) the input is a bare stream and a bare stream's rule
    fires.  Offsets: the magic at 0 (file-format.md § File Header), message_type at 0 and
    a 12-byte header (interchange.md § Message Framing)."""
    from hurray_schema.io import Tensor, write_file, write_stream

    tensor = Tensor.dense(F32, [3], bytes(12))
    good_file = tmp_path / "good.hrry"
    write_file(good_file, {"t": tensor})
    messages = write_stream(None, [tensor], framing="messages")
    cases = {
        "file.header.magic": (b"X" + good_file.read_bytes()[1:], ".hrry", "file", 0, "descriptor.magic"),
        "stream.message.type": (struct.pack("<I", 0x0E) + messages[4:], ".msgs", "messages", 0, "descriptor.magic"),
        # as a bare stream: 11 bytes end inside the 20-byte fixed header of a first descriptor
        "stream.message.truncated": (messages[:11], ".msgs", "messages", 11, "stream.truncated"),
    }
    for rule_id, (data, suffix, kind, offset, as_bare) in cases.items():
        named, unnamed = tmp_path / f"damaged{suffix}", tmp_path / "damaged.bin"
        named.write_bytes(data)
        unnamed.write_bytes(data)
        assert _first(audit(named)) == _first(audit(named, kind=kind)) == (rule_id, offset), rule_id
        with open(named, "rb") as handle:  # a file object opened from the path: its name
            assert _first(audit(handle)) == (rule_id, offset), rule_id
        assert _first(audit(unnamed))[0] == _first(audit(data))[0] == as_bare, rule_id
    stream = tmp_path / "stream.hrry"  # the first bytes name a bare stream: the extension is not asked
    stream.write_bytes(write_stream(None, [tensor, tensor]))
    assert audit(stream).ok and not audit(stream, kind="file").ok
