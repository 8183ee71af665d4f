"""For every rule of the rule engine one input where it passes and one where it fires.

:data:`DESCRIPTOR_CASES` (descriptor rules, tests/test_rules_descriptor.py) and
:data:`COMPOSITE_CASES` (composite member and close-time rules, tests/test_rules_composite.py);
tests/test_rules_specmap.py checks that together they fire every rule of the engine.
"""

from __future__ import annotations

import attrs

from hurray_schema.conformance.descriptors import HEAD_RULES, SEMANTIC
from hurray_schema.model import (
    DYNAMIC_DIMENSION, BufferHandle as B, CombineOp, CompositeMember, CompositionRule, ElementType as T,
    PerChannelAffine, PerTensorAffine, TensorDescriptor as D,
)
from support.descriptors import bufs, head, member

ev = attrs.evolve
F16 = T.FLOAT16

# --------------------------------------------------------------------------------------
# Descriptor rules: (rule id, good, bad)
# --------------------------------------------------------------------------------------

PC = D(T.INT8, (4, 4), buffers=bufs(16, 16, 16), quantization=PerChannelAffine(0, 1, 2))  # 4 scales, 4 zps

DESCRIPTOR_CASES = SEMANTIC + HEAD_RULES + [
    # not a conformance vector: every input breaking it breaks buffer.colocation first (vectors/corpus.py)
    ("quantization.buffer.device", PC, ev(PC, buffers=[B(16), B(16, device_tag=1), B(16)])),
]
"""One passing and one firing input per descriptor rule: the conformance vectors' tables
(``hurray_schema/conformance/descriptors.py``), plus the rule no vector can show first."""

# --------------------------------------------------------------------------------------
# Composite rules: (rule id, head, passing members, firing members)
# --------------------------------------------------------------------------------------

M0, M1 = member(offset=(0, 0)), member(offset=(0, 4))
OV_HEAD = head(CompositionRule.OVERLAY, 2, op=CombineOp.ADD)
BASE = member((8, 8), role=1)
CORR = member((2, 2), (3, 3), role=0)

COMPOSITE_CASES = [
    ("composite.member.shard", head(), [M0, M1], [M0, ev(M1, shard=None)]),
    ("composite.member.parent_shape", head(), [M0, M1], [M0, member(offset=(0, 4), parent=(8, 9))]),
    ("composite.member.box_bounds", head(), [M0, M1], [M0, member((8, DYNAMIC_DIMENSION), (0, 4), size=0)]),
    ("metadata.shard.bounds", head(), [M0, M1], [M0, member(offset=(0, 5))]),  # past the head = past parent_shape
    ("composite.member.decoded_type", head(), [M0, ev(M1, type_tag=T.INT8, buffers=[B(32)],
                                                       quantization=PerTensorAffine(0.1))],
     [M0, ev(M1, type_tag=F16, buffers=[B(64)])]),
    ("composite.member.overlay_section", OV_HEAD, [BASE, CORR], [BASE, ev(CORR, composite_member=None)]),
    ("composite.member.overlay_base_first", OV_HEAD, [BASE, CORR],
     [ev(BASE, composite_member=CompositeMember(0)), CORR]),
    ("composite.member.overlay_base_span", OV_HEAD, [BASE, CORR], [member((8, 4), role=1), CORR]),
    ("composite.member.overlay_correction_role", OV_HEAD, [BASE, CORR],
     [BASE, ev(CORR, composite_member=CompositeMember(1))]),
    ("composite.member.no_member_section", head(), [M0, M1], [M0, ev(M1, composite_member=CompositeMember(0))]),
    ("composite.close.partition_gap", head(), [M0, M1], [M0, member((8, 3), (0, 4))]),
    ("composite.close.partition_overlap", head(n=3), [member((8, 2)), member((8, 2), (0, 2)), member((8, 4), (0, 4))],
     [member((8, 3)), member((8, 2), (0, 2)), member((8, 4), (0, 4))]),
    ("composite.close.overlay_empty", head(CompositionRule.OVERLAY, 1, op=CombineOp.REPLACE), [BASE], []),
]
