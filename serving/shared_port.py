"""Serve an app on a port that several processes share (``SO_REUSEPORT``), no proxy between.

A Ray Serve replica's requests normally pass through Ray's ingress (a Python proxy actor, or
HAProxy), a hop that costs more CPU a request than a small model's inference. With a shared
port every replica on a node listens on the same address itself, and the kernel spreads new
connections among the listening sockets (Linux hashes each connection's addresses and ports),
as nginx's ``reuseport`` and Envoy's listeners do. The replica's app answers them with the same
routes, limits and connection guards as ``python -m serving``.

:class:`SharedPortListener` wraps the app: once the app's lifespan has started (warm-up done,
batchers running) it starts a uvicorn server on the bound socket, and when the lifespan is
asked to shut down it stops that server first (no new connections; requests in flight answered
within the graceful timeout), then lets the app drain and stop. The socket is bound by
:func:`bind_shared_port` when the replica is built, so a port held by another user fails there,
and it listens only once the app is ready: the kernel routes no connection to a replica that is
still starting. A replica that stops closes its socket, and new connections go to the others.
Linux drops the connections still waiting in a closing socket's accept queue (with
``net.ipv4.tcp_migrate_req=1``, Linux 5.14 and later move them to another socket of the group).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from serving.connections import uvicorn_config
from serving.settings import ConnectionLimits, fit_to_file_limit

__all__ = ["SharedPortListener", "bind_shared_port", "reuse_port_supported"]

logger = logging.getLogger(__name__)


def reuse_port_supported() -> bool:
    """Whether this platform lets several sockets listen on one port (Linux, the BSDs, macOS;
    not Windows, where ``SO_REUSEPORT`` does not exist)."""
    return hasattr(socket, "SO_REUSEPORT")


def bind_shared_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``, not yet listening.

    ``RuntimeError`` naming the address when it cannot be bound (another user's socket there,
    a socket without ``SO_REUSEPORT``, an address this machine does not have).
    """
    if not reuse_port_supported():
        raise RuntimeError("this platform has no SO_REUSEPORT: a shared port needs Linux or BSD")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise RuntimeError(
            f"cannot bind the shared port {host}:{port}: {error.strerror or error} (every "
            "process that shares it must set SO_REUSEPORT and run as the same user)"
        ) from None
    sock.set_inheritable(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process (a Ray worker) owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SharedPortListener:
    """ASGI middleware: serve ``app`` on ``sock`` too, from its lifespan's start to its stop.

    Parameters
    ----------
    app : ASGI app
        The app, whose lifespan (start-up and shut-down) the host server runs as usual.
    sock : socket.socket
        Bound, not listening (:func:`bind_shared_port`); the listener closes it when it stops.
    limits : ConnectionLimits, optional
        Header timeout and size, connection bound, keep-alive, as for ``python -m serving``.
    log_level : str, default="warning"
        uvicorn's log level for this server.
    shutdown_timeout : float, default=30.0
        How long requests in flight may take once the listener stops, before they are cancelled.
    """

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        limits: ConnectionLimits | None = None,
        log_level: str = "warning",
        shutdown_timeout: float = 30.0,
    ) -> None:
        self.app = app
        self.sock = sock
        self.address = sock.getsockname()[:2]
        self.limits = fit_to_file_limit(ConnectionLimits() if limits is None else limits)
        self.log_level = log_level
        self.shutdown_timeout = shutdown_timeout
        self.server: _Server | None = None
        self.task: asyncio.Task | None = None
        self.stopping = False

    @property
    def failed(self) -> bool:
        """Whether the listener started and then ended without being asked to (its socket no
        longer takes connections): the replica's health check reports it."""
        return self.task is not None and self.task.done() and not self.stopping

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_started(message: dict) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self.start()
                except RuntimeError as error:  # the host server fails its start-up with it
                    message = {"type": "lifespan.startup.failed", "message": str(error)}
            await send(message)

        async def receive_stopping() -> dict:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.stop()
            return message

        await self.app(scope, receive_stopping, send_started)

    async def start(self) -> None:
        """Listen on the socket and serve; return once the server accepts connections."""
        config = uvicorn_config(
            self.app,
            self.limits,
            log_config=None,  # the process's logging, as configured
            log_level=self.log_level,
            access_log=False,  # the app logs one line per inference request
            lifespan="off",  # the host server runs the app's lifespan
            server_header=False,
            timeout_graceful_shutdown=self.shutdown_timeout,
        )
        self.server = _Server(config)
        self.task = asyncio.create_task(self._serve(), name="shared-port listener")
        while not self.server.started:
            if self.task.done():
                self.task.result()  # its RuntimeError
                raise RuntimeError(f"the shared port {self._where()} stopped while starting")
            await asyncio.sleep(0.01)
        logger.info("serving on the shared port %s", self._where())

    async def _serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        except SystemExit:  # uvicorn exits when the socket cannot listen
            raise RuntimeError(f"the shared port {self._where()} could not listen") from None
        finally:
            self.sock.close()

    async def stop(self) -> None:
        """Stop taking connections, let requests in flight finish, and close the socket."""
        self.stopping = True
        if self.task is None:
            self.sock.close()
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await self.task

    def _where(self) -> str:
        host, port = self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
