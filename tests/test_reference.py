"""Tests of the NumPy reference: the seeds' worked examples and the limits of the math."""

import doctest

import numpy as np
import pytest
import torch

from skattn import reference as R


def test_additive_worked_example():
    # Seed chapter: W_a = U_a = I, v_a = (1, 1), s = (1, 0), h = (1, 0), (0, 1), (-1, 0).
    s = np.array([[1.0, 0.0]])
    H = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    context, weights = R.additive_attention(s, H, np.eye(2), np.eye(2), np.ones(2))
    np.testing.assert_allclose(weights[0], [0.319, 0.559, 0.122], atol=5e-4)
    np.testing.assert_allclose(context[0], [0.198, 0.559], atol=5e-4)
    # The scores themselves: e = (tanh 2, 2 tanh 1, 0).
    e = np.log(weights[0] / weights[0, 2])
    np.testing.assert_allclose(e, [np.tanh(2.0), 2 * np.tanh(1.0), 0.0], atol=1e-12)


def test_dot_worked_example():
    # Seed exercise: h = (1, 0), (0, 1), (1, 1), s = (2, 0).
    s = np.array([[2.0, 0.0]])
    H = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    scores = R.luong_scores(s, H, "dot")
    np.testing.assert_array_equal(scores, [[2.0, 0.0, 2.0]])
    weights = R.masked_softmax(scores)
    np.testing.assert_allclose(weights[0], [0.468, 0.063, 0.468], atol=5e-4)
    context = np.einsum("bt,btd->bd", weights, H)
    np.testing.assert_allclose(context[0], [0.937, 0.532], atol=5e-4)


def test_general_with_identity_is_dot_and_concat_matches_additive():
    rng = np.random.default_rng(0)
    s, H = rng.normal(size=(2, 3)), rng.normal(size=(2, 4, 3))
    np.testing.assert_allclose(
        R.luong_scores(s, H, "general", Wa=np.eye(3)), R.luong_scores(s, H, "dot"), atol=1e-14
    )
    Wa, Ua, va = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)), rng.normal(size=5)
    concat = R.luong_scores(s, H, "concat", Wa=np.vstack([Wa, Ua]), va=va)
    _, weights = R.additive_attention(s, H, Wa, Ua, va)
    np.testing.assert_allclose(R.masked_softmax(concat), weights, atol=1e-14)
    # general with a rectangular W_a: s W_a h^T written out.
    Wg = rng.normal(size=(3, 2))
    H2 = rng.normal(size=(2, 4, 2))
    expected = [[s[b] @ Wg @ H2[b, t] for t in range(4)] for b in range(2)]
    np.testing.assert_allclose(R.luong_scores(s, H2, "general", Wa=Wg), expected, atol=1e-12)


def test_luong_scores_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        R.luong_scores(np.zeros((1, 2)), np.zeros((1, 3, 2)), "bilinear")


def test_temperature_limits():
    scores = np.array([[0.3, 2.0, -1.0, 1.9]])
    cold = R.masked_softmax(scores, temperature=1e-3)
    np.testing.assert_allclose(cold, [[0.0, 1.0, 0.0, 0.0]], atol=1e-12)
    hot = R.masked_softmax(scores, temperature=1e6)
    np.testing.assert_allclose(hot, np.full((1, 4), 0.25), atol=1e-6)
    mask = np.array([[True, True, False, True]])
    hot_masked = R.masked_softmax(scores, mask, temperature=1e6)
    np.testing.assert_allclose(hot_masked, [[1 / 3, 1 / 3, 0.0, 1 / 3]], atol=1e-6)


def test_no_temperature_or_score_range_overflows():
    # the maximum is subtracted before dividing: tau = 1e-310 or scores near 1e308 gave NaN
    for tau in (1e-310, 5e-324):
        np.testing.assert_array_equal(
            R.masked_softmax(np.array([[1.0, 2.0, 0.5]]), None, tau), [[0, 1, 0]]
        )
    np.testing.assert_array_equal(
        R.masked_softmax(np.array([[1e308, -1e308]]), None, 0.5), [[1, 0]]
    )
    hot = R.masked_softmax(np.array([[0.0, -np.inf, 1.0]]), temperature=float("inf"))
    np.testing.assert_array_equal(hot, [[0.5, 0.0, 0.5]])  # -inf is never attended


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), "1"])
def test_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match="temperature"):
        R.masked_softmax(np.zeros((1, 2)), temperature=temperature)


def test_padding_gets_exactly_zero_and_rows_sum_to_one():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(3, 5)) * 10
    mask = np.arange(5)[None, :] < np.array([[5], [2], [1]])
    weights = R.masked_softmax(scores, mask)
    assert np.all(weights[~mask] == 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-15)
    # Masked weights equal the softmax of the real positions alone.
    np.testing.assert_allclose(weights[1, :2], R.masked_softmax(scores[1, :2]), atol=1e-15)


def test_fully_masked_row_gives_zeros_not_nan():
    scores = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    mask = np.array([[False, False, False], [True, False, True]])
    weights = R.masked_softmax(scores, mask)
    np.testing.assert_array_equal(weights[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(weights[1].sum(), 1.0)


def test_large_scores_stay_finite():
    scores = np.array([[1000.0, -1000.0, 999.0], [-1000.0, -1000.0, -1000.0]])
    weights = R.masked_softmax(scores)
    assert np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights[0], [1 / (1 + np.exp(-1)), 0.0, 1 / (1 + np.e)])
    np.testing.assert_allclose(weights[1], [1 / 3] * 3)


def test_attentional_state_puts_context_first():
    c, s = np.array([1.0, 0.0]), np.array([0.0, 2.0, 0.0])
    Wc = np.zeros((5, 1))
    Wc[0, 0] = 0.5  # reads c[0] only
    np.testing.assert_allclose(R.attentional_state(c, s, Wc), [np.tanh(0.5)])
    Wc = np.zeros((5, 1))
    Wc[3, 0] = 0.25  # reads s[1] only
    np.testing.assert_allclose(R.attentional_state(c, s, Wc), [np.tanh(0.5)])


def test_self_attend_is_permutation_equivariant():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(6, 4))
    perm = rng.permutation(6)
    np.testing.assert_allclose(R.self_attend(X[perm]), R.self_attend(X)[perm], atol=1e-14)


@pytest.mark.parametrize("shape", [(5, 4), (3, 5, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attend_matches_torch_sdpa(shape, causal):
    X = np.random.default_rng(3).normal(size=shape)
    mask = R.causal_mask(shape[-2]) if causal else None
    Xt = torch.from_numpy(X)
    expected = torch.nn.functional.scaled_dot_product_attention(Xt, Xt, Xt, is_causal=causal)
    np.testing.assert_allclose(R.self_attend(X, mask), expected.numpy(), atol=1e-12)


def test_causal_mask():
    np.testing.assert_array_equal(
        R.causal_mask(3), [[True, False, False], [True, True, False], [True, True, True]]
    )
    # The first position reads only itself.
    X = np.random.default_rng(4).normal(size=(4, 3))
    np.testing.assert_allclose(R.self_attend(X, R.causal_mask(4))[0], X[0], atol=1e-15)


def test_local_m_window_uses_real_length():
    scores = np.zeros((2, 8))
    mask = np.arange(8)[None, :] < np.array([[8], [3]])
    weights = R.local_m_weights(scores, mask, step=5, window=1)
    # Item 0: p = 5, window {4, 5, 6}; item 1: p = min(5, 2) = 2, window {1, 2, 3} cut to {1, 2}.
    np.testing.assert_allclose(weights[0], [0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3, 0], atol=1e-15)
    np.testing.assert_allclose(weights[1], [0, 0.5, 0.5, 0, 0, 0, 0, 0], atol=1e-15)


def test_local_p_gaussian_and_renormalisation():
    scores = np.zeros((1, 6))
    mask = np.ones((1, 6), dtype=bool)
    centres = np.array([2.5])
    weights = R.local_p_weights(scores, mask, centres, window=2)
    # Window {1, 2, 3, 4}; equal scores, so the weights are the Gaussian (sigma = 1), renormalised.
    gauss = np.exp(-((np.arange(6) - 2.5) ** 2) / 2.0) * np.isin(np.arange(6), [1, 2, 3, 4])
    np.testing.assert_allclose(weights[0], gauss / gauss.sum(), atol=1e-15)
    np.testing.assert_allclose(weights.sum(), 1.0)


def test_local_p_positions_lie_in_source():
    rng = np.random.default_rng(5)
    s, Wp, vp = rng.normal(size=(4, 3)), rng.normal(size=(3, 2)), rng.normal(size=2)
    lengths = np.array([1, 4, 7, 10])
    p = R.local_p_positions(s, Wp, vp, lengths)
    assert np.all((p > 0) & (p < lengths))
    np.testing.assert_allclose(p / lengths, 1 / (1 + np.exp(-(np.tanh(s @ Wp) @ vp))))


@pytest.mark.parametrize(
    "kind, kwargs, match",
    [("general", {}, "Wa is required"), ("concat", {"Wa": np.zeros((4, 3))}, "va is required")],
)
def test_luong_scores_names_the_missing_weight(kind, kwargs, match):
    with pytest.raises(ValueError, match=match):
        R.luong_scores(np.zeros((1, 2)), np.zeros((1, 3, 2)), kind, **kwargs)


def test_docstring_examples():
    result = doctest.testmod(R, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "3"])
def test_local_weights_refuse_a_window_that_is_not_a_positive_int(window):
    """The oracle took any window: 0 gave a NaN row, -1 a row of zeros over real positions."""
    scores, mask = np.array([[1.0, 2.0, 3.0, 0.0]]), np.array([[True, True, True, False]])
    for call in (
        lambda: R.local_p_weights(scores, mask, np.array([1.0]), window=window),
        lambda: R.local_m_weights(scores, mask, step=1, window=window),
        lambda: R.window_mask(np.array([1.0]), 4, window),
    ):
        with pytest.raises(ValueError, match="window"):
            call()
    assert R.local_p_weights(scores, mask, np.array([1.0]), window=np.int64(1)).sum() == 1.0
