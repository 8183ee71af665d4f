"""``hurray-schema serve FILE...``: the top-level items of FILES served by name over TCP, TLS or a
Unix socket (``interchange.md``; :func:`hurray_schema.net.serve`)."""

from __future__ import annotations

import sys

import click

from ..errors import HurraySchemaError
from .common import Bytes, fail, tls_options


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
@click.option("--max-message-bytes", type=Bytes(), default=None, help="Largest payload accepted (default 64M).")
@click.option("--transcode-limit", type=Bytes(), default=None,
              help="Largest buffer transcoding may produce (default 256M); past it the stored layout is served.")
@click.option("--idle-timeout", type=float, default=None, help="Seconds a connection may stay silent (default 60).")
@click.option("--max-connections", type=click.IntRange(1), default=None, help="Connections at once (default 64).")
@click.option("--max-put-bytes", type=Bytes(), default=None, help="Largest tensor a PUT may push (default 4G).")
@click.option("--record", type=click.Path(file_okay=False), default=None,
              help="Write each connection's two directions as message streams into this folder (audit reads them).")
@click.option("--device", "devices", multiple=True, default=("cpu",), show_default=True,
              help="Advertised device (repeat); only CPU is ever available here.")
@tls_options
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Mutual TLS: refuse clients without a certificate signed by this CA.")
def serve(files, host, port, unix, unix_mode, memory_store, writable, max_message_bytes, transcode_limit, idle_timeout,
          max_connections, max_put_bytes, record, devices, tls_cert, tls_key, tls_client_ca) -> None:
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
                       writable=writable, max_message_bytes=max_message_bytes,
                       transcode_limit=transcode_limit, idle_timeout=idle_timeout, max_connections=max_connections,
                       max_put_bytes=max_put_bytes, record=record, devices=devices, tls_cert=tls_cert,
                       tls_key=tls_key, tls_client_ca=tls_client_ca)
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
