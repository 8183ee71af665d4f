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
* :func:`check_values` then applies the rules on the values of each tensor's quantization
  scales (:mod:`hurray_schema.rules.values`), which a reader checks when it decodes the values:
  a zero or non-finite scale raises its rule, located at the scale's byte in the output.  A
  :class:`~.tensor.ProducedBuffer` holding scales is not made twice for it: its producer answers
  for its values (:func:`hurray_schema.builders.quantized.per_block_produced`).
* :func:`replacing` writes a path through a temporary file in the same folder, flushed,
  fsynced and renamed over the target (``os.replace``), then fsyncs the folder.  On a Python
  exception the previous file is untouched and the temporary file is removed.  A reader that
  still maps the previous file keeps its (now unlinked) bytes, so tensors read from a file
  can be written back to the same path.

  A process killed outright (``kill -9``, the OOM killer) runs no clean-up, so the
  temporary file is made to need none.  On Linux it is opened unnamed (``O_TMPFILE``): the
  kernel frees it with the writer's last descriptor, and it is linked under a name only
  once complete, just before the rename -- a kill in that short gap is the only one that
  leaves a file behind.  Where the file system or the platform has no unnamed files, the
  temporary file is named from the start.  Its name is ``.{target}.{pid}.{hex}.hrry-tmp``
  either way, and its writer holds an exclusive ``flock`` on it from creation to rename.
  Before writing, :func:`remove_orphans` removes from the folder every file of that pattern
  whose lock it can take: the kernel releases a lock when its holder dies, so an unlocked
  temporary file has no writer left (a pid in a name can be reused, a lock cannot outlive
  its holder).  Files of any other name are never removed.

Sizes the readers bound only by a configurable safety limit (descriptor length, member
count, buffer size) are not refused here: the limits protect readers from hostile input,
they are not rules of the format.  The tiled depth is checked against the default limit,
which a reader enforces as a rule.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from typing import BinaryIO, Iterable, Iterator, Optional, Sequence

import attrs

from ..codec import encode_descriptor, parse_descriptor
from ..errors import EncodeError, HurraySchemaError
from ..limits import DEFAULT_LIMITS, HARD_MAXIMUM
from ..memo import MEMO
from ..model import TensorDescriptor
from ..rules.composite import CompositeBinder, validate_preorder
from ..rules.descriptor import first_error
from ..rules.values import scale_fault
from .tensor import Composite, Item, ProducedBuffer, ProducedTensor, Tensor

try:
    import fcntl
except ImportError:  # Windows: no flock, no sweeping of orphans
    fcntl = None

__all__ = ["EncodedNode", "Sink", "as_item", "checked_buffers", "encode_nodes", "check_nodes", "check_values", "decoded",
           "remove_orphans", "replacing", "WRITER_LIMITS"]

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


_PASSED = MEMO.written
"""Descriptor bytes that passed :func:`decoded`, with what they decode to: the verdict
depends on the bytes alone (only a violation's offset depends on where they sit)."""
_MAX_PASSED = MEMO.limit("written")


def decoded(data: bytes, base: int) -> TensorDescriptor:
    """What a strict reader makes of descriptor bytes found at ``base``, or its violation."""
    desc = _PASSED.get(data)
    if desc is not None:
        return desc
    desc, _ = parse_descriptor(data, mode="strict", base=base, limits=WRITER_LIMITS)
    finding = first_error(desc, "strict", base=base)
    if finding is not None:
        raise finding.to_violation()
    if MEMO.values_on:
        if len(_PASSED) >= _MAX_PASSED:  # a bounded memo: many distinct descriptors just start it again
            _PASSED.clear()
        _PASSED[data] = desc
    return desc


def check_nodes(encoded: Sequence[EncodedNode], bases: Sequence[int], *, file_order: bool) -> None:
    """Raise the strict reader's first :class:`~hurray_schema.errors.SpecViolation` for the
    output made of ``encoded``, whose descriptors start at the offsets ``bases``.

    The faults are looked for in the reader's order.  A stream reader binds each tensor as it
    arrives.  A file reader (``file_order=True``) checks at open the tensors it must decode to
    bind composites -- heads, members, and tensors with no data bytes -- binding them as they come
    in descriptor order, and every other tensor when it is first read
    (:mod:`hurray_schema.io.file.index`): those come after, in descriptor order."""
    if not file_order:
        validate_preorder((decoded(item.descriptor, base) for item, base in zip(encoded, bases)), mode="strict",
                          bases=list(bases), check_heads=False)
        return
    # every descriptor passes first_error, the composite-head rules included, before it is bound,
    # as the readers' descriptors do
    binder, later = CompositeBinder(mode="strict", check_heads=False), []
    for item, base in zip(encoded, bases):
        if binder.depth == 0 and not _decoded_at_open(item):
            later.append((item, base))
        else:
            binder.add(decoded(item.descriptor, base), base)
    binder.finish()
    for item, base in later:
        decoded(item.descriptor, base)


def check_values(desc: TensorDescriptor, buffers: Sequence, buffer_offsets: Optional[Sequence[int]]) -> None:
    """Raise the :class:`~hurray_schema.errors.SpecViolation` of the first quantization scale of
    ``desc`` that breaks its scheme's rule on the values (:func:`hurray_schema.rules.values.scale_fault`),
    located where the buffers will start in the output (``buffer_offsets``; None: not located)."""
    q = desc.quantization
    if q is None or not hasattr(q, "scale_buffer_index") or q.scale_buffer_index >= len(buffers) \
            or isinstance(buffers[q.scale_buffer_index], ProducedBuffer):
        return
    fault = scale_fault(desc, buffers)
    if fault is not None:
        raise fault.violation(None if buffer_offsets is None else buffer_offsets[fault.buffer])


def _decoded_at_open(item: EncodedNode) -> bool:
    """Whether a file reader decodes this top-level node at open: a composite head, or a tensor with
    no data bytes (``hurray_schema.io.file.index``); a composite's members follow their head."""
    return isinstance(item.node, Composite) or not any(handle.byte_size for handle in item.node.descriptor.buffers)


# --------------------------------------------------------------------------------------
# Atomic replacement of a path
# --------------------------------------------------------------------------------------

USE_O_TMPFILE = hasattr(os, "O_TMPFILE")
"""Write into an unnamed temporary file where the platform has ``O_TMPFILE`` (Linux); the
tests turn it off to exercise the named temporary files other platforms use."""

_TEMP_SUFFIX = ".hrry-tmp"
_TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{12}" + re.escape(_TEMP_SUFFIX), re.DOTALL)
"""The names :func:`replacing` gives its temporary files, ``.{name}.{pid}.{hex}.hrry-tmp``;
:func:`remove_orphans` never touches any other name."""

_NO_TMPFILE = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EISDIR, errno.EINVAL}
"""What ``open(folder, O_TMPFILE)`` fails with where the file system or the kernel has none."""

_MAX_NAME_PART = 100
"""The most characters of the target's name a temporary file's name repeats (file names are
bounded, usually at 255 bytes)."""


def _temporary_name(name: str) -> str:
    """A fresh name for a temporary file beside the target ``name``: its owner's pid and a
    random part, in the pattern :func:`remove_orphans` recognises."""
    return f".{name[:_MAX_NAME_PART]}.{os.getpid()}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"


def _lock(fd: int) -> None:
    """Hold ``fd``'s file under an exclusive ``flock`` until ``fd`` is closed (or the process
    dies): what tells :func:`remove_orphans` its writer is alive.  Where the file system has
    no ``flock`` the file goes unlocked, and no sweeper can lock it either."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)


def _open_unnamed(folder: str) -> Optional[int]:
    """A locked, unnamed file in ``folder`` (``O_TMPFILE``), or None where there is none."""
    if not USE_O_TMPFILE or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o666)
    except OSError as e:
        if e.errno in _NO_TMPFILE:
            return None
        raise
    _lock(fd)
    return fd


def _open_named(folder: str, name: str) -> tuple[int, str]:
    """A new, locked file beside the target, created with the mode a plain
    ``open(path, "wb")`` would give it, and its path.

    A sweeper may remove the file between its creation and its lock; the writer then finds
    it unlinked once it holds the lock, and makes another."""
    while True:
        temp = os.path.join(folder, _temporary_name(name))
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        _lock(fd)
        if os.fstat(fd).st_nlink > 0:
            return fd, temp
        os.close(fd)


def _link_unnamed(fd: int, folder: str, name: str) -> str:
    """Give the unnamed file ``fd`` a temporary name in ``folder`` and return its path.

    ``linkat(AT_FDCWD, "/proc/self/fd/N", dirfd, new, AT_SYMLINK_FOLLOW)``: ``os.link`` calls
    ``linkat`` (rather than ``link``, which would not follow the magic link) once it is given a
    folder descriptor."""
    dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            temp = _temporary_name(name)
            try:
                os.link(f"/proc/self/fd/{fd}", temp, dst_dir_fd=dirfd, follow_symlinks=True)
            except FileExistsError:
                continue
            return os.path.join(folder, temp)
    finally:
        os.close(dirfd)


class _Temporary:
    """The file a replacement is written into, locked for as long as it is open: unnamed
    until it is committed where the platform allows it, named from the start otherwise."""

    __slots__ = ("folder", "name", "fd", "path")

    def __init__(self, folder: str, name: str):
        self.folder, self.name = folder, name
        self.fd = _open_unnamed(folder)
        self.path: Optional[str] = None
        if self.fd is None:
            self.fd, self.path = _open_named(folder, name)

    def keep_mode_of(self, target: str) -> None:
        """Give the file the permission bits of an existing ``target``."""
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            return
        if os.chmod in os.supports_fd:
            os.chmod(self.fd, mode)
        else:
            os.chmod(self.path, mode)

    def commit(self, target: str) -> None:
        """Rename the file over ``target`` (naming it first if it has no name yet)."""
        if self.path is None:
            self.path = _link_unnamed(self.fd, self.folder, self.name)
        os.replace(self.path, target)
        self.path = None

    def discard(self) -> None:
        """Remove the file's name, if it has one."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None

    def close(self) -> None:
        """Close the file, which releases its lock (an unnamed file is gone with it)."""
        os.close(self.fd)


def _open_for_lock(path: str) -> Optional[int]:
    """``path`` opened without following a link or blocking on a FIFO, or None."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK
    for access in (os.O_RDONLY, os.O_WRONLY):  # a kept mode may allow only one of them
        try:
            return os.open(path, access | flags)
        except OSError:
            continue
    return None


def _remove_if_orphan(path: str) -> bool:
    """Remove the regular file ``path`` if no process holds its lock; whether it did."""
    fd = _open_for_lock(path)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = os.fstat(fd)
        now = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(held.st_mode) or (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
            return False
        os.unlink(path)
        return True
    except OSError:  # locked by a live writer (BlockingIOError), gone, or not ours to remove
        return False
    finally:
        os.close(fd)


def remove_orphans(folder) -> list[str]:
    """Remove the temporary files of dead writers from ``folder`` and return their names.

    A file is removed only if its name is one :func:`replacing` gives and no process holds
    its ``flock``: a writer holds it from creation to rename, and the kernel releases it when
    the writer dies, however it dies.  (A pid in the name could have been reused; a lock
    cannot outlive its holder.)  Nothing is removed where there is no ``flock``."""
    if fcntl is None:
        return []
    folder = os.fspath(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if _TEMP_NAME.fullmatch(n) and _remove_if_orphan(os.path.join(folder, n))]


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

    The temporaries of dead writers in the folder are removed first (:func:`remove_orphans`).
    A symbolic link is followed (its target is replaced); an existing file's permission
    bits are kept.  On Windows the rename fails while the previous file is open or mapped.
    """
    target = os.path.realpath(os.fspath(path))
    folder, name = os.path.split(target)
    remove_orphans(folder)
    temp = _Temporary(folder, name)
    try:
        with open(temp.fd, "wb", closefd=False) as f:
            temp.keep_mode_of(target)
            yield f
            f.flush()
            os.fsync(temp.fd)
        temp.commit(target)
    except BaseException:
        temp.discard()
        raise
    finally:
        temp.close()
    _sync_folder(folder)
