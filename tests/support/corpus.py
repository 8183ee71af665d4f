"""One conformance corpus shared by the test modules that read it (building it runs every case)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def corpus():
    """:func:`hurray_schema.conformance.build_corpus`, built once per test process."""
    from hurray_schema.conformance import build_corpus

    return build_corpus()


def rendered_pages() -> dict:
    """Every documentation page, rendered with the shared corpus."""
    return dict(_pages())


@functools.lru_cache(maxsize=1)
def _pages() -> tuple:
    from hurray_schema.docs import render_pages

    return tuple(render_pages(corpus()).items())
