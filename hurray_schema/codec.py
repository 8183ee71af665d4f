"""Decode and encode tensor descriptors.

Decoding walks the parts of a descriptor in the wire order of
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`
(``metadata.md § Overall Descriptor Structure``) with the fast plans derived from the
declarations in :mod:`hurray_schema.structs`: each part's declaration, gating flag,
descriptor attribute and value class come from that table.  It is bounded: nothing is read beyond
``descriptor_length`` and every count (rank, buffer_count, lengths) is checked against
the bytes that remain before anything is built for it.

Structural faults -- those after which the decoder cannot go on -- raise
:class:`~hurray_schema.errors.SpecViolation` naming a rule of
:mod:`hurray_schema.rules.structure`.  Where the spec lets a permissive reader keep the
input (an unknown tag, a newer minor version) the permissive decoder records a finding
and keeps the unknown part opaque.  The semantic rules of one descriptor run after the
structure is decoded (:func:`decode_descriptor`).
"""

from __future__ import annotations

import struct
from typing import Optional

import attrs

from . import signature
from .errors import SpecViolation  # noqa: F401  (re-exported name, documented above)
from .limits import DEFAULT_LIMITS, Limits, resolve_limits
from .memo import MEMO, Memo
from .model import (
    KNOWN_DESCRIPTOR_FLAGS, SCHEMES, TABLE_LAYOUTS, VALUE_CLASSES, DescriptorFlag, ExtensionLayout, LayoutTag,
    QuantScheme, TensorDescriptor, TiledLayout, UnknownLayout, UnknownQuantization, COLUMN_MAJOR, ROW_MAJOR,
    is_private_tag,
)
from .rules import structure as structure_rules
from .rules.descriptor import first_error
from .rules.engine import Finding, Mode, as_mode
from .structs import layouts, quantization
from .structs._declare import joined, plan, select, static_offset
from .structs.descriptor import (
    FIXED_HEADER, FIXED_HEADER_SIZE, MAGIC, MAX_RANK, SUPPORTED_VERSION_MAJOR, SUPPORTED_VERSION_MINOR,
)
from .structs.walker import (
    BUFFER_PART, HEADER_PART, LAYOUT_PART, QUANTIZATION_PART, RUNS, SECTION_PARTS, Choice,
    DescriptorVisitor,
)
from .structs.walker import NOTHING as _NOTHING
from .structs.walker import walk_descriptor as walk_parts
from .structs.element_types import RESERVED_TYPE_TAG, element_type_info
from .structs.tags import is_invalid_tag, is_reserved_tag
from .structs.wire import descriptor_spans, encode_descriptor_bytes

__all__ = ["Decoder", "DECODER", "decode_descriptor", "encode_descriptor", "parse_descriptor", "check_semantics",
           "peek_descriptor_length", "known_length", "checked_descriptor", "checked_by", "descriptor_spans"]


def _builder(cls):
    """Build ``cls`` from decoded wire values: attrs field names are the spec names."""
    fields = attrs.fields(cls)
    if any(f.kw_only for f in fields):  # the constructor must take the fields in order
        raise TypeError(f"{cls.__name__} has keyword-only fields")
    names = tuple(f.name for f in fields)

    def build(values: dict):
        return cls(*[values[name] for name in names])

    return build


_HEADER_PART, _LAYOUT_PART, _BUFFER_PART, _QUANTIZATION_PART = HEADER_PART, LAYOUT_PART, BUFFER_PART, QUANTIZATION_PART

_LAYOUT_BUILDERS = {
    tag: (plan(_LAYOUT_PART.tables[tag]), _builder(cls), f"{LayoutTag(tag).name.lower()} layout fields")
    for tag, cls in TABLE_LAYOUTS.items()
}
_SCHEME_BUILDERS = {
    tag: (plan(_QUANTIZATION_PART.tables[tag]), _builder(cls), f"{QuantScheme(tag).name.lower()} fields")
    for tag, cls in SCHEMES.items()
}

_HEADER = plan(FIXED_HEADER)
_MODES = {"strict": Mode.STRICT, "permissive": Mode.PERMISSIVE, Mode.STRICT: Mode.STRICT,
          Mode.PERMISSIVE: Mode.PERMISSIVE}
_BUFFER_COUNT = plan(_BUFFER_PART.prefix)
_HANDLE = plan(_BUFFER_PART.decl)
_HANDLE_FIELDS = _HANDLE.steps[0]
_NEW_HANDLE = VALUE_CLASSES[_BUFFER_PART.value_class]
_BUFFER_COUNT_CODEC = _BUFFER_COUNT.steps[0].codec
_BUFFER_COUNT_SIZE = _BUFFER_COUNT.fixed_size
_HEADER_NAMES, _HEADER_CODEC = _HEADER.steps[0].names, _HEADER.steps[0].codec
_TILED_DECL = _LAYOUT_PART.tables[LayoutTag.TILED]
_TILED = plan(_TILED_DECL)
_EXTENSION_HEAD = plan(layouts.EXTENSION_HEAD)
_QLEN = plan(_QUANTIZATION_PART.prefix)
_QHEADER = plan(_QUANTIZATION_PART.head)
_SCHEME_VERSION_AT = static_offset(_QUANTIZATION_PART.head, "scheme_version")
_build_tiled = _builder(TiledLayout)

_HAS_EXTENSION_TYPE = int(DescriptorFlag.HAS_EXTENSION_TYPE)

_AT = {name: static_offset(FIXED_HEADER, name) for name in ("magic", "version_major", "version_minor",
                                                             "descriptor_length", "flags", "type_tag",
                                                             "layout_tag", "rank")}
_LENGTH_FIELD = plan(select(FIXED_HEADER, "descriptor_length")).steps[0].codec


class _Reader:
    """Bounded cursor over one descriptor; offsets reported relative to ``base``."""

    __slots__ = ("view", "pos", "end", "base", "mode", "findings", "limits")

    def __init__(self, view: memoryview, end: int, base: int, mode: Mode, limits: Optional[Limits] = None):
        self.view = view
        self.pos = 0
        self.end = end
        self.base = base
        self.mode = mode
        self.findings: list[Finding] = []
        self.limits = limits if limits is not None else resolve_limits(limits)

    def at(self, pos: Optional[int] = None) -> int:
        return self.base + (self.pos if pos is None else pos)

    def read(self, p, what: str, **context) -> dict:
        """Decode one table with plan ``p``; a field past descriptor_length is a violation."""
        try:
            values, self.pos = p.unpack(self.view, self.pos, **context)
        except struct.error:
            raise structure_rules.LENGTH_BOUNDS.violation(
                f"{what} runs past descriptor_length ({self.end} bytes)", self.at()
            ) from None
        return values

    def take(self, n: int, what: str) -> bytes:
        if n > self.end - self.pos:
            raise structure_rules.LENGTH_BOUNDS.violation(
                f"{what} needs {n} bytes but only {self.end - self.pos} remain before descriptor_length",
                self.at(),
            )
        data = bytes(self.view[self.pos : self.pos + n])
        self.pos += n
        return data

    def tolerate(self, rule, message: str, pos: int) -> None:
        """A finding the permissive mode keeps; in strict mode it is raised."""
        finding = rule.finding(message, self.at(pos), self.mode)
        if not finding.tolerated:
            raise finding.to_violation()
        self.findings.append(finding)


def peek_descriptor_length(data, base: int = 0) -> int:
    """``descriptor_length`` from the first 10 bytes, after checking magic and minimum."""
    view = memoryview(data)
    if len(view) < FIXED_HEADER_SIZE:
        raise structure_rules.TRUNCATED.violation(
            f"a descriptor needs at least {FIXED_HEADER_SIZE} bytes, the input has {len(view)}", base + len(view)
        )
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise structure_rules.MAGIC.violation(
            f"magic is {bytes(view[:len(MAGIC)])!r}, not {MAGIC!r}", base + _AT["magic"]
        )
    (length,) = _LENGTH_FIELD.unpack_from(view, _AT["descriptor_length"])
    if length < FIXED_HEADER_SIZE:
        raise structure_rules.LENGTH_MINIMUM.violation(
            f"descriptor_length {length} is below the {FIXED_HEADER_SIZE}-byte fixed header",
            base + _AT["descriptor_length"],
        )
    return length


def known_length(header: bytes) -> Optional[int]:
    """``descriptor_length`` of the fixed header ``header`` (20 bytes) when a clean descriptor
    had exactly this header (its decoder is compiled): magic and length need no check again.
    None otherwise (:func:`peek_descriptor_length` then reads and checks them)."""
    compiled = signature.lookup(header)
    return None if compiled is None else compiled.length


def parse_descriptor(data, *, mode="strict", base: int = 0,
                     limits: Optional[Limits] = None) -> tuple[TensorDescriptor, list[Finding]]:
    """Decode the structure of the descriptor at the start of ``data``.

    Returns the descriptor and the findings a permissive reader tolerated.  Bytes after
    ``descriptor_length`` are not read (a stream carries the next tensor there).
    ``limits`` (default :data:`~hurray_schema.limits.DEFAULT_LIMITS`) bounds
    descriptor_length, rank, buffer_count and the tiled depth.
    """
    mode = _MODES.get(mode) or as_mode(mode)
    if limits is None and data.__class__ is bytes:
        desc = _parsed(data)
        if desc is not None:
            return desc, []
    limits = DEFAULT_LIMITS if limits is None else resolve_limits(limits)
    if data.__class__ is bytes:  # the common case: the first 20 bytes are the signature as they are
        header = data[:FIXED_HEADER_SIZE]
        desc = _decode_compiled(data, header, limits)
        if desc is not None:
            return desc, []
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if data.__class__ is not bytes:
        header = view[:FIXED_HEADER_SIZE].tobytes()
        desc = _decode_compiled(view, header, limits)
        if desc is not None:
            return desc, []
    desc, findings = _parse_general(view, mode, base, limits)
    if not findings:  # a clean decode: later descriptors with this header take the compiled path
        (length,) = _LENGTH_FIELD.unpack_from(view, _AT["descriptor_length"])
        signature.remember(header, desc, view, length)
    return desc, findings


def _decode_compiled(data, header: bytes, limits: Limits) -> Optional[TensorDescriptor]:
    """The descriptor from the decoder compiled for ``header`` (:mod:`hurray_schema.signature`),
    or None when there is none, the input is shorter, a limit is lower or a guard differs."""
    compiled = _compiled_for(header)
    if compiled is None:
        return None
    length = compiled.length
    if len(data) < length or not (compiled.fits_default if limits is DEFAULT_LIMITS else compiled.fits(limits)):
        return None
    key = data[:length] if data.__class__ is bytes else data[:length].tobytes()  # a bytes of exactly length is itself
    desc = _remembered(key)
    if desc is None:
        desc = signature.decode_known(compiled, key, data)
    if desc is not None and limits is DEFAULT_LIMITS:
        _remember_parsed(key, desc)
    return desc


_compiled_for = signature.lookup
_remembered = signature.remembered
_decode_checked = signature.decode_checked
_accepted = signature.accepted
_remember_accepted = signature.remember_accepted
_parsed = signature.parsed
_remember_parsed = signature.remember_parsed


def checked_descriptor(data, limits: Limits = DEFAULT_LIMITS) -> Optional[TensorDescriptor]:
    """The descriptor at the start of ``data`` when the decoder compiled for its header
    (:attr:`hurray_schema.signature.CompiledDecoder.checked`) decodes it within ``limits`` and
    finds every semantic rule passing: what :func:`decode_descriptor` returns then, in either
    mode, with no finding.  None otherwise (then decode it the general way, which reports)."""
    if data.__class__ is bytes:
        compiled = _compiled_for(data[:FIXED_HEADER_SIZE])
    else:
        data = memoryview(data)
        if data.format != "B" or data.ndim != 1:
            data = data.cast("B")
        compiled = _compiled_for(data[:FIXED_HEADER_SIZE].tobytes())
    if compiled is None or len(data) < compiled.length:
        return None
    length = compiled.length
    return checked_by(compiled, data[:length] if data.__class__ is bytes else data[:length].tobytes(), data, limits)


def checked_by(compiled, key: bytes, data, limits: Limits = DEFAULT_LIMITS) -> Optional[TensorDescriptor]:
    """The descriptor the checked decoder ``compiled`` (:attr:`~hurray_schema.signature.CompiledDecoder.checked`)
    gives for ``key`` (exactly its bytes, at the start of ``data``) within ``limits``, every rule passing;
    None otherwise.  Under the default limits it is kept for its bytes (:func:`~hurray_schema.signature.accepted`)."""
    if compiled.checked is None or not (compiled.fits_default if limits is DEFAULT_LIMITS else compiled.fits(limits)):
        return None
    desc = _decode_checked(compiled, key, data)
    if desc is not None and limits is DEFAULT_LIMITS:
        _remember_accepted(key, desc)
    return desc


def _parse_general(view, mode: Mode, base: int, limits: Limits) -> tuple[TensorDescriptor, list[Finding]]:
    """The general decoder: every structural rule checked, every part read in turn by
    the one walk of the parts (:func:`~hurray_schema.structs.walker.walk_descriptor`)."""
    length = peek_descriptor_length(view, base)
    if length > len(view):  # a fact about the input, reported before any configured limit
        raise structure_rules.TRUNCATED.violation(
            f"descriptor_length is {length} but only {len(view)} bytes are available", base + len(view)
        )
    if length > limits.max_descriptor_bytes:
        limits.check("max_descriptor_bytes", length, base + _AT["descriptor_length"])
    r = _Reader(view[:length], length, base, mode, limits)
    decoder = _Decoder(r)
    walk_parts(decoder)
    return TensorDescriptor(**decoder.fields), r.findings


def _check_header(r: _Reader, h: dict) -> None:
    if h["version_major"] > SUPPORTED_VERSION_MAJOR:
        raise structure_rules.VERSION_MAJOR.violation(
            f"version_major {h['version_major']} is newer than {SUPPORTED_VERSION_MAJOR}", r.at(_AT["version_major"])
        )
    if h["version_minor"] > SUPPORTED_VERSION_MINOR:
        r.tolerate(
            structure_rules.VERSION_MINOR,
            f"version_minor {h['version_minor']} is newer than {SUPPORTED_VERSION_MINOR}; its additions stay opaque",
            _AT["version_minor"],
        )
    reserved = h["flags"] & ~KNOWN_DESCRIPTOR_FLAGS
    if reserved and h["version_minor"] <= SUPPORTED_VERSION_MINOR:
        raise structure_rules.FLAGS_RESERVED.violation(
            f"reserved flag bits 0x{reserved:08X} are set", r.at(_AT["flags"])
        )
    if h["rank"] > MAX_RANK:
        raise structure_rules.RANK_CAP.violation(f"rank {h['rank']} exceeds {MAX_RANK}", r.at(_AT["rank"]))
    if h["rank"] > r.limits.max_rank:
        r.limits.check("max_rank", h["rank"], r.at(_AT["rank"]))
    _check_type_tag(r, h["type_tag"], h["flags"])
    tag = h["layout_tag"]
    if is_invalid_tag(tag):
        raise structure_rules.LAYOUT_TAG_INVALID.violation(
            f"layout_tag 0x{tag:02X} is invalid", r.at(_AT["layout_tag"])
        )


def _check_type_tag(r: _Reader, tag: int, flags: int) -> None:
    if is_invalid_tag(tag):
        raise structure_rules.TYPE_TAG_INVALID.violation(f"type_tag 0x{tag:02X} is invalid", r.at(_AT["type_tag"]))
    if element_type_info(tag) is not None:
        return
    if is_private_tag(tag) and flags & _HAS_EXTENSION_TYPE:
        return  # described inline by the extension type section (ADR-001)
    what = "reserved" if tag == RESERVED_TYPE_TAG or is_reserved_tag(tag) else "not a type this reader knows"
    r.tolerate(structure_rules.TYPE_TAG_UNKNOWN, f"type_tag 0x{tag:02X} is {what}", _AT["type_tag"])


_FIELDLESS_LAYOUTS = {layout.tag: layout for layout in (ROW_MAJOR, COLUMN_MAJOR)}


def _store_built(attribute: str, build):
    def store(fields: dict, values: dict) -> None:
        fields[attribute] = build(values)
    return store


def _table_readers() -> dict:
    """``id(decl) -> (plan, what, store, fixed)`` of every table the walk reads outside the fixed
    header: ``what`` names it in a violation; ``store(fields, values)`` puts its values
    into the descriptor's fields (``None``: a count or length the walk itself uses); ``fixed``
    the names and struct of a table that is one run of fixed fields (else ``None``)."""
    readers = {}
    for tag, (p, build, what) in _LAYOUT_BUILDERS.items():
        readers[id(_LAYOUT_PART.tables[tag])] = (p, what, _store_built(_LAYOUT_PART.attribute, build))
    readers[id(_TILED_DECL)] = (_TILED, "tiled layout fields", None)  # its levels are kept, then linked
    for part in SECTION_PARTS:
        build = _builder(VALUE_CLASSES[part.value_class])
        readers[id(part.decl)] = (plan(part.decl), part.label, _store_built(part.attribute, build))
    for part in (_BUFFER_PART, _QUANTIZATION_PART):
        readers[id(part.prefix)] = (plan(part.prefix), part.prefix_field, None)
    return {key: (p, what, store, _fixed_run(p)) for key, (p, what, store) in readers.items()}


def _fixed_run(p) -> Optional[tuple]:
    """``(names, struct)`` of a plan that is one run of fixed fields, else ``None``."""
    return None if p.fixed_size is None else (p.steps[0].names, p.steps[0].codec)


class _Decoder(DescriptorVisitor):
    """The general decoder as a visitor of the walk: reads each table with its fast plan
    through the bounded :class:`_Reader`, checks the structural rules where the walk reaches
    them, and gathers the :class:`~hurray_schema.model.TensorDescriptor` fields."""

    marks_parts = False

    def __init__(self, r: _Reader):
        self.r = r
        self.fields: dict = {}
        self.levels: list = []
        self.scheme: Optional[tuple] = None

    def table(self, part, decl, context: dict) -> dict:
        r = self.r
        if part is _HEADER_PART:  # 20 bytes are there (peek_descriptor_length)
            r.pos = _HEADER.fixed_size
            return dict(zip(_HEADER_NAMES, _HEADER_CODEC.unpack_from(r.view, 0)))
        if part is _QUANTIZATION_PART and decl is not part.prefix:
            return self._scheme_table(decl)
        p, what, store, fixed = _TABLE_READERS[id(decl)]
        if fixed is None:
            values = r.read(p, what, **context)
        else:  # one run of fixed fields: one struct call, bounded as r.read bounds it
            names, codec = fixed
            pos = r.pos
            if pos + codec.size > r.end:
                raise structure_rules.LENGTH_BOUNDS.violation(f"{what} runs past descriptor_length ({r.end} bytes)",
                                                              r.at())
            values = dict(zip(names, codec.unpack_from(r.view, pos)))
            r.pos = pos + codec.size
        if store is not None:
            store(self.fields, values)
        elif decl is _TILED_DECL:
            self.levels.append(values)
        return values

    def run(self, parts: tuple, context: dict) -> None:
        """The always-present one-table parts read with one joined plan (``shape`` and ``byte_offset``:
        a violation names them together, at the first one's offset)."""
        p, what, attributes = _RUNS[parts]
        values = self.r.read(p, what, **context)
        fields = self.fields
        for attribute in attributes:
            fields[attribute] = values[attribute]

    def header(self, h: dict) -> bool:
        r = self.r
        _check_header(r, h)
        self.h = h
        self.fields.update(type_tag=h["type_tag"], version_major=h["version_major"],
                           version_minor=h["version_minor"])
        return True

    def part(self, part, choice: Optional[Choice] = None):
        if choice is None:
            return _NOTHING
        if part is _LAYOUT_PART:
            if choice.decl is None:
                self.fields[part.attribute] = _FIELDLESS_LAYOUTS[choice.tag]
            elif choice.nested_by is not None:
                return _Linked(self, part.attribute)
        else:
            self._check_scheme_version(choice.tag)
        return _NOTHING

    def level(self, part, choice: Choice, depth: int):
        limits = self.r.limits
        if depth > limits.max_tiled_depth:
            raise structure_rules.TILED_DEPTH.violation(
                f"tiled layout nests deeper than {limits.max_tiled_depth} levels", self.r.at()
            )
        return _NOTHING

    def entries(self, part, count: int, context: dict) -> None:
        """The handles, read in one pass once the count is checked against the limit and
        the bytes that remain (``buffer-protocol.md § Buffer Handle``)."""
        r = self.r
        limits = r.limits
        if count > limits.max_buffer_count:
            limits.check("max_buffer_count", count, r.at(r.pos - _BUFFER_COUNT_SIZE))
        need = count * _HANDLE.fixed_size
        if need > r.end - r.pos:
            raise structure_rules.LENGTH_BOUNDS.violation(
                f"buffer_count {count} needs {need} bytes of handles, only {r.end - r.pos} remain", r.at()
            )
        self.fields[part.attribute] = _read_handles(r, count)

    def private(self, part, choice: Choice, context: dict) -> None:
        """An extension layout (``memory-layout.md § Extension Layouts``): kept, and tolerated
        by a permissive reader that does not know it."""
        r = self.r
        start = r.pos
        head = r.read(_EXTENSION_HEAD, "extension layout fields")
        data = r.take(head["extension_data_length"], "extension_data")
        tag = choice.tag
        r.tolerate(
            structure_rules.EXTENSION_LAYOUT_UNKNOWN,
            f"private layout 0x{tag:02X} with extension_layout_id {head['extension_layout_id']} is not known here",
            start,
        )
        self.fields[part.attribute] = ExtensionLayout(tag, head["extension_layout_id"], data)

    def unknown(self, part, tag: int) -> None:
        """An unknown layout: a permissive reader keeps the rest of the descriptor opaque."""
        r = self.r
        r.tolerate(structure_rules.LAYOUT_TAG_UNKNOWN, f"layout_tag 0x{tag:02X} is not a layout this reader knows",
                   _AT[part.chosen_by])
        self.fields[part.attribute] = UnknownLayout(tag, r.take(r.end - r.pos, "opaque layout payload"))
        self.fields["unparsed_flags"] = self.h["flags"]

    def sized(self, part, context: dict):
        """The quantization section: nothing is read beyond ``quantization_length``
        (``metadata.md § Quantization Section``)."""
        r = self.r
        qlen = r.read(_QLEN, part.prefix_field)[part.prefix_field]
        start = r.pos
        if qlen > r.end - start:
            raise structure_rules.LENGTH_BOUNDS.violation(
                f"quantization_length {qlen} runs past descriptor_length ({r.end - start} bytes remain)", r.at()
            )
        self.qlen, self.start, self.end = qlen, start, start + qlen
        self.section = r.view[:self.end]
        return _NOTHING

    def chosen_tag(self, part) -> int:
        try:
            self.head, _ = _QHEADER.unpack(self.section, self.start)
        except struct.error:
            raise structure_rules.QUANTIZATION_LENGTH.violation(
                f"quantization_length {self.qlen} is shorter than the {_QHEADER.fixed_size}-byte quantization header",
                self.r.at(self.start),
            ) from None
        tag = self.head[part.chosen_by]
        if is_invalid_tag(tag):
            raise structure_rules.SCHEME_TAG_INVALID.violation(f"scheme_tag 0x{tag:02X} is invalid",
                                                               self.r.at(self.start))
        return tag

    def _check_scheme_version(self, tag: int) -> None:
        version = self.head["scheme_version"]
        if version > quantization.HIGHEST_SCHEME_VERSION[tag]:
            raise structure_rules.SCHEME_VERSION.violation(
                f"scheme_version {version} of scheme 0x{tag:02X} is newer than "
                f"{quantization.HIGHEST_SCHEME_VERSION[tag]}", self.r.at(self.start + _SCHEME_VERSION_AT)
            )

    def _scheme_table(self, decl) -> dict:
        p, build, what = _SCHEME_BUILDERS[self.head["scheme_tag"]]
        try:
            values, self.r.pos = p.unpack(self.section, self.start)
        except struct.error:
            raise structure_rules.QUANTIZATION_LENGTH.violation(
                f"quantization_length {self.qlen} is shorter than the {p.fixed_size}-byte {what} table",
                self.r.at(self.start),
            ) from None
        self.scheme = (build, values)
        return values

    def unknown_sized(self, part, tag: int, context: dict) -> None:
        r = self.r
        r.tolerate(structure_rules.SCHEME_TAG_UNKNOWN, f"scheme_tag 0x{tag:02X} is not a scheme this reader knows",
                   self.start)
        r.pos = self.end
        payload = bytes(r.view[self.start + _QHEADER.fixed_size : self.end])
        head = self.head
        self.fields[part.attribute] = UnknownQuantization(tag, head["scheme_version"], head["flags"], payload)

    def padding(self, part) -> None:
        r = self.r
        if self.scheme is not None:
            build, values = self.scheme
            values["padding"] = bytes(r.view[r.pos:self.end])
            self.fields[part.attribute] = build(values)
        r.pos = self.end

    def trailing(self) -> None:
        r, h = self.r, self.h
        newer_minor = h["version_minor"] > SUPPORTED_VERSION_MINOR
        if r.pos < r.end:
            if not newer_minor:
                raise structure_rules.LENGTH_EXACT.violation(
                    f"{r.end - r.pos} bytes remain after the last section of a {h['version_major']}."
                    f"{h['version_minor']} descriptor", r.at()
                )
            self.fields["trailing"] = r.take(r.end - r.pos, "trailing fields")
        unparsed = h["flags"] & ~KNOWN_DESCRIPTOR_FLAGS if newer_minor else 0
        if unparsed:
            self.fields["unparsed_flags"] = unparsed


class _Linked:
    """Around a nesting layout: its levels, read in turn, linked inner to outer on the way out
    (``layouts/tiled.md § Recursive Tiling``)."""

    __slots__ = ("decoder", "attribute")

    def __init__(self, decoder: _Decoder, attribute: str):
        self.decoder, self.attribute = decoder, attribute

    def __enter__(self):
        self.decoder.levels = []
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            inner = None
            for values in reversed(self.decoder.levels):
                values["inner"] = inner
                inner = _build_tiled(values)
            self.decoder.fields[self.attribute] = inner


_TABLE_READERS = _table_readers()
_RUNS = {parts: (plan(joined(*[part.decl for part in parts])), " and ".join(part.name for part in parts),
                 tuple(part.attribute for part in parts)) for parts in RUNS}
"""Each run of always-present one-table parts: its joined plan, its name in a violation, its attributes."""


def _read_handles(r: _Reader, count: int) -> tuple:
    unpack = _HANDLE_FIELDS.codec.unpack_from
    size = _HANDLE.fixed_size
    view, pos = r.view, r.pos
    new = _NEW_HANDLE
    handles = tuple([new(*unpack(view, at)) for at in range(pos, pos + count * size, size)])
    r.pos = pos + count * size
    return handles


def decode_descriptor(data, *, mode="strict", limits: Optional[Limits] = None) -> TensorDescriptor:
    """Decode one tensor descriptor from the start of ``data``.

    ``mode="strict"`` raises :class:`~hurray_schema.errors.SpecViolation` on the first
    violation; ``"permissive"`` keeps what the spec lets a permissive reader keep
    (unknown tags, newer minor version) and still raises on every other violation.
    ``limits`` bounds sizes and depths (:class:`~hurray_schema.limits.Limits`); a breach
    raises :class:`~hurray_schema.errors.LimitExceeded`.
    """
    mode = _MODES.get(mode) or as_mode(mode)
    if data.__class__ is bytes and limits is None:  # the common case, spelled out: it is on every read
        desc = _accepted(data)
        if desc is not None:
            return desc
        compiled = _compiled_for(data[:FIXED_HEADER_SIZE])
        if compiled is not None and len(data) >= compiled.length:
            desc = checked_by(compiled, data[:compiled.length], data)
            if desc is not None:
                return desc
    else:
        desc = checked_descriptor(data, DEFAULT_LIMITS if limits is None else resolve_limits(limits))
        if desc is not None:
            return desc
    desc, _ = parse_descriptor(data, mode=mode, limits=limits)
    return check_semantics(desc, mode)


def check_semantics(desc: TensorDescriptor, mode="strict") -> TensorDescriptor:
    """``desc`` once the semantic rules of one descriptor (:mod:`hurray_schema.rules.descriptor`)
    pass; the first violation the mode does not tolerate is raised."""
    finding = first_error(desc, mode)
    if finding is not None:
        raise finding.to_violation()
    return desc


encode_descriptor = signature.encoder(encode_descriptor_bytes, name="encode_descriptor", module=__name__)
encode_descriptor.__doc__ = """The wire bytes of ``desc`` (``descriptor_length`` filled in).

Descriptors shaped like one encoded before (same layout, rank, buffer count, scheme,
sections) go through an encoder compiled for that shape (:func:`hurray_schema.signature.encoder`;
one function, not a wrapper around it: a writer encodes every descriptor)."""


class Decoder:
    """Bytes to a descriptor, through one object: :data:`DECODER`, which every reader, writer,
    the composite binder, the transport and ``audit`` decode through (the functions of this
    module are its hot paths, bound to it).

    Its :attr:`memo` (:class:`hurray_schema.memo.Memo`) holds every table the fast path keeps --
    the decoders compiled per header, the descriptors remembered by their bytes, the rules'
    plans per signature, the clean bindings of composites -- each bounded; :meth:`stats` shows
    them and :meth:`reset` forgets them all.  A descriptor decodes to the same value and the same
    findings whatever they hold."""

    __slots__ = ("memo",)

    def __init__(self, memo: Memo = MEMO):
        self.memo = memo

    def decode(self, data, mode="strict", limits: Optional[Limits] = None, *, base: int = 0,
               check: bool = True) -> tuple[TensorDescriptor, list[Finding]]:
        """The descriptor at the start of ``data`` and what the mode tolerated: the structural
        decode's findings, then -- with ``check`` -- the semantic rules' SHOULD-level and tolerated
        ones, in ``audit``'s order.  The first violation the mode does not tolerate raises
        (:class:`~hurray_schema.errors.SpecViolation`); ``limits`` bounds sizes and depths."""
        mode = _MODES.get(mode) or as_mode(mode)
        if not check:
            return parse_descriptor(data, mode=mode, base=base, limits=limits)
        desc = checked_descriptor(data, DEFAULT_LIMITS if limits is None else resolve_limits(limits))
        if desc is not None:
            return desc, []
        desc, tolerated = parse_descriptor(data, mode=mode, base=base, limits=limits)
        notes = list(tolerated)
        error = first_error(desc, mode, base=base, notes=notes)
        if error is not None:
            raise error.to_violation()
        return desc, notes

    def reset(self) -> None:
        """Forget everything the fast path keeps (the next descriptors take the general path first)."""
        self.memo.reset()

    def stats(self) -> dict[str, tuple[int, Optional[int], str]]:
        """Table name -> (entries held, bound or None, what it maps)."""
        return self.memo.stats()

    def use_value_tables(self, enabled: bool) -> bool:
        """Remember descriptors by their bytes (and encoded bytes by descriptor object) or not;
        returns the previous setting.  Off, every call does the whole work."""
        return self.memo.use_value_tables(enabled)


DECODER = Decoder()
"""The decoder every entry point of the package uses."""
