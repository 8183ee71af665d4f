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
