"""The Open Inference Protocol (KServe v2) over HTTP: parse requests, encode responses.

Torch-free and HTTP-framework-free: bytes in, bytes out, so that it can be tested on its own.
A model served by skattn has one input and up to three outputs::

    input   source             BYTES  [N]                 UTF-8 source texts
    output  prediction         BYTES  [N]                 UTF-8 predicted texts
    output  attention          FP32   [N, max T_y, max T_x]  zero-padded attention maps
    output  attention_lengths  INT32  [N, 2]              (T_y, T_x) of each map

Request ``parameters``: ``temperature`` (a positive number: the attention softmax temperature),
``attention_layer`` and ``attention_head`` (integers: which decoder layer's and head's
cross-attention the ``attention`` output holds, for models that have them; by default the last
layer, averaged over heads), and ``binary_data_output``.

Tensors travel either as JSON (``"data": [...]``, row-major and flattened) or with the binary
tensor data extension: the body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw tensors in the order of the header. A BYTES tensor in binary form is a run of
elements, each a 4-byte little-endian length followed by that many bytes; numeric tensors are
their little-endian row-major bytes. ``tritonclient.http`` uses the binary form by default.
Those bytes (and a body's ``Content-Encoding``) are :mod:`serving.wire`'s; responses are
:mod:`serving.responses`'s; both modules' names stay importable from here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from serving.responses import (  # the responses' half
    ATTENTION,
    ATTENTION_LENGTHS,
    HEADER_LENGTH,
    JSON_CHUNK,
    PREDICTION,
    OutputTensor,
    attention_tensors,
    encode_infer_response,
    error_body,
    prediction_tensor,
    serialize_bytes_tensor,
)
from serving.wire import (  # the bytes below the JSON
    MAX_GZIP_MEMBERS,
    ProtocolError,
    decode_content,
    deserialize_bytes_tensor,
)
from skattn.core.checks import FLOAT32_MAX
from skattn.core.items import encodes_to_utf8

INPUT_NAME = "source"
#: Request parameters that select the attention maps' layer and head.
ATTENTION_PARAMETERS = ("attention_layer", "attention_head")
OUTPUT_NAMES = (PREDICTION, ATTENTION, ATTENTION_LENGTHS)


@dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for, and whether it wants it as binary tensor data."""

    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """A parsed and validated inference request.

    Attributes
    ----------
    id : str or None
        The request id, echoed in the response.
    sources : list of str
        The N source texts, in order.
    outputs : tuple of RequestedOutput
        The outputs to return, in the order to return them.
    temperature : float or None
        The attention softmax temperature for this request; None means the model's own.
    attention_layer, attention_head : int or None
        Which layer's and head's maps the attention output holds (checked against the model
        by the server); None: the last layer, the mean over heads.
    """

    id: str | None
    sources: list[str]
    outputs: tuple[RequestedOutput, ...]
    temperature: float | None
    attention_layer: int | None = None
    attention_head: int | None = None

    @property
    def wants_attention(self) -> bool:
        """Whether any attention output was requested."""
        return any(out.name != PREDICTION for out in self.outputs)


# ---------------------------------------------------------------------------------------------
# Requests


def parse_infer_request(body: bytes, header_length: str | None, *, max_items: int) -> InferRequest:
    """Parse and validate a v2 inference request for a skattn model.

    Parameters
    ----------
    body : bytes
        The (decoded) request body.
    header_length : str or None
        The ``Inference-Header-Content-Length`` header: the size of the JSON header when binary
        tensor data follows it, None when the whole body is JSON.
    max_items : int
        The most source texts one request may carry.

    Returns
    -------
    InferRequest

    Raises
    ------
    ProtocolError
        400 for malformed JSON, a missing or unknown input, a wrong datatype or shape, bad
        binary data or an unknown output; 413 for more than ``max_items`` sources.
    """
    header, binary = _split_body(body, header_length)
    if not isinstance(header, dict):
        raise ProtocolError("request body must be a JSON object")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError("'id' must be a string")
    if request_id is not None and not encodes_to_utf8(request_id):
        raise ProtocolError("'id' must be valid Unicode (it holds a lone surrogate)")
    parameters = _object(header.get("parameters"), "parameters")
    tensor = _source_tensor(header.get("inputs"))
    sources = _source_texts(tensor, binary, max_items)
    outputs = _requested_outputs(header.get("outputs"), parameters)
    temperature = _temperature(parameters.get("temperature"))
    layer, head = (_integer(parameters.get(name), name) for name in ATTENTION_PARAMETERS)
    return InferRequest(request_id, sources, outputs, temperature, layer, head)


def over_limit(declared: str, limit: int) -> str | None:
    """The length a header declares (``Content-Length``, ``Inference-Header-Content-Length``),
    without leading zeros, when it is ASCII decimal digits beyond ``limit``; else None. Compared
    by its digits first: ``int()`` refuses more than 4,300 of them."""
    digits = declared.lstrip("0") or "0"
    if not (digits.isascii() and digits.isdigit()):
        return None
    over = len(digits) > len(str(limit)) or int(digits) > limit
    return digits if over else None


def shown_number(digits: str) -> str:
    """A decimal number for an error message: in full up to 20 digits, else its first ten and
    its length (a header may carry thousands)."""
    return digits if len(digits) <= 20 else f"{digits[:10]}... ({len(digits)} digits)"


def _split_body(body: bytes, header_length: str | None) -> tuple[object, bytes]:
    """Split the body into the parsed JSON header and the binary tensor data after it."""
    if header_length is None:
        size = len(body)
    else:  # ASCII digits only: int() also reads "1_0", "+10" and other scripts' digits
        if not (header_length.isascii() and header_length.isdigit()):
            raise ProtocolError(
                f"{HEADER_LENGTH} must be a decimal integer, got {header_length!r}"[:300]
            )
        beyond = over_limit(header_length, len(body))
        if beyond is not None:
            raise ProtocolError(
                f"{HEADER_LENGTH} is {shown_number(beyond)} but the body has {len(body)} bytes"
            )
        size = int(header_length.lstrip("0") or "0")  # int() refuses over 4,300 digits
    try:
        header = json.loads(body[:size])
    except RecursionError as exc:
        raise ProtocolError("invalid JSON in request: nested too deeply") from exc
    except ValueError as exc:  # bad UTF-8, bad JSON, an integer too long to convert
        raise ProtocolError(f"invalid JSON in request: {exc}") from exc
    return header, body[size:]


def _object(value: object, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"'{name}' must be a JSON object")
    return value


def _source_tensor(inputs: object) -> dict:
    """The one input tensor, ``source``, from the request's ``inputs``."""
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise ProtocolError("'inputs' must be a list of tensor objects")
    names = [t.get("name") for t in inputs]
    unknown = [n for n in names if n != INPUT_NAME]
    if unknown:
        raise ProtocolError(
            f"unknown input {unknown[0]!r}; the model takes one input {INPUT_NAME!r}"
        )
    if not names:
        raise ProtocolError(f"missing input {INPUT_NAME!r}")
    if len(names) > 1:
        raise ProtocolError(f"input {INPUT_NAME!r} given more than once")
    tensor = inputs[0]
    if tensor.get("datatype") != "BYTES":
        raise ProtocolError(
            f"input {INPUT_NAME!r} has datatype {tensor.get('datatype')!r}; expected 'BYTES'"
        )
    return tensor


def _source_texts(tensor: dict, binary: bytes, max_items: int) -> list[str]:
    """Decode the ``source`` tensor into N strings, from JSON data or binary data."""
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 1
        or not isinstance(shape[0], int)
        or isinstance(shape[0], bool)
        or shape[0] < 0
    ):
        raise ProtocolError(
            f"input {INPUT_NAME!r} has shape {shape!r}; expected [N], one dimension"
        )
    (n_items,) = shape
    if n_items > max_items:
        raise ProtocolError(
            f"input {INPUT_NAME!r} has {n_items} items; at most {max_items} per request", 413
        )
    parameters = _object(tensor.get("parameters"), f"inputs[{INPUT_NAME}].parameters")
    if any(key.startswith("shared_memory") for key in parameters):
        raise ProtocolError("shared-memory tensors are not supported")
    binary_size = parameters.get("binary_data_size")
    if binary_size is not None:
        if "data" in tensor:
            raise ProtocolError(f"input {INPUT_NAME!r} has both 'data' and binary_data_size")
        if not isinstance(binary_size, int) or isinstance(binary_size, bool) or binary_size < 0:
            raise ProtocolError("binary_data_size must be a non-negative integer")
        if binary_size != len(binary):
            raise ProtocolError(
                f"binary_data_size is {binary_size} but {len(binary)} bytes follow the header"
            )
        elements = deserialize_bytes_tensor(binary, n_items)
    else:
        if binary:
            raise ProtocolError("binary data follows the header but no input declares it")
        if "data" not in tensor:
            raise ProtocolError(f"input {INPUT_NAME!r} has no 'data'")
        elements = _flatten(tensor["data"])
    if len(elements) != n_items:
        raise ProtocolError(
            f"shape mismatch: input {INPUT_NAME!r} has shape [{n_items}] "
            f"but carries {len(elements)} elements"
        )
    return [_text(element, i) for i, element in enumerate(elements)]


def _flatten(data: object) -> list:
    """The leaves of nested lists in row-major order (iteratively: any depth is safe)."""
    flat, stack = [], [iter([data])]
    while stack:
        value = next(stack[-1], _END)
        if value is _END:
            stack.pop()
        elif isinstance(value, list):
            stack.append(iter(value))
        else:
            flat.append(value)
    return flat


_END = object()


def _text(element: object, index: int) -> str:
    """A source element as text. One rule for every text of a request (sources and ``id``):
    valid Unicode only, so a lone surrogate (a JSON ``\\ud800`` escape, or CESU-8 bytes,
    which ``json.loads`` decodes as surrogates) gets 400 as invalid UTF-8 binary data does."""
    if isinstance(element, str):
        if not encodes_to_utf8(element):
            raise ProtocolError(
                f"input {INPUT_NAME!r} item {index} is not valid Unicode (a lone surrogate)"
            )
        return element
    if isinstance(element, bytes):
        try:
            return element.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"input {INPUT_NAME!r} item {index} is not valid UTF-8") from exc
    raise ProtocolError(
        f"input {INPUT_NAME!r} item {index} is {type(element).__name__}; BYTES data must be strings"
    )


def _requested_outputs(outputs: object, parameters: dict) -> tuple[RequestedOutput, ...]:
    """The outputs to return: the ones named, or ``prediction`` alone when none is named
    (``outputs`` absent or ``[]``, as KServe and Triton read an empty list)."""
    default_binary = parameters.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise ProtocolError("parameters.binary_data_output must be a boolean")
    if outputs is None or outputs == []:
        return (RequestedOutput(PREDICTION, default_binary),)
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise ProtocolError("'outputs' must be a list of objects")
    requested = []
    for output in outputs:
        name = output.get("name")
        if name not in OUTPUT_NAMES:
            raise ProtocolError(
                f"unknown output {name!r}; the model has outputs {', '.join(OUTPUT_NAMES)}"
            )
        if any(r.name == name for r in requested):
            raise ProtocolError(f"output {name!r} requested more than once")
        params = _object(output.get("parameters"), f"outputs[{name}].parameters")
        if any(key.startswith("shared_memory") for key in params):
            raise ProtocolError("shared-memory tensors are not supported")
        if "classification" in params:
            raise ProtocolError("the classification extension is not supported")
        binary = params.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise ProtocolError(f"outputs[{name}].parameters.binary_data must be a boolean")
        requested.append(RequestedOutput(name, binary))
    return tuple(requested)


def _integer(value: object, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ProtocolError(f"parameters.{name} must be an integer, got {value!r:.40}")
    return value


def _temperature(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("parameters.temperature must be a number")
    try:
        temperature = float(value)
    except OverflowError:  # an integer of hundreds of digits
        temperature = math.inf
    if not math.isfinite(temperature) or temperature <= 0 or temperature > FLOAT32_MAX:
        if isinstance(value, float):  # every digit: 3.4028235e+38 is above the maximum
            shown = repr(value)
        else:  # a huge int is not printed: its digits could fill the response
            shown = "a larger integer" if temperature > FLOAT32_MAX else str(value)
        raise ProtocolError(
            "parameters.temperature must be positive and finite in float32 (at most "
            f"{FLOAT32_MAX!r}), got {shown}"
        )
    return temperature


__all__ = [
    "ATTENTION",
    "ATTENTION_LENGTHS",
    "ATTENTION_PARAMETERS",
    "HEADER_LENGTH",
    "INPUT_NAME",
    "JSON_CHUNK",
    "MAX_GZIP_MEMBERS",
    "OUTPUT_NAMES",
    "PREDICTION",
    "InferRequest",
    "OutputTensor",
    "ProtocolError",
    "RequestedOutput",
    "attention_tensors",
    "decode_content",
    "deserialize_bytes_tensor",
    "encode_infer_response",
    "error_body",
    "over_limit",
    "parse_infer_request",
    "prediction_tensor",
    "serialize_bytes_tensor",
    "shown_number",
]
