"""The walk of each container kind: a lone descriptor, a bare stream, a message stream, a file.

Every entry point that reads a container -- the readers (:mod:`hurray_schema.io.stream`,
:mod:`hurray_schema.io.file`), ``audit``, the annotated view (``inspect``) and the command
line's grouping -- goes through the walks here; nothing else knows how a container is laid
out.  A walk yields :class:`~.common.Part` s in container order: where the part
sits (``start``/``end``, absolute), which declaration or table it is (``decl``), its decoded
``value``, and, when the bytes break a rule, the ``fault``.

One module per container kind, each with one walk that serves every reader of that kind:

* :mod:`.descriptor` -- :func:`walk_descriptor`, and the ``describe`` step every walk
  delegates (:func:`strict_describer`, :func:`collect_descriptor`);
* :mod:`.bare` -- :func:`walk_bare`;
* :mod:`.messages` -- :func:`walk_messages`, and what a receiver checks (:class:`TensorFrames`,
  :func:`check_message_header`, :func:`remote_error`);
* a file's walk lives with the file reader and its index, in :mod:`hurray_schema.io.file.walk`
  (its names still resolve here: :func:`walk_file`, :func:`walk_index`, :func:`check_ends`,
  :func:`check_tensor`, ...);
* :mod:`.kv` -- the file's KV metadata section: ``walk_kv``, ``decode_kv``, ``encode_kv``;
* :mod:`.kinds` -- which kind an input is (:func:`detect_kind`, :func:`choose_kind`);
* :mod:`.common` -- what they share: the parts a walk yields and the fault policy, the input (:class:`Window`,
  :func:`memory_input`), faults as findings, composite nesting.

What happens at a fault is the caller's :class:`~.common.Faults` policy, and
each walk takes its per-part steps by it:

* ``RAISE`` (the readers): the first untolerated fault raises its ``SpecViolation``;
* ``COLLECT`` (``audit``): the fault is yielded as a ``fault`` part carrying a
  :class:`~hurray_schema.rules.engine.Finding`; the walk goes on while the next part can
  still be located and stops where it cannot;
* ``ANNOTATE`` (the annotated view): as ``COLLECT``, the part also carrying a short
  ``note`` saying what the bytes do not hold.

Inputs are read through a :class:`Window`: zero-copy over bytes or a memory map, or a
bounded forward read of a file object (only what the current part needs is held).
Under ``COLLECT`` and ``ANNOTATE`` a descriptor is decoded from everything that remains
(what the bytes say, not what the framing promised), so those walks need a window over
memory (:func:`memory_input`).

The names below are imported on first use (PEP 562): a file read loads no stream code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".common": (
        "BUFFER", "DATA", "DATA_HEADER", "DESCRIPTOR", "ENTRY", "ENTRY_START", "FAULT", "MESSAGE",
        "MESSAGE_HEADER_PART", "NAME", "PAYLOAD", "TABLE", "TENSOR_END", "TRANSPORT", "VALUE", "Faults", "Part",
        "as_view", "fault", "part_from_fields", "Describe", "Nesting", "Window", "fault_at", "memory_input",
        "violation_finding",
    ),
    "...errors": ("RemoteError",),
    ".descriptor": ("collect_descriptor", "strict_describer", "strict_descriptor", "walk_descriptor"),
    ".bare": ("walk_bare",),
    ".messages": ("REMOTE_ERRORS", "TensorFrames", "check_message_header", "remote_error", "walk_messages"),
    ".kinds": ("DETECT_BYTES", "KIND_EXTENSIONS", "KindChoice", "choose_kind", "detect_kind"),
}, unlisted={  # the file's walk, which moved to the file package (it imports this one, not the reverse)
    "..file.walk": (
        "FILE_HEADER_PART", "INDEX_PART", "KV_PART", "TENSOR_DATA", "TRAILER_PART", "IndexEntry", "TensorRegion",
        "buffer_spans", "check_ends", "check_tensor", "walk_file", "walk_index",
    ),
})

if TYPE_CHECKING:
    from ...errors import RemoteError  # noqa: F401
    from .bare import walk_bare  # noqa: F401
    from .common import (  # noqa: F401 (listed, imported lazily)
        BUFFER, DATA, DATA_HEADER, DESCRIPTOR, ENTRY, ENTRY_START, FAULT, MESSAGE, MESSAGE_HEADER_PART, NAME,
        PAYLOAD, TABLE, TENSOR_END, TRANSPORT, VALUE, Describe, Faults, Nesting, Part, Window, as_view, fault,
        fault_at, memory_input, part_from_fields, violation_finding,
    )
    from .descriptor import collect_descriptor, strict_describer, strict_descriptor, walk_descriptor  # noqa: F401
    from .kinds import DETECT_BYTES, KIND_EXTENSIONS, KindChoice, choose_kind, detect_kind  # noqa: F401
    from .messages import REMOTE_ERRORS, TensorFrames, check_message_header, remote_error, walk_messages  # noqa: F401
