"""Semantic descriptor rules: for every rule one descriptor where it passes and one where it fires.

Each case is ``(rule_id, good, bad)``: ``good`` is a fully valid descriptor (it decodes in
strict mode, so no rule at all fires on it) and ``bad`` breaks the rule.  Sizes of
buffers are written out by hand from the spec's formulas, never computed by the library.
"""

from __future__ import annotations

import struct

import attrs
import pytest

import hurray_schema as hs
from hurray_schema.codec import decode_descriptor, encode_descriptor, parse_descriptor
from hurray_schema.model import (
    DYNAMIC_DIMENSION as DYN, NO_BUFFER_INDEX, BufferHandle as B, CompositeLayout, CompositionRule, CooLayout,
    CscLayout, CsrLayout, ElementType as T, LayoutTag, Nf4, PerBlockAffine, PerChannelAffine, Shard, Statistics,
    TensorDescriptor as D, TiledLayout,
)
from hurray_schema.rules.descriptor import check_descriptor
from hurray_schema.rules.engine import Level, get_rule
from support.descriptors import bufs, dense
from support.rule_cases import DESCRIPTOR_CASES as CASES, PC

ev = attrs.evolve


GOOD = dense()
COO = D(T.FLOAT32, (4, 4), CooLayout(2), buffers=bufs(8, 32))  # values 2*4, indices 2*2*8
CSR = D(T.FLOAT32, (3, 3), CsrLayout(3), buffers=bufs(12, 24, 32))  # values, 3 cols, 4 row_ptr
CSC = D(T.FLOAT32, (3, 3), CscLayout(3), buffers=bufs(12, 24, 32))
TILED = D(T.FLOAT32, (4, 4), TiledLayout((2, 2)), buffers=bufs(64))
PB_SYM = D(T.INT8, (4, 8), buffers=bufs(32, 32), quantization=PerBlockAffine(1, 4, 1, NO_BUFFER_INDEX, flags=1))
NF4 = D(T.UINT4, (4, 16), buffers=bufs(32, 32), quantization=Nf4(1, 8, 1))  # 2 blocks x 4 rows, float32
HEAD = D(T.FLOAT32, (8, 8), CompositeLayout(CompositionRule.PARTITION, 2))
STATS = dense(statistics=Statistics(computed_mask=0x1F, nnz=16, nm_n=2, nm_m=4, value_stddev=0.5))

FIRED_HERE = {rule_id for rule_id, _, _ in CASES}


def _decoded(desc):
    data = encode_descriptor(desc)
    back, _ = parse_descriptor(data, mode="permissive")
    assert encode_descriptor(back) == data
    return back, data


@pytest.mark.parametrize("rule_id,good,bad", CASES, ids=[c[0] for c in CASES])
def test_rule_passes_then_fires(rule_id, good, bad):
    rule = get_rule(rule_id)
    decode_descriptor(encode_descriptor(good))  # the passing input is fully valid in strict mode
    g, _ = _decoded(good)
    assert not [f for f in check_descriptor(g) if f.rule_id == rule_id]
    b, data = _decoded(bad)
    fired = [f for f in check_descriptor(b) if f.rule_id == rule_id]
    assert fired, f"{rule_id} did not fire"
    f = fired[0]
    assert f.citation == rule.citation and (".md" in f.citation or "ADR" in f.citation)
    assert f.level is rule.level
    assert f.offset is not None and 0 <= f.offset < len(data)
    if rule.level.is_requirement and not rule.permissive:
        with pytest.raises(hs.SpecViolation):
            decode_descriptor(data)


# -- the offset names the faulty field: read the raw bytes there ---------------------------

U8 = lambda data, at: data[at]  # noqa: E731
U32 = lambda data, at: struct.unpack_from("<I", data, at)[0]  # noqa: E731
U64 = lambda data, at: struct.unpack_from("<Q", data, at)[0]  # noqa: E731
OFFSET_PROBES = {
    "buffer.reserved": (U8, 1),
    "buffer.alignment.power_of_two": (U32, 48),
    "buffer.sync_mode.cpu": (U8, 1),
    "layout.tiled.reserved": (lambda d, at: d[at + 1], 7),
    "layout.csf.mode_order": (U32, 0),
    "layout.csf.reserved": (U8, 1),  # after the rank-long mode_order array
    "metadata.statistics.stddev": (lambda d, at: struct.unpack_from("<d", d, at)[0], -0.5),
    "metadata.shard.bounds": (U64, 5),
    "quantization.per_channel.scale_type": (U8, 1),
    "quantization.buffer_index.range": (U32, 5),
    "composite.head.combine_op": (U8, 1),
    "composite.head.open_sentinel": (U32, 0xFFFFFFFF),
    "metadata.statistics.nm": (U8, 4),
    "metadata.composite_member.role": (U8, 2),
    "metadata.byte_offset.bounds": (U64, 129),
    "buffer.colocation": (U8, 1),
    "layout.morton.bits": (U32, 0),
    "quantization.buffer.size": (U64, 12),
}


@pytest.mark.parametrize("rule_id", sorted(OFFSET_PROBES))
def test_offset_points_at_the_faulty_field(rule_id):
    bad = next(c[2] for c in CASES if c[0] == rule_id)
    b, data = _decoded(bad)
    f = next(f for f in check_descriptor(b) if f.rule_id == rule_id)
    read, expected = OFFSET_PROBES[rule_id]
    assert read(data, f.offset) == expected


def test_offsets_are_relative_to_base():
    b, _ = _decoded(dense(buffers=[B(64, reserved=1)]))
    (f0,) = check_descriptor(b)
    (f1,) = check_descriptor(b, base=1000)
    assert f1.offset == f0.offset + 1000


# -- modes ----------------------------------------------------------------------------------


def test_permissive_tolerates_private_memory_class_and_private_rule():
    for bad in (dense(buffers=[B(64, device_tag=0xF0, memory_class=0xF3)]),
                ev(HEAD, layout=CompositeLayout(0xF1, 2))):
        data = encode_descriptor(bad)
        with pytest.raises(hs.SpecViolation):
            decode_descriptor(data)
        assert decode_descriptor(data, mode="permissive") == bad
        (f,) = check_descriptor(bad, "permissive")
        assert f.tolerated and not f.is_error


def test_should_rule_is_a_warning_in_both_modes():
    bad = ev(PB_SYM, quantization=PerBlockAffine(1, 4, 1, 7, flags=1))
    assert decode_descriptor(encode_descriptor(bad)) == bad
    (f,) = check_descriptor(bad)
    assert f.level is Level.SHOULD and not f.is_error


# -- ADR-007 --------------------------------------------------------------------------------


@pytest.mark.parametrize("desc", [
    D(T.FLOAT32, (0,), buffers=[B(0)]),
    D(T.FLOAT32, (3, 0, 5), buffers=[B(0, alignment=1)]),
    D(T.FLOAT32, (0, 5), CsrLayout(0), buffers=[B(0), B(0), B(8)]),  # row_ptr keeps its single entry
    D(T.FLOAT32, (4, 4), CooLayout(0), buffers=[B(0), B(0)]),  # nnz = 0 with a non-empty shape
    D(T.BOOL, (0, 7), buffers=[B(0, alignment=2)]),
    D(T.INT4, (5, 0), buffers=[B(0)]),
    D(T.UINT2, (0,), buffers=[B(0)]),
    D(T.INT8, (0, 4), buffers=[B(0), B(0)], quantization=PerChannelAffine(0, 1, NO_BUFFER_INDEX, flags=1)),
    D(T.UINT4, (3, 0), buffers=[B(0), B(0)], quantization=Nf4(1, 64, 1)),
], ids=["1d", "3x0x5-align1", "csr-nnz0", "coo-nnz0-full-shape", "bool", "int4", "uint2", "per-channel-empty-axis",
        "nf4-empty-axis"])
def test_adr007_empty_tensors_are_accepted(desc):
    assert decode_descriptor(encode_descriptor(desc)) == desc
    assert check_descriptor(desc) == []


@pytest.mark.parametrize("t,size", [(T.INT4, 1), (T.BOOL, 1), (T.FLOAT6_E2M3, 3)])
def test_adr007_no_partial_trailing_byte_for_empty_sub_byte(t, size):
    desc = D(t, (0, 3), buffers=[B(size)])
    assert [f.rule_id for f in check_descriptor(desc)] == ["adr007.empty.data_buffer_size"]


def test_adr007_empty_axis_needs_empty_scale_buffers():
    desc = D(T.INT8, (0, 4), buffers=[B(0), B(4)], quantization=PerChannelAffine(0, 1, NO_BUFFER_INDEX, flags=1))
    assert [f.rule_id for f in check_descriptor(desc)] == ["quantization.buffer.size"]


def test_adr007_zero_is_not_the_dynamic_sentinel():
    # a dynamic dimension leaves the size unknown (no size rule fires) ...
    assert check_descriptor(dense((DYN, 4), size=64)) == []
    # ... while 0 is a resolved, empty dimension: the data buffer must be empty
    assert [f.rule_id for f in check_descriptor(dense((0, 4), size=64))] == ["adr007.empty.data_buffer_size"]
    # and a sharded tensor may be empty but never dynamic
    assert check_descriptor(dense((0, 4), size=0, shard=Shard((8, 4), (8, 0)))) == []
    assert "data_model.shard.dynamic" in {f.rule_id for f in check_descriptor(dense((DYN, 4), size=64, shard=Shard((8, 4), (0, 0))))}


def test_adr007_empty_tensor_still_needs_a_complete_descriptor():
    desc = D(T.FLOAT32, (0, 4), buffers=[])
    assert "metadata.buffer_count.minimum" in {f.rule_id for f in check_descriptor(desc)}


def test_every_golden_vector_passes_every_rule(conformance_dir):
    for path in sorted((conformance_dir / "descriptors").glob("*.bin")):
        desc = decode_descriptor(path.read_bytes())
        assert check_descriptor(desc) == [], path.name


def test_pyhurray_descriptors_pass_every_rule():
    hurray = pytest.importorskip("hurray")
    f32 = hurray.float32
    made = [
        hurray.Tensor(bytes(48), f32, [3, 4]),
        hurray.Tensor(b"", f32, [0, 4]),
        hurray.Tensor(bytes(48), f32, [3, 4], layout=hurray.StridedLayout([-4, 1])),
        hurray.Tensor(bytes(64), f32, [4, 4], layout=hurray.MortonLayout([2, 2])),
        hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.HilbertLayout(3, 2)),
        hurray.Tensor(bytes(256), f32, [8, 8], layout=hurray.TiledLayout([4, 4])),
        hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4])),
    ]
    for t in made:
        desc, _ = parse_descriptor(t.descriptor.encode())
        fired = {f.rule_id for f in check_descriptor(desc)}
        # pyhurray's strided [-4, 1] tensor declares byte_offset 0: its row 1.. lie before the buffer
        assert fired <= {"layout.strided.buffer_bounds"}, (t, fired)


# -- damaged inputs: the rules never crash and agree with first_error ----------------------


def test_rules_survive_damaged_descriptors():
    import random

    from hurray_schema.rules.composite import CompositeValidator
    from hurray_schema.rules.descriptor import DESCRIPTOR_RULES, DescriptorContext, first_error
    from hurray_schema.rules.engine import Mode

    rng = random.Random(3)
    seeds = [encode_descriptor(d) for _, good, bad in CASES for d in (good, bad)]
    checked = 0
    validator = CompositeValidator(D(T.FLOAT32, (8, 8), CompositeLayout(CompositionRule.OVERLAY, 10 ** 6, 1)),
                                   collect=True)
    for _ in range(2500):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(20, len(data))  # keep the fixed header's magic and length
            data[at] = rng.randrange(256)
        try:
            desc, _ = parse_descriptor(bytes(data), mode="permissive")
        except hs.HurraySchemaError:
            continue
        findings = check_descriptor(desc, "permissive")
        # the decoder's pre-filter (which rules can fire at all) loses nothing
        ctx = DescriptorContext(desc, Mode.PERMISSIVE)
        assert findings == [f for rule in DESCRIPTOR_RULES for f in rule.check(desc, ctx)]
        for f in findings:
            assert f.offset is None or 0 <= f.offset < len(data)
        first = first_error(desc, "permissive")
        assert first == next((f for f in findings if f.is_error), None)
        validator.push_member(desc)
        checked += 1
    assert checked > 500


# -- when a rule runs: declared with when=, never parsed from its id ------------------------


def test_every_descriptor_rule_declares_when_it_applies():
    from hurray_schema.rules.descriptor import DESCRIPTOR_RULES, When

    assert DESCRIPTOR_RULES
    undeclared = [rule.id for rule in DESCRIPTOR_RULES if not isinstance(rule.when, When)]
    assert undeclared == []


def test_the_plan_key_carries_every_fact():
    from hurray_schema.rules.descriptor import Fact, dispatch

    assert sorted(dispatch._FACT_SLOTS, key=str) == sorted(Fact, key=str)


def test_when_needs_every_condition_it_names():
    from hurray_schema.rules.descriptor import Fact, When

    csr_with_stats = When(layouts={CsrLayout}, facts={Fact.STATISTICS})
    assert csr_with_stats.holds(LayoutTag.CSR, None, frozenset({Fact.STATISTICS, Fact.SHARD}))
    assert not csr_with_stats.holds(LayoutTag.CSR, None, frozenset({Fact.SHARD}))
    assert not csr_with_stats.holds(LayoutTag.COO, None, frozenset({Fact.STATISTICS}))
    assert When(schemes={Nf4}).holds(LayoutTag.ROW_MAJOR, Nf4, frozenset())
    assert not When(schemes={Nf4}).holds(LayoutTag.ROW_MAJOR, None, frozenset())
    assert When().holds(0xF3, None, frozenset())


@pytest.fixture
def scratch_rules(monkeypatch):
    """Declare rules for one test only: the registry, the rule list and the plans are restored after."""
    from hurray_schema.codec import DECODER
    from hurray_schema.rules import engine
    from hurray_schema.rules.descriptor import dispatch

    monkeypatch.setattr(engine, "_REGISTRY", dict(engine._REGISTRY))
    monkeypatch.setattr(dispatch, "DESCRIPTOR_RULES", list(dispatch.DESCRIPTOR_RULES))
    monkeypatch.setattr(dispatch, "_RAW", dict(dispatch._RAW))
    monkeypatch.setattr(dispatch, "_CHECKS", dict(dispatch._CHECKS))
    monkeypatch.setattr(dispatch, "_FORMS", dict(dispatch._FORMS))
    yield dispatch.descriptor_rule
    DECODER.reset()  # the plans compiled with the scratch rules go with them


def test_a_rule_declared_for_one_layout_runs_only_on_that_layout(scratch_rules):
    from hurray_schema.rules.descriptor import When

    seen = []

    # the id names another layout on purpose: only when= decides where the rule runs
    @scratch_rules("layout.coo.scratch_probe", Level.SHOULD, "layouts/csr.md § Description",
                   "A probe that fires on every CSR tensor.", when=When(layouts={CsrLayout}))
    def _probe(desc, ctx):
        seen.append(desc.layout.tag)
        yield "probe", ctx.header("layout_tag")

    assert [f.rule_id for f in check_descriptor(CSR)] == ["layout.coo.scratch_probe"]
    for other in (COO, CSC, GOOD, TILED, HEAD, PC, STATS):
        assert "layout.coo.scratch_probe" not in {f.rule_id for f in check_descriptor(other)}
    assert set(seen) == {LayoutTag.CSR}
    (f,) = check_descriptor(CSR)
    assert f.offset == 15  # metadata.md § Fixed Header: layout_tag is byte 15
    assert encode_descriptor(CSR)[f.offset] == 0x07
    assert decode_descriptor(encode_descriptor(CSR)) == CSR  # a SHOULD is a warning: the decode goes on


def test_a_rule_with_an_id_no_table_knows_breaks_no_decode(scratch_rules):
    from hurray_schema.rules.descriptor import ALWAYS, Fact, When

    @scratch_rules("layout.brand_new_layout.scratch", Level.MUST, "layouts/tiled.md § Description",
                   "A probe that never fires.", when=When(layouts={TiledLayout}))
    def _never(desc, ctx):
        return iter(())

    @scratch_rules("zz_new_area.scratch", Level.SHOULD, "metadata.md § Flags", "A probe on sharded tensors.",
                   when=When(facts={Fact.SHARD}))
    def _on_shards(desc, ctx):
        yield "sharded", ctx.part("shard")

    @scratch_rules("zz_new_area.always", Level.SHOULD, "metadata.md § Flags", "A probe on every tensor.",
                   when=ALWAYS)
    def _everywhere(desc, ctx):
        yield "seen", None

    for _, good, _bad in CASES:
        desc = decode_descriptor(encode_descriptor(good))
        fired = [f.rule_id for f in check_descriptor(desc)]
        assert fired[-1] == "zz_new_area.always"  # a later declaration comes later
        assert ("zz_new_area.scratch" in fired) == (good.shard is not None)


def test_a_rule_must_say_when_it_applies(scratch_rules):
    with pytest.raises(TypeError):
        scratch_rules("zz_new_area.unsaid", Level.MUST, "metadata.md § Flags", "No when.", when=None)


def test_the_engine_imports_no_spec_area_module():
    import ast
    from pathlib import Path

    import hurray_schema.rules.engine as engine

    tree = ast.parse(Path(engine.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported <= {"__future__", "enum", "sys", "typing", "attrs", "errors"}, imported


def test_importing_the_engine_alone_gives_the_whole_registry():
    import subprocess
    import sys
    from pathlib import Path

    from hurray_schema.rules.engine import registry

    probe = "from hurray_schema.rules.engine import registry; print(len(registry()))"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=str(root))
    assert int(out.stdout) == len(registry()) and len(registry()) > 150


# -- the compiled plans against the general engine -----------------------------------------


def _general_findings(desc, mode):
    """Every finding of every declared rule, in declaration order, with no plan at all."""
    from hurray_schema.rules.descriptor import DESCRIPTOR_RULES, DescriptorContext
    from hurray_schema.rules.engine import as_mode

    ctx = DescriptorContext(desc, as_mode(mode))
    return [f for rule in DESCRIPTOR_RULES for f in rule.check(desc, ctx)]


def _one_byte_mutants(wire: bytes, data):
    """``wire`` and one copy with a byte after the fixed header changed (drawn by hypothesis)."""
    from hypothesis import strategies as st

    out = [wire]
    if len(wire) > 20:
        mutated = bytearray(wire)
        at = data.draw(st.integers(20, len(wire) - 1))
        mutated[at] = data.draw(st.integers(0, 255).filter(lambda v: v != mutated[at]))
        out.append(bytes(mutated))
    return out


def _plans_agree(desc) -> None:
    from hurray_schema.rules.descriptor import DescriptorContext, dispatch, first_error
    from hurray_schema.rules.engine import as_mode

    for mode in ("strict", "permissive"):
        want = _general_findings(desc, mode)
        first = next((f for f in want if f.is_error), None)
        assert dispatch._plan(desc).passes(desc, DescriptorContext(desc, as_mode(mode))) is (want == [])
        assert check_descriptor(desc, mode) == want
        assert check_descriptor(desc, mode, base=7) == [attrs.evolve(f, offset=None if f.offset is None else
                                                                     f.offset + 7) for f in want]
        for _ in range(2):  # the second call may be answered by the passed-descriptor table
            assert first_error(desc, mode) == first
    for mode in ("permissive", "strict"):  # a descriptor that passed strict passes permissive too
        assert first_error(desc, mode) == next((f for f in _general_findings(desc, mode) if f.is_error), None)


def _plan_property():
    from hypothesis import given
    from hypothesis import strategies as st

    from support.strategies import DESCRIPTOR_SETTINGS, descriptors

    @DESCRIPTOR_SETTINGS
    @given(descriptors(), st.data())
    def check(desc, data):
        """Generated descriptors (most break some rule) and their one-byte mutations: the
        plan's generated predicate, check_descriptor and first_error (table on) give the
        findings of every rule run one by one -- ids, levels, offsets, messages, order -- in
        both modes."""
        _plans_agree(desc)
        for variant in _one_byte_mutants(encode_descriptor(desc), data)[1:]:
            try:
                mutant, _ = parse_descriptor(variant, mode="permissive")
            except hs.HurraySchemaError:
                continue
            _plans_agree(mutant)

    return check


test_compiled_plans_give_the_general_engines_findings = _plan_property()


def test_compiled_plans_on_every_case():
    for _, good, bad in CASES:
        _plans_agree(good)
        _plans_agree(bad)
