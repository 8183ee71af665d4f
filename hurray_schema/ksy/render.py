"""The schemas as text: :func:`schemas` (each as a mapping, in Kaitai Struct's structure),
written as YAML in the kaitai_struct_formats layout (:func:`to_yaml`, :func:`render_ksy`),
into a directory (:func:`write_ksy`) or checked against one (:func:`check_ksy`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..docs import stale_rendered, write_rendered
from .builder import _Hex
from .containers import _file_schema, _stream_schema
from .descriptor import _descriptor_schema

__all__ = ["schemas", "to_yaml", "render_ksy", "write_ksy", "check_ksy"]


def schemas() -> dict[str, dict]:
    """File name → the schema as a mapping, in Kaitai Struct's structure."""
    return {
        "hurray_descriptor.ksy": _descriptor_schema(),
        "hurray_file.ksy": _file_schema(),
        "hurray_stream.ksy": _stream_schema(),
    }


_PLAIN = re.compile(r"[^\s\-?:,\[\]{}#&*!|>'\"%@`](?:.*[^\s:])?")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}
_NUMBER_LIKE = re.compile(r"[-+]?\.?\d")


def _scalar(value) -> str:
    """A scalar as YAML: plain where that reads back as the same string, else quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _Hex):
        return f"0x{int(value):02x}"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if (_PLAIN.fullmatch(text) and ": " not in text and " #" not in text and text.lower() not in _YAML_WORDS
            and not _NUMBER_LIKE.match(text)):
        return text
    if "\n" in text or "\\" in text:
        return json.dumps(text, ensure_ascii=False)
    return "'" + text.replace("'", "''") + "'"


def _key(key) -> str:
    return _scalar(key)


def _emit(value, indent: int, lines: list[str]) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{_key(key)}:")
                _emit(item, indent + 1, lines)
            elif isinstance(item, list):
                lines.append(f"{pad}{_key(key)}: []")
            elif isinstance(item, dict):
                lines.append(f"{pad}{_key(key)}: {{}}")
            else:
                lines.append(f"{pad}{_key(key)}: {_scalar(item)}")
        return
    for item in value:
        if isinstance(item, dict) and item:
            sub: list[str] = []
            _emit(item, indent + 1, sub)
            first = sub[0][len(pad) + 2:]
            lines.append(f"{pad}- {first}")
            lines.extend(sub[1:])
        else:
            lines.append(f"{pad}- {_scalar(item)}")


def to_yaml(schema: dict) -> str:
    """One schema as YAML: 2-space indentation, sequences indented under their key,
    a blank line between the top-level sections."""
    lines: list[str] = []
    for i, (key, value) in enumerate(schema.items()):
        if i:
            lines.append("")
        _emit({key: value}, 0, lines)
    return "\n".join(lines) + "\n"


def render_ksy() -> dict[str, str]:
    """File name → the text of every ``.ksy``."""
    return {name: to_yaml(schema) for name, schema in schemas().items()}


def write_ksy(outdir) -> list[Path]:
    """Write every schema into ``outdir`` (created if needed); returns the paths written."""
    return write_rendered(outdir, render_ksy())


def check_ksy(outdir) -> list[str]:
    """Names of schemas in ``outdir`` that differ from (or are missing against) a fresh render,
    and ``.ksy`` files there that the render does not make."""
    return stale_rendered(outdir, render_ksy(), ".ksy")
