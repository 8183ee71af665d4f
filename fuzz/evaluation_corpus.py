"""Seed streams for fuzzing evaluation: every layout and scheme the evaluator decodes.

``fuzz.corpus`` seeds aim at the readers (a few layouts, realistic containers); these aim
at what comes after reading: one bare stream per seed descriptor of ``fuzz.corpus`` (tiled,
Morton, Hilbert, COO / CSR / CSF, block-paged, quantized, a private type) with seeded
random buffer bytes, plus reference-written (pyhurray) streams of the inputs issue 12
found crashing: scalar partition and overlay, an empty tensor with huge extents, private
types of every code width, a sparse tensor of a tall shape.
"""

from __future__ import annotations

import inspect
import random

import numpy as np

from hurray_schema.errors import HurraySchemaError
from hurray_schema.io.stream import write_stream
from hurray_schema.io.tensor import Tensor

from .corpus import seed_descriptors, seed_streams


def _bare(tensor) -> bytes:
    """A bare stream of ``tensor``; a writer that validates is asked not to (seeds may bend rules)."""
    options = {"validate": False} if "validate" in inspect.signature(write_stream).parameters else {}
    return write_stream(None, [tensor], **options)


def _descriptor_streams(rng: random.Random) -> list[bytes]:
    streams = []
    for desc in seed_descriptors():
        if desc.is_composite_head:
            continue
        buffers = [rng.randbytes(handle.byte_size) for handle in desc.buffers]
        try:
            streams.append(_bare(Tensor(desc, buffers)))
        except HurraySchemaError:
            continue
    return streams


def _reference_streams() -> list[bytes]:
    try:
        import hurray
    except ImportError:
        return []

    def stream(*tensors) -> bytes:
        with hurray.StreamWriter() as w:
            for t in tensors:
                w.write(t)
        return w.getvalue()

    f32 = hurray.float32

    def scalar(value):
        return hurray.Tensor(np.float32(value).tobytes(), f32, [], shard=hurray.Shard([], []))

    streams = [
        stream(hurray.Composite("partition", shape=[], dtype=f32, members=[scalar(1.5)])),
        stream(hurray.Composite("overlay", shape=[], dtype=f32, members=[scalar(1.5), scalar(2.0)], combine_op="add")),
        stream(hurray.Tensor(b"", f32, [0, 1 << 62])),
        stream(hurray.sparse_coo(np.array([1.0, 2.0, 3.0], np.float32),
                                 np.array([[0, 0], [1, 1], [7, 2]], np.uint64), [8, 3])),
    ]
    for bits in (8, 16, 24, 32, 64):
        ext = hurray.ExtensionType(bit_width=bits)
        streams.append(stream(hurray.Tensor(bytes(range(12 * bits // 8)), hurray.Dtype.from_tag(0xF7), [3, 4],
                                            extension_type=ext)))
    return streams


def evaluation_streams(seed: int = 5) -> list[bytes]:
    """The seeds above plus ``fuzz.corpus``'s bare streams."""
    return _descriptor_streams(random.Random(seed)) + _reference_streams() + seed_streams("bare")
