"""Audit: run every applicable rule and list every finding instead of stopping at the first.

:func:`audit` takes bytes (or a path) and tells what they are -- a descriptor, a bare stream,
a message stream or a ``.hrry`` file -- from their first bytes; when those name no kind (a
damaged magic, an invalid or cut first message header), a path's extension decides (``.hrry``
a file; the conformance corpus' ``.msgs``, ``.stream``, ``.desc``), else the input is read as
a bare stream (:func:`hurray_schema.io.walk.choose_kind`): the fault is then named by the rule
of the kind the input claims to be (``file.header.magic``, not ``descriptor.magic``).

* :mod:`.findings` -- the rules run per kind of input, over its located walk;
* :mod:`.groups` -- the tensors, composites and sections the findings are listed under;
* :mod:`.report` -- :class:`AuditReport`: the findings, how the input was read, and the text
  and JSON (schema ``hurray-schema/audit/1``) that ``hurray-schema audit`` prints;
* :mod:`.run` -- :func:`audit` itself.

Nothing is read whole into memory and no temporary file is written: a path is memory-mapped.
"""

from __future__ import annotations

from .findings import KINDS, audit_descriptor, input_name
from .groups import Group
from .report import AUDIT_JSON_FIELDS, AUDIT_JSON_SCHEMA, KIND_NAMES, AuditReport
from .run import audit

__all__ = ["audit", "audit_descriptor", "input_name", "KINDS", "AuditReport", "Group", "AUDIT_JSON_SCHEMA",
           "AUDIT_JSON_FIELDS", "KIND_NAMES"]
