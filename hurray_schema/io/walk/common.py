"""What the walks of every container kind share.

* what a walk yields: :class:`Part` s, each of a kind named here, and the :class:`Faults` policy
  that says what happens at a fault (:func:`fault`);
* the input: a :class:`Window` read forward (bytes, a memory map, a path or a file object),
  :func:`memory_input` for the walks that need the whole input in memory, and
  :func:`is_url` (a path no window opens: a URL is read by range, :mod:`hurray_schema.io.source`);
* what a fault becomes when a walk collects it: :func:`violation_finding`, :func:`fault_at`;
* the composite nesting of each tensor in container order (:class:`Nesting`);
* ``describe``, the one step a walk delegates (:data:`Describe`): the descriptor at an offset,
  as the readers take it (raising) or as ``audit`` does (collecting).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import mmap
import os
from typing import Any, Callable, NamedTuple, Optional

from ...errors import SpecViolation
from ...model import OPEN_COMPOSITE, TensorDescriptor
from ...rules.engine import Finding, Level, Mode, get_rule
from ...structs._declare import static_offset
from ...structs.descriptor import FIXED_HEADER

__all__ = ["Faults", "Part", "fault", "as_view", "part_from_fields", "Window", "memory_input", "is_url",
           "violation_finding", "fault_at", "Nesting", "Describe", "new_part", "DESCRIPTOR_LENGTH_AT",
           "TABLE", "ENTRY", "ENTRY_START", "NAME", "VALUE", "DESCRIPTOR", "BUFFER", "MESSAGE",
           "MESSAGE_HEADER_PART", "TRANSPORT", "DATA_HEADER", "DATA", "PAYLOAD", "TENSOR_END", "FAULT"]

# --------------------------------------------------------------------------------------
# What a walk yields
# --------------------------------------------------------------------------------------


def as_view(data) -> memoryview:
    """``data`` as a flat byte view (no copy)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Faults(enum.Enum):
    """What a walk does at a fault: ``RAISE`` the violation (readers), ``COLLECT`` it as a
    ``fault`` part and go on while parts can be located (audit), ``ANNOTATE`` as ``COLLECT``
    with a ``note`` for the annotated view."""

    RAISE = "raise"
    COLLECT = "collect"
    ANNOTATE = "annotate"


# kinds of part
TABLE = "table"
ENTRY = "entry"
ENTRY_START = "entry start"
NAME = "name"
VALUE = "value"
DESCRIPTOR = "descriptor"
BUFFER = "buffer"
MESSAGE = "message"
MESSAGE_HEADER_PART = "message header"
TRANSPORT = "transport"
DATA_HEADER = "data header"
DATA = "data"
PAYLOAD = "payload"
TENSOR_END = "tensor end"
FAULT = "fault"


class Part(NamedTuple):
    """One located part of a container.

    An immutable named tuple rather than a frozen attrs class: the walks build a few per
    tensor on every read, and a tuple costs a quarter as much to build."""

    kind: str
    start: int
    end: int
    decl: Any = None
    """The declaration the bytes follow (a ``structs`` table), when there is one."""
    value: Any = None
    """The decoded value: a ``TensorDescriptor``, a dict of fields, a buffer view, ..."""
    fault: Optional[Finding] = None
    """The rule the bytes break here (``fault`` parts), as a finding."""
    note: str = ""
    """What the annotated view says about a fault, or the label of the part."""
    findings: tuple = ()
    """Tolerated and SHOULD-level findings of a descriptor part (and every one under COLLECT)."""
    index: int = 0
    """Which one: buffer number, message number, tensor number."""
    depth: int = 0
    """Composite nesting depth of a descriptor (``layouts/composite.md § Binding``)."""


part_from_fields = functools.partial(tuple.__new__, Part)
"""``part_from_fields((kind, start, end, decl, value, fault, note, findings, index, depth))``:
the :class:`Part` of these ten fields, in declaration order, built without the keyword
handling of ``Part(...)`` (a third of its cost: the readers' walks build one per buffer,
message and descriptor)."""


def fault(faults: Faults, rule, message: str, offset: int, mode: Mode, note: str = "", at: Optional[int] = None):
    """Raise (``RAISE``) or return the fault part of ``rule`` at ``offset`` (the part sits
    at ``at``, default ``offset``)."""
    if faults is Faults.RAISE:
        raise rule.violation(message, offset)
    where = offset if at is None else at
    return Part(FAULT, where, where, fault=rule.finding(message, offset, mode), note=note)


_CHUNK = 8 * 1024 * 1024
_FIRST_CHUNK = 64 * 1024

DESCRIPTOR_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")
"""Offset of ``descriptor_length`` in a descriptor (``metadata.md § Fixed Header``)."""

new_part = tuple.__new__
"""``new_part(Part, fields)``: :func:`part_from_fields` without the
partial's call, on the per-tensor path of a read (a part per descriptor and buffer)."""

Describe = Callable[[Any, int, int], Part]
"""``describe(view, base, depth)``: the descriptor at the start of ``view`` (offsets from
``base``; ``depth`` its composite nesting) as a part."""


# --------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------


class Window:
    """Bytes, a path or a binary file object, read forward with a running offset.

    Over bytes (or a memory map) every read is a zero-copy slice and :attr:`data` is the
    whole input; over a file only what a read asks for is held, fetched in chunks that
    grow with what has arrived (a length that lies costs no big read-ahead)."""

    def __init__(self, source):
        self.pos = 0
        self._owned = None
        self._pending = b""
        self.data: Optional[memoryview] = None
        self.raw = None  # the bytes or memory map under ``data``, whose slices are bytes (no view made)
        self.file = None
        if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
            self.data = as_view(source)
            if source.__class__ is bytes or isinstance(source, mmap.mmap):
                self.raw = source
        elif isinstance(source, (str, os.PathLike)):
            self.file = self._owned = open(source, "rb")
        elif hasattr(source, "read"):
            self.file = source
        else:
            raise TypeError(f"read_stream needs bytes, a path or a binary file object, not {type(source).__name__}")

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def at_eof(self) -> bool:
        if self.data is not None:
            return self.pos >= len(self.data)
        if self._pending:
            return False
        self._pending = self.file.read(1) or b""
        return not self._pending

    def rest(self) -> memoryview:
        """Everything from the current offset (memory windows only), not consumed."""
        return self.data[self.pos :]

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def read(self, n: int):
        """Up to ``n`` bytes (fewer only at end of input), zero-copy for memory input."""
        if self.data is not None:
            out = self.data[self.pos : self.pos + n]
            self.pos += len(out)
            return out
        buf = bytearray()
        if self._pending and n:
            buf += self._pending
            self._pending = b""
        step = _FIRST_CHUNK
        while len(buf) < n:
            chunk = self.file.read(min(n - len(buf), step))
            if not chunk:
                break
            buf += chunk
            step = min(2 * step, _CHUNK)
        self.pos += len(buf)
        return memoryview(buf) if len(buf) == n else buf


@contextlib.contextmanager
def memory_input(source):
    """``source`` (bytes-like, a path, or a binary file object) as one ``memoryview``:
    zero-copy for bytes, memory-mapped for a path or a file with a descriptor (pages are
    read only when touched), read whole only for a pipe-like object without one."""
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        yield as_view(source)
        return
    owned = None
    if isinstance(source, (str, os.PathLike)):
        owned = source = open(source, "rb")
    elif not hasattr(source, "read"):
        raise TypeError(f"audit() takes bytes or a path, not {type(source).__name__}")
    try:
        mapped = _map(source)
        if mapped is None:
            yield memoryview(bytes(source.read()))
            return
        view = memoryview(mapped)
        try:
            yield view
        finally:
            with contextlib.suppress(BufferError):
                view.release()
                mapped.close()
    finally:
        if owned is not None:
            owned.close()


def _map(fh) -> Optional[mmap.mmap]:
    """A read-only map of a regular file read from its start, else None."""
    try:
        fileno = fh.fileno()
        if os.fstat(fileno).st_size == 0 or fh.tell() != 0:
            return None
        return mmap.mmap(fileno, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        return None


def is_url(path) -> bool:
    """Whether ``path`` is a URL fsspec reads (``scheme://...``, not ``file://``): read by byte
    range (:mod:`hurray_schema.io.source`), never opened as a local file."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


# --------------------------------------------------------------------------------------
# Faults a walk collects
# --------------------------------------------------------------------------------------


def violation_finding(exc: SpecViolation) -> Finding:
    """A raised violation as a finding at the level its rule declares."""
    try:
        level = get_rule(exc.rule_id).level
    except KeyError:
        level = Level.MUST
    return Finding(exc.rule_id, level, exc.citation, exc.message, exc.offset, False)


def fault_at(exc: SpecViolation) -> Part:
    """The ``fault`` part of a raised violation, where the violation is located."""
    return Part(FAULT, exc.offset, exc.offset, fault=violation_finding(exc))


# --------------------------------------------------------------------------------------
# Composite nesting
# --------------------------------------------------------------------------------------


class Nesting:
    """Composite nesting depth of each tensor in container order
    (``layouts/composite.md § Binding``: a head binds the next ``member_count`` tensors)."""

    __slots__ = ("pending",)

    def __init__(self):
        self.pending: list[int] = []  # members each open composite still expects, innermost last

    def depth(self) -> int:
        """Depth of the next tensor: open composites, not counting those already complete."""
        depth = len(self.pending)
        while depth and self.pending[depth - 1] <= 0:
            depth -= 1
        return depth

    def arrive(self, desc: TensorDescriptor) -> None:
        pending = self.pending
        while pending and pending[-1] <= 0:
            pending.pop()
        if pending:
            pending[-1] -= 1
        if desc.is_composite_head and desc.layout.member_count != OPEN_COMPOSITE:
            pending.append(desc.layout.member_count)
