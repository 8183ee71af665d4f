"""Rules on a composite head taken alone (``layouts/composite.md § Head Descriptor`` and
``§ Head Layout-Specific Fields``).  The rules across a head and its members are in
:mod:`hurray_schema.rules.composite`, which also runs these on each head it binds."""

from __future__ import annotations

from ...model import OPEN_COMPOSITE, CombineOp, CompositeLayout, CompositionRule, DescriptorFlag
from ..engine import Level
from .dispatch import When, descriptor_rule
from ...structs._declare import valid_source
from ...structs.layouts import COMPOSITE
from ...structs.tags import is_private_tag

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT
HEAD_REF = "layouts/composite.md § Head Descriptor"
FIELDS_REF = "layouts/composite.md § Head Layout-Specific Fields"
_SCOPE = "composite.head"
_HEAD = When(layouts={CompositeLayout})
_HAS_COMPOSITE_MEMBER = int(DescriptorFlag.HAS_COMPOSITE_MEMBER)
_LAST_ASSIGNED_RULE = int(max(CompositionRule))
# plain ints: comparing with enum members costs more on the decode path
_NO_COMBINE = frozenset({int(CompositionRule.PARTITION), int(CompositionRule.GROUP)})
_OVERLAY = int(CompositionRule.OVERLAY)
_NO_OP = int(CombineOp.NONE)
_OVERLAY_OPS = frozenset({int(CombineOp.REPLACE), int(CombineOp.ADD)})


def _on_head(form):
    """A condition that holds on every layout but a head; on a head, ``form(signature)``."""
    return lambda s: s.layout is not CompositeLayout or form(s)




@descriptor_rule("composite.head.buffer_count_zero", MUST, HEAD_REF, "A composite head has buffer_count 0.",
                 scope=_SCOPE, when=_HEAD, passes=_on_head(lambda s: s.buffer_count == 0))
def _head_buffers(desc, ctx):
    return f"composite head has buffer_count {len(desc.buffers)}", ctx.buffer_count()


@descriptor_rule("composite.head.byte_offset_zero", MUST, HEAD_REF, "A composite head has byte_offset 0.",
                 scope=_SCOPE, when=_HEAD, passes=_on_head(lambda s: "byte_offset == 0"))
def _head_offset(desc, ctx):
    return f"composite head has byte_offset {desc.byte_offset}", ctx.byte_offset()


@descriptor_rule("composite.head.no_member_section", MUST_NOT, HEAD_REF,
                 "A composite head does not set HAS_COMPOSITE_MEMBER.", scope=_SCOPE, when=_HEAD,
                 passes=_on_head(lambda s: not s.has("composite_member")
                                 and f"not desc.unparsed_flags & {_HAS_COMPOSITE_MEMBER}"))
def _head_member(desc, ctx):
    return "composite head sets HAS_COMPOSITE_MEMBER", ctx.header("flags")


@descriptor_rule("composite.head.no_quantization", MUST_NOT, HEAD_REF,
                 "A composite head does not set HAS_QUANTIZATION.", scope=_SCOPE, when=_HEAD,
                 passes=_on_head(lambda s: s.scheme is None))
def _head_quant(desc, ctx):
    return "composite head sets HAS_QUANTIZATION", ctx.header("flags")


@descriptor_rule("composite.head.rule_reserved", MUST, FIELDS_REF,
                 "composition_rule 0x00, 0xFF and 0x04-0xEF are rejected.", scope=_SCOPE, when=_HEAD,
                 passes=_on_head(lambda s: f"(0 < layout.composition_rule <= {_LAST_ASSIGNED_RULE} or "
                                 f"{s.const(is_private_tag)}(layout.composition_rule))"))
def _head_rule(desc, ctx):
    return f"composition_rule 0x{desc.layout.composition_rule:02X} is reserved or invalid", \
        ctx.layout("composition_rule")


@descriptor_rule("composite.head.rule_private", MUST, FIELDS_REF,
                 "A private composition_rule (0xF0-0xFE) is rejected unless permissive with an out-of-band "
                 "agreement.", scope=_SCOPE, permissive=True, when=_HEAD,
                 passes=_on_head(lambda s: f"(layout.composition_rule <= {_LAST_ASSIGNED_RULE} or not "
                                 f"{s.const(is_private_tag)}(layout.composition_rule))"))
def _head_private(desc, ctx):
    return f"private composition_rule 0x{desc.layout.composition_rule:02X} is not known here", \
        ctx.layout("composition_rule")


@descriptor_rule("composite.head.combine_op", MUST, FIELDS_REF,
                 "combine_op is 0x00 for partition and group, 0x01 or 0x02 for overlay.", scope=_SCOPE, when=_HEAD,
                 passes=_on_head(lambda s: f"(layout.combine_op == {_NO_OP} if layout.composition_rule in "
                                 f"{s.const(_NO_COMBINE)} else layout.composition_rule != {_OVERLAY} or "
                                 f"layout.combine_op in {s.const(_OVERLAY_OPS)})"))
def _head_combine(desc, ctx):
    rule, op = desc.layout.composition_rule, desc.layout.combine_op
    if rule == _OVERLAY:
        return f"combine_op 0x{op:02X} for an overlay (must be 0x01 or 0x02)", ctx.layout("combine_op")
    return f"combine_op 0x{op:02X} for composition_rule 0x{rule:02X} (must be 0x00)", ctx.layout("combine_op")


@descriptor_rule("composite.head.reserved", MUST, FIELDS_REF, "The head's _reserved bytes are zero.",
                 scope=_SCOPE, when=_HEAD, passes=_on_head(lambda s: valid_source(COMPOSITE, "_reserved", "layout._reserved")))
def _head_reserved(desc, ctx):
    return f"composite head _reserved bytes are {desc.layout._reserved.hex()}", ctx.layout("_reserved")


@descriptor_rule("composite.head.open_sentinel", MUST, FIELDS_REF,
                 "member_count 0xFFFFFFFF (open composite, reserved for a future version) is rejected.",
                 scope=_SCOPE, when=_HEAD, passes=_on_head(lambda s: f"layout.member_count != {OPEN_COMPOSITE}"))
def _head_open(desc, ctx):
    return "member_count is the reserved open-composite sentinel 0xFFFFFFFF", ctx.layout("member_count")
