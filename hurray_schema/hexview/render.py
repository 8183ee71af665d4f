"""The annotated view as text: the indented tree of ``hurray-schema inspect``
(:func:`render_tree`), the byte table of ``--hex`` (:func:`render_hex`), and which nodes the
brief view keeps (:func:`in_brief`)."""

from __future__ import annotations

import math
from typing import Iterable

from .nodes import Node

__all__ = ["in_brief", "render_hex", "render_tree"]


def in_brief(node: Node) -> bool:
    """Whether the brief view keeps ``node``: errors, data runs, top-level sections,
    tensors and messages."""
    return (node.kind == "error" or node.kind == "opaque" and node.label.endswith("data")
            or node.kind == "section" and (node.depth == 0 or node.label.startswith(("tensor", "message"))))


def _range(node: Node) -> str:
    if node.end <= node.start:
        return f"{node.start}"
    if node.end - node.start == 1:
        return f"{node.start}"
    return f"{node.start}-{node.end - 1}"


def _hexbytes(raw: bytes, total: int, limit: int = 8) -> str:
    text = raw[:limit].hex(" ")
    if total > limit:
        text += f" …(+{total - limit})"
    return text


def _shared_refs(nodes: list[Node]) -> dict[int, str]:
    """Section index → the citation of a section: its own, else the one most of its direct
    fields share (printed once, on the section line, and left off those fields).

    One pass: a field or opaque run counts for the innermost open section one level up."""
    shared: dict[int, str] = {}
    open_sections: list[tuple[int, int, dict[str, int]]] = []  # (depth, index, ref counts)
    for i, n in enumerate(nodes):
        while open_sections and open_sections[-1][0] >= n.depth:
            _settle_ref(shared, open_sections.pop())
        if n.kind == "section":
            if n.ref:
                shared[i] = n.ref
            open_sections.append((n.depth, i, {} if not n.ref else None))
            continue
        if open_sections and open_sections[-1][0] == n.depth - 1 and n.kind in ("field", "opaque") and n.ref:
            refs = open_sections[-1][2]
            if refs is not None:
                refs[n.ref] = refs.get(n.ref, 0) + 1
    while open_sections:
        _settle_ref(shared, open_sections.pop())
    return shared


def _settle_ref(shared: dict[int, str], section: tuple) -> None:
    _depth, index, refs = section
    if refs:
        shared[index] = max(refs, key=lambda r: refs[r])


def render_tree(nodes: Iterable[Node], *, citations: bool = True) -> str:
    """Indented tree: each section with its byte range, then per field
    ``range  raw bytes  name = value  type  · citation`` (a citation every field of a
    section shares is printed once, on the section line)."""
    nodes = list(nodes)
    shared = _shared_refs(nodes) if citations else {}
    fieldw = max([len(n.label) + 2 * n.depth for n in nodes if n.kind != "section"] + [10])
    rangew = max([len(_range(n)) for n in nodes if n.kind in ("field", "opaque")] + [9]) + 2
    lines = []
    parents: list[tuple[int, str]] = []  # (depth, shared citation) of the enclosing sections
    for i, n in enumerate(nodes):
        while parents and parents[-1][0] >= n.depth:
            parents.pop()
        pad = "  " * n.depth
        if n.kind == "section":
            ref = shared.get(i, "")
            parents.append((n.depth, ref))
            extra = f"  {n.text}" if n.text else ""
            cite = f"  ({ref})" if citations and ref else ""
            size = n.end - n.start
            lines.append(f"{pad}{n.label} @{_range(n)} [{size} byte{'' if size == 1 else 's'}]{extra}{cite}")
        elif n.kind == "error":
            lines.append(f"{pad}! {n.text}")
        else:
            inherited = parents[-1][1] if parents and parents[-1][0] == n.depth - 1 else ""
            rng = _range(n) if n.end > n.start else f"{n.start} (0 bytes)"
            name = (pad + n.label).ljust(fieldw)
            value = n.text if n.kind == "field" else f"<{n.text}>"
            typ = f"  {n.type}" if n.type else ""
            cite = f"  · {n.ref}" if citations and n.ref and n.ref != inherited else ""
            lines.append(f"{rng:>{rangew}}  {_hexbytes(n.raw, n.end - n.start):<32} {name} = {value}{typ}{cite}")
    return "\n".join(lines)


def render_hex(nodes: Iterable[Node], *, width: int = 16, citations: bool = True) -> str:
    """Byte table: offset, up to ``width`` hex bytes per line, and the field they belong to."""
    lines = [f"{'offset':>8}  {' '.join(f'{i:02x}' for i in range(width))}  field = value"]
    for n in nodes:
        if n.kind == "section":
            lines.append(f"{'':>8}  {'':<{3 * width - 1}}  {'  ' * n.depth}# {n.label}" + (f" — {n.text}" if n.text else ""))
            continue
        if n.kind == "error":
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  ! {n.text}")
            continue
        raw = n.raw
        label = f"{'  ' * n.depth}{n.label} = {n.text if n.kind == 'field' else '<' + n.text + '>'}"
        if citations and n.ref:
            label += f"  ({n.ref})"
        if not raw:
            lines.append(f"{n.start:08x}  {'':<{3 * width - 1}}  {label} (0 bytes)")
            continue
        size = n.end - n.start
        rows = math.ceil(size / width)
        shown = rows if rows <= 4 else 3
        for r in range(shown):
            chunk = raw[r * width:(r + 1) * width]
            lines.append(f"{n.start + r * width:08x}  {chunk.hex(' '):<{3 * width - 1}}  {label if r == 0 else ''}".rstrip())
        if shown < rows:
            lines.append(f"{'':>8}  … {size - shown * width} more bytes")
    return "\n".join(lines)
