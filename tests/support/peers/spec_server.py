"""A scripted test server of the Hurray network transport, written from the spec.

:class:`SpecServer` accepts connections on 127.0.0.1 (an ephemeral port) or a Unix-domain
socket, answers each CLIENT_HELLO with a configurable SERVER_HELLO (interchange.md
§ Session Establishment), and hands every later message to a ``script``.  The module's
builders make the messages of well-formed responses and of deliberately broken ones, so
the same server plays a conforming peer or a hostile one.  Only :mod:`support.peers.spec_wire`
and the standard library are used.

A builder returns a list of *items* for :meth:`ServerConn.play`: encoded messages
(``bytes``), :data:`CLOSE` (close the connection there) or :class:`Stall` (pause).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Union

from . import spec_wire as w

# ---------------------------------------------------------------------------------------
# Connection handle given to scripts
# ---------------------------------------------------------------------------------------

CLOSE = object()
"""Item of a message list: close the connection at this point."""


class Stall(NamedTuple):
    """Item of a message list: send nothing for ``seconds`` (cut short by server shutdown)."""

    seconds: float


class ServerConn:
    """One accepted connection, as a script sees it."""

    def __init__(self, server: "SpecServer", sock: socket.socket, number: int):
        self.server = server
        self.sock = sock
        self.number = number
        self.closed = False
        self.client_hello: Optional[dict] = None

    def send_raw(self, data: bytes) -> None:
        if not self.closed:
            self.sock.sendall(bytes(data))

    def send(self, message_type: int, stream_id: int, payload: bytes = b"") -> None:
        self.send_raw(w.encode_message(message_type, stream_id, payload))

    def send_error(self, stream_id: int, code: int, message: str = "") -> None:
        self.send(w.ERROR, stream_id, w.encode_error(code, message or w.ERROR_CODE_NAMES.get(code, "error")))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def stall(self, seconds: float) -> None:
        """Pause this connection; server shutdown ends the pause at once."""
        self.server._stop.wait(seconds)

    def play(self, items: Iterable) -> None:
        """Sends builder items in order (messages, :data:`CLOSE`, :class:`Stall`)."""
        for item in items:
            if item is CLOSE:
                self.close()
                return
            if isinstance(item, Stall):
                self.stall(item.seconds)
            else:
                self.send_raw(item)

    def _read_exact(self, n: int) -> Optional[bytes]:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv(self) -> Optional[tuple[int, int, bytes]]:
        """The next message from the client, recorded in ``server.received``; None at EOF.
        A ``payload_length`` over the server's advertised ``max_message_size`` is answered
        with ERROR MESSAGE_TOO_LARGE and ends the connection (interchange.md § Message
        Framing)."""
        header = self._read_exact(w.HEADER_SIZE)
        if header is None:
            return None
        message_type, stream_id, length = w.decode_header(header)
        if length > self.server.max_message_size:
            self.server._record(self.number, message_type, stream_id, None)
            self.send_error(stream_id, w.ERR_MESSAGE_TOO_LARGE, f"payload_length {length}")
            self.close()
            return None
        payload = self._read_exact(length)
        if payload is None:
            return None
        self.server._record(self.number, message_type, stream_id, payload)
        return message_type, stream_id, payload


Script = Callable[[int, int, bytes, ServerConn], object]


class SpecServer:
    """A test server running in background threads; a context manager.

    ``script(message_type, stream_id, payload, conn)`` is called for every message after
    the CLIENT_HELLO, on the connection's thread; returning ``"close"`` closes the
    connection.  ``hello_fields`` override the SERVER_HELLO fields (defaults: version 1,
    ``max_message_size``, TRANSCODING|PARALLEL_STREAMS, row-major and composite layouts,
    CPU, STANDARD); ``hello_reply`` replaces the SERVER_HELLO with raw bytes, or with a
    callable ``(conn, client_hello_payload)`` that answers by itself.

    ``received`` lists ``(connection_number, message_type, stream_id, payload)`` of every
    message read (payload None when refused unread); ``errors`` the exceptions scripts
    raised."""

    def __init__(self, script: Script, unix_path: Optional[str] = None, *,
                 hello_fields: Optional[dict] = None, hello_reply=None,
                 max_message_size: int = 1 << 24, timeout: float = 5.0):
        self.script = script
        self.unix_path = unix_path
        self.max_message_size = max_message_size
        self.hello_fields = {
            "protocol_version": w.PROTOCOL_VERSION, "max_message_size": max_message_size,
            "capability_flags": w.CAP_TRANSCODING | w.CAP_PARALLEL_STREAMS,
            "layouts": (w.LAYOUT_ROW_MAJOR, w.LAYOUT_COMPOSITE), "devices": (w.DEVICE_CPU,),
            "memory_classes": (w.MEM_STANDARD,), **(hello_fields or {})}
        self.hello_reply = hello_reply
        self.timeout = timeout
        self.received: list[tuple] = []
        self.errors: list[BaseException] = []
        self.connections: list[ServerConn] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if unix_path is None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(("127.0.0.1", 0))
        else:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(unix_path)
        self._listener.listen(16)
        self._acceptor = threading.Thread(target=self._accept_loop, name="SpecServer-accept", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> Union[tuple, str]:
        """``(host, port)`` or the Unix path: what :class:`~support.peers.spec_client.SpecClient` takes."""
        return self.unix_path if self.unix_path is not None else self._listener.getsockname()[:2]

    @property
    def port(self) -> Optional[int]:
        return None if self.unix_path is not None else self._listener.getsockname()[1]

    def __enter__(self) -> "SpecServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self, number, message_type, stream_id, payload) -> None:
        with self._lock:
            self.received.append((number, message_type, stream_id, payload))

    def messages(self, message_type: Optional[int] = None) -> list[tuple]:
        """``received``, optionally only one message type."""
        with self._lock:
            return [m for m in self.received if message_type is None or m[1] == message_type]

    def close(self) -> None:
        """Stops accepting, closes every connection and joins the threads (bounded)."""
        self._stop.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            conn.close()
        self._acceptor.join(self.timeout)
        for t in list(self._threads):
            t.join(self.timeout)
        if self.unix_path is not None and os.path.exists(self.unix_path):
            os.unlink(self.unix_path)

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.5)  # so that a close() that races accept() is noticed
        number = 0
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(self.timeout)
            conn = ServerConn(self, sock, number)
            number += 1
            with self._lock:
                self.connections.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name=f"SpecServer-conn{conn.number}",
                                 daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: ServerConn) -> None:
        try:
            first = conn.recv()
            if first is None:
                return
            message_type, stream_id, payload = first
            if message_type != w.CLIENT_HELLO:
                conn.send_error(stream_id, w.ERR_INVALID_MESSAGE, "the first message must be CLIENT_HELLO")
                return
            try:
                conn.client_hello = w.decode_hello(payload)
            except w.WireFormatError:
                conn.client_hello = None
            if callable(self.hello_reply):
                self.hello_reply(conn, payload)
            elif self.hello_reply is not None:
                conn.send_raw(self.hello_reply)
            else:
                conn.send(w.SERVER_HELLO, stream_id, w.encode_hello(**self.hello_fields))
            while not conn.closed and not self._stop.is_set():
                msg = conn.recv()
                if msg is None:
                    return
                if self.script(*msg, conn) == "close":
                    return
        except OSError:
            pass  # the client went away or timed out, or shutdown closed the socket
        except BaseException as exc:  # recorded for the test to see
            self.errors.append(exc)
        finally:
            conn.close()


# ---------------------------------------------------------------------------------------
# Builders of well-formed responses
# ---------------------------------------------------------------------------------------

def msg(message_type: int, stream_id: int, payload: bytes = b"") -> bytes:
    return w.encode_message(message_type, stream_id, payload)


def data_frames(stream_id: int, data: bytes, frame_bytes: int = 1 << 16, start: int = 0) -> list[bytes]:
    """TENSOR_DATA frames of at most ``frame_bytes`` data bytes, contiguous from ``start``
    (interchange.md § TENSOR_DATA Payload)."""
    data = bytes(data)
    return [msg(w.TENSOR_DATA, stream_id, w.encode_tensor_data(start + i, data[i:i + frame_bytes]))
            for i in range(0, len(data), frame_bytes)]


def tensor_messages(stream_id: int, descriptor: bytes, data: bytes, *, frame_bytes: int = 1 << 16,
                    total_data_bytes: Optional[int] = None, shard_index: int = 0,
                    total_shards: int = 1) -> list[bytes]:
    """TENSOR_DESCRIPTOR, TENSOR_DATA frames (none for empty data), TENSOR_DATA_END
    (interchange.md § Ordering Invariant)."""
    total = len(data) if total_data_bytes is None else total_data_bytes
    return ([msg(w.TENSOR_DESCRIPTOR, stream_id,
                 w.encode_descriptor_message(descriptor, total, shard_index, total_shards))]
            + data_frames(stream_id, data, frame_bytes)
            + [msg(w.TENSOR_DATA_END, stream_id)])


def composite_messages(stream_id: int, head: bytes, members: Sequence, *, frame_bytes: int = 1 << 16
                       ) -> list[bytes]:
    """Head (descriptor then TENSOR_DATA_END, no frames), then each member
    (interchange.md § Composite Tensor Streaming).  A member is ``(descriptor, data)`` or
    an already built message list (a nested composite)."""
    out = tensor_messages(stream_id, head, b"")
    for member in members:
        if isinstance(member, tuple):
            out += tensor_messages(stream_id, member[0], member[1], frame_bytes=frame_bytes)
        else:
            out += list(member)
    return out


def extract_box(parent_shape: Sequence[int], itemsize: int, data: bytes, offset: Sequence[int],
                shape: Sequence[int]) -> bytes:
    """Row-major bytes of the box ``(offset, shape)`` of a row-major ``parent_shape`` array."""
    parent_shape, offset, shape = tuple(parent_shape), tuple(offset), tuple(shape)
    if not shape:
        return bytes(data[:itemsize])
    if w.element_count(shape) == 0:
        return b""
    strides = [1] * len(parent_shape)
    for k in range(len(parent_shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * parent_shape[k + 1]
    row = shape[-1] * itemsize
    out = []
    for idx in itertools.product(*(range(s) for s in shape[:-1])):
        start = sum((o + i) * st for o, i, st in zip(offset, idx + (0,), strides)) * itemsize
        out.append(bytes(data[start:start + row]))
    return b"".join(out)


def partition_messages(stream_id: int, element_type, parent_shape: Sequence[int], data: bytes,
                       boxes, *, frame_bytes: int = 1 << 16) -> list[bytes]:
    """A partition composite of a row-major array's bytes: head, then one row-major member
    per ``(offset, shape)`` box carrying its shard section."""
    itemsize = w.element_bytes(element_type, 1)
    descriptors = w.partition_descriptors(element_type, parent_shape, boxes)
    members = [(d, extract_box(parent_shape, itemsize, data, o, s)) for d, (o, s) in zip(descriptors[1:], boxes)]
    return composite_messages(stream_id, descriptors[0], members, frame_bytes=frame_bytes)


def shard_descriptor_messages(stream_ids: Sequence[int], element_type, parent_shape: Sequence[int],
                              data: bytes, row_ranges: Sequence[tuple[int, int]], *,
                              frame_bytes: int = 1 << 16, interleave: bool = True) -> list[bytes]:
    """A parallel transfer along dimension 0 (interchange.md § Parallel Transfer Flow):
    shard ``i`` holds rows ``row_ranges[i]`` on ``stream_ids[i]`` with a shard section,
    ``shard_index = i`` and ``total_shards = len(row_ranges)``.  With ``interleave`` the
    shards' messages alternate round-robin, as concurrent streams would.  Any row ranges
    are accepted, so overlapping or gapped shard sets can be built too."""
    parent_shape = tuple(parent_shape)
    itemsize = w.element_bytes(element_type, 1)
    per_stream = []
    for i, ((start, stop), sid) in enumerate(zip(row_ranges, stream_ids)):
        shape = (stop - start,) + parent_shape[1:]
        offset = (start,) + (0,) * (len(parent_shape) - 1)
        descriptor = w.dense_descriptor(element_type, shape, shard=(parent_shape, offset))
        per_stream.append(tensor_messages(sid, descriptor, extract_box(parent_shape, itemsize, data, offset, shape),
                                          frame_bytes=frame_bytes, shard_index=i, total_shards=len(row_ranges)))
    if not interleave:
        return [m for stream in per_stream for m in stream]
    out = []
    for step in range(max(len(s) for s in per_stream)):
        out += [s[step] for s in per_stream if step < len(s)]
    return out


# ---------------------------------------------------------------------------------------
# Builders of broken responses
# ---------------------------------------------------------------------------------------

def torn_composite(stream_id: int, head: bytes, members: Sequence, arrived: int, *,
                   frame_bytes: int = 1 << 16) -> list:
    """The head and the first ``arrived`` members of a composite, then the connection
    closes: a torn composite (layouts/composite.md § Torn composite)."""
    return composite_messages(stream_id, head, list(members)[:arrived], frame_bytes=frame_bytes) + [CLOSE]


def frame_gap(stream_id: int, descriptor: bytes, data: bytes, frame_bytes: int) -> list[bytes]:
    """Frames that skip the second frame's bytes: a gap (interchange.md § TENSOR_DATA
    Payload, "no gaps")."""
    frames = data_frames(stream_id, data, frame_bytes)
    return ([msg(w.TENSOR_DESCRIPTOR, stream_id, w.encode_descriptor_message(descriptor, len(data)))]
            + frames[:1] + frames[2:] + [msg(w.TENSOR_DATA_END, stream_id)])


def frame_overlap(stream_id: int, descriptor: bytes, data: bytes, frame_bytes: int) -> list[bytes]:
    """The second frame starts one byte before the first one ends: an overlap."""
    data = bytes(data)
    first = msg(w.TENSOR_DATA, stream_id, w.encode_tensor_data(0, data[:frame_bytes]))
    rest = data_frames(stream_id, data[frame_bytes - 1:], frame_bytes, start=frame_bytes - 1)
    return ([msg(w.TENSOR_DESCRIPTOR, stream_id, w.encode_descriptor_message(descriptor, len(data)))]
            + [first] + rest + [msg(w.TENSOR_DATA_END, stream_id)])


def oversized_header(stream_id: int, message_type: int = w.TENSOR_DATA,
                     payload_length: int = w.U32_MAX - 1, sent: bytes = b"\0" * 8) -> list[bytes]:
    """A header declaring a huge ``payload_length`` followed by only ``sent`` bytes."""
    return [w.encode_header(message_type, stream_id, payload_length) + bytes(sent)]


def unknown_message(stream_id: int, message_type: int = 0x0E, payload: bytes = b"") -> list[bytes]:
    """A message whose type no table defines (0x0E), a private unagreed one (0xF0-0xFE) or
    the invalid 0xFF (interchange.md § Message Types)."""
    return [msg(message_type, stream_id, payload)]


def error_reply(stream_id: int, code: int, message: str = "") -> list[bytes]:
    """An ERROR message (interchange.md § ERROR Payload)."""
    return [msg(w.ERROR, stream_id, w.encode_error(code, message or w.ERROR_CODE_NAMES.get(code, "error")))]


def data_before_descriptor(stream_id: int, descriptor: bytes, data: bytes, frame_bytes: int = 1 << 16
                           ) -> list[bytes]:
    """Data frames sent ahead of the TENSOR_DESCRIPTOR (against § Ordering Invariant)."""
    return (data_frames(stream_id, data, frame_bytes)
            + [msg(w.TENSOR_DESCRIPTOR, stream_id, w.encode_descriptor_message(descriptor, len(data))),
               msg(w.TENSOR_DATA_END, stream_id)])


def wrong_total(stream_id: int, descriptor: bytes, data: bytes, delta: int = 1,
                frame_bytes: int = 1 << 16) -> list[bytes]:
    """``total_data_bytes`` off by ``delta`` from the data actually framed."""
    return tensor_messages(stream_id, descriptor, data, frame_bytes=frame_bytes,
                           total_data_bytes=len(data) + delta)


def overlapping_shards(stream_ids, element_type, parent_shape, data, **kw) -> list[bytes]:
    """Two shards along dimension 0 that share a row."""
    n = parent_shape[0]
    return shard_descriptor_messages(stream_ids, element_type, parent_shape, data,
                                     [(0, n // 2 + 1), (n // 2, n)], **kw)


def gapped_shards(stream_ids, element_type, parent_shape, data, **kw) -> list[bytes]:
    """Two shards along dimension 0 that leave a row out."""
    n = parent_shape[0]
    return shard_descriptor_messages(stream_ids, element_type, parent_shape, data,
                                     [(0, n // 2 - 1), (n // 2, n)], **kw)


# ---------------------------------------------------------------------------------------
# A conforming script
# ---------------------------------------------------------------------------------------

class StoreScript:
    """A well-behaved script over ``store``: key -> ``(descriptor, data)`` or a callable
    ``(stream_id, request_dict) -> items``.  TENSOR_REQUEST answers the key's tensor or
    ERROR UNKNOWN_TENSOR; PING answers PONG with the same payload on the same stream;
    TENSOR_PUT reads frames up to TENSOR_DATA_END, checks them, stores them and answers
    TENSOR_PUT_ACK (or ERROR INVALID_MESSAGE); anything else is ERROR INVALID_MESSAGE."""

    def __init__(self, store: Optional[dict] = None, frame_bytes: int = 1 << 16):
        self.store = {} if store is None else store
        self.frame_bytes = frame_bytes

    def __call__(self, message_type: int, stream_id: int, payload: bytes, conn: ServerConn):
        if message_type == w.TENSOR_REQUEST:
            request = w.decode_tensor_request(payload)
            entry = self.store.get(request["key"])
            if entry is None:
                conn.play(error_reply(stream_id, w.ERR_UNKNOWN_TENSOR, f"no tensor {request['key']!r}"))
            elif callable(entry):
                conn.play(entry(stream_id, request))
            else:
                conn.play(tensor_messages(stream_id, entry[0], entry[1], frame_bytes=self.frame_bytes))
        elif message_type == w.PING:
            conn.send(w.PONG, stream_id, payload)
        elif message_type == w.ERROR:
            pass  # the stream is closed; an ERROR is never answered with another
        elif message_type == w.TENSOR_PUT:
            put = w.decode_tensor_put(payload)
            chunks, received = [], 0
            while True:
                nxt = conn.recv()
                if nxt is None:
                    return "close"
                t, sid, p = nxt
                if t == w.TENSOR_DATA and sid == stream_id:
                    offset, data = w.decode_tensor_data(p)
                    if offset != received:
                        conn.play(error_reply(stream_id, w.ERR_INVALID_MESSAGE, "frames not contiguous"))
                        return None
                    chunks.append(data)
                    received += len(data)
                elif t == w.TENSOR_DATA_END and sid == stream_id:
                    break
                else:
                    conn.play(error_reply(stream_id, w.ERR_INVALID_MESSAGE, "unexpected message inside a PUT"))
                    return None
            if received != put["total_data_bytes"]:
                conn.play(error_reply(stream_id, w.ERR_INVALID_MESSAGE, "total_data_bytes mismatch"))
                return None
            self.store[put["key"]] = (put["descriptor"], b"".join(chunks))
            conn.send(w.TENSOR_PUT_ACK, stream_id)
        else:
            conn.play(error_reply(stream_id, w.ERR_INVALID_MESSAGE,
                                  f"unexpected {w.message_type_name(message_type)}"))
        return None
