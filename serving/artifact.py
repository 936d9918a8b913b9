"""Reading an artifact directory: its manifest, its checksums, and the graphs' binding to both.

The layout and the manifest's fields are :mod:`skattn.core.manifest`'s (the contract the
exporter writes). Loading checks, in order: the directory exists; ``manifest.json`` reads as
UTF-8, parses and validates (:meth:`Manifest.from_json`: keys, types, bounds, format version,
the manifest's own binding digest); both step graphs are listed (``decode.onnx`` and
``attention.onnx`` may be); every listed graph exists and matches its SHA-256; and (format 2)
each graph's metadata names the same binding as the manifest, so a graph exported for another
vocabulary or model is refused even when the checksums were updated. Any failure raises
:class:`ArtifactError` (a ``ValueError``) naming the file at fault.

The directory, manifest and checksum checks are :mod:`skattn.core.artifact`'s
(:func:`read_artifact`, re-exported here), which the exporter side shares; this module adds
:func:`check_binding`. Torch-free: JSON, bytes and the ``onnx`` protobuf reader is not needed
either (the graphs' metadata is read by onnxruntime when the runtime opens them).
"""

from __future__ import annotations

from pathlib import Path

from skattn.core.artifact import Artifact, read_artifact
from skattn.core.manifest import BINDING_KEY, MANIFEST_FILE, ArtifactError, Manifest

__all__ = ["Artifact", "ArtifactError", "check_binding", "read_artifact"]


def check_binding(path: Path, metadata: dict[str, str], manifest: Manifest) -> None:
    """Raise ``ArtifactError`` naming ``path`` unless its graph was exported with ``manifest``.

    ``metadata`` is the graph's ``metadata_props`` (onnxruntime's
    ``session.get_modelmeta().custom_metadata_map``). Format 1 artifacts carry no binding.
    """
    if manifest.format_version < 2:
        return
    bound = metadata.get(BINDING_KEY)
    if bound != manifest.binding:
        raise ArtifactError(
            f"{path}: this graph was exported for other vocabularies or another model than "
            f"{MANIFEST_FILE} describes (binding {str(bound)[:12]}..., manifest "
            f"{manifest.binding[:12]}...); re-export the model"
        )
