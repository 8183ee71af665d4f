"""The entry points under fuzz, and how one input is pushed all the way through each.

Shared by the atheris harness (``fuzz/harness.py``) and the test-suite fuzz
(``tests/test_fuzz_mutations.py``).  An entry point is looked up on the package first
(``hurray_schema.read_stream``) and then in the module that defines it (:data:`_HOMES`);
:func:`entry_point` raises :class:`MissingEntryPoint`, naming both, when this build has
neither: a renamed or moved entry point stops the fuzzers loudly rather than turning them off
(``tests/test_fuzz_entry_points.py`` checks that every one resolves).

Each ``run_*`` function drives the input to the end -- every item of a stream, every
tensor, buffer, KV value and index entry of a file, every finding of an audit -- so a
decoder that only fails lazily is still reached.  It returns normally or raises; the
caller decides which exceptions are acceptable (only ``HurraySchemaError`` ones).

``run_read_stream`` and ``run_read_file`` also *evaluate* every item they accept when given
``evaluation=Evaluation(limits, rng)`` (:func:`evaluate`): ``to_numpy`` of a tensor (and of
each tensor member), ``materialize`` and ``read`` of a random region of a composite, under
``limits`` (its evaluation budget bounds what a mutant may allocate).  An evaluation that
raises ``HurraySchemaError`` is counted and the next one runs; any other exception escapes.
"""

from __future__ import annotations

import importlib
import os
import random
from pathlib import Path
from typing import Callable, Optional

import attrs

import hurray_schema as hs

_HOMES = {
    "decode_descriptor": "hurray_schema.codec",
    "read_stream": "hurray_schema.io.stream",
    "read_file": "hurray_schema.io.file",
    "audit": "hurray_schema.audit",
}
"""Each fuzzed entry point and the module that defines it."""


class MissingEntryPoint(LookupError):
    """An entry point of :data:`_HOMES` is neither on the package nor in its home module."""


def entry_point(name: str) -> Callable:
    """``hurray_schema.<name>``, or the same function from its home module (:data:`_HOMES`);
    :class:`MissingEntryPoint` naming both when neither has it (an unknown ``name`` is a ``KeyError``)."""
    fn = getattr(hs, name, None)
    if callable(fn):
        return fn  # (a submodule of the same name, e.g. hurray_schema.audit, is not it)
    home = _HOMES[name]
    try:
        module = importlib.import_module(home)
    except ImportError as exc:
        raise MissingEntryPoint(f"fuzz entry point {name!r}: hurray_schema.{name} is not callable and its home "
                                f"module {home} does not import ({exc}); update fuzz/targets.py _HOMES") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise MissingEntryPoint(f"fuzz entry point {name!r}: neither hurray_schema.{name} nor {home}.{name} "
                                f"exists; update fuzz/targets.py _HOMES")
    return fn


def _touch(item) -> None:
    """Read every byte an item hands out (members of composites included)."""
    members = getattr(item, "members", None)
    if members is not None:
        for m in members:
            _touch(m)
        return
    for b in getattr(item, "buffers", ()):
        memoryview(b).tobytes()


EVALUATION_BUDGET = 64 << 10
"""``max_evaluation_bytes`` of the fuzz runs: small, so that a mutated shape cannot make a run slow
(the budget check is the same at any size)."""

EVALUATION_MEMORY_FACTOR = 8
"""Budgets by which an evaluated input's traced peak may exceed the readers' memory bound (the
output, one member decoded whole for ``read``, NumPy temporaries)."""

EVALUATION_LIMITS = hs.Limits(max_evaluation_bytes=EVALUATION_BUDGET)


@attrs.define
class Evaluation:
    """How accepted items are evaluated: under ``limits``, regions drawn from ``rng``; the outcome
    counts of every evaluation call."""

    limits: hs.Limits = EVALUATION_LIMITS
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    values: int = 0
    refused: dict = attrs.field(factory=dict)

    @property
    def memory_allowance(self) -> int:
        """Bytes of traced peak an evaluated input may add to the readers' bound."""
        return EVALUATION_MEMORY_FACTOR * self.limits.max_evaluation_bytes

    def call(self, fn, *args, **kw) -> None:
        try:
            fn(*args, limits=self.limits, **kw)
        except hs.HurraySchemaError as exc:
            name = getattr(exc, "limit", None) or getattr(exc, "rule_id", None) or type(exc).__name__
            self.refused[name] = self.refused.get(name, 0) + 1
        else:
            self.values += 1

    def region(self, shape) -> tuple:
        """A random box of ``shape``: (start, stop) per dimension, possibly empty."""
        box = []
        for n in shape:
            start = self.rng.randint(0, n) if n >= 0 else 0
            box.append((start, self.rng.randint(start, max(start, n))))
        return tuple(box)


def evaluate(item, evaluation: Evaluation) -> None:
    """Evaluate one item a reader accepted (see the module docstring)."""
    members = getattr(item, "members", None)
    if members is None:
        evaluation.call(item.to_numpy)
        return
    evaluation.call(item.materialize)
    evaluation.call(item.read, evaluation.region(item.shape))
    for m in members:
        if getattr(m, "members", None) is None:
            evaluation.call(m.to_numpy)


def run_decode_descriptor(data: bytes, mode: str = "strict", **kw):
    """Decode ``data`` and check the compiled-signature path against the general decoder:
    same descriptor, or the same error (a disagreement raises ``AssertionError``)."""
    try:
        got = entry_point("decode_descriptor")(data, mode=mode, **kw)
    except hs.HurraySchemaError as exc:
        _check_general(data, mode, kw, ("error", type(exc), getattr(exc, "rule_id", None)))
        raise
    _check_general(data, mode, kw, ("ok", got))
    return got


def _check_general(data: bytes, mode: str, kw: dict, outcome: tuple) -> None:
    """The general decoder's outcome on ``data`` is ``outcome`` (the compiled path's)."""
    from hurray_schema.codec import _parse_general, check_semantics
    from hurray_schema.limits import resolve_limits
    from hurray_schema.rules.engine import as_mode

    try:
        desc, _ = _parse_general(memoryview(data).cast("B"), as_mode(mode), 0, resolve_limits(kw.get("limits")))
        want = ("ok", check_semantics(desc, mode))
    except hs.HurraySchemaError as exc:
        want = ("error", type(exc), getattr(exc, "rule_id", None))
    if want != outcome:
        raise AssertionError(f"compiled and general decoders disagree: {outcome!r} != {want!r}")


def run_read_stream(data: bytes, mode: str = "strict", framing: str = "bare",
                    evaluation: Optional[Evaluation] = None, **kw) -> int:
    n = 0
    reader = entry_point("read_stream")(data, framing=framing, mode=mode, **kw)
    try:
        for item in reader:
            _touch(item)
            if evaluation is not None:
                evaluate(item, evaluation)
            n += 1
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    return n


def run_read_file(path, mode: str = "strict", evaluation: Optional[Evaluation] = None, **kw) -> int:
    n = 0
    with entry_point("read_file")(path, mode=mode, **kw) as f:
        getattr(f, "kv", None)
        entries = getattr(f, "entries", None)
        if entries is not None:
            entries()
        for name in f:
            _touch(f[name])
            if evaluation is not None:
                evaluate(f[name], evaluation)
            n += 1
    return n


def run_audit(data, mode: str = "strict", **kw):
    report = entry_point("audit")(data, mode=mode, **kw)
    for finding in getattr(report, "findings", ()):
        str(finding)
    return report


def write_scratch(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (replacing it) for the path-based readers."""
    with open(path, "wb") as f:
        f.write(data)
    return path


def scratch_file() -> Path:
    """A per-process scratch path for fuzzing ``read_file``: in RAM (``/dev/shm``) where
    available -- rewriting a file thousands of times on disk dominates the run -- else in
    the system temp dir."""
    import tempfile

    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"hurray_fuzz_{os.getpid()}.hrry"
