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
hyperparameters), which ``serving.load`` checks.

Exporter: the TorchScript-based ``torch.onnx.export(dynamo=False)``, opset 17. The dynamo
exporter (torch 2.13's default) specialises the source length of the RNN encoder to the one seen
while tracing (an encoder exported at ``T=5`` fails at ``T=1`` and ``T=40`` in onnxruntime), and
it takes ~100x longer; the TorchScript exporter records ``aten::size`` and keeps both axes
dynamic. Every export is verified: both graphs pass ``onnx.checker`` (full check), and
onnxruntime reproduces the torch module at a batch size, source length, temperature and position
unlike the tracing ones, or the export raises.
"""

from __future__ import annotations

import copy
import io
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from skattn.attention_graph import build_attention_graph
from skattn.core.manifest import (
    ATTENTION_FILE,
    BINDING_KEY,
    DECODE_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    GRAPH_FILES,
    MANIFEST_FILE,
    QUANTIZATIONS,
    Manifest,
)
from skattn.core.text import tokenize
from skattn.decode_graph import build_decode_graph, random_sources, verify_decode_graph
from skattn.quantize import decode_ranges, quantize_model
from skattn.recurrent_graph import expand_recurrent

__all__ = ["OPSET", "export_module", "export_onnx"]

OPSET = 17
# Shapes used to trace, and the different ones used to verify (B, T, lengths).
_TRACE_LENGTHS = (7, 4, 1)
_VERIFY_LENGTHS = (11, 1, 6, 11, 3)
_VERIFY_TEMPERATURE = 0.7
_VERIFY_POSITION = 4
_TOLERANCE = 1e-4
_DEFAULT_MAX_SOURCE_LENGTH = 1024

_ONNX_ELEM_TYPES = {
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.int64: onnx.TensorProto.INT64,
    torch.bool: onnx.TensorProto.BOOL,
}


class _Encoder(nn.Module):
    """``encode`` with a flat output tuple: ``memory, keys, mask, *state``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        # torch.onnx.export traces in eval mode, then restores *this* module's mode recursively:
        # a wrapper left in the default training mode would switch ``model``'s dropout on.
        self.train(model.training)

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory, keys, mask, state = self.model.encode(src, src_lengths)
        return (memory, keys, mask, *state)


class _DecoderStep(nn.Module):
    """``step`` with flat inputs ``y_prev, *state, memory, keys, mask, temperature, position``."""

    def __init__(self, model: nn.Module, n_states: int) -> None:
        super().__init__()
        self.model = model
        self.n_states = n_states
        self.train(model.training)  # as in _Encoder

    def forward(self, y_prev: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = tuple(inputs[: self.n_states])
        memory, keys, mask, temperature, position = inputs[self.n_states :]
        log_probs, new_state, weights = self.model.step(
            y_prev, state, memory, keys, mask, temperature, position
        )
        return (log_probs, *new_state, weights)


def _example_source(lengths: tuple[int, ...], vocab_size: int, seed: int) -> tuple:
    """Random source ids ``(B, T)`` ending in EOS at each length, padded with 0, as tensors
    (:func:`skattn.decode_graph.random_sources`)."""
    src, src_lengths = random_sources(lengths, vocab_size, np.random.default_rng(seed))
    return torch.from_numpy(src), torch.from_numpy(src_lengths)


def _step_inputs(model: nn.Module, src, src_lengths, temperature: float, position: int) -> tuple:
    """Encode ``src``, take ``position`` steps, and build the flat inputs of the next one.

    The state is the one at ``position``, so a key-value cache holds ``position`` rows: the
    graphs are traced and verified at cache lengths other than the encoder's empty one.
    """
    B = src.shape[0]
    temperature_t = torch.tensor(temperature, dtype=torch.float32)  # ()
    with torch.no_grad():
        memory, keys, mask, state = model.encode(src, src_lengths)
        for i in range(position):
            y = torch.full((B,), 1 + i % 3, dtype=torch.int64)  # (B,) specials: always valid
            _, state, _ = model.step(y, state, memory, keys, mask, temperature_t, torch.tensor(i))
    y_prev = torch.full((B,), 1, dtype=torch.int64)  # (B,) BOS
    position_t = torch.tensor(position, dtype=torch.int64)  # ()
    return (y_prev, *state, memory, keys, mask, temperature_t, position_t)


#: The Transformer decoder's key-value cache, ``(B, num_layers, t, kv_dim)``: axis 2 grows.
#: Matched by suffix: an ensemble names its members' states ``m<i>_self_keys``, ...
_CACHE_STATES = ("self_keys", "self_values")


def _dynamic_axes(names: list[str], tensors: tuple) -> dict[str, dict[int, str]]:
    """Axis 0 of every tensor is ``B``; axis 1 of the ``(B, T, ...)`` ones is ``T``; axis 2 of
    a key-value cache is its length (``t`` in, ``t1 = t + 1`` out)."""
    time_axis = {"src", "memory", "keys", "mask", "weights"}
    axes = {}
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.dim() == 0:
            continue
        axes[name] = {0: "B", 1: "T"} if name in time_axis else {0: "B"}
        if name.endswith(_CACHE_STATES):
            axes[name][2] = "t1" if name.startswith("new_") else "t"
    return axes


def _value_info(name: str, tensor: torch.Tensor, axes: dict[int, str]) -> onnx.ValueInfoProto:
    shape = [axes.get(i, size) for i, size in enumerate(tensor.shape)]
    return onnx.helper.make_tensor_value_info(name, _ONNX_ELEM_TYPES[tensor.dtype], shape)


def _to_onnx(
    module: nn.Module,
    args: tuple,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> onnx.ModelProto:
    """Trace ``module`` with the TorchScript exporter; restore inputs the tracer pruned.

    ``dynamic_axes`` default: :func:`_dynamic_axes` of the step graphs' names.

    The tracer drops graph inputs that the computation does not read (``position`` under global
    attention, ``keys`` without attention); they are put back, in order, so every artifact's
    graphs have the signature documented above, whatever the model kind.
    """
    with torch.no_grad():
        outputs = module(*args)
    if dynamic_axes is None:
        dynamic_axes = _dynamic_axes(input_names + output_names, (*args, *outputs))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The legacy-exporter notice, and a GRU/LSTM batch-size caution that does not apply:
        # the initial states are computed from the inputs, and verify_graphs checks other B.
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        # Shape checks (torch.nn.RNN's own, the scorers') compare traced sizes and warn that
        # the comparison is recorded as a constant. That is harmless for a check that passed;
        # a real specialisation is caught by verify_graphs, which runs other shapes.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    model = onnx.load_from_string(buffer.getvalue())
    present = {value.name: value for value in model.graph.input}
    restored = [
        present[name] if name in present else _value_info(name, tensor, dynamic_axes.get(name, {}))
        for name, tensor in zip(input_names, args, strict=True)
    ]
    del model.graph.input[:]
    model.graph.input.extend(restored)
    onnx.checker.check_model(model, full_check=True)
    return model


def _check_close(name: str, graph: str, actual: np.ndarray, expected: torch.Tensor) -> None:
    expected = expected.numpy()
    if actual.shape != expected.shape:
        raise RuntimeError(
            f"{graph}: output {name!r} has shape {actual.shape} in onnxruntime, "
            f"{expected.shape} in torch: an axis was fixed while tracing"
        )
    if expected.dtype == np.bool_:
        mismatch = np.any(actual != expected)
    else:
        finite = np.isfinite(expected)
        mismatch = np.any(np.isfinite(actual) != finite) or not np.allclose(
            actual[finite], expected[finite], atol=_TOLERANCE, rtol=_TOLERANCE
        )
    if mismatch:
        raise RuntimeError(f"{graph}: output {name!r} differs between onnxruntime and torch")


def verify_graphs(
    model: nn.Module,
    encoder: onnx.ModelProto,
    decoder: onnx.ModelProto,
    manifest: Manifest,
) -> None:
    """Run both graphs in onnxruntime at untraced shapes and compare with the torch module.

    The random source ids stay below the manifest's source vocabulary size.

    Raises
    ------
    RuntimeError
        An output's shape or values differ (tolerance 1e-4).
    """
    vocab_size = len(manifest.source_vocabulary)
    src, src_lengths = _example_source(_VERIFY_LENGTHS, vocab_size, seed=1)
    step_args = _step_inputs(model, src, src_lengths, _VERIFY_TEMPERATURE, _VERIFY_POSITION)
    n_states = len(manifest.state_names)
    checks = [
        (ENCODER_FILE, encoder, _Encoder(model), (src, src_lengths), manifest.encoder_inputs(),
         manifest.encoder_outputs()),
        (DECODER_FILE, decoder, _DecoderStep(model, n_states), step_args,
         manifest.decoder_inputs(), manifest.decoder_outputs()),
    ]  # fmt: skip
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for graph, proto, module, args, inputs, outputs in checks:
        session = ort.InferenceSession(
            proto.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        actual = session.run(outputs, {n: a.numpy() for n, a in zip(inputs, args, strict=True)})
        with torch.no_grad():
            expected = module(*args)
        for name, got, want in zip(outputs, actual, expected, strict=True):
            _check_close(name, graph, got, want)


def _prepare_directory(path: str | os.PathLike) -> Path:
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path must be a directory, got an existing file: {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    ours = {MANIFEST_FILE, *GRAPH_FILES, DECODE_FILE, ATTENTION_FILE}
    others = sorted(p.name for p in directory.iterdir() if p.name not in ours)
    if others:
        raise ValueError(
            f"path {directory} holds files that are not part of an artifact ({others[:3]}); "
            "export into an empty or new directory"
        )
    return directory


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
    quantize : {None, "int8"}, default=None
        ``"int8"``: every graph's weight products in int8, for onnxruntime on the CPU
        (:mod:`skattn.quantize`). The graphs with their recurrent cells written as products
        are checked against torch, and ``decode.onnx`` against the NumPy search, in float32;
        then every graph's weight products are replaced alike (the int8 graphs themselves are
        not compared with anything: their answers are close to the float ones, not equal).

    Returns
    -------
    Path
        The artifact directory.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {list(QUANTIZATIONS)}, got {quantize!r}")
    directory = _prepare_directory(path)
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
        input_feeding=config.input_feeding,
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
    )
    Manifest.from_dict(manifest.to_dict(), "the manifest to export")  # bounds, before tracing

    n_states = len(manifest.state_names)
    src, src_lengths = _example_source(_TRACE_LENGTHS, len(source_vocabulary), seed=0)
    encoder = _to_onnx(
        _Encoder(model), (src, src_lengths), manifest.encoder_inputs(), manifest.encoder_outputs()
    )
    decoder = _to_onnx(
        _DecoderStep(model, n_states),
        _step_inputs(model, src, src_lengths, temperature=1.0, position=2),
        manifest.decoder_inputs(),
        manifest.decoder_outputs(),
    )
    if quantize is not None:  # the GRU / LSTM nodes as products, checked against torch below
        encoder, decoder = (expand_recurrent(graph)[0] for graph in (encoder, decoder))
    verify_graphs(model, encoder, decoder, manifest)
    decode = build_decode_graph(encoder, decoder, manifest)  # the whole search, one graph
    verify_decode_graph(decode, encoder, decoder, manifest)
    graphs = [(encoder, ENCODER_FILE), (decoder, DECODER_FILE), (decode, DECODE_FILE)]
    if config.decoder == "transformer":  # every layer's and head's maps (attention_graph.py)
        verified = _example_source(_VERIFY_LENGTHS, len(source_vocabulary), seed=1)
        attention = build_attention_graph(model, manifest, _to_onnx, (src, src_lengths), verified)
        graphs.append((attention, ATTENTION_FILE))
    if quantize is not None:
        # The verified float graphs, each product replaced alike, its input range measured
        # once on the float search. Not checked against it: int8 answers are close, not equal.
        ranges = decode_ranges(decode, manifest)
        graphs = [(quantize_model(graph, ranges, quantize), name) for graph, name in graphs]
    (directory / MANIFEST_FILE).unlink(missing_ok=True)  # no valid-looking half-written artifact
    (directory / ATTENTION_FILE).unlink(missing_ok=True)  # a previous artifact's
    for graph, name in graphs:
        onnx.helper.set_model_props(graph, {BINDING_KEY: manifest.binding})
        onnx.save_model(graph, directory / name)
    manifest = manifest.with_files(directory)
    (directory / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    return directory


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


def export_onnx(estimator, path: str | os.PathLike, quantize: str | None = None) -> Path:
    """Export a fitted ``Seq2Seq`` to an artifact directory (see the module docstring).

    Parameters
    ----------
    estimator : Seq2Seq or Seq2SeqEnsemble
        A fitted estimator (an ensemble exports its ``EnsembleModule`` as one model).
    path : path
        Directory to write (created if needed; may hold only a previous artifact).
    quantize : {None, "int8"}, default=None
        See :func:`export_module`.

    Returns
    -------
    Path
        The artifact directory, loadable with ``serving.load``.

    Notes
    -----
    The manifest's ``max_source_length`` is a guard for the server, not a model limit: sources
    longer than any seen in training translate fine, so it is
    ``max(1024, longest training source)`` tokens.
    """
    if not hasattr(estimator, "module_"):
        raise ValueError("estimator must be fitted before export_onnx")
    _check_sources_are_strings(estimator.source_vocab_.tokens, estimator.tokenizer)
    return export_module(
        estimator.module_,
        path,
        source_vocabulary=estimator.source_vocab_.to_list(),
        target_vocabulary=estimator.target_vocab_.to_list(),
        tokenizer=estimator.tokenizer,
        output_kind=estimator.output_kind_,
        beam_size=estimator.beam_size,
        length_penalty=estimator.length_penalty,
        temperature=estimator.temperature,
        max_source_length=max(_DEFAULT_MAX_SOURCE_LENGTH, estimator.max_source_length_),
        max_output_length=estimator._output_limit(),
        quantize=quantize,
    )
