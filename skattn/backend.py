"""``TorchBackend``: a ``Seq2SeqModule`` behind the core's :class:`~skattn.core.inference.Backend`.

The estimator predicts through :class:`skattn.core.inference.Translator` with this backend, as
``serving.Runtime`` does with its onnxruntime backends: the same glue, the same search, the same
results. The carry is ``(*state, memory, keys, mask)``, every tensor batch-first, so ``select``
is one ``index_select`` along axis 0 of each. :meth:`TorchBackend.cross_attention` and
:func:`translate` add the Transformer decoder's per-layer and per-head maps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from skattn.core.attention_maps import Index, MapSelection, check_selection, translate_with_maps
from skattn.core.inference import SearchSettings, Translator

__all__ = ["TorchBackend", "translate"]

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

    @torch.inference_mode()
    def cross_attention(
        self, src: np.ndarray, src_lengths: np.ndarray, tokens: np.ndarray, temperature: float
    ) -> np.ndarray:
        """Every layer's and head's weights while writing ``tokens (B, T_y)``:
        ``(B, L, H, T_y, T)`` (``Seq2SeqModule.cross_attention``, what ``attention.onnx`` is)."""
        device = self.device
        weights = self.module.cross_attention(
            torch.from_numpy(src).to(device),  # (B, T)
            torch.from_numpy(src_lengths).to(device),  # (B,)
            torch.from_numpy(tokens).to(device),  # (B, T_y)
            torch.tensor(float(temperature), device=device),  # ()
        )
        return weights.float().cpu().numpy()

    def map_selection(self, layer: Index, head: Index) -> MapSelection | None:
        """``check_selection`` against this module's decoder (``ValueError`` naming ``layer`` or
        ``head``); None when both are None: the maps the search collects."""
        config = self.module.config  # ModelConfig, or an ensemble's config (no num_heads)
        transformer = config.decoder == "transformer"
        return check_selection(
            layer,
            head,
            config.num_layers if transformer else 0,
            config.num_heads if transformer else 0,
            unavailable="per-layer and per-head maps are the Transformer decoder's "
            f"(decoder='transformer'); this model's decoder is {config.decoder!r}",
        )


def translate(
    translator: Translator,
    token_lists: Sequence[Sequence[str]],
    settings: SearchSettings,
    with_attention: bool = False,
    layer: Index = None,
    head: Index = None,
) -> tuple[list, list[np.ndarray] | None]:
    """``translator.translate`` over a :class:`TorchBackend`; with ``layer`` or ``head`` the
    maps are the Transformer decoder's selected ones (:mod:`skattn.core.attention_maps`).

    ``ValueError`` (naming ``layer`` or ``head``) before any decoding for a selection the
    model does not have.
    """
    backend = translator.backend
    selection = backend.map_selection(layer, head)
    if selection is None or not with_attention:
        return translator.translate(token_lists, settings, with_attention)
    return translate_with_maps(
        translator, token_lists, settings, selection, backend.cross_attention
    )
