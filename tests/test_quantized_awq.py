"""AWQ GEMM checkpoints (autoawq) into Hurray and back: each linear's ``qweight`` / ``qzeros`` /
``scales`` become one per-block affine uint4 tensor that decodes to autoawq's own dequantization bit
for bit; the way back writes the same tensors, byte for byte, and autoawq loads them.

The checkpoints are made by autoawq on CPU (tests/support/quantized_models/awq.py): a one-layer
Llama quantized by ``AutoAWQForCausalLM.quantize`` (group 32, and autoawq's default 128), and
one-linear checkpoints packed by ``WQLinear_GEMM.from_linear`` for other group sizes."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import hurray_schema as hs
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation
from hurray_schema.model import ElementType
from tests.support import cli
from tests.support.quantized_models import bit_pattern

fx = pytest.importorskip("tests.support.quantized_models.awq", exc_type=ImportError,
                         reason="needs torch and autoawq (pip install --no-deps autoawq accelerate datasets)")

from hurray_schema.conversion.quantized import awq  # noqa: E402  (after the skip: the module itself needs neither)

SCALE_RULE = "quantization.per_block.scale_values"


# --------------------------------------------------------------------------------------
# Checkpoints, built once
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """The tiny Llama quantized by autoawq, group 32."""
    return fx.build(tmp_path_factory.mktemp("awq-g32"), group_size=32)


@pytest.fixture(scope="session")
def checkpoint_128(tmp_path_factory):
    """The same model at autoawq's default group size, 128."""
    return fx.build(tmp_path_factory.mktemp("awq-g128"), group_size=128)


@pytest.fixture(scope="session")
def reference(checkpoint):
    return fx.library_dequantized(checkpoint)


@pytest.fixture(scope="session")
def converted(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("awq-hrry") / "model.hrry"
    report = hs.convert(checkpoint, out)
    return out, report


def _variant(src, dst, *, tensors=None, drop=(), config=None):
    """A copy of the checkpoint ``src`` in ``dst`` with some tensors replaced or dropped and some
    ``quantization_config`` keys changed."""
    from safetensors.numpy import save_file

    shutil.copytree(src, dst)
    found = fx.tensors(src)
    found.update(tensors or {})
    for name in drop:
        del found[name]
    save_file({k: np.ascontiguousarray(v) for k, v in found.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    if config:
        document = json.loads((dst / "config.json").read_text())
        document["quantization_config"].update(config)
        (dst / "config.json").write_text(json.dumps(document))
    return dst


Q_PROJ = "model.layers.0.self_attn.q_proj"
DOWN_PROJ = "model.layers.0.mlp.down_proj"


# --------------------------------------------------------------------------------------
# Into Hurray: autoawq's values, bit for bit
# --------------------------------------------------------------------------------------


def test_the_reference_is_what_autoawq_computes_both_ways(checkpoint, reference):
    """dequantize_gemm and a WQLinear_GEMM forward on the identity agree: one reference."""
    forward = fx.module_dequantized(checkpoint)
    assert sorted(forward) == sorted(reference) and len(reference) == 7
    for name, dense in reference.items():
        assert dense.dtype == np.float16
        assert np.array_equal(bit_pattern(forward[name]), bit_pattern(dense)), name


def test_every_linear_decodes_to_autoawq_dequantization_bit_for_bit(converted, reference):
    out, _ = converted
    values = hs.load(out)
    for name, dense in reference.items():
        got = np.asarray(values[name])
        assert got.dtype == np.float16 and got.shape == dense.shape, name
        assert np.array_equal(bit_pattern(got), bit_pattern(dense)), name


def test_each_linear_is_one_per_block_uint4_tensor_with_the_library_codes(checkpoint, converted):
    """Codes, zero points and scales stored as autoawq holds them, in output-column order: the
    library's own unpacking (unpack_awq, reverse_awq_order) says which nibble is which column."""
    import torch
    from awq.utils.packing_utils import reverse_awq_order, unpack_awq

    out, _ = converted
    with hs.read_file(out) as opened:
        for name, parts in fx.linears(checkpoint).items():
            tensor = opened[name]
            q = tensor.descriptor.quantization
            assert type(q).__name__ == "PerBlockAffine"
            assert (q.axis, q.block_size, int(q.flags)) == (1, 32, 0)
            assert q.scale_type_tag == ElementType.FLOAT16 and tensor.descriptor.type_tag == ElementType.UINT4
            codes, zeros = unpack_awq(torch.from_numpy(parts["qweight"]), torch.from_numpy(parts["qzeros"]), 4)
            codes, zeros = reverse_awq_order(codes, zeros, 4)
            codes, zeros = (codes & 15).numpy(), (zeros & 15).numpy()
            assert np.array_equal(np.asarray(tensor.to_numpy(raw=True)), codes.T), name
            buffers = tensor.buffers
            scales = np.frombuffer(buffers[q.scale_buffer_index], "<f2")
            points = np.frombuffer(buffers[q.zero_point_buffer_index], "<i4")
            assert np.array_equal(bit_pattern(scales), bit_pattern(parts["scales"].T.reshape(-1))), name
            assert np.array_equal(points, zeros.T.reshape(-1).astype(np.int32)), name


def test_the_module_dequantization_is_autoawq_s(checkpoint, reference):
    config = fx.quantization_config(checkpoint)
    for name, parts in fx.linears(checkpoint).items():
        mine = awq.dequantized(name, parts, config)
        assert mine.dtype == np.float16
        assert np.array_equal(bit_pattern(mine), bit_pattern(reference[name])), name


def test_report_names_the_schemes_and_zero_ulp(checkpoint, converted, reference):
    _, report = converted
    rows = {row.name: row for row in report.tensors}
    for name in reference:
        row = rows[name]
        assert row.type_in == "awq gemm uint4 g32" and "per_block" in row.type_out, name
        assert row.max_ulp == 0 and row.exact, name
    assert not any(name.endswith((".qweight", ".qzeros", ".scales")) for name in rows)


def test_every_other_tensor_is_copied_as_it_is(checkpoint, converted):
    out, _ = converted
    source = fx.tensors(checkpoint)
    plain = {name: value for name, value in source.items()
             if not name.endswith((".qweight", ".qzeros", ".scales"))}
    assert any(name.endswith(".bias") for name in plain) and "lm_head.weight" in plain
    values = hs.load(out)
    assert set(values) == set(plain) | set(fx.linears(checkpoint))
    for name, value in plain.items():
        got = np.asarray(values[name])
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name


def test_the_file_audits_clean(converted):
    out, _ = converted
    assert hs.audit(out).findings == ()


def _stored_bytes(linear_shape, group) -> int:
    """uint4 codes, a float16 scale and an int32 zero point per block (per-block-affine.md
    § Referenced Buffers)."""
    out_features, in_features = linear_shape
    blocks = out_features * in_features // group
    return out_features * in_features // 2 + blocks * (2 + 4)


def test_stored_bytes_are_codes_scales_and_int32_zero_points(checkpoint, converted):
    _, report = converted
    rows = {row.name: row for row in report.tensors}
    for name, parts in fx.linears(checkpoint).items():
        shape = (parts["scales"].shape[1], parts["qweight"].shape[0])
        assert rows[name].bytes_in == sum(p.nbytes for p in parts.values())
        assert rows[name].bytes_out == _stored_bytes(shape, 32), name


def test_at_the_default_group_size_the_tensors_take_at_most_1_05_times_the_checkpoint(checkpoint_128, tmp_path):
    """Group 128: 66.5 bytes an AWQ block, 70 here (an int32 zero point where AWQ packs 4 bits).
    The file adds each buffer's alignment to 4096 bytes (file-format.md § File Header), which a
    model this small cannot hide."""
    out = tmp_path / "model.hrry"
    report = hs.convert(checkpoint_128, out)
    source_bytes = sum(value.nbytes for value in fx.tensors(checkpoint_128).values())
    assert sum(row.bytes_in for row in report.tensors) == source_bytes
    assert sum(row.bytes_out for row in report.tensors) <= 1.05 * source_bytes
    with hs.read_file(out) as opened:
        buffers = sum(len(opened[name].buffers) for name in opened)
    safetensors_bytes = os.path.getsize(checkpoint_128 / "model.safetensors")
    assert os.path.getsize(out) <= 1.05 * safetensors_bytes + 4096 * buffers
    values = hs.load(out)
    for name, dense in fx.library_dequantized(checkpoint_128).items():
        assert np.array_equal(bit_pattern(np.asarray(values[name])), bit_pattern(dense)), name


def test_group_size_minus_one_is_one_group_over_the_inputs(checkpoint_128, tmp_path):
    """-1 (one group per output) reads as group 128 over 128 inputs: the same tensor."""
    whole = fx.build_linear(tmp_path / "g128", in_features=128, out_features=64, group_size=128)
    minus = _variant(whole, tmp_path / "g-1", config={"group_size": -1})
    a, b = tmp_path / "a.hrry", tmp_path / "b.hrry"
    hs.convert(whole, a)
    hs.convert(minus, b)
    got = np.asarray(hs.load(b)["model.proj.weight"])
    assert np.array_equal(bit_pattern(got), bit_pattern(fx.library_dequantized(whole)["model.proj.weight"]))
    with hs.read_file(a) as fa, hs.read_file(b) as fb:
        assert fa["model.proj.weight"].same_content(fb["model.proj.weight"])


def test_dequantize_keeps_the_exact_form_and_the_bits(checkpoint, reference, tmp_path):
    out = tmp_path / "model.hrry"
    report = hs.convert(checkpoint, out, dequantize=True)
    assert all(row.max_ulp == 0 for row in report.tensors if row.name in reference)
    values = hs.load(out)
    for name, dense in reference.items():
        assert np.array_equal(bit_pattern(np.asarray(values[name])), bit_pattern(dense)), name


def test_cli_converts_the_folder(checkpoint, reference, tmp_path):
    out = tmp_path / "model.hrry"
    done = cli.run("convert", checkpoint, out)
    assert done.returncode == 0, done.stderr.decode()
    values = hs.load(out)
    for name, dense in reference.items():
        assert np.array_equal(bit_pattern(np.asarray(values[name])), bit_pattern(dense)), name


# --------------------------------------------------------------------------------------
# A group size that is no power of two: no exact form, unless dequantized
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def group_48(tmp_path_factory):
    return fx.build_linear(tmp_path_factory.mktemp("awq-g48"), in_features=96, out_features=64, group_size=48)


def test_a_group_size_that_is_no_power_of_two_is_refused(group_48, tmp_path):
    with pytest.raises(NoExactForm, match=r"model\.proj\.weight.*group size 48 is not a power of two.*"
                                          r"per-block-affine\.md § Validity Constraints"):
        hs.convert(group_48, tmp_path / "model.hrry")
    assert not (tmp_path / "model.hrry").exists()


def test_dequantize_stores_autoawq_dense_result_for_group_48(group_48, tmp_path):
    out = tmp_path / "model.hrry"
    report = hs.convert(group_48, out, dequantize=True)
    (row,) = report.tensors
    assert row.max_ulp == 0 and "stored decoded (float16)" in row.note
    got = np.asarray(hs.load(out)["model.proj.weight"])
    dense = fx.library_dequantized(group_48)["model.proj.weight"]
    assert got.dtype == np.float16 and np.array_equal(bit_pattern(got), bit_pattern(dense))
    assert hs.audit(out).findings == ()


def test_cli_dequantize_for_group_48(group_48, tmp_path):
    refused = cli.run("convert", group_48, tmp_path / "a.hrry")
    assert refused.returncode != 0 and "power of two" in refused.stderr.decode()
    done = cli.run("convert", "--dequantize", group_48, tmp_path / "b.hrry")
    assert done.returncode == 0, done.stderr.decode()
    dense = fx.library_dequantized(group_48)["model.proj.weight"]
    assert np.array_equal(bit_pattern(np.asarray(hs.load(tmp_path / "b.hrry")["model.proj.weight"])), bit_pattern(dense))


# --------------------------------------------------------------------------------------
# The way back
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def round_trip(converted, tmp_path_factory):
    out, _ = converted
    folder = tmp_path_factory.mktemp("awq-back") / "model"
    hs.convert(out, folder, to="hf")
    return folder


def test_the_way_back_writes_every_tensor_byte_identical(checkpoint, round_trip):
    source, back = fx.tensors(checkpoint), fx.tensors(round_trip)
    assert sorted(back) == sorted(source)
    for name, value in source.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        assert back[name].tobytes() == value.tobytes(), name
    assert json.loads((round_trip / "config.json").read_text()) == json.loads((checkpoint / "config.json").read_text())


def test_the_way_back_loads_in_autoawq_to_the_same_bits(checkpoint, round_trip, reference):
    """autoawq's WQLinear_GEMM modules, loaded from the folder, dequantize to the same bits, and the
    whole model computes the same logits as the checkpoint autoawq saved."""
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    model = fx.load(round_trip)
    modules = {f"{name}.weight": module for name, module in model.named_modules() if isinstance(module, WQLinear_GEMM)}
    assert sorted(modules) == sorted(reference)
    for name, module in modules.items():
        dense = dequantize_gemm(module.qweight, module.qzeros, module.scales, module.w_bit, module.group_size)
        assert np.array_equal(bit_pattern(dense.t().numpy()), bit_pattern(reference[name])), name
    tokens = list(range(3, 40, 2))
    assert np.array_equal(bit_pattern(fx.logits(round_trip, tokens)), bit_pattern(fx.logits(checkpoint, tokens)))


def test_the_way_back_loads_in_transformers_to_the_same_bits(round_trip, reference):
    """transformers 5 loads an AWQ folder through gptqmodel's AWQ kernels; their dequantized weights
    are autoawq's, bit for bit."""
    pytest.importorskip("gptqmodel", reason="transformers loads AWQ checkpoints through gptqmodel")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(round_trip, device_map="cpu", dtype=torch.float16)
    dense = {f"{name}.weight": module.dequantize_weight() for name, module in model.named_modules()
             if hasattr(module, "dequantize_weight")}
    assert sorted(dense) == sorted(reference)
    for name, weight in dense.items():
        assert np.array_equal(bit_pattern(weight.t().contiguous().numpy()), bit_pattern(reference[name])), name


def test_a_file_without_an_awq_config_is_not_written_as_awq(checkpoint, tmp_path):
    dense = checkpoint.parent / "dense"
    out = tmp_path / "q.hrry"
    hs.convert(dense, out, quantize="per_block:uint4")
    with pytest.raises(HurraySchemaError, match="AWQ checkpoint's config.json"):
        hs.convert(out, tmp_path / "folder", to="hf", quantized_as="awq")


def _tensor(codes, scales, zeros, block, storage="uint4", scale_type="float16"):
    from hurray_schema.builders.quantized import quantized_from_codes

    return quantized_from_codes(codes, "per_block", storage=storage, axis=1, scales=scales, zero_points=zeros,
                                block_size=block, scale_type=scale_type)


CONFIG = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32, "zero_point": True}


def test_parts_of_refuses_what_the_gemm_layout_cannot_hold():
    from hurray_schema.builders.quantized import quantized_from_codes

    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (16, 64))
    scales = (rng.random((16, 2)) + 0.5).astype(np.float16)
    zeros = rng.integers(0, 16, (16, 2))
    assert set(awq.parts_of("m.weight", _tensor(codes, scales, zeros, 32), CONFIG)) == {
        "m.qweight", "m.qzeros", "m.scales"}
    cases = {
        "int4 codes": _tensor(codes - 8, scales, zeros - 8, 32, storage="int4"),
        "float32 scales": _tensor(codes, scales.astype(np.float32), zeros, 32, scale_type="float32"),
        "blocks of 64": _tensor(codes, scales[:, :1], zeros[:, :1], 64),
        "zero points within": _tensor(codes, scales, zeros + 16, 32),
        "12 outputs": _tensor(codes[:12], scales[:12], zeros[:12], 32),
        "Nf4 quantization": hs.quantize(rng.random((16, 64)).astype(np.float32), "nf4", block_size=32),
        "block axis 0": quantized_from_codes(codes.T, "per_block", storage="uint4", axis=0,
                                             scales=np.ones((2, 16), np.float16),
                                             zero_points=np.zeros((2, 16), np.int64), block_size=32),
    }
    for why, tensor in cases.items():
        with pytest.raises(NoExactForm, match=rf"m\.weight: .*({why})"):
            awq.parts_of("m.weight", tensor, CONFIG)


def test_parts_of_packs_what_autoawq_unpacks():
    """Codes placed by parts_of come back, column for column, through autoawq's own unpacking."""
    import torch
    from awq.utils.packing_utils import dequantize_gemm

    rng = np.random.default_rng(9)
    codes = rng.integers(0, 16, (24, 64))
    scales = (rng.random((24, 2)) + 0.5).astype(np.float16)
    zeros = rng.integers(0, 16, (24, 2))
    parts = awq.parts_of("m.weight", _tensor(codes, scales, zeros, 32), CONFIG)
    dense = dequantize_gemm(*(torch.from_numpy(parts[f"m.{p}"]) for p in ("qweight", "qzeros", "scales")), 4, 32)
    product = (codes - np.repeat(zeros, 32, axis=1)).astype(np.float32) * np.repeat(scales, 32, axis=1)
    expected = product.astype(np.float16)  # exact in float32, rounded once
    assert np.array_equal(bit_pattern(dense.t().numpy()), bit_pattern(expected))


# --------------------------------------------------------------------------------------
# Hostile inputs
# --------------------------------------------------------------------------------------


def _refused(folder, tmp_path, match, error=HurraySchemaError):
    out = tmp_path / "model.hrry"
    with pytest.raises(error, match=match) as caught:
        hs.convert(folder, out)
    assert not out.exists()
    return caught.value


def test_a_qweight_that_does_not_match_the_scales_is_refused(checkpoint, tmp_path):
    parts = fx.tensors(checkpoint)
    folder = _variant(checkpoint, tmp_path / "ck", tensors={f"{Q_PROJ}.qweight": parts[f"{Q_PROJ}.qweight"][:, :-1]})
    _refused(folder, tmp_path, rf"{Q_PROJ}\.weight: qweight \(128, 15\) packs 120 outputs, scales \(4, 128\) give 128")


def test_qzeros_of_the_wrong_shape_are_refused(checkpoint, tmp_path):
    parts = fx.tensors(checkpoint)
    folder = _variant(checkpoint, tmp_path / "ck", tensors={f"{DOWN_PROJ}.qzeros": parts[f"{DOWN_PROJ}.qzeros"][:-1]})
    _refused(folder, tmp_path, rf"{DOWN_PROJ}\.weight: qzeros \(7, 16\) given, \(8, 16\) expected")


def test_scales_with_the_wrong_group_count_are_refused(checkpoint, tmp_path):
    parts = fx.tensors(checkpoint)
    folder = _variant(checkpoint, tmp_path / "ck", tensors={f"{Q_PROJ}.scales": parts[f"{Q_PROJ}.scales"][:2]})
    _refused(folder, tmp_path, rf"{Q_PROJ}\.weight: scales \(2, 128\) has 2 groups; 128 inputs in groups of 32 make 4")


def test_a_group_size_that_does_not_divide_the_inputs_is_refused(checkpoint, tmp_path):
    folder = _variant(checkpoint, tmp_path / "ck", config={"group_size": 48})
    _refused(folder, tmp_path, r"\.weight: group size 48 does not divide the (128|256) input features")


def test_a_missing_part_is_refused(checkpoint, tmp_path):
    folder = _variant(checkpoint, tmp_path / "ck", drop=[f"{Q_PROJ}.scales"])
    _refused(folder, tmp_path, rf"{Q_PROJ}\.weight: the AWQ part\(s\) \['{Q_PROJ}\.scales'\] are not in the checkpoint")


def test_parts_of_another_type_are_refused(checkpoint, tmp_path):
    parts = fx.tensors(checkpoint)
    folder = _variant(checkpoint, tmp_path / "ck",
                      tensors={f"{Q_PROJ}.scales": parts[f"{Q_PROJ}.scales"].astype(np.float32)})
    _refused(folder, tmp_path, rf"{Q_PROJ}\.weight: AWQ scales is float32; autoawq's GEMM layout keeps float16")


@pytest.mark.parametrize("bad", [0.0, np.inf, np.nan], ids=["zero", "inf", "nan"])
def test_a_zero_or_non_finite_scale_is_a_spec_violation(checkpoint, tmp_path, bad):
    parts = fx.tensors(checkpoint)
    scales = parts[f"{Q_PROJ}.scales"].copy()
    scales[1, 5] = bad
    folder = _variant(checkpoint, tmp_path / "ck", tensors={f"{Q_PROJ}.scales": scales})
    error = _refused(folder, tmp_path, rf"{Q_PROJ}\.weight: scale \d+ is .*, not finite and non-zero",
                     error=SpecViolation)
    assert error.rule_id == SCALE_RULE
    assert error.citation == "quantization/per-block-affine.md § Validity Constraints"


@pytest.mark.parametrize("value", [-0.5, 6e-8], ids=["negative", "subnormal"])
def test_a_negative_or_subnormal_scale_is_kept(checkpoint, tmp_path, value):
    """The passing counterpart: any finite, non-zero float16 scale is the library's and stays."""
    parts = fx.tensors(checkpoint)
    scales = parts[f"{Q_PROJ}.scales"].copy()
    scales[1, 5] = value
    folder = _variant(checkpoint, tmp_path / "ck", tensors={f"{Q_PROJ}.scales": scales})
    report = hs.convert(folder, tmp_path / "model.hrry")
    assert all(row.max_ulp == 0 for row in report.tensors if row.max_ulp is not None)


@pytest.mark.parametrize("config, match", [
    ({"bits": 8}, r"AWQ bits 8; autoawq's GEMM layout packs 4-bit codes only"),
    ({"version": "gemv"}, r"AWQ version 'gemv' is not read here; only the GEMM layout is"),
    ({"version": "marlin"}, r"AWQ version 'marlin' is not read here"),
    ({"zero_point": False}, r"AWQ zero_point False"),
    ({"group_size": 0}, r"AWQ group_size 0 is neither a positive integer nor -1"),
    ({"group_size": "32"}, r"AWQ group_size '32'"),
], ids=["bits-8", "gemv", "marlin", "no-zero-point", "group-0", "group-text"])
def test_configurations_outside_the_gemm_layout_are_refused(checkpoint, tmp_path, config, match):
    folder = _variant(checkpoint, tmp_path / "ck", config=config)
    error = _refused(folder, tmp_path, match)
    assert not isinstance(error, NoExactForm)
