"""Rules on the buffer table and the buffer handles (``metadata.md § Buffer Table``,
``buffer-protocol.md``), then on the byte size of the layout buffers (each layout
page's § Buffer Size, ADR-007 for empty tensors).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from ...structs._declare import power_of_two_source, valid_source
from ...structs.descriptor import BUFFER_HANDLE, MIN_BUFFER_ALIGNMENT
from ...structs.tags import is_private_tag
from ...model import (
    DYNAMIC_DIMENSION, BlockPagedLayout, BlockTableIndexType, ColumnMajorLayout, CompositeLayout, CooLayout, CscLayout, CsfLayout, CsrLayout, DeviceTag,
    ExtensionLayout, HilbertLayout, MemoryClass, MortonLayout, RowMajorLayout, StridedLayout, SyncMode, TiledLayout,
    UnknownLayout, UnknownQuantization,
)
from ...structs.element_types import element_type_info
from ..engine import Level
from .dispatch import ALWAYS, Fact, When, descriptor_rule, evaluated
from .sizes import (
    DENSE_LAYOUTS, PAGED_LAYOUTS, data_handle, dynamic, element_count_source, parameter_count_source,
    quantization_parameter_count, storage_bytes, storage_source,
)

MUST, MUST_NOT = Level.MUST, Level.MUST_NOT
_HANDLES = When(facts={Fact.UNUSUAL_BUFFERS})
"""A rule on the handles' device, sync mode and memory class can fire only when some handle is not a
plain one (a named device, sync mode and memory class 0)."""
_LAST_NAMED_DEVICE = int(max(DeviceTag))
_LAST_MEMORY_CLASS = int(max(MemoryClass))
_LAST_SYNC_MODE = int(max(SyncMode))
_INVALID = 0xFF


@descriptor_rule("metadata.buffer_count.minimum", MUST, "metadata.md § Buffer Table",
                 "buffer_count is at least 1 for every layout but the composite head.", when=ALWAYS,
                 passes=lambda s: issubclass(s.layout, (UnknownLayout, CompositeLayout)) or s.buffer_count > 0)
def _count_min(desc, ctx):
    return "buffer_count is 0 for a tensor that is not a composite head", ctx.buffer_count()


@descriptor_rule("metadata.buffer_count.dense", MUST, "metadata.md § Buffer Table",
                 "A dense layout (0x01-0x05, 0x40) has exactly one buffer, plus the parameter buffers its "
                 "quantization scheme requires.", when=When(layouts=DENSE_LAYOUTS),
                 passes=lambda s: _count_dense_form(s))
def _count_dense(desc, ctx):
    want = 1 + quantization_parameter_count(desc.quantization)
    return f"buffer_count is {len(desc.buffers)}, expected {want}", ctx.buffer_count()


def _count_dense_form(s):
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


_HANDLE_REF = "buffer-protocol.md § Buffer Handle"
_UNROLLED_HANDLES = 8
"""Up to this many handles, a condition on every handle is written out once per handle."""


def _on_every_handle(rule_id: str, citation: str, summary: str, condition: str, first_only: bool = False):
    """Declare the rule ``rule_id`` whose ``condition`` (an expression over one handle ``h`` and the
    first handle ``first``) holds for every buffer handle, reported once per handle where it does not
    (only the first such handle with ``first_only``).  Decorates its report, ``report(desc, ctx, i, h)``."""
    holds = eval(f"lambda h, first: {condition}")

    def form(s):
        if not s.buffer_count:
            return True
        if s.buffer_count > _UNROLLED_HANDLES:
            return f"all({condition.replace('first', 'buffers[0]')} for h in buffers)"
        return " and ".join("(" + condition.replace("first", "buffers[0]").replace("h.", f"buffers[{i}].") + ")"
                            for i in range(s.buffer_count))

    def declare(report):
        def findings(desc, ctx):
            buffers = desc.buffers
            for i, h in enumerate(buffers):
                if not holds(h, buffers[0]):
                    yield report(desc, ctx, i, h)
                    if first_only:
                        return

        findings.__name__ = report.__name__
        findings.__wrapped__ = report  # where the rule is read: its report
        return descriptor_rule(rule_id, MUST, citation, summary, when=ALWAYS, passes=form)(findings)

    return declare


@_on_every_handle("buffer.reserved", _HANDLE_REF, "The reserved byte of every buffer handle is zero.",
                  valid_source(BUFFER_HANDLE, "_reserved", "h._reserved"))
def _handle_reserved(desc, ctx, i, h):
    return f"buffer {i} _reserved 0x{h._reserved:02X} is not zero", ctx.buffer(i, "_reserved")


@_on_every_handle("buffer.alignment.power_of_two", _HANDLE_REF, "alignment is a power of two (empty buffers included).",
                  valid_source(BUFFER_HANDLE, "alignment", "h.alignment"))
def _align_pow2(desc, ctx, i, h):
    return f"buffer {i} alignment {h.alignment} is not a power of two", ctx.buffer(i, "alignment")


@_on_every_handle("buffer.alignment.minimum", _HANDLE_REF,
                  f"alignment is at least {MIN_BUFFER_ALIGNMENT} for a non-empty buffer; an empty buffer (byte_size 0) "
                  "may declare any power of two (ADR-007 § 4).",
                  f"(h.alignment >= {MIN_BUFFER_ALIGNMENT} or h.byte_size == 0 or not {power_of_two_source('h.alignment')})")
def _align_min(desc, ctx, i, h):
    return f"buffer {i} alignment {h.alignment} is below {MIN_BUFFER_ALIGNMENT} for a {h.byte_size}-byte buffer", \
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


@_on_every_handle("buffer.colocation", "buffer-protocol.md § Device Colocation",
                  "All buffers of one descriptor share the same device_tag and the same memory_class.",
                  "h.device_tag == first.device_tag and h.memory_class == first.memory_class", first_only=True)
def _colocation(desc, ctx, i, h):
    first = desc.buffers[0]
    if h.device_tag != first.device_tag:
        return f"buffer {i} device_tag 0x{h.device_tag:02X} differs from buffer 0's 0x{first.device_tag:02X}", \
            ctx.buffer(i, "device_tag")
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
        return _tiled_elements(desc.shape, layout.tile_shape)
    return None


@descriptor_rule("layout.dense.buffer_size", MUST, "layouts/row-major.md § Buffer Size",
                 "The data buffer of a row-major, column-major or tiled tensor holds byte_offset plus every "
                 "(padded) element; not checked while a dimension is dynamic.",
                 when=When(layouts={RowMajorLayout, ColumnMajorLayout, TiledLayout}),
                 passes=lambda s: _dense_size_form(s))
def _dense_size(desc, ctx):
    n = _dense_elements(desc)
    need = storage_bytes(desc, n)
    h = desc.buffers[0]
    return f"buffer 0 holds {h.byte_size} bytes, {desc.byte_offset + need} needed for {n} elements", ctx.buffer(0)


def _tiled_elements(shape, tile_shape) -> Optional[int]:
    """Elements of the whole tiles covering ``shape`` (None where a tile dimension is 0)."""
    if 0 in shape:
        return 0
    if 0 in tile_shape:
        return None
    return math.prod(-(-d // t) * t for d, t in zip(shape, tile_shape))


def _dense_size_form(s):
    """byte_offset plus the bytes of every (padded) element fit buffer 0, unless a dimension is
    dynamic, a tile dimension is 0 or only an extension type knows the storage."""
    if not s.buffer_count or not issubclass(s.layout, (RowMajorLayout, ColumnMajorLayout, TiledLayout)):
        return True  # no element count is checked for the other dense layouts here
    if issubclass(s.layout, TiledLayout):
        count = f"(n := {s.const(_tiled_elements)}(shape, layout.tile_shape)) is None or "
        need = storage_source(s, "n")
    else:
        count, need = "", storage_source(s, element_count_source(s.rank))
    if need is None:  # an element type only its extension type section describes
        need = f"{s.const(storage_bytes)}(desc, {'n' if count else element_count_source(s.rank)})"
        return f"({DYNAMIC_DIMENSION} in shape or {count}(b := {need}) is None or byte_offset + b <= h0.byte_size)"
    return f"({DYNAMIC_DIMENSION} in shape or {count}byte_offset + {need} <= h0.byte_size)"


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
_UINT64_INDEX = int(BlockTableIndexType.UINT64)
_UINT64_INDEX_BYTES, _UINT32_INDEX_BYTES = 8, 4
"""A block table's seq_ptr entries are uint64 or uint32 (``layouts/block-paged.md § Buffer Table``)."""


def _sparse_needs(s) -> list[tuple[int, str, bool, str, tuple]]:
    """``(buffer index, minimum bytes, may be None, what, arguments of what)`` for the layout buffers
    of a sparse or paged tensor of signature ``s``, each an expression over the rules' locals; a need
    that is None (a dynamic dimension, a storage only an extension type describes) asks nothing, and
    ``what.format(*arguments)`` names the need (formatted only on a finding)."""
    layout, rank = s.layout, s.rank
    out = []
    if issubclass(layout, (CooLayout, CsrLayout, CscLayout, CsfLayout)):
        values = storage_source(s, "layout.nnz")
        out.append((0, values or f"{s.const(storage_bytes)}(desc, layout.nnz)", values is None,
                    "{} values", ("layout.nnz",)))
    if issubclass(layout, CooLayout):
        out.append((1, f"layout.nnz * {rank * _INDEX_BYTES}", False, "{}x{} uint64 indices",
                    ("layout.nnz", str(rank))))
    elif issubclass(layout, (CsrLayout, CscLayout)) and rank == 2:
        out.append((1, f"layout.nnz * {_INDEX_BYTES}", False, "{} uint64 indices", ("layout.nnz",)))
        axis = 0 if issubclass(layout, CsrLayout) else 1
        out.append((2, f"(None if shape[{axis}] == {DYNAMIC_DIMENSION} else (shape[{axis}] + 1) * {_INDEX_BYTES})",
                    True, "{} uint64 pointers", (f"shape[{axis}] + 1",)))
    elif issubclass(layout, CsfLayout) and rank >= 3:
        out.append((1, str(2 * _INDEX_BYTES), False, "pos_0 (2 uint64)", ()))
        out.append((2 * rank, f"layout.nnz * {_INDEX_BYTES}", False, "{} leaf coordinates", ("layout.nnz",)))
    elif issubclass(layout, BlockPagedLayout) and rank == 3:
        pages = "layout.num_pages * layout.page_size * shape[1] * shape[2]"
        pool = storage_source(s, f"({pages})") or f"{s.const(storage_bytes)}(desc, {pages})"
        out.append((0, f"(None if {DYNAMIC_DIMENSION} in shape else {pool})", True, "{} page-pool elements",
                    (pages,)))
        width = f"({_UINT64_INDEX_BYTES} if layout.block_table_index_type == {_UINT64_INDEX} else {_UINT32_INDEX_BYTES})"
        out.append((2, f"(None if {DYNAMIC_DIMENSION} in shape else (layout.num_seqs + 1) * {width})", True,
                    "{} seq_ptr entries", ("layout.num_seqs + 1",)))
    return [need for need in out if need[0] < s.buffer_count]


def _need_holds(index: int, need: str, optional: bool) -> str:
    """Buffer ``index`` holds at least ``need`` bytes (an ``optional`` need that is None asks nothing)."""
    if optional:
        return f"((m := {need}) is None or buffers[{index}].byte_size >= m)"
    return f"buffers[{index}].byte_size >= {need}"


def _sparse_size_form(s):
    if not issubclass(s.layout, PAGED_LAYOUTS):
        return True
    return " and ".join(_need_holds(*need[:3]) for need in _sparse_needs(s)) or True


def _sparse_report_form(s) -> str:
    """For the report: each need of :func:`_sparse_needs` as ``(holds, index, need, what, arguments)``."""
    rows = [f"({_need_holds(index, need, optional)}, {index}, {need}, {what!r}, ({''.join(a + ', ' for a in args)}))"
            for index, need, optional, what, args in _sparse_needs(s)]
    return "[" + ", ".join(rows) + "]"


@descriptor_rule("layout.sparse.buffer_size", MUST, "layouts/coo.md § Buffer Size",
                 "Each buffer of a COO, CSR, CSC, CSF or block-paged tensor is large enough for the elements its "
                 "layout page assigns to it (values for nnz, index arrays, pointer arrays, page pool).",
                 when=When(layouts=PAGED_LAYOUTS), passes=_sparse_size_form)
def _sparse_size(desc, ctx):
    for holds, index, need, what, args in evaluated("layout.sparse.buffer_size", desc, _sparse_report_form):
        if not holds:
            return f"buffer {index} holds {desc.buffers[index].byte_size} bytes, {need} needed for " \
                f"{what.format(*args)}", ctx.buffer(index)


_NOT_EMPTIED = (MortonLayout, UnknownLayout, ExtensionLayout, BlockPagedLayout, CompositeLayout)
"""Layouts whose buffer 0 keeps its size for an empty shape (a Morton page is always whole; a
page pool is sized by pages; a head owns no buffer; private layouts are opaque)."""


@descriptor_rule("adr007.empty.data_buffer_size", MUST, "ADR-007 § Decision (4, 7)",
                 "The data buffer of an empty tensor (a dimension is 0) has byte_size 0 -- sub-byte types "
                 "included, with no partial trailing byte; for sparse layouts this is the values buffer.",
                 when=When(facts={Fact.EMPTY}),
                 passes=lambda s: not s.buffer_count or not s.empty or issubclass(s.layout, _NOT_EMPTIED)
                 or "h0.byte_size == 0")
def _empty_size(desc, ctx):
    return f"empty tensor (shape {list(desc.shape)}) but buffer 0 holds {desc.buffers[0].byte_size} bytes", ctx.buffer(0)
