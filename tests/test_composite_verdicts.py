"""One composite fault, one rule id, one byte offset -- whichever entry point finds it.

A table of composite faults (``layouts/composite.md § Validation``, ``§ Binding``) is
written with the project's writers as a bare stream, a message stream and a file, then
driven through ``read_stream`` (both framings), ``read_file``, ``audit`` of each, and
``validate_preorder`` / ``CompositeValidator``.  Every entry point must name the same
rule, at the same place in its container.

Expected offsets are not taken from the code under test: a descriptor is located by
searching the container for its encoded bytes (in pre-order, each search starting after
the previous descriptor), and a field inside it as the first byte that changes when the
field's value is changed (``field_at``).  Where each fault is located is the convention
of ``hurray_schema.rules.composite`` (its module docstring): a member's field, the member
descriptor, or the head descriptor (close-time faults, the outermost torn composite).

Also here: the evaluator rejects nine nested levels with the readers' rule, and
``materialize``, ``read`` and ``lookup`` of an invalid in-memory composite raise one
and the same SpecViolation.
"""

from __future__ import annotations

import struct
from typing import Callable, NamedTuple, Optional

import attrs
import pytest

from hurray_schema import audit
from hurray_schema.codec import encode_descriptor
from hurray_schema.errors import SpecViolation
from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file, write_stream
from hurray_schema.io.tensor import walk
from hurray_schema.limits import MAX_COMPOSITE_DEPTH
from hurray_schema.model import (
    CombineOp, CompositeMember, CompositionRule, ElementType, MemberRole, Shard, TensorDescriptor,
)
from hurray_schema.rules.composite import CompositeValidator, validate_preorder
from support.descriptors import head

F32, F16 = ElementType.FLOAT32, ElementType.FLOAT16
PARTITION, OVERLAY = CompositionRule.PARTITION, CompositionRule.OVERLAY

WRITER_OPTIONS: dict = {"validate": False}
"""Passed to every writer below.  The writers do not validate yet; once they refuse to
write an invalid composite, this becomes ``{"validate": False}``."""


# --------------------------------------------------------------------------------------
# Building the faulty composites
# --------------------------------------------------------------------------------------


def values(n: int, dtype: str = "f") -> bytes:
    return struct.pack(f"<{n}{dtype}", *range(1, n + 1))


def member(size: int, offset: int = 0, parent: int = 4, *, type_tag=F32, role: Optional[MemberRole] = None) -> Tensor:
    """A rank-1 member of ``size`` elements at ``offset`` of a ``[parent]`` head."""
    data = values(size, "e" if type_tag == F16 else "f")
    tensor = Tensor.dense(type_tag, [size], data, shard=Shard((parent,), (offset,)))
    if role is None:
        return tensor
    return Tensor(attrs.evolve(tensor.descriptor, composite_member=CompositeMember(role)), tensor.buffers)


def composite(head_desc: TensorDescriptor, members: list) -> Composite:
    """A Composite of ``head_desc`` over ``members`` even when the head promises more
    members than given (a torn composite, which the class itself refuses to build)."""
    honest = attrs.evolve(head_desc, layout=attrs.evolve(head_desc.layout, member_count=len(members)))
    item = Composite(honest, members)
    item.descriptor = head_desc
    return item


def nested(levels: int) -> Composite:
    """``levels`` partition heads of shape [2], each the one member of the one above it."""
    item: object = member(2, parent=2)
    for level in range(levels):
        outer = level < levels - 1
        item = Composite(head(PARTITION, 1, (2,), shard=Shard((2,), (0,)) if outer else None), [item])
    return item


class Fault(NamedTuple):
    rule_id: str
    item: Callable[[], Composite]
    where: int
    """Pre-order index of the descriptor the fault is located at (the head is 0)."""
    field: Optional[Callable[[TensorDescriptor], TensorDescriptor]] = None
    """Changes the faulty field of that descriptor (None: the descriptor's first byte)."""


def _shard_offset(desc):
    return attrs.evolve(desc, shard=Shard(desc.shard.parent_shape, (desc.shard.shard_offset[0] ^ 1,)))


def _parent_shape(desc):
    return attrs.evolve(desc, shard=Shard((desc.shard.parent_shape[0] ^ 1,), desc.shard.shard_offset))


def _member_role(desc):
    return attrs.evolve(desc, composite_member=CompositeMember(desc.composite_member.member_role ^ 1))


FAULTS = {
    "torn": Fault("composite.torn", lambda: composite(head(PARTITION, 3, (4,)), [member(2), member(2, 2)]), 0),
    "nesting 9 deep": Fault("composite.nesting.depth", lambda: nested(MAX_COMPOSITE_DEPTH + 1), MAX_COMPOSITE_DEPTH),
    "gap": Fault("composite.close.partition_gap", lambda: Composite(head(PARTITION, 1, (4,)), [member(2)]), 0),
    "overlap": Fault("composite.close.partition_overlap",
                     lambda: Composite(head(PARTITION, 2, (4,)), [member(3), member(2, 2)]), 0),
    # a member box past the head is the member's shard past its parent_shape (= the head's shape): one rule
    "member out of bounds": Fault("metadata.shard.bounds",
                                  lambda: Composite(head(PARTITION, 2, (4,)), [member(2), member(4, 2)]), 2, _shard_offset),
    "wrong parent shape": Fault("composite.member.parent_shape",
                                lambda: Composite(head(PARTITION, 2, (4,)), [member(2), member(2, 2, parent=6)]), 2,
                                _parent_shape),
    "overlay base not first": Fault(
        "composite.member.overlay_base_first",
        lambda: Composite(head(OVERLAY, 2, (4,), op=CombineOp.ADD),
                          [member(4, role=MemberRole.CORRECTION), member(1, 1, role=MemberRole.CORRECTION)]),
        1, _member_role),
    "wrong member type": Fault("composite.member.decoded_type",
                               lambda: Composite(head(PARTITION, 2, (4,)), [member(2), member(2, 2, type_tag=F16)]), 2),
    "member section on a partition member": Fault(
        "composite.member.no_member_section",
        lambda: Composite(head(PARTITION, 2, (4,)), [member(2, role=MemberRole.BASE), member(2, 2)]), 1),
    "zero-member overlay": Fault("composite.close.overlay_empty",
                                 lambda: Composite(head(OVERLAY, 0, (4,), op=CombineOp.REPLACE), []), 0),
    # no member covers the head's four indices (spec-map.md § Interpretations: zero-member heads)
    "zero-member partition": Fault("composite.close.partition_gap", lambda: Composite(head(PARTITION, 0, (4,)), []), 0),
}


# --------------------------------------------------------------------------------------
# Writing them, and where their descriptors and fields are
# --------------------------------------------------------------------------------------


def written(item: Composite, container: str, tmp_path) -> bytes:
    """``item`` as a bare stream, a message stream or a file, by the project's writers."""
    if container == "file":
        path = tmp_path / "fault.hrry"
        write_file(path, {"c": item}, **WRITER_OPTIONS)
        return path.read_bytes()
    return write_stream(None, [item], framing=container, **WRITER_OPTIONS)


def descriptor_offsets(data: bytes, item: Composite) -> list[int]:
    """Where each descriptor of ``item`` (pre-order) starts in ``data``."""
    offsets, pos = [], 0
    for _name, node in walk(item):
        pos = data.index(encode_descriptor(node.descriptor), pos)
        offsets.append(pos)
        pos += 1
    return offsets


def field_at(desc: TensorDescriptor, change) -> int:
    """Offset of a field in ``desc``'s encoding: the first byte that ``change`` alters."""
    before, after = encode_descriptor(desc), encode_descriptor(change(desc))
    assert len(before) == len(after)
    return next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)


def expected(fault: Fault, item: Composite, data: bytes) -> tuple[str, int]:
    descs = [node.descriptor for _name, node in walk(item)]
    at = descriptor_offsets(data, item)[fault.where]
    if fault.field is not None:
        at += field_at(descs[fault.where], fault.field)
    return fault.rule_id, at


# --------------------------------------------------------------------------------------
# The entry points, each reduced to (rule id, offset) of the one fault it reports
# --------------------------------------------------------------------------------------


def raised(call) -> tuple[str, Optional[int]]:
    with pytest.raises(SpecViolation) as info:
        call()
    return info.value.rule_id, info.value.offset


def audited(data: bytes, kind: str, tmp_path) -> list[tuple[str, Optional[int]]]:
    if kind == "file":
        path = tmp_path / "audited.hrry"
        path.write_bytes(data)
        report = audit(path)
    else:
        report = audit(data, kind=kind)
    assert not report.ok
    return [(f.rule_id, f.offset) for f in report.findings]


def preorder_descriptors(item: Composite) -> list[TensorDescriptor]:
    return [node.descriptor for _name, node in walk(item)]


def validator_verdict(item: Composite, offsets: list[int]) -> tuple[str, Optional[int]]:
    """The one-composite validator fed by hand: the head, then each direct member (a nested
    head goes to a validator of its own, one level deeper, as the binder does)."""
    descs = preorder_descriptors(item)

    def run():
        stack = [CompositeValidator(descs[0], base=offsets[0])]
        for desc, base in zip(descs[1:], offsets[1:]):
            stack[-1].push_member(desc, base=base)
            if desc.is_composite_head:
                stack.append(CompositeValidator(desc, base=base, depth=len(stack) + 1))
            while stack and stack[-1].complete:
                stack.pop().close()
        for validator in stack[:1]:
            validator.close()  # an incomplete composite closed early is torn

    return raised(run)


@pytest.mark.parametrize("name", list(FAULTS))
def test_one_rule_one_offset(name, tmp_path):
    fault = FAULTS[name]
    item = fault.item()
    bare = written(item, "bare", tmp_path)
    messages = written(item, "messages", tmp_path)
    hrry = written(item, "file", tmp_path)
    want = {container: expected(fault, item, data)
            for container, data in (("bare", bare), ("messages", messages), ("file", hrry))}
    bare_offsets = descriptor_offsets(bare, item)

    got = {
        "read_stream bare": (raised(lambda: list(read_stream(bare))), want["bare"]),
        "read_stream messages": (raised(lambda: list(read_stream(messages, framing="messages"))),
                                 want["messages"]),
        "read_file": (raised(lambda: read_file(tmp_path / "fault.hrry").close()), want["file"]),
        "validate_preorder": (raised(lambda: validate_preorder(preorder_descriptors(item), bases=bare_offsets)),
                              want["bare"]),
        "CompositeValidator": (validator_verdict(item, bare_offsets), want["bare"]),
    }
    for entry, (verdict, wanted) in got.items():
        assert verdict == wanted, entry
    for entry, data, kind in (("audit bare", bare, "stream"), ("audit messages", messages, "messages"),
                              ("audit file", hrry, "file")):
        assert audited(data, kind, tmp_path) == [want[kind if kind != "stream" else "bare"]], entry


def test_the_clean_counterparts_pass(tmp_path):
    """The same shapes without the fault: every entry point accepts them."""
    clean = [
        Composite(head(PARTITION, 2, (4,)), [member(2), member(2, 2)]),
        nested(MAX_COMPOSITE_DEPTH),
        Composite(head(OVERLAY, 2, (4,), op=CombineOp.ADD),
                  [member(4, role=MemberRole.BASE), member(1, 1, role=MemberRole.CORRECTION)]),
        Composite(head(PARTITION, 0, (0,)), []),  # an empty head: no index to cover
    ]
    for item in clean:
        for framing in ("bare", "messages"):
            data = written(item, framing, tmp_path)
            assert len(list(read_stream(data, framing=framing))) == 1
            assert audit(data, kind="stream" if framing == "bare" else "messages").ok
        written(item, "file", tmp_path)
        with read_file(tmp_path / "fault.hrry") as f:
            assert isinstance(f["c"], Composite)
        assert audit(tmp_path / "fault.hrry").ok
        assert validate_preorder(preorder_descriptors(item)) == []


def scalar_partition(count: int) -> Composite:
    """A partition of a rank-0 head over ``count`` rank-0 members (each the head's one index)."""
    return Composite(head(PARTITION, count, ()),
                     [Tensor.dense(F32, [], values(1), shard=Shard((), ())) for _ in range(count)])


def test_a_scalar_partition_of_two_members_overlaps_wherever_it_is_read(tmp_path):
    """A rank-0 head's index space has one index, which both rank-0 members contain: the
    non-overlap formula of ``layouts/composite.md § Composition Semantics › Partition`` holds
    vacuously ("for every dimension k", there is none).  Read after a valid one-member scalar
    partition (which the binder remembers as a clean tiling), every entry point still names
    ``composite.close.partition_overlap`` at the second head; the one-member one stays valid
    (issue 28, item 1: its remembered boxes were taken for the two-member partition's)."""
    one, two = scalar_partition(1), scalar_partition(2)
    rule = "composite.close.partition_overlap"
    bare = write_stream(None, [one, two], **WRITER_OPTIONS)
    messages = write_stream(None, [one, two], framing="messages", **WRITER_OPTIONS)
    path = tmp_path / "scalar.hrry"
    write_file(path, {"one": one, "two": two}, **WRITER_OPTIONS)
    hrry = path.read_bytes()
    want = {name: (rule, data.index(encode_descriptor(two.descriptor)))
            for name, data in (("bare", bare), ("messages", messages), ("file", hrry))}
    assert raised(lambda: list(read_stream(bare))) == want["bare"]
    assert raised(lambda: list(read_stream(messages, framing="messages"))) == want["messages"]
    assert raised(lambda: read_file(path).close()) == want["file"]
    assert audited(bare, "stream", tmp_path) == [want["bare"]]
    assert audited(messages, "messages", tmp_path) == [want["messages"]]
    assert audited(hrry, "file", tmp_path) == [want["file"]]
    descs = preorder_descriptors(one) + preorder_descriptors(two)
    assert raised(lambda: validate_preorder(descs)) == (rule, None)
    assert raised(two.materialize) == (rule, None)
    (kept,) = read_stream(write_stream(None, [one], **WRITER_OPTIONS))
    assert audit(write_stream(None, [one], **WRITER_OPTIONS), kind="stream").ok
    assert kept.materialize().tolist() == 1.0 and one.materialize().tolist() == 1.0


def test_a_zero_member_partition_is_valid_only_with_an_empty_head():
    """The note of ``layouts/composite.md § Head Layout-Specific Fields`` calls a zero-member
    head syntactically valid, with validation "trivially satisfied at N = 0"; the coverage
    constraint of ``§ Composition Semantics › Partition`` asks every index of the head to be
    in exactly one member's box.  We follow the normative constraint, as pyhurray does: a
    zero-member partition of an empty head [0] is valid, of [4] it leaves a gap (spec-map.md
    § Interpretations)."""
    from fuzz import reference

    assert reference.available(), "pyhurray (the reference) is required by this test"
    empty = write_stream(None, [Composite(head(PARTITION, 0, (0,)), [])], **WRITER_OPTIONS)
    four = write_stream(None, [Composite(head(PARTITION, 0, (4,)), [])], **WRITER_OPTIONS)
    (bound,) = read_stream(empty)
    assert isinstance(bound, Composite) and bound.materialize().shape == (0,)
    assert audit(empty, kind="stream").ok
    assert raised(lambda: list(read_stream(four))) == ("composite.close.partition_gap", 0)
    with reference.Reference() as ref:
        assert ref.stream(empty) is None
        assert ref.stream(four) not in (None, reference.ABORT)


# --------------------------------------------------------------------------------------
# The evaluator sees the binder's verdict
# --------------------------------------------------------------------------------------


def test_evaluator_rejects_nine_levels_with_the_readers_rule():
    deep = nested(MAX_COMPOSITE_DEPTH + 1)
    reader_rule, _ = raised(lambda: list(read_stream(write_stream(None, [deep], **WRITER_OPTIONS))))
    assert reader_rule == "composite.nesting.depth"
    for evaluate in (deep.materialize, lambda: deep.lookup((0,)), lambda: deep.read([(0, 2)])):
        with pytest.raises(SpecViolation) as info:
            evaluate()
        assert info.value.rule_id == reader_rule
    ok = nested(MAX_COMPOSITE_DEPTH)
    assert ok.materialize().tolist() == [1.0, 2.0]
    assert ok.lookup((1,)) == 2.0 and ok.read([(0, 2)]).tolist() == [1.0, 2.0]


IN_MEMORY = [name for name in FAULTS if name != "torn"]  # a torn composite cannot be held in memory whole


@pytest.mark.parametrize("name", IN_MEMORY)
def test_every_evaluation_raises_the_binders_violation(name):
    item = FAULTS[name].item()
    found = []
    for evaluate in (item.materialize, lambda: item.read([(0, 1)]), lambda: item.lookup((0,))):
        with pytest.raises(SpecViolation) as info:
            evaluate()
        found.append((info.value.rule_id, info.value.citation, info.value.offset, info.value.message))
    assert found[0][0] == FAULTS[name].rule_id
    assert found[0] == found[1] == found[2]


def test_a_partition_gap_is_never_read_as_zeros():
    gap = FAULTS["gap"].item()
    with pytest.raises(SpecViolation) as info:
        gap.read([(2, 4)])  # the region no member covers
    assert info.value.rule_id == "composite.close.partition_gap"
    with pytest.raises(SpecViolation):
        gap.lookup((3,))


def test_the_verdict_is_kept_and_readers_mark_what_they_bound(monkeypatch):
    import hurray_schema.io.tensor as tensor_module

    runs = []

    def counting(descs, **options):
        runs.append(1)
        return validate_preorder(descs, **options)

    monkeypatch.setattr(tensor_module, "validate_preorder", counting)
    item = Composite(head(PARTITION, 2, (4,)), [member(2), member(2, 2)])
    assert item.materialize().tolist() == [1.0, 2.0, 1.0, 2.0]
    assert item.lookup((3,)) == 2.0 and item.read([(1, 3)]).tolist() == [2.0, 1.0]
    assert len(runs) == 1  # validated once, on first evaluation
    bad = FAULTS["gap"].item()
    for _ in range(2):
        with pytest.raises(SpecViolation):
            bad.materialize()
    assert len(runs) == 2  # an invalid verdict is kept too
    (bound,) = read_stream(write_stream(None, [item], **WRITER_OPTIONS))
    assert bound.materialize().tolist() == [1.0, 2.0, 1.0, 2.0] and len(runs) == 2  # the reader's binder did it
    (unchecked,) = read_stream(write_stream(None, [bad], **WRITER_OPTIONS), validate_composites=False)
    with pytest.raises(SpecViolation):
        unchecked.materialize()  # bound without the checks: validated on first evaluation
    assert len(runs) == 3


def test_a_composite_kept_by_a_permissive_reader_is_still_rejected_by_the_evaluator():
    """A permissive reader keeps a partition with a gap (a tolerated finding) but does not
    mark it valid: evaluating it raises the rule the strict reader raises."""
    data = write_stream(None, [FAULTS["gap"].item()], **WRITER_OPTIONS)
    reader = read_stream(data, mode="permissive")
    (kept,) = reader
    assert [(f.rule_id, f.tolerated) for f in reader.findings] == [("composite.close.partition_gap", True)]
    strict_rule, _ = raised(lambda: list(read_stream(data)))
    for evaluate in (kept.materialize, lambda: kept.read([(0, 4)]), lambda: kept.lookup((0,))):
        with pytest.raises(SpecViolation) as info:
            evaluate()
        assert info.value.rule_id == strict_rule
