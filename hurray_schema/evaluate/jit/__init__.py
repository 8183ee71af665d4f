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

The package, a module per job: :mod:`.signatures` (a kernel's C signature and its entry point),
:mod:`.lazy` (numba imported only to compile: helpers, intrinsics, what was compiled), :mod:`.host`
(the CPU), :mod:`.kernels` (declaring, specializing, compiling), :mod:`.cache` (the machine code
kept), :mod:`.loader` (machine code loaded without numba) and :mod:`.pool` (the threads of parallel
kernels).  The names below are the evaluator's, re-exported here.
"""

from __future__ import annotations

from .cache import cache_dir
from .host import host_features, host_has
from .kernels import Kernel, kernel
from .lazy import Constants, bound, choose, compile_count, helper, intrinsic, numba_loaded, timings
from .pool import (
    CACHE_LINE, WORK_NEXT, WORK_SLOT, WORK_UNITS, Scratch, claim, claim_span, fetch_add, run_parallel, search_left,
    search_right, set_threads, slot, thread_limit, threads, unit_span,
)

__all__ = ["kernel", "helper", "intrinsic", "choose", "bound", "Kernel", "run_parallel", "claim", "claim_span", "slot",
           "unit_span", "Scratch", "search_left", "search_right", "threads", "set_threads", "thread_limit", "cache_dir",
           "numba_loaded", "compile_count", "timings", "host_has", "host_features", "fetch_add", "Constants",
           "CACHE_LINE", "WORK_NEXT", "WORK_UNITS", "WORK_SLOT"]
