"""Export a fitted model to the artifact directory that :mod:`serving` loads.

The ``Seq2SeqModule`` seam becomes two ONNX graphs (row-vector math, batch-first, ``B`` and ``T``
dynamic; ``S`` = ``len(state_names)`` state tensors, each ``(B, ...)``)::

    encoder.onnx       = Seq2SeqModule.encode
        inputs   src          (B, T) int64   padded source ids, each item ending with EOS
                 src_lengths  (B,)   int64   real lengths (>= 1)
        outputs  memory       (B, T, d)      projected annotations, zero at padding
                 keys         (B, T, k)      the scorer's query-independent part
                 mask         (B, T) bool    True at real positions
                 <state>      (B, ...)       the initial decoder state, one per state name

    decoder_step.onnx  = Seq2SeqModule.step
        inputs   y_prev       (B,) int64     previous target token (BOS first)
                 <state>      (B, ...)       the decoder state
                 memory, keys, mask          as the encoder returned them
                 temperature  () float32     attention softmax temperature
                 position     () int64       target position i (0 first; centres local-m)
        outputs  log_probs    (B, V) float32 log p(y_i | y_<i, x)
                 new_<state>  (B, ...)       the next state, one per state name
                 weights      (B, T) float32 attention weights; rows sum to 1, 0 on padding

plus ``decode.onnx``, the whole search in one graph (:mod:`skattn.decode_graph`, verified
against the NumPy search over the two graphs), for the Transformer decoder ``attention.onnx``,
every layer's and head's maps (:mod:`skattn.attention_graph`), and ``manifest.json``: a
:class:`skattn.core.manifest.Manifest`, which also names the graphs' inputs and outputs. Each
graph's metadata holds the manifest's ``binding`` digest (vocabularies, state names, model
hyperparameters, and ``export_id``, a digest of the weights), and ``decode.onnx``'s its search
(beam size, length penalty), which ``serving.load`` checks.

Tracing and checking the graphs: :mod:`skattn.tracing` (the TorchScript exporter, opset 17, ``B``
and ``T`` dynamic). Every export is verified: the graphs pass ``onnx.checker`` (full check), and
onnxruntime reproduces the torch module at a batch size, source length, temperature and position
unlike the tracing ones, or the export raises.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import onnx
import torch
from torch import nn

from skattn.artifact_writer import prepare_directory, write_artifact
from skattn.attention_graph import build_attention_graph
from skattn.core.checks import check_int
from skattn.core.manifest import (
    ATTENTION_FILE,
    BINDING_KEY,
    DECODE_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    ITEM_MEMORY_KEY,
    MAX_SOURCE_LENGTH,
    OUTPUT_ORDERS,
    QUANTIZATIONS,
    SEARCH_KEY,
    TEXT_KEY,
    Manifest,
    format_version_for,
)
from skattn.core.text import tokenize
from skattn.decode_graph import build_decode_graph, verify_decode_graph
from skattn.float16_weights import float16_weights
from skattn.quantize import decode_ranges, quantize_model
from skattn.recurrent_graph import expand_recurrent, guard_empty_inputs
from skattn.tracing import (
    OPSET,
    TRACE_LENGTHS,
    VERIFY_LENGTHS,
    EncoderModule,
    StepModule,
    example_source,
    step_inputs,
    to_onnx,
    verify_graphs,
)

__all__ = ["OPSET", "export_module", "export_onnx"]

_DEFAULT_MAX_SOURCE_LENGTH = 1024
# The width from which the decoder step's GRU / LSTM cells are written as products and gates
# (expand_recurrent), per search. onnxruntime's fused GRU kernel wins for narrow cells and single
# rows; the products win once a step has many rows. benchmarks/bench_step_cells.py (decode.onnx,
# one thread, step-expanded / fused time at 1, 16, 64, 256 sources, results/step_cells*.txt):
# beam 5 0.97-1.02, 0.93-0.95, 0.91-0.94, 0.91-0.97x over hidden 64-256; greedy at 128-256
# units 1.02-1.04, 0.99-1.02, 0.96-0.98, 0.93-0.98x, at 64 units 1.05-1.06, 1.03-1.04,
# 0.99-1.01, 0.96-0.97x. The encoder's cells stay fused: expanded as well, they gain 3-8 % more
# at 64-256 sources but cost up to 1.26x for one. Measured on the CPU only (no GPU was lent).
STEP_CELLS_EXPANDED_FROM = {"greedy": 128, "beam": 0}


def export_module(
    module: nn.Module,
    path: str | os.PathLike,
    *,
    source_vocabulary: list[str],
    target_vocabulary: list[str],
    tokenizer: str,
    output_kind: str = "str",
    beam_size: int = 1,
    length_penalty: float = 1.0,
    temperature: float = 1.0,
    max_source_length: int = _DEFAULT_MAX_SOURCE_LENGTH,
    max_output_length: int = 100,
    quantize: str | None = None,
    output_order: str = "left_to_right",
) -> Path:
    """Export a ``Seq2SeqModule`` and what decoding needs around it to ``path``.

    Parameters
    ----------
    module : Seq2SeqModule
        Copied to the CPU in eval mode before tracing; the original is left as it was.
    path : path
        Directory to write (created if needed; may hold only a previous artifact).
    source_vocabulary, target_vocabulary : list of str
        ``Vocabulary.to_list()`` of each side (specials first).
    tokenizer : {"char", "space"}
    output_kind : {"str", "tokens"}, default="str"
        What ``predict`` returns: strings, or token lists.
    beam_size : int, default=1
        1 decodes greedily.
    length_penalty : float, default=1.0
        Beam search's length-normalisation exponent.
    temperature : float, default=1.0
        The default attention temperature (a call may pass another).
    max_source_length, max_output_length : int
        Limits in tokens (EOS not counted).
    quantize : {None, "int8", "float16"}, default=None
        ``"int8"``: every graph's weight products in int8, for onnxruntime on the CPU
        (:mod:`skattn.quantize`). The graphs with their recurrent cells written as products
        are checked against torch, and ``decode.onnx`` against the NumPy search, in float32;
        then every graph's weight products are replaced alike (the int8 graphs themselves are
        not compared with anything: their answers are close to the float ones, not equal).
        ``"float16"``: the float32 graphs, checked as without ``quantize``, then each weight
        stored in float16 and cast back as the graph opens (:mod:`skattn.float16_weights`):
        half the bytes, float32 arithmetic on any device, answers close to float32's.
    output_order : {"left_to_right", "right_to_left"}, default="left_to_right"
        ``"right_to_left"`` for a model trained on reversed outputs: the manifest says so, and
        the runtime reverses what the graphs write (``RightToLeft.export_onnx``).

    Returns
    -------
    Path
        The artifact directory.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {list(QUANTIZATIONS)}, got {quantize!r}")
    if output_order not in OUTPUT_ORDERS:
        raise ValueError(f"output_order must be one of {list(OUTPUT_ORDERS)}, got {output_order!r}")
    directory = prepare_directory(path)
    model = copy.deepcopy(module).cpu().float().eval()
    config = model.config
    manifest = Manifest(
        tokenizer=tokenizer,
        source_vocabulary=tuple(source_vocabulary),
        target_vocabulary=tuple(target_vocabulary),
        decoder=config.decoder,
        attention=config.attention,
        scorer=config.scorer,
        cell=config.cell,
        input_feeding=config.feeds_input,  # what the model does (Bahdanau's: never)
        state_names=tuple(model.state_names),
        max_source_length=int(max_source_length),
        max_output_length=int(max_output_length),
        beam_size=int(beam_size),
        length_penalty=float(length_penalty),
        temperature=float(temperature),
        output_kind=output_kind,
        model=config.to_dict(),
        writer={"opset": OPSET, "torch_version": torch.__version__.split("+")[0]},
        quantization=quantize or "none",
        export_id=weights_digest(model),
        output_order=output_order,
        format_version=format_version_for(output_order),
    )
    Manifest.from_dict(manifest.to_dict(), "the manifest to export")  # bounds, before tracing

    n_states = len(manifest.state_names)
    src, src_lengths = example_source(TRACE_LENGTHS, len(source_vocabulary), seed=0)
    encoder = to_onnx(
        EncoderModule(model),
        (src, src_lengths),
        manifest.encoder_inputs(),
        manifest.encoder_outputs(),
    )
    decoder = to_onnx(
        StepModule(model, n_states),
        step_inputs(model, src, src_lengths, temperature=1.0, position=2),
        manifest.decoder_inputs(),
        manifest.decoder_outputs(),
    )
    if model.item_memory:  # beam search carries one memory row per item (decode_graph_beam)
        onnx.helper.set_model_props(decoder, {ITEM_MEMORY_KEY: "1"})
    # The GRU / LSTM nodes as products (all of them for int8), checked against torch below.
    if quantize == "int8":
        encoder, decoder = (expand_recurrent(graph)[0] for graph in (encoder, decoder))
    else:
        search = "greedy" if manifest.beam_size == 1 else "beam"
        decoder = expand_recurrent(decoder, STEP_CELLS_EXPANDED_FROM[search])[0]
    verify_graphs(model, encoder, decoder, manifest)
    decode = build_decode_graph(encoder, decoder, manifest)  # the whole search, one graph
    verify_decode_graph(decode, encoder, decoder, manifest)
    graphs = [(encoder, ENCODER_FILE), (decoder, DECODER_FILE), (decode, DECODE_FILE)]
    if config.decoder == "transformer":  # every layer's and head's maps (attention_graph.py)
        verified = example_source(VERIFY_LENGTHS, len(source_vocabulary), seed=1)
        attention = build_attention_graph(model, manifest, to_onnx, (src, src_lengths), verified)
        graphs.append((attention, ATTENTION_FILE))
    if quantize == "int8":
        # The verified float graphs, each product replaced alike, its input range measured
        # once on the float search. Not checked against it: int8 answers are close, not equal.
        ranges = decode_ranges(decode, manifest)
        graphs = [(quantize_model(graph, ranges, quantize), name) for graph, name in graphs]
    finished = []
    for graph, name in graphs:
        graph, _ = guard_empty_inputs(graph)  # fused cells must not see an empty batch
        if quantize == "float16":  # the verified graphs' weights, where they finally lie
            graph = float16_weights(graph)
        props = {p.key: p.value for p in graph.metadata_props}  # the step's ITEM_MEMORY_KEY
        props |= {BINDING_KEY: manifest.binding, TEXT_KEY: json.dumps(manifest.text_form())}
        if name == DECODE_FILE:  # its search is built in
            props[SEARCH_KEY] = json.dumps(manifest.search())
        onnx.helper.set_model_props(graph, props)
        finished.append((graph, name))
    write_artifact(directory, finished, manifest)
    return directory


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, shapes, types and bytes): the
    manifest's ``export_id``, so that the graphs of two models that differ only in their
    weights cannot be mixed in one artifact."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _check_sources_are_strings(tokens: list[str], tokenizer: str) -> None:
    """Raise ``ValueError`` if a source token cannot come out of ``tokenize(text, tokenizer)``.

    The runtime and the server read sources as strings and split them with the tokenizer, so
    a model fitted on token lists (``X = [["one", "two"], ...]``) serves only if splitting the
    joined tokens gives them back: one character each for ``"char"``, no whitespace for
    ``"space"``.
    """
    for token in tokens:
        if tokenize(token, tokenizer) != [token]:
            hint = ""
            if tokenizer == "char" and tokenize(token, "space") == [token]:
                hint = '; fit with tokenizer="space" and serve the tokens joined by spaces'
            raise ValueError(
                f"cannot export: the source token {token!r} cannot come out of "
                f"tokenizer={tokenizer!r}, and the runtime and the server read sources as "
                f"strings{hint}"
            )


def export_onnx(
    estimator,
    path: str | os.PathLike,
    quantize: str | None = None,
    max_source_length: int | None = None,
    output_order: str = "left_to_right",
) -> Path:
    """Export a fitted ``Seq2Seq`` to an artifact directory (see the module docstring).

    Parameters
    ----------
    estimator : Seq2Seq or Seq2SeqEnsemble
        A fitted estimator (an ensemble exports its ``EnsembleModule`` as one model).
    path : path
        Directory to write (created if needed; may hold only a previous artifact).
    quantize : {None, "int8", "float16"}, default=None
        See :func:`export_module`.
    max_source_length : int, optional
        The longest source, in tokens, that the runtime and the server accept (at most
        65,536). Default: ``max(1024, longest training source)``.
    output_order : {"left_to_right", "right_to_left"}, default="left_to_right"
        See :func:`export_module`.

    Returns
    -------
    Path
        The artifact directory, loadable with ``serving.load``.

    Notes
    -----
    The manifest's ``max_source_length`` is a guard for the server, not a model limit: sources
    longer than any seen in training translate fine, so it defaults to
    ``max(1024, longest training source)`` tokens. The runtime refuses longer sources with a
    ValueError (the server with 400) where the estimator translates them: raise it here for
    longer inputs; each item costs memory and time in proportion to its length.
    """
    if not hasattr(estimator, "module_"):
        raise ValueError("estimator must be fitted before export_onnx")
    module = estimator.module_  # first: an ensemble checks its members' vocabularies again
    _check_sources_are_strings(estimator.source_vocab_.tokens, estimator.tokenizer)
    return export_module(
        module,
        path,
        source_vocabulary=estimator.source_vocab_.to_list(),
        target_vocabulary=estimator.target_vocab_.to_list(),
        tokenizer=estimator.tokenizer,
        output_kind=estimator.output_kind_,
        beam_size=estimator.beam_size,
        length_penalty=estimator.length_penalty,
        temperature=estimator.temperature,
        max_source_length=(
            # the longest training source, at least 1,024, at most what an artifact may carry
            min(max(_DEFAULT_MAX_SOURCE_LENGTH, estimator.max_source_length_), MAX_SOURCE_LENGTH)
            if max_source_length is None
            else check_int(max_source_length, "max_source_length", 1, MAX_SOURCE_LENGTH)
        ),
        max_output_length=estimator._output_limit(),
        quantize=quantize,
        output_order=output_order,
    )
