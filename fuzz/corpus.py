"""Seed inputs built by this project's own encoder (no external files needed).

Where ``../shared/conformance`` is present its descriptor vectors are added too.
"""

from __future__ import annotations

from pathlib import Path

from hurray_schema import (
    BlockPagedLayout, BufferHandle, CompositeLayout, CompositeMember, CooLayout, CsfLayout, CsrLayout,
    ExtensionType, HilbertLayout, MortonLayout, PerBlockAffine, PerTensorAffine, Shard, Statistics,
    StridedLayout, TensorDescriptor, TiledLayout, encode_descriptor,
)

CONFORMANCE = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "descriptors"


def seed_descriptors() -> list[TensorDescriptor]:
    f32, buf = 0x03, BufferHandle
    return [
        TensorDescriptor(f32, (3, 4), buffers=(buf(48),)),
        TensorDescriptor(f32, (0, 4), buffers=(buf(0),)),
        TensorDescriptor(f32, (), buffers=(buf(4),)),
        TensorDescriptor(f32, (3, 4), StridedLayout((-4, 1)), (buf(48),), byte_offset=32),
        TensorDescriptor(f32, (8, 8), TiledLayout((4, 4), 1, 4, inner=TiledLayout((2, 2))), (buf(256),)),
        TensorDescriptor(f32, (4, 4), MortonLayout((2, 2)), (buf(64),)),
        TensorDescriptor(f32, (4, 4), HilbertLayout(2, 2), (buf(64),)),
        TensorDescriptor(f32, (3, 3), CooLayout(2, 1), (buf(8), buf(32))),
        TensorDescriptor(f32, (3, 3), CsrLayout(0), (buf(0), buf(0), buf(32))),
        TensorDescriptor(f32, (2, 2, 2), CsfLayout(1, (0, 1, 2)), tuple(buf(8) for _ in range(7))),
        TensorDescriptor(0x01, (4, 16, 2, 8), BlockPagedLayout(16, 4, 2),
                         (buf(4096), buf(16), buf(12))),
        TensorDescriptor(f32, (8, 8), CompositeLayout(1, 2)),
        TensorDescriptor(0x48, (128, 128), buffers=(buf(8192), buf(256)),
                         quantization=PerBlockAffine(1, 64, 1, scale_type_tag=0x01, flags=1)),
        TensorDescriptor(0x11, (10,), buffers=(buf(10),), quantization=PerTensorAffine(0.5, 3)),
        TensorDescriptor(f32, (8, 4), buffers=(buf(128),), shard=Shard((8, 8), (0, 4)),
                         statistics=Statistics(computed_mask=5, nnz=3, value_min=-1.0, value_max=2.0,
                                               value_abs_max=2.0),
                         composite_member=CompositeMember(0)),
        TensorDescriptor(0xF0, (16,), buffers=(buf(8),), extension_type=ExtensionType(4, 2, 1, 0, 1, 2, 1, 1)),
    ]


def seed_inputs() -> list[bytes]:
    seeds = [encode_descriptor(d) for d in seed_descriptors()]
    if CONFORMANCE.is_dir():
        seeds += [p.read_bytes() for p in sorted(CONFORMANCE.glob("*.bin"))]
    return seeds
