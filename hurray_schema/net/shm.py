"""Shared memory between processes on one machine (``interchange.md § IPC``: the buffer in a
shared segment, the descriptor over a Unix socket).

A *segment* is a file descriptor whose bytes hold buffers: a served ``.hrry`` file (opened
read-only), or a sealed ``memfd`` (a tensor the server holds in memory, or one a client pushes).
It travels beside a message as ``SCM_RIGHTS`` ancillary data; the receiver maps the range it
needs read-only and closes the descriptor.  The kernel keeps the bytes while any mapping or
descriptor holds them (``ADR-009``: each holder releases once, by dropping it): replacing or
deleting a served file leaves a client's mapping as it was, and a process that dies releases
what it held.  A memfd is sealed before it is shared (no write, grow or shrink: ``F_SEAL_*``),
so no holder can change the bytes another validated.
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import weakref
from typing import Iterable

from ..errors import HurraySchemaError, ShortRead
from ..rules import session as rules

__all__ = ["Segment", "sealed_memfd", "check_sealed", "is_sealed", "cut_short", "read_range",
           "read_ranges", "read_ranges_into", "sealed_copy", "Mappings", "send_with_fd", "receive_fds", "MAX_FDS",
           "SEALS", "ALIGNMENT", "SHARED_CHUNK_BYTES"]

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
"""What a shared memfd is sealed against (``F_SEAL_SEAL`` too, so nobody can unseal it)."""
ALIGNMENT = 64
"""Where each buffer starts inside a segment this side writes."""
MAX_FDS = 4
"""Most descriptors one receive takes from the socket; more is a hostile peer's (closed)."""
SHARED_CHUNK_BYTES = 64 << 20
"""A served file is copied for shared-memory clients by aligned chunks of this size: the tensors
inside one chunk share its copy (a client maps it once, whatever it takes from it); a tensor that
crosses a chunk's end is copied on its own."""


class Segment:
    """A sealed memfd and its read-only mapping: bytes every client maps without a copy."""

    __slots__ = ("fd", "size", "map", "__weakref__")

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None

    def view(self, offset: int, size: int) -> memoryview:
        if not size:
            return memoryview(b"")
        return memoryview(self.map)[offset : offset + size]

    def close(self) -> None:
        """Drop this process's descriptor (the mapping goes with the last view of it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def layout(sizes: Iterable[int]) -> tuple[list[int], int]:
    """Offsets of buffers of ``sizes`` laid out one after another, each on :data:`ALIGNMENT`, and
    the total size."""
    offsets, pos = [], 0
    for size in sizes:
        offsets.append(pos)
        pos = _aligned(pos + size)
    return offsets, pos


def sealed_memfd(buffers: Iterable, name: str = "hurray") -> tuple[int, list[int], int]:
    """A new sealed memfd holding ``buffers`` (one copy of each, laid out by :func:`layout`): its
    descriptor, each buffer's offset in it, its size.  Nothing of it is mapped here."""
    buffers = [memoryview(b).cast("B") if len(b) else memoryview(b"") for b in buffers]
    offsets, total = layout(len(b) for b in buffers)
    fd = _new_memfd(total, name)
    try:
        for offset, buf in zip(offsets, buffers):
            _write_all(fd, buf, offset)
        _seal(fd)
        return fd, offsets, total
    except BaseException:
        os.close(fd)
        raise


def _new_memfd(size: int, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _seal(fd: int) -> None:
    """No write, grow or shrink from now on, and no unsealing."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS | fcntl.F_SEAL_SEAL)


def _write_all(fd: int, buf: memoryview, offset: int) -> None:
    while len(buf):
        n = os.pwrite(fd, buf[: 1 << 30], offset)
        buf, offset = buf[n:], offset + n


def is_sealed(fd: int) -> bool:
    """``fd`` is a memory file sealed against writing, growing and shrinking: mapped, it cannot
    change or end under the mapping (a regular file, or an unsealed memfd, can: SIGBUS)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
    except OSError:
        return False


def check_sealed(fd: int, sizes: Iterable[int], at: int) -> int:
    """The size of the memfd ``fd`` a client pushed for buffers of ``sizes``: sealed against
    writing, growing and shrinking, and as large as the buffers laid out need (:func:`layout`):
    no smaller, and no larger than their 64-byte rounding (``session.shm.sealed``)."""
    sizes = list(sizes)
    offsets, total = layout(sizes)
    needed = offsets[-1] + sizes[-1] if sizes else 0
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        size = os.fstat(fd).st_size
    except OSError:
        raise rules.SHM_SEALED.violation("the descriptor passed is not a sealable memory file", at) from None
    if seals & SEALS != SEALS:
        raise rules.SHM_SEALED.violation(f"the memory file's seals are 0x{seals:X}: write, grow and shrink must be "
                                         "sealed", at)
    if not needed <= size <= total:
        raise rules.SHM_SEALED.violation(
            f"the memory file holds {size} bytes; its buffers laid out need {needed} (at most {total})", at)
    return size


def cut_short(got: int, n: int, offset: int) -> ShortRead:
    """The error of a file that ends ``got`` bytes into the ``n``-byte range at ``offset``."""
    return ShortRead(f"the file ends {got} bytes into a {n}-byte range at byte {offset}")


def read_range(fd: int, offset: int, n: int) -> bytearray:
    """``n`` bytes of file ``fd`` from ``offset``, read by ``pread`` (:func:`cut_short` when it ends first)."""
    buf = bytearray(n)
    _read_into(fd, memoryview(buf), offset)
    return buf


def read_ranges(fd: int, ranges) -> list:
    """The bytes of each ``(offset, size)`` of file ``fd``, read by ``pread`` into new memory of this
    process (never mapped); a file that ends first is :class:`~hurray_schema.errors.ShortRead`."""
    import numpy as np

    views = [memoryview(np.empty(size, np.uint8)) for _, size in ranges]
    read_ranges_into(fd, ranges, views)
    return views


def read_ranges_into(fd: int, ranges, views) -> None:
    """Each ``(offset, size)`` of file ``fd`` read by ``pread`` into the matching writable view."""
    for (offset, _), view in zip(ranges, views):
        _read_into(fd, memoryview(view).cast("B"), offset)


def _read_into(fd: int, view: memoryview, offset: int) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise cut_short(got, len(view), offset)
        got += n


def sealed_copy(fd: int, ranges, offsets, total: int) -> int:
    """A new sealed memfd of ``total`` bytes holding each ``(offset, size)`` range of file ``fd``
    at the matching ``offsets``, copied in the kernel (``sendfile``; a file that ends first is
    :class:`~hurray_schema.errors.ShortRead`); returns its descriptor."""
    copy = _new_memfd(total, "hurray-copy")
    try:
        for (offset, size), at in zip(ranges, offsets):
            os.lseek(copy, at, os.SEEK_SET)
            done = 0
            while done < size:
                n = os.sendfile(copy, fd, offset + done, size - done)
                if not n:
                    raise cut_short(done, size, offset)
                done += n
        _seal(copy)
        return copy
    except BaseException:
        os.close(copy)
        raise


class Mappings:
    """The files a client has mapped, one read-only mapping per file (by device, inode and size),
    held weakly: each buffer is a view of its file's mapping, so a client holding the buffers of
    10,000 tensors of one file holds one mapping (and one descriptor), not 10,000."""

    def __init__(self):
        self._maps: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def view(self, fd: int, offset: int, size: int, at: int) -> memoryview:
        """``size`` bytes at ``offset`` of the segment ``fd`` (which the caller closes); a range
        outside the file is ``session.shm.segments``."""
        st = os.fstat(fd)
        if offset < 0 or size < 0 or offset + size > st.st_size:
            raise rules.SHM_SEGMENTS.violation(
                f"a segment [{offset}, {offset + size}) outside the {st.st_size}-byte file passed", at)
        if not size:
            return memoryview(b"")
        key = (st.st_dev, st.st_ino, st.st_size)
        mapped = self._maps.get(key)
        if mapped is None:
            try:
                mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise HurraySchemaError(f"the segment passed cannot be mapped: {exc}") from None
            self._maps[key] = mapped
        return memoryview(mapped)[offset : offset + size]


def send_with_fd(sock: socket.socket, data, fd: int) -> int:
    """Send ``data`` with ``fd`` as ``SCM_RIGHTS`` (the descriptor arrives with ``data``'s first
    byte); returns the bytes sent, which may be fewer than ``data`` (the caller sends the rest)."""
    return sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def receive_fds(ancillary) -> list[int]:
    """The descriptors of a ``recvmsg`` control buffer (a truncated one's whole ones)."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(array.array("i", data[:usable]))
    return fds
