"""Deterministic mutations of valid inputs, shared by the test-suite fuzz and atheris.

Each mutation is one of the ways a hostile or broken producer damages an input: bit
flips, truncation, a length or count field set to an extreme, random bytes inserted,
a chunk duplicated or two chunks swapped.
"""

from __future__ import annotations

import random
import struct

EXTREME_U64 = (0, 1, 2**31, 2**32 - 1, 2**32, 2**60, 2**63, 2**64 - 1)
EXTREME_U32 = (0, 1, 7, 64, 65, 255, 4096, 2**31, 2**32 - 1)


def _flip_bits(rng: random.Random, b: bytearray) -> None:
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)


def _truncate(rng: random.Random, b: bytearray) -> None:
    del b[rng.randrange(len(b) + 1):]


def _extreme_u64(rng: random.Random, b: bytearray) -> None:
    if len(b) >= 8:
        i = rng.randrange(len(b) - 7)
        b[i:i + 8] = struct.pack("<Q", rng.choice(EXTREME_U64))


def _extreme_u32(rng: random.Random, b: bytearray) -> None:
    if len(b) >= 4:
        i = rng.randrange(len(b) - 3)
        b[i:i + 4] = struct.pack("<I", rng.choice(EXTREME_U32))


def _random_byte(rng: random.Random, b: bytearray) -> None:
    b[rng.randrange(len(b))] = rng.randrange(256)


def _insert(rng: random.Random, b: bytearray) -> None:
    i = rng.randrange(len(b) + 1)
    b[i:i] = rng.randbytes(rng.randrange(1, 24))


def _swap_chunks(rng: random.Random, b: bytearray) -> None:
    if len(b) >= 16:
        n = rng.randrange(1, len(b) // 4)
        i, j = sorted(rng.sample(range(len(b) - n), 2))
        if j - i >= n:
            b[i:i + n], b[j:j + n] = b[j:j + n], b[i:i + n]


MUTATIONS = (_flip_bits, _truncate, _extreme_u64, _extreme_u32, _random_byte, _insert, _swap_chunks)


def mutate(rng: random.Random, data: bytes, rounds: int | None = None) -> bytes:
    """``data`` damaged by one to three mutations chosen by ``rng``."""
    b = bytearray(data)
    for _ in range(rounds or rng.randrange(1, 4)):
        if not b:
            break
        rng.choice(MUTATIONS)(rng, b)
    return bytes(b)
