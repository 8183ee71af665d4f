"""A connected socket as one direction in, one direction out, counted in bytes.

:class:`Wire` reads whole messages (or a data frame straight into its destination) and sends
messages, and data from a file by ``sendfile`` (no copy through user space on a plain socket;
a TLS socket falls back to reads and sends).  Offsets count the bytes of each direction from
the connection's start: the offsets every rule violation carries.  With a :class:`Recorder`,
both directions are also written to two message-stream files that ``audit`` reads.
"""

from __future__ import annotations

import collections
import os
import socket
import struct
import threading
from typing import Optional

from ..errors import SessionError, SessionTimeout
from ..rules import container as container_rules
from . import messages as m
from .shm import MAX_FDS, receive_fds, send_with_fd

_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * 4)


def _set_timeouts(sock: socket.socket, timeout: Optional[float], *, in_kernel: bool) -> None:
    """``timeout`` on every send and receive.  A plain socket stays blocking and the kernel keeps
    the timeout (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``): a whole frame is one ``sendfile`` call and a
    ``recv`` takes what has arrived, where Python's own timeout polls before every call; a
    timeout is then ``EAGAIN``.  A TLS
    socket keeps Python's timeout (its reads must be told a timeout from a partial record)."""
    if not in_kernel or timeout is None:
        sock.settimeout(timeout)
        return
    sock.settimeout(None)
    seconds = int(timeout)
    value = struct.pack("ll", seconds, int((timeout - seconds) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)

__all__ = ["Wire", "Recorder", "Closed", "plane_views"]


class Closed(SessionError):
    """The peer closed the connection at a message boundary (not inside a message)."""


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

    ``incoming`` / ``outgoing`` name the recorded file each direction goes to ("client" or
    "server"), when a :class:`Recorder` is given."""

    def __init__(self, sock: socket.socket, *, timeout: Optional[float], recorder: Optional[Recorder] = None,
                 incoming: str = "server", outgoing: str = "client"):
        self.sock = sock
        self.received = 0
        self.sent = 0
        self.timeout = timeout
        self.plain = not hasattr(sock, "getpeercert")  # sendfile goes through the kernel only without TLS
        _set_timeouts(sock, timeout, in_kernel=self.plain)
        self._send_lock = threading.Lock()
        self._in = getattr(recorder, incoming) if recorder is not None else None
        self._out = getattr(recorder, outgoing) if recorder is not None else None
        self.recorder = recorder
        self.local = sock.family == socket.AF_UNIX
        """A Unix socket: descriptors may travel with the bytes (``SCM_RIGHTS``)."""
        self.fds: collections.deque = collections.deque()
        """Descriptors received and not yet taken (:meth:`take_fd`), oldest first."""

    # --- receiving ----------------------------------------------------------------------
    def _recv_into(self, view: memoryview) -> int:
        try:
            if self.local:
                return self._recv_with_fds(view)
            return self.sock.recv_into(view)
        except (socket.timeout, BlockingIOError):
            raise SessionTimeout(f"the peer sent nothing for {self.timeout} s") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise SessionError(f"the connection was reset: {exc}") from None
        except OSError as exc:
            raise SessionError(f"the connection failed: {exc}") from None

    def _recv_with_fds(self, view: memoryview) -> int:
        """``recv_into`` that also keeps the descriptors passed with the bytes (a plain receive
        would drop them); past :data:`~.shm.MAX_FDS` pending ones, the extra are closed."""
        n, ancillary, _flags, _ = self.sock.recvmsg_into([view], _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        for fd in receive_fds(ancillary):
            if len(self.fds) < MAX_FDS:
                self.fds.append(fd)
            else:
                os.close(fd)
        return n

    def take_fd(self) -> Optional[int]:
        """The oldest descriptor received and not yet taken (the caller closes it), or None."""
        return self.fds.popleft() if self.fds else None

    def drop_fds(self) -> None:
        """Close every descriptor received and not taken."""
        while self.fds:
            os.close(self.fds.popleft())

    def read_into(self, view: memoryview, *, at_boundary: bool = False) -> None:
        """Fill ``view`` from the socket; the connection ending first is
        ``stream.message.truncated`` (or :class:`Closed` when not one byte of a message arrived
        and ``at_boundary``)."""
        got, n = 0, len(view)
        try:
            while got < n:
                k = self._recv_into(view[got:])
                if not k:
                    if at_boundary and got == 0:
                        raise Closed("the peer closed the connection")
                    raise container_rules.MESSAGE_TRUNCATED.violation(
                        f"the connection ends {got} bytes into {n} expected bytes", self.received + got)
                got += k
        finally:  # what arrived counts and is recorded, a message cut short too: audit finds where it ends
            if self._in is not None and got:
                self._in.write(view[:got])
            self.received += got

    def read(self, n: int, *, at_boundary: bool = False) -> bytearray:
        buf = bytearray(n)
        if n:
            self.read_into(memoryview(buf), at_boundary=at_boundary)
        return buf

    def read_header(self) -> tuple[int, bytes]:
        """The next message header: ``(offset, raw 12 bytes)``; :class:`Closed` at a clean end."""
        at = self.received
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
        """``data`` (with ``fd`` passed beside it, on a Unix socket), counted and recorded."""
        try:
            if fd is None:
                self.sock.sendall(data)
            else:
                send_with_fd(self.sock, data, fd)
        except (socket.timeout, BlockingIOError):
            raise SessionTimeout(f"the peer accepted nothing for {self.timeout} s") from None
        except OSError as exc:
            raise SessionError(f"the connection failed: {exc}") from None
        if self._out is not None:
            self._out.write(data)
        self.sent += len(data)

    def send_with_fd(self, message_type: int, stream_id: int, payload: bytes, fd: int) -> None:
        """One message with ``fd`` passed beside it (Unix sockets only)."""
        with self._send_lock:
            self._sendall(m.message(message_type, stream_id, payload), fd)

    def send(self, message_type: int, stream_id: int, payload: bytes = b"") -> None:
        with self._send_lock:
            self._sendall(m.message(message_type, stream_id, payload))

    def send_together(self, parts: list) -> None:
        """Several whole messages (bytes-like parts, or ``(fd, offset, length)`` file ranges read
        here) in one write: a small response leaves in one segment, not four."""
        data = b"".join(os.pread(p[0], p[2], p[1]) if isinstance(p, tuple) else bytes(p) for p in parts)
        with self._send_lock:
            self._sendall(data)

    def send_frame(self, stream_id: int, offset_in_buffer: int, pieces) -> None:
        """One TENSOR_DATA message whose data is ``pieces``: memory (bytes-like) or
        ``(fd, file offset, length)`` ranges sent from the file."""
        n = sum(len(p) if not isinstance(p, tuple) else p[2] for p in pieces)
        with self._send_lock:
            self._sendall(m.data_header(stream_id, offset_in_buffer, n))
            for piece in pieces:
                if isinstance(piece, tuple):
                    self._sendfile(*piece)
                else:
                    self._sendall(piece)

    def _sendfile(self, fd: int, offset: int, n: int) -> None:
        if self.plain:
            self._kernel_sendfile(fd, offset, n)
        else:  # TLS: the bytes must pass through the encryption
            end = offset + n
            while offset < end:
                chunk = os.pread(fd, min(end - offset, 4 << 20), offset)
                if not chunk:
                    raise SessionError("the served file ended early")
                self._sendall(chunk)
                offset += len(chunk)
            return
        if self._out is not None:
            self.recorder.copy_range(self._out, fd, offset, n)
        self.sent += n

    def _kernel_sendfile(self, fd: int, offset: int, n: int) -> None:
        """``os.sendfile`` until ``n`` bytes went: the socket is blocking, so the kernel sends as
        the peer takes; ``EAGAIN`` is the send timeout expiring with nothing taken."""
        out = self.sock.fileno()
        end = offset + n
        while offset < end:
            try:
                sent = os.sendfile(out, fd, offset, min(end - offset, 1 << 30))
            except BlockingIOError:
                raise SessionTimeout(f"the peer accepted nothing for {self.timeout} s") from None
            except OSError as exc:
                raise SessionError(f"the connection failed: {exc}") from None
            if not sent:
                raise SessionError("the served file ended early")
            offset += sent

    def close(self) -> None:
        self.drop_fds()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self.recorder is not None:
            self.recorder.close()


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
