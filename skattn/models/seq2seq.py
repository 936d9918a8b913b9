"""``Seq2SeqModule``: encoder + attention + decoder behind the ``encode`` / ``step`` / ``forward``
seam that training, decoding and ONNX export share (see ``docs/internals.md``).

Query and key sizes: the decoder state has ``hidden_size`` units and an annotation
``2 * hidden_size``. The annotations are projected once per sentence, in ``encode``, by a bridge
``memory = H @ W_m`` (``W_m`` of shape ``(2 * hidden_size, hidden_size)``, no bias, so padding
stays zero). Attention reads ``memory``, so every scorer (``dot`` and ``scaled_dot`` included)
works with every decoder, and a context has ``hidden_size`` units.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from skattn.attention import Attention
from skattn.models.decoders import BahdanauDecoder, FinalStateContext, LuongDecoder, step_loop
from skattn.models.encoder import BiRNNEncoder

CELLS = ("gru", "lstm")
DECODERS = ("bahdanau", "luong")
ATTENTIONS = ("global", "local-m", "local-p", "none")
SCORERS = ("dot", "general", "additive", "scaled_dot")
LOCAL = {"global": None, "local-m": "local-m", "local-p": "local-p"}


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _one_of(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def _python_scalar(value):
    """``int`` / ``float`` for any integral / real number that is not a bool; others unchanged."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def validate_config(config: dict) -> None:
    """Raise ``ValueError`` naming the first bad parameter of a ``Seq2SeqModule`` config."""
    for name in ("source_vocab_size", "target_vocab_size", "embedding_dim", "hidden_size"):
        _positive_int(name, config[name])
    for name in ("num_layers", "num_heads"):
        _positive_int(name, config[name])
    if config["attention_size"] is not None:
        _positive_int("attention_size", config["attention_size"])
    dropout = config["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    _one_of("cell", config["cell"], CELLS)
    _one_of("decoder", config["decoder"], DECODERS)
    _one_of("attention", config["attention"], ATTENTIONS)
    _one_of("scorer", config["scorer"], SCORERS)
    if not isinstance(config["input_feeding"], bool):
        raise ValueError(f"input_feeding must be a bool, got {config['input_feeding']!r}")
    window = config["window"]
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    if config["hidden_size"] % config["num_heads"]:
        raise ValueError(
            f"num_heads must divide hidden_size; got num_heads={config['num_heads']}, "
            f"hidden_size={config['hidden_size']}"
        )


class Seq2SeqModule(nn.Module):
    """A bidirectional RNN encoder and an attention decoder.

    Parameters
    ----------
    source_vocab_size, target_vocab_size : int
        Vocabulary sizes, specials included (``PAD=0``, ``BOS=1``, ``EOS=2``, ``UNK=3``).
    embedding_dim : int, default=64
    hidden_size : int, default=128
        Units per encoder direction and in the decoder; an annotation has ``2 * hidden_size``.
    num_layers : int, default=1
        Layers of the encoder (each bidirectional) and of the decoder.
    dropout : float, default=0.0
        On embeddings, between layers and before the output projection.
    cell : {"gru", "lstm"}, default="gru"
    decoder : {"bahdanau", "luong"}, default="bahdanau"
        See :class:`~skattn.models.decoders.BahdanauDecoder` and
        :class:`~skattn.models.decoders.LuongDecoder`.
    attention : {"global", "local-m", "local-p", "none"}, default="global"
        ``"none"`` is the plain encoder-decoder: the context is always the last real annotation
        and the weights are one-hot on it (``scorer`` and ``window`` are then unused).
    scorer : {"dot", "general", "additive", "scaled_dot"}, default="additive"
    input_feeding : bool, default=True
        Luong only (ignored by the Bahdanau decoder, whose context already enters the RNN).
    window : int, default=10
        Half-width ``D`` of a local attention window.
    num_heads : int, default=1
        Attention heads; must divide ``hidden_size``.
    attention_size : int or None, default=None
        Hidden size of the additive scorer (``None``: the ``Attention`` default).

    Attributes
    ----------
    config : dict
        The constructor's arguments, enough to rebuild the module before ``load_state_dict``.
    state_names : tuple of str
        Names of the decoder state tensors, in order: ``("hidden",)``, ``("hidden", "cell")``,
        plus ``"feed"`` for Luong with input feeding. Each is batch-first: ``hidden`` and ``cell``
        are ``(B, num_layers, hidden_size)``, ``feed`` is ``(B, hidden_size)``.

    Examples
    --------
    >>> import torch
    >>> model = Seq2SeqModule(10, 12, embedding_dim=8, hidden_size=16).eval()
    >>> src, lengths = torch.tensor([[4, 5, 2], [6, 2, 0]]), torch.tensor([3, 2])
    >>> logits, weights = model(src, lengths, torch.tensor([[1, 7], [1, 8]]))
    >>> tuple(logits.shape), tuple(weights.shape)
    ((2, 2, 12), (2, 2, 3))
    """

    def __init__(
        self,
        source_vocab_size: int,
        target_vocab_size: int,
        *,
        embedding_dim: int = 64,
        hidden_size: int = 128,
        num_layers: int = 1,
        dropout: float = 0.0,
        cell: str = "gru",
        decoder: str = "bahdanau",
        attention: str = "global",
        scorer: str = "additive",
        input_feeding: bool = True,
        window: int = 10,
        num_heads: int = 1,
        attention_size: int | None = None,
    ) -> None:
        super().__init__()
        config = dict(
            source_vocab_size=source_vocab_size,
            target_vocab_size=target_vocab_size,
            embedding_dim=embedding_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
            cell=cell,
            decoder=decoder,
            attention=attention,
            scorer=scorer,
            input_feeding=input_feeding,
            window=window,
            num_heads=num_heads,
            attention_size=attention_size,
        )
        validate_config(config)
        # NumPy scalars (a GridSearchCV grid from np.arange) become Python numbers: torch.nn
        # wants int sizes, and the config goes into the artifact's JSON manifest.
        self.config = config = {name: _python_scalar(value) for name, value in config.items()}
        sizes = [config[name] for name in ("embedding_dim", "hidden_size", "num_layers")]
        embedding_dim, hidden_size, num_layers = sizes
        dropout = config["dropout"]
        self.encoder = BiRNNEncoder(
            config["source_vocab_size"], embedding_dim, hidden_size, num_layers, dropout, cell
        )
        self.bridge = nn.Linear(2 * hidden_size, hidden_size, bias=False)  # W_m
        self.attention = _make_attention(config)
        decoder_args = (config["target_vocab_size"], *sizes, dropout, cell)
        if decoder == "bahdanau":
            self.decoder = BahdanauDecoder(*decoder_args, self.attention)
        else:
            self.decoder = LuongDecoder(*decoder_args, self.attention, input_feeding)

    @property
    def state_names(self) -> tuple[str, ...]:
        return self.decoder.state_names

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
            ``H @ W_m``, the projected annotations (zero at padding).
        keys : Tensor (B, T, k)
            ``Attention.precompute(memory)`` (``memory`` itself for ``attention="none"``).
        mask : Tensor (B, T) bool
            ``True`` at real positions.
        state : tuple of Tensor
            The initial decoder state, named by :attr:`state_names`.
        """
        encoded = self.encoder(src, src_lengths)
        memory = self.bridge(encoded.annotations)  # (B, T, H)
        keys = self.attention.precompute(memory)  # (B, T, k)
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
            The target position ``i`` (0 at the first step); centres local-m windows.

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

    def forward_stepwise(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` computed one decoder step at a time, whatever the decoder.

        The same function as :meth:`forward`; it exists as the sequential baseline that
        ``benchmarks/bench_train.py`` compares the parallel Luong path against.
        """
        memory, keys, mask, state = self.encode(src, src_lengths)
        return step_loop(self.decoder.step, tgt_in, state, memory, keys, mask)


def _make_attention(config: dict) -> nn.Module:
    """``Attention`` for the configured scorer and window, or the final-state context."""
    if config["attention"] == "none":
        return FinalStateContext()
    hidden_size = config["hidden_size"]
    return Attention(
        config["scorer"],
        hidden_size,
        hidden_size,
        attention_size=config["attention_size"],
        num_heads=config["num_heads"],
        local=LOCAL[config["attention"]],
        window=config["window"],
    )
