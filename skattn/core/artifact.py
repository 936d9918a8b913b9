"""Reading an artifact directory: its manifest and its graphs' checksums.

The layout and the manifest's fields are :mod:`skattn.core.manifest`'s (the contract the
exporter writes). :func:`read_artifact` checks, in order: the directory exists;
``manifest.json`` reads as UTF-8, parses and validates (:meth:`Manifest.from_json`: keys, types,
bounds, format version, the manifest's own binding digest); both step graphs are listed
(``decode.onnx`` and ``attention.onnx`` may be); every listed graph is a regular file and
matches its SHA-256 (unless ``hash_files=False``: ``serving.load`` hashes each graph's bytes as
it opens them instead, and the others with :func:`check_file`). Any failure raises
:class:`ArtifactError` (a ``ValueError``) naming the file at fault.

Both halves read artifacts through it: the runtime (:mod:`serving.artifact` adds the graphs'
binding, read when onnxruntime opens them) and :func:`skattn.quantize.quantize_artifact`.
Standard library only.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from skattn.core.checks import check_path
from skattn.core.manifest import (
    ATTENTION_FILE,
    DECODE_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    GRAPH_FILES,
    MANIFEST_FILE,
    ArtifactError,
    Manifest,
    sha256_file,
)

__all__ = ["MAX_MANIFEST_BYTES", "Artifact", "check_digest", "check_file", "read_artifact"]

#: The largest ``manifest.json`` read (its vocabularies: a word-level one of 100,000 tokens
#: takes about 2 MB).
MAX_MANIFEST_BYTES = 64 << 20


@dataclass(frozen=True)
class Artifact:
    """A checked artifact directory.

    Attributes
    ----------
    directory : Path
    manifest : Manifest
    encoder_path, decoder_path : Path
        The graphs, whose bytes matched the manifest's checksums when read (with
        ``read_artifact(hash_files=False)``, whoever reads them checks them).
    decode_path, attention_path : Path or None
        ``decode.onnx``, ``attention.onnx`` when the manifest lists them (checked likewise).
    """

    directory: Path
    manifest: Manifest

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST_FILE

    @property
    def encoder_path(self) -> Path:
        return self.directory / ENCODER_FILE

    @property
    def decoder_path(self) -> Path:
        return self.directory / DECODER_FILE

    @property
    def decode_path(self) -> Path | None:
        """``decode.onnx`` (the whole search in one graph), or None: an artifact without it."""
        return self.directory / DECODE_FILE if DECODE_FILE in self.manifest.files else None

    @property
    def attention_path(self) -> Path | None:
        """``attention.onnx`` (every layer's and head's maps), or None: an artifact without it."""
        return self.directory / ATTENTION_FILE if ATTENTION_FILE in self.manifest.files else None


def read_artifact(path: str | os.PathLike, *, hash_files: bool = True) -> Artifact:
    """Read and check an artifact directory (everything but the graphs' metadata).

    Parameters
    ----------
    path : path
        The directory written by ``Seq2Seq.export_onnx``.
    hash_files : bool, default=True
        Check every listed file's SHA-256. ``serving.load`` passes False: it checks the bytes
        of each graph it opens as it opens them (``serving.sessions.open_graph``), so that a
        file swapped after this check is refused too, and the others with :func:`check_file`;
        hashing them here as well read every graph twice.

    Returns
    -------
    Artifact

    Raises
    ------
    ArtifactError
        The directory or a file is missing, the manifest is malformed, edited or from a newer
        format, or (``hash_files``) a graph's SHA-256 differs from the manifest's; the message
        names the file.
    """
    directory = check_path(path, "path", ArtifactError)
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: not an artifact directory (no such directory)")
    manifest_path = directory / MANIFEST_FILE
    _check_regular(manifest_path, "missing manifest file", "not a regular file")
    try:
        with open(manifest_path, "rb") as file:
            data = file.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise ArtifactError(
                f"{manifest_path}: larger than {MAX_MANIFEST_BYTES >> 20} MiB, more than any "
                "manifest's vocabularies take"
            )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:  # unreadable, not UTF-8
        raise ArtifactError(f"{manifest_path}: cannot be read ({error})") from None
    manifest = Manifest.from_json(text, where=str(manifest_path))
    if not set(GRAPH_FILES) <= set(manifest.files):
        raise ArtifactError(
            f"{manifest_path}: 'files' must list {list(GRAPH_FILES)} (and may list {DECODE_FILE})"
        )
    for name, expected in manifest.files.items():
        file_path = directory / name
        _check_regular(
            file_path,
            f"missing file listed in {MANIFEST_FILE}",
            f"not a regular file (listed in {MANIFEST_FILE})",
        )
        if hash_files:
            check_file(file_path, expected)
    return Artifact(directory=directory, manifest=manifest)


def _check_regular(path: Path, missing: str, irregular: str) -> None:
    """``ArtifactError`` naming ``path`` (``missing``, ``irregular``) unless it is a regular
    file: a FIFO would block a read, a link to /dev/zero never end one. One stat: two calls
    could each see a different file while an export swaps them in."""
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: {missing}") from None
    except OSError as error:  # no permission, a symbolic link loop
        raise ArtifactError(f"{path}: cannot be read ({error})") from None
    if not regular:  # a folder, a FIFO, a device
        raise ArtifactError(f"{path}: {irregular}")


def check_file(path: Path, expected: object) -> None:
    """``ArtifactError`` naming ``path`` unless its SHA-256 is ``expected`` (the manifest's)."""
    try:
        actual = sha256_file(path)
    except OSError as error:  # removed since it was listed: an export swapping it
        raise ArtifactError(f"{path}: cannot be read ({error}); load it again") from None
    check_digest(path, actual, expected)


def check_digest(path: Path, actual: str, expected: object) -> None:
    """``ArtifactError`` naming ``path`` when its SHA-256 ``actual`` is not the manifest's."""
    if actual != expected:
        raise ArtifactError(
            f"{path}: checksum mismatch (sha256 {actual[:12]}..., {MANIFEST_FILE} says "
            f"{str(expected)[:12]}...); the file is corrupt, or was replaced (by an export in "
            "progress: load it again)"
        )
