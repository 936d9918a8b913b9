"""The HTTP server: the Open Inference Protocol (KServe v2) over FastAPI, one batcher per model.

Endpoints (``{model}`` is a served model's name; ``/versions/1`` may follow it)::

    GET  /v2/health/live            200 while the process runs
    GET  /v2/health/ready           200 when every model's batcher runs, else 503
    GET  /v2                        server metadata
    GET  /v2/models/{model}         model metadata: inputs and outputs
    GET  /v2/models/{model}/ready   200 when the model's batcher runs, else 503
    POST /v2/models/{model}/infer   inference, JSON or binary tensor data
    GET  /metrics                   Prometheus text format

Every error is ``{"error": message}``: 400 bad request, 404 unknown model, 405 a method other
than POST on an infer path, 413 too many items or too large a body, 415 unknown
Content-Encoding, 500 the request's batch failed (or a bug), 503 queue full (with
``Retry-After``) or shutting down. Each request is validated in full before its items join the
batcher's queue, so one bad request never fails a batch.

Inference requests, the hot path, are answered in plain ASGI by a middleware in front of FastAPI
(``_InferRoute``): routing, request and response objects cost more than the rest of a small
request. Everything else goes through FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from serving import protocol
from serving.batcher import (
    Batcher,
    BatcherClosedError,
    BatchError,
    ItemResult,
    QueueFullError,
)
from serving.explorer import mount_explorer
from serving.metrics import ModelMetrics, ServerMetrics

logger = logging.getLogger(__name__)

MODEL_VERSION = "1"


@dataclass(frozen=True)
class ServerSettings:
    """Limits and batching settings of the server (validated when built).

    Parameters
    ----------
    max_batch_size : int, default=64
        The most items in one runtime call.
    max_delay_ms : float, default=2.0
        The longest an item waits for others to join its batch.
    max_queue : int, default=1024
        The most items waiting per model; beyond it requests get 503 with Retry-After.
    max_items_per_request : int, default=256
        The most sources in one request; beyond it 413.
    max_body_bytes : int, default=1048576
        The largest request body (after decompression); beyond it 413.
    retry_after_s : int, default=1
        The ``Retry-After`` a client gets with a 503.
    eager_batching : bool, default=True
        Take a batch as soon as the worker is free and no request is being read, instead of
        waiting out ``max_delay_ms`` (which still bounds the wait while requests are being
        read): a lone client gets the unbatched latency, concurrent ones still share batches.
    """

    max_batch_size: int = 64
    max_delay_ms: float = 2.0
    max_queue: int = 1024
    max_items_per_request: int = 256
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    eager_batching: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "eager_batching":
                ok, expected = isinstance(value, bool), "a bool"
            elif f.name == "max_delay_ms":
                ok = isinstance(value, (int, float)) and 0 <= value < float("inf")
                ok, expected = ok and not isinstance(value, bool), "a finite number >= 0"
            else:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
                expected = "a positive integer"
            if not ok:
                raise ValueError(f"{f.name} must be {expected}, got {value!r}")
        if self.max_items_per_request > self.max_queue:
            raise ValueError(
                f"max_items_per_request ({self.max_items_per_request}) must not exceed "
                f"max_queue ({self.max_queue}): such a request could never be queued"
            )


@dataclass
class _Model:
    """A served model: its runtime, its batcher and its metrics."""

    name: str
    runtime: object
    batcher: Batcher
    metrics: ModelMetrics


class _ApiError(Exception):
    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


class _ClientGoneError(Exception):
    """The client closed the connection before its answer was ready."""


def check_model_name(name: object, where: str = "") -> None:
    """Raise ``ValueError`` unless ``name`` can be a path segment: a non-empty str without '/'."""
    if not isinstance(name, str):
        raise ValueError(f"{where}model name {name!r} must be a str")
    if not name or "/" in name:
        raise ValueError(f"{where}model name {name!r} must be non-empty and hold no '/'")


def create_app(runtimes: Mapping[str, object], settings: ServerSettings | None = None) -> FastAPI:
    """Build the server for some runtimes.

    Parameters
    ----------
    runtimes : mapping of str to runtime
        Model name -> runtime (as returned by ``serving.load``, or any object with
        ``predict_batch``, ``check_source``, ``max_source_length`` and ``provider``).
    settings : ServerSettings, optional
        Limits and batching settings; the defaults when omitted.

    Returns
    -------
    FastAPI
        The ASGI app; its lifespan starts and (draining) stops one batcher per model. All
        models share one inference worker thread.
    """
    settings = ServerSettings() if settings is None else settings
    if not isinstance(runtimes, Mapping) or not runtimes:
        raise ValueError("runtimes must be a non-empty mapping of model name to runtime")
    for name in runtimes:
        check_model_name(name, "runtimes: ")
    server_metrics = ServerMetrics()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skattn-infer")
    models = {}
    for name, runtime in runtimes.items():
        model_metrics = server_metrics.for_model(name)
        batcher = Batcher(
            runtime,
            max_batch_size=settings.max_batch_size,
            max_delay_ms=settings.max_delay_ms,
            max_queue=settings.max_queue,
            executor=executor,
            metrics=model_metrics,
            eager=settings.eager_batching,
        )
        models[name] = _Model(name, runtime, batcher, model_metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for model in models.values():
            await model.batcher.start()
        logger.info("server ready", extra={"models": sorted(models)})
        try:
            yield
        finally:
            logger.info("draining")
            await asyncio.gather(*(model.batcher.stop(drain=True) for model in models.values()))
            executor.shutdown(wait=True)
            logger.info("stopped")

    app = FastAPI(title="skattn", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.models = models
    app.state.metrics = server_metrics
    app.state.settings = settings

    def get_model(name: str, version: str | None) -> _Model:
        model = models.get(name)
        if model is None:
            raise _ApiError(404, f"unknown model {name!r}; this server has {sorted(models)}")
        if version is not None and version != MODEL_VERSION:
            raise _ApiError(404, f"model {name!r} has no version {version!r}")
        return model

    # -- health and metadata -----------------------------------------------------------------

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        if all(model.batcher.running for model in models.values()):
            return Response(status_code=200)
        raise _ApiError(503, "server is not ready")

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {
            "name": "skattn",
            "version": _version(),
            "extensions": ["binary_tensor_data", "parameters"],
        }

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict:
        return _model_metadata(get_model(name, version))

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        if get_model(name, version).batcher.running:
            return Response(status_code=200)
        raise _ApiError(503, f"model {name!r} is not ready")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(server_metrics.render(), media_type=server_metrics.content_type)

    # -- inference ---------------------------------------------------------------------------

    async def infer(
        scope: Scope, receive: Receive, name: str, version: str | None
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The hot path, as plain ASGI: (status, headers, body), or None if the client left.

        Routing, request and response objects of the framework cost more than the rest of a
        small request, so ``_InferRoute`` sends inference requests here directly.
        """
        started = time.monotonic()
        outcome, items, request_id = "ok", 0, None
        try:
            model = get_model(name, version)
        except _ApiError as exc:
            server_metrics.unknown_model()
            return exc.status, {}, protocol.error_body(exc.message)
        try:
            headers = _headers(scope)
            with model.batcher.receiving():  # an eager batcher waits for these items
                body = await _read_body(receive, headers, settings.max_body_bytes)
                parsed = _parse(headers, body, model, settings)
                items, request_id = len(parsed.sources), parsed.id
                futures = model.batcher.submit(
                    parsed.sources,
                    temperature=parsed.temperature,
                    with_attention=parsed.wants_attention,
                )
            results = await _until_disconnect(model.batcher, futures, receive)
            body, response_headers = _encode(model.name, parsed, results)
            return 200, response_headers, body
        except _ApiError as exc:
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
            return None  # nobody reads an answer
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

    app.add_middleware(_InferRoute, handler=infer)

    # -- errors as {"error": message} --------------------------------------------------------

    @app.exception_handler(_ApiError)
    async def api_error(request: Request, exc: _ApiError) -> Response:
        return _error(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _error(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _error(400, f"invalid request: {exc.errors()}")

    mount_explorer(app, runtimes)  # GET / (the attention explorer) and GET /v2/models
    return app


_OUTCOME_BY_STATUS = {413: "too_large", 404: "not_found", 503: "unavailable"}

# One log line per inference request: answered ones at DEBUG (at hundreds of requests a second,
# the metrics say more than the lines), refused ones at INFO, failed ones at WARNING.
_LOG_LEVEL_BY_OUTCOME = {
    "ok": logging.DEBUG,
    "disconnected": logging.INFO,
    "queue_full": logging.WARNING,
    "unavailable": logging.WARNING,
    "error": logging.WARNING,
}


class _InferRoute:
    """ASGI middleware: inference requests go straight to ``handler``, the rest to the app.

    ``POST /v2/models/{name}[/versions/{version}]/infer`` is answered from ``handler``'s
    ``(status, headers, body)``; another method on that path gets 405.
    """

    def __init__(self, app: ASGIApp, handler: Callable[..., Awaitable[tuple | None]]) -> None:
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
            answer = await self.handler(scope, receive, match["name"], match["version"])
        if answer is None:
            return  # the client has gone
        status, headers, body = answer
        raw_headers = [(b"content-length", str(len(body)).encode())]
        if not any(key.lower() == "content-type" for key in headers):
            raw_headers.append((b"content-type", b"application/json"))
        raw_headers += [(key.lower().encode(), value.encode()) for key, value in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})


_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


def _headers(scope: Scope) -> dict[str, str]:
    """The request headers, names lower-cased (a repeated header keeps its last value)."""
    return {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}


def _parse(
    headers: Mapping[str, str], body: bytes, model: _Model, settings: ServerSettings
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
        raise _ApiError(exc.status, exc.message) from exc
    for i, source in enumerate(parsed.sources):
        try:
            model.runtime.check_source(source)
        except ValueError as exc:
            raise _ApiError(400, f"input 'source' item {i}: {exc}") from exc
    return parsed


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit`` bytes."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _ApiError(413, f"request body of {declared} bytes exceeds {limit}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _ApiError(413, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _until_disconnect(
    batcher: Batcher, futures: Sequence[asyncio.Future], receive: Receive
) -> list[ItemResult]:
    """The results of a request's futures; if the client leaves first, its items are withdrawn.

    Once the body is read, the next ASGI ``receive()`` returns only on ``http.disconnect``.
    """

    async def wait_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    results = []
    try:
        for future in futures:
            if not future.done():
                await asyncio.wait((future, watcher), return_when=asyncio.FIRST_COMPLETED)
                if not future.done():  # the watcher returned: the client has gone
                    raise _ClientGoneError
            results.append(future.result())  # a failed item's BatchError answers the request
        return results
    finally:
        watcher.cancel()
        batcher.withdraw(futures)


def _encode(
    model_name: str, request: protocol.InferRequest, results: list[ItemResult]
) -> tuple[bytes, dict[str, str]]:
    """The response for a request's results, with the outputs it asked for, in its order."""
    predictions = [_as_text(r.prediction) for r in results]
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


def _as_text(prediction: str | Sequence[str]) -> str:
    """A prediction as text: a model with ``output_kind="tokens"`` gives tokens, sent joined
    by single spaces (``"HH AH0 L OW1"``)."""
    return prediction if isinstance(prediction, str) else " ".join(prediction)


def _model_metadata(model: _Model) -> dict:
    runtime = model.runtime
    return {
        "name": model.name,
        "versions": [MODEL_VERSION],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": protocol.INPUT_NAME, "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": protocol.PREDICTION, "datatype": "BYTES", "shape": [-1]},
            {"name": protocol.ATTENTION, "datatype": "FP32", "shape": [-1, -1, -1]},
            {"name": protocol.ATTENTION_LENGTHS, "datatype": "INT32", "shape": [-1, 2]},
        ],
        "parameters": {
            "max_source_length": getattr(runtime, "max_source_length", None),
            "output_kind": getattr(runtime, "manifest", {}).get("output_kind", "str"),
            "provider": getattr(runtime, "provider", None),
            "max_batch_size": model.batcher.max_batch_size,
        },
    }


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        protocol.error_body(message),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )


def _version() -> str:
    try:
        return metadata.version("skattn")
    except metadata.PackageNotFoundError:
        return "unknown"
