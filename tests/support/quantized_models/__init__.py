"""Tiny models quantized on CPU by each quantization library's own code, saved as that library saves them."""
