"""Session vectors: for every transport rule a recording shows, a violating session and a passing
one close to it, recorded as ``serve --record`` records them.

A session is two directions (``NAME.client.msgs``: what the client sent; ``NAME.server.msgs``:
what the server sent).  Every case is played at this project's own server, on loopback, serving
:data:`SERVED` (written into the corpus as :data:`SERVED_FILE`, so a replay can serve the same):

* a rule the **server** checks (the fault is in what the client sent): the violating client
  direction is played and the server's answer is recorded; the server refuses it with ERROR;
* a rule the **client** checks (the fault is in what the server sent): the client direction is
  played and the server's recorded answer is the passing session; the violating one is that
  answer with one message changed (:class:`SessionCase` ``answer``).

A case qualifies as :mod:`.corpus` qualifies the others: ``audit`` of the passing session finds
nothing in either direction, and ``audit`` of the faulty direction of the violating one gives the
case's rule first, at one offset, in both modes.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import attrs
import numpy as np

from ..codec import decode_descriptor, encode_descriptor
from ..errors import HurraySchemaError
from ..net import messages as m
from ..structs.session import RDMA_REGISTER, CapabilityFlag, ErrorCode, RequestFlag, ShmMessageType
from ..structs.stream import MessageType as T
from ..structs.tags import DeviceTag, MemoryClass, SyncMode
from .case import Vector
from .replay import CLIENT_SUFFIX, SERVER_SUFFIX, messages_of

__all__ = ["SessionCase", "Recorded", "session_cases", "record_sessions", "SERVED", "SERVED_FILE", "SERVER_OPTIONS",
           "LOCAL", "served_file_bytes"]

SERVED = {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}
"""What the recording server serves (one file, its items by name)."""
SERVED_FILE = "session.served.hrry"
"""The file of :data:`SERVED`, written beside the session vectors: serve it to replay them."""
SERVER_OPTIONS = {"max_message_bytes": 1 << 16, "devices": ("cpu",), "parallel_shards": 2, "parallel_min_bytes": 0}
"""How the recording server was configured (the manifest repeats it): a server replaying the
vectors must advertise the same limits to give the same answers."""
LOCAL = "-unix"
"""Ends the name of a session recorded over a Unix socket (as ``serve --record`` names it)."""

_MARKER = 0x7FFF
"""The stream of the PING that ends every played client direction: its PONG says the server
answered everything before it.  Neither is kept in the vectors."""
_MAX = SERVER_OPTIONS["max_message_bytes"]


@attrs.frozen(slots=True)
class SessionCase:
    """One session rule's passing and violating sessions.

    ``receiver`` is the side that checks the rule: ``"server"`` -- ``violating`` is a client
    direction the server must refuse; ``"client"`` -- ``violating`` (default: ``passing``) is
    played and ``answer(recorded, play)`` turns the server's recorded answer into the violating
    server direction (``play`` records another client direction's answer)."""

    rule_id: str
    receiver: str
    passing: bytes = attrs.field(repr=False)
    violating: Optional[bytes] = attrs.field(default=None, repr=False)
    answer: Optional[Callable] = attrs.field(default=None, eq=False, repr=False)
    note: Optional[str] = None
    local: bool = False
    """Played over a Unix socket, where the shared-memory extension is agreed."""


@attrs.frozen(slots=True)
class Recorded:
    """One recorded session: its two directions."""

    client: bytes = attrs.field(repr=False)
    server: bytes = attrs.field(repr=False)


# --------------------------------------------------------------------------------------
# What clients send
# --------------------------------------------------------------------------------------


def hello(stream: int = 1, **fields) -> bytes:
    """A CLIENT_HELLO (``fields`` override :class:`~hurray_schema.net.messages.Hello`'s)."""
    values = {"protocol_version": 1, "max_message_size": 1 << 24, "capability_flags": 0, "devices": (0,)}
    values.update(fields)
    return m.message(T.CLIENT_HELLO, stream, m.encode_hello(m.Hello(**values), server=False))


def request(key: str = "x", stream: int = 3, kind=T.TENSOR_REQUEST, **fields) -> bytes:
    """A TENSOR_REQUEST (or an SHM_REQUEST) for ``key``."""
    return m.message(kind, stream, m.encode_request(m.Request(key, **fields)))


def put(descriptor_bytes: bytes, data: bytes, key: str = "mine", stream: int = 9) -> bytes:
    """A whole TENSOR_PUT: the PUT, one TENSOR_DATA frame, TENSOR_DATA_END."""
    out = [m.message(T.TENSOR_PUT, stream, m.encode_put(key, descriptor_bytes, len(data)))]
    if data:
        out.append(m.data_header(stream, 0, len(data)) + data)
    return b"".join(out + [m.message(T.TENSOR_DATA_END, stream)])


def _pushed(**handle) -> bytes:
    """The descriptor of a float32 (3, 4) row-major tensor pushed by the cases (``handle``: its
    buffer's fields)."""
    from ..model import BufferHandle, TensorDescriptor
    from ..structs.tags import ElementType

    data = SERVED["x"]
    return encode_descriptor(TensorDescriptor(ElementType.FLOAT32, data.shape,
                                              buffers=(BufferHandle(data.nbytes, **handle),)))


def _bad_key_request() -> bytes:
    """A request whose two-byte key is not UTF-8 (the key located by its own bytes)."""
    payload = m.encode_request(m.Request("ab"))
    at = payload.index(b"ab")
    return m.message(T.TENSOR_REQUEST, 3, payload[:at] + b"\xff\xfe" + payload[at + 2:])


# --------------------------------------------------------------------------------------
# What servers send, changed
# --------------------------------------------------------------------------------------


def _join(messages) -> bytes:
    return b"".join(m.message(kind, sid, payload) for kind, sid, payload in messages)


def _replaced(recorded: bytes, change: Callable) -> bytes:
    """``recorded`` with each message ``(kind, stream, payload)`` passed through ``change``, which
    returns it, a changed one, or None to drop it."""
    out = []
    for _, kind, sid, payload in messages_of(recorded):
        changed = change(kind, sid, bytes(payload))
        if changed is not None:
            out.append(changed)
    return _join(out)


def _descriptors_changed(recorded: bytes, change: Callable) -> bytes:
    """``recorded`` with each TENSOR_DESCRIPTOR's descriptor passed through ``change(desc, index)``
    (the transport fields kept; ``index`` counts the descriptors)."""
    seen = [0]

    def one(kind, sid, payload):
        if kind != T.TENSOR_DESCRIPTOR:
            return kind, sid, payload
        desc = decode_descriptor(payload[:-m.TRANSPORT_SIZE])
        seen[0] += 1
        return kind, sid, encode_descriptor(change(desc, seen[0] - 1)) + payload[-m.TRANSPORT_SIZE:]

    return _replaced(recorded, one)


def _buffers(desc, **fields):
    return attrs.evolve(desc, buffers=tuple(attrs.evolve(b, **fields) for b in desc.buffers))


def _placed_on_cuda(recorded: bytes, play) -> bytes:
    return _descriptors_changed(recorded, lambda desc, _: _buffers(desc, device_tag=DeviceTag.CUDA))


def _unified_memory(recorded: bytes, play) -> bytes:
    return _descriptors_changed(recorded, lambda desc, _: _buffers(desc, memory_class=MemoryClass.UNIFIED))


def _pong_before_hello(recorded: bytes, play) -> bytes:
    return m.message(T.PONG, 1) + recorded


def _shards_unasked(recorded: bytes, play) -> bytes:
    """The answer the server gives the same request with PARALLEL_OK: shards the client did not ask for."""
    return play(hello() + request(flags=RequestFlag.PARALLEL_OK))


def _overlapping_shards(recorded: bytes, play) -> bytes:
    """The second shard moved one row up onto the first (the last row left uncovered)."""
    def moved(desc, index):
        if index != 1:
            return desc
        offset = (desc.shard.shard_offset[0] - 1,) + tuple(desc.shard.shard_offset[1:])
        return attrs.evolve(desc, shard=attrs.evolve(desc.shard, shard_offset=offset))

    return _descriptors_changed(recorded, moved)


def _acknowledged(recorded: bytes, play) -> bytes:
    """The ERROR refusing the PUT replaced by a TENSOR_PUT_ACK."""
    return _replaced(recorded, lambda kind, sid, payload: (T.TENSOR_PUT_ACK, sid, b"") if kind == T.ERROR
                     else (kind, sid, payload))


def _hello_refused(recorded: bytes, play) -> bytes:
    """The SERVER_HELLO replaced by ERROR INVALID_MESSAGE, and nothing after it."""
    for _, kind, sid, _ in messages_of(recorded):
        if kind == T.SERVER_HELLO:
            return m.message(T.ERROR, sid, m.encode_error(ErrorCode.INVALID_MESSAGE,
                                                          "the layout list holds an unknown layout tag"))
    return recorded


def _segment_shrunk(recorded: bytes, play) -> bytes:
    """The SHM_DATA's segment one byte shorter than its buffer."""
    def one(kind, sid, payload):
        if kind != ShmMessageType.SHM_DATA:
            return kind, sid, payload
        segments = m.decode_shm_data(payload, 0)
        (offset, size), rest = segments[0], segments[1:]
        return kind, sid, m.encode_shm_data([(offset, size - 1)] + list(rest))

    return _replaced(recorded, one)


# --------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------


def _server_cases() -> list[SessionCase]:
    """Rules the server checks on what the client sends."""
    h = hello()
    ping = m.message(T.PING, 3, b"abc")
    rdma = RDMA_REGISTER.build({"remote_addr": 0x1000, "length": 48, "rkey": b"key"})
    all_caps = int(CapabilityFlag.TRANSCODING | CapabilityFlag.PARALLEL_STREAMS | CapabilityFlag.RDMA_DATA_PLANE
                   | CapabilityFlag.RDMA_GPUDIRECT)
    pushed = _pushed()
    data = SERVED["x"].tobytes()
    bad_request = request()
    return [
        SessionCase("session.hello.first", "server", h + request(), request() + h,
                    note="TENSOR_REQUEST before CLIENT_HELLO"),
        SessionCase("session.hello.version", "server", hello(protocol_version=7), hello(protocol_version=0),
                    note="CLIENT_HELLO protocol_version 0"),
        SessionCase("session.capabilities.reserved", "server", hello(capability_flags=all_caps),
                    hello(capability_flags=1 << 4), note="capability_flags bit 4 set"),
        SessionCase("session.capabilities.gpudirect", "server",
                    hello(capability_flags=int(CapabilityFlag.RDMA_DATA_PLANE | CapabilityFlag.RDMA_GPUDIRECT)),
                    hello(capability_flags=int(CapabilityFlag.RDMA_GPUDIRECT)),
                    note="RDMA_GPUDIRECT without RDMA_DATA_PLANE"),
        SessionCase("session.payload.length", "server", h + request(),
                    h + m.message(T.TENSOR_REQUEST, 3, bad_request[m.HEADER_SIZE:] + b"\x00"),
                    note="a TENSOR_REQUEST payload one byte longer than its table"),
        SessionCase("session.message.size", "server", h + m.message(T.PING, 3, bytes(_MAX)),
                    h + m.header(T.TENSOR_REQUEST, 3, _MAX + 1),
                    note="payload_length one past the server's max_message_size"),
        SessionCase("session.message.direction", "server", h + request(),
                    h + m.message(T.SERVER_HELLO, 3, m.encode_hello(m.Hello(1, 1 << 24, 0), server=True)),
                    note="SERVER_HELLO sent by the client"),
        SessionCase("session.message.private", "server", h + ping, h + m.message(0xF0, 3, b"abc"),
                    note="private message type 0xF0 over TCP, never agreed"),
        SessionCase("session.key.utf8", "server", h + request("ünïcødé ✓"), h + _bad_key_request(),
                    note="tensor_key bytes FF FE"),
        SessionCase("session.error.closes", "server",
                    h + m.message(T.ERROR, 5, m.encode_error(ErrorCode.INVALID_MESSAGE, "client gives up")) + request(),
                    h + m.message(T.ERROR, 3, m.encode_error(ErrorCode.INVALID_MESSAGE, "client gives up")) + request(),
                    note="a TENSOR_REQUEST on the stream the client's ERROR closed"),
        SessionCase("session.request.flags.reserved", "server",
                    h + request(flags=int(RequestFlag.ALLOW_TRANSCODE | RequestFlag.PARALLEL_OK)),
                    h + request(flags=1 << 2), note="request_flags bit 2 set"),
        SessionCase("session.request.alignment", "server", h + request(min_alignment=1 << 20),
                    h + request(min_alignment=48), note="min_alignment 48"),
        SessionCase("session.put.flow", "server", h + put(pushed, data),
                    h + put(pushed, data)[: m.HEADER_SIZE + len(m.encode_put("mine", pushed, len(data)))]
                    + request(stream=9), note="a TENSOR_REQUEST on a PUT's stream before its TENSOR_DATA_END"),
        SessionCase("session.rdma.agreed", "server", h + ping, h + m.message(T.RDMA_REGISTER, 3, rdma),
                    note="RDMA_REGISTER without RDMA_DATA_PLANE advertised"),
        SessionCase("stream.sync_mode.cross_machine", "server", h + put(pushed, data),
                    h + put(_pushed(device_tag=DeviceTag.CUDA, sync_mode=SyncMode.EVENT), data),
                    note="a PUT over TCP of a CUDA buffer synchronised by an EVENT (an event of one machine)"),
    ]


def _client_cases() -> list[SessionCase]:
    """Rules the client checks on what the server sends."""
    h = hello()
    plain = h + request()
    parallel = h + request(flags=int(RequestFlag.PARALLEL_OK))
    pushed, data = _pushed(), SERVED["x"].tobytes()
    extension = hello(layouts=(m.LayoutEntry(0xF3, b"\x01\x02\x03"), m.LayoutEntry(0x01)))
    return [
        SessionCase("session.hello.server_first", "client", plain, answer=_pong_before_hello,
                    note="the server's first message is a PONG"),
        SessionCase("session.device.accept", "client", plain, answer=_placed_on_cuda,
                    note="a CPU request answered on CUDA, which the client did not advertise"),
        SessionCase("session.device.selection", "client", hello(devices=(0, 1)) + request(), answer=_placed_on_cuda,
                    note="a CPU request answered on CUDA by a server that advertised only CPU"),
        SessionCase("session.memory_class", "client", plain, answer=_unified_memory,
                    note="a buffer of memory_class UNIFIED, which the client did not advertise"),
        SessionCase("session.shards.requested", "client", plain, answer=_shards_unasked,
                    note="two shards answer a request without PARALLEL_OK"),
        SessionCase("session.shards.consistency", "client", parallel, answer=_overlapping_shards,
                    note="the second shard's offset overlaps the first"),
        SessionCase("session.put.accepted", "client", h + put(pushed, data),
                    h + put(_pushed(alignment=48), data), answer=_acknowledged,
                    note="TENSOR_PUT_ACK for a PUT whose buffer alignment is not a power of two"),
        SessionCase("session.layouts.extension_skip", "client", extension + request(), answer=_hello_refused,
                    note="ERROR INVALID_MESSAGE answers a CLIENT_HELLO with an extension layout entry"),
        SessionCase("session.shm.segments", "client", h + request(kind=ShmMessageType.SHM_REQUEST),
                    answer=_segment_shrunk, local=True,
                    note="an SHM_DATA segment one byte shorter than its buffer"),
    ]


def session_cases() -> list[SessionCase]:
    """Every session case, server-checked rules first."""
    return _server_cases() + _client_cases()


# --------------------------------------------------------------------------------------
# Recording them at this project's server
# --------------------------------------------------------------------------------------


def served_file_bytes() -> bytes:
    """The bytes of :data:`SERVED_FILE`."""
    from ..io import write_file

    with tempfile.TemporaryDirectory(prefix="hurray-sessions-") as scratch:
        path = Path(scratch) / SERVED_FILE
        write_file(path, SERVED)
        return path.read_bytes()


def _until_marker(sock: socket.socket, deadline: float) -> bytes:
    """What the server sends until the marker's PONG arrived (that PONG left out) or it closed."""
    got = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(got)
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 16)
        except (socket.timeout, ConnectionResetError):
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk
        answered = _without_marker(bytes(got), T.PONG)
        if len(answered) < len(got) and answered == bytes(got[: len(answered)]) and \
                sum(1 for _ in messages_of(bytes(got))) > sum(1 for _ in messages_of(answered)):
            return answered


def _play(address, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` then the marker PING; what the server sent back before the marker's PONG
    (or before it closed)."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(address)
        try:
            sock.sendall(data + m.message(T.PING, _MARKER, b"end"))
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _until_marker(sock, time.monotonic() + timeout)


def _without_marker(data: bytes, kind) -> bytes:
    """A recorded direction without the marker's message at its end."""
    last = None
    for at, k, sid, _ in messages_of(data):
        last = (at, k, sid)
    if last is not None and last[1] == kind and last[2] == _MARKER:
        return data[: last[0]]
    return data


_NUMBER = re.compile(r"-(\d+)(?:-unix)?\.client\.msgs$")


def _recordings(folder: str) -> list[Recorded]:
    """The sessions recorded in ``folder``, in the order they were played."""
    if not os.path.isdir(folder):
        return []
    names = sorted((int(_NUMBER.search(n).group(1)), n) for n in os.listdir(folder) if _NUMBER.search(n))
    out = []
    for _, name in names:
        base = os.path.join(folder, name[: -len(CLIENT_SUFFIX)])
        client = Path(base + CLIENT_SUFFIX).read_bytes()
        server = Path(base + SERVER_SUFFIX).read_bytes()
        out.append(Recorded(_without_marker(client, T.PING), _without_marker(server, T.PONG)))
    return out


class _Recorder:
    """Two servers of :data:`SERVED` recording every connection (one on loopback TCP, one on a Unix
    socket); :meth:`play` plays one client direction and returns the server's answer."""

    def __init__(self, scratch: str):
        from ..net import serve

        served = Path(scratch) / SERVED_FILE
        served.write_bytes(served_file_bytes())
        self.folders = {False: os.path.join(scratch, "tcp"), True: os.path.join(scratch, "unix")}
        self.unix_path = os.path.join(scratch, "s.sock")
        self.servers = {
            False: serve([served], record=self.folders[False], writable=os.path.join(scratch, "store"),
                         **SERVER_OPTIONS),
            True: serve([served], unix=self.unix_path, record=self.folders[True],
                        writable=os.path.join(scratch, "store-unix"), **SERVER_OPTIONS),
        }
        self.sent: dict[bool, list[bytes]] = {False: [], True: []}
        """Per transport, what each connection played sent, in order."""

    def play(self, data: bytes, local: bool = False) -> tuple[tuple[bool, int], bytes]:
        """Play ``data``: ``((transport, index), answer)``, the index of its recording."""
        server = self.servers[local]
        answer = _play(self.unix_path if local else (server.host, server.port), data)
        self.sent[local].append(data)
        return (local, len(self.sent[local]) - 1), answer

    def close(self) -> dict:
        """Stop both servers (every recording is then complete); the sessions per transport, each
        checked to be the one played (a connection another process made would shift them)."""
        for server in self.servers.values():
            server.close()
        recorded = {local: _recordings(folder) for local, folder in self.folders.items()}
        for local, sessions in recorded.items():
            sent = self.sent[local]
            if len(sessions) != len(sent) or any(not data.startswith(s.client) for s, data in zip(sessions, sent)):
                raise HurraySchemaError(
                    f"the recording server saw {len(sessions)} connections for the {len(sent)} sessions played: "
                    "another process connected to it while the vectors were generated; run the generation again")
        return recorded


def record_sessions(cases: list[SessionCase]) -> list[tuple[SessionCase, Recorded, Recorded]]:
    """``(case, passing, violating)`` sessions of every case, recorded at this project's server
    (a client-checked case's violating server direction is its ``answer``)."""
    with tempfile.TemporaryDirectory(prefix="hurray-sessions-") as scratch:
        recorder = _Recorder(scratch)
        plans = []
        try:
            for case in cases:
                passing, _ = recorder.play(case.passing, case.local)
                violating, answer = recorder.play(case.violating if case.violating is not None else case.passing,
                                                  case.local)
                if case.answer is not None:
                    answer = case.answer(answer, lambda data, local=case.local: recorder.play(data, local)[1])
                plans.append((case, passing, violating, answer))
        finally:
            recorded = recorder.close()
    out = []
    for case, (pt, pi), (vt, vi), answer in plans:
        violating = recorded[vt][vi]
        if case.answer is not None:
            violating = Recorded(violating.client, answer)
        out.append((case, recorded[pt][pi], violating))
    return out


# --------------------------------------------------------------------------------------
# Their verdicts and vectors
# --------------------------------------------------------------------------------------


_ROLE_NAME = re.compile(r"\.(pass|fail)(-unix)?\.(client|server)\.msgs$")


def is_session_file(name: str) -> bool:
    """``name`` is a session vector's direction file (``<rule>[.N].<pass|fail>[-unix].<client|server>.msgs``)."""
    return _ROLE_NAME.search(name) is not None


def session_name(rule_id: str, index: int, role: str, local: bool) -> str:
    """The name of a session vector (its files add ``.client.msgs`` / ``.server.msgs``)."""
    suffix = "" if index == 0 else f".{index + 1}"
    return f"{rule_id}{suffix}.{role}{LOCAL if local else ''}"


def direction_verdicts(session: Recorded, name: str) -> dict:
    """``{direction: (strict, permissive)}``: ``audit``'s first finding in each direction of
    ``session``, written side by side as ``--record`` writes them (each direction is judged as its
    receiver judges it, with the other direction beside it)."""
    from ..audit import audit
    from .verdicts import Verdict

    def verdict(findings) -> Verdict:
        first = next(iter(findings), None)
        if first is None:
            return Verdict(True)
        return Verdict(not first.is_error, first.rule_id, first.offset)

    out = {}
    with tempfile.TemporaryDirectory(prefix="hurray-sessions-") as scratch:
        base = os.path.join(scratch, name)
        Path(base + CLIENT_SUFFIX).write_bytes(session.client)
        Path(base + SERVER_SUFFIX).write_bytes(session.server)
        for direction, suffix in (("client", CLIENT_SUFFIX), ("server", SERVER_SUFFIX)):
            out[direction] = tuple(verdict(audit(base + suffix, mode=mode).findings) for mode in ("strict", "permissive"))
    return out


def _first_error_code(server: bytes) -> Optional[int]:
    for at, kind, _, payload in messages_of(server):
        if kind == T.ERROR:
            return m.decode_error(payload, at)[0]
    return None


def _why_not(case: SessionCase, passing: dict, violating: dict, expected: tuple, error_code) -> Optional[str]:
    """None when the sessions qualify (see the module docstring), else why not."""
    for direction, verdicts in passing.items():
        for verdict in verdicts:
            if not verdict.accepted or verdict.rule_id is not None:
                return f"the passing session's {direction} direction is not clean: {verdict.to_json()}"
    faulty = violating["client" if case.receiver == "server" else "server"]
    for verdict in faulty:
        if verdict.rule_id != case.rule_id:
            return f"the violating session fires {verdict.rule_id} first"
    strict, permissive = faulty
    if (strict.accepted, permissive.accepted) != expected:
        return f"unexpected verdicts {strict.to_json()} / {permissive.to_json()}"
    if strict.offset != permissive.offset or strict.offset is None:
        return f"audit locates it differently: {strict.offset} / {permissive.offset}"
    if case.receiver == "server" and error_code is None:
        return "the recording server did not refuse the violating client direction with ERROR"
    return None


def session_vectors(case: SessionCase, passing: Recorded, violating: Recorded, index: int, expected: tuple):
    """``(vectors, None)``: the four direction files of ``case`` (``expected``: whether the strict and
    the permissive receiver accept a session whose first finding is the case's rule), or
    ``([], why not)``."""
    names = {role: session_name(case.rule_id, index, role, case.local) for role in ("pass", "fail")}
    try:
        verdicts = {role: direction_verdicts(session, names[role])
                    for role, session in (("pass", passing), ("fail", violating))}
    except Exception as exc:  # noqa: BLE001 -- reported in the manifest, not fatal
        return [], f"judging the sessions failed: {type(exc).__name__}: {exc}"
    error_code = _first_error_code(violating.server) if case.receiver == "server" else None
    reason = _why_not(case, verdicts["pass"], verdicts["fail"], expected, error_code)
    if reason is not None:
        return [], reason
    faulty = "client" if case.receiver == "server" else "server"
    vectors = []
    for role, session in (("pass", passing), ("fail", violating)):
        for direction, data in (("client", session.client), ("server", session.server)):
            kept = role if role == "pass" or direction == faulty else "peer"
            vectors.append(Vector(
                f"{names[role]}.{direction}.msgs", "session", case.rule_id, kept, data, *verdicts[role][direction],
                note=case.note if kept == "fail" else None, session=names[role], direction=direction,
                error_code=error_code if kept == "fail" else None))
    return vectors, None


def session_manifest() -> dict:
    """What the manifest says about the session vectors as a whole."""
    return {
        "served_file": SERVED_FILE,
        "served_items": sorted(SERVED),
        "server_options": {k: list(v) if isinstance(v, tuple) else v for k, v in SERVER_OPTIONS.items()},
        "recorded_as": "serve --record: NAME.client.msgs is what the client sent, NAME.server.msgs what the "
                       "server sent; a name ending in -unix was recorded over a Unix socket (the shared-memory "
                       "extension agreed), the others over loopback TCP (crossing machines, for the sync-mode rule)",
        "replay": "hurray-schema replay NAME --server HOST:PORT plays NAME.client.msgs at a server serving "
                  "served_file and compares its answer with NAME.server.msgs; --client-port PORT plays "
                  "NAME.server.msgs to a client that connects",
        "not_in_a_recording": [
            "the file descriptors that travel beside SHM_DATA and SHM_PUT (SCM_RIGHTS): their seals and sizes",
            "when each message was sent relative to the other direction (the two directions are separate files)",
            "the server's configuration beyond server_options, and what it stores",
        ],
    }
