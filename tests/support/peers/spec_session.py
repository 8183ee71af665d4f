"""An independent judge of one recorded direction of a Hurray session, from the spec's tables.

A recorded session is two byte streams: what the client sent (``NAME.client.msgs``, judged by
the **server**, its receiver) and what the server sent (``NAME.server.msgs``, judged by the
**client**).  :func:`judge` reads one direction message by message, as its receiver must, with
what the receiver itself sent (the other direction, ``peer``) beside it: the server needs its
own SERVER_HELLO (the limit it advertised, its capabilities); the client needs its CLIENT_HELLO
(its version, devices, memory classes, capabilities and limit) and the requests and PUTs it sent
(what a response answers).  The first fault found is returned as ``(rule_id, byte offset)``,
the offset counted from the first byte of the judged direction.

Only :mod:`struct`, :mod:`support.peers.spec_wire` and the standard library are used: this
module must never import ``hurray_schema`` (see the package docstring).  The rule ids are the
names the project's manifest gives the rules (``manifest.json`` of ``hurray-schema vectors``);
they are strings here, not imported.

Where a fault is placed
-----------------------
A rule about a *message* (its type, its place in the session, its stream) is placed at the
message's first byte.  A rule about one *field* is placed at that field's first byte:

* ``session.message.size`` and ``session.payload.length`` at the header's ``payload_length``
  field (byte 8 of the message): the payload length is what is wrong, whether the payload is
  too big for the receiver or does not hold exactly its table (interchange.md § Message
  Framing).  A careful reader could also name the first surplus byte of a too-long payload;
  the project's convention is the ``payload_length`` field and this judge follows it;
* ``session.hello.version`` at ``protocol_version``, ``session.capabilities.*`` at
  ``capability_flags`` (interchange.md § CLIENT_HELLO Payload, § Capability Flags);
* ``session.request.alignment`` at ``min_alignment``, ``session.request.flags.reserved`` at
  ``request_flags`` (interchange.md § TENSOR_REQUEST Payload);
* ``session.key.utf8`` at the first byte of the string that is not valid UTF-8;
* the placement rules (``session.device.accept``, ``session.device.selection``,
  ``session.memory_class``) at the first byte of the TENSOR_DESCRIPTOR's descriptor (byte 12 of
  the message), not at the offending ``device_tag`` / ``memory_class`` byte of the buffer handle:
  this is the project's convention (the placement is read off the descriptor as a whole), and
  this judge follows it;
* the shard rules at the TENSOR_DESCRIPTOR message's first byte: ``session.shards.requested``
  at the first shard of a transfer nobody asked for, ``session.shards.consistency`` at the
  descriptor with which the faulty set is seen (once every shard's descriptor arrived,
  interchange.md § Shard Consistency), again the project's convention.

Which fault is "first": messages in order; within one message, by the byte the fault is placed
at, and among faults placed at the same byte, in the order of the checks below (the message
type's validity, the session's opening, the direction, RDMA agreement, a closed stream, a PUT
in flight; then the header's stream_id, then its payload_length).  The project's own checker
reads a header's stream_id and payload_length before its message_type, a hello's capability
flags before its version and a request's flags before its alignment; only a message with two
faults can tell the difference.

Readings of the spec this judge takes
-------------------------------------
* RDMA_REGISTER / RDMA_READY are judged only by agreement: allowed once both hellos advertised
  RDMA_DATA_PLANE (interchange.md § RDMA Data Plane, § Overview), whatever the handshake (the
  project, which implements no RDMA, refuses them even then).
* An ERROR's ``message`` is a ``utf8 string`` in § ERROR Payload's table, so text that is not
  UTF-8 is a fault, filed with the tensor_key under ``session.key.utf8`` as the project's rule
  statement files it (the project's decoder reads such text with replacement characters and
  reports nothing).
* A client's CLIENT_HELLO with ``protocol_version`` 0 is the fault of ``session.hello.version``:
  there is no version 0, so no SERVER_HELLO version can be at most the client's (§ SERVER_HELLO
  Payload) and the server must refuse.

What is not judged
------------------
Timing between the two directions is not recorded, so an ERROR sent by the *other* side is not
taken to close a stream in the judged direction; only ERRORs in the judged direction do.  On the
client's side an ERROR answers the stream's oldest awaited request (or PUT), and the stream is
closed only when the client sent no further request or PUT on it: stream ids are opaque
(§ Overview) and the spec does not say whether a closed id may carry a new request.  The
descriptor itself is read with :func:`spec_wire.parse_descriptor` only as far as the placement
and shard rules need; a descriptor that minimal reader cannot read raises :class:`Unjudged`
rather than being given a verdict.  The project's private shared-memory extension (message types
0xF0-0xFE agreed over a Unix socket) is not in the spec's tables: its messages pass as agreed
private types only when ``private`` lists them, and their payloads are not read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from . import spec_wire as w

SERVER = "server"
CLIENT = "client"

# -- rule ids, as the project's manifest names them --------------------------------------------
HELLO_FIRST = "session.hello.first"
SERVER_HELLO_FIRST = "session.hello.server_first"
HELLO_VERSION = "session.hello.version"
CAPABILITIES_RESERVED = "session.capabilities.reserved"
CAPABILITIES_GPUDIRECT = "session.capabilities.gpudirect"
PAYLOAD_LENGTH = "session.payload.length"
MESSAGE_SIZE = "session.message.size"
MESSAGE_DIRECTION = "session.message.direction"
MESSAGE_PRIVATE = "session.message.private"
KEY_UTF8 = "session.key.utf8"
ERROR_CLOSES = "session.error.closes"
REQUEST_FLAGS_RESERVED = "session.request.flags.reserved"
REQUEST_ALIGNMENT = "session.request.alignment"
RDMA_AGREED = "session.rdma.agreed"
MEMORY_CLASS = "session.memory_class"
DEVICE_ACCEPT = "session.device.accept"
DEVICE_SELECTION = "session.device.selection"
SHARDS_REQUESTED = "session.shards.requested"
SHARDS_CONSISTENCY = "session.shards.consistency"
PUT_FLOW = "session.put.flow"

COVERED = frozenset({
    HELLO_FIRST, SERVER_HELLO_FIRST, HELLO_VERSION, CAPABILITIES_RESERVED, CAPABILITIES_GPUDIRECT, PAYLOAD_LENGTH,
    MESSAGE_SIZE, MESSAGE_DIRECTION, MESSAGE_PRIVATE, KEY_UTF8, ERROR_CLOSES, REQUEST_FLAGS_RESERVED,
    REQUEST_ALIGNMENT, RDMA_AGREED, MEMORY_CLASS, DEVICE_ACCEPT, DEVICE_SELECTION, SHARDS_REQUESTED,
    SHARDS_CONSISTENCY, PUT_FLOW,
})
"""The session rules this judge decides, fault and no fault alike."""

# Stream-level rules the judge can also meet on its way (interchange.md § Message Framing,
# § Message Types, § Ordering Invariant, § TENSOR_DESCRIPTOR Payload, § TENSOR_DATA Payload,
# § TENSOR_DATA_END Payload); it reports them but does not claim to decide them completely.
MESSAGE_TYPE = "stream.message.type"
MESSAGE_STREAM_ID = "stream.message.stream_id"
MESSAGE_TRUNCATED = "stream.message.truncated"
MESSAGE_ORDER = "stream.message.order"
DESCRIPTOR_PAYLOAD = "stream.descriptor.payload"
DATA_FRAME = "stream.data.frame"
DATA_END_PAYLOAD = "stream.data_end.payload"

# -- offsets inside a message (interchange.md § Message Framing, § CLIENT_HELLO Payload) ------
_STREAM_ID_AT = 4
_PAYLOAD_LENGTH_AT = 8
_VERSION_AT = w.HEADER_SIZE          # protocol_version: first field of a hello
_CAPABILITIES_AT = w.HEADER_SIZE + 8  # after protocol_version u32 and max_message_size u32

KNOWN_TYPES = frozenset(range(w.CLIENT_HELLO, w.RDMA_READY + 1))
"""interchange.md § Message Types: the tags 0x01-0x0D the table defines."""
CLIENT_ONLY = frozenset({w.CLIENT_HELLO, w.TENSOR_REQUEST, w.TENSOR_PUT})
"""Types the table sends client to server only."""
SERVER_ONLY = frozenset({w.SERVER_HELLO, w.TENSOR_DESCRIPTOR, w.TENSOR_PUT_ACK})
"""Types the table sends server to client only.  TENSOR_DATA and TENSOR_DATA_END, listed there
as server to client, also carry a PUT's data to the server (§ TENSOR_PUT Flow): they travel
either way (:data:`_EITHER_WAY`)."""
_EITHER_WAY = frozenset({w.TENSOR_DATA, w.TENSOR_DATA_END})
_RDMA = frozenset({w.RDMA_REGISTER, w.RDMA_READY})


class Unjudged(Exception):
    """The direction holds something this judge cannot read (a descriptor beyond
    :func:`spec_wire.parse_descriptor`): it gives no verdict rather than a wrong one."""


class _Fault(Exception):
    def __init__(self, rule_id: str, offset: int):
        super().__init__(f"{rule_id} at byte {offset}")
        self.rule_id = rule_id
        self.offset = offset


# ---------------------------------------------------------------------------------------------
# Reading a direction
# ---------------------------------------------------------------------------------------------

@dataclass
class _Message:
    at: int
    message_type: int
    stream_id: int
    payload_length: int
    payload: Optional[bytes]
    """None: the recording ends inside the payload."""


def _messages(data: bytes) -> Iterator[_Message]:
    """The messages of a direction (interchange.md § Message Framing); a cut header raises
    ``stream.message.truncated`` at the end of the data (the first byte that is missing)."""
    at = 0
    while at < len(data):
        if len(data) - at < w.HEADER_SIZE:
            raise _Fault(MESSAGE_TRUNCATED, len(data))
        kind, sid, n = w.decode_header(data[at:at + w.HEADER_SIZE])
        start = at + w.HEADER_SIZE
        payload = data[start:start + n] if start + n <= len(data) else None
        yield _Message(at, kind, sid, n, payload)
        if payload is None:
            return
        at = start + n


def _hello_of(data: Optional[bytes], kind: int) -> Optional[dict]:
    """The hello opening ``data`` (``kind``: CLIENT_HELLO or SERVER_HELLO), read leniently."""
    if not data or len(data) < w.HEADER_SIZE:
        return None
    t, _, n = w.decode_header(data[:w.HEADER_SIZE])
    if t != kind or len(data) < w.HEADER_SIZE + n:
        return None
    try:
        return w.decode_hello(data[w.HEADER_SIZE:w.HEADER_SIZE + n])
    except (w.WireFormatError, struct.error):
        return None


def _read_request(payload: bytes, at: int, *, check: bool = True) -> dict:
    """A TENSOR_REQUEST (interchange.md § TENSOR_REQUEST Payload) field by field, each fault at
    its byte (module docstring); without ``check`` only its table is read (a request the judged
    direction answers, whatever its values)."""
    base = at + w.HEADER_SIZE
    try:
        (n,) = struct.unpack_from("<I", payload, 0)
        key = payload[4:4 + n]
        if len(key) != n:
            raise w.WireFormatError("tensor_key runs past the payload")
        layouts, pos = w.decode_layouts(payload, 4 + n)
        device, alignment, flags = struct.unpack_from("<BII", payload, pos)
        pos += 9
        if pos != len(payload):
            raise w.WireFormatError("bytes after request_flags")
    except (struct.error, w.WireFormatError):
        raise _Fault(PAYLOAD_LENGTH, at + _PAYLOAD_LENGTH_AT) from None
    if not check:
        return {"key": key, "layouts": layouts, "preferred_device": device, "min_alignment": alignment,
                "request_flags": flags}
    _utf8(key, base + 4)
    if not w.is_power_of_two(alignment):
        raise _Fault(REQUEST_ALIGNMENT, base + pos - 8)
    if flags & w.REQ_RESERVED_MASK:
        raise _Fault(REQUEST_FLAGS_RESERVED, base + pos - 4)
    return {"key": key, "layouts": layouts, "preferred_device": device, "min_alignment": alignment,
            "request_flags": flags}


def _read_put(payload: bytes, at: int) -> dict:
    """A TENSOR_PUT (interchange.md § TENSOR_PUT Payload); the descriptor is not read."""
    try:
        (n,) = struct.unpack_from("<I", payload, 0)
        key = payload[4:4 + n]
        (m,) = struct.unpack_from("<I", payload, 4 + n)
        descriptor = payload[8 + n:8 + n + m]
        (total,) = struct.unpack_from("<Q", payload, 8 + n + m)
        if len(key) != n or len(descriptor) != m or 16 + n + m != len(payload):
            raise w.WireFormatError("TENSOR_PUT does not hold its table")
    except (struct.error, w.WireFormatError):
        raise _Fault(PAYLOAD_LENGTH, at + _PAYLOAD_LENGTH_AT) from None
    _utf8(key, at + w.HEADER_SIZE + 4)
    return {"key": key, "descriptor": descriptor, "total_data_bytes": total}


def _read_error(payload: bytes, at: int) -> int:
    """An ERROR (interchange.md § ERROR Payload): its code; the message must be UTF-8 (the
    project files this under ``session.key.utf8``)."""
    try:
        code, n = struct.unpack_from("<II", payload, 0)
        if 8 + n != len(payload):
            raise w.WireFormatError("ERROR does not hold its table")
    except (struct.error, w.WireFormatError):
        raise _Fault(PAYLOAD_LENGTH, at + _PAYLOAD_LENGTH_AT) from None
    _utf8(payload[8:], at + w.HEADER_SIZE + 8)
    return code


def _utf8(raw: bytes, at: int) -> None:
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Fault(KEY_UTF8, at + exc.start) from None


def _read_hello(msg: _Message, client_version: Optional[int] = None) -> dict:
    """A CLIENT_HELLO (``client_version`` None) or SERVER_HELLO (interchange.md § CLIENT_HELLO
    Payload, § SERVER_HELLO Payload, § Capability Flags).  A client's version must be one a server
    can answer with (at least 1, SERVER_HELLO's version being at least 1 and at most the client's);
    a server's at least 1 and at most the client's."""
    try:
        hello = w.decode_hello(msg.payload)
    except (w.WireFormatError, struct.error):
        raise _Fault(PAYLOAD_LENGTH, msg.at + _PAYLOAD_LENGTH_AT) from None
    version = hello["protocol_version"]
    highest = version if client_version is None else client_version
    if not 1 <= version <= highest:
        raise _Fault(HELLO_VERSION, msg.at + _VERSION_AT)
    caps = hello["capability_flags"]
    if caps & w.CAP_RESERVED_MASK:
        raise _Fault(CAPABILITIES_RESERVED, msg.at + _CAPABILITIES_AT)
    if caps & w.CAP_RDMA_GPUDIRECT and not caps & w.CAP_RDMA_DATA_PLANE:
        raise _Fault(CAPABILITIES_GPUDIRECT, msg.at + _CAPABILITIES_AT)
    return hello


# ---------------------------------------------------------------------------------------------
# The two receivers
# ---------------------------------------------------------------------------------------------

class _Receiver:
    """What both receivers check of every message header (interchange.md § Message Framing,
    § Message Types, § Error Handling, § RDMA Data Plane)."""

    side = ""

    def __init__(self, limit: Optional[int], private: Iterable[int], own_hello: Optional[dict], own_known: bool):
        self.limit = limit
        self.private = frozenset(private)
        self.own_hello = own_hello
        self.own_known = own_known
        """The receiver's own direction was given (without it, its hello is unknown, not absent)."""
        self.peer_hello: Optional[dict] = None
        self.count = 0
        self.closed: set[int] = set()

    def run(self, data: bytes) -> None:
        for msg in _messages(data):
            self.header(msg)
            if msg.stream_id == 0:
                raise _Fault(MESSAGE_STREAM_ID, msg.at + _STREAM_ID_AT)
            if self.limit is not None and msg.payload_length > self.limit:
                raise _Fault(MESSAGE_SIZE, msg.at + _PAYLOAD_LENGTH_AT)
            if msg.payload is None:
                raise _Fault(MESSAGE_TRUNCATED, len(data))
            self.payload(msg)

    def header(self, msg: _Message) -> None:
        kind = msg.message_type
        if kind not in KNOWN_TYPES:
            if 0xF0 <= kind <= 0xFE:
                if kind not in self.private:
                    raise _Fault(MESSAGE_PRIVATE, msg.at)
            else:
                raise _Fault(MESSAGE_TYPE, msg.at)
        first = self.count == 0
        self.count += 1
        self.opening(msg, first)
        wrong_way = CLIENT_ONLY if self.side == CLIENT else SERVER_ONLY
        if kind in wrong_way:
            raise _Fault(MESSAGE_DIRECTION, msg.at)
        if kind in _RDMA and not self.rdma_agreed():
            raise _Fault(RDMA_AGREED, msg.at)
        if msg.stream_id in self.closed:
            raise _Fault(ERROR_CLOSES, msg.at)
        self.in_flight(msg)

    def rdma_agreed(self) -> bool:
        """Both hellos advertised RDMA_DATA_PLANE (interchange.md § RDMA Data Plane, § Overview); the
        receiver's own hello counts as advertising it when its direction is unknown."""
        hellos = (self.own_hello, self.peer_hello) if self.own_known else (self.peer_hello,)
        return all(h is not None and h["capability_flags"] & w.CAP_RDMA_DATA_PLANE for h in hellos)

    def opening(self, msg: _Message, first: bool) -> None:
        raise NotImplementedError

    def in_flight(self, msg: _Message) -> None:
        pass

    def payload(self, msg: _Message) -> None:
        raise NotImplementedError

    def empty(self, msg: _Message, rule: str = PAYLOAD_LENGTH) -> None:
        if msg.payload_length:
            raise _Fault(rule, msg.at + _PAYLOAD_LENGTH_AT)


class _ServerReceives(_Receiver):
    """The server's view of what the client sent."""

    side = SERVER

    def __init__(self, limit, private, own_hello, own_known):
        super().__init__(limit, private, own_hello, own_known)
        self.puts: dict[int, int] = {}
        """Streams with a TENSOR_PUT whose TENSOR_DATA_END has not arrived."""

    def opening(self, msg, first):
        # interchange.md § SERVER_HELLO Payload (the paragraph after the note): CLIENT_HELLO
        # first on every connection, and only there.
        if (msg.message_type == w.CLIENT_HELLO) != first:
            raise _Fault(HELLO_FIRST, msg.at)

    def in_flight(self, msg):
        # interchange.md § TENSOR_PUT Flow: a PUT's stream carries its frames and end next.
        if msg.stream_id in self.puts and msg.message_type not in _EITHER_WAY:
            raise _Fault(PUT_FLOW, msg.at)

    def payload(self, msg):
        kind, sid = msg.message_type, msg.stream_id
        if kind == w.CLIENT_HELLO:
            self.peer_hello = _read_hello(msg)
        elif kind == w.TENSOR_REQUEST:
            _read_request(msg.payload, msg.at)
        elif kind == w.TENSOR_PUT:
            _read_put(msg.payload, msg.at)
            self.puts[sid] = 1
        elif kind == w.TENSOR_DATA:
            if sid not in self.puts:
                raise _Fault(MESSAGE_ORDER, msg.at)
            if msg.payload_length < 8:
                raise _Fault(DATA_FRAME, msg.at + _PAYLOAD_LENGTH_AT)
        elif kind == w.TENSOR_DATA_END:
            if sid not in self.puts:
                raise _Fault(MESSAGE_ORDER, msg.at)
            self.empty(msg, DATA_END_PAYLOAD)
            del self.puts[sid]
        elif kind == w.ERROR:
            _read_error(msg.payload, msg.at)
            self.closed.add(sid)  # interchange.md § ERROR Payload: the stream is closed
            self.puts.pop(sid, None)
        elif kind == w.RDMA_REGISTER:
            _rdma_register(msg)
        elif kind == w.RDMA_READY:
            self.empty(msg)


def _rdma_register(msg: _Message) -> None:
    try:
        w.decode_rdma_register(msg.payload)
    except (w.WireFormatError, struct.error):
        raise _Fault(PAYLOAD_LENGTH, msg.at + _PAYLOAD_LENGTH_AT) from None


@dataclass
class _Transfer:
    """One parallel transfer (interchange.md § Parallel Transfer Flow): its shards by stream."""

    owner: Optional[int]
    request: Optional[dict]
    count: int
    shards: dict = field(default_factory=dict)
    """stream -> (shard_index, parsed descriptor)"""
    ended: set = field(default_factory=set)

    @property
    def arrived(self) -> bool:
        return len(self.shards) >= self.count


@dataclass
class _Awaited:
    """A request the client sent on a stream, awaiting its answer."""

    request: dict
    owed: int = 1
    """Tensors still owed: one, plus a composite head's member_count (§ Composite Tensor Streaming)."""


class _ClientReceives(_Receiver):
    """The client's view of what the server sent, with the client's own direction beside it."""

    side = CLIENT

    def __init__(self, limit, private, own_hello, own_known, requests, puts, last_request):
        super().__init__(limit, private, own_hello, own_known)
        self.knows_requests = own_known
        """The client's direction was given: what a response answers can be judged."""
        self.requests: dict[int, list[_Awaited]] = requests
        self.puts: dict[int, int] = puts
        self.last_request = last_request
        self.tensors: dict[int, Optional[_Transfer]] = {}
        """Streams with a tensor between its TENSOR_DESCRIPTOR and TENSOR_DATA_END (its transfer)."""
        self.transfers: dict[int, _Transfer] = {}

    def opening(self, msg, first):
        # interchange.md § SERVER_HELLO Payload: SERVER_HELLO (or ERROR) before anything else, once.
        if first and msg.message_type not in (w.SERVER_HELLO, w.ERROR):
            raise _Fault(SERVER_HELLO_FIRST, msg.at)
        if not first and msg.message_type == w.SERVER_HELLO:
            raise _Fault(SERVER_HELLO_FIRST, msg.at)

    def payload(self, msg):
        kind, sid = msg.message_type, msg.stream_id
        if kind == w.SERVER_HELLO:
            mine = self.own_hello["protocol_version"] if self.own_hello else w.PROTOCOL_VERSION
            self.peer_hello = _read_hello(msg, client_version=mine)
        elif kind == w.TENSOR_DESCRIPTOR:
            self.descriptor(msg)
        elif kind == w.TENSOR_DATA:
            if sid not in self.tensors:
                raise _Fault(MESSAGE_ORDER, msg.at)
            if msg.payload_length < 8:
                raise _Fault(DATA_FRAME, msg.at + _PAYLOAD_LENGTH_AT)
        elif kind == w.TENSOR_DATA_END:
            if sid not in self.tensors:
                raise _Fault(MESSAGE_ORDER, msg.at)
            self.empty(msg, DATA_END_PAYLOAD)
            self.end(sid)
        elif kind == w.TENSOR_PUT_ACK:
            # § TENSOR_PUT Flow: an ACK answers a whole PUT the client sent on that stream.
            if not self.puts.get(sid):
                if self.knows_requests:
                    raise _Fault(PUT_FLOW, msg.at)
            else:
                self.puts[sid] -= 1
            self.empty(msg)
        elif kind == w.ERROR:
            _read_error(msg.payload, msg.at)
            self.error(sid)
        elif kind == w.RDMA_REGISTER:
            _rdma_register(msg)
        elif kind == w.RDMA_READY:
            self.empty(msg)

    # -- a response ------------------------------------------------------------------------
    def descriptor(self, msg: _Message) -> None:
        sid, at = msg.stream_id, msg.at
        if sid in self.tensors:  # § Ordering Invariant: one tensor at a time per stream
            raise _Fault(MESSAGE_ORDER, at)
        try:
            split = w.decode_descriptor_message(msg.payload)
        except w.WireFormatError:
            raise _Fault(DESCRIPTOR_PAYLOAD, at + _PAYLOAD_LENGTH_AT) from None
        try:
            desc = w.parse_descriptor(split["descriptor"])
        except (w.WireFormatError, struct.error) as exc:
            raise Unjudged(f"the descriptor at byte {at + w.HEADER_SIZE}: {exc}") from None
        shards = split["total_shards"]
        transfer = self.transfers.get(sid)
        if transfer is None and shards > 1:
            transfer = self.open_transfer(sid, shards, at)
        if transfer is not None:
            request = transfer.request
        else:
            awaited = self.requests.get(sid)
            if awaited:
                request = awaited[0].request
                awaited[0].owed += desc.member_count - 1
            elif self.knows_requests:
                raise _Fault(MESSAGE_ORDER, at)  # a tensor no request on this stream awaits
            else:
                request = None
        self.placement(desc, request, at + w.HEADER_SIZE)
        if transfer is not None:
            self.add_shard(transfer, sid, split["shard_index"], shards, desc, at)
        self.tensors[sid] = transfer

    def open_transfer(self, sid: int, shards: int, at: int) -> _Transfer:
        """The transfer a first shard opens (or the open one it joins): the client asked for
        shards (PARALLEL_OK) and the server offered them (PARALLEL_STREAMS), interchange.md
        § Parallel Transfers, § Overview."""
        for transfer in self.transfers.values():
            if not transfer.arrived:
                return transfer
        owner = sid if self.requests.get(sid) else self.last_request
        awaited = self.requests.get(owner) if owner is not None else None
        request = awaited[0].request if awaited else None
        asked = request is not None and request["request_flags"] & w.REQ_PARALLEL_OK
        offered = self.peer_hello is not None and self.peer_hello["capability_flags"] & w.CAP_PARALLEL_STREAMS
        if self.knows_requests and not (asked and offered):
            raise _Fault(SHARDS_REQUESTED, at)
        return _Transfer(owner, request, shards)

    def add_shard(self, transfer: _Transfer, sid: int, index: int, shards: int, desc, at: int) -> None:
        """interchange.md § Shard Consistency, checked once every shard's descriptor arrived."""
        if shards != transfer.count or sid in transfer.shards or transfer.arrived or index >= shards \
                or index in {i for i, _ in transfer.shards.values()}:
            raise _Fault(SHARDS_CONSISTENCY, at)
        transfer.shards[sid] = (index, desc)
        self.transfers[sid] = transfer
        if not transfer.arrived:
            return
        descs = [d for _, d in transfer.shards.values()]
        if any(d.shard is None for d in descs):
            raise _Fault(SHARDS_CONSISTENCY, at)
        first = descs[0]
        if any((tuple(d.shard.parent_shape), d.type_tag, d.layout_tag)
               != (tuple(first.shard.parent_shape), first.type_tag, first.layout_tag) for d in descs):
            raise _Fault(SHARDS_CONSISTENCY, at)
        boxes = [(d.shard.shard_offset, d.shape) for d in descs]
        if w.cover_verdict(first.shard.parent_shape, boxes) != "ok":
            raise _Fault(SHARDS_CONSISTENCY, at)

    def placement(self, desc, request: Optional[dict], at: int) -> None:
        """interchange.md § Server Device Selection (rules 1-6, as far as the client sees them)
        and the note of § SERVER_HELLO Payload on memory classes."""
        mine, theirs = self.own_hello, self.peer_hello
        if request is None or mine is None or theirs is None:
            return
        preferred = request["preferred_device"]
        for buffer in desc.buffers:
            placed = buffer.device_tag
            if placed != preferred:
                if placed not in mine["devices"]:
                    raise _Fault(DEVICE_ACCEPT, at)  # rule 6
                # rule 4: the only silent fallback is to CPU, for a device the server advertised
                if not (placed == w.DEVICE_CPU and preferred in theirs["devices"]):
                    raise _Fault(DEVICE_SELECTION, at)
            if buffer.memory_class not in mine["memory_classes"]:
                raise _Fault(MEMORY_CLASS, at)

    def end(self, sid: int) -> None:
        transfer = self.tensors.pop(sid)
        if transfer is not None:
            transfer.ended.add(sid)
            if len(transfer.ended) == transfer.count:
                for s in transfer.shards:
                    self.transfers.pop(s, None)
                self.answered(transfer.owner)
            return
        awaited = self.requests.get(sid)
        if awaited and awaited[0].owed <= 0:
            self.answered(sid)

    def answered(self, sid: Optional[int]) -> None:
        awaited = self.requests.get(sid)
        if awaited:
            awaited.pop(0)

    def error(self, sid: int) -> None:
        """The ERROR answers the stream's current request (or PUT); the stream is closed unless
        the client sent another one on it."""
        self.tensors.pop(sid, None)
        if self.requests.get(sid):
            self.answered(sid)
        elif self.puts.get(sid):
            self.puts[sid] -= 1
        if self.knows_requests and not self.requests.get(sid) and not self.puts.get(sid):
            self.closed.add(sid)


def _client_side(peer: Optional[bytes]):
    """From the client's own direction: its hello, its requests per stream (in order), its whole
    PUTs per stream and the stream of its last request, read leniently (a recording may end
    inside a message)."""
    hello = _hello_of(peer, w.CLIENT_HELLO)
    requests: dict[int, list[_Awaited]] = {}
    puts: dict[int, int] = {}
    putting: set[int] = set()
    last = None
    try:
        for msg in _messages(peer or b""):
            if msg.payload is None:
                break
            if msg.message_type == w.TENSOR_REQUEST:
                try:
                    request = _read_request(msg.payload, msg.at, check=False)
                except _Fault:
                    continue
                requests.setdefault(msg.stream_id, []).append(_Awaited(request))
                last = msg.stream_id
            elif msg.message_type == w.TENSOR_PUT:
                putting.add(msg.stream_id)
            elif msg.message_type == w.TENSOR_DATA_END and msg.stream_id in putting:
                putting.discard(msg.stream_id)
                puts[msg.stream_id] = puts.get(msg.stream_id, 0) + 1
    except _Fault:
        pass
    return hello, requests, puts, last


# ---------------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------------

def judge(data: bytes, receiver: str, peer: Optional[bytes] = None, *, max_message_size: Optional[int] = None,
          private: Iterable[int] = ()) -> Optional[tuple[str, int]]:
    """The first fault the ``receiver`` (``"server"``: ``data`` is what the client sent;
    ``"client"``: what the server sent) finds in ``data``, as ``(rule_id, byte offset)``, or None.

    ``peer`` is the other direction of the session, what the receiver sent; None when it is not
    known, and then what needs it is not judged (the receiver's own hello: its limit, its version,
    devices and memory classes, RDMA agreement; on the client's side the requests and PUTs a
    response answers).  ``max_message_size``
    is the receiver's limit (interchange.md § Message Framing): for a server, the limit it was
    configured with; when None, the ``max_message_size`` of the receiver's own hello in ``peer``
    (none without one).  ``private`` are the private message types (0xF0-0xFE) the receiver
    agreed to out of band (interchange.md § Message Types); none by default.  Raises
    :class:`Unjudged` for a direction it cannot read."""
    data = bytes(data)
    if receiver == SERVER:
        own = _hello_of(peer, w.SERVER_HELLO)
        limit = max_message_size if max_message_size is not None else (own or {}).get("max_message_size")
        checker: _Receiver = _ServerReceives(limit, private, own, peer is not None)
    elif receiver == CLIENT:
        own, requests, puts, last = _client_side(peer)
        limit = max_message_size if max_message_size is not None else (own or {}).get("max_message_size")
        checker = _ClientReceives(limit, private, own, peer is not None, requests, puts, last)
    else:
        raise ValueError(f"receiver is {SERVER!r} or {CLIENT!r}, not {receiver!r}")
    try:
        checker.run(data)
    except _Fault as fault:
        return fault.rule_id, fault.offset
    return None
