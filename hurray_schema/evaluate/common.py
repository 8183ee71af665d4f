"""What every evaluator module shares: buffer views, the evaluated and decoded element
types, shape checks and the evaluation budget.

It sits below :mod:`.tensor`, :mod:`.sparse` and :mod:`.merge` (and imports none of them),
so that a dense decode can hand a sparse tensor to :mod:`.sparse` and a composite merge
can use both without an import cycle.

**Evaluation budget.**  An input can describe far more output than it stores (a sparse
shape of 10**9 elements with three entries, a stride-0 tensor repeating one element).
Before allocating, every evaluation step computes its *cost* (the bytes it is about to
allocate: :func:`hurray_schema.evaluate.tensor.decode_cost` for one tensor, the
composite rules in :mod:`hurray_schema.evaluate.merge`) and the bytes its input *stores*
(:func:`stored_bytes`: the byte sizes of the item's buffers, for a composite of every
leaf's buffers).  :func:`charge` refuses the step with
:class:`~hurray_schema.errors.LimitExceeded` (``limit == "max_evaluation_bytes"``) when
the cost exceeds **both** ``limits.max_evaluation_bytes`` and
:data:`~hurray_schema.limits.EVALUATION_EXPANSION` times the stored bytes: an output the
input is far smaller than.  An output proportional to its input (a dense tensor read
from buffers of its own size) is never refused for its size, however large.
"""

from __future__ import annotations

import math
import operator

import attrs
import numpy as np

from ..errors import DecodedTypeMismatch, HurraySchemaError, LimitExceeded
from ..limits import EVALUATION_EXPANSION, HARD_MAXIMUM, Limits
from ..model import DYNAMIC_DIMENSION, ElementType, LayoutTag
from ..rules.composite import decoded_type as rules_decoded_type
from ..structs.element_types import element_type_info, is_private_type
from . import dense as dense_module
from .elements import UnsupportedEvaluation

__all__ = [
    "DecodedTypeMismatch", "as_bytes", "readonly", "element_type", "decoded_type", "decode_target",
    "as_evaluated", "RAW_CODE_TYPES", "QUANTIZED_DECODE_TYPES", "SPARSE_TAGS", "check_shape",
    "check_representable", "new_array", "charge", "stored_bytes", "tensor_stored_bytes", "NOT_CHARGED",
    "OFFSET_BYTES",
]

SPARSE_TAGS = frozenset({LayoutTag.COO, LayoutTag.CSR, LayoutTag.CSC, LayoutTag.CSF})

QUANTIZED_DECODE_TYPES = frozenset({ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32,
                                    ElementType.FLOAT64})
"""The types a quantized tensor can be asked to decode to (float32 arithmetic, then one rounding
or a widening: :mod:`hurray_schema.evaluate.tensor`)."""


# ------------------------------------------------------------------------------------
# Buffers
# ------------------------------------------------------------------------------------


def as_bytes(buffer) -> np.ndarray:
    """A read-only uint8 view of any buffer-protocol object (memoryview, bytes, ndarray...)."""
    if isinstance(buffer, np.ndarray):
        out = buffer.reshape(-1).view(np.uint8) if buffer.flags.c_contiguous else np.frombuffer(buffer.tobytes(),
                                                                                                np.uint8)
    else:
        mv = memoryview(buffer)
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        out = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, np.uint8)
    out = out.view()
    out.flags.writeable = False  # one kernel signature whatever the buffer's origin
    return out


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view (keeps kernel signatures to one per argument)."""
    v = a.view()
    v.flags.writeable = False
    return v


# ------------------------------------------------------------------------------------
# Element types: as stored, as evaluated, as decoded
# ------------------------------------------------------------------------------------


def element_type(tag, what: str) -> ElementType:
    """``tag`` as an :class:`ElementType`; a tag the table does not assign is not evaluated,
    and an argument that is no integer at all is refused as a requested type."""
    try:
        return ElementType(operator.index(tag))
    except TypeError:
        raise DecodedTypeMismatch(f"{what} must be an ElementType (an integer tag), "
                                  f"not {type(tag).__name__}") from None
    except ValueError:
        raise UnsupportedEvaluation(f"{what} 0x{int(tag):02X} is not an element type this evaluator "
                                    "knows") from None


RAW_CODE_TYPES = {8: ElementType.UINT8, 16: ElementType.UINT16, 32: ElementType.UINT32, 64: ElementType.UINT64}
"""Code width (bits) of a private element type -> the unsigned type its raw codes come back as."""


def as_evaluated(desc):
    """``desc`` with a private element type replaced by the unsigned type of its raw codes.

    A built-in type is returned as it is.  A private tag ``0xF0``-``0xFE`` with an Extension
    Type section of ``bit_width`` 8, 16, 32 or 64 becomes uint8 .. uint64 (the section goes:
    nothing else reads it here); any other width, a private tag without the section, an
    unassigned tag (permissive mode keeps them) or a quantized private storage type raises
    :class:`UnsupportedEvaluation` (``element-types.md § Type Identifier Encoding``,
    ``metadata.md § Extension Type Section``).
    """
    tag = int(desc.type_tag)
    if element_type_info(tag) is not None:
        return desc
    ext = desc.extension_type
    if not is_private_type(tag) or ext is None:
        raise UnsupportedEvaluation(f"element type 0x{tag:02X} is neither built in nor described by an "
                                    "extension type section")
    code_type = RAW_CODE_TYPES.get(int(ext.bit_width))
    if code_type is None:
        raise UnsupportedEvaluation(f"private element type 0x{tag:02X} has {ext.bit_width}-bit codes; only "
                                    f"{sorted(RAW_CODE_TYPES)}-bit codes are returned (as unsigned integers)")
    if desc.quantization is not None:
        raise UnsupportedEvaluation(f"quantized values stored as private element type 0x{tag:02X}")
    return attrs.evolve(desc, type_tag=code_type, extension_type=None)


def decoded_type(desc) -> ElementType:
    """Element type the values of ``desc`` decode to: the rule engine's reading of the spec
    (``rules.composite.decoded_type``: per-channel / per-block affine decode to their scale
    type, the other schemes to float32), float32 for a scheme it does not know."""
    tag = rules_decoded_type(as_evaluated(desc))
    return element_type(tag, "decoded type") if tag is not None else ElementType.FLOAT32


def decode_target(desc, requested) -> ElementType:
    """The type ``desc`` (already :func:`as_evaluated`) is decoded to when ``requested`` (an
    :class:`ElementType` or ``None``) is asked for: its decoded type by default; a quantized
    tensor may ask for any of :data:`QUANTIZED_DECODE_TYPES`, an unquantized one only for its
    own type.  Anything else is a :class:`DecodedTypeMismatch` (an argument check: a composite
    member's type was checked by the binder)."""
    if requested is None:
        if desc.quantization is None and desc.type_tag.__class__ is ElementType:
            return desc.type_tag  # what decoded_type gives an unquantized built-in type, without its lookups
        return decoded_type(desc)
    requested = element_type(requested, "requested type")
    if desc.quantization is not None:
        if requested not in QUANTIZED_DECODE_TYPES:
            raise DecodedTypeMismatch(f"a quantized tensor cannot decode to {requested.name}")
    elif requested != desc.type_tag:
        name = getattr(element_type_info(desc.type_tag), "name", hex(int(desc.type_tag)))
        raise DecodedTypeMismatch(f"values are {name}, not {requested.name}")
    return requested


# ------------------------------------------------------------------------------------
# Shapes
# ------------------------------------------------------------------------------------

_INTP_MAX = np.iinfo(np.intp).max


def check_shape(shape) -> tuple[int, ...]:
    """``shape`` as ints, refused if a dimension is dynamic or the element count is beyond
    ``dense.MAX_ELEMENTS``."""
    shape = tuple(map(int, shape))
    if DYNAMIC_DIMENSION in shape:
        raise HurraySchemaError("a dynamic dimension must be resolved before the tensor is evaluated")
    count = math.prod(shape)
    if count > dense_module.MAX_ELEMENTS:
        raise LimitExceeded("element count", count, dense_module.MAX_ELEMENTS)
    return shape


def check_representable(shape, dtype) -> np.dtype:
    """``dtype`` if NumPy can hold an array of ``shape`` and ``dtype``, else :class:`UnsupportedEvaluation`
    (see :func:`new_array`)."""
    dtype = np.dtype(dtype)
    nonzero, widest = 1, 0
    for n in shape:
        if n:
            nonzero *= n
            widest = max(widest, n)
    if widest > _INTP_MAX or nonzero * dtype.itemsize > _INTP_MAX:
        raise UnsupportedEvaluation(f"NumPy cannot hold a {dtype} array of shape {list(shape)}, even an empty one")
    return dtype


def new_array(shape, dtype, *, zeros: bool = False) -> np.ndarray:
    """A fresh array of ``shape``; an empty one too when NumPy can hold it.

    NumPy refuses any array -- even an empty one -- whose non-zero extents multiplied by the
    item size exceed its index range (float32 ``[0, 2**62]``); such a shape raises
    :class:`UnsupportedEvaluation` instead of NumPy's ``ValueError``.
    """
    dtype = check_representable(shape, dtype)
    return np.zeros(shape, dtype) if zeros else np.empty(shape, dtype)


# ------------------------------------------------------------------------------------
# Evaluation budget (see the module docstring)
# ------------------------------------------------------------------------------------

NOT_CHARGED = Limits(max_evaluation_bytes=HARD_MAXIMUM["max_evaluation_bytes"])
"""Limits under which nothing is refused for its size: an evaluation into a caller's ``out=`` array,
and the parts of an evaluation whose whole was charged already."""

OFFSET_BYTES = np.dtype(np.int64).itemsize
"""Bytes per element of an offset (or parameter index) table."""


def _buffer_bytes(buffer) -> int:
    return buffer.nbytes if isinstance(buffer, (memoryview, np.ndarray)) else memoryview(buffer).nbytes


def stored_bytes(item) -> int:
    """Bytes the input stores for ``item``: the sizes of its buffers (for a tensor a reader
    returns, its buffer handles' ``byte_size``), for a composite (an object with ``members``)
    the sum over every leaf tensor, nested composites included.  The buffers as given are
    measured, not the sizes a descriptor claims."""
    pending, total = [item], 0
    while pending:
        node = pending.pop()
        members = getattr(node, "members", None)
        if members is not None:
            pending.extend(members)
        else:
            total += sum(_buffer_bytes(b) for b in node.buffers)
    return total


def tensor_stored_bytes(buffers) -> int:
    """:func:`stored_bytes` of one tensor given its buffers."""
    return sum(_buffer_bytes(b) for b in buffers)


def charge(cost: int, limits: Limits, *, stored: int) -> None:
    """Refuse, with :class:`LimitExceeded`, an evaluation step that would allocate ``cost`` bytes
    from an input storing ``stored`` bytes, when the cost exceeds both ``limits.max_evaluation_bytes``
    and :data:`~hurray_schema.limits.EVALUATION_EXPANSION` x ``stored`` (module docstring)."""
    if cost > EVALUATION_EXPANSION * stored:
        limits.check("max_evaluation_bytes", cost)
