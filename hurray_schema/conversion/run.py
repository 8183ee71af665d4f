""":func:`convert`: the formats told apart (:func:`detect_format`), the options checked, then one of
the two pipelines run -- :mod:`.into_hurray` or :mod:`.into_safetensors`."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ..errors import HurraySchemaError
from .into_hurray import into_hurray
from .into_safetensors import into_safetensors
from .options import ConvertOptions, grid_option, scheme_option
from .report import ConvertReport

__all__ = ["convert", "detect_format", "FORMATS", "DEFAULT_MEMORY"]

FORMATS = ("hurray", "safetensors", "gguf", "dcp")

DEFAULT_MEMORY = 1 << 30
"""Bytes of converted buffers held in memory before the rest waits in a temporary file."""


def detect_format(path, *, output: bool = False) -> str:
    """"hurray", "safetensors", "gguf" or "dcp": an input by its first bytes (then its extension),
    a folder holding a ``.metadata`` as a PyTorch Distributed Checkpoint; an output by its
    extension (.safetensors, .gguf; anything else is a Hurray file)."""
    from ..structs.file import FILE_MAGIC
    from .dcp_format import is_dcp_folder
    from .gguf_format import GGUF_MAGIC

    ext = os.path.splitext(os.fspath(path))[1].lower()
    if output:
        return {".safetensors": "safetensors", ".gguf": "gguf"}.get(ext, "hurray")
    if os.path.isdir(path):
        if is_dcp_folder(path):
            return "dcp"
        raise HurraySchemaError(f"{path}: a folder without a .metadata file (a PyTorch Distributed Checkpoint's)")
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
            verify: bool = False, memory: int = DEFAULT_MEMORY,
            progress: Optional[Callable[[int, int], None]] = None, validate: bool = True) -> ConvertReport:
    """Convert the file ``src`` into ``dst`` and return the per-tensor report.

    ``src``: safetensors, GGUF or Hurray (recognised by its first bytes), or a folder saved by
    ``torch.distributed.checkpoint.save`` (read without torch, :mod:`.dcp_format`); ``dst``:
    Hurray, or safetensors when ``to="safetensors"`` or its name ends in ``.safetensors`` (from a
    Hurray file only).

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
    if not os.path.isfile(src) and not os.path.isdir(src):
        raise HurraySchemaError(f"{src}: no such file")
    source_format = detect_format(src)
    target = to or detect_format(dst, output=True)
    if target not in FORMATS:
        raise HurraySchemaError(f"unknown output format {target!r}; one of {FORMATS}")
    options = ConvertOptions(bool(dequantize), scheme_option(requantize, "requantize"),
                             scheme_option(quantize, "quantize"), None if spqr is None else float(spqr),
                             grid_option(partition), tuple(select) if select else None, bool(verify))
    if source_format == "hurray" and target == "safetensors":
        if options.transforms or options.requantize:
            raise HurraySchemaError("quantize, spqr, partition and requantize apply on the way into Hurray")
        return into_safetensors(src, dst, progress)
    if target != "hurray" or source_format == "hurray":
        raise HurraySchemaError(f"{source_format} -> {target} is not a conversion here: safetensors, GGUF or "
                                "DCP into Hurray, Hurray into safetensors")
    return into_hurray(src, dst, source_format, options, memory, progress, validate=bool(validate))
