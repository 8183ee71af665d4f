"""The tests' reference decoding (tests/support/reference_decode.py) against values worked out by
hand from the spec's formulas and examples: the oracle is checked before it judges anything."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from support.evaluate_reference import C, T, coo_tensor, dense_tensor, handles, head, pack_int4
from support.reference_decode import code_values, reference_array
from hurray_schema.model import (ColumnMajorLayout, CombineOp, CompositionRule, CscLayout, CsrLayout, ElementType,
                                 MemberRole, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine,
                                 QuantFlag, RowMajorLayout, StridedLayout, TensorDescriptor)

E = ElementType


def tensor(tag, shape, buffers, layout=None, quantization=None, byte_offset=0) -> T:
    buffers = [np.frombuffer(bytes(b), np.uint8) for b in buffers]
    desc = TensorDescriptor(tag, shape, layout or RowMajorLayout(), handles(buffers), byte_offset=byte_offset,
                            quantization=quantization)
    return T(desc, buffers)


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), (got, want)


def test_codes_of_sub_byte_and_narrow_float_types():
    """element-types.md: two's complement sub-byte integers, OCP float8 / float4 bit patterns."""
    same(code_values([0, 1, 7, 8, 15], E.INT4), np.array([0, 1, 7, -8, -1], ml_dtypes.int4))
    same(code_values([0, 3], E.INT2), np.array([0, -1], ml_dtypes.int2))
    same(code_values([0x38, 0xB8, 0x40], E.FLOAT8_E4M3), np.array([1.0, -1.0, 2.0], ml_dtypes.float8_e4m3fn))
    same(code_values([0x2, 0xF], E.FLOAT4_E2M1), np.array([1.0, -6.0], ml_dtypes.float4_e2m1fn))


def test_bool_packing_example():
    """element-types.md § Boolean Type: [5] stored as 0x0D is [true, false, true, true, false]."""
    same(reference_array(tensor(E.BOOL, (5,), [b"\x0d"])), np.array([True, False, True, True, False]))


def test_dense_layouts_and_strides():
    values = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    for layout in ("row", "col", "strided_rev"):
        same(reference_array(dense_tensor(values, E.FLOAT32, layout)), values)
    # uint2 [2, 3], strides [1, 2], one byte in (memory-layout.md § Sub-Byte Types): element offset
    # i + 2 * j at bits 2 * offset of the bytes after byte_offset, LSB first
    codes = np.array([[0, 1, 2], [3, 2, 1]])
    stored = bytes([0xFF, 0b10_01_11_00, 0b00_00_01_10])  # offsets 0..5 hold 0, 3, 1, 2 | 2, 1
    got = reference_array(tensor(E.UINT2, (2, 3), [stored], StridedLayout((1, 2)), byte_offset=1))
    same(got, codes.astype(ml_dtypes.uint2))


def test_csr_and_csc_examples():
    """layouts/csr.md and csc.md § Example: the buffers the spec lists."""
    u64 = lambda xs: np.array(xs, "<u8").tobytes()  # noqa: E731
    f32 = lambda xs: np.array(xs, "<f4").tobytes()  # noqa: E731
    csr = tensor(E.FLOAT32, (4, 5), [f32([1, 2, 3, 4, 5]), u64([0, 3, 2, 1, 4]), u64([0, 2, 3, 5, 5])], CsrLayout(5))
    want = np.zeros((4, 5), np.float32)
    want[0, 0], want[0, 3], want[1, 2], want[2, 1], want[2, 4] = 1, 2, 3, 4, 5
    same(reference_array(csr), want)
    csc = tensor(E.FLOAT32, (3, 5), [f32([1, 4, 3, 2, 5]), u64([0, 2, 1, 0, 2]), u64([0, 1, 2, 3, 4, 5])],
                 CscLayout(5))
    want = np.zeros((3, 5), np.float32)
    want[0, 0], want[2, 1], want[1, 2], want[0, 3], want[2, 4] = 1, 4, 3, 2, 5
    same(reference_array(csc), want)


def test_per_tensor_and_per_channel_affine():
    """x = scale * (q - zero_point), float32."""
    t = tensor(E.INT8, (3,), [np.array([-3, 0, 5], np.int8).tobytes()], quantization=PerTensorAffine(0.5, 1))
    same(reference_array(t), np.array([-2.0, -0.5, 2.0], np.float32))
    q = PerChannelAffine(axis=0, scale_buffer_index=1, zero_point_buffer_index=2)
    t = tensor(E.UINT8, (2, 2), [bytes([10, 20, 30, 40]), np.array([0.5, 2.0], "<f4").tobytes(),
                                 np.array([10, 20], "<i4").tobytes()], quantization=q)
    same(reference_array(t), np.array([[0.0, 5.0], [20.0, 40.0]], np.float32))


@pytest.mark.parametrize("layout", ["row", "col"])
def test_per_block_affine_with_a_partial_block(layout):
    """int4 [2, 5], block 4 along axis 1: two blocks a row, the second holding one element and three
    padding codes; float16 scales, so the values are float16 (float32 arithmetic, one rounding).
    Stored column-major as [5, 2] (axis 0) it is the same storage and block mapping, transposed."""
    codes = np.array([[1, -2, 3, 7, -8, 0, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0]])
    scales = np.array([0.5, 2.0, 0.25, 1.0], "<f2").tobytes()
    zeros = np.array([1, 0, -1, 2], "<i4").tobytes()
    want = np.array([[0.0, -1.5, 1.0, 3.0, -16.0], [0.25, 0.5, 0.75, 1.0, 2.0]], np.float16)
    axis, shape, lay = (1, (2, 5), RowMajorLayout()) if layout == "row" else (0, (5, 2), ColumnMajorLayout())
    q = PerBlockAffine(axis=axis, block_size=4, scale_buffer_index=1, zero_point_buffer_index=2,
                       scale_type_tag=E.FLOAT16)
    got = reference_array(tensor(E.INT4, shape, [pack_int4(codes), scales, zeros], lay, quantization=q))
    same(got, want if layout == "row" else np.ascontiguousarray(want.T))
    symmetric = PerBlockAffine(axis=1, block_size=4, scale_buffer_index=1, flags=QuantFlag.SYMMETRIC,
                               scale_type_tag=E.FLOAT16)
    got = reference_array(tensor(E.INT4, (2, 5), [pack_int4(codes), scales], quantization=symmetric))
    same(got, np.array([[0.5, -1.0, 1.5, 3.5, -16.0], [0.0, 0.25, 0.5, 0.75, 4.0]], np.float16))


def test_nf4_and_mxfp():
    """NF4: x = absmax * nf4[q] (nf4.md § Lookup Table); MXFP: x = 2^(e - 127) * value(q)."""
    codes = np.array([0, 7, 15, 8, 1, 14, 3, 12], np.uint8)
    t = tensor(E.UINT4, (8,), [pack_int4(codes), np.array([2.0], "<f4").tobytes()],
               quantization=Nf4(axis=0, block_size=8, scale_buffer_index=1))
    levels = {0: -1.0, 7: 0.0, 15: 1.0, 8: 0.07958029955625534, 1: -0.6961928009986877,
              14: 0.7229568362236023, 3: -0.39491748809814453, 12: 0.44070982933044434}
    same(reference_array(t), np.array([np.float32(2.0) * np.float32(levels[c]) for c in codes], np.float32))
    codes = bytes([0x38, 0xB8, 0x40, 0x00] * 8)  # 1.0, -1.0, 2.0, 0.0 in float8_e4m3
    t = tensor(E.FLOAT8_E4M3, (2, 16), [codes, bytes([128, 126])],
               quantization=Mxfp(axis=1, block_size=16, scale_buffer_index=1))
    same(reference_array(t), np.array([[2.0, -2.0, 4.0, 0.0] * 4, [0.5, -0.5, 1.0, 0.0] * 4], np.float32))


def test_partition_and_overlay():
    """composite.md § Composition Semantics: a partition assembles its members' boxes; an overlay
    applies its corrections in emission order (add: base plus every covering correction)."""
    shape = (2, 3)
    top, bottom = np.array([[1, 2, 3]], np.float32), np.array([[4, 5, 6]], np.float32)
    partition = C(head(shape, E.FLOAT32, CompositionRule.PARTITION, 2),
                  [dense_tensor(top, E.FLOAT32, "row", (0, 0), shape),
                   dense_tensor(bottom, E.FLOAT32, "col", (1, 0), shape)])
    same(reference_array(partition), np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    members = [dense_tensor(np.ones(shape, np.float32), E.FLOAT32, "row", (0, 0), shape, MemberRole.BASE),
               dense_tensor(np.array([[10, 20]], np.float32), E.FLOAT32, "row", (1, 1), shape, MemberRole.CORRECTION),
               coo_tensor([[0, 1]], [5.0], (1, 2), E.FLOAT32, True, (1, 0), shape, MemberRole.CORRECTION)]
    add = C(head(shape, E.FLOAT32, CompositionRule.OVERLAY, 3, CombineOp.ADD), members)
    same(reference_array(add), np.array([[1, 1, 1], [1, 16, 21]], np.float32))
    replace = C(head(shape, E.FLOAT32, CompositionRule.OVERLAY, 3, CombineOp.REPLACE), members)
    same(reference_array(replace), np.array([[1, 1, 1], [1, 5, 20]], np.float32))
