"""Regenerate the sample data bundled in ``hurray_schema/samples/`` with this project's writers.

    python tools/make_samples.py            # rewrite the samples
    python tools/make_samples.py --check    # exit 1 if a committed sample differs

* ``sample.hrry`` -- a file holding a partition composite ``weights`` (float32
  [4, 6], two [4, 3] members), a plain tensor ``bias`` (float32 [6]) and two KV entries;
* ``member.bin`` -- the descriptor of ``weights.1`` alone (it carries a shard section);
* ``sample.stream`` -- the same tensors as a bare stream;
* ``faulty.stream`` -- a bare stream with three faults for ``hurray-schema audit`` to find:
  a partition composite whose members leave a column uncovered, a buffer handle whose
  reserved byte is 0x01, and a group composite announcing 3 members when 2 follow.

The values are fixed (``arange``), so the bytes are reproducible.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one

from hurray_schema.codec import encode_descriptor
from hurray_schema.io.file import write_file
from hurray_schema.io.stream import write_stream
from hurray_schema.io.tensor import Composite, Tensor
from hurray_schema.model import CompositionRule, ElementType, Shard
from hurray_schema.structs._declare import static_offset
from hurray_schema.structs.layouts import COMPOSITE
from hurray_schema.structs.wire import descriptor_spans

SAMPLES = Path(__file__).resolve().parents[1] / "hurray_schema" / "samples"


def items() -> dict:
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    left = Tensor.from_numpy(np.ascontiguousarray(full[:, :3]), shard=Shard((4, 6), (0, 0)))
    right = Tensor.from_numpy(np.ascontiguousarray(full[:, 3:]), shard=Shard((4, 6), (0, 3)))
    weights = Composite.build(CompositionRule.PARTITION, [left, right], shape=(4, 6), type_tag=ElementType.FLOAT32)
    bias = Tensor.from_numpy(np.linspace(-1.0, 1.0, 6, dtype=np.float32))
    return {"weights": weights, "bias": bias}


def faulty() -> bytes:
    f32 = np.float32
    gap = Composite.build(CompositionRule.PARTITION, [
        Tensor.from_numpy(np.zeros((4, 3), f32), shard=Shard((4, 6), (0, 0))),
        Tensor.from_numpy(np.ones((4, 2), f32), shard=Shard((4, 6), (0, 3))),  # column 5: nobody
    ], shape=(4, 6), type_tag=ElementType.FLOAT32)
    bias = Tensor.from_numpy(np.zeros(6, f32))
    group = Composite.build(CompositionRule.GROUP, [
        Tensor.from_numpy(np.zeros(2, f32)), Tensor.from_numpy(np.zeros(3, f32)),
    ], shape=(2,), type_tag=ElementType.FLOAT32)
    data = bytearray()
    for item in (gap, bias, group):
        start = len(data)
        data += write_stream(None, [item], validate=False)  # the gap is the point: the writer must not refuse it
        if item is bias:  # the last byte of its descriptor: the buffer handle's _reserved
            data[start + bias.descriptor.encoded_length - 1] = 0x01
        if item is group:  # member_count: promise 3 members, deliver 2
            layout_at = next(a for part, a, _ in descriptor_spans(group.descriptor) if part == "layout")
            at = start + layout_at + static_offset(COMPOSITE, "member_count")
            data[at:at + 4] = (3).to_bytes(4, "little")
    return bytes(data)


def render(outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    content = items()
    write_file(outdir / "sample.hrry", content, metadata={"producer": "hurray-schema samples", "layers": 1})
    (outdir / "member.bin").write_bytes(encode_descriptor(content["weights"].members[1].descriptor))
    write_stream(outdir / "sample.stream", [content["weights"].with_name("weights"), content["bias"]])
    (outdir / "faulty.stream").write_bytes(faulty())
    return sorted(outdir.iterdir())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed samples instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        for path in render(SAMPLES):
            print(f"wrote {path.relative_to(SAMPLES.parents[1])} ({path.stat().st_size} bytes)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = render(Path(tmp))
        stale = [p.name for p in fresh if not (SAMPLES / p.name).is_file() or (SAMPLES / p.name).read_bytes() != p.read_bytes()]
    if stale:
        print(f"out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    print("samples up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
