"""Quantization section: framing, 4-byte header and the payload of each scheme.

Spec: ``metadata.md § Quantization Section`` (the ``quantization_length`` prefix),
``quantization.md § Descriptor Header`` and the Binary Encoding table of each
``quantization/*.md`` page.  Each scheme table below starts with the shared header
fields, so a table reads exactly like its spec page.
"""

from __future__ import annotations

from construct import Bytes, Float32l, Int8ul, Int16ul, Int32sl, Int32ul, Struct

from ._declare import ZERO, Field, Valid, field
from .tags import ElementType, QuantFlag, QuantScheme

SECTION_REF = "metadata.md § Quantization Section"
HEADER_REF = "quantization.md § Descriptor Header"

QUANTIZATION_LENGTH = Struct(
    field("quantization_length", Int32ul, "Bytes of quantization descriptor that follow.", SECTION_REF,
          valid=Valid(size_of="the quantization section after this field")),
)

QUANTIZATION_HEADER = Struct(
    field("scheme_tag", Int8ul, "Which quantization scheme the payload encodes.", HEADER_REF,
          tags=QuantScheme),
    field("scheme_version", Int8ul, "Version of that scheme's encoding; 0x01 for every scheme here.", HEADER_REF),
    field("flags", Int16ul, "Scheme-specific flags; undefined bits must be 0.", HEADER_REF),
)
"""The 4 bytes every quantization descriptor starts with."""


SCHEME_PAGES = {
    QuantScheme.PER_TENSOR_AFFINE: "per-tensor-affine",
    QuantScheme.PER_CHANNEL_AFFINE: "per-channel-affine",
    QuantScheme.PER_BLOCK_AFFINE: "per-block-affine",
    QuantScheme.NF4: "nf4",
    QuantScheme.MXFP: "mxfp",
}
"""Scheme tag → the name of its page under ``quantization/``."""


def _scheme(page: str, *payload, flag_tags=None):
    """``payload`` entries are ``(name, construct, doc)``, ``(name, construct, doc, tags)`` or
    ``(name, construct, doc, valid)``;
    ``flag_tags`` is the tag table of the header's scheme-specific ``flags``."""
    ref = f"quantization/{page}.md § Binary Encoding"
    head = [field(sub.name, sub.subcon, sub.doc, ref, flag_tags if sub.name == "flags" else sub.tags)
            for sub in QUANTIZATION_HEADER.subcons]
    return Struct(*head, *[_payload_field(ref, *entry) for entry in payload])


def _payload_field(ref: str, name: str, sub, doc: str, extra=None) -> Field:
    """One payload field of a scheme; ``extra`` is its tag table or its constraint (:class:`Valid`)."""
    if isinstance(extra, Valid):
        return Field(name, sub, doc, ref, None, extra)
    return field(name, sub, doc, ref, extra)


_POWER_OF_TWO = Valid(power_of_two=True)
"""A block size's constraint (its range per scheme is :data:`BLOCK_SIZE_BOUNDS`)."""

PER_TENSOR_AFFINE = _scheme(
    SCHEME_PAGES[QuantScheme.PER_TENSOR_AFFINE],
    ("scale", Float32l, "Dequantization scale; finite and non-zero."),
    ("zero_point", Int32sl, "Zero point; 0 for symmetric quantization."),
    ("_reserved", Bytes(4), "Must be 0x00.", ZERO),
)

PER_CHANNEL_AFFINE = _scheme(
    SCHEME_PAGES[QuantScheme.PER_CHANNEL_AFFINE],
    ("axis", Int32ul, "Quantized axis, < rank."),
    ("scale_buffer_index", Int32ul, "Buffer holding shape[axis] float32 scales."),
    ("zero_point_buffer_index", Int32ul, "Buffer holding shape[axis] int32 zero points; 0xFFFFFFFF when symmetric."),
    ("scale_type_tag", Int8ul, "Scale element type; 0x03 (float32) in version 1.", ElementType),
    ("_reserved", Bytes(3), "Must be 0x00.", ZERO),
    flag_tags=QuantFlag,
)

PER_BLOCK_AFFINE = _scheme(
    SCHEME_PAGES[QuantScheme.PER_BLOCK_AFFINE],
    ("axis", Int32ul, "Axis cut into blocks, < rank."),
    ("block_size", Int32ul, "Logical elements per block; a power of two >= 2.", _POWER_OF_TWO),
    ("scale_buffer_index", Int32ul, "Buffer holding one scale per block."),
    ("zero_point_buffer_index", Int32ul, "Buffer holding one int32 zero point per block; 0xFFFFFFFF when symmetric."),
    ("scale_type_tag", Int8ul, "Scale element type: 0x01 float16, 0x02 bfloat16 or 0x03 float32.", ElementType),
    ("_reserved", Bytes(3), "Must be 0x00.", ZERO),
    flag_tags=QuantFlag,
)

NF4 = _scheme(
    SCHEME_PAGES[QuantScheme.NF4],
    ("axis", Int32ul, "Axis cut into blocks, < rank."),
    ("block_size", Int32ul, "Logical elements per block; a power of two >= 8.", _POWER_OF_TWO),
    ("scale_buffer_index", Int32ul, "Buffer holding one float32 absmax per block."),
)

MXFP = _scheme(
    SCHEME_PAGES[QuantScheme.MXFP],
    ("axis", Int32ul, "Axis cut into microscaling blocks, < rank."),
    ("block_size", Int32ul, "Elements per block; a power of two in [16, 2048].", _POWER_OF_TWO),
    ("scale_buffer_index", Int32ul, "Buffer holding one float8_e8m0 scale per block."),
)

SCHEMES = {
    QuantScheme.PER_TENSOR_AFFINE: PER_TENSOR_AFFINE,
    QuantScheme.PER_CHANNEL_AFFINE: PER_CHANNEL_AFFINE,
    QuantScheme.PER_BLOCK_AFFINE: PER_BLOCK_AFFINE,
    QuantScheme.NF4: NF4,
    QuantScheme.MXFP: MXFP,
}
"""Scheme tag → its full table (header included)."""

HIGHEST_SCHEME_VERSION = {scheme: 1 for scheme in SCHEMES}
"""Highest ``scheme_version`` this specification defines per scheme (``quantization.md § Version Compatibility``)."""

# ------------------------------------------------------------------------------------
# What each scheme accepts and references, beside its wire table
# ------------------------------------------------------------------------------------

_AFFINE_STORAGE = frozenset({ElementType.INT8, ElementType.UINT8, ElementType.INT16, ElementType.UINT16, ElementType.INT32, ElementType.UINT32,
                             ElementType.INT4, ElementType.UINT4, ElementType.INT2, ElementType.UINT2})

STORAGE_TYPES = {
    QuantScheme.PER_TENSOR_AFFINE: _AFFINE_STORAGE,
    QuantScheme.PER_CHANNEL_AFFINE: _AFFINE_STORAGE,
    QuantScheme.PER_BLOCK_AFFINE: frozenset({ElementType.INT8, ElementType.UINT8, ElementType.INT4, ElementType.UINT4, ElementType.INT2, ElementType.UINT2}),
    QuantScheme.NF4: frozenset({ElementType.UINT4}),
    QuantScheme.MXFP: frozenset({ElementType.FLOAT8_E4M3, ElementType.FLOAT8_E5M2, ElementType.FLOAT4_E2M1, ElementType.FLOAT6_E2M3, ElementType.FLOAT6_E3M2,
                                 ElementType.INT8, ElementType.INT4}),
}
"""Scheme tag → the storage ``type_tag`` values it quantizes (``quantization/<page>.md § Valid Storage Types``)."""

DEFINED_FLAGS = {
    QuantScheme.PER_TENSOR_AFFINE: 0,
    QuantScheme.PER_CHANNEL_AFFINE: int(QuantFlag.SYMMETRIC),
    QuantScheme.PER_BLOCK_AFFINE: int(QuantFlag.SYMMETRIC),
    QuantScheme.NF4: 0,
    QuantScheme.MXFP: 0,
}
"""Scheme tag → the quantization flag bits it defines; every other bit is 0 (``quantization.md § Descriptor Header``)."""

SCALE_TYPES = {
    QuantScheme.PER_CHANNEL_AFFINE: (ElementType.FLOAT32,),
    QuantScheme.PER_BLOCK_AFFINE: (ElementType.FLOAT16, ElementType.BFLOAT16, ElementType.FLOAT32),
}
"""Scheme tag → the ``scale_type_tag`` values it accepts (``quantization/<page>.md § Validity Constraints``)."""

BLOCK_SIZE_BOUNDS = {
    QuantScheme.PER_BLOCK_AFFINE: (2, None),
    QuantScheme.NF4: (8, None),
    QuantScheme.MXFP: (16, 2048),
}
"""Scheme tag → ``(lowest, highest or None)`` power of two its ``block_size`` may be
(``quantization/<page>.md § Validity Constraints``); the keys are the block schemes."""

SCALE_BUFFER_TYPES = {
    QuantScheme.PER_CHANNEL_AFFINE: ElementType.FLOAT32,
    QuantScheme.PER_BLOCK_AFFINE: None,
    QuantScheme.NF4: ElementType.FLOAT32,
    QuantScheme.MXFP: ElementType.FLOAT8_E8M0,
}
"""Scheme tag → element type of the scale buffer ``scale_buffer_index`` names: one scale per
channel (per-channel affine) or per block (the others); ``None``: the descriptor's
``scale_type_tag`` says (``quantization/<page>.md § Referenced Buffers``).  The keys are the
schemes with an ``axis`` and a scale buffer."""

ZERO_POINT_BUFFER_TYPES = {
    QuantScheme.PER_CHANNEL_AFFINE: ElementType.INT32,
    QuantScheme.PER_BLOCK_AFFINE: ElementType.INT32,
}
"""Scheme tag → element type of the zero-point buffer ``zero_point_buffer_index`` names,
one per scale; not referenced when the SYMMETRIC flag is set (``quantization/<page>.md § Referenced Buffers``)."""

NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
"""The 16 fixed NF4 levels, indexed by the stored 4-bit code (``quantization/nf4.md § Lookup Table``)."""
