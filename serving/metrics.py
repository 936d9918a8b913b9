"""Prometheus metrics of the server, in a registry of their own (one per app).

Every series carries a ``model`` label, so that one server can host several models::

    skattn_requests_total{model, outcome}       inference requests by outcome
    skattn_request_duration_seconds{model}      time from request to response
    skattn_batch_size{model}                    items per onnxruntime batch
    skattn_queue_wait_seconds{model}            time an item waits before its batch starts
    skattn_inference_seconds{model}             time one batch spends in the runtime
    skattn_batch_failures_total{model}          batches whose runtime call raised (not
                                                those stopped because no one waits)
    skattn_queue_depth{model}                   items waiting for a batch

Requests for a model the server does not have count under ``model=""``, ``outcome="not_found"``
(the name a client sent never becomes a label: that would let clients grow the series); a
request for a version a served model does not have counts under that model.

``skattn_requests_total`` counts the POSTs that reach the inference handler. Requests refused
before it are not counted, as they name no model the server has vouched for: the connection
limits' answers (408, 431, 503 for too many connections, malformed HTTP), the guard's (400 for
a Host not allowed, 403 for a cross-origin POST, 415 for a Content-Type no inference request
has) and 405 for another method on an inference path. A proxy in front of the server sees them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

OUTCOMES = (
    "ok",  # 200
    "bad_request",  # 400, 415
    "too_large",  # 413
    "timeout",  # 408: the body did not arrive in time
    "not_found",  # 404: unknown model
    "queue_full",  # 503: the batcher's queue is full
    "unavailable",  # 503: the server is shutting down
    "error",  # 500: the batch failed
    "disconnected",  # the client left before its answer
)

_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class ServerMetrics:
    """The server's metrics; ``for_model`` hands out the series of one model."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model"]
        self.requests = Counter(
            "skattn_requests",
            "Inference requests by outcome",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "skattn_request_duration_seconds",
            "Time from receiving an inference request to answering it",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "skattn_batch_size",
            "Items per onnxruntime batch",
            labels,
            buckets=_BATCH_SIZE_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "skattn_queue_wait_seconds",
            "Time an item waits in the queue before its batch starts",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inference = Histogram(
            "skattn_inference_seconds",
            "Time one batch spends in the runtime",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_failures = Counter(
            "skattn_batch_failures",
            "Batches whose runtime call raised",
            labels,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "skattn_queue_depth", "Items waiting for a batch", labels, registry=self.registry
        )

    def for_model(self, model: str) -> ModelMetrics:
        """The series of one model (created at zero, so that they show before any traffic)."""
        return ModelMetrics(self, model)

    def unknown_model(self) -> None:
        """Count a request for a model this server does not have."""
        self.requests.labels("", "not_found").inc()

    def render(self) -> bytes:
        """All series in the Prometheus text exposition format."""
        return generate_latest(self.registry)


class ModelMetrics:
    """The metrics of one model: what the batcher and the request handler record."""

    def __init__(self, metrics: ServerMetrics, model: str) -> None:
        self._requests = {o: metrics.requests.labels(model, o) for o in OUTCOMES}
        self._request_duration = metrics.request_duration.labels(model)
        self._batch_size = metrics.batch_size.labels(model)
        self._queue_wait = metrics.queue_wait.labels(model)
        self._inference = metrics.inference.labels(model)
        self._batch_failures = metrics.batch_failures.labels(model)
        self._queue_depth = metrics.queue_depth.labels(model)

    def request(self, outcome: str, seconds: float | None = None) -> None:
        """Count one request by outcome (one of ``OUTCOMES``) and observe its duration."""
        self._requests[outcome].inc()
        if seconds is not None:
            self._request_duration.observe(seconds)

    def batch(self, size: int, seconds: float, failed: bool) -> None:
        """Record one batch: its size, its runtime call's duration, and whether it failed."""
        self._batch_size.observe(size)
        self._inference.observe(seconds)
        if failed:
            self._batch_failures.inc()

    def queue_wait(self, seconds: float) -> None:
        """Record how long one item waited for its batch."""
        self._queue_wait.observe(seconds)

    def queue_depth(self, depth: int) -> None:
        """Set the number of items waiting."""
        self._queue_depth.set(depth)
