"""The frame every quantized checkpoint goes through (``hurray_schema.conversion.quantized``):
quantized tensors of codes and parameters chosen by another library
(:func:`hurray_schema.builders.quantized_from_codes`), packed words opened and closed, distances
in units in the last place, the ``quantization_config`` a folder's ``config.json`` carries.

The expected values are written here from the spec's formulas (``quantization/per-block-affine.md
§ Dequantization Formula``: ``s * (q - z)`` in float32, ``per-channel-affine.md``, ``nf4.md``) and
from NumPy's own ``nextafter``, never from the code under test."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hurray_schema as hs
from hurray_schema.builders import quantized_from_codes
from hurray_schema.conversion.quantized import quantization_config, regroup
from hurray_schema.conversion.quantized.packing import pack_words, ulp_distance, unpack_words
from hurray_schema.errors import HurraySchemaError

NF4_TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
"""``quantization/nf4.md § Lookup Table``, typed in from the spec page."""


def _written_and_read(tmp_path, tensor) -> np.ndarray:
    path = os.fspath(tmp_path / "t.hrry")
    hs.write_file(path, {"w": tensor})
    assert not hs.audit(path).findings
    with hs.read_file(path) as f:
        return f["w"].to_numpy()


@pytest.mark.parametrize("axis", [0, 1])
def test_per_block_codes_with_zero_points_decode_to_the_formula_in_the_scale_type(tmp_path, axis):
    rng = np.random.default_rng(1)
    out, inn, group = 6, 64, 32
    codes = rng.integers(0, 16, (out, inn))
    scales = (rng.random((out, inn // group)) * 0.2 + 0.01).astype(np.float16)
    zeros = rng.integers(0, 16, (out, inn // group))
    expected = ((codes - np.repeat(zeros, group, 1)).astype(np.float32)
                * np.repeat(scales, group, 1).astype(np.float32)).astype(np.float16)
    if axis == 0:
        codes, scales, zeros, expected = codes.T, scales.T, zeros.T, expected.T
    tensor = quantized_from_codes(codes, "per_block", storage="uint4", axis=axis, scales=scales,
                                  zero_points=zeros, block_size=group)
    got = _written_and_read(tmp_path, tensor)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_per_channel_and_nf4_codes_decode_to_the_formula(tmp_path):
    rng = np.random.default_rng(2)
    codes = rng.integers(-128, 128, (5, 16))
    scales = (rng.random(5) + 0.5).astype(np.float16)
    tensor = quantized_from_codes(codes, "per_channel", storage="int8", axis=0, scales=scales)
    np.testing.assert_array_equal(_written_and_read(tmp_path, tensor),
                                  codes.astype(np.float32) * scales.astype(np.float32)[:, None])
    nibbles = rng.integers(0, 16, (4, 128))
    absmax = rng.random((4, 2)).astype(np.float32)
    tensor = quantized_from_codes(nibbles, "nf4", storage="uint4", axis=1, scales=absmax, block_size=64)
    (tmp_path / "t.hrry").unlink()
    np.testing.assert_array_equal(_written_and_read(tmp_path, tensor), NF4_TABLE[nibbles] * np.repeat(absmax, 64, 1))


@pytest.mark.parametrize("bad, message", [
    (dict(block_size=24), "power of two"),
    (dict(block_size=128), "dividing"),
    (dict(scales=np.ones((6, 3), np.float16)), "scales of shape"),
    (dict(zero_points=np.zeros((6, 2), np.float32)), "zero points"),
    (dict(storage="uint2"), "do not fit"),
    (dict(storage="float16"), "no integer storage"),
])
def test_codes_that_do_not_fit_their_description_are_refused(bad, message):
    arguments = dict(storage="uint4", axis=1, scales=np.ones((6, 2), np.float16), block_size=32)
    arguments.update(bad)
    with pytest.raises(HurraySchemaError, match=message):
        quantized_from_codes(np.full((6, 64), 9), "per_block", **arguments)


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), words=st.integers(1, 4), rows=st.integers(1, 3), axis=st.integers(0, 1),
       seed=st.integers(0, 2**32 - 1), permuted=st.booleans())
def test_packed_words_open_and_close(bits, words, rows, axis, seed, permuted):
    rng = np.random.default_rng(seed)
    per = 32 // bits
    order = list(rng.permutation(per)) if permuted else None
    shape = (words, rows) if axis == 0 else (rows, words)
    packed = rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)
    codes = unpack_words(packed, bits, axis, order)
    assert codes.shape[axis] == words * per
    # code per*j + k of a word is bits [bits*order[k], bits*(order[k]+1)) of word j
    positions = order if order is not None else list(range(per))
    first = packed.reshape(-1)[0].astype(np.int64) & 0xFFFFFFFF
    lane = np.moveaxis(codes, axis, -1).reshape(-1, words * per)[0]
    assert [int(lane[k]) for k in range(per)] == [(int(first) >> (bits * p)) & ((1 << bits) - 1) for p in positions]
    np.testing.assert_array_equal(pack_words(codes, bits, axis, order=order), packed)


def test_ulp_distance_counts_representable_values():
    a = np.array([1.0, -2.0, 0.0, 1000.0], np.float16)
    b = a.copy()
    assert ulp_distance(a, b) == 0
    stepped = np.nextafter(a, np.float16(np.inf))
    assert ulp_distance(a, stepped) == 1
    twice = np.nextafter(stepped, np.float16(np.inf))
    assert ulp_distance(a, twice) == 2
    assert ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32)) == 0
    across_zero = np.array([np.nextafter(np.float32(0), np.float32(-1))], np.float32)
    assert ulp_distance(np.array([np.nextafter(np.float32(0), np.float32(1))], np.float32), across_zero) == 2
    with pytest.raises(HurraySchemaError):
        ulp_distance(a, a.astype(np.float32))


def _config(quant) -> dict:
    return {"hf.file.config.json": json.dumps({"model_type": "llama", "quantization_config": quant})}


def test_quantization_config_is_read_from_the_carried_config():
    assert quantization_config({}) is None
    assert quantization_config({"hf.file.config.json": json.dumps({"model_type": "llama"})}) is None
    assert quantization_config(_config({"quant_method": "gptq", "bits": 4}))["bits"] == 4
    with pytest.raises(HurraySchemaError, match="quant_method 'marlin'"):
        quantization_config(_config({"quant_method": "marlin"}))
    with pytest.raises(HurraySchemaError, match="not a JSON object"):
        quantization_config(_config([1, 2]))
    with pytest.raises(HurraySchemaError, match="not a JSON document"):
        quantization_config({"hf.file.config.json": "{"})
    assert regroup({}, ["untouched"]) == ["untouched"]
