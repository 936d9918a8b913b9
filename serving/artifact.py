"""Reading an artifact directory: its manifest, its checksums, and the graphs' binding to both.

The layout and the manifest's fields are :mod:`skattn.core.manifest`'s (the contract the
exporter writes). Loading checks, in order: the directory exists; ``manifest.json`` reads as
UTF-8, parses and validates (:meth:`Manifest.from_json`: keys, types, bounds, format version,
the manifest's own binding digest); both step graphs are listed (``decode.onnx`` and
``attention.onnx`` may be); every listed graph exists and matches its SHA-256; (format 2)
each graph's metadata names the same binding as the manifest, so a graph exported for another
vocabulary or model (or, since manifests carry ``export_id``, other weights) is refused even
when the checksums were updated; and ``decode.onnx`` runs the manifest's search. Any failure raises
:class:`ArtifactError` (a ``ValueError``) naming the file at fault.

The directory, manifest and checksum checks are :mod:`skattn.core.artifact`'s
(:func:`read_artifact`, re-exported here), which the exporter side shares; this module adds
:func:`check_binding`. Torch-free: JSON, bytes and the ``onnx`` protobuf reader is not needed
either (the graphs' metadata is read by onnxruntime when the runtime opens them).
"""

from __future__ import annotations

import json
from pathlib import Path

from skattn.core.artifact import Artifact, read_artifact
from skattn.core.manifest import (
    BINDING_KEY,
    MANIFEST_FILE,
    SEARCH_KEY,
    TEXT_KEY,
    ArtifactError,
    Manifest,
)

__all__ = ["Artifact", "ArtifactError", "check_binding", "check_search", "read_artifact"]


def check_binding(path: Path, metadata: dict[str, str], manifest: Manifest) -> None:
    """Raise ``ArtifactError`` naming ``path`` unless its graph was exported with ``manifest``.

    ``metadata`` is the graph's ``metadata_props`` (onnxruntime's
    ``session.get_modelmeta().custom_metadata_map``). Format 1 artifacts carry no binding: a
    graph that carries one beside a format-1 manifest is refused (the manifest's
    ``format_version`` was lowered, which would have skipped the check).
    """
    bound = metadata.get(BINDING_KEY)
    if manifest.format_version < 2:
        if bound is not None:
            raise ArtifactError(
                f"{path}: this graph carries a binding, which {MANIFEST_FILE}'s format_version "
                f"{manifest.format_version} predates: the manifest was edited; re-export the "
                "model"
            )
        return
    if bound != manifest.binding:
        raise ArtifactError(
            f"{path}: this graph was exported for other vocabularies or another model than "
            f"{MANIFEST_FILE} describes (binding {str(bound)[:12]}..., manifest "
            f"{manifest.binding[:12]}...); re-export the model"
        )
    said = metadata.get(TEXT_KEY)  # (graphs written before the key are not checked)
    if said is not None and _json(said) != manifest.text_form():
        raise ArtifactError(
            f"{path}: this graph reads and writes text as {said}, but {MANIFEST_FILE} says "
            f"{json.dumps(manifest.text_form())}: the manifest was edited; re-export the model"
        )


def _json(text: str) -> object:
    """``text`` parsed as JSON, or itself where it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_search(path: Path, metadata: dict[str, str], manifest: Manifest) -> None:
    """Raise ``ArtifactError`` naming ``path`` unless ``decode.onnx`` runs the manifest's search.

    The graph's search (beam size, length penalty) is built in and stored in its metadata
    (``SEARCH_KEY``); a manifest edited to another search would make the step graphs and this
    graph answer differently. Graphs written before the key are not checked.
    """
    said = metadata.get(SEARCH_KEY)
    if said is None:
        return
    if _json(said) != manifest.search():
        raise ArtifactError(
            f"{path}: this graph searches with {said}, but {MANIFEST_FILE} says "
            f"{json.dumps(manifest.search())}; re-export the model with that search, or load "
            "it with decode_graph=False to search as the manifest says"
        )
