"""Tests for the Transformer blocks: attention math, positions, the KV-cache seam, ONNX export."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from skattn import reference as R
from skattn.attention.self_attention import MultiHeadAttention, scaled_dot_product
from skattn.models import ModelConfig, Seq2SeqModule
from skattn.models.decoders import step_loop
from skattn.models.positions import LearnedPositions, SinusoidalPositions
from skattn.models.transformer import TransformerEncoder
from skattn.tracing import EncoderModule, StepModule, to_onnx

SRC_VOCAB, TGT_VOCAB = 13, 11
SOURCES = [[4, 5, 6, 7, 8, 2], [9, 10, 2], [5, 2], [2]]
TARGETS = [[1, 4, 5, 6, 7], [1, 7, 8], [1, 9], [1]]


def padded(items: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, items))
    ids = torch.tensor([item + [0] * (width - len(item)) for item in items])
    return ids, torch.tensor([len(item) for item in items])


def make_model(**overrides) -> Seq2SeqModule:
    """A Transformer encoder and decoder, built as the estimator builds it."""
    torch.manual_seed(0)
    config = dict(hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2, dropout=0.0)
    config.update(overrides)
    families = dict(encoder="transformer", decoder="transformer")
    return Seq2SeqModule(ModelConfig(SRC_VOCAB, TGT_VOCAB, **families, **config)).eval()


def identity_attention(d: int) -> MultiHeadAttention:
    """One head with ``W^Q = W^K = W^V = W^O = I`` and no biases: ``self_attend``'s math."""
    attention = MultiHeadAttention(d, 1, bias=False).double()
    with torch.no_grad():
        for linear in (attention.W_q, attention.W_k, attention.W_v, attention.W_o):
            linear.weight.copy_(torch.eye(d, dtype=torch.float64))
    return attention


# ---------------------------------------------------------------- attention math


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_scaled_dot_product_matches_reference_self_attend(causal, need_weights):
    X = np.random.default_rng(0).normal(size=(2, 5, 4))
    mask = R.causal_mask(5) if causal else None
    Xt = torch.from_numpy(X).unsqueeze(1)  # (B, 1 head, n, d)
    mask_t = None if mask is None else torch.from_numpy(mask)
    out, weights = scaled_dot_product(Xt, Xt, Xt, mask_t, need_weights=need_weights)
    np.testing.assert_allclose(out.squeeze(1).numpy(), R.self_attend(X, mask), atol=1e-12)
    assert (weights is not None) == need_weights


@pytest.mark.parametrize("causal", [False, True])
def test_one_head_identity_projections_is_reference_self_attend(causal):
    X = np.random.default_rng(1).normal(size=(3, 6, 8))
    mask = R.causal_mask(6) if causal else None
    out, _ = identity_attention(8)(
        torch.from_numpy(X), mask=None if mask is None else torch.from_numpy(mask)[None]
    )
    np.testing.assert_allclose(out.detach().numpy(), R.self_attend(X, mask), atol=1e-12)


def test_seed_exercise_dot_product_by_hand():
    # Seed 001, Exercise 1: h = (1,0), (0,1), (1,1), s = (2,0): weights (0.468, 0.063, 0.468),
    # context (0.937, 0.532). Plain dot scores = scaled scores at temperature 1 / sqrt(d).
    H = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]], dtype=torch.float64)
    s = torch.tensor([[[[2.0, 0.0]]]], dtype=torch.float64)
    for q, temperature in [(s * math.sqrt(2), 1.0), (s, 1 / math.sqrt(2))]:
        context, weights = scaled_dot_product(q, H, H, temperature=temperature, need_weights=True)
        np.testing.assert_allclose(weights.flatten(), [0.468, 0.063, 0.468], atol=5e-4)
        np.testing.assert_allclose(context.flatten(), [0.937, 0.532], atol=5e-4)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_grouped_query_attention_matches_numpy(num_kv_heads):
    torch.manual_seed(0)
    B, T, D, heads = 2, 5, 16, 4
    attention = MultiHeadAttention(D, heads, num_kv_heads).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, :]  # (B, 1, T)
    out, weights = attention(x, mask=mask, need_weights=True)

    def project(linear):
        return x.numpy() @ linear.weight.detach().numpy().T + linear.bias.detach().numpy()

    q, k, v = (project(linear) for linear in (attention.W_q, attention.W_k, attention.W_v))
    d, rep = D // heads, heads // num_kv_heads
    heads_out = []
    for h in range(heads):
        g = h // rep  # the key / value head this query head shares
        q_h = q[..., h * d : (h + 1) * d]  # (B, T, d)
        k_h, v_h = k[..., g * d : (g + 1) * d], v[..., g * d : (g + 1) * d]
        w_h = R.masked_softmax(q_h @ k_h.transpose(0, 2, 1) / np.sqrt(d), mask.numpy())
        np.testing.assert_allclose(weights[:, h].detach().numpy(), w_h, atol=1e-12)
        heads_out.append(w_h @ v_h)
    expected = np.concatenate(heads_out, -1) @ attention.W_o.weight.detach().numpy().T
    expected += attention.W_o.bias.detach().numpy()
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-12)


def test_multi_query_equals_num_heads_copies_of_one_kv_head():
    torch.manual_seed(0)
    D, heads = 16, 4
    mqa = MultiHeadAttention(D, heads, num_kv_heads=1)
    mha = MultiHeadAttention(D, heads)
    with torch.no_grad():
        for name in ("W_q", "W_o"):
            getattr(mha, name).load_state_dict(getattr(mqa, name).state_dict())
        for name in ("W_k", "W_v"):
            getattr(mha, name).weight.copy_(getattr(mqa, name).weight.repeat(heads, 1))
            getattr(mha, name).bias.copy_(getattr(mqa, name).bias.repeat(heads))
    x, memory = torch.randn(2, 3, D), torch.randn(2, 5, D)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])[:, None, :]
    for args in [dict(), dict(memory=memory, mask=mask)]:
        torch.testing.assert_close(mqa(x, **args)[0], mha(x, **args)[0], atol=1e-6, rtol=0)
    assert mqa.kv_dim == D // heads and mha.kv_dim == D  # the cache shrinks num_heads-fold


def test_fused_and_written_out_paths_agree():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    mask = torch.rand(2, 1, 4, 6) > 0.3
    mask[..., 0] = True
    fused, _ = scaled_dot_product(q, k, v, mask)
    written, weights = scaled_dot_product(q, k, v, mask, need_weights=True)
    torch.testing.assert_close(fused, written, atol=1e-6, rtol=0)
    assert torch.all(weights[~mask.expand_as(weights)] == 0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(need_weights):
    torch.manual_seed(0)
    q = torch.randn(2, 2, 3, 4, requires_grad=True)
    k, v = torch.randn(2, 2, 5, 4, requires_grad=True), torch.randn(2, 2, 5, 4, requires_grad=True)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    mask[1, :, 2] = False  # item 1, query 2 may read nothing
    mask[0] = False  # item 0 reads nothing at all
    out, weights = scaled_dot_product(q, k, v, mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert torch.all(out[0] == 0) and torch.all(out[1, :, 2] == 0)
    if need_weights:
        assert torch.all(weights[0] == 0) and torch.allclose(
            weights[1, :, :2].sum(-1), torch.tensor(1.0)
        )
    out.sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
    assert torch.all(q.grad[0] == 0) and torch.all(k.grad[0] == 0)


def test_mismatched_head_counts_raise():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(16, 4, num_kv_heads=3)
    for heads, kv_heads, name in ((0, None, "num_heads"), (-4, None, "num_heads"), (4, 0, "kv")):
        with pytest.raises(ValueError, match=f"{name}.* must be an int >= 1"):
            MultiHeadAttention(16, heads, kv_heads)  # not a ZeroDivisionError or torch's error


# ---------------------------------------------------------------- positions


def test_sinusoidal_positions_formula():
    D, positions = 6, np.arange(7)
    expected = np.zeros((7, D))
    for i in range(D // 2):
        expected[:, 2 * i] = np.sin(positions / 10000 ** (2 * i / D))
        expected[:, 2 * i + 1] = np.cos(positions / 10000 ** (2 * i / D))
    got = SinusoidalPositions(D)(torch.arange(7))
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    assert SinusoidalPositions(5)(torch.arange(3)).shape == (3, 5)  # odd D: the last sin kept


def test_learned_positions_clamp_past_the_table():
    table = LearnedPositions(4, 8)
    got = table(torch.tensor([2, 3, 4, 100]))
    torch.testing.assert_close(got[1:], table.table.weight[3].expand(3, 8))


def test_self_attention_is_permutation_equivariant_only_without_positions():
    # Seed 000, Exercise 3.6d: shuffle the input words and the outputs shuffle the same way.
    src = torch.tensor([[4, 5, 6, 7, 8, 9]])
    lengths = torch.tensor([6])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    for positions, equivariant in [("none", True), ("sinusoidal", False), ("learned", False)]:
        torch.manual_seed(0)
        encoder = TransformerEncoder(SRC_VOCAB, 16, 2, 4, 2, 32, 0.0, positions, 16).eval()
        memory = encoder(src, lengths).annotations
        memory_permuted = encoder(src[:, perm], lengths).annotations
        assert torch.allclose(memory_permuted, memory[:, perm], atol=1e-5) == equivariant


# ---------------------------------------------------------------- encoder and decoder


def test_encoder_item_alone_equals_item_padded_in_a_batch():
    model = make_model()
    src, lengths = padded(SOURCES)
    memory, _, mask, _ = model.encode(src, lengths)
    assert torch.all(memory[~mask] == 0)
    for row, item in enumerate(SOURCES):
        alone, _, _, _ = model.encode(*padded([item]))
        torch.testing.assert_close(memory[row, : len(item)], alone[0], atol=1e-5, rtol=0)


def test_decoder_item_alone_equals_item_padded_in_a_batch():
    model = make_model()
    logits, weights = model(*padded(SOURCES), padded(TARGETS)[0])
    for row, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        alone_logits, alone_weights = model(*padded([source]), padded([target])[0])
        n, S = len(target), len(source)
        torch.testing.assert_close(logits[row, :n], alone_logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(weights[row, :n, :S], alone_weights[0], atol=1e-6, rtol=0)
        assert torch.all(weights[row, :, S:] == 0)  # no attention on source padding


def test_future_target_tokens_never_change_earlier_log_probs():
    model = make_model()
    src, lengths = padded(SOURCES[:2])
    tgt = padded(TARGETS[:2])[0]
    logits, _ = model(src, lengths, tgt)
    for k in range(1, tgt.shape[1]):
        changed = tgt.clone()
        changed[:, k] = (changed[:, k] + 3) % TGT_VOCAB
        new_logits, _ = model(src, lengths, changed)
        assert torch.equal(new_logits[:, :k], logits[:, :k])
        assert not torch.allclose(new_logits[:, k], logits[:, k])


def test_attention_rows_sum_to_one_and_temperature_sharpens_them():
    model = make_model()
    memory, keys, mask, state = model.encode(*padded(SOURCES))
    tgt = padded(TARGETS)[0]
    entropies = []
    for temperature in (1.0, 0.2):
        _, weights = model.decoder(tgt, state, memory, keys, mask, temperature)
        torch.testing.assert_close(weights.sum(-1), torch.ones(tgt.shape), atol=1e-6, rtol=0)
        entropies.append(-(weights * weights.clamp(min=1e-12).log()).sum(-1)[:3].mean())
    assert entropies[1] < entropies[0]


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(num_kv_heads=1, positions="learned", max_positions=3), dict(num_layers=1)],
)
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_step_with_cache_equals_teacher_forced_forward(overrides, temperature):
    model = make_model(**overrides)
    memory, keys, mask, state = model.encode(*padded(SOURCES))
    tgt = padded(TARGETS)[0]
    logits, weights = model.decoder(tgt, state, memory, keys, mask, temperature)
    step_logits, step_weights = step_loop(
        model.decoder.step, tgt, state, memory, keys, mask, torch.tensor(temperature)
    )
    torch.testing.assert_close(step_logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(step_weights, weights, atol=1e-5, rtol=0)


def test_cache_layout_grows_one_row_per_step_and_forward_continues_a_cache():
    model = make_model(num_layers=2, num_heads=4, num_kv_heads=2)
    src, lengths = padded(SOURCES)
    memory, keys, mask, state = model.encode(src, lengths)
    B, T = src.shape
    assert model.state_names == ("self_keys", "self_values")
    assert keys.shape == (B, T, 2 * 2 * 8)  # layers * (K, V) * kv_heads * d_head
    tgt = padded(TARGETS)[0]
    for i in range(3):
        assert [tuple(s.shape) for s in state] == [(B, 2, i, 8)] * 2
        _, state, _ = model.step(tgt[:, i], state, memory, keys, mask, 1.0, torch.tensor(i))
    empty = model.encode(src, lengths)[3]
    full, _ = model.decoder(tgt, empty, memory, keys, mask)
    rest, _ = model.decoder(tgt[:, 3:], state, memory, keys, mask)
    torch.testing.assert_close(rest, full[:, 3:], atol=1e-5, rtol=0)


def test_select_rows_of_the_cache_then_step_equals_stepping_those_rows_alone():
    model = make_model()
    memory, keys, mask, state = model.encode(*padded(SOURCES))
    tgt = padded(TARGETS)[0]
    temperature = torch.tensor(1.0)
    for i in range(2):
        _, state, _ = model.step(tgt[:, i], state, memory, keys, mask, temperature, torch.tensor(i))
    rows = torch.tensor([2, 0, 0, 1])  # beam expansion: rows may repeat

    def select(tensor):
        return tensor.index_select(0, rows)

    position = torch.tensor(2)
    picked = tuple(map(select, state)), *map(select, (memory, keys, mask))
    y = torch.tensor([5, 6, 7, 8])
    log_probs, new_state, weights = model.step(y, *picked, temperature, position)
    for n, row in enumerate(rows.tolist()):
        alone = (tuple(s[row : row + 1] for s in state), memory[row : row + 1], keys[row : row + 1])
        expected = model.step(y[n : n + 1], *alone, mask[row : row + 1], temperature, position)
        torch.testing.assert_close(log_probs[n], expected[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(weights[n], expected[2][0], atol=1e-6, rtol=0)
        for got, want in zip(new_state, expected[1], strict=True):
            torch.testing.assert_close(got[n], want[0], atol=1e-5, rtol=0)


def test_gradients_are_finite_and_a_few_steps_lower_the_loss():
    model = make_model(dropout=0.1).train()
    src, lengths = padded(SOURCES)
    tgt_in = padded(TARGETS)[0]
    tgt_out = torch.cat([tgt_in[:, 1:], torch.zeros(len(TARGETS), 1, dtype=torch.int64)], dim=1)
    tgt_out[torch.arange(len(TARGETS)), torch.tensor(list(map(len, TARGETS))) - 1] = 2  # EOS
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        logits, _ = model(src, lengths, tgt_in)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), tgt_out.flatten(), ignore_index=0
        )
        optimizer.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_heads=3), "num_heads"),
        (dict(num_kv_heads=3), "num_kv_heads"),
        (dict(positions="rotary"), "positions"),
        (dict(dropout=1.0), "dropout"),
        (dict(ffn_size=0), "ffn_size"),
    ],
)
def test_invalid_parameters_raise_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_model(**overrides)


# ---------------------------------------------------------------- ONNX


def _step_inputs(model: Seq2SeqModule, B: int, T: int, t: int, seed: int) -> tuple:
    """A random source batch (item 0 of length ``T``), encoded, then ``t`` cached steps."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    lengths[0] = T
    src = torch.randint(4, SRC_VOCAB, (B, T), generator=generator)
    src = src * (torch.arange(T) < lengths[:, None])
    temperature = torch.tensor(0.7)
    with torch.no_grad():
        memory, keys, mask, state = model.encode(src, lengths)
        for i in range(t):
            y = torch.randint(4, TGT_VOCAB, (B,), generator=generator)
            _, state, _ = model.step(y, state, memory, keys, mask, temperature, torch.tensor(i))
    y_prev = torch.randint(4, TGT_VOCAB, (B,), generator=generator)
    return (y_prev, *state, memory, keys, mask, temperature, torch.tensor(t))


def test_step_exports_to_onnx_with_dynamic_batch_source_and_cache_lengths():
    import onnxruntime as ort

    model = make_model(positions="learned", max_positions=8)
    inputs = ["y_prev", "self_keys", "self_values", "memory", "keys", "mask"]
    inputs += ["temperature", "position"]
    outputs = ["log_probs", "new_self_keys", "new_self_values", "weights"]
    step = StepModule(model, n_states=2)
    # Traced at the first step (t = 0, the encoder's empty cache), as skattn.export does
    # (to_onnx checks the graph and keeps the unused memory input).
    graph = to_onnx(step, _step_inputs(model, 3, 5, 0, seed=0), inputs, outputs)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    # (B, T, t): one of each, typical, and a cache longer than the learned table (clamped)
    for seed, (B, T, t) in enumerate([(1, 1, 0), (2, 7, 1), (4, 3, 4), (2, 9, 12)]):
        args = _step_inputs(model, B, T, t, seed)
        with torch.no_grad():
            expected = step(*args)
        got = session.run(None, {n: a.numpy() for n, a in zip(inputs, args, strict=True)})
        for name, actual, want in zip(outputs, got, expected, strict=True):
            assert actual.shape == tuple(want.shape), name
            np.testing.assert_allclose(actual, want.numpy(), atol=1e-5, err_msg=name)


def test_encoder_exports_to_onnx_with_an_empty_cache_output():
    import onnxruntime as ort

    model = make_model()
    names = ["memory", "keys", "mask", "self_keys", "self_values"]
    encode = EncoderModule(model)
    graph = to_onnx(encode, padded(SOURCES[1:3]), ["src", "src_lengths"], names)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    src, lengths = padded(SOURCES)
    got = session.run(None, {"src": src.numpy(), "src_lengths": lengths.numpy()})
    with torch.no_grad():
        expected = encode(src, lengths)
    for name, actual, want in zip(names, got, expected, strict=True):
        assert actual.shape == tuple(want.shape), name
        np.testing.assert_allclose(actual, want.numpy(), atol=1e-5, err_msg=name)
    assert got[3].shape == (len(SOURCES), 2, 0, 8)
