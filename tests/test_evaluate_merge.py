"""Composite merges against the vectorized NumPy reference (tests/support/evaluate_reference.py), bit for bit."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.evaluate_reference import (DTYPES, C, T, bits_equal, coo_tensor, csr_tensor, dense_tensor, grid_partition,
                                        handles, head, member_sections, ref_overlay, ref_partition, spqr)
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.evaluate import lookup, materialize, read
from hurray_schema.model import (CombineOp, CompositionRule, ElementType, MemberRole, PerBlockAffine, PerTensorAffine,
                                 RowMajorLayout, TensorDescriptor)

E = ElementType
P, O, G = CompositionRule.PARTITION, CompositionRule.OVERLAY, CompositionRule.GROUP


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy float16 overflow / NaN arithmetic
        yield


# ------------------------------------------------------------------------------------
# Seeds (layouts/composite.md § Example)
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("combine", [CombineOp.REPLACE, CombineOp.ADD])
def test_spqr_seed_4096_bit_identical(combine):
    comp, base_ref, corrections = spqr(4096, 0.01, combine)
    got = materialize(comp)
    assert got.dtype == np.float16 and got.shape == (4096, 4096)
    assert bits_equal(got, ref_overlay(base_ref, corrections, combine))


def test_partition_seed_8x8_and_lookup():
    shape = (8, 8)
    left = np.arange(32, dtype=np.float32).reshape(8, 4)
    right = 100 + np.arange(32, dtype=np.float32).reshape(8, 4)
    m0 = dense_tensor(left, E.FLOAT32, "row", (0, 0), shape)
    m1 = dense_tensor(right, E.FLOAT32, "row", (0, 4), shape)
    comp = C(head(shape, E.FLOAT32, P, 2), [m0, m1])
    got = materialize(comp)
    assert bits_equal(got, ref_partition(shape, np.float32, [((0, 0), left), ((0, 4), right)]))
    assert lookup(comp, [3, 6]) == right[3, 2]
    assert got[3, 6] == right[3, 2]


def test_partition_lookup_reads_only_the_covering_member():
    """lookup([3, 6]) works even when member 0's buffer is unusable: it is never touched."""
    shape = (8, 8)
    right = np.arange(32, dtype=np.float32).reshape(8, 4)
    broken = T(TensorDescriptor(E.FLOAT32, (8, 4), RowMajorLayout(), handles([b""]),
                                **member_sections((8, 4), (0, 0), shape, None)), [memoryview(b"")])
    comp = C(head(shape, E.FLOAT32, P, 2), [broken, dense_tensor(right, E.FLOAT32, "row", (0, 4), shape)])
    assert lookup(comp, (3, 6)) == right[3, 2]
    assert bits_equal(read(comp, (slice(2, 5), slice(5, 8))), right[2:5, 1:4])
    with pytest.raises(HurraySchemaError):
        materialize(comp)


def test_grid_partition_matches_reference():
    comp, parts = grid_partition(64, 4)
    assert bits_equal(materialize(comp), ref_partition((64, 64), np.float32, parts))


def test_materialize_into_out():
    comp, parts = grid_partition(32, 2)
    out = np.full((32, 32), np.nan, np.float32)
    assert materialize(comp, out=out) is out
    assert bits_equal(out, ref_partition((32, 32), np.float32, parts))
    with pytest.raises(ValueError):
        materialize(comp, out=np.empty((32, 32), np.float64))


# ------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------


def test_partition_gap_and_overlap_rejected():
    shape = (4, 4)
    a = dense_tensor(np.ones((4, 2), np.float32), E.FLOAT32, "row", (0, 0), shape)
    b = dense_tensor(np.ones((4, 2), np.float32), E.FLOAT32, "row", (0, 1), shape)
    with pytest.raises(HurraySchemaError):
        materialize(C(head(shape, E.FLOAT32, P, 2), [a, b]))  # overlap and gap
    with pytest.raises(HurraySchemaError):
        materialize(C(head(shape, E.FLOAT32, P, 1), [a]))  # gap


def test_member_type_must_decode_to_head_type():
    """The binder's verdict, with its rule id, from every evaluation entry point."""
    shape = (2, 2)
    a = dense_tensor(np.ones((2, 2), np.float16), E.FLOAT16, "row", (0, 0), shape)
    wrong = C(head(shape, E.FLOAT32, P, 1), [a])
    for evaluate in (lambda: materialize(wrong), lambda: read(wrong, ((0, 2), (0, 2))),
                     lambda: lookup(wrong, (0, 0))):
        with pytest.raises(SpecViolation) as caught:
            evaluate()
        assert caught.value.rule_id == "composite.member.decoded_type"


def test_overlay_base_must_span_and_come_first():
    shape = (4, 4)
    corr = dense_tensor(np.ones((2, 2), np.float32), E.FLOAT32, "row", (0, 0), shape, MemberRole.CORRECTION)
    base = dense_tensor(np.ones(shape, np.float32), E.FLOAT32, "row", (0, 0), shape, MemberRole.BASE)
    with pytest.raises(HurraySchemaError):
        materialize(C(head(shape, E.FLOAT32, O, 2, CombineOp.ADD), [corr, base]))
    with pytest.raises(HurraySchemaError):
        materialize(C(head(shape, E.FLOAT32, O, 0, CombineOp.ADD), []))


def test_nesting_depth_limit():
    shape = (2,)
    leaf = dense_tensor(np.ones(2, np.float32), E.FLOAT32, "row", (0,), shape)
    comp = leaf
    for _ in range(10):
        comp = C(TensorDescriptor(E.FLOAT32, shape, head(shape, E.FLOAT32, P, 1).layout, (),
                                  **member_sections(shape, (0,), shape, None)), [comp])
    with pytest.raises(HurraySchemaError):
        materialize(comp)


# ------------------------------------------------------------------------------------
# Group, empty
# ------------------------------------------------------------------------------------


def test_group_returns_member_arrays():
    a = dense_tensor(np.arange(6, dtype=np.int32).reshape(2, 3), E.INT32)
    b = coo_tensor([[1]], [2.5], (3,), E.FLOAT16)
    q = T(TensorDescriptor(E.INT8, (2,), RowMajorLayout(), handles([b"\x01\x03"]),
                           quantization=PerTensorAffine(0.5, 1)), [memoryview(b"\x01\x03")])
    got = materialize(C(head((1,), E.FLOAT32, G, 3), [a, b, q]))
    assert isinstance(got, tuple) and len(got) == 3
    assert bits_equal(got[0], np.arange(6, dtype=np.int32).reshape(2, 3))
    assert bits_equal(got[1], np.array([0, 2.5, 0], np.float16))
    assert bits_equal(got[2], np.array([0.0, 1.0], np.float32))


def test_empty_composite_view():
    got = materialize(C(head((0, 3), E.BFLOAT16, P, 0), []))
    assert got.shape == (0, 3) and got.dtype == ml_dtypes.bfloat16


# ------------------------------------------------------------------------------------
# Random composites
# ------------------------------------------------------------------------------------

HEAD_TYPES = [E.FLOAT32, E.FLOAT16, E.BFLOAT16, E.INT32, E.FLOAT64]
FLOATS = {E.FLOAT32, E.FLOAT16, E.BFLOAT16, E.FLOAT64}
SPECIALS = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 6e-8, 65504.0, 1.0009765625, 2049.0], np.float32)


def random_values(rng, shape, tag, specials=True):
    if tag in FLOATS:
        x = (rng.standard_normal(shape) * rng.choice([1.0, 100.0, 1e4])).astype(np.float32)
        if specials and x.size:
            mask = rng.random(shape) < 0.05
            x[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
        return x.astype(DTYPES[tag])
    return rng.integers(-(2 ** 31), 2 ** 31, size=shape, dtype=np.int64).astype(DTYPES[tag])


def quantized_member(rng, shape, tag, shard_offset, parent_shape, role=None):
    """A quantized int8 member whose decoded value type is ``tag`` (layouts/composite.md § Members), and
    its reference values (float32 math, one rounding to ``tag``): per-tensor affine for a float32 head,
    per-block affine along the last axis with ``tag`` scales for a float16 / bfloat16 head."""
    q = rng.integers(-128, 128, size=shape).astype(np.int8)
    buf = np.frombuffer(q.tobytes(), np.uint8)
    if tag == E.FLOAT32:
        scale, zp = np.float32(rng.choice([0.125, 0.0371, 3.3])), int(rng.integers(-5, 6))
        d = TensorDescriptor(E.INT8, shape, RowMajorLayout(), handles([buf]),
                             quantization=PerTensorAffine(float(scale), zp),
                             **member_sections(shape, shard_offset, parent_shape, role))
        ref = (q.astype(np.int32) - zp).astype(np.float32) * scale
        return T(d, [memoryview(buf)]), ref.astype(np.float32)
    block = 2  # shape[-1] is even here (random_member checks)
    nb = shape[-1] // block
    scales = (rng.random(shape[:-1] + (nb,), np.float32) * 4 + 0.01).astype(DTYPES[tag])
    zps = rng.integers(-5, 6, size=shape[:-1] + (nb,), dtype=np.int32)
    bufs = [buf, np.frombuffer(scales.tobytes(), np.uint8), np.frombuffer(zps.tobytes(), np.uint8)]
    d = TensorDescriptor(E.INT8, shape, RowMajorLayout(), handles(bufs),
                         quantization=PerBlockAffine(len(shape) - 1, block, 1, 2, scale_type_tag=tag),
                         **member_sections(shape, shard_offset, parent_shape, role))
    wide_s = np.repeat(scales.astype(np.float32), block, axis=-1)
    wide_z = np.repeat(zps, block, axis=-1)
    ref = (q.astype(np.int32) - wide_z).astype(np.float32) * wide_s
    return T(d, [memoryview(b) for b in bufs]), ref.astype(DTYPES[tag])


def split_boxes(rng, offset, shape, depth):
    """Irregular exact partition of a box by random axis-aligned cuts."""
    if depth == 0 or rng.random() < 0.3:
        return [(offset, shape)]
    axes = [k for k, n in enumerate(shape) if n > 1]
    if not axes:
        return [(offset, shape)]
    k = int(rng.choice(axes))
    cut = int(rng.integers(1, shape[k]))
    s1, s2 = list(shape), list(shape)
    s1[k], s2[k] = cut, shape[k] - cut
    o2 = list(offset)
    o2[k] += cut
    return split_boxes(rng, offset, tuple(s1), depth - 1) + split_boxes(rng, tuple(o2), tuple(s2), depth - 1)


def random_member(rng, tag, off, shp, parent_shape, role=None, depth=0, allow_nested=True):
    """(member, reference array of the box) in a random encoding that decodes to ``tag``."""
    kinds = ["row", "col", "strided_rev", "coo", "quant"]
    if tag not in (E.FLOAT32, E.FLOAT16, E.BFLOAT16) or (tag != E.FLOAT32 and (not shp or shp[-1] % 2)):
        kinds.remove("quant")  # no quantized member decodes to this type / shape (see quantized_member)
    if len(shp) != 2:
        kinds.append("row")
    else:
        kinds.append("csr")
    if allow_nested and depth < 2 and np.prod(shp) > 1:
        kinds.append("nested")
    kind = rng.choice(kinds)
    if kind == "quant":
        return quantized_member(rng, shp, tag, off, parent_shape, role)
    if kind == "nested":
        boxes = split_boxes(rng, tuple(0 for _ in shp), shp, 2)
        members, parts = [], []
        for o, s in boxes:
            m, r = random_member(rng, tag, o, s, shp, None, depth + 1)
            members.append(m)
            parts.append((o, r))
        sub = C(TensorDescriptor(tag, shp, head(shp, tag, P, len(members)).layout, (),
                                 **member_sections(shp, off, parent_shape, None)), members)
        return sub, ref_partition(shp, DTYPES[tag], parts)
    vals = random_values(rng, shp, tag)
    if kind in ("coo", "csr"):
        vals[rng.random(shp) < 0.6] = 0
        vals[vals == 0] = 0  # -0.0 is not stored (it compares equal to zero): unstored reads as +0.0
        if kind == "csr":
            return csr_tensor(vals, tag, off, parent_shape, role), vals
        coords = np.argwhere(vals != 0)
        if rng.random() < 0.5:
            coords = coords[rng.permutation(len(coords))]
            return coo_tensor(coords, vals[tuple(coords.T)], shp, tag, False, off, parent_shape, role), vals
        return coo_tensor(coords, vals[tuple(coords.T)], shp, tag, True, off, parent_shape, role), vals
    return dense_tensor(vals, tag, kind, off, parent_shape, role), vals


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), tag=st.sampled_from(HEAD_TYPES),
       seed=st.integers(0, 2 ** 32 - 1))
def test_random_partitions(shape, tag, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    members, parts = [], []
    for off, shp in split_boxes(rng, tuple(0 for _ in shape), shape, 4):
        m, ref = random_member(rng, tag, off, shp, shape)
        members.append(m)
        parts.append((off, ref))
    order = rng.permutation(len(members))  # box order is free in a partition
    comp = C(head(shape, tag, P, len(members)), [members[i] for i in order])
    expected = ref_partition(shape, DTYPES[tag], parts)
    got = materialize(comp)
    assert bits_equal(got, expected)
    idx = tuple(int(rng.integers(0, n)) for n in shape)
    assert bits_equal(np.array(lookup(comp, idx), DTYPES[tag]), expected[idx])
    lo = [int(rng.integers(0, n)) for n in shape]
    hi = [int(rng.integers(l, n + 1)) for l, n in zip(lo, shape)]
    region = tuple(slice(a, b) for a, b in zip(lo, hi))
    assert bits_equal(read(comp, region), expected[region])


def random_box(rng, shape):
    lo = [int(rng.integers(0, n)) for n in shape]
    size = [int(rng.integers(1, n - l + 1)) for l, n in zip(lo, shape)]
    return tuple(lo), tuple(size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 8), min_size=1, max_size=3), tag=st.sampled_from(HEAD_TYPES),
       combine=st.sampled_from([CombineOp.REPLACE, CombineOp.ADD]), n_corr=st.integers(0, 5),
       seed=st.integers(0, 2 ** 32 - 1))
def test_random_overlays(shape, tag, combine, n_corr, seed):
    """Overlapping dense, sparse and nested corrections in emission order, replace or add."""
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    zero = tuple(0 for _ in shape)
    base, base_ref = random_member(rng, tag, zero, shape, shape, MemberRole.BASE, allow_nested=False)
    if isinstance(base, T) and base.descriptor.layout.tag in (0x06, 0x07):
        base_ref = base_ref  # a sparse base is zero off its stored entries: the reference array already is
    members, corrections = [base], []
    for _ in range(n_corr):
        off, shp = random_box(rng, shape)
        if rng.random() < 0.4:  # sparse: acts at its stored indices only
            vals = random_values(rng, shp, tag)
            keep = rng.random(shp) < 0.5
            coords = np.argwhere(keep)
            sorted_ = rng.random() < 0.5
            if not sorted_:
                coords = coords[rng.permutation(len(coords))]
            v = vals[tuple(coords.T)] if len(coords) else np.zeros(0, DTYPES[tag])
            members.append(coo_tensor(coords, v, shp, tag, sorted_, off, shape, MemberRole.CORRECTION))
            corrections.append(("sparse", off, coords, v))
        else:
            m, ref = random_member(rng, tag, off, shp, shape, MemberRole.CORRECTION)
            if isinstance(m, T) and m.descriptor.layout.tag in (0x06, 0x07):
                # a sparse correction touches only its stored indices
                c = np.argwhere(ref != 0) if m.descriptor.layout.tag == 0x07 else \
                    np.frombuffer(m.buffers[1], np.uint64).reshape(-1, len(shape)).astype(np.int64)
                corrections.append(("sparse", off, c, ref[tuple(c.T)] if len(c) else np.zeros(0, DTYPES[tag])))
            else:
                corrections.append(("dense", off, ref))
            members.append(m)
    comp = C(head(shape, tag, O, len(members), combine), members)
    expected = ref_overlay(base_ref, corrections, combine)
    assert bits_equal(materialize(comp), expected)
    idx = tuple(int(rng.integers(0, n)) for n in shape)
    assert bits_equal(np.array(lookup(comp, idx), DTYPES[tag]), expected[idx])
    lo, size = random_box(rng, shape)
    region = tuple(slice(a, a + s) for a, s in zip(lo, size))
    assert bits_equal(read(comp, region), expected[region])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), combine=st.sampled_from([CombineOp.REPLACE, CombineOp.ADD]))
def test_nested_overlay_inside_partition(seed, combine):
    """A partition whose members are overlays (each with its own base and corrections)."""
    rng = np.random.default_rng(seed)
    shape, tag = (6, 8), E.FLOAT16
    members, parts = [], []
    for off, shp in [((0, 0), (6, 3)), ((0, 3), (6, 5))]:
        zero = (0, 0)
        base, base_ref = random_member(rng, tag, zero, shp, shp, MemberRole.BASE, allow_nested=False)
        coff, cshp = random_box(rng, shp)
        cvals = random_values(rng, cshp, tag)
        corr = dense_tensor(cvals, tag, "col", coff, shp, MemberRole.CORRECTION)
        sub = C(TensorDescriptor(tag, shp, head(shp, tag, O, 2, combine).layout, (),
                                 **member_sections(shp, off, shape, None)), [base, corr])
        members.append(sub)
        parts.append((off, ref_overlay(base_ref, [("dense", coff, cvals)], combine)))
    comp = C(head(shape, tag, P, 2), members)
    expected = ref_partition(shape, np.float16, parts)
    assert bits_equal(materialize(comp), expected)
    assert bits_equal(np.array(lookup(comp, (5, 7)), np.float16), expected[5, 7])
    assert bits_equal(read(comp, (slice(1, 5), slice(2, 6))), expected[1:5, 2:6])


def test_overlay_read_skips_corrections_outside_the_region():
    shape = (4, 4)
    base = dense_tensor(np.arange(16, dtype=np.float32).reshape(shape), E.FLOAT32, "row", (0, 0), shape,
                        MemberRole.BASE)
    broken = T(TensorDescriptor(E.FLOAT32, (2, 2), RowMajorLayout(), handles([b""]),
                                **member_sections((2, 2), (2, 2), shape, MemberRole.CORRECTION)), [memoryview(b"")])
    comp = C(head(shape, E.FLOAT32, O, 2, CombineOp.ADD), [base, broken])
    assert bits_equal(read(comp, (slice(0, 2), slice(0, 4))), np.arange(8, dtype=np.float32).reshape(2, 4))
    assert lookup(comp, (1, 1)) == 5.0
    with pytest.raises(HurraySchemaError):
        materialize(comp)


def test_lookup_in_quantized_members_matches_materialize():
    """lookup computes one element's block parameters without decoding the member."""
    rng = np.random.default_rng(11)
    from support.evaluate_reference import block_affine_int4_tensor
    shape = (6, 40)
    a, ra = block_affine_int4_tensor(6, 24, 16, rng, scale_tag=E.FLOAT16, shard_offset=(0, 0), parent_shape=shape)
    b, rb = block_affine_int4_tensor(6, 16, 8, rng, scale_tag=E.FLOAT16, shard_offset=(0, 24), parent_shape=shape)
    comp = C(head(shape, E.FLOAT16, P, 2), [a, b])
    expected = ref_partition(shape, np.float16, [((0, 0), ra), ((0, 24), rb)])
    assert bits_equal(materialize(comp), expected)
    for idx in [(0, 0), (5, 23), (3, 17), (2, 24), (5, 39), (1, 31)]:
        assert bits_equal(np.array(lookup(comp, idx), np.float16), expected[idx])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("combine", ["add", "replace"])
def test_overlays_merge_the_same_bits_with_numpy_standing_in(dtype, combine):
    """A cold process's one-off merge (NumPy standing in for the decode, the float16 / bfloat16 additions
    and the patch's COO linearization: jit.Kernel.worth_it) gives the kernels' bits: SpQR (its sparse
    correction fused into the int4 decode by the kernel) and a dense correction, NaNs and infinities
    among the values."""
    import hurray_schema as hs
    from hurray_schema.evaluate import jit

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((64, 192)) * 4).astype(dtype)
    patch = (rng.standard_normal((16, 40)) * 4).astype(dtype)
    patch[0, :4] = [np.nan, -np.nan, np.inf, -np.inf]
    base = w.copy()
    base[3, :3] = [np.nan, np.inf, 0]
    items = [hs.spqr(w, bits=4, block_size=64, outliers=0.05, combine_op=combine),
             hs.overlay(base, [(patch, (8, 100))], combine)]
    for item in items:
        got = {}
        for at_hand in (False, True):
            with pytest.MonkeyPatch.context() as monkeypatch:
                monkeypatch.setattr(jit.Kernel, "worth_it", lambda self, work, compile_after, index=0, at=at_hand: at)
                got[at_hand] = materialize(item).tobytes()
        assert got[False] == got[True]
