"""Loading machine code without numba: kernels linked as shared libraries (the system's dynamic
loader, no LLVM in the process) or object code through one llvmlite MCJIT engine."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional


from ...private_folder import open_private_file
from . import internals
from .host import _host_cpu_features, _host_cpu_name
from .signatures import _ffi


def _digest(text) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


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
    fd = open_private_file(folder, name)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            if _digest(f.read()) != sha256:
                return None
        library = internals.load_library(f"/proc/self/fd/{fd}", os.RTLD_LAZY | os.RTLD_LOCAL)
        function = library.load_function(_ffi().typeof(cdecl), symbol)
    except (OSError, AttributeError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)
    _libraries.append(library)
    return function


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
