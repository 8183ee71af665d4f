"""Hostile containers: random byte edits and cuts of a clean file or stream raise only
``HurraySchemaError`` subclasses (never another exception, never a hang)."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_schema.errors import HurraySchemaError
from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file, write_stream


def _items():
    a = Tensor.dense(0x03, [2, 2], struct.pack("<4f", 1, 2, 3, 4))
    b = Tensor.dense(0x10, [3], b"\x01\x02\x03")
    g = Composite.build("group", [Tensor.dense(0x03, [1], bytes(4)), Tensor.dense(0x03, [0])], shape=[1],
                        type_tag=0x03)
    return {"a": a, "b": b, "g": g}


@pytest.fixture(scope="module")
def clean_file(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fz") / "c.hrry"
    write_file(path, _items(), metadata={"k": "v", "n": [1, 2]})
    return path.read_bytes()


CLEAN_STREAMS = {f: write_stream(None, list(_items().values()), framing=f, max_frame_bytes=5)
                 for f in ("bare", "messages")}

edits = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)


def _mutate(raw: bytes, changes, cut) -> bytes:
    data = bytearray(raw)
    for pos, value in changes:
        data[pos % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=edits, cut=st.one_of(st.none(), st.integers(0, 1 << 20)), mode=st.sampled_from(["strict", "permissive"]))
def test_mutated_files_fail_cleanly(tmp_path, clean_file, changes, cut, mode):
    path = tmp_path / "m.hrry"
    path.write_bytes(_mutate(clean_file, changes, cut))
    try:
        with read_file(path, mode=mode) as f:
            for name in f:
                item = f[name]
                assert isinstance(item, (Tensor, Composite))
    except HurraySchemaError:
        pass


@settings(max_examples=150, deadline=None)
@given(changes=edits, cut=st.one_of(st.none(), st.integers(0, 1 << 20)), framing=st.sampled_from(["bare", "messages"]),
       mode=st.sampled_from(["strict", "permissive"]), as_file=st.booleans())
def test_mutated_streams_fail_cleanly(changes, cut, framing, mode, as_file):
    data = _mutate(CLEAN_STREAMS[framing], changes, cut)
    try:
        for item in read_stream(io.BytesIO(data) if as_file else data, framing=framing, mode=mode):
            assert isinstance(item, (Tensor, Composite))
    except HurraySchemaError:
        pass
