"""convert into PyTorch Distributed Checkpoint folders (``to="dcp"``): what is written is loaded by
``torch.distributed.checkpoint.load`` itself, in one process and in two gloo processes (resharded
into DTensors), compared with what ``dcp.save`` writes for the same state dict, and read back by our
own ``read_dcp``."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.cli import main
from hurray_schema.conversion.dcp_format import read_dcp
from hurray_schema.errors import HurraySchemaError

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from tests.support.dcp_checkpoint import NON_TENSORS, full_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _spawn(*args) -> None:
    subprocess.run([sys.executable, "-m", "tests.support.dcp_checkpoint", *map(str, args)], cwd=ROOT, env=ENV,
                   check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint saved by two gloo processes."""
    folder = tmp_path_factory.mktemp("dcp") / "checkpoint"
    _spawn(folder)
    return folder


def _load_whole(folder, like: dict, values=()) -> dict:
    """``dcp.load`` in one process into whole tensors shaped as ``like`` (and the non-tensor ``values``)."""
    state = {name: torch.zeros_like(tensor) for name, tensor in like.items()}
    state.update({name: None for name in values})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # one process, as asked
        dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state


def _torch_bits(tensor) -> np.ndarray:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def _as_torch(array: np.ndarray):
    """A torch tensor of the same bits (bfloat16 and float8 through their integer views)."""
    array = np.ascontiguousarray(array)
    names = {ml_dtypes.bfloat16: torch.bfloat16, ml_dtypes.float8_e4m3fn: torch.float8_e4m3fn,
             ml_dtypes.float8_e5m2: torch.float8_e5m2}
    for np_type, torch_type in names.items():
        if array.dtype == np.dtype(np_type):
            return torch.from_numpy(array.view(np.uint8 if array.itemsize == 1 else np.uint16).copy()).view(torch_type)
    return torch.from_numpy(array.copy())


# --------------------------------------------------------------------------------------
# (a) a checkpoint in, then out: dcp.load gives the original back
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def round_trip(checkpoint, tmp_path_factory) -> Path:
    """The two-process checkpoint converted into Hurray, then out again as a DCP folder."""
    folder = tmp_path_factory.mktemp("out")
    hs.convert(checkpoint, folder / "model.hrry")
    hs.convert(folder / "model.hrry", folder / "checkpoint", to="dcp")
    return folder / "checkpoint"


def test_a_checkpoint_in_and_out_loads_bit_for_bit(round_trip):
    state = _load_whole(round_trip, full_state(), NON_TENSORS)
    for name, tensor in full_state().items():
        assert state[name].dtype == tensor.dtype, name
        assert np.array_equal(_torch_bits(state[name]), _torch_bits(tensor)), name
    assert {name: state[name] for name in NON_TENSORS} == NON_TENSORS


def test_the_chunks_are_the_partition_members(round_trip, checkpoint):
    with open(round_trip / ".metadata", "rb") as f:
        ours = pickle.load(f)  # torch's own classes: the test trusts torch's unpickler
    with open(checkpoint / ".metadata", "rb") as f:
        saved = pickle.load(f)
    assert ours.state_dict_metadata == saved.state_dict_metadata
    assert ours.planner_data == saved.planner_data
    assert sorted(os.listdir(round_trip)) == [".metadata", "__0_0.distcp"]


# --------------------------------------------------------------------------------------
# What torch itself writes for the same state dict
# --------------------------------------------------------------------------------------


def test_the_folder_is_what_dcp_save_writes(tmp_path):
    """One process's ``dcp.save`` of plain tensors and values, and the same state converted from
    Hurray: the same ``.distcp`` bytes, and ``.metadata`` the bytes torch pickles for its own
    Metadata once the folder and save id (which differ) are the same."""
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 3, "flags": torch.tensor([True, False, True]),
             "h": (torch.arange(6) - 2).to(torch.bfloat16), "u": torch.arange(5, dtype=torch.int32).to(torch.uint16),
             "e": torch.zeros(0, 3), "step": 3, "name": "x", "raw": b"\x00\xff"}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, checkpoint_id=str(tmp_path / "torch"), no_dist=True)
    arrays = {"w": state["w"].numpy(), "flags": state["flags"].numpy(),
              "h": state["h"].view(torch.uint16).numpy().view(ml_dtypes.bfloat16), "u": state["u"].numpy(),
              "e": state["e"].numpy()}
    hs.save(tmp_path / "state.hrry", arrays, metadata={"step": 3, "name": "x", "raw": b"\x00\xff"})
    hs.convert(tmp_path / "state.hrry", tmp_path / "ours", to="dcp")
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "torch"))
    assert (tmp_path / "ours" / "__0_0.distcp").read_bytes() == (tmp_path / "torch" / "__0_0.distcp").read_bytes()
    torch_bytes = (tmp_path / "torch" / ".metadata").read_bytes()
    ours_bytes = (tmp_path / "ours" / ".metadata").read_bytes()
    theirs, ours = pickle.loads(torch_bytes), pickle.loads(ours_bytes)
    assert pickle.dumps(theirs, protocol=4) == torch_bytes  # pickling torch's object again gives its bytes
    assert list(ours.storage_data.items()) == list(theirs.storage_data.items())
    assert ours.state_dict_metadata == theirs.state_dict_metadata and ours.planner_data == theirs.planner_data
    assert ours.version == theirs.version and ours.storage_meta.checkpoint_id == tmp_path / "ours"
    theirs.storage_meta = ours.storage_meta
    assert pickle.dumps(theirs, protocol=4) == ours_bytes


# --------------------------------------------------------------------------------------
# (b) two processes load a checkpoint written in three members into DTensors Shard(0)
# --------------------------------------------------------------------------------------

RESHARDED = {"rows": (3, None), "mask": (3, None), "cols": (None, (1, 3)), "bias": (None, None)}
"""Each tensor of :func:`full_state` as written: a partition of 3 row bands, of 3 column bands, or whole."""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The local shards two gloo processes load from a folder written with 3 members a tensor on 3 ranks."""
    folder = tmp_path_factory.mktemp("resharded")
    full = full_state()
    arrays = {}
    for name, (rows, grid) in RESHARDED.items():
        array = _numpy(full[name])
        arrays[name] = hs.partition(array, grid=rows or grid) if rows or grid else array
    hs.save(folder / "model.hrry", arrays)
    report = hs.convert(folder / "model.hrry", folder / "checkpoint", to="dcp", ranks=3)
    assert [row.type_out.endswith("(3 chunks)") for row in report.tensors] == [True, True, True, False]
    spec = {name: [list(full[name].shape), str(full[name].dtype).removeprefix("torch.")] for name in RESHARDED}
    (folder / "spec.json").write_text(json.dumps(spec))
    _spawn("load", folder / "checkpoint", folder / "spec.json", folder)
    return folder


def _numpy(tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def test_two_processes_load_their_shards_resharded(two_ranks):
    assert sorted(os.listdir(two_ranks / "checkpoint")) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                            "__2_0.distcp"]
    full = full_state()
    shards = [torch.load(two_ranks / f"rank{rank}.pt") for rank in range(2)]
    for name in RESHARDED:
        expected = torch.chunk(full[name], 2, dim=0)  # Shard(0)'s split of 2 ranks
        for rank in range(2):
            got = shards[rank][name]
            assert got.dtype == full[name].dtype and got.shape == expected[rank].shape, (name, rank)
            assert np.array_equal(_torch_bits(got), _torch_bits(expected[rank])), (name, rank)


# --------------------------------------------------------------------------------------
# (c) partitions of uneven grids, several dtypes
# --------------------------------------------------------------------------------------

_rng = np.random.default_rng(49)
UNEVEN = {
    "f32": (_rng.standard_normal((7, 5)).astype(np.float32), (3, 2)),
    "bf16": (_rng.standard_normal((5, 9)).astype(ml_dtypes.bfloat16), (2, 4)),
    "mask": (_rng.random((11, 3)) < 0.4, (4, 1)),
    "f16": (_rng.standard_normal(13).astype(np.float16), (5,)),
    "i8": (_rng.integers(-128, 128, (3, 4, 5)).astype(np.int8), (2, 1, 3)),
    "u16": (_rng.integers(0, 65536, (6, 2)).astype(np.uint16), (4, 1)),
    "f8": (_rng.standard_normal((4, 6)).astype(ml_dtypes.float8_e4m3fn), (3, 2)),
    "whole": (np.arange(10, dtype=np.int64), None),
}


@pytest.mark.parametrize("ranks", [1, 2])
def test_uneven_partitions_of_several_dtypes_load_back(tmp_path, ranks):
    arrays = {name: hs.partition(array, grid=grid) if grid else array for name, (array, grid) in UNEVEN.items()}
    hs.save(tmp_path / "parts.hrry", arrays, metadata={"epoch": 4, "tags": ["a", "b"]})
    hs.convert(tmp_path / "parts.hrry", tmp_path / "checkpoint", to="dcp", ranks=ranks)
    like = {name: _as_torch(array) for name, (array, _grid) in UNEVEN.items()}
    state = _load_whole(tmp_path / "checkpoint", like, ("epoch", "tags"))
    for name, tensor in like.items():
        assert state[name].dtype == tensor.dtype, name
        assert np.array_equal(_torch_bits(state[name]), _torch_bits(tensor)), name
    assert state["epoch"] == 4 and state["tags"] == ["a", "b"]
    with open(tmp_path / "checkpoint" / ".metadata", "rb") as f:
        saved = pickle.load(f)
    chunks = saved.state_dict_metadata["bf16"].chunks
    with hs.read_file(tmp_path / "parts.hrry") as opened:
        members = opened["bf16"].members
        assert [tuple(c.offsets) for c in chunks] == [m.descriptor.shard.shard_offset for m in members]
        assert [tuple(c.sizes) for c in chunks] == [m.shape for m in members]
    files = {info.relative_path for info in saved.storage_data.values()}
    assert files == {f"__{rank}_0.distcp" for rank in range(ranks)}


def test_a_quantized_member_is_written_as_its_decoded_values(tmp_path):
    array = _rng.standard_normal((8, 64)).astype(np.float32)
    quantized = hs.partition(array, grid=2, member=lambda a: hs.quantize(a, "per_block"))
    hs.save(tmp_path / "q.hrry", {"q": quantized})
    report = hs.convert(tmp_path / "q.hrry", tmp_path / "checkpoint", to="dcp")
    assert "decoded values" in report.tensors[0].note
    expected = np.asarray(hs.load(tmp_path / "q.hrry")["q"])
    state = _load_whole(tmp_path / "checkpoint", {"q": torch.zeros(8, 64)})
    assert np.array_equal(state["q"].numpy(), expected)


# --------------------------------------------------------------------------------------
# (d) our own reader reads the folder back
# --------------------------------------------------------------------------------------


def test_read_dcp_reads_the_output_back(tmp_path):
    arrays = {name: hs.partition(array, grid=grid) if grid else array for name, (array, grid) in UNEVEN.items()}
    hs.save(tmp_path / "parts.hrry", arrays, metadata={"epoch": 4, "note": "kept"})
    hs.convert(tmp_path / "parts.hrry", tmp_path / "checkpoint", to="dcp", ranks=3)
    kv, sources, _maps = read_dcp(tmp_path / "checkpoint")
    assert kv == {"epoch": 4, "note": "kept"}
    assert [s.name for s in sources] == list(UNEVEN)
    hs.convert(tmp_path / "checkpoint", tmp_path / "back.hrry")
    back = hs.load(tmp_path / "back.hrry")
    for name, (array, _grid) in UNEVEN.items():
        got = np.asarray(back[name])
        assert got.dtype == array.dtype and np.array_equal(got.view(np.uint8), np.ascontiguousarray(array).view(np.uint8))
    with hs.read_file(tmp_path / "back.hrry") as opened, hs.read_file(tmp_path / "parts.hrry") as original:
        assert [m.descriptor.shard for m in opened["f32"].members] == \
            [m.descriptor.shard for m in original["f32"].members]
        assert opened.metadata() == {"epoch": 4, "note": "kept"}


# --------------------------------------------------------------------------------------
# The CLI, and torch never imported
# --------------------------------------------------------------------------------------


def test_cli_writes_a_checkpoint_over_ranks(tmp_path):
    from click.testing import CliRunner

    hs.save(tmp_path / "m.hrry", {"w": hs.partition(np.arange(12, dtype=np.float32).reshape(6, 2), grid=3)})
    result = CliRunner().invoke(main, ["convert", "--to", "dcp", "--ranks", "2", str(tmp_path / "m.hrry"),
                                       str(tmp_path / "checkpoint")])
    assert result.exit_code == 0, result.output
    assert "torch.float32 (3 chunks)" in result.output and "(dcp)" in result.output
    assert sorted(os.listdir(tmp_path / "checkpoint")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    state = _load_whole(tmp_path / "checkpoint", {"w": torch.zeros(6, 2)})
    assert torch.equal(state["w"], torch.arange(12, dtype=torch.float32).reshape(6, 2))


def test_converting_out_leaves_torch_unimported(tmp_path):
    hs.save(tmp_path / "m.hrry", {"w": hs.partition(np.ones((4, 4), np.float32), grid=2)}, metadata={"step": 1})
    code = ("import sys, hurray_schema as hs; hs.convert(sys.argv[1], sys.argv[2], to='dcp'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.hrry"), str(tmp_path / "checkpoint")],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, check=True)
    assert run.stdout.strip() == "[]"
    assert _load_whole(tmp_path / "checkpoint", {"w": torch.zeros(4, 4)}, ("step",))["step"] == 1


# --------------------------------------------------------------------------------------
# (e) refusals: typed errors, nothing written
# --------------------------------------------------------------------------------------


def _refused(tmp_path, src, dst, **options) -> HurraySchemaError:
    before = sorted(os.listdir(Path(dst).parent))
    with pytest.raises(HurraySchemaError) as caught:
        hs.convert(src, dst, to="dcp", **options)
    assert sorted(os.listdir(Path(dst).parent)) == before  # no folder, no temporary left behind
    return caught.value


def test_a_type_torch_lacks_is_refused(tmp_path):
    hs.save(tmp_path / "i4.hrry", {"codes": np.arange(-4, 4).astype(ml_dtypes.int4)})
    error = _refused(tmp_path, tmp_path / "i4.hrry", tmp_path / "checkpoint")
    assert "'codes'" in str(error) and "int4" in str(error)


def test_a_kv_key_naming_an_array_is_refused(tmp_path):
    hs.save(tmp_path / "clash.hrry", {"w": np.zeros(3, np.float32)}, metadata={"w": 1})
    assert "'w'" in str(_refused(tmp_path, tmp_path / "clash.hrry", tmp_path / "checkpoint"))


@pytest.mark.parametrize("ranks", [0, -1, True, 1.5])
def test_ranks_must_be_a_positive_count(tmp_path, ranks):
    hs.save(tmp_path / "m.hrry", {"w": np.zeros(3, np.float32)})
    assert "ranks" in str(_refused(tmp_path, tmp_path / "m.hrry", tmp_path / "checkpoint", ranks=ranks))


def test_an_existing_folder_is_not_replaced(tmp_path):
    hs.save(tmp_path / "m.hrry", {"w": np.zeros(3, np.float32)})
    existing = tmp_path / "checkpoint"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(HurraySchemaError, match="not replaced"):
        hs.convert(tmp_path / "m.hrry", existing, to="dcp")
    assert os.listdir(existing) == ["keep.txt"] and (existing / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "m.hrry"]


def test_only_a_hurray_file_converts_into_dcp(checkpoint, tmp_path):
    with pytest.raises(HurraySchemaError, match="dcp -> dcp is not a conversion"):
        hs.convert(checkpoint, tmp_path / "again", to="dcp")
    with pytest.raises(HurraySchemaError, match="ranks applies"):
        hs.convert(checkpoint, tmp_path / "m.hrry", ranks=2)
    assert os.listdir(tmp_path) == []
