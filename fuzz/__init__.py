"""Fuzzing support: seed corpus, mutations, and atheris harnesses (see README.md)."""
