"""How the descriptor rules are declared, located and run.

* :class:`When` -- what a rule declares about the descriptors it can fire on (layouts,
  quantization schemes, facts such as "has a shard section" or "is empty").  The
  dispatch reads only these declarations; it never looks at a rule's id.
* :func:`descriptor_rule` -- declares a rule with its ``when``, written once: its condition
  (``passes``, an expression) and the report of a finding, or its whole check.
* :class:`DescriptorContext` -- where each field sits, from the wire declarations
  (:func:`hurray_schema.structs.wire.descriptor_spans` for the parts,
  :func:`~hurray_schema.structs._declare.static_offset` and the declarations' plans for a
  field inside its part).  Offsets are computed only when a rule fires.
* :func:`check_descriptor` / :func:`first_error` -- run the rules that can fire on a
  descriptor, in declaration order.  The list of those rules (its *plan*) is built from
  the ``when`` declarations once per signature, with their conditions compiled into one
  expression that says whether any would report.
* :class:`Signature` / :func:`signature_pass_source` -- the same expression for the
  checked decoders compiled per header (:mod:`hurray_schema.signature`): both read each
  rule's one condition.
"""

from __future__ import annotations

import enum
import inspect
import struct
from typing import Callable, Iterator, Optional

import attrs

from ...codecache import compiled
from ...memo import MEMO
from ...model import (
    BufferHandle, DeviceTag, LayoutTag, TensorDescriptor, TiledLayout,
)
from ...structs import layouts as layout_tables
from ...structs import quantization as quantization_tables
from ...structs._declare import Plan, plan, select, static_offset
from ...structs.descriptor import BUFFER_COUNT, BUFFER_HANDLE, BYTE_OFFSET, FIXED_HEADER, SHAPE
from ...structs.element_types import is_private_type
from ...structs.wire import descriptor_spans, values_of
from ..engine import Finding, Level, Mode, Rule, as_mode, declare

__all__ = [
    "Fact", "When", "ALWAYS", "descriptor_rule", "DESCRIPTOR_RULES", "DescriptorContext", "check_descriptor",
    "first_error", "Signature", "signature_of", "condition_of", "FAST_LOCALS", "signature_pass_source",
    "plain_buffers_source",
    "on_declare", "plain_buffers", "evaluated",
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
    rule on a handle's device, sync mode or memory class fire."""


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

_CHECKS: dict[str, Callable] = {}
"""Rule id -> the function declared with it: its whole check, or its report where it has a condition."""

_FORMS: dict = {}
"""Rule id -> its condition (``descriptor_rule(passes=...)``), for the rules written that way."""

_ON_DECLARE: list[Callable[[], None]] = []
"""Called after each declaration: what was generated from the rules so far is stale."""

_PLANS = MEMO.plans
"""Signature and facts (:func:`_plan`) -> :class:`_Plan`: the ``(rule, raw check)`` pairs that
can fire and the function that says whether all of them pass; emptied by each declaration."""


def on_declare(hook: Callable[[], None]) -> None:
    """Call ``hook()`` after every later rule declaration (code generated from the rules is then stale)."""
    _ON_DECLARE.append(hook)


def descriptor_rule(id: str, level: Level, citation: str, summary: str, *, when: When, scope: str = "descriptor",
                    permissive: bool = False, passes=None):
    """Declare a descriptor rule that can fire only on the descriptors ``when`` describes.

    A rule is written in one of two forms, never both:

    * ``passes`` given: the rule's condition, once, as an expression over :data:`FAST_LOCALS`
      (and ``h0``, ``h1``, ... the buffer handles) that is true when the rule passes -- a
      string, or a function of the :class:`Signature` of the descriptors it is read for that
      gives such a string, or ``True`` / ``False`` where the signature decides alone.  The
      decorated function is then the rule's *report*, ``report(desc, ctx) -> (message,
      offset)``, called only on a descriptor whose condition is false.  The plans of
      :func:`first_error` and the decoders compiled per header read the same condition.
    * no ``passes``: the decorated function is the whole check, ``check(desc, ctx)``: it
      *returns* ``(message, offset)`` when it fires and ``None`` when it passes, or *yields*
      one pair per finding (one per buffer handle, per tiling level).  Plans call it."""
    if not isinstance(when, When):
        raise TypeError(f"rule {id!r}: when= takes a When, not {when!r}")

    def wrap(fn: Callable) -> Rule:
        holder: list[Rule] = []
        if passes is None:
            raw = fn if inspect.isgeneratorfunction(fn) else _findings_of(fn)
        else:
            raw = _behind(lambda desc: condition_of(id, desc), fn)

        def check(desc: TensorDescriptor, ctx: DescriptorContext) -> Iterator[Finding]:
            rule = holder[0]
            for message, offset in raw(desc, ctx):
                yield rule.finding(message, offset, ctx.mode)

        rule = declare(id, level, citation, summary, scope=scope, permissive=permissive, check=check, when=when)
        holder.append(rule)
        DESCRIPTOR_RULES.append(rule)
        _RAW[id] = raw
        _CHECKS[id] = fn
        if passes is not None:
            _FORMS[id] = passes
        else:
            _FORMS.pop(id, None)
        _PLANS.clear()
        _CONDITIONS.clear()
        for hook in _ON_DECLARE:
            hook()
        return rule

    return wrap


def _behind(condition: Callable, report: Callable) -> Callable:
    """The ``(message, offset)`` pairs of a rule declared with ``passes``: its report, where its
    condition (``condition(desc)``, the compiled ``holds``) is false; a report that yields gives one
    pair per finding."""
    several = inspect.isgeneratorfunction(report)

    def findings(desc, ctx):
        if not condition(desc)(desc):
            if several:
                yield from report(desc, ctx)
                return
            found = report(desc, ctx)
            if found is not None:
                yield found

    findings.__name__ = getattr(report, "__name__", "findings")
    return findings


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
_PREFIXES = MEMO.prefixes


def _subfield(decl, name: str):
    for sub in decl.subcons:
        if getattr(sub, "name", None) == name:
            return sub
    raise KeyError(name)


def _prefix_plan(decl, name: str) -> Plan:
    """The plan of the fields of ``decl`` before ``name`` (cached with its declaration)."""
    entry = _PREFIXES.get((decl, name))
    if entry is None:
        names = []
        for sub in decl.subcons:
            if sub.name == name:
                break
            names.append(sub.name)
        else:
            raise KeyError(name)
        entry = _PREFIXES[(decl, name)] = plan(select(decl, *names))
    return entry


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


_UNUSUAL_HANDLE = "{h[device_tag]} > {last} or {h[sync_mode]} or {h[memory_class]}"
"""True for a handle ``h`` outside the shape the decoders compiled per header build: a device that is
not a named one, a sync mode or a memory class other than 0.  Only such a handle can break a rule on a
handle's device, sync mode or memory class (those rules declare :attr:`Fact.UNUSUAL_BUFFERS`); the
rules on every handle's reserved byte, alignment and colocation state their own conditions.  One text
for :func:`_plain_buffers` and :func:`plain_buffers_source` (``h`` maps each field name to the
expression of its value)."""


def _unusual(h: dict) -> str:
    return _UNUSUAL_HANDLE.format(h=h, last=_LAST_NAMED_DEVICE)


def _attributes_of(name: str) -> dict:
    return {f.name: f"{name}.{f.name}" for f in attrs.fields(BufferHandle)}


def _make_plain_buffers() -> Callable:
    unusual = _unusual(_attributes_of("h"))
    source = ("def _plain_buffers(handles):\n"
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
    return " and ".join(f"not ({_unusual(h)})" for h in handles)


_FACT_SLOTS = (Fact.UNUSUAL_BUFFERS, Fact.STATISTICS, Fact.EXTENSION_TYPE, Fact.COMPOSITE_MEMBER, Fact.SHARD,
               Fact.SCALAR, Fact.EMPTY, Fact.PRIVATE_TYPE)
"""Every fact, in the order :meth:`Signature.facts` reads them."""

MAX_PLANS = MEMO.limit("plans")
"""Most plans kept at once (one per signature met); past it the table is emptied and fills again."""


class _Plan:
    """The rules that can fire on the descriptors of one :class:`Signature`, in declaration order.

    ``pairs`` are ``(rule, raw check)``; ``passes(desc, ctx)`` is one compiled expression --
    the conjunction of :func:`signature_pass_source` -- true only when no rule would report
    anything.  It decides nothing about findings: when it says False the caller runs
    ``pairs`` through the general loop, which makes every finding (ids, levels, offsets,
    messages, order)."""

    __slots__ = ("pairs", "passes")

    def __init__(self, pairs: list, passes: Callable):
        self.pairs = pairs
        self.passes = passes


def _never(desc, ctx) -> bool:
    return False


def _plan_for(sig: "Signature", facts: frozenset) -> _Plan:
    rules = [rule for rule in DESCRIPTOR_RULES if rule.when.holds(sig.tag, sig.scheme, facts)]
    pairs = [(rule, _specialized(rule, sig)) for rule in rules]
    conjunction = _conjunction(sig, rules)
    if conjunction is None:
        return _Plan(pairs, _never)
    expression, _ = conjunction
    source = f"def passes(desc, ctx):\n{_bind_locals(sig)}    return bool({expression})\n"
    namespace = dict(sig.names)
    exec(compiled(source, f"<hurray_schema rule plan {sig.tag:#04x}/rank {sig.rank}>"), namespace)
    return _Plan(pairs, namespace["passes"])


def _specialized(rule: Rule, sig: "Signature") -> Callable:
    """The raw check of ``rule`` for the descriptors of ``sig``: its report behind its condition
    compiled for ``sig`` (when a descriptor first needs it: only one some rule reports on goes
    through the general loop), or its whole check."""
    if rule.id not in _FORMS:
        return _RAW[rule.id]
    compiled_holds: list = []

    def holds(desc) -> Callable:
        if not compiled_holds:
            compiled_holds.append(_condition(rule.id, sig))
        return compiled_holds[0]

    return _behind(holds, _CHECKS[rule.id])


def _plan(desc: TensorDescriptor) -> _Plan:
    """The :class:`_Plan` of ``desc`` (kept per signature and facts)."""
    q = desc.quantization
    shape = desc.shape
    layout = desc.layout
    key = (layout.__class__, layout.tag, None if q is None else q.__class__, None if q is None else q.scheme_version,
           len(shape), desc.type_tag, len(desc.buffers), not _plain_buffers(desc.buffers),
           desc.statistics is not None, desc.extension_type is not None, desc.composite_member is not None,
           desc.shard is not None, 0 in shape)
    plan_ = _PLANS.get(key)
    if plan_ is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        sig = signature_of(desc)
        plan_ = _PLANS[key] = _plan_for(sig, sig.facts(unusual_buffers=key[7]))
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

    The plan's compiled ``passes`` answers first; only a descriptor on which some rule
    would report goes through the general loop (so a descriptor with no finding costs no
    more with ``notes``)."""
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


# ------------------------------------------------------------------------------------
# The rules of one compiled header, as source text
# ------------------------------------------------------------------------------------

FAST_LOCALS = ("desc", "type_tag", "shape", "byte_offset", "buffers", "layout", "q", "shard", "statistics",
               "extension_type", "composite_member")
"""The names a rule's condition reads, besides ``h0`` ... (the buffer handles): the
descriptor, its fields, ``q`` its quantization, each section by its attribute name."""

_SECTION_NAMES = ("shard", "statistics", "extension_type", "composite_member")
_BOUND_HANDLES = 3
"""Handles bound to ``h0`` ... by the plans of :func:`first_error` (the conditions read at most ``h2``;
the decoders compiled per header bind every handle)."""


@attrs.frozen(slots=True)
class Signature:
    """What the descriptors a condition is read for share: the element type, rank, layout class,
    scheme (and its version), buffer count and which sections are present, and whether a dimension
    is 0.  Nothing else: every other field value may be anything.  A decoder compiled per header
    (:mod:`hurray_schema.signature`) reads the rules under the signature of its header, every
    handle plain; a plan of :func:`first_error`, under the signature of the descriptor it checks.

    A rule's condition given as a function is called with a signature and answers ``True`` (the
    rule passes on all of them), ``False`` (it fires on all of them) or the source of an expression
    over :data:`FAST_LOCALS` and ``h0`` ... that is true exactly when the rule passes.  Objects the
    expression needs are named with :meth:`const`."""

    layout: type
    rank: int
    scheme: Optional[type]
    scheme_version: Optional[int]
    buffer_count: int
    type_tag: int
    sections: frozenset
    empty: bool
    tag: int = attrs.field(default=None)
    names: dict = attrs.field(factory=dict, eq=False, repr=False)

    def __attrs_post_init__(self):
        if self.tag is None:
            object.__setattr__(self, "tag", self.layout.tag)

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

    def facts(self, unusual_buffers: bool = False) -> frozenset:
        """The :class:`Fact` s true of the descriptors of this signature."""
        holds = (unusual_buffers, self.has("statistics"), self.has("extension_type"), self.has("composite_member"),
                 self.has("shard"), self.rank == 0, self.empty, is_private_type(self.type_tag))
        return frozenset(fact for fact, true in zip(_FACT_SLOTS, holds) if true)


def signature_of(desc: TensorDescriptor) -> Signature:
    """The :class:`Signature` of one descriptor."""
    q = desc.quantization
    return Signature(desc.layout.__class__, desc.rank, None if q is None else q.__class__,
                     None if q is None else q.scheme_version, len(desc.buffers), int(desc.type_tag),
                     frozenset(name for name in _SECTION_NAMES if getattr(desc, name) is not None), 0 in desc.shape,
                     desc.layout.tag)


def _bind_locals(sig: Signature) -> str:
    """The lines binding :data:`FAST_LOCALS` and the first handles from ``desc``."""
    lines = ["    type_tag, shape, byte_offset, buffers = desc.type_tag, desc.shape, desc.byte_offset, desc.buffers",
             "    layout, q = desc.layout, desc.quantization"]
    lines += [f"    {name} = desc.{name}" for name in _SECTION_NAMES]
    lines += [f"    h{i} = buffers[{i}]" for i in range(min(sig.buffer_count, _BOUND_HANDLES))]
    return "\n".join(lines) + "\n"


def _form(rule_id: str, sig: Signature):
    """The condition of ``rule_id`` read under ``sig``: True, False or an expression."""
    form = _FORMS[rule_id]
    return form(sig) if callable(form) else form


def _condition(rule_id: str, sig: Signature) -> Callable:
    """``holds(desc)`` for the descriptors of ``sig``: the condition of ``rule_id``, compiled."""
    form = _form(rule_id, sig)
    if form is True or form is False:
        return (lambda desc: True) if form else (lambda desc: False)
    source = f"def holds(desc):\n{_bind_locals(sig)}    return bool({form})\n"
    namespace = dict(sig.names)
    exec(compiled(source, f"<hurray_schema rule {rule_id}>"), namespace)
    return namespace["holds"]


MAX_CONDITIONS = MEMO.limit("conditions")
_CONDITIONS = MEMO.conditions
"""``(rule id, signature)`` -> the condition compiled for it, for :func:`condition_of` and :func:`evaluated`."""


def condition_of(rule_id: str, desc: TensorDescriptor) -> Callable:
    """``holds(desc)``: the condition of the rule ``rule_id`` (declared with ``passes``) compiled for
    the signature of ``desc``, for a rule's check called on its own (the plans compile their own)."""
    key = (rule_id, signature_of(desc))
    holds = _CONDITIONS.get(key)
    if holds is None:
        if len(_CONDITIONS) >= MAX_CONDITIONS:
            _CONDITIONS.clear()
        holds = _CONDITIONS[key] = _condition(rule_id, key[1])
    return holds


def evaluated(name: str, desc: TensorDescriptor, build: Callable):
    """The value for ``desc`` of the expression ``build(signature)`` gives (over :data:`FAST_LOCALS`),
    compiled once per signature: what a rule's report reads from the same sources as its condition."""
    sig = signature_of(desc)
    key = (name, sig, build)
    value = _CONDITIONS.get(key)
    if value is None:
        if len(_CONDITIONS) >= MAX_CONDITIONS:
            _CONDITIONS.clear()
        source = f"def value(desc):\n{_bind_locals(sig)}    return {build(sig)}\n"
        namespace = dict(sig.names)
        exec(compiled(source, f"<hurray_schema {name}>"), namespace)
        value = _CONDITIONS[key] = namespace["value"]
    return value(desc)


def _yields_nothing(check: Callable, desc: TensorDescriptor, ctx) -> bool:
    return next(iter(check(desc, ctx)), None) is None


def _conjunction(sig: Signature, rules) -> Optional[tuple[str, bool]]:
    """One expression over :data:`FAST_LOCALS`, ``h0`` ... and ``ctx``, true only when none of
    ``rules`` reports anything on a descriptor of ``sig``: each rule's condition, or its whole
    check called; and whether it reads ``ctx``.  ``None`` when some rule fires on every such
    descriptor.  The names it reads are added to ``sig.names``."""
    parts = []
    reads_ctx = False
    for rule in rules:
        if rule.id in _FORMS:
            form = _form(rule.id, sig)
            if form is True:
                continue
            if form is False:
                return None
            parts.append(f"({form})")
            continue
        check = _CHECKS[rule.id]
        reads_ctx = True
        if inspect.isgeneratorfunction(check):
            parts.append(f"{sig.const(_yields_nothing)}({sig.const(check)}, desc, ctx)")
        else:
            parts.append(f"{sig.const(check)}(desc, ctx) is None")
    return (" and ".join(parts) if parts else "True"), reads_ctx


def signature_pass_source(sig: Signature) -> Optional[tuple[str, bool]]:
    """For the decoders compiled per header: the expression of :func:`_conjunction` over the rules
    that can fire on the descriptors of ``sig`` with plain handles, and whether it reads ``ctx``
    (a :class:`DescriptorContext` of ``desc``); ``None`` when some rule fires on all of them."""
    return _conjunction(sig, [rule for rule in DESCRIPTOR_RULES if rule.when.holds(sig.tag, sig.scheme, sig.facts())])
