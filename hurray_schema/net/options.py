"""Every deadline and budget of the transport, declared once.

:class:`ServerOptions` holds a server's limits: each field carries its default, its unit, what it
bounds and what happens when it is hit.  :func:`~.server.serve` takes them as keywords,
``hurray-schema serve`` as options generated from the fields (``--handshake-timeout`` ...), and
README § Limits and guarantees is the table :func:`limits_table` prints (a test compares them).
:data:`CLIENT_LIMITS` states the client's in the same words.

Defaults tied to the machine are read from it when the options are made: a quarter of the
physical memory for the memory a server may hold of each kind, the machine's memory for what one
response may announce to a client, a quarter of the descriptor limit for the files a server keeps
open.
"""

from __future__ import annotations

import os
import resource
from typing import Optional

import attrs

from ..errors import HurraySchemaError
from ..limits import DEFAULT_MAX_MESSAGE_BYTES, HARD_MAXIMUM
from ..structs.stream import TENSOR_DATA_HEADER_SIZE
from .shm import SHARED_CHUNK_BYTES
from .wire import GROW_STEP

__all__ = ["ServerOptions", "physical_memory", "limits_table", "shown_default", "CLIENT_LIMITS", "CLIENT_TIMEOUT",
           "CLIENT_MAX_MESSAGE_BYTES", "SERVER_SWITCHES", "MiB", "GiB"]

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def physical_memory() -> int:
    """This machine's physical memory in bytes (4 GiB when the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 * GiB


def _memory_share() -> int:
    return physical_memory() // 4


def _descriptor_limit() -> int:
    """The process's descriptor limit (``ulimit -n``; 1,024 when it has none)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1024 if soft == resource.RLIM_INFINITY else soft


def _open_files_share() -> int:
    return max(16, min(256, _descriptor_limit() // 4))


def _option(default, unit: str, bounds: str, when_hit: str, *, shown: Optional[str] = None, minimum=0):
    """A limit: ``default`` (or a factory of the machine's value), its ``unit`` ("seconds",
    "bytes", "bytes/s", "count"), what it ``bounds`` and what happens ``when_hit``; ``shown`` is the
    default as the README states it."""
    meta = {"unit": unit, "bounds": bounds, "when_hit": when_hit, "shown": shown, "minimum": minimum}
    if callable(default):
        return attrs.field(factory=default, metadata=meta, converter=_number(unit))
    return attrs.field(default=default, metadata=meta, converter=_number(unit))


def _number(unit: str):
    def convert(value):
        if value is None:
            return None
        return float(value) if unit == "seconds" else int(value)
    return convert


@attrs.frozen(slots=True, kw_only=True)
class ServerOptions:
    """A server's limits (see the module docstring); ``None`` for a field means its default."""

    # --- connections and deadlines -----------------------------------------------------
    max_connections: int = _option(
        64, "count", "Sessions served at once.",
        "A connection past it waits for a slot, in arrival order, until its handshake deadline; then it gets "
        "ERROR SERVER_BUSY (0xF0) instead of SERVER_HELLO.", minimum=1)
    max_waiting: int = _option(
        256, "count", "Connections waiting for a slot.",
        "A connection past it gets ERROR SERVER_BUSY at once (over TLS, after the TLS handshake).", minimum=0)
    handshake_timeout: float = _option(
        10.0, "seconds", "From a connection's accept to its whole CLIENT_HELLO: the wait for a slot, the TLS "
        "handshake and the hello's bytes, however they trickle.",
        "ERROR SERVER_BUSY if it is still waiting for a slot, else ERROR TIMEOUT (0xF3); the connection is "
        "closed.", minimum=0.001)
    message_timeout: float = _option(
        30.0, "seconds", "From a message's first byte to its last, plus one second per `min_rate` bytes it has "
        "moved; the same for an answer, from its first byte sent.",
        "ERROR TIMEOUT (0xF3); the connection is closed.", minimum=0.001)
    min_rate: int = _option(
        64 * KiB, "bytes/s", "The pace that extends a message's deadline (see `message_timeout`).",
        "See `message_timeout`.", minimum=1)
    idle_timeout: float = _option(
        60.0, "seconds", "A wait with nothing moving: between two messages, or within one.",
        "The connection is closed (between messages without a word, within one after ERROR TIMEOUT).",
        minimum=0.001)
    # --- memory --------------------------------------------------------------------------
    max_hello_bytes: int = _option(
        64 * KiB, "bytes", "A CLIENT_HELLO's payload (its layouts, devices and memory classes).",
        "ERROR MESSAGE_TOO_LARGE (`session.message.size`); the connection is closed.", minimum=1)
    max_message_bytes: int = _option(
        DEFAULT_MAX_MESSAGE_BYTES, "bytes", "Any other payload: the `max_message_size` SERVER_HELLO advertises. A payload's "
        f"buffer grows with the bytes that arrive, from {GROW_STEP >> 10} KiB.",
        "ERROR MESSAGE_TOO_LARGE (`session.message.size`); the connection is closed.",
        minimum=TENSOR_DATA_HEADER_SIZE + 1)
    max_put_bytes: int = _option(
        4 * GiB, "bytes", "The data one connection's unfinished PUTs declare, all their streams together.",
        "ERROR PUT_REFUSED (0xF1) on the PUT's stream.", minimum=1)
    max_put_streams: int = _option(
        64, "count", "PUT streams one connection has open at once (a composite's stays open until its last "
                     "member).",
        "ERROR PUT_REFUSED on the new PUT's stream.", minimum=1)
    max_inflight_bytes: int = _option(
        _memory_share, "bytes", "PUT data that has arrived and is not stored yet, all connections together "
        "(memory is taken frame by frame as the bytes arrive, never for a declared size).",
        "ERROR SERVER_BUSY on the PUT's stream; the PUT is dropped and what it held given back.",
        shown="¼ of physical memory", minimum=1)
    transcode_limit: int = _option(
        256 * MiB, "bytes", "The output of one transcoding, and the memory the evaluation making it may take.",
        "The next preferred layout, or the stored one, is served (`session.transcode.limit`).", minimum=0)
    # --- stores and files ----------------------------------------------------------------
    store_max_items: Optional[int] = _option(
        None, "count", "Keys a `--memory-store` or `--writable` store holds.",
        "ERROR STORE_FULL (0xF4) on the PUT's stream; the store is unchanged.",
        shown="½ of the descriptor limit (`--memory-store`: a memory file each), 100,000 (`--writable`)", minimum=1)
    store_max_bytes: Optional[int] = _option(
        None, "bytes", "Bytes a store holds: the memory files of `--memory-store` (their real size), the "
        "files of `--writable`.",
        "ERROR STORE_FULL on the PUT's stream; the store is unchanged.",
        shown="¼ of physical memory (`--memory-store`), 1 TiB (`--writable`)", minimum=1)
    max_open_files: int = _option(
        _open_files_share, "count", "Served and stored files open at once; the others are opened on "
        "demand and the least recently used idle ones closed.",
        "The least recently used file no response reads is closed.", shown="256 (at most ¼ of the "
        "descriptor limit)", minimum=1)
    shm_cache_bytes: int = _option(
        _memory_share, "bytes", f"Sealed memory files holding copies of served files, by chunks of "
        f"{SHARED_CHUNK_BYTES >> 20} MiB (a tensor crossing a chunk's end on its own), handed to shared-memory "
        "clients: a served file itself is never handed out (it could shrink under their mappings).",
        "The least recently used copy is dropped (clients keep their mappings); a tensor larger than the "
        "cache goes as the file's descriptor, which a client copies from unless it trusts the server's files.",
        shown="¼ of physical memory", minimum=0)
    # --- the data plane ------------------------------------------------------------------
    frame_bytes: int = _option(64 * MiB, "bytes", "Data bytes of one TENSOR_DATA frame sent.", "Frames are cut "
                               "there.", minimum=1)
    parallel_shards: int = _option(4, "count", "Shards of a parallel transfer.", "—", minimum=1)
    parallel_min_bytes: int = _option(16 * MiB, "bytes", "Smallest tensor sent in shards.", "—", minimum=0)

    def __attrs_post_init__(self):
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if value is not None and value < field.metadata["minimum"]:
                raise HurraySchemaError(f"{field.name} must be at least {field.metadata['minimum']}, not {value}")
        if self.max_message_bytes > HARD_MAXIMUM["max_message_bytes"]:
            raise HurraySchemaError("max_message_bytes must fit payload_length (uint32)")

    @classmethod
    def of(cls, options: dict) -> "ServerOptions":
        """The options named in ``options`` (None: the default); an unknown name is a ``TypeError``."""
        names = {f.name for f in attrs.fields(cls)}
        unknown = set(options) - names
        if unknown:
            raise TypeError(f"unknown server option(s): {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in options.items() if v is not None})

    def store_bytes(self, memory: bool) -> int:
        """The store's byte limit: the one given, else the default of its kind."""
        if self.store_max_bytes is not None:
            return self.store_max_bytes
        return _memory_share() if memory else TiB

    def store_items(self, memory: bool) -> int:
        """The store's item limit: the one given, else the default of its kind (a memory store holds a
        descriptor per item)."""
        if self.store_max_items is not None:
            return self.store_max_items
        return max(1, _descriptor_limit() // 2) if memory else 100_000


SERVER_SWITCHES = frozenset({"writable", "record", "devices", "limits", "memory_store"})
""":func:`~.server.serve`'s keywords that are not limits."""

CLIENT_TIMEOUT = 30.0
"""A client's default ``timeout``: seconds one call may take as a whole."""
CLIENT_MAX_MESSAGE_BYTES = 256 * MiB
"""The largest payload a client accepts by default: a data frame of up to 256 MiB."""

CLIENT_LIMITS = (
    ("timeout", "seconds", f"{CLIENT_TIMEOUT:g} s", "One call of a session as a whole (`connect`, `get`, `put`, "
     "`ping`): PINGs and trickled bytes do not extend it.", "`SessionTimeout`; the session is closed (a reply may be "
     "half-read)."),
    ("max_message_bytes", "bytes", f"{CLIENT_MAX_MESSAGE_BYTES >> 20} MiB", "A payload the client accepts (its "
     "`max_message_size`); a payload's buffer grows with the bytes that arrive.", "`SpecViolation` `session.message.size`; the "
     "session is closed."),
    ("max_response_bytes", "bytes", "the machine's physical memory", "The data one response announces, checked "
     "before anything is allocated.", "`LimitExceeded`; the session is closed."),
    ("trust_server_files", "—", "False", "Over shared memory, map the server's files as they are (a sealed "
     "memory file is always mapped: it cannot shrink).", "Off: a segment that is not a sealed memory file is "
     "copied with `pread`, and one that comes up short is a typed error."),
)
"""The client's bounds, as :func:`limits_table` prints them: ``(name, unit, default, bounds, when_hit)``."""


def shown_default(field) -> str:
    """A limit's default as the README and ``--help`` state it."""
    shown = field.metadata["shown"]
    if shown is not None:
        return shown
    value, unit = field.default, field.metadata["unit"]
    if unit in ("bytes", "bytes/s"):
        for size, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
            if value >= size and value % size == 0:
                return f"{value // size} {name}" + ("/s" if unit == "bytes/s" else "")
    if unit == "seconds":
        return f"{value:g} s"
    return f"{value:,}"


def limits_table() -> str:
    """README § Limits and guarantees' tables: the server's options, then the client's."""
    rows = ["| Server option | Default | Bounds | When it is hit |", "|---|---|---|---|"]
    for field in attrs.fields(ServerOptions):
        flag = "--" + field.name.replace("_", "-")
        rows.append(f"| `{field.name}` (`{flag}`) | {shown_default(field)} | {field.metadata['bounds']} "
                    f"| {field.metadata['when_hit']} |")
    rows += ["", "| Client option | Default | Bounds | When it is hit |", "|---|---|---|---|"]
    for name, _unit, default, bounds, when_hit in CLIENT_LIMITS:
        rows.append(f"| `{name}` | {default} | {bounds} | {when_hit} |")
    return "\n".join(rows) + "\n"
