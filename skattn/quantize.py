"""Dynamic int8 quantization of an artifact's graphs, for onnxruntime on the CPU.

A served G2P or translation model spends nearly all of its time in products with its weights:
the encoder's and decoder's recurrent cells, the attention's projections, the output layers.
On a CPU without fp16 units the one lever on that arithmetic is integers: onnxruntime's
``com.microsoft.DynamicQuantizeMatMul`` quantizes its input row block to uint8 at run time (one
scale and zero point per call), multiplies it by int8 weights quantized once, here, per output
column, and rescales the int32 sums to float32. Two passes, each a plain graph rewrite:

1. :func:`~skattn.recurrent_graph.expand_recurrent` writes every ``GRU`` / ``LSTM`` node as
   the products and gates it computes, so that its weights become ``MatMul`` / ``Gemm``
   inputs (the whole sequence's input products at once, then a ``Scan`` over time); exact in
   float32.
2. :func:`quantize_matmuls` turns every ``MatMul`` and ``Gemm`` whose weight is a constant
   into ``DynamicQuantizeMatMul``, in subgraphs (``Loop`` bodies, ``Scan`` bodies) too.

Weights are symmetric per output column, in 7 bits (``[-63, 63]``): x86's AVX2 int8 product
(``vpmaddubsw``) adds two ``uint8 x int8`` products in a saturating int16, and 8-bit weights can
overflow it (onnxruntime's ``reduce_range``). Products too small to gain (a side under
:data:`MIN_QUANTIZED_SIDE`, such as the additive scorer's ``v``) stay float32, as do products
of two activations (attention scores, contexts).

:func:`quantize_model` runs both passes; ``Seq2Seq.export_onnx(path, quantize="int8")`` applies
it to every graph of an artifact and records ``"quantization": "int8"`` in the manifest, and
:func:`quantize_artifact` (``python -m skattn.quantize SRC DST``) does the same to an artifact
already written. The ``onnx`` protobuf package and NumPy only; no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from skattn.core.artifact import read_artifact
from skattn.core.manifest import MANIFEST_FILE, QUANTIZATIONS
from skattn.onnx_graph import (
    GraphRewriter,
    drop_unused_initializers,
    model_copy,
    node_attributes,
    rewrite_nodes,
    subgraphs,
)
from skattn.recurrent_graph import expand_recurrent

__all__ = [
    "MIN_QUANTIZED_SIDE",
    "QUANTIZATIONS",
    "quantize_artifact",
    "quantize_matmuls",
    "quantize_model",
    "quantize_weight",
]

#: Products with a weight side shorter than this stay float32 (quantizing costs more than it
#: saves; the additive scorer's ``v`` is ``(d, 1)``).
MIN_QUANTIZED_SIDE = 16
#: Largest weight magnitude: 7 bits (see the module docstring).
WEIGHT_LEVELS = 63
MS_DOMAIN = "com.microsoft"


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(K, N)`` float weight -> ``(K, N)`` int8 in ``[-63, 63]`` and ``(N,)`` float32 scales,
    one per output column, with ``weight ~= q * scale``. An all-zero column gets scale 1.

    Raises
    ------
    ValueError
        ``weight`` is not a finite 2-D array.
    """
    weight = np.asarray(weight, dtype=np.float32)
    if weight.ndim != 2 or not np.isfinite(weight).all():
        raise ValueError(f"weight must be a finite 2-D array, got shape {weight.shape}")
    peak = np.abs(weight).max(axis=0)  # (N,)
    scale = np.where(peak > 0, peak / WEIGHT_LEVELS, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return q, scale


# ---------------------------------------------------------------- pass 2: weight products


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Value name -> the nodes (in every graph) that read it; a graph output counts as a
    reader (``None``)."""
    readers: dict[str, list] = {}
    for graph in subgraphs(model.graph):
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        for value in graph.output:
            readers.setdefault(value.name, []).append(None)
    return readers


class _ProductRewriter(GraphRewriter):
    """The rewriter of pass 2: also who reads each value, and the bias ``Add``s folded."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model, "quantize/")
        self.readers = _consumers(model)
        self.folded: set[str] = set()  # outputs of the Adds folded into a product


def _bias_add(rewriter: _ProductRewriter, product: onnx.NodeProto, columns: int):
    """The ``Add`` of the same graph that alone reads ``product``'s output and adds a constant
    ``(columns,)`` vector to it, with that vector; else ``(None, None)``."""
    readers = rewriter.readers.get(product.output[0], [])
    add = readers[0] if len(readers) == 1 else None
    if add is None or add.op_type != "Add" or add.output[0] not in rewriter.current:
        return None, None
    other = [name for name in add.input if name != product.output[0]]
    bias = rewriter.constant(other[0]) if len(other) == 1 else None
    if bias is None or bias.shape != (columns,) or bias.dtype != np.float32:
        return None, None
    return add, bias


def _quantize_product(rewriter: _ProductRewriter, node: onnx.NodeProto) -> list | None:
    """``MatMul(A, W)`` (and the ``Add`` of a bias that alone reads it) or ``Gemm(A, W, c)``
    with a constant 2-D ``W`` -> ``DynamicQuantizeMatMul(A, q(W), scale, 0[, bias])``; an
    ``Add`` folded into an earlier product is dropped."""
    if node.op_type == "Add" and node.output[0] in rewriter.folded:
        return []
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    weight = rewriter.constant(node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    bias, output = None, node.output[0]
    if node.op_type == "Gemm":
        attrs = node_attributes(node)
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
        if attrs.get("transB", 0):
            weight = weight.T
        if len(node.input) > 2 and node.input[2]:
            bias = rewriter.constant(node.input[2])
            if bias is None or bias.shape != (weight.shape[1],):
                return None
            bias = bias * attrs.get("beta", 1.0)
    if min(weight.shape) < MIN_QUANTIZED_SIDE:
        return None
    if node.op_type == "MatMul":
        add, bias = _bias_add(rewriter, node, weight.shape[1])
        if add is not None:
            rewriter.folded.add(add.output[0])
            output = add.output[0]
    q, scale = quantize_weight(weight)
    inputs = [
        node.input[0],
        rewriter.add(q, "weight_int8"),
        rewriter.add(scale, "weight_scale"),
        rewriter.add(np.zeros(scale.shape, np.int8), "weight_zero"),
    ]
    if bias is not None:
        inputs.append(rewriter.add(bias.astype(np.float32), "bias"))
    name = node.name or rewriter.name("product")
    return [
        helper.make_node("DynamicQuantizeMatMul", inputs, [output], name=name, domain=MS_DOMAIN)
    ]


def quantize_matmuls(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose constant-weight ``MatMul`` / ``Gemm`` nodes (subgraphs too)
    are ``DynamicQuantizeMatMul`` with int8 weights, a bias ``Add`` folded in; returns it and
    the count of products."""
    model = model_copy(model)
    rewriter = _ProductRewriter(model)
    count = rewrite_nodes(rewriter, _quantize_product) - len(rewriter.folded)
    if count:
        drop_unused_initializers(model)
        if all(opset.domain != MS_DOMAIN for opset in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model, count


def quantize_model(model: onnx.ModelProto, quantization: str = "int8") -> onnx.ModelProto:
    """Both passes: the recurrent cells expanded, then every weight product in int8.

    Raises
    ------
    ValueError
        ``quantization`` is not one of :data:`QUANTIZATIONS`.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    expanded, _ = expand_recurrent(model)
    quantized, _ = quantize_matmuls(expanded)
    return quantized


# ---------------------------------------------------------------- artifacts


def quantize_artifact(source, destination, quantization: str = "int8") -> Path:
    """Copy the artifact directory ``source`` to ``destination`` with every graph quantized
    (:func:`quantize_model`) and the manifest saying so; other files (a packaged model's
    ``RECIPE.md``, ``LICENSE``) are copied as they are. Returns ``destination``.

    Raises
    ------
    ValueError
        ``quantization`` is unknown, ``source`` is already quantized, or ``destination``
        exists; an :class:`~skattn.core.manifest.ArtifactError` (a ``ValueError``) when
        ``source`` is not an intact artifact (:func:`skattn.core.artifact.read_artifact`).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    source, destination = Path(source), Path(destination)
    manifest = read_artifact(source).manifest
    if manifest.quantization != "none":
        raise ValueError(f"source: {source} is already quantized ({manifest.quantization})")
    if destination.exists():
        raise ValueError(f"destination: {destination} exists; name a new directory")
    destination.mkdir(parents=True)
    try:
        for path in source.iterdir():
            if path.name in manifest.files:
                onnx.save_model(
                    quantize_model(onnx.load(path), quantization), destination / path.name
                )
            elif path.is_file() and path.name != MANIFEST_FILE:
                shutil.copy2(path, destination / path.name)
        quantized = dataclasses.replace(manifest, quantization=quantization)
        quantized = quantized.with_files(destination)
        (destination / MANIFEST_FILE).write_text(quantized.to_json(), encoding="utf-8")
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    return destination


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m skattn.quantize",
        description="Write an int8 copy of an exported artifact, for onnxruntime on the CPU.",
    )
    parser.add_argument("source", help="an artifact directory (Seq2Seq.export_onnx)")
    parser.add_argument("destination", help="a new directory for the quantized copy")
    args = parser.parse_args(argv)
    try:
        print(quantize_artifact(args.source, args.destination))
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
