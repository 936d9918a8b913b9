"""Greedy search as an ONNX ``Loop`` around the inlined decoder step (part of ``decode.onnx``).

The same decisions as :func:`skattn.core.greedy.greedy_decode`: ``y_i = argmax_y log p(y | ...)``
with PAD, BOS and UNK ruled out and ties to the lowest id, until EOS or ``max_length`` tokens.
The loop carries only the rows still decoding: a row that emits EOS is dropped (``Gather``)
before the next step, and the loop stops when no row is left; a row's result reads only its
own values, as in the NumPy search.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from skattn.core.manifest import Manifest
from skattn.core.search import NEVER_EMITTED
from skattn.core.text import BOS, EOS
from skattn.onnx_graph import GraphBuilder, inline, value_info

__all__ = ["decoder_step", "fill", "greedy_search", "state_types"]

FLOAT, DOUBLE, INT64, BOOL = (
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.INT64,
    TensorProto.BOOL,
)


def fill(b: GraphBuilder, shape: str, value, dtype) -> str:
    """A tensor of ``shape`` (an int64 shape tensor) filled with ``value``."""
    scalar = numpy_helper.from_array(np.array([value], dtype=dtype))
    return b.op("ConstantOfShape", shape, value=scalar)


def state_types(decoder) -> dict[str, tuple[int, tuple]]:
    """Decoder input name -> (ONNX element type, dims), read from ``decoder_step.onnx``: static
    dims kept, symbolic ones (``B``, a cache length) unknown, since they change in a loop."""
    types = {}
    for value in decoder.graph.input:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        types[value.name] = (tensor.elem_type, dims)
    return types


def decoder_step(
    body: GraphBuilder,
    decoder,
    manifest: Manifest,
    y_prev: str,
    states: dict[str, str],
    carry: dict[str, str],
    position: str,
) -> tuple[str, dict[str, str], str]:
    """Inline one decoder step into ``body``.

    Returns
    -------
    log_probs : (N, V) float64, with the never-emitted ids at -inf (the NumPy search's copy)
    new_states : state name -> (N, ...) value
    weights : (N, T) float32
    """
    step = inline(
        body,
        decoder,
        "step/",
        {
            "y_prev": y_prev,
            **states,
            "memory": carry["memory"],
            "keys": carry["keys"],
            "mask": carry["mask"],
            "temperature": "temperature",
            "position": position,
        },
    )
    never = np.zeros(len(manifest.target_vocabulary))
    never[list(NEVER_EMITTED)] = -np.inf
    log_probs = body.op("Add", body.cast(step["log_probs"], DOUBLE), body.const(never))
    new_states = {name: step[f"new_{name}"] for name in manifest.state_names}
    return log_probs, new_states, step["weights"]


def _drop_finished(body: GraphBuilder, emit: str, carried: dict[str, str], types: dict) -> list:
    """The carried rows that ``emit``: all of them as they are (an ``If`` that copies nothing)
    while no row ended, else ``Gather`` of the rows kept, as the NumPy search's ``select``."""
    n_emit = body.op("ReduceSum", body.cast(emit, INT64), keepdims=0)
    everyone = body.op("Equal", n_emit, body.squeeze(body.dim(emit, 0), 0))
    keep = body.squeeze(body.op("NonZero", emit), 0)  # (k,)
    branches = {}
    for branch in ("all", "some"):
        sub = GraphBuilder(f"greedy/{branch}/")
        outs = []
        for name, value in carried.items():
            kept = sub.op("Identity", value) if branch == "all" else sub.gather_rows(value, keep)
            outs.append(value_info(kept, *types[name]))
        branches[branch] = sub.graph(f"greedy_keep_{branch}", [], outs)
    return body.op(
        "If",
        everyone,
        outputs=len(carried),
        then_branch=branches["all"],
        else_branch=branches["some"],
    )


def greedy_search(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict[str, str]
) -> tuple[str, str, str, str]:
    """Add the greedy ``Loop``; returns ``tokens (B, L), lengths (B,), attention (B, L, T),
    scores (B,)`` (the summed log-probabilities, EOS included, float64).

    The loop carries only the rows still decoding (``n <= B``) and ``rows``, their items; a
    step's token and attention rows are scattered into ``(B,)`` and ``(B, T)`` zeros.
    """
    states = list(manifest.state_names)
    B = b.dim("src", 0)  # (1,)
    items = b.op("Range", b.const(0, np.int64), b.squeeze(B, 0), b.const(1, np.int64))  # (B,)
    no_tokens = fill(b, B, 0, np.int64)  # (B,)
    no_weights = fill(b, b.op("Concat", B, b.dim("src", 1), axis=0), 0.0, np.float32)  # (B, T)
    carried_names = ["y_prev", *states, "memory", "keys", "mask", "rows"]
    names = [*carried_names, "score", "length"]
    initial = [
        fill(b, B, BOS, np.int64),  # y_prev (n,)
        *(carry[name] for name in [*states, "memory", "keys", "mask"]),
        items,  # rows (n,): the item of each carried row
        fill(b, B, 0.0, np.float64),  # score (B,)
        fill(b, B, 0, np.int64),  # length (B,): tokens emitted, EOS not counted
    ]

    body = GraphBuilder("greedy/")
    types = state_types(decoder)
    types.update(rows=(INT64, (None,)), score=(DOUBLE, (None,)), length=(INT64, (None,)))
    ins = {name: f"greedy/in_{name}" for name in names}
    log_probs, new_states, weights = decoder_step(
        body, decoder, manifest, ins["y_prev"], {s: ins[s] for s in states}, ins, "greedy/i"
    )  # (n, V), (n, ...), (n, T)
    best = body.op("ArgMax", log_probs, axis=1, keepdims=1)  # (n, 1), first of equal maxima
    best_lp = body.squeeze(body.op("GatherElements", log_probs, best, axis=1), 1)  # (n,)
    best = body.squeeze(best, 1)  # (n,)
    emit = body.op("Not", body.op("Equal", best, body.const(EOS, np.int64)))  # (n,)
    at = body.unsqueeze(ins["rows"], 1)  # (n, 1) ScatterND indices
    token = body.op("ScatterND", no_tokens, at, body.where(emit, best, body.const(0, np.int64)))
    step_weights = body.where(body.unsqueeze(emit, 1), weights, body.const(0.0, np.float32))
    row_weights = body.op("ScatterND", no_weights, at, step_weights)  # (B, T)
    totals = {}
    for key, value in (("score", best_lp), ("length", body.cast(emit, INT64))):
        total = body.op("Add", body.gather_rows(ins[key], ins["rows"]), value)  # (n,)
        totals[key] = body.op("ScatterND", ins[key], at, total)  # (B,)
    score, length = totals["score"], totals["length"]
    after = {"y_prev": best, **new_states}
    carried = {name: after.get(name, ins[name]) for name in carried_names}
    outputs = [body.any(emit), *_drop_finished(body, emit, carried, types), score, length]
    outputs += [token, row_weights]

    graph_in = [value_info("greedy/i", INT64, 0), value_info("greedy/cond", BOOL, 0)]
    graph_in += [value_info(ins[n], *types[n]) for n in names]
    out_names = [f"greedy/out_{n}" for n in ["cond", *names, "token", "weights"]]
    for source, name in zip(outputs, out_names, strict=True):
        body.nodes.append(helper.make_node("Identity", [source], [name]))
    out_types = [(BOOL, 0), *(types[n] for n in names), (INT64, 1), (FLOAT, 2)]
    graph_out = [value_info(n, *t) for n, t in zip(out_names, out_types, strict=True)]

    results = b.op(
        "Loop",
        "max_length",
        b.const(True),
        *initial,
        outputs=len(names) + 2,
        body=body.graph("greedy_step", graph_in, graph_out),
    )
    *_, score, length, token_steps, weight_steps = results  # (L, B), (L, B, T)
    tokens = b.op("Transpose", token_steps, perm=[1, 0])  # (B, L)
    attention = b.op("Transpose", weight_steps, perm=[1, 0, 2])  # (B, L, T)
    return tokens, length, attention, score
