"""A plain-NumPy decoding of tensors and composites, written from the spec: the tests' oracle.

Nothing here calls ``hurray_schema.evaluate`` or the readers: only the descriptors' fields
(``hurray_schema.model``) and the buffers' bytes are read, and every value is computed the way
the spec states it, one element position at a time (gathered with whole-array NumPy):

* addresses (``memory-layout.md § Element Address Computation``): row-major, column-major and
  strided layouts; whole-byte elements at ``byte_offset + offset * size``, sub-byte ones at
  bit ``(byte_offset * 8) + offset * bits``, LSB-first (``element-types.md``);
* sparse layouts (``layouts/coo.md``, ``csr.md``, ``csc.md``): their ``uint64`` index buffers;
* quantization (``quantization/*.md § Dequantization Formula``): per-tensor, per-channel and
  per-block affine, NF4 and MXFP; a block scheme's storage holds whole blocks along its axis
  (``per-block-affine.md § Padding``) in the layout's order, and the block index is
  ``outer * ceil(S / K) + i_axis // K`` with ``outer`` row-major over the other axes;
* composites (``layouts/composite.md § Composition Semantics``): partition and overlay, through
  :func:`support.evaluate_reference.ref_partition` / :func:`~support.evaluate_reference.ref_overlay`.

Tiled, Morton and the other layouts are not decoded here (their tests build the expected array
themselves): :func:`reference_array` raises ``NotImplementedError`` for them.

The decoded type is the one the spec gives: the element type for an unquantized tensor
(sub-byte and narrow float types as ``ml_dtypes`` arrays, ``bool`` as NumPy's), float32 for
per-tensor affine, NF4 and MXFP, the scale type for per-channel and per-block affine (float32
arithmetic, then one rounding).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from hurray_schema.model import CombineOp, CompositionRule, ElementType, LayoutTag, MemberRole, QuantFlag
from support.evaluate_reference import DTYPES, ref_overlay, ref_partition

E = ElementType

CODE_TYPES = {E.BOOL: (1, np.dtype(bool)), E.INT2: (2, ml_dtypes.int2), E.UINT2: (2, ml_dtypes.uint2),
              E.INT4: (4, ml_dtypes.int4), E.UINT4: (4, ml_dtypes.uint4),
              E.FLOAT4_E2M1: (4, ml_dtypes.float4_e2m1fn), E.FLOAT8_E4M3: (8, ml_dtypes.float8_e4m3fn),
              E.FLOAT8_E5M2: (8, ml_dtypes.float8_e5m2)}
"""Element types decoded from their codes: (bits, the dtype of their values)."""

SIGNED_CODES = {E.INT2, E.INT4}
NARROW_FLOATS = {E.FLOAT4_E2M1, E.FLOAT8_E4M3, E.FLOAT8_E5M2}

NF4_LEVELS = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
"""``quantization/nf4.md § Lookup Table``, verbatim."""

BLOCK_SCHEMES = {3, 4, 5}
"""Per-block affine, NF4 and MXFP: their storage holds whole blocks along the axis."""


def reference_array(item) -> np.ndarray:
    """The logical array of a tensor or composite (anything with ``descriptor`` and ``buffers`` or
    ``members``), in logical C order."""
    if item.descriptor.layout.tag == LayoutTag.COMPOSITE:
        return _composite(item)
    return tensor_array(item.descriptor, item.buffers)


def tensor_array(desc, buffers) -> np.ndarray:
    """The logical array of the tensor ``desc`` over ``buffers``."""
    if desc.layout.tag in (LayoutTag.COO, LayoutTag.CSR, LayoutTag.CSC):
        coords, values = sparse_entries(desc, buffers)
        out = np.zeros(desc.shape, values.dtype)
        out[tuple(coords.T)] = values
        return out
    if desc.quantization is not None:
        return _dequantized(desc, buffers)
    return _values(desc, buffers[0], desc.shape)


def code_values(codes, tag) -> np.ndarray:
    """Stored codes of a sub-byte, boolean or narrow float type ``tag`` (their unsigned bit
    patterns, as integers) as its values (``element-types.md``: two's complement, OCP formats)."""
    codes = np.asarray(codes)
    bits, dtype = CODE_TYPES[tag]
    if tag == E.BOOL:
        return codes.astype(bool)
    if tag in NARROW_FLOATS:
        return codes.astype(np.uint8).view(dtype)
    if tag in SIGNED_CODES:
        codes = np.where(codes >= 1 << (bits - 1), codes.astype(np.int64) - (1 << bits), codes)
    return codes.astype(np.int64).astype(dtype)


def sparse_entries(desc, buffers) -> tuple[np.ndarray, np.ndarray]:
    """``(coords, values)`` of a COO, CSR or CSC tensor: one ``rank``-long int64 row per stored entry."""
    nnz = desc.layout.nnz
    values = _element_values(buffers[0], desc.type_tag, np.arange(nnz, dtype=np.int64), 0)
    indices = np.frombuffer(bytes(buffers[1]), "<u8").astype(np.int64)
    if desc.layout.tag == LayoutTag.COO:
        return indices.reshape(nnz, len(desc.shape)), values
    pointers = np.frombuffer(bytes(buffers[2]), "<u8").astype(np.int64)
    major = np.repeat(np.arange(len(pointers) - 1), np.diff(pointers))
    pairs = (major, indices) if desc.layout.tag == LayoutTag.CSR else (indices, major)
    return np.stack(pairs, axis=1).reshape(nnz, 2), values


# ------------------------------------------------------------------------------------
# Addresses and codes
# ------------------------------------------------------------------------------------


def _positions(shape) -> list[np.ndarray]:
    """Per axis, the index of every logical position of ``shape`` (C order)."""
    return list(np.indices(shape, dtype=np.int64)) if shape else []


def _offsets(desc, stored_shape) -> np.ndarray:
    """The linear element offset of every logical position: row- or column-major over
    ``stored_shape`` (the shape, or the padded shape of a block scheme), or the strides."""
    shape = tuple(desc.shape)
    index = _positions(shape)
    tag = desc.layout.tag
    if tag == LayoutTag.STRIDED:
        return sum((i * s for i, s in zip(index, desc.layout.strides)), np.zeros(shape, np.int64))
    if tag not in (LayoutTag.ROW_MAJOR, LayoutTag.COLUMN_MAJOR):
        raise NotImplementedError(f"the reference decodes no {tag.name} layout")
    axes = range(len(shape)) if tag == LayoutTag.ROW_MAJOR else reversed(range(len(shape)))
    offset = np.zeros(shape, np.int64)
    for k in axes:
        offset = offset * stored_shape[k] + index[k]
    return offset


def _element_values(buffer, tag, offsets: np.ndarray, byte_offset: int) -> np.ndarray:
    """The value of element type ``tag`` stored at each linear offset."""
    raw = np.frombuffer(bytes(buffer), np.uint8)
    if tag in DTYPES:
        dtype = np.dtype(DTYPES[tag]).newbyteorder("<")
        at = byte_offset + offsets[..., None] * dtype.itemsize + np.arange(dtype.itemsize)
        return np.ascontiguousarray(raw[at]).view(dtype).reshape(offsets.shape).astype(DTYPES[tag])
    bits = CODE_TYPES[tag][0]
    stream = np.unpackbits(raw, bitorder="little")
    at = byte_offset * 8 + offsets[..., None] * bits + np.arange(bits)
    return code_values((stream[at].astype(np.int64) << np.arange(bits)).sum(axis=-1), tag)


def _values(desc, buffer, stored_shape) -> np.ndarray:
    """Every logical position's stored value (a quantized tensor's code), in logical C order."""
    return _element_values(buffer, desc.type_tag, _offsets(desc, stored_shape), desc.byte_offset)


# ------------------------------------------------------------------------------------
# Quantization
# ------------------------------------------------------------------------------------


def _scalars(buffer, dtype) -> np.ndarray:
    return np.frombuffer(bytes(buffer), np.dtype(dtype).newbyteorder("<"))


def _block_index(shape, axis: int, block: int) -> np.ndarray:
    """``per-block-affine.md § Block Layout``: ``outer * ceil(S / K) + i_axis // K``."""
    index = _positions(shape)
    others = [k for k in range(len(shape)) if k != axis]
    outer = np.zeros(shape, np.int64)
    for k in others:
        outer = outer * shape[k] + index[k]
    return outer * -(-shape[axis] // block) + index[axis] // block


def _dequantized(desc, buffers) -> np.ndarray:
    q = desc.quantization
    shape = tuple(desc.shape)
    stored = list(shape)
    if q.scheme in BLOCK_SCHEMES:
        stored[q.axis] = -(-shape[q.axis] // q.block_size) * q.block_size
    codes = _values(desc, buffers[0], stored)
    if q.scheme == 5:  # MXFP: x = 2^(e - 127) * value(q), float32
        values = codes.astype(np.float32)
        exponents = _scalars(buffers[q.scale_buffer_index], np.uint8).astype(np.int64)
        scales = np.array([math.ldexp(1.0, int(e) - 127) for e in exponents], np.float32)
        return scales[_block_index(shape, q.axis, q.block_size)] * values
    q_int = codes.astype(np.int32)
    if q.scheme == 4:  # NF4: x = absmax[b] * nf4[q], float32
        scales = _scalars(buffers[q.scale_buffer_index], np.float32)
        return scales[_block_index(shape, q.axis, q.block_size)] * NF4_LEVELS[q_int]
    symmetric = bool(int(q.flags) & int(QuantFlag.SYMMETRIC))
    if q.scheme == 1:  # per-tensor: float32(int32(q - z)) * scale
        zero = np.int32(0 if symmetric else q.zero_point)
        return (q_int - zero).astype(np.float32) * np.float32(q.scale)
    scale_dtype = DTYPES[q.scale_type_tag]
    if q.scheme == 2:  # per-channel: channel c = i_axis
        where = _positions(shape)[q.axis]
        count = shape[q.axis]
    else:  # per-block affine
        where = _block_index(shape, q.axis, q.block_size)
        count = int(np.prod([n for k, n in enumerate(shape) if k != q.axis])) * -(-shape[q.axis] // q.block_size)
    scales = _scalars(buffers[q.scale_buffer_index], scale_dtype).astype(np.float32)
    zeros = np.zeros(count, np.int32) if symmetric else _scalars(buffers[q.zero_point_buffer_index], np.int32)
    return ((q_int - zeros[where]).astype(np.float32) * scales[where]).astype(scale_dtype)


# ------------------------------------------------------------------------------------
# Composites
# ------------------------------------------------------------------------------------


def _composite(item) -> np.ndarray:
    head = item.descriptor
    dtype = DTYPES[head.type_tag]
    rule = head.layout.composition_rule
    if rule == CompositionRule.PARTITION:
        return ref_partition(tuple(head.shape), dtype,
                             [(tuple(m.descriptor.shard.shard_offset), reference_array(m)) for m in item.members])
    if rule != CompositionRule.OVERLAY:
        raise NotImplementedError(f"the reference decodes no {rule.name} composite")
    base, *corrections = item.members  # composite.md § Overlay: the base first, corrections in emission order
    assert base.descriptor.composite_member.member_role == MemberRole.BASE
    pieces = []
    for member in corrections:
        assert member.descriptor.composite_member.member_role == MemberRole.CORRECTION
        offset = tuple(member.descriptor.shard.shard_offset)
        if member.descriptor.layout.tag in (LayoutTag.COO, LayoutTag.CSR, LayoutTag.CSC):
            coords, values = sparse_entries(member.descriptor, member.buffers)
            pieces.append(("sparse", offset, coords, values.astype(dtype)))
        else:
            pieces.append(("dense", offset, reference_array(member).astype(dtype)))
    return ref_overlay(reference_array(base).astype(dtype), pieces, CombineOp(head.layout.combine_op))
