"""Kernel signatures (``"i64(u8[:], i64, f32[:, :])"``): the C entry point each compiles to, and the
call of it through cffi (:func:`_ffi`)."""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from . import internals

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


def _ffi():
    """cffi's FFI (:func:`.internals.ffi`: the backend's own where the door to the internals is open)."""
    return internals.ffi()


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
