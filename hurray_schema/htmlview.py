"""A self-contained HTML page of Hurray bytes: the structure tree beside the hex view, and
the audit's findings marked in it (``hurray-schema inspect --html`` / ``audit --html``).

The page is a model (:func:`page_model`) put into the template
``templates/page.html.j2`` as JSON and drawn by the small script inside the template; it
needs no network and no other file.  The model comes from the located walks of
:mod:`hurray_schema.io.walk` and :mod:`hurray_schema.io.walk.kv` (fault policy ``ANNOTATE``),
the parts they yield turned into rows the way :mod:`hurray_schema.hexview` turns them into
nodes:

* a descriptor is annotated field by field by :func:`hurray_schema.hexview.annotate_descriptor`
  once per distinct byte string (a *template*: rows and bytes relative to its start), and
  each descriptor of the input is a row naming its template -- 20,000 tensors written by
  one producer share a handful of templates;
* a table the walk decoded (file header, trailer, index and KV entries, message headers)
  gives one row per declared field, at the offset the declaration gives it, with the value
  the walk read, the field's wire type and its citation;
* a data buffer, a payload or any other run without fields is elided: its size and its
  first :data:`ELIDED_KEEP` bytes are kept, so a 1 GB input gives a small page.

The bytes a page holds are the fields' own bytes, the start of each elided run and a few
bytes around every finding's offset; the script pages long tables (tree rows, hex lines,
findings).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Iterable, Optional

from .docs import presence, spec_type
from .memo import MEMO
from .hexview import Node, annotate_descriptor, descriptor_extent, render_value, session_payload_nodes
from .io.walk.kv import walk_kv
from .io.source import merged_spans
from .io.file.walk import FILE_HEADER_PART, INDEX_PART, KV_PART, TENSOR_DATA, TRAILER_PART, walk_file, walk_index
from .io.walk import (
    BUFFER, DATA, DATA_HEADER, DESCRIPTOR, ENTRY, ENTRY_START, FAULT, MESSAGE, MESSAGE_HEADER_PART, NAME, PAYLOAD,
    TABLE, TRANSPORT, VALUE, Faults, Part, Window, as_view, walk_bare, walk_descriptor, walk_messages,
)
from .rules.engine import Mode
from .structs import file as file_structs
from .structs import stream as stream_structs
from .structs._declare import Plan, fields, select, static_size

__all__ = ["PAGE_SCHEMA", "ELIDED_KEEP", "FINDING_CONTEXT", "page_model", "render_page", "write_page"]

PAGE_SCHEMA = "hurray-schema/page/1"
"""The ``schema`` of the model the page script reads."""

ELIDED_KEEP = 16
"""Bytes of an elided run (data buffer, payload, padding) the page keeps."""

FINDING_CONTEXT = 8
"""Bytes kept on each side of a finding's offset (when the input has them)."""

KINDS = ("descriptor", "stream", "messages", "file")

# A row is ``[kind, depth, label, start, end, text, meta]`` (label: index into ``labels``;
# meta: index into ``metas``, ``[wire type, citation, about]``, or -1), except that a
# descriptor row holds its template's index in place of meta and a table row holds its
# layout's index in place of label and the list of its fields' value texts in place of text.
SECTION, FIELD, ELIDED, ERROR, TEMPLATE, TABLE_ROW = "s", "f", "o", "e", "d", "t"
_NODE_KINDS = {"section": SECTION, "field": FIELD, "opaque": ELIDED, "error": ERROR}

_KV_FIELDS = {"key": ("UTF-8 key.", "file-format.md § KV Section Encoding"),
              "value": ("Value bytes.", file_structs.KV_TYPES_REF)}
_INDEX_FIELDS = {"name": ("UTF-8 tensor name.", "file-format.md § Index Encoding")}


_LAYOUTS = MEMO.view_layouts


def _layout(decl) -> Optional[tuple]:
    """Where each field of the fixed-size table ``decl`` sits: ``(field, offset, size,
    wire type)`` per field (``None`` when a field's size or presence depends on the others)."""
    if decl in _LAYOUTS:
        return _LAYOUTS[decl]
    slots, offset = [], 0
    for f in fields(decl):
        size = static_size(f.subcon)
        if size is None or presence(f) is not None:
            slots = None
            break
        slots.append((f, offset, size, spec_type(f)))
        offset += size
    layout = tuple(slots) if slots is not None else None
    _LAYOUTS[decl] = layout
    return layout


_PREFIX_PLANS = MEMO.view_prefixes


def _prefix_plan(decl, layout: tuple, count: int):
    """The codec of the first ``count`` fields of ``decl``."""
    plan_ = _PREFIX_PLANS.get((decl, count))
    if plan_ is None:
        plan_ = _PREFIX_PLANS[(decl, count)] = Plan(select(decl, *[f.name for f, *_ in layout[:count]]))
    return plan_


def _value_text(f, value, size: int) -> str:
    """A field's value as the annotated view writes it."""
    return render_value(f.name, value, size, f.tags)


class _Model:
    """Rows, templates and kept byte ranges of one page, with interned strings."""

    def __init__(self, view: memoryview):
        self.view = view
        self.rows: list[list] = []
        self.templates: list[dict] = []
        self.metas: list[list] = []
        self._meta_ids: dict[tuple, int] = {}
        self.labels: list[str] = []
        self._label_ids: dict[str, int] = {}
        self.keep: list[tuple[int, int]] = []
        self._by_bytes: dict[bytes, tuple[int, Any, int, str]] = {}
        self.layouts: list[list] = []
        self._layout_ids: dict[tuple[int, int], int] = {}

    # -- interned strings --------------------------------------------------------------

    def meta(self, wire_type: str, ref: str, doc: str) -> int:
        key = (wire_type, ref, doc)
        found = self._meta_ids.get(key)
        if found is None:
            found = self._meta_ids[key] = len(self.metas)
            self.metas.append([wire_type, ref, doc])
        return found

    def label(self, text: str) -> int:
        found = self._label_ids.get(text)
        if found is None:
            found = self._label_ids[text] = len(self.labels)
            self.labels.append(text)
        return found

    # -- rows ----------------------------------------------------------------------------

    def row(self, kind: str, depth: int, label: str, start: int, end: int, text: str = "",
            meta: int = -1) -> int:
        self.rows.append([kind, depth, self.label(label), start, end, text, meta])
        if kind == FIELD:
            self.keep.append((start, end))
        elif kind == ELIDED:
            self.keep.append((start, min(end, start + ELIDED_KEEP)))
        elif kind == ERROR:
            self.keep.append((start, start + 1))
        return len(self.rows) - 1

    def close(self, index: int, end: int) -> None:
        self.rows[index][4] = end

    def node_rows(self, nodes: Iterable[Node], base: int = 0, depth: int = 0, into: Optional[list] = None) -> list:
        """Rows of annotated-view nodes (offsets moved by ``base``, depths by ``depth``)."""
        rows = [] if into is None else into
        for n in nodes:
            meta = self.meta(n.type, n.ref, n.doc) if (n.type or n.ref or n.doc) else -1
            rows.append([_NODE_KINDS[n.kind], n.depth + depth, self.label(n.label), n.start + base, n.end + base,
                         n.text, meta])
        return rows

    def nodes_in_place(self, nodes: list[Node]) -> None:
        """Rows of annotated-view nodes where they sit, their bytes kept as a row's would be."""
        self.node_rows(nodes, into=self.rows)
        self.keep.extend((n.start, n.end) for n in nodes if n.kind == "field")
        self.keep.extend((n.start, min(n.end, n.start + ELIDED_KEEP)) for n in nodes if n.kind == "opaque")
        self.keep.extend((n.start, n.start + 1) for n in nodes if n.kind == "error")

    def table(self, part: Part, depth: int, limit: Optional[int] = None) -> None:
        """The fields of a table the walk located at ``part.start``, as one row: the table's
        layout (its fields' names, offsets, sizes, wire types, citations; kept once per
        page) and the values the walk decoded.  A table the walk found cut off (no value)
        shows the fields that fit before ``limit`` (default: the end of the input) and an
        error at the first that does not."""
        layout = _layout(part.decl)
        if layout is None:
            self.row(ERROR, depth, "error", part.start, part.start, part.note or "the table cannot be shown")
            return
        values = part.value
        if not isinstance(values, dict):
            self._partial(part, layout, depth, len(self.view) if limit is None else limit)
            return
        texts = [_value_text(f, values.get(f.name), size) for f, _, size, _ in layout]
        end = part.start + layout[-1][1] + layout[-1][2]
        self.rows.append([TABLE_ROW, depth, self._layout_id(part.decl, layout), part.start, end, texts, -1])
        self.keep.append((part.start, end))

    def _partial(self, part: Part, layout: tuple, depth: int, limit: int) -> None:
        """The fields of a cut-off table that fit before ``limit``, decoded, and the error
        row of the first one that does not (written after them)."""
        remain = max(0, limit - part.start)
        fit = 0
        while fit < len(layout) and layout[fit][1] + layout[fit][2] <= remain:
            fit += 1
        values = {}
        if fit:
            values, _ = _prefix_plan(part.decl, layout, fit).unpack(self.view, part.start)
        if fit < len(layout):
            f, offset, size, _ = layout[fit]
            at = part.start + offset
            error = [ERROR, depth, self.label("error"), at, at, f"{f.name} needs {size} bytes, "
                     f"{remain - offset} remain", -1]
        else:
            error = None
        kept = layout[:fit]
        if kept:
            texts = [_value_text(f, values.get(f.name), size) for f, _, size, _ in kept]
            end = part.start + kept[-1][1] + kept[-1][2]
            self.rows.append([TABLE_ROW, depth, self._layout_id(part.decl, kept), part.start, end, texts, -1])
            self.keep.append((part.start, end))
        if error is not None:
            self.rows.append(error)
            self.keep.append((error[3], error[3] + 1))

    def _layout_id(self, decl, layout: tuple) -> int:
        """The page's index of ``layout``: the first ``len(layout)`` fields of ``decl``."""
        key = (id(decl), len(layout))
        found = self._layout_ids.get(key)
        if found is None:
            found = self._layout_ids[key] = len(self.layouts)
            self.layouts.append([[self.label(f.name), offset, size, self.meta(wire_type, f.ref, f.doc)]
                                 for f, offset, size, wire_type in layout])
        return found

    def raw_field(self, depth: int, label: str, start: int, end: int, raw, wire_type: str, doc_ref) -> None:
        doc, ref = doc_ref
        text = render_value("key" if label in ("key", "value") else label, bytes(raw))
        self.row(FIELD, depth, label, start, end, text, self.meta(wire_type, ref, doc))

    # -- descriptors ---------------------------------------------------------------------

    def descriptor(self, buf, base: int, depth: int, label: str) -> Part:
        """The walk's descriptor step: a template row when the descriptor annotates
        without error (one template per distinct byte string), else its rows in place."""
        view = as_view(buf)
        key = bytes(view[: descriptor_extent(view)])
        found = self._by_bytes.get(key)
        if found is None:
            nodes, desc, end = annotate_descriptor(view, base=0, depth=0, label=label)
            if any(n.kind == "error" for n in nodes):  # error texts may depend on where it sits
                nodes, desc, end = annotate_descriptor(view, base=base, depth=depth, label=label)
                self.nodes_in_place(nodes)
                return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)
            template = {"rows": self.node_rows(nodes[1:]), "hex": key[:end].hex()}
            self.templates.append(template)
            found = self._by_bytes[key] = (len(self.templates) - 1, desc, end, nodes[0].text)
        index, desc, end, text = found
        self.rows.append([TEMPLATE, depth, self.label(label), base, base + end, text, index])
        return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)


# ------------------------------------------------------------------------------------
# The walks, part by part
# ------------------------------------------------------------------------------------


def _file_rows(model: _Model) -> None:
    """A ``.hrry`` file: header, each tensor (members under their head) and its data, KV
    metadata, index, trailer (``file-format.md``)."""
    view = model.view
    size = len(view)
    state = {"label": "", "desc": None}

    def describe(buf, base: int, depth: int) -> Part:
        part = model.descriptor(buf, base, depth, state["label"])
        state["desc"] = part.value
        return part

    for part in walk_file(view, describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == FILE_HEADER_PART or kind == FAULT and part.decl is not None:
            section = model.row(SECTION, 0, "file header", 0, 0, meta=model.meta("", file_structs.HEADER_REF, ""))
            model.table(part, 1)
            model.close(section, part.end)
        elif kind == FAULT:
            model.row(ERROR, 0, "error", part.start, part.start, part.note)
        elif kind == ENTRY:
            state["label"] = f"tensor {part.value.name!r}"
        elif kind == TENSOR_DATA:
            start, end = part.start, min(size, part.end) if part.start <= size else part.start
            buffers = len(state["desc"].buffers) if state["desc"] is not None else 0
            model.row(ELIDED, part.depth + 1, "data", start, max(end, start),
                      f"{part.end - part.start} bytes in {buffers} buffer{'' if buffers == 1 else 's'}",
                      model.meta("", "file-format.md § Data Buffer Placement", ""))
        elif kind in (KV_PART, INDEX_PART):
            _section_rows(model, part, kind)
        elif kind == TRAILER_PART:
            section = model.row(SECTION, 0, "trailer", part.start, part.end,
                                meta=model.meta("", file_structs.TRAILER_REF, ""))
            model.table(part, 1)
            model.close(section, part.end)


def _section_rows(model: _Model, part: Part, kind: str) -> None:
    """The KV or index section: its count, then an ``entry i`` section per entry."""
    view = model.view
    off, n = part.start, part.end - part.start
    label, ref = ("kv metadata", file_structs.KV_REF) if kind == KV_PART else ("index", file_structs.INDEX_REF)
    if off > len(view) or n > len(view) - off:
        model.row(ERROR, 0, "error", min(off, len(view)), min(off, len(view)),
                  f"{'KV' if kind == KV_PART else 'index'} section [{off}, {off + n}) lies outside the file")
        return
    model.row(SECTION, 0, label, off, off + n, meta=model.meta("", ref, ""))
    if kind == KV_PART:
        parts, named = walk_kv(view[off : off + n], off, faults=Faults.ANNOTATE), _KV_FIELDS
    else:
        parts, named = walk_index(view[: off + n], off), _INDEX_FIELDS
    entry = None
    for p in parts:
        depth = 2 + p.depth
        if p.kind == TABLE or p.kind == FAULT and p.decl is not None:
            model.table(p, depth, off + n)
        elif p.kind == FAULT:
            model.row(ERROR, depth, "error", p.start, p.start, p.note)
            return
        elif p.kind == ENTRY_START:
            entry = model.row(SECTION, 1, f"entry {p.index}", p.start, p.start)
        elif p.kind in (NAME, VALUE):
            name = p.note or "name"
            wire_type = "uint8[name_length]" if name == "name" else f"uint8[{p.end - p.start}]"
            model.raw_field(depth, name, p.start, p.end, p.value, wire_type, named[name])
        elif p.kind == ENTRY and entry is not None:
            model.close(entry, p.end)


def _stream_rows(model: _Model) -> None:
    """A bare stream: each descriptor, then its buffers (``buffer-protocol.md``)."""
    count, depth = [0], 0

    def describe(buf, base: int, depth: int) -> Part:
        count[0] += 1
        return model.descriptor(buf, base, depth, f"tensor {count[0] - 1}")

    for part in walk_bare(Window(model.view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        if part.kind == DESCRIPTOR:
            depth = part.depth
        elif part.kind == BUFFER:
            model.row(ELIDED, depth + 1, f"buffer {part.index} data", part.start, part.end,
                      f"{part.end - part.start} bytes", model.meta("", "buffer-protocol.md § Buffer Handle", ""))
        elif part.kind == FAULT:
            model.row(ERROR, depth + 1, "error", part.start, part.start, part.note)


def _message_rows(model: _Model) -> None:
    """A message stream: each message, its header and its payload's parts
    (``stream_structs.FRAMING_REF``); a session message's payload field by field as
    ``inspect`` shows it (:func:`~hurray_schema.hexview.session_payload_nodes`)."""
    section, message_end, message_type = None, 0, None

    def describe(buf, base: int, depth: int) -> Part:
        return model.descriptor(buf, base, depth, "descriptor")

    for part in walk_messages(Window(model.view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == MESSAGE:
            section = model.row(SECTION, 0, f"message {part.index}", part.start, part.end,
                                meta=model.meta("", stream_structs.FRAMING_REF, ""))
            message_end = part.end
            message_type = part.value["message_type"] if part.value else None
        elif kind == PAYLOAD and (nodes := session_payload_nodes(model.view, message_type, part.start,
                                                                 part.end)) is not None:
            model.nodes_in_place(nodes)
        elif kind == MESSAGE_HEADER_PART or kind == FAULT and part.decl is not None:
            model.table(part, 1)
        elif kind in (TRANSPORT, DATA_HEADER):
            model.table(part, 1, message_end)
        elif kind == FAULT:
            model.row(ERROR, 1, "error", part.start, part.start, part.note)
        elif kind in (DATA, PAYLOAD):
            ref = stream_structs.DATA_REF if kind == DATA else stream_structs.FRAMING_REF
            model.row(ELIDED, 1, "data" if kind == DATA else "payload", part.start, part.end,
                      f"{part.end - part.start} bytes", model.meta("", ref, ""))
        if section is not None and kind != MESSAGE and part.end > model.rows[section][4]:
            model.close(section, part.end)


def _descriptor_rows(model: _Model) -> None:
    """A single descriptor (and anything after it, as trailing bytes)."""
    for part in walk_descriptor(model.view, lambda buf, base, depth: model.descriptor(buf, base, depth, "descriptor")):
        if part.kind == FAULT:
            model.row(ERROR, 1, "error", part.start, part.start, part.note)


_ROWS = {"file": _file_rows, "stream": _stream_rows, "messages": _message_rows, "descriptor": _descriptor_rows}


# ------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------


def _merged(ranges: Iterable[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``ranges`` clipped to ``[0, size)``, sorted and merged (touching ones joined)."""
    return merged_spans((max(0, s), min(size, e)) for s, e in ranges if min(size, e) > max(0, s))


def _finding_rows(findings: Iterable) -> list[dict]:
    return [{"rule_id": f.rule_id, "level": f.level.value, "message": f.message, "citation": f.citation,
             "offset": f.offset, "tolerated": bool(f.tolerated), "error": bool(f.is_error)} for f in findings]


def page_model(data, kind: str, findings: Iterable = (), *, title: str = "", mode: str = "strict") -> dict:
    """The model the page draws: rows of the structure tree, descriptor templates, the
    kept bytes (hex, by range) and the findings (``audit`` findings of the same input).

    ``kind`` is one of ``descriptor``, ``stream``, ``messages``, ``file``."""
    if kind not in _ROWS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    view = as_view(data)
    size = len(view)
    model = _Model(view)
    _ROWS[kind](model)
    found = _finding_rows(findings)
    keep = list(model.keep)
    keep += [(f["offset"] - FINDING_CONTEXT, f["offset"] + FINDING_CONTEXT + 1)
             for f in found if f["offset"] is not None]
    template_spans = [(row[3], row[4]) for row in model.rows if row[0] == TEMPLATE]
    kept = _merged(keep, size)
    segments = [[start, bytes(view[start:end]).hex()] for start, end in _without(kept, template_spans)]
    return {
        "schema": PAGE_SCHEMA, "title": title, "kind": kind, "size": size, "mode": mode,
        "labels": model.labels, "metas": model.metas, "rows": model.rows, "templates": model.templates,
        "layouts": model.layouts,
        "segments": segments, "findings": found,
    }


def _without(kept: list[tuple[int, int]], spans: list[tuple[int, int]]) -> Iterable[tuple[int, int]]:
    """The merged ``kept`` ranges minus the (sorted, disjoint) template ``spans``."""
    spans = _merged(spans, max([e for _, e in kept] + [0]))
    j = 0
    for start, end in kept:
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        k, pos = j, start
        while k < len(spans) and spans[k][0] < end:
            if spans[k][0] > pos:
                yield pos, spans[k][0]
            pos = max(pos, spans[k][1])
            k += 1
        if pos < end:
            yield pos, end


def render_page(data, kind: str, findings: Iterable = (), *, title: str = "", mode: str = "strict") -> str:
    """The HTML page of ``data`` (read as ``kind``) and ``findings``: one document with its
    style and script inline, no external resource."""
    model = page_model(data, kind, findings, title=title, mode=mode)
    return _environment().get_template("page.html.j2").render(model=model, title=title or "Hurray bytes",
                                                               summary=_summary(model))


def _summary(model: dict) -> str:
    errors = sum(f["error"] for f in model["findings"])
    count = len(model["findings"])
    return f"{count} finding{'' if count == 1 else 's'} ({errors} MUST-level), {model['mode']} mode"


def write_page(path: str, data, kind: str, findings: Iterable = (), *, title: str = "", mode: str = "strict") -> int:
    """Write the page to ``path`` (a temporary file in the same folder, then renamed over
    it, so ``path`` is never left half written); returns its size in bytes."""
    text = render_page(data, kind, findings, title=title, mode=mode).encode("utf-8")
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".page-", suffix=".html", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return len(text)


_ENVIRONMENT = None


def _environment():
    """The jinja2 environment of the package's templates (autoescaped; compact JSON)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        import jinja2

        environment = jinja2.Environment(loader=jinja2.PackageLoader("hurray_schema", "templates"),
                                         autoescape=jinja2.select_autoescape(["html", "j2"]),
                                         trim_blocks=True, lstrip_blocks=True)
        environment.policies["json.dumps_kwargs"] = {"separators": (",", ":"), "ensure_ascii": False}
        _ENVIRONMENT = environment
    return _ENVIRONMENT

