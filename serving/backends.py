"""onnxruntime backends for :class:`skattn.core.inference.Translator`: encode, step, select.

Both run ``encoder.onnx`` and ``decoder_step.onnx`` of an artifact; they differ in where the
carry (the decoder state plus the encoder's memory, keys and mask) lives between steps:

- :class:`NumpyBackend` (CPU): a dict of NumPy arrays; ``select`` is ``np.take`` along axis 0
  for the decoder state, and the encoder's memory, keys and mask are gathered only when a step
  needs other rows of them than it holds (one row per item for a step that reads an item's
  memory once for all its beams). onnxruntime reads contiguous NumPy inputs in place.
- :class:`BoundBackend` (CUDA, or CPU on request): a dict of ``OrtValue`` on the device; every
  step runs through IO binding, so states, memory and keys never leave the device. Only
  ``log_probs`` and ``weights`` (which the search reads) are bound to host memory, and rows
  are gathered by small ONNX ``Gather`` graphs on the device (the memory's, as above, only
  when a step reads other rows of it).

:class:`GraphTranslator` needs no backend for its search: ``decode.onnx`` runs the encoder and
the whole greedy or beam search in one ``session.run`` per chunk.

Imports numpy and onnxruntime (and ``onnx``, to build the select graph, only for IO binding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from skattn.core.inference import SearchSettings, Translator
from skattn.core.manifest import ITEM_MEMORY_KEY, MEMORY_NAMES, Manifest
from skattn.core.memory_rows import line_up
from skattn.core.search import Hypothesis
from skattn.core.text import pad_batch

__all__ = [
    "BoundBackend",
    "GraphTranslator",
    "NumpyBackend",
    "gather_rows_model",
    "selector_models",
]

Carry = dict[str, Any]
#: A host carry's ``(N,)`` record of the encoder row (the item) each carry row decodes, and
#: ``(M,)`` of the encoder row each row of its memory, keys and mask holds (not graph inputs).
ORIGIN = "origin"
HELD = "held"


class NumpyBackend:
    """Encoder and decoder step on host memory; the carry is a dict of NumPy arrays.

    The carry's decoder state has one row per decoded row (an item's beams side by side); its
    memory, keys and mask hold the items :data:`HELD` names, which :meth:`step` lines up with
    the rows' items (:data:`ORIGIN`) just before it runs the graph, copying only what changed:
    one row per item where the step reads an item's memory once for all its rows
    (``ITEM_MEMORY_KEY`` in its metadata: every decoder's step) and every item has the same
    number of rows, else one row per row (:mod:`skattn.core.memory_rows`).

    Parameters
    ----------
    encoder, decoder : onnxruntime.InferenceSession
    manifest : Manifest
        Names the graphs' inputs and outputs.
    """

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, manifest: Manifest
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.state_names = list(manifest.state_names)
        self.carry_names = manifest.carry_names()
        self.encoder_outputs = manifest.encoder_outputs()
        self.decoder_outputs = manifest.decoder_outputs()
        metadata = decoder.get_modelmeta().custom_metadata_map
        #: Whether the step reads one memory row per item for ``R`` rows per item.
        self.item_memory = metadata.get(ITEM_MEMORY_KEY) == "1"
        #: Every run's options: a runtime that terminates a search sets ``terminate`` on it.
        self.run_options = ort.RunOptions()
        # A run's errors reach the caller as exceptions (the server logs them as JSON lines);
        # onnxruntime would also print them on stderr as plain text, a stopped search's too.
        self.run_options.log_severity_level = 4

    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Carry:
        """Run ``encoder.onnx``: ``src (B, T), src_lengths (B,)`` -> the initial carry: row
        ``j`` decodes the encoder's row ``j`` and the memory holds each row once."""
        feeds = {"src": src, "src_lengths": src_lengths}
        outputs = self.encoder.run(None, feeds, self.run_options)
        carry = dict(zip(self.encoder_outputs, outputs, strict=True))
        carry[ORIGIN] = carry[HELD] = np.arange(len(src))
        return carry

    def step(
        self, y_prev: np.ndarray, carry: Carry, position: int, temperature: float
    ) -> tuple[np.ndarray, Carry, np.ndarray]:
        """Run ``decoder_step.onnx`` once: ``(N, V)`` log-probs, the next carry, ``(N, T)``."""
        carry = self._lined_up(carry)
        feeds = {
            "y_prev": np.ascontiguousarray(y_prev, dtype=np.int64),  # (N,)
            **{name: carry[name] for name in self.carry_names},
            "temperature": np.asarray(temperature, dtype=np.float32),  # ()
            "position": np.asarray(position, dtype=np.int64),  # ()
        }
        log_probs, *new_states, weights = self.decoder.run(
            self.decoder_outputs, feeds, self.run_options
        )
        carry = {**carry, **dict(zip(self.state_names, new_states, strict=True))}
        return log_probs, carry, weights  # (N, V), carry, (N, T)

    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        """Keep (or repeat) ``rows`` of the decoder state (``np.take`` along axis 0); the
        memory, keys and mask stay as they are until a step reads other rows of them."""
        return {
            name: value if name in MEMORY_NAMES or name == HELD else np.take(value, rows, axis=0)
            for name, value in carry.items()
        }

    def _lined_up(self, carry: Carry) -> Carry:
        """The carry with the memory rows its step reads (:mod:`skattn.core.memory_rows`)."""
        lined = line_up(carry[ORIGIN], carry[HELD], self.item_memory)
        if lined is None:
            return carry
        wanted, selection = lined
        return {**carry, **self._memory_rows(carry, selection), HELD: wanted}

    def _memory_rows(self, carry: Carry, selection: slice | np.ndarray) -> Carry:
        """The memory, keys and mask rows ``selection``: a view of a slice, else gathered."""
        if isinstance(selection, slice):
            return {name: carry[name][selection] for name in MEMORY_NAMES}
        return {name: np.take(carry[name], selection, axis=0) for name in MEMORY_NAMES}

    def merge(self, first: Carry, second: Carry) -> Carry:
        """``first``'s rows, then ``second``'s: the source-axis arrays (``memory``, ``keys``,
        ``mask``, axis 1 ``T``) padded with zeros to the longer ``T`` (False in ``mask``: the
        step's attention gives the padding weight 0, as in any padded batch); ``second``'s
        items (:data:`ORIGIN`, :data:`HELD`) numbered after ``first``'s."""
        first, second = self._lined_up(first), self._lined_up(second)
        width = max(first["mask"].shape[1], second["mask"].shape[1])
        merged = {
            name: _stacked(value, second[name], width if name in MEMORY_NAMES else None)
            for name, value in first.items()
            if name not in (ORIGIN, HELD)
        }
        after = first[HELD].max(initial=-1) + 1
        merged[ORIGIN] = np.concatenate([first[ORIGIN], second[ORIGIN] + after])
        merged[HELD] = np.concatenate([first[HELD], second[HELD] + after])
        return merged

    def trim(self, carry: Carry, width: int) -> Carry:
        """The carry with its source axis cut to ``width`` columns (no row's source is longer)."""
        if carry["mask"].shape[1] <= width:
            return carry
        carry = self._lined_up(carry)  # no rows the search has left
        return {
            name: np.ascontiguousarray(value[:, :width]) if name in MEMORY_NAMES else value
            for name, value in carry.items()
        }


def _stacked(first: np.ndarray, second: np.ndarray, width: int | None) -> np.ndarray:
    """``first``'s rows, then ``second``'s; with ``width``, each zero-padded on axis 1 to it.

    One allocation and two copies (``np.pad`` then ``np.concatenate`` cost a copy and about
    20 us more an array, a sizeable part of a small model's continuous-batching step)."""
    if width is None or first.shape[1] == second.shape[1] == width:
        return np.concatenate([first, second])
    n = len(first)
    out = np.zeros((n + len(second), width, *first.shape[2:]), dtype=first.dtype)
    out[:n, : first.shape[1]] = first
    out[n:, : second.shape[1]] = second
    return out


def selector_models(decoder: ort.InferenceSession, manifest: Manifest) -> tuple[bytes, bytes]:
    """:class:`BoundBackend`'s two gather graphs over ``decoder_step.onnx``'s inputs: one over
    the decoder state (every ``select``), one over ``memory``, ``keys`` and ``mask`` (only when
    a step reads other rows of them)."""
    inputs = {i.name: i for i in decoder.get_inputs()}
    return tuple(
        gather_rows_model([inputs[name] for name in names])
        for names in (manifest.state_names, MEMORY_NAMES)
    )


def gather_rows_model(inputs: list[ort.NodeArg]) -> bytes:
    """An ONNX graph ``rows (M,) int64, x_i -> Gather(x_i, rows, axis=0)`` for each ``x_i``.

    Used to ``select`` carry rows on the device without copying them to the host. The ``onnx``
    package (protobuf only, no torch) is imported here, so the plain CPU path never needs it.
    """
    import onnx
    from onnx import TensorProto, helper

    onnx_types = {
        "tensor(float)": TensorProto.FLOAT,
        "tensor(float16)": TensorProto.FLOAT16,
        "tensor(double)": TensorProto.DOUBLE,
        "tensor(bool)": TensorProto.BOOL,
        "tensor(int64)": TensorProto.INT64,
        "tensor(int32)": TensorProto.INT32,
    }
    rows = helper.make_tensor_value_info("rows", TensorProto.INT64, ["M"])
    graph_inputs, graph_outputs, nodes = [rows], [], []
    for arg in inputs:
        elem_type = onnx_types[arg.type]
        trailing = [f"{arg.name}_{i}" for i in range(1, len(arg.shape))]
        graph_inputs.append(helper.make_tensor_value_info(arg.name, elem_type, ["N", *trailing]))
        graph_outputs.append(
            helper.make_tensor_value_info(f"{arg.name}_selected", elem_type, ["M", *trailing])
        )
        nodes.append(
            helper.make_node("Gather", [arg.name, "rows"], [f"{arg.name}_selected"], axis=0)
        )
    graph = helper.make_graph(nodes, "select_rows", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


class BoundBackend(NumpyBackend):
    """Encoder and decoder step through IO binding; the carry stays on the device.

    The carry is a dict of ``OrtValue`` on ``device_type`` (with :data:`ORIGIN` and
    :data:`HELD` on the host). Each step binds the carry as inputs, binds the new states to the
    device and ``log_probs``/``weights`` to host memory (the search reads them), so only
    ``(N, V) + (N, T)`` floats cross to the host per step. ``select`` gathers the state's rows
    on the device; the memory, keys and mask are gathered only when a step reads other rows of
    them than it holds (one row per item where the step allows it, as :class:`NumpyBackend`).

    Parameters
    ----------
    encoder, decoder : onnxruntime.InferenceSession
    selectors : tuple of onnxruntime.InferenceSession
        Sessions of :func:`selector_models`: the gather over the decoder's state inputs, then
        over its ``memory``, ``keys`` and ``mask``.
    manifest : Manifest
    device_type : {"cuda", "cpu"}
    device_id : int
    """

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        selectors: tuple[ort.InferenceSession, ort.InferenceSession],
        manifest: Manifest,
        device_type: str,
        device_id: int,
    ) -> None:
        super().__init__(encoder, decoder, manifest)
        self.state_selector, self.memory_selector = selectors
        self.device_type = device_type
        self.device_id = device_id

    def _bind_outputs(self, binding: ort.IOBinding, names: list, on_host: set) -> None:
        for name in names:
            if name in on_host:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, self.device_type, self.device_id)

    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Carry:
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src", src)
        binding.bind_cpu_input("src_lengths", src_lengths)
        self._bind_outputs(binding, self.encoder_outputs, on_host=set())
        self.encoder.run_with_iobinding(binding, self.run_options)
        carry = dict(zip(self.encoder_outputs, binding.get_outputs(), strict=True))
        carry[ORIGIN] = carry[HELD] = np.arange(len(src))
        return carry

    def step(
        self, y_prev: np.ndarray, carry: Carry, position: int, temperature: float
    ) -> tuple[np.ndarray, Carry, np.ndarray]:
        carry = self._lined_up(carry)
        binding = self.decoder.io_binding()
        binding.bind_cpu_input("y_prev", np.ascontiguousarray(y_prev, dtype=np.int64))
        for name in self.carry_names:
            binding.bind_ortvalue_input(name, carry[name])
        binding.bind_cpu_input("temperature", np.asarray(temperature, dtype=np.float32))
        binding.bind_cpu_input("position", np.asarray(position, dtype=np.int64))
        self._bind_outputs(binding, self.decoder_outputs, on_host={"log_probs", "weights"})
        self.decoder.run_with_iobinding(binding, self.run_options)
        outputs = dict(zip(self.decoder_outputs, binding.get_outputs(), strict=True))
        new_states = {name: outputs[f"new_{name}"] for name in self.state_names}
        log_probs = outputs["log_probs"].numpy()  # (N, V)
        weights = outputs["weights"].numpy()  # (N, T)
        return log_probs, {**carry, **new_states}, weights

    def merge(self, first: Carry, second: Carry) -> Carry:
        raise NotImplementedError("continuous batching runs on host memory, not IO binding")

    def trim(self, carry: Carry, width: int) -> Carry:
        raise NotImplementedError("continuous batching runs on host memory, not IO binding")

    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        states = self._gather(self.state_selector, carry, self.state_names, rows)
        return {**carry, **states, ORIGIN: np.take(carry[ORIGIN], rows)}

    def _memory_rows(self, carry: Carry, selection: slice | np.ndarray) -> Carry:
        if isinstance(selection, slice):  # an OrtValue has no views: gathered all the same
            selection = np.arange(selection.start, selection.stop)
        return self._gather(self.memory_selector, carry, MEMORY_NAMES, selection)

    def _gather(
        self, selector: ort.InferenceSession, carry: Carry, names: Sequence[str], rows: np.ndarray
    ) -> Carry:
        """``rows`` of the carry's arrays ``names``, gathered on the device."""
        binding = selector.io_binding()
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        for name in names:
            binding.bind_ortvalue_input(name, carry[name])
        self._bind_outputs(binding, [f"{name}_selected" for name in names], on_host=set())
        selector.run_with_iobinding(binding, self.run_options)
        return dict(zip(names, binding.get_outputs(), strict=True))


class GraphTranslator(Translator):
    """A :class:`Translator` whose search is ``decode.onnx``: one ``session.run`` per chunk.

    The graph runs the encoder and the whole search (the manifest's ``beam_size``) inside
    onnxruntime, which releases the GIL for the whole decode; everything around the search
    (ids, length-sorted chunks, outputs, attention rows) is the Translator's own. The graph's
    outputs become the same :class:`~skattn.core.search.Hypothesis` the NumPy search returns
    (``weights`` holds one row per output token, which is all the Translator reads).

    Every chunk runs on the graph, greedy or beam: it measured faster than the step graphs
    driven from Python at every size (``benchmarks/bench_decode_graph.py``, 1 thread, graph /
    steps at 1-256 items, ``decode_graph_stepcells.txt``: greedy 0.68-0.87x for hidden 64,
    0.72-0.94x for hidden-256 Luong; beam 5 0.60-0.88x and 0.62-0.96x; the bi-GRU 256 G2P member
    in int8 0.79-0.91x at 1-64).

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        ``decode.onnx``.
    manifest : Manifest
        The search the graph runs (``beam_size``, ``length_penalty``).
    *args
        :class:`Translator`'s, after its backend (the step graphs).
    """

    def __init__(self, session: ort.InferenceSession, manifest: Manifest, *args) -> None:
        super().__init__(*args)
        self.session = session
        self.search = (manifest.beam_size, manifest.length_penalty)
        self.outputs = manifest.decode_outputs()

    def _decode_chunk(
        self, id_lists: Sequence[Sequence[int]], settings: SearchSettings
    ) -> list[Hypothesis]:
        if (settings.beam_size, settings.length_penalty) != self.search:
            raise ValueError(
                f"decode.onnx searches with (beam_size, length_penalty)={self.search}, "
                f"not {(settings.beam_size, settings.length_penalty)}"
            )
        src, src_lengths = pad_batch(id_lists)  # (B, T), (B,)
        feeds = {
            "src": src,
            "src_lengths": src_lengths,
            "max_length": np.asarray(settings.max_length, dtype=np.int64),  # ()
            "temperature": np.asarray(settings.temperature, dtype=np.float32),  # ()
        }
        # the step graphs' backend holds the runtime's run options
        run_options = self.backend.run_options
        tokens, lengths, attention, scores = self.session.run(self.outputs, feeds, run_options)
        # tokens (B, L), lengths (B,), attention (B, L, T), scores (B,)
        return [
            Hypothesis(tokens[row, :n].tolist(), attention[row, :n], float(scores[row]))
            for row, n in enumerate(lengths.tolist())
        ]
