"""Helpers shared by test modules (``from support.<module> import ...``; tests/ is on the import path)."""
