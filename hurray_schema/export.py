"""Export of one tensor or composite as the whole logical array: a ``.npy`` file or a Zarr store.

:func:`export_npy` evaluates the item (a partition merged, an overlay applied, a quantized
tensor dequantized: ``layouts/composite.md § Composition Semantics``) and writes it as a NumPy
``.npy`` file; given a ``memory`` budget that the result exceeds, it evaluates through dask
(the ``[dask]`` extra) in chunks of an eighth of the budget and writes each region as it
completes.  :func:`export_zarr` always goes through dask and writes a Zarr store (the ``[zarr]``
extra) in regular chunks.  A group composite has no single array: it is refused, naming its
members.

Writers never lose data: a ``.npy`` file is written into a temporary file beside the output
and renamed over it once complete (:func:`hurray_schema.io._write.replacing`); a Zarr store
into a temporary folder beside it that then takes its place, an earlier store moved aside
until then.  Every error on bad input is a :class:`~hurray_schema.errors.HurraySchemaError`.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from typing import Optional, TextIO

import attrs

from .errors import HurraySchemaError, NoSuchItem, NotAnArray

__all__ = ["export_npy", "export_zarr", "Exported", "NoSuchItem", "find_item", "array_of", "result_bytes",
           "ZARR_DTYPE_ATTRIBUTE", "CHUNKS_PER_BUDGET"]

ZARR_DTYPE_ATTRIBUTE = "hurray_schema_dtype"
"""A type Zarr has no data type for (NumPy's extension types: bfloat16, the float8 types) is
stored as its bits, in unsigned integers of its width, and named in this attribute of the
array; ``zarr.open_array(STORE)[...].view(ml_dtypes.bfloat16)`` gives the values back."""

CHUNKS_PER_BUDGET = 8
"""An export under a ``memory`` budget aims its chunks at this fraction of the budget: a few
chunks per worker thread in flight, each with the temporaries of its decode."""


@attrs.frozen(slots=True)
class Exported:
    """What an export wrote: where, the array's ``dtype`` and ``shape``, and whether it went
    through dask chunk by chunk (``chunked``) rather than evaluated whole in memory."""

    path: str
    dtype: object
    shape: tuple
    chunked: bool


def export_npy(source, output, *, name: Optional[str] = None, memory: Optional[int] = None, mode="strict",
               progress: Optional[TextIO] = None) -> Exported:
    """Write the logical array of ``source`` to the ``.npy`` file ``output`` (exactly that path).

    ``source`` is a tensor or composite, or a Hurray file -- a path, a URL (the ``[remote]``
    extra) or an open :class:`~hurray_schema.HurrayFile` -- with ``name`` the item (or any
    member entry) to export; a path or URL is read in ``mode`` and closed afterwards.  With
    ``memory`` (bytes) smaller than the result, it is evaluated through dask in chunks of about
    ``memory / CHUNKS_PER_BUDGET`` bytes, dask's progress bar drawn on ``progress`` (a text
    stream) when given."""
    with _opened(source, name, mode) as item:
        if memory is not None and result_bytes(item) > memory:
            return _npy_by_chunks(item, os.fspath(output), memory, progress)
        array = array_of(item)
        _write_npy(output, array)
        return Exported(os.fspath(output), array.dtype, tuple(array.shape), False)


def export_zarr(source, store, *, name: Optional[str] = None, memory: Optional[int] = None, mode="strict",
                progress: Optional[TextIO] = None) -> Exported:
    """Write the logical array of ``source`` (as for :func:`export_npy`) as a Zarr store, a folder,
    at ``store``: evaluated through dask and written by its ``to_zarr`` in a regular grid of
    chunks of about ``memory / CHUNKS_PER_BUDGET`` bytes (without ``memory``: dask's default
    chunk size of the evaluator, about 64 MiB).  A type Zarr has no data type for is stored as
    its bits (:data:`ZARR_DTYPE_ATTRIBUTE`).  An existing Zarr store at ``store`` is replaced;
    anything else there is refused."""
    with _opened(source, name, mode) as item:
        result_bytes(item)  # a group has no single array: refused before anything is imported
        return _zarr_store(item, os.fspath(store), memory, progress)


def find_item(container, name: str):
    """A top-level item of the file ``container`` by name, else any index entry (a composite's
    member); :class:`NoSuchItem` when there is none."""
    try:
        return container[name]
    except KeyError:
        pass
    get_item = getattr(container, "get_item", None)
    if get_item is not None:
        try:
            return get_item(name)
        except KeyError:
            pass
    raise NoSuchItem(f"no tensor or composite named {name!r}")


def array_of(item):
    """The logical array of a tensor or composite (:class:`~hurray_schema.errors.NotAnArray` for a
    group, which has none)."""
    import numpy as np

    from .io import Composite

    result = item.materialize() if isinstance(item, Composite) else item.to_numpy()
    if isinstance(result, tuple):
        _refuse_group(item)
    return np.asarray(result)


def result_bytes(item) -> int:
    """Bytes of the logical array of ``item``: its shape times the size of its decoded element
    type (a group, which has no single array, is refused)."""
    from .evaluate import decoded_type, numpy_dtype
    from .model import CompositionRule

    desc = item.descriptor
    if getattr(item, "members", None) is not None and desc.layout.composition_rule == CompositionRule.GROUP:
        _refuse_group(item)
    return math.prod(int(n) for n in desc.shape) * numpy_dtype(decoded_type(desc)).itemsize


def _refuse_group(item) -> None:
    names = [m.name or f"#{i}" for i, m in enumerate(item.members)]
    raise NotAnArray(f"{item.name or 'this'!r} is a group composite (no single array); export one of its "
                     f"members instead: {', '.join(names)}")


@contextlib.contextmanager
def _opened(source, name: Optional[str], mode):
    """The item ``source`` is, or names in a file (opened here and closed afterwards when given
    as a path or URL)."""
    from .io import Composite, Tensor

    if isinstance(source, (Tensor, Composite)):
        if name is not None:
            raise TypeError("name= picks an item of a file; a tensor or composite is exported as it is")
        yield source
        return
    if name is None:
        raise TypeError("name= is needed to pick the item of a file")
    if isinstance(source, (str, os.PathLike)):
        from .io import read_file

        with read_file(source, mode=mode) as container:
            yield find_item(container, name)
        return
    yield find_item(source, name)


# --------------------------------------------------------------------------------------
# .npy
# --------------------------------------------------------------------------------------


def _write_npy(output, array) -> None:
    """``array`` as a ``.npy`` file at ``output``, replaced only once complete."""
    import numpy as np

    from .io._write import replacing

    with replacing(output) as f:
        np.save(f, array, allow_pickle=False)


def _dask(what: str, extra: str):
    """(dask.array, dask's ProgressBar), or a typed error naming the extra that installs them."""
    try:
        from dask.diagnostics import ProgressBar
        import dask.array as da
    except ImportError:
        raise HurraySchemaError(f"{what} needs dask: pip install 'hurray_schema[{extra}]'") from None
    return da, ProgressBar


def _progress_bar(ProgressBar, progress: Optional[TextIO]):
    return ProgressBar(out=progress) if progress is not None else contextlib.nullcontext()


def _npy_by_chunks(item, output: str, memory: int, progress: Optional[TextIO]) -> Exported:
    """Evaluate ``item`` through dask in chunks of about ``memory / CHUNKS_PER_BUDGET`` bytes,
    each written into the ``.npy`` file as it completes."""
    da, ProgressBar = _dask("an .npy export by chunks", "dask")
    from .io._write import replacing

    lazy = item.to_dask(chunk_bytes=max(1, memory // CHUNKS_PER_BUDGET))
    with replacing(output) as f:
        regions = _NpyRegions(f, lazy.shape, lazy.dtype)
        with _progress_bar(ProgressBar, progress):
            da.store(lazy, regions, lock=False)
    return Exported(output, lazy.dtype, tuple(lazy.shape), True)


class _NpyRegions:
    """The array of a ``.npy`` file written region by region (the target of ``dask.array.store``):
    the header written first and the file sized, then each region's bytes with ``os.pwrite``, one
    call per C-contiguous run, without mapping the output (its pages stay out of our memory)."""

    def __init__(self, f, shape, dtype):
        import numpy as np
        from numpy.lib import format as npy

        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        header = {"descr": npy.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        try:
            npy.write_array_header_1_0(f, header)
        except ValueError:  # a header past 64 KiB: the 2.0 format
            npy.write_array_header_2_0(f, header)
        f.flush()
        self.offset = f.tell()
        f.truncate(self.offset + math.prod(self.shape) * self.dtype.itemsize)
        self.fd = f.fileno()

    def __setitem__(self, region, values) -> None:
        import numpy as np

        values = np.ascontiguousarray(values, self.dtype)
        if values.size == 0:
            return
        if not self.shape:
            os.pwrite(self.fd, values.reshape(1).view(np.uint8), self.offset)
            return
        starts = [s.indices(n)[0] for s, n in zip(region, self.shape)]
        split = len(self.shape) - 1  # dimensions after `split` are whole: one run per index before it
        while split > 0 and values.shape[split] == self.shape[split]:
            split -= 1
        tail = math.prod(self.shape[split + 1:])
        runs = values.reshape(math.prod(values.shape[:split]), -1).view(np.uint8)
        for k, lead in enumerate(np.ndindex(*values.shape[:split])):
            first = 0
            for dim, i in enumerate(lead):
                first = first * self.shape[dim] + starts[dim] + i
            first = (first * self.shape[split] + starts[split]) * tail
            os.pwrite(self.fd, runs[k], self.offset + first * self.dtype.itemsize)


# --------------------------------------------------------------------------------------
# Zarr
# --------------------------------------------------------------------------------------


def _zarr():
    """zarr, or a typed error naming the extra that installs it."""
    try:
        import zarr
    except ImportError:
        raise HurraySchemaError("a Zarr export needs zarr: pip install 'hurray_schema[zarr]'") from None
    return zarr


def _zarr_storable(lazy):
    """(``lazy`` as Zarr can hold it, the attributes saying how): a NumPy extension type (bfloat16,
    float8 ...: ``dtype.isbuiltin != 1``) viewed as unsigned integers of its width."""
    import numpy as np

    if lazy.dtype.isbuiltin == 1:
        return lazy, {}
    bits = np.dtype(f"<u{lazy.dtype.itemsize}")
    return lazy.view(bits), {ZARR_DTYPE_ATTRIBUTE: lazy.dtype.name}


def _is_zarr_store(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, marker)) for marker in ("zarr.json", ".zarray", ".zgroup"))


def _zarr_store(item, store: str, memory: Optional[int], progress: Optional[TextIO]) -> Exported:
    """Evaluate ``item`` through dask into a Zarr store written in a temporary folder beside
    ``store``, which then takes its place."""
    _, ProgressBar = _dask("a Zarr export", "zarr")
    zarr = _zarr()
    from .evaluate.dask_graph import DEFAULT_CHUNK_BYTES, slab_chunks

    target = os.path.realpath(store)
    if os.path.exists(target) and not (os.path.isdir(target) and _is_zarr_store(target)):
        raise HurraySchemaError(f"{store} exists and is not a Zarr store: not replaced")
    chunk_bytes = max(1, memory // CHUNKS_PER_BUDGET) if memory is not None else DEFAULT_CHUNK_BYTES
    lazy = item.to_dask(chunk_bytes=chunk_bytes)
    storable, attributes = _zarr_storable(lazy)
    if 0 not in storable.shape:
        storable = storable.rechunk(slab_chunks(storable.shape, storable.dtype.itemsize, chunk_bytes))
    temp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=os.path.dirname(target))
    try:
        with _progress_bar(ProgressBar, progress):
            storable.to_zarr(temp, overwrite=True)
        if attributes:
            zarr.open_array(temp, mode="r+").attrs.update(attributes)
        _replace_folder(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return Exported(store, lazy.dtype, tuple(lazy.shape), True)


def _replace_folder(new: str, target: str) -> None:
    """``new`` renamed to ``target``; a ``target`` already there is moved aside first and removed only
    once ``new`` is in its place (put back if the rename fails)."""
    if not os.path.exists(target):
        os.rename(new, target)
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".old", dir=os.path.dirname(target))
    old = os.path.join(aside, "store")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        os.rmdir(aside)
        raise
    shutil.rmtree(aside)
