r"""Dropout whose mask costs a quarter of the random numbers on the CPU.

.. math::

    \mathrm{Dropout}(x) = x \odot m / (1 - p), \qquad m_i \sim \mathrm{Bernoulli}(1 - p),

in training, the identity in eval mode (and so in every export). ``torch.nn.Dropout`` draws one
random number per unit; on the CPU torch's generator takes 2-5 ns for each (``bernoulli_``: 3.5
ms for a ``(64, 11, 1024)`` activation on one core), which made dropout 14-21 % of a Transformer
training step. Here one 64-bit draw gives four 16-bit numbers, and unit ``i`` is kept when its
number ``r_i`` (uniform over the 65,536 values of an int16) is at least
``round(p * 65536) - 32768``: exactly ``Bernoulli(1 - p')`` with ``p'`` the rate rounded to
1/65,536 (and at most 65,535/65,536), and the kept units are scaled by ``1 / (1 - p')``, so the
expectation is ``x`` (to float32's rounding of the scale; a bfloat16 unit, as autocast hands
dropout, is rounded once after its scaling, where ``torch.nn.Dropout`` rounds the scale itself:
1.109375 for 1/0.9). The draws come from torch's generator, so ``torch.manual_seed`` (a
``random_state``) makes them repeat. On other devices this is ``torch.nn.functional.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from skattn.core.checks import check_real

__all__ = ["Dropout"]

#: The 16-bit numbers a mask compares: their count, and the smallest.
_LEVELS, _LOWEST = 65536, -32768


class Dropout(nn.Module):
    """``torch.nn.Dropout`` (same ``p``, same behaviour in train and eval mode) with a cheaper
    mask on the CPU; ``p`` is rounded to a multiple of 1/65,536 there (see the module)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = check_real(p, "p", 0.0, 1.0, high_open=True)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        # p' * 65536, in [1, 65535]: a rate within 2^-17 of 1 drops all but 1/65,536
        dropped = min(round(self.p * _LEVELS), _LEVELS - 1)
        if dropped == 0:
            return x
        n = x.numel()
        words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)
        r = words.view(torch.int16)[:n].view(x.shape)  # (..., ) uniform over the int16 values
        keep = (r >= _LOWEST + dropped).to(x.dtype)  # Bernoulli(1 - p')
        scale = _LEVELS / (_LEVELS - dropped)  # 1 / (1 - p')
        if torch.finfo(x.dtype).bits >= 32:
            return x * keep.mul_(scale)  # one product backward
        # bfloat16 or float16: a Python float scale is applied in float32, each unit rounded once
        return (x * keep).mul_(scale)

    def extra_repr(self) -> str:
        return f"p={self.p}"
