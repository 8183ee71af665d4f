"""Interoperability with the reference implementation (``pyhurray``, import ``hurray``).

Direction 1: descriptors built and encoded by pyhurray decode with hurray_schema to the
same fields (read back through pyhurray's own getters) and re-encode byte-identical.
Direction 2: descriptors built and encoded by hurray_schema decode in pyhurray to the
same fields, and pyhurray re-encodes them to our bytes.
Generated: hypothesis draws tensor parameters, both libraries build the tensor, and the
two encodings must be identical (and pass every descriptor rule).

Expected values always come from pyhurray (or from literals), never from the code under
test.  pyhurray cannot set ``alignment``, ``sync_mode`` or ``byte_offset`` and rejects
``sync_mode`` 1/2 (see the notes on its API), so direction 2 stays inside what it reads.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

hurray = pytest.importorskip("hurray")

from hurray_schema.codec import decode_descriptor, encode_descriptor, parse_descriptor  # noqa: E402
from hurray_schema.errors import SpecViolation  # noqa: E402
from hurray_schema.model import (  # noqa: E402
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, NOT_LAYER_SCOPED, BlockPagedLayout, BufferHandle, ColumnMajorLayout,
    CompositeLayout, CompositeMember, CooLayout, CscLayout, CsfLayout, CsrLayout, ExtensionLayout,
    ExtensionType, HilbertLayout, MortonLayout, Mxfp, Nf4, PerBlockAffine, PerChannelAffine,
    PerTensorAffine, RowMajorLayout, Shard, Statistics, StridedLayout, TensorDescriptor, TiledLayout,
)

f32 = hurray.float32
f16 = hurray.float16
DT = hurray.dtype
Q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
I = lambda *v: struct.pack(f"<{len(v)}I", *v)  # noqa: E731

# --------------------------------------------------------------------------------------
# pyhurray's vocabulary -> wire values (literal tables from the spec, not from our code)
# --------------------------------------------------------------------------------------

SUB_LAYOUT = {"row_major": 0x01, "col_major": 0x02, "strided": 0x03, "tiled": 0x04}
KV_ROLE = {"key": 0x00, "value": 0x01, "fused": 0x02}
INDEX_TYPE = {"uint32": 0x00, "uint64": 0x01}
RULE = {"partition": 0x01, "overlay": 0x02, "group": 0x03}
COMBINE = {None: 0x00, "replace": 0x01, "add": 0x02}
SYNC = {"producer_synced": 0x00}
SCHEME = {"PerTensorAffine": 0x01, "PerChannelAffine": 0x02, "PerBlockAffine": 0x03, "NF4": 0x04, "MXFP": 0x05}
STAT_GROUPS = (  # computed_mask bit -> the fields it validates (metadata.md § computed_mask)
    (0, ("nnz",)), (1, ("sparsity_ratio",)), (2, ("value_min", "value_max", "value_abs_max")),
    (3, ("value_mean", "value_stddev")), (4, ("nm_n", "nm_m")), (5, ("has_nan", "has_inf")),
)


def _dim(v):
    return DYNAMIC_DIMENSION if v is None else v


def assert_tiled_same(ours: TiledLayout, py) -> None:
    assert ours.tile_shape == tuple(py.tile_shape)
    assert ours.outer_layout == SUB_LAYOUT[py.outer_layout]
    assert ours.inner_layout == SUB_LAYOUT[py.inner_layout]
    assert ours.outer_strides == (None if py.outer_strides is None else tuple(py.outer_strides))
    assert ours.inner_strides == (None if py.inner_strides is None else tuple(py.inner_strides))
    if py.inner_tiled is None:
        assert ours.inner is None
    else:
        assert_tiled_same(ours.inner, py.inner_tiled)


def assert_layout_same(ours, py) -> None:
    assert ours.tag == py.tag
    name = type(py).__name__
    if name in ("RowMajorLayout", "ColMajorLayout"):
        assert isinstance(ours, RowMajorLayout if name == "RowMajorLayout" else ColumnMajorLayout)
    elif name == "StridedLayout":
        assert ours.strides == tuple(py.strides)
    elif name == "TiledLayout":
        assert_tiled_same(ours, py)
    elif name == "MortonLayout":
        assert ours.morton_bits == tuple(py.morton_bits)
    elif name == "HilbertLayout":
        assert (ours.hilbert_order, ours.hilbert_rank) == (py.hilbert_order, py.hilbert_rank)
    elif name == "CooLayout":
        assert (ours.nnz, ours.is_sorted) == (py.nnz, int(py.is_sorted))
    elif name in ("CsrLayout", "CscLayout"):
        assert ours.nnz == py.nnz
    elif name == "CsfLayout":
        assert (ours.nnz, ours.mode_order) == (py.nnz, tuple(py.mode_order))
    elif name == "BlockPagedLayout":
        assert isinstance(ours, BlockPagedLayout)
        assert (ours.page_size, ours.num_pages, ours.paged_axis, ours.num_seqs) == (
            py.page_size, py.num_pages, py.paged_axis, py.num_seqs)
        assert ours.kv_role == KV_ROLE[py.kv_role]
        assert ours.layer_index == (NOT_LAYER_SCOPED if py.layer_index is None else py.layer_index)
        assert ours.block_table_index_type == INDEX_TYPE[py.block_table_index_type]
    elif name == "CompositeLayout":
        assert isinstance(ours, CompositeLayout)
        assert ours.composition_rule == RULE[py.composition_rule]
        assert ours.combine_op == COMBINE[py.combine_op]
        assert ours.member_count == py.member_count
    elif name == "PrivateExtensionLayout":
        assert isinstance(ours, ExtensionLayout)
        assert (ours.extension_layout_id, ours.extension_data) == (py.extension_layout_id, bytes(py.extension_data))
    else:  # pragma: no cover - a layout class this test does not know
        raise AssertionError(f"unexpected pyhurray layout {name}")


def assert_quantization_same(ours, py) -> None:
    if py is None:
        assert ours is None
        return
    name = type(py).__name__
    assert ours.scheme == SCHEME[name] and ours.scheme_version == 1
    if name == "PerTensorAffine":
        assert (ours.scale, ours.zero_point) == (py.scale, py.zero_point)
        return
    assert (ours.axis, ours.scale_buffer_index) == (py.axis, py.scale_buffer_index)
    if name in ("PerBlockAffine", "NF4", "MXFP"):
        assert ours.block_size == py.block_size
    if name in ("PerChannelAffine", "PerBlockAffine"):
        symmetric = py.zero_point_buffer_index is None
        assert bool(ours.flags & 1) == symmetric
        assert ours.zero_point_buffer_index == (NO_BUFFER_INDEX if symmetric else py.zero_point_buffer_index)
        scale_tag = py.scale_type.tag if name == "PerBlockAffine" else 0x03
        assert ours.scale_type_tag == scale_tag


def assert_statistics_same(ours, py) -> None:
    if py is None:
        assert ours is None
        return
    assert ours.computed_mask == py.computed_mask
    for bit, names in STAT_GROUPS:
        for n in names:
            theirs = getattr(py, n)
            if py.computed_mask & (1 << bit):
                mine = getattr(ours, n)
                assert (bool(mine) if isinstance(theirs, bool) else mine) == theirs, n
            else:
                assert theirs is None and getattr(ours, n) == 0, n


def assert_extension_type_same(ours, py) -> None:
    if py is None:
        assert ours is None
        return
    for n in ("bit_width", "packing_factor", "sign_bits", "exponent_bits", "mantissa_bits", "exponent_bias"):
        assert getattr(ours, n) == getattr(py, n), n
    for n in ("is_float", "is_signed", "has_nan", "has_inf"):
        assert bool(getattr(ours, n)) == bool(getattr(py, n)), n


def assert_same(ours: TensorDescriptor, py) -> None:
    """Every field pyhurray exposes equals the one hurray_schema decoded."""
    assert (ours.version_major, ours.version_minor) == tuple(py.version)
    assert ours.type_tag == py.dtype.tag
    assert ours.shape == tuple(_dim(v) for v in py.shape)
    assert ours.byte_offset == py.byte_offset
    assert_layout_same(ours.layout, py.layout)
    assert len(ours.buffers) == py.buffer_count == len(py.buffer_handles)
    for mine, theirs in zip(ours.buffers, py.buffer_handles):
        assert mine.byte_size == theirs.byte_size
        assert mine.alignment == theirs.alignment
        assert mine.device_tag == theirs.device.tag
        assert mine.memory_class == theirs.device.memory_class_tag
        assert mine.sync_mode == SYNC[theirs.sync_mode]
    assert_quantization_same(ours.quantization, py.quantization)
    if py.shard is None:
        assert ours.shard is None
    else:
        assert ours.shard.parent_shape == tuple(py.shard.parent_shape)
        assert ours.shard.shard_offset == tuple(py.shard.shard_offset)
    assert_statistics_same(ours.statistics, py.statistics)
    assert_extension_type_same(ours.extension_type, py.extension_type)


# --------------------------------------------------------------------------------------
# Direction 1: pyhurray builds, hurray_schema reads
# --------------------------------------------------------------------------------------


def _dtype_cases():
    for name in DT.__all__:
        dt = getattr(DT, name)
        yield f"dtype-{name}", hurray.Tensor(bytes(hurray.buffer_size_bytes(dt, 12)), dt, [3, 4])
        yield f"dtype-{name}-empty", hurray.Tensor(b"", dt, [3, 0, 5])


def _layout_cases():
    yield "row-major-scalar", hurray.Tensor(bytes(4), f32, [])
    yield "row-major-empty-1d", hurray.Tensor(b"", f32, [0])
    yield "row-major-dynamic", hurray.Tensor(b"", f32, [None, 4])
    yield "bool-zero-elements", hurray.Tensor(b"", hurray.bool, [0, 7])
    yield "int4-zero-elements", hurray.Tensor(b"", DT.int4, [5, 0])
    yield "col-major", hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.ColMajorLayout())
    yield "strided-negative", hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.StridedLayout([-4, 1]))
    yield "strided-zero", hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.StridedLayout([0, 1]))
    yield "tiled", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout([4, 4]))
    yield "tiled-col-col", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout(
        [4, 2], outer_layout="col_major", inner_layout="col_major"))
    yield "tiled-strided-outer-inner", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout(
        [4, 4], outer_layout="strided", inner_layout="strided", outer_strides=[2, 1], inner_strides=[4, 1]))
    yield "tiled-strided-outer", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout(
        [4, 4], outer_layout="strided", outer_strides=[1, 2]))
    yield "tiled-strided-inner", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout(
        [4, 4], inner_layout="strided", inner_strides=[1, 4]))
    yield "tiled-recursive", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout(
        [4, 4], inner_layout="tiled", inner_tiled=hurray.TiledLayout([2, 2])))
    yield "tiled-recursive-3", hurray.Tensor(bytes(1024), f32, [16, 16], layout=hurray.TiledLayout(
        [8, 8], inner_layout="tiled", inner_tiled=hurray.TiledLayout(
            [4, 4], outer_layout="col_major", inner_layout="tiled", inner_tiled=hurray.TiledLayout(
                [2, 2], inner_layout="strided", inner_strides=[2, 1]))))
    yield "morton", hurray.Tensor(bytes(64), f32, [4, 4], layout=hurray.MortonLayout([2, 2]))
    yield "morton-3d", hurray.Tensor(bytes(256), f32, [4, 4, 4], layout=hurray.MortonLayout([2, 2, 2]))
    yield "hilbert", hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.HilbertLayout(3, 2))
    yield "coo-sorted", hurray.Tensor(struct.pack("<2f", 5, 7), f32, [2, 2], aux_buffers=[Q(0, 0, 1, 1)],
                                      layout=hurray.CooLayout(nnz=2, is_sorted=True))
    yield "coo-unsorted", hurray.Tensor(struct.pack("<2f", 5, 7), f32, [2, 2], aux_buffers=[Q(1, 1, 0, 0)],
                                        layout=hurray.CooLayout(nnz=2))
    yield "csr", hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [3, 3], aux_buffers=[Q(0, 1, 2), Q(0, 1, 2, 3)],
                               layout=hurray.CsrLayout(nnz=3))
    yield "csr-nnz0", hurray.Tensor(b"", f32, [3, 3], aux_buffers=[b"", Q(0, 0, 0, 0)], layout=hurray.CsrLayout(nnz=0))
    yield "csc", hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [3, 3], aux_buffers=[Q(0, 1, 2), Q(0, 1, 2, 3)],
                               layout=hurray.CscLayout(nnz=3))
    yield "csf", hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [2, 2, 2],
                               aux_buffers=[Q(0, 2), Q(0, 1), Q(0, 2, 3), Q(0, 1, 0), Q(0, 1, 2, 3), Q(0, 1, 1)],
                               layout=hurray.CsfLayout(nnz=3, mode_order=[0, 1, 2]))
    yield "csf-permuted", hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [2, 2, 2],
                                        aux_buffers=[Q(0, 2), Q(0, 1), Q(0, 2, 3), Q(0, 1, 0), Q(0, 1, 2, 3), Q(0, 1, 1)],
                                        layout=hurray.CsfLayout(nnz=3, mode_order=[2, 0, 1]))
    yield "block-paged-value", hurray.Tensor(
        bytes(3 * 4 * 2 * 8 * 2), f16, [9, 2, 8], aux_buffers=[I(0, 1, 0), I(0, 2, 3)],
        layout=hurray.BlockPagedLayout(page_size=4, num_pages=3, paged_axis=0, num_seqs=2, kv_role="value",
                                       layer_index=5))
    yield "block-paged-fused-u64", hurray.Tensor(
        bytes(3 * 4 * 2 * 8 * 2), f16, [9, 2, 8], aux_buffers=[Q(0, 1, 0), Q(0, 2, 3)],
        layout=hurray.BlockPagedLayout(page_size=4, num_pages=3, paged_axis=0, num_seqs=2, kv_role="fused",
                                       layer_index=None, block_table_index_type="uint64"))
    yield "block-paged-key", hurray.Tensor(
        bytes(2 * 4 * 1 * 4 * 4), f32, [5, 1, 4], aux_buffers=[I(1, 0), I(0, 2)],
        layout=hurray.BlockPagedLayout(page_size=4, num_pages=2, paged_axis=0, num_seqs=1, kv_role="key",
                                       layer_index=0))
    yield "device-cuda-unified", hurray.Tensor(bytes(48), f32, [3, 4], device=hurray.Device("cuda", 0, "unified"))
    yield "device-metal-pinned", hurray.Tensor(bytes(48), f32, [3, 4], device=hurray.Device("metal", 0, "host_pinned"))
    yield "device-private", hurray.Tensor(bytes(48), f32, [3, 4], device=hurray.Device(0xF2))


def _section_cases():
    yield "shard", hurray.Tensor(bytes(48), f32, [3, 4], shard=hurray.Shard([6, 4], [3, 0]))
    yield "shard-scalar", hurray.Tensor(bytes(4), f32, [], shard=hurray.Shard([], []))
    full = hurray.Statistics(nnz=12, sparsity_ratio=0.0, value_min=-1.0, value_max=2.0, value_abs_max=2.0,
                             value_mean=0.5, value_stddev=0.25, nm_n=2, nm_m=4, has_nan=False, has_inf=True)
    yield "statistics-full", hurray.Tensor(bytes(48), f32, [3, 4], statistics=full)
    yield "statistics-nnz-only", hurray.Tensor(bytes(48), f32, [3, 4], statistics=hurray.Statistics(nnz=12))
    yield "statistics-range", hurray.Tensor(bytes(48), f32, [3, 4], statistics=hurray.Statistics(
        value_min=-3.5, value_max=1e300, value_abs_max=1e300, has_nan=True, has_inf=False))
    ext = hurray.ExtensionType(bit_width=24, is_signed=True)
    yield "extension-type-int24", hurray.Tensor(bytes(36), hurray.Dtype.from_tag(0xF2), [3, 4], extension_type=ext)
    ext4 = hurray.ExtensionType(bit_width=4)
    yield "extension-type-uint4", hurray.Tensor(bytes(6), hurray.Dtype.from_tag(0xF0), [3, 4], extension_type=ext4)
    extf = hurray.ExtensionType(bit_width=16, is_float=True, sign_bits=1, exponent_bits=5, mantissa_bits=10,
                                exponent_bias=15, has_nan=True, has_inf=True)
    yield "extension-type-float16-like", hurray.Tensor(bytes(24), hurray.Dtype.from_tag(0xFE), [3, 4],
                                                       extension_type=extf)
    yield "ext+stats+shard", hurray.Tensor(bytes(36), hurray.Dtype.from_tag(0xF2), [3, 4], extension_type=ext,
                                           statistics=hurray.Statistics(nnz=1), shard=hurray.Shard([6, 4], [0, 0]))


def _quantization_cases():
    yield "per-tensor", hurray.Tensor(bytes(8), hurray.uint8, [2, 4], quantization=hurray.PerTensorAffine(0.02, 128))
    yield "per-tensor-negative-zp", hurray.Tensor(bytes(8), hurray.int8, [2, 4],
                                                  quantization=hurray.PerTensorAffine(-1.5, -3))
    yield "per-channel-sym", hurray.Tensor(bytes(8), hurray.int8, [2, 4], aux_buffers=[bytes(8)],
                                           quantization=hurray.PerChannelAffine.symmetric(axis=0, scale_buffer_index=1))
    yield "per-channel-asym", hurray.Tensor(bytes(8), hurray.uint8, [2, 4], aux_buffers=[bytes(16), bytes(16)],
                                            quantization=hurray.PerChannelAffine.asymmetric(1, 1, 2))
    for scale in (hurray.float16, hurray.bfloat16, hurray.float32):
        yield f"per-block-sym-{scale.name}", hurray.Tensor(
            bytes(8192), DT.int4, [128, 128], aux_buffers=[bytes(128 * (scale.bit_width // 8))],
            quantization=hurray.PerBlockAffine.symmetric(axis=1, block_size=128, scale_buffer_index=1,
                                                         scale_type=scale))
    yield "per-block-asym", hurray.Tensor(bytes(128), hurray.uint8, [2, 64], aux_buffers=[bytes(8), bytes(16)],
                                          quantization=hurray.PerBlockAffine.asymmetric(1, 32, 1, 2, hurray.bfloat16))
    yield "per-block-axis-0-empty", hurray.Tensor(
        b"", DT.int4, [0, 64], aux_buffers=[b""],
        quantization=hurray.PerBlockAffine.symmetric(axis=0, block_size=32, scale_buffer_index=1, scale_type=f16))
    yield "nf4", hurray.Tensor(bytes(64), DT.uint4, [2, 64], aux_buffers=[bytes(8)],
                               quantization=hurray.NF4(axis=1, block_size=64, scale_buffer_index=1))
    yield "mxfp", hurray.Tensor(bytes(64), DT.float4_e2m1, [2, 64], aux_buffers=[bytes(4)],
                                quantization=hurray.MXFP(axis=1, block_size=32, scale_buffer_index=1))
    yield "quant+shard+stats", hurray.Tensor(bytes(12), hurray.int8, [3, 4], quantization=hurray.PerTensorAffine(0.5, 0),
                                             shard=hurray.Shard([6, 4], [3, 0]),
                                             statistics=hurray.Statistics(nnz=5, sparsity_ratio=0.25))


def _composite_cases():
    a = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    yield "composite-partition", hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b])
    base = hurray.Tensor(bytes(64), f32, [4, 4], shard=hurray.Shard([4, 4], [0, 0]))
    corr = hurray.Tensor(struct.pack("<2f", 9, 9), f32, [1, 2], shard=hurray.Shard([4, 4], [2, 1]))
    for op in ("add", "replace"):
        yield f"composite-overlay-{op}", hurray.Composite("overlay", shape=[4, 4], dtype=f32, members=[base, corr],
                                                          combine_op=op)
    yield "composite-group", hurray.Composite("group", shape=[4], dtype=f32, members=[
        hurray.Tensor(bytes(16), f32, [4]), hurray.Tensor(bytes(8), hurray.int8, [8])])
    yield "composite-group-empty", hurray.Composite("group", shape=[0], dtype=f32, members=[])


PY_CASES = dict([*_dtype_cases(), *_layout_cases(), *_section_cases(), *_quantization_cases(), *_composite_cases()])


KNOWN_INVALID = {
    # pyhurray cannot set byte_offset, so a negative stride reaches before buffer 0;
    # layouts/strided.md § Element Address makes that invalid (pyhurray accepts it).
    "strided-negative": "layout.strided.buffer_bounds",
}


def _check_pyhurray_bytes(wire: bytes, mode: str = "strict", invalid: str | None = None) -> TensorDescriptor:
    py = hurray.Descriptor.decode(wire)
    if invalid is None:
        ours = decode_descriptor(wire, mode=mode)
    else:  # the structure still decodes and round-trips; the descriptor rule rejects it
        with pytest.raises(SpecViolation) as info:
            decode_descriptor(wire, mode=mode)
        assert info.value.rule_id == invalid
        ours, _ = parse_descriptor(wire, mode=mode)
    assert_same(ours, py)
    assert encode_descriptor(ours) == wire
    assert ours.encoded_length == len(wire) == py.encoded_len
    return ours


@pytest.mark.parametrize("name", sorted(PY_CASES))
def test_pyhurray_descriptor_decodes_to_same_fields_and_reencodes(name):
    obj = PY_CASES[name]
    _check_pyhurray_bytes(obj.descriptor.encode(), invalid=KNOWN_INVALID.get(name))
    if isinstance(obj, hurray.Composite):
        for member in obj.members:  # authored members: no composite member section
            assert _check_pyhurray_bytes(member.descriptor.encode()).composite_member is None


def test_every_pyhurray_dtype_is_covered():
    covered = {PY_CASES[n].descriptor.dtype.tag for n in PY_CASES}
    assert {getattr(DT, n).tag for n in DT.__all__} <= covered


@pytest.mark.parametrize("tag", [0xF0, 0xF7, 0xFE])
def test_private_extension_layout_kept_by_permissive_reader(tag):
    """``metadata.md § Extension Layouts``: an unknown extension_layout_id makes a strict
    reader reject the descriptor; a permissive one keeps it opaque."""
    t = hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.PrivateExtensionLayout(
        tag, extension_layout_id=7, extension_data=b"\x01\x02\x03"))
    wire = t.descriptor.encode()
    ours = _check_pyhurray_bytes(wire, mode="permissive")
    assert ours.layout == ExtensionLayout(tag, 7, b"\x01\x02\x03")
    _, findings = parse_descriptor(wire, mode="permissive")
    assert [f.rule_id for f in findings] == ["descriptor.layout.extension_unknown"]
    with pytest.raises(SpecViolation) as info:
        decode_descriptor(wire)
    assert info.value.rule_id == "descriptor.layout.extension_unknown"


def test_private_extension_layout_without_data():
    t = hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.PrivateExtensionLayout(0xF3, extension_layout_id=2**64 - 1))
    ours = _check_pyhurray_bytes(t.descriptor.encode(), mode="permissive")
    assert ours.layout.extension_data == b"" and ours.layout.extension_layout_id == 2**64 - 1


def _split_stream(stream: bytes) -> list[tuple[bytes, TensorDescriptor]]:
    """Bare pyhurray stream: descriptor then its buffers, tensor after tensor."""
    out, pos = [], 0
    while pos < len(stream):
        desc = decode_descriptor(stream[pos:])
        end = pos + desc.encoded_length
        out.append((stream[pos:end], desc))
        pos = end + sum(b.byte_size for b in desc.buffers)
    assert pos == len(stream)
    return out


@pytest.mark.parametrize("op", ["add", "replace"])
def test_streamed_overlay_members_carry_the_composite_member_section(op):
    base = hurray.Tensor(bytes(64), f32, [4, 4], shard=hurray.Shard([4, 4], [0, 0]))
    corr1 = hurray.Tensor(struct.pack("<2f", 9, 9), f32, [1, 2], shard=hurray.Shard([4, 4], [2, 1]))
    corr2 = hurray.Tensor(bytes(4), f32, [1, 1], shard=hurray.Shard([4, 4], [3, 3]),
                          statistics=hurray.Statistics(nnz=0))
    ov = hurray.Composite("overlay", shape=[4, 4], dtype=f32, members=[base, corr1, corr2], combine_op=op)
    with hurray.StreamWriter() as w:
        w.write_composite(ov)
    (back,) = list(hurray.StreamReader(w.getvalue()))
    parts = _split_stream(w.getvalue())
    assert len(parts) == 4
    (head_wire, head), members = parts[0], parts[1:]
    assert_same(head, back.descriptor)
    assert head.layout == CompositeLayout(2, 3, COMBINE[op]) and head.composite_member is None
    assert encode_descriptor(head) == head_wire
    roles = [{"base": 0x01, "correction": 0x00}[r] for r in back.member_roles]
    for (wire, desc), py_member, role in zip(members, back.members, roles):
        assert_same(desc, py_member.descriptor)
        assert desc.composite_member == CompositeMember(role)
        assert wire[-16:] == bytes([role]) + bytes(15)
        assert encode_descriptor(desc) == wire
        assert_same(desc, hurray.Descriptor.decode(wire))


def test_streamed_partition_and_group_members_carry_no_member_section():
    a = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    nested = hurray.Composite("group", shape=[4], dtype=f32, members=[
        hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b]), hurray.Tensor(bytes(16), f32, [4])])
    with hurray.StreamWriter() as w:
        w.write(nested)
    parts = _split_stream(w.getvalue())
    assert [d.layout.tag for _, d in parts] == [0x0B, 0x0B, 0x01, 0x01, 0x01]
    for wire, desc in parts:
        assert desc.composite_member is None
        assert encode_descriptor(desc) == wire
        assert_same(desc, hurray.Descriptor.decode(wire))


# --------------------------------------------------------------------------------------
# Direction 2: hurray_schema builds, pyhurray reads
# --------------------------------------------------------------------------------------


def H(size: int, **kw) -> BufferHandle:
    return BufferHandle(size, **kw)


F32, F16, INT8, UINT8, INT4, UINT4, FP4 = 0x03, 0x01, 0x10, 0x11, 0x48, 0x49, 0x43

OUR_CASES = {
    "row-major": TensorDescriptor(F32, (3, 4), buffers=[H(48)]),
    "scalar": TensorDescriptor(0x04, (), buffers=[H(8)]),
    "empty-3x0x5": TensorDescriptor(F32, (3, 0, 5), buffers=[H(0)]),
    "empty-1d-align1": TensorDescriptor(F32, (0,), buffers=[H(0, alignment=1)]),
    "dynamic": TensorDescriptor(F32, (DYNAMIC_DIMENSION, 4), buffers=[H(0)]),
    "bool": TensorDescriptor(0x20, (10,), buffers=[H(2)]),
    "col-major": TensorDescriptor(F16, (2, 2), ColumnMajorLayout(), buffers=[H(8, alignment=4096)]),
    "strided": TensorDescriptor(F32, (3, 4), StridedLayout((-4, 1)), buffers=[H(48)], byte_offset=32),
    "tiled": TensorDescriptor(F32, (8, 8), TiledLayout((4, 4)), buffers=[H(256)]),
    "tiled-strided": TensorDescriptor(F32, (8, 8), TiledLayout((4, 4), 0x03, 0x03, (2, 1), (4, 1)), buffers=[H(256)]),
    "tiled-recursive": TensorDescriptor(F32, (8, 8), TiledLayout(
        (4, 4), 0x02, 0x04, inner=TiledLayout((2, 2), 0x01, 0x03, inner_strides=(1, 2))), buffers=[H(256)]),
    "morton": TensorDescriptor(F32, (4, 4), MortonLayout((2, 2)), buffers=[H(64)]),
    "hilbert": TensorDescriptor(F32, (4, 4, 4), HilbertLayout(2, 3), buffers=[H(256)]),
    "coo": TensorDescriptor(F32, (2, 2), CooLayout(2, 1), buffers=[H(8), H(32)]),
    "csr": TensorDescriptor(F32, (3, 3), CsrLayout(2), buffers=[H(8), H(16), H(32)]),
    "csr-nnz0": TensorDescriptor(F32, (3, 3), CsrLayout(0), buffers=[H(0), H(0), H(32)]),
    "csc": TensorDescriptor(F32, (3, 3), CscLayout(3), buffers=[H(12), H(24), H(32)]),
    "csf": TensorDescriptor(F32, (2, 2, 2), CsfLayout(3, (1, 0, 2)), buffers=[H(12), *[H(24)] * 6]),
    "block-paged": TensorDescriptor(F16, (9, 2, 8), BlockPagedLayout(4, 3, 2, kv_role=1, layer_index=5),
                                    buffers=[H(384), H(12), H(12)]),
    "block-paged-u64": TensorDescriptor(F16, (9, 2, 8), BlockPagedLayout(4, 3, 2, block_table_index_type=1),
                                        buffers=[H(384), H(24), H(24)]),
    "composite-partition": TensorDescriptor(F32, (8, 8), CompositeLayout(1, 2)),
    "composite-overlay": TensorDescriptor(F32, (8, 8), CompositeLayout(2, 3, 2)),
    "composite-group": TensorDescriptor(F32, (4,), CompositeLayout(3, 5)),
    "devices": TensorDescriptor(F32, (3, 4), buffers=[H(48, device_tag=0x01, memory_class=0x02)]),
    "shard": TensorDescriptor(F32, (8, 4), buffers=[H(128)], shard=Shard((8, 8), (0, 4))),
    "statistics": TensorDescriptor(F32, (3, 4), buffers=[H(48)], statistics=Statistics(
        0x3F, 12, 0.5, -1.0, 2.0, 2.0, 0.5, 0.25, 2, 4, 0, 1)),
    "statistics-partial": TensorDescriptor(F32, (3, 4), buffers=[H(48)], statistics=Statistics(0x05, nnz=3,
                                                                                            value_min=-2.0, value_max=1.0, value_abs_max=2.0)),
    "extension-type": TensorDescriptor(0xF2, (3, 4), buffers=[H(36)], extension_type=ExtensionType(24, 1, 0, 1)),
    "extension-type-float": TensorDescriptor(0xF5, (3, 4), buffers=[H(24)], extension_type=ExtensionType(
        16, 1, 1, 0, 1, 5, 10, 15, 1, 1)),
    "per-tensor": TensorDescriptor(UINT8, (2, 4), buffers=[H(8)], quantization=PerTensorAffine(0.25, 128)),
    "per-channel-sym": TensorDescriptor(INT8, (2, 4), buffers=[H(8), H(8)],
                                        quantization=PerChannelAffine(0, 1, flags=1)),
    "per-channel-asym": TensorDescriptor(UINT8, (2, 4), buffers=[H(8), H(16), H(16)],
                                         quantization=PerChannelAffine(1, 1, 2)),
    "per-block": TensorDescriptor(INT4, (128, 128), buffers=[H(8192), H(256)],
                                  quantization=PerBlockAffine(1, 128, 1, flags=1, scale_type_tag=F16)),
    "per-block-asym": TensorDescriptor(UINT8, (2, 64), buffers=[H(128), H(8), H(16)],
                                       quantization=PerBlockAffine(1, 32, 1, 2, scale_type_tag=0x02)),
    "per-block-empty-axis": TensorDescriptor(INT4, (0, 64), buffers=[H(0), H(0)],
                                             quantization=PerBlockAffine(0, 32, 1, flags=1, scale_type_tag=F16)),
    "nf4": TensorDescriptor(UINT4, (2, 64), buffers=[H(64), H(8)], quantization=Nf4(1, 64, 1)),
    "mxfp": TensorDescriptor(FP4, (2, 64), buffers=[H(64), H(4)], quantization=Mxfp(1, 32, 1)),
    "everything": TensorDescriptor(INT8, (3, 4), buffers=[H(12)], quantization=PerTensorAffine(0.5),
                                   shard=Shard((6, 4), (3, 0)), statistics=Statistics(1, nnz=7)),
    "overlay-member-base": TensorDescriptor(F32, (4, 4), buffers=[H(64)], shard=Shard((4, 4), (0, 0)),
                                            composite_member=CompositeMember(1)),
    "overlay-member-correction": TensorDescriptor(F32, (1, 2), buffers=[H(8)], shard=Shard((4, 4), (2, 1)),
                                                  composite_member=CompositeMember(0)),
}


@pytest.mark.parametrize("name", sorted(OUR_CASES))
def test_our_descriptor_decodes_in_pyhurray_to_same_fields(name):
    desc = OUR_CASES[name]
    wire = encode_descriptor(desc)
    py = hurray.Descriptor.decode(wire)
    assert_same(desc, py)
    assert py.encode() == wire
    assert py.encoded_len == len(wire) == desc.encoded_length
    assert decode_descriptor(wire) == desc


def test_our_overlay_members_read_back_by_pyhurray_stream_reader():
    """A stream written by us (head, members with member sections, buffers) is read by
    pyhurray with the roles we declared."""
    head = TensorDescriptor(F32, (4, 4), CompositeLayout(2, 2, 2))
    base, corr = OUR_CASES["overlay-member-base"], OUR_CASES["overlay-member-correction"]
    stream = encode_descriptor(head) + encode_descriptor(base) + bytes(64) + encode_descriptor(corr) + bytes(8)
    (back,) = list(hurray.StreamReader(stream))
    assert back.member_roles == ("base", "correction")
    assert [m.descriptor.encode() for m in back.members] == [encode_descriptor(base), encode_descriptor(corr)]
    assert_same(head, back.descriptor)


@pytest.mark.parametrize("name", DT.__all__)
def test_our_descriptor_of_every_dtype_decodes_in_pyhurray(name):
    dt = getattr(DT, name)
    for shape in ((3, 4), (0, 5), ()):
        count = 1
        for n in shape:
            count *= n
        desc = TensorDescriptor(dt.tag, shape, buffers=[BufferHandle(hurray.buffer_size_bytes(dt, count))])
        wire = encode_descriptor(desc)
        py = hurray.Descriptor.decode(wire)
        assert py.dtype is dt
        assert_same(desc, py)
        assert py.encode() == wire
        assert decode_descriptor(wire) == desc


# --------------------------------------------------------------------------------------
# Generated: the same tensor built on both sides encodes to the same bytes
# --------------------------------------------------------------------------------------

WHOLE_BYTE = [n for n in DT.__all__ if getattr(DT, n).bit_width % 8 == 0]


@st.composite
def same_tensor(draw):
    """Parameters of one tensor, built with pyhurray and with our model."""
    kind = draw(st.sampled_from(["row_major", "col_major", "strided", "csr", "csc", "coo", "scalar"]))
    name = draw(st.sampled_from(WHOLE_BYTE if kind in ("csr", "csc", "coo") else DT.__all__))
    dt = getattr(DT, name)
    rank = {"scalar": 0, "csr": 2, "csc": 2}.get(kind) or draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank))
    count = 1
    for n in shape:
        count *= n
    size = hurray.buffer_size_bytes
    py_kw, aux, ours_layout = {}, [], RowMajorLayout()
    if kind == "col_major":
        py_kw["layout"], ours_layout = hurray.ColMajorLayout(), ColumnMajorLayout()
    if kind == "strided":  # the contiguous strides of a row- or column-major order
        dims = shape if draw(st.booleans()) else shape[::-1]
        strides, step = [], 1
        for n in reversed(dims):
            strides.insert(0, step)
            step *= max(n, 1)
        strides = strides if dims is shape else strides[::-1]
        py_kw["layout"], ours_layout = hurray.StridedLayout(strides), StridedLayout(strides)
    if kind in ("csr", "csc", "coo"):
        nnz = draw(st.integers(0, count))
        data = bytes(size(dt, nnz))
        if kind == "coo":
            aux = [bytes(8 * nnz * rank)]
            py_kw["layout"], ours_layout = hurray.CooLayout(nnz=nnz), CooLayout(nnz)
        else:
            major = shape[0] if kind == "csr" else shape[1]
            aux = [bytes(8 * nnz), bytes(8 * (major + 1))]
            py_cls, our_cls = (hurray.CsrLayout, CsrLayout) if kind == "csr" else (hurray.CscLayout, CscLayout)
            py_kw["layout"], ours_layout = py_cls(nnz=nnz), our_cls(nnz)
    else:
        data = bytes(size(dt, count))
    shard = statistics = None
    if draw(st.booleans()):
        extra = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
        offset = [draw(st.integers(0, e)) for e in extra]
        parent = [n + e for n, e in zip(shape, extra)]
        py_kw["shard"], shard = hurray.Shard(parent, offset), Shard(parent, offset)
    if draw(st.booleans()):  # a sparse layout's statistics nnz equals its own (layouts/coo.md)
        nnz = ours_layout.nnz if kind in ("csr", "csc", "coo") else draw(st.integers(0, count))
        py_kw["statistics"], statistics = hurray.Statistics(nnz=nnz), Statistics(1, nnz=nnz)
    quantization = None
    if name in ("int8", "uint8") and kind not in ("csr", "csc", "coo") and draw(st.booleans()):
        scale = draw(st.floats(0.125, 1024.0, width=32))
        zero_point = draw(st.integers(-128, 127) if name == "int8" else st.integers(0, 255))  # storage range
        py_kw["quantization"] = hurray.PerTensorAffine(scale, zero_point)
        quantization = PerTensorAffine(scale, zero_point)
    py = hurray.Tensor(data, dt, shape, aux_buffers=aux, **py_kw)
    buffers = [BufferHandle(len(b), alignment=64 if b else 1) for b in (data, *aux)]  # pyhurray: 1 when empty
    ours = TensorDescriptor(dt.tag, shape, ours_layout, buffers=buffers, shard=shard, statistics=statistics,
                            quantization=quantization)
    return py, ours


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(same_tensor())
def test_generated_tensors_encode_identically_on_both_sides(pair):
    py, ours = pair
    wire = py.descriptor.encode()
    assert encode_descriptor(ours) == wire
    assert decode_descriptor(wire) == ours  # every descriptor rule passes
    assert_same(ours, hurray.Descriptor.decode(wire))
