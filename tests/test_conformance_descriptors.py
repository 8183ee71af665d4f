"""Golden vectors of the reference project: decode to what the manifest says, re-encode
to the identical bytes (``metadata.md § Overall Descriptor Structure``)."""

from __future__ import annotations

import pytest

from hurray_schema.codec import decode_descriptor, encode_descriptor, parse_descriptor
from hurray_schema.model import ElementType, TensorDescriptor


def _vectors(manifest):
    return manifest["descriptors"]


@pytest.fixture(scope="module")
def vectors(manifest, conformance_dir):
    out = []
    for entry in _vectors(manifest):
        out.append((entry, (conformance_dir / entry["file"]).read_bytes()))
    assert out, "the manifest lists no descriptor vectors"
    return out


def _observed(desc: TensorDescriptor) -> dict:
    """The descriptor seen through the manifest's vocabulary."""
    tag = desc.type_tag
    return {
        "version_major": desc.version_major,
        "version_minor": desc.version_minor,
        "element_type_tag": int(tag),
        "element_type": ElementType(tag).name.lower() if tag in ElementType._value2member_map_ else None,
        "shape": list(desc.shape),
        "byte_offset": desc.byte_offset,
        "layout_tag": int(desc.layout.tag),
        "buffer_byte_sizes": [b.byte_size for b in desc.buffers],
        "has_quantization": desc.quantization is not None,
        "has_shard": desc.shard is not None,
    }


def test_manifest_lists_every_vector_file(manifest, conformance_dir):
    listed = {e["file"] for e in _vectors(manifest)}
    on_disk = {f"descriptors/{p.name}" for p in (conformance_dir / "descriptors").glob("*.bin")}
    assert listed == on_disk


def test_every_vector_matches_its_manifest_entry(vectors):
    for entry, data in vectors:
        desc = decode_descriptor(data)
        observed = _observed(desc)
        for key, expected in entry["expect"].items():
            assert key in observed, f"{entry['file']}: manifest field {key!r} is not checked"
            assert observed[key] == expected, f"{entry['file']}: {key}"


def test_every_vector_reencodes_byte_identical(vectors):
    for entry, data in vectors:
        desc, findings = parse_descriptor(data)
        assert findings == [], entry["file"]
        assert encode_descriptor(desc) == data, entry["file"]
        assert desc.encoded_length == len(data), entry["file"]


def test_every_vector_decodes_the_same_in_permissive_mode(vectors):
    for entry, data in vectors:
        assert decode_descriptor(data, mode="permissive") == decode_descriptor(data), entry["file"]


def test_vectors_decode_from_any_buffer_type_and_ignore_trailing_bytes(vectors):
    for entry, data in vectors:
        expected = decode_descriptor(data)
        for wrapped in (bytearray(data), memoryview(data), data + b"\xAA" * 7):
            assert decode_descriptor(wrapped) == expected, entry["file"]
