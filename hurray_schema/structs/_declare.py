"""How a wire table is declared, and the fast codec derived from the declaration.

A wire table is a :class:`construct.Struct` whose fields are made with :func:`field`:
each field carries its spec name, a one-line description in our own words and the
spec section it comes from (``doc`` / ``ref``, as in Kaitai Struct).  From that single
declaration this module derives:

* :func:`fields` -- the field list (name, construct, doc, ref, tags) for documentation
  and the annotated hex view; :func:`tags_of` -- the tag table of one field;
* :func:`static_offset` -- the byte offset of a field inside its table, where fixed;
* :class:`Plan` -- a fast decoder/encoder.  Runs of fixed-size fields are merged into
  one :class:`struct.Struct`; arrays whose length comes from the context
  (``this.rank``) and ``If`` branches are evaluated as they come.  ``construct``'s own
  ``parse``/``build`` remain available on every declaration and the tests check that
  both paths agree byte for byte.

Encoding checks every value against its declared width: a value the field cannot hold
(an integer out of range, a float too large for its format, a byte string of the wrong
length, a non-number) raises :class:`~hurray_schema.errors.FieldRangeError` naming the
field and its citation, never :class:`struct.error`.
"""

from __future__ import annotations

import operator as _operator
import re as _re
import struct as _struct
from typing import Any, Callable, Iterator, Optional

import construct

from ..errors import FieldRangeError

__all__ = ["power_of_two", "field", "reserved", "Valid", "ZERO", "Field", "fields", "tags_of", "valid_of", "select", "joined", "static_offset", "static_size", "Plan", "plan"]


def power_of_two_source(value: str) -> str:
    """The test of :func:`power_of_two` on ``value`` (an expression), as source: what the rules'
    conditions compile (``hurray_schema.rules.descriptor``)."""
    return f"({value} > 0 and {value} & ({value} - 1) == 0)"


def power_of_two(n: int) -> bool:
    """``n`` is a power of two (1, 2, 4, ...): the one test of every alignment and block size
    the spec wants a power of two (buffer handles, ``data_buffer_alignment``, ``min_alignment``,
    ``block_size``); its source is :func:`power_of_two_source`."""
    return n > 0 and n & (n - 1) == 0


class Valid:
    """What the spec allows a field's value to be, declared on the field (Kaitai's ``valid:``,
    construct's ``Rebuild`` for a length or count).

    * ``zero`` -- reserved: every byte is zero;
    * ``lowest`` / ``highest`` -- the value's range, either end open (``None``);
    * ``any_of`` -- the tag table (an ``IntEnum``) whose values are the only ones allowed;
    * ``power_of_two`` -- the value is a power of two (:func:`power_of_two`);
    * ``size_of`` / ``count_of`` -- the field holds the byte length / the number of entries
      of what it names (``"the whole descriptor"``, ``"buffer handles"``): an encoder derives
      it, a reader bounds what follows by it.

    Declarations only: the codec still decodes the field to a plain value, and the rules,
    the documentation and the Kaitai Struct schema read the constraint from here."""

    __slots__ = ("zero", "lowest", "highest", "any_of", "power_of_two", "size_of", "count_of")

    def __init__(self, *, zero: bool = False, lowest: Optional[int] = None, highest: Optional[int] = None,
                 any_of: Optional[type] = None, power_of_two: bool = False, size_of: Optional[str] = None,
                 count_of: Optional[str] = None):
        self.zero = zero
        self.power_of_two = power_of_two
        self.lowest = lowest
        self.highest = highest
        self.any_of = any_of
        self.size_of = size_of
        self.count_of = count_of

    @property
    def bounds(self) -> Optional[tuple]:
        """``(lowest, highest)`` where the declaration states a range, else ``None``."""
        if self.lowest is None and self.highest is None:
            return None
        return self.lowest, self.highest

    def source(self, value: str, width: Optional[int] = None) -> str:
        """The constraint on ``value`` (an expression) as source, true when it is met: what the
        rules of a declared field compile (``width``: the byte length of a reserved bytes field,
        None for a number)."""
        if self.zero:
            return f"{value} == {bytes(width)!r}" if width is not None else f"{value} == 0"
        tests = []
        if self.lowest is not None:
            tests.append(f"{value} >= {self.lowest}")
        if self.highest is not None:
            tests.append(f"{value} <= {self.highest}")
        if self.power_of_two:
            tests.append(power_of_two_source(value))
        if self.any_of is not None:
            tests.append(f"{value} in {tuple(sorted(int(m) for m in self.any_of))}")
        return "(" + " and ".join(tests) + ")" if tests else "True"

    def text(self) -> str:
        """The constraint in words, for the documentation ("" when there is none)."""
        if self.zero:
            return "all zero"
        words = []
        if self.lowest is not None and self.highest is not None:
            words.append(f"{self.lowest} to {self.highest}")
        elif self.lowest is not None:
            words.append(f">= {self.lowest}")
        elif self.highest is not None:
            words.append(f"<= {self.highest}")
        if self.power_of_two:
            words.append("a power of two")
        if self.any_of is not None:
            words.append("one of " + ", ".join(f"0x{int(m):02X}" for m in self.any_of))
        if self.size_of is not None:
            words.append(f"the byte length of {self.size_of}")
        if self.count_of is not None:
            words.append(f"the number of {self.count_of}")
        return "; ".join(words)


ZERO = Valid(zero=True)
"""The constraint of a reserved field."""


class Field(construct.Renamed):
    """A named construct field with its description, spec citation, tag table and constraint.

    ``tags`` is the ``IntEnum`` / ``IntFlag`` (:mod:`hurray_schema.structs.tags`) that gives
    the meaning of the field's value, or ``None``.  ``valid`` is what the spec allows the
    value to be (:class:`Valid`), or ``None``.  Both are metadata only: ``construct`` and
    :class:`Plan` still decode the field to a plain ``int``, and the rules check the values.
    """

    def __init__(self, name: str, subcon: construct.Construct, doc: str, ref: str, tags: Optional[type] = None,
                 valid: Optional[Valid] = None):
        super().__init__(subcon, newname=name, newdocs=doc)
        self.ref = ref
        self.tags = tags
        self.valid = valid

    @property
    def doc(self) -> str:
        return self.docs

    @property
    def bounds(self) -> Optional[tuple]:
        """``(lowest, highest)`` of the declared range, or ``None``."""
        return None if self.valid is None else self.valid.bounds

    @property
    def reserved(self) -> bool:
        """A reserved field: declared to hold zeros."""
        return self.valid is not None and self.valid.zero


def field(name: str, subcon: construct.Construct, doc: str, ref: str, tags: Optional[type] = None,
          bounds: Optional[tuple] = None, valid: Optional[Valid] = None) -> Field:
    """Declare one field of a spec table: ``name`` as in the spec, then its wire type;
    ``tags`` is the tag table its values come from, where it has one; ``valid`` what the
    spec allows its value to be; ``bounds`` the ``(lowest, highest)`` range the spec states,
    a shorthand for ``valid=Valid(lowest=..., highest=...)``."""
    if bounds is not None:
        valid = Valid(lowest=bounds[0], highest=bounds[1])
    return Field(name, subcon, doc, ref, tags, valid)


def reserved(name: str, subcon: construct.Construct, ref: str, doc: str = "Must be 0x00.") -> Field:
    """Declare a reserved field: it must hold zeros (:data:`ZERO`)."""
    return Field(name, subcon, doc, ref, None, ZERO)


def tags_of(decl: construct.Construct, name: str) -> Optional[type]:
    """The tag table attached to field ``name`` of ``decl`` (``None``: a plain number)."""
    for sub in fields(decl):
        if sub.name == name:
            return sub.tags
    raise KeyError(name)


def valid_source(decl: construct.Construct, name: str, value: str) -> str:
    """The constraint declared on field ``name`` of ``decl`` as source over ``value`` (an
    expression), true when it is met (:meth:`Valid.source`): a rule whose condition is the
    field's declaration compiles this, so the two cannot differ."""
    for sub in fields(decl):
        if sub.name == name:
            if sub.valid is None:
                raise KeyError(f"{name} declares no constraint")
            width = sub.subcon.sizeof() if sub.valid.zero and isinstance(sub.subcon, construct.Bytes) else None
            return sub.valid.source(value, width)
    raise KeyError(name)


def valid_of(decl: construct.Construct, name: str) -> Optional[Valid]:
    """The constraint declared on field ``name`` of ``decl`` (``None``: none declared)."""
    for sub in fields(decl):
        if sub.name == name:
            return sub.valid
    raise KeyError(name)


def fields(decl: construct.Construct) -> Iterator[Field]:
    """The declared fields of a table, in wire order (conditional ones included)."""
    for sub in decl.subcons:
        if isinstance(sub, Field):
            yield sub


def select(decl: construct.Construct, *names: str) -> construct.Struct:
    """A table made of some fields of ``decl`` (same declarations, same order)."""
    chosen = [sub for sub in decl.subcons if getattr(sub, "name", None) in names]
    if len(chosen) != len(names):
        raise KeyError(names)
    return construct.Struct(*chosen)


def joined(*decls: construct.Construct) -> construct.Struct:
    """One table made of the fields of ``decls``, in order (same declarations)."""
    return construct.Struct(*[sub for decl in decls for sub in decl.subcons])


def static_size(sub: construct.Construct) -> int | None:
    """Byte size of a construct when it does not depend on the context, else None."""
    try:
        return sub.sizeof()
    except (construct.SizeofError, AttributeError, KeyError):
        return None


def static_offset(decl: construct.Construct, name: str) -> int:
    """Byte offset of field ``name`` inside ``decl``; every preceding field must be fixed."""
    offset = 0
    for sub in decl.subcons:
        if getattr(sub, "name", None) == name:
            return offset
        size = static_size(sub)
        if size is None:
            raise ValueError(f"{name!r} follows a variable-size field in {decl!r}")
        offset += size
    raise KeyError(name)


# --------------------------------------------------------------------------------------
# The derived fast codec
# --------------------------------------------------------------------------------------


def _format_char(sub: construct.Construct) -> str | None:
    """struct-module format character of a little-endian fixed field, if it has one."""
    if isinstance(sub, construct.Const):  # the value is checked by a named rule, not here
        return _format_char(sub.subcon)
    if isinstance(sub, construct.Rebuild):  # a length or count: the fast codec packs the value it is given
        return _format_char(sub.subcon)
    if isinstance(sub, construct.FormatField):
        return sub.fmtstr[1:]
    if isinstance(sub, construct.Bytes) and isinstance(sub.length, int):
        return f"{sub.length}s"
    return None


_FORMAT_CHARS = _re.compile(r"(\d*)([a-zA-Z?])")


def _split_format(fmt: str) -> list[str]:
    """One struct format character (with its count, for ``s``) per field of a run."""
    return [count + char if char == "s" else char for count, char in _FORMAT_CHARS.findall(fmt)]


def _width(char: str) -> str:
    """A format character in words, for error messages."""
    if char.endswith("s"):
        return f"{char[:-1]}-byte string"
    bits = 8 * _struct.calcsize("<" + char)
    if char in "efd":
        return f"float{bits}"
    return f"{'u' if char.isupper() else ''}int{bits}"


def _value_fault(char: str, value) -> str | None:
    """Why ``value`` does not fit a field of format ``char``, or None if it does."""
    if char.endswith("s"):
        try:
            length = memoryview(value).nbytes
        except TypeError:
            return f"is a {type(value).__name__}, not bytes"
        n = int(char[:-1] or 1)
        return None if length == n else f"is {length} bytes long"
    try:
        _struct.pack("<" + char, value)
    except OverflowError:
        return "is too large"
    except _struct.error:
        if char not in "efd" and not hasattr(value, "__index__"):
            return f"is a {type(value).__name__}, not an integer"
        if char in "efd":
            return f"is a {type(value).__name__}, not a number"
        return "is out of range"
    return None


class _Fixed:
    """A run of consecutive fixed-size fields decoded with one struct.Struct."""

    __slots__ = ("names", "codec", "size", "chars", "byte_fields")

    def __init__(self, names: list[str], fmt: str):
        self.names = tuple(names)
        self.codec = _struct.Struct("<" + fmt)
        self.size = self.codec.size
        self.chars = tuple(_split_format(fmt))
        # struct pads or cuts a byte string silently: those fields are checked before packing
        self.byte_fields = tuple((name, char) for name, char in zip(self.names, self.chars) if char.endswith("s"))

    def unpack(self, buf, offset: int, out: dict) -> int:
        out.update(zip(self.names, self.codec.unpack_from(buf, offset)))
        return offset + self.size

    def check_bytes(self, values: dict) -> None:
        for name, char in self.byte_fields:
            if _value_fault(char, values[name]) is not None:
                raise _struct.error(f"{name} does not fit {char}")

    def pack(self, values: dict, parts: list) -> None:
        if self.byte_fields:
            self.check_bytes(values)
        parts.append(self.codec.pack(*[values[n] for n in self.names]))

    def fault(self, values: dict):
        """``(name, value, format, why)`` of the first field whose value does not fit."""
        for name, char in zip(self.names, self.chars):
            why = _value_fault(char, values.get(name))
            if why is not None:
                return name, values.get(name), char, why
        return None


class _Array:
    """An array of one fixed-size element type whose count comes from the context."""

    __slots__ = ("name", "count", "char", "itemsize", "_cache")

    def __init__(self, name: str, count: Callable[[dict], int], char: str):
        self.name = name
        self.count = count
        self.char = char
        self.itemsize = _struct.calcsize("<" + char)
        self._cache: dict[int, _struct.Struct] = {}

    def _codec(self, n: int) -> _struct.Struct:
        codec = self._cache.get(n)
        if codec is None:
            codec = self._cache[n] = _struct.Struct(f"<{n}{self.char}")
        return codec

    def unpack(self, buf, offset: int, out: dict) -> int:
        codec = self._codec(self.count(out))
        out[self.name] = codec.unpack_from(buf, offset)
        return offset + codec.size

    def pack(self, values: dict, parts: list) -> None:
        items = values[self.name]
        parts.append(self._codec(len(items)).pack(*items))

    def fault(self, values: dict):
        items = values.get(self.name)
        try:
            items = list(items)
        except TypeError:
            return self.name, items, self.char, f"is a {type(items).__name__}, not a sequence"
        for i, item in enumerate(items):
            why = _value_fault(self.char, item)
            if why is not None:
                return f"{self.name}[{i}]", item, self.char, why
        return None


class _VarBytes:
    """A byte string whose length comes from an earlier field (``Bytes(this.x_length)``)."""

    __slots__ = ("name", "count")

    def __init__(self, name: str, count: Callable[[dict], int]):
        self.name = name
        self.count = count

    def unpack(self, buf, offset: int, out: dict) -> int:
        n = self.count(out)
        end = offset + n
        if n < 0 or end > len(buf):
            raise _struct.error(f"{self.name} needs {n} bytes at offset {offset}")
        out[self.name] = bytes(buf[offset:end])
        return end

    def pack(self, values: dict, parts: list) -> None:
        data = bytes(values[self.name])
        if len(data) != self.count(values):
            raise _struct.error(f"{self.name} is {len(data)} bytes, its length field says {self.count(values)}")
        parts.append(data)

    def fault(self, values: dict):
        value = values.get(self.name)
        try:
            length, expected = len(bytes(value)), self.count(values)
        except (TypeError, ValueError):
            return self.name, value, "s", f"is a {type(value).__name__}, not bytes"
        if length != expected:
            return self.name, value, f"{expected}s", f"is {length} bytes long, its length field says {expected}"
        return None


class _If:
    """A field present only when a condition on earlier fields holds."""

    __slots__ = ("name", "cond", "inner")

    def __init__(self, name: str, cond: Callable[[dict], bool], inner: "Plan"):
        self.name = name
        self.cond = cond
        self.inner = inner

    def unpack(self, buf, offset: int, out: dict) -> int:
        if self.cond(out):
            return self.inner.unpack_into(buf, offset, out)
        out[self.name] = None
        return offset

    def pack(self, values: dict, parts: list) -> None:
        if self.cond(values):
            self.inner.pack_into(values, parts)

    def fault(self, values: dict):
        try:
            present = self.cond(values)
        except (KeyError, TypeError):
            return None
        return self.inner.fault(values) if present else None


_FLAT_CACHE_SIZE = 256
"""Most count combinations a plan keeps a compiled struct for (ranks 0-64 fit easily)."""


def _getter(expr):
    """``this.name`` as a plain item getter (same result on a dict, without construct's
    expression machinery); any other callable unchanged."""
    if isinstance(expr, construct.expr.Path):
        match = _re.fullmatch(r"this\['(\w+)'\]", repr(expr))
        if match:
            return _operator.itemgetter(match.group(1))
    return expr


class Plan:
    """Fast decoder/encoder derived from a declaration made of :func:`field` entries.

    Supported constructs: integer/float ``FormatField``, fixed ``Bytes``, ``Bytes`` whose
    length is an earlier field, ``Array`` of a ``FormatField`` with a context-dependent
    count, ``If`` around any of those.  Anything
    else is decoded by the caller (the descriptor codec dispatches on tags itself).
    """

    def __init__(self, decl: construct.Construct):
        self.decl = decl
        self.steps: list = []
        self.citations = {sub.name: sub.ref for sub in decl.subcons if isinstance(sub, Field)}
        run_names: list[str] = []
        run_fmt = ""
        for sub in decl.subcons:
            name = sub.name
            inner = sub.subcon if isinstance(sub, construct.Renamed) else sub
            char = _format_char(inner)
            if char is not None:
                run_names.append(name)
                run_fmt += char
                continue
            if run_names:
                self.steps.append(_Fixed(run_names, run_fmt))
                run_names, run_fmt = [], ""
            self.steps.append(self._variable_step(name, inner))
        if run_names:
            self.steps.append(_Fixed(run_names, run_fmt))
        self._has_condition = any(step.__class__ not in (_Fixed, _Array) for step in self.steps)
        self._flat: dict = {}
        self._counts = tuple(step.count for step in self.steps if step.__class__ is _Array)
        self._single = self._counts[0] if len(self._counts) == 1 else None
        self.fixed_size = (
            self.steps[0].size if len(self.steps) == 1 and isinstance(self.steps[0], _Fixed) else None
        )
        self._fixed = self.steps[0] if self.fixed_size is not None else None

    @staticmethod
    def _variable_step(name: str, inner: construct.Construct):
        if isinstance(inner, construct.Array):
            char = _format_char(inner.subcon)
            if char is None:
                raise TypeError(f"unsupported array element in {name!r}")
            count = inner.count
            return _Array(name, _getter(count) if callable(count) else (lambda _ctx, n=count: n), char)
        if isinstance(inner, construct.Bytes) and callable(inner.length):
            return _VarBytes(name, _getter(inner.length))
        if isinstance(inner, construct.IfThenElse) and inner.elsesubcon is construct.Pass:
            return _If(name, inner.condfunc, Plan(construct.Struct(field(name, inner.thensubcon, "", ""))))
        raise TypeError(f"unsupported construct {type(inner).__name__} in field {name!r}")

    def unpack_into(self, buf, offset: int, out: dict) -> int:
        for step in self.steps:
            offset = step.unpack(buf, offset, out)
        return offset

    def _flat_codec(self, context: dict):
        """One struct.Struct for the whole table once array counts are known from the
        context, cached per count tuple; ``None`` when a count or condition depends on a
        field of the table itself."""
        if self._has_condition:
            return None
        try:
            if self._single is not None:  # the common case: one count (``rank``)
                counts = self._single(context)
            else:
                counts = tuple([count(context) for count in self._counts])
        except (KeyError, TypeError):
            return None
        entry = self._flat.get(counts)
        if entry is None:
            if self._single is not None:
                counts = (counts,)
            fmt, slots, index, it = "<", [], 0, iter(counts)
            for step in self.steps:
                if step.__class__ is _Fixed:
                    fmt += step.codec.format[1:]
                    for name in step.names:
                        slots.append((name, index, None))
                        index += 1
                else:
                    n = next(it)
                    fmt += f"{n}{step.char}"
                    slots.append((step.name, index, index + n))
                    index += n
            entry = (_struct.Struct(fmt), tuple(slots))
            if len(self._flat) < _FLAT_CACHE_SIZE:  # counts come from input: keep the cache bounded
                self._flat[counts[0] if self._single is not None else counts] = entry
        return entry

    def numpy_dtype(self):
        """The table as a packed NumPy structured dtype (little-endian, one field per declared
        field, ``S<n>`` for fixed bytes), for reading many copies of it at once; only for a
        table of fixed size."""
        import numpy as np

        if self._fixed is None:
            raise TypeError("only a fixed-size table has a NumPy dtype")
        fields = []
        for name, char in zip(self._fixed.names, self._fixed.chars):
            size = _struct.calcsize("<" + char)
            if char.endswith("s"):
                fields.append((name, f"S{size}"))
            elif char in "efd":
                fields.append((name, f"<f{size}"))
            else:
                fields.append((name, f"<{'i' if char.islower() else 'u'}{size}"))
        dtype = np.dtype(fields)
        assert dtype.itemsize == self.fixed_size, (dtype, self.fixed_size)
        return dtype

    def flat_layout(self, **context: Any):
        """``(format, slots)`` of the whole table as one run once ``context`` fixes every
        count: ``format`` is a :mod:`struct` format without its byte-order prefix, each slot
        is ``(name, start, stop)`` into the unpacked tuple (``stop`` None for a scalar).
        ``None`` when a count or a condition depends on the table's own fields."""
        if self._fixed is not None:
            return self._fixed.codec.format[1:], tuple((n, i, None) for i, n in enumerate(self._fixed.names))
        flat = self._flat_codec(context)
        if flat is None:
            return None
        codec, slots = flat
        return codec.format[1:], slots

    def unpack(self, buf, offset: int = 0, **context: Any) -> tuple[dict, int]:
        """Decode at ``offset``; ``context`` supplies outside values such as ``rank``."""
        out = context
        fixed = self._fixed
        if fixed is not None:
            out.update(zip(fixed.names, fixed.codec.unpack_from(buf, offset)))
            return out, offset + fixed.size
        flat = self._flat_codec(context)
        if flat is None:
            for step in self.steps:
                offset = step.unpack(buf, offset, out)
            return out, offset
        codec, slots = flat
        values = codec.unpack_from(buf, offset)
        for name, start, stop in slots:
            out[name] = values[start] if stop is None else values[start:stop]
        return out, offset + codec.size

    def size(self, **context: Any) -> int:
        """Encoded size for the given context (counts and conditions resolved)."""
        if self.fixed_size is not None:
            return self.fixed_size
        return len(self.pack(**context))

    def pack_into(self, values: dict, parts: list) -> None:
        for step in self.steps:
            step.pack(values, parts)

    def pack(self, **values: Any) -> bytes:
        """The wire bytes of ``values``; a value its field cannot hold raises
        :class:`~hurray_schema.errors.FieldRangeError` naming the field."""
        try:
            fixed = self._fixed
            if fixed is not None:
                if fixed.byte_fields:
                    fixed.check_bytes(values)
                return fixed.codec.pack(*[values[n] for n in fixed.names])
            parts: list[bytes] = []
            self.pack_into(values, parts)
            return b"".join(parts)
        except (_struct.error, OverflowError) as exc:
            raise self.range_error(values, exc) from None

    def fault(self, values: dict):
        """``(field, value, format, why)`` of the first value its field cannot hold, or None."""
        for step in self.steps:
            found = step.fault(values)
            if found is not None:
                return found
        return None

    def range_error(self, values: dict, exc: Exception) -> FieldRangeError:
        """The typed error for a failed pack of ``values`` (``exc`` what struct said)."""
        found = self.fault(values)
        if found is None:
            return FieldRangeError(None, None, None, str(exc))
        name, value, char, why = found
        citation = self.citations.get(name.split("[")[0])
        return FieldRangeError(name, value, _width(char), why, citation)


def plan(decl: construct.Construct) -> Plan:
    """The fast codec of a declaration, built once and kept on the declaration itself
    (so a table built at run time takes its plan with it when it goes)."""
    p = decl.__dict__.get("_fast_plan")
    if p is None:
        p = decl._fast_plan = Plan(decl)
    return p
