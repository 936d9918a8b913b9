r"""Per-layer and per-head attention maps of the Transformer decoder, computed after decoding.

The search collects one map per output token: the last layer's cross-attention, averaged over
heads (:meth:`~skattn.core.inference.Translator.translate`). The others come from one
teacher-forced pass of the decoder over ``(source, predicted tokens)`` once the search is done
(``Seq2SeqModule.cross_attention``, ``attention.onnx``)::

    alpha[l, h, i, j]  (L, H, T_y, T_x)   head h of layer l, output token i, source position j

The decoder is causal, so row ``i`` of that pass reads exactly the prefix that step ``i`` of
the search read (for a beam hypothesis: the steps of its own path), and its weights are those
of the step: ``alpha[-1].mean(axis=0)`` is the search's map. The search itself is unchanged,
and a request that asks for no layer or head pays nothing for them.

A :class:`MapSelection` says which maps to report: ``layer`` an index (negative ones count from
the last layer) or ``"all"``; ``head`` an index, ``"all"`` or None (the mean over heads). Each
``"all"`` keeps its axis, so a map is ``(T_y, T_x)``, ``(H, T_y, T_x)``, ``(L, T_y, T_x)`` or
``(L, H, T_y, T_x)``.

NumPy only: the estimator (torch) and ``serving`` (onnxruntime) both call
:func:`translate_with_maps`, each with its own ``cross_attention`` callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from skattn.core.inference import SearchSettings, Translator
from skattn.core.text import pad_batch

__all__ = [
    "ALL",
    "MAX_PASS_ELEMENTS",
    "Index",
    "MapSelection",
    "check_selection",
    "rows_reversed",
    "translate_with_maps",
]

#: The value of ``layer`` / ``head`` that keeps every layer / head as an axis.
ALL = "all"
#: The most weights one teacher-forced pass returns (B x L x H x T_y x T_x float32, 64 MiB):
#: the items of a larger chunk are passed in several runs.
MAX_PASS_ELEMENTS = 1 << 24

#: A ``layer`` or ``head`` as a caller gives it: an index, ``"all"`` or None.
Index = int | str | None
#: ``cross_attention(src (B, T) int64, src_lengths (B,) int64, tokens (B, T_y) int64,
#: temperature) -> weights (B, L, H, T_y, T) float``
CrossAttention = Callable[[np.ndarray, np.ndarray, np.ndarray, float], np.ndarray]


@dataclass(frozen=True)
class MapSelection:
    """Which cross-attention maps to report, checked against a model's layers and heads.

    Attributes
    ----------
    layer : int or "all"
        A layer index in ``[0, num_layers)`` (negative ones resolved), or every layer.
    head : int, "all" or None
        A head index in ``[0, num_heads)``, every head, or None: the mean over heads.
    num_layers, num_heads : int
        The model's.
    """

    layer: int | str
    head: int | str | None
    num_layers: int
    num_heads: int

    def apply(self, weights: np.ndarray) -> np.ndarray:
        """The selected maps of one item's ``weights (L, H, T_y, T_x)`` (see the module doc)."""
        layers = weights if self.layer == ALL else weights[self.layer : self.layer + 1]
        if self.head is None:
            heads = layers.mean(axis=1, keepdims=True)  # (L', 1, T_y, T_x)
        elif self.head == ALL:
            heads = layers  # (L', H, T_y, T_x)
        else:
            heads = layers[:, self.head : self.head + 1]  # (L', 1, T_y, T_x)
        if self.head != ALL:
            heads = heads[:, 0]  # drop the head axis
        return heads if self.layer == ALL else heads[0]  # drop the layer axis

    def empty(self, n_source: int) -> np.ndarray:
        """Every layer's and head's maps of an item with no output token: ``(L, H, 0, T_x)``."""
        return np.zeros((self.num_layers, self.num_heads, 0, n_source))


def check_selection(
    layer: object,
    head: object,
    num_layers: int,
    num_heads: int,
    *,
    unavailable: str = "",
    names: tuple[str, str] = ("layer", "head"),
    allow_all: bool = True,
) -> MapSelection | None:
    """Validate a ``(layer, head)`` request; None when both are None (the search's own maps).

    Parameters
    ----------
    layer, head : object
        As the caller received them.
    num_layers, num_heads : int
        The model's; 0 when it has no per-layer maps (then any request raises).
    unavailable : str
        Why the model has none (said in the error when ``num_layers`` is 0).
    names : (str, str)
        What the caller calls the two parameters (``parameters.attention_layer`` ...).
    allow_all : bool
        Whether ``"all"`` is a valid value.

    Raises
    ------
    ValueError
        Naming the parameter: not an int (or ``"all"``), out of range, or no maps to select.
    """
    if layer is None and head is None:
        return None
    if num_layers == 0:
        name = names[0] if layer is not None else names[1]
        raise ValueError(f"{name}: {unavailable or 'this model has no per-layer attention maps'}")
    layer = _index(layer, num_layers, names[0], "layers", allow_all)
    head = _index(head, num_heads, names[1], "heads", allow_all)
    last = num_layers - 1  # no layer named: the last, as the search's own maps
    return MapSelection(last if layer is None else layer, head, num_layers, num_heads)


def _index(value: object, size: int, name: str, what: str, allow_all: bool) -> int | str | None:
    if value is None or (allow_all and isinstance(value, str) and value == ALL):
        return value  # type: ignore[return-value]
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        kinds = f"an int, {ALL!r} or None" if allow_all else "an integer"
        raise ValueError(f"{name} must be {kinds}, got {value!r:.40}")
    if not -size <= value < size:
        raise ValueError(
            f"{name}={value} is out of range: the decoder has {size} {what} "
            f"(0 to {size - 1}, or -{size} to -1 from the last)"
        )
    return int(value) % size


def translate_with_maps(
    translator: Translator,
    token_lists: Sequence[Sequence[str]],
    settings: SearchSettings,
    selection: MapSelection,
    cross_attention: CrossAttention,
) -> tuple[list, list[np.ndarray]]:
    """Predictions, as :meth:`Translator.translate` gives them, and their selected maps.

    The search runs as always; then :func:`teacher_forced_maps` computes every layer's and
    head's weights of the predicted tokens, of which ``selection`` keeps some (float64).
    """
    id_lists = translator.source_ids(token_lists)
    hypotheses = translator.decode(id_lists, settings)
    outputs = [h.tokens for h in hypotheses]  # as written: the graph reads them so
    temperature, limit = settings.temperature, translator.max_batch_size
    maps = teacher_forced_maps(cross_attention, id_lists, outputs, temperature, selection, limit)
    maps = [selection.apply(m).astype(np.float64) for m in maps]  # (..., T_y, T_x)
    if translator.right_to_left:  # the usual order, as Translator.read gives it
        outputs, maps = [t[::-1] for t in outputs], rows_reversed(maps)
    return [translator.output(tokens) for tokens in outputs], maps


def rows_reversed(maps: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each map ``(..., T_y, T_x)`` with its output rows in reverse order (a right-to-left
    model's, read in the outputs' usual order), as new arrays."""
    return [m[..., ::-1, :].copy() for m in maps]


def teacher_forced_maps(
    cross_attention: CrossAttention,
    id_lists: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
    selection: MapSelection,
    max_batch_size: int,
) -> list[np.ndarray]:
    """Every item's ``(L, H, T_y, T_x)`` weights, in length-sorted chunks, in input order.

    A chunk holds at most ``max_batch_size`` items and :data:`MAX_PASS_ELEMENTS` weights
    (padded); an item's maps never depend on its chunk (padding is masked, and rows past
    an item's end are cut).
    """
    order = np.argsort([len(ids) for ids in id_lists], kind="stable").tolist()
    per_position = selection.num_layers * selection.num_heads
    chunks: list[list[int]] = []
    width = 0  # the longest output of the last chunk
    for index in order:  # ascending source lengths: the latest item is the longest source
        item_width = max(len(outputs[index]), 1)
        grown = max(width, item_width)
        size = (len(chunks[-1]) + 1) * per_position * grown * len(id_lists[index]) if chunks else 0
        if not chunks or len(chunks[-1]) == max_batch_size or size > MAX_PASS_ELEMENTS:
            chunks.append([])
            grown = item_width
        chunks[-1].append(index)
        width = grown
    maps: list[np.ndarray | None] = [None] * len(id_lists)
    for chunk in chunks:
        weights = _pass(cross_attention, chunk, id_lists, outputs, temperature, selection)
        for i, item_weights in zip(chunk, weights, strict=True):
            maps[i] = item_weights
    return maps  # type: ignore[return-value]


def _pass(
    cross_attention: CrossAttention,
    chunk: list[int],
    id_lists: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    temperature: float,
    selection: MapSelection,
) -> list[np.ndarray]:
    """One teacher-forced run over the items ``chunk``: each item's ``(L, H, T_y, T_x)``."""
    sources = [id_lists[i] for i in chunk]
    tokens = [outputs[i] for i in chunk]
    if not any(tokens):  # no output token anywhere: nothing to run
        return [selection.empty(len(ids)) for ids in sources]
    src, src_lengths = pad_batch(sources)  # (B, T), (B,)
    padded, _ = pad_batch(tokens)  # (B, T_y), 0 after each item's end
    weights = cross_attention(src, src_lengths, padded, temperature)  # (B, L, H, T_y, T)
    return [
        weights[b, :, :, : len(out), : len(ids)]  # (L, H, T_y, T_x)
        for b, (ids, out) in enumerate(zip(sources, tokens, strict=True))
    ]
