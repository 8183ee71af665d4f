"""The one checker of what a session peer receives (``interchange.md`` § Network Transport
Protocol through § Error Handling).

:class:`SessionChecker` follows one direction of one connection, message by message: the
server runs one on what its client sends, the client on what its server sends, and ``audit``
on a recorded direction.  Each fault raises the rule's :class:`~hurray_schema.errors.SpecViolation`
at the byte offset the message has in that direction (the connection's first byte is 0), so
the three entry points name the same rule at the same byte.  The client side also judges what the
server made of the client's own messages, where the bytes show it: an ACK for a PUT no server may
accept (:class:`PushJudge`), an ERROR refusing a layout list for its extension entries; ``audit``
reads the client's messages from its recording beside the server's (:func:`other_direction`).

What a tensor's messages must be (descriptor, contiguous frames, end) is
:class:`~hurray_schema.io.walk.TensorFrames`, the check the stream reader runs on a recorded
message stream.
"""

from __future__ import annotations

import enum
import os
from collections import deque
from typing import Callable, Iterable, Iterator, Optional

import attrs

from ..errors import HurraySchemaError, SpecViolation
from ..io.walk.common import FAULT, MESSAGE, MESSAGE_HEADER_PART, Faults
from ..io.walk import (
    TensorFrames, Window, check_message_header, collect_descriptor, remote_error, strict_describer, walk_messages,
)
from ..limits import DEFAULT_LIMITS, HARD_MAXIMUM, Limits
from ..model import CompositeLayout, TensorDescriptor
from ..rules import container as container_rules
from ..rules import session as rules
from ..rules.composite import CompositeBinder, validate_preorder
from ..rules.engine import Mode
from ..structs._declare import power_of_two, static_offset
from ..structs.session import (
    CLIENT_HELLO, KNOWN_CAPABILITY_FLAGS, KNOWN_REQUEST_FLAGS, PROTOCOL_VERSION, TENSOR_REQUEST, CapabilityFlag,
    ErrorCode, RequestFlag, ShmMessageType, is_extension_layout,
)
from ..structs.stream import MessageType
from ..structs.tags import CompositionRule, LayoutTag
from . import messages as m
from .devices import check_placement

__all__ = ["Side", "SessionChecker", "Transfer", "ClosedStreams", "CLIENT_SENDS", "SERVER_SENDS", "message_name",
           "check_min_alignment", "recorded_side", "recorded_side_of", "recorded_locally", "check_recorded",
           "other_direction", "recorded_puts", "PeerRecording", "PushJudge", "described_put",
           "refused_for_extensions"]


class Side(str, enum.Enum):
    """Which peer receives what a checker follows."""

    SERVER = "server"
    CLIENT = "client"


CLIENT_SENDS = frozenset({MessageType.CLIENT_HELLO, MessageType.TENSOR_REQUEST, MessageType.TENSOR_PUT,
                          ShmMessageType.SHM_REQUEST, ShmMessageType.SHM_PUT})
SERVER_SENDS = frozenset({MessageType.SERVER_HELLO, MessageType.TENSOR_DESCRIPTOR, MessageType.TENSOR_PUT_ACK,
                          ShmMessageType.SHM_DATA})
_SHM_TYPES = frozenset(int(t) for t in ShmMessageType)
SHM_CLIENT_TYPES = frozenset({int(ShmMessageType.SHM_REQUEST), int(ShmMessageType.SHM_PUT)})
"""The private types a server agrees to over a Unix socket."""
SHM_SERVER_TYPES = frozenset({int(ShmMessageType.SHM_DATA)})
"""The private type a client agrees to when it asks for shared memory."""
LOCAL_MARK = "-unix"
"""Ends the name of a recording made over a Unix socket, where the shared-memory extension is agreed."""
"""The message types whose direction the table fixes (``interchange.md § Message Types``); the
others travel either way (TENSOR_DATA and TENSOR_DATA_END too: a PUT's data goes to the server)."""

_RDMA = frozenset({MessageType.RDMA_REGISTER, MessageType.RDMA_READY})
_PUT_TYPES = frozenset({int(MessageType.TENSOR_PUT), int(ShmMessageType.SHM_PUT)})


def check_capabilities(flags: int, at: int) -> None:
    """``interchange.md § Capability Flags``: bits 4-63 zero; GPUDirect only with the RDMA data plane."""
    if flags & ~KNOWN_CAPABILITY_FLAGS:
        raise rules.CAPABILITY_RESERVED.violation(
            f"capability_flags 0x{flags:016X} sets reserved bits 0x{flags & ~KNOWN_CAPABILITY_FLAGS:016X}", at)
    if flags & CapabilityFlag.RDMA_GPUDIRECT and not flags & CapabilityFlag.RDMA_DATA_PLANE:
        raise rules.CAPABILITY_GPUDIRECT.violation("RDMA_GPUDIRECT is set without RDMA_DATA_PLANE", at)


def check_min_alignment(min_alignment: int, at: Optional[int] = None) -> None:
    """``interchange.md § TENSOR_REQUEST Payload``: min_alignment is a power of two (a request
    received, at byte ``at``, or one the client is about to send: ``at`` None)."""
    if not power_of_two(min_alignment):
        raise rules.REQUEST_ALIGNMENT.violation(f"min_alignment {min_alignment} is not a power of two", at)


_NAMED_LAYOUTS = frozenset(int(t) for t in LayoutTag)


def refused_for_extensions(entries) -> bool:
    """A reader that refuses the layout list ``entries`` refuses it for its extension entries, which it
    must skip instead (``interchange.md § Layout Entry Encoding``): the list has some, and otherwise
    only layouts the spec names (``memory-layout.md § Named Layout Tags``), none it may call invalid."""
    extension = False
    for entry in entries:
        if is_extension_layout(entry.tag):
            extension = True
        elif entry.tag not in _NAMED_LAYOUTS:
            return False
    return extension


def described_put(payload, at: int, describe: Callable) -> tuple[m.Put, object]:
    """A TENSOR_PUT's table (``interchange.md § TENSOR_PUT Payload``, at byte ``at``) and its
    descriptor's part as ``describe`` takes it, whose buffers hold ``total_data_bytes``."""
    put = m.decode_put(payload, at)
    return put, described(put, describe)


def described(put: m.Put, describe: Callable):
    """The part of ``put``'s descriptor as ``describe`` takes it, once its buffers hold the PUT's
    ``total_data_bytes`` (``interchange.md § TENSOR_PUT Payload``)."""
    part = describe(put.descriptor, put.descriptor_at, 0)
    total = sum(b.byte_size for b in part.value.buffers)
    if put.total_data_bytes != total:
        raise container_rules.TOTAL_DATA_BYTES.violation(
            f"total_data_bytes {put.total_data_bytes} but the buffers hold {total} bytes",
            put.descriptor_at + len(put.descriptor))
    return part


_CAPS_AT = m.HEADER_SIZE + static_offset(CLIENT_HELLO, "capability_flags")
_FLAGS_BACK = m.tail_offset(TENSOR_REQUEST, "request_flags")
_ALIGNMENT_BACK = m.tail_offset(TENSOR_REQUEST, "min_alignment")


class SessionChecker:
    """One received direction of a session.

    ``side`` is the receiver; ``max_payload`` the ``max_message_size`` it advertised (None
    until its hello is sent: the reader's limit applies); ``describe`` decodes a descriptor as
    the readers do (:func:`~hurray_schema.io.walk.strict_describer`).

    The tensors a client pushes are bound per stream (:meth:`bind_put`) under ``mode``;
    ``nodes``, a ``(leaf, assemble)`` pair, is what the binder builds an item from (the
    server's tensors and composites; None: descriptors alone, as ``audit`` binds them), and
    ``findings`` receives what the mode tolerated in the binding (None: nobody asks)."""

    def __init__(self, side: Side, *, describe: Callable, limits: Limits = DEFAULT_LIMITS,
                 max_payload: Optional[int] = None, mode: Mode = Mode.STRICT,
                 nodes: Optional[tuple[Callable, Callable]] = None, findings: Optional[list] = None):
        self.side = Side(side)
        self.describe = describe
        self.limits = limits
        self.max_payload = max_payload
        self.binders: dict[int, CompositeBinder] = {}
        """Server side: per stream, the binder of the item its PUTs push (a composite's head, then
        its members), from the stream's first whole PUT until the item is whole or over."""
        self._binding = {"mode": mode, "validate": True, "findings": findings,
                         **({} if nodes is None else {"leaf": nodes[0], "assemble": nodes[1]})}
        self.max_hello: Optional[int] = None
        """Server side: the largest CLIENT_HELLO payload this server is configured to accept (None:
        ``max_payload`` alone)."""
        self.hello: Optional[m.Hello] = None
        """The peer's hello, once it arrived."""
        self.sent_hello: Optional[m.Hello] = None
        """This side's own hello (the client's, for the version rule)."""
        self.tensors: dict[int, TensorFrames] = {}
        """Per stream, the tensor whose frames are arriving."""
        self.puts: dict[int, m.Put] = {}
        """Per stream, the PUT whose data is arriving (server side)."""
        self.closed = ClosedStreams()
        """The streams an ERROR ended (:meth:`is_closed`), in bounded memory."""
        self.count = 0
        self.requests: dict[int, m.Request] = {}
        """Client side: the requests sent, by stream."""
        self.last_request: Optional[int] = None
        self.awaited: dict[int, int] = {}
        """Client side: per request stream, the tensors its answer still owes (a composite head
        adds its member_count); the request is answered when it owes none."""
        self.acks_due: dict[int, deque] = {}
        """Client side: per stream, the whole PUTs awaiting their ACK, oldest first: for each, None, or
        the fault for which no server may accept it (:class:`PushJudge`)."""
        self.sent_refusable = False
        """Client side: the client sent a PUT no server may accept, which an INVALID_MESSAGE may answer."""
        self.hello_extended = False
        """Client side: the client's hello was valid, and a refusal of its layout list a refusal for its
        extension entries (:func:`refused_for_extensions`)."""
        self.extended: set[int] = set()
        """Client side: the streams of valid requests whose layout lists are so (:func:`refused_for_extensions`),
        until their answer starts."""
        self.transfers: dict[int, Transfer] = {}
        """Client side: the open parallel transfer of each shard stream."""
        self.private: frozenset = frozenset()
        """The private message types this receiver agreed to (``session.message.private``)."""
        self.fds_seen = True
        """Live: descriptors can be seen beside the bytes (not in a recording)."""
        self.recording_without_requests = False
        """A recorded direction audited without its requests: what needs them is not checked."""

    # --- every message ------------------------------------------------------------------
    def header(self, raw, at: int) -> tuple[int, int, int]:
        """``(kind, stream_id, payload_length)`` of the header at ``at``, once it passes the
        framing rules, the hello-first rule, the direction and a closed stream."""
        kind, stream_id, plen = m.unpack_header(raw)
        kind = check_message_header({"message_type": kind, "stream_id": stream_id, "payload_length": plen}, at,
                                    self.limits, max_payload=self.max_payload, private=self.private)
        if kind in _SHM_TYPES:
            kind = ShmMessageType(kind)
        if kind == MessageType.CLIENT_HELLO and self.max_hello is not None and plen > self.max_hello:
            raise rules.MESSAGE_SIZE.violation(
                f"a CLIENT_HELLO of {plen} payload bytes exceeds the {self.max_hello} this server accepts",
                at + m.PAYLOAD_LENGTH_AT)
        first = self.count == 0
        self.count += 1
        if self.side is Side.SERVER:
            if (kind == MessageType.CLIENT_HELLO) != first:
                raise rules.HELLO_FIRST.violation(
                    "CLIENT_HELLO again" if not first else f"the connection starts with {message_name(kind)}, not "
                    "CLIENT_HELLO", at)
            if kind in SERVER_SENDS:
                raise rules.MESSAGE_DIRECTION.violation(f"{message_name(kind)} travels from server to client", at)
        else:
            if first and kind not in (MessageType.SERVER_HELLO, MessageType.ERROR):
                raise rules.SERVER_HELLO_FIRST.violation(
                    f"the server's first message is {message_name(kind)}, not SERVER_HELLO", at)
            if not first and kind == MessageType.SERVER_HELLO:
                raise rules.SERVER_HELLO_FIRST.violation("SERVER_HELLO again", at)
            if kind in CLIENT_SENDS:
                raise rules.MESSAGE_DIRECTION.violation(f"{message_name(kind)} travels from client to server", at)
        if kind in _RDMA and not self.rdma_agreed:
            raise rules.RDMA_AGREED.violation(
                f"{message_name(kind)} without RDMA_DATA_PLANE advertised by both peers", at)
        if self.is_closed(stream_id):
            raise rules.ERROR_CLOSES.violation(f"{message_name(kind)} on stream {stream_id}, which an ERROR closed", at)
        if stream_id in self.puts and kind not in (MessageType.TENSOR_DATA, MessageType.TENSOR_DATA_END):
            raise rules.PUT_FLOW.violation(
                f"{message_name(kind)} on stream {stream_id} before the TENSOR_DATA_END of its TENSOR_PUT", at)
        return kind, stream_id, plen

    @property
    def rdma_agreed(self) -> bool:
        """Both hellos advertised RDMA_DATA_PLANE (``interchange.md § RDMA Data Plane``); this
        implementation never does, so live it is never agreed."""
        hellos = (self.hello, self.sent_hello)
        return all(h is not None and h.capability_flags & CapabilityFlag.RDMA_DATA_PLANE for h in hellos)

    def is_closed(self, stream_id: int) -> bool:
        """``stream_id`` is a stream an ERROR ended, and no exchange holds it open."""
        return self.closed.covers(stream_id) and not self.holds(stream_id)

    def holds(self, stream_id: int) -> bool:
        """An exchange on ``stream_id`` is under way: a tensor arriving, a PUT, a request awaiting
        its answer or ACK, a parallel transfer."""
        return (stream_id in self.tensors or stream_id in self.puts or stream_id in self.awaited
                or stream_id in self.transfers or bool(self.acks_due.get(stream_id)))

    # --- session messages ---------------------------------------------------------------
    def client_hello(self, payload, at: int) -> m.Hello:
        """A CLIENT_HELLO (server side); a version of 0 has no version the server can use."""
        hello = m.decode_hello(payload, at, server=False)
        check_capabilities(hello.capability_flags, at + _CAPS_AT)
        if hello.protocol_version < 1:
            raise rules.HELLO_VERSION.violation(
                f"the client speaks protocol_version {hello.protocol_version}; this server needs 1 to "
                f"{PROTOCOL_VERSION}", at + m.HEADER_SIZE)
        self.hello = hello
        return hello

    def server_hello(self, payload, at: int) -> m.Hello:
        """A SERVER_HELLO (client side): a version no newer than the client's."""
        hello = m.decode_hello(payload, at, server=True)
        check_capabilities(hello.capability_flags, at + _CAPS_AT)
        mine = self.sent_hello.protocol_version if self.sent_hello is not None else PROTOCOL_VERSION
        if not 1 <= hello.protocol_version <= mine:
            raise rules.HELLO_VERSION.violation(
                f"SERVER_HELLO protocol_version {hello.protocol_version}, the client's is {mine}", at + m.HEADER_SIZE)
        self.hello = hello
        return hello

    def request(self, stream_id: int, payload, at: int) -> m.Request:
        """A TENSOR_REQUEST: its table, reserved bits and alignment."""
        req = m.decode_request(payload, at)
        end = at + m.HEADER_SIZE + len(payload)
        if req.flags & ~KNOWN_REQUEST_FLAGS:
            raise rules.REQUEST_FLAGS_RESERVED.violation(
                f"request_flags 0x{req.flags:08X} sets reserved bits", end - _FLAGS_BACK)
        check_min_alignment(req.min_alignment, end - _ALIGNMENT_BACK)
        return req

    def put(self, stream_id: int, payload, at: int, *, shared: bool = False) -> tuple[m.Put, object]:
        """A TENSOR_PUT: its table and descriptor; its frames are expected next on the stream
        (an SHM_PUT, ``shared``: its data came with it, nothing follows).  Returns the PUT and the
        descriptor's part."""
        put, part = described_put(payload, at, self.describe)
        total = put.total_data_bytes
        if not shared:
            self.puts[stream_id] = put
            self.tensors[stream_id] = TensorFrames(part.value, at, total, {"total_data_bytes": total})
        return put, part

    def bind_put(self, stream_id: int, put: m.Put, desc, payload=None) -> list:
        """A whole pushed tensor (its TENSOR_DATA_END arrived, or its SHM_PUT): its descriptor,
        at ``put.descriptor_at``, bound into the item its stream pushes, a composite's head first
        and then its members (``interchange.md § TENSOR_PUT Flow``, ``layouts/composite.md §
        Binding``).  The stream's first PUT opens the item.  Returns the item's node once it is
        whole, else [] (more members to come); a binding fault raises, and the item is over."""
        binder = self.binders.get(stream_id)
        if binder is None:
            binder = self.binders[stream_id] = CompositeBinder(**self._binding)
        try:
            done = binder.add(desc, put.descriptor_at, payload)
        except SpecViolation:
            del self.binders[stream_id]
            raise
        if done:
            del self.binders[stream_id]
        return done

    def drop_put(self, stream_id: int) -> None:
        """The item a PUT on ``stream_id`` was pushing is over (stored, refused, abandoned or
        ended by an ERROR): its frames are no longer expected and its binding is forgotten."""
        self.tensors.pop(stream_id, None)
        self.puts.pop(stream_id, None)
        self.binders.pop(stream_id, None)

    def shm_data(self, stream_id: int, payload, at: int, file_size: Optional[int]) -> tuple[TensorFrames, list]:
        """An SHM_DATA (client side; agreed: ``session.message.private`` otherwise): inside a tensor, with a
        descriptor (``file_size`` its size; None: none came) and one segment per buffer of its
        handle's size inside it.  Returns the tensor and ``(offset, size)`` per buffer; the
        tensor's data has then arrived whole."""
        frames = self._open(stream_id, "SHM_DATA", at)
        segments = m.decode_shm_data(payload, at)
        if file_size is None and not self.recording_without_requests and self.fds_seen:
            raise rules.SHM_SEGMENTS.violation("SHM_DATA without a file descriptor passed beside it", at)
        sizes = [int(h.byte_size) for h in frames.desc.buffers]
        if [size for _, size in segments] != sizes:
            raise rules.SHM_SEGMENTS.violation(
                f"segments of {[size for _, size in segments]} bytes for buffers of {sizes}", at + m.HEADER_SIZE)
        if file_size is not None:
            for offset, size in segments:
                if offset + size > file_size:
                    raise rules.SHM_SEGMENTS.violation(
                        f"a segment [{offset}, {offset + size}) outside the {file_size}-byte file passed", at)
        if frames.received:
            raise container_rules.DATA_FRAME.violation("SHM_DATA after TENSOR_DATA frames of the same tensor", at)
        frames.received = frames.total
        return frames, segments

    def error(self, stream_id: int, payload, at: int):
        """An ERROR: the stream is closed; returns the typed exception to raise or report."""
        code, text = m.decode_error(payload, at)
        if self.side is Side.CLIENT:
            self._check_extension_skip(stream_id, code, at)
        self.closed.add(stream_id)
        self.drop_put(stream_id)
        self.acks_due.pop(stream_id, None)
        self._answered(stream_id)
        return remote_error(code, text, at)

    # --- what the client sent (client side) ---------------------------------------------
    def sent_client_hello(self, hello: m.Hello) -> None:
        """The client sent its (valid) ``hello``: the version rule and the layout list it carried."""
        self.sent_hello = hello
        self.hello_extended = refused_for_extensions(hello.layouts)

    def sent_request(self, stream_id: int, request: m.Request) -> None:
        """The client sent ``request`` (a valid TENSOR_REQUEST or SHM_REQUEST) on ``stream_id``: its
        response may now arrive."""
        self.requests[stream_id] = request
        self.awaited[stream_id] = 1
        self.last_request = stream_id
        if refused_for_extensions(request.layouts):
            self.extended.add(stream_id)

    def sent_put(self, stream_id: int, refused: Optional[SpecViolation] = None) -> None:
        """The client sent a whole TENSOR_PUT on ``stream_id``: an ACK or ERROR may now arrive.
        ``refused``: the fault for which no server may accept it (:meth:`PushJudge.judge`)."""
        self.acks_due.setdefault(stream_id, deque()).append(refused)
        if refused is not None:
            self.sent_refusable = True

    def ack(self, stream_id: int, plen: int, at: int) -> None:
        """A TENSOR_PUT_ACK: empty, and for a PUT the client sent whole (``§ TENSOR_PUT Flow``) that a
        server may accept (``session.put.accepted``, ``interchange.md § TENSOR_PUT_ACK Payload``)."""
        due = self.acks_due.get(stream_id)
        if not due and not self.recording_without_requests:
            raise rules.PUT_FLOW.violation(f"TENSOR_PUT_ACK on stream {stream_id}, where no TENSOR_PUT is awaiting "
                                           "one", at)
        if plen:
            raise rules.PAYLOAD_LENGTH.violation(f"TENSOR_PUT_ACK carries {plen} payload bytes",
                                                 at + m.PAYLOAD_LENGTH_AT)
        if not due:
            return
        refused = due.popleft()
        if not due:
            del self.acks_due[stream_id]
        if refused is not None:
            raise rules.PUT_ACCEPTED.violation(
                f"TENSOR_PUT_ACK on stream {stream_id} for a PUT no server may accept: [{refused.rule_id}] "
                f"{refused.message}", at)

    def _check_extension_skip(self, stream_id: int, code: int, at: int) -> None:
        """An ERROR INVALID_MESSAGE in place of SERVER_HELLO, answering a valid hello, or on the stream of
        a valid request the server has not started answering, when the hello or request carried extension
        layout entries: a list refused for them (``session.layouts.extension_skip``, ``interchange.md
        § Layout Entry Encoding``).  Any other code may have another reason (see spec-map § Interpretations)."""
        if code != ErrorCode.INVALID_MESSAGE:
            return
        if self.hello is None:
            if self.hello_extended:
                raise rules.LAYOUT_EXTENSION_SKIP.violation(
                    "ERROR INVALID_MESSAGE answers a valid CLIENT_HELLO whose layout list carries extension entries",
                    at)
        elif stream_id in self.extended and stream_id in self.requests and not self.sent_refusable:
            raise rules.LAYOUT_EXTENSION_SKIP.violation(
                f"ERROR INVALID_MESSAGE answers the valid TENSOR_REQUEST on stream {stream_id}, whose layout list "
                "carries extension entries", at)

    # --- a tensor's messages ------------------------------------------------------------
    def descriptor(self, stream_id: int, payload, at: int):
        """A TENSOR_DESCRIPTOR on ``stream_id``: ``(part, frames, transfer)``; ``transfer`` is the
        parallel transfer the tensor is a shard of (client side), else None."""
        if stream_id in self.tensors:
            raise container_rules.MESSAGE_ORDER.violation(
                f"TENSOR_DESCRIPTOR before the TENSOR_DATA_END of the tensor at byte {self.tensors[stream_id].start}",
                at)
        part, frames = TensorFrames.open(payload, at, self.describe, self.limits)
        transfer = None
        if self.side is Side.CLIENT:
            request, transfer = self._response_of(stream_id, frames.transport["total_shards"], at)
            self.extended.discard(stream_id if transfer is None else transfer.request)
            if request is not None:
                self._check_placement(part.value, request, at + m.HEADER_SIZE)
            if transfer is None and stream_id in self.awaited:
                owed = self.awaited[stream_id] - 1
                self.awaited[stream_id] = owed + (part.value.layout.member_count if part.value.is_composite_head
                                                  else 0)
            if transfer is not None:
                transfer.add(stream_id, part.value, frames.transport["shard_index"], at)
                if len(transfer.descs) == transfer.count:  # § Shard Consistency: once every descriptor arrived
                    transfer.check(at)
        self.tensors[stream_id] = frames
        return part, frames, transfer

    def frame(self, stream_id: int, plen: int, offset_in_buffer: Optional[int], at: int) -> tuple[TensorFrames, int]:
        """A TENSOR_DATA header on ``stream_id``: ``(frames, data length)``."""
        frames = self._open(stream_id, "TENSOR_DATA", at)
        return frames, frames.frame(plen, offset_in_buffer, at)

    def end(self, stream_id: int, plen: int, at: int) -> tuple[TensorFrames, Optional[m.Put]]:
        """A TENSOR_DATA_END on ``stream_id``: the finished tensor, and its PUT if it was one; the
        last shard's ends its parallel transfer."""
        frames = self._open(stream_id, "TENSOR_DATA_END", at)
        frames.end(plen, at)
        del self.tensors[stream_id]
        transfer = self.transfers.get(stream_id)
        if transfer is not None:
            transfer.ended.add(stream_id)
            if transfer.complete:
                for s in transfer.descs:
                    self.transfers.pop(s, None)
                self._answered(transfer.request)
        elif self.awaited.get(stream_id) == 0:
            self._answered(stream_id)
        return frames, self.puts.pop(stream_id, None)

    def _open(self, stream_id: int, what: str, at: int) -> TensorFrames:
        frames = self.tensors.get(stream_id)
        if frames is None:
            raise container_rules.MESSAGE_ORDER.violation(
                f"{what} on stream {stream_id} outside a tensor (no TENSOR_DESCRIPTOR before it)", at)
        return frames

    # --- responses (client side) --------------------------------------------------------
    def _answered(self, stream_id: Optional[int]) -> None:
        """The request on ``stream_id`` has its whole answer: nothing more may arrive for it."""
        self.requests.pop(stream_id, None)
        self.awaited.pop(stream_id, None)

    def _response_of(self, stream_id: int, shards: int, at: int):
        """The request a descriptor on ``stream_id`` answers, and its parallel transfer: a shard may
        arrive on a stream of its own (``§ Parallel Transfer Flow``)."""
        transfer = self.transfers.get(stream_id)
        if transfer is None and shards > 1:
            transfer = self._open_transfer(stream_id, shards, at)
        if transfer is not None:
            if shards != transfer.count:
                raise rules.SHARD_CONSISTENCY.violation(
                    f"total_shards {shards}, the transfer's first shard said {transfer.count}", at)
            self.transfers[stream_id] = transfer
            return self.requests.get(transfer.request), transfer
        if self.recording_without_requests:
            return None, None
        if stream_id not in self.requests:
            raise container_rules.MESSAGE_ORDER.violation(
                f"a tensor on stream {stream_id}, which carries no request awaiting an answer", at)
        return self.requests[stream_id], None

    def _open_transfer(self, stream_id: int, shards: int, at: int) -> "Transfer":
        """The parallel transfer a first shard opens, or the open one it joins."""
        for transfer in set(self.transfers.values()):
            if not transfer.complete and len(transfer.descs) < transfer.count:
                return transfer
        owner = stream_id if stream_id in self.requests else self.last_request
        request = self.requests.get(owner)
        if not self.recording_without_requests:
            asked = request is not None and request.flags & RequestFlag.PARALLEL_OK
            offered = self.hello is not None and self.hello.capability_flags & CapabilityFlag.PARALLEL_STREAMS
            if not (asked and offered):
                raise rules.SHARD_REQUESTED.violation(
                    f"total_shards {shards}, but the request did not set PARALLEL_OK or the server did not advertise "
                    "PARALLEL_STREAMS", at)
        return Transfer(owner, shards)

    def _check_placement(self, desc, request: m.Request, at: int) -> None:
        """``§ Server Device Selection`` rules 1-6 and the memory classes, as far as the client
        sees them: the buffers' device and memory class."""
        mine = self.sent_hello
        if mine is None or self.hello is None:
            return
        for h in desc.buffers:
            check_placement(int(h.device_tag), request.device, mine.devices, self.hello.devices, at)
            if int(h.memory_class) not in mine.accepted_memory_classes:
                raise rules.MEMORY_CLASS.violation(
                    f"a buffer of memory_class 0x{int(h.memory_class):02X}, which the client did not advertise", at)


class ClosedStreams(dict):
    """The stream ids an ERROR closed, in bounded memory however many it closes: the latest
    :attr:`RECENT` exactly (the dict's keys, oldest first), and every id at or below the highest
    one forgotten (:attr:`floor`), as a stream numbering that only grows would have it (spec-map §
    Interpretations): :meth:`covers`."""

    RECENT = 1024

    def __init__(self):
        super().__init__()
        self.floor = 0

    def add(self, stream_id: int) -> None:
        self.pop(stream_id, None)
        self[stream_id] = None
        if len(self) > self.RECENT:
            oldest = next(iter(self))
            del self[oldest]
            self.floor = max(self.floor, oldest)

    def covers(self, stream_id: int) -> bool:
        """``stream_id`` is closed: one of the latest, or at or below the floor."""
        return stream_id in self or stream_id <= self.floor


class Transfer:
    """One parallel transfer (``interchange.md § Parallel Transfers``): its shards' descriptors by
    stream, checked for consistency once every shard ended (``§ Shard Consistency``)."""

    def __init__(self, request: Optional[int], count: int):
        self.request = request
        self.count = count
        self.descs: dict[int, object] = {}
        self.indices: set[int] = set()
        self.ended: set[int] = set()

    @property
    def complete(self) -> bool:
        return len(self.ended) == self.count

    def add(self, stream_id: int, desc, shard_index: int, at: int) -> None:
        """A shard's descriptor: a stream and a shard_index of its own, within total_shards."""
        if stream_id in self.descs or len(self.descs) >= self.count:
            raise rules.SHARD_CONSISTENCY.violation(
                f"a shard on stream {stream_id} beyond the transfer's {self.count} shards", at)
        if shard_index in self.indices:
            raise rules.SHARD_CONSISTENCY.violation(f"shard_index {shard_index} twice in one parallel transfer", at)
        self.indices.add(shard_index)
        self.descs[stream_id] = desc

    def ordered(self) -> list:
        """``(stream, descriptor)`` of every shard, by shard offset."""
        return sorted(self.descs.items(), key=lambda kv: kv[1].shard.shard_offset)

    def check(self, at: int) -> None:
        """Shared parent_shape, element type and layout, then the partition checker's verdict on
        the shard boxes under a head of the parent shape (exact cover, no overlap)."""
        descs = list(self.descs.values())
        first = descs[0]
        for d in descs:
            if d.shard is None:
                raise rules.SHARD_CONSISTENCY.violation("a shard without a shard section", at)
            if (d.shard.parent_shape, int(d.type_tag), int(d.layout_tag)) != (
                    first.shard.parent_shape, int(first.type_tag), int(first.layout_tag)):
                raise rules.SHARD_CONSISTENCY.violation(
                    "the shards do not share parent_shape, element type and layout", at)
        try:
            validate_preorder([self.head()] + [d for _, d in self.ordered()], mode="strict", check_heads=False)
        except SpecViolation as fault:
            raise rules.SHARD_CONSISTENCY.violation(f"{fault.message} ({fault.rule_id})", at) from None

    def head(self) -> TensorDescriptor:
        """A partition head of the parent shape over the shards: what the partition checker binds."""
        first = next(iter(self.descs.values()))
        return TensorDescriptor(type_tag=first.type_tag, shape=first.shard.parent_shape,
                                layout=CompositeLayout(composition_rule=CompositionRule.PARTITION,
                                                       member_count=len(self.descs)))


def message_name(kind) -> str:
    """A message type's name, or its number when it has none."""
    return kind.name if isinstance(kind, (MessageType, ShmMessageType)) else f"message type 0x{int(kind):08X}"


# --------------------------------------------------------------------------------------
# A recorded direction (``audit``)
# --------------------------------------------------------------------------------------


SESSION_OPENERS = {int(MessageType.CLIENT_HELLO): Side.SERVER, int(MessageType.SERVER_HELLO): Side.CLIENT}
"""The first message of a recorded session's direction, and which side received it."""


def recorded_side(data) -> Optional[Side]:
    """The receiving side of a recorded session direction (its first message is a hello), or
    None when ``data`` is not one."""
    if len(data) < m.HEADER_SIZE:
        return None
    kind, _, _ = m.unpack_header(bytes(data[: m.HEADER_SIZE]))
    return SESSION_OPENERS.get(kind)


ANY_READER = Limits(**HARD_MAXIMUM)
"""The widest limits a reader may be configured with: what no server may accept breaks a rule under them."""


class PushJudge:
    """What a client pushes, judged as every server must judge it (``interchange.md § TENSOR_PUT_ACK
    Payload``): each PUT's descriptor and ``total_data_bytes`` as the most tolerant reader takes them
    (permissive, :data:`ANY_READER` limits; on a cross-machine connection, producer-synced buffers
    only), and the composite a head and its members pushed on one stream bind to (the one binder,
    permissive).  What a permissive reader tolerates, a server may accept."""

    def __init__(self, *, local: bool):
        self.describe = strict_describer(mode=Mode.PERMISSIVE, limits=ANY_READER, cross_machine=not local)
        self.binders: dict[int, CompositeBinder] = {}
        """Per stream, the composite its PUTs are pushing."""

    def judge(self, stream_id: int, put) -> Optional[SpecViolation]:
        """The fault for which no server may ACK the TENSOR_PUT sent on ``stream_id``
        (``session.put.accepted``; ``put``: its payload, or the :class:`~.messages.Put` the client
        encoded it from), or None: its own
        descriptor's, or for the PUT that completes a composite, the composite's (a server may hold
        its verdict until then).  A limit breach alone is not judged."""
        try:
            part = described(put if isinstance(put, m.Put) else m.decode_put(put, 0), self.describe)
        except SpecViolation as fault:
            self.binders.pop(stream_id, None)
            return fault
        except HurraySchemaError:
            self.binders.pop(stream_id, None)
            return None
        binder = self.binders.get(stream_id)
        if binder is None:
            binder = self.binders[stream_id] = CompositeBinder(mode=Mode.PERMISSIVE, collect=True)
        if not binder.add(part.value, 0):
            return None
        del self.binders[stream_id]
        return next((f.to_violation() for f in binder.findings if f.is_error), None)

    def forget(self, stream_id: int) -> None:
        """The push on ``stream_id`` is over, whole or not: a composite it left open is dropped."""
        self.binders.pop(stream_id, None)


@attrs.frozen
class PeerRecording:
    """What the receiver of a recorded direction sent, read from the other direction's recording:
    its hello, and on the client's side its requests and whole PUTs (by stream, each PUT's
    :meth:`PushJudge.judge` verdict in order); for the rule on extension layout entries, whether its
    hello was valid with a list :func:`refused_for_extensions`, the streams carrying nothing a server
    may refuse but such a request, and whether it sent anything a server must refuse at all."""

    hello: Optional[m.Hello]
    requests: dict
    puts: dict
    last_request: Optional[int]
    hello_extended: bool = False
    extended: frozenset = frozenset()
    sent_refusable: bool = False


def other_direction(path) -> Optional[PeerRecording]:
    """The recording of the other direction beside ``path`` (``NAME.client.msgs`` /
    ``NAME.server.msgs``, as ``serve --record`` and ``connect(record=...)`` write them), read
    leniently, or None."""
    if path is None:
        return None
    name = os.fspath(path)
    for mine, theirs in ((".client.msgs", ".server.msgs"), (".server.msgs", ".client.msgs")):
        if name.endswith(mine):
            try:
                with open(name[: -len(mine)] + theirs, "rb") as f:
                    return _peer_recording(f.read(), local=recorded_locally(name))
            except OSError:
                return None
    return None


_UNREFUSED = frozenset({MessageType.PING, MessageType.PONG, MessageType.ERROR})
"""Messages a server answers with no ERROR when they are well formed (the client's direction is
checked for that): what a request's stream may carry besides the request."""


def _peer_recording(data: bytes, local: bool = False) -> PeerRecording:
    """What ``data`` (one recorded direction) says its sender sent, read leniently; a client's
    PUTs judged (:class:`PushJudge`) and its messages checked as a server checks them
    (:func:`_first_fault`)."""
    judge = PushJudge(local=local)

    def walked():  # walked again by each pass: a walk's parts are never all held at once
        return walk_messages(Window(data), _lenient, faults=Faults.COLLECT, mode=Mode.PERMISSIVE)

    sent = _Sent()
    for at, raw, payload, cut in recorded_messages(walked(), data):
        if cut is not None or payload is None:  # the recording ends inside this message
            break
        sent.take(at, raw, payload, judge)
    puts = {sid: tuple(verdicts) for sid, verdicts in sent.puts.items()}
    if recorded_side(data) is not Side.SERVER:  # a server's direction: what it sent is not judged
        return PeerRecording(sent.hello, sent.requests, puts, sent.last_request)
    fault = _first_fault(walked(), data, judge.describe, local)
    hello_valid = fault is None or fault >= sent.hello_end
    extended = frozenset(sid for sid, request in sent.requests.items()
                         if sent.refusable_on.get(sid) == 1 and refused_for_extensions(request.layouts))
    refused_put = any(v is not None for verdicts in puts.values() for v in verdicts)
    return PeerRecording(sent.hello, sent.requests, puts, sent.last_request,
                         hello_extended=hello_valid and sent.hello is not None
                         and refused_for_extensions(sent.hello.layouts),
                         extended=extended, sent_refusable=fault is not None or refused_put)


@attrs.define
class _Sent:
    """What one recorded direction's messages say their sender sent, read leniently (a message that
    does not decode is passed over)."""

    hello: Optional[m.Hello] = None
    hello_end: int = 0
    requests: dict = attrs.Factory(dict)
    last_request: Optional[int] = None
    puts: dict = attrs.Factory(dict)
    """Per stream, the :meth:`PushJudge.judge` verdict of each whole PUT, in order."""
    putting: dict = attrs.Factory(dict)
    """Per stream, the TENSOR_PUT payload whose frames are arriving."""
    refusable_on: dict = attrs.Factory(dict)
    """Per stream, how many messages after the hello a server may refuse (:data:`_UNREFUSED` aside)."""

    def take(self, at: int, raw, payload, judge: PushJudge) -> None:
        """The message at ``at`` (header ``raw``, then ``payload``)."""
        kind, sid, _ = m.unpack_header(raw)
        if at and kind not in _UNREFUSED:
            self.refusable_on[sid] = self.refusable_on.get(sid, 0) + 1
        try:
            if at == 0 and kind in SESSION_OPENERS:
                self.hello_end = m.HEADER_SIZE + len(payload)
                self.hello = m.decode_hello(payload, at, server=kind == MessageType.SERVER_HELLO)
            elif kind in (MessageType.TENSOR_REQUEST, ShmMessageType.SHM_REQUEST):
                self.requests[sid], self.last_request = m.decode_request(payload, at), sid
            elif kind == ShmMessageType.SHM_PUT:
                self.puts.setdefault(sid, []).append(judge.judge(sid, payload))
            elif kind == MessageType.TENSOR_PUT:
                self.putting[sid] = payload
            elif kind == MessageType.TENSOR_DATA_END and sid in self.putting:
                self.puts.setdefault(sid, []).append(judge.judge(sid, self.putting.pop(sid)))
        except HurraySchemaError:
            pass


def _first_fault(parts: Iterable, data, describe: Callable, local: bool) -> Optional[int]:
    """The offset of the first fault a server's checker finds in a client's recorded direction
    (``describe`` taking its PUTs' descriptors, the limits :data:`ANY_READER`), or None."""
    try:
        check_recorded(parts, data, Side.SERVER, describe, ANY_READER, local=local)
    except HurraySchemaError as fault:
        offset = getattr(fault, "offset", None)
        return 0 if offset is None else offset
    return None


def _lenient(buf, base: int, depth: int):
    return collect_descriptor(buf, base, depth, Mode.PERMISSIVE)


def recorded_messages(parts: Iterable, data) -> Iterator[tuple]:
    """The messages of a recorded direction, from its located walk's ``parts``
    (:func:`~hurray_schema.io.walk.walk_messages`): ``(offset, header bytes, payload, None)`` per
    message whose header fits (payload None: it does not), and ``(offset, None, None, fault)``
    where the walk found the recording cut (``stream.message.truncated``)."""
    view = memoryview(data)
    message = None
    for part in parts:
        if part.kind == MESSAGE:
            message = part
        elif part.kind == MESSAGE_HEADER_PART:
            payload = view[part.end : message.end] if message.value is not None else None
            yield part.start, view[part.start : part.end], payload, None
        elif part.kind == FAULT and part.fault is not None \
                and part.fault.rule_id == container_rules.MESSAGE_TRUNCATED.id:
            yield part.start, None, None, part.fault


def recorded_puts(parts: Iterable, data) -> Iterator[m.Put]:
    """The TENSOR_PUT and SHM_PUT messages of a message stream (walked into ``parts``) whose
    payload decodes, in order, each with its descriptor's offset in ``data``."""
    for at, raw, payload, _ in recorded_messages(parts, data):
        if payload is None or m.unpack_header(raw)[0] not in _PUT_TYPES:
            continue
        try:
            yield m.decode_put(payload, at)
        except HurraySchemaError:
            continue


def recorded_locally(name) -> bool:
    """The recording named ``name`` was made over a Unix socket (its name ends so)."""
    if name is None:
        return False
    base = os.path.basename(os.fspath(name))
    return base.endswith((LOCAL_MARK + ".client.msgs", LOCAL_MARK + ".server.msgs"))


def recorded_side_of(data, name=None) -> Optional[Side]:
    """The receiving side of a recorded direction: from its file name (``*.client.msgs`` is what
    the server received), else from its first message (a hello), else None."""
    if name is not None:
        name = os.fspath(name)
        if name.endswith(".client.msgs"):
            return Side.SERVER
        if name.endswith(".server.msgs"):
            return Side.CLIENT
    return recorded_side(data)


def check_recorded(parts: Iterable, data, side: Side, describe: Callable, limits: Limits = DEFAULT_LIMITS,
                   peer: Optional[PeerRecording] = None, local: bool = False, mode: Mode = Mode.STRICT,
                   findings: Optional[list] = None) -> None:
    """Run the checker ``side`` runs live over a recorded direction (``data``, walked into
    ``parts`` by :func:`~hurray_schema.io.walk.walk_messages`), message by message; the first
    fault raises, at the offset it has in ``data``, as it did live.
    ``peer`` is what the receiver sent (:func:`other_direction`): its hello gives the largest
    payload it accepted and the version it spoke, its requests what the responses answer.
    Without it the checks that need them are left out.  ``local``: recorded over a Unix socket,
    where the shared-memory extension was agreed (:func:`recorded_locally`).  The pushed
    tensors are bound per stream as the server binds them, under ``mode``, what it tolerates
    going to ``findings``."""
    checker = SessionChecker(side, describe=describe, limits=limits, mode=mode, findings=findings)
    if local:
        checker.private = SHM_SERVER_TYPES if side is Side.CLIENT else SHM_CLIENT_TYPES
    checker.fds_seen = False
    if peer is not None and peer.hello is not None:
        checker.sent_hello = peer.hello
        checker.max_payload = peer.hello.max_message_size
    if side is Side.CLIENT:
        if peer is None:
            checker.recording_without_requests = True
        else:
            checker.requests = dict(peer.requests)
            checker.last_request = peer.last_request
            checker.acks_due = {sid: deque(verdicts) for sid, verdicts in peer.puts.items()}
            checker.hello_extended = peer.hello_extended
            checker.extended = set(peer.extended)
            checker.sent_refusable = peer.sent_refusable
    for at, raw, payload, cut in recorded_messages(parts, data):
        if cut is not None:
            raise cut.to_violation()
        kind, sid, _ = checker.header(raw, at)
        if payload is not None:  # else the walk's cut follows: the header was checked first, as live
            _replay(checker, kind, sid, payload, at)


def _replay(checker: SessionChecker, kind, sid: int, payload, at: int) -> None:
    """One recorded message through the checker's entry for its kind."""
    if kind == MessageType.TENSOR_DATA:
        offset = m.unpack_offset_in_buffer(payload) if len(payload) >= m.DATA_HEADER_SIZE else None
        checker.frame(sid, len(payload), offset, at)
    elif kind == MessageType.TENSOR_DATA_END:
        frames, put = checker.end(sid, len(payload), at)
        if put is not None:
            checker.bind_put(sid, put, frames.desc)
    elif kind == MessageType.TENSOR_DESCRIPTOR:
        checker.descriptor(sid, payload, at)
    elif kind == MessageType.CLIENT_HELLO:
        checker.client_hello(payload, at)
    elif kind == MessageType.SERVER_HELLO:
        checker.server_hello(payload, at)
    elif kind == MessageType.TENSOR_REQUEST:
        checker.request(sid, payload, at)
    elif kind == MessageType.TENSOR_PUT:
        checker.put(sid, payload, at)
    elif kind == MessageType.ERROR:
        checker.error(sid, payload, at)
    elif kind == MessageType.TENSOR_PUT_ACK:
        checker.ack(sid, len(payload), at)
    elif kind == ShmMessageType.SHM_REQUEST:
        checker.request(sid, payload, at)
    elif kind == ShmMessageType.SHM_PUT:
        put, part = checker.put(sid, payload, at, shared=True)
        checker.bind_put(sid, put, part.value)
    elif kind == ShmMessageType.SHM_DATA:
        checker.shm_data(sid, payload, at, None)
