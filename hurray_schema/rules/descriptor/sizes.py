"""What the parts of one descriptor measure, shared by the rules of several spec areas:
storage bytes of the element type, buffers the layout uses, parameter buffers the
quantization scheme references, and the layout families.
"""

from __future__ import annotations

from typing import Callable, Optional

from ...model import (
    DYNAMIC_DIMENSION, SCHEMES, BlockPagedLayout, ColumnMajorLayout, CompositeLayout, CooLayout, CscLayout, CsfLayout,
    CsrLayout, HilbertLayout, MortonLayout, QuantFlag, RowMajorLayout, StridedLayout,
    TensorDescriptor, TiledLayout, UnknownQuantization,
)
from ...structs import quantization as quantization_tables
from ...structs.element_types import element_type_info, is_private_type
from .dispatch import evaluated

__all__ = ["storage_bytes", "layout_buffer_count", "quantization_buffer_indices"]

DENSE_LAYOUTS = (RowMajorLayout, ColumnMajorLayout, StridedLayout, TiledLayout, MortonLayout, HilbertLayout)
"""The layouts with one data buffer (``metadata.md § Buffer Table``: 0x01-0x05, 0x40)."""
SPARSE_LAYOUTS = (CooLayout, CsrLayout, CscLayout, CsfLayout)
PAGED_LAYOUTS = (*SPARSE_LAYOUTS, BlockPagedLayout)
"""The layouts whose buffers hold values, indices, pointers or pages (nnz-sized or paged)."""
DENSE_TAGS = frozenset(cls.tag for cls in DENSE_LAYOUTS)
_DYNAMIC = DYNAMIC_DIMENSION
# plain ints: IntFlag arithmetic costs a microsecond per operation on the decode path
SYMMETRIC = int(QuantFlag.SYMMETRIC)


def dynamic(desc) -> bool:
    return _DYNAMIC in desc.shape


def data_handle(desc):
    return desc.buffers[0] if desc.buffers else None


def storage_bytes(desc: TensorDescriptor, count: int) -> Optional[int]:
    """Bytes holding ``count`` packed elements of the descriptor's storage type, or None if unknown."""
    info = element_type_info(desc.type_tag)
    if info is not None:
        return info.buffer_bytes(count)
    ext = desc.extension_type
    if ext is not None and is_private_type(desc.type_tag) and ext.bit_width > 0:
        if ext.bit_width >= 8:
            return count * (-(-ext.bit_width // 8))
        if ext.bit_width in (1, 2, 4):
            return -(-count * ext.bit_width // 8)
    return None


def layout_buffer_count(desc: TensorDescriptor) -> Optional[int]:
    """Buffers the layout itself uses (data, values, indices, pointers), None if not fixed."""
    return layout_class_buffer_count(desc.layout.__class__, desc.rank)


def layout_class_buffer_count(cls: type, rank: int) -> Optional[int]:
    """:func:`layout_buffer_count` of a layout of class ``cls`` at ``rank``."""
    if issubclass(cls, DENSE_LAYOUTS):
        return 1
    if issubclass(cls, CooLayout):
        return 2
    if issubclass(cls, (CsrLayout, CscLayout)):
        return 3
    if issubclass(cls, CsfLayout):
        return 2 * rank + 1
    if issubclass(cls, BlockPagedLayout):
        return 3
    if issubclass(cls, CompositeLayout):
        return 0
    return None


_SCALE_CLASSES = frozenset(SCHEMES[scheme] for scheme in quantization_tables.SCALE_BUFFER_TYPES)
_ZERO_POINT_CLASSES = frozenset(SCHEMES[scheme] for scheme in quantization_tables.ZERO_POINT_BUFFER_TYPES)


def quantization_buffer_indices(q) -> list[tuple[str, int]]:
    """``(field name, buffer index)`` of every parameter buffer the scheme references."""
    cls = q.__class__
    if cls not in _SCALE_CLASSES:
        return []
    out = [("scale_buffer_index", q.scale_buffer_index)]
    if cls in _ZERO_POINT_CLASSES and not q.flags & SYMMETRIC:
        out.append(("zero_point_buffer_index", q.zero_point_buffer_index))
    return out


# -- the same measures as source text, for the rules' conditions (dispatch.Signature) --

def storage_source(sig, count: str) -> Optional[str]:
    """:func:`storage_bytes` of ``count`` (an expression) elements under ``sig``, as source;
    None for a type only an extension type section describes."""
    info = element_type_info(sig.type_tag)
    if info is None:
        return None
    return f"{sig.const(info.buffer_bytes)}({count})"


def element_count_source(rank: int) -> str:
    """The product of the shape (the local ``shape``) of a tensor of ``rank``, as source."""
    return " * ".join(f"shape[{k}]" for k in range(rank)) or "1"


def parameter_count_source(sig):
    """:func:`quantization_parameter_count` under ``sig``: an int where the scheme fixes it,
    else an expression over ``q``."""
    cls = sig.scheme
    if cls is None or cls not in _SCALE_CLASSES:
        return 0
    if cls not in _ZERO_POINT_CLASSES:
        return 1
    return f"(1 if q.flags & {SYMMETRIC} or q.zero_point_buffer_index == q.scale_buffer_index else 2)"


def parameter_index_clauses(sig, test: str) -> list[tuple[str, str]]:
    """``(source, field name)`` per parameter buffer index :func:`quantization_buffer_indices` gives
    under ``sig``: ``test`` (a format with ``{index}``) holding for it -- for the zero point, only
    unless symmetric -- as source."""
    cls = sig.scheme
    if cls is None or cls not in _SCALE_CLASSES:
        return []
    out = [(test.format(index="q.scale_buffer_index"), "scale_buffer_index")]
    if cls in _ZERO_POINT_CLASSES:
        out.append((f"(q.flags & {SYMMETRIC} or {test.format(index='q.zero_point_buffer_index')})",
                    "zero_point_buffer_index"))
    return out


def parameter_indices_source(sig, test: str) -> Optional[str]:
    """The clauses of :func:`parameter_index_clauses` all holding, as source; None when there are none."""
    clauses = parameter_index_clauses(sig, test)
    return " and ".join(source for source, _ in clauses) if clauses else None


def failing_parameter_index(desc, name: str, test: Callable[[object], str]) -> tuple[str, int]:
    """``(field name, index)`` of the first parameter buffer index of ``desc`` on which the clause
    ``test(signature)`` builds (see :func:`parameter_index_clauses`) does not hold: what a rule's
    report names, read from the same source as its condition."""
    def clauses(sig) -> str:
        return "[" + "".join(f"({source}, {field!r}, q.{field}), "
                             for source, field in parameter_index_clauses(sig, test(sig))) + "]"

    return next((field, index) for holds, field, index in evaluated(name, desc, clauses) if not holds)


def quantization_parameter_count(q) -> int:
    """Distinct buffers the scheme's parameters occupy (a shared index counts once)."""
    if q is None or isinstance(q, UnknownQuantization):
        return 0
    return len({index for _, index in quantization_buffer_indices(q)})


def axis_in_rank(desc) -> bool:
    q = desc.quantization
    return hasattr(q, "axis") and q.axis < desc.rank
