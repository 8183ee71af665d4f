"""Hurray into a Hugging Face model folder: the tensors decoded as for one safetensors file
(:mod:`.into_safetensors`), cut into shards the way huggingface_hub cuts a state dict
(:func:`cut_into_shards`), written as ``model-0000i-of-0000N.safetensors`` with
``model.safetensors.index.json`` (one ``model.safetensors`` and no index when everything fits
one shard), beside the files the KV section carries (``hf.file.*``: ``config.json`` ...).

Nothing is lost: the folder is built under a temporary name beside ``dst`` and renamed to
``dst`` once every file is written and flushed; ``dst`` must not exist yet, or be an empty
folder.  The KV keys read back are those :mod:`.hf_folder` writes: a tie (``hf.tied.*``) is
not written as a tensor (transformers re-ties from ``config.json`` and expects the copy absent),
``hf.index.*`` goes into the index's ``metadata`` (``total_size`` recomputed), the keys of no
``hf.`` kind into each shard's ``__metadata__`` (``format`` = ``pt`` unless given), and
``hf.shard.*`` (what the input's shards said) is left out.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
from typing import Iterator, Optional, Union

import numpy as np

from ..errors import HurraySchemaError
from .hf_folder import (
    FILE_PREFIX, INDEX_NAME, INDEX_PREFIX, KEY_PREFIX, SINGLE_NAME, TIED_PREFIX, plain_file_name,
)
from .measure import stored_bytes
from .report import ConvertReport

__all__ = ["into_folder", "cut_into_shards", "shard_file_names", "parse_shard_size", "resolve_shard_size",
           "DEFAULT_MAX_SHARD_SIZE"]

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
"""huggingface_hub's default largest shard (``MAX_SHARD_SIZE = "5GB"``)."""

SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}
"""The units huggingface_hub's ``parse_size_to_int`` knows (powers of 1000)."""

SHARD_PATTERN = "model{suffix}.safetensors"
"""huggingface_hub's file name pattern for safetensors weights; ``suffix`` is ``-0000i-of-0000N``."""

SHARD_FORMAT_KEY, SHARD_FORMAT = "format", "pt"
"""What huggingface_hub writes into every shard's ``__metadata__``."""


def parse_shard_size(value: Union[int, str]) -> int:
    """A largest shard in bytes: an int, or a string as huggingface_hub reads one ("2GB",
    "500MB", "1.5GB", "1000"; units KB, MB, GB, TB are powers of 1000)."""
    if isinstance(value, bool):
        raise HurraySchemaError(f"max_shard_size {value!r}: a byte count, like 2GB")
    if isinstance(value, int):
        size = value
    else:
        text = str(value).strip()
        unit = text[-2:].upper()
        number, multiplier = (text[:-2], SIZE_UNITS[unit]) if unit in SIZE_UNITS else (text, 1)
        try:
            size = int(float(number.strip()) * multiplier)
        except (ValueError, OverflowError):
            raise HurraySchemaError(f"max_shard_size {value!r}: a byte count, like 2GB") from None
    if size < 1:
        raise HurraySchemaError(f"max_shard_size {value!r}: at least one byte")
    return size


def cut_into_shards(sizes: list, max_shard_size: int) -> list:
    """Shards (lists of indices into ``sizes``) as huggingface_hub's
    ``split_state_dict_into_shards_factory`` cuts tensors of these byte sizes, in order: a tensor
    larger than the maximum gets a shard of its own, where it stands; otherwise a tensor that
    would take the current shard past the maximum starts a new one."""
    shards: list = []
    current: list = []
    current_size = 0
    for i, size in enumerate(sizes):
        if size > max_shard_size:
            shards.append([i])
            continue
        if current_size + size > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(i)
        current_size += size
    if current:
        shards.append(current)
    return shards


def shard_file_names(count: int) -> list:
    """``model.safetensors`` for one shard, else ``model-00001-of-0000N.safetensors`` ..."""
    if count == 1:
        return [SHARD_PATTERN.format(suffix="")]
    return [SHARD_PATTERN.format(suffix=f"-{i + 1:05d}-of-{count:05d}") for i in range(count)]


def into_folder(src: str, dst: str, max_shard_size: int, progress, quantized_as: Optional[str] = None) -> ConvertReport:
    """Convert the Hurray file ``src`` into the model folder ``dst``; ``progress(done, total)``
    after each tensor, in stored bytes.  Quantized tensors are written as the parts of the method
    ``quantized_as`` names, by default the method of the carried ``config.json``
    (:func:`.quantized.checkpoint.outward`); without either, decoded."""
    from ..io import read_file
    from .into_safetensors import unique_arrays
    from .quantized.checkpoint import outward
    from .safetensors_format import output_type

    with read_file(src) as container:
        leaves, metadata = outward(unique_arrays(container, src), container.metadata(), quantized_as)
        names = [name for name, _ in leaves]
        _check_ties(metadata, set(names), src)
        sizes = [math.prod(item.shape) * output_type(np.dtype(item.dtype))[1].itemsize for _, item in leaves]
        shards = cut_into_shards(sizes, max_shard_size)
        files = shard_file_names(len(shards))
        shard_metadata = _shard_metadata(metadata)
        carried = _carried_files(metadata, src)
        total = sum(stored_bytes(item) for _, item in leaves)
        rows: list = []
        with new_folder(dst) as folder:
            for file, members in zip(files, shards):
                rows += _write_shard(os.path.join(folder, file), [leaves[i] for i in members], shard_metadata,
                                     progress, total, sum(r.bytes_in for r in rows))
            if len(files) > 1:
                weight_map = {leaves[i][0]: file for file, members in zip(files, shards) for i in members}
                _write_bytes(os.path.join(folder, INDEX_NAME), _index_json(metadata, weight_map, sum(sizes)))
            for name, content in carried.items():
                _write_bytes(os.path.join(folder, name), content)
    return ConvertReport(src, dst, "hurray", "hf", tuple(rows))


def _write_shard(path: str, leaves: list, metadata: dict, progress, total: int, done: int) -> list:
    """Write one shard of ``leaves`` (decoded one at a time); its report rows."""
    from .into_safetensors import write_leaves

    with open(path, "wb") as out:
        rows = write_leaves(out, leaves, metadata, progress, total, done)
        out.flush()
        os.fsync(out.fileno())
    return rows


def _write_bytes(path: str, content: Union[str, bytes]) -> None:
    """Write ``content`` (text as UTF-8) to the new file ``path``, flushed to disk."""
    with open(path, "xb") as out:
        out.write(content.encode("utf-8") if isinstance(content, str) else bytes(content))
        out.flush()
        os.fsync(out.fileno())


def _check_ties(metadata: dict, names: set, src: str) -> None:
    """Refuse a tie (``hf.tied.*``) whose stored tensor is not in the file: the folder would
    load with that weight left as initialized."""
    for key, stored in metadata.items():
        if key.startswith(TIED_PREFIX) and stored not in names:
            raise HurraySchemaError(f"{src}: {key} names {_text(stored)!r}, which is not a tensor of the file")


def _shard_metadata(metadata: dict) -> dict:
    """Each shard's ``__metadata__``: the KV entries of no ``hf.`` kind, ``format`` = ``pt`` unless given."""
    shard = {key: value for key, value in metadata.items() if not key.startswith(KEY_PREFIX)}
    shard.setdefault(SHARD_FORMAT_KEY, SHARD_FORMAT)
    return shard


def _index_json(metadata: dict, weight_map: dict, total_size: int) -> bytes:
    """``model.safetensors.index.json``: the carried index metadata, ``total_size`` as written."""
    index_metadata = {key[len(INDEX_PREFIX):]: _json_value(value) for key, value in metadata.items()
                      if key.startswith(INDEX_PREFIX)}
    index_metadata["total_size"] = total_size
    return json.dumps({"metadata": index_metadata, "weight_map": weight_map}, indent=2).encode("utf-8")


def _json_value(value):
    """A KV value as JSON: bytes as hex, arrays as lists, the rest as they are."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def _text(value) -> str:
    return value if isinstance(value, str) else repr(value)


def _carried_files(metadata: dict, src: str) -> dict:
    """file name -> content of the ``hf.file.*`` entries; a name that is not one plain file name
    (or would stand for the weights) is refused."""
    files = {}
    for key, content in metadata.items():
        if not key.startswith(FILE_PREFIX):
            continue
        name = key[len(FILE_PREFIX):]
        if not plain_file_name(name) or name.startswith(".") or name in (INDEX_NAME, SINGLE_NAME) \
                or name.endswith(".safetensors"):
            raise HurraySchemaError(f"{src}: {key!r} names no file this conversion writes into a folder")
        if not isinstance(content, (str, bytes, bytearray, memoryview)):
            raise HurraySchemaError(f"{src}: {key!r} is not a file's text or bytes")
        files[name] = content
    return files


@contextlib.contextmanager
def new_folder(dst: str) -> Iterator[str]:
    """A temporary folder beside ``dst`` to build the output in; renamed to ``dst`` when the block
    ends without an error, removed otherwise.  ``dst`` must not exist, or be an empty folder."""
    dst = os.path.abspath(dst)
    _refuse_existing(dst)
    parent, base = os.path.split(dst)
    temp = _make_temporary(parent, base)
    try:
        yield temp
        _sync(temp)
        _refuse_existing(dst)
        os.rename(temp, dst)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    _sync(parent)


def _refuse_existing(dst: str) -> None:
    """Refuse a ``dst`` that exists as anything but an empty folder."""
    if not os.path.lexists(dst):
        return
    if os.path.islink(dst) or not os.path.isdir(dst) or os.listdir(dst):
        raise HurraySchemaError(f"{dst} exists (and is not an empty folder): the output folder is not replaced")


def _make_temporary(parent: str, base: str) -> str:
    """A new folder named ``.<base>.<random>.hurray-convert`` in ``parent`` (the umask applies)."""
    for _ in range(100):
        temp = os.path.join(parent, f".{base}.{secrets.token_hex(4)}.hurray-convert")
        try:
            os.mkdir(temp, 0o777)
            return temp
        except FileExistsError:
            continue
        except OSError as exc:
            raise HurraySchemaError(f"{parent}: cannot create a folder there ({exc.strerror})") from None
    raise HurraySchemaError(f"{parent}: no free temporary folder name")  # pragma: no cover


def _sync(folder: str) -> None:
    """Make a folder's entries durable where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


def resolve_shard_size(value: Optional[Union[int, str]]) -> int:
    """``max_shard_size`` given or huggingface_hub's default."""
    return DEFAULT_MAX_SHARD_SIZE if value is None else parse_shard_size(value)
