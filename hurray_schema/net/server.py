"""The transport server (``interchange.md`` § Network Transport Protocol through § Error
Handling): sessions over TCP, optionally TLS, one thread per connection.

* Every connection starts with CLIENT_HELLO; the server answers SERVER_HELLO (or ERROR and
  closes).  Then TENSOR_REQUEST (a GET), TENSOR_PUT (with ``writable``), PING, and ERROR.
* Each fault of the client's messages is the rule the :class:`~.checker.SessionChecker`
  raises, answered with ERROR: the code the spec gives for it (``MESSAGE_TOO_LARGE``,
  ``PROTOCOL_VERSION_MISMATCH``) or ``INVALID_MESSAGE``, the text naming the rule id and the
  byte offset.  A fault of the framing ends the connection (nothing after it can be trusted);
  a fault inside a well-framed payload ends only its stream.
* Data leaves a served file by ``sendfile``; a connection that stalls past ``idle_timeout``,
  a payload over ``max_message_bytes``, a PUT over ``max_put_bytes`` and connections past
  ``max_connections`` are refused, each by its limit.
"""

from __future__ import annotations

import itertools
import os
import socket
import ssl
import threading
import time
from typing import Optional, Sequence

from ..errors import HurraySchemaError, SessionError, SpecViolation
from ..io.tensor import Composite, Tensor
from ..io.walk import strict_describer
from ..limits import DEFAULT_LIMITS, Limits
from ..rules import container as container_rules
from ..rules import session as rules
from ..rules.composite import CompositeBinder
from ..rules.engine import Mode
from ..structs.session import PROTOCOL_VERSION, CapabilityFlag, ErrorCode, PrivateErrorCode, ShmMessageType
from ..structs.stream import MessageType
from ..structs.tags import DeviceTag
from . import messages as m
from .catalog import Catalog, Node, plan_response
from .checker import LOCAL_MARK, SHM_CLIENT_TYPES, SessionChecker, Side
from .shm import Segment, check_sealed, new_segment
from .shm import layout as shm_layout
from .devices import DeviceRefused, parse_devices, select_device
from .wire import Closed, Recorder, Wire, plane_views

__all__ = ["Server", "serve", "ServerOptions", "DEFAULTS", "shard_stream"]

MiB = 1 << 20
DEFAULTS = {
    "max_message_bytes": 64 * MiB,
    "transcode_limit": 256 * MiB,
    "idle_timeout": 60.0,
    "max_connections": 64,
    "max_put_bytes": 4 << 30,
    "frame_bytes": 64 * MiB,
    "parallel_shards": 4,
    "parallel_min_bytes": 16 * MiB,
}
"""Every limit's default; each is an option of :func:`serve` and of ``hurray-schema serve``."""

SMALL_RESPONSE_BYTES = 64 * 1024
"""A tensor with at most this many data bytes is sent in one write (descriptor, frames and end)."""

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


class ServerOptions:
    """The limits and switches of one server (see :data:`DEFAULTS`)."""

    def __init__(self, **options):
        unknown = set(options) - set(DEFAULTS) - {"writable", "record", "devices", "limits", "memory_store"}
        if unknown:
            raise TypeError(f"unknown server option(s): {', '.join(sorted(unknown))}")
        for name, default in DEFAULTS.items():
            value = options.get(name)
            setattr(self, name, default if value is None else value)
        for name in ("max_message_bytes", "max_connections", "frame_bytes", "parallel_shards"):
            if int(getattr(self, name)) < 1:
                raise HurraySchemaError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_message_bytes > 0xFFFF_FFFF:
            raise HurraySchemaError("max_message_bytes must fit payload_length (uint32)")
        if self.max_message_bytes <= m.DATA_HEADER_SIZE:
            raise HurraySchemaError(f"max_message_bytes must exceed {m.DATA_HEADER_SIZE} (a data frame's header)")
        self.devices = parse_devices(options.get("devices") or ("cpu",))
        self.limits: Limits = options.get("limits") or DEFAULT_LIMITS


class Server:
    """A running server: ``url``, ``host``, ``port``; :meth:`close` (or the end of a ``with``
    block) stops it, closing every connection."""

    def __init__(self, paths: Sequence, *, host: str = "127.0.0.1", port: Optional[int] = None,
                 unix=None, unix_mode: int = 0o600, tls_cert=None, tls_key=None, tls_client_ca=None, **options):
        self.options = ServerOptions(**options)
        self.catalog = Catalog([os.fspath(p) for p in paths], options.get("writable"),
                               memory=bool(options.get("memory_store")))
        self.record = options.get("record")
        self._tls = _server_context(tls_cert, tls_key, tls_client_ca)
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._slots = threading.BoundedSemaphore(self.options.max_connections)
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
        """Stop accepting, end every connection, and wait for their threads (bounded)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._stop_requested.set()
        self._close_listeners()
        with self._lock:
            connections = list(self._connections)
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
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.01)  # out of descriptors: let connections end before accepting again
                continue
            if not self._slots.acquire(blocking=False):
                _refuse(sock, "the server holds max_connections connections")
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a reply's last segment leaves at once
            conn = _Connection(self, sock, next(self._numbers))
            with self._lock:
                self._connections.add(conn)
            conn.thread.start()

    def _ended(self, conn: "_Connection") -> None:
        with self._lock:
            self._connections.discard(conn)
        self._slots.release()


def serve(paths: Sequence, **options) -> Server:
    """Serve the top-level items of the ``.hrry`` files ``paths`` by name; returns the running
    :class:`Server` (a context manager).  Options: ``host`` (127.0.0.1), ``port`` (0 or None: a
    free one), ``unix`` (a Unix socket path, alone or with ``port``; ``unix_mode`` 0o600),
    ``writable`` (a folder: TENSOR_PUT accepted and stored there), ``memory_store`` (PUTs held in
    memory, each in a sealed memfd that Unix-socket clients map), ``record`` (a folder:
    each connection's two directions as message streams), ``tls_cert`` / ``tls_key`` (TLS),
    ``tls_client_ca`` (mutual TLS), ``devices``, and the limits of :data:`DEFAULTS`."""
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


def _refuse(sock: socket.socket, why: str) -> None:
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
    """A TENSOR_PUT whose frames are arriving: the descriptor and its buffers being filled."""

    def __init__(self, put: m.Put, desc, buffers: list):
        self.put = put
        self.desc = desc
        self.buffers = buffers


class _Connection:
    def __init__(self, server: Server, sock: socket.socket, number: int):
        self.server = server
        self.options = server.options
        self.sock = sock
        self.number = number
        self.wire: Optional[Wire] = None
        self.thread = threading.Thread(target=self.run, name=f"hurray-conn-{number}", daemon=True)
        self.refused: set[int] = set()
        self.puts: dict[int, _Put] = {}
        self.binders: dict[int, CompositeBinder] = {}
        self.client: Optional[m.Hello] = None
        self.checker: Optional[SessionChecker] = None
        self.last_stream = 1
        self.put_keys: dict[int, str] = {}
        self.held: dict[int, int] = {}
        """Per stream, the data bytes of the item a PUT is pushing (its members so far, and the
        tensor arriving): what ``max_put_bytes`` bounds, over all the streams of the connection."""

    def abort(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run(self) -> None:
        try:
            self._session()
        except (Closed, SessionError, ssl.SSLError, OSError):
            pass
        except SpecViolation as fault:  # a fault of the framing: answered, then the connection ends
            self._send_error(self.last_stream, fault)
        except Exception as exc:  # never let one connection take the server down
            self._try_send(MessageType.ERROR, 1, m.encode_error(PrivateErrorCode.INTERNAL, f"internal error: {exc!r}"))
        finally:
            if self.wire is not None:
                self.wire.close()
            else:
                self.sock.close()
            self.server._ended(self)

    def _session(self) -> None:
        sock = self.sock
        if self.server._tls is not None:
            sock.settimeout(self.options.idle_timeout)
            sock = self.sock = self.server._tls.wrap_socket(sock, server_side=True)  # refused before any message
        recorder = None
        if self.server.record is not None:
            local = LOCAL_MARK if sock.family == socket.AF_UNIX else ""
            recorder = Recorder(self.server.record,
                                f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{self.number}{local}")
        self.wire = Wire(sock, timeout=self.options.idle_timeout, recorder=recorder, incoming="client",
                         outgoing="server")
        describe = strict_describer(mode=Mode.STRICT, limits=self.options.limits, cross_machine=not self.wire.local)
        self.checker = SessionChecker(Side.SERVER, describe=describe, limits=self.options.limits,
                                      max_payload=self.options.max_message_bytes)
        if self.wire.local:  # the shared-memory extension, over a Unix socket only (spec-map § Interpretations)
            self.checker.private = SHM_CLIENT_TYPES
        while not self.server._stopping.is_set():
            at, raw = self.wire.read_header()
            kind, sid, plen = m.unpack_header(raw)
            self.last_stream = sid
            try:
                kind, sid, plen = self.checker.header(raw, at)
            except SpecViolation as fault:
                if self._ends_connection(fault):
                    raise
                self._refuse_message(sid, fault, plen)
                continue
            if sid in self.refused and kind in (MessageType.TENSOR_DATA, MessageType.TENSOR_DATA_END):
                self.wire.discard(plen)  # in flight when this server ended the stream
                if kind == MessageType.TENSOR_DATA_END:
                    self.refused.discard(sid)
                continue
            self._dispatch(kind, sid, plen, at)

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
        a second ERROR on the stream (``interchange.md § Error Handling``)."""
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
                        m.layout_entries(catalog.layouts()), tuple(int(d) for d in self.options.devices), (0,))
        self.wire.send(MessageType.SERVER_HELLO, 1 if self.last_stream == 0 else self.last_stream,
                       m.encode_hello(hello, server=True))

    # --- GET ----------------------------------------------------------------------------
    def _get(self, sid: int, request: m.Request, *, shared: bool = False) -> None:
        found = self.server.catalog.acquire(request.key)
        if found is None:
            return self._error(sid, ErrorCode.UNKNOWN_TENSOR, f"no tensor is served by the key {request.key!r}")
        item, served = found
        try:
            try:
                placed = select_device(request.device, self.client.devices, self.options.devices)
            except DeviceRefused as refused:
                return self._error(sid, ErrorCode.DEVICE_UNAVAILABLE, str(refused))
            answer = plan_response(
                item, served, request, transcoding=True, transcode_limit=self.options.transcode_limit,
                parallel=not shared, parallel_shards=self.options.parallel_shards,
                parallel_min_bytes=self.options.parallel_min_bytes)
            limit = min(self.client.max_message_size, self.options.frame_bytes + m.DATA_HEADER_SIZE)
            too_big = max(len(n.descriptor) for n in answer.nodes) + 16
            if too_big > self.client.max_message_size or limit <= m.DATA_HEADER_SIZE:
                return self._error(sid, ErrorCode.MESSAGE_TOO_LARGE,
                                   f"a {too_big}-byte TENSOR_DESCRIPTOR exceeds the client's max_message_size "
                                   f"{self.client.max_message_size}")
            assert placed == DeviceTag.CPU  # this server places every buffer in host memory
            if shared:
                for node in answer.nodes:
                    self._send_shared(sid, node)
            elif answer.parallel:
                self._send_shards(sid, answer.nodes, limit - m.DATA_HEADER_SIZE)
            else:
                for node in answer.nodes:
                    self._send_node(sid, node, limit - m.DATA_HEADER_SIZE)
        finally:
            self.server.catalog.release(served)
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

    def _send_shared(self, sid: int, node: Node) -> None:
        """A tensor as shared memory (our extension, ``interchange.md § IPC``): its descriptor,
        SHM_DATA with the file or memfd its buffers lie in passed beside it, TENSOR_DATA_END.  A
        tensor in no such file (a transcoded one) is copied into a sealed memfd first."""
        wire = self.wire
        wire.send_together([m.message(MessageType.TENSOR_DESCRIPTOR, sid,
                                      node.descriptor + m.transport_fields(node.total))])
        if node.total:
            fd, ranges, segment = _segment_of(node)
            try:
                wire.send_with_fd(ShmMessageType.SHM_DATA, sid, m.encode_shm_data(ranges), fd)
            finally:
                if segment is not None:
                    segment.close()  # the client holds its own descriptor now
        wire.send_together([m.message(MessageType.TENSOR_DATA_END, sid)])

    def _send_shards(self, sid: int, nodes, frame: int) -> None:
        """Each shard on a stream of its own (``sid``, ``sid + 1``, ...), their frames
        interleaved (``interchange.md § Parallel Transfer Flow``)."""
        wire = self.wire
        streams = [shard_stream(sid, i) for i in range(len(nodes))]
        pending = []
        for stream, node in zip(streams, nodes):
            wire.send(MessageType.TENSOR_DESCRIPTOR, stream,
                      node.descriptor + m.transport_fields(node.total, node.shard_index, node.total_shards))
            pending.append((stream, node.frames(frame)))
        while pending:
            still = []
            for stream, frames in pending:
                step = next(frames, None)
                if step is None:
                    wire.send(MessageType.TENSOR_DATA_END, stream)
                else:
                    wire.send_frame(stream, *step)
                    still.append((stream, frames))
            pending = still

    # --- PUT ----------------------------------------------------------------------------
    def _put(self, sid: int, payload, at: int) -> None:
        try:
            put, part = self.checker.put(sid, payload, at)
        except SpecViolation:
            self._forget_item(sid)
            self.refused.add(sid)  # its frames and TENSOR_DATA_END are in flight: dropped, not answered again
            raise
        refusal = self._put_refusal(sid, put, part)
        if refusal is not None:
            self.checker.tensors.pop(sid, None)
            self.checker.puts.pop(sid, None)
            self._forget_item(sid)
            self.refused.add(sid)
            return self._error(sid, *refusal)
        buffers = [bytearray(b.byte_size) for b in part.value.buffers]
        self.puts[sid] = _Put(put, part.value, buffers)
        self.held[sid] = self.held.get(sid, 0) + put.total_data_bytes
        return None

    def _put_refusal(self, sid: int, put: m.Put, part) -> Optional[tuple]:
        """Why this server does not accept the PUT (``session.put.accepted``), or None."""
        held = sum(self.held.values())
        refusal = None
        if not self.server.catalog.writable:
            refusal = (PrivateErrorCode.PUT_REFUSED, "this server was not started with a writable store")
        elif put.key in self.server.catalog.read_only and sid not in self.binders:
            refusal = (PrivateErrorCode.PUT_REFUSED, f"{put.key!r} names a served file's item, which is read-only")
        elif any(b.device_tag != DeviceTag.CPU for b in part.value.buffers):
            refusal = (ErrorCode.DEVICE_UNAVAILABLE, "this server accepts tensors in CPU memory only")
        elif put.total_data_bytes > self.options.max_put_bytes:
            refusal = (PrivateErrorCode.PUT_REFUSED,
                       f"total_data_bytes {put.total_data_bytes} exceeds max_put_bytes {self.options.max_put_bytes}")
        elif held + put.total_data_bytes > self.options.max_put_bytes:
            refusal = (PrivateErrorCode.PUT_REFUSED,
                       f"total_data_bytes {put.total_data_bytes} and the {held} bytes this connection's unfinished "
                       f"PUTs hold exceed max_put_bytes {self.options.max_put_bytes}")
        return refusal

    def _shm_put(self, sid: int, payload, at: int) -> None:
        """An SHM_PUT (our extension): the tensor's buffers lie in the sealed memfd passed beside it
        (laid out as :func:`~.shm.layout` lays them), mapped here without a copy."""
        fd = self.wire.take_fd()
        try:
            if fd is None:
                raise rules.SHM_SEALED.violation("an SHM_PUT without a memory file passed beside it", at)
            put, part = self.checker.put(sid, payload, at, shared=True)
            refusal = self._put_refusal(sid, put, part)
            if refusal is not None:
                self._forget_item(sid)
                return self._error(sid, *refusal)
            size = check_sealed(fd, put.total_data_bytes, at)
            segment, fd = Segment(fd, size), None
        finally:
            if fd is not None:
                os.close(fd)
        offsets, _ = shm_layout(b.byte_size for b in part.value.buffers)
        if offsets and offsets[-1] + part.value.buffers[-1].byte_size > size:
            raise rules.SHM_SEALED.violation(f"the memory file holds {size} bytes, its buffers need more", at)
        views = [segment.view(o, b.byte_size) for o, b in zip(offsets, part.value.buffers)]
        self.held[sid] = self.held.get(sid, 0) + put.total_data_bytes
        ranges = tuple((o, b.byte_size) for o, b in zip(offsets, part.value.buffers))
        return self._put_arrived(sid, put, part.value, views, (segment, ranges))

    def _put_frame(self, sid: int, plen: int, at: int) -> None:
        offset = None
        if plen >= m.DATA_HEADER_SIZE:
            offset = m.unpack_offset_in_buffer(self.wire.read(m.DATA_HEADER_SIZE))
        try:
            frames, n = self.checker.frame(sid, plen, offset, at)
        except SpecViolation as fault:
            self.wire.discard(max(0, plen - m.DATA_HEADER_SIZE) if offset is not None else plen)
            self._abandon_put(sid, fault)
            return
        pending = self.puts[sid]
        start = frames.received - n
        for view in plane_views(pending.buffers, start, n):
            self.wire.read_into(view)

    def _put_end(self, sid: int, plen: int, at: int) -> None:
        try:
            if plen:
                self.wire.discard(plen)
            frames, put = self.checker.end(sid, plen, at)
        except SpecViolation as fault:
            self._abandon_put(sid, fault)
            return
        pending = self.puts.pop(sid)
        return self._put_arrived(sid, put, pending.desc, [memoryview(b) for b in pending.buffers], None)

    def _put_arrived(self, sid: int, put: m.Put, desc, buffers: list, shared) -> None:
        """A whole pushed tensor: bound (a composite's head and members on one stream), and once
        its item is whole, stored; each PUT is acknowledged (``interchange.md § TENSOR_PUT Flow``).
        ``shared``: the client's segment and the buffers' ranges in it (an SHM_PUT)."""
        binder = self.binders.get(sid)
        if binder is None:  # the stream's first PUT: its key names the item (a composite's head)
            binder = self.binders[sid] = CompositeBinder(mode=Mode.STRICT, validate=True, leaf=Tensor.bound,
                                                         assemble=Composite.from_binder)
            self.put_keys[sid] = put.key
        try:
            done = binder.add(desc, put.descriptor_at, buffers)
        except SpecViolation as fault:
            self._forget_item(sid)
            return self._send_error(sid, fault)
        if not done:
            return self.wire.send(MessageType.TENSOR_PUT_ACK, sid)  # a head or a member: more to come
        key = self.put_keys[sid]
        self._forget_item(sid)
        single = shared is not None and isinstance(done[0], Tensor)  # the client's segment is served as it is
        try:
            self.server.catalog.store_item(key, done[0], *((shared[0], [shared[1]]) if single else ()))
        except HurraySchemaError as exc:
            return self._error(sid, PrivateErrorCode.PUT_REFUSED, f"the tensor could not be stored: {exc}")
        except OSError as exc:
            return self._error(sid, PrivateErrorCode.PUT_REFUSED, f"the store could not be written: {exc}")
        self.wire.send(MessageType.TENSOR_PUT_ACK, sid)
        return None

    def _abandon_put(self, sid: int, fault: SpecViolation) -> None:
        self._drop_put(sid)
        self.refused.add(sid)
        self._send_error(sid, fault)

    def _drop_put(self, sid: int) -> None:
        self.puts.pop(sid, None)
        self._forget_item(sid)
        self.checker.tensors.pop(sid, None)
        self.checker.puts.pop(sid, None)

    def _forget_item(self, sid: int) -> None:
        """The item a PUT on ``sid`` was pushing is over (stored, refused or abandoned)."""
        self.binders.pop(sid, None)
        self.put_keys.pop(sid, None)
        self.held.pop(sid, None)

    # --- errors -------------------------------------------------------------------------
    def _send_error(self, sid: int, fault: SpecViolation) -> None:
        code = _CODE_OF_RULE.get(fault.rule_id, ErrorCode.INVALID_MESSAGE)
        self._error(sid, code, f"[{fault.rule_id}] {fault.message} at byte {fault.offset} ({fault.citation})")

    def _error(self, sid: int, code: int, text: str) -> None:
        """ERROR on ``sid`` (``interchange.md § Error Handling``): the stream is over."""
        self._try_send(MessageType.ERROR, sid or 1, m.encode_error(code, text))

    def _try_send(self, kind, sid: int, payload: bytes) -> None:
        if self.wire is None:
            return
        try:
            self.wire.send(kind, sid, payload)
        except (SessionError, OSError):
            pass


def _segment_of(node: Node):
    """``(fd, ranges, segment)``: the file or memfd ``node``'s buffers lie in, with each
    buffer's ``(offset, size)``; a tensor in none is copied into a new sealed memfd (``segment``,
    closed by the caller once passed)."""
    if node.segments is not None:
        fd, ranges = node.segments
        return fd, ranges, None
    pieces = iter(node.pieces)
    buffers = [next(pieces) if h.byte_size else b"" for h in node.desc.buffers]
    segment, offsets = new_segment(buffers, name="hurray-answer")
    return segment.fd, tuple((o, h.byte_size) for o, h in zip(offsets, node.desc.buffers)), segment


def _size(piece) -> int:
    return piece[2] if isinstance(piece, tuple) else len(piece)


def shard_stream(sid: int, i: int) -> int:
    """The stream of shard ``i`` of a request on ``sid``: ``sid`` itself, then the ids after it,
    wrapping past the reserved 0 (``spec-map.md § Interpretations``)."""
    return (sid - 1 + i) % 0xFFFF_FFFF + 1
