"""Serve an app on a port that several processes share (``SO_REUSEPORT``), no proxy between.

A Ray Serve replica's requests normally pass through Ray's ingress (a Python proxy actor, or
HAProxy), a hop that costs more CPU a request than a small model's inference. With a shared
port every replica on a node listens on the same address itself, and the kernel spreads new
connections among the listening sockets (Linux hashes each connection's addresses and ports),
as nginx's ``reuseport`` and Envoy's listeners do. The replica's app answers them with the same
routes and connection guards as ``python -m serving``.

:class:`SharedPortListener` wraps the app: once the app's lifespan has started (warm-up done,
batchers running) it starts a uvicorn server on the bound socket, and when the lifespan is
asked to shut down it stops that server first (no new connections; the requests on open
connections answered, those in flight within ``shutdown_timeout``), then lets the app drain and
stop. The socket is bound by :func:`bind_shared_port` when the replica is built, so a port held
by another user fails there, and it listens only once the app is ready: the kernel routes no
connection to a replica that is still starting. A replica that stops closes its socket, and new
connections go to the others.
Linux resets the connections still waiting in a closing socket's accept queue; with
``net.ipv4.tcp_migrate_req=1`` (Linux 5.14 and later) it moves them to another socket of the port
(:func:`migrates_queued_connections`). The listener counts its requests in flight
(:attr:`SharedPortListener.ongoing`), which Ray's autoscaler does not see
(:mod:`serving.ray_autoscaling`).

Linux only: macOS's ``SO_REUSEPORT`` lets the sockets share the port but gives every connection
to one of them, FreeBSD spreads them only with ``SO_REUSEPORT_LB``, and Windows has neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from serving.http1 import closing
from serving.process import server_config
from serving.settings import ConnectionLimits

__all__ = [
    "CLOSE_GRACE_S",
    "SharedPortListener",
    "bind_shared_port",
    "check_shared_host",
    "migrates_queued_connections",
    "migration_warning",
    "reuse_port_supported",
]

logger = logging.getLogger(__name__)


def reuse_port_supported() -> bool:
    """Whether the kernel spreads a shared port's connections among its sockets (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


#: Seconds a stopping listener answers on its open connections after closing its socket.
CLOSE_GRACE_S = 0.5

#: Linux's switch for moving a closing listener's waiting connections to another socket of its
#: port (per network namespace).
MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def migrates_queued_connections() -> bool | None:
    """Whether this kernel moves the connections waiting in a closing shared-port socket's
    accept queue to another socket of the port (``net.ipv4.tcp_migrate_req``): ``None`` where it
    cannot say (not Linux, a kernel before 5.14, or unreadable)."""
    try:
        return MIGRATE_REQ.read_text().strip() != "0"
    except OSError:
        return None


def migration_warning() -> str | None:
    """What a replica that stops costs on this node when ``tcp_migrate_req`` is not 1 (0, or
    missing on Linux before 5.14), and how to mend it; None where it is 1 or not Linux."""
    migrates = migrates_queued_connections()
    if migrates or not sys.platform.startswith("linux"):
        return None
    setting = "0" if migrates is False else "missing (Linux before 5.14)"
    return (
        f"net.ipv4.tcp_migrate_req is {setting} on {socket.gethostname()}: a replica that stops "
        "(scale-down, redeploy) resets the connections waiting in its shared port's accept "
        "queue; set it to 1 on every node that runs replicas (sysctl -w "
        "net.ipv4.tcp_migrate_req=1) to move them to another replica"
    )


def check_shared_host(host: str) -> str:
    """``host`` as an IP address to bind (``[::1]``'s brackets dropped); ``ValueError`` naming
    ``shared_host`` otherwise. An address, not a name: each replica binds it on its own node."""
    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise ValueError(
            f"shared_host must be an IP address (0.0.0.0 or :: for every interface, 127.0.0.1 "
            f"or ::1 for the loopback), got {host!r}"
        ) from None


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_shared_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to the IP address ``host`` and ``port`` with ``SO_REUSEPORT``, not
    yet listening.

    ``ValueError`` when ``host`` is not an IP address; ``RuntimeError`` naming the address when
    it cannot be bound (another user's socket there, a socket without ``SO_REUSEPORT``, an
    address this machine does not have) or the platform does not spread a shared port.
    """
    host = check_shared_host(host)
    if not reuse_port_supported():
        raise RuntimeError("a shared port needs Linux's SO_REUSEPORT, which spreads connections")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise RuntimeError(
            f"cannot bind the shared port {_where(host, port)}: {error.strerror or error} "
            "(every process that shares it must set SO_REUSEPORT and run as the same user)"
        ) from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process (a Ray worker) owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _PortApp:
    """ASGI middleware, the app as the shared port serves it: its HTTP requests in flight
    counted in ``ongoing``; once ``draining``, every answer closes its connection
    (``Connection: close``), so that a kept-alive client's next request opens a connection,
    which the kernel gives to another replica."""

    def __init__(self, app: Any) -> None:
        self.app, self.ongoing, self.draining = app, 0, False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: dict) -> None:
            if self.draining and message["type"] == "http.response.start":
                message = closing(message)
            await send(message)

        self.ongoing += 1
        try:
            await self.app(scope, receive, send_closing)
        finally:
            self.ongoing -= 1


class SharedPortListener:
    """ASGI middleware: serve ``app`` on ``sock`` too, from its lifespan's start to its stop.

    Parameters
    ----------
    app : ASGI app
        The app, whose lifespan (start-up and shut-down) the host server runs as usual.
    sock : socket.socket
        Bound, not listening (:func:`bind_shared_port`); the listener closes it when it stops,
        or when the app's start-up fails.
    limits : ConnectionLimits, optional
        Header timeout and size, connection bound, keep-alive, as for ``python -m serving``
        (its defaults when omitted).
    log_level : str, default="warning"
        uvicorn's log level for this server.
    shutdown_timeout : float, default=15.0
        How long the listener's stop may take (its ``close_grace``, then the requests in
        flight, which are cancelled after it): under Ray Serve's ``graceful_shutdown_timeout_s``
        (20 s by default), after which Ray ends the replica's process.
    close_grace : float, default=CLOSE_GRACE_S (0.5)
        Seconds, counted within ``shutdown_timeout``, between closing the socket (the port's
        new connections go to the other replicas) and closing the idle connections: a
        connection accepted just before the stop sends its first request meanwhile, and it is
        answered, not closed unread; each answer meanwhile says ``Connection: close``, so a
        kept-alive client that asks meanwhile moves to another replica after its answer, not
        in the middle of a request.

    If the listener cannot start after the app has (``lifespan.startup.complete``), the host
    server is told the start-up failed; the app stays started until the host ends the process,
    as Ray Serve does with a replica whose start-up failed.
    """

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        limits: ConnectionLimits | None = None,
        log_level: str = "warning",
        shutdown_timeout: float = 15.0,
        close_grace: float = CLOSE_GRACE_S,
    ) -> None:
        if not 0 <= close_grace < shutdown_timeout:
            raise ValueError(
                f"close_grace must be >= 0 and below shutdown_timeout ({shutdown_timeout} s), "
                f"got {close_grace!r}"
            )
        self.app = app
        self.sock = sock
        self.limits = ConnectionLimits() if limits is None else limits
        self.log_level = log_level
        self.shutdown_timeout = shutdown_timeout
        self.close_grace = close_grace
        self.server: _Server | None = None
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.error: str | None = None  # why the listener ended by itself
        self.address = "(not started)"
        self.port_app = _PortApp(app)  # the app as the shared port serves it

    @property
    def ongoing(self) -> int:
        """The shared port's HTTP requests in flight (Ray's autoscaler does not see them)."""
        return self.port_app.ongoing

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
            if message["type"] == "lifespan.startup.complete" and not self.stopping:
                try:
                    await self.start()
                except Exception as error:  # the host server fails its start-up with it
                    message = {"type": "lifespan.startup.failed", "message": str(error)}
            elif message["type"] == "lifespan.startup.failed":
                self.sock.close()  # the app did not start: nothing will listen
            await send(message)

        async def receive_stopping() -> dict:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.stop()
            return message

        await self.app(scope, receive_stopping, send_started)

    async def start(self) -> None:
        """Listen on the socket and serve; return once the server accepts connections."""
        try:
            self.address = _where(*self.sock.getsockname()[:2])
            config = server_config(  # the host server runs the app's lifespan
                self.port_app, self.limits, self.log_level,
                self.shutdown_timeout - self.close_grace, lifespan="off",
            )  # fmt: skip
            self.server = _Server(config)
            self.task = asyncio.create_task(self._serve(), name="shared-port listener")
            while not self.server.started:
                if self.task.done():
                    self.task.result()  # its error
                    raise RuntimeError(f"the shared port {self.address} stopped while starting")
                await asyncio.sleep(0.01)
        except BaseException:
            self.stopping = True  # not a failure of a running listener: the start-up's
            self.sock.close()
            raise
        self.task.add_done_callback(self._ended)
        logger.info("serving on the shared port %s", self.address)

    async def _serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    def _ended(self, task: asyncio.Task) -> None:
        """Log a listener that ended without being asked to, and keep why for the health check."""
        if self.stopping:
            return
        error = None if task.cancelled() else task.exception()
        self.error = repr(error) if error is not None else "it returned"
        logger.error("the shared port %s stopped serving: %s", self.address, self.error)

    async def stop(self) -> None:
        """Close the socket, answer the requests that arrive on open connections within
        ``close_grace`` and those in flight, then close the connections."""
        self.stopping = True
        if self.task is None:
            self.sock.close()
            return
        for server in self.server.servers:  # no new connections (uvicorn's shutdown does it too)
            server.close()
        # a connection accepted just now may not have sent its request yet, and a kept-alive
        # client may be sending its next: uvicorn's shut-down closes an idle connection at
        # once, and the request would meet a reset. Meanwhile every answer closes its connection.
        self.port_app.draining = True
        if self.server.server_state.connections:  # (none open: nothing to wait for)
            await asyncio.sleep(self.close_grace)
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await self.task
