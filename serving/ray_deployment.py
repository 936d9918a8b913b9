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

Several models: ``model_dir=DIR1,DIR2`` (and ``model_name=A,B``). ``max_replicas`` turns on
Ray Serve's autoscaling between ``min_replicas`` and ``max_replicas``, aiming at
``target_ongoing_requests`` per replica, in place of a fixed ``num_replicas``. Health and
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
        [shared_host=0.0.0.0]

``benchmarks/bench_cluster.py`` measures the three ingresses. Ray's access log is off by default,
as in ``python -m serving``: the server logs one JSON line per inference request itself (at
``log_level`` info and below), to the replica's log file.

This module imports Ray; the plain server never imports it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from ray import serve

from serving.app import create_app
from serving.artifact import ArtifactError, read_artifact
from serving.process import LOG_LEVELS, configure_logging
from serving.runtime import load
from serving.settings import ConnectionLimits, ServerSettings, check_model_name
from serving.shared_port import (
    SharedPortListener,
    bind_shared_port,
    check_shared_host,
    reuse_port_supported,
)

__all__ = ["REPLICA_HEADER", "THROUGHPUT_ENV", "ServerReplica", "build"]

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
    ) -> None:
        configure_logging(log_level, "serving")
        # bound first, so that a port another user holds fails the replica before the models load
        self.shared_socket = None if shared_port is None else bind_shared_port(*shared_port)
        self.log_level = log_level
        self.connection_limits = dict(connection_limits or {})
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
        self.listener = SharedPortListener(app, self.shared_socket, limits=limits, log_level=level)
        return self.listener

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


def _number(args: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """``args[key]`` as ``kind`` (``serve run`` passes strings); ``ValueError`` naming it."""
    if key not in args:
        return default
    value = args[key]
    if kind is bool and isinstance(value, str):
        flags = {"true": True, "1": True, "false": False, "0": False}
        if value.lower() not in flags:
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return flags[value.lower()]
    if kind is tuple:  # allowed_hosts: comma-separated names
        return tuple(value.split(",")) if isinstance(value, str) else tuple(value)
    # from Python (or YAML), only a value of the kind: int(1.7), int(True) and bool(2) would
    # pass; a flag may be 1 or 0, as its string may
    if kind is bool and isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    expected = {int: (numbers.Integral,), float: (numbers.Real,)}.get(kind, ())
    if not isinstance(value, str) and (not isinstance(value, expected) or isinstance(value, bool)):
        raise ValueError(f"{key} must be {_KIND_NAMES[kind]}, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {_KIND_NAMES[kind]}, got {value!r}") from None


_KIND_NAMES = {int: "an int", float: "a number", bool: "true or false", str: "a str"}


def _settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ServerSettings`` fields among ``args``, converted to their fields' types."""
    kinds = {
        name: type(field.default) for name, field in ServerSettings.__dataclass_fields__.items()
    }
    kinds["allowed_hosts"] = tuple
    settings = {key: _number(args, key, kind) for key, kind in kinds.items() if key in args}
    ServerSettings(**settings)  # bad settings fail here, not in every replica
    return settings


#: The shared port's connection limits that ``build`` takes by name (``ConnectionLimits`` fields,
#: as ``python -m serving``'s flags); ``retry_after_s`` is a server setting, for both 503s.
LIMIT_ARGS = tuple(
    name for name in ConnectionLimits.__dataclass_fields__ if name != "retry_after_s"
)


def _limits(args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ConnectionLimits`` fields among ``args``, converted; only with ``shared_port``."""
    given = [key for key in LIMIT_ARGS if key in args]
    if given and "shared_port" not in args:
        raise ValueError(
            f"{given[0]} limits the shared port's connections: give shared_port too (Ray's "
            "ingress has its own)"
        )
    fields = ConnectionLimits.__dataclass_fields__
    limits = {key: _number(args, key, type(fields[key].default)) for key in given}
    ConnectionLimits(**limits)  # bad limits fail here, not in every replica
    return limits


#: ``build``'s own arguments; the others it takes are ``ServerSettings`` fields and
#: :data:`LIMIT_ARGS`.
BUILD_ARGS = (
    "model_dir", "model_name", "num_replicas", "num_cpus", "num_gpus", "device",
    "max_ongoing_requests", "min_replicas", "max_replicas", "target_ongoing_requests",
    "log_level", "access_log", "check_model_dir", "shared_port", "shared_host",
)  # fmt: skip


def _shared_port(args: Mapping[str, Any]) -> tuple[str, int] | None:
    """``(shared_host, shared_port)`` from ``args``, or ``None`` without ``shared_port``."""
    if "shared_port" not in args:
        if "shared_host" in args:
            raise ValueError("shared_host is the shared port's address: give shared_port too")
        return None
    port = _number(args, "shared_port", int)
    if not 1 <= port <= 65535:
        raise ValueError(f"shared_port must be a TCP port, 1 to 65535, got {port!r}")
    if "max_replicas" in args:
        raise ValueError(
            "shared_port needs a fixed num_replicas: Ray's autoscaler counts only the requests "
            "its own ingress routes, not those the replicas take on the shared port"
        )
    if not reuse_port_supported():
        raise ValueError(
            "shared_port needs Linux: elsewhere SO_REUSEPORT does not spread the connections"
        )
    return check_shared_host(str(args.get("shared_host", "127.0.0.1"))), port


def build(args: Mapping[str, Any]) -> serve.Application:
    """The Ray Serve application of ``serve run serving.ray_deployment:build key=value ...``.

    ``args`` (strings from the command line, or values from Python): ``model_dir`` (required;
    comma-separated for several), ``model_name``, ``num_replicas`` (default 1), ``num_cpus``
    (per replica, default 1), ``num_gpus`` (per replica, default 0; a replica with one runs on
    CUDA, an int8 artifact on the CPU), ``device`` (``cpu``, or ``cuda`` with ``num_gpus``;
    default: ``serving.load``'s ``auto`` when ``num_gpus`` is given, else ``cpu``),
    ``max_ongoing_requests`` (per replica, default 256: the batcher needs concurrent requests
    to form batches), ``min_replicas`` /
    ``max_replicas`` / ``target_ongoing_requests`` (autoscaling, in place of
    ``num_replicas``), ``log_level`` (default ``info``: the server's own logs, one line per
    inference request as ``python -m serving`` writes them, and Ray Serve's logger in the
    replica), ``access_log`` (Ray's own line per HTTP request, default false),
    ``check_model_dir`` (default true: each ``model_dir`` is read here, as ``serving.load``
    reads it, so that a bad one is this ``ValueError`` and not a replica that fails to start;
    false where only the replicas' nodes hold the folders), ``shared_port`` (every replica
    on a node also listens on this port itself, with ``SO_REUSEPORT``, so its clients skip
    Ray's ingress: see :mod:`serving.shared_port`; with a fixed ``num_replicas`` only) and
    ``shared_host`` (its IP address, default ``127.0.0.1``; Linux only) and the shared port's
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
    autoscaling = ("min_replicas", "target_ongoing_requests")
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
    check_dirs = _number(args, "check_model_dir", bool, True)
    if "max_queue" in args and "max_items_per_request" not in args:  # as python -m serving
        queue = _number(args, "max_queue", int)
        args = {**args, "max_items_per_request": min(ServerSettings.max_items_per_request, queue)}
    settings = _settings(args)
    num_cpus = _number(args, "num_cpus", float, 1.0)
    if not (math.isfinite(num_cpus) and num_cpus > 0):
        raise ValueError(f"num_cpus must be a finite number of CPUs > 0, got {num_cpus!r}")
    log_level = str(args.get("log_level", "info")).lower()
    if log_level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    num_gpus = _number(args, "num_gpus", float, 0.0)
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
    shared, limits = _shared_port(args), _limits(args)
    actor_options: dict[str, Any] = {"num_cpus": num_cpus}
    if num_gpus > 0:
        actor_options["num_gpus"] = num_gpus
    options: dict[str, Any] = {
        "ray_actor_options": actor_options,
        "max_ongoing_requests": _number(args, "max_ongoing_requests", int, 256),
        "health_check_period_s": 2,
        "logging_config": {
            "log_level": log_level.upper(),
            "enable_access_log": _number(args, "access_log", bool, False),
        },
    }
    if "max_replicas" in args:
        options["autoscaling_config"] = {
            "min_replicas": _number(args, "min_replicas", int, 1),
            "max_replicas": _number(args, "max_replicas", int),
            "target_ongoing_requests": _number(args, "target_ongoing_requests", float, 32.0),
        }
    else:
        options["num_replicas"] = _number(args, "num_replicas", int, 1)
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
        connection_limits=limits,
    )  # fmt: skip
