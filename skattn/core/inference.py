"""The one inference layer: sources -> ids -> length-sorted chunks -> search -> outputs.

``Seq2Seq.predict*`` (torch) and ``serving.Runtime`` (onnxruntime) both translate through a
:class:`Translator` over a :class:`Backend`; only the backend differs::

    token lists --Vocabulary.encode + [EOS]--> id lists
      --sorted by length, cut into chunks of max_batch_size--> pad_batch --> (B, T), (B,)
      --backend.encode--> carry --greedy_decode / beam_decode (backend.step, backend.select)-->
        Hypothesis per item, back in input order
      --Vocabulary.decode, detokenize--> str or token list; attention rows (T_y, T_x)

Chunks of similar lengths waste little on padding; an item's result never depends on the
chunk it was decoded in (the search reads only an item's own rows, and masks its padding). With
``workers > 1`` up to that many chunks are decoded at once, in threads: a backend whose engine
releases the GIL while it computes (onnxruntime's ``session.run``) then keeps that many cores
busy with one engine thread each, where one chunk's small matrix products gain little from
splitting across threads (``benchmarks/bench_runtime_chunks.py``).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from skattn.core.checks import FLOAT32_MAX, check_int, check_real
from skattn.core.manifest import MAX_LENGTH_PENALTY
from skattn.core.search import Hypothesis, beam_decode, greedy_decode
from skattn.core.text import BOS, EOS, PAD, UNK, Vocabulary, detokenize, pad_batch

__all__ = ["Backend", "SearchSettings", "Translator", "as_text", "attention_rows", "source_ids"]

#: Items per encoder call unless a caller says otherwise: torch's per-operator overhead favours
#: large chunks (``Seq2Seq.predict``); ``serving.Runtime`` sizes its own by the model's width.
DEFAULT_MAX_BATCH_SIZE = 256
#: Log-probabilities of one decoder step (items x beams x target vocabulary) that a chunk holds
#: at most, whatever ``max_batch_size`` says: a word-level model's vocabulary of 70,000 tokens
#: in chunks of 256 items at beam 4 took 2.2-2.6 GB (float32 logits and their float64 totals).
STEP_LOGITS = 2**22


class Backend(Protocol):
    """A model's encoder and decoder step, on some engine (torch, onnxruntime).

    The carry is opaque to the search; every tensor in it is batch-first, so ``select`` keeps
    (or repeats, for beams) rows along axis 0.
    """

    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Any:
        """``src (B, T) int64, src_lengths (B,) int64`` -> the initial carry."""
        ...

    def step(
        self, y_prev: np.ndarray, carry: Any, position: int, temperature: float
    ) -> tuple[np.ndarray, Any, np.ndarray]:
        """``y_prev (N,)`` -> ``log_probs (N, V)``, the next carry, attention ``weights (N, T)``."""
        ...

    def select(self, carry: Any, rows: np.ndarray) -> Any:
        """The carry's rows ``rows (M,) int64`` (which may repeat)."""
        ...


@dataclass(frozen=True)
class SearchSettings:
    """How to search: greedy (``beam_size=1``) or beam, how long, at which temperature."""

    beam_size: int = 1
    length_penalty: float = 1.0
    max_length: int = 100
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.beam_size, "beam_size")
        check_int(self.max_length, "max_output_length")
        check_real(self.length_penalty, "length_penalty", 0.0, MAX_LENGTH_PENALTY)
        check_real(self.temperature, "temperature", 0.0, FLOAT32_MAX, low_open=True)


def as_text(prediction: str | Sequence[str]) -> str:
    """A prediction as one string: token lists (``output_kind="tokens"``) joined by spaces."""
    return prediction if isinstance(prediction, str) else " ".join(prediction)


def source_ids(vocabulary: Vocabulary, token_lists: Sequence[Sequence[str]]) -> list[list[int]]:
    """What the encoder reads: ``vocabulary.encode(tokens) + [EOS]`` for each source."""
    return [vocabulary.encode(tokens) + [EOS] for tokens in token_lists]


class Translator:
    """Translate token lists with a backend: the inference glue, written once.

    Parameters
    ----------
    backend : Backend
    source_vocabulary, target_vocabulary : Vocabulary
    tokenizer : {"char", "space"}
        Joins output tokens when ``output_kind="str"``.
    output_kind : {"str", "tokens"}
    max_batch_size : int, default=256
        The most items per encoder call (results do not depend on it).
    workers : int, default=1
        Chunks decoded at once, each in its own thread; the backend must be safe to call from
        several threads. A call's items are cut into at least ``workers`` chunks (see
        :meth:`chunk_count`), so that a call of fewer than ``max_batch_size`` items still keeps
        every worker busy (results do not depend on it).
    right_to_left : bool, default=False
        The model writes each output from its last token (an artifact whose manifest says
        ``output_order="right_to_left"``): :meth:`read` reverses what it writes, and
        :meth:`log_likelihoods` scores each output reversed, so callers see the usual order.
        :meth:`decode` gives the hypotheses as written.
    """

    def __init__(
        self,
        backend: Backend,
        source_vocabulary: Vocabulary,
        target_vocabulary: Vocabulary,
        tokenizer: str,
        output_kind: str,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        workers: int = 1,
        right_to_left: bool = False,
    ) -> None:
        self.backend = backend
        self.source_vocabulary = source_vocabulary
        self.target_vocabulary = target_vocabulary
        self.tokenizer = tokenizer
        self.output_kind = output_kind
        self.max_batch_size = check_int(max_batch_size, "max_batch_size")
        self.workers = check_int(workers, "workers")
        self.right_to_left = bool(right_to_left)
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = os.getpid()
        self._pool_lock = threading.Lock()

    def source_ids(self, token_lists: Sequence[Sequence[str]]) -> list[list[int]]:
        """Source ids with the end-of-source marker (:func:`source_ids`)."""
        return source_ids(self.source_vocabulary, token_lists)

    def decode(
        self, id_lists: Sequence[Sequence[int]], settings: SearchSettings
    ) -> list[Hypothesis]:
        """Search every id list (each ending with EOS), in length-sorted chunks, in input order."""
        if not id_lists:
            return []
        order = np.argsort([len(ids) for ids in id_lists], kind="stable")
        row_logits = settings.beam_size * len(self.target_vocabulary)
        chunks = np.array_split(order, self.chunk_count(len(order), row_logits))

        def decode_chunk(chunk: np.ndarray) -> list[Hypothesis]:
            return self._decode_chunk([id_lists[i] for i in chunk], settings)

        decoded = self._map_chunks(decode_chunk, chunks)
        hypotheses: list[Hypothesis | None] = [None] * len(id_lists)
        for chunk, chunk_hypotheses in zip(chunks, decoded, strict=True):
            for index, hypothesis in zip(chunk, chunk_hypotheses, strict=True):
                hypotheses[index] = hypothesis
        return hypotheses  # type: ignore[return-value]

    def _map_chunks(self, function: Callable[[np.ndarray], Any], chunks: list) -> list:
        """``function`` of each chunk, in chunk order: in the worker threads when there are
        several (each takes the next chunk as it finishes one)."""
        if self.workers == 1 or len(chunks) == 1:
            return list(map(function, chunks))
        return list(self._pool().map(function, chunks))

    def _pool(self) -> ThreadPoolExecutor:
        """The worker threads, started at the first call that has several chunks and kept; a
        forked child starts its own (threads do not survive a fork, and a pool that believes it
        has them would never run the child's chunks)."""
        with self._pool_lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(self.workers, "skattn-chunk")
                self._executor_pid = os.getpid()
            return self._executor

    def chunk_count(self, n: int, row_logits: int = 0) -> int:
        """How many length-sorted chunks ``n`` items are cut into: enough that none holds more
        than ``max_batch_size`` items, nor more than :data:`STEP_LOGITS` log-probabilities a
        step at ``row_logits`` per item (beams x target vocabulary; at least one item), and,
        with several workers, at least one per worker (up to one item a chunk), so that every
        worker has one. Search chunks differ by one item at most; scoring chunks
        (:meth:`log_likelihoods`) keep a source's candidates together where they fit."""
        items = self.max_batch_size
        if row_logits:
            items = min(items, max(1, STEP_LOGITS // row_logits))
        return min(n, max(math.ceil(n / items), self.workers))

    def log_likelihoods(
        self,
        sources: Sequence[Sequence[str]],
        targets: Sequence[Sequence[str]],
        temperature: float = 1.0,
    ) -> np.ndarray:
        """``log p(y | x)`` of each (source tokens, output tokens) pair: the decoder stepped over
        the given outputs (teacher forcing), each step's log-probability of the next given
        token summed, EOS's included (for the search's own answer: the score the search gave
        it); ``-inf`` where an output token is not in the target vocabulary. ``(N,) float64``.
        """
        src_ids = self.source_ids(sources)
        if self.right_to_left:  # scored as the model writes them, last token first
            targets = [list(tokens)[::-1] for tokens in targets]
        tgt_ids = [self.target_vocabulary.encode(tokens) for tokens in targets]
        scores = np.empty(len(src_ids))
        if not src_ids:
            return scores
        # A source's candidates side by side (an n-best list is one source's many outputs):
        # each chunk encodes its distinct sources once and repeats their rows, and a source's
        # candidates stay in one chunk where they fit, so that a step can read one copy of
        # its memory for all of them (as for an item's beams).
        order = sorted(
            range(len(src_ids)), key=lambda i: (len(src_ids[i]), src_ids[i], len(tgt_ids[i]))
        )
        count = self.chunk_count(len(order), len(self.target_vocabulary))
        sources_in_order = [src_ids[i] for i in order]
        chunks = _whole_groups(np.asarray(order, dtype=np.int64), sources_in_order, count)

        def score_chunk(rows: np.ndarray) -> np.ndarray:
            distinct: dict[tuple[int, ...], int] = {}
            of_row = np.array([distinct.setdefault(tuple(src_ids[r]), len(distinct)) for r in rows])
            carry = self.encode([list(ids) for ids in distinct])
            if len(distinct) < rows.size:
                carry = self.backend.select(carry, of_row)
            inputs, _ = pad_batch([[BOS, *tgt_ids[r]] for r in rows])  # (B, L + 1)
            outputs, _ = pad_batch([[*tgt_ids[r], EOS] for r in rows])  # (B, L + 1)
            total = np.zeros(rows.size)
            for t in range(outputs.shape[1]):  # a row past its EOS reads PAD: not counted
                log_probs, carry, _ = self.backend.step(inputs[:, t], carry, t, temperature)
                picked = np.asarray(log_probs, dtype=np.float64)[
                    np.arange(rows.size), outputs[:, t]
                ]
                total += np.where(outputs[:, t] != PAD, picked, 0.0)
            return total

        for rows, total in zip(chunks, self._map_chunks(score_chunk, chunks), strict=True):
            scores[rows] = total
        scores[[UNK in ids for ids in tgt_ids]] = -np.inf
        return scores

    def encode(self, id_lists: Sequence[Sequence[int]]) -> Any:
        """The backend's initial carry for id lists (each ending with EOS), padded as one batch."""
        src, src_lengths = pad_batch(id_lists)  # (B, T), (B,)
        return self.backend.encode(src, src_lengths)

    def _decode_chunk(
        self, id_lists: Sequence[Sequence[int]], settings: SearchSettings
    ) -> list[Hypothesis]:
        backend = self.backend
        carry = self.encode(id_lists)
        step = functools.partial(backend.step, temperature=settings.temperature)
        n = len(id_lists)
        if settings.beam_size == 1:
            return greedy_decode(step, backend.select, carry, n, settings.max_length)
        return beam_decode(
            step,
            backend.select,
            carry,
            n,
            settings.beam_size,
            settings.max_length,
            length_penalty=settings.length_penalty,
        )

    def read(self, hypothesis: Hypothesis) -> Hypothesis:
        """``hypothesis`` in the usual order: as written, or for a right-to-left model its
        tokens and their attention rows reversed (the EOS step's row, if any, stays last)."""
        if not self.right_to_left:
            return hypothesis
        n = len(hypothesis.tokens)
        weights = hypothesis.weights
        rows = np.concatenate([weights[:n][::-1], weights[n:]]) if n else weights
        return Hypothesis(hypothesis.tokens[::-1], rows, hypothesis.score)

    def output(self, token_ids: Sequence[int]) -> str | list[str]:
        """Output ids as the model's output kind: a str, or a list of tokens."""
        tokens = self.target_vocabulary.decode(token_ids)
        return tokens if self.output_kind == "tokens" else detokenize(tokens, self.tokenizer)

    def translate(
        self,
        token_lists: Sequence[Sequence[str]],
        settings: SearchSettings,
        with_attention: bool = False,
    ) -> tuple[list, list[np.ndarray] | None]:
        """Predictions for tokenized sources and, with ``with_attention``, their maps.

        Returns
        -------
        predictions : list
            One per source: a str or a token list (``output_kind``).
        attentions : list of ndarray (T_y, T_x) float64, or None
            One row per output token (the search never emits a special id), one column per
            source token plus the end-of-source marker; rows sum to 1.
        """
        id_lists = self.source_ids(token_lists)
        hypotheses = [self.read(h) for h in self.decode(id_lists, settings)]
        predictions = [self.output(h.tokens) for h in hypotheses]
        if not with_attention:
            return predictions, None
        attentions = [
            attention_rows(h, len(ids)) for ids, h in zip(id_lists, hypotheses, strict=True)
        ]
        return predictions, attentions


def _whole_groups(order: np.ndarray, keys: Sequence, count: int) -> list[np.ndarray]:
    """``order`` cut into chunks of at most ``ceil(len / count)`` items, each ending where a run
    of equal ``keys`` ends unless the run alone is longer than a chunk; ``count`` chunks of
    ``np.array_split`` where that makes fewer than ``count``, or more than 1.25 times as many
    (runs longer than half a chunk, one to a chunk, would make up to twice as many calls:
    1.06-1.09x the time of the even split for 17 and 20 candidates at chunks of 32)."""
    limit = math.ceil(len(order) / count)
    ends = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    chunks, start, previous = [], 0, 0
    for end in ends:  # the runs [previous, end)
        if end - start > limit and previous > start:  # close the chunk before this run
            chunks.append(order[start:previous])
            start = previous
        while end - start > limit:  # a run longer than a chunk
            chunks.append(order[start : start + limit])
            start += limit
        previous = end
    chunks.append(order[start:])
    return chunks if count <= len(chunks) <= 1.25 * count else np.array_split(order, count)


def attention_rows(hypothesis: Hypothesis, width: int | None = None) -> np.ndarray:
    """A hypothesis' map ``(T_y, T_x)`` float64: one row per output token (the search never
    emits a special id), the item's own ``width`` source columns (marker included)."""
    return hypothesis.weights[: len(hypothesis.tokens), :width].astype(np.float64)
