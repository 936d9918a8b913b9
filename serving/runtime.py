"""The torch-free runtime: an exported artifact run by onnxruntime, decoded by ``skattn.core``.

Data flow of one call::

    strings --skattn.core.text--> src (B, T) int64, src_lengths (B,)
      --encoder.onnx--> carry = {memory, keys, mask, <state_names...>}
      --skattn.core.search.greedy_decode / beam_decode over this module's backend-->
        Hypothesis (token ids, attention rows) --skattn.core.text--> strings

The backend is the pair of callables that ``skattn.core.search`` expects: ``step`` runs
``decoder_step.onnx`` once, ``select`` keeps (or repeats, for beams) rows of every carried tensor.
Two backends share that contract:

- :class:`NumpyBackend` (CPU): the carry is a dict of NumPy arrays, ``select`` is ``np.take``
  along axis 0. onnxruntime reads contiguous NumPy inputs in place.
- :class:`BoundBackend` (CUDA, or CPU on request): the carry is a dict of ``OrtValue`` living on
  the device; every step runs through IO binding, so states, memory and keys never leave the
  device. Only ``log_probs`` and ``weights`` (which the search reads) are bound to host memory,
  and ``select`` runs a small ONNX ``Gather`` graph on the device.

Thread settings (see :func:`session_options`) are chosen for a server whose cores are shared:
``intra_op_num_threads`` defaults to the cores this process may use; ``inter_op_num_threads=1``
with ``ORT_SEQUENTIAL`` because a decoder step is a chain of dependent small ops with nothing to
run side by side; ``session.intra_op.allow_spinning="0"`` so that idle pool threads sleep instead
of busy-waiting between steps (the search's NumPy work, the HTTP server and other workers need
those cores); graph optimisation ``ORT_ENABLE_ALL`` (constant folding, fusions, layout changes).
Small models on few, busy cores are often fastest with ``intra_op_num_threads=1`` (hidden size
128, batch 64, on a loaded 2-core machine: 0.62 s with one thread, 0.83 s with two).

This module imports numpy, onnxruntime and ``skattn.core`` (plus ``onnx``, to build the select
graph, only when IO binding is on): never torch, scikit-learn, or the training side of skattn.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from serving.artifact import (
    DECODER_FILE,
    MANIFEST_FILE,
    Artifact,
    ArtifactError,
    decoder_input_names,
    decoder_output_names,
    encoder_input_names,
    encoder_output_names,
    read_artifact,
)
from serving.interface import ModelInfo, vocabulary_id
from skattn.core.search import Hypothesis, beam_decode, greedy_decode
from skattn.core.text import EOS, Vocabulary, detokenize, pad_batch, tokenize

__all__ = ["BoundBackend", "NumpyBackend", "Runtime", "load", "session_options"]

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
DEFAULT_MAX_BATCH_SIZE = 256

Carry = dict[str, Any]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def session_options(intra_op_num_threads: int | None = None) -> ort.SessionOptions:
    """Session options used for every graph of the runtime.

    Parameters
    ----------
    intra_op_num_threads : int, optional
        Threads that split one operator's work. Default: :func:`available_cores`.

    Returns
    -------
    onnxruntime.SessionOptions
        ``inter_op_num_threads=1``, ``ORT_SEQUENTIAL``, spinning off, ``ORT_ENABLE_ALL``.
    """
    if intra_op_num_threads is None:
        intra_op_num_threads = available_cores()
    if (
        isinstance(intra_op_num_threads, bool)
        or not isinstance(intra_op_num_threads, int)
        or intra_op_num_threads < 1
    ):
        raise ValueError(f"intra_op_num_threads must be an int >= 1, got {intra_op_num_threads!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: no per-session chatter on stderr
    return options


def resolve_device(device: str) -> tuple[str, int]:
    """Map ``device`` to ``(device_type, device_id)`` for onnxruntime.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "cuda:N"}
        ``"auto"`` takes CUDA when this onnxruntime build has the CUDA provider.

    Returns
    -------
    tuple of (str, int)
        ``("cuda", N)`` or ``("cpu", 0)``.
    """
    available = ort.get_available_providers()
    if not isinstance(device, str):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device == "auto":
        return ("cuda", 0) if CUDA_PROVIDER in available else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if match is None:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if CUDA_PROVIDER not in available:
        raise ValueError(
            f"device={device!r} asks for CUDA, but this onnxruntime has no {CUDA_PROVIDER} "
            f"(available: {available}); install onnxruntime-gpu, or use device='cpu' or 'auto'"
        )
    return "cuda", int(match.group(1) or 0)


def _providers(device_type: str, device_id: int) -> list:
    if device_type == "cuda":
        return [(CUDA_PROVIDER, {"device_id": device_id}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def _open_session(
    model: str | bytes, options: ort.SessionOptions, providers: list, name: str
) -> ort.InferenceSession:
    """An ``InferenceSession``; a graph onnxruntime cannot read raises ArtifactError naming it."""
    try:
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as error:  # onnxruntime raises its own exception types (Fail, InvalidGraph...)
        raise ArtifactError(f"{name}: onnxruntime cannot load this graph ({error})") from None


def _open_graph(
    path, options: ort.SessionOptions, providers: list, inputs: list, outputs: list
) -> ort.InferenceSession:
    """Open one artifact graph and check that its inputs and outputs are the documented ones."""
    session = _open_session(str(path), options, providers, str(path))
    actual_in = [i.name for i in session.get_inputs()]
    actual_out = [o.name for o in session.get_outputs()]
    if actual_in != inputs or actual_out != outputs:
        raise ArtifactError(
            f"{path}: graph signature {actual_in} -> {actual_out} differs from the expected "
            f"{inputs} -> {outputs}"
        )
    return session


class NumpyBackend:
    """Encoder and decoder step on host memory; the carry is a dict of NumPy arrays.

    Parameters
    ----------
    encoder, decoder : onnxruntime.InferenceSession
    state_names : list of str
    """

    def __init__(
        self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, state_names: list
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.state_names = list(state_names)
        self.carry_names = [*self.state_names, "memory", "keys", "mask"]
        self.decoder_outputs = decoder_output_names(self.state_names)

    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> Carry:
        """Run ``encoder.onnx``: ``src (B, T), src_lengths (B,)`` -> the initial carry."""
        outputs = self.encoder.run(None, {"src": src, "src_lengths": src_lengths})
        names = encoder_output_names(self.state_names)
        return dict(zip(names, outputs, strict=True))

    def stepper(self, temperature: float):
        """The ``step`` callable for :mod:`skattn.core.search`, at a fixed temperature."""
        temperature_value = np.asarray(temperature, dtype=np.float32)  # ()

        def step(y_prev: np.ndarray, carry: Carry, position: int):
            feeds = {
                "y_prev": np.ascontiguousarray(y_prev, dtype=np.int64),  # (N,)
                **carry,
                "temperature": temperature_value,
                "position": np.asarray(position, dtype=np.int64),  # ()
            }
            log_probs, *new_states, weights = self.decoder.run(self.decoder_outputs, feeds)
            carry = {**carry, **dict(zip(self.state_names, new_states, strict=True))}
            return log_probs, carry, weights  # (N, V), carry, (N, T)

        return step

    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        """Keep (or repeat) ``rows`` of every carried array: ``np.take`` along axis 0."""
        return {name: np.take(value, rows, axis=0) for name, value in carry.items()}


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

    The carry is a dict of ``OrtValue`` on ``device_type``. Each step binds the carry as inputs,
    binds the new states to the device and ``log_probs``/``weights`` to host memory (the search
    reads them), so only ``(N, V) + (N, T)`` floats cross to the host per step.

    Parameters
    ----------
    encoder, decoder, selector : onnxruntime.InferenceSession
        ``selector`` is :func:`gather_rows_model` over the decoder's carry inputs.
    state_names : list of str
    device_type : {"cuda", "cpu"}
    device_id : int
    """

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        selector: ort.InferenceSession,
        state_names: list,
        device_type: str,
        device_id: int,
    ) -> None:
        super().__init__(encoder, decoder, state_names)
        self.selector = selector
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
        names = encoder_output_names(self.state_names)
        self._bind_outputs(binding, names, on_host=set())
        self.encoder.run_with_iobinding(binding)
        return dict(zip(names, binding.get_outputs(), strict=True))

    def stepper(self, temperature: float):
        temperature_value = np.asarray(temperature, dtype=np.float32)  # ()
        state_outputs = [f"new_{name}" for name in self.state_names]

        def step(y_prev: np.ndarray, carry: Carry, position: int):
            binding = self.decoder.io_binding()
            binding.bind_cpu_input("y_prev", np.ascontiguousarray(y_prev, dtype=np.int64))
            for name, value in carry.items():
                binding.bind_ortvalue_input(name, value)
            binding.bind_cpu_input("temperature", temperature_value)
            binding.bind_cpu_input("position", np.asarray(position, dtype=np.int64))
            self._bind_outputs(binding, self.decoder_outputs, on_host={"log_probs", "weights"})
            self.decoder.run_with_iobinding(binding)
            outputs = dict(zip(self.decoder_outputs, binding.get_outputs(), strict=True))
            new_states = {
                n: outputs[o] for n, o in zip(self.state_names, state_outputs, strict=True)
            }
            log_probs = outputs["log_probs"].numpy()  # (N, V)
            weights = outputs["weights"].numpy()  # (N, T)
            return log_probs, {**carry, **new_states}, weights

        return step

    def select(self, carry: Carry, rows: np.ndarray) -> Carry:
        binding = self.selector.io_binding()
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        for name in self.carry_names:
            binding.bind_ortvalue_input(name, carry[name])
        outputs = [f"{name}_selected" for name in self.carry_names]
        self._bind_outputs(binding, outputs, on_host=set())
        self.selector.run_with_iobinding(binding)
        return dict(zip(self.carry_names, binding.get_outputs(), strict=True))


class Runtime:
    """An exported skattn model, ready to translate strings; built by :func:`load`.

    Parameters
    ----------
    artifact : Artifact
        A checked artifact (:func:`serving.artifact.read_artifact`).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    intra_op_num_threads : int, optional
        Default: the cores this process may use.
    io_binding : bool, optional
        Keep the carry on the device between steps. Default: on for CUDA, off for CPU.
    max_batch_size : int, default=256
        Larger inputs are sorted by length and decoded in chunks of at most this many items
        (results do not depend on it).
    name : str, optional
        Default: the artifact directory's name.

    Attributes
    ----------
    name : str
    manifest : dict
    max_source_length : int
        Longest source, in tokens, that :meth:`check_source` admits.
    provider : str
        ``"CUDAExecutionProvider"`` or ``"CPUExecutionProvider"``: where the graphs run.
    """

    def __init__(
        self,
        artifact: Artifact,
        device: str = "auto",
        *,
        intra_op_num_threads: int | None = None,
        io_binding: bool | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        name: str | None = None,
    ) -> None:
        if (
            isinstance(max_batch_size, bool)
            or not isinstance(max_batch_size, int)
            or max_batch_size < 1
        ):
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        manifest = artifact.manifest
        self.manifest = manifest
        self.name = name if name is not None else artifact.directory.resolve().name
        self.max_source_length = int(manifest["limits"]["max_source_length"])
        self.max_output_length = int(manifest["limits"]["max_output_length"])
        self.max_batch_size = max_batch_size
        self.tokenizer = manifest["tokenizer"]
        self.source_vocabulary = Vocabulary.from_list(manifest["source_vocabulary"])
        self.target_vocabulary = Vocabulary.from_list(manifest["target_vocabulary"])
        state_names = list(manifest["state_names"])

        device_type, device_id = resolve_device(device)
        options = session_options(intra_op_num_threads)
        providers = _providers(device_type, device_id)
        encoder = _open_graph(
            artifact.encoder_path,
            options,
            providers,
            encoder_input_names(),
            encoder_output_names(state_names),
        )
        decoder = _open_graph(
            artifact.decoder_path,
            options,
            providers,
            decoder_input_names(state_names),
            decoder_output_names(state_names),
        )
        vocab_size = decoder.get_outputs()[0].shape[-1]  # log_probs (B, V): V is fixed
        if isinstance(vocab_size, int) and vocab_size != len(self.target_vocabulary):
            raise ArtifactError(
                f"{artifact.directory / MANIFEST_FILE}: 'target_vocabulary' has "
                f"{len(self.target_vocabulary)} tokens but {DECODER_FILE} scores {vocab_size}"
            )
        self.provider = decoder.get_providers()[0]
        if device_type == "cuda" and self.provider != CUDA_PROVIDER:
            if device != "auto":
                raise RuntimeError(
                    f"device={device!r}: onnxruntime could not start {CUDA_PROVIDER} "
                    f"(sessions run on {self.provider}); check the CUDA and cuDNN libraries"
                )
            logger.warning("CUDA provider failed to start; falling back to %s", self.provider)
            device_type, device_id = "cpu", 0

        self.io_binding = device_type == "cuda" if io_binding is None else bool(io_binding)
        if self.io_binding:
            carry = {*state_names, "memory", "keys", "mask"}
            selector = _open_session(
                gather_rows_model([i for i in decoder.get_inputs() if i.name in carry]),
                options,
                providers,
                "select_rows",
            )
            self.backend: NumpyBackend = BoundBackend(
                encoder, decoder, selector, state_names, device_type, device_id
            )
        else:
            self.backend = NumpyBackend(encoder, decoder, state_names)
        logger.info(
            "serving model %r on %s (device=%r requested; io_binding=%s; intra_op_num_threads=%d)",
            self.name,
            self.provider,
            device,
            self.io_binding,
            options.intra_op_num_threads,
        )

    def __repr__(self) -> str:
        return f"Runtime(name={self.name!r}, provider={self.provider!r})"

    @property
    def info(self) -> ModelInfo:
        """What clients may know about this model (see :class:`serving.interface.ModelInfo`)."""
        manifest = self.manifest
        return ModelInfo(
            name=self.name,
            provider=self.provider,
            max_source_length=self.max_source_length,
            max_output_length=self.max_output_length,
            output_kind=manifest["output_kind"],
            tokenizer=self.tokenizer,
            decoder=manifest["decoder"],
            attention=manifest["attention"],
            scorer=manifest["scorer"],
            beam_size=int(manifest["beam_size"]),
            temperature=float(manifest["temperature"]),
            vocabulary_id=vocabulary_id(
                manifest["source_vocabulary"], manifest["target_vocabulary"]
            ),
        )

    # -- input checks -----------------------------------------------------------------------

    def check_source(self, text: Any) -> None:
        """Raise ``ValueError`` when ``text`` cannot be translated (not a str, or too long).

        Parameters
        ----------
        text : object
            One source item.
        """
        if not isinstance(text, str):
            raise ValueError(f"sources must be str, got {type(text).__name__}: {text!r:.80}")
        n_tokens = len(tokenize(text, self.tokenizer))
        if n_tokens > self.max_source_length:
            raise ValueError(
                f"source has {n_tokens} tokens, more than "
                f"max_source_length={self.max_source_length}"
            )

    def _check_sources(self, sources: Any) -> list[str]:
        # Any sized collection (list, tuple, NumPy or pandas), as the estimator accepts.
        if isinstance(sources, str | bytes | dict) or not hasattr(sources, "__len__"):
            raise ValueError(f"sources must be a list of str, got {type(sources).__name__}")
        sources = list(sources)
        for text in sources:
            self.check_source(text)
        return sources

    def _check_temperature(self, temperature: float | None) -> float:
        if temperature is None:
            return float(self.manifest["temperature"])
        if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.floating):
            raise ValueError(f"temperature must be a float > 0, got {temperature!r}")
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
        return float(temperature)

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, id_lists: list[list[int]], temperature: float) -> list[Hypothesis]:
        """Encode and decode one chunk of source id lists (each ending with EOS)."""
        src, src_lengths = pad_batch(id_lists)  # (B, T), (B,)
        backend = self.backend
        carry = backend.encode(src, src_lengths)
        step = backend.stepper(temperature)
        beam_size = int(self.manifest["beam_size"])
        if beam_size == 1:
            return greedy_decode(step, backend.select, carry, len(id_lists), self.max_output_length)
        return beam_decode(
            step,
            backend.select,
            carry,
            len(id_lists),
            beam_size,
            self.max_output_length,
            length_penalty=float(self.manifest["length_penalty"]),
        )

    def _format(self, token_ids: list[int]) -> str | list[str]:
        tokens = self.target_vocabulary.decode(token_ids)
        if self.manifest["output_kind"] == "tokens":
            return tokens
        return detokenize(tokens, self.tokenizer)

    def predict_batch(
        self, sources: Sequence[str], temperature: float | None = None, with_attention: bool = False
    ) -> tuple[list, list[np.ndarray] | None]:
        """Translate a batch, optionally with the attention maps.

        Parameters
        ----------
        sources : list of str
        temperature : float, optional
            Softmax temperature of the attention; default: the manifest's.
        with_attention : bool, default=False

        Returns
        -------
        predictions : list
            One per source: a str (``output_kind="str"``) or a list of tokens (``"tokens"``).
        attentions : list of ndarray (T_y, T_x) or None
            ``T_y`` output tokens, ``T_x`` = source tokens + 1 (the end-of-source marker);
            rows sum to 1. ``None`` unless ``with_attention``.
        """
        sources = self._check_sources(sources)
        temperature = self._check_temperature(temperature)
        id_lists = [
            self.source_vocabulary.encode(tokenize(text, self.tokenizer)) + [EOS]
            for text in sources
        ]
        # Chunks of similar lengths waste less on padding; each result lands at its own index.
        order = np.argsort([len(ids) for ids in id_lists], kind="stable")
        hypotheses: list[Hypothesis | None] = [None] * len(id_lists)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            decoded = self._decode([id_lists[i] for i in chunk], temperature)
            for index, hypothesis in zip(chunk, decoded, strict=True):
                hypotheses[index] = hypothesis

        predictions = [self._format(h.tokens) for h in hypotheses]
        if not with_attention:
            return predictions, None
        attentions = []
        for ids, hypothesis in zip(id_lists, hypotheses, strict=True):
            # One row per output token (decoding never emits a special id), one column per
            # source token and the end-of-source marker.
            weights = hypothesis.weights[: len(hypothesis.tokens), : len(ids)]  # (T_y, T_x)
            attentions.append(weights.astype(np.float64))  # float64, as the estimator's
        return predictions, attentions

    def predict(self, sources: Sequence[str], temperature: float | None = None) -> list:
        """Translate ``sources``; see :meth:`predict_batch`."""
        return self.predict_batch(sources, temperature)[0]

    def predict_attention(
        self, sources: Sequence[str], temperature: float | None = None
    ) -> list[np.ndarray]:
        """Attention maps ``(T_y, T_x)`` of the predictions; see :meth:`predict_batch`."""
        return self.predict_batch(sources, temperature, with_attention=True)[1]


def load(
    path: str | os.PathLike,
    device: str = "auto",
    *,
    intra_op_num_threads: int | None = None,
    io_binding: bool | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    name: str | None = None,
) -> Runtime:
    """Load an exported artifact directory into a :class:`Runtime`.

    Parameters
    ----------
    path : path
        Directory written by ``Seq2Seq.export_onnx``.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        ``"auto"``: CUDA when onnxruntime has the CUDA provider, else CPU. ``"cuda"`` without
        it raises ``ValueError``.
    intra_op_num_threads : int, optional
        Threads per operator; default: the cores this process may use.
    io_binding : bool, optional
        Keep decoder states on the device between steps; default: on for CUDA.
    max_batch_size : int, default=256
        Inputs are decoded in chunks of at most this many items.
    name : str, optional
        The model's name (default: the directory's name).

    Returns
    -------
    Runtime

    Raises
    ------
    ArtifactError
        The artifact is missing a file, a checksum differs, its format is newer than this
        reader, or a graph cannot be loaded; the message names the file.

    Examples
    --------
    >>> runtime = load("model_dir")  # doctest: +SKIP
    >>> runtime.predict(["hello"])  # doctest: +SKIP
    """
    artifact = read_artifact(path)
    return Runtime(
        artifact,
        device,
        intra_op_num_threads=intra_op_num_threads,
        io_binding=io_binding,
        max_batch_size=max_batch_size,
        name=name,
    )
