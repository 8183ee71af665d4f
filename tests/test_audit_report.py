"""The library renders what the command line prints: ``hs.audit(p).to_text()`` is byte for byte
what ``hurray-schema audit p`` writes, ``to_json_text()`` what ``--json`` writes (both end with
one newline); and ``hs.export_npy`` / ``hs.export_zarr`` write what ``merge`` writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import hurray_schema as hs
from hurray_schema.cli import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "hurray_schema" / "samples"
SAMPLE_NAMES = ["sample.hrry", "sample.stream", "faulty.stream", "member.bin"]
MODES = ["strict", "permissive"]


def _cli(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _mode_flags(mode: str) -> list[str]:
    return ["--permissive"] if mode == "permissive" else []


# --------------------------------------------------------------------------------------
# audit: text and JSON
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_the_report_text_is_what_audit_prints(name, mode):
    path = str(SAMPLES / name)
    report = hs.audit(path, mode=mode)
    done = _cli("audit", *_mode_flags(mode), path)
    assert done.stdout_bytes == report.to_text().encode("utf-8")
    assert done.exit_code == report.exit_code


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_the_report_json_is_what_audit_json_prints(name, mode):
    path = str(SAMPLES / name)
    report = hs.audit(path, mode=mode)
    done = _cli("audit", "--json", *_mode_flags(mode), path)
    assert done.stdout_bytes == report.to_json_text().encode("utf-8")
    assert json.loads(done.stdout_bytes) == report.to_json()
    assert report.to_json()["schema"] == "hurray-schema/audit/1"


def test_a_faulty_sample_renders_its_findings_under_their_groups():
    report = hs.audit(str(SAMPLES / "faulty.stream"))
    text = report.to_text()
    assert text.startswith(f"audit of {SAMPLES / 'faulty.stream'} (bare stream, strict)\n")
    assert text.endswith("FAIL: 3 findings (3 MUST-level, 0 warnings, 0 tolerated) in 7 tensors\n")
    rows = report.to_json()["findings"]
    assert {(r["rule_id"], r["group"]) for r in rows} == {
        ("composite.close.partition_gap", "composite 0"), ("buffer.reserved", "tensor 3"),
        ("composite.torn", "composite 4")}
    assert report.exit_code == 1 and not report.ok and isinstance(report, hs.Report)


def test_the_console_script_writes_the_same_bytes():
    path = str(SAMPLES / "faulty.stream")
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "audit", path], capture_output=True, cwd=ROOT,
                          timeout=120, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 1 and done.stdout == hs.audit(path).to_text().encode("utf-8")


def _damaged(tmp_path: Path) -> list[Path]:
    raw = (SAMPLES / "sample.hrry").read_bytes()
    inputs = {"broken.hrry": raw[:-8] + bytes(8), "garbage.bin": b"XXXXgarbage" * 10,
              "garbage.hrry": b"XXXXgarbage" * 10, "cut.stream": (SAMPLES / "sample.stream").read_bytes()[:100],
              "empty.bin": b""}
    for name, data in inputs.items():
        (tmp_path / name).write_bytes(data)
    return [tmp_path / name for name in inputs]


def test_damaged_and_unknown_inputs_render_as_the_command_prints_them(tmp_path):
    for path in _damaged(tmp_path):
        report = hs.audit(str(path))
        assert _cli("audit", str(path)).stdout_bytes == report.to_text().encode(), path
        assert _cli("audit", "--json", str(path)).stdout_bytes == report.to_json_text().encode(), path
    unknown = hs.audit(str(tmp_path / "garbage.bin"))
    assert (unknown.kind, unknown.read_as, unknown.kind_source) == ("unknown", "stream", "default")
    assert unknown.to_text().splitlines()[1].startswith("kind assumed: ")


def test_a_kind_given_renders_as_the_kind_option():
    path = str(SAMPLES / "sample.stream")
    report = hs.audit(path, kind="stream")
    assert _cli("audit", "--json", "--kind", "stream", path).stdout_bytes == report.to_json_text().encode()
    assert (report.kind_source, report.kind_reason) == ("option", "--kind stream was given")


def test_bytes_named_as_standard_input_render_as_audit_of_stdin():
    data = (SAMPLES / "faulty.stream").read_bytes()
    report = hs.audit(data, name="-")
    assert _cli("audit", "-", input=data).stdout_bytes == report.to_text().encode()
    assert _cli("audit", "--json", "-", input=data).stdout_bytes == report.to_json_text().encode()
    assert hs.audit(data).input == "<bytes>"


def test_a_file_object_is_grouped_while_it_is_open():
    path = SAMPLES / "sample.hrry"
    with open(path, "rb") as f:
        report = hs.audit(f)
    assert report.to_text() == hs.audit(str(path)).to_text()
    assert [g.label for g in report.groups][:2] == ["file header", "composite 'weights'"]


def test_an_unreadable_input_prints_the_object_of_exit_code_2(tmp_path):
    from hurray_schema.audit.report import json_text, unreadable_json

    missing = str(tmp_path / "absent.hrry")
    done = CliRunner().invoke(main, ["audit", "--json", missing])
    assert done.exit_code == 2
    expected = json_text(unreadable_json(missing, "strict", f"{missing}: No such file or directory"))
    assert done.stdout_bytes.startswith(expected.encode())


def test_the_report_keeps_the_report_api():
    report = hs.audit(str(SAMPLES / "faulty.stream"))
    assert report.errors == report.findings and report.warnings == ()
    assert list(report) == list(report.findings)
    assert report.to_json()["ok"] is False and {"rule_id", "level", "citation", "message", "offset",
                                                  "tolerated"} <= set(report.to_json()["findings"][0])


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["weights", "bias", "weights.1"])
def test_export_npy_writes_what_merge_writes(name, tmp_path):
    path = SAMPLES / "sample.hrry"
    by_library, by_command = tmp_path / "lib.npy", tmp_path / "cli.npy"
    done = hs.export_npy(path, by_library, name=name)
    assert _cli("merge", str(path), name, "-o", str(by_command)).exit_code == 0
    assert by_library.read_bytes() == by_command.read_bytes()
    with hs.read_file(path) as f:
        expected = f[name].materialize() if name == "weights" else f.get_item(name).to_numpy()
    assert np.array_equal(np.load(by_library), expected)
    assert (done.path, done.shape, done.chunked) == (str(by_library), expected.shape, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.npy", "lib.npy"]  # no temporary left


def test_export_npy_of_an_item_and_its_refusals(tmp_path):
    out = tmp_path / "a.npy"
    hs.export_npy(hs.Tensor.from_numpy(np.arange(6, dtype=np.int16).reshape(2, 3)), out)
    assert np.array_equal(np.load(out), np.arange(6, dtype=np.int16).reshape(2, 3))
    group = hs.group({"a": np.zeros(3, np.float32), "b": np.ones(2, np.float32)})
    with pytest.raises(hs.NotAnArray, match="group composite"):
        hs.export_npy(group, out)
    with pytest.raises(hs.NoSuchItem, match="no tensor or composite named 'nope'") as raised:
        hs.export_npy(SAMPLES / "sample.hrry", out, name="nope")
    assert isinstance(raised.value, (hs.HurraySchemaError, KeyError))
    assert np.array_equal(np.load(out), np.arange(6, dtype=np.int16).reshape(2, 3))  # left as it was


def test_export_npy_by_chunks_writes_the_same_file(tmp_path):
    pytest.importorskip("dask.array")
    values = np.arange(4096, dtype=np.float32).reshape(64, 64)
    whole, chunked = tmp_path / "whole.npy", tmp_path / "chunked.npy"
    hs.export_npy(hs.Tensor.from_numpy(values), whole)
    done = hs.export_npy(hs.Tensor.from_numpy(values), chunked, memory=4096)
    assert done.chunked and chunked.read_bytes() == whole.read_bytes()


def test_export_zarr_writes_a_store(tmp_path):
    zarr = pytest.importorskip("zarr")
    pytest.importorskip("dask.array")
    path = SAMPLES / "sample.hrry"
    store = tmp_path / "w.zarr"
    done = hs.export_zarr(path, store, name="weights", memory=1024)
    with hs.read_file(path) as f:
        expected = f["weights"].materialize()
    assert done.chunked and np.array_equal(zarr.open_array(str(store), mode="r")[...], expected)
    (tmp_path / "folder").mkdir()
    with pytest.raises(hs.HurraySchemaError, match="not a Zarr store"):
        hs.export_zarr(path, tmp_path / "folder", name="weights")
