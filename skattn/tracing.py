"""Tracing the ``Seq2SeqModule`` seam into ONNX graphs, and checking them against torch.

:func:`to_onnx` traces a module with the TorchScript exporter (``torch.onnx.export(dynamo=False)``,
opset 17) and keeps ``B``, ``T`` and a key-value cache's length dynamic; :class:`EncoderModule`
and :class:`StepModule` give ``encode`` and ``step`` the flat signatures of ``encoder.onnx`` and
``decoder_step.onnx`` (:mod:`skattn.export` documents them); :func:`verify_graphs` runs both
graphs in onnxruntime at shapes, a temperature and a position unlike the traced ones and
compares them with the module.

Why TorchScript: the dynamo exporter (torch 2.13's default) specialises the source length of the
RNN encoder to the one seen while tracing (an encoder exported at ``T=5`` fails at ``T=1`` and
``T=40`` in onnxruntime), and it takes ~100x longer; the TorchScript exporter records
``aten::size`` and keeps both axes dynamic.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from skattn.core.manifest import DECODER_FILE, ENCODER_FILE, Manifest
from skattn.decode_graph import random_sources

__all__ = [
    "OPSET",
    "TRACE_LENGTHS",
    "VERIFY_LENGTHS",
    "EncoderModule",
    "StepModule",
    "example_source",
    "step_inputs",
    "to_onnx",
    "verify_graphs",
]

OPSET = 17
#: Source lengths (so ``B`` and ``T``) used to trace, and the different ones used to verify.
TRACE_LENGTHS = (7, 4, 1)
VERIFY_LENGTHS = (11, 1, 6, 11, 3)
_VERIFY_TEMPERATURE = 0.7
_VERIFY_POSITION = 4
_TOLERANCE = 1e-4

_ONNX_ELEM_TYPES = {
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.int64: onnx.TensorProto.INT64,
    torch.bool: onnx.TensorProto.BOOL,
}


class EncoderModule(nn.Module):
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


class StepModule(nn.Module):
    """``step`` with flat inputs ``y_prev, *state, memory, keys, mask, temperature, position``."""

    def __init__(self, model: nn.Module, n_states: int) -> None:
        super().__init__()
        self.model = model
        self.n_states = n_states
        self.train(model.training)  # as in EncoderModule

    def forward(self, y_prev: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = tuple(inputs[: self.n_states])
        memory, keys, mask, temperature, position = inputs[self.n_states :]
        log_probs, new_state, weights = self.model.step(
            y_prev, state, memory, keys, mask, temperature, position
        )
        return (log_probs, *new_state, weights)


def example_source(lengths: tuple[int, ...], vocab_size: int, seed: int) -> tuple:
    """Random source ids ``(B, T)`` ending in EOS at each length, padded with 0, as tensors
    (:func:`skattn.decode_graph.random_sources`)."""
    src, src_lengths = random_sources(lengths, vocab_size, np.random.default_rng(seed))
    return torch.from_numpy(src), torch.from_numpy(src_lengths)


def step_inputs(model: nn.Module, src, src_lengths, temperature: float, position: int) -> tuple:
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
    a key-value cache is its length (``t`` in, ``t1 = t + 1`` out). A step's ``memory``,
    ``keys`` and ``mask`` count items (``I``), not rows: ``B`` is ``R >= 1`` rows per item under
    every decoder's step (``ITEM_MEMORY_KEY``), and a shared name would let onnxruntime take
    the two for equal and fold the query's grouping away."""
    time_axis = {"src", "memory", "keys", "mask", "weights"}
    item_axis = {"memory", "keys", "mask"} if "y_prev" in names else set()
    axes = {}
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.dim() == 0:
            continue
        axes[name] = {0: "B", 1: "T"} if name in time_axis else {0: "B"}
        if name in item_axis:
            axes[name][0] = "I"
        if name.endswith(_CACHE_STATES):
            axes[name][2] = "t1" if name.startswith("new_") else "t"
    return axes


def _value_info(name: str, tensor: torch.Tensor, axes: dict[int, str]) -> onnx.ValueInfoProto:
    shape = [axes.get(i, size) for i, size in enumerate(tensor.shape)]
    return onnx.helper.make_tensor_value_info(name, _ONNX_ELEM_TYPES[tensor.dtype], shape)


def to_onnx(
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
    graphs have the signature :mod:`skattn.export` documents, whatever the model kind.
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
    src, src_lengths = example_source(VERIFY_LENGTHS, vocab_size, seed=1)
    step_args = step_inputs(model, src, src_lengths, _VERIFY_TEMPERATURE, _VERIFY_POSITION)
    n_states = len(manifest.state_names)
    checks = [
        (ENCODER_FILE, encoder, EncoderModule(model), (src, src_lengths), manifest.encoder_inputs(),
         manifest.encoder_outputs()),
        (DECODER_FILE, decoder, StepModule(model, n_states), step_args,
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
