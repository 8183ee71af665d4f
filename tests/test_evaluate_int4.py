"""The vector 4-bit dequantization kernel (evaluate/simd.py, dequantize.decode_rows_int4) and the sparse
correction fused into it: bit for bit the NumPy reference, and the table-lookup kernel it replaces."""

from __future__ import annotations

import functools
import warnings

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from support.evaluate_reference import (C, T, bits_equal, coo_tensor, dense_tensor, handles, head, member_sections,
                                        pack_int4, ref_overlay)
from hurray_schema import errors as hs_errors
from hurray_schema.evaluate import dequantize
from hurray_schema.evaluate import jit, materialize, merge, tensor, tensor_to_numpy
from hurray_schema.evaluate.dequantize_simd import (LANES, STEP_BF16, STEP_F16, STEP_F32, int4x32, int4x32_scalar,
                                                    vector_f16)
from hurray_schema.model import (CombineOp, CompositionRule, ElementType, MemberRole, PerBlockAffine,
                                 PerChannelAffine, PerTensorAffine, RowMajorLayout, TensorDescriptor)

E = ElementType
VECTOR_F16 = vector_f16()
OUT = {E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16, E.FLOAT32: np.float32}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy overflow / NaN arithmetic in the references
        yield


def affine_ref(q, s, z, dtype):
    """per-block-affine.md § Dequantization Formula: float32(int32(q - z)) * float32(s), rounded once."""
    x = (np.asarray(q, np.int64) - np.asarray(z, np.int64)).astype(np.int32).astype(np.float32)
    return (x * np.asarray(s, np.float32)).astype(dtype)


def int4_block_tensor(rng, rows, cols, block, signed=True, scales=None, zps=None, scale_tag=E.FLOAT32,
                      shard=None):
    """Row-major 4-bit per-block affine [rows, cols] along the last axis, padding to whole blocks;
    returns (tensor, codes [rows, padded] as integers, scales [rows, nb] float32, zps [rows, nb])."""
    nb = -(-cols // block)
    lo, hi = (-8, 8) if signed else (0, 16)
    codes = rng.integers(lo, hi, size=(rows, nb * block))
    codes[:, cols:] = 0
    if scales is None:
        scales = rng.random((rows, nb), np.float32) * 0.02 + 0.001
    sdt = {E.FLOAT32: np.float32, E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16}[scale_tag]
    stored = np.asarray(scales, np.float32).astype(sdt)
    if zps is None:
        zps = rng.integers(-3, 4, size=(rows, nb), dtype=np.int32)
    bufs = [pack_int4(codes), np.frombuffer(stored.tobytes(), np.uint8),
            np.frombuffer(np.asarray(zps, np.int32).tobytes(), np.uint8)]
    q = PerBlockAffine(axis=1, block_size=block, scale_buffer_index=1, zero_point_buffer_index=2,
                       scale_type_tag=scale_tag)
    extra = member_sections((rows, cols), *shard) if shard else {}
    d = TensorDescriptor(E.INT4 if signed else E.UINT4, (rows, cols), RowMajorLayout(), handles(bufs),
                         quantization=q, **extra)
    return T(d, [memoryview(b) for b in bufs]), codes, stored.astype(np.float32), np.asarray(zps, np.int32)


def block_ref(codes, scales, zps, block, cols, dtype):
    s = np.repeat(scales, block, axis=1)
    z = np.repeat(zps, block, axis=1)
    return affine_ref(codes, s, z, dtype)[:, :cols]


# ------------------------------------------------------------------------------------
# One vector step against its scalar twin
# ------------------------------------------------------------------------------------


def _all_steps(buf, s, z, out, signed, vector):
    for k in range(buf.size // (LANES // 2)):
        if vector:
            int4x32(buf, k * (LANES // 2), s, z, out, k * LANES, signed)
        else:
            int4x32_scalar(buf, k * (LANES // 2), s, z, out, k * LANES, signed)


@functools.cache
def _stepper(kind):
    return njit(jit.bound(_all_steps, (("OUT", kind),)))


def _steps(buf, s, z, out, signed, kind, vector):
    """Every step of ``buf`` by the vector or the scalar step compiled for output ``kind``."""
    _stepper(kind)(buf, s, z, out, signed, vector)


@pytest.mark.parametrize("kind,dtype", [(STEP_F16, np.float16), (STEP_BF16, ml_dtypes.bfloat16),
                                        (STEP_F32, np.float32)])
@pytest.mark.parametrize("signed", [0, 1])
def test_vector_step_equals_scalar_step_and_formula(kind, dtype, signed):
    buf = np.arange(256, dtype=np.uint8)  # every byte: every nibble pair
    nib = np.stack([buf & 15, buf >> 4], axis=1).reshape(-1).astype(np.int64)
    q = np.where(nib >= 8, nib - 16, nib) if signed else nib
    for s in [0.013, 1.0, -2.5e-8, 1e-42, 7e4, 3.4e38, 65504.0, 6.1e-5]:
        for z in [0, 3, -5, 2 ** 31 - 1, -2 ** 31, 70000]:
            bits = np.uint16 if kind != STEP_F32 else np.float32
            a, b = np.empty(512, bits), np.empty(512, bits)
            _steps(buf, np.float32(s), np.int32(z), a, signed, kind, True)
            _steps(buf, np.float32(s), np.int32(z), b, signed, kind, False)
            assert a.tobytes() == b.tobytes(), (s, z)
            assert a.tobytes() == affine_ref(q, np.float32(s), z, dtype).tobytes(), (s, z)


# ------------------------------------------------------------------------------------
# Whole tensors
# ------------------------------------------------------------------------------------


@pytest.fixture(params=["vector", "lut"])
def kernel(request, monkeypatch):
    """Run each tensor test through the vector kernel and through the table-lookup fallback."""
    monkeypatch.setattr(tensor, "INT4_VECTOR", request.param == "vector")
    return request.param


@pytest.mark.parametrize("target", [E.FLOAT16, E.BFLOAT16, E.FLOAT32])
@pytest.mark.parametrize("rows,cols,block", [(3, 64, 32), (5, 100, 32), (4, 33, 32), (2, 300, 128), (1, 31, 32),
                                             (6, 97, 64), (2, 16, 16)])
@pytest.mark.parametrize("signed", [True, False])
def test_per_block_partial_trailing_block(kernel, target, rows, cols, block, signed):
    """Partial trailing block (per-block-affine.md § Padding), odd element counts, rows shorter than a step,
    blocks shorter than a step (those go to the table kernel)."""
    rng = np.random.default_rng(rows * 1000 + cols)
    t, codes, scales, zps = int4_block_tensor(rng, rows, cols, block, signed)
    got = tensor_to_numpy(t.descriptor, t.buffers, target)
    assert bits_equal(got, block_ref(codes, scales, zps, block, cols, OUT[target]))


@pytest.mark.parametrize("scale_tag", [E.FLOAT16, E.BFLOAT16])
def test_narrow_scales_widened_first(kernel, scale_tag):
    rng = np.random.default_rng(7)
    t, codes, scales, zps = int4_block_tensor(rng, 8, 256, 64, scale_tag=scale_tag)
    got = tensor_to_numpy(t.descriptor, t.buffers, scale_tag)
    assert bits_equal(got, block_ref(codes, scales, zps, 64, 256, OUT[scale_tag]))


@pytest.mark.parametrize("target", [E.FLOAT16, E.BFLOAT16, E.FLOAT32])
def test_non_finite_scales_take_the_exact_path(kernel, target, monkeypatch):
    """A block whose scale is inf / NaN (a float16 NaN with a payload, too) breaks
    ``quantization.per_block.scale_values``: the decode raises it.  The kernels still decode such
    scales exactly as NumPy does when the rule's check is taken out (what they are handed is not
    theirs to judge): 0 * inf is NaN, payloads and signs follow the scalar rules."""
    rng = np.random.default_rng(11)
    rows, cols, block = 4, 256, 64
    scales = rng.random((rows, 4), np.float32) * 0.02 + 0.001
    scales[0, 1], scales[1, 2], scales[2, 0], scales[3, 3] = np.inf, -np.inf, np.nan, 65504.0 * 4
    zps = rng.integers(-3, 4, size=(rows, 4), dtype=np.int32)
    zps[0, 1] = 0  # q - z == 0 somewhere in the infinite block: NaN
    t, codes, s32, z = int4_block_tensor(rng, rows, cols, block, scales=scales, zps=zps)
    with pytest.raises(hs_errors.SpecViolation) as raised:
        tensor_to_numpy(t.descriptor, t.buffers, target)
    assert raised.value.rule_id == "quantization.per_block.scale_values" and "scale 1 " in raised.value.message
    monkeypatch.setattr(dequantize.value_rules, "check_scales", lambda *args: None)
    ref = block_ref(codes, s32, z, block, cols, np.float32)
    got = tensor_to_numpy(t.descriptor, t.buffers, target)
    assert bits_equal(got, ref.astype(OUT[target]))
    payload = np.array([0x7E01], np.uint16).view(np.float16)[0]  # float16 scale NaN with a payload
    scales16 = np.full((1, 2), 0.01, np.float32)
    t16, codes16, _, z16 = int4_block_tensor(rng, 1, 64, 32, scales=scales16, scale_tag=E.FLOAT16)
    raw = np.frombuffer(t16.buffers[1], np.uint16).copy()
    raw[1] = payload.view(np.uint16)
    t16.buffers[1] = memoryview(raw.view(np.uint8))
    got16 = tensor_to_numpy(t16.descriptor, t16.buffers, E.FLOAT16)
    s = np.array([[0.01, payload]], np.float16).astype(np.float32)
    assert bits_equal(got16, block_ref(codes16, s, z16, 32, 64, np.float16))


@pytest.mark.parametrize("target", [E.FLOAT16, E.FLOAT32])
def test_per_tensor_and_per_channel_with_odd_row_starts(kernel, target):
    """Rows of odd length start on a high nibble every other row (the scalar first element)."""
    rng = np.random.default_rng(5)
    rows, cols = 6, 77
    codes = rng.integers(-8, 8, size=(rows, cols))
    data = pack_int4(codes)
    d = TensorDescriptor(E.INT4, (rows, cols), RowMajorLayout(), handles([data]),
                         quantization=PerTensorAffine(0.0371, -2))
    got = tensor_to_numpy(d, [memoryview(data)], target)
    assert bits_equal(got, affine_ref(codes, np.float32(0.0371), -2, OUT[target]))
    scales = (rng.random(rows, np.float32) + 0.5).astype(np.float32)
    zps = rng.integers(-4, 5, rows, dtype=np.int32)
    bufs = [data, np.frombuffer(scales.tobytes(), np.uint8), np.frombuffer(zps.tobytes(), np.uint8)]
    d = TensorDescriptor(E.INT4, (rows, cols), RowMajorLayout(), handles(bufs),
                         quantization=PerChannelAffine(axis=0, scale_buffer_index=1, zero_point_buffer_index=2))
    got = tensor_to_numpy(d, [memoryview(b) for b in bufs], target)
    assert bits_equal(got, affine_ref(codes, scales[:, None], zps[:, None], OUT[target]))


@pytest.mark.parametrize("shape", [(0, 64), (3, 0), (0,)])
def test_empty_tensors(kernel, shape):
    block = 32
    cols = shape[-1]
    nb = -(-cols // block) if cols else 0
    count = nb * (shape[0] if len(shape) == 2 else 1)
    bufs = [np.zeros(0, np.uint8), np.zeros(count * 4, np.uint8), np.zeros(count * 4, np.uint8)]
    q = PerBlockAffine(axis=len(shape) - 1, block_size=block, scale_buffer_index=1, zero_point_buffer_index=2)
    d = TensorDescriptor(E.INT4, shape, RowMajorLayout(), handles(bufs), quantization=q)
    got = tensor_to_numpy(d, [memoryview(b) for b in bufs], E.FLOAT16)
    assert got.shape == shape and got.dtype == np.float16


@pytest.mark.usefixtures("eager_kernels")
def test_the_vector_kernel_is_chosen(monkeypatch):
    calls = []
    original = dequantize.decode_rows_int4
    monkeypatch.setattr(tensor, "decode_rows_int4", lambda *a: (calls.append(a[11]), original(*a)))
    t, *_ = int4_block_tensor(np.random.default_rng(0), 2, 64, 32)
    tensor_to_numpy(t.descriptor, t.buffers, E.FLOAT32)
    tensor_to_numpy(t.descriptor, t.buffers, E.FLOAT16)
    assert calls == ([dequantize.OUT_F32, dequantize.OUT_F16] if VECTOR_F16 else [dequantize.OUT_F32])


def test_without_hardware_float16_the_table_kernel_decodes_float16(monkeypatch):
    """A host without F16C keeps float16 outputs on the table kernel (the other outputs need no F16C)."""
    monkeypatch.setattr(dequantize, "vector_f16", lambda: False)
    rng = np.random.default_rng(2)
    t, codes, scales, zps = int4_block_tensor(rng, 3, 96, 32)
    p = dequantize.quant_params(t.descriptor, t.buffers)
    assert not dequantize.int4_vector_ok(p, True, 1, dequantize.OUT_F16) and dequantize.int4_vector_ok(p, True, 1, dequantize.OUT_F32)
    assert bits_equal(tensor_to_numpy(t.descriptor, t.buffers, E.FLOAT16), block_ref(codes, scales, zps, 32, 96,
                                                                                    np.float16))


# ------------------------------------------------------------------------------------
# The sparse correction fused into the base's decode
# ------------------------------------------------------------------------------------


def overlay_case(rng, tag, combine, n_rows=12, cols=160, sorted_=True, box=None, extra=()):
    """int4 per-block base decoding to ``tag`` (its scale type) + a COO correction (sorted or not, in a
    sub-box), and ``extra`` further corrections; returns (composite, reference)."""
    shape = (n_rows, cols)
    base, codes, scales, zps = int4_block_tensor(rng, n_rows, cols, 32, scale_tag=tag if tag != E.FLOAT32 else
                                                 E.FLOAT32, shard=((0, 0), shape, MemberRole.BASE))
    base_ref = block_ref(codes, scales, zps, 32, cols, OUT[tag])
    off, bshape = box or ((0, 0), shape)
    lin = np.sort(rng.choice(bshape[0] * bshape[1], size=max(1, bshape[0] * bshape[1] // 10), replace=False))
    coords = np.stack([lin // bshape[1], lin % bshape[1]], axis=1)
    if not sorted_:
        coords = coords[rng.permutation(len(coords))]
    vals = (rng.standard_normal(len(coords)) * 3).astype(np.float32)
    vals[:4] = [np.inf, -np.inf, np.nan, 65504.0][:len(vals[:4])]
    vals = vals.astype(OUT[tag])
    corr = coo_tensor(coords, vals, bshape, tag, sorted_, off, shape, MemberRole.CORRECTION)
    members, corrections = [base, corr], [("sparse", off, coords, vals)]
    for kind, arr_or_coords, values in extra:
        if kind == "dense":
            members.append(dense_tensor(arr_or_coords, tag, "row", (0, 0), shape, MemberRole.CORRECTION))
            corrections.append(("dense", (0, 0), np.asarray(arr_or_coords, OUT[tag])))
        else:
            members.append(coo_tensor(arr_or_coords, values, shape, tag, True, (0, 0), shape, MemberRole.CORRECTION))
            corrections.append(("sparse", (0, 0), arr_or_coords, np.asarray(values, OUT[tag])))
    comp = C(head(shape, tag, CompositionRule.OVERLAY, len(members), combine), members)
    return comp, ref_overlay(base_ref, corrections, combine)


def _count_scatters(monkeypatch):
    calls = []
    original = merge._scatter
    monkeypatch.setattr(merge, "_scatter", lambda *a: (calls.append(a[1].size), original(*a)))
    return calls


@pytest.mark.usefixtures("eager_kernels")
@pytest.mark.parametrize("tag", [E.FLOAT16, E.BFLOAT16, E.FLOAT32])
@pytest.mark.parametrize("combine", [CombineOp.REPLACE, CombineOp.ADD])
def test_sorted_correction_is_fused_into_the_decode(monkeypatch, tag, combine):
    calls = _count_scatters(monkeypatch)
    comp, ref = overlay_case(np.random.default_rng(int(tag) * 10 + int(combine)), tag, combine)
    assert bits_equal(materialize(comp), ref)
    fused = VECTOR_F16 or tag != E.FLOAT16  # without F16C a float16 base goes to the table kernel
    assert len(calls) == (0 if fused else 1)


@pytest.mark.usefixtures("eager_kernels")
@pytest.mark.parametrize("combine", [CombineOp.REPLACE, CombineOp.ADD])
def test_unsorted_or_boxed_corrections(monkeypatch, combine):
    """An unsorted COO is scattered after the decode; a sorted one in a sub-box is fused; both bit-identical."""
    calls = _count_scatters(monkeypatch)
    rng = np.random.default_rng(int(combine))
    comp, ref = overlay_case(rng, E.FLOAT16, combine, sorted_=False)
    assert bits_equal(materialize(comp), ref)
    assert len(calls) == 1
    comp, ref = overlay_case(rng, E.FLOAT16, combine, box=((3, 37), (5, 90)))
    assert bits_equal(materialize(comp), ref)
    assert len(calls) == (1 if VECTOR_F16 else 2)


@pytest.mark.parametrize("combine", [CombineOp.REPLACE, CombineOp.ADD])
def test_later_corrections_follow_the_fused_one(combine):
    """Only the first correction is fused; the others still apply after it, in emission order."""
    rng = np.random.default_rng(9)
    shape = (12, 160)
    again = np.array([[0, 0], [3, 7], [11, 159]])
    extra = [("sparse", again, np.array([1.5, -2.0, 7.0], np.float32).astype(np.float16)),
             ("dense", (rng.standard_normal(shape)).astype(np.float16), None)]
    comp, ref = overlay_case(rng, E.FLOAT16, combine, extra=extra)
    assert bits_equal(materialize(comp), ref)
    out = np.full(shape, 5.0, np.float16)
    materialize(comp, out=out)
    assert bits_equal(out, ref)


def test_spqr_seed_through_the_table_kernel(monkeypatch):
    """The seed's SpQR overlay through the fallback path (no vector kernel) matches too."""
    from support.evaluate_reference import spqr
    monkeypatch.setattr(tensor, "INT4_VECTOR", False)
    comp, base_ref, corrections = spqr(256, 0.01, CombineOp.ADD)
    assert bits_equal(materialize(comp), ref_overlay(base_ref, corrections, CombineOp.ADD))


def test_byte_offset_and_reversed_rows(kernel):
    """Codes after a byte offset, rows walked backwards (strided layout): vector steps start where each
    row's codes start."""
    from hurray_schema.model import StridedLayout
    rng = np.random.default_rng(4)
    rows, cols = 5, 96
    codes = rng.integers(-8, 8, size=(rows, cols))
    data = np.concatenate([np.full(3, 0xAB, np.uint8), pack_int4(codes)])
    q = PerTensorAffine(0.5, 1)
    d = TensorDescriptor(E.INT4, (rows, cols), RowMajorLayout(), handles([data]), quantization=q, byte_offset=3)
    got = tensor_to_numpy(d, [memoryview(data)], E.FLOAT16)
    assert bits_equal(got, affine_ref(codes, np.float32(0.5), 1, np.float16))
    d = TensorDescriptor(E.INT4, (rows, cols), StridedLayout([-cols, 1]), handles([data]), quantization=q,
                         byte_offset=3 + (rows - 1) * cols // 2)
    got = tensor_to_numpy(d, [memoryview(data)], E.FLOAT16)
    assert bits_equal(got, affine_ref(codes[::-1], np.float32(0.5), 1, np.float16))


@pytest.mark.parametrize("axis", [0, 1])
def test_three_dimensional_blocks_and_channels(kernel, axis):
    """Rank 3: per-block along the last axis (parameter index outer * nb + i // K), per-channel on a leading axis."""
    rng = np.random.default_rng(axis)
    shape, block = (3, 4, 80), 32
    nb = -(-shape[2] // block)
    codes = rng.integers(-8, 8, size=shape[:2] + (nb * block,))
    codes[..., shape[2]:] = 0
    scales = (rng.random(shape[:2] + (nb,), np.float32) + 0.1).astype(np.float32)
    zps = rng.integers(-3, 4, size=shape[:2] + (nb,), dtype=np.int32)
    bufs = [pack_int4(codes), np.frombuffer(scales.tobytes(), np.uint8), np.frombuffer(zps.tobytes(), np.uint8)]
    d = TensorDescriptor(E.INT4, shape, RowMajorLayout(), handles(bufs),
                         quantization=PerBlockAffine(axis=2, block_size=block, scale_buffer_index=1,
                                                     zero_point_buffer_index=2))
    got = tensor_to_numpy(d, [memoryview(b) for b in bufs], E.FLOAT16)
    ref = affine_ref(codes, np.repeat(scales, block, axis=2), np.repeat(zps, block, axis=2), np.float16)
    assert bits_equal(got, ref[..., :shape[2]])
    flat = rng.integers(-8, 8, size=shape)
    n = shape[axis]
    cs = (rng.random(n, np.float32) + 0.1).astype(np.float32)
    cz = rng.integers(-3, 4, n, dtype=np.int32)
    bufs = [pack_int4(flat), np.frombuffer(cs.tobytes(), np.uint8), np.frombuffer(cz.tobytes(), np.uint8)]
    d = TensorDescriptor(E.INT4, shape, RowMajorLayout(), handles(bufs),
                         quantization=PerChannelAffine(axis=axis, scale_buffer_index=1, zero_point_buffer_index=2))
    got = tensor_to_numpy(d, [memoryview(b) for b in bufs], E.FLOAT32)
    bshape = [1, 1, 1]
    bshape[axis] = n
    assert bits_equal(got, affine_ref(flat, cs.reshape(bshape), cz.reshape(bshape), np.float32))


@pytest.mark.parametrize("values, expected", [([], True), ([5], True), ([1, 2, 9], True), ([1, 1, 2], False),
                                              ([3, 2], False), ([-4, 0, 7, 6], False)])
def test_strictly_increasing_numpy_and_kernel_agree(monkeypatch, values, expected):
    """The check that lets an overlay's patch fuse into the int4 decode: NumPy (kernel not compiled) and
    the kernel give the same answer."""
    lin = np.asarray(values, np.int64)
    kernel = tensor._strictly_increasing_kernel
    for at_hand in (False, True):
        monkeypatch.setattr(kernel, "worth_it", lambda work, compile_after, index=0, at_hand=at_hand: at_hand)
        assert tensor._strictly_increasing(lin) is expected
