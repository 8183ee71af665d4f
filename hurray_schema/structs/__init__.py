"""Wire tables of the Hurray format, declared once as ``construct`` structs.

One module per spec area: ``descriptor`` (fixed header, shape, byte_offset, buffer
table, and :data:`~hurray_schema.structs.descriptor.DESCRIPTOR_PARTS`: how a whole
descriptor is put together), ``layouts`` (layout-specific fields), ``quantization``
(section framing, header, schemes), ``sections`` (shard, statistics, extension type,
composite member), ``element_types`` (the type tag table), ``file`` and ``stream`` (the
containers).  ``tags`` holds the tag tables (``IntEnum`` / ``IntFlag``) that the fields
carry (``field(..., tags=...)``); ``_declare`` holds the field helper and the fast codec
derived from a declaration; ``wire`` turns value objects into bytes.

This package is the bottom layer: it imports nothing else of ``hurray_schema``
(:mod:`hurray_schema.model` imports it, never the other way).
"""

import importlib as _importlib
import sys as _sys
import types as _types


class _PdbOnDemand(_types.ModuleType):
    """Stands in for ``pdb`` while ``construct`` is imported: its package imports ``construct.debug``,
    which imports ``pdb`` at its top for the post-mortem of its ``Debugger`` wrapper only (and
    ``pdb`` brings ``bdb``, ``cmd``, ``code``, ``codeop``...).  The real module is imported the
    first time ``construct.debug`` uses it."""

    def __getattr__(self, name: str):
        return getattr(_importlib.import_module("pdb"), name)


def _import_construct() -> None:
    """``construct`` imported without ``pdb``: a stand-in sits in ``sys.modules`` only while
    ``construct`` is imported, so every other importer of ``pdb`` gets the real module."""
    if "construct" in _sys.modules or "pdb" in _sys.modules:
        return
    stand_in = _PdbOnDemand("pdb")
    _sys.modules["pdb"] = stand_in
    try:
        _importlib.import_module("construct")
    finally:
        if _sys.modules.get("pdb") is stand_in:
            del _sys.modules["pdb"]


_import_construct()
