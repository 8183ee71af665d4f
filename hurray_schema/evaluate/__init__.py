"""numba kernels: element decoding, dequantization, composite merges."""
