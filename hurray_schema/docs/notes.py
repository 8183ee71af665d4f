"""The attribute docstrings of the declarations (a string right after ``NAME = ...``), as Markdown text."""

from __future__ import annotations

import ast
import inspect
import re

__all__ = ["attribute_notes", "member_notes"]


def attribute_notes(module) -> dict[str, str]:
    """Attribute docstrings (a string right after ``NAME = ...``) of a module."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    return _body_notes(tree.body)


def _body_notes(body: list) -> dict[str, str]:
    """Attribute docstrings of the statements ``body`` (a module's or a class's)."""
    notes = {}
    group: list[str] = []  # one-line assignments on consecutive lines: a docstring after them documents them all
    last_line = 0  # the line of the last one-line assignment, 0 after anything else
    for node in body:
        if isinstance(node, ast.Assign):
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            one_line = node.lineno == node.end_lineno
            group = group + names if one_line and node.lineno == last_line + 1 else names
            last_line = node.lineno if one_line else 0
            continue
        last_line = 0
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for name in group:
                notes[name] = _plain(" ".join(node.value.value.split()))
        group = []
    return notes


_ROLE = re.compile(r":\w+:`~?[\w.]*?(\w+)`")


def _plain(text: str) -> str:
    """A docstring's text for Markdown: a Sphinx cross-reference (``:mod:`.stream```) as code."""
    return _ROLE.sub(r"`\1`", text)


def _module_summary(module) -> str:
    doc = inspect.getdoc(module) or ""
    return _plain(doc.split("\n\n")[0].replace("\n", " ").strip())


def member_notes(table: type) -> dict[str, str]:
    """The docstrings of a tag table's members (a string right after ``NAME = value``)."""
    try:
        tree = ast.parse(inspect.getsource(table))
    except (OSError, TypeError):
        return {}
    return _body_notes(tree.body[0].body)
