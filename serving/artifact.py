"""The exported model artifact: its layout, its manifest schema, and the checks made on loading.

An artifact is a directory written by :func:`skattn.export.export_onnx` and read by
:func:`serving.load`::

    model_dir/
      manifest.json      what the graphs need around them (see MANIFEST_KEYS)
      encoder.onnx       src (B, T) int64, src_lengths (B,) int64
                         -> memory, keys, mask, <state_names...>
      decoder_step.onnx  y_prev (B,) int64, <state_names...>, memory, keys, mask,
                         temperature () float32, position () int64
                         -> log_probs (B, V), <new_ + state_names...>, weights (B, T)

The weights live inside the ONNX files; there is no external data and no pickle. Loading checks,
in order: the directory exists, the manifest parses and holds every key with the right type, its
``format_version`` is not newer than this reader's, every listed file exists and matches its
SHA-256, and the vocabularies hold the fixed special tokens. Any failure raises
:class:`ArtifactError` (a ``ValueError``) naming the file at fault.

This module is torch-free: it reads JSON and bytes (and the special tokens from
``skattn.core.text``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skattn.core.text import SPECIAL_TOKENS

__all__ = [
    "DECODER_FILE",
    "ENCODER_FILE",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "Artifact",
    "ArtifactError",
    "decoder_input_names",
    "decoder_output_names",
    "encoder_input_names",
    "encoder_output_names",
    "read_artifact",
    "sha256_file",
    "validate_manifest",
    "write_manifest",
]

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder_step.onnx"
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE)

SPECIAL_IDS = {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
OUTPUT_KINDS = ("str", "tokens")
TOKENIZERS = ("char", "space")

# key -> the JSON types it may hold (bool is rejected where int is meant, see _check_type).
MANIFEST_KEYS: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "tokenizer": (str,),
    "source_vocabulary": (list,),
    "target_vocabulary": (list,),
    "special_ids": (dict,),
    "decoder": (str,),
    "attention": (str,),
    "scorer": (str,),
    "cell": (str,),
    "input_feeding": (bool,),
    "state_names": (list,),
    "limits": (dict,),
    "beam_size": (int,),
    "length_penalty": (int, float),
    "temperature": (int, float),
    "output_kind": (str,),
    "files": (dict,),
}
LIMIT_KEYS = ("max_source_length", "max_output_length")


class ArtifactError(ValueError):
    """An artifact directory that cannot be served: missing, corrupt, or from a newer writer."""


def encoder_input_names() -> list[str]:
    """Inputs of ``encoder.onnx``, in order."""
    return ["src", "src_lengths"]


def encoder_output_names(state_names: list[str]) -> list[str]:
    """Outputs of ``encoder.onnx``, in order: ``memory, keys, mask, <state_names...>``."""
    return ["memory", "keys", "mask", *state_names]


def decoder_input_names(state_names: list[str]) -> list[str]:
    """Inputs of ``decoder_step.onnx``, in order."""
    return ["y_prev", *state_names, "memory", "keys", "mask", "temperature", "position"]


def decoder_output_names(state_names: list[str]) -> list[str]:
    """Outputs of ``decoder_step.onnx``, in order: ``log_probs, new_<state>..., weights``."""
    return ["log_probs", *(f"new_{name}" for name in state_names), "weights"]


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_type(manifest: dict, key: str, where: str) -> None:
    if key not in manifest:
        raise ArtifactError(f"{where}: missing key {key!r}")
    value, types = manifest[key], MANIFEST_KEYS[key]
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        raise ArtifactError(f"{where}: {key!r} must be {names}, got {type(value).__name__}")


def validate_manifest(manifest: Any, where: str = MANIFEST_FILE) -> dict:
    """Check a manifest's keys, types and values; return it unchanged.

    Parameters
    ----------
    manifest : dict
        The parsed ``manifest.json``.
    where : str
        How to name the manifest in error messages (its path).

    Returns
    -------
    dict

    Raises
    ------
    ArtifactError
        Naming ``where`` and the offending key.
    """
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where}: must hold a JSON object, got {type(manifest).__name__}")
    _check_type(manifest, "format_version", where)
    version = manifest["format_version"]
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{where}: format_version {version} is newer than this reader's ({FORMAT_VERSION}); "
            "upgrade skattn/serving to load this model"
        )
    if version < 1:
        raise ArtifactError(f"{where}: format_version must be >= 1, got {version}")
    for key in MANIFEST_KEYS:
        _check_type(manifest, key, where)
    if manifest["tokenizer"] not in TOKENIZERS:
        raise ArtifactError(f"{where}: tokenizer must be one of {TOKENIZERS}")
    if manifest["output_kind"] not in OUTPUT_KINDS:
        raise ArtifactError(f"{where}: output_kind must be one of {OUTPUT_KINDS}")
    if manifest["special_ids"] != SPECIAL_IDS:
        raise ArtifactError(f"{where}: special_ids must be {SPECIAL_IDS}")
    for key in ("source_vocabulary", "target_vocabulary"):
        tokens = manifest[key]
        if not all(isinstance(t, str) for t in tokens) or len(tokens) <= len(SPECIAL_IDS):
            raise ArtifactError(f"{where}: {key!r} must be a list of str beyond the specials")
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ArtifactError(f"{where}: {key!r} must start with {list(SPECIAL_TOKENS)}")
        if len(set(tokens)) != len(tokens):
            raise ArtifactError(f"{where}: {key!r} holds a token twice")
    state_names = manifest["state_names"]
    if not state_names or not all(isinstance(n, str) and n.isidentifier() for n in state_names):
        raise ArtifactError(f"{where}: 'state_names' must be a non-empty list of identifiers")
    limits = manifest["limits"]
    for key in LIMIT_KEYS:
        value = limits.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArtifactError(f"{where}: limits[{key!r}] must be an int >= 1, got {value!r}")
    if manifest["beam_size"] < 1:
        raise ArtifactError(f"{where}: 'beam_size' must be >= 1")
    if not (math.isfinite(manifest["length_penalty"]) and manifest["length_penalty"] >= 0):
        raise ArtifactError(f"{where}: 'length_penalty' must be a finite number >= 0")
    if not (math.isfinite(manifest["temperature"]) and manifest["temperature"] > 0):
        raise ArtifactError(f"{where}: 'temperature' must be a finite number > 0")
    if sorted(manifest["files"]) != sorted(GRAPH_FILES):
        raise ArtifactError(f"{where}: 'files' must list exactly {list(GRAPH_FILES)}")
    return manifest


def write_manifest(directory: str | os.PathLike, manifest: dict) -> Path:
    """Fill in ``files`` with the graphs' SHA-256, validate, and write ``manifest.json``.

    Parameters
    ----------
    directory : path
        The artifact directory, already holding ``encoder.onnx`` and ``decoder_step.onnx``.
    manifest : dict
        Every key of the schema except ``files``.

    Returns
    -------
    Path
        The manifest's path.
    """
    directory = Path(directory)
    manifest = {**manifest, "files": {name: sha256_file(directory / name) for name in GRAPH_FILES}}
    validate_manifest(manifest, where=str(directory / MANIFEST_FILE))
    path = directory / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class Artifact:
    """A checked artifact directory.

    Attributes
    ----------
    directory : Path
    manifest : dict
        The validated manifest.
    encoder_path, decoder_path : Path
        The graphs, whose bytes matched the manifest's checksums when read.
    """

    directory: Path
    manifest: dict

    @property
    def encoder_path(self) -> Path:
        return self.directory / ENCODER_FILE

    @property
    def decoder_path(self) -> Path:
        return self.directory / DECODER_FILE


def read_artifact(path: str | os.PathLike) -> Artifact:
    """Read and check an artifact directory.

    Parameters
    ----------
    path : path
        The directory written by ``Seq2Seq.export_onnx``.

    Returns
    -------
    Artifact

    Raises
    ------
    ArtifactError
        The directory or a file is missing, the manifest is malformed or from a newer format,
        or a graph's SHA-256 differs from the manifest's; the message names the file.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: not an artifact directory (no such directory)")
    manifest_path = directory / MANIFEST_FILE
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(f"{manifest_path}: missing manifest file") from None
    except (OSError, UnicodeDecodeError) as error:  # a directory, unreadable, not UTF-8
        raise ArtifactError(f"{manifest_path}: cannot be read ({error})") from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as error:  # bad JSON, a number too long to convert
        raise ArtifactError(f"{manifest_path}: not valid JSON ({error})") from None
    validate_manifest(manifest, where=str(manifest_path))
    for name, expected in manifest["files"].items():
        file_path = directory / name
        if not file_path.is_file():
            raise ArtifactError(f"{file_path}: missing file listed in {MANIFEST_FILE}")
        actual = sha256_file(file_path)
        if actual != expected:
            raise ArtifactError(
                f"{file_path}: checksum mismatch (sha256 {actual[:12]}..., "
                f"{MANIFEST_FILE} says {str(expected)[:12]}...); the file is corrupt or replaced"
            )
    return Artifact(directory=directory, manifest=manifest)
