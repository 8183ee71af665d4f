"""Numba, imported only to compile: the stand-ins (:class:`_Lazy`) for helpers and intrinsics that a
kernel's compilation makes real, the compile lock and what this process compiled or loaded."""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional



from . import internals

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
        """numba's type of the real object (numba asks a stand-in it meets for its ``_numba_type_``)."""
        return internals.numba_type_of(self.real())

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
    internal_options = {"forceinline": True,  # LLVM inlines the helper into every caller
                        "_nrt": False,  # kernels never allocate: no reference counts to keep
                        "no_cpython_wrapper": True}  # called from kernels only: no wrapper to compile

    def wrap(pyfunc):
        def make(constants, inherited):
            from numba import njit

            merged = {**(internal_options if internals.usable() else {}), **options}
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
