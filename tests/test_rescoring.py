"""log_likelihood (teacher-forced scores of given outputs) and NBestReranker, on small reversal
models: the score of a model's own answer is the search's score of it, items score the same
alone and in a batch, and the reranker chooses its weight on held-out data."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from test_runtime import SOURCES, X_TRAIN, Y_TRAIN, fit, load

from skattn import Seq2Seq, Seq2SeqEnsemble
from skattn.core.inference import SearchSettings, source_ids
from skattn.rescoring import NBestReranker

FEW = SOURCES[:30]
#: Sources whose reversal the model can write: "é" is no target token (its outputs score -inf).
CLEAN = [s for s in SOURCES if "é" not in s]


@pytest.fixture(scope="module")
def model():
    return fit(max_steps=60)


def search_scores(estimator, sources, temperature=1.0):
    """The greedy search's score (summed log-probabilities, EOS included) of each answer, and
    whether the answer ended with EOS (not cut at the output limit)."""
    limit = estimator._output_limit()
    ids = source_ids(estimator.source_vocab_, [list(s) for s in sources])
    settings = SearchSettings(beam_size=1, max_length=limit, temperature=temperature)
    hypotheses = estimator._translator().decode(ids, settings)
    return np.array([h.score for h in hypotheses]), [len(h.tokens) < limit for h in hypotheses]


@pytest.mark.parametrize("kind", ["model", "ensemble"])
def test_the_log_likelihood_of_the_models_answer_is_its_search_score(model, kind):
    if kind == "ensemble":
        model = Seq2SeqEnsemble.from_fitted([model, fit(max_steps=60, random_state=1)])
    expected, ended = search_scores(model, FEW)
    scores = model.log_likelihood(FEW, model.predict(FEW))
    assert sum(ended) >= 20
    # An answer cut at the output limit has no EOS, which its log-likelihood counts.
    np.testing.assert_allclose(scores[ended], expected[ended], rtol=1e-6, atol=1e-6)
    assert np.all(scores[~np.array(ended)] < expected[~np.array(ended)])


def test_items_score_the_same_alone_and_in_a_batch_and_better_outputs_score_higher(model):
    sources = CLEAN[:30]
    targets = [s[::-1] for s in sources]  # the right answers
    together = model.log_likelihood(sources, targets)
    pairs = zip(sources[:5], targets[:5], strict=True)
    alone = [model.log_likelihood([s], [t])[0] for s, t in pairs]
    np.testing.assert_allclose(together[:5], alone, rtol=1e-5, atol=1e-5)  # float32 sums
    assert np.all(np.isfinite(together) & (together <= 0))
    wrong = model.log_likelihood(sources, [t[1:] + t[:1] for t in targets])  # rotated
    assert np.mean(together > wrong) > 0.6 and together.mean() > wrong.mean()  # a weak model


def test_n_best_lists_encode_each_source_once_and_score_alike_in_worker_threads(model, tmp_path):
    sources = CLEAN[:6]
    candidates = [[s[::-1], s[::-1][1:], s, s[:1]] for s in sources]
    X = [s for s, cands in zip(sources, candidates, strict=True) for _ in cands]
    y = [c for cands in candidates for c in cands]
    directory = model.export_onnx(tmp_path / "model")
    alone = load(directory).log_likelihood(X, y)
    runtime = load(directory, workers=2, max_batch_size=5)  # five chunks over two threads
    encoded = []
    encode = runtime.translator.encode
    runtime.translator.encode = lambda id_lists: encoded.append(len(id_lists)) or encode(id_lists)
    np.testing.assert_allclose(runtime.log_likelihood(X, y), alone, rtol=1e-5, atol=1e-5)
    assert sum(encoded) <= len(sources) + len(encoded)  # not one encoding a candidate
    np.testing.assert_allclose(model.log_likelihood(X, y), alone, rtol=1e-5, atol=1e-4)


def test_log_likelihood_refuses_what_it_cannot_score(model):
    assert model.log_likelihood(["abc"], ["cbq"])[0] == -np.inf  # "q": not a target token
    with pytest.raises(ValueError, match="X and y must have the same length, got 2 and 1"):
        model.log_likelihood(["abc", "ab"], ["cba"])
    with pytest.raises(ValueError, match="This Seq2Seq instance is not fitted yet"):
        Seq2Seq().log_likelihood(["abc"], ["cba"])


def test_log_likelihood_refuses_outputs_longer_than_any_model_writes(model, tmp_path):
    """Scoring steps the decoder once a token: an output of 10^5 tokens held the runtime for
    seconds (a Transformer's, quadratic, for minutes), with no bound as sources have. The bound
    is the artifact's (4,096), not the model's own limit: a candidate to rerank may be longer
    than what the model would write."""
    runtime = load(model.export_onnx(tmp_path / "model"))
    fits, too_long = "a" * 4096, "a" * 4097
    assert model._output_limit() < len(fits)
    assert np.isfinite(model.log_likelihood(["abc"], [fits])[0])
    assert np.isfinite(runtime.log_likelihood(["abc"], [fits])[0])
    words = r"\[1\] holds 4097 tokens, more than any model writes \(4096"
    with pytest.raises(ValueError, match=r"y" + words):
        model.log_likelihood(["abc", "ab"], [fits, too_long])
    with pytest.raises(ValueError, match=r"outputs" + words):
        runtime.log_likelihood(["abc", "ab"], [fits, too_long])


def test_log_likelihood_scores_at_the_estimators_temperature_as_its_search_does(model):
    model.set_params(temperature=0.5)
    try:
        expected, ended = search_scores(model, FEW, temperature=0.5)
        scores = model.log_likelihood(FEW, model.predict(FEW))
    finally:
        model.set_params(temperature=1.0)
    np.testing.assert_allclose(scores[ended], expected[ended], rtol=1e-6, atol=1e-6)
    assert not np.allclose(scores, model.log_likelihood(FEW, model.predict(FEW)))


def test_a_model_fitted_on_token_lists_refuses_outputs_given_as_strings(tmp_path):
    # "K AE T" split by the char tokenizer would be K, " ", A, E, ...: silently -inf
    X, y = ["cat", "act", "tac"] * 4, [["K", "AE", "T"], ["AE", "K", "T"], ["T", "AE", "K"]] * 4
    tokens_model = fit(X, y, max_steps=2)
    runtime = load(tokens_model.export_onnx(tmp_path / "model"))
    for scorer, name in ((tokens_model, "y"), (runtime, "outputs")):
        assert np.isfinite(scorer.log_likelihood(["cat"], [["K", "AE", "T"]])[0])
        with pytest.raises(ValueError, match=f"{name} holds strings, but the model was fitted"):
            scorer.log_likelihood(["cat"], ["K AE T"])
    reranker = NBestReranker(tokens_model, lambda sources: [[("K AE T", 0.0)] for _ in sources])
    with pytest.raises(ValueError, match="nbest's output for source 0 holds strings"):
        reranker.fit(["cat"], [["K", "AE", "T"]])
    # References given as strings matched no candidate: fit chose weight 0 and score read 0.0
    reranker = NBestReranker(
        tokens_model, lambda sources: [[(["K", "AE", "T"], 0.0)] for _ in sources]
    )
    reranker.fit(["cat"], [["K", "AE", "T"]])
    assert reranker.score(["cat"], [[["K", "AE", "T"], ["K", "AH", "T"]]]) == 1.0
    for call in (reranker.fit, reranker.score):
        with pytest.raises(ValueError, match="y holds strings, but the model was fitted"):
            call(["cat"], ["K AE T"])


def reversal_nbest(wrong_score: float, right_score: float, as_tokens: bool = False):
    """A stand-in for another system: the right answer and a wrong one, with these scores."""

    def nbest(sources):
        pairs = [[(s[::-1][1:] + "a", wrong_score), (s[::-1], right_score)] for s in sources]
        return [[(list(c) if as_tokens else c, e) for c, e in p] for p in pairs]

    return nbest


def test_the_reranker_chooses_its_weight_on_held_out_data_and_predicts_with_it(model):
    dev, test = CLEAN[30:90], CLEAN[90:150]
    own = np.mean([p == s[::-1] for p, s in zip(model.predict(test), test, strict=True)])
    trusted = reversal_nbest(-50.0, 0.0)
    reranker = NBestReranker(model, trusted, weights=(0.0, 0.01, 10.0))
    reranker.fit(dev, [s[::-1] for s in dev])
    assert reranker.weight_ == 10.0  # the other system is right every time: trust it
    assert reranker.fit_scores_[(reranker.weight_, reranker.length_exponent_)] == 1.0
    assert reranker.predict(test) == [s[::-1] for s in test]
    assert reranker.score(test, [s[::-1] for s in test]) == 1.0
    # clone() would unfit the model: a FrozenEstimator keeps it fitted (as GridSearchCV clones)
    frozen = clone(NBestReranker(FrozenEstimator(model), trusted, weights=(0.0, 0.01, 10.0)))
    assert frozen.fit(dev, [s[::-1] for s in dev]).weight_ == 10.0
    # A system that prefers the wrong answer: weight 0, the model's own choice among the
    # candidates, at least as good as its own answer alone (which is one of them).
    misleading = NBestReranker(model, reversal_nbest(0.0, -50.0)).fit(dev, [s[::-1] for s in dev])
    assert misleading.weight_ == 0.0
    reranked = misleading.predict(test)
    assert np.mean([p == s[::-1] for p, s in zip(reranked, test, strict=True)]) >= own
    tokens_model = fit(X_TRAIN, [list(y) for y in Y_TRAIN], max_steps=2)
    as_tokens = NBestReranker(tokens_model, reversal_nbest(-50.0, 0.0, True), weights=[1.0])
    assert as_tokens.fit(dev[:5], [list(s[::-1]) for s in dev[:5]]).predict(["abc"]) == [
        ["c", "b", "a"]
    ]


def test_a_failed_fit_leaves_a_fitted_reranker_as_it_was_and_checks_y_first(model):
    """Bad references were found only after the n-best, predict and likelihood passes (minutes
    on CMUdict), named ``y_true``, and left ``fit_scores_`` emptied beside the old weight."""
    dev = CLEAN[30:50]
    calls = []

    def counted(sources):
        calls.append(len(sources))
        return reversal_nbest(-50.0, 0.0)(sources)

    reranker = NBestReranker(model, counted, weights=(0.0, 10.0)).fit(dev, [s[::-1] for s in dev])
    fitted = (dict(reranker.fit_scores_), reranker.weight_, reranker.length_exponent_)
    calls.clear()
    with pytest.raises(ValueError, match=r"^y items must be str or lists of str tokens, got 1"):
        reranker.fit(dev[:2], [1, 2])
    assert calls == []  # refused before any pass over the data
    assert (reranker.fit_scores_, reranker.weight_, reranker.length_exponent_) == fitted


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nbest": "lists"}, "nbest must be callable"),
        ({"nbest": lambda sources: [[]]}, "one list per source"),
        ({"nbest": lambda sources: [[("cba", float("nan"))] for _ in sources]}, "finite"),
        ({"nbest": lambda sources: [None for _ in sources]}, "must be a list"),
        ({"nbest": lambda sources: [[("cba",)] for _ in sources]}, r"\(output, score\) pairs"),
        ({"nbest": reversal_nbest(0, 0), "weights": []}, "weights"),
        ({"nbest": reversal_nbest(0, 0), "weights": [-1.0]}, "weights"),
        ({"nbest": reversal_nbest(0, 0), "length_exponents": ["1"]}, "length_exponents"),
        ({"nbest": reversal_nbest(0, 0), "missing_penalty": -1}, "missing_penalty"),
        ({"nbest": reversal_nbest(0, 0), "weights": iter([1.0])}, "weights must be a non-"),
        ({"nbest": reversal_nbest(0, 0), "weights": [1e308]}, "weights"),
        ({"nbest": reversal_nbest(0, 0), "length_exponents": [1e3]}, "length_exponents"),
        ({"nbest": reversal_nbest(0, 0), "estimator": "model"}, "estimator must be a fitted"),
    ],
)
def test_the_reranker_refuses_bad_settings_and_bad_lists(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        NBestReranker(**{"estimator": model, **kwargs}).fit(["abc", "ab"], ["cba", "ba"])


def test_an_exported_model_scores_as_the_estimator_and_reranks_alike(model, tmp_path):
    runtime = load(model.export_onnx(tmp_path / "model"))
    sources = CLEAN[:40]
    for outputs in (model.predict(sources), [s[::-1] for s in sources]):
        np.testing.assert_allclose(
            runtime.log_likelihood(sources, outputs),
            model.log_likelihood(sources, outputs),
            rtol=1e-5,
            atol=1e-4,
        )
    assert runtime.log_likelihood(["abc"], [["c", "b", "q"]])[0] == -np.inf
    assert runtime.log_likelihood([], []).shape == (0,)
    with pytest.raises(ValueError, match="differ in length"):
        runtime.log_likelihood(["abc"], [])
    dev, test = CLEAN[30:90], CLEAN[90:150]
    references = [s[::-1] for s in dev]
    trusted = reversal_nbest(-50.0, 0.0)
    ours = NBestReranker(model, trusted).fit(dev, references)
    exported = clone(NBestReranker(runtime, trusted)).fit(dev, references)  # no FrozenEstimator
    assert (exported.weight_, exported.length_exponent_) == (ours.weight_, ours.length_exponent_)
    assert exported.predict(test) == ours.predict(test)


def test_an_estimator_whose_predict_miscounts_is_named(model, monkeypatch):
    monkeypatch.setattr(model, "predict", lambda X: ["cba"] * (len(X) - 1), raising=False)
    with pytest.raises(ValueError, match="estimator.predict returned 1 outputs for 2 sources"):
        NBestReranker(model, reversal_nbest(0, 0)).fit(["abc", "ab"], ["cba", "ba"])


def test_a_candidate_longer_than_any_model_writes_scores_minus_infinity(model):
    """Another system's candidate of 5,000 tokens made log_likelihood refuse the whole n-best
    call, naming an index of the flattened pairs that the caller never passed."""
    sources = CLEAN[:3]
    huge = "a" * 5000

    def nbest(batch):
        return [[(s[::-1], -1.0), (huge, 0.0)] for s in batch]

    reranker = NBestReranker(model, nbest, weights=(10.0,)).fit(sources, [s[::-1] for s in sources])
    assert reranker.predict(sources) == [s[::-1] for s in sources]  # never the unwritable one
    candidates, likelihoods, _ = reranker._candidates(sources)
    scores = likelihoods[0]
    assert [scores[i] for i, c in enumerate(c for cs in candidates for c in cs) if len(c) > 4096]
    assert all(
        s == -np.inf
        for s, c in zip(scores, (c for cs in candidates for c in cs), strict=True)
        if len(c) > 4096
    )


def test_the_scorers_read_the_reranked_models_tokenizer():
    """A reranker has no tokenizer of its own: a phoneme model inside one was scored on
    characters, as inside a Pipeline before."""
    from skattn.scoring import SCORERS

    X = [list(word) for word in ["cat", "dog", "cause", "am"]]
    y = ["K AE T", "D AO G", "K AA Z", "AE M"]
    phonemes = Seq2Seq(tokenizer="space", hidden_size=8, embedding_dim=4, max_steps=2)
    phonemes.set_params(early_stopping=False, device="cpu", random_state=0).fit(X, y)
    reranker = NBestReranker(FrozenEstimator(phonemes), lambda batch: [[] for _ in batch])
    reranker.fit(X, y)  # (its own answers only: no other system's candidates)
    assert reranker.tokenizer_ == "space" and reranker.output_kind_ == "str"
    scorer = SCORERS["neg_token_error_rate"]
    assert scorer(reranker, X, y) == scorer(phonemes, X, y)
