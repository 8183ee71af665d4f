"""Tensors and composites as lazy ``dask.array`` arrays, evaluated one chunk at a time.

A composite is chunked by construction (``layouts/composite.md § Composition Semantics``):

* a **partition**'s chunk grid is, per dimension, every edge of every member's box
  (nested partitions included), so each chunk lies inside one member and is a sub-box of
  it; ``chunks=`` or ``chunk_bytes=`` only add edges;
* an **overlay** is cut into slabs of about ``chunk_bytes`` (default
  :data:`DEFAULT_CHUNK_BYTES`) whose edges fall on the base's quantization blocks, or as
  ``chunks=`` says; a chunk reads the base over its box, then every correction whose box
  meets it, in emission order -- the overlay restricted to those members, read by
  :func:`.region.read_box`, so the values are those :func:`.merge.materialize` gives;
* a **group** is a tuple of arrays, one per member; a plain tensor is cut like an overlay.

A graph of several chunks runs each task's compiled kernels on one thread (the scheduler's
workers are the parallelism); a lone chunk keeps them all.  The array returned is a
``dask.array.Array`` whose ``compute()`` does without dask's copy of a lone chunk its task
allocated (:func:`_finalize`): ``to_dask().compute()`` of a composite costs its
:func:`.merge.materialize` and the scheduler's overhead.

Every chunk is one task calling :func:`read_chunk` on a *source*: the descriptors of what
the chunk needs and where the bytes are.  For a file that is the path and each buffer's
``(offset, size)`` (:class:`FileBuffers`): the task maps the file itself, so the graph
holds no data, a task's size does not grow with the data, and any process that sees the
path can run it.  For a URL it is the file's source reference and the byte ranges
(``hurray_schema.io.source.RemoteBuffers``): each task fetches the byte ranges its chunk
decodes (:func:`.region.needed_spans`), any process that reaches the URL can run it.  An in-memory tensor's buffers travel in the graph
(:class:`MemoryBuffers`, pickled as bytes).

The graph is built with dask's own :class:`~dask.highlevelgraph.HighLevelGraph` and
:class:`~dask.array.Array`; dask is imported when a graph is built (the ``[dask]`` extra).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import uuid
from typing import Callable, Optional, Sequence, Union

import attrs
import numpy as np

from ..errors import HurraySchemaError, SourceChanged
from ..limits import Limits
from ..model import CompositionRule, LayoutTag, TensorDescriptor
from ..rules.composite import validate_preorder
from .common import check_shape, decoded_type
from .elements import numpy_dtype
from .merge import materialize
from .region import needed_spans, read_box

__all__ = ["to_dask", "read_chunk", "FileBuffers", "MemoryBuffers", "LeafSource", "CompositeSource",
           "source_tree", "mapped_buffers", "slab_chunks", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024
"""About this many bytes per chunk of an overlay or a plain tensor, unless told otherwise."""


# ------------------------------------------------------------------------------------
# Sources: what a task needs to read its chunk
# ------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class FileBuffers:
    """A tensor's buffers as byte ranges of a file: ``path`` (absolute), the file's size when
    the graph was built (a task refuses a file of another size) and ``(offset, size)`` per
    buffer, in buffer-table order."""

    path: str
    file_size: int
    ranges: tuple[tuple[int, int], ...]


class MemoryBuffers:
    """An in-memory tensor's buffers (zero-copy views); pickled as their bytes."""

    __slots__ = ("views",)

    def __init__(self, views: Sequence):
        self.views = tuple(views)

    def __reduce__(self):
        return MemoryBuffers, (tuple(bytes(view) for view in self.views),)


@attrs.frozen(slots=True)
class LeafSource:
    """A (non-composite) tensor: its descriptor and where its buffers are."""

    descriptor: TensorDescriptor
    buffers: object = attrs.field(eq=False)
    """:class:`FileBuffers`, :class:`MemoryBuffers`, or an object whose ``open()`` gives buffers
    fetched by range (``views()``, ``ensure(spans)``: :class:`hurray_schema.io.source.RemoteBuffers`)."""


@attrs.frozen(slots=True)
class CompositeSource:
    """A composite: its head descriptor and its members' sources in binding order."""

    descriptor: TensorDescriptor
    members: tuple


Source = Union[LeafSource, CompositeSource]


def _memory_buffers(leaf) -> MemoryBuffers:
    return MemoryBuffers(leaf.buffers)


def source_tree(item, locate: Optional[Callable] = None) -> Source:
    """The source of a duck-typed tensor (``.descriptor``, ``.buffers``) or composite
    (``.descriptor``, ``.members``); ``locate(leaf)`` gives a leaf's :class:`FileBuffers`
    (default: its buffers, in memory)."""
    members = getattr(item, "members", None)
    if members is not None:
        return CompositeSource(item.descriptor, tuple(source_tree(m, locate) for m in members))
    where = locate(item) if locate is not None else None
    return LeafSource(item.descriptor, where if where is not None else _memory_buffers(item))


# ------------------------------------------------------------------------------------
# Running a task
# ------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class _OpenTensor:
    descriptor: TensorDescriptor
    buffers: tuple
    fetch: object = None
    """Buffers fetched by range (``.ensure(spans)``), or None: all bytes are at hand."""


@attrs.frozen(slots=True)
class _OpenComposite:
    descriptor: TensorDescriptor
    members: tuple

    def validate(self) -> None:
        """Nothing to do: :func:`to_dask` had the composite binder accept the whole
        composite before building the graph; a task's composite keeps a subset of its
        corrections, which breaks none of the binder's rules."""


def _mapped(where: FileBuffers, maps: dict) -> memoryview:
    """The whole file ``where.path``, memory-mapped read-only, once per ``maps`` (a task's, or a
    process's) while it has the size it had when ``where`` was made."""
    key = (where.path, where.file_size)
    view = maps.get(key)
    if view is None:
        with open(where.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != where.file_size:
                raise SourceChanged(f"{where.path} holds {size} bytes, {where.file_size} when its tensors were "
                                    "read: the file has changed")
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else memoryview(b"")
        maps[key] = view
    return view


def mapped_buffers(where, maps: dict) -> tuple:
    """The buffers ``where`` (:class:`FileBuffers` or :class:`MemoryBuffers`) names, the file mapped
    once per ``maps``."""
    if isinstance(where, MemoryBuffers):
        return where.views
    view = _mapped(where, maps)
    for offset, size in where.ranges:
        if offset < 0 or size < 0 or offset + size > len(view):
            raise HurraySchemaError(f"buffer bytes [{offset}, {offset + size}) lie outside {where.path} "
                                    f"({len(view)} bytes)")
    return tuple(view[offset: offset + size] for offset, size in where.ranges)


def _open(source: Source, maps: dict):
    """The object :func:`.region.read_box` reads, its buffers mapped from the files."""
    if isinstance(source, CompositeSource):
        return _OpenComposite(source.descriptor, tuple(_open(m, maps) for m in source.members))
    where = source.buffers
    if isinstance(where, (FileBuffers, MemoryBuffers)):
        return _OpenTensor(source.descriptor, mapped_buffers(where, maps))
    fetch = where.open()  # a file read by range: its buffers, fetched as the read needs them
    return _OpenTensor(source.descriptor, fetch.views(), fetch)


def _fetches(item) -> bool:
    if isinstance(item, _OpenComposite):
        return any(_fetches(member) for member in item.members)
    return item.fetch is not None


def _fetch(item, lo, hi) -> None:
    """Fetch the byte ranges the box read of ``item`` decodes, for its leaves read by range."""
    if not _fetches(item):
        return
    for leaf, spans in needed_spans(item, lo, hi):
        if leaf.fetch is not None and spans:
            leaf.fetch.ensure(spans)


def _kernel_threads(count: Optional[int]):
    """The compiled parallel kernels called in the block run on at most ``count`` threads (None:
    as configured); the limit binds the calling (worker) thread only (:func:`.jit.thread_limit`)."""
    if count is None:
        return contextlib.nullcontext()
    from . import jit

    return jit.thread_limit(count)


def read_chunk(source: Source, lo: Sequence[int], hi: Sequence[int], limits: Optional[Limits] = None,
               kernel_threads: Optional[int] = None) -> np.ndarray:
    """One chunk: the box ``[lo, hi)`` of ``source``'s logical array (:func:`.region.read_box`,
    charged against ``limits``; a box covering a composite's whole view is
    :func:`.merge.materialize`, which decodes into its output), of shape ``hi - lo``.  Files
    are mapped for the call only.  ``kernel_threads``: the threads each compiled kernel of the
    read may use (None: all; a graph of several chunks gives 1, its scheduler's workers being
    the parallelism -- waking a kernel's threads for every chunk costs more than a small chunk's
    work on a busy machine)."""
    with _kernel_threads(kernel_threads):
        item = _open(source, {})
        _fetch(item, lo, hi)
        if isinstance(item, _OpenComposite) and not any(lo) and tuple(hi) == tuple(item.descriptor.shape):
            values = materialize(item, limits=limits)  # the whole view: the same values, evaluated in place
        else:
            values = read_box(item, lo, hi, limits=limits)
    values, shape = np.asarray(values), tuple(h - l for l, h in zip(lo, hi))
    return values if values.shape == shape else values.reshape(shape)


# ------------------------------------------------------------------------------------
# Chunk grids
# ------------------------------------------------------------------------------------


def _rule(source: Source):
    return source.descriptor.layout.composition_rule if isinstance(source, CompositeSource) else None


def _box(member: Source) -> tuple[tuple[int, ...], tuple[int, ...]]:
    desc = member.descriptor
    return tuple(int(o) for o in desc.shard.shard_offset), check_shape(desc.shape)


def _partition_edges(source: CompositeSource, offset: Sequence[int], edges: list) -> None:
    """Add every member box edge of a partition (and of the partitions nested in it) to ``edges``."""
    for member in source.members:
        moff, mshape = _box(member)
        start = [o + m for o, m in zip(offset, moff)]
        for dim, (first, extent) in enumerate(zip(start, mshape)):
            edges[dim].update((first, first + extent))
        if _rule(member) == CompositionRule.PARTITION:
            _partition_edges(member, start, edges)


def _edges_of(chunks: Sequence[Sequence[int]]) -> list:
    return [set(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()) for sizes in chunks]


def _chunks_from_edges(edges: list, shape: Sequence[int]) -> tuple:
    out = []
    for dim_edges, size in zip(edges, shape):
        points = sorted(e for e in dim_edges | {0, size} if 0 <= e <= size)
        out.append(tuple(b - a for a, b in zip(points, points[1:]) if b > a))
    return tuple(out)


def _alignment(source: Source) -> tuple[int, ...]:
    """Per dimension, the step chunk edges keep to: the quantization block of the base of an
    overlay (or of a plain tensor) along its block axis, else 1."""
    leaf = source.members[0] if _rule(source) == CompositionRule.OVERLAY else source
    rank = len(source.descriptor.shape)
    steps = [1] * rank
    quantization = getattr(leaf.descriptor, "quantization", None) if isinstance(leaf, LeafSource) else None
    block, axis = getattr(quantization, "block_size", None), getattr(quantization, "axis", None)
    if block and axis is not None and 0 <= axis < rank:
        steps[axis] = int(block)
    return tuple(steps)


def slab_chunks(shape: Sequence[int], itemsize: int, target_bytes: int,
                alignment: Optional[Sequence[int]] = None) -> tuple:
    """C-ordered slabs of at most about ``target_bytes``: trailing dimensions whole while
    they fit, the next one cut in multiples of its ``alignment`` step (at least one step),
    the leading ones one index at a time."""
    rank = len(shape)
    steps = tuple(alignment) if alignment is not None else (1,) * rank
    sizes = list(shape)
    inner = max(1, int(itemsize))
    for dim in reversed(range(rank)):
        if inner * shape[dim] <= target_bytes:
            inner *= shape[dim]
            continue
        step = max(1, steps[dim])
        sizes[dim] = min(shape[dim], max(step, (target_bytes // inner) // step * step))
        for outer in range(dim):
            sizes[outer] = 1
        break
    return tuple(_regular(n, c) for n, c in zip(shape, sizes))


def _regular(extent: int, size: int) -> tuple[int, ...]:
    if extent == 0:
        return (0,)
    full, rest = divmod(extent, size)
    return (size,) * full + ((rest,) if rest else ())


def _grid(source: Source, shape: tuple, dtype: np.dtype, chunks, chunk_bytes: Optional[int]) -> tuple:
    """The chunk sizes per dimension (dask's ``chunks``) of ``source``'s array."""
    if 0 in shape:
        return tuple((n,) for n in shape)
    extra = None
    if chunks is not None:
        from dask.array.core import normalize_chunks

        extra = normalize_chunks(chunks, shape, dtype=dtype, limit=chunk_bytes or DEFAULT_CHUNK_BYTES)
    if _rule(source) == CompositionRule.PARTITION:
        edges = [set() for _ in shape]
        _partition_edges(source, (0,) * len(shape), edges)
        if extra is None and chunk_bytes is not None:
            extra = slab_chunks(shape, dtype.itemsize, chunk_bytes)
        if extra is not None:
            edges = [a | b for a, b in zip(edges, _edges_of(extra))]
        return _chunks_from_edges(edges, shape)
    if extra is not None:
        return tuple(tuple(c) for c in extra)
    return slab_chunks(shape, dtype.itemsize, chunk_bytes or DEFAULT_CHUNK_BYTES, _alignment(source))


# ------------------------------------------------------------------------------------
# Narrowing a source to one chunk
# ------------------------------------------------------------------------------------


def _meets(offset, extent, lo, hi) -> bool:
    return all(max(l, o) < min(h, o + n) for o, n, l, h in zip(offset, extent, lo, hi))


def _holds(offset, extent, lo, hi) -> bool:
    return all(o <= l and h <= o + n and n > 0 for o, n, l, h in zip(offset, extent, lo, hi))


def narrow(source: Source, lo: tuple, hi: tuple) -> tuple[Source, tuple, tuple]:
    """``(source, lo, hi)`` reduced to what the box needs: inside a partition, the member holding
    the box (recursively, the box taken relative to it); an overlay keeps its base and the
    corrections whose boxes meet the box, in emission order."""
    while _rule(source) == CompositionRule.PARTITION and lo != hi:
        for member in source.members:
            offset, extent = _box(member)
            if _holds(offset, extent, lo, hi):
                source = member
                lo = tuple(l - o for l, o in zip(lo, offset))
                hi = tuple(h - o for h, o in zip(hi, offset))
                break
        else:
            break  # the box spans members (not a cell of the grid): the partition reads them
    if _rule(source) == CompositionRule.OVERLAY:
        base, *corrections = source.members
        kept = tuple(m for m in corrections if _meets(*_box(m), lo, hi))
        if len(kept) != len(corrections):
            head = source.descriptor
            layout = attrs.evolve(head.layout, member_count=1 + len(kept))
            source = CompositeSource(attrs.evolve(head, layout=layout), (base,) + kept)
    return source, lo, hi


# ------------------------------------------------------------------------------------
# The graph
# ------------------------------------------------------------------------------------


def _validate(item) -> None:
    """The composite binder's verdict on ``item`` (raises its SpecViolation), once, at build time."""
    if getattr(item, "members", None) is None:
        return
    validate = getattr(item, "validate", None)
    if validate is not None:
        validate()
        return
    pending, descriptors = [item], []
    while pending:
        node = pending.pop()
        descriptors.append(node.descriptor)
        pending.extend(reversed(getattr(node, "members", ())))
    validate_preorder(descriptors)


def _in_files(source: Source) -> bool:
    if isinstance(source, CompositeSource):
        return all(_in_files(m) for m in source.members)
    return not isinstance(source.buffers, MemoryBuffers)


def _graph_name(source: Source, chunks: tuple, limits) -> str:
    if not _in_files(source):
        return f"hurray-{uuid.uuid4().hex}"
    from dask.base import tokenize

    return "hurray-" + tokenize(pickle.dumps((source, chunks, limits)))


def _lone_chunk(results):
    """The one array of a single-chunk result (dask nests it in lists), else None."""
    while isinstance(results, (list, tuple)) and len(results) == 1:
        results = results[0]
    return results if type(results) is np.ndarray else None


def _finalize(results):
    """dask.array's ``finalize``, but for a lone chunk that its task allocated: dask copies a lone
    chunk in case it is a buffer that the graph or a worker also holds.  What :func:`read_chunk`
    returns is either a view (of a mapped file, of an in-memory buffer: it owns no memory, and
    dask's copy is made) or an array the task allocated, held by nothing else once the scheduler
    hands it over -- unless a scheduler callback (dask's result cache is one) saw it: then too
    dask's copy is made."""
    from dask.array.core import finalize
    from dask.callbacks import Callback

    lone = _lone_chunk(results)
    if lone is not None and lone.flags.owndata and lone.flags.writeable and not Callback.active:
        return lone
    return finalize(results)


def _array_type():
    """``dask.array.Array`` whose :meth:`__dask_postcompute__` is :func:`_finalize` (what dask
    builds from it -- slices, arithmetic, ``persist()`` -- are plain arrays)."""
    global _ARRAY_TYPE
    if _ARRAY_TYPE is None:
        import dask.array as da

        class HurrayArray(da.Array):
            """A ``dask.array.Array`` of a Hurray tensor or composite (:func:`to_dask`)."""

            __slots__ = ()

            def __dask_postcompute__(self):
                return _finalize, ()

        HurrayArray.__module__, HurrayArray.__qualname__ = __name__, "HurrayArray"
        _ARRAY_TYPE = HurrayArray
    return _ARRAY_TYPE


_ARRAY_TYPE = None


def _array(source: Source, chunks, chunk_bytes: Optional[int], limits: Optional[Limits]):
    from dask.highlevelgraph import HighLevelGraph

    desc = source.descriptor
    shape = check_shape(desc.shape)
    dtype = np.dtype(numpy_dtype(decoded_type(desc)))
    grid = _grid(source, shape, dtype, chunks, chunk_bytes)
    name = _graph_name(source, grid, limits)
    starts = [np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]]).tolist() for sizes in grid]
    cells = [len(sizes) for sizes in grid]
    threads = 1 if math.prod(cells) > 1 else None
    layer = {}
    for cell in np.ndindex(*cells):
        lo = tuple(int(starts[d][i]) for d, i in enumerate(cell))
        hi = tuple(l + int(grid[d][i]) for d, (l, i) in enumerate(zip(lo, cell)))
        layer[(name,) + tuple(cell)] = (read_chunk, *narrow(source, lo, hi), limits, threads)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return _array_type()(graph, name, grid, meta=np.empty((0,) * len(shape), dtype))


def _build(source: Source, chunks, chunk_bytes, limits):
    if _rule(source) == CompositionRule.GROUP:
        return tuple(_build(m, None, chunk_bytes, limits) for m in source.members)
    if source.descriptor.layout.tag == LayoutTag.COMPOSITE and _rule(source) not in (
            CompositionRule.PARTITION, CompositionRule.OVERLAY):
        raise HurraySchemaError(f"composition rule 0x{int(_rule(source)):02X} has no array view")
    return _array(source, chunks, chunk_bytes, limits)


def to_dask(item, chunks=None, *, chunk_bytes: Optional[int] = None, limits: Optional[Limits] = None,
            locate: Optional[Callable] = None):
    """A lazy ``dask.array.Array`` of ``item``'s logical array (a tuple of them for a group):
    the head's shape, the decoded dtype, one task per chunk (module docstring).

    ``chunks``: anything ``dask.array`` takes (for a partition, extra edges on the member grid);
    ``chunk_bytes``: the size default chunks aim at (:data:`DEFAULT_CHUNK_BYTES`; for a
    partition, given, it also cuts members larger than that); ``limits``: each chunk's read is
    charged against them (:func:`.region.read_box`); ``locate(leaf)``: a leaf's
    :class:`FileBuffers`, None to keep it in memory.  A composite is validated by the
    composite binder first (its ``SpecViolation`` is raised here, not by a task).
    """
    _validate(item)
    return _build(source_tree(item, locate), chunks, chunk_bytes, limits)
