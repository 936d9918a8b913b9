"""Beam search as an ONNX ``Loop`` around the inlined decoder step (part of ``decode.onnx``).

The decisions of :func:`skattn.core.beam.beam_decode`, written over fixed beam slots: item
``b`` owns rows ``b * K .. b * K + K - 1``, its live beams first in rank order and dead slots at
-inf after them, which is the NumPy search's layout once it pads each item to ``K`` beams. Per
step ``i`` (``N = B * K`` rows, ``V`` target ids)::

    total[b, k * V + y] = log p(beam b,k) + log p(y | beam b,k)       (B, K V), float64
    top, index = TopK(total, 2K)      descending; equal totals keep the lower flat index, so
                                       ties go to the earlier beam, then the lower token id
    ends  = (token == EOS) & finite & (rank < K)         finished: total / (i + 1) ** alpha
    grows = the first K finite non-EOS extensions        the next live beams, in rank order

An item keeps only its best finished hypothesis (``ArgMax`` takes the first of equal scores
within a step and a later step must score strictly higher: the NumPy search's ``max`` over
hypotheses in the order they finished). It stops with ``K`` finished, or when no extension
grows; one that finished nothing then returns its best live beam, as it does at ``max_length``.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from skattn.core.manifest import Manifest
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
from skattn.onnx_graph import GraphBuilder, value_info

__all__ = ["beam_search"]


def _best_live(b: GraphBuilder, beam_lp: str, steps: str, alpha: float):
    """Each item's best live beam, normalised by ``max(steps, 1) ** alpha``: its slot ``(B,)``
    and its score ``(B,)`` (the first of equal scores)."""
    norm = b.op("Pow", b.cast(b.op("Max", steps, b.const(1, np.int64)), DOUBLE), b.const(alpha))
    scores = b.op("Div", beam_lp, norm)  # (B, K)
    slot = b.op("ArgMax", scores, axis=1, keepdims=1)  # (B, 1)
    return b.squeeze(slot, 1), b.squeeze(b.op("GatherElements", scores, slot, axis=1), 1)


def _keep_best(b, take, row, score, length, ins) -> list[str]:
    """``best_*`` replaced by beam ``row``'s tokens and attention where ``take`` (B,)."""
    take2 = b.unsqueeze(take, 1)  # (B, 1)
    return [
        b.where(take, score, ins["best_score"]),
        b.where(take, length, ins["best_length"]),
        b.where(take2, b.gather_rows(ins["tokens"], row), ins["best_tokens"]),  # (B, t)
        b.where(b.unsqueeze(take2, 2), b.gather_rows(ins["paths"], row), ins["best_paths"]),
    ]


def beam_search(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict[str, str]
) -> tuple[str, str, str, str]:
    """Add the beam ``Loop``; returns ``tokens (B, L), lengths (B,), attention (B, L, T),
    scores (B,)`` (length-normalised, float64) of each item's best hypothesis."""
    K, V, alpha = manifest.beam_size, len(manifest.target_vocabulary), manifest.length_penalty
    states = list(manifest.state_names)
    B = b.dim("src", 0)  # (1,)
    T = b.dim("src", 1)  # (1,)
    N = b.op("Mul", B, b.const([K], np.int64))  # (1,)
    items = b.op("Range", b.const(0, np.int64), b.squeeze(B, 0), b.const(1, np.int64))  # (B,)
    first_row = b.op("Mul", items, b.const(K, np.int64))  # (B,) item b owns rows b K .. b K + K-1
    item_of_row = b.reshape(b.op("Tile", b.unsqueeze(items, 1), b.const([1, K], np.int64)), [-1])
    wide = {name: b.gather_rows(value, item_of_row) for name, value in carry.items()}
    start_lp = np.full((1, K), -np.inf)
    start_lp[0, 0] = 0.0  # one live beam per item
    zero = b.const([0], np.int64)
    names = ["y_prev", *states, "beam_lp", "tokens", "paths", "active", "n_finished"]
    names += ["best_score", "best_length", "best_tokens", "best_paths"]
    initial = [
        fill(b, N, BOS, np.int64),  # y_prev (N,)
        *(wide[name] for name in states),
        b.op("Tile", b.const(start_lp), b.op("Concat", B, b.const([1], np.int64), axis=0)),
        fill(b, b.op("Concat", N, zero, axis=0), 0, np.int64),  # tokens (N, 0)
        fill(b, b.op("Concat", N, zero, T, axis=0), 0.0, np.float32),  # paths (N, 0, T)
        fill(b, B, True, np.bool_),  # active (B,)
        fill(b, B, 0, np.int64),  # n_finished (B,)
        fill(b, B, -np.inf, np.float64),  # best_score (B,)
        fill(b, B, 0, np.int64),  # best_length (B,)
        fill(b, b.op("Concat", B, zero, axis=0), 0, np.int64),  # best_tokens (B, 0)
        fill(b, b.op("Concat", B, zero, T, axis=0), 0.0, np.float32),  # best_paths (B, 0, T)
    ]

    body = GraphBuilder("beam/")
    ins = {name: f"beam/in_{name}" for name in names}
    i = "beam/i"
    log_probs, new_states, weights = decoder_step(
        body, decoder, manifest, ins["y_prev"], {s: ins[s] for s in states}, wide, i
    )  # (N, V) float64, (N, T)
    first = body.unsqueeze(first_row, 1)  # (B, 1), outer scope
    total = body.op("Add", body.reshape(ins["beam_lp"], [-1, 1]), log_probs)  # (N, V)
    flat = body.reshape(total, [-1, K * V])  # (B, K V)
    top, index = body.op("TopK", flat, body.const([2 * K], np.int64), axis=1, outputs=2)
    beam = body.op("Div", index, body.const(V, np.int64))  # (B, 2K) slot extended
    token = body.op("Mod", index, body.const(V, np.int64))  # (B, 2K)
    finite = body.op(  # NaN fails both comparisons
        "And",
        body.op("Less", top, body.const(np.inf)),
        body.op("Greater", top, body.const(-np.inf)),
    )
    active = body.unsqueeze(ins["active"], 1)  # (B, 1)
    is_eos = body.op("And", body.op("Equal", token, body.const(EOS, np.int64)), finite)
    rank = np.arange(2 * K, dtype=np.int64)[None]  # (1, 2K)
    ends = body.op("And", body.op("And", is_eos, body.const(rank < K)), active)
    grows = body.op("And", body.op("And", finite, body.op("Not", is_eos)), active)
    grown = body.op("CumSum", body.cast(grows, INT64), body.const(1, np.int64))
    grows = body.op("And", grows, body.op("LessOrEqual", grown, body.const(K, np.int64)))
    n_growing = body.op("ReduceSum", body.cast(grows, INT64), body.const([1], np.int64), keepdims=0)
    n_ends = body.op("ReduceSum", body.cast(ends, INT64), body.const([1], np.int64), keepdims=0)
    n_finished = body.op("Add", ins["n_finished"], n_ends)  # (B,)

    # The best hypothesis finished at this step: sum(log p) / (i + 1) ** alpha, EOS counted.
    norm = body.op(
        "Pow", body.cast(body.op("Add", i, body.const(1, np.int64)), DOUBLE), body.const(alpha)
    )
    finished = body.where(ends, body.op("Div", top, norm), body.const(-np.inf))  # (B, 2K)
    rank_best = body.op("ArgMax", finished, axis=1, keepdims=1)  # (B, 1)
    finished_score = body.squeeze(body.op("GatherElements", finished, rank_best, axis=1), 1)
    finished_slot = body.squeeze(body.op("GatherElements", beam, rank_best, axis=1), 1)
    improves = body.op("Greater", finished_score, ins["best_score"])  # (B,) strictly
    # An item that can grow no beam and finished none returns its best live beam as it was.
    zero_i = body.const(0, np.int64)
    stalled = body.op(
        "And",
        ins["active"],
        body.op("And", body.op("Equal", n_growing, zero_i), body.op("Equal", n_finished, zero_i)),
    )
    live_slot, live_score = _best_live(body, ins["beam_lp"], i, alpha)
    row = body.op("Add", first_row, body.where(stalled, live_slot, finished_slot))  # (B,)
    score = body.where(stalled, live_score, finished_score)
    best = _keep_best(body, body.op("Or", improves, stalled), row, score, i, ins)

    # The next live beams: the kept extensions first, in rank order, then dead slots.
    still = body.op(
        "And",
        body.op("Less", n_finished, body.const(K, np.int64)),
        body.op("Greater", n_growing, zero_i),
    )
    still = body.op("And", ins["active"], still)  # (B,)
    keep = body.op("And", grows, body.unsqueeze(still, 1))  # (B, 2K)
    key = body.where(keep, body.const(rank), body.const(rank + 2 * K))
    _, chosen = body.op("TopK", key, body.const([K], np.int64), axis=1, largest=0, outputs=2)
    valid = body.op("GatherElements", keep, chosen, axis=1)  # (B, K)
    next_lp = body.where(
        valid, body.op("GatherElements", top, chosen, axis=1), body.const(-np.inf)
    )  # (B, K)
    next_token = body.reshape(body.op("GatherElements", token, chosen, axis=1), [-1])  # (N,)
    source = body.reshape(  # (N,) the row each new beam extends
        body.op("Add", first, body.op("GatherElements", beam, chosen, axis=1)), [-1]
    )
    tokens = body.op(
        "Concat", body.gather_rows(ins["tokens"], source), body.unsqueeze(next_token, 1), axis=1
    )  # (N, i + 1)
    paths = body.op(
        "Concat",
        body.gather_rows(ins["paths"], source),
        body.unsqueeze(body.gather_rows(weights, source), 1),
        axis=1,
    )
    Bb, Tb = body.dim(ins["active"], 0), body.dim(weights, 1)
    one = body.const([1], np.int64)
    best[2] = body.op(
        "Concat", best[2], fill(body, body.op("Concat", Bb, one, axis=0), 0, np.int64), axis=1
    )  # (B, i + 1)
    best[3] = body.op(
        "Concat",
        best[3],
        fill(body, body.op("Concat", Bb, one, Tb, axis=0), 0.0, np.float32),
        axis=1,
    )
    outputs = [body.any(still), next_token]
    outputs += [body.gather_rows(new_states[s], source) for s in states]
    outputs += [next_lp, tokens, paths, still, n_finished, *best]

    types = state_types(decoder)
    elem = {"y_prev": (INT64, 1), "beam_lp": (DOUBLE, 2), "tokens": (INT64, 2)}
    elem.update(paths=(FLOAT, 3), active=(BOOL, 1), n_finished=(INT64, 1))
    elem.update(best_score=(DOUBLE, 1), best_length=(INT64, 1), best_tokens=(INT64, 2))
    elem.update(best_paths=(FLOAT, 3), **{s: types[s] for s in states})
    graph_in = [value_info(i, INT64, 0), value_info("beam/cond", BOOL, 0)]
    graph_in += [value_info(ins[n], *elem[n]) for n in names]
    out_names = [f"beam/out_{n}" for n in ["cond", *names]]
    for value, name in zip(outputs, out_names, strict=True):
        body.nodes.append(helper.make_node("Identity", [value], [name]))
    graph_out = [value_info(out_names[0], BOOL, 0)]
    graph_out += [value_info(o, *elem[n]) for o, n in zip(out_names[1:], names, strict=True)]

    final = dict(
        zip(
            names,
            b.op(
                "Loop",
                "max_length",
                b.const(True),
                *initial,
                outputs=len(names),
                body=body.graph("beam_step", graph_in, graph_out),
            ),
            strict=True,
        )
    )

    # Items still searching after max_length steps that finished nothing: their best live beam.
    steps = b.squeeze(b.dim(final["tokens"], 1), 0)  # ()
    open_ = b.op("And", final["active"], b.op("Equal", final["n_finished"], b.const(0, np.int64)))
    live_slot, live_score = _best_live(b, final["beam_lp"], steps, alpha)
    row = b.op("Add", first_row, live_slot)
    ins_final = {key: final[key] for key in names}
    score, length, tokens, attention = _keep_best(b, open_, row, live_score, steps, ins_final)
    return tokens, length, attention, score
