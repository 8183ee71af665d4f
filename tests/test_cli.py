"""The ``hurray-schema`` command line, driven as a real subprocess.

Inputs are built by our writers (or typed as hex); expected values are typed from the
spec tables, never computed by the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.cli import CLI, out, run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "hurray_schema" / "samples"

# A float32 [3, 4] row-major tensor with one 48-byte buffer (metadata.md § Worked Example).
ROW_MAJOR_F32_3X4 = bytes.fromhex(
    "4852525901003d000000000000000301020000000300000000000000"
    "040000000000000000000000000000000130000000000000004000000000000000"
)


# --------------------------------------------------------------------------------------
# help, rules
# --------------------------------------------------------------------------------------


def test_help_lists_every_command():
    done = run("--help")
    assert done.returncode == 0
    for command in ("audit", "inspect", "rules", "docs", "ksy", "merge"):
        assert command in out(done)


def test_module_entry_point_runs():
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and "hurray-schema" in done.stdout


def test_rules_table_and_json_agree():
    table = run("rules")
    assert table.returncode == 0
    listed = json.loads(out(run("rules", "--json")))
    ids = [r["id"] for r in listed]
    assert len(ids) == len(set(ids)) and "descriptor.magic" in ids
    magic = next(r for r in listed if r["id"] == "descriptor.magic")
    assert (magic["level"], magic["citation"]) == ("MUST", "metadata.md § Fixed Header")
    assert set(magic) >= {"id", "level", "citation", "summary", "scope", "permissive"}
    text = out(table)
    for rule in listed:
        assert rule["id"] in text
    assert f"{len(listed)} rules" in text


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------


def test_inspect_descriptor_tree(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4)
    done = run("inspect", path)
    assert done.returncode == 0, done.stderr
    lines = out(done).splitlines()
    assert lines[0].endswith("tensor descriptor, 61 bytes")

    def line(name):
        return next(s for s in lines if f" {name} " in s and "=" in s)

    # (byte range, raw bytes, value, type, citation) from metadata.md § Fixed Header
    assert line("magic").split()[:5] == ["0-3", "48", "52", "52", "59"]
    assert '= "HRRY"' in line("magic") and "bytes[4]" in line("magic")
    # a citation every field of a section shares is printed on the section line
    assert any(s.strip().startswith("fixed_header @0-19") and "metadata.md § Fixed Header" in s for s in lines)
    assert line("descriptor_length").split()[:5] == ["6-9", "3d", "00", "00", "00"]
    assert "= 61" in line("descriptor_length") and "uint32" in line("descriptor_length")
    assert line("type_tag").split()[:2] == ["14", "03"] and "FLOAT32" in line("type_tag")
    assert "element-types.md" in line("type_tag")
    assert line("shape").split()[0] == "20-35" and "= [3, 4]" in line("shape")
    assert line("byte_size").split()[0] == "45-52" and "= 48" in line("byte_size")
    assert line("alignment").split()[0] == "53-56" and "= 64" in line("alignment")
    assert line("_reserved").split()[:2] == ["60", "00"]
    for section in ("fixed_header @0-19", "shape @20-35", "byte_offset @36-43", "buffer_table @44-60",
                    "buffers[0] @45-60"):
        assert any(section in s for s in lines), section


def test_inspect_hex_table(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4)
    done = run("inspect", "--hex", path)
    assert done.returncode == 0
    text = out(done)
    assert "00000006  3d 00 00 00" in text and "descriptor_length = 61" in text
    assert "00000014  03 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00" in text  # shape, one 16-byte row
    assert "0000002d  30 00 00 00 00 00 00 00" in text and "byte_size = 48" in text


def test_inspect_file_tree_nests_members():
    done = run("inspect", SAMPLES / "sample.hrry")
    assert done.returncode == 0, done.stderr
    lines = out(done).splitlines()
    heads = {s.strip().split(" @")[0]: len(s) - len(s.lstrip()) for s in lines if s.lstrip().startswith(("tensor '", "file header", "kv metadata", "index @", "trailer @"))}
    assert heads["tensor 'weights'"] == 0 and heads["tensor 'bias'"] == 0
    assert heads["tensor 'weights.0'"] == heads["tensor 'weights.1'"] == 2
    for part in ("file header", "kv metadata", "index", "trailer"):
        assert heads[part] == 0
    text = out(done)
    assert "composition_rule" in text and "PARTITION" in text and "member_count" in text
    assert '"HRRYFILE"' in text and '= "producer"' in text and '"weights.1"' in text
    assert "file-format.md § Trailer" in text and "layouts/composite.md § Head Layout-Specific Fields" in text
    # data buffers sit on the file's 4096-byte alignment
    assert any(s.strip().startswith("4096-4143") and "data" in s for s in lines)


def test_inspect_bare_stream():
    done = run("inspect", SAMPLES / "sample.stream")
    assert done.returncode == 0, done.stderr
    text = out(done)
    assert "bare stream" in text.splitlines()[0]
    assert "tensor 0 @0-52" in text and "  tensor 1 @" in text and "tensor 3 @" in text
    assert "buffer 0 data" in text


def test_inspect_truncated_descriptor_reports_and_stops(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4[:40])
    done = run("inspect", "--kind", "descriptor", path)
    assert done.returncode == 0
    text = out(done)
    assert "descriptor.truncated" in text and "shape" in text


def test_inspect_unknown_input_exits_2(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\x00" * 100)
    done = run("inspect", path)
    assert done.returncode == 2 and b"not a Hurray" in done.stderr
    assert run("inspect", tmp_path / "missing.bin").returncode == 2


def test_inspect_reads_stdin():
    done = run("inspect", "-", input=ROW_MAJOR_F32_3X4)
    assert done.returncode == 0 and "descriptor_length" in out(done)


# --------------------------------------------------------------------------------------
# audit
# --------------------------------------------------------------------------------------


def test_audit_clean_descriptor_exits_0(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4)
    done = run("audit", path)
    assert done.returncode == 0, out(done) + done.stderr.decode()
    assert out(done).splitlines()[-1].startswith("OK: 0 findings")
    data = json.loads(out(run("audit", "--json", path)))
    assert data["schema"] == "hurray-schema/audit/1" and data["ok"] is True and data["exit_code"] == 0
    assert data["findings"] == [] and data["summary"]["tensors"] == 1


def test_audit_bad_magic_is_a_must_finding(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"XXXX" + ROW_MAJOR_F32_3X4[4:])
    done = run("audit", path)
    assert done.returncode == 1
    assert "descriptor.magic" in out(done) and "at byte 0" in out(done)


def test_audit_missing_input_is_unreadable(tmp_path):
    assert run("audit", tmp_path / "missing.bin").returncode == 2
    data = json.loads(out(run("audit", "--json", tmp_path / "missing.bin")))
    assert data["exit_code"] == 2 and data["error"]


def test_audit_descriptor_finding_exits_1(tmp_path):
    path = tmp_path / "t.bin"
    bad = bytearray(ROW_MAJOR_F32_3X4)
    bad[10] = 0x80  # flags bit 7: reserved (metadata.md § Flags)
    path.write_bytes(bad)
    done = run("audit", path)
    assert done.returncode == 1
    text = out(done)
    assert "descriptor.flags.reserved" in text and "at byte 10" in text and "metadata.md § Flags" in text
    assert text.splitlines()[-1].startswith("FAIL: 1 finding")
    data = json.loads(out(run("audit", "--json", path)))
    (finding,) = data["findings"]
    assert (finding["rule_id"], finding["offset"], finding["citation"]) == (
        "descriptor.flags.reserved", 10, "metadata.md § Flags")
    assert finding["error"] is True and data["exit_code"] == 1


def test_audit_clean_sample_file_exits_0():
    done = run("audit", SAMPLES / "sample.hrry")
    assert done.returncode == 0, out(done)
    assert out(done).splitlines()[-1].startswith("OK: 0 findings")
    assert run("audit", SAMPLES / "sample.stream").returncode == 0


def _bad_file(tmp_path) -> tuple[Path, dict]:
    """A file with a partition gap, a non-zero buffer-handle reserved byte and a torn composite."""
    from hurray_schema.io.file import write_file
    from hurray_schema.io.tensor import Composite, Tensor
    from hurray_schema.model import CompositionRule, ElementType, Shard

    f32 = np.float32
    gap = Composite.build(CompositionRule.PARTITION, [
        Tensor.from_numpy(np.zeros((4, 3), f32), shard=Shard((4, 6), (0, 0))),
        Tensor.from_numpy(np.ones((4, 2), f32), shard=Shard((4, 6), (0, 3))),  # column 5 is covered by nobody
    ], shape=(4, 6), type_tag=ElementType.FLOAT32)
    bias = Tensor.from_numpy(np.zeros(6, f32))
    group = Composite.build(CompositionRule.GROUP, [
        Tensor.from_numpy(np.zeros(2, f32)), Tensor.from_numpy(np.zeros(3, f32)),
    ], shape=(2,), type_tag=ElementType.FLOAT32)
    path = tmp_path / "bad.hrry"
    entries = {e.name: e for e in write_file(path, {"gap": gap, "bias": bias, "group": group}, validate=False)}
    data = bytearray(path.read_bytes())
    # bias: rank-1 row-major float32 with one buffer and no sections, so its descriptor ends
    # with the 16-byte buffer handle whose last byte is _reserved (buffer-protocol.md § Buffer Handle)
    reserved_at = entries["bias"].descriptor_offset + entries["bias"].descriptor_length - 1
    data[reserved_at] = 0x01
    # group head (rank 1): member_count at 20 + 8 + 8 + 4 = 40 (layouts/composite.md); 3 > the 2 written
    count_at = entries["group"].descriptor_offset + 40
    assert data[count_at] == 2
    data[count_at] = 3
    path.write_bytes(data)
    return path, {"reserved": reserved_at, "group": entries["group"].descriptor_offset,
                  "gap": entries["gap"].descriptor_offset}


def _bad_stream() -> tuple[bytes, dict]:
    """The same three faults in a bare stream: gap composite, bias (reserved byte), torn group."""
    from hurray_schema.io.stream import write_stream

    f32 = np.float32
    from hurray_schema.io.tensor import Composite, Tensor
    from hurray_schema.model import CompositionRule, ElementType, Shard

    gap = Composite.build(CompositionRule.PARTITION, [
        Tensor.from_numpy(np.zeros((4, 3), f32), shard=Shard((4, 6), (0, 0))),
        Tensor.from_numpy(np.ones((4, 2), f32), shard=Shard((4, 6), (0, 3))),
    ], shape=(4, 6), type_tag=ElementType.FLOAT32)
    bias = Tensor.from_numpy(np.zeros(6, f32))
    group = Composite.build(CompositionRule.GROUP, [
        Tensor.from_numpy(np.zeros(2, f32)), Tensor.from_numpy(np.zeros(3, f32)),
    ], shape=(2,), type_tag=ElementType.FLOAT32)
    data = bytearray(write_stream(None, [gap, bias, group], validate=False))
    # byte sizes from metadata.md: head rank 2 = 20 + 16 + 8 + 8 + 1 = 53; member [4, k] rank 2 with
    # one handle and a shard section = 20 + 16 + 8 + 17 + 32 = 93, data 4·4·k bytes; bias rank 1 =
    # 20 + 8 + 8 + 17 = 53, data 24
    bias_at = 53 + (93 + 48) + (93 + 32)
    reserved_at = bias_at + 52
    group_at = bias_at + 53 + 24
    assert data[reserved_at] == 0 and data[group_at + 40] == 2
    data[reserved_at] = 0x01
    data[group_at + 40] = 3  # member_count: 3 announced, 2 follow, then the stream ends
    return bytes(data), {"reserved": reserved_at, "group": group_at}


def _check_three_faults(done, as_json, at):
    assert done.returncode == 1, out(done) + done.stderr.decode()
    text = out(done)
    data = json.loads(out(as_json))
    assert data["exit_code"] == 1 and data["ok"] is False
    ids = [f["rule_id"] for f in data["findings"]]
    torn = [f for f in data["findings"] if "torn" in f["rule_id"]]
    gap = [f for f in data["findings"] if "partition" in f["rule_id"] and ("cover" in f["rule_id"] or "gap" in f["rule_id"])]
    reserved = [f for f in data["findings"] if "reserved" in f["rule_id"]]
    assert torn and gap and reserved, ids
    assert reserved[0]["offset"] == at["reserved"]
    assert reserved[0]["citation"] == "buffer-protocol.md § Buffer Handle"
    assert torn[0]["citation"].startswith(("layouts/composite.md", "file-format.md", "interchange.md"))
    assert gap[0]["citation"].startswith("layouts/composite.md")
    assert torn[0]["offset"] == at["group"]  # a torn composite is located at its head descriptor
    for f in torn + gap + reserved:
        assert f["rule_id"] in text and f["citation"] in text and f["error"] is True
        assert isinstance(f["offset"], int) and f"at byte {f['offset']}" in text
    assert text.splitlines()[-1].startswith(f"FAIL: {len(ids)} finding")
    return reserved[0]


def test_audit_stream_lists_torn_composite_partition_gap_and_reserved_byte(tmp_path):
    data, at = _bad_stream()
    path = tmp_path / "bad.stream"
    path.write_bytes(data)
    reserved = _check_three_faults(run("audit", path), run("audit", "--json", path), at)
    assert reserved["group"] == "tensor 3"  # the fourth tensor of the stream: bias


def test_audit_file_lists_torn_composite_partition_gap_and_reserved_byte(tmp_path):
    path, at = _bad_file(tmp_path)
    reserved = _check_three_faults(run("audit", path), run("audit", "--json", path), at)
    assert reserved["group"] == "tensor 'bias'"


def test_audit_permissive_flag_and_stdin(tmp_path):
    data, _ = _bad_stream()
    path = tmp_path / "bad.stream"
    path.write_bytes(data)
    strict = json.loads(out(run("audit", "--json", path)))
    loose = json.loads(out(run("audit", "--json", "--permissive", path)))
    assert loose["mode"] == "permissive" and strict["mode"] == "strict"
    # a permissive reader may keep a torn composite and a partition gap, never a bad reserved byte
    assert loose["summary"]["tolerated"] >= 1 and loose["exit_code"] == 1
    assert [f["rule_id"] for f in loose["findings"]] == [f["rule_id"] for f in strict["findings"]]
    piped = run("audit", "--json", "-", input=path.read_bytes())
    assert piped.returncode == 1
    assert [f["rule_id"] for f in json.loads(out(piped))["findings"]] == [f["rule_id"] for f in strict["findings"]]


# --------------------------------------------------------------------------------------
# merge, samples
# --------------------------------------------------------------------------------------


def test_merge_writes_the_logical_array(tmp_path):
    target = tmp_path / "weights.npy"
    done = run("merge", SAMPLES / "sample.hrry", "weights", "-o", target)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(target), np.arange(24, dtype=np.float32).reshape(4, 6))
    bias = tmp_path / "bias.npy"
    assert run("merge", SAMPLES / "sample.hrry", "bias", "-o", bias).returncode == 0
    np.testing.assert_array_equal(np.load(bias), np.linspace(-1.0, 1.0, 6, dtype=np.float32))


def test_merge_a_member_and_refuse_a_group(tmp_path):
    from hurray_schema.io.file import write_file
    from hurray_schema.io.tensor import Composite, Tensor
    from hurray_schema.model import CompositionRule, ElementType

    member = tmp_path / "m.npy"
    assert run("merge", SAMPLES / "sample.hrry", "weights.1", "-o", member).returncode == 0
    np.testing.assert_array_equal(np.load(member), np.arange(24, dtype=np.float32).reshape(4, 6)[:, 3:])
    group = Composite.build(CompositionRule.GROUP, [
        Tensor.from_numpy(np.zeros(2, np.float32)), Tensor.from_numpy(np.ones(3, np.int8)),
    ], shape=(2,), type_tag=ElementType.FLOAT32)
    path = tmp_path / "g.hrry"
    write_file(path, {"g": group})
    done = run("merge", path, "g", "-o", tmp_path / "g.npy")
    assert done.returncode == 2 and b"group composite" in done.stderr and b"g.1" in done.stderr
    assert not (tmp_path / "g.npy").exists()


def test_merge_unknown_name_exits_2(tmp_path):
    done = run("merge", SAMPLES / "sample.hrry", "nope", "-o", tmp_path / "x.npy")
    assert done.returncode == 2 and b"nope" in done.stderr


def test_bundled_samples_are_reproducible():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "make_samples.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_progress_bar_only_when_stderr_is_a_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    import select

    path = tmp_path / "t.bin"
    path.write_bytes(ROW_MAJOR_F32_3X4)
    env = dict(os.environ, HURRAY_SCHEMA_PROGRESS_BYTES="1")  # every input counts as large
    piped = subprocess.run([*CLI, "audit", str(path)], capture_output=True, env=env, timeout=120)
    assert piped.returncode == 0 and b"auditing" not in piped.stderr
    master, slave = pty.openpty()
    try:
        done = subprocess.run([*CLI, "audit", str(path)], stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120)
        os.close(slave)
        slave = None
        seen = b""
        while select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert done.returncode == 0
    assert b"auditing" in seen and b"100%" in seen
    assert b"auditing" not in done.stdout  # the report itself stays clean


def test_inspect_brief_is_the_tree_of_tensors():
    done = run("inspect", "--brief", SAMPLES / "sample.hrry")
    assert done.returncode == 0
    lines = out(done).splitlines()[1:]
    labels = [s.strip().split(" @")[0] for s in lines if " @" in s]
    assert labels == ["file header", "tensor 'weights'", "tensor 'weights.0'", "tensor 'weights.1'",
                      "tensor 'bias'", "kv metadata", "index", "trailer"]
    assert not any("magic" in s for s in lines)


def test_inspect_message_stream(tmp_path):
    from hurray_schema.io.stream import write_stream
    from hurray_schema.io.tensor import Tensor

    path = tmp_path / "m.stream"
    path.write_bytes(write_stream(None, [Tensor.from_numpy(np.arange(6, dtype=np.int16))], framing="messages"))
    done = run("inspect", path)
    assert done.returncode == 0, done.stderr
    text = out(done)
    assert "message stream" in text.splitlines()[0]
    # interchange.md § Message Framing: 12-byte header, TENSOR_DESCRIPTOR (0x04) first
    assert "message 0 @0-" in text and "0x04 (TENSOR_DESCRIPTOR)" in text
    assert "0x05 (TENSOR_DATA)" in text and "0x06 (TENSOR_DATA_END)" in text
    assert "descriptor @12-64" in text and "total_data_bytes" in text and "= 12" in text


def test_audit_says_which_kind_it_assumed_and_why(tmp_path):
    """A .hrry file whose magic is damaged (file-format.md § File Header: "HRRYFILE" at 0)
    is audited as a file because of its extension, and the output says so; the same bytes
    under another name are read as a bare stream, the output saying that too.  When the
    first bytes or --kind decide, nothing is assumed (issue 28, item 3)."""
    damaged = b"X" + (SAMPLES / "sample.hrry").read_bytes()[1:]
    hrry, other = tmp_path / "damaged.hrry", tmp_path / "damaged.bin"
    hrry.write_bytes(damaged)
    other.write_bytes(damaged)
    for path, kind, source, rule_id in ((hrry, "file", "extension", "file.header.magic"),
                                        (other, "unknown", "default", "descriptor.magic")):
        report = json.loads(out(run("audit", "--json", path)))
        assert (report["kind"], report["kind_source"]) == (kind, source), path
        assert path.suffix in report["kind_reason"] and (report["findings"][0]["rule_id"],
                                                          report["findings"][0]["offset"]) == (rule_id, 0)
        text = out(run("audit", path)).splitlines()
        assert text[1] == f"kind assumed: {report['kind_reason']}" and rule_id in "\n".join(text), path
    clean = json.loads(out(run("audit", "--json", SAMPLES / "sample.hrry")))
    assert (clean["kind"], clean["kind_source"]) == ("file", "content") and clean["kind_reason"]
    assert "kind assumed" not in out(run("audit", SAMPLES / "sample.hrry"))
    forced = json.loads(out(run("audit", "--json", "--kind", "stream", hrry)))
    assert (forced["kind"], forced["kind_source"]) == ("stream", "option")
    missing = json.loads(out(run("audit", "--json", tmp_path / "missing.hrry")))
    assert missing["exit_code"] == 2 and missing["kind_source"] is None and missing["kind_reason"] is None


def test_audit_message_stream(tmp_path):
    from hurray_schema.io.stream import write_stream
    from hurray_schema.io.tensor import Composite, Tensor
    from hurray_schema.model import CompositionRule, ElementType, Shard

    clean = tmp_path / "clean.msgs"
    clean.write_bytes(write_stream(None, [Tensor.from_numpy(np.arange(6, dtype=np.int16))], framing="messages"))
    done = run("audit", clean)
    assert done.returncode == 0, out(done)
    assert json.loads(out(run("audit", "--json", clean)))["kind"] == "messages"
    gap = Composite.build(CompositionRule.PARTITION, [
        Tensor.from_numpy(np.zeros((4, 3), np.float32), shard=Shard((4, 6), (0, 0))),
        Tensor.from_numpy(np.ones((4, 2), np.float32), shard=Shard((4, 6), (0, 3))),
    ], shape=(4, 6), type_tag=ElementType.FLOAT32)
    data = write_stream(None, [gap], framing="messages", validate=False)
    bad = tmp_path / "bad.msgs"
    bad.write_bytes(data[:-5])  # the last TENSOR_DATA_END header (12 bytes) is cut short
    report = json.loads(out(run("audit", "--json", bad)))
    assert report["exit_code"] == 1
    ids = [f["rule_id"] for f in report["findings"]]
    assert any("partition" in i for i in ids) and any("truncated" in i for i in ids), ids
    cut = next(f for f in report["findings"] if "truncated" in f["rule_id"])
    assert cut["offset"] == len(data) - 5 and cut["citation"].startswith("interchange.md")
