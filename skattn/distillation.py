"""Sequence-level knowledge distillation (Kim & Rush, 2016): a student learns a teacher's outputs.

A teacher (an ensemble, a larger model, or an exported artifact) translates the training sources
with its own search (beam search when its ``beam_size`` says so), and the student is fitted on
those (source, teacher output) pairs instead of, or beside, the references:

    y_hat_n = argmax_y p_teacher(y | x_n)   (approximately: the teacher's beam search)
    student = argmin_theta  - sum_n log p_theta(y_hat_n | x_n)   (+ the references' term)

The student sees one output per source, the one the teacher ranks first, so where the data give a
source several references (CMUdict gives some words two pronunciations) it learns one consistent
choice, and it imitates the teacher's search result rather than its per-token distribution.

    teacher = Seq2SeqEnsemble.from_fitted([m0, m1], beam_size=5)
    student = distill(teacher, Seq2Seq(hidden_size=128), X_train)

Any object with ``predict(sources) -> outputs`` can teach: a fitted ``Seq2Seq`` or
``Seq2SeqEnsemble``, or ``serving.load(artifact)`` (onnxruntime, usually the fastest labeller).
"""

from __future__ import annotations

from collections.abc import Sequence

from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from skattn.core.items import as_token_lists, ordered_items
from skattn.core.text import SPECIAL_TOKENS
from skattn.scoring import output_facts

__all__ = ["distill", "teacher_targets"]


def teacher_targets(teacher, X: Sequence, *, tokenizer: str = "char") -> tuple[list, list]:
    """The distinct sources of ``X`` and the teacher's output for each.

    Parameters
    ----------
    teacher : fitted estimator or runtime
        Anything with ``predict(sources)``; a scikit-learn estimator must be fitted.
    X : sequence of str or of token lists
        Sources. Repeats are labelled once (the teacher gives them one output), in first-seen order.
    tokenizer : {"char", "space"}, default="char"
        How the student reads string outputs. Outputs that spell a reserved token once read this
        way are dropped, since ``fit`` refuses them (skattn's own teachers never emit one: their
        decoding drops special ids; a custom teacher with ``"space"`` strings may).

    Returns
    -------
    sources, outputs : lists of equal length
        ``outputs[i]`` is ``teacher.predict([sources[i]])[0]``, of the kind the teacher returns.
    """
    sources, outputs, _ = _labelled(teacher, X, tokenizer)
    return sources, outputs


def _labelled(teacher, X: Sequence, tokenizer: str) -> tuple[list, list, str]:
    """:func:`teacher_targets`, and the kind of the teacher's outputs (``"str"`` or
    ``"tokens"``, as :func:`~skattn.core.items.as_token_lists` names it)."""
    if not callable(getattr(teacher, "predict", None)):
        raise ValueError(f"teacher must have a predict method, got {type(teacher).__name__}")
    if isinstance(teacher, BaseEstimator):
        check_is_fitted(teacher)  # NotFittedError, a ValueError, naming the teacher
    as_token_lists(X, "X", tokenizer)  # the estimator's own message for bad or empty sources
    distinct: dict = {}
    for x in X:
        distinct.setdefault(_key(x), x)
    sources = list(distinct.values())
    outputs = ordered_items(teacher.predict(sources), "teacher.predict(sources)", "outputs")
    if len(outputs) != len(sources):
        raise ValueError(
            f"teacher.predict returned {len(outputs)} outputs for {len(sources)} sources"
        )
    tokens, kind = as_token_lists(outputs, "teacher outputs", tokenizer)
    keep = [i for i, t in enumerate(tokens) if not set(SPECIAL_TOKENS).intersection(t)]
    return [sources[i] for i in keep], [outputs[i] for i in keep], kind


def distill(teacher, student, X: Sequence, y: Sequence | None = None):
    """Fit ``student`` on the teacher's outputs for ``X`` (sequence-level distillation).

    Parameters
    ----------
    teacher : fitted estimator or runtime
        Anything with ``predict(sources)``: ``Seq2Seq``, ``Seq2SeqEnsemble`` (an ensemble is the
        usual teacher) or ``serving.load(...)``. It translates with its own settings, so set its
        ``beam_size`` before calling.
    student : Seq2Seq
        Fitted in place with ``student.fit``, so all its parameters apply, ``warm_start`` included
        (continue a fitted model on the teacher's outputs). Its ``tokenizer`` must read the
        teacher's outputs as the teacher's targets were read.
    X : sequence of str or of token lists
        Sources to label: the training sources, or any unlabelled sources of the same domain.
    y : sequence, optional
        References for ``X``. When given, the student is fitted on the teacher's pairs and the
        references' pairs together (Kim & Rush's variant that keeps the original data).

    Returns
    -------
    student : the fitted student (the same object)
    """
    if not callable(getattr(student, "fit", None)):
        raise ValueError(f"student must have a fit method, got {type(student).__name__}")
    tokenizer = getattr(student, "tokenizer", "char")
    taught_with = _tokenizer_of(teacher)
    if taught_with is not None and taught_with != tokenizer:
        raise ValueError(
            f"the student's tokenizer={tokenizer!r} would read the outputs of a teacher fitted "
            f"with tokenizer={taught_with!r} as other tokens: give the student the teacher's"
        )
    n_sources = len(as_token_lists(X, "X", tokenizer)[0])  # clear errors before the teacher runs
    if y is not None:
        references, kind = as_token_lists(y, "y", tokenizer)
        if len(references) != n_sources:
            raise ValueError(
                f"y must hold one reference per source of X, got {len(references)} for {n_sources}"
            )
    sources, outputs, taught = _labelled(teacher, X, tokenizer)
    if not sources:
        raise ValueError("the teacher gave no usable output for X (each held a reserved token)")
    if y is not None:
        if taught != kind:
            names = {"str": "strings", "tokens": "token lists"}
            raise ValueError(
                f"y must be of the kind the teacher outputs ({names[taught]}), got {names[kind]}"
            )
        sources, outputs = sources + list(X), outputs + list(y)
    return student.fit(sources, outputs)


def _tokenizer_of(teacher) -> str | None:
    """How the teacher's outputs are split, where it says and where it matters
    (:func:`skattn.scoring.output_facts`); None for other teachers, and for one whose outputs
    are token lists (never split again)."""
    tokenizer, kind = output_facts(teacher)
    return None if kind == "tokens" else tokenizer


def _key(source) -> object:
    """A hashable form of a source (a str, or a token list)."""
    return source if isinstance(source, str) else tuple(source)
