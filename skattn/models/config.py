"""``ModelConfig``: the hyperparameters of a ``Seq2SeqModule``, written once.

The estimator builds it from its parameters of the same names (:meth:`ModelConfig.from_params`),
the module is built from it (``Seq2SeqModule(config)``), pickles and the artifact's manifest
store its :meth:`~ModelConfig.to_dict` (JSON-safe). The file itself imports no torch, though
importing it through the ``skattn.models`` package does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from skattn.core.checks import check_int, check_real
from skattn.core.manifest import MAX_SOURCE_LENGTH

__all__ = ["MAXIMA", "OPTIONS", "ModelConfig"]

#: The choices of each string hyperparameter (the estimator's constraints use them too).
OPTIONS: dict[str, tuple[str, ...]] = {
    "encoder": ("rnn", "transformer"),
    "cell": ("gru", "lstm"),
    "decoder": ("bahdanau", "luong", "transformer"),
    "attention": ("global", "local-m", "local-p", "none"),
    "scorer": ("dot", "general", "additive", "scaled_dot"),
    "positions": ("sinusoidal", "learned", "none"),
}

#: The largest value of each size and count: far past any model that fits in memory, so that
#: a mistyped value is refused by name instead of overflowing inside torch (a window of 2**64)
#: or allocating for minutes. A model under these limits that does not fit in memory is
#: refused when ``fit`` builds it.
MAX_WIDTH = 65_536
MAXIMA: dict[str, int] = {
    "embedding_dim": MAX_WIDTH,
    "hidden_size": MAX_WIDTH,
    "attention_size": MAX_WIDTH,
    "num_heads": MAX_WIDTH,
    "num_kv_heads": MAX_WIDTH,
    "ffn_size": 4 * MAX_WIDTH,
    "num_layers": 1_024,
    "window": MAX_SOURCE_LENGTH,  # a window as wide as the longest source an artifact takes
    "max_positions": MAX_SOURCE_LENGTH,
}

_SIZES = ("source_vocab_size", "target_vocab_size", "embedding_dim", "hidden_size")
_COUNTS = ("num_layers", "num_heads", "window", "max_positions")
_OPTIONAL = ("attention_size", "num_kv_heads", "ffn_size")
#: Fields that only the Transformer blocks read, and what only the RNN side reads.
_TRANSFORMER_ONLY = ("num_kv_heads", "ffn_size", "positions")
_UNUSED_BY_TRANSFORMER_DECODER = ("attention", "attention_size", "window")
_UNUSED_BY_TRANSFORMER_MODEL = ("cell", "embedding_dim")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters of a :class:`~skattn.models.Seq2SeqModule`.

    Validated on creation (``ValueError`` naming the field); NumPy scalars (a GridSearchCV grid
    from ``np.arange``) become Python numbers, since ``torch.nn`` wants ``int`` sizes and the
    manifest is JSON.

    Parameters
    ----------
    source_vocab_size, target_vocab_size : int
        Vocabulary sizes, specials included (``PAD=0``, ``BOS=1``, ``EOS=2``, ``UNK=3``).
    embedding_dim : int, default=64
        RNN embeddings: the RNN encoder's and an RNN decoder's. The Transformer blocks embed
        into ``hidden_size``, so with both families Transformer this must stay at its default.
    hidden_size : int, default=128
        RNN: units per encoder direction and in the decoder (an annotation has
        ``2 * hidden_size``). Transformer: ``d_model``, the width of every block and of its
        embeddings; an RNN decoder over a Transformer encoder reads memory of this width.
    num_layers : int, default=1
        RNN: layers of the encoder (each bidirectional) and of the decoder. Transformer:
        blocks in the encoder and in the decoder.
    dropout : float in [0, 1), default=0.0
        RNN: on embeddings, between layers and before the output projection. Transformer: on
        the embedding sums, every sublayer's output and inside the feed-forward layers.
    encoder : {"rnn", "transformer"}, default="rnn"
        The bidirectional RNN, or pre-LayerNorm self-attention blocks
        (:mod:`skattn.models.transformer`).
    cell : {"gru", "lstm"}, default="gru"
        The RNNs' cell; unused when both families are Transformer (then it must stay "gru").
    decoder : {"bahdanau", "luong", "transformer"}, default="bahdanau"
        ``"transformer"`` needs ``encoder="transformer"``; it always attends with scaled
        dot products over every source position, so ``attention`` must stay "global" and
        ``scorer`` "additive" (the default) or "scaled_dot"; both are stored as
        ``scorer="scaled_dot"`` and ``input_feeding=False``, what the model computes.
    attention : {"global", "local-m", "local-p", "none"}, default="global"
        ``"none"`` is the plain encoder-decoder: the context is always the last real annotation
        and the weights are one-hot on it (``scorer`` and ``window`` are then unused).
    scorer : {"dot", "general", "additive", "scaled_dot"}, default="additive"
    input_feeding : bool, default=True
        Luong only (ignored by the Bahdanau decoder, whose context already enters the RNN).
    window : int, default=10
        Half-width ``D`` of a local attention window.
    num_heads : int, default=1
        Attention heads; must divide ``hidden_size``. Over the RNN encoder: the scorer's heads.
        Transformer: the query heads of every self- and cross-attention; an RNN decoder's
        scorer over a Transformer encoder then has one head (the additive scorer has no other).
    attention_size : int or None, default=None
        Hidden size of the additive scorer (``None``: the ``Attention`` default).
    num_kv_heads : int or None, default=None
        Transformer only: key / value heads (grouped-query; 1 = multi-query); must divide
        ``num_heads``. ``None`` means ``num_heads``.
    ffn_size : int or None, default=None
        Transformer only: feed-forward hidden units; ``None`` means ``4 * hidden_size``.
    positions : {"sinusoidal", "learned", "none"}, default="sinusoidal"
        Transformer only: position encodings (:mod:`skattn.models.positions`). Sinusoidal
        codes are defined at any length; the learned table has ``max_positions`` rows and
        clamps past them, and rows past the longest training length were never trained.
    max_positions : int, default=512
        Rows of a learned position table (not an estimator parameter).

    A field that does not apply to the configured families is accepted at its default and
    refused (``ValueError`` saying why) at any other value.

    Examples
    --------
    >>> config = ModelConfig(10, 12, hidden_size=16)
    >>> ModelConfig.from_dict(config.to_dict()) == config
    True
    """

    source_vocab_size: int
    target_vocab_size: int
    embedding_dim: int = 64
    hidden_size: int = 128
    num_layers: int = 1
    dropout: float = 0.0
    cell: str = "gru"
    decoder: str = "bahdanau"
    attention: str = "global"
    scorer: str = "additive"
    input_feeding: bool = True
    window: int = 10
    num_heads: int = 1
    attention_size: int | None = None
    encoder: str = "rnn"
    num_kv_heads: int | None = None
    ffn_size: int | None = None
    positions: str = "sinusoidal"
    max_positions: int = 512

    def __post_init__(self) -> None:
        clean: dict[str, Any] = {
            name: check_int(getattr(self, name), name, 1, MAXIMA.get(name))
            for name in _SIZES + _COUNTS
        }
        clean |= {
            name: check_int(getattr(self, name), name, 1, MAXIMA[name], none_ok=True)
            for name in _OPTIONAL
        }
        clean["dropout"] = check_real(self.dropout, "dropout", 0.0, 1.0, high_open=True)
        for name, choices in OPTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
            clean[name] = str(value)
        if not isinstance(self.input_feeding, bool | np.bool_):
            raise ValueError(f"input_feeding must be a bool, got {self.input_feeding!r}")
        clean["input_feeding"] = bool(self.input_feeding)
        # the families first: a field that does not apply says so, not that it fails to divide
        clean |= _check_families(clean)
        if clean["hidden_size"] % clean["num_heads"]:
            raise ValueError(
                f"num_heads must divide hidden_size, got num_heads={self.num_heads} and "
                f"hidden_size={self.hidden_size}"
            )
        kv_heads = clean["num_kv_heads"]
        if kv_heads is not None and clean["num_heads"] % kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads, got num_kv_heads={kv_heads} and "
                f"num_heads={self.num_heads}"
            )
        for name, value in clean.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, source_vocab_size: int, target_vocab_size: int
    ) -> ModelConfig:
        """The config of the fields that ``params`` (an estimator's ``get_params()``) names."""
        names = {field.name for field in dataclasses.fields(cls)}
        chosen = {name: value for name, value in params.items() if name in names}
        return cls(source_vocab_size, target_vocab_size, **chosen)

    @property
    def feeds_input(self) -> bool:
        """Whether the decoder feeds its attentional vector back: ``input_feeding`` where the
        decoder reads it (Luong's; Bahdanau's takes the setting at its default and ignores it)."""
        return self.input_feeding and self.decoder == "luong"

    def to_dict(self) -> dict[str, Any]:
        """Every field as a JSON-safe value (what the manifest and a pickle store)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """The inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        unknown = set(data) - {field.name for field in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**data)


def _default(name: str) -> Any:
    return ModelConfig.__dataclass_fields__[name].default


def _refuse_unless_default(clean: dict[str, Any], names: tuple[str, ...], why: str) -> None:
    for name in names:
        if clean[name] != _default(name):
            raise ValueError(
                f"{name}={clean[name]!r} does not apply here: {why}; leave {name} at its "
                f"default ({_default(name)!r})"
            )


def _check_families(clean: dict[str, Any]) -> dict[str, Any]:
    """Refuse combinations that make no sense; return the fields the Transformer decoder fixes.

    A field that a family does not read passes at its default (``input_feeding=True`` with
    ``decoder="transformer"``), any other value raises ``ValueError`` saying why.
    """
    encoder, decoder = clean["encoder"], clean["decoder"]
    if encoder == "rnn":
        if decoder == "transformer":
            raise ValueError(
                "decoder='transformer' needs encoder='transformer': its cross-attention reads "
                "the Transformer encoder's memory"
            )
        _refuse_unless_default(
            clean, _TRANSFORMER_ONLY, "only the Transformer blocks read it (encoder='rnn')"
        )
        return {}
    if decoder != "transformer":
        return {}
    why = "decoder='transformer' always attends with scaled dot products to every position"
    _refuse_unless_default(clean, _UNUSED_BY_TRANSFORMER_DECODER, why)
    if clean["scorer"] not in ("scaled_dot", _default("scorer")):
        raise ValueError(f"scorer={clean['scorer']!r} does not apply here: {why}")
    _refuse_unless_default(
        clean, _UNUSED_BY_TRANSFORMER_MODEL, "no RNN runs when both families are Transformer"
    )
    return {"scorer": "scaled_dot", "input_feeding": False}
