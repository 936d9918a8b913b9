"""Local attention (Luong et al., 2015): a window of half-width ``D`` around a source position.

- local-m (monotonic): ``p_i = min(i, S - 1)`` for target position ``i``;
- local-p (predictive): ``p_i = S * sigmoid(v_p . tanh(s_i @ W_p))``, and the weights inside the
  window are multiplied by ``exp(-(j - p_i)^2 / (2 sigma^2))``, ``sigma = D / 2``.

``S`` is each item's real source length (never the padded one). Every function here is free of
Python branching on tensor values, so the attention module stays traceable for ONNX export.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

LOCAL_KINDS = ("local-m", "local-p")


def monotonic_positions(step: int | Tensor, num_steps: int, lengths: Tensor) -> Tensor:
    """local-m centres ``p_i = min(i, S - 1)`` for ``i = step, ..., step + num_steps - 1``.

    Parameters
    ----------
    step : int or 0-d Tensor
        Target position of the first query.
    num_steps : int
        Number of consecutive target positions ``T_y``.
    lengths : Tensor
        Real source lengths ``S`` ``(B,)``.

    Returns
    -------
    Tensor
        Centres ``(B, T_y)``, as ``lengths``' integer dtype.
    """
    i = step + torch.arange(num_steps, device=lengths.device, dtype=lengths.dtype)  # (T_y,)
    return torch.minimum(i.unsqueeze(0), (lengths - 1).unsqueeze(1))  # (B, T_y)


def window_mask(centres: Tensor, num_positions: int, window: int) -> Tensor:
    """``True`` where ``|j - p_i| <= D``: ``centres (B, T_y) -> (B, T_y, T)``."""
    j = torch.arange(num_positions, device=centres.device, dtype=centres.dtype)  # (T,)
    return (j - centres.unsqueeze(-1)).abs() <= window  # (B, T_y, T)


def gaussian_log_weights(centres: Tensor, num_positions: int, window: int) -> Tensor:
    r"""Log of the local-p Gaussian, :math:`-(j - p_i)^2 / (2 \sigma^2)`, ``sigma = D / 2``.

    ``centres (B, T_y)`` float -> ``(B, T_y, T)``.
    """
    sigma = window / 2.0
    j = torch.arange(num_positions, device=centres.device, dtype=centres.dtype)  # (T,)
    return -((j - centres.unsqueeze(-1)) ** 2) / (2.0 * sigma**2)  # (B, T_y, T)


class PositionPredictor(nn.Module):
    r"""local-p centres :math:`p_i = S \, \sigma(v_p \cdot \tanh(s_i W_p))`.

    Parameters
    ----------
    query_size : int
        Size ``d_s`` of the decoder state.
    hidden_size : int
        Size of ``v_p``; ``W_p`` is ``(d_s, hidden_size)``.
    """

    def __init__(self, query_size: int, hidden_size: int) -> None:
        super().__init__()
        self.W_p = nn.Parameter(torch.empty(query_size, hidden_size))
        self.v_p = nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        d_s, n = self.W_p.shape
        nn.init.uniform_(self.W_p, -1.0 / math.sqrt(d_s), 1.0 / math.sqrt(d_s))
        nn.init.uniform_(self.v_p, -1.0 / math.sqrt(n), 1.0 / math.sqrt(n))

    def forward(self, s: Tensor, lengths: Tensor) -> Tensor:
        """Centres ``(B, T_y)`` in ``[0, S]`` from queries ``s (B, T_y, d_s)``, ``lengths (B,)``."""
        gate = torch.sigmoid(torch.tanh(s @ self.W_p) @ self.v_p)  # (B, T_y)
        return lengths.to(s.dtype).unsqueeze(1) * gate  # (B, T_y)
