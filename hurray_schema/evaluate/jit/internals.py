"""The one door to numba's, llvmlite's and cffi's private parts.

Compiling a kernel fast and keeping its machine code reach below those libraries' public APIs: the
C-array intrinsic behind ``numba.carray``, numba's code libraries (only a kernel's entry optimized and
turned into machine code), its registries of implementations (only those kernels use), its BLAS probe,
the object code of a compiled function, and cffi's backend (an FFI without a C parser, and
``load_library``).  Every such use is here, and is taken only while the door is open (:func:`usable`):

* ``HURRAY_SCHEMA_NUMBA_INTERNALS=0`` shuts it (no warning);
* a numba outside the tested range -- this package's declared bounds on numba, read from its metadata --
  shuts it with one warning naming numba and its version;
* so does a failed probe (:func:`_probe`: every private attribute used is there), run before the
  first compilation.

With the door shut, kernels compile through numba's public API (``njit``, ``cfunc``, ``carray``) and are
called through cffi's public ``FFI``; the kernel cache is neither read nor written (its machine code is
taken from numba's internals).  The same bits, slower to start.  The patches below are applied with
numba's compiler lock held, so a user compiling numba code on another thread never meets them.

One use has no public equivalent and is taken in both modes: numba's CPU typing context, which types
the stand-ins of helpers a kernel meets (:func:`numba_type_of`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

__all__ = ["door_open", "usable", "ffi", "load_library", "carray", "compiling", "optimized_once", "object_code",
           "numba_type_of", "ENTRY_PREFIX"]


def _version(text: str) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@functools.cache
def tested_numba() -> Optional[tuple]:
    """``(lowest, highest)`` numba version this package declares (``>=`` / ``<=`` in its requirements),
    None when its metadata is not at hand."""
    import importlib.metadata  # email, csv, zipfile...: a kernel's compilation needs it, a read does not

    try:
        requirements = importlib.metadata.requires("hurray_schema") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        if name and name.group(0).lower() == "numba":
            low = re.search(r">=\s*([\d.]+)", requirement)
            high = re.search(r"<=\s*([\d.]+)", requirement)
            if low and high:
                return _version(low.group(1)), _version(high.group(1))
    return None


@functools.cache
def door_open() -> bool:
    """Whether the switch leaves the private parts usable (``HURRAY_SCHEMA_NUMBA_INTERNALS``): what a
    process that only loads cached kernels asks (cached machine code was compiled through the open door,
    under the numba version in the cache's key)."""
    return os.environ.get("HURRAY_SCHEMA_NUMBA_INTERNALS", "1") != "0"


_checked: list = []


def usable() -> bool:
    """Whether a kernel compiles through the private parts: :func:`door_open`, numba's version in the
    tested range and the probe passed -- else one warning (module docstring).  Asked when compiling."""
    if not _checked:
        _checked.append(door_open() and _in_range() and _probed())
    return _checked[0]


def _in_range() -> bool:
    import importlib.metadata

    tested = tested_numba()
    try:
        installed = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return False
    if tested is not None and not tested[0] <= _version(installed) <= tested[1]:
        _shut(f"numba {installed} is outside the tested range "
              f"{'.'.join(map(str, tested[0]))} to {'.'.join(map(str, tested[1]))}")
        return False
    return True


def _probed() -> bool:
    import importlib.metadata

    missing = _probe()
    if missing:
        _shut(f"numba {importlib.metadata.version('numba')} lacks {missing}")
    return not missing


def _shut(why: str) -> None:
    warnings.warn(f"hurray_schema: {why}; kernels are compiled through numba's public API (slower to start, "
                  "same results) and not cached", RuntimeWarning, stacklevel=3)


def _probe() -> Optional[str]:
    """The first private part this module uses that the installed numba, llvmlite or cffi lacks, else None."""
    try:
        import _cffi_backend
        from numba.core import codegen, compiler_lock, cpu
        from numba.core.typing import context as typing_context
        from numba.np import arrayobj
    except ImportError as exc:
        return str(exc)
    wanted = [(_cffi_backend, "FFI"), (_cffi_backend, "load_library"), (arrayobj, "get_cfarray_intrinsic"),
              (codegen.CPUCodeLibrary, "_optimize_final_module"), (codegen.CPUCodeLibrary, "_finalize_final_module"),
              (codegen.CPUCodeLibrary, "serialize_using_object_code"), (codegen.JITCPUCodegen, "set_env"),
              (cpu.CPUContext, "load_additional_registries"),
              (typing_context.Context, "load_additional_registries"), (compiler_lock, "global_compiler_lock")]
    for owner, name in wanted:
        if not hasattr(owner, name):
            return f"{getattr(owner, '__name__', owner)}.{name}"
    return None


# ------------------------------------------------------------------------------------
# cffi
# ------------------------------------------------------------------------------------

@functools.cache
def ffi():
    """cffi's FFI: the backend's own where the door is open and it has one (no C parser: a few
    microseconds to set up, no pycparser), else cffi's public one; calls through either release the GIL."""
    if door_open():
        try:
            import _cffi_backend

            return _cffi_backend.FFI()
        except (ImportError, AttributeError):
            pass
    import cffi

    return cffi.FFI()


def load_library(path: str, flags: int):
    """cffi's backend loading a shared library (``dlopen``) whose functions :func:`ffi` types."""
    import _cffi_backend

    return _cffi_backend.load_library(path, flags)


# ------------------------------------------------------------------------------------
# numba
# ------------------------------------------------------------------------------------

@contextlib.contextmanager
def compiling():
    """While a kernel compiles: numba's compiler lock held, its type system set up for kernels
    (:func:`_initialize_numba`) and only the registries kernels use installed (:func:`_kernel_registries`)."""
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        _initialize_numba()
        with _kernel_registries():
            yield


def numba_type_of(value):
    """numba's type of ``value`` (its CPU typing context, refreshed), for a stand-in's ``_numba_type_``."""
    from numba.core.registry import cpu_target

    context = cpu_target.typing_context
    context.refresh()
    return context.resolve_value_type(value)


def object_code(compiled) -> tuple[bytes, list, object]:
    """``(object code, the symbols it needs, its LLVM module)`` of a compiled ``cfunc``."""
    library = compiled._library
    module = library._final_module
    externals = sorted({f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm.")}
                       | {g.name for g in module.global_variables if g.is_declaration})
    return library.serialize_using_object_code()[2][0], externals, module


@functools.cache
def carray():
    """numba's intrinsic behind ``numba.carray`` (C order, the pointer's dtype), called by the entry points
    directly: ``carray`` itself is an overload whose implementation numba compiles as a function of its
    own for every array type of every kernel."""
    from numba.np.arrayobj import get_cfarray_intrinsic

    return get_cfarray_intrinsic("C", None)


@contextlib.contextmanager
def optimized_once(entry: str):
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


