"""Coverage-guided fuzzing of every entry point with atheris.

    python -m fuzz.corpus read_stream /tmp/corpus_stream        # seed inputs, once
    python -m fuzz.harness read_stream -max_total_time=600 /tmp/corpus_stream

The invariant checked on every input: the entry point returns a value or raises a
``HurraySchemaError`` subclass -- any other exception is a finding (atheris stops and
writes the crashing input) -- and the traced peak allocation (``tracemalloc``, every
``TRACE_EVERY``-th input) stays below 1 MiB plus a few times the input's size.
An entry point missing from this build stops the harness with the name and module it looked
for (``targets.entry_point``).

What each entry point gets:

* ``decode_descriptor``: the bytes, in strict then permissive mode;
* ``read_stream``: the bytes as a bare stream and as a message-framed stream (strict and
  permissive alternate with the input's length);
* ``read_file``: the bytes written to a scratch file in ``/dev/shm``; for odd-length
  inputs the trailer's index CRC is recomputed first so that mutations reach the index
  and KV decoders instead of stopping at the CRC check;
* ``audit``: the bytes, strict and permissive.

The stream and file readers' accepted items are also evaluated (``targets.evaluate``) under
``targets.EVALUATION_LIMITS``; on those inputs the memory bound grows by
``Evaluation.memory_allowance``.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

import hurray_schema as hs

from . import targets
from .mutate import refresh_index_crc

TRACE_EVERY = 64
MEMORY_SLACK = 1 << 20
MEMORY_FACTOR = 4
EVALUATED_ALLOWANCE = targets.Evaluation().memory_allowance


def _decode_descriptor(data: bytes) -> None:
    for mode in ("strict", "permissive"):
        try:
            targets.run_decode_descriptor(data, mode)
        except hs.HurraySchemaError:
            pass


def _evaluation(data: bytes) -> targets.Evaluation:
    return targets.Evaluation(rng=random.Random(len(data)))


def _read_stream(data: bytes) -> None:
    mode = "permissive" if len(data) % 2 else "strict"
    for framing in ("bare", "messages"):
        try:
            targets.run_read_stream(data, mode, framing, _evaluation(data))
        except hs.HurraySchemaError:
            pass


_SCRATCH = None


def _read_file(data: bytes) -> None:
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = targets.scratch_file()
    if len(data) % 2:
        data = refresh_index_crc(data)
    targets.write_scratch(_SCRATCH, data)
    try:
        targets.run_read_file(_SCRATCH, "permissive" if len(data) % 4 >= 2 else "strict", _evaluation(data))
    except hs.HurraySchemaError:
        pass


def _audit(data: bytes) -> None:
    for mode in ("strict", "permissive"):
        try:
            targets.run_audit(data, mode)
        except hs.HurraySchemaError:
            pass


ENTRY_POINTS = {
    "decode_descriptor": _decode_descriptor,
    "read_stream": _read_stream,
    "read_file": _read_file,
    "audit": _audit,
}


def checked(target):
    """``target`` with the memory invariant added (on a sample of the inputs)."""
    count = [0]

    def one_input(data: bytes) -> None:
        count[0] += 1
        if count[0] % TRACE_EVERY:
            target(data)
            return
        target(data)  # untraced first: a lazy import on a new code path is not the input's cost
        tracemalloc.start()
        try:
            target(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        allowance = EVALUATED_ALLOWANCE if target in (_read_stream, _read_file) else 0
        if peak >= MEMORY_SLACK + allowance + MEMORY_FACTOR * len(data):
            raise MemoryError(f"peak allocation {peak} bytes for a {len(data)}-byte input")

    return one_input


def _import_everything() -> None:
    """Import every hurray_schema module now: ``instrument_all`` only instruments what is
    loaded, and the readers import some rule modules lazily."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(hs.__path__, hs.__name__ + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # a module of an extra whose third-party package is not installed
            if (exc.name or "").split(".")[0] == hs.__name__:
                raise  # one of our own modules or names is missing: never silently left out


def main(argv: list[str]) -> None:
    import atheris

    name = argv[1]
    target = ENTRY_POINTS[name]
    targets.entry_point(name)  # MissingEntryPoint, naming the module, if this build lacks it
    _import_everything()
    atheris.instrument_all()  # coverage feedback over everything imported so far
    atheris.Setup([argv[0], *argv[2:]], checked(target))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
