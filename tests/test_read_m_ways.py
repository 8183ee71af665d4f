"""A checkpoint saved N ways read M ways: each rank reads only its box (``HurrayFile.shard``).

Partitions are written by this project's writer (``hs.partition`` with grids that do not divide
evenly, 1-D and 2-D, float32 / bfloat16 / int8 / float64) and read by M = 1 .. 5 ranks along each
dimension, every rank with a reader of its own (a rank is a process of its own).  Each rank's array
is compared with NumPy's cut of the full array (``numpy.array_split``), bit for bit.  What a rank
reads is counted twice: by the reader of a local file read by range (``mmap=False``,
``bytes_fetched``) and, over HTTP, by nginx's access log (the ``Range`` each request asked for).
Reading a box may fetch at most 5 % more than the box's own bytes; opening a file fetches its
descriptors and sections, and its tail (the first request, a fixed size: trailer, index, KV).
"""

from __future__ import annotations

import uuid

import ml_dtypes
import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, IndexRangeError, IndexTypeError, NoSuchItem, NotAnArray
from hurray_schema.io import source as sources
from hurray_schema.io.shards import ShardBox, rank_box

RNG = np.random.default_rng(49)
RANK_COUNTS = range(1, 6)
BOX_SLACK = 1.05
"""A rank's box read fetches at most this many times the box's own bytes."""


def values(shape, dtype) -> np.ndarray:
    """Random values of ``dtype`` (integers in their range; floats spread over several binades)."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    return (RNG.standard_normal(shape) * 100).astype(dtype)


# (name, shape, dtype, grid): grids that do not divide the extents evenly
CASES = [
    ("1d-float32-7", (100_003,), np.float32, (7,)),
    ("2d-bfloat16-3x2", (301, 2053), ml_dtypes.bfloat16, (3, 2)),
    ("2d-int8-2x3", (517, 4099), np.int8, (2, 3)),
    ("2d-float64-4x3", (129, 1031), np.float64, (4, 3)),
]


@pytest.fixture(scope="module", params=CASES, ids=[case[0] for case in CASES])
def saved(request, tmp_path_factory):
    """(full array, path of a file holding it as the partition ``p``, the partition's grid)."""
    _, shape, dtype, grid = request.param
    full = values(shape, dtype)
    path = tmp_path_factory.mktemp("m-ways") / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=grid)})
    return full, path, grid


def rank_cuts(full: np.ndarray):
    """(dim, M, rank, NumPy's part of ``full`` for that rank) for every dimension, M and rank."""
    for dim in range(full.ndim):
        for count in RANK_COUNTS:
            for rank, part in enumerate(np.array_split(full, count, axis=dim)):
                yield dim, count, rank, part


def same_bits(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def metadata_bytes(f) -> int:
    """The bytes of the file that are no tensor's data: header, descriptors, padding, index, KV, trailer."""
    return f.size - sum(entry.data_length for entry in f.entries())


def open_allowance(f) -> int:
    """What opening may fetch: every byte that is no tensor data, and the tail read first."""
    return metadata_bytes(f) + sources.tail_bytes(f.size, sources.DEFAULT_BLOCK_SIZE)


# ------------------------------------------------------------------------------------
# The split rule
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(10,), (7, 3), (3, 11, 2), (0, 4), (2, 5)])
def test_rank_boxes_are_numpys_array_split(shape):
    positions = np.arange(int(np.prod(shape))).reshape(shape)
    for dim in range(len(shape)):
        for count in (1, 2, 3, 4, 5, 8, 13):
            for rank, part in enumerate(np.array_split(positions, count, axis=dim)):
                box = rank_box(shape, rank, count, dim)
                assert isinstance(box, ShardBox) and box.shape == part.shape
                same_bits(positions[box.index], part)
                assert rank_box(shape, rank, count, dim - len(shape)) == box  # a negative dim counts from the end


def test_a_partition_cut_by_its_own_grid_gives_each_rank_one_member(tmp_path):
    full = values((23, 17), np.float32)
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=(5, 1))})
    with hs.read_file(path) as f:
        members = {tuple(int(o) for o in f.descriptor(entry.name).shard.shard_offset): f.descriptor(entry.name).shape
                   for entry in f.entries() if entry.name != "p"}
        for rank in range(5):
            box = f.shard_box("p", rank=rank, of=5)
            assert members[box.offset] == box.shape


# ------------------------------------------------------------------------------------
# Local files: values, and bytes counted by the reader of a file read by range
# ------------------------------------------------------------------------------------


def test_each_rank_reads_its_box_from_a_mapped_file(saved):
    full, path, _ = saved
    with hs.read_file(path) as f:
        for dim, count, rank, part in rank_cuts(full):
            same_bits(f.shard("p", rank=rank, of=count, dim=dim), part)
            box = f.shard_box("p", rank=rank, of=count, dim=dim)
            same_bits(full[box.index], part)


def test_each_rank_fetches_only_its_box_from_a_local_file(saved):
    full, path, _ = saved
    for dim, count, rank, part in rank_cuts(full):
        with hs.read_file(path, mmap=False) as f:
            opened = f.bytes_fetched
            assert opened <= open_allowance(f)
            same_bits(f.shard("p", rank=rank, of=count, dim=dim), part)
            assert f.bytes_fetched - opened <= BOX_SLACK * part.nbytes, (dim, count, rank)


# ------------------------------------------------------------------------------------
# Over HTTP: bytes counted by nginx
# ------------------------------------------------------------------------------------


def served(nginx, path) -> tuple[str, str]:
    """The file at ``path`` copied into nginx's folder: (its name there, its URL)."""
    name = f"{uuid.uuid4().hex}.hrry"
    (nginx.root / name).write_bytes(path.read_bytes())
    return name, nginx.url(name)


def asked_bytes(log) -> int:
    """The bytes of the file the logged GETs asked for (every range of a ``Range`` header)."""
    total = 0
    for method, _status, _sent, asked in log:
        if method != "GET" or not asked.startswith("bytes="):
            continue
        for part in asked[len("bytes="):].split(","):
            first, _, last = part.partition("-")
            total += int(last) - int(first) + 1
    return total


def test_each_rank_fetches_only_its_box_over_http(saved, nginx):
    full, path, _ = saved
    name, url = served(nginx, path)
    for dim, count, rank, part in rank_cuts(full):
        before = len(nginx.requests(name))
        with hs.read_file(url) as f:
            opening = nginx.requests_since(name, before, at_least=f.requests + 1)  # the HEAD too
            assert asked_bytes(opening) == f.bytes_fetched <= open_allowance(f)
            got = f.shard("p", rank=rank, of=count, dim=dim)
            reading = nginx.requests_since(name, before + len(opening), at_least=f.requests + 1 - len(opening))
            assert asked_bytes(opening + reading) == f.bytes_fetched
        same_bits(got, part)
        assert all(status == 206 for method, status, _, _ in reading if method == "GET")
        assert asked_bytes(reading) <= BOX_SLACK * part.nbytes, (dim, count, rank)


# ------------------------------------------------------------------------------------
# Items that are no partition
# ------------------------------------------------------------------------------------


def test_a_tensor_and_an_overlay_are_read_by_their_box(tmp_path, nginx):
    full = values((61, 45), np.float32)
    corrected = full.copy()
    corrected[10:20, 5:9] = 7.0
    items = {"t": full, "o": hs.overlay(full, [(np.full((10, 4), 7.0, np.float32), (10, 5))])}
    path = tmp_path / "items.hrry"
    hs.write_file(path, items)
    name, url = served(nginx, path)
    for where in (path, url):
        with hs.read_file(where) as f:
            for item, want in (("t", full), ("o", corrected)):
                for dim, count, rank, part in rank_cuts(want):
                    same_bits(f.shard(item, rank=rank, of=count, dim=dim), part)
                    same_bits(f[item].shard(rank=rank, of=count, dim=dim), part)


def test_a_plain_tensor_fetches_only_its_box(tmp_path):
    full = values((400, 1000), np.float32)
    path = tmp_path / "t.hrry"
    hs.write_file(path, {"t": full})
    for dim, count, rank, part in rank_cuts(full):
        with hs.read_file(path, mmap=False) as f:
            opened = f.bytes_fetched
            same_bits(f.shard("t", rank=rank, of=count, dim=dim), part)
            assert f.bytes_fetched - opened <= BOX_SLACK * part.nbytes


def test_a_groups_members_are_sharded_one_by_one(tmp_path):
    first, second = values((9, 4), np.float32), values((5,), np.int8)
    path = tmp_path / "g.hrry"
    hs.write_file(path, {"g": hs.group({"g.w": first, "g.b": second})})
    with hs.read_file(path) as f:
        with pytest.raises(NotAnArray, match="'g.w', 'g.b'"):
            f.shard("g", rank=0, of=2)
        with pytest.raises(NotAnArray):
            f.shard_box("g", rank=0, of=2)
        with pytest.raises(NotAnArray):
            f["g"].shard(rank=0, of=2)
        same_bits(f.shard("g.w", rank=1, of=2), np.array_split(first, 2)[1])
        same_bits(f.shard("g.b", rank=2, of=3), np.array_split(second, 3)[2])


def test_a_member_entry_is_read_by_its_own_box(tmp_path):
    full = values((10, 6), np.float32)
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=(2, 1))})
    with hs.read_file(path) as f:
        same_bits(f.shard("p.1", rank=1, of=2, dim=1), full[5:, 3:])


# ------------------------------------------------------------------------------------
# Dask: chunks follow the members
# ------------------------------------------------------------------------------------


def test_to_dask_chunks_follow_the_members_and_compute_to_numpy(saved, nginx):
    pytest.importorskip("dask.array")
    full, path, grid = saved
    member_extents = tuple(tuple(len(piece) for piece in np.array_split(np.arange(n), pieces))
                           for n, pieces in zip(full.shape, grid))
    name, url = served(nginx, path)
    for where in (path, url):
        with hs.read_file(where) as f:
            lazy = f.to_dask("p")
            assert lazy.chunks == member_extents
            same_bits(lazy.compute(scheduler="sync"), full)


def test_one_dask_chunk_over_http_fetches_one_members_bytes(nginx, tmp_path):
    pytest.importorskip("dask.array")
    full = values((300, 1000), np.float32)
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=(3, 2))})
    name, url = served(nginx, path)
    with hs.read_file(url) as f:
        lazy = f.to_dask("p")
        before = len(nginx.requests(name))
        chunk = lazy.blocks[1, 1].compute(scheduler="sync")
        reading = nginx.requests_since(name, before)
    same_bits(chunk, full[100:200, 500:])
    assert asked_bytes(reading) <= BOX_SLACK * chunk.nbytes


def test_members_that_form_no_grid_are_cut_at_every_edge(tmp_path):
    pytest.importorskip("dask.array")
    full = values((7, 9), np.float32)
    boxes = [((0, 0), (3, 6)), ((0, 6), (3, 3)), ((3, 0), (4, 2)), ((3, 2), (4, 7))]  # bricks: no grid
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, boxes=boxes)})
    with hs.read_file(path) as f:
        lazy = f.to_dask("p")
        assert lazy.chunks == ((3, 4), (2, 4, 3))  # every member edge: a member spans several chunks
        for i, j in np.ndindex(*lazy.numblocks):
            lo = (sum(lazy.chunks[0][:i]), sum(lazy.chunks[1][:j]))
            hi = (lo[0] + lazy.chunks[0][i], lo[1] + lazy.chunks[1][j])
            assert any(all(o <= a and b <= o + n for a, b, o, n in zip(lo, hi, offset, shape))
                       for offset, shape in boxes)  # each chunk inside one member
        same_bits(lazy.compute(scheduler="sync"), full)


# ------------------------------------------------------------------------------------
# Hostile arguments
# ------------------------------------------------------------------------------------


BAD_SHARDS = [
    (dict(rank=2, of=2), IndexRangeError),
    (dict(rank=-1, of=2), IndexRangeError),
    (dict(rank=0, of=0), IndexRangeError),
    (dict(rank=0, of=-3), IndexRangeError),
    (dict(rank=0, of=2, dim=2), IndexRangeError),
    (dict(rank=0, of=2, dim=-3), IndexRangeError),
    (dict(rank=True, of=2), IndexTypeError),
    (dict(rank=0, of=2.0), IndexTypeError),
    (dict(rank=0, of=2, dim="0"), IndexTypeError),
    (dict(rank=0, of=10 ** 30, dim=0), None),  # a huge rank count: empty boxes, nothing allocated
]


@pytest.mark.parametrize("arguments, error", BAD_SHARDS, ids=[str(case[0]) for case in BAD_SHARDS])
def test_bad_ranks_counts_and_dims_are_typed_errors(tmp_path, nginx, arguments, error):
    full = values((6, 4), np.float32)
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=(2, 2))})
    _, url = served(nginx, path)
    for where in (path, url):
        with hs.read_file(where) as f:
            if error is None:
                assert f.shard("p", **arguments).shape == (1, 4)
                continue
            with pytest.raises(error) as raised:
                f.shard("p", **arguments)
            assert isinstance(raised.value, HurraySchemaError)
            with pytest.raises(error):
                f.shard_box("p", **arguments)


def test_a_name_the_file_lacks_is_a_typed_error(tmp_path):
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(values((4, 4), np.float32), grid=(2, 1))})
    with hs.read_file(path) as f:
        for name in ("q", "p.2", ""):
            with pytest.raises(NoSuchItem, match=repr(name)):
                f.shard(name, rank=0, of=1)
            with pytest.raises(NoSuchItem):
                f.shard_box(name, rank=0, of=1)


def test_a_scalar_has_no_dimension_to_cut(tmp_path):
    path = tmp_path / "s.hrry"
    hs.write_file(path, {"s": np.float32(3)})
    with hs.read_file(path) as f, pytest.raises(IndexRangeError, match="rank-0"):
        f.shard("s", rank=0, of=1)


# ------------------------------------------------------------------------------------
# The reader by range: what it fetches for scattered ranges
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cost", [0, sources.PART_COST, sources.RANGE_COST])
def test_a_fill_fetches_its_bytes_within_the_slack_and_one_range_cost_a_run(cost):
    data = RNG.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    source = sources.MemorySource(data)
    source.range_cost = cost
    reader = sources.RangeReader(source)
    starts = np.sort(RNG.choice(1 << 19, 300, replace=False)) * 2
    spans = [(int(a), int(min(a + RNG.integers(1, 3000), 1 << 20))) for a in starts]
    targets = [(a, b, memoryview(bytearray(b - a))) for a, b in spans]
    reader.fill(targets)
    assert all(bytes(dest) == data[a:b] for a, b, dest in targets)
    asked = sum(b - a for a, b in sources.merged_spans(spans))
    assert reader.bytes_fetched <= asked + asked // sources.RUN_SLACK + cost * reader.requests


def test_opening_fetches_what_its_tail_holds_once(tmp_path):
    """A file smaller than the tail read first: opening it and reading everything fetch it once."""
    full = values((40, 100), np.float32)
    path = tmp_path / "p.hrry"
    hs.write_file(path, {"p": hs.partition(full, grid=(4, 1))})
    with hs.read_file(path, mmap=False) as f:
        assert f.size < sources.DEFAULT_BLOCK_SIZE
        assert (f.requests, f.bytes_fetched) == (1, f.size)
        same_bits(f["p"].materialize(), full)
        assert (f.requests, f.bytes_fetched) == (1, f.size)
