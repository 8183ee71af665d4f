"""``hurray-schema rules``: the rule registry (:func:`hurray_schema.rules.engine.registry`)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from typing import Optional

import click


@click.command()
@click.argument("rule_ids", nargs=-1, metavar="[RULE_ID]...")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as a JSON list.")
@click.option("--scope", default=None, help="Only rules of this scope (descriptor, composite.head, file, ...).")
def rules(rule_ids: tuple, as_json: bool, scope: Optional[str]) -> None:
    """The rule registry: id, level, citation and summary of every rule; given rule ids, where each
    one is declared and what enforces it."""
    from ..rules.engine import registry

    if rule_ids:
        _show_where(rule_ids)
        return

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


def _show_where(rule_ids: tuple) -> None:
    from ..errors import HurraySchemaError
    from ..rules import located

    for rule_id in rule_ids:
        try:
            where = located(rule_id)
        except (KeyError, HurraySchemaError):
            raise click.BadParameter(f"no rule {rule_id!r}", param_hint="RULE_ID") from None
        rule = where["rule"]
        click.echo(f"{rule.id}  {rule.level.value}  {rule.citation}")
        click.echo(f"  {rule.summary}")
        for place in where["declared"]:
            click.echo(f"  {'condition and report' if where['condition'] else 'check'}: {place}")
        for place in where["enforced_by"]:
            click.echo(f"  enforced by: {place}")


def _terminal_width() -> int:
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return 100
