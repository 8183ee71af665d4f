"""Dequantization exactly per quantization/*.md: float32 arithmetic, then one rounding to the
decoded type."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.evaluate_reference import block_affine_int4_tensor, described, pack_int4
from hurray_schema.errors import HurraySchemaError
from hurray_schema.evaluate import tensor_to_numpy
from hurray_schema.evaluate.elements import numpy_dtype
from hurray_schema.model import (NO_BUFFER_INDEX, ColumnMajorLayout, ElementType, Mxfp, Nf4, PerBlockAffine,
                                 PerChannelAffine, PerTensorAffine, QuantFlag, RowMajorLayout, StridedLayout,
                                 TensorDescriptor)
from hurray_schema.structs.quantization import NF4_LEVELS

E = ElementType
TARGETS = [(E.FLOAT32, np.float32), (E.FLOAT16, np.float16), (E.BFLOAT16, ml_dtypes.bfloat16),
           (E.FLOAT64, np.float64)]


def make(tag, shape, q, arrays, layout=None):
    return described(tag, shape, arrays, layout, quantization=q)


def finish(x32, dtype):
    """float32 result rounded once to the decoded type (float64: widened)."""
    return np.asarray(x32, np.float32).astype(dtype)


def pack(codes, bits):
    c = np.asarray(codes).reshape(-1).astype(np.uint8) & ((1 << bits) - 1)
    per = 8 // bits
    c = np.concatenate([c, np.zeros((-c.size) % per, np.uint8)]).reshape(-1, per)
    return np.bitwise_or.reduce(c << (np.arange(per, dtype=np.uint8) * bits), axis=1).astype(np.uint8)


@pytest.mark.parametrize("target,dtype", TARGETS)
@pytest.mark.parametrize("tag,lo,hi,bits", [(E.INT8, -128, 128, 8), (E.UINT8, 0, 256, 8), (E.INT4, -8, 8, 4),
                                            (E.UINT2, 0, 4, 2), (E.INT32, -2**31, 2**31, 32),
                                            (E.UINT32, 0, 2**32, 32), (E.INT16, -2**15, 2**15, 16)])
def test_per_tensor_affine(tag, lo, hi, bits, target, dtype):
    """x = scale * float32(int32(q - zero_point)) (quantization/per-tensor-affine.md)."""
    rng = np.random.default_rng(bits)
    q = rng.integers(lo, hi, size=(5, 7), dtype=np.int64)
    zp = int(rng.integers(max(lo, -100), min(hi, 100)))
    scale = np.float32(0.0371)
    data = pack(q, bits) if bits < 8 else q.astype(numpy_dtype(tag))
    d, b = make(tag, q.shape, PerTensorAffine(float(scale), zp), [data])
    ref = finish((q - zp).astype(np.int32).astype(np.float32) * scale, dtype)
    got = tensor_to_numpy(d, b, target)
    assert got.dtype == np.dtype(dtype) and got.tobytes() == ref.tobytes()


def test_default_decoded_type_is_float32():
    d, b = make(E.INT8, (3,), PerTensorAffine(0.5, 1), [np.array([1, 2, 3], np.int8)])
    got = tensor_to_numpy(d, b)
    assert got.dtype == np.float32 and got.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("target,dtype", TARGETS[:3])
def test_per_channel_affine(axis, symmetric, target, dtype):
    rng = np.random.default_rng(axis)
    shape = (3, 4, 5)
    q = rng.integers(-8, 8, size=shape)
    scales = rng.random(shape[axis], np.float32) + np.float32(0.01)
    zps = rng.integers(-3, 4, size=shape[axis]).astype(np.int32)
    arrays = [pack(q, 4), scales] + ([] if symmetric else [zps])
    qd = PerChannelAffine(axis, 1, NO_BUFFER_INDEX if symmetric else 2, flags=int(QuantFlag.SYMMETRIC) if symmetric else 0)
    d, b = make(E.INT4, shape, qd, arrays)
    bshape = [1, 1, 1]
    bshape[axis] = shape[axis]
    z = 0 if symmetric else zps.reshape(bshape)
    ref = finish((q - z).astype(np.int32).astype(np.float32) * scales.reshape(bshape), dtype)
    assert tensor_to_numpy(d, b, target).tobytes() == ref.tobytes()


def test_per_channel_shared_parameter_buffer():
    """quantization.md § Buffer Table Placement Rules 3: one buffer read as [scales | zero_points]."""
    q = np.array([[1, 2], [3, 4]], np.int8)
    scales = np.array([0.5, 2.0], np.float32)
    zps = np.array([1, -1], np.int32)
    shared = np.concatenate([scales.view(np.uint8), zps.view(np.uint8)])
    d, b = make(E.INT8, (2, 2), PerChannelAffine(0, 1, 1), [q, shared])
    ref = (q - zps[:, None]).astype(np.float32) * scales[:, None]
    assert np.array_equal(tensor_to_numpy(d, b), ref)


@pytest.mark.parametrize("scale_tag", [E.FLOAT32, E.FLOAT16, E.BFLOAT16])
@pytest.mark.parametrize("cols", [64, 100, 33])
def test_per_block_affine_last_axis_partial_block(scale_tag, cols):
    """Partial trailing block: storage padded to whole blocks, padding ignored (per-block-affine.md § Padding)."""
    t, ref = block_affine_int4_tensor(6, cols, 16, np.random.default_rng(cols), scale_tag=scale_tag)
    got = tensor_to_numpy(t.descriptor, t.buffers, E.FLOAT16)
    assert got.tobytes() == ref.tobytes()
    t32, ref32 = block_affine_int4_tensor(6, cols, 16, np.random.default_rng(cols), scale_tag=scale_tag,
                                          out_dtype=np.float32)
    assert tensor_to_numpy(t32.descriptor, t32.buffers, E.FLOAT32).tobytes() == ref32.tobytes()
    # by default the values come out in the decoded type, the scale type (spec-map § Interpretations)
    assert tensor_to_numpy(t.descriptor, t.buffers).dtype == {E.FLOAT32: np.float32, E.FLOAT16: np.float16,
                                                             E.BFLOAT16: ml_dtypes.bfloat16}[scale_tag]


def block_reference(q, scales, zps, axis, block, dtype):
    """Vectorized per-block formula: b = outer * ceil(S / K) + i_axis // K (per-block-affine.md § Block Layout)."""
    shape = q.shape
    idx = np.indices(shape)
    nb = -(-shape[axis] // block)
    outer = np.zeros(shape, np.int64)
    for d in range(len(shape)):
        if d != axis:
            outer = outer * shape[d] + idx[d]
    b = outer * nb + idx[axis] // block
    return finish((q - zps[b]).astype(np.int32).astype(np.float32) * scales[b], dtype)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), data=st.data())
def test_per_block_affine_any_axis(shape, data):
    """Random axis, block size (partial blocks), storage type, layout (row-major / column-major)."""
    rank = len(shape)
    axis = data.draw(st.integers(0, rank - 1))
    block = data.draw(st.sampled_from([2, 4, 8]))
    shape[axis] = max(shape[axis], block)
    tag, lo, hi, bits = data.draw(st.sampled_from([(E.INT4, -8, 8, 4), (E.UINT4, 0, 16, 4), (E.INT2, -2, 2, 2),
                                                   (E.UINT8, 0, 256, 8), (E.INT8, -128, 128, 8)]))
    order = data.draw(st.sampled_from(["C", "F"]))
    target, dtype = data.draw(st.sampled_from(TARGETS))
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    q = rng.integers(lo, hi, size=shape)
    nb = -(-shape[axis] // block)
    sshape = list(shape)
    sshape[axis] = nb * block
    stored = np.zeros(sshape, np.int64)
    stored[tuple(slice(0, n) for n in shape)] = q
    count = nb * int(np.prod(shape)) // shape[axis]
    scales = (rng.random(count, np.float32) + np.float32(0.01)).astype(np.float32)
    zps = rng.integers(lo // 2, hi // 2 + 1, size=count).astype(np.int32)
    flat = stored.reshape(-1, order=order)
    data_buf = pack(flat, bits) if bits < 8 else flat.astype(numpy_dtype(tag))
    lay = RowMajorLayout() if order == "C" else ColumnMajorLayout()
    d, b = make(tag, tuple(shape), PerBlockAffine(axis, block, 1, 2), [data_buf, scales, zps], lay)
    got = tensor_to_numpy(d, b, target)
    assert got.tobytes() == block_reference(q, scales, zps, axis, block, dtype).tobytes()


def test_per_block_affine_strided_reversed_rows():
    """A strided (row-reversed) int4 tensor goes through the generic kernel."""
    rng = np.random.default_rng(5)
    q = rng.integers(-8, 8, size=(4, 32))
    scales = rng.random(4 * 2, np.float32) + np.float32(0.1)
    zps = np.zeros(8, np.int32)
    stored = q[::-1].reshape(-1)
    d, b = make(E.INT4, (4, 32), PerBlockAffine(1, 16, 1, 2), [pack(stored, 4), scales, zps],
                StridedLayout([-32, 1]))
    d = TensorDescriptor(d.type_tag, d.shape, d.layout, d.buffers, byte_offset=48, quantization=d.quantization)
    got = tensor_to_numpy(d, b, E.FLOAT16)
    assert got.tobytes() == block_reference(q, scales, zps, 1, 16, np.float16).tobytes()


def test_symmetric_per_block_ignores_zero_points():
    q = np.array([[1, -2, 3, -4]], np.int64)
    d, b = make(E.INT4, (1, 4), PerBlockAffine(1, 2, 1, NO_BUFFER_INDEX, flags=int(QuantFlag.SYMMETRIC)),
                [pack(q, 4), np.array([0.5, 0.25], np.float32)])
    assert tensor_to_numpy(d, b).tolist() == [[0.5, -1.0, 0.75, -1.0]]


@pytest.mark.parametrize("target,dtype", TARGETS)
def test_nf4(target, dtype):
    """x = absmax[b] * nf4[q] in float32 (quantization/nf4.md § Dequantization Formula)."""
    rng = np.random.default_rng(9)
    q = rng.integers(0, 16, size=(3, 40))
    absmax = rng.random(3 * 3, np.float32) * np.float32(4)
    padded = np.zeros((3, 48), np.int64)
    padded[:, :40] = q
    d, b = make(E.UINT4, (3, 40), Nf4(1, 16, 1), [pack_int4(padded), absmax])
    levels = np.array(NF4_LEVELS, np.float32)
    bidx = np.arange(3)[:, None] * 3 + np.arange(40)[None, :] // 16
    ref = finish(absmax[bidx] * levels[q], dtype)
    assert tensor_to_numpy(d, b, target).tobytes() == ref.tobytes()


@pytest.mark.parametrize("tag,bits", [(E.FLOAT4_E2M1, 4), (E.FLOAT8_E4M3, 8), (E.FLOAT8_E5M2, 8), (E.INT8, 8),
                                      (E.INT4, 4), (E.FLOAT6_E2M3, 6)])
def test_mxfp(tag, bits):
    """x = 2**(e - 127) * value(q) (quantization/mxfp.md § Dequantization Formula)."""
    rng = np.random.default_rng(bits)
    n = 64
    codes = rng.integers(0, 1 << bits, size=(2, n))
    if tag == E.FLOAT8_E4M3:
        codes[codes == 0x7F] = 0
        codes[codes == 0xFF] = 1
    if tag == E.FLOAT8_E5M2:
        codes[(codes & 0x7C) == 0x7C] = 3
    e = rng.integers(120, 135, size=2 * n // 32).astype(np.uint8)
    if bits == 6:
        c = codes.reshape(-1, 4).astype(np.uint32)
        w = c[:, 0] | (c[:, 1] << 6) | (c[:, 2] << 12) | (c[:, 3] << 18)
        data = np.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=1).astype(np.uint8)
    else:
        data = pack(codes, bits) if bits < 8 else codes.astype(np.uint8)
    d, b = make(tag, (2, n), Mxfp(1, 32, 1), [data, e])
    if tag in (E.INT8, E.INT4):
        vals = np.where(codes >= (1 << (bits - 1)), codes - (1 << bits), codes).astype(np.float32)
    else:
        vals = codes.astype(np.uint8).view(numpy_dtype(tag)).astype(np.float32)
    s = np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)
    ref = vals * s[np.arange(2)[:, None] * 2 + np.arange(n)[None, :] // 32]
    assert tensor_to_numpy(d, b).tobytes() == ref.astype(np.float32).tobytes()


def test_mxfp_rejects_reserved_scale_and_partial_block():
    d, b = make(E.INT8, (1, 32), Mxfp(1, 32, 1), [np.zeros(32, np.int8), np.array([0xFF], np.uint8)])
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, b)
    d, b = make(E.INT8, (1, 48), Mxfp(1, 32, 1), [np.zeros(48, np.int8), np.array([127, 127], np.uint8)])
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, b)


def test_short_scale_buffer_rejected():
    d, b = make(E.INT4, (2, 32), PerBlockAffine(1, 16, 1, 2), [np.zeros(32, np.uint8), np.zeros(3, np.float32),
                                                               np.zeros(4, np.int32)])
    with pytest.raises(HurraySchemaError):
        tensor_to_numpy(d, b)


def test_quantized_asked_for_an_integer_type_dequantizes_then_casts():
    """Issue 13: a requested type is a cast, not a check: 3 * 1.5 = 4.5 in float32, truncated to 4."""
    d, b = make(E.INT8, (1,), PerTensorAffine(1.5, 0), [np.array([3], np.int8)])
    got = tensor_to_numpy(d, b, E.INT32)
    assert got.dtype == np.int32 and got.tolist() == [4]


# ------------------------------------------------------------------------------------
# NumPy standing in for a decode kernel (a cold process's one-off decode) gives the kernel's bits
# ------------------------------------------------------------------------------------

_STAND_IN_CASES = [
    ("per_tensor", {"storage": "int8"}), ("per_tensor", {"storage": "uint8"}),
    ("per_tensor", {"storage": "int16"}), ("per_tensor", {"storage": "uint4"}),
    ("per_channel", {"storage": "int8", "axis": 0}), ("per_channel", {"storage": "uint8", "axis": 1}),
    ("per_channel", {"storage": "int4", "axis": 0}),
    ("per_block", {"storage": "int4"}), ("per_block", {"storage": "int4", "scale_type": "bfloat16"}),
    ("per_block", {"storage": "int4", "scale_type": "float32"}), ("per_block", {"storage": "int8"}),
    ("per_block", {"storage": "uint4"}), ("per_block", {"storage": "int2"}), ("per_block", {"storage": "uint2"}),
    ("per_block", {"storage": "int4", "axis": 0, "block_size": 16}),
    ("nf4", {"block_size": 64}), ("mxfp", {"storage": "float8_e4m3"}), ("mxfp", {"storage": "float4_e2m1"}),
    ("mxfp", {"storage": "float6_e3m2"}), ("mxfp", {"storage": "int8"}),
]


def _decoded_bits(tensor, target, kernel_at_hand: bool) -> bytes:
    from hurray_schema.evaluate import jit

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jit.Kernel, "worth_it", lambda self, work, compile_after, index=0: kernel_at_hand)
        return tensor_to_numpy(tensor.descriptor, tensor.buffers, target).tobytes()


@pytest.mark.parametrize("target", [E.FLOAT32, E.FLOAT16, E.BFLOAT16])
@pytest.mark.parametrize("scheme, options", _STAND_IN_CASES)
def test_numpy_stand_in_decodes_the_kernels_bits(scheme, options, target):
    """dequantize.decode_rows_numpy against the affine-layout kernels (any / table lookup / int4 vector),
    bit for bit, for every scheme and storage family, a padded block axis, blocks across axis 0, and the
    three decoded types."""
    import hurray_schema as hs

    rng = np.random.default_rng(11)
    w = rng.standard_normal((24, 96 if scheme == "mxfp" else 100)).astype(np.float32) * 3  # MXFP: whole blocks
    w[0] = 0
    w[1, ::3] = 1e-8
    tensor = hs.quantize(w, scheme, **options)
    assert _decoded_bits(tensor, target, False) == _decoded_bits(tensor, target, True)


@pytest.mark.parametrize("shape, scheme, options", [
    ((100,), "per_tensor", {"storage": "int8"}), ((100,), "per_block", {"storage": "int4", "block_size": 16}),
    ((3, 5, 40), "per_channel", {"storage": "int8", "axis": 1}),
    ((3, 5, 40), "per_block", {"storage": "int4", "axis": 1, "block_size": 4}),
    ((3, 5, 40), "per_block", {"storage": "uint2", "axis": 2, "block_size": 16}),
    ((3, 5, 40), "nf4", {"axis": 2, "block_size": 8}), ((2, 3, 64), "mxfp", {"storage": "float4_e2m1"}),
    ((16, 3, 8), "per_block", {"storage": "int8", "axis": 0, "block_size": 8}),
])
def test_numpy_stand_in_decodes_the_kernels_bits_at_other_ranks(shape, scheme, options):
    """The NumPy stand-in against the kernels on 1-D and 3-D tensors: blocks and channels along a middle
    axis, the first axis, the last."""
    import hurray_schema as hs

    w = np.random.default_rng(12).standard_normal(shape).astype(np.float32) * 2
    tensor = hs.quantize(w, scheme, **options)
    for target in (E.FLOAT32, E.FLOAT16):
        assert _decoded_bits(tensor, target, False) == _decoded_bits(tensor, target, True)
