"""Mixed-precision training (``precision="bfloat16"``): every family trains under autocast,
the weights and the attention stay float32, and what is learned matches float32 training."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from skattn import Seq2Seq, training
from skattn.attention import Attention
from skattn.attention.self_attention import scaled_dot_product
from skattn.attention.softmax import masked_softmax
from skattn.datasets import make_reversal
from skattn.metrics import exact_match
from skattn.models import rnn

TINY = dict(embedding_dim=8, hidden_size=16, batch_size=8, device="cpu", random_state=0)

FAMILIES = [
    dict(decoder="bahdanau", scorer="additive"),
    dict(decoder="bahdanau", scorer="dot", cell="lstm"),
    dict(decoder="luong", scorer="general", input_feeding=True),
    dict(decoder="luong", scorer="scaled_dot", input_feeding=False, num_layers=2),
    dict(decoder="luong", scorer="dot", attention="local-p", window=2),
    dict(decoder="luong", attention="local-m", window=2, cell="lstm"),
    dict(decoder="bahdanau", attention="none"),
    dict(encoder="transformer", decoder="luong", scorer="general", num_heads=2),
    dict(encoder="transformer", decoder="bahdanau", num_heads=2, num_kv_heads=1),
    dict(encoder="transformer", decoder="transformer", num_heads=2, num_layers=2),
]


def _family_params(family: dict) -> dict:
    params = {**TINY, **family}
    if family.get("decoder") == "transformer":
        params.pop("embedding_dim")  # no RNN: the Transformer families refuse it
    return params


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: "-".join(map(str, f.values())))
def test_every_family_trains_in_bfloat16_with_float32_weights(family):
    X, y = make_reversal(48, 2, 6, random_state=1)
    model = Seq2Seq(**_family_params(family), precision="bfloat16", max_steps=4, dropout=0.1)
    logit_dtypes = []
    original = training.batch_loss

    def spy(module, source, source_lengths, target, label_smoothing=0.0):
        if module.training:
            logit_dtypes.append(module(source, source_lengths, target[:, :-1])[0].dtype)
        return original(module, source, source_lengths, target, label_smoothing)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "batch_loss", spy)
        model.fit(X, y)
    assert logit_dtypes == [torch.bfloat16] * 4  # the output products ran in bfloat16
    assert all(w.dtype == torch.float32 for w in model.module_.parameters())
    assert all(bool(torch.isfinite(w).all()) for w in model.module_.parameters())
    assert np.isfinite(model.history_[-1]["train_loss"])
    assert len(model.predict(X[:5])) == 5


@pytest.mark.parametrize("family", FAMILIES[::3], ids=lambda f: "-".join(map(str, f.values())))
def test_the_autocast_loss_is_float32_and_close_to_the_float32_loss(family):
    X, y = make_reversal(32, 3, 7, random_state=2)
    model = Seq2Seq(**_family_params(family), max_steps=2, early_stopping=False).fit(X, y)
    source, source_lengths = training.to_tensors(
        [model.source_vocab_.encode(list(x)) + [2] for x in X], torch.device("cpu")
    )
    target, _ = training.to_tensors(
        [[1, *model.target_vocab_.encode(list(t)), 2] for t in y], torch.device("cpu")
    )
    module = model.module_.eval()
    with torch.no_grad():
        full, n = training.batch_loss(module, source, source_lengths, target)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed, n_mixed = training.batch_loss(module, source, source_lengths, target)
    assert n == n_mixed
    assert mixed.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: products agree to a few parts in a thousand
    assert float(mixed) == pytest.approx(float(full), rel=2e-2)


def test_only_the_training_step_runs_under_autocast(monkeypatch):
    X, y = make_reversal(40, 3, 6, random_state=3)
    seen = []
    original = training.batch_loss

    def spy(module, *args, **kwargs):
        seen.append((module.training, torch.is_autocast_enabled("cpu")))
        return original(module, *args, **kwargs)

    monkeypatch.setattr(training, "batch_loss", spy)
    Seq2Seq(**TINY, precision="bfloat16", max_epochs=1, validation_fraction=0.2).fit(X, y)
    assert {autocast for is_training, autocast in seen if is_training} == {True}
    assert {autocast for is_training, autocast in seen if not is_training} == {False}


def test_float32_trains_without_autocast(monkeypatch):
    X, y = make_reversal(24, 3, 6, random_state=3)
    seen = []
    original = training.batch_loss

    def spy(module, *args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return original(module, *args, **kwargs)

    monkeypatch.setattr(training, "batch_loss", spy)
    Seq2Seq(**TINY, max_steps=2, early_stopping=False).fit(X, y)
    assert seen and not any(seen)


def test_bfloat16_learns_what_float32_learns():
    X, y = make_reversal(600, 3, 6, random_state=4)
    X_test, y_test = make_reversal(200, 3, 6, random_state=5)
    scores = {}
    for precision in ("float32", "bfloat16"):
        model = Seq2Seq(
            hidden_size=32,
            embedding_dim=16,
            decoder="luong",
            scorer="general",
            learning_rate=1e-2,
            max_epochs=12,
            early_stopping=False,
            device="cpu",
            precision=precision,
            random_state=0,
        ).fit(X, y)
        scores[precision] = exact_match(y_test, model.predict(X_test))
    assert scores["float32"] >= 0.9, scores
    assert scores["bfloat16"] >= scores["float32"] - 0.05, scores


def test_trainer_refuses_an_unknown_precision():
    with pytest.raises(ValueError, match="precision"):
        training.Trainer(torch.nn.Linear(1, 1), [], [], decode=list, precision="float16")


def test_attention_under_autocast_is_float32_and_equals_float32_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[0, 0, 1] = False  # a query that may read nothing: zeros, never NaN
    for need_weights in (False, True):
        expected, expected_w = scaled_dot_product(q, k, v, mask, need_weights=need_weights)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, w = scaled_dot_product(q, k, v, mask, need_weights=need_weights)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, expected)
        if need_weights:
            torch.testing.assert_close(w, expected_w)


def test_masked_softmax_of_bfloat16_scores_is_float32_under_autocast_only():
    scores = torch.tensor([[2.0, 0.0, 2.0, 7.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[True, True, True, False]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        weights = masked_softmax(scores, mask)
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, masked_softmax(scores.float(), mask))
    assert weights[0, 3] == 0
    assert masked_softmax(scores, mask).dtype == torch.bfloat16  # a bfloat16 model's own dtype


@pytest.mark.parametrize("scorer", ["dot", "general", "additive", "scaled_dot"])
def test_a_bfloat16_model_attends_in_bfloat16_outside_autocast(scorer):
    torch.manual_seed(0)
    attention = Attention(scorer, 8, 8).to(torch.bfloat16)
    H = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    s = torch.randn(2, 8, dtype=torch.bfloat16)
    context, weights = attention(s, H, attention.precompute(H), None)
    assert context.dtype == weights.dtype == torch.bfloat16
    q = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    out, w = scaled_dot_product(q, q, q, None, need_weights=True)
    assert out.dtype == w.dtype == torch.bfloat16


def test_local_m_windows_under_autocast_are_the_float32_windows_past_256_positions():
    torch.manual_seed(0)
    attention = Attention("general", 8, 8, local="local-m", window=2)
    H = torch.randn(1, 400, 8)
    keys = attention.precompute(H)
    s = torch.randn(1, 8)
    for step in (100, 255, 257, 300, 399):
        _, expected = attention(s, H, keys, None, step=step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, weights = attention(s, H, keys, None, step=step)
        # bfloat16 holds every integer only up to 256: the window must not be rounded into it
        assert torch.equal(weights > 0, expected > 0), step


def test_local_p_centres_under_autocast_are_computed_in_float32():
    torch.manual_seed(0)
    attention = Attention("general", 8, 8, local="local-p", window=3)
    lengths = torch.tensor([300, 37])
    q = torch.randn(2, 6, 8)
    expected = attention.position_predictor(q, lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        centres = attention.position_predictor(q, lengths)  # the predictor alone: bfloat16
        H = torch.randn(2, 300, 8)
        mask = torch.arange(300) < lengths.unsqueeze(1)
        _, weights = attention(q, H, attention.precompute(H), mask)
    assert (centres - expected).abs().max() > 0.05  # bfloat16 alone would be off
    _, full = attention(q, H, attention.precompute(H), mask)
    assert torch.equal(weights > 0, full > 0)  # the same windows as in float32


def test_a_gpu_without_bfloat16_is_refused_by_name(monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    class OnTheGpu(torch.nn.Module):  # the trainer reads the device of the first parameter
        def parameters(self, recurse=True):
            return iter([SimpleNamespace(device=torch.device("cuda:0"))])

    monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
    # torch's default counts emulation as support (every CUDA GPU "has" bfloat16 then): only a
    # check that asks for native support can refuse one
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")
    with pytest.raises(ValueError, match="precision='bfloat16'.*Tesla T4"):
        training.Trainer(OnTheGpu(), [], [], decode=list, precision="bfloat16")


@pytest.mark.parametrize("parallel", [False, True], ids=["stepped", "parallel"])
def test_an_lstm_runs_in_float32_where_the_cpu_has_no_bfloat16_lstm(parallel, monkeypatch):
    """On an AVX2 CPU oneDNN has no bfloat16 LSTM, and autocast's bfloat16 made nn.LSTM raise
    ("could not create a primitive descriptor"): mixed precision then failed for every LSTM
    model. There the LSTM runs in float32 (forced here, so that every host runs this path); the
    rest of the model stays in bfloat16, and fit and predict work."""
    monkeypatch.setattr(rnn, "cpu_lstm_in_bfloat16", lambda: False)
    kinds = []
    original = nn.LSTM.forward

    def spy(self, x, hx=None):
        kinds.append((x.dtype, torch.is_autocast_enabled("cpu")))
        return original(self, x, hx)

    monkeypatch.setattr(nn.LSTM, "forward", spy)
    X, y = make_reversal(48, 2, 6, random_state=1)
    params = dict(decoder="luong", cell="lstm", hidden_size=16, embedding_dim=8, max_steps=3)
    model = Seq2Seq(**params, input_feeding=not parallel, precision="bfloat16")
    model.set_params(early_stopping=False, random_state=0).fit(X, y)
    assert kinds and set(kinds) == {(torch.float32, False)}
    assert np.isfinite(model.history_[-1]["train_loss"])
    assert len(model.predict(X[:5])) == 5


def test_the_bfloat16_lstm_probe_leaves_the_random_state_alone():
    """The probe builds an LSTM (random weights) the first time a fit asks: it must not move
    torch's generator, or a seeded fit would depend on whether the probe had run before."""
    rnn.cpu_lstm_in_bfloat16.cache_clear()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert rnn.cpu_lstm_in_bfloat16() in (True, False)
    assert torch.equal(torch.rand(3), expected)


def test_call_rnn_matches_the_rnn_outside_autocast():
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 5, batch_first=True)
    x, state = torch.randn(2, 3, 4), (torch.randn(1, 2, 5), torch.randn(1, 2, 5))
    expected, (h, c) = lstm(x, state)
    outputs, (h2, c2) = rnn.call_rnn(lstm, x, state)
    assert torch.equal(outputs, expected) and torch.equal(h, h2) and torch.equal(c, c2)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_the_bfloat16_lstm_probe_answers_the_same_without_gradients(mode):
    """The probe runs a backward pass: under no_grad it failed on every CPU, and its cached
    False then ran every LSTM of the process in float32, AMX hosts included."""
    rnn.cpu_lstm_in_bfloat16.cache_clear()
    expected = rnn.cpu_lstm_in_bfloat16()
    rnn.cpu_lstm_in_bfloat16.cache_clear()
    with mode():
        assert rnn.cpu_lstm_in_bfloat16() == expected
    rnn.cpu_lstm_in_bfloat16.cache_clear()
    with pytest.MonkeyPatch.context() as patch:  # a CPU that runs it: the probe must say so
        patch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
        with mode():
            assert rnn.cpu_lstm_in_bfloat16() is True
    rnn.cpu_lstm_in_bfloat16.cache_clear()
