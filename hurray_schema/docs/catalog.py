"""The declared wire tables and tag tables of ``hurray_schema.structs``, found by walking the package."""

from __future__ import annotations

import enum
import importlib
import pkgutil
from typing import Optional

import construct

from ..structs import tags as tag_tables
from ..structs._declare import Field, fields

__all__ = ["struct_modules", "declarations", "table_name", "tag_table", "model_enums"]


def struct_modules() -> list:
    """The modules of ``hurray_schema.structs`` that declare wire tables, in name order."""
    from .. import structs

    found = []
    for info in sorted(pkgutil.iter_modules(structs.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{structs.__name__}.{info.name}")
        if any(_is_table(v) for v in vars(module).values()):
            found.append(module)
    return found


def _is_table(value) -> bool:
    return isinstance(value, construct.Struct) and any(isinstance(s, Field) for s in value.subcons)


_DECLARATIONS: dict[str, construct.Construct] = {}


def declarations() -> dict[str, construct.Construct]:
    """Every declared table of ``hurray_schema.structs`` by its module-level name."""
    if not _DECLARATIONS:
        for module in struct_modules():
            for name, value in vars(module).items():
                if _is_table(value) and not name.startswith("_"):
                    _DECLARATIONS.setdefault(name, value)
    return _DECLARATIONS


def table_name(decl: construct.Construct) -> Optional[str]:
    """The module-level name of a declared table (``LAYOUT_ENTRY``), else ``None``."""
    for name, value in declarations().items():
        if value is decl:
            return name
    return None


def tag_table(decl_name: str, field_name: str) -> Optional[type[enum.IntEnum]]:
    """The tag table attached to field ``field_name`` of the table named ``decl_name``
    (``None``: an unknown table or field, or a field without a tag table)."""
    decl = declarations().get(decl_name)
    if decl is None:
        return None
    for f in fields(decl):
        if f.name == field_name:
            return f.tags
    return None


def model_enums() -> list[type[enum.IntEnum]]:
    """The tag tables of ``structs/tags.py`` then of the other ``structs`` modules, in
    declaration order."""
    found = []
    for module in [tag_tables, *struct_modules()]:
        for value in vars(module).values():
            if (
                isinstance(value, type) and issubclass(value, (enum.IntEnum, enum.IntFlag))
                and value.__module__ == module.__name__ and value not in found
            ):
                found.append(value)
    return found
