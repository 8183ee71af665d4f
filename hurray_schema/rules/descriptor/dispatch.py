"""How the descriptor rules are declared, located and run.

* :class:`When` -- what a rule declares about the descriptors it can fire on (layouts,
  quantization schemes, facts such as "has a shard section" or "is empty").  The
  dispatch reads only these declarations; it never looks at a rule's id.
* :func:`descriptor_rule` -- declares a rule whose check yields ``(message, offset)``
  pairs, with its ``when``.
* :class:`DescriptorContext` -- where each field sits, from the wire declarations
  (:func:`hurray_schema.structs.wire.descriptor_spans` for the parts,
  :func:`~hurray_schema.structs._declare.static_offset` and the declarations' plans for a
  field inside its part).  Offsets are computed only when a rule fires.
* :func:`check_descriptor` / :func:`first_error` -- run the rules that can fire on a
  descriptor, in declaration order.  The list of those rules (its *plan*) is built from
  the ``when`` declarations once per combination of the facts it depends on.
* :class:`Signature` / :func:`signature_pass_source` -- the rules of one compiled header as
  one expression, from each rule's optional ``fast`` form (for the checked decoders of
  :mod:`hurray_schema.signature`).
"""

from __future__ import annotations

import enum
import inspect
import struct
from typing import Callable, Iterator, Optional

import attrs

from ...codecache import compiled
from ...model import (
    BufferHandle, DeviceTag, ExtensionLayout, LayoutTag, TensorDescriptor, TiledLayout, UnknownLayout, UnknownQuantization,
)
from ...structs import layouts as layout_tables
from ...structs.descriptor import MIN_BUFFER_ALIGNMENT
from ...structs import quantization as quantization_tables
from ...structs._declare import Plan, plan, select, static_offset
from ...structs.descriptor import BUFFER_COUNT, BUFFER_HANDLE, BYTE_OFFSET, FIXED_HEADER, SHAPE
from ...structs.element_types import is_private_type
from ...structs.wire import descriptor_spans, values_of
from ..engine import Finding, Level, Mode, Rule, as_mode, declare

__all__ = [
    "Fact", "When", "ALWAYS", "descriptor_rule", "DESCRIPTOR_RULES", "DescriptorContext", "check_descriptor",
    "first_error", "passed", "Signature", "FAST_LOCALS", "signature_pass_source", "plain_buffers_source",
    "mark_passed", "on_declare", "plain_buffers",
]


# ------------------------------------------------------------------------------------
# When a rule applies
# ------------------------------------------------------------------------------------


class Fact(enum.Enum):
    """A cheap fact about a descriptor that a rule can need before it can fire."""

    SCALAR = "scalar"
    """rank 0."""
    EMPTY = "empty"
    """A dimension is 0 (ADR-007); a dynamic dimension is not."""
    PRIVATE_TYPE = "private_type"
    """type_tag is in the implementation-private range."""
    # the optional section of that name is present
    SHARD = "shard"
    STATISTICS = "statistics"
    EXTENSION_TYPE = "extension_type"
    COMPOSITE_MEMBER = "composite_member"
    UNUSUAL_BUFFERS = "unusual_buffers"
    """Some buffer handle is not a plain one (see :func:`_plain_buffers`): only then can a
    rule on the handles' own fields fire."""


def _tags(layouts) -> Optional[frozenset]:
    return None if layouts is None else frozenset(cls.tag for cls in layouts)


def _frozen(items) -> Optional[frozenset]:
    return None if items is None else frozenset(items)


@attrs.frozen(slots=True)
class When:
    """The descriptors a rule can fire on: every condition given holds (one of its members).

    ``layouts`` are layout classes (kept as their tags), ``schemes`` quantization classes
    (a descriptor without quantization has none of them), ``facts`` :class:`Fact` s.
    ``When()`` is every descriptor.  A rule whose ``when`` says too little just runs more
    often; one that says too much would miss a finding, which the test running every rule
    on damaged descriptors catches.
    """

    layouts: Optional[frozenset] = attrs.field(default=None, converter=_tags)
    schemes: Optional[frozenset] = attrs.field(default=None, converter=_frozen)
    facts: Optional[frozenset] = attrs.field(default=None, converter=_frozen)

    def holds(self, layout_tag: int, scheme: Optional[type], facts: frozenset) -> bool:
        return ((self.layouts is None or layout_tag in self.layouts)
                and (self.schemes is None or scheme in self.schemes)
                and (self.facts is None or not self.facts.isdisjoint(facts)))


ALWAYS = When()


# ------------------------------------------------------------------------------------
# Declaring a rule with its check
# ------------------------------------------------------------------------------------

DESCRIPTOR_RULES: list[Rule] = []
"""Every rule of one descriptor, in declaration order (roughly wire order): the order of
the findings of :func:`check_descriptor`."""

_RAW: dict[str, Callable] = {}
"""Rule id -> its check yielding ``(message, offset)`` (the registered check wraps it into Findings)."""

_PREDICATES: dict[str, Callable] = {}
"""Rule id -> its check as declared (returning its finding or None, or yielding findings)."""

_FAST: dict[str, Callable] = {}
"""Rule id -> its fast form (see :class:`Signature`), for the rules that declare one."""

_ON_DECLARE: list[Callable[[], None]] = []
"""Called after each declaration: what was generated from the rules so far is stale."""

_PLANS: dict = {}
"""Facts key (:func:`_rules_for`) -> :class:`_Plan`: the ``(rule, raw check)`` pairs that
can fire and the function that says whether all of them pass; emptied by each declaration."""

MAX_PASSED = 4096
_PASSED: dict = {}
"""id(descriptor) -> descriptor, for the last :data:`MAX_PASSED` descriptor objects on which
no rule reported anything in strict mode, SHOULD-level rules included (the entry keeps the
object alive, so its id is not reused); emptied by each declaration."""
_REMEMBER_PASSED = [True]


_SMALL_COUNT = 64
"""Most buffers, and most bytes of quantization padding or trailing data, of a descriptor
the passed table keeps alive (it never holds a large object on behalf of the input)."""


def rememberable(desc: TensorDescriptor) -> bool:
    """Whether the passed table may keep ``desc`` alive (small: see :data:`_SMALL_COUNT`)."""
    layout, q = desc.layout, desc.quantization
    return (len(desc.buffers) <= _SMALL_COUNT and len(desc.trailing) <= _SMALL_COUNT
            and not isinstance(layout, (UnknownLayout, ExtensionLayout))
            and (q is None or (not isinstance(q, UnknownQuantization)
                               and len(getattr(q, "padding", b"")) <= _SMALL_COUNT)))


def passed(desc: TensorDescriptor) -> bool:
    """True when no rule reported anything on this very object in strict mode (in
    :func:`first_error`, or the decoder generated per header checked it) and it is still
    remembered: it has no finding in either mode, so :func:`first_error` would return None
    and leave its ``notes`` as they were."""
    return _PASSED.get(id(desc)) is desc


def mark_passed(desc: TensorDescriptor, known_rememberable: bool = False) -> None:
    """Remember that ``desc`` passes every rule in strict mode (the decoder generated per header
    checked it), as :func:`first_error` would have, when the table is on.
    ``known_rememberable``: the caller knows :func:`rememberable` is true of ``desc`` (the
    decoder of one header makes descriptors of one size)."""
    if _REMEMBER_PASSED[0] and (known_rememberable or rememberable(desc)):
        if len(_PASSED) >= MAX_PASSED:
            _PASSED.clear()
        _PASSED[id(desc)] = desc


def on_declare(hook: Callable[[], None]) -> None:
    """Call ``hook()`` after every later rule declaration (code generated from the rules is then stale)."""
    _ON_DECLARE.append(hook)


def remember_passed(enabled: bool) -> bool:
    """Whether :func:`first_error` remembers the descriptor objects that passed (emptying
    the table); returns the previous setting.  Off, every call runs the rules."""
    previous = _REMEMBER_PASSED[0]
    _REMEMBER_PASSED[0] = bool(enabled)
    _PASSED.clear()
    return previous


def descriptor_rule(id: str, level: Level, citation: str, summary: str, *, when: When, scope: str = "descriptor",
                    permissive: bool = False, fast: Optional[Callable] = None):
    """Declare a descriptor rule that can fire only on the descriptors ``when`` describes.

    Its check is ``check(desc, ctx)``, written one of two ways: a rule with at most one
    finding *returns* ``(message, offset)`` when it fires and ``None`` when it passes (a
    plain predicate: what the compiled plans of :func:`first_error` call); a rule that can
    report several findings (one per buffer handle, per tiling level) *yields* them.

    ``fast(signature)`` (optional) states the same check for the descriptors of one compiled
    header as source text, for the decoder generated per header (:class:`Signature`)."""
    if not isinstance(when, When):
        raise TypeError(f"rule {id!r}: when= takes a When, not {when!r}")

    def wrap(fn: Callable) -> Rule:
        holder: list[Rule] = []
        raw = fn if inspect.isgeneratorfunction(fn) else _findings_of(fn)

        def check(desc: TensorDescriptor, ctx: DescriptorContext) -> Iterator[Finding]:
            rule = holder[0]
            for message, offset in raw(desc, ctx):
                yield rule.finding(message, offset, ctx.mode)

        rule = declare(id, level, citation, summary, scope=scope, permissive=permissive, check=check, when=when)
        holder.append(rule)
        DESCRIPTOR_RULES.append(rule)
        _RAW[id] = raw
        _PREDICATES[id] = fn
        if fast is not None:
            _FAST[id] = fast
        else:
            _FAST.pop(id, None)
        _PLANS.clear()
        _PASSED.clear()
        for hook in _ON_DECLARE:
            hook()
        return rule

    return wrap


def _findings_of(fn: Callable) -> Callable:
    """The ``(message, offset)`` pairs of a check that returns its one finding or None (or,
    written otherwise, an iterable of pairs: the compiled plans then send every descriptor
    it sees to the general loop, which reads them here)."""

    def findings(desc, ctx):
        found = fn(desc, ctx)
        if found is None:
            return
        if found.__class__ is tuple and len(found) == 2 and isinstance(found[0], str):
            yield found
        else:
            yield from found

    findings.__name__ = getattr(fn, "__name__", "findings")
    return findings


# ------------------------------------------------------------------------------------
# Where a field sits: offsets from the declarations
# ------------------------------------------------------------------------------------

_HANDLE_SIZE = plan(BUFFER_HANDLE).fixed_size
_COUNT_SIZE = plan(BUFFER_COUNT).fixed_size
_QLEN_SIZE = plan(quantization_tables.QUANTIZATION_LENGTH).fixed_size
_TILED_PLAN = plan(layout_tables.TILED)
_PREFIXES: dict[tuple[int, str], tuple] = {}


def _subfield(decl, name: str):
    for sub in decl.subcons:
        if getattr(sub, "name", None) == name:
            return sub
    raise KeyError(name)


def _prefix_plan(decl, name: str) -> Plan:
    """The plan of the fields of ``decl`` before ``name`` (cached with its declaration)."""
    entry = _PREFIXES.get((id(decl), name))
    if entry is None or entry[0] is not decl:
        names = []
        for sub in decl.subcons:
            if sub.name == name:
                break
            names.append(sub.name)
        else:
            raise KeyError(name)
        entry = _PREFIXES[(id(decl), name)] = (decl, plan(select(decl, *names)))
    return entry[1]


def field_offset(decl, name: str, values: dict) -> int:
    """Offset of field ``name`` inside table ``decl``: :func:`static_offset` where every
    preceding field is fixed; else the size of those fields, from their plan once ``values``
    (``rank`` and the part's decoded fields) fix their counts, or encoded with ``values``
    where a preceding field is conditional."""
    try:
        return static_offset(decl, name)
    except ValueError:
        pass
    prefix = _prefix_plan(decl, name)
    flat = prefix.flat_layout(**values)
    if flat is not None:
        return struct.calcsize("<" + flat[0])
    return prefix.size(**values)


def _element_width(decl, name: str) -> int:
    """Byte width of one element of the array field ``name`` of ``decl``."""
    array = _subfield(decl, name).subcon
    while not hasattr(array, "count") and hasattr(array, "subcon"):
        array = array.subcon  # through If(...)
    return array.subcon.sizeof()


class DescriptorContext:
    """What a check needs besides the descriptor: the mode and where each field sits."""

    __slots__ = ("desc", "mode", "base", "_spans")

    def __init__(self, desc: TensorDescriptor, mode: Mode = Mode.STRICT, base: int = 0):
        self.desc = desc
        self.mode = mode
        self.base = base
        self._spans: Optional[dict] = None

    def part(self, name: str) -> int:
        """Absolute offset of the first byte of descriptor part ``name``."""
        if self._spans is None:
            self._spans = {part: start for part, start, _ in descriptor_spans(self.desc)}
        return self.base + self._spans[name]

    def header(self, name: str) -> int:
        return self.part("fixed_header") + static_offset(FIXED_HEADER, name)

    def shape(self, k: int = 0) -> int:
        return self.part("shape") + k * _element_width(SHAPE, "shape")

    def byte_offset(self) -> int:
        return self.part("byte_offset") + static_offset(BYTE_OFFSET, "byte_offset")

    def buffer(self, i: int, name: str = "byte_size") -> int:
        return self.part("buffer_table") + _COUNT_SIZE + i * _HANDLE_SIZE + static_offset(BUFFER_HANDLE, name)

    def buffer_count(self) -> int:
        return self.part("buffer_table") + static_offset(BUFFER_COUNT, "buffer_count")

    def layout(self, name: str, index: int = 0, level: int = 0) -> int:
        """A layout-specific field (``index``: array element; ``level``: tiled nesting level)."""
        layout = self.desc.layout
        rank = self.desc.rank
        start = self.part("layout")
        if isinstance(layout, TiledLayout):
            decl = layout_tables.TILED
            for _ in range(level):
                start += len(_TILED_PLAN.pack(rank=rank, **values_of(layout)))
                layout = layout.inner
        else:
            decl = layout_tables.LAYOUT_FIELDS[LayoutTag(layout.tag)]
        at = start + field_offset(decl, name, dict(values_of(layout), rank=rank))
        return at + index * _element_width(decl, name) if index else at

    def quantization(self, name: str) -> int:
        decl = quantization_tables.SCHEMES[self.desc.quantization.scheme]
        return self.part("quantization") + _QLEN_SIZE + static_offset(decl, name)

    def section(self, part: str, decl, name: str, index: int = 0) -> int:
        """Field ``name`` of the optional section ``part`` (declared by ``decl``)."""
        section = getattr(self.desc, part)
        values = {"rank": self.desc.rank} if section is None else dict(values_of(section), rank=self.desc.rank)
        at = self.part(part) + field_offset(decl, name, values)
        return at + index * _element_width(decl, name) if index else at


# ------------------------------------------------------------------------------------
# The plan: which rules can fire on a descriptor
# ------------------------------------------------------------------------------------

_LAST_NAMED_DEVICE = int(max(DeviceTag))


_UNUSUAL_HANDLE = ("{h[device_tag]} != {first[device_tag]} or {h[sync_mode]} or {h[memory_class]} or {h[_reserved]}"
                   " or {first[device_tag]} > {last} or {h[alignment]} <= 0 or {h[alignment]} & ({h[alignment]} - 1)"
                   " or ({h[alignment]} < {minimum} and {h[byte_size]})")
"""True for a handle ``h`` on which a rule on the handles' own fields could fire: not CPU or a
named device, not producer-synced, not STANDARD memory, a non-zero reserved byte, an alignment
that is no power of two or is below 64 for a non-empty buffer, or another device than the
first handle ``first``.  One text for :func:`_plain_buffers` and :func:`plain_buffers_source`
(``h`` and ``first`` map each field name to the expression of its value)."""


def _unusual(h: dict, first: dict) -> str:
    return _UNUSUAL_HANDLE.format(h=h, first=first, last=_LAST_NAMED_DEVICE, minimum=MIN_BUFFER_ALIGNMENT)


def _attributes_of(name: str) -> dict:
    return {f.name: f"{name}.{f.name}" for f in attrs.fields(BufferHandle)}


def _make_plain_buffers() -> Callable:
    unusual = _unusual(_attributes_of("h"), _attributes_of("first"))
    source = ("def _plain_buffers(handles):\n    if not handles:\n        return True\n    first = handles[0]\n"
              f"    for h in handles:\n        if {unusual}:\n            return False\n"
              "    return True\n")
    namespace: dict = {}
    exec(compiled(source, "<hurray_schema plain buffers>"), namespace)
    return namespace["_plain_buffers"]


_plain_buffers = _make_plain_buffers()
"""``_plain_buffers(handles)``: True when no rule on the handles' own fields can fire (no
handle is :data:`_UNUSUAL_HANDLE`), so that the plan leaves those rules out."""


plain_buffers = _plain_buffers


def plain_buffers_source(handles: list) -> str:
    """:func:`_plain_buffers` as one expression over the handles' fields (``handles``: for each
    handle, field name -> the expression of its value)."""
    if not handles:
        return "True"
    return " and ".join(f"not ({_unusual(h, handles[0])})" for h in handles)


_FACT_SLOTS = (Fact.UNUSUAL_BUFFERS, Fact.STATISTICS, Fact.EXTENSION_TYPE, Fact.COMPOSITE_MEMBER, Fact.SHARD,
               Fact.SCALAR, Fact.EMPTY, Fact.PRIVATE_TYPE)
"""The facts in the order :func:`_rules_for` puts them in its key, after the layout tag and scheme."""


class _Plan:
    """The rules that can fire on one combination of facts, in declaration order.

    ``passes(desc, ctx)`` calls each rule's check as declared -- a returning check once, a
    yielding one up to its first finding -- and answers False as soon as any would report
    something.  It decides nothing about findings: when it says False the caller runs ``pairs``
    through the general loop, which makes every finding (ids, levels, offsets, messages, order)
    as before.  It is a closure over the checks, not generated code: a process that reads one
    file pays for no compilation."""

    __slots__ = ("pairs", "passes")

    def __init__(self, pairs: list):
        self.pairs = pairs
        self.passes = _passes_of(tuple(_PREDICATES[rule.id] for rule, _ in pairs))


def _passes_of(checks: tuple) -> Callable:
    """``passes(desc, ctx)`` over ``checks``: False at the first that would report."""
    returning = tuple(check for check in checks if not inspect.isgeneratorfunction(check))
    if len(returning) == len(checks):  # the common case: one call each, no generator

        def passes(desc, ctx) -> bool:
            for check in returning:
                if check(desc, ctx) is not None:
                    return False
            return True

        return passes
    kinds = tuple((check, inspect.isgeneratorfunction(check)) for check in checks)

    def passes_mixed(desc, ctx) -> bool:
        for check, yields in kinds:
            if yields:
                for _ in check(desc, ctx):
                    return False
            elif check(desc, ctx) is not None:
                return False
        return True

    return passes_mixed


def _plan_for(key: tuple) -> _Plan:
    layout_tag, scheme, *present = key
    facts = frozenset(fact for fact, holds in zip(_FACT_SLOTS, present) if holds)
    return _Plan([(rule, _RAW[rule.id]) for rule in DESCRIPTOR_RULES if rule.when.holds(layout_tag, scheme, facts)])


def _plan(desc: TensorDescriptor) -> _Plan:
    """The :class:`_Plan` of ``desc`` (cached per combination of the facts the declarations depend on)."""
    q = desc.quantization
    shape = desc.shape
    key = (desc.layout.tag, None if q is None else q.__class__, not _plain_buffers(desc.buffers),
           desc.statistics is not None, desc.extension_type is not None, desc.composite_member is not None,
           desc.shard is not None, not shape, 0 in shape, is_private_type(desc.type_tag))
    plan_ = _PLANS.get(key)
    if plan_ is None:
        plan_ = _PLANS[key] = _plan_for(key)
    return plan_


def _rules_for(desc: TensorDescriptor) -> list:
    """The ``(rule, raw check)`` pairs that can fire on ``desc``, in declaration order."""
    return _plan(desc).pairs


def check_descriptor(desc: TensorDescriptor, mode="strict", *, base: int = 0) -> list[Finding]:
    """Every finding of the semantic rules on ``desc`` (offsets relative to ``base``)."""
    ctx = DescriptorContext(desc, as_mode(mode), base)
    plan_ = _plan(desc)
    if plan_.passes(desc, ctx):
        return []
    out: list[Finding] = []
    for rule, raw in plan_.pairs:
        for message, offset in raw(desc, ctx):
            out.append(rule.finding(message, offset, ctx.mode))
    return out


def first_error(desc: TensorDescriptor, mode="strict", *, base: int = 0,
                notes: Optional[list] = None) -> Optional[Finding]:
    """The first finding the mode does not tolerate (a MUST breach), or None; stops there.

    ``notes``, when given, receives the other findings met on the way, in
    :func:`check_descriptor`'s order: the SHOULD-level ones and those the mode tolerated
    (before the first error when there is one, else all of them) -- what a reader records
    beside the descriptor it keeps.

    The plan's generated ``passes`` answers first; only a descriptor on which some rule
    would report goes through the general loop (so a descriptor with no finding costs no
    more with ``notes``).  A descriptor object on which no rule reports anything in strict
    mode has no finding in either mode (the rules are functions of the frozen value; the
    mode only decides what is tolerated), so the last :data:`MAX_PASSED` such objects are
    not checked twice: a stream of repeated descriptors gives the decoder's one object per
    distinct descriptor (:func:`hurray_schema.signature.decode_known`).  A descriptor with
    a SHOULD-level finding is never remembered: each reading reports it again."""
    if _PASSED.get(id(desc)) is desc:
        return None
    mode = as_mode(mode)
    ctx = DescriptorContext(desc, mode, base)
    plan_ = _plan(desc)
    if not plan_.passes(desc, ctx):
        for rule, raw in plan_.pairs:
            for message, offset in raw(desc, ctx):
                finding = rule.finding(message, offset, mode)
                if finding.is_error:
                    return finding
                if notes is not None:
                    notes.append(finding)
        return None
    if mode is Mode.STRICT and _REMEMBER_PASSED[0] and rememberable(desc):
        if len(_PASSED) >= MAX_PASSED:
            _PASSED.clear()
        _PASSED[id(desc)] = desc
    return None


# ------------------------------------------------------------------------------------
# The rules of one compiled header, as source text
# ------------------------------------------------------------------------------------

FAST_LOCALS = ("desc", "type_tag", "shape", "byte_offset", "buffers", "layout", "q", "shard", "statistics",
               "extension_type", "composite_member")
"""The names a fast form's expression reads, besides ``h0`` ... (the buffer handles): the
descriptor, its fields, ``q`` its quantization, each section by its attribute name."""


@attrs.frozen(slots=True)
class Signature:
    """What every descriptor decoded under one compiled header shares
    (:mod:`hurray_schema.signature`): the fixed header fixes the element type, rank, layout
    and which sections follow; the compiled decoder guards buffer_count, the scheme and its
    version; every handle is plain (:func:`_plain_buffers`) and ``empty`` says whether a
    dimension is 0.  Nothing else: every field value may be anything.

    A rule's ``fast(signature)`` answers for those descriptors with ``True`` (the rule cannot
    fire on any of them), ``None`` (no fast form: its check is called) or the source of an
    expression over :data:`FAST_LOCALS` and ``h0`` ... that is true only if the rule passes.
    A false expression is not a finding: the rule's own check is called then, and any
    finding sends the descriptor to the general engine, which reports it.  Objects the
    expression needs are named with :meth:`const`.
    """

    layout: type
    rank: int
    scheme: Optional[type]
    scheme_version: Optional[int]
    buffer_count: int
    type_tag: int
    sections: frozenset
    empty: bool
    names: dict = attrs.field(factory=dict, eq=False, repr=False)

    def const(self, obj) -> str:
        """A name the generated code reads ``obj`` by."""
        for name, known in self.names.items():
            if known is obj:
                return name
        name = f"_k{len(self.names)}"
        self.names[name] = obj
        return name

    def has(self, section: str) -> bool:
        return section in self.sections


def _returns_nothing(check: Callable, desc: TensorDescriptor) -> bool:
    return check(desc, DescriptorContext(desc)) is None


def _yields_nothing(check: Callable, desc: TensorDescriptor) -> bool:
    return next(iter(check(desc, DescriptorContext(desc))), None) is None


def signature_pass_source(sig: Signature) -> Optional[str]:
    """One expression, true only when no rule that can fire on the descriptors of ``sig``
    reports anything in strict mode (so in either mode): each rule's fast form, or its
    check called when it has none or the fast form says no.  ``None`` when some rule fires
    on every such descriptor.  The names it reads are added to ``sig.names``."""
    facts = {Fact.STATISTICS: sig.has("statistics"), Fact.EXTENSION_TYPE: sig.has("extension_type"),
             Fact.COMPOSITE_MEMBER: sig.has("composite_member"), Fact.SHARD: sig.has("shard"),
             Fact.SCALAR: sig.rank == 0, Fact.EMPTY: sig.empty, Fact.PRIVATE_TYPE: is_private_type(sig.type_tag),
             Fact.UNUSUAL_BUFFERS: False}
    key = (sig.layout.tag, sig.scheme, *(facts[fact] for fact in _FACT_SLOTS))
    parts = []
    for rule, _ in _plan_for(key).pairs:
        fast = _FAST.get(rule.id)
        form = fast(sig) if fast is not None else None
        if form is True:
            continue
        if form is False:
            return None
        check = _PREDICATES[rule.id]
        alone = _yields_nothing if inspect.isgeneratorfunction(check) else _returns_nothing
        call = f"{sig.const(alone)}({sig.const(check)}, desc)"
        parts.append(call if form is None else f"({form} or {call})")
    return " and ".join(parts) if parts else "True"
