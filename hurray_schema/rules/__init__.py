"""Named, spec-cited rules (``engine``) and the rules of each spec area."""

from .engine import Finding, Level, Mode, Report, Rule, get_rule, registry

__all__ = ["Finding", "Level", "Mode", "Report", "Rule", "get_rule", "registry"]
