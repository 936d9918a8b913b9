"""Building ONNX graphs by hand: a small node builder, inlining an exported graph, and
rewriting a graph's nodes in place.

:mod:`skattn.decode_graph` assembles ``decode.onnx`` from ``encoder.onnx`` and
``decoder_step.onnx`` with these two tools: :class:`GraphBuilder` writes nodes one call each
(``b.op("Add", x, y)`` returns the output's name), and :func:`inline` copies another graph's
nodes into a builder under a prefix, so the search's ``Loop`` body runs the very decoder step
that export verified against torch. :class:`GraphRewriter` and :func:`rewrite_nodes` replace
nodes in a graph and its subgraphs (:mod:`skattn.recurrent_graph`, :mod:`skattn.quantize`).
The ``onnx`` protobuf package and NumPy only; no torch.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "GraphBuilder",
    "GraphRewriter",
    "drop_unused_initializers",
    "inline",
    "model_copy",
    "node_attributes",
    "node_subgraphs",
    "rewrite_nodes",
    "sink_initializers",
    "static_shapes",
    "subgraphs",
    "value_info",
]


def value_info(name: str, elem_type: int, shape: int | tuple) -> onnx.ValueInfoProto:
    """A typed graph input/output: ``shape`` an int (that many unknown dims) or a tuple of
    dims (``None`` where unknown). Static dims matter inside a ``Loop`` body: onnxruntime
    folds the shape arithmetic of the decoder step only where it can see them."""
    dims = [None] * shape if isinstance(shape, int) else list(shape)
    return helper.make_tensor_value_info(name, elem_type, dims)


class GraphBuilder:
    """Nodes and initializers of one graph (or ``Loop`` body), named under ``prefix``.

    Parameters
    ----------
    prefix : str
        Every generated name starts with it, so that a body never shadows its outer scope.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        """Add ``op_type(inputs, **attrs)``; returns its output name (a list when several)."""
        names = [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=None) -> str:
        """A constant tensor (``np.asarray(value, dtype)``) as a ``Constant`` node."""
        array = np.asarray(value, dtype=dtype)
        name = self.name("const")
        self.nodes.append(
            helper.make_node(
                "Constant", [], [name], value=numpy_helper.from_array(array, name=name)
            )
        )
        return name

    # -- shorthands for the ops the search uses most ----------------------------------------

    def where(self, condition: str, x: str, y: str) -> str:
        return self.op("Where", condition, x, y)

    def cast(self, x: str, elem_type: int) -> str:
        return self.op("Cast", x, to=elem_type)

    def unsqueeze(self, x: str, *axes: int) -> str:
        return self.op("Unsqueeze", x, self.const(list(axes), np.int64))

    def squeeze(self, x: str, *axes: int) -> str:
        return self.op("Squeeze", x, self.const(list(axes), np.int64))

    def reshape(self, x: str, shape: str | list[int]) -> str:
        if not isinstance(shape, str):
            shape = self.const(shape, np.int64)
        return self.op("Reshape", x, shape)

    def dim(self, x: str, axis: int) -> str:
        """``x.shape[axis]`` as a ``(1,)`` int64 tensor."""
        return self.op("Shape", x, start=axis, end=axis + 1)

    def arange(self, n: str) -> str:
        """``0, 1, ..., n - 1`` (int64) for ``n`` a ``(1,)`` int64 tensor."""
        zero, one = self.const(0, np.int64), self.const(1, np.int64)
        return self.op("Range", zero, self.squeeze(n, 0), one)

    def gather_rows(self, x: str, rows: str) -> str:
        """``x[rows]`` along axis 0."""
        return self.op("Gather", x, rows, axis=0)

    def any(self, mask: str) -> str:
        """``mask.any()`` as a bool scalar (ReduceMax has no bool kernel: via int64)."""
        as_int = self.cast(mask, TensorProto.INT64)
        return self.cast(self.op("ReduceMax", as_int, keepdims=0), TensorProto.BOOL)

    # -- a Loop body: inputs "<prefix>i", "<prefix>cond", "<prefix>in_<name>" per carried value

    @property
    def iteration(self) -> str:
        """The body's iteration number ``()`` int64, as :meth:`loop_body` declares it."""
        return f"{self.prefix}i"

    def loop_inputs(self, names) -> dict[str, str]:
        """The body's input for each carried value ``name``, as :meth:`loop_body` declares it."""
        return {name: f"{self.prefix}in_{name}" for name in names}

    def loop_body(
        self,
        name: str,
        cond: str,
        carried: dict[str, tuple],
        scans: dict[str, tuple] | None = None,
    ) -> onnx.GraphProto:
        """This builder's nodes as a ``Loop`` body: ``cond`` (a bool scalar), then the new value
        of each carried input (:meth:`loop_inputs`), then the scan outputs. ``carried`` and
        ``scans``: name -> ``(value, (elem_type, shape))`` (``shape`` as for :func:`value_info`);
        ``carried``'s order is the ``Loop``'s."""
        inputs = [
            value_info(self.iteration, TensorProto.INT64, 0),
            value_info(f"{self.prefix}cond", TensorProto.BOOL, 0),
        ]
        inputs += [value_info(self.loop_inputs([key])[key], *t) for key, (_, t) in carried.items()]
        outputs = []
        every = {"cond": (cond, (TensorProto.BOOL, 0)), **carried, **(scans or {})}
        for key, (value, kind) in every.items():
            output = f"{self.prefix}out_{key}"
            self.nodes.append(helper.make_node("Identity", [value], [output]))
            outputs.append(value_info(output, *kind))
        return self.graph(name, inputs, outputs)

    def graph(self, name, inputs, outputs) -> onnx.GraphProto:
        return helper.make_graph(
            self.nodes,
            name,
            inputs,
            outputs,
            initializer=self.initializers,
            value_info=self.value_info,
        )


def _rename_graph(graph: onnx.GraphProto, rename) -> None:
    """Rename every value of ``graph`` (and of its subgraphs) in place with ``rename``."""
    for each in subgraphs(graph):
        for values in (each.input, each.output, each.value_info):
            for value in values:
                value.name = rename(value.name)
        for tensor in each.initializer:
            tensor.name = rename(tensor.name)
        for node in each.node:
            node.input[:] = [rename(n) for n in node.input]
            node.output[:] = [rename(n) for n in node.output]
            node.name = rename(node.name)


def inline(
    builder: GraphBuilder, model: onnx.ModelProto, prefix: str, inputs: dict[str, str]
) -> dict[str, str]:
    """Copy ``model``'s graph into ``builder``, reading ``inputs`` (graph input -> value).

    Every value name (subgraphs of ``If`` nodes included) gets ``prefix``; each graph input
    becomes an ``Identity`` of the value given for it, and the initializers (the weights)
    become the builder's own.

    Returns
    -------
    dict
        Graph output name -> the name it has in the builder.

    Raises
    ------
    ValueError
        ``inputs`` does not name exactly the graph's inputs.
    """
    graph = copy.deepcopy(model.graph)
    names = [value.name for value in graph.input]
    if sorted(names) != sorted(inputs):
        raise ValueError(f"inputs must name the graph's inputs {names}, got {sorted(inputs)}")
    _rename_graph(graph, lambda n: f"{prefix}{n}" if n else n)
    for value, name in zip(graph.input, names, strict=True):
        builder.nodes.append(helper.make_node("Identity", [inputs[name]], [value.name]))
    builder.nodes.extend(graph.node)
    builder.initializers.extend(graph.initializer)
    # The graph's declared shapes, for the inlined copy: onnxruntime folds the step's shape
    # arithmetic only where it sees static dims (1.24 -> 0.45 ms per step for the state's dims
    # alone). Symbolic dims are dropped: "B" of the step is not "B" of the search (beams).
    for value in (*graph.input, *graph.output, *graph.value_info):
        typed = copy.deepcopy(value)
        for dim in typed.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.Clear()
        builder.value_info.append(typed)
    return {f"{value.name[len(prefix) :]}": value.name for value in graph.output}


# -- rewriting a graph in place (skattn.recurrent_graph, skattn.quantize) -----------------


class GraphRewriter:
    """A model being rewritten in place: its constant weights by name, fresh names, and new
    initializers (all in the main graph, which every subgraph sees).

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place (copy it first).
    prefix : str
        The fresh names' prefix.
    """

    def __init__(self, model: onnx.ModelProto, prefix: str) -> None:
        self.model, self.prefix = model, prefix
        graphs = list(subgraphs(model.graph))
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
        self.current: set[str] = set()  # outputs of the nodes of the graph being rewritten

    @property
    def shapes(self) -> dict[str, list[int | None]]:
        if self._shapes is None:
            self._shapes = static_shapes(self.model)
        return self._shapes

    def name(self, hint: str) -> str:
        """A name no value, initializer or node of the model has (nor had when read)."""
        while (name := f"{self.prefix}{hint}_{next(self._names)}") in self.taken:
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


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The subgraphs a node's attributes hold (a ``Loop``'s body, an ``If``'s branches)."""
    found = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            found.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            found.extend(attribute.graphs)
    return found


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph below it (``Loop``, ``Scan`` and ``If`` bodies)."""
    yield graph
    for node in graph.node:
        for subgraph in node_subgraphs(node):
            yield from subgraphs(subgraph)


def static_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Value name -> its inferred dims (None where unknown), subgraphs included."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (inference is a hint: an unknown shape only costs a Scan)
        return {}
    shapes = {}
    for graph in subgraphs(inferred.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            dims = value.type.tensor_type.shape.dim
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return shapes


def rewrite_nodes(
    rewriter: GraphRewriter, rewrite: Callable[[GraphRewriter, onnx.NodeProto], list | None]
) -> int:
    """Replace each node (in every graph) for which ``rewrite`` returns nodes; returns how
    many were replaced."""
    count = 0
    # Children before parents: rewriting a graph copies its nodes, subgraphs included.
    for graph in reversed(list(subgraphs(rewriter.model.graph))):
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


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove the initializers no node, graph input or graph output (any graph) names."""
    graphs = list(subgraphs(model.graph))
    used = {name for g in graphs for n in g.node for name in n.input}
    used |= {value.name for g in graphs for value in (*g.output, *g.input)}
    for graph in graphs:
        kept = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def sink_initializers(model: onnx.ModelProto) -> int:
    """Move (in place) each main-graph initializer that the nodes of one subgraph alone read
    into that subgraph; returns how many moved. The main graph's inputs and outputs stay, and
    so does a name that some subgraph also defines (a body below it reads that value instead).

    onnxruntime runs a ``Loop`` or ``Scan`` body's products much faster on its own weights
    than on its outer scope's, and passes that add weights to the main graph (the recurrent
    expansion, int8 products) leave them there. Measured on the int8 G2P member's beam-5
    ``decode.onnx``, one word at a time, one thread: 0.85x the time once sunk.
    """
    graphs = list(subgraphs(model.graph))
    readers: dict[str, set[int]] = {}
    for index, graph in enumerate(graphs):
        for name in (
            *(x for node in graph.node for x in node.input),
            *(v.name for v in graph.output),
        ):
            readers.setdefault(name, set()).add(index)
    pinned = {value.name for value in (*model.graph.input, *model.graph.output)}
    for graph in graphs[1:]:
        pinned.update(value.name for value in (*graph.input, *graph.initializer))
        pinned.update(x for node in graph.node for x in node.output)
    kept, moved = [], 0
    for tensor in model.graph.initializer:
        where = readers.get(tensor.name, set())
        if len(where) == 1 and 0 not in where and tensor.name not in pinned:
            graphs[where.pop()].initializer.append(tensor)
            moved += 1
        else:
            kept.append(tensor)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return moved


def node_attributes(node: onnx.NodeProto) -> dict:
    """A node's attributes by name, as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def model_copy(model) -> onnx.ModelProto:
    """A deep copy of ``model``; ``ValueError`` naming ``model`` for anything else."""
    if not isinstance(model, onnx.ModelProto):
        raise ValueError(f"model must be an onnx.ModelProto, got {type(model).__name__}")
    return copy.deepcopy(model)
