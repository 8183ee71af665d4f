"""Producers (builders/, evaluate/quantize.py): quantize, sparse builders, composites, spqr.

Expected codes and scales are computed here by small independent NumPy implementations of the
formulas (``quantization/*.md``); decoded values come from our evaluator (``Tensor.to_numpy``)
and are checked against the dequantization formula applied to the stored codes, and against
the input (within half a quantization step).  Descriptors go through the strict codec, and
streams / files through pyhurray's readers.
"""

from __future__ import annotations

import functools
import math
import warnings

import attrs
import hurray
import ml_dtypes
import numpy as np
import pytest
import scipy.sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hurray_schema as hs
from hurray_schema.evaluate.quantize_affine import _affine_param, _affine_params_row
from hurray_schema.codec import decode_descriptor, encode_descriptor
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.io import read_file, read_stream, write_file, write_stream
from hurray_schema.io.tensor import walk
from hurray_schema.model import (CombineOp, CompositionRule, ElementType, LayoutTag, MemberRole, Mxfp, Nf4,
                                 PerBlockAffine, PerChannelAffine, PerTensorAffine, QuantFlag)
from hurray_schema.rules.composite import validate_preorder
from hurray_schema.structs.element_types import element_type_info
from hurray_schema.structs.quantization import NF4_LEVELS

E = ElementType
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALE_DTYPES = {E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16, E.FLOAT32: np.float32}
WIDE = {E.FLOAT8_E4M3: "<u1", E.FLOAT8_E5M2: "<u1", E.INT8: "<i1", E.UINT8: "<u1", E.INT16: "<i2", E.UINT16: "<u2", E.INT32: "<i4", E.UINT32: "<u4"}
AFFINE_STORAGE = [E.INT8, E.UINT8, E.INT16, E.UINT16, E.INT32, E.UINT32, E.INT4, E.UINT4, E.INT2, E.UINT2]
BLOCK_STORAGE = [E.INT8, E.UINT8, E.INT4, E.UINT4, E.INT2, E.UINT2]
MXFP_STORAGE = [E.FLOAT8_E4M3, E.FLOAT8_E5M2, E.FLOAT4_E2M1, E.FLOAT6_E2M3, E.FLOAT6_E3M2, E.INT8, E.INT4]
ML_DTYPES = {E.FLOAT8_E4M3: ml_dtypes.float8_e4m3fn, E.FLOAT8_E5M2: ml_dtypes.float8_e5m2,
             E.FLOAT4_E2M1: ml_dtypes.float4_e2m1fn, E.FLOAT6_E2M3: ml_dtypes.float6_e2m3fn,
             E.FLOAT6_E3M2: ml_dtypes.float6_e3m2fn}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


# ------------------------------------------------------------------------------------
# Independent references
# ------------------------------------------------------------------------------------


def unpack(buf, storage, count) -> np.ndarray:
    """``count`` codes (int64, sign-extended for signed types) from packed storage bytes
    (``element-types.md``: LSB first; 6-bit types four in three bytes)."""
    info = element_type_info(storage)
    raw = np.frombuffer(bytes(buf), np.uint8)
    bits = info.bit_width
    if bits >= 8:
        return np.frombuffer(bytes(buf), WIDE[storage], count).astype(np.int64)
    if bits == 6:
        groups = raw[: -(-count // 4) * 3].reshape(-1, 3).astype(np.uint32)
        word = groups[:, 0] | (groups[:, 1] << 8) | (groups[:, 2] << 16)
        codes = np.stack([(word >> (6 * k)) & 63 for k in range(4)], axis=1).reshape(-1)[:count].astype(np.int64)
    else:
        per = 8 // bits
        codes = np.stack([(raw >> (bits * k)) & ((1 << bits) - 1) for k in range(per)], axis=1).reshape(-1)
        codes = codes[:count].astype(np.int64)
    if info.is_signed and not info.is_float:
        codes = np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
    return codes


def storage_range(storage, symmetric):
    """The storage type's code range; 32-bit types keep |x / s| < 2**24 (exact float32 integers)."""
    info = element_type_info(storage)
    bits = info.bit_width
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if info.is_signed else (0, (1 << bits) - 1)
    if bits == 32:
        if symmetric:
            lo, hi = max(lo, -2 ** 24), 2 ** 24 - 1
        else:
            lo, hi = (-2 ** 23, 2 ** 23 - 1) if info.is_signed else (0, 2 ** 24 - 1)
    return lo, hi


def padded_shape(shape, axis, block):
    s = list(shape)
    s[axis] = -(-s[axis] // block) * block
    return tuple(s)


def block_index(shape, axis, block):
    """Parameter index of every element (``per-block-affine.md § Block Layout``)."""
    idx = np.indices(shape)
    others = [d for d in range(len(shape)) if d != axis]
    outer = np.zeros(shape, np.int64)
    for d in others:
        outer = outer * shape[d] + idx[d]
    nb = -(-shape[axis] // block)
    return outer * nb + idx[axis] // block


def expected_affine_codes(x, s_elem, z_elem, lo, hi):
    """``clamp(rint(float32(x) / s) + z, lo, hi)`` in float32, ties to even."""
    q = np.rint(x.astype(np.float32) / s_elem.astype(np.float32)).astype(np.int64) + z_elem
    return np.clip(q, lo, hi)


def dequantize(codes, s_elem, z_elem, out_dtype):
    """``float32(int32(q - z)) * s`` rounded once to the decoded type."""
    d = (codes - z_elem).astype(np.int32).astype(np.float32) * s_elem.astype(np.float32)
    return d.astype(out_dtype)


def half_step_ok(decoded, x, s_elem, out_dtype):
    """Every decoded element within half a step of x, allowing the float32 product's and the decoded
    type's rounding."""
    d = np.asarray(decoded, np.float64)
    xs = x.astype(np.float32).astype(np.float64)
    slack = np.spacing(np.abs(d).astype(out_dtype)).astype(np.float64) + np.spacing(np.abs(xs).astype(np.float32))
    return np.all(np.abs(d - xs) <= s_elem.astype(np.float64) * (0.5 + 1e-6) + slack)


def next_below(value, dtype):
    """The largest value of ``dtype`` below positive ``value``."""
    v = np.asarray(value, dtype)
    bits = v.view(np.uint16 if v.itemsize == 2 else np.uint32)
    return (bits - 1).view(dtype).astype(np.float64)


def roundtrip(desc):
    assert decode_descriptor(encode_descriptor(desc)) == desc


def same_as_pyhurray(ours, theirs):
    """Same descriptor bytes and buffer bytes, recursively through composite members."""
    assert encode_descriptor(ours.descriptor) == theirs.descriptor.encode()
    if isinstance(ours, hs.Composite):
        assert isinstance(theirs, hurray.Composite) and len(theirs.members) == len(ours.members)
        for a, b in zip(ours.members, theirs.members):
            same_as_pyhurray(a, b)
    else:
        assert [bytes(v) for v in ours.buffers] == [np.asarray(theirs.buffer(i)).tobytes()
                                                    for i in range(theirs.buffer_count)]


def reads_in_pyhurray(item):
    """pyhurray reads what write_stream writes: same descriptors and buffers."""
    back = list(hurray.StreamReader(write_stream(None, [item])))
    assert len(back) == 1
    same_as_pyhurray(item, back[0])


# ------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------


def float_arrays(shape, dtype=np.float32, bound=1000.0, nonnegative=False):
    width = 16 if dtype == np.float16 else 32
    low = 0.0 if nonnegative else -bound
    return hnp.arrays(dtype, shape, elements=st.floats(low, bound, width=width, allow_nan=False,
                                                       allow_infinity=False, allow_subnormal=False))


shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=24)


@st.composite
def affine_case(draw, per_block=False):
    storage = draw(st.sampled_from(BLOCK_STORAGE if per_block else AFFINE_STORAGE))
    symmetric = draw(st.booleans())
    shape = draw(shapes)
    axis = draw(st.integers(0, len(shape) - 1))
    if per_block and shape[axis] < 2:
        shape = tuple(2 if d == axis else n for d, n in enumerate(shape))
    dtype = draw(st.sampled_from([np.float16, np.float32]))
    unsigned_symmetric = symmetric and not element_type_info(storage).is_signed
    x = draw(float_arrays(shape, dtype, nonnegative=unsigned_symmetric))
    return storage, symmetric, axis, x


# ------------------------------------------------------------------------------------
# quantize: per-tensor, per-channel, per-block affine
# ------------------------------------------------------------------------------------


def check_common(t, x):
    roundtrip(t.descriptor)
    assert t.shape == x.shape


@SETTINGS
@given(affine_case())
def test_per_tensor(case):
    storage, symmetric, _, x = case
    t = hs.quantize(x, "per_tensor", storage=storage, symmetric=symmetric)
    check_common(t, x)
    q = t.descriptor.quantization
    assert isinstance(q, PerTensorAffine) and t.type_tag == storage
    lo, hi = storage_range(storage, symmetric)
    s, z = np.float32(q.scale), q.zero_point
    xd = x.astype(np.float64)
    if symmetric:
        assert z == 0
        need = np.abs(xd).max() / hi
    else:
        need = (max(xd.max(), 0) - min(xd.min(), 0)) / (hi - lo)
    assert s >= need and (need == 0 or next_below(s, np.float32) < need)  # smallest float32 scale above
    codes = unpack(t.buffers[0], storage, x.size).reshape(x.shape)
    s_elem, z_elem = np.full(x.shape, s), np.full(x.shape, z, np.int64)
    assert np.array_equal(codes, expected_affine_codes(x, s_elem, z_elem, lo, hi))
    decoded = t.to_numpy()
    assert decoded.dtype == np.float32
    assert np.array_equal(decoded, dequantize(codes, s_elem, z_elem, np.float32))
    assert half_step_ok(decoded, x, s_elem, np.float32)


@SETTINGS
@given(affine_case())
def test_per_channel(case):
    storage, symmetric, axis, x = case
    t = hs.quantize(x, "per_channel", storage=storage, symmetric=symmetric, axis=axis)
    check_common(t, x)
    q = t.descriptor.quantization
    assert isinstance(q, PerChannelAffine) and q.axis == axis
    assert bool(q.flags & QuantFlag.SYMMETRIC) == symmetric
    lo, hi = storage_range(storage, symmetric)
    n = x.shape[axis]
    scales = np.frombuffer(bytes(t.buffers[1]), "<f4", n)
    zps = np.zeros(n, np.int64) if symmetric else np.frombuffer(bytes(t.buffers[2]), "<i4", n).astype(np.int64)
    assert np.all((zps >= lo) & (zps <= hi))
    idx = np.indices(x.shape)[axis]
    s_elem, z_elem = scales[idx], zps[idx]
    codes = unpack(t.buffers[0], storage, x.size).reshape(x.shape)
    assert np.array_equal(codes, expected_affine_codes(x, s_elem, z_elem, lo, hi))
    decoded = t.to_numpy()
    assert np.array_equal(decoded, dequantize(codes, s_elem, z_elem, np.float32))
    assert half_step_ok(decoded, x, s_elem, np.float32)


@SETTINGS
@given(affine_case(per_block=True), st.sampled_from([E.FLOAT16, E.BFLOAT16, E.FLOAT32]), st.sampled_from([2, 4, 8, 16]))
def test_per_block(case, scale_type, block):
    storage, symmetric, axis, x = case
    block = min(block, 1 << (x.shape[axis].bit_length() - 1))
    t = hs.quantize(x, "per_block", storage=storage, symmetric=symmetric, axis=axis, block_size=block,
                    scale_type=scale_type)
    check_common(t, x)
    q = t.descriptor.quantization
    assert isinstance(q, PerBlockAffine) and (q.axis, q.block_size, q.scale_type_tag) == (axis, block, scale_type)
    lo, hi = storage_range(storage, symmetric)
    pidx = block_index(x.shape, axis, block)
    nblocks = int(pidx.max()) + 1
    scales = np.frombuffer(bytes(t.buffers[1]), SCALE_DTYPES[scale_type], nblocks).astype(np.float64)
    zps = np.zeros(nblocks, np.int64) if symmetric else np.frombuffer(bytes(t.buffers[2]), "<i4",
                                                                      nblocks).astype(np.int64)
    # each scale: the smallest of its type at or above the block's need
    xb = x.astype(np.float64)
    for b in range(nblocks):
        vals = xb[pidx == b]
        need = np.abs(vals).max() / hi if symmetric else (max(vals.max(), 0) - min(vals.min(), 0)) / (hi - lo)
        assert scales[b] >= need
        assert need == 0 or next_below(scales[b], SCALE_DTYPES[scale_type]) < need
    sshape = padded_shape(x.shape, axis, block)
    stored = unpack(t.buffers[0], storage, math.prod(sshape)).reshape(sshape)
    codes = stored[tuple(slice(0, n) for n in x.shape)]
    pad = np.ones(sshape, bool)
    pad[tuple(slice(0, n) for n in x.shape)] = False
    assert not stored[pad].any()  # padding codes are zero bytes (§ Padding)
    s_elem, z_elem = scales[pidx], zps[pidx]
    assert np.array_equal(codes, expected_affine_codes(x, s_elem, z_elem, lo, hi))
    out_dtype = SCALE_DTYPES[scale_type]
    decoded = t.to_numpy()
    assert decoded.dtype == out_dtype
    assert np.array_equal(decoded.view(np.uint8), dequantize(codes, s_elem, z_elem, out_dtype).view(np.uint8))
    assert half_step_ok(decoded, x, s_elem, out_dtype)


@pytest.mark.parametrize("storage", [E.INT8, E.INT4, E.INT2])
@pytest.mark.parametrize("scheme", ["per_tensor", "per_channel", "per_block"])
def test_representable_values_are_exact(storage, scheme):
    """Multiples of a power of two whose largest magnitude is hi * step decode exactly."""
    rng = np.random.default_rng(7)
    _, hi = storage_range(storage, True)
    x = (rng.integers(-hi, hi + 1, size=(8, 32)) * 0.125).astype(np.float16)
    x[:, ::4] = hi * 0.125  # every block (and row, and the tensor) reaches the top code
    t = hs.quantize(x, scheme, storage=storage, axis=0 if scheme == "per_channel" else -1, block_size=4)
    assert np.array_equal(t.to_numpy().astype(np.float64), x.astype(np.float64))


@pytest.mark.parametrize("storage", [E.INT32, E.UINT32])
def test_32_bit_codes_keep_float32_quotients_integral(storage):
    """A range of 2**31 codes would round x / s in float32 to multiples of 128: the top element of
    [-390, 0.99999] came out 7 steps off before the range was narrowed to 2**24 codes."""
    x = np.array([[-390.0, 0.99999]], np.float32)
    t = hs.quantize(x, "per_channel", storage=storage, symmetric=False, axis=0)
    s = np.frombuffer(bytes(t.buffers[1]), "<f4")[0]
    assert np.all(np.abs(t.to_numpy() - x) <= s / 2 + np.spacing(np.abs(x)))


def test_unsigned_symmetric_refuses_negative_values():
    with pytest.raises(HurraySchemaError, match="symmetric=False"):
        hs.quantize(np.array([-1.0, 1.0], np.float32), "per_tensor", storage="uint8", symmetric=True)


def test_defaults_and_names():
    x = np.linspace(-1, 1, 256, dtype=np.float16).reshape(2, 128)
    t = hs.quantize(x)
    assert t.type_tag == E.INT4 and t.descriptor.quantization.block_size == 64
    assert t.descriptor.quantization.scale_type_tag == E.FLOAT16 and t.to_numpy().dtype == np.float16
    assert hs.quantize(x, "per_block", storage=E.UINT4).descriptor.quantization.zero_point_buffer_index == 2
    assert hs.quantize(x[:, :5], "per_block").descriptor.quantization.block_size == 4  # shorter axis
    with pytest.raises(HurraySchemaError):
        hs.quantize(x, "gptq")


def test_bad_inputs_raise_typed_errors():
    with pytest.raises(HurraySchemaError, match="NaN"):
        hs.quantize(np.array([[1.0, np.nan]], np.float32), "per_block", block_size=2)
    with pytest.raises(HurraySchemaError, match="NaN"):
        hs.quantize(np.array([np.inf, 1.0], np.float32), "per_tensor")
    with pytest.raises(SpecViolation):  # block_size above shape[axis] (per-block-affine.md § Validity)
        hs.quantize(np.ones((4, 4), np.float32), "per_block", block_size=8)
    with pytest.raises(SpecViolation):  # storage not valid for per-block affine
        hs.quantize(np.ones((4, 4), np.float32), "per_block", storage="int16", block_size=4)
    with pytest.raises(HurraySchemaError, match="scale_type"):  # float16 scales overflow
        hs.quantize(np.array([1e30, 1.0], np.float32), "per_block", block_size=2, scale_type="float16")


def test_empty_arrays():
    for scheme in ("per_tensor", "per_channel", "per_block"):
        t = hs.quantize(np.zeros((3, 0), np.float32), scheme, axis=0 if scheme == "per_channel" else -1)
        assert t.to_numpy().shape == (3, 0)
        roundtrip(t.descriptor)


# ------------------------------------------------------------------------------------
# NF4 and MXFP
# ------------------------------------------------------------------------------------


@SETTINGS
@given(shapes, st.sampled_from([8, 16, 32]), st.data())
def test_nf4(shape, block, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    shape = tuple(max(n, block) if d == axis else n for d, n in enumerate(shape))
    x = data.draw(float_arrays(shape, data.draw(st.sampled_from([np.float16, np.float32]))))
    t = hs.quantize(x, "nf4", axis=axis, block_size=block)
    check_common(t, x)
    assert isinstance(t.descriptor.quantization, Nf4) and t.type_tag == E.UINT4
    pidx = block_index(shape, axis, block)
    nblocks = int(pidx.max()) + 1
    scales = np.frombuffer(bytes(t.buffers[1]), "<f4", nblocks)
    xf = x.astype(np.float32)
    absmax = np.array([np.abs(xf[pidx == b]).max() for b in range(nblocks)], np.float32)
    assert np.array_equal(scales, np.where(absmax > 0, absmax, np.float32(1)))
    sshape = padded_shape(shape, axis, block)
    codes = unpack(t.buffers[0], E.UINT4, math.prod(sshape)).reshape(sshape)[tuple(slice(0, n) for n in shape)]
    cand = scales[pidx][..., None] * np.array(NF4_LEVELS, np.float32)  # float32 products, as decoded
    assert np.array_equal(codes, np.argmin(np.abs(cand - xf[..., None]), axis=-1))
    decoded = t.to_numpy()
    assert np.array_equal(decoded, np.take_along_axis(cand, codes[..., None], -1)[..., 0])
    gaps = np.diff(np.array(NF4_LEVELS, np.float64)).max()
    assert np.all(np.abs(decoded - xf) <= scales[pidx] * gaps / 2 * (1 + 1e-6))


def mxfp_expected(xf, block_axis_blocks, storage):
    """(scale exponent bytes, codes) per the rule of evaluate/quantize.py, in NumPy."""
    info = element_type_info(storage)
    if info.is_float:
        finite = ml_dtypes.finfo(ML_DTYPES[storage]).max
        emax = float(finite)
    else:
        emax = float((1 << (info.bit_width - 1)) - 1)
    amax = np.abs(block_axis_blocks).max(axis=-1).astype(np.float64)
    k = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1) / emax)), 0)
    k = np.where(amax > emax * 2.0 ** k, k + 1, k)
    k = np.where((amax > 0) & (amax <= emax * 2.0 ** (k - 1)), k - 1, k)
    e = np.clip(127 + k, 1, 254).astype(np.int64)
    s = (2.0 ** (e - 127)).astype(np.float32)
    y = block_axis_blocks / s[..., None]
    if info.is_float:
        codes = y.astype(ML_DTYPES[storage]).view(np.uint8).astype(np.int64)
    else:
        lo, hi = -(1 << (info.bit_width - 1)), (1 << (info.bit_width - 1)) - 1
        codes = np.clip(np.rint(y), lo, hi).astype(np.int64)
    return e, codes, s


@SETTINGS
@given(st.sampled_from(MXFP_STORAGE), st.sampled_from([16, 32]), st.integers(1, 3), st.integers(1, 5), st.data())
def test_mxfp(storage, block, nblocks, rows, data):
    x = data.draw(float_arrays((rows, block * nblocks), data.draw(st.sampled_from([np.float16, np.float32]))))
    t = hs.quantize(x, "mxfp", storage=storage, block_size=block)
    check_common(t, x)
    assert isinstance(t.descriptor.quantization, Mxfp) and t.type_tag == storage
    xf = x.astype(np.float32).reshape(rows, nblocks, block)
    e, codes, s = mxfp_expected(xf, xf, storage)
    assert np.array_equal(np.frombuffer(bytes(t.buffers[1]), np.uint8), e.reshape(-1))
    info = element_type_info(storage)
    stored = unpack(t.buffers[0], storage, x.size).reshape(rows, nblocks, block)
    if info.is_float:
        assert np.array_equal(stored, codes)
        values = codes.astype(np.uint8).view(ML_DTYPES[storage]).astype(np.float32)
    else:
        assert np.array_equal(stored, codes)
        values = codes.astype(np.float32)
    decoded = t.to_numpy()
    assert np.array_equal(decoded, (values * s[..., None]).reshape(rows, -1))


def test_mxfp_other_axis_and_partial_block():
    x = np.random.default_rng(3).standard_normal((32, 3)).astype(np.float32)
    t = hs.quantize(x, "mxfp", axis=0, block_size=16, storage="float4_e2m1")
    assert np.allclose(t.to_numpy(), x, atol=np.abs(x).max() / 2)
    with pytest.raises(SpecViolation):  # no partial MXFP block (mxfp.md § Validity Constraints)
        hs.quantize(np.ones((2, 40), np.float32), "mxfp", block_size=16)


# ------------------------------------------------------------------------------------
# Interop: strict codec, our readers, pyhurray
# ------------------------------------------------------------------------------------

ONE_OF_EACH = [
    ("per_tensor", {"storage": "int8"}), ("per_tensor", {"storage": "uint4", "symmetric": False}),
    ("per_channel", {"axis": 0}), ("per_channel", {"axis": 1, "storage": "int4", "symmetric": False}),
    ("per_block", {}), ("per_block", {"axis": 0, "storage": "uint2", "symmetric": False, "scale_type": "float32"}),
    ("per_block", {"scale_type": "bfloat16"}), ("nf4", {}), ("mxfp", {}), ("mxfp", {"storage": "float4_e2m1"}),
    ("mxfp", {"storage": "int8"}),
]


@pytest.mark.parametrize("scheme,kwargs", ONE_OF_EACH)
def test_written_quantized_tensors_read_back_here_and_in_pyhurray(scheme, kwargs, tmp_path):
    x = np.random.default_rng(11).standard_normal((64, 96)).astype(np.float16)
    t = hs.quantize(x, scheme, name="w", **kwargs)
    reads_in_pyhurray(t)
    (back,) = list(read_stream(write_stream(None, [t])))
    assert back.same_content(t)
    write_file(tmp_path / "q.hrry", {"w": t})
    loaded = hurray.load(str(tmp_path / "q.hrry"))["w"]
    assert loaded.descriptor.encode() == encode_descriptor(t.descriptor)
    with read_file(tmp_path / "q.hrry") as f:
        assert np.array_equal(f["w"].to_numpy(), t.to_numpy())


# ------------------------------------------------------------------------------------
# Sparse builders
# ------------------------------------------------------------------------------------


@SETTINGS
@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=8), st.booleans(), st.data())
def test_coo(shape, sort, data):
    size = math.prod(shape)
    flat = data.draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size))
    coords = np.stack(np.unravel_index(np.array(flat, np.int64), shape), axis=1) if flat else np.zeros((0, len(shape)),
                                                                                                      np.int64)
    values = np.arange(1, len(flat) + 1, dtype=np.float32)
    t = hs.sparse_coo(coords, values, shape, sort=sort)
    roundtrip(t.descriptor)
    assert t.descriptor.layout.is_sorted == (1 if sort else 0)
    dense = np.zeros(shape, np.float32)
    dense[tuple(coords.T)] = values
    assert np.array_equal(t.to_numpy(), dense)
    stored = np.frombuffer(bytes(t.buffers[1]), "<u8").reshape(-1, len(shape))
    order = np.argsort(np.array(flat, np.int64)) if sort else np.arange(len(flat))
    assert np.array_equal(stored, coords[order]) and np.array_equal(np.frombuffer(bytes(t.buffers[0]), "<f4"),
                                                                    values[order])


def test_coo_rejects_duplicates_and_out_of_bounds():
    with pytest.raises(HurraySchemaError, match="twice"):
        hs.sparse_coo([[0, 1], [0, 1]], [1.0, 2.0], (2, 2), sort=False)
    with pytest.raises(HurraySchemaError, match="out of bounds"):
        hs.sparse_coo([[2, 0]], [1.0], (2, 2))
    with pytest.raises(HurraySchemaError):
        hs.sparse_coo([[0, 0]], [1.0, 2.0], (2, 2))


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil"])
def test_from_scipy(fmt):
    m = scipy.sparse.random(7, 9, density=0.3, format="csr", random_state=5, dtype=np.float32).asformat(fmt)
    t = hs.from_scipy(m)
    roundtrip(t.descriptor)
    want = {"csr": LayoutTag.CSR, "csc": LayoutTag.CSC, "coo": LayoutTag.COO, "lil": LayoutTag.CSR}[fmt]
    assert t.descriptor.layout_tag == want
    assert np.array_equal(t.to_numpy(), m.toarray())
    reads_in_pyhurray(t)


def test_csr_csc_from_arrays_sort_within_rows():
    # row 0 holds columns 3 then 1 (unsorted): stored sorted
    t = hs.sparse_csr(np.array([5.0, 7.0], np.float32), [3, 1], [0, 2, 2], (2, 4))
    assert np.frombuffer(bytes(t.buffers[1]), "<u8").tolist() == [1, 3]
    assert t.to_numpy().tolist() == [[0, 7, 0, 5], [0, 0, 0, 0]]
    c = hs.sparse_csc(np.array([1, 2, 3], np.int32), [1, 0, 2], [0, 1, 3], (3, 2))
    assert c.to_numpy().tolist() == [[0, 2], [1, 0], [0, 3]]
    with pytest.raises(HurraySchemaError, match="twice"):
        hs.sparse_csr(np.ones(2, np.float32), [1, 1], [0, 2], (1, 4))
    with pytest.raises(HurraySchemaError, match="pointer"):
        hs.sparse_csr(np.ones(2, np.float32), [0, 1], [0, 1], (1, 4))


# ------------------------------------------------------------------------------------
# Composites
# ------------------------------------------------------------------------------------


def test_partition_grid_dense_members_is_the_array():
    x = np.arange(7 * 10, dtype=np.float32).reshape(7, 10)
    c = hs.partition(x, grid=(3, 2))
    assert c.rule == CompositionRule.PARTITION and len(c.members) == 6
    assert [m.descriptor.shard.shard_offset for m in c.members][:3] == [(0, 0), (0, 5), (3, 0)]
    assert all(m.descriptor.shard.parent_shape == (7, 10) for m in c.members)
    assert np.array_equal(c.materialize(), x)
    reads_in_pyhurray(c)


def test_partition_boxes_with_quantized_members():
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float16)
    boxes = [((0, 0), (16, 32)), ((0, 32), (8, 32)), ((8, 32), (8, 32))]
    c = hs.partition(x, boxes=boxes, member=lambda a: hs.quantize(a, "per_block", block_size=16))
    assert c.type_tag == E.FLOAT16
    merged = c.materialize()
    for (off, shp), m in zip(boxes, c.members):
        region = tuple(slice(o, o + n) for o, n in zip(off, shp))
        alone = hs.Tensor(attrs.evolve(m.descriptor, shard=None), m.buffers)
        assert np.array_equal(merged[region], alone.to_numpy())
    reads_in_pyhurray(c)


def test_partition_with_a_gap_is_refused():
    with pytest.raises(SpecViolation):
        hs.partition(np.zeros((4, 4), np.float32), boxes=[((0, 0), (4, 2))])


def test_overlay_and_group():
    base = np.zeros((4, 6), np.float32)
    patch = np.ones((2, 2), np.float32)
    o = hs.overlay(base, [(patch, (1, 3))], "add")
    assert o.combine_op == CombineOp.ADD
    assert [m.descriptor.composite_member.member_role for m in o.members] == [MemberRole.BASE, MemberRole.CORRECTION]
    want = base.copy()
    want[1:3, 3:5] += 1
    assert np.array_equal(o.materialize(), want)
    reads_in_pyhurray(o)
    g = hs.group({"a": np.arange(3, dtype=np.int32), "b": hs.quantize(np.ones((2, 8), np.float16))})
    assert g.rule == CompositionRule.GROUP and [m.name for m in g.members] == ["a", "b"]
    assert all(m.descriptor.composite_member is None for m in g.members)
    reads_in_pyhurray(g)


def binder_accepts(composite):
    """The composite binder (strict) finds nothing in a fresh pre-order walk of ``composite``."""
    assert validate_preorder(node.descriptor for _name, node in walk(composite)) == []


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), pieces=st.tuples(st.integers(1, 4), st.integers(1, 4)))
@SETTINGS
def test_composite_partition_grid_cuts_as_array_split(rows, cols, pieces):
    x = np.arange(rows * cols, dtype=np.int32).reshape(rows, cols)
    c = hs.Composite.partition(x, grid=pieces)
    expected = [block for band in np.array_split(x, pieces[0], axis=0) for block in np.array_split(band, pieces[1], axis=1)]
    assert [m.to_numpy().tolist() for m in c.members] == [b.tolist() for b in expected]
    for m, b in zip(c.members, expected):
        offset = m.descriptor.shard.shard_offset
        assert np.array_equal(x[offset[0]:offset[0] + b.shape[0], offset[1]:offset[1] + b.shape[1]], b)
    assert c.same_content(hs.partition(x, grid=pieces))
    assert np.array_equal(c.materialize(), x)
    binder_accepts(c)


def test_composite_partition_members_from_a_callable_nested_composites_too():
    x = np.random.default_rng(5).standard_normal((8, 32)).astype(np.float16)
    boxes = [((0, 0), (8, 16)), ((0, 16), (8, 16))]

    def member(a):
        patch = np.zeros((1, 1), np.float16) + a[0, 0]
        return hs.Composite.overlay(hs.quantize(a, "per_block", block_size=16), [(patch, (0, 0))])

    c = hs.Composite.partition(x, boxes=boxes, member=member)
    assert c.same_content(hs.partition(x, boxes=boxes, member=member))
    assert all(isinstance(m, hs.Composite) and m.descriptor.composite_member is None for m in c.members)
    assert [m.descriptor.shard.shard_offset for m in c.members] == [(0, 0), (0, 16)]
    merged = c.materialize()
    assert merged.dtype == np.float16 and merged[0, 0] == x[0, 0] and merged[0, 16] == x[0, 16]
    binder_accepts(c)
    (back,) = list(read_stream(write_stream(None, [c])))
    assert back.same_content(c)


def test_composite_partition_refuses_bad_arguments():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x, grid=2, boxes=[((0, 0), (4, 4))])
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x)
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x, grid=(2, 0))
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x, grid=2, member=lambda a: hs.Tensor.from_numpy(a[:1]))
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x, grid=2, member=lambda a: a)
    with pytest.raises(HurraySchemaError):
        hs.Composite.partition(x, grid=2, type_tag="no_such_type")
    with pytest.raises(SpecViolation):  # members of another type than the head's
        hs.Composite.partition(x, grid=2, type_tag="float16")


@pytest.mark.parametrize("combine_op", ["replace", "add", CombineOp.ADD, 1])
def test_composite_overlay_equals_the_function_and_merges(combine_op):
    base = np.full((4, 6), 2, np.float32)
    patch = np.full((2, 3), 3, np.float32)
    o = hs.Composite.overlay(base, [(patch, (2, 1)), np.ones((4, 6), np.float32)], combine_op, type_tag="float32")
    assert o.same_content(hs.overlay(base, [(patch, (2, 1)), np.ones((4, 6), np.float32)], combine_op))
    assert [m.descriptor.composite_member.member_role for m in o.members] == \
        [MemberRole.BASE, MemberRole.CORRECTION, MemberRole.CORRECTION]
    assert [m.descriptor.shard.shard_offset for m in o.members] == [(0, 0), (2, 1), (0, 0)]
    want = base.copy()
    apply = np.add if combine_op in ("add", CombineOp.ADD) else (lambda _below, above: above)
    want[2:4, 1:4] = apply(want[2:4, 1:4], patch)
    want = apply(want, np.ones((4, 6), np.float32))
    assert np.array_equal(o.materialize(), want)
    binder_accepts(o)
    reads_in_pyhurray(o)


def test_composite_overlay_refuses_a_correction_outside_the_view():
    with pytest.raises(SpecViolation):
        hs.Composite.overlay(np.zeros((4, 4), np.float32), [(np.ones((2, 2), np.float32), (3, 3))])


def test_composite_group_equals_the_function_and_drops_member_sections():
    overlay = hs.Composite.overlay(np.zeros((2, 2), np.float32), [np.ones((2, 2), np.float32)])
    base = overlay.members[0]  # carries a shard and a Composite Member section
    items = {"base": base, "ov": overlay, "codes": hs.quantize(np.ones((2, 8), np.float16))}
    g = hs.Composite.group(items)
    assert g.same_content(hs.group(items))
    assert (g.rule, g.shape, g.type_tag) == (CompositionRule.GROUP, (2, 2), E.FLOAT32)
    assert [m.name for m in g.members] == ["base", "ov", "codes"]
    assert g.members[0].descriptor.composite_member is None and g.members[0].descriptor.shard == base.descriptor.shard
    assert g.members[1].same_content(overlay)
    parts = g.materialize()
    assert np.array_equal(parts[1], np.ones((2, 2), np.float32)) and parts[2].dtype == np.float16
    binder_accepts(g)
    reads_in_pyhurray(g)


# ------------------------------------------------------------------------------------
# SpQR
# ------------------------------------------------------------------------------------


def spqr_weight():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((256, 256)) * 0.02).astype(np.float16)
    w[rng.integers(0, 256, 40), rng.integers(0, 256, 40)] = (rng.choice([-1, 1], 40) * 3).astype(np.float16)
    return w


def test_spqr_replace_exact_outliers_and_half_step_elsewhere():
    w = spqr_weight()
    c = hs.spqr(w)
    assert c.rule == CompositionRule.OVERLAY and c.combine_op == CombineOp.REPLACE and c.type_tag == E.FLOAT16
    base, corr = c.members
    q = base.descriptor.quantization
    assert (base.type_tag, q.block_size, q.scale_type_tag, corr.descriptor.layout_tag) == \
        (E.INT4, 64, E.FLOAT16, LayoutTag.COO)
    assert corr.descriptor.layout.is_sorted == 1 and 0 < corr.descriptor.layout.nnz <= round(0.01 * w.size)
    idx = np.frombuffer(bytes(corr.buffers[1]), "<u8").reshape(-1, 2).astype(np.int64)
    outlier = np.zeros(w.shape, bool)
    outlier[tuple(idx.T)] = True
    assert outlier[np.abs(w) == 3].all()  # every planted outlier is stored exactly
    merged = c.materialize()
    assert merged.dtype == np.float16
    assert np.array_equal(merged[outlier], w[outlier])
    scales = np.frombuffer(bytes(base.buffers[1]), np.float16).astype(np.float64).reshape(256, 4)
    s_elem = np.repeat(scales, 64, axis=1)
    # each scale is the smallest float16 at or above absmax(non-outliers) / 7 of its block
    kept = np.where(outlier, 0, np.abs(w.astype(np.float64))).reshape(256, 4, 64).max(axis=2) / 7
    assert np.all(scales >= kept) and np.all(next_below(scales, np.float16) < kept)
    rest = ~outlier
    err = np.abs(merged.astype(np.float64) - w.astype(np.float64))
    assert np.all(err[rest] <= s_elem[rest] / 2 + np.spacing(np.abs(w[rest])).astype(np.float64))
    reads_in_pyhurray(c)


def test_spqr_add_and_stream_round_trip():
    w = spqr_weight()
    c = hs.spqr(w, combine_op="add", name="w")
    merged = c.materialize()
    idx = np.frombuffer(bytes(c.members[1].buffers[1]), "<u8").reshape(-1, 2).astype(np.int64)
    at = tuple(idx.T)
    assert np.all(np.abs(merged[at].astype(np.float64) - w[at]) <= 2 * np.spacing(np.abs(w[at])).astype(np.float64))
    (back,) = list(read_stream(write_stream(None, [c])))
    assert back.same_content(c)
    assert np.array_equal(back.materialize(), merged)


# ------------------------------------------------------------------------------------
# The fused 4-bit kernel: vector steps against the scalar path, bit for bit
# ------------------------------------------------------------------------------------

INPUT_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32]
SPECIAL_VALUES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-3, -1e-3, 60000.0, -60000.0]


@st.composite
def int4_kernel_case(draw):
    """(rows x cols array with NaN / infinity / zeros / extremes mixed in, block, mask or None)."""
    dtype = draw(st.sampled_from(INPUT_DTYPES))
    block = draw(st.sampled_from([16, 32, 48, 64, 18]))
    rows = draw(st.sampled_from([1, 2, 3, 4, 67, 130]))  # more rows than the kernel's runs of rows too
    cols = draw(st.integers(1, 3 * block))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # 1e-38 and 1e6: subnormal float32 / bfloat16 scales, scales past float16's range
    x = rng.standard_normal((rows, cols)) * draw(st.sampled_from([1e-38, 1e-4, 0.02, 1.0, 300.0, 1e6]))
    special = rng.random((rows, cols)) < draw(st.sampled_from([0.0, 0.0, 0.002, 0.05]))
    x[special] = rng.choice(SPECIAL_VALUES, int(special.sum()))
    if draw(st.booleans()):
        x[:, : min(cols, block)] = 0.0  # an all-zero first block: scale 1
    mask = rng.random(rows * cols) < 0.05 if draw(st.booleans()) else None
    if mask is not None and draw(st.booleans()):
        mask |= ~np.isfinite(x.reshape(-1))  # NaN / infinity only where masked
    return x.astype(dtype), block, mask


@SETTINGS
@given(int4_kernel_case(), st.sampled_from([E.INT4, E.UINT4]), st.booleans(),
       st.sampled_from([E.FLOAT16, E.BFLOAT16, E.FLOAT32]))
def test_int4_vector_steps_match_the_scalar_path(case, storage, symmetric, scale_type):
    from hurray_schema.evaluate import quantize as kernels

    x, block, mask = case
    if storage == E.UINT4 and symmetric:
        symmetric = False  # unsigned symmetric codes are refused before the kernel
    lo, hi = kernels.code_range(storage, symmetric)
    padded = -(-x.shape[1] // block) * block
    args = (x, block, padded, lo, hi, symmetric, scale_type, 4, np.uint8)
    fast = kernels.affine_quantize(*args, mask=mask)
    slow = kernels.affine_quantize(*args, mask=mask, vector=False)
    assert np.array_equal(fast[0], slow[0])
    assert np.array_equal(fast[1].view(np.uint32), slow[1].view(np.uint32))
    assert np.array_equal(fast[2], slow[2])
    assert fast[3:] == slow[3:]


def test_int4_vector_steps_on_the_benchmark_shape_match_numpy():
    """Whole blocks of 64 (the vector path) against a NumPy quantizer written from the formula."""
    from hurray_schema.evaluate import quantize as kernels

    w = (np.random.default_rng(3).standard_normal((64, 1024)) * 0.02).astype(np.float16)
    lo, hi = kernels.code_range(E.INT4, True)
    codes, scales, _, finite, over = kernels.affine_quantize(w, 64, 1024, lo, hi, True, E.FLOAT16, 4, np.uint8)
    x = w.astype(np.float32).reshape(64, 16, 64)
    need = np.abs(x).max(axis=2).astype(np.float64) / hi
    s = need.astype(np.float16)
    low = s.astype(np.float64) < need
    s[low] = np.nextafter(s[low], np.float16(np.inf))
    q = np.clip(np.rint(x / s.astype(np.float32)[:, :, None]), lo, hi).astype(np.int64).reshape(64, 1024)
    assert finite and over == 0
    assert np.array_equal(scales.astype(np.float16).reshape(64, 16), s)
    assert np.array_equal(unpack(codes, E.INT4, w.size).reshape(64, 1024), q)


def _both_parameter_paths(mins, maxs, lo, hi, scales, zps, ref_scales, ref_zps):
    _affine_params_row(mins, maxs, mins.size, lo, hi, scales, zps, 0)
    for b in range(mins.size):
        s, z = _affine_param(mins[b], maxs[b], lo, hi)
        ref_scales[b] = s
        ref_zps[b] = z


@functools.cache
def _row_and_scalar_parameters(symmetric, scale_kind):
    """A jitted pair for one (symmetry, scale type): the vector path's row loop of parameters, and the
    scalar formula block by block (both compiled with the kernels' constants)."""
    from numba import njit

    from hurray_schema.evaluate import jit

    return njit(jit.bound(_both_parameter_paths, (("SCALE", scale_kind), ("SYMMETRIC", symmetric))))


FINITE_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@SETTINGS
@given(st.lists(st.tuples(FINITE_F32, FINITE_F32), min_size=1, max_size=40), st.sampled_from([E.INT4, E.UINT4]),
       st.booleans(), st.sampled_from([E.FLOAT16, E.BFLOAT16, E.FLOAT32]), st.booleans())
def test_int4_row_parameters_match_the_scalar_formula(pairs, storage, symmetric, scale_type, empty_first):
    """The branch-free parameter loop of the vector path against the scalar one, on any finite statistics:
    subnormal and huge ones, scales past the scale type's range, a block with no element."""
    from hurray_schema.evaluate import quantize as kernels

    if storage == E.UINT4:
        symmetric = False
    both = _row_and_scalar_parameters(symmetric, kernels.SCALE_KINDS[scale_type])
    lo, hi = kernels.code_range(storage, symmetric)
    a = np.array(pairs, np.float32).reshape(-1, 2)
    mins, maxs = a.min(axis=1), a.max(axis=1)
    if empty_first:
        mins[0], maxs[0] = np.inf, -np.inf
    scales, ref_scales = np.empty(mins.size, np.float32), np.empty(mins.size, np.float32)
    zps, ref_zps = np.empty(mins.size, np.int32), np.empty(mins.size, np.int32)
    both(mins, maxs, np.int64(lo), np.int64(hi), scales, zps, ref_scales, ref_zps)
    assert np.array_equal(scales.view(np.uint32), ref_scales.view(np.uint32))
    assert np.array_equal(zps, ref_zps)
