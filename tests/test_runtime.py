"""serving: the onnxruntime runtime equals Seq2Seq.predict, and bad artifacts fail clearly.

Models are tiny and trained for a few dozen steps on string reversal: parity needs models whose
outputs vary with the input (a few hundred sources give dozens of distinct
predictions), not good ones. The test sources include the empty string, characters never seen
in training, and lengths more than twice the longest training source.
"""

import copy
import json
import logging
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tampering import weights_to_an_external_file

import serving
from serving import backends, sessions
from serving.artifact import ArtifactError, read_artifact
from serving.layout import default_chunk_items
from serving.runtime import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    TRIAL_WIDTH,
    Runtime,
    session_options,
    trial_sources,
)
from skattn import Seq2Seq
from skattn.core.inference import STEP_LOGITS, Translator, _whole_groups
from skattn.core.manifest import FORMAT_VERSION, binding_digest, sha256_file
from skattn.core.text import BOS

ALPHABET = list("abcdef")


def reversal_pairs(n: int, seed: int, min_length: int, max_length: int):
    rng = np.random.default_rng(seed)
    X = [
        "".join(rng.choice(ALPHABET, size=rng.integers(min_length, max_length + 1)))
        for _ in range(n)
    ]
    return X, [x[::-1] for x in X]


X_TRAIN, Y_TRAIN = reversal_pairs(64, seed=0, min_length=1, max_length=6)
_sources, _ = reversal_pairs(240, seed=1, min_length=0, max_length=15)
# Every fifth source holds characters never seen in training (-> <unk>).
SOURCES = [s + "zé" if i % 5 == 0 else s for i, s in enumerate(_sources)]

FIT_PARAMS = dict(
    embedding_dim=8,
    hidden_size=16,
    window=3,
    batch_size=16,
    max_steps=30,
    # 0.03 trained a local-p LSTM whose decoding is chaotic: float32 rounding differences
    # between torch and onnxruntime (5e-7 at the first step) grew 1.7x per step to 1e-4 by the
    # twelfth. At 0.02 they stay below 4e-7 at every step, so 1e-4 checks the graphs, not luck.
    learning_rate=0.02,
    lr_schedule="constant",  # the rate above was chosen for it (the default cosine halves it)
    early_stopping=False,
    max_output_length=12,
    device="cpu",
    random_state=0,
)

#: A Transformer of FIT_PARAMS' sizes: the RNN-only settings there (embedding_dim, window) back
#: at their defaults, which a Transformer requires.
TRANSFORMER_PARAMS = dict(
    encoder="transformer", decoder="transformer", num_heads=2, embedding_dim=64, window=10
)

KINDS = [
    dict(decoder=decoder, attention=attention, scorer=scorer)
    for decoder in ("bahdanau", "luong")
    for attention in ("global", "local-m", "local-p")
    for scorer in ("dot", "general", "additive", "scaled_dot")
] + [
    dict(decoder="bahdanau", attention="none"),
    dict(decoder="luong", attention="none"),
    dict(decoder="luong", attention="global", scorer="general", input_feeding=False),
    dict(decoder="luong", attention="local-p", scorer="additive", cell="lstm"),
]


def kind_id(kind: dict) -> str:
    return "-".join(str(v) for v in kind.values())


def fit(X=X_TRAIN, y=Y_TRAIN, **params) -> Seq2Seq:
    return Seq2Seq(**{**FIT_PARAMS, **params}).fit(X, y)


def load(directory, **options):
    """One intra-op thread: tiny graphs on a shared 2-core machine run fastest that way."""
    return serving.load(directory, **{"device": "cpu", "intra_op_num_threads": 1, **options})


def assert_same_attention(expected: list, actual: list) -> None:
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.fixture(scope="module")
def fitted() -> Seq2Seq:
    return fit()


@pytest.fixture(scope="module")
def artifact(fitted, tmp_path_factory):
    return fitted.export_onnx(tmp_path_factory.mktemp("artifact") / "reverser")


@pytest.fixture(scope="module")
def runtime(artifact):
    return load(artifact)


# -- parity with the estimator --------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        kind if i == 0 else pytest.param(kind, marks=pytest.mark.slow)
        for i, kind in enumerate(KINDS)
    ],
    ids=kind_id,
)
def test_predictions_and_attention_equal_the_estimator(kind, tmp_path):
    estimator = fit(**kind)
    runtime = load(estimator.export_onnx(tmp_path / "model"))

    expected = estimator.predict(SOURCES)
    assert len(set(expected)) > 20, "the model must not be degenerate for parity to mean much"
    assert runtime.predict(SOURCES) == expected
    assert_same_attention(estimator.predict_attention(SOURCES), runtime.predict_attention(SOURCES))


@pytest.mark.parametrize(
    "kind",
    [
        dict(decoder="bahdanau", attention="global", scorer="additive"),
        dict(decoder="luong", attention="local-m", scorer="dot", cell="lstm"),
    ],
    ids=kind_id,
)
def test_beam_search_equals_the_estimator(kind, tmp_path):
    estimator = fit(beam_size=3, length_penalty=0.7, **kind)
    runtime = load(estimator.export_onnx(tmp_path / "model"))
    sources = SOURCES[:80]
    assert runtime.predict(sources) == estimator.predict(sources)
    assert_same_attention(estimator.predict_attention(sources), runtime.predict_attention(sources))


@pytest.mark.parametrize(
    "kind",
    [
        dict(decoder="bahdanau", scorer="additive"),
        dict(decoder="luong", scorer="general", cell="lstm"),
    ],
    ids=kind_id,
)
def test_expanded_step_cells_equal_the_estimator(kind, tmp_path):
    """From the width STEP_CELLS_EXPANDED_FROM names the step's cells are products and gates
    in the artifact: the decode graph and the step graphs still give the estimator's answers."""
    from skattn.export import STEP_CELLS_EXPANDED_FROM

    hidden = STEP_CELLS_EXPANDED_FROM["greedy"]
    estimator = fit(hidden_size=hidden, learning_rate=0.005, **kind)
    directory = estimator.export_onnx(tmp_path / "model")
    step_types = {node.op_type for node in onnx.load(directory / "decoder_step.onnx").graph.node}
    assert not step_types & {"GRU", "LSTM"}
    sources = SOURCES[:80]
    for beam_size in (1, 3):
        if beam_size > 1:
            estimator.set_params(beam_size=beam_size)
            directory = estimator.export_onnx(tmp_path / f"beam{beam_size}")
        expected = estimator.predict(sources)
        assert len(set(expected)) > 20, "the model must not be degenerate for parity to mean much"
        attention = estimator.predict_attention(sources)
        for decode_graph in (True, False):
            runtime = load(directory, decode_graph=decode_graph)
            assert runtime.predict(sources) == expected, (beam_size, decode_graph)
            assert_same_attention(attention, runtime.predict_attention(sources))


def test_token_list_targets_give_token_lists(tmp_path):
    X = [" ".join(x) for x in X_TRAIN]  # space-separated tokens
    y = [list(t) for t in Y_TRAIN]
    estimator = fit(X, y, tokenizer="space")
    runtime = load(estimator.export_onnx(tmp_path / "model"))
    sources = [" ".join(s) for s in SOURCES[:60]]
    predictions = runtime.predict(sources)
    assert all(isinstance(p, list) for p in predictions)
    assert predictions == estimator.predict(sources)


def test_temperature_per_call_equals_the_estimator_at_that_temperature(fitted, runtime):
    sources = SOURCES[:100]
    estimator = copy.deepcopy(fitted).set_params(temperature=0.25)
    sharp = runtime.predict_attention(sources, temperature=0.25)
    assert runtime.predict(sources, temperature=0.25) == estimator.predict(sources)
    assert_same_attention(estimator.predict_attention(sources), sharp)
    default = runtime.predict_attention(sources)
    assert any(
        a.shape != b.shape or not np.allclose(a, b) for a, b in zip(sharp, default, strict=True)
    )


def test_results_do_not_depend_on_batch_composition(runtime):
    sources = SOURCES[:40]
    together, attention = runtime.predict_batch(sources, with_attention=True)
    alone = [runtime.predict_batch([s], with_attention=True) for s in sources]
    assert together == [p[0] for p, _ in alone]
    assert_same_attention(attention, [a[0] for _, a in alone])
    backwards, attention_backwards = runtime.predict_batch(sources[::-1], with_attention=True)
    assert backwards[::-1] == together
    assert_same_attention(attention, attention_backwards[::-1])


def test_chunked_batches_and_io_binding_give_the_same_results(artifact, runtime):
    expected, attention = runtime.predict_batch(SOURCES, with_attention=True)
    for other in (
        load(artifact, max_batch_size=7),
        load(artifact, io_binding=True),  # the CUDA code path, on CPU
    ):
        got, got_attention = other.predict_batch(SOURCES, with_attention=True)
        assert got == expected
        assert_same_attention(attention, got_attention)


@pytest.mark.parametrize("max_batch_size", [1, 7, 64])
@pytest.mark.parametrize("workers", [2, 3])
def test_chunks_decoded_side_by_side_give_the_same_results(
    artifact, runtime, workers, max_batch_size
):
    expected, attention = runtime.predict_batch(SOURCES, with_attention=True)
    other = load(artifact, workers=workers, max_batch_size=max_batch_size)
    assert other.workers == other.translator.workers == other.step_translator.workers == workers
    got, got_attention = other.predict_batch(SOURCES, with_attention=True)
    assert got == expected
    assert_same_attention(attention, got_attention)
    assert other.predict(SOURCES[:1]) == expected[:1]
    assert other.predict([]) == []


@pytest.mark.parametrize("decode_graph", [False, True])
def test_beam_search_in_several_workers_equals_one_worker(tmp_path, decode_graph):
    """Beam chunks side by side, on the step graphs (the NumPy search) and on decode.onnx."""
    estimator = fit(beam_size=3, decoder="luong", attention="local-p", scorer="general")
    directory = estimator.export_onnx(tmp_path / "model")
    sources = SOURCES[:60]
    one = load(directory, workers=1, decode_graph=decode_graph, max_batch_size=256)
    several = load(directory, workers=3, decode_graph=decode_graph, max_batch_size=16)
    expected, attention = one.predict_batch(sources, with_attention=True)
    got, got_attention = several.predict_batch(sources, with_attention=True)
    assert got == expected == estimator.predict(sources)
    assert_same_attention(attention, got_attention)


def test_the_workers_decode_in_several_threads_at_once(artifact, monkeypatch):
    """Two chunks are under way together: the second starts before the first has ended."""
    runtime = load(artifact, workers=2, decode_graph=False)
    barrier = threading.Barrier(2, timeout=10)
    threads = set()
    encode = runtime.backend.encode

    def meeting_encode(src, src_lengths):
        threads.add(threading.get_ident())
        barrier.wait()  # times out (BrokenBarrierError) unless both chunks are encoding at once
        return encode(src, src_lengths)

    monkeypatch.setattr(runtime.backend, "encode", meeting_encode)
    assert len(runtime.predict(SOURCES[:10])) == 10
    assert len(threads) == 2


_FORKED = {}


def _predict_in_child(queue) -> None:
    queue.put(_FORKED["runtime"].predict(SOURCES[:20]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_decodes_with_workers_of_its_own(artifact):
    """The parent's worker threads are gone in a child forked after they started; the child
    starts its own instead of waiting for ever on the parent's."""
    runtime = load(artifact, workers=2)
    expected = runtime.predict(SOURCES[:20])  # the parent's pool is up
    _FORKED["runtime"] = runtime
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_predict_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == expected
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        _FORKED.clear()


def test_default_chunks_hold_about_the_same_floats_whatever_the_width(artifact):
    assert default_chunk_items(512) == 64  # a bi-GRU 256 model: memory 256 + keys 256
    assert default_chunk_items(128) == 256  # hidden 64
    assert default_chunk_items(1024) == 32  # an ensemble of two bi-GRU 256 models
    assert default_chunk_items(10) == 256 and default_chunk_items(10**6) == 16  # the bounds
    assert default_chunk_items(None) == 64  # a graph with a symbolic width
    runtime = serving.load(artifact, device="cpu")
    carry = runtime.backend.encode(np.array([[4, 2]]), np.array([2]))
    width = carry["memory"].shape[-1] + carry["keys"].shape[-1]
    assert runtime.translator.max_batch_size == default_chunk_items(width)
    assert serving.load(artifact, device="cpu", max_batch_size=5).translator.max_batch_size == 5
    for bad in (0, -1, 2.5, "64"):
        with pytest.raises(ValueError, match="max_batch_size"):
            serving.load(artifact, device="cpu", max_batch_size=bad)


def test_chunk_count_cuts_for_the_limit_and_for_every_worker():
    def count(n, max_batch_size, workers):
        translator = Translator(None, None, None, "char", "str", max_batch_size, workers)
        return translator.chunk_count(n)

    assert count(256, 64, 1) == 4
    assert count(257, 64, 1) == 5
    assert count(10, 64, 1) == 1
    assert count(10, 64, 2) == 2  # a small call still keeps both workers busy
    assert count(1, 64, 2) == 1
    assert count(300, 64, 2) == 5
    assert count(3, 1, 4) == 3
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="workers"):
            Translator(None, None, None, "char", "str", 64, bad)


def test_chunks_hold_a_bounded_number_of_log_probabilities_a_step():
    """Chunks were cut by max_batch_size alone: a 70,000-token model at beam 4 took 2.2-2.6 GB
    a step in chunks of 256 (the estimator, the ensemble and the runtime alike)."""
    translator = Translator(None, None, None, "char", "str", 256, 1)
    assert translator.chunk_count(256, 4 * 70_000) == math.ceil(256 / 14)  # 14 items a chunk
    assert translator.chunk_count(3, 2**23 * 64) == 3  # never below one item
    assert translator.chunk_count(256, 5 * 43) == 1  # a G2P model: max_batch_size decides
    assert STEP_LOGITS == 2**22


def test_cores_go_to_workers_unless_threads_are_asked_for(artifact, monkeypatch):
    monkeypatch.setattr("serving.layout.usable_cores", lambda: 4)
    default = serving.load(artifact, device="cpu")
    assert default.workers == 4
    assert default.backend.decoder.get_session_options().intra_op_num_threads == 1
    threads = serving.load(artifact, device="cpu", intra_op_num_threads=3)
    assert threads.workers == 1
    assert threads.backend.decoder.get_session_options().intra_op_num_threads == 3
    shared = serving.load(artifact, device="cpu", workers=2)  # one thread a worker
    assert shared.workers == 2
    assert shared.backend.decoder.get_session_options().intra_op_num_threads == 1
    both = serving.load(artifact, device="cpu", workers=2, intra_op_num_threads=2)
    assert both.workers == 2
    assert both.backend.decoder.get_session_options().intra_op_num_threads == 2
    assert serving.load(artifact, device="cpu", io_binding=True).workers == 1
    with pytest.raises(ValueError, match="workers=2: IO binding.*io_binding=False"):
        serving.load(artifact, device="cpu", io_binding=True, workers=2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="workers"):
            serving.load(artifact, device="cpu", workers=bad)


def test_io_binding_beam_search_equals_the_numpy_backend(tmp_path):
    estimator = fit(beam_size=2, decoder="luong", attention="local-p", scorer="general")
    directory = estimator.export_onnx(tmp_path / "model")
    plain = load(directory, io_binding=False)
    bound = load(directory, io_binding=True)
    sources = SOURCES[:60]
    assert bound.predict(sources) == plain.predict(sources) == estimator.predict(sources)
    assert_same_attention(plain.predict_attention(sources), bound.predict_attention(sources))


def per_row(backend):
    """The same backend with a step that reads one memory row per row (an artifact exported
    before ``ITEM_MEMORY_KEY``)."""
    other = copy.copy(backend)
    other.item_memory = False
    return other


def stepped(backend, carry):
    """The carry a step ran on (its memory, keys and mask as the graph read them)."""
    y_prev = np.full(len(carry["origin"]), BOS, dtype=np.int64)
    log_probs, after, _ = backend.step(y_prev, carry, 1, 1.0)
    return log_probs, after


def test_a_step_reads_one_copy_of_an_items_memory_for_its_beams(runtime):
    """Where every item has the same number of rows side by side, a step reads one memory
    row per item: beams neither copy it nor change the answer."""
    backend = runtime.backend
    assert backend.item_memory
    carry = backend.encode(np.array([[4, 5, 2], [6, 2, 0], [7, 8, 2]]), np.array([3, 2, 3]))
    beams = backend.select(carry, np.repeat(np.arange(3), 3))  # 3 beams an item
    for name in ("memory", "keys", "mask"):
        assert beams[name] is carry[name]  # a select leaves them
    log_probs, after = stepped(backend, beams)
    for name in ("memory", "keys", "mask"):
        assert after[name] is carry[name]  # read once an item, not copied
    expected, copied = stepped(per_row(backend), beams)
    np.testing.assert_array_equal(copied["memory"], np.repeat(carry["memory"], 3, axis=0))
    np.testing.assert_allclose(log_probs, expected, atol=1e-6)
    np.testing.assert_allclose(after["hidden"], copied["hidden"], atol=1e-6)  # summed apart

    reordered = backend.select(after, np.array([2, 0, 1, 5, 3, 4, 8, 6, 7]))
    assert stepped(backend, reordered)[1]["memory"] is carry["memory"]
    ended = stepped(backend, backend.select(after, np.arange(3, 9)))[1]  # the first item ended
    assert np.shares_memory(ended["memory"], carry["memory"])
    np.testing.assert_array_equal(ended["memory"], carry["memory"][1:])
    middle = stepped(backend, backend.select(after, np.array([0, 1, 6, 7])))[1]
    np.testing.assert_array_equal(middle["memory"], carry["memory"][[0, 2]])  # items, not beams
    unequal = np.array([0, 1, 2, 3, 4])  # 3 beams and 2: one memory row a row
    log_probs, uneven = stepped(backend, backend.select(after, unequal))
    np.testing.assert_array_equal(uneven["memory"], carry["memory"][[0, 0, 0, 1, 1]])
    expected, _ = stepped(per_row(backend), backend.select(after, unequal))
    np.testing.assert_allclose(log_probs, expected, atol=1e-6)

    merged = backend.merge(after, backend.encode(np.array([[7, 2]]), np.array([2])))
    np.testing.assert_array_equal(merged["origin"], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    np.testing.assert_array_equal(merged["held"], [0, 1, 2, 3])
    assert len(stepped(backend, merged)[1]["memory"]) == 10  # the new item has one row: per row


@pytest.mark.parametrize("widths", [(3, 5), (5, 3), (4, 4)])
def test_merge_pads_the_source_axis_of_either_side_with_zeros(runtime, widths):
    """Merged carries hold each side's memory, keys and mask zero-padded (False in the mask)
    to the longer source, the state rows stacked, and the merged step answers as each alone."""
    backend = runtime.backend
    rng = np.random.default_rng(0)
    sides = []
    for rows, width in zip((2, 3), widths, strict=True):
        src = rng.integers(4, 9, size=(rows, width))
        src[:, -1] = 2  # every source ends at the end of its row: no padding of its own
        sides.append(backend.encode(src, np.full(rows, width)))
    merged = backend.merge(*sides)
    width = max(widths)
    for name in ("memory", "keys", "mask"):
        expected = np.concatenate(
            [
                np.pad(
                    side[name],
                    [(0, 0), (0, width - side[name].shape[1])] + [(0, 0)] * (side[name].ndim - 2),
                )
                for side in sides
            ]
        )
        assert merged[name].dtype == sides[0][name].dtype
        np.testing.assert_array_equal(merged[name], expected)
    np.testing.assert_array_equal(merged["hidden"], np.concatenate([s["hidden"] for s in sides]))
    log_probs, _ = stepped(backend, merged)
    alone = np.concatenate([stepped(backend, side)[0] for side in sides])
    np.testing.assert_allclose(log_probs, alone, atol=1e-6)


def test_io_binding_gathers_the_memory_only_when_a_step_reads_other_rows(artifact, runtime):
    """The device carry: a select gathers the state's rows only; a step reads one memory row
    per item for equal beams, and the memory is gathered when items end or counts differ."""
    bound = load(artifact, io_binding=True).backend
    src, lengths = np.array([[4, 5, 2], [6, 2, 0], [7, 8, 2]]), np.array([3, 2, 3])
    carry = bound.encode(src, lengths)
    plain = runtime.backend.encode(src, lengths)
    beams = np.repeat(np.arange(3), 3)
    log_probs, after = stepped(bound, bound.select(carry, beams))
    assert after["memory"] is carry["memory"]  # one row per item: nothing gathered
    expected, _ = stepped(per_row(runtime.backend), runtime.backend.select(plain, beams))
    np.testing.assert_allclose(log_probs, expected, atol=1e-6)
    for rows, items in (([0, 1, 6, 7], [0, 2]), ([0, 1, 2, 3, 4], [0, 0, 0, 1, 1])):
        _, taken = stepped(bound, bound.select(after, np.array(rows)))
        for name in ("memory", "keys", "mask"):
            np.testing.assert_array_equal(taken[name].numpy(), plain[name][items])


def test_an_n_best_lists_candidates_read_one_copy_of_their_sources_memory(artifact, runtime):
    """log_likelihood keeps a source's candidates in one chunk where they fit, so a step reads
    one memory row for all of them (an even split of 120 pairs in 12 chunks of 10 would cut
    lists of 3 in most chunks)."""
    scorer = load(artifact, max_batch_size=10, workers=1)
    backend, rows_read = scorer.backend, []
    lined_up = backend._lined_up

    def recording(carry):
        lined = lined_up(carry)
        rows_read.append((len(lined["origin"]), len(lined["held"])))
        return lined

    backend._lined_up = recording
    sources = [source for source in list(dict.fromkeys(SOURCES))[:40] for _ in range(3)]
    outputs = [source[::-1][: 1 + i % 5] for i, source in enumerate(sources)]  # 3 per source
    scores = scorer.log_likelihood(sources, outputs)
    assert rows_read and all(n == 3 * held for n, held in rows_read)
    per_row_scorer = load(artifact, max_batch_size=10, workers=1)
    per_row_scorer.backend.item_memory = False
    np.testing.assert_allclose(scores, per_row_scorer.log_likelihood(sources, outputs), rtol=1e-5)
    np.testing.assert_allclose(scores, runtime.log_likelihood(sources, outputs), rtol=1e-5)


def test_chunks_keep_runs_of_one_source_whole_where_they_fit():
    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = rng.integers(1, 12, size=rng.integers(1, 30))
        keys = [[int(k)] for k, size in enumerate(sizes) for _ in range(size)]
        order = np.arange(len(keys)) * 7
        count = int(rng.integers(1, len(keys) + 1))
        chunks = _whole_groups(order, keys, count)
        np.testing.assert_array_equal(np.concatenate(chunks), order)  # all, in order, once
        assert count <= len(chunks) <= 1.25 * count
        assert max(len(chunk) for chunk in chunks) <= math.ceil(len(keys) / count)
        split = np.array_split(order, count)  # where packing would make fewer chunks
        if [len(c) for c in chunks] == [len(c) for c in split]:
            continue
        for cut in np.cumsum([len(chunk) for chunk in chunks])[:-1]:
            if keys[cut] == keys[cut - 1]:  # a run is cut only where it is longer than a chunk
                assert keys.count(keys[cut]) > math.ceil(len(keys) / count)


@pytest.mark.parametrize(
    "rows, view",
    [
        ([3, 4, 5, 6, 7, 8], True),  # the first item ended: the rest is a view
        ([2, 1, 0, 5, 4, 3], True),  # the last ended, the others reordered
        ([1, 0, 5, 4, 3], True),  # the first item lost a beam
        ([3, 4, 5], True),  # only the middle item is left
        ([0, 1, 2, 6, 7, 8], False),  # the middle item ended: copied
        ([0, 3, 6], False),  # one beam of each
        ([3, 3, 3, 4, 4, 4], False),  # repeated
    ],
)
def test_a_per_row_step_reads_a_view_of_the_memory_when_items_end_at_either_edge(
    runtime, rows, view
):
    """A step that reads one memory row per row: an item's beams reordered among themselves
    keep the memory as it is, items that end first or last leave a view of the rest, and any
    other select copies the rows the step reads. Every row reads its own source's memory."""
    backend = per_row(runtime.backend)
    carry = backend.encode(np.array([[4, 5, 2], [6, 2, 0], [7, 8, 2]]), np.array([3, 2, 3]))
    _, beams = stepped(backend, backend.select(carry, np.repeat(np.arange(3), 3)))
    np.testing.assert_array_equal(beams["memory"], np.repeat(carry["memory"], 3, axis=0))
    _, reordered = stepped(backend, backend.select(beams, np.array([2, 0, 1, 5, 3, 4, 8, 6, 7])))
    assert reordered["memory"] is beams["memory"]  # not copied
    _, taken = stepped(backend, backend.select(beams, np.array(rows)))
    for name in ("memory", "keys", "mask", "origin"):
        np.testing.assert_array_equal(taken[name], beams[name][rows])
    for name in ("memory", "keys", "mask"):
        assert np.shares_memory(taken[name], beams[name]) == view


def test_attention_maps_have_one_row_per_token_and_sum_to_one(runtime):
    predictions, attentions = runtime.predict_batch(SOURCES[:50], with_attention=True)
    for source, prediction, weights in zip(SOURCES[:50], predictions, attentions, strict=True):
        assert weights.shape == (len(prediction), len(source) + 1)
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-5)


# -- inputs ---------------------------------------------------------------------------------


def test_empty_input_gives_empty_results(runtime):
    assert runtime.predict([]) == []
    assert runtime.predict_attention([]) == []
    assert runtime.predict_batch([], with_attention=True) == ([], [])
    assert runtime.predict_batch([]) == ([], None)


@pytest.mark.parametrize(
    "sources",
    [
        ["abc", 3], ["abc", None], [b"abc"], "abc", b"abc", 5, {"abc": 1}, iter(["a"]),
        {"abc", "fed"}, frozenset(["abc"]), np.array("abc"),  # no order, or not a sequence
    ],
)  # fmt: skip
def test_non_string_inputs_raise(runtime, sources):
    with pytest.raises(ValueError, match="sources"):
        runtime.predict(sources)


def test_any_sized_collection_of_str_is_accepted(runtime):
    expected = runtime.predict(["abc", "fed"])
    assert runtime.predict(("abc", "fed")) == expected
    assert runtime.predict(np.array(["abc", "fed"])) == expected


@pytest.mark.parametrize("flag", ["decode_graph", "io_binding"])
@pytest.mark.parametrize("value", [0, 1, "no", "False", 1.0])
def test_flags_other_than_bools_are_refused(artifact, flag, value):
    with pytest.raises(ValueError, match=f"{flag} must be True, False or None"):
        load(artifact, **{flag: value})


def test_numpy_bools_are_flags(artifact, runtime):
    steps = load(artifact, decode_graph=np.False_)
    assert steps.decode_graph is False
    assert steps.predict(["abc", "fed"]) == runtime.predict(["abc", "fed"])
    assert load(artifact, io_binding=np.bool_(False)).io_binding is False


@pytest.mark.parametrize("threads", [0, 1025, 10**5, 2.0, True])
def test_thread_counts_beyond_1024_are_refused(artifact, threads):
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        load(artifact, intra_op_num_threads=threads)


@pytest.mark.parametrize("workers", [0, 1025, 10**6, True])
def test_worker_counts_beyond_1024_are_refused(artifact, workers):
    """A worker a chunk: 10**6 workers started a thread for each item of a batch."""
    with pytest.raises(ValueError, match="workers"):
        load(artifact, workers=workers)


def test_a_path_and_a_name_of_the_wrong_type_are_refused(artifact):
    with pytest.raises(ValueError, match="path must be a str or os.PathLike, got NoneType"):
        load(None)
    with pytest.raises(ValueError, match="name must be a str or None, got int"):
        load(artifact, name=5)
    assert load(artifact, name="reverse").name == "reverse"


def test_the_default_name_is_the_folders_as_given_not_a_links_target(artifact, tmp_path):
    link = tmp_path / "served-name"
    link.symlink_to(artifact)
    assert load(link).name == "served-name"  # (it was the target's name)
    (tmp_path / "other").mkdir()
    assert load(tmp_path / "other" / ".." / "served-name" / ".").name == "served-name"


def test_an_empty_batch_gets_empty_answers(runtime):
    """The runtime answers a batch of no items (a server's); the estimator refuses an empty X."""
    assert runtime.predict([]) == []
    assert list(runtime.predict_attention(())) == []


def test_check_source(runtime):
    runtime.check_source("")
    runtime.check_source("a" * runtime.max_source_length)
    with pytest.raises(ValueError, match="max_source_length"):
        runtime.check_source("a" * (runtime.max_source_length + 1))
    with pytest.raises(ValueError, match="str"):
        runtime.check_source(["a"])


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), 1e39, "1", True])
def test_bad_temperature_raises(runtime, temperature):
    with pytest.raises(ValueError, match="temperature"):
        runtime.predict(["abc"], temperature=temperature)


# -- the runtime object ---------------------------------------------------------------------


def test_runtime_describes_itself(runtime, fitted):
    assert runtime.name == "reverser"
    assert runtime.provider == CPU_PROVIDER
    assert runtime.manifest.format_version == 2 == FORMAT_VERSION - 1  # 3: right to left only
    info = runtime.info
    assert (info.name, info.provider, info.output_kind) == ("reverser", CPU_PROVIDER, "str")
    assert info.max_source_length == runtime.max_source_length
    assert runtime.max_source_length >= fitted.max_source_length_
    assert "reverser" in repr(runtime)


def test_the_warm_up_source_holds_every_source_token(runtime, fitted):
    source = runtime.info.warmup_source
    assert sorted(source) == sorted(fitted.source_vocab_.tokens)
    runtime.check_source(source)  # the server can translate it


def test_provider_choice_is_logged(artifact, caplog):
    with caplog.at_level(logging.INFO, logger="serving.runtime"):
        runtime = serving.load(artifact, device="auto", name="named")
    assert runtime.name == "named"
    assert runtime.provider in {CPU_PROVIDER, CUDA_PROVIDER}
    assert any(runtime.provider in record.getMessage() for record in caplog.records)


@pytest.mark.skipif(CUDA_PROVIDER in ort.get_available_providers(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_a_clear_error(artifact):
    with pytest.raises(ValueError, match="CUDA"):
        serving.load(artifact, device="cuda")


def test_cuda_providers_preload_the_cuda_libraries_once(monkeypatch, caplog):
    calls = []

    def preload():
        calls.append(1)
        print("Failed to load libcudart.so.13: not found")  # what onnxruntime prints

    monkeypatch.setattr(ort, "preload_dlls", preload, raising=False)
    sessions.preload_cuda_libraries.cache_clear()
    try:
        assert sessions.providers("cpu", 0) == [CPU_PROVIDER]
        assert calls == []  # the CPU never loads CUDA
        with caplog.at_level(logging.DEBUG, logger="serving.sessions"):
            cuda, cpu = sessions.providers("cuda", 1)
            assert cuda == (CUDA_PROVIDER, {"device_id": "1", "use_tf32": "0"})  # float32 products
            assert cpu == CPU_PROVIDER
            sessions.providers("cuda", 0)
        assert calls == [1]
        assert any("libcudart" in r.getMessage() for r in caplog.records)  # logged, not printed

        def broken():
            raise RuntimeError("Invalid parameter of directory")

        monkeypatch.setattr(ort, "preload_dlls", broken)
        sessions.preload_cuda_libraries.cache_clear()
        assert sessions.preload_cuda_libraries() is False  # best effort: never raises
        monkeypatch.delattr(ort, "preload_dlls")
        sessions.preload_cuda_libraries.cache_clear()
        assert sessions.preload_cuda_libraries() is False  # an onnxruntime older than 1.21
    finally:
        sessions.preload_cuda_libraries.cache_clear()


@pytest.mark.parametrize("device", ["gpu", "cuda:x", None])
def test_unknown_device_raises(artifact, device):
    with pytest.raises(ValueError, match="device"):
        serving.load(artifact, device=device)


def test_session_options_are_set_on_purpose():
    options = session_options(3)
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session_options().intra_op_num_threads >= 1
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="intra_op_num_threads"):
            session_options(bad)


def test_serving_never_imports_torch_or_sklearn(artifact):
    code = (
        "import sys, serving\n"
        f"runtime = serving.load({str(artifact)!r}, device='cpu')\n"
        "prediction = runtime.predict(['abc', 'zz'])\n"
        "runtime.predict_attention(['abc'])\n"
        "assert len(prediction) == 2, prediction\n"
        "heavy = sorted(m for m in ('torch', 'sklearn', 'skattn.estimator', 'skattn.models')\n"
        "               if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# -- bad artifacts --------------------------------------------------------------------------


@pytest.fixture
def copy_of(artifact, tmp_path):
    """A fresh copy of the artifact directory that a test may damage."""
    return shutil.copytree(artifact, tmp_path / "model")


def rewrite_manifest(directory, rebind=False, **changes):
    """Change manifest keys; ``rebind`` also recomputes its binding digest, as a tool that
    rewrote the manifest consistently would (the graphs still hold the old one)."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    if rebind:
        names = ("source_vocabulary", "target_vocabulary", "state_names", "model", "export_id")
        manifest["binding"] = binding_digest(*(manifest[name] for name in names))
    path.write_text(json.dumps(manifest))


def as_format_1(directory, graphs_too=True):
    """Rewrite the artifact as the first format wrote it: no model, binding or export id in
    the manifest, no metadata in the graphs (``graphs_too=False``: the manifest only)."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["model"], manifest["binding"], manifest["export_id"]
    if graphs_too:
        for name in manifest["files"]:
            graph = onnx.load(directory / name)
            del graph.metadata_props[:]
            onnx.save_model(graph, directory / name)
            manifest["files"][name] = sha256_file(directory / name)
    path.write_text(json.dumps({**manifest, "format_version": 1}))


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(ArtifactError, match="no_such_model"):
        serving.load(tmp_path / "no_such_model")


@pytest.mark.parametrize("name", ["manifest.json", "encoder.onnx", "decoder_step.onnx"])
def test_a_missing_file_is_named(copy_of, name):
    (copy_of / name).unlink()
    with pytest.raises(ArtifactError, match=name.replace(".", r"\.")):
        serving.load(copy_of)


def test_a_wrong_checksum_is_named(copy_of):
    path = copy_of / "decoder_step.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"decoder_step\.onnx.*checksum"):
        serving.load(copy_of)


def test_a_newer_format_version_is_refused(copy_of):
    rewrite_manifest(copy_of, format_version=FORMAT_VERSION + 1)
    with pytest.raises(ArtifactError, match=r"manifest\.json.*newer"):
        serving.load(copy_of)


def test_a_truncated_graph_is_named_even_with_a_matching_checksum(copy_of):
    path = copy_of / "encoder.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    files = json.loads((copy_of / "manifest.json").read_text())["files"]
    rewrite_manifest(copy_of, files={**files, "encoder.onnx": sha256_file(path)})
    with pytest.raises(ArtifactError, match=r"encoder\.onnx"):
        serving.load(copy_of)


def test_a_graph_removed_after_the_checks_is_an_artifact_error(copy_of, monkeypatch):
    """An export swapping the graphs moves the old ones out before the new ones in: a reader
    between the two finds a file gone that it has just checked, and must say so as an
    ArtifactError (the error a caller retries on), not a bare FileNotFoundError."""
    artifact = read_artifact(copy_of)
    (copy_of / "decoder_step.onnx").unlink()  # gone after read_artifact checked it
    with pytest.raises(ArtifactError, match=r"decoder_step\.onnx: cannot be read.*load it again"):
        Runtime(artifact)

    import skattn.core.artifact as artifact_module

    hash_file = artifact_module.sha256_file

    def removed_while_hashing(path):  # gone between read_artifact's is_file and its read
        if path.name == "encoder.onnx":
            path.unlink()
        return hash_file(path)

    monkeypatch.setattr(artifact_module, "sha256_file", removed_while_hashing)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx: cannot be read.*load it again"):
        read_artifact(copy_of)


def test_swapped_graphs_are_named(copy_of):
    encoder, decoder = copy_of / "encoder.onnx", copy_of / "decoder_step.onnx"
    encoder_bytes = encoder.read_bytes()
    encoder.write_bytes(decoder.read_bytes())
    decoder.write_bytes(encoder_bytes)
    rewrite_manifest(
        copy_of,
        files={"encoder.onnx": sha256_file(encoder), "decoder_step.onnx": sha256_file(decoder)},
    )
    with pytest.raises(ArtifactError, match=r"encoder\.onnx.*signature"):
        serving.load(copy_of)


def not_a_file(path, kind: str) -> None:
    """Put a folder, a FIFO, a link to /dev/zero or a link to itself in the place of ``path``
    (``kind``; ``"missing"``: nothing)."""
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        path.symlink_to(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "JSON"),
        ("[1, 2]", "object"),
        (json.dumps({"format_version": 1}), "missing key"),
        ('{"format_version": ' + "1" * 5000 + "}", "JSON"),  # past Python's int conversion
        (b"\xff\xfe{}", "cannot be read"),  # not UTF-8
        ("directory", "not a regular file"),
        ("fifo", "not a regular file"),  # open() would wait for a writer forever
        ("/dev/zero", "not a regular file"),  # a read would never end
        ("huge", "larger than 64 MiB"),
    ],
)
def test_a_malformed_manifest_is_named(copy_of, text, message):
    path = copy_of / "manifest.json"
    if text in ("directory", "fifo", "/dev/zero"):
        not_a_file(path, text)
    elif text == "huge":
        with open(path, "wb") as file:  # sparse: no 64 MiB written
            file.truncate((64 << 20) + 1)
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ArtifactError, match=rf"manifest\.json.*{message}"):
        serving.load(copy_of)


@pytest.mark.parametrize("kind", ["directory", "fifo", "/dev/zero", "missing", "loop"])
def test_a_graph_that_is_not_a_regular_file_is_named_as_such(copy_of, kind):
    """A folder, a FIFO or a link to a device read as "missing file"; a FIFO would block."""
    not_a_file(copy_of / "decoder_step.onnx", kind)
    message = {"missing": "missing file listed", "loop": "cannot be read"}.get(
        kind, "not a regular file"
    )
    with pytest.raises(ArtifactError, match=rf"decoder_step\.onnx: {message}"):
        serving.load(copy_of)


def test_a_damaged_graph_the_runtime_does_not_open_is_refused_all_the_same(copy_of):
    """serving.load hashes the graphs as it opens them; decode.onnx, listed but not opened
    with decode_graph=False, is hashed all the same (the README: every listed graph)."""
    with open(copy_of / "decode.onnx", "r+b") as file:
        file.truncate(100)
    with pytest.raises(ArtifactError, match=r"decode\.onnx: checksum mismatch"):
        serving.load(copy_of, decode_graph=False)


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"beam_size": 0}, "beam_size"),
        ({"output_kind": "bytes"}, "output_kind"),
        ({"limits": {"max_source_length": 0, "max_output_length": 5}}, "max_source_length"),
        ({"special_ids": {"pad": 1, "bos": 0, "eos": 2, "unk": 3}}, "special_ids"),
        ({"input_feeding": 1}, "input_feeding"),
        ({"length_penalty": -1.0}, "length_penalty"),
        ({"length_penalty": float("nan")}, "length_penalty"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 1e39}, "temperature"),
        ({"target_vocabulary": ["a", "b", "c", "d", "e"]}, "target_vocabulary.*start with"),
        ({"source_vocabulary": "duplicate"}, "source_vocabulary.*twice"),
        ({"target_vocabulary": "shorter"}, r"manifest\.json.*'binding'"),
        ({"beam_size": 1_000_000}, "beam_size"),
        ({"limits": {"max_source_length": 5, "max_output_length": 10**9}}, "max_output_length"),
    ],
)
def test_bad_manifest_values_are_named(copy_of, changes, key):
    manifest = json.loads((copy_of / "manifest.json").read_text())
    if changes.get("source_vocabulary") == "duplicate":
        changes = {"source_vocabulary": [*manifest["source_vocabulary"], "<unk>"]}
    if changes.get("target_vocabulary") == "shorter":  # than the decoder graph's V
        changes = {"target_vocabulary": manifest["target_vocabulary"][:5]}
    rewrite_manifest(copy_of, **changes)
    with pytest.raises(ArtifactError, match=key):
        serving.load(copy_of)


def test_a_format_1_artifact_still_loads_and_predicts_the_same(copy_of, runtime):
    as_format_1(copy_of)
    old = serving.load(copy_of)
    assert old.manifest.format_version == 1 and old.manifest.model == {}
    assert old.predict(SOURCES[:40]) == runtime.predict(SOURCES[:40])


def test_a_graph_of_a_model_that_differs_only_in_its_weights_is_refused(fitted, copy_of, tmp_path):
    # Same data, same configuration, another random state: the same vocabularies and model
    # hyperparameters, so only the export id (a digest of the weights) tells them apart.
    twin = fit(random_state=1)
    twin.export_onnx(tmp_path / "twin")
    ours, theirs = (
        json.loads((d / "manifest.json").read_text()) for d in (copy_of, tmp_path / "twin")
    )
    assert ours["model"] == theirs["model"] and ours["export_id"] != theirs["export_id"]
    shutil.copy(tmp_path / "twin" / "decoder_step.onnx", copy_of / "decoder_step.onnx")
    files = {**ours["files"], "decoder_step.onnx": sha256_file(copy_of / "decoder_step.onnx")}
    rewrite_manifest(copy_of, files=files)
    with pytest.raises(ArtifactError, match=r"decoder_step\.onnx.*another model"):
        serving.load(copy_of)
    assert (
        fitted.export_onnx(tmp_path / "again")
        and json.loads((tmp_path / "again" / "manifest.json").read_text())["export_id"]
        == ours["export_id"]
    )  # the same weights, the same id


def test_a_manifest_edited_to_another_search_than_decode_onnx_is_refused(copy_of):
    rewrite_manifest(copy_of, beam_size=3)  # the binding leaves decoding settings out
    with pytest.raises(ArtifactError, match=r"decode\.onnx.*beam_size.*1.*decode_graph=False"):
        serving.load(copy_of)
    stepwise = load(copy_of, decode_graph=False)  # the step graphs search as the manifest says
    assert stepwise.info.beam_size == 3
    assert stepwise.predict(SOURCES[:5]) == fit().set_params(beam_size=3).predict(SOURCES[:5])


@pytest.mark.parametrize("changes", [{"tokenizer": "space"}, {"output_kind": "tokens"}])
def test_a_manifest_edited_to_read_or_write_other_text_is_refused(copy_of, changes):
    """Outside the binding, a tokenizer edited to "space" read "1234" as one unknown token
    and answered '1 5' for '2'; "tokens" answered lists. The graphs now say how they read
    and write text (artifacts written before that are not checked)."""
    rewrite_manifest(copy_of, **changes)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx: this graph reads and writes text"):
        serving.load(copy_of)
    as_format_1(copy_of)  # graphs without any metadata: an artifact of before
    assert serving.load(copy_of).info.tokenizer == changes.get("tokenizer", "char")


def test_a_format_version_lowered_to_skip_the_binding_is_refused(copy_of):
    # The graphs carry a binding, which format 1 predates: only an edit gets them together.
    as_format_1(copy_of, graphs_too=False)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx.*carries a binding.*edited"):
        serving.load(copy_of)


def test_a_vocabulary_edited_after_export_is_refused(copy_of):
    # Swapping two target tokens kept every check of the first format and answered
    # "12345" -> "54312": now the manifest's own binding digest refuses it.
    manifest = json.loads((copy_of / "manifest.json").read_text())
    target = manifest["target_vocabulary"]
    target[4], target[5] = target[5], target[4]
    rewrite_manifest(copy_of, target_vocabulary=target)
    with pytest.raises(ArtifactError, match=r"manifest\.json.*edited after export"):
        serving.load(copy_of)
    # Rewritten consistently (binding recomputed), the graphs' own binding still refuses it.
    rewrite_manifest(copy_of, rebind=True, target_vocabulary=target)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx.*other vocabularies"):
        serving.load(copy_of)


def test_a_graph_of_another_model_is_refused(copy_of, tmp_path):
    other = Seq2Seq(hidden_size=24, embedding_dim=4, max_steps=1, device="cpu", random_state=0)
    other.fit(X_TRAIN, Y_TRAIN).export_onnx(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "encoder.onnx", copy_of / "encoder.onnx")
    files = json.loads((copy_of / "manifest.json").read_text())["files"]
    files["encoder.onnx"] = sha256_file(copy_of / "encoder.onnx")
    rewrite_manifest(copy_of, files=files)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx.*other vocabularies or another model"):
        serving.load(copy_of)
    # A format-1 manifest has no binding: the graphs' trial run at load finds the mismatch.
    as_format_1(copy_of)
    with pytest.raises(ArtifactError, match="do not run"):
        serving.load(copy_of)


def test_a_source_vocabulary_larger_than_the_embedding_fails_at_load(copy_of):
    # Before: the server reported ready, and every batch holding the extra token failed.
    as_format_1(copy_of)
    manifest = json.loads((copy_of / "manifest.json").read_text())
    rewrite_manifest(copy_of, source_vocabulary=[*manifest["source_vocabulary"], "X", "Y"])
    with pytest.raises(ArtifactError, match="do not run"):
        serving.load(copy_of)


def test_weights_in_a_file_beside_a_graph_are_refused(copy_of):
    """A graph whose weights live in an external-data file loaded it from beside the graph,
    where no checksum covers it: the weights could be swapped with no error."""
    weights_to_an_external_file(copy_of)
    with pytest.raises(ArtifactError, match=r"encoder\.onnx: onnxruntime cannot load.*xternal"):
        serving.load(copy_of)


def test_the_bytes_onnxruntime_loads_are_the_bytes_checked(copy_of, monkeypatch):
    """A graph is read once, and that read is hashed: had the checksum come from one open of
    the file and onnxruntime's graph from another, a file swapped between them would pass."""
    read_bytes = type(copy_of).read_bytes

    def swapped(path):
        data = read_bytes(path)
        return data + b"\0" if path.name == "decoder_step.onnx" else data

    monkeypatch.setattr(type(copy_of), "read_bytes", swapped)
    with pytest.raises(ArtifactError, match=r"decoder_step\.onnx: checksum mismatch"):
        serving.load(copy_of)


def test_a_manifest_string_that_is_not_valid_unicode_is_an_artifact_error(copy_of):
    # json.loads accepts a lone surrogate escape; computing the binding then raised a bare
    # UnicodeEncodeError that named no file.
    manifest = json.loads((copy_of / "manifest.json").read_text())
    source = [*manifest["source_vocabulary"], "\ud800"]
    path = copy_of / "manifest.json"
    path.write_text(json.dumps({**manifest, "source_vocabulary": source}))  # ASCII: "\\ud800"
    with pytest.raises(ArtifactError, match=r"manifest\.json: holds a string that is not valid"):
        serving.load(copy_of)


@pytest.mark.parametrize(
    ("n_source", "max_source_length"), [(5, 100), (30, 100), (36, 100), (37, 100), (200, 7)]
)
def test_the_load_trial_holds_every_source_id_in_short_rows_of_one_length(
    n_source, max_source_length
):
    src = trial_sources(n_source, max_source_length)
    width = min(TRIAL_WIDTH, max_source_length, n_source - 4)
    assert src.shape == (math.ceil((n_source - 4) / width), width + 1)
    assert (src[:, -1] == 2).all() and (src[:, :-1] >= 4).all()  # EOS last; no padding
    assert set(src[:, :-1].ravel()) == set(range(4, n_source))
    assert trial_sources(4, 10).tolist() == [[2]]  # no ordinary token: the EOS alone


def test_a_large_vocabulary_loads_with_a_trial_linear_in_its_size(tmp_path, monkeypatch):
    # The trial encoded one source of every token: a Transformer encoder's self-attention over
    # it grew with the square of the vocabulary (26.8 s and 9 GB to load 8,000 tokens).
    words = [f"w{i}" for i in range(3000)]
    X = [" ".join(words[i : i + 5]) for i in range(0, len(words), 5)]
    estimator = Seq2Seq(
        encoder="transformer", decoder="transformer", hidden_size=16,
        num_heads=2, tokenizer="space", max_steps=1, early_stopping=False, device="cpu",
        random_state=0,
    ).fit(X, ["a b"] * len(X))  # fmt: skip
    estimator.export_onnx(tmp_path / "m")
    encoded = []
    encode = backends.NumpyBackend.encode

    def recording(self, src, src_lengths):
        encoded.append(src.copy())
        return encode(self, src, src_lengths)

    monkeypatch.setattr(backends.NumpyBackend, "encode", recording)
    runtime = load(tmp_path / "m")
    (trial,) = encoded
    assert trial.shape[1] == TRIAL_WIDTH + 1
    assert set(trial.ravel()) == set(range(4, 3004)) | {2}
    assert runtime.predict(["w1 w2"]) == estimator.predict(["w1 w2"])


def test_a_format_1_target_vocabulary_unlike_the_decoder_is_named(copy_of):
    as_format_1(copy_of)
    manifest = json.loads((copy_of / "manifest.json").read_text())
    rewrite_manifest(copy_of, target_vocabulary=manifest["target_vocabulary"][:5])
    with pytest.raises(ArtifactError, match="target_vocabulary.*has 5 tokens"):
        serving.load(copy_of)


def test_artifact_error_is_a_value_error():
    assert issubclass(ArtifactError, ValueError)


def test_a_source_that_is_not_valid_unicode_is_refused_as_the_estimator_refuses_it(fitted, runtime):
    bad = "1\ud8002"  # a lone surrogate: no UTF-8 form
    with pytest.raises(ValueError, match="not valid Unicode"):
        fitted.predict([bad])
    for call in (
        lambda: runtime.predict(["12", bad]),
        lambda: runtime.predict_attention([bad]),
        lambda: runtime.log_likelihood([bad], ["21"]),
    ):
        with pytest.raises(ValueError, match=r"a source holds '\\ud800', which is not valid"):
            call()


@pytest.mark.parametrize("value", ["no", 1, None])
def test_predict_batch_takes_with_attention_as_a_bool_only(runtime, value):
    """Any truthy value turned the maps on ("no" included)."""
    with pytest.raises(ValueError, match="with_attention"):
        runtime.predict_batch(SOURCES[:2], with_attention=value)
    assert runtime.predict_batch(SOURCES[:2], with_attention=False)[1] is None


@pytest.mark.parametrize("decode_graph", [True, False])
def test_terminate_ends_the_search_in_progress_and_the_next_one_runs(decode_graph, tmp_path, capfd):
    """A search went on to its end whoever waited for it: a model that never ends held the
    server's worker (and its shutdown) for the whole search. terminate() ends the runs of the
    predict_batch in progress, which raises; the next predict_batch runs as usual. And
    onnxruntime prints nothing on stderr (it printed a plain-text error line, which broke the
    server's JSON-lines log on every client that left mid-search)."""
    import time

    import torch

    X, y = ["12", "345", "6789"] * 8, ["21", "543", "9876"] * 8
    model = Seq2Seq(hidden_size=8, embedding_dim=8, max_steps=3, max_output_length=4096)
    model.set_params(early_stopping=False, device="cpu", random_state=0).fit(X, y)
    with torch.no_grad():  # EOS never wins: every search runs to its 4,096 tokens
        model.module_.decoder.output.bias[2] = -1e4
    runtime = serving.load(model.export_onnx(tmp_path / "model"), decode_graph=decode_graph)
    expected = runtime.predict(["12"])
    assert len(expected[0]) == 4096
    outcome = {}

    def long_search():  # 128 sources: seconds of search
        try:
            runtime.predict_batch(["1234567890" * 10] * 128)
            outcome["end"] = "finished"
        except Exception as error:  # onnxruntime's: "Exiting due to terminate flag ..."
            outcome["end"] = error

    thread = threading.Thread(target=long_search)
    thread.start()
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:  # until the search has started
        time.sleep(0.2)  # inside decode.onnx's loops by then, where the log line came from
        runtime.terminate()
        thread.join(timeout=0.05)
    assert not thread.is_alive()
    assert "terminate" in str(outcome["end"])
    assert runtime.predict(["12"]) == expected
    assert "onnxruntime" not in capfd.readouterr().err


def endless_search_runtime(tmp_path):
    """Step graphs of a tiny model whose ``EOS`` never wins: every search runs to its 4,096
    tokens (seconds), time enough to terminate it."""
    import torch

    X, y = ["12", "345", "6789"] * 8, ["21", "543", "9876"] * 8
    model = Seq2Seq(hidden_size=8, embedding_dim=8, max_steps=3, max_output_length=4096)
    model.set_params(early_stopping=False, device="cpu", random_state=0).fit(X, y)
    with torch.no_grad():
        model.module_.decoder.output.bias[2] = -1e4
    directory = model.export_onnx(tmp_path / "model")
    return serving.load(directory, device="cpu", intra_op_num_threads=1, decode_graph=False)


def test_a_scoring_call_during_a_terminated_search_ends_too_and_leaves_the_flag_set(tmp_path):
    """log_likelihood cleared the runtime's terminate flag when it started: a search
    terminated just before it went on to its end."""
    runtime = endless_search_runtime(tmp_path)
    parked, resume = threading.Event(), threading.Event()
    step = runtime.backend.step

    def held_step(*args, **kwargs):  # the search stops once between two runs, until resumed
        result = step(*args, **kwargs)
        if threading.current_thread().name == "search" and not parked.is_set():
            parked.set()
            resume.wait(timeout=30)
        return result

    runtime.backend.step = held_step
    outcome = {}

    def search():
        try:
            runtime.predict_batch(["1234567890"] * 8)
            outcome["search"] = "finished"
        except Exception as error:  # onnxruntime's: "Exiting due to terminate flag ..."
            outcome["search"] = str(error)

    thread = threading.Thread(target=search, name="search")
    thread.start()
    assert parked.wait(timeout=30)
    runtime.terminate()
    with pytest.raises(Exception, match="terminate"):  # a call in progress: ended as well
        runtime.log_likelihood(["12"], ["21"])
    resume.set()
    thread.join(timeout=60)
    runtime.backend.step = step
    assert not thread.is_alive() and "terminate" in outcome["search"], outcome
    assert np.isfinite(runtime.log_likelihood(["12"], ["21"])).all()  # then as usual


def test_terminate_ends_every_search_in_progress_even_after_one_of_them_ended(tmp_path):
    """Two searches at once (a server's instances), both terminated: the first to end cleared
    the runtime's one terminate flag before the other had read it (between two of its step
    runs), and the other went on to the end of its search."""
    import time

    runtime = endless_search_runtime(tmp_path)
    expected = runtime.predict(["12"])
    stepping, parked, resume = threading.Event(), threading.Event(), threading.Event()
    step = runtime.backend.step

    def held_step(*args, **kwargs):  # "between" stops once between two runs, until resumed
        result = step(*args, **kwargs)
        if threading.current_thread().name == "between" and not parked.is_set():
            parked.set()
            resume.wait(timeout=30)
        elif threading.current_thread().name == "running":
            stepping.set()
        return result

    runtime.backend.step = held_step
    outcome = {}

    def search():
        started = time.monotonic()
        try:
            runtime.predict_batch(["1234567890"] * 16)
            outcome[threading.current_thread().name] = "finished"
        except Exception as error:  # onnxruntime's: "Exiting due to terminate flag ..."
            outcome[threading.current_thread().name] = str(error)
        outcome[threading.current_thread().name + " s"] = time.monotonic() - started

    threads = [threading.Thread(target=search, name=name) for name in ("between", "running")]
    for thread in threads:
        thread.start()
    assert parked.wait(timeout=30) and stepping.wait(timeout=30)
    runtime.terminate()
    threads[1].join(timeout=30)  # "running" reads the flag at its next run and ends
    resume.set()  # then "between" takes its next run
    threads[0].join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert "terminate" in outcome["running"]
    assert "terminate" in outcome["between"], outcome
    runtime.backend.step = step
    assert runtime.predict(["12"]) == expected  # the next call runs as usual
