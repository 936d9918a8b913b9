"""``TorchBackend``: a ``Seq2SeqModule`` behind the core's :class:`~skattn.core.inference.Backend`.

The estimator predicts through :class:`skattn.core.inference.Translator` with this backend, as
``serving.Runtime`` does with its onnxruntime backends: the same glue, the same search, the same
results. The carry (:class:`Carry`) is the decoder state, one row per searched row, and the
encoder's memory, keys and mask, which a step reads one row per item where the module allows it
(:mod:`skattn.core.memory_rows`), so ``select`` is an ``index_select`` of the state only.
:meth:`TorchBackend.cross_attention` and :func:`translate` add the Transformer decoder's
per-layer and per-head maps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from skattn.core.attention_maps import Index, MapSelection, check_selection, translate_with_maps
from skattn.core.inference import SearchSettings, Translator
from skattn.core.memory_rows import line_up

__all__ = ["Carry", "TorchBackend", "translate"]


class Carry(NamedTuple):
    """What the search carries between steps."""

    state: tuple[torch.Tensor, ...]  # each (N, ...): one row per searched row
    memory: torch.Tensor  # (M, T, d_memory)
    keys: torch.Tensor  # (M, T, d_keys)
    mask: torch.Tensor  # (M, T) bool
    origin: np.ndarray  # (N,) int64 the item each row decodes
    held: np.ndarray  # (M,) int64 the item each memory row holds


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
        #: Whether a step reads one memory row per item for all the item's rows.
        self.item_memory = bool(module.item_memory)

    @torch.inference_mode()
    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Carry:
        """``src (B, T), src_lengths (B,)`` -> the initial carry: row ``j`` decodes item ``j``."""
        memory, keys, mask, state = self.module.encode(
            torch.from_numpy(src).to(self.device),  # (B, T)
            torch.from_numpy(src_lengths).to(self.device),  # (B,)
        )
        items = np.arange(len(src))
        return Carry(tuple(state), memory, keys, mask, items, items)

    @torch.inference_mode()
    def step(
        self, y_prev: np.ndarray, carry: Carry, position: int, temperature: float
    ) -> tuple[np.ndarray, Carry, np.ndarray]:
        """One decoder step: ``log_probs (N, V)``, the next carry, ``weights (N, T)``."""
        device = self.device
        carry = self._lined_up(carry)
        log_probs, new_state, weights = self.module.step(
            torch.from_numpy(np.ascontiguousarray(y_prev)).to(device),  # (N,)
            carry.state,
            carry.memory,  # (M, T, d): M = N, or one row per item for R rows each
            carry.keys,
            carry.mask,
            torch.tensor(float(temperature), device=device),  # ()
            torch.tensor(position, device=device),  # ()
        )
        new_carry = carry._replace(state=tuple(new_state))
        return log_probs.float().cpu().numpy(), new_carry, weights.float().cpu().numpy()

    @torch.inference_mode()
    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        """Rows ``rows (M,)`` of the state (``index_select`` on axis 0); the memory, keys and
        mask stay as they are until a step reads other rows of them."""
        index = torch.from_numpy(rows).to(self.device)
        state = tuple(t.index_select(0, index) for t in carry.state)
        return carry._replace(state=state, origin=np.take(carry.origin, rows))

    def _lined_up(self, carry: Carry) -> Carry:
        """The carry with the memory rows its step reads (:mod:`skattn.core.memory_rows`)."""
        lined = line_up(carry.origin, carry.held, self.item_memory)
        if lined is None:
            return carry
        wanted, selection = lined
        if isinstance(selection, slice):
            memory, keys, mask = (t[selection] for t in (carry.memory, carry.keys, carry.mask))
        else:
            index = torch.from_numpy(selection).to(self.device)
            memory, keys, mask = (
                t.index_select(0, index) for t in (carry.memory, carry.keys, carry.mask)
            )
        return carry._replace(memory=memory, keys=keys, mask=mask, held=wanted)

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
