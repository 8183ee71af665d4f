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
from .case import EXTENSIONS, Case, Vector
from .reference import ABORT, divergence_of, reference_verdicts
from .sessions import (
    SERVED_FILE, is_session_file, record_sessions, served_file_bytes, session_cases, session_manifest,
    session_vectors,
)
from .verdicts import Verdict, read_verdict

__all__ = [
    "Vector", "Corpus", "NO_VECTOR", "LINTS", "all_cases", "build_corpus", "manifest", "write_corpus", "check_corpus",
    "MANIFEST", "SCHEMA", "hex_around",
]

MANIFEST = "manifest.json"
SCHEMA = "hurray-schema-vectors/1"

SHADOWED = "shadowed"
"""Why a rule has no violating vector: every input that breaks it breaks an earlier rule first."""
NOT_IN_BYTES = "not in the bytes"
"""Why a rule has no violating vector: what breaks it is not in the bytes a recording keeps."""
BEHAVIOUR = "a server's choice"
"""Why a rule has no violating vector: it binds what a server chooses, which depends on what it
stores and how it is configured, not on what a recording shows."""

NO_VECTOR: dict[str, tuple[str, str]] = {
    "quantization.buffer.device": (
        SHADOWED,
        "Every input that breaks it also breaks buffer.colocation (all buffers of a descriptor share one "
        "device_tag), which is checked first: no input has it as first finding."),
    "composite.member.box_bounds": (
        SHADOWED,
        "A member's box is indefinite only through a dynamic dimension, and a member carrying a shard section "
        "with a dynamic dimension breaks data_model.shard.dynamic first (a member without a shard breaks "
        "composite.member.shard); a definite box past the head is metadata.shard.bounds."),
    "session.shm.sealed": (
        NOT_IN_BYTES,
        "The seals and the size of the memory file an SHM_PUT passes are properties of the file descriptor "
        "that travels beside the bytes (SCM_RIGHTS); a recording keeps the bytes only."),
    "session.transcode.limit": (
        BEHAVIOUR,
        "Whether a transcoded output would pass the server's transcoding memory limit depends on that limit, "
        "which no message carries; serving the next preference is also what a server without the layout does."),
    "session.layout.selection": (
        BEHAVIOUR,
        "Which preference a server must serve depends on the layouts it stores the tensor in and on its "
        "transcoding limit, neither of which a session carries; tests/test_net_session.py checks our server's "
        "choice."),
    "session.transcode.elements": (
        BEHAVIOUR,
        "Whether a transcoded tensor keeps every element of the stored one needs the stored tensor, which "
        "the session does not carry; tests/test_net_session.py compares our server's transcodes with NumPy."),
}
"""Rules no input can have as its first finding: ``(why, reason)`` (:data:`SHADOWED`,
:data:`NOT_IN_BYTES`, :data:`BEHAVIOUR`)."""


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
        reasons = {rule_id: f"{why}: {text}" for rule_id, (why, text) in NO_VECTOR.items()}
        reasons.update(self.missing)
        return {rule_id: text for rule_id, text in reasons.items() if rule_id not in covered}


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


def build_corpus(cases: Optional[Iterable[Case]] = None, sessions: Optional[Iterable] = None) -> Corpus:
    """Every vector the cases give (one-file ``cases`` and :mod:`.sessions` cases, all of both by
    default; ``sessions`` defaults to none when ``cases`` are given), and why each remaining
    triggerable rule has none."""
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
    if sessions is None and cases is None:
        sessions = session_cases()
    for case, passing, violating in record_sessions(list(sessions or ())):
        made, reason = session_vectors(case, passing, violating, seen.get(case.rule_id, 0), _expected(case.rule_id))
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
    if vector.session is not None:
        entry.update(session=vector.session, direction=vector.direction,
                     receiver="server" if vector.direction == "client" else "client")
        if vector.error_code is not None:
            entry["error_code"] = vector.error_code
    if reference:
        entry["reference"] = _reference_entry(vector, reference.get(vector.file))
    return entry


def _coverage(corpus: Corpus) -> dict:
    """How many rules have a violating vector: of those an input can trigger (``percent``), and of
    every registered rule, the session rules included (``percent_of_all_rules``)."""
    rules = registry()
    triggerable = [r for r in rules if r.id not in NO_VECTOR]
    covered = len(corpus.covered & {r.id for r in triggerable})
    return {
        "registered_rules": len(rules),
        "triggerable_rules": len(triggerable),
        "rules_with_violating_vector": covered,
        "percent": round(100.0 * covered / len(triggerable), 1),
        "percent_of_all_rules": round(100.0 * len(corpus.covered & {r.id for r in rules}) / len(rules), 1),
    }


def _without_vector(corpus: Corpus) -> list[dict]:
    rows = [(rule_id, False, why, text) for rule_id, (why, text) in NO_VECTOR.items()]
    rows += [(rule_id, True, "no qualifying case", reason) for rule_id, reason in corpus.missing.items()]
    return [{"rule_id": rule_id, "level": get_rule(rule_id).level.value, "citation": get_rule(rule_id).citation,
             "triggerable": triggerable, "because": why, "reason": reason}
            for rule_id, triggerable, why, reason in sorted(rows)]


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
        "sessions": session_manifest(),
        "vectors": [_vector_entry(v, verdicts) for v in corpus.vectors],
        "rules_without_vector": _without_vector(corpus),
    }


def _render(corpus: Corpus, reference: bool) -> dict[str, bytes]:
    files = {v.file: v.data for v in corpus.vectors}
    if any(v.session is not None for v in corpus.vectors):
        files[SERVED_FILE] = served_file_bytes()
    text = json.dumps(manifest(corpus, reference=reference), indent=2, sort_keys=True) + "\n"
    files[MANIFEST] = text.encode("utf-8")
    return files


def _is_vector_name(name: str) -> bool:
    """True for a name this module writes vectors under (``<rule>.pass.<ext>``, ``<rule>.fail.<ext>``,
    a session's ``<rule>.fail.client.msgs`` ...) and for the file the session vectors were served from."""
    if name == SERVED_FILE:
        return True
    session = is_session_file(name)
    stem, _, ext = name.rpartition(".")
    return session or (ext in EXTENSIONS.values() and stem.endswith((".pass", ".fail")))


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
