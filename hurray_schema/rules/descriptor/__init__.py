"""Semantic rules of one tensor descriptor, one module per spec area.

Each rule is one reader-side normative statement of ``metadata.md``, the layout pages,
the quantization pages, ``element-types.md``, ``buffer-protocol.md``, ``data-model.md``
or ADR-007 that can be decided from a single decoded descriptor.  The structural rules
(the ones the decoder fires itself) are in :mod:`hurray_schema.rules.structure`.

* :mod:`.core` -- data model and core fields (scalars, dynamic dimensions, flags, byte_offset);
* :mod:`.layouts` -- the layout-specific fields;
* :mod:`.buffers` -- the buffer table, the handles and the byte size of the layout buffers;
* :mod:`.quantization` -- the quantization section;
* :mod:`.sections` -- shard, statistics, extension type and composite member sections;
* :mod:`.composite_head` -- a composite head taken alone;
* :mod:`.dispatch` -- how a rule is declared (``when=``), where a field sits, which rules
  run on a descriptor, :func:`check_descriptor` and :func:`first_error`;
* :mod:`.sizes` -- measures shared by the areas (storage bytes, buffers used).

A rule's registered check is ``check(desc, ctx)`` and yields
:class:`~hurray_schema.rules.engine.Finding` s.  As written in the area modules, a rule
with at most one finding returns ``(message, offset)`` or ``None`` (a plain predicate),
and one with several yields its pairs; :func:`.dispatch.descriptor_rule` takes both, and
each plan of rules is one generated predicate over the checks that apply
(:class:`.dispatch._Plan`), the general loop making the findings whenever it says no.
The findings come in declaration order, which is the order the areas are imported here.

Interpretations (see ``spec-map.md``):

* The ADR-007 zero-byte rule ("the data buffer(s) of an empty tensor have byte size 0")
  is applied to the data buffer of dense layouts (buffer 0) and to the values buffer of
  sparse layouts (buffer 0); index buffers keep their own sizes (a CSR ``row_ptr`` of an
  ``[0, 5]`` matrix still holds one entry).  Morton is exempt: its page always holds
  ``2**sum(morton_bits)`` elements.
* An empty MXFP quantization axis is accepted (ADR-007 § 8 wins over the
  "positive multiple" wording of ``quantization/mxfp.md``); its scale buffer is empty.
* The "only row-major for scalars" rule does not apply to a composite head (which owns
  no data) nor to private/unknown layouts.
"""

from __future__ import annotations

from . import core, layouts, buffers, quantization, sections, composite_head  # noqa: F401,I001  (declaration order)
from .dispatch import (
    ALWAYS, DESCRIPTOR_RULES, DescriptorContext, Fact, When, check_descriptor, descriptor_rule, first_error,
)
from .dispatch import _rules_for  # noqa: F401  (the plan of one descriptor, shown by benchmarks/decode.py)
from .sizes import layout_buffer_count, quantization_buffer_indices, storage_bytes

__all__ = [
    "check_descriptor", "first_error", "DescriptorContext", "DESCRIPTOR_RULES", "storage_bytes",
    "layout_buffer_count", "quantization_buffer_indices", "When", "Fact", "ALWAYS", "descriptor_rule",
]
