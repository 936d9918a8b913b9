"""onnxruntime sessions for the runtime: options, device and providers, opening checked graphs.

Thread settings (see :func:`session_options`) are chosen for a server whose cores are shared:
``intra_op_num_threads`` defaults to the cores this process may use; ``inter_op_num_threads=1``
with ``ORT_SEQUENTIAL`` because a decoder step is a chain of dependent small ops with nothing to
run side by side; ``session.intra_op.allow_spinning="0"`` so that idle pool threads sleep instead
of busy-waiting between steps (the search's NumPy work, the HTTP server and other workers need
those cores); graph optimisation ``ORT_ENABLE_ALL`` (constant folding, fusions, layout changes).
Small models on few, busy cores are often fastest with ``intra_op_num_threads=1`` (hidden size
128, batch 64, on a loaded 2-core machine: 0.62 s with one thread, 0.83 s with two).

Imports onnxruntime, :mod:`serving.artifact` and ``skattn.core`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import logging
from pathlib import Path

import onnxruntime as ort

from serving.artifact import Artifact, ArtifactError, check_binding, check_search
from skattn.core.artifact import check_digest, check_file
from skattn.core.checks import MAX_THREADS, check_int, parse_device, usable_cores
from skattn.core.manifest import CPU_ONLY_QUANTIZATIONS, DECODER_FILE, Manifest

__all__ = [
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "ArtifactSessions",
    "cuda_provider_options",
    "open_artifact",
    "open_graph",
    "open_session",
    "preload_cuda_libraries",
    "providers",
    "resolve_device",
    "session_options",
]

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

logger = logging.getLogger(__name__)


def session_options(intra_op_num_threads: int | None = None) -> ort.SessionOptions:
    """Session options used for every graph of the runtime.

    Parameters
    ----------
    intra_op_num_threads : int, optional
        Threads that split one operator's work, 1 to 1,024 (``MAX_THREADS``). Default: the
        cores this process may use (:func:`skattn.core.checks.usable_cores`: its affinity mask
        and cgroup CPU quota).

    Returns
    -------
    onnxruntime.SessionOptions
        ``inter_op_num_threads=1``, ``ORT_SEQUENTIAL``, spinning off, ``ORT_ENABLE_ALL``.
    """
    if intra_op_num_threads is None:
        intra_op_num_threads = usable_cores()
    options = ort.SessionOptions()
    options.intra_op_num_threads = check_int(
        intra_op_num_threads, "intra_op_num_threads", 1, MAX_THREADS
    )
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: no per-session chatter on stderr
    return options


def resolve_device(device: str, quantization: str = "none") -> tuple[str, int]:
    """Map ``device`` to ``(device_type, device_id)`` for onnxruntime.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "cuda:N"}
        ``"auto"`` takes CUDA when this onnxruntime build has the CUDA provider (and the
        graphs are not int8).
    quantization : {"none", "int8", "float16"}
        The artifact's (its manifest's). The int8 graphs are built for onnxruntime's CPU
        kernels (``MatMulIntegerToFloat``; never checked on CUDA): ``"auto"`` then means the
        CPU, and CUDA is refused. float16 weights run in float32 on any device.

    Returns
    -------
    tuple of (str, int)
        ``("cuda", N)`` or ``("cpu", 0)``.
    """
    kind, index = parse_device(device)
    available = ort.get_available_providers()
    if quantization in CPU_ONLY_QUANTIZATIONS and kind != "cpu":
        if kind == "auto":
            return "cpu", 0
        raise ValueError(
            f"device={device!r}: this artifact's graphs are {quantization}-quantized for "
            "onnxruntime's CPU kernels and served on the CPU only; use device='cpu' or "
            "'auto', or serve an artifact exported without quantize on CUDA"
        )
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


def providers(device_type: str, device_id: int) -> list:
    """onnxruntime's provider list for ``(device_type, device_id)``; CUDA preloads its
    libraries first (:func:`preload_cuda_libraries`)."""
    if device_type == "cuda":
        preload_cuda_libraries()
        return [(CUDA_PROVIDER, cuda_provider_options(device_id)), CPU_PROVIDER]
    return [CPU_PROVIDER]


def cuda_provider_options(device_id: int) -> dict[str, str]:
    """The CUDA provider's options: the device, and full float32 products.

    onnxruntime's CUDA provider multiplies float32 matrices in TF32 by default (``use_tf32=1``:
    10-bit mantissas on the tensor cores). On an H200 that made the CUDA runtime answer 3 of
    2,048 reversal inputs differently from the CPU runtime, and the batched server 7 of its
    answers differently from the unbatched one, for 0.4-4 % more items/s at batch 64 and 256
    (``benchmarks/bench_cuda_tf32.py``; results ``gpu_check_h200*.txt``): these models'
    products are small, and a step is bound by kernel launches. ``use_tf32=0`` keeps the
    float32 the graphs were checked in; with it both counts were 0.
    """
    return {"device_id": str(device_id), "use_tf32": "0"}


@functools.cache
def preload_cuda_libraries() -> bool:
    """Load the CUDA and cuDNN libraries of NVIDIA's pip packages before a CUDA session starts.

    onnxruntime-gpu's CUDA provider names ``libcudart``, ``libcublas`` (and cuDNN) without a
    search path, so a server that never imports torch finds them only on ``LD_LIBRARY_PATH``
    or in the system's CUDA. ``onnxruntime.preload_dlls`` (onnxruntime >= 1.21) loads them
    from the ``nvidia-*`` packages that ``pip install "onnxruntime-gpu[cuda,cudnn]"`` brings,
    and otherwise from the default paths. Best effort and once per process: what it could
    not load is logged at debug level, and a provider that then fails to start is reported by
    the runtime (``device="cuda"`` raises; ``"auto"`` falls back to the CPU).

    Returns
    -------
    bool
        Whether onnxruntime has ``preload_dlls`` and it raised nothing.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return False
    said = io.StringIO()  # preload_dlls prints what it could not load: log it instead
    try:
        with contextlib.redirect_stdout(said):
            preload()
    except Exception as error:  # a missing directory, a broken library: the session will tell
        logger.debug("onnxruntime.preload_dlls failed: %s", error)
        return False
    finally:
        if said.getvalue().strip():
            logger.debug("onnxruntime.preload_dlls: %s", said.getvalue().strip())
    return True


def open_session(
    model: str | bytes, options: ort.SessionOptions, providers: list, name: str
) -> ort.InferenceSession:
    """An ``InferenceSession``; a graph onnxruntime cannot read raises ArtifactError naming it."""
    try:
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as error:  # onnxruntime raises its own exception types (Fail, InvalidGraph...)
        raise ArtifactError(f"{name}: onnxruntime cannot load this graph ({error})") from None


def open_graph(
    path: Path,
    options: ort.SessionOptions,
    providers: list,
    manifest: Manifest,
    inputs: list[str],
    outputs: list[str],
) -> ort.InferenceSession:
    """Open one graph; check its signature and that it was exported with ``manifest``.

    onnxruntime gets the bytes checked against the manifest's SHA-256 (read once: a file
    swapped between a check and the load could not pass; ``serving.load`` hashes the graphs
    here only), and no folder to read external data
    from (``options``, :func:`open_artifact`): weights in a file beside a graph are covered by
    no checksum, so a graph that refers to one is refused."""
    try:
        data = path.read_bytes()
    except OSError as error:  # removed since read_artifact checked it: an export swapping it
        raise ArtifactError(f"{path}: cannot be read ({error}); load it again") from None
    check_digest(path, hashlib.sha256(data).hexdigest(), manifest.files.get(path.name))
    session = open_session(data, options, providers, str(path))
    actual_in = [i.name for i in session.get_inputs()]
    actual_out = [o.name for o in session.get_outputs()]
    if actual_in != inputs or actual_out != outputs:
        raise ArtifactError(
            f"{path}: graph signature {actual_in} -> {actual_out} differs from the expected "
            f"{inputs} -> {outputs}"
        )
    check_binding(path, session.get_modelmeta().custom_metadata_map, manifest)
    return session


@dataclasses.dataclass(frozen=True)
class ArtifactSessions:
    """An artifact's graphs open in onnxruntime, each checked against the manifest's names:
    ``decode`` when the runtime searches with it, ``attention`` when the artifact holds it."""

    encoder: ort.InferenceSession
    decoder: ort.InferenceSession
    decode: ort.InferenceSession | None
    attention: ort.InferenceSession | None


def open_artifact(
    artifact: Artifact, options: ort.SessionOptions, providers: list, decode_graph: bool
) -> ArtifactSessions:
    """Open the graphs a runtime runs (:func:`open_graph` each); raise ArtifactError where one
    does not match the manifest (names, or a decoder that scores another vocabulary size)."""
    manifest = artifact.manifest
    # Graphs load from bytes: external data would be read from this folder, which cannot
    # exist (a regular file's name as a folder), so a graph with any is refused.
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(artifact.manifest_path)
    )

    opened = set()

    def graph(path, inputs: list[str], outputs: list[str]) -> ort.InferenceSession:
        opened.add(path.name)
        return open_graph(path, options, providers, manifest, inputs, outputs)

    encoder = graph(artifact.encoder_path, manifest.encoder_inputs(), manifest.encoder_outputs())
    decoder = graph(artifact.decoder_path, manifest.decoder_inputs(), manifest.decoder_outputs())
    vocab_size = decoder.get_outputs()[0].shape[-1]  # log_probs (B, V): V is fixed
    if isinstance(vocab_size, int) and vocab_size != len(manifest.target_vocabulary):
        raise ArtifactError(
            f"{artifact.manifest_path}: 'target_vocabulary' has "
            f"{len(manifest.target_vocabulary)} tokens but {DECODER_FILE} scores {vocab_size}"
        )
    decode = attention = None
    if decode_graph:
        names = (manifest.decode_inputs(), manifest.decode_outputs())
        decode = graph(artifact.decode_path, *names)
        metadata = decode.get_modelmeta().custom_metadata_map
        check_search(artifact.decode_path, metadata, manifest)
    if artifact.attention_path is not None:
        names = (manifest.attention_inputs(), manifest.attention_outputs())
        attention = graph(artifact.attention_path, *names)
    for name, expected in manifest.files.items():  # (decode.onnx, when not run): checked all
        if name not in opened:  # the same, as the README says of every listed graph
            check_file(artifact.directory / name, expected)
    return ArtifactSessions(encoder, decoder, decode, attention)
