"""Hypothesis strategies: valid descriptors, streams and files, then damaged.

``valid_descriptors()`` draws tensors across element types, ranks (scalars and empty
tensors included), dense, strided, sparse and composite-head layouts and optional shard
sections; only descriptors our strict decoder accepts are kept, so a bug that makes a
valid descriptor fail shows up as a health-check failure rather than silently.
``streams()`` and ``files()`` wrap drawn tensors (and a group composite) with this
project's writers.  ``damaged(strategy)`` applies a drawn list of mutations -- the same
kinds as :mod:`fuzz.mutate`, but chosen by Hypothesis so failures shrink.
"""

from __future__ import annotations

import math
import struct

from hypothesis import assume
from hypothesis import strategies as st

import hurray_schema as hs
from hurray_schema.model import (
    BufferHandle, ColumnMajorLayout, CompositeLayout, CooLayout, CsrLayout, Shard, StridedLayout, TensorDescriptor,
)
from hurray_schema.structs.element_types import ELEMENT_TYPES

_TAGS = sorted(int(t) for t in ELEMENT_TYPES)
_F32 = 0x03


@st.composite
def valid_descriptors(draw, max_rank: int = 4, max_dim: int = 6) -> TensorDescriptor:
    tag = draw(st.sampled_from(_TAGS))
    info = ELEMENT_TYPES[tag]
    rank = draw(st.integers(0, max_rank))
    shape = tuple(draw(st.lists(st.integers(0, max_dim), min_size=rank, max_size=rank)))
    n = math.prod(shape)
    kind = draw(st.sampled_from(["row", "col", "strided", "coo", "csr", "head"]))
    shard = None
    if rank and draw(st.booleans()):
        extra = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
        offset = tuple(draw(st.integers(0, e)) for e in extra)
        shard = Shard(tuple(s + e for s, e in zip(shape, extra)), offset)
    if kind == "head":
        desc = TensorDescriptor(tag, shape, CompositeLayout(3, draw(st.integers(0, 4))))
    elif kind == "coo" and rank:
        nnz = draw(st.integers(0, max(n, 0)))
        desc = TensorDescriptor(tag, shape, CooLayout(nnz, 0),
                                (BufferHandle(info.buffer_bytes(nnz)), BufferHandle(8 * nnz * rank)), shard=shard)
    elif kind == "csr" and rank == 2:
        desc = TensorDescriptor(tag, shape, CsrLayout(0),
                                (BufferHandle(0), BufferHandle(0), BufferHandle(8 * (shape[0] + 1))), shard=shard)
    elif kind == "strided" and rank and not info.sub_byte:
        strides = tuple(math.prod(shape[i + 1:]) for i in range(rank))
        desc = TensorDescriptor(tag, shape, StridedLayout(strides), (BufferHandle(info.buffer_bytes(n)),), shard=shard)
    elif kind == "col" and rank:
        desc = TensorDescriptor(tag, shape, ColumnMajorLayout(), (BufferHandle(info.buffer_bytes(n)),), shard=shard)
    else:
        desc = TensorDescriptor(tag, shape, buffers=(BufferHandle(info.buffer_bytes(n)),), shard=shard)
    try:
        hs.decode_descriptor(hs.encode_descriptor(desc))
    except hs.HurraySchemaError:
        assume(False)
    return desc


def _tensor(desc: TensorDescriptor, fill: int):
    from hurray_schema.io.tensor import Tensor

    return Tensor(desc, [bytes([fill]) * h.byte_size for h in desc.buffers])


@st.composite
def items(draw, max_items: int = 3):
    """Tensors (no heads) and, sometimes, a group composite over some of them."""
    from hurray_schema.io.tensor import Composite

    descs = draw(st.lists(valid_descriptors().filter(lambda d: not d.is_composite_head), min_size=1,
                          max_size=max_items))
    out = [_tensor(d, i) for i, d in enumerate(descs)]
    if len(out) >= 2 and draw(st.booleans()):
        head = TensorDescriptor(_F32, (4,), CompositeLayout(3, len(out) - 1))
        out = [Composite(head, out[1:]), out[0]]
    return out


@st.composite
def streams(draw, framing: str = "bare") -> bytes:
    from hurray_schema.io.stream import write_stream

    return write_stream(None, draw(items()), framing=framing)


@st.composite
def files(draw, directory) -> bytes:
    from hurray_schema.io.file import write_file

    chosen = draw(items())
    kv = draw(st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=4),
                                                     st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=8),
                                                               st.binary(max_size=8), st.booleans()),
                                                     max_size=3)))
    path = directory / "hypothesis.hrry"
    write_file(path, {f"t{i}": item for i, item in enumerate(chosen)}, metadata=kv,
               sorted_index=draw(st.booleans()))
    return path.read_bytes()


_OPS = ("flip", "truncate", "u64", "u32", "byte", "insert", "delete")
_EXTREMES = (0, 1, 2**31, 2**32 - 1, 2**32, 2**60, 2**63, 2**64 - 1)


@st.composite
def damaged(draw, inputs) -> bytes:
    """An input from ``inputs`` with one to three drawn mutations."""
    data = bytearray(draw(inputs))
    for _ in range(draw(st.integers(1, 3))):
        if not data:
            break
        op = draw(st.sampled_from(_OPS))
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "u64" and at + 8 <= len(data):
            data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from(_EXTREMES)))
        elif op == "u32" and at + 4 <= len(data):
            data[at:at + 4] = struct.pack("<I", draw(st.sampled_from(_EXTREMES)) & 0xFFFFFFFF)
        elif op == "byte":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 16))]
    return bytes(data)
