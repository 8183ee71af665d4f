"""Builders of descriptors, tensors and composites shared by test modules.

The descriptor builders give a :class:`TensorDescriptor` with hand-written buffer sizes, for
the rule, codec and limit tests; :func:`column_major` and :func:`member_builder` make the
tensors of the region reads (tests/test_region.py, test_remote.py); :data:`EDGE_CASES` are the
descriptors at the edges of the format (empty, scalar, dynamic, rank 64, every section).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

import hurray_schema as hs
from hurray_schema.model import (
    DYNAMIC_DIMENSION, BufferHandle, ColumnMajorLayout, CombineOp, CompositeLayout, CompositeMember, CompositionRule,
    CsrLayout, ElementType, ExtensionType, Nf4, PerBlockAffine, QuantScheme, Shard, Statistics, StridedLayout,
    TensorDescriptor, TiledLayout,
)
from hurray_schema.structs.quantization import BLOCK_SIZE_BOUNDS

F32 = ElementType.FLOAT32

# --------------------------------------------------------------------------------------
# Descriptors
# --------------------------------------------------------------------------------------


def bufs(*sizes, **kw) -> list[BufferHandle]:
    """One buffer handle per size, each with the handle fields ``kw``."""
    return [BufferHandle(s, **kw) for s in sizes]


def dense(shape=(4, 4), t=F32, size=None, **kw) -> TensorDescriptor:
    """A dense (row-major unless ``layout`` is given) descriptor of ``t``; one buffer of ``size``
    bytes (by default 4 bytes per element) unless ``buffers`` is given."""
    kw.setdefault("buffers", [BufferHandle(size if size is not None else 4 * math.prod(shape))])
    return TensorDescriptor(t, tuple(shape), **kw)


def head(rule=CompositionRule.PARTITION, n=2, shape=(8, 8), t=F32, op=CombineOp.NONE, **kw) -> TensorDescriptor:
    """A composite head: ``rule`` over ``n`` members, combine op ``op`` (``kw``: other sections, e.g. a shard)."""
    return TensorDescriptor(t, tuple(shape), CompositeLayout(rule, n, op), **kw)


def member(shape=(8, 4), offset=(0, 0), parent=(8, 8), t=F32, size=None, role=None, **kw) -> TensorDescriptor:
    """A composite member: a dense ``shape`` box at ``offset`` of ``parent`` (its shard section),
    one buffer of ``size`` bytes (by default 4 per element), a member section if ``role`` is given."""
    size = size if size is not None else 4 * int(np.prod(shape))
    return TensorDescriptor(t, tuple(shape), buffers=[BufferHandle(size)], shard=Shard(parent, offset),
                            composite_member=None if role is None else CompositeMember(role), **kw)


def nested_tiled(depth: int) -> TiledLayout:
    """``depth`` tiling levels of 1x1 tiles, innermost row-major."""
    level = TiledLayout((1, 1))
    for _ in range(depth - 1):
        level = TiledLayout((1, 1), inner_layout=0x04, inner=level)
    return level


EDGE_CASES = {
    "empty-1d": TensorDescriptor(ElementType.FLOAT32, (0,), buffers=[BufferHandle(0)]),
    "empty-3x0x5": TensorDescriptor(ElementType.FLOAT32, (3, 0, 5), buffers=[BufferHandle(0)]),
    "scalar": TensorDescriptor(ElementType.FLOAT64, (), buffers=[BufferHandle(8)]),
    "scalar-strided": TensorDescriptor(ElementType.INT8, (), StridedLayout(()), buffers=[BufferHandle(1)]),
    "csr-nnz0": TensorDescriptor(ElementType.FLOAT32, (3, 3), CsrLayout(0),
                                 buffers=[BufferHandle(0), BufferHandle(0), BufferHandle(32)]),
    "int4-zero-elements": TensorDescriptor(ElementType.INT4, (7, 0), buffers=[BufferHandle(0)]),
    "bool-zero-elements": TensorDescriptor(ElementType.BOOL, (0,), buffers=[BufferHandle(0, alignment=1)]),
    "float6-zero-elements": TensorDescriptor(ElementType.FLOAT6_E2M3, (0, 3), buffers=[BufferHandle(0)]),
    "per-block-axis-0": TensorDescriptor(ElementType.INT4, (0, 64), buffers=[BufferHandle(0), BufferHandle(0)],
                                         quantization=PerBlockAffine(0, 32, 1, flags=1, scale_type_tag=1)),
    "dynamic": TensorDescriptor(ElementType.FLOAT32, (DYNAMIC_DIMENSION, 4), buffers=[BufferHandle(0)]),
    "dynamic-and-zero": TensorDescriptor(ElementType.FLOAT32, (DYNAMIC_DIMENSION, 0), buffers=[BufferHandle(0)]),
    "rank-64": TensorDescriptor(ElementType.UINT8, (1,) * 64, buffers=[BufferHandle(1)]),
    "tiled-depth-8": TensorDescriptor(ElementType.FLOAT32, (2, 2), buffers=[BufferHandle(16)],
                                      layout=nested_tiled(8)),
    "composite-head": TensorDescriptor(ElementType.FLOAT32, (8, 8), CompositeLayout(1, 2)),
    "all-sections": TensorDescriptor(0xF3, (2,), buffers=[BufferHandle(3)], quantization=Nf4(0, 64, 1),
                                     shard=Shard((4,), (2,)), statistics=Statistics(0x3F, nnz=1),
                                     extension_type=ExtensionType(12), composite_member=CompositeMember(1)),
}


# --------------------------------------------------------------------------------------
# Tensors and members of the region reads
# --------------------------------------------------------------------------------------


def column_major(t):
    """The tensor whose column-major storage is ``t``'s row-major storage: ``t``'s array transposed
    (a quantization axis ``k`` of ``t`` becomes axis ``rank - 1 - k``)."""
    desc = t.descriptor
    rank = len(desc.shape)
    q = desc.quantization
    if q is not None and hasattr(q, "axis"):
        q = attrs.evolve(q, axis=rank - 1 - q.axis)
    return hs.Tensor(attrs.evolve(desc, shape=tuple(reversed(desc.shape)), layout=ColumnMajorLayout(),
                                  quantization=q), t.buffers)


MEMBER_KINDS = ["dense", "col", "quant", "coo", "csr", "nested"]


def member_builder(kind: str):
    def build(sub):
        block = BLOCK_SIZE_BOUNDS[QuantScheme.PER_BLOCK_AFFINE][0]
        if kind == "quant" and sub.dtype != np.float32 and sub.shape[-1] >= block:  # block_size <= shape[axis]
            return hs.quantize(sub, "per_block", block_size=block, scale_type=sub.dtype.name)
        if kind == "quant" and sub.dtype == np.float32:
            return hs.quantize(sub, "per_tensor")
        if kind == "quant":  # too narrow for a block: a dense member of the head's type
            return hs.Tensor.from_numpy(sub)
        if kind == "col":
            return column_major(hs.Tensor.from_numpy(np.ascontiguousarray(sub.T)))
        if kind in ("coo", "csr") and sub.ndim == 2:
            thin = np.where(np.abs(sub.astype(np.float32)) > 0.7, sub, 0).astype(sub.dtype)
            coords = np.argwhere(thin != 0)
            if kind == "coo":
                return hs.sparse_coo(coords, thin[tuple(coords.T)], sub.shape)
            indptr = np.concatenate([[0], np.cumsum(np.bincount(coords[:, 0], minlength=sub.shape[0]))])
            return hs.sparse_csr(thin[tuple(coords.T)], coords[:, 1], indptr, sub.shape)
        if kind == "nested" and min(sub.shape) > 1:
            return hs.partition(sub, grid=(2,) + (1,) * (sub.ndim - 1), member=member_builder("quant"))
        return hs.Tensor.from_numpy(np.ascontiguousarray(sub))
    return build
