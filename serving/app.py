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

The pieces: :mod:`serving.settings` (the limits), :mod:`serving.infer` (the inference route in
plain ASGI, in front of FastAPI), :mod:`serving.routes` (health, metadata, metrics, errors),
:mod:`serving.explorer` (``GET /`` and ``GET /v2/models``); :func:`create_app` builds one
batcher per model and joins them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.batcher import Batcher
from serving.continuous import ContinuousBatcher
from serving.explorer import mount_explorer
from serving.guard import RequestGuard
from serving.infer import MODEL_VERSION, InferHandler, InferRoute, ServedModel
from serving.interface import Runtime
from serving.metrics import ServerMetrics
from serving.routes import add_error_handlers, add_routes
from serving.running import continuous_support
from serving.settings import ServerSettings, check_model_name

logger = logging.getLogger(__name__)

__all__ = [
    "MODEL_VERSION",
    "ServedModel",
    "ServerSettings",
    "begin_shutdown",
    "check_model_name",
    "create_app",
]


def create_app(runtimes: Mapping[str, Runtime], settings: ServerSettings | None = None) -> FastAPI:
    """Build the server for some runtimes.

    Parameters
    ----------
    runtimes : mapping of str to Runtime
        Model name -> runtime (as returned by ``serving.load``, or any object implementing
        :class:`serving.interface.Runtime`). The server runs ``settings.instances`` batches
        at a time (one by default), so load runtimes with ``intra_op_num_threads``
        (``python -m serving`` gives them the cores but one, or one each with several
        instances) and ``max_batch_size`` at least ``settings.max_batch_size``.
    settings : ServerSettings, optional
        Limits and batching settings; the defaults when omitted. ``instances`` above 1 refuses
        (``ValueError``) a runtime with IO binding.

    Returns
    -------
    FastAPI
        The ASGI app; its lifespan warms each model up (:func:`warm_up`: start-up fails,
        with ``app.state.startup_error`` naming the model, if one cannot translate), then
        starts and (draining) stops one batcher per model, and moves the objects of start-up
        out of the garbage collector's generations while it runs (``gc.freeze``). All models
        share the inference worker threads (``settings.instances``). ``app.state.models`` maps
        each name to its :class:`serving.infer.ServedModel`.
    """
    settings = ServerSettings() if settings is None else settings
    if not isinstance(runtimes, Mapping) or not runtimes:
        raise ValueError("runtimes must be a non-empty mapping of model name to runtime")
    for name, runtime in runtimes.items():
        check_model_name(name, "runtimes: ")
        if not isinstance(runtime, Runtime):
            raise ValueError(
                f"runtimes: {name!r} is not a serving.interface.Runtime "
                "(it needs info, check_source and predict_batch)"
            )
    check_instances(runtimes, settings.instances)
    metrics = ServerMetrics()
    executor = ThreadPoolExecutor(max_workers=settings.instances, thread_name_prefix="skattn-infer")
    # Two encoders: large responses are encoded off the event loop; more threads would only
    # contend for the GIL.
    encoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="skattn-encode")
    models = _served_models(runtimes, settings, metrics, executor)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            for model in models.values():
                await warm_up(model, executor)
        except Exception as exc:
            app.state.startup_error = str(exc)
            logger.error("start-up failed", extra={"error": str(exc)})
            executor.shutdown(wait=False)
            encoder.shutdown(wait=False)
            raise
        workers = asyncio.Semaphore(settings.instances)  # the executor's free threads
        for model in models.values():
            await model.batcher.start(workers)
        # What start-up built (modules, sessions, the app) stays while the app runs: out of
        # the collector's generations, a full collection walks only what requests leave behind.
        # Walking start-up's objects took 40 ms, a pause every in-flight request waited out
        # (p99 at concurrency 64 on the reversal model: 65-92 ms, 35-62 ms frozen).
        gc.collect()
        gc.freeze()
        logger.info("server ready", extra={"models": sorted(models)})
        try:
            yield
        finally:
            gc.unfreeze()  # a stopped app (in a process that goes on) can be collected again
            logger.info("draining")
            await asyncio.gather(*(model.batcher.stop(drain=True) for model in models.values()))
            executor.shutdown(wait=True)
            encoder.shutdown(wait=True)
            logger.info("stopped")

    # No /openapi.json, /docs or /redoc: the protocol is the KServe v2 one, documented there.
    # No redirect of a path with a trailing slash: its 307 had an empty body; a JSON 404 now.
    app = _ServerApp(
        title="skattn",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
    )
    app.state.models = models
    app.state.metrics = metrics
    app.state.settings = settings
    app.state.startup_error = None
    add_routes(app, models, metrics)
    add_error_handlers(app)
    inference = InferRoute(app.framework, InferHandler(models, settings, metrics, encoder))
    app.front = RequestGuard(inference, allowed_hosts=settings.allowed_hosts)
    # GET / (the attention explorer) and GET /v2/models
    mount_explorer(app, runtimes, is_ready=lambda name: models[name].batcher.running)
    return app


class _ServerApp(FastAPI):
    """The FastAPI app behind two plain ASGI layers of its own: every request meets
    :class:`~serving.guard.RequestGuard` first, then :class:`~serving.infer.InferRoute`
    answers inference requests, and only the rest reach FastAPI (:meth:`framework`).

    Added with ``add_middleware`` they would sit inside FastAPI's own layers (its error and
    telemetry middleware and body limit, which wrap every ``send``): in front of them, the
    server answered 1.13x the requests per second of the reversal model at 0.91x the CPU per
    request (1.15x / 0.87x for an instant model; paired windows, concurrency 64).
    """

    front: ASGIApp | None = None

    def add_middleware(self, middleware_class: type, *args, **kwargs) -> None:
        """Middleware added to the built app (authentication, CORS, tracing) wraps every
        request, inference included: it goes in front of the guard, outermost, as Starlette
        puts the middleware added last."""
        if self.front is None:
            super().add_middleware(middleware_class, *args, **kwargs)
        else:
            self.front = middleware_class(self.front, *args, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:  # before create_app sets it: FastAPI alone
            await self.framework(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own entry point (routes, error handlers, lifespan)."""
        await super().__call__(scope, receive, send)


def check_instances(runtimes: Mapping[str, Runtime], instances: int) -> None:
    """``ValueError`` if ``instances`` batches at once cannot run on one of ``runtimes``: a
    runtime with IO binding (CUDA's default) binds one call's buffers at a time."""
    if instances == 1:
        return
    for name, runtime in runtimes.items():
        if getattr(runtime, "io_binding", False):
            raise ValueError(
                f"instances must be 1 for model {name!r}, which runs with IO binding (CUDA's "
                f"default) one call at a time, got {instances}; load it with io_binding=False "
                "(python -m serving: --device cpu) to run several batches at once"
            )


def begin_shutdown(app: FastAPI) -> None:
    """The server has begun to shut down, so no new request will come: each model's batcher
    runs what it holds without waiting out ``max_delay_ms`` for more
    (:meth:`serving.batcher.Batcher.hurry`). The lifespan's end drains and stops them later."""
    for model in app.state.models.values():
        model.batcher.hurry()


async def warm_up(model: ServedModel, executor: ThreadPoolExecutor) -> None:
    """Translate the model's ``info.warmup_source`` (with attention) once, before the server
    reports ready: raise ``RuntimeError`` naming the model if it cannot.

    The first call also pays for onnxruntime's lazy initialisation, which a client's first
    request would otherwise pay.
    """
    source = model.info.warmup_source
    loop = asyncio.get_running_loop()
    try:
        model.runtime.check_source(source)
        predictions, attentions = await loop.run_in_executor(
            executor, lambda: model.runtime.predict_batch([source], with_attention=True)
        )
        if len(predictions) != 1 or attentions is None or len(attentions) != 1:
            raise RuntimeError("it returned no single prediction and attention map")
    except Exception as exc:
        raise RuntimeError(
            f"model {model.name!r} failed its warm-up inference of {source!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    logger.info("model warmed up", extra={"model": model.name})


def _served_models(
    runtimes: Mapping[str, Runtime],
    settings: ServerSettings,
    metrics: ServerMetrics,
    executor: ThreadPoolExecutor,
) -> dict[str, ServedModel]:
    """One batcher and one set of metrics per model, all on the inference threads of
    ``executor`` (``settings.instances`` of them)."""
    models = {}
    for name, runtime in runtimes.items():
        model_metrics = metrics.for_model(name)
        batcher_class = Batcher
        if settings.batching == "continuous":
            reason = continuous_support(runtime)
            if reason is None:
                batcher_class = ContinuousBatcher
            else:
                logger.warning(
                    "model %r is batched dynamically, not continuously: %s", name, reason
                )
        batcher = batcher_class(
            runtime,
            max_batch_size=settings.max_batch_size,
            max_delay_ms=settings.max_delay_ms,
            max_queue=settings.max_queue,
            max_batch_chars=settings.max_batch_chars,
            executor=executor,
            metrics=model_metrics,
            eager=settings.eager_batching,
            instances=settings.instances,
        )
        models[name] = ServedModel(name, runtime, runtime.info, batcher, model_metrics)
    return models
