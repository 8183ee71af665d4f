"""Mutation fuzz: damaged inputs give a value or a HurraySchemaError, nothing else.

Seeded and deterministic; the inputs are valid descriptors built by our encoder (and the
golden vectors when present), damaged by ``fuzz.mutate``.
"""

from __future__ import annotations

import random

import pytest

import hurray_schema as hs
from fuzz.corpus import seed_inputs
from fuzz.mutate import mutate

INPUTS_PER_ENTRY_POINT = 20_000


def _outcome(data: bytes, mode: str):
    try:
        return hs.decode_descriptor(data, mode=mode)
    except hs.HurraySchemaError as exc:
        return exc


@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_decode_descriptor_survives_mutations(mode):
    rng = random.Random(20261129)
    seeds = seed_inputs()
    accepted = rejected = 0
    for _ in range(INPUTS_PER_ENTRY_POINT):
        data = mutate(rng, rng.choice(seeds))
        outcome = _outcome(data, mode)  # any other exception fails the test
        if isinstance(outcome, hs.HurraySchemaError):
            rejected += 1
            if isinstance(outcome, hs.SpecViolation):
                assert outcome.rule_id and outcome.citation
                assert outcome.offset is None or 0 <= outcome.offset <= len(data)
        else:
            accepted += 1
            # what is accepted re-encodes to the bytes it was decoded from
            encoded = hs.encode_descriptor(outcome)
            assert encoded == data[: len(encoded)]
    assert rejected > 0 and accepted > 0
