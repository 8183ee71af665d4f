""":func:`convert`: the formats told apart (:func:`detect_format`), the options checked, then one of
the pipelines run -- :mod:`.into_hurray`, :mod:`.into_safetensors`, :mod:`.into_folder` or
:mod:`.into_dcp`."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ..errors import HurraySchemaError
from .into_dcp import into_dcp
from .into_hurray import into_hurray
from .into_folder import into_folder, resolve_shard_size
from .into_safetensors import into_safetensors
from .options import ConvertOptions, grid_option, scheme_option
from .report import ConvertReport

__all__ = ["convert", "detect_format", "FORMATS", "DEFAULT_MEMORY"]

FORMATS = ("hurray", "safetensors", "gguf", "hf", "dcp")
"""The formats: ``hf`` is a Hugging Face model folder (safetensors shards and their index), ``dcp``
a PyTorch Distributed Checkpoint folder."""

DEFAULT_MEMORY = 1 << 30
"""Bytes of converted buffers held in memory before the rest waits in a temporary file."""


def detect_format(path, *, output: bool = False) -> str:
    """"hurray", "safetensors", "gguf", "hf" or "dcp": an input folder holding a ``.metadata`` is a
    PyTorch Distributed Checkpoint ("dcp"), any other input folder or index file (``*.index.json``)
    "hf", any other input is told by its first bytes (then its extension); an output that is an
    existing folder or ends with a path separator is "hf", any other is told by its extension
    (.safetensors, .gguf; anything else is a Hurray file).  A DCP output is asked for by name
    (``to="dcp"``): an empty folder says nothing of the format meant."""
    from ..structs.file import FILE_MAGIC
    from .dcp_format import is_dcp_folder
    from .gguf_format import GGUF_MAGIC
    from .hf_folder import is_folder_source

    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if output:
        if os.path.isdir(path) or path.endswith((os.sep, "/")):
            return "hf"
        return {".safetensors": "safetensors", ".gguf": "gguf"}.get(ext, "hurray")
    if is_dcp_folder(path):
        return "dcp"
    if is_folder_source(path):
        return "hf"
    with open(path, "rb") as f:
        head = f.read(len(FILE_MAGIC))
    if head.startswith(GGUF_MAGIC):
        return "gguf"
    if head.startswith(FILE_MAGIC):
        return "hurray"
    if ext in (".hrry", ".gguf"):
        return ext[1:] if ext == ".gguf" else "hurray"
    return "safetensors"


def convert(src, dst, *, to: Optional[str] = None, dequantize: bool = False, requantize=None, quantize=None,
            spqr: Optional[float] = None, partition=None, select: Optional[Sequence[str]] = None,
            verify: bool = False, memory: int = DEFAULT_MEMORY, max_shard_size=None,
            progress: Optional[Callable[[int, int], None]] = None, validate: bool = True,
            ranks: Optional[int] = None, quantized_as: Optional[str] = None) -> ConvertReport:
    """Convert ``src`` into ``dst`` and return the per-tensor report.

    ``src``: safetensors, GGUF or Hurray (recognised by its first bytes); a Hugging Face model
    folder -- the folder holding ``model.safetensors.index.json`` and the shards it names (or one
    ``model.safetensors``), or the index file itself (:mod:`.hf_folder`: names leading out of the
    folder, missing shards or tensors, a tensor in two shards are refused before anything is
    written; tied weights stored once, the tie and the folder's ``config.json`` kept in the KV
    section); or a folder saved by ``torch.distributed.checkpoint.save`` (read without torch,
    :mod:`.dcp_format`).  ``dst``: Hurray; or safetensors when ``to="safetensors"`` or its name
    ends in ``.safetensors``, or a model folder when ``to="hf"``, ``max_shard_size`` is given or
    ``dst`` is an existing (empty) folder -- both from a Hurray file only.  The folder is sharded
    as huggingface_hub shards (``max_shard_size``: bytes, or a string such as ``"2GB"``; 5 GB by
    default) and loads with transformers' ``from_pretrained`` when the Hurray file carries the
    model's ``config.json`` (:mod:`.into_folder`).  With ``to="dcp"`` (from a Hurray file only),
    ``dst`` becomes a PyTorch Distributed Checkpoint folder that ``torch.distributed.checkpoint.load``
    reads, written without torch (:mod:`.into_dcp`): a partition's members as the chunks of its
    tensor, spread over ``ranks`` files ``__<rank>_0.distcp`` (member ``i`` on rank ``i mod ranks``;
    default 1 file), other arrays as one chunk, the KV entries as non-tensor entries.

    A DCP tensor saved in several chunks becomes a partition composite, one member per distinct
    chunk.  If its chunks leave a gap or overlap, the strict writer refuses the file with the
    partition rule's :class:`~hurray_schema.errors.SpecViolation`
    (``composite.close.partition_gap`` / ``composite.close.partition_overlap``) and writes
    nothing; ``validate=False`` writes it anyway (no rule is checked), for
    :func:`hurray_schema.audit` to report.

    GGUF types without an exact Hurray form are refused with :class:`NoExactForm` naming the
    tensor and its type, unless ``dequantize=True`` (stored as float32: gguf-py's values,
    exact) or ``requantize="SCHEME[:storage]"`` (those values quantized by
    :func:`hurray_schema.quantize`).

    ``quantize="SCHEME[:storage]"`` (:func:`hurray_schema.quantize`), ``spqr=OUTLIERS``
    (:func:`hurray_schema.spqr`, a fraction of the elements) and ``partition=GRID`` ("2x2", or
    pieces per dimension; each piece quantized / SpQR'd when those are given too) apply, on the
    way into Hurray, to the tensors named by ``select`` (globs) -- by default every 2-D float
    tensor whose name has no "embed", "embd", "norm" or "bias".

    ``verify=True`` decodes every output tensor and measures it against the input's values
    (a quantized or SpQR'd tensor is always measured).  ``memory``: converted bytes held in
    memory before the rest waits in a temporary file.  ``progress(done, total)`` is called
    after each tensor with input bytes.

    Every error is a :class:`~hurray_schema.errors.HurraySchemaError`; on error nothing is
    written (the previous ``dst``, if any, is untouched)."""
    src, dst = os.fspath(src), os.fspath(dst)
    if not (os.path.isfile(src) or os.path.isdir(src) or (os.path.exists(src) and src.endswith(".index.json"))):
        raise HurraySchemaError(f"{src}: no such file or folder")
    source_format = detect_format(src)
    target = to or ("hf" if max_shard_size is not None else detect_format(dst, output=True))
    if target not in FORMATS:
        raise HurraySchemaError(f"unknown output format {target!r}; one of {FORMATS}")
    if max_shard_size is not None and target != "hf":
        raise HurraySchemaError("max_shard_size applies to a model folder output (to='hf')")
    if quantized_as is not None and target != "hf":
        raise HurraySchemaError("quantized_as applies to a model folder output (to='hf')")
    if ranks is not None and target != "dcp":
        raise HurraySchemaError("ranks applies to a Distributed Checkpoint output (to='dcp')")
    options = ConvertOptions(bool(dequantize), scheme_option(requantize, "requantize"),
                             scheme_option(quantize, "quantize"), None if spqr is None else float(spqr),
                             grid_option(partition), tuple(select) if select else None, bool(verify))
    if source_format == "hurray" and target in ("safetensors", "hf", "dcp"):
        if options.transforms or options.requantize:
            raise HurraySchemaError("quantize, spqr, partition and requantize apply on the way into Hurray")
        if target == "dcp":
            return into_dcp(src, dst, 1 if ranks is None else ranks, progress)
        if target == "hf":
            return into_folder(src, dst, resolve_shard_size(max_shard_size), progress, quantized_as)
        return into_safetensors(src, dst, progress)
    if target != "hurray" or source_format == "hurray":
        raise HurraySchemaError(f"{source_format} -> {target} is not a conversion here: safetensors (a file or a "
                                "model folder), GGUF or DCP into Hurray, Hurray into safetensors, a model folder or "
                                "DCP")
    return into_hurray(src, dst, source_format, options, memory, progress, validate=bool(validate))
