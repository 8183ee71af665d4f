"""HQQ 4-bit checkpoints (hqq's own quantization on CPU, saved by hqq) converted into Hurray and
compared with hqq's own dequantization, bit for bit.

hqq's default (its proximal optimizer) leaves float zeros: refused with the reason, stored dense
with ``dequantize``.  Without the optimizer the 4-bit zeros are rounded to integers: per-block
affine, exact at 0 ULP."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation

pytest.importorskip("torch", reason="the fixtures quantize with hqq, which needs torch")
pytest.importorskip("hqq", reason="the fixtures quantize with hqq's own code")

from tests.support.quantized_models import hqq as fixture  # noqa: E402
from tests.support.quantized_models import bit_pattern  # noqa: E402

LINEARS = [f"model.layers.0.{name}.weight" for name in
           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")]


def _stored(folder) -> dict:
    """The checkpoint's tensors as safetensors (torch) reads them."""
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


@pytest.fixture(scope="session")
def optimized(tmp_path_factory):
    """hqq's default 4-bit quantization (optimize=True), float16: (folder, hqq's dequantization)."""
    folder = fixture.build(str(tmp_path_factory.mktemp("hqq") / "optimized"), optimize=True, dtype="float16")
    return folder, fixture.library_dequantized(folder)


@pytest.fixture(scope="session")
def integer(tmp_path_factory):
    """hqq 4-bit without its optimizer (zeros rounded), bfloat16: (folder, hqq's dequantization)."""
    folder = fixture.build(str(tmp_path_factory.mktemp("hqq") / "integer"), optimize=False, dtype="bfloat16")
    return folder, fixture.library_dequantized(folder)


def _copied_as_they_are(out, folder):
    """Every tensor that is no HQQ part is in the Hurray file with the same dtype and bits."""
    stored = _stored(folder)
    values = hs.load(out)
    prefixes = {name[: -len(".weight")] for name in LINEARS}
    plain = [name for name in stored if name.rsplit(".", 1)[0] not in prefixes]
    assert plain and sorted(plain + LINEARS) == sorted(values)
    for name in plain:
        expected = fixture.to_numpy(stored[name])
        assert values[name].dtype == expected.dtype, name
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name


# --------------------------------------------------------------------------------------
# Float zeros: refused, then stored dense
# --------------------------------------------------------------------------------------


def test_hqq_default_zeros_are_floats(optimized):
    folder, _ = optimized
    zero = _stored(folder)["model.layers.0.self_attn.q_proj.zero"].float().numpy()
    assert np.any(zero != np.round(zero))


def test_float_zeros_are_refused_with_the_reason(optimized, tmp_path):
    folder, _ = optimized
    with pytest.raises(NoExactForm) as caught:
        hs.convert(folder, tmp_path / "out.hrry")
    message = str(caught.value)
    assert "HQQ's zero is a float" in message
    assert "quantization/per-block-affine.md § Referenced Buffers" in message
    assert not (tmp_path / "out.hrry").exists()


def test_dequantize_stores_hqqs_dense_result_bit_for_bit(optimized, tmp_path):
    folder, reference = optimized
    out = tmp_path / "dense.hrry"
    report = hs.convert(folder, out, dequantize=True)
    assert hs.audit(out).findings == ()
    values = hs.load(out)
    assert sorted(reference) == sorted(LINEARS)
    for name, expected in reference.items():
        assert values[name].dtype == np.float16 and values[name].shape == expected.shape, name
        assert np.array_equal(bit_pattern(values[name]), bit_pattern(expected)), name
    rows = {row.name: row for row in report.tensors}
    for name in LINEARS:
        assert rows[name].type_in == "hqq int4 g64 axis1"
        assert rows[name].max_ulp == 0
        assert "HQQ's zero is a float" in rows[name].note
    _copied_as_they_are(out, folder)


# --------------------------------------------------------------------------------------
# Integer zeros: per-block affine, exact
# --------------------------------------------------------------------------------------


def test_without_the_optimizer_hqq_zeros_are_integers(integer):
    folder, _ = integer
    zero = _stored(folder)["model.layers.0.mlp.down_proj.zero"].float().numpy()
    assert np.array_equal(zero, np.round(zero))


def test_integer_zeros_are_per_block_affine_equal_to_hqq(integer, tmp_path):
    folder, reference = integer
    out = tmp_path / "exact.hrry"
    report = hs.convert(folder, out)
    assert hs.audit(out).findings == ()
    opened = hs.read_file(out)
    values = hs.load(out)
    for name, expected in reference.items():
        q = opened.descriptor(name).quantization
        assert type(q).__name__ == "PerBlockAffine"
        assert (q.axis, q.block_size) == (1, 64)
        assert opened.descriptor(name).type_tag.name == "UINT4"
        assert expected.dtype.name == "bfloat16"
        got = values[name].astype(expected.dtype)
        assert got.shape == expected.shape
        assert np.array_equal(bit_pattern(got), bit_pattern(expected)), name
    rows = {row.name: row for row in report.tensors}
    for name in LINEARS:
        assert rows[name].type_out == "uint4 per_block_affine" and rows[name].max_ulp == 0 and rows[name].exact
    _copied_as_they_are(out, folder)
    # the tensors' bytes (the report's, buffers without the file's 4 KiB data alignment, which
    # dominates a model this small): int32 zero points where hqq keeps float16 / bfloat16 ones
    assert sum(row.bytes_out for row in report.tensors) <= 1.05 * sum(row.bytes_in for row in report.tensors)


def test_integer_zeros_with_dequantize_are_hqqs_bits(integer, tmp_path):
    folder, reference = integer
    out = tmp_path / "dense.hrry"
    hs.convert(folder, out, dequantize=True)
    values = hs.load(out)
    # an exact form exists, so dequantize keeps it: the decoded values are hqq's
    for name, expected in reference.items():
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name


def test_the_way_back_to_hqq_is_refused(integer, tmp_path):
    folder, _ = integer
    out = tmp_path / "exact.hrry"
    hs.convert(folder, out)
    with pytest.raises(NoExactForm, match="HQQ's layout"):
        hs.convert(out, tmp_path / "back", to="hf")


# --------------------------------------------------------------------------------------
# Hostile inputs
# --------------------------------------------------------------------------------------


def _edited(folder, tmp_path, edit, config_edit=None):
    """A copy of ``folder`` whose tensors ``edit(tensors)`` changed (in place)."""
    from safetensors.torch import save_file

    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    tensors = _stored(folder)
    edit(tensors)
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    if config_edit is not None:
        path = copy / "config.json"
        config = json.loads(path.read_text())
        config_edit(config)
        path.write_text(json.dumps(config))
    return copy


def _text(value: str):
    import torch

    return torch.tensor([ord(c) for c in value], dtype=torch.uint8)


def _scalar(value: int):
    import torch

    return torch.tensor(value, dtype=torch.int32)


P = "model.layers.0.self_attn.q_proj."


def _set(name, value):
    def edit(tensors):
        tensors[P + name] = value() if callable(value) else value
    return edit


def _drop_row(tensors):
    tensors[P + "W_q"] = tensors[P + "W_q"][:-1].clone()


def _scale_value(value):
    def edit(tensors):
        scale = tensors[P + "scale"].clone()
        scale[3, 0] = value
        tensors[P + "scale"] = scale
    return edit


def _drop(name):
    def edit(tensors):
        del tensors[P + name]
    return edit


HOSTILE = {
    "codes not matching the packing": (_drop_row, "W_q is uint8"),
    "group size not dividing the elements": (_set("group_size", lambda: _scalar(48)), "group size 48 does not divide"),
    "group size the codes do not have": (_set("group_size", lambda: _scalar(32)), "W_q is uint8"),
    "unknown packing": (_set("packing", lambda: _text("8bit_u8")), "packed '8bit_u8'"),
    "bits the packing does not hold": (_set("nbits", lambda: _scalar(2)), "nbits 2 packed '4bit_u8'"),
    "unknown axis": (_set("axis", lambda: _scalar(2)), "axis 2"),
    "unknown compute dtype": (_set("compute_dtype", lambda: _text("torch.int8")), "compute_dtype 'torch.int8'"),
    "a shape of three dimensions": (_set("shape", lambda: __import__("torch").tensor([64, 64, 1])),
                                    "is not [out_features, in_features]"),
    "scales of the wrong shape": (lambda t: t.__setitem__(P + "scale", t[P + "scale"][:-1].clone()),
                                  "one float per group"),
    "a missing zero": (_drop("zero"), "missing"),
    "codes viewed as float": (_set("view_as_float", lambda: __import__("torch").tensor(1, dtype=__import__("torch").uint8)),
                              "viewed as float"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_checkpoints_are_typed_errors_naming_the_tensor(integer, tmp_path, case):
    folder, _ = integer
    edit, words = HOSTILE[case]
    edited = _edited(folder, tmp_path, edit)
    with pytest.raises(HurraySchemaError) as caught:
        hs.convert(edited, tmp_path / "out.hrry")
    assert not isinstance(caught.value, NoExactForm)
    assert not isinstance(caught.value, SpecViolation)
    assert "model.layers.0.self_attn.q_proj.weight" in str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf")], ids=["zero", "nan", "inf"])
def test_a_zero_or_non_finite_scale_is_the_rules_spec_violation(integer, tmp_path, value):
    """The tensor is built as it is; decoding it to measure it breaks
    ``quantization.per_block.scale_values``, which names the tensor; nothing is written."""
    folder, _ = integer
    with pytest.raises(SpecViolation, match=r"model\.layers\.0\.self_attn\.q_proj\.weight: scale \d+ is .*, "
                                            r"not finite and non-zero") as caught:
        hs.convert(_edited(folder, tmp_path, _scale_value(value)), tmp_path / "out.hrry")
    assert caught.value.rule_id == "quantization.per_block.scale_values"
    assert not (tmp_path / "out.hrry").exists()


def test_a_negative_scale_is_kept(integer, tmp_path):
    """The passing counterpart: a finite, non-zero scale, negative too, is hqq's and stays."""
    folder, _ = integer
    edited = _edited(folder, tmp_path, _scale_value(-0.5))
    report = hs.convert(edited, tmp_path / "out.hrry")
    row = {row.name: row for row in report.tensors}["model.layers.0.self_attn.q_proj.weight"]
    assert row.exact and row.max_ulp == 0


def test_a_quantization_config_that_is_no_object_is_refused(integer, tmp_path):
    folder, _ = integer
    edited = _edited(folder, tmp_path, lambda tensors: None,
                     lambda config: config.__setitem__("quantization_config", "hqq"))
    with pytest.raises(HurraySchemaError, match="quantization_config is not a JSON object"):
        hs.convert(edited, tmp_path / "out.hrry")


# --------------------------------------------------------------------------------------
# Other bit widths: 8 (one code a byte), 2 and 1 (four and eight rows to a byte), 3 (not read)
# --------------------------------------------------------------------------------------

STORAGE = {8: "UINT8", 2: "UINT2", 1: "UINT2"}


@pytest.mark.parametrize("nbits", [8, 2, 1])
def test_other_bit_widths_with_integer_zeros_are_exact(tmp_path_factory, tmp_path, nbits):
    folder = fixture.build(str(tmp_path_factory.mktemp("hqq") / f"bits{nbits}"), optimize=False, dtype="float16",
                           nbits=nbits, round_zero=True)
    reference = fixture.library_dequantized(folder)
    out = tmp_path / "exact.hrry"
    report = hs.convert(folder, out)
    assert hs.audit(out).findings == ()
    opened = hs.read_file(out)
    values = hs.load(out)
    for name, expected in reference.items():
        assert opened.descriptor(name).type_tag.name == STORAGE[nbits], name
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name
    rows = {row.name: row for row in report.tensors}
    assert all(rows[name].type_in == f"hqq int{nbits} g64 axis1" and rows[name].max_ulp == 0 for name in LINEARS)


def test_three_bit_words_are_not_read(integer, tmp_path):
    folder, _ = integer
    edited = _edited(folder, tmp_path, lambda tensors: (tensors.__setitem__(P + "nbits", _scalar(3)),
                                                        tensors.__setitem__(P + "packing", _text("3bit_32"))))
    with pytest.raises(HurraySchemaError, match="nbits 3 packed '3bit_32'"):
        hs.convert(edited, tmp_path / "out.hrry", dequantize=True)


# --------------------------------------------------------------------------------------
# Axis 0: a group is a whole column only when group_size == out_features
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def axis0(tmp_path_factory):
    """hqq 4-bit along axis 0 without its optimizer, float16: (folder, hqq's dequantization)."""
    folder = fixture.build(str(tmp_path_factory.mktemp("hqq") / "axis0"), optimize=False, dtype="float16", axis=0)
    return folder, fixture.library_dequantized(folder)


def test_axis0_groups_across_columns_are_refused(axis0, tmp_path):
    folder, _ = axis0
    with pytest.raises(NoExactForm, match=r"axis-0 groups of 64 .* not consecutive elements along an axis"):
        hs.convert(folder, tmp_path / "out.hrry")


def test_axis0_groups_of_whole_columns_are_per_block_affine_along_axis0(axis0, tmp_path):
    folder, reference = axis0
    out = tmp_path / "mixed.hrry"
    report = hs.convert(folder, out, dequantize=True)
    assert hs.audit(out).findings == ()
    opened = hs.read_file(out)
    values = hs.load(out)
    rows = {row.name: row for row in report.tensors}
    quantized = []
    for name, expected in reference.items():
        q = opened.descriptor(name).quantization
        if expected.shape[0] == 64:  # q_proj, o_proj, down_proj: one group per column
            assert type(q).__name__ == "PerBlockAffine" and (q.axis, q.block_size) == (0, 64), name
            assert rows[name].note == ""
            quantized.append(name)
        else:  # k_proj, v_proj (32 rows), gate_proj, up_proj (128 rows): stored dense
            assert q is None and "axis-0 groups" in rows[name].note, name
        assert rows[name].max_ulp == 0
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name
    assert len(quantized) == 3


# --------------------------------------------------------------------------------------
# The command line, on the single safetensors file beside its config.json
# --------------------------------------------------------------------------------------


def test_the_command_line_converts_the_file_beside_its_config(integer, optimized, tmp_path):
    from tests.support.cli import run

    folder, reference = integer
    done = run("convert", os.path.join(folder, "model.safetensors"), tmp_path / "exact.hrry")
    assert done.returncode == 0, done.stderr.decode()
    values = hs.load(tmp_path / "exact.hrry")
    for name, expected in reference.items():
        assert np.array_equal(bit_pattern(values[name].astype(expected.dtype)), bit_pattern(expected)), name
    refused = run("convert", os.path.join(optimized[0], "model.safetensors"), tmp_path / "refused.hrry")
    assert refused.returncode == 2 and "HQQ's zero is a float" in refused.stderr.decode()
    assert not (tmp_path / "refused.hrry").exists()
