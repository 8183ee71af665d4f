"""Write ``.hrry`` files (``file-format.md``): :func:`write_file`.

Writing is one forward pass (``§ Writer Protocol``): header, tensors (descriptor 8-aligned,
data buffers aligned to ``data_buffer_alignment``, no padding after a composite head),
KV section, index, CRC-32C of the index, trailer -- into a temporary file renamed over
the target once complete, after every tensor passed the strict reader's rules
(:mod:`hurray_schema.io._write`, imported when a file is written: reading needs none of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterable, Optional, Union

from ..._deprecation import renamed_keyword
from ...errors import HurraySchemaError
from ...limits import HARD_MAXIMUM
from ...structs._declare import plan
from ...structs.file import (
    DESCRIPTOR_ALIGNMENT, FILE_HEADER, FILE_HEADER_SIZE, FILE_MAGIC, INDEX_COUNT, INDEX_ENTRY_FIELDS,
    INDEX_NAME_LENGTH, MIN_DATA_BUFFER_ALIGNMENT, SECTION_ALIGNMENT, SUPPORTED_CONTAINER_MAJOR,
    SUPPORTED_CONTAINER_MINOR, TRAILER, TRAILER_MAGIC, FileFlag,
)
from ..crc import crc32c
from ..tensor import Composite, Item, Tensor, walk
from ..walk.kv import encode_kv
from .walk import IndexEntry, check_data_buffer_alignment

if TYPE_CHECKING:  # the writer's modules are imported by write_file: reading needs none of them
    from .._write import EncodedNode, Sink

__all__ = ["write_file"]

_HEADER = plan(FILE_HEADER)
_TRAILER = plan(TRAILER)
_COUNT = plan(INDEX_COUNT)
_NAME_LEN = plan(INDEX_NAME_LENGTH)
_ENTRY = plan(INDEX_ENTRY_FIELDS)


def _named_items(items) -> list[tuple[str, Item]]:
    from .._write import as_item

    if isinstance(items, Mapping):
        pairs = [(name, item) for name, item in items.items()]
    else:
        if isinstance(items, (Tensor, Composite)):
            items = (items,)
        pairs = [(item.name, item) for item in items]
    named = []
    for name, item in pairs:
        try:
            item = as_item(item)
        except HurraySchemaError as exc:
            raise HurraySchemaError(f"{name!r}: {exc}") from None
        if not name:
            raise HurraySchemaError(f"{item!r} has no name; a file needs one for every tensor")
        named.append((name, item))
    return named


def _file_nodes(items) -> list[tuple[str, Item]]:
    """Every tensor of the file in pre-order, named, each name used once."""
    nodes: list[tuple[str, Item]] = []
    seen: set[str] = set()
    for name, item in _named_items(items):
        for node_name, node in walk(item, name):
            if node_name in seen:
                raise HurraySchemaError(f"tensor name {node_name!r} is used twice")
            if not node_name.encode("utf-8") or len(node_name.encode("utf-8")) > 0xFFFF:
                raise HurraySchemaError(f"tensor name {node_name!r} must be 1 to 65535 UTF-8 bytes")
            seen.add(node_name)
            nodes.append((node_name, node))
    return nodes


def _write_body(out: Sink, encoded: list[EncodedNode], flags: FileFlag, alignment: int, pad_after_head: bool,
                kv_bytes: bytes, sorted_index: bool) -> list[IndexEntry]:
    """Header, tensors, KV section, index and trailer (``file-format.md § Writer
    Protocol``) into ``out``; the index entries in index order.  A :class:`Sink` without
    a file lays the same file out without writing it."""
    out.write(_HEADER.pack(
        magic=FILE_MAGIC, container_version_major=SUPPORTED_CONTAINER_MAJOR,
        container_version_minor=SUPPORTED_CONTAINER_MINOR, _reserved=bytes(2), file_flags=int(flags),
        data_buffer_alignment=alignment, first_descriptor_offset=FILE_HEADER_SIZE, tensor_count_hint=len(encoded),
        _reserved_header=bytes(28)))
    entries: list[IndexEntry] = []
    for item in encoded:
        out.pad(DESCRIPTOR_ALIGNMENT)
        desc_off = out.pos
        out.write(item.descriptor)
        if item.node.descriptor.buffers or pad_after_head:
            out.pad(alignment)  # an empty tensor still has one (0-byte) buffer to align
        data_off = out.pos
        for i, b in enumerate(item.buffers):
            if i:
                out.pad(alignment)
            out.write(b)
        entries.append(IndexEntry(item.name, desc_off, len(item.descriptor), data_off, out.pos - data_off))
    kv_off = 0
    if kv_bytes:
        out.pad(SECTION_ALIGNMENT)
        kv_off = out.pos
        out.write(kv_bytes)
    out.pad(SECTION_ALIGNMENT)
    index_off = out.pos
    ordered = sorted(entries, key=lambda e: e.name.encode("utf-8")) if sorted_index else entries
    index = _COUNT.pack(index_entry_count=len(ordered)) + b"".join(
        _NAME_LEN.pack(name_length=len(e.name.encode("utf-8"))) + e.name.encode("utf-8")
        + _ENTRY.pack(descriptor_offset=e.descriptor_offset, descriptor_length=e.descriptor_length,
                      data_offset=e.data_offset, data_length=e.data_length, flags=0)
        for e in ordered)
    out.write(index)
    out.write(_TRAILER.pack(
        index_offset=index_off, index_length=len(index), kv_offset=kv_off, kv_length=len(kv_bytes),
        index_crc32c=crc32c(index), _reserved=bytes(4), trailer_magic=TRAILER_MAGIC))
    return ordered


def _buffer_starts(data_offset: int, buffers, alignment: int) -> list[int]:
    """Where each buffer of a tensor whose data starts at ``data_offset`` lies (each after the first
    aligned to ``alignment``, as :func:`_write_body` places them)."""
    starts, at = [], data_offset
    for i, b in enumerate(buffers):
        if i:
            at += -at % alignment
        starts.append(at)
        at += len(b)
    return starts


@renamed_keyword("kv", "metadata")
def write_file(path, items: Union[Mapping[str, Item], Iterable[Item]], *,
               metadata: Optional[Mapping[str, Any]] = None, sorted_index: bool = False, data_buffer_alignment: int = MIN_DATA_BUFFER_ALIGNMENT,
               pad_after_composite_head: bool = False, validate: bool = True) -> list[IndexEntry]:
    """Write a ``.hrry`` file in one forward pass and return its index entries.

    ``items`` maps names to tensors and composites (or is an iterable of named ones);
    composite members are written after their head, named ``<name>.<i>`` unless they
    carry a name.  ``metadata`` (str keys; bool, int, float, str, bytes values or lists of one
    of them) becomes the KV section (``kv=`` is its deprecated former name).

    Nothing is lost: the file is written to a temporary file beside ``path``, flushed,
    fsynced and renamed over ``path``; on any error the previous file is untouched and
    the temporary file is removed.  Tensors read from ``path`` itself (memory-mapped) may
    be written back to it.  A :class:`~hurray_schema.io.tensor.ProducedTensor`'s buffers are
    made as they are written, piece by piece.

    Nothing invalid is written: before the first byte, every descriptor must decode and
    pass the strict reader's rules and every composite ``layouts/composite.md
    § Validation``, and every quantization scale its scheme's rule on the values
    (:mod:`hurray_schema.rules.values`, which a reader checks when it decodes the tensor); the
    first fault raises the :class:`~hurray_schema.errors.SpecViolation` :func:`read_file` (or the
    decode) would raise for it (same rule id), at the byte offset it would have in the file.  Buffers that do not match their handles raise
    :class:`~hurray_schema.errors.EncodeError`, values that do not fit their wire field
    :class:`~hurray_schema.errors.FieldRangeError` (also with ``validate=False``).
    ``validate=False`` skips the rules and the buffer check: it exists to produce faulty
    test inputs.  ``pad_after_composite_head=True`` reproduces the reference writer's
    padding after a head, which the spec forbids -- only for interop experiments.
    """
    from .._write import Sink, check_nodes, check_values, encode_nodes, replacing

    a = data_buffer_alignment
    check_data_buffer_alignment(a)  # the rule a reader of the header would raise, at that field
    nodes = _file_nodes(items)
    kv_bytes = encode_kv(metadata) if metadata else b""
    if len(kv_bytes) > HARD_MAXIMUM["max_kv_bytes"]:
        raise HurraySchemaError(f"the KV section's {len(kv_bytes)} bytes exceed the {HARD_MAXIMUM['max_kv_bytes']} "
                                "kv_length can express")
    flags = FileFlag.HAS_INDEX_CRC32C
    if kv_bytes:
        flags |= FileFlag.HAS_KV_METADATA
    if sorted_index:
        flags |= FileFlag.SORTED_INDEX
    encoded = list(encode_nodes(nodes, validate, produced=True))
    layout = (encoded, flags, a, pad_after_composite_head, kv_bytes, sorted_index)
    if validate:
        placed = {e.name: e for e in _write_body(Sink(), *layout)}
        check_nodes(encoded, [placed[item.name].descriptor_offset for item in encoded], file_order=True)
        for item in encoded:
            if isinstance(item.node, Tensor) and item.node.descriptor.quantization is not None:
                check_values(item.node.descriptor, item.buffers, _buffer_starts(placed[item.name].data_offset,
                                                                                 item.buffers, a))
    with replacing(path) as f:
        return _write_body(Sink(f), *layout)
