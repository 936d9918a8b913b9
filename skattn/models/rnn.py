"""Recurrent building blocks shared by the encoder and the decoders.

Decoder states cross the module seam batch-first (``(B, num_layers, H)``) so that a beam or a
finished item is reordered with one ``index_select`` along axis 0; ``torch.nn`` RNNs want them
layer-first, so :func:`run_rnn` transposes on the way in and out.

Every recurrent layer runs through :func:`call_rnn`, which keeps mixed precision working on any
CPU: under ``torch.autocast`` in bfloat16, torch hands ``nn.LSTM`` to oneDNN in bfloat16, and on
a CPU without AVX-512 (an AVX2 one) oneDNN has no such LSTM and torch 2.13 raises "could not
create a primitive descriptor for the LSTM forward propagation primitive". There the LSTM runs
in float32, as torch runs ``nn.GRU`` under autocast everywhere.
"""

from __future__ import annotations

import functools

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


@functools.cache
def cpu_lstm_in_bfloat16() -> bool:
    """Whether this CPU runs ``nn.LSTM`` in bfloat16 under ``torch.autocast`` (forward and
    backward), found by trying once per process on a tiny LSTM, whatever the caller's gradient
    mode. torch's random state is left as it was, so a seeded fit is the same whenever this
    first runs."""
    # gradients on whatever the caller's mode (backward fails under no_grad on any CPU), and
    # the CPU named (a default device of CUDA would probe the GPU)
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
        lstm = nn.LSTM(4, 4, batch_first=True, device="cpu")
        x = torch.zeros(1, 2, 4, device="cpu", requires_grad=True)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outputs, _ = lstm(x)
            outputs.float().sum().backward()
        except RuntimeError:
            return False
    return True


def _lstm_in_float32(rnn: nn.RNNBase, x: torch.Tensor) -> bool:
    """An LSTM on a CPU whose oneDNN cannot run it in the bfloat16 that autocast asks for."""
    return (
        isinstance(rnn, nn.LSTM)
        and x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and not cpu_lstm_in_bfloat16()
    )


def call_rnn(rnn: nn.RNNBase, x: torch.Tensor, initial=None):
    """``rnn(x, initial)``, in float32 where this CPU cannot run it in autocast's bfloat16
    (see the module's docstring); the same outputs and final state as ``rnn``'s."""
    if not _lstm_in_float32(rnn, x):
        return rnn(x, initial)
    if initial is not None:
        initial = tuple(t.float() for t in initial)
    with torch.autocast("cpu", enabled=False):
        return rnn(x.float(), initial)


def run_rnn(
    rnn: nn.RNNBase, x: torch.Tensor, state: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run ``rnn`` over ``x (B, T, D)`` from a batch-first ``state`` of ``(B, L, H)`` tensors.

    Returns the top layer's outputs ``(B, T, H)`` and the new batch-first state.
    """
    layer_first = tuple(t.transpose(0, 1).contiguous() for t in state)  # (L, B, H) each
    initial = layer_first if isinstance(rnn, nn.LSTM) else layer_first[0]
    outputs, final = call_rnn(rnn, x, initial)  # (B, T, H)
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
