"""The ``hurray-schema`` command line (also ``python -m hurray_schema``).

Commands:

* ``audit PATH|-`` -- run every applicable rule on a descriptor, a bare stream, a
  message stream or a ``.hrry`` file and print the findings grouped by tensor /
  composite, then a summary line.  Exit code 0: no MUST-level finding; 1: at least one
  MUST-level finding the mode does not tolerate; 2: the input cannot be read.
* ``inspect PATH`` -- annotated view of every field (byte range, raw bytes, decoded
  value, citation); ``--hex`` for the byte-table form.
* ``rules`` -- the rule registry (``--json``).
* ``docs OUTDIR`` -- write the Markdown format documentation generated from the
  declarations (``--check`` compares instead of writing).
* ``ksy OUTDIR`` -- write the Kaitai Struct schemas (``hurray_descriptor.ksy``,
  ``hurray_file.ksy``, ``hurray_stream.ksy``) generated from the declarations
  (``--check`` compares instead of writing).
* ``vectors OUTDIR`` -- write the conformance corpus: for every rule a passing and a
  violating input, and ``manifest.json`` (``--check`` compares instead of writing).
* ``merge PATH NAME -o OUT.npy`` -- materialize a composite (or tensor) of a file; with
  ``--memory BYTES`` a larger result is evaluated chunk by chunk through dask;
  ``--zarr STORE`` instead writes a Zarr store chunk by chunk (the ``[zarr]`` extra).
* ``convert SOURCE DESTINATION`` -- safetensors or GGUF into Hurray, Hurray into safetensors
  (:func:`hurray_schema.conversion.convert`), with a report per tensor (``--json``).

``audit --json`` prints one JSON object, schema ``hurray-schema/audit/1``
(see :data:`AUDIT_JSON_FIELDS`; keys are only ever added, never renamed or removed).
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import shutil
import stat
import sys
import tempfile
import textwrap
from typing import Any, Optional

import click

from . import __version__
from .errors import HurraySchemaError, SpecViolation
from .structs.tags import LayoutTag
from .io.source import is_url

__all__ = ["main", "AUDIT_JSON_SCHEMA", "AUDIT_JSON_FIELDS"]

EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2

AUDIT_JSON_SCHEMA = "hurray-schema/audit/1"
AUDIT_JSON_FIELDS = {
    "schema": "Always \"hurray-schema/audit/1\".",
    "input": "The PATH argument (\"-\" for standard input).",
    "kind": "What the input was read as: descriptor, stream, messages, file (or unknown).",
    "kind_source": "How kind was decided: \"option\" (--kind), \"content\" (the first bytes), \"extension\" (the "
                   "first bytes name no kind, the path's extension does: .hrry, .msgs, .stream, .desc) or "
                   "\"default\" (neither: read as a bare stream, kind \"unknown\"); null when the input could not "
                   "be opened.",
    "kind_reason": "One sentence saying why the input was read as it was (null when it could not be opened).",
    "mode": "\"strict\" or \"permissive\".",
    "ok": "true when no finding is a MUST-level error the mode does not tolerate.",
    "exit_code": "0 clean, 1 MUST-level findings, 2 unreadable input.",
    "summary": "Counts: findings, errors (MUST / MUST NOT, not tolerated), warnings (SHOULD), tolerated, tensors.",
    "groups": "Parts of the input in byte order: label, start, end (bytes, end exclusive), depth (composite "
              "nesting), text (element type, shape, layout), tensor (false for a file's header, kv metadata, "
              "index and trailer, and for the messages of a message stream).",
    "findings": "Each finding: rule_id, level, citation, message, offset (byte, or null), tolerated, "
                "error (bool), group (label of the tensor / composite holding the offset; \"input\" when the "
                "finding has no offset, \"outside any tensor\" when its offset is in no tensor's bytes).",
    "error": "Only when exit_code is 2: why the input could not be read.",
}
"""Keys of the ``audit --json`` object and their meaning (stable)."""

PROGRESS_THRESHOLD = 64 * 1024 * 1024
"""Inputs at least this large get a progress bar on stderr (when it is a terminal);
the environment variable ``HURRAY_SCHEMA_PROGRESS_BYTES`` overrides it."""


def _progress_threshold() -> int:
    try:
        return int(os.environ.get("HURRAY_SCHEMA_PROGRESS_BYTES", PROGRESS_THRESHOLD))
    except ValueError:
        return PROGRESS_THRESHOLD


# ------------------------------------------------------------------------------------
# Input
# ------------------------------------------------------------------------------------


class _Input:
    """The bytes of PATH or of standard input, memory-mapped: only what is looked at is
    read into memory.  Standard input that is not a regular file (a pipe) is first copied,
    in bounded chunks, to an unnamed temporary file."""

    def __init__(self, path: str):
        self.path = path
        self._file = None
        self._map = None
        if path == "-":
            self._file = _stdin_file()
        elif is_url(path):
            self._file = _downloaded(path)
        else:
            self._file = open(path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            self.data = memoryview(b"")
        else:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.data = memoryview(self._map)

    @property
    def size(self) -> int:
        return len(self.data)

    def close(self) -> None:
        self.data.release()
        if self._map is not None:
            self._map.close()
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> "_Input":
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(BufferError):
            self.close()


_STDIN_CHUNK = 8 * 1024 * 1024


def _downloaded(url: str):
    """The file at ``url`` (the ``[remote]`` extra) copied by byte range, in bounded chunks, to an
    unnamed temporary file: audit and inspect look at every byte."""
    from .io.source import RangeReader, open_source

    reader = RangeReader(open_source(url), cache_bytes=0)
    spool = tempfile.TemporaryFile()
    for start in range(0, reader.size, _STDIN_CHUNK):
        spool.write(reader.read(start, min(reader.size, start + _STDIN_CHUNK)))
    spool.flush()
    return spool


def _existing_or_url(ctx, param, value: str) -> str:
    """A merge input: a URL as it is, a path that exists."""
    if not is_url(value) and not os.path.exists(value):
        raise click.BadParameter(f"Path {value!r} does not exist.", ctx=ctx, param=param)
    return value


def _stdin_file():
    """Standard input as a file that can be memory-mapped from its start."""
    stdin = sys.stdin.buffer
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fileno = stdin.fileno()
        if stat.S_ISREG(os.fstat(fileno).st_mode) and os.lseek(fileno, 0, os.SEEK_CUR) == 0:
            return os.fdopen(os.dup(fileno), "rb")
    spool = tempfile.TemporaryFile()
    while True:
        chunk = stdin.read(_STDIN_CHUNK)
        if not chunk:
            break
        spool.write(chunk)
    spool.flush()
    return spool


def _fail(message: str, code: int = EXIT_UNREADABLE) -> None:
    click.echo(f"hurray-schema: {message}", err=True)
    sys.exit(code)


# ------------------------------------------------------------------------------------
# Group
# ------------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hurray-schema")
def main() -> None:
    """Audit, inspect and document Hurray tensors, streams and files."""


# ------------------------------------------------------------------------------------
# inspect
# ------------------------------------------------------------------------------------

KINDS = ("auto", "descriptor", "stream", "messages", "file")


@main.command()
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--hex", "as_hex", is_flag=True, help="Byte-table form: offset, hex bytes, field.")
@click.option("--kind", type=click.Choice(KINDS), default="auto", show_default=True,
              help="How to read the input (detected from its first bytes by default).")
@click.option("--no-citations", is_flag=True, help="Leave out the spec citation of each field.")
@click.option("--brief", is_flag=True, help="Only the tree of sections (no field lines).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write a self-contained HTML page (structure, hex view and the audit's findings) to this file.")
def inspect(path: str, as_hex: bool, kind: str, no_citations: bool, brief: bool, html_out: Optional[str]) -> None:
    """Annotated view of PATH: every field with byte range, raw bytes, value and citation.

    PATH is a single descriptor, a bare stream, a message stream or a .hrry file
    ("-" reads standard input; a URL, e.g. https://... or s3://..., is fetched first).  A file is shown as a tree: header, each tensor
    (composite members indented under their head), KV metadata, index, trailer.
    With --html, the page is written instead of the text.
    """
    from .hexview import annotate, detect_kind, render_hex, render_tree

    try:
        with _Input(path) as source:
            found = detect_kind(source.data) if kind == "auto" else kind
            if found == "unknown":
                _fail(f"{path}: not a Hurray descriptor, stream or file (no known magic at byte 0)")
            if html_out is not None:
                findings = _run_audit(path, source, found, "strict")
                written = _write_html(html_out, path, source, found, findings, "strict")
                click.echo(f"wrote {html_out}: {written} bytes")
                return
            nodes = annotate(source.data, found, brief=brief)
            size = source.size
    except OSError as exc:
        _fail(f"{path}: {exc.strerror or exc}")
    except HurraySchemaError as exc:
        _fail(f"{path}: {exc}")
    render = render_hex if as_hex else render_tree
    click.echo(f"{path}: {_KIND_NAMES.get(found, found)}, {size} bytes")
    click.echo(render(nodes, citations=not (no_citations or brief)))


_KIND_NAMES = {
    "descriptor": "tensor descriptor", "stream": "bare stream", "messages": "message stream", "file": "Hurray file",
}


def _write_html(out: str, path: str, source: "_Input", kind: str, findings: list, mode: str) -> int:
    """Write the HTML page of ``source`` (read as ``kind``) and its findings to ``out``."""
    from .htmlview import write_page

    title = f"{path}: {_KIND_NAMES.get(kind, kind)}, {source.size} bytes"
    return write_page(out, source.data, kind, findings, title=title, mode=mode)


# ------------------------------------------------------------------------------------
# rules
# ------------------------------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the registry as a JSON list.")
@click.option("--scope", default=None, help="Only rules of this scope (descriptor, composite.head, file, ...).")
def rules(as_json: bool, scope: Optional[str]) -> None:
    """The rule registry: id, level, citation and summary of every rule."""
    from .rules.engine import registry

    chosen = [r for r in registry() if scope is None or r.scope == scope]
    if as_json:
        click.echo(json.dumps([
            {"id": r.id, "level": r.level.value, "citation": r.citation, "summary": r.summary,
             "scope": r.scope, "permissive": r.permissive}
            for r in chosen
        ], indent=2, ensure_ascii=False))
        return
    idw = max([len(r.id) for r in chosen] + [4])
    levw = max([len(r.level.value) for r in chosen] + [5])
    width = max(60, _terminal_width())
    click.echo(f"{'RULE':<{idw}}  {'LEVEL':<{levw}}  CITATION")
    indent = " " * (idw + levw + 4)
    for r in chosen:
        click.echo(f"{r.id:<{idw}}  {r.level.value:<{levw}}  {r.citation}")
        for line in textwrap.wrap(r.summary, width=max(30, width - len(indent))):
            click.echo(indent + line)
    click.echo(f"{len(chosen)} rules")


def _terminal_width() -> int:
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return 100


# ------------------------------------------------------------------------------------
# docs
# ------------------------------------------------------------------------------------


def _render_into(outdir: str, check: bool, command: str, write, stale, what: str) -> None:
    """``command OUTDIR``: write a fresh render into OUTDIR, or (``--check``) exit 1 naming what differs."""
    if check:
        differing = stale(outdir)
        if differing:
            click.echo(f"{outdir}: out of date: {', '.join(differing)} (run `hurray-schema {command} {outdir}`)",
                       err=True)
            sys.exit(1)
        click.echo(f"{outdir}: up to date")
        return
    written = write(outdir)
    click.echo(f"wrote {len(written)} {what} to {outdir}")


@main.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help="Do not write; exit 1 if OUTDIR differs from a fresh render.")
def docs(outdir: str, check: bool) -> None:
    """Write the format documentation generated from the declarations into OUTDIR."""
    from .docs import check_docs, write_docs

    _render_into(outdir, check, "docs", write_docs, check_docs, "pages")


@main.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help="Do not write; exit 1 if OUTDIR differs from a fresh render.")
def ksy(outdir: str, check: bool) -> None:
    """Write the Kaitai Struct schemas (.ksy) generated from the declarations into OUTDIR."""
    from .ksy import check_ksy, write_ksy

    _render_into(outdir, check, "ksy", write_ksy, check_ksy, "schemas")


# ------------------------------------------------------------------------------------
# vectors
# ------------------------------------------------------------------------------------


@main.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help="Do not write; exit 1 if OUTDIR differs from a fresh generation.")
@click.option("--no-reference", is_flag=True, help="Leave pyhurray's verdicts out of the manifest.")
def vectors(outdir: str, check: bool, no_reference: bool) -> None:
    """Write the conformance corpus (a passing and a violating input per rule, manifest.json) into OUTDIR."""
    from .vectors import MANIFEST, check_corpus, write_corpus

    if check:
        stale = check_corpus(outdir, reference=not no_reference)
        if stale:
            shown = ", ".join(stale[:10]) + (f" (+{len(stale) - 10})" if len(stale) > 10 else "")
            click.echo(f"{outdir}: out of date: {shown} (run `hurray-schema vectors {outdir}`)", err=True)
            sys.exit(1)
        click.echo(f"{outdir}: up to date")
        return
    written = write_corpus(outdir, reference=not no_reference)
    click.echo(f"wrote {len(written) - 1} vectors and {MANIFEST} to {outdir}")


# ------------------------------------------------------------------------------------
# audit
# ------------------------------------------------------------------------------------


@main.command()
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--permissive", is_flag=True, help="Tolerate what the spec lets a permissive reader keep.")
@click.option("--json", "as_json", is_flag=True, help=f"One JSON object, schema {AUDIT_JSON_SCHEMA}.")
@click.option("--kind", type=click.Choice(KINDS), default="auto", show_default=True,
              help="How to read the input (by default from its first bytes; when they name no kind, from the "
                   "extension .hrry, .msgs, .stream or .desc; else as a bare stream).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML page (structure, hex view, findings marked) to this file.")
def audit(path: str, permissive: bool, as_json: bool, kind: str, html_out: Optional[str]) -> None:
    """Check PATH ("-" for standard input; a URL is fetched first) against every applicable rule.

    Prints each finding (level, rule id, byte offset, message, citation) under the
    tensor or composite it belongs to, then a summary line.  Exit code: 0 clean, 1 at
    least one MUST-level finding, 2 the input cannot be read.  --html also writes the
    findings on a page beside the structure and the bytes.
    """
    mode = "permissive" if permissive else "strict"
    result: dict[str, Any] = {"schema": AUDIT_JSON_SCHEMA, "input": path, "kind": "unknown", "kind_source": None,
                              "kind_reason": None, "mode": mode}
    try:
        with _Input(path) as source:
            choice = _kind_choice(path, source, kind)
            found = "unknown" if choice.source == "default" else choice.kind
            result.update(kind=found, kind_source=choice.source, kind_reason=choice.reason)
            findings = _run_audit(path, source, choice.kind, mode)
            groups = _groups(source.data, found)
            if html_out is not None:  # an input of no known kind is read as a stream, as the audit reads it
                _write_html(html_out, path, source, choice.kind, findings, mode)
    except OSError as exc:
        return _unreadable(result, f"{path}: {exc.strerror or exc}", as_json)
    except _Unreadable as exc:
        return _unreadable(result, str(exc), as_json)
    except HurraySchemaError as exc:
        return _unreadable(result, f"{path}: {exc}", as_json)

    rows = []
    for f in findings:
        group = _group_of(groups, f.offset)
        rows.append({
            "rule_id": f.rule_id, "level": _level(f), "citation": f.citation, "message": f.message,
            "offset": f.offset, "tolerated": f.tolerated, "error": f.is_error,
            "group": group["label"] if group else ("input" if f.offset is None else "outside any tensor"),
        })
    errors = sum(r["error"] for r in rows)
    tolerated = sum(r["tolerated"] for r in rows)
    code = EXIT_FINDINGS if errors else EXIT_OK
    result.update(
        ok=not errors, exit_code=code,
        summary={"findings": len(rows), "errors": errors, "warnings": len(rows) - errors - tolerated,
                 "tolerated": tolerated, "tensors": sum(g["tensor"] for g in groups)},
        groups=[{k: g[k] for k in ("label", "start", "end", "depth", "text", "tensor")} for g in groups],
        findings=rows,
    )
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        click.echo(_audit_text(result))
    sys.exit(code)


class _Unreadable(Exception):
    pass


def _unreadable(result: dict, message: str, as_json: bool) -> None:
    result.update(ok=False, exit_code=EXIT_UNREADABLE, error=message,
                  summary={"findings": 0, "errors": 0, "warnings": 0, "tolerated": 0, "tensors": 0},
                  groups=[], findings=[])
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    click.echo(f"hurray-schema: {message}", err=True)
    sys.exit(EXIT_UNREADABLE)


def _level(f) -> str:
    return f.level.value


def _is_error(f) -> bool:
    return f.is_error


def _kind_choice(path: str, source: _Input, kind: str):
    """How ``audit`` reads PATH: as ``--kind`` says, else as its first bytes say, else as its
    extension says, else as a bare stream (:func:`hurray_schema.io.walk.choose_kind`)."""
    from .io.walk import KindChoice, choose_kind

    if kind != "auto":
        return KindChoice(kind, "option", f"--kind {kind} was given")
    return choose_kind(source.data, None if path == "-" else path)


def _run_audit(path: str, source: _Input, kind: str, mode: str) -> list:
    """Findings of :func:`hurray_schema.audit.audit` (with a progress bar for large inputs)."""
    from .audit import KINDS
    from .audit import audit as run_audit

    if kind not in KINDS:  # unrecognised first bytes: audit() decides how to read them (its magic rule fires)
        kind = "auto"
    with _progress(source.size) as tick:
        report = run_audit(source.data if path == "-" or is_url(path) else path, mode=mode, kind=kind,
                           progress=tick)
    return list(report.findings)


@contextlib.contextmanager
def _progress(size: int):
    """A ``tick(done_bytes[, total])`` callback drawing a bar on stderr, or ``None``."""
    if size < _progress_threshold() or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=size, label="auditing", file=sys.stderr, show_pos=False) as bar:
        state = {"done": 0}

        def tick(done: int, total: Optional[int] = None) -> None:
            step = max(0, min(size, int(done)) - state["done"])
            if step:
                bar.update(step)
                state["done"] += step

        yield tick
        tick(size)


def _groups(data, kind: str) -> list[dict]:
    """Tensors and composites of the input with their byte spans, in byte order, from the
    located walk of its kind (``data_end``: where the tensor's data buffers end, for
    offsets inside the data); for a file also its header, KV metadata, index and trailer,
    for a message stream each message.  Spans are those of the annotated view."""
    from .io import walk as located

    view = located.as_view(data)
    builders = {"descriptor": _descriptor_groups, "stream": _stream_groups, "messages": _message_groups,
                "file": _file_groups}
    build = builders.get(kind)
    return build(view, located) if build is not None else []


def _tensor_group(label: str, desc, start: int, end: int, depth: int) -> dict:
    from .hexview import descriptor_text

    if desc is not None and desc.is_composite_head:
        label = label.replace("tensor", "composite", 1)
    return {"label": label, "start": start, "end": end, "depth": depth, "text": descriptor_text(desc),
            "data_end": end, "tensor": True}


def _section_group(label: str, start: int, end: int) -> dict:
    return {"label": label, "start": start, "end": end, "depth": 0, "text": "", "data_end": end, "tensor": False}


def _peek(buf, base: int, depth: int):
    """The walk's descriptor step for grouping: the permissive decode and the extent the
    annotated view gives the descriptor."""
    from .hexview import descriptor_extent, peek_descriptor
    from .io.walk import Part

    view = memoryview(buf)
    desc, _ = peek_descriptor(view, base)
    return Part("descriptor", base, base + descriptor_extent(view), value=desc, depth=depth)


def _descriptor_groups(view, located) -> list[dict]:
    return [_tensor_group("descriptor", part.value, part.start, part.end, 0)
            for part in located.walk_descriptor(view, _peek)]


def _stream_groups(view, located) -> list[dict]:
    groups: list[dict] = []
    for part in located.walk_bare(located.Window(view), _peek, faults=located.Faults.ANNOTATE,
                                  mode=_permissive()):
        if part.kind == located.DESCRIPTOR:
            groups.append(_tensor_group(f"tensor {len(groups)}", part.value, part.start, part.end, part.depth))
        elif part.kind == located.BUFFER:
            groups[-1]["data_end"] = max(groups[-1]["data_end"], part.end)
    return groups


def _message_groups(view, located) -> list[dict]:
    groups: list[dict] = []
    for part in located.walk_messages(located.Window(view), _peek, faults=located.Faults.ANNOTATE,
                                      mode=_permissive()):
        if part.kind == located.MESSAGE:
            groups.append(_section_group(f"message {part.index}", part.start, part.end))
        elif part.kind == located.DESCRIPTOR:
            groups.append(_tensor_group(f"tensor @{part.start}", part.value, part.start, part.end, part.depth))
    return groups


def _file_groups(view, located) -> list[dict]:
    groups: list[dict] = []
    size, name, tensor = len(view), "", None
    sections = {located.KV_PART: "kv metadata", located.INDEX_PART: "index"}
    for part in located.walk_file(view, _peek, faults=located.Faults.ANNOTATE, mode=_permissive()):
        kind = part.kind
        if kind == located.FILE_HEADER_PART or kind == located.FAULT and part.decl is not None:
            groups.append(_section_group("file header", 0, part.end))
        elif kind == located.ENTRY:
            name = part.value.name
        elif kind == located.DESCRIPTOR:
            tensor = _tensor_group(f"tensor {name!r}", part.value, part.start, part.end, part.depth)
            groups.append(tensor)
        elif kind == located.TENSOR_DATA:
            start = part.start
            end = min(size, part.end) if start <= size else start
            tensor["data_end"] = max(tensor["data_end"], end, start)
        elif kind in sections:
            if part.start <= size and part.end - part.start <= size - part.start:  # else the view shows an error
                groups.append(_section_group(sections[kind], part.start, part.end))
        elif kind == located.TRAILER_PART:
            groups.append(_section_group("trailer", part.start, part.end))
    return groups


def _permissive():
    from .rules.engine import Mode

    return Mode.PERMISSIVE


def _group_of(groups: list[dict], offset: Optional[int]) -> Optional[dict]:
    """The innermost tensor / composite whose descriptor holds ``offset``, else the tensor
    whose data region holds it (an offset at the very end counts as inside)."""
    if offset is None:
        return None
    best = None
    for g in groups:
        if g["start"] <= offset < g["end"] and (best is None or g["depth"] >= best["depth"]):
            best = g
    if best is None:
        for g in groups:
            if g["start"] <= offset <= g["data_end"]:
                best = g
    return best


def _audit_text(result: dict) -> str:
    lines = [f"audit of {result['input']} ({_KIND_NAMES.get(result['kind'], result['kind'])}, {result['mode']})"]
    if result["kind_source"] in ("extension", "default"):  # the first bytes did not say: say what was assumed
        lines.append(f"kind assumed: {result['kind_reason']}")
    by_group: dict[str, list[dict]] = {}
    for row in result["findings"]:
        by_group.setdefault(row["group"], []).append(row)
    described = {g["label"]: g for g in result["groups"]}
    order = [g["label"] for g in result["groups"] if g["label"] in by_group]
    order += [label for label in by_group if label not in order]
    for label in order:
        g = described.get(label)
        if g:
            where = f" @{g['start']}-{g['end'] - 1}  {g.get('text', '')}".rstrip()
        else:
            where = " (no byte offset)" if label == "input" else ""
        depth = g["depth"] if g else 0
        lines.append("")
        lines.append(f"{'  ' * depth}{label}{where}")
        for row in by_group[label]:
            pad = "  " * (depth + 1)
            at = f" at byte {row['offset']}" if row["offset"] is not None else ""
            kept = f" [tolerated: {result['mode']}]" if row["tolerated"] else ""
            lines.append(f"{pad}{row['level']:<9} {row['rule_id']}{at}: {row['message']}{kept}")
            lines.append(f"{pad}{'':<9} ↳ {row['citation']}")
    s = result["summary"]
    verdict = "FAIL" if result["exit_code"] else "OK"
    lines.append("")
    lines.append(
        f"{verdict}: {s['findings']} finding{'s' if s['findings'] != 1 else ''} "
        f"({s['errors']} MUST-level, {s['warnings']} warning{'s' if s['warnings'] != 1 else ''}, "
        f"{s['tolerated']} tolerated) in {s['tensors']} tensor{'s' if s['tensors'] != 1 else ''}"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------
# merge
# ------------------------------------------------------------------------------------


_BYTE_UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30,
               "T": 2**40, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


class _Bytes(click.ParamType):
    """A byte count: an integer with an optional unit (K, M, G, T or KiB ... powers of 1024;
    KB, MB, GB, TB powers of 1000)."""

    name = "BYTES"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip()
        digits = len(text) - len(text.lstrip("0123456789"))
        unit = _BYTE_UNITS.get(text[digits:].strip().upper())
        if not digits or unit is None or int(text[:digits]) * unit < 1:
            self.fail(f"{value!r} is not a positive byte count (e.g. 1073741824, 512M, 1GiB)", param, ctx)
        return int(text[:digits]) * unit


ZARR_DTYPE_ATTRIBUTE = "hurray_schema_dtype"
"""``merge --zarr`` stores a type Zarr has no data type for (NumPy's extension types: bfloat16, the
float8 types) as its bits, in unsigned integers of its width, and names the type in this attribute
of the array; ``zarr.open_array(STORE)[...].view(ml_dtypes.bfloat16)`` gives the values back."""


@main.command()
@click.argument("path", type=click.Path(dir_okay=False), callback=_existing_or_url)
@click.argument("name")
@click.option("-o", "--output", "output", default=None, type=click.Path(dir_okay=False),
              help="Where to write the .npy file.")
@click.option("--zarr", "zarr_store", default=None, type=click.Path(file_okay=False),
              help="Write a Zarr store (a folder) instead of a .npy file, chunk by chunk with dask (the [zarr] "
                   "extra), with a progress bar; a type Zarr has no data type for (bfloat16) is stored as its bits "
                   f"(unsigned integers of its width) with the array attribute {ZARR_DTYPE_ATTRIBUTE!r} naming it.")
@click.option("--permissive", is_flag=True, help="Read the file in permissive mode.")
@click.option("--memory", "memory", type=_Bytes(), default=None,
              help="Memory budget (e.g. 1G): a larger result is evaluated chunk by chunk with dask (the [dask] "
                   "extra) and written to OUTPUT as the chunks complete, with a progress bar; with --zarr, the "
                   "chunks' size (default: about 64 MiB).")
def merge(path: str, name: str, output: Optional[str], zarr_store: Optional[str], permissive: bool,
          memory: Optional[int]) -> None:
    """Materialize tensor or composite NAME of the file PATH into OUTPUT (.npy) or a Zarr STORE.

    PATH may be a URL (https://..., s3://...; the [remote] extra): it is read by byte range, only
    the ranges NAME needs."""
    import numpy as np

    from .io import read_file

    if (output is None) == (zarr_store is None):
        raise click.UsageError("give exactly one of -o/--output and --zarr")
    try:
        container = read_file(path, mode="permissive" if permissive else "strict")
        item = _lookup(container, name)
        if zarr_store is not None:
            _result_bytes(item)  # a group has no single array: refused
            dtype, shape = _merge_to_zarr(container, name, zarr_store, memory)
            click.echo(f"wrote {zarr_store}: {dtype} {list(shape)}")
            return
        if memory is not None and _result_bytes(item) > memory:
            dtype, shape = _merge_out_of_core(container, item, name, output, memory)
            click.echo(f"wrote {output}: {dtype} {list(shape)}")
            return
        array = _materialize(item)
    except SpecViolation as exc:
        _fail(f"{path}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError) as exc:
        _fail(f"{path}: {exc}")
    except KeyError:
        _fail(f"{path}: no tensor or composite named {name!r}")
    np.save(output, array)
    click.echo(f"wrote {output}: {array.dtype} {list(array.shape)}")


def _refuse_group(item) -> None:
    names = [m.name or f"#{i}" for i, m in enumerate(item.members)]
    raise HurraySchemaError(
        f"{item.name or 'this'!r} is a group composite (no single array); merge one of its "
        f"members instead: {', '.join(names)}")


def _result_bytes(item) -> int:
    """Bytes of the array ``merge`` writes for ``item`` (a group has none: refused)."""
    from .evaluate import decoded_type, numpy_dtype
    from .model import CompositionRule

    desc = item.descriptor
    if getattr(item, "members", None) is not None and desc.layout.composition_rule == CompositionRule.GROUP:
        _refuse_group(item)
    return math.prod(int(n) for n in desc.shape) * numpy_dtype(decoded_type(desc)).itemsize


MERGE_CHUNKS_PER_BUDGET = 8
"""``merge --memory`` aims its chunks at this fraction of the budget: a few chunks per worker
thread in flight, each with the temporaries of its decode."""


def _merge_out_of_core(container, item, name: str, output: str, memory: int):
    """Evaluate ``item`` through dask in chunks of about ``memory / MERGE_CHUNKS_PER_BUDGET``
    bytes and write them into a temporary ``.npy`` beside OUTPUT, renamed over it once complete;
    (dtype, shape) of what was written."""
    try:
        from dask.diagnostics import ProgressBar
        import dask.array as da
    except ImportError:
        raise HurraySchemaError("merge --memory needs dask: pip install 'hurray_schema[dask]'") from None
    lazy = container.to_dask(name, chunk_bytes=max(1, memory // MERGE_CHUNKS_PER_BUDGET))
    target = os.path.realpath(output)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                dir=os.path.dirname(target))
    os.close(fd)
    try:
        with _NpyChunkWriter(temp, lazy.shape, lazy.dtype) as writer:
            with ProgressBar(out=sys.stderr):
                da.store(lazy, writer, lock=False)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return lazy.dtype, lazy.shape


def _zarr_modules():
    """(dask's ProgressBar, zarr), or a typed error naming the extra that installs them."""
    try:
        from dask.diagnostics import ProgressBar
    except ImportError:
        raise HurraySchemaError("merge --zarr needs dask: pip install 'hurray_schema[zarr]'") from None
    try:
        import zarr
    except ImportError:
        raise HurraySchemaError("merge --zarr needs zarr: pip install 'hurray_schema[zarr]'") from None
    return ProgressBar, zarr


def _zarr_storable(lazy):
    """(``lazy`` as Zarr can hold it, the attributes saying how): a NumPy extension type (bfloat16,
    float8 ...: ``dtype.isbuiltin != 1``) viewed as unsigned integers of its width."""
    import numpy as np

    if lazy.dtype.isbuiltin == 1:
        return lazy, {}
    bits = np.dtype(f"<u{lazy.dtype.itemsize}")
    return lazy.view(bits), {ZARR_DTYPE_ATTRIBUTE: lazy.dtype.name}


def _is_zarr_store(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, marker)) for marker in ("zarr.json", ".zarray", ".zgroup"))


def _merge_to_zarr(container, name: str, store: str, memory: Optional[int]):
    """Evaluate ``name`` through dask into a Zarr store at ``store``: a regular grid of chunks of about
    ``memory / MERGE_CHUNKS_PER_BUDGET`` bytes (without ``memory``: the default chunk size), written
    by dask's ``to_zarr`` into a temporary folder beside ``store`` that then takes its place (an
    existing Zarr store there is replaced; anything else is refused); (dtype, shape) of the array."""
    ProgressBar, zarr = _zarr_modules()
    from .evaluate.dask_graph import DEFAULT_CHUNK_BYTES, slab_chunks

    target = os.path.realpath(store)
    if os.path.exists(target) and not (os.path.isdir(target) and _is_zarr_store(target)):
        raise HurraySchemaError(f"{store} exists and is not a Zarr store: not replaced")
    chunk_bytes = max(1, memory // MERGE_CHUNKS_PER_BUDGET) if memory is not None else DEFAULT_CHUNK_BYTES
    lazy = container.to_dask(name, chunk_bytes=chunk_bytes)
    storable, attributes = _zarr_storable(lazy)
    if 0 not in storable.shape:
        storable = storable.rechunk(slab_chunks(storable.shape, storable.dtype.itemsize, chunk_bytes))
    temp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=os.path.dirname(target))
    try:
        with ProgressBar(out=sys.stderr):
            storable.to_zarr(temp, overwrite=True)
        if attributes:
            zarr.open_array(temp, mode="r+").attrs.update(attributes)
        _replace_folder(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return lazy.dtype, lazy.shape


def _replace_folder(new: str, target: str) -> None:
    """``new`` renamed to ``target``; a ``target`` already there is moved aside first and removed only
    once ``new`` is in its place (put back if the rename fails)."""
    if not os.path.exists(target):
        os.rename(new, target)
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".old", dir=os.path.dirname(target))
    old = os.path.join(aside, "store")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        os.rmdir(aside)
        raise
    shutil.rmtree(aside)


class _NpyChunkWriter:
    """A ``.npy`` file written region by region (the target of ``dask.array.store``): numpy
    writes the header and sizes the file, each region's bytes go in with ``os.pwrite``, one
    call per C-contiguous run, without mapping the output (its pages stay out of our memory)."""

    def __init__(self, path: str, shape, dtype):
        from numpy.lib.format import open_memmap

        header = open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
        self.offset, self.shape, self.dtype = header.offset, tuple(shape), header.dtype
        del header
        self.fd = os.open(path, os.O_WRONLY)

    def __setitem__(self, region, values) -> None:
        import numpy as np

        values = np.ascontiguousarray(values, self.dtype)
        if values.size == 0:
            return
        if not self.shape:
            os.pwrite(self.fd, values.reshape(1).view(np.uint8), self.offset)
            return
        starts = [s.indices(n)[0] for s, n in zip(region, self.shape)]
        split = len(self.shape) - 1  # dimensions after `split` are whole: one run per index before it
        while split > 0 and values.shape[split] == self.shape[split]:
            split -= 1
        tail = math.prod(self.shape[split + 1:])
        runs = values.reshape(math.prod(values.shape[:split]), -1).view(np.uint8)
        for k, lead in enumerate(np.ndindex(*values.shape[:split])):
            first = 0
            for dim, i in enumerate(lead):
                first = first * self.shape[dim] + starts[dim] + i
            first = (first * self.shape[split] + starts[split]) * tail
            os.pwrite(self.fd, runs[k], self.offset + first * self.dtype.itemsize)

    def __enter__(self) -> "_NpyChunkWriter":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def _lookup(container, name: str):
    """A top-level item of the file by name, else any index entry (a member) as a tensor."""
    try:
        return container[name]
    except KeyError:
        pass
    tensor = getattr(container, "tensor", None)
    if tensor is not None:
        try:
            return tensor(name)
        except KeyError:
            pass
    raise KeyError(name)


def _materialize(item):
    """The logical array of a tensor or composite; a group has no single array."""
    import numpy as np

    from .io import Composite

    result = item.materialize() if isinstance(item, Composite) else item.to_numpy()
    if isinstance(result, tuple):
        _refuse_group(item)
    return np.asarray(result)


# ------------------------------------------------------------------------------------
# convert
# ------------------------------------------------------------------------------------


@main.command()
@click.argument("source", type=click.Path(dir_okay=False, exists=True))
@click.argument("destination", type=click.Path(dir_okay=False))
@click.option("--to", "to", type=click.Choice(["hurray", "safetensors"]), default=None,
              help="Output format (default: from DESTINATION's extension, .safetensors or else Hurray).")
@click.option("--dequantize", is_flag=True,
              help="Store GGUF tensors that have no exact Hurray form (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, IQ2/IQ3/IQ1 "
                   "...) decoded, as float32 (exact).")
@click.option("--requantize", metavar="SCHEME[:storage]", default=None,
              help="Quantize those tensors again instead (per_block, per_channel, per_tensor, nf4, mxfp).")
@click.option("--quantize", metavar="SCHEME[:storage]", default=None,
              help="Quantize 2-D float weights on the way in (embeddings, norms and biases kept unless --select).")
@click.option("--spqr", type=float, default=None, metavar="OUTLIERS",
              help="SpQR overlay (4-bit base, this fraction of outliers) of 2-D float weights on the way in.")
@click.option("--partition", metavar="GRID", default=None,
              help="Split those weights into a grid of members, e.g. 2x2 (each quantized / SpQR'd if asked).")
@click.option("--select", "select", multiple=True, metavar="GLOB",
              help="Tensors --quantize / --spqr / --partition apply to (repeatable; default: 2-D float weights).")
@click.option("--verify", is_flag=True, help="Decode every output tensor and measure it against the input's values.")
@click.option("--memory", "memory", type=_Bytes(), default=None,
              help="Converted bytes held in memory before the rest waits in a temporary file (default 1G).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def convert(source: str, destination: str, to: Optional[str], dequantize: bool, requantize: Optional[str],
            quantize: Optional[str], spqr: Optional[float], partition: Optional[str], select: tuple,
            verify: bool, memory: Optional[int], as_json: bool) -> None:
    """Convert SOURCE (safetensors, GGUF or Hurray) into DESTINATION (Hurray, or safetensors from Hurray).

    Prints a report per tensor: name, type in and out, bytes in and out, max absolute error and
    relative Frobenius error of the decoded values against the input's.  DESTINATION is replaced
    only once complete; on error nothing is written (exit code 2)."""
    from .conversion import DEFAULT_MEMORY, convert as run

    with _convert_progress(source) as progress:
        try:
            report = run(source, destination, to=to, dequantize=dequantize, requantize=requantize,
                         quantize=quantize, spqr=spqr, partition=partition, select=select, verify=verify,
                         memory=DEFAULT_MEMORY if memory is None else memory, progress=progress)
        except (HurraySchemaError, OSError) as exc:
            _fail(f"{source}: {exc}" if str(source) not in str(exc) else str(exc))
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.text())


@contextlib.contextmanager
def _convert_progress(source: str):
    """A progress callback drawing click's bar on stderr for a large input on a terminal, else None."""
    if os.path.getsize(source) < _progress_threshold() or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=os.path.getsize(source), label="converting", file=sys.stderr) as bar:
        state = {"done": 0}

        def advance(done: int, total: int) -> None:
            bar.length = max(total, 1)
            bar.update(done - state["done"])
            state["done"] = done

        yield advance


# --------------------------------------------------------------------------------------
# The transport: serve, get, put (hurray_schema.net)
# --------------------------------------------------------------------------------------


def _tls_options(f):
    f = click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="This side's private key (PEM), unless the certificate file holds it.")(f)
    f = click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="This side's certificate chain (PEM).")(f)
    return f


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="TCP port; 0 picks a free one (the default, unless --unix is given alone).")
@click.option("--unix", "unix", type=click.Path(dir_okay=False), default=None,
              help="Also (or, without --port, only) listen on a Unix socket at this path: same machine, tensors "
                   "handed over as shared memory; removed on exit.")
@click.option("--unix-mode", default="600", show_default=True,
              help="Permission bits of the Unix socket file, in octal (600: this user only).")
@click.option("--memory-store", is_flag=True,
              help="Accept TENSOR_PUT into memory: each tensor in one sealed memory file that every client maps.")
@click.option("--writable", type=click.Path(file_okay=False), default=None,
              help="Accept TENSOR_PUT: validated strictly, stored atomically in this folder, then served.")
@click.option("--max-message-bytes", type=_Bytes(), default=None, help="Largest payload accepted (default 64M).")
@click.option("--transcode-limit", type=_Bytes(), default=None,
              help="Largest buffer transcoding may produce (default 256M); past it the stored layout is served.")
@click.option("--idle-timeout", type=float, default=None, help="Seconds a connection may stay silent (default 60).")
@click.option("--max-connections", type=click.IntRange(1), default=None, help="Connections at once (default 64).")
@click.option("--max-put-bytes", type=_Bytes(), default=None, help="Largest tensor a PUT may push (default 4G).")
@click.option("--record", type=click.Path(file_okay=False), default=None,
              help="Write each connection's two directions as message streams into this folder (audit reads them).")
@click.option("--device", "devices", multiple=True, default=("cpu",), show_default=True,
              help="Advertised device (repeat); only CPU is ever available here.")
@_tls_options
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Mutual TLS: refuse clients without a certificate signed by this CA.")
def serve(files, host, port, unix, unix_mode, memory_store, writable, max_message_bytes, transcode_limit, idle_timeout,
          max_connections, max_put_bytes, record, devices, tls_cert, tls_key, tls_client_ca) -> None:
    """Serve the top-level items of FILES by name (interchange.md, over TCP, TLS or a Unix socket).

    The first line printed is `serving hurray://HOST:PORT` (hurrays:// with TLS), then
    `serving hurray+unix://PATH` for --unix; SIGTERM or SIGINT stops the server cleanly."""
    import signal

    from .net import serve as start

    try:
        mode = int(unix_mode, 8)
    except ValueError:
        raise click.BadParameter(f"{unix_mode!r} is not an octal permission", param_hint="--unix-mode") from None
    try:
        server = start(list(files), host=host, port=port, unix=unix, unix_mode=mode, memory_store=memory_store,
                       writable=writable, max_message_bytes=max_message_bytes,
                       transcode_limit=transcode_limit, idle_timeout=idle_timeout, max_connections=max_connections,
                       max_put_bytes=max_put_bytes, record=record, devices=devices, tls_cert=tls_cert,
                       tls_key=tls_key, tls_client_ca=tls_client_ca)
    except (HurraySchemaError, OSError) as exc:
        _fail(str(exc))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.request_stop())
    for url in server.urls:
        click.echo(f"serving {url}")
    sys.stdout.flush()
    try:
        while not server.wait(0.5):
            pass
    finally:
        server.close()
    click.echo("stopped", err=True)


def _session_options(f):
    f = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="CA certificate (PEM) that signs the server's certificate (hurrays://).")(f)
    f = click.option("--timeout", type=float, default=30.0, show_default=True,
                     help="Seconds the server may stay silent.")(f)
    return _tls_options(f)


def _connect(url: str, timeout: float, tls_ca, tls_cert, tls_key):
    from .net import connect

    return connect(url, timeout=timeout, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)


@main.command()
@click.argument("url")
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the .npy file.")
@click.option("--parallel", is_flag=True, help="Let the server send shards on several streams.")
@click.option("--layout", "layouts", multiple=True, type=click.Choice([t.name.lower() for t in LayoutTag]),
              help="Preferred layout (repeat, most preferred first); the server may transcode to it.")
@_session_options
def get(url, key, output, parallel, layouts, timeout, tls_ca, tls_cert, tls_key) -> None:
    """Request KEY from the server at URL and write its array to OUTPUT (.npy); a composite is merged."""
    import numpy as np

    tags = [LayoutTag[name.upper()] for name in layouts]
    try:
        with _connect(url, timeout, tls_ca, tls_cert, tls_key) as session:
            item = session.get(key, layouts=tags, parallel=parallel)
        array = _materialize(item)
    except SpecViolation as exc:
        _fail(f"{url}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError) as exc:
        _fail(f"{url}: {exc}")
    np.save(output, array)
    click.echo(f"wrote {output}: {array.dtype} {list(array.shape)}")


@main.command()
@click.argument("url")
@click.argument("key")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--name", default=None, help="The item of a .hrry FILE to push (default: its only top-level item).")
@_session_options
def put(url, key, file, name, timeout, tls_ca, tls_cert, tls_key) -> None:
    """Push FILE (a .npy array, or an item of a .hrry file) to the server at URL under KEY."""
    try:
        item, description = _put_item(file, name)
        with _connect(url, timeout, tls_ca, tls_cert, tls_key) as session:
            session.put(key, item)
    except SpecViolation as exc:
        _fail(f"{url}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError, ValueError) as exc:
        _fail(f"{url}: {exc}")
    click.echo(f"put {key}: {description}")


def _put_item(path: str, name: Optional[str]):
    """The item a ``put`` pushes, and how to describe it."""
    from .io import read_file

    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x93NUMPY"):
        import numpy as np

        array = np.load(path, allow_pickle=False)
        return array, f"{array.dtype} {list(array.shape)}"
    container = read_file(path)
    if name is None:
        if len(container) != 1:
            raise HurraySchemaError(f"{path} holds {len(container)} items; choose one with --name")
        (name,) = container.keys()
    item = _lookup(container, name)
    return item, f"{name!r} of {path}"


if __name__ == "__main__":  # pragma: no cover
    main()
