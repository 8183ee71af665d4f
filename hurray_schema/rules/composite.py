"""Composite binding and validation: head checks, per-member checks as members arrive,
close-time checks, torn composites and the nesting depth.

``layouts/composite.md § Validation``: a reader keeps state bounded by ``member_count``
and reaches one verdict at the Nth member.  :class:`CompositeValidator` does exactly
that for one head and its *direct* members (a nested composite arrives as its head
descriptor; its own members go to its own validator).  :class:`CompositeBinder` is the
one binder every entry point uses -- the stream readers (both framings), the file
reader, ``audit``, the in-memory :class:`~hurray_schema.io.Composite` on first
evaluation, and :func:`validate_preorder`: it takes descriptors in pre-order (stream /
descriptor-offset order, ``§ Binding``), keeps a stack of validators, enforces the
nesting depth limit and finds torn composites, under one fault policy (raise the first
untolerated finding, or collect every finding).

One fault, one rule, one location.  Offsets are byte offsets from the start of the
container, given by the caller per descriptor (the descriptor's first byte -- in the
message framing the descriptor inside the TENSOR_DESCRIPTOR payload, not the message
header); a finding sits at:

* a member's ``parent_shape`` (``composite.member.parent_shape``), its ``shard_offset``
  (``box_bounds``, ``overlay_base_span``) or its ``member_role``
  (``overlay_base_first``, ``overlay_correction_role``) field;
* the member descriptor's first byte for the member faults about the descriptor as a
  whole (``shard``, ``decoded_type``, ``overlay_section``, ``no_member_section``) and for
  a head nested too deep (``composite.nesting.depth``, at the head that is one level too many);
* the head descriptor's first byte for the close-time faults (``partition_gap``,
  ``partition_overlap``, ``overlay_empty``) and for a torn composite (``composite.torn``,
  one finding, at the outermost composite still open when the input ends).

The partition exact-cover / non-overlap check is exact for any rank and any box shapes,
and costs ``O(N * 2**r * log N)`` for ``N`` boxes of effective rank ``r`` instead of the
``O(N**2)`` of comparing every pair.  It rests on an identity: the coverage count
``c(x) = number of member boxes containing x`` equals the indicator of the head box
everywhere iff the *corner measures* agree, where the corner measure of a box
``[a, b)`` puts weight ``(-1)**(number of upper coordinates)`` on each of its ``2**r``
corners (``c`` is the prefix sum of the corner measure, and the prefix sum is
invertible).  "Every index covered exactly once" is precisely ``c == 1_head``, i.e. exact
cover *and* no overlap.  So: add up the signed corners of all boxes (a sort and a
segmented sum in numpy), subtract the head's, and the partition is valid iff nothing
remains.  When something remains, the residual points locate a fault: a non-zero
residual at ``p`` means ``c - 1_head`` is non-zero at one of the ``2**r`` points
``p - s`` (``s`` in ``{0,1}**r``); counting the boxes containing those points names a gap
or the overlapping members.  Dimensions every box spans fully are dropped first.  An
empty box (a zero extent) contains no index, so it covers nothing; whether it overlaps
is decided by the spec's own non-overlap formula, which an empty box strictly inside
another box meets (``spec-map.md § Interpretations``).  Above an effective rank of 16 an
exact sort-and-sweep fallback is used.

Decoded value type of a member (check 2, our interpretation, see ``spec-map.md``): an
unquantized member decodes to its ``type_tag``; a nested composite to its head's
``type_tag``; per-tensor affine, NF4 and MXFP to float32 (their pages state float32
arithmetic / a float32 result); per-channel and per-block affine to their
``scale_type_tag`` (float16 / bfloat16 / float32) -- which is how the spec's SpQR example
has an int4 per-block-affine base "decode to float16".  An unknown scheme's decoded type
is unknown and is not compared.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ..limits import MAX_COMPOSITE_DEPTH, Limits
from ..model import (
    CompositeLayout, CompositionRule, ElementType, MemberRole, Mxfp, Nf4, PerBlockAffine, PerChannelAffine,
    PerTensorAffine, TensorDescriptor, DYNAMIC_DIMENSION,
)
from ..structs.sections import COMPOSITE_MEMBER_SECTION, SHARD_SECTION
from .descriptor import DESCRIPTOR_RULES, DescriptorContext, first_error
from .engine import Finding, Level, Mode, Report, as_mode, declare

__all__ = [
    "CompositeBinder", "CompositeValidator", "validate_preorder", "decoded_type", "partition_check",
    "MAX_COMPOSITE_DEPTH",
]

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT

V = "layouts/composite.md § Validation"
PM = "layouts/composite.md § Composition Semantics › Partition"

MEMBER_SHARD = declare(
    "composite.member.shard", MUST, "layouts/composite.md § Members",
    "Every partition and overlay member carries a shard section.", scope="composite.member")
MEMBER_PARENT = declare(
    "composite.member.parent_shape", MUST, V,
    "A partition or overlay member's parent_shape equals the head's shape (check 1).", scope="composite.member")
MEMBER_BOUNDS = declare(
    "composite.member.box_bounds", MUST, V,
    "A partition or overlay member's box lies inside the head (check 1): its extent is definite (no dynamic "
    "dimension).  A definite box past the head is the member's shard past its parent_shape, which equals the "
    "head's shape: metadata.shard.bounds, the one rule for that fault.", scope="composite.member")
MEMBER_TYPE = declare(
    "composite.member.decoded_type", MUST, V,
    "A partition or overlay member's decoded value type (after dequantization) equals the head's type_tag "
    "(check 2).", scope="composite.member")
MEMBER_OVERLAY_SECTION = declare(
    "composite.member.overlay_section", MUST, "layouts/composite.md § Composite Member Section",
    "Every overlay member carries a Composite Member section (check 4); a nested composite head, which must "
    "not carry one, takes its role from its position.", scope="composite.member")
MEMBER_BASE_FIRST = declare(
    "composite.member.overlay_base_first", MUST, V,
    "The first overlay member has member_role 0x01 (base) (check 4).", scope="composite.member")
MEMBER_BASE_SPAN = declare(
    "composite.member.overlay_base_span", MUST, V,
    "The overlay base spans the index space: all-zero shard_offset and shape equal to the head's (check 4).",
    scope="composite.member")
MEMBER_CORRECTION = declare(
    "composite.member.overlay_correction_role", MUST, V,
    "Every overlay member after the first has member_role 0x00 (correction) (check 4).", scope="composite.member")
MEMBER_NO_SECTION = declare(
    "composite.member.no_member_section", MUST_NOT, V,
    "A partition or group member does not set HAS_COMPOSITE_MEMBER (check 5).", scope="composite.member")
NESTING_DEPTH = declare(
    "composite.nesting.depth", MUST, "layouts/composite.md § Binding",
    f"Composites nest at most {MAX_COMPOSITE_DEPTH} levels deep (a head counts as one level), in streams and "
    "files alike.", scope="composite.member")
CLOSE_GAP = declare(
    "composite.close.partition_gap", MUST, PM,
    "At close, the partition members' boxes cover every index of the head (exact cover); a permissive "
    "reader may keep a violating composite.", scope="composite.close", permissive=True)
CLOSE_OVERLAP = declare(
    "composite.close.partition_overlap", MUST_NOT, PM,
    "At close, no two partition members' boxes share an index; a permissive reader may keep a violating "
    "composite.", scope="composite.close", permissive=True)
CLOSE_OVERLAY_EMPTY = declare(
    "composite.close.overlay_empty", MUST, V,
    "An overlay head with member_count 0 is rejected: it has no base member.", scope="composite.close")
TORN = declare(
    "composite.torn", MUST, "layouts/composite.md § Validation › Torn composite",
    "A composite whose input (stream or file) ends before all member_count members arrived is rejected; a "
    "permissive reader exposes the arrived members as independent shards, never as a complete composite.",
    scope="composite.close", permissive=True)

_HEAD_RULES = [r for r in DESCRIPTOR_RULES if r.scope == "composite.head"]
_SHARD_BOUNDS = next(r for r in DESCRIPTOR_RULES if r.id == "metadata.shard.bounds")
_DYN = DYNAMIC_DIMENSION
_PARTITION, _OVERLAY, _GROUP = (int(rule) for rule in (CompositionRule.PARTITION, CompositionRule.OVERLAY,
                                                        CompositionRule.GROUP))  # plain ints: compared per member


def decoded_type(desc: TensorDescriptor) -> Optional[int]:
    """The element type a member decodes to (see the module docstring), None when unknown."""
    q = desc.quantization
    if q is None or isinstance(desc.layout, CompositeLayout):
        return int(desc.type_tag)
    if isinstance(q, (PerTensorAffine, Nf4, Mxfp)):
        return int(ElementType.FLOAT32)
    if isinstance(q, (PerChannelAffine, PerBlockAffine)):
        return int(q.scale_type_tag)
    return None


def _inside(offsets, shape, head) -> bool:
    """Whether the box ``[offsets, offsets + shape)`` lies inside ``head`` (a plain loop: it
    runs for every member of a partition read)."""
    for o, d, h in zip(offsets, shape, head):
        if o + d > h:
            return False
    return True


class CompositeValidator:
    """Validates one composite as its direct members arrive.

    ``push_member(desc)`` runs the per-member checks, ``close()`` the close-time checks
    (call it once ``member_count`` members have arrived; before that it is a torn
    composite, as is :meth:`torn`).  In strict mode the first MUST violation is raised as
    :class:`~hurray_schema.errors.SpecViolation`; in permissive mode what the spec lets a
    permissive reader keep is recorded (``findings``) and other violations still raise.
    ``collect=True`` raises nothing and records everything (used by :func:`hurray_schema.audit`).
    Both calls return the findings they recorded.

    ``base`` / ``push_member(..., base=)`` give the byte offset of the head / member
    descriptor in the input; without one, per-field findings carry no offset.

    ``check_head=False`` is for callers that ran the descriptor rules on every descriptor
    already (readers, audit): the head rules are not re-run, and a member box past the
    head -- a shard past its parent_shape, ``metadata.shard.bounds`` -- is not reported
    twice (the box is left out of the close-time checks all the same).
    """

    def __init__(self, head: TensorDescriptor, *, mode="strict", collect: bool = False, depth: int = 1,
                 base: Optional[int] = None, check_head: bool = True):
        if not isinstance(head.layout, CompositeLayout):
            raise ValueError("CompositeValidator needs a composite head (layout_tag 0x0B)")
        self.head = head
        self.base = base  # byte offset of the head descriptor in the input, when known
        self.mode = as_mode(mode)
        self.collect = collect
        self.depth = depth
        self.rule = int(head.layout.composition_rule)
        self.member_count = int(head.layout.member_count)
        self.members: list[TensorDescriptor] = []
        self.findings: list[Finding] = []
        self.closed = False
        self.torn_composite = False
        self._shape = tuple(head.shape)
        self._head_type = int(head.type_tag)
        self._flat_offsets: list[int] = []  # partition boxes, flattened (bounded by N * rank)
        self._flat_shapes: list[int] = []
        self._boxes = 0
        self._arrays = None
        self._descriptor_rules = check_head
        if check_head:
            out: list[Finding] = []
            ctx = DescriptorContext(head, self.mode, base or 0)
            for rule in _HEAD_RULES:
                for f in rule.check(head, ctx):
                    self._emit(f if base is not None else _no_offset(f), out)

    # -- recording -----------------------------------------------------------------
    def _emit(self, finding: Finding, out: list) -> None:
        if finding.is_error and not self.collect:
            raise finding.to_violation()
        self.findings.append(finding)
        out.append(finding)

    def _fire(self, rule, message: str, out: list, offset: Optional[int] = None) -> None:
        self._emit(rule.finding(message, offset, self.mode), out)

    @property
    def spatial(self) -> bool:
        return self.rule in (_PARTITION, _OVERLAY)

    @property
    def complete(self) -> bool:
        return len(self.members) >= self.member_count

    @property
    def report(self) -> Report:
        return Report(tuple(self.findings))

    @property
    def ok(self) -> bool:
        return self.report.ok

    # -- per member ----------------------------------------------------------------
    def push_member(self, desc: TensorDescriptor, *, base: Optional[int] = None) -> list[Finding]:
        """Run checks 1-5 of ``layouts/composite.md § Validation`` on the next member."""
        members = self.members
        if self.closed:
            raise ValueError("push_member() after close()")
        index = len(members)
        if index >= self.member_count:
            raise ValueError(f"the composite already has its {self.member_count} members")
        members.append(desc)
        out: list[Finding] = []
        rule = self.rule
        if desc.layout.__class__ is CompositeLayout and self.depth + 1 > MAX_COMPOSITE_DEPTH:
            self._emit(_too_deep(self.depth + 1, base, self.mode, f"member {index} is a composite head at "), out)
        if rule == _PARTITION or rule == _OVERLAY:
            shard = desc.shard
            if shard is not None and rule == _PARTITION and shard.parent_shape == self._shape and \
                    _inside(shard.shard_offset, desc.shape, self._shape):
                self._flat_offsets.extend(shard.shard_offset)  # the common case: an in-bounds box
                self._flat_shapes.extend(desc.shape)
                self._boxes += 1
            else:
                self._check_box(desc, index, base, out)
            decoded = decoded_type(desc)
            if decoded is not None and decoded != self._head_type:
                self._fire(MEMBER_TYPE, f"member {index} decodes to type 0x{decoded:02X}, the head's type_tag is "
                           f"0x{self._head_type:02X}", out, base)
            if rule == _OVERLAY:
                self._check_overlay(desc, index, base, out)
            elif desc.composite_member is not None:
                self._fire(MEMBER_NO_SECTION, f"member {index} of a partition carries a Composite Member section",
                           out, base)
        elif rule == _GROUP and desc.composite_member is not None:
            self._fire(MEMBER_NO_SECTION, f"member {index} of a group carries a Composite Member section", out, base)
        return out

    @staticmethod
    def _at(desc, base, part, decl, name, index: int = 0):
        return None if base is None else DescriptorContext(desc, Mode.STRICT, base).section(part, decl, name, index)

    def _check_box(self, desc, index, base, out) -> None:
        who = f"member {index}"
        shard = desc.shard
        if shard is None:
            self._fire(MEMBER_SHARD, f"{who} has no shard section", out, base)
            return
        if tuple(shard.parent_shape) != self._shape:
            self._fire(MEMBER_PARENT, f"{who} parent_shape {list(shard.parent_shape)} differs from the head's shape "
                       f"{list(self._shape)}", out, self._at(desc, base, "shard", SHARD_SECTION, "parent_shape"))
            return
        for k, (o, d, h) in enumerate(zip(shard.shard_offset, desc.shape, self._shape)):
            if d == _DYN:
                self._fire(MEMBER_BOUNDS, f"{who} box [{o}, {o}+dynamic) along dimension {k} is not inside the "
                           f"head's {h}", out, self._at(desc, base, "shard", SHARD_SECTION, "shard_offset", k))
                return
            if o + d > h:
                if self._descriptor_rules:
                    for f in _SHARD_BOUNDS.check(desc, DescriptorContext(desc, self.mode, base or 0)):
                        self._emit(f if base is not None else _no_offset(f), out)
                return
        if self.rule == _PARTITION:
            self._flat_offsets.extend(shard.shard_offset)
            self._flat_shapes.extend(desc.shape)
            self._boxes += 1

    def _check_overlay(self, desc, index, base, out) -> None:
        who = f"member {index}"
        m = desc.composite_member
        if m is None:
            # a nested head MUST NOT carry the section (composite.head.no_member_section): its role is its
            # position, base first (our reading of the conflict; see spec-map.md)
            if desc.layout.__class__ is not CompositeLayout:
                self._fire(MEMBER_OVERLAY_SECTION, f"overlay {who} has no Composite Member section", out, base)
        elif index == 0 and m.member_role != MemberRole.BASE:
            self._fire(MEMBER_BASE_FIRST, f"the first overlay member has member_role 0x{m.member_role:02X}, not "
                       "0x01 (base)", out,
                       self._at(desc, base, "composite_member", COMPOSITE_MEMBER_SECTION, "member_role"))
        elif index > 0 and m.member_role != MemberRole.CORRECTION:
            self._fire(MEMBER_CORRECTION, f"overlay {who} has member_role 0x{m.member_role:02X}, not 0x00 "
                       "(correction)", out,
                       self._at(desc, base, "composite_member", COMPOSITE_MEMBER_SECTION, "member_role"))
        if index == 0 and desc.shard is not None and (
                any(desc.shard.shard_offset) or tuple(desc.shape) != self._shape):
            self._fire(MEMBER_BASE_SPAN, f"the overlay base (shape {list(desc.shape)}, shard_offset "
                       f"{list(desc.shard.shard_offset)}) does not span the head shape {list(self._shape)}", out,
                       self._at(desc, base, "shard", SHARD_SECTION, "shard_offset"))

    # -- close ---------------------------------------------------------------------
    def close(self) -> list[Finding]:
        """Close-time checks at the Nth member; before it, the composite is torn."""
        if self.closed:
            return []
        if not self.complete:
            self.torn()
            return [self.findings[-1]]
        self.closed = True
        out: list[Finding] = []
        # close-time faults belong to the composite as a whole: located at its head descriptor
        if self.rule == _OVERLAY and self.member_count == 0:
            self._fire(CLOSE_OVERLAY_EMPTY, "an overlay head with member_count 0 has no base member", out,
                       self.base)
        if self.rule == _PARTITION and self._boxes == len(self.members):
            boxes = (self._shape, tuple(self._flat_offsets), tuple(self._flat_shapes))
            if boxes in _TILING:  # the same boxes partitioned this head shape before
                return out
            # a few boxes are shown to tile in plain Python: rows of ints, not arrays to iterate
            offsets, shapes = self._box_rows() if self._boxes <= _FEW_BOXES else self._box_arrays()
            faults = partition_check(self._shape, offsets, shapes)
            for rule, message in faults:
                self._fire(rule, message, out, self.base)
            if not faults and self._shape and len(boxes[1]) <= _TILING_KEY_VALUES:
                if len(_TILING) >= _MAX_TILINGS:
                    _TILING.clear()
                _TILING.add(boxes)
        return out

    def torn(self) -> tuple[TensorDescriptor, ...]:
        """The input ended before all members arrived: strict raises ``composite.torn``;
        permissive records it and returns the arrived members as independent shards (the
        composite is never presented as complete)."""
        if self.complete:
            return ()
        self.closed = True
        self.torn_composite = True
        self._fire(TORN, f"the input ended after {len(self.members)} of {self.member_count} members", [],
                   self.base)
        return tuple(self.members)

    # -- lookup --------------------------------------------------------------------
    def resolve(self, index: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        """Partition lookup: ``(member index, local index)`` of logical ``index`` (``index - shard_offset``)."""
        if self.rule != _PARTITION:
            raise ValueError("resolve() is defined for partition composites")
        index = tuple(int(i) for i in index)
        if len(index) != len(self._shape) or not all(0 <= i < d for i, d in zip(index, self._shape)):
            raise IndexError(f"{list(index)} is outside the head shape {list(self._shape)}")
        if self._boxes != len(self.members):
            raise ValueError("resolve() needs every member's box (a member failed its box check)")
        offsets, shapes = self._box_arrays()
        if isinstance(offsets, np.ndarray):
            idx = np.asarray(index, dtype=np.int64)
            hits = np.flatnonzero(np.all((offsets <= idx) & (idx < offsets + shapes), axis=1)) if len(index) else \
                np.arange(len(offsets))
            if hits.size:
                m = int(hits[0])
                return m, tuple(int(i - o) for i, o in zip(index, offsets[m]))
        else:
            for m, (off, shp) in enumerate(zip(offsets, shapes)):
                if all(o <= i < o + d for i, o, d in zip(index, off, shp)):
                    return m, tuple(i - o for i, o in zip(index, off))
        raise IndexError(f"no member covers {list(index)}")

    def _box_rows(self) -> tuple[list, list]:
        """The partition boxes as two lists of ``rank``-long rows."""
        rank = len(self._shape)
        bounds = range(0, self._boxes * rank, rank) if rank else [0] * self._boxes
        return ([self._flat_offsets[i:i + rank] for i in bounds], [self._flat_shapes[i:i + rank] for i in bounds])

    def _box_arrays(self):
        """The partition boxes as two ``(N, rank)`` arrays (object rows past int64 range)."""
        if self._arrays is None:
            rank = len(self._shape)
            if max(self._shape, default=0) >= _INT_LIMIT:
                off = [tuple(self._flat_offsets[i * rank:(i + 1) * rank]) for i in range(self._boxes)]
                shp = [tuple(self._flat_shapes[i * rank:(i + 1) * rank]) for i in range(self._boxes)]
                self._arrays = (off, shp)
            else:
                self._arrays = (np.array(self._flat_offsets, dtype=np.int64).reshape(self._boxes, rank),
                                np.array(self._flat_shapes, dtype=np.int64).reshape(self._boxes, rank))
        return self._arrays


_TILING: set = set()
"""``(head shape, flat offsets, flat shapes)`` of partitions :func:`partition_check` found
clean (a stream of composites repeats its sharding); bounded, emptied when full.  A key
names the member count only through the number of flat values (N * rank): a scalar head's
boxes have none, so rank-0 partitions are never remembered -- one rank-0 member tiles the
head, two overlap on its one index (``layouts/composite.md § Composition Semantics ›
Partition``), and :func:`partition_check` tells them apart in constant time."""
_MAX_TILINGS = 256
_TILING_KEY_VALUES = 64
"""Only partitions of at most this many offset values are remembered (a key stays small)."""


def _no_offset(f: Finding) -> Finding:
    return Finding(f.rule_id, f.level, f.citation, f.message, None, f.tolerated)


def _too_deep(depth: int, offset: Optional[int], mode: Mode, what: str = "a composite head at ") -> Finding:
    return NESTING_DEPTH.finding(
        f"{what}nesting level {depth}; at most {MAX_COMPOSITE_DEPTH} levels are allowed", offset, mode)


# ------------------------------------------------------------------------------------
# The binder
# ------------------------------------------------------------------------------------


class _Frame:
    """A composite being bound: its head, where it is, what arrived, its validator -- or, for a
    binding seen clean before, the member descriptors it expects (``expected``)."""

    __slots__ = ("head", "offset", "payload", "members", "validator", "clean", "key", "expected")

    def __init__(self, head: TensorDescriptor, offset: Optional[int], payload, validator, key=None):
        self.head = head
        self.offset = offset
        self.payload = payload
        self.members: list = []
        self.validator = validator
        self.key = key  # the binder's key of this binding (None: never remembered)
        self.expected: Optional[tuple] = None
        # clean: what strict validation would pass.  A strict binder's heads passed the strict
        # descriptor rules (its own head checks, or the caller's); a permissive one may hold a
        # head whose finding the mode tolerated (a private composition rule), so it asks.
        self.clean = validator is not None and not validator.findings and (
            validator.mode is Mode.STRICT or first_error(head, Mode.STRICT) is None)


_CLEAN_BINDINGS: dict = {}
"""``(id(head), mode, depth, check_heads)`` -> ``(head, member descriptors)`` of a composite a
raising binder validated without a single finding (its members all tensors, not composites).
Descriptors are immutable values and every check is a function of the head, the members, their
order, the mode and the depth, so the same objects bind cleanly again: a stream of repeated
composites (the decoder gives one object per distinct descriptor bytes) is validated once.
:data:`MAX_CLEAN_BINDINGS` entries, emptied when full; the entry keeps its objects alive."""

MAX_CLEAN_BINDINGS = 1024


def _payload_itself(desc, payload):
    return payload


def _head_payload(head, payload, members, clean):
    return payload


def _remember_clean(key: tuple, head: TensorDescriptor, members: list) -> None:
    """Keep a clean binding of tensors (not of nested composites) in :data:`_CLEAN_BINDINGS`."""
    if any(m.layout.__class__ is CompositeLayout for m in members):
        return
    if len(_CLEAN_BINDINGS) >= MAX_CLEAN_BINDINGS:
        _CLEAN_BINDINGS.clear()
    _CLEAN_BINDINGS[key] = (head, tuple(members))


class CompositeBinder:
    """The composite binder: descriptors in, bound composites out, one verdict per composite.

    Feed every tensor of a container, in pre-order (stream order, or descriptor-offset
    order in a file; ``layouts/composite.md § Binding``), to :meth:`add`, then call
    :meth:`finish` at the end of the input.  A head opens a composite that binds the next
    ``member_count`` tensors (nested heads included); each member gets the per-member
    checks as it arrives and the composite its close-time checks at the Nth member
    (``§ Validation``).  State is bounded by the composites still open.

    Fault policy: ``collect=False`` raises the first finding the mode does not tolerate as
    :class:`~hurray_schema.errors.SpecViolation` (readers) and records the tolerated ones;
    ``collect=True`` raises nothing and records every finding (audit).  ``findings``
    (a list the caller may pass in) receives them in the order they were found.

    ``validate=False`` binds without the per-member and close-time checks (the depth limit
    and torn composites are still enforced); ``check_heads`` is for descriptors the
    descriptor rules have not seen (in-memory ones): it runs the composite-head rules and
    the shard-bounds rule on a member box past the head (callers that ran the descriptor
    rules on every descriptor -- readers, audit -- leave it off, so no fault is reported twice);
    ``limits`` applies :class:`~hurray_schema.limits.Limits` ``max_composite_depth`` and
    ``max_composite_members`` (None: only the spec's depth limit).

    What comes out: :meth:`add` and :meth:`finish` return the top-level nodes completed;
    a tensor's node is ``leaf(desc, payload)`` and a composite's
    ``assemble(head, head_payload, member_nodes, clean)`` -- ``clean`` is True when the
    composite and every composite nested in it passed every check without a finding.
    By default both return the payload given to :meth:`add`.
    """

    def __init__(self, *, mode="strict", collect: bool = False, validate: bool = True, check_heads: bool = False,
                 limits: Optional[Limits] = None, findings: Optional[list] = None,
                 leaf: Callable[[TensorDescriptor, Any], Any] = _payload_itself,
                 assemble: Callable[[TensorDescriptor, Any, list, bool], Any] = _head_payload):
        self.mode = as_mode(mode)
        self.collect = collect
        self.validate = validate
        self.check_heads = check_heads
        self.limits = limits
        self.findings: list[Finding] = [] if findings is None else findings
        self._leaf = leaf
        self._assemble = assemble
        self._stack: list[_Frame] = []

    @property
    def depth(self) -> int:
        """How many composites are open (the nesting level of the next member)."""
        return len(self._stack)

    def _emit(self, finding: Finding) -> None:
        if finding.is_error and not self.collect:
            raise finding.to_violation()
        self.findings.append(finding)

    def _record(self, found: list, frame: Optional[_Frame] = None) -> None:
        """Findings a validator recorded (it raised already for an untolerated one, unless collecting)."""
        if found:
            self.findings.extend(found)
            if frame is not None:
                frame.clean = False

    def add(self, desc: TensorDescriptor, offset: Optional[int] = None, payload=None) -> list:
        """The next tensor of the input (``offset``: its descriptor's first byte in the
        container); returns the top-level nodes it completed."""
        stack = self._stack
        if not stack and desc.layout.__class__ is not CompositeLayout:  # a plain top-level tensor: bound as it is
            return [self._leaf(desc, payload)]
        parent = stack[-1] if stack else None
        if parent is not None:
            expected = parent.expected
            if expected is not None and not (len(parent.members) < len(expected)
                                             and expected[len(parent.members)] is desc):
                self._validate_from_here(parent, len(stack))
            if parent.validator is not None:
                found = parent.validator.push_member(desc, base=offset)
                if found:
                    self._record(found, parent)
        if desc.layout.__class__ is not CompositeLayout:
            node = self._leaf(desc, payload)
            if parent is None:
                return [node]
            members = parent.members
            members.append(node)
            # only a composite given its last member closes (and may close those around it)
            return self._settle() if len(members) >= parent.head.layout.member_count else []
        depth = len(stack) + 1
        if depth > MAX_COMPOSITE_DEPTH:  # depth > 1: there is a parent
            parent.clean = False
            if parent.validator is None:  # a validating parent has fired it in push_member
                self._emit(_too_deep(depth, offset, self.mode))
        limits = self.limits
        if limits is not None:  # compared here first: the check's call only when a limit is passed
            if depth <= MAX_COMPOSITE_DEPTH and depth > limits.max_composite_depth:
                limits.check("max_composite_depth", depth, offset)
            if desc.layout.member_count > limits.max_composite_members:
                limits.check("max_composite_members", desc.layout.member_count, offset)
        validator, key = None, None
        if self.validate:
            if not self.collect:
                key = (id(desc), self.mode, depth, self.check_heads)
                known = _CLEAN_BINDINGS.get(key)
                if known is not None and known[0] is desc:  # bound cleanly before: expect the same members
                    frame = _Frame(desc, offset, payload, None, key)
                    frame.expected, frame.clean = known[1], True
                    stack.append(frame)
                    return self._settle() if desc.layout.member_count <= 0 else []
            validator = CompositeValidator(desc, mode=self.mode, collect=self.collect, depth=depth, base=offset,
                                           check_head=self.check_heads)
            if validator.findings:
                self._record(validator.findings)
        stack.append(_Frame(desc, offset, payload, validator, key))
        return self._settle() if desc.layout.member_count <= 0 else []  # a head of no member closes at once

    def _validate_from_here(self, frame: _Frame, depth: int) -> None:
        """A remembered binding met a member it did not expect: the frame gets its validator, the
        members that arrived so far (the expected ones, which passed before) pushed again."""
        validator = CompositeValidator(frame.head, mode=self.mode, collect=self.collect, depth=depth,
                                       base=frame.offset, check_head=self.check_heads)
        for member in frame.expected[:len(frame.members)]:
            validator.push_member(member)
        frame.validator, frame.expected = validator, None

    def _settle(self) -> list:
        """Close every composite that has all its members; the top-level ones come back."""
        stack = self._stack
        done = []
        while stack and len(stack[-1].members) >= stack[-1].head.layout.member_count:
            frame = stack.pop()
            validator = frame.validator
            if validator is not None:
                self._record(validator.close(), frame)
                if frame.key is not None and frame.clean and not validator.findings:
                    _remember_clean(frame.key, frame.head, validator.members)
            node = self._assemble(frame.head, frame.payload, frame.members, frame.clean)
            if stack:
                stack[-1].members.append(node)
                stack[-1].clean = stack[-1].clean and frame.clean
            else:
                done.append(node)
        return done

    def finish(self) -> list:
        """End of input.  Nothing open: []; else the composite is torn (``composite.torn``,
        at the outermost open head): raised, or -- when tolerated or collected -- recorded,
        and the members that arrived come back as independent nodes (never the composite)."""
        stack = self._stack
        if not stack:
            return []
        outer = stack[0]
        nested = len(stack) - 1
        self._emit(TORN.finding(
            f"the input ended after {len(outer.members)} of {outer.head.layout.member_count} members"
            + (f" ({nested} nested composite(s) also open)" if nested else ""), outer.offset, self.mode))
        loose = [node for frame in stack for node in frame.members]
        stack.clear()
        return loose


# ------------------------------------------------------------------------------------
# Pre-order driving
# ------------------------------------------------------------------------------------


def validate_preorder(descs: Iterable[TensorDescriptor], *, mode="strict", collect: bool = False,
                      bases: Optional[Iterable[Optional[int]]] = None, check_heads: bool = True) -> list[Finding]:
    """Validate a pre-order sequence of descriptors with :class:`CompositeBinder`:
    composites bind the next ``member_count`` tensors (nested heads included) and are
    closed at their Nth member; a composite still open at the end is torn.  ``bases`` are
    the descriptors' byte offsets (None: findings carry no offset).  Returns the findings
    (raises the first untolerated one unless ``collect``)."""
    binder = CompositeBinder(mode=mode, collect=collect, check_heads=check_heads)
    offsets = iter(bases) if bases is not None else itertools.repeat(None)
    for desc in descs:
        binder.add(desc, next(offsets))
    binder.finish()
    return binder.findings


# ------------------------------------------------------------------------------------
# The partition check
# ------------------------------------------------------------------------------------

_MAX_CORNER_RANK = 16
_MAX_CORNERS = 1 << 26
_INT_LIMIT = 1 << 62
_GRID_CELLS = 1 << 22
"""Largest compressed grid (cells between distinct box boundaries) a faulty partition is
diagnosed on; beyond it the diagnosis falls back to a sweep and a bounded search."""
_SEARCH_NODES = 1 << 14
"""Regions the fallback gap search may split before it gives up locating a gap."""
_PAIR_BLOCK = 1 << 22
"""Box pairs compared at once by the empty-box overlap test (bounds its memory)."""


def partition_check(head_shape: Sequence[int], offsets, shapes) -> list[tuple]:
    """``[(rule, message)]`` for the gap / overlap faults of in-bounds boxes; [] when they partition the head.

    Boxes are ``[offsets[i][k], offsets[i][k] + shapes[i][k])`` (sequences of rows, or
    ``(N, rank)`` integer arrays); every box must already be inside the head (per-member
    check 1).  A gap is reported with one uncovered index and the number of head indices
    the members cover; an overlap with one shared index and the members containing it.
    Each is reported only when it exists.  Overlap is the formula of
    ``layouts/composite.md § Composition Semantics › Partition`` taken literally, so an
    empty box whose offset lies strictly inside another box along its zero extents overlaps
    that box although it holds no index (see ``spec-map.md`` § Interpretations).
    """
    head = tuple(int(h) for h in head_shape)
    rank = len(head)
    head_volume = math.prod(head)
    if head_volume == 0:
        # in-bounds boxes are empty along the head's empty dimension, where the overlap
        # formula cannot hold for any pair; there is no index to cover
        return []
    if rank == 0:  # a scalar head: every member box is the single index, every pair overlaps
        count = len(offsets)
        if count == 1:
            return []
        if count == 0:
            return [(CLOSE_GAP, "no member covers the scalar head (members cover 0 of 1 indices)")]
        return [(CLOSE_OVERLAP, f"members [0, 1] overlap: each contains the scalar head ({count} members)")]
    if len(offsets) <= _FEW_BOXES and _few_boxes_tile(head, head_volume, offsets, shapes):
        return []
    huge = max(head) >= _INT_LIMIT
    dtype = object if huge else np.int64
    off = np.array([[int(v) for v in row] for row in offsets] if huge else offsets, dtype=dtype).reshape(-1, rank)
    shp = np.array([[int(v) for v in row] for row in shapes] if huge else shapes, dtype=dtype).reshape(-1, rank)
    nonempty = np.all(shp > 0, axis=1)
    keep = np.flatnonzero(nonempty)
    gap, overlap = _cover_faults(head, head_volume, off[keep], shp[keep], keep, huge)
    if overlap is None:
        overlap = _empty_box_overlap(head, off, shp, np.flatnonzero(~nonempty))
    out = []
    if overlap is not None:
        out.append((CLOSE_OVERLAP, overlap))
    if gap is not None:
        out.append((CLOSE_GAP, gap))
    return out


_FEW_BOXES = 8
"""Up to this many boxes a clean partition is recognised pairwise in plain Python, faster
than setting up the corner sort (a faulty one still goes through it, which names the fault)."""


def _few_boxes_tile(head, head_volume: int, offsets, shapes) -> bool:
    """True when no two boxes meet the spec's overlap formula and the volumes add up to the
    head's: then they cover every index exactly once (disjoint boxes inside the head whose
    total volume is the head's leave no gap).  False means "not shown here", not a fault."""
    spans = []  # per box: (start, end) per dimension
    volume = 0
    for o, d in zip(offsets, shapes):
        spans.append([(int(a), int(a) + int(c)) for a, c in zip(o, d)])
        volume += math.prod(int(c) for c in d)
    if volume != head_volume:
        return False
    for i, box in enumerate(spans):
        for other in spans[i + 1:]:
            for (a0, a1), (b0, b1) in zip(box, other):
                if a1 <= b0 or b1 <= a0:
                    break  # the overlap formula fails along this dimension
            else:
                return False  # the formula holds in every dimension (an empty box may be the one)
    return True


def _cover_faults(head, head_volume: int, off, shp, keep, huge: bool):
    """``(gap message or None, overlap message or None)`` for the non-empty boxes ``off``/``shp``
    (rows of ``keep``): exact cover decided by the corner identity (module docstring), or by
    the sweep where it does not apply; a fault is then located by :func:`_diagnose`."""
    rank = len(head)
    n = len(off)
    if n == 0:
        return _gap_message([0] * rank, 0, head_volume), None
    full = np.all((off == 0) & (shp == np.asarray(head, dtype=off.dtype)), axis=0)
    dims = [k for k in range(rank) if not full[k]]
    if not dims:  # every box is the whole head
        if n == 1:
            return None, None
        return None, _overlap_message([0] * rank, [int(keep[0]), int(keep[1])])
    r = len(dims)
    total = math.prod(head[k] + 1 for k in dims)
    pair = ()  # not searched yet
    if huge or r > _MAX_CORNER_RANK or n << r > _MAX_CORNERS or total >= _INT_LIMIT:
        pair = _sweep_overlap(off, shp)
        if pair is None and _volume_sum(shp) == head_volume:
            return None, None  # disjoint boxes inside the head, as large as the head
    elif _corner_residual_is_zero(head, dims, off[:, dims], shp[:, dims]):
        return None, None
    return _diagnose(head, head_volume, dims, off, shp, keep, pair)


def _corner_residual_is_zero(head, dims, o, s) -> bool:
    """True iff the boxes (restricted to the effective dimensions ``dims``) cover every index
    of the head exactly once: their signed corner measures add up to the head's."""
    n, r = o.shape
    hd = np.asarray([head[k] for k in dims], dtype=np.int64)
    strides = np.ones(r, dtype=np.int64)
    for j in range(r - 2, -1, -1):
        strides[j] = strides[j + 1] * (hd[j + 1] + 1)
    base2 = (o @ strides) << 1
    ext2 = (s * strides) << 1
    # each corner as one sortable int64: (point key << 1) | (sign is +1); sorting brings the
    # +1 and -1 weights of one point together, and the weight of a point is (#plus - #minus)
    keys = np.empty((n << r) + (1 << r), dtype=np.int64)
    for corner in range(1 << r):
        pick = np.asarray([(corner >> j) & 1 for j in range(r)], dtype=np.int64)
        plus = 0 if bin(corner).count("1") & 1 else 1
        np.add(base2, ext2 @ pick + plus, out=keys[corner * n:(corner + 1) * n])
        keys[(n << r) + corner] = (int((hd * pick) @ strides) << 1) | (1 - plus)  # the head, negated
    keys.sort()
    points = keys >> 1
    weight = (keys & 1) * 2 - 1
    starts = np.flatnonzero(np.concatenate(([True], points[1:] != points[:-1])))
    return not np.any(np.add.reduceat(weight, starts))


def _diagnose(head, head_volume: int, dims, off, shp, keep, pair=()):
    """Locate the faults of non-empty boxes known not to partition the head: exactly on the
    compressed grid of their boundaries when it is small enough, else by a sweep for an
    overlapping pair (``pair`` when already swept) and a search for an uncovered index."""
    rank = len(head)
    grid = _grid_diagnose([head[k] for k in dims], off[:, dims], off[:, dims] + shp[:, dims])
    spanned = math.prod(head[k] for k in range(rank) if k not in dims)  # fully spanned dimensions

    def full_index(q):
        idx = [0] * rank
        for j, k in enumerate(dims):
            idx[k] = int(q[j])
        return idx

    if grid is not None:
        covered, gap_at, overlap_at = grid
        gap = None if gap_at is None else _gap_message(full_index(gap_at), covered * spanned, head_volume)
        overlap = None
        if overlap_at is not None:
            q = full_index(overlap_at)
            inside = np.flatnonzero(np.all((off <= q) & (np.asarray(q, dtype=off.dtype) < off + shp), axis=1))
            overlap = _overlap_message(q, [int(keep[i]) for i in inside[:4]])
        return gap, overlap
    if pair == ():
        pair = _sweep_overlap(off, shp)
    overlap = None
    if pair is not None:
        i, j = pair
        overlap = _overlap_message([int(max(a, b)) for a, b in zip(off[i], off[j])], [int(keep[i]), int(keep[j])])
    volume = _volume_sum(shp)
    lo = [0] * len(dims)
    hi = [head[k] for k in dims]
    o, e = off[:, dims], off[:, dims] + shp[:, dims]
    gap_at = _find_uncovered(lo, hi, o, e, disjoint=pair is None)
    if pair is None:  # disjoint boxes cover exactly their volume
        return (None if volume == head_volume else
                _gap_message(full_index(gap_at) if gap_at is not None else None, volume, head_volume)), overlap
    if gap_at is not None:
        return (f"no member covers index {full_index(gap_at)} (the member boxes overlap; their volumes add up "
                f"to {volume} of {head_volume} indices, the covered volume was not computed)"), overlap
    if volume <= head_volume:  # overlapping boxes cover less than their volume sum
        return f"member boxes leave a gap (they overlap; their volumes add up to {volume} of {head_volume})", overlap
    return None, overlap  # not decided within the search budget (the overlap already rejects the composite)


def _gap_message(index, covered: int, head_volume: int) -> str:
    where = f"no member covers index {index}" if index is not None else "member boxes leave a gap"
    return f"{where} (members cover {covered} of {head_volume} indices)"


def _overlap_message(index, members) -> str:
    return f"members {members} overlap: each contains index {index}"


def _grid_diagnose(hd, o, e):
    """Exact faults of boxes ``[o, e)`` inside ``[0, hd)`` on their compressed grid:
    ``(covered volume, an uncovered index or None, a doubly covered index or None)``, or
    None when the grid has more than ``_GRID_CELLS`` cells."""
    r = len(hd)
    bounds = []
    cells = 1
    for j in range(r):
        b = np.unique(np.concatenate((np.asarray([0, hd[j]], dtype=o.dtype), o[:, j], e[:, j])))
        bounds.append(b)
        cells *= len(b)
        if cells > _GRID_CELLS:
            return None
    lows = [np.searchsorted(bounds[j], o[:, j]) for j in range(r)]
    highs = [np.searchsorted(bounds[j], e[:, j]) for j in range(r)]
    count = np.zeros([len(b) for b in bounds], dtype=np.int64)
    for corner in range(1 << r):
        at = tuple(highs[j] if (corner >> j) & 1 else lows[j] for j in range(r))
        np.add.at(count, at, -1 if bin(corner).count("1") & 1 else 1)
    for j in range(r):
        np.cumsum(count, axis=j, out=count)
    count = count[(slice(0, -1),) * r]  # one entry per cell [bounds[j][c], bounds[j][c + 1])
    covered = count > 0
    volume = covered.astype(object if math.prod(hd) >= _INT_LIMIT else np.int64)
    for b in reversed(bounds):
        volume = np.dot(volume, np.diff(b).astype(volume.dtype))  # contract the last dimension with its widths

    def corner_of(flat):
        """The index at the lower corner of cell number ``flat`` (C order)."""
        cell = np.unravel_index(int(flat), count.shape)
        return [bounds[j][c] for j, c in enumerate(cell)]

    holes = np.flatnonzero(~covered)
    doubles = np.flatnonzero(count > 1)
    return (int(volume), corner_of(holes[0]) if holes.size else None,
            corner_of(doubles[0]) if doubles.size else None)


def _sweep_overlap(off, shp) -> Optional[tuple[int, int]]:
    """Exact overlap search: sort by the start along dimension 0 and compare each box only
    with boxes still open there; the first overlapping pair of rows, or None."""
    r = off.shape[1]
    off, shp = off.tolist(), shp.tolist()  # plain ints: this loop indexes single elements
    order = sorted(range(len(off)), key=lambda i: off[i][0])
    active: list[int] = []
    for i in order:
        start = off[i][0]
        active = [j for j in active if off[j][0] + shp[j][0] > start]
        for j in active:
            if all(off[i][k] < off[j][k] + shp[j][k] and off[j][k] < off[i][k] + shp[i][k] for k in range(r)):
                return j, i
        active.append(i)
    return None


def _find_uncovered(lo, hi, o, e, *, disjoint: bool):
    """One index of ``[lo, hi)`` outside every box ``[o, e)``, found by splitting regions at box
    boundaries; a region is settled when a box contains it or, for disjoint boxes, when their
    volumes inside it fill it (then a region left unsettled always holds a gap, so the search
    goes straight down to one).  None when there is none -- or, for overlapping boxes, when
    ``_SEARCH_NODES`` regions did not find one."""
    stack = [(np.asarray(lo, dtype=o.dtype), np.asarray(hi, dtype=o.dtype), np.arange(len(o)))]
    nodes = 0
    while stack and (disjoint or nodes < _SEARCH_NODES):
        nodes += 1
        lo, hi, rows = stack.pop()
        rows = rows[np.all((o[rows] < hi) & (e[rows] > lo), axis=1)]
        if rows.size == 0:
            return [int(v) for v in lo]
        ro, re_ = np.maximum(o[rows], lo), np.minimum(e[rows], hi)
        if np.any(np.all((ro == lo) & (re_ == hi), axis=1)):
            continue
        if disjoint and _volume_sum(re_ - ro) == math.prod(int(v) for v in hi - lo):
            continue
        k, at = _split_point(lo, hi, ro, re_)
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[k], right_lo[k] = at, at
        stack.append((right_lo, hi, rows))
        stack.append((lo, left_hi, rows))
    return None


def _volume_sum(extents) -> int:
    """Exact sum of the row products of an ``(N, r)`` array of non-negative extents."""
    if extents.dtype != object and len(extents) and int(extents.max()) ** extents.shape[1] * len(extents) < _INT_LIMIT:
        return int(np.prod(extents, axis=1).sum())  # no int64 overflow possible
    return sum(math.prod(int(v) for v in row) for row in extents)


def _split_point(lo, hi, ro, re_):
    """``(dimension, coordinate)``: a box boundary strictly inside ``(lo[k], hi[k])`` -- the median
    one along the dimension that has most of them (a region no box contains has one)."""
    best = None
    for k in range(len(lo)):
        inside = np.concatenate((ro[:, k], re_[:, k]))
        inside = inside[(inside > lo[k]) & (inside < hi[k])]
        if inside.size and (best is None or inside.size > best[0]):
            best = (inside.size, k, np.sort(inside)[inside.size // 2])
    return best[1], best[2]


def _empty_box_overlap(head, off, shp, empty_rows) -> Optional[str]:
    """The first pair (an empty box, any other box) that meets the spec's overlap formula
    (``layouts/composite.md § Composition Semantics › Partition``), as a message.

    Along a zero extent the formula asks the other box to start before the empty box's offset
    and end after it, so only an empty box whose offset lies strictly inside the head along
    each of its zero extents can meet it.  Such boxes are taken in blocks sorted along one
    dimension; each block is compared only with the boxes whose span there reaches the block's."""
    if not len(empty_rows):
        return None
    head_arr = np.asarray(head, dtype=off.dtype)
    zero = shp[empty_rows] == 0
    inner = np.all(~zero | ((off[empty_rows] > 0) & (off[empty_rows] < head_arr)), axis=1)
    candidates = empty_rows[inner]
    if not candidates.size:
        return None
    end = off + shp
    dim = max(range(len(head)), key=lambda k: len(np.unique(off[:, k])))
    candidates = candidates[np.argsort(off[candidates, dim], kind="stable")]
    by_start = np.argsort(off[:, dim], kind="stable")
    starts = off[by_start, dim]
    block = 64
    for first in range(0, candidates.size, block):
        rows = candidates[first:first + block]
        low, high = off[rows, dim].min(), end[rows, dim].max()
        partners = by_start[:np.searchsorted(starts, high, side="right")]
        partners = partners[end[partners, dim] >= low]
        for chunk in range(0, partners.size, _PAIR_BLOCK // (block * len(head))):
            other = partners[chunk:chunk + _PAIR_BLOCK // (block * len(head))]
            meets = np.all((off[other][None, :, :] < end[rows][:, None, :]) &
                           (off[rows][:, None, :] < end[other][None, :, :]), axis=2)
            meets &= rows[:, None] != other[None, :]
            hits = np.argwhere(meets)
            if hits.size:
                a, b = int(rows[hits[0][0]]), int(other[hits[0][1]])
                return (f"members {sorted([a, b])} overlap by the non-overlap formula: member {a}'s box "
                        f"(shard_offset {[int(v) for v in off[a]]}, shape {[int(v) for v in shp[a]]}) is empty "
                        f"but lies strictly inside member {b}'s box along its zero extents")
    return None
