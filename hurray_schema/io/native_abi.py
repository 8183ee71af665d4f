"""Where the hurray-ffi C ABI comes from, and its functions' ctypes signatures, declared once.

The native protocol (``interchange.md § In-Process``; the reference runtime's ADR-023, ADR-030,
ADR-033 and ADR-034) passes a ``"hurray_tensor"`` PyCapsule whose pointer is a
``HurrayBufferList`` and whose context is a ``HurrayTensorContext``: opaque handles of the
hurray-ffi C ABI (``hurray.h``), read and made only through its functions.  This module finds a
library exporting them -- the shared library named by :data:`LIBRARY_VARIABLE`, else the
extension module of an installed ``pyhurray`` (which exports the whole C ABI) -- loads it on
first use (importing :mod:`hurray_schema` loads nothing), checks that its
``hurray_c_abi_version()`` is one this module's signatures were written for
(:data:`SPOKEN_ABI_VERSIONS`), and declares the signatures.  Without a library,
:func:`native_abi` raises :class:`~hurray_schema.errors.NativeAbiUnavailable`, which says how to
get one.

It also binds the four CPython capsule functions the protocol needs (``PyCapsule_New``,
``PyCapsule_GetName``, ``PyCapsule_GetPointer``, ``PyCapsule_GetContext``...) through
``ctypes.pythonapi``: a capsule is a CPython object, whatever library made its handles.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import threading
from typing import Optional

from ..errors import NativeAbiUnavailable, NativeProtocolError

__all__ = [
    "LIBRARY_VARIABLE", "SPOKEN_ABI_VERSIONS", "CAPSULE_NAME", "USED_CAPSULE_NAME", "HURRAY_OK",
    "RELEASE_CALLBACK", "OWNER_RELEASE", "NativeAbi", "native_abi", "check", "pythonapi",
]

LIBRARY_VARIABLE = "HURRAY_SCHEMA_FFI_LIBRARY"
"""Environment variable naming a shared library that exports the hurray-ffi C ABI (taken before
an installed ``pyhurray``)."""

SPOKEN_ABI_VERSIONS = frozenset({4})
"""The ``HURRAY_C_ABI_VERSION`` values whose functions this module declares (ABI 4 added the
``HurrayTensorContext``, ADR-034 § 6)."""

CAPSULE_NAME = b"hurray_tensor"
USED_CAPSULE_NAME = b"used_hurray_tensor"
"""The capsule names of ADR-033: an unconsumed capsule, and one a consumer took (renamed)."""

HURRAY_OK = 0

_STATUS_NAMES = {
    -1: "HURRAY_ERR_INVALID_MAGIC", -2: "HURRAY_ERR_VERSION_MISMATCH", -3: "HURRAY_ERR_INVALID_LAYOUT",
    -4: "HURRAY_ERR_INVALID_TYPE", -5: "HURRAY_ERR_BUFFER_TOO_SMALL", -6: "HURRAY_ERR_NULL_POINTER",
    -7: "HURRAY_ERR_INTERNAL_PANIC", -8: "HURRAY_ERR_INVALID_SYNC_MODE", -9: "HURRAY_ERR_SYNC_MODE_MISMATCH",
    -10: "HURRAY_ERR_INTERNAL", -11: "HURRAY_ERR_INDEX_OUT_OF_BOUNDS",
}

RELEASE_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
"""``HurrayReleaseCallback``: ``(data, release_context)``, called by ``hurray_buffer_destroy``."""

OWNER_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""``HurrayOwnerReleaseFn``: ``(owner)``, called once by ``hurray_tensor_context_destroy``."""

CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""``PyCapsule_Destructor``: ``(capsule)``."""

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_U8P = ctypes.POINTER(ctypes.c_uint8)
_U32P = ctypes.POINTER(ctypes.c_uint32)
_U64P = ctypes.POINTER(ctypes.c_uint64)

_SIGNATURES = {  # hurray.h, C ABI version 4: name -> (restype, argtypes)
    "hurray_c_abi_version": (ctypes.c_uint32, ()),
    "hurray_buffer_from_ptr": (ctypes.c_int32, (_P, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint8, ctypes.c_uint8,
                                                ctypes.c_uint8, RELEASE_CALLBACK, _P, _PP)),
    "hurray_buffer_destroy": (ctypes.c_int32, (_P,)),
    "hurray_buffer_data_ptr": (ctypes.c_int32, (_P, _PP)),
    "hurray_buffer_byte_size": (ctypes.c_int32, (_P, _U64P)),
    "hurray_buffer_alignment": (ctypes.c_int32, (_P, _U32P)),
    "hurray_buffer_device_tag": (ctypes.c_int32, (_P, _U8P)),
    "hurray_buffer_list_new": (ctypes.c_int32, (ctypes.c_uint64, _PP)),
    "hurray_buffer_list_push": (ctypes.c_int32, (_P, _P)),
    "hurray_buffer_list_len": (ctypes.c_int32, (_P, _U64P)),
    "hurray_buffer_list_get": (ctypes.c_int32, (_P, ctypes.c_uint64, _PP)),
    "hurray_buffer_list_destroy": (ctypes.c_int32, (_PP,)),
    "hurray_tensor_context_new": (ctypes.c_int32, (ctypes.c_uint32, _P, ctypes.c_uint64, _P, OWNER_RELEASE, _PP)),
    "hurray_tensor_context_abi_version": (ctypes.c_int32, (_P, _U32P)),
    "hurray_tensor_context_descriptor": (ctypes.c_int32, (_P, _PP, _U64P)),
    "hurray_tensor_context_destroy": (ctypes.c_int32, (_PP,)),
}


class _PythonApi:
    """The CPython capsule functions, declared once (``ctypes.pythonapi`` holds the GIL across calls)."""

    def __init__(self):
        api = ctypes.pythonapi
        self.new = api.PyCapsule_New
        self.new.restype, self.new.argtypes = ctypes.py_object, (_P, ctypes.c_char_p, CAPSULE_DESTRUCTOR)
        self.is_valid = api.PyCapsule_IsValid
        self.is_valid.restype, self.is_valid.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_char_p)
        self.get_name = api.PyCapsule_GetName
        self.get_name.restype, self.get_name.argtypes = _P, (ctypes.py_object,)
        self.get_pointer = api.PyCapsule_GetPointer
        self.get_pointer.restype, self.get_pointer.argtypes = _P, (ctypes.py_object, _P)
        self.get_context = api.PyCapsule_GetContext
        self.get_context.restype, self.get_context.argtypes = _P, (ctypes.py_object,)
        self.set_context = api.PyCapsule_SetContext
        self.set_context.restype, self.set_context.argtypes = ctypes.c_int, (ctypes.py_object, _P)
        self.set_name = api.PyCapsule_SetName
        self.set_name.restype, self.set_name.argtypes = ctypes.c_int, (ctypes.py_object, _P)
        # the destructor's view of the capsule: a borrowed PyObject* (no reference is taken)
        self.raw_get_name = ctypes.PYFUNCTYPE(_P, _P)(("PyCapsule_GetName", api))
        self.raw_get_pointer = ctypes.PYFUNCTYPE(_P, _P, _P)(("PyCapsule_GetPointer", api))
        self.raw_get_context = ctypes.PYFUNCTYPE(_P, _P)(("PyCapsule_GetContext", api))
        self.err_clear = api.PyErr_Clear
        self.err_clear.restype, self.err_clear.argtypes = None, ()

    def name_of(self, capsule) -> Optional[bytes]:
        """The capsule's name (None for a nameless one)."""
        at = self.get_name(capsule)
        return None if not at else ctypes.string_at(at)


pythonapi = _PythonApi()
"""The CPython capsule functions (:class:`_PythonApi`)."""

# The capsule names are read by pointer for the capsule's whole life: kept here for the process's.
CAPSULE_NAME_BUFFER = ctypes.create_string_buffer(CAPSULE_NAME)
USED_CAPSULE_NAME_BUFFER = ctypes.create_string_buffer(USED_CAPSULE_NAME)


def check(status: int, call: str) -> None:
    """Raise :class:`NativeProtocolError` unless ``status`` is ``HURRAY_OK``."""
    if status != HURRAY_OK:
        raise NativeProtocolError(f"{call} failed: {_STATUS_NAMES.get(status, 'status')} ({status})")


class NativeAbi:
    """A loaded library exporting the hurray-ffi C ABI: its functions as attributes (the names of
    ``hurray.h`` without the ``hurray_`` prefix), its ``path`` and its ``abi_version``."""

    def __init__(self, path: str):
        try:
            # PyDLL: the GIL stays held across every call; a producer's release callbacks touch Python
            # objects (pyhurray's drops its tensor with a bare Py_DECREF)
            library = ctypes.PyDLL(path)
        except OSError as exc:
            raise NativeAbiUnavailable(f"cannot load the hurray-ffi C ABI from {path}: {exc}; "
                                       f"{_HOW_TO_GET_ONE}") from None
        missing = [name for name in _SIGNATURES if not hasattr(library, name)]
        if missing:
            raise NativeAbiUnavailable(f"{path} does not export the hurray-ffi C ABI (no {', '.join(missing)}); "
                                       f"{_HOW_TO_GET_ONE}")
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name[len("hurray_"):], function)
        self.path = path
        self.abi_version = int(self.c_abi_version())
        if self.abi_version not in SPOKEN_ABI_VERSIONS:
            raise NativeAbiUnavailable(
                f"{path} is hurray-ffi C ABI version {self.abi_version}; this library speaks version(s) "
                f"{sorted(SPOKEN_ABI_VERSIONS)} ({_HOW_TO_GET_ONE})")


_HOW_TO_GET_ONE = (f"install pyhurray (pip install pyhurray==0.1.0, whose extension module exports the C ABI), "
                   f"or set {LIBRARY_VARIABLE} to the path of a hurray-ffi shared library (libhurray_ffi.so, "
                   f"built with cargo build -p hurray-ffi --release)")

_LOADED: dict[str, NativeAbi] = {}
_LOCK = threading.Lock()


def _pyhurray_extension() -> Optional[str]:
    """The path of an installed pyhurray's extension module, found without importing pyhurray."""
    try:
        spec = importlib.util.find_spec("hurray")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for pattern in ("hurray*.so", "hurray*.pyd", "hurray*.dylib"):
            found = sorted(glob.glob(os.path.join(folder, pattern)))
            if found:
                return found[0]
    return None


def library_path() -> Optional[str]:
    """Where the C ABI would be loaded from: ``$HURRAY_SCHEMA_FFI_LIBRARY``, else an installed
    pyhurray's extension module, else None."""
    named = os.environ.get(LIBRARY_VARIABLE)
    if named:
        return named
    return _pyhurray_extension()


def native_abi() -> NativeAbi:
    """The hurray-ffi C ABI (:class:`NativeAbi`), loaded on first use from :func:`library_path`;
    :class:`~hurray_schema.errors.NativeAbiUnavailable` when there is none or it is not one this
    module speaks."""
    path = library_path()
    if path is None:
        raise NativeAbiUnavailable(f"the native protocol needs the hurray-ffi C ABI and none was found: "
                                   f"{_HOW_TO_GET_ONE}")
    abi = _LOADED.get(path)
    if abi is None:
        with _LOCK:
            abi = _LOADED.get(path)
            if abi is None:
                abi = _LOADED[path] = NativeAbi(path)
    return abi
