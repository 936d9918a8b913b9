"""decode.onnx: the whole search in one graph, against the NumPy search and the runtime.

Parity is checked on small models fitted for 60 steps on digit reversal, so that items end at
many lengths (untrained modules end every item at the same step): greedy identical, beam the same
hypotheses and scores within 1e-5, for every scorer x decoder x attention kind (the grid of
test_export.py). A fresh process that imports only numpy and onnxruntime runs the graph the way
a C++ or Java host would (ids from the manifest's vocabulary) and must print the runtime's
predictions. The artifact tests check that decode.onnx is optional, and checked when present.
"""

import copy
import functools
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_export import (
    KINDS,
    SOURCE_VOCABULARY,
    export,
    kind_id,
    make_module,
    make_transformer,
    random_source,
)

import serving
from serving.artifact import ArtifactError
from skattn import Seq2Seq
from skattn.core.manifest import DECODE_FILE, ITEM_MEMORY_KEY, Manifest
from skattn.core.text import EOS, SPECIAL_TOKENS
from skattn.datasets import make_reversal
from skattn.decode_graph import (
    build_decode_graph,
    compare_with_search,
    reads_item_memory,
    reference_search,
)
from skattn.export import export_module
from skattn.models import Seq2SeqModule
from skattn.models.config import ModelConfig

SEARCHES = [
    dict(beam_size=1),
    dict(beam_size=3, length_penalty=0.7),
]
#: Both searches on a few kinds always. Slow (CI runs them): beam search on every other scorer
#: under global attention, local-p, no attention, Luong without input feeding and the LSTMs
#: (greedy decoding of every kind goes through this graph in test_runtime's parity tests).
FAST = {0, 7, 12, 16}
SLOW_BEAM = {1, 2, 3, 10, 13, 14, 15, 22, 24, 25, 26, 27, 28}


def grid():
    for index, kind in enumerate(KINDS):
        for search in SEARCHES:
            if index in FAST:
                marks = ()
            elif index in SLOW_BEAM and search["beam_size"] > 1:
                marks = pytest.mark.slow
            else:
                continue
            name = f"{kind_id(kind)}-beam{search['beam_size']}"
            yield pytest.param(kind, search, marks=marks, id=name)


def sessions(directory):
    def open_(name):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        return ort.InferenceSession(str(directory / name), options, ["CPUExecutionProvider"])

    manifest = Manifest.from_json((directory / "manifest.json").read_text())
    return manifest, open_("encoder.onnx"), open_("decoder_step.onnx"), open_(DECODE_FILE)


def run_decode(session, src, lengths, max_length, temperature):
    feeds = {
        "src": src,
        "src_lengths": lengths,
        "max_length": np.array(max_length, dtype=np.int64),
        "temperature": np.array(temperature, dtype=np.float32),
    }
    return session.run(None, feeds)


@functools.cache
def briefly_trained(kind_key: tuple) -> Seq2Seq:
    """A small model fitted for 60 steps on digit reversal: untrained modules of this size
    emit EOS at the same step for every source (or never), half-trained ones at many."""
    X, y = make_reversal(300, min_length=2, max_length=9, random_state=0)
    kind = {"window": 2, **dict(kind_key)}
    params = dict(hidden_size=16, embedding_dim=8, batch_size=32, learning_rate=1e-2)
    params.update(max_steps=60, early_stopping=False, random_state=0, device="cpu")
    return Seq2Seq(**params, **kind).fit(X, y)


def export_estimator(estimator, directory, **search):
    return export_module(
        estimator.module_,
        directory,
        source_vocabulary=estimator.source_vocab_.to_list(),
        target_vocabulary=estimator.target_vocab_.to_list(),
        tokenizer="char",
        **search,
    )


def digit_sources(B: int, T: int, seed: int):
    """``(B, T)`` digit ids (the reversal vocabulary: ids 4..13) of lengths 1..T, EOS last."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    src = np.zeros((B, T), dtype=np.int64)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = rng.integers(4, 14, size=length - 1)
        src[row, length - 1] = EOS
    return src, lengths.astype(np.int64)


@pytest.mark.parametrize(("kind", "search"), list(grid()))
def test_decode_graph_equals_the_numpy_search(kind, search, tmp_path):
    estimator = briefly_trained(tuple(sorted(kind.items())))
    directory = export_estimator(estimator, tmp_path / "model", **search)
    manifest, encoder, decoder, decode = sessions(directory)
    src, lengths = digit_sources(32, 12, seed=5)
    max_length = 7
    expected = reference_search(encoder, decoder, manifest, src, lengths, max_length, 0.6)
    outputs = run_decode(decode, src, lengths, max_length, 0.6)

    assert compare_with_search(expected, *outputs) == []
    out_lengths = [len(h.tokens) for h in expected]
    assert len(set(out_lengths)) >= 3, f"items must end at several steps: {out_lengths}"
    tokens, _, attention, _ = outputs
    assert tokens.shape[1] == attention.shape[1] <= max_length
    assert attention.shape == (*tokens.shape, src.shape[1])


@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_step_at_max_length_zero_gives_empty_outputs_for_any_batch(beam_size, tmp_path):
    estimator = briefly_trained((("decoder", "bahdanau"),))
    directory = export_estimator(estimator, tmp_path / "model", beam_size=beam_size)
    _, _, _, decode = sessions(directory)
    for B in (1, 2, 3):  # beam search starts two or more items on one row each
        src, lengths = digit_sources(B, 5, seed=B)
        for max_length in (0, -1):
            tokens, out_lengths, attention, _ = run_decode(decode, src, lengths, max_length, 1.0)
            assert tokens.shape == (B, 0) and attention.shape == (B, 0, 5)
            assert out_lengths.tolist() == [0] * B


def test_beam_scores_are_length_normalised_log_probabilities(tmp_path):
    """The score of each result is its summed log-probability / length ** alpha, recomputed
    here from the step graph by teacher forcing the graph's own tokens."""
    directory = export(make_module(seed=1), tmp_path / "m", beam_size=4, length_penalty=0.5)
    manifest, encoder, decoder, decode = sessions(directory)
    src, lengths = random_source(6, 7, np.random.default_rng(0))
    tokens, out_lengths, _, scores = run_decode(decode, src, lengths, 10, 1.0)
    carry = dict(zip(manifest.encoder_outputs(), encoder.run(None, {"src": src,
                 "src_lengths": lengths}), strict=True))  # fmt: skip
    for row in range(src.shape[0]):
        n = int(out_lengths[row])
        item = {name: value[row : row + 1] for name, value in carry.items()}
        y, total = 1, 0.0
        ended = n < 10
        targets = [*tokens[row, :n].tolist(), *([2] if ended else [])]
        for position, target in enumerate(targets):
            feeds = {"y_prev": np.array([y]), **item, "temperature": np.array(1.0, np.float32),
                     "position": np.array(position)}  # fmt: skip
            log_probs, *states, _ = decoder.run(None, feeds)
            item.update(zip(manifest.state_names, states, strict=True))
            total += float(log_probs[0, target])
            y = target
        assert scores[row] == pytest.approx(total / len(targets) ** 0.5, abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_results_do_not_depend_on_the_batch(beam_size, tmp_path):
    directory = export(make_module(seed=2), tmp_path / "m", beam_size=beam_size)
    _, _, _, decode = sessions(directory)
    src, lengths = random_source(10, 9, np.random.default_rng(4))
    together = run_decode(decode, src, lengths, 12, 1.0)
    for row in (0, 4, 9):
        n = int(lengths[row])
        alone = run_decode(decode, src[row : row + 1, :n], lengths[row : row + 1], 12, 1.0)
        k = int(alone[1][0])
        assert together[1][row] == k
        assert together[0][row, :k].tolist() == alone[0][0, :k].tolist()
        np.testing.assert_allclose(together[2][row, :k, :n], alone[2][0, :k], atol=1e-6)
        assert together[3][row] == pytest.approx(alone[3][0], abs=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("B", [1, 5])
def test_a_search_of_one_step(beam_size, B, tmp_path):
    directory = export(make_module(seed=4), tmp_path / "m", beam_size=beam_size)
    manifest, encoder, decoder, decode = sessions(directory)
    src, lengths = random_source(B, 6, np.random.default_rng(B))
    expected = reference_search(encoder, decoder, manifest, src, lengths, 1, 1.0)
    outputs = run_decode(decode, src, lengths, 1, 1.0)
    assert compare_with_search(expected, *outputs) == []
    assert outputs[0].shape == (B, 1)


@pytest.mark.parametrize("B", [1, 8])
def test_a_long_beam_search_reads_every_item_back_from_its_history(B, tmp_path):
    """The graph keeps each step's parents, tokens and attention rows once and walks back from
    each item's best id at the end (a search that copied every beam's rows at each step took
    25 s for 4,096 tokens). Over 300 steps, beams reordered at each, and for 8 items some
    stopping early (segments of several sizes before the long one), the walk gives the NumPy
    search's answers. EOS is made less likely until some item runs to the limit (the shift at
    which that happens depends on the briefly trained weights, so it is found, not fixed)."""
    src, lengths = digit_sources(B, 12, seed=11)
    for shift in np.arange(1.0, 3.01, 0.1):
        estimator = copy.deepcopy(briefly_trained((("decoder", "luong"), ("scorer", "general"))))
        with torch.no_grad():
            estimator.module_.decoder.output.bias[EOS] -= shift
        directory = export_estimator(
            estimator, tmp_path / f"model{shift:.1f}", beam_size=4, length_penalty=0.3
        )
        manifest, encoder, decoder, decode = sessions(directory)
        outputs = run_decode(decode, src, lengths, 300, 1.0)
        if outputs[1].max() == 300:
            break
    assert outputs[1].max() == 300, "no shift made a search run to its limit"
    expected = reference_search(encoder, decoder, manifest, src, lengths, 300, 1.0)
    assert compare_with_search(expected, *outputs) == []
    if B > 1:
        assert len(set(outputs[1].tolist())) >= 2, f"items stop in one segment: {outputs[1]}"


@pytest.mark.parametrize("B", [1, 2, 7])  # the first step on K rows per item, then on one
def test_beam_over_fewer_ids_than_twice_the_beam(B, tmp_path):
    """With V < 2K a first step from one row per item has fewer than 2K extensions."""
    targets = [*SPECIAL_TOKENS, "x"]  # V = 5 < 2K = 8
    torch.manual_seed(3)
    config = ModelConfig(len(SOURCE_VOCABULARY), len(targets), embedding_dim=6, hidden_size=8)
    directory = export_module(
        Seq2SeqModule(config).eval(),
        tmp_path / "m",
        source_vocabulary=SOURCE_VOCABULARY,
        target_vocabulary=targets,
        tokenizer="char",
        beam_size=4,
    )
    manifest, encoder, decoder, decode = sessions(directory)
    src, lengths = random_source(B, 6, np.random.default_rng(B))
    expected = reference_search(encoder, decoder, manifest, src, lengths, 5, 1.0)
    assert compare_with_search(expected, *run_decode(decode, src, lengths, 5, 1.0)) == []


def test_build_refuses_graphs_of_other_signatures(tmp_path):
    directory = export(make_module(), tmp_path / "m")
    manifest = Manifest.from_json((directory / "manifest.json").read_text())
    encoder = onnx.load(directory / "encoder.onnx")
    with pytest.raises(ValueError, match="inputs must name the graph's inputs"):
        build_decode_graph(encoder, encoder, manifest)


def _op_count(graph: onnx.GraphProto, op_type: str) -> int:
    """``op_type`` nodes in ``graph`` and its subgraphs."""
    count = 0
    for node in graph.node:
        count += node.op_type == op_type
        for attribute in node.attribute:
            count += _op_count(attribute.g, op_type) if attribute.g.node else 0
            count += sum(_op_count(g, op_type) for g in attribute.graphs)
    return count


@pytest.mark.parametrize("B", [1, 6])
@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_beams_read_one_memory_per_item_and_a_step_that_cannot_gets_one_per_beam(
    model, B, tmp_path
):
    """The step of a recurrent decoder, or of the Transformer's (its cross-attention reads an
    item's projected keys once for the item's beams), says it reads one memory row per item;
    the beam graph then carries one copy of each item's memory. A step without that entry (an
    artifact written before it) gets the graph that copies the memory per beam, with the same
    answers."""
    if model == "transformer":
        directory = export(make_transformer(), tmp_path / "t", beam_size=3)  # verified
    else:
        kind = dict(decoder="bahdanau", scorer="additive", attention="global")
        estimator = briefly_trained(tuple(sorted(kind.items())))
        directory = export_estimator(estimator, tmp_path / "m", beam_size=3, length_penalty=0.7)
    manifest, *_, decode = sessions(directory)
    encoder = onnx.load(directory / "encoder.onnx")
    step = onnx.load(directory / "decoder_step.onnx")
    assert {p.key: p.value for p in step.metadata_props}[ITEM_MEMORY_KEY] == "1"
    assert reads_item_memory(step)
    del step.metadata_props[:]
    per_row = build_decode_graph(encoder, step, manifest)
    as_exported = onnx.load(directory / DECODE_FILE)
    # per beam: the first step's If copies memory, keys and mask K times for one item
    assert _op_count(per_row.graph, "Gather") > _op_count(as_exported.graph, "Gather")
    per_row_session = ort.InferenceSession(
        per_row.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    src, lengths = digit_sources(B, 9, seed=B)
    got = run_decode(decode, src, lengths, 12, 0.9)
    want = run_decode(per_row_session, src, lengths, 12, 0.9)
    for name, a, b in zip(("tokens", "lengths"), got[:2], want[:2], strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    for a, b in zip(got[2:], want[2:], strict=True):  # the same sums in another order
        np.testing.assert_allclose(a, b, atol=1e-5)


# -- the graph outside Python's skattn: numpy + onnxruntime only -----------------------------

CLIENT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime as ort

    directory, sources = sys.argv[1], json.loads(sys.argv[2])
    manifest = json.load(open(f"{directory}/manifest.json", encoding="utf-8"))
    ids = {token: i for i, token in enumerate(manifest["source_vocabulary"])}
    special = manifest["special_ids"]
    rows = [[ids.get(c, special["unk"]) for c in text] + [special["eos"]] for text in sources]
    src = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for r, row in enumerate(rows):
        src[r, : len(row)] = row
    session = ort.InferenceSession(f"{directory}/decode.onnx", providers=["CPUExecutionProvider"])
    tokens, lengths, attention, scores = session.run(None, {
        "src": src,
        "src_lengths": np.array([len(r) for r in rows], dtype=np.int64),
        "max_length": np.array(manifest["limits"]["max_output_length"], dtype=np.int64),
        "temperature": np.array(manifest["temperature"], dtype=np.float32),
    })
    vocabulary = manifest["target_vocabulary"]
    order = -1 if manifest.get("output_order") == "right_to_left" else 1  # written last first
    out = ["".join(vocabulary[i] for i in tokens[r, :n][::order]) for r, n in enumerate(lengths)]
    rows_sum = [attention[r, :n].sum(axis=1).round(4).tolist() for r, n in enumerate(lengths)]
    imported = sorted(m for m in ("torch", "sklearn", "skattn", "serving", "onnx")
                      if m in sys.modules)
    print(json.dumps({"predictions": out, "row_sums": rows_sum, "imported": imported}))
    """
)


def run_client(directory, sources: list[str]) -> dict:
    """:data:`CLIENT`'s answer for ``sources`` over the artifact in ``directory``."""
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, str(directory), json.dumps(sources)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def reversal_artifact(fitted_reversal, tmp_path_factory):
    return fitted_reversal.export_onnx(tmp_path_factory.mktemp("decode") / "reverser")


def test_a_process_with_only_numpy_and_onnxruntime_gets_the_runtimes_predictions(
    reversal_artifact, reversal_data
):
    sources = [*reversal_data[2][:40], "", "9", "0123456789012"]
    stepwise = serving.load(reversal_artifact, device="cpu", decode_graph=False)
    answer = run_client(reversal_artifact, sources)
    assert answer["imported"] == []
    assert answer["predictions"] == stepwise.predict(sources)
    assert sum(p == s[::-1] for p, s in zip(answer["predictions"], sources, strict=True)) > 30
    assert all(all(abs(s - 1) < 1e-3 for s in sums) for sums in answer["row_sums"])


# -- the runtime's two paths, and the artifact contract --------------------------------------


@pytest.mark.parametrize("beam_size", [1, 4])
def test_runtime_decode_graph_equals_the_step_graphs(fitted_reversal, reversal_data, beam_size,
                                                     tmp_path):  # fmt: skip
    directory = export_module(
        fitted_reversal.module_,
        tmp_path / "m",
        source_vocabulary=fitted_reversal.source_vocab_.to_list(),
        target_vocabulary=fitted_reversal.target_vocab_.to_list(),
        tokenizer="char",
        beam_size=beam_size,
        max_output_length=20,
    )
    graph = serving.load(directory, device="cpu", intra_op_num_threads=1)
    steps = serving.load(directory, device="cpu", intra_op_num_threads=1, decode_graph=False)
    assert (graph.decode_graph, steps.decode_graph) == (True, False)
    sources = [*reversal_data[2][:60], "", "55555555555555555555555"]
    got, got_attention = graph.predict_batch(sources, temperature=0.8, with_attention=True)
    want, want_attention = steps.predict_batch(sources, temperature=0.8, with_attention=True)
    assert got == want
    for a, b in zip(got_attention, want_attention, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5)


def drop_decode_graph(directory):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["files"][DECODE_FILE]
    path.write_text(json.dumps(manifest))
    (directory / DECODE_FILE).unlink()


def test_an_artifact_without_decode_graph_loads_on_the_step_graphs(reversal_artifact, tmp_path):
    copy = shutil.copytree(reversal_artifact, tmp_path / "model")
    drop_decode_graph(copy)
    runtime = serving.load(copy, device="cpu")
    assert runtime.decode_graph is False
    assert runtime.predict(["123"]) == serving.load(reversal_artifact).predict(["123"])
    with pytest.raises(ArtifactError, match="decode_graph=True"):
        serving.load(copy, device="cpu", decode_graph=True)


def test_a_damaged_decode_graph_is_named(reversal_artifact, tmp_path):
    copy = shutil.copytree(reversal_artifact, tmp_path / "model")
    data = bytearray((copy / DECODE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / DECODE_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"decode\.onnx: checksum mismatch"):
        serving.load(copy, device="cpu")


def test_a_decode_graph_of_another_model_is_refused(reversal_artifact, tmp_path):
    other = export(make_module(), tmp_path / "other")
    copy = shutil.copytree(reversal_artifact, tmp_path / "model")
    shutil.copy(other / DECODE_FILE, copy / DECODE_FILE)
    path = copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"][DECODE_FILE] = json.loads((other / "manifest.json").read_text())["files"][
        DECODE_FILE
    ]
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="exported for other vocabularies"):
        serving.load(copy, device="cpu")


class CountingSession:
    def __init__(self, session):
        self.session, self.calls = session, 0

    def run(self, *args):
        self.calls += 1
        return self.session.run(*args)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_chunks_of_every_size_run_on_the_decode_graph(fitted_reversal, beam_size, tmp_path):
    directory = export_estimator(fitted_reversal, tmp_path / "m", beam_size=beam_size)
    runtime = serving.load(directory, device="cpu", intra_op_num_threads=1, max_batch_size=64)
    session = runtime.translator.session = CountingSession(runtime.translator.session)
    runtime.predict(["123"])
    runtime.predict(["123", "4567"] * 32)
    runtime.predict(["12"] * 65)  # two chunks
    assert session.calls == 4


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_step_without_a_finite_log_probability_ends_the_items(beam_size, tmp_path):
    """A model whose log-probabilities are NaN (here a NaN output bias) emits nothing, with a
    score of 0, in both searches: never PAD (id 0, where argmax lands) until max_length."""
    module = make_module(seed=5)
    with torch.no_grad():
        module.decoder.output.bias[5] = float("nan")
    directory = export(module, tmp_path / "m", beam_size=beam_size)
    manifest, encoder, decoder, decode = sessions(directory)
    src, lengths = random_source(4, 6, np.random.default_rng(1))
    expected = reference_search(encoder, decoder, manifest, src, lengths, 5, 1.0)
    outputs = run_decode(decode, src, lengths, 5, 1.0)
    assert compare_with_search(expected, *outputs) == []
    assert [h.tokens for h in expected] == [[]] * 4
    assert outputs[1].tolist() == [0] * 4
    assert outputs[3].tolist() == [0.0] * 4
