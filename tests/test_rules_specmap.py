"""spec-map.md against the rule registry, and every rule of the rule engine made to fire by a test."""

from __future__ import annotations

import re
from pathlib import Path

from hurray_schema.rules import registry
from hurray_schema.rules import composite as composite_rules
from hurray_schema.rules.descriptor import DESCRIPTOR_RULES
from support.rule_cases import COMPOSITE_CASES, DESCRIPTOR_CASES

SPEC_MAP = Path(__file__).resolve().parents[1] / "spec-map.md"
RULE_ID = re.compile(r"`([a-z0-9_]+(?:\.[a-z0-9_]+)+)`")


def _map_rule_ids() -> set[str]:
    """Rule ids in the Rule id column of the ``## Rules`` table of spec-map.md."""
    text = SPEC_MAP.read_text(encoding="utf-8")
    section = text.split("## Rules", 1)[1].split("\n## ", 1)[0]
    ids: set[str] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and not set(cells[0]) <= {"-", " "} and cells[0] != "Spec file":
            ids.update(RULE_ID.findall(cells[4]))
    return ids


MAP_IDS = _map_rule_ids()
ENGINE_RULES = {r.id for r in DESCRIPTOR_RULES} | {
    r.id for r in registry() if r.scope.startswith("composite") and r.id.startswith("composite.")}


def test_every_registered_rule_is_in_the_spec_map():
    missing = sorted({r.id for r in registry()} - MAP_IDS)
    assert not missing, f"rules missing from spec-map.md: {missing}"


def test_every_rule_in_the_spec_map_exists():
    unknown = sorted(MAP_IDS - {r.id for r in registry()})
    assert not unknown, f"spec-map.md names rules that do not exist: {unknown}"


def test_every_engine_rule_has_a_test_that_fires_it():
    fired = {c[0] for c in DESCRIPTOR_CASES} | {c[0] for c in COMPOSITE_CASES}
    fired |= {composite_rules.NESTING_DEPTH.id, composite_rules.TORN.id}  # dedicated tests
    assert ENGINE_RULES - fired == set()


def _divergence_rule_ids() -> set[str]:
    """Rule ids in the rule-id column ("Rule id" / "Rule ids") of every table under ``## Divergences``."""
    section = SPEC_MAP.read_text(encoding="utf-8").split("## Divergences", 1)[1].split("\n## ", 1)[0]
    ids: set[str] = set()
    column = None
    for line in section.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = next(i for i, c in enumerate(cells) if c in ("Rule id", "Rule ids"))
        elif not set(cells[0]) <= {"-", " "}:
            ids.update(RULE_ID.findall(cells[column]))
    return ids


def test_divergence_rule_ids_exist():
    from hurray_schema.limits import HARD_MAXIMUM

    ids = _divergence_rule_ids()
    assert {"file.composite.head_padding", "element_types.boolean.unpacked", "quantization.axis.dynamic"} <= ids
    limits = {i for i in ids if i.startswith("limit.")}
    assert {i.split(".", 1)[1] for i in limits} <= set(HARD_MAXIMUM), limits
    unknown = sorted(ids - limits - {r.id for r in registry()})
    assert not unknown, f"spec-map.md § Divergences names rules that do not exist: {unknown}"
