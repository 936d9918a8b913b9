"""RightToLeft: a model trained on reversed outputs that reads them in their usual order, and
NBestReranker's rescorers (a right-to-left model among them), on small reversal models."""

import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import NotFittedError
from test_rescoring import CLEAN, reversal_nbest
from test_runtime import FIT_PARAMS, X_TRAIN, Y_TRAIN, fit, load

from skattn import Seq2Seq
from skattn.rescoring import NBestReranker
from skattn.right_to_left import RightToLeft, reverse_outputs

SOURCES = CLEAN[:40]


@pytest.fixture(scope="module")
def r2l():
    return RightToLeft(Seq2Seq(**{**FIT_PARAMS, "max_steps": 40})).fit(X_TRAIN, Y_TRAIN)


def test_outputs_reverse_token_by_token_as_the_tokenizer_splits_them():
    assert reverse_outputs(["abc", ""], "char") == ["cba", ""]
    assert reverse_outputs(["K AE  T", "AH"], "space") == ["T AE K", "AH"]
    assert reverse_outputs([["K", "AE", "T"], ("B",)], "space") == [["T", "AE", "K"], ["B"]]
    words = ["K AE T", "B IY"]
    assert reverse_outputs(reverse_outputs(words, "space"), "space") == words
    assert reverse_outputs([], "char") == []
    with pytest.raises(ValueError, match=r"^y\[1\] must be a str or a list of str tokens, got 3"):
        reverse_outputs(["ab", 3], "char")
    with pytest.raises(ValueError, match="only str items or only token lists"):
        reverse_outputs(["ab", ["b", "a"]], "char")
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        reverse_outputs(["ab"], "words")


def test_the_model_trains_on_reversed_outputs_and_reads_them_back(r2l):
    """The inner model is the one a user would fit on reversed outputs (same weights, same
    answers); the wrapper's answers, scores and maps are its own, read the usual way round."""
    alone = Seq2Seq(**{**FIT_PARAMS, "max_steps": 40}).fit(X_TRAIN, [y[::-1] for y in Y_TRAIN])
    inner = r2l.estimator_.predict(SOURCES)
    assert inner == alone.predict(SOURCES)
    assert r2l.predict(SOURCES) == [p[::-1] for p in inner]
    assert r2l.estimator is not r2l.estimator_  # a clone was fitted
    targets = [s[::-1] for s in SOURCES]
    np.testing.assert_allclose(
        r2l.log_likelihood(SOURCES, targets), alone.log_likelihood(SOURCES, SOURCES), rtol=1e-6
    )
    maps, inner_maps = r2l.predict_attention(SOURCES), r2l.estimator_.predict_attention(SOURCES)
    for m, inner_m, answer in zip(maps, inner_maps, r2l.predict(SOURCES), strict=True):
        assert m.shape == inner_m.shape == (len(answer), inner_m.shape[1])
        np.testing.assert_array_equal(m, inner_m[::-1])
    own = np.mean([p == t for p, t in zip(r2l.predict(SOURCES), targets, strict=True)])
    assert r2l.score(SOURCES, targets) == pytest.approx(own)


def assert_same_scores(served, r2l, targets) -> None:
    """``log p(targets | SOURCES)`` of a served model as the in-memory wrapper's (float32
    graphs against torch)."""
    np.testing.assert_allclose(
        served.log_likelihood(SOURCES, targets),
        r2l.log_likelihood(SOURCES, targets),
        rtol=1e-5,
        atol=1e-4,
    )


def test_an_exported_right_to_left_model_is_wrapped_without_training(r2l, tmp_path):
    runtime = load(r2l.estimator_.export_onnx(tmp_path / "r2l"))
    served = RightToLeft.fitted(runtime)
    assert served.predict(SOURCES) == r2l.predict(SOURCES)
    targets = [s[::-1] for s in SOURCES]
    assert_same_scores(served, r2l, targets)
    assert served.score(SOURCES, targets) == r2l.score(SOURCES, targets)
    assert RightToLeft.fitted(r2l.estimator_).predict(SOURCES[:5]) == r2l.predict(SOURCES[:5])
    assert not hasattr(clone(served), "estimator_")


@pytest.fixture(scope="module")
def r2l_artifact(r2l, tmp_path_factory):
    return r2l.export_onnx(tmp_path_factory.mktemp("r2l") / "marked")


@pytest.mark.parametrize("decode_graph", [True, False])
def test_an_artifact_marked_right_to_left_serves_outputs_in_the_usual_order(
    r2l, r2l_artifact, decode_graph
):
    """``RightToLeft.export_onnx``: the manifest says ``right_to_left``, and the runtime's
    predictions, attention rows and scores are the wrapper's, with no wrapper."""
    runtime = load(r2l_artifact, decode_graph=decode_graph)
    assert runtime.manifest.output_order == "right_to_left"
    assert runtime.manifest.format_version == 3  # readers from before the key refuse it
    assert runtime.manifest.text_form()["output_order"] == "right_to_left"
    predictions, maps = runtime.predict_batch(SOURCES, with_attention=True)
    assert predictions == r2l.predict(SOURCES)
    for got, want in zip(maps, r2l.predict_attention(SOURCES), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert_same_scores(runtime, r2l, [s[::-1] for s in SOURCES])
    with pytest.raises(ValueError, match="reads its outputs in the usual order already"):
        RightToLeft.fitted(runtime)
    with pytest.raises(ValueError, match="cannot be exported right to left"):
        RightToLeft.fitted(r2l).export_onnx(r2l_artifact.parent / "nested")
    with pytest.raises(ValueError, match="whose artifact is already written"):
        RightToLeft.fitted(load(r2l.estimator_.export_onnx(r2l_artifact.parent / "w"))).export_onnx(
            r2l_artifact.parent / "again"
        )


def test_a_right_to_left_artifact_decodes_continuously_and_serves_in_the_usual_order(
    r2l, r2l_artifact
):
    """Continuous batching's running set, and the server's answers over HTTP."""
    import httpx
    from test_server import MODEL, RunningServer, infer_body

    from serving.app import ServerSettings
    from serving.running import RunningDecode

    runtime = load(r2l_artifact)
    running = RunningDecode(runtime, None)
    running.admit(list(range(len(SOURCES))), SOURCES)
    ended = {}
    while running.size:
        ended.update({key: (answer, rows) for key, answer, rows in running.step()})
    want_predictions, want_maps = runtime.predict_batch(SOURCES, with_attention=True)
    assert [ended[i][0] for i in range(len(SOURCES))] == want_predictions
    for i, want in enumerate(want_maps):
        np.testing.assert_allclose(ended[i][1], want, atol=1e-5)

    with RunningServer(runtime, ServerSettings()) as server:
        response = httpx.post(
            f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(SOURCES[:8]), timeout=30
        )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == r2l.predict(SOURCES[:8])


def test_a_host_with_only_numpy_and_onnxruntime_reads_the_order_from_the_manifest(
    r2l, r2l_artifact
):
    from test_decode_graph import run_client

    assert run_client(r2l_artifact, SOURCES)["predictions"] == r2l.predict(SOURCES)


def test_an_older_reader_refuses_a_right_to_left_artifact_rather_than_reverse_its_answers(
    r2l_artifact, tmp_path
):
    """The manifest is format 3 (readers from before it refuse a newer format), and the
    graphs' text form names the order, so a manifest that drops it is refused too, not served
    backwards."""
    import json
    import shutil

    from serving.artifact import ArtifactError

    copy = tmp_path / "edited"
    shutil.copytree(r2l_artifact, copy)
    data = json.loads((copy / "manifest.json").read_text())
    assert data.pop("output_order") == "right_to_left"
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="reads and writes text as"):
        load(copy)
    data["output_order"] = "upside_down"
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="'output_order' must be one of"):
        load(copy)
    data.update(output_order="right_to_left", format_version=2)
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="'right_to_left' needs format_version 3, got 2"):
        load(copy)


def test_bad_models_and_unfitted_use_are_refused():
    with pytest.raises(ValueError, match="model must be a fitted Seq2Seq or a serving.load"):
        RightToLeft.fitted("model")
    with pytest.raises(NotFittedError):
        RightToLeft(Seq2Seq()).predict(["ab"])
    with pytest.raises(ValueError, match="estimator must be an unfitted Seq2Seq"):
        RightToLeft(object()).fit(["ab"], ["ba"])


class Reverser(BaseEstimator):
    """A stand-in for a perfect model of reversal: its answer is right, and any other output
    scores 100 nats lower."""

    def __init__(self, tokenizer="char"):
        self.tokenizer = tokenizer
        self.output_kind_ = "str"

    def fit(self, X, y):
        return self

    def predict(self, X):
        return [x[::-1] for x in X]

    def log_likelihood(self, X, y):
        right = ["".join(out) == x[::-1] for x, out in zip(X, y, strict=True)]  # str or tokens
        return np.where(right, 0.0, -100.0)


def test_a_rescorer_that_knows_better_is_weighted_in_and_its_answer_is_a_candidate():
    weak = fit(max_steps=2)  # its answers are wrong
    # the sources whose reversal it can write (every target token in its vocabulary)
    writable = [s for s in CLEAN if np.isfinite(weak.log_likelihood([s], [s[::-1]])[0])]
    dev, test = writable[:60], writable[60:120]
    assert len(test) == 60
    assert np.mean([p == s[::-1] for p, s in zip(weak.predict(test), test, strict=True)]) < 0.5
    # the other system lists only wrong answers: the right one is the rescorer's own answer
    only_wrong = lambda sources: [[(s[::-1][1:] + "a", 0.0)] for s in sources]  # noqa: E731
    reranker = NBestReranker(weak, only_wrong, rescorers=[Reverser()], rescorer_weights=(0, 1))
    reranker.fit(dev, [s[::-1] for s in dev])
    assert reranker.rescorer_weights_ == (1.0,)
    assert reranker.fit_scores_[(reranker.weight_, reranker.length_exponent_, 1.0)] == 1.0
    assert reranker.predict(test) == [s[::-1] for s in test]
    # the same reranker without the rescorer's weight in its grid: the weak model decides
    left_out = NBestReranker(weak, only_wrong, rescorers=[Reverser()], rescorer_weights=(0,))
    assert left_out.fit(dev, [s[::-1] for s in dev]).rescorer_weights_ == (0.0,)
    assert left_out.score(test, [s[::-1] for s in test]) < 1.0


def test_a_right_to_left_rescorer_reranks_with_a_left_to_right_model(r2l):
    model = fit(max_steps=60)
    dev, test = CLEAN[30:90], CLEAN[90:150]
    references = [s[::-1] for s in dev]
    both = NBestReranker(model, reversal_nbest(0.0, 0.0), weights=(0.0,), rescorers=[r2l])
    both.fit(dev, references)
    assert set(both.fit_scores_) == {(0.0, e, v) for e in (0.0, 1.0) for v in both.rescorer_weights}
    alone = NBestReranker(model, reversal_nbest(0.0, 0.0), weights=(0.0,)).fit(dev, references)
    # the grid holds the estimator alone (v = 0): fitting with the rescorer never does worse
    assert max(both.fit_scores_.values()) >= max(alone.fit_scores_.values())
    assert len(both.predict(test)) == len(test)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rescorers": "r2l"}, "rescorers must be a sequence"),
        ({"rescorers": [object()]}, r"rescorers\[0\] must be a fitted Seq2Seq"),
        ({"rescorers": [Reverser("space")]}, r"rescorers\[0\] reads outputs as"),
        ({"rescorers": [Reverser()], "rescorer_weights": []}, "rescorer_weights"),
        ({"rescorers": [Reverser()], "rescorer_weights": [-1]}, "rescorer_weights"),
        ({"rescorers": [Reverser()], "rescorer_weights": [float("inf")]}, "rescorer_weights"),
    ],
)
def test_bad_rescorers_are_refused(kwargs, match):
    model = fit(max_steps=2)
    with pytest.raises(ValueError, match=match):
        NBestReranker(model, reversal_nbest(0, 0), **kwargs).fit(["abc", "ab"], ["cba", "ba"])


def test_a_reranker_given_other_rescorers_after_fit_asks_for_a_new_fit():
    reranker = NBestReranker(fit(max_steps=2), reversal_nbest(0, 0)).fit(["ab"], ["ba"])
    reranker.set_params(rescorers=[Reverser()])
    with pytest.raises(ValueError, match="fitted with 0 rescorers and has 1 now"):
        reranker.predict(["ab"])
