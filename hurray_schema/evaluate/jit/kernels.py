"""Kernels: declared with their C signatures, compiled by numba at their first use (or loaded from
the cache), specialized on compile-time constants; NumPy may stand in until one is worth compiling."""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

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
        """Signature ``index`` loaded from the cache (and kept), or None."""
        signature = self.signatures[index]
        start = time.perf_counter()
        function = _cache().load(self, signature)
        if function is None:
            return None
        _loaded.append((self.name, signature.text, time.perf_counter() - start))
        self._functions[index] = function
        return function

    def _compile(self, signature: Signature) -> int:
        with _kernel_registries():
            return self._compile_numba(signature)

    def _compile_numba(self, signature: Signature) -> int:
        _initialize_numba()
        from numba import cfunc, njit

        inherited = (("fastmath", frozenset(self.options["fastmath"])),) if self.options.get("fastmath") else ()
        implementation = njit(no_cpython_wrapper=True, _nrt=False, **self.options)(
            bound(self.py_func, self.constants, inherited))
        entry_name = "kernel_" + re.sub(r"\W", "_", self.name) + "_" + _digest(signature.text)[:12]
        namespace = {"carray": _carray(), "implementation": implementation}
        exec(compile(signature.entry_source(entry_name), f"<kernel entry {self.name}>", "exec"), namespace)
        with _optimized_once(entry_name):
            compiled = cfunc(signature.numba_signature(), nopython=True, error_model="numpy")(namespace[entry_name])
        library = compiled._library
        module = library._final_module
        externals = sorted({f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm.")}
                           | {g.name for g in module.global_variables if g.is_declaration})
        allocating = [name for name in externals if name.startswith(("NRT_MemInfo_alloc", "NRT_Allocate"))]
        if allocating:
            raise RuntimeError(f"kernel {self.name} allocates ({allocating}): pass its scratch arrays in")
        _cache().save(self, signature, library.serialize_using_object_code()[2][0], compiled.native_name, externals,
                      _shared_library(module))
        self._keep.append(compiled)  # its code lives as long as the compiled object
        return compiled.address


@functools.cache
def _carray():
    """numba's intrinsic behind ``numba.carray`` (C order, the pointer's dtype), called by the entry points
    directly: ``carray`` itself is an overload whose implementation numba compiles as a function of its
    own for every array type of every kernel."""
    from numba.np.arrayobj import get_cfarray_intrinsic

    return get_cfarray_intrinsic("C", None)


@contextlib.contextmanager
def _optimized_once(entry: str):
    """While a kernel compiles, only its entry's library (into which numba links every helper the kernel
    calls) is optimized and turned into machine code: the helpers' own libraries are kept as IR to be
    linked in.  numba would run LLVM's full pipeline and code generation on each helper, then again on
    each caller it is linked into -- once per level of calls -- for machine code that is thrown away.
    The entry's helpers are made internal to its module first (:func:`_internalize_helpers`).  (A helper's
    IR still gets LLVM's function passes as it is added: without them the entry's module pipeline makes
    other machine code, about a tenth fewer instructions in a quantize kernel, of no known speed.)"""
    from numba.core import codegen

    library, jit_codegen = codegen.CPUCodeLibrary, codegen.JITCPUCodegen
    optimize, finalize, set_env = library._optimize_final_module, library._finalize_final_module, jit_codegen.set_env

    def optimize_entry_only(self):
        if self.name == entry:
            _internalize_helpers(self._final_module)
            optimize(self)

    def finalize_entry_only(self):
        if self.name == entry:
            return finalize(self)
        self._finalize_dynamic_globals()
        self._finalized = True  # kept as IR: no module added to numba's engine, no machine code

    def set_env_if_compiled(self, env_name, env):
        if self._engine.get_global_value_address(env_name):  # a helper's environment: it has no machine code
            set_env(self, env_name, env)

    library._optimize_final_module, library._finalize_final_module = optimize_entry_only, finalize_entry_only
    jit_codegen.set_env = set_env_if_compiled
    try:
        yield
    finally:
        library._optimize_final_module, library._finalize_final_module = optimize, finalize
        jit_codegen.set_env = set_env


ENTRY_PREFIX = "cfunc."
"""numba's name prefix of a C entry point: the one function of a kernel's machine code that others call."""


def _internalize_helpers(module) -> None:
    """Give every function a kernel's module defines, but its C entry point, internal linkage.

    numba names a helper by its qualified name, its argument types and a counter of the compiling
    process, and emits it as a weak definition; helpers specialized on a kernel's compile-time
    constants (``OUT=1`` and ``OUT=2`` of one helper) can so get one name, with different code, in
    two processes.  Loaded into one engine, the second kernel would call the first one's helper
    (a weak definition already known is not taken again).  Internal helpers are the kernel's own;
    LLVM may also inline or drop them."""
    for function in module.functions:
        if not function.is_declaration and not function.name.startswith(ENTRY_PREFIX):
            function.linkage = "internal"


@contextlib.contextmanager
def _kernel_registries():
    """While a kernel compiles, numba sets up (and refreshes, before every function it compiles) only the
    implementations kernels use: numbers, tuples, ranges, arrays, NumPy scalars and ufuncs, math.
    Left out: its random generators, typed containers, unicode operations, polynomials, jitclasses,
    cffi typing (which imports pycparser) and third-party extensions found through entry points (a
    scan of every installed package's metadata).  Restored afterwards: other numba code compiled later
    in the process gets all of them then (numba installs registries as they appear)."""
    from numba.core import cpu
    from numba.core.typing import context as typing_context

    implementations = cpu.CPUContext.load_additional_registries
    declarations = typing_context.Context.load_additional_registries
    cpu.CPUContext.load_additional_registries = _load_kernel_implementations
    typing_context.Context.load_additional_registries = _load_kernel_declarations
    try:
        yield
    finally:
        cpu.CPUContext.load_additional_registries = implementations
        typing_context.Context.load_additional_registries = declarations


def _load_kernel_implementations(context) -> None:
    """The part of ``numba.core.cpu.CPUContext.load_additional_registries`` kernels need."""
    from numba.core.runtime import rtsys

    rtsys.initialize(context)
    from numba.core import inline_closurecall, optional  # noqa: F401  (registering imports)
    from numba.cpython import (builtins, cmathimpl, enumimpl, hashing, iterators, mathimpl, numbers,  # noqa: F401
                               printimpl, rangeobj, slicing, tupleobj)
    from numba.misc import literal  # noqa: F401
    from numba.np import arraymath, arrayobj, npyimpl  # noqa: F401
    from numba.np.unsafe import ndarray  # noqa: F401

    for module in (cmathimpl, mathimpl, npyimpl, printimpl):
        context.install_registry(module.registry)


def _load_kernel_declarations(context) -> None:
    """The part of ``numba.core.typing.context.Context.load_additional_registries`` kernels need."""
    from numba.core.typing import cmathdecl, enumdecl, mathdecl, npydecl

    for module in (cmathdecl, enumdecl, mathdecl, npydecl):
        context.install_registry(module.registry)


class _NoLinearAlgebra(importlib.abc.MetaPathFinder):
    """Refuses ``scipy.linalg`` to one thread (the one setting numba up), as if it were not installed."""

    def __init__(self, thread: int):
        self.thread = thread

    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == self.thread and (name == "scipy.linalg" or name.startswith("scipy.linalg.")):
            raise ModuleNotFoundError(f"{name} is imported when numba code needs it", name=name)
        return None


def _initialize_numba() -> None:
    """Set numba's type system up for the first compilation, without the import of ``scipy.linalg``
    (0.3 s) its set-up does only to learn whether BLAS is there: the import is refused to the
    setting-up thread, then numba is told what it would have learnt.  BLAS itself is imported when
    numba code first needs it (numba's linear algebra imports it there); no kernel does."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return  # set up already, or nothing to save
    blocker = _NoLinearAlgebra(threading.get_ident())
    sys.meta_path.insert(0, blocker)
    try:
        from numba.core.registry import cpu_target

        cpu_target.target_context.refresh()
        cpu_target.typing_context.refresh()
    finally:
        sys.meta_path.remove(blocker)
    arraymath = sys.modules.get("numba.np.arraymath")
    if arraymath is not None and _scipy_has_blas():
        arraymath._HAVE_BLAS = True


def _scipy_has_blas() -> bool:
    """Whether ``scipy.linalg.cython_blas`` is installed (numba's test for BLAS), without importing scipy."""
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(Path(folder, "linalg").glob("cython_blas*") for folder in spec.submodule_search_locations)


def kernel(*signatures: str, **options):
    """Declare a kernel compiled for each of ``signatures`` (numba ``njit`` ``options``:
    ``fastmath=...``); see the module docstring."""

    def wrap(pyfunc):
        return Kernel(pyfunc, signatures, options)

    return wrap
