"""``hurray-schema get URL KEY -o OUT.npy``: a client session requesting one tensor or composite
(:meth:`hurray_schema.net.Session.get`), written as the array it is (a composite merged) by
:func:`hurray_schema.export.export_npy`."""

from __future__ import annotations

import click

from ..errors import HurraySchemaError, SpecViolation
from ..export import export_npy
from ..structs.tags import LayoutTag
from .common import EXIT_FINDINGS, connect, fail, session_options


@click.command()
@click.argument("url")
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the .npy file.")
@click.option("--parallel", is_flag=True, help="Let the server send shards on several streams.")
@click.option("--layout", "layouts", multiple=True, type=click.Choice([t.name.lower() for t in LayoutTag]),
              help="Preferred layout (repeat, most preferred first); the server may transcode to it.")
@session_options
def get(url, key, output, parallel, layouts, timeout, tls_ca, tls_cert, tls_key) -> None:
    """Request KEY from the server at URL and write its array to OUTPUT (.npy); a composite is merged."""
    tags = [LayoutTag[name.upper()] for name in layouts]
    try:
        with connect(url, timeout, tls_ca, tls_cert, tls_key) as session:
            item = session.get(key, layouts=tags, parallel=parallel)
        done = export_npy(item, output)
    except SpecViolation as exc:
        fail(f"{url}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError) as exc:
        fail(f"{url}: {exc}")
    click.echo(f"wrote {done.path}: {done.dtype} {list(done.shape)}")
