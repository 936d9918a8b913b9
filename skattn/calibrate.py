"""Activation ranges for int8 products, measured once at export so that every row is quantized
alone.

:mod:`skattn.quantize` quantizes the input of each weight product with a scale fixed in the
graph: ``x ~= (q - 128) * r / 127`` with ``q`` in uint8 and ``r`` the largest ``|x|`` the
product met while the float32 graph decoded calibration inputs. A scale fixed ahead of time
makes a row's int8 arithmetic depend on that row only, so batch composition never changes an
answer, as with float32; a value past ``r`` saturates at ``+-r``.

:func:`activation_ranges` runs a copy of a graph in which every product's input also feeds a
``ReduceMax(Abs(x))``, carried out of ``Loop`` and ``Scan`` bodies as a scan output, and keeps
the largest value per product. Products are named by their weight (:func:`product_key`), so a
product has the same range in ``decode.onnx``, where the encoder and the decoder step are
inlined, as in ``encoder.onnx`` and ``decoder_step.onnx``. :func:`decode_feeds` writes the
inputs of ``decode.onnx`` from the manifest alone: random sources over the source vocabulary,
deterministic, so an artifact quantized twice gets the same ranges. The ``onnx`` protobuf
package, NumPy and onnxruntime; no torch.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from skattn.core.manifest import Manifest
from skattn.core.text import EOS, SPECIAL_TOKENS
from skattn.onnx_graph import model_copy, subgraphs

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


def _instrument(graph: onnx.GraphProto, find: Finder, names) -> list[tuple[str, str]]:
    """Add to ``graph`` (in place) a ``ReduceMax(Abs(x))`` scalar per product input ``x`` and
    return ``(key, scalar)``; a ``Loop`` or ``Scan`` node's bodies report theirs as extra scan
    outputs, reduced again here. ``If`` branches are not entered."""
    found: list[tuple[str, str]] = []
    added: list[onnx.NodeProto] = []
    for node in graph.node:
        product = find(node)
        if product is not None:
            key, x = product
            magnitude, peak = next(names), next(names)
            added.append(helper.make_node("Abs", [x], [magnitude]))
            added.append(helper.make_node("ReduceMax", [magnitude], [peak], keepdims=0))
            found.append((key, peak))
        if node.op_type not in ("Loop", "Scan"):
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        inner = _instrument(body, find, names)
        for key, peak in inner:
            body.output.append(helper.make_tensor_value_info(peak, TensorProto.FLOAT, []))
            stacked, outer = next(names), next(names)
            node.output.append(stacked)  # (iterations,)
            added.append(helper.make_node("ReduceMax", [stacked], [outer], keepdims=0))
            found.append((key, outer))
        for attribute in node.attribute:
            if attribute.name in ("scan_output_directions", "scan_output_axes"):
                attribute.ints.extend([0] * len(inner))
    graph.node.extend(added)  # after every node: each reads a value already computed
    return found


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
    taken = {name for g in subgraphs(model.graph) for n in g.node for name in n.output}
    names = (f"calibrate/{i}" for i in itertools.count() if f"calibrate/{i}" not in taken)
    found = _instrument(model.graph, find, names)
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
    marker, in batches of ``batch``; the manifest's temperature and output limit."""
    rng = np.random.default_rng(seed)
    tokens = np.arange(len(SPECIAL_TOKENS), len(manifest.source_vocabulary))
    longest = max(1, min(max_length, manifest.max_source_length))
    lengths = rng.integers(1, longest + 1, size=count)
    max_output = np.asarray(min(manifest.max_output_length, 2 * longest + 8), dtype=np.int64)
    temperature = np.asarray(manifest.temperature, dtype=np.float32)
    feeds = []
    for start in range(0, count, batch):
        part = lengths[start : start + batch] + 1  # EOS counted
        src = np.zeros((len(part), part.max()), dtype=np.int64)
        for row, n in enumerate(part):
            src[row, : n - 1] = rng.choice(tokens, size=n - 1) if len(tokens) else EOS
            src[row, n - 1] = EOS
        feeds.append(
            {
                "src": src,
                "src_lengths": part.astype(np.int64),
                "max_length": max_output,
                "temperature": temperature,
            }
        )
    return feeds
