"""The format as Kaitai Struct schemas (``.ksy``), generated from the wire-table declarations.

:func:`render_ksy` writes three schemas from the same ``construct`` declarations the codec
runs (``hurray_schema/structs/``), never from a copy of the format:

* ``hurray_descriptor.ksy`` -- a descriptor part by part as
  :data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS` lists them: each part a type made
  of its declaration's fields, an optional section gated by its flag bit, the layout-specific
  table switched on ``layout_tag`` (the private range read as the extension table, the tiled
  levels nested as :data:`~hurray_schema.structs.layouts.NESTED_BY` says), the quantization
  scheme switched on ``scheme_tag`` inside the substream its length prefix bounds;
* ``hurray_file.ksy`` -- the file header, the trailer read from the end, the index (each
  entry's descriptor and data reached through its offsets) and the KV section;
* ``hurray_stream.ksy`` -- a bare stream (descriptor, then its buffers) or a message stream
  (message header, payload per message type), told apart by the first bytes; each session
  message's payload is a type made of its table
  (:data:`~hurray_schema.structs.session.SESSION_TABLES`: the hellos, the layout entry with its
  extension fields under ``if:``, requests, PUT, errors, keepalives, RDMA), then the bytes
  after the table.

Every attribute carries the field's ``doc`` and its citation as ``doc-ref`` (a link into
the spec with the citation as its text); tag tables become ``enums``; ``contents`` holds a
magic, ``valid:`` the reserved bytes (zero) and the ranges the declarations state
(:attr:`~hurray_schema.structs._declare.Field.bounds`).  The layout follows the
kaitai_struct_formats conventions (``meta`` first, 2-space indentation, indented
sequences).  ``hurray-schema ksy OUTDIR`` writes them, ``--check`` reports drift.

What a ``.ksy`` does not express stays with the rules (:mod:`hurray_schema.rules`): exact
cover of a composite, buffer sizes against the shape, alignment of offsets, CRCs, the
order of messages.  Kaitai Struct is only a reader of these files; the compiler is a
development tool of the tests, never a dependency of this package.

The modules, one job each:

* :mod:`~hurray_schema.ksy.builder` -- the building blocks: identifiers, expressions, a
  declared field as an attribute, a declared table as a type, enums;
* :mod:`~hurray_schema.ksy.descriptor` -- ``hurray_descriptor.ksy``;
* :mod:`~hurray_schema.ksy.containers` -- ``hurray_file.ksy`` and ``hurray_stream.ksy``;
* :mod:`~hurray_schema.ksy.render` -- :func:`schemas`, the YAML text (:func:`render_ksy`),
  :func:`write_ksy` and :func:`check_ksy`.
"""

from __future__ import annotations

from .builder import GENERATED, KS_VERSION, KSY_FILES, LICENSE, SPEC_URL, ksy_id, spec_link
from .render import check_ksy, render_ksy, schemas, write_ksy
from .render import to_yaml as to_yaml  # public before the split, kept

__all__ = [
    "KSY_FILES", "SPEC_URL", "KS_VERSION", "LICENSE", "GENERATED", "ksy_id", "spec_link", "schemas", "render_ksy",
    "write_ksy", "check_ksy",
]
