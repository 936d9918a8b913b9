"""Greedy search as nested ONNX ``Loop``s around the inlined decoder step (part of ``decode.onnx``).

The same decisions as :func:`skattn.core.greedy.greedy_decode`: ``y_i = argmax_y log p(y | ...)``
with PAD, BOS and UNK ruled out and ties to the lowest id, until EOS, ``max_length`` tokens or
a step where no id has a finite log-probability.
A row's result reads only its own values, as in the NumPy search.

Two loops, so that the encoder's memory and keys are copied only when rows are dropped::

    segments  Loop   carries the rows still decoding (n <= B): memory, keys, mask, states
      steps   Loop   the decoder step over those n rows, reading the segment's memory and
                     keys in place, until a step where some row emits EOS
      compact        Gather of the rows still decoding, then the next segment

A single loop that drops ended rows has to pass every carried tensor through an ``If``
(onnxruntime copies a value out of a branch, and forbids returning the outer one), so it copied
every row's memory and keys at every step, ended rows or not. Measured against it (both graphs
built from the same step graphs, one thread): the nested loops took 0.90-0.97x its time for
hidden 64 and 256 at 1-64 rows; letting ended rows run on until a quarter or half of a segment
had ended (0.95x, 1.09x, on a model whose outputs run 10-40 tokens) lost more in wasted steps
than it saved in copies (docs/results.md, Speed).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from skattn.core.manifest import Manifest
from skattn.core.search import NEVER_EMITTED
from skattn.core.text import BOS, EOS
from skattn.onnx_graph import GraphBuilder, inline

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
    dtype: int = DOUBLE,
) -> tuple[str, dict[str, str], str]:
    """Inline one decoder step into ``body``.

    Returns
    -------
    log_probs : (N, V) ``dtype``, with the never-emitted ids at -inf: float64, the NumPy
        search's copy, for sums over steps; float32 picks the same ids (the cast is exact)
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
    never = np.zeros(len(manifest.target_vocabulary), helper.tensor_dtype_to_np_dtype(dtype))
    never[list(NEVER_EMITTED)] = -np.inf
    log_probs = step["log_probs"] if dtype == FLOAT else body.cast(step["log_probs"], dtype)
    log_probs = body.op("Add", log_probs, body.const(never))
    new_states = {name: step[f"new_{name}"] for name in manifest.state_names}
    return log_probs, new_states, step["weights"]


def _steps(
    outer: GraphBuilder, decoder, manifest: Manifest, ins: dict[str, str], types: dict
) -> tuple[dict[str, str], str, str]:
    """The inner ``Loop``: decoder steps over the segment's rows until one of them ends.

    Returns the final ``y_prev``, states, ``alive (n,)`` (the rows that did not end: an input
    only so that the loop carries it out), ``score (n,)`` and ``length (n,)`` (each row's item's
    totals), and the scan outputs ``token (k, n)`` and ``weights (k, n, T)``.
    """
    states = list(manifest.state_names)
    carried = ["y_prev", *states, "alive", "score", "length"]
    body = GraphBuilder("greedy/step/")
    own = body.loop_inputs(carried)
    position = body.op("Add", ins["done"], body.iteration)  # () the step's index in the item
    log_probs, new_states, weights = decoder_step(
        body, decoder, manifest, own["y_prev"], {s: own[s] for s in states}, ins, position, FLOAT
    )  # (n, V), (n, ...), (n, T); memory, keys and mask read from the segment, not copied
    best = body.op("ArgMax", log_probs, axis=1, keepdims=1)  # (n, 1), first of equal maxima
    best_lp = body.op("GatherElements", log_probs, best, axis=1)  # (n, 1)
    best_lp = body.cast(body.squeeze(best_lp, 1), DOUBLE)  # (n,) as the NumPy search sums it
    best = body.squeeze(best, 1)  # (n,)
    # A row whose best log-probability is -inf or NaN is stuck: it ends like EOS, and this step
    # adds nothing to its score (the NumPy search's rule). (Log-probabilities are never +inf.)
    finite = body.op("Greater", best_lp, body.const(-np.inf, np.float64))  # (n,) NaN: False
    # Every row of a segment is alive at each of its steps: the segment ends with the first EOS.
    not_eos = body.op("Not", body.op("Equal", best, body.const(EOS, np.int64)))  # (n,)
    emit = body.op("And", not_eos, finite)  # (n,)
    token = body.where(emit, best, body.const(0, np.int64))  # (n,) EOS written as 0
    step_weights = body.where(body.unsqueeze(emit, 1), weights, body.const(0.0, np.float32))
    score = body.op(  # EOS counted
        "Add", own["score"], body.where(finite, best_lp, body.const(0.0, np.float64))
    )
    emitted = body.cast(emit, INT64)  # (n,) 1 or 0
    length = body.op("Add", own["length"], emitted)
    cond = body.cast(body.op("ReduceMin", emitted, keepdims=0), BOOL)  # () no row ended yet
    after = {"y_prev": best, **new_states, "alive": emit, "score": score, "length": length}
    types = {**types, "alive": (BOOL, (None,))}
    graph = body.loop_body(
        "greedy_steps",
        cond,
        {name: (after[name], types[name]) for name in carried},
        {"token": (token, (INT64, 1)), "weights": (step_weights, (FLOAT, 2))},
    )

    n = outer.dim(ins["rows"], 0)  # (1,)
    results = outer.op(
        "Loop",
        outer.op("Sub", "max_length", ins["done"]),  # steps left
        outer.const(True),
        ins["y_prev"],
        *(ins[s] for s in states),
        fill(outer, n, True, np.bool_),
        outer.gather_rows(ins["score"], ins["rows"]),  # the items' sums so far, as NumPy adds
        outer.gather_rows(ins["length"], ins["rows"]),
        outputs=len(carried) + 2,
        body=graph,
    )
    *final, token_steps, weight_steps = results
    return dict(zip(carried, final, strict=True)), token_steps, weight_steps


def greedy_search(
    b: GraphBuilder, decoder, manifest: Manifest, carry: dict[str, str]
) -> tuple[str, str, str, str]:
    """Add the greedy search; returns ``tokens (B, L), lengths (B,), attention (B, L, T),
    scores (B,)`` (the summed log-probabilities, EOS included, float64).

    The outer ``Loop`` (segments) carries the rows still decoding (``n <= B``) and ``rows``,
    their items; each segment's tokens and attention rows are scattered into ``(B, k)`` and
    ``(B, k, T)`` zeros and appended to the ones before.
    """
    states = list(manifest.state_names)
    B = b.dim("src", 0)  # (1,)
    T = b.dim("src", 1)  # (1,)
    zero = b.const([0], np.int64)
    carried = ["y_prev", *states, "memory", "keys", "mask", "rows", "done"]
    names = [*carried, "score", "length", "tokens", "attention"]
    initial = [
        fill(b, B, BOS, np.int64),  # y_prev (n,)
        *(carry[name] for name in [*states, "memory", "keys", "mask"]),
        b.arange(B),  # rows (n,): the item of each row
        b.const(0, np.int64),  # done (): steps taken
        fill(b, B, 0.0, np.float64),  # score (B,)
        fill(b, B, 0, np.int64),  # length (B,): tokens emitted, EOS not counted
        fill(b, b.op("Concat", B, zero, axis=0), 0, np.int64),  # tokens (B, 0)
        fill(b, b.op("Concat", B, zero, T, axis=0), 0.0, np.float32),  # attention (B, 0, T)
    ]

    body = GraphBuilder("greedy/")
    types = state_types(decoder)
    types.update(
        rows=(INT64, (None,)),
        done=(INT64, ()),
        score=(DOUBLE, (None,)),
        length=(INT64, (None,)),
        tokens=(INT64, (None, None)),
        attention=(FLOAT, (None, None, None)),
    )
    ins = body.loop_inputs(names)
    last, token_steps, weight_steps = _steps(body, decoder, manifest, ins, types)

    at = body.unsqueeze(ins["rows"], 1)  # (n, 1) ScatterND indices
    k = body.dim(token_steps, 0)  # (1,) steps this segment took
    tokens = body.op(  # (B, k): each row's tokens at its item
        "ScatterND",
        fill(body, body.op("Concat", B, k, axis=0), 0, np.int64),
        at,
        body.op("Transpose", token_steps, perm=[1, 0]),
    )
    weights = body.op(  # (B, k, T)
        "ScatterND",
        fill(body, body.op("Concat", B, k, T, axis=0), 0.0, np.float32),
        at,
        body.op("Transpose", weight_steps, perm=[1, 0, 2]),
    )
    totals = {key: body.op("ScatterND", ins[key], at, last[key]) for key in ("score", "length")}
    done = body.op("Add", ins["done"], body.squeeze(k, 0))
    keep = body.squeeze(body.op("NonZero", last["alive"]), 0)  # (m,) the rows still decoding
    kept = {name: body.gather_rows(last[name], keep) for name in ["y_prev", *states]}
    kept.update({name: body.gather_rows(ins[name], keep) for name in ["memory", "keys", "mask"]})
    kept["rows"] = body.gather_rows(ins["rows"], keep)
    kept.update(done=done, score=totals["score"], length=totals["length"])
    kept["tokens"] = body.op("Concat", ins["tokens"], tokens, axis=1)
    kept["attention"] = body.op("Concat", ins["attention"], weights, axis=1)
    more = body.op("Less", done, "max_length")
    graph = body.loop_body(
        "greedy_segment",
        body.op("And", body.any(last["alive"]), more),
        {name: (kept[name], types[name]) for name in names},
    )

    results = b.op(
        "Loop",
        "max_length",
        # no segment for an empty batch: onnxruntime's fused GRU step ends the process on 0 rows
        b.squeeze(b.op("Greater", B, zero), 0),
        *initial,
        outputs=len(names),
        body=graph,
    )
    *_, score, length, tokens, attention = results
    return tokens, length, attention, score
