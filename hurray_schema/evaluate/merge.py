"""Composite evaluation: partition assembly, overlay merge, group, nesting.

Semantics (``layouts/composite.md § Composition Semantics``):

* partition -- each member fills its shard box ``[shard_offset, shard_offset + shape)``;
  ``lookup`` selects the member whose box holds the index and reads one element at
  ``index - shard_offset``; ``read`` touches only the members holding a position of the
  (possibly stepped) region;
* overlay -- the base, then every correction in emission order under ``combine_op``,
  evaluated in the head's ``type_tag``: replace (latest covering member wins) or add
  (for float16 / bfloat16 every addition rounds to the head type, in order, the bits
  NumPy / ml_dtypes arithmetic gives).  A sparse correction acts at its stored indices only;
* group -- a tuple of the members' own arrays;
* a member that is itself a composite is evaluated recursively.

The evaluator keeps only the arithmetic: it accepts a composite only once the composite
binder (:mod:`hurray_schema.rules.composite`) has accepted it -- the shard boxes, the
exact cover, the overlay roles and the nesting depth are the binder's checks, with its
rule ids.  A :class:`~hurray_schema.io.Composite` is validated once (its ``validate()``,
which readers have already answered); any other object is validated on every call.

Evaluation budget (the rule: :mod:`hurray_schema.evaluate.common`), charged before each
allocation, ``limits=None`` meaning the default limits.  What a composite stores is the
bytes of all its leaves' buffers (nested composites included); a member's own decode is
charged against the member's buffers:

* :func:`materialize` charges the head's array (for a group, the sum of what its members'
  evaluations cost); a member that cannot be decoded straight into its box, or the offset
  table a member's decode builds, is charged again as that member's own decode.  With
  ``out=`` the caller has allocated the result: nothing in the call is charged;
* :func:`read` charges the region's array (a stepped region: its selected elements only), then
  each intersecting member's read of the selected positions inside it (:mod:`.tensor_box`).

Objects are duck-typed: a composite has ``.descriptor`` (the head) and ``.members``; a
member tensor has ``.descriptor`` and ``.buffers``.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import HurraySchemaError, NotAnArray
from ..limits import resolve_limits
from ..model import (BlockPagedLayout, CombineOp, CompositionRule, ElementType, HilbertLayout, LayoutTag,
                     MortonLayout, TiledLayout)
from ..rules.composite import validate_preorder
from ..structs.element_types import element_type_info, is_private_type
from .common import (NOT_CHARGED, SPARSE_TAGS, as_bytes, as_evaluated, charge, check_shape, decoded_type, new_array,
                     readonly, stored_bytes, tensor_stored_bytes)
from .copy import copy_boxes, copy_into
from .dense import affine_strides, hilbert_index, tiled_offsets
from . import jit
from .dequantize import (OUT_BF16, OUT_F16, OUT_F32, PK_CHANNEL, PK_TENSOR, decode_gather, quant_params,
                         storage_shape)
from .elements import UnsupportedEvaluation, bf16_add, f16_add, gather_codes, numpy_dtype
from .sparse import sparse_entries, sparse_linear
from .tensor import _check_bounds, decode_cost, decode_into, dense_view, tensor_to_numpy
from .tensor_box import check_steps, resolved_shape, sparse_box_entries, stepped_extent, tensor_box

__all__ = ["materialize", "lookup", "read", "member_values"]

ADD_NATIVE, ADD_F16, ADD_BF16, ADD_OR = 0, 1, 2, 3


# ------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------


@jit.helper
def _add_bits(a, b, mode):
    """float16 / bfloat16 addition on bits, rounded to the type."""
    if mode == ADD_F16:
        return f16_add(a, b)
    return bf16_add(a, b)


@jit.kernel("void(u16[:], i64[:], u16[:], i64)")
def _scatter_add_bits(out, lin, vals, mode):
    """``out[lin[k]] += vals[k]`` on float16 / bfloat16 bits, in storage order."""
    for k in range(lin.size):
        i = lin[k]
        out[i] = _add_bits(out[i], vals[k], mode)


@jit.kernel("void(u16[:], u16[:], i64)")
def _add_dense_bits(acc, vals, mode):
    """``acc += vals`` on float16 / bfloat16 bits, element by element."""
    for i in range(acc.size):
        acc[i] = _add_bits(acc[i], vals[i], mode)


ADD_COMPILE_ELEMENTS = 1 << 24
"""float16 / bfloat16 additions done by NumPy (:func:`_add_native`) in a process before the kernels
(:func:`_add_dense_bits`, :func:`_scatter_add_bits`) are compiled, while the kernel cache does not hold
them (:meth:`.jit.Kernel.worth_it`)."""


def _half_type(mode: int) -> np.dtype:
    return numpy_dtype(ElementType.FLOAT16 if mode == ADD_F16 else ElementType.BFLOAT16)


def _add_dense(acc: np.ndarray, vals: np.ndarray, mode: int) -> None:
    """``acc += vals`` on float16 / bfloat16 bits (uint16, C order)."""
    if _add_dense_bits.worth_it(acc.size, ADD_COMPILE_ELEMENTS):
        _add_dense_bits(acc, vals, mode)
        return
    half = _half_type(mode)
    acc.view(half)[...] = _add_native(acc.view(half), vals.view(half))


def _scatter_add(out: np.ndarray, lin: np.ndarray, vals: np.ndarray, mode: int) -> None:
    """``out[lin[k]] += vals[k]`` on float16 / bfloat16 bits (the indices distinct)."""
    if _scatter_add_bits.worth_it(lin.size, ADD_COMPILE_ELEMENTS):
        _scatter_add_bits(out, lin, vals, mode)
        return
    half = _half_type(mode)
    target = out.view(half)
    target[lin] = _add_native(target[lin], vals.view(half))


def _add_native(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` in the arrays' own type; where an operand is NaN the right one's NaN (quieted) is
    kept -- made explicit, so that which payload survives does not depend on the hardware.  float16 and
    ml_dtypes' bfloat16 round the float32 sum once, as the kernels' :func:`.elements.f16_add` does."""
    total = a + b
    if total.dtype.kind not in "biu":  # NumPy's floats and complexes, ml_dtypes' floats (kind "V")
        nan = b != b
        if nan.any():
            total[nan] = b[nan] + b[nan]
    return total


def _scatter(out, lin, vals, combine, mode):
    """Sparse correction at its stored indices: replace or add, in storage order (one member stores
    each index once -- ``coo.md § Validity Constraints`` -- so the entries are independent)."""
    if combine == CombineOp.REPLACE:
        out[lin] = vals
    elif mode == ADD_OR:  # bool: addition is logical or
        out[lin] |= vals
    elif mode in (ADD_F16, ADD_BF16):
        _scatter_add(out, np.ascontiguousarray(lin, np.int64), np.ascontiguousarray(vals), mode)
    else:
        out[lin] = _add_native(out[lin], vals)


# ------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------


def _is_composite(obj) -> bool:
    return hasattr(obj, "members") or obj.descriptor.layout.tag == LayoutTag.COMPOSITE


def _preorder(composite):
    """The descriptors of a duck-typed composite, head first, then its members (pre-order)."""
    pending = [composite]
    while pending:
        node = pending.pop()
        yield node.descriptor
        pending.extend(reversed(getattr(node, "members", ())))


def _validated(composite) -> None:
    """The composite binder's verdict on ``composite`` (raises its SpecViolation): cached by
    a :class:`~hurray_schema.io.Composite`, recomputed for other objects; then
    :func:`_check_code_widths`."""
    validate = getattr(composite, "validate", None)
    if validate is not None:
        validate()
    else:
        validate_preorder(_preorder(composite))
    _check_code_widths(composite)


def _check_code_widths(composite) -> None:
    """The members of a partition or overlay of a private type have the head's code width.

    The binder's ``composite.member.decoded_type`` makes every member's type tag the head's;
    a private tag is evaluated as its raw codes, whose width each descriptor's own Extension
    Type section gives (``common.as_evaluated``), and which the binder does not compare: a
    member whose codes are not the head's width has no value in the head's array
    (:class:`UnsupportedEvaluation`).  Nested composites are checked too.
    """
    head = _head(composite)
    spatial = head.layout.composition_rule in (CompositionRule.PARTITION, CompositionRule.OVERLAY)
    target = _value_type(head) if spatial and is_private_type(int(head.type_tag)) else None
    for index, member in enumerate(composite.members):
        nested = _is_composite(member)
        if target is not None:
            got = _value_type(member.descriptor)
            if got != target:
                raise UnsupportedEvaluation(f"member {index} of a private type_tag 0x{int(head.type_tag):02X} has "
                                            f"{got.name.lower()} codes, the head {target.name.lower()} codes")
        if nested:
            _check_code_widths(member)


def _box(member, head_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offset, shape) of a partition / overlay member's box in the head's index space
    (the binder has checked the shard section and the bounds).  The box is not bounded by
    ``dense.MAX_ELEMENTS``: a region read charges what it reads, a whole read the head."""
    d = member.descriptor
    return tuple(int(o) for o in d.shard.shard_offset), resolved_shape(d.shape)


def _slices(offset, shape):
    """Index of the box; the trailing ``...`` keeps a rank-0 box a (0-d) view, not a scalar."""
    return tuple(slice(o, o + n) for o, n in zip(offset, shape)) + (Ellipsis,)


def _c_order(a, dtype=None) -> np.ndarray:
    """``a`` C-contiguous, keeping its shape (``np.ascontiguousarray`` turns a 0-d array into 1-d)."""
    return np.asarray(a, dtype, order="C")


def _value_type(desc):
    """The element type a head's (or nested head's) values are evaluated in (a private type: its raw codes)."""
    return as_evaluated(desc).type_tag


def _add_mode(tag) -> int:
    return {ElementType.FLOAT16: ADD_F16, ElementType.BFLOAT16: ADD_BF16, ElementType.BOOL: ADD_OR}.get(tag, ADD_NATIVE)


def _kernel_view(a: np.ndarray, tag) -> np.ndarray:
    """float16 / bfloat16 arrays as their uint16 bits (numba has neither type); bool as uint8."""
    if tag in (ElementType.FLOAT16, ElementType.BFLOAT16):
        return a.view(np.uint16)
    if tag == ElementType.BOOL:
        return a.view(np.uint8)
    return a


def member_values(member, target, depth: int = 0, limits=None) -> np.ndarray:
    """The member's logical array decoded to ``target`` (a nested composite is materialized),
    its cost charged against ``limits``.  The member's values decode to ``target``: the binder
    has checked it (``composite.member.decoded_type``)."""
    if _is_composite(member):
        return materialize(member, limits=limits, _depth=depth + 1)
    return tensor_to_numpy(member.descriptor, member.buffers, target, limits=limits)


def _plain_view(member):
    """A non-composite member's values as a zero-copy view of its buffer, else None."""
    if _is_composite(member):
        return None
    return dense_view(member.descriptor, member.buffers)


def _fill(member, view: np.ndarray, target, depth, limits, patch=None) -> bool:
    """Write the member's values into ``view`` (the member's box of the output).

    ``patch`` (see :func:`_sparse_patch`) is a sparse correction that follows; returns True if it
    was applied during the decode (tensor.decode_into fuses it when it can), False if not.
    A temporary the member's decode needs is charged against ``limits``.
    """
    if _is_composite(member):
        _materialize_into(member, view, depth + 1, limits)
        return False
    src = _plain_view(member)
    if src is not None:  # zero-copy view of the member's buffer: one (streaming) copy into its box
        copy_into(view, src)
        return False
    desc = as_evaluated(member.descriptor)
    if view.flags.c_contiguous and desc.layout.tag not in SPARSE_TAGS and target != ElementType.FLOAT64:
        charge(decode_cost(desc, view.shape, view.dtype, target, output=False), limits,
               stored=tensor_stored_bytes(member.buffers))
        return decode_into(desc, member.buffers, view, patch=patch)
    np.copyto(view, tensor_to_numpy(desc, member.buffers, target, limits=limits))
    return False


def _is_sparse(member) -> bool:
    return not _is_composite(member) and member.descriptor.layout.tag in SPARSE_TAGS


def _sparse_patch(member, target, off, head_shape, combine):
    """(flat head indices, values as kernel bits, combine) of a sparse correction; None if it stores nothing."""
    lin, vals = sparse_linear(member.descriptor, member.buffers, target, off, head_shape)
    if vals.size == 0:
        return None
    return lin, readonly(_kernel_view(np.ascontiguousarray(vals), target)), int(combine)


# ------------------------------------------------------------------------------------
# materialize
# ------------------------------------------------------------------------------------


def _head(composite):
    head = composite.descriptor
    if head.layout.tag != LayoutTag.COMPOSITE:
        raise HurraySchemaError(f"not a composite head (layout_tag 0x{int(LayoutTag.COMPOSITE):02X})")
    return head


def _array_head(composite):
    """The head of a composite that is one array (a partition or an overlay); a group is a collection
    of its members, not one array (``layouts/composite.md § Group``): :class:`NotAnArray`."""
    head = _head(composite)
    if head.layout.composition_rule == CompositionRule.GROUP:
        raise NotAnArray("a group composite is not one array: look its members up")
    return head


def _materialize_into(composite, out: np.ndarray, depth: int, limits) -> None:
    head = _head(composite)
    rule, combine = head.layout.composition_rule, head.layout.combine_op
    target = _value_type(head)
    members = list(composite.members)
    head_shape = tuple(out.shape)
    if rule == CompositionRule.PARTITION:
        boxes = [_box(m, head_shape) for m in members]
        copies = []  # members whose buffer is a view of their values: copied together, in one kernel call
        for m, (off, shp) in zip(members, boxes):
            if 0 not in shp:
                src = _plain_view(m)
                if src is None:
                    _fill(m, out[_slices(off, shp)], target, depth, limits)
                else:
                    copies.append((out[_slices(off, shp)], src))
        copy_boxes(copies)
        return
    if rule != CompositionRule.OVERLAY:
        raise HurraySchemaError(f"composition rule 0x{int(rule):02X} has no single array view")
    base = members[0]
    mode = _add_mode(target)
    flat = out.reshape(-1) if out.flags.c_contiguous else None
    # a sparse first correction may be applied by the base's decode, row by row (output written once)
    early = len(members) > 1 and flat is not None and _is_sparse(members[1]) and mode != ADD_OR
    first = None
    if early:
        off, shp = _box(members[1], head_shape)
        if 0 not in shp:
            first = _sparse_patch(members[1], target, off, head_shape, combine)
    fused = _fill(base, out, target, depth, limits, first)
    for k, m in enumerate(members[1:]):
        off, shp = _box(m, head_shape)
        if 0 in shp:
            continue
        if _is_sparse(m):
            patch = first if k == 0 and early else _sparse_patch(m, target, off, head_shape, combine)
            if patch is None or (k == 0 and fused):
                continue  # stores nothing, or already applied during the base's decode
            lin, vals, _ = patch
            target_flat = flat if flat is not None else np.ascontiguousarray(out).reshape(-1)
            _scatter(_kernel_view(target_flat, target), lin, vals, int(combine), mode)
            if flat is None:
                np.copyto(out, target_flat.reshape(out.shape))
            continue
        box = out[_slices(off, shp)]
        if combine == CombineOp.REPLACE:
            _fill(m, box, target, depth, limits)
            continue
        vals = member_values(m, target, depth, limits)
        if mode in (ADD_F16, ADD_BF16):
            acc = _c_order(box)
            _add_dense(acc.reshape(-1).view(np.uint16), np.ascontiguousarray(vals).reshape(-1).view(np.uint16), mode)
            np.copyto(box, acc)
        elif mode == ADD_OR:
            np.logical_or(box, vals, out=box)
        else:
            np.add(box, vals, out=box, casting="unsafe")


def _evaluation_cost(item) -> int:
    """What :func:`materialize` (a composite) or ``tensor_to_numpy`` (a tensor) charges for ``item``."""
    if _is_composite(item):
        head = _head(item)
        if head.layout.composition_rule == CompositionRule.GROUP:
            return sum(_evaluation_cost(m) for m in item.members)
        shape = check_shape(head.shape)
        return math.prod(shape) * numpy_dtype(_value_type(head)).itemsize
    desc = as_evaluated(item.descriptor)
    target = decoded_type(desc)
    shape = check_shape(desc.shape)
    return decode_cost(desc, shape, numpy_dtype(target), target)


def materialize(composite, *, out: np.ndarray | None = None, limits=None, _depth: int = 0):
    """The composite's logical view: an array (partition, overlay) or a tuple of arrays (group).

    ``out`` (C-contiguous, the head's shape and dtype) receives the view instead of a fresh
    array, saving the allocation and first-touch page faults on repeated evaluation.
    Without ``out``, the head's array (for a group, the sum of its members' costs) is charged
    against ``limits`` (``None``: the default limits) and the bytes of every leaf's buffers before
    anything is allocated -- :class:`~hurray_schema.errors.LimitExceeded` if it exceeds both the
    budget and the expansion allowance (:mod:`.common`); with ``out`` nothing is.
    A private head type evaluates to its raw codes (``common.as_evaluated``).
    """
    limits = resolve_limits(limits) if out is None else NOT_CHARGED
    head = _head(composite)
    if not _depth:
        _validated(composite)
    if head.layout.composition_rule == CompositionRule.GROUP:
        charge(_evaluation_cost(composite), limits, stored=stored_bytes(composite))
        values = []
        for m in composite.members:
            if _is_composite(m):
                values.append(materialize(m, limits=limits, _depth=_depth + 1))
            else:
                values.append(tensor_to_numpy(m.descriptor, m.buffers, limits=limits))
        return tuple(values)
    shape = check_shape(head.shape)
    dtype = numpy_dtype(_value_type(head))
    if out is None:
        charge(math.prod(shape) * dtype.itemsize, limits, stored=stored_bytes(composite))
        out = new_array(shape, dtype)
    elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous {dtype} array of shape {shape}")
    if out.size:
        _materialize_into(composite, out, _depth, limits)
    return out


# ------------------------------------------------------------------------------------
# lookup / read
# ------------------------------------------------------------------------------------


def _element_offset(desc, index) -> tuple[int, int]:
    """(linear element offset, parameter slot or -1) of one logical index of a dense / indirect tensor."""
    layout = desc.layout
    strides = affine_strides(layout, storage_shape(desc))
    if strides is not None:
        return sum(i * s for i, s in zip(index, strides)), -1
    if isinstance(layout, TiledLayout):
        idx = [np.array(i, np.int64) for i in index]
        return int(tiled_offsets(layout, storage_shape(desc), idx)), -1
    if isinstance(layout, MortonLayout):
        rank, code = len(index), 0
        for d, i in enumerate(index):
            for b in range(layout.morton_bits[d]):
                code |= ((i >> b) & 1) << (b * rank + d)
        return code, -1
    if isinstance(layout, HilbertLayout):
        return hilbert_index(index, layout.hilbert_order), -1
    if isinstance(layout, BlockPagedLayout):
        raise HurraySchemaError("lookup in a block-paged member needs its sequence lengths; use read()")
    raise HurraySchemaError(f"layout 0x{int(layout.tag):02X} is not addressable")


def _param_index(p, shape, index) -> int:
    """Quantization parameter index of one logical index (per-block-affine.md § Block Layout)."""
    if p.pk == PK_TENSOR:
        return 0
    if p.pk == PK_CHANNEL:
        return int(index[p.axis])
    outer = 0
    for d, (i, n) in enumerate(zip(index, shape)):
        if d != p.axis:
            outer = outer * n + i
    return outer * p.nb + index[p.axis] // p.block


def _read_element(member, index, target):
    """One element of a non-composite member, decoded to ``target`` (a 0-d array)."""
    desc = as_evaluated(member.descriptor)
    dtype = numpy_dtype(target)
    if desc.layout.tag in SPARSE_TAGS:
        coords, vals = sparse_entries(desc, member.buffers, target, check_duplicates=False)
        hit = np.flatnonzero(np.all(coords == np.asarray(index, np.int64), axis=1))
        return vals[hit[-1]] if hit.size else np.zeros((), dtype)[()]
    info = element_type_info(desc.type_tag)
    offset, _ = _element_offset(desc, index)
    buf = as_bytes(member.buffers[0])
    _check_bounds(desc.byte_offset, info.bit_width, offset, offset, buf.size)
    offs = np.array([offset], np.int64)
    if desc.quantization is not None:
        p = quant_params(desc, member.buffers)
        pi = _param_index(p, tuple(desc.shape), index)
        if pi >= p.scales.size:
            raise HurraySchemaError("quantization parameter buffer is too short")
        work = np.float32 if target in (ElementType.FLOAT32, ElementType.FLOAT64) else dtype
        out = np.empty(1, work)
        kind = OUT_F32 if work == np.float32 else (OUT_F16 if target == ElementType.FLOAT16 else OUT_BF16)
        decode_gather(buf, np.int64(desc.byte_offset), offs, np.array([pi], np.int64), p.valmode, p.bits, p.signed,
                      p.table, p.scales, p.zps, kind, out if kind == OUT_F32 else out.view(np.uint16))
        return out.astype(dtype)[0]
    if info.bit_width >= 8 and dtype.itemsize * 8 == info.bit_width:
        w = info.bit_width // 8
        return np.ndarray((), dtype, buffer=buf, offset=desc.byte_offset + offset * w)[()]
    out = np.empty(1, dtype)
    gather_codes(buf, np.int64(desc.byte_offset), offs, np.int64(info.bit_width), out.view(np.uint8))
    return out[0]


def lookup(composite, index: Sequence[int], _depth: int = 0):
    """Value at logical ``index`` of a partition or overlay, touching only covering members.

    Partition: the one member whose box holds ``index``, read at ``index - shard_offset``.
    Overlay: the base value, then each covering correction in emission order.  A group is not one
    array: :class:`~hurray_schema.errors.NotAnArray`.
    """
    head = _array_head(composite)
    if not _depth:
        _validated(composite)
    shape = check_shape(head.shape)
    index = tuple(int(i) for i in index)
    if len(index) != len(shape) or any(not 0 <= i < n for i, n in zip(index, shape)):
        raise IndexError(f"index {index} outside shape {shape}")
    target = _value_type(head)
    rule = head.layout.composition_rule

    def one(member, local):
        if _is_composite(member):
            return lookup(member, local, _depth + 1)
        return _read_element(member, local, target)

    covering = []
    for m in composite.members:
        off, shp = _box(m, shape)
        if all(o <= i < o + n for i, o, n in zip(index, off, shp)):
            covering.append((m, tuple(i - o for i, o in zip(index, off))))
    if rule == CompositionRule.PARTITION:  # the binder has checked the exact cover: one member covers it
        return one(*covering[0])
    if rule != CompositionRule.OVERLAY or not covering:
        raise HurraySchemaError("lookup needs a partition or overlay composite")
    combine = head.layout.combine_op
    acc = np.array([one(*covering[0])], numpy_dtype(target))
    mode = _add_mode(target)
    for m, local in covering[1:]:
        if not _is_composite(m) and m.descriptor.layout.tag in SPARSE_TAGS:
            coords, vals = sparse_entries(m.descriptor, m.buffers, target, check_duplicates=False)
            hit = np.flatnonzero(np.all(coords == np.asarray(local, np.int64), axis=1))
            if hit.size == 0:
                continue  # a sparse correction acts at its stored indices only
            v = np.array([vals[hit[-1]]], acc.dtype)
        else:
            v = np.array([one(m, local)], acc.dtype)
        if combine == CombineOp.REPLACE:
            acc = v
        else:
            _scatter(_kernel_view(acc, target), np.zeros(1, np.int64), readonly(_kernel_view(v, target)),
                     CombineOp.ADD, mode)
    return acc[0]


def _region(region, shape):
    lo, hi = [], []
    for r, n in zip(region, shape):
        if isinstance(r, slice):
            start, stop, step = r.indices(n)
            if step != 1:
                raise HurraySchemaError("read() takes unit-step regions")
        else:
            start, stop = int(r[0]), int(r[1])
        if not 0 <= start <= stop <= n:
            raise IndexError(f"region {region} outside shape {shape}")
        lo.append(start)
        hi.append(stop)
    if len(lo) != len(shape):
        raise IndexError("region rank differs from the head's rank")
    return tuple(lo), tuple(hi)


def _fresh(values: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``values`` can stand for ``out``: an array of its own (not a view of a buffer),
    writeable, C-ordered, of ``out``'s shape and dtype."""
    return (values.flags.owndata and values.flags.writeable and values.flags.c_contiguous
            and values.shape == out.shape and values.dtype == out.dtype)


def _box_linear(coords: np.ndarray, shift, shape) -> np.ndarray:
    """Row-major linear index in ``shape`` of each coordinate row of ``coords`` moved by ``shift``,
    computed in one array (a box's entries can be many: no temporaries of their size)."""
    lin = coords[:, 0] + np.int64(shift[0])
    for d in range(1, len(shape)):
        lin *= np.int64(shape[d])
        lin += coords[:, d]
        if shift[d]:
            lin += np.int64(shift[d])
    return lin


def _selected_span(lo, hi, steps, off, shp):
    """Per dimension, the first and one past the last position of the stepped box (``lo``,
    ``lo + step``, ... below ``hi``) that lie in the member box ``[off, off + shp)``: the first is
    ``lo + ceil((max(lo, off) - lo) / step) * step``.  None if some dimension selects none of the
    member's positions (the member is not read)."""
    first, stop = [], []
    for l, h, step, o, n in zip(lo, hi, steps, off, shp):
        a = l + -(-(max(l, o) - l) // step) * step
        b = min(h, o + n)
        if a >= b:
            return None
        first.append(a)
        stop.append(b)
    return first, stop


def _stepped_entries(coords: np.ndarray, values: np.ndarray, steps) -> tuple[np.ndarray, np.ndarray]:
    """The sparse entries (coordinates relative to a selected position) that lie on the
    progression of ``steps``, their coordinates divided by the steps (output indices)."""
    if all(step == 1 for step in steps):
        return coords, values
    step_row = np.asarray(steps, np.int64)
    keep = np.flatnonzero(np.all(coords % step_row == 0, axis=1))
    return coords[keep] // step_row, values[keep]


def read(composite, region, *, steps: Sequence[int] | None = None, limits=None, _depth: int = 0) -> np.ndarray:
    """The box ``region`` (slices or (start, stop) pairs) of the logical view; only members that
    intersect it are read, each over its intersection with the box only (a plain member by
    :func:`.tensor_box.tensor_box`, a nested composite by this function; a sparse correction
    contributes the entries in the box: :func:`.tensor_box.sparse_box_entries`).

    ``steps`` (positive, one per dimension; ``None``: all 1) makes the box stepped: per
    dimension only the positions ``lo, lo + step, ...`` below ``hi``; the result is the view
    sliced ``lo:hi:step`` (shape ``ceil((hi - lo) / step)``).  Each member is read (with the same
    steps) at the selected positions inside its box only, a member holding none is not read, and
    a sparse correction contributes its entries at selected positions only.

    The region's (stepped) array (against the bytes of every leaf's buffers), then each
    intersecting member's read (against its own buffers: :mod:`.tensor_box`), are charged against
    ``limits`` (``None``: the default limits) before being allocated: :class:`LimitExceeded`
    beyond both the budget and the expansion allowance.  The head's shape is not bounded by
    ``dense.MAX_ELEMENTS``, only the region.  A group is not one array:
    :class:`~hurray_schema.errors.NotAnArray`.
    """
    limits = resolve_limits(limits)
    head = _array_head(composite)
    if not _depth:
        _validated(composite)
    shape = resolved_shape(head.shape)
    lo, hi = _region(region, shape)
    given = check_steps(steps, len(shape))
    steps = (1,) * len(shape) if given is None else given
    target = _value_type(head)
    rule = head.layout.composition_rule
    out_shape = check_shape(stepped_extent(lo, hi, steps))
    dtype = numpy_dtype(target)
    charge(math.prod(out_shape) * dtype.itemsize, limits, stored=stored_bytes(composite))
    out = new_array(out_shape, dtype, zeros=True)
    if out.size == 0:
        return out

    def part(member, off, shp):
        """(slices into out, values of the member at the selected positions in its box) or None."""
        span = _selected_span(lo, hi, steps, off, shp)
        if span is None:
            return None
        a, b = span
        local = tuple((x - o, y - o) for x, y, o in zip(a, b, off))
        if _is_composite(member):
            vals = read(member, local, steps=given, limits=limits, _depth=_depth + 1)
        else:
            vals = tensor_box(member.descriptor, member.buffers, [x for x, _ in local], [y for _, y in local], target,
                              steps=given, limits=limits)
        at = [(x - l) // step for x, l, step in zip(a, lo, steps)]
        return tuple(slice(i, i + n) for i, n in zip(at, vals.shape)) + (Ellipsis,), vals, local

    members = list(composite.members)
    if rule == CompositionRule.PARTITION:
        for m in members:
            got = part(m, *_box(m, shape))
            if got is not None:
                out[got[0]] = got[1]
        return out
    if rule != CompositionRule.OVERLAY or not members:
        raise HurraySchemaError("read needs a partition or overlay composite")
    combine = head.layout.combine_op
    mode = _add_mode(target)
    got = part(members[0], *_box(members[0], shape))
    if _fresh(got[1], out):  # the binder makes the base cover the head: it holds every selected position
        out = got[1]  # the base's own decode of the whole region: corrected in place, not copied
    else:
        out[got[0]] = got[1]
    flat = out.reshape(-1)
    for m in members[1:]:
        off, shp = _box(m, shape)
        span = _selected_span(lo, hi, steps, off, shp)
        if span is None:
            continue  # the member's box holds no selected position: never decoded
        if not _is_composite(m) and m.descriptor.layout.tag in SPARSE_TAGS:
            start, stop = span
            coords, vals = sparse_box_entries(m.descriptor, m.buffers, [a - o for a, o in zip(start, off)],
                                              [b - o for b, o in zip(stop, off)], target)
            coords, vals = _stepped_entries(coords, vals, steps)
            if vals.size == 0:
                continue
            lin = _box_linear(coords, [(a - l) // step for a, l, step in zip(start, lo, steps)], out.shape)
            if combine == CombineOp.REPLACE:  # distinct indices (coo.md § Validity Constraints): one assignment,
                flat[lin] = vals  # no parallel kernel launch for a box's few entries
                continue
            _scatter(_kernel_view(flat, target), lin, readonly(_kernel_view(np.ascontiguousarray(vals), target)),
                     int(combine), mode)
            continue
        got = part(m, off, shp)
        if got is None:
            continue
        sl, vals, _ = got
        if combine == CombineOp.REPLACE:
            out[sl] = vals
        else:
            acc = _c_order(out[sl])
            v = _c_order(vals, acc.dtype)
            if mode in (ADD_F16, ADD_BF16):
                _add_dense(acc.reshape(-1).view(np.uint16), v.reshape(-1).view(np.uint16), mode)
            elif mode == ADD_OR:
                np.logical_or(acc, v, out=acc)
            else:
                np.add(acc, v, out=acc, casting="unsafe")
            out[sl] = acc
    return out
