"""Seed inputs: valid descriptors, streams and files to be damaged by the fuzzers.

Descriptors come from this project's own encoder; streams and files from this
project's writers (``write_stream`` / ``write_file``) and from the reference implementation
``pyhurray`` (when installed: an optional third-party package), so each reader is also fed
the other side's output.  Where ``../shared/conformance`` is present its descriptor and
file vectors are added too.
"""

from __future__ import annotations

from pathlib import Path

from hurray_schema import (
    BlockPagedLayout, BufferHandle, CompositeLayout, CompositeMember, CooLayout, CsfLayout, CsrLayout,
    ExtensionType, HilbertLayout, MortonLayout, PerBlockAffine, PerTensorAffine, Shard, Statistics,
    StridedLayout, TensorDescriptor, TiledLayout, encode_descriptor,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "conformance"
CONFORMANCE = SHARED / "descriptors"
CONFORMANCE_FILES = SHARED / "files"


def seed_descriptors() -> list[TensorDescriptor]:
    f32, buf = 0x03, BufferHandle
    return [
        TensorDescriptor(f32, (3, 4), buffers=(buf(48),)),
        TensorDescriptor(f32, (0, 4), buffers=(buf(0),)),
        TensorDescriptor(f32, (), buffers=(buf(4),)),
        TensorDescriptor(f32, (3, 4), StridedLayout((-4, 1)), (buf(48),), byte_offset=32),
        TensorDescriptor(f32, (8, 8), TiledLayout((4, 4), 1, 4, inner=TiledLayout((2, 2))), (buf(256),)),
        TensorDescriptor(f32, (4, 4), MortonLayout((2, 2)), (buf(64),)),
        TensorDescriptor(f32, (4, 4), HilbertLayout(2, 2), (buf(64),)),
        TensorDescriptor(f32, (3, 3), CooLayout(2, 1), (buf(8), buf(32))),
        TensorDescriptor(f32, (3, 3), CsrLayout(0), (buf(0), buf(0), buf(32))),
        TensorDescriptor(f32, (2, 2, 2), CsfLayout(3, (0, 1, 2)),
                         tuple(buf(n) for n in (12, 16, 16, 24, 24, 32, 24))),
        TensorDescriptor(0x01, (9, 2, 8), BlockPagedLayout(4, 3, 2, kv_role=1, layer_index=5),
                         (buf(384), buf(12), buf(12))),
        TensorDescriptor(f32, (8, 8), CompositeLayout(1, 2)),
        TensorDescriptor(0x48, (128, 128), buffers=(buf(8192), buf(512)),
                         quantization=PerBlockAffine(1, 64, 1, scale_type_tag=0x01, flags=1)),
        TensorDescriptor(0x11, (10,), buffers=(buf(10),), quantization=PerTensorAffine(0.5, 3)),
        TensorDescriptor(f32, (8, 4), buffers=(buf(128),), shard=Shard((8, 8), (0, 4)),
                         statistics=Statistics(computed_mask=5, nnz=3, value_min=-1.0, value_max=2.0,
                                               value_abs_max=2.0),
                         composite_member=CompositeMember(0)),
        TensorDescriptor(0xF0, (16,), buffers=(buf(8),), extension_type=ExtensionType(4, 2, 1, 0, 1, 2, 1, 1)),
    ]


def seed_inputs() -> list[bytes]:
    seeds = [encode_descriptor(d) for d in seed_descriptors()]
    if CONFORMANCE.is_dir():
        seeds += [p.read_bytes() for p in sorted(CONFORMANCE.glob("*.bin"))]
    return seeds


# --- streams and files -----------------------------------------------------------------


def _our_io():
    """This project's Tensor / Composite and writers (imported when a seed is built; a missing
    name is an ImportError, never a silently smaller corpus)."""
    from hurray_schema.io.file import write_file
    from hurray_schema.io.stream import write_stream
    from hurray_schema.io.tensor import Composite, Tensor

    return Tensor, Composite, write_stream, write_file


def our_items():
    """Tensors and composites built with this project's objects."""
    Tensor, Composite = _our_io()[:2]
    f32 = 0x03
    t = Tensor.dense(f32, (4,), bytes(range(16)))
    empty = Tensor.dense(f32, (0, 4))
    boolean = Tensor.dense(0x20, (10,), b"\x55\x02")
    csr = Tensor(TensorDescriptor(f32, (3, 3), CsrLayout(3), (BufferHandle(12), BufferHandle(24), BufferHandle(32))),
                 (bytes(range(12)), bytes(24), bytes(32)))
    left = Tensor.dense(f32, (8, 4), bytes(range(128)), shard=Shard((8, 8), (0, 0)))
    right = Tensor.dense(f32, (8, 4), bytes(range(128)), shard=Shard((8, 8), (0, 4)))
    part = Composite.build("partition", [left, right], shape=(8, 8), type_tag=f32)
    base = Tensor.dense(f32, (4, 4), bytes(range(64)), shard=Shard((4, 4), (0, 0)))
    corr = Tensor.dense(f32, (1, 2), bytes(range(8)), shard=Shard((4, 4), (2, 1)))
    overlay = Composite.build("overlay", [base, corr], shape=(4, 4), type_tag=f32, combine_op="add")
    inner = Composite.build("group", [Tensor.dense(f32, (4,), bytes(16))], shape=(4,), type_tag=f32)
    nested = Composite.build("group", [inner, Tensor.dense(f32, (4,), bytes(range(16)))], shape=(4,), type_tag=f32)
    return [t, empty, boolean, csr, part, overlay, nested]


def _pyhurray_items():
    try:
        import hurray
    except ImportError:
        return None
    import struct

    f32 = hurray.float32
    t = hurray.Tensor(struct.pack("<4f", 1, 2, 3, 4), f32, [4])
    csr = hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [3, 3],
                        aux_buffers=[struct.pack("<3Q", 0, 1, 2), struct.pack("<4Q", 0, 1, 2, 3)],
                        layout=hurray.CsrLayout(nnz=3))
    a = hurray.Tensor(bytes(range(128)), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(bytes(range(128)), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    part = hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b])
    base = hurray.Tensor(bytes(range(64)), f32, [4, 4], shard=hurray.Shard([4, 4], [0, 0]))
    corr = hurray.Tensor(struct.pack("<2f", 9, 9), f32, [1, 2], shard=hurray.Shard([4, 4], [2, 1]))
    overlay = hurray.Composite("overlay", shape=[4, 4], dtype=f32, members=[base, corr], combine_op="add")
    nested = hurray.Composite("group", shape=[4], dtype=f32, members=[
        hurray.Composite("group", shape=[4], dtype=f32, members=[hurray.Tensor(bytes(16), f32, [4])]),
        hurray.Tensor(bytes(range(16)), f32, [4])])
    empty = hurray.Tensor(b"", f32, [0, 4])
    return hurray, {"t": t, "csr": csr, "part": part, "overlay": overlay, "nested": nested, "empty": empty}


def seed_streams(framing: str = "bare") -> list[bytes]:
    """Valid streams in ``framing`` ("bare" or "messages")."""
    seeds: list[bytes] = []
    write_stream, items = _our_io()[2], our_items()
    seeds += [write_stream(None, [item], framing=framing) for item in items]
    seeds.append(write_stream(None, items[:4], framing=framing))
    seeds.append(write_stream(None, [items[4], items[0], items[6]], framing=framing))
    ref = _pyhurray_items() if framing == "bare" else None
    if ref is not None:
        hurray, named = ref
        for group in (["t"], ["csr", "t"], ["part"], ["overlay"], ["nested"], ["empty", "t"]):
            with hurray.StreamWriter() as w:
                for name in group:
                    w.write(named[name])
            seeds.append(w.getvalue())
    return seeds


KV = {"producer": "hurray-schema fuzz", "n": -5, "u": 7, "f": 1.5, "b": True, "by": b"\x00\x01",
      "ls": ["a", "bc"], "li": [1, 2, 3]}


def seed_files(directory: Path) -> list[bytes]:
    """Valid ``.hrry`` files (as bytes); ``directory`` is scratch space for the writers."""
    directory = Path(directory)
    seeds: list[bytes] = []
    write_file, items = _our_io()[3], our_items()
    for i, (chosen, kv, sort) in enumerate((
        (items[:1], None, False), (items[:4], KV, True), (items[4:], {"k": "v"}, False), ([], None, False),
    )):
        path = directory / f"ours{i}.hrry"
        write_file(path, {f"x{j}": item for j, item in enumerate(chosen)}, metadata=kv, sorted_index=sort)
        seeds.append(path.read_bytes())
    ref = _pyhurray_items()
    if ref is not None:
        hurray, named = ref
        for i, (names, kv) in enumerate(((["t"], None), (["csr", "empty"], {"s": "x", "i": 3, "l": [1.0]}),
                                          (["part", "nested"], None), (["overlay", "t"], {"b": b"\x01"}))):
            path = directory / f"ref{i}.hrry"
            hurray.save(str(path), {name: named[name] for name in names}, kv=kv)
            seeds.append(path.read_bytes())
    if CONFORMANCE_FILES.is_dir():
        seeds += [p.read_bytes() for p in sorted(CONFORMANCE_FILES.glob("*.hrry"))]
    return seeds


def seeds_for(entry_point: str, scratch: Path) -> list[bytes]:
    """The seed inputs of one fuzzed entry point (see ``fuzz/harness.py``)."""
    if entry_point == "decode_descriptor":
        return seed_inputs()
    if entry_point == "read_stream":
        return seed_streams("bare") + seed_streams("messages")
    if entry_point == "read_file":
        return seed_files(scratch)
    if entry_point == "audit":
        return seed_inputs() + seed_streams("bare") + seed_files(scratch)
    raise KeyError(entry_point)


def main(argv: list[str]) -> None:
    """``python -m fuzz.corpus ENTRY_POINT DIR``: write that entry point's seeds into DIR."""
    import tempfile

    name, out = argv[1], Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        seeds = seeds_for(name, Path(scratch))
    for i, data in enumerate(seeds):
        (out / f"seed{i:03d}").write_bytes(data)
    print(f"{len(seeds)} seeds for {name} in {out}")


if __name__ == "__main__":
    import sys

    main(sys.argv)
