"""The walk of a message stream (``interchange.md § Message Framing``): per message its header,
then its payload, and inside the payload what its kind holds.

One walk serves every reader of a message stream.  The framing is walked once for every fault
policy -- each header, each payload, a message cut off by the end of the input
(``stream.message.truncated``, raised under ``RAISE``, a ``fault`` part that ends the walk
otherwise).  What each payload holds is then taken per kind:

* under ``RAISE`` (the stream reader) as a receiver takes it: every header checked
  (:func:`check_message_header`), the messages of each tensor in order and its frames counted
  (:class:`TensorFrames`, ``§ Ordering Invariant``), an ERROR message raised as its
  :class:`~hurray_schema.errors.RemoteError`; the walk yields what the reader needs (a
  descriptor and its ``transport`` fields, each frame's ``data``, ``tensor end``);
* under ``COLLECT`` and ``ANNOTATE`` (audit, the annotated view) only located: a message's
  ``message header``, a descriptor and its ``transport`` fields, a ``data header`` and
  ``data``, or an opaque ``payload``.  The order of the messages is the session checker's
  business (:mod:`hurray_schema.net.checker`), over these parts.
"""

from __future__ import annotations

from typing import Iterator, Optional

from ... import errors
from ...errors import RemoteError, SpecViolation
from ...codec import peek_descriptor_length
from ...limits import DEFAULT_LIMITS, Limits
from ...model import TensorDescriptor
from ...rules import container as container_rules
from ...rules import session as session_rules
from ...rules.engine import Mode
from ...structs._declare import plan, static_offset
from ...structs.descriptor import FIXED_HEADER_SIZE
from ...structs.session import ERROR_HEADER, ErrorCode
from ...structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from ...structs.tags import is_private_tag
from .common import (
    DATA, DATA_HEADER, MESSAGE, MESSAGE_HEADER_PART, PAYLOAD, TENSOR_END, TRANSPORT, Describe, Faults, Part,
    Window, fault, fault_at, new_part,
)

__all__ = ["walk_messages", "TensorFrames", "check_message_header", "remote_error", "REMOTE_ERRORS",
           "MESSAGE_TYPES"]

_MSG = plan(MESSAGE_HEADER)
_MSG_AT = {name: static_offset(MESSAGE_HEADER, name) for name in ("stream_id", "payload_length")}
_MSG_SIZE = _MSG.fixed_size
_SHARD_INDEX_AT = static_offset(TENSOR_DESCRIPTOR_FIELDS, "shard_index")
_TRANSPORT = plan(TENSOR_DESCRIPTOR_FIELDS)
_TRANSPORT_SIZE = _TRANSPORT.fixed_size
_DATA = plan(TENSOR_DATA_HEADER)
_DATA_SIZE = _DATA.fixed_size
_DATA_OFFSET_CODEC = _DATA.steps[0].codec
assert _DATA.steps[0].names == ("byte_offset_in_buffer",)  # the data header's one field, in one unpack
_ERROR = plan(ERROR_HEADER)
MESSAGE_TYPES = {int(m): m for m in MessageType}
"""Each message type this reader knows, by its number (``interchange.md § Message Types``)."""
_TENSOR_DATA, _TENSOR_DESCRIPTOR, _TENSOR_DATA_END, _ERROR_MESSAGE = (
    MessageType.TENSOR_DATA, MessageType.TENSOR_DESCRIPTOR, MessageType.TENSOR_DATA_END, MessageType.ERROR)
"""The kinds a reader takes, as globals: tested on every message, most frequent first."""
_ANYWHERE = (MessageType.PING, MessageType.PONG, MessageType.ERROR)
"""The messages that may come between any two of a tensor data stream (``§ Ordering Invariant``)."""


def walk_messages(window: Window, describe: Describe, *, faults: Faults, mode: Mode,
                  limits: Limits = DEFAULT_LIMITS) -> Iterator[Part]:
    """Parts of a message stream (``interchange.md § Message Framing``): per message a
    ``message`` part (its whole extent), then per kind a descriptor part and its ``transport``
    fields, or ``data``; ``RAISE`` adds a ``tensor end`` part per TENSOR_DATA_END (value: the
    tensor's descriptor; index: the offset of its TENSOR_DESCRIPTOR message), the other
    policies a ``message header`` part per message, a ``data header`` per frame and an opaque
    ``payload`` for what no other part covers.

    ``RAISE`` enforces the framing and the message order (the reader); ``COLLECT`` and
    ``ANNOTATE`` locate every message whose header and payload fit and stop at the first
    that does not, each descriptor decoded from its ``descriptor_length`` bytes (``COLLECT``,
    which yields ``stream.descriptor.payload`` when the payload cannot hold them) or from its
    whole payload (``ANNOTATE``)."""
    return _walk(window, describe, faults, mode, limits)


def _walk(window: Window, describe: Describe, faults: Faults, mode: Mode, limits: Limits) -> Iterator[Part]:
    """The walk itself.  Every message is framed the same way under every policy: its header,
    then its payload (:func:`_header`, :func:`_payload`).  Under ``RAISE`` the header and the
    message's place in its tensor are checked before the payload is read (a receiver refuses
    what it cannot take without reading it), then the payload is taken as the reader needs it:
    a frame's ``data``, a descriptor (:class:`TensorFrames`), an ERROR raised; a TENSOR_DATA_END
    has no payload and ends the tensor.  Under the other policies the payload is located
    (:func:`_located_payload`).  The kinds are tested most frequent first."""
    strict = faults is Faults.RAISE
    current: Optional[TensorFrames] = None  # RAISE: the tensor whose messages are arriving
    index = 0
    while not window.at_eof():
        at = window.pos
        h = _header(window, faults, mode)
        if h.__class__ is Part:  # the header does not fit
            yield Part(MESSAGE, at, at, index=index)
            yield h
            return
        pstart, plen = at + _MSG_SIZE, h["payload_length"]
        if strict:  # the message's place in its tensor (interchange.md § Ordering Invariant)
            kind = h["message_type"] = check_message_header(h, at, limits)
            if kind == _TENSOR_DATA:
                if current is None:
                    raise container_rules.MESSAGE_ORDER.violation(
                        "TENSOR_DATA outside a tensor (no TENSOR_DESCRIPTOR before it)", at)
                if plen < _DATA_SIZE:  # too short for its header (§ TENSOR_DATA Payload)
                    current.frame(plen, None, at)
            elif kind == _TENSOR_DESCRIPTOR:
                if current is not None:
                    raise container_rules.MESSAGE_ORDER.violation(
                        f"TENSOR_DESCRIPTOR before the TENSOR_DATA_END of the tensor at byte {current.start}", at)
            elif kind == _TENSOR_DATA_END:  # checked whole: nothing to read
                if current is None:
                    raise container_rules.MESSAGE_ORDER.violation("TENSOR_DATA_END outside a tensor", at)
                current.end(plen, at)
                yield new_part(Part, (MESSAGE, at, pstart, None, h, None, "", (), index, 0))
                yield new_part(Part, (TENSOR_END, at, pstart, MESSAGE_HEADER, current.desc, None, "", (),
                                      current.start, 0))
                index += 1
                current = None
                continue
            elif kind not in _ANYWHERE:
                raise container_rules.MESSAGE_ORDER.violation(f"{kind.name} does not belong in a tensor data stream",
                                                              at)
        payload = _payload(window, plen, at, faults, mode)
        if payload.__class__ is Part:  # the payload does not fit
            yield Part(MESSAGE, at, at, index=index)
            yield Part(MESSAGE_HEADER_PART, at, pstart, MESSAGE_HEADER, h)
            yield payload
            return
        yield new_part(Part, (MESSAGE, at, pstart + plen, None, h, None, "", (), index, 0))
        index += 1
        if not strict:
            yield Part(MESSAGE_HEADER_PART, at, pstart, MESSAGE_HEADER, h)
            yield from _located_payload(h["message_type"], payload, at, describe, faults)
        elif kind == _TENSOR_DATA:
            (offset_in_buffer,) = _DATA_OFFSET_CODEC.unpack_from(payload)
            if current.frame(plen, offset_in_buffer, at):
                yield new_part(Part, (DATA, pstart + _DATA_SIZE, pstart + plen, None, payload[_DATA_SIZE:], None, "",
                                      (), 0, 0))
        elif kind == _TENSOR_DESCRIPTOR:
            part, current = TensorFrames.open(payload, at, describe, limits)
            yield part
            yield new_part(Part, (TRANSPORT, part.end, pstart + plen, TENSOR_DESCRIPTOR_FIELDS, current.transport,
                                  None, "", (), 0, 0))
        elif kind == _ERROR_MESSAGE:
            raise _remote_error(bytes(payload), at)
    if strict and current is not None:
        raise container_rules.STREAM_TRUNCATED.violation(
            f"the stream ends before the TENSOR_DATA_END of the tensor at byte {current.start}", window.pos)


# --------------------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------------------


def _header(window: Window, faults: Faults, mode: Mode):
    """The header fields of the message at the window's offset, or (a policy that does not
    raise) the ``stream.message.truncated`` fault part when the input ends inside it."""
    at = window.pos
    raw = window.read(_MSG_SIZE)
    if len(raw) < _MSG_SIZE:
        return fault(faults, container_rules.MESSAGE_TRUNCATED,
                     f"the stream ends {len(raw)} bytes into a {_MSG_SIZE}-byte message header", window.pos, mode,
                     at=at, note="the message header does not fit")._replace(decl=MESSAGE_HEADER)
    return _MSG.unpack(raw)[0]


def _payload(window: Window, n: int, at: int, faults: Faults, mode: Mode):
    """The ``n`` payload bytes of the message at ``at``, or (a policy that does not raise) the
    ``stream.message.truncated`` fault part when the input ends first."""
    pstart = window.pos
    data = window.read(n)
    if len(data) < n:
        return fault(faults, container_rules.MESSAGE_TRUNCATED,
                     f"the message at byte {at} announces {n} payload bytes, the stream has {len(data)}", window.pos,
                     mode, at=pstart, note=f"payload_length {n} runs past the end ({len(data)} bytes remain)")
    return data


def check_message_header(h: dict, at: int, limits: Limits, *, max_payload: Optional[int] = None,
                         private: frozenset = frozenset()) -> MessageType | int:
    """The checks every received message header passes (``interchange.md § Message Framing``,
    ``§ Message Types``), whatever reads it: the stream reader, the session client and
    server.  ``max_payload`` is what this receiver advertised in its hello (a session), else
    the reader's ``max_message_bytes`` limit applies; ``private`` are the private message types
    agreed with the peer (returned as plain ints).  Returns the message type."""
    if h["stream_id"] == RESERVED_STREAM_ID:
        raise container_rules.MESSAGE_STREAM_ID.violation("stream_id 0 is reserved", at + _MSG_AT["stream_id"])
    n = h["payload_length"]
    if max_payload is not None:
        if n > max_payload:
            raise session_rules.MESSAGE_SIZE.violation(
                f"payload_length {n} exceeds the {max_payload} bytes this receiver accepts",
                at + _MSG_AT["payload_length"])
    elif n > limits.max_message_bytes:
        limits.check("max_message_bytes", n, at + _MSG_AT["payload_length"])
    raw = h["message_type"]
    kind = MESSAGE_TYPES.get(raw)
    if kind is not None:
        return kind
    if is_private_tag(raw):
        if raw in private:
            return raw
        raise session_rules.MESSAGE_PRIVATE.violation(
            f"private message type 0x{raw:08X} was not agreed with this receiver", at)
    raise container_rules.MESSAGE_TYPE.violation(f"message_type 0x{raw:08X} is not a message type this reader knows",
                                                 at)


def _descriptor_length_in_payload(payload, at: int) -> int:
    """``descriptor_length`` of the descriptor in the TENSOR_DESCRIPTOR payload of the
    message at ``at``, which must be that descriptor and the transport fields exactly
    (``interchange.md § TENSOR_DESCRIPTOR Payload``); else ``stream.descriptor.payload`` at the
    header's ``payload_length`` (or the descriptor's own fault: magic, minimum length)."""
    plen = len(payload)
    if plen < FIXED_HEADER_SIZE + _TRANSPORT_SIZE:
        raise container_rules.DESCRIPTOR_PAYLOAD.violation(
            f"payload_length {plen} cannot hold a descriptor and the {_TRANSPORT_SIZE} transport bytes",
            at + _MSG_AT["payload_length"])
    length = peek_descriptor_length(payload, at + _MSG_SIZE)
    if length + _TRANSPORT_SIZE != plen:
        raise container_rules.DESCRIPTOR_PAYLOAD.violation(
            f"payload_length {plen} is not descriptor_length {length} + {_TRANSPORT_SIZE}",
            at + _MSG_AT["payload_length"])
    return length


# --------------------------------------------------------------------------------------
# RAISE: what a receiver checks
# --------------------------------------------------------------------------------------


class TensorFrames:
    """One tensor's messages on one stream, as every receiver checks them
    (``interchange.md § Ordering Invariant``, ``§ TENSOR_DESCRIPTOR Payload``,
    ``§ TENSOR_DATA Payload``): :meth:`open` on its TENSOR_DESCRIPTOR, :meth:`frame` per
    TENSOR_DATA header, :meth:`end` on TENSOR_DATA_END.  Offsets are those of the input."""

    __slots__ = ("desc", "start", "total", "received", "transport")

    def __init__(self, desc: TensorDescriptor, start: int, total: int, transport: dict):
        self.desc = desc
        self.start = start
        self.total = total
        self.received = 0
        self.transport = transport

    @classmethod
    def open(cls, payload, at: int, describe: Describe, limits: Limits) -> tuple[Part, "TensorFrames"]:
        """The descriptor part of the TENSOR_DESCRIPTOR message at ``at`` and the checker of
        its frames; the transport fields are checked against the descriptor."""
        pstart = at + _MSG_SIZE
        length = _descriptor_length_in_payload(payload, at)
        part = describe(payload[:length], pstart, 0)
        desc = part.value
        t, _ = _TRANSPORT.unpack(payload, length)
        if t["total_shards"] < 1 or t["shard_index"] >= t["total_shards"]:
            raise container_rules.TRANSPORT_SHARDS.violation(
                f"shard_index {t['shard_index']} / total_shards {t['total_shards']}", pstart + length + _SHARD_INDEX_AT)
        expected = sum(b.byte_size for b in desc.buffers)
        if t["total_data_bytes"] != expected:
            raise container_rules.TOTAL_DATA_BYTES.violation(
                f"total_data_bytes {t['total_data_bytes']} but the buffers hold {expected} bytes", pstart + length)
        for b in desc.buffers:
            if b.byte_size > limits.max_buffer_bytes:
                limits.check("max_buffer_bytes", b.byte_size, pstart)
        return part, cls(desc, at, expected, t)

    def frame(self, plen: int, offset_in_buffer: Optional[int], at: int) -> int:
        """Check the TENSOR_DATA message at ``at`` (``offset_in_buffer`` None: its payload cannot
        hold the field) and count its bytes; returns the frame's data length."""
        pstart = at + _MSG_SIZE
        if offset_in_buffer is None:
            raise container_rules.DATA_FRAME.violation(
                f"a TENSOR_DATA payload of {plen} bytes cannot hold byte_offset_in_buffer", at + _MSG_AT["payload_length"])
        n = plen - _DATA_SIZE
        if offset_in_buffer != self.received:
            raise container_rules.DATA_FRAME.violation(
                f"byte_offset_in_buffer {offset_in_buffer}, expected {self.received} (frames are contiguous "
                "and ascending)", pstart)
        if self.received + n > self.total:
            raise container_rules.DATA_FRAME.violation(
                f"frame ends at {self.received + n}, past total_data_bytes {self.total}", pstart)
        self.received += n
        return n

    def end(self, plen: int, at: int) -> None:
        """Check the TENSOR_DATA_END message at ``at``: empty, and every byte arrived."""
        if plen:
            raise container_rules.DATA_END_PAYLOAD.violation(f"TENSOR_DATA_END carries {plen} payload bytes",
                                                             at + _MSG_AT["payload_length"])
        if self.received != self.total:
            raise container_rules.DATA_SUM.violation(
                f"frames carried {self.received} bytes, total_data_bytes is {self.total}", at)




REMOTE_ERRORS: dict[int, type] = {
    ErrorCode.PROTOCOL_VERSION_MISMATCH: errors.ProtocolVersionMismatch,
    ErrorCode.UNKNOWN_TENSOR: errors.UnknownTensor,
    ErrorCode.LAYOUT_UNAVAILABLE: errors.LayoutUnavailable,
    ErrorCode.TRANSCODE_LIMIT_EXCEEDED: errors.TranscodeLimitExceeded,
    ErrorCode.DEVICE_UNAVAILABLE: errors.DeviceUnavailable,
    ErrorCode.INVALID_MESSAGE: errors.InvalidMessage,
    ErrorCode.MESSAGE_TOO_LARGE: errors.MessageTooLarge,
    ErrorCode.SHARD_MISMATCH: errors.ShardMismatch,
}
"""The :class:`RemoteError` subclass of each ``error_code`` (``interchange.md § ERROR Payload``)."""


def remote_error(error_code: int, message: str, offset: Optional[int]) -> RemoteError:
    """The :class:`RemoteError` subclass for ``error_code`` (the base class for an
    implementation-defined or unknown code)."""
    return REMOTE_ERRORS.get(error_code, RemoteError)(error_code, message, offset)


def _remote_error(payload: bytes, at: int) -> RemoteError:
    """The error an ERROR payload carries (``interchange.md § ERROR Payload``); a payload too
    short for its header is the message text alone."""
    code, message = 0, payload.decode("utf-8", "replace")
    if len(payload) >= _ERROR.fixed_size:
        e, _ = _ERROR.unpack(payload)
        code = e["error_code"]
        message = payload[_ERROR.fixed_size : _ERROR.fixed_size + e["message_length"]].decode("utf-8", "replace")
    return remote_error(code, message, at)


# --------------------------------------------------------------------------------------
# COLLECT and ANNOTATE: what each payload holds, located
# --------------------------------------------------------------------------------------


def _located_payload(kind: int, payload, at: int, describe: Describe, faults: Faults) -> Iterator[Part]:
    """The parts inside the payload of the message at ``at``: per kind a descriptor and its
    ``transport`` fields, or a ``data header`` and ``data``; whatever remains, or the payload of
    any other kind, an opaque ``payload`` part."""
    pstart = at + _MSG_SIZE
    end = pstart + len(payload)
    if kind == _TENSOR_DESCRIPTOR:
        p = yield from _located_descriptor(payload, at, describe, faults)
    elif kind == _TENSOR_DATA:
        yield from _located_data(payload, pstart)
        p = end
    else:
        p = pstart
    if p < end:
        yield Part(PAYLOAD, p, end, value=payload[p - pstart :])


def _located_descriptor(payload, at: int, describe: Describe, faults: Faults):
    """The descriptor of a TENSOR_DESCRIPTOR payload and its ``transport`` fields (an empty
    ``transport`` part when they do not fit); returns where the parts end.  Under ``COLLECT``
    the descriptor is its ``descriptor_length`` bytes, or, when the payload cannot hold them,
    the ``stream.descriptor.payload`` fault and no descriptor: the whole payload is opaque."""
    pstart = at + _MSG_SIZE
    end = pstart + len(payload)
    if faults is Faults.COLLECT:
        length = _located_descriptor_length(payload, at)
        if length.__class__ is Part:  # the descriptor cannot be located in its payload
            yield length
            yield Part(PAYLOAD, pstart, end, value=payload)
            return end
        part = describe(payload[:length], pstart, 1)
    else:
        part = describe(payload, pstart, 1)
    yield part
    q = part.end
    if q + _TRANSPORT_SIZE > end:
        yield Part(TRANSPORT, q, q, TENSOR_DESCRIPTOR_FIELDS, None)  # does not fit
        return end
    t, _ = _TRANSPORT.unpack(payload, q - pstart)
    yield Part(TRANSPORT, q, q + _TRANSPORT_SIZE, TENSOR_DESCRIPTOR_FIELDS, t)
    return q + _TRANSPORT_SIZE


def _located_descriptor_length(payload, at: int):
    """:func:`_descriptor_length_in_payload` for ``COLLECT``: the descriptor's length, or
    the ``stream.descriptor.payload`` fault part; a header refused for its own bytes
    (magic, minimum length) gives the whole payload's length, for the descriptor's decode
    to name (the same rule at the same offset as the reader)."""
    try:
        return _descriptor_length_in_payload(payload, at)
    except SpecViolation as exc:
        if exc.rule_id != container_rules.DESCRIPTOR_PAYLOAD.id:
            return len(payload)
        return fault_at(exc)


def _located_data(payload, pstart: int) -> Iterator[Part]:
    """The ``data header`` of a TENSOR_DATA payload at ``pstart`` and its ``data`` (an empty
    ``data header`` part when the payload cannot hold it)."""
    if _DATA_SIZE > len(payload):
        yield Part(DATA_HEADER, pstart, pstart, TENSOR_DATA_HEADER, None)  # does not fit
        return
    d, _ = _DATA.unpack(payload)
    yield Part(DATA_HEADER, pstart, pstart + _DATA_SIZE, TENSOR_DATA_HEADER, d)
    yield Part(DATA, pstart + _DATA_SIZE, pstart + len(payload), value=payload[_DATA_SIZE:])
