"""convert of PyTorch Distributed Checkpoint folders: saved by two gloo processes with
torch.distributed.checkpoint.save (tests/support/dcp_checkpoint.py), checked against what
``dcp.load`` gives back in one process; faulty and hostile folders made from real ones by torch's
own pickle."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.cli import main
from hurray_schema.conversion.dcp_format import read_dcp
from hurray_schema.conversion.dcp_pickle import DcpError, RefusedGlobal
from hurray_schema.errors import HurraySchemaError, LimitExceeded, SpecViolation
from hurray_schema.limits import Limits

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex  # noqa: E402

from tests.support.dcp_checkpoint import NON_TENSORS, full_state, large_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint saved by two gloo processes (once per test session's worker)."""
    folder = tmp_path_factory.mktemp("dcp") / "checkpoint"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "tests.support.dcp_checkpoint", str(folder)], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=300)
    return folder


@pytest.fixture(scope="module")
def large_checkpoint(tmp_path_factory) -> Path:
    """The large checkpoint (``--large``: 5 MiB in two sharded tensors), saved by two gloo processes."""
    folder = tmp_path_factory.mktemp("dcp-large") / "checkpoint"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "tests.support.dcp_checkpoint", str(folder), "--large"], cwd=ROOT,
                   env=env, check=True, capture_output=True, timeout=300)
    return folder


@pytest.fixture(scope="module")
def loaded(checkpoint) -> dict:
    """What ``dcp.load`` reads back in one process into a plain state dict of whole tensors."""
    state = {name: torch.zeros_like(tensor) for name, tensor in full_state().items()}
    state.update({name: None for name in NON_TENSORS})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # one process, as asked
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    return state


def _metadata(folder: Path):
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)  # torch's own classes: the test trusts the folder it made


def _edited(checkpoint: Path, tmp_path: Path, edit) -> Path:
    """A copy of the checkpoint whose ``.metadata`` ``edit(metadata, folder)`` changed (pickled by torch)."""
    folder = tmp_path / "edited"
    shutil.copytree(checkpoint, folder)
    metadata = _metadata(folder)
    edit(metadata, folder)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return folder


def _rekey(metadata, name: str, old: tuple, new: tuple) -> None:
    """Move the record location of ``name``'s chunk at ``old`` to the offset ``new``."""
    key = next(k for k in metadata.storage_data if k.fqn == name and tuple(k.offset) == old)
    metadata.storage_data[MetadataIndex(name, list(new), key.index)] = metadata.storage_data.pop(key)


def _bits(array) -> np.ndarray:
    """The values' bytes, for an exact comparison (bfloat16 included)."""
    array = np.ascontiguousarray(array)
    return array.view(np.uint8)


def _torch_bits(tensor) -> np.ndarray:
    return tensor.contiguous().view(torch.uint8).numpy()


# --------------------------------------------------------------------------------------
# A checkpoint saved by two processes
# --------------------------------------------------------------------------------------


def test_every_tensor_is_what_dcp_loads(checkpoint, loaded, tmp_path):
    out = tmp_path / "model.hrry"
    report = hs.convert(checkpoint, out)
    assert hs.audit(out).findings == ()
    values = hs.load(out)
    assert sorted(values) == sorted(full_state())
    for name, tensor in full_state().items():
        got = np.asarray(values[name])
        assert got.shape == tuple(loaded[name].shape), name
        assert got.dtype.name == str(loaded[name].dtype).removeprefix("torch."), name
        assert np.array_equal(_bits(got), _torch_bits(loaded[name])), name
    assert {row.name: row.exact for row in report.tensors} == dict.fromkeys(full_state(), True)


def test_sharded_tensors_are_partitions_of_their_chunks(checkpoint, tmp_path):
    out = tmp_path / "model.hrry"
    hs.convert(checkpoint, out)
    saved = _metadata(checkpoint).state_dict_metadata
    with hs.read_file(out) as opened:
        for name in ("rows", "cols"):
            item = opened[name]
            assert isinstance(item, hs.Composite) and item.rule.name == "PARTITION"
            chunks = saved[name].chunks
            assert [m.descriptor.shard.shard_offset for m in item.members] == [tuple(c.offsets) for c in chunks]
            assert [m.shape for m in item.members] == [tuple(c.sizes) for c in chunks]
            assert all(m.descriptor.shard.parent_shape == tuple(saved[name].size) for m in item.members)
        for name in ("bias", "counts"):  # one chunk covering the tensor: a plain tensor
            assert not isinstance(opened[name], hs.Composite)
            assert opened[name].descriptor.shard is None


def test_non_tensor_entries_go_to_the_kv_section(checkpoint, loaded, tmp_path):
    out = tmp_path / "model.hrry"
    hs.convert(checkpoint, out)
    with hs.read_file(out) as opened:
        metadata = opened.metadata()
    assert metadata == {name: loaded[name] for name in NON_TENSORS}


def test_bfloat16_and_float32_members_keep_the_saved_bytes(checkpoint, loaded, tmp_path):
    out = tmp_path / "model.hrry"
    hs.convert(checkpoint, out)
    with hs.read_file(out) as opened:
        cols = opened["cols"]
        assert cols.dtype.name == "bfloat16"
        chunks = _metadata(checkpoint).state_dict_metadata["cols"].chunks
        for member, chunk in zip(cols.members, chunks):
            region = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))
            assert bytes(member.buffers[0]) == _torch_bits(loaded["cols"][region]).tobytes()


def test_cli_converts_a_folder(checkpoint, tmp_path):
    from click.testing import CliRunner

    out = tmp_path / "model.hrry"
    result = CliRunner().invoke(main, ["convert", str(checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    assert "partition(bfloat16)" in result.output and "(dcp)" in result.output
    assert hs.audit(out).findings == ()


def test_conversion_leaves_torch_unimported(checkpoint, tmp_path):
    out = tmp_path / "model.hrry"
    code = ("import sys, hurray_schema as hs; hs.convert(sys.argv[1], sys.argv[2]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    run = subprocess.run([sys.executable, "-c", code, str(checkpoint), str(out)], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    assert run.stdout.strip() == "[]"
    assert hs.audit(out).findings == ()


def test_replicated_chunks_are_stored_once(checkpoint, loaded, tmp_path):
    def duplicate(metadata, _folder):
        for name in ("bias", "rows"):
            chunks = metadata.state_dict_metadata[name].chunks
            chunks.append(ChunkStorageMetadata(chunks[0].offsets, chunks[0].sizes))

    folder = _edited(checkpoint, tmp_path, duplicate)
    out = tmp_path / "model.hrry"
    hs.convert(folder, out)
    with hs.read_file(out) as opened:
        assert not isinstance(opened["bias"], hs.Composite)
        assert len(opened["rows"].members) == 2
    assert np.array_equal(np.asarray(hs.load(out)["rows"]), loaded["rows"].numpy())


# --------------------------------------------------------------------------------------
# Chunks that do not tile their tensor
# --------------------------------------------------------------------------------------


def _gap(metadata, _folder):
    """The second chunk of "rows" moved down a row in a tensor grown by one: row 3 is no chunk's."""
    entry = metadata.state_dict_metadata["rows"]
    entry.chunks[1] = ChunkStorageMetadata(torch.Size([4, 0]), entry.chunks[1].sizes)
    entry.size = torch.Size([7, 4])
    _rekey(metadata, "rows", (3, 0), (4, 0))


def _overlap(metadata, _folder):
    """The second chunk of "rows" moved up a row in a tensor shrunk by one: row 2 is in both."""
    entry = metadata.state_dict_metadata["rows"]
    entry.chunks[1] = ChunkStorageMetadata(torch.Size([2, 0]), entry.chunks[1].sizes)
    entry.size = torch.Size([5, 4])
    _rekey(metadata, "rows", (3, 0), (2, 0))


@pytest.mark.parametrize("edit, rule", [(_gap, "composite.close.partition_gap"),
                                        (_overlap, "composite.close.partition_overlap")])
def test_chunks_that_do_not_tile_are_the_partition_rules_findings(checkpoint, tmp_path, edit, rule):
    folder = _edited(checkpoint, tmp_path, edit)
    out = tmp_path / "model.hrry"
    with pytest.raises(SpecViolation) as caught:
        hs.convert(folder, out)
    assert caught.value.rule_id == rule
    assert not out.exists()
    hs.convert(folder, out, validate=False)
    assert [finding.rule_id for finding in hs.audit(out).findings] == [rule]


def test_cli_no_validate_writes_what_audit_reports(checkpoint, tmp_path):
    from click.testing import CliRunner

    folder = _edited(checkpoint, tmp_path, _gap)
    out = tmp_path / "model.hrry"
    runner = CliRunner()
    refused = runner.invoke(main, ["convert", str(folder), str(out)])
    assert refused.exit_code == 2 and "composite.close.partition_gap" in refused.output and not out.exists()
    written = runner.invoke(main, ["convert", "--no-validate", str(folder), str(out)])
    assert written.exit_code == 0, written.output
    audited = runner.invoke(main, ["audit", str(out)])
    assert audited.exit_code != 0 and "composite.close.partition_gap" in audited.output


# --------------------------------------------------------------------------------------
# Hostile folders
# --------------------------------------------------------------------------------------


def test_a_metadata_pickle_naming_os_system_runs_nothing(checkpoint, tmp_path):
    folder = tmp_path / "hostile"
    shutil.copytree(checkpoint, folder)
    marker = tmp_path / "created-by-the-pickle"
    (folder / ".metadata").write_bytes(b"cos\nsystem\n(V touch " + str(marker).encode() + b"\ntR.")
    with pytest.raises(RefusedGlobal) as caught:
        hs.convert(folder, tmp_path / "out.hrry")
    assert caught.value.name == "os.system" and "os.system" in str(caught.value)
    assert not marker.exists()
    assert not (tmp_path / "out.hrry").exists()


def test_a_class_outside_the_allow_list_is_refused(checkpoint, tmp_path):
    import collections

    def smuggle(metadata, _folder):
        metadata.planner_data = collections.Counter("ab")

    folder = _edited(checkpoint, tmp_path, smuggle)
    with pytest.raises(RefusedGlobal, match="collections.Counter"):
        hs.convert(folder, tmp_path / "out.hrry")


def test_a_record_outside_the_allow_list_is_refused(checkpoint, tmp_path):
    """A record holding a torch Parameter (``torch._utils._rebuild_parameter``), saved by torch."""

    def point_bias_at_a_parameter(metadata, folder):
        with open(folder / "parameter.distcp", "wb") as f:
            torch.save(torch.nn.Parameter(torch.linspace(-1, 1, 5)), f)
        key = next(k for k in metadata.storage_data if k.fqn == "bias")
        info = metadata.storage_data[key]
        info.relative_path, info.offset, info.length = "parameter.distcp", 0, (folder / "parameter.distcp").stat().st_size

    folder = _edited(checkpoint, tmp_path, point_bias_at_a_parameter)
    with pytest.raises(RefusedGlobal, match="torch._utils._rebuild_parameter"):
        hs.convert(folder, tmp_path / "out.hrry")


def _record(metadata, name: str):
    return next(info for key, info in metadata.storage_data.items() if key.fqn == name)


def test_a_zip_record_claiming_a_huge_member_is_refused(checkpoint, tmp_path):
    def inflate(metadata, folder):
        info = _record(metadata, "bias")
        path = folder / info.relative_path
        data = bytearray(path.read_bytes())
        record = data[info.offset:info.offset + info.length]
        at = record.index(b"PK\x01\x02")  # the first entry of the zip directory
        while not record[at + 46:].startswith(b"archive/data/"):
            at = record.index(b"PK\x01\x02", at + 4)
        struct.pack_into("<II", record, at + 20, 0x7FFFFFFF, 0x7FFFFFFF)  # compressed and uncompressed size
        data[info.offset:info.offset + info.length] = record
        path.write_bytes(bytes(data))

    folder = _edited(checkpoint, tmp_path, inflate)
    with pytest.raises(DcpError, match="claims 2147483647 bytes"):
        hs.convert(folder, tmp_path / "out.hrry")


def test_a_chunk_past_its_file_is_refused(checkpoint, tmp_path):
    def stretch(metadata, folder):
        info = _record(metadata, "rows")
        info.length = (folder / info.relative_path).stat().st_size + 1

    folder = _edited(checkpoint, tmp_path, stretch)
    with pytest.raises(DcpError, match="ends past the file"):
        hs.convert(folder, tmp_path / "out.hrry")


@pytest.mark.parametrize("escape", ["../outside.distcp", "/{tmp}/outside.distcp"])
def test_a_relative_path_leaving_the_folder_is_refused(checkpoint, tmp_path, escape):
    def point_outside(metadata, folder):
        info = _record(metadata, "rows")
        shutil.copy(folder / info.relative_path, tmp_path / "outside.distcp")  # a real record, outside
        info.relative_path = escape.format(tmp=str(tmp_path).strip("/"))

    folder = _edited(checkpoint, tmp_path, point_outside)
    with pytest.raises(DcpError, match="inside the folder|leaves the checkpoint folder"):
        hs.convert(folder, tmp_path / "out.hrry")


def test_a_metadata_past_its_budget_is_not_read(checkpoint):
    size = (checkpoint / ".metadata").stat().st_size
    with pytest.raises(LimitExceeded) as caught:
        read_dcp(checkpoint, Limits(max_index_bytes=size - 1))
    assert caught.value.limit == "max_index_bytes"


def test_a_folder_without_metadata_is_a_typed_error(tmp_path):
    with pytest.raises(HurraySchemaError, match=".metadata"):
        hs.convert(tmp_path, tmp_path / "out.hrry")


def test_a_pickle_cannot_change_a_stand_in():
    """BUILD on an allowed callable (``torch.Size``) would set its attributes: refused, and the
    stand-in still works afterwards."""
    from hurray_schema.conversion.dcp_pickle import METADATA_GLOBALS, load_metadata

    hostile = b"\x80\x02ctorch\nSize\n}X\x05\x00\x00\x00checkK\x01sb."
    with pytest.raises(DcpError, match="cannot be given a state"):
        load_metadata(hostile, "hostile.metadata")
    assert METADATA_GLOBALS[("torch", "Size")]([2, 3]) == (2, 3)


def test_a_value_sharing_its_parts_at_every_level_is_refused():
    """Forty levels each holding the level below twice: a few hundred bytes of pickle, 2**40 nodes to walk."""
    from hurray_schema.conversion.dcp_pickle import load_value

    value: list = []
    for _ in range(40):
        value = [value, value]
    with pytest.raises(DcpError, match="nests deeper|shares more parts"):
        load_value(pickle.dumps(value, protocol=2), "shared.pkl")


BOX_SLACK = 1.05
"""A rank's box read fetches at most this many times the box's own bytes (issue #49)."""


def test_a_checkpoint_saved_two_ways_is_read_four_ways(large_checkpoint, tmp_path):
    """Each of 4 ranks reads its box of each tensor, along either dimension, fetching at most 5 %
    more than the box's own bytes once the file is open (a reader of its own per rank, reading by
    range: ``mmap=False``); the box equals the slice of what ``dcp.load`` returns."""
    from hurray_schema.io import source as sources

    out = tmp_path / "large.hrry"
    hs.convert(large_checkpoint, out)
    state = {name: torch.zeros_like(tensor) for name, tensor in large_state().items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(large_checkpoint), no_dist=True)
    for name, tensor in state.items():
        whole = _torch_bits(tensor)
        for dim in (0, 1):
            for rank, expected in enumerate(np.array_split(whole, 4, axis=dim)):
                with hs.read_file(out, mmap=False) as f:
                    opened = f.bytes_fetched
                    assert opened <= f.size - sum(e.data_length for e in f.entries()) + sources.tail_bytes(
                        f.size, sources.DEFAULT_BLOCK_SIZE)
                    got = np.asarray(f.shard(name, rank=rank, of=4, dim=dim))
                    assert f.bytes_fetched - opened <= BOX_SLACK * got.nbytes, (name, dim, rank)
                assert np.array_equal(_bits(got), expected), (name, dim, rank)
