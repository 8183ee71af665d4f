"""``hurray-schema audit PATH``: every applicable rule run on the input by
:func:`hurray_schema.audit`, whose report is printed as its text or, with ``--json``, as its
JSON object (schema ``hurray-schema/audit/1``, :data:`hurray_schema.audit.AUDIT_JSON_FIELDS`).

Exit code 0: no MUST-level finding; 1: at least one MUST-level finding the mode does not
tolerate; 2: the input cannot be read."""

from __future__ import annotations

import sys
from typing import Optional

import click

from ..errors import HurraySchemaError
from .common import EXIT_UNREADABLE, KINDS, Input, audited, write_html


@click.command()
@click.argument("path", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--permissive", is_flag=True, help="Tolerate what the spec lets a permissive reader keep.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, schema hurray-schema/audit/1.")
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
    report = None
    try:
        with Input(path) as source:
            report = audited(path, source, kind, mode)
            printed = report.to_json_text() if as_json else report.to_text()  # while the bytes are at hand
            if html_out is not None:  # an input of no known kind is read as a stream, as the audit reads it
                write_html(html_out, path, source, report.read_as, list(report.findings), mode)
    except OSError as exc:
        _unreadable(path, mode, f"{path}: {exc.strerror or exc}", as_json, report)
    except HurraySchemaError as exc:
        _unreadable(path, mode, f"{path}: {exc}", as_json, report)
    click.echo(printed, nl=False)
    sys.exit(report.exit_code)


def _unreadable(path: str, mode: str, message: str, as_json: bool, report) -> None:
    """Exit 2 saying why on stderr (and with --json, the object of an unreadable input on stdout)."""
    if as_json:
        from ..audit.report import json_text, unreadable_json

        click.echo(json_text(unreadable_json(path, mode, message, report)), nl=False)
    click.echo(f"hurray-schema: {message}", err=True)
    sys.exit(EXIT_UNREADABLE)
