"""Generated Python code kept between processes, loaded only from a folder this user alone can write.

The fast paths generate small functions from the declarations: a decoder and a checked decoder
per descriptor header, an encoder per descriptor shape, the constructors of the value objects
(:mod:`hurray_schema.signature`), the plain-buffer test of the rules
(:mod:`hurray_schema.rules.descriptor.dispatch`).  Compiling one costs about a third of a
millisecond, every process again.  :func:`compiled` compiles a source once per machine instead:
the code object is marshaled into the user's cache folder, and a later process that generates the
same source loads it back.

**Where.** ``$HURRAY_SCHEMA_CACHE_DIR``, else ``$XDG_CACHE_HOME/hurray_schema``, else
``~/.cache/hurray_schema``; in it ``code/<interpreter>-<bytecode magic>-<marshal version>/``, one
file per source, named by the SHA-256 of the source and its file name (so a file is only ever
loaded for the very source it was compiled from, whatever version of this package wrote it).
When a version folder is made, the other version folders beside it are removed.  ``HURRAY_SCHEMA_CODE_CACHE=0`` turns the
cache off (everything is compiled in memory).

**Trust.** A code object loaded from disk runs in this process, so it is loaded only from a folder
this user owns and nobody else can write (neither group- nor world-writable), and only from a file
that is the same.  Every folder from the cache root down counts, except that a root shared with
others (a world-writable ``NUMBA_CACHE_DIR``-style folder) may hold a private ``code`` folder of
ours: trust then starts there.  The folders we make are ``0700``, the files ``0600``.  The chain is
checked once per process through directory descriptors (so a folder swapped afterwards is not
followed) and the version folder again before every load; files are opened without following
links.  Where the check fails nothing is loaded or written, one warning says why, and the code is
compiled in memory; a cache root that cannot be made or opened (a read-only home) or a system
without POSIX folder descriptors just turns the cache off.  A file that does not read back as a code object for its key is ignored and
replaced.  A version folder holds at most :data:`MAX_FILES` files: a process that finds it full
empties it first (the sources of earlier versions go with it), and none writes past the limit, so
input that generates ever new sources cannot fill the disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import types
import warnings
from typing import Optional

__all__ = ["compiled", "cache_root", "MAX_FILES", "forget"]

MAX_FILES = 4096
"""Most files written into one version folder."""

_MAGIC = b"HSCODE1\0"
_NO_LINK = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NO_LINK
_SUPPORTED = (hasattr(os, "getuid") and hasattr(os, "O_DIRECTORY") and hasattr(os, "O_NOFOLLOW")
              and {os.open, os.mkdir, os.unlink, os.rename} <= os.supports_dir_fd)
"""Folders checked through descriptors need POSIX (owner ids, ``O_NOFOLLOW``, ``*at`` calls);
elsewhere the cache is off and everything is compiled in memory."""
_MEMORY: dict = {}  # key -> code object, this process
_FOLDER: list = []  # [fd of the verified version folder, or None when there is none]; empty: not looked yet
_WRITTEN = [0]  # files this process may still write: set from the folder's count when it is opened


def compiled(source: str, filename: str) -> types.CodeType:
    """``compile(source, filename, "exec")``, from the cache when a process compiled it before."""
    key = hashlib.sha256(f"{filename}\0{source}".encode("utf-8", "surrogatepass")).hexdigest()
    code = _MEMORY.get(key)
    if code is None:
        code = _MEMORY[key] = _load_or_compile(key, source, filename)
    return code


def forget() -> None:
    """Drop what this process holds (its compiled code and the folder it checked); the files stay."""
    _MEMORY.clear()
    if _FOLDER and _FOLDER[0] is not None:
        os.close(_FOLDER[0])
    _FOLDER.clear()


def cache_root() -> str:
    """The configured cache root (module docstring: *Where*)."""
    configured = os.environ.get("HURRAY_SCHEMA_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hurray_schema")


def _load_or_compile(key: str, source: str, filename: str) -> types.CodeType:
    folder = _folder()
    if folder is not None:
        code = _load(folder, key, filename)
        if code is not None:
            return code
    code = compile(source, filename, "exec")
    if folder is not None:
        _store(folder, key, code)
    return code


# ------------------------------------------------------------------------------------
# The folder
# ------------------------------------------------------------------------------------


def _folder() -> Optional[int]:
    """The descriptor of the verified version folder, or None (cache off or not trusted)."""
    if not _FOLDER:
        wanted = _SUPPORTED and os.environ.get("HURRAY_SCHEMA_CODE_CACHE", "1") != "0"
        _FOLDER.append(_open_folder() if wanted else None)
    fd = _FOLDER[0]
    if fd is not None and not _private(os.fstat(fd), stat.S_ISDIR):
        _untrusted("the code folder changed owner or mode")
        os.close(fd)
        fd = _FOLDER[0] = None
    return fd


def _version() -> str:
    """The folder of this interpreter's code objects: its bytecode and marshal format."""
    return f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}-m{marshal.version}"


def _open_folder() -> Optional[int]:
    """``<root>/code/<version>``, made where missing, ``code`` and the version folder checked
    (module docstring: *Trust*); None with one warning when they cannot be trusted or made."""
    root = cache_root()
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        root_fd = os.open(root, _OPEN_DIR)
    except OSError:  # no cache folder to be had (a read-only home): nothing unsafe, so no warning
        return None
    try:
        shared = not _private(os.fstat(root_fd), stat.S_ISDIR)
        code_fd = _subfolder(root_fd, "code")
    finally:
        os.close(root_fd)
    if code_fd is None:
        _untrusted(f"{os.path.join(root, 'code')} is not a folder of this user's that only it can write"
                   + (" (the cache root is shared)" if shared else ""))
        return None
    version = _version()
    try:
        made = _make_folder(code_fd, version)
        fd = _subfolder(code_fd, version)
        if fd is not None and made:
            _prune(code_fd, keep=version)
    finally:
        os.close(code_fd)
    if fd is None:
        _untrusted(f"{os.path.join(root, 'code', version)} is not a folder of this user's that only it can write")
        return None
    held = os.listdir(fd)
    if len(held) >= MAX_FILES:  # full (sources of earlier versions, or input that made ever new ones): start again
        _remove_files(fd, held)
        held = []
    _WRITTEN[0] = MAX_FILES - len(held)
    return fd


def _make_folder(parent: int, name: str) -> bool:
    """Make folder ``name`` in ``parent`` (0700); whether it was made now."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        return False
    except OSError:
        return False
    return True


def _subfolder(parent: int, name: str) -> Optional[int]:
    """A descriptor of folder ``name`` in ``parent`` (made 0700 where missing) when it is this
    user's and only this user can write it; else None."""
    try:
        _make_folder(parent, name)
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


def _prune(code_fd: int, keep: str) -> None:
    """Remove the other version folders (flat folders of our files) beside ``keep``."""
    for name in os.listdir(code_fd):
        if name == keep:
            continue
        try:
            old = os.open(name, _OPEN_DIR, dir_fd=code_fd)
        except OSError:
            continue
        try:
            if not _private(os.fstat(old), stat.S_ISDIR):
                continue
            _remove_files(old, os.listdir(old))
        except OSError:
            continue
        finally:
            os.close(old)
        try:
            os.rmdir(name, dir_fd=code_fd)
        except OSError:
            pass


def _remove_files(folder: int, names: list) -> None:
    for name in names:
        try:
            os.unlink(name, dir_fd=folder)
        except OSError:
            pass


def _untrusted(why: str) -> None:
    warnings.warn(f"hurray_schema: generated code is not cached: {why}; it is compiled in memory",
                  RuntimeWarning, stacklevel=4)


# ------------------------------------------------------------------------------------
# The files
# ------------------------------------------------------------------------------------


def _load(folder: int, key: str, filename: str) -> Optional[types.CodeType]:
    """The code object kept for ``key``, or None (missing, not private, or not what was stored)."""
    try:
        fd = os.open(key, os.O_RDONLY | _NO_LINK, dir_fd=folder)
    except OSError:
        return None
    try:
        if not _private(os.fstat(fd), stat.S_ISREG):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    head = _MAGIC + key.encode()
    if not data.startswith(head):
        return None
    try:
        code = marshal.loads(data[len(head):])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, types.CodeType) or code.co_filename != filename:
        return None
    return code


def _store(folder: int, key: str, code: types.CodeType) -> None:
    """Write ``code`` as file ``key``: a private temporary file, then renamed over (no reader sees
    half a file); skipped past :data:`MAX_FILES` or on any error (the cache is an optimisation)."""
    if _WRITTEN[0] <= 0:
        return
    _WRITTEN[0] -= 1
    temporary = f".{key}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINK, 0o600, dir_fd=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + key.encode() + marshal.dumps(code))
        os.rename(temporary, key, src_dir_fd=folder, dst_dir_fd=folder)  # over any older file, atomically (POSIX)
    except OSError:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
