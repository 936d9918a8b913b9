"""The Transformer families through the estimator, the artifact and the runtime (issue 18).

Every combination the estimator offers over a Transformer encoder (Bahdanau and Luong with
several scorers, the Transformer decoder) is trained for a few dozen steps on string reversal:
parity needs models whose outputs vary with the input, not good ones. The test sources include
the empty string, characters never seen in training and lengths more than twice the longest
training source (and targets as long), so sinusoidal positions and the key-value cache run past
anything seen in training. Module-level properties (causality, padding, grouped-query heads)
are in ``tests/test_transformer.py``.
"""

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_runtime import reversal_pairs

import serving
from skattn import Seq2Seq
from skattn.core.manifest import MANIFEST_FILE

X_TRAIN, Y_TRAIN = reversal_pairs(64, seed=0, min_length=1, max_length=6)
_sources, _ = reversal_pairs(160, seed=1, min_length=0, max_length=15)
SOURCES = [s + "zé" if i % 5 == 0 else s for i, s in enumerate(_sources)]

FIT_PARAMS = dict(
    hidden_size=16,
    num_heads=2,
    batch_size=16,
    max_steps=60,
    learning_rate=0.01,
    early_stopping=False,
    max_output_length=16,  # longer than any training target (6)
    device="cpu",
    random_state=0,
)
TRANSFORMER = dict(encoder="transformer", decoder="transformer")

KINDS = [
    dict(TRANSFORMER, num_layers=2, num_kv_heads=1),
    dict(encoder="transformer", decoder="luong", input_feeding=False, scorer="general"),
    dict(encoder="transformer", decoder="bahdanau", scorer="additive", positions="learned"),
    dict(encoder="transformer", decoder="luong", attention="local-m", scorer="dot", cell="lstm"),
    dict(TRANSFORMER, positions="none", ffn_size=24),
]


def kind_id(kind: dict) -> str:
    return "-".join(str(v) for v in kind.values())


def fit(**params) -> Seq2Seq:
    return Seq2Seq(**{**FIT_PARAMS, **params}).fit(X_TRAIN, Y_TRAIN)


def load(directory, **options):
    return serving.load(directory, **{"device": "cpu", "intra_op_num_threads": 1, **options})


def assert_same_attention(expected: list, actual: list) -> None:
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def fitted() -> Seq2Seq:
    return fit(**KINDS[0])


@pytest.fixture(scope="module")
def artifact(fitted, tmp_path_factory):
    return fitted.export_onnx(tmp_path_factory.mktemp("artifact") / "transformer")


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("params", "name", "why"),
    [
        (dict(decoder="transformer"), "decoder", "needs encoder='transformer'"),
        (dict(TRANSFORMER, attention="none"), "attention", "always attends"),
        (dict(TRANSFORMER, attention="local-p"), "attention", "always attends"),
        (dict(TRANSFORMER, window=3), "window", "always attends"),
        (dict(TRANSFORMER, scorer="dot"), "scorer", "scaled dot products"),
        (dict(TRANSFORMER, cell="lstm"), "cell", "no RNN runs"),
        (dict(TRANSFORMER, embedding_dim=32), "embedding_dim", "no RNN runs"),
        (dict(num_kv_heads=1), "num_kv_heads", "only the Transformer blocks"),
        # not "must divide num_heads": the field does not apply at all
        (dict(num_kv_heads=2), "num_kv_heads", "only the Transformer blocks"),
        (dict(decoder="transformer", num_heads=3), "decoder", "needs encoder='transformer'"),
        (dict(ffn_size=64), "ffn_size", "only the Transformer blocks"),
        (dict(positions="none"), "positions", "only the Transformer blocks"),
        (dict(TRANSFORMER, num_heads=4, num_kv_heads=3), "num_kv_heads", "must divide"),
        (dict(encoder="transformer", num_heads=3), "num_heads", "must divide hidden_size"),
    ],
)
def test_a_value_set_on_purpose_that_makes_no_sense_is_refused_saying_why(params, name, why):
    model = Seq2Seq(**{**FIT_PARAMS, **params})
    with pytest.raises(ValueError, match=name) as error:
        model.fit(["12", "34"], ["21", "43"])
    assert why in str(error.value)


def test_defaults_that_do_not_apply_still_work():
    model = Seq2Seq(**{**FIT_PARAMS, **TRANSFORMER, "max_steps": 1})
    assert model.input_feeding is True and model.scorer == "additive"  # the defaults
    config = model.fit(X_TRAIN, Y_TRAIN).module_.config
    # stored as what the model computes, and the estimator's own parameters are unchanged
    assert (config.scorer, config.input_feeding) == ("scaled_dot", False)
    assert model.get_params()["input_feeding"] is True
    explicit = Seq2Seq(**{**FIT_PARAMS, **TRANSFORMER, "max_steps": 1, "scorer": "scaled_dot"})
    assert explicit.fit(X_TRAIN, Y_TRAIN).module_.config == config


def test_every_family_parameter_reaches_the_module(fitted):
    config = fitted.module_.config
    assert (config.encoder, config.decoder) == ("transformer", "transformer")
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (2, 2, 1)
    assert fitted.module_.state_names == ("self_keys", "self_values")
    blocks = fitted.module_.decoder.blocks
    assert len(blocks) == 2 and blocks[0].self_attn.kv_dim == 8  # 1 kv head of 16 / 2 units
    assert blocks[0].ffn[0].out_features == 4 * 16  # ffn_size=None


# ---------------------------------------------------------------- export and runtime parity


def test_the_transformer_predicts_and_attends_in_the_runtime_as_in_the_estimator(fitted, artifact):
    runtime = load(artifact)
    expected = fitted.predict(SOURCES)
    assert len(set(expected)) > 20, "the model must not be degenerate for parity to mean much"
    assert runtime.predict(SOURCES) == expected
    assert_same_attention(fitted.predict_attention(SOURCES), runtime.predict_attention(SOURCES))


@pytest.mark.parametrize(
    "kind",
    [
        kind if i == 0 else pytest.param(kind, marks=pytest.mark.slow)
        for i, kind in enumerate(KINDS[1:])
    ],
    ids=kind_id,
)
def test_every_combination_predicts_and_attends_in_the_runtime_as_in_the_estimator(kind, tmp_path):
    estimator = fit(**kind)
    runtime = load(estimator.export_onnx(tmp_path / "model"))
    expected = estimator.predict(SOURCES)
    assert len(set(expected)) > 20, "the model must not be degenerate for parity to mean much"
    assert runtime.predict(SOURCES) == expected
    assert_same_attention(estimator.predict_attention(SOURCES), runtime.predict_attention(SOURCES))


def test_beam_search_reorders_the_cache_like_the_estimator(fitted, tmp_path):
    estimator = copy.deepcopy(fitted).set_params(beam_size=3, length_penalty=0.7)
    sources = SOURCES[:60]
    expected = estimator.predict(sources)
    assert expected != fitted.predict(sources)  # the beam finds other outputs than greedy
    directory = estimator.export_onnx(tmp_path / "model")
    for runtime in (load(directory), load(directory, io_binding=True)):
        assert runtime.predict(sources) == expected
        assert_same_attention(
            estimator.predict_attention(sources), runtime.predict_attention(sources)
        )


@pytest.mark.parametrize("max_batch_size", [1, 7, 64])
def test_batch_sizes_and_io_binding_give_the_estimator_results(fitted, artifact, max_batch_size):
    expected = fitted.predict_attention(SOURCES)
    for io_binding in (False, True):
        runtime = load(artifact, max_batch_size=max_batch_size, io_binding=io_binding)
        assert_same_attention(expected, runtime.predict_attention(SOURCES))
        assert runtime.predict(SOURCES) == fitted.predict(SOURCES)


def test_batch_composition_never_changes_a_prediction(fitted):
    sources = SOURCES[:40]
    together = fitted.predict(sources)
    assert together == [fitted.predict([s])[0] for s in sources]
    assert fitted.predict(sources[::-1])[::-1] == together


def test_outputs_longer_than_any_training_target_are_decoded(fitted):
    longest = max(len(p) for p in fitted.predict(SOURCES))
    assert longest > max(map(len, Y_TRAIN))  # the cache and positions ran past training


def test_attention_maps_are_the_cross_attention_rows_that_sum_to_one(fitted):
    for source, prediction, weights in zip(
        SOURCES, fitted.predict(SOURCES), fitted.predict_attention(SOURCES), strict=True
    ):
        assert weights.shape == (len(prediction), len(source) + 1)
        if len(prediction):
            np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)


def test_the_manifest_names_the_families_and_the_cache(artifact):
    manifest = json.loads((artifact / MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["decoder"] == "transformer" and manifest["scorer"] == "scaled_dot"
    assert manifest["state_names"] == ["self_keys", "self_values"]
    assert manifest["model"]["encoder"] == "transformer"
    assert manifest["model"]["num_kv_heads"] == 1


def test_pickle_round_trip_keeps_predictions(fitted):
    restored = pickle.loads(pickle.dumps(fitted))
    assert restored.predict(SOURCES[:30]) == fitted.predict(SOURCES[:30])


# ---------------------------------------------------------------- the example and the benchmark


def run_quick(script: str) -> str:
    """``python <script> --quick`` from the repository root, one intra-op thread; its stdout."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(root / script), "--quick"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow
def test_transformer_tasks_quick_trains_every_run():
    rows = [line for line in run_quick("examples/transformer_tasks.py").splitlines() if "|" in line]
    runs = [row.split("|")[1].strip() for row in rows[2:]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import transformer_tasks

    assert runs == list(transformer_tasks.RUNS)  # every family on both tasks, in order
    assert len(runs) == 2 * len(transformer_tasks.FAMILIES)


@pytest.mark.slow
def test_bench_transformer_quick_prints_every_comparison():
    out = run_quick("benchmarks/bench_transformer.py")
    for section in ("## 1.", "## 2.", "## 3.", "## 4.", "Transformer / bi-GRU:"):
        assert section in out
    assert out.count("x |") >= 4 + 2 + 2  # speed-up ratios of sections 2, 3 and 4
    assert "| the same with LSTM cells |" in out
