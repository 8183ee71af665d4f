"""The annotated view of a stream, a message stream or a file.

:func:`annotate` reads its input as the kind it is told (or detects) and returns its nodes
in byte order.  Where each part of a stream or file sits comes from the located walks of
:mod:`hurray_schema.io.walk` and :mod:`hurray_schema.io.walk.kv` (fault policy ``ANNOTATE``);
this module turns each located part into nodes, field by field, each descriptor through
:func:`~hurray_schema.hexview.descriptor.annotate_descriptor`; the payload of a session
message is decoded with its table (:data:`~hurray_schema.structs.session.SESSION_TABLES`).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Optional

from ..docs import session_payloads
from ..errors import HurraySchemaError
from ..io.walk.kv import walk_kv
from ..io.file.walk import FILE_HEADER_PART, INDEX_PART, KV_PART, TENSOR_DATA, TRAILER_PART, walk_file, walk_index
from ..io.walk import (
    BUFFER, DATA, DATA_HEADER, DESCRIPTOR, ENTRY, ENTRY_START, FAULT, MESSAGE, MESSAGE_HEADER_PART, NAME, PAYLOAD,
    TABLE, TRANSPORT, VALUE, Faults, Part, Window, as_view, detect_kind, walk_bare, walk_descriptor, walk_messages,
)
from ..rules.engine import Mode
from ..structs import file as file_structs
from ..structs import stream as stream_structs
from .descriptor import annotate_descriptor
from .nodes import OPAQUE_KEEP, Node, _render, _Stop, _Walker
from .render import in_brief

__all__ = ["annotate", "session_payload_nodes"]


def annotate(data, kind: Optional[str] = None, *, brief: bool = False) -> list[Node]:
    """Annotate ``data`` (bytes-like) as ``kind`` (detected when ``None``).

    ``brief``: only the tree of sections -- the top-level ones, each tensor and message,
    data runs and errors (no field lines); the same nodes the full view has."""
    kind = kind or detect_kind(data)
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if kind == "file":
        nodes = _annotate_file(view, brief)
    elif kind == "stream":
        nodes = _annotate_bare_stream(view, brief)
    elif kind == "messages":
        nodes = _annotate_messages(view, brief)
    elif kind == "descriptor":
        nodes = _annotate_descriptor_input(view, brief)
    else:
        raise HurraySchemaError("not a Hurray descriptor, stream or file (no known magic at byte 0)")
    return [n for n in nodes if in_brief(n)] if brief else nodes


def _describer(nodes: list[Node], label, brief: bool):
    """The annotated view's descriptor step for a walk: each descriptor's field nodes go
    to ``nodes`` under the section ``label()`` names."""

    def describe(buf, base: int, depth: int) -> Part:
        _, desc, end = annotate_descriptor(buf, base=base, depth=depth, label=label(), nodes=nodes, brief=brief)
        return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)

    return describe


def _annotate_descriptor_input(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    list(walk_descriptor(view, _describer(nodes, lambda: "descriptor", brief)))
    return nodes


def _annotate_bare_stream(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    numbers = itertools.count()
    describe = _describer(nodes, lambda: f"tensor {next(numbers)}", brief)
    depth = 0
    for part in walk_bare(Window(view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        if part.kind == DESCRIPTOR:
            depth = part.depth
        elif part.kind == BUFFER:
            w.opaque(f"buffer {part.index} data", part.start, part.end - part.start, depth + 1,
                     ref="buffer-protocol.md § Buffer Handle")
        elif part.kind == FAULT:
            w.error(part.note, part.start, depth + 1)
    return nodes


def _annotate_messages(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    inner, section, complete = w, None, None
    describe = _describer(nodes, lambda: "descriptor", brief)
    payload_table = None  # the session table of the current message's payload, if it has one
    for part in walk_messages(Window(view), describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == MESSAGE:
            if complete is not None:
                w.close(section, complete)
            section = w.section(f"message {part.index}", part.start, part.start, 0, ref=stream_structs.FRAMING_REF)
            complete = part.end if part.end > part.start else None
            inner = w.sub(part.end)
            payload_table = _SESSION_PAYLOADS.get(part.value["message_type"]) if part.value else None
        elif kind == MESSAGE_HEADER_PART:
            w.table(stream_structs.MESSAGE_HEADER, part.start, 1)
        elif kind == FAULT and part.decl is not None:
            with contextlib.suppress(_Stop):
                w.table(stream_structs.MESSAGE_HEADER, part.start, 1)
        elif kind == FAULT:
            w.error(part.note, part.start, 1)
        elif kind == TRANSPORT:
            with contextlib.suppress(_Stop):
                inner.table(stream_structs.TENSOR_DESCRIPTOR_FIELDS, part.start, 1)
        elif kind == DATA_HEADER:
            with contextlib.suppress(_Stop):
                inner.table(stream_structs.TENSOR_DATA_HEADER, part.start, 1)
        elif kind == DATA:
            inner.opaque("data", part.start, part.end - part.start, 1, ref=stream_structs.DATA_REF)
        elif kind == PAYLOAD and payload_table is not None:
            _session_payload(inner, payload_table, part.start, part.end, 1)
        elif kind == PAYLOAD:
            inner.opaque("payload", part.start, part.end - part.start, 1, ref=stream_structs.FRAMING_REF)
    if complete is not None:
        w.close(section, complete)
    return nodes


_SESSION_PAYLOADS = {int(kind): (kind.name, decl) for kind, decl in session_payloads().items()}
"""``message_type`` → ``(name, table)`` of the session messages' payloads."""

_TRAILING_DOC = "Payload bytes after the table's fields (none in a valid message, but for a PING's and its PONG's)."


def session_payload_nodes(view, message_type: int, start: int, end: int, depth: int = 1) -> Optional[list[Node]]:
    """The nodes of the payload ``[start, end)`` of a message of ``message_type`` in ``view``
    (offsets of ``view``), as ``inspect`` shows it; ``None`` when it is no session message."""
    payload_table = _SESSION_PAYLOADS.get(message_type)
    if payload_table is None:
        return None
    nodes: list[Node] = []
    _session_payload(_Walker(as_view(view)[:end], 0, nodes), payload_table, start, end, depth)
    return nodes


def _session_payload(w: _Walker, payload_table: tuple, start: int, end: int, depth: int) -> None:
    """The payload ``[start, end)`` of a session message, field by field as its table
    (``(name, decl)``) declares it, then any bytes after the table; a payload the table does
    not fit stays opaque, with the reason."""
    name, decl = payload_table
    trial = w.trial(full_width=True)
    try:
        _, pos = trial.table(decl, start, depth)
    except _Stop:
        w.opaque("payload", start, end - start, depth, ref=stream_structs.FRAMING_REF)
        failed = next(n for n in reversed(trial.nodes) if n.kind == "error")
        w.error(f"the payload is not a {name} table: {failed.text}", failed.start - w.base, depth)
        return
    w.nodes.extend(trial.nodes)
    if pos < end:
        w.opaque("trailing", pos, end - pos, depth, doc=_TRAILING_DOC, ref=stream_structs.FRAMING_REF)


def _annotate_file(view: memoryview, brief: bool = False) -> list[Node]:
    nodes: list[Node] = []
    w = _Walker(view, 0, nodes, brief)
    size = len(view)
    label, desc = "", None

    def describe(buf, base: int, depth: int) -> Part:
        nonlocal desc
        _, desc, end = annotate_descriptor(buf, base=base, depth=depth, label=label, nodes=nodes, brief=brief)
        return Part(DESCRIPTOR, base, base + end, value=desc, depth=depth)

    for part in walk_file(view, describe, faults=Faults.ANNOTATE, mode=Mode.PERMISSIVE):
        kind = part.kind
        if kind == FILE_HEADER_PART or kind == FAULT and part.decl is not None:
            section = w.section("file header", 0, 0, 0, ref=file_structs.HEADER_REF)
            try:
                _, pos = w.table(file_structs.FILE_HEADER, 0, 1)
            except _Stop:
                return nodes
            w.close(section, pos)
        elif kind == FAULT:
            w.error(part.note, part.start, 0)
        elif kind == ENTRY:
            label = f"tensor {part.value.name!r}"
        elif kind == TENSOR_DATA:
            d0, dl = part.start, part.end - part.start
            end = min(size, d0 + dl) if d0 <= size else d0
            raw = bytes(view[d0 : min(end, d0 + OPAQUE_KEEP)]) if d0 < size else b""
            n_buf = len(desc.buffers)
            nodes.append(Node("opaque", part.depth + 1, "data", d0, max(end, d0), raw=raw,
                              text=f"{dl} bytes in {n_buf} buffer{'' if n_buf == 1 else 's'}",
                              ref="file-format.md § Data Buffer Placement"))
        elif kind == KV_PART:
            _walk_kv(w, part.start, part.end - part.start)
        elif kind == INDEX_PART:
            _walk_index(w, part.start, part.end - part.start)
        elif kind == TRAILER_PART:
            section = w.section("trailer", part.start, part.start, 0, ref=file_structs.TRAILER_REF)
            with contextlib.suppress(_Stop):
                _, end = w.table(file_structs.TRAILER, part.start, 1)
                w.close(section, end)
    return nodes


def _show_parts(w: _Walker, parts, fields: dict) -> None:
    """Nodes of the located parts of an index or KV section: each table field by field
    (one that does not fit ends with its error), named byte runs, an ``entry i`` section
    per entry (depth 1; the parts' own depth counts from 2).  ``fields`` gives the
    ``(doc, ref)`` of each named byte run."""
    entry = None
    for part in parts:
        depth = 2 + part.depth
        kind = part.kind
        if kind == TABLE or kind == FAULT and part.decl is not None:
            w.table(part.decl, part.start, depth)
        elif kind == FAULT:
            w.error(part.note, part.start, depth)
            raise _Stop
        elif kind == ENTRY_START:
            entry = w.section(f"entry {part.index}", part.start, part.start, 1)
        elif kind in (NAME, VALUE):
            label = part.note or "name"
            doc, ref = fields[label]
            if not w.quiet:
                w.nodes.append(Node("field", depth, label, part.start, part.end, raw=part.value, value=part.value,
                                    text=_render("key" if label in ("key", "value") else label, part.value),
                                    type=f"uint8[{part.end - part.start}]" if label != "name" else "uint8[name_length]",
                                    doc=doc, ref=ref))
        elif kind == ENTRY:
            w.close(entry, part.end)


_INDEX_FIELDS = {"name": ("UTF-8 tensor name.", "file-format.md § Index Encoding")}


def _walk_index(w: _Walker, off: int, n: int) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"index section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("index", off, off + n, 0, ref=file_structs.INDEX_REF)
    with contextlib.suppress(_Stop):
        _show_parts(w.sub(off + n, 0), walk_index(w.view[: off + n], off), _INDEX_FIELDS)
    w.close(sec, off + n)


_KV_FIELDS = {"key": ("UTF-8 key.", "file-format.md § KV Section Encoding"),
              "value": ("Value bytes.", file_structs.KV_TYPES_REF)}


def _walk_kv(w: _Walker, off: int, n: int) -> None:
    size = len(w.view)
    if off > size or n > size - off:
        w.error(f"KV section [{off}, {off + n}) lies outside the file", min(off, size), 0)
        return
    sec = w.section("kv metadata", off, off + n, 0, ref=file_structs.KV_REF)
    with contextlib.suppress(_Stop):
        _show_parts(w.sub(off + n, 0), walk_kv(w.view[off : off + n], off, faults=Faults.ANNOTATE), _KV_FIELDS)
    w.close(sec, off + n)
