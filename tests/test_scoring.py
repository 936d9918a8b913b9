import functools
import pickle
import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import BaseEstimator

from skattn.metrics import (
    character_error_rate,
    corpus_bleu,
    exact_match,
    phoneme_error_rate,
    token_accuracy,
    token_error_rate,
    word_error_rate,
)
from skattn.scoring import (
    SCORERS,
    bleu_scorer,
    exact_match_scorer,
    make_sequence_scorer,
    token_error_rate_scorer,
)


class _LookupEstimator:
    """Predicts from a fixed table: enough to exercise a scorer."""

    def __init__(self, table):
        self.table = table

    def predict(self, X):
        return [self.table[x] for x in X]


def test_scorers_sign_convention():
    est = _LookupEstimator({"ab": "ba", "cd": "dx"})
    X, y = ["ab", "cd"], ["ba", "dc"]
    assert exact_match_scorer(est, X, y) == 0.5
    assert token_error_rate_scorer(est, X, y) == -0.25
    per = make_sequence_scorer(token_error_rate, greater_is_better=False, tokenizer="space")
    assert per(_LookupEstimator({"x": "K AO"}), ["x"], ["K AH"]) == -0.5
    assert "greater_is_better=False" in repr(per)
    assert pickle.loads(pickle.dumps(token_error_rate_scorer))(est, X, y) == -0.25


class _TokenizedEstimator(_LookupEstimator):
    """A lookup table with a ``tokenizer`` and ``score``, as a fitted Seq2Seq has."""

    def __init__(self, table, tokenizer):
        super().__init__(table)
        self.tokenizer = tokenizer

    def score(self, X, y):
        return exact_match(y, self.predict(X), tokenizer=self.tokenizer)


# G2P-like data: multi-character phonemes, and a reference hand-written with a double space
_G2P_X = ["cause", "am", "ant"]
_G2P_Y = ["K AH Z", "AH  M", "AE N T"]
_G2P_TABLE = {"cause": "K AO Z", "am": "AH M", "ant": "AE N T"}


@pytest.mark.parametrize(
    ("name", "tokenizer", "metric"),
    [
        ("exact_match", "space", exact_match),
        ("token_accuracy", "space", token_accuracy),
        ("neg_token_error_rate", "space", token_error_rate),  # PER, not CER over "K AH Z"
        ("neg_word_error_rate", "char", word_error_rate),  # its own default is "space"
    ],
)
def test_scorers_use_the_estimator_tokenizer(name, tokenizer, metric):
    est = _TokenizedEstimator(_G2P_TABLE, tokenizer)
    y_pred = est.predict(_G2P_X)
    sign = -1.0 if name.startswith("neg_") else 1.0
    expected = sign * metric(_G2P_Y, y_pred, tokenizer=tokenizer)
    other = {"char": "space", "space": "char"}[tokenizer]
    assert expected != sign * metric(_G2P_Y, y_pred, tokenizer=other)  # the data tells apart
    assert SCORERS[name](est, _G2P_X, _G2P_Y) == pytest.approx(expected)


def test_scorer_tokenizer_given_by_the_caller_wins():
    est = _TokenizedEstimator(_G2P_TABLE, "space")
    X, y = _G2P_X, _G2P_Y
    assert SCORERS["exact_match"](est, X, y) == est.score(X, y) == pytest.approx(2 / 3)
    cer = -token_error_rate(y, est.predict(X), tokenizer="char")  # 2 / 17
    explicit = make_sequence_scorer(token_error_rate, greater_is_better=False, tokenizer="char")
    assert explicit(est, X, y) == pytest.approx(cer)
    fixed = functools.partial(token_error_rate, tokenizer="char")
    assert make_sequence_scorer(fixed, greater_is_better=False)(est, X, y) == pytest.approx(cer)
    # metrics without a tokenizer parameter are called as they are
    assert make_sequence_scorer(character_error_rate)(est, X, y) == pytest.approx(-cer)
    assert SCORERS["bleu"](est, X, y) == pytest.approx(corpus_bleu(y, est.predict(X)))
    # an estimator without a str tokenizer leaves the metric's default ("char")
    est.tokenizer = None
    assert SCORERS["exact_match"](est, X, y) == pytest.approx(1 / 3)


def test_scorers_follow_a_space_tokenized_seq2seq():
    from skattn import Seq2Seq

    X = [list(word) for word in ["cat", "dog", "cause", "am", "sit", "ant"]]
    y = ["K AE T", "D AO G", "K AA Z", "AE M", "S IH T", "AE N T"]
    model = Seq2Seq(
        tokenizer="space",
        hidden_size=8,
        embedding_dim=4,
        max_steps=2,
        early_stopping=False,
        device="cpu",
        random_state=0,
    ).fit(X, y)
    y_pred = model.predict(X)
    per = phoneme_error_rate(y, y_pred)
    assert SCORERS["neg_token_error_rate"](model, X, y) == pytest.approx(-per)
    assert SCORERS["exact_match"](model, X, y) == model.score(X, y)
    # the predictions respelled with double spaces: the same phonemes, other characters
    respelled = [p.replace(" ", "  ") for p in y_pred]
    assert SCORERS["exact_match"](model, X, respelled) == model.score(X, respelled) == 1.0


def test_make_sequence_scorer_validates():
    with pytest.raises(ValueError, match="metric"):
        make_sequence_scorer("exact_match")


def test_scorer_inside_grid_search():
    from sklearn.base import BaseEstimator
    from sklearn.model_selection import GridSearchCV

    class Shift(BaseEstimator):
        """Reverses the string when reverse=True, else echoes it."""

        def __init__(self, reverse=False):
            self.reverse = reverse

        def fit(self, X, y):
            return self

        def predict(self, X):
            return [x[::-1] if self.reverse else x for x in X]

    X = ["abc", "12", "xyz", "hello", "ab", "qrs"]
    y = [x[::-1] for x in X]
    search = GridSearchCV(
        Shift(),
        {"reverse": [False, True]},
        scoring={"em": exact_match_scorer, "ter": token_error_rate_scorer},
        refit="em",
        cv=3,
    )
    search.fit(X, y)
    assert search.best_params_ == {"reverse": True}
    np.testing.assert_allclose(search.cv_results_["mean_test_em"], [0.0, 1.0])
    assert search.cv_results_["mean_test_ter"][1] == 0.0
    assert search.cv_results_["mean_test_ter"][0] < 0


def test_scorers_of_partials_print():
    partial = functools.partial(token_error_rate, tokenizer="space")
    scorer = make_sequence_scorer(partial, greater_is_better=False)
    assert repr(scorer).startswith("SequenceScorer(functools.partial(")


def test_bleu_scorer_reads_a_character_model_on_characters():
    """bleu_scorer passes a character model's tokenizer: its outputs as text are one-word
    sentences without 2-grams, which scored a perfect model 0."""
    digits = ["1234", "5678", "9012"]
    char_model = _TokenizedEstimator({d: d for d in digits}, "char")
    assert bleu_scorer(char_model, digits, digits) == pytest.approx(100.0)


@pytest.mark.parametrize("y", ["abc", {"a", "b", "c"}])
def test_scorers_check_y_as_given(y):
    est = _TokenizedEstimator({"a": "a", "b": "b", "c": "c"}, "char")
    with pytest.raises(ValueError, match="y_true must be a sequence"):
        exact_match_scorer(est, ["a", "b", "c"], y)


def test_docstring_examples():
    import doctest

    import skattn.scoring

    result = doctest.testmod(skattn.scoring)
    assert result.attempted > 0 and result.failed == 0


def test_scoring_import_is_cheap():
    code = "import sys, skattn.scoring; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


class _FittedLookup(BaseEstimator):
    """A lookup model in scikit-learn's form, predicting with the tokenizer it was fitted with
    (``tokenizer_``), as a Seq2Seq does."""

    def __init__(self, table=None, tokenizer="char"):
        self.table = table
        self.tokenizer = tokenizer

    def fit(self, X, y):
        self.tokenizer_ = self.tokenizer
        return self

    def predict(self, X):
        return [self.table[x] for x in X]


def test_scorers_read_the_tokenizer_of_the_model_inside_a_wrapper():
    """A Pipeline or a search has no tokenizer: the scorers fell back to the metric's default,
    so a phoneme model wrapped in one was scored on characters (CER for PER) in silence."""
    from sklearn.frozen import FrozenEstimator
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    X, y = _G2P_X, _G2P_Y
    model = _FittedLookup(_G2P_TABLE, "space").fit(X, y)
    per = -token_error_rate(y, model.predict(X), tokenizer="space")
    assert per != -token_error_rate(y, model.predict(X), tokenizer="char")
    search = GridSearchCV(
        _FittedLookup(_G2P_TABLE, "space"),
        {"tokenizer": ["space"]},
        scoring=SCORERS["neg_token_error_rate"],
        cv=[([0, 1], [2])],
    ).fit(X, y)
    wrapped = {
        "plain": model,
        "pipeline": Pipeline([("model", model)]),
        "pipeline of list steps": Pipeline([["model", model]]),
        "nested pipeline": Pipeline([("inner", Pipeline([("model", model)]))]),
        "search": search,
        "frozen": FrozenEstimator(model),
    }
    for name, estimator in wrapped.items():
        assert SCORERS["neg_token_error_rate"](estimator, X, y) == pytest.approx(per), name
    # the fitted tokenizer, not a parameter changed since
    model.set_params(tokenizer="char")
    assert SCORERS["neg_token_error_rate"](model, X, y) == pytest.approx(per)


def test_scorers_refuse_string_outputs_for_a_model_fitted_on_token_lists():
    model = _FittedLookup({"ab": ["AA", "BB"]}, "char").fit(["ab"], [["AA", "BB"]])
    model.output_kind_ = "tokens"
    assert SCORERS["exact_match"](model, ["ab"], [["AA", "BB"]]) == 1.0
    with pytest.raises(ValueError, match="y holds strings, but the model was fitted on token"):
        SCORERS["exact_match"](model, ["ab"], ["AA BB"])


def test_scorers_take_several_references_for_a_model_fitted_on_token_lists():
    """The metrics' "any of the pronunciations" form (a list of token lists an item, as
    group_pronunciations gives) was refused for a token-list model, and taken for a str one."""
    model = _FittedLookup({"ab": ["AA", "BB"], "cd": ["CC"]}, "char").fit(["ab"], [["AA"]])
    model.output_kind_ = "tokens"
    X, y = ["ab", "cd"], [[["AA", "BX"], ["AA", "BB"]], [["CC", "DD"]]]
    assert SCORERS["exact_match"](model, X, y) == exact_match(y, model.predict(X)) == 0.5
    assert SCORERS["neg_token_error_rate"](model, X, y) == -token_error_rate(y, model.predict(X))
    with pytest.raises(ValueError, match="y holds strings, but the model was fitted on token"):
        SCORERS["exact_match"](model, X, [[["AA", "BB"]], "CC"])
