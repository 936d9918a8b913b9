"""Tests for skattn.Seq2Seq: learning, the scikit-learn protocol, decoding and persistence."""

import copy
import json
import math
import pickle

import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from skattn import Seq2Seq, training
from skattn import estimator as estimator_module
from skattn.datasets import make_reversal

TINY = dict(embedding_dim=8, hidden_size=16, batch_size=8, device="cpu", random_state=0)


def lower_all(X):
    return [x.lower() for x in X]


def validation_items(model: Seq2Seq, X) -> np.ndarray:
    """The indices ``fit`` held out of ``X`` (char tokens): the split of its kept seed."""
    seed = np.random.RandomState(model.validation_seed_)
    return training.split([list(x) for x in X], model.validation_fraction, seed)[1]


def trainer_of(model: Seq2Seq, X, y) -> training.Trainer:
    """A trainer over a fitted model's module and the encoded items ``X``, ``y`` (char tokens)."""
    src = [model.source_vocab_.encode(list(x)) + [2] for x in X]
    tgt = [model.target_vocab_.encode(list(t)) for t in y]
    return training.Trainer.from_params(
        model.module_,
        src,
        tgt,
        model.get_params(),
        n_train=len(X),
        validation=True,
        decode=model._greedy_tokens,
    )


# ---------------------------------------------------------------- learning


def test_reversal_reaches_high_exact_match(fitted_reversal, reversal_data):
    _, _, X_test, y_test = reversal_data
    assert fitted_reversal.score(X_test, y_test) >= 0.9
    predictions = fitted_reversal.predict(X_test[:20])
    assert all(isinstance(p, str) for p in predictions)
    assert sum(p == t for p, t in zip(predictions, y_test[:20], strict=True)) >= 18


def test_history_records_every_epoch(fitted_reversal):
    history = fitted_reversal.history_
    assert len(history) == fitted_reversal.n_iter_ >= 1
    assert [h["epoch"] for h in history] == list(range(1, len(history) + 1))
    for record in history:
        assert set(record) == {
            "epoch",
            "steps",
            "lr",
            "train_loss",
            "val_loss",
            "val_exact_match",
            "seconds",
        }
        assert record["train_loss"] > 0 and record["val_loss"] > 0 and record["seconds"] > 0
        assert 0 <= record["val_exact_match"] <= 1
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["steps"] == fitted_reversal.n_steps_
    # The kept weights are those of the best validation loss.
    best = min(history, key=lambda h: h["val_loss"])
    assert fitted_reversal.best_epoch_ == best["epoch"]


def test_fitted_attributes(fitted_reversal, reversal_data):
    X_train, y_train, _, _ = reversal_data
    model = fitted_reversal
    assert set(model.source_vocab_.tokens) == set("0123456789")
    assert set(model.target_vocab_.tokens) == set("0123456789")
    assert model.output_kind_ == "str"
    assert model.max_source_length_ == max(map(len, X_train))
    assert model.max_output_length_ == 2 * max(map(len, y_train)) + 10
    assert model.device_ == torch.device("cpu")
    assert not model.module_.training


def test_predict_attention_rows_sum_to_one(fitted_reversal):
    X = ["12345", "907", "", "5555"]
    maps = fitted_reversal.predict_attention(X)
    predictions = fitted_reversal.predict(X)
    assert len(maps) == len(X)
    for source, prediction, weights in zip(X, predictions, maps, strict=True):
        assert weights.shape == (len(prediction), len(source) + 1)
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
        assert (weights >= 0).all()
    # Reversal learns the anti-diagonal alignment: output i reads around source n - 1 - i.
    n = len(X[0])
    for i, row in enumerate(maps[0]):
        mirror = n - 1 - i
        assert row[max(mirror - 1, 0) : mirror + 2].sum() > 0.5


def test_predictions_do_not_depend_on_the_batch(fitted_reversal, reversal_data):
    _, _, X_test, _ = reversal_data
    X = X_test[:12] + ["1", "98765432"]
    for beam_size in (1, 3):
        model = copy.deepcopy(fitted_reversal).set_params(beam_size=beam_size)
        together = model.predict(X)
        assert [model.predict([x])[0] for x in X] == together
        assert model.predict(X[::-1])[::-1] == together
        alone = model.predict_attention([X[3]])[0]
        np.testing.assert_allclose(model.predict_attention(X)[3], alone, atol=1e-6)


def test_beam_search_reads_one_copy_of_an_items_memory(fitted_reversal, reversal_data):
    """The torch backend's steps read one memory row per item for the item's beams (a copy of
    the model whose decoder says otherwise reads one per beam): the same answers and maps."""
    _, _, X_test, _ = reversal_data
    model = copy.deepcopy(fitted_reversal).set_params(beam_size=3)
    per_row = copy.deepcopy(model)
    per_row.module_.decoder.item_memory = False
    memory_rows = []
    step = estimator_module.TorchBackend.step

    def recording(self, y_prev, carry, position, temperature):
        out = step(self, y_prev, carry, position, temperature)
        memory_rows.append((len(y_prev), len(out[1].memory)))
        return out

    estimator_module.TorchBackend.step = recording
    try:
        predictions = model.predict(X_test[:40])
        read = list(memory_rows)
        assert per_row.predict(X_test[:40]) == predictions
    finally:
        estimator_module.TorchBackend.step = step
    assert any(rows == 3 * held for rows, held in read)  # an item's 3 beams, one memory row
    assert all(rows == held for rows, held in memory_rows[len(read) :])
    for ours, theirs in zip(
        model.predict_attention(X_test[:10]), per_row.predict_attention(X_test[:10]), strict=True
    ):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_beam_search_keeps_a_high_exact_match(fitted_reversal, reversal_data):
    _, _, X_test, y_test = reversal_data
    model = copy.deepcopy(fitted_reversal).set_params(beam_size=4)
    assert model.score(X_test, y_test) >= 0.9


def test_array_like_inputs(fitted_reversal, reversal_data):
    _, _, X_test, _ = reversal_data
    expected = fitted_reversal.predict(X_test[:8])
    assert fitted_reversal.predict(np.array(X_test[:8])) == expected
    assert fitted_reversal.predict(tuple(X_test[:8])) == expected
    assert fitted_reversal.predict([list(x) for x in X_test[:8]]) == expected  # token lists


def test_unknown_tokens_and_long_inputs(fitted_reversal):
    model = fitted_reversal
    long_input = "1234567890123"  # longer than any training source
    unknown = "12x4"  # "x" was never seen
    predictions = model.predict([long_input, unknown])
    assert all(isinstance(p, str) for p in predictions)
    assert all(len(p) <= model.max_output_length_ for p in predictions)
    assert model.predict_attention([long_input])[0].shape[1] == len(long_input) + 1
    assert model.source_vocab_.encode(["x"]) == [3]


def test_max_output_length_set_after_fit_takes_effect(fitted_reversal):
    model = copy.deepcopy(fitted_reversal).set_params(max_output_length=2)
    predictions = model.predict(["123456", "98765"])
    assert [len(p) for p in predictions] == [2, 2]
    assert [len(w) for w in model.predict_attention(["123456"])] == [2]
    assert fitted_reversal.predict(["123456"]) != predictions[:1]


def test_temperature_flattens_attention(fitted_reversal):
    X = ["123456", "98765", "4321"]
    sharp = copy.deepcopy(fitted_reversal).set_params(temperature=0.5).predict_attention(X)
    flat = copy.deepcopy(fitted_reversal).set_params(temperature=20.0).predict_attention(X)
    for weights in sharp + flat:
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
    peak = np.mean([w.max(axis=1).mean() for w in sharp])
    assert peak > np.mean([w.max(axis=1).mean() for w in flat]) + 0.2


def test_token_list_targets_give_token_list_predictions():
    X = ["a b c", "b c", "c a", "a a b"] * 6
    y = [x.upper().split() for x in X]
    model = Seq2Seq(tokenizer="space", max_steps=3, early_stopping=False, **TINY).fit(X, y)
    assert model.output_kind_ == "tokens"
    predictions = model.predict(["a b"]) + model.predict([["c", "b"]])
    assert all(isinstance(p, list) and all(isinstance(t, str) for t in p) for p in predictions)
    assert model.target_vocab_.tokens == ["A", "B", "C"]
    hits = [p == t for p, t in zip(model.predict(X), y, strict=True)]
    assert model.score(X, y) == pytest.approx(np.mean(hits))


def test_space_tokenizer_joins_predictions_with_spaces():
    X = ["a b", "b c", "c a"] * 10
    y = ["x y", "y z", "z x"] * 10
    model = Seq2Seq(tokenizer="space", max_steps=2, early_stopping=False, **TINY).fit(X, y)
    for prediction in model.predict(["a b", "c a"]):
        assert isinstance(prediction, str)
        assert set(prediction.split()) <= {"x", "y", "z"}
        assert "  " not in prediction


@pytest.mark.parametrize(
    "params",
    [
        dict(decoder="luong", scorer="dot", input_feeding=True),
        dict(decoder="luong", scorer="general", input_feeding=False, cell="lstm"),
        dict(decoder="luong", scorer="scaled_dot", attention="local-p", window=2),
        dict(decoder="bahdanau", scorer="additive", attention="local-m", window=1, num_layers=2),
        dict(decoder="bahdanau", attention="none", dropout=0.2),
    ],
)
def test_model_variants_fit_and_decode(params):
    X, y = make_reversal(40, 3, 6, random_state=3)
    model = Seq2Seq(max_steps=3, **params, **TINY).fit(X, y)
    assert model.n_steps_ == 3
    for beam_size in (1, 2):
        model.set_params(beam_size=beam_size)
        maps = model.predict_attention(X[:4])
        predictions = model.predict(X[:4])
        for source, prediction, weights in zip(X[:4], predictions, maps, strict=True):
            assert weights.shape == (len(prediction), len(source) + 1)
            np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)


# ---------------------------------------------------------------- training controls


def test_random_state_gives_identical_results():
    X, y = make_reversal(60, 3, 6, random_state=4)
    params = dict(max_epochs=2, dropout=0.1, **TINY)
    torch.manual_seed(123)
    expected_global = torch.rand(3)
    torch.manual_seed(123)
    first = Seq2Seq(**params).fit(X, y)
    assert torch.equal(torch.rand(3), expected_global), "fit must not consume the global RNG"
    second = Seq2Seq(**params).fit(X, y)
    assert [h["train_loss"] for h in first.history_] == [h["train_loss"] for h in second.history_]
    for a, b in zip(first.module_.parameters(), second.module_.parameters(), strict=True):
        assert torch.equal(a, b)
    other = Seq2Seq(**{**params, "random_state": 1}).fit(X, y)
    assert other.history_[0]["train_loss"] != first.history_[0]["train_loss"]


def test_max_steps_stops_mid_epoch():
    X, y = make_reversal(80, 3, 6, random_state=5)
    model = Seq2Seq(max_steps=13, max_epochs=50, early_stopping=False, **TINY).fit(X, y)
    assert model.n_steps_ == 13
    assert model.n_iter_ == 2  # 10 batches per epoch
    assert [h["steps"] for h in model.history_] == [10, 13]
    assert "val_loss" not in model.history_[0]


def test_early_stopping_stops_after_n_iter_no_change():
    X, y = make_reversal(60, 3, 6, random_state=6)
    # With a tolerance no epoch can beat, training stops n_iter_no_change epochs after the first.
    # A large unclipped learning rate makes the validation loss rise again in the last epoch.
    params = dict(n_iter_no_change=2, tol=100.0, learning_rate=0.05, max_grad_norm=None)
    model = Seq2Seq(max_epochs=20, **params, **TINY).fit(X, y)
    assert model.n_iter_ == 3
    best = min(model.history_, key=lambda h: h["val_loss"])
    assert model.best_epoch_ == best["epoch"] < model.n_iter_
    # The kept weights are the best epoch's: they reproduce its validation loss.
    val_idx = validation_items(model, X)
    val_loss = trainer_of(model, X, y).evaluate(val_idx)["val_loss"]
    assert val_loss == pytest.approx(best["val_loss"], rel=1e-6)
    assert val_loss != pytest.approx(model.history_[-1]["val_loss"], rel=1e-3)


def test_cosine_schedule_decays_to_zero_over_max_steps():
    X, y = make_reversal(80, 3, 6, random_state=5)  # 72 training items: 9 batches of 8
    lr = 0.01
    model = Seq2Seq(max_steps=27, learning_rate=lr, lr_schedule="cosine", **TINY).fit(X, y)
    # history_ records the learning rate each epoch starts with: t = 0, 9, 18 of T = 27.
    expected = [lr * (1 + math.cos(math.pi * t / 27)) / 2 for t in (0, 9, 18)]
    assert [h["lr"] for h in model.history_] == pytest.approx(expected, rel=1e-12)
    constant = Seq2Seq(max_steps=27, learning_rate=lr, lr_schedule="constant", **TINY).fit(X, y)
    assert [h["lr"] for h in constant.history_] == [lr] * 3


def test_a_tiny_max_time_trains_one_step():
    X, y = make_reversal(40, 3, 6, random_state=5)
    # (lr_schedule="constant": a cosine over a spent time budget would take that step at lr 0)
    params = dict(max_epochs=50, lr_schedule="constant", **TINY)
    model = Seq2Seq(max_time=1e-9, **params).fit(X, y)
    assert model.n_steps_ == 1 and model.n_iter_ == 1 and model.best_epoch_ == 1
    # the same one step as max_steps=1 takes: the same weights and predictions
    one_step = Seq2Seq(max_steps=1, **params).fit(X, y)
    for a, b in zip(model.module_.parameters(), one_step.module_.parameters(), strict=True):
        assert torch.equal(a, b)
    assert model.predict(X[:5]) == one_step.predict(X[:5])


def test_plateau_schedule_halves_the_rate_after_an_epoch_without_progress():
    X, y = make_reversal(60, 3, 6, random_state=6)
    # No epoch can improve by tol=100: every epoch after the first counts as a plateau.
    params = dict(n_iter_no_change=3, tol=100.0, learning_rate=0.01, lr_schedule="plateau")
    model = Seq2Seq(max_epochs=20, **params, **TINY).fit(X, y)
    assert [h["lr"] for h in model.history_] == pytest.approx([0.01, 0.01, 0.005, 0.0025])


def test_weight_decay_reaches_the_optimizer_and_shrinks_the_fitted_weights():
    X, y = make_reversal(60, 3, 6, random_state=7)
    models = {w: Seq2Seq(max_epochs=2, weight_decay=w, learning_rate=1e-2, **TINY) for w in (0, 5)}
    norms = {}
    for w, model in models.items():
        matrices = [p.detach() for p in model.fit(X, y).module_.parameters() if p.dim() >= 2]
        norms[w] = sum(float(p.square().sum()) for p in matrices)
    assert norms[5] < 0.8 * norms[0]
    groups = trainer_of(models[5], X, y).optimizer.param_groups  # matrices decay, biases not
    assert [g["weight_decay"] for g in groups] == [5, 0.0]


def test_label_smoothing_trains_on_the_smoothed_loss_and_validates_on_the_plain_one():
    X, y = make_reversal(60, 3, 6, random_state=7)
    e = 0.2
    model = Seq2Seq(max_epochs=2, label_smoothing=e, **TINY).fit(X, y)
    src = [model.source_vocab_.encode(list(x)) + [2] for x in X]
    tgt = [model.target_vocab_.encode(list(t)) for t in y]
    batch = np.arange(8)
    trainer = trainer_of(model, X, y)
    with torch.no_grad():
        smoothed, n_tokens = trainer.batch_loss(batch, e)
        plain, _ = trainer.batch_loss(batch)
        # By hand: -(1 - e) log p(y_i) - e/V sum_v log p(v), summed over the non-pad tokens.
        cpu = torch.device("cpu")
        source, source_lengths = training.to_tensors([src[i] for i in batch], cpu)
        target, _ = training.to_tensors([[1, *tgt[i], 2] for i in batch], cpu)
        logits, _ = model.module_(source, source_lengths, target[:, :-1])
        log_p = torch.log_softmax(logits, dim=-1)  # (B, T_y, V)
        gold = target[:, 1:]
        mask = gold != 0
        nll = -log_p.gather(-1, gold.unsqueeze(-1)).squeeze(-1)[mask].sum()
        uniform = -log_p.mean(-1)[mask].sum()
    assert n_tokens == int(mask.sum())
    assert float(plain) == pytest.approx(float(nll), rel=1e-5)
    assert float(smoothed) == pytest.approx(float((1 - e) * nll + e * uniform), rel=1e-5)
    assert float(smoothed) > float(plain)
    # history_'s val_loss is the plain cross-entropy of the validation items.
    val_idx = validation_items(model, X)
    val_loss = trainer.evaluate(val_idx)["val_loss"]
    with torch.no_grad():
        plain_val, n_val = trainer.batch_loss(val_idx)
    assert val_loss == pytest.approx(float(plain_val) / n_val, rel=1e-5)


def test_early_stopping_on_exact_match_keeps_the_most_exact_epoch():
    X, y = make_reversal(200, 2, 4, random_state=9)
    params = dict(early_stopping_metric="exact_match", max_epochs=8, learning_rate=0.01)
    model = Seq2Seq(**params, **TINY).fit(X, y)
    scores = [h["val_exact_match"] for h in model.history_]
    assert max(scores) > min(scores)  # it learned something, so the choice matters
    # the most exact epoch, ties broken by the lower validation loss
    best = max(model.history_, key=lambda h: (h["val_exact_match"], -h["val_loss"]))
    assert model.best_epoch_ == best["epoch"]
    val_idx = validation_items(model, X)
    assert trainer_of(model, X, y).evaluate(val_idx)["val_exact_match"] == max(scores)


def test_exact_match_ties_are_broken_by_the_validation_loss():
    # Too early for any output to be exactly right: the exact match stays 0 every epoch, but
    # the loss falls. Training must go on (not stop after n_iter_no_change epochs of "no
    # progress") and keep the epoch with the lowest loss, not the first.
    X, y = make_reversal(60, 6, 8, random_state=12)
    params = dict(early_stopping_metric="exact_match", n_iter_no_change=2, learning_rate=1e-3)
    model = Seq2Seq(max_epochs=5, **params, **TINY).fit(X, y)
    assert {h["val_exact_match"] for h in model.history_} == {0.0}
    assert model.n_iter_ == 5
    losses = [h["val_loss"] for h in model.history_]
    assert model.best_epoch_ == 1 + losses.index(min(losses)) > 1


def test_reserved_tokens_in_targets_are_refused_and_unknown_in_sources():
    X = ["a b", "b c", "c a"] * 4
    model = Seq2Seq(tokenizer="space", max_steps=1, **TINY)
    with pytest.raises(ValueError, match="y holds the token '</s>'"):
        model.fit(X, ["b </s> a"] * 12)
    model.fit([*X, "a <pad> b"], [*X, "b a"])  # a source token spelled like <pad> is unknown
    assert model.source_vocab_.encode(["<pad>", "</s>", "a"])[:2] == [3, 3]


@pytest.mark.parametrize("token", ["x y", "", "x\ty", "\u00a0"])
def test_an_output_token_that_a_served_answer_could_not_tell_apart_is_refused(token):
    model = Seq2Seq(max_steps=1, **TINY)
    with pytest.raises(ValueError, match=r"y\[1\] holds the token .* no whitespace"):
        model.fit(["ab", "ba"], [["x"], [token, "z"]])  # served as "x y z": three tokens
    model.fit(["a b", "b a"], ["x y", "y x"])  # strings: the tokenizer's own tokens, fine


def test_text_that_has_no_utf8_form_is_refused_by_name():
    model = Seq2Seq(max_steps=1, **TINY)
    with pytest.raises(ValueError, match=r"X\[1\] holds '\\ud800', which is not valid"):
        model.fit(["ab", "a\ud800"], ["ba", "ba"])
    with pytest.raises(ValueError, match=r"y\[0\] holds"):
        model.fit(["ab"], [["\udcff"]])


def test_export_checks_prediction_settings_changed_after_fit(tmp_path):
    X, y = make_reversal(30, 3, 6, random_state=10)
    model = Seq2Seq(max_steps=2, **TINY).fit(X, y)
    for name, value in [("beam_size", 0), ("length_penalty", -2.0), ("max_output_length", 0)]:
        with pytest.raises(ValueError, match=name):
            model.set_params(**{name: value}).export_onnx(tmp_path / name)
        assert not (tmp_path / name).exists()
        model.set_params(**{name: Seq2Seq().get_params()[name]})


def test_verbose_shows_a_progress_bar(capsys):
    X, y = make_reversal(30, 3, 6, random_state=7)
    Seq2Seq(max_epochs=2, verbose=True, **TINY).fit(X, y)
    assert "Seq2Seq" in capsys.readouterr().err


# ---------------------------------------------------------------- scikit-learn protocol


def test_tags_declare_string_input():
    tags = Seq2Seq().__sklearn_tags__()
    assert tags.input_tags.string and not tags.input_tags.two_d_array
    assert tags.input_tags.one_d_array
    assert tags.target_tags.required


def test_not_fitted_error_before_fit():
    model = Seq2Seq()
    for method in (model.predict, model.predict_attention):
        with pytest.raises(NotFittedError):
            method(["123"])
    with pytest.raises(NotFittedError):
        model.score(["123"], ["321"])
    with pytest.raises(NotFittedError):
        model.export_onnx("unused")


def test_clone_keeps_params_and_drops_fitted_state(fitted_reversal):
    cloned = clone(fitted_reversal)
    assert cloned.get_params() == fitted_reversal.get_params()
    assert not hasattr(cloned, "module_")


@pytest.mark.slow  # starts two worker processes that import torch
def test_grid_search_over_scorers():
    X, y = make_reversal(48, 3, 6, random_state=9)
    search = GridSearchCV(
        Seq2Seq(max_steps=4, **TINY),
        {"scorer": ["dot", "general", "additive"]},
        cv=2,
        n_jobs=2,
    )
    search.fit(X, y)
    assert set(search.cv_results_["param_scorer"]) == {"dot", "general", "additive"}
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    assert search.best_estimator_.scorer in {"dot", "general", "additive"}
    assert len(search.predict(X[:3])) == 3


def test_numpy_scalar_hyperparameters_fit_predict_and_export(tmp_path):
    # A grid built with np.arange hands out np.int64: torch.nn wants int sizes, and the
    # artifact's manifest is JSON.
    X, y = make_reversal(24, 3, 5, random_state=4)
    params = dict(
        hidden_size=np.int64(16),
        embedding_dim=np.int32(8),
        num_layers=np.int64(2),
        attention="local-p",
        window=np.int64(2),
        beam_size=np.int64(2),
        temperature=np.float64(0.5),
        batch_size=np.int64(8),
    )
    model = Seq2Seq(max_steps=2, early_stopping=False, device="cpu", random_state=0, **params)
    model.fit(X, y)
    config = model.module_.config.to_dict()
    assert all(type(v) in (int, float, str, bool) for v in config.values() if v is not None)
    predictions = model.predict(X[:3])
    model.export_onnx(tmp_path / "artifact")
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["beam_size"] == 2
    import serving

    assert serving.load(tmp_path / "artifact").predict(X[:3]) == predictions


def test_pipeline_with_a_lowercasing_step(fitted_reversal, reversal_data):
    X_train, y_train, _, _ = reversal_data
    pipeline = make_pipeline(FunctionTransformer(lower_all), Seq2Seq(max_steps=2, **TINY))
    X = ["AbC", "bCa", "CAB", "aBc"] * 5
    pipeline.fit(X, [x.lower()[::-1] for x in X])
    model = pipeline[-1]
    assert set(model.source_vocab_.tokens) == {"a", "b", "c"}
    assert pipeline.predict(["ABC", "cAb"]) == model.predict(["abc", "cab"])
    # A fitted model inside a pipeline predicts as it does alone.
    fitted = make_pipeline(FunctionTransformer(lower_all), fitted_reversal)
    assert fitted.predict(X_train[:5]) == fitted_reversal.predict(X_train[:5])


# ---------------------------------------------------------------- persistence


def test_joblib_round_trip_keeps_predictions(fitted_reversal, reversal_data, tmp_path):
    _, _, X_test, _ = reversal_data
    path = tmp_path / "model.joblib"
    joblib.dump(fitted_reversal, path)
    loaded = joblib.load(path)
    assert loaded.predict(X_test[:30]) == fitted_reversal.predict(X_test[:30])
    for a, b in zip(
        loaded.predict_attention(X_test[:5]),
        fitted_reversal.predict_attention(X_test[:5]),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    assert loaded.history_ == fitted_reversal.history_
    assert loaded.get_params() == fitted_reversal.get_params()


def test_loading_or_copying_a_model_leaves_torchs_random_state_alone(fitted_reversal):
    """Unpickling built the module with fresh random weights before loading the fitted ones,
    drawing from the user's seeded generator (fit already forks it)."""
    import copy
    import pickle

    blob = pickle.dumps(fitted_reversal)
    for load in (lambda: pickle.loads(blob), lambda: copy.deepcopy(fitted_reversal)):
        torch.manual_seed(0)
        expected = torch.rand(4)
        torch.manual_seed(0)
        model = load()
        assert torch.equal(torch.rand(4), expected)
        assert model.predict(["123"]) == fitted_reversal.predict(["123"])


def test_a_model_pickled_before_the_redesign_still_loads(fitted_reversal, monkeypatch):
    from skattn.core.text import Vocabulary

    # skattn 0.1 pickled its vocabularies as skattn.text.Vocabulary
    monkeypatch.setattr(Vocabulary, "__module__", "skattn.text")
    state = fitted_reversal.__getstate__()
    module = state.pop("_module")  # the old layout: two keys
    state["_module_config"], state["_module_state"] = module["config"], module["weights"]
    for added in ("encoder", "num_kv_heads", "ffn_size", "positions", "n_threads", "precision"):
        del state[added]  # parameters 0.1 did not have
    for added in ("encoder", "num_kv_heads", "ffn_size", "positions", "max_positions"):
        del state["_module_config"][added]
    payload = pickle.dumps(state)
    assert b"skattn.text" in payload
    monkeypatch.undo()
    model = Seq2Seq.__new__(Seq2Seq)
    model.__setstate__(pickle.loads(payload))
    assert model.predict(["12345", "907"]) == fitted_reversal.predict(["12345", "907"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the fallback of a CPU-only machine")
def test_model_pickled_on_gpu_loads_on_cpu(fitted_reversal):
    state = fitted_reversal.__getstate__()
    assert all(t.device.type == "cpu" for t in state["_module"]["weights"].values())
    state["device_"] = torch.device("cuda", 0)  # what a GPU-trained model carries
    loaded = pickle.loads(pickle.dumps(state))
    model = Seq2Seq.__new__(Seq2Seq)
    model.__setstate__(loaded)
    assert model.device_ == torch.device("cpu")
    assert model.predict(["1234"]) == fitted_reversal.predict(["1234"])


def test_a_model_from_a_gpu_this_machine_lacks_lands_on_its_first(fitted_reversal, monkeypatch):
    """A model fitted on a Dask worker's second GPU came back to a one-GPU client with
    "invalid device ordinal": it lands on cuda:0 there (faked: this machine has no GPU)."""
    state = fitted_reversal.__getstate__()
    state["device_"] = torch.device("cuda", 1)
    moved = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.nn.Module, "to", lambda module, device: moved.append(device) or module
    )
    Seq2Seq.__new__(Seq2Seq).__setstate__(pickle.loads(pickle.dumps(state)))
    assert moved == [torch.device("cuda", 0)]


def test_export_onnx_writes_the_artifact_directory(tmp_path):
    X, y = make_reversal(30, 3, 6, random_state=10)
    model = Seq2Seq(max_steps=2, **TINY).fit(X, y)
    model.export_onnx(tmp_path / "model")
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["output_kind"] == "str"
    assert manifest["tokenizer"] == "char"
    assert {"encoder.onnx", "decoder_step.onnx"} <= {p.name for p in (tmp_path / "model").iterdir()}


# ---------------------------------------------------------------- devices


def test_auto_device_follows_cuda_availability():
    X, y = make_reversal(20, 3, 6, random_state=11)
    model = Seq2Seq(**{**TINY, "device": "auto"}, max_steps=1).fit(X, y)
    assert model.device_.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert next(model.module_.parameters()).device.type == model.device_.type


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_requesting_missing_cuda_raises_value_error():
    with pytest.raises(ValueError, match="device"):
        Seq2Seq(**{**TINY, "device": "cuda:0"}).fit(["12", "34"], ["21", "43"])


# ---------------------------------------------------------------- bad input


#: At least one bad value for every parameter (a test checks that none is missing).
BAD_VALUES = [
    ("scorer", "cosine"),
    ("decoder", "transformer"),  # needs encoder="transformer"
    ("encoder", "cnn"),
    ("attention", "local"),
    ("input_feeding", "yes"),
    ("window", 0),
    ("temperature", 0.0),
    ("temperature", 1e39),  # infinite in float32
    ("cell", "rnn"),
    ("embedding_dim", 0),
    ("hidden_size", 2.5),
    ("num_layers", True),
    ("dropout", 1.0),
    ("num_heads", 3),  # does not divide hidden_size=16
    ("num_kv_heads", 0),
    ("num_kv_heads", 2),  # a Transformer-only parameter with encoder="rnn"
    ("ffn_size", 0),
    ("positions", "rotary"),
    ("positions", "learned"),  # a Transformer-only parameter with encoder="rnn"
    ("beam_size", 0),
    ("length_penalty", -1.0),
    ("max_output_length", 0),
    ("batch_size", -4),
    ("max_epochs", 0),
    ("max_steps", 0),
    ("max_time", 0.0),
    ("max_time", float("inf")),
    ("max_time", "60"),
    ("learning_rate", 0.0),
    ("weight_decay", -0.1),
    ("weight_decay", float("nan")),
    ("lr_schedule", "linear"),
    ("label_smoothing", 1.5),
    ("max_grad_norm", -1.0),
    ("early_stopping", None),
    ("early_stopping_metric", "bleu"),
    ("validation_fraction", 1.0),
    ("n_iter_no_change", 0),
    ("tol", float("nan")),
    ("tokenizer", "bpe"),
    ("device", "gpu"),
    ("random_state", -1),
    ("random_state", True),
    ("verbose", -1),
    ("verbose", "yes"),
    ("num_heads", 0),
    ("batch_size", np.float64(8.0)),
    ("device", "cuda:x"),
    ("n_threads", 0),
    ("n_threads", 1.5),
    ("precision", "float16"),
    ("precision", "bf16"),
    ("warmup_steps", -1),
    ("warmup_steps", 2.5),
    ("average_checkpoints", 0),
    ("warm_start", "yes"),
    # past the limits (skattn.models.config.MAXIMA): refused by name, not overflowing in torch
    ("window", 2**64),
    ("embedding_dim", 2**62),
    ("hidden_size", 2**40),
    ("num_layers", 2**40),
    ("num_heads", 2**40),
    ("num_kv_heads", 2**20),
    ("ffn_size", 2**40),
    ("random_state", 2**32),
]


def test_every_parameter_has_a_bad_value_tested():
    assert {name for name, _ in BAD_VALUES} == set(Seq2Seq().get_params())


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_hyperparameter_raises_value_error_naming_it(name, value):
    model = Seq2Seq(**{**TINY, name: value})  # __init__ never validates
    assert getattr(model, name) is value
    with pytest.raises(ValueError, match=name):
        model.fit(["12", "34"], ["21", "43"])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("verbose", np.True_),
        ("verbose", 0),
        ("input_feeding", np.False_),
        ("early_stopping", np.True_),
        ("random_state", np.int64(3)),
        ("random_state", np.random.RandomState(1)),
        ("device", "cpu"),
        ("dropout", 0),
        ("max_output_length", np.int64(4)),
    ],
)
def test_accepted_hyperparameter_values(name, value):
    X, y = ["12", "34", "56"] * 4, ["21", "43", "65"] * 4
    model = Seq2Seq(**{**TINY, "max_steps": 1, name: value}).fit(X, y)
    assert model.n_steps_ == 1 and getattr(model, name) is value


@pytest.mark.parametrize(
    ("X", "y", "message"),
    [
        (["12", "34"], ["21"], "same length"),
        ([], [], "X must hold at least one item"),
        (
            ["12", "34"],
            ["", ""],
            "y holds no tokens but the reserved",
        ),  # no artifact could hold the model
        (["", ""], ["21", "43"], "X holds no tokens but the reserved"),
        (["12", 34], ["21", "43"], r"X\[1\]"),
        (["12", ["3", 4]], ["21", "43"], r"X\[1\]"),
        (["12", "34"], ["21", None], r"y\[1\]"),
        ("1234", "4321", "X must be a sequence"),
        (["12", "34"], ["21", ["4", "3"]], "only str items or only token lists"),
    ],
)
def test_bad_data_raises_value_error(X, y, message):
    with pytest.raises(ValueError, match=message):
        Seq2Seq(**TINY).fit(X, y)


def test_bad_data_at_predict_raises_value_error(fitted_reversal):
    with pytest.raises(ValueError, match=r"X\[0\]"):
        fitted_reversal.predict([12])
    with pytest.raises(ValueError, match="at least one item"):
        fitted_reversal.predict([])
    with pytest.raises(ValueError, match="same length"):
        fitted_reversal.score(["12", "34"], ["21"])


# -- a fit that raises ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"num_heads": 3},  # the model refuses it: the additive scorer has a single head
        pytest.param(
            {"device": "cuda"},
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present"),
        ),
    ],
    ids=["model-setting", "missing-device"],
)
def test_a_refit_that_raises_leaves_the_fitted_model_as_it_was(fitted_reversal, change):
    model = copy.deepcopy(fitted_reversal)
    sources = ["123", "9", "4567"]
    before = model.predict(sources)
    vocabularies = (model.source_vocab_.tokens, model.target_vocab_.tokens)
    limits = (model.max_source_length_, model.max_output_length_, model.device_)
    letters = ["abcdefgh"[i % 8 :] + "xyz" for i in range(40)]  # new vocabularies, longer
    with pytest.raises(ValueError):
        model.set_params(**change).fit(letters, letters)
    model.set_params(**{k: fitted_reversal.get_params()[k] for k in change})
    assert (model.source_vocab_.tokens, model.target_vocab_.tokens) == vocabularies
    assert (model.max_source_length_, model.max_output_length_, model.device_) == limits
    assert model.predict(sources) == before  # the module still reads its own vocabularies


def test_beam_size_and_max_output_length_stop_at_what_an_artifact_carries(reversal_data):
    X, y, _, _ = reversal_data
    for params, name in (
        ({"beam_size": 65}, "beam_size"),
        ({"max_output_length": 4097}, "max_output_length"),
    ):
        with pytest.raises(ValueError, match=name):
            Seq2Seq(**params).fit(X[:8], y[:8])
    model = Seq2Seq(hidden_size=4, embedding_dim=4, max_steps=1, early_stopping=False)
    model.set_params(beam_size=64, max_output_length=4096).fit(X[:8], y[:8])  # the limits pass
    long = "ab" * 1100  # 2,200 tokens: the default limit would be 2 * 2,200 + 10
    model = Seq2Seq(hidden_size=4, embedding_dim=4, max_steps=1, early_stopping=False)
    assert model.fit([long], [long]).max_output_length_ == 4096


class _Table:
    """What a pandas DataFrame of 3 rows and one column looks like to the input checks: ``len``
    counts its rows, iteration yields its column names."""

    ndim = 2

    def __len__(self) -> int:
        return 3

    def __iter__(self):
        return iter(["w"])


class _Miscounted(_Table):
    ndim = 1


@pytest.mark.parametrize("X", [_Table(), _Miscounted()], ids=["table", "len is not its items"])
def test_tables_and_miscounted_inputs_are_refused(fitted_reversal, X):
    """A DataFrame iterates over its column names: predict answered once, for "w"."""
    with pytest.raises(ValueError, match="X must be a sequence"):
        fitted_reversal.predict(X)
    with pytest.raises(ValueError, match="X must be a sequence"):
        clone(fitted_reversal).set_params(max_steps=1).fit(X, ["1", "2", "3"])


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"
            ),
            True,
        ),
        (
            RuntimeError("Storage size calculation overflowed with sizes=[7, 4611686018427387904]"),
            True,
        ),
        (MemoryError(), True),
        (RuntimeError("some other failure"), False),
    ],
)
def test_a_model_whose_weights_cannot_be_allocated_is_refused(monkeypatch, error, refused):
    """Sizes under the limits can still exceed the machine's memory: fit says which sizes
    (torch's own allocation errors are replaced; any other error passes unchanged)."""

    def build(config):
        raise error

    monkeypatch.setattr(estimator_module, "Seq2SeqModule", build)
    model = Seq2Seq(**TINY)
    expected = (
        (ValueError, "do not fit in memory .hidden_size=") if refused else (RuntimeError, "other")
    )
    with pytest.raises(expected[0], match=expected[1]):
        model.fit(["12", "34"], ["21", "43"])
    assert not hasattr(model, "module_")  # nothing fitted is left behind


@pytest.mark.parametrize(
    "X",
    [{"123": 1, "45": 2}, {"123", "45"}, np.array("123"), [np.array("123")], [["1", 2]]],
    ids=["dict", "set", "0-d array", "0-d array item", "non-str token"],
)
def test_unordered_or_shapeless_inputs_are_refused_naming_X(fitted_reversal, X):
    with pytest.raises(ValueError, match=r"X(\[0\])? must be"):
        fitted_reversal.predict(X)
    with pytest.raises(ValueError, match=r"X(\[0\])? must be"):
        clone(fitted_reversal).set_params(max_steps=1).fit(X, ["1", "2"])  # X is checked first


def test_a_refused_setting_is_reported_before_the_datas_size():
    """fit split off the validation sources before building the model's config, so a setting
    the model refuses, fitted on too few sources, was reported as a want of sources."""
    model = Seq2Seq(encoder="transformer", decoder="transformer", attention="none", device="cpu")
    with pytest.raises(ValueError, match="attention"):
        model.fit(["ab"], ["ba"])
    with pytest.raises(ValueError, match="early_stopping needs at least one training source"):
        Seq2Seq(device="cpu").fit(["ab"], ["ba"])  # a setting the model takes: the size it is


def test_score_refuses_string_outputs_for_a_model_fitted_on_token_lists():
    """score split string targets with the char tokenizer ("AA BB" -> A, A, " ", B, B), so a
    model fitted on token lists scored 0 against the right answers written as strings."""
    X, y = ["ab", "ba"], [["AA", "BB"], ["BB", "AA"]]
    model = Seq2Seq(hidden_size=8, embedding_dim=4, max_steps=2, early_stopping=False)
    model.set_params(device="cpu", random_state=0).fit(X, y)
    assert 0.0 <= model.score(X, y) <= 1.0
    with pytest.raises(ValueError, match="y holds strings, but the model was fitted on token"):
        model.score(X, ["AA BB", "BB AA"])
    with pytest.raises(ValueError, match="X and y must have the same length"):
        model.score(X, y[:1])
    with pytest.raises(ValueError, match="requires y"):
        model.score(X, None)
