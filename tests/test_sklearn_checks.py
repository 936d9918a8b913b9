"""scikit-learn's estimator checks for ``Seq2Seq``, each decided once in ``CHECKS``.

``sklearn.utils.estimator_checks`` yields no check at all for an estimator whose tags turn off
``two_d_array`` (``check_estimator`` and ``parametrize_with_checks`` only warn), so the checks
are taken from the list it yields for the same estimator with a numeric tag, and each is:

- ``RUN``: the check function itself runs on ``Seq2Seq`` (it needs no data, or it fails before
  the data are read, as ``check_param_validation`` does: parameters are validated first);
- a test of this file that checks the same property on string input;
- ``N/A``: what it checks is about numeric 2-D arrays (dtypes, features, NaN, sparse, memory
  layout), which are not this estimator's input.

A new check in a later scikit-learn makes ``test_every_check_is_decided`` fail.
"""

from __future__ import annotations

import pickle
from inspect import signature

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.utils import estimator_checks
from sklearn.utils.validation import check_is_fitted

from skattn import Seq2Seq
from skattn.datasets import make_reversal

TINY = dict(embedding_dim=4, hidden_size=8, batch_size=8, max_epochs=1, device="cpu")
RUN = "run"
N_A = "not applicable: numeric 2-D arrays"

#: check name -> RUN, N_A (with why), or the name of the test below that checks it on strings.
CHECKS = {
    "check_estimator_cloneable": RUN,
    "check_estimator_tags_renamed": RUN,
    "check_valid_tag_types": RUN,
    "check_estimator_repr": RUN,
    "check_no_attributes_set_in_init": RUN,
    "check_estimators_unfitted": RUN,
    "check_do_not_raise_errors_in_init_or_set_params": RUN,
    "check_mixin_order": RUN,
    "check_parameters_default_constructible": RUN,
    "check_get_params_invariance": RUN,
    "check_set_params": RUN,
    "check_param_validation": RUN,
    "check_estimator_sparse_tag": RUN,  # sparse=False, and a sparse X is refused
    "check_fit1d": RUN,  # a 1-D numeric X is refused with a ValueError
    "check_requires_y_none": RUN,
    "check_fit_score_takes_y": "test_fit_and_score_take_y",
    "check_estimators_fit_returns_self": "test_fit_returns_self",
    "check_estimators_overwrite_params": "test_fit_does_not_change_parameters",
    "check_dont_overwrite_parameters": "test_fit_sets_only_public_trailing_underscore_attributes",
    "check_dict_unchanged": "test_predicting_does_not_change_the_estimator",
    "check_fit_check_is_fitted": "test_check_is_fitted_before_and_after_fit",
    "check_fit_idempotent": "test_fitting_twice_gives_the_same_model",
    "check_estimators_pickle": "test_pickle_round_trip_keeps_predictions",
    "check_pipeline_consistency": "test_a_pipeline_predicts_and_scores_as_the_estimator",
    "check_methods_sample_order_invariance": "test_predictions_follow_the_order_of_the_items",
    "check_methods_subset_invariance": "test_predictions_follow_the_order_of_the_items",
    "check_estimators_empty_data_messages": "test_empty_data_is_refused",
    "check_fit2d_1sample": "test_one_item",
    "check_estimators_nan_inf": N_A + " (a non-string item is refused: test_estimator)",
    "check_estimators_dtypes": N_A + " of float32 / int32 / int64",
    "check_complex_data": N_A + " of complex numbers",
    "check_dtype_object": N_A + " of object dtype holding numbers",
    "check_readonly_memmap_input": N_A + " in read-only memory maps",
    "check_f_contiguous_array_estimator": N_A + " in Fortran order",
    "check_array_api_input": N_A + " of the array API",
    "check_estimator_sparse_array": N_A + " that are sparse",
    "check_estimator_sparse_matrix": N_A + " that are sparse",
    "check_positive_only_tag_during_fit": N_A + " with negative values",
    "check_n_features_in": N_A + ": items are sequences, not rows of features",
    "check_n_features_in_after_fitting": N_A + ": items are sequences, not rows of features",
    "check_fit2d_1feature": N_A + ": items are sequences, not rows of features",
    "check_fit2d_predict1d": N_A + ": items are sequences, not rows of features",
}


class _NumericTags(Seq2Seq):
    """``Seq2Seq`` claiming 2-D numeric input, only to list what scikit-learn would check."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = True
        return tags


def test_every_check_is_decided():
    yielded = {
        getattr(check, "func", check).__name__
        for check in estimator_checks._yield_all_checks(_NumericTags(), legacy=True)
    }
    assert yielded <= set(CHECKS), f"undecided checks: {sorted(yielded - set(CHECKS))}"
    tests = {how for how in CHECKS.values() if how != RUN and not how.startswith(N_A)}
    assert tests <= set(globals()), f"missing tests: {sorted(tests - set(globals()))}"


@pytest.mark.parametrize("name", [name for name, how in CHECKS.items() if how == RUN])
def test_sklearn_check(name):
    getattr(estimator_checks, name)("Seq2Seq", Seq2Seq(**TINY))


# ---------------------------------------------------------------- the same checks on strings


@pytest.fixture(scope="module")
def data():
    return make_reversal(40, 2, 4, random_state=0)


@pytest.fixture(scope="module")
def fitted(data):
    return Seq2Seq(random_state=0, **TINY).fit(*data)


def test_fit_and_score_take_y():
    for method in (Seq2Seq.fit, Seq2Seq.score):
        assert list(signature(method).parameters)[1:3] == ["X", "y"]


def test_fit_returns_self(data):
    model = Seq2Seq(**TINY)
    assert model.fit(*data) is model


def test_fit_does_not_change_parameters(data):
    # (a RandomState instance is consumed, as by any scikit-learn estimator)
    model = Seq2Seq(**dict(TINY, random_state=0, hidden_size=np.int64(8), verbose=np.False_))
    before = model.get_params()
    model.fit(*data)
    after = model.get_params()
    assert all(after[name] is value for name, value in before.items())


def test_fit_sets_only_public_trailing_underscore_attributes(data):
    model = Seq2Seq(**TINY)
    before = dict(vars(model))
    model.fit(*data)
    added = set(vars(model)) - set(before)
    assert added and all(k.endswith("_") and not k.startswith("_") for k in added)
    assert {k: vars(model)[k] for k in before} == before


def test_predicting_does_not_change_the_estimator(fitted, data):
    X, y = data
    before = dict(vars(fitted))
    fitted.predict(X[:5])
    fitted.predict_attention(X[:5])
    fitted.score(X[:5], y[:5])
    assert vars(fitted) == before


def test_check_is_fitted_before_and_after_fit(data):
    model = Seq2Seq(**TINY)
    with pytest.raises(NotFittedError):
        check_is_fitted(model)
    check_is_fitted(model.fit(*data))


def test_fitting_twice_gives_the_same_model(data):
    X, y = data
    model = Seq2Seq(random_state=0, **TINY)
    first = model.fit(X, y).predict(X)
    first_history = [{k: v for k, v in h.items() if k != "seconds"} for h in model.history_]
    assert model.fit(X, y).predict(X) == first
    assert [{k: v for k, v in h.items() if k != "seconds"} for h in model.history_] == first_history


def test_pickle_round_trip_keeps_predictions(fitted, data):
    X, _ = data
    loaded = pickle.loads(pickle.dumps(fitted))
    assert loaded.predict(X) == fitted.predict(X)
    assert loaded.get_params() == fitted.get_params()
    assert loaded.module_.config == fitted.module_.config


def test_a_pipeline_predicts_and_scores_as_the_estimator(data):
    X, y = data
    model = Seq2Seq(random_state=0, **TINY)
    pipeline = make_pipeline(clone(model)).fit(X, y)
    model.fit(X, y)
    assert pipeline.predict(X) == model.predict(X)
    assert pipeline.score(X, y) == model.score(X, y)


def test_predictions_follow_the_order_of_the_items(fitted, data):
    X, _ = data
    expected = fitted.predict(X)
    order = np.random.RandomState(1).permutation(len(X))
    assert fitted.predict([X[i] for i in order]) == [expected[i] for i in order]
    assert fitted.predict(X[3:9]) == expected[3:9]


def test_empty_data_is_refused():
    for X in ([], np.array([], dtype=str)):
        with pytest.raises(ValueError, match="X must hold at least one item"):
            Seq2Seq(**TINY).fit(X, X)


def test_one_item():
    with pytest.raises(ValueError, match="early_stopping"):
        Seq2Seq(**TINY).fit(["12"], ["21"])
    model = Seq2Seq(early_stopping=False, **TINY).fit(["12"], ["21"])
    assert model.n_steps_ == 1 and len(model.predict(["12"])) == 1
