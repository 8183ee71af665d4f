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
this user alone can write, and only from a file that is the same: the rules, the checks and the
warning are :mod:`hurray_schema.private_folder`'s (a shared root holds a private ``code`` folder of
ours; the version folder is checked again before every load).  A file that does not read back as a
code object for its key is ignored and replaced.  A version folder holds at most :data:`MAX_FILES`
files: a process that finds it full empties it first (the sources of earlier versions go with it),
and none writes past the limit, so input that generates ever new sources cannot fill the disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
import types
import warnings
from typing import Optional

from .memo import MEMO
from .private_folder import open_private, read_private, remove_files, still_private, user_cache_root, write_private

__all__ = ["compiled", "cache_root", "MAX_FILES", "forget"]

MAX_FILES = 4096
"""Most files written into one version folder."""

_MAGIC = b"HSCODE1\0"
_MEMORY = MEMO.code  # key -> code object, this process (bounded: the decoder's memo)
_MAX_MEMORY = MEMO.limit("code")


class _Folder:
    """The version folder this process checked: ``fd`` (None when there is none or it is not
    trusted), ``looked`` once, and how many files it may still write (from the folder's count)."""

    fd: Optional[int] = None
    looked = False
    writable = 0


_STATE = _Folder()


def compiled(source: str, filename: str) -> types.CodeType:
    """``compile(source, filename, "exec")``, from the cache when a process compiled it before."""
    key = hashlib.sha256(f"{filename}\0{source}".encode("utf-8", "surrogatepass")).hexdigest()
    code = _MEMORY.get(key)
    if code is None:
        if len(_MEMORY) >= _MAX_MEMORY:  # every input picks its headers: held code is bounded too
            _MEMORY.clear()
        code = _MEMORY[key] = _load_or_compile(key, source, filename)
    return code


def forget() -> None:
    """Drop what this process holds (its compiled code and the folder it checked); the files stay."""
    _MEMORY.clear()
    if _STATE.fd is not None:
        os.close(_STATE.fd)
    _STATE.fd, _STATE.looked = None, False


def cache_root() -> str:
    """The configured cache root (module docstring: *Where*)."""
    return os.environ.get("HURRAY_SCHEMA_CACHE_DIR") or user_cache_root()


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
# The folder and the files
# ------------------------------------------------------------------------------------


def _folder() -> Optional[int]:
    """The descriptor of the verified version folder, or None (cache off or not trusted)."""
    if not _STATE.looked:
        wanted = os.environ.get("HURRAY_SCHEMA_CODE_CACHE", "1") != "0"
        _STATE.fd, _STATE.looked = (_open_folder() if wanted else None), True
    fd = _STATE.fd
    if fd is not None and not still_private(fd):
        warnings.warn("hurray_schema: generated code is not cached: its folder changed owner or mode; it is "
                      "compiled in memory", RuntimeWarning, stacklevel=4)
        os.close(fd)
        fd = _STATE.fd = None
    return fd


def _version() -> str:
    """The folder of this interpreter's code objects: its bytecode and marshal format."""
    return f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}-m{marshal.version}"


def _open_folder() -> Optional[int]:
    """``<root>/code/<version>`` (:func:`~hurray_schema.private_folder.open_private`), emptied first
    when full."""
    fd = open_private(cache_root(), "code", _version(), what="generated code")
    if fd is None:
        return None
    held = os.listdir(fd)
    if len(held) >= MAX_FILES:  # full (sources of earlier versions, or input that made ever new ones): start again
        remove_files(fd, held)
        held = []
    _STATE.writable = MAX_FILES - len(held)
    return fd


def _load(folder: int, key: str, filename: str) -> Optional[types.CodeType]:
    """The code object kept for ``key``, or None (missing, not private, or not what was stored)."""
    data = read_private(folder, key)
    head = _MAGIC + key.encode()
    if data is None or not data.startswith(head):
        return None
    try:
        code = marshal.loads(data[len(head):])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, types.CodeType) or code.co_filename != filename:
        return None
    return code


def _store(folder: int, key: str, code: types.CodeType) -> None:
    """Write ``code`` as file ``key``; skipped past :data:`MAX_FILES`."""
    if _STATE.writable <= 0:
        return
    _STATE.writable -= 1
    write_private(folder, key, _MAGIC + key.encode() + marshal.dumps(code))
