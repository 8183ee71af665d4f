"""Rules on a composite head taken alone (``layouts/composite.md § Head Descriptor`` and
``§ Head Layout-Specific Fields``).  The rules across a head and its members are in
:mod:`hurray_schema.rules.composite`, which also runs these on each head it binds."""

from __future__ import annotations

from typing import Optional

from ...model import CombineOp, CompositeLayout, CompositionRule, DescriptorFlag
from ..engine import Level
from .dispatch import When, descriptor_rule
from ...structs.tags import is_private_tag

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT
HEAD_REF = "layouts/composite.md § Head Descriptor"
FIELDS_REF = "layouts/composite.md § Head Layout-Specific Fields"
_SCOPE = "composite.head"
_HEAD = When(layouts={CompositeLayout})
_HAS_COMPOSITE_MEMBER = int(DescriptorFlag.HAS_COMPOSITE_MEMBER)
_INVALID_RULES = frozenset({0x00, 0xFF})
_LAST_ASSIGNED_RULE = int(max(CompositionRule))
_OPEN_COMPOSITE = 0xFFFF_FFFF
# plain ints: comparing with enum members costs more on the decode path
_NO_COMBINE = frozenset({int(CompositionRule.PARTITION), int(CompositionRule.GROUP)})
_OVERLAY = int(CompositionRule.OVERLAY)
_NO_OP = int(CombineOp.NONE)
_OVERLAY_OPS = frozenset({int(CombineOp.REPLACE), int(CombineOp.ADD)})


def _head(desc) -> Optional[CompositeLayout]:
    return desc.layout if isinstance(desc.layout, CompositeLayout) else None


def _reserved_rule(rule: int) -> bool:
    """Neither an assigned nor a private composition rule (0x00 and 0xFF are invalid)."""
    return rule in _INVALID_RULES or (rule > _LAST_ASSIGNED_RULE and not is_private_tag(rule))


@descriptor_rule("composite.head.buffer_count_zero", MUST, HEAD_REF, "A composite head has buffer_count 0.",
                 scope=_SCOPE, when=_HEAD)
def _head_buffers(desc, ctx):
    if _head(desc) and desc.buffers:
        return f"composite head has buffer_count {len(desc.buffers)}", ctx.buffer_count()


@descriptor_rule("composite.head.byte_offset_zero", MUST, HEAD_REF, "A composite head has byte_offset 0.",
                 scope=_SCOPE, when=_HEAD)
def _head_offset(desc, ctx):
    if _head(desc) and desc.byte_offset:
        return f"composite head has byte_offset {desc.byte_offset}", ctx.byte_offset()


@descriptor_rule("composite.head.no_member_section", MUST_NOT, HEAD_REF,
                 "A composite head does not set HAS_COMPOSITE_MEMBER.", scope=_SCOPE, when=_HEAD)
def _head_member(desc, ctx):
    if _head(desc) and (desc.composite_member is not None or desc.unparsed_flags & _HAS_COMPOSITE_MEMBER):
        return "composite head sets HAS_COMPOSITE_MEMBER", ctx.header("flags")


@descriptor_rule("composite.head.no_quantization", MUST_NOT, HEAD_REF,
                 "A composite head does not set HAS_QUANTIZATION.", scope=_SCOPE, when=_HEAD)
def _head_quant(desc, ctx):
    if _head(desc) and desc.quantization is not None:
        return "composite head sets HAS_QUANTIZATION", ctx.header("flags")


@descriptor_rule("composite.head.rule_reserved", MUST, FIELDS_REF,
                 "composition_rule 0x00, 0xFF and 0x04-0xEF are rejected.", scope=_SCOPE, when=_HEAD)
def _head_rule(desc, ctx):
    h = _head(desc)
    if h and _reserved_rule(h.composition_rule):
        return f"composition_rule 0x{h.composition_rule:02X} is reserved or invalid", ctx.layout("composition_rule")


@descriptor_rule("composite.head.rule_private", MUST, FIELDS_REF,
                 "A private composition_rule (0xF0-0xFE) is rejected unless permissive with an out-of-band "
                 "agreement.", scope=_SCOPE, permissive=True, when=_HEAD)
def _head_private(desc, ctx):
    h = _head(desc)
    if h and h.composition_rule > _LAST_ASSIGNED_RULE and is_private_tag(h.composition_rule):
        return f"private composition_rule 0x{h.composition_rule:02X} is not known here", ctx.layout("composition_rule")


@descriptor_rule("composite.head.combine_op", MUST, FIELDS_REF,
                 "combine_op is 0x00 for partition and group, 0x01 or 0x02 for overlay.", scope=_SCOPE, when=_HEAD)
def _head_combine(desc, ctx):
    h = _head(desc)
    if not h:
        return
    rule, op = h.composition_rule, h.combine_op
    if rule in _NO_COMBINE and op != _NO_OP:
        return f"combine_op 0x{op:02X} for composition_rule 0x{rule:02X} (must be 0x00)", ctx.layout("combine_op")
    elif rule == _OVERLAY and op not in _OVERLAY_OPS:
        return f"combine_op 0x{op:02X} for an overlay (must be 0x01 or 0x02)", ctx.layout("combine_op")


@descriptor_rule("composite.head.reserved", MUST, FIELDS_REF, "The head's _reserved bytes are zero.",
                 scope=_SCOPE, when=_HEAD)
def _head_reserved(desc, ctx):
    h = _head(desc)
    if h and any(h._reserved):
        return f"composite head _reserved bytes are {h._reserved.hex()}", ctx.layout("_reserved")


@descriptor_rule("composite.head.open_sentinel", MUST, FIELDS_REF,
                 "member_count 0xFFFFFFFF (open composite, reserved for a future version) is rejected.",
                 scope=_SCOPE, when=_HEAD)
def _head_open(desc, ctx):
    h = _head(desc)
    if h and h.member_count == _OPEN_COMPOSITE:
        return "member_count is the reserved open-composite sentinel 0xFFFFFFFF", ctx.layout("member_count")
