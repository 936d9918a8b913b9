"""``skattn.loop_invariants.hoist_loop_invariants``: what leaves a ``Loop`` body, what stays,
and the same outputs before and after (onnxruntime)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from skattn.loop_invariants import hoist_loop_invariants

OPSET = 17
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"]).run(
        None, feeds
    )


def tensor(name: str, elem_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def body_graph(name: str, nodes, carried: list[str], rank: int, scans=(), initializers=()):
    """A ``Loop`` body over ``carried`` float values of ``rank`` dims: inputs ``<name>_i``,
    ``<name>_c`` and ``<name>_in_<v>``; outputs ``<name>_c_out``, ``<name>_out_<v>`` and the
    ``scans``."""
    keep_going = helper.make_node("Identity", [f"{name}_c"], [f"{name}_c_out"])
    inputs = [tensor(f"{name}_i", INT64, []), tensor(f"{name}_c", BOOL, [])]
    inputs += [tensor(f"{name}_in_{v}", FLOAT, [None] * rank) for v in carried]
    outputs = [tensor(f"{name}_c_out", BOOL, [])]
    outputs += [tensor(f"{name}_out_{v}", FLOAT, [None] * rank) for v in [*carried, *scans]]
    return helper.make_graph([keep_going, *nodes], name, inputs, outputs, list(initializers))


def node(op: str, inputs: list[str], output: str, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=f"node_{output}", **attrs)


def body_node_outputs(model: onnx.ModelProto, depth: int = 1) -> set[str]:
    graph = model.graph
    for _ in range(depth):
        graph = next(n for n in graph.node if n.op_type == "Loop").attribute[0].g
    return {x for n in graph.node for x in n.output}


def one_loop_model() -> onnx.ModelProto:
    """``acc_{i+1} = acc_i + Reshape(x, (3, 2))^T + x W`` with a random ``0 *`` term, over
    ``x (2, 3)`` from the main graph, plus a scan output of ``x^T``."""
    W = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3) / 10, "b_W")
    shape = helper.make_node(
        "Constant", [], ["b_shape"], value=numpy_helper.from_array(np.array([3, 2], np.int64))
    )
    nodes = [
        shape,  # static, read by an invariant node and by a varying one
        node("Reshape", ["x", "b_shape"], "b_xr"),  # invariant, reads a static value
        node("Transpose", ["b_xr"], "b_xrt"),  # invariant, reads an invariant value
        node("MatMul", ["x", "b_W"], "b_xw"),  # invariant, reads the body's only-reader weight
        node("Reshape", ["b_in_acc", "b_shape"], "b_acc_r"),  # varies: reads the carried value
        node("Transpose", ["b_acc_r"], "b_acc_back"),
        node("RandomUniformLike", ["x"], "b_noise", seed=1.0),  # random: never moved
        node("Mul", ["b_noise", "zero"], "b_no_noise"),
        node("Add", ["b_acc_back", "b_xrt"], "b_sum"),
        node("Add", ["b_sum", "b_xw"], "b_sum2"),
        node("Add", ["b_sum2", "b_no_noise"], "b_out_acc"),
        node("Transpose", ["x"], "b_out_xt"),  # writes a body output: stays
    ]
    body = body_graph("b", nodes, ["acc"], 2, scans=["xt"], initializers=[W])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "acc0"], ["acc", "xts"], body=body)],
        "m",
        [tensor("n", INT64, []), tensor("x", FLOAT, [2, 3]), tensor("acc0", FLOAT, [2, 3])],
        [tensor("acc", FLOAT, [None] * 2), tensor("xts", FLOAT, [None] * 3)],
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_invariant_nodes_leave_the_body_and_the_outputs_stay_the_same():
    model = one_loop_model()
    rng = np.random.default_rng(0)
    feeds = {
        "n": np.array(3, np.int64),
        "x": rng.normal(size=(2, 3)).astype(np.float32),
        "acc0": rng.normal(size=(2, 3)).astype(np.float32),
    }
    before = run(model, feeds)

    assert hoist_loop_invariants(model) == 3
    onnx.checker.check_model(model)
    main = [n.output[0] for n in model.graph.node]
    assert main[-1] == "acc" and {"b_xr", "b_xrt", "b_xw"} <= set(main[:-1])
    inside = body_node_outputs(model)
    assert not inside & {"b_xr", "b_xrt", "b_xw"}
    # Still read in the body: the shape; the random term and the body output stay too.
    assert {"b_shape", "b_acc_r", "b_noise", "b_out_xt"} <= inside
    body = model.graph.node[-1].attribute[0].g
    assert [t.name for t in body.initializer] == []  # W went with its only reader
    copies = [t.name for t in model.graph.initializer]
    assert any(name.startswith("b_W_hoisted") for name in copies)
    for got, expected in zip(run(model, feeds), before, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_value_invariant_in_two_nested_loops_leaves_both():
    """``inner`` reads ``x`` (main graph) and the middle loop's carried ``m``: the first leaves
    both bodies, the second stops in the middle body."""
    inner_nodes = [
        node("Neg", ["x"], "inner_negx"),  # invariant in both loops
        node("Exp", ["middle_in_m"], "inner_em"),  # invariant in the inner loop only
        node("Add", ["inner_in_v", "inner_negx"], "inner_s"),
        node("Add", ["inner_s", "inner_em"], "inner_out_v"),
    ]
    inner = body_graph("inner", inner_nodes, ["v"], 1)
    middle_nodes = [
        helper.make_node("Loop", ["n", "", "middle_in_m"], ["middle_v"], body=inner),
        node("Mul", ["middle_v", "half"], "middle_out_m"),
    ]
    middle = body_graph("middle", middle_nodes, ["m"], 1)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["out"], body=middle)],
        "m",
        [tensor("n", INT64, []), tensor("x", FLOAT, [4])],
        [tensor("out", FLOAT, [None])],
        [numpy_helper.from_array(np.full(1, 0.5, np.float32), "half")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    feeds = {"n": np.array(3, np.int64), "x": np.linspace(-1, 1, 4).astype(np.float32)}
    before = run(model, feeds)[0]

    assert hoist_loop_invariants(model) == 3  # Neg out of inner, then out of middle; Exp
    assert "inner_negx" in {n.output[0] for n in model.graph.node}
    assert "inner_em" in body_node_outputs(model, depth=1)
    assert body_node_outputs(model, depth=2) == {"inner_c_out", "inner_s", "inner_out_v"}
    onnx.checker.check_model(model)
    np.testing.assert_allclose(run(model, feeds)[0], before, rtol=1e-6)


def test_a_body_of_varying_nodes_is_left_alone():
    nodes = [node("Add", ["b_in_acc", "x"], "b_out_acc"), node("Identity", ["x"], "b_out_xt")]
    body = body_graph("b", nodes, ["acc"], 1, scans=["xt"])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["acc", "xts"], body=body)],
        "m",
        [tensor("n", INT64, []), tensor("x", FLOAT, [2])],
        [tensor("acc", FLOAT, [None]), tensor("xts", FLOAT, [None] * 2)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    before = model.SerializeToString()
    assert hoist_loop_invariants(model) == 0
    assert model.SerializeToString() == before
