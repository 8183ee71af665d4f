"""A blocking test client of the Hurray network transport, written from the spec.

:class:`SpecClient` speaks the framing of interchange.md § Message Framing over a TCP or
Unix-domain socket and checks what a receiver must check of a server's responses: the
ordering invariant (§ Ordering Invariant), contiguous data frames whose sizes add up to
``total_data_bytes`` (§ TENSOR_DATA Payload), composite binding by member count
(§ Composite Tensor Streaming), shard consistency of a parallel transfer (§ Shard
Consistency), and its own advertised ``max_message_size`` (§ Message Framing).  A breach
raises :class:`PeerViolation` with a short ``kind``; an ERROR message raises (or returns)
:class:`PeerError`.  Only :mod:`support.peers.spec_wire` and the standard library are used.
"""

from __future__ import annotations

import itertools
import select
import socket
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from . import spec_wire as w


class PeerError(Exception):
    """An ERROR message from the peer (interchange.md § ERROR Payload)."""

    def __init__(self, code: int, message: str, stream_id: int):
        self.code = code
        self.message = message
        self.stream_id = stream_id
        super().__init__(f"ERROR {self.name} (0x{code:08X}) on stream {stream_id}: {message}")

    @property
    def name(self) -> str:
        return w.ERROR_CODE_NAMES.get(self.code, f"0x{self.code:08X}")


class PeerViolation(Exception):
    """The peer broke the protocol; ``kind`` names how: ``"data_before_descriptor"``,
    ``"gap"``, ``"overlap"``, ``"total_mismatch"``, ``"torn"``, ``"closed"``,
    ``"too_large"``, ``"stream_id"``, ``"unexpected_message"``, ``"malformed"``,
    ``"sync_mode"``, ``"shard_overlap"``, ``"shard_gap"``, ``"shard_mismatch"``."""

    def __init__(self, kind: str, detail: str = ""):
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}" if detail else kind)


class PeerClosed(ConnectionError):
    """The connection ended (EOF or reset) where a message was expected."""


@dataclass
class ReceivedTensor:
    """One tensor (or one shard) of a response: its TENSOR_DESCRIPTOR and its data."""

    stream_id: int
    descriptor: bytes
    parsed: w.ParsedDescriptor
    total_data_bytes: int
    shard_index: int
    total_shards: int
    data: bytes = b""
    frames: list = field(default_factory=list)
    """``(byte_offset_in_buffer, length)`` of every TENSOR_DATA frame, in arrival order."""
    depth: int = 0
    """0 for the top-level item, 1 for a composite's member, and so on."""

    @property
    def shape(self) -> tuple:
        return self.parsed.shape

    @property
    def is_composite_head(self) -> bool:
        return self.parsed.is_composite_head


@dataclass
class PeerReply:
    """A single reply message (PONG, TENSOR_PUT_ACK, ERROR ...)."""

    type: int
    stream_id: int
    payload: bytes
    error: Optional[PeerError] = None

    @property
    def type_name(self) -> str:
        return w.message_type_name(self.type)


class _Incoming:
    """A tensor whose TENSOR_DESCRIPTOR has arrived and whose TENSOR_DATA_END has not."""

    def __init__(self, tensor: ReceivedTensor):
        self.tensor = tensor
        self.chunks: list[bytes] = []
        self.received = 0

    def frame(self, payload: bytes) -> None:
        offset, data = _decode(w.decode_tensor_data, payload)
        t = self.tensor
        if offset > self.received:
            raise PeerViolation("gap", f"stream {t.stream_id}: frame at {offset}, {self.received} bytes so far")
        if offset < self.received:
            raise PeerViolation("overlap", f"stream {t.stream_id}: frame at {offset}, {self.received} bytes so far")
        self.received += len(data)
        if self.received > t.total_data_bytes:
            raise PeerViolation("total_mismatch", f"stream {t.stream_id}: {self.received} bytes of data, "
                                                  f"total_data_bytes is {t.total_data_bytes}")
        self.chunks.append(data)
        t.frames.append((offset, len(data)))

    def end(self, payload: bytes) -> ReceivedTensor:
        _decode(w.expect_empty, payload, "TENSOR_DATA_END")
        t = self.tensor
        if self.received != t.total_data_bytes:
            raise PeerViolation("total_mismatch", f"stream {t.stream_id}: TENSOR_DATA_END after {self.received} "
                                                  f"bytes, total_data_bytes is {t.total_data_bytes}")
        t.data = b"".join(self.chunks)
        return t


def _decode(fn, *args):
    try:
        return fn(*args)
    except w.WireFormatError as exc:
        raise PeerViolation("malformed", str(exc)) from None


class SpecClient:
    """A client of one connection.  ``address``: ``(host, port)`` for TCP or a str path
    for a Unix-domain socket.  Every socket operation is bounded by ``timeout`` seconds
    (a stalled peer raises :class:`TimeoutError`)."""

    def __init__(self, address: Union[tuple, str], timeout: float = 5.0, *,
                 max_message_size: int = 1 << 24, cross_machine: Optional[bool] = None):
        self.address = address
        self.timeout = timeout
        self.max_message_size = max_message_size
        """What this client accepts (and advertises in :meth:`hello` unless told otherwise)."""
        self.server_hello: Optional[dict] = None
        if isinstance(address, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
        else:
            self.sock = socket.create_connection(tuple(address), timeout=timeout)
        self.sock.settimeout(timeout)
        self.cross_machine = (not isinstance(address, str)) if cross_machine is None else cross_machine
        """A TCP peer is treated as cross-machine: every buffer handle must then declare
        ``SYNC_PRODUCER_SYNCED`` (interchange.md § Completion)."""

    # -- plumbing ------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "SpecClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(bytes(data))

    def send(self, message_type: int, stream_id: int, payload: bytes = b"") -> None:
        self.send_raw(w.encode_message(message_type, stream_id, payload))

    def _read_exact(self, n: int, *, eof_ok: bool = False) -> Optional[bytes]:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = self.sock.recv(min(n - got, 1 << 20))
            except ConnectionResetError as exc:
                raise PeerClosed(f"connection reset after {got} of {n} bytes") from exc
            if not chunk:
                if eof_ok and got == 0:
                    return None
                raise PeerClosed(f"connection closed after {got} of {n} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv(self, *, eof_ok: bool = False) -> Optional[tuple[int, int, bytes]]:
        """The next message ``(message_type, stream_id, payload)``: exactly 12 header bytes,
        then exactly ``payload_length`` bytes.  A ``payload_length`` above this client's
        ``max_message_size`` is refused before reading it: the client answers ERROR
        MESSAGE_TOO_LARGE and raises ``PeerViolation("too_large")`` (interchange.md
        § Message Framing).  EOF raises :class:`PeerClosed` (returns None with
        ``eof_ok`` when it falls between messages)."""
        header = self._read_exact(w.HEADER_SIZE, eof_ok=eof_ok)
        if header is None:
            return None
        message_type, stream_id, length = w.decode_header(header)
        if length > self.max_message_size:
            try:
                self.send(w.ERROR, stream_id, w.encode_error(w.ERR_MESSAGE_TOO_LARGE,
                                                             f"payload_length {length} > {self.max_message_size}"))
            except OSError:
                pass
            raise PeerViolation("too_large", f"{w.message_type_name(message_type)} on stream {stream_id} "
                                             f"declares payload_length {length} > {self.max_message_size}")
        return message_type, stream_id, self._read_exact(length)

    def recv_until_closed(self, limit: int = 64) -> list[tuple[int, int, bytes]]:
        """Every message until the peer closes the connection (at most ``limit``, else
        ``PeerViolation("unexpected_message")``); a reset counts as closed."""
        out = []
        while len(out) <= limit:
            try:
                msg = self.recv(eof_ok=True)
            except PeerClosed:
                return out
            if msg is None:
                return out
            out.append(msg)
        raise PeerViolation("unexpected_message", f"still open after {limit} messages")

    def _reply(self, msg: tuple[int, int, bytes]) -> PeerReply:
        message_type, stream_id, payload = msg
        reply = PeerReply(message_type, stream_id, payload)
        if message_type == w.ERROR:
            reply.error = PeerError(*_decode(w.decode_error, payload), stream_id)
        return reply

    # -- session -------------------------------------------------------------------------

    def hello(self, stream_id: int = 1, **fields) -> Union[dict, PeerError]:
        """Sends CLIENT_HELLO (fields as :func:`support.peers.spec_wire.encode_hello`; by default
        protocol version 1, this client's ``max_message_size``, no capability, row-major,
        CPU, STANDARD) and returns the SERVER_HELLO's fields as a dict (plus ``stream_id``),
        or the :class:`PeerError` the server answered instead.  Anything else raises."""
        fields.setdefault("max_message_size", self.max_message_size)
        self.send(w.CLIENT_HELLO, stream_id, w.encode_hello(**fields))
        message_type, sid, payload = self.recv()
        if message_type == w.ERROR:
            return PeerError(*_decode(w.decode_error, payload), sid)
        if message_type != w.SERVER_HELLO:
            raise PeerViolation("unexpected_message", f"{w.message_type_name(message_type)} instead of SERVER_HELLO")
        parsed = _decode(w.decode_hello, payload)
        parsed["stream_id"] = sid
        self.server_hello = parsed
        return parsed

    def ping(self, payload: bytes = b"", stream_id: int = 1) -> PeerReply:
        """PING, and the reply message (a PONG from a conforming peer)."""
        self.send(w.PING, stream_id, w.encode_ping(payload))
        return self._reply(self.recv())

    # -- requests ------------------------------------------------------------------------

    def request(self, key: Union[str, bytes], stream_id: int = 1, layouts=(), device: int = w.DEVICE_CPU,
                min_alignment: int = 64, flags: int = 0) -> None:
        """Sends a TENSOR_REQUEST only (interchange.md § TENSOR_REQUEST Payload)."""
        self.send(w.TENSOR_REQUEST, stream_id,
                  w.encode_tensor_request(key, layouts, device, min_alignment, flags))

    def get(self, key: Union[str, bytes], stream_id: int = 1, layouts=(), device: int = w.DEVICE_CPU,
            min_alignment: int = 64, flags: int = 0, *, raise_errors: bool = True):
        """Requests ``key`` and reads the whole response (:meth:`read_response`)."""
        self.request(key, stream_id, layouts, device, min_alignment, flags)
        return self.read_response(stream_id, raise_errors=raise_errors)

    def read_response(self, stream_id: int = 1, *, raise_errors: bool = True):
        """The tensors of one response, in arrival order: exactly one top-level item,
        where a composite head binds the next ``member_count`` items (recursively,
        pre-order; interchange.md § Composite Tensor Streaming) and a parallel transfer
        (``total_shards > 1``) is one item made of all its shards, each on its own stream
        (§ Parallel Transfers), listed by ``shard_index``.

        An ERROR ends the response: raised as :class:`PeerError`, or returned with
        ``raise_errors=False``.  A connection closed inside a composite raises
        ``PeerViolation("torn")``, elsewhere ``PeerViolation("closed")``."""
        items: list[ReceivedTensor] = []
        pending = [1]  # items still owed at each open nesting level
        try:
            while pending:
                depth = len(pending) - 1
                got = self._read_item(stream_id, depth)
                items.extend(got)
                pending[-1] -= 1
                head = got[0]
                if len(got) == 1 and head.is_composite_head and head.parsed.member_count:
                    pending.append(head.parsed.member_count)
                while pending and pending[-1] == 0:
                    pending.pop()
        except PeerError as exc:
            if raise_errors:
                raise
            return exc
        except PeerClosed as exc:
            if len(pending) > 1:
                raise PeerViolation("torn", f"connection ended inside a composite after {len(items)} "
                                            f"tensors ({exc})") from None
            raise PeerViolation("closed", f"connection ended before the response was complete ({exc})") from None
        return items

    def _check_descriptor(self, msg_sid: int, payload: bytes, depth: int) -> ReceivedTensor:
        fields = _decode(w.decode_descriptor_message, payload)
        parsed = _decode(w.parse_descriptor, fields["descriptor"])
        if self.cross_machine:
            for i, b in enumerate(parsed.buffers):
                if b.sync_mode != w.SYNC_PRODUCER_SYNCED:
                    raise PeerViolation("sync_mode", f"buffer {i} declares sync_mode 0x{b.sync_mode:02X} "
                                                     f"on a cross-machine transport")
        if fields["total_shards"] < 1 or fields["shard_index"] >= fields["total_shards"]:
            raise PeerViolation("shard_mismatch", f"shard_index {fields['shard_index']} of "
                                                  f"{fields['total_shards']}")
        return ReceivedTensor(msg_sid, fields["descriptor"], parsed, fields["total_data_bytes"],
                              fields["shard_index"], fields["total_shards"], depth=depth)

    def _next(self) -> tuple[int, int, bytes]:
        message_type, sid, payload = self.recv()
        if message_type == w.ERROR:
            raise PeerError(*_decode(w.decode_error, payload), sid)
        return message_type, sid, payload

    def _read_item(self, stream_id: int, depth: int) -> list[ReceivedTensor]:
        message_type, sid, payload = self._next()
        if message_type in (w.TENSOR_DATA, w.TENSOR_DATA_END):
            raise PeerViolation("data_before_descriptor",
                                f"{w.message_type_name(message_type)} on stream {sid} before any TENSOR_DESCRIPTOR")
        if message_type != w.TENSOR_DESCRIPTOR:
            raise PeerViolation("unexpected_message", f"{w.message_type_name(message_type)} on stream {sid} "
                                                      f"where a TENSOR_DESCRIPTOR was due")
        first = self._check_descriptor(sid, payload, depth)
        if first.total_shards > 1:
            return self._read_shards(first, depth)
        if sid != stream_id:
            raise PeerViolation("stream_id", f"TENSOR_DESCRIPTOR on stream {sid}, the request was on {stream_id}")
        incoming = _Incoming(first)
        while True:
            message_type, msid, payload = self._next()
            if msid != sid:
                raise PeerViolation("stream_id", f"{w.message_type_name(message_type)} on stream {msid} "
                                                 f"inside the tensor on stream {sid}")
            if message_type == w.TENSOR_DATA:
                incoming.frame(payload)
            elif message_type == w.TENSOR_DATA_END:
                return [incoming.end(payload)]
            else:
                raise PeerViolation("unexpected_message", f"{w.message_type_name(message_type)} between "
                                                          f"TENSOR_DESCRIPTOR and TENSOR_DATA_END")

    def _read_shards(self, first: ReceivedTensor, depth: int) -> list[ReceivedTensor]:
        """The shards of a parallel transfer, demultiplexed by stream id until every one of
        ``total_shards`` has sent its TENSOR_DATA_END; then the shard consistency checks
        (interchange.md § Shard Consistency)."""
        total = first.total_shards
        active: dict[int, _Incoming] = {first.stream_id: _Incoming(first)}
        seen_index = {first.shard_index}
        done: list[ReceivedTensor] = []
        while len(done) < total:
            message_type, sid, payload = self._next()
            if message_type == w.TENSOR_DESCRIPTOR:
                if sid in active:
                    raise PeerViolation("unexpected_message", f"second TENSOR_DESCRIPTOR on stream {sid} "
                                                              f"before its TENSOR_DATA_END")
                shard = self._check_descriptor(sid, payload, depth)
                if shard.total_shards != total:
                    raise PeerViolation("shard_mismatch", f"total_shards {shard.total_shards} vs {total}")
                if shard.shard_index in seen_index:
                    raise PeerViolation("shard_mismatch", f"shard_index {shard.shard_index} twice")
                if len(seen_index) >= total:
                    raise PeerViolation("shard_mismatch", f"more than {total} shards")
                seen_index.add(shard.shard_index)
                active[sid] = _Incoming(shard)
            elif message_type in (w.TENSOR_DATA, w.TENSOR_DATA_END):
                if sid not in active:
                    raise PeerViolation("data_before_descriptor",
                                        f"{w.message_type_name(message_type)} on stream {sid} with no shard open")
                if message_type == w.TENSOR_DATA:
                    active[sid].frame(payload)
                else:
                    done.append(active.pop(sid).end(payload))
            else:
                raise PeerViolation("unexpected_message", f"{w.message_type_name(message_type)} on stream {sid} "
                                                          f"inside a parallel transfer")
        done.sort(key=lambda t: t.shard_index)
        check_shards(done)
        return done

    # -- push ------------------------------------------------------------------------------

    def _reply_waiting(self) -> bool:
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def put(self, key: Union[str, bytes], descriptor: bytes, data: bytes, stream_id: int = 1,
            frame_bytes: Optional[int] = None, *, total_data_bytes: Optional[int] = None) -> PeerReply:
        """TENSOR_PUT, TENSOR_DATA frames of at most ``frame_bytes`` data bytes (by default
        what the server's ``max_message_size`` allows, at most 64 KiB), TENSOR_DATA_END;
        returns the reply (TENSOR_PUT_ACK, or ERROR in ``.error``) (interchange.md
        § TENSOR_PUT Flow).  If the server answers early (an ERROR before the data), the
        client stops sending and returns that answer."""
        data = bytes(data)
        if frame_bytes is None:
            limit = (self.server_hello or {}).get("max_message_size", 1 << 16)
            frame_bytes = max(1, min(1 << 16, limit - 8))
        total = len(data) if total_data_bytes is None else total_data_bytes
        try:
            self.send(w.TENSOR_PUT, stream_id, w.encode_tensor_put(key, descriptor, total))
            for start in range(0, len(data), frame_bytes):
                if self._reply_waiting():
                    break
                self.send(w.TENSOR_DATA, stream_id, w.encode_tensor_data(start, data[start:start + frame_bytes]))
            else:
                if not self._reply_waiting():
                    self.send(w.TENSOR_DATA_END, stream_id)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped listening: its answer may already be waiting
        return self._reply(self.recv())


def check_shards(shards: Sequence[ReceivedTensor]) -> None:
    """interchange.md § Shard Consistency: every shard carries a shard section; all share
    parent_shape, element type and layout tag; the boxes cover parent_shape exactly."""
    parents = set()
    for s in shards:
        if s.parsed.shard is None:
            raise PeerViolation("shard_mismatch", f"shard {s.shard_index} has no shard section")
        parents.add((tuple(s.parsed.shard.parent_shape), s.parsed.type_tag, s.parsed.layout_tag))
    if len(parents) != 1:
        raise PeerViolation("shard_mismatch", f"shards disagree on (parent_shape, type, layout): {sorted(parents)}")
    (parent_shape, _, _), = parents
    verdict = w.cover_verdict(parent_shape, [(s.parsed.shard.shard_offset, s.parsed.shape) for s in shards])
    if verdict == "overlap":
        raise PeerViolation("shard_overlap", "shard boxes overlap")
    if verdict == "gap":
        raise PeerViolation("shard_gap", "shard boxes leave part of parent_shape uncovered")
    if verdict != "ok":
        raise PeerViolation("shard_mismatch", f"shard boxes: {verdict}")


def place_boxes(parent_shape: Sequence[int], itemsize: int, pieces) -> bytes:
    """Row-major bytes of ``parent_shape`` from ``(offset, shape, data)`` pieces, each the
    row-major bytes of its box (whole-byte element types; uncovered bytes stay zero).
    What a client does to reassemble shards or a partition (interchange.md § Parallel
    Transfer Flow, step 4)."""
    parent_shape = tuple(int(s) for s in parent_shape)
    rank = len(parent_shape)
    out = bytearray(w.element_count(parent_shape) * itemsize)
    strides = [1] * rank
    for k in range(rank - 2, -1, -1):
        strides[k] = strides[k + 1] * parent_shape[k + 1]
    for offset, shape, data in pieces:
        shape = tuple(int(s) for s in shape)
        n = w.element_count(shape)
        if len(data) != n * itemsize:
            raise ValueError(f"a box of shape {shape} holds {n * itemsize} bytes, got {len(data)}")
        if n == 0:
            continue
        if rank == 0:
            out[:] = data
            continue
        row = shape[-1] * itemsize
        for src_row, idx in enumerate(itertools.product(*(range(s) for s in shape[:-1]))):
            dst = sum((o + i) * st for o, i, st in zip(offset, idx + (0,), strides))
            out[dst * itemsize:dst * itemsize + row] = data[src_row * row:(src_row + 1) * row]
    return bytes(out)
