"""Greedy decoding: :func:`greedy_decode` over a batch, and :class:`GreedySearch`, the running
set it steps (which the server's continuous batching also drives, :mod:`serving.running`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from skattn.core.checks import check_int
from skattn.core.hypothesis import (
    BOS_ID,
    EOS_ID,
    NEVER_EMITTED,
    Hypothesis,
    SelectFn,
    StepFn,
    call_step,
)

__all__ = ["GreedySearch", "greedy_decode"]


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
        ended (emitted EOS, reached ``max_length`` tokens, or got no finite log-probability),
        in row order."""
        if not self.size:
            return []
        position = int(self._steps[0])  # every row's, unless the step ignores it
        log_probs, self.carry, weights = call_step(
            self._step, self._y_prev, self.carry, position, self.never
        )
        # log_probs (N, V), weights (N, T)
        best = log_probs.argmax(axis=1)  # (N,) the first of equal maxima
        best_lp = log_probs[np.arange(best.size), best]  # (N,)
        # A row where every id has p = 0 (or a NaN) is stuck: it ends here without a token,
        # weights or a score for this step, as in a beam (argmax would pick PAD, id 0).
        stuck = ~np.isfinite(best_lp)  # (N,)
        self._scores += np.where(stuck, 0.0, best_lp)  # (N,) sum log p(y_i)
        eos = self.eos_id
        rows = zip(
            self._tokens,
            self._weights,
            weights,
            self._widths,
            best.tolist(),
            stuck.tolist(),
            strict=True,
        )
        for tokens, record, row_weights, width, token, is_stuck in rows:
            if is_stuck:
                continue
            record.append(row_weights if width is None else row_weights[:width])  # EOS's too
            if token != eos:
                tokens.append(token)
        self._steps += 1
        ends = (best == eos) | stuck | (self._steps >= self.max_length)
        self._y_prev = best.astype(np.int64)
        if not ends.any():
            return []
        ended = []
        for row in np.flatnonzero(ends).tolist():
            record, width = self._weights[row], self._widths[row]
            rows_so_far = (  # (t, T); (0, T) for a row stuck at its first step
                np.stack(record)
                if record
                else np.zeros((0, width or weights.shape[1]), weights.dtype)
            )
            hypothesis = Hypothesis(self._tokens[row], rows_so_far, float(self._scores[row]))
            ended.append((self.keys[row], hypothesis))
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
