"""The ``hurray-schema`` command line (also ``python -m hurray_schema``): a module per command,
each only wiring its options to the library; :mod:`.common` holds the group ``main`` (which
imports a command's module only when that command runs) and what the commands share.

Commands:

* ``audit PATH|-`` (:mod:`.audit`) -- run every applicable rule on a descriptor, a bare
  stream, a message stream or a ``.hrry`` file (:func:`hurray_schema.audit`) and print the
  report: the findings grouped by tensor / composite, then a summary line; ``--json`` its JSON
  object (schema ``hurray-schema/audit/1``, :data:`hurray_schema.audit.AUDIT_JSON_FIELDS`; keys are only ever
  added, never renamed or removed).  Exit code 0: no MUST-level finding; 1: at least one
  MUST-level finding the mode does not tolerate; 2: the input cannot be read.
* ``inspect PATH`` (:mod:`.inspect`) -- annotated view of every field (byte range, raw bytes,
  decoded value, citation); ``--hex`` for the byte-table form.
* ``rules`` (:mod:`.rules`) -- the rule registry (``--json``).
* ``docs OUTDIR``, ``ksy OUTDIR``, ``vectors OUTDIR`` (:mod:`.render`) -- write the Markdown
  format documentation, the Kaitai Struct schemas or the conformance corpus generated from the
  declarations (``--check`` compares instead of writing).
* ``merge PATH NAME -o OUT.npy`` (:mod:`.merge`) -- materialize a composite (or tensor) of a
  file (:func:`hurray_schema.export.export_npy`); with ``--memory BYTES`` a larger result is
  evaluated chunk by chunk through dask; ``--zarr STORE`` instead writes a Zarr store chunk by
  chunk (:func:`hurray_schema.export.export_zarr`, the ``[zarr]`` extra).
* ``convert SOURCE DESTINATION`` (:mod:`.convert`) -- safetensors or GGUF into Hurray, Hurray
  into safetensors (:func:`hurray_schema.conversion.convert`), with a report per tensor
  (``--json``).
* ``serve FILE...``, ``get URL KEY``, ``put URL KEY FILE`` (:mod:`.serve`, :mod:`.get`,
  :mod:`.put`) -- the transport (:mod:`hurray_schema.net`).
"""

from __future__ import annotations

from .common import main

__all__ = ["main"]
