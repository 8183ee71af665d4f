"""Every page rendered, written into a folder, or compared with the pages already there."""

from __future__ import annotations

from pathlib import Path

from .catalog import struct_modules
from .markdown import _page_title
from .rule_pages import VECTORS_PAGE, _index_page, _vectors_page, rule_structs
from .table_pages import _element_types_page, _struct_page, _tags_page
from .tables import struct_docs

__all__ = ["render_pages", "write_rendered", "stale_rendered", "write_docs", "check_docs"]


def render_pages(corpus) -> dict[str, str]:
    """File name → Markdown text of every page; ``corpus`` is the conformance corpus the rules link
    to (:func:`hurray_schema.conformance.build_corpus`: its ``covered`` rules, ``of_rule`` and the
    ``reasons`` a rule has no violating vector), passed in by the tool above this layer."""
    from ..rules.engine import registry

    docs = struct_docs()
    rules_of: dict[int, list] = {}
    for rule in registry():
        for d in rule_structs(rule, docs)[:6]:
            rules_of.setdefault(id(d), []).append(rule)
    pages: dict[str, str] = {}
    titles: list[tuple[str, str]] = []
    for module in struct_modules():
        short = module.__name__.rsplit(".", 1)[1]
        mine = [d for d in docs if d.module == short]
        if not mine:
            continue
        name = f"{short.replace('_', '-')}.md"
        pages[name] = _struct_page(module, mine, rules_of)
        titles.append((name, _page_title(short)))
    pages["element-types.md"] = _element_types_page()
    titles.append(("element-types.md", "Element types"))
    pages["tags.md"] = _tags_page(docs)
    titles.append(("tags.md", "Tag tables"))
    pages[VECTORS_PAGE] = _vectors_page(corpus)
    titles.append((VECTORS_PAGE, "Conformance vectors"))
    pages["index.md"] = _index_page(docs, titles, frozenset(corpus.covered))
    return dict(sorted(pages.items()))


def write_rendered(outdir, texts: dict[str, str]) -> list[Path]:
    """Write each ``name: text`` of a fresh render into ``outdir`` (created if needed); returns the
    paths written."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_rendered(outdir, texts: dict[str, str], suffix: str) -> list[str]:
    """Names of files in ``outdir`` that differ from (or are missing against) a fresh render ``texts``,
    then the files ending in ``suffix`` there that the render does not make."""
    out = Path(outdir)
    stale = [n for n, text in texts.items() if not (out / n).is_file() or (out / n).read_text(encoding="utf-8") != text]
    extra = sorted(p.name for p in out.glob("*" + suffix) if p.name not in texts)
    return stale + extra


def write_docs(outdir, corpus) -> list[Path]:
    """Write every page into ``outdir`` (created if needed); returns the paths written."""
    return write_rendered(outdir, render_pages(corpus))


def check_docs(outdir, corpus) -> list[str]:
    """Names of pages in ``outdir`` that differ from (or are missing against) a fresh render."""
    return stale_rendered(outdir, render_pages(corpus), ".md")
