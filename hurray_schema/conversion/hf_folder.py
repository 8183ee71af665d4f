"""A Hugging Face model folder in: ``model.safetensors.index.json`` and the shards its
``weight_map`` names (or a folder holding one ``model.safetensors``), read into the
:class:`~.source.SourceTensor` list and the KV metadata of one Hurray file.

The folder is untrusted.  Before any shard is opened, every name the index gives is checked
to stay inside the folder (no ``..``, no absolute or drive path, no symbolic link leading out)
and to be a regular ``.safetensors`` file; the JSON files are read within
:data:`MAX_JSON_BYTES`.  Each shard is then read by :func:`.safetensors_format.read_safetensors`
(its header checked by the ``safetensors`` package, its bytes left in a memory map until the
Hurray writer copies them once), and the index is checked against what the shards hold: a
tensor the index places in a shard that lacks it, a tensor held by two shards (or named twice
by the index), a tensor no index entry names -- each a :class:`HurraySchemaError` naming the
tensor and the files.

What the folder says beyond its tensors goes into the KV section (``file-format.md § KV
Section Encoding``: keys unique UTF-8 strings), under keys of our own:

* ``hf.tied.<tied name>`` = the stored name: a tensor transformers leaves out of the folder
  because it shares another's storage (:func:`tied_aliases`);
* ``hf.index.<key>``: the index's ``metadata`` (``total_size``, ``total_parameters`` ...);
* ``hf.file.<file name>``: the text of the files :data:`CARRIED_FILES` (the model's
  ``config.json`` and ``generation_config.json``, and optimum-quanto's ``quanto_qmap.json``), so
  that the folder written back loads with ``from_pretrained``;
* the shards' ``__metadata__``: an entry every shard has with the same value is stored under
  its own key, as a single safetensors file's is; any other as ``hf.shard.<shard file>.<key>``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import PurePosixPath, PureWindowsPath
from typing import Optional

import attrs

from ..errors import HurraySchemaError, LimitExceeded
from ..limits import DEFAULT_LIMITS
from .source import SourceTensor

__all__ = ["INDEX_NAME", "SINGLE_NAME", "CARRIED_FILES", "MAX_JSON_BYTES", "TIED_PREFIX", "INDEX_PREFIX",
           "FILE_PREFIX", "SHARD_PREFIX", "KEY_PREFIX", "SHARD_SUFFIX", "is_folder_source", "read_folder",
           "tied_aliases", "plain_file_name"]

INDEX_NAME = "model.safetensors.index.json"
"""The index transformers and huggingface_hub write beside a model's shards."""

SINGLE_NAME = "model.safetensors"
"""The one weights file of a model saved without shards."""

SHARD_SUFFIX = ".safetensors"
"""What every shard's name ends with (huggingface_hub refuses an index naming other files)."""

CARRIED_FILES = ("config.json", "generation_config.json", "quanto_qmap.json")
"""The folder's files kept in the KV section: what ``from_pretrained`` reads besides the weights."""

MAX_JSON_BYTES = 10 * 1024 * 1024
"""The most bytes of an index or a carried file read: huggingface_hub's own bound on an index."""

KEY_PREFIX = "hf."
TIED_PREFIX = KEY_PREFIX + "tied."
INDEX_PREFIX = KEY_PREFIX + "index."
FILE_PREFIX = KEY_PREFIX + "file."
SHARD_PREFIX = KEY_PREFIX + "shard."

OUTPUT_EMBEDDING = "lm_head.weight"
"""The name transformers' language-model heads give the output embedding."""

INPUT_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight",
                    "shared.weight")
"""Last parts of the names transformers' models give the input embedding (Llama and most decoders,
GPT-2, BLOOM, InternLM, T5)."""


@attrs.frozen(slots=True)
class FolderIndex:
    """What a folder's index says: the folder, where each tensor is (``weight_map`` in its
    order), the index's ``metadata``, and the index file itself (None for a lone
    ``model.safetensors``)."""

    folder: str
    weight_map: tuple
    metadata: tuple
    index_path: Optional[str]

    @property
    def shard_names(self) -> tuple:
        """The shard files, each once, sorted (huggingface_hub's numbered names in their order)."""
        return tuple(sorted({shard for _, shard in self.weight_map}))


def is_folder_source(path) -> bool:
    """Whether ``path`` is a model folder or an index file rather than a single file."""
    path = os.fspath(path)
    return os.path.isdir(path) or path.endswith(".index.json")


def read_folder(path) -> tuple[dict, list[SourceTensor], list]:
    """(KV metadata, the tensors, the memory maps holding their bytes) of the folder or index
    ``path``: the shards in the order of their names, each one's tensors in its file order."""
    from .safetensors_format import read_safetensors

    index = _read_index(os.fspath(path))
    shard_paths = {name: _inside(index.folder, name, index) for name in index.shard_names}
    for name, shard_path in shard_paths.items():
        _require_regular(shard_path, f"shard {name!r}", index)
    config_texts = _carried_files(index.folder)
    read = {name: read_safetensors(shard_path) for name, shard_path in shard_paths.items()}
    held = {name: tuple(t.name for t in tensors) for name, (_, tensors, _) in read.items()}
    _check_against_shards(index, held)
    sources = [tensor for _, tensors, _ in read.values() for tensor in tensors]
    metadata = _metadata(index, {name: meta for name, (meta, _, _) in read.items()}, config_texts,
                         [t.name for t in sources])
    return metadata, sources, [mapped for _, _, mapped in read.values()]


# --------------------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------------------


def _read_index(path: str) -> FolderIndex:
    """The folder's index; a folder without one but with ``model.safetensors`` is that file alone."""
    if os.path.isdir(path):
        folder = path
        index_path = os.path.join(folder, INDEX_NAME)
        if not os.path.lexists(index_path):
            return _single_file_index(folder)
        _require_inside(index_path, os.path.realpath(folder))
    else:
        folder, index_path = os.path.dirname(path) or ".", path
    folder = os.path.realpath(folder)
    raw = read_bounded(index_path, f"the index {index_path}")
    document = parse_json(raw, index_path)
    weight_map, metadata = _index_fields(document, index_path)
    return FolderIndex(folder, weight_map, metadata, index_path)


def _single_file_index(folder: str) -> FolderIndex:
    """A folder whose weights are one ``model.safetensors``: an index of that file alone, the
    names taken from the file itself once it is read."""
    single = os.path.join(folder, SINGLE_NAME)
    if not os.path.lexists(single):
        raise HurraySchemaError(f"{folder}: neither {INDEX_NAME} nor {SINGLE_NAME} is in the folder")
    return FolderIndex(os.path.realpath(folder), ((None, SINGLE_NAME),), (), None)


class _RepeatedKey(Exception):
    """A JSON object naming a key twice (``json`` keeps the last silently)."""


def _object_without_repeats(pairs: list) -> dict:
    """A JSON object as a dict, refusing a key given twice."""
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key, seen[key], value)
        seen[key] = value
    return seen


def parse_json(raw: bytes, path: str):
    """The JSON document ``raw`` read from ``path``; any fault a :class:`HurraySchemaError`."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_object_without_repeats)
    except _RepeatedKey as repeated:
        key, first, second = repeated.args
        raise HurraySchemaError(f"{path}: {key!r} is given twice ({_shown(first)} and {_shown(second)}); "
                                "a tensor is in one shard only") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise HurraySchemaError(f"{path}: not a JSON document ({type(exc).__name__}: {str(exc)[:200]})") from None


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _index_fields(document, index_path: str) -> tuple[tuple, tuple]:
    """(``weight_map`` as (tensor, shard) pairs, ``metadata`` as (key, value) pairs) of the index."""
    if not isinstance(document, dict) or not isinstance(document.get("weight_map"), dict):
        raise HurraySchemaError(f"{index_path}: an index is a JSON object with a 'weight_map' object")
    weight_map = document["weight_map"]
    if not weight_map:
        raise HurraySchemaError(f"{index_path}: the weight_map names no tensor")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise HurraySchemaError(f"{index_path}: tensor {tensor!r} is placed in {_shown(shard)}, not a file name")
    metadata = document.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise HurraySchemaError(f"{index_path}: the index's 'metadata' is not a JSON object")
    return tuple(weight_map.items()), tuple(metadata.items())


# --------------------------------------------------------------------------------------
# Names that must stay in the folder
# --------------------------------------------------------------------------------------


def plain_file_name(name: str) -> bool:
    """Whether ``name`` is one file name and nothing more: no folder part, no ``..``, nothing a
    Windows or POSIX reader would take as a root or a drive, no NUL."""
    return (bool(name) and "\0" not in name and name not in (".", "..")
            and len(PurePosixPath(name).parts) == 1 and len(PureWindowsPath(name).parts) == 1
            and not PureWindowsPath(name).drive)


def _inside(folder: str, name: str, index: FolderIndex) -> str:
    """The path of the shard ``name`` the index gives, refused unless it is a relative
    ``.safetensors`` name whose real path (links followed) is inside ``folder``."""
    where = index.index_path or folder
    windows = PureWindowsPath(name)
    if (not name or "\0" in name or windows.drive or windows.root or ".." in windows.parts
            or ".." in PurePosixPath(name).parts or os.path.isabs(name)):
        raise HurraySchemaError(f"{where}: shard {name!r} is not a path inside the folder {folder}")
    if not name.endswith(SHARD_SUFFIX):
        raise HurraySchemaError(f"{where}: shard {name!r} is not a {SHARD_SUFFIX} file")
    real = os.path.realpath(os.path.join(folder, name))
    if os.path.commonpath([real, folder]) != folder:
        raise HurraySchemaError(f"{where}: shard {name!r} leads outside the folder {folder} (to {real})")
    return real


def _require_inside(path: str, folder: str) -> str:
    """The real path of ``path`` (links followed), refused unless it is inside ``folder``."""
    real = os.path.realpath(path)
    if os.path.commonpath([real, folder]) != folder:
        raise HurraySchemaError(f"{path} leads outside the folder {folder} (to {real})")
    return real


def _require_regular(path: str, what: str, index: FolderIndex) -> None:
    """Refuse a missing shard, or one that is not a regular file (a FIFO would block the read)."""
    where = index.index_path or index.folder
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise HurraySchemaError(f"{where}: {what} is missing ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise HurraySchemaError(f"{where}: {what} is not a regular file")


def read_bounded(path: str, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused past :data:`MAX_JSON_BYTES` (read at most
    one byte beyond it, whatever its size says)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise HurraySchemaError(f"{what} cannot be read ({exc.strerror})") from None
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HurraySchemaError(f"{what} is not a regular file")
        if info.st_size > MAX_JSON_BYTES:
            raise LimitExceeded(f"bytes of {what}", info.st_size, MAX_JSON_BYTES)
        raw = f.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise LimitExceeded(f"bytes of {what}", len(raw), MAX_JSON_BYTES)
    return raw


def _carried_files(folder: str) -> dict:
    """name -> text (or bytes, when not UTF-8) of each :data:`CARRIED_FILES` in ``folder``, read
    only when it is a regular file inside the folder."""
    texts = {}
    for name in CARRIED_FILES:
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            continue
        raw = read_bounded(_require_inside(path, folder), path)
        try:
            texts[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            texts[name] = raw
    return texts


# --------------------------------------------------------------------------------------
# The index against the shards
# --------------------------------------------------------------------------------------


def _check_against_shards(index: FolderIndex, held: dict) -> None:
    """Refuse a folder whose index and shards disagree: a tensor in two shards, one the index
    places where it is not, one no index entry names."""
    files_of: dict = {}
    for shard, names in held.items():
        for name in names:
            files_of.setdefault(name, []).append(shard)
    for name, shards in files_of.items():
        if len(shards) > 1:
            raise HurraySchemaError(f"tensor {name!r} is in two files: {shards[0]} and {shards[1]}")
    if index.index_path is None:
        return
    placed = dict(index.weight_map)
    for name, shard in index.weight_map:
        if shard not in files_of.get(name, ()):
            elsewhere = f" (it is in {files_of[name][0]})" if name in files_of else ""
            raise HurraySchemaError(f"{index.index_path}: tensor {name!r} is missing from its shard {shard}"
                                    f"{elsewhere}")
    for name, (shard,) in files_of.items():
        if name not in placed:
            raise HurraySchemaError(f"{index.index_path}: tensor {name!r} of {shard} is not in the weight_map")


# --------------------------------------------------------------------------------------
# The KV metadata
# --------------------------------------------------------------------------------------


def tied_aliases(config_text, names, config_path: str = "config.json") -> dict:
    """{tied name: stored name} of the tensors the folder leaves out because they are tied.

    transformers records a tie only as ``"tie_word_embeddings": true`` in ``config.json`` (which
    tensors it ties is a property of the model's class); it then saves the input embedding and
    not the output one.  So: when the config says so, ``lm_head.weight`` is not among ``names``
    and exactly one of them is an input embedding (:data:`INPUT_EMBEDDINGS`), the head is that
    embedding."""
    if config_text is None or OUTPUT_EMBEDDING in names:
        return {}
    try:
        config = json.loads(config_text)
    except (TypeError, ValueError, RecursionError):
        raise HurraySchemaError(f"{config_path}: not a JSON document") from None
    if not isinstance(config, dict) or config.get("tie_word_embeddings") is not True:
        return {}
    embeddings = [n for n in names if any(n == part or n.endswith("." + part) for part in INPUT_EMBEDDINGS)]
    return {OUTPUT_EMBEDDING: embeddings[0]} if len(embeddings) == 1 else {}


def _metadata(index: FolderIndex, shard_metadata: dict, carried: dict, names: list) -> dict:
    """The KV section of the converted file (the key names: the module docstring)."""
    metadata: dict = {}
    metadata.update(_shared_shard_metadata(shard_metadata))
    metadata.update({INDEX_PREFIX + str(key): kv_value(value) for key, value in index.metadata})
    metadata.update({FILE_PREFIX + name: text for name, text in carried.items()})
    aliases = tied_aliases(carried.get("config.json"), set(names), os.path.join(index.folder, "config.json"))
    metadata.update({TIED_PREFIX + alias: stored for alias, stored in aliases.items()})
    _check_kv(metadata, index.index_path or index.folder)
    return metadata


def _shared_shard_metadata(shard_metadata: dict) -> dict:
    """The shards' ``__metadata__``: entries all shards share under their own key, others per shard."""
    every = list(shard_metadata.values())
    shared = {key: value for key, value in every[0].items()
              if not key.startswith(KEY_PREFIX) and all(m.get(key) == value for m in every)}
    out = dict(shared)
    for shard, meta in shard_metadata.items():
        out.update({f"{SHARD_PREFIX}{shard}.{key}": value for key, value in meta.items() if key not in shared})
    return out


def kv_value(value):
    """A JSON value as a KV value: a string, a boolean, a float or an integer (int64 or uint64) as
    it is, anything else (an object, a list, null, a larger integer) as its JSON text."""
    if isinstance(value, (str, bool, float)):
        return value
    if isinstance(value, int) and -(1 << 63) <= value < 1 << 64:
        return value
    return json.dumps(value, separators=(",", ":"))


def _check_kv(metadata: dict, where: str) -> None:
    """Refuse metadata a reader with the default limits would refuse (or that cannot be encoded):
    more entries than ``max_kv_entries``, a longer section than ``max_kv_bytes``, a string
    that is not valid UTF-8 (a lone surrogate from a JSON escape)."""
    from ..io.walk.kv import encode_kv

    DEFAULT_LIMITS.check("max_kv_entries", len(metadata))
    for key, value in metadata.items():
        for text in (key, value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise HurraySchemaError(f"{where}: metadata {_shown(key)} is not valid UTF-8") from None
        if isinstance(value, (str, bytes)):
            DEFAULT_LIMITS.check("max_kv_value_bytes", len(value.encode("utf-8") if isinstance(value, str) else value))
    DEFAULT_LIMITS.check("max_kv_bytes", len(encode_kv(metadata)))
