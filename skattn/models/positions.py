"""Position encodings for the Transformer: sinusoidal (default), learned, or none.

See :mod:`skattn.models.transformer` for what happens past the longest training length.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["POSITIONS", "LearnedPositions", "SinusoidalPositions", "make_positions"]

POSITIONS = ("sinusoidal", "learned", "none")


class SinusoidalPositions(nn.Module):
    """``PE[p, 2i] = sin(p w_i)``, ``PE[p, 2i+1] = cos(p w_i)``, ``w_i = 10000^{-2i/D}``."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        exponents = torch.arange(0, d_model, 2, dtype=torch.float32) / d_model  # (ceil(D/2),)
        self.register_buffer("inv_freq", 10000.0**-exponents, persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """``positions (...) int64 -> (..., D)``; any position, no table."""
        angles = positions.unsqueeze(-1).to(self.inv_freq.dtype) * self.inv_freq  # (..., D/2)
        pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., 2 ceil(D/2))
        return pe[..., : self.d_model]  # (..., D)


class LearnedPositions(nn.Module):
    """A learned table ``P (max_positions, D)``; positions past it are clamped to the last row."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.table.weight, std=d_model**-0.5)

    def forward(self, positions: Tensor) -> Tensor:
        """``positions (...) int64 -> (..., D)``, ``P[min(p, max_positions - 1)]``."""
        return self.table(positions.clamp(max=self.max_positions - 1))


def make_positions(kind: str, d_model: int, max_positions: int) -> nn.Module | None:
    """The position encoding for ``positions=kind`` (``None`` for ``"none"``)."""
    if kind not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {kind!r}")
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model)
    return LearnedPositions(max_positions, d_model) if kind == "learned" else None
