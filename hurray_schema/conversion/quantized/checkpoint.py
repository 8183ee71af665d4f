"""A quantized checkpoint's linears put back together: the method ``config.json`` names, each
linear's parts claimed by that method's module and turned into one source tensor named for the
dense weight (:func:`regroup`); and the way back, a Hurray file's quantized tensors cut into a
method's parts (:func:`outward`)."""

from __future__ import annotations

import importlib
import json
from typing import Mapping, Optional

import attrs
import numpy as np

from ...errors import HurraySchemaError
from ..source import SourceTensor

__all__ = ["METHOD_MODULES", "QuantizedLinear", "quantization_config", "method_of", "regroup", "outward",
           "CONFIG_KEY", "MODEL_DTYPE_KEY"]

METHOD_MODULES = {
    "compressed-tensors": "compressed_tensors",
    "gptq": "gptq",
    "awq": "awq",
    "bitsandbytes": "bitsandbytes",
    "hqq": "hqq",
    "quanto": "quanto",
}
"""``quantization_config["quant_method"]`` -> the module of this package that reads that method."""

CONFIG_KEY = "hf.file.config.json"
"""The KV key a model folder's ``config.json`` is carried under (:mod:`..hf_folder`)."""

QUANTO_MAP_KEY = "hf.file.quanto_qmap.json"
"""The KV key of optimum-quanto's quantization map, the ``quanto_qmap.json`` its
``QuantizedModelForCausalLM.save_pretrained`` writes beside the weights (``config.json`` then
names no ``quantization_config``): read as ``{"quant_method": "quanto", "quantization_map": ...,
"model_config": <config.json>}``."""


@attrs.frozen(slots=True)
class QuantizedLinear:
    """One quantized linear of a checkpoint: ``parts`` (its part -> the checkpoint's tensor name),
    ``scheme`` (the source scheme as the report shows it, "gptq int4 g32 act-order") and ``shape``
    (the dense weight's, ``[out_features, in_features]``)."""

    parts: Mapping[str, str]
    scheme: str
    shape: tuple


def quantization_config(metadata: Mapping) -> Optional[dict]:
    """The ``quantization_config`` of the ``config.json`` carried in ``metadata``; None when there
    is none.  A config that is no JSON object, or names no method known here, is refused."""
    text = metadata.get(CONFIG_KEY)
    if text is None and QUANTO_MAP_KEY not in metadata:
        return None
    try:
        config = json.loads(text) if text is not None else {}
    except (TypeError, ValueError):
        raise HurraySchemaError("config.json: not a JSON document") from None
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant is None and QUANTO_MAP_KEY in metadata:
        return _quanto_config(metadata[QUANTO_MAP_KEY], config)
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise HurraySchemaError("config.json: quantization_config is not a JSON object")
    method = quant.get("quant_method")
    if method not in METHOD_MODULES:
        raise HurraySchemaError(f"config.json: quantization_config names quant_method {method!r}; "
                                f"the methods read here are {sorted(METHOD_MODULES)}")
    return quant


def _quanto_config(text, config) -> dict:
    """The config of a folder optimum-quanto saved: its quantization map beside the model's config."""
    try:
        qmap = json.loads(text)
    except (TypeError, ValueError):
        raise HurraySchemaError("quanto_qmap.json: not a JSON document") from None
    if not isinstance(qmap, dict):
        raise HurraySchemaError("quanto_qmap.json: not a JSON object")
    return {"quant_method": "quanto", "quantization_map": qmap,
            "model_config": config if isinstance(config, dict) else {}}


def method_of(method: str):
    """The module of this package that reads ``method``."""
    try:
        return importlib.import_module(f".{METHOD_MODULES[method]}", __package__)
    except KeyError:
        raise HurraySchemaError(f"quantization method {method!r}: one of {sorted(METHOD_MODULES)}") from None


def regroup(metadata: Mapping, sources: list) -> list:
    """``sources`` with each quantized linear's parts replaced by one source tensor named for its
    dense weight, at the place of its first part; unchanged when ``metadata`` carries no
    ``quantization_config``."""
    config = quantization_config(metadata)
    if config is None:
        return sources
    module = method_of(config["quant_method"])
    by_name = {source.name: source for source in sources}
    linears = module.linears(by_name, config)
    owner: dict = {}
    for weight, linear in linears.items():
        for name in linear.parts.values():
            if name not in by_name:
                raise HurraySchemaError(f"{weight}: part {name!r} is not in the checkpoint")
            if name in owner:
                raise HurraySchemaError(f"{name!r} is a part of both {owner[name]!r} and {weight!r}")
            owner[name] = weight
    out = []
    for source in sources:
        weight = owner.get(source.name)
        if weight is None:
            out.append(source)
        elif linears[weight].parts and source.name == _first_part(linears[weight], sources):
            out.append(_linear_source(module, weight, linears[weight], by_name, config))
    return out


def _first_part(linear: QuantizedLinear, sources: list) -> str:
    names = set(linear.parts.values())
    return next(s.name for s in sources if s.name in names)


def _linear_source(module, weight: str, linear: QuantizedLinear, by_name: dict, config: dict) -> SourceTensor:
    """The source tensor of one quantized linear: built by the method's module from its parts' arrays."""

    def arrays() -> dict:
        return {part: by_name[name].values() for part, name in linear.parts.items()}

    def build():
        return module.source(weight, arrays(), config), False

    def values() -> np.ndarray:
        return module.dequantized(weight, arrays(), config)

    bytes_in = sum(by_name[name].bytes_in for name in linear.parts.values())
    return SourceTensor(weight, linear.scheme, bytes_in, tuple(linear.shape), build, values, False, ulp=True)


MODEL_DTYPE_KEY = "hurray.model_dtype"
"""The key :func:`outward` adds to the config it hands ``parts_of``: the carried ``config.json``'s
``dtype`` (``torch_dtype`` before transformers 5), None without one -- the dtype a layout that
records the weight's own (bitsandbytes' quantization state) writes back."""


def _model_dtype(metadata: Mapping) -> Optional[str]:
    try:
        config = json.loads(metadata.get(CONFIG_KEY) or "null")
    except (TypeError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    dtype = config.get("dtype", config.get("torch_dtype"))
    return dtype if isinstance(dtype, str) else None


def outward(leaves: list, metadata: Mapping, quantized_as: Optional[str]) -> tuple[list, dict]:
    """(leaves, metadata) of a model folder written from a Hurray file: each quantized tensor
    replaced by its parts in the layout of ``quantized_as`` (default: the method the carried
    ``config.json`` names; none: the leaves as they are), the config rewritten when the method
    changes (the module's ``config_for``)."""
    config = quantization_config(metadata)
    method = quantized_as or (config or {}).get("quant_method")
    if method is None:
        return leaves, dict(metadata)
    module = method_of(method)
    if config is None or config.get("quant_method") != method:
        if not hasattr(module, "config_for"):
            raise HurraySchemaError(f"quantized_as {method!r}: only a file converted from {method} goes back to it "
                                    f"(this file's config names {(config or {}).get('quant_method')!r})")
        metadata, config = module.config_for(leaves, dict(metadata))
    config = {**config, MODEL_DTYPE_KEY: _model_dtype(metadata)}
    from ...io import Tensor

    out = []
    for name, item in leaves:
        if getattr(getattr(item, "descriptor", None), "quantization", None) is None:
            out.append((name, item))
            continue
        for part_name, array in module.parts_of(name, item, config).items():
            out.append((part_name, Tensor.from_numpy(np.ascontiguousarray(array))))
    return out, dict(metadata)
