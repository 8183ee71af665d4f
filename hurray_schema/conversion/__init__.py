"""Conversion between Hurray files and the formats models ship in: safetensors and GGUF.

:func:`convert` reads safetensors (through the ``safetensors`` package) or GGUF (through the
``gguf`` package's ``GGUFReader``) and writes a ``.hrry`` file, or reads a ``.hrry`` file and
writes safetensors; it returns a :class:`ConvertReport` with a row per tensor.

* safetensors -> Hurray: names, shapes and dtypes kept (:data:`.safetensors_format.SAFETENSORS_TYPES`),
  ``__metadata__`` into the KV section; bool packed 8 to a byte (``element-types.md § Boolean Type``).
* GGUF -> Hurray: dense types as byte copies, the scale-times-integer block types as per-block
  affine tensors that decode to GGUF's float32 values bit for bit (:mod:`.gguf_blocks`), the rest
  refused unless ``dequantize`` (float32, exact) or ``requantize`` is given.
* Hurray -> safetensors: every tensor decoded, partitions and overlays merged, groups opened into
  their members' names (as :func:`hurray_schema.load` names them).

Each tensor is converted on its own; converted buffers beyond ``memory`` bytes wait in a
temporary file beside the output rather than in memory, input bytes stored as they are
stay in the input's memory map, and GGUF Q4_0 tensors are re-packed from that map while
the output is written (:class:`~hurray_schema.io.tensor.ProducedTensor`).  The output replaces ``dst`` only once complete (a Hurray
file after every descriptor passed the strict rules, :func:`hurray_schema.write_file`).

The ``safetensors`` and ``gguf`` packages are imported only when a file of theirs is read
(the ``[safetensors]`` and ``[gguf]`` extras).
"""

from __future__ import annotations

import fnmatch
import json
import math
import mmap
import os
import tempfile
from typing import Callable, Optional, Sequence

import attrs
import numpy as np

from ..errors import HurraySchemaError
from ..limits import DEFAULT_LIMITS
from .source import NoExactForm, SourceTensor

__all__ = ["convert", "ConvertReport", "TensorReport", "NoExactForm", "detect_format", "FORMATS",
           "CONVERT_JSON_SCHEMA", "DEFAULT_MEMORY"]

FORMATS = ("hurray", "safetensors", "gguf")

CONVERT_JSON_SCHEMA = "hurray-schema/convert/1"

DEFAULT_MEMORY = 1 << 30
"""Bytes of converted buffers held in memory before the rest waits in a temporary file."""

_DECODE_LIMITS = DEFAULT_LIMITS.evolve(max_evaluation_bytes=1 << 62)
"""Decoding for the output is bounded by the output itself, not by the evaluator's default budget."""

_KEPT_AS_THEY_ARE = ("embed", "embd", "norm", "bias")
"""Name parts of tensors ``quantize`` / ``spqr`` / ``partition`` leave alone unless named."""


@attrs.frozen(slots=True)
class TensorReport:
    """One tensor of a conversion: types and bytes in and out, and how far its values moved.

    ``max_abs_error`` and ``rel_frobenius_error`` (``||out - in|| / ||in||``, 0 when both are
    zero) compare the output's decoded values with the input's as its own library decodes them;
    they are measured for every tensor whose values may change (quantize, spqr, requantize) and,
    with ``verify``, for the exact ones too; otherwise an exact conversion reports 0.0 and
    ``measured`` is false."""

    name: str
    type_in: str
    type_out: str
    bytes_in: int
    bytes_out: int
    max_abs_error: float
    rel_frobenius_error: float
    exact: bool
    measured: bool
    note: str = ""

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen(slots=True)
class ConvertReport:
    """What :func:`convert` did: the formats and a :class:`TensorReport` per tensor, in output order."""

    source: str
    destination: str
    source_format: str
    destination_format: str
    tensors: tuple

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    def to_json(self) -> dict:
        return {"schema": CONVERT_JSON_SCHEMA, "source": self.source, "destination": self.destination,
                "source_format": self.source_format, "destination_format": self.destination_format,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "tensors": [t.to_json() for t in self.tensors]}

    def text(self) -> str:
        """A table: name, type in -> out, bytes in -> out, max abs error, relative Frobenius error."""
        rows = [("tensor", "type in", "type out", "bytes in", "bytes out", "max abs err", "rel frob err")]
        for t in self.tensors:
            errors = (f"{t.max_abs_error:.3g}", f"{t.rel_frobenius_error:.3g}") if t.measured or not t.exact \
                else ("0 (exact)", "0 (exact)")
            rows.append((t.name, t.type_in, t.type_out, str(t.bytes_in), str(t.bytes_out)) + errors)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                 for row in rows]
        notes = [f"{t.name}: {t.note}" for t in self.tensors if t.note]
        total = (f"{len(self.tensors)} tensors, {self.bytes_in} bytes in, {self.bytes_out} bytes out: "
                 f"{self.source} ({self.source_format}) -> {self.destination} ({self.destination_format})")
        return "\n".join(lines + notes + [total])


# --------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------


def detect_format(path, *, output: bool = False) -> str:
    """"hurray", "safetensors" or "gguf": an input by its first bytes (then its extension), an
    output by its extension (.safetensors, .gguf; anything else is a Hurray file)."""
    from ..structs.file import FILE_MAGIC
    from .gguf_format import GGUF_MAGIC

    ext = os.path.splitext(os.fspath(path))[1].lower()
    if output:
        return {".safetensors": "safetensors", ".gguf": "gguf"}.get(ext, "hurray")
    with open(path, "rb") as f:
        head = f.read(len(FILE_MAGIC))
    if head.startswith(GGUF_MAGIC):
        return "gguf"
    if head.startswith(FILE_MAGIC):
        return "hurray"
    if ext in (".hrry", ".gguf"):
        return ext[1:] if ext == ".gguf" else "hurray"
    return "safetensors"


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class _Options:
    dequantize: bool
    requantize: Optional[tuple]
    quantize: Optional[tuple]
    spqr: Optional[float]
    partition: Optional[tuple]
    select: Optional[tuple]
    verify: bool

    @property
    def transforms(self) -> bool:
        return self.quantize is not None or self.spqr is not None or self.partition is not None


def _scheme_option(value, what: str) -> Optional[tuple]:
    """"SCHEME[:storage]" -> (scheme, storage or None)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return value
    scheme, _, storage = str(value).partition(":")
    from ..io.produce import SCHEME_NAMES

    if scheme.lower() not in SCHEME_NAMES:
        raise HurraySchemaError(f"{what} {value!r}: the scheme is one of {sorted(SCHEME_NAMES)}")
    return scheme.lower(), (storage or None)


def _grid_option(value) -> Optional[tuple]:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = tuple(int(n) for n in value.lower().split("x"))
        except ValueError:
            raise HurraySchemaError(f"partition {value!r}: pieces per dimension, like 2x2") from None
    grid = tuple(int(n) for n in (value if isinstance(value, (tuple, list)) else (value,)))
    if not grid or any(n < 1 for n in grid):
        raise HurraySchemaError(f"partition {value!r}: pieces per dimension, each at least 1")
    return grid


def _selected(source: SourceTensor, options: _Options) -> bool:
    """Whether quantize / spqr / partition apply to ``source``: a name matching ``select`` (a glob),
    else a 2-D float weight whose name is no embedding, norm or bias."""
    if options.select:
        return any(fnmatch.fnmatchcase(source.name, pattern) for pattern in options.select)
    lowered = source.name.lower()
    return source.is_float and len(source.shape) == 2 and not any(part in lowered for part in _KEPT_AS_THEY_ARE)


# --------------------------------------------------------------------------------------
# Errors of a conversion
# --------------------------------------------------------------------------------------


def _errors(reference: np.ndarray, decoded: np.ndarray) -> tuple[float, float]:
    """(max |out - in|, ||out - in||_F / ||in||_F) in float64; NaNs in the same places count as equal."""
    ref = np.asarray(reference)
    out = np.asarray(decoded)
    if ref.dtype.kind in "biu" and out.dtype.kind in "biu" and np.array_equal(ref, out):
        return 0.0, 0.0  # exactly, also past float64's 2**53
    if ref.dtype.kind == "c" or out.dtype.kind == "c":
        ref, out = ref.astype(np.complex128), out.astype(np.complex128)
    else:
        ref, out = ref.astype(np.float64), out.astype(np.float64)
    diff = out - ref
    both_nan = np.isnan(ref) & np.isnan(out)
    same_inf = np.isinf(ref) & (ref == out)
    diff = np.where(both_nan | same_inf, 0, diff)
    if diff.size == 0:
        return 0.0, 0.0
    max_abs = float(np.max(np.abs(diff)))
    finite_ref = np.where(np.isfinite(ref), ref, 0)
    norm = float(np.linalg.norm(finite_ref.reshape(-1)))
    delta = float(np.linalg.norm(diff.reshape(-1)))
    return max_abs, (delta / norm if norm else (0.0 if delta == 0 else math.inf))


def _decoded(item) -> np.ndarray:
    from ..io.file import item_array

    return item_array(item, limits=_DECODE_LIMITS)


def _stored_bytes(item) -> int:
    from ..io import Composite

    if isinstance(item, Composite):
        return sum(_stored_bytes(member) for member in item.members)
    return item.stored_nbytes


def describe(item) -> str:
    """A short name of a Hurray item's form: "float32", "int4 per_block_affine", "partition(float32)" ..."""
    from ..io import Composite

    if isinstance(item, Composite):
        head = item.descriptor.type_tag
        kind = item.rule.name.lower()
        return f"{kind}({head.name.lower() if hasattr(head, 'name') else head})"
    desc = item.descriptor
    tag = desc.type_tag
    text = tag.name.lower() if hasattr(tag, "name") else f"0x{int(tag):02X}"
    if desc.quantization is not None:
        scheme = getattr(desc.quantization, "scheme", None)
        text += " " + (type(desc.quantization).__name__ if scheme is None else _scheme_name(scheme))
    return text


def _scheme_name(scheme) -> str:
    from ..model import QuantScheme

    try:
        return QuantScheme(scheme).name.lower()
    except ValueError:
        return f"scheme 0x{int(scheme):02X}"


# --------------------------------------------------------------------------------------
# Buffers waiting for the writer
# --------------------------------------------------------------------------------------


class _Spill:
    """Converted tensors kept for the writer: in memory up to ``budget`` bytes, then in a temporary
    file beside the output, memory-mapped (the writer reads them back once).

    The file has no name, so a killed conversion leaves nothing behind: ``tempfile.TemporaryFile``
    opens it with ``O_TMPFILE`` on Linux, elsewhere unlinks it as soon as it is created."""

    def __init__(self, folder: str, budget: int):
        self.folder, self.budget, self.used = folder, budget, 0
        self.file = None
        self.maps: list = []

    def keep(self, item):
        from ..io import Tensor

        if not isinstance(item, Tensor):
            return item
        size = item.stored_nbytes
        if self.used + size <= self.budget:
            self.used += size
            return item
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.folder, prefix=".hurray-convert-")
        views = []
        for buffer in item.buffers:
            start = self.file.seek(0, os.SEEK_END)
            start += -start % mmap.ALLOCATIONGRANULARITY
            self.file.seek(start)
            self.file.write(buffer)
            self.file.flush()
            if len(buffer) == 0:
                views.append(b"")
                continue
            mapped = mmap.mmap(self.file.fileno(), len(buffer), offset=start, access=mmap.ACCESS_READ)
            self.maps.append(mapped)
            views.append(memoryview(mapped))
        return Tensor(item.descriptor, views, name=item.name)

    def close(self) -> None:
        for mapped in self.maps:
            try:
                mapped.close()
            except BufferError:  # a view still alive; the map goes with it
                pass
        if self.file is not None:
            self.file.close()


# --------------------------------------------------------------------------------------
# convert
# --------------------------------------------------------------------------------------


def convert(src, dst, *, to: Optional[str] = None, dequantize: bool = False, requantize=None, quantize=None,
            spqr: Optional[float] = None, partition=None, select: Optional[Sequence[str]] = None,
            verify: bool = False, memory: int = DEFAULT_MEMORY,
            progress: Optional[Callable[[int, int], None]] = None) -> ConvertReport:
    """Convert the file ``src`` into ``dst`` and return the per-tensor report.

    ``src``: safetensors, GGUF or Hurray (recognised by its first bytes); ``dst``: Hurray, or
    safetensors when ``to="safetensors"`` or its name ends in ``.safetensors`` (from a Hurray
    file only).

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
    if not os.path.isfile(src):
        raise HurraySchemaError(f"{src}: no such file")
    source_format = detect_format(src)
    target = to or detect_format(dst, output=True)
    if target not in FORMATS:
        raise HurraySchemaError(f"unknown output format {target!r}; one of {FORMATS}")
    options = _Options(bool(dequantize), _scheme_option(requantize, "requantize"),
                       _scheme_option(quantize, "quantize"), None if spqr is None else float(spqr),
                       _grid_option(partition), tuple(select) if select else None, bool(verify))
    if source_format == "hurray" and target == "safetensors":
        if options.transforms or options.requantize:
            raise HurraySchemaError("quantize, spqr, partition and requantize apply on the way into Hurray")
        return _hurray_to_safetensors(src, dst, progress)
    if target != "hurray" or source_format == "hurray":
        raise HurraySchemaError(f"{source_format} -> {target} is not a conversion here: safetensors or GGUF "
                                "into Hurray, Hurray into safetensors")
    return _into_hurray(src, dst, source_format, options, memory, progress)


def _read_source(src: str, source_format: str):
    if source_format == "gguf":
        from .gguf_format import read_gguf

        return read_gguf(src)
    from .safetensors_format import read_safetensors

    return read_safetensors(src)


def _into_hurray(src: str, dst: str, source_format: str, options: _Options, memory: int, progress) -> ConvertReport:
    from ..io import write_file

    metadata, sources, keep_open = _read_source(src, source_format)
    total = sum(s.bytes_in for s in sources)
    folder = os.path.dirname(os.path.realpath(dst))
    spill = _Spill(folder, int(memory))
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
        write_file(dst, items, kv=metadata or None)
    finally:
        items.clear()
        spill.close()
        del keep_open
    return ConvertReport(src, dst, source_format, "hurray", tuple(rows))


def _convert_tensor(source: SourceTensor, options: _Options):
    """(the Hurray item, its report row, whether its buffers are views of the input's map) of one
    input tensor."""
    note = ""
    reference = None
    backed = False
    if options.transforms and _selected(source, options):
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

                item = Tensor.from_numpy(np.ascontiguousarray(reference, np.float32))
                exact, note = True, f"{exc}: stored decoded (float32)"
            elif options.requantize is not None:
                reference = source.values()
                item = _quantized(reference, options.requantize)
                exact, note = False, f"{exc}: requantized"
            else:
                raise NoExactForm(f"{exc}; pass dequantize (--dequantize: float32, exact) or requantize "
                                  "(--requantize SCHEME)") from None
    measured = not exact or options.verify
    max_abs = rel = 0.0
    if measured:
        if reference is None:
            reference = source.values()
        max_abs, rel = _errors(reference, _decoded(item))
    row = TensorReport(source.name, source.type_in, describe(item), source.bytes_in, _stored_bytes(item),
                       max_abs, rel, exact, measured, note)
    return item, row, backed


def _quantized(array: np.ndarray, scheme: tuple):
    from ..io.produce import quantize

    name, storage = scheme
    values = array if array.dtype in (np.float16, np.float32) or array.dtype.name == "bfloat16" \
        else array.astype(np.float32)
    return quantize(values, name, storage=storage)


def _transformed(array: np.ndarray, options: _Options):
    """``array`` quantized, SpQR'd and / or partitioned as the options say."""
    from ..io import Composite, Tensor
    from ..io.produce import spqr

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


# --------------------------------------------------------------------------------------
# Hurray -> safetensors
# --------------------------------------------------------------------------------------


def _leaves(container):
    """(name, item) of every array of a Hurray file, groups opened into their members (as
    :func:`hurray_schema.load` names them)."""
    from ..io import Composite
    from ..model import CompositionRule

    def opened(name, item):
        if isinstance(item, Composite) and item.rule == CompositionRule.GROUP:
            for i, member in enumerate(item.members):
                yield from opened(member.name if member.name is not None else f"{name}.{i}", member)
        else:
            yield name, item

    for name, item in container.items():
        yield from opened(name, item)


def _hurray_to_safetensors(src: str, dst: str, progress) -> ConvertReport:
    from ..io import read_file
    from ..io._write import replacing
    from .safetensors_format import write_safetensors

    with read_file(src) as container:
        leaves = list(_leaves(container))
        names = [name for name, _ in leaves]
        if len(set(names)) != len(names):
            raise HurraySchemaError(f"{src}: two arrays would share a name in safetensors")
        entries = [(name, tuple(item.shape), np.dtype(item.dtype)) for name, item in leaves]
        metadata = container.metadata()
        total = sum(_stored_bytes(item) for _, item in leaves)
        rows = []
        done = 0
        with replacing(dst) as out:
            for i, type_out, nbytes, _array in write_safetensors(out, entries, metadata,
                                                                 lambda i: _decoded(leaves[i][1])):
                name, item = leaves[i]
                rows.append(TensorReport(name, describe(item), type_out, _stored_bytes(item), nbytes,
                                         0.0, 0.0, True, False))
                done += _stored_bytes(item)
                if progress is not None:
                    progress(done, total)
    return ConvertReport(src, dst, "hurray", "safetensors", tuple(rows))


def report_json(report: ConvertReport) -> str:
    return json.dumps(report.to_json(), indent=2)
