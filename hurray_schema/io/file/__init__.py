"""``.hrry`` files (``file-format.md``): the walk of a file, its index held as arrays, the reader
and the writer, one package whose modules import one way only:

* :mod:`.walk` -- the walk of a file's container (header, trailer, index, KV section, then each
  tensor in descriptor order) under every fault policy, and the checks it is made of
  (:func:`~.walk.check_ends`, :func:`~.walk.check_index`, :func:`~.walk.check_kv`,
  :func:`~.walk.check_tensor`), which the reader and ``audit`` run alike;
* :mod:`.index` -- the index as arrays and the placement of every tensor checked on them at
  open (:class:`~.index.FileIndex`, :func:`~.index.place_tensors`), built on :mod:`.walk`;
* :mod:`.reader` -- :class:`HurrayFile` and :func:`read_file`, on :mod:`.index` and :mod:`.walk`;
* :mod:`.writer` -- :func:`write_file`, laying out what :mod:`.walk` reads back.

``walk <- index <- reader``; the writer takes only the entry type of the walk.
"""

from __future__ import annotations

from ...errors import ClosedFileError
from .reader import HurrayFile, TensorSlice, item_array, read_file
from .walk import (
    FILE_HEADER_PART, INDEX_PART, KV_PART, TENSOR_DATA, TRAILER_PART, IndexEntry, TensorRegion, buffer_spans,
    check_ends, check_tensor, walk_file, walk_index,
)
from .writer import write_file

__all__ = [
    "ClosedFileError", "HurrayFile", "IndexEntry", "TensorSlice", "item_array", "read_file", "write_file",
    "FILE_HEADER_PART", "INDEX_PART", "KV_PART", "TENSOR_DATA", "TRAILER_PART", "TensorRegion", "buffer_spans",
    "check_ends", "check_tensor", "walk_file", "walk_index",
]
