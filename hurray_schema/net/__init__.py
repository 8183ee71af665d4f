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

from .._lazy import lazy_exports

# the server and the client, imported on first use (``audit`` needs only the checker)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {".server": ("Server", "serve"),
                                                        ".client": ("Session", "connect")})
