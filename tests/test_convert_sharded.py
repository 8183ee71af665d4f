"""convert: Hugging Face model folders (safetensors shards and model.safetensors.index.json) into
Hurray and back.

The folders are made by transformers itself (``save_pretrained`` of a tiny Llama whose output
embedding is tied to its input embedding, cut into four shards or more), in float32 and bfloat16.
What the converted file holds is compared byte for byte with the state dict transformers loads
from the folder; the folder written back is loaded by transformers (``from_pretrained``) and by
huggingface_hub's own loaders, and its shards are compared with huggingface_hub's own cut.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, LimitExceeded

pytest.importorskip("safetensors", reason="the safetensors extra is not installed")
torch = pytest.importorskip("torch", reason="torch (test extra) is not installed")
transformers = pytest.importorskip("transformers", reason="transformers (test extra) is not installed")
huggingface_hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub (with transformers) is not installed")

import ml_dtypes  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from hurray_schema.conversion.into_folder import cut_into_shards, parse_shard_size  # noqa: E402

INDEX = "model.safetensors.index.json"
SHARD_SIZES = {"float32": "20KB", "bfloat16": "8KB"}
"""max_shard_size of save_pretrained and of the conversion back: four shards or more of the tiny model."""


# --------------------------------------------------------------------------------------
# Fixtures: folders transformers writes
# --------------------------------------------------------------------------------------


def tiny_llama(dtype: str):
    """A tiny Llama with tied word embeddings, weights from a fixed seed, in ``dtype``."""
    torch.manual_seed(49)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def folder(request, tmp_path_factory):
    """A folder transformers saved, sharded (four shards or more)."""
    path = tmp_path_factory.mktemp(f"llama-{request.param}") / "saved"
    tiny_llama(request.param).save_pretrained(path, max_shard_size=SHARD_SIZES[request.param])
    shards = [name for name in os.listdir(path) if name.endswith(".safetensors")]
    assert len(shards) >= 4 and (path / INDEX).is_file()
    return path


def from_pretrained(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def loaded(folder):
    """The model transformers loads from the folder."""
    return from_pretrained(folder)


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    """The folder converted into one Hurray file."""
    dst = tmp_path_factory.mktemp("converted") / "model.hrry"
    hs.convert(folder, dst)
    return dst


def raw_torch(tensor) -> np.ndarray:
    """A torch tensor's bytes."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def raw_numpy(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


NUMPY_OF_TORCH = {torch.float32: np.dtype(np.float32), torch.bfloat16: np.dtype(ml_dtypes.bfloat16)}


def stored_for(name: str, arrays: dict, metadata: dict) -> np.ndarray:
    """The array the Hurray file holds for ``name``: its own, or the one it is tied to."""
    return arrays[name] if name in arrays else arrays[metadata[f"hf.tied.{name}"]]


def assert_state_dicts_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype and actual[name].shape == tensor.shape, name
        assert np.array_equal(raw_torch(actual[name]), raw_torch(tensor)), name


# --------------------------------------------------------------------------------------
# Folder -> Hurray
# --------------------------------------------------------------------------------------


def test_every_tensor_equals_what_transformers_loads(converted, loaded, folder):
    arrays = hs.load(converted)
    with hs.read_file(converted) as f:
        metadata = f.metadata()
    state = loaded.state_dict()
    ties = loaded.all_tied_weights_keys  # transformers' own {tied copy: source}
    assert ties == {"lm_head.weight": "model.embed_tokens.weight"}
    for name, tensor in state.items():
        array = stored_for(name, arrays, metadata)
        assert array.dtype == NUMPY_OF_TORCH[tensor.dtype] and array.shape == tuple(tensor.shape), name
        assert np.array_equal(raw_numpy(array), raw_torch(tensor)), name
    # the tied copy stored once, its tie in the metadata
    assert set(arrays) == set(state) - set(ties)
    assert {k[len("hf.tied."):]: v for k, v in metadata.items() if k.startswith("hf.tied.")} == ties
    index = json.loads((folder / INDEX).read_text())
    assert {k[len("hf.index."):]: v for k, v in metadata.items() if k.startswith("hf.index.")} == index["metadata"]
    assert metadata["hf.file.config.json"] == (folder / "config.json").read_text()
    assert metadata["hf.file.generation_config.json"] == (folder / "generation_config.json").read_text()
    with __import__("safetensors").safe_open(str(folder / next(iter(index["weight_map"].values()))), "np") as shard:
        assert {k: metadata[k] for k in shard.metadata()} == shard.metadata()  # {"format": "pt"}
    assert list(hs.audit(str(converted)).findings) == []


def test_the_index_file_names_the_same_folder(folder, converted, tmp_path):
    dst = tmp_path / "from-index.hrry"
    report = hs.convert(folder / INDEX, dst)
    assert report.source_format == "hf" and all(row.exact for row in report.tensors)
    again, first = hs.load(dst), hs.load(converted)
    assert again.keys() == first.keys()
    for name, array in first.items():
        assert np.array_equal(raw_numpy(again[name]), raw_numpy(array)), name


# --------------------------------------------------------------------------------------
# Hurray -> folder
# --------------------------------------------------------------------------------------


def test_folder_written_back_loads_in_transformers(converted, loaded, folder, tmp_path):
    dtype = str(loaded.dtype).split(".")[1]
    out = tmp_path / "back"
    report = hs.convert(converted, out, max_shard_size=SHARD_SIZES[dtype])
    assert report.destination_format == "hf"
    again = from_pretrained(out)
    assert again.dtype == loaded.dtype
    assert_state_dicts_equal(again.state_dict(), loaded.state_dict())
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()  # tied again
    assert json.loads((out / "config.json").read_text()) == json.loads((folder / "config.json").read_text())


def test_shards_are_cut_as_huggingface_hub_cuts_them(converted, loaded, tmp_path):
    dtype = str(loaded.dtype).split(".")[1]
    out = tmp_path / "back"
    hs.convert(converted, out, max_shard_size=SHARD_SIZES[dtype])
    with hs.read_file(converted) as f:
        order = list(f.keys())
    state = loaded.state_dict()
    split = huggingface_hub.split_torch_state_dict_into_shards({name: state[name] for name in order},
                                                               max_shard_size=SHARD_SIZES[dtype])
    index = json.loads((out / INDEX).read_text())
    assert len(split.filename_to_tensors) >= 4
    assert index["weight_map"] == split.tensor_to_filename
    assert index["metadata"]["total_size"] == split.metadata["total_size"]
    assert sorted(n for n in os.listdir(out) if n.endswith(".safetensors")) == sorted(split.filename_to_tensors)
    for filename, names in split.filename_to_tensors.items():
        shard = huggingface_hub.load_state_dict_from_file(out / filename)
        assert set(shard) == set(names)
        assert_state_dicts_equal(shard, {name: state[name] for name in names})


def test_huggingface_hub_loads_the_folder_into_a_model(converted, loaded, tmp_path):
    out = tmp_path / "back"
    hs.convert(converted, out, to="hf", max_shard_size="30KB")
    fresh = transformers.LlamaForCausalLM(loaded.config).to(loaded.dtype)
    result = huggingface_hub.load_torch_model(fresh, out, strict=False)
    assert set(result.missing_keys) == set(loaded.all_tied_weights_keys) and not result.unexpected_keys
    assert_state_dicts_equal(fresh.state_dict(), loaded.state_dict())


def test_one_shard_is_model_safetensors_and_converts_back(converted, loaded, tmp_path):
    out = tmp_path / "single"
    hs.convert(converted, out, max_shard_size="5GB")
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert_state_dicts_equal(from_pretrained(out).state_dict(), loaded.state_dict())
    again = tmp_path / "single.hrry"
    hs.convert(out, again)
    for name, array in hs.load(converted).items():
        assert np.array_equal(raw_numpy(hs.load(again)[name]), raw_numpy(array)), name


@pytest.mark.parametrize("value", ["5GB", "2GB", "20KB", "1.5MB", " 10 MB", "3tb", "12345"])
def test_shard_sizes_read_as_huggingface_hub_reads_them(value):
    from huggingface_hub.serialization._base import parse_size_to_int

    expected = int(value) if value.isdigit() else parse_size_to_int(value)
    assert parse_shard_size(value) == expected


def test_cut_matches_huggingface_hubs_factory_on_random_sizes():
    from huggingface_hub.serialization import split_state_dict_into_shards_factory

    rng = np.random.default_rng(49)
    for _ in range(50):
        sizes = [int(s) for s in rng.integers(1, 400, int(rng.integers(1, 30)))]
        limit = int(rng.integers(50, 500))
        split = split_state_dict_into_shards_factory({f"t{i}": size for i, size in enumerate(sizes)},
                                                     get_storage_size=lambda size: size, max_shard_size=limit,
                                                     filename_pattern="m{suffix}")
        ours = [[f"t{i}" for i in shard] for shard in cut_into_shards(sizes, limit)]
        assert ours == list(split.filename_to_tensors.values())


# --------------------------------------------------------------------------------------
# Hostile folders: a typed error, nothing written
# --------------------------------------------------------------------------------------


@pytest.fixture
def damaged(folder, tmp_path):
    """A copy of the folder to damage; the destination beside it."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    return copy


def weight_map_of(path) -> dict:
    return json.loads((path / INDEX).read_text())["weight_map"]


def rewrite_index(path, weight_map: dict) -> None:
    index = json.loads((path / INDEX).read_text())
    index["weight_map"] = weight_map
    (path / INDEX).write_text(json.dumps(index))


def assert_refused(src, dst, match: str) -> None:
    before = set(os.listdir(dst.parent))
    with pytest.raises(HurraySchemaError, match=match):
        hs.convert(src, dst)
    assert not dst.exists() and set(os.listdir(dst.parent)) == before


def test_shard_above_the_folder_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    shard = weight_map["model.norm.weight"]
    shutil.copy(damaged / shard, tmp_path / "x.safetensors")  # it would be readable
    weight_map["model.norm.weight"] = "../x.safetensors"
    rewrite_index(damaged, weight_map)
    assert_refused(damaged, tmp_path / "out.hrry", r"'\.\./x\.safetensors' is not a path inside")


def test_absolute_shard_path_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    weight_map["model.norm.weight"] = str(damaged / weight_map["model.norm.weight"])  # even inside the folder
    rewrite_index(damaged, weight_map)
    assert_refused(damaged, tmp_path / "out.hrry", "is not a path inside")


def test_shard_linked_outside_the_folder_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    shard = weight_map["model.norm.weight"]
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(damaged / shard, outside)
    (damaged / shard).symlink_to(outside)
    assert_refused(damaged, tmp_path / "out.hrry", f"shard '{shard}' leads outside the folder")


def test_shard_that_is_no_safetensors_file_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    shard = weight_map["model.norm.weight"]
    os.rename(damaged / shard, damaged / "pytorch_model.bin")
    weight_map = {name: ("pytorch_model.bin" if file == shard else file) for name, file in weight_map.items()}
    rewrite_index(damaged, weight_map)
    assert_refused(damaged, tmp_path / "out.hrry", "'pytorch_model.bin' is not a .safetensors file")


def test_malformed_config_is_refused(damaged, tmp_path):
    (damaged / "config.json").write_text('{"tie_word_embeddings": tru')
    assert_refused(damaged, tmp_path / "out.hrry", "config.json: not a JSON document")


def test_tensor_missing_from_its_shard_is_refused(damaged, tmp_path):
    shard = weight_map_of(damaged)["model.norm.weight"]
    tensors = load_file(str(damaged / shard))
    del tensors["model.norm.weight"]
    save_file(tensors, str(damaged / shard), metadata={"format": "pt"})
    assert_refused(damaged, tmp_path / "out.hrry", f"'model.norm.weight' is missing from its shard {shard}")


def test_missing_shard_file_is_refused(damaged, tmp_path):
    shard = weight_map_of(damaged)["model.norm.weight"]
    os.remove(damaged / shard)
    assert_refused(damaged, tmp_path / "out.hrry", f"shard '{shard}' is missing")


def test_weight_in_two_shards_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    first, second = weight_map["model.embed_tokens.weight"], weight_map["model.norm.weight"]
    assert first != second
    tensors = load_file(str(damaged / second))
    tensors["model.embed_tokens.weight"] = load_file(str(damaged / first))["model.embed_tokens.weight"]
    save_file(tensors, str(damaged / second), metadata={"format": "pt"})
    with pytest.raises(HurraySchemaError, match="'model.embed_tokens.weight' is in two files") as raised:
        hs.convert(damaged, tmp_path / "out.hrry")
    assert first in str(raised.value) and second in str(raised.value)
    assert not (tmp_path / "out.hrry").exists()


def test_weight_named_twice_by_the_index_is_refused(damaged, tmp_path):
    text = (damaged / INDEX).read_text()
    weight_map = weight_map_of(damaged)
    line = f'"model.norm.weight": "{weight_map["model.norm.weight"]}"'
    assert line in text
    repeated = f'{line},\n    "model.norm.weight": "model-00001-of-elsewhere.safetensors"'
    (damaged / INDEX).write_text(text.replace(line, repeated))
    assert_refused(damaged, tmp_path / "out.hrry", "'model.norm.weight' is given twice")


def test_tensor_no_index_entry_names_is_refused(damaged, tmp_path):
    weight_map = weight_map_of(damaged)
    del weight_map["model.norm.weight"]
    rewrite_index(damaged, weight_map)
    assert_refused(damaged, tmp_path / "out.hrry", "'model.norm.weight' of .* is not in the weight_map")


@pytest.mark.parametrize("text", ['{"weight_map": {"a": "model-00001', "[1, 2]", '{"weight_map": {"a": 7}}',
                                  '{"weight_map": {}}', "\xff\xfe", "[" * 100000 + "]" * 100000])
def test_malformed_index_is_refused(damaged, tmp_path, text):
    (damaged / INDEX).write_bytes(text.encode("latin-1"))
    assert_refused(damaged, tmp_path / "out.hrry", INDEX)


def test_huge_index_is_refused_without_reading_it(damaged, tmp_path):
    with open(damaged / INDEX, "r+b") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that is never read
    with pytest.raises(LimitExceeded, match=INDEX):
        hs.convert(damaged, tmp_path / "out.hrry")
    assert not (tmp_path / "out.hrry").exists()


def test_endless_index_is_refused(tmp_path):
    endless = tmp_path / "model.safetensors.index.json"
    endless.symlink_to("/dev/zero")
    assert_refused(endless, tmp_path / "out.hrry", "not a regular file")


def test_refused_folder_leaves_the_previous_output(damaged, tmp_path):
    dst = tmp_path / "out.hrry"
    hs.convert(damaged, dst)
    before = dst.read_bytes()
    os.remove(damaged / weight_map_of(damaged)["model.norm.weight"])
    with pytest.raises(HurraySchemaError):
        hs.convert(damaged, dst)
    assert dst.read_bytes() == before


# --------------------------------------------------------------------------------------
# Hurray -> folder refusals
# --------------------------------------------------------------------------------------


def test_existing_folder_with_files_is_not_replaced(converted, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(HurraySchemaError, match="exists"):
        hs.convert(converted, out, max_shard_size="20KB")
    assert os.listdir(out) == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["taken"]


def test_empty_existing_folder_is_filled(converted, loaded, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    hs.convert(converted, out)  # an existing folder is a folder output
    assert_state_dicts_equal(from_pretrained(out).state_dict(), loaded.state_dict())


@pytest.mark.parametrize("metadata, match", [
    ({"hf.tied.lm_head.weight": "nowhere"}, "not a tensor of the file"),
    ({"hf.file.../escape.json": "{}"}, "names no file"),
    ({"hf.file.sub/config.json": "{}"}, "names no file"),
    ({"hf.file.model-00001-of-00002.safetensors": "x"}, "names no file"),
])
def test_metadata_that_would_write_wrongly_is_refused(tmp_path, metadata, match):
    src = tmp_path / "in.hrry"
    hs.save(src, {"w": np.ones((2, 3), np.float32)}, metadata=metadata)
    dst = tmp_path / "out"
    with pytest.raises(HurraySchemaError, match=match):
        hs.convert(src, dst, to="hf")
    assert sorted(os.listdir(tmp_path)) == ["in.hrry"]


def test_hurray_without_hf_metadata_writes_a_folder_hub_loads(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {f"layer{i}.weight": rng.standard_normal((16, 16)).astype(np.float32) for i in range(5)}
    src, out = tmp_path / "plain.hrry", tmp_path / "plain"
    hs.save(src, arrays, metadata={"author": "test"})
    hs.convert(src, out, max_shard_size=2048)
    assert sorted(os.listdir(out)) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + [INDEX]
    for filename in set(weight_map_of(out).values()):
        shard = huggingface_hub.load_state_dict_from_file(out / filename)
        for name, tensor in shard.items():
            assert np.array_equal(raw_torch(tensor), raw_numpy(arrays[name])), name
    with __import__("safetensors").safe_open(str(out / "model-00001-of-00003.safetensors"), "np") as f:
        assert f.metadata() == {"author": "test", "format": "pt"}


# --------------------------------------------------------------------------------------
# The command and the imports
# --------------------------------------------------------------------------------------


def test_cli_converts_a_folder_and_back(folder, loaded, tmp_path):
    from click.testing import CliRunner

    from hurray_schema.cli import main

    runner = CliRunner()
    dst, out = tmp_path / "cli.hrry", tmp_path / "cli-out"
    result = runner.invoke(main, ["convert", str(folder), str(dst)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].startswith(f"{len(loaded.state_dict()) - 1} tensors")
    result = runner.invoke(main, ["convert", str(dst), str(out), "--max-shard-size", "20KB", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["destination_format"] == "hf"
    assert_state_dicts_equal(from_pretrained(out).state_dict(), loaded.state_dict())
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / INDEX).write_text('{"weight_map": {"x": "/etc/passwd.safetensors"}}')
    result = runner.invoke(main, ["convert", str(bad), str(tmp_path / "never.hrry")])
    assert result.exit_code == 2 and "not a path inside" in result.output
    assert not (tmp_path / "never.hrry").exists()


def test_converting_a_folder_imports_neither_torch_nor_transformers(folder, tmp_path):
    code = ("import sys, hurray_schema as hs; "
            f"hs.convert({str(folder)!r}, {str(tmp_path / 'a.hrry')!r}); "
            f"hs.convert({str(tmp_path / 'a.hrry')!r}, {str(tmp_path / 'a')!r}, max_shard_size='20KB'); "
            "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
