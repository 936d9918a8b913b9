"""Tests for the training features that learn more per CPU-second: learning-rate warmup, the
inverse-square-root schedule, checkpoint averaging and ``warm_start``."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from skattn import Seq2Seq, callbacks, training
from skattn.datasets import make_reversal

TINY = dict(embedding_dim=8, hidden_size=16, batch_size=8, device="cpu", random_state=0)


@pytest.fixture(scope="module")
def data():
    return make_reversal(48, 3, 6, random_state=2)


def weights(model: Seq2Seq) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.module_.state_dict().items()}


# ---------------------------------------------------------------- schedules


def test_warmup_rises_linearly_then_hands_over_to_the_schedule():
    budget = callbacks.Budget(max_steps=None, max_time=None)
    cosine = callbacks.CosineSchedule(budget, max_epochs=1, steps_per_epoch=100, warmup_steps=4)
    assert [cosine.warmup(t) for t in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    assert cosine.factor(50) == pytest.approx(0.5)  # the cosine's own value after the warmup
    assert callbacks.StepSchedule(0).factor(0) == 1.0  # no warmup: the constant rate


def test_inverse_sqrt_peaks_at_the_end_of_the_warmup_then_falls_as_one_over_sqrt_t():
    schedule = callbacks.InverseSqrtSchedule(warmup_steps=100)
    assert schedule.factor(0) == pytest.approx(0.01)
    assert schedule.factor(99) == pytest.approx(1.0)
    assert schedule.factor(399) == pytest.approx(0.5)  # sqrt(100 / 400)
    assert schedule.factor(9999) == pytest.approx(0.1)
    assert callbacks.InverseSqrtSchedule(0).factor(3) == pytest.approx(0.5)  # W = 1: 1/sqrt(4)


def test_the_estimator_steps_the_rate_along_warmup_and_inverse_sqrt(data):
    X, y = data
    lr = 0.02
    model = Seq2Seq(
        lr_schedule="inverse_sqrt", warmup_steps=4, learning_rate=lr, max_steps=12, **TINY
    )
    chosen = callbacks.callbacks_for(model.get_params(), 48, validation=True)
    schedule = next(c for c in chosen if isinstance(c, callbacks.StepSchedule))
    optimizer = torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=lr)
    schedule.on_train_begin(SimpleNamespace(optimizer=optimizer))
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # (no gradients: nothing moves)
        schedule.on_step_end(None)
    expected = [lr * min((t + 1) / 4, 1) * math.sqrt(4 / max(t + 1, 4)) for t in range(12)]
    assert seen == pytest.approx(expected, rel=1e-12)
    history = model.fit(X, y).history_
    assert history[0]["lr"] == pytest.approx(lr / 4)  # the first epoch starts warming up
    assert history[1]["lr"] == pytest.approx(lr * math.sqrt(4 / 7))  # 6 batches of 8 before


def test_plateau_halves_the_warmup_curve_rather_than_fighting_it():
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    trainer = SimpleNamespace(optimizer=optimizer)
    warmup = callbacks.StepSchedule(warmup_steps=4)
    warmup.on_train_begin(trainer)
    plateau = callbacks.PlateauSchedule(callbacks.Monitor(("loss",), (1.0,), 0.1), schedule=warmup)
    for loss in [3.0, 2.95]:  # the second epoch does not improve: the curve halves
        plateau.on_epoch_end(trainer, {"loss": loss})
    for _ in range(5):
        optimizer.step()
        warmup.on_step_end(trainer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # warmed up, then halved


def test_new_schedule_parameters_are_validated():
    with pytest.raises(ValueError, match="warmup_steps"):
        Seq2Seq(warmup_steps=-1).fit(["ab"], ["ba"])
    X, y = make_reversal(40, 3, 6, random_state=0)  # 36 training items: 5 steps an epoch
    model = Seq2Seq(warmup_steps=21, max_steps=20, **TINY)
    with pytest.raises(ValueError, match=r"warmup_steps=21 is longer than this fit can be \(20"):
        model.fit(X, y)
    assert not hasattr(model, "module_")  # the refused fit left nothing behind
    with pytest.raises(ValueError, match=r"warmup_steps=11 .* \(10 steps: .*max_epochs=2 of 5"):
        Seq2Seq(warmup_steps=11, max_epochs=2, early_stopping=False, **TINY).fit(X, y)
    Seq2Seq(warmup_steps=20, max_steps=20, **TINY).fit(X, y)  # the peak at the last step
    with pytest.raises(ValueError, match="average_checkpoints"):
        Seq2Seq(average_checkpoints=0).fit(["ab"], ["ba"])
    with pytest.raises(ValueError, match="lr_schedule"):
        Seq2Seq(lr_schedule="noam").fit(["ab"], ["ba"])


# ---------------------------------------------------------------- checkpoint averaging


def test_average_states_means_floats_and_keeps_the_last_of_the_rest():
    states = [
        {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(1)},
        {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(2)},
    ]
    averaged = callbacks.average_states(states)
    assert torch.equal(averaged["w"], torch.tensor([2.0, 4.0])) and averaged["n"].item() == 2


def test_early_stopping_keeps_the_mean_of_the_k_epochs_ending_at_the_best():
    module = torch.nn.Linear(1, 1, bias=False)
    trainer = SimpleNamespace(module=module, stop=False, best_epoch=None)
    monitor = callbacks.Monitor(("loss",), (1.0,), 0.0)
    stopper = callbacks.EarlyStopping(monitor, 10, keep_best=True, average=3)
    for epoch, loss in enumerate([5.0, 4.0, 3.0, 2.0, 2.5, 2.6], start=1):
        with torch.no_grad():
            module.weight.fill_(float(epoch))
        stopper.on_epoch_end(trainer, {"epoch": epoch, "loss": loss})
    stopper.on_train_end(trainer)
    assert trainer.best_epoch == 4 and module.weight.item() == pytest.approx(3.0)  # (2+3+4)/3


def test_the_estimator_averages_the_last_epochs_weights(data):
    # A constant rate and no validation: each run's first epochs are the same steps, so the
    # averaged model of 3 epochs is the mean of the 1-, 2- and 3-epoch models.
    X, y = data
    params = dict(lr_schedule="constant", early_stopping=False, learning_rate=0.01, **TINY)
    runs = [weights(Seq2Seq(max_epochs=e, **params).fit(X, y)) for e in (1, 2, 3)]
    averaged = Seq2Seq(max_epochs=3, average_checkpoints=3, **params).fit(X, y)
    for name, tensor in weights(averaged).items():
        expected = torch.stack([run[name] for run in runs]).float().mean(0)
        torch.testing.assert_close(tensor.float(), expected, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(weights(averaged)[n], runs[2][n]) for n in runs[2])


# ---------------------------------------------------------------- warm_start


def test_warm_start_continues_from_the_fitted_weights(data):
    X, y = data
    model = Seq2Seq(max_epochs=2, warm_start=True, learning_rate=0.01, **TINY).fit(X, y)
    before, vocab, module = weights(model), model.target_vocab_, model.module_
    model.set_params(learning_rate=1e-12, max_epochs=1)  # a step that cannot move the weights
    model.fit(X, y)
    assert model.module_ is module and model.target_vocab_ is vocab
    for name, tensor in weights(model).items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=1e-6)
    assert [h["epoch"] for h in model.history_] == [1, 2, 3] and model.n_iter_ == 3
    steps = [h["steps"] for h in model.history_]
    assert steps == sorted(steps) and model.n_steps_ == steps[-1] > steps[1]


def test_warm_start_training_goes_on_learning(data):
    X, y = data
    params = dict(lr_schedule="constant", learning_rate=0.02, early_stopping=False, **TINY)
    model = Seq2Seq(max_epochs=3, warm_start=True, **params).fit(X, y)
    first_loss = model.history_[-1]["train_loss"]
    model.fit(X, y)
    assert model.history_[-1]["train_loss"] < first_loss  # it did not start over
    fresh = Seq2Seq(max_epochs=3, **params).fit(X, y)
    assert fresh.history_[-1]["train_loss"] == pytest.approx(first_loss)


def test_a_warm_start_keeps_its_weights_if_no_new_epoch_beats_them(data):
    """A warm fit whose epochs are all worse (here a rate that wrecks the model) used to keep
    the best of those; scikit-learn's MLP keeps its best across warm starts, and so does this."""
    X, y = data
    params = dict(lr_schedule="constant", learning_rate=0.01, warm_start=True, **TINY)
    model = Seq2Seq(max_epochs=4, **params).fit(X, y)
    before, best_epoch = weights(model), model.best_epoch_
    model.set_params(learning_rate=3.0, max_epochs=1, max_grad_norm=None).fit(X, y)
    assert model.history_[-1]["val_loss"] > min(h["val_loss"] for h in model.history_[:-1])
    for name, tensor in weights(model).items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0)
    assert model.best_epoch_ == best_epoch and model.n_iter_ == 5


def test_a_warm_start_holds_out_the_same_sources_even_without_a_random_state(data, monkeypatch):
    X, y = data
    held_out = []
    split = training.split

    def recording(sources, fraction, rng):
        train, val = split(sources, fraction, rng)
        held_out.append(sorted(val.tolist()))
        return train, val

    monkeypatch.setattr(training, "split", recording)
    params = {**TINY, "random_state": None}
    model = Seq2Seq(max_epochs=1, warm_start=True, validation_fraction=0.25, **params)
    model.fit(X, y).fit(X, y)
    assert held_out[0] == held_out[1] and model.validation_seed_ >= 0


def test_without_warm_start_fit_starts_over(data):
    X, y = data
    model = Seq2Seq(max_epochs=1, **TINY).fit(X, y)
    module = model.module_
    model.fit(["xyz", "zy"] * 4, ["zyx", "yz"] * 4)
    assert model.module_ is not module and "x" in model.target_vocab_
    assert len(model.history_) == 1


def test_warm_start_refuses_a_new_architecture_or_unknown_target_tokens(data):
    X, y = data
    model = Seq2Seq(max_epochs=1, warm_start=True, **TINY).fit(X, y)
    with pytest.raises(ValueError, match=r"hidden_size=32 \(fitted with 16\)"):
        model.set_params(hidden_size=32).fit(X, y)
    model.set_params(hidden_size=16)
    with pytest.raises(ValueError, match=r"cannot write: \['#'\]"):
        model.fit([*X, "12"], [*y, "2#"])
    assert model.predict(["12"])  # the refusals left the fitted model as it was
    known = sorted(set("".join(X)))
    model.fit([*X, "".join(known) + "!"], [*y, known[0]])  # a new source token is fine
    assert len(model.history_) == 2


def test_a_warm_started_model_pickles_and_continues_after_loading(data, tmp_path):
    import joblib

    X, y = data
    model = Seq2Seq(max_epochs=1, warm_start=True, **TINY).fit(X, y)
    joblib.dump(model, tmp_path / "m.joblib")
    loaded = joblib.load(tmp_path / "m.joblib")
    assert loaded.fit(X, y).n_iter_ == 2
    assert len(loaded.predict(X[:4])) == 4


def test_warm_start_never_shrinks_the_output_and_source_limits(data):
    X, y = data
    model = Seq2Seq(max_epochs=1, warm_start=True, **TINY).fit(X, y)
    limits = model.max_source_length_, model.max_output_length_
    model.fit(["12", "1"] * 4, ["21", "1"] * 4)  # shorter items than the first fit's
    assert (model.max_source_length_, model.max_output_length_) == limits


# ---------------------------------------------------------------- failed fits


DIVERGING = dict(learning_rate=1e12, lr_schedule="constant", max_grad_norm=None, max_steps=20)


def test_a_diverging_fit_raises_and_leaves_an_unfitted_model_unfitted(data):
    from sklearn.exceptions import NotFittedError

    X, y = data
    model = Seq2Seq(**{**TINY, **DIVERGING})
    with pytest.raises(ValueError, match="training diverged: the loss of step"):
        model.fit(X, y)
    with pytest.raises(NotFittedError):
        model.predict(X[:2])
    assert not [name for name in vars(model) if name.endswith("_") and not name.startswith("_")]


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_diverging_refit_leaves_the_fitted_model_as_it_was(data, warm_start):
    X, y = data
    model = Seq2Seq(max_epochs=2, **TINY).fit(X, y)
    before, history, predictions = weights(model), list(model.history_), model.predict(X)
    module = model.module_
    model.set_params(warm_start=warm_start, **DIVERGING)
    with pytest.raises(ValueError, match="training diverged"):
        model.fit(X, y)
    assert model.module_ is module and model.history_ == history
    for name, tensor in weights(model).items():
        assert torch.equal(tensor, before[name]), name
    assert model.predict(X) == predictions


def test_an_interrupted_warm_refit_leaves_the_fitted_model_as_it_was(data, monkeypatch):
    X, y = data
    model = Seq2Seq(max_epochs=2, **TINY).fit(X, y)
    before, history, module = weights(model), list(model.history_), model.module_
    vocab, calls = model.target_vocab_, []

    def interrupt(self, *args):  # Ctrl-C at the third step
        calls.append(1)
        if len(calls) % 3 == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(callbacks.Budget, "on_step_end", interrupt)
    model.set_params(warm_start=True)
    with pytest.raises(KeyboardInterrupt):
        model.fit(X + ["789"], y + ["987"])  # a new token: vocabularies would change cold
    assert model.module_ is module and model.history_ == history and not module.training
    assert all(torch.equal(t, before[n]) for n, t in weights(model).items())
    model.set_params(warm_start=False)
    with pytest.raises(KeyboardInterrupt):
        model.fit(X + ["789"], y + ["987"])  # a new module, vocabularies and limits
    assert model.module_ is module and model.target_vocab_ is vocab


def test_the_plateau_schedule_counts_a_warm_starts_weights_as_its_baseline():
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    trainer = SimpleNamespace(optimizer=optimizer)
    plateau = callbacks.PlateauSchedule(callbacks.Monitor(("loss",), (1.0,), 0.0))
    plateau.on_baseline(trainer, {"loss": 1.0})
    plateau.on_epoch_end(trainer, {"loss": 5.0})  # worse than the weights it started from
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_numpy_integers_train_as_python_integers(data):
    import numpy as np

    X, y = data
    model = Seq2Seq(**{**TINY, "batch_size": np.int8(100), "max_epochs": np.int8(2)}).fit(X, y)
    assert model.n_steps_ == 2 and model.n_iter_ == 2  # 100 * 50 in int8 would wrap negative


@pytest.mark.parametrize(
    "name", ["max_time", "tol", "learning_rate", "max_grad_norm", "batch_size", "max_epochs"]
)
def test_a_number_too_large_for_a_float_is_refused_by_name(data, name):
    X, y = data
    with pytest.raises(ValueError, match=name):
        Seq2Seq(**{**TINY, name: 10**400}).fit(X, y)


def test_warm_start_refuses_another_tokenizer_and_predict_refuses_it_too(data):
    X, y = data
    model = Seq2Seq(max_epochs=1, warm_start=True, **TINY).fit(X, y)
    predictions, before = model.predict(X), weights(model)
    model.set_params(tokenizer="space")
    with pytest.raises(ValueError, match="tokenizer='space', but the model was fitted with"):
        model.fit(X, [list(t) for t in y])  # every source would read as one unknown token
    for method in (model.predict, model.predict_attention):
        with pytest.raises(ValueError, match="tokenizer='space'"):
            method(X[:2])
    with pytest.raises(ValueError, match="tokenizer='space'"):
        model.score(X, y)
    model.set_params(tokenizer="char")
    assert model.predict(X) == predictions and model.tokenizer_ == "char"
    assert all(torch.equal(t, before[n]) for n, t in weights(model).items())
    refit = model.set_params(warm_start=False, tokenizer="space").fit(X, [list(t) for t in y])
    assert refit.tokenizer_ == "space"  # without warm_start, a new model of the new tokenizer


@pytest.mark.parametrize(("name", "value"), [("length_penalty", 10.5), ("n_threads", 1025)])
def test_length_penalty_and_threads_are_bounded(data, name, value):
    X, y = data
    with pytest.raises(ValueError, match=name):
        Seq2Seq(**{**TINY, "max_steps": 1, name: value}).fit(X, y)
    model = Seq2Seq(**{**TINY, "max_steps": 1, "beam_size": 3}).fit(X, y)
    model.set_params(**{name: value})
    with pytest.raises(ValueError, match=name):
        model.predict(X[:2])  # a prediction-time setting, checked at every call
