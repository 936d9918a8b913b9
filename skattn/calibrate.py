"""Activation ranges for int8 products, measured once at export so that every row is quantized
alone.

:mod:`skattn.quantize` quantizes the input of each weight product with a scale fixed in the
graph: ``x ~= (q - 128) * r / 127`` with ``q`` in uint8 and ``r`` the largest ``|x|`` the
product met while the float32 graph decoded calibration inputs. A scale fixed ahead of time
makes a row's int8 arithmetic depend on that row only, so batch composition never changes an
answer, as with float32; a value past ``r`` saturates at ``+-r``.

:func:`activation_ranges` runs a copy of a graph in which every product's input also feeds a
``max(|x|)`` (0 for an empty ``x``), carried out of ``Loop`` and ``Scan`` bodies as a scan
output, and keeps the largest value per product. Products are named by their weight
(:func:`product_key`), so a product has the same range in ``decode.onnx``, where the encoder
and the decoder step are inlined, as in ``encoder.onnx`` and ``decoder_step.onnx``.
:func:`decode_feeds` writes the inputs of ``decode.onnx`` from the manifest alone: random
sources over the source vocabulary, deterministic, so an artifact quantized twice gets the
same ranges. The ``onnx`` protobuf package, NumPy and onnxruntime; no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from skattn.core.manifest import Manifest
from skattn.decode_graph import random_sources
from skattn.onnx_graph import GraphRewriter, model_copy

__all__ = ["activation_ranges", "decode_feeds", "product_key"]

#: Calibration sources: how many, their longest length, and the batch they run in.
CALIBRATION_SOURCES = 512
CALIBRATION_MAX_LENGTH = 40
CALIBRATION_BATCH = 64


def product_key(weight: np.ndarray) -> str:
    """A product's name across graphs: a digest of its ``(K, N)`` float32 weight as used."""
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    digest = hashlib.sha256(str(weight.shape).encode() + weight.tobytes()).hexdigest()
    return digest[:24]


#: A product finder: node -> (product key, input name) for a weight product, else None.
Finder = Callable[[onnx.NodeProto], "tuple[str, str] | None"]


def _peak(rewriter: GraphRewriter, x: str, added: list[onnx.NodeProto]) -> str:
    """``max(|x|)`` as a scalar, 0 for an empty ``x`` (a step with no rows, a loop of no
    iterations): ``ReduceMax`` of ``|x|`` flattened beside a 0, which never raises the peak."""
    flat, padded, peak = (rewriter.name(hint) for hint in ("flat", "padded", "peak"))
    added.append(helper.make_node("Abs", [x], [rewriter.name("abs")]))
    added.append(helper.make_node("Reshape", [added[-1].output[0], rewriter.flat], [flat]))
    added.append(helper.make_node("Concat", [flat, rewriter.zero], [padded], axis=0))
    added.append(helper.make_node("ReduceMax", [padded], [peak], keepdims=0))
    return peak


def _instrument(graph: onnx.GraphProto, find: Finder, rewriter) -> list[tuple[str, str]]:
    """Add to ``graph`` (in place) a scalar ``max(|x|)`` per product input ``x`` and return
    ``(key, scalar)``; a ``Loop`` or ``Scan`` node's bodies report theirs as extra scan
    outputs, reduced again here. ``If`` branches are not entered."""
    found: list[tuple[str, str]] = []
    added: list[onnx.NodeProto] = []
    for node in graph.node:
        product = find(node)
        if product is not None:
            key, x = product
            found.append((key, _peak(rewriter, x, added)))
        if node.op_type not in ("Loop", "Scan"):
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        inner = _instrument(body, find, rewriter)
        for key, peak in inner:
            body.output.append(helper.make_tensor_value_info(peak, TensorProto.FLOAT, []))
            stacked = rewriter.name("stacked")
            node.output.append(stacked)  # (iterations,)
            found.append((key, _peak(rewriter, stacked, added)))
        for attribute in node.attribute:
            if attribute.name in ("scan_output_directions", "scan_output_axes"):
                attribute.ints.extend([0] * len(inner))
    graph.node.extend(added)  # after every node: each reads a value already computed
    return found


class _Instrumenter(GraphRewriter):
    """Fresh names, and the two constants every peak reads (in the main graph)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model, "calibrate/")
        self.flat = self.add(np.array([-1], np.int64), "flat_shape")
        self.zero = self.add(np.zeros(1, np.float32), "zero")


def activation_ranges(
    model: onnx.ModelProto, find: Finder, feeds: Iterable[dict[str, np.ndarray]]
) -> dict[str, float]:
    """The largest ``|x|`` each product's input ``x`` took while ``model`` ran on ``feeds``:
    product key -> float (products named by ``find``; one never run is absent).

    Raises
    ------
    ValueError
        ``model`` is not an ``onnx.ModelProto``, or ``feeds`` is empty.
    """
    model = model_copy(model)
    feeds = list(feeds)
    if not feeds:
        raise ValueError("feeds must hold at least one batch of inputs")
    found = _instrument(model.graph, find, _Instrumenter(model))
    if not found:
        return {}
    del model.graph.output[:]  # only the peaks: the search's outputs are not needed
    model.graph.output.extend(
        helper.make_tensor_value_info(peak, TensorProto.FLOAT, []) for _, peak in found
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    ranges: dict[str, float] = {}
    for feed in feeds:
        for (key, _), peak in zip(found, session.run(None, feed), strict=True):
            ranges[key] = max(ranges.get(key, 0.0), float(peak))
    return ranges


def decode_feeds(
    manifest: Manifest,
    count: int = CALIBRATION_SOURCES,
    max_length: int = CALIBRATION_MAX_LENGTH,
    batch: int = CALIBRATION_BATCH,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Inputs of ``decode.onnx``: ``count`` random sources of 1 to ``max_length`` tokens
    (at most the manifest's limit) over the source vocabulary's tokens, with the end-of-source
    marker, in batches of ``batch``; the manifest's temperature, and room for outputs twice as
    long as the longest source (within the manifest's limit)."""
    rng = np.random.default_rng(seed)
    longest = max(1, min(max_length, manifest.max_source_length))
    lengths = rng.integers(1, longest + 1, size=count) + 1  # EOS counted
    max_output = np.asarray(min(manifest.max_output_length, 2 * longest + 8), dtype=np.int64)
    temperature = np.asarray(manifest.temperature, dtype=np.float32)
    vocabulary = len(manifest.source_vocabulary)
    feeds = []
    for start in range(0, count, batch):
        src, src_lengths = random_sources(lengths[start : start + batch], vocabulary, rng)
        values = (src, src_lengths, max_output, temperature)
        feeds.append(dict(zip(manifest.decode_inputs(), values, strict=True)))
    return feeds
