"""Tests for skattn.quantize and skattn.calibrate: the recurrent cells written as products
equal onnxruntime's own cells, the products' input ranges are measured in every graph and
body, the int8 products stay close to float32 and never depend on the rows beside them, and
int8 artifacts export, load and serve.

Exactness is asserted where the arithmetic is exact (the float32 expansion, and a row's int8
result, which its own values alone decide); int8 results are compared with float32 within the
error of 7-bit weights and 8-bit activations.
"""

import functools
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from test_export import (
    SOURCE_VOCABULARY,
    TARGET_VOCABULARY,
    export,
    make_module,
    make_transformer,
    random_source,
)

import serving
from serving.sessions import resolve_device
from skattn.calibrate import activation_ranges, decode_feeds, product_key
from skattn.core.manifest import ArtifactError, Manifest, sha256_file
from skattn.core.text import EOS, SPECIAL_TOKENS
from skattn.export import STEP_CELLS_EXPANDED_FROM
from skattn.models import Seq2SeqModule
from skattn.models.config import ModelConfig
from skattn.onnx_graph import sink_initializers, subgraphs
from skattn.quantize import (
    MIN_QUANTIZED_SIDE,
    WEIGHT_LEVELS,
    input_bound,
    main,
    product_finder,
    quantize_artifact,
    quantize_matmuls,
    quantize_model,
    quantize_weight,
)
from skattn.recurrent_graph import expand_recurrent, guard_empty_inputs

OPSET = 17


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def op_types(model: onnx.ModelProto) -> list[str]:
    """Every node's op type, in the graph and its subgraphs."""
    return [node.op_type for graph in subgraphs(model.graph) for node in graph.node]


# ---------------------------------------------------------------- weights


def test_weights_are_7_bit_per_column_within_half_a_step():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((40, 24)).astype(np.float32) * rng.uniform(0.01, 3, 24)
    weight[:, 5] = 0.0  # an all-zero column
    q, scale = quantize_weight(weight)
    assert q.dtype == np.int8 and scale.shape == (24,)
    assert np.abs(q).max() == WEIGHT_LEVELS  # each non-zero column reaches its peak
    assert scale[5] == 1.0 and not q[:, 5].any()
    assert np.all(np.abs(weight - q * scale) <= scale / 2 + 1e-7)


# ---------------------------------------------------------------- pass 1: the cells


def recurrent_model(
    op,
    *,
    direction="forward",
    steps=5,
    initial=True,
    bias=True,
    seed=0,
    extra=(),
    hidden=7,
    width=5,
    **attrs,
):
    """One GRU or LSTM node with random weights: inputs X (T, B, I) and its initial states;
    ``extra`` adds ``"lengths"`` (sequence_lens) or ``"peepholes"`` (P, an LSTM's)."""
    rng = np.random.default_rng(seed)
    gates = {"GRU": 3, "LSTM": 4}[op]
    weights = [
        numpy_helper.from_array(rng.standard_normal((1, gates * hidden, width), np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, gates * hidden, hidden), np.float32), "R"),
    ]
    if bias:
        b = rng.standard_normal((1, 2 * gates * hidden), np.float32)
        weights.append(numpy_helper.from_array(b, "B"))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, None, width])]
    states = ["h0", "c0"][: 1 + (op == "LSTM")] if initial else []
    for name in states:
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, None, hidden]))
    node_inputs = ["X", "W", "R", "B" if bias else "", "", *(states or [])]
    if "lengths" in extra:
        lengths = numpy_helper.from_array(np.full(4, 3, np.int32), "lengths")
        weights.append(lengths)
        node_inputs[4] = "lengths"
    if "peepholes" in extra:
        node_inputs += [""] * (7 - len(node_inputs)) + ["P"]
        weights.append(numpy_helper.from_array(np.ones((1, 3 * hidden), np.float32), "P"))
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    outputs = ["Y", "Y_h", "Y_c"][: 2 + (op == "LSTM")]
    node = helper.make_node(
        op, node_inputs, outputs, hidden_size=hidden, direction=direction, **attrs
    )
    graph = helper.make_graph(
        [node],
        "cell",
        inputs,
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (3 + (n == "Y")))
            for n in outputs
        ],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def feeds_for(model, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value or batch for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("steps", [1, 6, None])
@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_the_expanded_cell_equals_onnxruntimes(op, direction, steps, initial, bias):
    model = recurrent_model(op, direction=direction, steps=steps, initial=initial, bias=bias)
    expanded, count = expand_recurrent(model)
    assert count == 1 and op not in op_types(expanded)
    # A node seen to run one step is written without a Scan; any other runs one.
    assert ("Scan" in op_types(expanded)) == (steps != 1)
    onnx.checker.check_model(expanded, full_check=True)
    for batch, seed in [(4, 1), (1, 2), (9, 3)]:
        feeds = feeds_for(model, batch, seed)
        if steps is None:  # a dynamic length: run it at several
            feeds["X"] = np.random.default_rng(seed).standard_normal((seed + 1, batch, 5))
            feeds["X"] = feeds["X"].astype(np.float32)
        expected = session(model).run(None, feeds)
        actual = session(expanded).run(None, feeds)
        for got, want in zip(actual, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("GRU", dict(direction="bidirectional")),
        ("GRU", dict(linear_before_reset=0)),
        ("GRU", dict(clip=1.0)),
        ("GRU", dict(layout=1)),
        ("GRU", dict(extra=("lengths",))),
        ("LSTM", dict(input_forget=1)),
        ("LSTM", dict(extra=("peepholes",))),
        ("LSTM", dict(activations=["Sigmoid", "Relu", "Tanh"])),
    ],
)
def test_cells_it_cannot_write_are_left_as_they_are(op, attrs):
    model = recurrent_model(op, **attrs)
    if attrs.get("direction") == "bidirectional":  # two directions' weights
        for tensor in model.graph.initializer:
            array = numpy_helper.to_array(tensor)
            tensor.CopyFrom(numpy_helper.from_array(np.concatenate([array, array]), tensor.name))
    expanded, count = expand_recurrent(model)
    assert count == 0 and op_types(expanded) == [op]


def test_below_opset_15_the_cells_are_left_and_from_18_split_names_its_parts():
    """The expansion writes Shape(start, end) and Squeeze's axes as an input (opset 15), and
    Split into equal parts, which names num_outputs from opset 18."""
    model = recurrent_model("GRU")
    model.opset_import[0].version = 14
    assert expand_recurrent(model)[1] == 0
    model = recurrent_model("GRU", steps=None, initial=False)
    model.opset_import[0].version = 18
    expanded, count = expand_recurrent(model)
    assert count == 1
    feeds = feeds_for(model)
    feeds["X"] = np.ones((3, 4, 5), np.float32)
    expected = session(model).run(None, feeds)
    for got, want in zip(session(expanded).run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cells_narrower_than_min_hidden_size_are_left_as_they_are():
    model = recurrent_model("GRU", hidden=7)
    assert expand_recurrent(model, min_hidden_size=8)[1] == 0
    assert expand_recurrent(model, min_hidden_size=7)[1] == 1


def test_a_guarded_cell_is_expanded_without_its_guard_and_a_cell_left_fused_keeps_one():
    guarded, _ = guard_empty_inputs(recurrent_model("GRU", hidden=7))
    assert [n.op_type for n in guarded.graph.node][-1] == "If"
    expanded, count = expand_recurrent(guarded)  # as expanded from the plain cell: no If
    assert count == 1 and expanded == expand_recurrent(recurrent_model("GRU", hidden=7))[0]
    narrow, count = expand_recurrent(guarded, min_hidden_size=8)  # left fused: guarded again
    assert count == 0 and "If" in [n.op_type for n in narrow.graph.node]
    assert not any(n.op_type == "GRU" for n in narrow.graph.node)


def test_an_artifact_without_a_decode_graph_quantizes_as_the_int8_export(int8_artifacts, tmp_path):
    """Its ranges are measured on a search graph built from its guarded parts: the guards go
    first, else the cells inside them were expanded under other names and stayed float32."""
    import shutil

    floats, exported = int8_artifacts[3]
    bare = shutil.copytree(floats, tmp_path / "floats")
    manifest = json.loads((bare / "manifest.json").read_text())
    del manifest["files"]["decode.onnx"]
    (bare / "decode.onnx").unlink()
    (bare / "manifest.json").write_text(json.dumps(manifest))
    quantized = quantize_artifact(bare, tmp_path / "int8")
    files = json.loads((exported / "manifest.json").read_text())["files"]
    for name in ("encoder.onnx", "decoder_step.onnx"):  # the very same bytes
        assert sha256_file(quantized / name) == files[name], name


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_float_export_expands_the_step_cells_from_its_threshold_only(cell, tmp_path):
    """A float32 artifact writes the decoder step's cells as products from the width that
    STEP_CELLS_EXPANDED_FROM names for its search (verified against torch by the export
    itself); the encoder's cells, and a greedy model's narrower step, stay fused kernels."""
    greedy_from = STEP_CELLS_EXPANDED_FROM["greedy"]
    assert STEP_CELLS_EXPANDED_FROM["beam"] < 8 < greedy_from
    for hidden, beam_size, expanded in [(greedy_from, 1, True), (8, 1, False), (8, 3, True)]:
        torch.manual_seed(0)
        config = ModelConfig(
            len(SOURCE_VOCABULARY), len(TARGET_VOCABULARY), embedding_dim=6,
            hidden_size=hidden, num_layers=2, cell=cell,
        )  # fmt: skip
        directory = export(
            Seq2SeqModule(config).eval(), tmp_path / f"{hidden}-{beam_size}", beam_size=beam_size
        )
        fused = cell.upper()
        assert fused in op_types(onnx.load(directory / "encoder.onnx"))
        for name in ("decoder_step.onnx", "decode.onnx"):
            step_cells = op_types(onnx.load(directory / name)).count(fused)
            if name == "decode.onnx":  # it inlines the encoder's two directions per layer
                step_cells -= op_types(onnx.load(directory / "encoder.onnx")).count(fused)
            assert step_cells == (0 if expanded else 2), (hidden, beam_size, name)


# ---------------------------------------------------------------- passes 2 and 3: ranges, products


def products_model(rows: int = 6) -> onnx.ModelProto:
    """``Y = A W + b`` (MatMul and Add), ``Z = Gemm(Y, V, c, transB=1)``, ``S = Z Z^T`` (two
    activations) and ``U = Z u`` with a ``(32, 1)`` weight."""
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.standard_normal((48, 32), np.float32),
        "b": rng.standard_normal(32).astype(np.float32),
        "V": rng.standard_normal((32, 32), np.float32) / 4,
        "c": rng.standard_normal(32).astype(np.float32),
        "u": rng.standard_normal((32, 1), np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["A", "W"], ["AW"]),
        helper.make_node("Add", ["AW", "b"], ["Y"]),
        helper.make_node("Gemm", ["Y", "V", "c"], ["Z"], transB=1),
        helper.make_node("Transpose", ["Z"], ["Zt"]),
        helper.make_node("MatMul", ["Z", "Zt"], ["S"]),
        helper.make_node("MatMul", ["Z", "u"], ["U"]),
    ]
    graph = helper.make_graph(
        nodes,
        "products",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, 48])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "YZSU"],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def ranges_of(model: onnx.ModelProto, *batches: np.ndarray) -> dict[str, float]:
    """The products' input ranges measured on ``batches`` of ``A``."""
    return activation_ranges(model, product_finder(model), [{"A": a} for a in batches])


def calibrated(model: onnx.ModelProto, seed: int = 1) -> onnx.ModelProto:
    """``model`` quantized with ranges measured on 6 rows of standard normal ``A``."""
    rows = np.random.default_rng(seed).standard_normal((6, 48)).astype(np.float32)
    return quantize_matmuls(model, ranges_of(model, rows))[0]


def test_weight_products_become_int8_and_stay_close():
    model = products_model()
    feeds = {"A": np.random.default_rng(1).standard_normal((6, 48)).astype(np.float32)}
    ranges = ranges_of(model, feeds["A"])
    quantized, count = quantize_matmuls(model, ranges)
    types = op_types(quantized)
    # A W + b (the Add folded in) and the Gemm; Z Z^T reads no weight, Z u is too narrow.
    assert count == 2 and types.count("MatMulIntegerToFloat") == 2
    assert types.count("QuantizeLinear") == 2
    assert "Add" not in types and "Gemm" not in types and types.count("MatMul") == 2
    assert {t.name for t in quantized.graph.initializer}.isdisjoint({"W", "V"})  # int8 only
    expected = session(model).run(None, feeds)
    actual = session(quantized).run(None, feeds)
    for got, want in zip(actual, expected, strict=True):
        assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


def test_the_ranges_are_the_largest_inputs_each_product_met():
    model = products_model()
    rng = np.random.default_rng(4)
    batches = [rng.standard_normal((n, 48)).astype(np.float32) for n in (3, 5)]
    ranges = ranges_of(model, *batches)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    first = product_key(weights["W"])  # A W: its input is A
    assert ranges[first] == max(np.abs(b).max() for b in batches)
    gemm = product_key(weights["V"].T)  # Gemm(Y, V, transB=1): named by V^T as multiplied
    ys = [session(model).run(["Y"], {"A": b})[0] for b in batches]
    assert ranges[gemm] == pytest.approx(max(np.abs(y).max() for y in ys), rel=1e-6)
    assert set(ranges) == {first, gemm}  # Z u is too narrow to quantize: not measured
    with pytest.raises(ValueError, match="feeds must hold at least one batch"):
        activation_ranges(model, product_finder(model), [])


def test_an_int8_row_never_changes_with_the_rows_beside_it():
    """Each product's input scale is fixed in the graph: a row's integers, and so its result,
    are its own, even beside rows far outside the measured range (which saturate)."""
    quantized = calibrated(products_model())
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((4, 48)).astype(np.float32)
    others = rng.standard_normal((5, 48)).astype(np.float32) * 3
    per_item = ["Y", "Z", "U"]  # one row per item (S is Z Z^T)
    alone = [session(quantized).run(per_item, {"A": rows[i : i + 1]}) for i in range(4)]
    batched = session(quantized).run(per_item, {"A": np.concatenate([others[:2], rows, others])})
    for i in range(4):
        for got, want in zip(alone[i], batched, strict=True):
            np.testing.assert_array_equal(got[0], want[2 + i])


def test_a_product_never_measured_stays_float32():
    model = products_model()
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    only_the_gemm = {product_key(weights["V"].T): 4.0}
    quantized, count = quantize_matmuls(model, only_the_gemm)
    assert count == 1 and op_types(quantized).count("MatMulIntegerToFloat") == 1
    assert "W" in {t.name for t in quantized.graph.initializer}
    zero = {product_key(weights["V"].T): 0.0}  # an input that was only ever zeros
    assert quantize_matmuls(model, zero)[1] == 0


def test_an_input_range_rounds_up_to_a_coarse_grid():
    peaks = np.geomspace(1e-3, 1e3, 200)
    bounds = np.array([input_bound(p) for p in peaks])
    assert (bounds >= peaks).all() and (bounds < peaks * 2 ** (1 / 8) * (1 + 1e-9)).all()
    assert input_bound(1.0) == 1.0 and input_bound(np.nextafter(1.7, 2.0)) == input_bound(1.7)


def doubling_loop(weight: np.ndarray) -> onnx.ModelProto:
    """A Loop of ``n`` trips whose body multiplies ``x`` by ``weight`` (a scan output) and
    doubles ``x`` for the next trip: the product's input peaks on the last trip."""
    width = weight.shape[0]
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_in", "W"], ["y"]),
            helper.make_node("Add", ["x_in", "x_in"], ["x_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [None, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [None, width]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["x_last", "ys"], body=body)],
        "loop",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width]),
        ],
        [helper.make_tensor_value_info("ys", TensorProto.FLOAT, [None, None, width])],
        [numpy_helper.from_array(weight, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_ranges_inside_a_scan_are_the_largest_over_time(direction):
    """An expanded cell's recurrent product reads the state before each step: h_0 = 0, then
    every output but the last; its input product reads X at every step."""
    cell = recurrent_model("GRU", direction=direction, initial=False, hidden=16, width=16)
    model, _ = expand_recurrent(cell)
    feeds = feeds_for(model)
    ranges = activation_ranges(model, product_finder(model), [feeds])
    Y = session(cell).run(["Y"], feeds)[0][:, 0]  # (T, B, H)
    read = Y[:-1] if direction == "forward" else Y[1:]  # the states that fed a step
    weights = {t.name: numpy_helper.to_array(t)[0] for t in cell.graph.initializer}
    W, R = weights["W"], weights["R"]  # (3H, I), (3H, H): gates z r h
    assert ranges[product_key(np.ascontiguousarray(R[:32].T))] == pytest.approx(
        np.abs(read).max(), rel=1e-6
    )
    assert ranges[product_key(np.ascontiguousarray(W[32:].T))] == np.abs(feeds["X"]).max()
    assert len(ranges) == 4  # two input products, two recurrent ones


def test_ranges_inside_a_loop_are_the_largest_over_its_trips():
    rng = np.random.default_rng(5)
    weight = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    looped = doubling_loop(weight)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    ranges = activation_ranges(looped, product_finder(looped), [{"n": np.array(3), "x": x}])
    assert ranges == {product_key(weight): pytest.approx(4 * np.abs(x).max())}  # trip 3: 4 x
    quantized, count = quantize_matmuls(looped, ranges)
    assert count == 1 and "MatMulIntegerToFloat" in op_types(quantized)
    got = session(quantized).run(None, {"n": np.array(3), "x": x})[0]
    want = session(looped).run(None, {"n": np.array(3), "x": x})[0]
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def test_a_loop_of_no_trips_or_no_rows_measures_nothing_and_stays_float32():
    looped = doubling_loop(np.eye(16, dtype=np.float32))
    find = product_finder(looped)
    empty = [
        {"n": np.array(0), "x": np.ones((2, 16), np.float32)},
        {"n": np.array(3), "x": np.ones((0, 16), np.float32)},
    ]
    ranges = activation_ranges(looped, find, empty)
    assert ranges == {product_key(np.eye(16, dtype=np.float32)): 0.0}
    assert quantize_matmuls(looped, ranges)[1] == 0  # only zeros measured: float32


def test_decode_feeds_are_sources_of_the_vocabulary_with_their_end_marker(int8_artifacts):
    manifest = serving.load(int8_artifacts[1][0], "cpu").manifest
    feeds = decode_feeds(manifest, count=70, max_length=9, batch=32)
    assert [len(f["src"]) for f in feeds] == [32, 32, 6]
    for feed in feeds:
        src, lengths = feed["src"], feed["src_lengths"]
        assert (1 < lengths).all() and (lengths <= 10).all()  # 1-9 tokens and EOS
        for row, n in zip(src, lengths, strict=True):
            assert row[n - 1] == EOS and (row[n:] == 0).all()
            assert (row[: n - 1] >= len(SPECIAL_TOKENS)).all()
        assert feed["max_length"].shape == () and feed["temperature"].dtype == np.float32
    again = decode_feeds(manifest, count=70, max_length=9, batch=32)
    assert all((a["src"] == b["src"]).all() for a, b in zip(feeds, again, strict=True))


def test_overridable_defaults_and_subgraph_outputs_keep_their_initializers():
    """An initializer that is also a graph input is a default a caller may override: not a
    constant to quantize. One that only a subgraph outputs is still used."""
    model = products_model()
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [48, 32]))
    rows = np.random.default_rng(1).standard_normal((6, 48)).astype(np.float32)
    ranges = ranges_of(products_model(), rows)  # W measured as a constant: still not quantized
    quantized, count = quantize_matmuls(model, ranges)
    assert count == 1 and "W" in {t.name for t in quantized.graph.initializer}  # the Gemm only
    feeds = {"A": np.ones((2, 48), np.float32), "W": np.zeros((48, 32), np.float32)}
    np.testing.assert_allclose(
        session(quantized).run(["Y"], feeds)[0], session(model).run(["Y"], feeds)[0]
    )

    def branch(name, value):  # an If branch whose output is its own initializer
        k = numpy_helper.from_array(np.array(value, np.float32), "K")
        output = helper.make_tensor_value_info("K", TensorProto.FLOAT, [2])
        return helper.make_graph([], name, [], [output], [k])

    graph = products_model().graph
    graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    graph.node.append(
        helper.make_node(
            "If",
            ["flag"],
            ["picked"],
            then_branch=branch("a", [1, 2]),
            else_branch=branch("b", [3, 4]),
        )
    )
    graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, [2]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    quantized, _ = quantize_matmuls(model, ranges)
    feeds = {"A": np.ones((2, 48), np.float32), "flag": np.array(True)}
    np.testing.assert_array_equal(session(quantized).run(["picked"], feeds)[0], [1.0, 2.0])


def test_a_second_pass_never_reuses_a_name():
    """quantize_matmuls, then quantize_model over its result: the new weights, scales and
    zero points get names the first pass's do not have."""
    model = products_model()
    rows = np.random.default_rng(1).standard_normal((6, 48)).astype(np.float32)
    ranges = ranges_of(model, rows)
    once, _ = quantize_matmuls(model, ranges)
    twice = quantize_model(once, ranges)
    names = [t.name for t in twice.graph.initializer]
    assert len(names) == len(set(names))
    feeds = {"A": np.random.default_rng(3).standard_normal((4, 48)).astype(np.float32)}
    for a, b in zip(session(once).run(None, feeds), session(twice).run(None, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("weight", [np.ones(4), np.ones((2, 2, 2)), np.array([[1.0, np.nan]])])
def test_a_weight_that_is_not_a_finite_matrix_is_refused(weight):
    with pytest.raises(ValueError, match="weight must be a finite 2-D array"):
        quantize_weight(weight)


@pytest.mark.parametrize(
    "rewrite",
    [
        expand_recurrent,
        functools.partial(quantize_matmuls, ranges={}),
        functools.partial(quantize_model, ranges={}),
        functools.partial(activation_ranges, find=lambda node: None, feeds=[{}]),
    ],
)
def test_a_model_that_is_not_a_model_is_refused(rewrite, tmp_path):
    with pytest.raises(ValueError, match="model must be an onnx.ModelProto, got str"):
        rewrite(str(tmp_path / "encoder.onnx"))


# ---------------------------------------------------------------- artifacts


def test_every_kind_exports_its_expanded_cells_checked_against_torch(tmp_path):
    """Export checks the expanded graphs against the torch module at 1e-4 (verify_graphs), so
    each kind exporting is that check passing; the cells are gone from every graph."""
    kinds = [
        dict(decoder="bahdanau", attention="global", scorer="additive"),
        dict(decoder="luong", attention="local-p", scorer="general", cell="lstm"),
        dict(decoder="bahdanau", attention="local-m", scorer="dot", cell="lstm", num_layers=2),
        dict(decoder="luong", attention="global", scorer="dot", input_feeding=False),
    ]
    for i, kind in enumerate(kinds):
        directory = export(make_module(**kind), tmp_path / str(i), quantize="int8")
        manifest = Manifest.from_json((directory / "manifest.json").read_text())
        assert manifest.quantization == "int8"
        for name in manifest.files:
            graph = onnx.load(directory / name)
            types = op_types(graph)
            assert "GRU" not in types and "LSTM" not in types, (kind, name)
            assert float_products(graph) == [], (kind, name)  # every range found


def exported_pairs(model, directory, quantization: str) -> dict:
    """Beam size (1, 3) -> the fitted ``model`` exported as float32 and with ``quantization``
    into ``directory``; the model's beam size is 1 again after."""
    paths = {}
    for beam in (1, 3):
        model.set_params(beam_size=beam)
        paths[beam] = (
            model.export_onnx(directory / f"float{beam}"),
            model.export_onnx(directory / f"{quantization}_{beam}", quantize=quantization),
        )
    model.set_params(beam_size=1)
    return paths


@pytest.fixture(scope="module")
def int8_artifacts(fitted_reversal, tmp_path_factory):
    """The fitted reversal model exported as float32 and int8, greedy and beam 3."""
    return exported_pairs(fitted_reversal, tmp_path_factory.mktemp("quantized"), "int8")


@pytest.mark.parametrize("beam", [1, 3])
def test_an_int8_artifact_serves_the_float_models_answers(int8_artifacts, reversal_data, beam):
    _, _, X_test, y_test = reversal_data
    floats, int8 = int8_artifacts[beam]
    assert "MatMulIntegerToFloat" in op_types(onnx.load(int8 / "decoder_step.onnx"))
    expected = serving.load(floats, "cpu").predict(X_test)
    runtime = serving.load(int8, "cpu")
    assert runtime.manifest.quantization == "int8" and runtime.decode_graph
    answers = runtime.predict(X_test)
    agreement = np.mean([a == e for a, e in zip(answers, expected, strict=True)])
    assert agreement >= 0.97, agreement
    # The search graph runs the same int8 products as the step-wise search, row by row.
    assert serving.load(int8, "cpu", decode_graph=False).predict(X_test) == answers


@pytest.mark.parametrize("beam", [1, 3])
def test_batch_composition_never_changes_an_int8_prediction(int8_artifacts, reversal_data, beam):
    """Every answer of an item alone equals the same item's among others, and its attention
    weights agree to float32 rounding (padding changes the softmax's sums by an ulp), where
    per-call ranges moved them by about 1e-3."""
    _, _, X_test, _ = reversal_data
    runtime = serving.load(int8_artifacts[beam][1], "cpu")
    sources = X_test[:48]
    alone = [runtime.predict_batch([source], None, True) for source in sources]
    for order in (slice(None), slice(None, None, -1)):  # other neighbours, other chunks
        answers, maps = runtime.predict_batch(sources[order], None, True)
        for (answer, weights), (want, want_weights) in zip(
            zip(answers, maps, strict=True), alone[order], strict=True
        ):
            assert answer == want[0]
            np.testing.assert_allclose(weights, want_weights[0], rtol=0, atol=1e-6)


def test_int8_attention_maps_are_close_to_the_float_ones(int8_artifacts, reversal_data):
    _, _, X_test, _ = reversal_data
    floats, int8 = int8_artifacts[1]
    expected = serving.load(floats, "cpu").predict_batch(X_test[:40], None, True)
    actual = serving.load(int8, "cpu").predict_batch(X_test[:40], None, True)
    compared = 0
    for answer, weights, want_answer, want in zip(*actual, *expected, strict=True):
        weights = np.asarray(weights)
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)
        if answer == want_answer:
            compared += 1
            assert np.abs(weights - np.asarray(want)).max() <= 0.05
    assert compared >= 38


def test_quantize_artifact_and_its_command_match_export(
    int8_artifacts, reversal_data, tmp_path, capsys
):
    floats, exported = int8_artifacts[1]
    copied = quantize_artifact(floats, tmp_path / "copy")
    main([str(floats), str(tmp_path / "cli")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    files = json.loads((exported / "manifest.json").read_text())["files"]
    expected = serving.load(exported, "cpu").predict(reversal_data[2])
    for directory in (copied, tmp_path / "cli"):
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["quantization"] == "int8"
        for name in ("encoder.onnx", "decoder_step.onnx"):  # the very same bytes
            assert manifest["files"][name] == files[name]
        # decode.onnx inlines the cells expanded under other names: the same answers.
        assert serving.load(directory, "cpu").predict(reversal_data[2]) == expected


def test_a_graph_the_manifest_does_not_list_is_not_carried_into_the_int8_artifact(
    int8_artifacts, tmp_path
):
    import shutil

    floats = shutil.copytree(int8_artifacts[3][0], tmp_path / "floats")
    manifest = json.loads((floats / "manifest.json").read_text())
    del manifest["files"]["decode.onnx"]  # left on disk, unlisted: not part of the artifact
    (floats / "manifest.json").write_text(json.dumps(manifest))
    quantized = quantize_artifact(floats, tmp_path / "int8")
    assert not (quantized / "decode.onnx").exists()  # else listed, float32, as int8's
    assert "decode.onnx" not in json.loads((quantized / "manifest.json").read_text())["files"]


def test_folders_of_the_artifact_are_copied_and_a_graph_that_does_not_parse_is_named(
    int8_artifacts, tmp_path, capsys
):
    """A folder beside the graphs was dropped without a word; a truncated graph whose checksum
    was written over the damage ended the command in protobuf's traceback."""
    import shutil

    from skattn.core.manifest import sha256_file

    floats = shutil.copytree(int8_artifacts[3][0], tmp_path / "floats")
    (floats / "figures").mkdir()
    (floats / "figures" / "a.txt").write_text("kept")
    (floats / ".skattn-export-stale").mkdir()  # an export's staging folder: not the artifact's
    os.mkfifo(floats / "pipe")  # neither a file nor a folder: left behind, as before
    (floats / "dangling").symlink_to(tmp_path / "nowhere")
    quantized = quantize_artifact(floats, tmp_path / "int8")
    assert (quantized / "figures" / "a.txt").read_text() == "kept"
    assert not (quantized / ".skattn-export-stale").exists()
    assert not (quantized / "pipe").exists() and not (quantized / "dangling").is_symlink()
    inside = quantize_artifact(floats, floats / "int8")  # the copy is not copied into itself
    assert sorted(p.name for p in inside.iterdir() if p.is_dir()) == ["figures"]
    shutil.rmtree(inside)
    encoder = floats / "encoder.onnx"
    encoder.write_bytes(encoder.read_bytes()[:1000])
    manifest = json.loads((floats / "manifest.json").read_text())
    manifest["files"]["encoder.onnx"] = sha256_file(encoder)
    (floats / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"encoder\.onnx: not a readable ONNX graph"):
        quantize_artifact(floats, tmp_path / "broken")
    assert not (tmp_path / "broken").exists()
    with pytest.raises(SystemExit) as exited:
        main([str(floats), str(tmp_path / "broken")])
    assert exited.value.code == 2
    assert "not a readable ONNX graph" in capsys.readouterr().err


def test_a_graph_whose_weights_lie_in_an_external_file_is_refused(int8_artifacts, tmp_path):
    """onnx.load read them in, and the int8 copy carried weights no checksum had covered,
    from a float artifact that serving.load refuses."""
    import shutil

    from tampering import weights_to_an_external_file

    floats = shutil.copytree(int8_artifacts[3][0], tmp_path / "floats")
    weights_to_an_external_file(floats)
    with pytest.raises(ValueError, match=r"encoder\.onnx: weights in an external-data file"):
        quantize_artifact(floats, tmp_path / "int8")


def test_bad_quantization_requests_are_refused(int8_artifacts, fitted_reversal, tmp_path):
    floats, int8 = int8_artifacts[1]
    with pytest.raises(ValueError, match="quantize must be None or one of"):
        fitted_reversal.export_onnx(tmp_path / "x", quantize="int4")
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize_artifact(floats, tmp_path / "y", quantization="fp16")
    with pytest.raises(ValueError, match="already quantized"):
        quantize_artifact(int8, tmp_path / "z")
    with pytest.raises(ValueError, match="exists"):
        quantize_artifact(floats, int8)
    for args, name in (((None, tmp_path / "w"), "source"), ((floats, 5), "destination")):
        with pytest.raises(ValueError, match=rf"{name} must be a str or os\.PathLike"):
            quantize_artifact(*args)
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "missing"), str(tmp_path / "out")])
    assert exited.value.code == 2


def float_products(model: onnx.ModelProto) -> list[str]:
    """The MatMul / Gemm nodes (any graph) that still multiply by a constant weight at least
    MIN_QUANTIZED_SIDE on each side."""
    graphs = list(subgraphs(model.graph))
    weights = {t.name: t for graph in graphs for t in graph.initializer}
    left = []
    for node in (node for graph in graphs for node in graph.node):
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type in ("MatMul", "Gemm") and weight is not None:
            if len(weight.dims) == 2 and min(weight.dims) >= MIN_QUANTIZED_SIDE:
                left.append(node.name or node.output[0])
    return left


@pytest.mark.parametrize("beam", [1, 3])
def test_every_graph_and_body_multiplies_its_weights_in_int8(int8_artifacts, beam):
    """decode.onnx's Loop body (the step) and the encoder's Scan bodies included."""
    floats, int8 = int8_artifacts[beam]
    for name in ("encoder.onnx", "decoder_step.onnx", "decode.onnx"):
        assert float_products(onnx.load(floats / name)), name  # the check sees them
        quantized = onnx.load(int8 / name)
        assert float_products(quantized) == [], name
        assert "Scan" in op_types(quantized) or name == "decoder_step.onnx"


@pytest.mark.parametrize("beam", [1, 3])
def test_each_body_holds_the_weights_only_it_reads(int8_artifacts, beam):
    """onnxruntime multiplies a body's own weights faster than its outer scope's."""
    _, int8 = int8_artifacts[beam]
    for name in ("encoder.onnx", "decode.onnx"):
        model = onnx.load(int8 / name)
        main = model.graph
        read_in_main = {x for node in main.node for x in node.input} | {v.name for v in main.output}
        assert all(t.name in read_in_main for t in main.initializer), name
        assert any(g.initializer for g in list(subgraphs(main))[1:]), name


def test_sink_initializers_moves_what_one_body_alone_reads():
    def body(name, weight):
        return helper.make_graph(
            [helper.make_node("Add", [weight, weight], ["y"]),
             helper.make_node("Identity", ["c"], ["c_out"])],
            name,
            [helper.make_tensor_value_info(n, t, s) for n, t, s in
             (("i", TensorProto.INT64, []), ("c", TensorProto.BOOL, []))],
            [helper.make_tensor_value_info(n, t, s) for n, t, s in
             (("c_out", TensorProto.BOOL, []), ("y", TensorProto.FLOAT, [2]))],
        )  # fmt: skip

    weights = {n: numpy_helper.from_array(np.full(2, v, np.float32), n) for n, v in
               (("own", 1.0), ("shared", 2.0), ("default", 3.0))}  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", ""], ["y1"], body=body("b1", "own")),
         helper.make_node("Loop", ["n", ""], ["y2"], body=body("b2", "shared")),
         helper.make_node("Loop", ["n", ""], ["y3"], body=body("b3", "default")),
         helper.make_node("Add", ["shared", "shared"], ["z"])],
        "m",
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("default", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "y3")]
        + [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        list(weights.values()),
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    feeds = {"n": np.array(2, np.int64)}
    before = session(model).run(None, feeds)
    assert sink_initializers(model) == 1  # "shared" is read outside too, "default" is an input
    assert [t.name for t in model.graph.initializer] == ["shared", "default"]
    assert [t.name for t in model.graph.node[0].attribute[0].g.initializer] == ["own"]
    for got, expected in zip(session(model).run(None, feeds), before, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shadow", [False, True])
def test_sink_initializers_reaches_a_nested_body_and_respects_shadowing(shadow):
    def loop(name, body):
        return helper.make_node("Loop", ["n", ""], [name], body=body)

    def body(name, nodes):  # values named after the body: one name, one value (SSA)
        ins = [helper.make_tensor_value_info(f"{name}_i", TensorProto.INT64, []),
               helper.make_tensor_value_info(f"{name}_c", TensorProto.BOOL, [])]  # fmt: skip
        outs = [helper.make_tensor_value_info(f"{name}_c_out", TensorProto.BOOL, []),
                helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)]  # fmt: skip
        keep_going = helper.make_node("Identity", [f"{name}_c"], [f"{name}_c_out"])
        return helper.make_graph([keep_going, *nodes], name, ins, outs)

    inner = body("inner", [helper.make_node("Add", ["deep", "deep"], ["inner_y"])])
    reader = body("reader", [helper.make_node("Add", ["other", "other"], ["reader_y"])])
    # With shadow, "other" is also the middle body's own value, which the innermost body then
    # reads (onnxruntime refuses such a model, the ONNX checker does not), so the main graph's
    # "other" must stay.
    own = [helper.make_node("Constant", [], ["other"], value_floats=[5.0, 6.0])] if shadow else []
    middle = body(
        "middle",
        [
            loop("inner_out", inner),
            *own,
            loop("reader_out", reader),
            helper.make_node("Add", ["inner_out", "reader_out"], ["middle_y"]),
        ],
    )
    graph = helper.make_graph(
        [loop("out", middle)],
        "m",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.full(2, v, np.float32), n)
            for n, v in (("deep", 1.0), ("other", 2.0))
        ],  # fmt: skip
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    feeds = {"n": np.array(2, np.int64)}
    before = None if shadow else session(model).run(None, feeds)[0]
    assert sink_initializers(model) == 1 + (not shadow)
    owners = {t.name: g.name for g in subgraphs(model.graph) for t in g.initializer}
    assert owners == {"deep": "inner", "other": "m" if shadow else "reader"}
    if not shadow:
        np.testing.assert_array_equal(session(model).run(None, feeds)[0], before)


def test_an_int8_artifact_is_refused_on_cuda_before_any_gpu_is_looked_for(int8_artifacts):
    with pytest.raises(ValueError, match="int8-quantized.*CPU only"):
        serving.load(int8_artifacts[1][1], "cuda")


def test_quantize_artifact_checks_its_source_and_copies_the_other_files(int8_artifacts, tmp_path):
    floats = int8_artifacts[1][0]
    source = tmp_path / "source"
    source.mkdir()
    for path in floats.iterdir():
        (source / path.name).write_bytes(path.read_bytes())
    (source / "LICENSE").write_text("the data's license")
    copied = quantize_artifact(source, tmp_path / "copy")
    assert (copied / "LICENSE").read_text() == "the data's license"
    with open(source / "encoder.onnx", "ab") as f:  # damaged after export
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="encoder.onnx: checksum mismatch"):
        quantize_artifact(source, tmp_path / "again")
    with pytest.raises(ArtifactError, match="not an artifact directory"):
        quantize_artifact(tmp_path / "nowhere", tmp_path / "more")
    assert not (tmp_path / "again").exists() and not (tmp_path / "more").exists()


def test_int8_artifacts_run_on_the_cpu_only():
    assert resolve_device("auto", "int8") == ("cpu", 0)
    assert resolve_device("cpu", "int8") == ("cpu", 0)
    with pytest.raises(ValueError, match="device='cuda'.*int8-quantized.*CPU only"):
        resolve_device("cuda", "int8")


def test_the_manifest_reads_quantization_and_defaults_to_none(int8_artifacts):
    data = json.loads((int8_artifacts[1][1] / "manifest.json").read_text())
    assert Manifest.from_dict(dict(data)).quantization == "int8"
    data.pop("quantization")
    assert Manifest.from_dict(dict(data)).quantization == "none"  # written before it existed
    data["quantization"] = "int4"
    with pytest.raises(ArtifactError, match="'quantization' must be one of"):
        Manifest.from_dict(data)


def test_an_int8_transformer_exports_and_its_encoding_stays_close(tmp_path):
    module = make_transformer()
    floats = export(module, tmp_path / "float")
    int8 = export(module, tmp_path / "int8", quantize="int8")
    for name in ("encoder.onnx", "decoder_step.onnx", "decode.onnx", "attention.onnx"):
        assert float_products(onnx.load(int8 / name)) == [], name  # every range found
    assert "MatMulIntegerToFloat" in op_types(onnx.load(int8 / "attention.onnx"))
    src, lengths = random_source(5, 7, np.random.default_rng(0))
    encoded = [
        session(onnx.load(d / "encoder.onnx")).run(None, {"src": src, "src_lengths": lengths})
        for d in (floats, int8)
    ]
    for got, want in zip(encoded[1], encoded[0], strict=True):
        if want.dtype == np.float32 and want.size:  # the empty self-attention cache too
            assert np.abs(got - want).max() <= 0.05 * max(np.abs(want).max(), 1e-3)
