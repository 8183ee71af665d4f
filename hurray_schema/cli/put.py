"""``hurray-schema put URL KEY FILE``: a client session pushing a ``.npy`` array or an item of a
``.hrry`` file (:meth:`hurray_schema.net.Session.put`)."""

from __future__ import annotations

from typing import Optional

import click

from ..errors import HurraySchemaError, SpecViolation
from .common import EXIT_FINDINGS, connect, fail, session_options


@click.command()
@click.argument("url")
@click.argument("key")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--name", default=None, help="The item of a .hrry FILE to push (default: its only top-level item).")
@session_options
def put(url, key, file, name, timeout, tls_ca, tls_cert, tls_key) -> None:
    """Push FILE (a .npy array, or an item of a .hrry file) to the server at URL under KEY."""
    try:
        item, description = _put_item(file, name)
        with connect(url, timeout, tls_ca, tls_cert, tls_key) as session:
            session.put(key, item)
    except SpecViolation as exc:
        fail(f"{url}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError, ValueError) as exc:
        fail(f"{url}: {exc}")
    click.echo(f"put {key}: {description}")


def _put_item(path: str, name: Optional[str]):
    """The item a ``put`` pushes, and how to describe it."""
    from ..export import find_item
    from ..io import read_file

    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x93NUMPY"):
        import numpy as np

        array = np.load(path, allow_pickle=False)
        return array, f"{array.dtype} {list(array.shape)}"
    container = read_file(path)
    if name is None:
        if len(container) != 1:
            raise HurraySchemaError(f"{path} holds {len(container)} items; choose one with --name")
        (name,) = container.keys()
    item = find_item(container, name)
    return item, f"{name!r} of {path}"
