"""Field patches located through the declarations, and the containers the vectors start from.

A vector is a valid input written by the project's writers with ``validate=False``
(:func:`descriptor`, :func:`bare`, :func:`messages`, :func:`hrry`), then, where the
model cannot express the fault, one field changed in place.  Where the field sits comes
from the declarations (``structs``: :func:`~hurray_schema.structs._declare.static_offset`,
the descriptor's :class:`~hurray_schema.rules.descriptor.DescriptorContext`) or from the
located walk (:mod:`hurray_schema.io.walk`); its width and encoding from the field's own
``construct`` declaration (:func:`put`).  No offset is written by hand.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import construct

from ..codec import encode_descriptor
from ..io import write_file, write_stream
from ..model import TensorDescriptor
from ..rules.descriptor import DescriptorContext
from ..structs._declare import fields, static_offset
from ..structs.descriptor import FIXED_HEADER

__all__ = [
    "put", "cut", "field_bytes", "descriptor", "bare", "messages", "hrry", "located", "header_at",
]


def _codec(decl: construct.Construct, name: str) -> construct.Construct:
    """The wire codec of field ``name`` of ``decl`` (a ``Const`` field: the bytes under it)."""
    sub = next(f for f in fields(decl) if f.name == name).subcon
    return sub.subcon if isinstance(sub, construct.Const) else sub


def field_bytes(decl: construct.Construct, name: str, value) -> bytes:
    """``value`` encoded as field ``name`` of ``decl`` is."""
    return _codec(decl, name).build(value)


def put(data: bytes, at: int, decl: construct.Construct, name: str, value) -> bytes:
    """``data`` with field ``name`` of ``decl``, which starts at ``at``, set to ``value``."""
    encoded = field_bytes(decl, name, value)
    if at < 0 or at + len(encoded) > len(data):
        raise ValueError(f"field {name} at {at} lies outside the {len(data)} bytes")
    return data[:at] + encoded + data[at + len(encoded):]


def read_field(data: bytes, at: int, decl: construct.Construct, name: str):
    """The value of field ``name`` of ``decl`` that starts at ``at``."""
    return _codec(decl, name).parse(data[at:])


def cut(data: bytes, end: int) -> bytes:
    """The first ``end`` bytes."""
    return data[:end]


def header_at(name: str, base: int = 0) -> int:
    """Where fixed-header field ``name`` of the descriptor starting at ``base`` sits."""
    return base + static_offset(FIXED_HEADER, name)


def located(desc: TensorDescriptor) -> DescriptorContext:
    """Where each field of ``desc``'s encoding sits (offsets from its first byte)."""
    return DescriptorContext(desc)


def descriptor(desc: TensorDescriptor) -> bytes:
    """A lone descriptor, encoded without any rule check."""
    return encode_descriptor(desc)


def bare(items: Iterable) -> bytes:
    """A bare stream of ``items``, written without validation."""
    return write_stream(None, list(items), validate=False)


def messages(items: Iterable, **options) -> bytes:
    """A message stream of ``items``, written without validation (``options``: the writer's)."""
    return write_stream(None, list(items), framing="messages", validate=False, **options)


def hrry(items, **options) -> bytes:
    """The bytes of a ``.hrry`` file of ``items`` (a name → item mapping), written without validation
    (``options``: the writer's, ``metadata=`` included)."""
    with tempfile.TemporaryDirectory(prefix="hurray-vectors-") as scratch:
        path = Path(scratch) / "vector.hrry"
        write_file(path, items, validate=False, **options)
        return path.read_bytes()


def scratch_file(data: bytes, directory: str) -> str:
    """``data`` written to a file in ``directory`` (for the readers that take a path)."""
    path = os.path.join(directory, "vector.hrry")
    with open(path, "wb") as out:
        out.write(data)
    return path
