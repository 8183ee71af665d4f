"""The transport (``interchange.md`` § Network Transport Protocol through § Error Handling, and
§ IPC): :func:`serve` runs a server (TCP, TLS, a Unix socket), :func:`connect` opens a client
session.

* :mod:`.messages` -- session payloads to and from bytes, through their declarations;
* :mod:`.checker` -- the one checker of a received direction (server, client, audit);
* :mod:`.wire` -- a connection's socket, counted in bytes, with ``sendfile`` and recording;
* :mod:`.catalog` -- what a server serves and how a request is answered (layout selection,
  transcoding, parallel shards); :mod:`.devices` -- device negotiation;
* :mod:`.shm` -- shared memory on one machine: sealed memfds, descriptors passed over a Unix
  socket, read-only mappings;
* :mod:`.server`, :mod:`.client`.
"""

__all__ = ["Server", "Session", "connect", "serve"]

_HOMES = {"Server": "server", "serve": "server", "Session": "client", "connect": "client"}


def __getattr__(name):
    """The server and the client, imported on first use (``audit`` needs only the checker)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{home}", __name__), name)
