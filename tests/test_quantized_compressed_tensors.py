"""compressed-tensors ``pack-quantized`` checkpoints into Hurray and back, against compressed-tensors'
own code: a tiny Llama quantized by it on CPU (:mod:`tests.support.quantized_models.compressed_tensors`),
converted with ``hurray_schema.convert``, compared bit for bit with the library's own
decompression (its compressor's ``decompress``), written back as a folder the library loads.

Expected values come from compressed-tensors (its decompression, the bytes it saved), never from
the code under test."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

pytest.importorskip("compressed_tensors", reason="compressed-tensors (and torch) are test-only dependencies")
torch = pytest.importorskip("torch", reason="compressed-tensors needs torch")

import ml_dtypes  # noqa: E402

import hurray_schema as hs  # noqa: E402
from hurray_schema.builders import quantized_from_codes  # noqa: E402
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation  # noqa: E402
from hurray_schema.model import ElementType, PerBlockAffine, PerChannelAffine, QuantFlag  # noqa: E402
from tests.support.quantized_models import compressed_tensors as ct  # noqa: E402
from tests.support.quantized_models import bit_pattern  # noqa: E402

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
EXACT = ["int4_g32_sym", "int4_g32_asym", "int8_channel", "int8_channel_asym", "int2_g32_asym", "int8_tensor",
         "int4_tensor_asym", "w8a8_channel", "w8a8_channel_asym", "int4_g32_asym_fp16", "int8_channel_asym_fp16"]
SYMMETRIC = ["int4_g32_sym", "int8_channel", "int8_tensor", "w8a8_channel"]
"""Variants transformers loads: with compressed-tensors 0.20.1 and transformers 5.25, an
asymmetric pack-quantized checkpoint -- the library's own, as saved -- fails ``from_pretrained``
(its zero points are initialized unpacked, ``[out, groups]``, and the packed ones mismatch)."""


@pytest.fixture(scope="session")
def folders(tmp_path_factory):
    """variant -> a model folder quantized by compressed-tensors (built once, on demand)."""
    root = tmp_path_factory.mktemp("ct")
    built = {}

    def get(variant):
        if variant not in built:
            built[variant] = ct.build(os.fspath(root / variant), variant)
        return built[variant]

    return get


@pytest.fixture(scope="session")
def converted(folders, tmp_path_factory):
    """variant -> (Hurray path, report) of the folder converted as quantized."""
    root = tmp_path_factory.mktemp("ct_hrry")
    done = {}

    def get(variant):
        if variant not in done:
            path = os.fspath(root / f"{variant}.hrry")
            done[variant] = path, hs.convert(folders(variant), path)
        return done[variant]

    return get


def _safetensors(path: str) -> tuple[dict, dict, bytes]:
    """(header without __metadata__, __metadata__, data bytes) of a safetensors file, read here."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    return header, meta, blob[8 + n:]


def _tensor_bytes(path: str) -> dict:
    header, _, data = _safetensors(path)
    return {name: (entry["dtype"], entry["shape"], data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items()}


# -- into Hurray -----------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", EXACT)
def test_every_quantized_linear_equals_the_librarys_decompression_bit_for_bit(folders, converted, variant):
    path, report = converted(variant)
    reference = ct.library_dequantized(folders(variant))
    assert len(reference) == 7
    assert not hs.audit(path).findings
    with hs.read_file(path) as f:
        for name, expected in reference.items():
            got = f[name].to_numpy()
            assert got.shape == expected.shape == tuple(f[name].shape)
            np.testing.assert_array_equal(bit_pattern(got.astype(expected.dtype)), bit_pattern(expected), err_msg=name)
    rows = {row.name: row for row in report.tensors}
    fmt = "int-quantized" if variant.startswith("w8a8") else "pack-quantized"
    for name in reference:
        assert rows[name].max_ulp == 0 and rows[name].exact
        assert rows[name].type_in.startswith(f"compressed-tensors {fmt}")


@pytest.mark.parametrize("variant, storage, scheme, block, symmetric", [
    ("int4_g32_sym", "INT4", PerBlockAffine, 32, True),
    ("int4_g32_asym", "INT4", PerBlockAffine, 32, False),
    ("int2_g32_asym", "INT2", PerBlockAffine, 32, False),
    ("int8_channel", "INT8", PerChannelAffine, None, True),
    ("int8_channel_asym", "INT8", PerChannelAffine, None, False),
    ("int8_tensor", "INT8", PerChannelAffine, None, True),
    ("int4_tensor_asym", "INT4", PerChannelAffine, None, False),
])
def test_the_hurray_schemes_hold_the_librarys_codes_scales_and_zero_points(folders, converted, variant, storage,
                                                                            scheme, block, symmetric):
    path, _ = converted(variant)
    stored = _tensor_bytes(os.path.join(folders(variant), "model.safetensors"))
    bits = {"INT4": 4, "INT2": 2, "INT8": 8}[storage]
    packed = np.frombuffer(stored[Q_PROJ + "_packed"][2], "<u4").reshape(stored[Q_PROJ + "_packed"][1])
    # compressed-tensors' pack_to_int32 layout, read with NumPy here: q + 2**(bits-1) at bit bits*i
    shifts = np.arange(32 // bits, dtype=np.uint32) * bits
    library_codes = ((packed[..., None] >> shifts) & ((1 << bits) - 1)).reshape(packed.shape[0], -1)
    library_codes = library_codes.astype(np.int16) - (1 << (bits - 1))
    with hs.read_file(path) as f:
        t = f[Q_PROJ]
        q = t.descriptor.quantization
        assert isinstance(q, scheme)
        assert t.descriptor.type_tag.name == storage
        assert bool(q.flags & QuantFlag.SYMMETRIC) == symmetric
        codes = t.to_numpy(raw=True)
        np.testing.assert_array_equal(codes.astype(np.int16), library_codes[:, :codes.shape[1]])
        scale_dtype, scale_shape, scale_raw = stored[Q_PROJ.replace("weight", "weight_scale")]
        assert scale_dtype == "BF16"
        library_scales = np.frombuffer(scale_raw, ml_dtypes.bfloat16).reshape(scale_shape)
        if scheme is PerBlockAffine:
            assert (q.axis, q.block_size, q.scale_type_tag) == (1, block, ElementType.BFLOAT16)
            assert bytes(t.buffers[q.scale_buffer_index]) == scale_raw  # bfloat16 scales stored as they are
        else:
            assert q.axis == 0
            scales = np.frombuffer(t.buffers[q.scale_buffer_index], "<f4")
            library_rows = np.broadcast_to(library_scales.reshape(-1), (t.shape[0],))  # tensor: one scale per row
            np.testing.assert_array_equal(scales, library_rows.astype(np.float32))  # widened exactly
        if not symmetric and variant.endswith("tensor_asym"):  # one int8 zero point, repeated per row
            _, _, zraw = stored[Q_PROJ.replace("weight", "weight_zero_point")]
            zeros = np.frombuffer(t.buffers[q.zero_point_buffer_index], "<i4")
            assert (zeros == np.frombuffer(zraw, np.int8)[0]).all()
        elif not symmetric:  # packed along the output axis by the library: word j holds rows j*per ...
            _, zshape, zraw = stored[Q_PROJ.replace("weight", "weight_zero_point")]
            zwords = np.frombuffer(zraw, "<u4").reshape(zshape)
            library_zeros = ((zwords.T[..., None] >> shifts) & ((1 << bits) - 1)).reshape(zshape[1], -1).T
            library_zeros = library_zeros.astype(np.int64)[:codes.shape[0]] - (1 << (bits - 1))
            zeros = np.frombuffer(t.buffers[q.zero_point_buffer_index], "<i4")
            np.testing.assert_array_equal(zeros, library_zeros.reshape(-1))


@pytest.mark.parametrize("variant", ["w8a8_channel", "w8a8_channel_asym"])
def test_int_quantized_weights_are_the_per_channel_codes_as_they_are(folders, converted, variant):
    path, _ = converted(variant)
    stored = _tensor_bytes(os.path.join(folders(variant), "model.safetensors"))
    assert stored[Q_PROJ][0] == "I8"
    with hs.read_file(path) as f:
        t = f[Q_PROJ]
        q = t.descriptor.quantization
        assert isinstance(q, PerChannelAffine) and q.axis == 0 and t.descriptor.type_tag == ElementType.INT8
        assert bytes(t.buffers[0]) == stored[Q_PROJ][2]  # int8 row-major codes: the library's bytes
        if variant.endswith("asym"):
            zeros = np.frombuffer(t.buffers[q.zero_point_buffer_index], "<i4")
            np.testing.assert_array_equal(zeros, np.frombuffer(stored[Q_PROJ + "_zero_point"][2], np.int8))


def test_every_other_tensor_is_copied_as_it_is(folders, converted):
    path, _ = converted("int4_g32_sym")
    stored = _tensor_bytes(os.path.join(folders("int4_g32_sym"), "model.safetensors"))
    dense = {name: entry for name, entry in stored.items() if entry[0] == "BF16" and not name.endswith("_scale")}
    assert "lm_head.weight" in dense and "model.embed_tokens.weight" in dense
    with hs.read_file(path) as f:
        assert sorted(f.keys()) == sorted(list(dense) + list(ct.library_dequantized(folders("int4_g32_sym"))))
        for name, (_, shape, raw) in dense.items():
            assert f[name].descriptor.quantization is None
            assert list(f[name].shape) == shape and bytes(f[name].buffers[0]) == raw


@pytest.mark.parametrize("variant", ["int4_g32_sym", "int8_channel", "int8_channel_asym", "w8a8_channel"])
def test_stored_bytes_stay_within_five_percent_of_the_checkpoints(converted, variant):
    _, report = converted(variant)
    assert sum(r.bytes_out for r in report.tensors) <= 1.05 * sum(r.bytes_in for r in report.tensors)


def test_asymmetric_groups_cost_the_int32_zero_points_the_spec_stores(folders, converted):
    """per-block-affine.md § Referenced Buffers: one int32 zero point per block, where
    compressed-tensors packs 4 bits: 22 bytes a group of 32 against 18.5."""
    _, report = converted("int4_g32_asym")
    for row in report.tensors:
        if row.type_in.startswith("compressed-tensors"):
            out, inn = {"q_proj": (64, 64), "k_proj": (32, 64), "v_proj": (32, 64), "o_proj": (64, 64),
                        "gate_proj": (128, 64), "up_proj": (128, 64), "down_proj": (64, 128)}[row.name.split(".")[-2]]
            blocks = out * inn // 32
            assert row.bytes_out == out * inn // 2 + 2 * blocks + 4 * blocks
            assert row.bytes_in == out * inn // 2 + 2 * blocks + 4 * (-(-out // 8)) * (inn // 32) + 16


def test_three_bit_codes_are_refused_and_stored_dense_on_request(folders, tmp_path):
    folder = folders("int3_g32")
    with pytest.raises(NoExactForm, match="3-bit codes have no Hurray storage type"):
        hs.convert(folder, os.fspath(tmp_path / "a.hrry"))
    path = os.fspath(tmp_path / "b.hrry")
    report = hs.convert(folder, path, dequantize=True)
    reference = ct.library_dequantized(folder)
    assert not hs.audit(path).findings
    with hs.read_file(path) as f:
        for name, expected in reference.items():
            got = f[name].to_numpy()
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(bit_pattern(got), bit_pattern(expected), err_msg=name)
    assert all(r.max_ulp == 0 for r in report.tensors if r.name in reference)


def test_the_cli_converts_as_users_do(folders, tmp_path):
    from hurray_schema.cli import main

    path = os.fspath(tmp_path / "cli.hrry")
    with pytest.raises(SystemExit) as exited:
        main(["convert", folders("int4_g32_sym"), path])
    assert exited.value.code in (0, None)
    reference = ct.library_dequantized(folders("int4_g32_sym"))
    with hs.read_file(path) as f:
        np.testing.assert_array_equal(bit_pattern(f[Q_PROJ].to_numpy()), bit_pattern(reference[Q_PROJ]))


# -- back out --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", EXACT)
def test_the_way_back_writes_the_librarys_tensors_byte_for_byte(folders, converted, tmp_path, variant):
    path, _ = converted(variant)
    back = os.fspath(tmp_path / "back")
    hs.convert(path, back, to="hf")
    original = _tensor_bytes(os.path.join(folders(variant), "model.safetensors"))
    written = _tensor_bytes(os.path.join(back, "model.safetensors"))
    assert sorted(written) == sorted(original)
    for name in original:
        assert written[name] == original[name], name
    with open(os.path.join(folders(variant), "config.json")) as a, open(os.path.join(back, "config.json")) as b:
        assert a.read() == b.read()
    # the files differ only in the order of their tensors: safetensors' serializer sorts them by
    # dtype and name, the folder keeps the Hurray file's order; re-saved by it, the file is the original
    from safetensors.torch import load_file, save_file

    resaved = os.fspath(tmp_path / "resaved.safetensors")
    save_file(load_file(os.path.join(back, "model.safetensors")), resaved, metadata={"format": "pt"})
    with open(resaved, "rb") as a, open(os.path.join(folders(variant), "model.safetensors"), "rb") as b:
        assert a.read() == b.read()
    library = ct.library_dequantized(folders(variant))
    again = ct.library_dequantized(back)
    for name, expected in library.items():
        np.testing.assert_array_equal(bit_pattern(again[name]), bit_pattern(expected), err_msg=name)


@pytest.mark.parametrize("variant", SYMMETRIC)
def test_the_folder_written_back_loads_in_transformers_and_decompresses_to_the_same_bits(folders, converted,
                                                                                          tmp_path, variant):
    path, _ = converted(variant)
    back = os.fspath(tmp_path / "back")
    hs.convert(path, back, to="hf")
    library = ct.library_dequantized(folders(variant))
    loaded = ct.loaded_dequantized(back)
    assert sorted(loaded) == sorted(library)
    for name, expected in library.items():
        np.testing.assert_array_equal(bit_pattern(loaded[name]), bit_pattern(expected), err_msg=name)


def _foreign_file(path: str, converted_path: str, unsigned: bool) -> dict:
    """A Hurray file of the int4 g32 model's linears as another library would give them (codes
    unsigned with zero points, float16 scales, or int8 per channel with float32 scales), its
    config.json without quantization_config; name -> the values they decode to."""
    expected = {}
    items = {}
    with hs.read_file(converted_path) as f:
        metadata = dict(f.metadata())
        config = json.loads(metadata["hf.file.config.json"])
        del config["quantization_config"]
        config["dtype"] = "float16"  # GPTQ / AWQ checkpoints' float16 scales in a float16 model
        metadata["hf.file.config.json"] = json.dumps(config)
        rng = np.random.default_rng(5)
        for name in f.keys():
            t = f[name]
            if t.descriptor.quantization is None:
                items[name] = t
                continue
            out, inn = t.shape
            if name.endswith("v_proj.weight"):  # int8 per channel: float32 scales, float16 ones widened when signed
                codes = rng.integers(-128, 128, (out, inn))
                scales = (rng.random(out) * 0.01 + 0.001).astype(np.float32)
                if not unsigned:
                    scales = scales.astype(np.float16).astype(np.float32)
                items[name] = quantized_from_codes(codes, "per_channel", storage="int8", axis=0, scales=scales)
                expected[name] = codes.astype(np.float32) * scales[:, None]
                continue
            scales = (rng.random((out, inn // 32)) * 0.02 + 0.001).astype(np.float16)
            if unsigned:
                codes = rng.integers(0, 16, (out, inn))
                zeros = rng.integers(0, 16, (out, inn // 32))
                items[name] = quantized_from_codes(codes, "per_block", storage="uint4", axis=1, scales=scales,
                                                   zero_points=zeros, block_size=32)
            else:
                codes = rng.integers(-8, 8, (out, inn))
                zeros = np.zeros((out, inn // 32), np.int64)
                items[name] = quantized_from_codes(codes, "per_block", storage="int4", axis=1, scales=scales,
                                                   block_size=32)
            expected[name] = ((codes - np.repeat(zeros, 32, 1)).astype(np.float32)
                              * np.repeat(scales, 32, 1).astype(np.float32)).astype(np.float16)
    hs.write_file(path, items, metadata=metadata)
    return expected


@pytest.mark.parametrize("unsigned", [True, False])
def test_another_sources_tensors_are_written_as_pack_quantized(converted, tmp_path, unsigned):
    path = os.fspath(tmp_path / "foreign.hrry")
    expected = _foreign_file(path, converted("int4_g32_sym")[0], unsigned)
    back = os.fspath(tmp_path / "back")
    hs.convert(path, back, to="hf", quantized_as="compressed-tensors")
    with open(os.path.join(back, "config.json")) as f:
        quant = json.load(f)["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "pack-quantized"
    from compressed_tensors.quantization import QuantizationConfig

    QuantizationConfig.model_validate(quant)  # the library accepts the config
    library = _decompressed_by_group(back, quant)
    assert sorted(library) == sorted(expected)
    for name, values in expected.items():
        got = library[name]
        want = values.astype(got.dtype)  # per channel: float32 scales, the library's float32 product
        np.testing.assert_array_equal(bit_pattern(got), bit_pattern(want), err_msg=name)
    scale = _tensor_bytes(os.path.join(back, "model.safetensors"))["model.layers.0.self_attn.v_proj.weight_scale"]
    assert scale[0] == ("F32" if unsigned else "F16")  # per-channel scales back in the model's dtype where exact
    if not unsigned:  # symmetric: transformers loads it (float16 model) and decompresses to the same bits
        loaded = ct.loaded_dequantized(back)
        for name, values in expected.items():
            want = values.astype(np.float16)
            np.testing.assert_array_equal(bit_pattern(loaded[name]), bit_pattern(want), err_msg=name)
    again = os.fspath(tmp_path / "again.hrry")
    hs.convert(back, again)
    with hs.read_file(again) as f:
        for name, values in expected.items():
            np.testing.assert_array_equal(bit_pattern(f[name].to_numpy().astype(values.dtype)), bit_pattern(values))


def _decompressed_by_group(folder: str, quant: dict) -> dict:
    """compressed-tensors' decompress of each module, with the config group that targets it by name."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    state = load_file(os.path.join(folder, "model.safetensors"))
    qconfig = QuantizationConfig.model_validate(quant)
    out = {}
    for scheme in qconfig.config_groups.values():
        compressor = BaseCompressor.get_value_from_registry(scheme.format)
        for module in scheme.targets:
            local = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".")}
            out[module + ".weight"] = ct.to_numpy(compressor.decompress(local, scheme)["weight"])
    return out


# -- hostile inputs --------------------------------------------------------------------------------

def _edited(folder: str, dst, tensors=None, config=None) -> str:
    """A copy of ``folder`` with ``tensors(state)`` / ``config(quantization_config)`` applied."""
    from safetensors.torch import load_file, save_file

    dst = os.fspath(dst)
    shutil.copytree(folder, dst)
    if tensors is not None:
        state = load_file(os.path.join(folder, "model.safetensors"))
        tensors(state)
        save_file(state, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            data = json.load(f)
        result = config(data["quantization_config"])
        if result is not None:
            data["quantization_config"] = result
        with open(path, "w") as f:
            json.dump(data, f)
    return dst


PACKED = "model.layers.0.self_attn.q_proj.weight_packed"


def _set(name, value):
    def edit(state):
        state[name] = value(state[name]) if callable(value) else value
    return edit


@pytest.mark.parametrize("edit, message", [
    (_set(PACKED, lambda t: t[:, :7].contiguous()), "weight_packed is int32"),
    (_set(PACKED, lambda t: t.to(torch.int16)), "weight_packed is int16"),
    (_set(PACKED.replace("packed", "shape"), torch.tensor([64, 72])), "weight_packed is int32"),
    (_set(PACKED.replace("packed", "shape"), torch.tensor([64, 64, 1])), "weight_shape"),
    (_set(PACKED.replace("packed", "scale"), lambda t: t[:, :1].contiguous()), "weight_scale of shape"),
    (_set(PACKED.replace("packed", "scale"), lambda t: t.to(torch.int32)), "weight_scale is int32"),
    (lambda state: state.pop(PACKED.replace("packed", "scale")), "weight_scale"),
])
def test_parts_that_do_not_match_the_packing_are_refused_naming_the_module(folders, tmp_path, edit, message):
    folder = _edited(folders("int4_g32_sym"), tmp_path / "bad", tensors=edit)
    with pytest.raises(HurraySchemaError, match=message) as info:
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))
    assert "model.layers.0.self_attn.q_proj" in str(info.value)
    assert not os.path.exists(tmp_path / "x.hrry")


def test_int_quantized_weights_that_are_not_int8_are_refused(folders, tmp_path):
    folder = _edited(folders("w8a8_channel"), tmp_path / "bad", tensors=_set(Q_PROJ, lambda t: t.to(torch.int16)))
    with pytest.raises(HurraySchemaError, match=r"q_proj: weight is int16\[64, 64\]; int-quantized keeps int8"):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))


def test_asymmetric_zero_points_that_do_not_match_the_packing_are_refused(folders, tmp_path):
    name = PACKED.replace("packed", "zero_point")
    folder = _edited(folders("int4_g32_asym"), tmp_path / "bad", tensors=_set(name, lambda t: t[:4].contiguous()))
    with pytest.raises(HurraySchemaError, match="weight_zero_point is int32"):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))


def test_a_group_size_that_does_not_divide_in_features_is_refused(folders, tmp_path):
    def config(quant):
        quant["config_groups"]["group_0"]["weights"]["group_size"] = 48

    folder = _edited(folders("int4_g32_sym"), tmp_path / "bad", config=config)
    with pytest.raises(HurraySchemaError, match="group size 48 does not divide in_features"):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))


CHANNEL4 = {"config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized", "weights": {
    "num_bits": 4, "strategy": "channel", "symmetric": True, "type": "int"}}}, "format": "pack-quantized"}


def _channel4_parts(columns: int):
    """The parts compressed-tensors' own pack_to_int32 / quantize make of a [3, columns] weight,
    4-bit per channel: a row of 20 codes leaves 4 codes of its third word over."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    codes = torch.tensor(np.random.default_rng(3).integers(-8, 8, (3, columns)), dtype=torch.int8)
    scales = torch.tensor([[0.01], [0.02], [0.005]], dtype=torch.bfloat16)
    return {"weight_packed": pack_to_int32(codes, 4).numpy(), "weight_scale": ct.to_numpy(scales),
            "weight_shape": np.array([3, columns], np.int64)}, codes, scales


def test_rows_that_end_inside_a_word_convert_and_pack_back_as_the_library_packs(tmp_path):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from hurray_schema.conversion.quantized import compressed_tensors as module

    arrays, codes, scales = _channel4_parts(20)
    scheme = QuantizationScheme.model_validate(CHANNEL4["config_groups"]["group_0"])
    library = ct.to_numpy(BaseCompressor.get_value_from_registry("pack-quantized").decompress(
        {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(torch.bfloat16) if k == "weight_scale"
         else torch.from_numpy(v) for k, v in arrays.items()}, scheme)["weight"])
    tensor = module.source("m.weight", arrays, CHANNEL4)
    path = os.fspath(tmp_path / "c.hrry")
    hs.write_file(path, {"m.weight": tensor})
    with hs.read_file(path) as f:
        got = f["m.weight"].to_numpy().astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(bit_pattern(got), bit_pattern(library))
        parts = module.parts_of("m.weight", f["m.weight"], {**CHANNEL4, "hurray.model_dtype": "bfloat16"})
    assert parts["m.weight_packed"].tobytes() == arrays["weight_packed"].tobytes()
    assert parts["m.weight_scale"].tobytes() == arrays["weight_scale"].tobytes()
    assert parts["m.weight_shape"].tobytes() == arrays["weight_shape"].tobytes()


def test_padding_bits_that_are_not_zero_are_refused():
    from hurray_schema.conversion.quantized import compressed_tensors as module

    arrays, _, _ = _channel4_parts(20)
    arrays["weight_packed"] = arrays["weight_packed"].copy()
    arrays["weight_packed"][1, 2] |= np.int32(1 << 28)
    with pytest.raises(HurraySchemaError, match="padding bits"):
        module.source("m.weight", arrays, CHANNEL4)


@pytest.mark.parametrize("variant, value, rule", [
    ("int4_g32_sym", 0.0, "quantization.per_block.scale_values"),
    ("int4_g32_sym", float("inf"), "quantization.per_block.scale_values"),
    ("int4_g32_sym", float("nan"), "quantization.per_block.scale_values"),
    ("int8_channel", 0.0, "quantization.per_channel.scale_values"),
    ("int8_channel", float("nan"), "quantization.per_channel.scale_values"),
])
def test_zero_or_non_finite_scales_are_a_spec_violation_when_written(folders, tmp_path, variant, value, rule):
    folder = _edited(folders(variant), tmp_path / "bad", tensors=_scale_set(value))
    weight = PACKED.replace("_packed", "")
    with pytest.raises(SpecViolation, match=rf"{weight}: scale \d+ is .*, not finite and non-zero") as info:
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))
    assert info.value.rule_id == rule
    assert not os.path.exists(tmp_path / "x.hrry")


def _scale_set(value):
    name = PACKED.replace("packed", "scale")

    def edit(state):
        state[name] = state[name].clone()
        state[name][3, 0] = value
    return edit


@pytest.mark.parametrize("variant", ["int4_g32_sym", "int8_channel"])
def test_a_negative_scale_is_kept(folders, tmp_path, variant):
    """The passing counterpart: a finite, non-zero scale, negative too, is the library's and stays."""
    folder = _edited(folders(variant), tmp_path / "ok", tensors=_scale_set(-0.5))
    report = hs.convert(folder, os.fspath(tmp_path / "x.hrry"))
    row = {row.name: row for row in report.tensors}[PACKED.replace("_packed", "")]
    assert row.exact and row.max_ulp == 0


@pytest.mark.parametrize("config, message", [
    (lambda q: {**q, "config_groups": []}, "config_groups is not a non-empty object"),
    (lambda q: {**q, "config_groups": {"g": {"targets": "Linear"}}}, "no list of target strings"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits="four"), "num_bits 'four'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=16), "num_bits 16"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(symmetric="yes"), "symmetric 'yes'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(type="float"), "of type 'float'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=0), "group_size 0"),
    (lambda q: q["config_groups"]["group_0"].update(weights=None), "quantizes no weights"),
    (lambda q: q["config_groups"]["group_0"].update(format="nvfp4-pack-quantized"), "format is 'nvfp4"),
    (lambda q: q["config_groups"]["group_0"].update(targets=["re:(unclosed"]), "no regular expression"),
    (lambda q: q["config_groups"].update(group_1=q["config_groups"]["group_0"]), "no single compressed-tensors"),
    (lambda q: q.update(ignore=["re:.*q_proj"]), "config ignores it"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(symmetric=False), "weight_zero_point .* is not in the checkpoint"),
])
def test_a_malformed_config_is_refused(folders, tmp_path, config, message):
    folder = _edited(folders("int4_g32_sym"), tmp_path / "bad", config=config)
    with pytest.raises(HurraySchemaError, match=message):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))


def test_a_config_json_that_is_no_json_is_refused(folders, tmp_path):
    folder = _edited(folders("int4_g32_sym"), tmp_path / "bad")
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write('{"quantization_config": {"quant_method": "compressed-tensors", ')
    with pytest.raises(HurraySchemaError):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))


def test_the_way_back_refuses_a_scheme_pack_quantized_cannot_hold(converted, tmp_path):
    """NF4 and per-block along the output axis have no pack-quantized form."""
    from hurray_schema.conversion.quantized import compressed_tensors as module

    nf4 = quantized_from_codes(np.zeros((4, 64), np.uint8), "nf4", storage="uint4", axis=1,
                               scales=np.ones((4, 1), np.float32), block_size=64)
    with pytest.raises(NoExactForm, match="no compressed-tensors pack-quantized form"):
        module.parts_of("m.weight", nf4, {})
    along_out = quantized_from_codes(np.zeros((64, 4), np.int8), "per_block", storage="int4", axis=0,
                                     scales=np.ones((2, 4), np.float16), block_size=32)
    with pytest.raises(NoExactForm, match="axis 0"):
        module.parts_of("m.weight", along_out, {})


def test_the_way_back_refuses_a_config_that_disagrees_with_the_tensor(converted):
    from hurray_schema.conversion.quantized import compressed_tensors as module

    path, _ = converted("int4_g32_sym")
    with hs.read_file(path) as f:
        config = json.loads(f.metadata()["hf.file.config.json"])["quantization_config"]
        config["config_groups"]["group_0"]["weights"].update(symmetric=False)
        with pytest.raises(NoExactForm, match="is not this tensor's"):
            module.parts_of(Q_PROJ, f[Q_PROJ], config)
        config["config_groups"]["group_0"]["weights"].update(symmetric=True, group_size=64)
        with pytest.raises(NoExactForm, match="is not this tensor's"):
            module.parts_of(Q_PROJ, f[Q_PROJ], config)


def test_a_name_target_is_preferred_to_the_class_target(folders, tmp_path):
    """Two groups: "Linear" and the exact name of one module (here the same scheme, so the
    checkpoint stays consistent); a bare lower-case name is no class target."""
    def config(quant):
        group = json.loads(json.dumps(quant["config_groups"]["group_0"]))
        group["targets"] = ["model.layers.0.self_attn.q_proj", "lm_head"]
        quant["config_groups"]["group_1"] = group

    folder = _edited(folders("int4_g32_sym"), tmp_path / "two", config=config)
    path = os.fspath(tmp_path / "two.hrry")
    hs.convert(folder, path)
    reference = ct.library_dequantized(folders("int4_g32_sym"))
    with hs.read_file(path) as f:
        np.testing.assert_array_equal(bit_pattern(f[Q_PROJ].to_numpy()), bit_pattern(reference[Q_PROJ]))


def test_tensor_zero_points_outside_the_bit_range_are_refused(folders, tmp_path):
    name = PACKED.replace("packed", "zero_point")
    folder = _edited(folders("int4_tensor_asym"), tmp_path / "bad",
                     tensors=_set(name, torch.tensor([9], dtype=torch.int8)))
    with pytest.raises(HurraySchemaError, match=r"zero points outside \[-8, 7\]"):
        hs.convert(folder, os.fspath(tmp_path / "x.hrry"))
