"""The evaluation budget (``Limits.max_evaluation_bytes``) and valid inputs that used to crash.

Budget: ``to_numpy``, densify, ``materialize`` and ``read`` charge their cost against the
budget before allocating, and refuse an output beyond both the budget and 64 times the bytes
the input stores (rule: ``hurray_schema.evaluate.common`` module docstring); the hostile
inputs of issue 12 are refused under the default limits with little memory traced, a large
output read from buffers of its size is not.  Crashes: a scalar
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
from hurray_schema.evaluate import densify, read
from hurray_schema.io.stream import read_stream, write_stream
from hurray_schema.limits import DEFAULT_LIMITS, EVALUATION_EXPANSION
from hurray_schema.structs._declare import static_offset
from hurray_schema.structs.descriptor import FIXED_HEADER

hurray = pytest.importorskip("hurray")

f32 = hurray.float32
MiB = 1 << 20
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
    assert caught.value.value == 536870915 * 3 * 4 and caught.value.maximum == 256 * MiB


def test_the_65_byte_stride_0_stream_is_refused_small():
    """The issue's input: 512 MiB from a 4-byte buffer, refused under the default limits; the same
    65 bytes asking for 16 GiB too."""
    data = stride0_stream(1 << 27)
    assert len(data) == 65
    tensor = only_item(data)
    assert traced_peak(tensor.to_numpy) < TRACED_CEILING
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


def test_the_default_budget_is_256_mib_and_raisable():
    assert DEFAULT_LIMITS.max_evaluation_bytes == 256 * MiB
    assert EVALUATION_EXPANSION == 64
    assert Limits(max_evaluation_bytes=(1 << 64) - 1).max_evaluation_bytes == (1 << 64) - 1
    with pytest.raises(ValueError):
        Limits(max_evaluation_bytes=1 << 64)


def test_an_output_proportional_to_its_buffers_is_not_refused():
    """4 KiB of float32 read from 4 KiB of buffer passes a 1 KiB budget; the same 4 KiB from the
    4-byte buffer of a stride-0 tensor does not."""
    values = np.arange(1024, dtype=np.float32)
    tensor = only_item(reference_stream(hurray.from_numpy(values)))
    assert sum(len(b) for b in tensor.buffers) == 4096
    np.testing.assert_array_equal(tensor.to_numpy(limits=Limits(max_evaluation_bytes=1024)), values)
    broadcast = only_item(stride0_stream(1024))
    with pytest.raises(LimitExceeded) as caught:
        broadcast.to_numpy(limits=Limits(max_evaluation_bytes=1024))
    assert (caught.value.value, caught.value.maximum) == (4096, 1024)


def test_the_expansion_allowance_is_64_times_the_stored_bytes():
    """A 4-byte buffer may give 256 bytes under any budget, not one element more."""
    zero_budget = Limits(max_evaluation_bytes=0)
    np.testing.assert_array_equal(only_item(stride0_stream(64)).to_numpy(limits=zero_budget),
                                  np.full(64, 7.0, np.float32))
    with pytest.raises(LimitExceeded) as caught:
        only_item(stride0_stream(65)).to_numpy(limits=zero_budget)
    assert caught.value.value == 260


def test_to_numpy_charges_exactly_its_output():
    """A stride-0 float32 [3, 40] (4 stored bytes): 480 output bytes, no offset table."""
    desc = TensorDescriptor(hs.ElementType.FLOAT32, (3, 40), StridedLayout((0, 0)), buffers=(BufferHandle(4),))
    buffers = [np.float32(2.5).tobytes()]
    with pytest.raises(LimitExceeded) as caught:
        hs.tensor_to_numpy(desc, buffers, limits=Limits(max_evaluation_bytes=479))
    assert (caught.value.value, caught.value.maximum) == (480, 479)
    got = hs.tensor_to_numpy(desc, buffers, limits=Limits(max_evaluation_bytes=480))
    np.testing.assert_array_equal(got, np.full((3, 40), 2.5, np.float32))


def _tiled_bool(shape=(16, 16), **fields):
    """A bool tensor in one tile (row-major inside: the buffer order), its 32 bytes of packed bits,
    and the values they hold."""
    count = int(np.prod(shape))
    packed = np.arange(count // 8, dtype=np.uint8) * 37
    desc = TensorDescriptor(hs.ElementType.BOOL, shape, TiledLayout(shape), buffers=(BufferHandle(count // 8),),
                            **fields)
    return desc, [packed.tobytes()], np.unpackbits(packed, bitorder="little").astype(bool).reshape(shape)


def test_an_offset_table_is_charged_8_bytes_per_element():
    """A tiled bool [16, 16]: 256 output bytes + 256 int64 offsets = 2304, over the 2048 bytes its
    32 stored bytes allow (the output alone is not)."""
    desc, buffers, expected = _tiled_bool()
    with pytest.raises(LimitExceeded) as caught:
        hs.tensor_to_numpy(desc, buffers, limits=Limits(max_evaluation_bytes=2303))
    assert caught.value.value == 2304
    got = hs.tensor_to_numpy(desc, buffers, limits=Limits(max_evaluation_bytes=2304))
    np.testing.assert_array_equal(got, expected)


def test_sparse_densify_charges_the_dense_array():
    """A float32 [100, 100] COO with two entries: 40 stored bytes, 40,000 dense bytes."""
    values = np.array([5.0, 7.0], np.float32)
    coo = only_item(reference_stream(hurray.sparse_coo(values, np.array([[0, 0], [99, 98]], np.uint64),
                                                       [100, 100])))
    assert sum(len(b) for b in coo.buffers) == 40
    with pytest.raises(LimitExceeded) as caught:
        densify(coo.descriptor, coo.buffers, limits=Limits(max_evaluation_bytes=39999))
    assert caught.value.value == 40000
    expected = np.zeros((100, 100), np.float32)
    expected[0, 0], expected[99, 98] = 5.0, 7.0
    np.testing.assert_array_equal(densify(coo.descriptor, coo.buffers, limits=Limits(max_evaluation_bytes=40000)),
                                  expected)


def _broadcast(value, shape, **fields) -> Tensor:
    """A float32 tensor of ``shape`` repeating ``value`` from a 4-byte buffer (all strides 0)."""
    desc = TensorDescriptor(hs.ElementType.FLOAT32, shape, StridedLayout((0,) * len(shape)),
                            buffers=(BufferHandle(4),), **fields)
    return Tensor(desc, [np.float32(value).tobytes()])


def _broadcast_partition(rows: int, cols: int) -> hs.Composite:
    """A float32 [2 * rows, cols] partition of two stride-0 members (7.0 above, 9.0 below): 8 stored bytes."""
    shape = (2 * rows, cols)
    head = TensorDescriptor(hs.ElementType.FLOAT32, shape, CompositeLayout(CompositionRule.PARTITION, 2))
    members = [_broadcast(value, (rows, cols), shard=Shard(shape, (start, 0)))
               for value, start in ((7.0, 0), (9.0, rows))]
    return hs.Composite(head, members)


def test_materialize_charges_the_head_and_out_is_not_charged():
    """A float32 [16, 16] head (1024 bytes) from 8 stored bytes (allowance 512)."""
    part = _broadcast_partition(8, 16)
    expected = np.repeat(np.array([7.0, 9.0], np.float32), 8)[:, None].repeat(16, axis=1)
    with pytest.raises(LimitExceeded) as caught:
        part.materialize(limits=Limits(max_evaluation_bytes=1023))
    assert caught.value.value == 1024
    np.testing.assert_array_equal(part.materialize(limits=Limits(max_evaluation_bytes=1024)), expected)
    out = np.empty((16, 16), np.float32)
    assert part.materialize(out=out, limits=Limits(max_evaluation_bytes=0)) is out
    np.testing.assert_array_equal(out, expected)


def test_a_composite_is_allowed_for_the_buffers_of_all_its_leaves():
    """Two dense members of 2 KiB each: the 4 KiB head passes a 1 KiB budget (materialize and read),
    though each member alone stores only half of it."""
    values = np.arange(1024, dtype=np.float32).reshape(32, 32)
    members = [hurray.Tensor(values[rows].tobytes(), f32, [16, 32], shard=hurray.Shard([32, 32], [start, 0]))
               for rows, start in ((slice(0, 16), 0), (slice(16, 32), 16))]
    part = only_item(reference_stream(hurray.Composite("partition", shape=[32, 32], dtype=f32, members=members)))
    small = Limits(max_evaluation_bytes=1024)
    np.testing.assert_array_equal(part.materialize(limits=small), values)
    np.testing.assert_array_equal(part.read((slice(0, 32), slice(0, 32)), limits=small), values)


def test_a_group_is_charged_the_sum_of_its_members():
    """Stride-0 members of 512 and 256 bytes (8 stored bytes, allowance 512): the group costs 768."""
    head = TensorDescriptor(hs.ElementType.FLOAT32, (2,), CompositeLayout(CompositionRule.GROUP, 2))
    group = hs.Composite(head, [_broadcast(1.0, (128,)), _broadcast(2.0, (64,))])
    with pytest.raises(LimitExceeded) as caught:
        group.materialize(limits=Limits(max_evaluation_bytes=767))
    assert caught.value.value == 768
    got = group.materialize(limits=Limits(max_evaluation_bytes=768))
    np.testing.assert_array_equal(got[0], np.full(128, 1.0, np.float32))
    np.testing.assert_array_equal(got[1], np.full(64, 2.0, np.float32))


def test_read_charges_the_region_not_a_directly_addressable_member():
    """A [32, 16] partition of two stride-0 [16, 16] members (1024 bytes each, from 4 bytes): a
    region of 10 rows (640 bytes) across both is charged; the members, views of their buffers, are not."""
    part = _broadcast_partition(16, 16)
    region = (slice(12, 22), slice(0, 16))
    with pytest.raises(LimitExceeded) as caught:
        part.read(region, limits=Limits(max_evaluation_bytes=639))
    assert caught.value.value == 640
    expected = np.repeat(np.array([7.0, 9.0], np.float32), [4, 6])[:, None].repeat(16, axis=1)
    np.testing.assert_array_equal(part.read(region, limits=Limits(max_evaluation_bytes=640)), expected)


def test_read_charges_a_member_it_decodes_whole():
    """A tiled member is decoded whole (offset table): the bool [16, 16] of
    :func:`test_an_offset_table_is_charged_8_bytes_per_element`, read one element at a time."""
    shape = (16, 16)
    member, buffers, expected = _tiled_bool(shard=Shard(shape, (0, 0)))
    head = TensorDescriptor(hs.ElementType.BOOL, shape, CompositeLayout(CompositionRule.PARTITION, 1))
    part = hs.Composite(head, [Tensor(member, buffers)])
    with pytest.raises(LimitExceeded) as caught:
        read(part, ((0, 1), (1, 2)), limits=Limits(max_evaluation_bytes=2303))
    assert caught.value.value == 2304  # the member: 256 bytes of values + 256 offsets
    assert read(part, ((0, 1), (1, 2)), limits=Limits(max_evaluation_bytes=2304))[0, 0] == expected[0, 1]


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
    hs.evaluate.sparse_entries(desc, buffers[:2])  # untraced first: compiling the kernels is not the input's cost
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


def test_a_private_member_of_another_code_width_is_unsupported():
    """The binder compares type tags; a member of the head's private tag whose Extension Type
    section gives 8-bit codes where the head's gives 16 has no value in the head's uint16 array."""
    head = TensorDescriptor(0xF7, (4,), CompositeLayout(CompositionRule.PARTITION, 2),
                            extension_type=hs.ExtensionType(16))
    members = [Tensor(TensorDescriptor(0xF7, (2,), buffers=(BufferHandle(2 * bits // 8),),
                                       extension_type=hs.ExtensionType(bits), shard=Shard((4,), (start,))),
                      [bytes(2 * bits // 8)]) for start, bits in ((0, 16), (2, 8))]
    part = hs.Composite(head, members)
    for evaluate in (part.materialize, lambda: part.read(((0, 4),)), lambda: part.lookup((0,))):
        with pytest.raises(UnsupportedEvaluation):
            evaluate()


@pytest.mark.parametrize("requested", [1.5, "no such type", object, "U4"])
def test_a_requested_type_that_is_no_number_type_is_a_schema_error(requested):
    tensor = only_item(reference_stream(hurray.from_numpy(np.arange(4, dtype=np.float32))))
    with pytest.raises(hs.InvalidDtype):
        tensor.to_numpy(dtype=requested)


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
