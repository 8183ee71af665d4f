"""Named, spec-cited rules (``engine``) and the rules of each spec area.

Importing this package declares every rule (:mod:`.all_rules`), so the registry is
complete whichever module under ``rules`` was imported first; :mod:`.engine` itself
imports no spec-area module.
"""

from . import all_rules  # noqa: F401  (declares the rules of every spec area)
from .engine import Finding, Level, Mode, Report, Rule, get_rule, registry

__all__ = ["Finding", "Level", "Mode", "Report", "Rule", "get_rule", "registry"]
