"""Element decoding: float16 / bfloat16 conversions bit-exact over every pattern, narrow floats,
sub-byte packing (element-types.md § Sub-Byte Integer Types, § 6-bit packing, § Boolean Type)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from support.evaluate_reference import described
from hurray_schema.evaluate import UnsupportedEvaluation, tensor_to_numpy
from hurray_schema.evaluate import elements as el
from hurray_schema.model import ElementType as E

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy warns on NaN / overflow casts
        yield


def f32_patterns():
    """Every float16-exact float32, plus every upper half with low halves around rounding boundaries
    (ties, one ulp either side, sticky bits) and a random sample: all signs, exponents, NaN payloads."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FF, 0x800, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001, 0x3000, 0x3FFF,
                     0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    rng = np.random.default_rng(7)
    extra = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([(hi[:, None] | lows[None, :]).ravel(), extra]).view(np.float32)


def test_float16_to_float32_all_patterns():
    got = el.f16_bits_to_f32_array(ALL16)
    assert np.array_equal(got.view(np.uint32), ALL16.view(np.float16).astype(np.float32).view(np.uint32))


def test_float16_round_trip_all_patterns():
    assert np.array_equal(el.f32_to_f16_bits_array(ALL16.view(np.float16).astype(np.float32)), ALL16)


@pytest.mark.parametrize("fn", ["f32_to_f16_bits_array", "f32_to_f16_bits_array_fast"])
def test_float32_to_float16_matches_numpy(fn):
    x = f32_patterns()
    assert np.array_equal(getattr(el, fn)(x), x.astype(np.float16).view(np.uint16))


def test_bfloat16_to_float32_all_patterns():
    got = el.bf16_bits_to_f32_array(ALL16)
    assert np.array_equal(got.view(np.uint32), ALL16.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32))


def test_float32_to_bfloat16_matches_ml_dtypes():
    x = f32_patterns()
    assert np.array_equal(el.f32_to_bf16_bits_array(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    y = ALL16.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(el.f32_to_bf16_bits_array(y)[~np.isnan(y)], ALL16[~np.isnan(y)])


def test_float16_addition_matches_numpy_bits():
    """Every pattern against a spread of addends (zeros, subnormals, ties, infinities, NaN payloads)."""
    addends = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x3C01, 0x1400, 0x7BFF,
                        0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFD23, 0x5640], np.uint16)
    a = np.repeat(ALL16, addends.size)
    b = np.tile(addends, ALL16.size)
    rng = np.random.default_rng(3)
    a = np.concatenate([a, rng.integers(0, 1 << 16, 1 << 20).astype(np.uint16)])
    b = np.concatenate([b, rng.integers(0, 1 << 16, 1 << 20).astype(np.uint16)])
    ref = (a.view(np.float16) + b.view(np.float16)).view(np.uint16)
    assert np.array_equal(el.f16_add_arrays(a, b), ref)


def test_bfloat16_addition_matches_ml_dtypes_bits():
    rng = np.random.default_rng(4)
    a = np.concatenate([ALL16, rng.integers(0, 1 << 16, 1 << 20).astype(np.uint16)])
    b = np.concatenate([ALL16[::-1], rng.integers(0, 1 << 16, 1 << 20).astype(np.uint16)])
    ref = (a.view(ml_dtypes.bfloat16) + b.view(ml_dtypes.bfloat16)).view(np.uint16)
    assert np.array_equal(el.bf16_add_arrays(a, b), ref)


@pytest.mark.parametrize("tag,n", [(E.FLOAT8_E4M3, 256), (E.FLOAT8_E5M2, 256), (E.FLOAT4_E2M1, 16),
                                   (E.FLOAT6_E2M3, 64), (E.FLOAT6_E3M2, 64)])
def test_narrow_float_tables_match_ml_dtypes(tag, n):
    ref = np.arange(n, dtype=np.uint8).view(el.numpy_dtype(tag)).astype(np.float32)
    got = el.minifloat_table(tag)[:n]
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(got[~np.isnan(got)].view(np.uint32), ref[~np.isnan(ref)].view(np.uint32))


def test_e8m0_table_is_power_of_two_and_reserves_00_ff():
    t = el.minifloat_table(E.FLOAT8_E8M0)
    assert np.isnan(t[0]) and np.isnan(t[255])
    assert t[127] == 1.0 and t[128] == 2.0 and t[1] == np.float32(2.0 ** -126) and t[254] == np.float32(2.0 ** 127)


def test_float4_value_map():
    """element-types.md § float4_e2m1: the OCP value map."""
    t = el.minifloat_table(E.FLOAT4_E2M1)[:16]
    assert list(t[:8]) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert list(t[8:]) == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def raw(tag, shape, data: bytes):
    return described(tag, shape, [bytes(data)])


def test_uint4_example():
    """element-types.md § 4-bit packing example: [5, 12, 3] -> 0xC5 0x03."""
    a = tensor_to_numpy(*raw(E.UINT4, (3,), b"\xC5\x03"))
    assert a.dtype == ml_dtypes.uint4 and a.astype(np.int64).tolist() == [5, 12, 3]


def test_int4_twos_complement():
    a = tensor_to_numpy(*raw(E.INT4, (4,), b"\x8F\x70"))
    assert a.dtype == ml_dtypes.int4 and a.astype(np.int64).tolist() == [-1, -8, 0, 7]


def test_uint2_example():
    """element-types.md § 2-bit packing example: [3, 1, 2] -> 0x27."""
    assert tensor_to_numpy(*raw(E.UINT2, (3,), b"\x27")).astype(np.int64).tolist() == [3, 1, 2]
    assert tensor_to_numpy(*raw(E.INT2, (4,), b"\xE4")).astype(np.int64).tolist() == [0, 1, -2, -1]


def test_bool_example():
    """element-types.md § Boolean Type example: 0x0D -> [true, false, true, true, false]."""
    a = tensor_to_numpy(*raw(E.BOOL, (5,), b"\x0D"))
    assert a.dtype == np.bool_ and a.tolist() == [True, False, True, True, False]


def test_six_bit_example():
    """element-types.md § 6-bit packing worked example: codes 1, 2, 4, 8 -> 0x81 0x40 0x20."""
    a = tensor_to_numpy(*raw(E.FLOAT6_E3M2, (4,), b"\x81\x40\x20"))
    assert a.dtype == ml_dtypes.float6_e3m2fn
    assert a.view(np.uint8).tolist() == [1, 2, 4, 8]


@pytest.mark.parametrize("tag", [E.FLOAT8_E4M3, E.FLOAT8_E5M2, E.FLOAT8_E8M0, E.FLOAT4_E2M1, E.FLOAT6_E2M3])
def test_narrow_float_arrays_keep_codes(tag):
    info_bits = {E.FLOAT4_E2M1: 4, E.FLOAT6_E2M3: 6}.get(tag, 8)
    n = 1 << info_bits
    codes = np.arange(n, dtype=np.uint8)
    if info_bits == 4:
        data = (codes[0::2] | (codes[1::2] << 4)).tobytes()
    elif info_bits == 6:
        c = codes.reshape(-1, 4).astype(np.uint32)
        w = c[:, 0] | (c[:, 1] << 6) | (c[:, 2] << 12) | (c[:, 3] << 18)
        data = np.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=1).astype(np.uint8).tobytes()
    else:
        data = codes.tobytes()
    a = tensor_to_numpy(*raw(tag, (n,), data))
    assert a.dtype == el.numpy_dtype(tag) and np.array_equal(a.view(np.uint8), codes)


@pytest.mark.parametrize("tag,np_dtype", [(E.FLOAT16, np.float16), (E.BFLOAT16, ml_dtypes.bfloat16),
                                          (E.FLOAT64, np.float64), (E.INT16, np.int16), (E.UINT64, np.uint64),
                                          (E.COMPLEX64, np.complex64)])
def test_whole_byte_types(tag, np_dtype):
    ref = (np.arange(12) * 3 - 7).astype(np_dtype).reshape(3, 4)
    a = tensor_to_numpy(*raw(tag, (3, 4), ref.tobytes()))
    assert a.dtype == np.dtype(np_dtype) and a.tobytes() == ref.tobytes()


@pytest.mark.parametrize("tag", [E.FLOAT32, E.INT4, E.BOOL, E.FLOAT6_E2M3])
def test_empty_tensors(tag):
    a = tensor_to_numpy(*raw(tag, (3, 0, 5), b""))
    assert a.shape == (3, 0, 5) and a.dtype == el.numpy_dtype(tag)


def test_float128_is_unsupported():
    with pytest.raises(UnsupportedEvaluation):
        tensor_to_numpy(*raw(E.FLOAT128, (1,), bytes(16)))


def test_short_buffer_is_rejected():
    from hurray_schema.errors import HurraySchemaError
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(*raw(E.FLOAT32, (4,), bytes(12)))
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(*raw(E.INT4, (5,), bytes(2)))


@pytest.mark.parametrize("bits", [1, 2, 4, 6, 8])
def test_gathered_codes_numpy_and_kernel_agree(monkeypatch, bits):
    """gather_codes through NumPy (elements.codes_at, a cold process's one-off) and through its kernel:
    the same codes at any element offsets, the packed types' bit order and a byte base included."""
    from hurray_schema.evaluate import elements, jit

    rng = np.random.default_rng(bits)
    buf = rng.integers(0, 256, 4096, dtype=np.uint8)
    per_byte = 8 / bits
    offsets = rng.integers(0, int(4000 * per_byte) - 8, 3000).astype(np.int64)
    got = {}
    for at_hand in (False, True):
        monkeypatch.setattr(jit.Kernel, "worth_it", lambda self, work, compile_after, index=0, at=at_hand: at)
        out = np.zeros(offsets.size, np.uint8)
        elements.gather_codes(buf, np.int64(7), offsets, np.int64(bits), out)
        got[at_hand] = out
    assert np.array_equal(got[False], got[True])
    if bits == 4:  # the LSB-first nibble order, written out (element-types.md § Sub-Byte Integer Types)
        byte = buf[7 + offsets // 2]
        assert np.array_equal(got[True], np.where(offsets % 2, byte >> 4, byte & 15))
