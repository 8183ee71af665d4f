"""What the commands share: the group ``main`` (each command imported when it is run), the
input read from a path, standard input or a URL, failing with a message and an exit code, and
option types and helpers."""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
import stat
import sys
import tempfile

import click

from .. import __version__
from ..io.source import is_url

__all__ = ["main", "Input", "fail", "Bytes", "KINDS", "EXIT_OK", "EXIT_FINDINGS", "EXIT_UNREADABLE",
           "progress_threshold", "existing_or_url", "write_html", "audited", "tls_options", "session_options",
           "connect"]

EXIT_OK, EXIT_FINDINGS, EXIT_UNREADABLE = 0, 1, 2
"""Exit codes: done (clean); the input breaks a MUST-level rule; the input cannot be read."""

PROGRESS_THRESHOLD = 64 * 1024 * 1024
"""Inputs at least this large get a progress bar on stderr (when it is a terminal);
the environment variable ``HURRAY_SCHEMA_PROGRESS_BYTES`` overrides it."""

KINDS = ("auto", "descriptor", "stream", "messages", "file")
"""The choices of ``--kind``."""

COMMANDS = {
    "audit": "audit", "inspect": "inspect", "rules": "rules", "docs": "render", "ksy": "render", "vectors": "render",
    "merge": "merge", "convert": "convert", "serve": "serve", "get": "get", "put": "put", "replay": "replay",
}
"""Each command and the module of this package that defines it (a function of the same name)."""


# ------------------------------------------------------------------------------------
# The group
# ------------------------------------------------------------------------------------


class _LazyGroup(click.Group):
    """A group whose commands are imported when one is run (or listed by ``--help``): running
    one command imports none of the others' modules."""

    def list_commands(self, ctx) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx, name: str):
        if name in COMMANDS and name not in self.commands:
            module = importlib.import_module(f".{COMMANDS[name]}", __package__)
            self.add_command(getattr(module, name), name)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hurray-schema")
def main() -> None:
    """Audit, inspect and document Hurray tensors, streams and files."""


def fail(message: str, code: int = EXIT_UNREADABLE) -> None:
    """Print ``hurray-schema: message`` on stderr and exit with ``code``."""
    click.echo(f"hurray-schema: {message}", err=True)
    sys.exit(code)


def progress_threshold() -> int:
    """Bytes from which an input gets a progress bar (:data:`PROGRESS_THRESHOLD`, or the environment's)."""
    try:
        return int(os.environ.get("HURRAY_SCHEMA_PROGRESS_BYTES", PROGRESS_THRESHOLD))
    except ValueError:
        return PROGRESS_THRESHOLD


# ------------------------------------------------------------------------------------
# Input
# ------------------------------------------------------------------------------------


class Input:
    """The bytes of PATH or of standard input, memory-mapped: only what is looked at is
    read into memory.  Standard input that is not a regular file (a pipe) is first copied,
    in bounded chunks, to an unnamed temporary file; so is a URL (the ``[remote]`` extra)."""

    def __init__(self, path: str):
        self.path = path
        self._file = None
        self._map = None
        if path == "-":
            self._file = _stdin_file()
        elif is_url(path):
            self._file = _downloaded(path)
        else:
            self._file = open(path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            self.data = memoryview(b"")
        else:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.data = memoryview(self._map)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def copied(self) -> bool:
        """True when the bytes are a copy (standard input, a URL) rather than the file at PATH."""
        return self.path == "-" or is_url(self.path)

    def close(self) -> None:
        self.data.release()
        if self._map is not None:
            self._map.close()
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> "Input":
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(BufferError):
            self.close()


_STDIN_CHUNK = 8 * 1024 * 1024


def _downloaded(url: str):
    """The file at ``url`` (the ``[remote]`` extra) copied by byte range, in bounded chunks, to an
    unnamed temporary file: audit and inspect look at every byte."""
    from ..io.source import RangeReader, open_source

    reader = RangeReader(open_source(url), cache_bytes=0)
    spool = tempfile.TemporaryFile()
    for start in range(0, reader.size, _STDIN_CHUNK):
        spool.write(reader.read(start, min(reader.size, start + _STDIN_CHUNK)))
    spool.flush()
    return spool


def _stdin_file():
    """Standard input as a file that can be memory-mapped from its start."""
    stdin = sys.stdin.buffer
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fileno = stdin.fileno()
        if stat.S_ISREG(os.fstat(fileno).st_mode) and os.lseek(fileno, 0, os.SEEK_CUR) == 0:
            return os.fdopen(os.dup(fileno), "rb")
    spool = tempfile.TemporaryFile()
    while True:
        chunk = stdin.read(_STDIN_CHUNK)
        if not chunk:
            break
        spool.write(chunk)
    spool.flush()
    return spool


def existing_or_url(ctx, param, value: str) -> str:
    """An input argument: a URL as it is, a path that exists."""
    if not is_url(value) and not os.path.exists(value):
        raise click.BadParameter(f"Path {value!r} does not exist.", ctx=ctx, param=param)
    return value


def write_html(out: str, path: str, source: Input, kind: str, findings: list, mode: str) -> int:
    """Write the HTML page of ``source`` (read as ``kind``) and its findings to ``out``."""
    from ..htmlview import write_page
    from ..io.walk.kinds import KIND_NAMES

    title = f"{path}: {KIND_NAMES.get(kind, kind)}, {source.size} bytes"
    return write_page(out, source.data, kind, findings, title=title, mode=mode)


# ------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------


_BYTE_UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30,
               "T": 2**40, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


class Bytes(click.ParamType):
    """A byte count: an integer with an optional unit (K, M, G, T or KiB ... powers of 1024;
    KB, MB, GB, TB powers of 1000)."""

    name = "BYTES"

    def __init__(self, minimum: int = 1):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip()
        digits = len(text) - len(text.lstrip("0123456789"))
        unit = _BYTE_UNITS.get(text[digits:].strip().upper())
        if not digits or unit is None or int(text[:digits]) * unit < self.minimum:
            what = "positive" if self.minimum else "whole"
            self.fail(f"{value!r} is not a {what} byte count (e.g. 1073741824, 512M, 1GiB)", param, ctx)
        return int(text[:digits]) * unit


def tls_options(f):
    """--tls-cert and --tls-key: this side's certificate chain and key (PEM)."""
    f = click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="This side's private key (PEM), unless the certificate file holds it.")(f)
    f = click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="This side's certificate chain (PEM).")(f)
    return f


def session_options(f):
    """The options of a client session: --timeout, --tls-ca and :func:`tls_options`."""
    f = click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="CA certificate (PEM) that signs the server's certificate (hurrays://).")(f)
    f = click.option("--timeout", type=click.FloatRange(0, min_open=True), default=None,
                     help="Seconds the session may take to open, and each request as a whole (default: the "
                          "client's, README § Limits and guarantees).")(f)
    return tls_options(f)


def connect(url: str, timeout: float, tls_ca, tls_cert, tls_key):
    """A client session with the server at ``url`` (:func:`hurray_schema.net.connect`)."""
    from ..net import connect as open_session

    chosen = {} if timeout is None else {"timeout": timeout}
    return open_session(url, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, **chosen)


# ------------------------------------------------------------------------------------
# The audit of an input
# ------------------------------------------------------------------------------------


def audited(path: str, source: Input, kind: str, mode: str):
    """The :class:`~hurray_schema.audit.AuditReport` of PATH (its copy for standard input or a
    URL) read as ``kind`` ("auto": as its bytes or extension say), with a progress bar for a
    large input."""
    from ..audit import audit

    with _audit_progress(source.size) as tick:
        return audit(source.data if source.copied else path, mode=mode, kind=kind, progress=tick, name=path)


@contextlib.contextmanager
def _audit_progress(size: int):
    """A ``tick(done_bytes[, total])`` callback drawing a bar on stderr, or ``None``."""
    if size < progress_threshold() or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=size, label="auditing", file=sys.stderr, show_pos=False) as bar:
        state = {"done": 0}

        def tick(done: int, total=None) -> None:
            step = max(0, min(size, int(done)) - state["done"])
            if step:
                bar.update(step)
                state["done"] += step

        yield tick
        tick(size)
