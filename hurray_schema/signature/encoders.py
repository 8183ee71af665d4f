"""Encoders compiled per descriptor shape (:func:`encoder_key`): one ``struct.pack`` of every field,
the constant ones written as literals; :func:`encoder` dispatches a descriptor to the one of its
shape, compiling it the first time and keeping it only if it gives the bytes the general encoder
gives."""

from __future__ import annotations

import struct
from typing import Callable, Optional

import attrs

from ..codecache import compiled as compiled_code
from ..model import TensorDescriptor
from ..structs._declare import plan
from ..structs.descriptor import MAGIC
from ..structs.walker import HEADER_PART, NOTHING, SECTION_PARTS, walk_descriptor
from .formats import _CompilingVisitor, _fixed_size, _NotCompilable, _pack_calls
from ..memo import MEMO
from .tables import MAX_SHAPES_PER_LAYOUT, MAX_SIGNATURES, MAX_VALUE_BYTES

_BY_LAYOUT, _ENCODED, _ENCODERS, _LAST_HIT = MEMO.by_layout, MEMO.encoded, MEMO.encoders, MEMO.last_hit

__all__ = ["encoder_key", "compile_encoder", "encoder", "encode", "MISS"]


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
    for attribute in (part.attribute for part in SECTION_PARTS):
        absent = getattr(desc, attribute) is None
        tests.append(f"d.{attribute} is {'not None' if absent else 'None'}")
    return " or ".join(tests)


class _PackVisitor(_CompilingVisitor):
    """The encoder's source, as the walk of the parts visits ``desc``: each table the walk reaches
    is one more run of :class:`_Packer` arguments, read from the descriptor's objects (``d``, its
    layout and sections bound to names, ``b0``... its handles, ``q`` its quantization); the walk
    takes its decisions from ``desc``'s own values, as the encoder does."""

    def __init__(self, p: "_Packer", desc: TensorDescriptor):
        super().__init__(desc)
        self.p = p

    def table(self, part, decl, context: dict) -> dict:
        p, desc = self.p, self.desc
        if part is HEADER_PART:
            presence = attrs.evolve(desc, unparsed_flags=0).flags  # the section bits the key fixes
            flags = _Expr(f"{presence} | d.unparsed_flags" if presence else "d.unparsed_flags")
            p.table(decl, "d", dict(magic=MAGIC, descriptor_length=_LENGTH, layout_tag=int(desc.layout.tag),
                                    rank=desc.rank, flags=flags))
            return self.header_values()
        if decl is part.prefix:
            count = len(getattr(desc, part.attribute))
            p.table(decl, "d", {part.prefix_field: count})
            return {part.prefix_field: count}
        if part.head is not None:  # the scheme's table, the object bound by the key test
            p.table(decl, "q", {part.chosen_by: int(self.scheme_of(part).scheme)})
            return {}
        if part.value_class is None:
            p.table(decl, "d", **context)
        else:
            p.table(decl, p.bind(f"d.{part.attribute}"), **context)
        return {}

    def entries(self, part, count: int, context: dict) -> None:
        p = self.p
        if count:
            p.bound.append(f"({''.join(f'b{i}, ' for i in range(count))}) = buffers")  # counted by the key test
        for i in range(count):
            p.table(part.decl, f"b{i}")

    def sized(self, part, context: dict):
        size = _fixed_size(part.tables[self.scheme_of(part).scheme])
        padding = getattr(self.desc, part.attribute).padding
        self.p.table(part.prefix, "d", {part.prefix_field: size + len(padding)})
        return NOTHING

    def padding(self, part) -> None:
        padding = getattr(self.desc, part.attribute).padding
        if padding:
            self.p.raw(f"{len(padding)}s", "q.padding")


def compile_encoder(desc: TensorDescriptor) -> Callable:
    """``encode(desc) -> bytes | None | MISS`` for every descriptor with the :func:`encoder_key`
    of ``desc``: one ``struct.pack`` of every field (the constant ones written as literals),
    the arrays passed item by item.  It returns :data:`MISS` for a descriptor of another key
    with ``desc``'s layout class (it checks the key itself, so that the dispatch of
    :func:`encode` need not build one), and ``None`` (the caller then uses the general
    encoder, which also reports errors) when an array's length differs from the rank, a value
    does not fit its field, or the descriptor carries newer-minor trailing data."""
    layout = desc.layout
    p = _Packer()
    rank = desc.rank
    walk_descriptor(_PackVisitor(p, desc))
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


def encoder(general: Callable[[TensorDescriptor], bytes], name: str = "encode",
            module: str = __name__) -> Callable[[TensorDescriptor], bytes]:
    """``encode(desc) -> bytes``: the wire bytes of ``desc`` through the encoder compiled for
    its :func:`encoder_key` (compiled the first time, kept only if it gives the bytes
    ``general`` gives), else through ``general``.  The bytes of the last :data:`~hurray_schema.signature.MAX_VALUES`
    descriptor objects encoded are kept with them (a frozen value encodes to the same bytes
    every time; a descriptor written to several containers, or written right after it was
    read, is encoded once).

    The compiled encoder that encoded the last descriptor of the same layout class is tried
    first (a writer mostly writes runs of descriptors of one shape), then the others of that
    class in turn (each tells a descriptor of another key by :data:`MISS`): cheaper than
    building and hashing the key of every descriptor; the key is only built when none of
    them is for ``desc``.  A closure over ``general``, so that a caller's encode is one call
    (``codec.encode_descriptor``), named ``name`` in ``module``."""
    encoded, memo, last_hit = _ENCODED, MEMO, _LAST_HIT
    known_bytes = dict.get.__get__(encoded)  # the table is emptied in place, never replaced

    def encode(desc: TensorDescriptor) -> bytes:
        if memo.values_on:
            known = known_bytes(id(desc))  # IdentityTable.lookup, inline: every descriptor written comes here
            if known is not None and known[0] is desc:
                return known[1]
        compiled = last_hit.get(desc.layout.__class__)
        data = MISS if compiled is None else compiled(desc)
        if data is MISS:
            data = _encode_by_layout(desc, general)
        elif data is None:
            return general(desc)
        if memo.values_on and len(data) <= MAX_VALUE_BYTES:
            encoded.remember(desc, data)
        return data

    encode.__name__ = encode.__qualname__ = name
    encode.__module__ = module
    return encode


def compiled_encoder(desc: TensorDescriptor) -> Optional[Callable]:
    """The encoder compiled for the shape of ``desc`` (:func:`encoder_key`), if one is kept."""
    found = _ENCODERS.get(encoder_key(desc))
    return found if callable(found) else None


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
