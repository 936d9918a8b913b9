"""Greedy and beam-search decoding, NumPy only and backend-agnostic.

The estimator (torch) and the server (onnxruntime) decode with the same two functions. A backend
is two callables over an opaque, batch-first *carry* (the decoder state tensors plus the encoder
memory, keys and mask)::

    step(y_prev: int64 (N,), carry, position: int) -> (log_probs (N, V), carry, weights (N, T))
    select(carry, rows: int64 (M,)) -> carry      # rows may repeat (beam expansion)

Finished items are dropped from the carry with ``select``, so their cost stops; every decision
for an item reads only that item's rows, so an item's result never depends on the rest of the
batch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skattn.core.checks import check_int
from skattn.core.text import BOS, EOS, PAD, UNK

BOS_ID = BOS
EOS_ID = EOS
# Ids no target sequence holds: a model is never trained to emit them, and an undertrained one
# that tried would leave an output position with no token. Decoding never chooses them, so every
# output token has exactly one attention row: ``weights[:len(tokens)]``.
NEVER_EMITTED = (PAD, BOS, UNK)

StepFn = Callable[[np.ndarray, Any, int], tuple[np.ndarray, Any, np.ndarray]]
SelectFn = Callable[[Any, np.ndarray], Any]

__all__ = ["GreedySearch", "Hypothesis", "beam_decode", "greedy_decode"]


@dataclass
class Hypothesis:
    """One decoded output sequence.

    Attributes
    ----------
    tokens : list of int
        Output token ids, without BOS and without EOS.
    weights : ndarray of shape (steps, T)
        Attention weights, one row per decoder step taken (the EOS step included when EOS was
        emitted), so ``weights[:len(tokens)]`` has one row per output token. ``T`` is the padded
        source length of the batch the item was decoded in; columns past the item's own source
        length are zero.
    score : float
        The ranking score: the sum of the token log-probabilities (EOS included) for greedy
        decoding, that sum divided by ``length ** length_penalty`` for beam search.
    """

    tokens: list[int]
    weights: np.ndarray
    score: float


def _call_step(
    step: StepFn, y_prev: np.ndarray, carry: Any, position: int, never: tuple[int, ...]
) -> tuple[np.ndarray, Any, np.ndarray]:
    """Run one decoder step, check the shapes that cross the seam, rule out ``never`` ids."""
    log_probs, carry, weights = step(y_prev, carry, position)
    log_probs = np.array(log_probs, dtype=np.float64)  # a copy: the backend's array is not ours
    log_probs[:, list(never)] = -np.inf
    weights = np.asarray(weights)
    n = y_prev.shape[0]
    if log_probs.ndim != 2 or log_probs.shape[0] != n:
        raise ValueError(f"step must return log_probs of shape ({n}, V), got {log_probs.shape}")
    if weights.ndim != 2 or weights.shape[0] != n:
        raise ValueError(f"step must return weights of shape ({n}, T), got {weights.shape}")
    return log_probs, carry, weights


def greedy_decode(
    step: StepFn,
    select: SelectFn,
    carry: Any,
    batch_size: int,
    max_length: int,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    never: tuple[int, ...] = NEVER_EMITTED,
) -> list[Hypothesis]:
    """Decode a batch by taking the most probable token at every step.

    ``y_i = argmax_y log p(y | y_<i, x)``, until EOS or ``max_length`` output tokens. Ties go
    to the lowest token id. One :class:`GreedySearch` over the batch, stepped until it is empty.

    Parameters
    ----------
    step : callable
        ``step(y_prev (N,), carry, position) -> (log_probs (N, V), carry, weights (N, T))``.
    select : callable
        ``select(carry, rows) -> carry``, keeps the given batch rows of every carried array.
    carry : object
        The initial batch-first carry, one row per item.
    batch_size : int
        Number of items (rows of ``carry``).
    max_length : int
        Maximum number of output tokens per item (EOS not counted).
    bos_id, eos_id : int
        Start and end token ids.
    never : tuple of int, default=(PAD, BOS, UNK)
        Token ids that are never chosen (their log-probability is taken as -inf).

    Returns
    -------
    list of Hypothesis
        One per item, in input order.
    """
    batch_size = check_int(batch_size, "batch_size", 0)
    search = GreedySearch(step, select, max_length, bos_id=bos_id, eos_id=eos_id, never=never)
    search.admit(carry, range(batch_size))
    hypotheses: dict[int, Hypothesis] = {}
    while search.size:
        hypotheses.update(search.step())
    return [hypotheses[i] for i in range(batch_size)]


class GreedySearch:
    """Greedy search over a running set of rows: items join between steps, and each one leaves
    (is returned) the step it ends.

    :func:`greedy_decode` admits one batch and steps until it is empty. A server's continuous
    (iteration-level) batcher admits new items between steps (``merge`` joins their carry to
    the running one), so an item is answered the step it emits EOS, without waiting for the
    longest item it shares the rows with. Every decision for a row reads only that row, so an
    item's hypothesis does not depend on which rows ran beside it.

    Rows that joined at different steps are at different target positions, while ``step``
    takes one ``position`` for all rows. Only a search made with ``position_free=True`` (the
    caller knows that its step ignores the position: an RNN decoder without local-m attention)
    admits rows while others are part-way; otherwise :meth:`admit` refuses them.

    Parameters
    ----------
    step, select, bos_id, eos_id, never : see :func:`greedy_decode`.
    max_length : int
        Maximum number of output tokens per item (EOS not counted).
    position_free : bool, default=False
        Whether ``step``'s result ignores ``position``.
    """

    def __init__(
        self,
        step: StepFn,
        select: SelectFn,
        max_length: int,
        *,
        position_free: bool = False,
        bos_id: int = BOS_ID,
        eos_id: int = EOS_ID,
        never: tuple[int, ...] = NEVER_EMITTED,
    ) -> None:
        self._step, self._select = step, select
        self.max_length = check_int(max_length, "max_length", 1)
        self.position_free = position_free
        self.bos_id, self.eos_id, self.never = bos_id, eos_id, never
        self.carry: Any = None
        # One entry per carried row, in row order:
        self.keys: list[Any] = []  # the caller's key of the row's item
        self._widths: list[int | None] = []  # attention columns kept (None: all)
        self._tokens: list[list[int]] = []
        self._weights: list[list[np.ndarray]] = []
        self._scores = np.zeros(0)  # (N,) summed log-probabilities
        self._steps = np.zeros(0, dtype=np.int64)  # (N,) steps taken
        self._y_prev = np.zeros(0, dtype=np.int64)  # (N,) the token each row feeds next

    @property
    def size(self) -> int:
        """The number of rows (items) in the search."""
        return len(self.keys)

    @property
    def widths(self) -> list[int | None]:
        """Each row's attention columns kept (its source length; None: all)."""
        return list(self._widths)

    def admit(
        self,
        carry: Any,
        keys: Sequence[Any],
        *,
        merge: Callable[[Any, Any], Any] | None = None,
        widths: Sequence[int] | None = None,
    ) -> None:
        """Add items, one row of ``carry`` each, to start at the next step.

        Parameters
        ----------
        carry : object
            The new items' initial carry (``len(keys)`` rows).
        keys : sequence
            The caller's key of each new item: :meth:`step` returns it with the hypothesis.
        merge : callable, optional
            ``merge(running, new) -> carry``: the running rows, then the new ones. Needed when
            the search already holds rows.
        widths : sequence of int, optional
            Attention columns to keep of each new item's rows (its source length); default:
            all of them.
        """
        keys = list(keys)
        if not keys:
            return
        if widths is not None and len(widths) != len(keys):
            raise ValueError(f"widths has {len(widths)} entries for {len(keys)} keys")
        if self.size:
            if merge is None:
                raise ValueError("merge is required to admit items into a running search")
            if not self.position_free and self._steps.any():
                raise ValueError(
                    "this search's step reads the target position: items can join only before "
                    "the first step (position_free=False)"
                )
            self.carry = merge(self.carry, carry)
        else:
            self.carry = carry
        n = len(keys)
        self.keys += keys
        self._widths += [None] * n if widths is None else [int(w) for w in widths]
        self._tokens += [[] for _ in range(n)]
        self._weights += [[] for _ in range(n)]
        self._scores = np.concatenate([self._scores, np.zeros(n)])
        self._steps = np.concatenate([self._steps, np.zeros(n, dtype=np.int64)])
        self._y_prev = np.concatenate([self._y_prev, np.full(n, self.bos_id, dtype=np.int64)])

    def drop(self, keys: Collection[Any]) -> None:
        """Take the rows of ``keys`` out (their callers have gone): their cost stops."""
        keep = [row for row, key in enumerate(self.keys) if key not in keys]
        if len(keep) < self.size:
            self._keep(np.asarray(keep, dtype=np.int64))

    def step(self) -> list[tuple[Any, Hypothesis]]:
        """Run one decoder step over every row; return ``(key, hypothesis)`` of the items that
        ended (emitted EOS or reached ``max_length`` tokens), in row order."""
        if not self.size:
            return []
        position = int(self._steps[0])  # every row's, unless the step ignores it
        log_probs, self.carry, weights = _call_step(
            self._step, self._y_prev, self.carry, position, self.never
        )
        # log_probs (N, V), weights (N, T)
        best = log_probs.argmax(axis=1)  # (N,)
        self._scores += log_probs[np.arange(best.size), best]  # (N,) sum log p(y_i)
        eos = self.eos_id
        rows = zip(self._tokens, self._weights, weights, self._widths, best.tolist(), strict=True)
        for tokens, record, row_weights, width, token in rows:
            record.append(row_weights if width is None else row_weights[:width])
            if token != eos:
                tokens.append(token)
        self._steps += 1
        ends = (best == self.eos_id) | (self._steps >= self.max_length)
        self._y_prev = best.astype(np.int64)
        if not ends.any():
            return []
        ended = [
            (
                self.keys[row],
                Hypothesis(
                    self._tokens[row], np.stack(self._weights[row]), float(self._scores[row])
                ),
            )
            for row in np.flatnonzero(ends)
        ]
        self._keep(np.flatnonzero(~ends))
        return ended

    def _keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (ascending) of the carry and of every per-row record."""
        if rows.size == 0:
            self.carry = None
        elif rows.size < self.size:
            self.carry = self._select(self.carry, rows)
        kept = rows.tolist()
        self.keys = [self.keys[r] for r in kept]
        self._widths = [self._widths[r] for r in kept]
        self._tokens = [self._tokens[r] for r in kept]
        self._weights = [self._weights[r] for r in kept]
        self._scores, self._steps = self._scores[rows], self._steps[rows]
        self._y_prev = self._y_prev[rows]


def _normalised(log_prob: float, length: int, length_penalty: float) -> float:
    """``sum(log p) / length ** length_penalty`` (length >= 1 counts EOS when emitted)."""
    return log_prob / max(length, 1) ** length_penalty


def beam_decode(
    step: StepFn,
    select: SelectFn,
    carry: Any,
    batch_size: int,
    beam_size: int,
    max_length: int,
    length_penalty: float = 1.0,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    never: tuple[int, ...] = NEVER_EMITTED,
) -> list[Hypothesis]:
    """Decode a batch with beam search and length-normalised scores.

    Each item keeps up to ``beam_size`` live hypotheses. At every step the ``2 * beam_size``
    best extensions ``log p(y_<i) + log p(y_i | y_<i, x)`` of the item's live beams are ranked;
    an EOS extension ranked within the first ``beam_size`` becomes a finished hypothesis with
    score ``sum(log p) / len ** length_penalty`` (``len`` counts EOS), the best non-EOS
    extensions (up to ``beam_size``) stay live. An item stops when it holds ``beam_size``
    finished hypotheses, when no live beam is left, or after ``max_length`` output tokens. The
    result is its best finished hypothesis; an item that finished none returns its best live
    beam, normalised by its length. A beam cut off at ``max_length`` does not compete with
    finished ones: its score lacks the ``log p(EOS)`` term that every finished score pays, so it
    would beat any completion of itself. Ties go to the earlier beam, then the lower token id.

    Parameters
    ----------
    step, select, carry, batch_size, max_length : see :func:`greedy_decode`.
    beam_size : int
        Number of hypotheses kept per item. ``beam_size=1`` is greedy decoding.
    length_penalty : float, default=1.0
        Exponent of the length normalisation; 0 ranks by the plain sum of log-probabilities.
    bos_id, eos_id, never : see :func:`greedy_decode`.

    Returns
    -------
    list of Hypothesis
        The best hypothesis of each item, in input order.
    """
    batch_size = check_int(batch_size, "batch_size", 0)
    beam_size = check_int(beam_size, "beam_size", 1)
    max_length = check_int(max_length, "max_length", 1)
    if not np.isfinite(length_penalty) or length_penalty < 0:
        raise ValueError(f"length_penalty must be a finite float >= 0, got {length_penalty!r}")

    K = beam_size
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    n_finished = np.zeros(batch_size, dtype=np.int64)  # len(finished[item])
    # An item whose extensions all had log-probability -inf stops with its live beams as they
    # were (unless it finished some hypothesis before); so does one cut off at max_length.
    stalled: dict[int, list[Hypothesis]] = {}
    beams = _Beams.start(batch_size)

    for position in range(max_length):
        if beams.size == 0:
            break
        log_probs, carry, weights = _call_step(step, beams.y_prev(bos_id), carry, position, never)
        # log_probs (N, V), weights (N, T)
        extended = beams.paths_with(weights)  # (N, t + 1, T)
        ranked = _Ranking.of(beams, log_probs, K, eos_id)

        for i, r in zip(*np.nonzero(ranked.ends), strict=True):
            source = ranked.row[i, r]
            score = _normalised(float(ranked.total[i, r]), position + 1, length_penalty)
            item = ranked.items[i]
            hypothesis = Hypothesis(beams.tokens[source].tolist(), extended[source], score)
            finished[item].append(hypothesis)
            n_finished[item] += 1
        grows = ranked.grows
        n_growing = grows.sum(axis=1)  # (I,)
        for i in np.flatnonzero((n_growing == 0) & (n_finished[ranked.items] == 0)):
            rows = np.arange(ranked.starts[i], ranked.starts[i] + ranked.counts[i])
            stalled[int(ranked.items[i])] = beams.hypotheses(rows, length_penalty)
        grows = grows & ((n_finished[ranked.items] < K) & (n_growing > 0))[:, None]  # the rest end

        i, r = np.nonzero(grows)  # items ascending, best first
        source = ranked.row[i, r]
        if source.size:
            carry = select(carry, source)
        beams = _Beams(
            owner=ranked.items[i],
            log_prob=ranked.total[i, r],
            tokens=np.concatenate([beams.tokens[source], ranked.token[i, r, None]], axis=1),
            paths=extended[source],
        )

    # Items still live after max_length tokens: their live beams, if they finished nothing.
    for first, count in zip(*_runs(beams.owner), strict=True):
        if n_finished[beams.owner[first]] == 0:
            rows = np.arange(first, first + count)
            stalled[int(beams.owner[first])] = beams.hypotheses(rows, length_penalty)

    results = []
    for item in range(batch_size):
        candidates = finished[item] or stalled[item]
        # max keeps the first of equal scores: the earlier-finished or higher-ranked hypothesis.
        results.append(max(candidates, key=lambda h: h.score))
    return results


@dataclass(frozen=True)
class _Beams:
    """The live hypotheses of every item, one carried row each.

    An item's rows are contiguous and items ascend, so an item's beams are one run of
    ``owner``; ``tokens`` and ``paths`` grow by one column per step.
    """

    owner: np.ndarray  # (N,) the item of each row
    log_prob: np.ndarray  # (N,) summed log-probability of each beam
    tokens: np.ndarray  # (N, t) int64 output tokens so far
    paths: np.ndarray | None  # (N, t, T) attention rows so far (None before the first step)

    @classmethod
    def start(cls, batch_size: int) -> _Beams:
        """One empty beam per item."""
        empty = np.zeros((batch_size, 0), dtype=np.int64)
        return cls(np.arange(batch_size), np.zeros(batch_size), empty, None)

    @property
    def size(self) -> int:
        return self.owner.size

    def y_prev(self, bos_id: int) -> np.ndarray:
        """Each beam's last token (BOS before the first step): ``(N,) int64``."""
        if self.tokens.shape[1] == 0:
            return np.full(self.size, bos_id, dtype=np.int64)
        return np.ascontiguousarray(self.tokens[:, -1])

    def paths_with(self, weights: np.ndarray) -> np.ndarray:
        """``paths`` with this step's attention rows ``weights (N, T)`` appended."""
        paths = self.paths
        if paths is None:
            paths = np.zeros((self.size, 0, weights.shape[1]), dtype=weights.dtype)
        return np.concatenate([paths, weights[:, None]], axis=1)  # (N, t + 1, T)

    def hypotheses(self, rows: np.ndarray, length_penalty: float) -> list[Hypothesis]:
        """Live beams as hypotheses, best first, each normalised by its length (no EOS)."""
        length = self.tokens.shape[1]
        return [
            Hypothesis(
                self.tokens[r].tolist(),
                self.paths[r],
                _normalised(float(self.log_prob[r]), length, length_penalty),
            )
            for r in rows
        ]


@dataclass(frozen=True)
class _Ranking:
    """The ``2K`` best extensions ``(beam, token)`` of each item, best first.

    Ties go to the earlier beam, then the lower token id (a stable sort of the flattened
    ``(beam, token)`` index). ``ends``: EOS within the first ``K`` ranks finishes a hypothesis;
    ``grows``: the first ``K`` other finite extensions stay live.
    """

    items: np.ndarray  # (I,) the items with live beams
    starts: np.ndarray  # (I,) first row of each item
    counts: np.ndarray  # (I,) live rows of each item
    row: np.ndarray  # (I, 2K) the carried row each extension extends
    token: np.ndarray  # (I, 2K) int64 its token
    total: np.ndarray  # (I, 2K) its summed log-probability, descending
    ends: np.ndarray  # (I, 2K) bool
    grows: np.ndarray  # (I, 2K) bool

    @classmethod
    def of(cls, beams: _Beams, log_probs: np.ndarray, K: int, eos_id: int) -> _Ranking:
        n, vocab = log_probs.shape
        # Each item's beams side by side, padded to K with -inf: totals (I, K, V).
        starts, counts = _runs(beams.owner)
        item_of_row = np.repeat(np.arange(starts.size), counts)  # (N,)
        totals = np.full((starts.size, K, vocab), -np.inf)
        totals[item_of_row, np.arange(n) - starts[item_of_row]] = (
            beams.log_prob[:, None] + log_probs
        )
        flat = totals.reshape(starts.size, K * vocab)
        ranked = np.argsort(-flat, axis=1, kind="stable")[:, : 2 * K]  # (I, 2K)
        total = np.take_along_axis(flat, ranked, axis=1)  # (I, 2K), descending
        beam, token = np.divmod(ranked, vocab)
        finite = np.isfinite(total)  # -inf (and NaN) sort last: a finite prefix
        is_eos = (token == eos_id) & finite
        grows = finite & ~is_eos
        return cls(
            items=beams.owner[starts],
            starts=starts,
            counts=counts,
            row=starts[:, None] + beam,
            token=token.astype(np.int64),
            total=total,
            ends=is_eos & (np.arange(2 * K) < K),
            grows=grows & (np.cumsum(grows, axis=1) <= K),
        )


def _runs(owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First index and length of each run of equal values in ``owner`` (empty for no rows)."""
    if owner.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    return starts, np.diff(np.r_[starts, owner.size])
