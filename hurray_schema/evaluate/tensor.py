"""The logical array of one (non-composite) tensor: descriptor + buffers -> ``np.ndarray``.

A quantized tensor decodes to float32 (``quantization/per-tensor-affine.md § Dequantization
Formula``: the real-valued type produced is float32) unless a narrower or wider decoded type
is asked for (a composite member decodes to its head's ``type_tag``): the float32 result is
then rounded once to float16 / bfloat16, or widened to float64.

A private element type ``0xF0``-``0xFE`` (``element-types.md § Type Identifier Encoding``)
has no values this library can interpret, only codes whose width its Extension Type
section gives (``metadata.md § Extension Type Section``): a tensor of 8, 16, 32 or 64-bit
codes evaluates to those raw codes as uint8 / uint16 / uint32 / uint64 (little-endian,
like every whole-byte type); other widths, and a tag no table row or extension section
describes (kept by a permissive reader), raise :class:`UnsupportedEvaluation`.  So does an
empty tensor NumPy cannot hold even empty (float32 ``[0, 2**62]``: :func:`new_array`).

**Evaluation budget** (the rule: :mod:`hurray_schema.evaluate.common`).  Before
allocating, :func:`tensor_to_numpy` charges the cost of the decode (:func:`decode_cost`)
against ``limits`` (:class:`~hurray_schema.limits.Limits`; ``limits=None`` means
:data:`~hurray_schema.limits.DEFAULT_LIMITS`, a 256 MiB budget) and the bytes of the
tensor's buffers: it raises :class:`~hurray_schema.errors.LimitExceeded`
(``limit == "max_evaluation_bytes"``) when the cost exceeds the budget and
:data:`~hurray_schema.limits.EVALUATION_EXPANSION` (64) times those bytes -- the 65-byte
stride-0 tensor asking for 512 MiB from a 4-byte buffer is refused, a 2 GiB dense tensor
read from 2 GiB of buffers is not.  The cost is the bytes of the array returned (element
count x item size of the decoded dtype) plus, where the decode needs them, 8 bytes per
element for an offset table (every layout but row-major, column-major and strided;
sub-byte and narrow-float codes on those too), 8 more per element for a quantization
parameter index table (quantized values gathered through an offset table) and 4 per
element for the float32 work array of a quantized tensor widened to float64.  Sparse
coordinates and values are not charged: they are bounded by the buffers read.  The
composite rules are in :mod:`hurray_schema.evaluate.merge`.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import attrs
import numpy as np

from ..errors import CopyRequired, HurraySchemaError, InvalidDtype
from ..limits import Limits, resolve_limits
from ..model import BlockPagedLayout, ElementType, LayoutTag, PerBlockAffine, PerChannelAffine, PerTensorAffine
from ..structs.element_types import element_type_info, element_type_of
from .common import (NOT_CHARGED, OFFSET_BYTES, QUANTIZED_DECODE_TYPES, SPARSE_TAGS, as_bytes, as_evaluated, charge,
                     check_representable, check_shape, decoded_type, element_type, new_array, tensor_stored_bytes)
from . import jit
from .dense import element_offsets
from .dequantize import (DECODE_COMPILE_ELEMENTS, NO_PATCH, OUT_BF16, OUT_F16, OUT_F32, PK_BLOCK, PK_CHANNEL,
                         ROWS_ANY, ROWS_INT4, ROWS_LUT, decode_gather, decode_rows, decode_rows_int4, decode_rows_lut,
                         decode_rows_numpy, int4_vector_ok, param_indices, quant_params, rows_kernel, storage_shape)
from .elements import CODE_VIEW_TYPES, UnsupportedEvaluation, gather_codes, numpy_dtype
from .sparse import densify

__all__ = ["tensor_to_numpy", "dense_view", "zero_copy_view", "requested_dtype", "raw_code_descriptor",
           "unpacked_codes", "decode_into", "decode_cost", "INT4_VECTOR", "RAW_CODE_DTYPES", "DEFAULT_CASTING"]


def _owned(a) -> np.ndarray:
    """A fresh, writeable, flat int64 copy (keeps kernel signatures to one per argument)."""
    return np.array(a, np.int64, copy=True).reshape(-1)


# ------------------------------------------------------------------------------------
# Evaluation budget (see the module docstring)
# ------------------------------------------------------------------------------------

_WIDEN_WORK_BYTES = np.dtype(np.float32).itemsize
_AFFINE = (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.STRIDED)


def _needs_offset_table(desc) -> bool:
    """Whether the decode of ``desc`` builds one int64 offset per element (see :func:`decode_into`)."""
    if desc.layout.tag in SPARSE_TAGS:
        return False
    if desc.layout.tag not in _AFFINE:
        return True
    info = element_type_info(desc.type_tag)
    return desc.quantization is None and info is not None and (info.bit_width < 8 or desc.type_tag in CODE_VIEW_TYPES)


def decode_cost(desc, shape, out_dtype, target, *, output: bool = True) -> int:
    """Bytes charged for decoding ``desc`` (already :func:`as_evaluated`) to ``target`` as ``out_dtype``:
    the output array (unless ``output`` is False: the caller provides it) plus the tables the decode
    builds (module docstring)."""
    count = math.prod(shape)
    cost = count * np.dtype(out_dtype).itemsize if output else 0
    if _needs_offset_table(desc):
        cost += count * OFFSET_BYTES
        if desc.quantization is not None:
            cost += count * OFFSET_BYTES
    if desc.quantization is not None and target == ElementType.FLOAT64:
        cost += count * _WIDEN_WORK_BYTES
    return cost


_INJECTIVE = (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR, LayoutTag.TILED, LayoutTag.MORTON, LayoutTag.HILBERT)


def _precheck_dense(desc, buffers, shape, have: Optional[int] = None) -> None:
    """Before allocating per element: an injective dense layout needs buffer 0 to hold every element
    (strided and block-paged may alias elements; they are bounded from their offsets).  ``have``:
    the size of buffer 0 in bytes, when the caller has measured it."""
    info = element_type_info(desc.type_tag)
    if info is None or desc.layout.tag not in _INJECTIVE or 0 in shape:
        return
    if not buffers:
        raise HurraySchemaError("a dense tensor needs buffer 0")
    lay = desc.layout
    while lay is not None and lay.tag == LayoutTag.TILED:
        if LayoutTag.STRIDED in (lay.outer_layout, lay.inner_layout):
            return  # strided tile orders may alias or run backwards: bounded from the offsets
        lay = lay.inner
    need = info.buffer_bytes(math.prod(shape))
    if have is None:
        have = len(as_bytes(buffers[0]))
    if have < need:
        raise HurraySchemaError(f"buffer 0 holds {have} bytes, the tensor's elements need {need}")


def _element_range(strides, offsets, shape):
    """(min, max) linear element offset touched."""
    if offsets is not None:
        return (int(offsets.min()), int(offsets.max())) if offsets.size else (0, 0)
    lo = hi = 0
    for s, n in zip(strides, shape):
        reach = s * (n - 1)
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi


def _check_bounds(byte_offset, bits, lo, hi, nbytes):
    if bits == 6:
        first, last = byte_offset + (lo // 4) * 3, byte_offset + (hi // 4) * 3 + 2
    elif bits < 8:
        per = 8 // bits
        first, last = byte_offset + lo // per, byte_offset + hi // per
    else:
        w = bits // 8
        first, last = byte_offset + lo * w, byte_offset + hi * w + w - 1
    if first < 0 or last >= nbytes:
        raise HurraySchemaError(f"elements span bytes [{first}, {last}] outside buffer 0 of {nbytes} bytes")


def _affine_offsets(strides, shape):
    off = np.zeros((), np.int64)
    for i, s in zip(np.indices(shape, dtype=np.int64, sparse=True), strides):
        off = off + i * np.int64(s)
    return np.broadcast_to(off, shape)


def dense_view(desc, buffers) -> Optional[np.ndarray]:
    """Zero-copy read-only view of an unquantized whole-byte affine tensor, else ``None``."""
    desc = as_evaluated(desc)
    if desc.quantization is not None or desc.layout.tag not in (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR,
                                                                 LayoutTag.STRIDED):
        return None
    info = element_type_info(desc.type_tag)
    if info is None or info.bit_width < 8 or desc.type_tag in CODE_VIEW_TYPES or desc.type_tag == ElementType.FLOAT128:
        return None
    shape = check_shape(desc.shape)
    if 0 in shape or not buffers:
        return None
    strides, _, _ = element_offsets(desc.layout, shape, shape)
    buf = as_bytes(buffers[0])
    lo, hi = _element_range(strides, None, shape)
    _check_bounds(desc.byte_offset, info.bit_width, lo, hi, buf.size)
    w = info.bit_width // 8
    return np.ndarray(shape, numpy_dtype(desc.type_tag), buffer=buf, offset=desc.byte_offset,
                      strides=tuple(s * w for s in strides))


def decode_into(desc, buffers, out: np.ndarray, seq_lens=None, patch=None) -> bool:
    """Decode a dense / indirect tensor into the C-contiguous array ``out`` (its dtype picks the target).

    ``patch`` = (flat indices into ``out``, values in ``out``'s kernel type, combine) is a sparse
    correction the caller wants applied afterwards; returns True if it was applied here, fused into
    the decode (only the 4-bit vector kernel does), False if the caller must still apply it.
    """
    desc = as_evaluated(desc)
    shape = tuple(out.shape)
    info = element_type_info(desc.type_tag)
    if info is None or desc.type_tag == ElementType.FLOAT128:
        raise UnsupportedEvaluation(f"element type 0x{int(desc.type_tag):02X} is not evaluated here")
    if out.size == 0:
        return False
    if not buffers:
        raise HurraySchemaError("a dense tensor needs buffer 0")
    buf = as_bytes(buffers[0])
    bits = info.bit_width
    sshape = storage_shape(desc)
    strides, offsets, slots = element_offsets(desc.layout, shape, sshape, buffers, seq_lens)
    lo, hi = _element_range(strides, offsets, shape)
    _check_bounds(desc.byte_offset, bits, lo, hi, buf.size)
    base = np.int64(desc.byte_offset)
    flat = out.reshape(-1)
    if desc.quantization is not None:
        count = None
        q = desc.quantization
        if isinstance(desc.layout, BlockPagedLayout) and not isinstance(q, (PerTensorAffine, PerChannelAffine)):
            # layouts/block-paged.md § Per-scheme composition: block parameters are per page slot
            if not isinstance(q, PerBlockAffine) or q.axis != 0 or q.block_size != desc.layout.page_size:
                raise HurraySchemaError("block-paged block quantization needs per-block affine, axis 0 and "
                                        "block_size == page_size")
            count = int(desc.layout.num_pages) * int(desc.layout.page_size)
        p = quant_params(desc, buffers, count)
        kind = {np.dtype(np.float32): OUT_F32, np.dtype(np.float16): OUT_F16}.get(out.dtype, OUT_BF16)
        kout = flat.view(np.uint16) if kind != OUT_F32 else flat
        if strides is not None:
            rshape = np.array(shape if shape else (1,), np.int64)
            rstr = np.array(strides if shape else (0,), np.int64)
            axis = p.axis if shape else 0
            if INT4_VECTOR and int4_vector_ok(p, axis == len(rshape) - 1, int(rstr[-1]), kind):
                return _decode_int4(buf, base, rshape, rstr, p, axis, kind, kout, patch)
            lut_ok = p.bits in (1, 2, 4) and (p.pk != PK_BLOCK or axis == len(rshape) - 1) \
                and (p.pk != PK_CHANNEL or axis != len(rshape) - 1) and (p.pk != PK_BLOCK or p.block >= 16)
            if not rows_kernel(ROWS_LUT if lut_ok else ROWS_ANY, kind).worth_it(kout.size, DECODE_COMPILE_ELEMENTS):
                decode_rows_numpy(buf, base, rshape, rstr, p, axis, kind, kout)
                return False
            kernel = decode_rows_lut if lut_ok else decode_rows
            kernel(buf, base, rshape, rstr, p.valmode, p.bits, p.signed, p.table, p.scales, p.zps,
                   p.pk, axis, p.block, p.nb, kind, kout)
        else:
            if slots is not None and p.pk == PK_BLOCK:
                pidx = np.broadcast_to(slots[:, None, None], shape)
            else:
                pidx = param_indices(p, shape)
            # a parameter array indexed out of range would read past it: bound-check once
            if pidx.size and (pidx.min() < 0 or pidx.max() >= p.scales.size
                              or (p.zps.size > 1 and pidx.max() >= p.zps.size)):
                raise HurraySchemaError("quantization parameter buffer is too short for the tensor")
            decode_gather(buf, base, _owned(offsets), _owned(pidx), p.valmode, p.bits, p.signed,
                          p.table, p.scales, p.zps, kind, kout)
        return False
    if bits >= 8 and desc.type_tag not in CODE_VIEW_TYPES:
        w = bits // 8
        if strides is not None:
            view = np.ndarray(shape, out.dtype, buffer=buf, offset=desc.byte_offset,
                              strides=tuple(s * w for s in strides))
            np.copyto(out, view)
        else:
            # offsets may be negative (strided tile grids): the span starts at the lowest one
            span = np.ndarray((hi - lo + 1,), out.dtype, buffer=buf, offset=desc.byte_offset + lo * w)
            np.take(span, offsets - lo, out=out)
        return False
    if strides is not None:
        offsets = _affine_offsets(strides, shape)
    codes = flat.view(np.uint8)
    gather_codes(buf, base, _owned(offsets), np.int64(bits), codes)
    if desc.type_tag == ElementType.BOOL:
        np.minimum(codes, 1, out=codes)  # a stored bit is 0 or 1 already; keep bool items canonical
    return False


INT4_VECTOR = True
"""Decode 4-bit codes with :func:`.dequantize.decode_rows_int4` where it applies (tests switch it off to
exercise the table-lookup kernel)."""

_NO_ENTRIES = np.zeros(1, np.int64)


@jit.kernel("i64(i64[:])")
def _strictly_increasing_kernel(lin):
    for k in range(1, lin.size):
        if lin[k] <= lin[k - 1]:
            return 0
    return 1


INCREASING_COMPILE_ENTRIES = 1 << 24
"""Entries checked by NumPy in a process before :func:`_strictly_increasing_kernel` is compiled, while
the kernel cache does not hold it (:meth:`.jit.Kernel.worth_it`)."""


def _strictly_increasing(lin: np.ndarray) -> bool:
    """Whether ``lin`` is strictly increasing."""
    if _strictly_increasing_kernel.worth_it(lin.size, INCREASING_COMPILE_ENTRIES):
        return bool(_strictly_increasing_kernel(lin))
    return bool(np.all(lin[1:] > lin[:-1]))


def _decode_int4(buf, base, rshape, rstr, p, axis, kind, kout, patch) -> bool:
    """Run :func:`.dequantize.decode_rows_int4`, fusing ``patch`` when its indices are strictly increasing
    (storage order of a sorted COO or of CSR rows; entries at distinct indices commute, so another
    order would only need sorting)."""
    lin, vals, combine = _NO_ENTRIES, kout[:1], NO_PATCH
    if patch is not None and _strictly_increasing(patch[0]):
        lin, vals, combine = patch[0], patch[1], int(patch[2])
    if not rows_kernel(ROWS_INT4, kind, combine).worth_it(kout.size, DECODE_COMPILE_ELEMENTS):
        decode_rows_numpy(buf, base, rshape, rstr, p, axis, kind, kout)
        return False  # the patch is applied afterwards
    decode_rows_int4(buf, base, rshape, rstr, p.signed, p.scales, p.zps, p.pk, axis, p.block, p.nb, kind, kout,
                     lin, vals, combine)
    return combine != NO_PATCH


def _check_quant_axis(desc):
    q = desc.quantization
    if q is not None and hasattr(q, "axis") and q.axis >= len(desc.shape):
        raise HurraySchemaError("quantization axis must be < rank")


def _quantized_decode_type(dtype: np.dtype):
    """The element type a quantized tensor asked for ``dtype`` dequantizes straight into (float32
    arithmetic, then one rounding), or ``None``."""
    tag = element_type_of(dtype)
    return tag if tag in QUANTIZED_DECODE_TYPES else None

RAW_CODE_DTYPES = {ElementType.INT4: np.dtype(np.int8), ElementType.UINT4: np.dtype(np.uint8),
                   ElementType.INT2: np.dtype(np.int8), ElementType.UINT2: np.dtype(np.uint8)}
"""Sub-byte integer storage types -> the NumPy integer their unpacked codes come back as (the values:
``int4`` code 0xF is -1).  The float codes (float8, float6, float4) come back as their bits in uint8."""

def _is_element_dtype(dtype: np.dtype) -> bool:
    """``dtype`` is one an element type decodes to (the ``ml_dtypes`` ones included)."""
    return element_type_of(dtype) is not None

DEFAULT_CASTING = "unsafe"
"""The NumPy casting rule of ``to_numpy(dtype=...)``: ``ndarray.astype``'s and ``numpy.asarray(x, dtype)``'s."""


def requested_dtype(dtype) -> Optional[np.dtype]:
    """``dtype`` as a NumPy dtype: an :class:`ElementType` (or its integer tag) is its decoded
    array's dtype (:func:`.elements.numpy_dtype`), anything else what ``numpy.dtype`` makes of
    it (``ml_dtypes`` types included).  A dtype that is not a number type (bool, integer, float,
    complex or an ``ml_dtypes`` type) is an :class:`InvalidDtype`; a tag no element type has is
    an :class:`UnsupportedEvaluation`."""
    if dtype is None:
        return None
    if isinstance(dtype, (bool, np.bool_)):
        raise InvalidDtype(f"dtype {dtype!r} is neither a NumPy dtype nor an ElementType")
    if isinstance(dtype, (int, np.integer)):
        return numpy_dtype(element_type(dtype, "requested type"))
    try:
        resolved = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidDtype(f"dtype {dtype!r} is neither a NumPy dtype nor an ElementType") from None
    if resolved.kind not in "biufc" and not _is_element_dtype(resolved):
        raise InvalidDtype(f"dtype {resolved} is not a number type")
    return resolved


def raw_code_descriptor(desc):
    """``desc`` (already :func:`as_evaluated`) as the tensor of its stored codes: without its
    quantization, so it decodes to its storage type.  A quantized sparse tensor has no codes
    where it stores no entry and is refused."""
    if desc.quantization is None:
        return desc
    if desc.layout.tag in SPARSE_TAGS:
        raise UnsupportedEvaluation("a quantized sparse tensor stores no code where it has no entry; "
                                    "read its entries with sparse_entries()")
    return attrs.evolve(desc, quantization=None)


def unpacked_codes(values: np.ndarray, type_tag) -> np.ndarray:
    """The codes of ``values`` (decoded in storage type ``type_tag``) in a plain NumPy type:
    :data:`RAW_CODE_DTYPES` for sub-byte integers, uint8 bits for the narrow float types (whole-byte
    and bool arrays are their codes already)."""
    code_dtype = RAW_CODE_DTYPES.get(type_tag)
    if code_dtype is not None:
        return values.astype(code_dtype)
    if type_tag in CODE_VIEW_TYPES:
        return values.view(np.uint8)
    return values


def zero_copy_view(desc, buffers) -> Optional[np.ndarray]:
    """A read-only view of buffer 0 holding the logical array of ``desc`` (already
    :func:`as_evaluated`), when its values are its stored bytes: row-major
    (``layouts/row-major.md``), unquantized, an element type of whole bytes that NumPy or
    ``ml_dtypes`` holds one element per item (not bool: it is bit-packed), non-empty, and
    buffer 0 long enough.  Otherwise ``None`` (the tensor is decoded)."""
    if desc.quantization is not None or desc.layout.tag != LayoutTag.ROW_MAJOR or not buffers:
        return None
    info = element_type_info(desc.type_tag)
    if info is None or info.bit_width < 8 or desc.type_tag == ElementType.FLOAT128:
        return None
    dtype = numpy_dtype(desc.type_tag)
    shape = check_shape(desc.shape)
    if dtype.itemsize * 8 != info.bit_width or 0 in shape:
        return None
    buf = as_bytes(buffers[0])
    if desc.byte_offset + math.prod(shape) * dtype.itemsize > buf.size:
        return None  # the decode reports the short buffer
    view = np.ndarray(shape, dtype, buffer=buf, offset=desc.byte_offset)
    view.flags.writeable = False
    return view


def _cast(values: np.ndarray, wanted: Optional[np.dtype], casting: str) -> np.ndarray:
    if wanted is None or values.dtype == wanted:
        return values
    if not np.can_cast(values.dtype, wanted, casting=casting):
        raise InvalidDtype(f"cannot cast {values.dtype} values to {wanted} under the {casting!r} casting rule")
    return values.astype(wanted, casting=casting)


def tensor_to_numpy(desc, buffers: Sequence, dtype=None, *, seq_lens=None, limits: Optional[Limits] = None,
                    copy: Optional[bool] = True, raw: bool = False, casting: str = DEFAULT_CASTING) -> np.ndarray:
    """The logical array of a tensor, in logical C order.

    The values come out in the tensor's decoded type (:func:`.common.decoded_type`).  ``dtype``
    (a NumPy / ``ml_dtypes`` dtype or an :class:`ElementType`, :func:`requested_dtype`) asks for
    another type: a quantized tensor asked for float16, bfloat16, float32 or float64 dequantizes
    straight into it (float32 arithmetic, one rounding); any other request decodes to the decoded
    type, then casts with NumPy under ``casting`` (default :data:`DEFAULT_CASTING`, the rule of
    ``ndarray.astype``: float to integer truncates, out-of-range values wrap; ``"same_kind"`` or
    ``"safe"`` refuse narrowing casts with :class:`InvalidDtype`).
    ``raw=True`` returns the stored codes instead of the values: a quantized tensor's codes in
    its storage type, sub-byte integers unpacked one per item (:data:`RAW_CODE_DTYPES`), narrow
    float codes as their uint8 bits; for whole-byte unquantized types the codes are the values.
    ``copy``: ``True`` (the default here) always returns a new array; ``None`` returns a
    read-only view of buffer 0 when the layout allows (:func:`zero_copy_view`: a memory-mapped
    file's pages are not read until used), else a new array; ``False`` the view or
    :class:`CopyRequired`.
    Sub-byte and narrow float types come back as ``ml_dtypes`` arrays; an empty tensor as an
    empty array of its shape; a private type as its raw codes (:func:`as_evaluated`).
    ``seq_lens`` gives the per-sequence token counts of a block-paged tensor when the
    descriptor does not determine them.  Before anything is allocated the decode's cost
    (:func:`decode_cost`, plus the cast's output) is charged against ``limits`` (``None``: the
    default limits) and the bytes of ``buffers`` (module docstring): :class:`LimitExceeded` if
    it exceeds both the budget and the expansion allowance.  A view allocates nothing.
    """
    if desc.layout.tag == LayoutTag.COMPOSITE:
        raise HurraySchemaError("a composite head has no data; use materialize()")
    limits = resolve_limits(limits)
    desc = as_evaluated(desc)
    if raw:
        desc = raw_code_descriptor(desc)
    wanted = requested_dtype(dtype)
    target = decoded_type(desc)
    quantized_target = _quantized_decode_type(wanted) if wanted is not None and desc.quantization is not None \
        else None
    if quantized_target is not None:
        target = quantized_target
    if copy is not True and not (raw and desc.type_tag in CODE_VIEW_TYPES):
        view = zero_copy_view(desc, buffers)
        if view is not None and (wanted is None or wanted == view.dtype):
            return view
    if copy is False:
        raise CopyRequired("the array cannot be had without a decode or a copy (copy=False was asked)")
    values = _decode(desc, buffers, target, seq_lens, limits, wanted)
    if raw:
        values = unpacked_codes(values, desc.type_tag)
    return _cast(values, wanted, casting)


def _decode(desc, buffers: Sequence, target, seq_lens, limits: Limits, wanted: Optional[np.dtype]) -> np.ndarray:
    """A new array of ``desc``'s values in ``target``, charged with the cast to ``wanted`` if any."""
    shape = check_shape(desc.shape)
    _check_quant_axis(desc)
    out_dtype = numpy_dtype(target)
    cast_bytes = math.prod(shape) * wanted.itemsize if wanted is not None and wanted != out_dtype else 0
    charge(decode_cost(desc, shape, out_dtype, target) + cast_bytes, limits, stored=tensor_stored_bytes(buffers))
    check_representable(shape, out_dtype)
    if desc.layout.tag in SPARSE_TAGS:
        return densify(desc, buffers, target, limits=NOT_CHARGED)
    _precheck_dense(desc, buffers, shape)
    widen = desc.quantization is not None and target == ElementType.FLOAT64  # float32 arithmetic, then widened
    work_dtype = np.dtype(np.float32) if widen else out_dtype
    out = new_array(shape, work_dtype, zeros=0 in shape)
    decode_into(desc, buffers, out, seq_lens)
    return out.astype(np.float64) if widen else out
