"""RightToLeft: a model trained on reversed outputs that reads them in their usual order, and
NBestReranker's rescorers (a right-to-left model among them), on small reversal models."""

import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import NotFittedError
from test_rescoring import CLEAN, reversal_nbest
from test_runtime import FIT_PARAMS, X_TRAIN, Y_TRAIN, fit, load

from skattn import Seq2Seq
from skattn.rescoring import NBestReranker
from skattn.right_to_left import RightToLeft, reverse_outputs

SOURCES = CLEAN[:40]


@pytest.fixture(scope="module")
def r2l():
    return RightToLeft(Seq2Seq(**{**FIT_PARAMS, "max_steps": 40})).fit(X_TRAIN, Y_TRAIN)


def test_outputs_reverse_token_by_token_as_the_tokenizer_splits_them():
    assert reverse_outputs(["abc", ""], "char") == ["cba", ""]
    assert reverse_outputs(["K AE  T", "AH"], "space") == ["T AE K", "AH"]
    assert reverse_outputs([["K", "AE", "T"], ("B",)], "space") == [["T", "AE", "K"], ["B"]]
    words = ["K AE T", "B IY"]
    assert reverse_outputs(reverse_outputs(words, "space"), "space") == words
    assert reverse_outputs([], "char") == []
    with pytest.raises(ValueError, match=r"^y\[1\] must be a str or a list of str tokens, got 3"):
        reverse_outputs(["ab", 3], "char")
    with pytest.raises(ValueError, match="only str items or only token lists"):
        reverse_outputs(["ab", ["b", "a"]], "char")
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        reverse_outputs(["ab"], "words")


def test_the_model_trains_on_reversed_outputs_and_reads_them_back(r2l):
    """The inner model is the one a user would fit on reversed outputs (same weights, same
    answers); the wrapper's answers, scores and maps are its own, read the usual way round."""
    alone = Seq2Seq(**{**FIT_PARAMS, "max_steps": 40}).fit(X_TRAIN, [y[::-1] for y in Y_TRAIN])
    inner = r2l.estimator_.predict(SOURCES)
    assert inner == alone.predict(SOURCES)
    assert r2l.predict(SOURCES) == [p[::-1] for p in inner]
    assert r2l.estimator is not r2l.estimator_  # a clone was fitted
    targets = [s[::-1] for s in SOURCES]
    np.testing.assert_allclose(
        r2l.log_likelihood(SOURCES, targets), alone.log_likelihood(SOURCES, SOURCES), rtol=1e-6
    )
    maps, inner_maps = r2l.predict_attention(SOURCES), r2l.estimator_.predict_attention(SOURCES)
    for m, inner_m, answer in zip(maps, inner_maps, r2l.predict(SOURCES), strict=True):
        assert m.shape == inner_m.shape == (len(answer), inner_m.shape[1])
        np.testing.assert_array_equal(m, inner_m[::-1])
    own = np.mean([p == t for p, t in zip(r2l.predict(SOURCES), targets, strict=True)])
    assert r2l.score(SOURCES, targets) == pytest.approx(own)


def test_an_exported_right_to_left_model_is_wrapped_without_training(r2l, tmp_path):
    runtime = load(r2l.estimator_.export_onnx(tmp_path / "r2l"))
    served = RightToLeft.fitted(runtime)
    assert served.predict(SOURCES) == r2l.predict(SOURCES)
    targets = [s[::-1] for s in SOURCES]
    np.testing.assert_allclose(
        served.log_likelihood(SOURCES, targets),
        r2l.log_likelihood(SOURCES, targets),
        rtol=1e-5,
        atol=1e-4,
    )
    assert served.score(SOURCES, targets) == r2l.score(SOURCES, targets)
    assert RightToLeft.fitted(r2l.estimator_).predict(SOURCES[:5]) == r2l.predict(SOURCES[:5])
    assert not hasattr(clone(served), "estimator_")


def test_bad_models_and_unfitted_use_are_refused():
    with pytest.raises(ValueError, match="model must be a fitted Seq2Seq or a serving.load"):
        RightToLeft.fitted("model")
    with pytest.raises(NotFittedError):
        RightToLeft(Seq2Seq()).predict(["ab"])
    with pytest.raises(ValueError, match="estimator must be an unfitted Seq2Seq"):
        RightToLeft(object()).fit(["ab"], ["ba"])


class Reverser(BaseEstimator):
    """A stand-in for a perfect model of reversal: its answer is right, and any other output
    scores 100 nats lower."""

    def __init__(self, tokenizer="char"):
        self.tokenizer = tokenizer
        self.output_kind_ = "str"

    def fit(self, X, y):
        return self

    def predict(self, X):
        return [x[::-1] for x in X]

    def log_likelihood(self, X, y):
        right = ["".join(out) == x[::-1] for x, out in zip(X, y, strict=True)]  # str or tokens
        return np.where(right, 0.0, -100.0)


def test_a_rescorer_that_knows_better_is_weighted_in_and_its_answer_is_a_candidate():
    weak = fit(max_steps=2)  # its answers are wrong
    # the sources whose reversal it can write (every target token in its vocabulary)
    writable = [s for s in CLEAN if np.isfinite(weak.log_likelihood([s], [s[::-1]])[0])]
    dev, test = writable[:60], writable[60:120]
    assert len(test) == 60
    assert np.mean([p == s[::-1] for p, s in zip(weak.predict(test), test, strict=True)]) < 0.5
    # the other system lists only wrong answers: the right one is the rescorer's own answer
    only_wrong = lambda sources: [[(s[::-1][1:] + "a", 0.0)] for s in sources]  # noqa: E731
    reranker = NBestReranker(weak, only_wrong, rescorers=[Reverser()], rescorer_weights=(0, 1))
    reranker.fit(dev, [s[::-1] for s in dev])
    assert reranker.rescorer_weights_ == (1.0,)
    assert reranker.fit_scores_[(reranker.weight_, reranker.length_exponent_, 1.0)] == 1.0
    assert reranker.predict(test) == [s[::-1] for s in test]
    # the same reranker without the rescorer's weight in its grid: the weak model decides
    left_out = NBestReranker(weak, only_wrong, rescorers=[Reverser()], rescorer_weights=(0,))
    assert left_out.fit(dev, [s[::-1] for s in dev]).rescorer_weights_ == (0.0,)
    assert left_out.score(test, [s[::-1] for s in test]) < 1.0


def test_a_right_to_left_rescorer_reranks_with_a_left_to_right_model(r2l):
    model = fit(max_steps=60)
    dev, test = CLEAN[30:90], CLEAN[90:150]
    references = [s[::-1] for s in dev]
    both = NBestReranker(model, reversal_nbest(0.0, 0.0), weights=(0.0,), rescorers=[r2l])
    both.fit(dev, references)
    assert set(both.fit_scores_) == {(0.0, e, v) for e in (0.0, 1.0) for v in both.rescorer_weights}
    alone = NBestReranker(model, reversal_nbest(0.0, 0.0), weights=(0.0,)).fit(dev, references)
    # the grid holds the estimator alone (v = 0): fitting with the rescorer never does worse
    assert max(both.fit_scores_.values()) >= max(alone.fit_scores_.values())
    assert len(both.predict(test)) == len(test)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rescorers": "r2l"}, "rescorers must be a sequence"),
        ({"rescorers": [object()]}, r"rescorers\[0\] must be a fitted Seq2Seq"),
        ({"rescorers": [Reverser("space")]}, r"rescorers\[0\] reads outputs as"),
        ({"rescorers": [Reverser()], "rescorer_weights": []}, "rescorer_weights"),
        ({"rescorers": [Reverser()], "rescorer_weights": [-1]}, "rescorer_weights"),
        ({"rescorers": [Reverser()], "rescorer_weights": [float("inf")]}, "rescorer_weights"),
    ],
)
def test_bad_rescorers_are_refused(kwargs, match):
    model = fit(max_steps=2)
    with pytest.raises(ValueError, match=match):
        NBestReranker(model, reversal_nbest(0, 0), **kwargs).fit(["abc", "ab"], ["cba", "ba"])


def test_a_reranker_given_other_rescorers_after_fit_asks_for_a_new_fit():
    reranker = NBestReranker(fit(max_steps=2), reversal_nbest(0, 0)).fit(["ab"], ["ba"])
    reranker.set_params(rescorers=[Reverser()])
    with pytest.raises(ValueError, match="fitted with 0 rescorers and has 1 now"):
        reranker.predict(["ab"])
