"""The transport client: :func:`connect` opens a session (``interchange.md`` § Session
Establishment), :meth:`Session.get` requests a tensor and :meth:`Session.put` pushes one.

What arrives is checked as it arrives, by the rules every reader of this project runs: the
session's (:class:`~.checker.SessionChecker`), each tensor's messages
(:class:`~hurray_schema.io.walk.TensorFrames`), each descriptor (the readers' strict decode)
and each composite (the one binder, :class:`~hurray_schema.rules.composite.CompositeBinder`).
A data frame is read from the socket straight into the buffer it fills, each buffer aligned to
``min_alignment``; nothing is copied after the kernel's copy into user space.

Violations raise :class:`~hurray_schema.errors.SpecViolation` with the offset of the fault
in what this client received (its first byte is offset 0), after which the session is closed:
nothing it receives afterwards could be trusted.  An ERROR from the server raises its typed
:class:`~hurray_schema.errors.RemoteError` and leaves the session open.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import ssl
import urllib.parse
from typing import Optional, Sequence

import attrs

from ..errors import HurraySchemaError, LimitExceeded, RemoteError, SessionError, SpecViolation
from ..io.tensor import Composite, Item, Tensor, walk
from ..io.walk import strict_describer
from ..limits import HARD_MAXIMUM, Limits, resolve_limits
from ..model import TensorDescriptor
from ..rules import container as container_rules
from ..rules import session as rules
from ..rules.composite import CompositeBinder
from ..rules.engine import Mode
from ..structs.descriptor import MIN_BUFFER_ALIGNMENT
from ..structs.session import PROTOCOL_VERSION, CapabilityFlag, ErrorCode, RequestFlag, ShmMessageType
from ..structs.stream import MessageType
from ..structs.tags import LayoutTag
from . import messages as m
from .checker import LOCAL_MARK, SHM_SERVER_TYPES, PushJudge, SessionChecker, Side, check_min_alignment, message_name
from .devices import parse_devices
from .options import CLIENT_MAX_MESSAGE_BYTES, CLIENT_TIMEOUT, physical_memory
from .shm import Mappings, is_sealed, read_ranges_into, sealed_memfd
from .wire import Closed, Deadline, Recorder, Wire, plane_views

__all__ = ["Session", "connect", "parse_url"]

_SCHEMES = {"hurray": False, "hurrays": True}


UNIX_SCHEME = "hurray+unix://"


def parse_url(url: str) -> tuple[str, Optional[int], bool]:
    """``(host, port, tls)`` of ``hurray://host:port`` or ``hurrays://host:port``; ``(path, None,
    False)`` of ``hurray+unix://PATH`` (the rest of the URL is the socket's path)."""
    if url.startswith(UNIX_SCHEME):
        path = urllib.parse.unquote(url[len(UNIX_SCHEME):])
        if not path:
            raise HurraySchemaError(f"{url!r}: a hurray+unix URL names the socket's path (hurray+unix:///run/x.sock)")
        return path, None, False
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise HurraySchemaError(f"{url!r}: the scheme must be hurray://, hurrays:// or hurray+unix://")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise HurraySchemaError(f"{url!r}: a URL names a host and a port (hurray://127.0.0.1:7431)")
    return parts.hostname, port, _SCHEMES[parts.scheme]


def connect(url: str, **options) -> "Session":
    """A session with the server at ``url`` (``hurray://host:port``, ``hurrays://`` for TLS, or
    ``hurray+unix://PATH``); see :class:`Session` for the options."""
    return Session(url, **options)


class Session:
    """One connection to a server, after the hellos; a context manager.

    Options: ``timeout`` (seconds each call may take as a whole -- opening the session, one
    ``get``, ``put`` or ``ping`` -- whatever the server sends meanwhile; None: no bound),
    ``max_message_bytes`` (the client's max_message_size), ``max_response_bytes`` (the most
    data one response may announce, checked before anything is allocated; by default this
    machine's physical memory), ``devices`` (advertised; ``("cpu",)``), ``layouts`` (advertised, most
    preferred first: layout tags, or :class:`~.messages.LayoutEntry` values for extension entries and
    their metadata), ``limits`` (the
    readers' :class:`~hurray_schema.limits.Limits`), ``mode`` ("strict"; "permissive" keeps what
    the spec lets a permissive reader keep), and for TLS ``tls_ca`` (the CA file that signs the
    server's certificate; the system's by default), ``tls_cert`` / ``tls_key`` (this client's,
    for mutual TLS) and ``server_hostname``; ``record`` (a folder) writes both directions as message
    streams that ``audit`` checks (``NAME.server.msgs``: what the server sent); ``shm`` (True): over a
    Unix socket, tensors arrive as read-only mappings of sealed memory files the server passes
    and PUTs go as one sealed memory file (our private extension; False: the plain frames);
    ``trust_server_files`` (False): map a segment that is not a sealed memory file too (a served
    file as it is, which could shrink under the mapping: SIGBUS) rather than copy it."""

    def __init__(self, url: str, *, timeout: Optional[float] = CLIENT_TIMEOUT,
                 max_message_bytes: int = CLIENT_MAX_MESSAGE_BYTES,
                 max_response_bytes: Optional[int] = None, devices: Sequence = ("cpu",),
                 limits: Optional[Limits] = None, mode="strict", tls_ca=None, tls_cert=None, tls_key=None,
                 server_hostname: Optional[str] = None, layouts: Sequence = (), record=None, shm: bool = True,
                 trust_server_files: bool = False):
        host, port, tls = parse_url(url)
        if not m.DATA_HEADER_SIZE < max_message_bytes <= HARD_MAXIMUM["max_message_bytes"]:
            raise HurraySchemaError("max_message_bytes must be between 9 and 4 GiB - 1")
        if timeout is not None and timeout <= 0:
            raise HurraySchemaError(f"timeout must be positive (or None), not {timeout}")
        self.url = url
        self.timeout = timeout
        self._a_call = f"a call on {url}"
        self.limits = resolve_limits(limits)
        self.mode = Mode(mode)
        self.max_response_bytes = physical_memory() if max_response_bytes is None else int(max_response_bytes)
        self.trust_server_files = bool(trust_server_files)
        self._streams = itertools.count(1)
        self._broken: Optional[BaseException] = None
        opening = None if timeout is None else Deadline(timeout, what=f"opening a session with {url}")
        sock = _open(host, port, opening) if port is not None else _open_unix(host, opening)
        try:
            if tls:
                sock = _tls_handshake(sock, _client_context(tls_ca, tls_cert, tls_key), server_hostname or host,
                                      opening)
            local = LOCAL_MARK if sock.family == socket.AF_UNIX else ""
            recorder = None if record is None else Recorder(os.fspath(record),
                                                            f"client-{os.getpid()}-{id(self):x}{local}")
            self.wire = Wire(sock, timeout=timeout, recorder=recorder, incoming="server", outgoing="client")
            describe = strict_describer(mode=self.mode, limits=self.limits, cross_machine=not self.wire.local)
            self.checker = SessionChecker(Side.CLIENT, describe=describe, limits=self.limits,
                                          max_payload=max_message_bytes)
            self.shared = bool(shm) and self.wire.local
            """Shared memory agreed: over a Unix socket with ``shm`` (spec-map § Interpretations)."""
            if self.shared:
                self.checker.private = SHM_SERVER_TYPES
            self.pushes = PushJudge(local=self.wire.local)
            """What this client pushed, judged as every server must (``session.put.accepted``)."""
            self.mappings = Mappings()
            self.hello = m.Hello(PROTOCOL_VERSION, max_message_bytes, 0, m.layout_entries(layouts),
                                 parse_devices(devices), ())
            self.wire.deadline = opening
            self.server_hello = self._handshake()
            self.wire.deadline = None
        except BaseException:
            if getattr(self, "wire", None) is not None:
                self.wire.close()  # the recording too: a refused handshake is audited like any session
            else:
                sock.close()
            raise

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._broken is None:
            self._broken = SessionError("the session is closed")
        self.wire.close()

    def __repr__(self) -> str:
        return f"Session({self.url})"

    @property
    def capabilities(self) -> CapabilityFlag:
        """What the server advertised (``interchange.md § Capability Flags``)."""
        return CapabilityFlag(self.server_hello.capability_flags)

    @property
    def server_layouts(self) -> tuple[int, ...]:
        """Layout tags the server can produce, as it advertised them."""
        return tuple(e.tag for e in self.server_hello.layouts)

    def _handshake(self) -> m.Hello:
        self.checker.sent_client_hello(self.hello)
        self.wire.send(MessageType.CLIENT_HELLO, 1, m.encode_hello(self.hello, server=False))
        try:
            at, raw = self.wire.read_header()
        except Closed:
            raise SessionError("the server closed the connection before SERVER_HELLO") from None
        kind, sid, plen = self.checker.header(raw, at)
        payload = self._control_payload(plen)
        if kind == MessageType.ERROR:
            raise self.checker.error(sid, payload, at)
        return self.checker.server_hello(payload, at)

    def _control_payload(self, plen: int):
        return self.wire.read(plen)

    def _guard(self):
        if self._broken is not None:
            raise SessionError(f"the session cannot be used: {self._broken}")

    def _call(self, run, *args):
        """Run one exchange; a violation or a broken connection ends the session (after an
        ERROR to the server naming the fault, ``interchange.md § Error Handling``)."""
        self._guard()
        if self.timeout is not None:
            self.wire.deadline = Deadline(self.timeout, what=self._a_call)
        try:
            return run(*args)
        except RemoteError:
            raise
        except SpecViolation as fault:
            self._fail(fault)
            raise
        except (SessionError, LimitExceeded, HurraySchemaError) as exc:
            self._fail(exc)
            raise
        finally:
            self.wire.deadline = None

    def _fail(self, exc: BaseException) -> None:
        self._broken = exc
        if isinstance(exc, SpecViolation) and not self.wire.send_cut:
            self.wire.deadline = Deadline(1.0, what="the ERROR naming the fault")
            code = ErrorCode.SHARD_MISMATCH if exc.rule_id == rules.SHARD_CONSISTENCY.id else ErrorCode.INVALID_MESSAGE
            try:
                self.wire.send(MessageType.ERROR, getattr(self, "_stream", 1),
                               m.encode_error(code, f"[{exc.rule_id}] {exc.message} at byte {exc.offset}"))
            except (SessionError, OSError):
                pass
        self.wire.close()

    def _new_stream(self) -> int:
        """The stream of a new exchange: the next id past those an ERROR closed (``interchange.md
        § Error Handling``: nothing more travels on a closed stream, a shard's included)."""
        sid = next(self._streams)
        while self.checker.is_closed(sid):
            if sid <= self.checker.closed.floor:
                self._streams = itertools.count(self.checker.closed.floor + 1)
            sid = next(self._streams)
        return sid

    # --- PING ---------------------------------------------------------------------------
    def ping(self, payload: bytes = b"") -> bytes:
        """PING the server; returns the PONG's payload."""
        return self._call(self._ping, bytes(payload))

    def _ping(self, payload: bytes) -> bytes:
        sid = self._stream = self._new_stream()
        self.wire.send(MessageType.PING, sid, payload)
        while True:
            at, kind, s, plen = self._next()
            body = self._control_payload(plen)
            if kind == MessageType.ERROR:
                raise self.checker.error(s, body, at)
            if kind == MessageType.PONG and s == sid:
                return bytes(body)
            if self._keepalive(kind, s, body):
                continue
            raise container_rules.MESSAGE_ORDER.violation(f"{message_name(kind)} while a PONG was awaited", at)

    def _keepalive(self, kind, stream: int, body) -> bool:
        """A PING (answered with a PONG echoing it) or a PONG (nothing to do), wherever it comes."""
        if kind == MessageType.PING:
            self.wire.send(MessageType.PONG, stream, bytes(body))
            return True
        return kind == MessageType.PONG

    def _next(self) -> tuple[int, int, int, int]:
        try:
            at, raw = self.wire.read_header()
        except Closed:
            raise SessionError("the server closed the connection") from None
        kind, sid, plen = self.checker.header(raw, at)
        return at, kind, sid, plen

    # --- GET ----------------------------------------------------------------------------
    def get(self, key: str, *, layouts: Sequence = (), transcode: bool = True, parallel: bool = False,
            device="cpu", min_alignment: int = MIN_BUFFER_ALIGNMENT, out=None) -> Item:
        """The tensor or composite served by ``key``: the same kind of item
        ``hs.read_file(path)[key]`` gives, validated as it arrived.  ``layouts`` are the layout
        tags preferred, most preferred first (``LayoutTag.ROW_MAJOR``, ...); ``transcode`` lets
        the server transcode to one of them; ``parallel`` lets it send shards on several streams
        (reassembled here); ``device`` the device preferred.

        ``out`` (a writable C-contiguous array or buffer) receives the data of an answer that is
        one tensor of one buffer of exactly its size, straight from the socket, and the tensor
        returned views it: repeated GETs into one buffer pay no allocation.  Any other answer
        raises :class:`HurraySchemaError` once it has arrived (the session goes on)."""
        target = _out_view(out) if out is not None else None
        (dev,) = parse_devices((device,))
        check_min_alignment(min_alignment)
        flags = (RequestFlag.ALLOW_TRANSCODE if transcode else 0) | (RequestFlag.PARALLEL_OK if parallel else 0)
        request = m.Request(key, m.layout_entries(layouts), dev, min_alignment, int(flags))
        item = self._call(self._get, request, target)
        if target is not None and not _filled(item, target):
            raise HurraySchemaError(f"the answer for {key!r} is not one tensor of one {len(target)}-byte buffer: out= "
                                    "was left as it was")
        return item

    def _get(self, request: m.Request, target: Optional[memoryview] = None) -> Item:
        sid = self._stream = self._new_stream()
        kind = ShmMessageType.SHM_REQUEST if self.shared else MessageType.TENSOR_REQUEST
        self.checker.sent_request(sid, request)
        self.wire.send(kind, sid, m.encode_request(request))
        return _Response(self, sid, request, target).receive()

    # --- PUT ----------------------------------------------------------------------------
    def put(self, key: str, item, *, validate: bool = True) -> None:
        """Push ``item`` (a :class:`Tensor`, a :class:`Composite` or a NumPy array) to the
        server under ``key`` (``interchange.md § TENSOR_PUT Flow``): a composite as its head's
        PUT, then each member's, on one stream.  Returns once the server acknowledged the whole
        item; its ERROR raises.  ``validate=False`` sends what a strict reader might reject; a server
        that acknowledges what every reader rejects raises ``session.put.accepted``."""
        from ..io._write import as_item, check_nodes, encode_nodes

        item = as_item(item)
        encoded = list(encode_nodes(walk(item, key), validate))
        if validate:
            check_nodes(encoded, [0] * len(encoded), file_order=False)
        return self._call(self._put, key, encoded)

    def _put(self, key: str, encoded) -> None:
        sid = self._stream = self._new_stream()
        try:
            for node in encoded:
                self._push(sid, key, node)
        finally:
            self.pushes.forget(sid)  # the item was pushed whole, or its push ended (an ERROR, a fault)

    def _push(self, sid: int, key: str, node) -> None:
        """One encoded node of the item: its TENSOR_PUT, frames and TENSOR_DATA_END (or its SHM_PUT),
        then its ACK."""
        limit = self.server_hello.max_message_size - m.DATA_HEADER_SIZE
        total = sum(len(b) for b in node.buffers)
        put = m.Put(key, node.descriptor, total)
        payload = m.encode_put(key, node.descriptor, total)
        if len(payload) > self.server_hello.max_message_size:
            raise HurraySchemaError(f"the TENSOR_PUT of {len(payload)} bytes exceeds the server's "
                                    f"max_message_size {self.server_hello.max_message_size}")
        if self.shared:
            return self._put_shared(sid, put, payload, node.buffers)
        self.wire.send(MessageType.TENSOR_PUT, sid, payload)
        pos = 0
        for buf in node.buffers:
            view = memoryview(buf).cast("B") if len(buf) else memoryview(b"")
            for start in range(0, len(view), limit):
                piece = view[start : start + limit]
                self.wire.send_frame(sid, pos, [piece])
                pos += len(piece)
        self.wire.send(MessageType.TENSOR_DATA_END, sid)
        self.checker.sent_put(sid, self.pushes.judge(sid, put))
        return self._await_ack(sid)

    def _put_shared(self, sid: int, put: m.Put, payload: bytes, buffers) -> None:
        """SHM_PUT (our extension): one copy of the buffers into a sealed memfd passed beside the
        message; the server maps it and answers once it holds the tensor."""
        fd, _, _ = sealed_memfd(buffers, name="hurray-put")
        try:
            self.wire.send_with_fd(ShmMessageType.SHM_PUT, sid, payload, fd)
        finally:
            os.close(fd)
        self.checker.sent_put(sid, self.pushes.judge(sid, put))
        self._await_ack(sid)

    def _await_ack(self, sid: int) -> None:
        while True:
            at, kind, s, plen = self._next()
            body = self._control_payload(plen)
            if kind == MessageType.ERROR:
                raise self.checker.error(s, body, at)
            if self._keepalive(kind, s, body):
                continue
            if kind == MessageType.TENSOR_PUT_ACK:
                self.checker.ack(s, plen, at)
                if s == sid:
                    return
                continue
            raise rules.PUT_FLOW.violation(f"{message_name(kind)} on stream {s} while the ACK of stream {sid} was awaited",
                                           at)


class _Plane:
    """A tensor's buffers as they arrive: one aligned array per buffer handle (or the views
    given, for a shard placed straight into its parent)."""

    def __init__(self, desc: TensorDescriptor, alignment: int, buffers: Optional[list] = None):
        self.desc = desc
        self.alignment = max(alignment, 1)
        self._buffers = buffers
        self.given = buffers is not None
        """The buffers were given (the caller's ``out=``, a shard's place in its parent)."""

    @property
    def buffers(self) -> list:
        """Allocated when the first frame arrives (shared memory brings its own)."""
        if self._buffers is None:
            self._buffers = [_aligned(h.byte_size, self.alignment) for h in self.desc.buffers]
        return self._buffers

    def fill_from(self, fd: int, segments) -> None:
        """The buffers read from ``segments`` of file ``fd`` (a copy: what is not a sealed memory
        file could shrink under a mapping)."""
        read_ranges_into(fd, segments, self.buffers)

    @buffers.setter
    def buffers(self, views: list) -> None:
        self._buffers = views

    def segments(self, start: int, n: int):
        return plane_views(self.buffers, start, n)


class _Shards:
    """The shards of a parallel transfer (``interchange.md § Parallel Transfers``).  A shard that
    is a block of whole rows of a row-major parent is received straight into the parent's
    buffer; any other shard into its own, merged by the evaluator at the end."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.parent: Optional[memoryview] = None
        self.all_rows = True

    def place(self, desc: TensorDescriptor, alignment: int, limit: int, at: int,
              target: Optional[memoryview] = None) -> Optional[list]:
        """The parent's bytes this shard fills when it is a block of rows, else None; the parent
        is ``target`` (``out=``) when it is the parent's size."""
        span = _row_block(desc)
        if span is None:
            self.all_rows = False
            return None
        start, size, total = span
        if self.parent is None and target is not None and len(target) == total:
            self.parent = target
        if self.parent is None:
            if total > limit:
                raise LimitExceeded("max_response_bytes", total, limit, at)
            self.parent = _aligned(total, alignment)
        if len(self.parent) != total or start + size > total:
            self.all_rows = False
            return None
        return [self.parent[start : start + size]]


class _Response:
    """The messages answering one TENSOR_REQUEST, until its item is whole."""

    def __init__(self, session: Session, sid: int, request: m.Request, target: Optional[memoryview] = None):
        self.s = session
        self.sid = sid
        self.request = request
        self.target = target
        """The caller's buffer (``out=``), filled by an answer that is one tensor of its size."""
        self.binder = CompositeBinder(mode=session.mode, validate=True, limits=session.limits,
                                      leaf=Tensor.bound, assemble=Composite.from_binder)
        self.planes: dict[int, _Plane] = {}
        self.shards: Optional[_Shards] = None
        self.announced = 0

    def receive(self) -> Item:
        s = self.s
        while True:
            try:
                at, raw = s.wire.read_header()
            except Closed:
                self._torn()
            kind, stream, plen = s.checker.header(raw, at)
            if kind == MessageType.TENSOR_DATA:
                self._frame(stream, plen, at)
                continue
            if kind == MessageType.TENSOR_DESCRIPTOR:
                self._descriptor(stream, s.wire.read(plen), at)
                continue
            if kind == MessageType.TENSOR_DATA_END:
                item = self._end(stream, plen, at)
                if item is not None:
                    return item
                continue
            payload = s.wire.read(plen)
            if kind == ShmMessageType.SHM_DATA:
                self._mapped(stream, payload, at)
                continue
            if kind == MessageType.ERROR:
                if self._ours(stream):
                    raise self._remote_error(stream, payload, at)
                s.checker.error(stream, payload, at)  # another stream's end: this answer goes on
                continue
            if s._keepalive(kind, stream, payload):
                continue
            if kind == MessageType.TENSOR_PUT_ACK:
                s.checker.ack(stream, plen, at)
                continue
            raise container_rules.MESSAGE_ORDER.violation(f"{message_name(kind)} in the response to a TENSOR_REQUEST", at)

    def _fits_target(self, stream: int, desc: TensorDescriptor, total: int) -> bool:
        """The answer is one tensor of one buffer of exactly ``out``'s size: it goes straight there."""
        return (self.target is not None and stream == self.sid and not desc.is_composite_head and not self.binder.depth
                and len(desc.buffers) == 1 and total == len(self.target))

    def _ours(self, stream: int) -> bool:
        """``stream`` carries (part of) this answer: the request's own, or a shard's."""
        return stream == self.sid or stream in self.planes or stream in self.s.checker.transfers

    def _remote_error(self, stream: int, payload, at: int) -> RemoteError:
        """The server's ERROR, which ends this request (``interchange.md § Error Handling``).  When
        another stream of the response is still open (a parallel transfer's other shards, or the
        request's own tensor under an ERROR on another stream), what the server sends on it next
        cannot be told from a later answer: the session ends with this error."""
        s = self.s
        error = s.checker.error(stream, payload, at)
        if s.checker.tensors or self.shards is not None:
            s._fail(SessionError(f"the ERROR on stream {stream} at byte {at} left other streams of a response open"))
        return error

    def _torn(self):
        """The connection ended between messages: inside a tensor, inside a parallel transfer or a
        composite, or before any answer (``layouts/composite.md § Validation``: a torn composite)."""
        s = self.s
        if s.checker.tensors:
            start = min(f.start for f in s.checker.tensors.values())
            raise container_rules.STREAM_TRUNCATED.violation(
                f"the connection ends before the TENSOR_DATA_END of the tensor at byte {start}", s.wire.received)
        if self.shards is not None:
            raise rules.SHARD_CONSISTENCY.violation(
                f"the connection ends after {len(self.shards.transfer.ended)} of {self.shards.transfer.count} shards",
                s.wire.received)
        for _ in self.binder.finish():
            pass
        raise SessionError("the server closed the connection before answering")

    def _descriptor(self, stream: int, payload, at: int) -> None:
        s = self.s
        part, frames, transfer = s.checker.descriptor(stream, payload, at)  # a stream no request awaits: refused
        desc = part.value
        self.announced += frames.total
        if self.announced > s.max_response_bytes:
            raise LimitExceeded("max_response_bytes", self.announced, s.max_response_bytes, at)
        placed = None
        if transfer is not None:
            if self.shards is None:
                if self.planes or self.binder.depth:
                    raise rules.SHARD_CONSISTENCY.violation("shards inside a composite's response", at)
                self.shards = _Shards(transfer)
            placed = self.shards.place(desc, self.request.min_alignment, s.max_response_bytes, at, self.target)
        elif self._fits_target(stream, desc, frames.total):
            placed = [self.target]
        self.planes[stream] = _Plane(desc, self.request.min_alignment, placed)

    def _mapped(self, stream: int, payload, at: int) -> None:
        """SHM_DATA (our extension): the tensor's buffers are ranges of the file passed beside
        it, mapped read-only here; not one byte is copied."""
        s = self.s
        fd = s.wire.take_fd(at)
        try:
            size = os.fstat(fd).st_size if fd is not None else None
            _, segments = s.checker.shm_data(stream, payload, at, size)
            plane = self.planes[stream]
            if not (s.trust_server_files or is_sealed(fd)):
                return plane.fill_from(fd, segments)
            mapped = [s.mappings.view(fd, o, n, at) for o, n in segments]
            if plane.given:  # out=: one copy, from the mapping into the caller's buffer
                for into, view in zip(plane.buffers, mapped):
                    into[:] = view
            else:
                plane.buffers = mapped
        finally:
            if fd is not None:
                os.close(fd)
        return None

    def _frame(self, stream: int, plen: int, at: int) -> None:
        s = self.s
        offset = None
        if plen >= m.DATA_HEADER_SIZE:
            offset = m.unpack_offset_in_buffer(s.wire.read(m.DATA_HEADER_SIZE))
        frames, n = s.checker.frame(stream, plen, offset, at)
        for view in self.planes[stream].segments(frames.received - n, n):
            s.wire.read_into(view)

    def _end(self, stream: int, plen: int, at: int) -> Optional[Item]:
        s = self.s
        frames, _ = s.checker.end(stream, plen, at)  # the last shard: their consistency checked there
        if self.shards is not None:
            return self._assemble_shards() if self.shards.transfer.complete else None
        plane = self.planes.pop(stream)
        items = self.binder.add(frames.desc, frames.start + m.HEADER_SIZE, plane.buffers)
        return items[0] if items else None

    def _assemble_shards(self) -> Item:
        """The logical tensor of a parallel transfer the checker found consistent: the parent
        buffer the row blocks filled, or the evaluator's merge of the shards as a partition."""
        transfer = self.shards.transfer
        ordered = transfer.ordered()
        first = ordered[0][1]
        if self.shards.all_rows:
            whole = attrs.evolve(first, shape=first.shard.parent_shape, shard=None, statistics=None,
                                 buffers=(attrs.evolve(first.buffers[0], byte_size=len(self.shards.parent)),))
            return Tensor.bound(whole, [self.shards.parent])
        members = [Tensor.bound(d, self.planes[st].buffers) for st, d in ordered]
        array = Composite(transfer.head(), members).materialize(limits=self.s.limits)
        return Tensor.from_numpy(array)


def _row_block(desc: TensorDescriptor) -> Optional[tuple[int, int, int]]:
    """``(start, size, parent size)`` in bytes when ``desc`` is a row-major shard of whole rows
    of a row-major parent (offset only along dimension 0), else None."""
    from ..structs.element_types import element_type_info

    shard = desc.shard
    info = element_type_info(desc.type_tag)
    if (shard is None or info is None or desc.layout_tag != LayoutTag.ROW_MAJOR or desc.quantization is not None
            or len(desc.buffers) != 1 or desc.rank < 1 or len(shard.parent_shape) != desc.rank
            or any(shard.shard_offset[1:]) or tuple(desc.shape[1:]) != tuple(shard.parent_shape[1:])):
        return None
    row_bits = info.bit_width * math.prod(desc.shape[1:])
    if row_bits % 8:
        return None
    row = row_bits // 8
    size = desc.buffers[0].byte_size
    if size != row * desc.shape[0]:
        return None
    return shard.shard_offset[0] * row, size, row * shard.parent_shape[0]


def _out_view(out) -> memoryview:
    """``out`` as writable contiguous bytes, or :class:`HurraySchemaError`."""
    try:
        view = memoryview(out)
    except TypeError:
        raise HurraySchemaError(f"out= takes an array or a buffer, not {type(out).__name__}") from None
    if view.readonly or not view.c_contiguous:
        raise HurraySchemaError("out= must be writable and C-contiguous")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def _filled(item: Item, target: memoryview) -> bool:
    """``item`` is one tensor whose one buffer is ``target``'s memory."""
    if not isinstance(item, Tensor) or len(item.buffers) != 1:
        return False
    import numpy as np

    got = np.frombuffer(item.buffers[0], np.uint8)
    return got.size == len(target) and got.ctypes.data == np.frombuffer(target, np.uint8).ctypes.data


def _aligned(n: int, alignment: int) -> memoryview:
    """``n`` writable bytes starting on a multiple of ``alignment``; memory this machine cannot
    give is :class:`LimitExceeded` (not NumPy's ``MemoryError``)."""
    import numpy as np

    try:
        raw = np.empty(n + alignment, dtype=np.uint8)
    except MemoryError:
        raise LimitExceeded("memory", n, 0) from None
    skip = -raw.ctypes.data % alignment
    return memoryview(raw[skip : skip + n])


def _left(deadline: Optional[Deadline]) -> Optional[float]:
    """What ``deadline`` leaves (None: no bound); :class:`SessionTimeout` once it passed."""
    if deadline is None:
        return None
    left = deadline.remaining()
    if left <= 0:
        raise deadline.expired()
    return left


def _open(host: str, port: int, deadline: Optional[Deadline]) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=_left(deadline))
    except socket.timeout:
        raise deadline.expired() from None
    except OSError as exc:
        raise SessionError(f"cannot connect to {host}:{port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _open_unix(path: str, deadline: Optional[Deadline]) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_left(deadline))
        sock.connect(path)
    except socket.timeout:
        sock.close()
        raise deadline.expired() from None
    except OSError as exc:
        sock.close()
        raise SessionError(f"cannot connect to {path}: {exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock


def _tls_handshake(sock: socket.socket, context: ssl.SSLContext, hostname: str,
                   deadline: Optional[Deadline]) -> ssl.SSLSocket:
    """The TLS session over ``sock``, within ``deadline`` as a whole; a refused certificate
    (either side's) is a :class:`SessionError`."""
    try:
        sock.settimeout(_left(deadline))
        return context.wrap_socket(sock, server_hostname=hostname)
    except (ssl.SSLError, ssl.CertificateError) as exc:
        raise SessionError(f"the TLS handshake with {hostname} failed: {exc}") from None
    except socket.timeout:
        raise deadline.expired() from None
    except OSError as exc:
        raise SessionError(f"the TLS handshake with {hostname} failed: {exc}") from None


def _client_context(ca, cert, key) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=None if ca is None else os.fspath(ca))
    if cert is not None:
        context.load_cert_chain(os.fspath(cert), None if key is None else os.fspath(key))
    return context
