"""The readers' ``findings`` against ``audit``: one fault, one rule id, one byte offset.

A reader that accepts an input records in ``findings`` what its mode tolerated and every
SHOULD-level finding -- of the container, descriptor and composite rules -- with the rule,
level and absolute offset ``audit`` reports for the same input, each descriptor's in
audit's order.  Only the rules of :data:`hurray_schema.rules.interop.AUDIT_ONLY` are
audit's alone, and those of :data:`hurray_schema.rules.values.AT_DECODE`, which a reader checks
when it decodes a tensor's values (the descriptors held below have buffers of zeros: zero
scales).  The inputs are the conformance corpus (its lone descriptors each held by
a one-tensor bare stream and a one-tensor file) and a few focused ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hurray_schema as hs
from hurray_schema.codec import parse_descriptor
from hurray_schema.io import Tensor
from hurray_schema.model import CompositionRule
from hurray_schema.rules.descriptor import dispatch, first_error
from hurray_schema.rules.engine import Level, Mode
from hurray_schema.rules.interop import AUDIT_ONLY
from hurray_schema.rules.values import AT_DECODE
from hurray_schema.conformance import MANIFEST, write_corpus
from hurray_schema.conformance.composites import LEFT, RIGHT, composite, head
from hurray_schema.conformance.patch import bare, hrry

MODES = ("strict", "permissive")
SYMMETRIC_INDEX = "quantization.per_block.symmetric_index"
SYMMETRIC_INDEX_VECTOR = f"{SYMMETRIC_INDEX}.fail.desc"
RULE_PRIVATE = "composite.head.rule_private"
FIRST_PRIVATE_RULE = 0xF0
AUDIT_KIND = {"stream": "stream", "messages": "messages", "file": "file"}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vectors")
    write_corpus(out, reference=False)
    return out


@pytest.fixture(scope="module")
def manifest(corpus_dir) -> dict:
    return json.loads((corpus_dir / MANIFEST).read_text(encoding="utf-8"))


def _located(findings) -> list[tuple]:
    return [(f.rule_id, f.level, f.offset) for f in findings]


def _audited(data: bytes, kind: str, mode: str, tmp_path: Path) -> list[tuple]:
    """What audit reports on ``data``, without the rules only audit runs and those a reader runs when
    it decodes the values."""
    source = _scratch(data, tmp_path) if kind == "file" else data
    return _located(f for f in hs.audit(source, kind=kind, mode=mode) if f.rule_id not in AUDIT_ONLY | AT_DECODE)


def _scratch(data: bytes, tmp_path: Path) -> Path:
    path = tmp_path / "input.hrry"
    path.write_bytes(data)
    return path


def _stream_findings(data: bytes, mode: str) -> list[tuple]:
    reader = hs.read_stream(data, mode=mode)
    for _item in reader:
        pass
    return _located(reader.findings)


def _file_findings(data: bytes, mode: str, tmp_path: Path) -> list[tuple]:
    with hs.read_file(_scratch(data, tmp_path), mode=mode) as opened:
        return _located(opened.findings)


def _read(data: bytes, kind: str, mode: str, tmp_path: Path) -> list[tuple]:
    return _file_findings(data, mode, tmp_path) if kind == "file" else _stream_findings(data, mode)


def _zeros(desc) -> Tensor:
    return Tensor(desc, [bytes(handle.byte_size) for handle in desc.buffers])


def _held(vector: bytes) -> dict[str, tuple[bytes, int]]:
    """The lone descriptor ``vector`` held by a one-tensor bare stream and a one-tensor
    file (buffers of zeros): container kind -> (bytes, where the descriptor starts)."""
    desc, _ = parse_descriptor(vector, mode=Mode.PERMISSIVE)
    stream = vector + b"".join(bytes(handle.byte_size) for handle in desc.buffers)
    file = hrry({"t": _zeros(desc)})
    at = file.find(vector)
    assert at > 0, "the file writer re-encodes the vector's descriptor to other bytes"
    return {"stream": (stream, 0), "file": (file, at)}


def _shifted(findings: list[tuple], by: int) -> list[tuple]:
    return [(rule_id, level, None if offset is None else offset + by) for rule_id, level, offset in findings]


def _accepted(manifest: dict, mode: str, kinds) -> list[dict]:
    return [e for e in manifest["vectors"] if e["kind"] in kinds and e[mode]["verdict"] == "accept"]


@pytest.mark.parametrize("mode", MODES)
def test_corpus_containers_reader_findings_are_audits(manifest, corpus_dir, tmp_path, mode):
    entries = _accepted(manifest, mode, AUDIT_KIND)
    assert {e["kind"] for e in entries} == set(AUDIT_KIND)
    some_recorded = 0
    for entry in entries:
        data = (corpus_dir / entry["file"]).read_bytes()
        kind = AUDIT_KIND[entry["kind"]]
        found = _read(data, kind, mode, tmp_path)
        assert found == _audited(data, kind, mode, tmp_path), (entry["file"], mode)
        some_recorded += bool(found)
    assert some_recorded


@pytest.mark.parametrize("mode", MODES)
def test_corpus_descriptors_held_by_a_stream_and_a_file_reader_findings_are_audits(manifest, corpus_dir, tmp_path,
                                                                                     mode):
    entries = _accepted(manifest, mode, {"descriptor"})
    assert entries
    some_recorded = 0
    for entry in entries:
        vector = (corpus_dir / entry["file"]).read_bytes()
        lone = _audited(vector, "descriptor", mode, tmp_path)  # the descriptor alone, offsets from its first byte
        for kind, (data, at) in _held(vector).items():
            found = _read(data, kind, mode, tmp_path)
            assert found == _audited(data, kind, mode, tmp_path), (entry["file"], kind, mode)
            assert found == _shifted(lone, at), (entry["file"], kind, mode)
        some_recorded += bool(lone)
    assert some_recorded


@pytest.fixture(scope="module")
def symmetric_index_vector(corpus_dir) -> bytes:
    return (corpus_dir / SYMMETRIC_INDEX_VECTOR).read_bytes()


@pytest.fixture(scope="module")
def symmetric_index_offset(manifest) -> int:
    entry = next(e for e in manifest["vectors"] if e["file"] == SYMMETRIC_INDEX_VECTOR)
    assert entry["level"] == Level.SHOULD.value and entry["strict"]["verdict"] == "accept"
    return entry["first_finding"]["offset"]


@pytest.mark.parametrize("mode", MODES)
def test_a_should_finding_of_a_descriptor_in_a_stream_is_recorded_at_each_tensor(
        symmetric_index_vector, symmetric_index_offset, mode):
    stream, _ = _held(symmetric_index_vector)["stream"]
    twice = stream + stream  # the second descriptor is the same bytes: read through the tables of the first
    expected = [(SYMMETRIC_INDEX, Level.SHOULD, symmetric_index_offset),
                (SYMMETRIC_INDEX, Level.SHOULD, len(stream) + symmetric_index_offset)]
    for _reading in range(2):  # and a second reading of the same input records them again
        assert _stream_findings(twice, mode) == expected
    assert _audited(twice, "stream", mode, None) == expected  # its buffers of zeros hold zero scales


@pytest.mark.parametrize("mode", MODES)
def test_a_should_finding_of_a_descriptor_in_a_file_is_recorded(symmetric_index_vector, symmetric_index_offset,
                                                                tmp_path, mode):
    data, at = _held(symmetric_index_vector)["file"]
    path = _scratch(data, tmp_path)
    with hs.read_file(path, mode=mode) as opened:
        (entry,) = opened.entries()
        assert entry.descriptor_offset == at
        assert _located(opened.findings) == [(SYMMETRIC_INDEX, Level.SHOULD, at + symmetric_index_offset)]
    assert _audited(data, "file", mode, tmp_path) == [(SYMMETRIC_INDEX, Level.SHOULD, at + symmetric_index_offset)]


def _private_rule_composite():
    return composite(head(rule=FIRST_PRIVATE_RULE, count=2, op=0), [LEFT, RIGHT])


def _rule_private_offset(data: bytes, head_at: int) -> int:
    desc, _ = parse_descriptor(data[head_at:], mode=Mode.PERMISSIVE)
    return dispatch.DescriptorContext(desc, Mode.PERMISSIVE, head_at).layout("composition_rule")


def test_a_private_composition_rule_is_recorded_by_a_permissive_stream_reader():
    assert FIRST_PRIVATE_RULE > max(CompositionRule)
    data = bare([_private_rule_composite()])
    at = _rule_private_offset(data, 0)
    with pytest.raises(hs.SpecViolation) as raised:
        list(hs.read_stream(data, mode="strict"))
    assert (raised.value.rule_id, raised.value.offset) == (RULE_PRIVATE, at)
    reader = hs.read_stream(data, mode="permissive")
    items = list(reader)
    assert len(items) == 1 and isinstance(items[0], hs.Composite)
    assert [(f.rule_id, f.level, f.offset, f.tolerated) for f in reader.findings] == [
        (RULE_PRIVATE, Level.MUST, at, True)]
    assert reader.findings == list(hs.audit(data, mode="permissive").findings)
    with pytest.raises(hs.SpecViolation) as validated:  # the kept composite is not valid in strict mode
        items[0].validate()
    assert validated.value.rule_id == RULE_PRIVATE


def test_a_private_composition_rule_is_recorded_by_a_permissive_file_reader(tmp_path):
    path = _scratch(hrry({"p": _private_rule_composite()}), tmp_path)
    with hs.read_file(path, mode="permissive") as opened:
        head_at = next(e.descriptor_offset for e in opened.entries() if e.name == "p")
        at = _rule_private_offset(path.read_bytes(), head_at)
        assert [(f.rule_id, f.offset, f.tolerated) for f in opened.findings] == [(RULE_PRIVATE, at, True)]
    with pytest.raises(hs.SpecViolation) as raised:
        hs.read_file(path, mode="strict")
    assert (raised.value.rule_id, raised.value.offset) == (RULE_PRIVATE, at)


def test_first_error_gives_the_notes_before_the_error_and_remembers_no_descriptor_with_a_note(
        symmetric_index_vector, symmetric_index_offset):
    desc, _ = parse_descriptor(symmetric_index_vector, mode=Mode.STRICT)
    notes: list = []
    assert first_error(desc, "strict", base=10, notes=notes) is None
    assert _located(notes) == [(SYMMETRIC_INDEX, Level.SHOULD, 10 + symmetric_index_offset)]
    again: list = []  # a later reading runs the rules again, and reports again
    assert first_error(desc, "strict", notes=again) is None and _located(again) == _located(
        dispatch.check_descriptor(desc))


def test_the_audit_only_rules_are_audits_alone(manifest, corpus_dir, tmp_path):
    lints = [e for e in manifest["vectors"] if e["rule_id"] in AUDIT_ONLY and e["role"] == "fail"]
    assert {e["rule_id"] for e in lints} == AUDIT_ONLY
    for entry in lints:
        data = (corpus_dir / entry["file"]).read_bytes()
        kind = AUDIT_KIND[entry["kind"]]
        source = _scratch(data, tmp_path) if kind == "file" else data
        assert entry["rule_id"] in {f.rule_id for f in hs.audit(source, kind=kind)}, entry["file"]
        assert entry["rule_id"] not in {rule_id for rule_id, _, _ in _read(data, kind, "strict", tmp_path)}


def test_the_rules_on_scale_values_are_left_to_the_decode(manifest, corpus_dir, tmp_path):
    """A reader opens an input whose scales break a rule of AT_DECODE without a finding; audit
    reports the rule, and decoding the tensor raises it."""
    fails = [e for e in manifest["vectors"] if e["rule_id"] in AT_DECODE and e["role"] == "fail"]
    assert {e["rule_id"] for e in fails} == AT_DECODE
    for entry in fails:
        data = (corpus_dir / entry["file"]).read_bytes()
        kind = AUDIT_KIND[entry["kind"]]
        assert _read(data, kind, "strict", tmp_path) == [], entry["file"]
        source = _scratch(data, tmp_path) if kind == "file" else data
        assert [f.rule_id for f in hs.audit(source, kind=kind)] == [entry["rule_id"]], entry["file"]
        items = list(hs.read_stream(data)) if kind == "stream" else None
        if items is not None:
            with pytest.raises(hs.SpecViolation) as raised:
                items[0].to_numpy()
            assert raised.value.rule_id == entry["rule_id"]
