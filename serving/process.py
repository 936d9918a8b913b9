"""The server process: :func:`serve` runs the app in uvicorn until SIGTERM or SIGINT, with the
garbage collector's thresholds of a long-running server, and :func:`configure_logging` sends
every log record to stderr as a JSON line (:class:`JsonFormatter`). ``python -m serving``
(:mod:`serving.__main__`) parses its arguments, loads the models and calls both.
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import signal
import sys
from collections.abc import Mapping
from typing import Any

import uvicorn

from serving.app import begin_shutdown, create_app
from serving.connections import uvicorn_config
from serving.interface import Runtime
from serving.settings import ConnectionLimits, ServerSettings, fit_to_file_limit

__all__ = ["GC_THRESHOLDS", "LOG_LEVELS", "JsonFormatter", "configure_logging", "serve"]


#: The garbage collector's thresholds while the server runs: the youngest generation collected
#: every 20,000 allocations instead of Python's 700, the older ones as often as Python's
#: default makes them (every 10 younger collections), so that cyclic garbage does not pile up
#: in the oldest generation; start-up's objects are frozen out of it (serving.app).
GC_THRESHOLDS = (20_000, 10, 10)


def serve(
    runtimes: Mapping[str, Runtime],
    settings: ServerSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    shutdown_timeout: float | None = 30.0,
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve runtimes with uvicorn until SIGTERM or SIGINT, then drain and return.

    Parameters
    ----------
    runtimes : mapping of str to runtime
        Model name -> runtime, as for ``create_app``.
    settings : ServerSettings
        Limits and batching settings.
    host : str, default="127.0.0.1"
        The address to bind.
    port : int, default=8000
        The port to bind.
    log_level : str, default="info"
        uvicorn's log level.
    shutdown_timeout : float or None, default=30.0
        On SIGTERM, how long to wait for requests in flight before cancelling them.
    limits : ConnectionLimits, optional
        Header timeout and size, connection bound, keep-alive (defaults when omitted);
        ``max_connections`` is lowered to fit the file-descriptor limit.
    """
    app = create_app(runtimes, settings)
    limits = ConnectionLimits() if limits is None else limits
    config = server_config(app, limits, log_level, shutdown_timeout, host=host, port=port)
    server = _Server(config)
    # uvicorn re-raises the signal it caught once it has shut down; a no-op SIGTERM handler
    # underneath it turns that into a normal return, so a graceful stop exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind or the lifespan's start-up fails
        if server.started:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        gc.set_threshold(*thresholds)
    if not server.started:
        reason = app.state.startup_error or (
            f"could not listen on {host}:{port} (the log line before says why: the address in "
            "use, a name that does not resolve)"
        )
        raise SystemExit(f"error: the server could not start: {reason}")


def server_config(
    app: Any,
    limits: ConnectionLimits,
    log_level: str,
    shutdown_timeout: float | None,
    lifespan: str = "on",
    **kwargs: Any,
) -> uvicorn.Config:
    """The server's uvicorn configuration for ``app``: ``limits`` fitted to the file limit, the
    process's own logging, no access log (the app logs one line per inference request), no
    ``Server`` header; ``kwargs`` (host, port) go to uvicorn."""
    return uvicorn_config(
        app,
        fit_to_file_limit(limits),
        log_config=None,  # keep the JSON-lines handler of configure_logging
        log_level=log_level,
        access_log=False,
        lifespan=lifespan,
        server_header=False,
        timeout_graceful_shutdown=shutdown_timeout,
        **kwargs,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, which tells the app when it begins to shut down (a signal): requests
    queued then run at once, where a batching delay (``--max-delay-ms``, up to a minute) could
    outlast the shutdown timeout and end them with 503."""

    async def shutdown(self, sockets=None) -> None:
        begin_shutdown(self.config.app)
        await super().shutdown(sockets=sockets)


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message and any ``extra`` fields."""

    _RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._RESERVED})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


#: The levels the server logs at (``--log-level``, a Ray Serve replica's ``log_level``).
LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", name: str | None = None) -> None:
    """Send every log record of the logger ``name`` (``None``: the root, every logger) to
    stderr as a JSON line, at ``level`` and above. A named logger stops passing its records on
    to the root's handlers (a Ray worker's own, in a Ray Serve replica)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    if name is not None:
        logger.propagate = False
