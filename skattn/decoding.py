"""Greedy and beam-search decoding, NumPy only and backend-agnostic.

The estimator (torch) and the server (onnxruntime) decode with the same two functions. A backend
is two callables over an opaque, batch-first *carry* (the decoder state tensors plus the encoder
memory, keys and mask)::

    step(y_prev: int64 (N,), carry, position: int) -> (log_probs (N, V), carry, weights (N, T))
    select(carry, rows: int64 (M,)) -> carry      # rows may repeat (beam expansion)

Finished items are dropped from the carry with ``select``, so their cost stops; every decision
for an item reads only that item's rows, so an item's result never depends on the rest of the
batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from skattn.text import BOS, EOS, PAD, UNK

BOS_ID = BOS
EOS_ID = EOS
# Ids no target sequence holds: a model is never trained to emit them, and an undertrained one
# that tried would leave an output position with no token. Decoding never chooses them, so every
# output token has exactly one attention row: ``weights[:len(tokens)]``.
NEVER_EMITTED = (PAD, BOS, UNK)

StepFn = Callable[[np.ndarray, Any, int], tuple[np.ndarray, Any, np.ndarray]]
SelectFn = Callable[[Any, np.ndarray], Any]

__all__ = ["Hypothesis", "beam_decode", "greedy_decode"]


@dataclass
class Hypothesis:
    """One decoded output sequence.

    Attributes
    ----------
    tokens : list of int
        Output token ids, without BOS and without EOS.
    weights : ndarray of shape (steps, T)
        Attention weights, one row per decoder step taken (the EOS step included when EOS was
        emitted), so ``weights[:len(tokens)]`` has one row per output token. ``T`` is the padded
        source length of the batch the item was decoded in; columns past the item's own source
        length are zero.
    score : float
        The ranking score: the sum of the token log-probabilities (EOS included) for greedy
        decoding, that sum divided by ``length ** length_penalty`` for beam search.
    """

    tokens: list[int]
    weights: np.ndarray
    score: float


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _call_step(
    step: StepFn, y_prev: np.ndarray, carry: Any, position: int, never: tuple[int, ...]
) -> tuple[np.ndarray, Any, np.ndarray]:
    """Run one decoder step, check the shapes that cross the seam, rule out ``never`` ids."""
    log_probs, carry, weights = step(y_prev, carry, position)
    log_probs = np.array(log_probs, dtype=np.float64)  # a copy: the backend's array is not ours
    log_probs[:, list(never)] = -np.inf
    weights = np.asarray(weights)
    n = y_prev.shape[0]
    if log_probs.ndim != 2 or log_probs.shape[0] != n:
        raise ValueError(f"step must return log_probs of shape ({n}, V), got {log_probs.shape}")
    if weights.ndim != 2 or weights.shape[0] != n:
        raise ValueError(f"step must return weights of shape ({n}, T), got {weights.shape}")
    return log_probs, carry, weights


def greedy_decode(
    step: StepFn,
    select: SelectFn,
    carry: Any,
    batch_size: int,
    max_length: int,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    never: tuple[int, ...] = NEVER_EMITTED,
) -> list[Hypothesis]:
    """Decode a batch by taking the most probable token at every step.

    ``y_i = argmax_y log p(y | y_<i, x)``, until EOS or ``max_length`` output tokens. Ties go
    to the lowest token id.

    Parameters
    ----------
    step : callable
        ``step(y_prev (N,), carry, position) -> (log_probs (N, V), carry, weights (N, T))``.
    select : callable
        ``select(carry, rows) -> carry``, keeps the given batch rows of every carried array.
    carry : object
        The initial batch-first carry, one row per item.
    batch_size : int
        Number of items (rows of ``carry``).
    max_length : int
        Maximum number of output tokens per item (EOS not counted).
    bos_id, eos_id : int
        Start and end token ids.
    never : tuple of int, default=(PAD, BOS, UNK)
        Token ids that are never chosen (their log-probability is taken as -inf).

    Returns
    -------
    list of Hypothesis
        One per item, in input order.
    """
    batch_size = _check_int(batch_size, "batch_size", 0)
    max_length = _check_int(max_length, "max_length", 1)
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    rows_w: list[list[np.ndarray]] = [[] for _ in range(batch_size)]
    scores = np.zeros(batch_size)
    alive = np.arange(batch_size)  # original index of each carried row
    y_prev = np.full(batch_size, bos_id, dtype=np.int64)

    for position in range(max_length):
        if alive.size == 0:
            break
        log_probs, carry, weights = _call_step(step, y_prev, carry, position, never)
        # log_probs (N, V), weights (N, T)
        best = log_probs.argmax(axis=1)  # (N,)
        for row, item in enumerate(alive):
            scores[item] += log_probs[row, best[row]]
            rows_w[item].append(weights[row])
            if best[row] != eos_id:
                tokens[item].append(int(best[row]))
        keep = np.flatnonzero(best != eos_id)
        if keep.size < alive.size and keep.size > 0:
            carry = select(carry, keep)
        alive, y_prev = alive[keep], best[keep].astype(np.int64)

    return [
        Hypothesis(tokens=tokens[i], weights=np.stack(rows_w[i]), score=float(scores[i]))
        for i in range(batch_size)
    ]


@dataclass
class _Beam:
    """A live partial hypothesis: its tokens, attention rows and summed log-probability."""

    tokens: list[int]
    weights: list[np.ndarray]
    log_prob: float


def _normalised(log_prob: float, length: int, length_penalty: float) -> float:
    """``sum(log p) / length ** length_penalty`` (length >= 1 counts EOS when emitted)."""
    return log_prob / max(length, 1) ** length_penalty


def beam_decode(
    step: StepFn,
    select: SelectFn,
    carry: Any,
    batch_size: int,
    beam_size: int,
    max_length: int,
    length_penalty: float = 1.0,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    never: tuple[int, ...] = NEVER_EMITTED,
) -> list[Hypothesis]:
    """Decode a batch with beam search and length-normalised scores.

    Each item keeps up to ``beam_size`` live hypotheses. At every step the ``2 * beam_size``
    best extensions ``log p(y_<i) + log p(y_i | y_<i, x)`` of the item's live beams are ranked;
    an EOS extension ranked within the first ``beam_size`` becomes a finished hypothesis with
    score ``sum(log p) / len ** length_penalty`` (``len`` counts EOS), the best non-EOS
    extensions (up to ``beam_size``) stay live. An item stops when it holds ``beam_size``
    finished hypotheses, when no live beam is left, or after ``max_length`` output tokens. The
    result is its best finished hypothesis; an item that finished none returns its best live
    beam, normalised by its length. Ties go to the earlier beam, then the lower token id.

    Parameters
    ----------
    step, select, carry, batch_size, max_length : see :func:`greedy_decode`.
    beam_size : int
        Number of hypotheses kept per item. ``beam_size=1`` is greedy decoding.
    length_penalty : float, default=1.0
        Exponent of the length normalisation; 0 ranks by the plain sum of log-probabilities.
    bos_id, eos_id, never : see :func:`greedy_decode`.

    Returns
    -------
    list of Hypothesis
        The best hypothesis of each item, in input order.
    """
    batch_size = _check_int(batch_size, "batch_size", 0)
    beam_size = _check_int(beam_size, "beam_size", 1)
    max_length = _check_int(max_length, "max_length", 1)
    if not np.isfinite(length_penalty) or length_penalty < 0:
        raise ValueError(f"length_penalty must be a finite float >= 0, got {length_penalty!r}")

    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    live: list[list[_Beam]] = [[_Beam([], [], 0.0)] for _ in range(batch_size)]
    owner = np.arange(batch_size)  # item of each carried row
    y_prev = np.full(batch_size, bos_id, dtype=np.int64)

    for position in range(max_length):
        if owner.size == 0:
            break
        log_probs, carry, weights = _call_step(step, y_prev, carry, position, never)
        # log_probs (N, V), weights (N, T)
        vocab = log_probs.shape[1]
        next_rows: list[int] = []
        next_owner: list[int] = []
        next_tokens: list[int] = []
        first = 0
        for item in np.unique(owner):  # rows of one item are contiguous, items ascending
            beams = live[item]
            rows = np.arange(first, first + len(beams))
            first += len(beams)
            totals = np.array([b.log_prob for b in beams])[:, None] + log_probs[rows]  # (K, V)
            flat = totals.ravel()
            order = np.argsort(-flat, kind="stable")[: 2 * beam_size]
            survivors: list[_Beam] = []
            for rank, index in enumerate(order):
                total = float(flat[index])
                if not np.isfinite(total) or len(survivors) == beam_size:
                    break
                k, token = divmod(int(index), vocab)
                beam = beams[k]
                w = [*beam.weights, weights[rows[k]]]
                if token == eos_id:
                    if rank < beam_size:
                        score = _normalised(total, len(beam.tokens) + 1, length_penalty)
                        finished[item].append(Hypothesis(list(beam.tokens), np.stack(w), score))
                    continue
                survivors.append(_Beam([*beam.tokens, token], w, total))
                next_rows.append(int(rows[k]))
                next_tokens.append(token)
            if len(finished[item]) >= beam_size or not survivors:
                del next_rows[len(next_rows) - len(survivors) :]
                del next_tokens[len(next_tokens) - len(survivors) :]
                survivors = []
            next_owner.extend([int(item)] * len(survivors))
            if survivors or finished[item]:
                live[item] = survivors
            # else: every extension had log-probability -inf; keep the beams as they were.

        rows_kept = np.asarray(next_rows, dtype=np.int64)
        if rows_kept.size:
            carry = select(carry, rows_kept)
        owner = np.asarray(next_owner, dtype=np.int64)
        y_prev = np.asarray(next_tokens, dtype=np.int64)

    results = []
    for item in range(batch_size):
        candidates = finished[item] or [
            Hypothesis(
                beam.tokens,
                np.stack(beam.weights),
                _normalised(beam.log_prob, len(beam.tokens), length_penalty),
            )
            for beam in live[item]
        ]
        # max keeps the first of equal scores: the earlier-finished or higher-ranked hypothesis.
        results.append(max(candidates, key=lambda h: h.score))
    return results
