"""The beam search's history in ``decode.onnx``: each step's new rows, written once, and each
item's best hypothesis read back from them at the end (:mod:`skattn.decode_graph_beam`).

No step copies a beam's tokens or attention rows, which would cost ``output length x T`` per
row per step (the square of the output length in all). As in the NumPy search's ``_History``,
each step writes its new rows once, as the inner loop's scan outputs: ``parent (N,)``, the id of
the row each new beam extends, ``token (N,)`` and ``attention (N, T)``. A segment appends them
to the history (``hist_*``, one entry per row per step, entry 0 a root whose parent is itself),
so a row's id is ``H + s N + j``: ``H`` entries before its segment, step ``s`` of the segment,
row ``j``. An item keeps its best hypothesis as an id and a length, and the search ends with
one walk from every item's id back to the root. Each segment's append copies the history
once: after the first step of a batch of two or more, and at each step where some item stops.
"""

from __future__ import annotations

import numpy as np

from skattn.decode_graph_greedy import FLOAT, INT64, fill
from skattn.onnx_graph import GraphBuilder

__all__ = ["HISTORY_TYPES", "append_history", "root_history", "trace_history"]

#: The history's values, carried by the segments' ``Loop``: name -> (ONNX type, rank).
HISTORY_TYPES = {
    "hist_parent": (INT64, 1),  # (H,) each entry's parent's id
    "hist_token": (INT64, 1),  # (H,) its token
    "hist_attention": (FLOAT, 2),  # (H, T) its attention row
}


def root_history(b: GraphBuilder, T: str) -> dict[str, str]:
    """The history before the first step: entry 0, the root, its own parent, with token 0 and
    a row of ``T`` (a ``(1,)`` tensor) zeros."""
    one = b.const([1], np.int64)
    return {
        "hist_parent": fill(b, one, 0, np.int64),  # (1,)
        "hist_token": fill(b, one, 0, np.int64),  # (1,)
        "hist_attention": fill(b, b.op("Concat", one, T, axis=0), 0.0, np.float32),  # (1, T)
    }


def append_history(b: GraphBuilder, history: dict, steps: dict, T: str) -> dict[str, str]:
    """The history (``hist_*`` of ``history``) with a segment's steps appended: ``parent``,
    ``token`` ``(S, N)`` and ``attention (S, N, T)`` of ``steps``, row-major, so that step
    ``s``'s row ``j`` lands at ``H + s N + j``."""
    flat = b.op("Concat", b.const([-1], np.int64), T, axis=0)  # (-1, T)
    shapes = {"parent": [-1], "token": [-1], "attention": flat}
    appended = {}
    for name, shape in shapes.items():
        key = f"hist_{name}"
        appended[key] = b.op("Concat", history[key], b.reshape(steps[name], shape), axis=0)
    return appended


def trace_history(
    b: GraphBuilder, history: dict, ids: str, lengths: str, width: str
) -> tuple[str, str]:
    """Each item's hypothesis read back from the history (``hist_*`` of ``history``):
    ``tokens (B, L)`` and ``attention (B, L, T)`` of ``lengths (B,)`` tokens ending at ``ids
    (B,)``, 0 after the end, ``L`` = ``width`` (a ``(1,)`` tensor, the steps taken).

    A ``Loop`` of ``max(L, 1)`` walks from every id to its parent (the root stays the root,
    its token 0 and its row 0): walk ``k`` reads position ``length - 1 - k`` of its item."""
    body = GraphBuilder("beam/trace/")
    own = body.loop_inputs(["at"])
    graph = body.loop_body(
        "beam_trace",
        body.const(True),
        {"at": (body.gather_rows(history["hist_parent"], own["at"]), (INT64, 1))},
        {
            "token": (body.gather_rows(history["hist_token"], own["at"]), (INT64, 1)),
            "attention": (body.gather_rows(history["hist_attention"], own["at"]), (FLOAT, 2)),
        },
    )
    walks = b.op("Max", width, b.const([1], np.int64))  # (1,)
    _, token_walk, attention_walk = b.op(
        "Loop", b.squeeze(walks, 0), b.const(True), ids, outputs=3, body=graph
    )  # (W, B), (W, B, T)
    # position p of item b is walk length_b - 1 - p, for p < length_b
    position = b.unsqueeze(b.arange(width), 0)  # (1, L)
    length = b.unsqueeze(lengths, 1)  # (B, 1)
    inside = b.op("Less", position, length)  # (B, L)
    walk = b.op(
        "Max",
        b.op("Sub", b.op("Sub", length, b.const(1, np.int64)), position),
        b.const(0, np.int64),
    )  # (B, L)
    tokens = b.op("GatherElements", b.op("Transpose", token_walk, perm=[1, 0]), walk, axis=1)
    tokens = b.where(inside, tokens, b.const(0, np.int64))
    T = b.dim(attention_walk, 2)  # (1,)
    walk3 = b.op("Expand", b.unsqueeze(walk, 2), b.op("Concat", b.op("Shape", walk), T, axis=0))
    attention = b.op(
        "GatherElements", b.op("Transpose", attention_walk, perm=[1, 0, 2]), walk3, axis=1
    )  # (B, L, T)
    attention = b.where(b.unsqueeze(inside, 2), attention, b.const(0.0, np.float32))
    return tokens, attention
