"""Cache folders that only this user can write, for caches whose files run as code in this process.

The generated-code cache (:mod:`hurray_schema.codecache`: marshaled code objects) and the kernel
cache (:mod:`hurray_schema.evaluate.jit`: machine code, shared libraries) both load what they find
as code, so a file there must be one that nobody but this user could have written:

* **folders** -- :func:`open_private` walks from a cache root down a chain of folder names, each
  made ``0700`` where missing, and keeps a descriptor of the last only when every folder below the
  root is a folder (not a link) this user owns that neither its group nor others can write.  The
  root itself may be shared (a world-writable ``NUMBA_CACHE_DIR``): trust starts in the first folder
  of ours inside it.  The chain is walked through directory descriptors, so a folder renamed or
  swapped afterwards is not followed; :func:`still_private` checks the kept descriptor again (call
  it before every load);
* **files** -- :func:`read_private` opens a name inside a kept folder without following links and
  reads it only when it is a regular file of this user's that nobody else can write;
  :func:`write_private` writes a ``0600`` temporary file there and renames it over the name;
* **old versions** -- when :func:`open_private` makes the last folder of the chain, the other
  folders beside it (earlier versions of the same cache, flat folders of our files) are removed.

Where the chain cannot be trusted, :func:`open_private` warns once (naming the cache and the folder)
and returns None: the caller then neither loads nor writes, and compiles in memory.  A root that
cannot be made or opened (a read-only home), or a system without POSIX folder descriptors, gives
None without a warning: nothing unsafe happened.
"""

from __future__ import annotations

import os
import stat
import warnings
from typing import Optional

__all__ = ["SUPPORTED", "open_private", "still_private", "open_private_file", "read_private", "write_private",
           "remove_files", "user_cache_root"]

_NO_LINK = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NO_LINK

SUPPORTED = (hasattr(os, "getuid") and hasattr(os, "O_DIRECTORY") and hasattr(os, "O_NOFOLLOW")
             and {os.open, os.mkdir, os.unlink, os.rename, os.rmdir} <= os.supports_dir_fd)
"""Folders checked through descriptors need POSIX (owner ids, ``O_NOFOLLOW``, ``*at`` calls);
elsewhere :func:`open_private` returns None."""


def user_cache_root() -> str:
    """``$XDG_CACHE_HOME/hurray_schema``, else ``~/.cache/hurray_schema``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hurray_schema")


def open_private(root: str, *names: str, what: str) -> Optional[int]:
    """A descriptor of the folder ``root/names[0]/names[1]/...`` (module docstring), or None.
    ``what`` names the cache in the warning."""
    if not SUPPORTED:
        return None
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        fd = os.open(root, _OPEN_DIR)
    except OSError:
        return None
    shared = not _private(os.fstat(fd), stat.S_ISDIR)
    path = root
    for depth, name in enumerate(names):
        path = os.path.join(path, name)
        last = depth == len(names) - 1
        try:
            made = _make_folder(fd, name)
            below = _subfolder(fd, name)
            if below is not None and made and last:
                _prune(fd, keep=name)
        finally:
            os.close(fd)
        if below is None:
            warnings.warn(f"hurray_schema: {what} is not cached: {path} is not a folder of this user's that only "
                          f"it can write{' (the cache root is shared)' if shared and depth == 0 else ''}; "
                          "it is compiled in memory", RuntimeWarning, stacklevel=3)
            return None
        fd = below
    return fd


def still_private(fd: int) -> bool:
    """Whether the folder ``fd`` is still this user's alone (its owner or mode may have changed)."""
    return _private(os.fstat(fd), stat.S_ISDIR)


def open_private_file(folder: int, name: str) -> Optional[int]:
    """A descriptor (to close) of file ``name`` in ``folder`` when it is a regular file of this user's
    that nobody else can write, opened without following a link; None otherwise."""
    try:
        fd = os.open(name, os.O_RDONLY | _NO_LINK, dir_fd=folder)
    except OSError:
        return None
    try:
        if _private(os.fstat(fd), stat.S_ISREG):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_private(folder: int, name: str) -> Optional[bytes]:
    """The bytes of file ``name`` in ``folder`` when :func:`open_private_file` takes it; else None."""
    fd = open_private_file(folder, name)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def write_private(folder: int, name: str, data: bytes) -> bool:
    """Write ``data`` as file ``name`` in ``folder``: a ``0600`` temporary file renamed over the name
    (a reader never sees half a file); False on any error (a cache is an optimisation)."""
    temporary = f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINK, 0o600, dir_fd=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)  # over any older file, atomically (POSIX)
        return True
    except OSError:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        return False


def remove_files(folder: int, names: list) -> None:
    """Remove the files ``names`` of ``folder`` (those that can be)."""
    for name in names:
        try:
            os.unlink(name, dir_fd=folder)
        except OSError:
            pass


def _make_folder(parent: int, name: str) -> bool:
    """Make folder ``name`` in ``parent`` (0700); whether it was made now."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except OSError:
        return False
    return True


def _subfolder(parent: int, name: str) -> Optional[int]:
    """A descriptor of folder ``name`` in ``parent`` when it is this user's alone, else None."""
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
    except OSError:
        return None
    if _private(os.fstat(fd), stat.S_ISDIR):
        return fd
    os.close(fd)
    return None


def _private(status: os.stat_result, kind) -> bool:
    """Of ``kind`` (``stat.S_ISDIR`` / ``S_ISREG``), owned by this user, writable by nobody else."""
    return (kind(status.st_mode) and status.st_uid == os.getuid()
            and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _prune(parent: int, keep: str) -> None:
    """Remove the other folders of ours (flat folders of our files) beside ``keep``."""
    for name in os.listdir(parent):
        if name == keep:
            continue
        try:
            old = os.open(name, _OPEN_DIR, dir_fd=parent)
        except OSError:
            continue
        try:
            if not _private(os.fstat(old), stat.S_ISDIR):
                continue
            remove_files(old, os.listdir(old))
        except OSError:
            continue
        finally:
            os.close(old)
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError:
            pass
