"""GRU and LSTM nodes written as the products and gates they compute.

:func:`expand_recurrent` replaces each one-direction ``GRU`` / ``LSTM`` node of a graph (what
torch's exporter writes) by ONNX's equations for it (gate orders ``zrh`` and ``iofc``): the
input products of the whole sequence as one product ``(T, B, I) x (I, g H)`` per gate group,
then a ``Scan`` over time whose body multiplies the state by the recurrent weights,
``(B, H) x (H, g H)``; a node run for one step (the decoder step) is written without the
``Scan``. Exact in float32 (tests: against onnxruntime's own cells; export: against torch).

It is :mod:`skattn.quantize`'s first pass: the cells' weights become ``MatMul`` / ``Gemm``
inputs, which its third pass multiplies in int8. A float32 export runs it on the decoder step
alone, for cells at least as wide as :data:`skattn.export.STEP_CELLS_EXPANDED_FROM` says for
its search: onnxruntime runs them faster than its fused kernels once a step has many rows, a
little slower for one (``benchmarks/bench_step_cells.py``). The ``onnx`` protobuf
package and NumPy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from skattn.onnx_graph import (
    GraphRewriter,
    drop_unused_initializers,
    model_copy,
    node_attributes,
    rewrite_nodes,
    subgraphs,
)

__all__ = ["expand_recurrent", "guard_empty_inputs", "without_guards"]

#: The name prefix of the ``If`` nodes :func:`guard_empty_inputs` wraps cells in.
GUARD_PREFIX = "guard_empty/"


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


def _cell_weights(rewriter: GraphRewriter, node: onnx.NodeProto) -> tuple | None:
    """``(W (G H, I), R (G H, H), B (2 G H,))`` of a one-direction GRU / LSTM with float32
    constant weights, default activations, no clip, no sequence lengths and no peepholes (what
    torch exports); None for any other node (left as it is)."""
    if node.op_type not in _CELLS:
        return None
    attrs = node_attributes(node)
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
    if not (plain and constant and rewriter.opset >= 15 and not inputs[4] and not inputs[7]):
        return None
    bias = B[0] if B is not None else np.zeros(2 * R.shape[1], np.float32)  # R: (1, G H, H)
    return W[0], R[0], bias


class _Emitter:
    """Appends nodes to one list under the rewriter's fresh names."""

    def __init__(self, rewriter: GraphRewriter, nodes: list) -> None:
        self.rewriter, self.nodes = rewriter, nodes

    def __call__(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        if op_type == "Split" and self.rewriter.opset >= 18:  # equal parts: named from 18 on
            attrs["num_outputs"] = outputs
        names = [self.rewriter.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names


def _expand(
    rewriter: GraphRewriter, node: onnx.NodeProto, min_hidden_size: int = 0
) -> list[onnx.NodeProto] | None:
    """``node`` (a GRU or LSTM, see :func:`_cell_weights`) as products, gates and a ``Scan``;
    None (left as it is) for a cell narrower than ``min_hidden_size``."""
    weights = _cell_weights(rewriter, node)
    if weights is None or weights[1].shape[1] < min_hidden_size:
        return None
    W, R, bias = weights  # (G H, I), (G H, H), (2 G H,)
    cell = _CELLS[node.op_type]
    inputs = [*node.input, *[""] * 8]
    outputs = [*node.output, *[""] * 3]
    hidden = R.shape[1]
    bias_W, bias_R = np.split(bias, 2)  # (G H,) each
    reverse = node_attributes(node).get("direction", b"forward") == b"reverse"
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


def expand_recurrent(
    model: onnx.ModelProto, min_hidden_size: int = 0
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with each plain one-direction ``GRU`` / ``LSTM`` node written as
    ``MatMul``s, gates and (over more than one step) a ``Scan``; returns it and the count.

    Left as they are: cells with fewer than ``min_hidden_size`` units, bidirectional cells,
    sequence lengths, peepholes, clipping, other activations, ``linear_before_reset=0``,
    weights that are not float32 constants, and models below opset 15."""
    model = model_copy(model)
    # An expanded cell runs empty inputs, so its guard goes (and an int8 artifact quantized
    # from a float one is the int8 export's, byte for byte); a cell left fused is guarded again.
    guarded = _unguard(model)
    # One namespace with quantize's passes (this is its first): a float artifact's step cells,
    # expanded at export, are named as an int8 export names them.
    rewriter = GraphRewriter(model, "quantize/")
    count = rewrite_nodes(rewriter, lambda rw, node: _expand(rw, node, min_hidden_size))
    drop_unused_initializers(model)
    if guarded:
        model, _ = guard_empty_inputs(model)
    return model, count


# ---------------------------------------------------------------- empty inputs


def guard_empty_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose main graph runs each ``GRU`` / ``LSTM`` node only on inputs
    that hold a row and a step; returns it and the count.

    onnxruntime's fused ``GRU`` kernel (1.32) ends the process (``std::terminate``, not an
    exception) on an input of batch 0 or of length 0, and its ``LSTM`` kernel on batch 0. A
    host that feeds ``encoder.onnx`` or ``decode.onnx`` an empty batch must get an answer, not
    lose its process, so each cell becomes::

        If(min(T, B) == 0)  then: Y = zeros (T, D, B, H), Y_h (and Y_c) = zeros (D, B, H)
                            else: the cell

    which costs a few microseconds a call. Only the main graph's cells: a decoder step inside
    ``decode.onnx``'s loops always has rows (neither search starts a segment without them), and
    a guard there would cost every step.
    """
    model = model_copy(model)
    rewriter = GraphRewriter(model, GUARD_PREFIX)
    graph = model.graph
    nodes, count = [], 0
    for node in graph.node:
        if node.op_type in _CELLS:
            nodes.extend(_guarded(rewriter, node))
            count += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model, count


def _guarded(rewriter: GraphRewriter, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    x = node.input[0]  # (T, B, I)
    attrs = node_attributes(node)
    directions = 2 if attrs.get("direction", b"forward") == b"bidirectional" else 1
    hidden = int(attrs["hidden_size"])
    outputs = [output for output in node.output if output]
    name = rewriter.name

    def const(values: list[int], hint: str) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name(hint)], value=numpy_helper.from_array(np.array(values, np.int64))
        )

    sizes, smallest, zero = name("sizes"), name("smallest"), const([0], "zero")
    is_empty, empty = name("is_empty"), name("empty")
    before = [
        helper.make_node("Shape", [x], [sizes], end=2),  # [T, B]
        helper.make_node("ReduceMin", [sizes], [smallest], keepdims=1),  # [min(T, B)]
        zero,
        helper.make_node("Equal", [smallest, zero.output[0]], [is_empty]),  # [bool]
        helper.make_node("Squeeze", [is_empty], [empty]),  # ()
    ]
    for part in before:  # named as the guard's, so that _unguard finds them
        part.name = name("guard")
    # then: zeros of each output's shape
    then_nodes = [
        helper.make_node("Shape", [x], [t := name("T")], end=1),
        helper.make_node("Shape", [x], [b := name("B")], start=1, end=2),
        d := const([directions], "D"),
        h := const([hidden], "H"),
    ]
    then_outputs = []
    for index, output in enumerate(node.output):
        if not output:
            continue
        parts = [t, d.output[0], b, h.output[0]] if index == 0 else [d.output[0], b, h.output[0]]
        shape, zeros = name("shape"), name("zeros")
        then_nodes.append(helper.make_node("Concat", parts, [shape], axis=0))
        then_nodes.append(
            helper.make_node(
                "ConstantOfShape",
                [shape],
                [zeros],
                value=numpy_helper.from_array(np.zeros(1, np.float32)),
            )
        )
        then_outputs.append(zeros)
    inner = onnx.NodeProto()
    inner.CopyFrom(node)
    renamed = {output: name("cell_out") for output in outputs}
    del inner.output[:]
    inner.output.extend(renamed.get(output, "") for output in node.output)

    def values(names: list[str]) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]

    guard = helper.make_node(
        "If",
        [empty],
        outputs,
        name=name(node.name or "cell"),
        then_branch=helper.make_graph(then_nodes, name("then"), [], values(then_outputs)),
        else_branch=helper.make_graph(
            [inner], name("else"), [], values([renamed[o] for o in outputs])
        ),
    )
    return [*before, guard]


def without_guards(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the cells :func:`guard_empty_inputs` wrapped put back: the
    graph as the export built it, to build other graphs from (``quantize_artifact`` builds a
    search graph from an artifact's parts to measure its ranges)."""
    model = model_copy(model)
    _unguard(model)
    return model


def _unguard(model: onnx.ModelProto) -> int:
    """Put back the cells :func:`guard_empty_inputs` wrapped, in every graph (a search graph
    built from guarded parts holds them under its own prefixes: ``encoder/guard_empty/...``),
    and drop the guards' nodes (in place); returns how many cells were put back."""
    count = 0
    for graph in subgraphs(model.graph):
        nodes = []
        for node in graph.node:
            if GUARD_PREFIX not in node.name:
                nodes.append(node)
            elif node.op_type == "If":
                else_branch = next(a.g for a in node.attribute if a.name == "else_branch")
                (cell,) = else_branch.node
                outer = dict(zip((v.name for v in else_branch.output), node.output, strict=True))
                restored = onnx.NodeProto()
                restored.CopyFrom(cell)
                del restored.output[:]
                restored.output.extend(outer.get(output, "") for output in cell.output)
                nodes.append(restored)
                count += 1
        del graph.node[:]
        graph.node.extend(nodes)
    return count
