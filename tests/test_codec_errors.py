"""Hostile and malformed descriptors: every fault is a SpecViolation naming its rule, its
spec section and the byte offset of the fault -- never another exception type.

Inputs are built by patching known-good bytes at offsets read off the spec tables
(``metadata.md § Fixed Header``: magic 0, version 4/5, descriptor_length 6, flags 10,
type_tag 14, layout_tag 15, rank 16, shape 20, then byte_offset, layout fields, buffer
table and the optional sections).
"""

from __future__ import annotations

import struct

import pytest

from hurray_schema.codec import decode_descriptor, encode_descriptor, parse_descriptor
from hurray_schema.errors import HurraySchemaError, SpecViolation
from hurray_schema.model import (
    BufferHandle, CompositeLayout, CsrLayout, ElementType, ExtensionLayout, PerBlockAffine, PerTensorAffine, Shard,
    Statistics, TensorDescriptor, TiledLayout, UnknownLayout, UnknownQuantization,
)
from hurray_schema.rules import structure
from hurray_schema.rules.engine import get_rule, registry

F32 = ElementType.FLOAT32
ROW_MAJOR_F32 = TensorDescriptor(F32, (3, 4), buffers=[BufferHandle(48)])
# literal bytes of row-major float32 [3, 4] (metadata.md § Fixed Header, pyhurray-verified)
ROW_MAJOR_WIRE = bytes.fromhex(
    "4852525901003d000000000000000301020000000300000000000000040000000000000000000000000000000130000000000000004000000000000000"
)
LAYOUT_FIELDS_AT = 44  # after 20-byte header, 2 x 8-byte shape, 8-byte byte_offset (rank 2)


def violation(data, mode="strict", rule=None) -> SpecViolation:
    """Decode ``data``; assert it raises SpecViolation (not another type) and return it."""
    try:
        decode_descriptor(data, mode=mode)
    except SpecViolation as exc:
        assert isinstance(exc, HurraySchemaError)
        assert exc.citation and ".md" in exc.citation
        assert exc.rule_id in RULE_IDS
        assert rule is None or exc.rule_id == rule, (exc.rule_id, str(exc))
        return exc
    except Exception as exc:  # pragma: no cover - the failure this file is about
        raise AssertionError(f"{type(exc).__name__} instead of SpecViolation: {exc}") from exc
    raise AssertionError("decoded without a SpecViolation")


RULE_IDS = {r.id for r in registry()}


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def with_length(data: bytes) -> bytes:
    """Fix descriptor_length after growing or shrinking a descriptor."""
    return patch(data, 6, "I", len(data))


def test_reference_bytes_are_what_we_encode():
    assert encode_descriptor(ROW_MAJOR_F32) == ROW_MAJOR_WIRE


# --------------------------------------------------------------------------------------
# Truncation
# --------------------------------------------------------------------------------------


def test_every_prefix_of_every_golden_vector_is_truncated(manifest, conformance_dir):
    for entry in manifest["descriptors"]:
        data = (conformance_dir / entry["file"]).read_bytes()
        for n in range(len(data)):
            exc = violation(data[:n], rule="descriptor.truncated")
            assert exc.offset == n, (entry["file"], n)
            for mode in ("permissive",):
                assert violation(data[:n], mode=mode).rule_id == "descriptor.truncated"


def test_empty_input():
    assert violation(b"", rule="descriptor.truncated").offset == 0


def test_non_bytes_buffers_are_accepted_and_bounded():
    assert decode_descriptor(bytearray(ROW_MAJOR_WIRE)) == ROW_MAJOR_F32
    assert decode_descriptor(memoryview(ROW_MAJOR_WIRE)[:]) == ROW_MAJOR_F32
    violation(memoryview(ROW_MAJOR_WIRE)[:-1], rule="descriptor.truncated")


# --------------------------------------------------------------------------------------
# Fixed header
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"HRRX", b"hrry", b"\x00\x00\x00\x00", b"YRRH"])
def test_wrong_magic(magic):
    assert violation(magic + ROW_MAJOR_WIRE[4:], rule="descriptor.magic").offset == 0


@pytest.mark.parametrize("major", [2, 3, 255])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_newer_major_version(major, mode):
    exc = violation(patch(ROW_MAJOR_WIRE, 4, "B", major), mode=mode, rule="descriptor.version_major")
    assert exc.offset == 4


@pytest.mark.parametrize("length", [0, 1, 10, 19])
def test_descriptor_length_below_header(length):
    exc = violation(patch(ROW_MAJOR_WIRE, 6, "I", length), rule="descriptor.length.minimum")
    assert exc.offset == 6


@pytest.mark.parametrize("length", [62, 1000, 2**32 - 1])
def test_descriptor_length_beyond_input(length):
    exc = violation(patch(ROW_MAJOR_WIRE, 6, "I", length), rule="descriptor.truncated")
    assert exc.offset == len(ROW_MAJOR_WIRE)


@pytest.mark.parametrize("bit", range(5, 32))
def test_reserved_flag_bits(bit):
    exc = violation(patch(ROW_MAJOR_WIRE, 10, "I", 1 << bit), rule="descriptor.flags.reserved")
    assert exc.offset == 10
    violation(patch(ROW_MAJOR_WIRE, 10, "I", 1 << bit), mode="permissive", rule="descriptor.flags.reserved")


@pytest.mark.parametrize("rank", [65, 1000, 2**32 - 1])
def test_rank_above_64(rank):
    assert violation(patch(ROW_MAJOR_WIRE, 16, "I", rank), rule="descriptor.rank.cap").offset == 16


def test_rank_64_is_accepted():
    desc = TensorDescriptor(F32, (1,) * 64, buffers=[BufferHandle(4)])
    assert decode_descriptor(encode_descriptor(desc)) == desc


def test_rank_larger_than_the_bytes_is_bounded():
    violation(patch(ROW_MAJOR_WIRE, 16, "I", 64), rule="descriptor.length.bounds")


# --------------------------------------------------------------------------------------
# Tags
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", [0x00, 0xFF])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_invalid_type_tag(tag, mode):
    exc = violation(patch(ROW_MAJOR_WIRE, 14, "B", tag), mode=mode, rule="descriptor.type_tag.invalid")
    assert exc.offset == 14


@pytest.mark.parametrize("tag", [0x05, 0x0F, 0x18, 0x21, 0x47, 0x4C, 0x52, 0x80, 0xEF, 0xF0, 0xFE])
def test_unknown_type_tag_strict_and_permissive(tag):
    wire = patch(ROW_MAJOR_WIRE, 14, "B", tag)
    assert violation(wire, rule="descriptor.type_tag.unknown").offset == 14
    desc, findings = parse_descriptor(wire, mode="permissive")
    assert desc.type_tag == tag and [f.rule_id for f in findings] == ["descriptor.type_tag.unknown"]
    assert findings[0].offset == 14
    assert encode_descriptor(desc) == wire


@pytest.mark.parametrize("tag", [0x00, 0xFF])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_invalid_layout_tag(tag, mode):
    exc = violation(patch(ROW_MAJOR_WIRE, 15, "B", tag), mode=mode, rule="descriptor.layout_tag.invalid")
    assert exc.offset == 15


@pytest.mark.parametrize("tag", [0x0C, 0x3F, 0x41, 0xEF])
def test_unknown_layout_tag_strict_and_permissive(tag):
    # a quantized, sharded descriptor: the sections after the unknown layout stay opaque too
    desc = TensorDescriptor(ElementType.INT8, (3, 4), buffers=[BufferHandle(12)],
                            quantization=PerTensorAffine(0.5), shard=Shard((6, 4), (0, 0)))
    wire = patch(encode_descriptor(desc), 15, "B", tag)
    assert violation(wire, rule="descriptor.layout_tag.unknown").offset == 15
    back, findings = parse_descriptor(wire, mode="permissive")
    assert isinstance(back.layout, UnknownLayout) and back.layout.tag == tag
    assert back.shape == (3, 4) and back.type_tag == ElementType.INT8
    assert back.layout.payload == wire[LAYOUT_FIELDS_AT:]
    assert [f.rule_id for f in findings] == ["descriptor.layout_tag.unknown"]
    assert encode_descriptor(back) == wire
    assert back.encoded_length == len(wire)


def test_private_layout_with_unknown_id_strict_and_permissive():
    desc = TensorDescriptor(F32, (3, 4), ExtensionLayout(0xF1, 99, b"abc"), buffers=[BufferHandle(48)])
    wire = encode_descriptor(desc)
    assert violation(wire, rule="descriptor.layout.extension_unknown").offset == LAYOUT_FIELDS_AT
    assert decode_descriptor(wire, mode="permissive") == desc


@pytest.mark.parametrize("length", [4, 100, 2**32 - 1])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_extension_layout_data_past_the_end(length, mode):
    wire = encode_descriptor(TensorDescriptor(F32, (3, 4), ExtensionLayout(0xF1, 99, b"abc"),
                                              buffers=[BufferHandle(48)]))
    # extension_layout_id u64 then extension_data_length u32
    bad = patch(wire, LAYOUT_FIELDS_AT + 8, "I", length)
    if length == 4:  # one byte more than written: the data fits, it eats the buffer_count
        if mode == "strict":  # the unknown id is reported first
            violation(bad, mode=mode, rule="descriptor.layout.extension_unknown")
        else:  # 0x30 handles (the first byte of byte_size) no longer fit
            violation(bad, mode=mode, rule="descriptor.length.bounds")
    else:
        exc = violation(bad, mode=mode, rule="descriptor.length.bounds")
        assert exc.offset == LAYOUT_FIELDS_AT + 12


# --------------------------------------------------------------------------------------
# Quantization section
# --------------------------------------------------------------------------------------

QUANT = TensorDescriptor(ElementType.INT4, (128, 128), buffers=[BufferHandle(8192), BufferHandle(256)],
                         quantization=PerBlockAffine(1, 128, 1, flags=1, scale_type_tag=ElementType.FLOAT16))
QUANT_WIRE = encode_descriptor(QUANT)
QLEN_AT = LAYOUT_FIELDS_AT + 1 + 2 * 16  # buffer_count then two handles
SCHEME_AT = QLEN_AT + 4


def test_quantized_reference_layout(manifest, conformance_dir):
    golden = (conformance_dir / "descriptors/quant_per_block_int4_128x128.bin").read_bytes()
    assert QUANT_WIRE == golden
    assert struct.unpack_from("<I", golden, QLEN_AT) == (24,) and golden[SCHEME_AT] == 0x03


@pytest.mark.parametrize("tag", [0x00, 0xFF])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_invalid_scheme_tag(tag, mode):
    exc = violation(patch(QUANT_WIRE, SCHEME_AT, "B", tag), mode=mode, rule="quantization.scheme_tag.invalid")
    assert exc.offset == SCHEME_AT


@pytest.mark.parametrize("tag", [0x06, 0x7F, 0xF0, 0xFE])
def test_unknown_scheme_tag_strict_and_permissive(tag):
    wire = patch(QUANT_WIRE, SCHEME_AT, "B", tag)
    assert violation(wire, rule="quantization.scheme_tag.unknown").offset == SCHEME_AT
    back, findings = parse_descriptor(wire, mode="permissive")
    assert isinstance(back.quantization, UnknownQuantization) and back.quantization.scheme_tag == tag
    assert back.quantization.payload == QUANT_WIRE[SCHEME_AT + 4:SCHEME_AT + 24]
    assert [f.rule_id for f in findings] == ["quantization.scheme_tag.unknown"]
    assert back.buffers == QUANT.buffers
    assert encode_descriptor(back) == wire


@pytest.mark.parametrize("version", [2, 255])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_newer_scheme_version(version, mode):
    exc = violation(patch(QUANT_WIRE, SCHEME_AT + 1, "B", version), mode=mode, rule="quantization.scheme_version")
    assert exc.offset == SCHEME_AT + 1


@pytest.mark.parametrize("qlen", [0, 3, 4, 23])
def test_quantization_length_too_small(qlen):
    """The scheme's table does not fit in quantization_length (bytes after it are the
    rest of the descriptor, so quantization_length is shrunk and the descriptor with it)."""
    wire = QUANT_WIRE[:SCHEME_AT] + QUANT_WIRE[SCHEME_AT:SCHEME_AT + qlen]
    wire = with_length(patch(wire, QLEN_AT, "I", qlen))
    exc = violation(wire, rule="quantization.length.bounds")
    assert SCHEME_AT <= exc.offset <= SCHEME_AT + qlen


def test_quantization_length_too_small_inside_a_longer_descriptor():
    wire = patch(QUANT_WIRE, QLEN_AT, "I", 8)  # 16 bytes of the table would be left over
    exc = violation(wire)
    assert exc.rule_id in ("quantization.length.bounds", "descriptor.length.exact")


@pytest.mark.parametrize("qlen", [25, 1000, 2**32 - 1])
@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_quantization_length_too_large(qlen, mode):
    exc = violation(patch(QUANT_WIRE, QLEN_AT, "I", qlen), mode=mode, rule="descriptor.length.bounds")
    assert exc.offset == SCHEME_AT


def test_quantization_padding_within_length_is_kept():
    padded = TensorDescriptor(ElementType.UINT8, (4,), buffers=[BufferHandle(4)],
                              quantization=PerTensorAffine(2.0, 1, padding=b"\0\0\0\0"))
    wire = encode_descriptor(padded)
    assert decode_descriptor(wire) == padded and encode_descriptor(decode_descriptor(wire)) == wire


def test_unknown_scheme_with_too_short_header():
    wire = QUANT_WIRE[:SCHEME_AT] + bytes([0x06, 0x01])
    wire = with_length(patch(wire, QLEN_AT, "I", 2))
    for mode in ("strict", "permissive"):
        violation(wire, mode=mode, rule="quantization.length.bounds")


# --------------------------------------------------------------------------------------
# Layout-specific bounds
# --------------------------------------------------------------------------------------


def _tiled(depth: int) -> TiledLayout:
    level = TiledLayout((1, 1))
    for _ in range(depth - 1):
        level = TiledLayout((1, 1), inner_layout=0x04, inner=level)
    return level


@pytest.mark.parametrize("mode", ["strict", "permissive"])
def test_tiled_nesting_depth_9(mode):
    deep = TensorDescriptor(F32, (2, 2), _tiled(9), buffers=[BufferHandle(16)])
    wire = encode_descriptor(deep)
    exc = violation(wire, mode=mode, rule="descriptor.tiled.depth")
    level_size = 2 * 8 + 4  # tile_shape (rank 2) + outer/inner layout + reserved
    assert exc.offset == LAYOUT_FIELDS_AT + 8 * level_size


def test_tiled_nesting_without_end_is_bounded():
    """inner_layout 0x04 at every level and no bytes left: bounded, never recursing on."""
    level = struct.pack("<QQBBH", 1, 1, 0x01, 0x04, 0)
    wire = with_length(ROW_MAJOR_WIRE[:15] + b"\x04" + ROW_MAJOR_WIRE[16:LAYOUT_FIELDS_AT] + level * 3)
    violation(wire, rule="descriptor.length.bounds")


def test_buffer_count_255_with_short_descriptor():
    wire = patch(ROW_MAJOR_WIRE, LAYOUT_FIELDS_AT, "B", 255)
    exc = violation(wire, rule="descriptor.length.bounds")
    assert exc.offset == LAYOUT_FIELDS_AT + 1


@pytest.mark.parametrize("section_flag", [0x01, 0x02, 0x04, 0x08, 0x10])
def test_flagged_section_missing(section_flag):
    wire = patch(ROW_MAJOR_WIRE, 10, "I", section_flag)
    exc = violation(wire)
    assert exc.rule_id in ("descriptor.length.bounds", "descriptor.type_tag.unknown")
    assert exc.rule_id == "descriptor.length.bounds"
    assert exc.offset == len(ROW_MAJOR_WIRE)


def test_csr_nnz_is_not_allocated_for():
    desc = TensorDescriptor(F32, (3, 3), CsrLayout(2**64 - 1), buffers=[BufferHandle(0)] * 3)
    back, _ = parse_descriptor(encode_descriptor(desc))  # structure only: nothing sized by nnz
    assert back.layout.nnz == 2**64 - 1
    violation(encode_descriptor(desc))  # the semantic rules then compare nnz with the buffers


@pytest.mark.parametrize("extra", [1, 7, 100])
def test_trailing_garbage_inside_descriptor_length(extra):
    wire = with_length(ROW_MAJOR_WIRE + b"\xAB" * extra)
    exc = violation(wire, rule="descriptor.length.exact")
    assert exc.offset == len(ROW_MAJOR_WIRE)
    violation(wire, mode="permissive", rule="descriptor.length.exact")


def test_trailing_bytes_after_descriptor_length_are_not_read():
    assert decode_descriptor(ROW_MAJOR_WIRE + b"\xAB" * 9) == ROW_MAJOR_F32


# --------------------------------------------------------------------------------------
# Newer minor versions: strict rejects, permissive keeps (and re-encodes exactly)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("minor", [1, 7, 255])
def test_newer_minor_version(minor):
    wire = patch(ROW_MAJOR_WIRE, 5, "B", minor)
    assert violation(wire, rule="descriptor.version_minor").offset == 5
    back, findings = parse_descriptor(wire, mode="permissive")
    assert back.version_minor == minor and back.shape == (3, 4) and back.buffers == ROW_MAJOR_F32.buffers
    assert [f.rule_id for f in findings] == ["descriptor.version_minor"]
    assert encode_descriptor(back) == wire


def test_newer_minor_version_with_new_flag_and_trailing_fields():
    wire = with_length(patch(patch(ROW_MAJOR_WIRE, 5, "B", 3), 10, "I", 1 << 7) + b"future-section")
    back = decode_descriptor(wire, mode="permissive")
    assert back.unparsed_flags == 1 << 7 and back.trailing == b"future-section"
    assert encode_descriptor(back) == wire
    violation(wire, rule="descriptor.version_minor")


def test_newer_minor_version_with_known_sections():
    desc = TensorDescriptor(F32, (3, 4), buffers=[BufferHandle(48)], shard=Shard((6, 4), (3, 0)),
                            statistics=Statistics(1, nnz=3))
    wire = with_length(patch(encode_descriptor(desc), 5, "B", 1) + b"\x01\x02")
    back = decode_descriptor(wire, mode="permissive")
    assert back.shard == desc.shard and back.statistics == desc.statistics and back.trailing == b"\x01\x02"
    assert encode_descriptor(back) == wire


def test_permissive_combination_of_unknowns_reencodes():
    desc = TensorDescriptor(0xF4, (3, 4), buffers=[BufferHandle(48)],
                            quantization=UnknownQuantization(0xF2, 9, 0x8001, b"opaque payload"))
    wire = patch(encode_descriptor(desc), 5, "B", 2)
    back, findings = parse_descriptor(wire, mode="permissive")
    assert {f.rule_id for f in findings} == {
        "descriptor.version_minor", "descriptor.type_tag.unknown", "quantization.scheme_tag.unknown"}
    assert back.quantization == desc.quantization and encode_descriptor(back) == wire
    violation(wire)


def test_composite_head_with_buffers_is_structurally_readable():
    """buffer_count on a head is a semantic matter (layouts/composite.md); the structure decodes."""
    desc = TensorDescriptor(F32, (8, 8), CompositeLayout(1, 2), buffers=[BufferHandle(4)])
    assert parse_descriptor(encode_descriptor(desc))[0] == desc
    violation(encode_descriptor(desc))  # ...and the semantic rules reject it


# --------------------------------------------------------------------------------------
# Every single-byte corruption of every golden vector
# --------------------------------------------------------------------------------------


def test_every_byte_of_every_golden_vector_corrupted(manifest, conformance_dir):
    for entry in manifest["descriptors"]:
        data = (conformance_dir / entry["file"]).read_bytes()
        for pos in range(len(data)):
            for value in {0x00, 0xFF, data[pos] ^ 0x01, 0x80}:
                bad = bytearray(data)
                bad[pos] = value
                bad = bytes(bad)
                for mode in ("strict", "permissive"):
                    try:
                        back = decode_descriptor(bad, mode=mode)
                    except SpecViolation as exc:
                        assert exc.offset is None or 0 <= exc.offset <= len(bad), (entry["file"], pos)
                        continue
                    length = struct.unpack_from("<I", bad, 6)[0]
                    assert encode_descriptor(back) == bad[:length], (entry["file"], pos, value)


# --------------------------------------------------------------------------------------
# Every structural rule has a firing input
# --------------------------------------------------------------------------------------

FIRING = {
    "descriptor.truncated": lambda: ROW_MAJOR_WIRE[:30],
    "descriptor.magic": lambda: b"XRRY" + ROW_MAJOR_WIRE[4:],
    "descriptor.version_major": lambda: patch(ROW_MAJOR_WIRE, 4, "B", 2),
    "descriptor.version_minor": lambda: patch(ROW_MAJOR_WIRE, 5, "B", 1),
    "descriptor.length.minimum": lambda: patch(ROW_MAJOR_WIRE, 6, "I", 19),
    "descriptor.length.bounds": lambda: patch(ROW_MAJOR_WIRE, LAYOUT_FIELDS_AT, "B", 2),
    "descriptor.length.exact": lambda: with_length(ROW_MAJOR_WIRE + b"\0"),
    "descriptor.flags.reserved": lambda: patch(ROW_MAJOR_WIRE, 10, "I", 1 << 31),
    "descriptor.rank.cap": lambda: patch(ROW_MAJOR_WIRE, 16, "I", 65),
    "descriptor.type_tag.invalid": lambda: patch(ROW_MAJOR_WIRE, 14, "B", 0),
    "descriptor.type_tag.unknown": lambda: patch(ROW_MAJOR_WIRE, 14, "B", 0x47),
    "descriptor.layout_tag.invalid": lambda: patch(ROW_MAJOR_WIRE, 15, "B", 0xFF),
    "descriptor.layout_tag.unknown": lambda: patch(ROW_MAJOR_WIRE, 15, "B", 0x0C),
    "descriptor.layout.extension_unknown": lambda: encode_descriptor(
        TensorDescriptor(F32, (3, 4), ExtensionLayout(0xF0, 1), buffers=[BufferHandle(48)])),
    "descriptor.tiled.depth": lambda: encode_descriptor(TensorDescriptor(F32, (2, 2), _tiled(9),
                                                                         buffers=[BufferHandle(16)])),
    "quantization.scheme_tag.invalid": lambda: patch(QUANT_WIRE, SCHEME_AT, "B", 0),
    "quantization.scheme_tag.unknown": lambda: patch(QUANT_WIRE, SCHEME_AT, "B", 0x06),
    "quantization.scheme_version": lambda: patch(QUANT_WIRE, SCHEME_AT + 1, "B", 2),
    "quantization.length.bounds": lambda: with_length(patch(QUANT_WIRE[:SCHEME_AT + 8], QLEN_AT, "I", 8)),
}


def test_every_structure_rule_has_a_firing_input():
    declared = {rule.id for rule in vars(structure).values() if hasattr(rule, "violation") and hasattr(rule, "id")}
    assert declared == set(FIRING)


@pytest.mark.parametrize("rule_id", sorted(FIRING))
def test_structure_rule_fires(rule_id):
    exc = violation(FIRING[rule_id](), rule=rule_id)
    assert exc.citation == get_rule(rule_id).citation
    assert exc.offset is not None
