"""Wire tables of the Hurray format, declared once as ``construct`` structs.

One module per spec area: ``descriptor`` (fixed header, shape, byte_offset, buffer
table), ``layouts`` (layout-specific fields), ``quantization`` (section framing, header,
schemes), ``sections`` (shard, statistics, extension type, composite member),
``element_types`` (the type tag table).  ``_declare`` holds the field helper and the
fast codec derived from a declaration; ``wire`` turns value objects into bytes.
"""
