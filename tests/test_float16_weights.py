"""Tests for skattn.float16_weights: float16 weights cast back as onnxruntime opens the graph.

The exact property: a graph with its weights stored in float16 computes, bit for bit, what the
float32 graph computes with each of those weights rounded to float16, since onnxruntime folds
the casts and then runs the same float32 kernels. Everything else follows from it: artifacts
export, load, serve on the CPU and are allowed on CUDA, and take about half the bytes.
"""

import functools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_export import export, make_transformer
from test_quantize import exported_pairs

import serving
from serving.sessions import resolve_device, session_options
from skattn.core.text import EOS
from skattn.float16_weights import FLOAT16_SUFFIX, MIN_ELEMENTS, float16_weights, halvable
from skattn.onnx_graph import subgraphs
from skattn.quantize import main, quantize_artifact, quantize_model

OPSET = 17
GRAPHS = ("encoder.onnx", "decoder_step.onnx", "decode.onnx")
THREE, TRUE = np.array(3), np.array(True)


def session(model: onnx.ModelProto, optimized: str | None = None) -> ort.InferenceSession:
    options = session_options(1)  # the runtime's: every optimization, so the casts fold
    if optimized:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def rounded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in float32 with its weights rounded to float16, chosen here on their own (every
    halvable initializer but the main graph's inputs and outputs, for models with no shadowed
    names), and checked to be the ones float16_weights halves."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    interface = {v.name for v in (*model.graph.input, *model.graph.output)}
    chosen = []
    for graph in subgraphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_type != TensorProto.FLOAT or tensor.name in interface:
                continue
            weight = numpy_helper.to_array(tensor)
            if halvable(weight):
                as_half = weight.astype(np.float16).astype(np.float32)
                tensor.CopyFrom(numpy_helper.from_array(as_half, tensor.name))
                chosen.append(tensor.name + FLOAT16_SUFFIX)
    assert sorted(chosen) == sorted(float16_initializers(float16_weights(model)))
    return model


def float32_weights(model: onnx.ModelProto) -> list[str]:
    """The float32 initializers of at least MIN_ELEMENTS elements: none once every weight is
    halved (those of these models are all finite and in range)."""
    return [
        t.name
        for g in subgraphs(model.graph)
        for t in g.initializer
        if t.data_type == TensorProto.FLOAT and numpy_helper.to_array(t).size >= MIN_ELEMENTS
    ]


def float16_initializers(model: onnx.ModelProto) -> list[str]:
    return [
        t.name
        for g in subgraphs(model.graph)
        for t in g.initializer
        if t.data_type == TensorProto.FLOAT16
    ]


# ---------------------------------------------------------------- which weights


@pytest.mark.parametrize(
    "weight, expected",
    [
        (np.full((16, 16), 0.5, np.float32), True),
        (np.full((16, 16), -65504.0, np.float32), True),  # float16's largest
        (np.full((MIN_ELEMENTS - 1,), 0.5, np.float32), False),  # too small to matter
        (np.full((16, 16), 0.5, np.float64), False),  # only float32 weights
        (np.full((16, 16), 7e4, np.float32), False),  # beyond float16's range
        (np.r_[np.full(255, 0.5), -np.inf].astype(np.float32), False),  # a mask
        (np.r_[np.full(255, 0.5), np.nan].astype(np.float32), False),
        (np.r_[np.full(255, 0.5), 1e-9, 1e-7].astype(np.float32), True),  # 3e-8 at most lost
        (np.full((16, 16), 1e-5, np.float32), False),  # all below float16's normal range
        (np.zeros((16, 16), np.float32), True),
    ],
)
def test_a_weight_is_halved_only_where_float16_merely_rounds_it(weight, expected):
    assert halvable(weight) is expected


def loop_model() -> onnx.ModelProto:
    """``y = x W`` in the main graph, then ``Loop`` 3 times ``h = tanh(h V)`` with ``V`` the
    body's own weight and ``U`` (outer scope) added; ``bias`` is small; ``W`` is also read
    after the loop, and ``S`` is a graph input with a default (a weight one may feed)."""
    rng = np.random.default_rng(0)
    weights = {
        name: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("W", (32, 32)), ("U", (32,) * 2), ("S", (32, 32)), ("bias", (32,)))
    }
    V = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, "V")
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "V"], ["hv"]),
            helper.make_node("MatMul", ["h_in", "U"], ["hu"]),
            helper.make_node("Add", ["hv", "hu"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["B", 32]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["B", 32]),
        ],
        [V],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("MatMul", ["xw", "S"], ["xs"]),
            helper.make_node("Add", ["xs", "bias"], ["h0"]),
            helper.make_node("Constant", [], ["trips"], value=numpy_helper.from_array(THREE)),
            helper.make_node("Constant", [], ["yes"], value=numpy_helper.from_array(TRUE)),
            helper.make_node("Loop", ["trips", "yes", "h0"], ["h"], body=body),
            helper.make_node("MatMul", ["h", "W"], ["y"]),
        ],
        "main",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 32]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, [32, 32]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 32])],
        list(weights.values()),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_weights_in_the_graph_and_in_a_body_compute_exactly_their_rounded_values(tmp_path):
    model = loop_model()
    halved = float16_weights(model)
    onnx.checker.check_model(halved)
    assert sorted(float16_initializers(halved)) == [f"{n}{FLOAT16_SUFFIX}" for n in "UVW"]
    assert float16_initializers(model) == []  # the model given is left as it was
    feeds = {"x": np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)}
    got = session(halved, str(tmp_path / "optimized.onnx")).run(None, feeds)[0]
    np.testing.assert_array_equal(got, session(rounded(model)).run(None, feeds)[0])
    assert not np.array_equal(got, session(model).run(None, feeds)[0])  # the rounding shows
    # onnxruntime folded every cast: the session multiplies by float32 weights, as before
    optimized = onnx.load(tmp_path / "optimized.onnx")
    casts = [n for g in subgraphs(optimized.graph) for n in g.node if n.op_type == "Cast"]
    assert casts == [] and float16_initializers(optimized) == []


def test_graph_inputs_and_a_taken_name_keep_their_float32_weights():
    model = loop_model()
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "U.float16"))
    halved = float16_weights(model)
    kept = {t.name for t in halved.graph.initializer if t.data_type == TensorProto.FLOAT}
    assert {"S", "U", "bias"} <= kept  # an input with a default, a taken name, a small one
    assert sorted(float16_initializers(halved)) == ["V.float16", "W.float16"]
    with pytest.raises(ValueError, match="model must be an onnx.ModelProto"):
        float16_weights("model.onnx")


def shadowing_model(outer: np.ndarray, inner: np.ndarray) -> onnx.ModelProto:
    """``y = x W`` in both branches of an ``If``; the main graph holds ``W = outer``, the
    ``then`` branch an initializer of the same name, ``inner``."""
    value = functools.partial(helper.make_tensor_value_info, elem_type=TensorProto.FLOAT)
    branch = {
        name: helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], [name])],
            name,
            [],
            [value(name, shape=[2, 16])],
            [numpy_helper.from_array(inner, "W")] if name == "then" else [],
        )
        for name in ("then", "else")
    }
    node = helper.make_node(
        "If", ["c"], ["y"], then_branch=branch["then"], else_branch=branch["else"]
    )
    graph = helper.make_graph(
        [node],
        "main",
        [value("x", shape=[2, 16]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [value("y", shape=[2, 16])],
        [numpy_helper.from_array(outer, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_a_body_weight_that_shadows_an_outer_name_stays_float32():
    """A cast in the ``then`` branch would write ``W`` a second time, which ONNX refuses: the
    branch's ``W`` stays float32 and the outer one is halved; each branch computes what it
    computed with the outer ``W`` rounded (whichever ``W`` onnxruntime reads there)."""
    rng = np.random.default_rng(0)
    outer, inner = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    halved = float16_weights(shadowing_model(outer, inner))
    onnx.checker.check_model(halved, full_check=True)
    assert float16_initializers(halved) == ["W.float16"]  # the outer one
    reference = shadowing_model(outer.astype(np.float16).astype(np.float32), inner)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_array_equal(
            session(halved).run(None, feeds)[0], session(reference).run(None, feeds)[0]
        )


# ---------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def float16_artifacts(fitted_reversal, tmp_path_factory):
    """The fitted reversal model exported as float32 and with float16 weights, greedy and
    beam 3."""
    return exported_pairs(fitted_reversal, tmp_path_factory.mktemp("float16"), "float16")


def graph_bytes(directory) -> int:
    return sum((directory / name).stat().st_size for name in GRAPHS)


def sources(directory, B: int = 6, T: int = 9) -> dict[str, np.ndarray]:
    """``src`` and ``src_lengths`` of ids from the artifact's vocabulary, lengths 1 to T."""
    vocabulary = json.loads((directory / "manifest.json").read_text())["source_vocabulary"]
    rng = np.random.default_rng(0)
    lengths = np.r_[T, rng.integers(1, T + 1, size=B - 2), 1]
    src = np.zeros((B, T), dtype=np.int64)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = rng.integers(4, len(vocabulary), size=length - 1)
        src[row, length - 1] = EOS
    return {"src": src, "src_lengths": lengths.astype(np.int64)}


def assert_computes_rounded(floats, half, feeds, max_length: int, temperature: float) -> None:
    """``half``'s encoder and decode.onnx (which inlines the decoder step) give, bit for bit,
    ``floats``' outputs with its weights rounded; no weight of ``half``'s graphs is float32."""
    search = {"max_length": np.array(max_length), "temperature": np.array(temperature, np.float32)}
    for name, graph_feeds in (("encoder.onnx", feeds), ("decode.onnx", feeds | search)):
        want = session(rounded(onnx.load(floats / name))).run(None, graph_feeds)
        got = session(onnx.load(half / name)).run(None, graph_feeds)
        for actual, expected in zip(got, want, strict=True):
            np.testing.assert_array_equal(actual, expected, err_msg=name)
    for name in GRAPHS:
        assert float32_weights(onnx.load(half / name)) == [], name


@pytest.mark.parametrize("beam", [1, 3])
def test_a_float16_artifact_computes_the_rounded_float_graphs_exactly(float16_artifacts, beam):
    """The encoder, and decode.onnx, which inlines it and the decoder step in its loops."""
    floats, half = float16_artifacts[beam]
    assert_computes_rounded(floats, half, sources(floats), max_length=12, temperature=0.7)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_float16_artifact_serves_close_to_the_float_one_in_half_the_bytes(
    float16_artifacts, reversal_data, beam
):
    _, _, X_test, _ = reversal_data
    floats, half = float16_artifacts[beam]
    assert graph_bytes(half) <= 0.6 * graph_bytes(floats)
    runtime = serving.load(half, "cpu")
    assert runtime.manifest.quantization == "float16" and runtime.decode_graph
    answers, maps = runtime.predict_batch(X_test, None, True)
    want_answers, want_maps = serving.load(floats, "cpu").predict_batch(X_test, None, True)
    same = [a == w for a, w in zip(answers, want_answers, strict=True)]
    assert np.mean(same) >= 0.98, np.mean(same)
    for weights, want, agree in zip(maps, want_maps, same, strict=True):
        if agree:
            np.testing.assert_allclose(weights, want, rtol=0, atol=5e-3)
    # the step graphs hold the same float16 weights: the NumPy search gives the same answers
    steps = serving.load(half, "cpu", decode_graph=False).predict_batch(X_test, None, True)
    assert steps[0] == answers
    for weights, want in zip(steps[1], maps, strict=True):
        np.testing.assert_allclose(weights, want, rtol=0, atol=1e-5)


def test_quantize_artifact_and_its_command_write_export_s_float16_graphs(
    float16_artifacts, tmp_path, capsys
):
    floats, exported = float16_artifacts[3]
    copied = quantize_artifact(floats, tmp_path / "copy", "float16")
    main([str(floats), str(tmp_path / "cli"), "--quantization", "float16"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    files = json.loads((exported / "manifest.json").read_text())["files"]
    for directory in (copied, tmp_path / "cli"):
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["quantization"] == "float16"
        assert manifest["files"] == files  # the very same bytes as the export's
    with pytest.raises(ValueError, match=r"already quantized \(float16\)"):
        quantize_artifact(exported, tmp_path / "again", "int8")


def test_quantize_model_dispatches_float16_and_ignores_ranges():
    model = loop_model()
    halved = quantize_model(model, {"never": 1.0}, "float16")
    assert halved.SerializeToString() == float16_weights(model).SerializeToString()


def test_float16_artifacts_may_run_on_cuda(monkeypatch):
    assert resolve_device("cpu", "float16") == ("cpu", 0)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: providers)
    assert resolve_device("auto", "float16") == ("cuda", 0)
    assert resolve_device("cuda:1", "float16") == ("cuda", 1)
    assert resolve_device("auto", "int8") == ("cpu", 0)  # int8 still the CPU's


def test_a_float16_transformer_computes_its_rounded_float_graphs_exactly(tmp_path):
    module = make_transformer()
    floats = export(module, tmp_path / "float")
    half = export(module, tmp_path / "half", quantize="float16")
    assert_computes_rounded(floats, half, sources(floats, T=7), max_length=10, temperature=1.0)
    assert float32_weights(onnx.load(half / "attention.onnx")) == []
    assert serving.load(half, "cpu").manifest.quantization == "float16"
