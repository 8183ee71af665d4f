"""Every container rule: a clean container that passes it and a broken one that fires it.

Clean files come from pyhurray (``hurray.save``) so that the baseline is not produced by
the code under test; broken ones are byte patches whose offsets come from the spec
tables written out here as literal ``struct`` formats (``file-format.md``,
``interchange.md``), with the CRC-32C recomputed by the ``crc32c`` package.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from hurray_schema.errors import SpecViolation
from hurray_schema.io import Composite, Tensor, read_file, read_stream, write_file, write_stream
from hurray_schema.io.walk.kv import decode_kv
from hurray_schema.rules.container import CONTAINER_RULES
from hurray_schema.rules.engine import Level

hurray = pytest.importorskip("hurray")
f32 = hurray.float32

HEADER = "<8sBB2sIIQQ28s"  # file-format.md § File Header
TRAILER = "<QQQII4s4s"  # file-format.md § Trailer
ENTRY = "<QIQQI"  # file-format.md § Index Encoding, after the name
MSG = "<III"  # interchange.md § Message Framing


# --------------------------------------------------------------------------------------
# A clean reference file and helpers to take it apart / put it back together
# --------------------------------------------------------------------------------------


def reference_items() -> dict:
    a = hurray.Tensor(bytes(range(128)), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    return {
        "w": hurray.Tensor(struct.pack("<4f", 1, 2, 3, 4), f32, [2, 2]),
        "big": hurray.Tensor(bytes(i % 256 for i in range(8192)), hurray.uint8, [8192]),
        "p": hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b]),
    }


KV = {"producer": "test", "n": 3}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("clean") / "ref.hrry"
    hurray.save(str(path), reference_items(), kv=KV)
    return path.read_bytes()


class Parts:
    """A file split into region, KV, index entries and trailer (parsed with literal formats)."""

    def __init__(self, raw: bytes):
        self.raw = raw
        self.header = list(struct.unpack_from(HEADER, raw, 0))
        io_, il, ko, kl, crc, rsv, magic = struct.unpack_from(TRAILER, raw, len(raw) - 40)
        self.index_offset, self.kv_offset, self.kv_length = io_, ko, kl
        self.region = raw[: ko if kl else io_]
        self.kv = raw[ko : ko + kl] if kl else b""
        idx = raw[io_ : io_ + il]
        (count,) = struct.unpack_from("<Q", idx, 0)
        pos, self.entries = 8, []
        for _ in range(count):
            (n,) = struct.unpack_from("<H", idx, pos)
            name = idx[pos + 2 : pos + 2 + n]
            pos += 2 + n
            self.entries.append([name, *struct.unpack_from(ENTRY, idx, pos)])
            pos += 32

    def entry(self, name: bytes) -> list:
        return next(e for e in self.entries if e[0] == name)

    def index_bytes(self, count=None) -> bytes:
        out = struct.pack("<Q", len(self.entries) if count is None else count)
        for name, *fields in self.entries:
            out += struct.pack("<H", len(name)) + name + struct.pack(ENTRY, *fields)
        return out

    def build(self, *, index: bytes = None, kv: bytes = None, region: bytes = None, crc=None,
              trailer_patch=None) -> bytes:
        region = self.region if region is None else region
        kv = self.kv if kv is None else kv
        index = self.index_bytes() if index is None else index
        header = struct.pack(HEADER, *self.header)
        out = bytearray(header + region[64:])
        ko = 0
        if kv:
            out += bytes(-len(out) % 8)
            ko = len(out)
            out += kv
        out += bytes(-len(out) % 8)
        io_ = len(out)
        out += index
        fields = [io_, len(index), ko, len(kv), crc32c.crc32c(index) if crc is None else crc, b"\0" * 4, b"HRRY"]
        if trailer_patch:
            trailer_patch(fields)
        out += struct.pack(TRAILER, *fields)
        return bytes(out)


def write(tmp_path, raw: bytes, name="f.hrry"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def fires(tmp_path, raw: bytes, rule_id: str, mode="strict") -> SpecViolation:
    with pytest.raises(SpecViolation) as info:
        read_file(write(tmp_path, raw), mode=mode).close()
    assert info.value.rule_id == rule_id, info.value
    return info.value


def patch(raw: bytes, offset: int, data: bytes) -> bytes:
    return raw[:offset] + data + raw[offset + len(data) :]


# --------------------------------------------------------------------------------------
# Passing: the clean files (pyhurray's and ours) raise nothing
# --------------------------------------------------------------------------------------


def test_clean_reference_file_passes_every_rule(tmp_path, clean):
    with read_file(write(tmp_path, clean)) as f:
        assert list(f) == ["w", "big", "p"]
        assert [x.rule_id for x in f.findings] == ["file.kv.flag"]  # SHOULD-level note only
        assert f.kv == KV


def test_clean_own_file_passes_every_rule(tmp_path, clean):
    with read_file(write(tmp_path, clean)) as f:
        path = tmp_path / "ours.hrry"
        write_file(path, f, metadata=f.kv, sorted_index=True)
    with read_file(path) as g:
        assert list(g) == ["big", "p", "w"] and g.findings == []  # kv.flag passes too


# --------------------------------------------------------------------------------------
# Firing: header and trailer
# --------------------------------------------------------------------------------------


def test_file_size(tmp_path, clean):
    fires(tmp_path, clean[:50], "file.size")


def test_file_magic(tmp_path, clean):
    assert fires(tmp_path, patch(clean, 0, b"XRRYFILE"), "file.header.magic").offset == 0


def test_file_version(tmp_path, clean):
    assert fires(tmp_path, patch(clean, 8, b"\x02"), "file.header.version").offset == 8
    with read_file(write(tmp_path, patch(clean, 9, b"\x07"))):  # a newer minor is fine
        pass


@pytest.mark.parametrize("offset", [10, 11, 36, 63])
def test_file_header_reserved(tmp_path, clean, offset):
    fires(tmp_path, patch(clean, offset, b"\x01"), "file.header.reserved")


def test_file_flags_reserved(tmp_path, clean):
    assert fires(tmp_path, patch(clean, 12, struct.pack("<I", 4 | 8)), "file.flags.reserved").offset == 12


@pytest.mark.parametrize("value", [2048, 4097, 6144, 4 * 1024 * 1024])
def test_file_alignment(tmp_path, clean, value):
    assert fires(tmp_path, patch(clean, 16, struct.pack("<I", value)), "file.header.alignment").offset == 16


@pytest.mark.parametrize("value", [0, 56, 68, 1 << 40])
def test_first_descriptor_offset(tmp_path, clean, value):
    v = fires(tmp_path, patch(clean, 20, struct.pack("<Q", value)), "file.header.first_descriptor_offset")
    assert v.offset == 20


def test_trailer_magic(tmp_path, clean):
    assert fires(tmp_path, clean[:-1] + b"X", "file.trailer.magic").offset == len(clean) - 4
    fires(tmp_path, clean[:-300], "file.trailer.magic")  # a truncated file


def test_trailer_reserved(tmp_path, clean):
    fires(tmp_path, patch(clean, len(clean) - 8, b"\x01"), "file.trailer.reserved")


# --------------------------------------------------------------------------------------
# Firing: index
# --------------------------------------------------------------------------------------


def test_index_bounds(tmp_path, clean):
    n = len(clean)
    v = fires(tmp_path, patch(clean, n - 40, struct.pack("<Q", n - 40)), "file.index.bounds")
    assert v.offset == n - 40
    io_, il = struct.unpack_from("<QQ", clean, n - 40)
    fires(tmp_path, patch(clean, n - 32, struct.pack("<Q", il + 1)), "file.index.bounds")
    fires(tmp_path, patch(clean, n - 40, struct.pack("<Q", 8)), "file.index.bounds")


def test_index_alignment(tmp_path, clean):
    n = len(clean)
    io_, il = struct.unpack_from("<QQ", clean, n - 40)
    fires(tmp_path, patch(clean, n - 40, struct.pack("<QQ", io_ + 1, il - 1)), "file.index.alignment")


def test_index_crc(tmp_path, clean):
    n = len(clean)
    io_ = struct.unpack_from("<Q", clean, n - 40)[0]
    bad = patch(clean, io_ + 10, bytes([clean[io_ + 10] ^ 0x20]))  # first name byte
    assert fires(tmp_path, bad, "file.index.crc").offset == n - 12


def test_index_crc_unset(tmp_path, clean):
    flags = struct.unpack_from("<I", clean, 12)[0]
    fires(tmp_path, patch(clean, 12, struct.pack("<I", flags & ~4)), "file.index.crc_unset")
    # with the flag clear and a zero CRC, no check is made
    p = Parts(clean)
    p.header[4] &= ~4
    with read_file(write(tmp_path, p.build(crc=0))) as f:
        assert "w" in f


def test_index_truncated(tmp_path, clean):
    p = Parts(clean)
    fires(tmp_path, p.build(index=p.index_bytes(count=len(p.entries) + 1)), "file.index.truncated")
    fires(tmp_path, p.build(index=p.index_bytes() + bytes(8)), "file.index.truncated")
    fires(tmp_path, p.build(index=p.index_bytes(count=1 << 60)), "file.index.truncated")


@pytest.mark.parametrize("name", [b"", b"\xff\xfe"])
def test_index_name(tmp_path, clean, name):
    p = Parts(clean)
    p.entry(b"w")[0] = name
    fires(tmp_path, p.build(), "file.index.name")


def test_index_duplicate(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"big")[0] = b"w"
    fires(tmp_path, p.build(), "file.index.duplicate")


def test_index_flags(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"w")[5] = 1
    fires(tmp_path, p.build(), "file.index.flags")


def test_index_sorted(tmp_path, clean):
    flags = struct.unpack_from("<I", clean, 12)[0]
    fires(tmp_path, patch(clean, 12, struct.pack("<I", flags | 2)), "file.index.sorted")
    p = Parts(clean)
    p.entries.sort(key=lambda e: e[0])
    p.header[4] |= 2
    with read_file(write(tmp_path, p.build())) as f:  # really sorted: accepted, same mapping
        assert set(f) == {"w", "big", "p"}


def test_index_descriptor_length(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"big")[2] += 8
    fires(tmp_path, p.build(), "file.index.descriptor_length")


def test_index_descriptor_bounds(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"w")[1] = p.kv_offset  # inside the KV section, past the tensor region
    fires(tmp_path, p.build(), "file.index.descriptor_bounds")
    p = Parts(clean)
    p.entry(b"w")[1] = 0
    fires(tmp_path, p.build(), "file.index.descriptor_bounds")


def test_index_overlap(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"p.1")[1] = p.entry(b"p.0")[1]
    fires(tmp_path, p.build(), "file.index.overlap")


def test_descriptor_alignment(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"big")[1] += 4
    fires(tmp_path, p.build(), "file.descriptor.alignment")


def test_data_alignment(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"big")[3] += 8
    fires(tmp_path, p.build(), "file.data.alignment")


def test_data_length(tmp_path, clean):
    p = Parts(clean)
    p.entry(b"big")[4] += 1
    fires(tmp_path, p.build(), "file.data.length")
    p = Parts(clean)
    p.entry(b"p")[4] = 8  # a head has no data
    fires(tmp_path, p.build(), "file.data.length")


def test_data_bounds_truncated_buffer(tmp_path, clean):
    p = Parts(clean)
    big = p.entry(b"big")
    p.entries = [e for e in p.entries if e[0] in (b"w", b"big")]
    region = p.region[: big[3] + 100]  # the 8192-byte buffer is cut after 100 bytes
    fires(tmp_path, p.build(region=region, kv=b""), "file.data.bounds")


# --------------------------------------------------------------------------------------
# Firing: KV
# --------------------------------------------------------------------------------------


def kv_entry(key: bytes, tag: int, payload: bytes) -> bytes:
    return struct.pack("<H", len(key)) + key + bytes([tag]) + payload


def kv_section(*entries: bytes) -> bytes:
    return struct.pack("<I", len(entries)) + b"".join(entries)


def test_kv_flag_is_a_should_level_note(tmp_path, clean):
    with read_file(write(tmp_path, clean)) as f:
        (note,) = f.findings
        assert note.rule_id == "file.kv.flag" and note.level is Level.SHOULD and not note.is_error
    flags = struct.unpack_from("<I", clean, 12)[0]
    p = Parts(clean)
    p.header[4] = flags | 1
    with read_file(write(tmp_path, p.build())) as f:
        assert f.findings == []


def test_kv_bounds(tmp_path, clean):
    n = len(clean)
    ko = struct.unpack_from("<Q", clean, n - 24)[0]
    fires(tmp_path, patch(clean, n - 24, struct.pack("<Q", ko + 4)), "file.kv.bounds")
    io_ = struct.unpack_from("<Q", clean, n - 40)[0]
    fires(tmp_path, patch(clean, n - 24, struct.pack("<Q", io_)), "file.kv.bounds")


def test_kv_truncated(tmp_path, clean):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=p.kv[:-1]), "file.kv.truncated")
    fires(tmp_path, p.build(kv=p.kv + bytes(8)), "file.kv.truncated")
    fires(tmp_path, p.build(kv=struct.pack("<I", 1 << 30) + p.kv[4:]), "file.kv.truncated")


@pytest.mark.parametrize("key", [b"", b"\xc3"])
def test_kv_key(tmp_path, clean, key):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=kv_section(kv_entry(key, 0x02, bytes(8)))), "file.kv.key")


def test_kv_duplicate(tmp_path, clean):
    p = Parts(clean)
    e = kv_entry(b"k", 0x02, bytes(8))
    fires(tmp_path, p.build(kv=kv_section(e, e)), "file.kv.duplicate")
    # byte-exact comparison: "k" and "K" are different keys
    with read_file(write(tmp_path, p.build(kv=kv_section(e, kv_entry(b"K", 0x02, bytes(8)))))) as f:
        assert f.kv == {"k": 0, "K": 0}


@pytest.mark.parametrize("tag", [0x00, 0x08, 0xEF, 0xF0, 0xFE, 0xFF])
def test_kv_value_tag(tmp_path, clean, tag):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=kv_section(kv_entry(b"k", tag, bytes(8)))), "file.kv.value_tag")


@pytest.mark.parametrize("byte", [0x02, 0xFF])
def test_kv_bool(tmp_path, clean, byte):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=kv_section(kv_entry(b"k", 0x05, bytes([byte])))), "file.kv.bool")
    arr = struct.pack("<BI", 0x05, 2) + bytes([1, byte])
    fires(tmp_path, p.build(kv=kv_section(kv_entry(b"k", 0x07, arr))), "file.kv.bool")


@pytest.mark.parametrize("etag", [0x00, 0x07, 0x08])
def test_kv_array_tag(tmp_path, clean, etag):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=kv_section(kv_entry(b"k", 0x07, struct.pack("<BI", etag, 0)))), "file.kv.array_tag")


def test_kv_string(tmp_path, clean):
    p = Parts(clean)
    fires(tmp_path, p.build(kv=kv_section(kv_entry(b"k", 0x01, struct.pack("<I", 2) + b"\xc3\x28"))), "file.kv.string")


def test_kv_every_type_decodes_from_literal_bytes():
    sec = kv_section(
        kv_entry(b"s", 0x01, struct.pack("<I", 2) + b"hi"), kv_entry(b"i", 0x02, struct.pack("<q", -3)),
        kv_entry(b"u", 0x03, struct.pack("<Q", 2 ** 64 - 1)), kv_entry(b"f", 0x04, struct.pack("<d", 0.5)),
        kv_entry(b"b", 0x05, b"\x01"), kv_entry(b"y", 0x06, struct.pack("<I", 1) + b"\x00"),
        kv_entry(b"a", 0x07, struct.pack("<BI", 0x03, 2) + struct.pack("<QQ", 1, 2)),
        kv_entry(b"e", 0x07, struct.pack("<BI", 0x01, 0)),
    )
    assert decode_kv(sec) == {"s": "hi", "i": -3, "u": 2 ** 64 - 1, "f": 0.5, "b": True, "y": b"\x00",
                              "a": [1, 2], "e": []}


# --------------------------------------------------------------------------------------
# Firing: composites in files
# --------------------------------------------------------------------------------------


def _bump_member_count(raw: bytes, head_offset: int, new: int) -> bytes:
    # composite head (rank 2): fixed header 20, shape 16, byte_offset 8, then rule, op, 2 reserved, count
    return patch(raw, head_offset + 20 + 16 + 8 + 4, struct.pack("<I", new))


def test_file_composite_torn(tmp_path, clean):
    p = Parts(clean)
    head = p.entry(b"p")[1]
    bad = _bump_member_count(clean, head, 3)  # 2 members follow, 3 promised: runs past the end
    v = fires(tmp_path, bad, "composite.torn")
    assert "2 of 3 members" in v.message and v.offset == head  # located at the torn composite's head
    with read_file(write(tmp_path, bad), mode="permissive") as f:
        assert "p" not in f  # never the composite ...
        assert isinstance(f["p.0"], Tensor) and isinstance(f["p.1"], Tensor)  # ... its members, plain
        assert [x.rule_id for x in f.findings if x.tolerated] == ["composite.torn"]


def test_nesting_depth(tmp_path):
    def nest(levels: int):
        item = Tensor.dense(0x03, [1], bytes(4))
        for _ in range(levels):
            item = Composite.build("group", [item], shape=[1], type_tag=0x03)
        return item

    write_file(tmp_path / "ok.hrry", {"x": nest(8)})
    with read_file(tmp_path / "ok.hrry") as f:
        assert isinstance(f["x"], Composite)
    write_file(tmp_path / "deep.hrry", {"x": nest(9)}, validate=False)
    with pytest.raises(SpecViolation) as info:
        read_file(tmp_path / "deep.hrry")
    assert info.value.rule_id == "composite.nesting.depth"
    assert len(list(read_stream(write_stream(None, [nest(8)])))) == 1
    with pytest.raises(SpecViolation) as info:
        list(read_stream(write_stream(None, [nest(9)], validate=False)))
    assert info.value.rule_id == "composite.nesting.depth"


# --------------------------------------------------------------------------------------
# Streams: bare framing
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare() -> bytes:
    items = reference_items()
    with hurray.StreamWriter() as w:
        w.write(items["w"])
        w.write_composite(items["p"])
    return w.getvalue()


def test_clean_bare_stream_passes(bare):
    r = read_stream(bare)
    items = list(r)
    assert [type(i) for i in items] == [Tensor, Composite] and r.findings == []


def test_stream_truncated(bare):
    w_len = 61 + 16
    for cut in (w_len + 5, w_len + 40, len(bare) - 1, 10):
        with pytest.raises(SpecViolation) as info:
            list(read_stream(bare[:cut]))
        assert info.value.rule_id == "stream.truncated"
        assert info.value.offset == cut


def test_stream_composite_torn(bare):
    w_len, head_len, member = 61 + 16, 53, 93 + 128
    cut = bare[: w_len + head_len + member]
    with pytest.raises(SpecViolation) as info:
        list(read_stream(cut))
    assert info.value.rule_id == "composite.torn" and info.value.offset == w_len  # the torn composite's head
    r = read_stream(cut, mode="permissive")
    items = list(r)
    assert [type(i) for i in items] == [Tensor, Tensor]  # w, then the arrived member as a plain tensor
    assert [f.rule_id for f in r.findings] == ["composite.torn"]
    # a head with nothing after it
    r = read_stream(bare[: w_len + head_len], mode="permissive")
    assert [type(i) for i in r] == [Tensor]


# --------------------------------------------------------------------------------------
# Streams: message framing
# --------------------------------------------------------------------------------------

DESC = bytes.fromhex("4852525901003d000000000000000301020000000300000000000000"
                     "040000000000000000000000000000000130000000000000004000000000000000")  # f32 [3,4], 48 bytes
DATA = bytes(range(48))


def msg(kind: int, payload: bytes = b"", sid: int = 1) -> bytes:
    return struct.pack(MSG, kind, sid, len(payload)) + payload


def tensor_msgs(desc=DESC, data=DATA, total=None, shards=(0, 1), frames=None) -> bytes:
    total = len(data) if total is None else total
    out = msg(4, desc + struct.pack("<QII", total, *shards))
    for off, chunk in (frames if frames is not None else [(0, data)]):
        out += msg(5, struct.pack("<Q", off) + chunk)
    return out + msg(6)


def read_msgs(data: bytes, **kw):
    return list(read_stream(data, framing="messages", **kw))


def msg_fires(data: bytes, rule_id: str, **kw) -> SpecViolation:
    with pytest.raises(SpecViolation) as info:
        read_msgs(data, **kw)
    assert info.value.rule_id == rule_id, info.value
    return info.value


def test_clean_message_stream_passes():
    (t,) = read_msgs(tensor_msgs(frames=[(0, DATA[:20]), (20, DATA[20:])]))
    assert bytes(t.buffers[0]) == DATA
    (t,) = read_msgs(msg(10, b"ping") + tensor_msgs() + msg(11))  # PING / PONG are skipped
    assert bytes(t.buffers[0]) == DATA
    assert read_msgs(b"") == []


def test_message_type():
    for kind in (0x0E, 0x20, 0xEF, 0xFF, 0x100):
        msg_fires(msg(kind) + tensor_msgs(), "stream.message.type")


def test_private_message_type_without_agreement():
    """``interchange.md § Message Types``: 0xF0-0xFE are private, never sent unagreed."""
    for kind in (0xF0, 0xF7, 0xFE):
        assert msg_fires(msg(kind) + tensor_msgs(), "session.message.private").offset == 0


def test_message_stream_id():
    assert msg_fires(msg(4, b"", sid=0), "stream.message.stream_id").offset == 4


def test_message_truncated():
    good = tensor_msgs()
    msg_fires(good[:5], "stream.message.truncated")
    msg_fires(good[:30], "stream.message.truncated")


def test_stream_truncated_messages():
    good = tensor_msgs()
    msg_fires(good[:-12], "stream.truncated")  # TENSOR_DATA_END never arrives


def test_message_order():
    msg_fires(msg(5, struct.pack("<Q", 0) + DATA) + msg(6), "stream.message.order")
    msg_fires(msg(6), "stream.message.order")
    d = msg(4, DESC + struct.pack("<QII", 48, 0, 1))
    msg_fires(d + d, "stream.message.order")
    msg_fires(msg(1, bytes(16)), "stream.message.order")


def test_descriptor_payload():
    msg_fires(msg(4, DESC + struct.pack("<QII", 48, 0, 1) + b"\0"), "stream.descriptor.payload")
    msg_fires(msg(4, DESC[:30]), "stream.descriptor.payload")
    msg_fires(msg(4, DESC + b"\0" * 4), "stream.descriptor.payload")


def test_descriptor_shards():
    msg_fires(tensor_msgs(shards=(0, 0)), "stream.descriptor.shards")
    msg_fires(tensor_msgs(shards=(1, 1)), "stream.descriptor.shards")
    (t,) = read_msgs(tensor_msgs(shards=(2, 4)))


def test_total_data_bytes():
    msg_fires(tensor_msgs(total=49), "stream.data.total_bytes")


def test_data_frame():
    msg_fires(tensor_msgs(frames=[(0, DATA[:20]), (24, DATA[20:])]), "stream.data.frame")  # gap
    msg_fires(tensor_msgs(frames=[(0, DATA[:20]), (10, DATA[10:])]), "stream.data.frame")  # overlap
    msg_fires(tensor_msgs(frames=[(0, DATA + b"x")]), "stream.data.frame")  # overrun
    msg_fires(msg(4, DESC + struct.pack("<QII", 48, 0, 1)) + msg(5, b"\0" * 4), "stream.data.frame")


def test_data_sum():
    msg_fires(tensor_msgs(frames=[(0, DATA[:20])]), "stream.data.sum")


def test_data_end_payload():
    data = tensor_msgs()[:-12] + msg(6, b"\0")
    msg_fires(data, "stream.data_end.payload")


def test_cross_machine_sync_mode():
    sync1 = DESC[:57] + b"\x01\x01" + DESC[59:]  # a CUDA buffer (device_tag 0x01) with sync_mode EVENT
    pytest.importorskip("hurray")
    read_msgs(tensor_msgs(), cross_machine=True)  # producer-synced passes
    read_msgs(tensor_msgs(desc=sync1))  # same-machine: sync_mode 1 is legal
    msg_fires(tensor_msgs(desc=sync1), "stream.sync_mode.cross_machine", cross_machine=True)


def test_message_stream_composite_torn():
    head = bytes.fromhex(  # partition head [8,8] f32, 2 members (conformance composite_head_partition.bin)
        "485252590100350000000000000003" "0b" "02000000" "0800000000000000" "0800000000000000"
        "0000000000000000" "01000000" "02000000" "00")
    stream = msg(4, head + struct.pack("<QII", 0, 0, 1)) + msg(6)
    v = msg_fires(stream, "composite.torn")
    assert v.offset == 12  # the head descriptor, after its 12-byte message header
    r = read_stream(stream, framing="messages", mode="permissive")
    assert list(r) == [] and r.findings[0].rule_id == "composite.torn"


# --------------------------------------------------------------------------------------
# Coverage: every container rule is exercised above
# --------------------------------------------------------------------------------------

FIRED_ABOVE = {
    "file.size", "file.header.magic", "file.header.version", "file.header.reserved", "file.flags.reserved",
    "file.header.alignment", "file.header.first_descriptor_offset", "file.trailer.magic", "file.trailer.reserved",
    "file.index.bounds", "file.index.alignment", "file.index.crc", "file.index.crc_unset", "file.index.truncated",
    "file.index.name", "file.index.duplicate", "file.index.flags", "file.index.sorted",
    "file.index.descriptor_length", "file.index.descriptor_bounds", "file.index.overlap",
    "file.descriptor.alignment", "file.data.alignment", "file.data.length", "file.data.bounds", "file.kv.flag",
    "file.kv.bounds", "file.kv.truncated", "file.kv.key", "file.kv.duplicate", "file.kv.value_tag", "file.kv.bool",
    "file.kv.array_tag", "file.kv.string", "stream.truncated", "stream.message.type", "stream.message.stream_id", "stream.message.truncated",
    "stream.message.order", "stream.descriptor.payload", "stream.descriptor.shards", "stream.data.total_bytes",
    "stream.data.frame", "stream.data.sum", "stream.data_end.payload", "stream.sync_mode.cross_machine",
}


def test_every_container_rule_has_a_firing_test():
    assert {r.id for r in CONTAINER_RULES} == FIRED_ABOVE
