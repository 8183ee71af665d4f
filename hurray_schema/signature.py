"""Descriptor decoders compiled per header signature.

The 20-byte fixed header (``metadata.md § Fixed Header``) decides almost everything about
where the rest of a descriptor lies: ``rank`` fixes the shape and the rank-dependent
layout and shard arrays, ``layout_tag`` the layout table, ``flags`` which optional
sections follow, ``descriptor_length`` the total.  Tensors of one stream or file mostly
share a handful of headers.  So once the general decoder of :mod:`hurray_schema.codec`
has read a descriptor cleanly, this module compiles, for that exact header, one
function that unpacks everything after the header with a single :class:`struct.Struct`
and builds the value objects positionally -- the way ``attrs`` and
:func:`collections.namedtuple` generate their methods.

Nothing here is declared a second time: which parts follow in which order, gated by which
flag and built into which class comes from
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`; the format and the position of
every field from the plans of the declarations
(:meth:`~hurray_schema.structs._declare.Plan.flat_layout`); and the value objects'
constructors take the fields by their spec names.

The few values the header does not fix (``buffer_count``, ``quantization_length``, the
scheme tag and version) are *guards*: the compiled decoder returns ``None`` when one of
them differs from the descriptor it was compiled from, and the caller falls back to the
general decoder, which also does all the error reporting.  A signature is compiled only
from a descriptor that produced no finding, within the limits in use, and only when
re-decoding that same input with the compiled function gives an equal descriptor, and only
the second time its header is seen.

Each compiled header also gets a *checked* decoder (:attr:`CompiledDecoder.checked`): the
same unpacking into locals, then the semantic rules that can fire on that header as one
expression -- each rule's fast form (``descriptor_rule(fast=...)``, read with a
:class:`~hurray_schema.rules.descriptor.dispatch.Signature` of what the header fixes) or its
check where it has none.  It returns the descriptor only when every rule passes; otherwise the
general path decodes and reports, so the findings never come from generated code.

Descriptors are immutable values, so a few bounded by-value tables spare repeated work
(:data:`MAX_VALUES` entries each, emptied when full, so hostile input costs one entry per
descriptor): :func:`decode_known` gives the object decoded the first time for the same
exact bytes under a compiled header, and :func:`encode` keeps the bytes of the descriptor
objects it encoded.  The rules keep the objects that passed (``first_error``).
:func:`use_value_tables` turns all three off (the benchmarks time both).
"""

from __future__ import annotations

import re
import struct
from typing import Callable, Optional

import attrs

from .codecache import compiled as compiled_code
from .limits import DEFAULT_LIMITS, Limits
from .model import (
    SCHEMES, TABLE_LAYOUTS, VALUE_CLASSES, ColumnMajorLayout, DeviceTag, RowMajorLayout, TensorDescriptor,
)
from .rules.descriptor.dispatch import (
    Signature, mark_passed, on_declare, passed, plain_buffers, plain_buffers_source, remember_passed, rememberable,
    signature_pass_source,
)
from .structs._declare import plan
from .structs.descriptor import CORE_PARTS, FIXED_HEADER, MAGIC, PARTS, SECTION_PARTS

__all__ = ["CompiledDecoder", "compile_decoder", "lookup", "remember", "clear", "MAX_SIGNATURES", "slot_constructor",
           "encoder_key", "compile_encoder", "encoder", "encode", "MISS", "decode_known", "decode_checked", "accepted",
           "remember_accepted", "parsed", "remember_parsed", "MAX_VALUES", "MAX_VALUE_BYTES", "use_value_tables"]

MAX_SIGNATURES = 1024
"""Most headers remembered at once (seen, compiled or refused); the input picks the headers,
so the tables are bounded."""

_HEADER_SIZE = plan(FIXED_HEADER).fixed_size
_LAYOUT = PARTS["layout"]
_BUFFER_TABLE = PARTS["buffer_table"]
_QUANTIZATION = PARTS["quantization"]
_SECTIONS = tuple((part.attribute, part.decl, VALUE_CLASSES[part.value_class]) for part in SECTION_PARTS)
"""``(descriptor attribute, declaration, value class)`` of each section after quantization, in wire order."""


def slot_constructor(cls, trusted: frozenset = frozenset()) -> Callable:
    """A constructor of the frozen slotted attrs class ``cls`` taking every field positionally.

    It stores the same values ``cls(...)`` would -- each field's attrs converter applied --
    but not through the frozen ``__init__``, which pays a ``object.__setattr__`` call per
    field.  Fields named in ``trusted`` skip their converter: the caller guarantees the
    value is already what the converter returns (a tuple of ints straight from
    :mod:`struct`, a tuple it built itself).  The model has no validators (checked here),
    so nothing else is bypassed.

    A class of at least :data:`TWIN_MIN_FIELDS` fields is filled as an instance of its
    *twin* -- a plain class with the same slots, whose attribute stores are plain slot
    stores -- and then given its class (the two have one memory layout, so CPython allows
    the ``__class__`` assignment).  That assignment costs about as much as writing two
    slots through their descriptors, so smaller classes are filled through the slot
    descriptors directly.
    """
    fields = attrs.fields(cls)
    if any(f.validator is not None for f in fields) or hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} has validators or a post-init hook")
    twin = _twin_of(cls) if len(fields) >= TWIN_MIN_FIELDS else None
    namespace: dict = {"_new": object.__new__, "_cls": cls, "_twin": twin}
    lines = [f"def new_{cls.__name__}({', '.join(f'a{i}' for i in range(len(fields)))}):",
             f"    s = _new({'_cls' if twin is None else '_twin'})"]
    for i, f in enumerate(fields):
        value = f"a{i}"
        if f.converter is not None and f.name not in trusted:
            namespace[f"_convert{i}"] = f.converter
            value = f"_convert{i}(a{i})"
        if twin is None:
            namespace[f"_set{i}"] = cls.__dict__[f.name].__set__
            lines.append(f"    _set{i}(s, {value})")
        else:
            lines.append(f"    s.{f.name} = {value}")
    if twin is not None:
        lines.append("    s.__class__ = _cls")
    lines.append("    return s")
    exec(compiled_code("\n".join(lines) + "\n", f"<hurray_schema constructor {cls.__qualname__}>"), namespace)
    return namespace[f"new_{cls.__name__}"]


TWIN_MIN_FIELDS = 3
"""Fewest fields of a value class that :func:`slot_constructor` fills through its twin
(measured on CPython 3.11: one ``__class__`` assignment costs about two slot-descriptor calls)."""


def _twin_of(cls) -> Optional[type]:
    """A plain class with the slots of ``cls`` (same names, same order), or None when an
    instance of it cannot become a ``cls`` (another base, a ``__weakref__`` or ``__dict__`` slot)."""
    if cls.__bases__ != (object,):
        return None
    twin = type(f"_{cls.__name__}Twin", (), {"__slots__": tuple(cls.__slots__), "__module__": __name__})
    probe = object.__new__(twin)
    try:
        probe.__class__ = cls
    except TypeError:
        return None
    return twin


class _NotCompilable(Exception):
    """This descriptor's shape of wire data is left to the general decoder."""


@attrs.frozen(slots=True)
class CompiledDecoder:
    """The decoder of one header signature, with what it needs from the limits."""

    decode: Callable = attrs.field(repr=False)
    """``decode(data) -> TensorDescriptor | None`` (``None``: a guard differs)."""
    source: str = attrs.field(repr=False)
    length: int
    rank: int
    buffer_count: int
    checked: Optional[Callable] = attrs.field(default=None, repr=False)
    """``checked(data) -> TensorDescriptor | None``: the descriptor ``decode`` gives, when every
    semantic rule passes on it in strict mode; ``None`` when a guard differs, a handle is not
    plain, the shape is empty where the compiled one was not (or the reverse), or some rule
    would report (the general path then decodes and reports).  ``None`` itself where the
    header admits no passing descriptor."""
    checked_source: str = attrs.field(default="", repr=False)
    rememberable: bool = attrs.field(default=False, repr=False)
    """What :func:`~hurray_schema.rules.descriptor.dispatch.rememberable` says of every
    descriptor this header decodes to (their sizes are the header's)."""
    fits_default: bool = attrs.field(init=False)
    """Within :data:`~hurray_schema.limits.DEFAULT_LIMITS` (it may have been compiled under raised ones)."""

    @fits_default.default
    def _fits_default(self) -> bool:
        return self.fits(DEFAULT_LIMITS)

    def fits(self, limits: Limits) -> bool:
        return (self.length <= limits.max_descriptor_bytes and self.rank <= limits.max_rank
                and self.buffer_count <= limits.max_buffer_count)


class _Source:
    """Accumulates the struct format, the guards and the constructor expressions."""

    def __init__(self) -> None:
        self.fmt = "<"
        self.count = 0  # items of the unpacked tuple so far
        self.names: dict = {}  # generated-code name -> object
        self.guards: list[str] = []

    def table(self, decl, **context) -> dict:
        """Append one declared table; returns field name -> expression."""
        layout = plan(decl).flat_layout(**context)
        if layout is None:
            raise _NotCompilable(f"{decl} has self-dependent counts")
        fmt, slots = layout
        base = self.count
        self.fmt += fmt
        exprs = {}
        for name, start, stop in slots:
            exprs[name] = f"v[{base + start}]" if stop is None else f"v[{base + start}:{base + stop}]"
        self.count = base + _items(fmt)
        return exprs

    def bytes_field(self, n: int) -> str:
        self.fmt += f"{n}s"
        self.count += 1
        return f"v[{self.count - 1}]"

    def guard(self, expr: str, value: int) -> None:
        self.guards.append(f"{expr} != {int(value)}")

    def constant(self, name: str, obj) -> str:
        self.names[name] = obj
        return name

    def construct(self, cls, exprs: dict) -> str:
        """An expression building ``cls`` with its attrs fields taken by name, in order."""
        name = self.constant(f"_new_{cls.__name__}", _constructor(cls))
        try:
            args = [exprs[f.name] for f in attrs.fields(cls)]  # attrs field names are the spec names
        except KeyError as missing:
            raise _NotCompilable(f"{cls.__name__}.{missing} is not on the wire table") from None
        return f"{name}({', '.join(args)})"


_CONSTRUCTORS: dict = {}
_AS_UNPACKED = (attrs.fields_dict(TensorDescriptor)["shape"].converter, bytes)
"""Converters that give back what :mod:`struct` unpacks for their fields (a tuple of ints, a
bytes): the compiled decoders pass those values as they are."""


def _constructor(cls) -> Callable:
    made = _CONSTRUCTORS.get(cls)
    if made is None:
        trusted = frozenset(f.name for f in attrs.fields(cls) if f.converter in _AS_UNPACKED)
        made = _CONSTRUCTORS[cls] = slot_constructor(cls, trusted)
    return made


_NEW_DESCRIPTOR = slot_constructor(TensorDescriptor, frozenset({"type_tag", "shape", "buffers", "trailing"}))
"""The descriptor's converters are skipped: the compiled decoder passes the converted
type_tag, the shape as unpacked (a tuple of ints), a tuple of handles and ``b''``."""


def _items(fmt: str) -> int:
    """Number of values ``struct`` unpacks for ``fmt`` (``4Q`` is four, ``4s`` one)."""
    return len(_format_items(fmt))


def _layout_expr(src: _Source, desc: TensorDescriptor) -> str:
    layout = desc.layout
    if isinstance(layout, (RowMajorLayout, ColumnMajorLayout)):
        return src.constant("_LAYOUT", layout)  # no layout-specific fields
    cls = TABLE_LAYOUTS.get(layout.tag)
    if cls is None or layout.__class__ is not cls:
        raise _NotCompilable(f"layout 0x{layout.tag:02X}")
    return src.construct(cls, src.table(_LAYOUT.tables[layout.tag], rank=desc.rank))


def _quantization_expr(src: _Source, desc: TensorDescriptor) -> str:
    q = desc.quantization
    if q is None:
        return "None"
    cls = SCHEMES.get(getattr(q, "scheme", None))
    if cls is None or q.__class__ is not cls:
        raise _NotCompilable("unknown quantization scheme")
    qlen = src.table(_QUANTIZATION.prefix)[_QUANTIZATION.prefix_field]
    decl = _QUANTIZATION.tables[cls.scheme]
    exprs = src.table(decl)
    src.guard(exprs[_QUANTIZATION.chosen_by], cls.scheme)
    src.guard(exprs["scheme_version"], q.scheme_version)
    table_size = plan(decl).fixed_size
    if table_size is None:
        raise _NotCompilable("quantization table of variable size")
    src.guard(qlen, table_size + len(q.padding))
    exprs["padding"] = src.bytes_field(len(q.padding)) if q.padding else "b''"
    return src.construct(cls, exprs)


def compile_decoder(desc: TensorDescriptor, length: int) -> CompiledDecoder:
    """The decoder of every descriptor sharing the fixed header of ``desc`` (``descriptor_length``
    ``length``).  Raises :class:`_NotCompilable` for what the general decoder keeps to itself:
    tiled and private layouts, unknown schemes, newer-minor trailing data."""
    if desc.unparsed_flags or desc.trailing:
        raise _NotCompilable("newer minor version")
    src = _Source()
    exprs = {"type_tag": src.constant("_TYPE_TAG", desc.type_tag),
             "version_major": str(int(desc.version_major)), "version_minor": str(int(desc.version_minor))}
    for part in CORE_PARTS:
        exprs[part.attribute] = src.table(part.decl, rank=desc.rank)[part.attribute]
    exprs[_LAYOUT.attribute] = _layout_expr(src, desc)
    src.guard(src.table(_BUFFER_TABLE.prefix)[_BUFFER_TABLE.prefix_field], len(desc.buffers))
    handle_class = VALUE_CLASSES[_BUFFER_TABLE.value_class]
    handle_fields = [src.table(_BUFFER_TABLE.decl) for _ in desc.buffers]
    handles = [src.construct(handle_class, fields) for fields in handle_fields]
    exprs[_BUFFER_TABLE.attribute] = "(" + "".join(h + ", " for h in handles) + ")"
    exprs[_QUANTIZATION.attribute] = _quantization_expr(src, desc)
    for attr, decl, cls in _SECTIONS:
        exprs[attr] = "None" if getattr(desc, attr) is None else src.construct(cls, src.table(decl, rank=desc.rank))
    codec = struct.Struct(src.fmt)
    if _HEADER_SIZE + codec.size != length:
        raise _NotCompilable("descriptor_length does not match the tables")
    src.names["_unpack"] = codec.unpack_from
    exprs.update(unparsed_flags="0", trailing="b''")
    args = [exprs[f.name] for f in attrs.fields(TensorDescriptor)]
    guard = f"    if {' or '.join(src.guards)}:\n        return None\n" if src.guards else ""
    head = f"def {{name}}(data):\n    v = _unpack(data, {_HEADER_SIZE})\n{guard}"
    source = head.format(name="decode") + f"    return _TD({', '.join(args)})\n"
    namespace = dict(src.names, _TD=_NEW_DESCRIPTOR)
    where = f"<hurray_schema signature {desc.layout.tag:#04x}/rank {desc.rank}>"
    exec(compiled_code(source, where), namespace)
    checked_source = _checked_source(head.format(name="checked"), desc, exprs, handle_fields, namespace)
    checked = None
    if checked_source:
        exec(compiled_code(checked_source, where), namespace)
        checked = namespace["checked"]
    return CompiledDecoder(namespace["decode"], source, length, desc.rank, len(desc.buffers), checked, checked_source,
                           rememberable=rememberable(desc))


_HANDLE_CLASS = VALUE_CLASSES[_BUFFER_TABLE.value_class]
_HANDLE_TAGS = {f.name: f.converter for f in attrs.fields(_HANDLE_CLASS) if f.converter is not None}
_PLAIN_HANDLE_NAMES = {
    "_new_plain_handle": slot_constructor(_HANDLE_CLASS, frozenset(_HANDLE_TAGS)),
    "_DEVICE_TAGS": tuple(_HANDLE_TAGS["device_tag"](tag) for tag in range(int(max(DeviceTag)) + 1)),
    **{f"_{name.upper()}_0": convert(0) for name, convert in _HANDLE_TAGS.items()},
}
"""What a handle the checked decoder keeps is built from: it is plain
(:func:`~hurray_schema.rules.descriptor.dispatch.plain_buffers`), so its device is a named one
and its sync mode and memory class are 0; the tags are the members the converters give."""


def _plain_handle(fields: dict) -> str:
    """The constructor call of a plain handle whose fields are the expressions ``fields``."""
    args = []
    for f in attrs.fields(_HANDLE_CLASS):
        if f.name == "device_tag":
            args.append(f"_DEVICE_TAGS[{fields[f.name]}]")
        elif f.name in _HANDLE_TAGS:
            args.append(f"_{f.name.upper()}_0")
        else:
            args.append(fields[f.name])
    return f"_new_plain_handle({', '.join(args)})"


def _checked_source(head: str, desc: TensorDescriptor, exprs: dict, handle_fields: list, namespace: dict) -> str:
    """The source of :attr:`CompiledDecoder.checked`: the decode of ``decode`` into the locals
    the rules' fast forms read (:data:`~hurray_schema.rules.descriptor.dispatch.FAST_LOCALS`),
    then the plain-handle and empty-shape conditions the plan was chosen for, then the one
    expression of the plan's rules (:func:`~hurray_schema.rules.descriptor.dispatch.signature_pass_source`).
    Empty when the compiled descriptor's handles are not plain or no descriptor can pass."""
    q = desc.quantization
    sig = Signature(desc.layout.__class__, desc.rank, None if q is None else q.__class__,
                    None if q is None else q.scheme_version, len(desc.buffers), int(desc.type_tag),
                    frozenset(attr for attr, _, _ in _SECTIONS if getattr(desc, attr) is not None),
                    0 in desc.shape)
    if not plain_buffers(desc.buffers):
        return ""
    passes = signature_pass_source(sig)
    if passes is None:
        return ""
    for name, obj in sig.names.items():
        namespace[name] = obj
    namespace.update(_PLAIN_HANDLE_NAMES)
    locals_ = {"type_tag": exprs["type_tag"], "shape": exprs["shape"], "byte_offset": exprs["byte_offset"]}
    lines = [f"    {name} = {expr}" for name, expr in locals_.items()]
    empty = "0 in shape" if sig.empty else "0 not in shape"
    lines.append(f"    if not ({plain_buffers_source(handle_fields)} and {empty}):\n        return None")
    lines += [f"    h{i} = {_plain_handle(fields)}" for i, fields in enumerate(handle_fields)]
    lines.append("    buffers = (" + "".join(f"h{i}, " for i in range(len(handle_fields))) + ")")
    lines.append(f"    layout = {exprs[_LAYOUT.attribute]}")
    lines.append(f"    q = {exprs[_QUANTIZATION.attribute]}")
    lines += [f"    {attr} = {exprs[attr]}" for attr, _, _ in _SECTIONS]
    by_local = dict({name: name for name in locals_}, buffers="buffers", layout="layout", quantization="q",
                    **{attr: attr for attr, _, _ in _SECTIONS})
    args = [by_local[name] if name in by_local else exprs[name] for name in (f.name for f in attrs.fields(TensorDescriptor))]
    lines.append(f"    desc = _TD({', '.join(args)})")
    lines.append(f"    if not ({passes}):\n        return None")
    lines.append("    return desc")
    return head + "\n".join(lines) + "\n"


MAX_VALUES = 4096
"""Most descriptors remembered by value at once (decoded ones by their bytes, encoded ones
with their bytes); past it a table is emptied and fills again."""
MAX_VALUE_BYTES = 1024
"""Only descriptors of at most this many bytes are remembered (typical ones have a few
hundred), so the tables hold at most ``MAX_VALUES * MAX_VALUE_BYTES`` bytes of keys whatever
the input: a compiled header may declare a long descriptor (quantization padding)."""

_VALUES: dict = {}  # exact descriptor bytes -> the TensorDescriptor a compiled decoder made of them
_ENCODED: dict = {}  # id(descriptor) -> (descriptor, its wire bytes); the entry keeps the descriptor alive
_ACCEPTED: dict = {}
"""Exact descriptor bytes -> the descriptor every semantic rule passed on, within the default limits
(:func:`accepted`)."""
_PARSED: dict = {}
"""Exact descriptor bytes -> the descriptor their structural decode gave without a finding, within
the default limits (:func:`parsed`); every accepted descriptor is one."""
_TABLES_ON = [True]


def accepted(data) -> Optional[TensorDescriptor]:
    """The descriptor the bytes ``data`` (exactly one descriptor) were decoded to before, under the
    default limits, when every semantic rule passed on it; None when not known.  What
    :func:`~hurray_schema.codec.decode_descriptor` and :func:`~hurray_schema.codec.parse_descriptor`
    return for them in either mode, with no finding: one table lookup before any other work."""
    return _ACCEPTED.get(data)


def remember_accepted(data: bytes, desc: TensorDescriptor) -> None:
    """Keep ``desc`` as what the bytes ``data`` (exactly its descriptor) decode to, every rule passing
    within the default limits (bounded as the other tables)."""
    if _TABLES_ON[0] and len(data) <= MAX_VALUE_BYTES:
        if len(_ACCEPTED) >= MAX_VALUES:
            _ACCEPTED.clear()
        if len(_PARSED) >= MAX_VALUES:
            _PARSED.clear()
        _ACCEPTED[data] = _PARSED[data] = desc


def parsed(data) -> Optional[TensorDescriptor]:
    """The descriptor the bytes ``data`` (exactly one descriptor) were decoded to before, under the
    default limits, without a structural finding; None when not known.  What
    :func:`~hurray_schema.codec.parse_descriptor` returns for them in either mode, with no finding."""
    return _PARSED.get(data)


def remember_parsed(data: bytes, desc: TensorDescriptor) -> None:
    """Keep ``desc`` as the clean structural decode of the bytes ``data`` (exactly its descriptor)."""
    if _TABLES_ON[0] and len(data) <= MAX_VALUE_BYTES:
        if len(_PARSED) >= MAX_VALUES:
            _PARSED.clear()
        _PARSED[data] = desc


def use_value_tables(enabled: bool) -> bool:
    """Turn the by-value tables on or off, emptying them: :func:`decode_known`'s, the
    encoded-bytes table of :func:`encode` and the passed-descriptor table of the rules
    (:func:`hurray_schema.rules.descriptor.dispatch.remember_passed`); returns the previous
    setting.  Off, every call does the whole work (``benchmarks/decode.py`` measures both)."""
    previous = _TABLES_ON[0]
    _TABLES_ON[0] = bool(enabled)
    _VALUES.clear()
    _ENCODED.clear()
    _ACCEPTED.clear()
    _PARSED.clear()
    remember_passed(enabled)
    return previous


def decode_known(compiled: "CompiledDecoder", key: bytes, data) -> Optional[TensorDescriptor]:
    """``compiled.decode(data)``, where ``key`` is the descriptor's exact bytes
    (``data[:compiled.length]``).  Descriptors are immutable values, so equal bytes give the
    object decoded the first time (streams of small tensors repeat their descriptors: pages
    of one KV cache, the members of one composite shape); a table of :data:`MAX_VALUES`
    entries, emptied when full, so hostile input costs one entry per descriptor."""
    desc = _VALUES.get(key)
    if desc is None:
        desc = compiled.decode(data)
        if desc is not None and _TABLES_ON[0] and len(key) <= MAX_VALUE_BYTES:
            if len(_VALUES) >= MAX_VALUES:
                _VALUES.clear()
            _VALUES[key] = desc
    return desc


def decode_checked(compiled: "CompiledDecoder", key: bytes, data) -> Optional[TensorDescriptor]:
    """The descriptor of ``data`` (``key``: its exact bytes) when the decoder compiled for its
    header finds every semantic rule passing (:attr:`CompiledDecoder.checked`), else None (the
    caller takes the general path, which reports).  The object :func:`decode_known` keeps for
    these bytes is returned when it passed before; one checked here is kept for the next time
    (while the tables are on)."""
    desc = _VALUES.get(key)
    if desc is not None and passed(desc):
        return desc
    desc = compiled.checked(data)
    if desc is not None and _TABLES_ON[0] and len(key) <= MAX_VALUE_BYTES:
        if len(_VALUES) >= MAX_VALUES:
            _VALUES.clear()
        _VALUES[key] = desc
        mark_passed(desc, compiled.rememberable)
    return desc


_COMPILED: dict = {}  # header bytes -> CompiledDecoder
_SEEN: set = set()  # headers decoded cleanly once (compiled the second time)
_REFUSED: set = set()  # headers the general decoder keeps


lookup: Callable[[bytes], Optional[CompiledDecoder]] = _COMPILED.get
"""``lookup(header)``: the compiled decoder for these 20 header bytes, if one was made (the
table's own ``get``: it is called for every descriptor read, and the table is only ever
emptied in place)."""

remembered: Callable[[bytes], Optional[TensorDescriptor]] = _VALUES.get
"""``remembered(key)``: the descriptor :func:`decode_known` made of these exact bytes, if it is kept."""


def remember(header: bytes, desc: TensorDescriptor, data, length: int) -> None:
    """Note that ``desc`` is the clean general decode of ``data``; the second time a header is
    seen its decoder is compiled (a header seen once, as hostile input may make every header,
    costs one set entry).  Past :data:`MAX_SIGNATURES` every table is emptied and filling
    starts again, so memory stays bounded whatever the input."""
    if header in _COMPILED or header in _REFUSED:
        return
    if header not in _SEEN:
        if len(_COMPILED) + len(_SEEN) + len(_REFUSED) >= MAX_SIGNATURES:
            clear()
        _SEEN.add(header)
        return
    _SEEN.discard(header)
    try:
        compiled = compile_decoder(desc, length)
    except _NotCompilable:
        _REFUSED.add(header)
        return
    if compiled.decode(data) != desc:  # belt and braces: never keep a decoder that disagrees
        _REFUSED.add(header)
        return
    _COMPILED[header] = compiled


def clear() -> None:
    """Forget every signature, compiled encoder and remembered value (tests use it to compare both paths)."""
    _VALUES.clear()
    _ACCEPTED.clear()
    _PARSED.clear()
    _ENCODED.clear()
    _ENCODERS.clear()
    _BY_LAYOUT.clear()
    _LAST_HIT.clear()
    _COMPILED.clear()
    _SEEN.clear()
    _REFUSED.clear()


on_declare(clear)  # a decoder compiled with the rules of a plan is stale once another rule is declared


# --------------------------------------------------------------------------------------
# Encoders compiled per descriptor shape
# --------------------------------------------------------------------------------------


class _Expr:
    """Source text standing for a header value computed in the compiled encoder."""

    def __init__(self, source: str) -> None:
        self.source = source


class _Length:
    def __repr__(self) -> str:
        return "<descriptor_length>"


_LENGTH = _Length()  # stands for descriptor_length until the whole format is known


class _Packer:
    """Accumulates the struct format, the arguments and the guards of a compiled encoder."""

    def __init__(self) -> None:
        self.fmt = "<"
        self.args: list[str] = []
        self.guards: list[str] = []
        self.bound: list[str] = []  # "name = expression" lines before the guards
        self.unpacked: list[str] = []  # "a0, a1 = array" lines after the guards (lengths checked)

    def bind(self, expr: str) -> str:
        """A local name for ``expr`` (a part of the descriptor whose fields are read several times)."""
        name = f"o{len(self.bound)}"
        self.bound.append(f"{name} = {expr}")
        return name

    def table(self, decl, obj: str, constants: Optional[dict] = None, **context) -> None:
        """Append one declared table whose fields are read from ``obj`` (an expression)."""
        layout = plan(decl).flat_layout(**context)
        if layout is None:
            raise _NotCompilable(f"{decl} has self-dependent counts")
        fmt, slots = layout
        self.fmt += fmt
        for name, start, stop in slots:
            if constants and name in constants:
                value = constants[name]
                self.args.append(value.source if isinstance(value, _Expr) else repr(value))
            elif stop is None:
                self.args.append(f"{obj}.{name}")
            else:  # an array: packed with its own length by the general encoder, so it must match
                self.guards.append(f"len({obj}.{name}) != {stop - start}")
                items = [f"a{len(self.unpacked)}_{i}" for i in range(stop - start)]
                if items:
                    self.unpacked.append(f"{''.join(f'{item}, ' for item in items)}= {obj}.{name}")
                self.args.extend(items)  # plain positional arguments: no argument tuple built

    def raw(self, fmt: str, expr: str) -> None:
        self.fmt += fmt
        self.args.append(expr)


def encoder_key(desc: TensorDescriptor) -> tuple:
    """What fixes the wire layout of ``desc`` apart from its values (see :func:`compile_encoder`)."""
    q = desc.quantization
    return (desc.layout.__class__, len(desc.shape), len(desc.buffers), q.__class__,
            -1 if q is None else len(getattr(q, "padding", b"")), desc.shard is None, desc.statistics is None,
            desc.extension_type is None, desc.composite_member is None)


MISS = object()
"""What a compiled encoder returns for a descriptor of another :func:`encoder_key`."""


def _key_test(desc: TensorDescriptor) -> str:
    """Source of a test true when ``d`` has another :func:`encoder_key` than ``desc`` though
    the same layout class (the caller chose the encoder by that class)."""
    q = desc.quantization
    tests = [f"len(d.shape) != {len(desc.shape)}", f"len(buffers := d.buffers) != {len(desc.buffers)}"]
    if q is None:
        tests.append("d.quantization is not None")
    else:
        tests += ["(q := d.quantization).__class__ is not _scheme", f"len(q.padding) != {len(q.padding)}"]
    for attribute, _decl, _cls in _SECTIONS:
        absent = getattr(desc, attribute) is None
        tests.append(f"d.{attribute} is {'not None' if absent else 'None'}")
    return " or ".join(tests)


def compile_encoder(desc: TensorDescriptor) -> Callable:
    """``encode(desc) -> bytes | None | MISS`` for every descriptor with the :func:`encoder_key`
    of ``desc``: one ``struct.pack`` of every field (the constant ones written as literals),
    the arrays passed item by item.  It returns :data:`MISS` for a descriptor of another key
    with ``desc``'s layout class (it checks the key itself, so that the dispatch of
    :func:`encode` need not build one), and ``None`` (the caller then uses the general
    encoder, which also reports errors) when an array's length differs from the rank, a value
    does not fit its field, or the descriptor carries newer-minor trailing data."""
    layout = desc.layout
    cls = TABLE_LAYOUTS.get(layout.tag)
    if not isinstance(layout, (RowMajorLayout, ColumnMajorLayout)) and (cls is None or layout.__class__ is not cls):
        raise _NotCompilable(f"layout 0x{layout.tag:02X}")
    p = _Packer()
    rank = desc.rank
    presence = attrs.evolve(desc, unparsed_flags=0).flags  # the section bits the key fixes
    p.table(FIXED_HEADER, "d", dict(magic=MAGIC, descriptor_length=_LENGTH, layout_tag=int(layout.tag), rank=rank,
                                    flags=_Expr(f"{presence} | d.unparsed_flags" if presence else "d.unparsed_flags")))
    for part in CORE_PARTS:
        p.table(part.decl, "d", rank=rank)
    if cls is not None:
        p.table(_LAYOUT.tables[layout.tag], p.bind(f"d.{_LAYOUT.attribute}"), rank=rank)
    p.table(_BUFFER_TABLE.prefix, "d", {_BUFFER_TABLE.prefix_field: len(desc.buffers)})
    if desc.buffers:
        p.bound.append(f"({''.join(f'b{i}, ' for i in range(len(desc.buffers)))}) = buffers")  # counted by the key test
    for i in range(len(desc.buffers)):
        p.table(_BUFFER_TABLE.decl, f"b{i}")
    q = desc.quantization
    if q is not None:
        qcls = SCHEMES.get(getattr(q, "scheme", None))
        if qcls is None or q.__class__ is not qcls:
            raise _NotCompilable("unknown quantization scheme")
        decl = _QUANTIZATION.tables[qcls.scheme]
        size = plan(decl).fixed_size
        if size is None:
            raise _NotCompilable("quantization table of variable size")
        p.table(_QUANTIZATION.prefix, "d", {_QUANTIZATION.prefix_field: size + len(q.padding)})
        quantization = "q"  # bound by the key test
        p.table(decl, quantization, {_QUANTIZATION.chosen_by: int(qcls.scheme)})
        if q.padding:
            p.raw(f"{len(q.padding)}s", f"{quantization}.padding")
    for attr, decl, _ in _SECTIONS:
        if getattr(desc, attr) is not None:
            p.table(decl, p.bind(f"d.{attr}"), rank=rank)
    other_key = _key_test(desc)
    size = struct.calcsize(p.fmt)
    p.args = [str(size) if a == repr(_LENGTH) else a for a in p.args]
    calls = _pack_calls(p.fmt, p.args)
    shape_counted = f"len(d.shape) != {rank}"  # the key test's first
    guards = " or ".join(["d.trailing"] + [guard for guard in p.guards if guard != shape_counted])
    bound = "".join(f"    {line}\n" for line in p.bound)
    unpacked = "".join(f"    {line}\n" for line in p.unpacked)
    packed = " + ".join(f"_pack{i}({', '.join(args)})" for i, (_, args) in enumerate(calls))
    source = (f"def encode(d):\n    if {other_key}:\n        return _MISS\n{bound}    if {guards}:\n        return None\n{unpacked}    try:\n"
              f"        return {packed}\n    except _error:\n        return None\n")
    namespace = {"_error": (struct.error, OverflowError),  # a float too large for "f"
                 "_MISS": MISS, "_scheme": desc.quantization.__class__,
                 **{f"_pack{i}": codec.pack for i, (codec, _) in enumerate(calls)}}
    exec(compiled_code(source, f"<hurray_schema encoder {layout.tag:#04x}/rank {rank}>"), namespace)
    encode = namespace["encode"]
    encode.source = source
    return encode


MAX_PACK_ARGUMENTS = 30
"""Most values one generated ``pack`` call passes.  CPython 3.11 compiles a call with more
positional arguments than its stack-use guideline (30) into building a list of them and a
tuple from it; two calls and joining their bytes cost less than that."""

_FORMAT_TOKEN = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def _format_items(fmt: str) -> list:
    """The codes of ``fmt`` (a little-endian :mod:`struct` format), one per value it packs
    (``2Q`` is two ``Q``, ``4s`` one); pad bytes go with the value before them."""
    items: list = []
    lead = ""
    for count, code in _FORMAT_TOKEN.findall(fmt.lstrip("<")):
        if code == "x":
            if items:
                items[-1] += f"{count}x"
            else:
                lead += f"{count}x"
        elif code in "sp":
            items.append(f"{lead}{count}{code}")
            lead = ""
        elif count != "0":  # "0Q" (an array of rank 0) packs no value
            items.extend([lead + code] + [code] * (int(count or 1) - 1))
            lead = ""
    return items


def _pack_calls(fmt: str, args: list) -> list:
    """``(struct.Struct, argument sources)`` of each ``pack`` call that together give the
    bytes of ``fmt`` packed from ``args``, each taking at most :data:`MAX_PACK_ARGUMENTS`."""
    items = _format_items(fmt)
    if len(items) != len(args):
        raise _NotCompilable("the format and the arguments disagree")
    calls = [(struct.Struct("<" + "".join(items[i:i + MAX_PACK_ARGUMENTS])), args[i:i + MAX_PACK_ARGUMENTS])
             for i in range(0, max(len(args), 1), MAX_PACK_ARGUMENTS)]
    if sum(codec.size for codec, _ in calls) != struct.calcsize(fmt):  # pad bytes before no value at all
        raise _NotCompilable("the format has pad bytes no value carries")
    return calls


_ENCODERS: dict = {}  # encoder_key -> compiled encoder, or None where the general encoder is used
_BY_LAYOUT: dict = {}  # layout class -> the compiled encoders of its keys, as a tuple (at most MAX_SHAPES_PER_LAYOUT)
_LAST_HIT: dict = {}  # layout class -> the compiled encoder that encoded its last descriptor
MAX_SHAPES_PER_LAYOUT = 8
"""Most compiled encoders :func:`encode` tries by layout class before building the key."""


def encoder(general: Callable[[TensorDescriptor], bytes], name: str = "encode",
            module: str = __name__) -> Callable[[TensorDescriptor], bytes]:
    """``encode(desc) -> bytes``: the wire bytes of ``desc`` through the encoder compiled for
    its :func:`encoder_key` (compiled the first time, kept only if it gives the bytes
    ``general`` gives), else through ``general``.  The bytes of the last :data:`MAX_VALUES`
    descriptor objects encoded are kept with them (a frozen value encodes to the same bytes
    every time; a descriptor written to several containers, or written right after it was
    read, is encoded once).

    The compiled encoder that encoded the last descriptor of the same layout class is tried
    first (a writer mostly writes runs of descriptors of one shape), then the others of that
    class in turn (each tells a descriptor of another key by :data:`MISS`): cheaper than
    building and hashing the key of every descriptor; the key is only built when none of
    them is for ``desc``.  A closure over ``general``, so that a caller's encode is one call
    (``codec.encode_descriptor``), named ``name`` in ``module``."""
    encoded, tables_on, last_hit = _ENCODED, _TABLES_ON, _LAST_HIT

    def encode(desc: TensorDescriptor) -> bytes:
        if tables_on[0]:
            known = encoded.get(id(desc))
            if known is not None and known[0] is desc:
                return known[1]
        compiled = last_hit.get(desc.layout.__class__)
        data = MISS if compiled is None else compiled(desc)
        if data is MISS:
            data = _encode_by_layout(desc, general)
        elif data is None:
            return general(desc)
        if tables_on[0] and len(data) <= MAX_VALUE_BYTES:
            if len(encoded) >= MAX_VALUES:
                encoded.clear()
            encoded[id(desc)] = (desc, data)
        return data

    encode.__name__ = encode.__qualname__ = name
    encode.__module__ = module
    return encode


def encode(desc: TensorDescriptor, general: Callable[[TensorDescriptor], bytes]) -> bytes:
    """``encoder(general)(desc)``: the wire bytes of ``desc`` (see :func:`encoder`)."""
    return encoder(general)(desc)


def _encode_by_layout(desc: TensorDescriptor, general: Callable[[TensorDescriptor], bytes]) -> bytes:
    """The wire bytes of ``desc`` when the last encoder of its layout class was for another
    key: through the other compiled encoders of that class, else through its key."""
    layout_class = desc.layout.__class__
    for compiled in _BY_LAYOUT.get(layout_class, ()):
        data = compiled(desc)
        if data is not MISS:
            _LAST_HIT[layout_class] = compiled
            return general(desc) if data is None else data
    return _encode_by_key(desc, general)


def _encode_by_key(desc: TensorDescriptor, general: Callable[[TensorDescriptor], bytes]) -> bytes:
    key = encoder_key(desc)
    encoder = _ENCODERS.get(key, _ENCODERS)
    if encoder is _ENCODERS:  # not seen yet, or only with values the general encoder rejected
        encoder = _compile_checked(desc, general)
        if encoder is not _ENCODERS:
            if len(_ENCODERS) >= MAX_SIGNATURES:
                _ENCODERS.clear()
                _BY_LAYOUT.clear()
                _LAST_HIT.clear()
            _ENCODERS[key] = encoder
    if encoder is not None and encoder is not _ENCODERS:
        _try_first(desc.layout.__class__, encoder)  # new, or pushed out of the tuple by other keys
        data = encoder(desc)
        if data is not None:
            return data
    return general(desc)


def _try_first(layout_class: type, encoder: Callable) -> None:
    """Put ``encoder`` first among those :func:`encode` tries for ``layout_class``."""
    known = _BY_LAYOUT.get(layout_class, ())
    _BY_LAYOUT[layout_class] = (encoder,) + tuple(e for e in known if e is not encoder)[:MAX_SHAPES_PER_LAYOUT - 1]
    _LAST_HIT[layout_class] = encoder


def _compile_checked(desc: TensorDescriptor, general: Callable[[TensorDescriptor], bytes]):
    """The encoder for the shape of ``desc``; ``None`` if the shape stays with the general
    encoder; the ``_ENCODERS`` table itself (meaning "decide later") if ``desc``'s values do
    not encode, so that one bad descriptor does not decide for its whole shape."""
    try:
        encoder = compile_encoder(desc)
    except _NotCompilable:
        return None
    try:
        expected = general(desc)
    except Exception:  # noqa: BLE001 -- the general encoder reports it when called for real
        return _ENCODERS
    return encoder if encoder(desc) == expected else None
