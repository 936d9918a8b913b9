"""skattn.models.dropout: torch's dropout, in distribution, with a cheaper mask on the CPU."""

from __future__ import annotations

import pytest
import torch

from skattn.models.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keeps_each_unit_with_probability_1_minus_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    out = Dropout(p).train()(torch.ones(1_000_003))  # not a multiple of 4
    kept = out != 0
    n = out.numel()
    sd = (p * (1 - p) / n) ** 0.5
    assert abs(float(kept.float().mean()) - (1 - p)) < 5 * sd
    assert torch.allclose(out[kept], torch.tensor(1 / (1 - p)), rtol=1e-4)
    assert abs(float(out.mean()) - 1.0) < 5 * sd / (1 - p)


def test_the_four_units_of_one_draw_are_independent():
    torch.manual_seed(1)
    kept = (Dropout(0.5).train()(torch.ones(4 * 250_000)) != 0).view(-1, 4).float()
    assert torch.allclose(kept.mean(0), torch.full((4,), 0.5), atol=0.005)
    # pairs of units from one 64-bit draw: P(both kept) = 1/4 when independent
    both = (kept[:, 0] * kept[:, 3]).mean()
    assert abs(float(both) - 0.25) < 0.005


def test_identity_in_eval_mode_and_at_p_0():
    x = torch.randn(3, 5)
    assert Dropout(0.4).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_seeded_masks_repeat_and_gradients_follow_the_mask():
    x = torch.randn(6, 7, requires_grad=True)
    torch.manual_seed(3)
    a = Dropout(0.5).train()(x)
    torch.manual_seed(3)
    b = Dropout(0.5).train()(x)
    assert torch.equal(a, b)
    a.sum().backward()
    torch.testing.assert_close(x.grad, (a != 0).float() * 2.0)


def test_bfloat16_input_stays_bfloat16_and_keeps_its_expectation():
    torch.manual_seed(2)
    x = (1 + torch.rand(4_000_000)).to(torch.bfloat16)  # in [1, 2]
    out = Dropout(0.1).train()(x)
    assert out.dtype == torch.bfloat16
    # Each kept unit is x / 0.9 rounded once, which is unbiased over varied x. Rounding the scale
    # first (1 / 0.9 -> 1.109375, as torch.nn.Dropout does in bfloat16) gives 0.99844 here.
    ratio = float(out.double().mean() / x.double().mean())
    assert abs(ratio - 1.0) < 0.0008, ratio
    assert Dropout(0.1).train()(torch.ones(0, 3)).shape == (0, 3)


def test_a_rate_within_2_to_the_minus_17_of_1_keeps_one_unit_in_65536():
    torch.manual_seed(4)
    out = Dropout(0.999999).train()(torch.ones(655_360))
    assert torch.isfinite(out).all()
    assert set(out.unique().tolist()) <= {0.0, 65536.0}
    assert 0 < int((out != 0).sum()) < 40  # about 10 expected


@pytest.mark.parametrize("p", [-0.1, 1.0, float("nan"), "0.5", True])
def test_refuses_a_rate_outside_0_to_1(p):
    with pytest.raises(ValueError, match=r"p must be a finite float in \[0\.0, 1\.0\)"):
        Dropout(p)
