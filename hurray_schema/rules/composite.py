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

The partition exact-cover / non-overlap check (``§ Composition Semantics › Partition``) is
the geometry of the member boxes, in :mod:`.composite_geometry` (loaded by the first partition
closed): exact for any rank and any box shapes, in ``O(N * 2**r * log N)`` for ``N`` boxes of
effective rank ``r``.  :func:`partition_check` gives its faults as this module's rules.

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
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ..limits import MAX_COMPOSITE_DEPTH, Limits
from ..memo import MEMO
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
    "Every partition and overlay member carries a shard section.", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_box")
MEMBER_PARENT = declare(
    "composite.member.parent_shape", MUST, V,
    "A partition or overlay member's parent_shape equals the head's shape (check 1).", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_box")
MEMBER_BOUNDS = declare(
    "composite.member.box_bounds", MUST, V,
    "A partition or overlay member's box lies inside the head (check 1): its extent is definite (no dynamic "
    "dimension).  A definite box past the head is the member's shard past its parent_shape, which equals the "
    "head's shape: metadata.shard.bounds, the one rule for that fault.", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_box")
MEMBER_TYPE = declare(
    "composite.member.decoded_type", MUST, V,
    "A partition or overlay member's decoded value type (after dequantization) equals the head's type_tag "
    "(check 2).", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator.push_member")
MEMBER_OVERLAY_SECTION = declare(
    "composite.member.overlay_section", MUST, "layouts/composite.md § Composite Member Section",
    "Every overlay member carries a Composite Member section (check 4); a nested composite head, which must "
    "not carry one, takes its role from its position.", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_overlay")
MEMBER_BASE_FIRST = declare(
    "composite.member.overlay_base_first", MUST, V,
    "The first overlay member has member_role 0x01 (base) (check 4).", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_overlay")
MEMBER_BASE_SPAN = declare(
    "composite.member.overlay_base_span", MUST, V,
    "The overlay base spans the index space: all-zero shard_offset and shape equal to the head's (check 4).",
    scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_overlay")
MEMBER_CORRECTION = declare(
    "composite.member.overlay_correction_role", MUST, V,
    "Every overlay member after the first has member_role 0x00 (correction) (check 4).", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator._check_overlay")
MEMBER_NO_SECTION = declare(
    "composite.member.no_member_section", MUST_NOT, V,
    "A partition or group member does not set HAS_COMPOSITE_MEMBER (check 5).", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:CompositeValidator.push_member")
NESTING_DEPTH = declare(
    "composite.nesting.depth", MUST, "layouts/composite.md § Binding",
    f"Composites nest at most {MAX_COMPOSITE_DEPTH} levels deep (a head counts as one level), in streams and "
    "files alike.", scope="composite.member",
    enforced_by="hurray_schema.rules.composite:_too_deep")
CLOSE_GAP = declare(
    "composite.close.partition_gap", MUST, PM,
    "At close, the partition members' boxes cover every index of the head (exact cover); a permissive "
    "reader may keep a violating composite.", scope="composite.close", permissive=True,
    enforced_by="hurray_schema.rules.composite:partition_check")
CLOSE_OVERLAP = declare(
    "composite.close.partition_overlap", MUST_NOT, PM,
    "At close, no two partition members' boxes share an index; a permissive reader may keep a violating "
    "composite.", scope="composite.close", permissive=True,
    enforced_by="hurray_schema.rules.composite:partition_check")
CLOSE_OVERLAY_EMPTY = declare(
    "composite.close.overlay_empty", MUST, V,
    "An overlay head with member_count 0 is rejected: it has no base member.", scope="composite.close",
    enforced_by="hurray_schema.rules.composite:CompositeValidator.close")
TORN = declare(
    "composite.torn", MUST, "layouts/composite.md § Validation › Torn composite",
    "A composite whose input (stream or file) ends before all member_count members arrived is rejected; a "
    "permissive reader exposes the arrived members as independent shards, never as a complete composite.",
    scope="composite.close", permissive=True,
    enforced_by=(
        "hurray_schema.rules.composite:CompositeValidator.torn",
        "hurray_schema.rules.composite:CompositeBinder.finish",
    ))

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
            if boxes in _TILINGS:  # the same boxes partitioned this head shape before
                return out
            faults = partition_check(self._shape, *self._boxes_to_check())
            for rule, message in faults:
                self._fire(rule, message, out, self.base)
            if not faults and self._shape and len(boxes[1]) <= _TILING_KEY_VALUES:
                if len(_TILINGS) >= _MAX_TILINGS:
                    _TILINGS.clear()
                _TILINGS.add(boxes)
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

    def _boxes_to_check(self) -> tuple:
        """The partition boxes as :func:`partition_check` takes them fastest: a few as rows of ints, more
        as arrays."""
        return self._box_rows() if _partition_geometry().takes_rows(self._boxes) else self._box_arrays()

    def _box_rows(self) -> tuple[list, list]:
        """The partition boxes as two lists of ``rank``-long rows."""
        rank = len(self._shape)
        bounds = range(0, self._boxes * rank, rank) if rank else [0] * self._boxes
        return ([self._flat_offsets[i:i + rank] for i in bounds], [self._flat_shapes[i:i + rank] for i in bounds])

    def _box_arrays(self):
        """The partition boxes as two ``(N, rank)`` arrays (object rows past int64 range)."""
        if self._arrays is None:
            rank = len(self._shape)
            if max(self._shape, default=0) >= _partition_geometry().INT_LIMIT:
                off = [tuple(self._flat_offsets[i * rank:(i + 1) * rank]) for i in range(self._boxes)]
                shp = [tuple(self._flat_shapes[i * rank:(i + 1) * rank]) for i in range(self._boxes)]
                self._arrays = (off, shp)
            else:
                self._arrays = (np.array(self._flat_offsets, dtype=np.int64).reshape(self._boxes, rank),
                                np.array(self._flat_shapes, dtype=np.int64).reshape(self._boxes, rank))
        return self._arrays


_TILINGS = MEMO.tilings
"""``(head shape, flat offsets, flat shapes)`` of partitions :func:`partition_check` found
clean (a stream of composites repeats its sharding); bounded, emptied when full.  A key
names the member count only through the number of flat values (N * rank): a scalar head's
boxes have none, so rank-0 partitions are never remembered -- one rank-0 member tiles the
head, two overlap on its one index (``layouts/composite.md § Composition Semantics ›
Partition``), and :func:`partition_check` tells them apart in constant time."""
_MAX_TILINGS = MEMO.limit("tilings")
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


_BINDINGS = MEMO.bindings
"""Head object -> ``{(mode, depth, check_heads, validator class): member descriptors}`` of a
composite a raising binder validated without a single finding (its members all tensors, not
composites); the class is part of the key, so a binding is clean only for the checks that ran.
Descriptors are immutable values and every check is a function of the head, the members, their
order, the mode and the depth, so the same objects bind cleanly again: a stream of repeated
composites (the decoder gives one object per distinct descriptor bytes) is validated once.
:data:`MAX_CLEAN_BINDINGS` entries, emptied when full; the entry keeps its objects alive."""

MAX_CLEAN_BINDINGS = MEMO.limit("bindings")
_binding_of = dict.get.__get__(_BINDINGS)  # the table is emptied in place, never replaced


def _payload_itself(desc, payload):
    return payload


def _head_payload(head, payload, members, clean):
    return payload


def _remember_clean(checks: tuple, head: TensorDescriptor, members: list) -> None:
    """Keep a clean binding of tensors (not of nested composites) in :data:`_BINDINGS`."""
    if any(m.layout.__class__ is CompositeLayout for m in members):
        return
    known = _BINDINGS.lookup(head)
    if known is None:
        known = {}
        _BINDINGS.remember(head, known)
    known[checks] = tuple(members)


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
                key = (self.mode, depth, self.check_heads, CompositeValidator)  # the checks that ran
                entry = _binding_of(id(desc))  # IdentityTable.lookup, inline: every head comes here
                known = entry[1].get(key) if entry is not None and entry[0] is desc else None
                if known is not None:  # bound cleanly before: expect the same members
                    frame = _Frame(desc, offset, payload, None, key)
                    frame.expected, frame.clean = known, True
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


def partition_check(head_shape: Sequence[int], offsets, shapes) -> list[tuple]:
    """``[(rule, message)]`` for the gap / overlap faults of in-bounds boxes; [] when they partition the head.

    Boxes are ``[offsets[i][k], offsets[i][k] + shapes[i][k])`` (sequences of rows, or
    ``(N, rank)`` integer arrays); every box must already be inside the head (per-member
    check 1).  A gap (``composite.close.partition_gap``) is reported with one uncovered index
    and the number of head indices the members cover; an overlap
    (``composite.close.partition_overlap``) with one shared index and the members containing
    it, before the gap.  Each is reported only when it exists.  Overlap is the formula of
    ``layouts/composite.md § Composition Semantics › Partition`` taken literally, so an
    empty box whose offset lies strictly inside another box along its zero extents overlaps
    that box although it holds no index (see ``spec-map.md`` § Interpretations).  The geometry:
    :func:`.composite_geometry.partition_faults`.
    """
    geometry = _partition_geometry()
    faults = geometry.partition_faults(head_shape, offsets, shapes)
    if not faults:
        return []
    return [(CLOSE_GAP if kind == geometry.GAP else CLOSE_OVERLAP, message) for kind, message in faults]


def _partition_geometry():
    """:mod:`.composite_geometry`, imported by the first partition checked, not with this module (a
    reader of files without a partition never loads it)."""
    from . import composite_geometry

    return composite_geometry
