"""optimum-quanto checkpoints (quanto's own quantization on CPU, saved by
``QuantizedModelForCausalLM.save_pretrained``) converted into Hurray and compared with quanto's
own dequantization, bit for bit.

qint8 is per-channel affine (exact, and back); qint4 with quanto's float shift is refused with the
reason and stored dense with ``dequantize``; qint4 with integer shifts (``zeropoint=True``) is
per-block affine."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation

pytest.importorskip("torch", reason="the fixtures quantize with optimum-quanto, which needs torch")
pytest.importorskip("optimum.quanto", reason="the fixtures quantize with optimum-quanto's own code")

from tests.support.quantized_models import quanto as fixture  # noqa: E402
from tests.support.quantized_models import bit_pattern  # noqa: E402
from tests.support.quantized_models.hqq import to_numpy  # noqa: E402

MODULES = ["lm_head"] + [f"model.layers.0.{name}" for name in
                         ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
LINEARS = [module + ".weight" for module in MODULES]


def _stored(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _zeropoint_optimizer():
    """quanto's ``MaxOptimizer`` asked for integer shifts (its ``zeropoint=True``)."""
    from optimum.quanto.tensor.optimizers import MaxOptimizer

    class ZeroPoint(MaxOptimizer):
        def __call__(self, base, qtype, axis, group_size=None, zeropoint=False):
            return super().__call__(base, qtype, axis, group_size, zeropoint=True)

    return ZeroPoint()


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """name -> (folder, quanto's dequantization), each built once."""
    root = tmp_path_factory.mktemp("quanto")
    cache = {}

    def get(name):
        if name not in cache:
            weights, dtype = {"qint4": ("qint4", "float16"), "qint4-zeropoint": ("qint4", "float16"),
                              "qint2": ("qint2", "float16"),
                              "qint8-float16": ("qint8", "float16"), "qint8-bfloat16": ("qint8", "bfloat16")}[name]
            optimizer = _zeropoint_optimizer() if name == "qint4-zeropoint" else None
            folder = fixture.build(str(root / name), weights, dtype, optimizer=optimizer)
            cache[name] = folder, fixture.library_dequantized(folder)
        return cache[name]

    return get


def _copied_as_they_are(out, folder):
    stored = _stored(folder)
    values = hs.load(out)
    plain = [name for name in stored if not any(name.startswith(weight + ".") for weight in LINEARS)]
    assert "model.embed_tokens.weight" in plain and "lm_head.input_scale" in plain
    assert sorted(plain + LINEARS) == sorted(values)
    for name in plain:
        expected = to_numpy(stored[name])
        assert values[name].dtype == expected.dtype, name
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name


# --------------------------------------------------------------------------------------
# qint8: per-channel affine, exact, and back
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["qint8-float16", "qint8-bfloat16"])
def test_qint8_is_per_channel_affine_equal_to_quanto(built, tmp_path, variant):
    folder, reference = built(variant)
    assert sorted(reference) == sorted(LINEARS)
    out = tmp_path / "exact.hrry"
    report = hs.convert(folder, out)
    assert hs.audit(out).findings == ()
    opened = hs.read_file(out)
    values = hs.load(out)
    for name, expected in reference.items():
        descriptor = opened.descriptor(name)
        q = descriptor.quantization
        assert type(q).__name__ == "PerChannelAffine" and q.axis == 0
        assert descriptor.type_tag.name == "INT8" and descriptor.shape == expected.shape
        assert expected.dtype.name == variant.split("-")[1]
        got = values[name].astype(expected.dtype)  # per-channel decodes to float32: rounded once here
        assert np.array_equal(bit_pattern(got), bit_pattern(expected)), name
    rows = {row.name: row for row in report.tensors}
    for name in LINEARS:
        assert rows[name].type_in == "quanto qint8"
        assert rows[name].type_out == "int8 per_channel_affine" and rows[name].max_ulp == 0
    assert sum(row.bytes_out for row in report.tensors) <= 1.05 * sum(row.bytes_in for row in report.tensors)
    _copied_as_they_are(out, folder)
    assert opened.metadata().get("hf.file.quanto_qmap.json") == (open(os.path.join(folder, "quanto_qmap.json")).read())


def test_qint8_with_dequantize_is_quantos_bits(built, tmp_path):
    folder, reference = built("qint8-float16")
    out = tmp_path / "dense.hrry"
    hs.convert(folder, out, dequantize=True)
    values = hs.load(out)
    for name, expected in reference.items():
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name


@pytest.mark.parametrize("variant", ["qint8-float16", "qint8-bfloat16"])
def test_qint8_goes_back_to_quantos_layout_byte_for_byte(built, tmp_path, variant):
    folder, reference = built(variant)
    out = tmp_path / "exact.hrry"
    hs.convert(folder, out)
    back = tmp_path / "back"
    hs.convert(out, back, to="hf")
    original, written = _stored(folder), _stored(back)
    assert sorted(written) == sorted(original)
    for name, tensor in original.items():
        assert written[name].dtype == tensor.dtype and written[name].shape == tensor.shape, name
        assert np.array_equal(bit_pattern(to_numpy(written[name])), bit_pattern(to_numpy(tensor))), name
    assert json.loads((back / "quanto_qmap.json").read_text()) == json.loads(
        open(os.path.join(folder, "quanto_qmap.json")).read())
    again = fixture.library_dequantized(str(back))  # quanto loads the folder written back
    for name, expected in reference.items():
        assert np.array_equal(bit_pattern(again[name]), bit_pattern(expected)), name


# --------------------------------------------------------------------------------------
# qint4: a float shift, refused; stored dense
# --------------------------------------------------------------------------------------


def test_qint4_shift_is_a_float(built):
    folder, _ = built("qint4")
    stored = _stored(folder)
    shift = stored["model.layers.0.self_attn.q_proj.weight._shift"]
    scale = stored["model.layers.0.self_attn.q_proj.weight._scale"]
    assert shift.dtype.is_floating_point
    ratio = (shift.float() / scale.float()).numpy()
    assert np.any(ratio != np.round(ratio))  # no integer multiple of the scale


def test_qint4_is_refused_with_the_reason(built, tmp_path):
    folder, _ = built("qint4")
    with pytest.raises(NoExactForm) as caught:
        hs.convert(folder, tmp_path / "out.hrry")
    message = str(caught.value)
    assert "float shift" in message and "no integer multiple of the scale" in message
    assert "quantization/per-block-affine.md" in message and "§ Dequantization Formula" in message
    assert not (tmp_path / "out.hrry").exists()


def test_qint4_with_dequantize_is_quantos_dense_result_bit_for_bit(built, tmp_path):
    folder, reference = built("qint4")
    out = tmp_path / "dense.hrry"
    report = hs.convert(folder, out, dequantize=True)
    assert hs.audit(out).findings == ()
    values = hs.load(out)
    assert sorted(reference) == sorted(LINEARS)
    for name, expected in reference.items():
        assert values[name].dtype == np.float16 and values[name].shape == expected.shape, name
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name
    rows = {row.name: row for row in report.tensors}
    assert rows["model.layers.0.mlp.down_proj.weight"].type_in == "quanto qint4 g128"  # 256 inputs: groups
    assert rows["model.layers.0.self_attn.q_proj.weight"].type_in == "quanto qint4 g64"  # 64 inputs: whole rows
    assert all(rows[name].max_ulp == 0 and "float shift" in rows[name].note for name in LINEARS)
    _copied_as_they_are(out, folder)


def test_qint2_is_refused_and_stored_dense_bit_for_bit(built, tmp_path):
    folder, reference = built("qint2")
    with pytest.raises(NoExactForm, match="quanto qint2 dequantizes scale \\* q - shift with a float shift"):
        hs.convert(folder, tmp_path / "out.hrry")
    out = tmp_path / "dense.hrry"
    hs.convert(folder, out, dequantize=True)
    values = hs.load(out)
    assert sorted(reference) == sorted(LINEARS)
    for name, expected in reference.items():
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name


def test_in_features_quanto_does_not_record_come_from_the_config(built, tmp_path):
    folder, _ = built("qint4")
    edited = _edited(folder, tmp_path)
    config = json.loads((edited / "config.json").read_text())
    del config["intermediate_size"]
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(HurraySchemaError, match="model.layers.0.mlp.down_proj.weight: .*config.json gives no "
                                                "in_features") as caught:
        hs.convert(edited, tmp_path / "out.hrry", dequantize=True)
    assert not isinstance(caught.value, NoExactForm)


# --------------------------------------------------------------------------------------
# qint4 with integer shifts: per-block affine
# --------------------------------------------------------------------------------------


def test_qint4_integer_shifts_are_per_block_affine_equal_to_quanto(built, tmp_path):
    folder, reference = built("qint4-zeropoint")
    assert _stored(folder)["model.layers.0.mlp.down_proj.weight._shift"].dtype.is_floating_point is False
    out = tmp_path / "exact.hrry"
    report = hs.convert(folder, out)
    assert hs.audit(out).findings == ()
    opened = hs.read_file(out)
    values = hs.load(out)
    for name, expected in reference.items():
        q = opened.descriptor(name).quantization
        assert type(q).__name__ == "PerBlockAffine" and q.axis == 1
        assert q.block_size == (128 if "down_proj" in name else 64)
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name
    assert all(row.max_ulp == 0 for row in report.tensors if row.name in LINEARS)
    with pytest.raises(NoExactForm, match="no quanto form"):
        hs.convert(out, tmp_path / "back", to="hf")


# --------------------------------------------------------------------------------------
# Hostile inputs
# --------------------------------------------------------------------------------------


def _edited(folder, tmp_path, edit=None, qmap_text=None):
    from safetensors.torch import save_file

    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    if edit is not None:
        tensors = _stored(folder)
        edit(tensors)
        save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    if qmap_text is not None:
        (copy / "quanto_qmap.json").write_text(qmap_text)
    return copy


W = "model.layers.0.self_attn.q_proj.weight"


def _replace(part, change):
    def edit(tensors):
        tensors[W + part] = change(tensors[W + part].clone())
    return edit


def _at(value):
    def change(tensor):
        tensor[5, 0] = value
        return tensor
    return change


HOSTILE8 = {
    "scales for other rows": (_replace("._scale", lambda t: t[:-1]), "scale [63, 1] for data [64, 64]"),
    "data that is not int8": (_replace("._data", lambda t: t.to(__import__("torch").int16)), "not int8"),
    "a missing scale": (lambda tensors: tensors.pop(W + "._scale"), "not in the checkpoint"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE8))
def test_hostile_qint8_checkpoints_are_typed_errors(built, tmp_path, case):
    folder, _ = built("qint8-float16")
    edit, words = HOSTILE8[case]
    with pytest.raises(HurraySchemaError) as caught:
        hs.convert(_edited(folder, tmp_path, edit), tmp_path / "out.hrry")
    assert not isinstance(caught.value, NoExactForm)
    assert not isinstance(caught.value, SpecViolation)
    assert W in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize("variant, rule", [("qint8-float16", "quantization.per_channel.scale_values"),
                                           ("qint4-zeropoint", "quantization.per_block.scale_values")])
@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf")], ids=["zero", "nan", "inf"])
def test_a_zero_or_non_finite_scale_is_the_rules_spec_violation(built, tmp_path, variant, rule, value):
    """The tensor is built as it is; decoding it to measure it breaks the scheme's rule on the
    scale values, which names the tensor; nothing is written."""
    folder, _ = built(variant)
    with pytest.raises(SpecViolation, match=rf"{W}: scale \d+ is .*, not finite and non-zero") as caught:
        hs.convert(_edited(folder, tmp_path, _replace("._scale", _at(value))), tmp_path / "out.hrry")
    assert caught.value.rule_id == rule
    assert not (tmp_path / "out.hrry").exists()


@pytest.mark.parametrize("variant", ["qint8-float16", "qint4-zeropoint"])
def test_a_negative_scale_is_kept(built, tmp_path, variant):
    """The passing counterpart: a finite, non-zero scale, negative too, is quanto's and stays."""
    folder, _ = built(variant)
    report = hs.convert(_edited(folder, tmp_path, _replace("._scale", _at(-0.5))), tmp_path / "out.hrry")
    row = {row.name: row for row in report.tensors}[W]
    assert row.exact and row.max_ulp == 0


HOSTILE4 = {
    "codes not matching the packing": (_replace("._data._data", lambda t: t[:-1]), "pack into"),
    "a shift of another shape": (_replace("._shift", lambda t: t[:-1]), "pack into"),
    "a shift of integers wider than a code": (_replace("._shift", lambda t: t.to(__import__("torch").int16)),
                                              "shift is torch.int16"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE4))
def test_hostile_qint4_checkpoints_are_typed_errors(built, tmp_path, case):
    folder, _ = built("qint4-zeropoint")
    edit, words = HOSTILE4[case]
    with pytest.raises(HurraySchemaError) as caught:
        hs.convert(_edited(folder, tmp_path, edit), tmp_path / "out.hrry", dequantize=True)
    assert not isinstance(caught.value, NoExactForm)
    assert W in str(caught.value) and words.replace("torch.", "") in str(caught.value)


@pytest.mark.parametrize("text, words", [
    ("{not json", "quanto_qmap.json: not a JSON document"),
    ("[1, 2]", "quanto_qmap.json: not a JSON object"),
    (json.dumps({"model.layers.0.self_attn.q_proj": {"activations": "none"}}), "has no 'weights' qtype"),
    (json.dumps({"model.layers.0.self_attn.q_proj": {"weights": "qfloat8", "activations": "none"}}),
     "quanto weights 'qfloat8' are not read here"),
])
def test_a_malformed_quantization_map_is_a_typed_error(built, tmp_path, text, words):
    folder, _ = built("qint8-float16")
    with pytest.raises(HurraySchemaError) as caught:
        hs.convert(_edited(folder, tmp_path, qmap_text=text), tmp_path / "out.hrry")
    assert not isinstance(caught.value, NoExactForm)
    assert words in str(caught.value)


def test_the_command_line_reads_the_map_beside_a_single_file(built, tmp_path):
    from tests.support.cli import run

    folder, reference = built("qint8-float16")
    done = run("convert", os.path.join(folder, "model.safetensors"), tmp_path / "exact.hrry")
    assert done.returncode == 0, done.stderr.decode()
    opened = hs.read_file(tmp_path / "exact.hrry")
    values = hs.load(tmp_path / "exact.hrry")
    for name, expected in reference.items():
        assert type(opened.descriptor(name).quantization).__name__ == "PerChannelAffine", name
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name
    refused = run("convert", os.path.join(built("qint4")[0], "model.safetensors"), tmp_path / "refused.hrry")
    assert refused.returncode == 2 and "float shift" in refused.stderr.decode()
    dense = run("convert", "--dequantize", os.path.join(built("qint4")[0], "model.safetensors"),
                tmp_path / "dense.hrry")
    assert dense.returncode == 0, dense.stderr.decode()
    values = hs.load(tmp_path / "dense.hrry")
    for name, expected in built("qint4")[1].items():
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name


def test_quanto_tensors_as_hqq_parts_are_refused(built, tmp_path):
    folder, _ = built("qint8-float16")
    out = tmp_path / "exact.hrry"
    hs.convert(folder, out)
    with pytest.raises(HurraySchemaError, match="only a file converted from hqq goes back to it"):
        hs.convert(out, tmp_path / "back", to="hf", quantized_as="hqq")
