"""Decoders compiled per header signature: for one exact 20-byte fixed header, one function that
unpacks everything after it with a single :class:`struct.Struct` (:attr:`CompiledDecoder.decode`),
and one that also runs the semantic rules that can fire on that header
(:attr:`CompiledDecoder.checked`); :func:`remember` compiles a header the second time it is seen,
:func:`lookup` finds the decoder of a header, :func:`decode_known` and :func:`decode_checked` decode
through it (by exact bytes from the by-value table while it is on)."""

from __future__ import annotations

import struct
from typing import Callable, Optional

import attrs

from ..codecache import compiled as compiled_code
from ..limits import DEFAULT_LIMITS, Limits
from ..model import (
    VALUE_CLASSES, DeviceTag, TensorDescriptor,
)
from ..rules.descriptor.dispatch import (
    DescriptorContext, Signature, plain_buffers, plain_buffers_source, signature_pass_source,
)
from ..structs._declare import plan
from ..structs.walker import HEADER_PART, LAYOUT_PART, NOTHING, OPTIONAL_PARTS, walk_descriptor
from .constructors import _NEW_DESCRIPTOR, _constructor, slot_constructor
from .formats import (
    _BUFFER_TABLE, _HEADER_SIZE, _LAYOUT, _QUANTIZATION, _SECTIONS, _CompilingVisitor, _fixed_size, _NotCompilable,
    _items,
)
from ..memo import MEMO
from .tables import MAX_SIGNATURES, MAX_VALUE_BYTES, MAX_VALUES, clear

_COMPILED, _SEEN, _REFUSED, _VALUES, _ACCEPTED = MEMO.compiled, MEMO.seen, MEMO.refused, MEMO.values, MEMO.accepted

__all__ = ["CompiledDecoder", "compile_decoder", "lookup", "remember", "decode_known", "decode_checked", "remembered"]


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


class _SourceVisitor(_CompilingVisitor):
    """The decoder's source, as the walk of the parts visits a descriptor this header decoded to:
    each table the walk reaches appends its fields to the one struct format; the walk takes its
    decisions (flags, counts, tags) from the descriptor's own values, as the encoder does, and what
    the header does not fix (``buffer_count``, ``quantization_length``, the scheme) becomes a guard.
    Fills ``exprs`` (descriptor attribute -> expression) and ``handle_fields``; raises
    :class:`~.formats._NotCompilable` where the general decoder keeps a case to itself."""

    def __init__(self, src: _Source, desc: TensorDescriptor, exprs: dict):
        super().__init__(desc)
        self.src, self.exprs = src, exprs
        self.handle_fields: list = []
        for part in OPTIONAL_PARTS:
            exprs[part.attribute] = "None"  # a part the flags leave out

    def table(self, part, decl, context: dict) -> dict:
        desc, src = self.desc, self.src
        if part is HEADER_PART:  # the header is the signature itself
            return self.header_values()
        if decl is part.prefix:
            count = len(getattr(desc, part.attribute))
            src.guard(src.table(decl)[part.prefix_field], count)
            return {part.prefix_field: count}
        if part.head is not None:  # the table a sized part's tag chose (the quantization scheme)
            self._scheme(part, decl)
            return {}
        if part.value_class is None:
            self.exprs[part.attribute] = src.table(decl, **context)[part.attribute]
            return {part.attribute: getattr(desc, part.attribute)}
        obj = getattr(desc, part.attribute)
        self.exprs[part.attribute] = src.construct(type(obj), src.table(decl, **context))
        return {}

    def part(self, part, choice=None):
        if part is LAYOUT_PART and choice is not None and choice.decl is None:
            self.exprs[part.attribute] = self.src.constant("_LAYOUT", self.desc.layout)  # no layout-specific fields
        return super().part(part, choice)

    def entries(self, part, count: int, context: dict) -> None:
        handle_class = VALUE_CLASSES[part.value_class]
        self.handle_fields = [self.src.table(part.decl) for _ in range(count)]
        handles = [self.src.construct(handle_class, fields) for fields in self.handle_fields]
        self.exprs[part.attribute] = "(" + "".join(h + ", " for h in handles) + ")"

    def sized(self, part, context: dict):
        self.length = self.src.table(part.prefix)[part.prefix_field]
        return NOTHING

    def _scheme(self, part, decl) -> None:
        src, q = self.src, getattr(self.desc, part.attribute)
        exprs = src.table(decl)
        src.guard(exprs[part.chosen_by], q.scheme)
        src.guard(exprs["scheme_version"], q.scheme_version)
        src.guard(self.length, _fixed_size(decl) + len(q.padding))
        exprs["padding"] = src.bytes_field(len(q.padding)) if q.padding else "b''"
        self.exprs[part.attribute] = src.construct(type(q), exprs)

    def padding(self, part) -> None:
        pass  # read with the scheme's table (its length is a guard)


def _walk_source(src: _Source, desc: TensorDescriptor, exprs: dict) -> list:
    """Fill ``exprs`` through the walk of ``desc``'s parts; returns the handles' field expressions."""
    visitor = _SourceVisitor(src, desc, exprs)
    walk_descriptor(visitor)
    return visitor.handle_fields


def compile_decoder(desc: TensorDescriptor, length: int) -> CompiledDecoder:
    """The decoder of every descriptor sharing the fixed header of ``desc`` (``descriptor_length``
    ``length``).  Raises :class:`~.formats._NotCompilable` for what the general decoder keeps to itself:
    tiled and private layouts, unknown schemes, newer-minor trailing data."""
    if desc.unparsed_flags or desc.trailing:
        raise _NotCompilable("newer minor version")
    src = _Source()
    exprs = {"type_tag": src.constant("_TYPE_TAG", desc.type_tag),
             "version_major": str(int(desc.version_major)), "version_minor": str(int(desc.version_minor))}
    handle_fields = _walk_source(src, desc, exprs)
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
    return CompiledDecoder(namespace["decode"], source, length, desc.rank, len(desc.buffers), checked, checked_source)


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
    the rules' conditions read (:data:`~hurray_schema.rules.descriptor.dispatch.FAST_LOCALS`),
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
    conjunction = signature_pass_source(sig)
    if conjunction is None:
        return ""
    passes, reads_ctx = conjunction
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
    if reads_ctx:
        lines.append("    ctx = _CTX(desc)")
        namespace["_CTX"] = DescriptorContext
    lines.append(f"    if not ({passes}):\n        return None")
    lines.append("    return desc")
    return head + "\n".join(lines) + "\n"


lookup: Callable[[bytes], Optional[CompiledDecoder]] = _COMPILED.get
"""``lookup(header)``: the compiled decoder for these 20 header bytes, if one was made (the
table's own ``get``: it is called for every descriptor read, and the table is only ever
emptied in place)."""

remembered: Callable[[bytes], Optional[TensorDescriptor]] = _VALUES.get
"""``remembered(key)``: the descriptor :func:`decode_known` made of these exact bytes, if it is kept."""


def remember(header: bytes, desc: TensorDescriptor, data, length: int) -> None:
    """Note that ``desc`` is the clean general decode of ``data``; the second time a header is
    seen its decoder is compiled (a header seen once, as hostile input may make every header,
    costs one set entry).  Past :data:`~hurray_schema.signature.MAX_SIGNATURES` every table is emptied and filling
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


def decode_known(compiled: "CompiledDecoder", key: bytes, data) -> Optional[TensorDescriptor]:
    """``compiled.decode(data)``, where ``key`` is the descriptor's exact bytes
    (``data[:compiled.length]``).  Descriptors are immutable values, so equal bytes give the
    object decoded the first time (streams of small tensors repeat their descriptors: pages
    of one KV cache, the members of one composite shape); a table of :data:`~hurray_schema.signature.MAX_VALUES`
    entries, emptied when full, so hostile input costs one entry per descriptor."""
    desc = _VALUES.get(key)
    if desc is None:
        desc = compiled.decode(data)
        if desc is not None and MEMO.values_on and len(key) <= MAX_VALUE_BYTES:
            if len(_VALUES) >= MAX_VALUES:
                _VALUES.clear()
            _VALUES[key] = desc
    return desc


def decode_checked(compiled: "CompiledDecoder", key: bytes, data) -> Optional[TensorDescriptor]:
    """The descriptor of ``data`` (``key``: its exact bytes) when the decoder compiled for its
    header finds every semantic rule passing (:attr:`CompiledDecoder.checked`), else None (the
    caller takes the general path, which reports).  Bytes every rule passed on before (under the
    default limits: :func:`~.tables.accepted`) give the object kept for them; one checked here is
    kept as :func:`decode_known` keeps its objects (while the tables are on)."""
    desc = _ACCEPTED.get(key)
    if desc is not None:
        return desc
    desc = compiled.checked(data)
    if desc is not None and MEMO.values_on and len(key) <= MAX_VALUE_BYTES:
        if len(_VALUES) >= MAX_VALUES:
            _VALUES.clear()
        _VALUES[key] = desc
    return desc
