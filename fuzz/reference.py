"""Accept/reject verdicts of the reference implementation, ``pyhurray`` (``import hurray``).

pyhurray is a native extension; on some hostile inputs it does not raise but aborts the
whole process (it allocates what a length or count field promises before reading it).
So verdicts come from a worker subprocess; a worker that dies without answering gives
:data:`ABORT` and is replaced.  Files (where aborts are frequent) are judged in a forked
child of the worker, so an abort there costs a fork rather than a new interpreter.

A verdict is ``None`` (accepted: decoded, and every lazily decoded part -- layout,
quantization, sections, buffer handles, composite members, KV -- read back without
error), :data:`ABORT`, or ``"<ExceptionType>: <message>"``.  "Read back" is deep: every
public property of every decoded section object is read (``touch_value``), since pyhurray
parses some sections only on first access.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from typing import Optional

ABORT = "ABORT"
"""Verdict when pyhurray killed its process instead of raising."""

_WORKER = r'''
import json, os, struct, sys
import hurray

ABORT = 'ABORT'

PROPS = ("buffer_count", "buffer_handles", "byte_offset", "device", "dtype", "extension_type", "layout",
         "ndim", "quantization", "shape", "shard", "size", "statistics", "version")

def touch_value(value, depth=0):
    """Read every public, non-callable attribute of a decoded section object (layout,
    quantization, shard, statistics, extension type, device, dtype, buffer handle), and of
    the section objects they hold, so that errors pyhurray defers to first access surface."""
    if depth > 8 or value is None or isinstance(value, (bool, int, float, str, bytes)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            touch_value(v, depth + 1)
        return
    for name in dir(value):
        if name.startswith("_"):
            continue
        attr = getattr(value, name)
        if not callable(attr):
            touch_value(attr, depth + 1)

def touch_descriptor(d):
    for p in PROPS:
        touch_value(getattr(d, p))

def touch(item):
    if isinstance(item, hurray.Composite):
        touch_descriptor(item.descriptor)
        item.member_roles
        for m in item.members:
            touch(m)
    else:
        touch_descriptor(item.descriptor)

def descriptor(data):
    touch_descriptor(hurray.Descriptor.decode(data))

def stream(data):
    # without max_buffer_bytes pyhurray allocates whatever byte_size says; a buffer larger
    # than the whole input cannot be present, so this bound changes no verdict
    for item in hurray.StreamReader(data, max_buffer_bytes=len(data)):
        touch(item)

def stream_default(data):
    # the reader with its default settings, as an application would call it
    for item in hurray.StreamReader(data):
        touch(item)

def file(data):
    path = data.decode()
    for item in hurray.load(path).values():
        touch(item)
    hurray.load_kv(path)

KINDS = {"descriptor": descriptor, "stream": stream, "stream_default": stream_default, "file": file}
FORK = {"file", "stream_default"}
inp, out = sys.stdin.buffer, sys.stdout
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    kind_len, n = struct.unpack("<II", head)
    kind = inp.read(kind_len).decode()
    data = inp.read(n)
    if kind not in FORK:
        try:
            KINDS[kind](data)
            verdict = None
        except Exception as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        out.write(json.dumps(verdict) + "\n")
        out.flush()
        continue
    # files abort often: judge each in a forked child, so an abort costs a fork, not a new interpreter
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            KINDS[kind](data)
            verdict = None
        except Exception as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        os.write(w, json.dumps(verdict).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    answer = b"".join(chunks).decode()
    out.write((answer or json.dumps(ABORT)) + "\n")
    out.flush()
'''


class Reference:
    """A pyhurray worker process answering accept/reject questions; restarts after an abort."""

    def __init__(self):
        self._proc: Optional[subprocess.Popen] = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, RUST_BACKTRACE="0")  # an abort's backtrace costs more than the check
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=False, env=env,
        )
        return self._proc

    def _ask(self, kind: str, data: bytes) -> Optional[str]:
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        k = kind.encode()
        try:
            proc.stdin.write(struct.pack("<II", len(k), len(data)) + k + data)
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = b""
        if not line:
            proc.wait()
            self._proc = None
            return ABORT
        return json.loads(line)

    def descriptor(self, data: bytes) -> Optional[str]:
        return self._ask("descriptor", bytes(data))

    def stream(self, data: bytes) -> Optional[str]:
        return self._ask("stream", bytes(data))

    def stream_default(self, data: bytes) -> Optional[str]:
        """Like :meth:`stream` but with ``StreamReader``'s default settings (no buffer bound)."""
        return self._ask("stream_default", bytes(data))

    def file(self, path) -> Optional[str]:
        return self._ask("file", str(path).encode())

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> "Reference":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def available() -> bool:
    try:
        import hurray  # noqa: F401
    except ImportError:
        return False
    return True
