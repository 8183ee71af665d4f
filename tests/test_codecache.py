"""Generated code kept between processes (``hurray_schema/codecache.py``): a later process loads
what an earlier one compiled, only from folders this user alone can write; anything else is
compiled in memory with one warning, and the results never change."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import pytest

from hurray_schema import codecache
from support.caches import PLANTED, shared_root_with_planted

# decodes and encodes descriptors of two headers (each header compiled on its second sighting),
# counting the compilations of generated code, in a fresh process
CHILD = r'''
import builtins, json, sys
compiled = []
real = builtins.compile
def counting(source, filename, *args, **kwargs):
    if str(filename).startswith("<hurray_schema"):
        compiled.append(str(filename))
    return real(source, filename, *args, **kwargs)
builtins.compile = counting
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import hurray_schema as hs
    from hurray_schema.model import BufferHandle, ElementType, TensorDescriptor
    out = []
    for shape in ((3, 4), (2, 2, 2)):
        desc = TensorDescriptor(ElementType.FLOAT32, shape, buffers=(BufferHandle(4 * 8 * 3),))
        for _ in range(3):
            wire = hs.encode_descriptor(desc)
            out.append(repr(hs.decode_descriptor(wire)))
print(json.dumps({"compiled": compiled, "out": out, "warnings": [str(w.message) for w in caught]}))
'''


def _child(root, **env) -> dict:
    environment = dict(os.environ, HURRAY_SCHEMA_CACHE_DIR=str(root), **env)
    done = subprocess.run([sys.executable, "-c", CHILD], env=environment, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _files(root) -> list:
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names]


def test_a_later_process_loads_what_an_earlier_one_compiled(tmp_path):
    first = _child(tmp_path)
    assert first["compiled"]  # the signatures, encoders, constructors and the plain-buffer test
    assert not first["warnings"]
    second = _child(tmp_path)
    assert second["compiled"] == []
    assert second["out"] == first["out"]
    for path in _files(tmp_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for folder, _, _ in os.walk(tmp_path / "code"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_the_cache_can_be_turned_off(tmp_path):
    off = _child(tmp_path, HURRAY_SCHEMA_CODE_CACHE="0")
    assert off["compiled"] and not _files(tmp_path)
    assert _child(tmp_path, HURRAY_SCHEMA_CODE_CACHE="0")["compiled"] == off["compiled"]


def test_a_shared_root_holds_a_private_folder_of_ours(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # as a NUMBA_CACHE_DIR=/some/shared/dir would be
    first = _child(shared)
    assert not first["warnings"]
    assert stat.S_IMODE(os.stat(shared / "code").st_mode) == 0o700
    second = _child(shared)
    assert second["compiled"] == [] and second["out"] == first["out"]


@pytest.mark.parametrize("planted", PLANTED)
def test_a_planted_code_folder_is_neither_read_nor_written(tmp_path, planted):
    shared, trap = shared_root_with_planted(tmp_path, "code", planted)
    reference = _child(tmp_path / "private")
    first = _child(shared)
    assert first["out"] == reference["out"]
    assert len(first["warnings"]) == 1 and "not cached" in first["warnings"][0]
    assert not _files(trap)
    assert _child(shared)["compiled"] == first["compiled"]  # compiled in memory again


def test_a_file_that_is_not_what_was_stored_is_compiled_again_and_replaced(tmp_path):
    first = _child(tmp_path)
    paths = _files(tmp_path)
    assert len(paths) >= 2
    with open(paths[0], "r+b") as f:
        f.truncate(len(f.read()) // 2)  # cut inside the marshaled code
    with open(paths[1], "wb") as f, open(paths[-1], "rb") as other:
        f.write(other.read())  # another source's code under this name
    spoiled = _child(tmp_path)
    assert spoiled["out"] == first["out"]
    assert len(spoiled["compiled"]) == 2
    assert _child(tmp_path)["compiled"] == []


def test_a_file_others_can_write_is_not_loaded(tmp_path):
    first = _child(tmp_path)
    for path in _files(tmp_path):
        os.chmod(path, 0o666)
    again = _child(tmp_path)
    assert sorted(again["compiled"]) == sorted(first["compiled"]) and again["out"] == first["out"]


@pytest.fixture
def cache_in(tmp_path, monkeypatch):
    """This process's cache pointed at a fresh folder (and back afterwards)."""
    monkeypatch.setenv("HURRAY_SCHEMA_CACHE_DIR", str(tmp_path))
    codecache.forget()
    yield tmp_path
    codecache.forget()


def test_at_most_max_files_are_written(cache_in, monkeypatch):
    monkeypatch.setattr(codecache, "MAX_FILES", 2)
    for i in range(5):
        code = codecache.compiled(f"x = {i}\n", "<hurray_schema test>")
        namespace: dict = {}
        exec(code, namespace)
        assert namespace["x"] == i
    assert len(_files(cache_in)) == 2
    codecache.forget()  # the next process finds the folder full: it empties it, then writes again
    codecache.compiled("x = 'next'\n", "<hurray_schema test>")
    assert len(_files(cache_in)) == 1


def test_other_version_folders_are_removed_when_a_new_one_is_made(cache_in):
    old = cache_in / "code" / "cpython-00-0000-m0"
    old.mkdir(parents=True, mode=0o700)
    (cache_in / "code").chmod(0o700)
    (old / "stale").write_bytes(b"old code")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codecache.compiled("y = 1\n", "<hurray_schema test>")
    assert not old.exists()
    assert [p.name for p in (cache_in / "code").iterdir()] == [codecache._version()]


def test_a_cache_root_that_cannot_be_made_turns_the_cache_off_quietly(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    first = _child(blocker / "cache")  # a folder inside a file cannot be made (as on a read-only home)
    assert first["compiled"] and not first["warnings"]
    assert _child(blocker / "cache")["compiled"] == first["compiled"]
