"""What the stream and file writers share: encode and check everything first, then write
to a temporary file that replaces the target only once it is complete.

* :func:`encode_nodes` encodes the descriptor of every tensor of the output (a value its
  wire field cannot hold raises :class:`~hurray_schema.errors.FieldRangeError`) and, when
  validating, checks that the buffers given match the buffer handles
  (:class:`~hurray_schema.errors.EncodeError` otherwise).
* :func:`check_nodes` applies what a strict reader applies to the same bytes, through the
  readers' own functions: each encoded descriptor is decoded in strict mode and passes the
  semantic rules of one descriptor (:func:`hurray_schema.rules.descriptor.first_error`);
  composites go through the readers' one binder,
  :func:`hurray_schema.rules.composite.validate_preorder`, nesting depth included
  (``layouts/composite.md § Binding``, ``§ Validation``; ``§ Partition``: a conforming
  writer produces valid partitions).  The
  first fault raises the reader's :class:`~hurray_schema.errors.SpecViolation` -- same
  rule id -- located at the byte offset it would have in the output.
* :func:`replacing` writes a path through a temporary file in the same folder, flushed,
  fsynced and renamed over the target (``os.replace``).  On any error the previous file
  is untouched and the temporary file is removed.  A reader that still maps the previous
  file keeps its (now unlinked) bytes, so tensors read from a file can be written back to
  the same path.

Sizes the readers bound only by a configurable safety limit (descriptor length, member
count, buffer size) are not refused here: the limits protect readers from hostile input,
they are not rules of the format.  The tiled depth is checked against the default limit,
which a reader enforces as a rule.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import BinaryIO, Iterable, Iterator, Optional, Sequence

import attrs

from ..codec import encode_descriptor, parse_descriptor
from ..errors import EncodeError, HurraySchemaError
from ..limits import DEFAULT_LIMITS, HARD_MAXIMUM
from ..model import TensorDescriptor
from ..rules.composite import validate_preorder
from ..rules.descriptor import first_error
from .tensor import Composite, Item, ProducedBuffer, ProducedTensor, Tensor

__all__ = ["EncodedNode", "Sink", "as_item", "checked_buffers", "encode_nodes", "check_nodes", "decoded",
           "replacing", "WRITER_LIMITS"]

WRITER_LIMITS = DEFAULT_LIMITS.evolve(
    max_descriptor_bytes=HARD_MAXIMUM["max_descriptor_bytes"],
    max_buffer_count=HARD_MAXIMUM["max_buffer_count"],
)
"""Limits under which a written descriptor is decoded again: the wire's own bounds for the
safety limits, the defaults (the spec's values) for rank and tiled depth."""


@attrs.frozen(slots=True)
class EncodedNode:
    """One tensor of the output (a composite head included), encoded, in pre-order."""

    name: Optional[str]
    node: Item
    descriptor: bytes
    buffers: tuple


class Sink:
    """A forward-only output that counts what it is given; with no file it only counts
    (the writers lay the output out once that way, to know every offset beforehand)."""

    __slots__ = ("f", "pos")

    def __init__(self, f: Optional[BinaryIO] = None):
        self.f = f
        self.pos = 0

    def write(self, data) -> None:
        if self.f is not None:
            if isinstance(data, ProducedBuffer):
                data.write_to(self.f.write)  # piece by piece, each written while in the cache
            else:
                self.f.write(data)
        self.pos += len(data)

    def pad(self, alignment: int) -> None:
        n = -self.pos % alignment
        if n:
            self.write(bytes(n))


def as_item(value) -> Item:
    """``value`` as something a writer takes: a :class:`Tensor` or :class:`Composite` as it
    is, a NumPy array as the dense row-major tensor :meth:`Tensor.from_numpy` makes of it
    (``bool`` and the ``ml_dtypes`` sub-byte types packed)."""
    if isinstance(value, (Tensor, Composite)):
        return value
    import numpy as np

    if not isinstance(value, (np.ndarray, np.generic)):
        raise HurraySchemaError(f"{type(value).__name__} is neither a Tensor, a Composite nor a NumPy array")
    return Tensor.from_numpy(np.asarray(value))


def checked_buffers(node: Item, produced: bool = False) -> tuple:
    """The buffers of ``node`` once each matches its buffer handle's ``byte_size`` (a
    composite head has none); :class:`EncodeError` otherwise.  With ``produced``, a
    :class:`~.tensor.ProducedTensor` gives its :class:`~.tensor.ProducedBuffer` s (for a
    :class:`Sink` to write piece by piece), not its buffers made whole."""
    buffers = _buffers(node, produced)
    if isinstance(node, Composite):
        return ()
    handles = node.descriptor.buffers
    if len(handles) != len(buffers):
        raise EncodeError(
            f"{node!r}: the descriptor lists {len(handles)} buffers, {len(buffers)} were given")
    for i, (handle, data) in enumerate(zip(handles, buffers)):
        if len(data) != handle.byte_size:
            raise EncodeError(f"{node!r}: buffer {i} holds {len(data)} bytes, its handle says {handle.byte_size}")
    return buffers


def _buffers(node: Item, produced: bool) -> tuple:
    if isinstance(node, Composite):
        return ()
    if produced and isinstance(node, ProducedTensor):
        return node.produced
    return node.buffers


def encode_nodes(nodes: Iterable[tuple[Optional[str], Item]], validate: bool = True, *,
                 produced: bool = False) -> Iterator[EncodedNode]:
    """Each ``(name, node)`` encoded; ``validate=False`` takes the buffers as given; ``produced``:
    see :func:`checked_buffers`."""
    for name, node in nodes:
        descriptor = encode_descriptor(node.descriptor)
        buffers = checked_buffers(node, produced) if validate else _buffers(node, produced)
        yield EncodedNode(name, node, descriptor, buffers)


_PASSED: dict[bytes, TensorDescriptor] = {}
"""Descriptor bytes that passed :func:`decoded`, with what they decode to: the verdict
depends on the bytes alone (only a violation's offset depends on where they sit)."""
_MAX_PASSED = 4096


def decoded(data: bytes, base: int) -> TensorDescriptor:
    """What a strict reader makes of descriptor bytes found at ``base``, or its violation."""
    desc = _PASSED.get(data)
    if desc is not None:
        return desc
    desc, _ = parse_descriptor(data, mode="strict", base=base, limits=WRITER_LIMITS)
    finding = first_error(desc, "strict", base=base)
    if finding is not None:
        raise finding.to_violation()
    if len(_PASSED) >= _MAX_PASSED:  # a bounded memo: many distinct descriptors just start it again
        _PASSED.clear()
    _PASSED[data] = desc
    return desc


def check_nodes(encoded: Sequence[EncodedNode], bases: Sequence[int], *, descriptors_first: bool) -> None:
    """Raise the strict reader's first :class:`~hurray_schema.errors.SpecViolation` for the
    output made of ``encoded``, whose descriptors start at the offsets ``bases``.

    The faults are looked for in the reader's order: a file reader decodes every
    descriptor before it binds composites (``descriptors_first=True``); a stream reader
    binds each tensor as it arrives."""
    descriptors = (decoded(item.descriptor, base) for item, base in zip(encoded, bases))
    if descriptors_first:
        descriptors = list(descriptors)
    # every descriptor already passed first_error, the composite-head rules included, as the
    # readers' descriptors do before they are bound
    validate_preorder(descriptors, mode="strict", bases=list(bases), check_heads=False)


# --------------------------------------------------------------------------------------
# Atomic replacement of a path
# --------------------------------------------------------------------------------------


def _create_temporary(folder: str, name: str) -> tuple[int, str]:
    """A new file beside the target (same file system, so the rename is atomic), created
    with the mode a plain ``open(path, "wb")`` would give it."""
    while True:
        temp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), temp
        except FileExistsError:
            continue


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` when the
    block ends without an error (flushed, fsynced, renamed), and is removed otherwise.

    A symbolic link is followed (its target is replaced); an existing file's permission
    bits are kept.  On Windows the rename fails while the previous file is open or mapped.
    """
    target = os.path.realpath(os.fspath(path))
    folder, name = os.path.split(target)
    fd, temp = _create_temporary(folder, name)
    try:
        with open(fd, "wb") as f:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _sync_folder(folder)
