"""AWQ GEMM checkpoints made by autoawq itself on CPU, for tests/test_quantized_awq.py.

:func:`build` quantizes a one-layer float16 Llama (hidden 128, with attention biases) with
``AutoAWQForCausalLM.quantize`` -- 4 bits, zero points, group 32, version GEMM, calibrated on
random token ids (nothing is downloaded) -- and saves it with ``save_quantized``.
:func:`build_linear` makes a one-linear checkpoint of any group size from autoawq's own pieces
(``pseudo_quantize_tensor`` and ``WQLinear_GEMM.from_linear``, as its quantizer's ``_apply_quant``
calls them), for group sizes no model of this size would have.

What the tests compare against is autoawq's arithmetic: :func:`library_dequantized`
(``awq.utils.packing_utils.dequantize_gemm``) and :func:`module_dequantized` (a ``WQLinear_GEMM``
forward on the identity, the path its CPU forward takes).  :func:`load` loads a folder as
``from_quantized`` does, without its switch to the IPEX kernels on a CPU-only machine (which needs
intel_extension_for_pytorch; transformers 5 itself loads AWQ only through gptqmodel).

Importing this module needs torch and autoawq (``pip install --no-deps autoawq``, with accelerate and
datasets, which autoawq imports at start).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # autoawq's deprecation notice at import
    import awq  # noqa: F401
    import torch
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.quantize.quantizer import AwqQuantizer
    from awq.utils.packing_utils import dequantize_gemm

GROUP_SIZE = 32

MODEL = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, attention_bias=True, tie_word_embeddings=False)
"""The tiny Llama: seven linears of 128 or 256 inputs (q/k/v/o with biases, gate/up/down)."""

PARTS = ("qweight", "qzeros", "scales")


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def build(folder, *, group_size: int = GROUP_SIZE, seed: int = 0) -> Path:
    """``folder/awq``: the tiny Llama quantized and saved by autoawq (``folder/dense``: the model before)."""
    from awq import AutoAWQForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    dense, out = folder / "dense", folder / "awq"
    torch.manual_seed(seed)
    with _quiet():
        LlamaForCausalLM(LlamaConfig(**MODEL)).to(torch.float16).save_pretrained(dense)
        model = AutoAWQForCausalLM.from_pretrained(str(dense), device_map="cpu")
        generator = torch.Generator().manual_seed(seed + 1)
        calibration = [torch.randint(0, MODEL["vocab_size"], (64,), generator=generator).tolist() for _ in range(4)]
        model.quantize(None, quant_config={"zero_point": True, "q_group_size": group_size, "w_bit": 4,
                                           "version": "GEMM"},
                       calib_data=calibration, max_calib_seq_len=64)
        model.save_quantized(str(out))
    return out


def build_linear(folder, *, in_features: int, out_features: int, group_size: int, seed: int = 0,
                 name: str = "model.proj") -> Path:
    """``folder``: a checkpoint of one linear ``name`` quantized by autoawq's ``pseudo_quantize_tensor``
    and packed by ``WQLinear_GEMM.from_linear`` (4 bits, zero points), saved as ``save_quantized`` saves
    (safetensors, ``config.json`` with autoawq's ``quantization_config``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=False).half()
    settings = SimpleNamespace(group_size=group_size, zero_point=True, w_bit=4)
    with _quiet(), torch.no_grad():
        linear.weight.data, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(settings, linear.weight.data)
        packed = WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales.t().contiguous(),
                                           zeros=zeros.t().contiguous())
    save_file({f"{name}.{part}": getattr(packed, part).contiguous() for part in PARTS},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["Linear"], "model_type": "linear",
              "quantization_config": {"bits": 4, "group_size": group_size, "modules_to_not_convert": None,
                                      "quant_method": "awq", "version": "gemm", "zero_point": True}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def tensors(folder) -> dict:
    """Every tensor of the folder's ``model.safetensors``: name -> NumPy array."""
    from safetensors.numpy import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def quantization_config(folder) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())["quantization_config"]


def linears(folder) -> dict:
    """Dense weight name -> {part: NumPy array} of each GEMM linear."""
    found = tensors(folder)
    modules = [name[: -len(".qweight")] for name in found if name.endswith(".qweight")]
    return {f"{module}.weight": {part: found[f"{module}.{part}"] for part in PARTS} for module in modules}


def _group(config: dict, in_features: int) -> int:
    group = config["group_size"]
    return in_features if group == -1 else group


def library_dequantized(folder) -> dict:
    """Dense weight name -> autoawq's ``dequantize_gemm`` of its parts, transposed to ``[out, in]``
    (float16)."""
    config = quantization_config(folder)
    out = {}
    for weight, parts in linears(folder).items():
        qweight, qzeros, scales = (torch.from_numpy(parts[part]) for part in PARTS)
        dense = dequantize_gemm(qweight, qzeros, scales, config["bits"], _group(config, qweight.shape[0]))
        out[weight] = dense.t().contiguous().numpy()
    return out


def module_dequantized(folder) -> dict:
    """Dense weight name -> a bias-free ``WQLinear_GEMM`` holding the parts, run on the identity
    (its CPU forward: ``dequantize_gemm`` then a matmul), transposed to ``[out, in]``."""
    config = quantization_config(folder)
    out = {}
    for weight, parts in linears(folder).items():
        qweight = torch.from_numpy(parts["qweight"])
        in_features, out_features = qweight.shape[0], parts["scales"].shape[1]
        module = WQLinear_GEMM(config["bits"], _group(config, in_features), in_features, out_features, False, "cpu")
        module.load_state_dict({part: torch.from_numpy(parts[part]) for part in PARTS})
        with _quiet(), torch.no_grad():
            result = module(torch.eye(in_features, dtype=torch.float16))
        out[weight] = result.reshape(in_features, out_features).t().contiguous().numpy()
    return out


def load(folder):
    """The quantized model in ``folder`` loaded by autoawq's ``from_quantized`` steps: the transformers
    model made empty, its linears replaced by ``WQLinear_GEMM`` (``_load_quantized_modules``), the
    checkpoint loaded by accelerate's ``load_checkpoint_and_dispatch`` -- on CPU without the IPEX
    repacking ``from_quantized`` insists on there."""
    import transformers
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    from awq.models._config import AwqConfig
    from awq.models.auto import AWQ_CAUSAL_LM_MODEL_MAP
    from awq.models.base import TRANSFORMERS_AUTO_MAPPING_DICT

    folder = str(folder)
    with _quiet():
        config = transformers.AutoConfig.from_pretrained(folder)
        awq_model = AWQ_CAUSAL_LM_MODEL_MAP[config.model_type]
        quant_config = AwqConfig.from_pretrained(folder)
        target = getattr(transformers, TRANSFORMERS_AUTO_MAPPING_DICT[config.model_type])
        with init_empty_weights():
            model = target.from_config(config=config, dtype=torch.float16)
        awq_model._load_quantized_modules(awq_model, model, quant_config, quant_config.version, use_exllama=False,
                                          use_exllama_v2=False, use_ipex=False)
        model.tie_weights()
        load_checkpoint_and_dispatch(model, checkpoint=folder, device_map={"": "cpu"},
                                     no_split_module_classes=[awq_model.layer_type], dtype=torch.float16)
    return model.eval()


def logits(folder, token_ids) -> np.ndarray:
    """The loaded model's float16 logits for one sequence of token ids."""
    model = load(folder)
    with _quiet(), torch.no_grad():
        return model(torch.tensor([list(token_ids)])).logits[0].numpy()
