"""Hurray into safetensors: every tensor decoded, partitions and overlays merged, groups opened
into their members' names (as :func:`hurray_schema.load` names them), written by
:mod:`.safetensors_format` into a file that replaces ``dst`` once complete."""

from __future__ import annotations

import numpy as np

from ..errors import HurraySchemaError
from .measure import decoded, describe, stored_bytes
from .report import ConvertReport, TensorReport

__all__ = ["into_safetensors", "named_arrays", "unique_arrays", "write_leaves"]


def into_safetensors(src: str, dst: str, progress) -> ConvertReport:
    """Convert the Hurray file ``src`` into the safetensors file ``dst``; ``progress(done, total)``
    after each tensor, in stored bytes."""
    from ..io import read_file
    from ..io._write import replacing

    with read_file(src) as container:
        leaves = unique_arrays(container, src)
        total = sum(stored_bytes(item) for _, item in leaves)
        with replacing(dst) as out:
            rows = write_leaves(out, leaves, container.metadata(), progress, total, 0)
    return ConvertReport(src, dst, "hurray", "safetensors", tuple(rows))


def write_leaves(out, leaves: list, metadata: dict, progress, total: int, done: int) -> list:
    """Write ``leaves`` (name, item) as one safetensors file into ``out``, each decoded in turn;
    their report rows.  ``progress(done, total)`` after each, ``done`` counting on from the given."""
    from .safetensors_format import write_safetensors

    entries = [(name, tuple(item.shape), np.dtype(item.dtype)) for name, item in leaves]
    rows = []
    for i, type_out, nbytes, _array in write_safetensors(out, entries, metadata, lambda i: decoded(leaves[i][1])):
        name, item = leaves[i]
        rows.append(TensorReport(name, describe(item), type_out, stored_bytes(item), nbytes, 0.0, 0.0, True, False))
        done += stored_bytes(item)
        if progress is not None:
            progress(done, total)
    return rows


def named_arrays(container):
    """(name, item) of every array of a Hurray file, groups opened into their members (as
    :func:`hurray_schema.load` names them)."""
    from ..io import Composite
    from ..model import CompositionRule

    def opened(name, item):
        if isinstance(item, Composite) and item.rule == CompositionRule.GROUP:
            for i, member in enumerate(item.members):
                yield from opened(member.name if member.name is not None else f"{name}.{i}", member)
        else:
            yield name, item

    for name, item in container.items():
        yield from opened(name, item)


def unique_arrays(container, src: str) -> list:
    """:func:`named_arrays` of the Hurray file ``src``, refused when two would share a name (a
    safetensors file, or a model folder's index, keys each tensor by its name)."""
    leaves = list(named_arrays(container))
    names = [name for name, _ in leaves]
    if len(set(names)) != len(names):
        raise HurraySchemaError(f"{src}: two arrays would share a name in safetensors")
    return leaves
