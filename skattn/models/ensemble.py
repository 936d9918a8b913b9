r"""``EnsembleModule``: fitted ``Seq2SeqModule`` members behind the one ``encode`` / ``step`` seam.

The search, the torch backend, the ONNX export and ``decode.onnx`` all read a model through
``encode`` / ``step`` / ``state_names`` / ``config`` (``docs/internals.md``). This module
presents ``M`` members that share one vocabulary as one such model, so all of them work on an
ensemble unchanged. What crosses the seam::

    memory (B, T, d_1 + ... + d_M)   the members' memories side by side (split again in step)
    keys   (B, T, k_1 + ... + k_M)   the members' keys side by side
    mask   (B, T) bool               shared: it depends on the source lengths only
    state  member 0's tensors, then member 1's, ...; named ``m<i>_<name>``
           (``m0_hidden``, ``m1_self_keys``: a Transformer member's key-value cache keeps its
           growing axis 2, and the exporter keeps that axis dynamic by the name's suffix)

One step, for members ``m = 1 .. M`` (``y`` the previous token, ``s_m`` member m's state)::

    log p_m(. | y_<i, x), s_m', a_m = member_m.step(y, s_m, ...)           # (B, V), (B, T)
    u(v)            = (1 / M) sum_m log p_m(v | y_<i, x)                  # (B, V) the mean
    log p(v | ...)  = u(v) - log sum_v' exp u(v')                         # renormalised
    a               = mean of a_m over the members that attend            # (B, T)

The mean of log-probabilities is a product of experts (Hinton 2002): the normalised geometric
mean of the members' distributions, so a token scores well only if every member gives it some
probability. It is renormalised because the search sums ``log p`` over steps and ranks beams by
``sum / length ** length_penalty``: without it each step would also add ``-log Z_i >= 0`` (``Z_i``
the geometric mean's mass, below 1 where members disagree), the scores would no longer be
log-probabilities of any distribution (what ``step``, ``decode.onnx``'s ``scores`` and the length
penalty assume), and long hypotheses through uncertain steps would pay twice. Greedy search is
unaffected (``argmax`` ignores a per-row constant), and an ensemble of one model is that model
(``log_softmax`` of log-probabilities is the identity, up to float rounding).

Attention: a member with ``attention="none"`` reports a one-hot row on the last source position
that it did not choose; averaging it in would draw a spike on the end-of-source marker that no
member attended to. The ensemble's map is the mean over the members that attend, and the (equal)
one-hot rows when none does. Rows still sum to 1 over real positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from skattn.core.text import EOS
from skattn.models.config import ModelConfig

__all__ = ["EnsembleConfig", "EnsembleModule"]

#: How the members' per-step distributions are combined (named in the manifest's ``model``).
COMBINATION = "mean_log_probs_renormalised"


def _describe(values: Sequence[Any]) -> str:
    """One value if the members agree, else theirs joined by ``+`` in member order."""
    return str(values[0]) if len(set(values)) == 1 else "+".join(map(str, values))


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
    """The members' :class:`~skattn.models.ModelConfig`, and how the manifest describes them.

    The exporter reads ``decoder``, ``attention``, ``scorer``, ``cell`` and ``feeds_input``
    (informative manifest fields, shown by the server and the explorer) and ``to_dict()`` (the
    manifest's ``model``, bound into every graph). ``decoder`` names every member
    (``"ensemble(bahdanau+luong)"``), so an ensemble never passes for a single model (whose
    kind the runtime may act on); the other fields name one kind when the members agree
    (``attention="none"`` only if no member attends) and every member's otherwise.
    """

    members: tuple[ModelConfig, ...]

    def __post_init__(self) -> None:
        if not self.members or not all(isinstance(m, ModelConfig) for m in self.members):
            raise ValueError(
                f"members must be a non-empty tuple of ModelConfig, got {self.members!r}"
            )
        object.__setattr__(self, "members", tuple(self.members))

    @property
    def decoder(self) -> str:
        return f"ensemble({'+'.join(m.decoder for m in self.members)})"

    @property
    def attention(self) -> str:
        return _describe([m.attention for m in self.members])

    @property
    def scorer(self) -> str:
        return _describe([m.scorer for m in self.members])

    @property
    def cell(self) -> str:
        return _describe([m.cell for m in self.members])

    @property
    def input_feeding(self) -> bool:
        """Every member's ``input_feeding`` setting (what it meant before ``feeds_input``)."""
        return all(m.input_feeding for m in self.members)

    @property
    def feeds_input(self) -> bool:
        return all(m.feeds_input for m in self.members)

    def to_dict(self) -> dict[str, Any]:
        """``{"ensemble": [member config dicts], "combination": ...}``: JSON-safe."""
        return {"ensemble": [m.to_dict() for m in self.members], "combination": COMBINATION}


class EnsembleModule(nn.Module):
    """Members that share a vocabulary, decoded as one model (see the module docstring).

    Parameters
    ----------
    members : sequence of Seq2SeqModule
        Used as they are (not copied), on one device; their source and target vocabulary
        sizes must agree (the estimator checks that the vocabularies themselves do).

    Attributes
    ----------
    members : nn.ModuleList
    config : EnsembleConfig
    state_names : tuple of str
        ``m<i>_<name>`` for member ``i``'s state names, in member order.
    memory_sizes, key_sizes : tuple of int
        Each member's slice of ``memory`` and ``keys`` (last axis).
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        if not members:
            raise ValueError("members must hold at least one module")
        configs = tuple(m.config for m in members)
        for name in ("source_vocab_size", "target_vocab_size"):
            sizes = [getattr(c, name) for c in configs]
            if len(set(sizes)) > 1:
                raise ValueError(f"members must share one vocabulary, got {name}s {sizes}")
        self.members = nn.ModuleList(members)
        self.config = EnsembleConfig(configs)
        self.state_names = tuple(
            f"m{i}_{name}" for i, m in enumerate(members) for name in m.state_names
        )
        self._n_states = tuple(len(m.state_names) for m in members)
        self._attending = [i for i, c in enumerate(configs) if c.attention != "none"] or list(
            range(len(members))
        )
        self.memory_sizes, self.key_sizes = self._widths()
        self.item_memory = all(member.item_memory for member in members)

    @torch.no_grad()
    def _widths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each member's memory and key width, read off one encoder pass over ``[EOS]``."""
        device = next(self.parameters()).device
        src = torch.full((1, 1), EOS, dtype=torch.int64, device=device)  # (1, 1)
        lengths = torch.ones(1, dtype=torch.int64, device=device)  # (1,)
        encoded = [m.encode(src, lengths) for m in self.members]
        return tuple(e[0].shape[-1] for e in encoded), tuple(e[1].shape[-1] for e in encoded)

    def encode(
        self, src: torch.Tensor, src_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Every member's ``encode``: memories and keys side by side, states in member order.

        Returns ``memory (B, T, sum d_m)``, ``keys (B, T, sum k_m)``, ``mask (B, T)`` and the
        state tuple named by :attr:`state_names`.
        """
        encoded = [m.encode(src, src_lengths) for m in self.members]
        memory = torch.cat([e[0] for e in encoded], dim=-1)  # (B, T, sum d_m)
        keys = torch.cat([e[1] for e in encoded], dim=-1)  # (B, T, sum k_m)
        state = tuple(t for e in encoded for t in e[3])
        return memory, keys, encoded[0][2], state  # mask (B, T): the same for every member

    def _member_inputs(self, state: Sequence[torch.Tensor], memory, keys):
        """Member i's ``(state, memory, keys)``: the slices :meth:`encode` put side by side."""
        memories = torch.split(memory, self.memory_sizes, dim=-1)  # (B, T, d_m) each
        keys_m = torch.split(keys, self.key_sizes, dim=-1)  # (B, T, k_m) each
        start = 0
        for n, mem, k in zip(self._n_states, memories, keys_m, strict=True):
            yield tuple(state[start : start + n]), mem, k
            start += n

    def _combine(self, log_probs: list[torch.Tensor], weights: list[torch.Tensor]):
        """``log_softmax(mean_m log p_m)`` and the mean attention of the attending members."""
        mean = torch.stack(log_probs).mean(dim=0)  # (M, ..., V) -> (..., V)
        attention = torch.stack([weights[i] for i in self._attending]).mean(dim=0)  # (..., T)
        return torch.log_softmax(mean, dim=-1), attention

    def step(
        self,
        y_prev: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: torch.Tensor,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
        """One step of every member; returns the combined ``log_probs (B, V)``, the members'
        new states (same structure as ``state``) and the attention ``weights (B, T)``."""
        log_probs, new_state, weights = [], [], []
        for member, inputs in zip(
            self.members, self._member_inputs(state, memory, keys), strict=True
        ):
            s, mem, k = inputs
            lp, s_new, w = member.step(y_prev, s, mem, k, mask, temperature, position)
            log_probs.append(lp)  # (B, V)
            new_state.extend(s_new)
            weights.append(w)  # (B, T)
        combined, attention = self._combine(log_probs, weights)
        return combined, tuple(new_state), attention

    def forward(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass: the combined log-probabilities ``(B, T_y, V)`` (logits whose
        softmax is the ensemble's distribution) and the attention ``(B, T_y, T)``."""
        outputs = [m(src, src_lengths, tgt_in) for m in self.members]
        log_probs = [torch.log_softmax(logits, dim=-1) for logits, _ in outputs]
        return self._combine(log_probs, [w for _, w in outputs])
