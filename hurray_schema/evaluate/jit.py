"""Kernels: compiled by numba once, kept as machine code, loaded without numba.

A kernel is a Python function in numba's nopython subset, declared with the C signatures it
is compiled for (:func:`kernel`).  The first call of a signature looks in the kernel cache
(:func:`cache_dir`) for its machine code:

* found -- the kernel's shared library is loaded by the system's dynamic loader (where the
  compiling process could link one: :func:`_shared_library`), else its object code by llvmlite's
  MCJIT, and called through cffi: neither numba nor (with a shared library) LLVM is loaded, so a
  warm process pays about a millisecond per kernel, not the second numba takes to set up;
* not found -- numba compiles the function (``nopython``, ``error_model="numpy"``: no
  kernel raises) behind a C entry point that takes each array as a pointer and its extents,
  and the object code (and a shared library of it) is written to the cache for later processes.

A kernel that only speeds up what NumPy computes exactly may let NumPy do a small job while its
machine code is not at hand (:meth:`Kernel.worth_it`): compiling costs a second or two.

Helpers called by kernels (:func:`helper`) and llvmlite intrinsics (:func:`intrinsic`) are
declared the same lazy way: nothing of numba is imported until a kernel is compiled.  A kernel
never allocates (its scratch arrays are passed in) and never raises (errors are returned as
codes), so its machine code needs no numba runtime: the few runtime symbols numba's C entry
point names on its exception path are given trap stubs (:class:`_Engine`), since that path is
never taken.

A kernel is specialized on compile-time constants (:meth:`Kernel.variant`): module globals such
as the output type, which numba freezes, so that each variant's machine code holds only its own
branches and compiles only the helpers they call (:func:`bound`).  While a kernel compiles, only
its entry is optimized and turned into machine code (:func:`_optimized_once`).

Parallel kernels take a work array (:func:`run_parallel`): threads of a shared pool each run
the kernel, which claims units of work (runs of rows) with an atomic counter
(:func:`claim`), so a thread slowed by other load on the machine takes fewer units.  The
kernels' calls release the GIL.  :func:`threads` is the number of threads (``NUMBA_NUM_THREADS``
or the CPUs this process may use), :func:`thread_limit` lowers it for the calling thread.

The cache key covers the sources of this package's evaluator, the numba, llvmlite and Python
versions and the host CPU (numba compiles for it; named by ``/proc/cpuinfo`` where there is one):
a changed kernel, a new numba or another CPU compiles anew.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.abc
import importlib.util
import json
import os
import re
import sys
import tempfile
import threading
import _thread
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from ..codecache import cache_root
from ..private_folder import open_private, open_private_file, read_private, still_private, write_private

__all__ = ["kernel", "helper", "intrinsic", "choose", "bound", "Kernel", "run_parallel", "claim", "claim_span", "slot",
           "unit_span", "Scratch", "search_left", "search_right", "threads", "set_threads", "thread_limit", "cache_dir",
           "numba_loaded", "compile_count", "timings", "host_has"]


# ------------------------------------------------------------------------------------
# Signatures: "i64(u8[:], i64, f32[:, :])"
# ------------------------------------------------------------------------------------

_SCALARS = {
    "i8": ("int8_t", "int8"), "u8": ("uint8_t", "uint8"), "i16": ("int16_t", "int16"),
    "u16": ("uint16_t", "uint16"), "i32": ("int32_t", "int32"), "u32": ("uint32_t", "uint32"),
    "i64": ("int64_t", "int64"), "u64": ("uint64_t", "uint64"), "f32": ("float", "float32"),
    "f64": ("double", "float64"), "b1": ("_Bool", "boolean"),
}
"""Type codes: (C type of the entry point's parameter, numba / NumPy name)."""
_RETURNS = {"void": "void", "i64": "int64_t", "f64": "double"}
_ARGUMENT = re.compile(r"^(\w+)(\[(:(?:\s*,\s*:)*)\])?$")


class Argument:
    """One parameter: a scalar (``i64``) or a C-contiguous array (``f32[:]``, ``u8[:, :]``)."""

    __slots__ = ("code", "ndim", "dtype", "ctype")

    def __init__(self, text: str):
        match = _ARGUMENT.match(text.strip())
        if match is None or match.group(1) not in _SCALARS:
            raise ValueError(f"kernel argument {text!r}: expected a type code of {sorted(_SCALARS)}, "
                             f"optionally followed by [:] or [:, :]")
        self.code = match.group(1)
        self.ndim = match.group(3).count(":") if match.group(2) else 0
        self.dtype = np.dtype(_SCALARS[self.code][1] if self.code != "b1" else np.bool_)
        self.ctype = _SCALARS[self.code][0]

    def numba_type(self):
        from numba import types

        scalar = getattr(types, _SCALARS[self.code][1])
        return types.CPointer(scalar) if self.ndim else scalar


class Signature:
    """A kernel's C signature: return type (``void``, ``i64`` or ``f64``) and arguments.  Its entry
    point takes each array as a pointer and its extents (``cdecl``); :meth:`pack` makes those of
    a call's arguments."""

    __slots__ = ("text", "returns", "arguments", "arrays", "cdecl", "pack")

    def __init__(self, text: str):
        head, _, rest = text.strip().partition("(")
        if head not in _RETURNS or not rest.endswith(")"):
            raise ValueError(f"kernel signature {text!r}: expected 'void|i64|f64(arguments)'")
        self.text = re.sub(r"\s+", "", text)
        self.returns = head
        body = rest[:-1].strip()
        self.arguments = [Argument(a) for a in _split(body)] if body else []
        self.arrays = [(i, a) for i, a in enumerate(self.arguments) if a.ndim]
        parameters = []
        for a in self.arguments:
            parameters += ["void *"] + ["int64_t"] * a.ndim if a.ndim else [a.ctype]
        self.cdecl = f"{_RETURNS[head]}(*)({', '.join(parameters) or 'void'})"
        self.pack = self._first_pack

    def matches(self, args) -> bool:
        for i, a in self.arrays:
            value = args[i]
            if not isinstance(value, np.ndarray) or value.dtype != a.dtype or value.ndim != a.ndim:
                return False
        return True

    def _first_pack(self, *args):
        self.pack = self._packer()
        return self.pack(*args)

    def _packer(self) -> Callable:
        """A function of the call's arguments giving the entry point's: each array as the address of its
        buffer (``ffi.from_buffer``: refuses an array that is not C-contiguous) and its extents --
        generated, since a loop over the arguments would cost more than the call."""
        names = [f"a{i}" for i in range(len(self.arguments))]
        parts, checks = [], []
        for name, a in zip(names, self.arguments):
            if a.ndim:
                checks.append(f"{name}.ndim != {a.ndim}")
                parts.append(f"buffer({name})")
                parts.extend(f"{name}.shape[{k}]" for k in range(a.ndim))
            else:
                parts.append(name)
        check = (f"    if {' or '.join(checks)}:\n        raise TypeError('kernel array of the wrong rank')\n"
                 if checks else "")
        source = (f"def pack({', '.join(names)}):\n{check}"
                  f"    return ({', '.join(parts)}{',' if len(parts) == 1 else ''})\n")
        namespace = {"buffer": _ffi().from_buffer}
        exec(compile(source, f"<kernel arguments {self.text}>", "exec"), namespace)
        return namespace["pack"]

    def entry_source(self, name: str) -> str:
        """Python source of the C entry point: arrays rebuilt from (pointer, extents), then the kernel."""
        params, call = [], []
        for i, a in enumerate(self.arguments):
            if a.ndim:
                extents = [f"n{i}_{k}" for k in range(a.ndim)]
                params += [f"p{i}"] + extents
                call.append(f"carray(p{i}, ({', '.join(extents)},))")
            else:
                params.append(f"a{i}")
                call.append(f"a{i}")
        invoke = f"implementation({', '.join(call)})"
        body = f"    {invoke}\n" if self.returns == "void" else f"    return {invoke}\n"
        return f"def {name}({', '.join(params)}):\n{body}"

    def numba_signature(self):
        from numba import types

        returns = {"void": types.void, "i64": types.int64, "f64": types.float64}[self.returns]
        entry = []
        for a in self.arguments:
            entry.append(a.numba_type())
            entry.extend([types.int64] * a.ndim)
        return returns(*entry)


@functools.cache
def _ffi():
    """cffi's FFI without its C parser (the backend's own: a few microseconds to set up, no pycparser);
    calls through it release the GIL."""
    import _cffi_backend

    return _cffi_backend.FFI()


def _split(body: str) -> list[str]:
    """Arguments separated by commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return parts


# ------------------------------------------------------------------------------------
# Numba, imported only to compile
# ------------------------------------------------------------------------------------

_compile_lock = threading.RLock()


def numba_loaded() -> bool:
    """Whether numba has been imported in this process (by a compilation, or by the user)."""
    return "numba" in sys.modules


_compiled: list = []
_loaded: list = []


def compile_count() -> int:
    """How many kernel signatures this process compiled (rather than loaded from the cache)."""
    return len(_compiled)


def timings() -> dict:
    """What this process spent on kernels: ``{"compiled": [(kernel, signature, seconds)], "loaded":
    [(kernel, signature, seconds)]}`` (loading includes setting up the engine for the first one)."""
    return {"compiled": list(_compiled), "loaded": list(_loaded)}


Constants = tuple
"""Compile-time constants of a specialization: ``((name, value), ...)`` sorted by name."""


class _Lazy:
    """A numba object (a jitted helper, an intrinsic) made on first use by a compilation;
    numba types the stand-in through ``_numba_type_``.  ``make(constants)`` builds the object for a
    set of compile-time constants (helpers are specialized on them; other objects ignore them)."""

    def __init__(self, make: Callable, pyfunc: Callable):
        self._make = make
        self._real: dict = {}
        self.py_func = pyfunc
        self.__name__ = pyfunc.__name__
        self.__qualname__ = pyfunc.__qualname__
        self.__doc__ = pyfunc.__doc__
        self.__module__ = pyfunc.__module__

    def real(self, constants: Constants = (), inherited: Constants = ()):
        """The numba object for ``constants``; a helper also takes the calling kernel's ``inherited``
        compile options (its fast-math flags: what numba's inlining used to give the helper's code)."""
        key = (constants, inherited)
        made = self._real.get(key)
        if made is None:
            made = self._real[key] = self._make(constants, inherited)
        return made

    @property
    def _numba_type_(self):
        from numba.core.registry import cpu_target

        real = self.real()
        context = cpu_target.typing_context
        context.refresh()
        return context.resolve_value_type(real)

    def __call__(self, *args, **kwargs):
        """Called from Python: the Python function itself (a one-off; nothing is compiled)."""
        return self.py_func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<lazy numba {self.__module__}.{self.__qualname__}>"


def _names(code) -> set:
    """Global names a code object (and the code objects nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def bound(pyfunc: Callable, constants: Constants = (), inherited: Constants = ()) -> Callable:
    """``pyfunc`` whose globals give numba the real objects behind the lazy stand-ins it calls (so
    that numba can inline them) and ``constants`` in place of the module's values of those names
    (numba freezes globals: branches on them are pruned before typing)."""
    import types as pytypes

    used = _names(pyfunc.__code__)
    scope = dict(pyfunc.__globals__)
    for name in used:
        value = scope.get(name)
        if isinstance(value, _Lazy):
            scope[name] = value.real(constants, inherited)
    for name, value in constants:
        if name in used:
            scope[name] = value
    function = pytypes.FunctionType(pyfunc.__code__, scope, pyfunc.__name__, pyfunc.__defaults__,
                                    pyfunc.__closure__)
    suffix = "".join(f"_{name}{value}" for name, value in constants if name in used)
    suffix += "_fastmath" if dict(inherited).get("fastmath") else ""
    function.__qualname__ = pyfunc.__qualname__ + suffix  # distinct machine-code symbols per specialization
    function.__module__ = pyfunc.__module__
    function.__doc__ = pyfunc.__doc__
    return function


HELPER_INLINE = "never"
"""numba's ``inline`` option of helpers.  "never": each helper is compiled once per signature (and
set of constants) and LLVM inlines it into its callers -- the same machine code as numba's
inlining, whose cost grows with every call site it types again (a kernel of nested helpers
took several times longer to compile inlined)."""


def helper(fn: Optional[Callable] = None, **options):
    """A function kernels call (numba ``njit`` with ``options``: ``inline`` defaults to
    :data:`HELPER_INLINE`, ``error_model`` to ``"numpy"``, ``forceinline`` to True -- LLVM inlines it
    into every caller, as a hot loop needs: a call per block passing arrays by value costs more
    than the block), compiled with the kernel that calls it."""
    options.setdefault("error_model", "numpy")
    options.setdefault("nogil", True)
    options.setdefault("inline", HELPER_INLINE)
    options.setdefault("forceinline", True)
    options.setdefault("_nrt", False)  # kernels never allocate: no reference counts to keep
    options.setdefault("no_cpython_wrapper", True)  # called from kernels only: no wrapper to compile

    def wrap(pyfunc):
        def make(constants, inherited):
            from numba import njit

            merged = {**options}
            if "fastmath" not in options and dict(inherited).get("fastmath"):
                merged["fastmath"] = set(dict(inherited)["fastmath"])
            return njit(**merged)(bound(pyfunc, constants, inherited))

        return _Lazy(make, pyfunc)

    return wrap(fn) if fn is not None else wrap


def intrinsic(pyfunc: Callable):
    """A numba ``@intrinsic`` (LLVM IR written with llvmlite), made when a kernel is compiled."""
    made = []

    def make(constants, inherited):
        if not made:
            from numba.extending import intrinsic as numba_intrinsic

            made.append(numba_intrinsic(pyfunc))
        return made[0]

    return _Lazy(make, pyfunc)


def choose(pick: Callable[[], "_Lazy"], pyfunc: Callable):
    """A helper that is one of several, picked when first compiled (``pick()`` returns it): a
    host-dependent implementation, chosen without importing anything at import time."""
    return _Lazy(lambda constants, inherited: pick().real(constants, inherited), pyfunc)


@functools.cache
def host_features() -> dict:
    """The host CPU's features as LLVM names them (numba compiles for the host)."""
    import llvmlite.binding as llvm

    configured = os.environ.get("NUMBA_CPU_FEATURES")
    if configured:
        return {f[1:]: f[0] == "+" for f in configured.split(",") if f}
    return dict(llvm.get_host_cpu_features())


_FLAGS_NAMED_AS_LLVM = frozenset({"f16c", "fma", "avx", "avx2", "avx512f", "avx512bw", "avx512vl", "bmi2"})
"""x86 features ``/proc/cpuinfo`` lists under LLVM's own names."""


@functools.cache
def host_has(feature: str) -> bool:
    """Whether the host CPU has ``feature`` (``"f16c"``, ``"avx2"``, ...): from ``/proc/cpuinfo`` where it
    names the feature as LLVM does (no LLVM loaded to answer), else from LLVM; asked once per feature
    (the evaluator asks on every region read)."""
    if feature in _FLAGS_NAMED_AS_LLVM and not os.environ.get("NUMBA_CPU_FEATURES"):
        flags = _cpuinfo_flags()
        if flags is not None:
            return feature in flags
    return bool(host_features().get(feature, False))


@functools.cache
def _first_cpu() -> tuple[str, ...]:
    """The lines of ``/proc/cpuinfo`` that describe its first processor (none where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    return tuple(text.split("\n\n", 1)[0].splitlines())


def _cpuinfo_flags() -> Optional[frozenset]:
    """The x86 feature flags of the first processor in ``/proc/cpuinfo``, or None."""
    for line in _first_cpu():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return None


# ------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------
# Threads
# ------------------------------------------------------------------------------------

_thread_setting = [0]
_local = threading.local()
_pool_lock = threading.Lock()


@functools.cache
def _default_threads() -> int:
    configured = os.environ.get("NUMBA_NUM_THREADS")
    if configured:
        return max(1, int(configured))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def threads() -> int:
    """Threads a parallel kernel runs on from the calling thread."""
    limit = getattr(_local, "limit", None)
    count = _thread_setting[0] or _default_threads()
    return min(count, limit) if limit else count


def set_threads(count: int) -> None:
    """Set the threads of parallel kernels for the whole process (``0``: the default)."""
    if count < 0:
        raise ValueError("thread count must be >= 0")
    _thread_setting[0] = int(count)


@contextlib.contextmanager
def thread_limit(count: int):
    """At most ``count`` threads for the parallel kernels the calling thread runs inside the block."""
    previous = getattr(_local, "limit", None)
    _local.limit = max(1, int(count)) if previous is None else max(1, min(previous, int(count)))
    try:
        yield
    finally:
        _local.limit = previous


class _Worker:
    """A kernel thread: it waits on a lock of its own for a call, runs it (the call releases the GIL),
    then releases a second lock.  Two plain locks wake a thread sooner than a pool's queue and
    futures (about 0.1 ms against 0.15 ms, with rarer stalls), which a kernel of a few milliseconds
    feels."""

    def __init__(self):
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._call: Optional[tuple] = None
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._loop, name="hurray-kernel", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            function, packed = self._call
            try:
                function(*packed)
            except BaseException as error:  # handed to the caller by wait()
                self._error = error
            self._done.release()

    def start(self, function: Callable, packed: tuple) -> None:
        self._call = (function, packed)
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()
        self._call = None
        error, self._error = self._error, None
        if error is not None:
            raise error


_idle: list = []
"""Kernel threads waiting for a call; a call takes what it needs and gives them back."""
_started = [0]
"""Kernel threads started in this process (idle or busy)."""


def _pool_size() -> int:
    """Kernel threads the process keeps at most: the helpers of one call on every thread the process is
    set to use (:func:`set_threads`, else the default); a larger earlier setting keeps its threads."""
    return (_thread_setting[0] or _default_threads()) - 1


def _take_workers(count: int) -> list:
    """Up to ``count`` kernel threads: idle ones first, then new ones while the pool has room.  Callers
    running at the same time share the pool: one whose share is taken gets fewer (or none) and runs
    its units on fewer threads."""
    with _pool_lock:
        taken = [_idle.pop() for _ in range(min(count, len(_idle)))]
        new = max(0, min(count - len(taken), _pool_size() - _started[0]))
        _started[0] += new
    return taken + [_Worker() for _ in range(new)]


def _give_back(workers: list) -> None:
    with _pool_lock:
        _idle.extend(workers)


def _forget_pool() -> None:
    """In a forked child the parent's kernel threads do not exist: start new ones when needed."""
    global _pool_lock
    _pool_lock = threading.Lock()
    _idle.clear()
    _started[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


WORK_NEXT, WORK_UNITS, WORK_SLOT = 0, 1, 2
"""Entries of a work array: the next unclaimed unit, the number of units, the next scratch slot."""


class Scratch(NamedTuple):
    """Scratch :func:`run_parallel` allocates for one call: a row of ``count`` items of ``dtype`` for each
    thread that takes part (the kernel indexes it with :func:`slot`), zero-filled when ``zeros``."""

    count: int
    dtype: Any
    zeros: bool = False


def run_parallel(kernel_: Kernel, units: int, *args, count: Optional[int] = None, scratch: tuple = ()) -> None:
    """Run ``kernel_(work, *args, *scratch arrays)`` on up to ``count`` (default :func:`threads`) threads
    at once; ``work`` is the int64 array ``[next unit, units, next slot]`` whose units the calls share
    out with :func:`claim`; each call may take a row of every scratch array (:func:`slot`: 0, 1, ...).
    The calling thread runs one of the calls.

    The threads come from a bounded pool (:func:`_take_workers`): the call runs on the caller and the
    helpers it gets, which may be fewer than asked for.  The scratch arrays (``scratch``:
    :class:`Scratch`) are made here, once the helpers are known, with one row per call that runs, so
    that no slot a call takes can fall outside them, whatever other threads set meanwhile."""
    wanted = 1 if units <= 1 or count == 1 else min(threads() if count is None else count, units)
    helpers = _take_workers(wanted - 1) if wanted > 1 else []
    calls = 1 + len(helpers)
    try:
        arrays = tuple(_scratch_rows(spec.count, spec.dtype, calls, spec.zeros) for spec in scratch)
        assert all(array.shape[0] >= calls for array in arrays)  # a slot per call: slot() stays below calls
        function, packed = kernel_.prepare((np.array([0, units, 0], np.int64),) + args + arrays)
    except BaseException:
        _give_back(helpers)
        raise
    if not helpers:
        function(*packed)
        return
    for worker in helpers:
        worker.start(function, packed)
    try:
        function(*packed)
    finally:
        errors = []
        for worker in helpers:  # every helper has finished before any error goes on
            try:
                worker.wait()
            except BaseException as error:
                errors.append(error)
        _give_back(helpers)
        if errors:
            raise errors[0]


@intrinsic
def _fetch_add(typingctx, counter, index, value):
    """``counter[index] += value`` as one atomic step (LLVM ``atomicrmw add``, monotonic) on an int64
    array; returns the value before."""
    from numba import types
    from numba.core import cgutils

    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        array = context.make_array(aty)(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.int64)
        pointer = cgutils.get_item_pointer(context, builder, aty, array, [i], wraparound=False, boundscheck=False)
        return builder.atomic_rmw("add", pointer, context.cast(builder, args[2], sig.args[2], types.int64),
                                  "monotonic")

    return types.int64(counter, index, value), codegen


fetch_add = _fetch_add


@helper(inline="always")
def claim(work):
    """The next unit of ``work`` for the calling thread, or -1 when none is left."""
    unit = _fetch_add(work, WORK_NEXT, 1)
    return unit if unit < work[WORK_UNITS] else -1


@helper(inline="always")
def slot(work):
    """A scratch slot of its own for the calling thread's run of the kernel (0, 1, ...)."""
    return _fetch_add(work, WORK_SLOT, 1)


@helper(inline="always")
def search_left(a, value):
    """The first position of the sorted ``a`` whose entry is ``>= value`` (``np.searchsorted``, left),
    written out: numba's own compiles several functions."""
    lo, hi = 0, a.size
    while lo < hi:
        middle = (lo + hi) >> 1
        if a[middle] < value:
            lo = middle + 1
        else:
            hi = middle
    return lo


@helper(inline="always")
def search_right(a, value):
    """The first position of the sorted ``a`` whose entry is ``> value`` (``np.searchsorted``, right)."""
    lo, hi = 0, a.size
    while lo < hi:
        middle = (lo + hi) >> 1
        if a[middle] <= value:
            lo = middle + 1
        else:
            hi = middle
    return lo


CACHE_LINE = 64
"""Bytes of a cache line: each thread's scratch starts on a line of its own (:func:`scratch`)."""


def _scratch_rows(count: int, dtype, rows: int, zeros: bool = False) -> np.ndarray:
    """``(rows, stride)`` items of ``dtype``, each row of at least ``count`` items starting on a cache
    line and padded to whole lines -- threads writing their own rows never share a line (false sharing
    slows both down)."""
    dtype = np.dtype(dtype)
    rows = max(1, rows)
    per_line = CACHE_LINE // dtype.itemsize
    stride = max(1, -(-max(count, 1) // per_line)) * per_line
    raw = (np.zeros if zeros else np.empty)(rows * stride * dtype.itemsize + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start:start + rows * stride * dtype.itemsize].view(dtype).reshape(rows, stride)


@helper
def claim_span(work, count):
    """``[start, stop)`` of the next unit of ``work`` over ``count`` items for the calling thread (units
    of equal runs, :func:`unit_span`); an empty span when none is left."""
    unit = claim(work)
    if unit < 0:
        return count, count
    return unit_span(unit, work[WORK_UNITS], count)


@helper(inline="always")
def unit_span(unit, units, count):
    """``[start, stop)`` of unit ``unit`` of ``units`` equal runs over ``count`` items."""
    per = (count + units - 1) // units
    start = unit * per
    return start, min(count, start + per)


# ------------------------------------------------------------------------------------
# The cache of machine code
# ------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Where the kernel cache keeps its version folders: ``$NUMBA_CACHE_DIR/hurray_schema`` when
    numba's cache folder is set, else ``kernels`` in this package's cache root
    (``$HURRAY_SCHEMA_CACHE_DIR``, else ``$XDG_CACHE_HOME/hurray_schema`` or
    ``~/.cache/hurray_schema``).  Never inside the installed package."""
    root, first = _cache_location()
    return Path(root) / first


def _cache_location() -> tuple[str, str]:
    """``(root, first folder of ours inside it)``: the root may be shared, the folder is private."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return configured, "hurray_schema"
    return cache_root(), "kernels"


def _digest(text) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def _version_key() -> str:
    """What the machine code depends on besides the kernel: this evaluator's sources, the numba,
    llvmlite and Python builds, and the CPU numba compiles for (:func:`_host_cpu`)."""
    import llvmlite  # its version only: the package's top level, not LLVM

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        version = Path(spec.origin).with_name("_version.py")
        digest.update(version.read_bytes() if version.exists() else spec.origin.encode())
    for part in (llvmlite.__version__, sys.version, _host_cpu(), os.environ.get("NUMBA_CPU_NAME", ""),
                 os.environ.get("NUMBA_CPU_FEATURES", ""), os.environ.get("NUMBA_OPT", "")):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "cpu implementer",
               "cpu architecture", "cpu variant", "cpu part", "cpu revision", "features", "isa", "cpu")
"""Lines of ``/proc/cpuinfo`` that identify a processor and its instruction set (x86, ARM, POWER, RISC-V)."""


def _host_cpu() -> str:
    """The host CPU, as precisely as the machine code depends on it: its model and feature flags from
    ``/proc/cpuinfo`` (Linux; read in microseconds, where LLVM would be loaded only to name the CPU),
    else LLVM's name and features for it."""
    fields = [line for line in _first_cpu() if line.split(":", 1)[0].strip().lower() in _CPU_FIELDS]
    if fields:
        return "\n".join(fields)
    import llvmlite.binding as llvm

    return _host_cpu_name(llvm) + "\n" + _host_cpu_features(llvm)


def _host_cpu_name(llvm) -> str:
    return os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()


def _host_cpu_features(llvm) -> str:
    return os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()


class _Cache:
    """Object code (and shared libraries) per (kernel, signature) in a version folder of
    :func:`cache_dir` that only this user can write (:mod:`hurray_schema.private_folder`: loaded
    code runs in this process); none when that folder cannot be trusted (one warning) or made."""

    def __init__(self):
        root, first = _cache_location()
        self.fd = open_private(root, first, _version_key(), what="kernel machine code")

    def _folder(self) -> Optional[int]:
        """The version folder, checked again (its owner or mode may have changed since)."""
        if self.fd is not None and not still_private(self.fd):
            warnings.warn("hurray_schema: kernel machine code is not cached: its folder changed owner or mode; "
                          "kernels are compiled in memory", RuntimeWarning, stacklevel=4)
            os.close(self.fd)
            self.fd = None
        return self.fd

    @staticmethod
    def _names(kernel_: Kernel, signature: Signature) -> tuple[str, str, str]:
        stem = re.sub(r"[^\w.-]", "_", kernel_.name) + "." + _digest(signature.text)[:16]
        return stem + ".o", stem + ".json", stem + ".so"

    def load(self, kernel_: Kernel, signature: Signature) -> Optional[Callable]:
        """The kernel's entry point from the cache: its shared library where there is one (no llvmlite),
        else its object code through the MCJIT engine; None when the cache does not hold it."""
        folder = self._folder()
        if folder is None:
            return None
        objname, metaname, sharedname = self._names(kernel_, signature)
        try:
            meta = json.loads(read_private(folder, metaname) or b"")
        except ValueError:
            return None
        if not isinstance(meta, dict) or meta.get("signature") != signature.text:
            return None
        if meta.get("shared_sha256"):
            function = _load_shared(folder, sharedname, meta["shared_sha256"], meta["symbol"], signature.cdecl)
            if function is not None:
                return function
        data = read_private(folder, objname)
        if data is None or _digest(data) != meta.get("sha256"):
            return None
        address = _engine().load(data, meta["symbol"], meta["externals"])
        return _ffi().cast(signature.cdecl, address) if address else None

    def save(self, kernel_: Kernel, signature: Signature, data: bytes, symbol: str, externals: list,
             shared: Optional[bytes] = None) -> None:
        folder = self._folder()
        if folder is None:
            return
        objname, metaname, sharedname = self._names(kernel_, signature)
        meta = {"kernel": kernel_.name, "signature": signature.text, "symbol": symbol, "externals": externals,
                "sha256": _digest(data)}
        if not write_private(folder, objname, data):
            return  # a full or read-only disk: the kernel is compiled again next time
        if shared is not None and write_private(folder, sharedname, shared):
            meta["shared_sha256"] = _digest(shared)
        write_private(folder, metaname, json.dumps(meta, indent=1).encode())


# ------------------------------------------------------------------------------------
# Kernels as shared libraries: loaded with the system's dynamic loader, no LLVM in the process
# ------------------------------------------------------------------------------------

_LINKERS = ("cc", "gcc", "clang")
"""C compiler drivers that link an object into a shared library (the first found on ``PATH``)."""

SHARED_KERNELS = os.environ.get("HURRAY_SCHEMA_SHARED_KERNELS", "1") != "0"
"""``HURRAY_SCHEMA_SHARED_KERNELS=0``: compiled kernels are cached as object code only (loaded through
MCJIT), not linked as shared libraries too (which costs a compilation a tenth of a second or more)."""


def _shared_library(module) -> Optional[bytes]:
    """A shared library of a compiled kernel's optimized LLVM module, or None where none can be made.

    MCJIT's object code is position-dependent (numba's JIT uses the static relocation model); the
    module is therefore emitted again as position-independent code for the host CPU and linked by the
    system's C compiler driver.  Its undefined symbols are the ones numba's entry point names on its
    exception path (never taken: kernels do not raise), bound lazily, and the C library's.  Linux only;
    without a linker the kernel is loaded through MCJIT, as everywhere else."""
    import shutil
    import subprocess

    if not SHARED_KERNELS or not sys.platform.startswith("linux"):
        return None
    linker = next((found for found in map(shutil.which, _LINKERS) if found), None)
    if linker is None:
        return None
    try:
        import llvmlite.binding as llvm

        copy = llvm.parse_bitcode(module.as_bitcode())
        target = llvm.Target.from_triple(copy.triple)
        machine = target.create_target_machine(cpu=_host_cpu_name(llvm), features=_host_cpu_features(llvm), opt=3,
                                               reloc="pic", codemodel="default")
        with tempfile.TemporaryDirectory(prefix="hurray-kernel-") as folder:
            objpath, sharedpath = Path(folder, "kernel.o"), Path(folder, "kernel.so")
            objpath.write_bytes(machine.emit_object(copy))
            done = subprocess.run([linker, "-shared", "-Wl,-z,lazy", "-o", str(sharedpath), str(objpath)],
                                  capture_output=True, timeout=120)
            return sharedpath.read_bytes() if done.returncode == 0 else None
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return None


_libraries: list = []
"""Shared libraries of loaded kernels: kept open for the life of the process."""


def _load_shared(folder: int, name: str, sha256: str, symbol: str, cdecl: str) -> Optional[Callable]:
    """The entry point ``symbol`` of a kernel's shared library ``name`` in the cache folder (``dlopen``,
    lazy binding, local symbols), or None (a changed, unreadable or not private file, a loader that
    refuses it).  The file checked is the file loaded: it is opened once, its bytes hashed through
    that descriptor, and the loader given the descriptor's own path (``/proc/self/fd``)."""
    import _cffi_backend

    fd = open_private_file(folder, name)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            if _digest(f.read()) != sha256:
                return None
        library = _cffi_backend.load_library(f"/proc/self/fd/{fd}", os.RTLD_LAZY | os.RTLD_LOCAL)
        function = library.load_function(_ffi().typeof(cdecl), symbol)
    except (OSError, AttributeError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)
    _libraries.append(library)
    return function


_the_cache: list = []


def _cache() -> _Cache:
    if not _the_cache:
        _the_cache.append(_Cache())
    return _the_cache[0]


_STUB_PREFIXES = ("numba_", "NRT_", "Py", "_Py")
"""Symbols numba's C entry points name only on their exception path (never taken: kernels do not
raise) -- given trap stubs when numba is not loaded to provide them."""


_RUNTIME_LIBRARIES = (("m", ("libm.so.6",)), ("c", ("libc.so.6",)), ("gcc_s", ("libgcc_s.so.1",)))
"""Libraries machine code may call into (memset, libm, compiler-rt helpers), by their usual sonames;
``ctypes.util.find_library`` (which runs ``ldconfig`` in a subprocess) only where none of these loads."""


def _load_permanently(llvm, name: str, sonames) -> None:
    """Make library ``name``'s symbols visible to the engine."""
    for soname in sonames:
        with contextlib.suppress(RuntimeError):
            llvm.load_library_permanently(soname)
            return
    import ctypes.util

    found = ctypes.util.find_library(name)
    if found:
        with contextlib.suppress(RuntimeError):
            llvm.load_library_permanently(found)


class _Engine:
    """One llvmlite MCJIT engine holding every kernel loaded from the cache."""

    def __init__(self):
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        for name, sonames in _RUNTIME_LIBRARIES:
            _load_permanently(llvm, name, sonames)
        target = llvm.Target.from_default_triple()
        self.llvm = llvm
        self.machine = target.create_target_machine(cpu=_host_cpu_name(llvm), features=_host_cpu_features(llvm),
                                                    opt=3, codemodel="jitdefault")
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.machine)
        self.stubbed: set = set()

    def _unresolved(self, externals) -> tuple[list, list]:
        """(symbols to stub, symbols nobody provides)."""
        stubs, missing = [], []
        for name in externals:
            if name in self.stubbed or self.llvm.address_of_symbol(name):
                continue
            (stubs if name.startswith(_STUB_PREFIXES) else missing).append(name)
        return stubs, missing

    def _add_stubs(self, names) -> None:
        lines = ["declare void @llvm.trap()"]
        for name in names:
            lines.append(f'define void @"{name}"() {{\n  call void @llvm.trap()\n  unreachable\n}}')
        module = self.llvm.parse_assembly("\n".join(lines))
        module.verify()
        self.engine.add_module(module)
        self.stubbed.update(names)

    def load(self, data: bytes, symbol: str, externals) -> Optional[int]:
        stubs, missing = self._unresolved(externals)
        if missing:
            return None  # compiled instead: numba provides them
        if stubs:
            self._add_stubs(stubs)
        self.engine.add_object_file(self.llvm.ObjectFileRef.from_data(data))
        self.engine.finalize_object()
        address = self.engine.get_function_address(symbol)
        return address or None


_the_engine: list = []


def _engine() -> _Engine:
    if not _the_engine:
        _the_engine.append(_Engine())
    return _the_engine[0]
