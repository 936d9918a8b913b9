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

__all__ = ["OPTIONS", "ModelConfig"]

#: The choices of each string hyperparameter (the estimator's constraints use them too).
OPTIONS: dict[str, tuple[str, ...]] = {
    "cell": ("gru", "lstm"),
    "decoder": ("bahdanau", "luong"),
    "attention": ("global", "local-m", "local-p", "none"),
    "scorer": ("dot", "general", "additive", "scaled_dot"),
}

_SIZES = ("source_vocab_size", "target_vocab_size", "embedding_dim", "hidden_size")
_COUNTS = ("num_layers", "num_heads", "window")


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
    hidden_size : int, default=128
        Units per encoder direction and in the decoder; an annotation has ``2 * hidden_size``.
    num_layers : int, default=1
        Layers of the encoder (each bidirectional) and of the decoder.
    dropout : float in [0, 1), default=0.0
        On embeddings, between layers and before the output projection.
    cell : {"gru", "lstm"}, default="gru"
    decoder : {"bahdanau", "luong"}, default="bahdanau"
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

    def __post_init__(self) -> None:
        clean: dict[str, Any] = {name: check_int(getattr(self, name), name) for name in _SIZES}
        clean |= {name: check_int(getattr(self, name), name) for name in _COUNTS}
        clean["attention_size"] = check_int(self.attention_size, "attention_size", none_ok=True)
        clean["dropout"] = check_real(self.dropout, "dropout", 0.0, 1.0, high_open=True)
        for name, choices in OPTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
            clean[name] = str(value)
        if not isinstance(self.input_feeding, bool | np.bool_):
            raise ValueError(f"input_feeding must be a bool, got {self.input_feeding!r}")
        clean["input_feeding"] = bool(self.input_feeding)
        if clean["hidden_size"] % clean["num_heads"]:
            raise ValueError(
                f"num_heads must divide hidden_size, got num_heads={self.num_heads} and "
                f"hidden_size={self.hidden_size}"
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
