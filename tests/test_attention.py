"""Tests of the torch attention: parity with the NumPy reference, gradients, invariances."""

import doctest
import math
import warnings

import numpy as np
import pytest
import torch

from skattn import reference as R
from skattn.attention import (
    SCORE_FUNCTIONS,
    AdditiveScorer,
    Attention,
    GeneralScorer,
    ScaledDotScorer,
    make_scorer,
    masked_softmax,
)
from skattn.attention import attention as attention_module
from skattn.attention import softmax as softmax_module
from skattn.attention.softmax import EXP_FLOOR
from skattn.models.decoders import FinalStateContext

LOCALS = [None, "local-m", "local-p"]
# (scorer, num_heads, query_size, key_size): dot needs d_s == d_h, the others may differ.
CONFIGS = [
    ("dot", 1, 6, 6),
    ("dot", 2, 6, 6),
    ("scaled_dot", 1, 6, 6),
    ("scaled_dot", 3, 6, 6),
    ("general", 1, 5, 4),
    ("general", 2, 6, 4),
    ("additive", 1, 5, 4),
]


def make_batch(lengths, T, query_size, key_size, num_steps=None, dtype=torch.float64, seed=0):
    """Random queries, annotations (garbage in the padding) and a prefix mask."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    q_shape = (B, query_size) if num_steps is None else (B, num_steps, query_size)
    s = torch.randn(q_shape, generator=g, dtype=dtype)
    H = torch.randn(B, T, key_size, generator=g, dtype=dtype) * 2
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return s, H, mask


def make_attention(scorer, num_heads, query_size, key_size, local, window=2, seed=0):
    torch.manual_seed(seed)
    return Attention(
        scorer,
        query_size,
        key_size,
        attention_size=3,
        num_heads=num_heads,
        local=local,
        window=window,
    ).double()


def reference_head_scores(att, s, H):
    """Per-head reference scores ``[(B, T)] * heads`` from ``skattn.reference``."""
    sc = att.scorer
    if isinstance(sc, AdditiveScorer):
        Wa = np.vstack([sc.W_a.detach().numpy(), sc.U_a.detach().numpy()])
        return [R.luong_scores(s, H, "concat", Wa=Wa, va=sc.v_a.detach().numpy())]
    h = att.num_heads
    dq, dk = s.shape[-1] // h, H.shape[-1] // h
    out = []
    for m in range(h):
        s_m = s[:, m * dq : (m + 1) * dq]
        if isinstance(sc, GeneralScorer):
            W_m = sc.W_a.detach().numpy()[m * dq : (m + 1) * dq]
            out.append(R.luong_scores(s_m, H, "general", Wa=W_m))
        else:
            e = R.luong_scores(s_m, H[..., m * dk : (m + 1) * dk], "dot")
            out.append(e / math.sqrt(dk) if isinstance(sc, ScaledDotScorer) else e)
    return out


def reference_attention(att, s, H, mask, temperature, step):
    """One query ``s (B, d_s)`` through ``skattn.reference``: ``(context, weights)``."""
    h = att.num_heads
    dk = H.shape[-1] // h
    contexts, weights = [], []
    for m, e in enumerate(reference_head_scores(att, s, H)):
        if att.local is None:
            w = R.masked_softmax(e, mask, temperature)
        elif att.local == "local-m":
            w = R.local_m_weights(e, mask, step, att.window, temperature)
        else:
            pp = att.position_predictor
            centres = R.local_p_positions(
                s, pp.W_p.detach().numpy(), pp.v_p.detach().numpy(), mask.sum(-1)
            )
            w = R.local_p_weights(e, mask, centres, att.window, temperature)
        contexts.append(np.einsum("bt,btd->bd", w, H[..., m * dk : (m + 1) * dk]))
        weights.append(w)
    return np.concatenate(contexts, axis=-1), np.mean(weights, axis=0)


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-h{c[1]}")
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_reference(config, local, seed):
    scorer, heads, d_s, d_h = config
    rng = np.random.default_rng(seed)
    T = int(rng.integers(4, 10))
    lengths = [T, int(rng.integers(1, T)), 1, 0]
    s, H, mask = make_batch(lengths, T, d_s, d_h, num_steps=5, seed=seed)
    att = make_attention(scorer, heads, d_s, d_h, local, seed=seed)
    temperature = float(rng.uniform(0.5, 2.0))
    with torch.no_grad():
        context, weights = att(s, H, att.precompute(H), mask, temperature)  # all steps
    for i in range(s.shape[1]):
        ref_c, ref_w = reference_attention(
            att, s[:, i].numpy(), H.numpy(), mask.numpy(), temperature, step=i
        )
        np.testing.assert_allclose(weights[:, i].numpy(), ref_w, rtol=0, atol=1e-10)
        np.testing.assert_allclose(context[:, i].numpy(), ref_c, rtol=0, atol=1e-10)
    # Rows sum to 1, padding and the out-of-window positions get exactly 0.
    np.testing.assert_allclose(weights[:3].sum(-1).numpy(), 1.0, atol=1e-12)
    assert torch.all(weights[~mask[:, None, :].expand_as(weights)] == 0)
    assert torch.all(weights[3] == 0) and torch.all(context[3] == 0)


def test_additive_scorer_matches_additive_attention():
    s, H, mask = make_batch([5, 2], 5, 3, 4)
    att = make_attention("additive", 1, 3, 4, None)
    sc = att.scorer
    with torch.no_grad():
        context, weights = att(s, H, att.precompute(H), mask)
    ref_c, ref_w = R.additive_attention(
        s.numpy(), H.numpy(), *(p.detach().numpy() for p in (sc.W_a, sc.U_a, sc.v_a)), mask.numpy()
    )
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-12)
    np.testing.assert_allclose(context.numpy(), ref_c, atol=1e-12)


def test_worked_examples_through_torch():
    # Additive: W_a = U_a = I, v_a = (1, 1); dot: s = (2, 0) against (1, 0), (0, 1), (1, 1).
    att = Attention("additive", 2, 2, attention_size=2).double()
    with torch.no_grad():
        att.scorer.W_a.copy_(torch.eye(2))
        att.scorer.U_a.copy_(torch.eye(2))
        att.scorer.v_a.fill_(1.0)
    H = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]], dtype=torch.float64)
    c, w = att(torch.tensor([[1.0, 0.0]], dtype=torch.float64), H, att.precompute(H), None)
    np.testing.assert_allclose(w[0].detach(), [0.319, 0.559, 0.122], atol=5e-4)
    np.testing.assert_allclose(c[0].detach(), [0.198, 0.559], atol=5e-4)
    att = Attention("dot", 2, 2)
    H = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    c, w = att(torch.tensor([[2.0, 0.0]]), H, att.precompute(H), None)
    np.testing.assert_allclose(w[0], [0.468, 0.063, 0.468], atol=5e-4)
    np.testing.assert_allclose(c[0], [0.937, 0.532], atol=5e-4)


class _AttendFromScratch(torch.nn.Module):
    """``precompute`` and ``forward`` in one call, so that gradients reach every parameter."""

    def __init__(self, att):
        super().__init__()
        self.att = att

    def forward(self, s, H, mask):
        return self.att(s, H, self.att.precompute(H), mask, temperature=0.8, step=1)


GRAD_CASES = [(c[0], c[1], None) for c in CONFIGS] + [
    ("dot", 1, "local-m"),
    ("general", 2, "local-p"),
    ("additive", 1, "local-p"),
]


@pytest.mark.parametrize("scorer, heads, local", GRAD_CASES)
def test_gradcheck(scorer, heads, local):
    d_s, d_h = (6, 6) if scorer in ("dot", "scaled_dot") else (4, 6)
    s, H, mask = make_batch([4, 2, 0], 4, d_s, d_h, seed=3)
    module = _AttendFromScratch(make_attention(scorer, heads, d_s, d_h, local, window=1, seed=3))
    names = [name for name, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]

    def f(s, H, *params):
        return torch.func.functional_call(
            module, dict(zip(names, params, strict=True)), (s, H, mask)
        )

    inputs = (s.requires_grad_(), H.requires_grad_(), *params)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-h{c[1]}")
def test_all_steps_equal_step_by_step(config, local):
    scorer, heads, d_s, d_h = config
    s, H, mask = make_batch([7, 3, 1], 7, d_s, d_h, num_steps=6, seed=4)
    att = make_attention(scorer, heads, d_s, d_h, local, seed=4)
    keys = att.precompute(H)
    with torch.no_grad():
        context, weights = att(s, H, keys, mask, temperature=0.7)
        for i in range(s.shape[1]):
            c_i, w_i = att(s[:, i], H, keys, mask, temperature=0.7, step=i)
            torch.testing.assert_close(c_i, context[:, i], rtol=0, atol=1e-12)
            torch.testing.assert_close(w_i, weights[:, i], rtol=0, atol=1e-12)


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-h{c[1]}")
def test_batch_invariance(config, local):
    """An item's output alone equals its output batched with longer, padded items."""
    scorer, heads, d_s, d_h = config
    att = make_attention(scorer, heads, d_s, d_h, local, seed=5).float()
    s, H, mask = make_batch([3, 9, 6], 9, d_s, d_h, num_steps=4, dtype=torch.float32, seed=5)
    with torch.no_grad():
        batched = att(s, H, att.precompute(H), mask, temperature=0.9)
        H0 = H[:1, :3]  # the first item alone, without padding
        alone = att(s[:1], H0, att.precompute(H0), mask[:1, :3], temperature=0.9)
        single = att(s[:1, 2], H0, att.precompute(H0), mask[:1, :3], temperature=0.9, step=2)
    torch.testing.assert_close(alone[0], batched[0][:1], rtol=0, atol=1e-6)
    torch.testing.assert_close(alone[1], batched[1][:1, :, :3], rtol=0, atol=1e-6)
    assert torch.all(batched[1][0, :, 3:] == 0)
    torch.testing.assert_close(single[0], batched[0][:1, 2], rtol=0, atol=1e-6)


def test_mask_none_means_no_padding():
    s, H, mask = make_batch([5, 5], 5, 4, 4)
    att = make_attention("general", 2, 4, 4, "local-p")
    keys = att.precompute(H)
    torch.testing.assert_close(att(s, H, keys, None), att(s, H, keys, mask), rtol=0, atol=0)


def test_precomputed_keys_are_the_query_independent_part():
    s, H, _ = make_batch([5], 5, 4, 6, dtype=torch.float32)
    general = make_scorer("general", 4, 6)
    torch.testing.assert_close(general.precompute(H), H @ general.W_a.T)
    additive = make_scorer("additive", 4, 6, attention_size=3)
    torch.testing.assert_close(additive.precompute(H), H @ additive.U_a)
    assert make_scorer("dot", 6, 6).precompute(H) is H
    assert general(s, general.precompute(H)).shape == (1, 1, 5)
    assert make_scorer("scaled_dot", 6, 6, num_heads=3)(H[:, 0], H).shape == (1, 3, 5)


# masked_softmax


def test_masked_softmax_matches_reference_and_accepts_tensor_temperature():
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(2, 3, 5, generator=g, dtype=torch.float64) * 5
    mask = torch.rand(2, 3, 5, generator=g) > 0.4
    expected = R.masked_softmax(scores.numpy(), mask.numpy(), 0.3)
    np.testing.assert_allclose(masked_softmax(scores, mask, 0.3).numpy(), expected, atol=1e-14)
    tensor_t = masked_softmax(scores, mask, torch.tensor(0.3, dtype=torch.float64))
    np.testing.assert_allclose(tensor_t.numpy(), expected, atol=1e-14)
    # A (T,) mask broadcasts over the batch.
    row_mask = torch.tensor([True, False, True, True, False])
    out = masked_softmax(scores, row_mask)
    assert torch.all(out[..., ~row_mask] == 0)
    torch.testing.assert_close(out[..., row_mask], torch.softmax(scores[..., row_mask], -1))


def test_masked_softmax_fully_masked_row_is_zero_with_finite_gradient():
    scores = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[False, False, False], [True, True, False]])
    weights = masked_softmax(scores, mask)
    assert torch.all(weights[0] == 0) and weights[1, 2] == 0
    (weights * torch.arange(3.0)).sum().backward()
    assert torch.all(torch.isfinite(scores.grad))
    assert torch.all(scores.grad[0] == 0) and scores.grad[1, 2] == 0


def test_masked_softmax_large_scores_and_temperature_limits():
    scores = torch.tensor([[1000.0, -1000.0, 999.0]])
    weights = masked_softmax(scores)
    assert torch.all(torch.isfinite(weights))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    scores = torch.tensor([[0.3, 2.0, -1.0, 1.9]], dtype=torch.float64)
    cold = masked_softmax(scores, temperature=1e-3)
    torch.testing.assert_close(cold, torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64))
    hot = masked_softmax(scores, temperature=1e6)
    torch.testing.assert_close(
        hot, torch.full((1, 4), 0.25, dtype=torch.float64), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("temperature", [1e-30, 1e-39, 1e-300, torch.tensor(1e-40)])
@pytest.mark.parametrize("local", LOCALS)
def test_tiny_temperatures_give_one_hot_rows_and_finite_gradients(temperature, local):
    # float32 scores / 1e-39 overflow: the max must come off before the division. Ties split.
    s, H, mask = make_batch([5, 3, 1], 5, 4, 4, num_steps=2, dtype=torch.float32, seed=3)
    att = make_attention("dot", 1, 4, 4, local, window=2).float()
    H.requires_grad_(True)
    _, weights = att(s, H, att.precompute(H), mask, temperature)  # (B, T_y, T)
    assert torch.all(torch.isfinite(weights))
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2))
    assert torch.all((weights == 0) | (weights == 1))
    assert torch.all(weights[~mask.unsqueeze(1).expand_as(weights)] == 0)
    weights.sum().backward()
    assert torch.all(torch.isfinite(H.grad))
    scores = torch.tensor([[1.0, 2.0, 3.0, 3.0]], requires_grad=True)
    tied = masked_softmax(scores, torch.tensor([[True, True, True, False]]), temperature)
    assert tied.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    expected = R.masked_softmax(scores.detach().double().numpy(), None, 1e-39)
    np.testing.assert_array_equal(masked_softmax(scores, None, temperature).detach(), expected)


# Errors


def test_unknown_scorer_lists_the_valid_names():
    with pytest.raises(ValueError, match="scorer must be one of") as info:
        make_scorer("bilinear", 4, 4)
    assert all(name in str(info.value) for name in SCORE_FUNCTIONS)
    with pytest.raises(ValueError, match="scorer must be one of"):
        Attention("Dot", 4, 4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scorer="additive", num_heads=2), "single head"),
        (dict(scorer="dot", num_heads=3), "not divisible"),
        (dict(scorer="general", num_heads=3, query_size=6), "key_size=4 is not divisible"),
        (dict(scorer="dot", query_size=6), "query_size == key_size"),
        (dict(scorer="dot", num_heads=0), "num_heads must be an int >= 1"),
        (dict(scorer="additive", attention_size=0), "attention_size"),
        (dict(scorer="dot", local="local"), "local must be None or one of"),
        (dict(scorer="dot", local="local-m", window=0), "window must be an int >= 1"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    kwargs = {"query_size": 4, "key_size": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        Attention(**kwargs)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(s=torch.zeros(2, 5)), r"s must have shape \(B, 4\).*got s of shape \(2, 5\)"),
        (dict(s=torch.zeros(2)), "got s of shape"),
        (
            dict(H=torch.zeros(3, 7, 6)),
            r"H must have shape.*R >= 1 rows of s per item \(2 rows.*got H of shape \(3, 7, 6\)",
        ),
        (dict(H=torch.zeros(2, 7, 5)), "H must have shape"),
        (dict(keys=torch.zeros(2, 6, 4)), r"keys must have shape \(2, 7, k\)"),
        (dict(keys=torch.zeros(2, 7, 5)), r"keys must have shape \(B, T, 4\)"),
        (dict(mask=torch.ones(2, 6, dtype=torch.bool)), r"got mask of shape \(2, 6\)"),
        (dict(mask=torch.ones(2, 7)), "mask must be a boolean tensor"),
        (dict(temperature=0.0), "temperature must be positive"),
    ],
)
def test_mismatched_inputs_name_the_tensor(change, match):
    att = Attention("general", 4, 6)
    inputs = dict(
        s=torch.zeros(2, 4),
        H=torch.zeros(2, 7, 6),
        keys=torch.zeros(2, 7, 4),
        mask=torch.ones(2, 7, dtype=torch.bool),
    )
    inputs.update(change)
    with pytest.raises(ValueError, match=match):
        att(**inputs)


def test_local_m_single_query_needs_step():
    att = Attention("dot", 4, 4, local="local-m")
    H = torch.zeros(1, 3, 4)
    with pytest.raises(ValueError, match="needs step"):
        att(torch.zeros(1, 4), H, att.precompute(H), None)


# Export


def test_onnx_export_with_dynamic_shapes_and_tensor_inputs(tmp_path):
    """Exported with 0-d temperature / step inputs, the graph agrees on other shapes.

    One graph holds global, local-m and local-p attention, so the export runs once.
    """
    ort = pytest.importorskip("onnxruntime")

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kinds = torch.nn.ModuleList(
                make_attention("general", 2, 4, 6, local).float() for local in LOCALS
            )

        def forward(self, s, H, mask, temperature, step):
            return tuple(
                out
                for att in self.kinds
                for out in att(s, H, att.precompute(H), mask, temperature, step)
            )

    module = Step().eval()
    names = ["s", "H", "mask", "temperature", "step"]

    def inputs(lengths, T, seed):
        s, H, mask = make_batch(lengths, T, 4, 6, dtype=torch.float32, seed=seed)
        return (s, H, mask, torch.tensor(0.7), torch.tensor(3))

    B, T = torch.export.Dim("B"), torch.export.Dim("T")
    path = tmp_path / "attention.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter (deprecations inside torch)
        torch.onnx.export(
            module,
            inputs([5, 2, 4], 5, 0),
            path,
            dynamo=True,
            input_names=names,
            dynamic_shapes=({0: B}, {0: B, 1: T}, {0: B, 1: T}, None, None),
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    args = inputs([9, 3, 1, 0], 9, 1)
    got = session.run(None, {n: a.numpy() for n, a in zip(names, args, strict=True)})
    with torch.no_grad():
        expected = module(*args)
    assert len(got) == len(expected) == 6
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("module", [attention_module, softmax_module])
def test_docstring_examples(module):
    torch.manual_seed(0)
    result = doctest.testmod(module, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.parametrize("local", LOCALS)
def test_jit_trace_generalises_without_tracer_warnings(local):
    """The legacy ONNX exporter traces with ``torch.jit.trace``: no value-dependent branch.

    A ``TracerWarning`` (a Python branch on a traced value) fails the test via
    ``filterwarnings = error``; the trace must then agree on other shapes and inputs.
    """

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.att = make_attention("general", 2, 4, 6, local).float()

        def forward(self, s, H, mask, temperature, step):
            return self.att(s, H, self.att.precompute(H), mask, temperature, step)

    module = Step().eval()
    s, H, mask = make_batch([5, 2, 4], 5, 4, 6, dtype=torch.float32, seed=0)
    with torch.no_grad():
        traced = torch.jit.trace(module, (s, H, mask, torch.tensor(0.7), torch.tensor(3)))
        s, H, mask = make_batch([9, 3, 1, 0], 9, 4, 6, dtype=torch.float32, seed=1)
        args = (s, H, mask, torch.tensor(1.3), torch.tensor(6))
        for got, expected in zip(traced(*args), module(*args), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_masked_softmax_drops_terms_below_the_exponent_floor():
    # exp of an exponent at or below EXP_FLOOR is never computed (onnxruntime's slow path):
    # the term is exactly 0, an error below exp(EXP_FLOOR) = 1.8e-35; terms above it are kept.
    assert math.exp(EXP_FLOOR) < 2e-35
    scores = torch.tensor([[0.0, EXP_FLOOR - 5.0, EXP_FLOOR + 5.0, 3.0]], dtype=torch.float64)
    for mask in (None, torch.tensor([[True, True, True, False]])):
        weights = masked_softmax(scores, mask)
        real = scores[0] if mask is None else scores[0, :3]
        expected = torch.softmax(real, dim=-1)
        assert weights[0, 1] == 0 and weights[0, 2] > 0
        torch.testing.assert_close(weights[0, : real.numel()], expected, atol=2e-35, rtol=1e-12)
    # Padding whose score is +inf or NaN gives 0 with a zero, finite gradient.
    scores = torch.tensor([[1.0, float("inf"), float("nan"), 0.5]], requires_grad=True)
    mask = torch.tensor([[True, False, False, True]])
    weights = masked_softmax(scores, mask)
    assert weights[0, 1] == 0 and weights[0, 2] == 0
    (weights * torch.arange(4.0)).sum().backward()
    assert torch.all(torch.isfinite(scores.grad)) and torch.all(scores.grad[0, 1:3] == 0)


def test_real_scores_of_inf_or_nan_give_what_the_reference_gives():
    """The reference read a real +inf or NaN score as masked (normalising over the others)
    where the module gave a row of zeros: the oracle and the module disagreed on what diverged
    weights give. Both give zeros now (the softmax is undefined there); -inf is never attended."""
    rows = [[1.0, math.inf, 0.0], [1.0, math.nan, 0.0], [1.0, -math.inf, 0.0], [0.5, 2.0, 1.0]]
    scores = np.array(rows)
    expected = R.masked_softmax(scores)
    np.testing.assert_array_equal(expected[:2], 0.0)
    np.testing.assert_allclose(expected[2], [math.e / (math.e + 1), 0.0, 1 / (math.e + 1)])
    actual = masked_softmax(torch.tensor(scores))
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_local_p_refuses_an_attention_size_that_is_not_a_positive_int(size):
    """Only the additive scorer checked attention_size: local-p's position predictor took 0 as
    the query size and failed on -3 and 2.5 inside torch."""
    for scorer in ("dot", "general", "additive"):
        with pytest.raises(ValueError, match="attention_size"):
            Attention(scorer, 8, 8, local="local-p", attention_size=size)
    predictor = Attention("dot", 8, 8, local="local-p", attention_size=5).position_predictor
    assert predictor.W_p.shape == (8, 5)


@pytest.mark.parametrize("local", [None, "local-m", "local-p"])
@pytest.mark.parametrize(
    "scorer, heads",
    [(s, h) for s in ("dot", "general", "scaled_dot") for h in (1, 2)] + [("additive", 1)],
)
def test_rows_per_item_read_their_items_memory(scorer, local, heads):
    """One step's ``B R`` queries, ``R`` per item (beam search's beams), against the item's one
    row of ``H``: the same contexts and weights as with ``H`` copied ``R`` times, local-m's
    window at the step's one position for all of an item's rows."""
    torch.manual_seed(0)
    B, T, R, d = 3, 7, 4, 8
    att = Attention(scorer, d, d, num_heads=heads, local=local, window=2)
    H = torch.randn(B, T, d)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, 2:] = False
    keys = att.precompute(H)
    s = torch.randn(B * R, d)
    context, weights = att(s, H, keys, mask, 0.8, 3)
    copies = [x.repeat_interleave(R, dim=0) for x in (H, keys, mask)]
    expected_context, expected_weights = att(s, *copies, 0.8, 3)
    assert context.shape == (B * R, d) and weights.shape == (B * R, T)
    torch.testing.assert_close(context, expected_context, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-6)
    assert not weights[R * 2 :, 2:].any()  # item 2's rows: its own padding


def test_final_state_context_rows_per_item():
    B, T, R, d = 2, 5, 3, 4
    H = torch.randn(B, T, d)
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    context, weights = FinalStateContext()(torch.randn(B * R, d), H, H, mask)
    assert torch.equal(context, H[[0, 0, 0, 1, 1, 1], [4, 4, 4, 1, 1, 1]])
    assert torch.equal(weights.argmax(dim=1), torch.tensor([4, 4, 4, 1, 1, 1]))


@pytest.mark.parametrize("rows, items", [(7, 3), (0, 2), (3, 0)])
def test_rows_not_a_multiple_of_items_are_refused(rows, items):
    att = Attention("general", 4, 6)
    H = torch.zeros(items, 7, 6)
    with pytest.raises(ValueError, match=rf"R >= 1 rows of s per item \({rows} rows"):
        att(torch.zeros(rows, 4), H, att.precompute(H), torch.ones(items, 7, dtype=torch.bool))


def test_no_items_no_rows():
    att = Attention("additive", 4, 6)
    H = torch.zeros(0, 7, 6)
    context, weights = att(torch.zeros(0, 4), H, att.precompute(H), None)
    assert context.shape == (0, 6) and weights.shape == (0, 7)
