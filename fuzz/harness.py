"""Coverage-guided fuzzing of every entry point with atheris.

    python -m fuzz.harness decode_descriptor -max_total_time=600 fuzz/corpus_out

The invariant checked on every input: the entry point returns a value or raises a
``HurraySchemaError`` subclass -- any other exception is a finding (atheris stops and
writes the crashing input).  Entry points that are not present in this build are
reported and skipped.
"""

from __future__ import annotations

import io
import sys
import tempfile

import hurray_schema as hs


def _decode_descriptor(data: bytes) -> None:
    for mode in ("strict", "permissive"):
        hs.decode_descriptor(data, mode=mode)


def _read_stream(data: bytes) -> None:
    for framing in ("bare", "messages"):
        for item in hs.read_stream(io.BytesIO(data), framing=framing, mode="permissive"):
            pass


def _read_file(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".hrry") as f:
        f.write(data)
        f.flush()
        with hs.read_file(f.name, mode="permissive") as hf:
            for name in hf:
                hf[name]


def _audit(data: bytes) -> None:
    hs.audit(data, mode="permissive")


ENTRY_POINTS = {
    "decode_descriptor": (_decode_descriptor, "decode_descriptor"),
    "read_stream": (_read_stream, "read_stream"),
    "read_file": (_read_file, "read_file"),
    "audit": (_audit, "audit"),
}


def guarded(target):
    def one_input(data: bytes) -> None:
        try:
            target(data)
        except hs.HurraySchemaError:
            pass

    return one_input


def main(argv: list[str]) -> None:
    import atheris

    name = argv[1]
    target, api = ENTRY_POINTS[name]
    if not hasattr(hs, api):
        raise SystemExit(f"{api} is not available in this build")
    atheris.instrument_all()  # coverage feedback over everything imported so far
    atheris.Setup([argv[0], *argv[2:]], guarded(target))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
