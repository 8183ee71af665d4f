"""Readers and writers of Hurray streams and files.

* :mod:`.tensor` -- :class:`Tensor` and :class:`Composite`, what the readers hand out
  and the writers take;
* :mod:`.stream` -- :func:`read_stream` / :func:`write_stream` (bare and message framing);
* :mod:`.stream` also has :class:`StreamWriter`, one item (or composite member) at a time;
* :mod:`.file` -- :func:`read_file` / :func:`write_file` and :class:`HurrayFile`;
* :mod:`.simple` -- :func:`save` / :func:`load`: a dict of arrays in, a dict of arrays out;
* :mod:`.kv` -- the file's KV metadata section (:class:`UInt64` forces value tag 0x03);
* :mod:`.walk` -- the located walk of each container kind (:mod:`.parts`: what it yields),
  which the readers, ``audit``, ``inspect`` and the command line all consume.
"""

from .file import ClosedFileError, HurrayFile, IndexEntry, TensorSlice, read_file, write_file
from .kv import UInt64
from .simple import load, save
from .stream import RemoteError, StreamReader, StreamWriter, read_stream, write_stream
from .tensor import Composite, Tensor

__all__ = [
    "Tensor", "Composite", "HurrayFile", "IndexEntry", "read_file", "write_file", "read_stream",
    "write_stream", "StreamReader", "StreamWriter", "RemoteError", "UInt64", "load", "save", "ClosedFileError",
    "TensorSlice",
]
