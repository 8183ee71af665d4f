"""Kernels: declared with their C signatures, compiled by numba at their first use (or loaded from
the cache), specialized on compile-time constants; NumPy may stand in until one is worth compiling."""

from __future__ import annotations

import os
import re
import time
from typing import Callable, Optional

import numpy as np

from . import internals
from .cache import _cache
from .lazy import Constants, _compile_lock, _compiled, _loaded, bound
from .loader import _digest, _shared_library
from .signatures import Signature, _ffi


COMPILE_EAGERLY = os.environ.get("HURRAY_SCHEMA_COMPILE", "") == "eager"
"""``HURRAY_SCHEMA_COMPILE=eager``: every kernel compiles at its first use, NumPy never stands in for one
(:meth:`Kernel.worth_it`) -- for a long-lived process that will need the kernels anyway, or to fill
the kernel cache; the test suite runs so, to test the kernels."""


class Kernel:
    """A kernel and its declared C signatures; calling it picks the signature whose array
    dtypes match the arguments (one specialization per declared signature, nothing else)."""

    def __init__(self, pyfunc: Callable, signatures: tuple[str, ...], options: dict, constants: Constants = ()):
        if not signatures:
            raise ValueError("a kernel needs at least one signature")
        self.py_func = pyfunc
        self.constants = constants
        suffix = "".join(f"[{name}={value}]" for name, value in constants)
        self.name = f"{pyfunc.__module__}.{pyfunc.__qualname__}{suffix}"
        self._variants: dict = {}
        self.signatures = [Signature(s) for s in signatures]
        self._options = dict(options)
        self.options = dict(options)
        self.options.setdefault("error_model", "numpy")
        self._functions: dict[int, Callable] = {}
        self._keep: list = []
        positions = [[i for i, _ in sig.arrays] for sig in self.signatures]
        self._array_positions = positions[0] if all(p == positions[0] for p in positions) else None
        self._by_dtypes: dict = {}
        self.deferred_work = 0  # see worth_it
        self.__name__ = pyfunc.__name__
        self.__qualname__ = pyfunc.__qualname__
        self.__doc__ = pyfunc.__doc__
        self.__module__ = pyfunc.__module__

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"

    def variant(self, **constants) -> "Kernel":
        """This kernel compiled with ``constants`` (names of module globals it or its helpers read)
        frozen to the values given: one specialization per distinct set, each with its machine code."""
        key = tuple(sorted(constants.items()))
        made = self._variants.get(key)
        if made is None:
            made = self._variants[key] = Kernel(self.py_func, tuple(s.text for s in self.signatures),
                                                self._options, key)
        return made

    def signature_for(self, args) -> int:
        for index, signature in enumerate(self.signatures):
            if signature.matches(args):
                return index
        got = ", ".join(f"{a.dtype}[{a.ndim}]" if isinstance(a, np.ndarray) else type(a).__name__ for a in args)
        raise TypeError(f"{self.name}: no declared signature takes ({got}); declared: "
                        f"{[s.text for s in self.signatures]}")

    def prepare(self, args) -> tuple[Callable, tuple]:
        """(entry point, its arguments) for a call with ``args``: the signature whose array dtypes they
        have (looked up by those dtypes after the first time), compiled or loaded on first use."""
        key = None
        if self._array_positions is not None:
            try:
                key = tuple([args[i].dtype for i in self._array_positions])
            except (AttributeError, IndexError):
                key = None
        index = self._by_dtypes.get(key)
        if index is None:
            index = self.signature_for(args)
            if key is not None:
                self._by_dtypes[key] = index
        function = self._functions.get(index) or self.function(index)
        return function, self.signatures[index].pack(*args)

    def __call__(self, *args):
        function, packed = self.prepare(args)
        return function(*packed)

    def function(self, index: int) -> Callable:
        """The callable entry point of signature ``index``: loaded from the cache, or compiled."""
        with _compile_lock:
            function = self._functions.get(index) or self._load(index)
            if function is None:
                signature = self.signatures[index]
                start = time.perf_counter()
                address = self._compile(signature)
                _compiled.append((self.name, signature.text, time.perf_counter() - start))
                function = self._functions[index] = _ffi().cast(signature.cdecl, address)
        return function

    def ready(self, index: int = 0) -> bool:
        """Whether signature ``index`` runs without compiling: its machine code is loaded in this process,
        or in the cache (then loaded now).  What a caller asks before a kernel that only speeds up what
        NumPy also does: compiling costs about a second, which a small job never wins back."""
        with _compile_lock:
            return index in self._functions or self._load(index) is not None

    def worth_it(self, work: int, compile_after: int, index: int = 0) -> bool:
        """Whether to run this kernel (rather than the NumPy code computing the same) on ``work`` units:
        yes when its machine code is at hand (:meth:`ready`), or once the work the process gave NumPy
        instead, this job's included, reaches ``compile_after`` units (then it compiles).  For kernels
        that only speed up what NumPy also computes exactly: a one-off job is not worth their compiling
        (about a second), a warm process has them from the cache."""
        if COMPILE_EAGERLY or self.ready(index):
            return True
        self.deferred_work += work
        return self.deferred_work >= compile_after

    def _load(self, index: int) -> Optional[Callable]:
        """Signature ``index`` loaded from the cache (and kept), or None (also with the door to numba's
        internals shut: :mod:`.internals`)."""
        if not internals.door_open():
            return None
        signature = self.signatures[index]
        start = time.perf_counter()
        function = _cache().load(self, signature)
        if function is None:
            return None
        _loaded.append((self.name, signature.text, time.perf_counter() - start))
        self._functions[index] = function
        return function

    def _compile(self, signature: Signature) -> int:
        """The address of signature's entry point, compiled now: through numba's internals (then kept
        in the cache) where :mod:`.internals` allows, else through its public API."""
        if internals.usable():
            with internals.compiling():
                return self._compile_numba(signature)
        return self._compile_public(signature)

    def _entry(self, signature: Signature, carray, **njit_options):
        """The kernel's C entry point for ``signature`` (name, Python function) around its implementation."""
        from numba import njit

        inherited = (("fastmath", frozenset(self.options["fastmath"])),) if self.options.get("fastmath") else ()
        implementation = njit(**njit_options, **self.options)(bound(self.py_func, self.constants, inherited))
        entry_name = "kernel_" + re.sub(r"\W", "_", self.name) + "_" + _digest(signature.text)[:12]
        namespace = {"carray": carray, "implementation": implementation}
        exec(compile(signature.entry_source(entry_name), f"<kernel entry {self.name}>", "exec"), namespace)
        return entry_name, namespace[entry_name]

    def _compile_numba(self, signature: Signature) -> int:
        from numba import cfunc

        entry_name, entry = self._entry(signature, internals.carray(), no_cpython_wrapper=True, _nrt=False)
        with internals.optimized_once(entry_name):
            compiled = cfunc(signature.numba_signature(), nopython=True, error_model="numpy")(entry)
        data, externals, module = internals.object_code(compiled)
        allocating = [name for name in externals if name.startswith(("NRT_MemInfo_alloc", "NRT_Allocate"))]
        if allocating:
            raise RuntimeError(f"kernel {self.name} allocates ({allocating}): pass its scratch arrays in")
        _cache().save(self, signature, data, compiled.native_name, externals, _shared_library(module))
        self._keep.append(compiled)  # its code lives as long as the compiled object
        return compiled.address

    def _compile_public(self, signature: Signature) -> int:
        """Signature compiled through numba's public API only (``njit``, ``cfunc``, ``carray``): the same
        kernel, slower to compile, not cached."""
        from numba import carray, cfunc

        _, entry = self._entry(signature, carray)
        compiled = cfunc(signature.numba_signature(), nopython=True, error_model="numpy")(entry)
        self._keep.append(compiled)
        return compiled.address


def kernel(*signatures: str, **options):
    """Declare a kernel compiled for each of ``signatures`` (numba ``njit`` ``options``:
    ``fastmath=...``); see the module docstring."""

    def wrap(pyfunc):
        return Kernel(pyfunc, signatures, options)

    return wrap
