"""How large the slow property runs and mutation sweeps are.

The default run is sized to finish the whole suite in a few minutes on a small machine;
``python -m pytest --thorough`` (or ``HURRAY_THOROUGH=1``) runs them at their full size, the
sizes they had before the default was cut down.  A run is never switched off, only made shorter.
"""

from __future__ import annotations

import os

THOROUGH = os.environ.get("HURRAY_THOROUGH", "") not in ("", "0")
"""Set by ``--thorough`` (tests/conftest.py) before any test module is imported."""


def size(default: int, thorough: int) -> int:
    """``thorough`` in a thorough run, else ``default``."""
    return thorough if THOROUGH else default
