"""Rules of this spec area (being written)."""
