"""Hurray into a PyTorch Distributed Checkpoint folder, without torch.

What ``torch.distributed.checkpoint.save`` writes with its default FileSystemWriter
(torch/distributed/checkpoint/filesystem.py), rebuilt from a Hurray file (the reverse of
:mod:`.dcp_format`; the bytes by :mod:`.dcp_emit`):

* every array of the file (groups opened into their members, as :func:`hurray_schema.load` names
  them) is one tensor entry (``TensorStorageMetadata``: dtype, global size, chunks);
* a partition composite gives one chunk per member (``layouts/composite.md § Composition Semantics
  › Partition``): the member's shard offset and shape are the chunk's ``offsets`` and ``sizes``
  (``§ Members › Shard section``); any other array one chunk covering it.  A member or array that is
  not a dense tensor -- quantized, sparse, an overlay or a nested composite -- is written as its
  decoded values (what :func:`hurray_schema.load` gives; the report notes it), since a checkpoint
  holds plain strided tensors only;
* each chunk is the ``torch.save`` record DCP writes for it, byte for byte (bool one byte a value,
  as torch stores it; bfloat16 and the float8 types as their bytes);
* every KV entry is a non-tensor entry (``BytesStorageMetadata``): its value torch.save'd as a
  plain value.  :mod:`.dcp_format` keeps a checkpoint's non-tensor entries in the KV section under
  their own names, so they go back where they came from; a KV value that is JSON text stays text;
* records go into ``__<rank>_0.distcp`` files as ``ranks`` processes would have saved them:
  member ``i`` of every partition in the file of rank ``i mod ranks``, whole tensors and the
  non-tensor entries in rank 0's (a file holding no record is not written); in each file the
  non-tensor records first, then the chunks in the file's order, as FileSystemWriter orders them;
* ``.metadata`` is the protocol-4 pickle of torch's ``Metadata`` (``planner_data`` each name's
  path of one key, ``storage_data`` each record's ``_StorageInfo``, ``storage_meta`` the folder
  and a new save id, version 1.0.0).

Refused with a :class:`~hurray_schema.errors.HurraySchemaError` before anything is written: an
element type torch has no dtype for (int4, float4, a private type ...), members of a partition of
another type than its head, two arrays or a KV key and an array of one name, a KV value that is no
plain value, a chunk of 4 GiB or more (torch writes its zip64 fields, not written here).  The
folder is built under a temporary name beside ``dst`` and renamed to it once complete; ``dst``
must not exist yet or be an empty folder (:func:`.into_folder.new_folder`).
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import PurePosixPath

import attrs
import numpy as np

from ..errors import HurraySchemaError
from .dcp_emit import (MAX_MEMBER_BYTES, METADATA_PROTOCOL, BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                       MetadataIndex, StorageInfo, StorageMeta, TensorStorageMetadata, dumps, tensor_record,
                       value_record)
from .dcp_format import METADATA_FILE, TORCH_ELEMENT_TYPES
from .measure import decoded, describe, stored_bytes
from .report import ConvertReport, TensorReport

__all__ = ["into_dcp", "record_file_name", "DcpChunkOut", "DcpTensorOut"]

MATERIALIZED_NOTE = "written as its decoded values (a checkpoint holds plain tensors only)"


def record_file_name(rank: int) -> str:
    """FileSystemWriter's file of one rank: ``__<rank>_0.distcp`` (one file per rank, one thread)."""
    return f"__{rank}_0.distcp"


@attrs.frozen(slots=True)
class DcpChunkOut:
    """One chunk to write: its box in the tensor, the Hurray item holding its values, its rank."""

    offsets: tuple
    sizes: tuple
    item: object
    rank: int


@attrs.frozen(slots=True)
class DcpTensorOut:
    """One tensor entry to write: name, torch dtype name, global shape, chunks, the source item."""

    name: str
    dtype: str
    shape: tuple
    chunks: tuple
    item: object

    @property
    def materialized(self) -> bool:
        """Whether some chunk is not a dense tensor's bytes (quantized, sparse, composite ...)."""
        return any(not _is_dense(chunk.item) for chunk in self.chunks)


def into_dcp(src: str, dst: str, ranks: int, progress) -> ConvertReport:
    """Convert the Hurray file ``src`` into the checkpoint folder ``dst``, its records spread over
    ``ranks`` files; ``progress(done, total)`` after each chunk, in stored bytes."""
    from ..io import read_file
    from .into_folder import new_folder
    from .into_safetensors import named_arrays

    ranks = _rank_count(ranks)
    with read_file(src) as container:
        leaves = list(named_arrays(container))
        tensors = [_tensor_out(name, item, ranks, src) for name, item in leaves]
        values = _plain_values(container.metadata(), {t.name for t in tensors}, src)
        total = sum(stored_bytes(t.item) for t in tensors)
        with new_folder(dst) as folder:
            storage_data, written = _write_records(folder, tensors, values, ranks, progress, total)
            metadata = _metadata(tensors, values, storage_data, dst)
            _write_new(os.path.join(folder, METADATA_FILE), dumps(metadata, METADATA_PROTOCOL))
    rows = tuple(TensorReport(t.name, describe(t.item), _type_out(t), stored_bytes(t.item), written[t.name],
                              0.0, 0.0, True, False, MATERIALIZED_NOTE if t.materialized else "")
                 for t in tensors)
    return ConvertReport(src, dst, "hurray", "dcp", rows)


def _rank_count(ranks) -> int:
    """``ranks`` checked: a positive int."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise HurraySchemaError(f"ranks {ranks!r}: the number of .distcp files, at least 1")
    return ranks


def _type_out(tensor: DcpTensorOut) -> str:
    count = len(tensor.chunks)
    return f"torch.{tensor.dtype}" + (f" ({count} chunks)" if count != 1 else "")


# --------------------------------------------------------------------------------------
# What is written: checked before the folder is made
# --------------------------------------------------------------------------------------


def _torch_dtypes() -> dict:
    """NumPy / ml_dtypes dtype -> torch dtype name, for every dtype :mod:`.dcp_format` reads."""
    from ..model import ElementType
    from ..structs.element_types import numpy_dtype_of

    return {np.dtype(bool) if tag == ElementType.BOOL else np.dtype(numpy_dtype_of(tag)): name
            for name, (tag, _size) in TORCH_ELEMENT_TYPES.items()}


def _torch_dtype(item, name: str, src: str) -> str:
    """The torch dtype of ``item``'s decoded values, or a refusal naming the tensor."""
    found = _torch_dtypes().get(np.dtype(item.dtype))
    if found is None:
        raise HurraySchemaError(f"{src}: {name!r} decodes to {np.dtype(item.dtype).name}, which has no torch dtype "
                                "a checkpoint can hold")
    return found


def _is_dense(item) -> bool:
    """A plain tensor stored as its values (no quantization, no sparse or composite form)."""
    from ..io import Composite
    from ..model import RowMajorLayout

    if isinstance(item, Composite):
        return False
    return item.descriptor.quantization is None and isinstance(item.descriptor.layout, RowMajorLayout)


def _tensor_out(name: str, item, ranks: int, src: str) -> DcpTensorOut:
    """The entry of one array: a partition's members as chunks (member i on rank i mod ranks), any
    other array one chunk on rank 0; dtypes and chunk sizes checked."""
    from ..io import Composite
    from ..model import CompositionRule

    dtype = _torch_dtype(item, name, src)
    shape = tuple(int(n) for n in item.shape)
    if isinstance(item, Composite) and item.rule == CompositionRule.PARTITION:
        chunks = tuple(DcpChunkOut(tuple(member.descriptor.shard.shard_offset), tuple(member.shape), member, i % ranks)
                       for i, member in enumerate(item.members))
    else:
        chunks = (DcpChunkOut((0,) * len(shape), shape, item, 0),)
    itemsize = TORCH_ELEMENT_TYPES[dtype][1]
    for chunk in chunks:
        if _torch_dtype(chunk.item, name, src) != dtype:
            raise HurraySchemaError(f"{src}: a member of {name!r} at {list(chunk.offsets)} decodes to "
                                    f"{np.dtype(chunk.item.dtype).name}, not the partition's {dtype}")
        if math.prod(chunk.sizes) * itemsize > MAX_MEMBER_BYTES:
            raise HurraySchemaError(f"{src}: the chunk of {name!r} at {list(chunk.offsets)} is 4 GiB or more; "
                                    "torch.save writes such a record with zip64 fields, not written here "
                                    "(partition the tensor into smaller members)")
    return DcpTensorOut(name, dtype, shape, chunks, item)


def _plain_values(kv: dict, tensor_names: set, src: str) -> dict:
    """The KV section as non-tensor entries: each value plain data (NumPy values as Python's)."""
    clash = sorted(set(kv) & tensor_names)
    if clash:
        raise HurraySchemaError(f"{src}: {clash[0]!r} is both a KV key and an array; a checkpoint has one entry "
                                "per name")
    return {key: _plain(value, key, src) for key, value in kv.items()}


def _plain(value, key: str, src: str):
    """``value`` as plain data: None, bool, int, float, str, bytes, and lists, tuples and dicts of them."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item, key, src) for item in value)
    if isinstance(value, dict):
        return {_plain(k, key, src): _plain(v, key, src) for k, v in value.items()}
    raise HurraySchemaError(f"{src}: KV entry {key!r} holds a {type(value).__name__}, not a plain value a "
                            "checkpoint's non-tensor entry holds")


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def _chunk_bytes(chunk: DcpChunkOut) -> memoryview:
    """The chunk's values as torch stores them: row-major, bool one byte a value."""
    array = np.asarray(decoded(chunk.item), order="C")
    return memoryview(array.reshape(-1).view(np.uint8))


def _write_records(folder: str, tensors: list, values: dict, ranks: int, progress, total: int) -> tuple:
    """Write every ``.distcp`` file; (storage_data as {MetadataIndex: StorageInfo} in write
    order, bytes written per tensor)."""
    storage_data: dict = {}
    written = {t.name: 0 for t in tensors}
    done = 0
    for rank in range(ranks):
        records = [(name, None, None) for name in values] if rank == 0 else []
        records += [(t, i, chunk) for t in tensors for i, chunk in enumerate(t.chunks) if chunk.rank == rank]
        if not records:
            continue
        file_name = record_file_name(rank)
        with open(os.path.join(folder, file_name), "xb") as out:
            for entry, index, chunk in records:
                if chunk is None:
                    key, pieces = MetadataIndex(entry), value_record(values[entry])
                else:
                    key = MetadataIndex(entry.name, chunk.offsets, index)
                    pieces = tensor_record(entry.dtype, chunk.sizes, TORCH_ELEMENT_TYPES[entry.dtype][1],
                                           _chunk_bytes(chunk))
                offset = out.tell()
                for piece in pieces:
                    out.write(piece)
                storage_data[key] = StorageInfo(file_name, offset, out.tell() - offset)
                if chunk is not None:
                    written[entry.name] += out.tell() - offset
                    done += stored_bytes(chunk.item)
                    if progress is not None:
                        progress(done, total)
            out.flush()
            os.fsync(out.fileno())
    return storage_data, written


def _metadata(tensors: list, values: dict, storage_data: dict, dst: str) -> Metadata:
    """torch's ``Metadata`` of the folder: the tensor entries, then the non-tensor ones."""
    entries: dict = {t.name: TensorStorageMetadata(t.dtype, t.shape,
                                                   [ChunkStorageMetadata(c.offsets, c.sizes) for c in t.chunks])
                     for t in tensors}
    entries.update({name: BytesStorageMetadata() for name in values})
    planner_data = {name: (name,) for name in entries}
    folder = PurePosixPath(os.path.abspath(dst).replace(os.sep, "/"))
    return Metadata(entries, planner_data, storage_data, StorageMeta(folder.parts, str(uuid.uuid4())))


def _write_new(path: str, content: bytes) -> None:
    """Write ``content`` to the new file ``path``, flushed to disk."""
    with open(path, "xb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
