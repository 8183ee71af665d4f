"""What a file reader checks at open and what on a tensor's first read (``io/file/index.py``).

A fault deep in a large file gives one rule and one offset whichever entry point meets it: the
tensor's first read, ``hs.load``, the reader's ``findings``, and ``audit``.  The byte offsets
expected here come from the spec's tables written out with ``struct`` (``file-format.md § Index
Encoding``, ``metadata.md`` for the descriptor), not from the code under test.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import SpecViolation

COUNT = 10_000
DEEP = 7_000
FIXED_HEADER = 20  # magic 4, version 1 + 1, descriptor_length 4, flags 4, type_tag 1, layout_tag 1, rank 4
DIM = 8  # each shape entry is a uint64
BYTE_OFFSET = 8  # the uint64 after the shape
BUFFER_COUNT = 1  # the uint8 before the buffer handles
HANDLE_RESERVED = 8 + 4 + 1 + 1 + 1  # byte_size, alignment, device_tag, sync_mode, memory_class, then _reserved
TRAILER = 40
ENTRY_FIXED = "<QIQQI"  # descriptor_offset, descriptor_length, data_offset, data_length, flags


def name(i: int) -> str:
    return f"t{i:05d}"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    path = tmp_path_factory.mktemp("open") / "many.hrry"
    hs.save(path, {name(i): np.full(4, i, np.int32) for i in range(COUNT)})
    return path.read_bytes()


def index_entries(raw: bytes) -> dict[str, tuple]:
    """name -> (entry offset, descriptor_offset, descriptor_length, data_offset, data_length, flags)."""
    index_at, _ = struct.unpack_from("<QQ", raw, len(raw) - TRAILER)
    (count,) = struct.unpack_from("<Q", raw, index_at)
    pos, entries = index_at + 8, {}
    for _ in range(count):
        at = pos
        (n,) = struct.unpack_from("<H", raw, pos)
        key = raw[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        entries[key] = (at, *struct.unpack_from(ENTRY_FIXED, raw, pos))
        pos += struct.calcsize(ENTRY_FIXED)
    return entries


def with_crc(raw: bytes) -> bytes:
    """The index CRC recomputed (a patch inside the index is then only the fault it means)."""
    import crc32c

    index_at, index_length = struct.unpack_from("<QQ", raw, len(raw) - TRAILER)
    crc = crc32c.crc32c(raw[index_at : index_at + index_length])
    at = len(raw) - TRAILER + 8 + 8 + 8 + 4
    return raw[:at] + struct.pack("<I", crc) + raw[at + 4 :]


def test_a_reserved_byte_deep_in_a_large_file_raises_on_first_read_with_audits_rule_and_offset(tmp_path, clean):
    descriptor = index_entries(clean)[name(DEEP)][1]
    fault = descriptor + FIXED_HEADER + 1 * DIM + BYTE_OFFSET + BUFFER_COUNT + HANDLE_RESERVED  # rank 1: one dimension
    bad = clean[:fault] + b"\x01" + clean[fault + 1 :]
    path = tmp_path / "deep.hrry"
    path.write_bytes(bad)

    audited = [(f.rule_id, f.offset) for f in hs.audit(path).findings if f.is_error]
    assert audited == [("buffer.reserved", fault)]

    with hs.read_file(path) as f:  # the whole-file structure holds: open succeeds
        assert len(f) == COUNT
        np.testing.assert_array_equal(f[name(DEEP - 1)].to_numpy(), np.full(4, DEEP - 1, np.int32))
        with pytest.raises(SpecViolation) as on_read:
            f[name(DEEP)]
        assert (on_read.value.rule_id, on_read.value.offset) == audited[0]
        with pytest.raises(SpecViolation) as again:  # not remembered as read: every access says so
            f.get_item(name(DEEP))
        assert (again.value.rule_id, again.value.offset) == audited[0]
    with hs.read_file(path) as f:
        with pytest.raises(SpecViolation) as listed:
            f.findings  # noqa: B018 - reading it checks every tensor
        assert (listed.value.rule_id, listed.value.offset) == audited[0]
    with pytest.raises(SpecViolation) as loaded:
        hs.load(path)
    assert (loaded.value.rule_id, loaded.value.offset) == audited[0]


def test_a_placement_fault_deep_in_a_large_file_raises_at_open_with_audits_rule_and_offset(tmp_path, clean):
    entry_at = index_entries(clean)[name(DEEP)][0]
    length_field = entry_at + 2 + len(name(DEEP)) + 8  # after name_length, the name and descriptor_offset
    (length,) = struct.unpack_from("<I", clean, length_field)
    bad = with_crc(clean[:length_field] + struct.pack("<I", length + 8) + clean[length_field + 4 :])
    path = tmp_path / "placed.hrry"
    path.write_bytes(bad)

    audited = [(f.rule_id, f.offset) for f in hs.audit(path).findings if f.is_error]
    assert audited[0] == ("file.index.descriptor_length", length_field)
    with pytest.raises(SpecViolation) as at_open:
        hs.read_file(path)
    assert (at_open.value.rule_id, at_open.value.offset) == audited[0]


def test_a_name_that_is_not_utf8_is_refused_at_its_entry(tmp_path, clean):
    entry_at = index_entries(clean)[name(DEEP)][0]
    bad = with_crc(clean[: entry_at + 2] + b"\xff" + clean[entry_at + 3 :])
    path = tmp_path / "name.hrry"
    path.write_bytes(bad)
    with pytest.raises(SpecViolation) as at_open:
        hs.read_file(path)
    assert (at_open.value.rule_id, at_open.value.offset) == ("file.index.name", entry_at + 2)


def test_an_open_reads_no_descriptor_it_does_not_need(tmp_path, clean):
    """Only the tensors read are decoded; the rest are checked on their first read."""
    path = tmp_path / "many.hrry"
    path.write_bytes(clean)
    with hs.read_file(path) as f:
        f[name(3)]
        assert set(f._checked) == {name(3)}
        assert [e.name for e in f.entries()[:2]] == [name(0), name(1)]
        assert f.buffer_ranges(name(DEEP)) == ((index_entries(clean)[name(DEEP)][3], 16),)


def test_a_local_file_hands_out_its_descriptor_until_closed(tmp_path):
    """``HurrayFile.fileno()`` is the OS descriptor of the mapped file (what the server sends from):
    reading through it gives the file's bytes; after close it is refused, and a file read from
    bytes has none."""
    import io
    import os

    from hurray_schema.io.file import ClosedFileError, HurrayFile

    path = tmp_path / "one.hrry"
    hs.save(path, {"x": np.arange(6, dtype=np.float32)})
    raw = path.read_bytes()
    f = hs.read_file(path)
    assert os.pread(f.fileno(), len(raw), 0) == raw
    f.close()
    with pytest.raises(ClosedFileError):
        f.fileno()
    with HurrayFile.over(raw) as g, pytest.raises(io.UnsupportedOperation):
        g.fileno()


def test_a_folder_is_refused_as_a_folder(tmp_path):
    with pytest.raises(IsADirectoryError):
        hs.read_file(tmp_path)


@pytest.mark.parametrize("sorted_index", [False, True])
def test_tensors_read_alike_whether_the_index_follows_descriptor_order_or_not(tmp_path, sorted_index):
    """Written in the order z, a, m: an unsorted index lists them in descriptor order, a sorted one
    (a, m, z) does not; the open's placement takes either, and every tensor reads back."""
    arrays = {name: np.full((2, 3), value, np.float32) for name, value in (("z", 1.0), ("a", 2.0), ("m", 3.0))}
    path = tmp_path / "order.hrry"
    hs.write_file(path, {name: hs.Tensor.from_numpy(a) for name, a in arrays.items()}, sorted_index=sorted_index)
    with hs.read_file(path) as f:
        assert [e.name for e in f.entries()] == (sorted(arrays) if sorted_index else list(arrays))
        offsets = [e.descriptor_offset for e in f.entries()]
        assert (offsets == sorted(offsets)) is not sorted_index
        for name, array in arrays.items():
            np.testing.assert_array_equal(np.asarray(f[name]), array)


@pytest.mark.parametrize("sorted_index", [False, True])
def test_names_beyond_ascii_are_read_as_utf8(tmp_path, sorted_index):
    """``file-format.md § Index Encoding``: names are UTF-8; a sorted index orders them by their bytes."""
    names = ["z", "é", "日本", "a\x00b", "ascii"]
    path = tmp_path / "names.hrry"
    hs.write_file(path, {n: hs.Tensor.from_numpy(np.full(3, i, np.int16)) for i, n in enumerate(names)},
                  sorted_index=sorted_index)
    with hs.read_file(path) as f:
        listed = sorted(names, key=lambda n: n.encode("utf-8")) if sorted_index else names
        assert list(f) == listed
        for i, n in enumerate(names):
            np.testing.assert_array_equal(np.asarray(f[n]), np.full(3, i, np.int16))


def test_the_writer_refuses_an_alignment_with_the_header_rule(tmp_path):
    """``file-format.md § File Header``: data_buffer_alignment is a power of two in its bounds; the
    writer raises what a reader of that header would, at the field (after magic 8, versions 1 + 1,
    _reserved 2, file_flags 4)."""
    for alignment in (1000, 2048, 4 << 20, 0):
        with pytest.raises(SpecViolation) as refused:
            hs.write_file(tmp_path / "a.hrry", {"a": np.zeros(2, np.float32)}, data_buffer_alignment=alignment)
        assert (refused.value.rule_id, refused.value.offset) == ("file.header.alignment", 16)
    assert not (tmp_path / "a.hrry").exists()


def test_audit_of_a_file_opens_no_reader(tmp_path, clean, monkeypatch):
    """Audit takes the findings off the one walk of the file: no HurrayFile is opened on the bytes."""
    from hurray_schema.io.file import HurrayFile

    descriptor = index_entries(clean)[name(DEEP)][1]
    fault = descriptor + FIXED_HEADER + 1 * DIM + BYTE_OFFSET + BUFFER_COUNT + HANDLE_RESERVED
    path = tmp_path / "deep.hrry"
    path.write_bytes(clean[:fault] + b"\x01" + clean[fault + 1 :])

    def refuse(*args, **kwargs):
        raise AssertionError("audit opened a reader")

    monkeypatch.setattr(HurrayFile, "__init__", refuse)
    monkeypatch.setattr(HurrayFile, "over", classmethod(refuse))
    assert [(f.rule_id, f.offset) for f in hs.audit(path).findings if f.is_error] == [("buffer.reserved", fault)]
