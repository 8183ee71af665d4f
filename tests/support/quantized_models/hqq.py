"""A tiny Llama quantized by hqq's own code on CPU and saved as hqq saves it, for
tests/test_quantized_hqq.py.

transformers 5.25 does not quantize with ``HqqConfig`` ("QuantizationMethod.HQQ is not available
yet"), so the model is prepared by transformers' own ``prepare_for_hqq_linear`` (which writes
``config.quantization_config`` as transformers saves it), quantized by hqq's
``AutoHQQHFModel.quantize_model`` with ``HqqConfig(nbits=4, group_size=64).quant_config`` and written by
hqq's ``AutoHQQHFModel.save_to_safetensors`` (``HQQLinear.state_dict``: ``W_q``, ``scale``, ``zero`` and
the metadata tensors).  :func:`library_dequantized` reloads each linear from that file into an
``HQQLinear`` (hqq's ``load_state_dict``) and returns its ``dequantize()``.
"""

from __future__ import annotations

import os

HIDDEN = 64
INTERMEDIATE = 128


def tiny_dense(folder: str, dtype) -> str:
    """A one-layer Llama (hidden 64, intermediate 128) of deterministic random weights saved by
    transformers in ``dtype``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    return folder


def build(folder: str, *, optimize: bool = True, dtype: str = "float16", axis: int = 1, nbits: int = 4,
          round_zero=None) -> str:
    """``folder`` (created) holding ``config.json`` and ``model.safetensors`` of the tiny Llama
    quantized by hqq, 4 bits, groups of 64 along ``axis`` (transformers' default 1); ``optimize``:
    hqq's proximal optimizer, its default (float zeros), or off (zeros rounded to integers,
    ``round_zero`` being hqq's 4-bit default); ``nbits`` other than 4 with ``round_zero`` set to
    round their zeros too (hqq rounds them only for 4 bits by default)."""
    import torch
    from hqq.models.hf.base import AutoHQQHFModel
    from transformers import AutoModelForCausalLM, HqqConfig
    from transformers.integrations.hqq import prepare_for_hqq_linear

    torch_dtype = getattr(torch, dtype)
    dense = tiny_dense(folder + ".dense", torch_dtype)
    model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch_dtype)
    config = HqqConfig(nbits=nbits, group_size=64, axis=axis)
    config.quant_config["weight_quant_params"]["optimize"] = optimize
    if round_zero is not None:
        config.quant_config["weight_quant_params"]["round_zero"] = round_zero
    prepare_for_hqq_linear(model, config)
    AutoHQQHFModel.quantize_model(model, quant_config=config.quant_config, compute_dtype=torch_dtype, device="cpu")
    AutoHQQHFModel.save_to_safetensors(model, folder, verbose=False)
    return folder


def library_dequantized(folder: str) -> dict:
    """``{prefix.weight: np.ndarray}``: each linear of ``folder`` loaded by hqq from the saved
    tensors and dequantized by ``HQQLinear.dequantize`` (in its stored compute dtype)."""
    import torch
    from hqq.core.quantize import HQQLinear
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name in [n for n in tensors if n.endswith(".W_q")]:
        prefix = name[: -len(".W_q")]
        state = {key[len(prefix) + 1:]: value for key, value in tensors.items() if key.startswith(prefix + ".")}
        compute = eval("".join(chr(c) for c in state["compute_dtype"].tolist()), {"torch": torch})
        layer = HQQLinear(None, None, compute_dtype=compute, device="cpu", initialize=False)
        layer.load_state_dict(state)
        out[prefix + ".weight"] = to_numpy(layer.dequantize())
    return out


def to_numpy(tensor):
    """A torch tensor as NumPy, bfloat16 as ``ml_dtypes.bfloat16`` (same bits)."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
