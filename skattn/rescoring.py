"""Scoring given outputs with a fitted model, and reranking another system's n-best lists.

Two systems that learned differently make different mistakes. Rao et al. (2015) combined an
LSTM with a joint-sequence n-gram model and took CMUdict's word error rate from about 25 to
21 %; the same holds here (``benchmarks/bench_g2p_peers.py --rerank``). The pieces:

    log_likelihood                 log p(y | x) = sum_i log p(y_i | y_<i, x), EOS included,
                                   of given (source, output) pairs, teacher forced
    NBestReranker                  candidates: the other system's n-best and the model's own
                                   answer (and each rescorer's); each scored
                                       s(c) = (log p_model(c | x)
                                               + sum_k v_k log p_k(c | x) + weight * e(c))
                                              / (|c| + 1) ** a
                                   with e(c) the other system's score (higher is better) and
                                   p_k the rescorers' models (a right-to-left one,
                                   :class:`skattn.right_to_left.RightToLeft`, say); the best
                                   kept. ``fit`` chooses ``weight``, the ``v_k`` and ``a`` on
                                   held-out data (a dev set).

The model side is ``log_likelihood`` (``Seq2Seq``, ``Seq2SeqEnsemble`` and a ``serving.load``
runtime, all through :meth:`skattn.core.inference.Translator.log_likelihoods`: the decoder
stepped over the candidates), so a reranked prediction costs one beam search and one
teacher-forced pass over the candidates, besides the other system's n-best.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from skattn import allotment
from skattn.core.checks import FLOAT32_MAX
from skattn.core.items import (
    as_outputs,
    as_token_lists,
    check_output_lengths,
    check_references,
    ordered_items,
)
from skattn.core.manifest import MAX_OUTPUT_LENGTH
from skattn.core.text import detokenize
from skattn.metrics import check_reference_items, exact_match
from skattn.scoring import output_facts

__all__ = ["NBestReranker", "estimator_log_likelihood", "output_facts"]

#: ``(|c| + 1) ** a`` stays finite in float64 for every output an artifact may carry (4,097
#: tokens with EOS: about 1e289) up to this exponent; 0 to 1 are the usual ones.
MAX_LENGTH_EXPONENT = 80.0


def estimator_log_likelihood(estimator, X: Sequence, y: Sequence, tokenizer: str) -> np.ndarray:
    """``estimator.log_likelihood(X, y)`` of a fitted ``Seq2Seq`` or ``Seq2SeqEnsemble``, whose
    fitted tokenizer is ``tokenizer``: its decoder stepped over the given outputs
    (:meth:`skattn.core.inference.Translator.log_likelihoods`, as the runtime does), at the
    estimator's attention ``temperature`` (as its search and its export score).

    An output token outside the model's target vocabulary cannot be produced: its pair scores
    ``-inf``. Outputs are given as the model predicts them: token lists for a model fitted on
    token lists (a string would be split by the tokenizer into other tokens).
    """
    check_is_fitted(estimator)
    estimator._validate_params()
    translator = estimator._translator()  # first: an ensemble checks its members again
    sources, _ = as_token_lists(X, "X", tokenizer)
    targets = as_outputs(y, "y", tokenizer, estimator.output_kind_)
    if len(sources) != len(targets):
        raise ValueError(
            f"X and y must have the same length, got {len(sources)} and {len(targets)}"
        )
    check_output_lengths(targets, MAX_OUTPUT_LENGTH, "y")
    with allotment.torch_threads(estimator.n_threads):
        return translator.log_likelihoods(sources, targets, temperature=estimator.temperature)


class NBestReranker(BaseEstimator):
    """Rerank another system's n-best lists, with a fitted skattn model's own answer added.

    Each candidate ``c`` of a source ``x`` scores

        s(c) = (log p_model(c | x) + sum_k v_k log p_k(c | x) + weight * e(c))
               / (|c| + 1) ** length_exponent

    where ``e(c)`` is the other system's score (higher is better: Phonetisaurus' ``nbest``
    gives the log of each path's probability over the paths it returned) and ``p_k`` are the
    ``rescorers``' models; a candidate it did not list (the model's own answer, and each
    rescorer's) gets the lowest score of its list minus ``missing_penalty``. The best-scoring
    candidate is the prediction.

    Parameters
    ----------
    estimator : fitted Seq2Seq or Seq2SeqEnsemble, or a ``serving.load`` runtime
        The model that scores every candidate (``log_likelihood``) and proposes its own answer
        (``predict``, at its own ``beam_size``): an exported artifact reranks too (the packaged
        G2P models, say). ``fit`` does not fit it; ``sklearn.base.clone`` would return an
        estimator unfitted, so wrap a fitted one in ``sklearn.frozen.FrozenEstimator`` for
        ``GridSearchCV`` or ``cross_val_score`` (a runtime clones as itself).
    nbest : callable
        ``nbest(sources) -> list`` of one list per source of ``(output, score)`` pairs, the
        output a str or token list as the estimator's ``y`` (best first; may be empty).
    weights : sequence of float, default=(0, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2)
        The ``weight`` values :meth:`fit` chooses from.
    length_exponents : sequence of float, default=(0.0, 1.0)
        The ``length_exponent`` values :meth:`fit` chooses from.
    missing_penalty : float, default=2.0
    rescorers : sequence of models, default=()
        More fitted models (each as ``estimator`` may be, with its tokenizer and output kind)
        whose log-likelihoods join the score, and whose own answers join the candidates: a
        model that learned differently, such as a right-to-left one
        (:class:`skattn.right_to_left.RightToLeft`). ``clone`` unfits them as it would the
        estimator: wrap fitted ones in ``sklearn.frozen.FrozenEstimator`` for a search.
    rescorer_weights : sequence of float, default=(0, 0.25, 0.5, 0.75, 1)
        The ``v_k`` values :meth:`fit` chooses from, for each rescorer (the grid is their
        product with ``weights`` and ``length_exponents``).

    Attributes
    ----------
    weight_, length_exponent_ : float
        The chosen pair (the highest exact match on ``fit``'s data; ties: the first in grid
        order).
    rescorer_weights_ : tuple of float
        The chosen ``v_k``, one per rescorer (empty without rescorers).
    fit_scores_ : dict
        ``(weight, length_exponent, *rescorer_weights) -> exact match`` over the grid.
    """

    def __init__(
        self,
        estimator,
        nbest: Callable[[list], list],
        weights: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0),
        length_exponents: Sequence[float] = (0.0, 1.0),
        missing_penalty: float = 2.0,
        rescorers: Sequence = (),
        rescorer_weights: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    ) -> None:
        self.estimator = estimator
        self.nbest = nbest
        self.weights = weights
        self.length_exponents = length_exponents
        self.missing_penalty = missing_penalty
        self.rescorers = rescorers
        self.rescorer_weights = rescorer_weights

    def _facts(self) -> tuple[str, str]:
        """The model's tokenizer and output kind: a fitted estimator's or a runtime's."""
        return _model_facts(self.estimator, "estimator")

    @property
    def tokenizer_(self) -> str | None:
        """The model's tokenizer (what :mod:`skattn.scoring`'s scorers score with)."""
        return self._facts()[0]

    @property
    def output_kind_(self) -> str | None:
        """The model's output kind, ``"str"`` or ``"tokens"``."""
        return self._facts()[1]

    def _models(self) -> list:
        """The estimator, then the rescorers, each checked (the rescorers must read outputs
        as the estimator does: one tokenizer, one output kind)."""
        facts = self._facts()
        rescorers = self.rescorers
        if not isinstance(rescorers, Sequence) or isinstance(rescorers, str):
            raise ValueError(
                f"rescorers must be a sequence (a list or a tuple) of fitted models, got "
                f"{type(rescorers).__name__}"
            )
        for k, model in enumerate(rescorers):
            theirs = _model_facts(model, f"rescorers[{k}]")
            if theirs != facts:
                raise ValueError(
                    f"rescorers[{k}] reads outputs as (tokenizer, output kind) {theirs}, the "
                    f"estimator as {facts}: they must agree"
                )
        return [self.estimator, *rescorers]

    def _check(self) -> None:
        self._models()
        if not callable(self.nbest):
            raise ValueError(f"nbest must be callable, got {type(self.nbest).__name__}")
        for name, high in (
            ("weights", FLOAT32_MAX),
            ("length_exponents", MAX_LENGTH_EXPONENT),
            ("rescorer_weights", FLOAT32_MAX),
        ):
            grid = getattr(self, name)
            if not (
                isinstance(grid, Sequence | np.ndarray)  # not a generator: fit reads it again
                and _finite_reals(grid, allow_empty=False)
                and 0 <= min(grid)
                and max(grid) <= high
            ):
                raise ValueError(
                    f"{name} must be a non-empty sequence (a list, a tuple or an array) of "
                    f"floats from 0 to {high:g}, got {grid!r:.80}"
                )
        penalty = self.missing_penalty
        if not (_finite_reals([penalty]) and 0 <= penalty <= FLOAT32_MAX):
            raise ValueError(
                f"missing_penalty must be a float from 0 to {FLOAT32_MAX:g}, got {penalty!r}"
            )

    def _candidates(self, X: Sequence) -> tuple[list[list[list[str]]], np.ndarray, np.ndarray]:
        """Per source its candidates' tokens; their log-likelihoods under each model (the
        estimator's row first, then the rescorers', ``(n_models, n_candidates)``) and the
        other system's scores (the missing ones filled in), flat over the sources."""
        tokenizer, output_kind = self._facts()
        models = self._models()
        X = ordered_items(X, "X")
        sources, _ = as_token_lists(X, "X", tokenizer)
        lists = self.nbest(list(X))
        if not isinstance(lists, list) or len(lists) != len(sources):
            got = len(lists) if isinstance(lists, list) else type(lists).__name__
            raise ValueError(
                f"nbest must return a list of one list per source: {len(X)}, got {got}"
            )
        answers = []  # each model's own answer to every source
        for k, model in enumerate(models):
            own = model.predict(X)
            if len(own) != len(sources):
                name = "estimator" if k == 0 else f"rescorers[{k - 1}]"
                raise ValueError(
                    f"{name}.predict returned {len(own)} outputs for {len(sources)} sources"
                )
            answers.append(own)
        candidates, external = [], []
        for i, listed in enumerate(lists):
            scored: dict[tuple, float] = {}
            if not isinstance(listed, list | tuple):
                raise ValueError(f"nbest's list for source {i} must be a list, got {listed!r:.60}")
            for entry in listed:
                if not (isinstance(entry, list | tuple) and len(entry) == 2):
                    raise ValueError(
                        f"nbest's entries must be (output, score) pairs: source {i} has "
                        f"{entry!r:.60}"
                    )
                output, score = entry
                if not _finite_reals([score]):
                    raise ValueError(f"nbest's score for source {i} is not a finite number")
                name = f"nbest's output for source {i}"
                tokens = as_outputs([output], name, tokenizer, output_kind)
                scored.setdefault(tuple(tokens[0]), float(score))
            floor = min(scored.values(), default=0.0) - self.missing_penalty
            for own in answers:
                answer_tokens, _ = as_token_lists([own[i]], "prediction", tokenizer)
                scored.setdefault(tuple(answer_tokens[0]), floor)
            candidates.append([list(c) for c in scored])
            external.extend(scored.values())
        pairs_x = [s for s, cands in zip(X, candidates, strict=True) for _ in cands]
        pairs_y = [c for cands in candidates for c in cands]
        # a candidate longer than any model writes scores -inf, unscored: the model cannot
        # write it (and log_likelihood refuses it)
        fits = np.array([len(c) <= MAX_OUTPUT_LENGTH for c in pairs_y], dtype=bool)
        likelihoods = np.full((len(models), len(pairs_y)), -np.inf)
        if fits.any():
            fit_x = [x for x, f in zip(pairs_x, fits, strict=True) if f]
            fit_y = [c for c, f in zip(pairs_y, fits, strict=True) if f]
            for k, model in enumerate(models):
                likelihoods[k, fits] = model.log_likelihood(fit_x, fit_y)
        return candidates, likelihoods, np.asarray(external)

    @staticmethod
    def _choose(
        candidates, likelihoods, external, weight, length_exponent, rescorer_weights=()
    ) -> list[list[str]]:
        lengths = np.asarray([len(c) + 1 for cands in candidates for c in cands], dtype=float)
        total = likelihoods[0] + weight * external
        for v, rescored in zip(rescorer_weights, likelihoods[1:], strict=True):
            if v:  # (0 * -inf would be nan: a weight of 0 leaves the rescorer out)
                total = total + v * rescored
        scores = total / lengths**length_exponent
        chosen, start = [], 0
        for cands in candidates:
            best = int(np.argmax(scores[start : start + len(cands)]))  # first of equal scores
            chosen.append(cands[best])
            start += len(cands)
        return chosen

    def _grid(self) -> list[tuple[float, ...]]:
        """``(weight, length_exponent, *rescorer_weights)`` settings in grid order."""
        axes = [self.weights, self.length_exponents]
        axes += [self.rescorer_weights] * len(self.rescorers)
        return [tuple(float(v) for v in point) for point in itertools.product(*axes)]

    def fit(self, X: Sequence, y: Sequence) -> NBestReranker:
        """Choose ``weight``, ``length_exponent`` and the rescorers' weights by exact match on
        ``(X, y)``: held-out data (a dev set), never the data the scores are reported on.
        ``y`` items may be lists of references (any one counts, as in
        :func:`skattn.metrics.exact_match`)."""
        self._check()
        X, y = ordered_items(X, "X"), ordered_items(y, "y", "reference")
        if len(X) != len(y) or not len(X):
            raise ValueError(f"X and y must be non-empty and of one length: {len(X)}, {len(y)}")
        tokenizer, output_kind = self._facts()
        check_references(y, "y", output_kind)  # else no candidate matched: weight_ 0, silently
        check_reference_items(y, tokenizer, "y")  # before the passes that take minutes
        candidates, likelihoods, external = self._candidates(X)
        scores = {}
        for weight, exponent, *rescorer_weights in self._grid():
            chosen = self._choose(
                candidates, likelihoods, external, weight, exponent, rescorer_weights
            )
            scores[(weight, exponent, *rescorer_weights)] = exact_match(
                y, chosen, tokenizer=tokenizer
            )
        best = max(scores.values())
        chosen_point = next(point for point, score in scores.items() if score == best)
        # set together, once nothing can fail: a failed fit leaves a fitted reranker as it was
        self.fit_scores_ = scores
        self.weight_, self.length_exponent_ = chosen_point[:2]
        self.rescorer_weights_ = tuple(chosen_point[2:])
        return self

    def score(self, X: Sequence, y: Sequence) -> float:
        """Exact match of :meth:`predict` against ``y`` (any of an item's references counts)."""
        tokenizer, output_kind = self._facts()
        check_references(y, "y", output_kind)
        return exact_match(y, self.predict(X), tokenizer=tokenizer)

    def predict(self, X: Sequence) -> list:
        """The best candidate of each source, as the estimator's ``predict`` gives outputs."""
        check_is_fitted(self, "weight_")
        self._check()
        rescorer_weights = getattr(self, "rescorer_weights_", ())  # (fitted before rescorers)
        if len(rescorer_weights) != len(self.rescorers):
            raise ValueError(
                f"the reranker was fitted with {len(rescorer_weights)} rescorers and has "
                f"{len(self.rescorers)} now: fit it again"
            )
        candidates, likelihoods, external = self._candidates(X)
        chosen = self._choose(
            candidates, likelihoods, external, self.weight_, self.length_exponent_,
            rescorer_weights,
        )  # fmt: skip
        tokenizer, output_kind = self._facts()
        if output_kind == "str":
            return [detokenize(tokens, tokenizer) for tokens in chosen]
        return chosen


def _model_facts(model, name: str) -> tuple[str, str]:
    """A scoring model's tokenizer and output kind: a fitted estimator's or a runtime's."""
    if not all(callable(getattr(model, attr, None)) for attr in ("predict", "log_likelihood")):
        raise ValueError(
            f"{name} must be a fitted Seq2Seq or Seq2SeqEnsemble or a serving.load "
            f"runtime (with predict and log_likelihood), got {type(model).__name__}"
        )
    if getattr(model, "manifest", None) is None:  # not serving.load(...): an estimator
        check_is_fitted(model)
    return output_facts(model)


def _finite_reals(values, allow_empty: bool = True) -> bool:
    try:
        values = list(values)
    except TypeError:
        return False
    ok = all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )
    return ok and (allow_empty or bool(values))
