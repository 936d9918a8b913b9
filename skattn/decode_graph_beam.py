"""Beam search as nested ONNX ``Loop``s around the inlined decoder step (part of ``decode.onnx``).

The decisions of :func:`skattn.core.beam.beam_decode`, written over fixed beam slots: item
``b`` of a segment's ``n`` owns rows ``b * r .. b * r + r - 1``, its live beams first in rank
order and dead slots at -inf after them, which is the NumPy search's layout once it pads each
item to ``r`` beams: ``r = K`` after the first step, ``r = 1`` before it for a batch of two or
more items (``r = K`` for one, one row live). Per step ``i`` (``N = n * r`` rows, ``V`` target
ids)::

    total[b, k * V + y] = log p(beam b,k) + log p(y | beam b,k)       (n, r V), float64
    top, index = TopK(total, 2K)      descending; equal totals keep the lower flat index, so
                                       ties go to the earlier beam, then the lower token id
                                       (with r V < 2K, -inf columns pad total to 2K: dead)
    ends  = (token == EOS) & finite & (rank < K)         finished: total / (i + 1) ** alpha
    grows = the first K finite non-EOS extensions        the next live beams, in rank order

An item keeps only its best finished hypothesis (``ArgMax`` takes the first of equal scores
within a step and a later step must score strictly higher: the NumPy search's ``max`` over
hypotheses in the order they finished). It stops with ``K`` finished, or when no extension
grows; one that finished nothing then returns its best live beam, as it does at ``max_length``.

Two loops, as in greedy search (:mod:`skattn.decode_graph_greedy`), so that an item that stops
stops costing its ``K`` rows, as in the NumPy search::

    segments  Loop   carries the items still searching (n <= B) and their n K rows; the
                     source's memory, keys and mask one row per item where the step reads
                     them so (``item_memory``), else once per row
      steps   Loop   beam steps over those items until a step where some item stops
      compact        each stopped item's best hypothesis (its id) written to its place in
                     the (B,) results; Gather of the others' rows for the next segment
    trace     Loop   each item's tokens and attention rows, read back from its best id

No step copies a beam's tokens or attention rows (the square of the output length in all): each
step writes its new rows once, as the inner loop's scan outputs, and each segment appends them
to a history that the search reads its results back from (:mod:`skattn.decode_graph_history`).
"""

from __future__ import annotations

import numpy as np

from skattn.core.manifest import MEMORY_NAMES, Manifest
from skattn.core.text import BOS, EOS
from skattn.decode_graph_greedy import (
    BOOL,
    DOUBLE,
    FLOAT,
    INT64,
    decoder_step,
    fill,
    state_types,
)
from skattn.decode_graph_history import (
    HISTORY_TYPES,
    append_history,
    root_history,
    trace_history,
)
from skattn.onnx_graph import GraphBuilder, value_info

__all__ = ["beam_search"]


def _best_live(b: GraphBuilder, beam_lp: str, steps: str, alpha: float):
    """Each item's best live beam, normalised by ``max(steps, 1) ** alpha``: its slot ``(n,)``
    and its score ``(n,)`` (the first of equal scores)."""
    norm = b.op("Pow", b.cast(b.op("Max", steps, b.const(1, np.int64)), DOUBLE), b.const(alpha))
    scores = b.op("Div", beam_lp, norm)  # (B, K)
    slot = b.op("ArgMax", scores, axis=1, keepdims=1)  # (B, 1)
    return b.squeeze(slot, 1), b.squeeze(b.op("GatherElements", scores, slot, axis=1), 1)


def _keep_best(b, take, row, score, length, ins) -> list[str]:
    """``best_score``, ``best_length`` and ``best_id`` replaced by beam ``row``'s where
    ``take`` (n,): ``row`` indexes the rows of ``ins["row_ids"]``."""
    return [
        b.where(take, score, ins["best_score"]),
        b.where(take, length, ins["best_length"]),
        b.where(take, b.gather_rows(ins["row_ids"], row), ins["best_id"]),
    ]


_BEST = ("best_score", "best_length", "best_id")
_ITEM_NAMES = ("beam_lp", "n_finished", *_BEST)
_OUTS = ("out_score", "out_length", "out_id")  # (B,) each item's best, written when it stops
_TYPES = {
    "y_prev": (INT64, 1),
    "row_ids": (INT64, 1),
    "beam_lp": (DOUBLE, 2),
    "still": (BOOL, 1),
    "n_finished": (INT64, 1),
    "best_score": (DOUBLE, 1),
    "best_length": (INT64, 1),
    "best_id": (INT64, 1),
    **HISTORY_TYPES,
}


def _beam_step(body: GraphBuilder, decoder, manifest: Manifest, ins: dict, seg: dict) -> dict:
    """One beam step over a segment's ``n`` items, all of them searching, from ``r`` rows per
    item (``beam_lp (n, r)``: ``K``, or 1 at the first step of a batch of at least
    ``NARROW_START_ITEMS`` items); returns the carried values
    after it, ``K`` rows per item, and ``still (n,)``, the items that search on. What depends
    only on ``n`` and ``r`` comes from ``seg``, computed once per segment (:func:`_steps`)."""
    K, V, alpha = manifest.beam_size, len(manifest.target_vocabulary), manifest.length_penalty
    states = list(manifest.state_names)
    i = seg["position"]  # () tokens so far
    log_probs, new_states, weights = decoder_step(
        body, decoder, manifest, ins["y_prev"], {s: ins[s] for s in states}, seg, i
    )  # (N, V) float64, (N, T)
    first_row, first = seg["first_row"], seg["first"]  # (n,), (n, 1)
    total = body.op("Add", body.reshape(ins["beam_lp"], [-1, 1]), log_probs)  # (N, V)
    flat = body.reshape(total, seg["flat_shape"])  # (n, r V)
    if V < 2 * K:  # a first step (r = 1) has fewer than 2K extensions: pad with dead ones
        flat = body.op("Concat", flat, seg["dead"], axis=1)  # (n, r V + 2K - V)
    top, index = body.op("TopK", flat, body.const([2 * K], np.int64), axis=1, outputs=2)
    beam = body.op("Div", index, body.const(V, np.int64))  # (n, 2K) slot extended
    if V < 2 * K:  # the padding's slots, dead extensions, read the item's last row
        beam = body.op("Min", beam, seg["last_slot"])
    token = body.op("Mod", index, body.const(V, np.int64))  # (n, 2K)
    finite = body.op(  # NaN fails both comparisons
        "And",
        body.op("Less", top, body.const(np.inf)),
        body.op("Greater", top, body.const(-np.inf)),
    )
    is_eos = body.op("And", body.op("Equal", token, body.const(EOS, np.int64)), finite)
    rank = np.arange(2 * K, dtype=np.int64)[None]  # (1, 2K)
    ends = body.op("And", is_eos, body.const(rank < K))
    grows = body.op("And", finite, body.op("Not", is_eos))
    grown = body.op("CumSum", body.cast(grows, INT64), body.const(1, np.int64))
    grows = body.op("And", grows, body.op("LessOrEqual", grown, body.const(K, np.int64)))
    n_growing = body.op("ReduceSum", body.cast(grows, INT64), body.const([1], np.int64), keepdims=0)
    n_ends = body.op("ReduceSum", body.cast(ends, INT64), body.const([1], np.int64), keepdims=0)
    n_finished = body.op("Add", ins["n_finished"], n_ends)  # (n,)

    # The best hypothesis finished at this step: sum(log p) / (i + 1) ** alpha, EOS counted.
    norm = body.op(
        "Pow", body.cast(body.op("Add", i, body.const(1, np.int64)), DOUBLE), body.const(alpha)
    )
    finished = body.where(ends, body.op("Div", top, norm), body.const(-np.inf))  # (n, 2K)
    rank_best = body.op("ArgMax", finished, axis=1, keepdims=1)  # (n, 1)
    finished_score = body.squeeze(body.op("GatherElements", finished, rank_best, axis=1), 1)
    finished_slot = body.squeeze(body.op("GatherElements", beam, rank_best, axis=1), 1)
    improves = body.op("Greater", finished_score, ins["best_score"])  # (n,) strictly
    # An item that can grow no beam and finished none returns its best live beam as it was.
    zero_i = body.const(0, np.int64)
    stalled = body.op(
        "And", body.op("Equal", n_growing, zero_i), body.op("Equal", n_finished, zero_i)
    )
    live_slot, live_score = _best_live(body, ins["beam_lp"], i, alpha)
    row = body.op("Add", first_row, body.where(stalled, live_slot, finished_slot))  # (n,)
    score = body.where(stalled, live_score, finished_score)
    best = _keep_best(body, body.op("Or", improves, stalled), row, score, i, ins)

    # The next live beams: the kept extensions first, in rank order, then dead slots.
    still = body.op(  # (n,)
        "And",
        body.op("Less", n_finished, body.const(K, np.int64)),
        body.op("Greater", n_growing, zero_i),
    )
    keep = body.op("And", grows, body.unsqueeze(still, 1))  # (n, 2K)
    key = body.where(keep, body.const(rank), body.const(rank + 2 * K))
    _, chosen = body.op("TopK", key, body.const([K], np.int64), axis=1, largest=0, outputs=2)
    valid = body.op("GatherElements", keep, chosen, axis=1)  # (n, K)
    next_lp = body.where(
        valid, body.op("GatherElements", top, chosen, axis=1), body.const(-np.inf)
    )  # (n, K)
    next_token = body.reshape(body.op("GatherElements", token, chosen, axis=1), [-1])  # (N,)
    source = body.reshape(  # (N,) the row each new beam extends
        body.op("Add", first, body.op("GatherElements", beam, chosen, axis=1)), [-1]
    )
    # The new rows' ids: H + s N + j (s: the segment's step, j: the row).
    base = body.op("Add", seg["offset"], body.op("Mul", body.iteration, seg["rows_after"]))
    after = {
        "y_prev": next_token,
        "beam_lp": next_lp,
        "row_ids": body.op("Add", seg["row_range"], base),  # (N,)
        "parent": body.gather_rows(ins["row_ids"], source),  # (N,)
        "token": next_token,  # (N,)
        "attention": body.gather_rows(weights, source),  # (N, T)
    }
    after.update({s: body.gather_rows(new_states[s], source) for s in states})
    after.update(still=still, n_finished=n_finished)
    after.update(zip(_BEST, best, strict=True))
    return after


def _steps(outer: GraphBuilder, decoder, manifest: Manifest, ins: dict, seg: dict) -> dict:
    """The inner ``Loop``: beam steps over the segment's items until one of them stops (or
    ``max_length``); returns the carried values after the last step, ``still`` included, and the
    steps' history, ``parent (S, N)``, ``token (S, N)`` and ``attention (S, N, T)``."""
    K, states = manifest.beam_size, list(manifest.state_names)
    carried = ["y_prev", *states, "beam_lp", "row_ids", "still", "n_finished", *_BEST]
    V = len(manifest.target_vocabulary)
    n, r = outer.dim(ins["beam_lp"], 0), outer.dim(ins["beam_lp"], 1)  # (1,) each
    first_row = _first_rows(outer, n, r)
    seg = {**seg, "first_row": first_row, "first": outer.unsqueeze(first_row, 1)}
    seg["flat_shape"] = outer.op("Concat", n, outer.const([-1], np.int64), axis=0)  # (n, r V)
    rows_after = outer.op("Mul", n, outer.const([K], np.int64))  # (1,) N after a step
    seg["rows_after"] = outer.squeeze(rows_after, 0)  # ()
    seg["row_range"] = outer.arange(rows_after)  # (N,)
    seg["offset"] = outer.squeeze(outer.dim(ins["hist_parent"], 0), 0)  # () H
    if V < 2 * K:
        shape = outer.op("Concat", n, outer.const([2 * K - V], np.int64), axis=0)
        seg["dead"] = fill(outer, shape, -np.inf, np.float64)  # (n, 2K - V)
        seg["last_slot"] = outer.op("Sub", r, outer.const([1], np.int64))  # (1,)
    # A segment ends after its first step when that step came from one row per item (the
    # memory has no K rows yet), else at the first step where some item stops.
    wide = outer.op("Equal", outer.squeeze(r, 0), outer.const(K, np.int64))  # ()

    body = GraphBuilder("beam/step/")
    own = body.loop_inputs(carried)
    position = body.op("Add", ins["done"], body.iteration)  # () tokens so far
    after = _beam_step(body, decoder, manifest, own, {**seg, "position": position})
    every = body.op("ReduceMin", body.cast(after["still"], INT64), keepdims=0)  # () 1: none stops
    cond = body.op("And", body.cast(every, BOOL), wide)
    types = {**_TYPES, **state_types(decoder)}
    scans = {"parent": (INT64, 1), "token": (INT64, 1), "attention": (FLOAT, 2)}
    graph = body.loop_body(
        "beam_steps",
        cond,
        {name: (after[name], types[name]) for name in carried},
        {name: (after[name], kind) for name, kind in scans.items()},
    )

    initial = [ins[name] if name != "still" else fill(outer, n, True, np.bool_)
               for name in carried]  # fmt: skip
    results = outer.op(
        "Loop",
        outer.op("Sub", "max_length", ins["done"]),  # steps left
        outer.const(True),
        *initial,
        outputs=len(carried) + len(scans),
        body=graph,
    )
    return dict(zip([*carried, *scans], results, strict=True))


def _first_rows(b: GraphBuilder, n: str, r: str) -> str:
    """``(n,)``: ``0, r, 2r, ...``, the first row of each of ``n`` items of ``r`` rows
    (``(1,)`` tensors)."""
    return b.op("Mul", b.arange(n), r)


def _each_k_times(b: GraphBuilder, rows: str, K: int) -> str:
    """``(m K,)``: each of ``rows (m,)`` ``K`` times in a row (an item's K copies of its carry)."""
    return b.reshape(b.op("Expand", b.unsqueeze(rows, 1), b.const([1, K], np.int64)), [-1])


def _rows_of(b: GraphBuilder, items: str, K: int) -> str:
    """``(m K,)``: the rows of the segment's items ``items (m,)``, each item's ``K`` in order."""
    first = b.unsqueeze(b.op("Mul", items, b.const(K, np.int64)), 1)  # (m, 1)
    return b.reshape(b.op("Add", first, b.const(np.arange(K, dtype=np.int64)[None])), [-1])


# Batches of at least this many items start with one row per item (each item's one live beam)
# and take their first step alone, before the carry is copied K times; smaller ones start with
# K rows per item, K - 1 of them dead. Measured (before ``item_memory``, which copies no memory)
# on the bi-GRU 256 G2P member (float32, one thread, time against the single-loop graph): one
# row per item 1.075x for one word, 0.91x at 8, 0.83x at 32, 0.78x at 64; K rows per item
# 1.015x, 0.96x, 0.90x and 0.85x. With this choice: 1.04x at 1, 1.02x at 2, 0.97x at 4, 0.93x at
# 8, 0.83x at 32, 0.80x at 64.
NARROW_START_ITEMS = 2


def _first_rows_layout(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict, item_memory: bool
) -> dict:
    """The rows the search starts from: ``y_prev``, states, memory, keys, mask, ``row_ids``
    (the history's root, 0) and ``beam_lp (B, r)``, with ``r = 1`` row per item for batches of
    at least ``NARROW_START_ITEMS`` items, else ``r = K`` (an ``If``: one copy of the carry;
    with ``item_memory``, one copy of the rest, and the memory, keys and mask as they are)."""
    K, states = manifest.beam_size, list(manifest.state_names)
    names = ["y_prev", *states, "memory", "keys", "mask", "row_ids", "beam_lp"]
    types = {**_TYPES, **state_types(decoder)}
    B = b.dim("src", 0)  # (1,)
    branches = {}
    for r in (1, K):
        sub = GraphBuilder(f"beam/start{r}/")
        if r == 1:
            rows = {name: sub.op("Identity", carry[name]) for name in carry}
        else:  # item b's rows b K .. b K + K - 1, all copies of its carry
            copies = _each_k_times(sub, sub.arange(B), K)
            rows = {
                name: sub.op("Identity", value)
                if item_memory and name in MEMORY_NAMES
                else sub.gather_rows(value, copies)
                for name, value in carry.items()
            }
        N = sub.op("Mul", B, sub.const([r], np.int64))  # (1,)
        start_lp = np.full((1, r), -np.inf)
        start_lp[0, 0] = 0.0  # one live beam per item
        rows.update(
            y_prev=fill(sub, N, BOS, np.int64),  # (N,)
            row_ids=fill(sub, N, 0, np.int64),  # (N,) every row at the root
            beam_lp=sub.op(
                "Tile", sub.const(start_lp), sub.op("Concat", B, sub.const([1], np.int64), axis=0)
            ),
        )
        outs = [value_info(rows[name], *types[name]) for name in names]
        branches[r] = sub.graph(f"beam_start_{r}", [], outs)
    narrow = b.op("GreaterOrEqual", b.squeeze(B, 0), b.const(NARROW_START_ITEMS, np.int64))
    results = b.op(
        "If", narrow, outputs=len(names), then_branch=branches[1], else_branch=branches[K]
    )
    return dict(zip(names, results, strict=True))


def _write(b: GraphBuilder, outs: dict, at: str, results: list[str]) -> list[str]:
    """The ``(B,)`` results ``out_score``, ``out_length``, ``out_id`` with rows ``at (f, 1)``
    set to ``results`` (each ``(f,)``)."""
    return [
        b.op("ScatterND", outs[name], at, value) for name, value in zip(_OUTS, results, strict=True)
    ]


def beam_search(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict[str, str], item_memory: bool = False
) -> tuple[str, str, str, str]:
    """Add the beam search; returns ``tokens (B, L), lengths (B,), attention (B, L, T),
    scores (B,)`` (length-normalised, float64) of each item's best hypothesis.

    The outer ``Loop`` (segments) carries the items still searching, their rows and ``items``,
    their places in the batch, and the history; the results ``out_*`` are ``(B,)``, each item's
    written once, when it stops (or after the loop, for those still searching at
    ``max_length``), and read back from the history at the end (:func:`trace_history`).

    ``item_memory``: the step reads one row of memory, keys and mask per item for its ``r``
    rows per item (:data:`~skattn.core.manifest.ITEM_MEMORY_KEY`), so the search carries one
    copy of each, not ``K``: the G2P member (int8, beam 5) in 0.95x the time at 32 items and
    0.89-0.90x at 64 to 256, with the same answers (``benchmarks/bench_item_memory.py``).
    """
    K, alpha = manifest.beam_size, manifest.length_penalty
    states = list(manifest.state_names)
    B = b.dim("src", 0)  # (1,)
    T = b.dim("src", 1)  # (1,)
    carried = ["y_prev", *states, "memory", "keys", "mask", "row_ids", *_ITEM_NAMES]
    carried += ["items", "done", *HISTORY_TYPES]
    names = [*carried, *_OUTS]
    initial = {
        **_first_rows_layout(b, decoder, manifest, carry, item_memory),
        "n_finished": fill(b, B, 0, np.int64),  # (B,)
        "best_score": fill(b, B, -np.inf, np.float64),  # (B,)
        "best_length": fill(b, B, 0, np.int64),  # (B,)
        "best_id": fill(b, B, 0, np.int64),  # (B,) the root: no tokens
        "items": b.arange(B),  # (B,)
        "done": b.const(0, np.int64),  # () steps taken
        **root_history(b, T),
        "out_score": fill(b, B, 0.0, np.float64),
        "out_length": fill(b, B, 0, np.int64),
        "out_id": fill(b, B, 0, np.int64),
    }

    body = GraphBuilder("beam/")
    ins = body.loop_inputs(names)
    seg = {name: ins[name] for name in MEMORY_NAMES}
    after = _steps(body, decoder, manifest, ins, seg)  # K rows per item
    still = after["still"]  # (n,)
    keep = body.squeeze(body.op("NonZero", still), 0)  # (m,) the items that search on
    stop = body.squeeze(body.op("NonZero", body.op("Not", still)), 0)  # (f,)
    rows = _rows_of(body, keep, K)  # (m K,)
    kept = {name: body.gather_rows(after[name], rows) for name in ["y_prev", *states, "row_ids"]}
    if item_memory:  # the segment's memory has one row per item
        kept.update({name: body.gather_rows(ins[name], keep) for name in MEMORY_NAMES})
    else:  # r rows per item (1 or K, as beam_lp), all equal: row 0 K times
        r = body.dim(ins["beam_lp"], 1)  # (1,)
        copies = _each_k_times(body, body.op("Mul", keep, r), K)  # (m K,)
        kept.update({name: body.gather_rows(ins[name], copies) for name in MEMORY_NAMES})
    kept.update({name: body.gather_rows(after[name], keep) for name in _ITEM_NAMES})
    kept["items"] = body.gather_rows(ins["items"], keep)
    kept["done"] = body.op("Add", ins["done"], body.squeeze(body.dim(after["token"], 0), 0))
    kept.update(append_history(body, ins, after, T))
    at = body.unsqueeze(body.gather_rows(ins["items"], stop), 1)  # (f, 1)
    written = _write(body, ins, at, [body.gather_rows(after[k], stop) for k in _BEST])
    kept.update(zip(_OUTS, written, strict=True))
    more = body.op("Less", kept["done"], "max_length")

    types = {**_TYPES, **state_types(decoder)}
    types.update(items=(INT64, 1), done=(INT64, 0), out_score=(DOUBLE, 1), out_length=(INT64, 1))
    types.update(out_id=(INT64, 1))
    graph = body.loop_body(
        "beam_segment",
        body.op("And", body.any(still), more),
        {name: (kept[name], types[name]) for name in names},
    )
    final = dict(
        zip(
            names,
            b.op(
                "Loop",
                "max_length",
                # no segment for an empty batch, as in greedy search (whose fused cells would
                # end the process on 0 rows): empty outputs, not an error in the first step
                b.squeeze(b.op("Greater", b.dim("src", 0), b.const([0], np.int64)), 0),
                *(initial[name] for name in names),
                outputs=len(names),
                body=graph,
            ),
            strict=True,
        )
    )

    # Items still searching after max_length steps: the best finished hypothesis, or the best
    # live beam of those that finished nothing.
    steps = final["done"]  # () steps taken
    open_ = b.op("Equal", final["n_finished"], b.const(0, np.int64))  # (m,)
    live_slot, live_score = _best_live(b, final["beam_lp"], steps, alpha)
    # rows per item: K, or 1 where no step ran (max_length <= 0 for two or more items)
    per_item = b.dim(final["beam_lp"], 1)  # (1,)
    row = b.op("Add", _first_rows(b, b.dim(final["items"], 0), per_item), live_slot)
    results = _keep_best(b, open_, row, live_score, steps, final)
    score, length, ids = _write(b, final, b.unsqueeze(final["items"], 1), results)
    tokens, attention = trace_history(b, final, ids, length, b.unsqueeze(steps, 0))
    return tokens, length, attention, score
