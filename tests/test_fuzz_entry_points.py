"""The fuzzers' entry points resolve (fuzz/targets.py): a renamed or moved one fails here, named
with the module it was looked for in, instead of silently turning fuzzing off."""

from __future__ import annotations

import importlib

import pytest

import hurray_schema as hs
from fuzz import corpus, harness, targets


@pytest.mark.parametrize("name", sorted(targets._HOMES))
def test_every_entry_point_resolves_in_its_home_module(name):
    fn = targets.entry_point(name)
    assert callable(fn)
    home = targets._HOMES[name]
    assert getattr(importlib.import_module(home), name, None) is fn, \
        f"{home}.{name} is not the function the fuzzers drive: update fuzz/targets.py _HOMES"


def test_the_harness_drives_every_entry_point():
    assert set(harness.ENTRY_POINTS) == set(targets._HOMES)


def test_a_missing_entry_point_fails_loudly(monkeypatch):
    monkeypatch.setitem(targets._HOMES, "no_such_entry", "hurray_schema.codec")
    with pytest.raises(targets.MissingEntryPoint, match=r"no_such_entry.*hurray_schema\.codec\.no_such_entry"):
        targets.entry_point("no_such_entry")
    monkeypatch.setitem(targets._HOMES, "read_nothing", "hurray_schema.no_such_module")
    with pytest.raises(targets.MissingEntryPoint, match=r"read_nothing.*hurray_schema\.no_such_module"):
        targets.entry_point("read_nothing")


def test_the_descriptor_target_compares_with_the_general_decoder():
    """``run_decode_descriptor`` checks the compiled path against the general decoder, whose
    names it imports: they resolve (a missing one is an ImportError, not a skipped check)."""
    desc = hs.TensorDescriptor(0x03, (3, 4), buffers=(hs.BufferHandle(48),))
    assert targets.run_decode_descriptor(hs.encode_descriptor(desc)) == desc


def test_the_seed_corpus_holds_our_writers_output(tmp_path):
    items = corpus.our_items()
    assert len(items) == 7
    assert len(corpus.seed_streams("bare")) >= len(items) + 2
    assert len(corpus.seed_streams("messages")) >= len(items) + 2
    assert len(corpus.seed_files(tmp_path)) >= 4
