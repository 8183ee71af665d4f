"""Tiny quantized models made by each quantization library itself, for tests/test_quantized_*.py."""
