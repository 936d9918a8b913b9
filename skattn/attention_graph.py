"""``attention.onnx``: every layer's and head's cross-attention maps of the Transformer decoder.

An optional graph of the artifact, written for ``decoder="transformer"`` only::

    attention.onnx     = Seq2SeqModule.cross_attention
        inputs   src          (B, T) int64     as encoder.onnx reads it
                 src_lengths  (B,)   int64
                 tokens       (B, L) int64     output tokens, 0 after each item's end
                                               (decode.onnx's ``tokens`` output as it is)
                 temperature  ()     float32   the temperature the tokens were decoded at
        outputs  weights      (B, layers, heads, L, T) float32
                              row i: the step that wrote tokens[:, i]; rows sum to 1 over
                              real source positions, 0 on padding

One teacher-forced pass: the encoder, then the decoder over ``[BOS] + tokens[:, :-1]`` with
every layer's weights. The decoder is causal, so row ``i`` equals what the decoder step
attended with at position ``i`` (:mod:`skattn.core.attention_maps`); the search and its graphs
are unchanged, and the runtime runs this graph only for a request that names a layer or head.
``layers`` and ``heads`` are fixed in the graph's output shape; ``B``, ``T`` and ``L`` are
dynamic. The export is verified in onnxruntime against the torch module at untraced shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from skattn.core.manifest import ATTENTION_FILE, Manifest

__all__ = [
    "ATTENTION_AXES",
    "CrossAttentionGraph",
    "build_attention_graph",
    "verify_attention_graph",
]

#: Dynamic axes of ``attention.onnx`` (``layers`` and ``heads`` stay fixed).
ATTENTION_AXES = {
    "src": {0: "B", 1: "T"},
    "src_lengths": {0: "B"},
    "tokens": {0: "B", 1: "L"},
    "weights": {0: "B", 3: "L", 4: "T"},
}
_TOLERANCE = 1e-4
# Output lengths to trace (with the exporter's traced sources, B = 3) and to verify at (B = 5):
# an empty output, and outputs longer than their sources.
_TRACE_OUTPUTS = (3, 5, 0)
_VERIFY_OUTPUTS = (9, 1, 4, 12, 2)


class CrossAttentionGraph(nn.Module):
    """``Seq2SeqModule.cross_attention`` with the graph's inputs: what ``attention.onnx`` is."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.train(model.training)  # as skattn.tracing.EncoderModule: never switch dropout on

    def forward(
        self,
        src: torch.Tensor,
        src_lengths: torch.Tensor,
        tokens: torch.Tensor,
        temperature: torch.Tensor,
    ) -> tuple[torch.Tensor]:
        return (self.model.cross_attention(src, src_lengths, tokens, temperature),)


def build_attention_graph(
    model: nn.Module,
    manifest: Manifest,
    trace: Callable[..., onnx.ModelProto],
    traced_source: tuple[torch.Tensor, torch.Tensor],
    verified_source: tuple[torch.Tensor, torch.Tensor],
) -> onnx.ModelProto:
    """``attention.onnx`` of a Transformer-decoder ``model``, traced and verified.

    ``trace(module, args, input_names, output_names, dynamic_axes)`` is the exporter's tracer
    (``skattn.tracing.to_onnx``); ``traced_source`` and ``verified_source`` are ``(src,
    src_lengths)`` pairs of different shapes: the graph is checked at untraced ones.
    """
    n_target = len(manifest.target_vocabulary)
    args = example_inputs(*traced_source, _TRACE_OUTPUTS, n_target, seed=0)
    names = (manifest.attention_inputs(), manifest.attention_outputs())
    graph = trace(CrossAttentionGraph(model), args, *names, ATTENTION_AXES)
    args = example_inputs(*verified_source, _VERIFY_OUTPUTS, n_target, seed=1)
    verify_attention_graph(graph, model, manifest, args)
    return graph


def example_inputs(
    src: torch.Tensor,
    src_lengths: torch.Tensor,
    lengths: tuple[int, ...],
    vocab_size: int,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    """``(src, src_lengths, tokens, temperature)``: random output tokens of ``lengths``."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(src.shape[0], max(lengths), dtype=torch.int64)  # (B, L)
    for row, length in enumerate(lengths):
        tokens[row, :length] = torch.randint(4, vocab_size, (length,), generator=generator)
    return src, src_lengths, tokens, torch.tensor(0.8, dtype=torch.float32)


def verify_attention_graph(
    proto: onnx.ModelProto, model: nn.Module, manifest: Manifest, args: tuple
) -> None:
    """Run ``attention.onnx`` on ``args`` in onnxruntime and compare with the torch module.

    Raises
    ------
    RuntimeError
        The shape differs, or a weight differs by more than 1e-4.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )
    feeds = {name: a.numpy() for name, a in zip(manifest.attention_inputs(), args, strict=True)}
    (actual,) = session.run(manifest.attention_outputs(), feeds)
    with torch.no_grad():
        (expected,) = (w.numpy() for w in CrossAttentionGraph(model)(*args))
    if actual.shape != expected.shape:
        raise RuntimeError(
            f"{ATTENTION_FILE}: weights have shape {actual.shape} in onnxruntime, "
            f"{expected.shape} in torch: an axis was fixed while tracing"
        )
    if not np.allclose(actual, expected, atol=_TOLERANCE, rtol=_TOLERANCE):
        raise RuntimeError(f"{ATTENTION_FILE}: weights differ between onnxruntime and torch")
