"""Attention heatmaps: one row per output token, one column per source token.

matplotlib is imported inside the function, so importing ``skattn.plotting`` costs nothing and
works on a headless machine (pass ``ax`` from a figure made with any backend, or let the
function create one; it never calls ``plt.show``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["plot_attention"]


def plot_attention(
    weights: Any,
    source_tokens: Sequence[str],
    output_tokens: Sequence[str],
    ax: Any = None,
    *,
    cmap: str = "viridis",
    colorbar: bool = True,
    annotate: bool = False,
    title: str | None = None,
) -> Any:
    """Draw an alignment matrix ``alpha[i, j]`` (output ``i`` reads source ``j``) as a heatmap.

    Parameters
    ----------
    weights : array-like of shape (T_y, T_x)
        Attention weights, e.g. one item of ``Seq2Seq.predict_attention``; values in [0, 1].
    source_tokens : sequence of str, length T_x
        Column labels (include the end-of-source marker, e.g. ``"</s>"``, when the map has a
        column for it).
    output_tokens : sequence of str, length T_y
        Row labels.
    ax : matplotlib Axes, optional
        Where to draw; a new figure is created when omitted.
    cmap : str, default="viridis"
    colorbar : bool, default=True
        Add a colour bar beside the heatmap.
    annotate : bool, default=False
        Write each weight in its cell (readable for small maps).
    title : str, optional

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> ax = plot_attention([[0.1, 0.9], [0.8, 0.2]], ["a", "b"], ["b", "a"])
    >>> [t.get_text() for t in ax.get_xticklabels()]
    ['a', 'b']
    """
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 2:
        raise ValueError(f"weights must be 2-D (T_y, T_x), got shape {weights.shape}")
    T_y, T_x = weights.shape
    if len(source_tokens) != T_x:
        raise ValueError(
            f"source_tokens must have one token per column of weights ({T_x}), "
            f"got {len(source_tokens)}"
        )
    if len(output_tokens) != T_y:
        raise ValueError(
            f"output_tokens must have one token per row of weights ({T_y}), "
            f"got {len(output_tokens)}"
        )

    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.45 * T_x, 1.0 + 0.45 * T_y), layout="constrained")
    image = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(T_x), [str(t) for t in source_tokens])
    ax.set_yticks(range(T_y), [str(t) for t in output_tokens])
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if annotate:
        for (i, j), value in np.ndenumerate(weights):
            color = "black" if value > 0.5 else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    if title is not None:
        ax.set_title(title)
    return ax
