"""Rules on the buffer table and the buffer handles (``metadata.md § Buffer Table``,
``buffer-protocol.md``), then on the byte size of the layout buffers (each layout
page's § Buffer Size, ADR-007 for empty tensors).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from ...structs.descriptor import MIN_BUFFER_ALIGNMENT
from ...structs.tags import is_private_tag
from ...model import (
    DYNAMIC_DIMENSION, BlockPagedLayout, BlockTableIndexType, ColumnMajorLayout, CompositeLayout, CooLayout, CscLayout, CsfLayout, CsrLayout, DeviceTag,
    ExtensionLayout, HilbertLayout, MemoryClass, MortonLayout, RowMajorLayout, StridedLayout, SyncMode, TiledLayout,
    UnknownLayout, UnknownQuantization,
)
from ...structs.element_types import element_type_info
from ..engine import Level
from .dispatch import ALWAYS, Fact, When, descriptor_rule
from .sizes import (
    DENSE_LAYOUTS, DENSE_TAGS, PAGED_LAYOUTS, data_handle, dynamic, element_count_source, parameter_count_source,
    power_of_two, quantization_parameter_count, storage_bytes, storage_source,
)

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT
_HANDLES = When(facts={Fact.UNUSUAL_BUFFERS})
"""A rule on the handles' own fields can fire only when some handle is not a plain one."""
_LAST_NAMED_DEVICE = int(max(DeviceTag))
_LAST_MEMORY_CLASS = int(max(MemoryClass))
_LAST_SYNC_MODE = int(max(SyncMode))
_INVALID = 0xFF


@descriptor_rule("metadata.buffer_count.minimum", MUST, "metadata.md § Buffer Table",
                 "buffer_count is at least 1 for every layout but the composite head.", when=ALWAYS,
                 fast=lambda s: issubclass(s.layout, (UnknownLayout, CompositeLayout)) or s.buffer_count > 0)
def _count_min(desc, ctx):
    if isinstance(desc.layout, (UnknownLayout, CompositeLayout)):
        return
    if not desc.buffers:
        return "buffer_count is 0 for a tensor that is not a composite head", ctx.buffer_count()


@descriptor_rule("metadata.buffer_count.dense", MUST, "metadata.md § Buffer Table",
                 "A dense layout (0x01-0x05, 0x40) has exactly one buffer, plus the parameter buffers its "
                 "quantization scheme requires.", when=When(layouts=DENSE_LAYOUTS),
                 fast=lambda s: _count_dense_source(s))
def _count_dense(desc, ctx):
    if desc.layout.tag in DENSE_TAGS and not isinstance(desc.quantization, UnknownQuantization):
        want = 1 + quantization_parameter_count(desc.quantization)
        if len(desc.buffers) != want:
            return f"buffer_count is {len(desc.buffers)}, expected {want}", ctx.buffer_count()


def _count_dense_source(s):
    if not issubclass(s.layout, DENSE_LAYOUTS) or s.scheme is UnknownQuantization:
        return True
    count = parameter_count_source(s)
    return s.buffer_count == 1 + count if isinstance(count, int) else f"{s.buffer_count} == 1 + {count}"


def _per_handle(field: str, bad: Callable[[int], bool], what: str):
    """A check that fires once per buffer handle whose ``field`` value ``bad`` accepts."""

    def check(desc, ctx):
        for i, h in enumerate(desc.buffers):
            value = getattr(h, field)
            if bad(value):
                yield f"buffer {i} {field} 0x{value:02X} {what}", ctx.buffer(i, field)

    return check


descriptor_rule("buffer.reserved", MUST, "buffer-protocol.md § Buffer Handle",
                "The reserved byte of every buffer handle is zero.", when=_HANDLES)(
    _per_handle("_reserved", lambda v: v != 0, "is not zero"))


@descriptor_rule("buffer.alignment.power_of_two", MUST, "buffer-protocol.md § Buffer Handle",
                 "alignment is a power of two (empty buffers included).", when=_HANDLES)
def _align_pow2(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if not power_of_two(h.alignment):
            yield f"buffer {i} alignment {h.alignment} is not a power of two", ctx.buffer(i, "alignment")


@descriptor_rule("buffer.alignment.minimum", MUST, "buffer-protocol.md § Buffer Handle",
                 f"alignment is at least {MIN_BUFFER_ALIGNMENT} for a non-empty buffer; an empty buffer (byte_size 0) "
                 "may declare any "
                 "power of two (ADR-007 § 4).", when=_HANDLES)
def _align_min(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.byte_size > 0 and power_of_two(h.alignment) and h.alignment < MIN_BUFFER_ALIGNMENT:
            yield f"buffer {i} alignment {h.alignment} is below {MIN_BUFFER_ALIGNMENT} for a {h.byte_size}-byte buffer", \
                ctx.buffer(i, "alignment")


descriptor_rule("buffer.device_tag.invalid", MUST, "buffer-protocol.md § Device Tags",
                "device_tag 0xFF is rejected.", when=_HANDLES)(
    _per_handle("device_tag", lambda v: v == _INVALID, "is invalid"))

descriptor_rule("buffer.device_tag.reserved", MUST_NOT, "buffer-protocol.md § Device Tags",
                "device_tag 0x09-0xEF is reserved for future versions and is not used.", when=_HANDLES)(
    _per_handle("device_tag", lambda v: _LAST_NAMED_DEVICE < v < _INVALID and not is_private_tag(v),
                "is reserved"))

descriptor_rule("buffer.sync_mode.invalid", MUST, "buffer-protocol.md § Stream and Event Synchronisation",
                "sync_mode 0xFF is rejected.", when=_HANDLES)(
    _per_handle("sync_mode", lambda v: v == _INVALID, "is invalid"))

descriptor_rule("buffer.sync_mode.reserved", MUST, "buffer-protocol.md § Stream and Event Synchronisation",
                "sync_mode 0x03-0xFE is reserved and rejected.", when=_HANDLES)(
    _per_handle("sync_mode", lambda v: _LAST_SYNC_MODE < v < _INVALID, "is reserved"))


@descriptor_rule("buffer.sync_mode.cpu", MUST, "buffer-protocol.md § Producer Requirement",
                 "A CPU buffer (device_tag 0x00) has sync_mode 0x00 (producer-synced).", when=_HANDLES)
def _sync_cpu(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.device_tag == DeviceTag.CPU and h.sync_mode in (SyncMode.EVENT, SyncMode.CONSUMER_STREAM):
            yield f"buffer {i} is on the CPU but declares sync_mode 0x{h.sync_mode:02X}", ctx.buffer(i, "sync_mode")


descriptor_rule("buffer.memory_class.invalid", MUST, "buffer-protocol.md § Memory Class Values",
                "memory_class 0xFF is rejected.", when=_HANDLES)(
    _per_handle("memory_class", lambda v: v == _INVALID, "is invalid"))

descriptor_rule("buffer.memory_class.reserved", MUST, "buffer-protocol.md § Memory Class Values",
                "memory_class 0x04-0xEF is reserved and rejected.", when=_HANDLES)(
    _per_handle("memory_class", lambda v: _LAST_MEMORY_CLASS < v < _INVALID and not is_private_tag(v),
                "is reserved"))


@descriptor_rule("buffer.memory_class.private", MUST, "buffer-protocol.md § Memory Class Values",
                 "A private memory_class (0xF0-0xFE) on a private device is rejected by a reader that does not "
                 "know it, unless permissive (out-of-band agreement).", permissive=True, when=_HANDLES)
def _mc_private(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if is_private_tag(h.memory_class) and is_private_tag(h.device_tag):
            yield f"buffer {i} private memory_class 0x{h.memory_class:02X} is not known here", \
                ctx.buffer(i, "memory_class")


_NOT_VALID = {
    DeviceTag.CPU: {MemoryClass.PEER}, DeviceTag.METAL: {MemoryClass.PEER},
    DeviceTag.WEBGPU: {MemoryClass.HOST_PINNED, MemoryClass.UNIFIED, MemoryClass.PEER},
    DeviceTag.HEXAGON: {MemoryClass.PEER}, DeviceTag.OPENCL: {MemoryClass.PEER},
}
"""Named device -> the named memory classes ``buffer-protocol.md § Per-Device Validity`` does not list for it."""


@descriptor_rule("buffer.memory_class.device", MUST, "buffer-protocol.md § Per-Device Validity",
                 "The (device_tag, memory_class) pair is one the per-device table lists as valid (a private class "
                 "needs a private device; a private device takes STANDARD or a private class).", when=_HANDLES)
def _mc_device(desc, ctx):
    for i, h in enumerate(desc.buffers):
        if h.memory_class in _NOT_VALID.get(h.device_tag, ()):
            yield (f"buffer {i}: memory_class {MemoryClass(h.memory_class).name} is not valid on device "
                   f"{DeviceTag(h.device_tag).name}"), ctx.buffer(i, "memory_class")
        elif is_private_tag(h.device_tag) and MemoryClass.STANDARD < h.memory_class <= _LAST_MEMORY_CLASS:
            yield (f"buffer {i}: private device 0x{h.device_tag:02X} pairs only with STANDARD or a private "
                   f"memory class, not 0x{h.memory_class:02X}"), ctx.buffer(i, "memory_class")
        elif is_private_tag(h.memory_class) and not is_private_tag(h.device_tag):
            yield (f"buffer {i}: private memory_class 0x{h.memory_class:02X} on non-private device "
                   f"0x{h.device_tag:02X}"), ctx.buffer(i, "memory_class")


@descriptor_rule("buffer.colocation", MUST, "buffer-protocol.md § Device Colocation",
                 "All buffers of one descriptor share the same device_tag and the same memory_class.", when=_HANDLES)
def _colocation(desc, ctx):
    if not desc.buffers:
        return
    first = desc.buffers[0]
    for i, h in enumerate(desc.buffers[1:], 1):
        if h.device_tag != first.device_tag:
            return f"buffer {i} device_tag 0x{h.device_tag:02X} differs from buffer 0's 0x{first.device_tag:02X}", \
                ctx.buffer(i, "device_tag")
        if h.memory_class != first.memory_class:
            return (f"buffer {i} memory_class 0x{h.memory_class:02X} differs from buffer 0's "
                    f"0x{first.memory_class:02X}"), ctx.buffer(i, "memory_class")


# ------------------------------------------------------------------------------------
# Buffer sizes of the layouts
# ------------------------------------------------------------------------------------


def _dense_elements(desc) -> Optional[int]:
    """Elements the data buffer must hold past byte_offset for a dense layout (None: not computable)."""
    if dynamic(desc):
        return None
    layout = desc.layout
    if isinstance(layout, (RowMajorLayout, ColumnMajorLayout)):
        return math.prod(desc.shape)
    if isinstance(layout, TiledLayout):
        if 0 in desc.shape:
            return 0
        if 0 in layout.tile_shape:
            return None
        return math.prod(-(-d // t) * t for d, t in zip(desc.shape, layout.tile_shape))
    return None


@descriptor_rule("layout.dense.buffer_size", MUST, "layouts/row-major.md § Buffer Size",
                 "The data buffer of a row-major, column-major or tiled tensor holds byte_offset plus every "
                 "(padded) element; not checked while a dimension is dynamic.",
                 when=When(layouts={RowMajorLayout, ColumnMajorLayout, TiledLayout}),
                 fast=lambda s: _dense_size_source(s))
def _dense_size(desc, ctx):
    h = data_handle(desc)
    if h is None or desc.layout.tag not in DENSE_TAGS:
        return
    n = _dense_elements(desc)
    if n is None:
        return
    need = storage_bytes(desc, n)
    if need is not None and desc.byte_offset + need > h.byte_size:
        return f"buffer 0 holds {h.byte_size} bytes, {desc.byte_offset + need} needed for {n} elements", ctx.buffer(0)


def _dense_size_source(s):
    if not s.buffer_count or not issubclass(s.layout, DENSE_LAYOUTS):
        return True
    if issubclass(s.layout, TiledLayout):
        return None
    if not issubclass(s.layout, (RowMajorLayout, ColumnMajorLayout)):
        return True  # no element count is checked for the other dense layouts here
    need = storage_source(s, element_count_source(s.rank))
    return None if need is None else f"{DYNAMIC_DIMENSION} in shape or byte_offset + {need} <= h0.byte_size"


@descriptor_rule("layout.strided.buffer_bounds", MUST, "layouts/strided.md § Element Address",
                 "Every element a strided tensor addresses lies inside buffer 0 (negative strides included).",
                 when=When(layouts={StridedLayout}))
def _strided_bounds(desc, ctx):
    h = data_handle(desc)
    layout = desc.layout
    if h is None or not isinstance(layout, StridedLayout) or dynamic(desc) or 0 in desc.shape:
        return
    info = element_type_info(desc.type_tag)
    if info is None or info.sub_byte:
        return
    lo = sum(min(0, s * (d - 1)) for s, d in zip(layout.strides, desc.shape))
    hi = sum(max(0, s * (d - 1)) for s, d in zip(layout.strides, desc.shape))
    width = info.byte_width
    if desc.byte_offset + lo * width < 0:
        return f"a negative stride reaches {-(desc.byte_offset + lo * width)} bytes before buffer 0", ctx.byte_offset()
    elif desc.byte_offset + (hi + 1) * width > h.byte_size:
        return f"the last addressed element ends at byte {desc.byte_offset + (hi + 1) * width}, past buffer 0's " \
              f"{h.byte_size} bytes", ctx.buffer(0)


_UNADDRESSABLE_BITS = 80
"""2**bits elements of at least one bit each are more bytes than a 64-bit byte_size holds."""


def _curve_size(desc, ctx, bits: int):
    """Findings of a space-filling-curve page of ``2**bits`` elements held by buffer 0."""
    h = data_handle(desc)
    if bits >= _UNADDRESSABLE_BITS:
        return f"2**{bits} elements cannot fit a buffer", ctx.buffer(0)
    need = storage_bytes(desc, 1 << bits)
    if need is not None and desc.byte_offset + need > h.byte_size:
        return f"buffer 0 holds {h.byte_size} bytes, {need} needed for 2**{bits} elements", ctx.buffer(0)


@descriptor_rule("layout.morton.buffer_size", MUST, "layouts/morton.md § Buffer Size",
                 "The data buffer of a Morton tensor holds 2**sum(morton_bits) elements.",
                 when=When(layouts={MortonLayout}))
def _morton_size(desc, ctx):
    if data_handle(desc) is None or not isinstance(desc.layout, MortonLayout) or 0 in desc.layout.morton_bits:
        return
    return _curve_size(desc, ctx, sum(desc.layout.morton_bits))


@descriptor_rule("layout.hilbert.buffer_size", MUST, "layouts/hilbert.md § Buffer Size",
                 "The data buffer of a Hilbert tensor holds 2**(hilbert_rank*hilbert_order) elements.",
                 when=When(layouts={HilbertLayout}))
def _hilbert_size(desc, ctx):
    layout = desc.layout
    if data_handle(desc) is None or not isinstance(layout, HilbertLayout) or layout.hilbert_order == 0:
        return
    return _curve_size(desc, ctx, layout.hilbert_rank * layout.hilbert_order)


_INDEX_BYTES = 8
"""COO / CSR / CSC / CSF indices and pointers are uint64 (each layout page's § Buffer Table)."""


def _sparse_needs(desc) -> list[tuple[int, int, str, tuple]]:
    """``(buffer index, minimum bytes, what, arguments of what)`` for the layout buffers of a
    sparse / paged tensor; ``what.format(*arguments)`` names the need (formatted only on a finding)."""
    layout, shape, rank = desc.layout, desc.shape, desc.rank
    values = storage_bytes(desc, layout.nnz) if hasattr(layout, "nnz") else None
    out = []
    if values is not None:
        out.append((0, values, "{} values", (layout.nnz,)))
    if isinstance(layout, CooLayout):
        out.append((1, layout.nnz * rank * _INDEX_BYTES, "{}x{} uint64 indices", (layout.nnz, rank)))
    elif isinstance(layout, (CsrLayout, CscLayout)) and rank == 2:
        out.append((1, layout.nnz * _INDEX_BYTES, "{} uint64 indices", (layout.nnz,)))
        axis = 0 if isinstance(layout, CsrLayout) else 1
        if shape[axis] != DYNAMIC_DIMENSION:
            out.append((2, (shape[axis] + 1) * _INDEX_BYTES, "{} uint64 pointers", (shape[axis] + 1,)))
    elif isinstance(layout, CsfLayout) and rank >= 3:
        out.append((1, 2 * _INDEX_BYTES, "pos_0 (2 uint64)", ()))
        out.append((2 * rank, layout.nnz * _INDEX_BYTES, "{} leaf coordinates", (layout.nnz,)))
    elif isinstance(layout, BlockPagedLayout) and rank == 3 and not dynamic(desc):
        n = layout.num_pages * layout.page_size * shape[1] * shape[2]
        pool = storage_bytes(desc, n)
        if pool is not None:
            out.append((0, pool, "{} page-pool elements", (n,)))
        width = 8 if layout.block_table_index_type == BlockTableIndexType.UINT64 else 4
        out.append((2, (layout.num_seqs + 1) * width, "{} seq_ptr entries", (layout.num_seqs + 1,)))
    return out


@descriptor_rule("layout.sparse.buffer_size", MUST, "layouts/coo.md § Buffer Size",
                 "Each buffer of a COO, CSR, CSC, CSF or block-paged tensor is large enough for the elements its "
                 "layout page assigns to it (values for nnz, index arrays, pointer arrays, page pool).",
                 when=When(layouts=PAGED_LAYOUTS), fast=lambda s: _sparse_size_source(s))
def _sparse_size(desc, ctx):
    if not isinstance(desc.layout, PAGED_LAYOUTS):
        return
    buffers = desc.buffers
    for index, need, what, args in _sparse_needs(desc):
        if index < len(buffers) and buffers[index].byte_size < need:
            return f"buffer {index} holds {buffers[index].byte_size} bytes, {need} needed for {what.format(*args)}", \
                ctx.buffer(index)


def _sparse_size_source(s):
    """The needs of :func:`_sparse_needs` for COO, CSR and CSC (the others call the check)."""
    if not issubclass(s.layout, PAGED_LAYOUTS):
        return True
    if not issubclass(s.layout, (CooLayout, CsrLayout, CscLayout)):
        return None
    values = storage_source(s, "layout.nnz")
    if values is None:
        return None
    count, rank = s.buffer_count, s.rank
    needs = [f"h0.byte_size >= {values}"] if count > 0 else []
    if issubclass(s.layout, CooLayout):
        if count > 1:
            needs.append(f"h1.byte_size >= layout.nnz * {rank * _INDEX_BYTES}")
    elif rank == 2:
        if count > 1:
            needs.append(f"h1.byte_size >= layout.nnz * {_INDEX_BYTES}")
        axis = 0 if issubclass(s.layout, CsrLayout) else 1
        if count > 2:
            needs.append(f"(shape[{axis}] == {DYNAMIC_DIMENSION} or h2.byte_size >= (shape[{axis}] + 1) * {_INDEX_BYTES})")
    return " and ".join(needs) or True


_NOT_EMPTIED = (MortonLayout, UnknownLayout, ExtensionLayout, BlockPagedLayout, CompositeLayout)
"""Layouts whose buffer 0 keeps its size for an empty shape (a Morton page is always whole; a
page pool is sized by pages; a head owns no buffer; private layouts are opaque)."""


@descriptor_rule("adr007.empty.data_buffer_size", MUST, "ADR-007 § Decision (4, 7)",
                 "The data buffer of an empty tensor (a dimension is 0) has byte_size 0 -- sub-byte types "
                 "included, with no partial trailing byte; for sparse layouts this is the values buffer.",
                 when=When(facts={Fact.EMPTY}),
                 fast=lambda s: not s.buffer_count or not s.empty or issubclass(s.layout, _NOT_EMPTIED)
                 or "h0.byte_size == 0")
def _empty_size(desc, ctx):
    h = data_handle(desc)
    if h is None or not desc.is_empty or h.byte_size == 0:
        return
    if isinstance(desc.layout, _NOT_EMPTIED):
        return
    return f"empty tensor (shape {list(desc.shape)}) but buffer 0 holds {h.byte_size} bytes", ctx.buffer(0)
