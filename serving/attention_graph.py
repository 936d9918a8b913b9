"""``attention.onnx`` in the runtime: every layer's and head's cross-attention maps.

The optional graph of a Transformer-decoder artifact (written by ``skattn.attention_graph``)::

    src (B, T) int64, src_lengths (B,) int64, tokens (B, L) int64, temperature () float32
        -> weights (B, layers, heads, L, T) float32

:class:`AttentionGraph` is the ``cross_attention`` callable that
:func:`skattn.core.attention_maps.translate_with_maps` runs after the search, for requests that
name a layer or head; ``layers`` and ``heads`` are the fixed axes of the graph's output, what
``ModelInfo.attention_layers`` / ``attention_heads`` report. numpy and onnxruntime only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from skattn.core.manifest import ArtifactError, Manifest

__all__ = ["AttentionGraph"]


class AttentionGraph:
    """An opened ``attention.onnx`` and the layers and heads of its maps.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        Opened with its signature and binding checked (``serving.sessions.open_graph``).
    manifest : Manifest
    path : Path
        Named in errors.

    Raises
    ------
    ArtifactError
        The weights' layer and head axes are not fixed positive sizes.
    """

    def __init__(self, session: ort.InferenceSession, manifest: Manifest, path: Path) -> None:
        self.session = session
        self.path = path
        self.outputs = manifest.attention_outputs()
        layers, heads = session.get_outputs()[0].shape[1:3]
        if not (isinstance(layers, int) and isinstance(heads, int) and layers > 0 and heads > 0):
            raise ArtifactError(
                f"{path}: weights must have fixed layer and head axes, not {layers!r}, {heads!r}"
            )
        self.layers, self.heads = layers, heads

    def __call__(
        self, src: np.ndarray, src_lengths: np.ndarray, tokens: np.ndarray, temperature: float
    ) -> np.ndarray:
        """Every layer's and head's weights while writing ``tokens``: ``(B, L, H, T_y, T)``."""
        feeds = {
            "src": src,  # (B, T)
            "src_lengths": src_lengths.astype(np.int64),  # (B,)
            "tokens": tokens,  # (B, T_y)
            "temperature": np.asarray(temperature, dtype=np.float32),  # ()
        }
        return self.session.run(self.outputs, feeds)[0]

    def check(self, src: np.ndarray) -> None:
        """Run once on ``src (B, T)`` (no padding) and two output tokens; ``ArtifactError``
        unless it answers weights of shape ``(B, layers, heads, 2, T)``: graphs that load but
        cannot run with the manifest's vocabularies fail at load, not in a request."""
        B, T = src.shape
        tokens = np.full((B, 2), 4, dtype=np.int64)  # (B, 2): the first ordinary target id
        try:
            weights = self(src, np.full(B, T, dtype=np.int64), tokens, 1.0)
        except Exception as error:  # onnxruntime's own exception types
            raise ArtifactError(
                f"{self.path}: the graph does not run with the manifest's vocabularies "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from None
        expected = (B, self.layers, self.heads, 2, T)
        if weights.shape != expected:
            raise ArtifactError(
                f"{self.path}: answered weights of shape {weights.shape} instead of {expected}"
            )
