"""The entry points under fuzz, and how one input is pushed all the way through each.

Shared by the atheris harness (``fuzz/harness.py``) and the test-suite fuzz
(``tests/test_fuzz_mutations.py``).  An entry point is looked up on the package first
(``hurray_schema.read_stream``) and then in the module that defines it, so the fuzzers
work before the public re-export exists; :func:`entry_point` returns ``None`` when this
build has neither.

Each ``run_*`` function drives the input to the end -- every item of a stream, every
tensor, buffer, KV value and index entry of a file, every finding of an audit -- so a
decoder that only fails lazily is still reached.  It returns normally or raises; the
caller decides which exceptions are acceptable (only ``HurraySchemaError`` ones).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Callable, Optional

import hurray_schema as hs

_HOMES = {
    "decode_descriptor": "hurray_schema.codec",
    "read_stream": "hurray_schema.io.stream",
    "read_file": "hurray_schema.io.file",
    "audit": "hurray_schema.audit",
}


def entry_point(name: str) -> Optional[Callable]:
    """``hurray_schema.<name>``, or the same function from its home module, or None."""
    fn = getattr(hs, name, None)
    if callable(fn):
        return fn  # (a submodule of the same name, e.g. hurray_schema.audit, is not it)
    try:
        return getattr(importlib.import_module(_HOMES[name]), name, None)
    except ImportError:
        return None


def _touch(item) -> None:
    """Read every byte an item hands out (members of composites included)."""
    members = getattr(item, "members", None)
    if members is not None:
        for m in members:
            _touch(m)
        return
    for b in getattr(item, "buffers", ()):
        memoryview(b).tobytes()


def run_decode_descriptor(data: bytes, mode: str = "strict", **kw):
    """Decode ``data`` and check the compiled-signature path against the general decoder:
    same descriptor, or the same error (a disagreement raises ``AssertionError``)."""
    try:
        got = entry_point("decode_descriptor")(data, mode=mode, **kw)
    except hs.HurraySchemaError as exc:
        _check_general(data, mode, kw, ("error", type(exc), getattr(exc, "rule_id", None)))
        raise
    _check_general(data, mode, kw, ("ok", got))
    return got


def _check_general(data: bytes, mode: str, kw: dict, outcome: tuple) -> None:
    try:
        from hurray_schema.codec import _parse_general, check_semantics
        from hurray_schema.limits import resolve_limits
        from hurray_schema.rules.engine import as_mode
    except ImportError:  # a build from before the compiled path
        return
    try:
        desc, _ = _parse_general(memoryview(data).cast("B"), as_mode(mode), 0, resolve_limits(kw.get("limits")))
        want = ("ok", check_semantics(desc, mode))
    except hs.HurraySchemaError as exc:
        want = ("error", type(exc), getattr(exc, "rule_id", None))
    if want != outcome:
        raise AssertionError(f"compiled and general decoders disagree: {outcome!r} != {want!r}")


def run_read_stream(data: bytes, mode: str = "strict", framing: str = "bare", **kw) -> int:
    n = 0
    reader = entry_point("read_stream")(data, framing=framing, mode=mode, **kw)
    try:
        for item in reader:
            _touch(item)
            n += 1
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    return n


def run_read_file(path, mode: str = "strict", **kw) -> int:
    n = 0
    with entry_point("read_file")(path, mode=mode, **kw) as f:
        getattr(f, "kv", None)
        entries = getattr(f, "entries", None)
        if entries is not None:
            entries()
        for name in f:
            _touch(f[name])
            n += 1
    return n


def run_audit(data, mode: str = "strict", **kw):
    report = entry_point("audit")(data, mode=mode, **kw)
    for finding in getattr(report, "findings", ()):
        str(finding)
    return report


def write_scratch(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (replacing it) for the path-based readers."""
    with open(path, "wb") as f:
        f.write(data)
    return path


def scratch_file() -> Path:
    """A per-process scratch path for fuzzing ``read_file``: in RAM (``/dev/shm``) where
    available -- rewriting a file thousands of times on disk dominates the run -- else in
    the system temp dir."""
    import tempfile

    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"hurray_fuzz_{os.getpid()}.hrry"
