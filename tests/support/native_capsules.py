"""Capsules of the native protocol built by hand, through the hurray-ffi C functions, for tests.

The C ABI is the installed pyhurray's extension module (which exports it), loaded here with its
own ctypes declarations written from ``hurray.h`` -- not through ``hurray_schema.io.native_abi`` --
so a capsule built here tests the consumer from outside.  :class:`ReleaseCounter` is a release
callback that counts its calls; :func:`capsule` builds a ``"hurray_tensor"`` capsule (or a
hostile variant: another name, another ABI version, any descriptor bytes, buffers of any size,
no context, fewer buffers) whose destructor, like the reference's, destroys the list and the
context of a capsule nobody consumed (whatever its name, unless it is ``"used_hurray_tensor"``).
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_P, _PP = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
OWNER_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _library():
    import hurray

    (path,) = glob.glob(os.path.join(os.path.dirname(hurray.__file__), "hurray*.so"))
    lib = ctypes.PyDLL(path)
    declare = {
        "hurray_c_abi_version": (ctypes.c_uint32, []),
        "hurray_buffer_from_ptr": (ctypes.c_int32, [_P, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint8,
                                                    ctypes.c_uint8, ctypes.c_uint8, RELEASE, _P, _PP]),
        "hurray_buffer_list_new": (ctypes.c_int32, [ctypes.c_uint64, _PP]),
        "hurray_buffer_list_push": (ctypes.c_int32, [_P, _P]),
        "hurray_buffer_list_destroy": (ctypes.c_int32, [_PP]),
        "hurray_tensor_context_new": (ctypes.c_int32, [ctypes.c_uint32, _P, ctypes.c_uint64, _P, OWNER_RELEASE, _PP]),
        "hurray_tensor_context_destroy": (ctypes.c_int32, [_PP]),
    }
    for name, (restype, argtypes) in declare.items():
        getattr(lib, name).restype = restype
        getattr(lib, name).argtypes = argtypes
    return lib


LIB = _library()
ABI_VERSION = LIB.hurray_c_abi_version()

_api = ctypes.pythonapi
_new = _api.PyCapsule_New
_new.restype, _new.argtypes = ctypes.py_object, [_P, ctypes.c_char_p, DESTRUCTOR]
_set_context = _api.PyCapsule_SetContext
_set_context.restype, _set_context.argtypes = ctypes.c_int, [ctypes.py_object, _P]
_raw_name = ctypes.PYFUNCTYPE(_P, _P)(("PyCapsule_GetName", _api))
_raw_pointer = ctypes.PYFUNCTYPE(_P, _P, _P)(("PyCapsule_GetPointer", _api))
_raw_context = ctypes.PYFUNCTYPE(_P, _P)(("PyCapsule_GetContext", _api))


@DESTRUCTOR
def _destructor(capsule):
    at = _raw_name(capsule)
    if at and ctypes.string_at(at) == b"used_hurray_tensor":  # its consumer owns the handles
        return
    listing = ctypes.c_void_p(_raw_pointer(capsule, at))
    context = ctypes.c_void_p(_raw_context(capsule))
    LIB.hurray_buffer_list_destroy(ctypes.byref(listing))
    LIB.hurray_tensor_context_destroy(ctypes.byref(context))


_NAMES = {}  # capsule names must outlive their capsules


def _name(name: bytes):
    return _NAMES.setdefault(name, ctypes.create_string_buffer(name))


_KEEP: list = []


class ReleaseCounter:
    """Counts the calls of its two callbacks: ``buffer`` (a buffer's release) and ``owner`` (the
    context's owner release); ``held`` keeps what each buffer's release would free."""

    def __init__(self):
        self.buffers = 0
        self.owners = 0
        self.held: dict[int, object] = {}

        @RELEASE
        def buffer(_data, context):
            self.buffers += 1
            self.held.pop(context or 0, None)

        @OWNER_RELEASE
        def owner(_owner):
            self.owners += 1

        self.buffer, self.owner = buffer, owner
        _KEEP.append((buffer, owner))  # a capsule that outlives its test may still call them


def aligned(data) -> np.ndarray:
    """``data``'s bytes in a new 64-byte-aligned uint8 array."""
    data = bytes(data)
    raw = np.zeros(len(data) + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    array = raw[start:start + len(data)]
    array[:] = np.frombuffer(data, np.uint8)
    return array


def capsule(descriptor: bytes, buffers, counter: ReleaseCounter, *, name: bytes = b"hurray_tensor",
            abi_version: int = ABI_VERSION, context: bool = True):
    """A capsule of ``descriptor`` and ``buffers`` (uint8 arrays, handed by pointer; ``counter``
    holds them until each is released)."""
    listing = ctypes.c_void_p()
    assert LIB.hurray_buffer_list_new(len(buffers), ctypes.byref(listing)) == 0
    for index, array in enumerate(buffers):
        handle = ctypes.c_void_p()
        token = id(array)
        counter.held[token] = array
        assert LIB.hurray_buffer_from_ptr(array.ctypes.data, array.nbytes, 64, 0, 0, 0, counter.buffer, token,
                                          ctypes.byref(handle)) == 0
        assert LIB.hurray_buffer_list_push(listing, handle) == 0
    made = _new(listing, _name(name), _destructor)
    if context:
        ctx = ctypes.c_void_p()
        assert LIB.hurray_tensor_context_new(abi_version, descriptor, len(descriptor), None, counter.owner,
                                             ctypes.byref(ctx)) == 0
        assert _set_context(made, ctx) == 0
    return made


class Producer:
    """An object whose ``__hurray__`` returns what ``make()`` returns (each call, or one fixed capsule)."""

    def __init__(self, make):
        self.make = make

    def __hurray__(self):
        return self.make()
