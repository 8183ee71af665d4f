"""Playing a recorded session at a live peer, and comparing what comes back, rule by rule.

A session vector is two recorded directions (``NAME.client.msgs``: what the client sent;
``NAME.server.msgs``: what the server sent), as ``serve --record`` writes them.  An
implementer replays one against their own code:

* a **server** under test: :func:`replay_at` connects to it, sends the recorded client
  direction as it is and reads the server's answer until it has as many messages as the
  recording, the connection ends, or the time is up; :func:`compare` then says where the
  answer differs from the recording as a receiver judges it (message types and streams, the
  ERROR codes, the findings ``audit`` gives the direction);
* a **client** under test: :class:`RecordedServer` listens and plays the recorded server
  direction to the client that connects (its hello after the client's first message, the rest
  after the client's next one), so the client's own checks can be compared with the manifest.

Nothing here reads the recording leniently: the bytes are sent exactly as recorded.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import attrs

from ..net import messages as m
from ..structs.stream import MessageType

__all__ = ["Replay", "messages_of", "replay_at", "compare", "RecordedServer", "session_files", "audit_direction",
           "CLIENT_SUFFIX", "SERVER_SUFFIX"]

_SLACK = 1 << 20
"""Bytes an answer may exceed twice the recorded one by (other hellos, other framing) before the
replay stops reading it."""
_DISCARD = 1 << 16
"""The most bytes the recorded-server player holds of a message it reads and drops."""

CLIENT_SUFFIX = ".client.msgs"
SERVER_SUFFIX = ".server.msgs"


def session_files(base) -> tuple[Path, Path]:
    """The two direction files of the session ``base`` (a path without ``.client.msgs`` /
    ``.server.msgs``, or either file)."""
    name = os.fspath(base)
    for suffix in (CLIENT_SUFFIX, SERVER_SUFFIX):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path(name + CLIENT_SUFFIX), Path(name + SERVER_SUFFIX)


def messages_of(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """``(offset, message_type, stream_id, payload)`` of every whole message of a recorded direction
    (a message cut short ends the list)."""
    at, n = 0, len(data)
    while at + m.HEADER_SIZE <= n:
        kind, sid, plen = m.unpack_header(data[at: at + m.HEADER_SIZE])
        end = at + m.HEADER_SIZE + plen
        if end > n:
            return
        yield at, kind, sid, data[at + m.HEADER_SIZE: end]
        at = end


def _count(data: bytes) -> int:
    return sum(1 for _ in messages_of(data))


def _read_messages(sock: socket.socket, count: int, deadline: float, budget: int) -> bytes:
    """What the peer sends until ``count`` whole messages arrived, it closed, ``deadline`` passed or
    ``budget`` bytes arrived (a peer that announces or sends more than any answer to the recording
    needs is cut there: the comparison then names the difference)."""
    got = bytearray()
    whole, at = 0, 0  # messages complete so far, and where the next one starts
    while whole < count and len(got) < budget:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(1 << 16, budget - len(got)))
        except (socket.timeout, ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        got += chunk
        while at + m.HEADER_SIZE <= len(got):
            _, _, plen = m.unpack_header(bytes(got[at: at + m.HEADER_SIZE]))
            if at + m.HEADER_SIZE + plen > len(got):
                break
            at += m.HEADER_SIZE + plen
            whole += 1
    return bytes(got)


def _connect(address, timeout: float) -> socket.socket:
    if isinstance(address, (str, os.PathLike)) and not isinstance(address, tuple):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(os.fspath(address))
        return sock
    return socket.create_connection(address, timeout=timeout)


def exchange(address, sent: bytes, *, expect: int, budget: int, timeout: float = 5.0) -> bytes:
    """Send ``sent`` to the server at ``address`` (``(host, port)`` or a Unix socket path) and
    return what it sends back: ``expect`` messages, or less when it closes, ``timeout`` passes or
    ``budget`` bytes arrived."""
    deadline = time.monotonic() + timeout
    with _connect(address, timeout) as sock:
        try:
            sock.sendall(sent)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed part way: what it answered before is still to be read
        return _read_messages(sock, expect, deadline, budget)


@attrs.frozen(slots=True)
class Replay:
    """One replay: the recorded directions and what the peer under test sent back."""

    name: str
    sent: bytes = attrs.field(repr=False)
    recorded: bytes = attrs.field(repr=False)
    received: bytes = attrs.field(repr=False)
    differences: tuple[str, ...] = ()
    """Where the answer differs from the recording as a receiver judges it (empty: it agrees)."""

    @property
    def agrees(self) -> bool:
        return not self.differences

    @property
    def same_bytes(self) -> bool:
        return self.received == self.recorded

    def error_codes(self) -> list[int]:
        """The ``error_code`` of every ERROR the peer sent, in order."""
        return [m.decode_error(payload, at)[0] for at, kind, _, payload in messages_of(self.received)
                if kind == MessageType.ERROR]


def replay_at(base, address, *, timeout: float = 5.0) -> Replay:
    """Play the client direction of session ``base`` at the server at ``address`` and compare its
    answer with the recorded server direction (:func:`compare`)."""
    client, server = session_files(base)
    sent, recorded = client.read_bytes(), server.read_bytes()
    received = exchange(address, sent, expect=_count(recorded), budget=2 * len(recorded) + _SLACK, timeout=timeout)
    name = client.name[: -len(CLIENT_SUFFIX)]
    return Replay(name, sent, recorded, received, tuple(compare(sent, recorded, received, name=name)))


def _shape(data: bytes) -> list[tuple[int, int]]:
    return [(int(kind), sid) for _, kind, sid, _ in messages_of(data)]


def _error_code(payload: bytes, at: int) -> Optional[int]:
    try:
        return m.decode_error(payload, at)[0]
    except Exception:  # noqa: BLE001 -- a malformed ERROR is a difference audit names
        return None


def audit_direction(sent: bytes, answer: bytes, name: str = "replay") -> list[tuple[str, int]]:
    """``(rule id, offset)`` of what ``audit`` finds in the server direction ``answer`` of a session
    whose client direction is ``sent`` (the two written side by side as ``--record`` writes them)."""
    from ..audit import audit

    with tempfile.TemporaryDirectory(prefix="hurray-replay-") as scratch:
        client, server = session_files(Path(scratch) / name)
        client.write_bytes(sent)
        server.write_bytes(answer)
        return [(f.rule_id, f.offset) for f in audit(server).findings]


def compare(sent: bytes, recorded: bytes, received: bytes, *, name: str = "replay") -> Iterator[str]:
    """Where ``received`` (a server's answer to ``sent``) differs from the ``recorded`` answer, rule
    by rule: the sequence of message types and streams, each ERROR's code, and the rules ``audit``
    finds in each (a hello's limits and a descriptor's alignment may differ between servers; what a
    client would judge may not)."""
    want, got = _shape(recorded), _shape(received)
    if want != got:
        yield f"messages (type, stream): recorded {want}, received {got}"
    for (at, kind, _, payload), (at2, kind2, _, payload2) in zip(messages_of(recorded), messages_of(received)):
        if kind == kind2 == MessageType.ERROR and _error_code(payload, at) != _error_code(payload2, at2):
            yield (f"ERROR at byte {at2}: error_code {_error_code(payload2, at2)}, recorded "
                   f"{_error_code(payload, at)}")
    if _tensors(recorded) != _tensors(received):
        yield "the tensors served differ from the recorded ones (element type, shape, layout or data)"
    expected = [rule for rule, _ in audit_direction(sent, recorded, name)]
    found = [rule for rule, _ in audit_direction(sent, received, name)]
    if expected != found:
        yield f"audit of the server direction: recorded {expected}, received {found}"


def _tensors(data: bytes) -> list[tuple]:
    """``(element type, shape, layout tag, data bytes)`` of every tensor a server direction carries,
    in the order their descriptors arrived; the data joined by its frames' offsets, however the
    server cut them."""
    from ..codec import decode_descriptor
    from ..errors import HurraySchemaError

    found, open_ = [], {}
    for at, kind, sid, payload in messages_of(data):
        if kind == MessageType.TENSOR_DESCRIPTOR:
            try:
                desc = decode_descriptor(bytes(payload[: len(payload) - m.TRANSPORT_SIZE]), mode="permissive")
            except HurraySchemaError:
                continue
            open_[sid] = [int(desc.type_tag), tuple(desc.shape), int(desc.layout_tag), {}]
            found.append(open_[sid])
        elif kind == MessageType.TENSOR_DATA and sid in open_ and len(payload) >= m.DATA_HEADER_SIZE:
            open_[sid][3][m.unpack_offset_in_buffer(payload)] = bytes(payload[m.DATA_HEADER_SIZE:])
    return [(t, s, layout, b"".join(chunk for _, chunk in sorted(frames.items()))) for t, s, layout, frames in found]


class RecordedServer:
    """A listening socket that plays the server direction of session ``base`` to the client that
    connects: the messages up to the first SERVER_HELLO or ERROR once the client's first message
    arrived, the rest once its next message arrived (a client under test sends its hello, then its
    request).  The recorded stream ids follow the live client's: the stream of the recorded client's
    n-th message becomes that of the live client's n-th message (the bytes keep their length, so
    every offset stays the recording's).  A context manager; ``address`` is ``(host, port)``."""

    def __init__(self, base, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 5.0):
        client, server = session_files(base)
        self.recorded = server.read_bytes()
        self.recorded_streams = [sid for _, _, sid, _ in messages_of(client.read_bytes())]
        self.timeout = timeout
        self._listener = socket.create_server((host, port))
        self.address = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name="recorded-server", daemon=True)
        self._thread.start()

    def _parts(self) -> tuple[bytes, bytes]:
        """The recorded direction cut after its first SERVER_HELLO or ERROR."""
        for at, kind, _, payload in messages_of(self.recorded):
            if kind in (MessageType.SERVER_HELLO, MessageType.ERROR):
                end = at + m.HEADER_SIZE + len(payload)
                return self.recorded[:end], self.recorded[end:]
        return self.recorded, b""

    def _renumbered(self, data: bytes, live: list[int]) -> bytes:
        """``data`` with each recorded client stream id replaced by the live client's."""
        mapping: dict[int, int] = {}
        for recorded, now in zip(self.recorded_streams, live):
            mapping.setdefault(recorded, now)
        out = bytearray(data)
        for at, kind, sid, payload in messages_of(data):
            if sid in mapping:
                out[at: at + m.HEADER_SIZE] = m.header(kind, mapping[sid], len(payload))
        return bytes(out)

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(self.timeout)
            live: list[int] = []
            try:
                for part in self._parts():
                    sid = _read_one(conn)
                    if sid is None:
                        return
                    live.append(sid)
                    if part:
                        conn.sendall(self._renumbered(part, live))
                _drain(conn)
            except OSError:
                return

    def wait(self) -> None:
        """Until the client that connected has closed (or the listener was closed)."""
        self._thread.join()

    def close(self) -> None:
        self._listener.close()
        self._thread.join(self.timeout)

    def __enter__(self) -> "RecordedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_exactly(conn: socket.socket, n: int) -> Optional[bytes]:
    got = bytearray()
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            return None
        got += chunk
    return bytes(got)


def _skip(conn: socket.socket, n: int) -> bool:
    """Read and drop ``n`` bytes, holding at most :data:`_DISCARD` at once; False when the client
    closed first."""
    while n:
        chunk = conn.recv(min(n, _DISCARD))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def _read_one(conn: socket.socket) -> Optional[int]:
    """Read one whole message: its stream id, or None when the client closed first."""
    raw = _read_exactly(conn, m.HEADER_SIZE)
    if raw is None:
        return None
    _, sid, plen = m.unpack_header(raw)
    return sid if _skip(conn, plen) else None


def _drain(conn: socket.socket) -> None:
    """Read until the client closes (it may still send, or close on a fault it found)."""
    while conn.recv(1 << 16):
        pass
