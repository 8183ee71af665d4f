"""Composite vectors (``layouts/composite.md § Validation``, ``§ Binding``).

Each is a bare stream (the smallest container a composite fits in): a head and its
members in pre-order, written with ``write_stream(..., validate=False)``.  The members'
buffers are zeros of the sizes their handles declare; the passing input of every case
is a valid composite of the same kind.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import attrs

from ..io import Composite, Tensor
from ..limits import MAX_COMPOSITE_DEPTH
from ..model import (
    DYNAMIC_DIMENSION, BufferHandle, CombineOp, CompositeLayout, CompositeMember, CompositionRule, ElementType,
    MemberRole, PerTensorAffine, Shard, TensorDescriptor,
)
from ..structs.element_types import element_type_info
from .case import Case
from .patch import bare

__all__ = ["composite_cases"]

evolve = attrs.evolve
F32, F16 = ElementType.FLOAT32, ElementType.FLOAT16


def head(rule=CompositionRule.PARTITION, count: int = 2, shape=(8, 8), op=CombineOp.NONE,
         shard: Optional[Shard] = None) -> TensorDescriptor:
    return TensorDescriptor(F32, tuple(shape), CompositeLayout(rule, count, op), shard=shard)


def member(shape=(8, 4), offset=(0, 0), parent=(8, 8), type_tag=F32, size: Optional[int] = None,
           role: Optional[MemberRole] = None, **fields) -> TensorDescriptor:
    """A row-major member (float32 unless said) at ``offset`` of a ``parent``-shaped head."""
    if size is None:
        size = element_type_info(type_tag).buffer_bytes(math.prod(shape))
    section = None if role is None else CompositeMember(role)
    return TensorDescriptor(type_tag, tuple(shape), buffers=[BufferHandle(size)],
                            shard=Shard(tuple(parent), tuple(offset)), composite_member=section, **fields)


def leaf(desc: TensorDescriptor) -> Tensor:
    """``desc`` with zero-filled buffers of the sizes its handles declare."""
    return Tensor(desc, [bytes(handle.byte_size) for handle in desc.buffers])


def composite(head_desc: TensorDescriptor, members: Sequence) -> Composite:
    """A Composite of ``head_desc`` over ``members`` (descriptors or items), even when the
    head promises another member count (a torn composite, which the class refuses to build)."""
    items = [leaf(m) if isinstance(m, TensorDescriptor) else m for m in members]
    honest = evolve(head_desc, layout=evolve(head_desc.layout, member_count=len(items)))
    item = Composite(honest, items)
    item.descriptor = head_desc
    return item


LEFT, RIGHT = member(offset=(0, 0)), member(offset=(0, 4))
OVERLAY = head(CompositionRule.OVERLAY, 2, op=CombineOp.ADD)
BASE = member((8, 8), role=MemberRole.BASE)
CORRECTION = member((2, 2), (3, 3), role=MemberRole.CORRECTION)
PARTITION = head()
SCALAR = member((), (), ())


def nested(levels: int) -> Composite:
    """``levels`` partition heads of shape [2], each the one member of the one above it."""
    item = leaf(member((2,), (0,), (2,)))
    for level in range(levels):
        outer = level < levels - 1
        item = Composite(head(count=1, shape=(2,), shard=Shard((2,), (0,)) if outer else None), [item])
    return item


def _stream(rule_id: str, good: tuple, bad: tuple, note: Optional[str] = None) -> Case:
    """``good``/``bad``: (head, members) of the passing and the violating composite."""
    return Case(rule_id, "stream", lambda: (bare([composite(*good)]), bare([composite(*bad)])), note)


def _nesting() -> tuple[bytes, bytes]:
    return bare([nested(MAX_COMPOSITE_DEPTH)]), bare([nested(MAX_COMPOSITE_DEPTH + 1)])


def composite_cases() -> list[Case]:
    overlay_one = head(CompositionRule.OVERLAY, 1, op=CombineOp.REPLACE)
    return [
        _stream("composite.member.shard", (PARTITION, [LEFT, RIGHT]), (PARTITION, [LEFT, evolve(RIGHT, shard=None)])),
        _stream("composite.member.parent_shape", (PARTITION, [LEFT, RIGHT]),
                (PARTITION, [LEFT, member(offset=(0, 4), parent=(8, 9))])),
        _stream("composite.member.box_bounds", (PARTITION, [LEFT, RIGHT]),
                (PARTITION, [LEFT, member((8, DYNAMIC_DIMENSION), (0, 4), size=0)])),
        _stream("composite.member.decoded_type",
                (PARTITION, [LEFT, evolve(RIGHT, type_tag=ElementType.INT8, buffers=[BufferHandle(32)],
                                          quantization=PerTensorAffine(0.1))]),
                (PARTITION, [LEFT, evolve(RIGHT, type_tag=F16, buffers=[BufferHandle(64)])])),
        _stream("composite.member.overlay_section", (OVERLAY, [BASE, CORRECTION]),
                (OVERLAY, [BASE, evolve(CORRECTION, composite_member=None)])),
        _stream("composite.member.overlay_base_first", (OVERLAY, [BASE, CORRECTION]),
                (OVERLAY, [evolve(BASE, composite_member=CompositeMember(MemberRole.CORRECTION)), CORRECTION])),
        _stream("composite.member.overlay_base_span", (OVERLAY, [BASE, CORRECTION]),
                (OVERLAY, [member((8, 4), role=MemberRole.BASE), CORRECTION])),
        _stream("composite.member.overlay_correction_role", (OVERLAY, [BASE, CORRECTION]),
                (OVERLAY, [BASE, evolve(CORRECTION, composite_member=CompositeMember(MemberRole.BASE))])),
        _stream("composite.member.no_member_section", (PARTITION, [LEFT, RIGHT]),
                (PARTITION, [LEFT, evolve(RIGHT, composite_member=CompositeMember(MemberRole.CORRECTION))])),
        _stream("composite.close.partition_gap", (PARTITION, [LEFT, RIGHT]),
                (PARTITION, [LEFT, member((8, 3), (0, 4))])),
        _stream("composite.close.partition_overlap",
                (head(count=3), [member((8, 2)), member((8, 2), (0, 2)), member((8, 4), (0, 4))]),
                (head(count=3), [member((8, 3)), member((8, 2), (0, 2)), member((8, 4), (0, 4))])),
        _stream("composite.close.partition_overlap", (head(count=1, shape=()), [SCALAR]),
                (head(count=2, shape=()), [SCALAR, SCALAR]),
                "a rank-0 head and two rank-0 members: both contain its one index (the overlap formula holds "
                "for every dimension of none)"),
        _stream("composite.close.overlay_empty", (overlay_one, [BASE]),
                (evolve(overlay_one, layout=CompositeLayout(CompositionRule.OVERLAY, 0, CombineOp.REPLACE)), [])),
        _stream("composite.torn", (PARTITION, [LEFT, RIGHT]), (head(count=3), [LEFT, RIGHT]),
                "the head promises 3 members, the stream ends after 2"),
        Case("composite.nesting.depth", "stream", _nesting, "nine nested partition heads"),
    ]
