"""Streaming (non-temporal) copy of a member's bytes into its box of a large output.

Assembling a partition is a copy per member.  For a box of a few megabytes the C
library's ``memcpy`` uses ordinary stores, which first read every destination line into
the cache; only very large copies switch to non-temporal stores.  A partition of many
mid-sized members therefore moves about 1.5x the bytes of one big copy.  This module
writes the destination with 32-byte non-temporal vector stores (LLVM ``!nontemporal``),
so a partition of N members costs about one output-sized copy.  Small copies keep
``np.copyto`` (their destination is better left in the cache).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

STREAMING_MIN_BYTES = 1 << 20
"""Below this many bytes a copy goes through ``np.copyto``."""

_VECTOR = 32  # bytes per non-temporal store


@intrinsic
def _stream_store32(typingctx, dst, r, dc, src, sc):
    """Copy 32 bytes ``src[r, sc:sc+32]`` to ``dst[r, dc:dc+32]``; the destination must be 32-byte aligned."""

    def codegen(context, builder, sig, args):
        dty, _, _, sty, _ = sig.args
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[3])
        dp = cgutils.get_item_pointer(context, builder, dty, d, [args[1], args[2]], wraparound=False,
                                      boundscheck=False)
        sp = cgutils.get_item_pointer(context, builder, sty, s, [args[1], args[4]], wraparound=False,
                                      boundscheck=False)
        vec = ir.VectorType(ir.IntType(8), _VECTOR)
        value = builder.load(builder.bitcast(sp, vec.as_pointer()), align=1)
        store = builder.store(value, builder.bitcast(dp, vec.as_pointer()), align=_VECTOR)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(dst, r, dc, src, sc), codegen


@intrinsic
def _store_fence(typingctx):
    """Order the non-temporal stores before anything that follows (they are weakly ordered)."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, nogil=True)
def _stream_rows(dst, src):
    """``dst[r, :] = src[r, :]`` for byte matrices; ``dst`` rows may be strided, ``src`` is C-contiguous."""
    rows, width = src.shape
    for r in range(rows):
        address = dst.ctypes.data + r * dst.strides[0]
        c = 0
        while c < width and (address + c) % _VECTOR:
            dst[r, c] = src[r, c]
            c += 1
        while c + 4 * _VECTOR <= width:  # a whole 128-byte run per turn keeps write-combining lines full
            _stream_store32(dst, r, c, src, c)
            _stream_store32(dst, r, c + _VECTOR, src, c + _VECTOR)
            _stream_store32(dst, r, c + 2 * _VECTOR, src, c + 2 * _VECTOR)
            _stream_store32(dst, r, c + 3 * _VECTOR, src, c + 3 * _VECTOR)
            c += 4 * _VECTOR
        while c + _VECTOR <= width:
            _stream_store32(dst, r, c, src, c)
            c += _VECTOR
        while c < width:
            dst[r, c] = src[r, c]
            c += 1
    _store_fence()


def _byte_rows(a: np.ndarray):
    """``a`` as a 2-D uint8 matrix of its last-axis rows, a view (never a copy), or None."""
    if a.ndim == 0 or a.strides[-1] != a.itemsize:
        return None
    b = a.view(np.uint8)
    if b.ndim == 1:
        return b[None, :]
    for k in range(b.ndim - 2):  # the leading axes collapse into one row axis only if they nest evenly
        if b.strides[k] != b.strides[k + 1] * b.shape[k + 1]:
            return None
    rows = int(np.prod(b.shape[:-1]))
    return np.lib.stride_tricks.as_strided(b, (rows, b.shape[-1]), (b.strides[-2], 1))


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``, streaming the stores when the copy is large.

    Streams when both arrays have the same dtype and shape, ``src`` is C-contiguous, the
    rows of ``dst`` are contiguous along the last axis and the copy is at least
    :data:`STREAMING_MIN_BYTES`; otherwise it is ``np.copyto``.
    """
    if src.nbytes < STREAMING_MIN_BYTES or src.shape != dst.shape or src.dtype != dst.dtype \
            or not src.flags.c_contiguous or not dst.flags.writeable:
        np.copyto(dst, src)
        return
    d, s = _byte_rows(dst), _byte_rows(src)
    if d is None or s is None:
        np.copyto(dst, src)
        return
    _stream_rows(d, s)
