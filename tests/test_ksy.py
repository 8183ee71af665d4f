"""The Kaitai Struct schemas (docs/ksy): current, generated from the declarations alone,
compiling for seven targets, and proven against our own walk.

The cross-check compiles a fresh render with the npm compiler (``tools/ksc.js``, debug mode:
every attribute's start and end), parses with the ``kaitaistruct`` runtime, and compares
every field and opaque run -- name, absolute byte range, value -- with the annotated walk
``inspect`` prints (``hexview.annotate`` over ``io/walk.py``): on the golden vectors, every
passing vector of our conformance corpus, and generated descriptors of every layout,
section and quantization scheme.  A structural fault (magic, reserved bytes, rank over 64)
makes the Kaitai parser raise, or it parses the same faulty value at the offset the
manifest names as our walk does.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import attrs
import construct
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import kaitai
from hurray_schema import ksy
from hurray_schema.codec import encode_descriptor
from hurray_schema.structs import descriptor as descriptor_structs
from hurray_schema.structs import sections as section_structs
from hurray_schema.structs._declare import field, fields
from hurray_schema.structs.walker import part_named
from support.corpus import corpus
from support.sizes import size
from support.descriptors import EDGE_CASES
from support.sessions import EXTENSION_METADATA, session_stream
from support.strategies import EXTENSION_TYPES, QUANTIZATIONS, STATISTICS, U64, descriptors, layouts

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "ksy"


def _corpus():
    return corpus()


# --------------------------------------------------------------------------------------
# The committed schemas and the command
# --------------------------------------------------------------------------------------


def test_committed_schemas_equal_a_fresh_render():
    stale = ksy.check_ksy(COMMITTED)
    assert not stale, f"docs/ksy is out of date ({stale}); run `hurray-schema ksy docs/ksy`"


def test_ksy_command_writes_and_checks(tmp_path):
    out = tmp_path / "ksy"
    run = [sys.executable, "-m", "hurray_schema", "ksy", str(out)]
    subprocess.run(run, check=True, capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in COMMITTED.glob("*.ksy"))
    for path in COMMITTED.glob("*.ksy"):
        assert (out / path.name).read_text(encoding="utf-8") == path.read_text(encoding="utf-8"), path.name
    assert subprocess.run(run + ["--check"], capture_output=True).returncode == 0
    (out / "hurray_file.ksy").write_text("meta:\n  id: hurray_file\n", encoding="utf-8")
    drift = subprocess.run(run + ["--check"], capture_output=True, text=True)
    assert drift.returncode == 1 and "hurray_file.ksy" in drift.stderr


def test_meta_follows_the_format_gallery_conventions():
    for name, schema in ksy.schemas().items():
        meta = schema["meta"]
        assert list(schema)[:2] == ["meta", "doc"]
        assert meta["id"] == name.removesuffix(".ksy")
        assert meta["ks-version"] == "0.11" and meta["license"] == "Apache-2.0" and meta["endian"] == "le"
        assert meta["title"] and meta["file-extension"]
    text = ksy.render_ksy()["hurray_descriptor.ksy"]
    assert "\nseq:\n  - id: fixed_header\n    type: fixed_header\n" in text  # 2 spaces, indented sequences
    assert "\t" not in text


def test_the_yaml_reads_back_as_the_schema():
    """The emitter's quoting: every scalar reads back as the value it was written from."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    texts = ksy.render_ksy()
    for name, schema in ksy.schemas().items():
        assert yaml.safe_load(texts[name]) == schema, name


def test_magic_reserved_and_rank_are_validated():
    """Expected forms typed from the spec tables (metadata.md § Fixed Header, buffer-protocol.md
    § Buffer Handle), not read back from the generator's inputs."""
    types = ksy.schemas()["hurray_descriptor.ksy"]["types"]
    header = {a["id"]: a for a in types["fixed_header"]["seq"]}
    assert header["magic"]["contents"] == "HRRY"
    assert header["rank"]["valid"] == {"min": 0, "max": 64}
    assert header["layout_tag"]["enum"] == "layout_tag" and header["type_tag"]["enum"] == "element_type"
    handle = {a["id"]: a for a in types["buffer_handle"]["seq"]}
    assert handle["reserved"]["valid"] == 0 and handle["reserved"]["type"] == "u1"
    member = {a["id"]: a for a in types["composite_member_section"]["seq"]}
    assert member["reserved"]["size"] == 15 and member["reserved"]["valid"] == "[" + ", ".join(["0"] * 15) + "]"
    enums = ksy.schemas()["hurray_descriptor.ksy"]["enums"]
    assert enums["layout_tag"][0x0B] == "composite" and enums["quant_scheme"][0x05] == "mxfp"


# --------------------------------------------------------------------------------------
# Every target compiles
# --------------------------------------------------------------------------------------


def test_schemas_compile_for_seven_targets(tmp_path):
    kaitai.need_compiler()
    kaitai.render_into(tmp_path)
    compiled = kaitai.compile_schemas(tmp_path, ("python",) + kaitai.TARGETS)
    for lang in ("python",) + kaitai.TARGETS:
        for name in ksy.KSY_FILES:
            sources = compiled[lang][name]
            assert sources and all(text.strip() for text in sources.values()), (lang, name)
    assert any("class HurrayDescriptor" in text for text in compiled["java"]["hurray_descriptor.ksy"].values())


# --------------------------------------------------------------------------------------
# A declaration change reaches the schema with no other edit
# --------------------------------------------------------------------------------------


def test_a_field_added_to_a_table_changes_the_schema(monkeypatch):
    before = ksy.render_ksy()
    grown = construct.Struct(*section_structs.COMPOSITE_MEMBER_SECTION.subcons,
                             field("member_version", construct.Int16ul, "Version of the member section.",
                                   section_structs.MEMBER_REF))
    part = part_named("composite_member")
    parts = tuple(attrs.evolve(p, decl=grown) if p is part else p for p in descriptor_structs.DESCRIPTOR_PARTS)
    monkeypatch.setattr(section_structs, "COMPOSITE_MEMBER_SECTION", grown)
    monkeypatch.setattr(descriptor_structs, "DESCRIPTOR_PARTS", parts)
    monkeypatch.setattr(ksy.builder, "_DECL_NAMES", {})  # the cache of declared names
    after = ksy.render_ksy()
    assert after["hurray_file.ksy"] == before["hurray_file.ksy"]
    assert after["hurray_descriptor.ksy"] != before["hurray_descriptor.ksy"]
    member = {a["id"]: a for a in ksy.schemas()["hurray_descriptor.ksy"]["types"]["composite_member_section"]["seq"]}
    assert list(member) == ["member_role", "reserved", "member_version"]
    assert member["member_version"]["type"] == "u2"
    assert member["member_version"]["doc"] == "Version of the member section."


# --------------------------------------------------------------------------------------
# The cross-check: Kaitai's positions against our walk
# --------------------------------------------------------------------------------------


def test_golden_vectors_agree_field_by_field(conformance_dir):
    inputs = sorted((conformance_dir / "descriptors").glob("*.bin"))
    assert inputs
    header_fields = len(list(fields(descriptor_structs.FIXED_HEADER)))
    for path in inputs:
        assert kaitai.compare(path.read_bytes(), "descriptor") > header_fields, path.name
    assert kaitai.compare((conformance_dir / "files" / "basic.hrry").read_bytes(), "file") > 2 * header_fields


def test_golden_vectors_read_as_their_manifest_says(conformance_dir, manifest):
    """The Kaitai parser against the reference project's expectations (not our decoder)."""
    for entry in manifest["descriptors"]:
        parsed = kaitai.parse("descriptor", (conformance_dir / entry["file"]).read_bytes())
        expect = entry["expect"]
        header = parsed.fixed_header
        assert (header.version_major, header.version_minor) == (expect["version_major"], expect["version_minor"])
        assert int(header.type_tag) == expect["element_type_tag"] and int(header.layout_tag) == expect["layout_tag"]
        assert parsed.shape.shape == expect["shape"] and parsed.byte_offset.byte_offset == expect["byte_offset"]
        assert [b.byte_size for b in parsed.buffer_table.buffers] == expect["buffer_byte_sizes"], entry["file"]
        assert hasattr(parsed, "quantization") == expect["has_quantization"]
        assert hasattr(parsed, "shard") == expect["has_shard"]
    for entry in manifest["files"]:
        parsed = kaitai.parse("file", (conformance_dir / entry["file"]).read_bytes())
        entries = {e.name: e for e in parsed.index.entries}
        for tensor in entry["tensors"]:
            found = entries[tensor["name"]]
            assert int(found.descriptor.fixed_header.type_tag) == tensor["element_type_tag"]
            assert found.descriptor.shape.shape == tensor["shape"]
            assert sum(b.byte_size for b in found.descriptor.buffer_table.buffers) == tensor["data_bytes"]
        kv = {e.key: e.value.payload for e in parsed.kv.entries}
        for item in entry["kv"]:
            value = kv[item["key"]]
            assert value.value == (item["value_string"] if item["kind"] == "string" else item["value_int"])


@pytest.mark.parametrize("kind", ["descriptor", "stream", "messages", "file"])
def test_every_passing_corpus_vector_agrees_field_by_field(kind):
    kaitai.python_parsers()
    vectors = [v for v in _corpus().vectors if v.role == "pass" and v.container == kind]
    assert vectors
    for vector in vectors:
        try:
            kaitai.compare(vector.data, kind)
        except AssertionError as exc:
            raise AssertionError(f"{vector.file}: {exc}") from None


STRUCTURAL = re.compile(r"\.magic$|reserved|rank\.cap$")
"""Rules about the bytes themselves: a magic, reserved bits and bytes, the rank cap."""


def _validated_field(error) -> str:
    """The attribute a Kaitai validation error names (``/types/buffer_handle/seq/5``)."""
    match = re.fullmatch(r"/types/(\w+)/seq/(\d+)", error.src_path)
    assert match, error.src_path
    for schema in ksy.schemas().values():
        spec = schema.get("types", {}).get(match.group(1))
        if spec is not None:
            return spec["seq"][int(match.group(2))]["id"]
    raise AssertionError(error.src_path)


def test_structural_faults_raise_or_parse_to_the_faulty_value():
    """A Kaitai parser refuses the bytes at the field our walk places at the manifest's
    offset, or reads there the same faulty value our walk does."""
    from kaitaistruct import ValidationFailedError

    kaitai.python_parsers()
    vectors = [v for v in _corpus().vectors if v.role == "fail" and STRUCTURAL.search(v.rule_id)]
    assert {v.rule_id for v in vectors} >= {"descriptor.magic", "descriptor.rank.cap", "file.header.magic"}
    raised = located = 0
    for vector in vectors:
        ours = [leaf for leaf in kaitai.walk_leaves(vector.data, vector.container)[0]
                if leaf[1] <= vector.offset < leaf[2] or leaf[1] == vector.offset == leaf[2]]
        assert ours, vector.file
        try:
            leaves = kaitai.kaitai_leaves(kaitai.parse(vector.container, vector.data))
        except ValidationFailedError as error:
            assert _validated_field(error) == ours[-1][0], (vector.file, error.src_path, ours)
            raised += 1
            continue
        theirs = [leaf for leaf in leaves if leaf[:3] == ours[-1][:3]]
        assert theirs and kaitai.same_value(theirs[-1][3], ours[-1][3]), (vector.file, theirs, ours)
        located += 1
    assert raised and located and raised + located == len(vectors)


GENERATED = settings(max_examples=size(12, 60), deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _layout_choice(index: int):
    return lambda rank: layouts(rank).original_strategies[index]


LAYOUT_CHOICES = len(layouts(0).original_strategies)


@pytest.mark.parametrize("index", range(LAYOUT_CHOICES))
@GENERATED
@given(data=st.data())
def test_generated_descriptors_of_every_layout_agree(index, data):
    kaitai.python_parsers()
    desc = data.draw(descriptors(layout=_layout_choice(index)))
    kaitai.compare(encode_descriptor(desc), "descriptor")


@pytest.mark.parametrize("scheme", range(len(QUANTIZATIONS.original_strategies)))
@GENERATED
@given(data=st.data())
def test_generated_descriptors_of_every_scheme_agree(scheme, data):
    kaitai.python_parsers()
    desc = data.draw(descriptors())
    desc = attrs.evolve(desc, quantization=data.draw(QUANTIZATIONS.original_strategies[scheme]))
    kaitai.compare(encode_descriptor(desc), "descriptor")


@GENERATED
@given(data=st.data())
def test_generated_descriptors_with_every_section_agree(data):
    from hurray_schema.model import CompositeMember, Shard

    kaitai.python_parsers()
    desc = data.draw(descriptors())
    rank = desc.rank
    desc = attrs.evolve(
        desc, quantization=data.draw(QUANTIZATIONS), statistics=data.draw(STATISTICS),
        shard=Shard(data.draw(st.lists(U64, min_size=rank, max_size=rank)),
                    data.draw(st.lists(U64, min_size=rank, max_size=rank))),
        composite_member=CompositeMember(data.draw(st.sampled_from([0, 1]))),
        type_tag=data.draw(st.integers(0xF0, 0xFE)), extension_type=data.draw(EXTENSION_TYPES),
    )
    kaitai.compare(encode_descriptor(desc), "descriptor")


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_case_descriptors_agree(name):
    kaitai.python_parsers()
    kaitai.compare(encode_descriptor(EDGE_CASES[name]), "descriptor")


# --------------------------------------------------------------------------------------
# The session messages of hurray_stream.ksy (interchange.md § Session Establishment
# through § Error Handling)
# --------------------------------------------------------------------------------------


def _stream_types() -> dict:
    return ksy.schemas()["hurray_stream.ksy"]["types"]


def test_every_session_message_has_a_payload_type():
    """Expected forms typed from the spec (interchange.md § Message Types, § Layout Entry Encoding,
    § ERROR Payload), not read back from the generator's inputs."""
    types = _stream_types()
    payload = types["message"]["seq"][-1]
    cases = payload["type"]["cases"]
    assert cases == {
        "message_type::client_hello": "client_hello", "message_type::server_hello": "server_hello",
        "message_type::tensor_request": "tensor_request",
        "message_type::tensor_descriptor": "tensor_descriptor_payload",
        "message_type::tensor_data": "tensor_data_payload", "message_type::tensor_put": "tensor_put",
        "message_type::tensor_put_ack": "tensor_put_ack", "message_type::error": "error", "message_type::ping": "ping",
        "message_type::pong": "pong", "message_type::rdma_register": "rdma_register",
        "message_type::rdma_ready": "rdma_ready",
    }
    entry = {a["id"]: a for a in types["layout_entry"]["seq"]}
    assert entry["layout_tag"] == {**entry["layout_tag"], "type": "u1", "enum": "layout_tag"}
    extension = "(layout_tag.to_i >= 0xf0) and (layout_tag.to_i <= 0xfe)"
    assert entry["ext_metadata_length"]["type"] == "u2" and entry["ext_metadata_length"]["if"] == extension
    assert entry["ext_metadata"]["size"] == "ext_metadata_length" and entry["ext_metadata"]["if"] == extension
    hello = {a["id"]: a for a in types["client_hello"]["seq"]}
    assert [hello[n]["type"] for n in ("protocol_version", "max_message_size", "capability_flags", "layout_count")] == [
        "u4", "u4", "u8", "u2"]
    layouts = hello["supported_layouts"]
    assert layouts["type"] == "layout_entry" and layouts["repeat-expr"] == "layout_count"
    assert hello["class_count"]["if"] == "not _io.eof"  # the memory class list may be absent
    assert "capability_flag" in hello["capability_flags"]["doc"]
    error = {a["id"]: a for a in types["error"]["seq"]}
    assert error["error_code"]["enum"] == "error_code" and error["message"]["size"] == "message_length"
    request = {a["id"]: a for a in types["tensor_request"]["seq"]}
    assert list(request) == ["key_length", "tensor_key", "layout_count", "preferred_layouts", "preferred_device",
                             "min_alignment", "request_flags", "trailing"]
    assert [a["id"] for a in types["ping"]["seq"]] == ["trailing"]
    enums = ksy.schemas()["hurray_stream.ksy"]["enums"]
    assert enums["error_code"][0x02] == "unknown_tensor" and enums["error_code"][0xF0]["id"] == "server_busy"
    assert "Implementation-defined" in enums["error_code"][0xF0]["doc"]
    assert enums["capability_flag"] == {1: "transcoding", 2: "parallel_streams", 4: "rdma_data_plane",
                                        8: "rdma_gpudirect"}
    assert enums["request_flag"] == {1: "allow_transcode", 2: "parallel_ok"}


def test_every_stream_attribute_has_doc_and_doc_ref():
    for name, spec in _stream_types().items():
        for attribute in spec["seq"]:
            assert attribute.get("doc") and attribute.get("doc-ref"), (name, attribute["id"])


def test_a_recorded_session_parses_field_by_field():
    """The compiled Python parser reads each session message as its table says (values typed
    from the encoders' inputs in ``session_stream`` and the spec's tables)."""
    parsed = kaitai.parse("messages", session_stream())
    messages = parsed.messages
    assert [int(msg.message_type) for msg in messages] == [0x01, 0x03, 0x09, 0x0A, 0x0B, 0x09, 0x02, 0x08]
    assert [msg.stream_id for msg in messages] == [1, 3, 3, 5, 5, 7, 1, 9]
    hello = messages[0].payload
    assert (hello.protocol_version, hello.max_message_size, hello.capability_flags) == (1, 1 << 20, 0b11)
    assert hello.layout_count == 2 and [int(e.layout_tag) for e in hello.supported_layouts] == [0x01, 0xF3]
    plain, extension = hello.supported_layouts
    assert getattr(plain, "ext_metadata_length", None) is None and getattr(plain, "ext_metadata", None) is None
    assert extension.ext_metadata_length == 3 and extension.ext_metadata == EXTENSION_METADATA
    assert hello.device_count == 2 and [int(d) for d in hello.supported_devices] == [0, 1]
    assert hello.class_count == 1 and [int(c) for c in hello.supported_memory_classes] == [0]
    assert hello.trailing == b""
    request = messages[1].payload
    assert request.key_length == 14 and request.tensor_key == b"weights/layer0"
    assert [int(e.layout_tag) for e in request.preferred_layouts] == [0xF0, 0x03]
    assert request.preferred_layouts[0].ext_metadata_length == 0 and request.preferred_layouts[0].ext_metadata == b""
    assert int(request.preferred_device) == 0 and request.min_alignment == 64 and request.request_flags == 1
    error = messages[2].payload
    assert int(error.error_code) == 0x02 and error.error_code.name == "unknown_tensor"
    assert error.message_length == 26 and error.message == b"no tensor 'weights/layer0'"
    assert messages[3].payload.trailing == b"" and messages[4].payload.trailing == b"abc"  # the PONG's echo
    private = messages[5].payload
    assert int(private.error_code) == 0xF1 and private.error_code.name == "put_refused"
    short = messages[6].payload
    assert short.max_message_size == 4096 and [int(d) for d in short.supported_devices] == [0]
    assert getattr(short, "class_count", None) is None and getattr(short, "supported_memory_classes", None) is None
    assert type(messages[7].payload).__name__ == "TensorPutAck" and messages[7].payload_length == 0


def test_a_recorded_session_agrees_with_inspect_field_by_field():
    """Kaitai's positions and values against the annotated walk ``inspect`` prints."""
    kaitai.python_parsers()
    header_fields = 3 * 8  # eight messages
    assert kaitai.compare(session_stream(), "messages") > 2 * header_fields
