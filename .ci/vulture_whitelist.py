"""Names vulture cannot see used: parameters a protocol or a callback signature fixes (``vulture hurray_schema
.ci/vulture_whitelist.py --min-confidence 80``, run by .ci/run)."""

tb  # StreamWriter.__exit__(self, exc_type, exc, tb)
instance  # limits._bounded(instance, attribute, value): an attrs validator
