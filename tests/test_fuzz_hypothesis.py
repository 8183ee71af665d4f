"""Hypothesis fuzz: valid descriptors, streams and files drawn by ``fuzz.strategies``,
round-tripped, then damaged; every damaged input gives a value or a HurraySchemaError.

Complements ``test_fuzz_mutations.py`` (fixed seeds, 8,000 inputs per entry point, 20,000 with
``--thorough``):
here Hypothesis chooses the inputs *and* the damage, and shrinks any failure to a small
example.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import hurray_schema as hs
from fuzz import strategies as S
from fuzz import targets
from support.sizes import size

FUZZ = settings(max_examples=size(120, 300), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SCRATCH = Path(tempfile.mkdtemp(prefix="hurray_hyp_"))


def _survives(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except hs.HurraySchemaError as exc:  # anything else fails the test
        return exc


@FUZZ
@given(S.valid_descriptors())
def test_valid_descriptors_round_trip(desc):
    assert hs.decode_descriptor(hs.encode_descriptor(desc)) == desc


@FUZZ
@given(S.damaged(S.valid_descriptors().map(hs.encode_descriptor)), S.st.sampled_from(["strict", "permissive"]))
def test_damaged_descriptors(data, mode):
    out = _survives(hs.decode_descriptor, data, mode=mode)
    if not isinstance(out, hs.HurraySchemaError):
        encoded = hs.encode_descriptor(out)
        assert encoded == data[: len(encoded)]


@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_damaged_streams(framing):
    @FUZZ
    @given(S.streams(framing))
    def valid(data):
        assert targets.run_read_stream(data, "strict", framing) >= 1

    @FUZZ
    @given(S.damaged(S.streams(framing)), S.st.sampled_from(["strict", "permissive"]))
    def damaged(data, mode):
        _survives(targets.run_read_stream, data, mode, framing)

    valid()
    damaged()


def test_damaged_files():
    scratch = targets.scratch_file()

    @settings(FUZZ, max_examples=100)
    @given(S.files(SCRATCH))
    def valid(data):
        targets.write_scratch(scratch, data)
        assert targets.run_read_file(scratch, "strict") >= 1

    @FUZZ
    @given(S.damaged(S.files(SCRATCH)), S.st.sampled_from(["strict", "permissive"]))
    def damaged(data, mode):
        targets.write_scratch(scratch, data)
        _survives(targets.run_read_file, scratch, mode)

    try:
        valid()
        damaged()
    finally:
        scratch.unlink(missing_ok=True)
