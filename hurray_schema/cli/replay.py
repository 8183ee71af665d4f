"""``hurray-schema replay SESSION``: play a recorded session vector at a server under test (or to a
client under test) and compare, rule by rule (:mod:`hurray_schema.conformance.replay`)."""

from __future__ import annotations

import json
import os
import sys

import click

from .common import EXIT_FINDINGS, EXIT_OK, fail

__all__ = ["replay"]


def _address(text: str):
    """``HOST:PORT`` → ``(host, port)``; anything with a ``/`` is a Unix socket path."""
    if "/" in text:
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        fail(f"--server {text!r}: give HOST:PORT or the path of a Unix socket")
    return host or "127.0.0.1", int(port)


def _sessions(target: str) -> list[str]:
    """The sessions to replay at a server: ``target`` itself, or in a vectors folder every passing
    session and every violating one whose fault is in the client's direction (from its manifest)."""
    from ..conformance import MANIFEST

    if not os.path.isdir(target):
        return [target]
    try:
        with open(os.path.join(target, MANIFEST), encoding="utf-8") as f:
            entries = json.load(f)["vectors"]
    except (OSError, ValueError, KeyError) as exc:
        fail(f"{target}: no readable {MANIFEST}: {exc}")
    names = {e["session"] for e in entries
             if e.get("session") and e["direction"] == "client" and e["role"] in ("pass", "fail")}
    return [os.path.join(target, name) for name in sorted(names)]


def _line(result, as_json: bool) -> str:
    if as_json:
        return json.dumps({"session": result.name, "agrees": result.agrees, "same_bytes": result.same_bytes,
                           "error_codes": result.error_codes(), "differences": list(result.differences)})
    if result.agrees:
        same = "the same bytes" if result.same_bytes else "the same verdicts"
        return f"{result.name}: agrees ({same})"
    return f"{result.name}: differs\n" + "\n".join(f"  {d}" for d in result.differences)


@click.command()
@click.argument("session", type=click.Path(exists=False))
@click.option("--server", "server", metavar="HOST:PORT|SOCKET",
              help="Play the recorded client direction at this server and compare its answer.")
@click.option("--unix", "unix", metavar="SOCKET",
              help="The same server's Unix socket, for the sessions recorded over one (their names end in -unix).")
@click.option("--client-port", type=int, metavar="PORT",
              help="Listen on 127.0.0.1:PORT and play the recorded server direction to the client that connects.")
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Seconds one exchange may take.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
def replay(session: str, server, unix, client_port, timeout: float, as_json: bool) -> None:
    """Replay SESSION (a session vector's name or either of its .client.msgs / .server.msgs files;
    with --server, also a vectors folder: every session whose client direction is to be judged).

    With --server, exit 0 when every answer agrees with the recording (the same messages on the
    same streams, the same ERROR codes, the same rules found by audit), 1 otherwise.  Serve the
    folder's session.served.hrry with the options its manifest lists (sessions.server_options)."""
    from ..conformance.replay import RecordedServer, replay_at

    if (server is None) == (client_port is None):
        fail("give --server (a server under test) or --client-port (a client under test)")
    if client_port is not None:
        with RecordedServer(session, port=client_port, timeout=timeout) as played:
            click.echo(f"playing {session} to the next client on {played.address[0]}:{played.address[1]}", err=True)
            played.wait()
        return
    address, local = _address(server), unix
    differing = skipped = 0
    for name in _sessions(session):
        recorded_locally = name.endswith("-unix") or "-unix." in os.path.basename(name)
        target = local if recorded_locally else address
        if target is None:
            skipped += 1
            continue
        try:
            result = replay_at(name, target, timeout=timeout)
        except OSError as exc:
            fail(f"{name}: {exc}")
        differing += not result.agrees
        click.echo(_line(result, as_json))
    if skipped:
        click.echo(f"{skipped} session(s) recorded over a Unix socket skipped (give --unix SOCKET)", err=True)
    sys.exit(EXIT_FINDINGS if differing else EXIT_OK)
