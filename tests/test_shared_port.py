"""A port shared by several servers (SO_REUSEPORT): serving.shared_port's listener, driven by
its app's lifespan as a Ray Serve replica drives it, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import errno
import socket

import httpx
import pytest

from serving.shared_port import SharedPortListener, bind_shared_port, reuse_port_supported

pytestmark = pytest.mark.skipif(not reuse_port_supported(), reason="no SO_REUSEPORT here")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _named_app(name: str, delay: float = 0.0):
    """An ASGI app with a lifespan that answers every request with its name after ``delay``."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await asyncio.sleep(delay)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": name.encode()})

    return app


class _Lifespan:
    """Runs an app's lifespan as a host server does: start-up, then shut-down on request."""

    def __init__(self, app) -> None:
        self.app, self.inbox, self.outbox = app, asyncio.Queue(), asyncio.Queue()

    async def start(self) -> str:
        self.task = asyncio.create_task(
            self.app({"type": "lifespan"}, self.inbox.get, self.outbox.put)
        )
        await self.inbox.put({"type": "lifespan.startup"})
        return (await self.outbox.get())["type"]

    async def stop(self) -> str:
        await self.inbox.put({"type": "lifespan.shutdown"})
        answer = (await self.outbox.get())["type"]
        await self.task
        return answer


async def _get(url: str) -> str:
    """One request on a connection of its own (so the kernel picks a listener for each)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(url)
    assert response.status_code == 200
    return response.text


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


def test_listeners_share_a_port_from_their_start_to_their_stop():
    port = _free_port()

    async def scenario():
        listeners = [
            SharedPortListener(_named_app(name), bind_shared_port("127.0.0.1", port))
            for name in ("a", "b")
        ]
        lifespans = [_Lifespan(listener) for listener in listeners]
        assert _refused(port)  # bound, not listening: no connection reaches a starting app
        assert [await life.start() for life in lifespans] == ["lifespan.startup.complete"] * 2
        url = f"http://127.0.0.1:{port}/"
        answers = await asyncio.gather(*(_get(url) for _ in range(40)))
        assert set(answers) == {"a", "b"}  # the kernel spread the connections
        assert await lifespans[0].stop() == "lifespan.shutdown.complete"
        assert listeners[0].sock.fileno() == -1  # closed
        assert set(await asyncio.gather(*(_get(url) for _ in range(10)))) == {"b"}
        assert not any(listener.failed for listener in listeners)
        await lifespans[1].stop()
        assert _refused(port)

    asyncio.run(scenario())


def test_a_request_in_flight_when_the_listener_stops_is_answered():
    port = _free_port()

    async def scenario():
        life = _Lifespan(
            SharedPortListener(_named_app("slow", 0.5), bind_shared_port("127.0.0.1", port))
        )
        await life.start()
        request = asyncio.create_task(_get(f"http://127.0.0.1:{port}/"))
        await asyncio.sleep(0.2)  # the request is in the app
        stopped = asyncio.create_task(life.stop())
        assert await request == "slow"
        assert await stopped == "lifespan.shutdown.complete"

    asyncio.run(scenario())


def test_a_port_held_without_reuseport_is_refused_naming_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"shared port 127\.0\.0\.1:{port}"):
            bind_shared_port("127.0.0.1", port)


def test_a_listener_that_ends_by_itself_reports_failed():
    port = _free_port()

    async def scenario():
        listener = SharedPortListener(_named_app("a"), bind_shared_port("127.0.0.1", port))
        life = _Lifespan(listener)
        await life.start()
        assert not listener.failed
        listener.server.should_exit = True  # it ends without the lifespan asking
        await listener.task
        assert listener.failed and listener.sock.fileno() == -1
        await life.stop()  # the replica's shut-down, after
        assert not listener.failed

    asyncio.run(scenario())
