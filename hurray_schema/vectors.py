"""The conformance corpus under its former name: :mod:`hurray_schema.conformance` (renamed so
that the name says what it is), re-exported so that ``hurray_schema.vectors.write_corpus`` and
the rest still import."""

from __future__ import annotations

from .conformance import *  # noqa: F403  (this module is its re-export)
from .conformance import __all__  # noqa: F401
