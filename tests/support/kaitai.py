"""Compiling docs/ksy with the Kaitai Struct compiler and reading what its parsers locate.

The compiler is the npm package ``kaitai-struct-compiler`` (a development tool, GPL-3.0),
driven by ``tools/ksc.js``; ``.ci/run`` installs it into ``.ci/node_modules``.  The Python
parsers it generates in debug mode record where each attribute starts and ends in its
stream; :func:`kaitai_leaves` turns a parsed object into absolute byte ranges, and
:func:`walk_leaves` does the same for the annotated walk (``hexview.annotate``, the nodes
``inspect`` prints), so the two can be compared field by field.
"""

from __future__ import annotations

import enum
import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from hurray_schema import ksy

ROOT = Path(__file__).resolve().parents[2]
MODULES = Path(os.environ.get("HURRAY_KSC_MODULES", ROOT / ".ci" / "node_modules"))
KSC = ROOT / "tools" / "ksc.js"
TARGETS = ("java", "cpp_stl", "go", "rust", "javascript", "csharp")
"""The compile targets checked beside Python (compile step only, the outputs are not built)."""


def compiler_missing() -> Optional[str]:
    """Why the compiler cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (.ci/run installs nodejs and the compiler)"
    for package in ("kaitai-struct-compiler", "js-yaml"):
        if not (MODULES / package / "package.json").is_file():
            return f"npm package {package} is not in {MODULES} (.ci/run installs it there)"
    return None


def need_compiler() -> None:
    reason = compiler_missing()
    if reason is not None:
        pytest.skip(reason)


def compile_schemas(ksy_dir: Path, languages, debug: bool = False) -> dict:
    """``{lang: {"name.ksy": {file: source}}}`` for every ``.ksy`` of ``ksy_dir``."""
    need_compiler()
    args = ["node", str(KSC), str(MODULES), str(ksy_dir)] + (["--debug"] if debug else []) + list(languages)
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"the Kaitai Struct compiler failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def render_into(directory: Path, texts: Optional[dict] = None) -> Path:
    for name, text in (texts or ksy.render_ksy()).items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


@functools.lru_cache(maxsize=1)
def python_parsers():
    """The three parser classes, compiled in debug mode from a fresh render and imported."""
    pytest.importorskip("kaitaistruct", reason="the kaitaistruct runtime (the ksy extra) is not installed")
    work = Path(tempfile.mkdtemp(prefix="hurray-ksy-"))
    render_into(work)
    compiled = compile_schemas(work, ["python"], debug=True)["python"]
    out = work / "py"
    out.mkdir()
    for files in compiled.values():
        for name, source in files.items():
            (out / name.lstrip("/")).write_text(source, encoding="utf-8")
    sys.path.insert(0, str(out))
    try:
        modules = {name: importlib.import_module(name) for name in ("hurray_descriptor", "hurray_file", "hurray_stream")}
    finally:
        sys.path.remove(str(out))
    return {
        "descriptor": modules["hurray_descriptor"].HurrayDescriptor,
        "file": modules["hurray_file"].HurrayFile,
        "stream": modules["hurray_stream"].HurrayStream,
        "messages": modules["hurray_stream"].HurrayStream,
    }


def parse(kind: str, data: bytes):
    from kaitaistruct import KaitaiStream

    cls = python_parsers()[kind]
    obj = cls(KaitaiStream(__import__("io").BytesIO(data)))
    obj._read()
    return obj


# --------------------------------------------------------------------------------------
# What each side locates
# --------------------------------------------------------------------------------------

OPAQUE = {"padding", "trailing", "payload", "data", "buffers"}
"""Attributes that are runs of bytes without fields (the walk's ``opaque`` nodes)."""


def _class_name(type_name: str) -> str:
    return "".join(part.capitalize() for part in type_name.split("_"))


@functools.lru_cache(maxsize=1)
def followed_instances() -> dict:
    """Kaitai class name → its instances that hold located parts (not peeks or values),
    each with whether it reads the root stream (``io: _root._io``)."""
    found: dict = {}
    for schema in ksy.schemas().values():
        types = {schema["meta"]["id"]: schema, **schema.get("types", {})}
        for name, spec in types.items():
            for inst, inst_spec in spec.get("instances", {}).items():
                if "value" in inst_spec or inst_spec.get("type") in ("u1", "u2", "u4", "u8"):
                    continue
                found.setdefault(_class_name(name), []).append((inst, inst_spec.get("io") == "_root._io"))
    return found


def _plain(value):
    if isinstance(value, enum.Enum):
        return int(value.value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def kaitai_leaves(root) -> list[tuple]:
    """``(name, start, end, value)`` of every leaf attribute of a parsed object, in
    absolute offsets of the input; zero-length opaque runs left out."""
    from kaitaistruct import KaitaiStruct

    leaves: list[tuple] = []
    root_io = root._io

    def visit(obj, base: int) -> None:
        names = [(name, False) for name in obj.SEQ_FIELDS]
        names += followed_instances().get(type(obj).__name__, [])
        for name, from_root in names:
            value = getattr(obj, name, None)  # an attribute skipped by `if:` is absent
            if value is None:
                continue
            key = name if name in obj._debug else f"_m_{name}"
            where = obj._debug[key]
            read_base, read_io = (0, root_io) if from_root else (base, obj._io)
            if isinstance(value, KaitaiStruct):
                visit(value, read_base + where["start"] if value._io is not read_io else read_base)
            elif isinstance(value, list) and value and isinstance(value[0], (KaitaiStruct, bytes)):
                for item, at in zip(value, where["arr"]):
                    if isinstance(item, KaitaiStruct):
                        visit(item, read_base + at["start"] if item._io is not read_io else read_base)
                    else:
                        add(name, read_base + at["start"], read_base + at["end"], item)
            else:
                add(name, read_base + where["start"], read_base + where["end"], value)

    def add(name, start, end, value):
        if name in OPAQUE and start == end:
            return
        leaves.append((name, start, end, None if name in OPAQUE else _plain(value)))

    visit(root, 0)
    return sorted(leaves, key=lambda leaf: (leaf[1], leaf[2], leaf[0]))


def _opaque_name(label: str) -> str:
    word = label.split()[0]
    return "buffers" if word == "buffer" else word


def walk_leaves(data: bytes, kind: str) -> tuple[list[tuple], list]:
    """``(leaves, errors)`` of the annotated walk: every field and opaque run as
    ``(name, start, end, value)`` (the names as Kaitai ids), and its error nodes."""
    from hurray_schema.hexview import annotate

    leaves, errors = [], []
    for node in annotate(data, kind):
        if node.kind == "field":
            value = node.value
            value = tuple(value) if isinstance(value, (list, tuple)) else value
            leaves.append((ksy.ksy_id(node.label), node.start, node.end, _plain(value)))
        elif node.kind == "opaque" and node.end > node.start:
            leaves.append((_opaque_name(node.label), node.start, node.end, None))
        elif node.kind == "error":
            errors.append(node)
    return sorted(leaves, key=lambda leaf: (leaf[1], leaf[2], leaf[0])), errors


def same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


COMPARED = {"inputs": 0, "fields": 0, "opaque runs": 0}
"""What :func:`compare` has compared in this process (for a report of the counts)."""


def compare(data: bytes, kind: str) -> int:
    """Parse ``data`` with the Kaitai parser and with our walk; assert they locate the same
    fields at the same byte ranges with the same values.  Returns how many were compared."""
    ours, errors = walk_leaves(data, kind)
    assert not errors, [e.text for e in errors]
    theirs = kaitai_leaves(parse(kind, data))
    for mine, other in zip(ours, theirs):
        assert mine[:3] == other[:3] and same_value(mine[3], other[3]), (mine, other)
    assert len(ours) == len(theirs), (ours[len(theirs):], theirs[len(ours):])
    opaque = sum(1 for leaf in ours if leaf[0] in OPAQUE)
    COMPARED["inputs"] += 1
    COMPARED["fields"] += len(ours) - opaque
    COMPARED["opaque runs"] += opaque
    return len(ours)
