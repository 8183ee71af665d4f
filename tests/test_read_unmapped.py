"""A local file read without mapping it (``read_file(path, mmap=False)``, ``io/source.py``
``LocalFileSource``): the same values, descriptors and byte ranges as the mapped reader, no
mapping of the file, a typed error (not ``SIGBUS``) when the file is cut short or changed under
the reader, one anonymous mapping per tensor only once that tensor is read, and items that
unpickle without fsspec.

Every file is made by this project's writer in the test's own ``tmp_path``; nothing is shared
between tests.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import hurray_schema as hs
from hurray_schema.errors import ShortRead, SourceChanged, SourceError, SourceUnavailable
from hurray_schema.io import source as sources
from hurray_schema.io.file import item_array

MAPS = Path("/proc/self/maps")
needs_proc = pytest.mark.skipif(not MAPS.exists(), reason="/proc/self/maps is Linux's")

BIG = np.arange(256 * 1024, dtype=np.float32).reshape(512, 512)  # 1 MiB: its data is not read at open


def arrays() -> dict[str, object]:
    """A dense tensor, a 2 x 2 partition, an empty tensor, and a large tensor first."""
    grid = np.arange(48, dtype=np.int32).reshape(6, 8)
    return {
        "big": BIG,
        "dense": np.linspace(-1, 1, 24, dtype=np.float64).reshape(4, 6),
        "grid": hs.partition(grid, grid=(2, 2)),
        "empty": np.zeros((0, 5), dtype=np.int16),
    }


EXPECTED = {
    "big": BIG,
    "dense": np.linspace(-1, 1, 24, dtype=np.float64).reshape(4, 6),
    "grid": np.arange(48, dtype=np.int32).reshape(6, 8),
    "empty": np.zeros((0, 5), dtype=np.int16),
}


def written(tmp_path: Path) -> Path:
    path = tmp_path / "model.hrry"
    hs.save(path, arrays())
    return path


def mapped_lines() -> list[str]:
    return MAPS.read_text().splitlines()


# --------------------------------------------------------------------------------------
# The same file as the mapped reader sees it
# --------------------------------------------------------------------------------------


def test_every_item_reads_back_equal_unmapped_and_mapped(tmp_path):
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as unmapped, hs.read_file(path) as mapped:
        assert list(unmapped.keys()) == list(mapped.keys()) == list(EXPECTED)
        for name, want in EXPECTED.items():
            got = np.asarray(unmapped.get_item(name))
            assert got.dtype == want.dtype and got.shape == want.shape
            assert_array_equal(got, want)
            assert_array_equal(np.asarray(mapped.get_item(name)), want)
        assert_array_equal(unmapped.get_item("grid")[1:5, 2:7], EXPECTED["grid"][1:5, 2:7])
        assert_array_equal(unmapped.get_item("big")[::97, 3], BIG[::97, 3])
        assert [e.name for e in unmapped.entries()] == [e.name for e in mapped.entries()]
        for entry in unmapped.entries():
            assert unmapped.descriptor(entry.name) == mapped.descriptor(entry.name)
        assert unmapped.metadata() == mapped.metadata()
        assert unmapped.requests > 0 and mapped.requests == 0


def test_a_local_path_read_unmapped_is_its_own_source(tmp_path):
    path = written(tmp_path)
    with hs.HurrayFile(path, mmap=False) as f:
        assert f.path == os.fspath(path)
        assert f.source == sources.SourceRef(os.path.abspath(path), path.stat().st_size)
        assert isinstance(f._reader.source, sources.LocalFileSource)


def test_mmap_false_with_a_url_reads_it_as_before(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://{tmp_path.name}/model.hrry"
    fs = fsspec.filesystem("memory")
    fs.pipe(url, written(tmp_path).read_bytes())
    try:
        with hs.read_file(url, mmap=False) as f, hs.read_file(url) as g:
            assert type(f._reader.source) is type(g._reader.source) is sources.FsspecSource
            for name, want in EXPECTED.items():
                assert_array_equal(np.asarray(f.get_item(name)), want)
    finally:
        fs.rm(url)


def test_fileno_and_buffer_ranges_agree_with_the_mapped_open(tmp_path):
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as unmapped, hs.read_file(path) as mapped:
        fd, mapped_fd = unmapped.fileno(), mapped.fileno()
        here, there = os.fstat(fd), os.fstat(mapped_fd)
        assert (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
        for entry in unmapped.entries():
            if unmapped.descriptor(entry.name).buffers:
                assert unmapped.buffer_ranges(entry.name) == mapped.buffer_ranges(entry.name)
        (offset, size), = unmapped.buffer_ranges("big")
        assert os.pread(fd, size, offset) == BIG.tobytes()
        (offset, size), = unmapped.buffer_ranges("dense")
        assert os.pread(fd, size, offset) == EXPECTED["dense"].tobytes()
    with pytest.raises(hs.HurraySchemaError):  # ClosedFileError
        unmapped.fileno()
    link = Path(f"/proc/self/fd/{fd}")
    if Path("/proc/self/fd").exists():  # the descriptor was closed (or is now another file's)
        assert not link.exists() or os.readlink(link) != os.path.realpath(path)


@needs_proc
def test_no_mapping_names_the_file_after_an_unmapped_open_and_read(tmp_path):
    path = written(tmp_path)
    real = os.path.realpath(path)
    with hs.read_file(path, mmap=False) as f:
        values = {name: np.asarray(f.get_item(name)) for name in f}
        assert not [line for line in mapped_lines() if line.endswith(real)]
    assert_array_equal(values["big"], BIG)
    with hs.read_file(path) as f:  # the check sees a mapping when there is one
        assert [line for line in mapped_lines() if line.endswith(real)]


# --------------------------------------------------------------------------------------
# A file cut short or changed: a typed error
# --------------------------------------------------------------------------------------


def test_a_file_truncated_inside_a_tensor_after_open_raises_a_typed_error(tmp_path):
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as f:
        (offset, size), = f.buffer_ranges("big")
        assert_array_equal(np.asarray(f.get_item("dense")), EXPECTED["dense"])  # small: fetched at open
        os.truncate(path, offset + size // 2)
        with pytest.raises(hs.HurraySchemaError) as raised:
            np.asarray(f.get_item("big"))
        assert isinstance(raised.value, (ShortRead, SourceChanged))
        with pytest.raises((ShortRead, SourceChanged)):
            f.get_item("big")[300]  # a row past the cut (not in the tail read at open)


def test_a_file_changed_in_place_after_open_raises_source_changed(tmp_path):
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as f:
        (offset, _), = f.buffer_ranges("big")
        with open(path, "r+b") as out:
            out.seek(offset)
            out.write(b"\xff" * 4)
        status = path.stat()
        os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))  # a coarse clock too
        with pytest.raises(SourceChanged):
            np.asarray(f.get_item("big"))


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("cut", ["first descriptor", "index", "trailer"])
def test_a_file_truncated_in_its_descriptors_or_index_fails_at_open(tmp_path, cut, mmap):
    path = written(tmp_path)
    with hs.read_file(path) as f:
        entries = {e.name: e for e in f.entries()}
        index_at = f.trailer["index_offset"]
    size = path.stat().st_size
    at = {"first descriptor": entries["big"].descriptor_offset + 10, "index": index_at + 12,
          "trailer": size - 7}[cut]
    os.truncate(path, at)
    with pytest.raises(hs.HurraySchemaError):
        hs.read_file(path, mmap=mmap)


def test_a_range_past_the_end_of_the_file_is_a_short_read(tmp_path):
    path = tmp_path / "bytes.bin"
    path.write_bytes(bytes(range(100)))
    source = sources.LocalFileSource(path)
    try:
        assert source.fetch([(10, 20), (0, 3)]) == [bytes(range(10, 20)), bytes(range(3))]
        assert source.requests == 2
        with pytest.raises(ShortRead):
            source.fetch([(90, 110)])
    finally:
        source.close()
    source.close()  # again: nothing
    with pytest.raises(SourceUnavailable):
        source.fetch([(0, 1)])


def test_a_source_opened_again_with_another_size_is_refused(tmp_path):
    path = tmp_path / "bytes.bin"
    path.write_bytes(bytes(10))
    with pytest.raises(SourceChanged):
        sources.LocalFileSource(path, size=11)
    with pytest.raises(IsADirectoryError):
        sources.LocalFileSource(tmp_path)


def test_an_item_read_after_close_raises_a_typed_error_not_another_files_bytes(tmp_path):
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as f:
        big = f["big"]
    with pytest.raises(SourceError):
        big.to_numpy()


# --------------------------------------------------------------------------------------
# Many tensors: no mapping per tensor
# --------------------------------------------------------------------------------------


@needs_proc
def test_opening_many_tensors_by_range_makes_no_mapping_per_tensor(tmp_path):
    count = 20_000
    path = tmp_path / "many.hrry"
    hs.save(path, {f"t{i:05d}": np.full(1, i, np.int32) for i in range(count)})
    before = len(mapped_lines())
    with hs.read_file(path, mmap=False) as f:
        names = list(f.keys())
        assert len(names) == count
        for i in (0, 1, 2, count // 2, count - 2, count - 1):
            assert_array_equal(np.asarray(f.get_item(names[i])), np.full(1, i, np.int32))
        grown = len(mapped_lines()) - before
    assert grown < count // 20, f"{grown} new mappings for {count} tensors"


# --------------------------------------------------------------------------------------
# Pickling without fsspec
# --------------------------------------------------------------------------------------


def test_items_read_unmapped_unpickle_without_fsspec(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # any import of fsspec now fails
    path = written(tmp_path)
    with hs.read_file(path, mmap=False) as f:
        blobs = {name: pickle.dumps(f[name]) for name in EXPECTED}
        for name, want in EXPECTED.items():  # in the process that opened it: its reader
            assert_array_equal(item_array(pickle.loads(blobs[name])), want)
        ref = f.source
    try:  # the file closed: the items open it again by its path
        for name, want in EXPECTED.items():
            assert_array_equal(item_array(pickle.loads(blobs[name])), want)
        assert isinstance(sources.reader_for(ref).source, sources.LocalFileSource)
    finally:
        reader = sources.reader_for(ref)
        sources.unregister(reader)
        reader.source.close()
