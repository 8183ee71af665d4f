"""The generated documentation, the Kaitai Struct schema, the annotated hex view and the codec
agree field by field -- name, byte range, value -- on every descriptor of every passing
conformance vector (our corpus, and the reference project's golden descriptors where
``../shared/conformance`` is present).

Each side is read as its user meets it:

* the hex view: the field nodes of ``hurray_schema.hexview.annotate`` (name, bytes, value);
* the Kaitai schema: a parser compiled from the rendered ``.ksy`` by the Kaitai compiler
  (``tests/support/kaitai.py``: every leaf's name, range and value against the hex view);
* the docs: the Markdown tables of the rendered pages, parsed here -- each field's offset
  in its table and in the descriptor (the ``N + M·rank`` expressions evaluated at the
  descriptor's rank), its wire type's size, its name and order;
* the codec: the value objects ``decode_descriptor`` returns, and the byte span of every part
  the encoder gives (``descriptor_spans``).
"""

from __future__ import annotations

import re
from functools import lru_cache

import attrs
import construct
import pytest

from support import kaitai
from support.corpus import corpus, rendered_pages
from hurray_schema.codec import parse_descriptor
from hurray_schema.hexview import annotate
from hurray_schema.structs.descriptor import MAGIC, OVERALL_REF
from hurray_schema.structs.wire import descriptor_spans

# --------------------------------------------------------------------------------------
# The docs, as a reader sees them
# --------------------------------------------------------------------------------------

_HEADING = re.compile(r"^## `(\w+)`")
_ROW = re.compile(r"^\| (.*) \|$")
_TYPE = re.compile(r"^`(u?int|float|bfloat)(\d+)(?:\[(rank|\d+)\])?`$")
_SELECTED = re.compile(r"`(\w+)` is 0x([0-9A-F]{2})")


@attrs.frozen
class DocTable:
    page: str
    name: str
    fields: tuple  # (name, offset text, in-descriptor text or None, type text)
    selected_by: tuple  # (field, value) pairs the "Present when ..." line names


def _evaluate(text: str, rank: int):
    """``"2 + 8·rank"`` at ``rank``; None for ``—`` (not fixed)."""
    if text == "—":
        return None
    total = 0
    for term in text.split(" + "):
        if term.endswith("rank"):
            factor = term[: -len("rank")].rstrip("·")
            total += (int(factor) if factor else 1) * rank
        else:
            total += int(term)
    return total


def _type_size(text: str, rank: int):
    match = _TYPE.match(text)
    if match is None:
        return None
    width = int(match.group(2)) // 8
    count = match.group(3)
    return width * (1 if count is None else rank if count == "rank" else int(count))


@lru_cache(maxsize=1)
def doc_tables() -> tuple[DocTable, ...]:
    """Every table of the rendered pages with a Field column."""
    tables = []
    for page, text in rendered_pages().items():
        name, selected, header, rows = None, (), None, []
        for line in text.splitlines() + ["## `END`"]:
            heading = _HEADING.match(line)
            if heading:
                if name is not None and rows:
                    tables.append(DocTable(page, name, tuple(rows), selected))
                name, selected, header, rows = heading.group(1), (), None, []
            elif line.startswith("Size:"):  # "... Present when `layout_tag` is 0x03 (STRIDED)."
                selected = tuple((f, int(v, 16)) for f, v in _SELECTED.findall(line))
            row = _ROW.match(line)
            if row is None or name is None:
                continue
            cells = [c.strip() for c in row.group(1).split(" | ")]
            if cells[0] == "Offset":
                header = cells
            elif header is not None and "Field" in header and not cells[0].startswith("---"):
                record = dict(zip(header, cells))
                rows.append((record["Field"].strip("`"), record["Offset"], record.get("In descriptor"),
                             record["Type"]))
    return tuple(tables)


# --------------------------------------------------------------------------------------
# The hex view's tables of one descriptor
# --------------------------------------------------------------------------------------


@attrs.frozen
class ViewTable:
    label: str
    start: int  # of the section
    fields: tuple  # (name, start, end, value), offsets from the descriptor's first byte


def view_tables(nodes, base: int) -> tuple[list[ViewTable], dict]:
    """The innermost sections holding fields, and the depth-1 part sections' ranges."""
    tables, parts, open_sections = [], {}, []
    top = nodes[0].depth
    for node in nodes[1:]:
        while open_sections and open_sections[-1][0].depth >= node.depth:
            section, found = open_sections.pop()
            if found:
                tables.append(ViewTable(section.label, section.start - base, tuple(found)))
        if node.kind == "section":
            open_sections.append((node, []))
            if node.depth == top + 1:
                parts[node.label.split(" (")[0]] = (node.start - base, node.end - base)
        elif node.kind == "field" and open_sections:
            open_sections[-1][1].append((node.label, node.start - base, node.end - base, node.value))
    for section, found in reversed(open_sections):
        if found:
            tables.append(ViewTable(section.label, section.start - base, tuple(found)))
    return tables, parts


def _matches(doc: DocTable, view: ViewTable, header: dict) -> bool:
    names = [f[0] for f in doc.fields]
    position = 0
    for name, *_ in view.fields:
        if name not in names[position:]:
            return False
        position = names.index(name, position) + 1
    return all(header.get(field, value) == value for field, value in doc.selected_by)  # a tag the docs select by


def check_docs(view: ViewTable, header: dict, rank: int) -> int:
    """Every field of ``view`` at the offset, in-descriptor offset and size its docs table gives."""
    candidates = [d for d in doc_tables() if _matches(d, view, header)]
    assert candidates, f"no docs table holds the fields of {view.label}: {[f[0] for f in view.fields]}"
    doc = max(candidates, key=lambda d: (len(d.selected_by), -len(d.fields)))
    rows = {row[0]: row for row in doc.fields}
    table_start = view.fields[0][1] - (_evaluate(rows[view.fields[0][0]][1], rank) or 0)
    first_level = not view.label.startswith("level ") or view.label == "level 1"  # docs place the first level
    checked = 0
    for name, start, end, _ in view.fields:
        _, offset, absolute, type_text = rows[name]
        relative = _evaluate(offset, rank)
        if relative is not None:
            assert table_start + relative == start, (doc.page, doc.name, name, offset, start)
        if first_level and absolute is not None and _evaluate(absolute, rank) is not None:
            assert _evaluate(absolute, rank) == start, (doc.page, doc.name, name, absolute, start)
        size = _type_size(type_text, rank)
        if size is not None:
            assert end - start == size, (doc.page, doc.name, name, type_text, end - start)
        checked += 1
    return checked


# --------------------------------------------------------------------------------------
# The codec's values
# --------------------------------------------------------------------------------------


def _fields_of(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in attrs.fields(type(obj))}


def codec_values(desc, length: int, spans: dict) -> dict:
    """Expected field values per hex-view section label, from the decoded value objects."""
    out = {
        "fixed_header": dict(magic=MAGIC, version_major=desc.version_major, version_minor=desc.version_minor,
                             descriptor_length=length, flags=desc.flags, type_tag=desc.type_tag,
                             layout_tag=desc.layout.tag, rank=len(desc.shape)),
        "shape": {"shape": tuple(desc.shape)},
        "byte_offset": {"byte_offset": desc.byte_offset},
        "buffer_table": {"buffer_count": len(desc.buffers)},
    }
    levels, level = [], desc.layout
    while level is not None:
        levels.append(level)
        level = getattr(level, "inner", None)
    out["layout"] = _fields_of(desc.layout)
    if "extension_data" in out["layout"]:
        out["layout"]["extension_data_length"] = len(desc.layout.extension_data)
    for k, lvl in enumerate(levels, 1):
        out[f"level {k}"] = _fields_of(lvl)
    for i, handle in enumerate(desc.buffers):
        out[f"buffers[{i}]"] = _fields_of(handle)
    if desc.quantization is not None:
        start, end = spans["quantization"]
        out["quantization"] = {"quantization_length": end - start - 4}
        out["scheme"] = dict(_fields_of(desc.quantization), scheme_tag=desc.quantization.scheme)
    for name in ("shard", "statistics", "extension_type", "composite_member"):
        section = getattr(desc, name)
        if section is not None:
            out[name] = _fields_of(section)
    return out


def _same(ours, theirs) -> bool:
    if isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs))
    if isinstance(ours, float) and isinstance(theirs, float) and ours != ours:
        return theirs != theirs
    return ours == theirs


# --------------------------------------------------------------------------------------
# One descriptor, four tools
# --------------------------------------------------------------------------------------


def agree(data: bytes) -> int:
    """Check one clean descriptor; returns the number of fields compared."""
    nodes = annotate(data, "descriptor")
    assert not [n for n in nodes if n.kind == "error"], [n.text for n in nodes if n.kind == "error"]
    desc, findings = parse_descriptor(data, mode="permissive")
    tables, parts = view_tables(nodes, nodes[0].start)
    spans = {name: (start, end) for name, start, end in descriptor_spans(desc) if end > start}
    assert {k: v for k, v in parts.items() if k in spans} == spans, (parts, spans)  # hex view parts = codec parts
    header = {name: value for name, _, _, value in tables[0].fields} if tables else {}
    if desc.quantization is not None:
        header["scheme_tag"] = desc.quantization.scheme
    expected = codec_values(desc, len(data), spans)
    compared = 0
    for table in tables:
        key = table.label.split(" (")[0]
        values = expected.get(key, expected.get(table.label))
        assert values is not None, f"the codec has no part {table.label}"
        for name, start, end, value in table.fields:
            assert name in values, (table.label, name)
            assert _same(value, values[name]), (table.label, name, value, values[name])
        compared += check_docs(table, header, len(desc.shape))
    kaitai.compare(data, "descriptor")  # the Kaitai parser: names, ranges and values as the hex view
    return compared


def descriptors_in(data: bytes, kind: str) -> list[bytes]:
    """Each descriptor the hex view finds in a vector of ``kind``."""
    return [data[n.start:n.end] for n in annotate(data, kind) if n.kind == "section" and n.ref == OVERALL_REF]


@lru_cache(maxsize=1)
def passing_vectors() -> tuple:
    return tuple(v for v in corpus().vectors if v.role == "pass")


@pytest.mark.parametrize("kind", ["descriptor", "stream", "messages", "file", "session"])
def test_every_descriptor_of_every_passing_vector_agrees(kind):
    """Every descriptor of every passing vector; a session direction may carry none (hellos and
    requests only), so there the sessions together must carry some."""
    kaitai.python_parsers()
    vectors = [v for v in passing_vectors() if v.kind == kind]
    assert vectors
    seen = 0
    for vector in vectors:
        for data in descriptors_in(vector.data, vector.container):
            try:
                assert agree(data) > 0
            except AssertionError as exc:
                raise AssertionError(f"{vector.file}: {exc}") from None
            seen += 1
    assert seen >= (len(vectors) if kind != "session" else 10)


def test_the_golden_descriptors_agree(conformance_dir):
    kaitai.python_parsers()
    inputs = sorted((conformance_dir / "descriptors").glob("*.bin"))
    assert inputs
    for path in inputs:
        assert agree(path.read_bytes()) > 0, path.name


def test_a_docs_offset_that_disagrees_is_caught(monkeypatch):
    """The docs check can fail: the same tables with every offset one byte further are refused."""
    vector = next(v for v in passing_vectors() if v.kind == "descriptor")
    nodes = annotate(vector.data, "descriptor")
    tables, _ = view_tables(nodes, nodes[0].start)
    header = {name: value for name, _, _, value in tables[0].fields}
    assert check_docs(tables[0], header, header["rank"]) > 0
    shifted = tuple(attrs.evolve(t, fields=tuple((n, _shift(o), _shift(a), ty) for n, o, a, ty in t.fields))
                    for t in doc_tables())
    monkeypatch.setattr(__import__(__name__), "doc_tables", lambda: shifted)
    with pytest.raises(AssertionError):
        check_docs(tables[0], header, header["rank"])


def test_a_codec_value_that_disagrees_is_caught():
    """The value check can fail: a descriptor whose decoded rank is made to differ is refused."""
    vector = next(v for v in passing_vectors() if v.kind == "descriptor")
    desc, _ = parse_descriptor(vector.data)
    values = codec_values(desc, len(vector.data), {})
    assert values["fixed_header"]["rank"] == len(desc.shape)
    assert not _same(values["fixed_header"]["rank"], len(desc.shape) + 1)


def _shift(text):
    return text if text in ("—", None) else f"1 + {text}"


# --------------------------------------------------------------------------------------
# A constraint declared on a field is one a strict reader enforces
# --------------------------------------------------------------------------------------


def _declared_constraints():
    """``(table, field)`` of every descriptor field declared with a value constraint."""
    from hurray_schema.structs import descriptor, layouts, quantization, sections
    from hurray_schema.structs._declare import fields

    found, seen = [], set()
    for module in (descriptor, layouts, quantization, sections):
        for name, value in vars(module).items():
            tables = value.values() if isinstance(value, dict) else [value]
            for table in tables:
                if not isinstance(table, construct.Struct) or id(table) in seen:
                    continue
                seen.add(id(table))
                for f in fields(table):
                    v = f.valid
                    if v is not None and (v.zero or v.any_of is not None or v.bounds is not None or v.power_of_two):
                        found.append((table, f))
    return found


def _outside(f, raw: bytes) -> bytes:
    """``raw`` (the field's bytes) changed to a value its declaration does not allow."""
    v = f.valid
    if v.zero:
        return b"\x01" + raw[1:]
    size = len(raw)
    if v.any_of is not None:
        value = max(int(m) for m in v.any_of) + 1
    elif v.highest is not None:
        value = v.highest + 1
    elif v.lowest is not None:
        value = v.lowest - 1
    else:  # power_of_two alone
        value = 3
    return value.to_bytes(size, "little")


def test_every_declared_constraint_is_enforced_by_a_rule():
    from hurray_schema import SpecViolation, decode_descriptor
    from hurray_schema.structs._declare import fields

    descriptors = [d for v in passing_vectors() for d in descriptors_in(v.data, v.container)]
    missing = []
    for table, f in _declared_constraints():
        names = {g.name for g in fields(table)}
        placed = None
        for data in descriptors:
            nodes = annotate(data, "descriptor")
            for view in view_tables(nodes, nodes[0].start)[0]:
                here = {n for n, *_ in view.fields}
                if f.name in here and here <= names and len(here) > 1 or here == {f.name} == names:
                    placed = data, next(s for s in view.fields if s[0] == f.name)
                    break
            if placed:
                break
        if placed is None:
            missing.append(f.name)
            continue
        data, (_, start, end, _) = placed
        decode_descriptor(data)  # clean as it is
        bad = data[:start] + _outside(f, data[start:end]) + data[end:]
        with pytest.raises(SpecViolation) as caught:
            decode_descriptor(bad)
        assert start <= caught.value.offset < end, (f.name, caught.value)
    assert not missing, f"no passing vector holds these constrained fields: {missing}"
