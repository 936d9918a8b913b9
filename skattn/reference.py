"""NumPy float64 reference of the attention math in the seed chapters: the test oracle.

Written for clarity, not speed; torch-free, so ``serving`` may import it. Row-vector
convention (``x @ W``); boolean masks with ``True`` marking a real (non-padding) position.

Batched functions take ``s (B, d_s)`` and ``H (B, T, d_h)`` and return scores or weights
``(B, T)``.
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from skattn.core.checks import check_int

__all__ = [
    "additive_attention",
    "attentional_state",
    "causal_mask",
    "local_m_weights",
    "local_p_positions",
    "local_p_weights",
    "luong_scores",
    "masked_softmax",
    "self_attend",
    "window_mask",
]


def masked_softmax(
    scores: np.ndarray, mask: np.ndarray | None = None, temperature: float = 1.0
) -> np.ndarray:
    r"""Softmax over the last axis of ``scores / temperature``, restricted to ``mask``.

    .. math::

        \alpha_j = \frac{m_j \exp((e_j - M) / \tau)}{\sum_k m_k \exp((e_k - M) / \tau)},
        \qquad M = \max_{k: m_k} e_k,

    and :math:`\alpha = 0` for a row with no real position. The maximum is subtracted before
    dividing by ``tau``, so no temperature or score range overflows. A score of ``-inf`` counts
    as a masked position; a real score of ``+inf`` or NaN (weights that diverged) leaves the
    softmax undefined, and its row is zeros, as :func:`skattn.attention.masked_softmax` gives
    (one such score never puts NaN into the rest of a batch).

    Parameters
    ----------
    scores : ndarray
        Scores ``(..., T)``.
    mask : ndarray of bool, optional
        Broadcastable to ``scores``; ``True`` marks a real position.
    temperature : float, default=1.0
        ``tau > 0``.

    Returns
    -------
    ndarray
        Weights, float64, the shape of ``scores``; padding gets exactly 0.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, Real) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    z = np.asarray(scores, dtype=np.float64)  # (..., T)
    m = np.ones(z.shape, dtype=bool) if mask is None else np.broadcast_to(mask, z.shape)
    undefined = (m & (np.isnan(z) | (z == np.inf))).any(axis=-1, keepdims=True)  # (..., 1)
    m = m & np.isfinite(z) & ~undefined  # -inf never attended; +inf or NaN: a row of zeros
    z_max = np.where(m, z, -np.inf).max(axis=-1, keepdims=True)  # (..., 1), -inf: none real
    z_max = np.where(np.isfinite(z_max), z_max, 0.0)
    # Shift first, then scale: (z - max) / tau <= 0 never overflows to +inf, whatever tau or
    # the scores' range (dividing first overflowed for tau = 1e-310 or scores near 1e308).
    with np.errstate(over="ignore"):
        shifted = np.where(m, z - z_max, 0.0) / temperature  # (..., T), <= 0
    e = np.where(m, np.exp(shifted), 0.0)  # (..., T)
    total = e.sum(axis=-1, keepdims=True)  # (..., 1)
    return e / np.where(total > 0, total, 1.0)


def _attend(weights: np.ndarray, H: np.ndarray) -> np.ndarray:
    """Context ``c_b = sum_t weights[b, t] H[b, t]``: ``(B, T), (B, T, d) -> (B, d)``."""
    return np.einsum("bt,btd->bd", weights, H)


def additive_attention(
    s: np.ndarray,
    H: np.ndarray,
    Wa: np.ndarray,
    Ua: np.ndarray,
    va: np.ndarray,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Bahdanau attention: :math:`e_{bt} = v_a \cdot \tanh(s_b W_a + h_{bt} U_a)`.

    Parameters
    ----------
    s : ndarray (B, d_s)
    H : ndarray (B, T, d_h)
    Wa : ndarray (d_s, n)
    Ua : ndarray (d_h, n)
    va : ndarray (n,)
    mask : ndarray of bool (B, T), optional

    Returns
    -------
    context : ndarray (B, d_h)
    weights : ndarray (B, T)

    Examples
    --------
    The seed's worked example: ``W_a = U_a = I``, ``v_a = (1, 1)``, ``s = (1, 0)``.

    >>> H = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]])
    >>> context, weights = additive_attention(
    ...     np.array([[1.0, 0.0]]), H, np.eye(2), np.eye(2), np.ones(2)
    ... )
    >>> weights.round(3), context.round(3)
    (array([[0.319, 0.559, 0.122]]), array([[0.198, 0.559]]))
    """
    hidden = np.tanh((s @ Wa)[:, None, :] + H @ Ua)  # (B, T, n)
    weights = masked_softmax(hidden @ va, mask)  # (B, T)
    return _attend(weights, H), weights


def luong_scores(
    s: np.ndarray,
    H: np.ndarray,
    kind: str,
    Wa: np.ndarray | None = None,
    va: np.ndarray | None = None,
) -> np.ndarray:
    r"""Luong scores ``(B, T)``.

    - ``"dot"``: :math:`s \cdot h_t`;
    - ``"general"``: :math:`s W_a h_t^\top`, ``Wa (d_s, d_h)``;
    - ``"concat"``: :math:`v_a \cdot \tanh([s; h_t] W_a)`, ``Wa (d_s + d_h, n)``, ``va (n,)``.

    Examples
    --------
    The seed's exercise: ``s = (2, 0)`` against ``(1, 0), (0, 1), (1, 1)``.

    >>> s = np.array([[2.0, 0.0]])
    >>> H = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    >>> luong_scores(s, H, "dot")
    array([[2., 0., 2.]])
    >>> masked_softmax(luong_scores(s, H, "dot")).round(3)
    array([[0.468, 0.063, 0.468]])
    """
    if kind not in ("dot", "general", "concat"):
        raise ValueError(f"kind must be one of ['concat', 'dot', 'general'], got {kind!r}")
    if kind != "dot" and Wa is None:
        raise ValueError(f"Wa is required for kind={kind!r}")
    if kind == "concat" and va is None:
        raise ValueError("va is required for kind='concat'")
    if kind == "dot":
        return np.einsum("bd,btd->bt", s, H)
    if kind == "general":
        return np.einsum("bd,btd->bt", s @ Wa, H)
    B, T, _ = H.shape
    s_rep = np.broadcast_to(s[:, None, :], (B, T, s.shape[-1]))  # (B, T, d_s)
    sh = np.concatenate([s_rep, H], axis=-1)  # (B, T, d_s + d_h)
    return np.tanh(sh @ Wa) @ va


def attentional_state(c: np.ndarray, s: np.ndarray, Wc: np.ndarray) -> np.ndarray:
    r"""Luong's attentional state :math:`\tilde s = \tanh([c; s] W_c)`, context first.

    ``c (..., d_h)``, ``s (..., d_s)``, ``Wc (d_h + d_s, d_out)`` -> ``(..., d_out)``.
    """
    return np.tanh(np.concatenate([c, s], axis=-1) @ Wc)


def self_attend(X: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    r"""Parameter-free self-attention :math:`\operatorname{softmax}(X X^\top / \sqrt d) X`.

    Row-wise softmax (each position's weights over all positions sum to 1).

    Parameters
    ----------
    X : ndarray (n, d) or (B, n, d)
    mask : ndarray of bool, optional
        Broadcastable to the ``(..., n, n)`` scores, e.g. ``causal_mask(n)``.

    Returns
    -------
    ndarray, the shape of ``X``
    """
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[-1]
    scores = X @ np.swapaxes(X, -1, -2) / np.sqrt(d)  # (..., n, n)
    return masked_softmax(scores, mask) @ X


def causal_mask(n: int) -> np.ndarray:
    """``(n, n)`` boolean mask, ``True`` where position ``i`` may read ``j`` (``j <= i``)."""
    return np.tril(np.ones((n, n), dtype=bool))


def window_mask(centres: np.ndarray, T: int, window: int) -> np.ndarray:
    """``True`` where ``|j - p_b| <= D``: ``centres (B,) -> (B, T)``; ``D`` an int >= 1."""
    window = check_int(window, "window")
    j = np.arange(T)
    return np.abs(j[None, :] - np.asarray(centres, dtype=np.float64)[:, None]) <= window


def local_m_weights(
    scores: np.ndarray,
    mask: np.ndarray,
    step: int,
    window: int,
    temperature: float = 1.0,
) -> np.ndarray:
    """local-m weights: softmax over ``|j - p| <= D`` with ``p = min(step, S - 1)``.

    ``scores (B, T)``, ``mask (B, T)`` (a prefix of each row, ``S`` = its real length)
    -> ``(B, T)``.
    """
    lengths = mask.sum(axis=-1)  # (B,)
    centres = np.minimum(step, lengths - 1)  # (B,)
    valid = mask & window_mask(centres, scores.shape[-1], window)
    return masked_softmax(scores, valid, temperature)


def local_p_positions(s: np.ndarray, Wp: np.ndarray, vp: np.ndarray, lengths) -> np.ndarray:
    r"""local-p centres :math:`p_b = S_b \, \sigma(v_p \cdot \tanh(s_b W_p))`, ``(B,)``."""
    x = np.tanh(s @ Wp) @ vp  # (B,)
    return np.asarray(lengths, dtype=np.float64) / (1.0 + np.exp(-x))


def local_p_weights(
    scores: np.ndarray,
    mask: np.ndarray,
    centres: np.ndarray,
    window: int,
    temperature: float = 1.0,
) -> np.ndarray:
    r"""local-p weights, literally: window softmax, times a Gaussian, renormalised.

    .. math::

        a_j = \operatorname{softmax}_{|j - p| \le D}(e_j / \tau)
              \exp\!\left(-\frac{(j - p)^2}{2 \sigma^2}\right), \quad \sigma = D / 2,
        \qquad \alpha_j = a_j / \sum_k a_k .

    ``scores (B, T)``, ``mask (B, T)``, ``centres (B,)`` -> ``(B, T)``; zeros when the window
    holds no real position.
    """
    window = check_int(window, "window")
    T = scores.shape[-1]
    valid = mask & window_mask(centres, T, window)  # (B, T)
    align = masked_softmax(scores, valid, temperature)  # (B, T)
    sigma = window / 2.0
    j = np.arange(T)
    gauss = np.exp(-((j[None, :] - centres[:, None]) ** 2) / (2.0 * sigma**2))  # (B, T)
    a = align * gauss
    total = a.sum(axis=-1, keepdims=True)
    return a / np.where(total > 0, total, 1.0)
