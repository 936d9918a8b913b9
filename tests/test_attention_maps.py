"""Per-layer and per-head attention maps of the Transformer decoder (issue 18, item 3).

Through the module (the teacher-forced pass equals the cached steps), the estimator
(``predict_attention(X, layer, head)``), the artifact's ``attention.onnx`` and the runtime, and
the server's ``parameters.attention_layer`` / ``attention_head``. The model is a tiny
Transformer (2 layers, 4 query heads over 2 key / value heads) trained for a few dozen steps:
the maps need to vary with the input, not to be good. Sources run past the longest training
one (6), so positions and the cache go past anything seen in training.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from test_runtime import reversal_pairs
from test_server import MODEL, infer_body

import serving
from skattn import Seq2Seq
from skattn.core import attention_maps
from skattn.core.attention_maps import check_selection
from skattn.core.manifest import ATTENTION_FILE, MANIFEST_FILE
from skattn.core.text import pad_batch

X_TRAIN, Y_TRAIN = reversal_pairs(64, seed=0, min_length=1, max_length=6)
_sources, _ = reversal_pairs(40, seed=1, min_length=0, max_length=15)
SOURCES = [s + "zé" if i % 7 == 0 else s for i, s in enumerate(_sources)]
LAYERS, HEADS = 2, 4
PARAMS = dict(
    encoder="transformer",
    decoder="transformer",
    hidden_size=16,
    num_layers=LAYERS,
    num_heads=HEADS,
    num_kv_heads=2,
    batch_size=16,
    max_steps=30,
    learning_rate=0.01,
    early_stopping=False,
    max_output_length=16,
    device="cpu",
    random_state=0,
)


@pytest.fixture(scope="module")
def fitted() -> Seq2Seq:
    return Seq2Seq(**PARAMS).fit(X_TRAIN, Y_TRAIN)


@pytest.fixture(scope="module")
def artifact(fitted, tmp_path_factory):
    return fitted.export_onnx(tmp_path_factory.mktemp("maps") / "transformer")


def load(directory, **options):
    return serving.load(directory, **{"device": "cpu", "intra_op_num_threads": 1, **options})


def assert_maps_equal(expected, actual, atol=1e-4):
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=atol)


# -- the module: one teacher-forced pass is the cached steps -----------------------------------


def test_the_teacher_forced_pass_equals_every_layer_and_head_of_the_cached_steps(fitted):
    """Step by step through the key-value cache (one position at a time, every layer's weights)
    against the pass over all positions with the causal mask: two code paths, one answer."""
    model = fitted.module_
    src, src_lengths = pad_batch([[5, 6, 7, 2], [8, 2], [9, 4, 5, 6, 7, 8, 2]])
    src, src_lengths = torch.from_numpy(src), torch.from_numpy(src_lengths)
    tokens = torch.tensor([[4, 5, 6, 7, 8], [6, 4, 0, 0, 0], [7, 7, 5, 4, 9]])  # (3, 5)
    temperature = torch.tensor(0.7)
    with torch.no_grad():
        passed = model.cross_attention(src, src_lengths, tokens, temperature)  # (B, L, H, 5, T)
        memory, keys, mask, state = model.encode(src, src_lengths)
        cache = state  # the same cache, grown by the every-layer path
        y = torch.ones(3, dtype=torch.int64)  # BOS
        for i in range(tokens.shape[1]):
            position = torch.tensor(i)
            _, cache, weights = model.decoder._decode(
                y[:, None], cache, position, None, keys, mask, temperature, every_layer=True
            )  # weights (B, L, H, 1, T)
            _, state, mean = model.step(y, state, memory, keys, mask, temperature, position)
            np.testing.assert_allclose(weights[:, :, :, 0], passed[:, :, :, i], atol=1e-6)
            np.testing.assert_allclose(mean, passed[:, -1, :, i].mean(dim=1), atol=1e-6)
            y = tokens[:, i]
    assert passed.shape == (3, LAYERS, HEADS, 5, 7)
    np.testing.assert_allclose(passed.sum(-1), 1.0, atol=1e-5)
    assert not passed[1, ..., 2:].any() and not passed[0, ..., 4:].any()  # 0 on padding


# -- the estimator ---------------------------------------------------------------------------


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_mean_over_heads_of_the_last_layer_is_the_default_map(fitted, beam_size):
    model = Seq2Seq(**PARAMS).set_params(beam_size=beam_size, temperature=0.7)
    model.__dict__.update({k: v for k, v in fitted.__dict__.items() if k.endswith("_")})
    default = model.predict_attention(SOURCES)
    assert_maps_equal(default, model.predict_attention(SOURCES, layer=-1), atol=1e-6)
    assert_maps_equal(default, model.predict_attention(SOURCES, layer=1, head=None), atol=1e-6)
    every_head = model.predict_attention(SOURCES, layer=-1, head="all")  # (H, T_y, T_x) each
    assert_maps_equal(default, [m.mean(axis=0) for m in every_head], atol=1e-6)


def test_per_head_maps_are_distributions_over_the_source_and_all_keeps_axes(fitted):
    maps = fitted.predict_attention(SOURCES, layer="all", head="all")
    predictions = fitted.predict(SOURCES)
    assert any(m.shape[2] > 7 for m in maps)  # outputs longer than any training target
    for source, prediction, m in zip(SOURCES, predictions, maps, strict=True):
        assert m.shape == (LAYERS, HEADS, len(prediction), len(source) + 1)
        np.testing.assert_allclose(m.sum(axis=-1), 1.0, atol=1e-5)
        assert (m >= 0).all()
    heads = np.concatenate([m.reshape(LAYERS * HEADS, -1) for m in maps if m.size], axis=1)
    assert not np.allclose(heads, heads[:1])  # the heads attend differently
    one = fitted.predict_attention(SOURCES, layer=0, head=3)
    assert_maps_equal([m[0, 3] for m in maps], one, atol=1e-6)
    layers = fitted.predict_attention(SOURCES, layer="all")  # (L, T_y, T_x): mean over heads
    assert_maps_equal([m.mean(axis=1) for m in maps], layers, atol=1e-6)


def test_an_items_maps_do_not_depend_on_its_batch_or_pass_chunk(fitted, monkeypatch):
    batched = fitted.predict_attention(SOURCES, layer=0, head=1)
    alone = [fitted.predict_attention([s], layer=0, head=1)[0] for s in SOURCES[:8]]
    assert_maps_equal(batched[:8], alone, atol=1e-5)
    monkeypatch.setattr(attention_maps, "MAX_PASS_ELEMENTS", 2000)  # passes of a few items
    assert_maps_equal(batched, fitted.predict_attention(SOURCES, layer=0, head=1), atol=1e-5)


@pytest.mark.parametrize(
    ("selection", "name", "why"),
    [
        (dict(layer=2), "layer", "out of range"),
        (dict(layer=-3), "layer", "out of range"),
        (dict(head=4), "head", "out of range"),
        (dict(layer=0, head=1.0), "head", "must be an int"),
        (dict(layer=True), "layer", "must be an int"),
        (dict(head="mean"), "head", "must be an int"),
    ],
)
def test_a_layer_or_head_the_model_lacks_is_a_value_error_naming_it(fitted, selection, name, why):
    with pytest.raises(ValueError, match=f"^{name}.*{why}"):
        fitted.predict_attention(["12"], **selection)


def test_rnn_models_keep_their_maps_and_refuse_layers_and_heads(fitted_reversal):
    assert fitted_reversal.predict_attention(["123"])[0].shape == (3, 4)
    for selection, name in ((dict(layer=0), "layer"), (dict(head=0), "head")):
        with pytest.raises(ValueError, match=f"^{name}: .*Transformer decoder.*'bahdanau'"):
            fitted_reversal.predict_attention(["123"], **selection)


def test_check_selection_resolves_negative_indices_and_the_server_form_refuses_all():
    selection = check_selection(-1, -4, 2, 4)
    assert (selection.layer, selection.head) == (1, 0)
    assert check_selection(None, None, 2, 4) is None
    assert check_selection(None, 2, 2, 4).layer == 1  # no layer: the last
    names = ("parameters.attention_layer", "parameters.attention_head")
    with pytest.raises(ValueError, match="^parameters.attention_head must be an integer"):
        check_selection(0, "all", 2, 4, names=names, allow_all=False)


# -- the artifact and the runtime --------------------------------------------------------------


def test_the_artifact_holds_attention_onnx_and_the_runtime_reports_its_axes(artifact):
    manifest = json.loads((artifact / MANIFEST_FILE).read_text())
    assert ATTENTION_FILE in manifest["files"]
    info = load(artifact).info
    assert (info.attention_layers, info.attention_heads) == (LAYERS, HEADS)


@pytest.mark.parametrize(
    "options",
    [
        dict(max_batch_size=1),
        dict(max_batch_size=7, decode_graph=False),
        dict(max_batch_size=256),
        dict(max_batch_size=256, decode_graph=False, io_binding=True),
    ],
    ids=["graph-1", "steps-7", "graph-256", "io-binding-256"],
)
def test_runtime_maps_equal_the_estimators(fitted, artifact, options):
    runtime = load(artifact, **options)
    for layer, head in ((0, 2), (-1, None), ("all", "all")):
        expected = fitted.predict_attention(SOURCES, layer=layer, head=head)
        assert_maps_equal(expected, runtime.predict_attention(SOURCES, layer=layer, head=head))
    assert runtime.predict(SOURCES) == fitted.predict(SOURCES)


def test_runtime_maps_follow_the_temperature_and_the_beam(fitted, artifact, tmp_path):
    model = Seq2Seq(**PARAMS).set_params(beam_size=3, temperature=0.5)
    model.__dict__.update({k: v for k, v in fitted.__dict__.items() if k.endswith("_")})
    runtime = load(model.export_onnx(tmp_path / "beam"))
    expected = model.predict_attention(SOURCES, layer=0, head=0)
    assert_maps_equal(expected, runtime.predict_attention(SOURCES, layer=0, head=0))
    hot = fitted.predict_attention(SOURCES[:5], layer=0, head=0)
    assert_maps_equal(hot, load(artifact).predict_attention(SOURCES[:5], 1.0, layer=0, head=0))


def old_artifact(artifact, tmp_path):
    """The artifact as an exporter without ``attention.onnx`` wrote it."""
    old = shutil.copytree(artifact, tmp_path / "old")
    (old / ATTENTION_FILE).unlink()
    manifest = json.loads((old / MANIFEST_FILE).read_text())
    del manifest["files"][ATTENTION_FILE]
    (old / MANIFEST_FILE).write_text(json.dumps(manifest))
    return old


def test_an_artifact_without_attention_onnx_loads_and_refuses_layers(artifact, tmp_path):
    runtime = load(old_artifact(artifact, tmp_path))
    assert runtime.info.attention_layers == 0
    assert_maps_equal(load(artifact).predict_attention(SOURCES), runtime.predict_attention(SOURCES))
    with pytest.raises(ValueError, match="^layer: .*no attention.onnx.*re-export"):
        runtime.predict_attention(SOURCES, layer=0)


def test_rnn_artifacts_have_no_attention_graph_even_over_a_transformer_one(
    fitted_reversal, artifact, tmp_path
):
    directory = shutil.copytree(artifact, tmp_path / "reused")
    fitted_reversal.export_onnx(directory)  # a previous artifact's attention.onnx goes
    assert not (directory / ATTENTION_FILE).exists()
    assert load(directory).info.attention_layers == 0


# -- the server ------------------------------------------------------------------------------


def post(server, sources, **parameters):
    outputs = [{"name": n} for n in ("prediction", "attention", "attention_lengths")]
    body = infer_body(sources, outputs=outputs, parameters=parameters)
    return httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=body, timeout=30)


def served_maps(response):
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    attention = np.array(outputs["attention"]["data"]).reshape(outputs["attention"]["shape"])
    lengths = np.array(outputs["attention_lengths"]["data"]).reshape(-1, 2)
    return [attention[i, :t_y, :t_x] for i, (t_y, t_x) in enumerate(lengths)]


def test_the_server_answers_a_layers_head_and_refuses_what_the_model_lacks(artifact, serve):
    runtime = load(artifact)
    server = serve(runtime)
    sources = SOURCES[:12]
    response = post(server, sources, attention_layer=0, attention_head=3)
    assert response.status_code == 200, response.text
    assert_maps_equal(runtime.predict_attention(sources, layer=0, head=3), served_maps(response))
    default = served_maps(post(server, sources, attention_layer=-1))  # the mean over heads
    assert_maps_equal(runtime.predict_attention(sources), default)
    listing = httpx.get(f"{server.url}/v2/models").json()[0]
    assert (listing["attention_layers"], listing["attention_heads"]) == (LAYERS, HEADS)
    for parameters, message in [
        (dict(attention_layer=2), "parameters.attention_layer=2 is out of range"),
        (dict(attention_head=-5), "parameters.attention_head=-5 is out of range"),
        (dict(attention_head="all"), "parameters.attention_head must be an integer"),
        (dict(attention_layer=True), "parameters.attention_layer must be an integer"),
    ]:
        response = post(server, sources, **parameters)
        assert response.status_code == 400 and response.json()["error"].startswith(message)


def test_the_server_refuses_layers_for_rnn_models_and_old_artifacts(artifact, tmp_path, serve):
    server = serve()  # the test double: a Bahdanau model
    response = post(server, ["abc"], attention_head=0)
    assert response.status_code == 400
    assert response.json()["error"].startswith("parameters.attention_head: per-layer")
    assert post(server, ["abc"]).status_code == 200
    server = serve(load(old_artifact(artifact, tmp_path)))
    response = post(server, ["12"], attention_layer=0)
    assert response.status_code == 400 and "re-export" in response.json()["error"]


def test_items_asking_for_other_maps_never_share_a_batch():
    from types import SimpleNamespace

    from serving.batch_policy import choose_batch

    items = [
        SimpleNamespace(source="ab", temperature=None, maps=maps, request=i, turn=i)
        for i, maps in enumerate([None, (0, 1), None, (0, 1), (1, None)])
    ]
    chosen, remaining = choose_batch(items, max_batch_size=8, max_batch_chars=100)
    assert chosen == [items[0], items[2]]
    chosen, _ = choose_batch(remaining, max_batch_size=8, max_batch_chars=100)
    assert chosen == [items[1], items[3]]


@pytest.mark.slow
def test_bench_attention_maps_quick_prints_both_comparisons():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_attention_maps.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    gap = float(done.stdout.split("max |difference| ")[1].split()[0])
    assert gap < 1e-4  # the runtime's maps are the estimator's
    rows = [line for line in done.stdout.splitlines() if line.endswith("x |")]
    assert len(rows) == 2 + 2 + 2  # two chunk sizes, two step batches, two beam sizes
