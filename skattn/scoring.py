"""scikit-learn ``scoring`` callables built from the sequence metrics of :mod:`skattn.metrics`.

A scorer is a plain ``(estimator, X, y) -> float`` callable, which ``GridSearchCV`` and
``cross_val_score`` accept as ``scoring``; greater is always better (error rates are negated).
scikit-learn is not imported. The names are also reachable as ``skattn.metrics.<name>``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from skattn.core.items import check_references
from skattn.metrics import (
    corpus_bleu,
    exact_match,
    token_accuracy,
    token_error_rate,
    word_error_rate,
)

__all__ = [
    "SCORERS",
    "SequenceScorer",
    "bleu_scorer",
    "exact_match_scorer",
    "make_sequence_scorer",
    "token_accuracy_scorer",
    "token_error_rate_scorer",
    "word_error_rate_scorer",
]


def _takes_tokenizer(metric: Callable[..., float]) -> bool:
    """Whether ``metric`` has a ``tokenizer`` parameter still free to set."""
    if isinstance(metric, functools.partial) and "tokenizer" in metric.keywords:
        return False  # fixed by the caller: keep it
    try:
        parameters = inspect.signature(metric).parameters
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False
    return "tokenizer" in parameters and parameters["tokenizer"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _final_estimator(estimator: Any) -> Any:
    """The model that predicts for ``estimator``: the last step of a ``Pipeline``, a fitted
    search's ``best_estimator_``, through any depth of such wrappers; ``estimator`` itself
    otherwise (a ``FrozenEstimator`` forwards attributes to its model by itself). Duck-typed:
    scikit-learn is not imported."""
    seen = set()
    while id(estimator) not in seen:
        seen.add(id(estimator))
        steps = getattr(estimator, "steps", None)
        if isinstance(steps, list) and steps and isinstance(steps[-1], tuple | list):
            inner = steps[-1][-1]  # (name, estimator)
        else:
            inner = getattr(estimator, "best_estimator_", None)
        if inner is None or isinstance(inner, str):  # not a wrapper, or "passthrough"
            return estimator
        estimator = inner
    return estimator


def output_facts(model: Any) -> tuple[str | None, str | None]:
    """The tokenizer a model's outputs are split with and their kind (``"str"`` or
    ``"tokens"``), where it says: a ``serving.load`` runtime's manifest; a ``Seq2Seq``'s fitted
    tokenizer (``ValueError`` if ``tokenizer`` was set to another since) or an ensemble's, and
    its fitted output kind; else its ``tokenizer_`` (fitted) or ``tokenizer``; None for what a
    model does not say (a teacher of ``distill`` may be any object with ``predict``)."""
    manifest = getattr(model, "manifest", None)
    if manifest is not None:
        return manifest.tokenizer, manifest.output_kind
    fitted = getattr(model, "_fitted_tokenizer", None)
    if callable(fitted):
        tokenizer = fitted()
    else:
        info = getattr(model, "info", None)
        tokenizer = next(
            (
                value
                for value in (
                    getattr(model, "tokenizer_", None),
                    getattr(model, "tokenizer", None),
                    getattr(info, "tokenizer", None),
                )
                if isinstance(value, str)
            ),
            None,
        )
    kind = getattr(model, "output_kind_", None)
    return (
        tokenizer if isinstance(tokenizer, str) else None,
        kind if isinstance(kind, str) else None,
    )


class SequenceScorer:
    """A ``scoring`` callable for scikit-learn model selection: ``(estimator, X, y) -> float``.

    Calls ``estimator.predict(X)`` and returns ``sign * metric(y, y_pred, **kwargs)``, with
    ``sign = -1`` for error rates so that greater is always better (scikit-learn's convention,
    as ``make_scorer(..., greater_is_better=False)``).

    When ``metric`` takes a ``tokenizer`` argument and ``kwargs`` does not set one, the
    model's own tokenizer is passed (so a ``Seq2Seq(tokenizer="space")`` is scored on its
    tokens, phonemes say, as ``estimator.score`` does): the model is the estimator, or the one
    inside a ``Pipeline`` (its last step), a fitted search (``best_estimator_``) or a
    ``FrozenEstimator``, and its tokenizer the fitted one. A model without a str tokenizer
    (``None``, a callable, no such attribute) leaves the metric's default. A model fitted on
    token lists (``output_kind_ == "tokens"``) refuses string outputs in ``y``, as its
    ``score`` does: its tokenizer would split them into other tokens.

    Parameters
    ----------
    metric : callable
        ``metric(y_true, y_pred, **kwargs) -> float``; must be picklable (a module-level
        function) for ``n_jobs > 1``.
    greater_is_better : bool, default=True
    **kwargs
        Passed to ``metric``; a ``tokenizer`` given here overrides the estimator's.
    """

    def __init__(self, metric: Callable[..., float], greater_is_better: bool = True, **kwargs):
        self.metric = metric
        self.greater_is_better = greater_is_better
        self.kwargs = kwargs

    def __call__(self, estimator: Any, X: Sequence, y: Sequence) -> float:
        sign = 1.0 if self.greater_is_better else -1.0
        kwargs = dict(self.kwargs)
        tokenizer, kind = output_facts(_final_estimator(estimator))
        check_references(y, "y", kind)  # strings refused by name for a token-list model
        if "tokenizer" not in kwargs and tokenizer is not None and _takes_tokenizer(self.metric):
            kwargs["tokenizer"] = tokenizer
        return sign * self.metric(y, estimator.predict(X), **kwargs)  # the metric checks y

    def __repr__(self) -> str:
        args = [getattr(self.metric, "__name__", None) or repr(self.metric)]  # a partial too
        if not self.greater_is_better:
            args.append("greater_is_better=False")
        args += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"SequenceScorer({', '.join(args)})"


def make_sequence_scorer(
    metric: Callable[..., float], *, greater_is_better: bool = True, **kwargs: Any
) -> SequenceScorer:
    """Build a scorer from a metric, as ``sklearn.metrics.make_scorer`` does.

    Parameters
    ----------
    metric : callable
        ``metric(y_true, y_pred, **kwargs) -> float``.
    greater_is_better : bool, default=True
        ``False`` for error rates: the scorer then returns the negated metric.
    **kwargs
        Passed to ``metric``, e.g. ``tokenizer="space"``.

    Returns
    -------
    SequenceScorer

    Examples
    --------
    >>> per = make_sequence_scorer(token_error_rate, greater_is_better=False, tokenizer="space")
    """
    if not callable(metric):
        raise ValueError(f"metric must be callable, got {metric!r}")
    return SequenceScorer(metric, greater_is_better, **kwargs)


exact_match_scorer = SequenceScorer(exact_match)
token_accuracy_scorer = SequenceScorer(token_accuracy)
token_error_rate_scorer = SequenceScorer(token_error_rate, greater_is_better=False)
word_error_rate_scorer = SequenceScorer(word_error_rate, greater_is_better=False)
bleu_scorer = SequenceScorer(corpus_bleu)

SCORERS: dict[str, SequenceScorer] = {
    "exact_match": exact_match_scorer,
    "token_accuracy": token_accuracy_scorer,
    "neg_token_error_rate": token_error_rate_scorer,
    "neg_word_error_rate": word_error_rate_scorer,
    "bleu": bleu_scorer,
}
