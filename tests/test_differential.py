"""Differential check against the reference implementation, pyhurray.

Mutated valid descriptors, bare streams and files are given to ``hurray_schema`` (strict
mode) and to pyhurray (``Descriptor.decode``, ``StreamReader``, ``load``/``load_kv``; see
``fuzz/reference.py``).  Every input on which one accepts and the other rejects -- or on
which pyhurray kills its process -- must be explained by an entry of :data:`KNOWN`:

* ``divergence``: the spec and the reference differ (or the spec is ambiguous); recorded
  in ``spec-map.md § Divergences`` with the spec citation and which side follows the spec;
* ``pending``: a bug on our side waiting for a component that is not in this build yet;
  such an entry only explains disagreements while that component is missing.

Each entry also has a focused test (``test_divergence[<id>]``) on a crafted input that
pins both sides' behaviour, so a change on either side is noticed.
"""

from __future__ import annotations

import random
import re
import struct
from pathlib import Path
from typing import Callable, Optional

import attrs
import pytest

import hurray_schema as hs
from fuzz import reference, targets
from fuzz.corpus import seed_files, seed_inputs, seed_streams
from fuzz.mutate import hot_regions, mutate, refresh_index_crc
from hurray_schema.model import (
    DYNAMIC_DIMENSION, NO_BUFFER_INDEX, BlockPagedLayout, BufferHandle, CompositeLayout, CooLayout, CscLayout,
    CsfLayout, CsrLayout, ElementType, ExtensionLayout, ExtensionType, Mxfp, PerBlockAffine,
    PerChannelAffine, QuantFlag, Statistics, StatisticsMask, TensorDescriptor,
)
from hurray_schema.structs._declare import plan, static_offset
from hurray_schema.structs.descriptor import FIXED_HEADER
from hurray_schema.structs.file import (
    FILE_HEADER, INDEX_COUNT, INDEX_ENTRY_FIELDS, INDEX_NAME_LENGTH, KV_COUNT, TRAILER, TRAILER_SIZE, FileFlag,
)
from hurray_schema.structs.tags import PRIVATE_TAG_FIRST, PRIVATE_TAG_LAST
from support.descriptors import dense, head, member
from support.sizes import size

pytestmark = pytest.mark.skipif(not reference.available(), reason="pyhurray is not installed")

ABORT = reference.ABORT
F32 = 0x03


@attrs.frozen
class Known:
    """One explained class of disagreement (see the module docstring)."""

    id: str
    kind: str  # "divergence" | "pending"
    what: str
    spec: str
    follows: str  # which side follows the spec
    ours: frozenset = frozenset()  # our rule ids (or "limit:<name>") when we reject and pyhurray accepts
    theirs: Optional[str] = None  # regex on pyhurray's error when it rejects and we accept
    abort: bool = False  # pyhurray aborts its process where we reject
    active: Callable[[], bool] = lambda: True
    kinds: frozenset = frozenset({"descriptor", "stream", "file"})  # the inputs this class is about
    when: Optional[Callable[[bytes], bool]] = None  # a condition on the input bytes, when the class needs one

    def explains(self, ours_rule: Optional[str], theirs: Optional[str], kind: str = "descriptor",
                 data: bytes = b"") -> bool:
        if not self.active() or kind not in self.kinds or (self.when is not None and not self.when(data)):
            return False
        if theirs == ABORT:
            return self.abort and ours_rule is not None
        if ours_rule is not None and theirs is None:
            return ours_rule in self.ours
        if ours_rule is None and theirs is not None and self.theirs is not None:
            return re.search(self.theirs, theirs) is not None
        return False


def _rules(*ids: str) -> frozenset:
    return frozenset(ids)


_MINOR = static_offset(FIXED_HEADER, "version_minor")
_FLAGS = static_offset(FIXED_HEADER, "flags")
_LENGTH = static_offset(FIXED_HEADER, "descriptor_length")


def _newer_minor_input(data: bytes) -> bool:
    """The (first) descriptor of ``data`` carries a version_minor above 0."""
    return len(data) > _MINOR and data[_MINOR] > 0


def _minor_zero_input(data: bytes) -> bool:
    return len(data) > _MINOR and data[_MINOR] == 0


KNOWN = [
    # -- one descriptor -------------------------------------------------------------
    Known("DIV-BUFSIZE", "divergence",
          "pyhurray's Descriptor.decode does not check buffer byte_size against shape, layout and "
          "quantization (nor byte_offset against the buffer, nor ADR-007's zero-byte data buffer)",
          "layouts/*.md § Buffer Size; metadata.md § byte_offset; quantization/*.md § Referenced Buffers; "
          "ADR-007 § Decision", "hurray_schema",
          ours=_rules("layout.dense.buffer_size", "layout.sparse.buffer_size", "layout.strided.buffer_bounds",
                      "layout.morton.buffer_size", "layout.hilbert.buffer_size", "quantization.buffer.size",
                      "adr007.empty.data_buffer_size", "metadata.byte_offset.bounds")),
    Known("DIV-LAYOUT", "divergence",
          "pyhurray's Descriptor.decode does not check layout constraints on shape and rank "
          "(Morton/Hilbert extents, Hilbert, block-paged, CSR/CSC (2) and CSF (>= 3) rank, scalar layout, no "
          "dynamic dimension in a shard) nor byte_offset = 0 for "
          "sparse and indirect layouts, nor the per-layout buffer_count",
          "layouts/morton.md § Dimension Size Constraints; layouts/hilbert.md § Validity Constraints; "
          "layouts/block-paged.md § Description; layouts/csr.md, csc.md, csf.md § Description; "
          "data-model.md § Scalar Tensors; layouts/coo.md, csr.md, csf.md, "
          "block-paged.md § byte_offset; metadata.md § Buffer Table", "hurray_schema",
          ours=_rules("layout.morton.shape", "layout.hilbert.shape", "layout.hilbert.rank", "layout.block_paged.rank",
                      "data_model.scalar.layout", "data_model.shard.dynamic", "layout.block_paged.paged_axis", "layout.block_paged.page_size", "layout.coo.byte_offset", "layout.csr.byte_offset",
                      "layout.csc.byte_offset", "layout.csf.byte_offset", "layout.block_paged.byte_offset",
                      "metadata.buffer_count.dense", "layout.coo.buffer_count", "layout.csr.buffer_count",
                      "layout.csc.buffer_count", "layout.csf.buffer_count", "layout.block_paged.buffer_count",
                      "layout.csr.rank", "layout.csc.rank", "layout.csf.rank")),
    Known("DIV-QUANT", "divergence",
          "pyhurray's Descriptor.decode does not check quantization parameters against the tensor "
          "(axis < rank, block_size <= shape[axis], parameter buffer indices, zero_point range, storage "
          "type, the padding of a partial last block in the data buffer) nor scheme_version = 0x01 (it accepts 0x00)",
          "quantization/*.md § Validity Constraints, § Referenced Buffers; "
          "quantization/per-block-affine.md § Padding",
          "hurray_schema",
          ours=_rules("quantization.axis", "quantization.block_size.upper", "quantization.buffer_index.range",
                      "quantization.buffer_index.data", "quantization.per_tensor.zero_point",
                      "quantization.per_tensor.storage_type", "quantization.per_channel.storage_type",
                      "quantization.per_block.storage_type", "quantization.nf4.storage_type",
                      "quantization.mxfp.storage_type", "quantization.scheme_version.value",
                      "quantization.block_padding")),
    Known("DIV-BUFFER", "divergence",
          "pyhurray's Descriptor.decode does not check that all buffers share device and memory class, "
          "nor that the memory class is valid for the device; it accepts a private memory class on a private "
          "device that nothing agreed on (hurray_schema: strict rejects, permissive accepts)",
          "buffer-protocol.md § Device Colocation, § Memory Class, § Memory Class Values", "hurray_schema",
          ours=_rules("buffer.colocation", "buffer.memory_class.device", "buffer.memory_class.private")),
    Known("DIV-EXTTYPE", "divergence",
          "pyhurray's Descriptor.decode does not check the float fields of an extension type "
          "(sign_bits 0 or 1, exponent/mantissa bits)",
          "metadata.md § Extension Type Section", "hurray_schema",
          ours=_rules("metadata.extension_type.float_fields")),
    Known("DIV-EXTLAYOUT", "divergence",
          "A private layout whose extension_layout_id the reader does not know: pyhurray accepts it (opaque); "
          "hurray_schema strict rejects, permissive accepts (the spec's permissive-mode exception)",
          "metadata.md § Extension Layouts (0xF0–0xFE)", "hurray_schema (pyhurray as permissive)",
          ours=_rules("descriptor.layout.extension_unknown")),
    Known("DIV-STATS", "divergence",
          "pyhurray's Descriptor.decode does not check the statistics values: value_stddev >= 0, nm_n <= nm_m, "
          "and a sparse layout's statistics nnz equal to the layout's nnz",
          "metadata.md § Statistics Section › Field Encoding; layouts/coo.md, csr.md, csc.md, csf.md § Interaction "
          "with Statistics Section", "hurray_schema",
          ours=_rules("metadata.statistics.stddev", "metadata.statistics.nm", "layout.sparse.statistics_nnz")),
    Known("DIV-MINOR", "divergence",
          "A descriptor with a newer version_minor: pyhurray accepts it (the spec's SHOULD); hurray_schema "
          "rejects it in strict mode and accepts it in permissive mode",
          "metadata.md § Version Compatibility", "pyhurray (and hurray_schema permissive)",
          ours=_rules("descriptor.version_minor")),
    Known("DIV-MINOR-TRUNC", "divergence",
          "A newer-minor descriptor whose descriptor_length runs past the end of the input: pyhurray accepts "
          "it (it stops at the fields it knows); hurray_schema reports it truncated",
          "metadata.md § Fixed Header (descriptor_length is the total length)", "hurray_schema",
          ours=_rules("descriptor.truncated"), kinds=frozenset({"descriptor"}), when=_newer_minor_input),
    Known("DIV-TRUNC", "divergence",
          "A version_minor 0 descriptor whose descriptor_length runs past the end of the input: both reject "
          "(pyhurray: 'descriptor_length mismatch'); any acceptance by pyhurray would be a divergence",
          "metadata.md § Fixed Header", "hurray_schema",
          ours=_rules("descriptor.truncated"), kinds=frozenset({"descriptor"}), when=_minor_zero_input),
    Known("DIV-AXIS-DYNAMIC", "divergence",
          "A quantization scheme whose axis is a dynamic dimension (per-channel, per-block, NF4, MXFP): "
          "pyhurray accepts; hurray_schema rejects (the scheme needs the axis' size)",
          "data-model.md § Dynamic Dimensions; quantization/*.md § Validity Constraints", "hurray_schema",
          ours=_rules("quantization.axis.dynamic")),
    Known("DIV-MXFP-MULTIPLE", "divergence",
          "MXFP with shape[axis] not a multiple of block_size: pyhurray accepts; hurray_schema rejects",
          "quantization/mxfp.md § Validity Constraints", "hurray_schema",
          ours=_rules("quantization.mxfp.multiple")),
    Known("DIV-QUANT-VALUES", "divergence",
          "A zero, infinite or NaN per-block or per-channel scale, a negative NF4 absmax, a reserved (0x00/0xFF) "
          "MXFP scale byte: pyhurray reads the tensor (it does not dequantize); hurray_schema's readers accept it "
          "too but reject it when the values are decoded, and audit and the writers reject it",
          "quantization/per-block-affine.md, per-channel-affine.md, nf4.md § Validity Constraints; "
          "quantization/mxfp.md § Referenced Buffer", "hurray_schema",
          ours=_rules("quantization.per_block.scale_values", "quantization.per_channel.scale_values",
                      "quantization.nf4.absmax_values", "quantization.mxfp.scale_reserved"),
          kinds=frozenset({"stream_decoded", "file_decoded"})),
    Known("DIV-SYMIDX", "divergence",
          "Per-block-affine with SYMMETRIC set and zero_point_buffer_index != 0xFFFFFFFF: pyhurray rejects "
          "(flag table: MUST); hurray_schema warns (field table: ignored, writers SHOULD set 0xFFFFFFFF)",
          "quantization/per-block-affine.md § Binary Encoding vs § Flags (the spec contradicts itself)",
          "ambiguous",
          theirs=r"SYMMETRIC flag is set but"),
    Known("DIV-PAGED-ENUM", "divergence",
          "Block-paged kv_role or block_table_index_type outside the values the spec lists: pyhurray rejects; "
          "hurray_schema accepts (the spec lists the values but states no reject rule; an unknown index type "
          "leaves buffers 1 and 2 without an element type, so rejecting it is the safer reading -- reported)",
          "layouts/block-paged.md § Additional Descriptor Fields", "ambiguous",
          theirs=r"block-paged: unknown (kv_role|block_table_index_type|blo)"),
    Known("DIV-NEWFLAGS", "divergence",
          "A newer-minor descriptor with flag bits unknown to 1.0: pyhurray rejects (§ Flags: MUST reject "
          "reserved bits); hurray_schema permissive keeps them opaque (§ Version Compatibility: newer minors "
          "add flag bits)", "metadata.md § Flags vs § Version Compatibility; versioning.md § Compatibility Matrix (its "
          "table ignores unknown flag bits of a newer minor, the text under it rejects them)", "ambiguous"),
    # -- streams ---------------------------------------------------------------------
    Known("DIV-STREAM-ABORT", "divergence",
          "pyhurray's StreamReader aborts the Python process (Rust allocation failure) on a buffer byte_size "
          "or a composite member_count larger than memory; hurray_schema rejects (truncated stream / limit)",
          "interchange.md § Scope; layouts/composite.md § Binding (no allocation for unarrived members)",
          "hurray_schema", abort=True, kinds=frozenset({"stream"})),
    Known("DIV-NESTING", "divergence",
          "Composites nested 9 to 64 levels deep: pyhurray accepts (its limit is 64); hurray_schema rejects "
          "(the spec's limit is 8)", "layouts/composite.md § Binding", "hurray_schema",
          ours=_rules("composite.nesting.depth"), kinds=frozenset({"stream", "file"})),
    # -- files -----------------------------------------------------------------------
    Known("DIV-FILE-ABORT", "divergence",
          "pyhurray's load aborts the Python process on counts and sizes larger than the file "
          "(index_entry_count, data_length, buffer sizes, a composite member_count, ...); hurray_schema rejects "
          "(the broken rule, or the max_composite_members limit)",
          "file-format.md § Index Section, § Tensor Region; layouts/composite.md § Binding", "hurray_schema",
          abort=True,
          kinds=frozenset({"file"})),
    Known("DIV-FILE-HEADER", "divergence",
          "pyhurray's load does not check the file header's reserved bytes, data_buffer_alignment "
          "(power of two in [4096, 2 MiB]) or first_descriptor_offset (>= 64, 8-aligned, inside the file)",
          "file-format.md § File Header", "hurray_schema",
          ours=_rules("file.header.reserved", "file.header.alignment", "file.header.first_descriptor_offset")),
    Known("DIV-FILE-TRAILER", "divergence",
          "pyhurray's load does not check the trailer's reserved bytes, a non-zero index_crc32c with "
          "HAS_INDEX_CRC32C clear, or the index bounds",
          "file-format.md § Trailer", "hurray_schema",
          ours=_rules("file.trailer.reserved", "file.index.crc_unset", "file.index.bounds", "file.index.alignment")),
    Known("DIV-FILE-INDEX", "divergence",
          "pyhurray's load does not check index entries: flags = 0, descriptor_length equal to the "
          "descriptor's, SORTED_INDEX order, bytes left after the last entry",
          "file-format.md § Index Section, § File Flags", "hurray_schema",
          ours=_rules("file.index.flags", "file.index.descriptor_length", "file.index.sorted", "file.index.truncated")),
    Known("DIV-FILE-PLACEMENT", "divergence",
          "pyhurray's load does not check where descriptors and data sit: inside the tensor region, "
          "data after its descriptor, data aligned, data_length equal to the buffers' span",
          "file-format.md § Tensor Region, § Data Buffer Placement, § Index Section", "hurray_schema",
          ours=_rules("file.index.descriptor_bounds", "file.index.overlap", "file.data.alignment", "file.data.length",
                      "file.data.bounds")),
    Known("DIV-FILE-KV", "divergence",
          "pyhurray's load_kv does not check the KV section's placement or bytes left after the last entry",
          "file-format.md § KV Metadata Section, § KV Section Encoding", "hurray_schema",
          ours=_rules("file.kv.bounds", "file.kv.truncated")),
]
KNOWN_BY_ID = {k.id: k for k in KNOWN}


def _our_rule(exc) -> str:
    return getattr(exc, "rule_id", None) or f"limit:{getattr(exc, 'limit', type(exc).__name__)}"


def explain(ours_exc, theirs: Optional[str], kind: str = "descriptor", data: bytes = b"") -> Optional[Known]:
    ours_rule = None if ours_exc is None else _our_rule(ours_exc)
    for k in KNOWN:
        if k.explains(ours_rule, theirs, kind, data):
            return k
    return None


# -- the record: spec-map.md § Divergences › Differential run --------------------------------

SPEC_MAP = Path(__file__).resolve().parents[1] / "spec-map.md"
_ID_CELL = re.compile(r"`([a-z0-9_]+(?:\.[a-z0-9_]+)+)`")


def divergence_rows() -> dict[str, frozenset]:
    """``{row id: rule ids of its "Rule ids" column}`` of the differential-run table."""
    section = SPEC_MAP.read_text(encoding="utf-8").split("### Differential run", 1)[1].split("\n#", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    column = header.index("Rule ids")
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = frozenset(_ID_CELL.findall(cells[column]))
    return rows


DIVERGENCE_ROWS = divergence_rows()


def _recorded_name(ours_exc) -> str:
    """Our rule id as the record writes it (a limit as ``limit.<name>``)."""
    return _our_rule(ours_exc).replace("limit:", "limit.", 1)


def _classify(data, ours, theirs, kind: str, found: dict, unexplained: "Unexplained") -> None:
    """File a disagreement under its class; it stays unexplained unless the record's row
    for that class names the rule we reject it with."""
    if not _disagree(ours, theirs):
        return
    k = explain(ours, theirs, kind, data)
    if k is None:
        unexplained.add(data, ours, theirs)
    elif ours is not None and _recorded_name(ours) not in DIVERGENCE_ROWS.get(k.id, ()):
        unexplained.add(data, ours, f"{theirs} [{k.id}: spec-map.md does not name {_recorded_name(ours)}]")
    else:
        found[k.id] = found.get(k.id, 0) + 1


def _disagree(ours_exc, theirs) -> bool:
    return theirs == ABORT or (ours_exc is None) != (theirs is None)


def _ours(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except hs.HurraySchemaError as exc:
        return exc
    return None


class Unexplained(list):
    def add(self, data: bytes, ours_exc, theirs) -> None:
        if len(self) < 12:
            self.append(f"ours={ours_exc!s:.160} | pyhurray={theirs!s:.160} | {bytes(data[:96]).hex()}")


def _report(found: dict, unexplained: Unexplained) -> None:
    print("differential:", {k: v for k, v in sorted(found.items())})
    assert not unexplained, "unexplained disagreements:\n" + "\n".join(unexplained)


@pytest.fixture(scope="module")
def ref():
    with reference.Reference() as r:
        yield r


def _mutants(seeds, seed: int, n: int):
    rng = random.Random(seed)
    pool = [(s, hot_regions(s)) for s in seeds]
    for i in range(n):
        data, hot = rng.choice(pool)
        yield i, mutate(rng, data, hot=hot)


def test_descriptors_agree_with_pyhurray(ref):
    found, unexplained = {}, Unexplained()
    for _, data in _mutants(seed_inputs(), 4242, size(4_000, 10_000)):
        ours = _ours(hs.decode_descriptor, data)
        theirs = ref.descriptor(data)
        _classify(data, ours, theirs, "descriptor", found, unexplained)
    _report(found, unexplained)


def test_streams_agree_with_pyhurray(ref):
    found, unexplained = {}, Unexplained()
    for _, data in _mutants(seed_streams("bare"), 4343, size(2_000, 5_000)):
        ours = _ours(targets.run_read_stream, data, "strict", "bare")
        theirs = ref.stream(data)
        _classify(data, ours, theirs, "stream", found, unexplained)
    _report(found, unexplained)


def test_files_agree_with_pyhurray(ref, tmp_path):
    found, unexplained = {}, Unexplained()
    scratch = targets.scratch_file()
    try:
        for i, data in _mutants(seed_files(tmp_path), 4444, size(600, 1_500)):
            if i % 2:
                data = refresh_index_crc(data)
            targets.write_scratch(scratch, data)
            ours = _ours(targets.run_read_file, scratch, "strict")
            theirs = ref.file(scratch)
            _classify(data, ours, theirs, "file", found, unexplained)
    finally:
        scratch.unlink(missing_ok=True)
    _report(found, unexplained)


# ---------------------------------------------------------------------------------------
# Focused tests: one crafted input per entry of KNOWN
# ---------------------------------------------------------------------------------------


def _enc(desc: TensorDescriptor) -> bytes:
    return hs.encode_descriptor(desc)


def _patch(data: bytes, at: int, value: bytes) -> bytes:
    return bytes(data[:at]) + value + bytes(data[at + len(value):])


def _newer_minor(data: bytes) -> bytes:
    return _patch(data, _MINOR, b"\x01")


def _shard_tensor(shape, parent, offset) -> bytes:
    desc = member(shape, offset, parent)
    return _enc(desc) + bytes(desc.buffers[0].byte_size)


def _file(tmp_path: Path, kv=None, sorted_index=False, names=("a", "b")) -> bytearray:
    from hurray_schema.io.file import write_file
    from hurray_schema.io.tensor import Tensor

    path = tmp_path / "seed.hrry"
    write_file(path, {n: Tensor.dense(F32, (4,), bytes(16)) for n in names}, metadata=kv, sorted_index=sorted_index)
    return bytearray(path.read_bytes())


def _trailer(data) -> dict:
    return plan(TRAILER).unpack(bytes(data), len(data) - TRAILER_SIZE)[0]


def _first_entry_field(data, name: str) -> int:
    """Absolute offset of field ``name`` of the first index entry."""
    start = _trailer(data)["index_offset"] + plan(INDEX_COUNT).fixed_size
    name_length = struct.unpack_from("<H", data, start)[0]
    return start + plan(INDEX_NAME_LENGTH).fixed_size + name_length + static_offset(INDEX_ENTRY_FIELDS, name)


def _put(data: bytearray, at: int, fmt: str, value: int) -> None:
    struct.pack_into(fmt, data, at, value)


def _index_patched(tmp_path, field: str, fmt: str, value: int, **kw) -> bytes:
    data = _file(tmp_path, **kw)
    _put(data, _first_entry_field(data, field), fmt, value)
    return refresh_index_crc(bytes(data))


def _header_patched(tmp_path, field: str, fmt: str, value: int) -> bytes:
    data = _file(tmp_path)
    _put(data, static_offset(FILE_HEADER, field), fmt, value)
    return bytes(data)


def _trailer_patched(tmp_path, field: str, fmt: str, value: int) -> bytes:
    data = _file(tmp_path)
    _put(data, len(data) - TRAILER_SIZE + static_offset(TRAILER, field), fmt, value)
    return bytes(data)


def _crc_without_flag(tmp_path) -> bytes:
    data = _file(tmp_path)
    flags = static_offset(FILE_HEADER, "file_flags")
    _put(data, flags, "<I", struct.unpack_from("<I", data, flags)[0] & ~int(FileFlag.HAS_INDEX_CRC32C))
    return bytes(data)


def _unsorted(tmp_path) -> bytes:
    data = _file(tmp_path, names=("b", "a"))
    flags = static_offset(FILE_HEADER, "file_flags")
    _put(data, flags, "<I", struct.unpack_from("<I", data, flags)[0] | int(FileFlag.SORTED_INDEX))
    return bytes(data)


def _kv_count_zero(tmp_path) -> bytes:
    data = _file(tmp_path, kv={"k": "v"})
    _put(data, _trailer(data)["kv_offset"], "<I", 0)  # the entry's bytes now follow "0 entries"
    assert plan(KV_COUNT).fixed_size == 4
    return bytes(data)


def _huge_index(tmp_path) -> bytes:
    data = _file(tmp_path)
    _put(data, _trailer(data)["index_offset"], "<Q", 2**38)
    return refresh_index_crc(bytes(data))


def _huge_member_count(tmp_path: Path) -> bytes:
    """A file whose group head promises 2**27 + 1 members -- past the default
    ``Limits.max_composite_members`` (2**20) -- and holds two (the head patched in place:
    the same descriptor_length, so the index still locates everything)."""
    from hurray_schema.io import Composite, Tensor, write_file

    head = TensorDescriptor(F32, (4,), CompositeLayout(0x03, 2))
    path = tmp_path / "members.hrry"
    write_file(path, {"g": Composite(head, [Tensor.dense(F32, (4,), bytes(16)) for _ in range(2)])})
    huge = attrs.evolve(head, layout=attrs.evolve(head.layout, member_count=2**27 + 1))
    data = path.read_bytes()
    assert data.count(_enc(head)) == 1 and len(_enc(huge)) == len(_enc(head))
    return data.replace(_enc(head), _enc(huge))


def _group_chain(levels: int) -> bytes:
    """A bare stream of ``levels`` nested one-member group heads around one float32 [4] tensor."""
    heads = b"".join(_enc(head(0x03, 1, (4,))) for _ in range(levels))
    return heads + _enc(TensorDescriptor(F32, (4,), buffers=(BufferHandle(16),))) + bytes(16)


def _group_chain_file(tmp_path: Path, levels: int) -> bytes:
    from hurray_schema.io import Composite, Tensor, write_file

    item = Tensor.dense(F32, (4,), bytes(16))
    for _ in range(levels):
        item = Composite(TensorDescriptor(F32, (4,), CompositeLayout(0x03, 1)), [item])
    path = tmp_path / "nested.hrry"
    write_file(path, {"c": item}, validate=False)
    return path.read_bytes()


def _csr(**kw) -> TensorDescriptor:
    """float32 [3, 3], nnz 3: values 3 x 4, column indices 3 x 8, row_ptr 4 x 8 bytes
    (layouts/csr.md § Buffer Size)."""
    return TensorDescriptor(F32, (3, 3), CsrLayout(3), (BufferHandle(12), BufferHandle(24), BufferHandle(32)), **kw)


def _rank_three(layout) -> bytes:
    """A CSR or CSC tensor of rank 3 whose buffers are those of the rank-2 [3, 3] one."""
    return _enc(attrs.evolve(_csr(), shape=(3, 3, 1), layout=layout))


def _csf_rank_two() -> bytes:
    """CSF on a [2, 2] matrix: 2 * rank + 1 = 5 buffers, as the layout's own count asks (layouts/csf.md § Buffer
    Table), so only the rank is wrong."""
    sizes = (12, 16, 16, 24, 24)
    return _enc(TensorDescriptor(F32, (2, 2), CsfLayout(3, (0, 1)), tuple(BufferHandle(s) for s in sizes)))


def _unpadded_last_block() -> bytes:
    """int8 [3, 10] in blocks of 8 along axis 1 (symmetric): 2 blocks a row, so the data buffer needs 3 x 16 bytes
    (quantization/per-block-affine.md § Padding) but holds the 30 unpadded ones; 6 float32 scales."""
    scheme = PerBlockAffine(1, 8, 1, NO_BUFFER_INDEX, flags=int(QuantFlag.SYMMETRIC))
    return _enc(TensorDescriptor(ElementType.INT8, (3, 10), buffers=(BufferHandle(30), BufferHandle(24)),
                                 quantization=scheme))


def _quant_values(scheme: str):
    """A one-tensor bare stream (``container`` "stream") or file whose first scale breaks its
    scheme's rule on the values: a zero per-block scale, a NaN per-channel scale, a negative NF4
    absmax, a reserved 0xFF MXFP scale byte (written without validation)."""
    import numpy as np

    from hurray_schema.builders.quantized import quantize, quantized_from_codes

    if scheme == "per_block":
        t = quantized_from_codes(np.array([[1, 2, 3, 4]], np.int8), "per_block", storage="int4", axis=1,
                                 block_size=2, scales=np.array([[0.0, 1.0]], np.float32))
    elif scheme == "per_channel":
        t = quantized_from_codes(np.array([[1], [2]], np.int8), "per_channel", storage="int8", axis=0,
                                 scales=np.array([float("nan"), 1.0], np.float32))
    elif scheme == "nf4":
        t = quantized_from_codes(np.arange(8, dtype=np.uint8).reshape(1, 8), "nf4", storage="uint4", axis=1,
                                 block_size=8, scales=np.array([[-1.0]], np.float32))
    else:
        ok = quantize(np.ones((1, 16), np.float32), "mxfp", block_size=16)
        t = hs.Tensor(ok.descriptor, [ok.buffers[0], b"\xff"])

    def build(tmp_path):
        if tmp_path is None:
            return hs.write_stream(None, [t], validate=False)
        path = tmp_path / "values.hrry"
        hs.write_file(path, {"t": t}, validate=False)
        return path.read_bytes()

    return build


def _decode_stream(data: bytes, mode: str) -> None:
    for item in hs.read_stream(data, framing="bare", mode=mode):
        item.to_numpy()


def _decode_file(path, mode: str) -> None:
    with hs.read_file(path, mode=mode) as f:
        for name in f:
            f[name].to_numpy()


def _private_memory_class() -> bytes:
    """A private memory class on a private device (buffer-protocol.md § Memory Class Values)."""
    return _enc(dense((3, 4), buffers=(BufferHandle(48, device_tag=PRIVATE_TAG_FIRST, memory_class=PRIVATE_TAG_LAST),)))


def _unknown_extension_layout() -> bytes:
    """A private layout tag with an extension_layout_id and two bytes of extension_data nobody agreed on."""
    layout = ExtensionLayout(PRIVATE_TAG_FIRST + 1, 0x1234, b"\x01\x02")
    return _enc(TensorDescriptor(F32, (3, 4), layout, (BufferHandle(48),)))


def _with_statistics(**fields) -> bytes:
    return _enc(dense((3, 4), statistics=Statistics(**fields)))


# (id, kind, build(tmp_path) -> bytes, our expected rule or None for "accepts", mode,
#  pyhurray expectation: None accepts / regex of its error / ABORT)
CASES = [
    ("DIV-BUFSIZE", "descriptor", lambda _: _enc(dense((3, 4), buffers=(BufferHandle(47),))), "layout.dense.buffer_size",
     "strict", None),
    ("DIV-LAYOUT", "descriptor",
     lambda _: _enc(TensorDescriptor(F32, (3, 3), CsrLayout(3), (BufferHandle(12), BufferHandle(24), BufferHandle(32)),
                                     byte_offset=4)), "layout.csr.byte_offset", "strict", None),
    ("DIV-LAYOUT", "descriptor", lambda _: _rank_three(CsrLayout(3)), "layout.csr.rank", "strict", None),
    ("DIV-LAYOUT", "descriptor", lambda _: _rank_three(CscLayout(3)), "layout.csc.rank", "strict", None),
    ("DIV-LAYOUT", "descriptor", lambda _: _csf_rank_two(), "layout.csf.rank", "strict", None),
    ("DIV-QUANT", "descriptor",
     lambda _: _enc(TensorDescriptor(0x48, (128, 128), buffers=(BufferHandle(8192), BufferHandle(512)),
                                     quantization=PerBlockAffine(5, 64, 1, scale_type_tag=0x01, flags=1))),
     "quantization.axis", "strict", None),
    ("DIV-QUANT", "descriptor", lambda _: _unpadded_last_block(), "quantization.block_padding", "strict", None),
    ("DIV-BUFFER", "descriptor",
     lambda _: _enc(TensorDescriptor(F32, (3, 3), CooLayout(2, 1), (BufferHandle(8), BufferHandle(32, memory_class=1)))),
     "buffer.colocation", "strict", None),
    ("DIV-BUFFER", "descriptor", lambda _: _private_memory_class(), "buffer.memory_class.private", "strict", None),
    ("DIV-BUFFER", "descriptor", lambda _: _private_memory_class(), None, "permissive", None),
    ("DIV-EXTTYPE", "descriptor",
     lambda _: _enc(TensorDescriptor(0xF0, (16,), buffers=(BufferHandle(32),),
                                     extension_type=ExtensionType(16, 1, 1, 0, 9, 5, 10, 15, 1, 1))),
     "metadata.extension_type.float_fields", "strict", None),
    ("DIV-EXTLAYOUT", "descriptor", lambda _: _unknown_extension_layout(), "descriptor.layout.extension_unknown",
     "strict", None),
    ("DIV-EXTLAYOUT", "descriptor", lambda _: _unknown_extension_layout(), None, "permissive", None),
    ("DIV-STATS", "descriptor",
     lambda _: _with_statistics(computed_mask=int(StatisticsMask.VALUE_STATS_VALID), value_stddev=float("nan")),
     "metadata.statistics.stddev", "strict", None),
    ("DIV-STATS", "descriptor",
     lambda _: _with_statistics(computed_mask=int(StatisticsMask.NM_SPARSITY_VALID), nm_n=3, nm_m=2),
     "metadata.statistics.nm", "strict", None),
    ("DIV-STATS", "descriptor",
     lambda _: _enc(_csr(statistics=Statistics(computed_mask=int(StatisticsMask.NNZ_VALID), nnz=5))),
     "layout.sparse.statistics_nnz", "strict", None),
    ("DIV-MINOR", "descriptor", lambda _: _newer_minor(_enc(dense((3, 4)))), "descriptor.version_minor", "strict", None),
    ("DIV-MINOR", "descriptor", lambda _: _newer_minor(_enc(dense((3, 4)))), None, "permissive", None),
    ("DIV-MINOR-TRUNC", "descriptor",
     lambda _: _patch(_newer_minor(_enc(dense((3, 4)))), _LENGTH, struct.pack("<I", len(_enc(dense((3, 4)))) + 8)),
     "descriptor.truncated", "permissive", None),
    ("DIV-TRUNC", "descriptor",
     lambda _: _patch(_enc(dense((3, 4))), _LENGTH, struct.pack("<I", len(_enc(dense((3, 4)))) + 8)),
     "descriptor.truncated", "strict", r"descriptor_length mismatch"),
    ("DIV-AXIS-DYNAMIC", "descriptor",
     lambda _: _enc(TensorDescriptor(0x10, (DYNAMIC_DIMENSION, 64), buffers=(BufferHandle(64), BufferHandle(4)),
                                     quantization=PerChannelAffine(0, 1, 0xFFFFFFFF, flags=1, scale_type_tag=F32))),
     "quantization.axis.dynamic", "strict", None),
    ("DIV-AXIS-DYNAMIC", "descriptor",
     lambda _: _enc(TensorDescriptor(0x43, (4, DYNAMIC_DIMENSION), buffers=(BufferHandle(64), BufferHandle(4)),
                                     quantization=Mxfp(1, 32, 1))),
     "quantization.axis.dynamic", "strict", None),
    ("DIV-QUANT-VALUES", "stream_decoded", lambda _: _quant_values("per_block")(None),
     "quantization.per_block.scale_values", "strict", None),
    ("DIV-QUANT-VALUES", "stream_decoded", lambda _: _quant_values("per_channel")(None),
     "quantization.per_channel.scale_values", "strict", None),
    ("DIV-QUANT-VALUES", "file_decoded", lambda p: _quant_values("nf4")(p), "quantization.nf4.absmax_values",
     "strict", None),
    ("DIV-QUANT-VALUES", "file_decoded", lambda p: _quant_values("mxfp")(p), "quantization.mxfp.scale_reserved",
     "strict", None),
    ("DIV-MXFP-MULTIPLE", "descriptor",
     lambda _: _enc(TensorDescriptor(0x43, (4, 40), buffers=(BufferHandle(80), BufferHandle(8)),
                                     quantization=Mxfp(1, 32, 1))),
     "quantization.mxfp.multiple", "strict", None),
    ("DIV-SYMIDX", "descriptor",
     lambda _: _enc(TensorDescriptor(0x48, (128, 128), buffers=(BufferHandle(8192), BufferHandle(512)),
                                     quantization=PerBlockAffine(1, 64, 1, zero_point_buffer_index=0, flags=1,
                                                                 scale_type_tag=0x01))),
     None, "strict", r"SYMMETRIC flag is set but"),
    ("DIV-PAGED-ENUM", "descriptor",
     lambda _: _enc(TensorDescriptor(0x01, (9, 2, 8), BlockPagedLayout(4, 3, 2, kv_role=0x11, layer_index=5),
                                     (BufferHandle(384), BufferHandle(12), BufferHandle(12)))),
     None, "strict", r"block-paged: unknown kv_role"),
    ("DIV-NEWFLAGS", "descriptor",
     lambda _: _patch(_newer_minor(_enc(dense((3, 4)))), _FLAGS, struct.pack("<I", 1 << 5)), None, "permissive",
     r"reserved flag bits set"),
    ("DIV-STREAM-ABORT", "stream_default",
     lambda _: _enc(TensorDescriptor(0x11, (2**48,), buffers=(BufferHandle(2**48),))) + bytes(64),
     "stream.truncated", "strict", ABORT),
    ("DIV-STREAM-ABORT", "stream_default",
     lambda _: _enc(head(0x03, 10**9, (4,))) + _enc(TensorDescriptor(F32, (4,), buffers=(BufferHandle(16),))) + bytes(16),
     "limit:max_composite_members", "strict", ABORT),
    ("DIV-NESTING", "stream", lambda _: _group_chain(9), "composite.nesting.depth", "strict", None),
    ("DIV-NESTING", "stream", lambda _: _group_chain(64), "composite.nesting.depth", "strict", None),
    ("DIV-NESTING", "file", lambda p: _group_chain_file(p, 9), "composite.nesting.depth", "strict", None),
    ("DIV-FILE-ABORT", "file", _huge_index, "file.index.truncated", "strict", ABORT),
    ("DIV-FILE-ABORT", "file", _huge_member_count, "limit:max_composite_members", "strict", ABORT),
    ("DIV-FILE-HEADER", "file", lambda p: _header_patched(p, "_reserved_header", "<B", 1), "file.header.reserved",
     "strict", None),
    ("DIV-FILE-HEADER", "file", lambda p: _header_patched(p, "data_buffer_alignment", "<I", 4096 + 64),
     "file.header.alignment", "strict", None),
    ("DIV-FILE-TRAILER", "file", lambda p: _trailer_patched(p, "_reserved", "<B", 1), "file.trailer.reserved",
     "strict", None),
    ("DIV-FILE-TRAILER", "file", _crc_without_flag, "file.index.crc_unset", "strict", None),
    ("DIV-FILE-INDEX", "file", lambda p: _index_patched(p, "flags", "<I", 1), "file.index.flags", "strict", None),
    ("DIV-FILE-INDEX", "file", lambda p: _index_patched(p, "descriptor_length", "<I", 64),
     "file.index.descriptor_length", "strict", None),
    ("DIV-FILE-INDEX", "file", _unsorted, "file.index.sorted", "strict", None),
    ("DIV-FILE-PLACEMENT", "file", lambda p: _index_patched(p, "data_length", "<Q", 17), "file.data.length",
     "strict", None),
    ("DIV-FILE-KV", "file", _kv_count_zero, "file.kv.truncated", "strict", None),
]


def _case_ids(cases) -> list[str]:
    """``DIV-X``, ``DIV-X.2``, ... : stable ids for the spec-map (independent of list order elsewhere)."""
    seen: dict[str, int] = {}
    out = []
    for c in cases:
        seen[c[0]] = seen.get(c[0], 0) + 1
        out.append(c[0] if seen[c[0]] == 1 else f"{c[0]}.{seen[c[0]]}")
    return out


@pytest.mark.parametrize("case", CASES, ids=_case_ids(CASES))
def test_divergence(case, ref, tmp_path):
    known_id, kind, build, our_rule, mode, theirs_expected = case
    known = KNOWN_BY_ID[known_id]
    data = build(tmp_path)
    if kind == "descriptor":
        ours = _ours(hs.decode_descriptor, data, mode=mode)
        theirs = ref.descriptor(data)
    elif kind == "stream_decoded":  # read, then every tensor's values decoded
        assert _ours(targets.run_read_stream, data, mode, "bare") is None  # the reader defers the check
        ours = _ours(_decode_stream, data, mode)
        theirs = ref.stream(data)
    elif kind == "file_decoded":
        path = targets.write_scratch(tmp_path / "case.hrry", data)
        assert _ours(targets.run_read_file, path, mode) is None
        ours = _ours(_decode_file, path, mode)
        theirs = ref.file(path)
    elif kind.startswith("stream"):
        ours = _ours(targets.run_read_stream, data, mode, "bare")
        theirs = ref.stream_default(data) if kind == "stream_default" else ref.stream(data)
    else:
        path = targets.write_scratch(tmp_path / "case.hrry", data)
        ours = _ours(targets.run_read_file, path, mode)
        theirs = ref.file(path)
    if known.kind == "pending" and not known.active():
        # the missing component has landed: we must now agree with pyhurray and reject
        assert ours is not None, f"{known.id}: the component is in, yet the input is accepted"
        return
    # our side
    if our_rule is None:
        assert ours is None, ours
    else:
        assert ours is not None and _our_rule(ours) == our_rule, ours
    # pyhurray's side
    if theirs_expected is None:
        assert theirs is None, theirs
    elif theirs_expected == ABORT:
        assert theirs == ABORT, theirs
    else:
        assert theirs is not None and theirs != ABORT and re.search(theirs_expected, theirs), theirs


def test_every_known_class_has_a_focused_case():
    assert {c[0] for c in CASES} == set(KNOWN_BY_ID)


def test_every_known_class_is_recorded_with_its_rule_ids():
    """spec-map.md's differential-run table has one row per class, and its Rule ids column
    names every rule id the class explains (the fuzz runs check each disagreement against it)."""
    assert set(DIVERGENCE_ROWS) == set(KNOWN_BY_ID)
    for k in KNOWN:
        assert {r.replace("limit:", "limit.") for r in k.ours} <= DIVERGENCE_ROWS[k.id], k.id
    for case in CASES:
        if case[3] is not None:
            assert case[3].replace("limit:", "limit.") in DIVERGENCE_ROWS[case[0]], case


def test_known_rule_ids_exist():
    import hurray_schema.rules.all_rules  # noqa: F401  (registers every rule)
    from hurray_schema.rules.engine import registry

    ids = {r.id for r in registry()}
    named = set().union(*(k.ours for k in KNOWN)) | {c[3] for c in CASES if c[3]}
    missing = {r for r in named if not r.startswith("limit:") and r != "composite" and r not in ids}
    assert not missing, f"rule ids in KNOWN/CASES that no rule declares: {sorted(missing)}"


@pytest.mark.parametrize("device_tag, sync_mode, ours_rule", [
    (0, 1, "buffer.sync_mode.cpu"), (0, 2, "buffer.sync_mode.cpu"), (1, 1, None), (1, 2, None), (2, 2, None),
    (1, 3, "buffer.sync_mode.reserved"),
])
def test_sync_mode_is_not_a_divergence(device_tag, sync_mode, ours_rule, ref):
    """pyhurray rejects sync_mode 1 and 2 only on CPU buffers -- as the spec does
    (buffer-protocol.md § Producer Requirement); on device buffers both sides accept them."""
    data = _enc(dense((3, 4), buffers=(BufferHandle(48, device_tag=device_tag, sync_mode=sync_mode),)))
    ours = _ours(hs.decode_descriptor, data)
    theirs = ref.descriptor(data)
    assert (None if ours is None else _our_rule(ours)) == ours_rule
    assert (theirs is None) == (ours_rule is None), theirs


@pytest.mark.parametrize("members, pattern", [
    ([((8, 4), (0, 0)), ((8, 4), (0, 0))], r"partition composite"),  # overlap and a gap
    ([((8, 4), (0, 0))], r"partition composite"),  # member_count 2, one member: torn / gap
    ([((8, 4), (0, 0)), ((8, 4), (0, 4))], None),  # exact cover
])
def test_composite_validation_agrees(members, pattern, ref):
    """Partition coverage in a bare stream: both sides reject (or accept) the same composites."""
    data = _enc(head(0x01, 2)) + b"".join(_shard_tensor(shape, (8, 8), offset) for shape, offset in members)
    ours = _ours(targets.run_read_stream, data, "strict", "bare")
    theirs = ref.stream(data)
    if pattern is None:
        assert ours is None and theirs is None, (ours, theirs)
    else:
        assert ours is not None, "our reader accepts a partition that does not cover its head"
        assert theirs is not None and theirs != ABORT, theirs
