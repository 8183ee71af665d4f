"""The kernel cache: machine code per (kernel, signature), in a version folder this user alone can write
(:mod:`hurray_schema.private_folder`), keyed by the evaluator's sources, numba, llvmlite, Python and the CPU."""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional


from ...codecache import cache_root
from ...private_folder import open_private, read_private, still_private, write_private
from .host import _host_cpu
from .loader import _digest, _engine, _load_shared
from .signatures import Signature, _ffi


def cache_dir() -> Path:
    """Where the kernel cache keeps its version folders: ``$NUMBA_CACHE_DIR/hurray_schema`` when
    numba's cache folder is set, else ``kernels`` in this package's cache root
    (``$HURRAY_SCHEMA_CACHE_DIR``, else ``$XDG_CACHE_HOME/hurray_schema`` or
    ``~/.cache/hurray_schema``).  Never inside the installed package."""
    root, first = _cache_location()
    return Path(root) / first


def _cache_location() -> tuple[str, str]:
    """``(root, first folder of ours inside it)``: the root may be shared, the folder is private."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return configured, "hurray_schema"
    return cache_root(), "kernels"




def _version_key() -> str:
    """What the machine code depends on besides the kernel: this evaluator's sources, the numba,
    llvmlite and Python builds, and the CPU numba compiles for (:func:`_host_cpu`)."""
    import llvmlite  # its version only: the package's top level, not LLVM

    digest = hashlib.sha256()
    evaluator = Path(__file__).resolve().parents[1]  # hurray_schema/evaluate: the kernels and this package
    for path in sorted(evaluator.rglob("*.py")):
        digest.update(path.relative_to(evaluator).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        version = Path(spec.origin).with_name("_version.py")
        digest.update(version.read_bytes() if version.exists() else spec.origin.encode())
    for part in (llvmlite.__version__, sys.version, _host_cpu(), os.environ.get("NUMBA_CPU_NAME", ""),
                 os.environ.get("NUMBA_CPU_FEATURES", ""), os.environ.get("NUMBA_OPT", "")):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


class _Cache:
    """Object code (and shared libraries) per (kernel, signature) in a version folder of
    :func:`cache_dir` that only this user can write (:mod:`hurray_schema.private_folder`: loaded
    code runs in this process); none when that folder cannot be trusted (one warning) or made."""

    def __init__(self):
        root, first = _cache_location()
        self.fd = open_private(root, first, _version_key(), what="kernel machine code")

    def _folder(self) -> Optional[int]:
        """The version folder, checked again (its owner or mode may have changed since)."""
        if self.fd is not None and not still_private(self.fd):
            warnings.warn("hurray_schema: kernel machine code is not cached: its folder changed owner or mode; "
                          "kernels are compiled in memory", RuntimeWarning, stacklevel=4)
            os.close(self.fd)
            self.fd = None
        return self.fd

    @staticmethod
    def _names(kernel_, signature: Signature) -> tuple[str, str, str]:
        stem = re.sub(r"[^\w.-]", "_", kernel_.name) + "." + _digest(signature.text)[:16]
        return stem + ".o", stem + ".json", stem + ".so"

    def load(self, kernel_, signature: Signature) -> Optional[Callable]:
        """The kernel's entry point from the cache: its shared library where there is one (no llvmlite),
        else its object code through the MCJIT engine; None when the cache does not hold it."""
        folder = self._folder()
        if folder is None:
            return None
        objname, metaname, sharedname = self._names(kernel_, signature)
        try:
            meta = json.loads(read_private(folder, metaname) or b"")
        except ValueError:
            return None
        if not isinstance(meta, dict) or meta.get("signature") != signature.text:
            return None
        if meta.get("shared_sha256"):
            function = _load_shared(folder, sharedname, meta["shared_sha256"], meta["symbol"], signature.cdecl)
            if function is not None:
                return function
        data = read_private(folder, objname)
        if data is None or _digest(data) != meta.get("sha256"):
            return None
        address = _engine().load(data, meta["symbol"], meta["externals"])
        return _ffi().cast(signature.cdecl, address) if address else None

    def save(self, kernel_, signature: Signature, data: bytes, symbol: str, externals: list,
             shared: Optional[bytes] = None) -> None:
        folder = self._folder()
        if folder is None:
            return
        objname, metaname, sharedname = self._names(kernel_, signature)
        meta = {"kernel": kernel_.name, "signature": signature.text, "symbol": symbol, "externals": externals,
                "sha256": _digest(data)}
        if not write_private(folder, objname, data):
            return  # a full or read-only disk: the kernel is compiled again next time
        if shared is not None and write_private(folder, sharedname, shared):
            meta["shared_sha256"] = _digest(shared)
        write_private(folder, metaname, json.dumps(meta, indent=1).encode())


_the_cache: list = []


def _cache() -> _Cache:
    if not _the_cache:
        _the_cache.append(_Cache())
    return _the_cache[0]
