"""Conversion between Hurray files and the formats models ship in: safetensors, GGUF and PyTorch
Distributed Checkpoints.

:func:`convert` reads safetensors (through the ``safetensors`` package), GGUF (through the
``gguf`` package's ``GGUFReader``) or a DCP folder (without torch: :mod:`.dcp_format`) and writes
a ``.hrry`` file, or reads a ``.hrry`` file and writes safetensors, a model folder or a DCP folder;
it returns a
:class:`ConvertReport` with a row per tensor.

* safetensors -> Hurray: names, shapes and dtypes kept (:data:`.safetensors_format.SAFETENSORS_TYPES`),
  ``__metadata__`` into the KV section; bool packed 8 to a byte (``element-types.md § Boolean Type``).
* GGUF -> Hurray: dense types as byte copies, the scale-times-integer block types as per-block
  affine tensors that decode to GGUF's float32 values bit for bit (:mod:`.gguf_blocks`), the rest
  refused unless ``dequantize`` (float32, exact) or ``requantize`` is given.
* DCP -> Hurray: a tensor saved in N chunks as a partition composite of N members (one chunk
  covering it: a plain tensor), the chunks' bytes as saved; non-tensor entries into the KV
  section; both pickles read by allow-list unpicklers of stand-ins (:mod:`.dcp_pickle`).
* Hurray -> safetensors: every tensor decoded, partitions and overlays merged, groups opened into
  their members' names (as :func:`hurray_schema.load` names them).
* Hurray -> DCP (``to="dcp"``): a partition's members as the chunks of its tensor, other arrays as
  one chunk, KV entries as non-tensor entries, written as torch writes them without torch
  (:mod:`.into_dcp`, :mod:`.dcp_emit`).
* A Hugging Face model folder (``model.safetensors.index.json`` and its shards) -> Hurray, every
  shard read as one safetensors file, the index checked against them, tied weights stored once
  (:mod:`.hf_folder`); Hurray -> a folder, sharded as huggingface_hub shards (:mod:`.into_folder`).

Each tensor is converted on its own; converted buffers beyond ``memory`` bytes wait in a
temporary file beside the output rather than in memory, input bytes stored as they are
stay in the input's memory map, and GGUF Q4_0 tensors are re-packed from that map while
the output is written (:class:`~hurray_schema.io.tensor.ProducedTensor`).  The output replaces ``dst`` only once complete (a Hurray
file after every descriptor passed the strict rules, :func:`hurray_schema.write_file`).

The modules: :mod:`.run` (:func:`convert`, the formats), :mod:`.options`, :mod:`.into_hurray`,
:mod:`.into_safetensors`, :mod:`.into_folder` and :mod:`.into_dcp` (the pipelines), :mod:`.measure` (a tensor's form
and how far its values moved), :mod:`.spill` (buffers waiting for the writer), :mod:`.report`; the
formats read in :mod:`.safetensors_format`, :mod:`.hf_folder`, :mod:`.gguf_format`,
:mod:`.gguf_blocks`, :mod:`.dcp_format` and :mod:`.dcp_pickle` (written by :mod:`.dcp_emit`).

The ``safetensors`` and ``gguf`` packages are imported only when a file of theirs is read
(the ``[safetensors]`` and ``[gguf]`` extras); neither torch nor transformers is ever imported.
"""

from __future__ import annotations

from .measure import describe
from .report import CONVERT_JSON_SCHEMA, ConvertReport, TensorReport, report_json
from .run import DEFAULT_MEMORY, FORMATS, convert, detect_format
from .source import NoExactForm
from .spill import Spill

_Spill = Spill  # its name when this package was one module

__all__ = ["convert", "ConvertReport", "TensorReport", "NoExactForm", "detect_format", "FORMATS",
           "CONVERT_JSON_SCHEMA", "DEFAULT_MEMORY", "describe", "report_json", "Spill"]
