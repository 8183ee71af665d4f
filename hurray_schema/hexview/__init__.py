"""Annotated view of Hurray bytes, built from the wire-table declarations.

:func:`annotate` walks a single descriptor, a bare stream, a message stream or a
``.hrry`` file and returns a flat list of :class:`Node` s in byte order: one per section
(with its depth in the tree) and one per field, carrying its absolute byte range, raw
bytes, decoded value, wire type, our description and the spec citation -- all taken from
the ``field(...)`` declarations in :mod:`hurray_schema.structs`, decoded one field at a
time with the same fast plans the codec uses.  :func:`render_tree` and
:func:`render_hex` turn the nodes into text (``hurray-schema inspect`` / ``--hex``).

Every count and length is checked against the bytes that remain before it is used, and a
field that does not fit ends the walk of its section with an ``error`` node instead of an
exception.  It shows what the bytes say; judging them is the job of ``hurray-schema audit``.

The modules, one job each:

* :mod:`~hurray_schema.hexview.nodes` -- :class:`Node`, the field-by-field walker over a
  bounded view, how a value is written (:func:`render_value`);
* :mod:`~hurray_schema.hexview.descriptor` -- one descriptor, part by part as
  :data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` lists them
  (:func:`annotate_descriptor`, :func:`peek_descriptor`, :func:`descriptor_extent`,
  :func:`descriptor_text`);
* :mod:`~hurray_schema.hexview.containers` -- streams, message streams (with the session
  payloads) and files, from the located walks of :mod:`hurray_schema.io.walk`
  (:func:`annotate`, :func:`session_payload_nodes`);
* :mod:`~hurray_schema.hexview.render` -- the nodes as text (:func:`render_tree`,
  :func:`render_hex`, :func:`in_brief`).
"""

from __future__ import annotations

from ..io.walk import detect_kind
from .containers import annotate, session_payload_nodes
from .descriptor import DESCRIPTOR_WALK_ORDER as DESCRIPTOR_WALK_ORDER  # public before the split, kept
from .descriptor import annotate_descriptor, descriptor_extent, descriptor_text, peek_descriptor
from .nodes import OPAQUE_KEEP as OPAQUE_KEEP  # public before the split, kept
from .nodes import Node, render_value
from .render import in_brief, render_hex, render_tree

__all__ = ["Node", "annotate", "annotate_descriptor", "detect_kind", "in_brief", "render_tree", "render_hex",
           "render_value", "session_payload_nodes",
           "descriptor_extent", "descriptor_text", "peek_descriptor"]
