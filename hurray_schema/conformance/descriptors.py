"""Descriptor vectors: every rule a lone descriptor can break.

The semantic rules (``rules/descriptor``, ``rules/descriptor/composite_head.py``) are
broken in the model -- a value the rule forbids, encoded by
:func:`~hurray_schema.codec.encode_descriptor`, which checks nothing.  The structural
rules (``rules/structure.py``), which the model cannot express, start from a valid
encoding and change one field located through the declarations (:mod:`.patch`).
Buffer sizes follow the spec's formulas for each layout and scheme (cited per case).
"""

from __future__ import annotations

from typing import Callable

import attrs

from ..model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, BlockPagedLayout, BufferHandle, ColumnMajorLayout, CombineOp,
    CompositeLayout, CompositeMember, CompositionRule, CooLayout, CscLayout, CsfLayout, CsrLayout, DeviceTag,
    ElementType, ExtensionLayout, ExtensionType, HilbertLayout, LayoutTag, MemberRole, MemoryClass,
    MortonLayout, Mxfp, Nf4, PerBlockAffine, PerChannelAffine, PerTensorAffine, QuantFlag, Shard, Statistics,
    StatisticsMask, StridedLayout, SyncMode, TensorDescriptor, TiledLayout,
)
from ..structs.layouts import MAX_TILED_DEPTH
from ..structs.descriptor import FIXED_HEADER, FIXED_HEADER_SIZE, MAX_RANK, SUPPORTED_VERSION_MAJOR, \
    SUPPORTED_VERSION_MINOR, BUFFER_COUNT
from ..structs.quantization import QUANTIZATION_HEADER, QUANTIZATION_LENGTH
from ..structs._declare import plan, static_offset
from .case import Case
from ..io import Composite, Tensor
from .patch import bare, descriptor, header_at, located, put

__all__ = ["descriptor_cases"]

evolve = attrs.evolve
F32 = ElementType.FLOAT32


def handles(*sizes: int, **fields) -> list[BufferHandle]:
    return [BufferHandle(size, **fields) for size in sizes]


def dense(shape=(4, 4), type_tag=F32, size: int = 64, **fields) -> TensorDescriptor:
    """A row-major tensor (``layouts/row-major.md § Buffer Size``: product of shape x item size)."""
    fields.setdefault("buffers", handles(size))
    return TensorDescriptor(type_tag, tuple(shape), **fields)


GOOD = dense()
COO = TensorDescriptor(F32, (4, 4), CooLayout(2), buffers=handles(8, 32))  # values 2 x 4, indices 2 x 2 x 8
CSR = TensorDescriptor(F32, (3, 3), CsrLayout(3), buffers=handles(12, 24, 32))  # values, col idx, 4 row_ptr
CSC = TensorDescriptor(F32, (3, 3), CscLayout(3), buffers=handles(12, 24, 32))
CSF = TensorDescriptor(F32, (2, 2, 2), CsfLayout(3, (0, 1, 2)), buffers=handles(12, 16, 16, 24, 24, 32, 24))
PAGED = TensorDescriptor(ElementType.FLOAT16, (9, 2, 8), BlockPagedLayout(4, 3, 2),
                         buffers=handles(384, 12, 12))  # pool 3 pages x 4 x 2 x 8 x 2 bytes
TILED = TensorDescriptor(F32, (4, 4), TiledLayout((2, 2)), buffers=handles(64))
NESTED = TensorDescriptor(F32, (4, 4), TiledLayout((2, 2), inner_layout=LayoutTag.TILED, inner=TiledLayout((1, 1))),
                          buffers=handles(64))
MORTON = TensorDescriptor(F32, (4, 4), MortonLayout((2, 2)), buffers=handles(64))
HILBERT = TensorDescriptor(F32, (4, 4), HilbertLayout(2, 2), buffers=handles(64))
EMPTY = TensorDescriptor(F32, (0, 4), buffers=[BufferHandle(0, alignment=1)])
PER_TENSOR = TensorDescriptor(ElementType.INT8, (4, 4), buffers=handles(16), quantization=PerTensorAffine(0.5, 3))
PER_CHANNEL = TensorDescriptor(ElementType.INT8, (4, 4), buffers=handles(16, 16, 16),
                               quantization=PerChannelAffine(0, 1, 2))  # 4 float32 scales, 4 zero points
SYMMETRIC = int(QuantFlag.SYMMETRIC)
PER_CHANNEL_SYMMETRIC = TensorDescriptor(ElementType.INT8, (4, 4), buffers=handles(16, 16),
                                         quantization=PerChannelAffine(0, 1, NO_BUFFER_INDEX, flags=SYMMETRIC))
# per-block along axis 1 of [4, 8], blocks of 4: 2 blocks x 4 rows = 8 float32 scales + 8 zero points
PER_BLOCK = TensorDescriptor(ElementType.INT8, (4, 8), buffers=handles(32, 32, 32),
                             quantization=PerBlockAffine(1, 4, 1, 2))
PER_BLOCK_SYMMETRIC = TensorDescriptor(ElementType.INT8, (4, 8), buffers=handles(32, 32),
                                       quantization=PerBlockAffine(1, 4, 1, NO_BUFFER_INDEX, flags=SYMMETRIC))
NF4 = TensorDescriptor(ElementType.UINT4, (4, 16), buffers=handles(32, 32), quantization=Nf4(1, 8, 1))
MXFP = TensorDescriptor(ElementType.FLOAT8_E4M3, (2, 32), buffers=handles(64, 4), quantization=Mxfp(1, 16, 1))
EXTENSION = TensorDescriptor(0xF0, (4, 4), buffers=handles(16), extension_type=ExtensionType(8, 1))
HEAD = TensorDescriptor(F32, (8, 8), CompositeLayout(CompositionRule.PARTITION, 2))
MEMBER = dense(shard=Shard((8, 4), (4, 0)), composite_member=CompositeMember(MemberRole.BASE))
ALL_STATISTICS = int(StatisticsMask.NNZ_VALID | StatisticsMask.SPARSITY_VALID | StatisticsMask.VALUE_RANGE_VALID
                     | StatisticsMask.VALUE_STATS_VALID | StatisticsMask.NM_SPARSITY_VALID)
STATISTICS = dense(statistics=Statistics(computed_mask=ALL_STATISTICS, nnz=16, nm_n=2, nm_m=4, value_stddev=0.5))
FIRST_RESERVED_MASK_BIT = max(StatisticsMask) << 1
"""The lowest computed_mask bit metadata.md § computed_mask leaves reserved."""
PRIVATE_DEVICE = dense(buffers=[BufferHandle(64, device_tag=0xF0)])
CUDA = DeviceTag.CUDA


def _tiled(depth: int) -> TiledLayout:
    """``depth`` tiling levels of [1, 1] tiles (``layouts/tiled.md § Recursive Tiling``)."""
    level = TiledLayout((1, 1))
    for _ in range(depth - 1):
        level = TiledLayout((1, 1), inner_layout=LayoutTag.TILED, inner=level)
    return level


def _model(rule_id: str, good: TensorDescriptor, bad: TensorDescriptor) -> Case:
    return Case(rule_id, "descriptor", lambda: (descriptor(good), descriptor(bad)))


SEMANTIC = [
    ("data_model.scalar.layout", dense((), size=4), dense((), size=4, layout=ColumnMajorLayout())),
    ("data_model.shard.dynamic", dense(shard=Shard((8, 4), (4, 0))),
     dense((DYNAMIC_DIMENSION, 4), shard=Shard((8, 4), (0, 0)))),
    ("metadata.flags.extension_type", EXTENSION, dense(extension_type=ExtensionType(32, 1))),
    ("metadata.byte_offset.bounds", GOOD, dense(size=128, byte_offset=129)),
    ("layout.tiled.tile_shape", TILED, evolve(TILED, layout=TiledLayout((0, 2)))),
    ("layout.tiled.outer_layout", TILED, evolve(TILED, layout=TiledLayout((2, 2), outer_layout=0x05))),
    ("layout.tiled.inner_layout", TILED, evolve(TILED, layout=TiledLayout((2, 2), inner_layout=0x06))),
    ("layout.tiled.reserved", NESTED,
     evolve(NESTED, layout=evolve(NESTED.layout, inner=TiledLayout((1, 1), reserved=b"\x00\x07")))),
    ("layout.morton.bits", MORTON, evolve(MORTON, layout=MortonLayout((0, 2)))),
    ("layout.morton.shape", MORTON, evolve(MORTON, layout=MortonLayout((1, 3)))),
    ("layout.coo.reserved", COO, evolve(COO, layout=CooLayout(2, reserved=b"\x01" + bytes(6)))),
    ("layout.csr.reserved", CSR, evolve(CSR, layout=CsrLayout(3, reserved=b"\x01" + bytes(7)))),
    ("layout.csc.reserved", CSC, evolve(CSC, layout=CscLayout(3, reserved=b"\x01" + bytes(7)))),
    ("layout.csf.reserved", CSF, evolve(CSF, layout=CsfLayout(3, (0, 1, 2), reserved=b"\x01" + bytes(7)))),
    ("layout.block_paged.reserved", PAGED,
     evolve(PAGED, layout=BlockPagedLayout(4, 3, 2, reserved=b"\x01" + bytes(5)))),
    ("layout.coo.byte_offset", COO, evolve(COO, byte_offset=8)),
    ("layout.csr.byte_offset", CSR, evolve(CSR, byte_offset=8)),
    ("layout.csc.byte_offset", CSC, evolve(CSC, byte_offset=8)),
    ("layout.csf.byte_offset", CSF, evolve(CSF, byte_offset=8)),
    ("layout.block_paged.byte_offset", PAGED, evolve(PAGED, byte_offset=8)),
    ("layout.coo.buffer_count", COO, evolve(COO, buffers=handles(8, 32, 8))),
    ("layout.csr.buffer_count", CSR, evolve(CSR, buffers=handles(12, 24))),
    ("layout.csc.buffer_count", CSC, evolve(CSC, buffers=handles(12, 24))),
    ("layout.csf.buffer_count", CSF, evolve(CSF, buffers=handles(12, 16, 16, 24, 24, 32))),
    ("layout.csr.rank", CSR, evolve(CSR, shape=(3, 3, 1))),
    ("layout.csc.rank", CSC, evolve(CSC, shape=(3, 3, 1))),
    ("layout.csf.rank", CSF, TensorDescriptor(F32, (2, 2), CsfLayout(3, (0, 1)), buffers=handles(12, 16, 16, 24, 24))),
    ("layout.block_paged.rank", PAGED, evolve(PAGED, shape=(9, 16))),
    ("layout.csf.shard", CSF, evolve(CSF, shard=Shard((2, 2, 2), (0, 0, 0)))),
    ("layout.block_paged.shard", PAGED, evolve(PAGED, shard=Shard((9, 2, 8), (0, 0, 0)))),
    ("layout.csf.mode_order", evolve(CSF, layout=CsfLayout(3, (2, 0, 1))), evolve(CSF, layout=CsfLayout(3, (0, 0, 2)))),
    ("layout.block_paged.paged_axis", PAGED, evolve(PAGED, layout=BlockPagedLayout(4, 3, 2, paged_axis=1))),
    ("layout.block_paged.page_size", PAGED, evolve(PAGED, layout=BlockPagedLayout(0, 3, 2))),
    ("layout.block_paged.buffer_count", PAGED, evolve(PAGED, buffers=handles(384, 12))),
    ("layout.block_paged.quantization",
     TensorDescriptor(ElementType.INT8, (9, 2, 8), BlockPagedLayout(4, 3, 2), buffers=handles(192, 12, 12, 48, 48),
                      quantization=PerBlockAffine(0, 4, 3, 4)),
     TensorDescriptor(ElementType.INT8, (9, 2, 8), BlockPagedLayout(4, 3, 2), buffers=handles(192, 12, 12, 48, 48),
                      quantization=PerBlockAffine(0, 8, 3, 4))),
    ("layout.hilbert.order", HILBERT, evolve(HILBERT, shape=(1, 1), buffers=handles(4), layout=HilbertLayout(0, 2))),
    ("layout.hilbert.rank", HILBERT, evolve(HILBERT, layout=HilbertLayout(2, 3))),
    ("layout.hilbert.shape", HILBERT, evolve(HILBERT, shape=(4, 2))),
    ("metadata.buffer_count.minimum", GOOD, dense(buffers=[])),
    ("metadata.buffer_count.dense", GOOD, dense(buffers=handles(64, 64))),
    ("buffer.reserved", GOOD, dense(buffers=[BufferHandle(64, reserved=1)])),
    ("buffer.alignment.power_of_two", EMPTY, dense(buffers=[BufferHandle(64, alignment=48)])),
    ("buffer.alignment.minimum", EMPTY, dense(buffers=[BufferHandle(64, alignment=32)])),
    ("buffer.device_tag.invalid", GOOD, dense(buffers=[BufferHandle(64, device_tag=0xFF)])),
    ("buffer.device_tag.reserved", GOOD, dense(buffers=[BufferHandle(64, device_tag=0x09)])),
    ("buffer.sync_mode.invalid", GOOD, dense(buffers=[BufferHandle(64, device_tag=CUDA, sync_mode=0xFF)])),
    ("buffer.sync_mode.reserved", GOOD, dense(buffers=[BufferHandle(64, device_tag=CUDA, sync_mode=0x03)])),
    ("buffer.sync_mode.cpu", dense(buffers=[BufferHandle(64, device_tag=CUDA, sync_mode=SyncMode.EVENT)]),
     dense(buffers=[BufferHandle(64, sync_mode=SyncMode.EVENT)])),
    ("buffer.memory_class.invalid", GOOD, dense(buffers=[BufferHandle(64, memory_class=0xFF)])),
    ("buffer.memory_class.reserved", GOOD, dense(buffers=[BufferHandle(64, memory_class=0x04)])),
    ("buffer.memory_class.private", PRIVATE_DEVICE,
     dense(buffers=[BufferHandle(64, device_tag=0xF0, memory_class=0xF3)])),
    ("buffer.memory_class.device", dense(buffers=[BufferHandle(64, device_tag=CUDA, memory_class=MemoryClass.PEER)]),
     dense(buffers=[BufferHandle(64, memory_class=MemoryClass.PEER)])),
    ("buffer.colocation", COO,
     evolve(COO, buffers=[BufferHandle(8), BufferHandle(32, memory_class=MemoryClass.HOST_PINNED)])),
    ("layout.dense.buffer_size", GOOD, dense(size=60)),
    ("layout.strided.buffer_bounds",
     TensorDescriptor(F32, (3, 4), StridedLayout((-4, 1)), buffers=handles(48), byte_offset=32),
     TensorDescriptor(F32, (3, 4), StridedLayout((-4, 1)), buffers=handles(48))),
    ("layout.morton.buffer_size", MORTON, evolve(MORTON, buffers=handles(32))),
    ("layout.hilbert.buffer_size", HILBERT, evolve(HILBERT, buffers=handles(32))),
    ("layout.sparse.buffer_size", COO, evolve(COO, buffers=handles(8, 16))),
    ("adr007.empty.data_buffer_size", EMPTY, evolve(EMPTY, buffers=handles(64))),
    ("quantization.flags.reserved", PER_TENSOR, evolve(PER_TENSOR, quantization=PerTensorAffine(0.5, 3, flags=1))),
    ("quantization.scheme_version.value", PER_TENSOR,
     evolve(PER_TENSOR, quantization=PerTensorAffine(0.5, 3, scheme_version=0))),
    ("quantization.reserved", PER_TENSOR,
     evolve(PER_TENSOR, quantization=PerTensorAffine(0.5, 3, reserved=b"\x00\x00\x01\x00"))),
    ("quantization.axis", PER_CHANNEL, evolve(PER_CHANNEL, quantization=PerChannelAffine(2, 1, 2))),
    ("quantization.axis.dynamic", PER_CHANNEL, evolve(PER_CHANNEL, shape=(DYNAMIC_DIMENSION, 4))),
    ("quantization.per_block.block_size", PER_BLOCK, evolve(PER_BLOCK, quantization=PerBlockAffine(1, 3, 1, 2))),
    ("quantization.nf4.block_size", NF4, evolve(NF4, quantization=Nf4(1, 4, 1), buffers=handles(32, 64))),
    ("quantization.mxfp.block_size", MXFP, evolve(MXFP, quantization=Mxfp(1, 8, 1), buffers=handles(64, 8))),
    ("quantization.block_size.upper",
     TensorDescriptor(ElementType.INT8, (4, 0), buffers=handles(0, 0, 0), quantization=PerBlockAffine(1, 16, 1, 2)),
     evolve(PER_BLOCK, quantization=PerBlockAffine(1, 16, 1, 2), buffers=handles(32, 16, 16))),
    # [2, 6] in blocks of 4 along axis 1: 2 blocks per row, storage padded to 2 x 8 int8 = 16 bytes
    ("quantization.block_padding",
     TensorDescriptor(ElementType.INT8, (2, 6), buffers=handles(16, 16),
                      quantization=PerBlockAffine(1, 4, 1, NO_BUFFER_INDEX, flags=SYMMETRIC)),
     TensorDescriptor(ElementType.INT8, (2, 6), buffers=handles(12, 16),
                      quantization=PerBlockAffine(1, 4, 1, NO_BUFFER_INDEX, flags=SYMMETRIC))),
    ("quantization.mxfp.multiple",
     TensorDescriptor(ElementType.FLOAT8_E4M3, (2, 0), buffers=handles(0, 0), quantization=Mxfp(1, 16, 1)),
     TensorDescriptor(ElementType.FLOAT8_E4M3, (2, 40), buffers=handles(80, 6), quantization=Mxfp(1, 16, 1))),
    ("quantization.per_tensor.scale", PER_TENSOR, evolve(PER_TENSOR, quantization=PerTensorAffine(float("nan"), 3))),
    ("quantization.per_tensor.zero_point",
     evolve(PER_TENSOR, type_tag=ElementType.UINT8, quantization=PerTensorAffine(1.0, 255)),
     evolve(PER_TENSOR, type_tag=ElementType.UINT8, quantization=PerTensorAffine(1.0, 256))),
    ("quantization.per_channel.scale_type", PER_CHANNEL,
     evolve(PER_CHANNEL, quantization=PerChannelAffine(0, 1, 2, scale_type_tag=1))),
    ("quantization.per_block.scale_type", PER_BLOCK,
     evolve(PER_BLOCK, quantization=PerBlockAffine(1, 4, 1, 2, scale_type_tag=4))),
    ("quantization.per_channel.symmetric_index", PER_CHANNEL_SYMMETRIC,
     evolve(PER_CHANNEL_SYMMETRIC, quantization=PerChannelAffine(0, 1, 7, flags=SYMMETRIC))),
    ("quantization.per_block.symmetric_index", PER_BLOCK_SYMMETRIC,
     evolve(PER_BLOCK_SYMMETRIC, quantization=PerBlockAffine(1, 4, 1, 7, flags=SYMMETRIC))),
    ("quantization.per_tensor.storage_type", PER_TENSOR, evolve(PER_TENSOR, type_tag=F32, buffers=handles(64))),
    ("quantization.per_channel.storage_type", PER_CHANNEL,
     evolve(PER_CHANNEL, type_tag=F32, buffers=handles(64, 16, 16))),
    ("quantization.per_block.storage_type", PER_BLOCK,
     evolve(PER_BLOCK, type_tag=ElementType.INT16, buffers=handles(64, 32, 32))),
    ("quantization.nf4.storage_type", NF4, evolve(NF4, type_tag=ElementType.UINT8, buffers=handles(64, 32))),
    ("quantization.mxfp.storage_type", MXFP, evolve(MXFP, type_tag=ElementType.UINT8)),
    ("quantization.buffer_index.range", PER_CHANNEL, evolve(PER_CHANNEL, quantization=PerChannelAffine(0, 5, 2))),
    ("quantization.buffer_index.data", PER_CHANNEL, evolve(PER_CHANNEL, quantization=PerChannelAffine(0, 0, 2))),
    ("quantization.buffer.size", PER_CHANNEL, evolve(PER_CHANNEL, buffers=handles(16, 12, 16))),
    ("metadata.shard.bounds", dense(shard=Shard((8, 4), (4, 0))), dense(shard=Shard((8, 4), (5, 0)))),
    ("metadata.statistics.mask_reserved", STATISTICS,
     dense(statistics=Statistics(computed_mask=StatisticsMask.NNZ_VALID | FIRST_RESERVED_MASK_BIT, nnz=16))),
    ("metadata.statistics.reserved", STATISTICS, dense(statistics=Statistics(reserved=1))),
    ("metadata.statistics.nm", STATISTICS,
     dense(statistics=Statistics(computed_mask=StatisticsMask.NM_SPARSITY_VALID, nm_n=4, nm_m=2))),
    ("metadata.statistics.stddev", STATISTICS,
     dense(statistics=Statistics(computed_mask=StatisticsMask.VALUE_STATS_VALID, value_stddev=-0.5))),
    ("layout.sparse.statistics_nnz", evolve(COO, statistics=Statistics(computed_mask=StatisticsMask.NNZ_VALID, nnz=2)),
     evolve(COO, statistics=Statistics(computed_mask=StatisticsMask.NNZ_VALID, nnz=3))),
    ("metadata.extension_type.bit_width", EXTENSION, evolve(EXTENSION, extension_type=ExtensionType(0, 1))),
    ("metadata.extension_type.packing", EXTENSION, evolve(EXTENSION, extension_type=ExtensionType(8, 2))),
    ("metadata.extension_type.float_fields",
     evolve(EXTENSION, extension_type=ExtensionType(8, 1, is_float=1, sign_bits=1, exponent_bits=4, mantissa_bits=3,
                                                    exponent_bias=7)),
     evolve(EXTENSION, extension_type=ExtensionType(8, 1, is_float=1, is_signed=1))),
    ("metadata.extension_type.reserved", EXTENSION,
     evolve(EXTENSION, extension_type=ExtensionType(8, 1, reserved2=b"\x00\x02"))),
    ("metadata.composite_member.role", MEMBER, evolve(MEMBER, composite_member=CompositeMember(2))),
    ("metadata.composite_member.reserved", MEMBER,
     evolve(MEMBER, composite_member=CompositeMember(MemberRole.CORRECTION, reserved=b"\x01" + bytes(14)))),
]


HEAD_RULES = [
    ("composite.head.buffer_count_zero", HEAD, evolve(HEAD, buffers=handles(64))),
    ("composite.head.byte_offset_zero", HEAD, evolve(HEAD, byte_offset=16)),
    ("composite.head.no_member_section", HEAD, evolve(HEAD, composite_member=CompositeMember(MemberRole.BASE))),
    ("composite.head.no_quantization", HEAD,
     evolve(HEAD, type_tag=ElementType.INT8, quantization=PerTensorAffine(1.0))),  # a valid storage type
    ("composite.head.rule_reserved", HEAD, evolve(HEAD, layout=CompositeLayout(0x04, 2))),
    ("composite.head.rule_private", HEAD, evolve(HEAD, layout=CompositeLayout(0xF1, 2))),
    ("composite.head.combine_op", HEAD,
     evolve(HEAD, layout=CompositeLayout(CompositionRule.PARTITION, 2, CombineOp.REPLACE))),
    ("composite.head.reserved", HEAD,
     evolve(HEAD, layout=CompositeLayout(CompositionRule.PARTITION, 2, reserved=b"\x00\x05"))),
    ("composite.head.open_sentinel", HEAD, evolve(HEAD, layout=CompositeLayout(CompositionRule.PARTITION, 0xFFFFFFFF))),
]
"""The composite head rules: a head is never alone (a lone head is a torn composite,
``layouts/composite.md § Validation``), so these are bare streams of the head and two
members that cover it."""


def _members() -> list:
    return [Tensor.dense(F32, (8, 4), shard=Shard((8, 8), (0, column))) for column in (0, 4)]


def _with_head(desc: TensorDescriptor) -> Composite:
    """A Composite of ``desc`` over the two members, whatever member_count ``desc`` says."""
    honest = evolve(desc, layout=evolve(desc.layout, member_count=2))
    item = Composite(honest, _members())
    item.descriptor = desc
    return item


def _head(rule_id: str, good: TensorDescriptor, bad: TensorDescriptor) -> Case:
    return Case(rule_id, "stream", lambda: (bare([_with_head(good)]), bare([_with_head(bad)])))


# -- structural rules: one field of a valid encoding changed ---------------------------------

QUANTIZED = TensorDescriptor(ElementType.INT4, (128, 128), buffers=handles(8192, 256),
                             quantization=PerBlockAffine(1, 128, 1, flags=SYMMETRIC,
                                                         scale_type_tag=ElementType.FLOAT16))


def _header_patch(name: str, value, base: TensorDescriptor = GOOD) -> Callable[[], tuple[bytes, bytes]]:
    def build():
        good = descriptor(base)
        return good, put(good, header_at(name), FIXED_HEADER, name, value)
    return build


def _quantization_header_patch(name: str, value) -> Callable[[], tuple[bytes, bytes]]:
    """A field of the scheme header (``quantization.md § Descriptor Header``), after quantization_length."""
    def build():
        good = descriptor(QUANTIZED)
        at = located(QUANTIZED).part("quantization") + plan(QUANTIZATION_LENGTH).fixed_size
        return good, put(good, at + static_offset(QUANTIZATION_HEADER, name), QUANTIZATION_HEADER, name, value)
    return build


def _truncated():
    good = descriptor(GOOD)
    return good, good[:-1]


def _length_bounds():
    """buffer_count promises more handles than descriptor_length holds."""
    good = descriptor(GOOD)
    return good, put(good, located(GOOD).buffer_count(), BUFFER_COUNT, "buffer_count", 255)


def _length_exact():
    """One unexplained byte after the last section, descriptor_length counting it."""
    good = descriptor(GOOD)
    longer = good + b"\x00"
    return good, put(longer, header_at("descriptor_length"), FIXED_HEADER, "descriptor_length", len(longer))


def _tiled_depth():
    good = TensorDescriptor(F32, (2, 2), _tiled(MAX_TILED_DEPTH), buffers=handles(16))
    return descriptor(good), descriptor(evolve(good, layout=_tiled(MAX_TILED_DEPTH + 1)))


def _extension_unknown():
    return descriptor(GOOD), descriptor(TensorDescriptor(F32, (4, 4), ExtensionLayout(0xF0, 1), buffers=handles(64)))


def _quantization_length_bounds():
    """quantization_length shorter than the scheme's table, the descriptor cut to match."""
    good = descriptor(QUANTIZED)
    at = located(QUANTIZED).part("quantization")
    short = plan(QUANTIZATION_LENGTH).fixed_size + plan(QUANTIZATION_HEADER).fixed_size
    scheme_table = short - plan(QUANTIZATION_LENGTH).fixed_size
    bad = put(good[:at + short], at, QUANTIZATION_LENGTH, "quantization_length", scheme_table)
    return good, put(bad, header_at("descriptor_length"), FIXED_HEADER, "descriptor_length", len(bad))


STRUCTURAL = [
    Case("descriptor.truncated", "descriptor", _truncated, "the last byte cut off"),
    Case("descriptor.magic", "descriptor", _header_patch("magic", b"HRRX")),
    Case("descriptor.version_major", "descriptor", _header_patch("version_major", SUPPORTED_VERSION_MAJOR + 1)),
    Case("descriptor.version_minor", "descriptor", _header_patch("version_minor", SUPPORTED_VERSION_MINOR + 1)),
    Case("descriptor.length.minimum", "descriptor", _header_patch("descriptor_length", FIXED_HEADER_SIZE - 1)),
    Case("descriptor.length.bounds", "descriptor", _length_bounds, "buffer_count 255 in a one-handle descriptor"),
    Case("descriptor.length.exact", "descriptor", _length_exact, "one byte after the last section"),
    Case("descriptor.flags.reserved", "descriptor", _header_patch("flags", 1 << 5)),
    Case("descriptor.rank.cap", "descriptor", _header_patch("rank", MAX_RANK + 1)),
    Case("descriptor.type_tag.invalid", "descriptor", _header_patch("type_tag", 0x00)),
    Case("descriptor.type_tag.unknown", "descriptor", _header_patch("type_tag", 0x47)),
    Case("descriptor.layout_tag.invalid", "descriptor", _header_patch("layout_tag", 0xFF)),
    Case("descriptor.layout_tag.unknown", "descriptor", _header_patch("layout_tag", 0x0C)),
    Case("descriptor.layout.extension_unknown", "descriptor", _extension_unknown),
    Case("descriptor.tiled.depth", "descriptor", _tiled_depth, "nine tiling levels"),
    Case("quantization.scheme_tag.invalid", "descriptor", _quantization_header_patch("scheme_tag", 0x00)),
    Case("quantization.scheme_tag.unknown", "descriptor", _quantization_header_patch("scheme_tag", 0x06)),
    Case("quantization.scheme_version", "descriptor", _quantization_header_patch("scheme_version", 2)),
    Case("quantization.length.bounds", "descriptor", _quantization_length_bounds),
]


def descriptor_cases() -> list[Case]:
    """Every descriptor case: the semantic rules broken in the model, then the structural ones."""
    return ([_model(rule_id, good, bad) for rule_id, good, bad in SEMANTIC]
            + [_head(rule_id, good, bad) for rule_id, good, bad in HEAD_RULES] + STRUCTURAL)
