"""Generated format documentation: committed pages are current, and the composite tables
carry every field with the spec's type and offset (expected values typed from the spec
tables ``layouts/composite.md § Head Layout-Specific Fields`` and ``metadata.md §
Composite Member Section``, not computed by the generator)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


from hurray_schema.docs import check_docs
from support.corpus import corpus
from support.corpus import rendered_pages as render_pages


ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "format"


def _table(page: str, struct: str) -> list[dict]:
    """Rows of the table under ``## `STRUCT` `` as dicts keyed by the header cells."""
    text = render_pages()[page]
    start = text.index(f"## `{struct}`")
    lines = text[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| Offset"))
    header = [c.strip() for c in lines[first].strip("|").split("|")]
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        rows.append(dict(zip(header, cells)))
    return rows


def test_committed_pages_equal_a_fresh_render():
    stale = check_docs(COMMITTED, corpus())
    assert not stale, f"docs/format is out of date ({stale}); run `hurray-schema docs docs/format`"


def test_docs_command_writes_the_same_pages(tmp_path):
    out = tmp_path / "format"
    subprocess.run([sys.executable, "-m", "hurray_schema", "docs", str(out)], check=True, capture_output=True)
    for page in COMMITTED.glob("*.md"):
        assert (out / page.name).read_text(encoding="utf-8") == page.read_text(encoding="utf-8"), page.name
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in COMMITTED.glob("*.md"))


def test_docs_check_flags_a_hand_edit(tmp_path):
    out = tmp_path / "format"
    subprocess.run([sys.executable, "-m", "hurray_schema", "docs", str(out)], check=True, capture_output=True)
    page = out / "layouts.md"
    page.write_text(page.read_text(encoding="utf-8").replace("uint32", "uint16", 1), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "hurray_schema", "docs", "--check", str(out)], capture_output=True, text=True)
    assert done.returncode == 1 and "layouts.md" in done.stderr


# composite head, layouts/composite.md § Head Layout-Specific Fields: (field, type, offset in table)
COMPOSITE_HEAD = [
    ("composition_rule", "uint8", "0"),
    ("combine_op", "uint8", "1"),
    ("_reserved", "uint8[2]", "2"),
    ("member_count", "uint32", "4"),
]
# metadata.md § Composite Member Section
COMPOSITE_MEMBER = [("member_role", "uint8", "0"), ("_reserved", "uint8[15]", "1")]


def test_composite_head_table_has_every_field_with_type_and_offset():
    rows = _table("layouts.md", "COMPOSITE")
    got = [(r["Field"].strip("`"), r["Type"].strip("`"), r["Offset"]) for r in rows]
    assert got == COMPOSITE_HEAD
    # the head's layout fields follow the 20-byte header, shape (8 bytes per dimension)
    # and byte_offset (8 bytes): metadata.md § Overall Descriptor Structure
    assert [r["In descriptor"] for r in rows] == [
        "28 + 8·rank", "29 + 8·rank", "30 + 8·rank", "32 + 8·rank",
    ]
    assert all(r["Citation"] == "layouts/composite.md § Head Layout-Specific Fields" for r in rows)


def test_composite_member_section_table_has_every_field_with_type_and_offset():
    rows = _table("sections.md", "COMPOSITE_MEMBER_SECTION")
    got = [(r["Field"].strip("`"), r["Type"].strip("`"), r["Offset"]) for r in rows]
    assert got == COMPOSITE_MEMBER
    assert all(r["Citation"] == "metadata.md § Composite Member Section" for r in rows)
    page = render_pages()["sections.md"]
    assert "Size: 16 bytes. Present when flag bit 4 (HAS_COMPOSITE_MEMBER) is set." in page


def test_fixed_header_offsets_match_the_spec_table():
    rows = _table("descriptor.md", "FIXED_HEADER")
    # metadata.md § Fixed Header
    assert [(r["Offset"], r["Field"].strip("`"), r["Type"].strip("`")) for r in rows] == [
        ("0", "magic", "bytes[4]"), ("4", "version_major", "uint8"), ("5", "version_minor", "uint8"),
        ("6", "descriptor_length", "uint32"), ("10", "flags", "uint32"), ("14", "type_tag", "uint8"),
        ("15", "layout_tag", "uint8"), ("16", "rank", "uint32"),
    ]


def test_buffer_handle_and_variable_tables():
    rows = _table("descriptor.md", "BUFFER_HANDLE")
    assert [(r["Offset"], r["Field"].strip("`")) for r in rows] == [
        ("0", "byte_size"), ("8", "alignment"), ("12", "device_tag"), ("13", "sync_mode"),
        ("14", "memory_class"), ("15", "_reserved"),
    ]
    tiled = _table("layouts.md", "TILED")
    assert tiled[0]["Type"] == "`uint64[rank]`" and tiled[1]["Offset"] == "8·rank"
    assert tiled[-1]["Offset"] == "—"  # after a conditional field the offset is not fixed
    ext = _table("layouts.md", "EXTENSION")
    assert ext[-1]["Type"] == "`bytes[extension_data_length]`"


def test_tag_tables_and_rule_index():
    pages = render_pages()
    tags = pages["tags.md"]
    assert "## `CompositionRule`" in tags and "| 0x03 | `GROUP` |" in tags
    assert "| 4 | 0x00000010 | `HAS_COMPOSITE_MEMBER` |" in tags
    index = pages["index.md"]
    from hurray_schema.rules.engine import registry

    for rule in registry():
        assert f"`{rule.id}` |" in index
    magic = next(line for line in index.splitlines() if "`descriptor.magic` |" in line)
    assert "[`FIXED_HEADER`](descriptor.md#fixed_header)" in magic
    # and back: the struct's page lists the rule
    assert "[`descriptor.magic`](index.md#rule-descriptor-magic)" in pages["descriptor.md"]


@pytest.mark.parametrize("page", sorted(render_pages()))
def test_links_point_at_existing_anchors(page):
    pages = render_pages()
    for target, anchor in re.findall(r"\]\(([\w-]+\.md)(?:#([\w-]+))?\)", pages[page]):
        assert target in pages, target
        if anchor:
            assert f'<a id="{anchor}"></a>' in pages[target], f"{target}#{anchor}"


# interchange.md § CLIENT_HELLO Payload: every list "preceded by a uint16 count field"
CLIENT_HELLO = [
    ("0", "protocol_version", "uint32"), ("4", "max_message_size", "uint32"), ("8", "capability_flags", "uint64"),
    ("16", "layout_count", "uint16"), ("18", "supported_layouts", "layout_entry[layout_count]"),
    ("—", "device_count", "uint16"), ("—", "supported_devices", "uint8[device_count]"),
    ("—", "class_count", "uint16"), ("—", "supported_memory_classes", "uint8[class_count]"),
]


def test_session_tables_have_every_field_with_type_offset_and_citation():
    rows = _table("session.md", "CLIENT_HELLO")
    assert [(r["Offset"], r["Field"].strip("`"), r["Type"].strip("`")) for r in rows] == CLIENT_HELLO
    assert rows[0]["Citation"] == "interchange.md § CLIENT_HELLO Payload"
    assert rows[2]["Citation"] == "interchange.md § Capability Flags"
    assert "[CapabilityFlag](tags.md#capabilityflag)" in rows[2]["Description"]
    assert "Entries: [`LAYOUT_ENTRY`](#layout_entry)" in rows[4]["Description"]
    assert "May be absent" in rows[-1]["Description"] and "May be absent" in rows[-2]["Description"]
    # interchange.md § TENSOR_REQUEST Payload: tensor_key is a uint32 byte length, then UTF-8 bytes
    request = _table("session.md", "TENSOR_REQUEST")
    assert [(r["Field"].strip("`"), r["Type"].strip("`")) for r in request] == [
        ("key_length", "uint32"), ("tensor_key", "bytes[key_length]"), ("layout_count", "uint16"),
        ("preferred_layouts", "layout_entry[layout_count]"), ("preferred_device", "uint8"),
        ("min_alignment", "uint32"), ("request_flags", "uint32"),
    ]
    error = _table("session.md", "ERROR")
    assert [(r["Offset"], r["Field"].strip("`"), r["Type"].strip("`")) for r in error] == [
        ("0", "error_code", "uint32"), ("4", "message_length", "uint32"), ("8", "message", "bytes[message_length]"),
    ]
    assert "[PrivateErrorCode](tags.md#privateerrorcode)" in error[0]["Description"]


def test_layout_entry_conditional_fields():
    # interchange.md § Layout Entry Encoding: length and metadata only for the extension range 0xF0-0xFE
    rows = _table("session.md", "LAYOUT_ENTRY")
    assert [(r["Offset"], r["Field"].strip("`"), r["Type"].strip("`")) for r in rows] == [
        ("0", "layout_tag", "uint8"), ("1", "ext_metadata_length", "uint16"),
        ("—", "ext_metadata", "bytes[ext_metadata_length]"),
    ]
    assert all("Present when `0xF0 <= layout_tag <= 0xFE`." in r["Description"] for r in rows[1:])
    page = render_pages()["session.md"]
    assert "[`TENSOR_REQUEST.preferred_layouts`](session.md#tensor_request)" in page


def test_session_page_lists_the_payload_of_every_session_message():
    page = render_pages()["session.md"]
    # interchange.md § Message Types
    assert "| 0x00000001 | `CLIENT_HELLO` | [`CLIENT_HELLO`](#client_hello) |" in page
    assert "| 0x00000008 | `TENSOR_PUT_ACK` | empty |" in page
    assert "| 0x0000000A | `PING` | empty | Keepalives." in page
    assert "| 0x0000000C | `RDMA_REGISTER` | [`RDMA_REGISTER`](#rdma_register) |" in page
    assert "| 0x000000F0–0x000000FE | (private extension) |" in page and "| 0x000000FF | (invalid) |" in page
    assert "`TENSOR_DESCRIPTOR`, `TENSOR_DATA`, `TENSOR_DATA_END`" in page
    for anchor in re.findall(r"\]\(#([\w-]+)\)", page):
        assert f'<a id="{anchor}"></a>' in page, anchor
    assert "[Transport session" in render_pages()["index.md"]


def test_session_flag_and_code_tables():
    tags = render_pages()["tags.md"]
    # interchange.md § Capability Flags, § TENSOR_REQUEST Payload (request flags), § ERROR Payload
    assert "| 3 | 0x00000008 | `RDMA_GPUDIRECT` |" in tags and "| 1 | 0x00000002 | `PARALLEL_OK` |" in tags
    assert "| 0x02 | `UNKNOWN_TENSOR` |" in tags and "| 0x08 | `SHARD_MISMATCH` |" in tags
    private = tags[tags.index("## `PrivateErrorCode`"):]
    private = private[: private.index("<a id=", 1)]
    assert "range the spec leaves to implementations" in private
    assert "[`ERROR.error_code`](session.md#error) (this implementation's values" in private
    assert "| 0xF0 | `SERVER_BUSY` | No slot came free before the connection's handshake deadline" in private
    assert "| 0xF5 | `SOURCE_CHANGED` | The file the item is served from changed or was cut" in private
    errors = tags[tags.index("## `ErrorCode`"):]
    assert "implementation-defined range: [PrivateErrorCode](tags.md#privateerrorcode)" in errors[:1500]
