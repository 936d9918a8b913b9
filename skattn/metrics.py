"""Sequence metrics: exact match, token accuracy, edit-distance error rates, BLEU.

Every metric takes ``y_true`` and ``y_pred``, two equal-length sequences of items. An item is a
string (split into tokens by ``tokenizer``: ``"char"`` for characters, ``"space"`` for words or
phonemes) or a list of string tokens (a list, a tuple or a 1-D NumPy array of str, such as a row
of a 2-D string array). An item of ``y_true`` may also hold *several references*, given as a list
of token lists (for example all pronunciations of a word); the reference closest to the
prediction counts. A list of strings is always one token list: to give several string
references, pass them tokenized (``[r.split() for r in refs]``).

Edit distances come from ``rapidfuzz``, BLEU from ``sacrebleu``. The scikit-learn scorers built
from these metrics live in :mod:`skattn.scoring` (and are reachable here by their names).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from skattn.core.items import ordered_items
from skattn.core.text import TOKENIZERS, check_tokenizer, tokenize

__all__ = [
    "character_error_rate",
    "corpus_bleu",
    "edit_distance",
    "exact_match",
    "phoneme_error_rate",
    "token_accuracy",
    "token_error_rate",
    "word_error_rate",
]

Item = str | Sequence[str]
Tokens = list[str]


# ---------------------------------------------------------------- input handling


def _is_container(item: Any) -> bool:
    """A list, a tuple or a 1-D array: the forms a token list (or a list of them) may take."""
    return isinstance(item, (list, tuple)) or (isinstance(item, np.ndarray) and item.ndim == 1)


def _is_token_list(item: Any) -> bool:
    # a row of a 2-D string array (what Seq2Seq.fit accepts) is a 1-D array of np.str_ (a str)
    return _is_container(item) and all(isinstance(t, str) for t in item)


def _is_reference_list(item: Any) -> bool:
    """Whether a ``y_true`` item holds several references (a non-empty list of token lists)."""
    # a 2-D array of str, shape (n_references, n_tokens), iterates as 1-D rows: token lists
    is_array = isinstance(item, np.ndarray) and item.ndim in (1, 2)
    outer = is_array or isinstance(item, (list, tuple))
    return outer and len(item) > 0 and all(_is_container(r) for r in item)


def _as_tokens(item: Any, tokenizer: str, name: str) -> Tokens:
    """One item (a str or a token list) as a list of tokens."""
    if isinstance(item, str):
        return tokenize(item, tokenizer)
    if _is_token_list(item):
        return [str(t) for t in item]  # np.str_ -> str
    raise ValueError(f"{name} items must be str or lists of str tokens, got {item!r}")


def _as_references(item: Any, tokenizer: str, name: str = "y_true") -> list[Tokens]:
    """One ``y_true`` item as a non-empty list of candidate references."""
    if _is_reference_list(item):
        return [_as_tokens(r, tokenizer, name) for r in item]
    return [_as_tokens(item, tokenizer, name)]


def check_reference_items(y_true: Sequence, tokenizer: str, name: str = "y_true") -> None:
    """``ValueError`` naming ``name`` unless every item is what the metrics read as references
    (a str, a token list, or a list of those): for callers that score much later."""
    for item in ordered_items(y_true, name, "items"):
        _as_references(item, tokenizer, name)


def _pairs(y_true: Sequence, y_pred: Sequence, tokenizer: str) -> list[tuple[list[Tokens], Tokens]]:
    """Validate and tokenize: one ``(references, prediction)`` pair per item."""
    check_tokenizer(tokenizer)
    y_true = ordered_items(y_true, "y_true", "items")
    y_pred = ordered_items(y_pred, "y_pred", "items")
    if len(y_true) == 0:
        raise ValueError("y_true must hold at least one item")
    if len(y_pred) != len(y_true):
        raise ValueError(
            f"y_pred must have as many items as y_true, got {len(y_pred)} and {len(y_true)}"
        )
    return [
        (_as_references(ref, tokenizer), _as_tokens(pred, tokenizer, "y_pred"))
        for ref, pred in zip(y_true, y_pred, strict=True)
    ]


# ---------------------------------------------------------------- metrics


def edit_distance(a: Item, b: Item) -> int:
    """Levenshtein distance (insertions, deletions, substitutions, each cost 1).

    Parameters
    ----------
    a, b : str or list of str
        Strings are compared character by character, lists token by token.

    Returns
    -------
    int

    Examples
    --------
    >>> edit_distance("kitten", "sitting")
    3
    >>> edit_distance(["K", "AH", "Z"], ["K", "AO", "Z", "IH"])
    2
    """
    items = []
    for name, item in (("a", a), ("b", b)):
        if isinstance(item, np.ndarray) and item.ndim == 1:  # a row of a string array
            item = item.tolist()
        if not isinstance(item, str) and not (  # (bytes and range are Sequences too)
            isinstance(item, list | tuple) and all(isinstance(t, str) for t in item)
        ):
            raise ValueError(f"{name} must be a str or a list of str, got {item!r:.80}")
        items.append(item)
    return Levenshtein.distance(*items)


def exact_match(y_true: Sequence, y_pred: Sequence, *, tokenizer: str = "char") -> float:
    """Fraction of items whose prediction equals one of its references, token for token.

    Parameters
    ----------
    y_true : sequence
        References: str, token list, or a list of token lists (several references).
    y_pred : sequence
        Predictions: str or token list.
    tokenizer : {"char", "space"}, default="char"
        How string items are split before comparison.

    Returns
    -------
    float in [0, 1]

    Examples
    --------
    >>> exact_match(["abc", "abd"], ["abc", "abc"])
    0.5
    """
    pairs = _pairs(y_true, y_pred, tokenizer)
    return sum(pred in refs for refs, pred in pairs) / len(pairs)


def word_error_rate(y_true: Sequence, y_pred: Sequence, *, tokenizer: str = "space") -> float:
    """Word error rate as grapheme-to-phoneme work reports it: ``1 - exact_match``.

    An item (a word) is an error unless its predicted pronunciation matches one of its
    references exactly. This is *not* the speech-recognition WER (an edit distance over words);
    for that, use ``token_error_rate(y_true, y_pred, tokenizer="space")``.

    Parameters
    ----------
    y_true, y_pred : sequence
        As in :func:`exact_match`.
    tokenizer : {"char", "space"}, default="space"

    Returns
    -------
    float in [0, 1]

    Examples
    --------
    >>> word_error_rate([[["K", "AH", "Z"], ["K", "AO", "Z"]], "AH M"], ["K AO Z", "AH N"])
    0.5
    """
    return 1.0 - exact_match(y_true, y_pred, tokenizer=tokenizer)


def token_accuracy(y_true: Sequence, y_pred: Sequence, *, tokenizer: str = "char") -> float:
    """Fraction of token positions where the prediction holds the reference's token.

    .. math:: \\text{acc} = \\frac{\\sum_n |\\{i : \\hat y_{n,i} = y_{n,i}\\}|}
              {\\sum_n \\max(|y_n|, |\\hat y_n|)}

    Positions are compared one to one (no alignment), so a missing, extra or shifted token
    costs every position after it; the denominator counts the longer of the two sequences, so
    a prediction that runs on is penalised. With several references, the one that scores best
    for the item counts.

    Parameters
    ----------
    y_true, y_pred : sequence
        As in :func:`exact_match`.
    tokenizer : {"char", "space"}, default="char"

    Returns
    -------
    float in [0, 1]
        1.0 when every reference and prediction is empty.

    Examples
    --------
    >>> token_accuracy(["1234"], ["1243"])
    0.5
    >>> token_accuracy(["12"], ["1234"])
    0.5
    """

    def counts(ref: Tokens, pred: Tokens) -> tuple[int, int]:
        return sum(a == b for a, b in zip(ref, pred, strict=False)), max(len(ref), len(pred))

    correct = total = 0
    for refs, pred in _pairs(y_true, y_pred, tokenizer):
        c, n = max(
            (counts(ref, pred) for ref in refs), key=lambda cn: cn[0] / cn[1] if cn[1] else 1.0
        )
        correct += c
        total += n
    return correct / total if total else 1.0


def token_error_rate(y_true: Sequence, y_pred: Sequence, *, tokenizer: str = "char") -> float:
    """Corpus token error rate by edit distance (CER on characters, PER on phonemes).

    .. math:: \\text{TER} = \\frac{\\sum_n d(y_n^*, \\hat y_n)}{\\sum_n |y_n^*|},
              \\qquad y_n^* = \\arg\\min_{r \\in R_n} d(r, \\hat y_n)

    where ``d`` is the Levenshtein distance and ``R_n`` the references of item ``n`` (ties go
    to the longer reference). Can exceed 1 when predictions hold many insertions.

    Parameters
    ----------
    y_true, y_pred : sequence
        As in :func:`exact_match`.
    tokenizer : {"char", "space"}, default="char"

    Returns
    -------
    float >= 0

    Examples
    --------
    >>> token_error_rate(["kitten"], ["sitting"])
    0.5
    """
    errors = length = 0
    for refs, pred in _pairs(y_true, y_pred, tokenizer):  # checked token lists: no re-check
        distance, ref_length = min((Levenshtein.distance(ref, pred), -len(ref)) for ref in refs)
        errors += distance
        length -= ref_length
    if length == 0:
        raise ValueError("y_true must hold at least one reference token")
    return errors / length


def character_error_rate(y_true: Sequence, y_pred: Sequence) -> float:
    """Token error rate over characters: ``token_error_rate(..., tokenizer="char")``."""
    return token_error_rate(y_true, y_pred, tokenizer="char")


def phoneme_error_rate(y_true: Sequence, y_pred: Sequence) -> float:
    """Token error rate over space-separated phonemes (PER), ``tokenizer="space"``.

    Examples
    --------
    >>> phoneme_error_rate(["K AH Z", "AH M"], ["K AO Z", "AH M"])
    0.2
    """
    return token_error_rate(y_true, y_pred, tokenizer="space")


def corpus_bleu(
    y_true: Sequence,
    y_pred: Sequence,
    *,
    tokenizer: str | None = None,
    tokenize: str | None = None,
) -> float:
    """Corpus BLEU (0 to 100) computed by sacrebleu.

    Parameters
    ----------
    y_true : sequence
        References: str, token list, or a list of token lists (several references; items may
        have different numbers of them).
    y_pred : sequence
        Predictions: str or token list.
    tokenizer : {"char", "space"}, optional
        Split string items into tokens as the other metrics do (``"char"``: BLEU over
        characters, whitespace dropped; ``"space"``: over whitespace-separated tokens), so that
        BLEU counts the n-grams of the tokens a model reads and writes. The scorers
        (``bleu_scorer``) pass the estimator's ``tokenizer``: a character-level ``Seq2Seq``
        is scored on characters, not on its outputs as single words (a word of one token has
        no 2-gram, so every such output would score 0). Default: strings go to sacrebleu as
        text.
    tokenize : str, optional
        sacrebleu's tokenizer (one of ``sacrebleu.metrics.BLEU.TOKENIZERS``: ``"13a"``,
        ``"none"``, ``"char"``, ``"intl"``, ...). Default: ``"13a"`` (its standard) when every
        item is a string left as text, ``"none"`` when token lists are given or ``tokenizer``
        split the strings (the tokens are joined with spaces as they are).

    Returns
    -------
    float in [0, 100]

    Examples
    --------
    >>> round(corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"]), 6)
    100.0
    """
    import sacrebleu
    from sacrebleu.metrics import BLEU

    # sacrebleu itself answers an unknown name with a bare KeyError
    if tokenize is not None and not (isinstance(tokenize, str) and tokenize in BLEU.TOKENIZERS):
        raise ValueError(
            f"tokenize must be None or one of {sorted(BLEU.TOKENIZERS)}, got {tokenize!r}"
        )
    _pairs(y_true, y_pred, "space" if tokenizer is None else tokenizer)  # validation only
    any_tokens = False

    def as_text(item: Item) -> str:
        nonlocal any_tokens
        if isinstance(item, str) and tokenizer is None:
            return item
        any_tokens = True
        tokens = TOKENIZERS[tokenizer][0](item) if isinstance(item, str) else item
        return " ".join(t for t in tokens if not t.isspace())

    def references(item: Any) -> list[str]:
        if _is_reference_list(item):
            return [as_text(r) for r in item]
        return [as_text(item)]

    hypotheses = [as_text(pred) for pred in y_pred]
    per_item = [references(ref) for ref in y_true]
    n_streams = max(len(refs) for refs in per_item)
    streams = [[refs[k] if k < len(refs) else None for refs in per_item] for k in range(n_streams)]
    if tokenize is None:
        tokenize = "none" if any_tokens else "13a"
    return float(sacrebleu.corpus_bleu(hypotheses, streams, tokenize=tokenize).score)


# The scorers live in skattn.scoring (which imports the metrics above); their names here stay.
def __getattr__(name: str) -> Any:
    if not name.startswith("__"):  # a dunder probe (copy, pickle, ...) never loads the scorers
        from skattn import scoring

        if name in scoring.__all__:
            return getattr(scoring, name)
    raise AttributeError(f"module 'skattn.metrics' has no attribute {name!r}")


def __dir__() -> list[str]:
    from skattn import scoring

    return sorted([*globals(), *scoring.__all__])
