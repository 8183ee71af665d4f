"""numba kernels: element decoding, dequantization, composite merges.

Entry points: :func:`tensor_to_numpy` (one tensor's logical array), :func:`materialize`
(a composite's view), :func:`lookup` and :func:`read` (one element / one box of a
partition or overlay).  Inputs are duck-typed: a tensor has ``.descriptor`` and
``.buffers``; a composite has ``.descriptor`` (the head) and ``.members``.

``tensor_to_numpy``, ``densify``, ``materialize`` and ``read`` take ``limits=`` (a
:class:`~hurray_schema.limits.Limits`, default :data:`~hurray_schema.limits.DEFAULT_LIMITS`)
and, before allocating, refuse an evaluation costing more than ``max_evaluation_bytes`` and
more than ``EVALUATION_EXPANSION`` times the bytes its input stores (the rule:
:mod:`.common`; the costs: :mod:`.tensor` and :mod:`.merge` module docstrings).

Modules, lowest first: :mod:`.elements`, :mod:`.dequantize_simd`, :mod:`.copy`, :mod:`.dense`,
:mod:`.dequantize` (kernels), :mod:`.common` (shared helpers and the budget rule),
:mod:`.sparse`, :mod:`.tensor`, :mod:`.tensor_box` (one box of one tensor), :mod:`.merge`,
:mod:`.region` (:func:`read_box`, the one region read under indexing and Dask),
:mod:`.indexing` (a NumPy basic index as one box read).  Beside them, for the producers:
:mod:`.quantize` (the quantizers, exact inverses of :mod:`.dequantize`; its work in
:mod:`.quantize_common`, :mod:`.quantize_affine` with :mod:`.quantize_simd`,
:mod:`.quantize_nf4_mxfp` and :mod:`.nibble_records`).
"""

from .common import DecodedTypeMismatch, decoded_type
from .elements import UnsupportedEvaluation, numpy_dtype
from .merge import lookup, materialize, read
from .region import read_box
from .indexing import basic_index, read_index
from .sparse import densify, sparse_entries
from .tensor import tensor_to_numpy

__all__ = ["tensor_to_numpy", "materialize", "lookup", "read", "read_box", "densify", "sparse_entries", "numpy_dtype",
           "basic_index", "read_index", "decoded_type", "UnsupportedEvaluation", "DecodedTypeMismatch"]
