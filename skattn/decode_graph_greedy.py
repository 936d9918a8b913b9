"""Greedy search as an ONNX ``Loop`` around the inlined decoder step (part of ``decode.onnx``).

The same decisions as :func:`skattn.core.search.greedy_decode`: ``y_i = argmax_y log p(y | ...)``
with PAD, BOS and UNK ruled out and ties to the lowest id, until EOS or ``max_length`` tokens.
The graph keeps every row in the batch (a finished row's step is computed and ignored) and
stops when no row is alive; a row's result reads only its own values, as in the NumPy search.
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


def greedy_search(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict[str, str]
) -> tuple[str, str, str, str]:
    """Add the greedy ``Loop``; returns ``tokens (B, L), lengths (B,), attention (B, L, T),
    scores (B,)`` (the summed log-probabilities, EOS included, float64)."""
    states = list(manifest.state_names)
    B = b.dim("src", 0)  # (1,)
    initial = [
        fill(b, B, BOS, np.int64),  # y_prev (B,)
        *(carry[name] for name in states),
        fill(b, B, True, np.bool_),  # alive (B,)
        fill(b, B, 0.0, np.float64),  # score (B,)
        fill(b, B, 0, np.int64),  # length (B,): tokens emitted, EOS not counted
    ]

    body = GraphBuilder("greedy/")
    types = state_types(decoder)
    names = ["y_prev", *states, "alive", "score", "length"]
    ins = {name: f"greedy/in_{name}" for name in names}
    log_probs, new_states, weights = decoder_step(
        body, decoder, manifest, ins["y_prev"], {s: ins[s] for s in states}, carry, "greedy/i"
    )
    best = body.op("ArgMax", log_probs, axis=1, keepdims=1)  # (B, 1), first of equal maxima
    best_lp = body.squeeze(body.op("GatherElements", log_probs, best, axis=1), 1)  # (B,)
    best = body.squeeze(best, 1)  # (B,)
    emit = body.op("And", ins["alive"], body.op("Not", body.op("Equal", best, body.const(EOS))))
    token = body.where(emit, best, body.const(0, np.int64))  # (B,) 0 once ended
    row_weights = body.where(body.unsqueeze(emit, 1), weights, body.const(0.0, np.float32))
    score = body.op("Add", ins["score"], body.where(ins["alive"], best_lp, body.const(0.0)))
    length = body.op("Add", ins["length"], body.cast(emit, INT64))
    outputs = [body.any(emit), best, *(new_states[s] for s in states), emit, score, length]
    outputs += [token, row_weights]

    elem = {"alive": (BOOL, 1), "score": (DOUBLE, 1), "length": (INT64, 1), "y_prev": (INT64, 1)}
    elem.update({s: types[s] for s in states})
    graph_in = [value_info("greedy/i", INT64, 0), value_info("greedy/cond", BOOL, 0)]
    graph_in += [value_info(ins[n], *elem[n]) for n in names]
    out_names = [f"greedy/out_{n}" for n in ["cond", *names, "token", "weights"]]
    for source, name in zip(outputs, out_names, strict=True):
        body.nodes.append(helper.make_node("Identity", [source], [name]))
    out_types = [(BOOL, 0), *(elem[n] for n in names), (INT64, 1), (FLOAT, 2)]
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
