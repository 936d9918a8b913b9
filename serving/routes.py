"""The FastAPI routes: health, server and model metadata, Prometheus metrics, and the error
handlers that turn every refusal into ``{"error": message}``. (Inference is :mod:`serving.infer`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import protocol
from serving.infer import MODEL_VERSION, ApiError, ServedModel, lookup
from serving.metrics import ServerMetrics

__all__ = ["add_error_handlers", "add_routes", "model_metadata"]


def add_routes(app: FastAPI, models: Mapping[str, ServedModel], metrics: ServerMetrics) -> None:
    """Add the health, metadata and metrics endpoints of the protocol to ``app``."""

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        if all(model.batcher.running for model in models.values()):
            return Response(status_code=200)
        raise ApiError(503, "server is not ready")

    @app.get("/v2")
    async def server_metadata() -> dict:
        return {
            "name": "skattn",
            "version": _version(),
            "extensions": ["binary_tensor_data", "parameters"],
        }

    # The plain and versioned paths apart: one handler for both would read ``version`` from
    # the plain path's query string (``/v2/models/m?version=2`` answered 404).
    @app.get("/v2/models/{name}")
    async def get_model_metadata(name: str) -> dict:
        return model_metadata(lookup(models, name, None))

    @app.get("/v2/models/{name}/versions/{version}")
    async def get_version_metadata(name: str, version: str) -> dict:
        return model_metadata(lookup(models, name, version))

    def readiness(name: str, version: str | None) -> Response:
        if lookup(models, name, version).batcher.running:
            return Response(status_code=200)
        raise ApiError(503, f"model {name!r} is not ready")

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        return readiness(name, None)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> Response:
        return readiness(name, version)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)


def add_error_handlers(app: FastAPI) -> None:
    """Answer ``ApiError``, HTTP errors and validation errors as ``{"error": message}``."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(400, f"invalid request: {exc.errors()}")


def model_metadata(model: ServedModel) -> dict:
    """The protocol's model metadata: inputs, outputs, and skattn's parameters."""
    info = model.info
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
            "max_source_length": info.max_source_length,
            "output_kind": info.output_kind,
            "provider": info.provider,
            "max_batch_size": model.batcher.max_batch_size,
        },
    }


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """A ``{"error": message}`` response."""
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
