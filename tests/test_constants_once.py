"""Each constant once (issue #47): a tag range, the rank cap, the tiled depth, the message size and
the power-of-two test are written where they are declared and imported everywhere else.

The checks read the package's source (tokens and syntax trees, so prose in docstrings and comments
is not flagged) and look for the known restatements only, not for every number that happens to be
equal: a 64-byte cache line or a 64 MiB chunk size is not the rank cap or the message size.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path


from hurray_schema.limits import DEFAULT_LIMITS, DEFAULT_MAX_MESSAGE_BYTES, HARD_MAXIMUM
from hurray_schema.structs import session, tags
from hurray_schema.structs._declare import power_of_two
from hurray_schema.structs.descriptor import MAX_RANK
from hurray_schema.structs.layouts import MAX_TILED_DEPTH, is_extension_layout

PACKAGE = Path(__file__).resolve().parents[1] / "hurray_schema"

DECLARED_IN = {
    "private tag range": {"structs/tags.py"},
    "power of two": {"structs/_declare.py"},
    "rank cap": {"structs/descriptor.py"},
    "tiled depth": {"structs/layouts.py"},
    "message size": {"limits.py"},
}

_IDIOM = re.compile(r"([A-Za-z_][\w.]*)\s*&\s*\(\s*\1\s*-\s*1\s*\)")
_UNITS = {"KiB", "MiB", "GiB", "TiB"}
_NAMED = {  # a name (assigned, annotated, a keyword or a default) -> the constant whose value it must not restate
    "rank cap": (re.compile(r"(?i)^(max_)?rank(_cap)?$"), MAX_RANK),
    "tiled depth": (re.compile(r"(?i)^(max_)?tiled_depth$"), MAX_TILED_DEPTH),
    "message size": (re.compile(r"(?i)^(default_)?max_message_(bytes|size)$"), DEFAULT_MAX_MESSAGE_BYTES),
}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path.read_text(encoding="utf-8")


def _code_lines(text: str) -> dict[int, str]:
    """Each line's code without strings and comments (tokens), by line number."""
    lines: dict[int, list[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
            lines.setdefault(tok.start[0], []).append(tok.string)
    return {n: re.sub(r" ?\. ?", ".", " ".join(parts)) for n, parts in lines.items()}


def _literal(node: ast.AST):
    """The number ``node`` writes out (constants, arithmetic on them, KiB/MiB units), else None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, int) and not isinstance(node.value, bool) else None
    if isinstance(node, ast.Name):
        return 1 << 10 * ("KiB", "MiB", "GiB", "TiB").index(node.id) + 10 if node.id in _UNITS else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.LShift, ast.Add, ast.Sub)):
        left, right = _literal(node.left), _literal(node.right)
        if left is None or right is None:
            return None
        return {ast.Mult: left * right, ast.LShift: left << right, ast.Add: left + right,
                ast.Sub: left - right}[type(node.op)]
    return None


def _named_values(tree: ast.AST):
    """``(name, value node, line)`` of every assignment, annotated assignment, keyword argument,
    function default and dict entry whose target is a plain name or string key; a call's first
    argument stands for the value (``_limit(64, ...)``, ``_option(64 * MiB, ...)``)."""
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs = [(node.target.id, node.value)]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs = [(node.arg, node.value)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults))
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        elif isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        for name, value in pairs:
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            yield name, value, getattr(value, "lineno", 0)


def _restatements() -> dict[str, list[str]]:
    """What each file restates: ``{file: ["constant at line N: code", ...]}``."""
    found: dict[str, list[str]] = {}
    for rel, text in _sources():
        hits = []
        for n, code in _code_lines(text).items():
            if rel not in DECLARED_IN["power of two"] and _IDIOM.search(code):
                hits.append(f"power of two at line {n}: {code}")
            if rel not in DECLARED_IN["private tag range"] and re.search(r"(?i)(?<!\w)0xfe(?!\w)", code):
                hits.append(f"private tag range at line {n}: {code}")
        tree = ast.parse(text)
        if rel not in DECLARED_IN["private tag range"]:
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    ends = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                    if any(c.value in (tags.PRIVATE_TAG_FIRST, tags.PRIVATE_TAG_LAST) for c in ends):
                        hits.append(f"private tag range at line {node.lineno}: a comparison with {ends[0].value:#x}")
        for name, value, line in _named_values(tree):
            for constant, (pattern, declared) in _NAMED.items():
                if rel not in DECLARED_IN[constant] and pattern.match(name) and _literal(value) == declared:
                    hits.append(f"{constant} at line {line}: {name} = {ast.unparse(value)}")
        if hits:
            found[rel] = hits
    return found


RESTATED = _restatements()


def test_no_constant_is_restated_outside_its_declaration():
    assert not RESTATED, "import these from their declaration instead:\n" + "\n".join(
        f"  {rel}: {hit}" for rel, hits in RESTATED.items() for hit in hits)


def test_the_checks_catch_what_they_look_for():
    code = ("def f(a, max_rank=64):\n"
            "    x = {'max_message_bytes': 64 * MiB}\n"
            "    return a & (a - 1) or 0xF0 <= a <= 0xFE\n")
    tree = ast.parse(code)
    named = {(name, _literal(value)) for name, value, _ in _named_values(tree)}
    assert ("max_rank", MAX_RANK) in named and ("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES) in named
    assert _IDIOM.search(_code_lines(code)[3])
    assert not _IDIOM.search(_code_lines("s = 'a & (a - 1)'\n").get(1, ""))


def test_the_declarations_agree():
    assert DEFAULT_LIMITS.max_rank == HARD_MAXIMUM["max_rank"] == MAX_RANK
    assert DEFAULT_LIMITS.max_tiled_depth == MAX_TILED_DEPTH
    assert DEFAULT_LIMITS.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    assert (session.PRIVATE_MESSAGE_FIRST, session.PRIVATE_MESSAGE_LAST) == \
        (session.EXTENSION_LAYOUT_FIRST, session.EXTENSION_LAYOUT_LAST) == (tags.PRIVATE_TAG_FIRST, tags.PRIVATE_TAG_LAST)
    assert session.is_extension_layout is is_extension_layout
    assert [n for n in range(-2, 1 << 12) if power_of_two(n)] == [1 << k for k in range(12)]
