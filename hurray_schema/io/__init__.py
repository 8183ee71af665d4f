"""Readers and writers of Hurray streams and files."""
