"""Mutation fuzz: damaged inputs give a value or a HurraySchemaError, nothing else.

Seeded and deterministic.  The inputs are valid descriptors, streams and files built by
our writers and by pyhurray's (``fuzz/corpus.py``), damaged by ``fuzz/mutate.py``
(bit flips, truncation, extreme length/count fields, inserted, deleted, duplicated and
swapped chunks), aimed at the bytes decoders look at.  Per entry point 8,000 inputs (20,000
with ``--thorough``: ``tests/support/sizes.py``);
every 10th one runs under ``tracemalloc`` and its peak allocation must stay below
1 MiB plus a few times the input's size.

Every item the stream and file readers accept is also evaluated (``fuzz.targets.evaluate``:
``to_numpy``, ``materialize``, ``read`` of a random region) and must give a value or a
``HurraySchemaError``, under the lowered budget ``fuzz.targets.EVALUATION_LIMITS`` (a mutated
shape cannot make the run slow; the budget check is the same at any size); the traced peak
may then exceed the readers' bound by ``Evaluation.memory_allowance``.

As many further mutants of ``fuzz.evaluation_corpus`` (every layout and scheme the evaluator
decodes) go through ``read_stream`` and evaluation.

An entry point missing from this build fails the tests that drive it (``fuzz.targets.entry_point``
raises ``MissingEntryPoint``), never skips them.
"""

from __future__ import annotations

import random
import tracemalloc

import pytest

import hurray_schema as hs
from fuzz import targets
from fuzz.corpus import seed_files, seed_inputs, seed_streams
from fuzz.evaluation_corpus import evaluation_streams
from fuzz.mutate import hot_regions, mutate, refresh_index_crc
from support.sizes import size

INPUTS_PER_ENTRY_POINT = size(8_000, 20_000)
EVALUATION_INPUTS = INPUTS_PER_ENTRY_POINT
TRACE_EVERY = 10
MEMORY_SLACK = 1 << 20  # bytes allowed beyond MEMORY_FACTOR x input size
MEMORY_FACTOR = 4


def _traced(i: int) -> bool:
    """Every TRACE_EVERY-th input, never the first (lazy imports are a one-off cost)."""
    return i > 0 and i % TRACE_EVERY == 0


class Tally:
    """Outcome counts and the invariants every outcome must satisfy."""

    def __init__(self, evaluation: targets.Evaluation | None = None):
        self.accepted = self.rejected = 0
        self.rules: dict[str, int] = {}
        self.evaluation = evaluation
        self.memory_allowance = MEMORY_SLACK + (0 if evaluation is None else evaluation.memory_allowance)

    def run(self, fn, data: bytes, traced: bool, *args, **kw):
        if traced:
            try:  # untraced first: a lazy import on a new code path is not the input's cost
                fn(*args, **kw)
            except hs.HurraySchemaError:
                pass
            tracemalloc.start()
        try:
            result = fn(*args, **kw)
        except hs.HurraySchemaError as exc:  # any other exception fails the test
            self.rejected += 1
            rule = getattr(exc, "rule_id", None) or getattr(exc, "limit", None) or type(exc).__name__
            self.rules[rule] = self.rules.get(rule, 0) + 1
            if isinstance(exc, hs.SpecViolation):
                assert exc.rule_id and exc.citation, exc
            if isinstance(exc, (hs.SpecViolation, hs.LimitExceeded)):
                assert exc.offset is None or 0 <= exc.offset <= len(data), (exc, len(data))
            result = exc
        else:
            self.accepted += 1
        finally:
            if traced:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert peak < self.memory_allowance + MEMORY_FACTOR * len(data), (peak, len(data), data[:64].hex())
        return result


def _mutants(seeds: list[bytes], seed: int, n: int = INPUTS_PER_ENTRY_POINT):
    rng = random.Random(seed)
    pool = [(s, hot_regions(s)) for s in seeds]
    for i in range(n):
        data, hot = rng.choice(pool)
        yield i, mutate(rng, data, hot=hot)


@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_decode_descriptor_survives_mutations(mode):
    tally = Tally()
    for i, data in _mutants(seed_inputs(), 20261129):
        outcome = tally.run(targets.run_decode_descriptor, data, _traced(i), data, mode)
        if not isinstance(outcome, hs.HurraySchemaError):
            # what is accepted re-encodes to the bytes it was decoded from
            encoded = hs.encode_descriptor(outcome)
            assert encoded == data[: len(encoded)]
    assert tally.rejected > 0 and tally.accepted > 0


@pytest.mark.parametrize("framing", ["bare", "messages"])
def test_read_stream_survives_mutations(framing):
    seeds = seed_streams(framing)
    tally = Tally(targets.Evaluation(rng=random.Random(framing)))
    for i, data in _mutants(seeds, 7 + len(framing)):
        mode = "permissive" if i % 2 else "strict"
        tally.run(targets.run_read_stream, data, _traced(i), data, mode, framing, tally.evaluation)
    assert tally.rejected > 0 and tally.accepted > 0, tally.rules
    assert tally.evaluation.values > 0 and tally.evaluation.refused, tally.evaluation


def test_evaluation_survives_mutations():
    """Mutants of streams of every layout, scheme and crash class the evaluator handles
    (``fuzz.evaluation_corpus``): each item the reader accepts is evaluated."""
    tally = Tally(targets.Evaluation(rng=random.Random(17)))
    for i, data in _mutants(evaluation_streams(), 17, EVALUATION_INPUTS):
        mode = "permissive" if i % 2 else "strict"
        tally.run(targets.run_read_stream, data, _traced(i), data, mode, "bare", tally.evaluation)
    assert tally.rejected > 0 and tally.accepted > 0, tally.rules
    refused = tally.evaluation.refused
    assert tally.evaluation.values > 0 and "max_evaluation_bytes" in refused and "UnsupportedEvaluation" in refused


def test_read_file_survives_mutations(tmp_path):
    seeds = seed_files(tmp_path)
    scratch = targets.scratch_file()
    tally = Tally(targets.Evaluation(rng=random.Random(11)))
    try:
        for i, data in _mutants(seeds, 11):
            if i % 2:
                data = refresh_index_crc(data)  # reach the index and KV decoders past the CRC
            targets.write_scratch(scratch, data)
            mode = "permissive" if i % 4 >= 2 else "strict"
            tally.run(targets.run_read_file, data, _traced(i), scratch, mode, tally.evaluation)
    finally:
        scratch.unlink(missing_ok=True)
    assert tally.rejected > 0 and tally.accepted > 0, tally.rules
    assert tally.evaluation.values > 0 and tally.evaluation.refused, tally.evaluation


def test_audit_survives_mutations(tmp_path):
    """Descriptors and bare streams are audited as bytes, files through a path."""
    FILE = b"HRRYFILE"
    seeds = seed_inputs() + seed_streams("bare") + seed_files(tmp_path)
    scratch = targets.scratch_file()
    tally = Tally()
    try:
        for i, data in _mutants(seeds, 13):
            mode = "permissive" if i % 2 else "strict"
            source = data
            if data.startswith(FILE):
                source = targets.write_scratch(scratch, refresh_index_crc(data) if i % 4 >= 2 else data)
            report = tally.run(targets.run_audit, data, _traced(i), source, mode)
            if not isinstance(report, hs.HurraySchemaError):
                for f in getattr(report, "findings", ()):
                    offset = getattr(f, "offset", None)
                    assert offset is None or 0 <= offset <= len(data), (f, len(data))
    finally:
        scratch.unlink(missing_ok=True)
    assert tally.accepted > 0, tally.rules


def test_audit_of_recorded_sessions_survives_mutations(tmp_path):
    """Both directions of every session vector, one of them damaged, written side by side as
    ``serve --record`` writes them: ``audit`` of either direction (which reads the other as the
    receiver's own messages) gives findings or a typed error, within its memory allowance."""
    from support.corpus import corpus

    pairs: dict[str, dict[str, bytes]] = {}
    for vector in corpus().vectors:
        if vector.session is not None:
            pairs.setdefault(vector.session, {})[vector.direction] = vector.data
    names = sorted(pairs)
    rng = random.Random(48)
    tally = Tally()
    faulted = 0
    for i in range(INPUTS_PER_ENTRY_POINT // 4):
        name = rng.choice(names)
        sides = dict(pairs[name])
        damaged = rng.choice(("client", "server"))
        sides[damaged] = mutate(rng, sides[damaged], hot=hot_regions(sides[damaged]))
        for direction, data in sides.items():
            targets.write_scratch(tmp_path / f"{name}.{direction}.msgs", data)
        audited = "client" if i % 2 else "server"
        data = sides[audited]
        report = tally.run(targets.run_audit, data, _traced(i), tmp_path / f"{name}.{audited}.msgs",
                           "permissive" if i % 4 >= 2 else "strict")
        if not isinstance(report, hs.HurraySchemaError):
            faulted += bool(report.findings)
            for f in report.findings:
                assert f.offset is None or 0 <= f.offset <= len(data), (f, len(data))
    assert tally.accepted > faulted > 0, (tally.accepted, faulted)


def test_refresh_index_crc_does_not_grow_the_plan_cache(tmp_path):
    """Regression: building ``plan(select(...))`` per call used to grow a global plan cache by
    three entries per input, ~300 MB over a 10-minute atheris run of read_file.  Plans now
    live on their declaration, so repeated calls retain nothing."""
    import gc
    import tracemalloc

    seeds = seed_files(tmp_path)
    refresh_index_crc(seeds[0])
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(100):
            refresh_index_crc(seeds[0])
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 64 * 1024
