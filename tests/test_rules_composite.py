"""Composite validator: head, per-member and close-time rules; the seed's worked examples;
the partition check against a brute-force oracle."""

from __future__ import annotations

import itertools
import re

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hurray_schema as hs
from hurray_schema.codec import decode_descriptor, encode_descriptor
from hurray_schema.model import (
    BufferHandle as B, CombineOp, CompositeLayout, CompositeMember, CompositionRule, CooLayout,
    ElementType as T, PerBlockAffine, Shard, TensorDescriptor as D,
)
from hurray_schema.rules.composite import CompositeValidator, decoded_type, partition_check, validate_preorder
from hurray_schema.rules.engine import get_rule
from support.descriptors import head, member
from support.rule_cases import COMPOSITE_CASES as CASES, M0, M1

ev = attrs.evolve
F32, F16 = T.FLOAT32, T.FLOAT16


GROUP = head(CompositionRule.GROUP, 2)


def run(h, members, mode="strict"):
    v = CompositeValidator(h, mode=mode)
    for m in members:
        v.push_member(m)
    v.close()
    return v


def fired(h, members, **kw):
    v = CompositeValidator(h, collect=True, **kw)
    for m in members:
        v.push_member(m)
    v.close()
    return v.findings


@pytest.mark.parametrize("rule_id,h,good,bad", CASES, ids=[c[0] for c in CASES])
def test_rule_passes_then_fires(rule_id, h, good, bad):
    rule = get_rule(rule_id)
    if rule_id == "composite.close.overlay_empty":
        h_bad = ev(h, layout=CompositeLayout(CompositionRule.OVERLAY, 0, CombineOp.REPLACE))
    else:
        h_bad = h
    v = run(h, good)  # strict: passes without raising
    assert v.ok and v.findings == []
    found = [f for f in fired(h_bad, bad) if f.rule_id == rule_id]
    assert found and found[0].citation == rule.citation and ".md" in rule.citation
    with pytest.raises(hs.SpecViolation) as exc:
        run(h_bad, bad)
    if not rule.permissive:
        assert exc.value.rule_id == rule_id


def test_group_members_may_differ_but_carry_no_member_section():
    odd = [member((3,), (0,), (3,), t=T.INT8, size=3), D(F16, (2, 2), buffers=[B(8)])]
    assert run(GROUP, odd).ok
    found = fired(GROUP, [odd[0], ev(odd[1], composite_member=CompositeMember(0))])
    assert [f.rule_id for f in found] == ["composite.member.no_member_section"]


def test_head_rules_run_when_the_validator_is_built():
    with pytest.raises(hs.SpecViolation) as exc:
        CompositeValidator(ev(head(), byte_offset=8))
    assert exc.value.rule_id == "composite.head.byte_offset_zero"
    v = CompositeValidator(ev(head(), layout=CompositeLayout(0xF2, 1)), mode="permissive")
    assert [f.rule_id for f in v.findings] == ["composite.head.rule_private"] and v.ok


def test_permissive_keeps_a_violating_partition():
    v = run(head(), [M0, member((8, 3), (0, 4))], mode="permissive")
    (f,) = v.findings
    assert f.rule_id == "composite.close.partition_gap" and f.tolerated and v.ok


# -- the seed's worked examples ------------------------------------------------------------


def test_seed_partition_8x8_and_resolve():
    h = head()
    for d in (h, M0, M1):
        assert decode_descriptor(encode_descriptor(d)) == d
    v = run(h, [M0, M1])
    assert v.findings == []
    assert v.resolve([3, 6]) == (1, (3, 2))
    assert v.resolve([7, 3]) == (0, (7, 3))
    with pytest.raises(IndexError):
        v.resolve([8, 0])


def test_seed_spqr_overlay():
    n = 4096
    blocks = n * (n // 128)
    h = head(CompositionRule.OVERLAY, 2, (n, n), F16, CombineOp.REPLACE)
    base = D(T.INT4, (n, n), buffers=[B(n * n // 2), B(blocks * 2), B(blocks * 4)],
             quantization=PerBlockAffine(1, 128, 1, 2, scale_type_tag=F16),
             shard=Shard((n, n), (0, 0)), composite_member=CompositeMember(1))
    corr = D(F16, (n, n), CooLayout(3), buffers=[B(6), B(48)], shard=Shard((n, n), (0, 0)),
             composite_member=CompositeMember(0))
    for d in (h, base, corr):
        assert decode_descriptor(encode_descriptor(d)) == d
    assert decoded_type(base) == F16  # int4 storage decodes through its float16 scales
    assert run(h, [base, corr]).findings == []
    # the same base with float32 scales decodes to float32, not the head's float16
    base32 = ev(base, buffers=[B(n * n // 2), B(blocks * 4), B(blocks * 4)],
                quantization=PerBlockAffine(1, 128, 1, 2, scale_type_tag=F32))
    assert [f.rule_id for f in fired(h, [base32, corr])] == ["composite.member.decoded_type"]


# -- nesting and torn composites -----------------------------------------------------------


def _chain(levels):
    """``levels`` nested group heads, the innermost holding one tensor (pre-order)."""
    heads = [head(CompositionRule.GROUP, 1, (4,)) for _ in range(levels)]
    return heads + [D(F32, (4,), buffers=[B(16)])]


def test_nesting_depth_limit():
    assert validate_preorder(_chain(8)) == []
    with pytest.raises(hs.SpecViolation) as exc:
        validate_preorder(_chain(9))
    assert exc.value.rule_id == "composite.nesting.depth"
    assert exc.value.citation == get_rule("composite.nesting.depth").citation
    found = validate_preorder(_chain(9), collect=True)
    assert [f.rule_id for f in found] == ["composite.nesting.depth"]


def test_nested_partition_member_is_validated_as_a_box():
    inner = ev(head(CompositionRule.PARTITION, 2, (8, 4)), shard=Shard((8, 8), (0, 4)))
    parts = [member((4, 4), (0, 0), (8, 4)), member((4, 4), (4, 0), (8, 4))]
    assert validate_preorder([head(), M0, inner, *parts]) == []
    wrong = ev(inner, type_tag=F16)
    with pytest.raises(hs.SpecViolation) as exc:
        validate_preorder([head(), M0, wrong, *parts])
    assert exc.value.rule_id == "composite.member.decoded_type"


def test_torn_composite():
    v = CompositeValidator(head())
    v.push_member(M0)
    with pytest.raises(hs.SpecViolation) as exc:
        v.close()
    assert exc.value.rule_id == "composite.torn"
    v = CompositeValidator(head(), mode="permissive")
    v.push_member(M0)
    assert v.torn() == (M0,)
    assert v.torn_composite and not v.complete and v.findings[0].tolerated
    with pytest.raises(hs.SpecViolation):
        validate_preorder([head(), M0])
    found = validate_preorder([head(), M0], mode="permissive")
    assert [f.rule_id for f in found] == ["composite.torn"]


def test_push_beyond_member_count_is_an_api_error():
    v = CompositeValidator(head())
    v.push_member(M0)
    v.push_member(M1)
    with pytest.raises(ValueError):
        v.push_member(M1)


# -- the partition check against brute force -----------------------------------------------


def _formula_overlap(a, b) -> bool:
    """The non-overlap formula of layouts/composite.md § Composition Semantics › Partition, verbatim."""
    (ao, ash), (bo, bsh) = a, b
    return all(ao[k] < bo[k] + bsh[k] and bo[k] < ao[k] + ash[k] for k in range(len(ao)))


def _oracle(shape, boxes):
    """(uncovered indices, covered volume, overlapping pairs) by brute force."""
    cover = np.zeros(shape, dtype=np.int64)
    for off, shp in boxes:
        cover[tuple(slice(o, o + s) for o, s in zip(off, shp))] += 1
    holes = {tuple(int(v) for v in idx) for idx in np.argwhere(cover == 0)}
    pairs = {(i, j) for i, j in itertools.combinations(range(len(boxes)), 2) if _formula_overlap(boxes[i], boxes[j])}
    return holes, int((cover > 0).sum()), pairs


GAP_MESSAGE = re.compile(r"no member covers index \[([0-9, ]*)\] \(members cover (\d+) of (\d+) indices\)")
OVERLAP_MESSAGE = re.compile(r"members \[([0-9, ]+)\] overlap")
SHARED_INDEX = re.compile(r"each contains index \[([0-9, ]*)\]")


def _ints(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


def _check_against_oracle(shape, boxes, findings, *, covered_known=True):
    holes, covered, pairs = _oracle(shape, boxes)
    by_rule = {rule.id: message for rule, message in findings}
    assert len(by_rule) == len(findings)
    if np.prod(shape) == 0:
        assert findings == []  # nothing to cover; the formula fails along the empty dimension
        return
    # a gap is reported exactly when an index is uncovered: with one uncovered index and the true covered volume
    assert ("composite.close.partition_gap" in by_rule) == bool(holes), (by_rule, holes)
    if holes:
        m = GAP_MESSAGE.search(by_rule["composite.close.partition_gap"])
        if m is None and not covered_known:
            return
        assert m, by_rule
        assert _ints(m.group(1)) in holes
        assert (int(m.group(2)), int(m.group(3))) == (covered, int(np.prod(shape)))
    # an overlap is reported exactly when two boxes meet the spec's formula, naming such boxes
    assert ("composite.close.partition_overlap" in by_rule) == bool(pairs), (by_rule, pairs)
    if pairs:
        message = by_rule["composite.close.partition_overlap"]
        named = _ints(OVERLAP_MESSAGE.search(message).group(1))
        assert len(named) >= 2 and all(_formula_overlap(boxes[a], boxes[b])
                                       for a, b in itertools.combinations(named, 2))
        shared = SHARED_INDEX.search(message)
        if shared:
            idx = _ints(shared.group(1))
            assert all(all(o <= i < o + s for i, o, s in zip(idx, *boxes[a])) for a in named)


@st.composite
def box_sets(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank)))
    n = draw(st.integers(0, 6))
    boxes = []
    for _ in range(n):
        off = tuple(draw(st.integers(0, d)) for d in shape)
        shp = tuple(draw(st.integers(0, d - o)) for o, d in zip(off, shape))
        boxes.append((off, shp))
    return shape, boxes


def _split(shape, cuts):
    """A grid partition of ``shape`` cut at ``cuts[k]`` along dimension ``k``."""
    edges = [sorted({0, d, *[c for c in cs if 0 < c < d]}) for d, cs in zip(shape, cuts)]
    return [(tuple(e[i] for e, i in zip(edges, idx)), tuple(e[i + 1] - e[i] for e, i in zip(edges, idx)))
            for idx in itertools.product(*[range(len(e) - 1) for e in edges])]


@settings(max_examples=400, deadline=None)
@given(box_sets())
def test_partition_check_matches_brute_force(case):
    shape, boxes = case
    _check_against_oracle(shape, boxes, partition_check(shape, [b[0] for b in boxes], [b[1] for b in boxes]))


@pytest.fixture
def without_fast_paths(monkeypatch):
    """The sweep decides validity and the region search locates faults (as for high rank or
    huge extents): no corner identity, no compressed grid."""
    from hurray_schema.rules import composite_geometry as composite

    monkeypatch.setattr(composite, "_MAX_CORNER_RANK", 0)
    monkeypatch.setattr(composite, "_GRID_CELLS", 0)
    monkeypatch.setattr(composite, "_FEW_BOXES", 0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(box_sets())
def test_partition_check_fallback_matches_brute_force(without_fast_paths, case):
    shape, boxes = case
    findings = partition_check(shape, [b[0] for b in boxes], [b[1] for b in boxes])
    # with overlapping boxes the fallback names an uncovered index but not the covered volume
    _check_against_oracle(shape, boxes, findings, covered_known=False)


@st.composite
def partitions_with_empty_members(draw):
    """A grid partition plus empty boxes, some strictly inside a member along their zero extent."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    cuts = [draw(st.lists(st.integers(0, d), max_size=2)) for d in shape]
    boxes = _split(shape, cuts)
    for _ in range(draw(st.integers(1, 3))):
        off = tuple(draw(st.integers(0, d)) for d in shape)
        shp = [draw(st.integers(0, d - o)) for o, d in zip(off, shape)]
        shp[draw(st.integers(0, rank - 1))] = 0
        boxes.insert(draw(st.integers(0, len(boxes))), (off, tuple(shp)))
    return shape, boxes


@settings(max_examples=300, deadline=None)
@given(partitions_with_empty_members())
def test_empty_members_overlap_by_the_formula(case):
    shape, boxes = case
    _check_against_oracle(shape, boxes, partition_check(shape, [b[0] for b in boxes], [b[1] for b in boxes]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_grid_partitions_validate(shape, data):
    cuts = [data.draw(st.lists(st.integers(0, d), max_size=3)) for d in shape]
    boxes = _split(tuple(shape), cuts)
    assert partition_check(shape, [b[0] for b in boxes], [b[1] for b in boxes]) == []


def _staircase(rank):
    """An exact partition of [2]*rank into rank+1 boxes that splits every dimension."""
    boxes = []
    for k in range(rank):
        boxes.append((tuple([0] * k + [1] + [0] * (rank - k - 1)), tuple([1] * k + [1] + [2] * (rank - k - 1))))
    boxes.append(((0,) * rank, (1,) * rank))
    return boxes


@pytest.mark.parametrize("rank", [3, 17])  # 17 > 16: the exact sort-and-sweep fallback
def test_partition_check_high_rank(rank):
    shape = (2,) * rank
    boxes = _staircase(rank)
    assert partition_check(shape, [b[0] for b in boxes], [b[1] for b in boxes]) == []
    gap = boxes[:-1]
    assert {r.id for r, _ in partition_check(shape, [b[0] for b in gap], [b[1] for b in gap])} == {
        "composite.close.partition_gap"}
    over = boxes + [boxes[-1]]
    assert "composite.close.partition_overlap" in {
        r.id for r, _ in partition_check(shape, [b[0] for b in over], [b[1] for b in over])}


def test_partition_check_huge_extents():
    big = (1 << 63, 4)
    ok = [((0, 0), (1 << 62, 4)), ((1 << 62, 0), (1 << 62, 4))]
    assert partition_check(big, [b[0] for b in ok], [b[1] for b in ok]) == []
    bad = [((0, 0), (1 << 62, 4)), ((1 << 61, 0), (1 << 62, 4))]
    assert {r.id for r, _ in partition_check(big, [b[0] for b in bad], [b[1] for b in bad])} == {
        "composite.close.partition_overlap", "composite.close.partition_gap"}


def test_empty_boxes_cover_nothing_and_overlap_by_the_formula():
    # an empty member strictly inside another member's box along its zero extent meets the
    # spec's overlap formula (the reference rejects it too); on a boundary it does not
    inside = [((0, 0), (4, 4)), ((2, 2), (0, 3))]
    (found,) = partition_check((4, 4), [b[0] for b in inside], [b[1] for b in inside])
    assert found[0].id == "composite.close.partition_overlap" and "members [0, 1]" in found[1]
    on_edge = [((0, 0), (4, 4)), ((0, 2), (0, 3)), ((4, 0), (0, 4))]
    assert partition_check((4, 4), [b[0] for b in on_edge], [b[1] for b in on_edge]) == []
    between = [((0, 0), (2, 4)), ((2, 0), (2, 4)), ((2, 1), (0, 2))]  # on the cut between two members
    assert partition_check((4, 4), [b[0] for b in between], [b[1] for b in between]) == []
    assert partition_check((0, 4), [(0, 0)], [(0, 4)]) == []
    assert partition_check((), [(), ()], [(), ()])[0][0].id == "composite.close.partition_overlap"
    assert partition_check((), [()], [()]) == []


def test_gap_message_counts_every_dimension():
    # the README's faulty stream: [4, 6] with members [4, 3] at column 0 and [4, 2] at column 3
    boxes = [((0, 0), (4, 3)), ((0, 3), (4, 2))]
    ((rule, message),) = partition_check((4, 6), [b[0] for b in boxes], [b[1] for b in boxes])
    assert rule.id == "composite.close.partition_gap"
    assert message == "no member covers index [0, 5] (members cover 20 of 24 indices)"


def test_overlap_without_gap_is_not_a_gap():
    boxes = [((0, 0), (8, 5)), ((0, 4), (8, 4))]  # column 4 twice, nothing left out
    found = partition_check((8, 8), [b[0] for b in boxes], [b[1] for b in boxes])
    assert [r.id for r, _ in found] == ["composite.close.partition_overlap"]
    assert found[0][1] == "members [0, 1] overlap: each contains index [0, 4]"


def _bare_stream(descs) -> bytes:
    return b"".join(encode_descriptor(d) + bytes(sum(b.byte_size for b in d.buffers)) for d in descs)


def test_partition_with_empty_member_inside_is_rejected_by_both_sides():
    from fuzz import reference
    from hurray_schema.io.stream import read_stream

    assert reference.available(), "pyhurray (the reference) is required by this test"
    h = head(n=2)
    inside = _bare_stream([h, member((8, 8), (0, 0)), member((0, 4), (3, 2))])
    on_edge = _bare_stream([h, member((8, 8), (0, 0)), member((0, 4), (0, 2))])
    with pytest.raises(hs.SpecViolation) as exc:
        list(read_stream(inside, framing="bare"))
    assert exc.value.rule_id == "composite.close.partition_overlap"
    assert len(list(read_stream(on_edge, framing="bare"))) == 1
    with reference.Reference() as ref:
        assert ref.stream(inside) not in (None, reference.ABORT)
        assert ref.stream(on_edge) is None


def test_resolve_on_an_irregular_rank3_partition(monkeypatch):
    import random
    from pathlib import Path

    # for this test only: benchmarks/ holds modules named like packages (dask.py, io.py, support.py)
    # that would shadow them for whatever runs later in this process (a dask worker it spawns)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from partition_validation import guillotine

    shape = (16, 12, 10)
    boxes = guillotine(shape, 300, random.Random(5))
    h = D(T.UINT8, shape, CompositeLayout(CompositionRule.PARTITION, len(boxes)))
    v = CompositeValidator(h)
    for o, s in boxes:
        v.push_member(D(T.UINT8, s, buffers=[B(int(np.prod(s)))], shard=Shard(shape, o)))
    assert v.close() == []
    rng = random.Random(6)
    for _ in range(200):
        idx = tuple(rng.randrange(d) for d in shape)
        want = [m for m, (o, s) in enumerate(boxes) if all(a <= i < a + n for i, a, n in zip(idx, o, s))]
        assert len(want) == 1
        o = boxes[want[0]][0]
        assert v.resolve(idx) == (want[0], tuple(i - a for i, a in zip(idx, o)))


def test_a_clean_partition_is_remembered_and_a_faulty_one_still_fires():
    """Close-time checks remember the boxes of clean partitions (a stream repeats its
    sharding); a faulty partition of the same head is never taken for one of them."""
    from hurray_schema.codec import DECODER

    def tilings() -> int:
        return DECODER.stats()["tilings"][0]

    assert run(head(), [M0, M1]).findings == []
    assert tilings() == 1
    assert run(head(), [M0, M1]).findings == [] and tilings() == 1  # the same boxes: taken as remembered
    assert run(head(), [M1, M0]).findings == [] and tilings() == 2
    twice = fired(head(), [M0, M0])
    assert {f.rule_id for f in twice} == {"composite.close.partition_overlap", "composite.close.partition_gap"}
    assert tilings() == 2  # a faulty partition is never remembered
    DECODER.reset()
    assert fired(head(), [M0, M0]) == twice
