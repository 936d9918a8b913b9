"""Recurrent building blocks shared by the encoder and the decoders.

Decoder states cross the module seam batch-first (``(B, num_layers, H)``) so that a beam or a
finished item is reordered with one ``index_select`` along axis 0; ``torch.nn`` RNNs want them
layer-first, so :func:`run_rnn` transposes on the way in and out.
"""

from __future__ import annotations

import torch
from torch import nn

RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM}
CELL_STATE_NAMES = {"gru": ("hidden",), "lstm": ("hidden", "cell")}


def make_rnn(
    cell: str, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0
) -> nn.RNNBase:
    """A batch-first unidirectional ``nn.GRU`` or ``nn.LSTM``.

    ``dropout`` applies between stacked layers only (as in ``torch.nn``).
    """
    return RNN_CLASSES[cell](
        input_size,
        hidden_size,
        num_layers=num_layers,
        dropout=dropout if num_layers > 1 else 0.0,
        batch_first=True,
    )


def run_rnn(
    rnn: nn.RNNBase, x: torch.Tensor, state: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run ``rnn`` over ``x (B, T, D)`` from a batch-first ``state`` of ``(B, L, H)`` tensors.

    Returns the top layer's outputs ``(B, T, H)`` and the new batch-first state.
    """
    layer_first = tuple(t.transpose(0, 1).contiguous() for t in state)  # (L, B, H) each
    initial = layer_first if isinstance(rnn, nn.LSTM) else layer_first[0]
    outputs, final = rnn(x, initial)  # (B, T, H)
    final = final if isinstance(final, tuple) else (final,)
    return outputs, tuple(t.transpose(0, 1) for t in final)  # (B, L, H) each


class LayerwiseLinear(nn.Module):
    """An independent affine map per layer: ``y[:, l] = x[:, l] @ W_l + b_l``.

    Maps encoder summaries ``(B, L, d_in)`` to initial decoder states ``(B, L, d_out)``.
    """

    def __init__(self, num_layers: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = in_features**-0.5
        self.weight = nn.Parameter(
            torch.empty(num_layers, in_features, out_features).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.zeros(num_layers, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bli,lio->blo", x, self.weight) + self.bias  # (B, L, d_out)
