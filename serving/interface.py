"""What the server's parts expect of a served model: the ``Runtime`` protocol and ``ModelInfo``.

The app, the batcher, the explorer and the test doubles meet here instead of duck-typing each
other's attributes. :class:`serving.runtime.Runtime` (what ``serving.load`` returns) implements
the protocol; so does any test double with the same three members.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from skattn.core.attention_maps import MapSelection, check_selection

__all__ = ["MAX_LISTED_TOKENS", "ModelInfo", "Runtime", "vocabulary_id"]


@dataclass(frozen=True)
class ModelInfo:
    """What clients and the explorer may know about a served model (no weights, no graphs).

    Attributes
    ----------
    name : str
        The name the runtime was loaded under (the server may serve it under another).
    provider : str
        Where the graphs run: ``"CPUExecutionProvider"``, ``"CUDAExecutionProvider"``, ...
    max_source_length, max_output_length : int
        Limits in tokens: longer sources are refused; outputs stop after this many tokens.
    output_kind : {"str", "tokens"}
        What a prediction is: a str, or a list of tokens (sent joined by single spaces).
    tokenizer : {"char", "space"}
        How a source string is split into tokens.
    decoder, attention, scorer : str
        The model's kind (``attention="none"``: no attention, one-hot maps on the final state).
    beam_size : int
        1 decodes greedily.
    temperature : float
        The default attention softmax temperature (a request may pass another).
    vocabulary_id : str
        The first 16 hex digits of the SHA-256 of both vocabularies: equal for models trained
        on the same data (the explorer pairs models by it).
    warmup_source : str, default=""
        A source the server translates (with attention) before it reports ready, so that a
        model that cannot serve fails at start-up rather than in its first batches. Best: one
        of each source token, within ``max_source_length`` (every embedding row is then
        looked up once); the empty source exercises the graphs but not the vocabulary.
    attention_layers, attention_heads : int, default=0
        The decoder layers and heads whose cross-attention maps a request may select
        (:meth:`map_selection`); 0 when the model has none (an RNN decoder, or a Transformer
        artifact exported without ``attention.onnx``).
    source_tokens : tuple of str, default=()
        The source vocabulary's ordinary tokens, when it has at most ``MAX_LISTED_TOKENS``
        (the explorer labels a typed token outside them ``<unk>``, as the model reads it);
        empty when larger or not known.
    """

    name: str
    provider: str
    max_source_length: int
    max_output_length: int
    output_kind: str
    tokenizer: str
    decoder: str
    attention: str
    scorer: str
    beam_size: int
    temperature: float
    vocabulary_id: str
    warmup_source: str = ""
    attention_layers: int = 0
    attention_heads: int = 0
    source_tokens: tuple[str, ...] = ()

    def map_selection(
        self,
        layer: object,
        head: object,
        *,
        names: tuple[str, str] = ("layer", "head"),
        allow_all: bool = True,
    ) -> MapSelection | None:
        """Check a request for per-layer / per-head maps against this model; None when both are
        None (the default map). ``ValueError`` names the parameter (``names``) and says why."""
        if self.decoder == "transformer":
            why = "the artifact has no attention.onnx (exported before them): re-export it"
        else:
            why = f"only the Transformer decoder has them; this model's decoder is {self.decoder!r}"
        return check_selection(
            layer,
            head,
            self.attention_layers,
            self.attention_heads,
            unavailable=f"per-layer and per-head attention maps are not available: {why}",
            names=names,
            allow_all=allow_all,
        )


#: The most source tokens a model's :class:`ModelInfo` lists (a character vocabulary has tens;
#: a word vocabulary's listing would outweigh its use).
MAX_LISTED_TOKENS = 4096


def vocabulary_id(source_vocabulary: Sequence[str], target_vocabulary: Sequence[str]) -> str:
    """A short digest of two vocabularies (token lists in id order, specials included)."""
    text = json.dumps(
        [list(source_vocabulary), list(target_vocabulary)],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@runtime_checkable
class Runtime(Protocol):
    """A model the server can serve: ``serving.load`` returns one.

    ``predict_batch`` blocks (the batcher calls it from a worker thread); ``check_source``
    is cheap and runs on the event loop, before an item may join a batch, so that one bad
    source never fails a batch. A runtime may also have ``terminate()``, which ends the
    ``predict_batch`` in progress (it raises); the batcher calls it, from the event loop, when
    no request waits for that batch any more.
    """

    @property
    def info(self) -> ModelInfo: ...

    def check_source(self, text: object) -> None:
        """Raise ``ValueError`` (naming the problem) if ``text`` cannot be translated."""
        ...

    def predict_batch(
        self,
        sources: Sequence[str],
        temperature: float | None = None,
        with_attention: bool = False,
        *,
        layer: int | None = None,
        head: int | None = None,
    ) -> tuple[list[str] | list[list[str]], list[np.ndarray] | None]:
        """Predictions for ``sources`` and, with ``with_attention``, their ``(T_y, T_x)`` maps:
        layer ``layer``'s head ``head`` (None: the mean over heads) when either is set. The
        batcher passes ``layer`` and ``head`` only when one is set, after
        :meth:`ModelInfo.map_selection` accepted them, so a runtime whose ``info`` has no
        ``attention_layers`` need not take them."""
        ...
