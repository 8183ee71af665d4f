"""``hurray-schema inspect PATH``: the annotated view of every field (:mod:`hurray_schema.hexview`),
or with ``--html`` the page of :mod:`hurray_schema.htmlview`."""

from __future__ import annotations

from typing import Optional

import click

from ..errors import HurraySchemaError
from ..io.walk.kinds import KIND_NAMES
from .common import KINDS, Input, audited, fail, write_html


@click.command()
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
    from ..hexview import annotate, detect_kind, render_hex, render_tree

    try:
        with Input(path) as source:
            found = detect_kind(source.data) if kind == "auto" else kind
            if found == "unknown":
                fail(f"{path}: not a Hurray descriptor, stream or file (no known magic at byte 0)")
            if html_out is not None:
                findings = list(audited(path, source, found, "strict").findings)
                written = write_html(html_out, path, source, found, findings, "strict")
                click.echo(f"wrote {html_out}: {written} bytes")
                return
            nodes = annotate(source.data, found, brief=brief)
            size = source.size
    except OSError as exc:
        fail(f"{path}: {exc.strerror or exc}")
    except HurraySchemaError as exc:
        fail(f"{path}: {exc}")
    render = render_hex if as_hex else render_tree
    click.echo(f"{path}: {KIND_NAMES.get(found, found)}, {size} bytes")
    click.echo(render(nodes, citations=not (no_citations or brief)))
