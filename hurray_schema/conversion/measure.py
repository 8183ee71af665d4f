"""What a converted tensor is and how far its values moved: its decoded values, its stored bytes,
a short name of its form, and the errors of its values against the input's."""

from __future__ import annotations

import math

import numpy as np

from ..limits import DEFAULT_LIMITS

__all__ = ["value_errors", "decoded", "stored_bytes", "describe"]

DECODE_LIMITS = DEFAULT_LIMITS.evolve(max_evaluation_bytes=1 << 62)
"""Decoding for the output is bounded by the output itself, not by the evaluator's default budget."""


def value_errors(reference: np.ndarray, decoded: np.ndarray) -> tuple[float, float]:
    """(max |out - in|, ||out - in||_F / ||in||_F) in float64; NaNs in the same places count as equal."""
    ref = np.asarray(reference)
    out = np.asarray(decoded)
    if ref.dtype.kind in "biu" and out.dtype.kind in "biu" and np.array_equal(ref, out):
        return 0.0, 0.0  # exactly, also past float64's 2**53
    if ref.dtype.kind == "c" or out.dtype.kind == "c":
        ref, out = ref.astype(np.complex128), out.astype(np.complex128)
    else:
        ref, out = ref.astype(np.float64), out.astype(np.float64)
    diff = out - ref
    both_nan = np.isnan(ref) & np.isnan(out)
    same_inf = np.isinf(ref) & (ref == out)
    diff = np.where(both_nan | same_inf, 0, diff)
    if diff.size == 0:
        return 0.0, 0.0
    max_abs = float(np.max(np.abs(diff)))
    finite_ref = np.where(np.isfinite(ref), ref, 0)
    norm = float(np.linalg.norm(finite_ref.reshape(-1)))
    delta = float(np.linalg.norm(diff.reshape(-1)))
    return max_abs, (delta / norm if norm else (0.0 if delta == 0 else math.inf))


def decoded(item) -> np.ndarray:
    """The values of a Hurray item, decoded without the evaluator's default budget."""
    from ..io.file import item_array

    return item_array(item, limits=DECODE_LIMITS)


def stored_bytes(item) -> int:
    """Bytes a Hurray item stores (a composite: its members')."""
    from ..io import Composite

    if isinstance(item, Composite):
        return sum(stored_bytes(member) for member in item.members)
    return item.stored_nbytes


def describe(item) -> str:
    """A short name of a Hurray item's form: "float32", "int4 per_block_affine", "partition(float32)" ..."""
    from ..io import Composite

    if isinstance(item, Composite):
        head = item.descriptor.type_tag
        kind = item.rule.name.lower()
        return f"{kind}({head.name.lower() if hasattr(head, 'name') else head})"
    desc = item.descriptor
    tag = desc.type_tag
    text = tag.name.lower() if hasattr(tag, "name") else f"0x{int(tag):02X}"
    if desc.quantization is not None:
        scheme = getattr(desc.quantization, "scheme", None)
        text += " " + (type(desc.quantization).__name__ if scheme is None else _scheme_name(scheme))
    return text


def _scheme_name(scheme) -> str:
    from ..model import QuantScheme

    try:
        return QuantScheme(scheme).name.lower()
    except ValueError:
        return f"scheme 0x{int(scheme):02X}"
