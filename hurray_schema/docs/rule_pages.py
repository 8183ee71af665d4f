"""The pages of the rules: the index (pages, parts of a descriptor, every rule linked to the
struct(s) it constrains) and the conformance vectors of every rule."""

from __future__ import annotations

import re
from typing import Optional

from ..structs.walker import choices, walk_declarations
from .markdown import GENERATED, _rule_anchor, _table, hex_around
from .tables import StructDoc, _Placer

__all__ = ["rule_structs", "VECTORS_PAGE"]


def _section_of(ref: str) -> str:
    """``"metadata.md § Statistics Section › Field Encoding"`` → ``"metadata.md § Statistics Section"``."""
    return ref.split(" › ")[0].strip()


def rule_structs(rule, docs: list[StructDoc]) -> list[StructDoc]:
    """The struct(s) a rule constrains, best first: a field citing the rule's section
    weighs most, then a field or struct named by a word of the rule id (after its area
    prefix), then a field citing the same spec page; among equals, those of the module the
    rule's area names (``stream.*``: ``structs/stream.py``) when there are any."""
    words = set(rule.id.split(".")[1:])
    section = _section_of(rule.citation)
    page = rule.citation.split(" § ")[0]
    scored = []
    for d in docs:
        score = 0
        if any(_section_of(r) == section for r in d.refs):
            score += 4
        if words & {f.name for f in d.fields}:
            score += 2
        if words & set(d.name.lower().split("_")):
            score += 2
        if any(r.split(" § ")[0] == page for r in d.refs):
            score += 1
        if score:
            scored.append((score, d))
    if not scored:
        return []
    best = max(score for score, _ in scored)
    found = [d for score, d in scored if score == best]
    area = [d for d in found if d.module == rule.id.split(".")[0]]
    return area or found


def _part_presence(part) -> str:
    if part.flag is not None:
        return f"flag bit {part.flag.bit_length() - 1} ({part.flag.name})"
    if part.chosen_by is not None:
        return f"depends on `{part.chosen_by}`"
    return "always"


def _part_declaration(part, by_decl: dict) -> str:
    """Links to the declaration(s) of a part of the descriptor."""
    def link(decl) -> Optional[str]:
        d = by_decl.get(id(decl))
        return f"[`{d.name}`]({d.page}#{d.anchor})" if d is not None else None

    if part.tables is not None:
        pages = [by_decl[id(c.decl)].page for c in choices(part) if not c.private and id(c.decl) in by_decl]
        return f"[{part.name} tables]({pages[0]})" if pages else "—"
    links = [link(decl) for decl in (part.prefix, part.decl) if decl is not None]
    return ", ".join(x for x in links if x) or "—"


def _index_page(docs: list[StructDoc], pages: list[tuple[str, str]], covered: frozenset = frozenset()) -> str:
    from ..rules.engine import registry

    out = [GENERATED, "", "# Hurray wire format (generated)", ""]
    out += [
        "These pages are generated from the `construct` declarations the codec runs "
        "(`hurray_schema/structs/`), the tag tables attached to their fields and the rule "
        "registry. Regenerate them with `hurray-schema docs docs/format`.",
        "",
        "## Pages",
        "",
    ]
    out += [f"- [{title}]({page})" for page, title in pages]
    out += ["", "## Parts of a descriptor", ""]
    by_decl = {id(d.decl): d for d in docs}
    rows = [[f"`{part.name}`", str(start) if start is not None else "—", _part_presence(part),
             _part_declaration(part, by_decl)] for part, start in walk_declarations(_Placer({}))]
    out += _table(["Part", "Starts at", "Present", "Declaration"], rows)
    out += ["", "## Rules", "", "Each rule of the registry with the struct(s) it constrains and its conformance "
            f"vectors ([{VECTORS_PAGE}]({VECTORS_PAGE})).", ""]
    rows = []
    for rule in registry():
        targets = rule_structs(rule, docs)
        links = ", ".join(f"[`{d.name}`]({d.page}#{d.anchor})" for d in targets[:6]) or "—"
        if len(targets) > 6:
            links += f" (+{len(targets) - 6})"
        vectors = f"[{'vectors' if rule.id in covered else 'none'}]({VECTORS_PAGE}#{_vector_anchor(rule)})"
        rows.append([f'<a id="{_rule_anchor(rule)}"></a>`{rule.id}`', rule.level.value, rule.citation, links,
                     rule.summary, vectors])
    out += _table(["Rule", "Level", "Citation", "Struct", "Summary", "Vectors"], rows)
    out.append("")
    return "\n".join(out)


VECTORS_PAGE = "vectors.md"


def _vector_anchor(rule) -> str:
    return "vectors-" + re.sub(r"[^\w-]", "-", rule.id)


def _verdict_cell(verdict) -> str:
    if verdict.rule_id is None:
        return verdict.to_json()["verdict"]
    return f"{verdict.to_json()['verdict']} `{verdict.rule_id}` @ {verdict.offset}"


def _vector_lines(vector) -> list[str]:
    """One vector: its file, our verdicts and, for a violating one, the bytes around the fault."""
    kind = vector.kind if vector.session is None else f"{vector.role} {vector.direction} direction"
    line = (f"- `{vector.file}` ({kind}, {len(vector.data)} bytes): strict {_verdict_cell(vector.strict)}; "
            f"permissive {_verdict_cell(vector.permissive)}")
    if vector.note:
        line += f" -- {vector.note}"
    out = [line]
    if vector.role == "fail":
        start, text = hex_around(vector.data, vector.offset)
        out.append(f"  `{start:#06x}: {text}`")
    return out


def _vectors_page(corpus) -> str:
    """Every rule with its vectors (``hurray-schema vectors OUTDIR`` writes the files)."""
    from ..rules.engine import registry

    out = [GENERATED, "", "# Conformance vectors", ""]
    out += [
        "For every rule, the inputs `hurray-schema vectors OUTDIR` writes: a passing one (`.pass.`) and one "
        "that violates that rule and nothing before it (`.fail.`), as a descriptor (`.desc`), a bare stream "
        "(`.stream`), a message stream (`.msgs`), a file (`.hrry`) or, for a transport rule, a recorded session: "
        "what the client sent (`.client.msgs`) and what the server sent (`.server.msgs`), the direction without "
        "the fault listed as `peer`. Each line gives our strict and permissive "
        "readers' verdicts, the rule and byte offset of the first finding (for a session direction, `audit`'s, with "
        "the other direction beside it); under a violating vector, the "
        "16-byte row holding the fault (the next row too when the fault is in the row's second half), the "
        "faulty byte in brackets. The manifest (`manifest.json`) also carries pyhurray's verdicts. "
        f"Rules without a violating vector: {len(corpus.reasons)}; see their reasons below.",
        "",
    ]
    for rule in registry():
        out += [f'## <a id="{_vector_anchor(rule)}"></a>`{rule.id}`', "",
                f"{rule.level.value} ({rule.citation}): {rule.summary} [Rule]({'index.md'}#{_rule_anchor(rule)}).", ""]
        vectors = corpus.of_rule(rule.id)
        if vectors:
            for vector in vectors:
                out += _vector_lines(vector)
        else:
            reason = corpus.reasons.get(rule.id, "")
            out.append(f"No violating vector: {reason}")
        out.append("")
    return "\n".join(out)
