"""Ways a test damages an artifact on purpose, written once for the tests that need them."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from skattn.core.manifest import sha256_file


def weights_to_an_external_file(directory: Path, graph: str = "encoder.onnx") -> None:
    """Move ``graph``'s largest weight into ``weights.bin`` beside it (ONNX external data) and
    write the graph's new checksum into the manifest, as a tool that rewrote it would."""
    model = onnx.load(directory / graph)
    weight = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    values = onnx.numpy_helper.to_array(weight)
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", values.nbytes)):
        entry = weight.external_data.add()
        entry.key, entry.value = key, str(value)
    onnx.save(model, directory / graph)
    (directory / "weights.bin").write_bytes(values.tobytes())
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][graph] = sha256_file(directory / graph)
    (directory / "manifest.json").write_text(json.dumps(manifest))
