"""Resource limits every reader enforces on untrusted input.

A :class:`Limits` value states how large or deep an input this library agrees to
decode.  Every reader (descriptor codec, stream and file readers, audit) takes an
optional ``limits=`` argument; ``None`` means :data:`DEFAULT_LIMITS`.

Two kinds of bound are involved:

* **Spec bounds** -- the rank cap of 64 (``data-model.md § Rank``) and the composite
  nesting depth of 8 (``layouts/composite.md § Binding``).  The spec makes every reader
  reject inputs beyond them, so a caller may *lower* them but never raise them; an input
  beyond the spec bound raises :class:`~hurray_schema.errors.SpecViolation`, an input
  within it but beyond a lowered limit raises :class:`~hurray_schema.errors.LimitExceeded`.
* **Safety bounds** -- sizes and counts the wire lets grow to 2**32 or 2**64 (descriptor
  length, KV and index sections, message payloads, member counts).  The defaults below are
  generous for real models; a caller may lower them, or raise them up to what the wire
  type can express.  A breach raises :class:`~hurray_schema.errors.LimitExceeded`.
  The tiled recursion depth is of this kind too: the spec asks for *a* configured limit
  (8 recommended, ``layouts/tiled.md § Recursive Tiling``) and a breach of the configured
  limit is a :class:`~hurray_schema.errors.SpecViolation`.
* **Evaluation budget** -- ``max_evaluation_bytes`` bounds what one step of the evaluator
  (``Tensor.to_numpy``, sparse densify, ``Composite.materialize`` / ``read``) allocates for
  an output its input is far smaller than: a 153-byte sparse stream can describe a shape
  of 10**9 elements, a stride-0 tensor repeats one element as often as its shape says.
  A step is refused when its cost exceeds the budget *and* :data:`EVALUATION_EXPANSION`
  times the bytes the input stores for the item evaluated (its buffers; a composite's
  leaves' buffers), so a large output read from buffers of comparable size is not refused.
  The evaluator takes ``limits=`` itself (an item does not remember the limits it was
  read with).  The cost is compared *before* anything is allocated (the exact rule is in
  :mod:`hurray_schema.evaluate.common`); a breach raises
  :class:`~hurray_schema.errors.LimitExceeded` naming ``max_evaluation_bytes``.  There
  is no wire field behind it, so a caller may raise it up to 2**64 - 1.  Evaluating into
  a caller-allocated ``out=`` array is not charged.

Independently of the limits, every count read from the input is checked against the
bytes that remain before anything is allocated for it, so memory stays bounded by a
small multiple of the input's size even with the largest limits.
"""

from __future__ import annotations

from typing import Optional

import attrs

from .errors import LimitExceeded
from .structs.descriptor import MAX_RANK
from .structs.layouts import MAX_TILED_DEPTH

__all__ = ["Limits", "DEFAULT_LIMITS", "HARD_MAXIMUM", "MAX_COMPOSITE_DEPTH", "EVALUATION_EXPANSION",
           "DEFAULT_MAX_MESSAGE_BYTES", "resolve_limits"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

MAX_COMPOSITE_DEPTH = 8
"""Deepest composite nesting the spec lets a reader accept, a head counting as one level
(``layouts/composite.md § Binding``); the binder, the evaluator and the limits use this one value."""

EVALUATION_EXPANSION = 64
"""How many times the bytes an item stores its evaluation may allocate before the evaluation
budget applies (``max_evaluation_bytes``): beyond both, the output is one the input is far
smaller than, and it is refused (see the module docstring)."""

DEFAULT_MAX_MESSAGE_BYTES = 64 * MiB
"""The largest interchange payload accepted unless told otherwise: a reader's
``max_message_bytes`` and the ``max_message_size`` a server advertises (``--max-message-bytes``)."""

U8, U16, U32, U64 = (1 << 8) - 1, (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1

HARD_MAXIMUM = {
    "max_descriptor_bytes": U32,  # descriptor_length is a uint32 (metadata.md § Fixed Header)
    "max_rank": MAX_RANK,  # normative cap (data-model.md § Rank)
    "max_buffer_count": U8,  # buffer_count is a uint8 (metadata.md § Buffer Table)
    "max_composite_depth": MAX_COMPOSITE_DEPTH,  # normative (layouts/composite.md § Binding)
    "max_tiled_depth": 64,  # our recursion guard; the spec leaves the limit to the reader
    "max_composite_members": U32 - 1,  # member_count uint32, 0xFFFFFFFF reserved (layouts/composite.md)
    "max_buffer_bytes": U64,  # byte_size is a uint64 (buffer-protocol.md § Buffer Handle)
    "max_kv_bytes": U32,  # kv_length is a uint32 (file-format.md § Trailer)
    "max_kv_entries": U32,  # kv_count is a uint32 (file-format.md § KV Section Encoding)
    "max_kv_value_bytes": U32,  # string / bytes length prefix is a uint32 (file-format.md § KV Value Types)
    "max_index_bytes": U64,  # index_length is a uint64 (file-format.md § Trailer)
    "max_index_entries": U64,  # index_entry_count is a uint64 (file-format.md § Index Encoding)
    "max_message_bytes": U32,  # payload_length is a uint32 (interchange.md § Message Framing)
    "max_stream_tensors": U64,  # a stream has no count of its own
    "max_evaluation_bytes": U64,  # no wire field: bounded only by the memory of the caller's machine
}
"""The largest value each limit may be raised to: the spec's cap or the wire type's range."""


def _bounded(instance, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
    hard = HARD_MAXIMUM[attribute.name]
    if not 0 <= value <= hard:
        raise ValueError(f"{attribute.name} must be between 0 and {hard}, got {value}")


def _limit(default: int, doc: str):
    return attrs.field(default=default, validator=_bounded, metadata={"doc": doc})


@attrs.frozen(slots=True)
class Limits:
    """How large an untrusted input a reader accepts (see the module docstring).

    Build a stricter or looser set with ``Limits(max_rank=8)`` or
    ``DEFAULT_LIMITS.evolve(max_kv_bytes=1 << 30)``; a value outside
    ``0 .. HARD_MAXIMUM[name]`` raises ``ValueError`` at construction.
    """

    max_descriptor_bytes: int = _limit(16 * MiB, "Largest descriptor_length accepted (a descriptor is "
                                                 "read whole before decoding).")
    max_rank: int = _limit(MAX_RANK, f"Largest rank accepted; the spec cap ({MAX_RANK}) can only be lowered.")
    max_buffer_count: int = _limit(U8, "Largest buffer_count accepted (uint8 on the wire).")
    max_composite_depth: int = _limit(MAX_COMPOSITE_DEPTH, "Deepest composite nesting accepted (a head is depth 1); "
                                         f"the spec's {MAX_COMPOSITE_DEPTH} can only be lowered.")
    max_tiled_depth: int = _limit(MAX_TILED_DEPTH, "Deepest tiled recursion accepted (the outer tiled level is 1); "
                                     f"the spec recommends {MAX_TILED_DEPTH}.")
    max_composite_members: int = _limit(1 << 20, "Largest member_count of a composite head accepted.")
    max_buffer_bytes: int = _limit(U64, "Largest single buffer byte_size a stream reader reads "
                                        "(it is always also checked against the input that remains).")
    max_kv_bytes: int = _limit(64 * MiB, "Largest KV metadata section (kv_length) of a file.")
    max_kv_entries: int = _limit(1 << 16, "Largest kv_count of a file.")
    max_kv_value_bytes: int = _limit(16 * MiB, "Largest string or bytes KV value (and array element count).")
    max_index_bytes: int = _limit(256 * MiB, "Largest index section (index_length) of a file.")
    max_index_entries: int = _limit(1 << 20, "Largest index_entry_count of a file.")
    max_message_bytes: int = _limit(DEFAULT_MAX_MESSAGE_BYTES, "Largest interchange message payload_length accepted.")
    max_stream_tensors: int = _limit(U64, "Most top-level tensors read from one stream.")
    max_evaluation_bytes: int = _limit(256 * MiB, "Most bytes one evaluation step allocates (its output plus the "
                                                  "per-element tables it builds: to_numpy, densify, materialize, "
                                                  "read) beyond EVALUATION_EXPANSION x the bytes its input "
                                                  "stores; nothing is charged with out=.")

    def evolve(self, **changes) -> "Limits":
        """A copy with some limits changed (validated like the constructor)."""
        return attrs.evolve(self, **changes)

    def check(self, name: str, value: int, offset: Optional[int] = None) -> int:
        """``value`` if within limit ``name``, else raise :class:`LimitExceeded`."""
        maximum = getattr(self, name)
        if value > maximum:
            raise LimitExceeded(name, value, maximum, offset)
        return value


DEFAULT_LIMITS = Limits()
"""The limits readers apply when none are given."""


def resolve_limits(limits: Optional[Limits]) -> Limits:
    """``limits`` or :data:`DEFAULT_LIMITS`; anything else is a ``TypeError``."""
    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a hurray_schema.Limits, not {type(limits).__name__}")
    return limits
