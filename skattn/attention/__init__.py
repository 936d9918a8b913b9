"""Torch attention: masked softmax with temperature, scorers, global and local attention.

``masked_softmax`` -> ``SCORE_FUNCTIONS`` / ``make_scorer`` (one class per score function, keys
precomputed once per sentence) -> ``Attention`` (padding and local windows, heads, context).
"""

from skattn.attention.attention import Attention
from skattn.attention.local import LOCAL_KINDS
from skattn.attention.scorers import (
    SCORE_FUNCTIONS,
    AdditiveScorer,
    DotScorer,
    GeneralScorer,
    ScaledDotScorer,
    Scorer,
    make_scorer,
)
from skattn.attention.softmax import masked_softmax

__all__ = [
    "LOCAL_KINDS",
    "SCORE_FUNCTIONS",
    "AdditiveScorer",
    "Attention",
    "DotScorer",
    "GeneralScorer",
    "ScaledDotScorer",
    "Scorer",
    "make_scorer",
    "masked_softmax",
]
