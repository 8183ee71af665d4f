"""The annotated view behind ``hurray-schema inspect``: every byte of a descriptor is
covered by exactly one field, the parts agree with ``descriptor_spans``, and hostile
bytes never make it crash."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_schema.codec import encode_descriptor
from hurray_schema.errors import HurraySchemaError
from hurray_schema.hexview import annotate, annotate_descriptor, detect_kind, render_hex, render_tree
from hurray_schema.model import (
    BlockPagedLayout, BufferHandle, CombineOp, CompositeLayout, CompositeMember, CompositionRule, CooLayout,
    CsfLayout, ElementType, ExtensionLayout, ExtensionType, MemberRole, Nf4, PerBlockAffine, Shard, Statistics,
    StridedLayout, TensorDescriptor, TiledLayout,
)
from hurray_schema.structs._declare import static_offset, static_size
from hurray_schema.structs.descriptor import BUFFER_HANDLE_SIZE, FIXED_HEADER
from hurray_schema.structs.quantization import QUANTIZATION_HEADER, QUANTIZATION_LENGTH
from hurray_schema.structs.wire import descriptor_spans
from support.sessions import EXTENSION_METADATA, session_stream

F32 = ElementType.FLOAT32

DESCRIPTORS = {
    "dense": TensorDescriptor(F32, (3, 4), buffers=[BufferHandle(48)]),
    "scalar": TensorDescriptor(F32, (), buffers=[BufferHandle(4)]),
    "strided": TensorDescriptor(F32, (2, 3), layout=StridedLayout((-3, 1)), buffers=[BufferHandle(24)]),
    "tiled-nested": TensorDescriptor(F32, (8, 8), layout=TiledLayout(
        (4, 4), outer_layout=3, inner_layout=4, outer_strides=(2, 1),
        inner=TiledLayout((2, 2), inner_layout=3, inner_strides=(2, 1))), buffers=[BufferHandle(256)]),
    "coo": TensorDescriptor(F32, (5, 5), layout=CooLayout(3, 1), buffers=[BufferHandle(12), BufferHandle(48)]),
    "csf": TensorDescriptor(F32, (2, 2, 2), layout=CsfLayout(2, (2, 0, 1)), buffers=[BufferHandle(8)] * 7),
    "block-paged": TensorDescriptor(F32, (4, 16, 8), layout=BlockPagedLayout(16, 4, 2),
                                    buffers=[BufferHandle(2048), BufferHandle(8), BufferHandle(12)]),
    "head": TensorDescriptor(F32, (8, 8), layout=CompositeLayout(CompositionRule.OVERLAY, 2, CombineOp.REPLACE)),
    "member": TensorDescriptor(ElementType.INT4, (8, 8), buffers=[BufferHandle(32), BufferHandle(8)],
                               quantization=PerBlockAffine(axis=1, block_size=4, scale_buffer_index=1,
                                                           scale_type_tag=ElementType.FLOAT16, flags=1),
                               shard=Shard((8, 8), (0, 0)), statistics=Statistics(computed_mask=1, nnz=5),
                               composite_member=CompositeMember(MemberRole.BASE)),
    "nf4-padded": TensorDescriptor(ElementType.UINT4, (4, 8), buffers=[BufferHandle(16), BufferHandle(16)],
                                   quantization=Nf4(axis=1, block_size=8, scale_buffer_index=1, padding=b"\0" * 4)),
    "extension": TensorDescriptor(0xF3, (4,), layout=ExtensionLayout(0xF1, 7, b"abc"), buffers=[BufferHandle(3)],
                                  extension_type=ExtensionType(bit_width=6, is_float=1, exponent_bits=3,
                                                               mantissa_bits=2, sign_bits=1)),
}


def _fields(nodes):
    return [n for n in nodes if n.kind in ("field", "opaque")]


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_every_byte_is_one_field(name):
    wire = encode_descriptor(DESCRIPTORS[name])
    nodes, desc, end = annotate_descriptor(wire)
    assert desc == DESCRIPTORS[name] and end == len(wire)
    assert not [n for n in nodes if n.kind == "error"]
    pos = 0
    for n in _fields(nodes):
        assert n.start == pos, (n.label, n.start, pos)
        assert n.raw == wire[n.start:n.end]
        pos = n.end
    assert pos == len(wire)


@pytest.mark.parametrize("name", sorted(DESCRIPTORS))
def test_parts_agree_with_descriptor_spans(name):
    desc = DESCRIPTORS[name]
    wire = encode_descriptor(desc)
    nodes, _, _ = annotate_descriptor(wire)
    top = {n.label.split(" ")[0]: (n.start, n.end) for n in nodes if n.kind == "section" and n.depth == 1}
    for part, start, end in descriptor_spans(desc):
        if start == end:
            continue
        assert top[part] == (start, end), part


def test_decoded_values_and_tag_names():
    wire = encode_descriptor(DESCRIPTORS["member"])
    nodes = {}
    for n in _fields(annotate(wire)):
        nodes.setdefault(n.label, n)  # first occurrence: the fixed header's flags
    assert nodes["type_tag"].text == "0x48 (INT4)"
    # flags bits 0, 1, 3, 4 (metadata.md § Flags)
    assert nodes["flags"].value == 0b11011 and "HAS_QUANTIZATION|HAS_SHARD|HAS_STATISTICS|HAS_COMPOSITE_MEMBER" in nodes["flags"].text
    assert nodes["scale_type_tag"].text == "0x01 (FLOAT16)"
    quant_flags = [n for n in _fields(annotate(wire)) if n.label == "flags"][1]
    assert quant_flags.text == "0x0001 (SYMMETRIC)" and quant_flags.type == "uint16"
    assert nodes["member_role"].text == "0x01 (BASE)" and nodes["member_role"].type == "uint8"
    assert nodes["_reserved"].ref  # every field carries its citation
    assert all(n.ref for n in _fields(annotate(wire)))


def test_renderers_show_every_field():
    wire = encode_descriptor(DESCRIPTORS["tiled-nested"])
    nodes = annotate(wire)
    tree, table = render_tree(nodes), render_hex(nodes)
    for n in _fields(nodes):
        assert n.label in tree and n.label in table
    assert "level 2" in tree


def test_detect_kind():
    wire = encode_descriptor(DESCRIPTORS["dense"])
    assert detect_kind(wire) == "descriptor"
    assert detect_kind(wire + bytes(48)) == "stream"
    assert detect_kind(b"HRRYFILE" + bytes(100)) == "file"
    assert detect_kind(struct.pack("<III", 4, 1, 0)) == "messages"
    assert detect_kind(b"") == "unknown"
    with pytest.raises(HurraySchemaError):
        annotate(b"nothing here")


_SEEDS = [encode_descriptor(d) for d in DESCRIPTORS.values()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(_SEEDS),
    edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 400),
    kind=st.sampled_from(["descriptor", "stream", "file", "messages"]),
)
def test_hostile_bytes_never_crash(seed, edits, cut, kind):
    data = bytearray(seed)
    for at, value in edits:
        if at < len(data):
            data[at] = value
    data = bytes(data[: max(cut, 1)])
    if kind == "file":
        data = b"HRRYFILE" + data
    elif kind == "messages":
        data = struct.pack("<III", 4, 1, len(data)) + data
    try:
        nodes = annotate(data, kind)
    except HurraySchemaError:
        return
    for n in nodes:
        assert 0 <= n.start <= n.end <= len(data) or n.kind == "opaque" and n.label == "data"
    render_tree(nodes)
    render_hex(nodes)


def test_file_with_unreadable_index_is_walked_from_the_first_descriptor():
    from pathlib import Path

    data = bytearray((Path(__file__).resolve().parents[1] / "hurray_schema" / "samples" / "sample.hrry").read_bytes())
    # trailer (file-format.md § Trailer): 40 bytes at the end, index_offset first
    data[-40:-32] = (10**9).to_bytes(8, "little")
    nodes = annotate(bytes(data))
    tensors = [n for n in nodes if n.kind == "section" and n.label.startswith("tensor")]
    assert [(n.label, n.start, n.depth) for n in tensors] == [
        ("tensor '@64'", 64, 0), ("tensor '@120'", 120, 1), ("tensor '@4144'", 4144, 1), ("tensor '@8240'", 8240, 0),
    ]
    assert any(n.kind == "error" and "index cannot be read" in n.text for n in nodes)


def test_golden_vectors_are_fully_annotated(conformance_dir):
    for path in sorted((conformance_dir / "descriptors").glob("*.bin")):
        wire = path.read_bytes()
        nodes = annotate(wire, "descriptor")
        assert not [n for n in nodes if n.kind == "error"], path.name
        covered = b"".join(n.raw for n in _fields(nodes))
        assert covered == wire, path.name
    for path in sorted((conformance_dir / "files").glob("*.hrry")):
        nodes = annotate(path.read_bytes())
        assert not [n for n in nodes if n.kind == "error"], path.name
        labels = [n.label for n in nodes if n.kind == "section" and n.depth == 0]
        assert labels[0] == "file header" and labels[-1] == "trailer" and "index" in labels


def test_nested_composites_are_indented_by_binding_depth():
    import numpy as np

    from hurray_schema.io.stream import write_stream
    from hurray_schema.io.tensor import Composite, Tensor

    def t(n):
        return Tensor.from_numpy(np.zeros(n, np.float32))

    inner = Composite.build(CompositionRule.GROUP, [t(2), t(3)], shape=(2,), type_tag=F32)
    outer = Composite.build(CompositionRule.GROUP, [t(1), inner], shape=(2,), type_tag=F32)
    nodes = annotate(write_stream(None, [outer, t(4)]))
    depths = [n.depth for n in nodes if n.kind == "section" and n.label.startswith("tensor")]
    # outer head, its member, the inner head (a member), the inner head's two members, a plain tensor
    assert depths == [0, 1, 1, 2, 2, 0]


def _parts(nodes):
    """The first word of each part's section (depth 1 under the descriptor), in byte order."""
    return [n.label.split(" ")[0] for n in nodes if n.depth == 1 and n.kind in ("section", "opaque")]


def test_parts_in_wire_order_each_present_when_its_flag_is_set():
    # metadata.md § Overall Descriptor Structure: the sections after the buffer table come
    # in the spec's order (quantization, shard, statistics, extension type, composite member),
    # not in the order of their flag bits (metadata.md § Flags)
    every = TensorDescriptor(0xF3, (2,), layout=StridedLayout((1,)), buffers=[BufferHandle(3)],
                             quantization=Nf4(0, 64, 1), shard=Shard((4,), (2,)), statistics=Statistics(0x3F, nnz=1),
                             extension_type=ExtensionType(12), composite_member=CompositeMember(MemberRole.BASE))
    assert _parts(annotate(encode_descriptor(every))) == [
        "fixed_header", "shape", "byte_offset", "layout", "buffer_table", "quantization", "shard", "statistics",
        "extension_type", "composite_member",
    ]
    some = TensorDescriptor(F32, (2,), buffers=[BufferHandle(8)], statistics=Statistics(1, nnz=1),
                            composite_member=CompositeMember(MemberRole.CORRECTION))
    assert _parts(annotate(encode_descriptor(some))) == [
        "fixed_header", "shape", "byte_offset", "buffer_table", "statistics", "composite_member",
    ]


def _with_byte(wire: bytes, at: int, value: int) -> bytes:
    return wire[:at] + bytes([value]) + wire[at + 1:]


def test_unknown_layout_tag_leaves_the_rest_opaque():
    wire = encode_descriptor(DESCRIPTORS["dense"])
    nodes = annotate(_with_byte(wire, static_offset(FIXED_HEADER, "layout_tag"), 0x30), "descriptor")
    assert _parts(nodes) == ["fixed_header", "shape", "byte_offset", "layout"]
    (opaque,) = [n for n in nodes if n.kind == "opaque"]
    assert opaque.label == "layout (unknown, opaque)" and (opaque.start, opaque.end) == (44, len(wire))


def test_unknown_scheme_shows_the_quantization_header_and_an_opaque_payload():
    desc = DESCRIPTORS["nf4-padded"]
    wire = encode_descriptor(desc)
    (start, end), = [(s, e) for part, s, e in descriptor_spans(desc) if part == "quantization"]
    scheme_tag_at = start + static_size(QUANTIZATION_LENGTH)  # metadata.md § Quantization Section
    nodes = annotate(_with_byte(wire, scheme_tag_at, 0x30), "descriptor")
    inside = [n for n in nodes if n.depth == 2 and start <= n.start < end]
    assert [n.label for n in inside] == [
        "quantization_length", "scheme_tag", "scheme_version", "flags", "payload (unknown scheme)",
    ]
    assert inside[1].text == "0x30 (unassigned)"
    assert (inside[-1].start, inside[-1].end) == (scheme_tag_at + static_size(QUANTIZATION_HEADER), end)
    quantization = next(n for n in nodes if n.kind == "section" and n.label == "quantization")
    assert (quantization.start, quantization.end) == (start, end)


def test_buffer_table_has_one_section_per_buffer_count():
    wire = encode_descriptor(DESCRIPTORS["coo"])
    nodes = annotate(wire)
    entries = [n for n in nodes if n.kind == "section" and n.label.startswith("buffers[")]
    assert [n.label for n in entries] == ["buffers[0]", "buffers[1]"]
    assert [n.end - n.start for n in entries] == [BUFFER_HANDLE_SIZE] * 2


# --------------------------------------------------------------------------------------
# Session messages (interchange.md § Session Establishment through § Error Handling)
# --------------------------------------------------------------------------------------


def _by_label(nodes, label):
    return [n for n in nodes if n.kind == "field" and n.label == label]


def test_session_payloads_are_shown_field_by_field():
    data = session_stream()
    nodes = annotate(data)
    assert detect_kind(data) == "messages"
    assert not [n for n in nodes if n.kind == "error"]
    assert not [n for n in nodes if n.kind == "opaque" and n.label == "payload"]  # nothing left opaque
    # CLIENT_HELLO payload: protocol_version at payload offset 0 (interchange.md § CLIENT_HELLO Payload)
    (version, _) = _by_label(nodes, "protocol_version")
    assert (version.start, version.end, version.value, version.type) == (12, 16, 1, "uint32")
    assert version.ref == "interchange.md § CLIENT_HELLO Payload"
    flags = _by_label(nodes, "capability_flags")[0]
    assert flags.text == "0x0000000000000003 (TRANSCODING|PARALLEL_STREAMS)" and flags.type == "uint64"
    # the extension entry (§ Layout Entry Encoding): tag, uint16 length, then the metadata
    tags = _by_label(nodes, "layout_tag")
    assert [n.value for n in tags] == [0x01, 0xF3, 0xF0, 0x03]
    length, empty_length = _by_label(nodes, "ext_metadata_length")
    assert (length.start, length.value) == (tags[1].end, 3)
    metadata, empty = _by_label(nodes, "ext_metadata")
    assert (metadata.raw, metadata.start, metadata.end) == (EXTENSION_METADATA, length.end, length.end + 3)
    assert empty_length.value == 0 and empty.start == empty.end and empty.text == "empty"
    entries = [n.label for n in nodes if n.kind == "section" and "layouts" in n.label]
    assert entries == ["supported_layouts", "supported_layouts[0]", "supported_layouts[1]", "preferred_layouts",
                       "preferred_layouts[0]", "preferred_layouts[1]"]
    assert _by_label(nodes, "supported_layouts")[0].text == "[]"  # the short SERVER_HELLO lists no layout
    assert _by_label(nodes, "supported_devices")[0].text == "[0x00 (CPU), 0x01 (CUDA)]"
    (key,) = _by_label(nodes, "tensor_key")
    assert key.value == b"weights/layer0" and key.text == '"weights/layer0"' and key.type == "bytes[key_length]"
    assert _by_label(nodes, "request_flags")[0].text == "0x00000001 (ALLOW_TRANSCODE)"
    codes = _by_label(nodes, "error_code")
    assert [n.text for n in codes] == ["0x00000002 (UNKNOWN_TENSOR)",
                                       "0x000000F1 (PUT_REFUSED, implementation-defined)"]
    assert _by_label(nodes, "message")[0].text == "\"no tensor 'weights/layer0'\""
    # the PONG's echoed bytes: no table covers them
    (echo,) = [n for n in nodes if n.kind == "opaque" and n.label == "trailing"]
    assert echo.raw == b"abc" and echo.end == data.index(b"abc") + 3
    # a hello without its memory class list (§ SERVER_HELLO Payload: "If absent")
    assert len(_by_label(nodes, "class_count")) == 1 and len(_by_label(nodes, "protocol_version")) == 2


def test_session_payload_fields_cover_every_payload_byte():
    data = session_stream()
    nodes = annotate(data)
    covered = sorted((n.start, n.end) for n in _fields(nodes) if n.end > n.start)
    pos = 0
    for start, end in covered:
        assert start == pos, (start, pos)
        pos = end
    assert pos == len(data)


def test_a_payload_its_table_does_not_fit_stays_opaque_with_the_reason():
    from hurray_schema.net import messages as m
    from hurray_schema.structs.stream import MessageType as T

    cut = m.encode_request(m.Request("abc"))[:6]  # key_length 3, two of its bytes
    data = m.message(T.TENSOR_REQUEST, 3, cut) + m.message(T.PING, 5)
    nodes = annotate(data)
    (payload,) = [n for n in nodes if n.kind == "opaque"]
    assert (payload.label, payload.start, payload.end, payload.raw) == ("payload", 12, 18, cut)
    (error,) = [n for n in nodes if n.kind == "error"]
    assert error.text == "the payload is not a TENSOR_REQUEST table: tensor_key needs 3 bytes, 2 remain"
    assert not _by_label(nodes, "key_length")  # the fields of the failed walk are not kept
    assert [n.label for n in nodes if n.kind == "section"] == ["message 0", "message 1"]


def test_inspect_shows_session_fields(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "session.msgs"
    path.write_bytes(session_stream())
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "inspect", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "message stream" in text.splitlines()[0]
    line = next(line for line in text.splitlines() if "protocol_version" in line)
    assert line.split()[:2] == ["12-15", "01"] and "= 1  uint32" in line
    assert "interchange.md § CLIENT_HELLO Payload" in text
    assert re.search(r'tensor_key +=  ?"weights/layer0"  bytes\[key_length\]', text)
    assert "error_code               = 0x00000002 (UNKNOWN_TENSOR)  uint32" in text
    assert "ext_metadata" in text and "10 20 30" in text
    assert "supported_layouts[1]" in text
    assert "payload  " not in text  # no session payload left opaque


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=6), cut=st.integers(1, 300),
       brief=st.booleans())
def test_hostile_session_bytes_never_crash(edits, cut, brief):
    data = bytearray(session_stream())
    for at, value in edits:
        if at < len(data):
            data[at] = value
    data = bytes(data[:cut])
    nodes = annotate(data, "messages", brief=brief)
    for n in nodes:
        assert 0 <= n.start <= n.end <= len(data)
    render_tree(nodes)
    render_hex(nodes)


def test_the_html_page_shows_the_same_session_fields():
    """``inspect --html`` draws the rows of the same annotated nodes."""
    from hurray_schema.htmlview import page_model

    data = session_stream()
    model = page_model(data, "messages")
    fields = {(model["labels"][row[2]], row[3], row[4], row[5]) for row in model["rows"] if row[0] == "f"}
    shown = {(n.label, n.start, n.end, n.text) for n in _fields(annotate(data)) if n.kind == "field"}
    payload = {f for f in shown if f[0] not in ("message_type", "stream_id", "payload_length")}
    assert payload and payload <= fields
    assert ("error_code", 101, 105, "0x00000002 (UNKNOWN_TENSOR)") in fields
    assert not [row for row in model["rows"] if model["labels"][row[2]] == "payload"]
