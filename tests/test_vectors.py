"""The conformance corpus: regenerated in a scratch directory, every vector read back.

Each vector is read by our strict and permissive readers and by ``audit`` in both modes,
told its kind and with ``kind="auto"`` (its path: the first bytes, else the extension); all
of them must give the manifest's verdict and first finding (rule id and byte
offset).  The manifest must account for every registered rule, the generation must be
byte-identical from run to run, and ``vectors --check`` must report drift.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hurray_schema import audit
from hurray_schema.rules.engine import get_rule, registry
from hurray_schema.conformance import LINTS, MANIFEST, NO_VECTOR, SCHEMA, hex_around, read_verdict, write_corpus
from hurray_schema.conformance.reference import DIVERGENCES
from support.corpus import rendered_pages

ROOT = Path(__file__).resolve().parents[1]
AUDIT_KIND = {"descriptor": "descriptor", "stream": "stream", "messages": "messages"}
COVERAGE_FLOOR = 97.0
"""Of every registered rule, the session rules included (issue #48)."""


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vectors")
    write_corpus(out)
    return out


@pytest.fixture(scope="module")
def manifest(corpus_dir) -> dict:
    return json.loads((corpus_dir / MANIFEST).read_text(encoding="utf-8"))


def _entries(manifest):
    return manifest["vectors"]


def _audited(path: Path, kind: str, mode: str):
    """``audit`` of the vector as its kind, or (``kind="auto"``) of its path, the kind found
    from the first bytes or, when they name none, from the extension."""
    if kind == "auto" or kind == "session":  # a session direction is judged with the other one beside it
        return audit(path, kind="auto", mode=mode).findings
    report = audit(path, kind="file", mode=mode) if kind == "file" else \
        audit(path.read_bytes(), kind=AUDIT_KIND[kind], mode=mode)
    return report.findings


def test_manifest_header_and_schema(manifest):
    assert manifest["schema"] == SCHEMA
    assert manifest["reference"] == "pyhurray"
    keys = {"file", "kind", "role", "rule_id", "level", "citation", "statement", "size", "sha256", "strict",
            "permissive", "first_finding", "reference"}
    for entry in _entries(manifest):
        assert keys <= set(entry), entry["file"]
        rule = get_rule(entry["rule_id"])
        assert (entry["level"], entry["citation"], entry["statement"]) == (rule.level.value, rule.citation,
                                                                           rule.summary)
    files = [entry["file"] for entry in _entries(manifest)]
    assert files == sorted(files)


def test_every_vector_gives_the_manifests_verdict_in_every_reader(manifest, corpus_dir):
    for entry in _entries(manifest):
        path = corpus_dir / entry["file"]
        data = path.read_bytes()
        assert len(data) == entry["size"], entry["file"]
        for mode in ("strict", "permissive"):
            if entry["kind"] != "session":  # a session's verdict is audit's, with its other direction beside it
                assert read_verdict(entry["kind"], data, mode).to_json() == entry[mode], (entry["file"], mode)
            for kind in (entry["kind"], "auto"):
                where = (entry["file"], mode, kind)
                findings = _audited(path, kind, mode)
                expected = entry["first_finding"]
                if expected is None:
                    assert findings == (), (*where, findings)
                    continue
                first = findings[0]
                assert (first.rule_id, first.offset) == (expected["rule_id"], expected["offset"]), where
                if entry["rule_id"] not in LINTS:  # a lint is audit's finding on what a reader accepts
                    assert first.is_error == (entry[mode]["verdict"] == "reject"), where


def test_a_violating_vector_fires_its_own_rule_first_and_a_passing_one_nothing(manifest):
    sessions = {e["session"] for e in _entries(manifest) if e["role"] == "fail" and "session" in e}
    for entry in _entries(manifest):
        if entry["role"] == "pass":
            assert entry["first_finding"] is None and entry["strict"]["verdict"] == "accept", entry["file"]
            continue
        if entry["role"] == "peer":  # the other direction of a violating session
            assert entry["session"] in sessions and entry["direction"] != entry["receiver"], entry["file"]
            continue
        rule = get_rule(entry["rule_id"])
        assert entry["first_finding"]["rule_id"] == rule.id, entry["file"]
        strict_rejects = rule.level.is_requirement and rule.id not in LINTS
        permissive_rejects = strict_rejects and not rule.permissive
        assert entry["strict"]["verdict"] == ("reject" if strict_rejects else "accept"), entry["file"]
        assert entry["permissive"]["verdict"] == ("reject" if permissive_rejects else "accept"), entry["file"]
        assert 0 <= entry["first_finding"]["offset"] <= entry["size"], entry["file"]


def test_every_rule_has_a_vector_or_a_reason(manifest):
    covered = {e["rule_id"] for e in _entries(manifest) if e["role"] == "fail"}
    without = {row["rule_id"]: row for row in manifest["rules_without_vector"]}
    assert covered.isdisjoint(without)
    assert covered | set(without) == {rule.id for rule in registry()}
    assert all(row["reason"] for row in without.values())
    assert {rule_id for rule_id, row in without.items() if not row["triggerable"]} == set(NO_VECTOR)
    every_pass = {e["rule_id"] for e in _entries(manifest) if e["role"] == "pass"}
    assert covered <= every_pass


def test_coverage(manifest):
    coverage = manifest["coverage"]
    assert coverage["registered_rules"] == len(registry())
    assert coverage["triggerable_rules"] == len(registry()) - len(NO_VECTOR)
    covered = {e["rule_id"] for e in _entries(manifest) if e["role"] == "fail"}
    assert coverage["rules_with_violating_vector"] == len(covered - set(NO_VECTOR))
    assert coverage["percent_of_all_rules"] == round(100.0 * len(covered) / len(registry()), 1)
    assert 100.0 * len(covered) / len(registry()) >= COVERAGE_FLOOR, coverage


def test_generation_is_byte_identical(corpus_dir, tmp_path):
    again = tmp_path / "again"
    write_corpus(again)
    first = sorted(p.name for p in corpus_dir.iterdir())
    assert first == sorted(p.name for p in again.iterdir())
    for name in first:
        assert (again / name).read_bytes() == (corpus_dir / name).read_bytes(), name


def _check(outdir: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hurray_schema", "vectors", "--check", *options, str(outdir)],
                          capture_output=True, text=True, cwd=str(ROOT))


def test_vectors_command_and_check_report_drift(tmp_path):
    out = tmp_path / "corpus"
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "vectors", "--no-reference", str(out)],
                          capture_output=True, text=True, cwd=str(ROOT), check=True)
    assert "manifest.json" in done.stdout
    assert _check(out, "--no-reference").returncode == 0
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["reference"] is None and "reference" not in manifest["vectors"][0]
    victim = out / manifest["vectors"][0]["file"]
    victim.write_bytes(victim.read_bytes() + b"\x00")
    (out / "stray.bin").write_bytes(b"x")
    done = _check(out, "--no-reference")
    assert done.returncode == 1 and victim.name in done.stderr and "stray.bin" in done.stderr
    victim.unlink()
    assert victim.name in _check(out, "--no-reference").stderr
    old = out / "rule.gone.fail.desc"  # a vector an earlier generation wrote
    old.write_bytes(b"HRRY")
    subprocess.run([sys.executable, "-m", "hurray_schema", "vectors", "--no-reference", str(out)],
                   capture_output=True, cwd=str(ROOT), check=True)
    assert not old.exists() and (out / "stray.bin").exists()  # only vector files are removed
    (out / "stray.bin").unlink()
    assert _check(out, "--no-reference").returncode == 0


def test_divergence_table_matches_spec_map():
    text = (ROOT / "spec-map.md").read_text(encoding="utf-8")
    rows = {}
    for line in text[text.index("### Differential run"):].splitlines():
        if line.startswith("| DIV-"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = tuple(re.findall(r"`([\w.]+)`", cells[4]))
    assert {row: rules for row, rules in DIVERGENCES} == {row: rules for row, rules in rows.items() if rules}


def test_composite_and_adr007_vectors_carry_the_reference_verdict(manifest):
    import hurray  # noqa: F401  (the reference must be installed for this test)

    targeted = [e for e in _entries(manifest)
                if e["rule_id"].startswith(("composite.", "adr007.")) and e["kind"] != "messages"]
    assert targeted
    for entry in targeted:
        reference = entry["reference"]
        assert reference["verdict"] in ("accept", "reject", "abort"), entry["file"]
        if not reference["agrees"]:
            assert reference["divergence"] in dict(DIVERGENCES), entry["file"]


def test_every_disagreement_with_the_reference_names_a_divergence_row(manifest):
    """Wherever pyhurray's verdict differs from our strict one, the vector's entry names the
    row of spec-map.md § Divergences › Differential run that explains it, and for a violating
    vector that row lists the vector's rule id."""
    import hurray  # noqa: F401  (the reference must be installed for this test)

    rows = dict(DIVERGENCES)
    judged = [e for e in _entries(manifest) if e["kind"] not in ("messages", "session")]
    assert judged and all(e["reference"]["verdict"] in ("accept", "reject", "abort") for e in judged)
    disagreeing = [e for e in judged if e["reference"]["verdict"] != e["strict"]["verdict"]]
    assert all(not e["reference"]["agrees"] for e in disagreeing)
    unrecorded = sorted(e["file"] for e in disagreeing if e["reference"]["divergence"] not in rows)
    assert not unrecorded, f"disagreements with pyhurray that no Divergences row names: {unrecorded}"
    for entry in disagreeing:
        if entry["role"] == "fail":
            assert entry["rule_id"] in rows[entry["reference"]["divergence"]], entry["file"]


def test_hex_around_marks_the_faulty_byte():
    data = bytes(range(40))
    assert hex_around(data, 3) == (0, " ".join(f"{b:02x}" for b in range(3)) + " [03] "
                                   + " ".join(f"{b:02x}" for b in range(4, 16)))
    start, text = hex_around(data, 40)
    assert start == 32 and text.endswith("27 [end]")


# Offsets typed from the spec's tables, not taken from the code under test:
# metadata.md § Fixed Header (magic 0, version_major 4, version_minor 5, descriptor_length 6,
# flags 10, type_tag 14, layout_tag 15, rank 16); file-format.md § File Header (magic 0,
# container_version_major 8, _reserved 10, file_flags 12, data_buffer_alignment 16,
# first_descriptor_offset 20) and § Trailer (40 bytes: index_crc32c at 28, _reserved 32,
# trailer_magic 36); interchange.md § Message Framing (12-byte header, stream_id at 4).
FROM_THE_START = {
    "descriptor.magic": 0, "descriptor.version_major": 4, "descriptor.version_minor": 5,
    "descriptor.length.minimum": 6, "descriptor.flags.reserved": 10, "descriptor.type_tag.invalid": 14,
    "descriptor.type_tag.unknown": 14, "descriptor.layout_tag.invalid": 15, "descriptor.layout_tag.unknown": 15,
    "descriptor.rank.cap": 16, "file.header.magic": 0, "file.header.version": 8, "file.header.reserved": 10,
    "file.flags.reserved": 12, "file.header.alignment": 16, "file.header.first_descriptor_offset": 20,
    "stream.message.type": 0,
}
FROM_THE_END = {"file.index.crc": 40 - 28, "file.trailer.reserved": 40 - 32, "file.trailer.magic": 40 - 36}
TRUNCATED_AT_THE_END = {"descriptor.truncated", "stream.truncated"}


def test_offsets_agree_with_the_spec_tables(manifest, corpus_dir):
    fails = {e["rule_id"]: e for e in _entries(manifest) if e["role"] == "fail"}
    for rule_id, offset in FROM_THE_START.items():
        assert fails[rule_id]["first_finding"]["offset"] == offset, rule_id
    for rule_id, back in FROM_THE_END.items():
        assert fails[rule_id]["first_finding"]["offset"] == fails[rule_id]["size"] - back, rule_id
    for rule_id in TRUNCATED_AT_THE_END:
        assert fails[rule_id]["first_finding"]["offset"] == fails[rule_id]["size"], rule_id
    # the reserved stream_id 0 sits 4 bytes into the header of a TENSOR_DATA message (type 5)
    entry = fails["stream.message.stream_id"]
    at = entry["first_finding"]["offset"]
    data = (corpus_dir / entry["file"]).read_bytes()
    assert struct.unpack_from("<II", data, at - 4) == (5, 0)


def test_a_violating_vector_differs_from_its_passing_one(manifest, corpus_dir):
    """The fault is in the bytes: every violating vector is another input than its passing one."""
    for entry in _entries(manifest):
        if entry["role"] == "fail":
            passing = re.sub(r"\.fail([.-])", r".pass\1", entry["file"])
            if entry["kind"] == "session":  # the session differs: the fault may be in what was answered
                passing, failing = (re.sub(r"\.(client|server)\.msgs$", "", name) for name in (passing, entry["file"]))
                assert [(corpus_dir / f"{passing}.{d}.msgs").read_bytes() for d in ("client", "server")] != \
                    [(corpus_dir / f"{failing}.{d}.msgs").read_bytes() for d in ("client", "server")], entry["file"]
                continue
            assert (corpus_dir / passing).read_bytes() != (corpus_dir / entry["file"]).read_bytes(), entry["file"]


def test_the_docs_link_every_rule_to_its_vectors_with_the_bytes_around_the_fault(manifest, corpus_dir):
    pages = rendered_pages()
    page, index = pages["vectors.md"], pages["index.md"]
    for rule in registry():
        anchor = "vectors-" + re.sub(r"[^\w-]", "-", rule.id)
        assert f'<a id="{anchor}"></a>' in page and f"(vectors.md#{anchor})" in index, rule.id
    lines = page.splitlines()
    for entry in _entries(manifest):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"- `{entry['file']}`"))
        if entry["role"] != "fail":
            continue
        offset = entry["first_finding"]["offset"]
        data = (corpus_dir / entry["file"]).read_bytes()
        row = lines[at + 1].strip().strip("`")
        start, cells = row.split(": ", 1)
        marked = re.search(r"\[(\w+)\]", cells).group(1)
        assert marked == ("end" if offset == len(data) else f"{data[offset]:02x}"), entry["file"]
        before = cells.split(" [")[0].split() if not cells.startswith("[") else []
        assert int(start, 16) + len(before) == offset, entry["file"]
