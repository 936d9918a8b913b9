"""The torch-free runtime: an exported artifact run by onnxruntime, decoded by ``skattn.core``.

Data flow of one call::

    strings --tokenize--> token lists --skattn.core.inference.Translator over a backend
      (serving.backends: encoder.onnx once, decoder_step.onnx per step)--> strings, maps

The inference glue (ids with the end-of-source marker, length-sorted chunks, greedy or beam
search, output formatting, attention rows) is the core's :class:`~skattn.core.inference.Translator`,
the same code ``Seq2Seq.predict`` runs; this module opens the graphs, checks them against the
manifest, and picks the backend (:mod:`serving.backends`).

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
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from serving.artifact import Artifact, ArtifactError, check_binding, read_artifact
from serving.backends import BoundBackend, NumpyBackend, gather_rows_model
from serving.interface import ModelInfo, vocabulary_id
from skattn.core.checks import check_int, check_real, parse_device, usable_cores
from skattn.core.inference import DEFAULT_MAX_BATCH_SIZE, SearchSettings, Translator
from skattn.core.manifest import DECODER_FILE, Manifest
from skattn.core.text import EOS, SPECIAL_TOKENS, Vocabulary, detokenize, tokenize

__all__ = ["Runtime", "load", "resolve_device", "session_options"]

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def session_options(intra_op_num_threads: int | None = None) -> ort.SessionOptions:
    """Session options used for every graph of the runtime.

    Parameters
    ----------
    intra_op_num_threads : int, optional
        Threads that split one operator's work. Default: the cores this process may use
        (:func:`skattn.core.checks.usable_cores`: its affinity mask and cgroup CPU quota).

    Returns
    -------
    onnxruntime.SessionOptions
        ``inter_op_num_threads=1``, ``ORT_SEQUENTIAL``, spinning off, ``ORT_ENABLE_ALL``.
    """
    if intra_op_num_threads is None:
        intra_op_num_threads = usable_cores()
    options = ort.SessionOptions()
    options.intra_op_num_threads = check_int(intra_op_num_threads, "intra_op_num_threads")
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
    kind, index = parse_device(device)
    available = ort.get_available_providers()
    if kind == "auto":
        return ("cuda", 0) if CUDA_PROVIDER in available else ("cpu", 0)
    if kind == "cpu":
        return "cpu", 0
    if CUDA_PROVIDER not in available:
        raise ValueError(
            f"device={device!r} asks for CUDA, but this onnxruntime has no {CUDA_PROVIDER} "
            f"(available: {available}); install onnxruntime-gpu, or use device='cpu' or 'auto'"
        )
    return "cuda", index or 0


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
    path: Path,
    options: ort.SessionOptions,
    providers: list,
    manifest: Manifest,
    inputs: list[str],
    outputs: list[str],
) -> ort.InferenceSession:
    """Open one graph; check its signature and that it was exported with ``manifest``."""
    session = _open_session(str(path), options, providers, str(path))
    actual_in = [i.name for i in session.get_inputs()]
    actual_out = [o.name for o in session.get_outputs()]
    if actual_in != inputs or actual_out != outputs:
        raise ArtifactError(
            f"{path}: graph signature {actual_in} -> {actual_out} differs from the expected "
            f"{inputs} -> {outputs}"
        )
    check_binding(path, session.get_modelmeta().custom_metadata_map, manifest)
    return session


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
    manifest : Manifest
    max_source_length, max_output_length : int
        Limits in tokens: :meth:`check_source` refuses longer sources.
    provider : str
        ``"CUDAExecutionProvider"`` or ``"CPUExecutionProvider"``: where the graphs run.
    info : ModelInfo
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
        check_int(max_batch_size, "max_batch_size")
        manifest = self.manifest = artifact.manifest
        self.name = name if name is not None else artifact.directory.resolve().name
        self.max_source_length = manifest.max_source_length
        self.max_output_length = manifest.max_output_length
        self.tokenizer = manifest.tokenizer

        device_type, device_id = resolve_device(device)
        options = session_options(intra_op_num_threads)
        providers = _providers(device_type, device_id)
        encoder = _open_graph(
            artifact.encoder_path,
            options,
            providers,
            manifest,
            manifest.encoder_inputs(),
            manifest.encoder_outputs(),
        )
        decoder = _open_graph(
            artifact.decoder_path,
            options,
            providers,
            manifest,
            manifest.decoder_inputs(),
            manifest.decoder_outputs(),
        )
        vocab_size = decoder.get_outputs()[0].shape[-1]  # log_probs (B, V): V is fixed
        if isinstance(vocab_size, int) and vocab_size != len(manifest.target_vocabulary):
            raise ArtifactError(
                f"{artifact.manifest_path}: 'target_vocabulary' has "
                f"{len(manifest.target_vocabulary)} tokens but {DECODER_FILE} scores {vocab_size}"
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
            carry = set(manifest.carry_names())
            selector = _open_session(
                gather_rows_model([i for i in decoder.get_inputs() if i.name in carry]),
                options,
                providers,
                "select_rows",
            )
            backend: NumpyBackend = BoundBackend(
                encoder, decoder, selector, manifest, device_type, device_id
            )
        else:
            backend = NumpyBackend(encoder, decoder, manifest)
        self.backend = backend
        self.translator = Translator(
            backend,
            Vocabulary.from_list(manifest.source_vocabulary),
            Vocabulary.from_list(manifest.target_vocabulary),
            manifest.tokenizer,
            manifest.output_kind,
            max_batch_size,
        )
        self._check_graphs_run(artifact)
        logger.info(
            "serving model %r on %s (device=%r requested; io_binding=%s; intra_op_num_threads=%d)",
            self.name,
            self.provider,
            device,
            self.io_binding,
            options.intra_op_num_threads,
        )

    def _check_graphs_run(self, artifact: Artifact) -> None:
        """Encode every source token once and take one decoder step: graphs that load but
        cannot run together (another model's encoder, a vocabulary larger than the embedding)
        fail here, at load, and not in the first batch."""
        n_source = len(self.manifest.source_vocabulary)
        src = np.arange(4, n_source + 1, dtype=np.int64)[None, :]  # (1, n), every ordinary id
        src[0, -1] = EOS
        try:
            carry = self.backend.encode(src, np.array([src.shape[1]], dtype=np.int64))
            y_prev = np.full(1, 1, dtype=np.int64)  # BOS
            log_probs, _, weights = self.backend.step(y_prev, carry, 0, 1.0)
        except Exception as error:  # onnxruntime's own exception types
            raise ArtifactError(
                f"{artifact.directory}: the graphs do not run with the manifest's vocabularies "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from None
        expected = ((1, len(self.manifest.target_vocabulary)), (1, src.shape[1]))
        if (np.shape(log_probs), np.shape(weights)) != expected:
            raise ArtifactError(
                f"{artifact.directory}: the decoder step answered shapes "
                f"{np.shape(log_probs)}, {np.shape(weights)} instead of {expected}"
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
            output_kind=manifest.output_kind,
            tokenizer=manifest.tokenizer,
            decoder=manifest.decoder,
            attention=manifest.attention,
            scorer=manifest.scorer,
            beam_size=manifest.beam_size,
            temperature=manifest.temperature,
            vocabulary_id=vocabulary_id(manifest.source_vocabulary, manifest.target_vocabulary),
            warmup_source=self._warmup_source(),
        )

    def _warmup_source(self) -> str:
        """Every ordinary source token once (as far as ``max_source_length`` allows), as text
        the tokenizer splits back into them: the server's warm-up looks up every embedding row."""
        ordinary = self.manifest.source_vocabulary[len(SPECIAL_TOKENS) :]
        tokens = [t for t in ordinary if tokenize(t, self.tokenizer) == [t]]  # servable as text
        return detokenize(tokens[: self.max_source_length], self.tokenizer)

    # -- input checks -----------------------------------------------------------------------

    def check_source(self, text: object) -> None:
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

    def _settings(self, temperature: float | None) -> SearchSettings:
        manifest = self.manifest
        if temperature is None:
            temperature = manifest.temperature
        return SearchSettings(
            beam_size=manifest.beam_size,
            length_penalty=manifest.length_penalty,
            max_length=self.max_output_length,
            temperature=check_real(temperature, "temperature", 0.0, low_open=True),
        )

    # -- prediction -------------------------------------------------------------------------

    def predict_batch(
        self, sources: Sequence[str], temperature: float | None = None, with_attention: bool = False
    ) -> tuple[list, list[np.ndarray] | None]:
        """Translate a batch, optionally with the attention maps.

        Parameters
        ----------
        sources : list of str
            Any sized collection (list, tuple, NumPy or pandas), as the estimator accepts.
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
        if isinstance(sources, str | bytes | dict) or not hasattr(sources, "__len__"):
            raise ValueError(f"sources must be a list of str, got {type(sources).__name__}")
        sources = list(sources)
        for text in sources:
            self.check_source(text)
        settings = self._settings(temperature)
        token_lists = [tokenize(text, self.tokenizer) for text in sources]
        return self.translator.translate(token_lists, settings, with_attention)

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
        The artifact is missing a file, a checksum differs, the manifest was edited or is
        newer than this reader, a graph was exported for another manifest, or the graphs
        cannot run; the message names the file.

    Examples
    --------
    >>> runtime = load("model_dir")  # doctest: +SKIP
    >>> runtime.predict(["hello"])  # doctest: +SKIP
    """
    return Runtime(
        read_artifact(path),
        device,
        intra_op_num_threads=intra_op_num_threads,
        io_binding=io_binding,
        max_batch_size=max_batch_size,
        name=name,
    )
