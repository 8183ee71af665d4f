"""Quantized checkpoints as their libraries write them -- compressed-tensors, GPTQ, AWQ,
bitsandbytes, HQQ, optimum-quanto -- into Hurray's quantization schemes (``quantization/*.md``)
and back.

:mod:`.checkpoint` finds the method a folder's ``config.json`` names (``quantization_config``),
hands the checkpoint's tensor names to that method's module, and puts each quantized linear's
parts back together as one :class:`~..source.SourceTensor` named for its dense weight.  Each
method is one module here with the same four names (:data:`.checkpoint.METHOD_MODULES`):

* ``linears(sources, config)`` -> ``{dense weight name: QuantizedLinear}`` (:class:`~.checkpoint.QuantizedLinear`:
  its parts, the source scheme as the report shows it, the dense shape), from the checkpoint's
  source tensors by name (their names, shapes and dtypes; small metadata tensors read);
* ``source(weight, arrays, config)`` -> the Hurray quantized tensor of the parts' arrays (codes and
  parameters in Hurray's order, values unchanged), or :class:`~..source.NoExactForm` with the reason;
* ``dequantized(weight, arrays, config)`` -> the dense weight as the library's own
  dequantization computes it, in its dtype (NumPy, the library's order of operations);
* ``parts_of(weight, tensor, config)`` -> the parts of a Hurray quantized tensor in the
  library's layout, or :class:`~..source.NoExactForm` when the layout cannot hold its scheme;
  ``config_for(leaves, metadata)`` -> ``(metadata, config)`` where the layout can also hold another
  method's tensors (compressed-tensors).

:mod:`.packing` has what several layouts share: words of packed codes opened and closed along an
axis, and distances in units in the last place.  None of this imports torch or the libraries.
"""

from .checkpoint import METHOD_MODULES, QuantizedLinear, method_of, quantization_config, regroup

__all__ = ["METHOD_MODULES", "QuantizedLinear", "method_of", "quantization_config", "regroup"]
