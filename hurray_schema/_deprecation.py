"""Former spellings kept working for one release, each with a :class:`DeprecationWarning`.

This module imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, TypeVar

__all__ = ["deprecated", "renamed_keyword"]

F = TypeVar("F", bound=Callable)


def deprecated(message: str, *, stacklevel: int = 3) -> None:
    """Warn that a former spelling was used (``stacklevel`` 3: the caller of the deprecated function)."""
    warnings.warn(f"{message} (deprecated; it will be removed in the next release)", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """A decorator: keyword ``old`` of the decorated function is accepted as ``new``, with a warning;
    both at once raise :class:`TypeError`."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__name__}() takes {new}= (formerly {old}=), not both")
                deprecated(f"{fn.__name__}({old}=) is now {fn.__name__}({new}=)")
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
