"""The inference route, ``POST /v2/models/{model}[/versions/1]/infer``, in plain ASGI.

Routing, request and response objects of the framework cost more than the rest of a small
request, so :class:`InferRoute`, a middleware in front of FastAPI, answers inference requests
from :class:`InferHandler` and passes everything else on. The handler reads the body, has it
parsed and validated in full (every source checked by the model's runtime) before its items join
the batcher's queue, waits for the results (withdrawing its items if the client leaves) and
encodes the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from serving import protocol
from serving.batcher import Batcher, BatcherClosedError, BatchError, ItemResult, QueueFullError
from serving.interface import ModelInfo, Runtime
from serving.metrics import ModelMetrics, ServerMetrics
from serving.settings import ServerSettings
from serving.signals import SIGNALS, RequestSignals
from skattn.core.inference import as_text
from skattn.core.text import tokenize

logger = logging.getLogger("serving.app")

MODEL_VERSION = "1"

__all__ = ["MODEL_VERSION", "ApiError", "InferHandler", "InferRoute", "ServedModel"]


@dataclass
class ServedModel:
    """A served model: its name, runtime, the runtime's info, its batcher and its metrics."""

    name: str
    runtime: Runtime
    info: ModelInfo
    batcher: Batcher
    metrics: ModelMetrics


class ApiError(Exception):
    """A request the server refuses: ``status``, a message and extra response headers."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


class _ClientGoneError(Exception):
    """The client closed the connection before its answer was ready."""


def lookup(models: Mapping[str, ServedModel], name: str, version: str | None) -> ServedModel:
    """The served model ``name`` (at ``version``, if given), else ``ApiError`` 404."""
    model = models.get(name)
    if model is None:
        raise ApiError(404, f"unknown model {name!r}; this server has {sorted(models)}")
    if version is not None and version != MODEL_VERSION:
        raise ApiError(404, f"model {name!r} has no version {version!r}")
    return model


_OUTCOME_BY_STATUS = {
    408: "timeout",
    413: "too_large",
    404: "not_found",
    503: "unavailable",
}

# One log line per inference request: answered ones at DEBUG (at hundreds of requests a second,
# the metrics say more than the lines), refused ones at INFO, failed ones at WARNING.
_LOG_LEVEL_BY_OUTCOME = {
    "ok": logging.DEBUG,
    "disconnected": logging.INFO,
    "queue_full": logging.WARNING,
    "unavailable": logging.WARNING,
    "error": logging.WARNING,
}

Answer = tuple[int, dict[str, str], bytes]


# Responses of more output elements than this are encoded in the ``encoder`` threads: below it
# (a request without attention, or with a few short maps) the thread hop costs more than the
# encoding, which then takes well under a millisecond.
INLINE_ENCODE_ELEMENTS = 16384


class InferHandler:
    """Answer one inference request: ``await handler(scope, receive, name, version)``.

    Returns ``(status, headers, body)``, or None when the client has gone (nobody reads an
    answer). Every error is ``{"error": message}``.

    Parameters
    ----------
    models : mapping of str to ServedModel
    settings : ServerSettings
    metrics : ServerMetrics
    encoder : Executor, optional
        Where large responses are encoded, off the event loop (JSON encoding slices its work,
        so the loop keeps answering meanwhile); without one they are encoded inline.
    """

    def __init__(
        self,
        models: Mapping[str, ServedModel],
        settings: ServerSettings,
        metrics: ServerMetrics,
        encoder: Executor | None = None,
    ) -> None:
        self.models = models
        self.settings = settings
        self.metrics = metrics
        self.encoder = encoder

    async def __call__(
        self, scope: Scope, receive: Receive, name: str, version: str | None
    ) -> Answer | None:
        started = time.monotonic()
        outcome, items, request_id = "ok", 0, None
        settings = self.settings
        try:
            model = lookup(self.models, name, version)
        except ApiError as exc:
            if name in self.models:  # a version this model does not have
                self.models[name].metrics.request("not_found", time.monotonic() - started)
            else:
                self.metrics.unknown_model()
            return exc.status, {}, protocol.error_body(exc.message)
        try:
            headers = request_headers(scope)
            with model.batcher.receiving():  # an eager batcher waits for these items
                signals = scope.get(SIGNALS)
                body = await _read_body(
                    receive, headers, settings.max_body_bytes, settings.body_timeout_s, signals
                )
                parsed = _parse(headers, body, model, settings)
                items, request_id = len(parsed.sources), parsed.id
                futures = model.batcher.submit(
                    parsed.sources,
                    temperature=parsed.temperature,
                    with_attention=parsed.wants_attention,
                    layer=parsed.attention_layer,
                    head=parsed.attention_head,
                )
            results = await _until_disconnect(model.batcher, futures, receive, signals)
            # (within the bound _parse checked, unless the runtime broke its own limit)
            rows, columns = map_extent(results)
            elements = _check_output_size(parsed, rows, columns, settings, "would hold")
            if elements > INLINE_ENCODE_ELEMENTS and self.encoder is not None:
                loop = asyncio.get_running_loop()
                body, response_headers = await loop.run_in_executor(
                    self.encoder, _encode, model.name, parsed, results
                )
            else:
                body, response_headers = _encode(model.name, parsed, results)
            return 200, response_headers, body
        except ApiError as exc:
            outcome = _OUTCOME_BY_STATUS.get(exc.status, "bad_request")
            return exc.status, exc.headers, protocol.error_body(exc.message)
        except QueueFullError as exc:
            outcome = "queue_full"
            retry = {"Retry-After": str(settings.retry_after_s)}
            return 503, retry, protocol.error_body(f"queue full: {exc}")
        except BatcherClosedError as exc:
            outcome = "unavailable"
            retry = {"Retry-After": str(settings.retry_after_s)}
            return 503, retry, protocol.error_body(str(exc))
        except BatchError as exc:
            outcome = "error"
            return 500, {}, protocol.error_body(str(exc))
        except _ClientGoneError:
            outcome = "disconnected"
            return None
        except asyncio.CancelledError:  # the server's shutdown ran out: InferRoute answers 503
            outcome = "unavailable"
            raise
        except Exception as exc:  # a bug: answer this request, keep serving the others
            outcome = "error"
            logger.exception("infer failed", extra={"model": name})
            return 500, {}, protocol.error_body(f"internal error: {type(exc).__name__}")
        finally:
            elapsed = time.monotonic() - started
            model.metrics.request(outcome, elapsed)
            level = _LOG_LEVEL_BY_OUTCOME.get(outcome, logging.INFO)
            if logger.isEnabledFor(level):
                logger.log(
                    level,
                    "infer",
                    extra={
                        "model": name,
                        "items": items,
                        "outcome": outcome,
                        "request_id": request_id,
                        "duration_ms": round(elapsed * 1000, 3),
                    },
                )


class InferRoute:
    """ASGI middleware: inference requests go straight to ``handler``, the rest to the app.

    ``POST /v2/models/{name}[/versions/{version}]/infer`` is answered from ``handler``'s
    ``(status, headers, body)``; another method on that path gets 405.
    """

    def __init__(self, app: ASGIApp, handler: InferHandler) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            match = _INFER_PATH.fullmatch(path)
        if match is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            answer = 405, {"Allow": "POST"}, protocol.error_body("Method Not Allowed")
        else:
            try:
                answer = await self.handler(scope, receive, match["name"], match["version"])
            except asyncio.CancelledError:
                # uvicorn cancels the requests still running when its graceful shutdown runs
                # out (--shutdown-timeout): answer them 503, not uvicorn's plain-text 500, and
                # let the task end; the items were withdrawn on the way out of the handler
                retry = {"Retry-After": str(self.handler.settings.retry_after_s)}
                answer = 503, retry, protocol.error_body("the server is shutting down")
                with contextlib.suppress(Exception):  # the connection may be gone already
                    await send_answer(send, *answer)
                return
        if answer is None:
            return  # the client has gone
        await send_answer(send, *answer)


async def send_answer(send: Send, status: int, headers: Mapping[str, str], body: bytes) -> None:
    """Send a whole response (JSON unless ``headers`` name another Content-Type)."""
    raw_headers = [(b"content-length", str(len(body)).encode())]
    if not any(key.lower() == "content-type" for key in headers):
        raw_headers.append((b"content-type", b"application/json"))
    raw_headers += [(key.lower().encode(), value.encode()) for key, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


#: Where :func:`request_headers` keeps a request's decoded headers in its ASGI scope, as
#: ``(the raw header list, the decoded dict)``.
HEADERS = "skattn.headers"


def request_headers(scope: Scope) -> dict[str, str]:
    """The request headers as the server passed them (ASGI lower-cases the names; a repeated
    header's values joined by ", ", as RFC 9110 combines a field's lines: two Content-Encoding
    lines read as the one line of both, and a second Host makes a host no check admits),
    decoded once per request: the guard and the handler both read them. The decoding is kept
    in the scope beside the raw list it came from, so a layer that hands on a scope with other
    headers (``{**scope, "headers": ...}``) gets them decoded afresh, not the copied decoding of
    the old ones."""
    raw = scope["headers"]
    cached = scope.get(HEADERS)
    if cached is not None and cached[0] is raw:
        return cached[1]
    headers: dict[str, str] = {}
    for key, value in raw:
        name, text = key.decode("latin-1"), value.decode("latin-1")
        headers[name] = f"{headers[name]}, {text}" if name in headers else text
    scope[HEADERS] = (raw, headers)
    return headers


def _parse(
    headers: Mapping[str, str], body: bytes, model: ServedModel, settings: ServerSettings
) -> protocol.InferRequest:
    """Decode and validate one inference request (every source checked by the runtime)."""
    try:
        body = protocol.decode_content(
            body, headers.get("content-encoding"), settings.max_body_bytes
        )
        parsed = protocol.parse_infer_request(
            body,
            headers.get(protocol.HEADER_LENGTH.lower()),
            max_items=settings.max_items_per_request,
        )
    except protocol.ProtocolError as exc:
        raise ApiError(exc.status, exc.message) from exc
    names = tuple(f"parameters.{name}" for name in protocol.ATTENTION_PARAMETERS)
    try:  # a layer or head this model has (ModelInfo.attention_layers, attention_heads)
        model.info.map_selection(
            parsed.attention_layer, parsed.attention_head, names=names, allow_all=False
        )
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc
    for i, source in enumerate(parsed.sources):
        try:
            model.runtime.check_source(source)
        except ValueError as exc:
            raise ApiError(400, f"input 'source' item {i}: {exc}") from exc
    if parsed.wants_attention:  # refused before decoding, not once its maps fill the memory
        info = model.info
        columns = max((len(tokenize(s, info.tokenizer)) + 1 for s in parsed.sources), default=0)
        _check_output_size(parsed, info.max_output_length, columns, settings, "could hold up to")
        computed = len(parsed.sources) * info.max_output_length * columns
        if computed > settings.max_output_elements:  # attention_lengths alone: maps all the same
            raise ApiError(
                413,
                f"the attention maps its attention_lengths are read from could hold up to "
                f"{computed} elements ({info.max_output_length} x {columns}), more than "
                f"max_output_elements={settings.max_output_elements} (--max-output-elements); "
                "ask for fewer or shorter sources",
            )
    return parsed


def _check_output_size(
    request: protocol.InferRequest, rows: int, columns: int, settings: ServerSettings, verb: str
) -> int:
    """The response's output elements, its maps ``rows x columns`` (:func:`output_elements`);
    ``ApiError`` 413 when they exceed ``max_output_elements``."""
    elements = output_elements(request, rows, columns)
    if elements > settings.max_output_elements:
        shape = f" (attention maps of {rows} x {columns})" if request.wants_attention else ""
        raise ApiError(
            413,
            f"the response {verb} {elements} output elements{shape}, more than "
            f"max_output_elements={settings.max_output_elements} (--max-output-elements); "
            "ask for fewer or shorter sources, or without attention",
        )
    return elements


async def _read_body(
    receive: Receive,
    headers: Mapping[str, str],
    limit: int,
    timeout: float,
    signals: RequestSignals | None = None,
) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit`` bytes, and with 408
    (closing the connection) if it has not all arrived ``timeout`` seconds from now. Once the
    connection's ``signals`` say the body has all arrived, ``receive()`` cannot wait: it runs
    without the timer."""
    declared = protocol.over_limit(headers.get("content-length", ""), limit)
    if declared is not None:
        shown = protocol.shown_number(declared)
        raise ApiError(413, f"request body of {shown} bytes exceeds {limit}")
    chunks, size = [], 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            if signals is not None and signals.body_complete:
                message = await receive()
            else:
                message = await _within(receive(), deadline - time.monotonic())
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            raise ApiError(
                408,
                f"request body took longer than body_timeout_s={timeout:g} (--body-timeout-s)",
                {"Connection": "close"},
            ) from None
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


if sys.version_info >= (3, 11):

    async def _within(awaitable: Awaitable, seconds: float):
        """``await awaitable``, or ``asyncio.TimeoutError`` after ``seconds``: a timer on this
        task (``asyncio.wait_for`` runs the awaitable in a task of its own, per request)."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:  # Python 3.10

    async def _within(awaitable: Awaitable, seconds: float):
        return await asyncio.wait_for(awaitable, seconds)


def _cancelling() -> bool:
    """Whether this task was asked to cancel (Python 3.11+; on 3.10 it cannot be told)."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return bool(cancelling and cancelling())


async def _until_disconnect(
    batcher: Batcher,
    futures: Sequence[asyncio.Future],
    receive: Receive,
    signals: RequestSignals | None = None,
) -> list[ItemResult]:
    """The results of a request's futures; if the client leaves first, its items are withdrawn.

    Withdrawing them cancels their futures, so the wait for them ends at once. The
    connection's ``signals`` call back when it sees the client go (reading the connection
    meanwhile); without them (another server), a watcher task waits for the
    ``http.disconnect`` that the next ASGI ``receive()`` returns once the body is read (one
    task a request, and no ``asyncio.wait``).
    """
    gone = False

    def on_gone() -> None:
        nonlocal gone
        gone = True
        batcher.withdraw(futures)

    async def wait_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        on_gone()

    if signals is not None:
        unregister = signals.on_disconnect(on_gone)
    else:
        unregister = asyncio.ensure_future(wait_disconnect()).cancel
    try:
        # a failed item's BatchError answers the request
        return [await future for future in futures]
    except asyncio.CancelledError:
        if gone and not _cancelling():  # its going cancelled the futures, not this task
            raise _ClientGoneError from None
        raise
    finally:
        unregister()
        batcher.withdraw(futures)


def map_extent(results: Sequence[ItemResult]) -> tuple[int, int]:
    """The most rows and columns of the results' attention maps, ``(0, 0)`` without maps: the
    response pads every map to them."""
    shapes = [r.attention.shape for r in results if r.attention is not None]
    return max((s[0] for s in shapes), default=0), max((s[1] for s in shapes), default=0)


def output_elements(request: protocol.InferRequest, rows: int, columns: int) -> int:
    """The number of tensor elements of the response to ``request``, its attention maps padded
    to ``rows x columns`` (counted before building it).

    Before decoding, ``rows`` is the model's ``max_output_length`` (a map has a row per output
    token) and ``columns`` the longest source's tokens + 1 (the end-of-source marker): the
    most the response can hold. After, the maps' own extent (:func:`map_extent`).
    """
    n = len(request.sources)
    total = 0
    for output in request.outputs:
        if output.name == protocol.ATTENTION:
            total += n * rows * columns
        elif output.name == protocol.ATTENTION_LENGTHS:
            total += 2 * n
        else:
            total += n
    return total


def _encode(
    model_name: str, request: protocol.InferRequest, results: list[ItemResult]
) -> tuple[bytes, dict[str, str]]:
    """The response for a request's results, with the outputs it asked for, in its order."""
    predictions = [as_text(r.prediction) for r in results]
    tensors = {protocol.PREDICTION: protocol.prediction_tensor(predictions)}
    if request.wants_attention:
        attention, lengths = protocol.attention_tensors([r.attention for r in results])
        tensors[protocol.ATTENTION] = attention
        tensors[protocol.ATTENTION_LENGTHS] = lengths
    return protocol.encode_infer_response(
        model_name=model_name,
        model_version=MODEL_VERSION,
        request_id=request.id,
        outputs=[(tensors[out.name], out.binary) for out in request.outputs],
    )
