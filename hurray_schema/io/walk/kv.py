"""The KV metadata section of a file (``file-format.md § KV Metadata Section``): its one walk
(:func:`walk_kv`: located parts, or under ``RAISE`` the reader's decode, :func:`decode_kv`) and
its encoding (:func:`encode_kv`)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ...errors import FieldRangeError, HurraySchemaError
from ...limits import DEFAULT_LIMITS, Limits
from ...rules import container as container_rules
from ...rules.engine import Mode
from ...structs._declare import Plan, plan, static_offset
from ...structs.file import (
    KV_ARRAY_HEADER, KV_COUNT, KV_KEY_LENGTH, KV_LENGTH_PREFIX, KV_SCALAR_VALUES, KV_TYPES_REF, KV_VALUE_TAG, KvTag,
)
from ...structs.tags import is_private_tag
from .common import ENTRY, ENTRY_START, FAULT, NAME, TABLE, VALUE, Faults, Part, as_view, fault

__all__ = ["UInt64", "encode_kv", "decode_kv", "walk_kv"]

_COUNT = plan(KV_COUNT)
_KEY_LEN = plan(KV_KEY_LENGTH)
_TAG = plan(KV_VALUE_TAG)
_LEN = plan(KV_LENGTH_PREFIX)
_ARRAY = plan(KV_ARRAY_HEADER)
_ELEMENT_TAG_AT = _TAG.fixed_size + static_offset(KV_ARRAY_HEADER, "element_tag")
_ELEMENT_COUNT_AT = _TAG.fixed_size + static_offset(KV_ARRAY_HEADER, "element_count")
"""Where an array's element_tag and element_count sit from its value tag."""
_SCALARS = {tag: plan(decl) for tag, decl in KV_SCALAR_VALUES.items()}
_MIN_PAYLOAD = {KvTag.STRING: _LEN.fixed_size, KvTag.BYTES: _LEN.fixed_size,
                **{tag: p.fixed_size for tag, p in _SCALARS.items()}}
"""Value tag of every non-array KV type -> the fewest payload bytes it takes."""
_ELEMENT_TAGS = f"0x{min(_MIN_PAYLOAD):02X}-0x{max(_MIN_PAYLOAD):02X}"
"""The value tags an array element may carry, as messages name them (every type but array)."""


class UInt64(int):
    """An int written (and read back) with value tag ``KvTag.UINT64`` rather than ``KvTag.INT64``."""

    def __new__(cls, value: int):
        value = int(value)
        if not 0 <= value < 1 << 64:
            raise FieldRangeError("UInt64", value, "uint64", "is out of range", KV_TYPES_REF)
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"UInt64({int(self)})"


# --------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------


def _scalar_tag(value) -> KvTag:
    if isinstance(value, bool):
        return KvTag.BOOL
    if isinstance(value, UInt64):
        return KvTag.UINT64
    if isinstance(value, int):
        if -(1 << 63) <= value < 1 << 63:
            return KvTag.INT64
        if 0 <= value < 1 << 64:
            return KvTag.UINT64
        raise HurraySchemaError(f"KV integer {value} fits neither int64 nor uint64")
    if isinstance(value, float):
        return KvTag.FLOAT64
    if isinstance(value, str):
        return KvTag.STRING
    if isinstance(value, (bytes, bytearray, memoryview)):
        return KvTag.BYTES
    raise HurraySchemaError(f"KV value of type {type(value).__name__} has no value tag")


def _payload(tag: KvTag, value) -> bytes:
    if tag == KvTag.STRING:
        data = value.encode("utf-8")
        return _LEN.pack(length=len(data)) + data
    if tag == KvTag.BYTES:
        data = bytes(value)
        return _LEN.pack(length=len(data)) + data
    if tag == KvTag.BOOL:
        return _SCALARS[tag].pack(value=int(bool(value)))
    return _SCALARS[tag].pack(value=value)


def _encode_value(value) -> bytes:
    if isinstance(value, (list, tuple)):
        if not value:
            raise HurraySchemaError("an empty KV array has no element type to write")
        tags = {_scalar_tag(v) for v in value}
        if tags <= {KvTag.INT64, KvTag.UINT64}:
            if KvTag.UINT64 in tags and any(v < 0 for v in value):
                raise HurraySchemaError("KV integer array mixes negative and uint64-only values")
            tag = KvTag.UINT64 if KvTag.UINT64 in tags else KvTag.INT64
        elif len(tags) == 1:
            (tag,) = tags
        else:
            raise HurraySchemaError(f"KV array mixes value types {sorted(t.name for t in tags)}")
        return (_TAG.pack(value_tag=KvTag.ARRAY) + _ARRAY.pack(element_tag=tag, element_count=len(value))
                + b"".join(_payload(tag, v) for v in value))
    tag = _scalar_tag(value)
    return _TAG.pack(value_tag=tag) + _payload(tag, value)


def encode_kv(kv: Mapping[str, Any]) -> bytes:
    """The KV section bytes of ``kv`` (keys in mapping order)."""
    parts = [_COUNT.pack(kv_count=len(kv))]
    for key, value in kv.items():
        if not isinstance(key, str):
            raise HurraySchemaError(f"KV key {key!r} is not a str")
        raw = key.encode("utf-8")
        if not raw or len(raw) > 0xFFFF:
            raise HurraySchemaError(f"KV key {key!r} must be 1 to 65535 UTF-8 bytes")
        parts.append(_KEY_LEN.pack(key_length=len(raw)) + raw + _encode_value(value))
    return b"".join(parts)


# --------------------------------------------------------------------------------------
# Decoding: one located walk, read strictly (``decode_kv``) or located only (the view)
# --------------------------------------------------------------------------------------

_MIN_ENTRY = _KEY_LEN.fixed_size + 1 + _TAG.fixed_size + 1
"""An entry needs at least key_length, one key byte, a tag and a 1-byte payload."""


class _Cursor:
    """Where the walk is in the KV bytes; ``need`` is the one bounds check: under ``RAISE``
    it raises ``file.kv.truncated``, else it yields the fault part and the walk stops."""

    __slots__ = ("buf", "pos", "end", "base", "faults", "mode")

    def __init__(self, buf, base: int, faults: Faults, mode: Mode):
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.base = base
        self.faults = faults
        self.mode = mode

    def at(self, pos=None) -> int:
        return self.base + (self.pos if pos is None else pos)

    def fits(self, n: int) -> bool:
        return n <= self.end - self.pos

    def require(self, n: int, what: str) -> None:
        """``RAISE`` only: ``n`` bytes must remain."""
        if not self.fits(n):
            raise container_rules.KV_TRUNCATED.violation(
                f"{what} needs {n} bytes, only {self.end - self.pos} remain in kv_length", self.at())

    def short(self, n: int, what: str, decl=None, note: str = "", depth: int = 0) -> Part:
        """The fault of ``n`` bytes that do not fit (raises under ``RAISE``)."""
        part = fault(self.faults, container_rules.KV_TRUNCATED,
                     f"{what} needs {n} bytes, only {self.end - self.pos} remain in kv_length", self.at(), self.mode,
                     note=note)
        return part._replace(decl=decl, depth=depth)

    def table(self, p: Plan, decl, what: str, depth: int = 0):
        """``(part, values)`` of the fixed-size table ``decl`` here, or ``(fault part, None)``."""
        if not self.fits(p.fixed_size):
            return self.short(p.fixed_size, what, decl, depth=depth), None
        start = self.pos
        values, self.pos = p.unpack(self.buf, self.pos)
        return Part(TABLE, self.at(start), self.at(), decl, values, depth=depth), values

    def bytes(self, n: int, what: str, label: str):
        """``(part, raw)`` of ``n`` bytes here, or ``(fault part, None)``."""
        if not self.fits(n):
            return self.short(n, what, note=f"{label} needs {n} bytes, {self.end - self.pos} remain"), None
        start = self.pos
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return Part(NAME if label == "key" else VALUE, self.at(start), self.at(), value=raw, note=label), raw


def walk_kv(buf, base: int = 0, *, faults: Faults = Faults.RAISE, mode: Mode = Mode.STRICT,
            limits: Limits = DEFAULT_LIMITS) -> Iterator[Part]:
    """Located parts of a KV section (``file-format.md § KV Section Encoding``); ``base``
    is its offset in the file.  The ``kv_count`` table, then per entry: ``entry start``
    (index: the entry number), the ``key_length`` table, the key (``name``), the
    ``value_tag`` table, the value's parts (tables, ``value`` bytes; array elements one
    level deeper in ``depth``, the entry's own parts at depth 0 and the count, entries and
    their starts at -1) and an ``entry`` part whose value is ``(key, value)``.

    ``RAISE`` applies every rule of the section (what :func:`decode_kv` returns);
    ``ANNOTATE`` only locates, and stops where a part does not fit."""
    strict = faults is Faults.RAISE
    cur = _Cursor(as_view(buf), base, faults, mode)
    part, head = cur.table(_COUNT, KV_COUNT, "kv_count", depth=-1)
    yield part
    if head is None:
        return
    count = head["kv_count"]
    if strict:
        if count * _MIN_ENTRY > cur.end - cur.pos:
            raise container_rules.KV_TRUNCATED.violation(
                f"kv_count {count} cannot fit in the {cur.end - cur.pos} bytes that follow", cur.at(0))
        limits.check("max_kv_entries", count, base)
    seen: set = set()
    for i in range(count):
        if not strict and cur.pos >= cur.end:  # (a reader finds key_length cut off instead)
            yield Part(FAULT, cur.at(), cur.at(), note=f"KV entry {i} starts past the KV section", depth=-1)
            return
        key_at = cur.at()
        yield Part(ENTRY_START, key_at, key_at, index=i, depth=-1)
        part, v = cur.table(_KEY_LEN, KV_KEY_LENGTH, "key_length")
        yield part
        if v is None:
            return
        part, raw = cur.bytes(v["key_length"], "key", "key")
        yield part
        if raw is None:
            return
        key = _check_key(raw, key_at, seen) if strict else raw
        tag_at = cur.at()
        part, v = cur.table(_TAG, KV_VALUE_TAG, "value_tag")
        yield part
        if v is None:
            return
        value = yield from _value(cur, v["value_tag"], tag_at, 0, limits)
        if value is _STOP:
            return
        yield Part(ENTRY, key_at, cur.at(), value=(key, value), index=i)
    if strict and cur.pos != cur.end:
        raise container_rules.KV_TRUNCATED.violation(
            f"{cur.end - cur.pos} bytes follow the last of the {count} KV entries inside kv_length", cur.at())


_STOP = object()
"""What a value walk returns when the walk stops inside it."""


def _check_key(raw: bytes, key_at: int, seen: set) -> str:
    if not raw:
        raise container_rules.KV_KEY.violation("key_length is 0", key_at)
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise container_rules.KV_KEY.violation(f"key is not valid UTF-8 ({exc.reason})", key_at + _KEY_LEN.fixed_size) from None
    if key in seen:
        raise container_rules.KV_DUPLICATE.violation(f"KV key {key!r} appears twice", key_at)
    seen.add(key)
    return key


def _value(cur: _Cursor, tag: int, tag_at: int, depth: int, limits: Limits):
    """Yield the parts of one value (tag already read); return it, or ``_STOP``."""
    strict = cur.faults is Faults.RAISE
    if tag == KvTag.ARRAY:
        part, head = cur.table(_ARRAY, KV_ARRAY_HEADER, "array header")
        yield part._replace(depth=depth)
        if head is None:
            return _STOP
        etag, n = head["element_tag"], head["element_count"]
        if strict:
            if etag not in _MIN_PAYLOAD:
                raise container_rules.KV_ARRAY_TAG.violation(
                    f"array element tag 0x{etag:02X} is not {_ELEMENT_TAGS}", tag_at + _ELEMENT_TAG_AT)
            cur.require(n * _MIN_PAYLOAD[etag], f"{n} array elements")
            limits.check("max_kv_value_bytes", n, tag_at + _ELEMENT_COUNT_AT)
        elif etag == KvTag.ARRAY:
            yield Part(FAULT, cur.at(), cur.at(), note=f"an array's element_tag must be {_ELEMENT_TAGS}, not another array",
                       depth=depth)
            return _STOP
        values = []
        for _ in range(n):
            if not strict and cur.pos >= cur.end:
                yield Part(FAULT, cur.at(), cur.at(), note="array elements run past the KV section", depth=depth)
                return _STOP
            value = yield from _value(cur, etag, None, depth + 1, limits)
            if value is _STOP:
                return _STOP
            values.append(value)
        return values
    if tag not in _MIN_PAYLOAD:
        if strict:
            kind = "private (no out-of-band agreement)" if is_private_tag(tag) else "reserved or invalid"
            raise container_rules.KV_VALUE_TAG.violation(f"value tag 0x{tag:02X} is {kind}", tag_at)
        yield Part(FAULT, cur.at(), cur.at(), note=f"value_tag 0x{tag:02X} is not a KV type this view knows",
                   depth=depth)
        return _STOP
    return (yield from _payload_parts(cur, tag, depth, limits))


def _payload_parts(cur: _Cursor, tag: int, depth: int, limits: Limits):
    strict = cur.faults is Faults.RAISE
    at = cur.at()
    if tag in (KvTag.STRING, KvTag.BYTES):
        part, v = cur.table(_LEN, KV_LENGTH_PREFIX, "value length")
        yield part._replace(depth=depth)
        if v is None:
            return _STOP
        n = v["length"]
        if strict:
            cur.require(n, "value bytes")
            limits.check("max_kv_value_bytes", n, at)
        part, data = cur.bytes(n, "value bytes", "value")
        yield part._replace(depth=depth)
        if data is None:
            return _STOP
        if tag == KvTag.BYTES or not strict:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise container_rules.KV_STRING.violation(f"string value is not valid UTF-8 ({exc.reason})", at) from None
    part, v = cur.table(_SCALARS[tag], KV_SCALAR_VALUES[tag], f"{KvTag(tag).name.lower()} value")
    yield part._replace(depth=depth)
    if v is None:
        return _STOP
    value = v["value"]
    if not strict:
        return value
    if tag == KvTag.BOOL:
        if value not in (0, 1):
            raise container_rules.KV_BOOL.violation(f"bool value byte is 0x{value:02X}", at)
        return bool(value)
    if tag == KvTag.UINT64:
        return UInt64(value)
    return value


def decode_kv(buf, base: int = 0, limits: Limits = DEFAULT_LIMITS) -> dict:
    """Decode a KV section; ``base`` is its offset in the file (for error offsets)."""
    out: dict = {}
    for part in walk_kv(buf, base, faults=Faults.RAISE, limits=limits):
        if part.kind == ENTRY:
            key, value = part.value
            out[key] = value
    return out
