"""Deterministic mutations of valid inputs, shared by the test-suite fuzz and atheris.

Each mutation is one of the ways a hostile or broken producer damages an input: bit
flips, truncation, a length or count field set to an extreme, random bytes inserted,
a chunk duplicated or two chunks swapped.

Files carry kilobytes of alignment padding and buffer bytes that no decoder looks at;
:func:`hot_regions` finds the bytes worth damaging (the non-zero runs, widened) and
:func:`mutate` aims most mutations there.
"""

from __future__ import annotations

import random
import struct
from typing import Optional, Sequence

EXTREME_U64 = (0, 1, 2**31, 2**32 - 1, 2**32, 2**60, 2**63, 2**64 - 1)
EXTREME_U32 = (0, 1, 7, 64, 65, 255, 4096, 2**31, 2**32 - 1)
EXTREME_U16 = (0, 1, 255, 2**15, 2**16 - 1)

Regions = Sequence[tuple[int, int]]


class _Pos:
    """Chooses where a mutation lands: mostly inside the hot regions, sometimes anywhere."""

    __slots__ = ("rng", "hot")

    def __init__(self, rng: random.Random, hot: Optional[Regions]):
        self.rng = rng
        self.hot = hot

    def __call__(self, n: int, width: int = 1) -> Optional[int]:
        """A start index for ``width`` bytes inside ``n`` bytes, or None if they do not fit."""
        if n < width:
            return None
        if self.hot and self.rng.random() < 0.9:
            a, b = self.rng.choice(self.hot)
            if a < n:
                return min(self.rng.randrange(a, max(a + 1, b)), n - width)
        return self.rng.randrange(n - width + 1)


def _flip_bits(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    for _ in range(rng.randrange(1, 4)):
        i = pos(len(b))
        b[i] ^= 1 << rng.randrange(8)


def _truncate(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    del b[pos(len(b) + 1):]


def _extreme(values, fmt):
    width = struct.calcsize(fmt)

    def mutation(rng: random.Random, b: bytearray, pos: _Pos) -> None:
        i = pos(len(b), width)
        if i is not None:
            b[i:i + width] = struct.pack(fmt, rng.choice(values))

    return mutation


_extreme_u64 = _extreme(EXTREME_U64, "<Q")
_extreme_u32 = _extreme(EXTREME_U32, "<I")
_extreme_u16 = _extreme(EXTREME_U16, "<H")


def _random_byte(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    b[pos(len(b))] = rng.randrange(256)


def _insert(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    i = pos(len(b) + 1)
    b[i:i] = rng.randbytes(rng.randrange(1, 24))


def _delete(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    i = pos(len(b))
    del b[i:i + rng.randrange(1, 24)]


def _duplicate(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    i = pos(len(b))
    chunk = b[i:i + rng.randrange(1, 64)]
    j = pos(len(b) + 1)
    b[j:j] = chunk


def _swap_chunks(rng: random.Random, b: bytearray, pos: _Pos) -> None:
    if len(b) >= 16:
        n = rng.randrange(1, min(len(b) // 4, 256))
        i, j = sorted((pos(len(b), n), pos(len(b), n)))
        if j - i >= n:
            b[i:i + n], b[j:j + n] = b[j:j + n], b[i:i + n]


MUTATIONS = (_flip_bits, _truncate, _extreme_u64, _extreme_u32, _extreme_u16, _random_byte, _insert,
             _delete, _duplicate, _swap_chunks)


def hot_regions(data: bytes, widen: int = 16) -> list[tuple[int, int]]:
    """The non-zero runs of ``data`` widened by ``widen`` bytes and merged: where headers,
    descriptors, KV and index live (zero padding and zero-filled buffers fall outside)."""
    regions: list[list[int]] = []
    i, n = 0, len(data)
    while i < n:
        if data[i]:
            j = i
            while j < n and data[j]:
                j += 1
            a, z = max(0, i - widen), min(n, j + widen)
            if regions and a <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], z)
            else:
                regions.append([a, z])
            i = j
        else:
            i += 1
    return [(a, z) for a, z in regions]


def mutate(rng: random.Random, data: bytes, rounds: int | None = None, hot: Optional[Regions] = None) -> bytes:
    """``data`` damaged by one to three mutations chosen by ``rng`` (aimed at ``hot``)."""
    b = bytearray(data)
    pos = _Pos(rng, hot)
    for _ in range(rounds or rng.randrange(1, 4)):
        if not b:
            break
        rng.choice(MUTATIONS)(rng, b, pos)
    return bytes(b)


_TRAILER_PLANS = None


def _trailer_plans():
    """(where, crc, offsets) for the trailer fields, built once: ``plan`` caches by
    declaration identity, so building ``select(...)`` tables per call would grow its cache."""
    global _TRAILER_PLANS
    if _TRAILER_PLANS is None:
        from hurray_schema.structs._declare import plan, select, static_offset
        from hurray_schema.structs.file import TRAILER, TRAILER_SIZE

        _TRAILER_PLANS = (
            plan(select(TRAILER, "index_offset", "index_length")),
            plan(select(TRAILER, "index_crc32c")),
            static_offset(TRAILER, "index_offset"),
            static_offset(TRAILER, "index_crc32c"),
            TRAILER_SIZE,
        )
    return _TRAILER_PLANS


def refresh_index_crc(data: bytes) -> bytes:
    """``data`` with the trailer's ``index_crc32c`` recomputed over the index it points to.

    A damaged index is otherwise caught by the CRC check before any entry is parsed; with
    the CRC made right again the fuzzers reach the index and KV decoders.  Inputs whose
    trailer does not point inside the file, or that record no CRC, are returned unchanged.
    """
    import crc32c

    where, crc_plan, where_at, crc_at, trailer_size = _trailer_plans()
    if len(data) < trailer_size:
        return data
    t0 = len(data) - trailer_size
    values, _ = where.unpack(data, t0 + where_at)
    start, length = values["index_offset"], values["index_length"]
    if not 0 <= start <= start + length <= t0:
        return data
    at = t0 + crc_at
    if not any(data[at:at + 4]):
        return data  # no CRC recorded (HAS_INDEX_CRC32C clear): keep it that way
    crc = crc_plan.pack(index_crc32c=crc32c.crc32c(data[start:start + length]))
    return data[:at] + crc + data[at + len(crc):]
