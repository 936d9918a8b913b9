"""Tests for skattn.core.search against a hand-made NumPy backend with known answers.

The backend is a per-item table indexed by a rolling hash of the item's whole history, which the
carry holds: the next-token distribution and the attention weights depend on every previous
token, so a wrong reorder of the carry during beam search shows up as wrong tokens, weights or
scores, and both can be recomputed from a hypothesis' tokens with a scalar loop.
"""

import itertools

import numpy as np
import pytest

from skattn.core import beam as beam_module
from skattn.core.search import (
    BOS_ID,
    EOS_ID,
    GreedySearch,
    Hypothesis,
    beam_decode,
    greedy_decode,
)

VOCAB = 6  # PAD, BOS, EOS, UNK, and two real tokens (4, 5)
T = 4  # source length seen by the "attention"
STATES = 97  # rolling-hash states of a history


def next_state(state, token):
    return (state * 7 + token + 1) % STATES


class HistoryBackend:
    """step/select over a dict carry, recording the batch size of every step call."""

    def __init__(self, n_tables: int, seed: int, eos_bias: float = 0.0):
        rng = np.random.default_rng(seed)
        logits = rng.normal(scale=2.0, size=(n_tables, STATES, VOCAB))
        logits[..., [0, 1, 3]] -= 8.0  # specials are unlikely, but finite
        logits[..., EOS_ID] += eos_bias
        self.log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        self.att = rng.normal(size=(n_tables, STATES, T))
        self.calls: list[int] = []

    def carry(self, tables) -> dict:
        tables = np.asarray(tables, dtype=np.int64)
        return {"table": tables, "state": np.zeros(tables.size, dtype=np.int64)}

    def weights(self, table, state, position):
        e = self.att[table, state] + 0.5 * position  # (N, T)
        w = np.exp(e - e.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True)

    def step(self, y_prev, carry, position):
        self.calls.append(y_prev.size)
        table, state = carry["table"], next_state(carry["state"], y_prev)  # (N,), (N,)
        log_probs = self.log_p[table, state]  # (N, V)
        weights = self.weights(table, state, position)  # (N, T)
        return log_probs, {"table": table, "state": state}, weights

    @staticmethod
    def select(carry, rows):
        return {name: value[rows] for name, value in carry.items()}

    def sequence_log_probs(self, table, tokens):
        """Per-token log-probabilities and attention rows of one sequence (a scalar loop)."""
        state, y_prev, out, rows = 0, BOS_ID, [], []
        for position, token in enumerate(tokens):
            state = next_state(state, y_prev)
            out.append(self.log_p[table, state, token])
            rows.append(self.weights(table, state, position))
            y_prev = token
        return np.array(out), np.array(rows)


def reference_greedy(backend, table, max_length):
    state, token, tokens = 0, BOS_ID, []
    while len(tokens) < max_length and token != EOS_ID:
        state = next_state(state, token)
        token = int(np.argmax(backend.log_p[table, state]))
        tokens.append(token)
    return tokens


def brute_force_best(backend, table, max_length, length_penalty):
    """The best EOS-terminated sequence of at most max_length tokens, by exhaustive search."""
    best_score, best = -np.inf, None
    non_eos = [v for v in range(VOCAB) if v != EOS_ID]
    for length in range(max_length):
        for body in itertools.product(non_eos, repeat=length):
            lp, _ = backend.sequence_log_probs(table, [*body, EOS_ID])
            score = lp.sum() / (length + 1) ** length_penalty
            if score > best_score:
                best_score, best = score, list(body)
    return best, best_score


def check_hypothesis(backend, table, hyp, max_length):
    """Tokens, weights and the summed log-probability agree with a scalar recomputation."""
    assert isinstance(hyp, Hypothesis)
    assert EOS_ID not in hyp.tokens and len(hyp.tokens) <= max_length
    emitted_eos = hyp.weights.shape[0] == len(hyp.tokens) + 1
    assert emitted_eos or len(hyp.tokens) == max_length
    full = hyp.tokens + [EOS_ID] if emitted_eos else hyp.tokens
    lp, rows = backend.sequence_log_probs(table, full)
    np.testing.assert_allclose(hyp.weights, rows, rtol=0, atol=1e-12)
    return lp.sum()


@pytest.mark.parametrize("seed", range(4))
def test_greedy_matches_scalar_reference(seed):
    backend = HistoryBackend(n_tables=5, seed=seed)
    hyps = greedy_decode(backend.step, backend.select, backend.carry(range(5)), 5, max_length=6)
    assert len(hyps) == 5
    for table, hyp in enumerate(hyps):
        expected = reference_greedy(backend, table, 6)
        assert hyp.tokens == [t for t in expected if t != EOS_ID]
        total = check_hypothesis(backend, table, hyp, 6)
        assert hyp.score == pytest.approx(total, abs=1e-12)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_wide_beam_finds_exhaustive_optimum(seed, length_penalty):
    # 31 EOS-terminated sequences exist at max_length=3, so a beam of 64 never prunes.
    backend = HistoryBackend(n_tables=4, seed=10 + seed, eos_bias=1.0)
    hyps = beam_decode(
        backend.step,
        backend.select,
        backend.carry(range(4)),
        4,
        beam_size=64,
        max_length=3,
        length_penalty=length_penalty,
    )
    for table, hyp in enumerate(hyps):
        best, best_score = brute_force_best(backend, table, 3, length_penalty)
        assert hyp.tokens == best
        assert hyp.score == pytest.approx(best_score, abs=1e-12)
        total = check_hypothesis(backend, table, hyp, 3)
        assert hyp.score == pytest.approx(total / (len(hyp.tokens) + 1) ** length_penalty)


def reference_beam(backend, table, beam_size, max_length, length_penalty):
    """beam_decode's documented rules for one item, with Python lists: its oracle.

    Returns ``(tokens, score)`` of the best hypothesis.
    """
    never = (0, 1, 3)  # PAD, BOS, UNK
    live = [([], 0, 0.0)]  # (tokens, hash state before the last token, summed log-probability)
    finished = []
    for _ in range(max_length):
        extensions = []  # (total, beam, token, state): beams in rank order, tokens ascending
        for k, (tokens, state, log_prob) in enumerate(live):
            state = next_state(state, tokens[-1] if tokens else BOS_ID)
            for token in range(VOCAB):
                if token not in never:
                    extensions.append(
                        (log_prob + backend.log_p[table, state, token], k, token, state)
                    )
        extensions.sort(key=lambda e: -e[0])  # stable: ties keep beam, then token order
        survivors = []
        for rank, (total, k, token, state) in enumerate(extensions[: 2 * beam_size]):
            if not np.isfinite(total) or len(survivors) == beam_size:
                break
            tokens = live[k][0]
            if token == EOS_ID:
                if rank < beam_size:
                    finished.append((tokens, total / (len(tokens) + 1) ** length_penalty))
                continue
            survivors.append(([*tokens, token], state, total))
        if len(finished) >= beam_size or not survivors:
            break
        live = survivors
    candidates = finished or [
        (tokens, log_prob / max(len(tokens), 1) ** length_penalty) for tokens, _, log_prob in live
    ]
    return max(candidates, key=lambda c: c[1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size", [2, 3, 5])
@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("partition", [False, True], ids=["sorted", "partitioned"])
def test_beam_matches_the_per_item_reference(
    seed, beam_size, length_penalty, partition, monkeypatch
):
    if partition:  # rank every step's extensions by partition, as large batches do
        monkeypatch.setattr(beam_module, "_PARTITION_FROM", 0)
    backend = HistoryBackend(n_tables=9, seed=40 + seed, eos_bias=0.5)
    if seed % 2:  # ties: log-probabilities on a coarse grid
        backend.log_p = np.round(backend.log_p * 2) / 2
    if seed >= 2:  # dead ends: some histories allow no token at all
        backend.log_p[:, ::5] = -np.inf
    tables = [3, 0, 8, 1, 1, 5, 2, 7, 4, 6]
    hyps = beam_decode(
        backend.step, backend.select, backend.carry(tables), len(tables), beam_size, 7,
        length_penalty,
    )  # fmt: skip
    for table, hyp in zip(tables, hyps, strict=True):
        tokens, score = reference_beam(backend, table, beam_size, 7, length_penalty)
        assert hyp.tokens == tokens
        assert hyp.score == pytest.approx(score, rel=1e-12)
        assert hyp.weights.shape[0] in (len(tokens), len(tokens) + 1)
        if np.isfinite(score):
            check_hypothesis(backend, table, hyp, 7)


@pytest.mark.parametrize("seed", range(6))
def test_best_columns_are_a_stable_sorts_first_columns(seed):
    """The partition path of the ranking equals the stable sort it replaces, ties, infinities
    and NaN included, at sizes past _PARTITION_FROM."""
    rng = np.random.default_rng(seed)
    rows, width, m = int(rng.integers(12, 70)), int(rng.integers(300, 500)), 10
    flat = rng.integers(-4, 4, size=(rows, width)).astype(float)  # many ties
    if seed % 2:
        flat += rng.normal(scale=1e-3, size=flat.shape)  # ties only where planted below
        flat[::3, :40] = flat[::3, :1]
    flat[rng.random(flat.shape) < 0.4] = -np.inf
    flat[rng.random(flat.shape) < 0.01] = np.inf
    if seed >= 3:
        flat[rng.random(flat.shape) < 0.01] = np.nan
        flat[0, :] = -np.inf  # a row with no finite value
    assert flat.size >= beam_module._PARTITION_FROM
    expected = np.argsort(-flat, axis=1, kind="stable")[:, :m]
    np.testing.assert_array_equal(beam_module._best_columns(flat, m), expected)


@pytest.mark.parametrize("seed", range(3))
def test_beam_of_one_is_greedy(seed):
    backend = HistoryBackend(n_tables=6, seed=20 + seed)
    carry = backend.carry(range(6))
    greedy = greedy_decode(backend.step, backend.select, carry, 6, max_length=7)
    beam = beam_decode(backend.step, backend.select, carry, 6, 1, 7, length_penalty=0.0)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b.tokens
        np.testing.assert_array_equal(g.weights, b.weights)
        assert g.score == pytest.approx(b.score)


def test_beam_beats_greedy_on_a_garden_path():
    # From BOS, token 4 is likelier (0.6) than 5 (0.4), but after 4 every continuation is
    # uncertain, while after 5 the model is sure to stop: greedy walks the garden path.
    backend = HistoryBackend(n_tables=1, seed=0)
    after_bos = next_state(0, BOS_ID)
    logits = np.full((STATES, VOCAB), -20.0)
    logits[:, [EOS_ID, 4, 5]] = np.log(1 / 3)  # uncertain everywhere ...
    logits[after_bos] = -20.0
    logits[after_bos, [4, 5]] = np.log([0.6, 0.4])  # ... except at the start
    logits[next_state(after_bos, 5)] = -20.0
    logits[next_state(after_bos, 5), EOS_ID] = 0.0  # ... and after 5, which surely stops
    backend.log_p = (logits - np.log(np.exp(logits).sum(-1, keepdims=True)))[None]
    carry = backend.carry([0])
    greedy = greedy_decode(backend.step, backend.select, carry, 1, max_length=4)[0]
    beam = beam_decode(backend.step, backend.select, carry, 1, 2, 4, length_penalty=0.0)[0]
    assert greedy.tokens == [4]
    assert beam.tokens == [5]
    assert beam.score == pytest.approx(np.log(0.4), abs=1e-6)
    assert greedy.score == pytest.approx(np.log(0.6 / 3), abs=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_result_does_not_depend_on_the_batch(beam_size):
    backend = HistoryBackend(n_tables=7, seed=3)
    tables = [6, 0, 3, 3, 1, 5, 2, 4]

    def decode(items):
        carry = backend.carry(items)
        if beam_size == 1:
            return greedy_decode(backend.step, backend.select, carry, len(items), 8)
        return beam_decode(backend.step, backend.select, carry, len(items), beam_size, 8)

    together = decode(tables)
    for i, table in enumerate(tables):
        (alone,) = decode([table])
        assert together[i].tokens == alone.tokens
        np.testing.assert_array_equal(together[i].weights, alone.weights)
        assert together[i].score == alone.score
    reordered = decode(tables[::-1])
    assert [h.tokens for h in reordered[::-1]] == [h.tokens for h in together]


def test_finished_items_are_dropped_and_each_stops_at_its_own_eos():
    backend = HistoryBackend(n_tables=6, seed=5, eos_bias=1.5)
    hyps = greedy_decode(backend.step, backend.select, backend.carry(range(6)), 6, 10)
    steps = [h.weights.shape[0] for h in hyps]
    assert len(set(steps)) > 1, "the fixture should stop items at different steps"
    # Step call i sees exactly the items that have not yet finished.
    assert backend.calls == [sum(s > i for s in steps) for i in range(max(steps))]


def test_max_length_truncates_without_eos():
    backend = HistoryBackend(n_tables=2, seed=1, eos_bias=-30.0)
    for hyps in (
        greedy_decode(backend.step, backend.select, backend.carry([0, 1]), 2, 3),
        beam_decode(backend.step, backend.select, backend.carry([0, 1]), 2, 2, 3),
    ):
        for table, hyp in enumerate(hyps):
            assert len(hyp.tokens) == 3 and hyp.weights.shape == (3, T)
            check_hypothesis(backend, table, hyp, 3)


def test_beam_weights_follow_reordered_beams():
    backend = HistoryBackend(n_tables=5, seed=8)
    hyps = beam_decode(backend.step, backend.select, backend.carry(range(5)), 5, 4, 6)
    for table, hyp in enumerate(hyps):
        total = check_hypothesis(backend, table, hyp, 6)
        length = hyp.weights.shape[0]
        assert hyp.score == pytest.approx(total / length)


def test_an_item_that_cannot_extend_at_the_first_step_returns_its_empty_beam():
    """Every extension -inf (or NaN) at the first step: the item stops with no token."""
    backend = HistoryBackend(n_tables=2, seed=3)
    backend.log_p[1] = np.nan  # item 1's model answers NaN everywhere
    hyps = beam_decode(backend.step, backend.select, backend.carry([0, 1]), 2, 3, 6)
    assert hyps[1].tokens == [] and hyps[1].weights.shape == (0, T)
    check_hypothesis(backend, 0, hyps[0], 6)


def test_empty_batch_decodes_nothing():
    backend = HistoryBackend(n_tables=1, seed=0)
    assert greedy_decode(backend.step, backend.select, backend.carry([]), 0, 5) == []
    assert beam_decode(backend.step, backend.select, backend.carry([]), 0, 3, 5) == []
    assert backend.calls == []


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"batch_size": -1}, "batch_size"),
        ({"max_length": 0}, "max_length"),
        ({"beam_size": 0}, "beam_size"),
        ({"beam_size": 2.0}, "beam_size"),
        ({"length_penalty": -0.5}, "length_penalty"),
        ({"length_penalty": float("nan")}, "length_penalty"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    backend = HistoryBackend(n_tables=1, seed=0)
    args = {"batch_size": 1, "beam_size": 2, "max_length": 3, "length_penalty": 1.0} | kwargs
    with pytest.raises(ValueError, match=name):
        beam_decode(backend.step, backend.select, backend.carry([0]), **args)
    if name in ("batch_size", "max_length"):
        with pytest.raises(ValueError, match=name):
            greedy_decode(
                backend.step,
                backend.select,
                backend.carry([0]),
                batch_size=args["batch_size"],
                max_length=args["max_length"],
            )


def test_step_returning_wrong_shapes_is_reported():
    def step(y_prev, carry, position):
        return np.zeros((y_prev.size + 1, VOCAB)), carry, np.zeros((y_prev.size, T))

    with pytest.raises(ValueError, match="log_probs"):
        greedy_decode(step, HistoryBackend.select, {}, 2, 3)

    def flat(y_prev, carry, position):  # 1-D: checked before the special ids are ruled out
        return np.zeros(VOCAB), carry, np.zeros((y_prev.size, T))

    with pytest.raises(ValueError, match="log_probs"):
        greedy_decode(flat, HistoryBackend.select, {}, 2, 3)


def test_special_ids_are_never_emitted_so_each_token_has_one_attention_row():
    # A step that prefers PAD, BOS and UNK over everything; the best real token is 5 until the
    # third step, then EOS. Decoding must pick 5, 5, 5, EOS: one attention row per output token.
    def step(y_prev, carry, position):
        log_p = np.full((len(y_prev), 7), -10.0)
        log_p[:, [0, 1, 3]] = -0.01
        log_p[:, 5] = -1.0
        log_p[:, 2] = -0.5 if position == 3 else -50.0
        return log_p, carry, np.full((len(y_prev), 4), 0.25)

    def select(carry, rows):
        return carry

    for hyp in (
        greedy_decode(step, select, None, 2, max_length=10)[0],
        beam_decode(step, select, None, 2, 3, 10)[0],
    ):
        assert hyp.tokens == [5, 5, 5]
        assert hyp.weights.shape == (4, 4)  # three tokens and the EOS step
    allowed = greedy_decode(step, select, None, 1, max_length=2, never=())[0]
    assert allowed.tokens == [0, 0]  # without the rule the specials win


# -- GreedySearch: a running set of rows ---------------------------------------------------


class PositionFreeBackend(HistoryBackend):
    """The history backend with attention that ignores the target position, as an RNN
    decoder's step without local-m attention does: rows may join at any step."""

    def weights(self, table, state, position):
        return super().weights(table, state, 0)


def merge_dicts(first, second):
    return {name: np.concatenate([first[name], second[name]]) for name in first}


def test_items_that_join_a_running_search_get_their_greedy_hypotheses_alone():
    backend = PositionFreeBackend(n_tables=12, seed=7)
    alone = {
        t: greedy_decode(backend.step, backend.select, backend.carry([t]), 1, 9)[0]
        for t in range(12)
    }
    search = GreedySearch(backend.step, backend.select, 9, position_free=True)
    joins = {0: [0, 1, 2], 1: [3], 3: [4, 5, 6, 7], 4: [8], 7: [9, 10, 11]}
    ended, step = {}, 0
    while step in joins or search.size or step <= max(joins):
        if step in joins:
            new = joins[step]
            search.admit(backend.carry(new), new, merge=merge_dicts, widths=[T - 1] * len(new))
        for key, hypothesis in search.step():
            assert key not in ended
            ended[key] = (step, hypothesis)
        step += 1
    assert sorted(ended) == list(range(12))
    for key, (_, hypothesis) in ended.items():
        assert hypothesis.tokens == alone[key].tokens
        assert hypothesis.score == pytest.approx(alone[key].score, abs=1e-12)
        np.testing.assert_array_equal(hypothesis.weights, alone[key].weights[:, : T - 1])
    # Each item left the step it ended, not with the last of its batch.
    first_batch = {key: ended[key][0] for key in joins[0]}
    lengths = {key: alone[key].weights.shape[0] for key in joins[0]}
    assert first_batch == {key: lengths[key] - 1 for key in joins[0]}


def test_dropped_rows_leave_and_the_others_are_unchanged():
    backend = PositionFreeBackend(n_tables=6, seed=3)
    alone = greedy_decode(backend.step, backend.select, backend.carry(range(6)), 6, 8)
    search = GreedySearch(backend.step, backend.select, 8, position_free=True)
    search.admit(backend.carry(range(6)), list(range(6)))
    ended = dict(search.step())
    dropped = {1, 4} - set(ended)
    assert dropped, "the seed should leave items 1 and 4 running after one step"
    search.drop(dropped)
    assert not dropped & set(search.keys)
    while search.size:
        ended.update(search.step())
    assert not dropped & set(ended)
    for key in set(range(6)) - dropped:
        assert ended[key].tokens == alone[key].tokens


def test_a_search_whose_step_reads_the_position_refuses_late_rows():
    backend = HistoryBackend(n_tables=4, seed=0)
    search = GreedySearch(backend.step, backend.select, 5)
    search.admit(backend.carry([0, 1]), [0, 1])
    search.admit(backend.carry([2]), [2], merge=merge_dicts)  # before any step: fine
    search.step()
    assert search.size, "the seed should leave rows running after one step"
    with pytest.raises(ValueError, match="position"):
        search.admit(backend.carry([3]), [3], merge=merge_dicts)
    with pytest.raises(ValueError, match="merge"):
        search.admit(backend.carry([3]), [3])
    with pytest.raises(ValueError, match="widths"):
        GreedySearch(backend.step, backend.select, 5).admit(backend.carry([0]), [0], widths=[])


def test_a_step_without_a_finite_log_probability_ends_the_row_as_a_beam_does():
    # Item 0 takes token 4, then every id has p = 0; item 1 gets NaNs at once; item 2 is fine
    # and stops with EOS. argmax would have picked PAD (id 0), which no search may emit.
    def step(y_prev, carry, position):
        log_probs = np.full((y_prev.size, VOCAB), -np.inf)
        weights = np.full((y_prev.size, T), 1.0 / T)
        for row, item in enumerate(carry):
            if item == 0 and position == 0:
                log_probs[row, 4] = 0.0
            elif item == 1:
                log_probs[row] = np.nan
            elif item == 2:
                log_probs[row, [4, EOS_ID]] = np.log([0.4, 0.6]) if position else (0.0, -np.inf)
        return log_probs, carry, weights

    def select(carry, rows):
        return carry[rows]

    carry = np.arange(3)
    greedy = greedy_decode(step, select, carry, 3, max_length=5)
    beam = beam_decode(step, select, carry, 3, 1, 5, length_penalty=0.0)
    assert [h.tokens for h in greedy] == [[4], [], [4]]
    assert [h.score for h in greedy] == [0.0, 0.0, pytest.approx(np.log(0.6))]
    assert [h.weights.shape for h in greedy] == [(1, T), (0, T), (2, T)]
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b.tokens and g.score == pytest.approx(b.score)
        np.testing.assert_array_equal(g.weights, b.weights)
