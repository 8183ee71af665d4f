"""Tiny models quantized by each library's own code on CPU, saved as that library saves them, for
tests/test_quantized_*.py."""

import numpy as np


def bit_pattern(array) -> np.ndarray:
    """The bit patterns of a float array (the unsigned integers of its width): what "equal bit for
    bit" compares, -0.0 and NaN payloads included."""
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}")
