"""The KV metadata section of a file (``file-format.md § KV Metadata Section``)."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import HurraySchemaError
from ..limits import DEFAULT_LIMITS, Limits
from ..rules import container as C
from ..structs._declare import plan
from ..structs.file import (
    KV_ARRAY_HEADER, KV_COUNT, KV_KEY_LENGTH, KV_LENGTH_PREFIX, KV_SCALAR_VALUES, KV_VALUE_TAG, KvTag,
)

__all__ = ["UInt64", "encode_kv", "decode_kv"]

_COUNT = plan(KV_COUNT)
_KEY_LEN = plan(KV_KEY_LENGTH)
_TAG = plan(KV_VALUE_TAG)
_LEN = plan(KV_LENGTH_PREFIX)
_ARRAY = plan(KV_ARRAY_HEADER)
_SCALARS = {tag: plan(decl) for tag, decl in KV_SCALAR_VALUES.items()}
_MIN_PAYLOAD = {KvTag.STRING: _LEN.fixed_size, KvTag.BYTES: _LEN.fixed_size,
                **{tag: p.fixed_size for tag, p in _SCALARS.items()}}


class UInt64(int):
    """An int written (and read back) with value tag 0x03 ``uint64`` rather than 0x02."""

    def __new__(cls, value: int):
        value = int(value)
        if not 0 <= value < 1 << 64:
            raise ValueError(f"{value} is outside uint64")
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
# Decoding
# --------------------------------------------------------------------------------------


class _Cursor:
    __slots__ = ("buf", "pos", "end", "base", "limits")

    def __init__(self, buf, base: int, limits: Limits = DEFAULT_LIMITS):
        self.limits = limits
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.base = base

    def at(self, pos=None) -> int:
        return self.base + (self.pos if pos is None else pos)

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise C.KV_TRUNCATED.violation(
                f"{what} needs {n} bytes, only {self.end - self.pos} remain in kv_length", self.at())

    def read(self, p, what: str) -> dict:
        self.need(p.fixed_size, what)
        values, self.pos = p.unpack(self.buf, self.pos)
        return values

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return data


def _decode_payload(cur: _Cursor, tag: int):
    at = cur.at()
    if tag in (KvTag.STRING, KvTag.BYTES):
        n = cur.read(_LEN, "value length")["length"]
        cur.need(n, "value bytes")
        cur.limits.check("max_kv_value_bytes", n, at)
        data = cur.take(n, "value bytes")
        if tag == KvTag.BYTES:
            return data
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise C.KV_STRING.violation(f"string value is not valid UTF-8 ({exc.reason})", at) from None
    value = cur.read(_SCALARS[tag], f"{KvTag(tag).name.lower()} value")["value"]
    if tag == KvTag.BOOL:
        if value not in (0, 1):
            raise C.KV_BOOL.violation(f"bool value byte is 0x{value:02X}", at)
        return bool(value)
    if tag == KvTag.UINT64:
        return UInt64(value)
    return value


def decode_kv(buf, base: int = 0, limits: Limits = DEFAULT_LIMITS) -> dict:
    """Decode a KV section; ``base`` is its offset in the file (for error offsets)."""
    cur = _Cursor(memoryview(buf), base, limits)
    count = cur.read(_COUNT, "kv_count")["kv_count"]
    # every entry needs at least key_length, one key byte, a tag and a 1-byte payload
    if count * 5 > cur.end - cur.pos:
        raise C.KV_TRUNCATED.violation(
            f"kv_count {count} cannot fit in the {cur.end - cur.pos} bytes that follow", cur.at(0))
    limits.check("max_kv_entries", count, base)
    out: dict = {}
    for _ in range(count):
        key_at = cur.at()
        n = cur.read(_KEY_LEN, "key_length")["key_length"]
        raw = cur.take(n, "key")
        if not raw:
            raise C.KV_KEY.violation("key_length is 0", key_at)
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise C.KV_KEY.violation(f"key is not valid UTF-8 ({exc.reason})", key_at + 2) from None
        if key in out:
            raise C.KV_DUPLICATE.violation(f"KV key {key!r} appears twice", key_at)
        tag_at = cur.at()
        tag = cur.read(_TAG, "value_tag")["value_tag"]
        if tag == KvTag.ARRAY:
            head = cur.read(_ARRAY, "array header")
            etag = head["element_tag"]
            if etag not in _MIN_PAYLOAD:
                raise C.KV_ARRAY_TAG.violation(f"array element tag 0x{etag:02X} is not 0x01-0x06", tag_at + 1)
            cur.need(head["element_count"] * _MIN_PAYLOAD[etag], f"{head['element_count']} array elements")
            limits.check("max_kv_value_bytes", head["element_count"], tag_at + 2)
            out[key] = [_decode_payload(cur, etag) for _ in range(head["element_count"])]
        elif tag in _MIN_PAYLOAD:
            out[key] = _decode_payload(cur, tag)
        else:
            kind = "private (no out-of-band agreement)" if 0xF0 <= tag <= 0xFE else "reserved or invalid"
            raise C.KV_VALUE_TAG.violation(f"value tag 0x{tag:02X} is {kind}", tag_at)
    if cur.pos != cur.end:
        raise C.KV_TRUNCATED.violation(
            f"{cur.end - cur.pos} bytes follow the last of the {count} KV entries inside kv_length", cur.at())
    return out

