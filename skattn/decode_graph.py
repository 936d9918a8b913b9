"""``decode.onnx``: the whole search (encoder, then greedy or beam decoding) as one ONNX graph.

Built from the two exported graphs with ``onnx.helper``: ``encoder.onnx``'s nodes once, then
two nested ``Loop``s, the inner one's body ``decoder_step.onnx``'s nodes plus the search's
decisions, the outer one dropping the rows that ended between runs of the inner one
(:mod:`skattn.decode_graph_greedy`, :mod:`skattn.decode_graph_beam`), and what the step
computes from the segment's values alone moved out of the inner loop
(:func:`~skattn.loop_invariants.hoist_loop_invariants`); so one ``session.run`` decodes a batch
in any onnxruntime host (C++, C#, Java, onnxruntime-web, Triton)::

    inputs   src          (B, T) int64    ids of each source + [EOS], 0-padded
             src_lengths  (B,)   int64    real lengths, EOS counted (>= 1)
             max_length   ()     int64    most output tokens per item (>= 1)
             temperature  ()     float32  attention softmax temperature (> 0)
    outputs  tokens       (B, L) int64    output ids, EOS not included, 0 after the end
             lengths      (B,)   int64    output tokens of each item
             attention    (B, L, T) float32  row j: the attention that emitted tokens[:, j];
                                             0 after the end and at padding
             scores       (B,)   float32  greedy: sum of log p (EOS counted); beam: that sum
                                          / length ** length_penalty, the ranking score

``L`` is the number of decoder steps the batch took (at most ``max_length``). The search is the
manifest's ``beam_size`` (1: greedy) and ``length_penalty``, with the semantics of
:mod:`skattn.core.search`; :func:`verify_decode_graph` checks it against that NumPy search over
the step graphs at export.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from skattn.core.manifest import ITEM_MEMORY_KEY, Manifest
from skattn.core.search import beam_decode, greedy_decode
from skattn.core.text import EOS, SPECIAL_TOKENS
from skattn.decode_graph_beam import beam_search
from skattn.decode_graph_greedy import FLOAT, INT64, greedy_search
from skattn.loop_invariants import hoist_loop_invariants
from skattn.onnx_graph import GraphBuilder, inline

__all__ = [
    "build_decode_graph",
    "random_sources",
    "reads_item_memory",
    "reference_search",
    "verify_decode_graph",
]

OPSET = 17
# Batch shapes checked at export (different from the traced ones) and the steps they run.
_VERIFY_LENGTHS = (9, 1, 5, 9, 3, 7)
_VERIFY_MAX_LENGTH = 8
_VERIFY_TEMPERATURE = 0.8
_SCORE_TOLERANCE = 1e-5
_ATTENTION_TOLERANCE = 1e-5


def random_sources(lengths, vocabulary_size: int, rng: np.random.Generator) -> tuple:
    """``src (B, T)`` of random ids past the specials, each ending in EOS at its length (EOS
    counted) and 0-padded, and ``src_lengths (B,)``: inputs of ``encoder.onnx`` and
    ``decode.onnx``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    src = np.zeros((lengths.size, lengths.max()), dtype=np.int64)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = rng.integers(len(SPECIAL_TOKENS), vocabulary_size, length - 1)
        src[row, length - 1] = EOS
    return src, lengths


def reads_item_memory(decoder: onnx.ModelProto) -> bool:
    """Whether ``decoder_step.onnx`` reads ``memory``, ``keys`` and ``mask`` with one row per
    item for ``R`` rows per item (its ``ITEM_MEMORY_KEY`` entry: every decoder's step)."""
    return any(p.key == ITEM_MEMORY_KEY and p.value == "1" for p in decoder.metadata_props)


def build_decode_graph(
    encoder: onnx.ModelProto, decoder: onnx.ModelProto, manifest: Manifest
) -> onnx.ModelProto:
    """``decode.onnx`` for ``manifest``'s search, from its two exported graphs."""
    b = GraphBuilder("search/")
    encoded = inline(b, encoder, "encoder/", {"src": "src", "src_lengths": "src_lengths"})
    carry = {name: encoded[name] for name in manifest.carry_names()}
    if manifest.beam_size == 1:
        results = greedy_search(b, decoder, manifest, carry)
    else:  # an item's beams read one copy of its memory where the step allows
        results = beam_search(b, decoder, manifest, carry, reads_item_memory(decoder))
    tokens, lengths, attention, scores = results
    scores = b.cast(scores, FLOAT)
    for value, name in zip(
        (tokens, lengths, attention, scores), manifest.decode_outputs(), strict=True
    ):
        b.nodes.append(helper.make_node("Identity", [value], [name]))
    inputs = [
        helper.make_tensor_value_info("src", INT64, ["B", "T"]),
        helper.make_tensor_value_info("src_lengths", INT64, ["B"]),
        helper.make_tensor_value_info("max_length", INT64, []),
        helper.make_tensor_value_info("temperature", FLOAT, []),
    ]
    outputs = [
        helper.make_tensor_value_info("tokens", INT64, ["B", "L"]),
        helper.make_tensor_value_info("lengths", INT64, ["B"]),
        helper.make_tensor_value_info("attention", FLOAT, ["B", "L", "T"]),
        helper.make_tensor_value_info("scores", FLOAT, ["B"]),
    ]
    search_name = "greedy" if manifest.beam_size == 1 else f"beam{manifest.beam_size}"
    model = helper.make_model(
        b.graph(f"skattn_decode_{search_name}", inputs, outputs),
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="skattn",
    )
    model.ir_version = 8
    hoist_loop_invariants(model)  # the step's work on the segment's keys, once per segment
    onnx.checker.check_model(model, full_check=True)
    return model


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        proto.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )


def reference_search(
    encoder: ort.InferenceSession,
    decoder: ort.InferenceSession,
    manifest: Manifest,
    src: np.ndarray,
    src_lengths: np.ndarray,
    max_length: int,
    temperature: float,
) -> list:
    """The NumPy search (:mod:`skattn.core.search`) over the step graphs: a Hypothesis per item."""
    carry = dict(
        zip(
            manifest.encoder_outputs(),
            encoder.run(None, {"src": src, "src_lengths": src_lengths}),
            strict=True,
        )
    )
    states, outputs = list(manifest.state_names), manifest.decoder_outputs()

    def step(y_prev, carry, position):
        feeds = {
            "y_prev": y_prev,
            **carry,
            "temperature": np.array(temperature, np.float32),
            "position": np.array(position, np.int64),
        }
        log_probs, *new, weights = decoder.run(outputs, feeds)
        return log_probs, {**carry, **dict(zip(states, new, strict=True))}, weights

    def select(carry, rows):
        return {name: np.take(value, rows, axis=0) for name, value in carry.items()}

    n = src.shape[0]
    if manifest.beam_size == 1:
        return greedy_decode(step, select, carry, n, max_length)
    return beam_decode(
        step, select, carry, n, manifest.beam_size, max_length, manifest.length_penalty
    )


def verify_decode_graph(
    decode: onnx.ModelProto,
    encoder: onnx.ModelProto,
    decoder: onnx.ModelProto,
    manifest: Manifest,
    seed: int = 2,
) -> None:
    """Run ``decode.onnx`` and the NumPy search over the step graphs on random sources: a
    batch, and its first item alone (beam search starts one item and a batch differently).

    Raises
    ------
    RuntimeError
        A token, a length, a score (1e-5) or an attention row (1e-5) differs.
    """
    rng = np.random.default_rng(seed)
    src, lengths = random_sources(_VERIFY_LENGTHS, len(manifest.source_vocabulary), rng)
    max_length = min(_VERIFY_MAX_LENGTH, manifest.max_output_length)
    sessions = [_session(graph) for graph in (encoder, decoder, decode)]
    for batch, batch_lengths in ((src, lengths), (src[:1, : lengths[0]], lengths[:1])):
        expected = reference_search(
            *sessions[:2], manifest, batch, batch_lengths, max_length, _VERIFY_TEMPERATURE
        )
        feeds = {
            "src": batch,
            "src_lengths": batch_lengths,
            "max_length": np.array(max_length, np.int64),
            "temperature": np.array(_VERIFY_TEMPERATURE, np.float32),
        }
        problems = compare_with_search(expected, *sessions[2].run(None, feeds))
        if problems:
            raise RuntimeError(f"decode.onnx differs from the NumPy search: {problems[0]}")


def compare_with_search(hypotheses, tokens, lengths, attention, scores) -> list[str]:
    """What differs between ``decode.onnx``'s outputs and the NumPy search's hypotheses."""
    problems = []
    for row, h in enumerate(hypotheses):
        n = len(h.tokens)
        if lengths[row] != n or tokens[row, :n].tolist() != h.tokens or tokens[row, n:].any():
            problems.append(f"item {row}: tokens {tokens[row].tolist()} != {h.tokens}")
            continue
        if abs(float(scores[row]) - h.score) > _SCORE_TOLERANCE * max(1.0, abs(h.score)):
            problems.append(f"item {row}: score {scores[row]} != {h.score}")
        width = h.weights.shape[1]
        if (
            not np.allclose(attention[row, :n, :width], h.weights[:n], atol=_ATTENTION_TOLERANCE)
            or attention[row, n:].any()
        ):
            problems.append(f"item {row}: attention differs")
    return problems
