"""Tensors and composites as dask arrays (``to_dask``) and ``merge --memory``.

Every evaluation through dask is compared bit for bit with ``materialize()`` /
``to_numpy()`` of the same item (and, where the values are known, with NumPy), on the
threaded scheduler and on a two-process ``distributed.LocalCluster``.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hurray_schema as hs
from hurray_schema.cli import main
from hurray_schema.export import ZARR_DTYPE_ATTRIBUTE, export_zarr
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.evaluate.dask_graph import FileBuffers, LeafSource, read_chunk
from hurray_schema.io import Composite, Tensor, read_file, write_file
from hurray_schema.model import CompositionRule, ElementType

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

RNG = np.random.default_rng(14)


@pytest.fixture(scope="module")
def client():
    """One two-process cluster for the whole module (it is slow to start); its workers import
    this checkout (the tasks' function is pickled by reference)."""
    root = str(Path(__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + (os.pathsep + previous if previous else "")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster:
        with distributed.Client(cluster, set_as_default=False) as connected:
            yield connected
    if previous is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = previous


def same_bits(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def expected(item):
    return item.materialize() if isinstance(item, Composite) else item.to_numpy()


def saved(tmp_path, item, name="x"):
    path = tmp_path / f"{name}.hrry"
    write_file(path, {name: item})
    return path


# ------------------------------------------------------------------------------------
# Hidden-style cases
# ------------------------------------------------------------------------------------

IRREGULAR_BOXES = [((0, 0), (10, 20)), ((0, 20), (10, 33)), ((10, 0), (17, 7)), ((10, 7), (17, 46)),
                   ((27, 0), (10, 53))]
"""Boxes covering [37, 53] that are no grid: the edges per dimension cut members."""


def _csr(sub):
    """``sub`` without its small entries, as CSR (row pointers, column indices, values)."""
    rows, cols = np.nonzero(np.abs(sub) > 1.0)
    pointers = np.searchsorted(rows, np.arange(sub.shape[0] + 1))
    return hs.sparse_csr(sub[rows, cols], cols, pointers, sub.shape)


def _mixed_member(kinds):
    """A member builder cycling through layouts / storage types (each decodes to the input's float
    type): dense, COO, CSR, or per-block quantized with int4 / int8 codes (scales in the input's type)."""
    state = {"i": 0}

    def build(sub):
        kind = kinds[state["i"] % len(kinds)]
        state["i"] += 1
        if kind == "dense" or sub.shape[-1] < 2:  # a block holds at least two elements
            return Tensor.from_numpy(sub)
        if kind == "coo":
            keep = np.argwhere(np.abs(sub) > 1.0)
            return hs.sparse_coo(keep, sub[tuple(keep.T)], sub.shape)
        if kind == "csr":
            return _csr(sub)
        return hs.quantize(sub, "per_block", storage=kind)

    return build


def irregular_partition(dtype=np.float16, kinds=("dense", "coo", "int4")):
    data = RNG.standard_normal((37, 53)).astype(dtype)
    return hs.partition(data, boxes=IRREGULAR_BOXES, member=_mixed_member(list(kinds)))


def int16_partition():
    data = RNG.integers(-30000, 30000, (9, 8, 5)).astype(np.int16)
    return hs.partition(data, boxes=[((0, 0, 0), (4, 8, 5)), ((4, 0, 0), (5, 3, 5)), ((4, 3, 0), (5, 5, 2)),
                                     ((4, 3, 2), (5, 5, 3))])


def spqr_overlay(dtype, combine):
    return hs.spqr(RNG.standard_normal((48, 256)).astype(dtype), combine_op=combine, outliers=0.02)


def nested():
    """A partition whose members are an SpQR overlay, a partition and a plain tensor."""
    top = hs.spqr(RNG.standard_normal((16, 128)).astype(np.float16), combine_op="add")
    inner = hs.partition(RNG.standard_normal((8, 128)).astype(np.float16), grid=(2, 4),
                         member=lambda a: hs.quantize(a, "per_block", block_size=32))
    plain = Tensor.from_numpy(RNG.standard_normal((8, 128)).astype(np.float16))
    members = [Composite._with_sections(m, hs.model.Shard((32, 128), (row, 0)), None)
               for m, row in ((top, 0), (inner, 16), (plain, 24))]
    return Composite.build(CompositionRule.PARTITION, members, shape=(32, 128), type_tag=ElementType.FLOAT16)


def nested_overlays():
    """An overlay whose base is a partition (of quantized and sparse members) and whose corrections
    are a partition and a small dense box, inside a partition beside a plain bfloat16 tensor."""
    base = hs.partition(RNG.standard_normal((16, 64)).astype(ml_dtypes.bfloat16), grid=(2, 2),
                        member=_mixed_member(["int8", "coo", "int4", "dense"]))
    patch = hs.partition(RNG.standard_normal((8, 64)).astype(ml_dtypes.bfloat16), grid=(1, 2))
    box = Tensor.from_numpy(RNG.standard_normal((3, 5)).astype(ml_dtypes.bfloat16))
    top = hs.overlay(base, [(patch, (4, 0)), (box, (10, 30))], "add")
    plain = Tensor.from_numpy(RNG.standard_normal((8, 64)).astype(ml_dtypes.bfloat16))
    members = [Composite._with_sections(m, hs.model.Shard((24, 64), (row, 0)), None) for m, row in ((top, 0),
                                                                                                    (plain, 16))]
    return Composite.build(CompositionRule.PARTITION, members, shape=(24, 64), type_tag=ElementType.BFLOAT16)


def overlay_with_empty_corrections(dtype):
    """SpQR-style: an int4 base, a correction storing no entry, then the outliers."""
    weight = RNG.standard_normal((16, 128)).astype(dtype)
    spqr = hs.spqr(weight, combine_op="add")
    nothing = hs.sparse_coo(np.zeros((0, 2), np.int64), np.zeros(0, dtype), (16, 128))
    return hs.overlay(spqr.members[0], [nothing, spqr.members[1]], "add")


CASES = {
    "irregular-mixed-f16": irregular_partition,
    "irregular-int4-int8-coo-dense-f32": lambda: irregular_partition(np.float32, ("int4", "int8", "dense", "coo")),
    "irregular-int8-int4-coo-f16": lambda: irregular_partition(np.float16, ("int8", "int4", "coo")),
    "irregular-csr-int8-dense-coo-f32": lambda: irregular_partition(np.float32, ("csr", "int8", "dense", "coo")),
    "irregular-int4-csr-bf16": lambda: irregular_partition(ml_dtypes.bfloat16, ("int4", "csr", "dense")),
    "irregular-int16": int16_partition,
    "spqr-f16-replace": lambda: spqr_overlay(np.float16, "replace"),
    "spqr-f16-add": lambda: spqr_overlay(np.float16, "add"),
    "spqr-bf16-replace": lambda: spqr_overlay(ml_dtypes.bfloat16, "replace"),
    "spqr-bf16-add": lambda: spqr_overlay(ml_dtypes.bfloat16, "add"),
    "nested": nested,
    "nested-overlays-bf16": nested_overlays,
    "overlay-empty-correction-f16": lambda: overlay_with_empty_corrections(np.float16),
    "overlay-empty-correction-bf16": lambda: overlay_with_empty_corrections(ml_dtypes.bfloat16),
    "empty-tensor": lambda: Tensor.from_numpy(np.zeros((0, 5), np.float32)),
    "empty-partition": lambda: hs.partition(np.zeros((4, 0), np.float16), grid=(2, 1)),
    "rank-0": lambda: Tensor.dense(ElementType.FLOAT32, (), np.array(2.5, np.float32).tobytes()),
    "quantized-tensor": lambda: hs.quantize(RNG.standard_normal((20, 64)).astype(np.float16), "per_block"),
}

def _leaves(item):
    """(layout class, storage type, scale type or None) of every leaf of ``item``, pre-order."""
    if getattr(item, "members", None) is None:
        quantization = item.descriptor.quantization
        return [(type(item.descriptor.layout).__name__, item.descriptor.type_tag,
                 quantization.scale_type_tag if quantization is not None else None)]
    return [leaf for member in item.members for leaf in _leaves(member)]


def test_the_mixed_cases_hold_what_they_are_named_for():
    f32, f16 = ElementType.FLOAT32, ElementType.FLOAT16
    assert set(_leaves(CASES["irregular-int4-int8-coo-dense-f32"]())) == {
        ("RowMajorLayout", ElementType.INT4, f32), ("RowMajorLayout", ElementType.INT8, f32),
        ("RowMajorLayout", f32, None), ("CooLayout", f32, None)}
    assert {leaf[:2] for leaf in _leaves(CASES["irregular-int8-int4-coo-f16"]())} == {
        ("RowMajorLayout", ElementType.INT8), ("RowMajorLayout", ElementType.INT4), ("CooLayout", f16)}
    assert {leaf[0] for leaf in _leaves(CASES["irregular-csr-int8-dense-coo-f32"]())} == {
        "CsrLayout", "RowMajorLayout", "CooLayout"}
    nested_leaves = _leaves(CASES["nested-overlays-bf16"]())
    assert {leaf[1] for leaf in nested_leaves} == {ElementType.INT8, ElementType.INT4, ElementType.BFLOAT16}
    assert CASES["overlay-empty-correction-f16"]().members[1].descriptor.layout.nnz == 0


SMALL_CHUNKS = 4096
"""``chunk_bytes`` small enough that every non-empty case is cut into several chunks."""


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk_bytes", [None, SMALL_CHUNKS])
def test_in_memory_threaded_equals_materialize(case, chunk_bytes):
    item = CASES[case]()
    lazy = item.to_dask(chunk_bytes=chunk_bytes)
    assert lazy.shape == tuple(item.shape)
    assert same_bits(lazy.compute(scheduler="threads"), expected(item))


@pytest.mark.parametrize("case", sorted(CASES))
def test_file_backed_threaded_and_distributed_equal_materialize(case, tmp_path, client):
    item = CASES[case]()
    with read_file(saved(tmp_path, item)) as f:
        want = expected(f["x"])
        assert same_bits(want, expected(item))
        lazy = f.to_dask("x", chunk_bytes=SMALL_CHUNKS)
        assert same_bits(lazy.compute(scheduler="threads"), want)
        assert same_bits(client.compute(lazy).result(), want)


def test_in_memory_items_run_on_the_cluster(client):
    item = spqr_overlay(np.float16, "replace")
    lazy = item.to_dask(chunks=(16, 128))
    assert lazy.numblocks == (3, 2)
    assert same_bits(client.compute(lazy).result(), item.materialize())


def test_group_is_a_tuple_of_arrays(tmp_path, client):
    first = RNG.standard_normal((6, 4)).astype(np.float32)
    item = hs.group({"a": first, "b": irregular_partition()})
    with read_file(saved(tmp_path, item)) as f:
        lazy = f.to_dask("x")
        assert isinstance(lazy, tuple) and len(lazy) == 2
        want = f["x"].materialize()
        for got, value in zip(client.gather(client.compute(list(lazy))), want):
            assert same_bits(got, value)
    assert same_bits(lazy[0].compute(scheduler="threads"), first)


def test_a_member_entry_of_a_file(tmp_path):
    item = irregular_partition()
    with read_file(saved(tmp_path, item)) as f:
        assert same_bits(f.to_dask("x.3").compute(), f.get_item("x.3").to_numpy())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.integers(1, 6), min_size=1, max_size=4), cols=st.lists(st.integers(1, 9), min_size=1,
                                                                                max_size=3),
       chunk=st.sampled_from([None, 64, 200]), seed=st.integers(0, 2**16))
def test_property_any_band_partition(rows, cols, chunk, seed):
    """Rows cut in bands, each band cut in its own columns: the member grid is irregular."""
    gen = np.random.default_rng(seed)
    width = sum(cols)
    data = gen.standard_normal((sum(rows), width)).astype(np.float16)
    boxes, top = [], 0
    for k, height in enumerate(rows):
        widths = cols[k % len(cols):] + cols[:k % len(cols)]
        left = 0
        for w in widths:
            boxes.append(((top, left), (height, w)))
            left += w
        top += height
    item = hs.partition(data, boxes=boxes, member=_mixed_member(["int4", "dense", "coo"]))
    got = item.to_dask(chunk_bytes=chunk).compute(scheduler="threads")
    assert same_bits(got, item.materialize())


# ------------------------------------------------------------------------------------
# Chunk grids
# ------------------------------------------------------------------------------------


def test_a_regular_grid_of_members_gives_one_chunk_per_member():
    data = RNG.standard_normal((10, 12)).astype(np.float32)
    lazy = hs.partition(data, grid=(2, 3)).to_dask()
    assert lazy.chunks == ((5, 5), (4, 4, 4))
    assert same_bits(lazy.compute(), data)


def test_an_irregular_partition_is_cut_at_every_member_edge():
    lazy = irregular_partition().to_dask()
    assert lazy.chunks == ((10, 17, 10), (7, 13, 33))


def test_overlay_chunks_keep_to_the_base_blocks():
    item = hs.spqr(RNG.standard_normal((8, 1024)).astype(np.float16))  # block 64 along the last axis
    lazy = item.to_dask(chunk_bytes=1000)  # a row is 2048 bytes: rows are cut
    widths = lazy.chunks[1]
    assert len(widths) > 1 and all(w % 64 == 0 for w in widths[:-1])
    assert max(widths) * 2 <= 1000
    assert same_bits(lazy.compute(), item.materialize())


def test_default_overlay_chunk_is_about_64_mib():
    item = hs.spqr(RNG.standard_normal((64, 128)).astype(np.float16))
    assert item.to_dask().chunks == ((64,), (128,))


def test_user_chunks_refine_the_member_grid():
    data = RNG.standard_normal((10, 12)).astype(np.float32)
    lazy = hs.partition(data, grid=(2, 1)).to_dask(chunks=(3, 12))
    assert lazy.chunks == ((3, 2, 1, 3, 1), (12,))
    assert same_bits(lazy.compute(), data)


# ------------------------------------------------------------------------------------
# Tasks carry the source, not the data
# ------------------------------------------------------------------------------------


def _tasks(lazy) -> dict:
    """chunk key -> (function, source, lo, hi, limits, kernel threads) as the graph holds them."""
    layer = lazy.dask.layers[lazy.name]
    return {key: layer[key] for key in layer}


def test_each_partition_chunk_reads_only_its_members_bytes(tmp_path):
    item = irregular_partition()
    with read_file(saved(tmp_path, item)) as f:
        lazy = f.to_dask("x")
        index = {entry.name: entry for entry in f.entries()}
        starts = [np.cumsum((0,) + c)[:-1] for c in lazy.chunks]
        seen = set()
        for key, (function, source, lo, hi, _limits, _threads) in _tasks(lazy).items():
            assert function is read_chunk and isinstance(source, LeafSource)
            chunk_lo = tuple(int(starts[d][i]) for d, i in enumerate(key[1:]))
            (member,) = [k for k, (off, shp) in enumerate(IRREGULAR_BOXES)
                         if all(o <= c < o + n for c, o, n in zip(chunk_lo, off, shp))]
            entry = index[f"x.{member}"]
            assert source.descriptor == f.descriptor(entry.name)
            assert source.buffers.path == str(tmp_path / "x.hrry")
            for offset, size in source.buffers.ranges:
                assert entry.data_offset <= offset and offset + size <= entry.data_offset + entry.data_length
            assert tuple(l + o for l, o in zip(lo, IRREGULAR_BOXES[member][0])) == chunk_lo
            seen.add(member)
        assert seen == set(range(len(IRREGULAR_BOXES)))


def test_a_lone_chunk_is_the_tasks_own_array_and_independent_between_computes():
    item = spqr_overlay(np.float16, "add")
    lazy = item.to_dask()
    assert lazy.numblocks == (1, 1)
    first = lazy.compute()
    assert first.flags.owndata and first.flags.writeable
    first[...] = 0
    assert same_bits(lazy.compute(), item.materialize())


def test_a_lone_chunk_viewing_a_buffer_is_copied():
    data = RNG.standard_normal((6, 4)).astype(np.float32)
    item = Tensor.from_numpy(data)
    (_, source, lo, hi, limits, threads), = _tasks(item.to_dask()).values()
    view = read_chunk(source, lo, hi, limits, threads)
    assert not view.flags.owndata  # the task's result is a view of the tensor's buffer ...
    got = item.to_dask().compute()
    assert not any(np.shares_memory(got, np.frombuffer(b, np.uint8)) for b in item.buffers)  # ... computed: a copy
    got[...] = 0
    assert same_bits(item.to_numpy(), data)


def test_a_lone_chunk_is_copied_while_a_scheduler_callback_is_active():
    from dask.callbacks import Callback

    from hurray_schema.evaluate.dask_graph import _finalize

    chunk = np.arange(6, dtype=np.float32).reshape(2, 3).copy()  # an array of its own
    assert _finalize([[chunk]]) is chunk
    assert _finalize([[chunk[:1]]]) is not chunk  # a view: copied
    with Callback(posttask=lambda *args: None):  # e.g. dask's result cache
        got = _finalize([[chunk]])
    assert same_bits(got, chunk) and not np.shares_memory(got, chunk)
    assert same_bits(_finalize([[chunk], [chunk]]), np.concatenate([chunk, chunk]))  # several: dask's assembly


def test_kernels_run_on_one_thread_per_task_of_a_graph_of_several_chunks(monkeypatch):
    import hurray_schema.evaluate.dask_graph as dask_graph
    from hurray_schema.evaluate import jit

    item = spqr_overlay(np.float16, "add")
    several, lone = item.to_dask(chunk_bytes=SMALL_CHUNKS), item.to_dask()
    assert {task[-1] for task in _tasks(several).values()} == {1}
    assert {task[-1] for task in _tasks(lone).values()} == {None}
    counts, reading = [], dask_graph.read_box

    def counted(*args, **kwargs):
        counts.append(jit.threads())
        return reading(*args, **kwargs)

    monkeypatch.setattr(dask_graph, "read_box", counted)
    before = jit.threads()
    assert same_bits(several.compute(scheduler="sync"), item.materialize())
    assert set(counts) == {1} and len(counts) == several.npartitions
    assert jit.threads() == before


def test_the_graph_holds_no_data(tmp_path):
    small, large = (hs.partition(np.ones((rows, 256), np.float32), grid=(4, 1)) for rows in (8, 8192))
    sizes = []
    for name, item in (("small", small), ("large", large)):
        with read_file(saved(tmp_path, item, name)) as f:
            sizes.append(len(pickle.dumps(_tasks(f.to_dask(name)))))
    assert abs(sizes[0] - sizes[1]) < 512  # the same tasks but for the digits of offsets and sizes
    assert sizes[1] < 8192 * 256 * 4 // 1000


def test_a_changed_file_is_refused(tmp_path):
    path = saved(tmp_path, irregular_partition())
    with read_file(path) as f:
        lazy = f.to_dask("x")
    with open(path, "ab") as grown:
        grown.write(bytes(8))
    with pytest.raises(HurraySchemaError, match="has changed"):
        lazy.compute(scheduler="sync")


def test_byte_ranges_outside_the_file_are_refused(tmp_path):
    path = saved(tmp_path, Tensor.from_numpy(np.arange(4, dtype=np.float32)))
    with read_file(path) as f:
        desc, size = f.descriptor("x"), f.size
    source = LeafSource(desc, FileBuffers(str(path), size, ((size - 8, 16),)))
    with pytest.raises(HurraySchemaError, match="outside"):
        read_chunk(source, (0,), (4,))


def test_an_invalid_composite_is_refused_before_the_graph():
    data = Tensor.from_numpy(np.zeros((2, 2), np.float32))
    member = Composite._with_sections(data, hs.model.Shard((4, 2), (0, 0)), None)
    broken = Composite.build(CompositionRule.PARTITION, [member], shape=(4, 2), type_tag=ElementType.FLOAT32)
    with pytest.raises(SpecViolation) as fault:
        broken.to_dask()
    assert fault.value.rule_id == "composite.close.partition_gap"


# ------------------------------------------------------------------------------------
# merge --memory
# ------------------------------------------------------------------------------------


def _merge(*args):
    return CliRunner().invoke(main, ["merge", *map(str, args)])


@pytest.mark.parametrize("case, budget", [("irregular-mixed-f16", "2K"), ("spqr-bf16-add", "4K"), ("nested", "4K"),
                                          ("irregular-int16", "256"), ("rank-0", "1")])
def test_merge_under_a_budget_writes_the_same_npy(case, budget, tmp_path):
    item = CASES[case]()
    path = saved(tmp_path, item)
    whole, chunked = tmp_path / "whole.npy", tmp_path / "chunked.npy"
    assert _merge(path, "x", "-o", whole).exit_code == 0
    done = _merge(path, "x", "-o", chunked, "--memory", budget)
    assert done.exit_code == 0, done.output
    assert "[#" in done.output  # dask's progress bar: the chunked path ran
    assert same_bits(np.load(chunked), np.load(whole))
    want = expected(item)
    assert same_bits(np.load(chunked).view(want.dtype), want)  # .npy keeps bfloat16 as raw 2-byte items
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_merge_within_the_budget_takes_the_in_memory_path(tmp_path):
    path = saved(tmp_path, irregular_partition())
    done = _merge(path, "x", "-o", tmp_path / "out.npy", "--memory", "1G")
    assert done.exit_code == 0 and "[#" not in done.output  # no progress bar: nothing went through dask
    assert same_bits(np.load(tmp_path / "out.npy"), irregular_partition_values(path))


def irregular_partition_values(path):
    with read_file(path) as f:
        return f["x"].materialize()


def test_merge_memory_refuses_a_group_and_a_bad_budget(tmp_path):
    path = saved(tmp_path, hs.group({"a": np.zeros(3, np.float32), "b": np.ones(2, np.float32)}))
    done = _merge(path, "x", "-o", tmp_path / "g.npy", "--memory", "1")
    assert done.exit_code == 2 and "group composite" in done.output
    assert _merge(path, "x", "-o", tmp_path / "g.npy", "--memory", "lots").exit_code == 2
    assert _merge(path, "x", "-o", tmp_path / "g.npy", "--memory", "0").exit_code == 2


def test_merge_memory_parses_units(tmp_path):
    path = saved(tmp_path, Tensor.from_numpy(np.arange(300, dtype=np.float64)))
    for budget in ("1K", "1KiB", "2KB", "1024"):
        out = tmp_path / f"{budget}.npy"
        assert _merge(path, "x", "-o", out, "--memory", budget).exit_code == 0
        assert same_bits(np.load(out), np.arange(300, dtype=np.float64))


# ------------------------------------------------------------------------------------
# merge --zarr
# ------------------------------------------------------------------------------------


def _zarr_values(store):
    """The store's array as its values: bits stored for a type Zarr has no data type for are viewed
    as the type its attribute names."""
    import zarr

    array = zarr.open_array(str(store), mode="r")
    values = array[...]
    named = array.attrs.get(ZARR_DTYPE_ATTRIBUTE)
    return values.view(np.dtype(getattr(ml_dtypes, named))) if named else values


@pytest.mark.parametrize("case", ["irregular-mixed-f16", "irregular-int4-int8-coo-dense-f32", "spqr-f16-replace",
                                  "spqr-bf16-add", "nested-overlays-bf16", "irregular-int16", "rank-0",
                                  "empty-tensor"])
@pytest.mark.parametrize("budget", [None, "4K"])
def test_merge_zarr_equals_materialize(case, budget, tmp_path):
    item = CASES[case]()
    store = tmp_path / "out.zarr"
    done = _merge(saved(tmp_path, item), "x", "--zarr", store, *(("--memory", budget) if budget else ()))
    assert done.exit_code == 0, done.output
    assert "[#" in done.output or 0 in np.shape(expected(item))  # dask's progress bar (nothing to do: none)
    assert same_bits(_zarr_values(store), expected(item))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr", "x.hrry"]  # no temporary left


def test_merge_zarr_chunks_follow_the_budget_on_a_regular_grid(tmp_path):
    import zarr

    store = tmp_path / "out.zarr"
    assert _merge(saved(tmp_path, irregular_partition()), "x", "--zarr", store, "--memory", "8K").exit_code == 0
    array = zarr.open_array(str(store), mode="r")
    assert array.shape == (37, 53) and array.chunks == (9, 53)  # 8K / 8 = 1024 bytes: 9 rows of 106 bytes


def test_merge_zarr_stores_bfloat16_as_its_bits(tmp_path):
    import zarr

    item = spqr_overlay(ml_dtypes.bfloat16, "replace")
    store = tmp_path / "bf16.zarr"
    assert _merge(saved(tmp_path, item), "x", "--zarr", store).exit_code == 0
    array = zarr.open_array(str(store), mode="r")
    assert array.dtype == np.uint16 and array.attrs[ZARR_DTYPE_ATTRIBUTE] == "bfloat16"
    assert array[...].tobytes() == item.materialize().tobytes()
    half = tmp_path / "f16.zarr"
    assert _merge(saved(tmp_path, spqr_overlay(np.float16, "add"), "y"), "y", "--zarr", half).exit_code == 0
    assert zarr.open_array(str(half), mode="r").dtype == np.float16
    assert ZARR_DTYPE_ATTRIBUTE not in zarr.open_array(str(half), mode="r").attrs


def test_merge_zarr_replaces_a_store_and_refuses_anything_else(tmp_path):
    path = saved(tmp_path, irregular_partition())
    store = tmp_path / "out.zarr"
    assert _merge(path, "x", "--zarr", store).exit_code == 0
    other = saved(tmp_path, Tensor.from_numpy(np.arange(6, dtype=np.float32)), "y")
    assert _merge(other, "y", "--zarr", store).exit_code == 0
    assert same_bits(_zarr_values(store), np.arange(6, dtype=np.float32))
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    done = _merge(path, "x", "--zarr", folder)
    assert done.exit_code == 2 and "not a Zarr store" in done.output
    assert (folder / "keep.txt").read_text() == "mine"


def test_merge_takes_one_output(tmp_path):
    path = saved(tmp_path, irregular_partition())
    assert _merge(path, "x").exit_code == 2
    both = _merge(path, "x", "-o", tmp_path / "a.npy", "--zarr", tmp_path / "a.zarr")
    assert both.exit_code == 2 and "exactly one" in both.output
    group = saved(tmp_path, hs.group({"a": np.zeros(3, np.float32)}), "g")
    done = _merge(group, "g", "--zarr", tmp_path / "g.zarr")
    assert done.exit_code == 2 and "group composite" in done.output


def test_merge_zarr_without_zarr_is_a_typed_error(tmp_path, monkeypatch):
    path = saved(tmp_path, irregular_partition())
    monkeypatch.setitem(sys.modules, "zarr", None)  # `import zarr` raises ImportError
    with read_file(path) as f:
        with pytest.raises(HurraySchemaError, match=r"needs zarr: pip install 'hurray_schema\[zarr\]'"):
            export_zarr(f, str(tmp_path / "out.zarr"), name="x")
    done = _merge(path, "x", "--zarr", tmp_path / "out.zarr")
    assert done.exit_code == 2 and "needs zarr" in done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.hrry"]
