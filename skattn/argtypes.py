"""``argparse`` types for the command lines of the examples and scripts.

A path or value a long run cannot use is then one line of argparse's usage error (exit 2)
before any data loads, not a traceback after an hour of training: an ``--out`` that is a
folder, an ``--export`` folder that holds other files, a saved model that is not one.

Examples
--------
>>> parser = argparse.ArgumentParser()
>>> _ = parser.add_argument("--out", type=output_file)
>>> _ = parser.add_argument("--export", type=export_directory)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from skattn.core.checks import MAX_THREADS, file_above

__all__ = [
    "artifact_directory",
    "export_directory",
    "input_file",
    "load_saved",
    "output_file",
    "threads",
]


def input_file(text: str) -> Path:
    """An existing file to read (a pipe too: ``/dev/stdin``, a shell's ``<(...)``)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a folder, not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return path


def output_file(text: str) -> Path:
    """A file to write: not a folder, nor inside something that is not one."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it")
    blocked = file_above(path)
    if blocked is not None:
        raise argparse.ArgumentTypeError(f"{text}: {blocked} is a file, not a folder")
    return path


def export_directory(text: str) -> Path:
    """A folder ``export_onnx`` may write an artifact into (new, empty, or an artifact's):
    checked without creating it."""
    from skattn.artifact_writer import check_export_directory  # (train side: onnx)

    try:
        return check_export_directory(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def artifact_directory(text: str) -> Path:
    """An exported artifact whose manifest and checksums hold (``read_artifact``)."""
    from skattn.core.artifact import read_artifact
    from skattn.core.manifest import ArtifactError

    try:
        return read_artifact(text).directory
    except ArtifactError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def threads(text: str) -> int:
    """A thread count in ``[1, MAX_THREADS]``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be in [1, {MAX_THREADS}], got {value}")
    return value


def load_saved(path: Path, flag: str, kind: type | tuple[type, ...]):
    """``joblib.load(path)``, a ``kind`` (``Seq2Seq``, ...), or ``SystemExit`` with one line
    naming ``flag``: a file that is no saved model fails inside pickle or zlib."""
    import joblib

    try:
        model = joblib.load(path)
    except Exception as error:  # zlib.error, pickle.UnpicklingError, EOFError, ...
        message = f"{flag} {path}: not a saved model ({type(error).__name__}: {error})"
        raise SystemExit(message) from None
    if not isinstance(model, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SystemExit(f"{flag} {path}: holds a {type(model).__name__}, not a {names}")
    return model
