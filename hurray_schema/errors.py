"""Exceptions raised on bad input.

Every error this library raises because of the *input* (bytes, files, streams,
arguments describing tensors) derives from :class:`HurraySchemaError`.  A breach of a
normative statement of the Hurray specification is a :class:`SpecViolation`, which
names the rule, the spec section it comes from and the byte offset of the fault.

This module imports nothing from the package, so every layer (the wire declarations in
:mod:`hurray_schema.structs` included) may raise its errors.
"""

from __future__ import annotations

__all__ = ["HurraySchemaError", "SpecViolation", "LimitExceeded", "EncodeError", "FieldRangeError",
           "UnsupportedEvaluation", "IndexRangeError", "IndexTypeError", "AdvancedIndexUnsupported",
           "InvalidDtype", "CopyRequired", "NotAnArray", "NoSuchItem", "DLPackUnsupported", "SourceError", "SourceChanged",
           "ShortRead", "RangeNotSupported", "SourceUnavailable", "RemoteError", "ProtocolVersionMismatch",
           "UnknownTensor", "LayoutUnavailable", "TranscodeLimitExceeded", "DeviceUnavailable", "InvalidMessage",
           "MessageTooLarge", "ShardMismatch", "SessionError", "SessionTimeout", "ClosedFileError",
           "DecodedTypeMismatch", "NoExactForm", "NativeProtocolError", "NativeAbiUnavailable", "CapsuleError",
           "CapsuleConsumed", "AbiVersionMismatch", "CapsuleBufferError"]


class HurraySchemaError(Exception):
    """Base class of every error raised on bad input."""


class SpecViolation(HurraySchemaError):
    """The input breaks a normative statement (MUST / MUST NOT) of the spec.

    Attributes:
        rule_id: stable dotted id of the rule (see ``hurray_schema.rules.registry()``).
        citation: spec file and section, e.g. ``"metadata.md § Fixed Header"``.
        offset: byte offset of the faulty field from the start of the input that was
            being decoded (a descriptor, a stream or a file), or ``None`` when the fault
            has no single location (for example a partition gap).
        message: human-readable explanation.
    """

    def __init__(self, rule_id: str, citation: str, offset: int | None, message: str):
        self.rule_id = rule_id
        self.citation = citation
        self.offset = offset
        self.message = message
        where = "" if offset is None else f" at byte {offset}"
        super().__init__(f"[{rule_id}] {message}{where} ({citation})")

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working
        return (type(self), (self.rule_id, self.citation, self.offset, self.message))


class LimitExceeded(HurraySchemaError):
    """The input exceeds a limit this reader enforces (a configurable safety bound)."""

    def __init__(self, limit: str, value: int, maximum: int, offset: int | None = None):
        self.limit = limit
        self.value = value
        self.maximum = maximum
        self.offset = offset
        where = "" if offset is None else f" at byte {offset}"
        super().__init__(f"{limit} = {value} exceeds the configured maximum {maximum}{where}")

    def __reduce__(self):
        return (type(self), (self.limit, self.value, self.maximum, self.offset))


class EncodeError(HurraySchemaError):
    """The arguments given to an encoder or writer cannot be written as they are (for
    example a tensor whose buffers do not match its buffer handles)."""


class FieldRangeError(EncodeError):
    """A value does not fit the wire field it is encoded into (an integer outside the
    field's range, a float too large for its format, a byte string of the wrong length).

    Attributes:
        field: the field's spec name (``"shape[1]"`` for an array element), or ``None``
            when the offending field could not be singled out.
        value: the value that does not fit.
        width: the field's wire type in words (``"uint8"``, ``"4-byte string"``).
        reason: what is wrong with the value (``"is out of range"``).
        citation: the spec section declaring the field, when known.
    """

    def __init__(self, field: str | None, value, width: str | None, reason: str, citation: str | None = None):
        self.field = field
        self.value = value
        self.width = width
        self.reason = reason
        self.citation = citation
        if field is None:
            message = f"a value does not fit its wire field ({reason})"
        else:
            shown = repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            message = f"field {field} = {shown} {reason} for its {width} wire field"
        super().__init__(message + (f" ({citation})" if citation else ""))

    def __reduce__(self):
        return (type(self), (self.field, self.value, self.width, self.reason, self.citation))


class UnsupportedEvaluation(HurraySchemaError):
    """The tensor is valid but this evaluator cannot compute its values: float128, a private element
    type whose codes are not 8, 16, 32 or 64 bits wide, a tag no table row describes, or a shape
    NumPy cannot hold (see :mod:`hurray_schema.evaluate.tensor`)."""


class IndexRangeError(HurraySchemaError, IndexError):
    """An index does not fit the array it indexes: an integer outside ``[-n, n)``, more indices
    than the array has dimensions, or a second ``Ellipsis`` (NumPy raises ``IndexError`` for these
    too, so ``except IndexError`` keeps working)."""


class IndexTypeError(HurraySchemaError, TypeError):
    """An index entry that is none of the NumPy basic index kinds: an integer, a slice,
    ``Ellipsis`` or ``None`` (a float, a string, ...)."""


class AdvancedIndexUnsupported(IndexTypeError):
    """An array, a list or a boolean used as an index: NumPy's advanced indexing is not supported
    (materialize the array with ``numpy.asarray`` first, then index it)."""


class InvalidDtype(HurraySchemaError, TypeError):
    """A ``dtype`` argument that names no numeric NumPy / ``ml_dtypes`` type and no element type,
    or a cast the requested ``casting`` rule forbids."""


class CopyRequired(HurraySchemaError, ValueError):
    """``copy=False`` was asked for but the array cannot be had without a copy or a decode
    (NumPy raises ``ValueError`` in the same case)."""


class NotAnArray(HurraySchemaError, TypeError):
    """The operation needs an array the item does not have: a group composite is a collection of
    its members, not one array (``layouts/composite.md § Group``); a 0-d array has no ``len()``."""


class NoSuchItem(HurraySchemaError, KeyError):
    """A file has no tensor, composite or member entry by that name."""

    def __str__(self) -> str:  # KeyError would print the repr of the arguments
        return HurraySchemaError.__str__(self)


class DLPackUnsupported(HurraySchemaError, BufferError):
    """The array cannot be exported through DLPack: its dtype has no DLPack type code in NumPy's
    exporter (``ml_dtypes`` types, bool sub-byte codes), or the consumer asked for no copy where
    one is needed.  ``BufferError`` is what DLPack consumers expect."""


class SourceError(HurraySchemaError, OSError):
    """A file's bytes could not be had as they were when it was opened (a URL, an object store:
    :mod:`hurray_schema.io.source`); the reader gives up rather than decode other bytes."""


class SourceChanged(SourceError):
    """The file changed under the reader: its size or its ETag is not what it was when opened."""


class ShortRead(SourceError):
    """The source answered a byte range with fewer (or more) bytes than were asked for."""


class RangeNotSupported(SourceError):
    """The server ignored ``Range`` and would send the whole file where a byte range was asked."""


class SourceUnavailable(SourceError):
    """The source could not be read: a server error, a refused connection or a timeout."""


class RemoteError(HurraySchemaError):
    """The peer sent an ``ERROR`` message (``interchange.md § Error Handling``); the subclass
    names its ``error_code`` (``hurray_schema.io.walk.remote_error``, by
    :class:`~hurray_schema.structs.session.ErrorCode`).

    Attributes:
        error_code: the code the peer sent.
        remote_message: the peer's description.
        offset: byte offset of the ERROR message in what was received.
    """

    def __init__(self, error_code: int, message: str, offset: int | None):
        self.error_code = error_code
        self.remote_message = message
        self.offset = offset
        where = "" if offset is None else f" at byte {offset}"
        super().__init__(f"peer sent ERROR 0x{error_code:08X}{where}: {message}")

    def __reduce__(self):
        return (type(self), (self.error_code, self.remote_message, self.offset))


class ProtocolVersionMismatch(RemoteError):
    """ERROR PROTOCOL_VERSION_MISMATCH: the peers share no protocol version."""


class UnknownTensor(RemoteError, KeyError):
    """ERROR UNKNOWN_TENSOR: the server holds no tensor by that key."""

    def __str__(self) -> str:  # KeyError would print the repr of the arguments
        return HurraySchemaError.__str__(self)


class LayoutUnavailable(RemoteError):
    """ERROR LAYOUT_UNAVAILABLE: no acceptable layout could be served."""


class TranscodeLimitExceeded(RemoteError):
    """ERROR TRANSCODE_LIMIT_EXCEEDED: the server refused to transcode a buffer that large."""


class DeviceUnavailable(RemoteError):
    """ERROR DEVICE_UNAVAILABLE: the requested device is not available."""


class InvalidMessage(RemoteError):
    """ERROR INVALID_MESSAGE: the peer found a message malformed (its text names the rule)."""


class MessageTooLarge(RemoteError):
    """ERROR MESSAGE_TOO_LARGE: a payload_length exceeded the peer's maximum."""


class ShardMismatch(RemoteError):
    """ERROR SHARD_MISMATCH: the shards of a parallel transfer are inconsistent."""


class SessionError(HurraySchemaError, ConnectionError):
    """A transport session could not go on: the connection was refused, reset or closed by the
    peer outside a message, or the session was closed by this side."""


class SessionTimeout(SessionError, TimeoutError):
    """The peer sent nothing within the session's timeout."""


class ClosedFileError(HurraySchemaError, ValueError):
    """An access to a :class:`~hurray_schema.io.file.HurrayFile` after its ``close()`` (a
    ``ValueError``, as for a closed Python file)."""


class DecodedTypeMismatch(HurraySchemaError):
    """The type a caller asked a tensor's values to decode to is not one they decode to
    (``to_numpy(dtype=...)``, ``decode_target``); a composite member whose decoded type
    differs from its head's is the binder's ``composite.member.decoded_type``."""


class NoExactForm(HurraySchemaError):
    """A tensor whose values Hurray cannot hold exactly in its own form (a GGUF type with a float
    offset, a zero scale over zeros of both signs, a non-finite scale): the caller decides whether to
    store it decoded (``dequantize``) or to quantize it again (``requantize``)."""


class NativeProtocolError(HurraySchemaError):
    """The native protocol (``__hurray__`` / ``from_hurray``, ``interchange.md § In-Process``) failed:
    a capsule that does not follow it, or a hurray-ffi call that returned an error status."""


class NativeAbiUnavailable(NativeProtocolError, ImportError):
    """No library exporting the hurray-ffi C ABI was found (or it speaks another ABI version): the
    message says how to get one (install ``pyhurray``, or name a shared library by
    ``HURRAY_SCHEMA_FFI_LIBRARY``)."""


class CapsuleError(NativeProtocolError, ValueError):
    """A capsule is not a well-formed ``"hurray_tensor"`` capsule: another name, a null buffer list
    or context, a null data pointer where a buffer must exist, a buffer count the descriptor does
    not declare, a composite head (the protocol carries tensors, ADR-036 § 6)."""


class CapsuleConsumed(CapsuleError):
    """The capsule was already consumed (it is named ``"used_hurray_tensor"``, ADR-033)."""


class AbiVersionMismatch(NativeProtocolError):
    """The capsule's ``HurrayTensorContext`` records a C ABI version the loaded hurray-ffi library
    does not have (ADR-034 § 4: checked before anything else is read)."""

    def __init__(self, producer: int, consumer: int):
        self.producer = producer
        self.consumer = consumer
        super().__init__(f"the capsule was produced by hurray-ffi C ABI version {producer}; this process reads "
                         f"version {consumer} (producer and consumer must use the same ABI version)")


class CapsuleBufferError(CapsuleError):
    """A capsule's buffer cannot hold what its descriptor declares (smaller than the buffer
    table's ``byte_size``), or lives where this process cannot read it (a device buffer)."""
