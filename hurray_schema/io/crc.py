"""CRC-32C (Castagnoli) of a file's index (``file-format.md § Trailer``): the ``crc32c`` package's.

The package's ``__init__`` asks ``importlib.metadata`` for its own version and imports its command
line (about 30 ms, a tenth of a warm process's start); its function lives in the extension module
``crc32c._crc32c``, which is loaded here from the installed package without that ``__init__``.
Anything unexpected (another layout of the package) falls back to ``import crc32c``.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
from typing import Callable

__all__ = ["crc32c"]


@functools.cache
def _function() -> Callable:
    try:
        spec = importlib.util.find_spec("crc32c")
        for folder in spec.submodule_search_locations or ():
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "_crc32c" + suffix)
                if os.path.exists(path):
                    extension = importlib.util.spec_from_file_location("crc32c._crc32c", path)
                    module = importlib.util.module_from_spec(extension)
                    extension.loader.exec_module(module)
                    return module.crc32c
    except Exception:  # noqa: BLE001 - any surprise: the package's own import below
        pass
    import crc32c as package

    return package.crc32c


def crc32c(data, value: int = 0) -> int:
    """The CRC-32C of ``data`` (bytes-like), continuing from ``value``."""
    return _function()(data, value)
