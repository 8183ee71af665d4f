"""A connected socket as one direction in, one direction out, counted in bytes.

:class:`Wire` reads whole messages (or a data frame straight into its destination) and sends
messages, and data from a file by ``sendfile`` (no copy through user space on a plain socket;
a TLS socket falls back to reads and sends).  Offsets count the bytes of each direction from
the connection's start: the offsets every rule violation carries.  With a :class:`Recorder`,
both directions are also written to two message-stream files that ``audit`` reads.

Two clocks bound every wait:

* ``idle`` (the ``timeout`` given): how long one wait may see nothing move;
* a :class:`Deadline` (``Wire.deadline``, set by the owner): when a whole operation must be
  over -- a client's call, a server's handshake, one message -- whatever trickles in meanwhile.
  A deadline may grow with the bytes moved (a minimum rate), never with time alone.

What a peer declares commits no memory by itself: a payload's buffer grows as its bytes arrive
(:meth:`Wire.read`).  A served file that comes up short while a frame is on its way is padded to
the length its header declared, so the framing holds, and :class:`~hurray_schema.errors.ShortRead`
tells the sender to end the stream with an ERROR.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import threading
import time
from typing import Optional

from ..errors import SessionError, SessionTimeout, ShortRead
from ..rules import container as container_rules
from . import messages as m
from .shm import MAX_FDS, cut_short, read_range, receive_fds, send_with_fd

__all__ = ["Wire", "Recorder", "Closed", "Deadline", "plane_views", "GROW_STEP"]

_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * 4)
GROW_STEP = 64 * 1024
"""A payload up to this size is read into a buffer of its declared size; a longer one's buffer
starts at this size and at most doubles with what arrived (a declared length alone commits this
much)."""
_NO_TIMEOUT = struct.pack("ll", 0, 0)
_SLACK = 0.25
"""Seconds a wait may overrun its deadline rather than re-arm the socket's timeout on every call."""
_ZEROS = memoryview(bytes(1 << 20))
READ_AHEAD = 64 * 1024
"""A read shorter than this receives up to this many bytes at once, kept for the reads after it."""
LINGER_BYTES = 1 << 20
"""The most a lingering close (:meth:`Wire.close`) reads and drops of what the peer still sends."""


class Closed(SessionError):
    """The peer closed the connection at a message boundary (not inside a message)."""


class Deadline:
    """When an operation must be over: ``seconds`` after ``start`` (now by default), plus one
    second per ``rate`` bytes moved while it runs (``rate`` 0: no allowance for bytes).  ``what``
    names the operation in the :class:`SessionTimeout` raised once it passes."""

    __slots__ = ("start", "seconds", "rate", "moved", "what")

    def __init__(self, seconds: float, *, rate: float = 0, what: str = "the operation", start: Optional[float] = None):
        self.start = time.monotonic() if start is None else start
        self.seconds = seconds
        self.rate = rate
        self.moved = 0
        self.what = what

    def remaining(self, now: Optional[float] = None) -> float:
        """Seconds left (``now``: the monotonic clock's reading, if the caller has it)."""
        allowance = self.moved / self.rate if self.rate else 0.0
        return self.start + self.seconds + allowance - (time.monotonic() if now is None else now)

    def expired(self) -> SessionTimeout:
        pace = f" (at least {self.rate:.0f} bytes/s)" if self.rate else ""
        return SessionTimeout(f"{self.what} did not complete within {self.seconds:g} s{pace}")


class Recorder:
    """Both directions of one connection as two message-stream files (``*.client.msgs``:
    what the client sent; ``*.server.msgs``: what the server sent)."""

    def __init__(self, folder: str, name: str):
        os.makedirs(folder, exist_ok=True)
        self.client = open(os.path.join(folder, f"{name}.client.msgs"), "wb")
        self.server = open(os.path.join(folder, f"{name}.server.msgs"), "wb")

    def copy_range(self, out, fd: int, offset: int, n: int) -> None:
        """Append ``n`` bytes of file ``fd`` from ``offset`` to ``out`` (in kernel where it can)."""
        out.flush()
        while n:
            try:
                done = os.copy_file_range(fd, out.fileno(), n, offset)
            except OSError:
                done = out.write(os.pread(fd, min(n, 1 << 20), offset))
            if not done:
                break
            offset += done
            n -= done

    def close(self) -> None:
        self.client.close()
        self.server.close()


class Wire:
    """One connection's socket: what was received (``received``) and sent (``sent``) so far.

    ``timeout`` is the idle bound of each wait (None: none); :attr:`deadline` bounds the
    operation under way (both directions); with :attr:`pace`, each message read and each answer
    sent has a deadline of its own too.  ``incoming`` / ``outgoing`` name the recorded file each
    direction goes to ("client" or "server"), when a :class:`Recorder` is given."""

    def __init__(self, sock: socket.socket, *, timeout: Optional[float], recorder: Optional[Recorder] = None,
                 incoming: str = "server", outgoing: str = "client"):
        self.sock = sock
        self.received = 0
        self.sent = 0
        self.timeout = timeout
        self.deadline: Optional[Deadline] = None
        """The operation under way must be over by then (set and cleared by the owner)."""
        self.pace: Optional[tuple[float, float]] = None
        """``(seconds, rate)``: when set, a message must arrive whole by a :class:`Deadline` of these
        from its first byte (:attr:`reading`), and what is sent until :meth:`end_message` by one from
        the first byte sent (:attr:`writing`): the server's message deadlines."""
        self.reading: Optional[Deadline] = None
        self.writing: Optional[Deadline] = None
        self.send_cut = False
        """A send failed part way: what this side sends next would land inside a message."""
        self.plain = not hasattr(sock, "getpeercert")  # sendfile goes through the kernel only without TLS
        self._armed: Optional[float] = -1.0  # the timeout the socket has now (-1: not set yet)
        self._send_lock = threading.Lock()
        self._in = getattr(recorder, incoming) if recorder is not None else None
        self._out = getattr(recorder, outgoing) if recorder is not None else None
        self.recorder = recorder
        self.local = sock.family == socket.AF_UNIX
        """A Unix socket: descriptors may travel with the bytes (``SCM_RIGHTS``)."""
        self.message_at = 0
        """Offset of the message being read: descriptors arriving now belong to it."""
        self._ahead = None if self.local else memoryview(bytearray(READ_AHEAD))
        """Bytes received ahead of what was asked (``[_lo, _hi)`` unread).  Not over a Unix socket:
        there each receive stops at its message's end, so a descriptor is known by its message."""
        self._lo = self._hi = 0
        if self.plain:
            sock.settimeout(None)  # blocking: the kernel keeps the timeouts (:meth:`_arm`)
        self.fds: collections.deque = collections.deque()
        """``(message offset, fd)`` of descriptors received and not yet taken, oldest first."""
        self._writable = select.poll()
        self._writable.register(sock.fileno(), select.POLLOUT)
        self._arm(timeout)

    # --- clocks ---------------------------------------------------------------------------
    def end_message(self) -> None:
        """The exchange is over: the next message's deadlines start with its first byte."""
        self.reading = self.writing = None

    @property
    def between_messages(self) -> bool:
        """No deadline runs: a wait now is one for the peer's next message."""
        return self.deadline is None and self.reading is None and self.writing is None

    def _bound(self, paced: Optional[Deadline]) -> Optional[float]:
        """How long the next wait may block: the idle bound or what :attr:`deadline` and ``paced``
        (the direction's own) leave, the shortest; a deadline already past raises."""
        bound, deadline = self.timeout, self.deadline
        if deadline is None and paced is None:
            return bound
        now = time.monotonic()
        for one in (deadline, paced):
            if one is not None:
                left = one.remaining(now)
                if left <= 0:
                    raise one.expired()
                if bound is None or left < bound:
                    bound = left
        return bound

    def _arm(self, bound: Optional[float]) -> None:
        """Give the socket the timeout ``bound`` when the one it has could wait past the deadline
        (by more than :data:`_SLACK`) or is shorter than a slack's worth; a timeout shorter than
        needed only wakes the wait early (:meth:`_timed_out` then sends it back to wait), so a
        connection alternating between its idle bound and a message's deadline re-arms nothing.
        A plain socket keeps the timeout in the kernel (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``: a
        ``recv`` takes what has arrived, where Python's own timeout polls before every call; a
        timeout is then ``EAGAIN``); a TLS socket keeps Python's (its reads must tell a timeout from
        a partial record)."""
        armed = self._armed
        if bound is None:
            if armed is None:
                return
        elif armed is not None and armed >= 0 and bound + _SLACK >= armed and armed >= min(bound, _SLACK):
            return
        self._armed = bound
        if not self.plain:
            self.sock.settimeout(bound)
            return
        if bound is None:
            value = _NO_TIMEOUT
        else:
            bound = max(bound, 0.001)  # 0 would mean "no timeout" to the kernel
            value = struct.pack("ll", int(bound), int((bound - int(bound)) * 1_000_000))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)

    def _timed_out(self, since: Optional[float], writing: bool) -> float:
        """A wait timed out: raise when a deadline passed or the idle bound elapsed since ``since``
        (None: the wait began one socket timeout ago), else return ``since`` (the socket's timeout
        was shorter than either: wait again)."""
        now = time.monotonic()
        for deadline in (self.deadline, self.writing if writing else self.reading):
            if deadline is not None and deadline.remaining(now) <= 0:
                raise deadline.expired()
        if since is None:
            since = now - max(self._armed or 0.0, 0.0)
        if self.timeout is not None and now - since >= self.timeout - 0.001:
            raise SessionTimeout(f"the peer {'accepted' if writing else 'sent'} nothing for {self.timeout} s")
        return since

    def _moved(self, n: int, paced: Optional[Deadline]) -> None:
        if self.deadline is not None:
            self.deadline.moved += n
        if paced is not None:
            paced.moved += n

    def _paced(self, what: str) -> Deadline:
        """A message's or an answer's deadline, starting now (:attr:`pace`)."""
        return Deadline(self.pace[0], rate=self.pace[1], what=what)

    def _start_writing(self) -> Optional[Deadline]:
        """An answer's bytes are about to leave: its deadline (started with its first byte)."""
        if self.pace is not None and self.writing is None:
            self.writing = self._paced("an answer")
        return self.writing

    # --- receiving ----------------------------------------------------------------------
    def _recv_into(self, view: memoryview) -> int:
        since = None
        while True:
            bound = self._bound(self.reading)
            if bound != self._armed:
                self._arm(bound)
            try:
                n = self._recv_with_fds(view) if self.local else self.sock.recv_into(view)
            except (socket.timeout, BlockingIOError):
                since = self._timed_out(since, False)
                continue
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise SessionError(f"the connection was reset: {exc}") from None
            except OSError as exc:
                raise SessionError(f"the connection failed: {exc}") from None
            self._moved(n, self.reading)
            return n

    def _recv_with_fds(self, view: memoryview) -> int:
        """``recv_into`` that also keeps the descriptors passed with the bytes (a plain receive
        would drop them), each marked with the message being read; past :data:`~.shm.MAX_FDS`
        pending ones, the extra are closed."""
        n, ancillary, _flags, _ = self.sock.recvmsg_into([view], _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        for fd in receive_fds(ancillary):
            if len(self.fds) < MAX_FDS:
                self.fds.append((self.message_at, fd))
            else:
                os.close(fd)
        return n

    def take_fd(self, at: int) -> Optional[int]:
        """The descriptor that came with the message at ``at`` (the caller closes it), or None;
        any that came with an earlier message is a stray and is closed."""
        self.drop_fds(before=at)
        if self.fds and self.fds[0][0] == at:
            return self.fds.popleft()[1]
        return None

    def drop_fds(self, before: Optional[int] = None) -> None:
        """Close the descriptors received and not taken (those of messages before ``before``)."""
        while self.fds and (before is None or self.fds[0][0] < before):
            os.close(self.fds.popleft()[1])

    def _take(self, dest: memoryview) -> int:
        """Bytes into ``dest`` (0: the peer closed): what was read ahead first; a short read
        receives up to :data:`READ_AHEAD` bytes ahead (several small messages in one ``recv``),
        a long one straight into ``dest`` (a frame's data lands where it goes, not copied)."""
        ahead = self._ahead
        if ahead is not None:
            if self._lo == self._hi and len(dest) < READ_AHEAD:
                self._lo, self._hi = 0, self._recv_into(ahead)
            if self._lo < self._hi:
                k = min(len(dest), self._hi - self._lo)
                dest[:k] = ahead[self._lo : self._lo + k]
                self._lo += k
                return k
        return self._recv_into(dest)

    def read_into(self, view: memoryview, *, at_boundary: bool = False) -> None:
        """Fill ``view`` from the socket; the connection ending first is
        ``stream.message.truncated`` (or :class:`Closed` when not one byte of a message arrived
        and ``at_boundary``)."""
        got, n = 0, len(view)
        try:
            while got < n:
                k = self._take(view[got:])
                if not k:
                    if at_boundary and got == 0:
                        raise Closed("the peer closed the connection")
                    raise container_rules.MESSAGE_TRUNCATED.violation(
                        f"the connection ends {got} bytes into {n} expected bytes", self.received + got)
                if at_boundary and got == 0 and self.pace is not None and self.reading is None:
                    self.reading = self._paced("a message")
                    self.reading.moved = k
                got += k
        finally:  # what arrived counts and is recorded, a message cut short too: audit finds where it ends
            if self._in is not None and got:
                self._in.write(view[:got])
            self.received += got

    def read(self, n: int, *, at_boundary: bool = False) -> bytearray:
        """``n`` bytes.  Past :data:`GROW_STEP`, the buffer grows with what arrives (at most
        doubling), so a length declared and never sent commits little memory."""
        if n <= GROW_STEP:
            buf = bytearray(n)
            if n:
                self.read_into(memoryview(buf), at_boundary=at_boundary)
            return buf
        buf = bytearray()
        while len(buf) < n:
            start = len(buf)
            buf.extend(bytes(min(n - start, max(GROW_STEP, start))))
            with memoryview(buf) as view:
                self.read_into(view[start:], at_boundary=at_boundary and not start)
        return buf

    def read_header(self) -> tuple[int, bytes]:
        """The next message header: ``(offset, raw 12 bytes)``; :class:`Closed` at a clean end."""
        at = self.message_at = self.received
        return at, bytes(self.read(m.HEADER_SIZE, at_boundary=True))

    def discard(self, n: int) -> None:
        """Read and drop ``n`` bytes (a payload this side does not keep)."""
        chunk = memoryview(bytearray(min(n, 1 << 20) or 1))
        while n:
            k = min(n, len(chunk))
            self.read_into(chunk[:k])
            n -= k

    # --- sending ------------------------------------------------------------------------
    def _sendall(self, data, fd: Optional[int] = None) -> None:
        """``data`` (with ``fd`` passed beside it, on a Unix socket), counted and recorded; every
        wait bounded by the idle timeout and the deadline."""
        view = data if type(data) is bytes else memoryview(data).cast("B")
        total = len(view)
        self.send_cut = True
        try:
            if self.plain:
                self._send_plain(view, fd)
            else:  # TLS: Python's sendall bounds the whole call by the timeout; a partial send cannot resume
                paced = self._start_writing()
                self._arm(self._bound(paced))
                try:
                    self.sock.sendall(view)
                except (socket.timeout, BlockingIOError):  # one call: it cannot resume, whichever clock ran out
                    self._timed_out(float("-inf"), True)
                    raise SessionTimeout("the peer did not take a whole message in time") from None
                self._moved(total, paced)
        except SessionError:  # a deadline that passed (an OSError too): as it is
            raise
        except OSError as exc:
            raise SessionError(f"the connection failed: {exc}") from None
        self.send_cut = False
        if self._out is not None:
            self._out.write(view)
        self.sent += total

    def _send_plain(self, view: memoryview, fd: Optional[int]) -> None:
        """A plain socket's send: a short message by blocking sends (each bounded by the socket's
        send timeout), a long one by :meth:`_drive` (bounded by the deadlines as a whole)."""
        if len(view) > GROW_STEP:
            sock, view = self.sock, memoryview(view)

            def attempt(done: int) -> int:
                return send_with_fd(sock, view, fd) if fd is not None and not done else sock.send(view[done:])

            self._drive(attempt, len(view))
            return
        paced, since = self._start_writing(), None
        while view:
            bound = self._bound(paced)
            if bound != self._armed:
                self._arm(bound)
            try:
                if fd is not None:
                    sent, fd = send_with_fd(self.sock, view, fd), None
                else:
                    sent = self.sock.send(view)
            except (socket.timeout, BlockingIOError):
                since = self._timed_out(since, True)
                continue
            if sent:
                since = None
                self._moved(sent, paced)
            view = memoryview(view)[sent:] if sent < len(view) else b""

    def _drive(self, attempt, n: int) -> int:
        """Call ``attempt(done)`` (one send from byte ``done`` on; 0: the source ended) until ``n``
        bytes went, the socket non-blocking meanwhile: a blocking ``sendfile``, or a Unix socket's
        blocking send, gives each batch its own send timeout, so a peer taking a few KiB at a time
        could hold one call for ever.  Here every wait for room is bounded by the deadlines and
        the idle timeout.  Returns the bytes sent."""
        out = self.sock.fileno()
        done = 0
        since = time.monotonic()
        paced = self._start_writing()
        os.set_blocking(out, False)
        try:
            while done < n:
                bound = self._bound(paced)  # a peer that takes a little at a time still meets its deadline
                try:
                    sent = attempt(done)
                except BlockingIOError:
                    if not self._writable.poll(None if bound is None else max(1, int(bound * 1000))):
                        since = self._timed_out(since, True)
                    continue
                if not sent:
                    break
                since = time.monotonic()
                self._moved(sent, paced)
                done += sent
        finally:
            os.set_blocking(out, True)
        return done

    def send_with_fd(self, message_type: int, stream_id: int, payload: bytes, fd: int) -> None:
        """One message with ``fd`` passed beside it (Unix sockets only)."""
        with self._send_lock:
            self._sendall(m.message(message_type, stream_id, payload), fd)

    def send(self, message_type: int, stream_id: int, payload: bytes = b"") -> None:
        with self._send_lock:
            self._sendall(m.message(message_type, stream_id, payload))

    def send_together(self, parts: list) -> None:
        """Several whole messages (bytes-like parts, or ``(fd, offset, length)`` file ranges read
        here) in one write: a small response leaves in one segment, not four.  A file range that
        comes up short raises :class:`ShortRead` before anything is sent."""
        data = b"".join(read_range(*p) if isinstance(p, tuple) else bytes(p) for p in parts)
        with self._send_lock:
            self._sendall(data)

    def send_frame(self, stream_id: int, offset_in_buffer: int, pieces) -> None:
        """One TENSOR_DATA message whose data is ``pieces``: memory (bytes-like) or
        ``(fd, file offset, length)`` ranges sent from the file.  A file that ends before its
        range does is :class:`ShortRead`, raised once the frame went out whole, padded with zeros
        to the length its header declared (the stream must then end with an ERROR)."""
        n = sum(len(p) if not isinstance(p, tuple) else p[2] for p in pieces)
        with self._send_lock:
            self._sendall(m.data_header(stream_id, offset_in_buffer, n))
            cut = None
            for piece in pieces:
                if cut is not None:
                    self._pad(piece[2] if isinstance(piece, tuple) else len(piece))
                elif isinstance(piece, tuple):
                    cut = self._sendfile(*piece)
                else:
                    self._sendall(piece)
            if cut is not None:
                raise cut

    def _pad(self, n: int) -> None:
        while n:
            k = min(n, len(_ZEROS))
            self._sendall(_ZEROS[:k])
            n -= k

    def _sendfile(self, fd: int, offset: int, n: int) -> Optional[ShortRead]:
        """``n`` bytes of file ``fd`` from ``offset``; when the file ends first, the rest is
        sent as zeros and the :class:`ShortRead` is returned (for the caller to raise once the
        frame is whole)."""
        sent = self._kernel_sendfile(fd, offset, n) if self.plain else self._send_read(fd, offset, n)
        if sent == n:
            return None
        self._pad(n - sent)
        return cut_short(sent, n, offset)

    def _send_read(self, fd: int, offset: int, n: int) -> int:
        """A file range through user space (TLS: the bytes must pass through the encryption);
        returns the bytes sent (fewer when the file ends first)."""
        sent = 0
        while sent < n:
            chunk = os.pread(fd, min(n - sent, 4 << 20), offset + sent)
            if not chunk:
                break
            self._sendall(chunk)
            sent += len(chunk)
        return sent

    def _kernel_sendfile(self, fd: int, offset: int, n: int) -> int:
        """``os.sendfile`` until ``n`` bytes went or the file ended (:meth:`_drive`); returns the bytes
        sent, counted and recorded."""
        out = self.sock.fileno()
        self.send_cut = True  # until the range went whole (or the file ended and the caller pads)
        try:
            done = self._drive(lambda done: os.sendfile(out, fd, offset + done, min(n - done, 1 << 30)), n)
        except SessionError:
            raise
        except OSError as exc:
            raise SessionError(f"the connection failed: {exc}") from None
        if self._out is not None and done:
            self.recorder.copy_range(self._out, fd, offset, done)
        self.sent += done
        self.send_cut = done < n
        return done

    def close(self, *, linger: float = 0.0) -> None:
        """End the connection.  With ``linger`` (seconds), gracefully: our side first (what was sent
        is followed by the end of the stream), then what the peer still sends is read and dropped
        until it closes too, for at most ``linger`` seconds and :data:`LINGER_BYTES` -- closing with
        unread bytes would reset the connection and lose the end of what we sent (an ERROR)."""
        self.drop_fds()
        if self.recorder is not None:
            self.recorder.close()
        try:
            if linger:
                self._linger(linger)
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _linger(self, seconds: float) -> None:
        self.sock.shutdown(socket.SHUT_WR)
        end, left = time.monotonic() + seconds, LINGER_BYTES
        sink = bytearray(min(LINGER_BYTES, 1 << 16))
        while left > 0:
            wait = end - time.monotonic()
            if wait <= 0:
                return
            self.sock.settimeout(wait)
            n = self.sock.recv_into(sink)
            if not n:
                return
            left -= n


def plane_views(buffers: list, start: int, n: int):
    """Views of ``buffers`` (concatenated: a tensor's data plane, ``interchange.md § TENSOR_DATA
    Payload``) covering ``[start, start + n)``: where a frame's bytes go."""
    pos = 0
    for buf in buffers:
        size = len(buf)
        lo, hi = max(start, pos), min(start + n, pos + size)
        if lo < hi:
            yield memoryview(buf)[lo - pos : hi - pos]
        pos += size
