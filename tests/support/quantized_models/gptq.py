"""GPTQ checkpoints made by gptqmodel's own code on CPU: a one-layer Llama (hidden 128,
float16) quantized to 4 bits in groups of 32 from random token ids and saved in GPTQ v1
(``checkpoint_format: "gptq"``), with and without act-order (``desc_act``), asymmetric and
symmetric; and the library's own dequantized weights for comparison
(``TorchLinear.dequantize_weight`` of the checkpoint loaded back)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""The quantized linears of layer 0."""

VOCAB = 128


def dense_model(folder: str) -> str:
    """A tiny float16 Llama and a word-level tokenizer (no download) saved in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(folder)
    words = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t1", eos_token="t2",
                            bos_token="t3").save_pretrained(folder)
    return folder


def quantize(dense: str, out: str, *, desc_act: bool, sym: bool, group_size: int = 32, bits: int = 4) -> str:
    """``dense`` quantized by gptqmodel on CPU (8 calibration rows of 32 random token ids) and
    saved by it into ``out`` (GPTQ v1)."""
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.looper import loop_processor

    # gptqmodel logs each quantized module into ./logs of the working directory; keep them beside ``out``
    loop_processor._PROJECT_LOG_DIR = Path(out).parent / "gptqmodel-logs"
    settings = dict(bits=bits, group_size=group_size, desc_act=desc_act, sym=sym)
    if desc_act:
        settings["act_group_aware"] = False  # act-order excludes gptqmodel's group-aware reordering
    model = GPTQModel.load(dense, QuantizeConfig(**settings), device="cpu", dtype=torch.float16)
    generator = torch.Generator().manual_seed(1)
    calibration = [{"input_ids": torch.randint(0, VOCAB, (1, 32), generator=generator),
                    "attention_mask": torch.ones(1, 32, dtype=torch.long)} for _ in range(8)]
    model.quantize(calibration, batch_size=1)
    model.save(out)
    return out


def library_dequantized(folder: str) -> dict:
    """``{"model.layers.0.<linear>.weight": float16 [out, in]}``: the checkpoint in ``folder``
    loaded by gptqmodel (torch kernel, float16) and each linear dequantized by it."""
    import torch
    from gptqmodel import BACKEND, GPTQModel

    model = GPTQModel.load(folder, device="cpu", backend=BACKEND.TORCH, dtype=torch.float16)
    layer = model.model.model.layers[0]
    out = {}
    with torch.inference_mode():
        for path in LINEARS:
            module = layer.get_submodule(path)
            out[f"model.layers.0.{path}.weight"] = module.dequantize_weight().T.contiguous().numpy()
    return out


def dequantize_parts(qweight, qzeros, scales, g_idx, *, bits: int, group_size: int, sym: bool = False,
                     checkpoint_format: str = "gptq") -> np.ndarray:
    """float16 ``[out, in]``: gptqmodel's ``TorchLinear`` given these parts (v1 zeros first
    converted by its ``convert_gptq_v1_to_v2_format_module``, as its loader does), dequantized."""
    import torch
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    in_features, out_features = qweight.shape[0] * 32 // bits, qweight.shape[1]
    module = TorchLinear(bits=bits, group_size=group_size, sym=sym, desc_act=False, in_features=in_features,
                         out_features=out_features, bias=False)
    module.qweight.copy_(torch.from_numpy(np.asarray(qweight, np.int32)))
    module.qzeros.copy_(torch.from_numpy(np.asarray(qzeros, np.int32)))
    module.scales = torch.from_numpy(np.asarray(scales, np.float16)).clone()
    module.g_idx.copy_(torch.from_numpy(np.asarray(g_idx, np.int32)))
    if checkpoint_format == "gptq":
        convert_gptq_v1_to_v2_format_module(module, bits=bits, pack_dtype=torch.int32)
    module.post_init()
    module.eval()
    with torch.inference_mode():
        return module.dequantize_weight().T.contiguous().numpy()
