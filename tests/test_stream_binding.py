"""A strict stream read binds a composite it has bound cleanly before without validating it again
(``rules/composite.py``: the bindings the decoder's memo keeps), and still meets every fault of one that differs in
a single member: the rule id and byte offset ``audit`` reports, raised by the read."""

from __future__ import annotations

import numpy as np
import pytest

from hurray_schema import audit
from hurray_schema.errors import SpecViolation
from hurray_schema.io import Composite, Tensor, read_stream, write_stream
from hurray_schema.model import ElementType, Shard
from hurray_schema.rules import composite as binding

F32, F16 = ElementType.FLOAT32, ElementType.FLOAT16


def _half(offset, shape=(4, 3), type_tag=F32) -> Tensor:
    width = 2 if type_tag == F16 else 4
    return Tensor.dense(type_tag, shape, bytes(width * shape[0] * shape[1]), shard=Shard((4, 6), offset))


def _partition(second: Tensor) -> Composite:
    return Composite.build("partition", [_half((0, 0)), second], shape=(4, 6), type_tag=F32)


GOOD = _partition(_half((0, 3)))
SPOILED = {
    "a gap (found at close)": _partition(_half((0, 3), shape=(4, 2))),
    "a member of another type (found as it arrives)": _partition(_half((0, 3), type_tag=F16)),
}


def test_repeated_composites_are_bound_once_and_read_alike(monkeypatch):
    stream = write_stream(None, [GOOD] * 4)
    made = []
    real = binding.CompositeValidator
    monkeypatch.setattr(binding, "CompositeValidator", lambda *a, **k: made.append(1) or real(*a, **k))
    items = list(read_stream(stream))
    # at most the first two heads are new objects (one decoded the general way, then the one its
    # compiled header gives every later copy of those bytes): the last two are bound as remembered
    assert len(items) == 4 and 1 <= len(made) <= 2
    for item in items:
        np.testing.assert_array_equal(np.asarray(item), np.zeros((4, 6), np.float32))


@pytest.mark.parametrize("fault", sorted(SPOILED))
def test_a_composite_that_differs_from_one_bound_before_raises_audits_fault(fault):
    stream = write_stream(None, [GOOD] * 3 + [SPOILED[fault]], validate=False)
    first_error = audit(stream).errors[0]
    with pytest.raises(SpecViolation) as raised:
        list(read_stream(stream))
    assert (raised.value.rule_id, raised.value.offset) == (first_error.rule_id, first_error.offset)
    assert first_error.offset >= 3 * len(write_stream(None, [GOOD]))  # in the fourth composite
