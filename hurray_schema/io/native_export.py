"""Export of a tensor through the native protocol: ``Tensor.__hurray__()``.

The capsule follows the reference runtime's contract (ADR-023 § 5, ADR-030 § 2, ADR-033,
ADR-034 §§ 1-4; ``interchange.md § In-Process``):

* its name is ``"hurray_tensor"``; its pointer a ``HurrayBufferList`` holding one
  ``HurrayBuffer`` per buffer-table entry, in table order, each made by
  ``hurray_buffer_from_ptr`` over the tensor's own bytes (no copy), with the device, sync mode
  and memory class of its buffer handle;
* its context a ``HurrayTensorContext`` carrying the loaded library's
  ``hurray_c_abi_version()`` and our encoded descriptor (:func:`hurray_schema.codec.encode_descriptor`),
  whose owner is the tensor itself;
* each buffer's release callback drops the reference that keeps that buffer's bytes alive, and
  the context's owner release drops the one on the tensor: each runs once, when the consumer
  destroys the list and the context (``buffer-protocol.md``: the receiver releases each handle
  exactly once);
* a capsule nobody consumed (still named ``"hurray_tensor"`` when collected) destroys its list
  and context in its destructor; a consumed one (renamed ``"used_hurray_tensor"``) belongs to
  its consumer, and its destructor does nothing.

The references the callbacks drop are held in one table (:data:`HELD`) under integer tokens
passed as the callbacks' ``void *`` contexts, so a callback never dereferences a Python object
from C.  A token released twice, or one never issued, is counted in :data:`STRAY_RELEASES` and
otherwise ignored (a C callback cannot raise).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Callable, Optional

from ..codec import encode_descriptor
from ..errors import HurraySchemaError
from .native_abi import (
    CAPSULE_DESTRUCTOR, CAPSULE_NAME, CAPSULE_NAME_BUFFER, OWNER_RELEASE, RELEASE_CALLBACK, check, native_abi,
    pythonapi,
)

__all__ = ["export_capsule", "HELD", "STRAY_RELEASES", "buffer_address"]

HELD: dict[int, tuple] = {}
"""token -> (what the token keeps alive, the observer to tell on release or None)."""

STRAY_RELEASES = [0]
"""Releases of a token not (or no longer) in :data:`HELD`: a release that came twice."""

_TOKENS = itertools.count(1)


def _hold(obj, observer) -> int:
    """A new token holding ``obj`` (no lock: ``next`` on the counter and one dict store are atomic
    under the GIL, and a lock could be re-entered by a release that a collection runs here)."""
    token = next(_TOKENS)
    HELD[token] = (obj, observer)
    return token


def _drop(token, held=HELD, stray=STRAY_RELEASES) -> None:
    """Drop the reference ``token`` holds (the default arguments keep the callback working while
    the interpreter shuts down and module globals go)."""
    try:
        entry = held.pop(token or 0, None)
        if entry is None:
            stray[0] += 1
            return
        observer = entry[1]
        if observer is not None:
            observer()
    except BaseException:  # a C callback must not raise
        pass


@RELEASE_CALLBACK
def _release_buffer(_data, context):
    _drop(context)


@OWNER_RELEASE
def _release_owner(owner):
    _drop(owner)


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule, api=pythonapi, name=CAPSULE_NAME):
    """An unconsumed capsule's destructor: destroy its buffer list and its context (each releases
    what it holds); a consumed (renamed) capsule's handles belong to its consumer."""
    try:
        at = api.raw_get_name(capsule)
        if not at or ctypes.string_at(at) != name:
            return
        abi = native_abi()
        listing = ctypes.c_void_p(api.raw_get_pointer(capsule, at))
        context = ctypes.c_void_p(api.raw_get_context(capsule))
        if listing.value:
            abi.buffer_list_destroy(ctypes.byref(listing))
        if context.value:
            abi.tensor_context_destroy(ctypes.byref(context))
    except BaseException:  # a destructor must not raise
        pass


def _keep_forever(*callbacks) -> None:
    """The C side may call these thunks at any time, interpreter shutdown included: they are never freed."""
    for callback in callbacks:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(callback))


_keep_forever(_release_buffer, _release_owner, _capsule_destructor)


def buffer_address(view: memoryview) -> int:
    """The address of a flat byte view's first byte, read-only views included (no copy)."""
    import numpy as np

    if len(view) == 0:
        return 0
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


MIN_BUFFER_ALIGNMENT = 64
"""The least alignment ``hurray_buffer_from_ptr`` accepts for a non-empty buffer (hurray-ffi's
``MIN_BUFFER_ALIGNMENT``; it returns ``HURRAY_ERR_INVALID_LAYOUT`` below it)."""


def _alignment(declared: int) -> int:
    """The alignment a buffer handle declares: the descriptor's buffer-table alignment, raised to
    the ABI's floor of 64.  The ABI takes it as a declaration and does not check the pointer
    (neither does the reference's own ``from_numpy`` export); the bytes are never moved to meet it."""
    return max(int(declared), MIN_BUFFER_ALIGNMENT)


_EMPTY = ctypes.create_string_buffer(64)  # the non-null pointer an empty buffer is handed as


def export_capsule(tensor, *, on_release: Optional[Callable[[], None]] = None):
    """The ``"hurray_tensor"`` capsule of ``tensor`` (a :class:`~hurray_schema.io.tensor.Tensor`),
    its buffers held by pointer, no byte copied.  ``on_release``, when given, is called once for
    each handle released -- each buffer and the context's owner: ``buffer_count + 1`` calls in
    all once a consumer is done (a way to count them)."""
    abi = native_abi()
    desc = tensor.descriptor
    buffers = tensor.buffers
    if len(buffers) != len(desc.buffers):
        raise HurraySchemaError(f"the descriptor declares {len(desc.buffers)} buffers and the tensor holds "
                                f"{len(buffers)}")
    encoded = encode_descriptor(desc)
    listing = ctypes.c_void_p()
    check(abi.buffer_list_new(len(buffers), ctypes.byref(listing)), "hurray_buffer_list_new")
    try:
        for view, handle in zip(buffers, desc.buffers):
            address = buffer_address(view) or ctypes.addressof(_EMPTY)
            token = _hold(view, on_release)
            made = ctypes.c_void_p()
            status = abi.buffer_from_ptr(address, len(view), _alignment(handle.alignment),
                                         int(handle.device_tag), int(handle.sync_mode), int(handle.memory_class),
                                         _release_buffer, token, ctypes.byref(made))
            if status != 0:
                _drop(token)
                check(status, "hurray_buffer_from_ptr")
            status = abi.buffer_list_push(listing, made)
            if status != 0:
                abi.buffer_destroy(made)  # releases the token
                check(status, "hurray_buffer_list_push")
        context = ctypes.c_void_p()
        owner = _hold(tensor, on_release)
        status = abi.tensor_context_new(abi.abi_version, encoded, len(encoded), owner, _release_owner,
                                        ctypes.byref(context))
        if status != 0:
            _drop(owner)
            check(status, "hurray_tensor_context_new")
    except BaseException:
        abi.buffer_list_destroy(ctypes.byref(listing))
        raise
    try:
        capsule = pythonapi.new(listing, CAPSULE_NAME_BUFFER, _capsule_destructor)
    except BaseException:
        abi.tensor_context_destroy(ctypes.byref(context))
        abi.buffer_list_destroy(ctypes.byref(listing))
        raise
    if pythonapi.set_context(capsule, context) != 0:  # the capsule's destructor destroys the list
        abi.tensor_context_destroy(ctypes.byref(context))
        raise HurraySchemaError("PyCapsule_SetContext failed")
    return capsule
