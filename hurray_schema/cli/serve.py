"""``hurray-schema serve FILE...``: the top-level items of FILES served by name over TCP, TLS or a
Unix socket (``interchange.md``; :func:`hurray_schema.net.serve`)."""

from __future__ import annotations

import sys

import click

from ..errors import HurraySchemaError
from .common import Bytes, fail, tls_options


def limit_options(f):
    """One option per server limit (``--handshake-timeout``, ``--max-inflight-bytes`` ...), made from
    their declarations (:class:`hurray_schema.net.options.ServerOptions`): its unit, what it bounds, its
    default."""
    import attrs

    from ..net.options import ServerOptions, shown_default

    for field in reversed(attrs.fields(ServerOptions)):
        meta = field.metadata
        kind = {"seconds": click.FloatRange(meta["minimum"]), "bytes": Bytes(meta["minimum"]),
                "bytes/s": Bytes(meta["minimum"])}.get(meta["unit"], click.IntRange(meta["minimum"]))
        f = click.option("--" + field.name.replace("_", "-"), field.name, type=kind, default=None,
                         help=f"{meta['bounds']} (default {shown_default(field)}; {meta['unit']})")(f)
    return f


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=None, type=click.IntRange(0, 65535),
              help="TCP port; 0 picks a free one (the default, unless --unix is given alone).")
@click.option("--unix", "unix", type=click.Path(dir_okay=False), default=None,
              help="Also (or, without --port, only) listen on a Unix socket at this path: same machine, tensors "
                   "handed over as shared memory; removed on exit.")
@click.option("--unix-mode", default="600", show_default=True,
              help="Permission bits of the Unix socket file, in octal (600: this user only).")
@click.option("--memory-store", is_flag=True,
              help="Accept TENSOR_PUT into memory: each tensor in one sealed memory file that every client maps.")
@click.option("--writable", type=click.Path(file_okay=False), default=None,
              help="Accept TENSOR_PUT: validated strictly, stored atomically in this folder, then served.")
@limit_options
@click.option("--record", type=click.Path(file_okay=False), default=None,
              help="Write each connection's two directions as message streams into this folder (audit reads them).")
@click.option("--device", "devices", multiple=True, default=("cpu",), show_default=True,
              help="Advertised device (repeat); only CPU is ever available here.")
@tls_options
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Mutual TLS: refuse clients without a certificate signed by this CA.")
def serve(files, host, port, unix, unix_mode, memory_store, writable, record, devices, tls_cert, tls_key,
          tls_client_ca, **limits) -> None:
    """Serve the top-level items of FILES by name (interchange.md, over TCP, TLS or a Unix socket).

    The first line printed is `serving hurray://HOST:PORT` (hurrays:// with TLS), then
    `serving hurray+unix://PATH` for --unix; SIGTERM or SIGINT stops the server cleanly."""
    import signal

    from ..net import serve as start

    try:
        mode = int(unix_mode, 8)
    except ValueError:
        raise click.BadParameter(f"{unix_mode!r} is not an octal permission", param_hint="--unix-mode") from None
    try:
        server = start(list(files), host=host, port=port, unix=unix, unix_mode=mode, memory_store=memory_store,
                       writable=writable, record=record, devices=devices, tls_cert=tls_cert, tls_key=tls_key,
                       tls_client_ca=tls_client_ca, **limits)
    except (HurraySchemaError, OSError) as exc:
        fail(str(exc))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.request_stop())
    for url in server.urls:
        click.echo(f"serving {url}")
    sys.stdout.flush()
    try:
        while not server.wait(0.5):
            pass
    finally:
        server.close()
    click.echo("stopped", err=True)
