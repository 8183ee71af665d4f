"""convert: safetensors and GGUF into Hurray, Hurray into safetensors.

Inputs are written by the formats' own writers (``safetensors.numpy.save_file`` /
``safetensors.serialize_file``, ``gguf.GGUFWriter`` with ``gguf.quants.quantize``); what the
converted file decodes to is compared bit for bit (``-0.0`` included, NaN payloads too) with
what the formats' own readers give (``safetensors.numpy.load_file``, ``gguf.quants.dequantize``).
Every converted file is audited: no finding.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError

safetensors = pytest.importorskip("safetensors", reason="the safetensors extra is not installed")
gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed")
import ml_dtypes  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from hurray_schema.conversion.gguf_blocks import BLOCK_MAPPINGS  # noqa: E402

T = gguf.GGMLQuantizationType


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def bits(array: np.ndarray) -> np.ndarray:
    """The array's bytes (a bit-for-bit comparison: -0.0 differs from 0.0, NaNs compare by payload)."""
    a = np.ascontiguousarray(array)
    return a.reshape(-1).view(np.uint8)


def assert_bits_equal(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, what
    assert actual.dtype == expected.dtype, what
    assert np.array_equal(bits(actual), bits(expected)), what


def assert_clean_audit(path):
    report = hs.audit(str(path))
    assert list(report.findings) == [], [f.rule_id for f in report.findings]


def serialize_raw(path, tensors: dict, metadata=None):
    """safetensors' own serializer for dtypes its NumPy front end lacks (bfloat16, float8)."""
    keep = {}
    specs = {}
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        keep[name] = array
        specs[name] = safetensors.TensorSpec(dtype=array.dtype.name, shape=list(array.shape),
                                             data_ptr=array.ctypes.data, data_len=array.nbytes)
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def write_gguf(path, tensors: list, kv: dict | None = None):
    """A GGUF file of (name, array, raw type or None) written by gguf.GGUFWriter: quantized arrays
    are the uint8 blocks gguf.quants.quantize gives (or random blocks), their type given."""
    writer = gguf.GGUFWriter(str(path), "test")
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, value)
    for name, array, raw_type in tensors:
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantized(values: np.ndarray, kind: str) -> np.ndarray:
    return gguf.quants.quantize(values.astype(np.float32), T[kind])


def gguf_reference(path) -> dict:
    """name -> float32 values as gguf-py decodes them (shape: GGUF's ne reversed)."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        if t.tensor_type in (T.F32, T.F16, T.F64, T.I8, T.I16, T.I32, T.I64):
            out[t.name] = np.array(t.data).reshape(shape)
        elif t.tensor_type == T.BF16:
            out[t.name] = np.array(t.data).view(ml_dtypes.bfloat16).reshape(shape)
        else:
            out[t.name] = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(shape)
    return out


# --------------------------------------------------------------------------------------
# safetensors -> Hurray
# --------------------------------------------------------------------------------------


def numpy_dtype_arrays(rng) -> dict:
    return {
        "f64": rng.standard_normal((3, 5)),
        "f32": np.array([[0.0, -0.0, np.inf, -np.inf], [np.nan, 1e-45, -3.5, 7.0]], np.float32),
        "f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "i64": rng.integers(-2**62, 2**62, (7,)), "u64": rng.integers(0, 2**63, (2, 2), dtype=np.uint64),
        "i32": rng.integers(-2**31, 2**31 - 1, (4,), dtype=np.int32),
        "u32": rng.integers(0, 2**32 - 1, (4,), dtype=np.uint32),
        "i16": rng.integers(-2**15, 2**15 - 1, (3, 3), dtype=np.int16),
        "u16": rng.integers(0, 2**16 - 1, (5,), dtype=np.uint16),
        "i8": rng.integers(-128, 127, (9,), dtype=np.int8), "u8": rng.integers(0, 255, (2, 8), dtype=np.uint8),
        "bool": rng.integers(0, 2, (3, 7)).astype(bool), "bool_one": np.array([True]),
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "empty": np.zeros((0, 4), np.float32), "scalar": np.array(2.5, np.float32),
    }


def test_safetensors_to_hurray_every_numpy_dtype(tmp_path):
    rng = np.random.default_rng(1)
    arrays = numpy_dtype_arrays(rng)
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    save_file(arrays, str(src), metadata={"format": "np", "note": "é"})
    report = hs.convert(src, dst)
    expected = load_file(str(src))
    got = hs.load(dst)
    assert list(got) == list(report_names(report)) and set(got) == set(expected)
    for name, array in expected.items():
        assert_bits_equal(got[name], array, name)
    with hs.read_file(dst) as f:
        assert f.metadata() == {"format": "np", "note": "é"}
        assert f.descriptor("bool").buffers[0].byte_size == 3  # 21 values, 8 per byte
    assert all(row.exact for row in report.tensors)
    assert_clean_audit(dst)


def report_names(report):
    return [row.name for row in report.tensors]


def test_safetensors_to_hurray_ml_dtypes(tmp_path):
    rng = np.random.default_rng(2)
    raw = {
        "bf16": rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16),
        "e4m3": rng.standard_normal((8,)).astype(ml_dtypes.float8_e4m3fn),
        "e5m2": rng.standard_normal((2, 4)).astype(ml_dtypes.float8_e5m2),
        "e8m0": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu),
    }
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    serialize_raw(src, raw)
    hs.convert(src, dst, verify=True)
    got = hs.load(dst)
    with safetensors.safe_open(str(src), framework="numpy") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes == {"bf16": "BF16", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "e8m0": "F8_E8M0"}
    for name, array in raw.items():
        assert_bits_equal(got[name], array, name)
    assert_clean_audit(dst)


def test_safetensors_dtype_without_hurray_type_is_refused(tmp_path):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    serialize_raw(src, {"x": np.zeros(4, ml_dtypes.float8_e4m3fnuz)})
    with pytest.raises(HurraySchemaError, match="F8_E4M3FNUZ"):
        hs.convert(src, dst)
    assert not dst.exists()


def test_truncated_safetensors_header_writes_nothing(tmp_path):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    save_file({"w": np.ones((4, 4), np.float32)}, str(src))
    data = src.read_bytes()
    src.write_bytes(data[:20])
    with pytest.raises(HurraySchemaError, match="safetensors"):
        hs.convert(src, dst)
    assert not dst.exists()
    assert os.listdir(tmp_path) == ["in.safetensors"]


def test_failed_conversion_keeps_the_previous_output(tmp_path):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    save_file({"w": np.ones(3, np.float32)}, str(src))
    hs.convert(src, dst)
    before = dst.read_bytes()
    src.write_bytes(src.read_bytes()[:-1])  # the last tensor cut short
    with pytest.raises(HurraySchemaError):
        hs.convert(src, dst)
    assert dst.read_bytes() == before


# --------------------------------------------------------------------------------------
# Hurray -> safetensors
# --------------------------------------------------------------------------------------


def test_hurray_to_safetensors_merges_composites(tmp_path):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    items = {
        "dense": rng.standard_normal((3, 4)).astype(np.float16),
        "flags": rng.integers(0, 2, 11).astype(bool),
        "q": hs.quantize(weight, "per_block", storage="int4", scale_type="float32"),
        "q8": hs.quantize(weight, "per_channel", axis=0),
        "part": hs.partition(weight, grid=(2, 2)),
        "spqr": hs.spqr(weight, outliers=0.01),
        "grp": hs.group([np.arange(5, dtype=np.int32), np.ones((2, 2), np.float64)]),
    }
    src, dst = tmp_path / "in.hrry", tmp_path / "out.safetensors"
    hs.save(src, items, metadata={"author": "test", "n": 3})
    report = hs.convert(src, dst)
    expected = hs.load(src)
    got = load_file(str(dst))
    assert set(got) == set(expected) and list(expected) == report_names(report)
    for name, array in expected.items():
        assert_bits_equal(got[name], array, name)
    with safetensors.safe_open(str(dst), framework="numpy") as f:
        assert f.metadata() == {"author": "test", "n": "3"}


def test_round_trip_safetensors_hurray_safetensors(tmp_path):
    arrays = numpy_dtype_arrays(np.random.default_rng(4))
    first, middle, last = tmp_path / "a.safetensors", tmp_path / "b.hrry", tmp_path / "c.safetensors"
    save_file(arrays, str(first), metadata={"k": "v"})
    hs.convert(first, middle)
    hs.convert(middle, last)
    again = load_file(str(last))
    for name, array in load_file(str(first)).items():
        assert_bits_equal(again[name], array, name)


# --------------------------------------------------------------------------------------
# GGUF -> Hurray: types gguf-py quantizes
# --------------------------------------------------------------------------------------

QUANTIZABLE = ("Q8_0", "Q4_0", "Q5_0", "TQ1_0", "TQ2_0", "MXFP4")
"""Scale-times-integer types gguf.quants.quantize writes."""


def gguf_inputs(kind: str, rng) -> list:
    """1-D, 2-D (several blocks per row, an all-zero row) and 3-D tensors of ``kind``."""
    block = gguf.constants.GGML_QUANT_SIZES[T[kind]][0]
    flat = rng.standard_normal(block * 3).astype(np.float32)
    matrix = rng.standard_normal((4, block * 4)).astype(np.float32) * np.float32(3)
    matrix[1] = 0.0
    matrix[2, :block] = 0.0  # one zero block in a row
    cube = rng.standard_normal((2, 3, block * 2)).astype(np.float32)
    return [(f"{kind}.flat", quantized(flat, kind), T[kind]), (f"{kind}.matrix", quantized(matrix, kind), T[kind]),
            (f"{kind}.cube", quantized(cube, kind), T[kind])]


@pytest.mark.parametrize("kind", QUANTIZABLE)
def test_gguf_quantized_types_decode_bit_exact(tmp_path, kind):
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, gguf_inputs(kind, np.random.default_rng(5)))
    report = hs.convert(src, dst, verify=True)
    reference = gguf_reference(src)
    got = hs.load(dst)
    assert set(got) == set(reference)
    for name, values in reference.items():
        assert values.dtype == np.float32
        assert_bits_equal(got[name], values, name)
    storage = BLOCK_MAPPINGS[kind].storage.name.lower()
    assert {row.type_out for row in report.tensors} == {f"{storage} per_block_affine"}
    assert all(row.max_abs_error == 0 and row.rel_frobenius_error == 0 for row in report.tensors)
    assert_clean_audit(dst)


def test_converted_buffers_past_the_memory_budget_wait_in_a_file(tmp_path):
    src = tmp_path / "in.gguf"
    write_gguf(src, gguf_inputs("Q4_0", np.random.default_rng(11)) + gguf_inputs("Q8_0", np.random.default_rng(12)))
    hs.convert(src, tmp_path / "memory.hrry")
    hs.convert(src, tmp_path / "spilled.hrry", memory=0)
    assert (tmp_path / "spilled.hrry").read_bytes() == (tmp_path / "memory.hrry").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["in.gguf", "memory.hrry", "spilled.hrry"]


def test_gguf_q4_0_zero_block_keeps_negative_zero(tmp_path):
    zeros = np.zeros((2, 64), np.float32)
    blocks = quantized(zeros, "Q4_0")
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("z", blocks, T.Q4_0)])
    reference = gguf_reference(src)["z"]
    assert np.all(np.signbit(reference))  # gguf-py: d = -0.0, code 0 -> -0.0
    hs.convert(src, dst)
    got = hs.load(dst)["z"]
    assert_bits_equal(got, reference)
    with hs.read_file(dst) as f:
        scales = np.frombuffer(f.get_item("z").buffers[1], "<f4")
    assert np.all(scales == -1)
    assert_clean_audit(dst)


def test_gguf_dense_types_are_byte_copies(tmp_path):
    rng = np.random.default_rng(6)
    f32 = rng.standard_normal((3, 8)).astype(np.float32)
    tensors = [
        ("f32", f32, None), ("f16", rng.standard_normal((5,)).astype(np.float16), None),
        ("f64", rng.standard_normal((2, 2, 2)), None),
        ("bf16", gguf.quants.quantize(f32, T.BF16), T.BF16),
        ("i8", rng.integers(-128, 127, 6, dtype=np.int8), None),
        ("i16", rng.integers(-9, 9, (2, 3), dtype=np.int16), None),
        ("i32", rng.integers(-9, 9, 4, dtype=np.int32), None),
        ("i64", rng.integers(-9, 9, 4, dtype=np.int64), None),
    ]
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, tensors, kv={"general.name": "dense", "x.count": 7, "x.scale": 0.5, "x.list": [1, 2, 3]})
    report = hs.convert(src, dst)
    reference = gguf_reference(src)
    got = hs.load(dst)
    for name, values in reference.items():
        assert_bits_equal(got[name], values, name)
    assert {row.name: row.type_out for row in report.tensors}["bf16"] == "bfloat16"
    with hs.read_file(dst) as f:
        kv = f.metadata()
    assert kv["general.name"] == "dense" and kv["x.count"] == 7 and kv["x.scale"] == 0.5
    assert kv["x.list"] == [1, 2, 3] and kv["general.architecture"] == "test"
    assert_clean_audit(dst)


# --------------------------------------------------------------------------------------
# GGUF -> Hurray: blocks of random bytes (finite fields)
# --------------------------------------------------------------------------------------

F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q6_K": [208], "Q3_K": [108], "TQ2_0": [64], "TQ1_0": [52],
              "IQ4_NL": [0], "IQ4_XS": [0], "MXFP4": [], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0],
              "IQ3_S": [0], "IQ1_S": [0], "IQ1_M": []}
"""Byte offsets of each block type's float16 scale d (IQ1_M spreads its d over four top nibbles)."""


def random_blocks(kind: str, rows: int, blocks_per_row: int, rng, *, subnormal: bool = True) -> np.ndarray:
    """Random blocks with finite, non-zero sub-block scales (a zero scale over codes of both signs
    has no exact form, tested on its own); some d float16 subnormals."""
    _, type_size = gguf.constants.GGML_QUANT_SIZES[T[kind]]
    count = rows * blocks_per_row
    blocks = rng.integers(0, 256, (count, type_size), dtype=np.uint8)
    for at in F16_FIELDS[kind]:
        d = rng.standard_normal(count).astype(np.float16)
        d[d == 0] = np.float16(1)
        if subnormal:
            d[::3] = np.array([1, 0x8003, 0x03FF], np.uint16)[np.arange(len(d[::3])) % 3].view(np.float16)
        blocks[:, at:at + 2] = d.view(np.uint8).reshape(count, 2)
    if kind == "Q6_K":
        sc = blocks[:, 192:208].view(np.int8)
        sc[sc == 0] = 1
    if kind == "IQ1_M":
        d = rng.standard_normal(count).astype(np.float16)
        d[d == 0] = np.float16(1)
        words = np.ascontiguousarray(blocks[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
        for k in range(4):
            words[:, k] |= ((d.view(np.uint16) >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
        blocks[:, 48:56] = words.view(np.uint8)
    if kind in ("Q3_K", "IQ4_XS"):
        _fix_six_bit_scales(kind, blocks, rng)
    return blocks.reshape(rows, blocks_per_row * type_size)


def _fix_six_bit_scales(kind, blocks, rng):
    """Redraw the packed 6-bit scales of blocks until none is 32 (sc - 32 = 0)."""
    start, stop = (96, 108) if kind == "Q3_K" else (2, 8)
    mapping = BLOCK_MAPPINGS[kind]
    for _ in range(200):
        _, scales = mapping.unpack(blocks)
        bad = np.any(scales == 0, axis=1)
        if not bad.any():
            return
        blocks[bad, start:stop] = rng.integers(0, 256, (int(bad.sum()), stop - start), dtype=np.uint8)
    raise AssertionError("could not draw non-zero scales")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # MXFP4: 2**127 * 12 is inf
@pytest.mark.parametrize("kind", sorted(F16_FIELDS))
def test_gguf_random_blocks_decode_bit_exact(tmp_path, kind):
    rng = np.random.default_rng(sorted(F16_FIELDS).index(kind))
    block = gguf.constants.GGML_QUANT_SIZES[T[kind]][0]
    per_row = max(1, 512 // block)
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    matrix = random_blocks(kind, 3, per_row, rng)
    flat = random_blocks(kind, 1, 2, rng)[0]
    cube = random_blocks(kind, 4, 1, rng).reshape(2, 2, -1)
    write_gguf(src, [("m", matrix, T[kind]), ("flat", flat, T[kind]), ("cube", cube, T[kind])])
    hs.convert(src, dst)
    reference = gguf_reference(src)
    got = hs.load(dst)
    assert reference["m"].shape == (3, per_row * block) and reference["cube"].shape == (2, 2, block)
    for name, values in reference.items():
        assert_bits_equal(got[name], values, f"{kind} {name}")
    assert_clean_audit(dst)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # gguf-py's 2**127 * 12 is inf
def test_mxfp4_every_e8m0_value(tmp_path):
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (256, 17), dtype=np.uint8)
    blocks[:, 0] = np.arange(256, dtype=np.uint8)  # every exponent, 0x00 and 0xFF included
    blocks[:4, 1:] = np.array([0x80, 0x08, 0x88, 0x00], np.uint8)[:, None]  # both zero codes
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("mx", blocks.reshape(8, 32 * 17), T.MXFP4)])
    hs.convert(src, dst)
    reference = gguf_reference(src)["mx"]
    assert_bits_equal(hs.load(dst)["mx"], reference)
    assert_clean_audit(dst)


def test_distinct_codes_pin_every_position(tmp_path):
    """Q4_0 with all 16 nibbles in both halves (low nibble j, high nibble 15 - j) and Q8_0 with
    32 distinct codes: any mix-up of nibble or stripe order changes a value."""
    d = np.array([0.5], np.float16).view(np.uint8)
    q4 = np.concatenate([d, (np.arange(16) | ((15 - np.arange(16)) << 4)).astype(np.uint8)])
    q8 = np.concatenate([d, np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    q5 = np.concatenate([d, np.array([0x0F, 0xF0, 0x33, 0xCC], np.uint8), q4[2:]])
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("q4", q4, T.Q4_0), ("q8", q8, T.Q8_0), ("q5", q5, T.Q5_0)])
    hs.convert(src, dst)
    reference = gguf_reference(src)
    got = hs.load(dst)
    assert len(set(reference["q4"][:16].tolist())) == 16 and len(set(reference["q8"].tolist())) == 32
    for name, values in reference.items():
        assert_bits_equal(got[name], values, name)


def q8_block(d: float, codes) -> np.ndarray:
    return np.concatenate([np.array([d], np.float16).view(np.uint8), np.asarray(codes, np.int8).view(np.uint8)])


def test_zero_scales_of_one_sign_convert_exactly(tmp_path):
    blocks = np.stack([
        q8_block(0.0, np.arange(32)),  # +0 * q >= 0: all +0
        q8_block(-0.0, np.arange(32)),  # -0 * q >= 0: all -0
        q8_block(0.0, -np.arange(1, 33)),  # +0 * q < 0: all -0
        q8_block(-0.0, -np.arange(1, 33)),  # -0 * q < 0: all +0
        q8_block(2.0 ** -24, np.arange(32)),  # the smallest float16 subnormal
    ])
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("z", blocks.reshape(5, 34), T.Q8_0)])
    hs.convert(src, dst)
    reference = gguf_reference(src)["z"]
    assert list(np.signbit(reference[:4, 0])) == [False, True, True, False]
    assert_bits_equal(hs.load(dst)["z"], reference)
    assert_clean_audit(dst)


def test_zero_scale_over_zeros_of_both_signs_needs_dequantize(tmp_path):
    mixed = q8_block(0.0, np.arange(-16, 16))
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("mixed", mixed, T.Q8_0)])
    with pytest.raises(hs.NoExactForm, match="'mixed' is Q8_0: .*both signs"):
        hs.convert(src, dst)
    assert not dst.exists()
    report = hs.convert(src, dst, dequantize=True)
    assert report.tensors[0].type_out == "float32"
    assert_bits_equal(hs.load(dst)["mixed"], gguf_reference(src)["mixed"])


def q4_block(d_bits: int, nibbles) -> np.ndarray:
    """A ``block_q4_0`` of float16 bits ``d_bits`` and 32 nibbles in value order (GGUF's halves)."""
    nibbles = np.asarray(nibbles, np.uint8)
    return np.concatenate([np.array([d_bits], "<u2").view(np.uint8), nibbles[:16] | (nibbles[16:] << 4)])


Q4_SCALE_CLASSES = {
    "+0 over codes >= 0": (0x0000, [8] * 31 + [15]),  # all +0
    "+0 over codes < 0": (0x0000, list(range(8)) * 4),  # all -0
    "-0 over codes >= 0": (0x8000, [8] * 32),  # all -0 (gguf's all-zero block)
    "-0 over codes < 0": (0x8000, [0] * 32),  # all +0
    "smallest subnormal": (0x0001, range(32)),
    "negative subnormal": (0x8003, range(32)),
    "largest subnormal": (0x03FF, range(32)),
    "smallest normal": (0x0400, range(32)),
    "largest normal": (0x7BFF, range(32)),
    "negative normal": (0xBC00, range(32)),
}
"""Q4_0 blocks covering every class of scale with an exact form (the two zero forms of each sign)."""


def test_q4_0_every_scale_class_decodes_bit_exact(tmp_path, monkeypatch):
    """The kernel of Q4_0's short way against gguf-py: every kind of scale, scattered among random
    blocks over many rows of several blocks (the classifying pass made parallel at this size)."""
    from hurray_schema.evaluate import nibble_records as kernels

    monkeypatch.setattr(kernels, "RECORDS_PARALLEL_MIN", 256)
    rng = np.random.default_rng(14)
    blocks = random_blocks("Q4_0", 128, 16, rng).reshape(-1, 18)
    special = np.stack([q4_block(d, codes) for d, codes in Q4_SCALE_CLASSES.values()])
    where = rng.choice(len(blocks), (5, len(special)), replace=False)
    for row in where:
        blocks[row] = special
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("w", blocks.reshape(128, 16 * 18), T.Q4_0), ("one", special[2], T.Q4_0)])
    report = hs.convert(src, dst)
    reference = gguf_reference(src)
    got = hs.load(dst)
    for name in ("w", "one"):
        assert_bits_equal(got[name], reference[name], name)
    signs = np.signbit(reference["w"].reshape(-1, 32)[where[0, :4]])
    assert signs.tolist() == [[False] * 32, [True] * 32, [True] * 32, [False] * 32]
    with hs.read_file(dst) as f:
        scales = np.frombuffer(f.get_item("w").buffers[1], "<f4")
    assert scales[where[0, :4]].tolist() == [1.0, -1.0, -1.0, 1.0]  # zero scales made +-1 of the values' sign
    assert {row.type_out for row in report.tensors} == {"int4 per_block_affine"}
    assert_clean_audit(dst)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # gguf-py's inf * 0
@pytest.mark.parametrize("d_bits, nibbles, problem", [
    (0x0000, range(32), "both signs"),  # +0 over codes -8..7: -0 and +0
    (0x8000, [7] + [8] * 31, "both signs"),
    (0x7C00, range(32), "infinite or NaN"),
    (0xFE01, range(32), "infinite or NaN"),
])
def test_q4_0_scale_without_exact_form_needs_dequantize(tmp_path, d_bits, nibbles, problem):
    rng = np.random.default_rng(15)
    blocks = random_blocks("Q4_0", 64, 32, rng).reshape(-1, 18)
    blocks[1000] = q4_block(d_bits, nibbles)
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("w", blocks.reshape(64, 32 * 18), T.Q4_0)])
    with pytest.raises(hs.NoExactForm, match=f"'w' is Q4_0: .*{problem}"):
        hs.convert(src, dst)
    assert not dst.exists()
    reference = gguf_reference(src)["w"]
    hs.convert(src, dst, dequantize=True)
    assert_bits_equal(hs.load(dst)["w"], reference)


def test_nibble_records_kernel_against_numpy(monkeypatch):
    """The kernel alone, by pieces and in parallel, against NumPy's own float16 widening and nibble
    arithmetic; its classification of every record kind."""
    from hurray_schema.evaluate import nibble_records as kernels

    monkeypatch.setattr(kernels, "RECORDS_PARALLEL_MIN", 256)  # parallel at this size

    rng = np.random.default_rng(16)
    records = rng.integers(0, 256, (5000, 20), dtype=np.uint8)  # nibbles at 1, d at 18: another layout
    d = rng.integers(0, 1 << 16, 5000, dtype=np.uint16)
    d[(d & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)  # finite ...
    d[(d & 0x7FFF) == 0] = 1  # ... and non-zero
    records[:, 18:20] = d.view(np.uint8).reshape(-1, 2)
    nibbles = np.concatenate([records[:, 1:17] & 15, records[:, 1:17] >> 4], axis=1)
    codes = (nibbles.astype(np.int8) - 8).view(np.uint8) & 15
    expected_codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    expected_scales = d.view(np.float16).astype(np.float32)
    assert kernels.nibble_records(records, 18, 1) == kernels.RECORD_EXACT
    whole_codes, whole_scales = np.empty((5000, 16), np.uint8), np.empty(5000, np.float32)
    assert kernels.nibble_records(records, 18, 1, whole_codes, whole_scales) == kernels.RECORD_EXACT
    assert np.array_equal(whole_codes, expected_codes) and np.array_equal(bits(whole_scales), bits(expected_scales))
    piece_codes, piece_scales = np.empty((5000, 16), np.uint8), np.empty(5000, np.float32)
    for first in range(0, 5000, 777):
        kernels.nibble_records(records[first:first + 777], 18, 1, piece_codes[first:first + 777],
                               piece_scales[first:first + 777], parallel=False)
    assert np.array_equal(piece_codes, expected_codes) and np.array_equal(bits(piece_scales), bits(expected_scales))
    for d_bits, low, worst in [(0x0000, 0x88, kernels.RECORD_ZERO_SCALE), (0x8000, 0x00, kernels.RECORD_ZERO_SCALE),
                               (0x0000, 0x80, kernels.RECORD_ZERO_BOTH_SIGNS),
                               (0xFC00, 0x88, kernels.RECORD_NOT_FINITE)]:
        odd = records.copy()
        odd[4321, 18:20] = np.array([d_bits], "<u2").view(np.uint8)
        odd[4321, 1:17] = low
        assert kernels.nibble_records(odd, 18, 1) == worst
        assert kernels.nibble_records(odd[:4000], 18, 1, parallel=False) == kernels.RECORD_EXACT
        assert kernels.nibble_records(odd, 18, 1, piece_codes, classify=False) == kernels.RECORD_EXACT  # not looked at


def test_produced_tensor_writes_the_bytes_it_materializes(tmp_path):
    """A produced tensor is written piece by piece; taken whole it gives the same bytes; a producer that
    gives fewer bytes than it declared fails the write, which then leaves nothing."""
    from hurray_schema.builders import per_block_produced
    from hurray_schema.io.tensor import ProducedBuffer

    rng = np.random.default_rng(17)
    data = rng.integers(0, 256, 4 * 64 // 2, dtype=np.uint8)
    scales = rng.uniform(0.5, 2, 4 * 2).astype("<f4").view(np.uint8)

    def pieces_of(array, size):
        return lambda: (array[i:i + size] for i in range(0, len(array), size))

    made = per_block_produced(ProducedBuffer(len(data), pieces_of(data, 7)),
                              ProducedBuffer(len(scales), pieces_of(scales, 8)), (4, 64), "int4", 32)
    plain = hs.per_block_from_packed(data, scales.view("<f4"), (4, 64), "int4", 32)
    assert made.stored_nbytes == plain.stored_nbytes and made.same_content(plain)
    hs.write_file(tmp_path / "made.hrry", {"t": made})
    hs.write_file(tmp_path / "plain.hrry", {"t": plain})
    assert (tmp_path / "made.hrry").read_bytes() == (tmp_path / "plain.hrry").read_bytes()
    short = per_block_produced(ProducedBuffer(len(data), pieces_of(data[:-1], 7)),
                               ProducedBuffer(len(scales), pieces_of(scales, 8)), (4, 64), "int4", 32)
    with pytest.raises(HurraySchemaError, match="declared"):
        hs.write_file(tmp_path / "short.hrry", {"t": short})
    assert not (tmp_path / "short.hrry").exists()


@pytest.mark.parametrize("kind", ["Q4_1", "Q5_1"])
def test_offset_types_are_refused_unless_dequantized(tmp_path, kind):
    values = np.random.default_rng(8).standard_normal((2, 64)).astype(np.float32)
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("w.offset", quantized(values, kind), T[kind])])
    with pytest.raises(hs.NoExactForm, match=f"'w.offset' is {kind}: .*float offset.*--dequantize"):
        hs.convert(src, dst)
    assert not dst.exists()
    report = hs.convert(src, dst, dequantize=True)
    assert_bits_equal(hs.load(dst)["w.offset"], gguf_reference(src)["w.offset"])
    assert report.tensors[0].exact and "float32" in report.tensors[0].note
    report = hs.convert(src, dst, requantize="per_block:int8")
    row = report.tensors[0]
    assert not row.exact and row.measured and 0 < row.rel_frobenius_error < 0.05


def test_rounded_zero_point_for_q4_1_fails_the_bit_check():
    """Negative control: Q4_1's d * q + m as a per-block affine scale d and integer zero point
    round(-m / d) -- the best integer form -- does not decode to gguf-py's bits."""
    values = np.random.default_rng(9).standard_normal((4, 64)).astype(np.float32)
    blocks = quantized(values, "Q4_1").reshape(-1, 20)
    reference = gguf.quants.dequantize(blocks, T.Q4_1).reshape(4, 64)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    nibbles = np.concatenate([blocks[:, 4:] & 0x0F, blocks[:, 4:] >> 4], axis=1).astype(np.int32)
    codes = nibbles + np.round(m / d).astype(np.int32)  # q - z with z = round(-m / d)
    tensor = hs.per_block_from_codes(codes.reshape(4, 64), d.reshape(-1), "int8", 32)
    decoded = tensor.to_numpy()
    assert np.allclose(decoded, reference, atol=float(np.max(d)))  # close ...
    assert not np.array_equal(bits(decoded), bits(reference))  # ... but not the same bits


def test_gguf_cut_in_a_tensor_writes_nothing(tmp_path):
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("a", np.ones(64, np.float32), None), ("b", quantized(np.ones(64), "Q8_0"), T.Q8_0)])
    start = gguf.GGUFReader(str(src)).tensors[1].data_offset
    src.write_bytes(src.read_bytes()[:start + 40])  # inside the second of b's two 34-byte blocks
    with pytest.raises(HurraySchemaError, match="GGUF|'b'"):
        hs.convert(src, dst)
    assert not dst.exists() and sorted(os.listdir(tmp_path)) == ["in.gguf"]


def test_gguf_unknown_type_writes_nothing(tmp_path):
    src, dst = tmp_path / "in.gguf", tmp_path / "out.hrry"
    write_gguf(src, [("only", np.ones(8, np.float32), None)])
    data = bytearray(src.read_bytes())
    at = data.index(b"only") + len(b"only") + 4 + 8  # name, n_dims (uint32), ne[0] (uint64), then the type
    assert data[at:at + 4] == (0).to_bytes(4, "little")  # F32
    data[at:at + 4] = (250).to_bytes(4, "little")
    src.write_bytes(bytes(data))
    with pytest.raises(HurraySchemaError, match="type"):
        hs.convert(src, dst)
    assert not dst.exists()


# --------------------------------------------------------------------------------------
# Options, report, CLI
# --------------------------------------------------------------------------------------


def test_quantize_spqr_partition_options(tmp_path):
    rng = np.random.default_rng(10)
    arrays = {"layer.weight": rng.standard_normal((64, 128)).astype(np.float32),
              "layer.bias": rng.standard_normal(64).astype(np.float32),
              "embed.weight": rng.standard_normal((32, 64)).astype(np.float32)}
    src = tmp_path / "in.safetensors"
    save_file(arrays, str(src))
    for options, kind in [({"quantize": "per_block:int4"}, "int4 per_block_affine"),
                          ({"spqr": 0.01}, "overlay(float32)"),
                          ({"partition": "2x2", "quantize": "per_block"}, "partition(float32)")]:
        dst = tmp_path / "out.hrry"
        report = hs.convert(src, dst, **options)
        rows = {row.name: row for row in report.tensors}
        assert rows["layer.weight"].type_out == kind
        assert rows["layer.bias"].exact and rows["embed.weight"].exact
        weight = rows["layer.weight"]
        assert not weight.exact and weight.measured and 0 < weight.rel_frobenius_error < 0.2
        got = hs.load(dst)
        error = np.max(np.abs(got["layer.weight"].astype(np.float64) - arrays["layer.weight"]))
        assert error == pytest.approx(weight.max_abs_error)
        assert_bits_equal(got["embed.weight"], arrays["embed.weight"])
        assert_clean_audit(dst)
    report = hs.convert(src, tmp_path / "sel.hrry", quantize="per_channel", select=["embed.*"])
    assert {row.name for row in report.tensors if not row.exact} == {"embed.weight"}


def test_cli_convert_report_and_json(tmp_path):
    from click.testing import CliRunner

    from hurray_schema.cli import main

    src, dst = tmp_path / "in.safetensors", tmp_path / "out.hrry"
    save_file({"w": np.ones((4, 64), np.float32)}, str(src))
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(src), str(dst), "--quantize", "per_block:int8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "hurray-schema/convert/1"
    (row,) = data["tensors"]
    assert row["name"] == "w" and row["type_in"] == "F32" and row["type_out"] == "int8 per_block_affine"
    assert row["bytes_in"] == 1024 and row["measured"] and 0 <= row["max_abs_error"] < 0.01
    result = runner.invoke(main, ["convert", str(src), str(tmp_path / "plain.hrry")])
    assert result.exit_code == 0 and "0 (exact)" in result.output
    result = runner.invoke(main, ["audit", str(dst)])
    assert result.exit_code == 0, result.output
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 12)
    result = runner.invoke(main, ["convert", str(bad), str(tmp_path / "never.hrry")])
    assert result.exit_code == 2 and "safetensors" in result.output
    assert not (tmp_path / "never.hrry").exists()


def test_import_leaves_optional_packages_alone():
    import subprocess
    import sys

    code = ("import sys, hurray_schema as hs; hs.convert; "
            "print(sorted(m for m in ('safetensors', 'gguf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_short_way_packs_what_the_codes_pack_to(kind):
    blocks = random_blocks(kind, 4, 3, np.random.default_rng(13)).reshape(12, -1)
    mapping = BLOCK_MAPPINGS[kind]
    if mapping.produce is not None:  # made as the file is written: the bytes a writer would get
        data, scales = (np.frombuffer(made.materialized(), np.uint8) for made in mapping.produce(blocks))
    else:
        data, scales = mapping.pack(blocks)
    codes, unpacked_scales = mapping.unpack(blocks)
    generic = hs.per_block_from_codes(codes.reshape(4, 96), unpacked_scales.reshape(-1), mapping.storage, 32)
    assert bytes(generic.buffers[0]) == data.tobytes()
    assert np.array_equal(bits(scales), bits(unpacked_scales.astype("<f4")))


def test_progress_is_reported_tensor_by_tensor(tmp_path):
    src = tmp_path / "in.safetensors"
    save_file({f"t{i}": np.full((i + 1, 8), i, np.float32) for i in range(4)}, str(src))
    calls = []
    hs.convert(src, tmp_path / "out.hrry", progress=lambda done, total: calls.append((done, total)))
    assert len(calls) == 4 and calls[-1][0] == calls[-1][1] == sum(32 * (i + 1) for i in range(4))
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    calls.clear()
    hs.convert(tmp_path / "out.hrry", tmp_path / "back.safetensors", progress=lambda d, t: calls.append((d, t)))
    assert len(calls) == 4 and calls[-1][0] == calls[-1][1]
