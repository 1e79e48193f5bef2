"""Worked examples from well-known sources, recomputed independently of attention_ref.

Every expected value here comes from a published source (a tutorial's printed
numbers, a paper's formula, a framework's documented reference code) and is
recomputed in the test with ``math`` or plain NumPy; attention_ref is only
ever the thing under test, never the reference.
"""

import math

import numpy as np
import pytest

from attention_ref import (
    MultiHeadParams,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    causal_mask,
    log_softmax,
    logsumexp,
    multi_head_attention,
    scaled_dot_product_attention,
    sinusoidal_positions,
    sliding_window_mask,
    softmax,
)

# ---------------------------------------------------------------------------
# Softmax: the example of the Wikipedia article "Softmax function".


def test_softmax_wikipedia_example():
    x = [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0]
    published = [0.024, 0.064, 0.175, 0.475, 0.024, 0.064, 0.175]  # rounded to 3 places in the article
    np.testing.assert_allclose(softmax(np.array(x)), published, atol=5e-4)
    total = sum(math.exp(t) for t in x)
    np.testing.assert_allclose(softmax(np.array(x)), [math.exp(t) / total for t in x], rtol=1e-15)
    np.testing.assert_allclose(logsumexp(np.array(x)), math.log(total), rtol=1e-15)
    np.testing.assert_allclose(log_softmax(np.array(x)), [t - math.log(total) for t in x], rtol=1e-14)


# ---------------------------------------------------------------------------
# R. Karim, "Illustrated: Self-Attention" (Towards Data Science, 2019):
# three 4-d inputs, 4x3 weight matrices, scores without the 1/sqrt(d) scaling.

KARIM_X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=float)
KARIM_WK = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=float)
KARIM_WQ = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=float)
KARIM_WV = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=float)


def _softmax_by_hand(row):
    exps = [math.exp(s) for s in row]
    return [e / sum(exps) for e in exps]


def test_karim_illustrated_self_attention():
    q, k, v = KARIM_X @ KARIM_WQ, KARIM_X @ KARIM_WK, KARIM_X @ KARIM_WV
    # The intermediate results printed in the tutorial.
    np.testing.assert_array_equal(k, [[0, 1, 1], [4, 4, 0], [2, 3, 1]])
    np.testing.assert_array_equal(v, [[1, 2, 3], [2, 8, 0], [2, 6, 3]])
    np.testing.assert_array_equal(q, [[1, 0, 2], [2, 2, 2], [2, 1, 3]])
    scores = [[2, 4, 4], [4, 16, 12], [4, 12, 10]]  # q_i . k_j, as in the tutorial
    weights = [_softmax_by_hand(row) for row in scores]
    # The tutorial rounds the first row to [0.0, 0.5, 0.5].
    np.testing.assert_allclose(weights[0], [0.0, 0.5, 0.5], atol=0.07)
    expected_out = [[sum(w[j] * v[j, c] for j in range(3)) for c in range(3)] for w in weights]

    out, w = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_allclose(w, weights, rtol=1e-13)
    np.testing.assert_allclose(out, expected_out, rtol=1e-13)
    # The tutorial's first output, to the two decimals it shows: [1.94, 6.68, 1.60].
    np.testing.assert_allclose(out[0], [1.94, 6.68, 1.60], atol=5e-3)


def test_karim_example_through_a_one_head_layer():
    """The same layer as MultiHeadParams (row convention); w_o copies the 3 head features into 4.

    multi_head_attention always scales by 1/sqrt(d_head) = 1/sqrt(3).
    """
    w_o = np.eye(3, 4)  # (d_head, d_model): fourth output feature is 0
    params = MultiHeadParams(w_q=KARIM_WQ, w_k=KARIM_WK, w_v=KARIM_WV, w_o=w_o, n_heads=1)
    q, k, v = KARIM_X @ KARIM_WQ, KARIM_X @ KARIM_WK, KARIM_X @ KARIM_WV
    expected = []
    for i in range(3):
        w = _softmax_by_hand([float(q[i] @ k[j]) / math.sqrt(3) for j in range(3)])
        expected.append([sum(w[j] * v[j, c] for j in range(3)) for c in range(3)] + [0.0])
    np.testing.assert_allclose(multi_head_attention(KARIM_X, params), expected, rtol=1e-13)


# ---------------------------------------------------------------------------
# S. Cristina, "The Attention Mechanism from Scratch" (Machine Learning
# Mastery, 2022): four one-hot-ish words, weights drawn with
# numpy.random.seed(42); randint(3, size=(3, 3)), printed output below.

MLM_WORDS = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=float)
MLM_WQ = np.array([[2, 0, 2], [2, 0, 0], [2, 1, 2]], dtype=float)
MLM_WK = np.array([[2, 2, 2], [0, 2, 1], [0, 1, 1]], dtype=float)
MLM_WV = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=float)
MLM_PRINTED = np.array(
    [
        [0.98522025, 1.74174051, 0.75652026],
        [0.90965265, 1.40965265, 0.5],
        [0.99851226, 1.75849334, 0.75998108],
        [0.99560386, 1.90407309, 0.90846923],
    ]
)


def test_machine_learning_mastery_four_words():
    q, k, v = MLM_WORDS @ MLM_WQ, MLM_WORDS @ MLM_WK, MLM_WORDS @ MLM_WV
    out = scaled_dot_product_attention(q, k, v)  # default scale 1/sqrt(3), as the tutorial's k.shape[1] ** 0.5
    np.testing.assert_allclose(out, MLM_PRINTED, atol=1e-8)


def test_machine_learning_mastery_four_words_as_a_layer():
    params = MultiHeadParams(w_q=MLM_WQ, w_k=MLM_WK, w_v=MLM_WV, w_o=np.eye(3), n_heads=1)
    np.testing.assert_allclose(multi_head_attention(MLM_WORDS, params), MLM_PRINTED, atol=1e-8)


# ---------------------------------------------------------------------------
# J. Alammar, "The Illustrated Transformer" (2018): "Thinking Machines" with
# d_k = 64, scores 112 and 96, divided by 8 to 14 and 12, softmax 0.88, 0.12.


def test_alammar_thinking_machines():
    q = np.zeros((1, 64))
    q[0, 0] = 1.0
    k = np.zeros((2, 64))
    k[:, 0] = [112.0, 96.0]
    v = np.eye(2)
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(w, [[0.88, 0.12]], atol=5e-3)
    np.testing.assert_allclose(w[0], _softmax_by_hand([14.0, 12.0]), rtol=1e-14)
    np.testing.assert_allclose(out, w)


# ---------------------------------------------------------------------------
# Vaswani et al. (2017), section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)),
# PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).


@pytest.mark.parametrize("d", [4, 6, 512])
@pytest.mark.parametrize("pos", [0, 1, 17, 100, 2047])
def test_vaswani_sinusoidal_table_entries(pos, d):
    table = sinusoidal_positions(pos + 1, d)
    for i in sorted({0, 1, d // 4, d // 2 - 1}):
        angle = pos / 10000 ** (2 * i / d)
        assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-12)
        assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_wavelengths_form_a_geometric_progression():
    """The paper: wavelengths from 2*pi to 10000 * 2*pi; column pair i has period 2*pi * 10000^(2i/d)."""
    d = 8
    period = 2 * math.pi * 10000 ** (2 * 1 / d)  # pair i = 1
    n = math.ceil(period) + 2
    table = sinusoidal_positions(n, d)
    pos = np.arange(n)
    np.testing.assert_allclose(table[:, 2], np.sin(2 * math.pi * pos / period), atol=1e-12)


# ---------------------------------------------------------------------------
# ALiBi, Press et al. (2022): slopes for 8 heads are 1/2, 1/4, ..., 1/256;
# for 16 heads 1/2^0.5, 1/2, ..., 1/2^8 (the paper, section 3).


def test_alibi_published_slopes_eight_heads():
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2 ** (h + 1) for h in range(8)])


def test_alibi_published_slopes_sixteen_heads():
    np.testing.assert_allclose(alibi_slopes(16), [1 / 2 ** (0.5 * (h + 1)) for h in range(16)], rtol=1e-15)


def _press_reference_slopes(n):
    """The recursion of the paper's released code, rewritten with math only."""

    def power_of_two(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _press_reference_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 12, 20, 24, 40])
def test_alibi_slopes_match_reference_recursion(n_heads):
    np.testing.assert_allclose(alibi_slopes(n_heads), _press_reference_slopes(n_heads), rtol=1e-14)


def test_alibi_bias_is_the_paper_row_on_causal_keys():
    """Figure 3 of the paper: query i adds m * [-(i), ..., -2, -1, 0] to its causal scores."""
    n = 5
    bias = alibi_bias(4, n)
    slopes = [2 ** (-2 * (h + 1)) for h in range(4)]
    for h, m in enumerate(slopes):
        for i in range(n):
            np.testing.assert_allclose(bias[h, i, : i + 1], [m * (j - i) for j in range(i + 1)], rtol=1e-15)


# ---------------------------------------------------------------------------
# RoPE, Su et al. (RoFormer, 2021): for d = 2 the map is the rotation of the
# plane by m * theta with theta = base^0 = 1; in general pair i turns by
# m * base^(-2i/d), i.e. multiplication by exp(i m theta_i) in complex form.


@pytest.mark.parametrize("m", [0, 1, 2, 5, 37])
def test_rope_two_dimensional_is_rotation_by_m_theta(m):
    x = np.array([[0.3, -1.7]])
    c, s = math.cos(m), math.sin(m)
    expected = [[c * 0.3 - s * -1.7, s * 0.3 + c * -1.7]]
    np.testing.assert_allclose(apply_rope(x, positions=[m]), expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(apply_rope(x, positions=[m], interleaved=True), expected, rtol=1e-14, atol=1e-15)


def test_rope_complex_form_of_roformer():
    """Interleaved pairs (x_2i, x_2i+1) as complex numbers, times exp(1j * m * base^(-2i/d))."""
    x = np.array([0.5, -1.0, 2.0, 0.25, -0.75, 1.5])
    d, m, base = 6, 7, 10000.0
    expected = []
    for i in range(d // 2):
        angle = m * base ** (-2 * i / d)
        z = complex(x[2 * i], x[2 * i + 1]) * complex(math.cos(angle), math.sin(angle))
        expected += [z.real, z.imag]
    np.testing.assert_allclose(apply_rope(x[None], positions=[m], interleaved=True)[0], expected, rtol=1e-13)


def test_rope_scores_depend_on_the_offset_only():
    """<R_m q, R_n k> = <q, R_(n-m) k> (RoFormer, eq. 16)."""
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 8))
    def score(m, n):
        return float(apply_rope(q[None], positions=[m])[0] @ apply_rope(k[None], positions=[n])[0])

    assert score(3, 10) == pytest.approx(score(0, 7), rel=1e-12)
    assert score(40, 45) == pytest.approx(score(100, 105), rel=1e-12)


# ---------------------------------------------------------------------------
# Causal masks as documented by PyTorch: is_causal / causal_upper_left is
# torch.ones(L, S).tril(diagonal=0); causal_lower_right is tril(diagonal=S-L).
# The documented (3, 4) examples are printed in torch.nn.attention.bias
# (the general tril identity is tested in test_masks.py).


def test_pytorch_documented_causal_examples():
    np.testing.assert_array_equal(causal_mask(3, 4), [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(
        causal_mask(3, 4, alignment="bottom-right"), [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    )


def test_sliding_window_is_mistral_band():
    """Mistral 7B (Jiang et al., 2023): position i attends to positions i - W + 1 .. i."""
    n, window = 7, 3
    expected = np.array([[i - window < j <= i for j in range(n)] for i in range(n)])
    np.testing.assert_array_equal(sliding_window_mask(n, window=window), expected)


# ---------------------------------------------------------------------------
# PyTorch's documented reference code for scaled_dot_product_attention
# ("Efficient implementation equivalent to the following"), transcribed to
# NumPy with dropout skipped: attn_bias zeros, tril for is_causal,
# masked_fill(-inf) for a bool mask or addition for a float mask,
# repeat_interleave over axis -3 for enable_gqa, softmax, @ value.


def _torch_docs_sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    L, S = query.shape[-2], key.shape[-2]
    scale_factor = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    attn_bias = np.zeros((L, S))
    if is_causal:
        assert attn_mask is None
        temp_mask = np.tril(np.ones((L, S), dtype=bool), k=0)
        attn_bias = np.where(~temp_mask, -np.inf, attn_bias)
    if attn_mask is not None:
        if attn_mask.dtype == bool:
            attn_bias = np.where(~attn_mask, -np.inf, attn_bias)
        else:
            attn_bias = attn_mask + attn_bias
    if enable_gqa:
        key = np.repeat(key, query.shape[-3] // key.shape[-3], axis=-3)  # repeat_interleave
        value = np.repeat(value, query.shape[-3] // value.shape[-3], axis=-3)
    attn_weight = query @ np.swapaxes(key, -2, -1) * scale_factor
    attn_weight = attn_weight + attn_bias
    attn_weight = np.exp(attn_weight - attn_weight.max(axis=-1, keepdims=True))
    attn_weight = attn_weight / attn_weight.sum(axis=-1, keepdims=True)
    return attn_weight @ value


def _inputs(seed, *, hq=4, hkv=4, L=5, S=7, E=8, Ev=3):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((2, hq, L, E)),
        rng.standard_normal((2, hkv, S, E)),
        rng.standard_normal((2, hkv, S, Ev)),
        rng,
    )


@pytest.mark.parametrize("seed", range(3))
def test_torch_docs_reference_plain_and_scaled(seed):
    q, k, v, _ = _inputs(seed)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v), _torch_docs_sdpa(q, k, v), rtol=1e-12)
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, scale=0.3), _torch_docs_sdpa(q, k, v, scale=0.3), rtol=1e-12
    )


@pytest.mark.parametrize(("L", "S"), [(5, 7), (7, 7), (3, 9)])
def test_torch_docs_reference_is_causal(L, S):
    q, k, v, _ = _inputs(L * S, L=L, S=S)
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, is_causal=True), _torch_docs_sdpa(q, k, v, is_causal=True), rtol=1e-12
    )


def test_torch_docs_reference_bool_and_float_masks():
    q, k, v, rng = _inputs(11)
    allowed = rng.random((5, 7)) < 0.6
    allowed[:, 0] = True  # every row keeps a key: the reference would give NaN for an empty row
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, mask=allowed), _torch_docs_sdpa(q, k, v, attn_mask=allowed), rtol=1e-12
    )
    float_mask = rng.standard_normal((5, 7))
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, bias=float_mask),
        _torch_docs_sdpa(q, k, v, attn_mask=float_mask),
        rtol=1e-12,
    )


@pytest.mark.parametrize(("hq", "hkv"), [(4, 1), (4, 2), (6, 3), (8, 8)])
def test_torch_docs_reference_gqa(hq, hkv):
    q, k, v, _ = _inputs(hq * 10 + hkv, hq=hq, hkv=hkv)
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, enable_gqa=True),
        _torch_docs_sdpa(q, k, v, enable_gqa=True),
        rtol=1e-12,
    )


def test_gqa_head_mapping_is_repeat_interleave():
    """torch documents repeat_interleave([1, 2], 2) == [1, 1, 2, 2]: query head h reads kv head h // g."""
    hq, hkv = 6, 2
    repeated = [kv for kv in range(hkv) for _ in range(hq // hkv)]  # repeat_interleave(arange(hkv), hq // hkv)
    assert repeated == [0, 0, 0, 1, 1, 1]
    # Values equal to the kv head index reveal which kv head each query head read.
    q = np.zeros((hq, 1, 1))
    k = np.zeros((hkv, 1, 1))
    v = np.arange(hkv, dtype=float).reshape(hkv, 1, 1)
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out[:, 0, 0].tolist() == repeated
