"""Tiny models quantized by each library's own code on CPU, saved as that library saves them, for
tests/test_quantized_*.py."""
