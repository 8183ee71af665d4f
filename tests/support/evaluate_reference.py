"""Test fixtures and the vectorized NumPy reference semantics of the evaluator.

Nothing here calls ``hurray_schema.evaluate``: fixtures are built from descriptors
(``hurray_schema.model``) and NumPy byte buffers, and every expected array is computed by
whole-array NumPy operations written to read like the spec (``layouts/composite.md
§ Composition Semantics``, ``quantization/per-block-affine.md § Dequantization Formula``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from hurray_schema.model import (BufferHandle, ColumnMajorLayout, CombineOp, CompositeLayout, CompositeMember,
                                 CompositionRule, CooLayout, CsrLayout, ElementType, MemberRole, PerBlockAffine,
                                 RowMajorLayout, Shard, StridedLayout, TensorDescriptor)

E = ElementType
DTYPES = {E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16, E.FLOAT32: np.float32, E.FLOAT64: np.float64,
          E.INT8: np.int8, E.UINT8: np.uint8, E.INT16: np.int16, E.INT32: np.int32, E.INT64: np.int64,
          E.UINT16: np.uint16, E.UINT32: np.uint32, E.UINT64: np.uint64}


@dataclass
class T:
    """A member tensor: descriptor + buffers (what ``hurray_schema.io.Tensor`` provides)."""

    descriptor: TensorDescriptor
    buffers: list = field(default_factory=list)


@dataclass
class C:
    """A composite: head descriptor + members."""

    descriptor: TensorDescriptor
    members: list = field(default_factory=list)


def handles(buffers):
    return tuple(BufferHandle(len(b)) for b in buffers)


def described(tag, shape, buffers, layout=None, *, quantization=None, byte_offset=0):
    """``(descriptor, buffers)`` of a tensor stored in ``buffers`` (bytes, or arrays taken as their
    bytes in C order), one handle each of its length; row-major unless ``layout`` is given."""
    bufs = [np.frombuffer(bytes(b) if isinstance(b, (bytes, bytearray, memoryview)) else
                          np.ascontiguousarray(b).tobytes(), np.uint8) for b in buffers]
    desc = TensorDescriptor(tag, shape, layout or RowMajorLayout(), handles(bufs), byte_offset=byte_offset,
                            quantization=quantization)
    return desc, [memoryview(b) for b in bufs]


def member_sections(shape, shard_offset, parent_shape, role):
    kw = {}
    if shard_offset is not None:
        kw["shard"] = Shard(parent_shape, shard_offset)
    if role is not None:
        kw["composite_member"] = CompositeMember(role)
    return kw


def dense_tensor(arr, tag, layout="row", shard_offset=None, parent_shape=None, role=None) -> T:
    """Encode the logical array ``arr`` in a dense layout: row, col, or strided_rev (every axis reversed,
    negative strides) or strided_bcast (a zero stride on axis 0 when arr is constant along it)."""
    arr = np.asarray(arr, DTYPES[tag])
    shape = arr.shape
    byte_offset = 0
    if layout == "row":
        lay, data = RowMajorLayout(), arr.tobytes(order="C")
    elif layout == "col":
        lay, data = ColumnMajorLayout(), arr.tobytes(order="F")
    elif layout == "strided_rev":
        rev = arr[tuple(slice(None, None, -1) for _ in shape)]
        data = rev.tobytes(order="C")
        rm = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
        lay = StridedLayout([-s for s in rm])
        byte_offset = (arr.size - 1) * arr.itemsize if arr.size else 0
    elif layout == "strided_bcast":
        row = arr[:1]
        data = (b"\0" * 8) + row.tobytes(order="C")
        rm = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
        lay = StridedLayout([0] + rm[1:])
        byte_offset = 8
    else:
        raise ValueError(layout)
    bufs = [np.frombuffer(data, np.uint8)]
    d = TensorDescriptor(tag, shape, lay, handles(bufs), byte_offset=byte_offset,
                         **member_sections(shape, shard_offset, parent_shape, role))
    return T(d, [memoryview(b) for b in bufs])


def coo_tensor(coords, values, shape, tag, sorted_=True, shard_offset=None, parent_shape=None, role=None) -> T:
    coords = np.asarray(coords, np.uint64).reshape(-1, len(shape))
    values = np.asarray(values, DTYPES[tag])
    bufs = [np.frombuffer(values.tobytes(), np.uint8), np.frombuffer(coords.tobytes(), np.uint8)]
    d = TensorDescriptor(tag, shape, CooLayout(len(values), 1 if sorted_ else 0), handles(bufs),
                         **member_sections(shape, shard_offset, parent_shape, role))
    return T(d, [memoryview(b) for b in bufs])


def csr_tensor(dense, tag, shard_offset=None, parent_shape=None, role=None) -> T:
    dense = np.asarray(dense, DTYPES[tag])
    rows, cols = np.nonzero(dense != 0)
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))]).astype(np.uint64)
    bufs = [np.frombuffer(dense[rows, cols].tobytes(), np.uint8), np.frombuffer(cols.astype(np.uint64).tobytes(),
                                                                                np.uint8),
            np.frombuffer(row_ptr.tobytes(), np.uint8)]
    d = TensorDescriptor(tag, dense.shape, CsrLayout(len(rows)), handles(bufs),
                         **member_sections(dense.shape, shard_offset, parent_shape, role))
    return T(d, [memoryview(b) for b in bufs])


def head(shape, tag, rule, n, combine=CombineOp.NONE, shard_offset=None, parent_shape=None):
    kw = {"shard": Shard(parent_shape, shard_offset)} if shard_offset is not None else {}
    return TensorDescriptor(tag, shape, CompositeLayout(rule, n, combine), (), **kw)


# ------------------------------------------------------------------------------------
# Reference semantics (vectorized NumPy)
# ------------------------------------------------------------------------------------


def ref_partition(shape, dtype, parts):
    """parts: [(shard_offset, logical array)] -> the assembled array."""
    out = np.zeros(shape, dtype)
    filled = np.zeros(shape, np.int64)
    for off, arr in parts:
        box = tuple(slice(o, o + n) for o, n in zip(off, arr.shape))
        out[box] = arr
        filled[box] += 1
    assert np.all(filled == 1), "reference partition must be exact"
    return out


def ref_overlay(base, corrections, combine):
    """Base, then corrections in emission order: ("dense", offset, arr) or ("sparse", offset, coords, values).

    Replace: the correction's values overwrite its box / stored indices.  Add: out = out + values,
    in the head's dtype (NumPy float16 / ml_dtypes bfloat16 arithmetic rounds every addition).
    """
    out = np.array(base, copy=True)
    for corr in corrections:
        if corr[0] == "dense":
            _, off, arr = corr
            box = tuple(slice(o, o + n) for o, n in zip(off, arr.shape))
            out[box] = arr if combine == CombineOp.REPLACE else out[box] + arr
        else:
            _, off, coords, values = corr
            idx = tuple((np.asarray(coords, np.int64) + np.asarray(off, np.int64)).T)
            out[idx] = values if combine == CombineOp.REPLACE else out[idx] + values
    return out


def ref_unpack_int4(packed: np.ndarray, count: int, signed: bool) -> np.ndarray:
    """LSB-first nibbles: element 2k in the low nibble of byte k (element-types.md § 4-bit packing)."""
    nib = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(-1)[:count].astype(np.int32)
    return np.where(nib >= 8, nib - 16, nib) if signed else nib


def ref_block_affine(codes_padded: np.ndarray, scales, zps, block, dtype):
    """Per-block affine along the last axis of a 2-D padded code matrix (rows, nb * block):
    x = float32(int32(q - z)) * s, then rounded once to ``dtype``; padding columns dropped."""
    rows, padded = codes_padded.shape
    nb = padded // block
    q = codes_padded.reshape(rows, nb, block).astype(np.int32)
    z = np.asarray(zps, np.int32).reshape(rows, nb, 1)
    s = np.asarray(scales, np.float32).reshape(rows, nb, 1)
    x = (q - z).astype(np.float32) * s
    return x.reshape(rows, padded).astype(dtype)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    c = (np.asarray(codes).reshape(-1) & 0x0F).astype(np.uint8)
    if c.size % 2:
        c = np.concatenate([c, np.zeros(1, np.uint8)])
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def block_affine_int4_tensor(rows, cols, block, rng, scale_tag=E.FLOAT32, shard_offset=None, parent_shape=None,
                             role=None, out_dtype=np.float16):
    """A row-major int4 per-block-affine [rows, cols] tensor (axis 1, partial trailing block when
    cols % block) and its reference dequantized values in ``out_dtype``."""
    nb = -(-cols // block)
    padded = nb * block
    codes = rng.integers(-8, 8, size=(rows, padded), dtype=np.int8)
    codes[:, cols:] = 0  # padding elements are zero (per-block-affine.md § Padding)
    sdt = {E.FLOAT32: np.float32, E.FLOAT16: np.float16, E.BFLOAT16: ml_dtypes.bfloat16}[scale_tag]
    scales = (rng.random((rows, nb), np.float32) * 0.02 + 0.001).astype(sdt)
    zps = rng.integers(-3, 4, size=(rows, nb), dtype=np.int32)
    data = pack_int4(codes)
    bufs = [data, np.frombuffer(scales.tobytes(), np.uint8), np.frombuffer(zps.tobytes(), np.uint8)]
    q = PerBlockAffine(axis=1, block_size=block, scale_buffer_index=1, zero_point_buffer_index=2,
                       scale_type_tag=scale_tag)
    d = TensorDescriptor(E.INT4, (rows, cols), RowMajorLayout(), handles(bufs), quantization=q,
                         **member_sections((rows, cols), shard_offset, parent_shape, role))
    ref = ref_block_affine(ref_unpack_int4(data, rows * padded, True).reshape(rows, padded),
                           scales.astype(np.float32), zps, block, out_dtype)[:, :cols]
    return T(d, [memoryview(b) for b in bufs]), ref


def spqr(n=4096, density=0.01, combine=CombineOp.REPLACE, seed=0, block=64):
    """The seed's SpQR overlay at [n, n]: int4 per-block-affine base decoding to float16 plus a sorted
    float16 COO correction; returns (composite, pieces for the reference)."""
    rng = np.random.default_rng(seed)
    shape = (n, n)
    base, base_ref = block_affine_int4_tensor(n, n, block, rng, scale_tag=E.FLOAT16, shard_offset=(0, 0),
                                              parent_shape=shape, role=MemberRole.BASE)
    nnz = int(n * n * density)
    lin = np.sort(rng.choice(n * n, size=nnz, replace=False))
    coords = np.stack([lin // n, lin % n], axis=1)
    vals = (rng.standard_normal(nnz) * 0.5).astype(np.float16)
    corr = coo_tensor(coords, vals, shape, E.FLOAT16, True, (0, 0), shape, MemberRole.CORRECTION)
    comp = C(head(shape, E.FLOAT16, CompositionRule.OVERLAY, 2, combine), [base, corr])
    return comp, base_ref, [("sparse", (0, 0), coords, vals)]


def grid_partition(n, parts_per_side, tag=E.FLOAT32, seed=0):
    """[n, n] partition into parts_per_side**2 equal row-major members; returns (composite, parts)."""
    rng = np.random.default_rng(seed)
    shape = (n, n)
    step = n // parts_per_side
    members, parts = [], []
    for i in range(parts_per_side):
        for j in range(parts_per_side):
            arr = rng.standard_normal((step, step)).astype(DTYPES[tag])
            members.append(dense_tensor(arr, tag, "row", (i * step, j * step), shape))
            parts.append(((i * step, j * step), arr))
    return C(head(shape, tag, CompositionRule.PARTITION, len(members)), members), parts


def band_partition(n, parts, tag=E.FLOAT32, seed=0):
    """[n, n] partition into ``parts`` full-width row bands (each member's box is contiguous in the output)."""
    rng = np.random.default_rng(seed)
    shape = (n, n)
    step = n // parts
    members, result = [], []
    for i in range(parts):
        arr = rng.standard_normal((step, n)).astype(DTYPES[tag])
        members.append(dense_tensor(arr, tag, "row", (i * step, 0), shape))
        result.append(((i * step, 0), arr))
    return C(head(shape, tag, CompositionRule.PARTITION, len(members)), members), result


def bits_equal(a, b) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
