"""Format documentation generated from the wire-table declarations.

Every page under ``docs/format/`` is written by :func:`write_docs` from the same
``construct`` declarations the codec runs (``hurray_schema/structs/``): their fields,
the tag table attached to each field, the descriptor's parts
(:data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`), and the rule registry, so
the documentation cannot drift from the code: a test regenerates the pages and compares
them with the committed ones.

* one page per ``structs`` module (one spec area), with a table per declared struct:
  offset inside the table (a formula in ``rank`` where the size of an earlier field
  depends on it), offset inside the descriptor where that is fixed, field, wire type in
  the spec's vocabulary (``uint32``, ``uint8[2]``, ``uint64[rank]``), our one-line
  description and the spec citation;
* ``session.md`` also lists each session message's payload table (an empty one where it
  has none); a table other tables repeat (the layout entry) says where, a field a payload may
  end before (a hello's memory class list) says so;
* ``element-types.md``: the element type table;
* ``tags.md``: every tag table (``IntEnum`` / ``IntFlag`` of ``structs/tags.py`` and of
  the container modules), with this implementation's values of a table's
  implementation-defined range (``PrivateErrorCode`` beside ``ErrorCode``);
* ``index.md``: the pages, the parts of a descriptor, and every rule linked to the
  struct(s) it constrains and to its conformance vectors;
* ``vectors.md``: every rule with its conformance vectors (:mod:`hurray_schema.conformance`):
  file, our readers' verdicts, and the hex of the bytes around the fault.

Nothing here reads the spec text; descriptions are the project's own (``field(...)``).

The modules, bottom up: :mod:`.catalog` finds the declared tables and tag tables,
:mod:`.notes` reads their attribute docstrings, :mod:`.wire_types` writes fields in the
spec's vocabulary (wire types, presence, sizes), :mod:`.tables` places each table in a
descriptor (:class:`StructDoc`), :mod:`.markdown` holds the Markdown building blocks,
:mod:`.table_pages` and :mod:`.rule_pages` make the pages, :mod:`.render` renders, writes
and checks them all.
"""

from __future__ import annotations

from .catalog import declarations as declarations
from .catalog import model_enums as model_enums
from .catalog import struct_modules as struct_modules
from .catalog import table_name, tag_table
from .markdown import GENERATED as GENERATED
from .notes import attribute_notes, member_notes
from .render import check_docs, render_pages, write_docs
from .render import stale_rendered as stale_rendered
from .render import write_rendered as write_rendered
from .rule_pages import VECTORS_PAGE as VECTORS_PAGE
from .rule_pages import rule_structs as rule_structs
from .tables import StructDoc, struct_docs
from .wire_types import entry_table, optional_fields, presence, private_values, session_payloads, spec_type
from .wire_types import table_size as table_size

__all__ = [
    "spec_type", "presence", "entry_table", "table_name", "optional_fields", "private_values", "session_payloads",
    "attribute_notes", "member_notes", "tag_table", "StructDoc", "struct_docs", "render_pages", "write_docs",
    "check_docs",
]
