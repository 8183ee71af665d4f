"""bitsandbytes 4-bit checkpoints made by transformers and bitsandbytes themselves, on CPU, for
tests/test_quantized_bitsandbytes.py.

:func:`build` saves a tiny Llama (one layer, hidden 64, deterministic weights; one block of
``q_proj`` all zeros, so its absmax is 0) as a dense model, loads it back through
``BitsAndBytesConfig(load_in_4bit=True, ...)`` -- transformers quantizes each linear with
bitsandbytes' own ``quantize_4bit`` -- and saves it with ``save_pretrained``: each linear
``<w>`` (uint8 ``[n / 2, 1]``), ``<w>.absmax``, ``<w>.quant_map``,
``<w>.quant_state.bitsandbytes__<type>`` and, double-quantized, ``<w>.nested_absmax`` and
``<w>.nested_quant_map``.  :data:`VARIANTS` are NF4, NF4 with double quantization, FP4 and NF4 of
a model whose rows (96) are not whole blocks of 64.

:func:`library_dequantized` is bitsandbytes' own ``functional.dequantize_4bit`` of each weight
(its state read back by ``QuantState.from_dict`` as ``Linear4bit`` loads it), as NumPy arrays in
the state's dtype; :func:`flat_dequantized` the same arithmetic through the library's device-free
kernel (``backends.default.ops``), which cuts the flattened weight into blocks whatever the CPU.
"""

from __future__ import annotations

import os

VARIANTS = {
    "nf4": dict(quant_type="nf4", double_quant=False, dtype="bfloat16", hidden=64),
    "nf4-dq": dict(quant_type="nf4", double_quant=True, dtype="float16", hidden=64),
    "fp4": dict(quant_type="fp4", double_quant=False, dtype="bfloat16", hidden=64),
    "nf4-rows96": dict(quant_type="nf4", double_quant=False, dtype="bfloat16", hidden=96),
}
"""Variant name -> how it is quantized (``bnb_4bit_quant_type``, ``bnb_4bit_use_double_quant``), the
model's dtype and hidden size (64: every row is whole blocks of 64; 96: blocks straddle rows)."""

ZEROED = "model.layers.0.self_attn.q_proj.weight"
"""The weight whose first 64 elements are zeros before quantization (a block of absmax 0)."""


def build(folder: str, variant: str) -> str:
    """``folder``/``variant``: the tiny Llama quantized by transformers + bitsandbytes as ``variant``
    says, saved with ``save_pretrained``; returns that folder."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    spec = VARIANTS[variant]
    dtype = getattr(torch, spec["dtype"])
    dense = os.path.join(folder, variant + "-dense")
    out = os.path.join(folder, variant)
    torch.manual_seed(50)
    config = LlamaConfig(vocab_size=128, hidden_size=spec["hidden"], intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 0.05)
        model.get_parameter(ZEROED)[0, :64] = 0
    model.save_pretrained(dense)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=spec["quant_type"],
                                      bnb_4bit_use_double_quant=spec["double_quant"], bnb_4bit_compute_dtype=dtype)
    quantized = AutoModelForCausalLM.from_pretrained(dense, quantization_config=quantization, dtype=dtype)
    quantized.save_pretrained(out)
    return out


def to_numpy(tensor):
    """A torch tensor as NumPy, bfloat16 as ml_dtypes' (the same bits)."""
    import ml_dtypes
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def quant_states(folder: str) -> dict:
    """Each 4-bit weight of the folder's ``model.safetensors``: (packed weight, ``QuantState``) as
    bitsandbytes reads them back (``QuantState.from_dict``, what ``Params4bit.from_prequantized`` does)."""
    from bitsandbytes.functional import QuantState
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name in tensors:
        if ".quant_state.bitsandbytes__" not in name:
            continue
        weight = name.split(".quant_state.")[0]
        parts = {key[len(weight) + 1:]: value for key, value in tensors.items()
                 if key.startswith(weight + ".") and key != weight}
        out[weight] = (tensors[weight], QuantState.from_dict(parts, device="cpu"))
    return out


def library_dequantized(folder: str) -> dict:
    """weight name -> ``bitsandbytes.functional.dequantize_4bit`` of it, NumPy, in its state's dtype."""
    import bitsandbytes.functional as F

    return {weight: to_numpy(F.dequantize_4bit(packed, state)) for weight, (packed, state) in quant_states(folder).items()}


def flat_dequantized(folder: str) -> dict:
    """:func:`library_dequantized` through bitsandbytes' device-free kernel
    (``backends.default.ops._dequantize_4bit_compute``, not compiled): blocks of the flattened
    weight.  The CPU kernel's AVX-512 path instead indexes absmax per row as if every row were
    whole blocks, which differs when it is not."""
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    compute = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    out = {}
    for weight, (packed, state) in quant_states(folder).items():
        absmax = state.absmax
        if state.nested:
            absmax = F.dequantize_blockwise(state.absmax, state.state2)
            absmax += state.offset
        code = _get_4bit_code(state.quant_type, packed.device)
        out[weight] = to_numpy(compute(packed.reshape(-1), absmax.float(), code, state.blocksize, state.shape,
                                       state.dtype))
    return out


def loaded_dequantized(folder: str) -> dict:
    """The folder loaded by transformers (``from_pretrained``, bitsandbytes' ``Linear4bit``), each 4-bit
    weight dequantized by bitsandbytes from the state the loaded module holds."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            out[name + ".weight"] = to_numpy(F.dequantize_4bit(module.weight.data, module.weight.quant_state))
    return out
