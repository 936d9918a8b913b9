"""Writing an artifact directory as one transaction (:func:`skattn.export.export_module`'s last
step).

The graphs and the manifest go into a staging folder inside the artifact's (its name starts with
:data:`~skattn.core.manifest.STAGING_PREFIX`), then replace the previous artifact's files under a
``flock`` on the folder: an export that fails, is interrupted or is killed leaves the previous
artifact whole (or the next export restores it), and concurrent exports to one path leave the
last one whole. Readers (:func:`skattn.core.artifact.read_artifact`) need no lock: they find the
manifest or none.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from skattn.core.checks import check_path, file_above
from skattn.core.manifest import (
    ATTENTION_FILE,
    DECODE_FILE,
    GRAPH_FILES,
    MANIFEST_FILE,
    STAGING_PREFIX,
    Manifest,
)

__all__ = ["check_export_directory", "prepare_directory", "write_artifact"]

logger = logging.getLogger(__name__)

#: ``flock`` errors of file systems that have no such locks (NFS, Lustre, some FUSE mounts).
_NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP)


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on the folder ``path`` while in the block; yields whether it was
    taken (``blocking=False``: not when another process holds it). Where there is no ``flock``
    (not POSIX, or a file system without it) nothing is locked, and concurrent exports to one
    path are the caller's to avoid."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            logger.warning("no flock on %s (%s): exporting without a lock", path, error)
        yield True
    finally:
        os.close(fd)  # releases the lock


#: Every file an artifact may hold, its manifest last: the order a swap moves them out.
_ARTIFACT_FILES = (*GRAPH_FILES, DECODE_FILE, ATTENTION_FILE, MANIFEST_FILE)


def write_artifact(directory: Path, graphs: list, manifest: Manifest) -> None:
    """Write the graphs and the manifest (its checksums those of the bytes written) into a
    staging folder, then swap them in: an export that fails or is interrupted (an error, a
    full disk, Ctrl-C), before or during the swap, leaves the previous artifact there as it
    was, and concurrent exports to one path leave the last one whole. During the swap a
    reader finds no manifest (no artifact), never a manifest beside another export's graphs.
    An export killed during its swap (SIGKILL, the OOM killer) leaves the previous files in
    its staging folder: the next export to the path puts them back first."""
    with contextlib.ExitStack() as stack:
        with _locked(directory):  # no other export removes it before it is locked
            _recover_stale_staging(directory)
            staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
            stack.enter_context(_locked(staging))  # while it stands, it is not stale
        stack.callback(_discard_staging, directory, staging)  # before its lock goes
        for graph, name in graphs:
            onnx.save_model(graph, staging / name)
        manifest = manifest.with_files(staging)
        (staging / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
        with _locked(directory):
            _swap(directory, staging, [*(name for _, name in graphs), MANIFEST_FILE])


def _swap(directory: Path, staging: Path, names: list[str]) -> None:
    """Move the previous artifact's files into ``staging/previous`` (its manifest first), then
    ``names`` in from ``staging``; on any exception, the previous files go back."""
    previous = staging / "previous"
    previous.mkdir()
    try:
        for name in reversed(_ARTIFACT_FILES):  # the manifest first out
            if (directory / name).exists():
                os.replace(directory / name, previous / name)
        for name in names:
            os.replace(staging / name, directory / name)
    except BaseException:
        _restore(directory, previous)  # (what it cannot restore, the next export will)
        raise


def _restore(directory: Path, previous: Path) -> None:
    """Put the previous artifact back from ``previous`` (a swap cut short): the new files out,
    the previous ones in, the manifest last; each file as far as it goes."""
    if not (previous / MANIFEST_FILE).exists():
        return  # nothing moved out yet (or no previous artifact)
    try:  # the previous artifact's own files: the others in the folder are the new export's
        listed = set(json.loads((previous / MANIFEST_FILE).read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        listed = set(_ARTIFACT_FILES)  # unreadable: remove none
    for name in _ARTIFACT_FILES:
        with contextlib.suppress(OSError):
            if (previous / name).exists():
                os.replace(previous / name, directory / name)
            elif name not in listed and name != MANIFEST_FILE:
                (directory / name).unlink(missing_ok=True)


def _discard_staging(directory: Path, staging: Path) -> None:
    """Remove the staging folder, unless it holds a previous artifact that could not be put
    back (the target has no manifest): the next export restores it from there."""
    if (staging / "previous" / MANIFEST_FILE).exists() and not (directory / MANIFEST_FILE).exists():
        logger.warning("the previous artifact is in %s: the next export restores it", staging)
        return
    shutil.rmtree(staging, ignore_errors=True)


def _recover_stale_staging(directory: Path) -> None:
    """The staging folders in ``directory`` that no export holds (a killed one's): put back
    the previous artifact a swap cut short left in one (when the target has no manifest), then
    remove them. Another user's folder (not ours to open) is left alone."""
    for path in directory.iterdir():
        if not (path.name.startswith(STAGING_PREFIX) and path.is_dir()):
            continue
        try:
            with _locked(path, blocking=False) as free:
                if not free:
                    continue  # a live export's
                if not (directory / MANIFEST_FILE).exists():
                    _restore(directory, path / "previous")
                shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue


def prepare_directory(path: str | os.PathLike) -> Path:
    """``path`` as a directory to export into (:func:`check_export_directory`), created if
    needed."""
    directory = check_export_directory(path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def check_export_directory(path: str | os.PathLike) -> Path:
    """``path`` as a directory an export may write into, without creating it: ``ValueError``
    where it is a file, lies inside one, or holds files that are not an artifact's (another
    export's staging folder may be there)."""
    directory = check_path(path, "path")
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path must be a directory, got an existing file: {directory}")
    blocked = file_above(directory)
    if blocked is not None:
        raise ValueError(f"path {directory} lies inside a file: {blocked}")
    if not directory.is_dir():
        return directory
    others = sorted(
        p.name
        for p in directory.iterdir()
        if p.name not in _ARTIFACT_FILES and not p.name.startswith(STAGING_PREFIX)
    )  # (a staging folder: another export's)
    if others:
        raise ValueError(
            f"path {directory} holds files that are not part of an artifact ({others[:3]}); "
            "export into an empty or new directory"
        )
    return directory
