"""``Seq2SeqModule``: encoder + attention + decoder behind the ``encode`` / ``step`` / ``forward``
seam that training, decoding and ONNX export share (see ``docs/internals.md``).

The families (``ModelConfig.encoder`` / ``decoder``): a bidirectional RNN or a Transformer
encoder (:mod:`skattn.models.transformer`), each returning an ``EncoderOutput``; a Bahdanau or
Luong RNN decoder with any scorer over either encoder, or the Transformer decoder (key-value
cache as its state) over the Transformer encoder.

Query and key sizes of the RNN decoders: the decoder state has ``hidden_size`` units and a
bi-RNN annotation ``2 * hidden_size``. The annotations are projected once per sentence, in
``encode``, by a bridge ``memory = H @ W_m`` (``W_m`` of shape ``(2 * hidden_size,
hidden_size)``, no bias, so padding stays zero). Attention reads ``memory``, so every scorer
(``dot`` and ``scaled_dot`` included) works with every decoder, and a context has
``hidden_size`` units. A Transformer encoder's memory already has ``hidden_size`` units: its
bridge is the identity.
"""

from __future__ import annotations

import torch
from torch import nn

from skattn.attention import Attention
from skattn.core.text import BOS
from skattn.models.config import ModelConfig
from skattn.models.decoders import BahdanauDecoder, FinalStateContext, LuongDecoder, step_loop
from skattn.models.encoder import BiRNNEncoder
from skattn.models.transformer import TransformerDecoder, TransformerEncoder

#: ``ModelConfig.attention`` -> ``Attention(local=...)``.
LOCAL = {"global": None, "local-m": "local-m", "local-p": "local-p"}


class Seq2SeqModule(nn.Module):
    """An encoder (bi-RNN or Transformer) and an attention decoder (RNN or Transformer).

    Parameters
    ----------
    config : ModelConfig
        Families, sizes, cell, attention and scorer; see :class:`~skattn.models.ModelConfig`.

    Attributes
    ----------
    config : ModelConfig
        Enough to rebuild the module before ``load_state_dict``.
    state_names : tuple of str
        Names of the decoder state tensors, in order: ``("hidden",)``, ``("hidden", "cell")``,
        plus ``"feed"`` for Luong with input feeding; ``("self_keys", "self_values")`` for the
        Transformer decoder. Each is batch-first: ``hidden`` and ``cell`` are
        ``(B, num_layers, hidden_size)``, ``feed`` is ``(B, hidden_size)``, the key-value cache
        ``(B, num_layers, t, kv_dim)`` (``t = 0`` after ``encode``).

    Examples
    --------
    >>> import torch
    >>> from skattn.models import ModelConfig
    >>> model = Seq2SeqModule(ModelConfig(10, 12, embedding_dim=8, hidden_size=16)).eval()
    >>> src, lengths = torch.tensor([[4, 5, 2], [6, 2, 0]]), torch.tensor([3, 2])
    >>> logits, weights = model(src, lengths, torch.tensor([[1, 7], [1, 8]]))
    >>> tuple(logits.shape), tuple(weights.shape)
    ((2, 2, 12), (2, 2, 3))
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {config!r}")
        self.config = config
        sizes = (config.embedding_dim, config.hidden_size, config.num_layers)
        if config.encoder == "transformer":
            self.encoder = TransformerEncoder(config.source_vocab_size, *_blocks(config))
            self.bridge = nn.Identity()  # memory is already hidden_size wide
        else:
            rnn = (config.source_vocab_size, *sizes, config.dropout, config.cell)
            self.encoder = BiRNNEncoder(*rnn)
            self.bridge = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)  # W_m
        if config.decoder == "transformer":
            self.decoder = TransformerDecoder(config.target_vocab_size, *_blocks(config))
            return
        self.attention = _make_attention(config)
        decoder_args = (config.target_vocab_size, *sizes, config.dropout, config.cell)
        if config.decoder == "bahdanau":
            self.decoder = BahdanauDecoder(*decoder_args, self.attention)
        else:
            self.decoder = LuongDecoder(*decoder_args, self.attention, config.input_feeding)

    def portable_state(self) -> dict:
        """The config and a CPU state dict: what a pickle of a fitted estimator stores."""
        weights = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        return {"config": self.config.to_dict(), "weights": weights}

    @classmethod
    def from_portable_state(cls, state: dict, device: torch.device) -> Seq2SeqModule:
        """Rebuild a module (in eval mode) on ``device``, or where this machine has none such:
        ``cuda:0`` for a CUDA device past its count (a model fitted on a Dask worker's second
        GPU), the CPU without CUDA; the device it lands on is
        ``next(module.parameters()).device``."""
        if device.type == "cuda" and not torch.cuda.is_available():
            device = torch.device("cpu")
        elif device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            device = torch.device("cuda", 0)
        with torch.random.fork_rng(devices=[]):  # the initial weights, soon overwritten, draw
            module = cls(ModelConfig.from_dict(state["config"]))  # from the user's seeded RNG
        module.load_state_dict(state["weights"])
        return module.to(device).eval()

    @property
    def state_names(self) -> tuple[str, ...]:
        return self.decoder.state_names

    @property
    def item_memory(self) -> bool:
        """Whether :meth:`step` reads one memory row per item for ``R`` rows per item (the
        recurrent decoders), not one per row (the Transformer's)."""
        return self.decoder.item_memory

    def encode(
        self, src: torch.Tensor, src_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Encode a padded source batch once per sentence.

        Parameters
        ----------
        src : Tensor (B, T) int64
            Padded source ids (each item ends with EOS).
        src_lengths : Tensor (B,) int64
            Real lengths, each at least 1.

        Returns
        -------
        memory : Tensor (B, T, hidden_size)
            ``H @ W_m``, the projected annotations, or the Transformer encoder's output (zero
            at padding).
        keys : Tensor (B, T, k)
            ``Attention.precompute(memory)`` (``memory`` itself for ``attention="none"``); for
            the Transformer decoder every layer's cross-attention ``[K_l; V_l]``.
        mask : Tensor (B, T) bool
            ``True`` at real positions.
        state : tuple of Tensor
            The initial decoder state, named by :attr:`state_names`.
        """
        encoded = self.encoder(src, src_lengths)
        memory = self.bridge(encoded.annotations)  # (B, T, H)
        keys = self.decoder.precompute(memory)  # (B, T, k)
        return memory, keys, encoded.mask, self.decoder.init_state(encoded)

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
        """One decoder step (what ``decoder_step.onnx`` computes).

        Parameters
        ----------
        y_prev : Tensor (B,) int64
            The previous target token (BOS at the first step).
        state : tuple of Tensor
            The decoder state, named by :attr:`state_names`.
        memory, keys, mask : Tensor
            As returned by :meth:`encode`.
        temperature : Tensor () float
            Attention softmax temperature.
        position : Tensor () int64
            The target position ``i`` (0 at the first step); centres local-m windows and is
            the Transformer decoder's position (the cache then holds ``i`` rows).

        Returns
        -------
        log_probs : Tensor (B, V)
        new_state : tuple of Tensor
            Same structure as ``state``.
        weights : Tensor (B, T)
            Attention weights: rows sum to 1 over real positions, 0 on padding.
        """
        logits, state, weights = self.decoder.step(
            y_prev, state, memory, keys, mask, temperature, position
        )
        return torch.log_softmax(logits, dim=-1), state, weights

    def forward(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass (temperature 1).

        Parameters
        ----------
        src : Tensor (B, T) int64
        src_lengths : Tensor (B,) int64
        tgt_in : Tensor (B, T_y) int64
            Decoder inputs ``[BOS] + tokens`` (padded).

        Returns
        -------
        logits : Tensor (B, T_y, V)
        weights : Tensor (B, T_y, T)
        """
        memory, keys, mask, state = self.encode(src, src_lengths)
        return self.decoder(tgt_in, state, memory, keys, mask)

    def cross_attention(
        self,
        src: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float | torch.Tensor = 1.0,
    ) -> torch.Tensor:
        """The Transformer decoder's cross-attention weights while writing ``tokens``.

        What ``attention.onnx`` computes: one teacher-forced pass whose row ``i`` is the step
        that wrote ``tokens[:, i]`` (decoder input ``[BOS] + tokens[:, :i]``, position ``i``).

        Parameters
        ----------
        src : Tensor (B, T) int64
        src_lengths : Tensor (B,) int64
        tokens : Tensor (B, T_y) int64
            Output tokens (no BOS, no EOS), 0-padded after each item's end.
        temperature : float or Tensor ()
            The attention temperature the tokens were decoded at.

        Returns
        -------
        weights : Tensor (B, num_layers, num_heads, T_y, T)
            Rows sum to 1 over real source positions; rows past an item's end read padding
            tokens and mean nothing.
        """
        if self.config.decoder != "transformer":
            raise ValueError(
                "per-layer and per-head maps exist for decoder='transformer' only, "
                f"not {self.config.decoder!r}"
            )
        _, keys, mask, state = self.encode(src, src_lengths)
        bos = torch.full_like(tokens[:, :1], BOS)  # (B, 1)
        tgt_in = torch.cat([bos, tokens], dim=1)[:, : tokens.shape[1]]  # (B, T_y)
        return self.decoder.cross_attention(tgt_in, state, keys, mask, temperature)

    def forward_stepwise(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` computed one decoder step at a time, whatever the decoder.

        The same function as :meth:`forward`; it exists as the sequential baseline that
        ``benchmarks/bench_train.py`` compares the parallel Luong path against.
        """
        memory, keys, mask, state = self.encode(src, src_lengths)
        return step_loop(self.decoder.step, tgt_in, state, memory, keys, mask)


def _blocks(config: ModelConfig) -> tuple:
    """The Transformer stacks' arguments after the vocabulary size (see ``_Stack``)."""
    ffn_size = 4 * config.hidden_size if config.ffn_size is None else config.ffn_size
    return (
        config.hidden_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        ffn_size,
        config.dropout,
        config.positions,
        config.max_positions,
    )


def _make_attention(config: ModelConfig) -> nn.Module:
    """``Attention`` for the configured scorer and window, or the final-state context.

    Over a Transformer encoder ``num_heads`` are the blocks' heads and the scorer has one (the
    additive scorer has no other), so every scorer works over every encoder.
    """
    if config.attention == "none":
        return FinalStateContext()
    return Attention(
        config.scorer,
        config.hidden_size,
        config.hidden_size,
        attention_size=config.attention_size,
        num_heads=1 if config.encoder == "transformer" else config.num_heads,  # see ModelConfig
        local=LOCAL[config.attention],
        window=config.window,
    )
