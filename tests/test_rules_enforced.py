"""Every rule is found from its id in one step: a rule either carries its check (the descriptor
rules) or names with ``enforced_by`` the functions that enforce it, and each of those resolves to
a function whose source names the rule (its id or its constant)."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from hurray_schema.rules import enforcer, registry

AREAS = ("structure", "container", "session", "composite", "interop", "values")


def _constants() -> dict[str, set[str]]:
    """Rule id -> the names its declaring module binds it to."""
    names: dict[str, set[str]] = {}
    for area in AREAS:
        module = importlib.import_module(f"hurray_schema.rules.{area}")
        for name, value in vars(module).items():
            if name.isupper() and hasattr(value, "violation") and hasattr(value, "id"):
                names.setdefault(value.id, set()).add(name)
    return names


CONSTANTS = _constants()
RULES = registry()


def test_every_rule_has_a_check_or_names_its_enforcer():
    bare = [r.id for r in RULES if r.check is None and not r.enforced_by]
    assert not bare, f"rules with neither a check nor enforced_by: {bare}"


def test_a_rule_with_a_check_names_no_enforcer():
    both = [r.id for r in RULES if r.check is not None and r.enforced_by]
    assert not both, f"rules with a check and enforced_by: {both}"


@pytest.mark.parametrize("rule", [r for r in RULES if r.enforced_by], ids=lambda r: r.id)
def test_enforced_by_resolves_to_a_function_that_names_the_rule(rule):
    words = {rule.id} | CONSTANTS.get(rule.id, set())
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(w)}(?!\w)" if w.isupper() else re.escape(w)
                                  for w in sorted(words)))
    for path in rule.enforced_by:
        assert re.fullmatch(r"hurray_schema(\.\w+)+:\w+(\.\w+)*", path), path
        target = enforcer(path)
        assert callable(target), path
        source = inspect.getsource(inspect.unwrap(target))
        assert pattern.search(source), f"{path} does not mention {sorted(words)}"


def test_the_client_refuses_a_min_alignment_by_the_session_rule():
    from hurray_schema.errors import SpecViolation
    from hurray_schema.net.checker import check_min_alignment
    from hurray_schema.net.client import Session

    for bad in (0, 3, 48):
        with pytest.raises(SpecViolation) as caught:
            check_min_alignment(bad)
        assert caught.value.rule_id == "session.request.alignment" and caught.value.offset is None
    check_min_alignment(4096)
    assert "check_min_alignment(min_alignment)" in inspect.getsource(Session.get)


def test_every_rule_id_leads_to_its_code_in_one_step():
    """``hurray_schema.rules.located`` (``hurray-schema rules ID``): every rule names the function
    declared with it, or the functions that enforce it, each at a file and line that exist."""
    from pathlib import Path

    from hurray_schema.rules import located, registry

    root = Path(__file__).resolve().parents[1]
    for rule in registry():
        where = located(rule.id)
        places = where["declared"] + [entry.rsplit("(", 1)[1].rstrip(")") for entry in where["enforced_by"]]
        assert len(places) >= 1, rule.id
        for place in places:
            path, line = place.rsplit(":", 1)
            lines = (root / path).read_text().splitlines()
            assert 1 <= int(line) <= len(lines), (rule.id, place)
