"""Hypothesis strategies shared by test modules.

Descriptors and their parts (every layout tag, every optional section, empty and dynamic
shapes), structurally valid for the codec (tests/test_codec_roundtrip.py, test_codec_signature.py,
test_rules_descriptor.py, test_ksy.py), and the boxes and tensors of the region reads
(tests/test_region.py, test_remote.py).
"""

from __future__ import annotations

import numpy as np
import ml_dtypes
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import hurray_schema as hs
from hurray_schema.model import (
    DYNAMIC_DIMENSION, OPEN_COMPOSITE, BlockPagedLayout, BufferHandle, ColumnMajorLayout, CompositeLayout,
    CompositeMember, CooLayout, CscLayout, CsfLayout, CsrLayout, ElementType, ExtensionLayout, ExtensionType,
    HilbertLayout, LayoutTag, MortonLayout, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine,
    QuantScheme, RowMajorLayout, Shard, Statistics, StridedLayout, TensorDescriptor, TiledLayout,
)
from hurray_schema.structs import layouts as L
from hurray_schema.structs.quantization import BLOCK_SIZE_BOUNDS
from support.descriptors import column_major, member_builder
from support.sizes import size

# --------------------------------------------------------------------------------------
# Descriptors
# --------------------------------------------------------------------------------------

U8, U16, U32, U64 = (st.integers(0, 2**b - 1) for b in (8, 16, 32, 64))
I64 = st.integers(-(2**63), 2**63 - 1)
F64 = st.floats(allow_nan=True, allow_infinity=True)
F32 = st.floats(width=32, allow_nan=False, allow_infinity=True)

DIM = st.one_of(st.integers(0, 16), st.just(0), st.just(DYNAMIC_DIMENSION), U64)
SHAPES = st.one_of(st.lists(DIM, min_size=0, max_size=5), st.lists(DIM, min_size=64, max_size=64))


def zeros_or(n: int):
    """Reserved bytes: zeros, as a valid writer emits them."""
    return st.just(bytes(n))


def tiled(rank: int, depth: int = 1):
    simple = st.sampled_from([0x01, 0x02, 0x03])
    inner_choices = [0x01, 0x02, 0x03] + ([0x04] if depth < L.MAX_TILED_DEPTH else [])

    @st.composite
    def build(draw):
        outer = draw(simple)
        inner_layout = draw(st.sampled_from(inner_choices))
        strides = st.lists(I64, min_size=rank, max_size=rank)
        return TiledLayout(
            tile_shape=draw(st.lists(st.integers(1, 2**64 - 1), min_size=rank, max_size=rank)),
            outer_layout=outer,
            inner_layout=inner_layout,
            outer_strides=draw(strides) if outer == 0x03 else None,
            inner_strides=draw(strides) if inner_layout == 0x03 else None,
            inner=draw(tiled(rank, depth + 1)) if inner_layout == 0x04 else None,
        )

    return build()


def layouts(rank: int):
    """Every layout tag's fields for a tensor of ``rank`` (structurally valid)."""
    n = st.integers(0, 2**64 - 1)
    choices = [
        st.just(RowMajorLayout()),
        st.just(ColumnMajorLayout()),
        st.builds(StridedLayout, st.lists(I64, min_size=rank, max_size=rank)),
        tiled(rank),
        st.builds(MortonLayout, st.lists(U32, min_size=rank, max_size=rank)),
        st.builds(CooLayout, n, st.sampled_from([0, 1])),
        st.builds(CsrLayout, n),
        st.builds(CscLayout, n),
        st.builds(CsfLayout, n, st.permutations(range(rank))),
        st.builds(BlockPagedLayout, page_size=U32, num_pages=U64, num_seqs=U32, paged_axis=st.just(0),
                  kv_role=st.sampled_from([0, 1, 2]), layer_index=U32, block_table_index_type=st.sampled_from([0, 1])),
        st.builds(CompositeLayout, st.sampled_from([1, 2, 3]), st.integers(0, OPEN_COMPOSITE - 1),
                  st.sampled_from([0, 1, 2])),
        st.builds(HilbertLayout, U32, U32),
        st.builds(ExtensionLayout, st.integers(0xF0, 0xFE), U64, st.binary(max_size=24)),
    ]
    return st.one_of(choices)


HANDLES = st.builds(
    BufferHandle, byte_size=U64, alignment=st.integers(0, 31).map(lambda e: 1 << e),
    device_tag=st.integers(0, 8) | st.integers(0xF0, 0xFE), sync_mode=st.sampled_from([0, 1, 2]),
    memory_class=st.sampled_from([0, 1, 2, 3]),
)

PADDING = st.one_of(st.just(b""), st.binary(max_size=12))
QUANTIZATIONS = st.one_of(
    st.builds(PerTensorAffine, scale=F32.filter(lambda x: x != 0), zero_point=st.integers(-(2**31), 2**31 - 1),
              padding=PADDING),
    st.builds(PerChannelAffine, axis=U32, scale_buffer_index=U32, zero_point_buffer_index=U32,
              flags=st.sampled_from([0, 1]), padding=PADDING),
    st.builds(PerBlockAffine, axis=U32, block_size=U32, scale_buffer_index=U32, zero_point_buffer_index=U32,
              flags=st.sampled_from([0, 1]), scale_type_tag=st.sampled_from([1, 2, 3]), padding=PADDING),
    st.builds(Nf4, axis=U32, block_size=U32, scale_buffer_index=U32, padding=PADDING),
    st.builds(Mxfp, axis=U32, block_size=U32, scale_buffer_index=U32, padding=PADDING),
)

STATISTICS = st.builds(
    Statistics, computed_mask=st.integers(0, 0x3F), nnz=U64, sparsity_ratio=F64, value_min=F64, value_max=F64,
    value_abs_max=F64, value_mean=F64, value_stddev=F64, nm_n=U8, nm_m=U8, has_nan=st.sampled_from([0, 1]),
    has_inf=st.sampled_from([0, 1]),
)

EXTENSION_TYPES = st.builds(
    ExtensionType, bit_width=st.integers(1, 2**32 - 1), packing_factor=U8, is_float=st.sampled_from([0, 1]),
    is_signed=st.sampled_from([0, 1]), sign_bits=st.sampled_from([0, 1]), exponent_bits=U8, mantissa_bits=U8,
    exponent_bias=U32, has_nan=st.sampled_from([0, 1]), has_inf=st.sampled_from([0, 1]),
)


@st.composite
def descriptors(draw, layout=None):
    """A structurally valid descriptor; ``layout`` pins one layout strategy."""
    shape = draw(SHAPES)
    rank = len(shape)
    lay = draw(layout(rank) if layout is not None else layouts(rank))
    private_type = draw(st.integers(0, 3)) == 0
    type_tag = draw(st.integers(0xF0, 0xFE)) if private_type else draw(st.sampled_from(list(ElementType)))
    is_head = lay.tag == LayoutTag.COMPOSITE
    maybe = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    return TensorDescriptor(
        type_tag=type_tag,
        shape=shape,
        layout=lay,
        buffers=() if is_head else draw(st.lists(HANDLES, min_size=1, max_size=6)),
        byte_offset=draw(U64),
        quantization=maybe(QUANTIZATIONS),
        shard=maybe(st.builds(Shard, st.lists(U64, min_size=rank, max_size=rank),
                              st.lists(U64, min_size=rank, max_size=rank))),
        statistics=maybe(STATISTICS),
        extension_type=draw(EXTENSION_TYPES) if private_type else None,
        composite_member=maybe(st.builds(CompositeMember, st.sampled_from([0, 1]))),
    )


def reader_mode(desc: TensorDescriptor) -> str:
    """Private extension layouts are unknown to a strict reader (metadata.md § Extension Layouts)."""
    return "permissive" if isinstance(desc.layout, ExtensionLayout) else "strict"


DESCRIPTOR_SETTINGS = settings(max_examples=size(60, 150), deadline=None,
                               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
"""The budget of the properties over :func:`descriptors`."""


# --------------------------------------------------------------------------------------
# Boxes and the tensors and composites the region reads are drawn over
# --------------------------------------------------------------------------------------

SMALL_SHAPES = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)
"""Shapes of rank 1 to 3, sides 1 to 9."""


@st.composite
def boxes(draw, shape):
    """A box [lo, hi) of ``shape``: often empty or touching an edge."""
    lo, hi = [], []
    for n in shape:
        kind = draw(st.sampled_from(["any", "any", "edge_lo", "edge_hi", "empty", "whole"]))
        if kind == "whole":
            a, b = 0, n
        elif kind == "empty":
            a = draw(st.integers(0, n))
            b = a
        else:
            a = 0 if kind == "edge_lo" else draw(st.integers(0, n))
            b = n if kind == "edge_hi" else draw(st.integers(a, n))
        lo.append(a)
        hi.append(b)
    return tuple(lo), tuple(hi)


@st.composite
def stepped_boxes(draw, shape):
    """(lo, hi, steps) of ``shape``: a box of :func:`boxes` and, most often, steps (positive, one per
    dimension; 1, small, or beyond the axis); ``None`` (a unit-step read) otherwise."""
    lo, hi = draw(boxes(shape))
    if draw(st.integers(0, 3)) == 0:
        return lo, hi, None
    steps = tuple(draw(st.one_of(st.just(1), st.integers(2, 4), st.integers(max(n, 1), n + 5))) for n in shape)
    return lo, hi, steps


@st.composite
def quantized_tensors(draw):
    """(tensor, shape): a quantized tensor of every scheme, row- or column-major, odd shapes included."""
    scheme = draw(st.sampled_from(["per_tensor", "per_channel", "per_block", "nf4", "mxfp"]))
    shape = list(draw(SMALL_SHAPES))
    axis = draw(st.integers(0, len(shape) - 1))
    kwargs = {"axis": axis}
    if scheme == "per_tensor":
        kwargs["storage"] = draw(st.sampled_from(["int8", "int4", "uint8", "int2"]))
    elif scheme == "per_channel":
        kwargs["storage"] = draw(st.sampled_from(["int8", "int4", "uint4"]))
    elif scheme == "per_block":
        kwargs["storage"] = draw(st.sampled_from(["int4", "int8", "uint4", "int2"]))
        kwargs["block_size"] = draw(st.sampled_from([2, 4, 16]))
        shape[axis] = max(shape[axis], kwargs["block_size"])  # per-block-affine.md: block_size <= shape[axis]
        kwargs["scale_type"] = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    elif scheme == "nf4":
        block = BLOCK_SIZE_BOUNDS[QuantScheme.NF4][0]  # nf4.md § Validity Constraints: the smallest block
        kwargs["block_size"] = block
        shape[axis] = max(shape[axis], block)
    else:
        smallest = BLOCK_SIZE_BOUNDS[QuantScheme.MXFP][0]  # mxfp.md § Validity Constraints
        block = draw(st.sampled_from([smallest, 2 * smallest]))
        kwargs["block_size"] = block
        kwargs["storage"] = draw(st.sampled_from(["float8_e4m3", "int4", "float4_e2m1"]))
        shape[axis] = block * draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    values = (rng.standard_normal(shape) * 3).astype(np.float32)
    t = hs.quantize(values, scheme, **kwargs)
    if draw(st.booleans()):
        t = column_major(t)
    return t, tuple(t.descriptor.shape)


@st.composite
def sparse_tensors(draw):
    """(tensor, the dense array its entries were taken from): COO (sorted or not), CSR or CSC."""
    kind = draw(st.sampled_from(["coo_sorted", "coo_unsorted", "csr", "csc"]))
    shape = draw(SMALL_SHAPES) if kind.startswith("coo") else draw(st.lists(st.integers(1, 9), min_size=2,
                                                                      max_size=2).map(tuple))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    dense = rng.standard_normal(shape).astype(draw(st.sampled_from([np.float32, np.float16, np.int32])))
    dense[rng.random(shape) < 0.6] = 0
    coords = np.argwhere(dense != 0)
    if kind == "coo_unsorted":
        coords = coords[rng.permutation(len(coords))]
    if kind.startswith("coo"):
        return hs.sparse_coo(coords, dense[tuple(coords.T)], shape, sort=kind == "coo_sorted"), dense
    major = 0 if kind == "csr" else 1
    counts = np.bincount(coords[:, major], minlength=shape[major]) if len(coords) else np.zeros(shape[major], int)
    order = np.lexsort((coords[:, 1 - major], coords[:, major]))
    coords = coords[order]
    indptr = np.concatenate([[0], np.cumsum(counts)])
    build = hs.sparse_csr if major == 0 else hs.sparse_csc
    return build(dense[tuple(coords.T)], coords[:, 1 - major], indptr, shape), dense


@st.composite
def overlay_composites(draw):
    """An overlay of a random [2..9, 2..9] base of float16, bfloat16, float32 or int32 and up to
    four corrections of every kind (dense, column-major, COO, CSR) at random offsets, replace or add."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    shape = draw(st.lists(st.integers(2, 9), min_size=2, max_size=2).map(tuple))
    dtype = draw(st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32, np.int32]))
    base = (rng.standard_normal(shape) * 100).astype(dtype)
    corrections = []
    for _ in range(draw(st.integers(0, 4))):
        size = tuple(int(rng.integers(1, n + 1)) for n in shape)
        offset = tuple(int(rng.integers(0, n - s + 1)) for n, s in zip(shape, size))
        sub = (rng.standard_normal(size) * 3).astype(dtype)
        kind = draw(st.sampled_from(["dense", "col", "coo", "csr"]))
        corrections.append((member_builder(kind)(sub), offset))
    return hs.overlay(base, corrections, draw(st.sampled_from(["replace", "add"])))
