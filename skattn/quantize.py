"""Dynamic int8 quantization of an artifact's graphs, for onnxruntime on the CPU.

A served G2P or translation model spends nearly all of its time in products with its weights:
the encoder's and decoder's recurrent cells, the attention's projections, the output layers.
On a CPU without fp16 units the one lever on that arithmetic is integers: onnxruntime's
``com.microsoft.DynamicQuantizeMatMul`` quantizes its input row block to uint8 at run time (one
scale and zero point per call), multiplies it by int8 weights quantized once, here, per output
column, and rescales the int32 sums to float32. Two passes, each a plain graph rewrite:

1. :func:`expand_recurrent` writes every ``GRU`` / ``LSTM`` node as the products and gates it
   computes (ONNX's equations, gate orders ``zrh`` and ``iofc``), so that its weights become
   ``MatMul`` inputs: the input projection of the whole sequence as one product
   ``(T, B, I) x (I, G H)``, then a ``Scan`` over time whose body multiplies the state by the
   recurrent weights, ``(B, H) x (H, G H)``; a node run for one step (the decoder step) is
   written without the ``Scan``. Exact in float32 (tests: against onnxruntime's own cells).
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
import copy
import dataclasses
import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from skattn.core.artifact import read_artifact
from skattn.core.manifest import MANIFEST_FILE, QUANTIZATIONS

__all__ = [
    "MIN_QUANTIZED_SIDE",
    "QUANTIZATIONS",
    "expand_recurrent",
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


# ---------------------------------------------------------------- the graphs as one namespace


class _Rewriter:
    """The model's constant weights by name, fresh names, and new initializers (all in the
    main graph, which every subgraph sees)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graphs = list(_graphs(model.graph))
        inputs = {value.name for g in graphs for value in g.input}
        # An initializer that is also a graph input is a default a caller may override: no
        # constant.
        self.weights = {t.name: t for g in graphs for t in g.initializer if t.name not in inputs}
        self.taken = inputs | {t.name for g in graphs for t in g.initializer}
        self.taken |= {name for g in graphs for n in g.node for name in (*n.output, n.name)}
        self._shapes: dict | None = None
        self._names = itertools.count()
        self._axes: dict[int, str] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.readers: dict[str, list] = {}
        self.folded: set[str] = set()  # outputs of the Adds folded into a product
        self.current: set[str] = set()  # outputs of the nodes of the graph being rewritten

    @property
    def shapes(self) -> dict[str, list[int | None]]:
        if self._shapes is None:
            self._shapes = _static_shapes(self.model)
        return self._shapes

    def name(self, hint: str) -> str:
        """A name no value, initializer or node of the model has (nor had when read)."""
        while (name := f"quantize/{hint}_{next(self._names)}") in self.taken:
            pass
        self.taken.add(name)
        return name

    def constant(self, name: str) -> np.ndarray | None:
        """An initializer's value (None for anything computed or overridable)."""
        tensor = self.weights.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def add(self, array: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        tensor = numpy_helper.from_array(np.ascontiguousarray(array), name)
        self.model.graph.initializer.append(tensor)
        self.weights[name] = tensor
        return name

    def axis(self, axis: int) -> str:
        """The int64 ``[axis]`` initializer (one per model) for Squeeze / Unsqueeze."""
        if axis not in self._axes:
            self._axes[axis] = self.add(np.array([axis], np.int64), "axis")
        return self._axes[axis]


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph below it (``Loop``, ``Scan`` and ``If`` bodies)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _graphs(subgraph)


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Value name -> its inferred dims (None where unknown), subgraphs included."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (inference is a hint: an unknown shape only costs a Scan)
        return {}
    shapes = {}
    for graph in _graphs(inferred.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            dims = value.type.tensor_type.shape.dim
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return shapes


def _rewrite_nodes(
    rewriter: _Rewriter, rewrite: Callable[[_Rewriter, onnx.NodeProto], list | None]
) -> int:
    """Replace each node (in every graph) for which ``rewrite`` returns nodes; returns how
    many were replaced."""
    count = 0
    # Children before parents: rewriting a graph copies its nodes, subgraphs included.
    for graph in reversed(list(_graphs(rewriter.model.graph))):
        rewriter.current = {name for node in graph.node for name in node.output}
        nodes = []
        for node in graph.node:
            replacement = rewrite(rewriter, node)
            if replacement is None:
                nodes.append(node)
            else:
                nodes.extend(replacement)
                count += 1
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    graphs = list(_graphs(model.graph))
    used = {name for g in graphs for n in g.node for name in n.input}
    used |= {value.name for g in graphs for value in (*g.output, *g.input)}
    for graph in _graphs(model.graph):
        kept = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)


# ---------------------------------------------------------------- pass 1: recurrent cells


@dataclasses.dataclass(frozen=True)
class _Cell:
    """One ONNX recurrent op: its gates, how its products are grouped, and its update.

    ``groups`` splits the ``G H`` gate columns into the products the expansion computes (in
    units of ``H``), each with its own input and recurrent product, so the update reads whole
    gate blocks without copying them out of one ``(B, G H)`` tensor; ``step(emit, xs, hs,
    states)`` reads the groups' ``x W + b_W`` and ``h R + b_R`` and returns the new states.
    """

    groups: tuple[int, ...]
    n_states: int  # GRU: h; LSTM: h, c
    step: Callable


def _gru_step(emit, xs: list[str], hs: list[str], states: list[str]) -> list[str]:
    """ONNX GRU, ``linear_before_reset=1``, gates ``z r h`` (groups ``zr`` and ``h``)::

    z, r = sigmoid(x W_zr + b_Wzr + h R_zr + b_Rzr)
    n = tanh(x W_h + b_Wh + r * (h R_h + b_Rh))
    h' = (1 - z) * n + z * h = n + z * (h - n)
    """
    (h,) = states
    (x_zr, x_n), (h_zr, h_n) = xs, hs
    z, r = emit("Split", emit("Sigmoid", emit("Add", x_zr, h_zr)), axis=1, outputs=2)
    n = emit("Tanh", emit("Add", x_n, emit("Mul", r, h_n)))
    return [emit("Add", n, emit("Mul", z, emit("Sub", h, n)))]


def _lstm_step(emit, xs: list[str], hs: list[str], states: list[str]) -> list[str]:
    """ONNX LSTM without peepholes, gates ``i o f c`` (groups ``iof`` and ``c``)::

    i, o, f = sigmoid(x W_iof + b_Wiof + h R_iof + b_Riof)    c~ = tanh(x W_c + ... + b_Rc)
    c' = f * c + i * c~                                        h' = o * tanh(c')
    """
    h, c = states
    (x_iof, x_c), (h_iof, h_c) = xs, hs
    i, o, f = emit("Split", emit("Sigmoid", emit("Add", x_iof, h_iof)), axis=1, outputs=3)
    c_new = emit("Add", emit("Mul", f, c), emit("Mul", i, emit("Tanh", emit("Add", x_c, h_c))))
    return [emit("Mul", o, emit("Tanh", c_new)), c_new]


_CELLS = {"GRU": _Cell((2, 1), 1, _gru_step), "LSTM": _Cell((3, 1), 2, _lstm_step)}
_DEFAULT_ACTIVATIONS = {"GRU": [b"Sigmoid", b"Tanh"], "LSTM": [b"Sigmoid", b"Tanh", b"Tanh"]}


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _expandable(rewriter: _Rewriter, node: onnx.NodeProto) -> bool:
    """A one-direction GRU / LSTM with constant weights, default activations, no clip, no
    sequence lengths and no peepholes (what torch exports)."""
    if node.op_type not in _CELLS:
        return False
    attrs = _attributes(node)
    inputs = [*node.input, *[""] * 8]
    plain = (
        attrs.get("direction", b"forward") in (b"forward", b"reverse")
        and attrs.get("layout", 0) == 0
        and "clip" not in attrs
        and attrs.get("activations", _DEFAULT_ACTIVATIONS[node.op_type])
        == _DEFAULT_ACTIVATIONS[node.op_type]
        and attrs.get("input_forget", 0) == 0
        and (node.op_type == "LSTM" or attrs.get("linear_before_reset", 0) == 1)
    )
    W, R, B = (rewriter.constant(name) if name else None for name in inputs[1:4])
    floats = lambda w: w is not None and w.dtype == np.float32  # noqa: E731
    constant = floats(W) and floats(R) and (not inputs[3] or floats(B))
    # The ops written need opset 15 (Shape's start / end; Squeeze's axes as an input).
    return plain and constant and rewriter.opset >= 15 and not inputs[4] and not inputs[7]


class _Emitter:
    """Appends nodes to one list under the rewriter's fresh names."""

    def __init__(self, rewriter: _Rewriter, nodes: list) -> None:
        self.rewriter, self.nodes = rewriter, nodes

    def __call__(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        if op_type == "Split" and self.rewriter.opset >= 18:  # equal parts: named from 18 on
            attrs["num_outputs"] = outputs
        names = [self.rewriter.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names


def _expand(rewriter: _Rewriter, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``node`` (a GRU or LSTM, see :func:`_expandable`) as products, gates and a ``Scan``."""
    if not _expandable(rewriter, node):
        return None
    cell = _CELLS[node.op_type]
    inputs = [*node.input, *[""] * 8]
    outputs = [*node.output, *[""] * 3]
    W = rewriter.constant(inputs[1])[0].astype(np.float32)  # (G H, I)
    R = rewriter.constant(inputs[2])[0].astype(np.float32)  # (G H, H)
    hidden = R.shape[1]
    bias = rewriter.constant(inputs[3]) if inputs[3] else np.zeros((1, 2 * R.shape[0]))
    bias_W, bias_R = np.split(bias[0].astype(np.float32), 2)  # (G H,) each
    reverse = _attributes(node).get("direction", b"forward") == b"reverse"
    nodes: list[onnx.NodeProto] = []
    emit = _Emitter(rewriter, nodes)
    bounds = np.cumsum((0, *cell.groups)) * hidden  # the groups' gate columns

    def group(matrix: np.ndarray, vector: np.ndarray, g: int, hint: str) -> tuple[str, str]:
        """Group g's weight (columns of the transposed matrix) and bias, as initializers."""
        rows = slice(bounds[g], bounds[g + 1])
        return rewriter.add(matrix[rows].T, hint), rewriter.add(vector[rows], f"bias_{hint}")

    x = inputs[0]  # (T, B, I): the whole sequence's input products at once, (T, B, g H) each
    groups = range(len(cell.groups))
    xs = [
        emit("Add", emit("MatMul", x, w), b) for w, b in (group(W, bias_W, g, "W") for g in groups)
    ]
    recurrent = [group(R, bias_R, g, "R") for g in groups]

    # Initial states (1, B, H) -> (B, H); zeros (of x's batch) where the node has none.
    zeros = None
    states = []
    for name in inputs[5 : 5 + cell.n_states]:
        if name:
            states.append(emit("Squeeze", name, rewriter.axis(0)))
            continue
        if zeros is None:
            batch = emit("Shape", x, start=1, end=2)
            shape = emit(
                "Concat", batch, rewriter.add(np.array([hidden], np.int64), "hidden"), axis=0
            )
            zeros = emit(
                "ConstantOfShape", shape, value=numpy_helper.from_array(np.zeros(1, np.float32))
            )
        states.append(zeros)

    if rewriter.shapes.get(x, [None])[:1] == [1]:  # one step (a decoder step): no Scan
        x_t = [emit("Squeeze", xg, rewriter.axis(0)) for xg in xs]
        h_t = [emit("Gemm", states[0], r, b) for r, b in recurrent]
        new_states = cell.step(emit, x_t, h_t, states)
        ys = emit("Unsqueeze", new_states[0], rewriter.axis(0))
    else:
        body_nodes: list[onnx.NodeProto] = []
        body_emit = _Emitter(rewriter, body_nodes)
        state_in = [rewriter.name("state") for _ in range(cell.n_states)]
        x_in = [rewriter.name("x_t") for _ in cell.groups]
        h_t = [body_emit("Gemm", state_in[0], r, b) for r, b in recurrent]  # (B, g H) each
        state_out = cell.step(body_emit, x_in, h_t, state_in)
        y_out = rewriter.name("y_t")
        body_nodes.append(helper.make_node("Identity", [state_out[0]], [y_out]))
        floats = lambda n, width: helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, width])  # noqa: E731
        body = helper.make_graph(
            body_nodes,
            rewriter.name("scan_body"),
            [floats(n, hidden) for n in state_in]
            + [floats(n, g * hidden) for n, g in zip(x_in, cell.groups, strict=True)],
            [floats(n, hidden) for n in state_out] + [floats(y_out, hidden)],
        )
        directions = [int(reverse)] * len(cell.groups)
        scanned = emit(
            "Scan",
            *states,
            *xs,
            outputs=cell.n_states + 1,
            body=body,
            num_scan_inputs=len(cell.groups),
            scan_input_directions=directions,
            scan_output_directions=[int(reverse)],
        )
        new_states, ys = scanned[: cell.n_states], scanned[cell.n_states]  # ys (T, B, H)
    # ONNX's outputs: Y (T, 1, B, H), Y_h (1, B, H), Y_c (1, B, H); each may be unused.
    axis0, axis1 = rewriter.axis(0), rewriter.axis(1)
    if outputs[0]:
        nodes.append(helper.make_node("Unsqueeze", [ys, axis1], [outputs[0]]))
    for state, name in zip(new_states, outputs[1 : 1 + cell.n_states], strict=True):
        if name:
            nodes.append(helper.make_node("Unsqueeze", [state, axis0], [name]))
    return nodes


def _check_model(model) -> onnx.ModelProto:
    if not isinstance(model, onnx.ModelProto):
        raise ValueError(f"model must be an onnx.ModelProto, got {type(model).__name__}")
    return copy.deepcopy(model)


def expand_recurrent(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with each plain one-direction ``GRU`` / ``LSTM`` node written as
    ``MatMul``s, gates and (over more than one step) a ``Scan``; returns it and the count.

    Left as they are: bidirectional cells, sequence lengths, peepholes, clipping, other
    activations, ``linear_before_reset=0``, weights that are not float32 constants, and
    models below opset 15."""
    model = _check_model(model)
    rewriter = _Rewriter(model)
    count = _rewrite_nodes(rewriter, _expand)
    _drop_unused_initializers(model)
    return model, count


# ---------------------------------------------------------------- pass 2: weight products


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Value name -> the nodes (in every graph) that read it; a graph output counts as a
    reader (``None``)."""
    readers: dict[str, list] = {}
    for graph in _graphs(model.graph):
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        for value in graph.output:
            readers.setdefault(value.name, []).append(None)
    return readers


def _bias_add(rewriter: _Rewriter, product: onnx.NodeProto, columns: int):
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


def _quantize_product(rewriter: _Rewriter, node: onnx.NodeProto) -> list | None:
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
        attrs = _attributes(node)
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
    model = _check_model(model)
    rewriter = _Rewriter(model)
    rewriter.readers = _consumers(model)
    count = _rewrite_nodes(rewriter, _quantize_product) - len(rewriter.folded)
    if count:
        _drop_unused_initializers(model)
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
