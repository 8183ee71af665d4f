"""One call to write a file, one to read it all back: :func:`save` and :func:`load`.

``save(path, {name: array | Tensor | Composite}, metadata=None)`` is :func:`write_file`
(atomic, every descriptor and composite checked first) with ``metadata`` as the file's KV
section (``file-format.md § KV Metadata Section``).  ``load(path)`` is :func:`read_file` with every
item turned into a NumPy array, the file closed on return.  Lazy access is ``read_file``
itself (``keys()``, ``metadata()``, ``f[name]``, ``get_item``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ..errors import HurraySchemaError
from ..limits import Limits
from ..model import CompositionRule
from .file import IndexEntry, item_array, read_file, write_file
from .tensor import Composite, Item

__all__ = ["load", "save"]


def save(path, tensors: Mapping[str, Any], metadata: Optional[Mapping[str, Any]] = None) -> list[IndexEntry]:
    """Write ``tensors`` -- a mapping of names to NumPy arrays (every dtype NumPy or
    ``ml_dtypes`` holds that has a Hurray element type), :class:`Tensor` s and
    :class:`Composite` s -- to the ``.hrry`` file ``path``; ``metadata`` (str keys; bool,
    int, float, str, bytes values or lists of one of them) becomes its KV section.

    Arrays are stored row-major in their own element type.  Composite members are
    written after their head, named ``<name>.<i>`` unless they carry a name.  The file
    replaces ``path`` only once complete and only if a strict reader accepts all of it
    (:func:`write_file`).  Returns the index entries."""
    if not isinstance(tensors, Mapping):
        raise HurraySchemaError(f"save takes a mapping of names to arrays or tensors, not {type(tensors).__name__}")
    return write_file(path, tensors, metadata=metadata)


def load(path, *, limits: Optional[Limits] = None) -> dict:
    """Every tensor of the ``.hrry`` file ``path`` as a NumPy array, by name, in index order.

    A tensor gives its decoded array (``Tensor.to_numpy``), a partition or an overlay its
    merged array; their members do not appear on their own.  A group has no single
    array: its members appear instead of it, under their own names (``<group>.<i>`` for
    the ones this project or the reference writes), a composite member merged, a nested
    group opened the same way.  Arrays own their memory (writeable, nothing keeps the file
    open).  ``limits`` bounds reading and evaluation as for :func:`read_file` and
    ``to_numpy``; the metadata is ``read_file(path).metadata()``."""
    with read_file(path, limits=limits) as f:
        arrays: dict = {}
        for name, item in f.items():
            _add_arrays(arrays, name, item, limits)
        return arrays


def _add_arrays(arrays: dict, name: str, item: Item, limits) -> None:
    if isinstance(item, Composite) and item.rule == CompositionRule.GROUP:
        for i, member in enumerate(item.members):
            _add_arrays(arrays, member.name if member.name is not None else f"{name}.{i}", member, limits)
        return
    array = item_array(item, limits=limits)
    arrays[name] = array if array.flags.writeable else array.copy()
