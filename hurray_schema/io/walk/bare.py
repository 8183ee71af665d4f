"""The walk of a bare stream (``interchange.md § Scope``): per tensor its descriptor, then its
buffers in buffer-table order, back to back, no padding, to the end of the input.

One walk serves every reader of a bare stream.  Per tensor it takes two steps, chosen once
by the fault policy, and says where each lies:

* **the descriptor** -- ``RAISE`` frames it first (a descriptor cut off by the end of the
  stream is ``stream.truncated``, located where the bytes end; a stream that is a file is
  ``descriptor.magic``; ``max_descriptor_bytes``), then takes exactly its bytes; ``COLLECT``
  checks the same framing with the same rules and offsets but yields the fault as a part, then
  decodes the descriptor from what remains (what the bytes say, not what the framing promised)
  and gives it its composite nesting ``depth``; ``ANNOTATE`` decodes what remains without the
  framing check (so the annotated view shows how far the fields get);
* **the buffers** -- ``RAISE`` reads each (``max_buffer_bytes``; cut off: ``stream.truncated``);
  the other policies take those that fit and yield the fault where the first does not.

Location can be switched off (``per_tensor``, ``RAISE`` only): the walk then yields per tensor
``(descriptor, its offset, tuple of buffer views)`` and builds no part -- the stream reader's
fast path, the same steps with nothing located.
"""

from __future__ import annotations

from typing import Iterator, Optional

from ...codec import known_length, peek_descriptor_length
from ...errors import SpecViolation
from ...limits import DEFAULT_LIMITS, Limits
from ...rules import container as container_rules
from ...rules import structure as structure_rules
from ...rules.engine import Mode
from ...signature import lookup as lookup_compiled
from ...structs.descriptor import FIXED_HEADER_SIZE
from ...structs.file import FILE_MAGIC
from .common import (
    BUFFER, DESCRIPTOR_LENGTH_AT, Describe, Faults, Nesting, Part, Window, as_view, fault, fault_at, new_part,
)

__all__ = ["walk_bare"]


def walk_bare(window: Window, describe: Describe, *, faults: Faults, mode: Mode,
              limits: Limits = DEFAULT_LIMITS, progress=None, per_tensor: bool = False) -> Iterator:
    """Parts of a bare stream (``interchange.md § Scope``): per tensor its descriptor
    part, then one ``buffer`` part per buffer-table entry (no padding).

    ``per_tensor`` (``RAISE`` only): per tensor one ``(descriptor, its offset, tuple of buffer
    views)`` instead, once all its buffers are read -- the same framing checks, rules and
    offsets, without a part per descriptor or buffer (a stream reader wants the views alone).

    ``RAISE`` checks the framing first and reads only what each part needs; ``COLLECT`` checks
    the same framing with the same rules and offsets, then decodes each descriptor from what
    remains, gives it its composite nesting ``depth``, and stops at the first part that cannot
    be located; ``ANNOTATE`` decodes what remains without the framing check.  An empty stream
    holds zero tensors (``interchange.md § Scope``) and has no part; a lone descriptor is
    :func:`~.descriptor.walk_descriptor`'s.  ``progress``, when given, is called with the
    offset of each tensor."""
    if faults is Faults.RAISE:
        take_descriptor = _strict_descriptors(describe, limits, located=not per_tensor)
        take_buffers = _strict_buffers(limits)
    elif per_tensor:
        raise ValueError("per_tensor is for faults=Faults.RAISE")
    else:
        take_descriptor = _located_descriptors(describe, faults)
        take_buffers = _located_buffers(faults, mode)
    return _walk(window, take_descriptor, take_buffers, limits.max_buffer_bytes, progress, not per_tensor)


def _walk(window: Window, take_descriptor, take_buffers, max_buffer: int, progress, located: bool) -> Iterator:
    """The walk itself: per tensor ``take_descriptor(window, start)`` (its part when ``located``,
    else the descriptor; the window moved past it), then its buffers -- one in memory that fits
    is sliced here (the common case), others through ``take_buffers(window, handles, start)``,
    which gives their views and the fault part where one does not fit (or raises)."""
    memory = window.data
    end = None if memory is None else len(memory)
    while (window.pos < end) if end is not None else not window.at_eof():
        start = window.pos
        if progress is not None:
            progress(start)
        desc = take_descriptor(window, start)
        if located:
            yield desc  # the descriptor's part, or the fault part that ends the walk
            desc = desc.value
            if desc is None:
                return
        handles = desc.buffers
        at = window.pos
        views = None
        if len(handles) == 1 and end is not None:  # the common case, read inline
            size = handles[0].byte_size
            if size <= max_buffer and size <= end - at:
                window.pos = at + size
                views, cut = (memory[at : at + size],), None
        elif not handles:  # a composite head
            views, cut = (), None
        if views is None:
            views, cut = take_buffers(window, handles, start)
        if not located:
            yield desc, start, views
            continue
        for i, view in enumerate(views):
            stop = at + len(view)
            yield new_part(Part, (BUFFER, at, stop, None, view, None, "", (), i, 0))
            at = stop
        if cut is not None:
            yield cut
            return


# --------------------------------------------------------------------------------------
# RAISE: the readers
# --------------------------------------------------------------------------------------


def _strict_descriptors(describe: Describe, limits: Limits, located: bool):
    """The readers' descriptor step: the descriptor at ``start`` framed (the first fault raises)
    and described, its part when ``located``, else the descriptor alone.  Over bytes or a memory
    map, a header compiled before frames the descriptor: its bytes are sliced from the input
    directly (no view made) and taken by the compiled decoder (``describe.known`` /
    ``describe.value``, when the describer has them)."""
    compiled_path = getattr(describe, "known" if located else "value", None)

    def take(window: Window, start: int):
        memory, raw = window.data, window.raw
        if compiled_path is not None and memory is not None and start:
            compiled = lookup_compiled(raw[start : start + FIXED_HEADER_SIZE] if raw is not None
                                       else memory[start : start + FIXED_HEADER_SIZE].tobytes())
            if compiled is not None and compiled.length <= len(memory) - start \
                    and compiled.length <= limits.max_descriptor_bytes:
                window.pos = stop = start + compiled.length
                return compiled_path(raw[start:stop] if raw is not None else memory[start:stop].tobytes(), compiled,
                                     start)
        part = describe(_framed_descriptor(window, start, limits), start, 0)
        return part if located else part.value

    return take


def _framed_descriptor(window: Window, start: int, limits: Limits) -> bytes:
    """The bytes of the descriptor at ``start`` (the window moved past them), framed by its
    ``descriptor_length``: cut off by the end of the stream it is ``stream.truncated``; past
    ``max_descriptor_bytes`` the limit raises (never more than the limit is read)."""
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
            limits.check("max_descriptor_bytes", length, start + DESCRIPTOR_LENGTH_AT)
        window.pos = start + length
        return memory[start : start + length].tobytes()
    # never more than the limit allows; a stream that ends first is truncated, as audit says
    rest = window.read(max(0, min(length, limit + 1) - FIXED_HEADER_SIZE))
    have = FIXED_HEADER_SIZE + len(rest)
    if have < length and have <= limit:
        raise _cut_in_descriptor(start, have, length)
    if length > limit:
        limits.check("max_descriptor_bytes", length, start + DESCRIPTOR_LENGTH_AT)
    return bytes(head) + bytes(rest)


def _strict_buffers(limits: Limits):
    """The readers' buffers step: the views of each buffer read from where the window is;
    past ``max_buffer_bytes``, or cut off by the end of the stream, it raises."""
    max_buffer = limits.max_buffer_bytes

    def take(window: Window, handles, start: int) -> tuple:
        memory = window.data
        end = None if memory is None else len(memory)
        views = []
        for i, handle in enumerate(handles):
            size, at = handle.byte_size, window.pos
            if end is not None and size <= max_buffer and size <= end - at:
                window.pos = at + size
                views.append(memory[at : at + size])
            else:
                views.append(as_view(_strict_buffer(window, size, limits, i, start)))
        return tuple(views), None

    return take


def _strict_buffer(window: Window, size: int, limits: Limits, i: int, start: int):
    """Buffer ``i`` (``size`` bytes) of the tensor whose descriptor is at ``start``, read
    from where the window is: past ``max_buffer_bytes``, or cut off by the end of the
    stream (``stream.truncated``, located where the bytes end), it raises."""
    if size > limits.max_buffer_bytes:
        limits.check("max_buffer_bytes", size, start)
    at = window.pos
    data = window.read(size)
    if len(data) < size:
        raise container_rules.STREAM_TRUNCATED.violation(
            f"buffer {i} of the tensor at byte {start} needs {size} bytes, the stream has "
            f"{len(data)} left", at + len(data))
    return data


# --------------------------------------------------------------------------------------
# COLLECT and ANNOTATE: audit, the annotated view
# --------------------------------------------------------------------------------------


def _located_descriptors(describe: Describe, faults: Faults):
    """The locating descriptor step: under ``COLLECT`` the fault part when the framing fails
    (:func:`_located_frame`), else the part ``describe`` makes of what remains, at its nesting
    depth (value None: it cannot be decoded, and the walk ends after it)."""
    nesting = Nesting()
    collect = faults is Faults.COLLECT

    def take(window: Window, start: int) -> Part:
        if collect:
            cut = _located_frame(window.rest(), start)
            if cut is not None:
                return cut
        part = describe(window.rest(), start, nesting.depth())
        if part.value is not None:
            nesting.arrive(part.value)
            window.pos = part.end
        return part

    return take


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
        return fault_at(exc)
    return None


def _located_buffers(faults: Faults, mode: Mode):
    """The locating buffers step: every buffer's view when they all fit; else those that fit
    and the ``stream.truncated`` fault part where the first does not (the walk ends there)."""

    def take(window: Window, handles, start: int) -> tuple:
        need, have = sum(h.byte_size for h in handles), window.remaining()
        if need <= have:
            return tuple(window.read(h.byte_size) for h in handles), None
        views, at, size = [], window.pos, len(window.data)
        for i, handle in enumerate(handles):
            if handle.byte_size > size - at:
                return tuple(views), fault(faults, container_rules.STREAM_TRUNCATED,
                                           f"the buffers of the tensor need {need} bytes, {have} remain",
                                           window.pos + have, mode, at=at,
                                           note=f"buffer {i} needs {handle.byte_size} bytes, {size - at} remain")
            views.append(window.data[at : at + handle.byte_size])
            at += handle.byte_size
        raise AssertionError("some buffer does not fit when need > have")  # pragma: no cover

    return take


# --------------------------------------------------------------------------------------
# The framing rules both steps check
# --------------------------------------------------------------------------------------


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
