"""bitsandbytes 4-bit checkpoints, quantized and saved by transformers + bitsandbytes on CPU
(tests/support/quantized_models/bitsandbytes.py), converted into Hurray and back.

NF4 (with or without double quantization) whose rows are whole blocks becomes a Hurray NF4 tensor
that decodes to bitsandbytes' own ``dequantize_4bit`` bit for bit; FP4, and NF4 whose blocks
straddle rows, are refused with NoExactForm and stored decoded, exactly, with ``dequantize``."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the bitsandbytes checkpoints are made with torch")
bnb = pytest.importorskip("bitsandbytes", reason="the checkpoints are quantized by bitsandbytes")
pytest.importorskip("transformers", reason="the checkpoints are saved by transformers")
pytest.importorskip("accelerate", reason="transformers' bitsandbytes quantizer needs accelerate")

import hurray_schema as hs  # noqa: E402
from hurray_schema.errors import HurraySchemaError, NoExactForm, SpecViolation  # noqa: E402
from hurray_schema.structs.quantization import NF4_LEVELS  # noqa: E402
from tests.support import cli  # noqa: E402
from tests.support.quantized_models import bitsandbytes as fx  # noqa: E402
from tests.support.quantized_models import bit_pattern  # noqa: E402

ABSMAX_RULE = "quantization.nf4.absmax_values"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bnb")
    return {variant: fx.build(str(folder), variant) for variant in fx.VARIANTS}


@pytest.fixture(scope="session")
def library(checkpoints):
    """variant -> weight -> bitsandbytes' own dequantize_4bit, NumPy in the state's dtype."""
    return {variant: fx.library_dequantized(folder) for variant, folder in checkpoints.items()}


@pytest.fixture(scope="session")
def converted(checkpoints, tmp_path_factory):
    """variant -> (Hurray file, report) for the variants with an exact form."""
    folder = tmp_path_factory.mktemp("bnb-hurray")
    out = {}
    for variant in ("nf4", "nf4-dq"):
        dst = str(folder / f"{variant}.hrry")
        out[variant] = (dst, hs.convert(checkpoints[variant], dst))
    return out


def source_tensors(folder: str) -> dict:
    from safetensors.torch import load_file

    return {name: fx.to_numpy(t) for name, t in load_file(os.path.join(folder, "model.safetensors")).items()}


def safetensors_tensor_bytes(folder: str) -> int:
    return sum(array.nbytes for array in source_tensors(folder).values())


def test_the_nf4_table_is_the_spec_s_bit_for_bit(checkpoints):
    spec = np.array(NF4_LEVELS, np.float32)
    library_table = bnb.functional.get_4bit_type("nf4", device="cpu").numpy()
    assert np.array_equal(bit_pattern(library_table), bit_pattern(spec))
    tensors = source_tensors(checkpoints["nf4"])
    maps = [t for name, t in tensors.items() if name.endswith(".quant_map")]
    assert maps and all(np.array_equal(bit_pattern(m), bit_pattern(spec)) for m in maps)


@pytest.mark.parametrize("variant", ["nf4", "nf4-dq"])
def test_nf4_converts_to_nf4_equal_to_bitsandbytes_bit_for_bit(variant, checkpoints, library, converted):
    path, report = converted[variant]
    expected = library[variant]
    assert len(expected) == 7
    with hs.read_file(path) as f:
        for weight, want in expected.items():
            item = f[weight]
            q = item.descriptor.quantization
            assert type(q).__name__ == "Nf4" and q.axis == 1 and q.block_size == 64
            assert item.descriptor.type_tag.name == "UINT4" and tuple(item.shape) == want.shape
            got = item.to_numpy()
            assert got.dtype == np.float32
            assert np.array_equal(bit_pattern(got.astype(want.dtype)), bit_pattern(want)), weight
    rows = {row.name: row for row in report.tensors}
    assert all(rows[w].max_ulp == 0 and "nf4" in rows[w].type_out for w in expected)


@pytest.mark.parametrize("variant", ["nf4", "nf4-dq"])
def test_the_float32_product_is_bitsandbytes_own(variant, checkpoints, converted):
    """Before the one rounding to the weight's dtype: bitsandbytes dequantizing to float32 gives the
    spec's float32 product ``absmax * nf4[q]`` (``quantization/nf4.md § Dequantization Formula``)."""
    path, _ = converted[variant]
    with hs.read_file(path) as f:
        for weight, (packed, state) in fx.quant_states(checkpoints[variant]).items():
            state.dtype = torch.float32
            want = fx.to_numpy(bnb.functional.dequantize_4bit(packed, state))
            assert np.array_equal(bit_pattern(f[weight].to_numpy()), bit_pattern(want)), weight


def test_codes_are_the_same_with_nibbles_swapped_and_absmax_as_stored(checkpoints, converted):
    tensors = source_tensors(checkpoints["nf4"])
    path, _ = converted["nf4"]
    with hs.read_file(path) as f:
        for weight in fx.library_dequantized(checkpoints["nf4"]):
            item = f[weight]
            src = tensors[weight].reshape(-1)
            swapped = ((src & 0x0F) << 4) | (src >> 4)  # element 2k: bitsandbytes' high nibble, Hurray's low
            assert bytes(item.buffers[0]) == swapped.astype(np.uint8).tobytes()
            assert bytes(item.buffers[1]) == tensors[weight + ".absmax"].astype("<f4").tobytes()
    assert tensors[fx.ZEROED + ".absmax"][0] == 0  # a block of zeros: absmax 0, allowed and exact


def test_double_quantization_stores_the_absmax_bitsandbytes_computes(checkpoints, converted):
    """bitsandbytes' nested absmax (``dequantize_blockwise`` of the uint8 codes, plus the offset),
    stored as float32: 4 bytes a block instead of 1."""
    path, _ = converted["nf4-dq"]
    with hs.read_file(path) as f:
        for weight, (packed, state) in fx.quant_states(checkpoints["nf4-dq"]).items():
            assert state.nested
            absmax = bnb.functional.dequantize_blockwise(state.absmax, state.state2) + state.offset
            assert bytes(f[weight].buffers[1]) == fx.to_numpy(absmax).astype("<f4").tobytes()
            count = int(np.prod(state.shape))
            assert len(f[weight].buffers[1]) == 4 * count // 64


@pytest.mark.parametrize("variant", ["nf4", "nf4-dq"])
def test_files_audit_clean_are_small_and_copy_the_rest(variant, checkpoints, converted):
    path, report = converted[variant]
    assert list(hs.audit(path).findings) == []
    # the tensors' bytes (the file adds its 4096-byte buffer alignment, which a model of a few KiB shows)
    assert report.bytes_out <= 1.05 * report.bytes_in
    assert report.bytes_in == safetensors_tensor_bytes(checkpoints[variant])
    tensors = source_tensors(checkpoints[variant])
    loaded = hs.load(path)
    plain = [n for n in tensors if n.endswith("norm.weight") or n in ("lm_head.weight", "model.embed_tokens.weight")]
    assert len(plain) == 5
    for name in plain:
        assert loaded[name].dtype == tensors[name].dtype and np.array_equal(bit_pattern(loaded[name]), bit_pattern(tensors[name]))
    assert set(loaded) == set(plain) | set(fx.library_dequantized(checkpoints[variant]))


def test_fp4_is_refused_and_stored_decoded_exactly(checkpoints, library, tmp_path):
    with pytest.raises(NoExactForm, match=r"fp4.*quantization/mxfp\.md"):
        hs.convert(checkpoints["fp4"], str(tmp_path / "refused.hrry"))
    assert not (tmp_path / "refused.hrry").exists()
    dst = str(tmp_path / "fp4.hrry")
    report = hs.convert(checkpoints["fp4"], dst, dequantize=True)
    assert list(hs.audit(dst).findings) == []
    flat = fx.flat_dequantized(checkpoints["fp4"])
    loaded = hs.load(dst)
    for weight, want in library["fp4"].items():
        got = loaded[weight]
        assert got.dtype == want.dtype
        # bitsandbytes' own kernels disagree on one bit: code 8 is +0.0 in get_4bit_type, the default
        # kernel and the AVX-512 CPU kernel, -0.0 in the scalar CPU kernel's table.  The stored tensor
        # is the default kernel's bit for bit, and the CPU kernel's wherever its value is not zero.
        assert np.array_equal(bit_pattern(got), bit_pattern(flat[weight])), weight
        nonzero = want.astype(np.float32) != 0
        assert np.array_equal(bit_pattern(got)[nonzero], bit_pattern(want)[nonzero]) and np.array_equal(got == 0, want == 0)
    assert all(row.max_ulp == 0 for row in report.tensors if row.max_ulp is not None)


def test_blocks_straddling_rows_are_refused(checkpoints, library, tmp_path):
    folder = checkpoints["nf4-rows96"]
    with pytest.raises(NoExactForm, match=r"straddle.*per-block-affine\.md § Block Layout"):
        hs.convert(folder, str(tmp_path / "refused.hrry"))
    dst = str(tmp_path / "rows96.hrry")
    hs.convert(folder, dst, dequantize=True)
    flat = fx.flat_dequantized(folder)
    with hs.read_file(dst) as f:
        for weight, want in flat.items():
            item = f[weight]
            if want.shape[1] % 64 == 0:  # down_proj: rows of 128, exact NF4
                assert type(item.descriptor.quantization).__name__ == "Nf4"
                assert np.array_equal(bit_pattern(item.to_numpy().astype(want.dtype)), bit_pattern(library["nf4-rows96"][weight]))
            else:  # the library's blocks of the flattened weight, its arithmetic, stored decoded
                assert item.descriptor.quantization is None
                assert np.array_equal(bit_pattern(item.to_numpy()), bit_pattern(want)), weight


def test_the_way_back_is_byte_identical_and_loads(checkpoints, library, converted, tmp_path):
    path, _ = converted["nf4"]
    out = str(tmp_path / "back")
    hs.convert(path, out, to="hf")
    before, after = source_tensors(checkpoints["nf4"]), source_tensors(out)
    assert set(after) == set(before)
    for name, array in before.items():
        assert after[name].dtype == array.dtype and after[name].shape == array.shape, name
        assert bit_pattern(after[name]).tobytes() == bit_pattern(array).tobytes(), name
    state = fx.quant_states(out)[fx.ZEROED][1]
    assert state.dtype == torch.bfloat16 and not state.nested
    loaded = fx.loaded_dequantized(out)
    assert set(loaded) == set(library["nf4"])
    for weight, want in library["nf4"].items():
        assert np.array_equal(bit_pattern(loaded[weight]), bit_pattern(want)), weight


def test_double_quantization_comes_back_without_nesting_to_the_same_bits(checkpoints, library, converted, tmp_path):
    path, _ = converted["nf4-dq"]
    out = str(tmp_path / "back-dq")
    hs.convert(path, out, to="hf")
    names = set(source_tensors(out))
    assert not any("nested" in name for name in names)
    loaded = fx.loaded_dequantized(out)
    assert set(loaded) == set(library["nf4-dq"])
    for weight, want in library["nf4-dq"].items():
        assert loaded[weight].dtype == np.float16
        assert np.array_equal(bit_pattern(loaded[weight]), bit_pattern(want)), weight


def test_a_single_safetensors_file_with_its_config_beside_converts_the_same(checkpoints, converted, tmp_path):
    dst = str(tmp_path / "file.hrry")
    hs.convert(os.path.join(checkpoints["nf4"], "model.safetensors"), dst)
    folder_path, _ = converted["nf4"]
    one, other = hs.load(dst), hs.load(folder_path)
    assert set(one) == set(other)
    assert all(np.array_equal(bit_pattern(one[name]), bit_pattern(other[name])) for name in one)


def test_the_command_line_converts_and_refuses(checkpoints, library, tmp_path):
    dst = tmp_path / "cli.hrry"
    done = cli.run("convert", checkpoints["nf4"], dst)
    assert done.returncode == 0, done.stderr
    loaded = hs.load(str(dst))
    for weight, want in library["nf4"].items():
        assert np.array_equal(bit_pattern(loaded[weight].astype(want.dtype)), bit_pattern(want))
    refused = cli.run("convert", checkpoints["fp4"], tmp_path / "fp4.hrry")
    assert refused.returncode != 0 and b"fp4" in refused.stderr and not (tmp_path / "fp4.hrry").exists()


def test_a_hurray_tensor_bitsandbytes_cannot_hold_is_refused_on_the_way_back():
    from hurray_schema.builders import quantize
    from hurray_schema.conversion.quantized.bitsandbytes import parts_of

    values = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    for tensor, reason in ((quantize(values, "nf4", axis=0), "axis 0"),
                           (quantize(values, "nf4", block_size=16), "block size 16"),
                           (quantize(values, "per_block"), "PerBlockAffine")):
        with pytest.raises(NoExactForm, match=reason):
            parts_of("w", tensor, {})


# -- hostile inputs ---------------------------------------------------------------------


def hostile(checkpoints, tmp_path, change, variant="nf4") -> str:
    """A copy of the ``variant`` checkpoint with ``change(tensors)`` applied to its tensors (torch, by name)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hostile"
    shutil.copytree(checkpoints[variant], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


def state_of(text: str):
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


STATE = fx.ZEROED + ".quant_state.bitsandbytes__nf4"


def set_state(**changes):
    def change(tensors):
        state = json.loads(bytes(tensors[STATE].numpy()))
        state.update(changes)
        tensors[STATE] = state_of(json.dumps(state))
    return change


def absmax_set(index, value):
    def change(tensors):
        tensors[fx.ZEROED + ".absmax"][index] = value
    return change


@pytest.mark.parametrize("change, message", [
    (lambda t: t.__setitem__(STATE, state_of('{"quant_type": "nf4", "blocksize": 64,')), "not JSON"),
    (lambda t: t.__setitem__(STATE, state_of('[1, 2]')), "not a JSON object"),
    (set_state(shape=[128, 64]), "packed bytes"),
    (set_state(shape=[32, "64"]), "shape"),
    (set_state(blocksize=128), "absmax is float32"),
    (set_state(blocksize=48), "blocksize 48"),
    (set_state(dtype="int8"), "dtype 'int8'"),
    (set_state(quant_type="fp4"), "quant_type 'fp4'"),
    (set_state(nested_offset=1.0), "nested state lacks"),
    (set_state(colour="blue"), "unknown keys"),
    (lambda t: t.__setitem__(fx.ZEROED, t[fx.ZEROED][:-1]), "packed bytes"),
    (lambda t: t.pop(fx.ZEROED + ".absmax"), "not in the checkpoint"),
    (lambda t: t[fx.ZEROED + ".quant_map"].__setitem__(3, 0.5), "quant_map is not bitsandbytes' nf4 table"),
], ids=["malformed-json", "json-list", "shape-vs-bytes", "shape-not-ints", "blocksize-vs-absmax",
        "blocksize-unknown", "dtype", "quant-type-vs-key", "nested-partial", "unknown-key", "short-weight",
        "missing-absmax", "quant-map"])
def test_hostile_metadata_is_a_typed_error_naming_the_tensor(checkpoints, tmp_path, change, message):
    folder = hostile(checkpoints, tmp_path, change)
    with pytest.raises(HurraySchemaError, match=message) as caught:
        hs.convert(folder, str(tmp_path / "out.hrry"), dequantize=True)
    assert not isinstance(caught.value, NoExactForm)
    assert fx.ZEROED in str(caught.value)
    assert not (tmp_path / "out.hrry").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5], ids=["nan", "inf", "negative"])
def test_an_absmax_breaking_the_rule_is_a_spec_violation(checkpoints, tmp_path, value):
    folder = hostile(checkpoints, tmp_path, absmax_set(1, value))
    with pytest.raises(SpecViolation, match=rf"{fx.ZEROED}: scale 1 is .*, not finite and non-negative") as caught:
        hs.convert(folder, str(tmp_path / "out.hrry"))
    assert caught.value.rule_id == ABSMAX_RULE
    assert caught.value.citation == "quantization/nf4.md § Validity Constraints"
    assert not (tmp_path / "out.hrry").exists()


@pytest.mark.parametrize("value", [0.0, 1e-30], ids=["zero", "tiny"])
def test_a_zero_or_tiny_absmax_is_kept(checkpoints, tmp_path, value):
    """The passing counterpart: a finite, non-negative absmax (zero too) is bitsandbytes' and stays."""
    folder = hostile(checkpoints, tmp_path, absmax_set(1, value))
    report = hs.convert(folder, str(tmp_path / "out.hrry"))
    row = {row.name: row for row in report.tensors}[fx.ZEROED]
    assert row.exact and row.max_ulp == 0


def test_a_non_finite_nested_absmax_is_a_spec_violation(checkpoints, tmp_path):
    """A computed absmax that is infinite has an NF4 form (the tensor is built as it is) and breaks
    the rule when it is decoded: dequantized or not, the same SpecViolation."""
    def change(tensors):
        tensors[fx.ZEROED + ".nested_absmax"][0] = float("inf")

    folder = hostile(checkpoints, tmp_path, change, "nf4-dq")
    for options in ({}, {"dequantize": True}):
        with pytest.raises(SpecViolation, match=rf"{fx.ZEROED}: scale \d+ is .*, not finite") as caught:
            hs.convert(folder, str(tmp_path / "out.hrry"), **options)
        assert caught.value.rule_id == ABSMAX_RULE
        assert not (tmp_path / "out.hrry").exists()


def test_a_negative_absmax_from_double_quantization_has_no_nf4_form(checkpoints, tmp_path):
    """An offset that takes the computed absmax below zero: bitsandbytes flips the signs of that
    block, which NF4's non-negative absmax cannot say; stored decoded it is bitsandbytes' result."""
    def change(tensors):
        state = json.loads(bytes(tensors[fx.ZEROED + ".quant_state.bitsandbytes__nf4"].numpy()))
        state["nested_offset"] = -1.0
        tensors[fx.ZEROED + ".quant_state.bitsandbytes__nf4"] = state_of(json.dumps(state))

    folder = hostile(checkpoints, tmp_path, change, "nf4-dq")
    with pytest.raises(NoExactForm, match="negative"):
        hs.convert(folder, str(tmp_path / "refused.hrry"))
    dst = str(tmp_path / "out.hrry")
    hs.convert(folder, dst, dequantize=True)
    want = fx.library_dequantized(folder)[fx.ZEROED]
    assert np.array_equal(bit_pattern(hs.load(dst)[fx.ZEROED]), bit_pattern(want))
