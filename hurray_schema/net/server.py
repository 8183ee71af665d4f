"""The transport server (``interchange.md`` § Network Transport Protocol through § Error
Handling): sessions over TCP, optionally TLS, or a Unix socket, one thread per connection.

* Every connection starts with CLIENT_HELLO; the server answers SERVER_HELLO (or ERROR and
  closes).  Then TENSOR_REQUEST (a GET), TENSOR_PUT (with ``writable``), PING, and ERROR.
* Each fault of the client's messages is the rule the :class:`~.checker.SessionChecker`
  raises, answered with ERROR: the code the spec gives for it (``MESSAGE_TOO_LARGE``,
  ``PROTOCOL_VERSION_MISMATCH``) or ``INVALID_MESSAGE``, the text naming the rule id and the
  byte offset.  A fault of the framing ends the connection (nothing after it can be trusted);
  a fault inside a well-framed payload ends only its stream.
* Every wait has a deadline and every buffer a budget (:class:`~.options.ServerOptions`, README
  § Limits and guarantees): a connection past ``max_connections`` waits for a slot until its
  handshake deadline; the hello must arrive whole by then; every later message within
  ``message_timeout`` of its first byte, plus a second per ``min_rate`` bytes; PUT data takes
  memory as it arrives, within ``max_inflight_bytes`` for the whole server.
* Data leaves a served file by ``sendfile`` (or ``pread``), never from a mapping: a file cut under
  the server gives the request an ERROR SOURCE_CHANGED, and the session goes on.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import ssl
import threading
import time
from typing import Optional, Sequence

from ..errors import HurraySchemaError, SessionError, SessionTimeout, SourceError, SpecViolation
from ..io.tensor import Composite, Tensor
from ..io.walk import strict_describer
from ..limits import DEFAULT_LIMITS, Limits
from ..rules import container as container_rules
from ..rules import session as rules
from ..rules.engine import Mode
from ..structs.session import PROTOCOL_VERSION, CapabilityFlag, ErrorCode, PrivateErrorCode, ShmMessageType
from ..structs.stream import MessageType
from ..structs.tags import DeviceTag
from . import messages as m
from .catalog import Catalog, Node, StoreFull, plan_response
from .checker import LOCAL_MARK, SHM_CLIENT_TYPES, ClosedStreams, SessionChecker, Side
from .devices import DeviceRefused, parse_devices, select_device
from .options import SERVER_SWITCHES, ServerOptions
from .shm import Segment, check_sealed, sealed_memfd
from .shm import layout as shm_layout
from .wire import Closed, Deadline, Recorder, Wire, plane_views

__all__ = ["Server", "serve", "ServerOptions", "shard_stream"]

SMALL_RESPONSE_BYTES = 64 * 1024
"""A tensor with at most this many data bytes is sent in one write (descriptor, frames and end)."""
REFUSAL_SECONDS = 2.0
"""How long a refusal may take over TLS (its handshake, then the ERROR)."""
LINGER_SECONDS = 1.0
"""How long a closing connection reads and drops what its peer still sends, so that the last ERROR
reaches it whole rather than lost to a reset (:meth:`~.wire.Wire.close`)."""
_LATE = "no slot came free before the handshake deadline"
REFUSALS_AT_ONCE = 8
"""TLS refusals under way at once; past them a refused connection is closed without a word."""

_CODE_OF_RULE = {
    rules.MESSAGE_SIZE.id: ErrorCode.MESSAGE_TOO_LARGE,
    rules.HELLO_VERSION.id: ErrorCode.PROTOCOL_VERSION_MISMATCH,
    rules.SHARD_CONSISTENCY.id: ErrorCode.SHARD_MISMATCH,
}
_CONNECTION_FAULTS = frozenset({
    container_rules.MESSAGE_TRUNCATED.id, container_rules.MESSAGE_STREAM_ID.id, rules.MESSAGE_SIZE.id, rules.HELLO_FIRST.id,
    rules.HELLO_VERSION.id, rules.CAPABILITY_RESERVED.id, rules.CAPABILITY_GPUDIRECT.id,
})
"""Faults after which the connection is closed: the framing, or a session that never started."""


class Budget:
    """Bytes the whole server holds of one kind (PUT data arrived and not stored yet): taken
    before memory is used, given back when it is freed."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Server:
    """A running server: ``url``, ``host``, ``port``; :meth:`close` (or the end of a ``with``
    block) stops it, closing every connection."""

    def __init__(self, paths: Sequence, *, host: str = "127.0.0.1", port: Optional[int] = None,
                 unix=None, unix_mode: int = 0o600, tls_cert=None, tls_key=None, tls_client_ca=None, **options):
        switches = {name: options.pop(name) for name in SERVER_SWITCHES & set(options)}
        self.options = ServerOptions.of(options)
        self.devices = parse_devices(switches.get("devices") or ("cpu",))
        self.limits: Limits = switches.get("limits") or DEFAULT_LIMITS
        self.catalog = Catalog([os.fspath(p) for p in paths], switches.get("writable"),
                               memory=bool(switches.get("memory_store")), options=self.options)
        self.record = switches.get("record")
        self.inflight = Budget(self.options.max_inflight_bytes)
        self._tls = _server_context(tls_cert, tls_key, tls_client_ca)
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._active = 0
        self._waiting: collections.deque = collections.deque()
        """``(socket, accepted at)`` of connections waiting for a slot, oldest first."""
        self._refusals = threading.BoundedSemaphore(REFUSALS_AT_ONCE)
        self._connections: set = set()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._listeners: list[socket.socket] = []
        self.host = self.port = self.unix = self.unix_url = None
        try:
            if port is not None or unix is None:
                self._listen_tcp(host, port or 0)
            if unix is not None:
                self._listen_unix(os.fspath(unix), unix_mode)
        except BaseException:
            self._close_listeners()
            self.catalog.close()
            raise
        self.urls = tuple(u for u in (self.tcp_url, self.unix_url) if u is not None)
        self.url = self.urls[0]
        self._acceptors = [threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                            name=f"hurray-accept-{i}") for i, listener in enumerate(self._listeners)]
        for acceptor in self._acceptors:
            acceptor.start()

    @property
    def tcp_url(self) -> Optional[str]:
        if self.port is None:
            return None
        scheme = "hurrays" if self._tls is not None else "hurray"
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{shown}:{self.port}"

    def _listen_tcp(self, host: str, port: int) -> None:
        listener = socket.create_server((host, port), family=_family(host), backlog=128)
        listener.settimeout(0.2)  # here, not in the thread: a close() may come before it runs
        self._listeners.append(listener)
        self.host, self.port = listener.getsockname()[:2]

    def _listen_unix(self, path: str, mode: int) -> None:
        """A Unix socket at ``path``, created with ``mode`` (0600: this user only) and removed on
        close; a stale socket file nobody listens on is replaced, anything else is refused."""
        _clear_stale_socket(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the file exists with 0600 from its first instant
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        listener.listen(128)
        listener.settimeout(0.2)
        self._listeners.append(listener)
        self.unix = path
        self.unix_url = f"hurray+unix://{path}"

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            try:
                listener.close()
            except OSError:
                pass
        if self.unix is not None:
            try:
                os.unlink(self.unix)
            except FileNotFoundError:
                pass

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Server({self.url}, {len(self.catalog.keys())} items)"

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (safe in a signal handler); :meth:`close` does the stopping."""
        self._stop_requested.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until :meth:`request_stop` or :meth:`close` was called; True once it was."""
        return self._stop_requested.wait(timeout)

    def close(self) -> None:
        """Stop accepting, end every connection (and those waiting for a slot), and wait for
        their threads (bounded)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._stop_requested.set()
        self._close_listeners()
        with self._lock:
            connections = list(self._connections)
            waiting = [sock for sock, _ in self._waiting]
            self._waiting.clear()
        for sock in waiting:
            sock.close()
        for conn in connections:
            conn.abort()
        for acceptor in self._acceptors:
            acceptor.join(timeout=5)
        for conn in connections:
            conn.thread.join(timeout=5)
        self.catalog.close()

    # --- accepting ----------------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                self._expire_waiting()
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.01)  # out of descriptors: let connections end before accepting again
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a reply's last segment leaves at once
            self._admit(sock, time.monotonic())
            self._expire_waiting()

    def _admit(self, sock: socket.socket, accepted: float) -> None:
        """A slot for ``sock`` if one is free and nobody waits; else a place in the queue; else
        SERVER_BUSY."""
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                return
            if self._active < self.options.max_connections and not self._waiting:
                self._start_locked(sock, accepted)
                return
            if len(self._waiting) < self.options.max_waiting:
                self._waiting.append((sock, accepted))
                return
        self._refuse(sock, f"the server holds max_connections connections and max_waiting "
                           f"({self.options.max_waiting}) more wait for a slot")

    def _start_locked(self, sock: socket.socket, accepted: float) -> None:
        self._active += 1
        conn = _Connection(self, sock, next(self._numbers), accepted)
        self._connections.add(conn)
        conn.thread.start()

    def _release_slot(self) -> None:
        """A connection's session is over: its slot goes to the oldest connection still waiting."""
        with self._lock:
            self._active -= 1
            late = self._give_slots_locked()
        for sock in late:
            self._refuse(sock, _LATE)

    def _ended(self, conn: "_Connection") -> None:
        """``conn``'s thread is over, its socket closed."""
        with self._lock:
            self._connections.discard(conn)

    def _give_slots_locked(self) -> list:
        """Start the waiting connections the free slots allow, oldest first; returns those whose
        handshake deadline passed while they waited (to be refused)."""
        late, now = [], time.monotonic()
        while self._waiting and self._active < self.options.max_connections and not self._stopping.is_set():
            sock, accepted = self._waiting.popleft()
            if now - accepted >= self.options.handshake_timeout:
                late.append(sock)
            else:
                self._start_locked(sock, accepted)
        return late

    def _expire_waiting(self) -> None:
        """Refuse the waiting connections whose handshake deadline passed."""
        now, late = time.monotonic(), []
        with self._lock:
            while self._waiting and now - self._waiting[0][1] >= self.options.handshake_timeout:
                late.append(self._waiting.popleft()[0])
        for sock in late:
            self._refuse(sock, _LATE)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """SERVER_BUSY instead of SERVER_HELLO, then close; over TLS after the TLS handshake (in
        a thread of its own, a few at once), so that a TLS client reads it as the refusal it is."""
        text = f"server busy: {why}"
        if self._tls is None:
            return _send_busy(sock, text)
        if not self._refusals.acquire(blocking=False):
            sock.close()
            return None

        def refuse_over_tls():
            try:
                sock.settimeout(REFUSAL_SECONDS)
                wrapped = self._tls.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                sock.close()
                return
            finally:
                self._refusals.release()
            _send_busy(wrapped, text)

        threading.Thread(target=refuse_over_tls, name="hurray-refuse", daemon=True).start()
        return None


def serve(paths: Sequence, **options) -> Server:
    """Serve the top-level items of the ``.hrry`` files ``paths`` by name; returns the running
    :class:`Server` (a context manager).  Options: ``host`` (127.0.0.1), ``port`` (0 or None: a
    free one), ``unix`` (a Unix socket path, alone or with ``port``; ``unix_mode`` 0o600),
    ``writable`` (a folder: TENSOR_PUT accepted and stored there), ``memory_store`` (PUTs held in
    memory, each in a sealed memfd that Unix-socket clients map), ``record`` (a folder:
    each connection's two directions as message streams), ``tls_cert`` / ``tls_key`` (TLS),
    ``tls_client_ca`` (mutual TLS), ``devices``, ``limits`` (the readers'), and every deadline and
    budget of :class:`~.options.ServerOptions` (README § Limits and guarantees)."""
    return Server(paths, **options)


def _clear_stale_socket(path: str) -> None:
    """Remove a socket file at ``path`` that no server listens on any more (a killed one's)."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise HurraySchemaError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except OSError:
        return
    finally:
        probe.close()
    raise HurraySchemaError(f"{path}: another server listens there")


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _server_context(cert, key, client_ca) -> Optional[ssl.SSLContext]:
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None:
        raise HurraySchemaError("TLS needs tls_cert (and tls_key unless the certificate file holds the key)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(os.fspath(cert), None if key is None else os.fspath(key))
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(os.fspath(client_ca))
    return context


def _send_busy(sock: socket.socket, why: str) -> None:
    """An ERROR before any hello (``interchange.md § Session Establishment``), then close: our
    side first (the ERROR is followed by the end of the stream), and what the client already sent
    (its hello) read and dropped, so the close does not reset the connection under the ERROR."""
    try:
        sock.settimeout(1.0)
        sock.sendall(m.message(MessageType.ERROR, 1, m.encode_error(PrivateErrorCode.SERVER_BUSY, why)))
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(False)  # drop only what has arrived: the accept loop waits for nobody
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass
    finally:
        sock.close()


# --------------------------------------------------------------------------------------
# One connection
# --------------------------------------------------------------------------------------


class _Put:
    """A TENSOR_PUT whose frames are arriving: the descriptor and its buffers being filled (memory
    the kernel gives page by page as the frames write it: a declared size alone commits none)."""

    def __init__(self, put: m.Put, desc, buffers: list):
        self.put = put
        self.desc = desc
        self.buffers = buffers


def _put_buffers(desc) -> list:
    """Uncommitted buffers of the handles' sizes (``numpy.empty``: pages come as they are written)."""
    import numpy as np

    return [memoryview(np.empty(h.byte_size, np.uint8)) for h in desc.buffers]


class _Connection:
    def __init__(self, server: Server, sock: socket.socket, number: int, accepted: float):
        self.server = server
        self.options = server.options
        self.sock = sock
        self.number = number
        self.accepted = accepted
        self.wire: Optional[Wire] = None
        self.thread = threading.Thread(target=self.run, name=f"hurray-conn-{number}", daemon=True)
        self.ended = ClosedStreams()
        """The streams this server ended with an ERROR: what still arrives on them (sent before
        the client read the ERROR) is dropped unanswered (``interchange.md § Error Handling``)."""
        self.puts: dict[int, _Put] = {}
        self.client: Optional[m.Hello] = None
        self.checker: Optional[SessionChecker] = None
        self.last_stream = 1
        self.put_keys: dict[int, str] = {}
        self.held: dict[int, int] = {}
        """Per stream, the data bytes of the item a PUT is pushing (its members so far, and the
        tensor arriving): what ``max_put_bytes`` bounds, over all the streams of the connection."""
        self.charged: dict[int, int] = {}
        """Per stream, the bytes of its PUT taken from the server's ``max_inflight_bytes``."""

    def abort(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run(self) -> None:
        try:
            self._session()
        except SessionTimeout as late:  # a deadline passed (not a silence between messages): said, if it can be
            if self.wire is not None and not self.wire.between_messages:
                self._last_word(PrivateErrorCode.TIMEOUT, str(late))
        except (Closed, SessionError, ssl.SSLError, OSError):
            pass
        except SpecViolation as fault:  # a fault of the framing: answered, then the connection ends
            self._send_error(self.last_stream, fault)
        except Exception as exc:  # never let one connection take the server down
            self._error(1, PrivateErrorCode.INTERNAL, f"internal error: {exc!r}")
        finally:
            for sid in list(self.charged):
                self._forget_item(sid)
            self.server._release_slot()  # the lingering close below holds no slot
            if self.wire is not None:
                self.wire.close(linger=0.0 if self.server._stopping.is_set() else LINGER_SECONDS)
            else:
                self.sock.close()
            self.server._ended(self)

    def _last_word(self, code: int, text: str) -> None:
        """A last ERROR before the connection closes, within a second, unless a send was cut short
        (the peer would read it as the rest of a frame)."""
        if self.wire is not None and not self.wire.send_cut:
            self.wire.end_message()
            self.wire.deadline = Deadline(1.0, what="the last ERROR")
            self._error(self.last_stream, code, text)

    def _session(self) -> None:
        sock, options = self.sock, self.options
        handshake = Deadline(options.handshake_timeout, what="the handshake (from accept to a whole CLIENT_HELLO)",
                             start=self.accepted)
        if self.server._tls is not None:
            left = handshake.remaining()
            if left <= 0:
                raise handshake.expired()
            sock.settimeout(left)  # the whole TLS handshake: Python bounds it as one call
            try:
                sock = self.sock = self.server._tls.wrap_socket(sock, server_side=True)  # refused before any message
            except socket.timeout:
                raise handshake.expired() from None
        recorder = None
        if self.server.record is not None:
            local = LOCAL_MARK if sock.family == socket.AF_UNIX else ""
            recorder = Recorder(self.server.record,
                                f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{self.number}{local}")
        wire = self.wire = Wire(sock, timeout=options.idle_timeout, recorder=recorder, incoming="client",
                                outgoing="server")
        wire.deadline = handshake
        wire.pace = (options.message_timeout, options.min_rate)
        describe = strict_describer(mode=Mode.STRICT, limits=self.server.limits, cross_machine=not wire.local)
        self.checker = SessionChecker(Side.SERVER, describe=describe, limits=self.server.limits,
                                      max_payload=options.max_message_bytes,
                                      nodes=(Tensor.bound, Composite.from_binder))
        self.checker.max_hello = options.max_hello_bytes
        if wire.local:  # the shared-memory extension, over a Unix socket only (spec-map § Interpretations)
            self.checker.private = SHM_CLIENT_TYPES
        while not self.server._stopping.is_set():
            wire.end_message()  # the next message's deadline starts with its first byte, its answer's with its own
            at, raw = wire.read_header()
            wire.drop_fds(before=at)  # descriptors no message took (a peer's strays)
            kind, sid, plen = m.unpack_header(raw)
            self.last_stream = sid
            try:
                kind, sid, plen = self.checker.header(raw, at)
            except SpecViolation as fault:
                if self._ends_connection(fault):
                    raise
                self._refuse_message(sid, fault, plen)
                continue
            if self.ended.covers(sid):
                wire.discard(plen)  # in flight when this server ended the stream: dropped unanswered
            else:
                self._dispatch(kind, sid, plen, at)
            if self.client is not None:
                wire.deadline = None  # the handshake is over

    # --- dispatch -----------------------------------------------------------------------
    def _dispatch(self, kind, sid: int, plen: int, at: int) -> None:
        if kind == MessageType.TENSOR_DATA:
            return self._put_frame(sid, plen, at)
        if kind == MessageType.TENSOR_DATA_END:
            return self._put_end(sid, plen, at)
        payload = self.wire.read(plen)
        try:
            if kind == MessageType.CLIENT_HELLO:
                return self._hello(payload, at)
            if kind == MessageType.TENSOR_REQUEST:
                return self._get(sid, self.checker.request(sid, payload, at))
            if kind == MessageType.TENSOR_PUT:
                return self._put(sid, payload, at)
            if kind == ShmMessageType.SHM_REQUEST:
                return self._get(sid, self.checker.request(sid, payload, at), shared=True)
            if kind == ShmMessageType.SHM_PUT:
                return self._shm_put(sid, payload, at)
            if kind == MessageType.PING:
                return self.wire.send(MessageType.PONG, sid, bytes(payload))
            if kind == MessageType.ERROR:
                self.checker.error(sid, payload, at)
                self._drop_put(sid)
                return None
        except SpecViolation as fault:
            if self._ends_connection(fault):
                raise
            self._send_error(sid, fault)
            return None
        return None  # PONG: nothing to answer

    def _refuse_message(self, sid: int, fault: SpecViolation, n: int) -> None:
        """A well-framed message of a kind this server refuses: ERROR names its header's fault,
        then its ``n`` payload bytes are skipped.  A payload cut short ends the connection without
        a second ERROR on the stream (``interchange.md § Error Handling``).  On a stream this server
        ended already, nothing is answered (:meth:`_error`)."""
        self._send_error(sid, fault)
        try:
            self.wire.discard(n)
        except SpecViolation:
            raise Closed("the connection ended inside a refused message") from None

    def _ends_connection(self, fault: SpecViolation) -> bool:
        """A fault of the framing, or any fault before the session started: a CLIENT_HELLO this
        server cannot take is answered with ERROR and the connection closed (``interchange.md
        § Session Establishment``); nothing after it has a session to belong to."""
        return fault.rule_id in _CONNECTION_FAULTS or self.client is None

    def _hello(self, payload, at: int) -> None:
        self.client = self.checker.client_hello(payload, at)
        catalog = self.server.catalog
        caps = CapabilityFlag.TRANSCODING | CapabilityFlag.PARALLEL_STREAMS
        hello = m.Hello(min(PROTOCOL_VERSION, self.client.protocol_version), self.options.max_message_bytes, int(caps),
                        m.layout_entries(catalog.layouts()), tuple(int(d) for d in self.server.devices), (0,))
        self.wire.send(MessageType.SERVER_HELLO, 1 if self.last_stream == 0 else self.last_stream,
                       m.encode_hello(hello, server=True))

    # --- GET ----------------------------------------------------------------------------
    def _get(self, sid: int, request: m.Request, *, shared: bool = False) -> None:
        try:
            found = self.server.catalog.acquire(request.key)
        except SourceError as exc:
            return self._error(sid, PrivateErrorCode.SOURCE_CHANGED, str(exc))
        if found is None:
            return self._error(sid, ErrorCode.UNKNOWN_TENSOR, f"no tensor is served by the key {request.key!r}")
        item, holder = found
        try:
            return self._answer(sid, request, item, holder, shared)
        except SourceError as exc:  # the served file was cut or changed under this response
            return self._error(sid, PrivateErrorCode.SOURCE_CHANGED, f"{request.key!r}: {exc}")
        finally:
            self.server.catalog.release(holder)

    def _answer(self, sid: int, request: m.Request, item, holder, shared: bool) -> None:
        try:
            placed = select_device(request.device, self.client.devices, self.server.devices)
        except DeviceRefused as refused:
            return self._error(sid, ErrorCode.DEVICE_UNAVAILABLE, str(refused))
        options = self.options
        answer = plan_response(
            item, holder, request, transcoding=True, transcode_limit=options.transcode_limit,
            parallel=not shared, parallel_shards=options.parallel_shards, parallel_min_bytes=options.parallel_min_bytes)
        limit = min(self.client.max_message_size, options.frame_bytes + m.DATA_HEADER_SIZE)
        too_big = max(len(n.descriptor) for n in answer.nodes) + m.TRANSPORT_SIZE
        if too_big > self.client.max_message_size or limit <= m.DATA_HEADER_SIZE:
            return self._error(sid, ErrorCode.MESSAGE_TOO_LARGE,
                               f"a {too_big}-byte TENSOR_DESCRIPTOR exceeds the client's max_message_size "
                               f"{self.client.max_message_size}")
        assert placed == DeviceTag.CPU  # this server places every buffer in host memory
        if shared:
            for node in answer.nodes:
                self._send_shared(sid, node, holder)
        elif answer.parallel:
            self._send_shards(sid, answer.nodes, limit - m.DATA_HEADER_SIZE)
        else:
            for node in answer.nodes:
                self._send_node(sid, node, limit - m.DATA_HEADER_SIZE)
        return None

    def _send_node(self, sid: int, node: Node, frame: int) -> None:
        """``interchange.md § Ordering Invariant``: descriptor, frames, end; a small tensor's
        messages in one write."""
        wire = self.wire
        head = m.message(MessageType.TENSOR_DESCRIPTOR, sid,
                         node.descriptor + m.transport_fields(node.total, node.shard_index, node.total_shards))
        end = m.message(MessageType.TENSOR_DATA_END, sid)
        if node.total <= SMALL_RESPONSE_BYTES:
            parts = [head]
            for offset, pieces in node.frames(frame):
                parts.append(m.data_header(sid, offset, sum(_size(p) for p in pieces)))
                parts.extend(pieces)
            return wire.send_together(parts + [end])
        wire.send_together([head])
        for offset, pieces in node.frames(frame):
            wire.send_frame(sid, offset, pieces)
        wire.send_together([end])
        return None

    def _send_shared(self, sid: int, node: Node, holder) -> None:
        """A tensor as shared memory (our extension, ``interchange.md § IPC``): its descriptor,
        SHM_DATA with a sealed memfd holding its buffers passed beside it, TENSOR_DATA_END.  A
        tensor of a served file goes as a copy the catalog keeps (a file could shrink under the
        client's mapping), or as the file itself when larger than that cache; one in no file (a
        transcoded one) is copied into a sealed memfd first."""
        wire = self.wire
        fd, ranges, close = _segment_of(node, holder, self.server.catalog) if node.total else (None, (), False)
        try:
            wire.send_together([m.message(MessageType.TENSOR_DESCRIPTOR, sid,
                                          node.descriptor + m.transport_fields(node.total))])
            if fd is not None:
                wire.send_with_fd(ShmMessageType.SHM_DATA, sid, m.encode_shm_data(ranges), fd)
        finally:
            if close:
                os.close(fd)  # the client holds its own descriptor now
        wire.send_together([m.message(MessageType.TENSOR_DATA_END, sid)])

    def _send_shards(self, sid: int, nodes, frame: int) -> None:
        """Each shard on a stream of its own (``sid``, ``sid + 1``, ...), their frames
        interleaved (``interchange.md § Parallel Transfer Flow``).  A file cut meanwhile ends every
        shard stream still open with ERROR SOURCE_CHANGED."""
        wire = self.wire
        streams = [shard_stream(sid, i) for i in range(len(nodes))]
        pending = []
        for stream, node in zip(streams, nodes):
            wire.send(MessageType.TENSOR_DESCRIPTOR, stream,
                      node.descriptor + m.transport_fields(node.total, node.shard_index, node.total_shards))
            pending.append((stream, node.frames(frame)))
        while pending:
            still = []
            for i, (stream, frames) in enumerate(pending):
                step = next(frames, None)
                if step is None:
                    wire.send(MessageType.TENSOR_DATA_END, stream)
                    continue
                try:
                    wire.send_frame(stream, *step)
                except SourceError as exc:
                    for other, _ in still + [(stream, frames)] + pending[i + 1:]:
                        self._error(other, PrivateErrorCode.SOURCE_CHANGED, str(exc))
                    return
                still.append((stream, frames))
            pending = still

    # --- PUT ----------------------------------------------------------------------------
    def _put(self, sid: int, payload, at: int) -> None:
        put, part = self.checker.put(sid, payload, at)  # a fault: its ERROR ends the stream and the item
        refusal = self._put_refusal(sid, put, part)
        if refusal is None:
            try:
                buffers = _put_buffers(part.value)
            except MemoryError:
                refusal = (PrivateErrorCode.SERVER_BUSY, f"no memory for a {put.total_data_bytes}-byte PUT now")
        if refusal is not None:
            return self._error(sid, *refusal)
        self.puts[sid] = _Put(put, part.value, buffers)
        self.held[sid] = self.held.get(sid, 0) + put.total_data_bytes
        return None

    def _put_refusal(self, sid: int, put: m.Put, part) -> Optional[tuple]:
        """Why this server does not accept the PUT (``session.put.accepted``), or None."""
        held = sum(self.held.values())
        catalog, options, binders = self.server.catalog, self.options, self.checker.binders
        refusal = None
        if not catalog.writable:
            refusal = (PrivateErrorCode.PUT_REFUSED, "this server was not started with a writable store")
        elif put.key in catalog.read_only and sid not in binders:
            refusal = (PrivateErrorCode.PUT_REFUSED, f"{put.key!r} names a served file's item, which is read-only")
        elif any(b.device_tag != DeviceTag.CPU for b in part.value.buffers):
            refusal = (ErrorCode.DEVICE_UNAVAILABLE, "this server accepts tensors in CPU memory only")
        elif put.total_data_bytes > options.max_put_bytes:
            refusal = (PrivateErrorCode.PUT_REFUSED,
                       f"total_data_bytes {put.total_data_bytes} exceeds max_put_bytes {options.max_put_bytes}")
        elif held + put.total_data_bytes > options.max_put_bytes:
            refusal = (PrivateErrorCode.PUT_REFUSED,
                       f"total_data_bytes {put.total_data_bytes} and the {held} bytes this connection's unfinished "
                       f"PUTs hold exceed max_put_bytes {options.max_put_bytes}")
        elif sid not in binders and len(binders.keys() | self.puts.keys()) >= options.max_put_streams:
            refusal = (PrivateErrorCode.PUT_REFUSED,
                       f"this connection has max_put_streams ({options.max_put_streams}) PUT streams open")
        return refusal

    def _shm_put(self, sid: int, payload, at: int) -> None:
        """An SHM_PUT (our extension): the tensor's buffers lie in the sealed memfd passed beside it
        (laid out as :func:`~.shm.layout` lays them, and no larger), mapped here without a copy;
        its size is taken from ``max_inflight_bytes`` until the item is stored."""
        fd = self.wire.take_fd(at)
        try:
            if fd is None:
                raise rules.SHM_SEALED.violation("an SHM_PUT without a memory file passed beside it", at)
            put, part = self.checker.put(sid, payload, at, shared=True)
            refusal = self._put_refusal(sid, put, part)
            if refusal is not None:
                return self._error(sid, *refusal)
            sizes = [b.byte_size for b in part.value.buffers]
            size = check_sealed(fd, sizes, at)
            if not self._charge(sid, size):
                return self._busy(sid, size)
            segment, fd = Segment(fd, size), None
        finally:
            if fd is not None:
                os.close(fd)
        offsets, _ = shm_layout(sizes)
        views = [segment.view(o, n) for o, n in zip(offsets, sizes)]
        self.held[sid] = self.held.get(sid, 0) + put.total_data_bytes
        ranges = tuple(zip(offsets, sizes))
        return self._put_arrived(sid, put, part.value, views, (segment, ranges))

    def _charge(self, sid: int, n: int) -> bool:
        """Take ``n`` bytes of PUT ``sid`` from the server's ``max_inflight_bytes``."""
        if not self.server.inflight.take(n):
            return False
        self.charged[sid] = self.charged.get(sid, 0) + n
        return True

    def _busy(self, sid: int, n: int) -> None:
        budget = self.server.inflight
        self._drop_put(sid)  # first: what the message counts as held is what stays
        self._error(sid, PrivateErrorCode.SERVER_BUSY,
                    f"{n} more bytes of PUT data would pass max_inflight_bytes ({budget.limit}; {budget.used} held)")

    def _put_frame(self, sid: int, plen: int, at: int) -> None:
        offset = None
        if plen >= m.DATA_HEADER_SIZE:
            offset = m.unpack_offset_in_buffer(self.wire.read(m.DATA_HEADER_SIZE))
        rest = max(0, plen - m.DATA_HEADER_SIZE) if offset is not None else plen
        try:
            frames, n = self.checker.frame(sid, plen, offset, at)
        except SpecViolation as fault:
            self.wire.discard(rest)
            self._send_error(sid, fault)
            return
        if not self._charge(sid, n):
            self.wire.discard(rest)
            return self._busy(sid, n)
        pending = self.puts[sid]
        start = frames.received - n
        for view in plane_views(pending.buffers, start, n):
            self.wire.read_into(view)
        return None

    def _put_end(self, sid: int, plen: int, at: int) -> None:
        try:
            if plen:
                self.wire.discard(plen)
            frames, put = self.checker.end(sid, plen, at)
        except SpecViolation as fault:
            self._send_error(sid, fault)
            return
        pending = self.puts.pop(sid)
        return self._put_arrived(sid, put, pending.desc, pending.buffers, None)

    def _put_arrived(self, sid: int, put: m.Put, desc, buffers: list, shared) -> None:
        """A whole pushed tensor: bound by the checker (a composite's head and members on one
        stream, :meth:`~.checker.SessionChecker.bind_put`), and once its item is whole, stored;
        each PUT is acknowledged (``interchange.md § TENSOR_PUT Flow``).  ``shared``: the client's
        segment and the buffers' ranges in it (an SHM_PUT)."""
        if sid not in self.checker.binders:  # the stream's first PUT: its key names the item (a composite's head)
            self.put_keys[sid] = put.key
        try:
            done = self.checker.bind_put(sid, put, desc, buffers)
        except SpecViolation as fault:
            return self._send_error(sid, fault)
        if not done:
            return self.wire.send(MessageType.TENSOR_PUT_ACK, sid)  # a head or a member: more to come
        key = self.put_keys[sid]
        self._forget_item(sid)
        single = shared is not None and isinstance(done[0], Tensor)  # the client's segment is served as it is
        try:
            self.server.catalog.store_item(key, done[0], *((shared[0], [shared[1]]) if single else ()))
        except StoreFull as exc:
            return self._error(sid, PrivateErrorCode.STORE_FULL, str(exc))
        except HurraySchemaError as exc:
            return self._error(sid, PrivateErrorCode.PUT_REFUSED, f"the tensor could not be stored: {exc}")
        except OSError as exc:
            return self._error(sid, PrivateErrorCode.PUT_REFUSED, f"the store could not be written: {exc}")
        self.wire.send(MessageType.TENSOR_PUT_ACK, sid)
        return None

    def _drop_put(self, sid: int) -> None:
        """Stream ``sid`` is over: the PUT arriving on it, and the item it was pushing, are dropped."""
        self.puts.pop(sid, None)
        self._forget_item(sid)

    def _forget_item(self, sid: int) -> None:
        """The item a PUT on ``sid`` was pushing is over (stored, refused or abandoned): the checker
        forgets its binding and frames, and what it held goes back to the server."""
        self.checker.drop_put(sid)
        self.put_keys.pop(sid, None)
        self.held.pop(sid, None)
        charged = self.charged.pop(sid, 0)
        if charged:
            self.server.inflight.give(charged)

    # --- errors -------------------------------------------------------------------------
    def _send_error(self, sid: int, fault: SpecViolation) -> None:
        code = _CODE_OF_RULE.get(fault.rule_id, ErrorCode.INVALID_MESSAGE)
        self._error(sid, code, f"[{fault.rule_id}] {fault.message} at byte {fault.offset} ({fault.citation})")

    def _error(self, sid: int, code: int, text: str) -> None:
        """ERROR on ``sid`` (``interchange.md § Error Handling``): the stream is over -- what a PUT
        on it held is given back -- and nothing more is sent on it, not even an ERROR for what
        still arrives there."""
        if self.checker is not None:
            self._drop_put(sid)
        sid = sid or 1
        if self.ended.covers(sid):
            return
        self.ended.add(sid)
        self._try_send(MessageType.ERROR, sid, m.encode_error(code, text))

    def _try_send(self, kind, sid: int, payload: bytes) -> None:
        if self.wire is None:
            return
        try:
            self.wire.send(kind, sid, payload)
        except (SessionError, OSError):
            pass


def _segment_of(node: Node, holder, catalog: Catalog) -> tuple[int, tuple, bool]:
    """``(fd, ranges, close)``: a memory file or file holding ``node``'s buffers, with each
    buffer's ``(offset, size)`` in it, and whether the caller closes ``fd`` once passed.  A held
    item's memfd goes as it is; a served file's tensor as the catalog's sealed copy, or as the file
    when the copy would not fit its cache; a tensor in neither is copied into a new sealed memfd."""
    if node.segments is not None:
        fd, ranges = node.segments
        if holder.path is None:  # a held item's memfd: sealed already
            return fd, ranges, False
        copied = catalog.shared_copy(holder, ranges)
        return (fd, ranges, False) if copied is None else (copied[0], copied[1], True)
    pieces = iter(node.pieces)
    buffers = [next(pieces) if h.byte_size else b"" for h in node.desc.buffers]
    fd, offsets, _ = sealed_memfd(buffers, name="hurray-answer")
    return fd, tuple((o, h.byte_size) for o, h in zip(offsets, node.desc.buffers)), True


def _size(piece) -> int:
    return piece[2] if isinstance(piece, tuple) else len(piece)


def shard_stream(sid: int, i: int) -> int:
    """The stream of shard ``i`` of a request on ``sid``: ``sid`` itself, then the ids after it,
    wrapping past the reserved 0 (``spec-map.md § Interpretations``)."""
    return (sid - 1 + i) % 0xFFFF_FFFF + 1
