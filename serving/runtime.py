"""The torch-free runtime: an exported artifact run by onnxruntime, decoded by ``skattn.core``.

Data flow of one call::

    strings --tokenize--> token lists --skattn.core.inference.Translator over a backend
      (serving.backends: encoder.onnx once, decoder_step.onnx per step)--> strings, maps

or, when the artifact holds ``decode.onnx`` (the default then), the same Translator with its
search replaced by one ``session.run`` of that graph per chunk (:class:`GraphTranslator`):
the encoder and every step run inside onnxruntime, with the GIL released. A request for a
layer's or head's maps (Transformer decoder) adds one run of ``attention.onnx`` over the
predicted tokens after the search (:mod:`skattn.core.attention_maps`).

The inference glue (ids with the end-of-source marker, length-sorted chunks, greedy or beam
search, output formatting, attention rows) is the core's :class:`~skattn.core.inference.Translator`,
the same code ``Seq2Seq.predict`` runs; this module opens the graphs, checks them against the
manifest, and picks the backend (:mod:`serving.backends`).

Sessions, providers and thread settings: :mod:`serving.sessions`.

This module imports numpy, onnxruntime and ``skattn.core`` (plus ``onnx``, to build the select
graph, only when IO binding is on): never torch, scikit-learn, or the training side of skattn.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from serving.artifact import Artifact, ArtifactError, read_artifact
from serving.attention_graph import AttentionGraph
from serving.backends import BoundBackend, GraphTranslator, NumpyBackend, selector_models
from serving.interface import MAX_LISTED_TOKENS, ModelInfo, vocabulary_id
from serving.layout import carry_width, default_chunk_items, share_cores
from serving.sessions import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    open_artifact,
    open_session,
    resolve_device,
    session_options,
)
from serving.sessions import providers as providers_for
from skattn.core.attention_maps import translate_with_maps
from skattn.core.checks import FLOAT32_MAX, check_bool, check_int, check_real
from skattn.core.inference import SearchSettings, Translator
from skattn.core.items import as_outputs, check_output_lengths, check_utf8, ordered_items
from skattn.core.manifest import DECODE_FILE, MAX_OUTPUT_LENGTH
from skattn.core.text import BOS, EOS, SPECIAL_TOKENS, Vocabulary, detokenize, tokenize

__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "Runtime", "load", "resolve_device", "session_options"]

logger = logging.getLogger(__name__)

#: The most ordinary ids a row of the load-time trial holds (before its EOS).
TRIAL_WIDTH = 32


def trial_sources(n_source: int, max_source_length: int) -> np.ndarray:
    """The load-time trial batch ``(B, T) int64``: every ordinary source id (``4 ..
    n_source - 1``) once, in rows of at most ``TRIAL_WIDTH`` (and ``max_source_length``)
    ids, each row ending with EOS, all rows the same length (the last one wraps around to
    the first ids), so that a vocabulary of any size costs the encoder time linear in its size
    (one row of the whole vocabulary cost a Transformer encoder its square: 9 GB at 8,000
    tokens); ``[[EOS]]`` when the vocabulary has no ordinary token."""
    ordinary = np.arange(len(SPECIAL_TOKENS), n_source, dtype=np.int64)
    if ordinary.size == 0:
        return np.full((1, 1), EOS, dtype=np.int64)
    width = min(TRIAL_WIDTH, max_source_length, ordinary.size)
    rows = -(-ordinary.size // width)  # ceil
    ids = np.resize(ordinary, rows * width).reshape(rows, width)  # wraps around
    return np.concatenate([ids, np.full((rows, 1), EOS, dtype=np.int64)], axis=1)


class Runtime:
    """An exported skattn model, ready to translate strings; built by :func:`load`.

    Parameters
    ----------
    artifact : Artifact
        A checked artifact (:func:`serving.artifact.read_artifact`).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    intra_op_num_threads : int, optional
        Threads per operator (one pool per session, shared by the chunks in flight), at most
        1,024. Default: 1 where ``workers`` is given or defaults to several (the CPU without IO
        binding), else the cores this process may use.
    io_binding : bool, optional
        Keep the carry on the device between steps. Default: on for CUDA, off for CPU. Flags
        (this and ``decode_graph``) take True, False or None; anything else is a ValueError.
    decode_graph : bool, optional
        Search with ``decode.onnx`` (one ``session.run`` per chunk, greedy or beam, faster at
        every chunk size measured) instead of the step graphs driven from Python.
        Default: whenever the artifact holds it. ``True`` for an artifact without it raises
        ArtifactError.
    max_batch_size : int, optional
        Larger inputs are sorted by length and decoded in chunks of at most this many items
        (results do not depend on it). Default: by the model's memory and keys width
        (:func:`serving.layout.default_chunk_items`), e.g. 64 items for a bi-GRU 256 model and
        256 for a hidden-64 one; fewer for a large vocabulary searched with many beams (a
        step's log-probabilities at most 4 M floats).
    workers : int, optional
        Chunks decoded at once, each in its own thread (a call's items are cut into at least
        this many chunks). Default on the CPU without IO binding when
        ``intra_op_num_threads`` is not given: one per usable core, each on one onnxruntime
        thread (with the default chunks, 1.5-1.8x the items/s of one chunk of 256 at a time
        on 2 intra-op threads, on 2 cores: ``benchmarks/bench_runtime_chunks.py``); otherwise
        1. IO binding (CUDA's default) decodes one chunk at a time.
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
    decode_graph : bool
        Whether predictions come from ``decode.onnx``.
    workers : int
        Chunks decoded at once.
    attention_graph : serving.attention_graph.AttentionGraph or None
        ``attention.onnx``, when the artifact holds it: per-layer and per-head maps.
    info : ModelInfo
    """

    def __init__(
        self,
        artifact: Artifact,
        device: str = "auto",
        *,
        intra_op_num_threads: int | None = None,
        io_binding: bool | None = None,
        decode_graph: bool | None = None,
        max_batch_size: int | None = None,
        workers: int | None = None,
        name: str | None = None,
    ) -> None:
        if max_batch_size is not None:
            check_int(max_batch_size, "max_batch_size")
        io_binding = check_bool(io_binding, "io_binding", none_ok=True)
        decode_graph = check_bool(decode_graph, "decode_graph", none_ok=True)
        manifest = self.manifest = artifact.manifest
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a str or None, got {type(name).__name__} {name!r:.80}")
        # the folder's name as given (".." made absolute), not a symbolic link's target's
        self.name = name if name is not None else Path(os.path.abspath(artifact.directory)).name
        self.max_source_length = manifest.max_source_length
        self.max_output_length = manifest.max_output_length
        self.tokenizer = manifest.tokenizer

        device_type, device_id = resolve_device(device, manifest.quantization)
        binds = device_type == "cuda" if io_binding is None else bool(io_binding)
        workers, intra_op_num_threads = share_cores(
            workers, intra_op_num_threads, device_type, binds
        )
        options = session_options(intra_op_num_threads)
        providers = providers_for(device_type, device_id)
        if decode_graph and artifact.decode_path is None:
            raise ArtifactError(
                f"{artifact.manifest_path}: decode_graph=True, but no {DECODE_FILE}"
            )
        self.decode_graph = artifact.decode_path is not None and decode_graph is not False
        sessions = open_artifact(artifact, options, providers, self.decode_graph)
        self.provider = sessions.decoder.get_providers()[0]
        device_type, device_id = _started_device(device, device_type, device_id, self.provider)
        self.io_binding = device_type == "cuda" if io_binding is None else bool(io_binding)
        if self.io_binding:
            models = selector_models(sessions.decoder, manifest)
            selectors = tuple(
                open_session(model, options, providers, label)
                for model, label in zip(models, ("select_states", "select_memory"), strict=True)
            )
            backend: NumpyBackend = BoundBackend(
                sessions.encoder, sessions.decoder, selectors, manifest, device_type, device_id
            )
        else:
            backend = NumpyBackend(sessions.encoder, sessions.decoder, manifest)
        self.backend = backend
        self._calls = 0  # calls in progress that terminate() ends (_running)
        self._calls_lock = threading.Lock()
        if max_batch_size is None:
            max_batch_size = default_chunk_items(carry_width(sessions.encoder))
        self.workers = workers
        translator_args = (
            backend,
            Vocabulary.from_list(manifest.source_vocabulary),
            Vocabulary.from_list(manifest.target_vocabulary),
            manifest.tokenizer,
            manifest.output_kind,
            max_batch_size,
            workers,
            manifest.output_order == "right_to_left",
        )
        self.step_translator = Translator(*translator_args)
        self.translator = self.step_translator
        if sessions.decode is not None:
            self.translator = GraphTranslator(sessions.decode, manifest, *translator_args)
        self.attention_graph = None  # attention.onnx: every layer's and head's maps
        if sessions.attention is not None:
            self.attention_graph = AttentionGraph(
                sessions.attention, manifest, artifact.attention_path
            )
        self._check_graphs_run(artifact)
        logger.info(
            "serving model %r on %s (device=%r requested; io_binding=%s; decode_graph=%s; "
            "intra_op_num_threads=%d; workers=%d)",
            self.name,
            self.provider,
            device,
            self.io_binding,
            self.decode_graph,
            options.intra_op_num_threads,
            self.workers,
        )

    def _check_graphs_run(self, artifact: Artifact) -> None:
        """Encode every source token once and take one decoder step: graphs that load but
        cannot run together (another model's encoder, a vocabulary larger than the embedding)
        fail here, at load, and not in the first batch."""
        src = trial_sources(len(self.manifest.source_vocabulary), self.max_source_length)
        B, T = src.shape
        try:
            carry = self.backend.encode(src, np.full(B, T, dtype=np.int64))
            y_prev = np.full(B, BOS, dtype=np.int64)
            log_probs, _, weights = self.backend.step(y_prev, carry, 0, 1.0)
        except Exception as error:  # onnxruntime's own exception types
            raise ArtifactError(
                f"{artifact.directory}: the graphs do not run with the manifest's vocabularies "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from None
        expected = ((B, len(self.manifest.target_vocabulary)), (B, T))
        if (np.shape(log_probs), np.shape(weights)) != expected:
            raise ArtifactError(
                f"{artifact.directory}: the decoder step answered shapes "
                f"{np.shape(log_probs)}, {np.shape(weights)} instead of {expected}"
            )
        if self.decode_graph:  # one step of the whole search, on the same source
            settings = SearchSettings(
                self.manifest.beam_size, self.manifest.length_penalty, max_length=1
            )
            try:
                hypotheses = self.translator.decode(src.tolist(), settings)
            except Exception as error:
                raise ArtifactError(
                    f"{artifact.decode_path}: the graph does not run with the manifest's "
                    f"vocabularies ({type(error).__name__}: {str(error)[:200]})"
                ) from None
            for hypothesis in hypotheses:
                if len(hypothesis.tokens) > 1 or hypothesis.weights.shape[1:] != (T,):
                    raise ArtifactError(
                        f"{artifact.decode_path}: answered {len(hypothesis.tokens)} tokens and "
                        f"attention of shape {hypothesis.weights.shape} for one step"
                    )
        if self.attention_graph is not None:
            self.attention_graph.check(src)

    def __repr__(self) -> str:
        return f"Runtime(name={self.name!r}, provider={self.provider!r})"

    def __sklearn_clone__(self) -> Runtime:
        """``sklearn.base.clone`` returns the runtime itself: it has nothing to unfit, and its
        sessions cannot be copied (a meta-estimator holding it, ``NBestReranker``, clones)."""
        return self

    @functools.cached_property
    def info(self) -> ModelInfo:
        """What clients may know about this model (see :class:`serving.interface.ModelInfo`);
        built once: nothing in it changes after loading."""
        manifest, graph = self.manifest, self.attention_graph
        ordinary = tuple(manifest.source_vocabulary[len(SPECIAL_TOKENS) :])
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
            warmup_source=self._warmup_source(ordinary),
            attention_layers=0 if graph is None else graph.layers,
            attention_heads=0 if graph is None else graph.heads,
            source_tokens=ordinary if len(ordinary) <= MAX_LISTED_TOKENS else (),
        )

    def _warmup_source(self, ordinary: tuple[str, ...]) -> str:
        """Every ordinary source token once (as far as ``max_source_length`` allows), as text
        the tokenizer splits back into them: the server's warm-up looks up every embedding row."""
        tokens = [t for t in ordinary if tokenize(t, self.tokenizer) == [t]]  # servable as text
        return detokenize(tokens[: self.max_source_length], self.tokenizer)

    # -- input checks -----------------------------------------------------------------------

    def check_source(self, text: object) -> None:
        """Raise ``ValueError`` when ``text`` cannot be translated (not a str, not valid Unicode
        text, or too long).

        Parameters
        ----------
        text : object
            One source item.
        """
        if not isinstance(text, str):
            raise ValueError(f"sources must be str, got {type(text).__name__}: {text!r:.80}")
        check_utf8(text, "a source")  # as the estimator refuses it, not read as <unk>
        n_tokens = len(tokenize(text, self.tokenizer))
        if n_tokens > self.max_source_length:
            raise ValueError(
                f"source has {n_tokens} tokens, more than "
                f"max_source_length={self.max_source_length}"
            )

    def search_settings(self, temperature: float | None = None) -> SearchSettings:
        """The manifest's search at ``temperature`` (None: the manifest's; checked)."""
        manifest = self.manifest
        if temperature is None:
            temperature = manifest.temperature
        return SearchSettings(
            beam_size=manifest.beam_size,
            length_penalty=manifest.length_penalty,
            max_length=self.max_output_length,
            temperature=check_real(temperature, "temperature", 0.0, FLOAT32_MAX, low_open=True),
        )

    # -- prediction -------------------------------------------------------------------------

    def predict_batch(
        self,
        sources: Sequence[str],
        temperature: float | None = None,
        with_attention: bool = False,
        *,
        layer: int | str | None = None,
        head: int | str | None = None,
    ) -> tuple[list, list[np.ndarray] | None]:
        """Translate a batch, optionally with the attention maps.

        Parameters
        ----------
        sources : list of str
            Any sized collection (list, tuple, NumPy or pandas), as the estimator accepts.
            Unlike ``Seq2Seq.predict``, which follows scikit-learn in refusing an empty ``X``,
            an empty batch is answered with empty lists (a server's batch of no items).
        temperature : float, optional
            Softmax temperature of the attention; default: the manifest's.
        with_attention : bool, default=False
        layer, head : int, "all" or None, default=None
            Which cross-attention maps (Transformer decoder, ``info.attention_layers > 0``), as
            ``Seq2Seq.predict_attention`` takes them: a layer (negative: from the last) or
            ``"all"``; a head, ``"all"`` or None (the mean over heads). Both None: the last
            layer's mean, the map the search collects. Other values raise ``ValueError``.

        Returns
        -------
        predictions : list
            One per source: a str (``output_kind="str"``) or a list of tokens (``"tokens"``).
        attentions : list of ndarray (T_y, T_x) or None
            ``T_y`` output tokens, ``T_x`` = source tokens + 1 (the end-of-source marker);
            rows sum to 1. ``None`` unless ``with_attention``. Each ``"all"`` adds a leading
            axis (layers before heads).
        """
        with_attention = check_bool(with_attention, "with_attention")
        sources = ordered_items(sources, "sources")
        for text in sources:
            self.check_source(text)
        settings = self.search_settings(temperature)
        selection = self.info.map_selection(layer, head)
        token_lists = [tokenize(text, self.tokenizer) for text in sources]
        with self._running():
            if selection is None or not with_attention:
                return self.translator.translate(token_lists, settings, with_attention)
            return translate_with_maps(
                self.translator, token_lists, settings, selection, self.attention_graph
            )

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """A call that :meth:`terminate` ends (``predict_batch``, ``log_likelihood``): the
        runtime's one terminate flag is cleared when the last of them ends, not when another
        starts or ends before it, so a terminate reaches every call in progress; the next
        call (a continuous search too) runs as usual."""
        with self._calls_lock:
            self._calls += 1
        try:
            yield
        finally:
            with self._calls_lock:
                self._calls -= 1
                if not self._calls:
                    self.backend.run_options.terminate = False

    def terminate(self) -> None:
        """Stop the ``predict_batch`` in progress (called from another thread): its
        onnxruntime runs end at their next node, and it raises. The server's batcher calls it
        when every request of the batch has gone, so an abandoned search does not hold the
        model; the runtime's next call runs as usual. With several calls in progress
        (``predict_batch`` or ``log_likelihood`` in other threads), it stops them all, and a
        call that starts before the last of them has ended stops too (the server's batcher
        starts none meanwhile); with none, it does nothing."""
        with self._calls_lock:
            if self._calls:
                self.backend.run_options.terminate = True

    def log_likelihood(
        self, sources: Sequence[str], outputs: Sequence, temperature: float | None = None
    ) -> np.ndarray:
        """``log p(output | source)`` of each pair, as ``Seq2Seq.log_likelihood`` (the step
        graph over the given outputs; -inf where an output token is not in the target
        vocabulary): what :class:`skattn.rescoring.NBestReranker` scores candidates with.
        Pairs are scored in padded batches of similar length in float32, so a pair's value
        may differ in its last bits (about 1e-7 relative) with the batch it came in, and from
        the estimator's. In an int8 artifact (``quantize="int8"``) an activation near a
        rounding boundary of its fixed range may round to the next level with the batch, so
        a few values move further (up to a few 1e-3 relative, on unlikely outputs).

        Parameters
        ----------
        sources : sequence of str
        outputs : sequence of str or of token lists
            As the model predicts them: strings (split with the model's tokenizer) only for a
            model fitted on strings; a model fitted on token lists refuses them. At most 4,096
            tokens each (the most an artifact writes; ValueError), as sources are bounded.
        temperature : float, optional
            Default: the manifest's.

        Returns
        -------
        ndarray of shape (n_items,)
        """
        sources = ordered_items(sources, "sources")
        outputs = ordered_items(outputs, "outputs")
        if len(sources) != len(outputs):
            raise ValueError(
                f"sources and outputs differ in length: {len(sources)}, {len(outputs)}"
            )
        for text in sources:
            self.check_source(text)
        settings = self.search_settings(temperature)
        if not sources:
            return np.empty(0)
        source_tokens = [tokenize(text, self.tokenizer) for text in sources]
        output_tokens = as_outputs(outputs, "outputs", self.tokenizer, self.manifest.output_kind)
        check_output_lengths(output_tokens, MAX_OUTPUT_LENGTH, "outputs")
        with self._running():
            return self.translator.log_likelihoods(
                source_tokens, output_tokens, settings.temperature
            )

    def predict(self, sources: Sequence[str], temperature: float | None = None) -> list:
        """Translate ``sources``; see :meth:`predict_batch`."""
        return self.predict_batch(sources, temperature)[0]

    def predict_attention(
        self,
        sources: Sequence[str],
        temperature: float | None = None,
        *,
        layer: int | str | None = None,
        head: int | str | None = None,
    ) -> list[np.ndarray]:
        """Attention maps ``(T_y, T_x)`` of the predictions; see :meth:`predict_batch`."""
        return self.predict_batch(sources, temperature, True, layer=layer, head=head)[1]


def _started_device(device: str, device_type: str, device_id: int, provider: str) -> tuple:
    """``(device_type, device_id)`` the sessions run on: CUDA asked for but not started by
    onnxruntime raises for an explicit ``device``, and falls back to the CPU for ``"auto"``."""
    if device_type != "cuda" or provider == CUDA_PROVIDER:
        return device_type, device_id
    if device != "auto":
        raise RuntimeError(
            f"device={device!r}: onnxruntime could not start {CUDA_PROVIDER} "
            f"(sessions run on {provider}); check the CUDA and cuDNN libraries"
        )
    logger.warning("CUDA provider failed to start; falling back to %s", provider)
    return "cpu", 0


def load(
    path: str | os.PathLike,
    device: str = "auto",
    *,
    intra_op_num_threads: int | None = None,
    io_binding: bool | None = None,
    decode_graph: bool | None = None,
    max_batch_size: int | None = None,
    workers: int | None = None,
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
        Threads per operator; default: 1 where ``workers`` decode side by side (the CPU, by
        default), else the cores this process may use (see :class:`Runtime`).
    io_binding : bool, optional
        Keep decoder states on the device between steps; default: on for CUDA.
    decode_graph : bool, optional
        Search with ``decode.onnx``; default: whenever the artifact holds it.
    max_batch_size : int, optional
        Inputs are decoded in chunks of at most this many items; default: by the model's
        width (see :class:`Runtime`).
    workers : int, optional
        Chunks decoded at once; default on the CPU without ``intra_op_num_threads``: one per
        usable core, each on one onnxruntime thread (see :class:`Runtime`).
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
        read_artifact(path, hash_files=False),  # each graph is hashed as it is opened
        device,
        intra_op_num_threads=intra_op_num_threads,
        io_binding=io_binding,
        decode_graph=decode_graph,
        max_batch_size=max_batch_size,
        workers=workers,
        name=name,
    )
