"""The evaluation budget (``Limits.max_evaluation_bytes``) and valid inputs that used to crash.

Budget: ``to_numpy``, densify, ``materialize`` and ``read`` charge their cost against the
budget before allocating (rule: ``hurray_schema.evaluate.tensor`` module docstring); the
hostile inputs of issue 12 are refused with little memory traced.  Crashes: a scalar
partition or overlay, empty tensors with huge other extents, private element types and an
unassigned type tag kept by a permissive reader give a value or a ``HurraySchemaError``.
Inputs come from the reference writer (pyhurray) where it can write them; expected values
from NumPy on the same bytes, or literals.
"""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema import (BufferHandle, CompositeLayout, CompositionRule, Limits, LimitExceeded, Shard,
                           StridedLayout, Tensor, TensorDescriptor, TiledLayout)
from hurray_schema.errors import HurraySchemaError, UnsupportedEvaluation
from hurray_schema.evaluate import densify, materialize, read
from hurray_schema.io.stream import read_stream, write_stream
from hurray_schema.limits import DEFAULT_LIMITS
from hurray_schema.structs._declare import static_offset
from hurray_schema.structs.descriptor import FIXED_HEADER

hurray = pytest.importorskip("hurray")

f32 = hurray.float32
GiB, MiB = 1 << 30, 1 << 20
TRACED_CEILING = 10 * MiB  # the bound on what refusing a hostile input may allocate


def reference_stream(*tensors) -> bytes:
    with hurray.StreamWriter() as w:
        for t in tensors:
            w.write(t)
    return w.getvalue()


def only_item(data: bytes, **kw):
    items = list(read_stream(data, **kw))
    assert len(items) == 1
    return items[0]


def traced_peak(fn) -> int:
    """Peak bytes traced while ``fn()`` runs (it must raise ``LimitExceeded``)."""
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded) as caught:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.limit == "max_evaluation_bytes"
    return peak


# --------------------------------------------------------------------------------------
# The hostile inputs of the issue
# --------------------------------------------------------------------------------------


def hostile_coo() -> bytes:
    """153 bytes: float32 COO of shape [536870915, 3] with 3 entries (6.4 GB dense)."""
    values = np.array([1.0, 2.0, 3.0], np.float32)
    indices = np.array([[0, 0], [1, 1], [536870914, 2]], np.uint64)
    return reference_stream(hurray.sparse_coo(values, indices, [536870915, 3]))


def stride0_stream(count: int) -> bytes:
    """A float32 [count] strided tensor whose one stride is 0 over a 4-byte buffer (the reference
    refuses to write it -- it wants count * 4 bytes -- but strided.md allows stride 0)."""
    desc = TensorDescriptor(hs.ElementType.FLOAT32, (count,), StridedLayout((0,)), buffers=(BufferHandle(4),))
    sink = io.BytesIO()
    write_stream(sink, [Tensor(desc, [np.float32(7.0).tobytes()])])
    return sink.getvalue()


def test_the_153_byte_coo_stream_is_refused_small():
    data = hostile_coo()
    assert len(data) == 153
    tensor = only_item(data)
    peak = traced_peak(tensor.to_numpy)
    assert peak < TRACED_CEILING
    with pytest.raises(LimitExceeded) as caught:
        densify(tensor.descriptor, tensor.buffers)
    assert caught.value.value == 536870915 * 3 * 4 and caught.value.maximum == GiB


def test_the_65_byte_stride_0_stream_is_refused_small():
    """The issue's input asks for 512 MiB: under the 1 GiB default it is a valid evaluation, so it is
    refused under a lower budget; the same 65 bytes asking for 16 GiB are refused by default."""
    data = stride0_stream(1 << 27)
    assert len(data) == 65
    tensor = only_item(data)
    peak = traced_peak(lambda: tensor.to_numpy(limits=Limits(max_evaluation_bytes=256 * MiB)))
    assert peak < TRACED_CEILING
    huge = only_item(stride0_stream(1 << 32))
    assert len(stride0_stream(1 << 32)) == 65
    assert traced_peak(huge.to_numpy) < TRACED_CEILING


def test_raising_the_budget_lets_the_broadcast_through():
    tensor = only_item(stride0_stream(1 << 10))
    with pytest.raises(LimitExceeded):
        tensor.to_numpy(limits=Limits(max_evaluation_bytes=4 * 1024 - 1))
    got = tensor.to_numpy(limits=Limits(max_evaluation_bytes=4 * 1024))
    np.testing.assert_array_equal(got, np.full(1 << 10, 7.0, np.float32))


# --------------------------------------------------------------------------------------
# The rule, at its boundaries
# --------------------------------------------------------------------------------------


def test_the_default_budget_is_one_gib_and_raisable():
    assert DEFAULT_LIMITS.max_evaluation_bytes == GiB
    assert Limits(max_evaluation_bytes=(1 << 64) - 1).max_evaluation_bytes == (1 << 64) - 1
    with pytest.raises(ValueError):
        Limits(max_evaluation_bytes=1 << 64)


def test_to_numpy_charges_exactly_its_output():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = only_item(reference_stream(hurray.from_numpy(values)))
    with pytest.raises(LimitExceeded) as caught:
        tensor.to_numpy(limits=Limits(max_evaluation_bytes=47))
    assert (caught.value.value, caught.value.maximum) == (48, 47)
    np.testing.assert_array_equal(tensor.to_numpy(limits=Limits(max_evaluation_bytes=48)), values)


def test_an_offset_table_is_charged_8_bytes_per_element():
    """A tiled float32 [4, 4]: 64 output bytes + 16 int64 offsets = 192."""
    values = np.arange(16, dtype=np.float32)
    desc = TensorDescriptor(hs.ElementType.FLOAT32, (4, 4), TiledLayout((4, 4)), buffers=(BufferHandle(64),))
    with pytest.raises(LimitExceeded) as caught:
        hs.tensor_to_numpy(desc, [values.tobytes()], limits=Limits(max_evaluation_bytes=191))
    assert caught.value.value == 192
    got = hs.tensor_to_numpy(desc, [values.tobytes()], limits=Limits(max_evaluation_bytes=192))
    np.testing.assert_array_equal(got, values.reshape(4, 4))  # one tile, row-major inside: the buffer order


def test_sparse_densify_charges_the_dense_array():
    values = np.array([5.0, 7.0], np.float32)
    coo = only_item(reference_stream(hurray.sparse_coo(values, np.array([[0, 0], [1, 1]], np.uint64), [2, 3])))
    with pytest.raises(LimitExceeded):
        densify(coo.descriptor, coo.buffers, limits=Limits(max_evaluation_bytes=23))
    np.testing.assert_array_equal(densify(coo.descriptor, coo.buffers, limits=Limits(max_evaluation_bytes=24)),
                                  [[5, 0, 0], [0, 7, 0]])


def _partition_8x8():
    a = hurray.Tensor(np.arange(32, dtype=np.float32).tobytes(), f32, [4, 8], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(np.arange(32, 64, dtype=np.float32).tobytes(), f32, [4, 8], shard=hurray.Shard([8, 8], [4, 0]))
    return only_item(reference_stream(hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b])))


def test_materialize_charges_the_head_and_out_is_not_charged():
    part = _partition_8x8()
    expected = np.arange(64, dtype=np.float32).reshape(8, 8)
    with pytest.raises(LimitExceeded) as caught:
        part.materialize(limits=Limits(max_evaluation_bytes=255))
    assert caught.value.value == 256
    np.testing.assert_array_equal(part.materialize(limits=Limits(max_evaluation_bytes=256)), expected)
    out = np.empty((8, 8), np.float32)
    assert part.materialize(out=out, limits=Limits(max_evaluation_bytes=0)) is out
    np.testing.assert_array_equal(out, expected)


def test_a_group_is_charged_the_sum_of_its_members():
    members = [hurray.Tensor(bytes(16), f32, [4]), hurray.Tensor(bytes(8), f32, [2])]
    group = only_item(reference_stream(hurray.Composite("group", shape=[2], dtype=f32, members=members)))
    with pytest.raises(LimitExceeded) as caught:
        group.materialize(limits=Limits(max_evaluation_bytes=23))
    assert caught.value.value == 24
    got = group.materialize(limits=Limits(max_evaluation_bytes=24))
    assert [g.shape for g in got] == [(4,), (2,)]


def test_read_charges_the_region_not_a_directly_addressable_member():
    part = _partition_8x8()
    expected = np.arange(64, dtype=np.float32).reshape(8, 8)
    region = (slice(3, 5), slice(0, 2))  # 4 elements across both members
    with pytest.raises(LimitExceeded) as caught:
        part.read(region, limits=Limits(max_evaluation_bytes=15))
    assert caught.value.value == 16
    np.testing.assert_array_equal(part.read(region, limits=Limits(max_evaluation_bytes=16)), expected[3:5, 0:2])


def test_read_charges_a_member_it_decodes_whole():
    """A sparse correction of an overlay is decoded whole; a tiled member too (offset table)."""
    values = np.arange(16, dtype=np.float32)
    shard = Shard((4, 4), (0, 0))
    member = TensorDescriptor(hs.ElementType.FLOAT32, (4, 4), TiledLayout((2, 2)), buffers=(BufferHandle(64),),
                              shard=shard)
    head = TensorDescriptor(hs.ElementType.FLOAT32, (4, 4), CompositeLayout(CompositionRule.PARTITION, 1))
    part = hs.Composite(head, [Tensor(member, [values.tobytes()])])
    with pytest.raises(LimitExceeded) as caught:
        read(part, ((0, 1), (0, 1)), limits=Limits(max_evaluation_bytes=191))
    assert caught.value.value == 192  # the member: 64 bytes of values + 16 offsets
    assert read(part, ((0, 1), (0, 1)), limits=Limits(max_evaluation_bytes=192))[0, 0] == 0.0


# --------------------------------------------------------------------------------------
# Valid inputs that crashed
# --------------------------------------------------------------------------------------


def _scalar(value) -> "hurray.Tensor":
    return hurray.Tensor(np.float32(value).tobytes(), f32, [], shard=hurray.Shard([], []))


def test_a_scalar_partition_materializes():
    part = only_item(reference_stream(hurray.Composite("partition", shape=[], dtype=f32, members=[_scalar(3.5)])))
    got = part.materialize()
    assert got.shape == () and got.dtype == np.float32 and got == np.float32(3.5)
    assert part.read(()) == np.float32(3.5) and part.lookup(()) == np.float32(3.5)


@pytest.mark.parametrize("op, expected", [("add", 3.5), ("replace", 2.0)])
def test_a_scalar_overlay_materializes_and_reads(op, expected):
    over = only_item(reference_stream(hurray.Composite("overlay", shape=[], dtype=f32,
                                                       members=[_scalar(1.5), _scalar(2.0)], combine_op=op)))
    assert over.materialize() == np.float32(expected)
    assert over.read(()) == np.float32(expected)
    assert over.lookup(()) == np.float32(expected)


@pytest.mark.parametrize("op", ["add", "replace"])
def test_a_scalar_float16_overlay(op):
    f16 = hurray.float16
    base = hurray.Tensor(np.float16(1.5).tobytes(), f16, [], shard=hurray.Shard([], []))
    corr = hurray.Tensor(np.float16(0.25).tobytes(), f16, [], shard=hurray.Shard([], []))
    over = only_item(reference_stream(hurray.Composite("overlay", shape=[], dtype=f16, members=[base, corr],
                                                       combine_op=op)))
    expected = np.float16(1.75) if op == "add" else np.float16(0.25)
    assert over.materialize() == expected and over.read(()) == expected


def test_empty_tensors_with_huge_extents():
    """[0, 2**60] float32 is an empty NumPy array; [0, 2**62] float32 is no NumPy array at all (its
    non-zero extents times the item size overflow NumPy's index range), reported as such."""
    small = only_item(reference_stream(hurray.Tensor(b"", f32, [0, 1 << 60])))
    got = small.to_numpy()
    assert got.shape == (0, 1 << 60) and got.dtype == np.float32
    huge = only_item(reference_stream(hurray.Tensor(b"", f32, [0, 1 << 62])))
    with pytest.raises(UnsupportedEvaluation):
        huge.to_numpy()


@pytest.mark.parametrize("extent, representable", [(1 << 60, True), (1 << 62, False)])
def test_empty_sparse_with_huge_extents(extent, representable):
    coo = only_item(reference_stream(hurray.sparse_coo(np.zeros(0, np.float32), np.zeros((0, 2), np.uint64),
                                                       [0, extent])))
    if representable:
        assert coo.to_numpy().shape == (0, extent)
        assert densify(coo.descriptor, coo.buffers).shape == (0, extent)
    else:
        with pytest.raises(UnsupportedEvaluation):
            coo.to_numpy()


@pytest.mark.parametrize("extent, representable", [(1 << 60, True), (1 << 62, False)])
def test_empty_partition_with_huge_extents(extent, representable):
    member = hurray.Tensor(b"", f32, [0, extent], shard=hurray.Shard([0, extent], [0, 0]))
    part = only_item(reference_stream(hurray.Composite("partition", shape=[0, extent], dtype=f32, members=[member])))
    if representable:
        assert part.materialize().shape == (0, extent)
        assert part.read(((0, 0), (0, 3))).shape == (0, 3)
    else:
        with pytest.raises(UnsupportedEvaluation):
            part.materialize()
        assert part.read(((0, 0), (0, 3))).shape == (0, 3)  # the region itself is representable


@pytest.mark.parametrize("bits, code_dtype", [(8, "<u1"), (16, "<u2"), (32, "<u4"), (64, "<u8")])
def test_private_types_of_whole_byte_width_are_raw_unsigned_codes(bits, code_dtype):
    raw = bytes(range(256))[: 12 * bits // 8]
    ext = hurray.ExtensionType(bit_width=bits)
    tensor = only_item(reference_stream(hurray.Tensor(raw, hurray.Dtype.from_tag(0xF7), [3, 4], extension_type=ext)))
    got = tensor.to_numpy()
    assert got.dtype == np.dtype(code_dtype)
    np.testing.assert_array_equal(got, np.frombuffer(raw, code_dtype).reshape(3, 4))


@pytest.mark.parametrize("tag, bits, count", [(0xF0, 4, 12), (0xF3, 24, 12), (0xFE, 1, 16), (0xF5, 2, 8)])
def test_private_types_of_other_widths_are_unsupported(tag, bits, count):
    ext = hurray.ExtensionType(bit_width=bits, is_signed=bits == 24)
    raw = bytes(-(-count * bits // 8))
    tensor = only_item(reference_stream(hurray.Tensor(raw, hurray.Dtype.from_tag(tag), [count], extension_type=ext)))
    with pytest.raises(UnsupportedEvaluation):
        tensor.to_numpy()


def test_a_private_float_type_comes_back_as_codes():
    """A 16-bit private float (float16-like) has no meaning here: its codes come back as uint16."""
    ext = hurray.ExtensionType(bit_width=16, is_float=True, sign_bits=1, exponent_bits=5, mantissa_bits=10,
                               exponent_bias=15, has_nan=True, has_inf=True)
    raw = np.array([0x3C00, 0xC000, 0x7C00], "<u2").tobytes()
    tensor = only_item(reference_stream(hurray.Tensor(raw, hurray.Dtype.from_tag(0xFE), [3], extension_type=ext)))
    np.testing.assert_array_equal(tensor.to_numpy(), [0x3C00, 0xC000, 0x7C00])


def test_an_unassigned_type_tag_kept_by_a_permissive_reader_is_unsupported():
    data = bytearray(reference_stream(hurray.Tensor(bytes(32), hurray.uint64, [4])))
    data[static_offset(FIXED_HEADER, "type_tag")] = 0x60  # no element type has this tag
    tensor = only_item(bytes(data), mode="permissive")
    assert int(tensor.descriptor.type_tag) == 0x60
    with pytest.raises(UnsupportedEvaluation):
        tensor.to_numpy()
    with pytest.raises(HurraySchemaError):
        tensor.to_numpy(dtype=0x60)


# --------------------------------------------------------------------------------------
# Quantized sparse values: parameters looked up at the stored coordinates only
# --------------------------------------------------------------------------------------


def _quantized_coo(shape, coords, codes, quantization, params: bytes) -> TensorDescriptor:
    rank = len(shape)
    indices = np.array(coords, "<u8").reshape(-1, rank)
    desc = TensorDescriptor(hs.ElementType.UINT8, shape, hs.CooLayout(len(codes), 1),
                            buffers=(BufferHandle(len(codes)), BufferHandle(indices.nbytes), BufferHandle(len(params))),
                            quantization=quantization)
    return desc, [bytes(codes), indices.tobytes(), params]


def test_per_channel_sparse_values_use_their_channel():
    """Scales [1, 2, 4] along axis 1: code 3 at (0, 2) is 12, code 5 at (1, 0) is 5."""
    quant = hs.PerChannelAffine(axis=1, scale_buffer_index=2, flags=1)
    desc, buffers = _quantized_coo((2, 3), [[0, 2], [1, 0]], [3, 5], quant, np.array([1, 2, 4], "<f4").tobytes())
    coords, values = hs.evaluate.sparse_entries(desc, buffers)
    np.testing.assert_array_equal(values, np.array([12.0, 5.0], np.float32))
    np.testing.assert_array_equal(hs.tensor_to_numpy(desc, buffers), [[0, 0, 12], [5, 0, 0]])


def test_per_block_sparse_values_use_their_block():
    """Blocks of 2 along axis 1 of a [2, 4]: block index = row * 2 + column // 2; scales 1, 2, 4, 8."""
    quant = hs.PerBlockAffine(axis=1, block_size=2, scale_buffer_index=2, flags=1)
    desc, buffers = _quantized_coo((2, 4), [[0, 3], [1, 1], [1, 2]], [1, 1, 1], quant,
                                   np.array([1, 2, 4, 8], "<f4").tobytes())
    _, values = hs.evaluate.sparse_entries(desc, buffers)
    np.testing.assert_array_equal(values, np.array([2.0, 4.0, 8.0], np.float32))


def test_a_huge_quantized_sparse_tensor_is_read_entry_by_entry():
    """One entry of a per-tensor quantized [2**30] COO: its entries are read with no table of the
    whole shape (lookup and overlay corrections read them unbudgeted: they are bounded by the input)."""
    quant = hs.PerTensorAffine(0.5, 3)
    desc, buffers = _quantized_coo((1 << 30,), [[1 << 29]], [7], quant, b"")
    desc = TensorDescriptor(desc.type_tag, desc.shape, desc.layout, buffers=desc.buffers[:2], quantization=quant)
    tracemalloc.start()
    try:
        coords, values = hs.evaluate.sparse_entries(desc, buffers[:2])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < TRACED_CEILING
    assert coords.tolist() == [[1 << 29]] and values.tolist() == [2.0]  # (7 - 3) * 0.5


def test_a_partition_of_a_private_type_is_its_raw_codes():
    """The reference cannot write a composite of a private type; ours round-trips through a stream."""
    ext = hs.ExtensionType(16)
    head = TensorDescriptor(0xF7, (4,), CompositeLayout(CompositionRule.PARTITION, 2), extension_type=ext)
    members = [Tensor(TensorDescriptor(0xF7, (2,), buffers=(BufferHandle(4),), extension_type=ext,
                                       shard=Shard((4,), (start,))),
                      [np.array([10 * start, 10 * start + 1], "<u2").tobytes()]) for start in (0, 2)]
    sink = io.BytesIO()
    write_stream(sink, [hs.Composite(head, members)])
    part = only_item(sink.getvalue())
    got = part.materialize()
    assert got.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(got, [0, 1, 20, 21])
    np.testing.assert_array_equal(part.read(((1, 3),)), [1, 20])
    assert part.lookup((3,)) == 21


# --------------------------------------------------------------------------------------
# Found by the evaluation fuzz (tests/test_fuzz_mutations.py::test_evaluation_survives_mutations)
# --------------------------------------------------------------------------------------


def test_a_quantization_scheme_kept_opaque_is_unsupported():
    """A permissive reader keeps an unknown scheme as ``UnknownQuantization`` (it has no axis)."""
    desc = TensorDescriptor(hs.ElementType.UINT8, (4,), buffers=(BufferHandle(4),),
                            quantization=hs.UnknownQuantization(0x77, 1, 0))
    with pytest.raises(UnsupportedEvaluation):
        hs.tensor_to_numpy(desc, [bytes(4)])


@pytest.mark.parametrize("layout", [TiledLayout((1 << 63, 1)), TiledLayout((2, 2), hs.LayoutTag.STRIDED, hs.LayoutTag.ROW_MAJOR, outer_strides=(1 << 63, 1))])
def test_tiled_fields_beyond_64_bit_offsets_are_refused(layout):
    desc = TensorDescriptor(hs.ElementType.FLOAT32, (4, 4), layout, buffers=(BufferHandle(64),))
    with pytest.raises(HurraySchemaError):
        hs.tensor_to_numpy(desc, [bytes(64)])
