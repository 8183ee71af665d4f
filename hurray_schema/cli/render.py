"""``hurray-schema docs / ksy / vectors OUTDIR``: what is generated from the declarations -- the
format documentation (:mod:`hurray_schema.docs`), the Kaitai Struct schemas
(:mod:`hurray_schema.ksy`) and the conformance corpus (:mod:`hurray_schema.conformance`) -- written
into OUTDIR, or with ``--check`` compared with it."""

from __future__ import annotations

import sys

import click

_CHECK_HELP = "Do not write; exit 1 if OUTDIR differs from a fresh render."


def _render_into(outdir: str, check: bool, command: str, write, stale, what: str) -> None:
    """``command OUTDIR``: write a fresh render into OUTDIR, or (``--check``) exit 1 naming what differs."""
    if check:
        differing = stale(outdir)
        if differing:
            click.echo(f"{outdir}: out of date: {', '.join(differing)} (run `hurray-schema {command} {outdir}`)",
                       err=True)
            sys.exit(1)
        click.echo(f"{outdir}: up to date")
        return
    written = write(outdir)
    click.echo(f"wrote {len(written)} {what} to {outdir}")


@click.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help=_CHECK_HELP)
def docs(outdir: str, check: bool) -> None:
    """Write the format documentation generated from the declarations into OUTDIR."""
    from ..conformance import build_corpus
    from ..docs import check_docs, write_docs

    corpus = build_corpus()
    _render_into(outdir, check, "docs", lambda out: write_docs(out, corpus), lambda out: check_docs(out, corpus),
                 "pages")


@click.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help=_CHECK_HELP)
def ksy(outdir: str, check: bool) -> None:
    """Write the Kaitai Struct schemas (.ksy) generated from the declarations into OUTDIR."""
    from ..ksy import check_ksy, write_ksy

    _render_into(outdir, check, "ksy", write_ksy, check_ksy, "schemas")


@click.command()
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--check", is_flag=True, help="Do not write; exit 1 if OUTDIR differs from a fresh generation.")
@click.option("--no-reference", is_flag=True, help="Leave pyhurray's verdicts out of the manifest.")
def vectors(outdir: str, check: bool, no_reference: bool) -> None:
    """Write the conformance corpus (a passing and a violating input per rule, manifest.json) into OUTDIR."""
    from ..conformance import MANIFEST, check_corpus, write_corpus
    from ..conformance.sessions import SERVED_FILE

    if check:
        stale = check_corpus(outdir, reference=not no_reference)
        if stale:
            shown = ", ".join(stale[:10]) + (f" (+{len(stale) - 10})" if len(stale) > 10 else "")
            click.echo(f"{outdir}: out of date: {shown} (run `hurray-schema vectors {outdir}`)", err=True)
            sys.exit(1)
        click.echo(f"{outdir}: up to date")
        return
    written = write_corpus(outdir, reference=not no_reference)
    vectors = [p for p in written if p.name not in (MANIFEST, SERVED_FILE)]
    click.echo(f"wrote {len(vectors)} vectors, {MANIFEST} and {SERVED_FILE} (what the session vectors were served "
               f"from) to {outdir}")
