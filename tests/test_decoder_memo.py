"""The decoder owns every table its fast path keeps (``hurray_schema/memo.py``): none lives at
module level, each is bounded, one call forgets them all, and what they hold never changes a
descriptor's value or its findings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hurray_schema import audit
from hurray_schema.codec import DECODER, Decoder, decode_descriptor, encode_descriptor, parse_descriptor
from hurray_schema.errors import SpecViolation
from hurray_schema.io import write_stream, read_stream
from hurray_schema.model import BufferHandle, ElementType, TensorDescriptor

PACKAGE = Path(__file__).resolve().parents[1] / "hurray_schema"

DECODE_PATH = ["codec.py", "codecache.py", "memo.py", "signature", "rules", "structs", "io/walk", "io/_write.py",
               "io/stream.py", "io/file_index.py", "io/file.py", "io/file"]
"""What bytes go through on their way to a descriptor, a binding or a written file."""

REGISTRIES = {
    ("rules/descriptor/dispatch.py", "DESCRIPTOR_RULES"): "the rules, in declaration order (filled at import)",
    ("rules/descriptor/dispatch.py", "_RAW"): "rule id -> its findings (filled at import)",
    ("rules/descriptor/dispatch.py", "_CHECKS"): "rule id -> its check or report (filled at import)",
    ("rules/descriptor/dispatch.py", "_FORMS"): "rule id -> its condition (filled at import)",
    ("rules/descriptor/dispatch.py", "_ON_DECLARE"): "what a later declaration makes stale (filled at import)",
    ("rules/engine.py", "_REGISTRY"): "every rule by id (filled at import)",
    ("rules/engine.py", "_AREA"): "rules per spec area (filled at import)",
    ("io/walk/__init__.py", "_EXPORTS"): "lazy exports (a constant)",
}
"""Module-level containers that are declarations, not memos: filled once as the rules are declared."""


def _module_containers(path: Path) -> list[str]:
    """Names bound at module level to an empty dict, list or set (a table filled later)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets, value = ([node.target], node.value) if isinstance(node, ast.AnnAssign) else (
            (node.targets, node.value) if isinstance(node, ast.Assign) else ([], None))
        empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", getattr(value, "elts", [])))\
            or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in {"dict", "list", "set"}
                and not value.args)
        if empty:
            found += [t.id for t in targets if isinstance(t, ast.Name)]
    return found


def _decode_path_files():
    for entry in DECODE_PATH:
        path = PACKAGE / entry
        if path.is_dir():
            yield from sorted(path.rglob("*.py"))
        elif path.exists():
            yield path


def test_no_module_level_table_on_the_decode_path():
    tables = {(str(path.relative_to(PACKAGE)), name) for path in _decode_path_files()
              for name in _module_containers(path)}
    assert tables - set(REGISTRIES) == set()


def test_the_scan_finds_a_module_level_table(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("_SEEN: dict = {}\n_KEPT = set()\nNAMES = ('a',)\n")
    assert _module_containers(probe) == ["_SEEN", "_KEPT"]


def _descriptors(n: int):
    return [TensorDescriptor(ElementType.FLOAT32, (3, 4 + i), buffers=(BufferHandle(4 * 3 * (4 + i)),))
            for i in range(n)]


def test_reset_forgets_everything_and_stats_show_it():
    wires = [encode_descriptor(d) for d in _descriptors(5)]
    for wire in wires * 3:
        decode_descriptor(wire)
    held = DECODER.stats()
    assert held["compiled"][0] >= 1 and held["accepted"][0] == 5 and held["plans"][0] >= 1
    DECODER.reset()
    assert all(count == 0 for count, _, _ in DECODER.stats().values())
    assert [decode_descriptor(w) for w in wires] == _descriptors(5)


def test_every_table_is_bounded_or_keyed_by_the_packages_classes():
    for name, (count, bound, what) in DECODER.stats().items():
        assert what
        assert bound is None or bound > 0
    bounded = {name for name, (_, bound, _) in DECODER.stats().items() if bound is None}
    assert bounded == {"constructors", "by_layout", "last_hit", "prefixes", "field_names", "view_plans", "view_layouts",
                       "view_prefixes"}


def test_the_tables_stay_within_their_bounds_on_many_distinct_descriptors():
    limit = DECODER.memo.limit("accepted")
    for desc in _descriptors(limit + 20):
        wire = encode_descriptor(desc)
        decode_descriptor(wire)
        decode_descriptor(wire)
    for name, (count, bound, _) in DECODER.stats().items():
        assert bound is None or count <= bound, name


def test_what_the_tables_hold_changes_no_outcome():
    good, *_ = _descriptors(1)
    bad = TensorDescriptor(ElementType.FLOAT32, (3, 4), buffers=(BufferHandle(8),))  # too small for 12 floats
    wires = [encode_descriptor(good), encode_descriptor(bad)]
    outcomes = []
    for tables in (True, False):
        previous = DECODER.use_value_tables(tables)
        try:
            for _ in range(3):
                for wire in wires:
                    try:
                        outcomes.append(("ok", decode_descriptor(wire)))
                    except SpecViolation as exc:
                        outcomes.append((exc.rule_id, exc.offset))
        finally:
            DECODER.use_value_tables(previous)
    assert set(outcomes) == {("ok", good), ("layout.dense.buffer_size", outcomes[1][1])}
    assert outcomes[1][0] == "layout.dense.buffer_size"


def test_decoder_decode_is_the_entry_point_of_both_decoders():
    good, *_ = _descriptors(1)
    wire = encode_descriptor(good)
    assert DECODER.decode(wire) == (good, [])
    assert DECODER.decode(wire, check=False) == parse_descriptor(wire)
    bad = encode_descriptor(TensorDescriptor(ElementType.FLOAT32, (3, 4), buffers=(BufferHandle(8),)))
    with pytest.raises(SpecViolation) as raised:
        DECODER.decode(bad)
    first = audit(bad).errors[0]
    assert (raised.value.rule_id, raised.value.offset) == (first.rule_id, first.offset)


def test_a_decoder_of_its_own_memo_gives_the_same_descriptors():
    from hurray_schema.memo import Memo

    mine = Decoder(Memo())
    wire = encode_descriptor(_descriptors(1)[0])
    assert mine.decode(wire) == DECODER.decode(wire)


def test_repeated_composites_in_a_stream_read_alike_after_a_reset():
    from hurray_schema.io import Composite, Tensor
    from hurray_schema.model import Shard

    def half(offset):
        return Tensor.dense(ElementType.FLOAT32, (4, 3), bytes(48), shard=Shard((4, 6), offset))

    stream = write_stream(None, [Composite.build("partition", [half((0, 0)), half((0, 3))], shape=(4, 6),
                                                 type_tag=ElementType.FLOAT32)] * 3)
    first = [item.descriptor for item in read_stream(stream)]
    assert DECODER.stats()["bindings"][0] >= 1
    DECODER.reset()
    assert [item.descriptor for item in read_stream(stream)] == first
