"""The bidirectional RNN encoder: one annotation ``h_j = [h_j_fwd; h_j_bwd]`` per source token.

Padding never reaches a real position, and no packed sequence is used (they do not export to
ONNX). The forward direction is causal, so its states at real positions ignore the padding that
follows them; its final state is read at ``length - 1``. The backward direction runs a forward RNN
over each item reversed *within its own length* (padding stays at the end), and the result is
reversed back, so ``h_j_bwd`` has read exactly ``x_j .. x_{S-1}``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from skattn.models.dropout import Dropout
from skattn.models.rnn import call_rnn, make_rnn


class EncoderOutput(NamedTuple):
    """What the encoder hands to a decoder.

    Attributes
    ----------
    annotations : Tensor (B, T, 2 * hidden_size)
        ``[h_j_fwd; h_j_bwd]`` of the top layer, zero at padding positions.
    mask : Tensor (B, T) bool
        ``True`` at real positions.
    forward_last : Tensor (B, num_layers, hidden_size)
        Each layer's forward state at the last real position (``length - 1``).
    backward_first : Tensor (B, num_layers, hidden_size)
        Each layer's backward state at the first position (it has read the whole item).
    """

    annotations: torch.Tensor
    mask: torch.Tensor
    forward_last: torch.Tensor
    backward_first: torch.Tensor


def length_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Boolean mask ``(B, max_length)`` with ``True`` at positions ``t < lengths[b]``."""
    positions = torch.arange(max_length, device=lengths.device)  # (T,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)


def reverse_within_length(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each item's first ``lengths[b]`` positions; padding positions stay in place.

    ``out[b, t] = x[b, lengths[b] - 1 - t]`` for ``t < lengths[b]``, else ``x[b, t]``. The map is
    its own inverse, so applying it twice gives ``x`` back.

    Parameters
    ----------
    x : Tensor (B, T, D)
    lengths : Tensor (B,) int64

    Returns
    -------
    Tensor (B, T, D)
    """
    B, T, D = x.shape
    positions = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
    reversed_positions = lengths.unsqueeze(1) - 1 - positions  # (B, T)
    index = torch.where(positions < lengths.unsqueeze(1), reversed_positions, positions)  # (B, T)
    return x.gather(1, index.unsqueeze(-1).expand(B, T, D))  # (B, T, D)


class BiRNNEncoder(nn.Module):
    """A stack of bidirectional GRU / LSTM layers that never reads padding.

    Layer ``l + 1`` reads ``[h_fwd; h_bwd]`` of layer ``l`` (as ``nn.GRU(bidirectional=True)``
    does), with dropout between layers and on the embeddings.

    Parameters
    ----------
    vocab_size : int
        Source vocabulary size (id 0 is padding).
    embedding_dim, hidden_size, num_layers : int
        Sizes; each direction has ``hidden_size`` units, an annotation ``2 * hidden_size``.
    dropout : float
        Dropout on the embeddings and between layers.
    cell : {"gru", "lstm"}
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        cell: str,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.dropout = Dropout(dropout)
        input_sizes = [embedding_dim] + [2 * hidden_size] * (num_layers - 1)
        self.forward_rnns = nn.ModuleList(make_rnn(cell, n, hidden_size) for n in input_sizes)
        self.backward_rnns = nn.ModuleList(make_rnn(cell, n, hidden_size) for n in input_sizes)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor) -> EncoderOutput:
        """Encode a padded batch.

        Parameters
        ----------
        src : Tensor (B, T) int64
            Padded source ids.
        src_lengths : Tensor (B,) int64
            Real lengths, each at least 1 (the end-of-source marker).

        Returns
        -------
        EncoderOutput
        """
        B, T = src.shape
        mask = length_mask(src_lengths, T)  # (B, T)
        last = (src_lengths - 1).clamp(min=0).view(B, 1, 1)  # (B, 1, 1)
        x = self.dropout(self.embedding(src))  # (B, T, E)
        forward_last, backward_first = [], []
        for layer, (fwd_rnn, bwd_rnn) in enumerate(
            zip(self.forward_rnns, self.backward_rnns, strict=True)
        ):
            if layer > 0:
                x = self.dropout(x)
            h_fwd, _ = call_rnn(fwd_rnn, x)  # (B, T, H)
            h_bwd_reversed, _ = call_rnn(bwd_rnn, reverse_within_length(x, src_lengths))
            h_bwd = reverse_within_length(h_bwd_reversed, src_lengths)  # (B, T, H)
            H = h_fwd.shape[-1]
            forward_last.append(h_fwd.gather(1, last.expand(B, 1, H)).squeeze(1))  # (B, H)
            backward_first.append(h_bwd[:, 0])  # (B, H)
            x = torch.cat([h_fwd, h_bwd], dim=-1)  # (B, T, 2H)
        annotations = x * mask.unsqueeze(-1).to(x.dtype)  # (B, T, 2H), zero on padding
        return EncoderOutput(
            annotations=annotations,
            mask=mask,
            forward_last=torch.stack(forward_last, dim=1),  # (B, L, H)
            backward_first=torch.stack(backward_first, dim=1),  # (B, L, H)
        )
