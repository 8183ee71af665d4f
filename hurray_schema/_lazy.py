"""Lazy exports of a package (PEP 562), written once for every package that has them.

A package declares where each public name lives and gets the three module attributes::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {".file": ("read_file",)},
                                                 unlisted={".old": ("former_name",)})

A name is imported from its module on first use and then kept on the package.  ``unlisted``
names resolve the same way but are left out of ``__all__`` and ``dir()`` (former names kept
working).  With ``submodules=True`` any other public name is tried as a submodule
(``hs.rules``).  A submodule never replaces an exported name of the same name on its package
(the import system binds ``pkg.audit`` to the submodule as it loads it).

This module imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_exports"]


class _LazyPackage(types.ModuleType):
    """A package whose exported names a submodule of the same name does not overwrite."""

    _lazy_homes: dict[str, str] = {}

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and name in self._lazy_homes and value.__name__ == (
                f"{self.__name__}.{name}"):
            value = getattr(value, name, value)
        super().__setattr__(name, value)


def _homes(exports: Mapping[str, Iterable[str]]) -> dict[str, str]:
    homes: dict[str, str] = {}
    for module, names in exports.items():
        for name in names:
            if name in homes:
                raise ValueError(f"{name!r} is exported from both {homes[name]} and {module}")
            homes[name] = module
    return homes


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]], *,
                 unlisted: Mapping[str, Iterable[str]] = {}, submodules: bool = False,
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` of ``package``, which must be importing.

    ``exports`` and ``unlisted`` map a module (relative to ``package``, or absolute) to the
    names it gives; ``__all__`` holds the ``exports`` names in declaration order."""
    listed = _homes(exports)
    former = _homes(unlisted)
    if set(listed) & set(former):
        raise ValueError(f"{package}: listed and unlisted: {sorted(set(listed) & set(former))}")
    homes = {**former, **listed}
    module = sys.modules[package]
    namespace = module.__dict__
    hidden = frozenset(former)

    def __getattr__(name: str):
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home, package), name)
            namespace[name] = value
            return value
        if submodules and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted((set(namespace) - hidden) | set(listed))

    module.__class__ = type("LazyPackage", (_LazyPackage,), {"_lazy_homes": homes})
    return __getattr__, __dir__, list(listed)
