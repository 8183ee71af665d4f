"""Rules of a transport session (``interchange.md`` § Network Transport Protocol through
§ Error Handling): the hellos, requests, negotiation, parallel shards, PUT and errors.

The framing and the order of a tensor's messages are the container rules of
:mod:`hurray_schema.rules.container` (``stream.*``): a live session and a recorded message
stream are checked by the same rules.  The rules here are what only a session has.  They are
fired by :mod:`hurray_schema.net.checker`, which the server runs on what it receives, the
client on what it receives, and ``audit`` on a recorded session; each fault carries the byte
offset in the direction it travelled (the first byte of the connection is offset 0).

Some rules bind the server's own choices (layout and device selection, transcoding): the
server makes those choices through them, and the client checks what it can see of them.
"""

from __future__ import annotations

from .engine import Level, declare

MUST, MUST_NOT, SHOULD = Level.MUST, Level.MUST_NOT, Level.SHOULD

SE = "interchange.md § Session Establishment"
TYPES = "interchange.md § Message Types"
FRAMING = "interchange.md § Message Framing"
CAPS = "interchange.md § Capability Flags"
ENTRY = "interchange.md § Layout Entry Encoding"
REQ = "interchange.md § TENSOR_REQUEST Payload"
SEL = "interchange.md § Server Layout Selection"
TRANS = "interchange.md § On-the-Fly Transcoding"
DEV = "interchange.md § Server Device Selection"
PAR = "interchange.md § Shard Consistency"
PUT = "interchange.md § TENSOR_PUT Flow"
ERR = "interchange.md § ERROR Payload"
RDMA = "interchange.md § RDMA Data Plane"


def _session(rule_id: str, level: Level, citation: str, summary: str, *, enforced_by: str | tuple[str, ...]):
    return declare(rule_id, level, citation, summary, scope="session", enforced_by=enforced_by)


# --- establishment --------------------------------------------------------------------
HELLO_FIRST = _session(
    "session.hello.first", MUST, SE,
    "A client's first message on a connection is CLIENT_HELLO, and it sends CLIENT_HELLO only once.",
    enforced_by="hurray_schema.net.checker:SessionChecker.header")
SERVER_HELLO_FIRST = _session(
    "session.hello.server_first", MUST, SE,
    "The server answers CLIENT_HELLO with SERVER_HELLO (or ERROR) before any other message, and only once.",
    enforced_by="hurray_schema.net.checker:SessionChecker.header")
HELLO_VERSION = _session(
    "session.hello.version", MUST, "interchange.md § SERVER_HELLO Payload",
    "A hello's protocol_version is at least 1, SERVER_HELLO's at most the client's; a server that has no "
    "such version answers ERROR PROTOCOL_VERSION_MISMATCH and closes.",
    enforced_by=(
        "hurray_schema.net.checker:SessionChecker.client_hello",
        "hurray_schema.net.checker:SessionChecker.server_hello",
    ))
CAPABILITY_RESERVED = _session(
    "session.capabilities.reserved", MUST, CAPS, "capability_flags bits 4-63 are zero.",
    enforced_by="hurray_schema.net.checker:check_capabilities")
CAPABILITY_GPUDIRECT = _session(
    "session.capabilities.gpudirect", MUST, CAPS, "RDMA_GPUDIRECT (bit 3) is set only with RDMA_DATA_PLANE (bit 2).",
    enforced_by="hurray_schema.net.checker:check_capabilities")
LAYOUT_EXTENSION_SKIP = _session(
    "session.layouts.extension_skip", MUST_NOT, ENTRY,
    "A layout list is not rejected for extension entries the reader does not understand: they are skipped "
    "by their ext_metadata_length.",
    enforced_by=(
        "hurray_schema.net.messages:decode_hello",
        "hurray_schema.net.checker:SessionChecker._check_extension_skip",
    ))

# --- every message --------------------------------------------------------------------
PAYLOAD_LENGTH = _session(
    "session.payload.length", MUST, FRAMING,
    "A session message's payload holds exactly its table: nothing cut, nothing left over.",
    enforced_by=("hurray_schema.net.checker:SessionChecker.ack", "hurray_schema.net.messages:_parse"))
MESSAGE_SIZE = _session(
    "session.message.size", MUST, FRAMING,
    "payload_length is at most the max_message_size the receiver advertised; a larger one is answered with "
    "ERROR MESSAGE_TOO_LARGE.",
    enforced_by=(
        "hurray_schema.io.walk.messages:check_message_header",
        "hurray_schema.net.checker:SessionChecker.header",
    ))
MESSAGE_DIRECTION = _session(
    "session.message.direction", MUST, TYPES,
    "A message type travels only in the direction its table gives (CLIENT_HELLO, TENSOR_REQUEST and TENSOR_PUT "
    "client to server; SERVER_HELLO, TENSOR_DESCRIPTOR and TENSOR_PUT_ACK server to client).",
    enforced_by="hurray_schema.net.checker:SessionChecker.header")
MESSAGE_PRIVATE = _session(
    "session.message.private", MUST_NOT, TYPES,
    "A private message type (0xF0-0xFE) is not sent to a peer that has not agreed to it.",
    enforced_by="hurray_schema.io.walk.messages:check_message_header")
KEY_UTF8 = _session(
    "session.key.utf8", MUST, REQ, "A tensor_key (TENSOR_REQUEST, TENSOR_PUT) is valid UTF-8.",
    enforced_by="hurray_schema.net.messages:_text")
ERROR_CLOSES = _session(
    "session.error.closes", MUST, "interchange.md § Error Handling",
    "After an ERROR on a stream, neither side sends anything more on that stream.",
    enforced_by="hurray_schema.net.checker:SessionChecker.header")

# --- requests and negotiation ---------------------------------------------------------
REQUEST_FLAGS_RESERVED = _session(
    "session.request.flags.reserved", MUST, REQ, "request_flags bits 2-31 are zero.",
    enforced_by="hurray_schema.net.checker:SessionChecker.request")
REQUEST_ALIGNMENT = _session(
    "session.request.alignment", MUST, REQ, "min_alignment is a power of two.",
    enforced_by="hurray_schema.net.checker:check_min_alignment")
LAYOUT_SELECTION = _session(
    "session.layout.selection", MUST, SEL,
    "The server serves the first preferred layout it stores the tensor in or (ALLOW_TRANSCODE and TRANSCODING) "
    "can transcode to; else the native layout.",
    enforced_by="hurray_schema.net.catalog:plan_response")
TRANSCODE_LIMIT = _session(
    "session.transcode.limit", MUST_NOT, TRANS,
    "The server does not transcode when the output would exceed its transcoding memory limit: it falls "
    "through to the next preference or the native layout.",
    enforced_by="hurray_schema.net.catalog:transcoded")
TRANSCODE_ELEMENTS = _session(
    "session.transcode.elements", MUST, TRANS,
    "A transcoded tensor has the same rank, shape, element type and value at every index as the stored one.",
    enforced_by="hurray_schema.net.catalog:transcoded")
DEVICE_SELECTION = _session(
    "session.device.selection", MUST, DEV,
    "The response is placed on preferred_device, or the server answers DEVICE_UNAVAILABLE; the only silent "
    "fallback is to CPU, for a device the server advertised, when the client advertised CPU (rules 1-4).",
    enforced_by="hurray_schema.net.devices:check_placement")
DEVICE_ACCEPT = _session(
    "session.device.accept", MUST, DEV,
    "A client keeps a response placed on another device than it preferred only if it advertised that device, "
    "else it closes the stream with ERROR (rule 6).",
    enforced_by="hurray_schema.net.devices:check_placement")
MEMORY_CLASS = _session(
    "session.memory_class", MUST_NOT, "interchange.md § SERVER_HELLO Payload",
    "A buffer's memory_class is one the client advertised (STANDARD when it advertised none).",
    enforced_by="hurray_schema.net.checker:SessionChecker._check_placement")

# --- parallel transfers ---------------------------------------------------------------
SHARD_CONSISTENCY = _session(
    "session.shards.consistency", MUST, PAR,
    "The shards of one parallel transfer share parent_shape, element type and layout, and exactly cover "
    "parent_shape without overlap; a client rejects the transfer otherwise.",
    enforced_by=(
        "hurray_schema.net.checker:SessionChecker._response_of",
        "hurray_schema.net.checker:Transfer.add",
        "hurray_schema.net.checker:Transfer.check",
        "hurray_schema.net.client:Session._fail",
        "hurray_schema.net.client:_Response._torn",
        "hurray_schema.net.client:_Response._descriptor",
    ))
SHARD_REQUESTED = _session(
    "session.shards.requested", MUST, "interchange.md § Parallel Transfer Flow",
    "A response comes in several shards only when the client set PARALLEL_OK and the server advertised "
    "PARALLEL_STREAMS.",
    enforced_by="hurray_schema.net.checker:SessionChecker._open_transfer")

# --- PUT ------------------------------------------------------------------------------
PUT_FLOW = _session(
    "session.put.flow", MUST, PUT,
    "A TENSOR_PUT is followed on its stream by its TENSOR_DATA frames and TENSOR_DATA_END; the server answers "
    "TENSOR_PUT_ACK or ERROR, and ACK only for a PUT it received whole.",
    enforced_by=(
        "hurray_schema.net.checker:SessionChecker.header",
        "hurray_schema.net.checker:SessionChecker.ack",
        "hurray_schema.net.client:Session._await_ack",
    ))
PUT_ACCEPTED = _session(
    "session.put.accepted", MUST, "interchange.md § TENSOR_PUT_ACK Payload",
    "A server that cannot accept a pushed tensor (policy, validation, resources) answers ERROR, not "
    "TENSOR_PUT_ACK.",
    enforced_by=(
        "hurray_schema.net.server:_Connection._put_refusal",
        "hurray_schema.net.checker:SessionChecker.ack",
        "hurray_schema.net.checker:PushJudge.judge",
    ))

# --- RDMA -----------------------------------------------------------------------------
RDMA_AGREED = _session(
    "session.rdma.agreed", MUST, RDMA,
    "RDMA_REGISTER and RDMA_READY are sent only when both hellos advertised RDMA_DATA_PLANE.",
    enforced_by="hurray_schema.net.checker:SessionChecker.header")

# --- shared memory (our private extension, interchange.md § IPC) ----------------------
SHM = "interchange.md § IPC"
SHM_SEGMENTS = _session(
    "session.shm.segments", MUST, SHM,
    "SHM_DATA comes with exactly one file descriptor and lists one segment per buffer, each of its handle's "
    "byte_size and inside the file.",
    enforced_by=("hurray_schema.net.checker:SessionChecker.shm_data", "hurray_schema.net.shm:Mappings.view"))
SHM_SEALED = _session(
    "session.shm.sealed", MUST, SHM,
    "The memory file of an SHM_PUT is sealed against writing, growing and shrinking, and is the size its buffers "
    "laid out on 64-byte boundaries need: no smaller, no larger.",
    enforced_by=("hurray_schema.net.server:_Connection._shm_put", "hurray_schema.net.shm:check_sealed"))

SESSION_RULES = tuple(
    rule for name, rule in dict(globals()).items() if name.isupper() and hasattr(rule, "violation")
)
"""Every rule of this module, for the coverage tests."""
