"""``TorchBackend``: a ``Seq2SeqModule`` behind the core's :class:`~skattn.core.inference.Backend`.

The estimator predicts through :class:`skattn.core.inference.Translator` with this backend, as
``serving.Runtime`` does with its onnxruntime backends: the same glue, the same search, the same
results. The carry is ``(*state, memory, keys, mask)``, every tensor batch-first, so ``select``
is one ``index_select`` along axis 0 of each.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["TorchBackend"]

Carry = tuple[torch.Tensor, ...]


class TorchBackend:
    """Encode and step a module on its device; NumPy arrays in and out of the search.

    Parameters
    ----------
    module : Seq2SeqModule
        Used as it is (call ``eval()`` first); every call runs under ``torch.inference_mode``.
    device : torch.device
    """

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        self.module = module
        self.device = device
        self.n_states = len(module.state_names)

    @torch.inference_mode()
    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Carry:
        """``src (B, T), src_lengths (B,)`` -> ``(*state, memory, keys, mask)``."""
        memory, keys, mask, state = self.module.encode(
            torch.from_numpy(src).to(self.device),  # (B, T)
            torch.from_numpy(src_lengths).to(self.device),  # (B,)
        )
        return (*state, memory, keys, mask)

    @torch.inference_mode()
    def step(
        self, y_prev: np.ndarray, carry: Carry, position: int, temperature: float
    ) -> tuple[np.ndarray, Carry, np.ndarray]:
        """One decoder step: ``log_probs (N, V)``, the next carry, ``weights (N, T)``."""
        device, n = self.device, self.n_states
        log_probs, new_state, weights = self.module.step(
            torch.from_numpy(np.ascontiguousarray(y_prev)).to(device),  # (N,)
            carry[:n],
            *carry[n:],
            torch.tensor(float(temperature), device=device),  # ()
            torch.tensor(position, device=device),  # ()
        )
        new_carry = (*new_state, *carry[n:])
        return log_probs.float().cpu().numpy(), new_carry, weights.float().cpu().numpy()

    @torch.inference_mode()
    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        """Rows ``rows (M,)`` of every carried tensor (``index_select`` on axis 0)."""
        index = torch.from_numpy(rows).to(self.device)
        return tuple(t.index_select(0, index) for t in carry)
