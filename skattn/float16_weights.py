"""Weights stored in float16 and computed in float32: an artifact of half the bytes.

An exported graph's size is its weights. Each float32 weight of at least
:data:`MIN_ELEMENTS` elements becomes a float16 initializer and a ``Cast`` back to float32 under
the weight's own name, in the graph or body that holds it, so every node reads what it read
before::

    W (float32)   ->   W.float16 (float16)  --Cast(to=FLOAT)-->  W (float32)

onnxruntime folds the ``Cast`` of a constant when it opens the graph (constant folding, on every
optimization level from basic up, in ``Loop``, ``Scan`` and ``If`` bodies too), so the session
holds the float32 weights, packs them as it packs any, and runs the same kernels at the same
speed, on the CPU and on CUDA; any onnxruntime host does the same with the file. What changes
is each weight's value: rounded to float16's 11 significant bits, a relative error of at most
2^-11 (4.9e-4), so answers are close to the float32 artifact's, not always equal.

A weight is left in float32 when halving it would change more than its rounding: a value
beyond float16's range (65,504), an infinity or NaN (masks), or a tensor whose largest value
lies below float16's normal range (2^-14), where float16 keeps fewer bits. Values below that
range beside larger ones become float16's subnormals, or zero under 2^-25: an absolute error
of at most 2^-25 (3e-8), below the rounding of any value in the normal range. Small constants
(biases under :data:`MIN_ELEMENTS`, scalars) stay as they are: they hold few bytes. The
``onnx`` protobuf package and NumPy; no torch.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from skattn.onnx_graph import model_copy, node_subgraphs, subgraphs

__all__ = ["FLOAT16_SUFFIX", "MIN_ELEMENTS", "float16_weights", "halvable"]

#: The smallest weight stored in float16: below it the bytes saved are not worth a node.
MIN_ELEMENTS = 256
#: The float16 initializer's name: the weight's own, which the ``Cast`` writes, plus this.
FLOAT16_SUFFIX = ".float16"
_FLOAT16_MAX = float(np.finfo(np.float16).max)
_FLOAT16_NORMAL = float(np.finfo(np.float16).smallest_normal)


def halvable(weight: np.ndarray) -> bool:
    """Whether float16 would only round ``weight``: float32 of at least :data:`MIN_ELEMENTS`,
    every value finite and within float16's range, the largest in its normal range (or all
    zero)."""
    if weight.dtype != np.float32 or weight.size < MIN_ELEMENTS:
        return False
    largest = float(np.abs(weight).max())  # NaN where any value is
    return largest == 0.0 or _FLOAT16_NORMAL <= largest <= _FLOAT16_MAX


def float16_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose float32 weights (:func:`halvable`) are stored in float16, each
    cast back to float32 under its own name in the graph that holds it.

    Left in float32: the main graph's inputs and outputs (a weight that is also an input can be
    fed, one that is an output is read); a body's weight whose name an enclosing graph also
    defines (the cast would write that name a second time, which ONNX forbids); and a weight
    whose float16 name (its own plus :data:`FLOAT16_SUFFIX`) another value already has.

    Raises
    ------
    ValueError
        ``model`` is not an ``onnx.ModelProto``.
    """
    model = model_copy(model)
    taken = {name for graph in subgraphs(model.graph) for name in _defined(graph)}
    interface = {value.name for value in (*model.graph.input, *model.graph.output)}
    _halve(model.graph, interface, taken)
    return model


def _halve(graph: onnx.GraphProto, outer: set[str], taken: set[str]) -> None:
    """Halve ``graph``'s weights whose names no enclosing graph defines (``outer``), its
    bodies' first: rewriting a graph's node list copies its nodes, and with them their bodies,
    which must by then be rewritten."""
    inner = outer | set(_defined(graph))
    for node in graph.node:
        for body in node_subgraphs(node):
            _halve(body, inner, taken)
    casts, kept = [], []
    for tensor in graph.initializer:
        half = tensor.name + FLOAT16_SUFFIX
        if tensor.data_type != TensorProto.FLOAT or tensor.name in outer or half in taken:
            kept.append(tensor)
            continue
        weight = numpy_helper.to_array(tensor)
        if not halvable(weight):
            kept.append(tensor)
            continue
        kept.append(numpy_helper.from_array(weight.astype(np.float16), half))
        casts.append(helper.make_node("Cast", [half], [tensor.name], to=TensorProto.FLOAT))
    if not casts:
        return
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*casts, *graph.node]  # each cast before every node that reads its weight
    del graph.node[:]
    graph.node.extend(nodes)


def _defined(graph: onnx.GraphProto):
    """The names ``graph`` itself defines: its inputs, initializers and node outputs (those of
    its bodies not included)."""
    yield from (value.name for value in graph.input)
    yield from (tensor.name for tensor in graph.initializer)
    for node in graph.node:
        yield from node.output
