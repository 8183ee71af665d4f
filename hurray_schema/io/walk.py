"""The located walk of each container kind: descriptor, bare stream, message stream, file.

Every entry point that reads a container -- the readers (:mod:`.stream`, :mod:`.file`),
``audit``, the annotated view (``inspect``) and the command line's grouping -- goes
through the walks here; nothing else knows how a container is laid out.  A walk yields
:class:`Part` s in byte order: where the part sits (``start``/``end``, absolute), which
declaration or table it is (``decl``), its decoded ``value``, and, when the bytes break a
rule, the ``fault``.

What happens at a fault is the caller's :class:`Faults` policy:

* ``RAISE`` (the readers): the first untolerated fault raises its ``SpecViolation``;
* ``COLLECT`` (``audit``): the fault is yielded as a ``fault`` part carrying a
  :class:`~hurray_schema.rules.engine.Finding`; the walk goes on while the next part can
  still be located and stops where it cannot;
* ``ANNOTATE`` (the annotated view): as ``COLLECT``, the part also carrying a short
  ``note`` saying what the bytes do not hold.

Inputs are read through a :class:`Window`: zero-copy over bytes or a memory map, or a
bounded forward read of a file object (only what the current part needs is held).
Under ``COLLECT`` and ``ANNOTATE`` a descriptor is decoded from everything that remains
(what the bytes say, not what the framing promised), so those walks need a window over
memory (:func:`memory_input`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from typing import Any, Callable, Iterator, Optional

import attrs

from .crc import crc32c
from ..codec import checked_by, checked_descriptor, known_length, parse_descriptor, peek_descriptor_length
from .. import errors
from ..errors import HurraySchemaError, RemoteError, SpecViolation
from ..limits import DEFAULT_LIMITS, Limits
from ..model import OPEN_COMPOSITE, SyncMode, TensorDescriptor
from ..rules import container as container_rules
from ..rules import session as session_rules
from ..rules import structure as structure_rules
from ..rules.descriptor import check_descriptor, first_error
from ..rules.engine import Finding, Level, Mode, get_rule
from ..signature import accepted
from ..signature import lookup as lookup_compiled
from ..structs._declare import plan, select, static_offset
from ..structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE
from ..structs.descriptor import MAGIC as DESCRIPTOR_MAGIC
from ..structs.file import (
    DESCRIPTOR_ALIGNMENT, FILE_HEADER, FILE_HEADER_SIZE, FILE_MAGIC, INDEX_COUNT, INDEX_ENTRY_FIELDS,
    INDEX_NAME_LENGTH, KNOWN_FILE_FLAGS, KV_COUNT, MAX_DATA_BUFFER_ALIGNMENT, MIN_DATA_BUFFER_ALIGNMENT,
    SECTION_ALIGNMENT, SUPPORTED_CONTAINER_MAJOR, TRAILER, TRAILER_MAGIC, TRAILER_SIZE, FileFlag,
)
from ..structs.session import ERROR_HEADER, PRIVATE_MESSAGE_FIRST, PRIVATE_MESSAGE_LAST, ErrorCode
from ..structs.stream import (
    MESSAGE_HEADER, RESERVED_STREAM_ID, TENSOR_DATA_HEADER, TENSOR_DESCRIPTOR_FIELDS, MessageType,
)
from .kv import decode_kv
from .parts import (  # noqa: F401  (the kinds of part are part of this module's interface)
    BUFFER, DATA, DATA_HEADER, DESCRIPTOR, ENTRY, ENTRY_START, FAULT, MESSAGE, MESSAGE_HEADER_PART, NAME, PAYLOAD, TABLE,
    TENSOR_END, TRANSPORT, VALUE, Faults, Part, as_view, fault, part_from_fields,
)

__all__ = [
    "Faults", "Part", "Window", "memory_input", "as_view", "violation_finding", "strict_descriptor", "strict_describer",
    "collect_descriptor", "walk_descriptor", "walk_bare", "walk_messages", "walk_file", "detect_kind", "IndexEntry", "buffer_spans",
    "Nesting", "RemoteError", "TensorFrames", "check_message_header", "walk_index", "choose_kind", "KindChoice", "KIND_EXTENSIONS",
]

_CHUNK = 8 * 1024 * 1024
_FIRST_CHUNK = 64 * 1024
_DESCRIPTOR_LENGTH_AT = static_offset(FIXED_HEADER, "descriptor_length")

_MSG = plan(MESSAGE_HEADER)
_MSG_AT = {name: static_offset(MESSAGE_HEADER, name) for name in ("stream_id", "payload_length")}
_MSG_SIZE = _MSG.fixed_size
_SHARD_INDEX_AT = static_offset(TENSOR_DESCRIPTOR_FIELDS, "shard_index")
_TRANSPORT = plan(TENSOR_DESCRIPTOR_FIELDS)
_TRANSPORT_SIZE = _TRANSPORT.fixed_size
_DATA = plan(TENSOR_DATA_HEADER)
_DATA_SIZE = _DATA.fixed_size
_DATA_OFFSET_CODEC = _DATA.steps[0].codec
assert _DATA.steps[0].names == ("byte_offset_in_buffer",)  # the data header's one field, in one unpack
_ERROR = plan(ERROR_HEADER)
_MESSAGE_TYPES = {int(m): m for m in MessageType}
_KNOWN_MESSAGE_TYPES = frozenset(_MESSAGE_TYPES)
_LENGTH_FIELD = plan(select(FIXED_HEADER, "descriptor_length")).steps[0].codec
_new_part = tuple.__new__
"""``_new_part(Part, fields)``: :func:`~hurray_schema.io.parts.part_from_fields` without the
partial's call, on the per-tensor path of a stream read (a part per descriptor and buffer)."""


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


# --------------------------------------------------------------------------------------
# One descriptor
# --------------------------------------------------------------------------------------


def violation_finding(exc: SpecViolation) -> Finding:
    """A raised violation as a finding at the level its rule declares."""
    try:
        level = get_rule(exc.rule_id).level
    except KeyError:
        level = Level.MUST
    return Finding(exc.rule_id, level, exc.citation, exc.message, exc.offset, False)


def strict_descriptor(buf, base: int, depth: int, *, mode: Mode, limits: Limits = DEFAULT_LIMITS,
                      cross_machine: bool = False, findings: Optional[list] = None) -> Part:
    """The descriptor that is ``buf`` (exactly its ``descriptor_length`` bytes) as a reader
    takes it (``RAISE``): the structural decode, then the first untolerated semantic rule raises.  What the mode
    tolerated and the SHOULD-level findings go to ``findings`` (before anything raises) when given, else to the
    part; a descriptor with none of them takes the compiled path, which records nothing."""
    describe = strict_describer(mode=mode, limits=limits, cross_machine=cross_machine, findings=findings)
    return describe(buf, base, depth)


def strict_describer(*, mode: Mode, limits: Limits = DEFAULT_LIMITS, cross_machine: bool = False,
                     findings: Optional[list] = None) -> "Describe":
    """The readers' ``describe``: :func:`strict_descriptor` with its options bound once, as
    one plain function (a reader calls it for every tensor)."""

    def describe(buf, base: int, depth: int) -> Part:
        if buf.__class__ is bytes:  # under a header compiled before: decoded and checked by its generated code
            desc = checked_descriptor(buf, limits)
            if desc is not None:
                if cross_machine:
                    _check_producer_synced(desc, base)
                return _new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "", (), 0, depth))
        return general(buf, base, depth)

    default_limits = limits is DEFAULT_LIMITS

    def checked(buf: bytes, compiled, base: int) -> Optional[TensorDescriptor]:
        """The descriptor of ``buf`` (exactly one) where the walk found ``compiled`` for its header
        already, when every rule passes on it: what :func:`checked_descriptor` would look up, taken
        first from the descriptors every rule passed on before; None: the general path decides."""
        desc = accepted(buf) if default_limits else None
        if desc is None:
            desc = checked_by(compiled, buf, buf, limits)
        if desc is not None and cross_machine:
            _check_producer_synced(desc, base)
        return desc

    def known(buf: bytes, compiled, base: int) -> Part:
        """``describe(buf, base, 0)`` where the walk found ``compiled`` for the header of ``buf``."""
        desc = checked(buf, compiled, base)
        if desc is None:
            return general(buf, base, 0)
        return _new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "", (), 0, 0))

    def value(buf: bytes, compiled, base: int) -> TensorDescriptor:
        """What :func:`known` gives, the descriptor alone (a stream read's per-tensor path)."""
        desc = checked(buf, compiled, base)
        return desc if desc is not None else general(buf, base, 0).value

    def general(buf, base: int, depth: int) -> Part:
        """The descriptor decoded the general way, every rule run (it reports what fails):
        what the decode tolerated, then the semantic rules' SHOULD-level and tolerated
        findings, in audit's order (:func:`collect_descriptor`), before the first error."""
        desc, tolerated = parse_descriptor(buf, mode=mode, base=base, limits=limits)
        if findings is not None:
            if tolerated:
                findings.extend(tolerated)
            tolerated = ()
            error = first_error(desc, mode, base=base, notes=findings)
        else:
            tolerated = list(tolerated)
            error = first_error(desc, mode, base=base, notes=tolerated)
        if error is not None:
            raise error.to_violation()
        if cross_machine:
            _check_producer_synced(desc, base)
        return _new_part(Part, (DESCRIPTOR, base, base + len(buf), FIXED_HEADER, desc, None, "",
                                tuple(tolerated) if tolerated else (), 0, depth))

    describe.known = known  # for the bare walk, which looks the header up to frame the descriptor
    describe.value = value  # the same, the descriptor alone (a stream read's per-tensor path)
    return describe


def _check_producer_synced(desc: TensorDescriptor, base: int) -> None:
    for i, h in enumerate(desc.buffers):
        if h.sync_mode != SyncMode.PRODUCER_SYNCED:
            raise container_rules.CROSS_MACHINE_SYNC.violation(
                f"buffer {i} declares sync_mode 0x{int(h.sync_mode):02X} on a cross-machine stream", base)


def collect_descriptor(buf, base: int, depth: int, mode: Mode) -> Part:
    """The descriptor at the start of ``buf`` as ``audit`` takes it (``COLLECT``): every
    finding of the structural decode and of every semantic rule.  A structural fault is
    the part's ``fault`` (its value is then ``None``: nothing after it can be located)."""
    try:
        desc, findings = parse_descriptor(buf, mode=mode, base=base)
    except SpecViolation as exc:
        fault = violation_finding(exc)
        return Part(DESCRIPTOR, base, base, FIXED_HEADER, None, fault=fault, findings=(fault,), depth=depth)
    findings = list(findings) + check_descriptor(desc, mode, base=base)
    # the decode took descriptor_length bytes (what a decoded descriptor re-encodes to, without encoding it again)
    return Part(DESCRIPTOR, base, base + peek_descriptor_length(buf, base), FIXED_HEADER, desc, findings=tuple(findings),
                depth=depth)


Describe = Callable[[Any, int, int], Part]
"""``describe(view, base, depth)``: the descriptor at the start of ``view`` (offsets from
``base``; ``depth`` its composite nesting) as a part."""


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


def walk_descriptor(view, describe: Describe) -> Iterator[Part]:
    """The one part of a lone descriptor (``metadata.md § Overall Descriptor Structure``):
    ``describe`` of the whole input.  Field by field, a descriptor is the codec's and the
    annotated view's business; a container walk locates it as one part."""
    yield describe(as_view(view), 0, 0)


# --------------------------------------------------------------------------------------
# Bare stream
# --------------------------------------------------------------------------------------


def walk_bare(window: Window, describe: Describe, *, faults: Faults, mode: Mode,
              limits: Limits = DEFAULT_LIMITS, progress=None, per_tensor: bool = False) -> Iterator[Part]:
    """Parts of a bare stream (``interchange.md § Scope``): per tensor its descriptor
    part, then one ``buffer`` part per buffer-table entry (no padding).

    ``per_tensor`` (``RAISE`` only): per tensor one ``(descriptor, its offset, tuple of buffer
    views)`` instead, once all its buffers are read -- the same framing checks, rules and
    offsets, without a part per descriptor or buffer (a stream reader wants the views alone).

    ``RAISE`` checks the framing first (a descriptor or buffer cut off by the end of the
    stream is ``stream.truncated``, located where the bytes end) and reads only what each
    part needs; ``COLLECT`` checks the same framing with the same rules and offsets, then
    decodes each descriptor from what remains, gives it its composite nesting ``depth``,
    and stops at the first part that cannot be located; ``ANNOTATE`` decodes what
    remains without the framing check (so the view shows how far the fields get).  An
    empty stream holds zero tensors (``interchange.md § Scope``) and has no part; a lone
    descriptor is :func:`walk_descriptor`'s."""
    if faults is Faults.RAISE:
        return _bare_strict(window, describe, limits, progress, per_tensor)
    if per_tensor:
        raise ValueError("per_tensor is for faults=Faults.RAISE")
    return _bare_located(window, describe, faults, mode, progress)


def _bare_strict(window: Window, describe: Describe, limits: Limits, progress, per_tensor: bool) -> Iterator:
    if per_tensor:
        return _bare_tensors(window, describe, limits, progress)
    return _bare_parts(window, describe, limits, progress)


def _bare_parts(window: Window, describe: Describe, limits: Limits, progress) -> Iterator[Part]:
    max_buffer = limits.max_buffer_bytes
    memory = window.data
    end = None if memory is None else len(memory)
    while (window.pos < end) if end is not None else not window.at_eof():
        start = window.pos
        if progress is not None:
            progress(start)
        part = _strict_descriptor_part(window, describe, limits, start)
        yield part
        for i, handle in enumerate(part.value.buffers):
            at = window.pos
            data = _strict_buffer(window, memory, end, handle.byte_size, max_buffer, limits, i, start)
            yield _new_part(Part, (BUFFER, at, window.pos, None, data, None, "", (), i, 0))


def _strict_descriptor_part(window: Window, describe: Describe, limits: Limits, start: int) -> Part:
    """The descriptor part at ``start``, framed through the compiled header when one is known."""
    known = getattr(describe, "known", None)
    framed = _known_frame(window, start, limits) if known is not None else None
    if framed is not None:
        return known(framed[1], framed[0], start)
    return describe(_framed_descriptor(window, start, limits), start, 0)


def _known_frame(window: Window, start: int, limits: Limits) -> Optional[tuple]:
    """``(compiled decoder, the descriptor's bytes)`` when the window is in memory, the header at
    ``start`` was compiled before and its descriptor fits (the window is moved past it); else None
    (:func:`_framed_descriptor` frames it).  Over bytes or a memory map the bytes are sliced from them
    directly, no view made."""
    memory, raw = window.data, window.raw
    if memory is None or not start:
        return None
    compiled = lookup_compiled(raw[start : start + FIXED_HEADER_SIZE] if raw is not None
                               else memory[start : start + FIXED_HEADER_SIZE].tobytes())
    if compiled is None or compiled.length > len(memory) - start or compiled.length > limits.max_descriptor_bytes:
        return None
    window.pos = stop = start + compiled.length
    return compiled, (raw[start:stop] if raw is not None else memory[start:stop].tobytes())


def _bare_tensors(window: Window, describe: Describe, limits: Limits, progress) -> Iterator[tuple]:
    """Per tensor ``(descriptor, its offset, tuple of buffer views)`` (``walk_bare(per_tensor=True)``).
    Over bytes or a memory map the descriptor bytes are sliced from them directly and a descriptor
    seen before is one table lookup: a stream of small tensors makes few objects per tensor."""
    max_buffer = limits.max_buffer_bytes
    memory = window.data
    end = None if memory is None else len(memory)
    value = getattr(describe, "value", None)  # a describer told the compiled decoder the framing found
    while (window.pos < end) if end is not None else not window.at_eof():
        start = window.pos
        if progress is not None:
            progress(start)
        framed = _known_frame(window, start, limits) if value is not None else None
        if framed is not None:
            desc = value(framed[1], framed[0], start)
        else:
            desc = describe(_framed_descriptor(window, start, limits), start, 0).value
        handles = desc.buffers
        if len(handles) == 1 and end is not None:  # the common case, read inline
            size, at = handles[0].byte_size, window.pos
            if size <= max_buffer and size <= end - at:
                window.pos = at + size
                yield desc, start, (memory[at : at + size],)
                continue
        views = []
        for i, handle in enumerate(handles):
            size, at = handle.byte_size, window.pos
            if end is not None and size <= max_buffer and size <= end - at:
                window.pos = at + size
                views.append(memory[at : at + size])
            else:
                views.append(as_view(_strict_buffer(window, memory, end, size, max_buffer, limits, i, start)))
        yield desc, start, tuple(views)


def _strict_buffer(window: Window, memory, end: Optional[int], size: int, max_buffer: int, limits: Limits, i: int,
                   start: int):
    """Buffer ``i`` (``size`` bytes) of the tensor whose descriptor is at ``start``, read
    from where the window is: past ``max_buffer_bytes``, or cut off by the end of the
    stream (``stream.truncated``, located where the bytes end), it raises."""
    if size > max_buffer:
        limits.check("max_buffer_bytes", size, start)
    at = window.pos
    if end is not None and size <= end - at:  # the common case, read inline
        window.pos = at + size
        return memory[at : at + size]
    data = window.read(size)
    if len(data) < size:
        raise container_rules.STREAM_TRUNCATED.violation(
            f"buffer {i} of the tensor at byte {start} needs {size} bytes, the stream has "
            f"{len(data)} left", at + len(data))
    return data


def _bare_located(window: Window, describe: Describe, faults: Faults, mode: Mode, progress) -> Iterator[Part]:
    nesting = Nesting()
    while not window.at_eof():
        start = window.pos
        if progress is not None:
            progress(start)
        if faults is Faults.COLLECT:
            cut = _located_frame(window.rest(), start)
            if cut is not None:
                yield cut
                return
        part = describe(window.rest(), start, nesting.depth())
        yield part
        desc = part.value
        if desc is None:
            return
        nesting.arrive(desc)
        window.pos = part.end
        stopped = yield from _located_buffers(window, desc, faults, mode)
        if stopped:
            return
        for i, handle in enumerate(desc.buffers):  # they fit (checked above)
            at = window.pos
            data = window.read(handle.byte_size)
            yield Part(BUFFER, at, at + handle.byte_size, None, data, None, "", (), i)


def _cut_in_descriptor(start: int, have: int, length: Optional[int] = None) -> SpecViolation:
    """``stream.truncated``: the stream ends ``have`` bytes into the descriptor at
    ``start`` (``interchange.md § Scope``: a reader advances descriptor by descriptor, so a
    descriptor cut off by the end of the stream is the stream's fault, located where the
    bytes end)."""
    if length is None:
        message = (f"the stream ends {have} bytes into a descriptor (a descriptor has at least "
                   f"{FIXED_HEADER_SIZE})")
    else:
        message = (f"the stream ends inside the descriptor at byte {start}: descriptor_length {length}, "
                   f"{have} bytes present")
    return container_rules.STREAM_TRUNCATED.violation(message, start + have)


def _refuse_file(head, start: int) -> None:
    """A stream does not start with the file magic (``file-format.md § File Header``): such
    input is a ``.hrry`` file (``descriptor.magic`` at 0, the stream reader's verdict)."""
    if start == 0 and bytes(head[: len(FILE_MAGIC)]) == FILE_MAGIC:
        raise structure_rules.MAGIC.violation("the input starts with \"HRRYFILE\": it is a .hrry file, not a stream "
                                              "(use read_file)", 0)


def _located_frame(rest, start: int) -> Optional[Part]:
    """The fault part when the stream ends inside the descriptor at ``start`` (``rest``:
    what remains of the stream) or the stream is a file, else None: the rule and offset of
    :func:`_framed_descriptor`.  A header refused for its own bytes (magic, minimum length)
    is left to the descriptor's decode, which names the same rule at the same offset."""
    try:
        if len(rest) < FIXED_HEADER_SIZE:
            raise _cut_in_descriptor(start, len(rest))
        _refuse_file(rest, start)
        try:
            length = peek_descriptor_length(rest[:FIXED_HEADER_SIZE], start)
        except SpecViolation:
            return None
        if length > len(rest):
            raise _cut_in_descriptor(start, len(rest), length)
    except SpecViolation as exc:
        return Part(FAULT, exc.offset, exc.offset, fault=violation_finding(exc))
    return None


def _framed_descriptor(window: Window, start: int, limits: Limits):
    memory = window.data
    if memory is not None and start:  # a header seen clean before: its length, no second check
        length = known_length(memory[start : start + FIXED_HEADER_SIZE].tobytes())
        if length is not None and start + length <= len(memory) and length <= limits.max_descriptor_bytes:
            window.pos = start + length
            return memory[start : start + length].tobytes()
    head = window.read(FIXED_HEADER_SIZE)
    if len(head) < FIXED_HEADER_SIZE:
        raise _cut_in_descriptor(start, len(head))
    _refuse_file(head, start)
    length = peek_descriptor_length(head, start)
    limit = limits.max_descriptor_bytes
    if memory is not None and start + length <= len(memory):  # one copy of the descriptor, not of its two reads
        if length > limit:
            limits.check("max_descriptor_bytes", length, start + _DESCRIPTOR_LENGTH_AT)
        window.pos = start + length
        return memory[start : start + length].tobytes()
    # never more than the limit allows; a stream that ends first is truncated, as audit says
    rest = window.read(max(0, min(length, limit + 1) - FIXED_HEADER_SIZE))
    have = FIXED_HEADER_SIZE + len(rest)
    if have < length and have <= limit:
        raise _cut_in_descriptor(start, have, length)
    if length > limit:
        limits.check("max_descriptor_bytes", length, start + _DESCRIPTOR_LENGTH_AT)
    return bytes(head) + bytes(rest)


def _located_buffers(window: Window, desc: TensorDescriptor, faults: Faults, mode: Mode):
    """When the buffers of ``desc`` do not all fit: yield those that do, then the fault
    part, and return True (the walk stops); else yield nothing and return False."""
    need, have = sum(h.byte_size for h in desc.buffers), window.remaining()
    if need <= have:
        return False
    at = window.pos
    for i, handle in enumerate(desc.buffers):
        if handle.byte_size > len(window.data) - at:
            yield fault(faults, container_rules.STREAM_TRUNCATED,
                        f"the buffers of the tensor need {need} bytes, {have} remain",
                        window.pos + have, mode, at=at,
                        note=f"buffer {i} needs {handle.byte_size} bytes, {len(window.data) - at} remain")
            return True
        yield Part(BUFFER, at, at + handle.byte_size, value=window.data[at : at + handle.byte_size], index=i)
        at += handle.byte_size
    return True  # pragma: no cover - some buffer does not fit when need > have


# --------------------------------------------------------------------------------------
# Message stream
# --------------------------------------------------------------------------------------


def walk_messages(window: Window, describe: Describe, *, faults: Faults, mode: Mode,
                  limits: Limits = DEFAULT_LIMITS) -> Iterator[Part]:
    """Parts of a message stream (``interchange.md § Message Framing``): per message a
    ``message`` part (its whole extent) then its header, and per kind a descriptor part and
    its ``transport`` fields, a ``data header`` and ``data``, or an opaque ``payload``.

    ``RAISE`` enforces the framing and message order (the reader); ``COLLECT`` and
    ``ANNOTATE`` locate every message whose header and payload fit and stop at the first
    that does not, the descriptor decoded from what remains of the input (``COLLECT``) or
    of its payload (``ANNOTATE``)."""
    if faults is Faults.RAISE:
        return _messages_strict(window, describe, mode, limits)
    return _messages_located(window, describe, faults, mode)


def _messages_located(window: Window, describe: Describe, faults: Faults, mode: Mode) -> Iterator[Part]:
    view = window.data
    pos, index = 0, 0
    while pos < len(view):
        if _MSG_SIZE > len(view) - pos:
            yield Part(MESSAGE, pos, pos, index=index)
            cut = fault(faults, container_rules.MESSAGE_TRUNCATED, f"the stream ends {len(view) - pos} bytes into a "
                        f"{_MSG_SIZE}-byte message header", len(view), mode, at=pos,
                        note="the message header does not fit")
            yield cut._replace(decl=MESSAGE_HEADER)
            return
        h, p = _MSG.unpack(view, pos)
        n = h["payload_length"]
        if n > len(view) - p:
            yield Part(MESSAGE, pos, pos, index=index)
            yield Part(MESSAGE_HEADER_PART, pos, p, MESSAGE_HEADER, h)
            yield fault(faults, container_rules.MESSAGE_TRUNCATED,
                        f"the message at byte {pos} announces {n} payload bytes, the "
                        f"stream has {len(view) - p}", len(view), mode, at=p,
                        note=f"payload_length {n} runs past the end ({len(view) - p} bytes remain)")
            return
        end = p + n
        yield Part(MESSAGE, pos, end, value=h, index=index)
        yield Part(MESSAGE_HEADER_PART, pos, p, MESSAGE_HEADER, h)
        kind = h["message_type"]
        if kind == MessageType.TENSOR_DESCRIPTOR:
            if faults is Faults.COLLECT:
                framed = _located_descriptor_payload(view[p:end], pos)
                if isinstance(framed, Part):  # the descriptor cannot be located in its payload
                    yield framed
                    yield Part(PAYLOAD, p, end, value=view[p:end])
                    pos = end
                    index += 1
                    continue
                part = describe(view[p : p + framed], p, 1)
            else:
                part = describe(view[p:end], p, 1)
            yield part
            q = part.end
            if q + _TRANSPORT_SIZE <= end:
                t, q = _TRANSPORT.unpack(view, q)
                yield Part(TRANSPORT, q - _TRANSPORT_SIZE, q, TENSOR_DESCRIPTOR_FIELDS, t)
                p = q
            else:
                yield Part(TRANSPORT, q, q, TENSOR_DESCRIPTOR_FIELDS, None)  # does not fit
                p = end
        elif kind == MessageType.TENSOR_DATA:
            if _DATA_SIZE <= end - p:
                d, q = _DATA.unpack(view, p)
                yield Part(DATA_HEADER, p, q, TENSOR_DATA_HEADER, d)
                yield Part(DATA, q, end, value=view[q:end])
                p = end
            else:
                yield Part(DATA_HEADER, p, p, TENSOR_DATA_HEADER, None)  # does not fit
                p = end
        if p < end:
            yield Part(PAYLOAD, p, end, value=view[p:end])
        pos = end
        index += 1


def _descriptor_length_in_payload(payload, at: int) -> int:
    """``descriptor_length`` of the descriptor in the TENSOR_DESCRIPTOR payload of the
    message at ``at``, which must be that descriptor and the transport fields exactly
    (``interchange.md § Message Framing``); else ``stream.descriptor.payload`` at the
    header's ``payload_length`` (or the descriptor's own fault: magic, minimum length)."""
    plen = len(payload)
    if plen < FIXED_HEADER_SIZE + _TRANSPORT_SIZE:
        raise container_rules.DESCRIPTOR_PAYLOAD.violation(
            f"payload_length {plen} cannot hold a descriptor and the {_TRANSPORT_SIZE} transport bytes",
            at + _MSG_AT["payload_length"])
    length = peek_descriptor_length(payload, at + _MSG_SIZE)
    if length + _TRANSPORT_SIZE != plen:
        raise container_rules.DESCRIPTOR_PAYLOAD.violation(
            f"payload_length {plen} is not descriptor_length {length} + {_TRANSPORT_SIZE}",
            at + _MSG_AT["payload_length"])
    return length


def _located_descriptor_payload(payload, at: int):
    """:func:`_descriptor_length_in_payload` for ``COLLECT``: the descriptor's length, or
    the ``stream.descriptor.payload`` fault part; a header refused for its own bytes
    (magic, minimum length) gives the whole payload's length, for the descriptor's decode
    to name (the same rule at the same offset as the reader)."""
    try:
        return _descriptor_length_in_payload(payload, at)
    except SpecViolation as exc:
        if exc.rule_id != container_rules.DESCRIPTOR_PAYLOAD.id:
            return len(payload)
        return Part(FAULT, exc.offset, exc.offset, fault=violation_finding(exc))


def check_message_header(h: dict, at: int, limits: Limits, *, max_payload: Optional[int] = None,
                         private: frozenset = frozenset()) -> MessageType | int:
    """The checks every received message header passes (``interchange.md § Message Framing``,
    ``§ Message Types``), whatever reads it: the stream reader, the session client and
    server.  ``max_payload`` is what this receiver advertised in its hello (a session), else
    the reader's ``max_message_bytes`` limit applies; ``private`` are the private message types
    agreed with the peer (returned as plain ints).  Returns the message type."""
    if h["stream_id"] == RESERVED_STREAM_ID:
        raise container_rules.MESSAGE_STREAM_ID.violation("stream_id 0 is reserved", at + _MSG_AT["stream_id"])
    n = h["payload_length"]
    if max_payload is not None:
        if n > max_payload:
            raise session_rules.MESSAGE_SIZE.violation(
                f"payload_length {n} exceeds the {max_payload} bytes this receiver accepts",
                at + _MSG_AT["payload_length"])
    elif n > limits.max_message_bytes:
        limits.check("max_message_bytes", n, at + _MSG_AT["payload_length"])
    raw = h["message_type"]
    kind = _MESSAGE_TYPES.get(raw)
    if kind is not None:
        return kind
    if PRIVATE_MESSAGE_FIRST <= raw <= PRIVATE_MESSAGE_LAST:
        if raw in private:
            return raw
        raise session_rules.MESSAGE_PRIVATE.violation(
            f"private message type 0x{raw:08X} was not agreed with this receiver", at)
    raise container_rules.MESSAGE_TYPE.violation(f"message_type 0x{raw:08X} is not a message type this reader knows",
                                                 at)


def _message_header(window: Window, limits: Limits):
    at = window.pos
    raw = window.read(_MSG_SIZE)
    if len(raw) < _MSG_SIZE:
        raise container_rules.MESSAGE_TRUNCATED.violation(
            f"the stream ends {len(raw)} bytes into a {_MSG_SIZE}-byte message header", window.pos)
    h, _ = _MSG.unpack(raw)
    h["message_type"] = check_message_header(h, at, limits)
    return at, h


def _payload(window: Window, n: int, at: int):
    data = window.read(n)
    if len(data) < n:
        raise container_rules.MESSAGE_TRUNCATED.violation(
            f"the message at byte {at} announces {n} payload bytes, the stream has {len(data)}", window.pos)
    return data


class TensorFrames:
    """One tensor's messages on one stream, as every receiver checks them
    (``interchange.md § Ordering Invariant``, ``§ TENSOR_DESCRIPTOR Payload``,
    ``§ TENSOR_DATA Payload``): :meth:`open` on its TENSOR_DESCRIPTOR, :meth:`frame` per
    TENSOR_DATA header, :meth:`end` on TENSOR_DATA_END.  Offsets are those of the input."""

    __slots__ = ("desc", "start", "total", "received", "transport")

    def __init__(self, desc: TensorDescriptor, start: int, total: int, transport: dict):
        self.desc = desc
        self.start = start
        self.total = total
        self.received = 0
        self.transport = transport

    @classmethod
    def open(cls, payload, at: int, describe: "Describe", limits: Limits) -> tuple[Part, "TensorFrames"]:
        """The descriptor part of the TENSOR_DESCRIPTOR message at ``at`` and the checker of
        its frames; the transport fields are checked against the descriptor."""
        pstart = at + _MSG_SIZE
        length = _descriptor_length_in_payload(payload, at)
        part = describe(payload[:length], pstart, 0)
        desc = part.value
        t, _ = _TRANSPORT.unpack(payload, length)
        if t["total_shards"] < 1 or t["shard_index"] >= t["total_shards"]:
            raise container_rules.TRANSPORT_SHARDS.violation(
                f"shard_index {t['shard_index']} / total_shards {t['total_shards']}", pstart + length + _SHARD_INDEX_AT)
        expected = sum(b.byte_size for b in desc.buffers)
        if t["total_data_bytes"] != expected:
            raise container_rules.TOTAL_DATA_BYTES.violation(
                f"total_data_bytes {t['total_data_bytes']} but the buffers hold {expected} bytes", pstart + length)
        for b in desc.buffers:
            if b.byte_size > limits.max_buffer_bytes:
                limits.check("max_buffer_bytes", b.byte_size, pstart)
        return part, cls(desc, at, expected, t)

    def frame(self, plen: int, offset_in_buffer: Optional[int], at: int) -> int:
        """Check the TENSOR_DATA message at ``at`` (``offset_in_buffer`` None: its payload cannot
        hold the field) and count its bytes; returns the frame's data length."""
        pstart = at + _MSG_SIZE
        if offset_in_buffer is None:
            raise container_rules.DATA_FRAME.violation(
                f"a TENSOR_DATA payload of {plen} bytes cannot hold byte_offset_in_buffer", at + _MSG_AT["payload_length"])
        n = plen - _DATA_SIZE
        if offset_in_buffer != self.received:
            raise container_rules.DATA_FRAME.violation(
                f"byte_offset_in_buffer {offset_in_buffer}, expected {self.received} (frames are contiguous "
                "and ascending)", pstart)
        if self.received + n > self.total:
            raise container_rules.DATA_FRAME.violation(
                f"frame ends at {self.received + n}, past total_data_bytes {self.total}", pstart)
        self.received += n
        return n

    def end(self, plen: int, at: int) -> None:
        """Check the TENSOR_DATA_END message at ``at``: empty, and every byte arrived."""
        if plen:
            raise container_rules.DATA_END_PAYLOAD.violation(f"TENSOR_DATA_END carries {plen} payload bytes",
                                                             at + _MSG_AT["payload_length"])
        if self.received != self.total:
            raise container_rules.DATA_SUM.violation(
                f"frames carried {self.received} bytes, total_data_bytes is {self.total}", at)


def _messages_strict(window: Window, describe: Describe, mode: Mode, limits: Limits) -> Iterator[Part]:
    current: Optional[TensorFrames] = None
    index = 0  # the kinds are tested most frequent first (they exclude one another)
    while not window.at_eof():
        at, h = _message_header(window, limits)
        kind, plen = h["message_type"], h["payload_length"]
        pstart = at + _MSG_SIZE
        yield part_from_fields((MESSAGE, at, pstart + plen, None, h, None, "", (), index, 0))
        index += 1
        if kind == MessageType.TENSOR_DATA:
            if current is None:
                raise container_rules.MESSAGE_ORDER.violation(
                    "TENSOR_DATA outside a tensor (no TENSOR_DESCRIPTOR before it)", at)
            if plen < _DATA_SIZE:
                current.frame(plen, None, at)
            payload = _payload(window, plen, at)
            (offset_in_buffer,) = _DATA_OFFSET_CODEC.unpack_from(payload)
            if current.frame(plen, offset_in_buffer, at):
                yield part_from_fields((DATA, pstart + _DATA_SIZE, pstart + plen, None, payload[_DATA_SIZE:], None, "",
                                        (), 0, 0))
            continue
        if kind == MessageType.TENSOR_DESCRIPTOR:
            if current is not None:
                raise container_rules.MESSAGE_ORDER.violation(
                    f"TENSOR_DESCRIPTOR before the TENSOR_DATA_END of the tensor at byte {current.start}", at)
            part, current = TensorFrames.open(_payload(window, plen, at), at, describe, limits)
            yield part
            yield part_from_fields((TRANSPORT, part.end, pstart + plen, TENSOR_DESCRIPTOR_FIELDS, current.transport,
                                    None, "", (), 0, 0))
            continue
        if kind == MessageType.TENSOR_DATA_END:
            if current is None:
                raise container_rules.MESSAGE_ORDER.violation("TENSOR_DATA_END outside a tensor", at)
            current.end(plen, at)
            yield part_from_fields((TENSOR_END, at, pstart, MESSAGE_HEADER, current.desc, None, "", (), current.start,
                                    0))
            current = None
            continue
        if kind in (MessageType.PING, MessageType.PONG):
            _payload(window, plen, at)
            continue
        if kind == MessageType.ERROR:
            raise _remote_error(bytes(_payload(window, plen, at)), at)
        raise container_rules.MESSAGE_ORDER.violation(f"{kind.name} does not belong in a tensor data stream", at)
    if current is not None:
        raise container_rules.STREAM_TRUNCATED.violation(
            f"the stream ends before the TENSOR_DATA_END of the tensor at byte {current.start}", window.pos)


REMOTE_ERRORS: dict[int, type] = {
    ErrorCode.PROTOCOL_VERSION_MISMATCH: errors.ProtocolVersionMismatch,
    ErrorCode.UNKNOWN_TENSOR: errors.UnknownTensor,
    ErrorCode.LAYOUT_UNAVAILABLE: errors.LayoutUnavailable,
    ErrorCode.TRANSCODE_LIMIT_EXCEEDED: errors.TranscodeLimitExceeded,
    ErrorCode.DEVICE_UNAVAILABLE: errors.DeviceUnavailable,
    ErrorCode.INVALID_MESSAGE: errors.InvalidMessage,
    ErrorCode.MESSAGE_TOO_LARGE: errors.MessageTooLarge,
    ErrorCode.SHARD_MISMATCH: errors.ShardMismatch,
}
"""The :class:`RemoteError` subclass of each ``error_code`` (``interchange.md § ERROR Payload``)."""


def remote_error(error_code: int, message: str, offset: Optional[int]) -> RemoteError:
    """The :class:`RemoteError` subclass for ``error_code`` (the base class for an
    implementation-defined or unknown code)."""
    return REMOTE_ERRORS.get(error_code, RemoteError)(error_code, message, offset)


def _remote_error(payload: bytes, at: int) -> RemoteError:
    code, message = 0, payload.decode("utf-8", "replace")
    if len(payload) >= _ERROR.fixed_size:
        e, _ = _ERROR.unpack(payload)
        code = e["error_code"]
        message = payload[_ERROR.fixed_size : _ERROR.fixed_size + e["message_length"]].decode("utf-8", "replace")
    return remote_error(code, message, at)


# --------------------------------------------------------------------------------------
# What the first bytes say
# --------------------------------------------------------------------------------------


DETECT_BYTES = 16
"""How many first bytes :func:`detect_kind` looks at (a peek of that many is enough)."""


def detect_kind(data) -> str:
    """``file``, ``descriptor``, ``stream`` (bare), ``messages`` or ``unknown``, from the
    first bytes: the file magic, the descriptor magic (a stream when more bytes follow
    ``descriptor_length``), or a known ``message_type``."""
    view = memoryview(data)
    head = bytes(view[:DETECT_BYTES])
    if head.startswith(FILE_MAGIC):
        return "file"
    if head.startswith(DESCRIPTOR_MAGIC):
        if len(head) >= _DESCRIPTOR_LENGTH_AT + _LENGTH_FIELD.size:
            (length,) = _LENGTH_FIELD.unpack_from(head, _DESCRIPTOR_LENGTH_AT)
            if length < len(view):
                return "stream"
        return "descriptor"
    if len(head) >= _MSG_SIZE and _MSG.unpack(head)[0]["message_type"] in _KNOWN_MESSAGE_TYPES:
        return "messages"
    return "unknown"


KIND_EXTENSIONS = {".desc": "descriptor", ".stream": "stream", ".msgs": "messages", ".hrry": "file"}
"""The path extensions that name a kind when the first bytes do not: ``.hrry`` (the file
format's own, ``file-format.md``) and the conformance corpus' ``.desc`` / ``.stream`` / ``.msgs``."""

_KIND_WORDS = {"descriptor": "a lone descriptor", "stream": "a bare stream", "messages": "a message stream",
               "file": "a Hurray file"}


@attrs.frozen(slots=True)
class KindChoice:
    """How an input is read when its kind was not given: ``kind`` (descriptor, stream,
    messages or file), ``source`` -- ``content`` (its first bytes), ``extension`` (they name
    no kind, the path's extension does) or ``default`` (neither: a bare stream) -- and
    ``reason``, one sentence saying why."""

    kind: str
    source: str
    reason: str

    @property
    def assumed(self) -> bool:
        """True when the first bytes did not name the kind."""
        return self.source != "content"


def choose_kind(data, name=None) -> KindChoice:
    """The kind to read ``data`` as: what :func:`detect_kind` finds in its first bytes; when
    they name none (a damaged magic, an invalid or cut first message header), the extension
    of the path ``name`` (:data:`KIND_EXTENSIONS`); else a bare stream, whose reader then
    reports the bytes' fault (``descriptor.magic``)."""
    found = detect_kind(data)
    if found != "unknown":
        return KindChoice(found, "content", f"its first bytes are those of {_KIND_WORDS[found]}")
    unnamed = "its first bytes name no kind (no file or descriptor magic, no valid message header)"
    suffix = os.path.splitext(os.fspath(name))[1].lower() if isinstance(name, (str, os.PathLike)) else ""
    kind = KIND_EXTENSIONS.get(suffix)
    if kind is not None:
        return KindChoice(kind, "extension", f"{unnamed}; the path's extension {suffix} names {_KIND_WORDS[kind]}")
    ending = f"nor does the path's extension {suffix}" if suffix else "and no path extension names one"
    return KindChoice("stream", "default", f"{unnamed}, {ending}: read as a bare stream")


# --------------------------------------------------------------------------------------
# File
# --------------------------------------------------------------------------------------

FILE_HEADER_PART = "file header"
TRAILER_PART = "trailer"
INDEX_PART = "index"
KV_PART = "kv"
TENSOR_DATA = "tensor data"

_HEADER = plan(FILE_HEADER)
_TRAILER = plan(TRAILER)
_COUNT = plan(INDEX_COUNT)
_NAME_LEN = plan(INDEX_NAME_LENGTH)
_ENTRY = plan(INDEX_ENTRY_FIELDS)
_MIN_ENTRY = _NAME_LEN.fixed_size + 1 + _ENTRY.fixed_size
_NAME_LENGTH_CODEC = _NAME_LEN.steps[0].codec
_ENTRY_FORMAT, _ENTRY_SLOTS = _ENTRY.flat_layout()
_ENTRY_CODEC = struct.Struct("<" + _ENTRY_FORMAT)
"""The entry fields in one unpack (the reader's index loop); their order is the declaration's."""
assert tuple(name for name, _, _ in _ENTRY_SLOTS) == (
    "descriptor_offset", "descriptor_length", "data_offset", "data_length", "flags"), _ENTRY_SLOTS
_H = {name: static_offset(FILE_HEADER, name) for name in (
    "container_version_major", "_reserved", "file_flags", "data_buffer_alignment", "first_descriptor_offset",
    "_reserved_header")}
_T = {name: static_offset(TRAILER, name) for name in (
    "index_offset", "index_length", "kv_offset", "kv_length", "index_crc32c", "_reserved", "trailer_magic")}
_E = {name: static_offset(INDEX_ENTRY_FIELDS, name) for name in (
    "descriptor_offset", "descriptor_length", "data_offset", "data_length", "flags")}


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def buffer_spans(desc: TensorDescriptor, data_offset: int, alignment: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each data buffer of ``desc`` placed from ``data_offset``:
    the first at ``data_offset``, each next one at the following alignment boundary
    (``file-format.md § Data Buffer Placement``)."""
    spans, pos = [], data_offset
    for i, handle in enumerate(desc.buffers):
        if i:
            pos = _align(pos, alignment)
        spans.append((pos, handle.byte_size))
        pos += handle.byte_size
    return spans


@attrs.frozen(slots=True)
class IndexEntry:
    """One index entry (``file-format.md § Index Encoding``), plus where it sits."""

    name: str
    descriptor_offset: int
    descriptor_length: int
    data_offset: int
    data_length: int
    flags: int = 0
    entry_offset: int = attrs.field(default=0, eq=False, repr=False)
    """Absolute offset of the entry's name_length field inside the index."""


def walk_file(view: memoryview, describe: Describe, *, faults: Faults, mode: Mode,
              limits: Limits = DEFAULT_LIMITS) -> Iterator[Part]:
    """Parts of a ``.hrry`` file in the order of the reader protocol (``file-format.md §
    Reader Protocol``): ``file header``, ``trailer``, ``index`` (value: the entries),
    ``kv``, then per tensor in descriptor order its descriptor part and ``tensor data``
    (``note``: the tensor's name; value: the ``(offset, size)`` of each buffer).  A ``fault`` part
    whose ``decl`` is set is a table that does not fit in what remains.

    ``RAISE`` is the reader: every container rule is checked, the first fault raises.
    ``COLLECT`` and ``ANNOTATE`` only locate: the header, then the tensors in descriptor
    order (through the index as far as it can be read, else by walking the tensor region;
    an ``entry`` part before each descriptor), the ``kv`` and ``index`` sections and the
    trailer, yielding a ``fault`` part where the bytes do not hold what they must."""
    if faults is Faults.RAISE:
        return _file_strict(view, describe, mode, limits)
    return _file_located(view, describe, faults, mode)


# -- the reader ---------------------------------------------------------------------------


def _strict_sections(view: memoryview, mode: Mode, limits: Limits):
    """The parts before the tensors (header, trailer, index, kv), checked; returns the
    header fields, the index entries in descriptor order and the :class:`TensorRegion`."""
    h, t = check_ends(view, limits)
    size = len(view)
    yield Part(FILE_HEADER_PART, 0, FILE_HEADER_SIZE, FILE_HEADER, h)
    yield Part(TRAILER_PART, size - TRAILER_SIZE, size, TRAILER, t)
    entries = _strict_index(view, h, t, limits)
    yield Part(INDEX_PART, t["index_offset"], t["index_offset"] + t["index_length"], INDEX_ENTRY_FIELDS,
               tuple(entries))
    yield _strict_kv(view, h, t, mode, limits)
    return h, sorted(entries, key=lambda e: e.descriptor_offset), TensorRegion.of(h, t)


_UNKNOWN_FILE_FLAGS = ~int(KNOWN_FILE_FLAGS)
_HAS_INDEX_CRC32C = int(FileFlag.HAS_INDEX_CRC32C)
_SORTED_INDEX = int(FileFlag.SORTED_INDEX)
"""The file flags as plain ints: ``IntFlag`` arithmetic runs in Python, and a reader tests them on every open."""


def check_ends(view, limits: Limits) -> tuple[dict, dict]:
    """The file header and the trailer (with the index CRC) checked, the first fault raised
    (``file-format.md § File Header``, ``§ Trailer``); their fields."""
    size = len(view)
    head = bytes(view[:FILE_HEADER_SIZE])
    if len(head) >= len(FILE_MAGIC) and head[: len(FILE_MAGIC)] != FILE_MAGIC:
        raise container_rules.FILE_MAGIC.violation(
            f"the file starts with {head[:len(FILE_MAGIC)]!r}, not {FILE_MAGIC!r}", 0)
    if size < FILE_HEADER_SIZE + TRAILER_SIZE:
        raise container_rules.FILE_TOO_SHORT.violation(
            f"{size} bytes cannot hold the {FILE_HEADER_SIZE}-byte header and {TRAILER_SIZE}-byte trailer", size)
    h, _ = _HEADER.unpack(head, 0)
    _check_header(h, size)
    t, _ = _TRAILER.unpack(view[size - TRAILER_SIZE:size], 0)
    _check_trailer(view, h, t, limits)
    return h, t


def _check_header(h: dict, size: int) -> None:
    if h["container_version_major"] > SUPPORTED_CONTAINER_MAJOR:
        raise container_rules.FILE_VERSION.violation(
            f"container_version_major {h['container_version_major']} is newer than {SUPPORTED_CONTAINER_MAJOR}",
            _H["container_version_major"])
    for name in ("_reserved", "_reserved_header"):
        if any(h[name]):
            raise container_rules.FILE_HEADER_RESERVED.violation(f"header field {name} is not zero", _H[name])
    flags = h["file_flags"]
    if flags & _UNKNOWN_FILE_FLAGS:
        raise container_rules.FILE_FLAGS_RESERVED.violation(
            f"reserved file_flags bits 0x{flags & _UNKNOWN_FILE_FLAGS:08X} are set", _H["file_flags"])
    a = h["data_buffer_alignment"]
    if a & (a - 1) or not MIN_DATA_BUFFER_ALIGNMENT <= a <= MAX_DATA_BUFFER_ALIGNMENT:
        raise container_rules.FILE_ALIGNMENT.violation(
            f"data_buffer_alignment {a} is not a power of two in [{MIN_DATA_BUFFER_ALIGNMENT}, "
            f"{MAX_DATA_BUFFER_ALIGNMENT}]", _H["data_buffer_alignment"])
    first = h["first_descriptor_offset"]
    if first < FILE_HEADER_SIZE or first % DESCRIPTOR_ALIGNMENT or first > size - TRAILER_SIZE:
        raise container_rules.FILE_FIRST_DESCRIPTOR.violation(
            f"first_descriptor_offset {first} is not an 8-aligned offset in [64, {size - TRAILER_SIZE}]",
            _H["first_descriptor_offset"])


def _check_trailer(view: memoryview, h: dict, t: dict, limits: Limits) -> None:
    base = len(view) - TRAILER_SIZE
    if t["trailer_magic"] != TRAILER_MAGIC:
        raise container_rules.TRAILER_MAGIC.violation(
            f"trailer_magic is {t['trailer_magic']!r}, not {TRAILER_MAGIC!r}", base + _T["trailer_magic"])
    if any(t["_reserved"]):
        raise container_rules.TRAILER_RESERVED.violation("trailer _reserved is not zero", base + _T["_reserved"])
    index_at, index_length = t["index_offset"], t["index_length"]
    if index_at < FILE_HEADER_SIZE or index_at + index_length > base or index_length < _COUNT.fixed_size:
        raise container_rules.INDEX_BOUNDS.violation(
            f"index at {index_at} length {index_length} is not between the header and the trailer at {base}",
            base + _T["index_offset"])
    if index_at % SECTION_ALIGNMENT:
        raise container_rules.INDEX_ALIGNMENT.violation(
            f"index_offset {index_at} is not a multiple of 8", base + _T["index_offset"])
    limits.check("max_index_bytes", index_length, base + _T["index_length"])
    crc = t["index_crc32c"]
    if h["file_flags"] & _HAS_INDEX_CRC32C:
        actual = crc32c(view[index_at : index_at + index_length])
        if actual != crc:
            raise container_rules.INDEX_CRC.violation(
                f"index_crc32c is 0x{crc:08X}, the index bytes give 0x{actual:08X}", base + _T["index_crc32c"])
    elif crc:
        raise container_rules.INDEX_CRC_UNSET.violation(
            f"index_crc32c is 0x{crc:08X} although HAS_INDEX_CRC32C is clear", base + _T["index_crc32c"])


def _strict_index(view: memoryview, h: dict, t: dict, limits: Limits) -> list[IndexEntry]:
    index_at, end = t["index_offset"], t["index_offset"] + t["index_length"]
    section = view[index_at:end]  # read at pos - index_at: offsets stay the file's
    count = _COUNT.unpack(section, 0)[0]["index_entry_count"]
    pos = index_at + _COUNT.fixed_size
    if count * _MIN_ENTRY > end - pos:
        raise container_rules.INDEX_TRUNCATED.violation(
            f"index_entry_count {count} cannot fit in the {end - pos} bytes of index that follow", index_at)
    limits.check("max_index_entries", count, index_at)
    entries, seen = [], set()
    for _ in range(count):
        at = pos
        if pos + _NAME_LEN.fixed_size > end:
            raise container_rules.INDEX_TRUNCATED.violation("an index entry runs past index_length", pos)
        (n,) = _NAME_LENGTH_CODEC.unpack_from(section, pos - index_at)
        pos += _NAME_LEN.fixed_size
        if pos + n + _ENTRY.fixed_size > end:
            raise container_rules.INDEX_TRUNCATED.violation("an index entry runs past index_length", at)
        raw = bytes(section[pos - index_at : pos - index_at + n])
        pos += n
        if not raw:
            raise container_rules.INDEX_NAME.violation("name_length is 0", at)
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise container_rules.INDEX_NAME.violation(f"tensor name is not valid UTF-8 ({exc.reason})",
                                         at + _NAME_LEN.fixed_size) from None
        if raw in seen:
            raise container_rules.INDEX_DUPLICATE.violation(f"tensor name {name!r} appears twice in the index", at)
        seen.add(raw)
        descriptor_offset, descriptor_length, data_offset, data_length, flags = _ENTRY_CODEC.unpack_from(
            section, pos - index_at)
        pos += _ENTRY.fixed_size
        if flags:
            raise container_rules.INDEX_FLAGS.violation(
                f"entry {name!r} has flags 0x{flags:08X}", at + _NAME_LEN.fixed_size + n + _E["flags"])
        entries.append(IndexEntry(name, descriptor_offset, descriptor_length, data_offset, data_length, flags, at))
    if pos != end:
        raise container_rules.INDEX_TRUNCATED.violation(
            f"{end - pos} bytes follow the last of the {count} index entries inside index_length", pos)
    if h["file_flags"] & FileFlag.SORTED_INDEX:
        for prev, nxt in zip(entries, entries[1:]):
            if prev.name.encode("utf-8") > nxt.name.encode("utf-8"):
                raise container_rules.INDEX_SORTED.violation(
                    f"SORTED_INDEX is set but {prev.name!r} comes before {nxt.name!r}", nxt.entry_offset)
    return entries


def _strict_kv(view: memoryview, h: dict, t: dict, mode: Mode, limits: Limits) -> Part:
    kv_at, kv_length = t["kv_offset"], t["kv_length"]
    base = len(view) - TRAILER_SIZE
    findings = []
    has_flag = bool(h["file_flags"] & FileFlag.HAS_KV_METADATA)
    if has_flag != bool(kv_length):
        findings.append(container_rules.KV_FLAG.finding(
            f"HAS_KV_METADATA is {'set' if has_flag else 'clear'} but kv_length is {kv_length}", _H["file_flags"], mode))
    if not kv_length:
        return Part(KV_PART, kv_at, kv_at, KV_COUNT, {}, findings=tuple(findings))
    if kv_at < FILE_HEADER_SIZE or kv_at % SECTION_ALIGNMENT or kv_at + kv_length > t["index_offset"]:
        raise container_rules.KV_BOUNDS.violation(
            f"KV section at {kv_at} length {kv_length} is not an 8-aligned range between the header and the index",
            base + _T["kv_offset"])
    limits.check("max_kv_bytes", kv_length, base + _T["kv_length"])
    value = decode_kv(view[kv_at : kv_at + kv_length], kv_at, limits)
    return Part(KV_PART, kv_at, kv_at + kv_length, KV_COUNT, value, findings=tuple(findings))


def _file_strict(view: memoryview, describe: Describe, mode: Mode, limits: Limits) -> Iterator[Part]:
    """The reader's walk: the sections, then each tensor in descriptor order (this loop is
    the generator the reader iterates, so a tensor's parts pass through no other)."""
    h, ordered, region = yield from _strict_sections(view, mode, limits)
    previous_end, previous = region.first, None
    for e in ordered:
        part, spans, previous_end = check_tensor(view, e, describe, region, previous_end, previous)
        yield part
        yield part_from_fields((TENSOR_DATA, e.data_offset, e.data_offset + e.data_length, None, spans, None, e.name,
                                (), 0, 0))
        previous = e.name


@attrs.frozen(slots=True)
class TensorRegion:
    """Where a file's tensors may lie (``file-format.md § Descriptor Placement``): from
    ``first_descriptor_offset`` to the first of the KV section and the index, buffers on
    ``data_buffer_alignment`` boundaries."""

    first: int
    end: int
    alignment: int

    @classmethod
    def of(cls, header: dict, trailer: dict) -> "TensorRegion":
        """The region of the file with this header and trailer (fields checked already)."""
        index_at = trailer["index_offset"]
        end = min(index_at, trailer["kv_offset"]) if trailer["kv_length"] else index_at
        return cls(header["first_descriptor_offset"], end, header["data_buffer_alignment"])


def check_tensor(view, e: IndexEntry, describe: Describe, region: TensorRegion, previous_end: int,
                 previous: Optional[str]) -> tuple[Part, list, int]:
    """One tensor of a file as the reader takes it, after the tensor before it in descriptor
    order (``previous``, which ends at ``previous_end``): its descriptor's placement and length
    against its index entry, the descriptor itself (``describe``), then its data's placement;
    the first fault raises.  Returns the descriptor part, the ``(offset, size)`` of each buffer
    and where the tensor ends.  The file reader runs it on every tensor at open, or on a tensor's
    first read (:mod:`.file_index`), with the same rule and offset either way."""
    off, first, region_end, a = e.descriptor_offset, region.first, region.end, region.alignment
    if off % DESCRIPTOR_ALIGNMENT:
        raise container_rules.DESCRIPTOR_ALIGNMENT.violation(
            f"descriptor of {e.name!r} at {off} is not 8-aligned", _entry_field(e, "descriptor_offset"))
    if off < first or off + FIXED_HEADER_SIZE > region_end:
        raise container_rules.INDEX_DESCRIPTOR_BOUNDS.violation(
            f"descriptor of {e.name!r} at {off} is outside the tensor region [{first}, {region_end})",
            _entry_field(e, "descriptor_offset"))
    if off < previous_end:
        raise container_rules.INDEX_OVERLAP.violation(
            f"descriptor of {e.name!r} at {off} lies inside the tensor {previous!r} (which ends at "
            f"{previous_end})", _entry_field(e, "descriptor_offset"))
    length = peek_descriptor_length(view[off : off + FIXED_HEADER_SIZE].tobytes(), off)
    if length != e.descriptor_length:
        raise container_rules.INDEX_DESCRIPTOR_LENGTH.violation(
            f"index says descriptor_length {e.descriptor_length} for {e.name!r}, the descriptor says {length}",
            _entry_field(e, "descriptor_length"))
    if off + length > region_end:
        raise container_rules.INDEX_DESCRIPTOR_BOUNDS.violation(
            f"descriptor of {e.name!r} ({length} bytes at {off}) runs past the tensor region end {region_end}",
            _entry_field(e, "descriptor_offset"))
    part = describe(view[off : off + length].tobytes(), off, 0)  # as bytes: a header compiled before decodes it
    end = off + length
    data_offset, data_length = e.data_offset, e.data_length
    if part.value.buffers:
        if data_offset % a:
            raise container_rules.DATA_ALIGNMENT.violation(
                f"data of {e.name!r} at {data_offset} is not a multiple of data_buffer_alignment {a}",
                _entry_field(e, "data_offset"))
        if data_offset < end:
            raise container_rules.INDEX_OVERLAP.violation(
                f"data of {e.name!r} at {data_offset} starts inside its descriptor (ends at {end})",
                _entry_field(e, "data_offset"))
        spans = buffer_spans(part.value, data_offset, a)
        last, size = spans[-1]
        if data_length != last + size - data_offset:
            raise container_rules.DATA_LENGTH.violation(
                f"data_length of {e.name!r} is {data_length}, its buffers span {last + size - data_offset}",
                _entry_field(e, "data_length"))
        if last + size > region_end:
            raise container_rules.DATA_BOUNDS.violation(
                f"buffers of {e.name!r} end at {last + size}, past the tensor region end {region_end} "
                "(truncated data)", _entry_field(e, "data_length"))
        if last + size > end:
            end = last + size
    else:
        spans = []
        if data_length:
            raise container_rules.DATA_LENGTH.violation(
                f"{e.name!r} has no buffers but data_length {data_length}", _entry_field(e, "data_length"))
        if end <= data_offset <= region_end:
            end = data_offset  # a writer that padded after the head (the reference)
    return part, spans, end


def _entry_field(e: IndexEntry, field: str) -> int:
    """Absolute offset of ``field`` in the index entry ``e`` (after its name)."""
    return e.entry_offset + _NAME_LEN.fixed_size + len(e.name.encode("utf-8")) + _E[field]


# -- locating only (audit, the annotated view) ----------------------------------------------


def _file_located(view: memoryview, describe: Describe, faults: Faults, mode: Mode) -> Iterator[Part]:
    size = len(view)
    if FILE_HEADER_SIZE > size:
        yield Part(FAULT, 0, 0, FILE_HEADER, note="the file header does not fit")
        return
    header, _ = _HEADER.unpack(view, 0)
    yield Part(FILE_HEADER_PART, 0, FILE_HEADER_SIZE, FILE_HEADER, header)
    if size < FILE_HEADER_SIZE + TRAILER_SIZE:
        yield Part(FAULT, size, size, note="the file is too short to hold a trailer")
        return
    trailer_at = size - TRAILER_SIZE
    trailer, _ = _TRAILER.unpack(view, trailer_at)
    entries = _located_index(view, trailer)
    if not entries:
        entries = _scan_region(view, header, trailer_at)
        if entries:
            yield Part(FAULT, header["first_descriptor_offset"], header["first_descriptor_offset"],
                       note="the index cannot be read: tensors found by walking the tensor region from "
                            "first_descriptor_offset (file-format.md § Descriptor Placement)")
    nesting = Nesting()
    for e in sorted(entries, key=lambda e: e.descriptor_offset):  # descriptor order: the write order
        off, n = e.descriptor_offset, e.descriptor_length
        if off >= size:
            yield Part(FAULT, off, off, note=f"index entry {e.name!r} points past the end of the file")
            continue
        yield Part(ENTRY, off, off, INDEX_ENTRY_FIELDS, e)
        window = view[off:] if n == 0 or faults is Faults.COLLECT else view[off : min(size, off + max(n, 0))]
        part = describe(window, off, nesting.depth())
        yield part._replace(note=e.name)
        if part.value is not None:
            if e.data_length:
                yield Part(TENSOR_DATA, e.data_offset, e.data_offset + e.data_length, value=None, note=e.name,
                           depth=part.depth)
            nesting.arrive(part.value)
    if trailer["kv_length"]:
        yield Part(KV_PART, trailer["kv_offset"], trailer["kv_offset"] + trailer["kv_length"], KV_COUNT)
    yield Part(INDEX_PART, trailer["index_offset"], trailer["index_offset"] + trailer["index_length"], INDEX_COUNT)
    yield Part(TRAILER_PART, trailer_at, size, TRAILER, trailer)


def _located_index(view: memoryview, trailer: dict) -> list[IndexEntry]:
    """The index entries as far as they can be read (no rule checked); none when an entry
    is cut off inside the index section."""
    off, n = trailer["index_offset"], trailer["index_length"]
    if off > len(view) or n > len(view) - off:
        return []
    entries = []
    for part in walk_index(view[: off + n], off):
        if part.kind == ENTRY:
            entries.append(part.value)
        elif part.kind == FAULT and (part.depth >= 0 or part.decl is not None):
            return []
    return entries


def walk_index(view: memoryview, off: int) -> Iterator[Part]:
    """Located parts of the index section at ``off`` (``file-format.md § Index Encoding``),
    ``view`` ending where the section ends; locating only (the reader's checks are in
    ``walk_file``).  The ``index_entry_count`` table, then per entry ``entry start``, the
    ``name_length`` table, the ``name``, the entry fields table and an ``entry`` part (value:
    the :class:`IndexEntry`).  A ``fault`` part ends the walk: with a ``decl``, that table
    does not fit; at depth -1 the next entry is missing, at depth 0 an entry is cut off."""
    end = len(view)
    if _COUNT.fixed_size > end - off:
        yield Part(FAULT, off, off, INDEX_COUNT, depth=-1)
        return
    values, pos = _COUNT.unpack(view, off)
    yield Part(TABLE, off, pos, INDEX_COUNT, values, depth=-1)
    for i in range(values["index_entry_count"]):
        if pos >= end:
            yield Part(FAULT, pos, pos, note=f"index entry {i} starts past the index section", depth=-1)
            return
        at = pos
        yield Part(ENTRY_START, at, at, index=i, depth=-1)
        if _NAME_LEN.fixed_size > end - pos:
            yield Part(FAULT, pos, pos, INDEX_NAME_LENGTH)
            return
        v, pos = _NAME_LEN.unpack(view, pos)
        yield Part(TABLE, pos - _NAME_LEN.fixed_size, pos, INDEX_NAME_LENGTH, v)
        length = v["name_length"]
        if length > end - pos:
            yield Part(FAULT, pos, pos, note=f"name needs {length} bytes, {end - pos} remain")
            return
        name = bytes(view[pos : pos + length])
        yield Part(NAME, pos, pos + length, value=name)
        pos += length
        if _ENTRY.fixed_size > end - pos:
            yield Part(FAULT, pos, pos, INDEX_ENTRY_FIELDS)
            return
        f, pos = _ENTRY.unpack(view, pos)
        yield Part(TABLE, pos - _ENTRY.fixed_size, pos, INDEX_ENTRY_FIELDS, f)
        entry = IndexEntry(name.decode("utf-8", "replace"), f["descriptor_offset"], f["descriptor_length"],
                           f["data_offset"], f["data_length"], f["flags"], at)
        yield Part(ENTRY, at, pos, INDEX_ENTRY_FIELDS, entry, index=i)


def _scan_region(view: memoryview, header: dict, end: int) -> list[IndexEntry]:
    """Pseudo index entries found by walking descriptors from ``first_descriptor_offset``:
    each descriptor on an 8-byte boundary, its buffers each on ``data_buffer_alignment``
    (``file-format.md § Descriptor Placement``, ``§ Data Buffer Placement``)."""
    align = header["data_buffer_alignment"]
    if align < 1 or align & (align - 1):
        return []
    pos, found = header["first_descriptor_offset"], []
    while pos + FIXED_HEADER_SIZE <= end and bytes(view[pos : pos + len(DESCRIPTOR_MAGIC)]) == DESCRIPTOR_MAGIC:
        try:
            desc, _ = parse_descriptor(view[pos:end], mode="permissive", base=pos)
        except HurraySchemaError:
            break
        n = desc.encoded_length
        data = cursor = _align(pos + n, align) if desc.buffers else pos + n
        for i, handle in enumerate(desc.buffers):
            if i:
                cursor = _align(cursor, align)
            cursor += handle.byte_size
        found.append(IndexEntry(f"@{pos}", pos, n, data, cursor - data if desc.buffers else 0))
        pos = _align(cursor, DESCRIPTOR_ALIGNMENT)
    return found
