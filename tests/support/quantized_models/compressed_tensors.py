"""A tiny Llama quantized with compressed-tensors' own code on CPU and saved as it saves one.

The weights' quantization parameters come from compressed-tensors' min-max arithmetic
(``calculate_qparams`` on each weight's per-group / per-channel minima and maxima, what its
``compute_dynamic_scales_and_zp`` does for groups); the model is initialized for quantization by
``apply_quantization_config``, compressed by ``ModelCompressor.compress_model`` (the
``pack-quantized`` compressor: codes ``q + 2**(bits-1)`` packed densely into int32 words, zero
points packed along the output axis), written by ``save_pretrained`` and given its
``quantization_config`` by ``ModelCompressor.update_config``: the steps llm-compressor's own
``save_pretrained`` wrapper takes, without calibration data (weight-only quantization needs none).

:func:`library_dequantized` is compressed-tensors' own decompression of each quantized linear
(the compressor's ``decompress``: ``(q - z) * s`` in the scales' dtype)."""

from __future__ import annotations

import json
import os

VARIANTS = {
    # name: (num_bits, strategy, group_size, symmetric[, input activations int8 per token, dynamic])
    "int4_g32_sym": (4, "group", 32, True),
    "int4_g32_asym": (4, "group", 32, False),
    "int8_channel": (8, "channel", None, True),
    "int8_channel_asym": (8, "channel", None, False),
    "int2_g32_asym": (2, "group", 32, False),
    "int8_tensor": (8, "tensor", None, True),
    "int4_tensor_asym": (4, "tensor", None, False),
    "w8a8_channel": (8, "channel", None, True, True),  # the int-quantized format (weights int8 as they are)
    "w8a8_channel_asym": (8, "channel", None, False, True),
    "int3_g32": (3, "group", 32, True),
}


def _scheme(num_bits, strategy, group_size, symmetric, activations=False):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=num_bits, type="int", symmetric=symmetric, strategy=strategy,
                            group_size=group_size)
    inputs = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True) \
        if activations else None
    return QuantizationScheme(targets=["Linear"], weights=args, input_activations=inputs)


def tiny_llama(dtype="bfloat16", seed=0, hidden=64, layers=1):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    with torch.no_grad():  # weights of a spread like a trained model's, not the init's tiny normal
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    return model


def calibrate_weights(model) -> None:
    """Every quantized linear's ``weight_scale`` / ``weight_zero_point`` from its weight's min and
    max, by compressed-tensors' ``calculate_qparams`` (groups: its ``compute_dynamic_scales_and_zp``)."""
    import torch
    from compressed_tensors.quantization.utils import calculate_qparams, compute_dynamic_scales_and_zp
    from compressed_tensors.quantization.utils.helpers import is_module_quantized

    for _, module in model.named_modules():
        if not is_module_quantized(module) or module.quantization_scheme.weights is None:
            continue
        args = module.quantization_scheme.weights
        weight = module.weight.data
        with torch.no_grad():
            if args.strategy == "channel":
                mins = torch.amin(weight, dim=-1, keepdim=True)
                maxs = torch.amax(weight, dim=-1, keepdim=True)
                scale, zero = calculate_qparams(mins, maxs, args)
            else:
                scale, zero = compute_dynamic_scales_and_zp(weight, args, module)
            module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
            module.weight_zero_point.data.copy_(zero.to(module.weight_zero_point.dtype))


def build(folder: str, variant: str, dtype: str = "bfloat16", seed: int = 0, hidden: int = 64,
          layers: int = 1) -> str:
    """A model folder quantized as ``variant`` (:data:`VARIANTS`; ``<variant>_fp16``: a float16
    model) with compressed-tensors' own code; ``lm_head`` is left dense (as llm-compressor's
    recipes leave it)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config

    if variant.endswith("_fp16"):
        variant, dtype = variant[: -len("_fp16")], "float16"

    model = tiny_llama(dtype, seed, hidden, layers)
    config = QuantizationConfig(config_groups={"group_0": _scheme(*VARIANTS[variant])}, ignore=["lm_head"],
                                quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, config, show_progress=False)
    calibrate_weights(model)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    return folder


def quantization_config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["quantization_config"]


def library_dequantized(folder: str) -> dict:
    """dense weight name -> the dense weight as compressed-tensors decompresses it (NumPy; bfloat16
    as ml_dtypes' bfloat16), from the folder's safetensors by the compressor the config names."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    state = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(folder, name)))
    qconfig = QuantizationConfig.model_validate(quantization_config(folder))
    scheme = next(iter(qconfig.config_groups.values()))
    compressor = BaseCompressor.get_value_from_registry(qconfig.format)
    out = {}
    prefixes = sorted({k.rsplit(".", 1)[0] for k in state if k.endswith(".weight_scale")})
    for prefix in prefixes:
        local = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        dense = compressor.decompress(local, scheme)["weight"]
        out[prefix + ".weight"] = to_numpy(dense)
    return out


def to_numpy(tensor):
    import ml_dtypes
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def loaded_dequantized(folder: str) -> dict:
    """dense weight name -> the weight transformers' compressed-tensors integration decompresses on
    load (``from_pretrained`` then the decompression its first forward pass runs)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model(torch.zeros((1, 2), dtype=torch.long))
    return {name: to_numpy(p.data) for name, p in model.named_parameters()
            if name.endswith(".weight") and "proj" in name}
