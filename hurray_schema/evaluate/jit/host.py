"""The host CPU, as the machine code depends on it: its features (``/proc/cpuinfo`` where it names
them, else LLVM) and its name for the kernel cache's key."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional



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
