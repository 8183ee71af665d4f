"""GPTQ checkpoints (gptqmodel's v1 on-disk layout) into Hurray per-block affine tensors and back:
a tiny Llama quantized by gptqmodel on CPU (tests/support/quantized_models/gptq.py), converted with
``hurray_schema.convert`` and compared bit for bit with gptqmodel's own dequantization."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation

pytest.importorskip("safetensors", reason="the safetensors extra is not installed")
pytest.importorskip("torch", reason="torch is not installed (a test-only dependency)")
pytest.importorskip("gptqmodel", reason="gptqmodel is not installed (a test-only dependency)")

from safetensors.numpy import load_file, save_file  # noqa: E402
from tests.support.quantized_models import gptq as models  # noqa: E402
from tests.support.quantized_models import bit_pattern  # noqa: E402

from hurray_schema.conversion.quantized import gptq  # noqa: E402
from hurray_schema.model import ElementType, PerBlockAffine, QuantFlag  # noqa: E402

VARIANTS = {"asym": dict(desc_act=False, sym=False), "sym": dict(desc_act=False, sym=True),
            "act-order": dict(desc_act=True, sym=False)}
WEIGHTS = [f"model.layers.0.{path}.weight" for path in models.LINEARS]
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """{variant: (folder, gptqmodel's dequantized weights)}, quantized once per session."""
    base = tmp_path_factory.mktemp("gptq")
    dense = models.dense_model(str(base / "dense"))
    out = {}
    for name, settings in VARIANTS.items():
        folder = models.quantize(dense, str(base / name), **settings)
        out[name] = (folder, models.library_dequantized(folder))
    return out


def _tensors(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def _config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def _is_trivial(g_idx, group):
    return np.array_equal(g_idx, np.arange(g_idx.shape[0]) // group)


# --------------------------------------------------------------------------------------
# into Hurray


@pytest.mark.parametrize("variant", ["asym", "sym"])
def test_without_act_order_is_exact(checkpoints, tmp_path, variant):
    folder, library = checkpoints[variant]
    source = _tensors(folder)
    quant = _config(folder)["quantization_config"]
    assert quant["checkpoint_format"] == "gptq" and quant["desc_act"] is False and quant["group_size"] == 32
    for weight in WEIGHTS:  # gptqmodel wrote the plain group order
        assert _is_trivial(source[weight.replace(".weight", ".g_idx")], 32)
    dst = str(tmp_path / "model.hrry")
    report = hs.convert(folder, dst)
    assert not hs.audit(dst).findings
    rows = {row.name: row for row in report.tensors}
    with hs.read_file(dst) as container:
        for weight in WEIGHTS:
            item = container[weight]
            q = item.descriptor.quantization
            assert isinstance(q, PerBlockAffine)
            assert (q.axis, q.block_size, q.scale_type_tag) == (1, 32, ElementType.FLOAT16)
            if variant == "sym":  # zero points all 8: signed codes q - 8, no zero-point buffer
                assert item.descriptor.type_tag == ElementType.INT4 and q.flags & QuantFlag.SYMMETRIC
            else:
                assert item.descriptor.type_tag == ElementType.UINT4 and not q.flags & QuantFlag.SYMMETRIC
            values = item.to_numpy()
            assert values.dtype == np.float16 and values.shape == library[weight].shape
            assert np.array_equal(bit_pattern(values), bit_pattern(library[weight])), weight
            assert rows[weight].max_ulp == 0
        for name, array in source.items():  # every other tensor as it is
            if name.rsplit(".", 1)[-1] not in gptq.PARTS:
                assert np.array_equal(bit_pattern(container[name].to_numpy()), bit_pattern(array)), name
                assert container[name].descriptor.quantization is None


def test_byte_ratios(checkpoints, tmp_path):
    """Tensor bytes out against the checkpoint's tensor bytes in: the symmetric form is smaller;
    the asymmetric one carries one int32 zero point per block (``§ Referenced Buffers``) where
    GPTQ packs 4 bits, which the dropped ``g_idx`` does not make up for at group size 32."""
    for variant in ("asym", "sym"):
        folder, _ = checkpoints[variant]
        source = _tensors(folder)
        report = hs.convert(folder, str(tmp_path / f"{variant}.hrry"))
        bytes_in = sum(row.bytes_in for row in report.tensors)
        bytes_out = sum(row.bytes_out for row in report.tensors)
        assert bytes_in == sum(array.nbytes for array in source.values())
        linears = [source[w.replace(".weight", ".qweight")].shape for w in WEIGHTS]
        codes = sum(rows * 4 * out for rows, out in linears)  # 8 codes per word, half a byte each
        blocks = sum(rows * 8 // 32 * out for rows, out in linears)
        dense = sum(a.nbytes for n, a in source.items() if n.rsplit(".", 1)[-1] not in gptq.PARTS)
        expected = dense + codes + blocks * 2 + (0 if variant == "sym" else blocks * 4)
        assert bytes_out == expected
        if variant == "sym":
            assert bytes_out <= bytes_in
        else:
            assert bytes_in < bytes_out <= 1.08 * bytes_in


def test_act_order_is_refused_with_the_reason(checkpoints, tmp_path):
    folder, _ = checkpoints["act-order"]
    source = _tensors(folder)
    assert _config(folder)["quantization_config"]["desc_act"] is True
    assert not _is_trivial(source["model.layers.0.self_attn.q_proj.g_idx"], 32)
    with pytest.raises(NoExactForm, match=r"act-order g_idx puts input columns .* § Block Layout"):
        hs.convert(folder, str(tmp_path / "model.hrry"))
    assert not os.path.exists(tmp_path / "model.hrry")


def test_act_order_dequantized_is_the_library_s_result(checkpoints, tmp_path):
    folder, library = checkpoints["act-order"]
    dst = str(tmp_path / "model.hrry")
    report = hs.convert(folder, dst, dequantize=True)
    assert not hs.audit(dst).findings
    rows = {row.name: row for row in report.tensors}
    with hs.read_file(dst) as container:
        for weight in WEIGHTS:
            item = container[weight]
            assert item.descriptor.quantization is None and item.descriptor.type_tag == ElementType.FLOAT16
            assert np.array_equal(bit_pattern(item.to_numpy()), bit_pattern(library[weight])), weight
            assert "act-order" in rows[weight].note and rows[weight].max_ulp == 0


def test_cli_converts_and_refuses(checkpoints, tmp_path):
    from tests.support.cli import run

    folder, library = checkpoints["asym"]
    done = run("convert", folder, tmp_path / "a.hrry")
    assert done.returncode == 0, done.stderr
    loaded = hs.load(str(tmp_path / "a.hrry"))
    assert np.array_equal(bit_pattern(np.asarray(loaded[WEIGHTS[0]])), bit_pattern(library[WEIGHTS[0]]))
    act_order, _ = checkpoints["act-order"]
    done = run("convert", act_order, tmp_path / "b.hrry")
    assert done.returncode != 0 and b"act-order" in done.stderr
    done = run("convert", "--dequantize", act_order, tmp_path / "b.hrry")
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------------------
# the way back


@pytest.mark.parametrize("variant", ["asym", "sym"])
def test_round_trip_is_byte_identical_and_loads(checkpoints, tmp_path, variant):
    folder, library = checkpoints[variant]
    hrry, back = str(tmp_path / "model.hrry"), str(tmp_path / "back")
    hs.convert(folder, hrry)
    hs.convert(hrry, back, to="hf")
    original, returned = _tensors(folder), _tensors(back)
    assert list(returned) == list(original)
    for name, array in original.items():
        assert returned[name].dtype == array.dtype and returned[name].shape == array.shape, name
        assert returned[name].tobytes() == array.tobytes(), name
    # gptqmodel's file: same tensors, same order (its buffers' order per linear), same header
    with open(os.path.join(folder, "model.safetensors"), "rb") as a, \
            open(os.path.join(back, "model.safetensors"), "rb") as b:
        assert a.read() == b.read()
    assert _config(back) == _config(folder)
    for name in TOKENIZER:  # only config.json and generation_config.json travel in a Hurray file
        shutil.copy(os.path.join(folder, name), back)
    again = models.library_dequantized(back)
    for weight in WEIGHTS:
        assert np.array_equal(bit_pattern(again[weight]), bit_pattern(library[weight])), weight


def test_way_back_refuses_what_gptq_cannot_hold(tmp_path):
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False,
              "checkpoint_format": "gptq"}
    rng = np.random.default_rng(0)
    values = rng.standard_normal((16, 64)).astype(np.float32)
    float32_scales = hs.builders.quantize(values, "per_block", storage="uint4", axis=1, block_size=32,
                                          scale_type="float32")
    with pytest.raises(NoExactForm, match="float32 scales"):
        gptq.parts_of("x.weight", float32_scales, config)
    wrong_axis = hs.builders.quantize(values, "per_block", storage="uint4", axis=0, block_size=8,
                                      scale_type="float16")
    with pytest.raises(NoExactForm, match="axis 1"):
        gptq.parts_of("x.weight", wrong_axis, config)
    eight_bits = hs.builders.quantize(values, "per_block", storage="uint8", axis=1, block_size=32,
                                      scale_type="float16")
    with pytest.raises(NoExactForm, match="4-bit"):
        gptq.parts_of("x.weight", eight_bits, config)
    small_blocks = hs.builders.quantize(values, "per_block", storage="uint4", axis=1, block_size=16,
                                        scale_type="float16")
    with pytest.raises(NoExactForm, match="blocks of 16"):
        gptq.parts_of("x.weight", small_blocks, config)


# --------------------------------------------------------------------------------------
# parts made by hand, against gptqmodel's TorchLinear


def _parts(rng, in_features, out_features, bits, group, zeros):
    per = 32 // bits
    from hurray_schema.conversion.quantized.packing import pack_words

    codes = rng.integers(0, 1 << bits, (in_features, out_features)).astype(np.uint8)
    qweight = pack_words(codes, bits, axis=0)
    words = pack_words(zeros.astype(np.uint8), bits, axis=1)
    scales = (rng.random((in_features // group, out_features)) * 0.02 + 0.001).astype(np.float16)
    assert words.shape == (in_features // group, out_features // per)
    return qweight, words, scales


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_v1_borrow_and_v2_zeros_match_the_library(tmp_path, bits, checkpoint_format):
    """v1 stores each zero-point *word* minus one per lane: a zero point 0 borrows from its
    neighbour, and the library's word-wise add brings both back; v2 stores them as they are."""
    rng = np.random.default_rng(bits)
    in_features, out_features, group = 64, 32, 32
    top = (1 << bits) - 1
    zeros = rng.integers(0, top + 1, (in_features // group, out_features))
    zeros[0, :4] = [0, min(5, top), 0, top]  # lanes whose v1 minus one borrows
    qweight, v2_words, scales = _parts(rng, in_features, out_features, bits, group, zeros)
    if checkpoint_format == "gptq":
        ones = sum(1 << (bits * k) for k in range(32 // bits))
        qzeros = ((v2_words.view(np.uint32).astype(np.int64) - ones) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    else:
        qzeros = v2_words
    g_idx = (np.arange(in_features) // group).astype(np.int32)
    library = models.dequantize_parts(qweight, qzeros, scales, g_idx, bits=bits, group_size=group,
                                      checkpoint_format=checkpoint_format)
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": False, "desc_act": False,
              "checkpoint_format": checkpoint_format}
    arrays = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
    tensor = gptq.source("x.weight", arrays, config)
    path = str(tmp_path / "x.hrry")
    hs.write_file(path, {"x.weight": tensor})
    assert not hs.audit(path).findings
    with hs.read_file(path) as container:
        assert np.array_equal(bit_pattern(container["x.weight"].to_numpy()), bit_pattern(library))
        back = gptq.parts_of("x.weight", container["x.weight"], config)
    assert np.array_equal(bit_pattern(gptq.dequantized("x.weight", arrays, config)), bit_pattern(library))
    for part, array in arrays.items():
        assert back[f"x.{part}"].dtype == array.dtype and back[f"x.{part}"].tobytes() == array.tobytes(), part


def test_whole_groups_out_of_order_are_exact():
    """A g_idx constant over each run of 32 columns but not in group order (groups reordered
    whole) still has a per-block form: each block takes its group's scale and zero point."""
    rng = np.random.default_rng(7)
    in_features, out_features, group = 128, 32, 32
    zeros = rng.integers(1, 16, (4, out_features))
    qweight, words, scales = _parts(rng, in_features, out_features, 4, group, zeros)
    qzeros = (words.view(np.uint32).astype(np.int64) - 0x11111111).astype(np.uint32).view(np.int32)
    g_idx = np.repeat(np.array([2, 0, 3, 1], np.int32), group)
    library = models.dequantize_parts(qweight, qzeros, scales, g_idx, bits=4, group_size=group)
    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": True, "sym": False}
    tensor = gptq.source("x.weight", {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}, config)
    assert tensor.descriptor.quantization.block_size == 32
    assert np.array_equal(bit_pattern(tensor.to_numpy()), bit_pattern(library))


# --------------------------------------------------------------------------------------
# hostile inputs


def _altered(folder, tmp_path, change_tensors=None, change_config=None):
    """A copy of the checkpoint ``folder`` with some tensors or its quantization_config changed."""
    out = tmp_path / "altered"
    shutil.copytree(folder, out)
    if change_tensors is not None:
        tensors = _tensors(folder)
        change_tensors(tensors)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if change_config is not None:
        config = _config(folder)
        change_config(config["quantization_config"])
        (out / "config.json").write_text(json.dumps(config))
    return str(out)


Q = "model.layers.0.self_attn.q_proj"


def _set(name, value):
    def change(tensors):
        tensors[name] = value(tensors[name]) if callable(value) else value
    return change


def _drop(name):
    def change(tensors):
        del tensors[name]
    return change


def _config_set(key, value):
    def change(quant):
        quant[key] = value
    return change


def _scale(value):
    def change(scales):
        scales = scales.copy()
        scales[1, 3] = value
        return scales
    return change


def _g_idx(value):
    def change(g_idx):
        g_idx = g_idx.copy()
        g_idx[5] = value
        return g_idx
    return change


HOSTILE = {
    "qweight rows": (_set(f"{Q}.qweight", lambda a: a[:-4]), None, r"scales of shape .* do not match qweight"),
    "scales columns": (_set(f"{Q}.scales", lambda a: a[:, :-8]), None, r"scales of shape \[4, 120\]"),
    "qzeros shape": (_set(f"{Q}.qzeros", lambda a: a[:-1]), None, r"qzeros of shape \[3, 16\]"),
    "qweight 3-D": (_set(f"{Q}.qweight", lambda a: a[None]), None, r"qweight of shape \[1, 16, 128\] is not 2-D"),
    "qweight dtype": (_set(f"{Q}.qweight", lambda a: a.astype(np.int64)), None, r"qweight int64"),
    "missing qzeros": (_drop(f"{Q}.qzeros"), None, r"q_proj.weight: the GPTQ part .*qzeros.* is missing"),
    "g_idx out of range": (_set(f"{Q}.g_idx", _g_idx(4)), None, r"g_idx\[5\] = 4 is out of range for 4 groups"),
    "g_idx negative": (_set(f"{Q}.g_idx", _g_idx(-1)), None, r"g_idx\[5\] = -1 is out of range"),
    "g_idx length": (_set(f"{Q}.g_idx", lambda a: a[:-1]), None, r"g_idx of shape \[127\]"),
    "group size": (None, _config_set("group_size", 48), r"group size 48 does not divide the 128 input features"),
    "group size zero": (None, _config_set("group_size", 0), r"group_size 0"),
    "bits": (None, _config_set("bits", 5), r"bits 5"),
    "checkpoint_format": (None, _config_set("checkpoint_format", "gptq_v3"), r"checkpoint_format 'gptq_v3'"),
    "formats disagree": (None, _config_set("format", "gptq_v2"), r"checkpoint_format 'gptq' and format 'gptq_v2'"),
    "pack_dtype": (None, _config_set("pack_dtype", "int16"), r"pack_dtype 'int16'"),
    "dynamic": (None, _config_set("dynamic", {".*q_proj.*": {"bits": 8}}), r"dynamic"),
    "desc_act text": (None, _config_set("desc_act", "yes"), r"desc_act 'yes'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_checkpoints_are_typed_errors(checkpoints, tmp_path, case):
    change_tensors, change_config, message = HOSTILE[case]
    folder = _altered(checkpoints["asym"][0], tmp_path, change_tensors, change_config)
    with pytest.raises(HurraySchemaError, match=message) as caught:
        hs.convert(folder, str(tmp_path / "model.hrry"))
    assert not isinstance(caught.value, NoExactForm)
    assert not os.path.exists(tmp_path / "model.hrry")


@pytest.mark.parametrize("value", [0.0, np.inf, np.nan])
def test_zero_or_non_finite_scales_are_refused(checkpoints, tmp_path, value):
    """A per-block scale must be finite and non-zero (``§ Validity Constraints``): the linear is
    refused with the rule's SpecViolation naming the tensor and the scale, dequantized or not (the
    tensor has a form; its value breaks the rule), and nothing is written."""
    folder = _altered(checkpoints["asym"][0], tmp_path, _set(f"{Q}.scales", _scale(value)))
    for options in ({}, {"dequantize": True}):
        with pytest.raises(SpecViolation, match=r"q_proj.weight: scale \d+ is .*, not finite and non-zero") as caught:
            hs.convert(folder, str(tmp_path / "model.hrry"), **options)
        assert caught.value.rule_id == "quantization.per_block.scale_values"
        assert not os.path.exists(tmp_path / "model.hrry")


@pytest.mark.parametrize("value", [-0.5, 6e-8], ids=["negative", "subnormal"])
def test_negative_or_subnormal_scales_are_kept(checkpoints, tmp_path, value):
    """The passing counterpart: a finite, non-zero scale is stored as the library holds it."""
    folder = _altered(checkpoints["asym"][0], tmp_path, _set(f"{Q}.scales", _scale(value)))
    dst = str(tmp_path / "model.hrry")
    hs.convert(folder, dst)
    tensors = _tensors(folder)
    library = models.dequantize_parts(tensors[f"{Q}.qweight"], tensors[f"{Q}.qzeros"], tensors[f"{Q}.scales"],
                                      tensors[f"{Q}.g_idx"], bits=4, group_size=32)
    with hs.read_file(dst) as container:
        assert np.array_equal(bit_pattern(container[f"{Q}.weight"].to_numpy()), bit_pattern(library))


def test_gptq_out_needs_a_gptq_config(tmp_path):
    """A Hurray file that carries no GPTQ config.json (group size, v1 or v2 zeros) is not
    written as a GPTQ folder."""
    values = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    path = str(tmp_path / "plain.hrry")
    hs.write_file(path, {"x.weight": hs.builders.quantize(values, "per_block", storage="uint4", axis=1,
                                                           block_size=32, scale_type="float16")})
    with pytest.raises(HurraySchemaError, match="GPTQ config.json"):
        hs.convert(path, str(tmp_path / "out"), to="hf", quantized_as="gptq")


def test_three_bits_have_no_per_block_storage_type():
    """3-bit codes: per-block affine stores uint2, uint4 or uint8 (``§ Valid Storage Types``)."""
    config = {"quant_method": "gptq", "bits": 3, "group_size": 32, "sym": False, "desc_act": False}
    arrays = {"qweight": np.zeros((12, 32), np.int32), "qzeros": np.zeros((4, 3), np.int32),
              "scales": np.ones((4, 32), np.float16), "g_idx": (np.arange(128) // 32).astype(np.int32)}
    with pytest.raises(NoExactForm, match="3-bit GPTQ codes .* § Valid Storage Types"):
        gptq.source("x.weight", arrays, config)
