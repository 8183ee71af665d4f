"""The HTML page of ``inspect --html`` / ``audit --html``, checked in a real headless
chromium through the DOM its script draws, and as a document (html5lib).

Expected byte ranges come from the declarations (``structs``), the located walk
(``io.walk``) and ``audit --json``; never from the page's own model or script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import html5lib
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_schema.cli import main
from hurray_schema.errors import HurraySchemaError
from hurray_schema.hexview import annotate, detect_kind
from hurray_schema.htmlview import ELIDED_KEEP, page_model, render_page
from hurray_schema.io import Tensor, write_file, write_stream
from hurray_schema.io.file.walk import walk_index
from hurray_schema.io.walk import ENTRY
from hurray_schema.model import ElementType
from hurray_schema.structs import file as file_structs
from hurray_schema.structs._declare import fields, static_offset, static_size
from hurray_schema.structs.descriptor import BUFFER_HANDLE, BUFFER_HANDLE_SIZE, FIXED_HEADER
from hurray_schema.structs.file import FILE_HEADER, INDEX_ENTRY_FIELDS, INDEX_NAME_LENGTH, TRAILER

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "hurray_schema" / "samples").iterdir())
SAMPLE_IDS = [p.name for p in SAMPLES]
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _audit_json(path: Path) -> dict:
    _, out = _cli("audit", "--json", str(path))
    return json.loads(out)


def _cut_file(tmp: Path) -> Path:
    """sample.hrry without its last 30 bytes: the trailer is cut, the file is faulty."""
    data = (ROOT / "hurray_schema" / "samples" / "sample.hrry").read_bytes()
    path = tmp / "cut.hrry"
    path.write_bytes(data[:-30])
    return path


# ------------------------------------------------------------------------------------
# The browser
# ------------------------------------------------------------------------------------


def _binary(name: str, *fallbacks: str):
    for candidate in (shutil.which(name), *fallbacks):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    """Headless chromium driven through chromedriver (Debian's ``chromium`` and
    ``chromium-driver``, which ``.ci/run`` installs)."""
    chromium = _binary("chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
    driver_path = _binary("chromedriver", "/usr/bin/chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(f"no browser: chromium {'found' if chromium else 'missing'}, chromedriver "
                    f"{'found' if driver_path else 'missing'} (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("no browser driver: selenium (the test extra) is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument("--window-size=1400,900")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open(driver, page: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.as_uri())
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))


def _current_row(driver):
    """The tree row the page marks current, waited for: the page answers a click or a key in its
    own event handlers, which a loaded machine may run after WebDriver has returned."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(
        lambda d: (d.find_elements("css selector", "#tree .row.current") or [None])[0])


def _selected(driver) -> list[int]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#hex .b.sel')).map(b => Number(b.dataset.o));")


def _tree_rows(driver) -> list[dict]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#tree .row')).map(r => ({i: r.dataset.i, "
        "depth: Number(r.dataset.depth), label: r.querySelector('.label').textContent}));")


def _click_row(driver, i: str) -> None:
    driver.find_element("css selector", f'#tree .row[data-i="{i}"]').click()


def _page(tmp: Path, source: Path, command: str = "audit") -> Path:
    out = tmp / f"{source.name}.{command}.html"
    code, _ = _cli(command, "--html", str(out), str(source))
    assert code in (0, 1), code
    return out


# ------------------------------------------------------------------------------------
# Findings: each listed with its rule id, its byte marked and selected
# ------------------------------------------------------------------------------------


def _check_findings(driver, report: dict) -> None:
    listed = driver.execute_script(
        "return Array.from(document.querySelectorAll('#findings li.finding')).map(li => "
        "({rule: li.dataset.rule, offset: li.dataset.offset, text: li.textContent, j: li.dataset.j}));")
    assert len(listed) == len(report["findings"])
    marked = set(driver.execute_script(
        "return Array.from(document.querySelectorAll('#hex .b.mark')).map(b => Number(b.dataset.o));"))
    for row, shown in zip(report["findings"], listed):
        assert shown["rule"] == row["rule_id"]
        assert row["rule_id"] in shown["text"] and row["level"] in shown["text"]
        assert shown["offset"] == ("" if row["offset"] is None else str(row["offset"]))
        driver.find_element("css selector", f'#findings li.finding[data-j="{shown["j"]}"]').click()
        selected = _selected(driver)
        if row["offset"] is None:
            assert selected == []
            continue
        assert selected == [row["offset"]], (row, selected)
        cell = driver.find_element("css selector", "#hex .b.sel")
        assert "mark" in cell.get_attribute("class")
        assert row["rule_id"] in cell.get_attribute("title")
        marked.add(row["offset"])


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_finding_is_listed_and_marked_at_its_offset(browser, sample, tmp_path):
    report = _audit_json(sample)
    page = _page(tmp_path, sample)
    _open(browser, page)
    _check_findings(browser, report)
    if not report["findings"]:
        assert browser.find_element("css selector", "#findings li.none").text == "No findings."


def test_the_faulty_sample_has_findings_on_its_page(browser, tmp_path):
    sample = ROOT / "hurray_schema" / "samples" / "faulty.stream"
    report = _audit_json(sample)
    assert {"buffer.reserved", "composite.torn"} <= {f["rule_id"] for f in report["findings"]}
    _open(browser, _page(tmp_path, sample))
    _check_findings(browser, report)


def test_a_cut_file_has_its_findings_marked(browser, tmp_path):
    path = _cut_file(tmp_path)
    report = _audit_json(path)
    assert report["findings"] and any(f["offset"] is not None for f in report["findings"])
    _open(browser, _page(tmp_path, path))
    _check_findings(browser, report)


# ------------------------------------------------------------------------------------
# Fields: selecting one highlights exactly its declared bytes
# ------------------------------------------------------------------------------------


def _declared(decl, base: int) -> dict[str, range]:
    return {f.name: range(base + static_offset(decl, f.name), base + static_offset(decl, f.name) + static_size(f))
            for f in fields(decl)}


def _section_fields(rows: list[dict], at: int) -> dict[str, str]:
    """Label -> row id of the rows one level under the section row at position ``at``
    (the fields of the table it holds)."""
    depth = rows[at]["depth"]
    found: dict[str, str] = {}
    for row in rows[at + 1:]:
        if row["depth"] <= depth:
            break
        if row["depth"] == depth + 1:
            found.setdefault(row["label"], row["i"])
    return found


def _expected_fields(path: Path, report: dict) -> list[tuple[str, int, dict[str, range]]]:
    """(section label, which one of that label, field -> declared range), from the
    declarations at the places ``audit --json`` and the located walk give (the index
    entries are the last ``entry i`` sections: the KV section's come before them)."""
    expected = []
    tensors = [g for g in report["groups"] if g["tensor"]]
    for k, group in enumerate(sorted(tensors, key=lambda g: g["start"])):
        expected.append(("fixed_header", k, _declared(FIXED_HEADER, group["start"])))
    data = path.read_bytes()
    if detect_kind(data) == "file":
        expected.append(("file header", 0, _declared(FILE_HEADER, 0)))
        trailer_at = len(data) - static_size(TRAILER)
        expected.append(("trailer", 0, _declared(TRAILER, trailer_at)))
        trailer = {name: int.from_bytes(data[r.start:r.stop], "little")
                   for name, r in _declared(TRAILER, trailer_at).items() if name in ("index_offset", "index_length")}
        view = memoryview(data)[: trailer["index_offset"] + trailer["index_length"]]
        entries = [p for p in walk_index(view, trailer["index_offset"]) if p.kind == ENTRY]
        kv_entries = _kv_entry_count(data, trailer_at)
        for part in entries:
            if part.kind == ENTRY:
                entry = part.value
                fields_at = entry.entry_offset + static_size(INDEX_NAME_LENGTH) + len(entry.name.encode())
                declared = _declared(INDEX_ENTRY_FIELDS, fields_at)
                declared["name_length"] = range(entry.entry_offset, entry.entry_offset + static_size(INDEX_NAME_LENGTH))
                expected.append((f"entry {part.index}", 1 if part.index < kv_entries else 0, declared))
    return expected


def _kv_entry_count(data: bytes, trailer_at: int) -> int:
    declared = _declared(TRAILER, trailer_at)
    kv_offset, kv_length = (int.from_bytes(data[declared[n].start:declared[n].stop], "little")
                            for n in ("kv_offset", "kv_length"))
    if not kv_length:
        return 0
    count = next(iter(fields(file_structs.KV_COUNT)))
    return int.from_bytes(data[kv_offset:kv_offset + static_size(count)], "little")


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_selecting_a_field_highlights_its_declared_bytes(browser, sample, tmp_path):
    report = _audit_json(sample)
    _open(browser, _page(tmp_path, sample, "inspect"))
    rows = _tree_rows(browser)
    checked = 0
    for label, which, declared in _expected_fields(sample, report):
        positions = [n for n, row in enumerate(rows) if row["label"] == label]
        assert len(positions) > which, (label, which)
        shown = _section_fields(rows, positions[which])
        assert set(declared) <= set(shown), (label, set(declared) - set(shown))
        for name, expected in declared.items():
            _click_row(browser, shown[name])
            assert _selected(browser) == list(expected), (label, which, name)
            checked += 1
    assert checked >= len(list(fields(FIXED_HEADER)))


def test_selecting_a_field_shows_its_value_type_and_citation(browser, tmp_path):
    sample = ROOT / "hurray_schema" / "samples" / "member.bin"
    _open(browser, _page(tmp_path, sample, "inspect"))
    rows = _tree_rows(browser)
    row = next(r for r in rows if r["label"] == "descriptor_length")
    _click_row(browser, row["i"])
    details = browser.find_element("css selector", "#details").text
    length = static_offset(FIXED_HEADER, "descriptor_length")
    declared = next(f for f in fields(FIXED_HEADER) if f.name == "descriptor_length")
    assert str(int.from_bytes(sample.read_bytes()[length:length + static_size(declared)], "little")) in details
    assert declared.ref in details
    assert "uint32" in details


def test_long_tables_are_paged_and_a_finding_on_a_later_page_is_reached(browser, tmp_path):
    items = [Tensor.dense(ElementType.FLOAT32, [2, 2]) for _ in range(120)]
    data = bytearray(write_stream(None, items))
    clean = tmp_path / "clean.stream"
    clean.write_bytes(bytes(data))
    last = max(g["start"] for g in _audit_json(clean)["groups"])
    length_at = last + static_offset(FIXED_HEADER, "descriptor_length")
    end = last + int.from_bytes(data[length_at:length_at + 4], "little")
    data[end - BUFFER_HANDLE_SIZE + static_offset(BUFFER_HANDLE, "_reserved")] = 1  # the last buffer handle
    path = tmp_path / "long.stream"
    path.write_bytes(bytes(data))
    report = _audit_json(path)
    assert [f["rule_id"] for f in report["findings"]] == ["buffer.reserved"]
    _open(browser, _page(tmp_path, path))
    assert "page 1 of 1" not in browser.find_element("css selector", "#tree-pager").text
    assert "page 1 of 1" not in browser.find_element("css selector", "#hex-pager").text
    assert len(browser.find_elements("css selector", "#tree .row")) <= 500
    labels = [r["label"] for r in _tree_rows(browser)]
    assert labels[0] == "tensor 0" and "tensor 119" not in labels
    _check_findings(browser, report)
    assert "tensor 119" in [r["label"] for r in _tree_rows(browser)]
    current = _current_row(browser)
    assert current.find_element("css selector", ".label").text == "_reserved"
    browser.find_element("css selector", "#tree-pager .prev").click()
    assert "tensor 119" not in [r["label"] for r in _tree_rows(browser)]


# ------------------------------------------------------------------------------------
# The document
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_the_page_parses_without_errors_and_loads_nothing(sample, tmp_path):
    page = _page(tmp_path, sample)
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    tree = parser.parse(page.read_bytes())
    assert parser.errors == []
    for element in tree.iter():
        assert not {"src", "href", "srcset", "action"} & set(element.attrib), element.tag
        if element.tag in ("link", "iframe", "img", "object", "embed"):
            raise AssertionError(f"external resource element <{element.tag}>")
    assert "http://" not in page.read_text() and "https://" not in page.read_text()


def test_data_buffers_are_elided(tmp_path):
    rng = np.random.default_rng(7)
    array = rng.integers(1, 255, size=(1024, 1024), dtype=np.uint8)
    path = tmp_path / "big.hrry"
    write_file(path, {"big": Tensor.from_numpy(array)})
    data = path.read_bytes()
    model = page_model(data, "file")
    body = array.tobytes()
    start = data.index(body)
    kept = bytearray()
    for offset, hex_bytes in model["segments"]:
        if offset <= start + ELIDED_KEEP < offset + len(hex_bytes) // 2:
            raise AssertionError(f"byte {start + ELIDED_KEEP} of the data buffer is kept")
        if offset == start:
            kept += bytes.fromhex(hex_bytes)
    assert bytes(kept[:ELIDED_KEEP]) == body[:ELIDED_KEEP]
    page = render_page(data, "file")
    assert len(page.encode()) < 64 * 1024 < len(data)
    data_rows = [r for r in model["rows"] if r[0] == "o"]
    assert [(r[3], r[4]) for r in data_rows] == [(start, start + len(body))]


def test_the_bytes_around_a_finding_are_kept(tmp_path):
    sample = ROOT / "hurray_schema" / "samples" / "faulty.stream"
    data = sample.read_bytes()
    report = _audit_json(sample)
    model = page_model(data, "stream", _findings(report))
    kept = {}
    for offset, hex_bytes in model["segments"]:
        for n, byte in enumerate(bytes.fromhex(hex_bytes)):
            kept[offset + n] = byte
    for row in model["rows"]:
        if row[0] == "d":
            for n, byte in enumerate(bytes.fromhex(model["templates"][row[6]]["hex"])):
                kept[row[3] + n] = byte
    for finding in report["findings"]:
        assert kept[finding["offset"]] == data[finding["offset"]]
    assert all(data[o] == b for o, b in kept.items())


def _findings(report: dict) -> list:
    from hurray_schema.rules.engine import Finding, Level

    return [Finding(f["rule_id"], Level(f["level"]), f["citation"], f["message"], f["offset"], f["tolerated"])
            for f in report["findings"]]


# ------------------------------------------------------------------------------------
# Same walk, same view: the page's tree is the annotated view's
# ------------------------------------------------------------------------------------

_NODE_KINDS = {"section": "s", "field": "f", "opaque": "o", "error": "e"}


def _page_tree(model: dict) -> list[tuple]:
    """The tree rows of a page model, descriptors and tables expanded (as its script does)."""
    labels, out = model["labels"], []
    for row in model["rows"]:
        kind, depth, label, start, end, text, extra = row
        if kind == "t":
            for (name, offset, size, _), value in zip(model["layouts"][label], text):
                out.append(("f", depth, labels[name], start + offset, start + offset + size, str(value)))
            continue
        out.append(("s" if kind == "d" else kind, depth, labels[label], start, end, text))
        if kind == "d":
            for t in model["templates"][extra]["rows"]:
                out.append((t[0], t[1] + depth, labels[t[2]], t[3] + start, t[4] + start, t[5]))
    return out


def _annotated(data: bytes, kind: str) -> list[tuple]:
    return [(_NODE_KINDS[n.kind], n.depth, n.label, n.start, n.end, n.text) for n in annotate(data, kind)]


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_the_tree_is_the_annotated_view(sample):
    data = sample.read_bytes()
    kind = detect_kind(data)
    assert _page_tree(page_model(data, kind)) == _annotated(data, kind)


SAMPLE_BYTES = [p.read_bytes() for p in SAMPLES]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLE_BYTES), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6),
       st.integers(0, 1 << 16))
def test_the_tree_is_the_annotated_view_of_damaged_bytes(data, edits, cut):
    damaged = bytearray(data)
    for at, byte in edits:
        damaged[at % len(damaged)] = byte
    damaged = bytes(damaged[: max(1, len(damaged) - cut % len(damaged))])
    kind = detect_kind(damaged)
    if kind == "unknown":
        kind = "stream"
    try:
        expected = _annotated(damaged, kind)
    except HurraySchemaError:
        with pytest.raises(HurraySchemaError):
            page_model(damaged, kind)
        return
    assert _page_tree(page_model(damaged, kind)) == expected


# ------------------------------------------------------------------------------------
# The commands
# ------------------------------------------------------------------------------------


def test_inspect_html_writes_the_page_instead_of_the_text(tmp_path):
    out = tmp_path / "page.html"
    code, text = _cli("inspect", "--html", str(out), str(SAMPLES[0]))
    assert code == 0
    assert text.strip() == f"wrote {out}: {out.stat().st_size} bytes"
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_audit_html_keeps_the_report_and_the_exit_code(tmp_path):
    out = tmp_path / "page.html"
    sample = ROOT / "hurray_schema" / "samples" / "faulty.stream"
    code, text = _cli("audit", "--html", str(out), str(sample))
    assert code == 1
    assert "composite.torn" in text and out.is_file()


def test_the_spawned_command_writes_the_page(tmp_path):
    out = tmp_path / "page.html"
    sample = ROOT / "hurray_schema" / "samples" / "sample.hrry"
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "audit", "--html", str(out), str(sample)],
                          capture_output=True, text=True, env=environment, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "weights" in out.read_text()


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError):
        page_model(b"HRRY", "picture")


def test_a_message_stream_gives_the_annotated_view_and_a_valid_page():
    items = [Tensor.dense(ElementType.FLOAT32, [2, 3]), Tensor.dense(ElementType.INT8, [5])]
    data = bytes(write_stream(None, items, framing="messages"))
    assert detect_kind(data) == "messages"
    model = page_model(data, "messages")
    assert _page_tree(model) == _annotated(data, "messages")
    assert sum(1 for row in _page_tree(model) if row[2].startswith("message ")) >= 2
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    parser.parse(render_page(data, "messages"))
    assert parser.errors == []


def test_selecting_a_byte_selects_the_field_holding_it(browser, tmp_path):
    sample = ROOT / "hurray_schema" / "samples" / "sample.hrry"
    _open(browser, _page(tmp_path, sample, "inspect"))
    declared = _declared(FILE_HEADER, 0)["data_buffer_alignment"]
    browser.find_element("css selector", f'#hex .b[data-o="{declared.start + 1}"]').click()
    current = _current_row(browser)
    assert current.find_element("css selector", ".label").text == "data_buffer_alignment"
    assert _selected(browser) == list(declared)


def test_going_to_a_byte_selects_the_field_holding_it(browser, tmp_path):
    from selenium.webdriver.common.keys import Keys

    sample = ROOT / "hurray_schema" / "samples" / "sample.hrry"
    _open(browser, _page(tmp_path, sample, "inspect"))
    declared = _declared(TRAILER, len(sample.read_bytes()) - static_size(TRAILER))["index_offset"]
    box = browser.find_element("css selector", "#goto")
    box.send_keys(str(declared.start + 2), Keys.ENTER)
    current = _current_row(browser)
    assert current.find_element("css selector", ".label").text == "index_offset"
    assert _selected(browser) == list(declared)
