"""Descriptor decoders compiled per header signature.

The 20-byte fixed header (``metadata.md § Fixed Header``) decides almost everything about
where the rest of a descriptor lies: ``rank`` fixes the shape and the rank-dependent
layout and shard arrays, ``layout_tag`` the layout table, ``flags`` which optional
sections follow, ``descriptor_length`` the total.  Tensors of one stream or file mostly
share a handful of headers.  So once the general decoder of :mod:`hurray_schema.codec`
has read a descriptor cleanly, this package compiles, for that exact header, one
function that unpacks everything after the header with a single :class:`struct.Struct`
and builds the value objects positionally -- the way ``attrs`` and
:func:`collections.namedtuple` generate their methods.

Nothing here is declared a second time: which parts follow in which order, gated by which
flag and built into which class comes from
:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`; the format and the position of
every field from the plans of the declarations
(:meth:`~hurray_schema.structs._declare.Plan.flat_layout`); and the value objects'
constructors take the fields by their spec names.

The few values the header does not fix (``buffer_count``, ``quantization_length``, the
scheme tag and version) are *guards*: the compiled decoder returns ``None`` when one of
them differs from the descriptor it was compiled from, and the caller falls back to the
general decoder, which also does all the error reporting.  A signature is compiled only
from a descriptor that produced no finding, within the limits in use, and only when
re-decoding that same input with the compiled function gives an equal descriptor, and only
the second time its header is seen.

Each compiled header also gets a *checked* decoder (:attr:`CompiledDecoder.checked`): the
same unpacking into locals, then the semantic rules that can fire on that header as one
expression -- each rule's condition (``descriptor_rule(passes=...)``, read with a
:class:`~hurray_schema.rules.descriptor.dispatch.Signature` of what the header fixes) or its
check where it has none.  It returns the descriptor only when every rule passes; otherwise the
general path decodes and reports, so the findings never come from generated code.

Descriptors are immutable values, so a few bounded by-value tables spare repeated work
(:data:`MAX_VALUES` entries each, emptied when full, so hostile input costs one entry per
descriptor): :func:`decode_known` gives the object decoded the first time for the same
exact bytes under a compiled header, and :func:`encode` keeps the bytes of the descriptor
objects it encoded.  :func:`use_value_tables` turns them off (the benchmarks time both).

The tables themselves are the memo's (:data:`hurray_schema.memo.MEMO`, one object the default decoder
owns, reset by one call).  The modules: :mod:`.tables` reads and fills the by-value ones for the codec;
:mod:`.decoders` compiles the decoders per header and decodes through them, :mod:`.encoders`
compiles the encoders per shape and encodes through them;
:mod:`.constructors` generates the positional constructors of the value classes and
:mod:`.formats` the struct formats both compilers share.
"""

from __future__ import annotations

from ..rules.descriptor.dispatch import plain_buffers as plain_buffers  # the plain-handle test the checked decoders use
from .constructors import TWIN_MIN_FIELDS as TWIN_MIN_FIELDS
from .constructors import _twin_of as _twin_of
from .constructors import slot_constructor
from .decoders import CompiledDecoder, compile_decoder, decode_checked, decode_known, lookup, remember
from .decoders import remembered as remembered
from .encoders import MISS, compile_encoder, compiled_encoder, encode, encoder, encoder_key
from .formats import MAX_PACK_ARGUMENTS as MAX_PACK_ARGUMENTS
from .formats import _format_items as _format_items
from .formats import _items as _items
from .formats import _NotCompilable as _NotCompilable
from .formats import _pack_calls as _pack_calls
from .tables import MAX_SHAPES_PER_LAYOUT as MAX_SHAPES_PER_LAYOUT
from .tables import (
    MAX_SIGNATURES, MAX_VALUE_BYTES, MAX_VALUES, accepted, clear, parsed, remember_accepted, remember_parsed,
    use_value_tables,
)

__all__ = ["CompiledDecoder", "compile_decoder", "lookup", "remember", "clear", "MAX_SIGNATURES", "slot_constructor",
           "encoder_key", "compile_encoder", "compiled_encoder", "encoder", "encode", "MISS", "decode_known", "decode_checked", "accepted",
           "remember_accepted", "parsed", "remember_parsed", "MAX_VALUES", "MAX_VALUE_BYTES", "use_value_tables"]
