"""A tiny Llama quantized by optimum-quanto's own code on CPU and saved as quanto saves it, for
tests/test_quantized_quanto.py.

transformers 5.25 quantizes with ``QuantoConfig`` but refuses to save the result ("not
serializable"), so the model is quantized and saved by quanto's own
``QuantizedModelForCausalLM.quantize`` / ``save_pretrained``: ``model.safetensors`` (each weight
flattened: ``weight._data``, ``weight._scale`` and for 2 / 4 bits ``weight._data._data``,
``weight._shift``) and ``quanto_qmap.json`` beside ``config.json``.  :func:`library_dequantized`
reloads the folder with ``QuantizedModelForCausalLM.from_pretrained`` and returns each quantized
weight's ``dequantize()``.
"""

from __future__ import annotations

from .hqq import to_numpy

HIDDEN = 64
INTERMEDIATE = 256
"""down_proj's 256 inputs make quanto group its 4-bit codes by 128; the other linears' 64 inputs
are whole rows."""


def tiny_dense(folder: str, dtype) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).to(dtype).save_pretrained(folder)
    return folder


def build(folder: str, weights: str, dtype: str = "float16", optimizer=None) -> str:
    """``folder`` holding the tiny Llama quantized by quanto (``weights``: "qint4" or "qint8"),
    every linear including ``lm_head``, saved by ``QuantizedModelForCausalLM.save_pretrained``."""
    import torch
    from optimum.quanto import QuantizedModelForCausalLM
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(tiny_dense(folder + ".dense", torch_dtype), dtype=torch_dtype)
    QuantizedModelForCausalLM.quantize(model, weights=weights, optimizer=optimizer).save_pretrained(folder)
    return folder


def library_dequantized(folder: str) -> dict:
    """``{<module>.weight: np.ndarray}``: each quantized weight of the folder reloaded by quanto
    and dequantized by it."""
    from optimum.quanto import QuantizedModelForCausalLM
    from optimum.quanto.tensor import QTensor

    model = QuantizedModelForCausalLM.from_pretrained(folder)
    out = {}
    for name, module in model._wrapped.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, QTensor):
            out[name + ".weight"] = to_numpy(weight.dequantize())
    return out
