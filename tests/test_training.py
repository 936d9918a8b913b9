"""Tests for skattn.training: the split, length batches, the trainer and its callbacks."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from skattn import Seq2Seq, callbacks, training
from skattn.datasets import make_reversal

TINY = dict(embedding_dim=8, hidden_size=16, batch_size=8, device="cpu", random_state=0)


def reversal_trainer(callbacks, *, n=80, learning_rate=0.01, max_epochs=20):
    """A trainer over a tiny fitted reversal model; ``n - 8`` training items (9 batches of 8
    for ``n=80``), the last 8 for validation."""
    X, y = make_reversal(n, 3, 6, random_state=5)
    model = Seq2Seq(max_steps=1, early_stopping=False, **TINY).fit(X, y)
    src = [model.source_vocab_.encode(list(x)) + [2] for x in X]
    tgt = [model.target_vocab_.encode(list(t)) for t in y]
    return training.Trainer(
        model.module_,
        src,
        tgt,
        decode=model._greedy_tokens,
        batch_size=8,
        learning_rate=learning_rate,
        max_epochs=max_epochs,
        callbacks=callbacks,
    )


def fit(trainer, n=80):
    return trainer.fit(np.arange(n - 8), np.arange(n - 8, n), np.random.RandomState(0))


# ---------------------------------------------------------------- data


def test_split_holds_out_the_validation_fraction():
    sources = [list(str(i)) for i in range(50)]
    train, val = training.split(sources, 0.1, np.random.RandomState(0))
    assert len(val) == 5 and sorted([*train, *val]) == list(range(50))
    train, val = training.split(sources, None, np.random.RandomState(0))
    assert len(val) == 0 and sorted(train) == list(range(50))
    with pytest.raises(ValueError, match="at least one training source.*1 distinct sources"):
        training.split([["a"]] * 10, 0.1, np.random.RandomState(0))


def test_split_holds_out_every_item_of_a_source_or_none():
    """A word with several pronunciations (or a distilled pair beside its reference) on both
    sides would be scored in validation on a source the model trained on."""
    words = [list(f"w{i}") for i in range(40)]
    sources = [w for w in words for _ in range(1 + int(w[1]) % 3)]  # 1-3 items a word
    for seed in range(5):
        train, val = training.split(sources, 0.25, np.random.RandomState(seed))
        assert sorted([*train, *val]) == list(range(len(sources)))
        held_out = {tuple(sources[i]) for i in val}
        assert len(held_out) == 10  # a quarter of the 40 words, with all their items
        assert not held_out & {tuple(sources[i]) for i in train}


def test_training_batches_cover_every_item_once_and_group_similar_lengths():
    rng = np.random.RandomState(0)
    lengths = rng.randint(1, 40, size=1000)
    indices = np.arange(3, 1000)  # a training split: items 0..2 held out
    batches = training.length_batches(indices, lengths, batch_size=10, rng=rng)
    assert sorted(np.concatenate(batches).tolist()) == indices.tolist()
    assert max(map(len, batches)) <= 10
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 0.25 * np.ptp(lengths)  # random batches would span most of the range


def test_resolve_device():
    assert training.resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert training.resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="device"):
        training.resolve_device("cuda:99")


# ---------------------------------------------------------------- callbacks


def test_monitor_compares_lexicographically_with_a_tolerance():
    monitor = callbacks.Monitor(("val_exact_match", "val_loss"), (-1.0, 1.0), tol=0.01)
    assert monitor.update({"val_exact_match": 0.0, "val_loss": 2.0}) == (True, True)
    # the exact match ties (within tol): the loss decides
    assert monitor.update({"val_exact_match": 0.005, "val_loss": 1.5}) == (True, True)
    assert monitor.update({"val_exact_match": 0.005, "val_loss": 1.495}) == (False, True)
    assert monitor.update({"val_exact_match": 0.5, "val_loss": 9.0}) == (True, True)
    # a worse exact match loses whatever the loss
    assert monitor.update({"val_exact_match": 0.2, "val_loss": 0.1}) == (False, False)
    assert monitor.best == (-0.5, 9.0)


@pytest.mark.parametrize(
    ("validation", "metric", "keys"),
    [
        (False, "exact_match", ("train_loss",)),
        (True, "loss", ("val_loss",)),
        (True, "exact_match", ("val_exact_match", "val_loss")),
    ],
)
def test_monitor_for_metric(validation, metric, keys):
    assert callbacks.Monitor.for_metric(validation, metric, 0.0).keys == keys


def test_early_stopping_counts_patience_and_gives_back_the_best_weights():
    module = torch.nn.Linear(1, 1)
    trainer = SimpleNamespace(module=module, stop=False, best_epoch=None)
    stopper = callbacks.EarlyStopping(callbacks.Monitor(("loss",), (1.0,), 0.1), 2, keep_best=True)
    for epoch, loss in enumerate([3.0, 2.0, 1.95, 2.5], start=1):
        with torch.no_grad():
            module.weight.fill_(epoch)
        stopper.on_epoch_end(trainer, {"epoch": epoch, "loss": loss})
        assert trainer.stop == (epoch == 4)  # epochs 3 and 4 improve by less than tol
    stopper.on_train_end(trainer)
    assert trainer.best_epoch == 3 and module.weight.item() == 3.0  # 1.95: best, not by tol


def test_plateau_schedule_multiplies_the_rate_after_an_epoch_without_progress():
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    trainer = SimpleNamespace(optimizer=optimizer)
    plateau = callbacks.PlateauSchedule(callbacks.Monitor(("loss",), (1.0,), 0.1))
    for loss in [3.0, 2.95, 2.0, 2.5]:
        plateau.on_epoch_end(trainer, {"loss": loss})
    assert optimizer.param_groups[0]["lr"] == 0.25


def test_budget_is_spent_at_max_steps_or_max_time():
    seconds = [0.0]
    budget = callbacks.Budget(max_steps=5, max_time=10.0, clock=lambda: seconds[0])
    assert not budget.spent(4) and budget.spent(5)
    seconds[0] = 4.0
    assert budget.time_share() == 0.4
    seconds[0] = 10.0
    assert budget.spent(0) and budget.time_share() == 1.0
    unlimited = callbacks.Budget(None, None)
    assert not unlimited.spent(10**9) and unlimited.time_share() == 0.0


def test_cosine_factor_falls_from_1_to_0_over_the_shorter_budget():
    budget = callbacks.Budget(max_steps=None, max_time=None)
    cosine = callbacks.CosineSchedule(budget, max_epochs=2, steps_per_epoch=10)
    assert cosine.total == 20
    assert [cosine.factor(t) for t in (0, 10, 20, 30)] == pytest.approx([1, 0.5, 0, 0])
    assert callbacks.CosineSchedule(callbacks.Budget(7, None), 2, 10).total == 7


# ---------------------------------------------------------------- the trainer


def test_a_callback_stop_ends_the_epoch_after_the_step_then_training():
    class StopAfterThreeSteps(callbacks.Callback):
        def on_step_end(self, trainer):
            trainer.stop |= trainer.steps == 3

    trainer = reversal_trainer([StopAfterThreeSteps()])
    history = fit(trainer)
    assert trainer.steps == 3 and [h["steps"] for h in history] == [3]
    assert set(history[0]) == {
        "epoch",
        "steps",
        "lr",
        "train_loss",
        "val_loss",
        "val_exact_match",
        "seconds",
    }
    assert not trainer.module.training and trainer.best_epoch is None


def test_max_time_stops_training_and_ends_the_cosine_schedule_at_the_deadline():
    # A clock that moves one second per optimizer step: max_time=12 is spent after 12 steps,
    # whatever max_steps (100) or max_epochs allow, and the cosine reaches 0 there.
    seconds = [0.0]

    class OneSecondPerStep(callbacks.Callback):
        def on_step_end(self, trainer):
            seconds[0] += 1.0

    lr = 0.01
    budget = callbacks.Budget(max_steps=100, max_time=12.0, clock=lambda: seconds[0])
    cosine = callbacks.CosineSchedule(budget, max_epochs=20, steps_per_epoch=9)
    trainer = reversal_trainer([OneSecondPerStep(), cosine, budget], learning_rate=lr)
    history = fit(trainer)  # 9 batches of 8 per epoch
    assert trainer.steps == 12 and [h["steps"] for h in history] == [9, 12]
    assert "val_exact_match" in history[-1]  # the cut-short epoch is validated as usual
    # history records the rate each epoch starts with: after 0 and 9 of the 12 seconds (the
    # share of max_time spent outruns the 9 of 100 steps).
    expected = [lr, lr * (1 + math.cos(math.pi * 9 / 12)) / 2]
    assert [h["lr"] for h in history] == pytest.approx(expected, rel=1e-12)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0


def test_the_trainer_steps_a_fused_adam_that_updates_as_torchs_per_tensor_loop():
    assert reversal_trainer([]).optimizer.defaults["fused"]
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fused_model, loop_model = copy.deepcopy(start), copy.deepcopy(start)
    fused = training.adam(fused_model.parameters(), 1e-2)
    loop = torch.optim.Adam(loop_model.parameters(), lr=1e-2, foreach=False, fused=False)
    for _ in range(30):
        x = torch.randn(32, 8)
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b, before in zip(
        fused_model.parameters(), loop_model.parameters(), start.parameters(), strict=True
    ):
        assert (a - before).abs().max() > 0.02  # 30 steps of 1e-2 moved every tensor
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_weight_decay_scales_matrices_before_the_adam_step_and_leaves_biases_alone():
    """AdamW's first step, by hand: Adam's bias-corrected moments are g and g ** 2, so the step
    is lr * g / (|g| + eps), after the decay scaled a matrix by 1 - lr * w (Loshchilov & Hutter
    2019's decoupled form); a bias only takes the step."""
    lr, w, eps = 1e-2, 0.5, 1e-8
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    optimizer = training.adam(layer.parameters(), lr, weight_decay=w)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"]
    layer(torch.randn(7, 5)).square().sum().backward()
    g_weight, g_bias = layer.weight.grad.clone(), layer.bias.grad.clone()
    optimizer.step()
    step = lambda g: lr * g / (g.abs() + eps)  # noqa: E731
    torch.testing.assert_close(layer.weight, weight * (1 - lr * w) - step(g_weight))
    torch.testing.assert_close(layer.bias, bias - step(g_bias))
    assert type(training.adam(layer.parameters(), lr)) is torch.optim.Adam  # 0: plain Adam


def test_validation_batches_hold_a_bounded_number_of_logits(monkeypatch):
    """Validation took 256 items a batch whatever the vocabulary: with 100,000 target tokens
    a batch's logits took gigabytes, however small batch_size was."""
    X, y = make_reversal(200, 4, 9, alphabet="abcdefghijklmnopqrstuvwxyz", random_state=0)
    rows = []
    original = training.batch_loss

    def spy(module, source, source_lengths, target, label_smoothing=0.0):
        if not module.training:
            rows.append(len(source))
            positions, vocabulary = target.shape[1] - 1, module.config.target_vocab_size
            assert len(source) * positions * vocabulary <= training.EVAL_LOGITS
        return original(module, source, source_lengths, target, label_smoothing)

    monkeypatch.setattr(training, "batch_loss", spy)
    monkeypatch.setattr(training, "EVAL_LOGITS", 2_000)  # 30 tokens x 10 positions: 6 rows
    Seq2Seq(hidden_size=8, max_steps=2, validation_fraction=0.2, device="cpu").fit(X, y)
    assert sum(rows) == 40 and max(rows) <= 6
