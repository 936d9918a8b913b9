"""Decoders: Bahdanau (attend, then step) and Luong (step, then attend), plus the no-attention
context of the plain encoder-decoder.

Every decoder has the same methods, which :class:`skattn.models.Seq2SeqModule` wires into the
``encode`` / ``step`` / ``forward`` seam:

- ``init_state(encoded) -> state``: a tuple of batch-first tensors named by ``state_names``;
- ``precompute(memory) -> keys``: the query-independent part, once per sentence;
- ``step(y_prev, state, memory, keys, mask, temperature, position) -> (logits, state, weights)``,
  which is ``predict(recur(embed(y_prev), ...))``: ``recur`` is the part that depends on the
  previous step (RNN and attention), ``predict`` the output layers, batched over any shape;
- ``forward(tgt_in, state, memory, keys, mask, temperature) -> (logits, weights)``: teacher
  forcing over a whole target, parallel over time wherever the math allows; where it does not,
  only ``recur`` runs in a Python loop and ``predict`` runs once over all steps.

``memory (B, T, d)`` is what attention reads (the projected annotations), ``keys`` its
query-independent part (``Attention.precompute(memory)``), ``mask (B, T)`` is ``True`` at real
positions. ``attention`` is any module with ``Attention``'s ``precompute`` / ``forward`` interface.
"""

from __future__ import annotations

import torch
from torch import nn

from skattn.attention.attention import per_item
from skattn.models.dropout import Dropout
from skattn.models.encoder import EncoderOutput
from skattn.models.rnn import CELL_STATE_NAMES, LayerwiseLinear, make_rnn, run_rnn

State = tuple[torch.Tensor, ...]


class FinalStateContext(nn.Module):
    """The "attention" of the plain encoder-decoder: always the last real annotation.

    ``c_i = h_{S-1}`` for every step, whatever the query, where ``S`` is the item's real length
    (the end-of-source marker, whose forward half has read the whole source). The reported weights
    are one-hot on that position, so attention maps stay defined and rows still sum to 1.
    ``temperature`` and ``step`` are accepted for interface parity and have no effect.
    """

    def precompute(self, H: torch.Tensor) -> torch.Tensor:
        """No query-independent part beyond the memory itself: returns ``H``."""
        return H

    def forward(
        self,
        s: torch.Tensor,
        H: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor = 1.0,
        step: int | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, d = H.shape
        last = mask.sum(dim=-1, keepdim=True) - 1  # (B, 1)
        positions = torch.arange(T, device=H.device).unsqueeze(0)  # (1, T)
        weights = (positions == last).to(H.dtype)  # (B, T), one-hot
        if s.dim() == 3:
            weights = weights.unsqueeze(1).expand(B, s.shape[1], T)  # (B, T_y, T)
            return torch.bmm(weights, H), weights  # (B, T_y, d), (B, T_y, T)
        # one step's B R rows, R per item (as Attention.forward reads them): the item's one-hot
        R = per_item(s, B, s.shape[-1]).shape[1]
        weights = weights.unsqueeze(1).expand(B, R, T)  # (B, R, T)
        return torch.bmm(weights, H).reshape(-1, d), weights.reshape(-1, T)  # (B R, d), (B R, T)


def _cell_state(cell: str, hidden: torch.Tensor, cell_init: nn.Module | None, x: torch.Tensor):
    """``(hidden,)`` for a GRU, ``(hidden, cell)`` for an LSTM with ``cell = x @ W + b``."""
    return (hidden,) if cell == "gru" else (hidden, cell_init(x))


class RecurrentDecoder(nn.Module):
    """What the decoders share: one step is embed -> :meth:`recur` -> :meth:`predict`.

    A subclass defines ``init_state(encoded)``, ``recur(embedded, state, memory, keys, mask,
    temperature, position) -> (features, state, weights)`` (the part that must run one position
    at a time), ``predict(features) -> logits`` (any leading shape) and the teacher-forced
    ``forward``; it holds ``embedding``, ``dropout`` and ``attention``.
    """

    #: ``step`` reads one memory row per item for any ``R >= 1`` rows per item, item-major
    #: (:meth:`skattn.attention.Attention.forward`): beam search's rows share their item's.
    item_memory = True

    def precompute(self, memory: torch.Tensor) -> torch.Tensor:
        """The attention's query-independent part, once per sentence: ``keys (B, T, k)``."""
        return self.attention.precompute(memory)

    def step(
        self,
        y_prev: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """One step: logits ``(B, V)``, the new state, attention weights ``(B, T)``."""
        embedded = self.dropout(self.embedding(y_prev))  # (B, E)
        features, state, weights = self.recur(
            embedded, state, memory, keys, mask, temperature, position
        )
        return self.predict(features), state, weights


class BahdanauDecoder(RecurrentDecoder):
    r"""Bahdanau, Cho and Bengio (2015): attend with the previous state, then step.

    .. math::

        c_i, \alpha_i = \mathrm{attend}(s_{i-1}, H) \\
        s_i = f(s_{i-1}, [E y_{i-1}; c_i]) \\
        t_i = \mathrm{maxout}_2([E y_{i-1}; s_i; c_i] U_o) \\
        p(y_i \mid y_{<i}, x) = \mathrm{softmax}(t_i W_o)

    ``s_0 = tanh(h_1^{bwd} W_s)``, from the backward encoder state at the first source position
    (one ``W_s`` per layer). With several layers the top layer's state is the query. The loop over
    time cannot be avoided in ``forward``: each step's context depends on the previous state.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        cell: str,
        attention: nn.Module,
    ) -> None:
        super().__init__()
        self.cell = cell
        self.state_names = CELL_STATE_NAMES[cell]
        self.attention = attention
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.dropout = Dropout(dropout)
        self.rnn = make_rnn(cell, embedding_dim + hidden_size, hidden_size, num_layers, dropout)
        self.init_hidden = LayerwiseLinear(num_layers, hidden_size, hidden_size)  # W_s
        self.init_cell = (
            LayerwiseLinear(num_layers, hidden_size, hidden_size) if cell == "lstm" else None
        )
        self.deep_output = nn.Linear(embedding_dim + 2 * hidden_size, 2 * hidden_size)  # U_o
        self.output = nn.Linear(hidden_size, vocab_size)  # W_o

    def init_state(self, encoded: EncoderOutput) -> State:
        """``s_0 = tanh(h_1^{bwd} W_s)`` per layer (plus ``cell_0 = h_1^{bwd} W_c`` for LSTM)."""
        h_bwd = encoded.backward_first  # (B, L, H)
        return _cell_state(self.cell, torch.tanh(self.init_hidden(h_bwd)), self.init_cell, h_bwd)

    def recur(
        self,
        embedded: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor,
        position: int | torch.Tensor,
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """The recurrent part of a step, from ``E y_{i-1} (B, E)``.

        Returns the features ``[E y_{i-1}; s_i; c_i] (B, E + 2H)`` that :meth:`predict` reads,
        the new state and the attention weights ``(B, T)``.
        """
        query = state[0][:, -1]  # (B, H): top layer of s_{i-1}
        context, weights = self.attention(query, memory, keys, mask, temperature, position)
        rnn_input = torch.cat([embedded, context], dim=-1).unsqueeze(1)  # (B, 1, E + H)
        outputs, state = run_rnn(self.rnn, rnn_input, state)  # (B, 1, H)
        s = outputs.squeeze(1)  # (B, H)
        return torch.cat([embedded, s, context], dim=-1), state, weights  # (B, E + 2H)

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``maxout_2(features U_o) W_o``, for any leading shape ``(..., E + 2H)``."""
        deep = self.deep_output(features)  # (..., 2H)
        # maxout over pairs (2j, 2j + 1), as the larger of the two members rather than a max over
        # an axis of 2: onnxruntime's Split + Max take half the time of its ReduceMax.
        pairs = deep.unflatten(-1, (self.output.in_features, 2))  # (..., H, 2): no -1, so 0 rows
        t = torch.maximum(*pairs.unbind(dim=-1))  # (..., H)
        return self.output(self.dropout(t))  # (..., V)

    def forward(
        self,
        tgt_in: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing over ``tgt_in (B, T_y)``: only :meth:`recur` loops over time.

        Returns logits ``(B, T_y, V)`` and attention weights ``(B, T_y, T)``.
        """
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_y, E)
        features, weights = recur_loop(self.recur, embedded, state, memory, keys, mask, temperature)
        return self.predict(features), weights


class LuongDecoder(RecurrentDecoder):
    r"""Luong, Pham and Manning (2015): step, then attend with the new state.

    .. math::

        s_i = f(s_{i-1}, [E y_{i-1}; \tilde s_{i-1}])  \quad (\tilde s_{i-1}
        \text{ only with input feeding}) \\
        c_i, \alpha_i = \mathrm{attend}(s_i, H) \\
        \tilde s_i = \tanh([c_i; s_i] W_c) \\
        p(y_i \mid y_{<i}, x) = \mathrm{softmax}(\tilde s_i W_o)

    The initial state is a learned projection of both encoder final states, per layer:
    ``s_0 = tanh([h_{S-1}^{fwd}; h_1^{bwd}] W_s)`` (and ``cell_0 = [..] W_cell`` for LSTM);
    ``\tilde s_0 = 0``. With input feeding the state carries ``feed`` (``\tilde s_{i-1}``,
    ``(B, H)``) and ``forward`` loops over time; without it the RNN runs over the whole target in
    one call and attention for all steps is one batched product.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int,
        dropout: float,
        cell: str,
        attention: nn.Module,
        input_feeding: bool,
    ) -> None:
        super().__init__()
        self.cell = cell
        self.input_feeding = input_feeding
        self.state_names = CELL_STATE_NAMES[cell] + (("feed",) if input_feeding else ())
        self.attention = attention
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.dropout = Dropout(dropout)
        rnn_input_size = embedding_dim + (hidden_size if input_feeding else 0)
        self.rnn = make_rnn(cell, rnn_input_size, hidden_size, num_layers, dropout)
        self.init_hidden = LayerwiseLinear(num_layers, 2 * hidden_size, hidden_size)  # W_s
        self.init_cell = (
            LayerwiseLinear(num_layers, 2 * hidden_size, hidden_size) if cell == "lstm" else None
        )
        self.combine = nn.Linear(2 * hidden_size, hidden_size, bias=False)  # W_c
        self.output = nn.Linear(hidden_size, vocab_size)  # W_o

    def init_state(self, encoded: EncoderOutput) -> State:
        """``s_0 = tanh([h_{S-1}^{fwd}; h_1^{bwd}] W_s)`` per layer; ``feed_0 = 0``."""
        summary = torch.cat([encoded.forward_last, encoded.backward_first], dim=-1)  # (B, L, 2H)
        state = _cell_state(
            self.cell, torch.tanh(self.init_hidden(summary)), self.init_cell, summary
        )
        if self.input_feeding:
            B = summary.shape[0]
            state = state + (summary.new_zeros(B, self.hidden_size),)  # feed: (B, H)
        return state

    def _attentional(self, context: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``tanh([c; s] W_c)``, context first as in the paper; any leading shape."""
        return torch.tanh(self.combine(torch.cat([context, s], dim=-1)))

    def recur(
        self,
        embedded: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor,
        position: int | torch.Tensor,
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """The recurrent part of a step, from ``E y_{i-1} (B, E)``.

        Returns the attentional state ``s~_i (B, H)``, the new state and the weights ``(B, T)``.
        """
        if self.input_feeding:
            *rnn_state, feed = state
            rnn_input = torch.cat([embedded, feed], dim=-1)  # (B, E + H)
        else:
            rnn_state, rnn_input = state, embedded
        outputs, rnn_state = run_rnn(self.rnn, rnn_input.unsqueeze(1), tuple(rnn_state))
        s = outputs.squeeze(1)  # (B, H)
        context, weights = self.attention(s, memory, keys, mask, temperature, position)
        attentional = self._attentional(context, s)  # (B, H)
        return attentional, rnn_state + ((attentional,) if self.input_feeding else ()), weights

    def predict(self, attentional: torch.Tensor) -> torch.Tensor:
        """Logits ``s~ W_o`` for any leading shape ``(..., H)``."""
        return self.output(self.dropout(attentional))  # (..., V)

    def forward(
        self,
        tgt_in: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
        mask: torch.Tensor,
        temperature: float | torch.Tensor = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing over ``tgt_in (B, T_y)``.

        Without input feeding nothing loops over time in Python; with it only :meth:`recur`
        does. Returns logits ``(B, T_y, V)`` and attention weights ``(B, T_y, T)``.
        """
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_y, E)
        if self.input_feeding:
            attentional, weights = recur_loop(
                self.recur, embedded, state, memory, keys, mask, temperature
            )
            return self.predict(attentional), weights
        S, _ = run_rnn(self.rnn, embedded, state)  # (B, T_y, H): all s_i in one call
        # all-steps form: step 0 is the first query's position, the others follow (0 .. T_y - 1)
        context, weights = self.attention(S, memory, keys, mask, temperature, 0)
        attentional = self._attentional(context, S)  # (B, T_y, H)
        return self.predict(attentional), weights  # (B, T_y, V), (B, T_y, T)


def recur_loop(
    recur,
    embedded: torch.Tensor,
    state: State,
    memory: torch.Tensor,
    keys: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a decoder's ``recur`` over ``embedded (B, T_y, E)``, one position at a time.

    Returns the stacked features ``(B, T_y, F)`` (projected to the vocabulary afterwards, in
    one batched call) and weights ``(B, T_y, T)``.
    """
    all_features, all_weights = [], []
    for i in range(embedded.shape[1]):
        features, state, weights = recur(embedded[:, i], state, memory, keys, mask, temperature, i)
        all_features.append(features)
        all_weights.append(weights)
    return torch.stack(all_features, dim=1), torch.stack(all_weights, dim=1)


def step_loop(
    step,
    tgt_in: torch.Tensor,
    state: State,
    memory: torch.Tensor,
    keys: torch.Tensor,
    mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher forcing by calling ``step`` once per target position (the sequential path).

    Returns logits ``(B, T_y, V)`` and weights ``(B, T_y, T)``.
    """
    all_logits, all_weights = [], []
    for i in range(tgt_in.shape[1]):
        position = torch.tensor(i, dtype=torch.int64, device=tgt_in.device)
        logits, state, weights = step(
            tgt_in[:, i], state, memory, keys, mask, temperature, position
        )
        all_logits.append(logits)
        all_weights.append(weights)
    return torch.stack(all_logits, dim=1), torch.stack(all_weights, dim=1)
