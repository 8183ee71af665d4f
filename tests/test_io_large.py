"""A 2 GiB ``.hrry`` file opens and lists its tensors without reading their data.

The file is laid out here by hand from the spec tables (``file-format.md``) with sparse
writes (``seek`` over the data), so it takes almost no disk space.  Resident memory is
read from ``/proc/self/status`` before and after opening.
"""

from __future__ import annotations

import struct
import sys

import crc32c
import pytest

from hurray_schema.codec import encode_descriptor
from hurray_schema.io import read_file
from hurray_schema.model import BufferHandle, TensorDescriptor

GiB = 1 << 30
ALIGN = 4096


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _pad(n: int, a: int) -> int:
    return -(-n // a) * a


def build_sparse_file(path) -> dict:
    """Tensors: a uint8 [1 GiB], b float32 [256 Mi] (1 GiB), tail int8 [4] with real bytes."""
    specs = [("a", 0x11, (GiB,), GiB, None), ("b", 0x03, (GiB // 4,), GiB, None), ("tail", 0x10, (4,), 4, b"\x01\x02\x03\x04")]
    entries = []
    with open(path, "wb") as f:
        f.write(struct.pack("<8sBB2sIIQQ28s", b"HRRYFILE", 1, 0, b"\0\0", 4, ALIGN, 64, len(specs), bytes(28)))
        pos = 64
        for name, tag, shape, size, data in specs:
            desc = encode_descriptor(TensorDescriptor(type_tag=tag, shape=shape, buffers=(BufferHandle(size, 64),)))
            pos = _pad(pos, 8)
            f.seek(pos)
            f.write(desc)
            desc_off, pos = pos, pos + len(desc)
            pos = _pad(pos, ALIGN)
            data_off = pos
            if data is not None:
                f.seek(pos)
                f.write(data)
            pos += size
            entries.append((name, desc_off, len(desc), data_off, size))
        pos = _pad(pos, 8)
        index = struct.pack("<Q", len(entries)) + b"".join(
            struct.pack("<H", len(n)) + n.encode() + struct.pack("<QIQQI", do, dl, da, dn, 0)
            for n, do, dl, da, dn in entries)
        f.seek(pos)
        f.write(index)
        f.write(struct.pack("<QQQII4s4s", pos, len(index), 0, 0, crc32c.crc32c(index), bytes(4), b"HRRY"))
    return {n: (da, dn) for n, _do, _dl, da, dn in entries}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_two_gib_file_opens_without_reading_data(tmp_path):
    path = tmp_path / "big.hrry"
    layout = build_sparse_file(path)
    size = path.stat().st_size
    assert size > 2 * GiB
    before = rss_bytes()
    with read_file(path) as f:
        assert list(f) == ["a", "b", "tail"]
        assert f["a"].shape == (GiB,) and f["b"].shape == (GiB // 4,)
        assert [e.data_length for e in f.entries()] == [GiB, GiB, 4]
        assert [len(f[n].buffers[0]) for n in f] == [GiB, GiB, 4]
        grown = rss_bytes() - before
        assert grown < 64 * 1024 * 1024, f"opening grew RSS by {grown} bytes"
        # reading one tensor's bytes touches only its pages
        assert bytes(f["tail"].buffers[0]) == b"\x01\x02\x03\x04"
        assert f["a"].buffers[0][GiB - 1] == 0
        assert rss_bytes() - before < 64 * 1024 * 1024
    assert layout["tail"][0] % ALIGN == 0
