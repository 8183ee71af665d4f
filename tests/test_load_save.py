"""``hs.save`` / ``hs.load`` and the safetensors-style lazy access of ``read_file``.

* Round trips of arrays of every dtype NumPy and ``ml_dtypes`` hold that has a Hurray
  element type (bit for bit, NaN payloads included), of tensors and of the composites the
  producers build; the expected arrays are the inputs or are computed with NumPy.
* Metadata goes to the KV section (read back here and by pyhurray's ``load_kv``).
* Interop both ways: ``hs.load`` of a ``hurray.save`` file equals ``hurray.load`` for every
  tensor (pyhurray's arrays, or its buffers decoded with NumPy where pyhurray has no
  NumPy view); a file ``hs.save`` wrote loads in pyhurray with the same values.
* A closed ``HurrayFile`` raises ``ClosedFileError`` (a ``ValueError``) on every access.
"""

from __future__ import annotations

import os
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.io import ClosedFileError, Composite, HurrayFile, Tensor, read_file, write_file
from hurray_schema.model import Shard

hurray = pytest.importorskip("hurray")

WHOLE_BYTE_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                     np.uint32, np.int64, np.uint64, np.complex64, np.complex128, ml_dtypes.bfloat16,
                     ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu]
SUB_BYTE_BITS = {ml_dtypes.int4: 4, ml_dtypes.uint4: 4, ml_dtypes.int2: 2, ml_dtypes.uint2: 2,
                 ml_dtypes.float4_e2m1fn: 4, ml_dtypes.float6_e2m3fn: 6, ml_dtypes.float6_e3m2fn: 6}
ALL_DTYPES = WHOLE_BYTE_DTYPES + [np.bool_] + list(SUB_BYTE_BITS)


def _name(dtype) -> str:
    return np.dtype(dtype).name


def random_array(dtype, shape, seed: int) -> np.ndarray:
    """Random bit patterns of ``dtype`` (any code of a sub-byte type; NaNs and infinities included)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(bool).reshape(shape)
    if dtype.type in SUB_BYTE_BITS:
        bits = SUB_BYTE_BITS[dtype.type]
        return rng.integers(0, 1 << bits, count, dtype=np.uint8).view(dtype).reshape(shape)
    return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).reshape(shape).copy()


def codes(array: np.ndarray) -> np.ndarray:
    """The stored bit pattern of each element (one uint8 row per element), to compare bit for bit."""
    array = array.copy(order="C")
    bits = SUB_BYTE_BITS.get(array.dtype.type)
    raw = array.reshape(-1).view(np.uint8).reshape(array.size, -1) if array.size else np.zeros((0, 1), np.uint8)
    return raw & ((1 << bits) - 1) if bits is not None else raw


def assert_bits_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert np.array_equal(codes(actual), codes(expected))


# --------------------------------------------------------------------------------------
# save / load round trips
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_name)
def test_from_numpy_takes_every_numpy_and_ml_dtype(dtype):
    """``Tensor.from_numpy`` packs bool and the sub-byte types (what the writers call for an array)."""
    for i, shape in enumerate([(3, 5), (7,), (), (0, 4), (2, 3, 5)]):
        array = random_array(dtype, shape, i)
        tensor = Tensor.from_numpy(array)
        assert tensor.shape == array.shape
        assert_bits_equal(tensor.to_numpy(), array)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_name)
def test_every_numpy_and_ml_dtype_round_trips_bit_for_bit(tmp_path, dtype):
    arrays = {f"s{i}": random_array(dtype, shape, i) for i, shape in
              enumerate([(3, 5), (7,), (), (0, 4), (2, 3, 5)])}
    hs.save(tmp_path / "a.hrry", arrays)
    loaded = hs.load(tmp_path / "a.hrry")
    assert list(loaded) == list(arrays)
    for name, array in arrays.items():
        assert_bits_equal(loaded[name], array)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(ALL_DTYPES), shape=st.lists(st.integers(0, 9), max_size=3),
       seed=st.integers(0, 2 ** 32 - 1), fortran=st.booleans())
def test_random_arrays_round_trip(tmp_path_factory, dtype, shape, seed, fortran):
    array = random_array(dtype, tuple(shape), seed)
    if fortran:
        array = np.asfortranarray(array)  # stored row-major, same values
    path = tmp_path_factory.mktemp("rt") / "a.hrry"
    hs.save(path, {"x": array})
    assert_bits_equal(hs.load(path)["x"], array.copy(order="C"))


def test_big_endian_arrays_are_stored_little_endian(tmp_path):
    array = np.arange(6, dtype=">i4").reshape(2, 3)
    hs.save(tmp_path / "b.hrry", {"x": array})
    loaded = hs.load(tmp_path / "b.hrry")["x"]
    assert loaded.dtype == np.dtype("<i4") and np.array_equal(loaded, [[0, 1, 2], [3, 4, 5]])


def test_loaded_arrays_own_their_memory(tmp_path):
    hs.save(tmp_path / "o.hrry", {"x": np.arange(8, dtype=np.float32)})
    loaded = hs.load(tmp_path / "o.hrry")["x"]
    loaded[0] = 42  # writeable, and the file is not changed by it
    assert np.array_equal(hs.load(tmp_path / "o.hrry")["x"], np.arange(8, dtype=np.float32))
    os.remove(tmp_path / "o.hrry")  # nothing holds the file open
    assert loaded[0] == 42


def test_tensors_and_composites_round_trip(tmp_path):
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((8, 12)).astype(np.float32)
    base = rng.standard_normal((6, 6)).astype(np.float32)
    patch = np.full((2, 3), 5.0, np.float32)
    indices = np.array([[0, 1], [2, 3], [4, 0]])
    values = np.array([1.5, -2.0, 3.25], np.float32)
    items = {
        "dense": Tensor.from_numpy(weight),
        "part": hs.partition(weight, grid=(2, 3)),
        "over": hs.overlay(base, [(patch, (1, 2))], "replace"),
        "sum": hs.overlay(base, [(patch, (3, 0))], "add"),
        "coo": hs.sparse_coo(indices, values, (5, 4)),
    }
    hs.save(tmp_path / "c.hrry", items)
    loaded = hs.load(tmp_path / "c.hrry")
    replaced = base.copy()
    replaced[1:3, 2:5] = 5.0
    added = base.copy()
    added[3:5, 0:3] += np.float32(5.0)
    sparse = np.zeros((5, 4), np.float32)
    sparse[indices[:, 0], indices[:, 1]] = values
    assert list(loaded) == list(items)
    assert_bits_equal(loaded["dense"], weight)
    assert_bits_equal(loaded["part"], weight)
    assert_bits_equal(loaded["over"], replaced)
    assert_bits_equal(loaded["sum"], added)
    assert_bits_equal(loaded["coo"], sparse)


def test_quantized_and_spqr_items_read_back_as_they_were_written(tmp_path):
    """A quantized tensor and an SpQR overlay: what load gives equals what the items decode
    to before saving, is within half a step of the input, and the replaced outliers are exact."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((16, 128)).astype(np.float16)
    weight[2, 5] = 40.0  # an outlier
    quantized = hs.quantize(weight, "per_channel", storage="int8", axis=0)
    spqr = hs.spqr(weight, bits=4, block_size=64, outliers=0.01)
    before = {"q": quantized.to_numpy(), "w": spqr.materialize()}
    hs.save(tmp_path / "q.hrry", {"q": quantized, "w": spqr})
    loaded = hs.load(tmp_path / "q.hrry")
    assert list(loaded) == ["q", "w"]  # members do not appear on their own
    for name in before:
        assert_bits_equal(loaded[name], before[name])
    step = np.abs(weight.astype(np.float32)).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(loaded["q"].astype(np.float32) - weight) <= step / 2 + 1e-3)
    assert loaded["w"][2, 5] == weight[2, 5]


def test_a_group_contributes_its_members_under_their_names(tmp_path):
    k = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = np.arange(4, dtype=np.int8)
    weight = np.arange(16, dtype=np.float32).reshape(4, 4)
    inner = hs.group([np.ones(2, np.float32)], name=None)
    cache = hs.group({"k": k, "v": v})
    outer = hs.group([hs.partition(weight, grid=2), inner])
    hs.save(tmp_path / "g.hrry", {"cache": cache, "outer": outer, "bias": np.zeros(3, np.float16)})
    loaded = hs.load(tmp_path / "g.hrry")
    assert list(loaded) == ["k", "v", "outer.0", "outer.1.0", "bias"]
    assert_bits_equal(loaded["k"], k)
    assert_bits_equal(loaded["v"], v)
    assert_bits_equal(loaded["outer.0"], weight)
    assert_bits_equal(loaded["outer.1.0"], np.ones(2, np.float32))
    with read_file(tmp_path / "g.hrry") as f:
        assert list(f.keys()) == ["cache", "outer", "bias"]
        with pytest.raises(HurraySchemaError, match="group"):
            np.asarray(f["cache"])
        assert_bits_equal(np.asarray(f.get_item("outer.0")), weight)  # a member, by its name


def test_metadata_round_trips(tmp_path):
    metadata = {"format": "pt", "layers": 12, "lr": 0.5, "quantized": False, "blob": b"\x00\xff",
                "names": ["a", "b"], "sizes": [1, -2, 3]}
    hs.save(tmp_path / "m.hrry", {"x": np.zeros(2, np.float32)}, metadata=metadata)
    with read_file(tmp_path / "m.hrry") as f:
        assert f.metadata() == metadata
        copy = f.metadata()
        copy["extra"] = 1
        assert f.metadata() == metadata  # a copy each time
    assert hurray.load_kv(str(tmp_path / "m.hrry")) == metadata
    hs.save(tmp_path / "n.hrry", {"x": np.zeros(2, np.float32)})
    with read_file(tmp_path / "n.hrry") as f:
        assert f.metadata() == {}


def test_write_file_takes_metadata_and_kv_for_one_release(tmp_path):
    items = {"x": np.zeros(2, np.float32)}
    write_file(tmp_path / "m.hrry", items, metadata={"k": "v"})
    with pytest.warns(DeprecationWarning, match=r"write_file\(kv=\) is now write_file\(metadata=\)"):
        write_file(tmp_path / "o.hrry", items, kv={"k": "v"})
    assert (tmp_path / "o.hrry").read_bytes() == (tmp_path / "m.hrry").read_bytes()
    with pytest.raises(TypeError, match="not both"):
        write_file(tmp_path / "p.hrry", items, metadata={"k": "v"}, kv={"k": "w"})
    assert not (tmp_path / "p.hrry").exists()


def test_save_refuses_what_it_cannot_write_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "k.hrry"
    hs.save(path, {"x": np.ones(3, np.float32)})
    before = path.read_bytes()
    with pytest.raises(HurraySchemaError, match="mapping"):
        hs.save(path, [np.ones(3)])
    with pytest.raises(HurraySchemaError, match="'y'.*list"):
        hs.save(path, {"y": [1, 2, 3]})
    with pytest.raises(HurraySchemaError, match="float128|longdouble|has no Hurray element type"):
        hs.save(path, {"z": np.zeros(2, np.longdouble)})
    gap = Composite.build("partition", [Tensor.from_numpy(np.zeros((4, 3), np.float32), shard=Shard((4, 6), (0, 0))),
                                        Tensor.from_numpy(np.zeros((4, 2), np.float32), shard=Shard((4, 6), (0, 3)))],
                          shape=(4, 6), type_tag=hs.ElementType.FLOAT32)
    with pytest.raises(SpecViolation) as refused:
        hs.save(path, {"gap": gap})
    assert refused.value.rule_id == "composite.close.partition_gap"
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["k.hrry"]


def test_write_file_takes_arrays_as_values(tmp_path):
    array = np.arange(10, dtype=np.uint16).reshape(2, 5)
    write_file(tmp_path / "w.hrry", {"a": array, "t": Tensor.from_numpy(array)})
    with read_file(tmp_path / "w.hrry") as f:
        assert f["a"].same_content(f["t"])
        assert np.array_equal(f["a"].to_numpy(), array)


# --------------------------------------------------------------------------------------
# Lazy access: keys, metadata, get_tensor, get_slice
# --------------------------------------------------------------------------------------


def test_read_file_is_the_lazy_access(tmp_path):
    weight = np.arange(24, dtype=np.float32).reshape(4, 6)
    hs.save(tmp_path / "l.hrry", {"w": weight, "p": hs.partition(weight, grid=(2, 1))}, metadata={"v": "1"})
    with hs.read_file(tmp_path / "l.hrry") as f:
        assert list(f.keys()) == ["w", "p"] and "p.0" not in f.keys()
        assert f.metadata() == {"v": "1"}
        assert_bits_equal(np.asarray(f["w"]), weight)
        assert_bits_equal(np.asarray(f.get_item("p")), weight)
        assert_bits_equal(np.asarray(f.get_item("p.1")), weight[2:])
        with pytest.raises(KeyError):
            f.get_item("nope")
        assert f.get_item("p").shape == (4, 6)


def test_an_item_indexes_like_numpy(tmp_path):
    weight = np.arange(48, dtype=np.float32).reshape(6, 8)
    hs.save(tmp_path / "s.hrry", {"w": weight, "p": hs.partition(weight, grid=(3, 2))})
    with hs.read_file(tmp_path / "s.hrry") as f:
        for name in ("w", "p"):
            item = f.get_item(name)
            assert item.dtype == np.float32
            for index in [(1,), (slice(1, 5, 2), slice(None, None, -3)), (Ellipsis, 2), (-1, None, slice(2, 6))]:
                assert_bits_equal(np.asarray(item[index]), weight[index])


def test_the_deprecated_accessors_still_work_with_a_warning(tmp_path):
    weight = np.arange(24, dtype=np.float32).reshape(4, 6)
    hs.save(tmp_path / "d.hrry", {"w": weight, "p": hs.partition(weight, grid=(2, 1))})
    with hs.read_file(tmp_path / "d.hrry") as f:
        with pytest.warns(DeprecationWarning, match=r"get_tensor\(name\) is now"):
            assert_bits_equal(f.get_tensor("p"), weight)
        with pytest.warns(DeprecationWarning, match=r"get_slice\(name\)\[index\] is now"):
            sliced = f.get_slice("p.1")
        assert sliced.get_shape() == [2, 6] and sliced.get_dtype() == "float32"
        assert_bits_equal(np.asarray(sliced[1, ::2]), weight[3, ::2])
        with pytest.warns(DeprecationWarning, match=r"tensor\(name\) is now .*get_item\(name\)"):
            member = f.tensor("p.0")
        assert member.same_content(f.get_item("p.0"))


# --------------------------------------------------------------------------------------
# Interop with pyhurray
# --------------------------------------------------------------------------------------

PY_WHOLE_BYTE = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3": ml_dtypes.float8_e4m3fn,
                 "float8_e5m2": ml_dtypes.float8_e5m2, "float8_e8m0": ml_dtypes.float8_e8m0fnu}
PY_SUB_BYTE = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int2": ml_dtypes.int2, "uint2": ml_dtypes.uint2,
               "float4_e2m1": ml_dtypes.float4_e2m1fn, "float6_e2m3": ml_dtypes.float6_e2m3fn,
               "float6_e3m2": ml_dtypes.float6_e3m2fn}
NO_ARRAY_HERE = {"float128"}
"""pyhurray's types without a NumPy / ml_dtypes dtype: nothing to compare an array with."""


def unpack_codes(raw: bytes, bits: int, count: int) -> np.ndarray:
    """LSB-first codes of a packed buffer, with NumPy (``element-types.md § Sub-Byte Integer
    Types``; 6-bit: four codes in three bytes, ``§ 6-bit packing``)."""
    data = np.frombuffer(raw, np.uint8)
    if bits == 6:
        words = data[: len(data) // 3 * 3].reshape(-1, 3).astype(np.uint32)
        words = words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16
        out = (words[:, None] >> (6 * np.arange(4, dtype=np.uint32))) & 63
    else:
        out = (data[:, None] >> (bits * np.arange(8 // bits, dtype=np.uint8))) & ((1 << bits) - 1)
    return out.reshape(-1)[:count].astype(np.uint8)


def py_array(t) -> np.ndarray:
    """What a pyhurray tensor holds, as NumPy: its own array where it gives one, else its
    buffer decoded with NumPy."""
    name = str(t.dtype)
    shape = tuple(t.shape)
    count = int(np.prod(shape))
    if isinstance(t.layout, hurray.CsrLayout):
        return t.to_scipy().toarray()
    if isinstance(t.layout, hurray.CooLayout):
        dense = np.zeros(shape, np.asarray(t.values).dtype)
        dense[tuple(np.asarray(t.indices).astype(np.int64).T)] = np.asarray(t.values)
        return dense
    raw = np.asarray(t.buffer(0)).tobytes() if t.buffer_count else b""
    if name == "bool":
        return np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[:count].astype(bool).reshape(shape)
    if name in PY_WHOLE_BYTE:
        return np.frombuffer(raw, PY_WHOLE_BYTE[name]).reshape(shape)
    if name in PY_SUB_BYTE:
        dtype = np.dtype(PY_SUB_BYTE[name])
        return unpack_codes(raw, SUB_BYTE_BITS[dtype.type], count).view(dtype).reshape(shape)
    return np.asarray(t)


def py_merged(c) -> np.ndarray:
    """A pyhurray partition or overlay merged with NumPy (members placed at their shard offsets;
    an overlay's corrections replace or add in order)."""
    first = py_array(c.members[0])
    out = np.zeros(tuple(c.shape), first.dtype)
    for i, member in enumerate(c.members):
        box = tuple(slice(o, o + n) for o, n in zip(member.shard.shard_offset, member.shape))
        if c.layout.composition_rule == "overlay" and i and c.layout.combine_op == "add":
            out[box] += py_array(member)
        else:
            out[box] = py_array(member)
    return out


def py_expected(items: dict) -> dict:
    """``name -> array`` as load gives them, computed from pyhurray's objects."""
    out = {}
    for name, t in items.items():
        if isinstance(t, hurray.Composite) and t.layout.composition_rule == "group":
            out.update(py_expected({f"{name}.{i}": m for i, m in enumerate(t.members)}))
        elif isinstance(t, hurray.Composite):
            out[name] = py_merged(t)
        else:
            out[name] = py_array(t)
    return out


def _f32(values, shape, offset=None, parent=None):
    data = np.asarray(values, np.float32).tobytes()
    shard = None if offset is None else hurray.Shard(list(parent), list(offset))
    return hurray.Tensor(data, hurray.float32, list(shape), shard=shard)


def pyhurray_items() -> dict:
    rng = np.random.default_rng(11)
    items = {}
    for i, name in enumerate(hurray.dtype.__all__):
        if name in NO_ARRAY_HERE:
            continue
        dt = getattr(hurray.dtype, name)
        items[f"t_{name}"] = hurray.Tensor(rng.bytes(hurray.buffer_size_bytes(dt, 15)), dt, [3, 5])
    items["t_float32_nan"] = hurray.Tensor(struct.pack("<3I", 0x7FC00001, 0xFF800000, 0x00000001),
                                           hurray.float32, [3])
    items["empty"] = hurray.Tensor(b"", hurray.float32, [0, 4])
    items["scalar"] = hurray.Tensor(struct.pack("<d", 2.5), hurray.float64, [])
    items["csr"] = hurray.Tensor(struct.pack("<3f", 1, 2, 3), hurray.float32, [3, 3],
                                 aux_buffers=[struct.pack("<3Q", 0, 1, 2), struct.pack("<4Q", 0, 1, 2, 3)],
                                 layout=hurray.CsrLayout(nnz=3))
    items["coo"] = hurray.sparse_coo(np.array([5.0, 7.0], np.float32), np.array([[0, 2], [1, 1]], np.uint64), [2, 3])
    left = rng.standard_normal((4, 3)).astype(np.float32)
    right = rng.standard_normal((4, 3)).astype(np.float32)
    items["part"] = hurray.Composite("partition", shape=[4, 6], dtype=hurray.float32, members=[
        _f32(left, (4, 3), (0, 0), (4, 6)), _f32(right, (4, 3), (0, 3), (4, 6))])
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    for op in ("add", "replace"):
        items[f"over_{op}"] = hurray.Composite("overlay", shape=[4, 4], dtype=hurray.float32, combine_op=op, members=[
            _f32(base, (4, 4), (0, 0), (4, 4)), _f32([[9, 9]], (1, 2), (2, 1), (4, 4))])
    items["grp"] = hurray.Composite("group", shape=[3], dtype=hurray.float32, members=[
        _f32([1, 2, 3], (3,)), hurray.Tensor(bytes(range(5)), hurray.int8, [5])])
    return items


def test_load_of_a_pyhurray_file_equals_pyhurray_load_for_every_tensor(tmp_path):
    path = str(tmp_path / "py.hrry")
    hurray.save(path, pyhurray_items(), kv={"by": "pyhurray"})
    expected = py_expected(hurray.load(path))
    loaded = hs.load(path)
    assert list(loaded) == list(expected)
    for name, array in expected.items():
        assert_bits_equal(loaded[name], array)
    with read_file(path) as f:
        assert f.metadata() == hurray.load_kv(path) == {"by": "pyhurray"}


def test_a_pyhurray_float128_tensor_is_refused_with_a_typed_error(tmp_path):
    path = str(tmp_path / "q.hrry")
    hurray.save(path, {"q": hurray.Tensor(bytes(32), hurray.dtype.float128, [2])})
    with pytest.raises(HurraySchemaError, match="float128"):
        hs.load(path)


def test_a_file_save_wrote_loads_in_pyhurray(tmp_path):
    arrays = {_name(dtype): random_array(dtype, (3, 5), i) for i, dtype in enumerate(ALL_DTYPES)}
    weight = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    patch = np.array([[9, 9]], np.float32)
    composites = {"part": hs.partition(weight, grid=(2, 2)), "over": hs.overlay(base, [(patch, (2, 1))], "add"),
                  "grp": hs.group([np.ones(3, np.float32), np.arange(5, dtype=np.int8)])}
    path = str(tmp_path / "ours.hrry")
    hs.save(path, {**arrays, **composites}, metadata={"by": "hurray_schema", "n": 3})
    loaded = hurray.load(path)
    assert list(loaded) == [*arrays, *composites]
    for name, array in arrays.items():
        assert_bits_equal(py_array(loaded[name]), array)
    added = base.copy()
    added[2:3, 1:3] += patch
    assert_bits_equal(py_merged(loaded["part"]), weight)
    assert_bits_equal(py_merged(loaded["over"]), added)
    assert [py_array(m).tolist() for m in loaded["grp"].members] == [[1.0, 1.0, 1.0], [0, 1, 2, 3, 4]]
    assert hurray.load_kv(path) == {"by": "hurray_schema", "n": 3}


# --------------------------------------------------------------------------------------
# A closed file
# --------------------------------------------------------------------------------------

ACCESSES = {
    "len": len,
    "iter": lambda f: list(f),
    "in": lambda f: "w" in f,
    "getitem": lambda f: f["w"],
    "keys": lambda f: f.keys(),
    "items": lambda f: f.items(),
    "values": lambda f: f.values(),
    "get": lambda f: f.get("w"),
    "entries": lambda f: f.entries(),
    "descriptor": lambda f: f.descriptor("w"),
    "tensor": lambda f: f.tensor("w"),
    "kv": lambda f: f.kv,
    "metadata": lambda f: f.metadata(),
    "get_item": lambda f: f.get_item("w"),
    "get_tensor": lambda f: f.get_tensor("w"),
    "get_slice": lambda f: f.get_slice("w"),
    "data_buffer_alignment": lambda f: f.data_buffer_alignment,
    "file_flags": lambda f: f.file_flags,
    "equality": lambda f: f == {},
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("closed") / "c.hrry"
    hs.save(path, {"w": np.arange(4, dtype=np.float32)}, metadata={"k": 1})
    return path


@pytest.mark.parametrize("access", sorted(ACCESSES))
@pytest.mark.parametrize("opened", ["with", "close", "over"])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # tensor, get_tensor, get_slice
def test_every_access_to_a_closed_file_raises(saved, access, opened):
    if opened == "with":
        with read_file(saved) as f:
            ACCESSES[access](f)  # works while open
    else:
        f = read_file(saved) if opened == "close" else HurrayFile.over(saved.read_bytes())
        ACCESSES[access](f)
        f.close()
    assert f.closed
    with pytest.raises(ClosedFileError, match="closed") as info:
        ACCESSES[access](f)
    assert isinstance(info.value, ValueError) and isinstance(info.value, HurraySchemaError)
    f.close()  # closing again is harmless
    assert "closed" in repr(f)
