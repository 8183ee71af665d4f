"""The descriptor parts table, the tag tables attached to fields, the private tag range
and the layering between the declarations and the model.

Expected sizes, bits and tag tables are typed from the spec (``metadata.md § Overall
Descriptor Structure``, ``§ Flags``, the section tables, ``element-types.md § Type
Identifier Encoding``), not computed from the table under test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

from hurray_schema import model
from hurray_schema.codec import decode_descriptor, encode_descriptor
from hurray_schema.docs import tag_table
from support.corpus import rendered_pages
from hurray_schema.model import (
    BlockTableIndexType, BufferHandle, CombineOp, CompositeLayout, CompositeMember, CompositionRule, DescriptorFlag,
    DeviceTag, ElementType, ExtensionType, KvRole, LayoutTag, MemberRole, MemoryClass, PerBlockAffine, QuantFlag,
    QuantScheme, Shard, Statistics, StatisticsMask, SyncMode, TensorDescriptor,
)
from hurray_schema.structs import descriptor as descriptor_structs
from hurray_schema.structs import walker
from hurray_schema.structs import element_types, layouts, tags
from hurray_schema.structs._declare import plan, tags_of
from hurray_schema.structs.file import FileFlag, KvTag
from hurray_schema.structs.stream import MessageType
from hurray_schema.structs.wire import descriptor_spans

PARTS = descriptor_structs.DESCRIPTOR_PARTS
STRUCTS_DIR = Path(descriptor_structs.__file__).parent


def test_parts_in_the_spec_order():
    assert [p.name for p in PARTS] == [
        "fixed_header", "shape", "byte_offset", "layout", "buffer_table", "quantization", "shard", "statistics",
        "extension_type", "composite_member",
    ]


def test_gating_flags_are_the_spec_bits():
    gated = {p.name: p.flag for p in PARTS if p.flag is not None}
    assert {name: int(flag) for name, flag in gated.items()} == {
        "quantization": 1 << 0, "shard": 1 << 1, "extension_type": 1 << 2, "statistics": 1 << 3,
        "composite_member": 1 << 4,
    }
    assert all(isinstance(flag, DescriptorFlag) for flag in gated.values())


def test_every_attribute_is_a_descriptor_field_and_every_class_resolves():
    descriptor_fields = {f.name for f in attrs.fields(TensorDescriptor)}
    for part in PARTS:
        assert part.attribute is None or part.attribute in descriptor_fields, part.name
        if part.value_class is not None:
            assert part.value_class in model.VALUE_CLASSES, part.name
    assert {p.name: model.VALUE_CLASSES.get(p.value_class) for p in walker.SECTION_PARTS} == {
        "shard": Shard, "statistics": Statistics, "extension_type": ExtensionType, "composite_member": CompositeMember,
    }


@pytest.mark.parametrize("part", [p for p in PARTS if p.decl is not None and p.value_class is not None],
                         ids=lambda p: p.name)
def test_value_class_fields_are_the_declared_fields(part):
    """The decoder builds the class from the table's fields by name: both name the same fields."""
    cls = model.VALUE_CLASSES[part.value_class]
    declared = {sub.name for sub in part.decl.subcons}
    assert {f.name for f in attrs.fields(cls)} == declared


FULL = TensorDescriptor(
    ElementType.FLOAT32, (4, 4), buffers=[BufferHandle(64)],
    quantization=PerBlockAffine(axis=1, block_size=4, scale_buffer_index=0),
    shard=Shard((8, 4), (4, 0)), statistics=Statistics(), extension_type=ExtensionType(8),
    composite_member=CompositeMember(MemberRole.BASE),
)


def test_spans_follow_the_table_with_the_spec_sizes():
    spans = {name: end - start for name, start, end in descriptor_spans(FULL)}
    assert list(spans) == [p.name for p in PARTS]
    assert spans == {
        "fixed_header": 20, "shape": 8 * 2, "byte_offset": 8, "layout": 0, "buffer_table": 1 + 16,
        "quantization": 4 + 24, "shard": 2 * 8 * 2, "statistics": 72, "extension_type": 20, "composite_member": 16,
    }


def test_each_gated_part_follows_its_flag_through_encode_and_decode():
    for part in PARTS:
        if part.flag is None or part.name in ("quantization", "extension_type"):
            continue  # those two need a matching type tag / buffer to pass the semantic rules
        value = getattr(FULL, part.attribute)
        desc = TensorDescriptor(ElementType.FLOAT32, (4, 4), buffers=[BufferHandle(64)],
                                **{part.attribute: value})
        wire = encode_descriptor(desc)
        flags = int.from_bytes(wire[10:14], "little")  # metadata.md § Fixed Header: flags at byte 10
        assert flags == int(part.flag), part.name
        back = decode_descriptor(wire)
        assert getattr(back, part.attribute) == value


EXPECTED_TAGS = [
    ("FIXED_HEADER", "type_tag", ElementType), ("FIXED_HEADER", "layout_tag", LayoutTag),
    ("FIXED_HEADER", "flags", DescriptorFlag), ("FIXED_HEADER", "rank", None),
    ("BUFFER_HANDLE", "device_tag", DeviceTag), ("BUFFER_HANDLE", "sync_mode", SyncMode),
    ("BUFFER_HANDLE", "memory_class", MemoryClass), ("BUFFER_HANDLE", "byte_size", None),
    ("TILED", "outer_layout", LayoutTag), ("TILED", "inner_layout", LayoutTag),
    ("BLOCK_PAGED", "kv_role", KvRole), ("BLOCK_PAGED", "block_table_index_type", BlockTableIndexType),
    ("COMPOSITE", "composition_rule", CompositionRule), ("COMPOSITE", "combine_op", CombineOp),
    ("COMPOSITE", "member_count", None),
    ("QUANTIZATION_HEADER", "scheme_tag", QuantScheme), ("QUANTIZATION_HEADER", "flags", None),
    ("PER_BLOCK_AFFINE", "scheme_tag", QuantScheme), ("PER_BLOCK_AFFINE", "flags", QuantFlag),
    ("PER_CHANNEL_AFFINE", "flags", QuantFlag), ("PER_BLOCK_AFFINE", "scale_type_tag", ElementType),
    ("NF4", "flags", None), ("PER_TENSOR_AFFINE", "flags", None),
    ("STATISTICS_SECTION", "computed_mask", StatisticsMask),
    ("COMPOSITE_MEMBER_SECTION", "member_role", MemberRole),
    ("FILE_HEADER", "file_flags", FileFlag), ("KV_VALUE_TAG", "value_tag", KvTag),
    ("KV_ARRAY_HEADER", "element_tag", KvTag), ("INDEX_ENTRY_FIELDS", "flags", None),
    ("MESSAGE_HEADER", "message_type", MessageType),
    ("NO_SUCH_TABLE", "type_tag", None), ("FIXED_HEADER", "no_such_field", None),
]


@pytest.mark.parametrize("decl_name, field_name, expected", EXPECTED_TAGS)
def test_tag_table_is_the_one_on_the_field(decl_name, field_name, expected):
    assert tag_table(decl_name, field_name) is expected


def test_tagged_fields_still_decode_to_plain_ints():
    wire = encode_descriptor(TensorDescriptor(ElementType.FLOAT32, (3,), buffers=[BufferHandle(12)]))
    values, _ = plan(descriptor_structs.FIXED_HEADER).unpack(wire)
    assert type(values["type_tag"]) is int and type(values["flags"]) is int
    assert dict(descriptor_structs.FIXED_HEADER.parse(wire[:20]))["type_tag"] == 0x03


def test_model_converters_take_the_tag_table_of_the_field():
    assert tags_of(descriptor_structs.BUFFER_HANDLE, "device_tag") is DeviceTag
    assert BufferHandle(64, device_tag=0x01).device_tag is DeviceTag.CUDA
    assert BufferHandle(64, device_tag=0xF3).device_tag == 0xF3  # private: kept as a plain int
    assert CompositeLayout(0x02, 2, 0x01).combine_op is CombineOp.REPLACE
    assert TensorDescriptor(0x03, (1,)).type_tag is ElementType.FLOAT32


@pytest.mark.parametrize("tag, private", [(0x00, False), (0xEF, False), (0xF0, True), (0xF7, True), (0xFE, True),
                                          (0xFF, False)])
def test_private_tag_range(tag, private):
    assert tags.is_private_tag(tag) is private
    assert element_types.is_private_type(tag) is private
    assert layouts.is_extension_layout(tag) is private


def test_docs_private_range_text_comes_from_the_predicate_bounds():
    assert "0xF0–0xFE are implementation-private" in rendered_pages()["element-types.md"]


def test_tag_enums_live_in_tags_and_the_model_re_exports_them():
    for name in ("ElementType", "LayoutTag", "DescriptorFlag", "CompositionRule", "CombineOp", "MemberRole",
                 "QuantScheme", "DeviceTag", "SyncMode", "MemoryClass", "QuantFlag", "StatisticsMask", "KvRole",
                 "BlockTableIndexType"):
        enum_class = getattr(tags, name)
        assert enum_class.__module__ == "hurray_schema.structs.tags"
        assert getattr(model, name) is enum_class


def _imports(path: Path) -> set[str]:
    """Every module a source file imports, anywhere in it (function bodies and TYPE_CHECKING blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            prefix = "." * node.level + (node.module or "")
            found.add(prefix)
            found.update(f"{prefix}.{a.name}" if not prefix.endswith(".") else prefix + a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("path", sorted(STRUCTS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_declarations_never_import_the_model(path):
    """structs sits below the model (model -> structs only), so there is no import cycle; the
    project modules below structs are errors and the decoder's memo (they import nothing)."""
    for name in _imports(path):
        if name.startswith(("..errors", "hurray_schema.errors", "..memo", "hurray_schema.memo")):
            continue
        assert not name.startswith(("..", "hurray_schema.")) or name.startswith("hurray_schema.structs."), name


def test_tags_module_imports_nothing_of_the_project():
    assert not [n for n in _imports(STRUCTS_DIR / "tags.py") if n.startswith((".", "hurray_schema"))]


def test_classes_chosen_by_tag_match_the_tables_of_their_part():
    """Every layout / scheme class the model builds from a tag has that tag's table in the part."""
    layout, quantization = walker.LAYOUT_PART, walker.QUANTIZATION_PART
    assert layout.chosen_by == "layout_tag" and quantization.chosen_by == "scheme_tag"
    assert all(layout.tables[tag] is not None for tag in model.TABLE_LAYOUTS)
    assert set(model.SCHEMES) == set(quantization.tables)
    assert {int(t) for t, decl in layout.tables.items() if decl is None} == {0x01, 0x02}  # row-, column-major
