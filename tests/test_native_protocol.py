"""The native protocol (``__hurray__`` / ``from_hurray``) with pyhurray as the peer, both ways.

Round trips of dense tensors of every element type pyhurray has, sparse COO / CSR and the
quantization schemes: the descriptor bytes are pyhurray's own encoding of its tensor (or ours,
read back by pyhurray's encoder), every buffer is at the address it started at (no copy), and the
values equal what the independent decoder of ``tests/support/reference_decode.py`` reads from the
producer's bytes.  The release tests count the calls of a release callback of the test's own
(``support/native_capsules.py`` builds capsules through the C functions); the hostile capsules
are built the same way.
"""

from __future__ import annotations

import gc
import math
import os

import numpy as np
import pytest

hurray = pytest.importorskip("hurray")

import hurray_schema as hs  # noqa: E402
from hurray_schema.codec import encode_descriptor  # noqa: E402
from hurray_schema.errors import (  # noqa: E402
    AbiVersionMismatch, CapsuleBufferError, CapsuleConsumed, CapsuleError, HurraySchemaError, NativeProtocolError,
    SpecViolation,
)
from hurray_schema.io import native_export  # noqa: E402
from hurray_schema.io.native_export import buffer_address, export_capsule  # noqa: E402
from hurray_schema.model import (  # noqa: E402
    BlockPagedLayout, BufferHandle as H, ColumnMajorLayout, CompositeMember, CscLayout, CsfLayout, ElementType,
    ExtensionLayout, ExtensionType, HilbertLayout, MortonLayout, PerBlockAffine, Shard, Statistics, StridedLayout,
    TensorDescriptor, TiledLayout,
)
from support.native_capsules import ABI_VERSION, Producer, ReleaseCounter, aligned, capsule  # noqa: E402
from support.reference_decode import reference_array  # noqa: E402

DT = hurray.dtype
RNG = np.random.default_rng(51)


def address(view) -> int:
    """The address of a byte buffer (a memoryview, or a pyhurray buffer view read through DLPack)."""
    if isinstance(view, hurray.Tensor):
        return np.from_dlpack(view).ctypes.data
    return buffer_address(memoryview(view).cast("B")) if len(memoryview(view).cast("B")) else 0


def pyhurray_bytes(p, index: int = 0) -> bytes:
    return np.from_dlpack(p.buffer(index)).tobytes()


def rehomed(tensor: hs.Tensor) -> hs.Tensor:
    """``tensor`` with each buffer in 64-byte-aligned memory (pyhurray reads no buffer below 64)."""
    return hs.Tensor(tensor.descriptor, [aligned(b) for b in tensor.buffers])


def same_values(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def addresses_of_pyhurray(p) -> list[int]:
    return [address(p.buffer(i)) if p.buffer_handles[i].byte_size else 0 for i in range(p.buffer_count)]


def addresses_of_ours(t) -> list[int]:
    return [address(b) if len(b) else 0 for b in t.buffers]


def random_bytes(n: int) -> bytes:
    return RNG.integers(0, 256, n, dtype=np.uint8).tobytes()


# -- dense, every element type ---------------------------------------------------------------------

DECODED_BY_REFERENCE = set(DT.__all__) - {"float128", "complex64", "complex128", "float8_e8m0", "float6_e2m3",
                                          "float6_e3m2"}  # the types support/reference_decode.py decodes


@pytest.mark.parametrize("name", DT.__all__)
def test_dense_of_every_type_from_pyhurray(name):
    dt = getattr(DT, name)
    data = random_bytes(hurray.buffer_size_bytes(dt, 12))
    p = hurray.Tensor(data, dt, [3, 4])
    wire = p.descriptor.encode()
    where = addresses_of_pyhurray(p)
    t = hs.from_hurray(p)
    assert encode_descriptor(t.descriptor) == wire
    assert int(t.type_tag) == dt.tag
    assert addresses_of_ours(t) == where  # the very bytes pyhurray holds
    assert bytes(t.buffers[0]) == data
    if name in DECODED_BY_REFERENCE:
        assert same_values(t.to_numpy(), reference_array(t))


@pytest.mark.parametrize("name", DT.__all__)
def test_dense_of_every_type_to_pyhurray_and_back(name):
    dt = getattr(DT, name)
    data = aligned(random_bytes(hurray.buffer_size_bytes(dt, 12)))
    ours = hs.Tensor.dense(ElementType(dt.tag), (3, 4), data)
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(ours.descriptor)
    assert p.dtype == dt and tuple(p.shape) == (3, 4)
    assert address(p.buffer(0)) == data.ctypes.data
    assert pyhurray_bytes(p) == data.tobytes()
    back = hs.from_hurray(p)
    assert address(back.buffers[0]) == data.ctypes.data
    assert encode_descriptor(back.descriptor) == encode_descriptor(ours.descriptor)
    if name in DECODED_BY_REFERENCE:
        assert same_values(back.to_numpy(), reference_array(ours))


def test_an_empty_and_a_scalar_tensor_cross_both_ways():
    for ours in (hs.Tensor.dense(ElementType.FLOAT32, (3, 0, 5)), hs.Tensor.from_numpy(np.float64(2.5))):
        ours = rehomed(ours)
        p = hurray.from_hurray(ours)
        assert p.descriptor.encode() == encode_descriptor(ours.descriptor)
        back = hs.from_hurray(p)
        assert same_values(back.to_numpy(), reference_array(ours))


def test_pyhurray_from_numpy_arrives_as_a_view_of_the_numpy_array():
    raw = aligned(np.arange(24, dtype=np.float32).tobytes())
    source = raw.view(np.float32).reshape(4, 6)
    t = hs.from_hurray(hurray.from_numpy(source))
    got = t.to_numpy()
    assert got.ctypes.data == source.ctypes.data
    assert same_values(got, np.arange(24, dtype=np.float32).reshape(4, 6))


# -- every layout and section we write ------------------------------------------------------------------

F32, F16 = ElementType.FLOAT32, ElementType.FLOAT16
OUR_LAYOUTS = {
    "column-major": TensorDescriptor(F16, (2, 2), ColumnMajorLayout(), buffers=[H(8)]),
    "strided": TensorDescriptor(F32, (3, 4), StridedLayout((-4, 1)), buffers=[H(48)], byte_offset=32),
    "tiled": TensorDescriptor(F32, (8, 8), TiledLayout((4, 4)), buffers=[H(256)]),
    "tiled-recursive": TensorDescriptor(F32, (8, 8), TiledLayout(
        (4, 4), 0x02, 0x04, inner=TiledLayout((2, 2), 0x01, 0x03, inner_strides=(1, 2))), buffers=[H(256)]),
    "morton": TensorDescriptor(F32, (4, 4), MortonLayout((2, 2)), buffers=[H(64)]),
    "hilbert": TensorDescriptor(F32, (4, 4, 4), HilbertLayout(2, 3), buffers=[H(256)]),
    "csc": TensorDescriptor(F32, (3, 3), CscLayout(3), buffers=[H(12), H(24), H(32)]),
    "csf": TensorDescriptor(F32, (2, 2, 2), CsfLayout(3, (1, 0, 2)), buffers=[H(12), *[H(24)] * 6]),
    "block-paged": TensorDescriptor(F16, (9, 2, 8), BlockPagedLayout(4, 3, 2, kv_role=1, layer_index=5),
                                    buffers=[H(384), H(12), H(12)]),
    "shard": TensorDescriptor(F32, (8, 4), buffers=[H(128)], shard=Shard((8, 8), (0, 4))),
    "statistics": TensorDescriptor(F32, (3, 4), buffers=[H(48)], statistics=Statistics(
        0x3F, 12, 0.5, -1.0, 2.0, 2.0, 0.5, 0.25, 2, 4, 0, 1)),
    "extension-type": TensorDescriptor(0xF2, (3, 4), buffers=[H(36)], extension_type=ExtensionType(24, 1, 0, 1)),
    "overlay-member": TensorDescriptor(F32, (1, 2), buffers=[H(8)], shard=Shard((4, 4), (2, 1)),
                                       composite_member=CompositeMember(0)),
}


@pytest.mark.parametrize("name", OUR_LAYOUTS)
def test_every_layout_and_section_crosses_both_ways(name):
    desc = OUR_LAYOUTS[name]
    ours = hs.Tensor(desc, [aligned(random_bytes(int(h.byte_size))) for h in desc.buffers])
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(desc)
    assert addresses_of_pyhurray(p) == addresses_of_ours(ours)
    back = hs.from_hurray(p)
    assert back.descriptor == desc
    assert addresses_of_ours(back) == addresses_of_ours(ours)
    assert [bytes(b) for b in back.buffers] == [bytes(b) for b in ours.buffers]


def test_a_private_layout_goes_to_pyhurray_and_comes_back_only_permissively():
    """A private layout (``metadata.md § Extension Layouts``) is carried as it is; our strict
    reader does not know layout 0xF3 id 7 and refuses it as ``audit`` does, a permissive one keeps it."""
    desc = TensorDescriptor(F32, (3, 4), ExtensionLayout(0xF3, 7, b"ab"), buffers=[H(48)])
    ours = hs.Tensor(desc, [aligned(random_bytes(48))])
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(desc)
    (first,) = [f for f in hs.audit(encode_descriptor(desc), kind="descriptor").findings if not f.tolerated][:1]
    with pytest.raises(SpecViolation) as info:
        hs.from_hurray(p)
    assert (info.value.rule_id, info.value.offset) == (first.rule_id, first.offset)
    kept = hs.from_hurray(p, mode="permissive")
    assert kept.descriptor == desc and addresses_of_ours(kept) == addresses_of_ours(ours)


# -- sparse -------------------------------------------------------------------------------------------

DENSE = np.array([[0, 1.5, 0, 0], [0, 0, 0, -2], [3, 0, 0, 0], [0, 0, 0, 0]], np.float32)


def test_coo_both_ways():
    rows, cols = np.nonzero(DENSE)
    ours = rehomed(hs.sparse_coo(np.stack([rows, cols], axis=1), DENSE[rows, cols], DENSE.shape))
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(ours.descriptor)
    assert addresses_of_pyhurray(p) == addresses_of_ours(ours)
    assert [pyhurray_bytes(p, i) for i in range(2)] == [bytes(b) for b in ours.buffers]
    assert np.array_equal(np.from_dlpack(p.indices), np.stack([rows, cols], axis=1))
    back = hs.from_hurray(p)
    assert addresses_of_ours(back) == addresses_of_ours(ours)
    assert same_values(back.to_numpy(), DENSE)

    theirs = hurray.sparse_coo(DENSE[rows, cols], np.stack([rows, cols], axis=1).astype(np.uint64), list(DENSE.shape))
    t = hs.from_hurray(theirs)
    assert encode_descriptor(t.descriptor) == theirs.descriptor.encode()
    assert addresses_of_ours(t) == addresses_of_pyhurray(theirs)
    assert same_values(t.to_numpy(), DENSE)


def test_csr_both_ways():
    import scipy.sparse

    m = scipy.sparse.csr_matrix(DENSE)
    ours = rehomed(hs.sparse_csr(m.data, m.indices, m.indptr, DENSE.shape))
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(ours.descriptor)
    assert addresses_of_pyhurray(p) == addresses_of_ours(ours)
    assert np.array_equal(p.to_scipy().toarray(), DENSE)
    back = hs.from_hurray(p)
    assert same_values(back.to_numpy(), DENSE)
    assert addresses_of_ours(back) == addresses_of_ours(ours)

    shared = scipy.sparse.csr_matrix(DENSE)
    shared.data = aligned(m.data.tobytes()).view(np.float32)
    shared.indices = aligned(m.indices.astype(np.uint64).tobytes()).view(np.uint64)
    shared.indptr = aligned(m.indptr.astype(np.uint64).tobytes()).view(np.uint64)
    theirs = hurray.from_scipy(shared)
    t = hs.from_hurray(theirs)
    assert encode_descriptor(t.descriptor) == theirs.descriptor.encode()
    assert addresses_of_ours(t) == addresses_of_pyhurray(theirs)
    assert same_values(t.to_numpy(), DENSE)


# -- quantized ---------------------------------------------------------------------------------------

X = RNG.standard_normal((4, 64)).astype(np.float32)
OUR_QUANTIZED = {
    "per-tensor int8": dict(scheme="per_tensor"),
    "per-channel int8": dict(scheme="per_channel", axis=0),
    "per-block int4": dict(scheme="per_block", storage="int4", block_size=32),
    "per-block int8": dict(scheme="per_block", storage="int8", block_size=32),
    "per-block int2": dict(scheme="per_block", storage="int2", block_size=32),
    "per-block uint4 asymmetric": dict(scheme="per_block", storage="uint4", block_size=32),
    "nf4": dict(scheme="nf4", block_size=64),
    "mxfp4": dict(scheme="mxfp", storage="float4_e2m1"),
    "mxfp6": dict(scheme="mxfp", storage="float6_e2m3"),
    "mxfp8": dict(scheme="mxfp", storage="float8_e5m2"),
}


@pytest.mark.parametrize("name", OUR_QUANTIZED)
def test_our_quantized_tensor_to_pyhurray_and_back(name):
    ours = rehomed(hs.quantize(X, **OUR_QUANTIZED[name]))
    # support/reference_decode.py has no float6: mxfp6 is compared with the tensor it left as
    want = ours.to_numpy() if name == "mxfp6" else reference_array(ours)
    p = hurray.from_hurray(ours)
    assert p.descriptor.encode() == encode_descriptor(ours.descriptor)
    assert p.quantization is not None
    assert addresses_of_pyhurray(p) == addresses_of_ours(ours)
    back = hs.from_hurray(p)
    assert back.descriptor == ours.descriptor
    assert addresses_of_ours(back) == addresses_of_ours(ours)
    assert same_values(back.to_numpy(), want)


def _positive(count: int, dtype) -> bytes:
    return RNG.uniform(0.25, 4.0, count).astype(dtype).tobytes()


def _pyhurray_quantized():
    import ml_dtypes

    yield "per-tensor", hurray.Tensor(random_bytes(8), hurray.uint8, [2, 4],
                                      quantization=hurray.PerTensorAffine(0.02, 128))
    yield "per-channel", hurray.Tensor(random_bytes(8), hurray.int8, [2, 4], aux_buffers=[_positive(2, np.float32)],
                                       quantization=hurray.PerChannelAffine.symmetric(axis=0, scale_buffer_index=1))
    yield "per-block int4", hurray.Tensor(
        random_bytes(64), DT.int4, [2, 64], aux_buffers=[_positive(4, np.float16)],
        quantization=hurray.PerBlockAffine.symmetric(axis=1, block_size=32, scale_buffer_index=1,
                                                     scale_type=hurray.float16))
    yield "per-block int8", hurray.Tensor(
        random_bytes(128), hurray.int8, [2, 64], aux_buffers=[_positive(4, np.float32)],
        quantization=hurray.PerBlockAffine.symmetric(axis=1, block_size=32, scale_buffer_index=1,
                                                     scale_type=hurray.float32))
    yield "nf4", hurray.Tensor(random_bytes(64), DT.uint4, [2, 64], aux_buffers=[_positive(2, np.float32)],
                               quantization=hurray.NF4(axis=1, block_size=64, scale_buffer_index=1))
    scales = np.array([0.5, 1, 2, 4], ml_dtypes.float8_e8m0fnu).tobytes()
    yield "mxfp4", hurray.Tensor(random_bytes(64), DT.float4_e2m1, [2, 64], aux_buffers=[scales],
                                 quantization=hurray.MXFP(axis=1, block_size=32, scale_buffer_index=1))


PYHURRAY_QUANTIZED = dict(_pyhurray_quantized())


@pytest.mark.parametrize("name", PYHURRAY_QUANTIZED)
def test_a_pyhurray_quantized_tensor_arrives_whole(name):
    p = PYHURRAY_QUANTIZED[name]
    t = hs.from_hurray(p)
    assert encode_descriptor(t.descriptor) == p.descriptor.encode()
    assert t.descriptor.quantization is not None
    assert addresses_of_ours(t) == addresses_of_pyhurray(p)
    assert same_values(t.to_numpy(), reference_array(t))


def test_pyhurray_per_block_int8_materializes_to_the_spec_formula():
    """int8 codes, PerBlockAffine (symmetric, blocks of 32 along axis 1), float32 scales in an aux
    buffer: ``x = scale[block] * code`` (``per-block-affine.md § Dequantization Formula``)."""
    codes = RNG.integers(-128, 128, (3, 64), dtype=np.int8)
    scales = np.array([0.5, 0.25, 2.0, 1.5, 0.125, 3.0], np.float32)
    p = hurray.Tensor(codes.tobytes(), hurray.int8, [3, 64], aux_buffers=[scales.tobytes()],
                      quantization=hurray.PerBlockAffine.symmetric(axis=1, block_size=32, scale_buffer_index=1,
                                                                   scale_type=hurray.float32))
    t = hs.from_hurray(p)
    assert t.descriptor.quantization == PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1, flags=1,
                                                       scale_type_tag=ElementType.FLOAT32)
    formula = (np.repeat(scales.reshape(3, 2), 32, axis=1) * codes.astype(np.float32)).astype(np.float32)
    assert same_values(t.to_numpy(), formula)
    assert same_values(reference_array(t), formula)


# -- composites (ADR-036 § 6: member by member) ----------------------------------------------------------

def test_our_partition_to_pyhurray_and_back_member_by_member():
    array = np.arange(64, dtype=np.float32).reshape(8, 8)
    ours = hs.partition(array, grid=(2, 2))
    ours = hs.Composite(ours.descriptor, [rehomed(m) for m in ours.members])
    hc = hs.io.composite_to_hurray(ours)
    assert hc.descriptor.encode() == encode_descriptor(ours.descriptor)
    assert [m.descriptor.encode() for m in hc.members] == [encode_descriptor(m.descriptor) for m in ours.members]
    assert [addresses_of_pyhurray(m) for m in hc.members] == [addresses_of_ours(m) for m in ours.members]
    back = hs.from_hurray(hc)
    assert isinstance(back, hs.Composite)
    assert [addresses_of_ours(m) for m in back.members] == [addresses_of_ours(m) for m in ours.members]
    assert same_values(back.materialize(), array)


def test_spqr_reaches_pyhurray_as_an_overlay_and_comes_back():
    ours = hs.spqr(X, 4, 64)
    ours = hs.Composite(ours.descriptor, [rehomed(m) for m in ours.members])
    hc = hs.io.composite_to_hurray(ours)
    assert hc.member_roles == ("base", "correction")
    assert hc.descriptor.encode() == encode_descriptor(ours.descriptor)
    back = hs.from_hurray(hc)
    assert [encode_descriptor(m.descriptor) for m in back.members] == [encode_descriptor(m.descriptor)
                                                                      for m in ours.members]
    assert same_values(back.materialize(), reference_array(ours))


def _pyhurray_composites():
    f32 = hurray.float32

    def member(shape, offset, parent, dt=f32, **kw):
        size = hurray.buffer_size_bytes(dt, math.prod(shape))
        return hurray.Tensor(random_bytes(size) if dt != f32 else np.ones(math.prod(shape), np.float32).tobytes(),
                             dt, shape, shard=hurray.Shard(parent, offset), **kw)

    yield "partition", hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[
        member([8, 4], [0, 0], [8, 8]), member([8, 4], [0, 4], [8, 8])])
    yield "overlay-add", hurray.Composite("overlay", shape=[8, 8], dtype=f32, combine_op="add", members=[
        member([8, 8], [0, 0], [8, 8]), member([2, 2], [1, 1], [8, 8])])
    yield "overlay-replace-overlapping", hurray.Composite("overlay", shape=[8, 8], dtype=f32, combine_op="replace",
                                                          members=[member([8, 8], [0, 0], [8, 8]),
                                                                   member([2, 2], [1, 1], [8, 8]),
                                                                   member([2, 2], [2, 2], [8, 8])])
    yield "partition-quantized-member", hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[
        member([8, 4], [0, 0], [8, 8], hurray.int8, quantization=hurray.PerTensorAffine(0.5, 0)),
        member([8, 4], [0, 4], [8, 8])])
    yield "group", hurray.Composite("group", shape=[4], dtype=f32, members=[
        hurray.Tensor(bytes(16), f32, [4]), hurray.Tensor(bytes(8), hurray.int8, [8])])
    yield "group-empty", hurray.Composite("group", shape=[0], dtype=f32, members=[])


PYHURRAY_COMPOSITES = dict(_pyhurray_composites())


def _verdict(call):
    try:
        item = call()
        if isinstance(item, hs.Composite):
            item.validate()
    except SpecViolation as exc:
        return exc.rule_id
    return "valid"


@pytest.mark.parametrize("name", PYHURRAY_COMPOSITES)
def test_a_pyhurray_composite_gets_the_verdict_of_its_own_stream(name):
    """The composite taken member by member is judged as pyhurray's own stream of it is."""
    hc = PYHURRAY_COMPOSITES[name]
    writer = hurray.StreamWriter()
    writer.write(hc)
    writer.finish()
    stream = bytes(writer.getvalue())
    from_file = _verdict(lambda: list(hs.read_stream(stream))[0])
    assert _verdict(lambda: hs.from_hurray(hc)) == from_file
    if from_file == "valid":
        got = hs.from_hurray(hc)
        (written,) = list(hs.read_stream(stream))
        assert [encode_descriptor(m.descriptor) for m in got.members] == [
            encode_descriptor(m.descriptor) for m in written.members]
        assert [addresses_of_ours(m) for m in got.members] == [addresses_of_pyhurray(m) for m in hc.members]


def test_an_invalid_composite_of_ours_is_not_handed_to_pyhurray():
    a = hs.Tensor.from_numpy(np.ones((8, 4), np.float32), shard=hs.model.Shard((8, 8), (0, 0)))
    b = hs.Tensor.from_numpy(np.ones((8, 4), np.float32), shard=hs.model.Shard((8, 8), (0, 2)))  # overlaps a
    bad = hs.Composite.build("partition", [a, b], shape=(8, 8), type_tag=ElementType.FLOAT32)
    with pytest.raises(SpecViolation) as info:
        hs.io.composite_to_hurray(bad)
    assert info.value.rule_id == _verdict(lambda: bad)


# -- release: exactly once ----------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


ROUND_TRIPS = 100_000


def test_release_once_across_100000_round_trips_and_no_growth():
    ours = rehomed(hs.quantize(X, "per_block", storage="int4", block_size=32))  # two buffers
    start = addresses_of_ours(ours)
    released = [0]

    def count():
        released[0] += 1

    producer = Producer(lambda: export_capsule(ours, on_release=count))
    stray, held = native_export.STRAY_RELEASES[0], len(native_export.HELD)

    def round_trip():
        p = hurray.from_hurray(producer)  # consumes our capsule: each of our handles released now
        back = hs.from_hurray(p)  # consumes pyhurray's capsule: released when `back` goes
        assert addresses_of_ours(back) == start

    for _ in range(1000):
        round_trip()
    gc.collect()
    before = _rss()
    for _ in range(ROUND_TRIPS - 1000):
        round_trip()
    gc.collect()
    grown = _rss() - before
    assert released[0] == ROUND_TRIPS * (len(ours.buffers) + 1)
    assert native_export.STRAY_RELEASES[0] == stray
    assert len(native_export.HELD) == held
    assert grown < 4 * 2**20, f"RSS grew by {grown} bytes over {ROUND_TRIPS - 1000} round trips"


def test_an_imported_tensor_releases_the_producers_handles_once_when_its_last_array_goes():
    desc = hs.Tensor.from_numpy(np.zeros(16, np.float32)).descriptor
    wire = encode_descriptor(desc)
    counter = ReleaseCounter()
    data = aligned(np.arange(16, dtype=np.float32).tobytes())
    t = hs.from_hurray(Producer(lambda: capsule(wire, [data], counter)))
    array = t.to_numpy()
    assert array.ctypes.data == data.ctypes.data
    del t
    gc.collect()
    assert (counter.buffers, counter.owners) == (0, 0)  # the array still uses the producer's bytes
    assert same_values(array, np.arange(16, dtype=np.float32))
    del array
    gc.collect()
    assert (counter.buffers, counter.owners) == (1, 1)
    assert not counter.held


def test_release_once_for_capsules_built_through_the_c_functions():
    desc = hs.quantize(X, "per_block", storage="int8", block_size=32)
    wire = encode_descriptor(desc.descriptor)
    buffers = [aligned(b) for b in desc.buffers]
    counter = ReleaseCounter()
    producer = Producer(lambda: capsule(wire, buffers, counter))
    for _ in range(ROUND_TRIPS // 10):
        t = hs.from_hurray(producer)
        assert addresses_of_ours(t) == [b.ctypes.data for b in buffers]
    del t
    gc.collect()
    assert counter.buffers == ROUND_TRIPS // 10 * len(buffers)
    assert counter.owners == ROUND_TRIPS // 10


def test_an_unconsumed_capsule_frees_everything():
    ours = rehomed(hs.Tensor.from_numpy(np.ones((3, 4), np.float32)))
    released = [0]
    held = len(native_export.HELD)
    cap = export_capsule(ours, on_release=lambda: released.__setitem__(0, released[0] + 1))
    assert released[0] == 0 and len(native_export.HELD) == held + 2  # the buffer and the tensor
    del cap
    gc.collect()
    assert released[0] == 2
    assert len(native_export.HELD) == held


def test_a_capsule_consumed_by_pyhurray_is_not_freed_again_by_its_destructor():
    ours = rehomed(hs.Tensor.from_numpy(np.ones((3, 4), np.float32)))
    released = [0]
    cap = export_capsule(ours, on_release=lambda: released.__setitem__(0, released[0] + 1))
    p = hurray.from_hurray(Producer(lambda: cap))
    assert released[0] == 2
    assert "used_hurray_tensor" in repr(cap)
    stray = native_export.STRAY_RELEASES[0]
    del cap
    gc.collect()
    assert released[0] == 2 and native_export.STRAY_RELEASES[0] == stray
    assert pyhurray_bytes(p) == np.ones(12, np.float32).tobytes()  # pyhurray keeps our tensor alive


# -- hostile capsules --------------------------------------------------------------------------------------

WIRE = encode_descriptor(hs.Tensor.from_numpy(np.zeros((3, 4), np.float32)).descriptor)


def _hostile(**kw):
    counter = ReleaseCounter()
    buffers = kw.pop("buffers", [aligned(bytes(48))])
    made = capsule(kw.pop("descriptor", WIRE), buffers, counter, **kw)
    return made, counter


def _refused_and_freed(error, **kw):
    """``from_hurray`` of the capsule ``capsule(**kw)`` builds raises ``error`` and leaves the
    capsule to its destructor, which frees it: each buffer released once, the owner once."""
    made, counter = _hostile(**kw)
    with pytest.raises(error) as info:
        hs.from_hurray(Producer(lambda: made))
    assert counter.buffers == 0
    refused = info.value
    refused.__traceback__ = None  # its frames hold the capsule
    del info, made
    gc.collect()
    assert not counter.held
    assert counter.owners == (0 if kw.get("context") is False else 1)
    return refused


def test_a_capsule_of_another_name_is_refused():
    error = _refused_and_freed(CapsuleError, name=b"dltensor")
    assert "dltensor" in str(error)


def test_something_other_than_a_capsule_is_refused():
    with pytest.raises(CapsuleError):
        hs.from_hurray(Producer(lambda: b"not a capsule"))
    with pytest.raises(CapsuleError):
        hs.from_hurray(object())


def test_a_consumed_capsule_is_refused():
    made, counter = _hostile()
    producer = Producer(lambda: made)
    t = hs.from_hurray(producer)
    with pytest.raises(CapsuleConsumed):
        hs.from_hurray(producer)
    with pytest.raises(hurray.BufferError):  # and pyhurray agrees it is spent
        hurray.from_hurray(producer)
    assert isinstance(t, hs.Tensor)


@pytest.mark.parametrize("version", [ABI_VERSION - 1, ABI_VERSION + 1, 0, 2**32 - 1])
def test_an_abi_version_we_do_not_speak_is_refused_before_the_descriptor_is_read(version):
    error = _refused_and_freed(AbiVersionMismatch, abi_version=version, descriptor=b"not even a descriptor")
    assert (error.producer, error.consumer) == (version, ABI_VERSION)


def _broken_descriptors():
    wire = bytearray(WIRE)
    wire[4] = 9  # major version 9
    yield "major-version", bytes(wire)
    wire = bytearray(WIRE)
    wire[0] = ord("X")
    yield "magic", bytes(wire)
    t = hs.Tensor.from_numpy(np.zeros((3, 4), np.float32))
    wire = bytearray(encode_descriptor(t.descriptor))
    at = bytes(wire).index(bytes([int(ElementType.FLOAT32)]), 10)  # the type tag
    wire[at] = 0xEE  # a reserved type tag
    yield "type-tag", bytes(wire)
    yield "short", WIRE[:12]


BROKEN = dict(_broken_descriptors())


@pytest.mark.parametrize("name", BROKEN)
def test_descriptor_bytes_that_break_a_rule_raise_audits_violation(name):
    wire = BROKEN[name]
    (first,) = [f for f in hs.audit(wire, kind="descriptor").findings if not f.tolerated][:1]
    error = _refused_and_freed(SpecViolation, descriptor=wire)
    assert (error.rule_id, error.offset, error.citation) == (first.rule_id, first.offset, first.citation)


def test_bytes_after_the_descriptor_are_refused():
    error = _refused_and_freed(CapsuleError, descriptor=WIRE + b"\0" * 8)
    assert f"descriptor_length is {len(WIRE)}" in str(error)


def test_a_buffer_smaller_than_its_descriptor_is_refused():
    _refused_and_freed(CapsuleBufferError, buffers=[aligned(bytes(47))])


def test_a_missing_buffer_is_refused():
    error = _refused_and_freed(CapsuleError, buffers=[])
    assert "0 buffers" in str(error)


def test_a_null_context_is_refused():
    _refused_and_freed(CapsuleError, context=False)


def test_every_refusal_is_a_hurray_schema_error():
    for error in (CapsuleError, CapsuleConsumed, CapsuleBufferError, AbiVersionMismatch, SpecViolation):
        assert issubclass(error, HurraySchemaError)


def test_a_tensor_of_a_memory_mapped_file_goes_to_pyhurray_without_a_copy(tmp_path):
    path = tmp_path / "q.hrry"
    hs.write_file(path, {"w": hs.quantize(X, "per_block", storage="int8", block_size=32)})
    f = hs.read_file(path)
    t = f["w"]
    p = hurray.from_hurray(t)
    assert addresses_of_pyhurray(p) == addresses_of_ours(t)  # pyhurray reads the mapped pages themselves
    assert p.descriptor.encode() == encode_descriptor(t.descriptor)
    assert same_values(hs.from_hurray(p).to_numpy(), reference_array(t))


# -- what either side refuses (the table in README.md § Sharing tensors in one process) ----------------

def test_pyhurray_refuses_to_view_a_buffer_below_64_byte_alignment():
    """pyhurray takes the capsule but its buffer accessor reads no address below 64-byte alignment
    (its DLPack export of the same tensor still works): the bytes are never moved to align them."""
    raw = np.zeros(64 + 16 + 48, np.uint8)
    start = (-raw.ctypes.data) % 64 + 16  # 16 bytes past a 64-byte boundary
    data = raw[start:start + 48]
    data[:] = np.frombuffer(np.arange(12, dtype=np.float32).tobytes(), np.uint8)
    p = hurray.from_hurray(hs.Tensor.dense(ElementType.FLOAT32, (3, 4), data))
    with pytest.raises(hurray.BufferError, match="below the minimum of 64"):
        p.buffer(0)
    values = np.from_dlpack(p)
    assert values.ctypes.data == data.ctypes.data
    assert same_values(values, np.arange(12, dtype=np.float32).reshape(3, 4))


def test_a_composite_is_no_capsule_on_either_side():
    ours = hs.partition(np.ones((4, 4), np.float32), grid=(2, 1))
    assert not hasattr(ours, "__hurray__")
    with pytest.raises(TypeError):
        hurray.from_hurray(ours)
    hc = hs.io.composite_to_hurray(ours)
    assert not hasattr(hc, "__hurray__")
    assert isinstance(hs.from_hurray(hc), hs.Composite)  # taken member by member


def test_pyhurray_cannot_build_a_composite_nested_in_a_partition():
    """A ``hurray.Composite`` carries no shard section, and a partition's members must."""
    array = np.arange(64, dtype=np.float32).reshape(8, 8)
    nested = hs.partition(array, grid=(1, 2), member=lambda part: hs.partition(part, grid=(2, 1)))
    with pytest.raises(NativeProtocolError, match="missing a shard section"):
        hs.io.composite_to_hurray(nested)


def test_a_pyhurray_descriptor_our_rules_reject_raises_audits_violation():
    """pyhurray builds a strided tensor whose negative stride reaches before buffer 0 (it cannot set
    byte_offset); ``layouts/strided.md`` makes that invalid."""
    p = hurray.Tensor(bytes(48), hurray.float32, [3, 4], layout=hurray.StridedLayout([-4, 1]))
    (first,) = [f for f in hs.audit(p.descriptor.encode(), kind="descriptor").findings if not f.tolerated][:1]
    with pytest.raises(SpecViolation) as info:
        hs.from_hurray(p)
    assert (info.value.rule_id, info.value.offset) == (first.rule_id, first.offset) == (
        "layout.strided.buffer_bounds", first.offset)


def test_a_device_buffer_is_not_read_in_place():
    p = hurray.Tensor(bytes(48), hurray.float32, [3, 4], device=hurray.Device(0xF2))
    with pytest.raises(CapsuleBufferError, match="device tag 0xF2"):
        hs.from_hurray(p)
