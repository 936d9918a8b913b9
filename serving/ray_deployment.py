"""Serving replicas on Ray Serve: the same Open Inference Protocol server, one per replica.

Each replica loads the artifacts itself and runs the app of :func:`serving.app.create_app`,
so every replica has its own runtime and its own dynamic batcher, and answers the same routes
(``/v2/health/*``, ``/v2/models/{name}/infer``, ``/metrics``: each replica's own counts) as
``python -m serving``; tritonclient and KServe tooling work against Ray Serve's proxy
unchanged. One command (every replica must be able to read ``model_dir``)::

    serve run serving.ray_deployment:build model_dir=DIR [model_name=NAME] [num_replicas=2]
        [num_cpus=1] [max_ongoing_requests=256] [max_batch_size=64] [max_delay_ms=2]
        [log_level=info] [access_log=false]
        [min_replicas=1 max_replicas=4 target_ongoing_requests=32]    # autoscaling instead
        [upscale_delay_s=30 downscale_delay_s=600 metrics_interval_s=10 look_back_period_s=30]

Several models: ``model_dir=DIR1,DIR2`` (and ``model_name=A,B``). ``max_replicas`` turns on
Ray Serve's autoscaling between ``min_replicas`` and ``max_replicas``, aiming at
``target_ongoing_requests`` per replica, in place of a fixed ``num_replicas``; Ray's timing of it
by the names of its ``AutoscalingConfig`` (:data:`AUTOSCALING_ARGS`). Health and
readiness: Ray Serve calls each replica's ``check_health`` and restarts a replica whose
batchers stopped; the proxy routes only to running replicas, and ``/v2/health/ready`` answers
from the replica it reaches. Every response names its replica in ``X-Skattn-Replica``.

Ray's default ingress is a proxy actor in Python, a hop that costs more than a small model's
inference. :data:`THROUGHPUT_ENV` is the environment that serves faster (Ray 2.60's HAProxy
ingress and the request path without per-request metrics; read when Ray starts, so set it
before ``ray start`` or ``serve run``)::

    env RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 \
        RAY_SERVE_HAPROXY_METRICS_ENABLED=0 RAY_enable_metrics_collection=0 \
        RAY_SERVE_HAPROXY_NBTHREAD=1 \
        serve run serving.ray_deployment:build model_dir=DIR num_replicas=2

Or no ingress hop at all: with ``shared_port=PORT`` every replica on a node listens on that
port itself (``SO_REUSEPORT``: the kernel spreads the connections among them; see
:mod:`serving.shared_port`), beside Ray's ingress, which still answers too::

    serve run serving.ray_deployment:build model_dir=DIR num_replicas=2 shared_port=8100 \
        [shared_host=0.0.0.0] [shared_close_grace_s=0.5] [max_connections=1024 ...]

With ``max_replicas`` too, Ray's autoscaler counts the shared port's requests as well
(:mod:`serving.ray_autoscaling`).

``benchmarks/bench_cluster.py`` measures the three ingresses. Ray's access log is off by default,
as in ``python -m serving``: the server logs one JSON line per inference request itself (at
``log_level`` info and below), to the replica's log file.

This module imports Ray; the plain server never imports it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from ray import serve

from serving import ray_args
from serving.app import create_app
from serving.artifact import ArtifactError, read_artifact
from serving.process import LOG_LEVELS, configure_logging
from serving.ray_args import AUTOSCALING_ARGS, LIMIT_ARGS
from serving.ray_autoscaling import SHARED_PORT_ONGOING
from serving.runtime import load
from serving.settings import ConnectionLimits, ServerSettings, check_model_name
from serving.shared_port import (
    CLOSE_GRACE_S,
    SharedPortListener,
    bind_shared_port,
    migration_warning,
)

__all__ = [
    "AUTOSCALING_ARGS", "LIMIT_ARGS", "REPLICA_HEADER", "THROUGHPUT_ENV", "ServerReplica", "build",
]  # fmt: skip

logger = logging.getLogger(__name__)

#: The response header that names the replica which answered.
REPLICA_HEADER = "x-skattn-replica"

#: Ray's environment for serving throughput, read when Ray starts (``ray start``, ``serve run``,
#: ``ray.init``). A probe added them one at a time (2 replicas, ``wrk``, 64 connections, 8 s
#: each): 3,759 req/s with the HAProxy ingress and the request path optimized for throughput,
#: 4,279 without HAProxy's per-request metrics, 5,001 without Ray's metrics collection and with
#: one HAProxy thread; ``benchmarks/bench_cluster.py`` compares the whole set with HAProxy alone.
#: What it gives up: Ray's request metrics (each replica's ``/metrics`` still counts its own);
#: and with ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` (Ray 2.60) Ray buffers its request-path log
#: records (1,000, flushed on an error, so a crash can lose the last), freezes the garbage
#: collector's start-up objects, and makes deployment handles speak gRPC.
THROUGHPUT_ENV: dict[str, str] = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",  # HAProxy (C) in place of the Python proxy actor
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",  # user code on the replica's loop, buffered logs
    "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",  # no syslog line per request parsed in Python
    "RAY_enable_metrics_collection": "0",  # no Ray metric recorded and exported per request
    "RAY_SERVE_HAPROXY_NBTHREAD": "1",  # HAProxy's 4 threads fight the replicas on 2 cores
}


class _NameReplica:
    """ASGI middleware: add ``X-Skattn-Replica`` to every HTTP response of ``app``."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: the app's own start-up and shut-down
            await self.app(scope, receive, send)
            return

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


@serve.ingress()
class ServerReplica:
    """One replica: its own runtimes, its own batchers, the server's app.

    Parameters
    ----------
    model_dirs : mapping of str to str
        Model name -> artifact directory (readable where the replica runs).
    settings : mapping, optional
        :class:`serving.settings.ServerSettings` fields (the server's limits and batching).
    threads : int, default=1
        onnxruntime threads per operator: the CPUs Ray reserved for the replica, shared among
        its ``instances`` (a ``ServerSettings`` field: batches at once), at least 1 each.
    log_level : {"debug", "info", "warning", "error"}, default="info"
        The server's own logs (the ``serving`` loggers: one JSON line per inference request at
        info), to the replica's stderr, which Ray keeps in the replica's log file.
    device : {"cpu", "cuda", "auto"}, default="cpu"
        ``"cuda"`` or ``"auto"`` only for a replica that reserved a GPU (``num_gpus``): Ray
        makes no GPU invisible to a replica that reserved none, so ``"auto"`` would take one
        unreserved.
    shared_port : (str, int), optional
        ``(host, port)`` that every replica on a node listens on itself (``SO_REUSEPORT``; see
        :mod:`serving.shared_port`), beside Ray's ingress: no proxy hop for its clients.
    connection_limits : mapping, optional
        :class:`serving.settings.ConnectionLimits` fields for the shared port's connections
        (its defaults for the others; ``retry_after_s`` is the server settings').
    close_grace : float, default=CLOSE_GRACE_S (0.5)
        Seconds the shared port's connections stay open after its socket closes, so that one
        accepted just before sends its request and is answered
        (:class:`serving.shared_port.SharedPortListener`).
    """

    def __init__(
        self,
        model_dirs: Mapping[str, str],
        settings: Mapping | None = None,
        threads: int = 1,
        log_level: str = "info",
        device: str = "cpu",
        shared_port: tuple[str, int] | None = None,
        connection_limits: Mapping[str, Any] | None = None,
        close_grace: float = CLOSE_GRACE_S,
    ) -> None:
        configure_logging(log_level, "serving")
        # bound first, so that a port another user holds fails the replica before the models load
        self.shared_socket = None if shared_port is None else bind_shared_port(*shared_port)
        self.log_level = log_level
        self.connection_limits = dict(connection_limits or {})
        self.close_grace = close_grace
        self.listener: SharedPortListener | None = None
        self.settings = ServerSettings(**(settings or {}))
        self.runtimes = {  # a batch is one onnxruntime call, on the replica's threads
            name: load(
                path,
                device=device,
                intra_op_num_threads=threads,
                max_batch_size=self.settings.max_batch_size,
                name=name,
            )
            for name, path in model_dirs.items()
        }
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.server = create_app(self.runtimes, self.settings)

    def __serve_build_asgi_app__(self) -> Any:
        # Ray Serve runs the app's lifespan in the replica: warm-up, then the batchers start
        app = _NameReplica(self.server, self.replica)
        if self.shared_socket is None:
            return app
        # the shared port's server starts once the lifespan has, and stops before it does
        level = "warning" if self.log_level in ("info", "debug") else self.log_level
        # the limits given, and the 503's Retry-After the queue's carries
        limits = ConnectionLimits(
            **self.connection_limits, retry_after_s=self.settings.retry_after_s
        )
        self.listener = SharedPortListener(
            app, self.shared_socket, limits=limits, log_level=level, close_grace=self.close_grace
        )
        if (warning := migration_warning()) is not None:  # each node's own setting
            logger.warning(warning)
        return self.listener

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's custom autoscaling metrics (Ray asks only when the deployment
        autoscales): the shared port's requests in flight, which Ray's own count misses."""
        if self.listener is None:
            return {}
        return {SHARED_PORT_ONGOING: float(self.listener.ongoing)}

    def check_health(self) -> None:
        """Ray Serve's health check: raise (and get restarted) when a batcher is not running
        or the shared port's server has ended."""
        stopped = [name for name, m in self.server.state.models.items() if not m.batcher.running]
        if stopped:
            raise RuntimeError(f"replica {self.replica}: batchers not running for {stopped}")
        if self.listener is not None and self.listener.failed:
            raise RuntimeError(
                f"replica {self.replica}: the shared port {self.listener.address} stopped "
                f"serving: {self.listener.error}"
            )


#: ``build``'s own arguments; the others it takes are ``ServerSettings`` fields and
#: :data:`LIMIT_ARGS`.
BUILD_ARGS = (
    "model_dir", "model_name", "num_replicas", "num_cpus", "num_gpus", "device",
    "max_ongoing_requests", "min_replicas", "max_replicas", "target_ongoing_requests",
    *AUTOSCALING_ARGS, "log_level", "access_log", "check_model_dir", "shared_port",
    "shared_host", "shared_close_grace_s",
)  # fmt: skip


def build(args: Mapping[str, Any]) -> serve.Application:
    """The Ray Serve application of ``serve run serving.ray_deployment:build key=value ...``.

    ``args`` (strings from the command line, or values from Python): ``model_dir`` (required;
    comma-separated for several), ``model_name``, ``num_replicas`` (default 1), ``num_cpus``
    (per replica, default 1), ``num_gpus`` (per replica, default 0; a replica with one runs on
    CUDA, an int8 artifact on the CPU), ``device`` (``cpu``, or ``cuda`` with ``num_gpus``;
    default: ``serving.load``'s ``auto`` when ``num_gpus`` is given, else ``cpu``),
    ``max_ongoing_requests`` (per replica, default 256: the batcher needs concurrent requests
    to form batches), ``min_replicas`` / ``max_replicas`` / ``target_ongoing_requests``
    (autoscaling, in place of ``num_replicas``; Ray's timing of it by name,
    :data:`AUTOSCALING_ARGS`), ``log_level`` (default ``info``: the server's own logs, one line
    per inference request as ``python -m serving`` writes them, and Ray Serve's logger in the
    replica), ``access_log`` (Ray's own line per HTTP request, default false),
    ``check_model_dir`` (default true: each ``model_dir`` is read here, as ``serving.load``
    reads it, so that a bad one is this ``ValueError`` and not a replica that fails to start;
    false where only the replicas' nodes hold the folders), ``shared_port`` (every replica
    on a node also listens on this port itself, with ``SO_REUSEPORT``, so its clients skip
    Ray's ingress: see :mod:`serving.shared_port`; with autoscaling, Ray counts its requests
    too: :mod:`serving.ray_autoscaling`) and
    ``shared_host`` (its IP address, default ``127.0.0.1``; Linux only),
    ``shared_close_grace_s`` (default 0.5: how long a stopping replica's connections stay open
    after its socket closes, so that one just accepted is answered) and the shared port's
    connection limits by their ``ConnectionLimits`` field names (``max_connections=1024``,
    ``header_timeout_s``, ...: :data:`LIMIT_ARGS`), and any
    ``ServerSettings`` field by name (``allowed_hosts``: comma-separated; default any, since
    Ray's ingress may listen on any interface). Any other key is a ``ValueError``: a
    misspelled setting would have been dropped without a word.
    """
    known = {*BUILD_ARGS, *ServerSettings.__dataclass_fields__, *LIMIT_ARGS}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(
            f"unknown argument {unknown[0]!r}: build takes {', '.join(BUILD_ARGS)}, the "
            f"server settings {', '.join(ServerSettings.__dataclass_fields__)} and the shared "
            f"port's connection limits {', '.join(LIMIT_ARGS)}"
        )
    autoscaling = ("min_replicas", "target_ongoing_requests", *AUTOSCALING_ARGS)
    if "max_replicas" not in args and any(key in args for key in autoscaling):
        given = next(key for key in autoscaling if key in args)
        raise ValueError(f"{given} is an autoscaling setting: give max_replicas too")
    if "max_replicas" in args and "num_replicas" in args:
        raise ValueError("num_replicas fixes the replicas; max_replicas autoscales: not both")
    if not args.get("model_dir"):
        raise ValueError(
            "model_dir is required: serve run serving.ray_deployment:build model_dir=DIR"
        )
    dirs = str(args["model_dir"]).split(",")
    names = str(args["model_name"]).split(",") if args.get("model_name") else None
    if names is not None and len(names) != len(dirs):
        raise ValueError(f"model_name names {len(names)} models but model_dir holds {len(dirs)}")
    names = names or [d.rstrip("/").rsplit("/", 1)[-1] for d in dirs]
    for name in names:
        check_model_name(name, "model_name (or model_dir's last part): ")
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(
            f"two models are named {twice[0]!r}: name each with model_name=NAME1,NAME2,..."
        )
    model_dirs = dict(zip(names, dirs, strict=True))
    check_dirs = ray_args.number(args, "check_model_dir", bool, True)
    if "max_queue" in args and "max_items_per_request" not in args:  # as python -m serving
        queue = ray_args.number(args, "max_queue", int)
        args = {**args, "max_items_per_request": min(ServerSettings.max_items_per_request, queue)}
    settings = ray_args.server_settings(args)
    num_cpus = ray_args.number(args, "num_cpus", float, 1.0)
    if not (math.isfinite(num_cpus) and num_cpus > 0):
        raise ValueError(f"num_cpus must be a finite number of CPUs > 0, got {num_cpus!r}")
    log_level = str(args.get("log_level", "info")).lower()
    if log_level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    num_gpus = ray_args.number(args, "num_gpus", float, 0.0)
    if not (math.isfinite(num_gpus) and num_gpus >= 0):
        raise ValueError(f"num_gpus must be a finite number of GPUs >= 0, got {num_gpus!r}")
    device = str(args.get("device", "auto")).lower()
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "auto" and num_gpus == 0:
        device = "cpu"  # (with a GPU, "auto": serving.load takes it, but not for int8 graphs)
    if device == "cuda" and num_gpus == 0:
        raise ValueError(
            "device=cuda needs num_gpus (a GPU reserved for each replica): Ray hides no GPU "
            "from a replica that reserved none, so it would share one unreserved"
        )
    shared, limits = ray_args.shared_port(args), ray_args.connection_limits(args)
    grace = ray_args.close_grace(args)
    actor_options: dict[str, Any] = {"num_cpus": num_cpus}
    if num_gpus > 0:
        actor_options["num_gpus"] = num_gpus
    options: dict[str, Any] = {
        "ray_actor_options": actor_options,
        "max_ongoing_requests": ray_args.number(args, "max_ongoing_requests", int, 256),
        "health_check_period_s": 2,
        "logging_config": {
            "log_level": log_level.upper(),
            "enable_access_log": ray_args.number(args, "access_log", bool, False),
        },
    }
    if "max_replicas" in args:
        options["autoscaling_config"] = ray_args.autoscaling_config(args, shared is not None)
    else:
        options["num_replicas"] = ray_args.number(args, "num_replicas", int, 1)
    if check_dirs:  # last: the arguments' own errors first
        for directory in dirs:
            try:
                read_artifact(directory)
            except ArtifactError as error:  # (a ValueError: say which argument)
                raise ValueError(f"model_dir: {error}") from None
    deployment = serve.deployment(ServerReplica, name="skattn").options(**options)
    threads = max(1, int(num_cpus) // settings.get("instances", 1))  # the replica's CPUs, shared
    return deployment.bind(
        model_dirs, settings, threads, log_level, device, shared_port=shared,
        connection_limits=limits, close_grace=grace,
    )  # fmt: skip
