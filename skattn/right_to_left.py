"""Outputs read right to left: :class:`RightToLeft`, a model of each output's last token first.

A left-to-right decoder commits to an output's first tokens before it sees how the output ends;
a right-to-left one commits to the end first. The two make different mistakes, so the second
is a useful rescorer of the first's candidates (Liu et al. 2016, "Agreement on
target-bidirectional neural machine translation"; Sennrich et al. 2016's WMT systems reranked
their n-best lists the same way): :class:`skattn.rescoring.NBestReranker` takes it as one of its
``rescorers``.

The model itself is unchanged: :class:`RightToLeft` trains a clone of any ``Seq2Seq`` on every
output reversed, token by token, and reverses what it gives back, so its ``predict``,
``log_likelihood``, ``predict_attention`` and ``score`` read outputs in their usual order, as
scikit-learn's ``TransformedTargetRegressor`` does for a regressor's target.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from skattn.core.attention_maps import rows_reversed
from skattn.core.items import as_token_lists, check_references, ordered_items
from skattn.core.text import check_tokenizer, detokenize
from skattn.metrics import exact_match
from skattn.scoring import output_facts

__all__ = ["RightToLeft", "reverse_outputs"]


def reverse_outputs(items: Sequence, tokenizer: str, name: str = "y") -> list:
    """Each output with its tokens in reverse order, of the kind it came as: a string is split
    by ``tokenizer`` and joined again (``"K AE T"`` -> ``"T AE K"`` with ``"space"``), a token
    list is reversed (items read as :func:`~skattn.core.items.as_token_lists` reads ``X`` and
    ``y``). Reversing twice gives each output back, up to the tokenizer's spacing."""
    check_tokenizer(tokenizer, "tokenizer")
    if not ordered_items(items, name):  # (as_token_lists refuses an empty sequence)
        return []
    token_lists, kind = as_token_lists(items, name, tokenizer)
    reversed_lists = [tokens[::-1] for tokens in token_lists]
    if kind == "str":
        return [detokenize(tokens, tokenizer) for tokens in reversed_lists]
    return reversed_lists


class RightToLeft(BaseEstimator):
    """A sequence-to-sequence model that writes each output from its last token to its first.

    Parameters
    ----------
    estimator : Seq2Seq
        The model to train on reversed outputs (cloned by :meth:`fit`). Its tokenizer splits
        string outputs into the tokens that are reversed.

    Attributes
    ----------
    estimator_ : fitted Seq2Seq, or a ``serving.load`` runtime (see :meth:`fitted`)
        The model of reversed outputs. :meth:`export_onnx` writes its artifact marked right to
        left, which ``serving.load``, the server and the explorer read in the usual order;
        ``estimator_.export_onnx(path)`` writes it as it writes, which
        ``RightToLeft.fitted(serving.load(path))`` reads in the usual order.

    Examples
    --------
    >>> from skattn import Seq2Seq
    >>> r2l = RightToLeft(Seq2Seq(max_steps=5, random_state=0)).fit(["ab", "cd"], ["ba", "dc"])
    >>> len(r2l.predict(["ab"]))
    1
    """

    def __init__(self, estimator) -> None:
        self.estimator = estimator

    @classmethod
    def fitted(cls, model) -> RightToLeft:
        """Wrap a model already trained on reversed outputs (a fitted ``Seq2Seq``, say one
        loaded with joblib, or the ``serving.load`` runtime of its export) without training.
        ``sklearn.base.clone`` of the result gives an unfitted ``RightToLeft`` of ``model``
        (wrap a fitted estimator in ``sklearn.frozen.FrozenEstimator`` to keep it fitted)."""
        _check_model(model)
        manifest = getattr(model, "manifest", None)
        if getattr(manifest, "output_order", None) == "right_to_left":
            raise ValueError(
                "model is the runtime of an artifact marked right to left (RightToLeft."
                "export_onnx), which reads its outputs in the usual order already: use it as it is"
            )
        wrapper = cls(model)
        wrapper.estimator_ = model
        return wrapper

    def fit(self, X: Sequence, y: Sequence, **fit_params) -> RightToLeft:
        """Train a clone of ``estimator`` on ``(X, reversed y)``; ``fit_params`` go to its
        ``fit``."""
        if not all(callable(getattr(self.estimator, n, None)) for n in ("fit", "get_params")):
            raise ValueError(
                f"estimator must be an unfitted Seq2Seq (with fit and get_params), got "
                f"{type(self.estimator).__name__}"
            )
        model = clone(self.estimator)
        tokenizer = _tokenizer(model)
        model.fit(X, reverse_outputs(y, tokenizer), **fit_params)
        self.estimator_ = model
        return self

    def _model(self):
        check_is_fitted(self, "estimator_")
        return self.estimator_

    def _fitted_tokenizer(self) -> str:
        """The tokenizer the fitted model splits outputs with (as :func:`output_facts` reads
        it from a ``Seq2Seq``)."""
        return _tokenizer(self._model())

    @property
    def output_kind_(self) -> str | None:
        """``"str"`` or ``"tokens"``: how the fitted model gives its outputs."""
        return output_facts(self._model())[1]

    @property
    def manifest(self):
        """The runtime's manifest when the model is a ``serving.load`` runtime, else None."""
        return getattr(self.estimator_, "manifest", None) if hasattr(self, "estimator_") else None

    def predict(self, X: Sequence) -> list:
        """The model's outputs, each read from its first token to its last."""
        model = self._model()
        return reverse_outputs(model.predict(X), _tokenizer(model), "prediction")

    def log_likelihood(self, X: Sequence, y: Sequence) -> np.ndarray:
        """``log p(y | x)`` under the right-to-left model: the model's score of each ``y``
        reversed (:meth:`skattn.Seq2Seq.log_likelihood`)."""
        model = self._model()
        return model.log_likelihood(X, reverse_outputs(y, _tokenizer(model)))

    def predict_attention(self, X: Sequence, **kwargs) -> list:
        """Attention maps of :meth:`predict`'s outputs: one row per output token, in the
        outputs' usual order (the model's rows reversed)."""
        return rows_reversed(self._model().predict_attention(X, **kwargs))

    def export_onnx(
        self,
        path: str | os.PathLike,
        quantize: str | None = None,
        max_source_length: int | None = None,
    ) -> Path:
        """Write the model's ONNX artifact marked right to left (its manifest's
        ``output_order``): ``serving.load(path)``, the server and the explorer then give its
        outputs, attention rows and scores in the usual order, and the runtime is itself a
        rescorer for :class:`~skattn.rescoring.NBestReranker`. ``quantize`` and
        ``max_source_length`` are :meth:`skattn.Seq2Seq.export_onnx`'s."""
        model = self._model()
        if getattr(model, "manifest", None) is not None:
            raise ValueError(
                f"the model is a {type(model).__name__}, whose artifact is already written: "
                "export the estimator it came from"
            )
        if isinstance(model, RightToLeft) or not callable(getattr(model, "export_onnx", None)):
            raise ValueError(
                f"the model is a {type(model).__name__}, not a fitted Seq2Seq or "
                "Seq2SeqEnsemble: it cannot be exported right to left"
            )
        return model.export_onnx(path, quantize, max_source_length, output_order="right_to_left")

    def score(self, X: Sequence, y: Sequence) -> float:
        """Exact match of :meth:`predict` against ``y`` (any of an item's references counts)."""
        tokenizer, output_kind = output_facts(self)
        check_references(y, "y", output_kind)
        return exact_match(y, self.predict(X), tokenizer=tokenizer)


def _check_model(model) -> None:
    missing = [n for n in ("predict", "log_likelihood") if not callable(getattr(model, n, None))]
    if missing:
        raise ValueError(
            f"model must be a fitted Seq2Seq or a serving.load runtime, got "
            f"{type(model).__name__} (no {', '.join(missing)})"
        )
    _tokenizer(model)


def _tokenizer(model) -> str:
    tokenizer, _ = output_facts(model)
    if tokenizer is None:
        raise ValueError(
            f"{type(model).__name__} names no tokenizer: its outputs cannot be reversed"
        )
    return tokenizer
