"""Seq2SeqEnsemble: the renormalised mean of the members' log-probabilities at every step, in
greedy and beam search, through the estimator, the exported artifact and decode.onnx.

Members are tiny models trained for a few dozen steps on string reversal (test_runtime's data
and settings): the checks need outputs that vary with the input, not good ones. The members
differ on purpose (Bahdanau / Luong LSTM local-m / Transformer / no attention), so one
ensemble crosses every kind of state (a GRU, an LSTM with input feeding, a growing key-value
cache) and the one-hot rows of a member without attention.
"""

import copy

import httpx
import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from sklearn.model_selection import GridSearchCV
from sklearn.utils.validation import NotFittedError
from test_runtime import (
    FIT_PARAMS,
    SOURCES,
    TRANSFORMER_PARAMS,
    X_TRAIN,
    Y_TRAIN,
    assert_same_attention,
    load,
)
from test_server import MODEL, infer_body

from skattn import Seq2Seq, Seq2SeqEnsemble
from skattn.core.text import BOS, EOS
from skattn.metrics import exact_match
from skattn.models.ensemble import EnsembleModule
from skattn.scoring import SCORERS

KINDS = [
    dict(decoder="bahdanau", attention="global", scorer="additive", random_state=0),
    dict(decoder="luong", attention="local-m", scorer="general", cell="lstm", random_state=1),
    TRANSFORMER_PARAMS,
    dict(decoder="bahdanau", attention="none", random_state=3),
]
NEVER = (0, 1, 3)  # PAD, BOS, UNK: never emitted by the search
FEW = SOURCES[:40]


def member(**params) -> Seq2Seq:
    return Seq2Seq(**{**FIT_PARAMS, **params})


@pytest.fixture(scope="module")
def members() -> list[Seq2Seq]:
    return [member(**kind).fit(X_TRAIN, Y_TRAIN) for kind in KINDS]


@pytest.fixture(scope="module")
def ensemble(members) -> Seq2SeqEnsemble:
    return Seq2SeqEnsemble.from_fitted(members)


def source_batch(model, sources):
    """Padded ids ``(B, T)`` and lengths ``(B,)`` as the estimator reads them."""
    ids = [model.source_vocab_.encode(list(s)) + [EOS] for s in sources]
    T = max(map(len, ids))
    src = torch.tensor([row + [0] * (T - len(row)) for row in ids])
    return src, torch.tensor([len(row) for row in ids])


# -- one step ----------------------------------------------------------------------------------


@torch.no_grad()
def test_a_step_is_the_renormalised_mean_of_the_members_log_probs(members):
    modules = [m.module_ for m in members]
    ensemble = EnsembleModule(modules)
    src, lengths = source_batch(members[0], ["abc", "", "fedcbaab", "zz"])
    memory, keys, mask, state = ensemble.encode(src, lengths)
    encoded = [m.encode(src, lengths) for m in modules]
    assert ensemble.state_names == tuple(
        f"m{i}_{name}" for i, m in enumerate(modules) for name in m.state_names
    )
    temperature = torch.tensor(0.8)
    y = torch.tensor([BOS] * 4)
    for position in range(4):  # the Transformer's cache grows, the local-m window moves
        log_probs, state, weights = ensemble.step(
            y, state, memory, keys, mask, temperature, torch.tensor(position)
        )
        own = []
        for i, (module, (mem, k, msk, s)) in enumerate(zip(modules, encoded, strict=True)):
            own.append(module.step(y, s, mem, k, msk, temperature, torch.tensor(position)))
            encoded[i] = (mem, k, msk, own[-1][1])
        u = np.mean([lp.double().numpy() for lp, _, _ in own], axis=0)  # (B, V)
        expected = u - np.log(np.exp(u).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(log_probs.numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(log_probs.double().exp().sum(-1).numpy(), 1.0, atol=1e-5)
        # the member without attention (the last) is left out of the map
        attending = np.mean([w.numpy() for _, _, w in own[:3]], axis=0)
        np.testing.assert_allclose(weights.numpy(), attending, atol=1e-6)
        for got, want in zip(state, [t for _, s, _ in own for t in s], strict=True):
            torch.testing.assert_close(got, want)
        y = log_probs.argmax(-1)


@torch.no_grad()
def test_without_any_attending_member_the_map_is_the_members_one_hot_row(members):
    bare = members[3].module_
    ensemble = EnsembleModule([bare, bare])
    src, lengths = source_batch(members[0], ["abc", "a"])
    memory, keys, mask, state = ensemble.encode(src, lengths)
    one = torch.tensor(1.0)
    _, _, weights = ensemble.step(torch.tensor([BOS, BOS]), state, memory, keys, mask, one, one)
    np.testing.assert_array_equal(weights.numpy(), [[0, 0, 0, 1], [0, 1, 0, 0]])


@torch.no_grad()
def test_the_teacher_forced_pass_equals_stepping(members):
    ensemble = EnsembleModule([m.module_ for m in members])
    src, lengths = source_batch(members[0], ["abcd", "ba", "eeeeeee"])
    tgt_in = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, 4, 4], [BOS, 5, 5, 5]])
    log_probs, weights = ensemble(src, src_lengths=lengths, tgt_in=tgt_in)
    memory, keys, mask, state = ensemble.encode(src, lengths)
    for i in range(tgt_in.shape[1]):
        lp, state, w = ensemble.step(
            tgt_in[:, i], state, memory, keys, mask, torch.tensor(1.0), torch.tensor(i)
        )
        torch.testing.assert_close(log_probs[:, i], lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights[:, i], w, atol=1e-5, rtol=1e-5)


# -- the estimator -----------------------------------------------------------------------------


@torch.no_grad()
def reference_greedy(models, source: str, max_length: int):
    """Greedy decoding of one source written against the members' modules directly."""
    modules = [m.module_ for m in models]
    src, lengths = source_batch(models[0], [source])
    encoded = [list(m.encode(src, lengths)) for m in modules]
    attending = [i for i, m in enumerate(modules) if m.config.attention != "none"]
    y, tokens, rows = torch.tensor([BOS]), [], []
    for position in range(max_length):
        log_probs, weights = [], []
        for module, e in zip(modules, encoded, strict=True):
            memory, keys, mask, state = e
            lp, e[3], w = module.step(
                y, state, memory, keys, mask, torch.tensor(1.0), torch.tensor(position)
            )
            log_probs.append(lp[0].double().numpy())
            weights.append(w[0].double().numpy())
        mean = np.mean(log_probs, axis=0)
        mean[list(NEVER)] = -np.inf
        token = int(np.argmax(mean))
        rows.append(np.mean([weights[i] for i in attending], axis=0))
        if token == EOS:
            break
        tokens.append(token)
        y = torch.tensor([token])
    rows = np.array(rows[: len(tokens)]).reshape(len(tokens), src.shape[1])  # (T_y, T_x)
    return models[0].target_vocab_.decode(tokens), rows


def test_greedy_equals_a_reference_loop_over_the_members(members, ensemble):
    predictions, maps = ensemble.predict(FEW), ensemble.predict_attention(FEW)
    assert len(set(predictions)) > 15  # the models' outputs vary with the input
    for source, prediction, attention in zip(FEW, predictions, maps, strict=True):
        tokens, rows = reference_greedy(members, source, FIT_PARAMS["max_output_length"])
        assert prediction == "".join(tokens)
        np.testing.assert_allclose(attention, rows, atol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_an_ensemble_of_one_model_is_that_model(members, beam_size):
    model = copy.deepcopy(members[1]).set_params(beam_size=beam_size)
    alone = Seq2SeqEnsemble.from_fitted([model], beam_size=beam_size)
    assert alone.predict(SOURCES) == model.predict(SOURCES)
    assert_same_attention(model.predict_attention(SOURCES), alone.predict_attention(SOURCES))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_an_item_decodes_the_same_alone_and_in_a_batch(ensemble, beam_size):
    search = clone(ensemble).set_params(beam_size=beam_size).fit(X_TRAIN, Y_TRAIN)
    batched = search.predict_attention(FEW)
    for source, attention in zip(FEW[:12], batched[:12], strict=True):
        np.testing.assert_allclose(search.predict_attention([source])[0], attention, atol=1e-5)
    assert [search.predict([s])[0] for s in FEW[:12]] == search.predict(FEW)[:12]


def test_beam_search_ranks_with_the_settings_set_after_fitting(ensemble):
    beam = clone(ensemble).set_params(beam_size=3, length_penalty=0.5, max_output_length=4)
    predictions = beam.fit(X_TRAIN, Y_TRAIN).predict(FEW)
    assert max(map(len, predictions)) == 4
    assert predictions != ensemble.predict(FEW)


def test_fit_clones_and_fits_every_member_with_one_vocabulary():
    estimators = [member(max_steps=5), member(max_steps=5, decoder="luong")]
    ensemble = Seq2SeqEnsemble(estimators, random_state=0).fit(X_TRAIN, Y_TRAIN)
    assert not hasattr(estimators[0], "module_")  # the given estimators stay unfitted
    a, b = ensemble.estimators_
    assert a.source_vocab_.to_list() == b.source_vocab_.to_list()
    assert a.target_vocab_.to_list() == b.target_vocab_.to_list()
    assert a.random_state != b.random_state  # seeds drawn from the ensemble's random_state
    same = Seq2SeqEnsemble(estimators, random_state=0).fit(X_TRAIN, Y_TRAIN)
    assert same.predict(FEW) == ensemble.predict(FEW)


def test_clones_of_one_estimator_differ_only_with_the_ensembles_random_state():
    one = member(max_steps=5, random_state=7)
    kept = Seq2SeqEnsemble([one, one]).fit(X_TRAIN, Y_TRAIN).estimators_
    assert [m.random_state for m in kept] == [7, 7]
    seeded = Seq2SeqEnsemble([one, one], random_state=0).fit(X_TRAIN, Y_TRAIN).estimators_
    weights = [next(m.module_.parameters()) for m in seeded]
    assert not torch.equal(*weights)


@pytest.mark.slow  # two loky workers each import torch: ~40 s on one shared core
def test_members_fit_in_parallel_processes_as_in_one():
    estimators = [member(max_steps=5, random_state=s) for s in (0, 1)]
    serial = Seq2SeqEnsemble(estimators).fit(X_TRAIN, Y_TRAIN)
    parallel = Seq2SeqEnsemble(estimators, n_jobs=2).fit(X_TRAIN, Y_TRAIN)
    assert parallel.predict(FEW) == serial.predict(FEW)


def test_frozen_members_survive_clone_and_refit(members, ensemble):
    refit = clone(ensemble).fit(["x"], ["y"])  # frozen: the data is not read
    assert all(a is b for a, b in zip(refit.estimators_, members, strict=True))
    assert clone(ensemble).get_params()["estimators"] == ensemble.estimators
    # n_jobs=2 sent them through worker processes, and kept the copies that came back: a
    # pickle held each member twice, and a later change to a model never reached the ensemble
    refit = clone(ensemble).set_params(n_jobs=2).fit(["x"], ["y"])
    assert all(a is b for a, b in zip(refit.estimators_, members, strict=True))
    from sklearn.exceptions import NotFittedError
    from sklearn.frozen import FrozenEstimator

    unfitted = Seq2SeqEnsemble([FrozenEstimator(Seq2Seq()), member(max_steps=1)])
    with pytest.raises(NotFittedError):  # before the other member trains
        unfitted.fit(X_TRAIN, Y_TRAIN)


def test_joblib_round_trip(ensemble, tmp_path):
    joblib.dump(ensemble, tmp_path / "ensemble.joblib")
    loaded = joblib.load(tmp_path / "ensemble.joblib")
    assert loaded.predict(FEW) == ensemble.predict(FEW)
    assert_same_attention(ensemble.predict_attention(FEW), loaded.predict_attention(FEW))
    assert loaded.estimators_[0] is loaded.estimators[0].estimator  # each member stored once
    for i, model in enumerate(ensemble.estimators_):  # members dumped by separate runs
        joblib.dump(model, tmp_path / f"member{i}.joblib")
    paths = [tmp_path / f"member{i}.joblib" for i in range(len(ensemble.estimators_))]
    rebuilt = Seq2SeqEnsemble.from_fitted([joblib.load(path) for path in paths])
    assert rebuilt.predict(FEW) == ensemble.predict(FEW)


def test_the_ensemble_module_is_built_once_and_again_when_a_member_changes(members):
    models = [copy.deepcopy(m) for m in members[:2]]
    ensemble = Seq2SeqEnsemble.from_fitted(models)
    module = ensemble.module_
    ensemble.predict(FEW[:3])
    assert ensemble.module_ is module
    assert "_module" not in ensemble.__getstate__()  # pickles hold each member once
    models[1].set_params(max_steps=2).fit(X_TRAIN, Y_TRAIN)  # a new module for member 1
    assert ensemble.module_ is not module and ensemble.module_.members[1] is models[1].module_
    more = [*models, copy.deepcopy(members[2])]  # refitted with one member more
    ensemble.set_params(estimators=[FrozenEstimator(m) for m in more]).fit(X_TRAIN, Y_TRAIN)
    assert len(ensemble.module_.members) == 3


def test_score_and_the_metrics_scorers(ensemble):
    X, y = FEW, [s[::-1] for s in FEW]
    expected = exact_match(y, ensemble.predict(X))
    assert ensemble.score(X, y) == SCORERS["exact_match"](ensemble, X, y) == expected
    assert 0 < expected < 1


def test_grid_search_over_prediction_settings_keeps_the_frozen_members(ensemble):
    X, y = SOURCES[:60], [s[::-1] for s in SOURCES[:60]]
    search = GridSearchCV(ensemble, {"beam_size": [1, 3]}, cv=2, scoring=SCORERS["exact_match"])
    search = search.fit(X, y)
    assert search.best_estimator_.estimators_[0] is ensemble.estimators_[0]
    assert search.cv_results_["mean_test_score"].shape == (2,)


# -- one artifact ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(members, tmp_path_factory):
    """beam size -> (the ensemble, its exported artifact directory)."""
    exported = {}
    for beam_size in (1, 3):
        ensemble = Seq2SeqEnsemble.from_fitted(members, beam_size=beam_size, temperature=0.9)
        directory = tmp_path_factory.mktemp("ensemble") / f"beam{beam_size}"
        exported[beam_size] = ensemble, ensemble.export_onnx(directory)
    return exported


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_artifact_serves_the_ensembles_predictions(members, artifacts, beam_size):
    ensemble, directory = artifacts[beam_size]
    expected, maps = ensemble.predict(SOURCES), ensemble.predict_attention(SOURCES)
    for decode_graph in (True, False):
        runtime = load(directory, decode_graph=decode_graph)
        assert runtime.decode_graph is decode_graph
        assert runtime.predict(SOURCES) == expected
        assert_same_attention(maps, runtime.predict_attention(SOURCES))
    info = runtime.info
    assert (info.decoder, info.attention) == (
        "ensemble(bahdanau+luong+transformer+bahdanau)",
        "global+local-m+global+none",
    )
    manifest = runtime.manifest
    assert manifest.model["ensemble"] == [m.module_.config.to_dict() for m in members]
    assert manifest.input_feeding is False  # only the Luong member feeds its input
    luong = members[1].module_.config
    assert luong.feeds_input and not ensemble.module_.config.feeds_input
    configs = [m.module_.config for m in members]  # every member's setting, as before
    assert ensemble.module_.config.input_feeding is all(c.input_feeding for c in configs)
    assert manifest.state_names == ensemble.module_.state_names
    assert manifest.max_output_length == ensemble._output_limit()


def test_an_ensemble_of_one_transformer_serves_as_that_model(members, tmp_path):
    model = members[2]  # the growing key-value cache, under the ensemble's state names
    alone = Seq2SeqEnsemble.from_fitted([model])
    runtime = load(alone.export_onnx(tmp_path / "alone"))
    assert runtime.manifest.state_names == ("m0_self_keys", "m0_self_values")
    assert runtime.predict(SOURCES) == model.predict(SOURCES)
    assert_same_attention(model.predict_attention(SOURCES), runtime.predict_attention(SOURCES))
    assert runtime.info.attention_layers == 0  # a single model's maps, not an ensemble's
    with pytest.raises(ValueError, match="decoder is 'ensemble.transformer.'"):
        runtime.predict_attention(SOURCES[:2], layer=0)


def test_the_server_and_the_explorer_listing_serve_the_ensemble(artifacts, serve):
    ensemble, directory = artifacts[1]
    runtime = load(directory)
    server = serve(runtime)
    sources = FEW[:6]
    outputs = [{"name": name} for name in ("prediction", "attention", "attention_lengths")]
    body = infer_body(sources, outputs=outputs)
    response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=body, timeout=30)
    answer = {o["name"]: o for o in response.json()["outputs"]}
    assert answer["prediction"]["data"] == ensemble.predict(sources)
    shapes = np.array(answer["attention_lengths"]["data"]).reshape(-1, 2)
    served = np.array(answer["attention"]["data"], dtype=np.float32).reshape(
        answer["attention"]["shape"]
    )
    for (rows, cols), want, got in zip(
        shapes, ensemble.predict_attention(sources), served, strict=True
    ):
        np.testing.assert_allclose(got[:rows, :cols], want, atol=1e-4)
    (listed,) = httpx.get(f"{server.url}/v2/models", timeout=10).json()
    assert listed["decoder"] == "ensemble(bahdanau+luong+transformer+bahdanau)"


# -- what cannot be combined -------------------------------------------------------------------


def test_members_with_other_vocabularies_are_refused(members):
    other = member(max_steps=2).fit(["ab", "xyz"], ["ba", "zyx"])
    with pytest.raises(ValueError, match=r"estimators\[1\]\.source_vocab_ differs"):
        Seq2SeqEnsemble.from_fitted([members[0], other])
    spaced = member(max_steps=2, tokenizer="space").fit(X_TRAIN, Y_TRAIN)
    with pytest.raises(ValueError, match=r"estimators\[1\] has tokenizer='space'"):
        Seq2SeqEnsemble.from_fitted([members[0], spaced])
    tokens = member(max_steps=2).fit(X_TRAIN, [list(y) for y in Y_TRAIN])
    with pytest.raises(ValueError, match=r"output_kind_='tokens'"):
        Seq2SeqEnsemble.from_fitted([members[0], tokens])


def test_a_member_whose_tokenizer_changed_after_fitting_is_refused():
    """A member's vocabulary holds its fitted tokenizer's tokens: another would read every source
    as unknown tokens, so the ensemble refuses it as ``Seq2Seq.predict`` does (it read the first
    member's ``tokenizer`` and answered from unknown tokens)."""
    members = [member(max_steps=2).fit(X_TRAIN, Y_TRAIN) for _ in range(2)]
    ensemble = Seq2SeqEnsemble.from_fitted(members)
    before = ensemble.predict(X_TRAIN[:4])
    assert ensemble.tokenizer == "char"
    for i, changed in enumerate(members):  # the ensemble holds the members themselves
        changed.set_params(tokenizer="space")
        with pytest.raises(ValueError, match=rf"estimators\[{i}\]: tokenizer='space', but"):
            ensemble.predict(X_TRAIN[:4])
        with pytest.raises(ValueError, match=rf"estimators\[{i}\]: tokenizer='space'"):
            Seq2SeqEnsemble.from_fitted(members)
        changed.set_params(tokenizer="char")
    assert ensemble.predict(X_TRAIN[:4]) == before


def test_a_member_fitted_again_on_other_vocabularies_is_refused_then_taken_when_all_agree(
    tmp_path,
):
    """The ensemble checked its members' vocabularies once, in from_fitted: a member fitted
    again on the same tokens seen in another order (other ids) was averaged with the others
    id by id, and the ensemble answered nonsense (exact match 0.05 from 0.92)."""
    members = [member(max_steps=2).fit(X_TRAIN, Y_TRAIN) for _ in range(2)]
    ensemble = Seq2SeqEnsemble.from_fitted(members)
    ensemble.predict(X_TRAIN[:2])
    members[0].fit(X_TRAIN[::-1], Y_TRAIN[::-1])  # the same tokens, first seen elsewhere
    assert members[0].source_vocab_.tokens != members[1].source_vocab_.tokens
    for use in (lambda: ensemble.predict(X_TRAIN[:2]), lambda: ensemble.export_onnx(tmp_path)):
        with pytest.raises(ValueError, match=r"estimators\[1\]\.source_vocab_ differs"):
            use()
    members[1].fit(X_TRAIN[::-1], Y_TRAIN[::-1])  # agreeing again: taken, new ids and all
    for m in members:  # and their limits, from the first call on (it searched with the old)
        m.set_params(max_output_length=2).fit(X_TRAIN[::-1], Y_TRAIN[::-1])
    assert ensemble.max_output_length_ > 2
    assert all(len(p) <= 2 for p in ensemble.predict(X_TRAIN[:4]))
    assert ensemble.predict(X_TRAIN[:2]) == Seq2SeqEnsemble.from_fitted(members).predict(
        X_TRAIN[:2]
    )
    assert ensemble.source_vocab_.tokens == members[0].source_vocab_.tokens


def test_a_member_fitted_again_in_place_or_given_new_limits_is_read_again():
    """warm_start trains a member's module in place, so the ensemble kept its module and,
    with it, the limits of the first fit: predictions were cut at the old, shorter length."""
    fitted = dict(max_steps=2, max_output_length=None)  # the limit follows the targets
    members = [member(**fitted, random_state=i).fit(X_TRAIN, Y_TRAIN) for i in range(2)]
    ensemble = Seq2SeqEnsemble.from_fitted(members)
    ensemble.predict(X_TRAIN[:2])
    module = ensemble.module_
    longest = max(len(x) for x in X_TRAIN)
    longer = ["".join(reversed(x)) * 3 for x in X_TRAIN[:20]]  # 3x longer sources and targets
    members[0].set_params(warm_start=True).fit(longer, [x[::-1] for x in longer])
    assert ensemble.module_ is module  # the same objects, trained in place
    assert ensemble.max_source_length_ == members[0].max_source_length_ >= 3 * longest
    assert ensemble._output_limit() == members[0]._output_limit() > members[1]._output_limit()
    assert ensemble.predict(X_TRAIN[:3]) == Seq2SeqEnsemble.from_fitted(members).predict(
        X_TRAIN[:3]
    )
    members[1].set_params(max_output_length=500)
    ensemble.predict(X_TRAIN[:1])
    assert ensemble._output_limit() == 500


@pytest.mark.parametrize(
    ("limit", "match"),
    [(50_000, r"estimators\[1\]\.max_output_length must be an int"), ("abc", "an int")],
)
def test_a_members_bad_output_limit_is_refused_naming_it(limit, match):
    """The ensemble's default limit is the members' largest, which only a member's own
    predict checked: 50,000 decoded 50,000 tokens for a 2-character source (14 s), and a
    string raised a TypeError."""
    fitted = [member(max_steps=1, random_state=i).fit(X_TRAIN, Y_TRAIN) for i in range(2)]
    ensemble = Seq2SeqEnsemble.from_fitted(fitted)
    expected = ensemble.predict(FEW[:2])
    fitted[1].set_params(max_output_length=limit)
    with pytest.raises(ValueError, match=match):
        ensemble.predict(FEW[:2])
    with pytest.raises(ValueError, match=match):
        Seq2SeqEnsemble.from_fitted(fitted)
    fitted[1].set_params(max_output_length=None)
    assert ensemble.predict(FEW[:2]) == expected


@pytest.mark.parametrize(
    "estimators, match",
    [
        ([], "estimators must be a non-empty list"),
        ([Seq2Seq(), "model"], r"estimators\[1\] must be a Seq2Seq, got str"),
    ],
)
def test_bad_estimators_are_refused_when_fitting(estimators, match):
    with pytest.raises(ValueError, match=match):
        Seq2SeqEnsemble(estimators).fit(X_TRAIN, Y_TRAIN)


def test_bad_settings_and_unfitted_use_are_refused(members, ensemble):
    with pytest.raises(ValueError, match=r"models\[0\] is not fitted"):
        Seq2SeqEnsemble.from_fitted([Seq2Seq()])
    with pytest.raises(ValueError, match="models must be a non-empty list"):
        Seq2SeqEnsemble.from_fitted(members[0])
    with pytest.raises(ValueError, match="beam_size"):
        Seq2SeqEnsemble.from_fitted(members, beam_size=0)
    with pytest.raises(ValueError, match=r"from_fitted got \['beam', 'estimators'\]"):
        Seq2SeqEnsemble.from_fitted(members, beam=5, estimators=members)
    with pytest.raises(ValueError, match="beam_size"):
        clone(ensemble).set_params(beam_size=0).fit(X_TRAIN, Y_TRAIN)
    bad = Seq2SeqEnsemble.from_fitted(members)
    bad.temperature = -1.0
    with pytest.raises(ValueError, match="temperature"):
        bad.predict(FEW)
    with pytest.raises(ValueError, match="layer=0: an ensemble reports its mean"):
        ensemble.predict_attention(FEW, layer=0)
    with pytest.raises(NotFittedError):
        Seq2SeqEnsemble([Seq2Seq()]).predict(FEW)


@pytest.mark.parametrize("n_jobs", [True, 0, 1.5, "2", 2**31, -(2**31)])
def test_n_jobs_is_joblibs_count_not_a_bool_or_zero(n_jobs):
    with pytest.raises(ValueError, match="n_jobs"):
        Seq2SeqEnsemble([Seq2Seq(max_steps=1)], n_jobs=n_jobs).fit(X_TRAIN[:4], Y_TRAIN[:4])
    for fine in (None, 1, -1):  # every accepted kind passes the check
        Seq2SeqEnsemble([Seq2Seq(max_steps=1)], n_jobs=fine)._validate_params()


def test_a_fit_whose_members_disagree_keeps_the_ensemble_as_it_was(monkeypatch):
    """The members were adopted before they were checked: a refused fit left an unfitted
    ensemble half-fitted (``estimators_`` set) and a fitted one without its working members;
    and tokenizers that differ were found only after every member had trained."""
    from skattn import ensemble as ensemble_module

    good = Seq2SeqEnsemble.from_fitted([member(max_steps=2).fit(X_TRAIN, Y_TRAIN)])
    before = good.predict(FEW)
    fits = []
    monkeypatch.setattr(ensemble_module, "_fit_member", lambda m, X, y: fits.append(m) or m)
    spaced = [member(max_steps=2), member(max_steps=2, tokenizer="space")]
    for ensemble in (Seq2SeqEnsemble(spaced), good.set_params(estimators=spaced)):
        with pytest.raises(ValueError, match=r"estimators\[1\] has tokenizer='space'"):
            ensemble.fit(X_TRAIN, Y_TRAIN)
    assert fits == []  # refused before any member trained
    monkeypatch.undo()
    assert not hasattr(Seq2SeqEnsemble(spaced), "estimators_")
    other = member(max_steps=2).fit(["ab", "xyz"], ["ba", "zyx"])  # found only once fitted
    fresh = Seq2SeqEnsemble([member(max_steps=2), FrozenEstimator(other)])
    with pytest.raises(ValueError, match=r"estimators\[1\]\.source_vocab_ differs"):
        fresh.fit(X_TRAIN, Y_TRAIN)
    assert not hasattr(fresh, "estimators_")
    with pytest.raises(NotFittedError):
        fresh.predict(FEW)
    with pytest.raises(ValueError, match=r"estimators\[1\]\.source_vocab_ differs"):
        good.set_params(estimators=fresh.estimators).fit(X_TRAIN, Y_TRAIN)
    assert good.predict(FEW) == before  # the members it had


def test_tokenizer_of_estimators_that_are_not_a_list_is_none():
    assert Seq2SeqEnsemble(5).tokenizer is None
    assert hasattr(Seq2SeqEnsemble(5), "tokenizer")  # it raised TypeError
    with pytest.raises(ValueError, match="'estimators' parameter"):
        Seq2SeqEnsemble(5).fit(X_TRAIN, Y_TRAIN)  # scikit-learn's parameter check


def test_no_more_workers_than_members_for_any_n_jobs(monkeypatch):
    """n_jobs=-1 (or None under joblib's parallel_config) started a worker per core for one
    member: each imports torch."""
    import joblib

    from skattn import ensemble as ensemble_module

    asked = []

    class Recording(joblib.Parallel):
        def __init__(self, n_jobs=None, **kwargs):
            asked.append(n_jobs)
            super().__init__(n_jobs=1, **kwargs)

    monkeypatch.setattr(ensemble_module, "Parallel", Recording)
    for n_jobs in (-1, 4, None):
        Seq2SeqEnsemble([member(max_steps=1)], n_jobs=n_jobs).fit(X_TRAIN[:8], Y_TRAIN[:8])
    with joblib.parallel_config(n_jobs=-1):
        Seq2SeqEnsemble([member(max_steps=1)] * 2).fit(X_TRAIN[:8], Y_TRAIN[:8])
    assert asked == [1, 1, 1, min(joblib.effective_n_jobs(-1), 2)]
