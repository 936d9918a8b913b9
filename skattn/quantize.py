"""Static int8 quantization of an artifact's graphs, for onnxruntime on the CPU.

A served G2P or translation model spends nearly all of its time in products with its weights:
the encoder's and decoder's recurrent cells, the attention's projections, the output layers.
On a CPU without fp16 units the one lever on that arithmetic is integers: each product becomes
``QuantizeLinear`` (its input to uint8, ``q = 128 + round(127 x / r)``, saturating) and
onnxruntime's ``com.microsoft.MatMulIntegerToFloat`` (uint8 x int8 with int32 sums, rescaled
to float32, the bias added). The weights are quantized here, per output column; the input's
range ``r`` is fixed in the graph, measured once by :mod:`skattn.calibrate` while the float32
search decodes calibration sources. A fixed range quantizes each row on its own, so an
answer never depends on the items batched beside it, as with float32; onnxruntime's
``DynamicQuantizeMatMul``, which takes the range of each call's rows, costs the same and does
not have that property (6 % of a served G2P model's answers moved with their batch). Three
passes, each a plain graph rewrite or run, then the weights moved to the bodies that read them:

1. :func:`~skattn.recurrent_graph.expand_recurrent` writes every ``GRU`` / ``LSTM`` node as
   the products and gates it computes, so that its weights become ``MatMul`` / ``Gemm``
   inputs (the whole sequence's input products at once, then a ``Scan`` over time); exact in
   float32.
2. :func:`decode_ranges` runs ``decode.onnx`` so expanded on :func:`skattn.calibrate.decode_feeds`
   and keeps the largest ``|input|`` of every product, in ``Loop`` and ``Scan`` bodies too;
   a product is named by its weight, so one range serves it in every graph of the artifact.
3. :func:`quantize_matmuls` turns every ``MatMul`` and ``Gemm`` whose weight is a constant
   and whose range was measured into the two nodes above, in subgraphs too; a product never
   reached stays float32.

Passes 1 and 3 add their weights to the main graph; :func:`~skattn.onnx_graph.sink_initializers`
then moves each that one ``Loop`` or ``Scan`` body alone reads into it, where onnxruntime
multiplies it faster.

Weights are symmetric per output column, in 7 bits (``[-63, 63]``): x86's AVX2 int8 product
(``vpmaddubsw``) adds two ``uint8 x int8`` products in a saturating int16, and 8-bit weights can
overflow it (onnxruntime's ``reduce_range``). Products too small to gain (a side under
:data:`MIN_QUANTIZED_SIDE`, such as the additive scorer's ``v``) stay float32, as do products
of two activations (attention scores, contexts).

:func:`quantize_model` runs passes 1 and 3 over one graph with given ranges;
``Seq2Seq.export_onnx(path, quantize="int8")`` measures the ranges on the search it has just
verified and quantizes every graph of the artifact, recording ``"quantization": "int8"`` in the
manifest, and :func:`quantize_artifact` (``python -m skattn.quantize SRC DST``) does the same to
an artifact already written. ``quantization="float16"`` (``--quantization float16``) instead
stores the weights in float16 (:mod:`skattn.float16_weights`: no ranges, no rewrite of the
products). The ``onnx`` protobuf package, NumPy and onnxruntime; no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx.external_data_helper import uses_external_data

from skattn.calibrate import Finder, activation_ranges, decode_feeds, product_key
from skattn.core.artifact import read_artifact
from skattn.core.checks import check_path
from skattn.core.manifest import (
    DECODE_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    MANIFEST_FILE,
    QUANTIZATIONS,
    STAGING_PREFIX,
    ArtifactError,
    Manifest,
)
from skattn.decode_graph import build_decode_graph
from skattn.float16_weights import float16_weights
from skattn.onnx_graph import (
    GraphRewriter,
    drop_unused_initializers,
    model_copy,
    node_attributes,
    rewrite_nodes,
    sink_initializers,
    subgraphs,
)
from skattn.recurrent_graph import expand_recurrent, without_guards

__all__ = [
    "MIN_QUANTIZED_SIDE",
    "QUANTIZATIONS",
    "decode_ranges",
    "input_bound",
    "product_finder",
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
#: An input is quantized as ``q = 128 + round(127 x / r)`` in uint8 (``r``: its range).
INPUT_LEVELS = 127
INPUT_ZERO = 128
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


# ---------------------------------------------------------------- passes 2 and 3: ranges, products


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
    """The rewriter of pass 3: the measured ranges, who reads each value, and the bias
    ``Add``s folded."""

    def __init__(self, model: onnx.ModelProto, ranges: dict[str, float]) -> None:
        super().__init__(model, "quantize/")
        self.ranges = ranges
        self.readers = _consumers(model)
        self.folded: set[str] = set()  # outputs of the Adds folded into a product
        self._input_zero: str | None = None

    @property
    def input_zero(self) -> str:
        """The uint8 ``128`` initializer (one per model): every input's zero point."""
        if self._input_zero is None:
            self._input_zero = self.add(np.array(INPUT_ZERO, np.uint8), "input_zero")
        return self._input_zero


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


def _product_weight(
    constant: Callable[[str], np.ndarray | None], node: onnx.NodeProto
) -> tuple | None:
    """``(W (K, N) as multiplied, the Gemm's bias or None)`` when ``node`` is a product pass 3
    quantizes: ``MatMul(A, W)`` or ``Gemm(A, W[, c])`` with a constant 2-D float32 ``W`` at
    least :data:`MIN_QUANTIZED_SIDE` on each side; else None. ``constant(name)`` reads an
    initializer."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    weight = constant(node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    bias = None
    if node.op_type == "Gemm":
        attrs = node_attributes(node)
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
        if attrs.get("transB", 0):
            weight = weight.T
        if len(node.input) > 2 and node.input[2]:
            bias = constant(node.input[2])
            if bias is None or bias.shape != (weight.shape[1],):
                return None
            bias = bias * attrs.get("beta", 1.0)
    if min(weight.shape) < MIN_QUANTIZED_SIDE:
        return None
    return weight, bias


def product_finder(model: onnx.ModelProto) -> Finder:
    """``node -> (product key, input name)`` for the products pass 3 quantizes in ``model``
    (else None): what :func:`skattn.calibrate.activation_ranges` measures."""
    constant = GraphRewriter(model, "calibrate/").constant

    def find(node: onnx.NodeProto) -> tuple[str, str] | None:
        found = _product_weight(constant, node)
        return None if found is None else (product_key(found[0]), node.input[0])

    return find


def input_bound(peak: float) -> float:
    """The quantized range ``[-r, r]`` for an input whose largest ``|x|`` was ``peak``: the
    next power of 2^(1/8) at or above it (up to 9 % of headroom; peaks a few ulps apart read
    the same bound unless a power of 2^(1/8) lies between them)."""
    return float(2.0 ** (np.ceil(8 * np.log2(peak)) / 8))


def _quantize_product(rewriter: _ProductRewriter, node: onnx.NodeProto) -> list | None:
    """``MatMul(A, W)`` (and the ``Add`` of a bias that alone reads it) or ``Gemm(A, W, c)``
    with a constant 2-D ``W`` and a measured input range ``r`` ->
    ``QuantizeLinear(A, r / 127, 128)`` then ``MatMulIntegerToFloat`` with ``q(W)`` and the
    bias; an ``Add`` folded into an earlier product is dropped."""
    if node.op_type == "Add" and node.output[0] in rewriter.folded:
        return []
    found = _product_weight(rewriter.constant, node)
    if found is None or rewriter.opset < 10:  # QuantizeLinear: opset 10
        return None
    weight, bias = found
    peak = rewriter.ranges.get(product_key(weight), 0.0)
    if not np.isfinite(peak) or peak <= 0:
        return None  # never measured (or only zeros): left in float32
    output = node.output[0]
    if node.op_type == "MatMul":
        add, bias = _bias_add(rewriter, node, weight.shape[1])
        if add is not None:
            rewriter.folded.add(add.output[0])
            output = add.output[0]
    q, scale = quantize_weight(weight)
    input_scale = np.array(input_bound(peak) / INPUT_LEVELS, np.float32)
    input_scale = rewriter.add(input_scale, "input_scale")
    quantized = rewriter.name("input_uint8")
    inputs = [quantized, rewriter.add(q, "weight_int8"), input_scale]
    inputs += [rewriter.add(scale, "weight_scale"), rewriter.input_zero, ""]
    if bias is not None:
        inputs.append(rewriter.add(bias.astype(np.float32), "bias"))
    name = node.name or rewriter.name("product")
    return [
        helper.make_node(
            "QuantizeLinear", [node.input[0], input_scale, rewriter.input_zero], [quantized]
        ),
        helper.make_node("MatMulIntegerToFloat", inputs, [output], name=name, domain=MS_DOMAIN),
    ]


def quantize_matmuls(
    model: onnx.ModelProto, ranges: dict[str, float]
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose constant-weight ``MatMul`` / ``Gemm`` nodes (subgraphs too)
    with a range in ``ranges`` (product key -> largest ``|input|``, from
    :func:`skattn.calibrate.activation_ranges`) multiply in int8, a bias ``Add`` folded in;
    returns it and the count of products. Products without a range stay float32."""
    model = model_copy(model)
    rewriter = _ProductRewriter(model, ranges)
    count = rewrite_nodes(rewriter, _quantize_product) - len(rewriter.folded)
    if count:
        drop_unused_initializers(model)
        if all(opset.domain != MS_DOMAIN for opset in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model, count


def decode_ranges(decode: onnx.ModelProto, manifest: Manifest) -> dict[str, float]:
    """Every product's input range, measured on ``decode.onnx`` (its cells expanded) decoding
    :func:`skattn.calibrate.decode_feeds`' sources in float32."""
    expanded, _ = expand_recurrent(decode)
    return activation_ranges(expanded, product_finder(expanded), decode_feeds(manifest))


def quantize_model(
    model: onnx.ModelProto, ranges: dict[str, float], quantization: str = "int8"
) -> onnx.ModelProto:
    """Passes 1 and 3: the recurrent cells expanded, then every weight product with a range in
    ``ranges`` in int8; each weight then held by the body that alone reads it. ``"float16"``:
    :func:`skattn.float16_weights.float16_weights` (``ranges`` unused).

    Raises
    ------
    ValueError
        ``quantization`` is not one of :data:`QUANTIZATIONS`.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    if quantization == "float16":
        return float16_weights(model)
    expanded, _ = expand_recurrent(model)
    quantized, _ = quantize_matmuls(expanded, ranges)
    sink_initializers(quantized)  # each body's weights its own, not its outer scope's
    return quantized


# ---------------------------------------------------------------- artifacts


def quantize_artifact(source, destination, quantization: str = "int8") -> Path:
    """Copy the artifact directory ``source`` to ``destination`` with every graph quantized
    (:func:`quantize_model`; for int8 with the ranges :func:`decode_ranges` measures on its
    ``decode.onnx``, built for the purpose where the artifact has none) and the manifest
    saying so; other files and folders (a packaged model's ``RECIPE.md``, ``LICENSE``) are
    copied as they are. Returns ``destination``.

    Raises
    ------
    ValueError
        ``quantization`` is unknown, ``source`` is already quantized, or ``destination``
        exists; an :class:`~skattn.core.manifest.ArtifactError` (a ``ValueError``) when
        ``source`` is not an intact artifact (:func:`skattn.core.artifact.read_artifact`).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {quantization!r}")
    source, destination = check_path(source, "source"), check_path(destination, "destination")
    manifest = read_artifact(source).manifest
    if manifest.quantization != "none":
        raise ValueError(f"source: {source} is already quantized ({manifest.quantization})")
    if destination.exists():
        raise ValueError(f"destination: {destination} exists; name a new directory")
    destination.mkdir(parents=True)
    try:
        ranges = _int8_ranges(source, manifest) if quantization == "int8" else {}
        for path in source.iterdir():
            if path.name in manifest.files:
                graph = quantize_model(_load_graph(path), ranges, quantization)
                onnx.save_model(graph, destination / path.name)
            elif path.is_dir():  # not an export's staging folder, nor the copy itself
                inside = destination.resolve().is_relative_to(path.resolve())
                if not path.name.startswith(STAGING_PREFIX) and not inside:
                    shutil.copytree(path, destination / path.name, symlinks=True)
            elif path.is_file() and path.name != MANIFEST_FILE and path.suffix != ".onnx":
                # (a graph the manifest does not list would be listed unquantized by with_files;
                # what is neither a file nor a folder, a FIFO, a dangling link, stays behind)
                shutil.copy2(path, destination / path.name)
        quantized = dataclasses.replace(manifest, quantization=quantization)
        quantized = quantized.with_files(destination)
        (destination / MANIFEST_FILE).write_text(quantized.to_json(), encoding="utf-8")
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)
        raise
    return destination


def _int8_ranges(source: Path, manifest: Manifest) -> dict[str, float]:
    """:func:`decode_ranges` on the artifact's ``decode.onnx``, or on one built for the purpose
    from its step graphs where it has none."""
    if DECODE_FILE in manifest.files:
        decode = _load_graph(source / DECODE_FILE)
    else:
        encoder, decoder = (
            without_guards(_load_graph(source / name)) for name in (ENCODER_FILE, DECODER_FILE)
        )
        decode = build_decode_graph(encoder, decoder, manifest)
    return decode_ranges(decode, manifest)


def _load_graph(path: Path) -> onnx.ModelProto:
    """``onnx.load``, with a graph that does not parse (truncated, its checksum then written
    over the damage) an ``ArtifactError`` naming it: protobuf's ``DecodeError`` is no
    ``ValueError``, and the command line printed a traceback."""
    try:
        graph = onnx.load(path, load_external_data=False)
    except OSError:
        raise
    except Exception as error:  # protobuf's DecodeError, onnx's own
        raise ArtifactError(f"{path}: not a readable ONNX graph ({error})") from None
    tensors = (t for g in subgraphs(graph.graph) for t in g.initializer)
    if any(uses_external_data(tensor) for tensor in tensors):  # as serving.load refuses it
        raise ArtifactError(f"{path}: weights in an external-data file, which no checksum covers")
    return graph


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m skattn.quantize",
        description="Write an int8 copy of an exported artifact, for onnxruntime on the CPU "
        "(or, with --quantization float16, a copy with its weights stored in half the bytes).",
    )
    parser.add_argument("source", help="an artifact directory (Seq2Seq.export_onnx)")
    parser.add_argument("destination", help="a new directory for the quantized copy")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="int8")
    args = parser.parse_args(argv)
    try:
        print(quantize_artifact(args.source, args.destination, args.quantization))
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()
