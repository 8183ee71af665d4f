"""safetensors (a file or a Hugging Face folder of shards, :mod:`.hf_folder`), GGUF or a PyTorch
Distributed Checkpoint into Hurray: each input tensor converted on its own (stored as it is,
re-packed, dequantized, requantized, quantized, SpQR'd or partitioned as the options say),
measured, kept for the writer (:class:`~.spill.Spill`), then the file written once, replacing
``dst`` only after every descriptor passed the strict rules (:func:`hurray_schema.write_file`)."""

from __future__ import annotations

import os

import numpy as np

from ..errors import HurraySchemaError
from .measure import decoded, describe, stored_bytes, value_errors
from .options import ConvertOptions, selected
from .report import ConvertReport, TensorReport
from .source import NoExactForm, SourceTensor
from .spill import Spill

__all__ = ["into_hurray"]


def into_hurray(src: str, dst: str, source_format: str, options: ConvertOptions, memory: int,
                progress, validate: bool = True) -> ConvertReport:
    """Convert the safetensors or GGUF file, the model folder or the DCP folder ``src`` into the
    Hurray file ``dst``; converted buffers beyond ``memory`` bytes wait in a temporary file;
    ``progress(done, total)`` after each tensor, in input bytes.  ``validate=False`` writes
    without the strict rules (:func:`hurray_schema.write_file`): a DCP checkpoint whose chunks
    do not tile a tensor is written as it is, for :func:`hurray_schema.audit` to report."""
    from ..io import write_file

    metadata, sources, keep_open = _read_source(src, source_format)
    total = sum(s.bytes_in for s in sources)
    spill = Spill(os.path.dirname(os.path.realpath(dst)), int(memory))
    items: dict = {}
    rows = []
    done = 0
    try:
        for source in sources:
            item, row, backed = _convert_tensor(source, options)
            items[source.name] = item if backed else spill.keep(item)
            rows.append(row)
            done += source.bytes_in
            if progress is not None:
                progress(done, total)
        write_file(dst, items, metadata=metadata or None, validate=validate)
    finally:
        items.clear()
        spill.close()
        del keep_open
    return ConvertReport(src, dst, source_format, "hurray", tuple(rows))


def _read_source(src: str, source_format: str):
    """(KV metadata, the tensors, what keeps their bytes mapped) of the input."""
    if source_format == "dcp":
        from .dcp_format import read_dcp

        return read_dcp(src)
    if source_format == "hf":
        from .hf_folder import read_folder

        return _quantized_linears(*read_folder(src))
    if source_format == "gguf":
        from .gguf_format import read_gguf

        return read_gguf(src)
    from .safetensors_format import read_safetensors

    metadata, sources, mapped = read_safetensors(src)
    return _quantized_linears(_with_config_beside(src, metadata), sources, mapped)


def _with_config_beside(src: str, metadata: dict) -> dict:
    """A single safetensors file's metadata, with the ``config.json`` beside it carried when that
    config says how the file is quantized (``quantization_config``), or when optimum-quanto's
    ``quanto_qmap.json`` is beside it too (then both are carried)."""
    from .hf_folder import FILE_PREFIX, read_bounded

    folder = os.path.dirname(os.path.abspath(src))
    config_path = os.path.join(folder, "config.json")
    qmap_path = os.path.join(folder, "quanto_qmap.json")  # optimum-quanto's map beside its weights
    text = read_bounded(config_path, config_path).decode("utf-8", errors="replace") \
        if os.path.isfile(config_path) else None
    if os.path.isfile(qmap_path):
        qmap = read_bounded(qmap_path, qmap_path).decode("utf-8", errors="replace")
        return {**metadata, FILE_PREFIX + "quanto_qmap.json": qmap,
                **({} if text is None else {FILE_PREFIX + "config.json": text})}
    if text is None or "quantization_config" not in text:
        return metadata
    return {**metadata, FILE_PREFIX + "config.json": text}


def _quantized_linears(metadata: dict, sources: list, mapped):
    """The sources with a quantized checkpoint's linears put together (:mod:`.quantized`)."""
    from .quantized import regroup

    return metadata, regroup(metadata, sources), mapped


def _convert_tensor(source: SourceTensor, options: ConvertOptions):
    """(the Hurray item, its report row, whether its buffers are views of the input's map) of one
    input tensor."""
    note = ""
    reference = None
    backed = False
    if options.transforms and selected(source, options):
        reference = source.values()
        item = _transformed(reference, options)
        exact = False
    else:
        try:
            item, backed = source.build()
            exact = True
        except NoExactForm as exc:
            if options.dequantize:
                reference = source.values()
                from ..io import Tensor

                kept = reference.dtype if reference.dtype.name in _DECODED_TYPES else np.dtype(np.float32)
                item = Tensor.from_numpy(np.ascontiguousarray(reference, kept))
                exact, note = True, f"{exc}: stored decoded ({kept.name})"
            elif options.requantize is not None:
                reference = source.values()
                item = _quantized(reference, options.requantize)
                exact, note = False, f"{exc}: requantized"
            else:
                raise NoExactForm(f"{exc}; pass dequantize (--dequantize: the decoded values, exact) or requantize "
                                  "(--requantize SCHEME)") from None
    measured = not exact or options.verify or source.ulp
    max_abs = rel = 0.0
    max_ulp = None
    if measured:
        if reference is None:
            reference = source.values()
        output = decoded(item)
        max_abs, rel = value_errors(reference, output)
        if source.ulp:
            max_ulp = _ulp(reference, output)
    row = TensorReport(source.name, source.type_in, describe(item), source.bytes_in, stored_bytes(item),
                       max_abs, rel, exact, measured, note, max_ulp)
    return item, row, backed


_DECODED_TYPES = ("float16", "bfloat16", "float32")
"""The dtypes a decoded tensor is stored in as it is (``dequantize``); any other as float32."""


def _ulp(reference: np.ndarray, output: np.ndarray) -> int:
    """The largest distance of ``output`` from ``reference`` in units in the last place of the
    reference's dtype, the output rounded once to it (a float32 dequantization against a
    library's float16 one is that library's arithmetic with its one rounding)."""
    from .quantized.packing import ulp_distance

    return ulp_distance(np.asarray(output).astype(reference.dtype), reference)


def _quantized(array: np.ndarray, scheme: tuple):
    from ..builders import quantize

    name, storage = scheme
    values = array if array.dtype in (np.float16, np.float32) or array.dtype.name == "bfloat16" \
        else array.astype(np.float32)
    return quantize(values, name, storage=storage)


def _transformed(array: np.ndarray, options: ConvertOptions):
    """``array`` quantized, SpQR'd and / or partitioned as the options say."""
    from ..io import Composite, Tensor
    from ..builders import spqr

    def member(piece):
        if options.spqr is not None:
            return spqr(piece, outliers=options.spqr, block_size=_spqr_block(piece.shape[-1]))
        if options.quantize is not None:
            return _quantized(piece, options.quantize)
        return Tensor.from_numpy(piece)

    if options.partition is None:
        return member(np.ascontiguousarray(array))
    grid = options.partition + (1,) * (array.ndim - len(options.partition))
    if len(grid) != array.ndim:
        raise HurraySchemaError(f"partition {'x'.join(map(str, options.partition))} has more dimensions than "
                                f"the tensor's {array.ndim}")
    return Composite.partition(array, grid=grid, member=member)


def _spqr_block(length: int) -> int:
    """SpQR's block along the last axis: 64, or the largest power of two within a shorter axis."""
    return 64 if length >= 64 else max(2, 1 << (max(length, 2).bit_length() - 1))
