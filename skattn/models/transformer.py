r"""The Transformer (Vaswani et al., 2017) with pre-LayerNorm blocks, behind the RNN models' seam.

Encoder, ``N`` blocks over the source (``m`` = the padding mask, ``True`` at real tokens)::

    x_0 = E[src] sqrt(D) + P[0 .. T-1]
    x   = x + Dropout(SelfAttention(LN(x), m))            # every query reads the real keys
    x   = x + Dropout(FFN(LN(x)))                         # FFN(z) = max(0, z W_1 + b_1) W_2 + b_2
    memory = LN(x_N), zero at padding

Decoder, ``N`` blocks over the target prefix::

    y_0 = E[tgt] sqrt(D) + P[i]
    y   = y + Dropout(SelfAttention(LN(y), causal))       # position i reads positions <= i
    y   = y + Dropout(CrossAttention(LN(y), memory, m, tau))
    y   = y + Dropout(FFN(LN(y)))
    logits = LN(y_N) W_out

Attention is :class:`~skattn.attention.self_attention.MultiHeadAttention` (``num_kv_heads``:
grouped-query; 1 = multi-query). ``tau`` (``temperature``) divides the cross-attention scores
only, as the attention temperature of the RNN models does: small sharpens the attention maps
towards one source position, large flattens them; 1 (training) leaves the model unchanged.
Self-attention never sees it.

Positions (``positions=``): ``"sinusoidal"`` (default), ``PE[p, 2i] = sin(p / 10000^{2i/D})``,
``PE[p, 2i+1] = cos(p / 10000^{2i/D})``, is computed from ``p`` (no table), so it is defined for
any length; past the longest training length the model meets codes it never trained on, and
quality usually degrades gradually rather than failing. ``"learned"`` is a table of
``max_positions`` rows (``ModelConfig.max_positions``, 512): rows past the longest training
length never received a gradient and keep their random initialisation, and a position past the
table is **clamped** to its last row (a graph cannot raise on a value), so learned positions do
not extrapolate; prefer sinusoidal ones when inputs may be longer than the training ones.
``"none"`` adds nothing: self-attention is then permutation-equivariant (seed 000, §3.6d).

``Seq2SeqModule(config)`` builds these for ``encoder="transformer"`` (any decoder reads the
encoder's ``EncoderOutput``) and ``decoder="transformer"``. The seam (``docs/internals.md``):
``encode`` runs the encoder and projects the cross-attention keys and values of every layer
once per sentence into ``keys``::

    keys (B, T, num_layers * 2 * kv_dim)   layer l: [..., (2l) kv : (2l+1) kv] = K_l,
                                                    [..., (2l+1) kv : (2l+2) kv] = V_l

(as the RNN model's ``keys = U_a H``). The decoder state is the key-value cache of the causal
self-attention, two batch-first tensors (``state_names = ("self_keys", "self_values")``)::

    self_keys, self_values (B, num_layers, t, kv_dim)    t = target positions already read

with ``t = 0`` initially; each ``step`` appends one row per layer (``t -> t + 1``), so a step costs
``O(t)`` and beam search reorders the cache with one ``index_select`` on axis 0, like every other
carried tensor. ``kv_dim = num_kv_heads * D / num_heads``. Attention maps are the last layer's
cross-attention weights averaged over heads (rows sum to 1 over real source positions); every
layer's and head's, ``(B, L, h, T_y, T)``, come from one teacher-forced pass after decoding
(:meth:`TransformerDecoder.cross_attention`, :mod:`skattn.core.attention_maps`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from skattn.attention.attention import per_item
from skattn.attention.self_attention import MultiHeadAttention
from skattn.models.dropout import Dropout
from skattn.models.encoder import EncoderOutput, length_mask
from skattn.models.positions import make_positions

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "TransformerDecoder",
    "TransformerEncoder",
]

State = tuple[Tensor, ...]


class FeedForward(nn.Sequential):
    """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``, position-wise, ``D -> ffn_size -> D``."""

    def __init__(self, d_model: int, ffn_size: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(d_model, ffn_size),
            nn.ReLU(),
            Dropout(dropout),
            nn.Linear(ffn_size, d_model),
        )


class EncoderBlock(nn.Module):
    """``x + SelfAttn(LN(x))``, then ``x + FFN(LN(x))``, dropout on each sublayer's output."""

    def __init__(
        self, d_model: int, num_heads: int, num_kv_heads: int | None, ffn_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, num_heads, num_kv_heads)
        self.ffn = FeedForward(d_model, ffn_size, dropout)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x (B, T, D)``, ``mask (B, 1, T)`` (keys each query may read) -> ``(B, T, D)``."""
        x = x + self.dropout(self.self_attn(self.ln_1(x), mask=mask)[0])
        return x + self.dropout(self.ffn(self.ln_2(x)))


class DecoderBlock(nn.Module):
    """Causal self-attention over the cached prefix, cross-attention, FFN; each pre-LN."""

    def __init__(
        self, d_model: int, num_heads: int, num_kv_heads: int | None, ffn_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.ln_1, self.ln_2, self.ln_3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.self_attn = MultiHeadAttention(d_model, num_heads, num_kv_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, num_kv_heads)
        self.ffn = FeedForward(d_model, ffn_size, dropout)
        self.dropout = Dropout(dropout)

    def forward(
        self,
        y: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        self_mask: Tensor | None,
        cross_k: Tensor,
        cross_v: Tensor,
        src_mask: Tensor,
        temperature: float | Tensor = 1.0,
        need_weights: bool = False,
        by_item: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """One block over ``y (B, T_y, D)``, the positions after a cached prefix of ``t``.

        ``past_k, past_v (B, t, kv)``; ``self_mask`` broadcasts to ``(B, T_y, t + T_y)``
        (``None``: every cached key is readable, a one-position step); ``cross_k, cross_v
        (B, T, kv)``; ``src_mask (B, 1, T)``. Returns ``y (B, T_y, D)``, the extended cache
        ``k, v (B, t + T_y, kv)`` and, if asked, cross-attention weights ``(B, h, T_y, T)``.

        ``by_item`` (one position, ``T_y = 1``): ``cross_k``, ``cross_v`` and ``src_mask`` hold
        one row per item for ``R = B / I`` rows each, item-major (an item's beams), and an
        item's rows read them as ``R`` queries of one attention.
        """
        h = self.ln_1(y)  # (B, T_y, D)
        k_new, v_new = self.self_attn.project_kv(h)  # (B, T_y, kv) each
        k = torch.cat([past_k, k_new], dim=1)  # (B, t + T_y, kv)
        v = torch.cat([past_v, v_new], dim=1)  # (B, t + T_y, kv)
        y = y + self.dropout(self.self_attn.attend(h, k, v, self_mask)[0])
        query = self.ln_2(y)  # (B, T_y, D)
        D = query.shape[-1]
        if by_item:  # (B, 1, D) -> (I, R, D)
            query = per_item(query.reshape(-1, D), cross_k.shape[0], D)
        context, weights = self.cross_attn.attend(
            query, cross_k, cross_v, src_mask, temperature, need_weights
        )
        if by_item:  # (I, R, D) -> (B, 1, D); weights (I, h, R, T) -> (B, h, 1, T)
            context = context.reshape(-1, 1, D)  # -1 is defined for 0 rows: 1 D is not 0
            if weights is not None:
                weights = weights.transpose(1, 2).flatten(0, 1).unsqueeze(2)
        y = y + self.dropout(context)
        return y + self.dropout(self.ffn(self.ln_3(y))), k, v, weights


def _embedding(vocab_size: int, d_model: int) -> nn.Embedding:
    """``E (V, D)`` drawn from ``N(0, 1/D)`` (fairseq) so that ``E sqrt(D)`` has unit scale."""
    embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
    nn.init.normal_(embedding.weight, std=d_model**-0.5)
    with torch.no_grad():
        embedding.weight[0].zero_()
    return embedding


class _Stack(nn.Module):
    """What the encoder and the decoder share: scaled embeddings plus positions, then blocks.

    Parameters
    ----------
    vocab_size, d_model, num_layers, num_heads : int
    num_kv_heads : int or None
        Key / value heads (``None``: ``num_heads``).
    ffn_size : int
        Hidden units of the feed-forward layers.
    dropout : float
    positions : {"sinusoidal", "learned", "none"}
    max_positions : int
        Rows of the learned table (unused otherwise).
    """

    block: type[nn.Module]

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        num_kv_heads: int | None,
        ffn_size: int,
        dropout: float,
        positions: str,
        max_positions: int,
    ) -> None:
        super().__init__()
        self.d_model, self.num_layers = d_model, num_layers
        self.embedding = _embedding(vocab_size, d_model)
        self.positions = make_positions(positions, d_model, max_positions)
        self.dropout = Dropout(dropout)
        self.blocks = nn.ModuleList(
            self.block(d_model, num_heads, num_kv_heads, ffn_size, dropout)
            for _ in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)

    def embed(self, ids: Tensor, start: int | Tensor = 0) -> Tensor:
        """``Dropout(E[ids] sqrt(D) + P[start + j])``: ``(B, T) -> (B, T, D)``."""
        x = self.embedding(ids) * math.sqrt(self.d_model)  # (B, T, D)
        if self.positions is not None:
            positions = start + torch.arange(ids.shape[1], device=ids.device)  # (T,)
            x = x + self.positions(positions)  # (B, T, D)
        return self.dropout(x)


class TransformerEncoder(_Stack):
    """Pre-LN encoder: ``memory = LN(blocks(E[src] sqrt(D) + P))``, zero at padding.

    Parameters: see ``_Stack`` (``vocab_size, d_model, num_layers, num_heads, num_kv_heads,
    ffn_size, dropout, positions, max_positions``).

    It returns the RNN encoder's :class:`~skattn.models.encoder.EncoderOutput`, so every RNN
    decoder reads it as it reads the bi-RNN's: ``annotations`` is the memory (``D`` wide, not
    ``2H``), and the summaries that initialise an RNN decoder are the memory at the
    end-of-source marker (``forward_last``, as the forward RNN's state at ``length - 1``) and
    at the first position (``backward_first``), repeated for each of the ``num_layers``
    decoder layers: after self-attention every position has read the whole source.
    """

    block = EncoderBlock

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """``src (B, T)``, ``src_lengths (B,)`` -> ``EncoderOutput`` (memory ``(B, T, D)``)."""
        B, T = src.shape
        mask = length_mask(src_lengths, T)  # (B, T)
        x = self.embed(src)  # (B, T, D)
        for block in self.blocks:
            x = block(x, mask.unsqueeze(1))  # (B, T, D); keys masked by (B, 1, T)
        memory = self.ln_f(x) * mask.unsqueeze(-1).to(x.dtype)  # (B, T, D), zero at padding
        last = (src_lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, self.d_model)
        layers = (B, self.num_layers, self.d_model)
        return EncoderOutput(
            annotations=memory,
            mask=mask,
            forward_last=memory.gather(1, last).expand(layers),  # (B, L, D)
            backward_first=memory[:, :1].expand(layers),  # (B, L, D)
        )


class TransformerDecoder(_Stack):
    """Pre-LN decoder with a key-value cache, offering the RNN decoders' methods.

    Same parameters as :class:`TransformerEncoder`. ``init_state``, ``step`` and ``forward``
    follow :mod:`skattn.models.decoders`; ``precompute`` builds the cross-attention ``keys``.
    """

    state_names = ("self_keys", "self_values")
    block = DecoderBlock
    item_memory = True  # a step's cross-attention reads an item's keys once for its rows

    def __init__(self, vocab_size: int, d_model: int, *sizes) -> None:
        super().__init__(vocab_size, d_model, *sizes)
        self.kv_dim = self.blocks[0].self_attn.kv_dim
        self.output = nn.Linear(d_model, vocab_size)  # W_out

    def precompute(self, memory: Tensor) -> Tensor:
        """Every layer's cross-attention ``[K_l; V_l]``: ``(B, T, D) -> (B, T, L * 2 * kv)``."""
        kv = [torch.cat(block.cross_attn.project_kv(memory), dim=-1) for block in self.blocks]
        return torch.cat(kv, dim=-1)  # (B, T, L * 2 * kv)

    def init_state(self, encoded: EncoderOutput) -> State:
        """An empty cache: ``self_keys, self_values (B, L, 0, kv)``."""
        memory = encoded.annotations  # (B, T, D)
        empty = memory.new_zeros(memory.shape[0], self.num_layers, 0, self.kv_dim)
        return empty, empty.clone()

    def _decode(
        self,
        tgt: Tensor,
        state: State,
        start: int | Tensor,
        self_mask: Tensor | None,
        keys: Tensor,
        mask: Tensor,
        temperature: float | Tensor,
        every_layer: bool = False,
        by_item: bool = False,
    ) -> tuple[Tensor, State, Tensor]:
        """Run the blocks over ``tgt (B, T_y)`` at positions ``start ..`` after the cache
        (``by_item``: one position, ``keys`` and ``mask`` one row per item, see
        :class:`DecoderBlock`).

        Returns logits ``(B, T_y, V)``, the cache extended by ``T_y`` rows and the last layer's
        cross-attention weights averaged over heads ``(B, T_y, T)``, or with ``every_layer``
        every layer's and head's weights ``(B, L, h, T_y, T)``.
        """
        past_k, past_v = state  # (B, L, t, kv) each
        y = self.embed(tgt, start)  # (B, T_y, D)
        cross = keys.split(self.kv_dim, dim=-1)  # 2L x (B, T, kv): K_0, V_0, K_1, ...
        past_ks, past_vs = past_k.unbind(1), past_v.unbind(1)  # L x (B, t, kv) each
        src_mask = mask.unsqueeze(1)  # (B, 1, T)
        new_k, new_v, weights = [], [], []
        for layer, block in enumerate(self.blocks):
            need_weights = every_layer or layer == self.num_layers - 1
            y, k, v, w = block(
                y,
                past_ks[layer],
                past_vs[layer],
                self_mask,
                cross[2 * layer],
                cross[2 * layer + 1],
                src_mask,
                temperature,
                need_weights,
                by_item,
            )
            new_k.append(k)  # (B, t + T_y, kv)
            new_v.append(v)
            if need_weights:
                weights.append(w)  # (B, h, T_y, T)
        logits = self.output(self.ln_f(y))  # (B, T_y, V)
        state = (torch.stack(new_k, dim=1), torch.stack(new_v, dim=1))  # (B, L, t + T_y, kv)
        if every_layer:
            return logits, state, torch.stack(weights, dim=1)  # (B, L, h, T_y, T)
        return logits, state, weights[-1].mean(dim=1)  # (B, h, T_y, T) -> (B, T_y, T)

    def step(
        self,
        y_prev: Tensor,
        state: State,
        memory: Tensor,
        keys: Tensor,
        mask: Tensor,
        temperature: float | Tensor,
        position: Tensor,
    ) -> tuple[Tensor, State, Tensor]:
        """One position: ``y_prev (B,)`` at ``position`` (= the cache length ``t``).

        Returns logits ``(B, V)``, the cache grown to ``t + 1`` and weights ``(B, T)``.
        ``memory`` is unused: ``keys`` holds its projections. ``keys`` and ``mask`` may hold
        one row per item for ``R = B / I`` rows each, item-major (an item's beams).
        """
        logits, state, weights = self._decode(
            y_prev.unsqueeze(1), state, position, None, keys, mask, temperature, by_item=True
        )
        return logits.squeeze(1), state, weights.squeeze(1)

    def forward(
        self,
        tgt_in: Tensor,
        state: State,
        memory: Tensor,
        keys: Tensor,
        mask: Tensor,
        temperature: float | Tensor = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing over ``tgt_in (B, T_y)``, all positions in parallel after ``state``.

        Target padding needs no mask: it follows every real position, and the causal mask
        already hides what follows. Returns logits ``(B, T_y, V)`` and weights ``(B, T_y, T)``.
        """
        t = state[0].shape[2]
        causal = _causal_mask(t, tgt_in)
        logits, _, weights = self._decode(tgt_in, state, t, causal, keys, mask, temperature)
        return logits, weights

    def cross_attention(
        self,
        tgt_in: Tensor,
        state: State,
        keys: Tensor,
        mask: Tensor,
        temperature: float | Tensor = 1.0,
    ) -> Tensor:
        """Every layer's and head's cross-attention weights, teacher-forced over ``tgt_in``.

        ``alpha[b, l, h, i, j]``: how much head ``h`` of layer ``l`` reads source position ``j``
        at target position ``i``. The decoder is causal, so row ``i`` reads the prefix
        ``tgt_in[:, :i + 1]`` only: it equals the weights that :meth:`step` computes at position
        ``i`` after the same prefix (the mean over heads of the last layer is what ``step``
        returns). Returns ``(B, L, h, T_y, T)``; rows sum to 1 over real source positions.
        """
        t = state[0].shape[2]
        causal = _causal_mask(t, tgt_in)
        return self._decode(tgt_in, state, t, causal, keys, mask, temperature, True)[2]


def _causal_mask(t: int, tgt_in: Tensor) -> Tensor:
    """``(1, T_y, t + T_y)``: target position ``i`` after ``t`` cached ones reads ``j <= t + i``."""
    T_y = tgt_in.shape[1]
    i = torch.arange(T_y, device=tgt_in.device).unsqueeze(1)  # (T_y, 1)
    j = torch.arange(t + T_y, device=tgt_in.device).unsqueeze(0)  # (1, t + T_y)
    return (j <= t + i).unsqueeze(0)  # (1, T_y, t + T_y)
