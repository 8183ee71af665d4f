"""Readers and writers of Hurray streams and files.

* :mod:`.tensor` -- :class:`Tensor` and :class:`Composite`, what the readers hand out
  and the writers take;
* :mod:`.stream` -- :func:`read_stream` / :func:`write_stream` (bare and message framing);
* :mod:`.stream` also has :class:`StreamWriter`, one item (or composite member) at a time;
* :mod:`.file` -- :func:`read_file` / :func:`write_file` and :class:`HurrayFile`, with the walk of
  a file (:mod:`.file.walk`) and its index as arrays (:mod:`.file.index`: what is checked at open
  and on first read), one package importing one way (walk <- index <- reader);
* :mod:`.simple` -- :func:`save` / :func:`load`: a dict of arrays in, a dict of arrays out;
* :mod:`.walk` -- the walk of each stream kind, one module each (:mod:`.walk.common`: what
  they yield; :mod:`.walk.kv`: the file's KV metadata section, where :class:`UInt64` forces value
  tag 0x03), which the readers, ``audit``, ``inspect`` and the command line all consume;
* :mod:`.native` -- :func:`from_hurray` and the composites' conversions of the native protocol
  (``Tensor.__hurray__`` is :mod:`.native_export`; the C ABI's loading :mod:`.native_abi`);
* :mod:`.tensor` also has the buffers made as they are written (``ProducedTensor``); the
  builders of quantized, sparse and composite tensors are :mod:`hurray_schema.builders`.

The names below are imported on first use (PEP 562): reading a file loads no stream code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".tensor": ("Tensor", "Composite"),
    ".file": ("HurrayFile", "IndexEntry", "read_file", "write_file", "TensorSlice"),
    ".stream": ("read_stream", "write_stream", "StreamReader", "StreamWriter"),
    ".simple": ("load", "save"),
    ".walk.kv": ("UInt64",),
    ".native": ("from_hurray", "composite_to_hurray", "composite_from_hurray"),
}, unlisted={"..errors": ("ClosedFileError", "RemoteError")})  # errors live in hurray_schema.errors

if TYPE_CHECKING:
    from .file import HurrayFile, IndexEntry, TensorSlice, read_file, write_file  # noqa: F401
    from .native import composite_from_hurray, composite_to_hurray, from_hurray  # noqa: F401
    from .simple import load, save  # noqa: F401
    from .stream import StreamReader, StreamWriter, read_stream, write_stream  # noqa: F401
    from .tensor import Composite, Tensor  # noqa: F401
    from .walk.kv import UInt64  # noqa: F401
