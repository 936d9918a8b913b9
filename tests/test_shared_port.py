"""A port shared by several servers (SO_REUSEPORT): serving.shared_port's listener, driven by
its app's lifespan as a Ray Serve replica drives it, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import errno
import socket

import httpx
import pytest

from serving.settings import ConnectionLimits
from serving.shared_port import (
    SharedPortListener,
    bind_shared_port,
    check_shared_host,
    reuse_port_supported,
)

pytestmark = pytest.mark.skipif(not reuse_port_supported(), reason="a shared port needs Linux")


def _named_app(name: str, arrived=None, release=None, start: str = "complete"):
    """An ASGI app with a lifespan (whose start-up ends ``start``) that answers every request
    with its name; with ``arrived``, it sets that event as a request comes in and answers once
    ``release`` is set."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                ending = start if kind == "startup" else "complete"
                await send({"type": f"lifespan.{kind}.{ending}"})
                if kind == "shutdown" or ending == "failed":
                    return
        if arrived is not None:
            arrived.set()
            await release.wait()
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


def _port(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def test_listeners_share_a_port_from_their_start_to_their_stop():
    async def scenario():
        first = bind_shared_port("127.0.0.1", 0)  # the kernel's free port, then shared
        port = _port(first)
        sockets = [first, bind_shared_port("127.0.0.1", port)]
        listeners = [
            SharedPortListener(_named_app(name), sock)
            for name, sock in zip("ab", sockets, strict=True)
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
    async def scenario():
        arrived, release = asyncio.Event(), asyncio.Event()
        sock = bind_shared_port("127.0.0.1", 0)
        port = _port(sock)
        life = _Lifespan(SharedPortListener(_named_app("slow", arrived, release), sock))
        await life.start()
        request = asyncio.create_task(_get(f"http://127.0.0.1:{port}/"))
        await arrived.wait()  # the request is in the app
        stopped = asyncio.create_task(life.stop())
        for _ in range(100):  # the server sees the stop at its next tick (0.1 s)
            await asyncio.sleep(0.05)
            if _refused(port):
                break
        assert _refused(port) and not stopped.done()  # no new connection; waiting for it
        release.set()
        assert await request == "slow"
        assert await stopped == "lifespan.shutdown.complete"

    asyncio.run(scenario())


async def _late_request(grace: float, delay: float) -> bytes:
    """Open a connection to a listener (``close_grace=grace``) and, once it is accepted, stop
    the listener and send a request ``delay`` seconds later; what the connection reads back."""
    listener = SharedPortListener(
        _named_app("late"), bind_shared_port("127.0.0.1", 0), close_grace=grace
    )
    life = _Lifespan(listener)
    await life.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(listener.sock))
    for _ in range(100):  # accepted by the server
        if listener.server.server_state.connections:
            break
        await asyncio.sleep(0.01)
    stopped = asyncio.create_task(life.stop())
    await asyncio.sleep(delay)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        answer = b""
    finally:
        writer.close()
    assert await stopped == "lifespan.shutdown.complete"
    return answer


def test_a_connection_accepted_just_before_the_stop_has_its_request_answered():
    """uvicorn's shut-down closes a connection that has not sent its request yet: the client,
    which had connected before the stop, would meet a reset. The listener closes its socket
    first and waits ``close_grace`` before it closes the idle connections."""
    answer = asyncio.run(_late_request(grace=1.0, delay=0.3))
    assert answer.startswith(b"HTTP/1.1 200") and b"\r\nlate\r\n" in answer
    # without the grace: closed unread (what the grace is for)
    assert asyncio.run(_late_request(grace=0.0, delay=0.5)) == b""


def test_a_kept_alive_client_is_told_to_close_while_the_listener_stops():
    """Its next request would otherwise race the idle connection's close at the grace's end:
    each answer in the grace says Connection: close, and the client reconnects elsewhere."""

    async def scenario():
        listener = SharedPortListener(
            _named_app("a"), bind_shared_port("127.0.0.1", 0), close_grace=1.0
        )
        life = _Lifespan(listener)
        await life.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(listener.sock))

        async def ask() -> bytes:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readuntil(b"0\r\n\r\n")  # the chunked body's end
            return head.lower()

        assert b"connection: close" not in await ask()  # kept alive
        port = _port(listener.sock)
        stopped = asyncio.create_task(life.stop())
        await asyncio.sleep(0.2)  # the grace running
        assert _refused(port)  # the socket closed first: new connections go elsewhere
        assert b"connection: close" in await ask()  # answered, and told to go
        assert await asyncio.wait_for(reader.read(), 5) == b""  # then closed by the server
        writer.close()
        assert await stopped == "lifespan.shutdown.complete"

    asyncio.run(scenario())


def test_the_listener_counts_its_requests_in_flight():
    async def scenario():
        arrived, release = asyncio.Event(), asyncio.Event()
        listener = SharedPortListener(
            _named_app("slow", arrived, release), bind_shared_port("127.0.0.1", 0)
        )
        life = _Lifespan(listener)
        await life.start()
        assert listener.ongoing == 0
        request = asyncio.create_task(_get(f"http://127.0.0.1:{_port(listener.sock)}/"))
        await arrived.wait()
        assert listener.ongoing == 1  # in the app
        release.set()
        assert await request == "slow"
        assert listener.ongoing == 0
        await life.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("age", [None, 0.1])
def test_a_kept_alive_client_reaches_a_listener_started_after_it_only_with_an_age_limit(age):
    """The kernel spreads connections, not requests: a client's kept-alive connection stays
    on the listener it met. With ``max_connection_age_s`` the connection is closed every
    0.1 s or so and each new one is spread anew, so the client reaches the later listener too
    (about 20 new connections: all on one listener by chance once in 2**19 runs)."""

    async def scenario() -> set[str]:
        first = bind_shared_port("127.0.0.1", 0)
        port = _port(first)
        limits = ConnectionLimits(max_connection_age_s=age)
        lives = [_Lifespan(SharedPortListener(_named_app("a"), first, limits=limits))]
        await lives[0].start()
        url = f"http://127.0.0.1:{port}/"
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
            assert (await client.get(url)).text == "a"  # connected to the only listener
            second = bind_shared_port("127.0.0.1", port)
            lives.append(_Lifespan(SharedPortListener(_named_app("b"), second, limits=limits)))
            await lives[1].start()
            answers = set()
            stop = asyncio.get_running_loop().time() + 2.0
            while asyncio.get_running_loop().time() < stop:
                response = await client.get(url)
                assert response.status_code == 200
                answers.add(response.text)
        for life in lives:
            await life.stop()
        return answers

    assert asyncio.run(scenario()) == ({"a"} if age is None else {"a", "b"})


@pytest.mark.parametrize(
    ("setting", "says"), [("0\n", "is 0 on"), (None, "missing"), ("1\n", None)]
)
def test_a_node_without_tcp_migrate_req_is_warned_of(tmp_path, monkeypatch, setting, says):
    import serving.shared_port as shared_port

    switch = tmp_path / "tcp_migrate_req"
    if setting is not None:
        switch.write_text(setting)
    monkeypatch.setattr(shared_port, "MIGRATE_REQ", switch)
    warning = shared_port.migration_warning()
    if says is None:
        assert warning is None
    else:
        assert says in warning and socket.gethostname() in warning
        assert "sysctl -w net.ipv4.tcp_migrate_req=1" in warning


def test_a_port_held_without_reuseport_is_refused_naming_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"shared port 127\.0\.0\.1:{port}"):
            bind_shared_port("127.0.0.1", port)


def test_a_listener_that_ends_by_itself_reports_failed_and_why(caplog):
    async def scenario():
        listener = SharedPortListener(_named_app("a"), bind_shared_port("127.0.0.1", 0))
        life = _Lifespan(listener)
        await life.start()
        assert not listener.failed and listener.error is None
        listener.server.should_exit = True  # it ends without the lifespan asking
        await listener.task
        await asyncio.sleep(0)  # its done-callback
        assert listener.failed and listener.sock.fileno() == -1
        assert listener.error == "it returned"
        await life.stop()  # the replica's shut-down, after

    with caplog.at_level("ERROR", logger="serving.shared_port"):
        asyncio.run(scenario())
    assert "stopped serving: it returned" in caplog.text


def test_start_up_failures_close_the_socket_and_reach_the_host_server():
    async def scenario():
        # the app's own start-up fails: nothing will listen
        sock = bind_shared_port("127.0.0.1", 0)
        life = _Lifespan(SharedPortListener(_named_app("a", start="failed"), sock))
        assert await life.start() == "lifespan.startup.failed"
        assert sock.fileno() == -1
        # the app started, the listener cannot: the host server hears the start-up failed
        sock = bind_shared_port("127.0.0.1", 0)
        listener = SharedPortListener(_named_app("b"), sock)
        sock.close()  # as if taken away
        life = _Lifespan(listener)
        assert await life.start() == "lifespan.startup.failed"
        assert not listener.failed  # a start-up's failure, not a running listener's
        await life.stop()  # the host's shut-down of the started app still runs

    asyncio.run(scenario())


def test_the_shared_host_is_an_ip_address():
    assert check_shared_host("[::1]") == "::1" and check_shared_host("0.0.0.0") == "0.0.0.0"
    for bad in ("", "localhost", "300.1.1.1", "[::1"):
        with pytest.raises(ValueError, match="shared_host must be an IP address"):
            check_shared_host(bad)
    with pytest.raises(ValueError, match="shared_host"):
        bind_shared_port("example.org", 0)
