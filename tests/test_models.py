"""Tests for skattn.models: the config, the encoder, the decoders and the Seq2SeqModule seam."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
import torch
from torch import nn

from skattn.attention import SCORE_FUNCTIONS
from skattn.models import OPTIONS, ModelConfig, Seq2SeqModule, reverse_within_length
from skattn.models.encoder import BiRNNEncoder
from skattn.models.positions import POSITIONS
from skattn.models.rnn import RNN_CLASSES

CELLS = ["gru", "lstm"]
DECODERS = ["bahdanau", "luong"]
ATTENTIONS = ["global", "local-m", "local-p", "none"]
SCORERS = ["dot", "general", "additive", "scaled_dot"]
SRC_VOCAB, TGT_VOCAB = 13, 11


def make_model(**overrides) -> Seq2SeqModule:
    torch.manual_seed(0)
    config = dict(embedding_dim=6, hidden_size=8, num_layers=2, window=1, scorer="general")
    config.update(overrides)
    return Seq2SeqModule(ModelConfig(SRC_VOCAB, TGT_VOCAB, **config)).eval()


def padded(items: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, items))
    ids = torch.tensor([item + [pad] * (width - len(item)) for item in items])
    return ids, torch.tensor([len(item) for item in items])


SOURCES = [[4, 5, 6, 7, 8, 2], [9, 10, 2], [5, 2], [2]]
TARGETS = [[1, 4, 5, 6], [1, 7, 8], [1, 9], [1]]


def run_steps(model, src, lengths, tgt_in, temperature=1.0):
    """Teacher forcing by calling ``step`` in a loop: log-probs (B, T_y, V), weights (B, T_y, T)."""
    memory, keys, mask, state = model.encode(src, lengths)
    log_probs, weights = [], []
    for i in range(tgt_in.shape[1]):
        lp, state, w = model.step(
            tgt_in[:, i], state, memory, keys, mask, torch.tensor(temperature), torch.tensor(i)
        )
        log_probs.append(lp)
        weights.append(w)
    return torch.stack(log_probs, 1), torch.stack(weights, 1)


# ----------------------------------------------------------------------------- encoder


def test_reverse_within_length_reverses_real_positions_only():
    x = torch.arange(1, 9, dtype=torch.float32).view(2, 4, 1)  # [[1, 2, 3, 4], [5, 6, 7, 8]]
    out = reverse_within_length(x, torch.tensor([4, 2]))
    assert out.squeeze(-1).tolist() == [[4, 3, 2, 1], [6, 5, 7, 8]]
    assert torch.equal(reverse_within_length(out, torch.tensor([4, 2])), x)


@pytest.mark.parametrize("cell", CELLS)
def test_encoder_states_do_not_depend_on_padding(cell):
    torch.manual_seed(0)
    encoder = BiRNNEncoder(SRC_VOCAB, 6, 8, num_layers=2, dropout=0.0, cell=cell).eval()
    item = [4, 5, 6, 2]
    alone = encoder(*padded([item]))
    # the item padded inside a longer batch, with non-zero garbage ids in its padding
    src, lengths = padded([[7] * 9, item, [3, 2]])
    src[1, len(item) :] = 9
    batched = encoder(src, lengths)
    S = len(item)
    torch.testing.assert_close(batched.annotations[1, :S], alone.annotations[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(batched.forward_last[1], alone.forward_last[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(
        batched.backward_first[1], alone.backward_first[0], atol=1e-6, rtol=0
    )
    assert torch.all(batched.annotations[1, S:] == 0)
    assert batched.mask[1].tolist() == [True] * S + [False] * (9 - S)


@pytest.mark.parametrize("cell", CELLS)
def test_encoder_matches_torch_bidirectional_rnn(cell):
    """On an unpadded item the encoder is exactly ``nn.GRU/LSTM(bidirectional=True)``."""
    torch.manual_seed(0)
    encoder = BiRNNEncoder(SRC_VOCAB, 6, 8, num_layers=2, dropout=0.0, cell=cell).eval()
    reference = {"gru": nn.GRU, "lstm": nn.LSTM}[cell](
        6, 8, num_layers=2, bidirectional=True, batch_first=True
    )
    with torch.no_grad():
        for layer in range(2):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                fwd = getattr(encoder.forward_rnns[layer], f"{name}_l0")
                bwd = getattr(encoder.backward_rnns[layer], f"{name}_l0")
                getattr(reference, f"{name}_l{layer}").copy_(fwd)
                getattr(reference, f"{name}_l{layer}_reverse").copy_(bwd)
    src, lengths = padded([[4, 5, 6, 7, 2]])
    out = encoder(src, lengths)
    expected, final = reference(encoder.embedding(src))
    final_h = final[0] if cell == "lstm" else final  # (2 * L, B, H): l0 fwd, l0 bwd, l1 fwd, ...
    torch.testing.assert_close(out.annotations, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.forward_last[0], final_h[0::2, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.backward_first[0], final_h[1::2, 0], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- the seam

COMBINATIONS = list(itertools.product(CELLS, DECODERS, ATTENTIONS, [False, True]))


@pytest.mark.parametrize("cell, decoder, attention, input_feeding", COMBINATIONS)
def test_forward_equals_step_loop(cell, decoder, attention, input_feeding):
    # rotate the scorers through the combinations; every scorer meets every decoder and kind
    index = COMBINATIONS.index((cell, decoder, attention, input_feeding))
    scorer = SCORERS[index % len(SCORERS)]
    model = make_model(
        cell=cell, decoder=decoder, attention=attention, input_feeding=input_feeding, scorer=scorer
    )
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    with torch.no_grad():
        logits, weights = model(src, lengths, tgt_in)
        step_log_probs, step_weights = run_steps(model, src, lengths, tgt_in)
        stepwise_logits, _ = model.forward_stepwise(src, lengths, tgt_in)
    torch.testing.assert_close(logits.log_softmax(-1), step_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, step_weights, atol=1e-5, rtol=0)
    torch.testing.assert_close(stepwise_logits, logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "decoder, attention, scorer", list(itertools.product(DECODERS, ATTENTIONS, SCORERS))
)
def test_every_configuration_runs_with_valid_weights(decoder, attention, scorer):
    model = make_model(decoder=decoder, attention=attention, scorer=scorer, num_layers=1)
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    logits, weights = model(src, lengths, tgt_in)
    B, T = src.shape
    assert logits.shape == (B, tgt_in.shape[1], TGT_VOCAB)
    assert weights.shape == (B, tgt_in.shape[1], T)
    assert torch.isfinite(logits).all()
    mask = (torch.arange(T) < lengths[:, None]).unsqueeze(1).expand_as(weights)  # (B, T_y, T)
    assert torch.all(weights[~mask] == 0)
    assert torch.all(weights >= 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, tgt_in.shape[1]))


@pytest.mark.parametrize(
    "cell, decoder, input_feeding, names",
    [
        ("gru", "bahdanau", True, ("hidden",)),
        ("lstm", "bahdanau", True, ("hidden", "cell")),
        ("gru", "luong", False, ("hidden",)),
        ("gru", "luong", True, ("hidden", "feed")),
        ("lstm", "luong", True, ("hidden", "cell", "feed")),
    ],
)
def test_encode_and_step_shapes(cell, decoder, input_feeding, names):
    model = make_model(cell=cell, decoder=decoder, input_feeding=input_feeding, num_layers=3)
    assert model.state_names == names
    src, lengths = padded(SOURCES)
    B, T = src.shape
    memory, keys, mask, state = model.encode(src, lengths)
    assert memory.shape == (B, T, 8) and keys.shape[:2] == (B, T)
    assert mask.dtype == torch.bool and mask.sum(1).tolist() == lengths.tolist()
    expected = {"hidden": (B, 3, 8), "cell": (B, 3, 8), "feed": (B, 8)}
    assert [tuple(t.shape) for t in state] == [expected[name] for name in names]
    log_probs, new_state, weights = model.step(
        torch.ones(B, dtype=torch.int64), state, memory, keys, mask, torch.tensor(1.0),
        torch.tensor(0),
    )  # fmt: skip
    assert log_probs.shape == (B, TGT_VOCAB) and weights.shape == (B, T)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(B))
    assert [t.shape for t in new_state] == [t.shape for t in state]


@pytest.mark.parametrize("cell, decoder", list(itertools.product(CELLS, DECODERS)))
def test_step_commutes_with_row_selection(cell, decoder):
    """Selecting rows (beam expansion, dropping finished items) before or after a step agrees."""
    model = make_model(cell=cell, decoder=decoder, attention="local-p")
    src, lengths = padded(SOURCES)
    memory, keys, mask, state = model.encode(src, lengths)
    args = (torch.tensor(1.0), torch.tensor(2))
    y = torch.tensor([4, 5, 6, 7])
    with torch.no_grad():
        log_probs, new_state, weights = model.step(y, state, memory, keys, mask, *args)
        rows = torch.tensor([2, 0, 0, 3])
        pick = lambda t: t.index_select(0, rows)  # noqa: E731
        sel_lp, sel_state, sel_w = model.step(
            pick(y), tuple(map(pick, state)), pick(memory), pick(keys), pick(mask), *args
        )
    torch.testing.assert_close(sel_lp, pick(log_probs), atol=1e-6, rtol=0)
    torch.testing.assert_close(sel_w, pick(weights), atol=1e-6, rtol=0)
    for got, full in zip(sel_state, new_state, strict=True):
        torch.testing.assert_close(got, pick(full), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "cell, decoder, attention", [("gru", "bahdanau", "global"), ("lstm", "luong", "local-m")]
)
@pytest.mark.parametrize("input_feeding", [False, True])
def test_outputs_do_not_depend_on_the_rest_of_the_batch(cell, decoder, attention, input_feeding):
    model = make_model(cell=cell, decoder=decoder, attention=attention, input_feeding=input_feeding)
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    with torch.no_grad():
        logits, weights = model(src, lengths, tgt_in)
        step_lp, _ = run_steps(model, src, lengths, tgt_in)
        for b, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
            one_src, one_len = padded([source])
            one_tgt, _ = padded([target])
            alone_logits, alone_weights = model(one_src, one_len, one_tgt)
            alone_lp, _ = run_steps(model, one_src, one_len, one_tgt)
            S, n = len(source), len(target)
            torch.testing.assert_close(logits[b, :n], alone_logits[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(weights[b, :n, :S], alone_weights[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(step_lp[b, :n], alone_lp[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "decoder, input_feeding, attention, loops",
    [
        ("luong", False, "global", False),
        ("luong", False, "local-p", False),
        ("luong", True, "global", True),
        ("bahdanau", False, "global", True),
    ],
)
def test_only_sequential_decoders_loop_over_time(decoder, input_feeding, attention, loops):
    """Luong without input feeding never calls the per-step ``recur`` in teacher forcing."""
    model = make_model(decoder=decoder, input_feeding=input_feeding, attention=attention)
    calls = []
    recur = model.decoder.recur
    model.decoder.recur = lambda *args: calls.append(1) or recur(*args)
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    model(src, lengths, tgt_in)
    assert len(calls) == (tgt_in.shape[1] if loops else 0)


@pytest.mark.parametrize("decoder, reads_forward", [("bahdanau", False), ("luong", True)])
def test_initial_state_sources(decoder, reads_forward):
    """Bahdanau starts from the backward encoder only; Luong from both final states."""
    model = make_model(decoder=decoder, num_layers=1)
    src, lengths = padded(SOURCES)
    with torch.no_grad():
        before = model.encode(src, lengths)[3][0]
        model.encoder.forward_rnns[0].weight_hh_l0.add_(0.5)
        after = model.encode(src, lengths)[3][0]
    assert torch.allclose(before, after) != reads_forward


# ----------------------------------------------------------------------------- attention kinds


@pytest.mark.parametrize("decoder", DECODERS)
def test_no_attention_reads_only_the_last_real_annotation(decoder):
    model = make_model(decoder=decoder, attention="none")
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    _, weights = model(src, lengths, tgt_in)
    last = lengths - 1
    expected = torch.nn.functional.one_hot(last, src.shape[1]).float()  # (B, T)
    torch.testing.assert_close(weights, expected.unsqueeze(1).expand_as(weights))


@pytest.mark.parametrize("decoder", DECODERS)
def test_local_m_window_is_centred_on_the_target_position(decoder):
    window = 1
    model = make_model(decoder=decoder, attention="local-m", window=window, input_feeding=False)
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    _, weights = model(src, lengths, tgt_in)  # (B, T_y, T)
    B, T_y, T = weights.shape
    centres = torch.minimum(torch.arange(T_y)[None, :], lengths[:, None] - 1)  # (B, T_y)
    outside = (torch.arange(T)[None, None, :] - centres[..., None]).abs() > window  # (B, T_y, T)
    assert torch.all(weights[outside] == 0)
    assert torch.all(weights[~outside & (torch.arange(T) < lengths[:, None, None])] > 0)


def test_temperature_sharpens_attention():
    model = make_model(decoder="luong", scorer="dot", attention="global")
    src, lengths = padded(SOURCES)
    memory, keys, mask, state = model.encode(src, lengths)
    y = torch.ones(len(SOURCES), dtype=torch.int64)

    def entropy(temperature):
        _, _, w = model.step(
            y, state, memory, keys, mask, torch.tensor(temperature), torch.tensor(0)
        )
        return -(w * w.clamp_min(1e-30).log()).sum(-1)  # (B,)

    cold, warm = entropy(0.05), entropy(20.0)
    real = lengths > 1  # a length-1 source has one-hot weights at any temperature
    assert torch.all(cold[real] < warm[real])


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize("decoder, cell", [("bahdanau", "gru"), ("luong", "lstm")])
def test_every_parameter_gets_a_gradient(decoder, cell):
    model = make_model(decoder=decoder, cell=cell, attention="local-p", scorer="additive").train()
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    logits, _ = model(src, lengths, tgt_in)
    logits.logsumexp(-1).sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_learns_to_reverse_short_sequences():
    """A few hundred Adam steps on 3-token reversal drive the teacher-forced loss near zero."""
    torch.manual_seed(0)
    sizes = dict(embedding_dim=16, hidden_size=32)
    model = Seq2SeqModule(
        ModelConfig(8, 8, **sizes, decoder="luong", scorer="dot", input_feeding=False)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        tokens = torch.randint(4, 8, (32, 3))
        src = torch.cat([tokens, torch.full((32, 1), 2)], 1)  # tokens + EOS
        tgt_in = torch.cat([torch.ones(32, 1, dtype=torch.int64), tokens.flip(1)], 1)
        tgt_out = torch.cat([tokens.flip(1), torch.full((32, 1), 2)], 1)
        logits, _ = model(src, torch.full((32,), 4), tgt_in)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 8), tgt_out.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


# ----------------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    "name, value",
    [
        ("cell", "rnn"),
        ("decoder", "transformer"),
        ("attention", "sparse"),
        ("scorer", "concat"),
        ("scorer", None),
        ("hidden_size", 0),
        ("embedding_dim", 2.5),
        ("num_layers", 0),
        ("num_layers", True),
        ("dropout", 1.0),
        ("dropout", -0.1),
        ("dropout", float("nan")),
        ("window", 0),
        ("input_feeding", "yes"),
        ("num_heads", 3),
        ("attention_size", 0),
        ("source_vocab_size", 0),
        ("target_vocab_size", np.int64(-1)),
        ("window", 2**64),  # past the limits: an OverflowError inside torch before
        ("embedding_dim", 2**62),
        ("hidden_size", 2**40),
        ("num_layers", 1025),
        ("ffn_size", 2**40),
        ("max_positions", 2**40),
    ],
)
def test_bad_configuration_raises_value_error_naming_the_field(name, value):
    sizes = {"source_vocab_size": SRC_VOCAB, "target_vocab_size": TGT_VOCAB, "hidden_size": 8}
    with pytest.raises(ValueError, match=name):
        ModelConfig(**{**sizes, name: value})


def test_config_turns_numpy_scalars_into_python_values_and_is_json_safe():
    config = ModelConfig(
        np.int64(13),
        np.int32(11),
        hidden_size=np.int64(8),
        dropout=np.float64(0.25),
        input_feeding=np.True_,
        window=np.int16(2),
    )
    data = config.to_dict()
    assert set(data) == {field.name for field in dataclasses.fields(ModelConfig)}
    assert [type(data[k]) for k in ("source_vocab_size", "hidden_size", "window")] == [int] * 3
    assert type(data["dropout"]) is float and data["input_feeding"] is True
    assert ModelConfig.from_dict(json.loads(json.dumps(data))) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 16  # type: ignore[misc]


def test_config_from_dict_refuses_unknown_fields():
    data = {**ModelConfig(SRC_VOCAB, TGT_VOCAB).to_dict(), "hidden": 8}
    with pytest.raises(ValueError, match="'hidden'"):
        ModelConfig.from_dict(data)


def test_config_from_params_takes_the_fields_it_names_and_ignores_the_rest():
    params = {"hidden_size": 16, "scorer": "dot", "batch_size": 8, "beam_size": 3}
    config = ModelConfig.from_params(params, source_vocab_size=5, target_vocab_size=6)
    assert config == ModelConfig(5, 6, hidden_size=16, scorer="dot")


def test_options_are_the_registries_keys():
    assert set(OPTIONS["scorer"]) == set(SCORE_FUNCTIONS)
    assert set(OPTIONS["cell"]) == set(RNN_CLASSES)
    for name, values in [("decoder", DECODERS), ("attention", ATTENTIONS)]:
        assert list(OPTIONS[name]) == values + (["transformer"] if name == "decoder" else [])
        for value in values:
            config = ModelConfig(SRC_VOCAB, TGT_VOCAB, hidden_size=8, **{name: value})
            assert Seq2SeqModule(config).config is config
    assert OPTIONS["encoder"] == ("rnn", "transformer") and OPTIONS["positions"] == POSITIONS
    families = dict(encoder="transformer", decoder="transformer")  # tests/test_transformer.py
    for options in [dict(encoder="rnn"), families] + [
        dict(families, positions=p) for p in POSITIONS
    ]:
        config = ModelConfig(SRC_VOCAB, TGT_VOCAB, hidden_size=8, **options)
        assert Seq2SeqModule(config).config is config


def test_module_wants_a_config():
    with pytest.raises(TypeError, match="ModelConfig"):
        Seq2SeqModule({"source_vocab_size": SRC_VOCAB, "target_vocab_size": TGT_VOCAB})


def test_config_rebuilds_an_identical_module():
    model = make_model(decoder="luong", cell="lstm", attention="local-p", num_heads=2)
    clone = Seq2SeqModule(ModelConfig.from_dict(model.config.to_dict())).eval()
    clone.load_state_dict(model.state_dict())
    src, lengths = padded(SOURCES)
    tgt_in, _ = padded(TARGETS)
    torch.testing.assert_close(clone(src, lengths, tgt_in), model(src, lengths, tgt_in))
