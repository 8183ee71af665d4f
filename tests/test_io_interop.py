"""Streams and files exchanged with the reference implementation (``pyhurray``).

Both directions: what pyhurray writes (``save``, ``StreamWriter``, ``write_composite``)
reads here with the same descriptor bytes, buffer bytes and names; what we write loads
in pyhurray with the same.  Expected values come from pyhurray objects or literals.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

hurray = pytest.importorskip("hurray")

from hurray_schema.codec import decode_descriptor  # noqa: E402
from hurray_schema.io import Composite, Tensor, UInt64, read_file, read_stream, write_file, write_stream  # noqa: E402

f32 = hurray.float32
DT = hurray.dtype
ALL_DTYPES = list(DT.__all__)


def _pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 37 + seed) % 251 for i in range(n))


def py_buffers(t) -> list[bytes]:
    return [np.asarray(t.buffer(i)).tobytes() for i in range(t.buffer_count)]


def from_py(t, name=None):
    """A pyhurray Tensor/Composite as ours, built from its encoded descriptor and buffers."""
    if isinstance(t, hurray.Composite):
        head = decode_descriptor(t.descriptor.encode())
        return Composite(head, [from_py(m) for m in t.members], name=name)
    return Tensor(decode_descriptor(t.descriptor.encode()), py_buffers(t), name=name)


def assert_same(ours, py, name=None) -> None:
    """Ours and pyhurray's agree on descriptor bytes, buffer bytes and structure."""
    if isinstance(py, hurray.Composite):
        assert isinstance(ours, Composite)
        assert bytes(_enc(ours)) == py.descriptor.encode()
        assert len(ours.members) == len(py.members)
        for i, (a, b) in enumerate(zip(ours.members, py.members)):
            assert_same(a, b, None if name is None else f"{name}.{i}")
    else:
        assert isinstance(ours, Tensor)
        assert _enc(ours) == py.descriptor.encode()
        assert [bytes(b) for b in ours.buffers] == py_buffers(py)
    if name is not None:
        assert ours.name == name


def _enc(item) -> bytes:
    from hurray_schema.codec import encode_descriptor

    return encode_descriptor(item.descriptor)


# --------------------------------------------------------------------------------------
# Items built with pyhurray
# --------------------------------------------------------------------------------------


def dtype_tensors() -> dict:
    out = {}
    for i, n in enumerate(ALL_DTYPES):
        dt = getattr(DT, n)
        out[f"t_{n}"] = hurray.Tensor(_pattern(hurray.buffer_size_bytes(dt, 12), i), dt, [3, 4])
    return out


def composites() -> dict:
    a = hurray.Tensor(_pattern(128, 1), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(_pattern(128, 2), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    part = hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b])
    base = hurray.Tensor(_pattern(64, 3), f32, [4, 4], shard=hurray.Shard([4, 4], [0, 0]))
    corr = hurray.Tensor(struct.pack("<2f", 9, 9), f32, [1, 2], shard=hurray.Shard([4, 4], [2, 1]))
    over = hurray.Composite("overlay", shape=[4, 4], dtype=f32, members=[base, corr], combine_op="add")
    group = hurray.Composite("group", shape=[3], dtype=f32, members=[
        hurray.Tensor(_pattern(12, 4), f32, [3]), hurray.Tensor(_pattern(5, 5), hurray.int8, [5])])
    nested = hurray.Composite("group", shape=[4], dtype=f32, members=[
        hurray.Composite("group", shape=[4], dtype=f32, members=[hurray.Tensor(_pattern(16, 6), f32, [4])]),
        hurray.Tensor(_pattern(16, 7), f32, [4])])
    return {"part": part, "over": over, "group": group, "nested": nested}


def specials() -> dict:
    csr = hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [3, 3],
                        aux_buffers=[struct.pack("<3Q", 0, 1, 2), struct.pack("<4Q", 0, 1, 2, 3)],
                        layout=hurray.CsrLayout(nnz=3))
    return {
        "empty": hurray.Tensor(b"", f32, [0, 4]),
        "empty_i8": hurray.Tensor(b"", hurray.int8, [5, 0]),
        "scalar": hurray.Tensor(struct.pack("<d", 2.5), hurray.float64, []),
        "csr": csr,
    }


KV = {"s": "héllo", "i": -5, "big": 2 ** 62, "f": 1.5, "b": True, "no": False, "by": b"\x00\x01",
      "ls": ["a", "b"], "li": [1, -2, 3], "lf": [1.0, 2.5], "lb": [True, False], "lby": [b"x", b"yz"]}


def canonical(items: dict) -> dict:
    """The items as pyhurray reads them back from its own stream: overlay members then
    carry the Composite Member section that authored members lack."""
    with hurray.StreamWriter() as w:
        for t in items.values():
            w.write(t)
    return dict(zip(items, hurray.StreamReader(w.getvalue())))


def all_items() -> dict:
    return canonical({**dtype_tensors(), **composites(), **specials()})


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------


def test_pyhurray_file_reads_here(tmp_path):
    items = all_items()
    path = str(tmp_path / "py.hrry")
    hurray.save(path, items, kv=KV)
    with read_file(path) as f:
        assert list(f) == list(items)
        for name, py in items.items():
            assert_same(f[name], py, name)
        assert f.kv == KV
        names = [e.name for e in f.entries()]
        assert "part.0" in names and "nested.0.0" in names and "part.0" not in f


def test_our_file_loads_in_pyhurray(tmp_path):
    items = all_items()
    ours = {name: from_py(t) for name, t in items.items()}
    path = str(tmp_path / "ours.hrry")
    write_file(path, ours, metadata=KV)
    loaded = hurray.load(path)
    assert list(loaded) == list(items)
    for name, py in items.items():
        assert_same(ours[name], loaded[name])
        if isinstance(py, hurray.Composite):
            assert loaded[name] == py
    assert hurray.load_kv(path) == KV
    # and back again, byte for byte through our reader
    with read_file(path) as f:
        for name in items:
            assert f[name].same_content(ours[name])


def test_uint64_kv_reads_in_pyhurray(tmp_path):
    path = str(tmp_path / "u.hrry")
    write_file(path, {"x": Tensor.dense(0x11, [1], b"\x07")}, metadata={"u": UInt64(5), "huge": 2 ** 64 - 1,
                                                                            "lu": [UInt64(1), UInt64(2 ** 63)]})
    assert hurray.load_kv(path) == {"u": 5, "huge": 2 ** 64 - 1, "lu": [1, 2 ** 63]}
    with read_file(path) as f:
        assert isinstance(f.kv["u"], UInt64) and f.kv["huge"] == 2 ** 64 - 1


def test_sorted_index_file_loads_in_pyhurray(tmp_path):
    items = canonical(composites())
    path = str(tmp_path / "sorted.hrry")
    write_file(path, {n: from_py(t) for n, t in items.items()}, sorted_index=True)
    loaded = hurray.load(path)
    for name, py in items.items():
        assert loaded[name] == py
    with read_file(path) as f:
        names = [e.name for e in f.entries()]
        assert names == sorted(names, key=lambda s: s.encode())
        assert f["nested"].members[0].members[0].name == "nested.0.0"


def test_reference_pads_composite_heads_divergence(tmp_path):
    """Divergence: pyhurray pads a head to data_buffer_alignment before its first member;
    file-format.md § Composite Tensors forbids it.  We read its files anyway and write
    the unpadded layout, which pyhurray also reads."""
    part = canonical(composites())["part"]
    py_path, our_path = str(tmp_path / "py.hrry"), str(tmp_path / "ours.hrry")
    hurray.save(py_path, {"p": part})
    with read_file(py_path) as f:
        head, first = f.entries()[0], f.entries()[1]
        assert head.name == "p" and first.descriptor_offset == 4096  # padded by the reference
        assert_same(f["p"], part, "p")
    write_file(our_path, {"p": from_py(part)})
    with read_file(our_path) as f:
        head, first = f.entries()[0], f.entries()[1]
        assert first.descriptor_offset == 64 + 56  # 53-byte head, next 8-aligned offset
    assert hurray.load(our_path)["p"] == part
    # with the opt-in padding we reproduce the reference's bytes exactly
    write_file(str(tmp_path / "padded.hrry"), {"p": from_py(part)}, pad_after_composite_head=True)
    raw_ref = open(py_path, "rb").read()
    raw_pad = open(tmp_path / "padded.hrry", "rb").read()
    # header differs only in tensor_count_hint (the reference writes "unknown")
    assert raw_ref[:28] == raw_pad[:28] and raw_ref[36:] == raw_pad[36:]


def test_conformance_basic_file(conformance_dir, manifest):
    (spec,) = [f for f in manifest["files"] if f["file"] == "files/basic.hrry"]
    with read_file(conformance_dir / spec["file"]) as f:
        assert list(f) == [t["name"] for t in spec["tensors"]]
        for t in spec["tensors"]:
            item = f[t["name"]]
            assert int(item.type_tag) == t["element_type_tag"]
            assert list(item.shape) == t["shape"]
            assert item.stored_nbytes == t["data_bytes"]
        expected = {k["key"]: (k["value_string"] if k["kind"] == "string" else k["value_int"]) for k in spec["kv"]}
        assert f.kv == expected
        assert [x.rule_id for x in f.findings] == ["file.kv.flag"]  # the vector also leaves HAS_KV_METADATA clear


# --------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------


def test_pyhurray_stream_reads_here(tmp_path):
    items = all_items()
    with hurray.StreamWriter() as w:
        for t in items.values():
            if isinstance(t, hurray.Composite):
                w.write_composite(t)
            else:
                w.write(t)
    data = w.getvalue()
    got = list(read_stream(data))
    assert len(got) == len(items)
    for ours, (name, py) in zip(got, items.items()):
        assert_same(ours, py)
    # same from a path and from a file object
    p = tmp_path / "s.bin"
    p.write_bytes(data)
    assert all(a.same_content(b) for a, b in zip(read_stream(p), got))
    with open(p, "rb") as fh:
        assert all(a.same_content(b) for a, b in zip(read_stream(fh), got))


def test_our_stream_reads_in_pyhurray():
    items = all_items()
    ours = [from_py(t) for t in items.values()]
    data = write_stream(None, ours)
    back = list(hurray.StreamReader(data))
    assert len(back) == len(items)
    for o, b, py in zip(ours, back, items.values()):
        assert_same(o, b)
        if isinstance(py, hurray.Composite):
            assert b == py


def test_overlay_member_sections_match_reference():
    """pyhurray adds the Composite Member section to overlay members when streaming;
    Composite.build does the same, and the streams are byte-identical."""
    over = composites()["over"]
    with hurray.StreamWriter() as w:
        w.write_composite(over)
    base, corr = (from_py(m) for m in over.members)
    base = Tensor(base.descriptor.__class__(**{**_fields(base.descriptor), "composite_member": None}), base.buffers)
    ours = Composite.build("overlay", [base, corr], shape=[4, 4], type_tag=0x03, combine_op="add")
    assert write_stream(None, [ours]) == w.getvalue()


def _fields(desc) -> dict:
    import attrs

    return {a.alias: getattr(desc, a.name) for a in attrs.fields(type(desc))}


def test_message_framing_round_trip_of_reference_items():
    items = all_items()
    ours = [from_py(t) for t in items.values()]
    data = write_stream(None, ours, framing="messages", max_frame_bytes=7)
    got = list(read_stream(data, framing="messages"))
    assert all(a.same_content(b) for a, b in zip(got, ours)) and len(got) == len(ours)
    # the bare stream of what we read equals what pyhurray writes
    with hurray.StreamWriter() as w:
        for t in items.values():
            w.write(t)
    assert write_stream(None, got) == w.getvalue()


def test_file_path_object_and_str(tmp_path):
    t = hurray.Tensor(_pattern(16), f32, [4])
    write_file(tmp_path / "a.hrry", {"t": from_py(t)})
    assert os.path.getsize(tmp_path / "a.hrry") > 0
    assert from_py(hurray.load(str(tmp_path / "a.hrry"))["t"]).same_content(from_py(t))
