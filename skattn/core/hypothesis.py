"""What both searches share: the :class:`Hypothesis` they return, the ids they never emit, and
the checked call of a backend's ``step`` (the contract is in :mod:`skattn.core.search`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from skattn.core.text import BOS, EOS, PAD, UNK

BOS_ID = BOS
EOS_ID = EOS
# Ids no target sequence holds: a model is never trained to emit them, and an undertrained one
# that tried would leave an output position with no token. Decoding never chooses them, so every
# output token has exactly one attention row: ``weights[:len(tokens)]``.
NEVER_EMITTED = (PAD, BOS, UNK)

StepFn = Callable[[np.ndarray, Any, int], tuple[np.ndarray, Any, np.ndarray]]
SelectFn = Callable[[Any, np.ndarray], Any]

__all__ = ["BOS_ID", "EOS_ID", "NEVER_EMITTED", "Hypothesis", "SelectFn", "StepFn", "call_step"]


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


def call_step(
    step: StepFn, y_prev: np.ndarray, carry: Any, position: int, never: tuple[int, ...]
) -> tuple[np.ndarray, Any, np.ndarray]:
    """Run one decoder step, check the shapes that cross the seam, rule out ``never`` ids."""
    log_probs, carry, weights = step(y_prev, carry, position)
    log_probs = np.array(log_probs, dtype=np.float64)  # a copy: the backend's array is not ours
    weights = np.asarray(weights)
    n = y_prev.shape[0]
    if log_probs.ndim != 2 or log_probs.shape[0] != n:
        raise ValueError(f"step must return log_probs of shape ({n}, V), got {log_probs.shape}")
    if weights.ndim != 2 or weights.shape[0] != n:
        raise ValueError(f"step must return weights of shape ({n}, T), got {weights.shape}")
    log_probs[:, list(never)] = -np.inf  # after the check: a 1-D array has no such columns
    return log_probs, carry, weights
