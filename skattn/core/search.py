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

from skattn.core.beam import beam_decode
from skattn.core.greedy import GreedySearch, greedy_decode
from skattn.core.hypothesis import BOS_ID, EOS_ID, NEVER_EMITTED, Hypothesis, SelectFn, StepFn

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "NEVER_EMITTED",
    "GreedySearch",
    "Hypothesis",
    "SelectFn",
    "StepFn",
    "beam_decode",
    "greedy_decode",
]
