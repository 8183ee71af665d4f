"""The conformance corpus: every vector, its expected verdicts, the manifest, drift checks.

:func:`build_corpus` runs every :class:`~.case.Case`, reads both of its inputs with our
strict and permissive readers (:mod:`.verdicts`) and keeps a violating input only when
it is a vector *for its rule*: the first finding of every reader is that rule, at one
offset (a reader that rejects raises it; for a rule the permissive mode tolerates, the
permissive reader accepts with it as first finding; for a SHOULD rule both accept with
it as first finding).  The passing input must carry no finding at all.  A case whose
inputs do not qualify leaves its rule without a vector, and the manifest says why.

Everything is deterministic: the same code gives byte-identical files and manifest.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Iterable, Optional

import attrs

from ..docs.markdown import hex_around
from ..rules import interop
from ..rules.engine import get_rule, registry
from ..rules.session import SESSION_RULES
from .case import EXTENSIONS, Case
from .reference import ABORT, divergence_of, reference_verdicts
from .verdicts import Verdict, read_verdict

__all__ = [
    "Vector", "Corpus", "NO_VECTOR", "LINTS", "all_cases", "build_corpus", "manifest", "write_corpus", "check_corpus",
    "MANIFEST", "SCHEMA", "hex_around",
]

MANIFEST = "manifest.json"
SCHEMA = "hurray-schema-vectors/1"

NO_VECTOR: dict[str, str] = {
    "quantization.buffer.device":
        "Every input that breaks it also breaks buffer.colocation (all buffers of a descriptor share one "
        "device_tag), which is checked first: no input has it as first finding.",
    "composite.member.box_bounds":
        "A member's box is indefinite only through a dynamic dimension, and a member carrying a shard section "
        "with a dynamic dimension breaks data_model.shard.dynamic first (a member without a shard breaks "
        "composite.member.shard); a definite box past the head is metadata.shard.bounds.",
    "stream.sync_mode.cross_machine":
        "Depends on how the stream travels, not on its bytes: it fires only when the reader is told the stream "
        "crosses machines (read_stream(..., cross_machine=True)).",
}
NO_VECTOR.update({
    rule.id: "A transport session rule: what breaks it is a session between two peers, judged with what the "
             "receiver sent (its hello, its requests), so its vector is a pair of recorded directions, not one "
             "file; tests/test_net_rules.py records a firing and a passing session for each and audits them."
    for rule in SESSION_RULES})
"""Rules no input can have as its first finding, with the reason (left out of the coverage base)."""


@attrs.frozen(slots=True)
class Vector:
    """One input of the corpus and what our readers say about it."""

    file: str
    kind: str
    rule_id: str
    role: str
    """``fail``: violates ``rule_id`` (and nothing before it); ``pass``: fully valid."""
    data: bytes = attrs.field(repr=False)
    strict: Verdict
    permissive: Verdict
    note: Optional[str] = None

    @property
    def offset(self) -> Optional[int]:
        return self.strict.offset


@attrs.frozen(slots=True)
class Corpus:
    vectors: tuple[Vector, ...]
    missing: dict
    """Rule id → why it has no violating vector (rules input bytes can trigger)."""

    def of_rule(self, rule_id: str) -> list[Vector]:
        return [v for v in self.vectors if v.rule_id == rule_id]

    @property
    def covered(self) -> set[str]:
        return {v.rule_id for v in self.vectors if v.role == "fail"}

    @property
    def reasons(self) -> dict[str, str]:
        """Rule id → why it has no violating vector: no input can show it (:data:`NO_VECTOR`), or its
        case did not give one (:attr:`missing`)."""
        covered = self.covered
        return {rule_id: why for rule_id, why in {**NO_VECTOR, **self.missing}.items() if rule_id not in covered}


def all_cases() -> list[Case]:
    from .composites import composite_cases
    from .containers import container_cases
    from .descriptors import descriptor_cases

    return descriptor_cases() + composite_cases() + container_cases()


LINTS = interop.AUDIT_ONLY
"""Rules ``audit`` checks on what a reader accepted: a reader accepts an input whose first
finding is one of them (``file.composite.head_padding`` binds writers)."""


def _expected(rule_id: str) -> tuple[bool, bool]:
    """(strict accepts, permissive accepts) an input whose first finding is ``rule_id``."""
    rule = get_rule(rule_id)
    if not rule.level.is_requirement or rule_id in LINTS:
        return True, True
    return False, rule.permissive


def _why_not(case: Case, good: tuple[Verdict, Verdict], bad: tuple[Verdict, Verdict]) -> Optional[str]:
    """None when the case gives a passing and a violating vector for its rule, else why not."""
    for verdict in good:
        if not verdict.accepted or verdict.rule_id is not None:
            return f"the passing input is not clean: {verdict.to_json()}"
    strict_ok, permissive_ok = _expected(case.rule_id)
    strict, permissive = bad
    for verdict in bad:
        if verdict.rule_id != case.rule_id:
            return f"the violating input fires {verdict.rule_id} first"
    if (strict.accepted, permissive.accepted) != (strict_ok, permissive_ok):
        return f"unexpected verdicts {strict.to_json()} / {permissive.to_json()}"
    if strict.offset != permissive.offset or strict.offset is None:
        return f"the readers locate it differently: {strict.offset} / {permissive.offset}"
    return None


def _vectors_of(case: Case, index: int) -> tuple[list[Vector], Optional[str]]:
    try:
        good, bad = case.build()
        verdicts = {name: (read_verdict(case.kind, data, "strict"), read_verdict(case.kind, data, "permissive"))
                    for name, data in (("pass", good), ("fail", bad))}
    except Exception as exc:  # a generator or reader that fails is reported, not fatal  # noqa: BLE001
        return [], f"generation failed: {type(exc).__name__}: {exc}"
    reason = _why_not(case, verdicts["pass"], verdicts["fail"])
    if reason is not None:
        return [], reason
    suffix = "" if index == 0 else f".{index + 1}"
    ext = EXTENSIONS[case.kind]
    return [Vector(f"{case.rule_id}{suffix}.{role}.{ext}", case.kind, case.rule_id, role, data, *verdicts[role],
                   note=case.note if role == "fail" else None)
            for role, data in (("pass", good), ("fail", bad))], None


def build_corpus(cases: Optional[Iterable[Case]] = None) -> Corpus:
    """Every vector the cases give, and why each remaining triggerable rule has none."""
    vectors: list[Vector] = []
    failures: dict[str, str] = {}
    seen: dict[str, int] = {}
    for case in (all_cases() if cases is None else cases):
        made, reason = _vectors_of(case, seen.get(case.rule_id, 0))
        if made:
            seen[case.rule_id] = seen.get(case.rule_id, 0) + 1
            vectors += made
        else:
            failures.setdefault(case.rule_id, reason)
    covered = {v.rule_id for v in vectors}
    missing = {}
    for rule in registry():
        if rule.id in covered or rule.id in NO_VECTOR:
            continue
        missing[rule.id] = failures.get(rule.id, "no generator for this rule yet")
    return Corpus(tuple(sorted(vectors, key=lambda v: v.file)), missing)


# -- manifest ---------------------------------------------------------------------------------


def _reference_entry(vector: Vector, verdict: Optional[str]) -> Optional[dict]:
    if verdict is None:
        return None
    agrees = verdict == vector.strict.to_json()["verdict"]
    entry = {"verdict": verdict, "agrees": agrees,
             "agrees_permissive": verdict == vector.permissive.to_json()["verdict"]}
    if not agrees:
        entry["divergence"] = divergence_of(vector.rule_id) if vector.role == "fail" or verdict == ABORT else None
    return entry


def _vector_entry(vector: Vector, reference: dict) -> dict:
    rule = get_rule(vector.rule_id)
    entry = {
        "file": vector.file,
        "kind": vector.kind,
        "role": vector.role,
        "rule_id": rule.id,
        "level": rule.level.value,
        "citation": rule.citation,
        "statement": rule.summary,
        "size": len(vector.data),
        "sha256": hashlib.sha256(vector.data).hexdigest(),
        "strict": vector.strict.to_json(),
        "permissive": vector.permissive.to_json(),
        "first_finding": None if vector.strict.rule_id is None else
        {"rule_id": vector.strict.rule_id, "offset": vector.strict.offset},
    }
    if vector.note:
        entry["note"] = vector.note
    if reference:
        entry["reference"] = _reference_entry(vector, reference.get(vector.file))
    return entry


def _coverage(corpus: Corpus) -> dict:
    rules = registry()
    triggerable = [r for r in rules if r.id not in NO_VECTOR]
    covered = len(corpus.covered & {r.id for r in triggerable})
    return {
        "registered_rules": len(rules),
        "triggerable_rules": len(triggerable),
        "rules_with_violating_vector": covered,
        "percent": round(100.0 * covered / len(triggerable), 1),
    }


def _without_vector(corpus: Corpus) -> list[dict]:
    rows = [(rule_id, False, reason) for rule_id, reason in NO_VECTOR.items()]
    rows += [(rule_id, True, reason) for rule_id, reason in corpus.missing.items()]
    return [{"rule_id": rule_id, "level": get_rule(rule_id).level.value, "citation": get_rule(rule_id).citation,
             "triggerable": triggerable, "reason": reason} for rule_id, triggerable, reason in sorted(rows)]


def _version() -> str:
    """The installed distribution's version (the package root imports every tool, this layer may not)."""
    try:
        return importlib.metadata.version("hurray_schema")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def manifest(corpus: Corpus, *, reference: bool = True) -> dict:
    """The manifest of ``corpus`` (pyhurray's verdicts when ``reference`` and it is installed)."""
    verdicts = reference_verdicts(corpus.vectors) if reference else {}
    return {
        "schema": SCHEMA,
        "generator": f"hurray_schema {_version()}",
        "reference": "pyhurray" if verdicts else None,
        "coverage": _coverage(corpus),
        "vectors": [_vector_entry(v, verdicts) for v in corpus.vectors],
        "rules_without_vector": _without_vector(corpus),
    }


def _render(corpus: Corpus, reference: bool) -> dict[str, bytes]:
    files = {v.file: v.data for v in corpus.vectors}
    text = json.dumps(manifest(corpus, reference=reference), indent=2, sort_keys=True) + "\n"
    files[MANIFEST] = text.encode("utf-8")
    return files


def _is_vector_name(name: str) -> bool:
    """True for a name this module writes vectors under (``<rule>.pass.<ext>``, ``<rule>.fail.<ext>``)."""
    stem, _, ext = name.rpartition(".")
    return ext in EXTENSIONS.values() and stem.endswith((".pass", ".fail"))


def write_corpus(outdir, *, reference: bool = True, corpus: Optional[Corpus] = None) -> list[Path]:
    """Write every vector and ``manifest.json`` into ``outdir``, removing vector files of
    an earlier generation that this one no longer has; returns the paths written."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    files = _render(build_corpus() if corpus is None else corpus, reference)
    for stale in sorted(out.iterdir()):
        if stale.is_file() and _is_vector_name(stale.name) and stale.name not in files:
            stale.unlink()
    written = []
    for name, data in files.items():
        path = out / name
        path.write_bytes(data)
        written.append(path)
    return written


def check_corpus(outdir, *, reference: bool = True) -> list[str]:
    """Names of the files in ``outdir`` that differ from, are missing against, or are not
    part of a fresh generation (like :func:`hurray_schema.docs.check_docs`)."""
    out = Path(outdir)
    files = _render(build_corpus(), reference)
    stale = [name for name, data in files.items() if not (out / name).is_file() or (out / name).read_bytes() != data]
    extra = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in files) if out.is_dir() else []
    return stale + extra
