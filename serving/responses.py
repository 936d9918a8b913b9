"""The Open Inference Protocol's responses: output tensors, their JSON or binary encoding, and
the ``{"error": message}`` body. (Requests are :mod:`serving.protocol`.)

JSON numbers are encoded a slice at a time (:data:`JSON_CHUNK`), so that a thread encoding a
large response lets the event loop run between slices.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.wire import serialize_bytes_tensor

ATTENTION = "attention"
ATTENTION_LENGTHS = "attention_lengths"
PREDICTION = "prediction"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class OutputTensor:
    """An output tensor ready to encode: BYTES data is a list of str, numeric data an array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: list[str] | np.ndarray


def prediction_tensor(predictions: Sequence[str]) -> OutputTensor:
    """The ``prediction`` output: BYTES ``[N]``."""
    return OutputTensor(PREDICTION, "BYTES", (len(predictions),), list(predictions))


def attention_tensors(attentions: Sequence[np.ndarray]) -> tuple[OutputTensor, OutputTensor]:
    """The ``attention`` and ``attention_lengths`` outputs from N maps of varying shape.

    Parameters
    ----------
    attentions : sequence of ndarray
        One map per item, ``(T_y, T_x)``.

    Returns
    -------
    attention : OutputTensor
        FP32 ``[N, max T_y, max T_x]``; item ``i`` fills ``[i, :T_y, :T_x]``, zeros elsewhere.
    lengths : OutputTensor
        INT32 ``[N, 2]``: ``(T_y, T_x)`` of each map.
    """
    lengths = np.array([a.shape for a in attentions], dtype=np.int32).reshape(-1, 2)  # (N, 2)
    t_y, t_x = lengths.max(axis=0) if len(attentions) else (0, 0)
    padded = np.zeros((len(attentions), t_y, t_x), dtype=np.float32)  # (N, T_y, T_x)
    for i, weights in enumerate(attentions):
        padded[i, : weights.shape[0], : weights.shape[1]] = weights
    return (
        OutputTensor(ATTENTION, "FP32", padded.shape, padded),
        OutputTensor(ATTENTION_LENGTHS, "INT32", lengths.shape, lengths),
    )


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[tuple[OutputTensor, bool]],
) -> tuple[bytes, dict[str, str]]:
    """Encode a v2 inference response.

    Parameters
    ----------
    model_name, model_version : str
        Echoed in the response.
    request_id : str or None
        Echoed as ``id`` when given.
    outputs : sequence of (OutputTensor, bool)
        The tensors in order, each with whether to send it as binary tensor data.

    Returns
    -------
    body : bytes
        JSON, or the JSON header followed by the binary tensors.
    headers : dict
        ``Content-Type``, plus ``Inference-Header-Content-Length`` when binary data follows.
    """
    header: dict = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        header["id"] = request_id
    if not any(binary or _size(tensor) > JSON_CHUNK for tensor, binary in outputs):
        # small and all JSON (the usual answer): one document, one encoder call
        header["outputs"] = [
            {**_entry(tensor), "data": _json_data(tensor)} for tensor, _ in outputs
        ]
        return _json(header), {"Content-Type": "application/json"}
    entries = []
    chunks = []
    for tensor, binary in outputs:
        entry = _entry(tensor)
        if binary:
            raw = _tensor_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
            entries.append(_json(entry))
        else:  # the entry's JSON with its data spliced in: '{..., "data": [...]}'
            entries.append(_json(entry)[:-1] + b',"data":' + _tensor_json(tensor) + b"}")
    header_bytes = b"".join([_json(header)[:-1], b',"outputs":[', b",".join(entries), b"]}"])
    if not chunks:
        return header_bytes, {"Content-Type": "application/json"}
    headers = {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(header_bytes)),
    }
    return b"".join([header_bytes, *chunks]), headers


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # (made once, not per call)


def _json(value: object) -> bytes:
    return _ENCODER.encode(value).encode()


def _entry(tensor: OutputTensor) -> dict:
    """An output's JSON entry without its data, its keys in the protocol's order (both
    encodings splice or add ``data`` after them)."""
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def _size(tensor: OutputTensor) -> int:
    return len(tensor.data) if tensor.datatype == "BYTES" else int(np.size(tensor.data))


def _json_data(tensor: OutputTensor) -> list:
    """A tensor's data as the list its JSON array holds (flattened, row-major)."""
    if tensor.datatype == "BYTES":
        return list(tensor.data)
    return np.asarray(tensor.data).ravel().tolist()


# Numbers are encoded this many at a time: one json.dumps call holds the GIL throughout, and a
# slice of 4,096 floats takes a few milliseconds, so an encoding thread lets the event loop
# answer (health checks, small requests) between slices.
JSON_CHUNK = 4096


def _tensor_bytes(tensor: OutputTensor) -> bytes:
    if tensor.datatype == "BYTES":
        return serialize_bytes_tensor([text.encode("utf-8") for text in tensor.data])
    little_endian = tensor.data.dtype.newbyteorder("<")
    return np.ascontiguousarray(tensor.data, dtype=little_endian).tobytes()


def _tensor_json(tensor: OutputTensor) -> bytes:
    """A tensor's data as a JSON array (flattened, row-major), numbers a slice at a time."""
    if tensor.datatype == "BYTES":
        return _json(_json_data(tensor))
    flat = np.asarray(tensor.data).ravel()
    parts = [
        _json(flat[i : i + JSON_CHUNK].tolist())[1:-1] for i in range(0, flat.size, JSON_CHUNK)
    ]
    return b"[" + b",".join(parts) + b"]"


def error_body(message: str) -> bytes:
    """The v2 protocol's error body, ``{"error": message}``."""
    return json.dumps({"error": message}, ensure_ascii=False).encode()
