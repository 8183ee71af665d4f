"""``hurray-schema merge PATH NAME``: tensor or composite NAME of a file materialized into a
``.npy`` file or a Zarr store by :func:`hurray_schema.export.export_npy` /
:func:`~hurray_schema.export.export_zarr`."""

from __future__ import annotations

import sys
from typing import Optional

import click

from ..errors import HurraySchemaError, SpecViolation
from ..export import ZARR_DTYPE_ATTRIBUTE, export_npy, export_zarr
from .common import EXIT_FINDINGS, Bytes, existing_or_url, fail


@click.command()
@click.argument("path", type=click.Path(dir_okay=False), callback=existing_or_url)
@click.argument("name")
@click.option("-o", "--output", "output", default=None, type=click.Path(dir_okay=False),
              help="Where to write the .npy file.")
@click.option("--zarr", "zarr_store", default=None, type=click.Path(file_okay=False),
              help="Write a Zarr store (a folder) instead of a .npy file, chunk by chunk with dask (the [zarr] "
                   "extra), with a progress bar; a type Zarr has no data type for (bfloat16) is stored as its bits "
                   f"(unsigned integers of its width) with the array attribute {ZARR_DTYPE_ATTRIBUTE!r} naming it.")
@click.option("--permissive", is_flag=True, help="Read the file in permissive mode.")
@click.option("--memory", "memory", type=Bytes(), default=None,
              help="Memory budget (e.g. 1G): a larger result is evaluated chunk by chunk with dask (the [dask] "
                   "extra) and written to OUTPUT as the chunks complete, with a progress bar; with --zarr, the "
                   "chunks' size (default: about 64 MiB).")
def merge(path: str, name: str, output: Optional[str], zarr_store: Optional[str], permissive: bool,
          memory: Optional[int]) -> None:
    """Materialize tensor or composite NAME of the file PATH into OUTPUT (.npy) or a Zarr STORE.

    PATH may be a URL (https://..., s3://...; the [remote] extra): it is read by byte range, only
    the ranges NAME needs."""
    if (output is None) == (zarr_store is None):
        raise click.UsageError("give exactly one of -o/--output and --zarr")
    export, target = (export_npy, output) if zarr_store is None else (export_zarr, zarr_store)
    try:
        done = export(path, target, name=name, memory=memory, mode="permissive" if permissive else "strict",
                      progress=sys.stderr)
    except SpecViolation as exc:
        fail(f"{path}: {exc}", EXIT_FINDINGS)
    except (HurraySchemaError, OSError) as exc:
        fail(f"{path}: {exc}")
    click.echo(f"wrote {done.path}: {done.dtype} {list(done.shape)}")
