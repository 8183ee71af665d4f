"""Which container kind an input is -- a lone descriptor, a bare stream, a message stream or a
file -- from its first bytes (:func:`detect_kind`), else from its path's extension
(:func:`choose_kind`): the walk each kind takes is the one of its module here."""

from __future__ import annotations

import os

import attrs

from ...structs._declare import plan, select
from ...structs.descriptor import FIXED_HEADER
from ...structs.descriptor import MAGIC as DESCRIPTOR_MAGIC
from ...structs.file import FILE_MAGIC
from ...structs.stream import MESSAGE_HEADER, MessageType
from .common import DESCRIPTOR_LENGTH_AT

__all__ = ["DETECT_BYTES", "detect_kind", "choose_kind", "KindChoice", "KIND_EXTENSIONS", "KIND_NAMES"]

_MSG = plan(MESSAGE_HEADER)
_KNOWN_MESSAGE_TYPES = frozenset(int(m) for m in MessageType)
"""The ``message_type`` numbers this reader knows (``interchange.md § Message Types``); the message
walk itself (:mod:`.messages`, with the session's tables) is not needed to tell a kind."""
_LENGTH_FIELD = plan(select(FIXED_HEADER, "descriptor_length")).steps[0].codec

KIND_NAMES = {
    "descriptor": "tensor descriptor", "stream": "bare stream", "messages": "message stream", "file": "Hurray file",
}
"""How each kind of input is named in words (the audit's heading, the inspect title)."""

DETECT_BYTES = 16
"""How many first bytes :func:`detect_kind` looks at (a peek of that many is enough)."""


def detect_kind(data) -> str:
    """``file``, ``descriptor``, ``stream`` (bare), ``messages`` or ``unknown``, from the
    first bytes: the file magic (``file-format.md § File Header``), the descriptor magic
    (``metadata.md § Fixed Header``; a stream when more bytes follow ``descriptor_length``),
    or a known ``message_type`` (``interchange.md § Message Framing``)."""
    view = memoryview(data)
    head = bytes(view[:DETECT_BYTES])
    if head.startswith(FILE_MAGIC):
        return "file"
    if head.startswith(DESCRIPTOR_MAGIC):
        if len(head) >= DESCRIPTOR_LENGTH_AT + _LENGTH_FIELD.size:
            (length,) = _LENGTH_FIELD.unpack_from(head, DESCRIPTOR_LENGTH_AT)
            if length < len(view):
                return "stream"
        return "descriptor"
    if len(head) >= _MSG.fixed_size and _MSG.unpack(head)[0]["message_type"] in _KNOWN_MESSAGE_TYPES:
        return "messages"
    return "unknown"


KIND_EXTENSIONS = {".desc": "descriptor", ".stream": "stream", ".msgs": "messages", ".hrry": "file"}
"""The path extensions that name a kind when the first bytes do not: ``.hrry`` (the file
format's own, ``file-format.md``) and the conformance corpus' ``.desc`` / ``.stream`` / ``.msgs``."""

_KIND_WORDS = {"descriptor": "a lone descriptor", "stream": "a bare stream", "messages": "a message stream",
               "file": "a Hurray file"}


@attrs.frozen(slots=True)
class KindChoice:
    """How an input is read when its kind was not given: ``kind`` (descriptor, stream,
    messages or file), ``source`` -- ``content`` (its first bytes), ``extension`` (they name
    no kind, the path's extension does) or ``default`` (neither: a bare stream) -- and
    ``reason``, one sentence saying why."""

    kind: str
    source: str
    reason: str

    @property
    def assumed(self) -> bool:
        """True when the first bytes did not name the kind."""
        return self.source != "content"


def choose_kind(data, name=None) -> KindChoice:
    """The kind to read ``data`` as: what :func:`detect_kind` finds in its first bytes; when
    they name none (a damaged magic, an invalid or cut first message header), the extension
    of the path ``name`` (:data:`KIND_EXTENSIONS`); else a bare stream, whose reader then
    reports the bytes' fault (``descriptor.magic``)."""
    found = detect_kind(data)
    if found != "unknown":
        return KindChoice(found, "content", f"its first bytes are those of {_KIND_WORDS[found]}")
    unnamed = "its first bytes name no kind (no file or descriptor magic, no valid message header)"
    suffix = os.path.splitext(os.fspath(name))[1].lower() if isinstance(name, (str, os.PathLike)) else ""
    kind = KIND_EXTENSIONS.get(suffix)
    if kind is not None:
        return KindChoice(kind, "extension", f"{unnamed}; the path's extension {suffix} names {_KIND_WORDS[kind]}")
    ending = f"nor does the path's extension {suffix}" if suffix else "and no path extension names one"
    return KindChoice("stream", "default", f"{unnamed}, {ending}: read as a bare stream")
