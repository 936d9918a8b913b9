"""Hostile connections (issue 14, items 2 and 3): timeouts for headers and bodies, a header
size limit, and a bound on connections that leaves room for health checks. Every server listens
on 127.0.0.1; the timeouts are shortened to fractions of a second."""

import contextlib
import gzip
import json
import logging
import socket
import time

import httpx
import pytest
from serving_doubles import ReverseRuntime
from test_server import MODEL, infer_body

from serving.__main__ import LOOPBACK_HOSTS
from serving.connections import MALFORMED as MALFORMED_ERROR
from serving.settings import ConnectionLimits, fit_to_file_limit
from serving.signals import SIGNALS

INFER = f"/v2/models/{MODEL}/infer".encode()
IMPLS = ["httptools", "h11"]


def connect(server, timeout=5.0):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return sock


def read_until_closed(sock, limit_s=5.0):
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    data = b""
    sock.settimeout(limit_s)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"the connection was still open after {limit_s} s") from None
    except ConnectionResetError:
        pass
    return data, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_body_shorter_than_its_content_length_gets_408_and_is_closed(serve, http_impl):
    server = serve(http_impl=http_impl, body_timeout_s=0.3)
    with connect(server) as sock:
        sock.sendall(b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{")
        answer, elapsed = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"body_timeout_s=0.3" in answer
    assert 0.25 < elapsed < 3
    assert server.metric("skattn_requests_total", model=MODEL, outcome="timeout") == 1
    assert server.batcher._receiving == 0 and server.batcher.queue_depth == 0


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_silent_connection_is_closed_after_the_header_timeout(serve, http_impl):
    server = serve(limits=ConnectionLimits(header_timeout_s=0.3), http_impl=http_impl)
    with connect(server) as sock:
        answer, elapsed = read_until_closed(sock)
    assert answer == b"" and 0.25 < elapsed < 3  # nothing asked, nothing answered


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_trickled_headers_get_408_and_a_kept_alive_connection_gets_a_new_deadline(serve, http_impl):
    server = serve(limits=ConnectionLimits(header_timeout_s=0.5), http_impl=http_impl)
    with connect(server) as sock:
        started = time.monotonic()
        request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
        closed = False
        for byte in request:  # one byte every 50 ms: 7 s if the server waited
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            sock.settimeout(0.001)
            try:
                if sock.recv(65536, socket.MSG_PEEK):
                    break
            except TimeoutError:
                pass
        answer, _ = read_until_closed(sock)
        assert closed or answer.startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < 3
    with connect(server) as sock:  # each request of a kept-alive connection has its deadline
        for _ in range(3):
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(2)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.3)  # 0.9 s in all: more than one header timeout
        # and a kept-alive request whose headers span reads (its timer armed after the first
        # read, the deadline from its first byte) still gets 408 in time
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer, _ = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 2


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "one-write"])
def test_headers_over_max_header_bytes_get_431(serve, http_impl, streamed):
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            if streamed:  # 100 MB would be read to the end without a limit
                for _ in range(100):
                    sock.sendall(b"a" * (1 << 20))
            else:
                sock.sendall(b"a" * 9000 + b"\r\n\r\n")
        except OSError:  # the server answered and closed while we were still sending
            pass
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"max_header_bytes=8192" in answer
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    # headers under the limit pass
    headers = {"X-Fine": "b" * 6000}
    assert httpx.get(f"{server.url}/v2/health/ready", headers=headers).status_code == 200


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("query_bytes", [9000, 100_000])
def test_a_query_string_counts_toward_max_header_bytes(serve, http_impl, query_bytes):
    # uvicorn's raw_path leaves the query out; httptools refuses a very long request line itself.
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    with connect(server) as sock:
        query = b"q=" + b"a" * query_bytes
        try:
            sock.sendall(b"GET /v2/health/ready?" + query + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:  # the server answered and closed while we were still sending
            pass
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"max_header_bytes=8192" in answer
    fine = httpx.get(f"{server.url}/v2/health/ready", params={"q": "a" * 6000})
    assert fine.status_code == 200


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_websocket_upgrade_is_answered_as_http_in_json(serve, http_impl):
    server = serve(http_impl=http_impl, allowed_hosts=LOOPBACK_HOSTS)
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    answer = httpx.get(f"{server.url}{INFER.decode()}", headers=upgrade)
    assert answer.status_code == 405 and "error" in answer.json()
    assert httpx.get(f"{server.url}/v2/health/ready", headers=upgrade).status_code == 200
    bad_host = httpx.get(f"{server.url}/v2/health/ready", headers={**upgrade, "Host": "evil"})
    assert bad_host.status_code == 400 and "error" in bad_host.json()


UPGRADE = (
    b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def statuses(answer: bytes) -> list[bytes]:
    return [line.split()[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_upgrade_request_followed_by_another_loses_nothing_silently(serve, http_impl):
    # httptools stops parsing at an Upgrade request's headers: the connection closes after
    # its answer rather than leaving the next request unanswered; h11 serves both.
    server = serve(http_impl=http_impl)
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n"
    with connect(server) as sock:
        sock.sendall(health + UPGRADE + b"\r\n" + health + b"Connection: close\r\n\r\n")
        answer, elapsed = read_until_closed(sock)
    assert statuses(answer) == ([b"200"] if http_impl == "httptools" else [b"200", b"200"])
    assert elapsed < 3  # closed after the answer, not left open until the keep-alive (5 s)


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("later", [False, True], ids=["one-read", "body-later"])
def test_an_upgrade_request_with_a_body_never_runs_its_body_as_a_request(serve, http_impl, later):
    # (h11 keeps the connection: a short keep-alive ends it for read_until_closed)
    server = serve(limits=ConnectionLimits(keep_alive_s=0.5), http_impl=http_impl)
    smuggled = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    head = (
        b"POST "
        + INFER
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + UPGRADE
        + b"Content-Length: %d\r\n\r\n" % len(smuggled)
    )
    with connect(server) as sock:
        sock.sendall(head if later else head + smuggled)
        if later:
            time.sleep(0.2)
            try:
                sock.sendall(smuggled)
            except OSError:
                pass
        answer, _ = read_until_closed(sock)
    # httptools stops at the headers: refused, and the rest is never read as a request; h11
    # reads the rest as the body it is (not JSON: 400)
    assert statuses(answer) == [b"400"], answer[:300]
    if http_impl == "httptools":
        assert b"may not carry a body" in answer


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_body_that_does_not_parse_gets_400_not_431_whatever_its_size(serve, http_impl):
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    body = b"%x\r\n" % 40_000 + b"a" * 40_000 + b"\r\nzz\r\n"  # a bad chunk size after 40 KB
    with connect(server) as sock:
        try:
            sock.sendall(
                b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"\r\n" + body
            )
        except OSError:
            pass
        answer, _ = read_until_closed(sock)
    assert statuses(answer)[:1] == [b"400"], answer[:200]
    assert b"max_header_bytes" not in answer


@pytest.mark.parametrize("http_impl", IMPLS)
def test_pipelined_requests_are_each_checked(serve, http_impl):
    # uvicorn makes each pipelined request's cycle later: each gets the checks the first gets.
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    big = b"GET /v2/health/ready?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(health + big + health)
        answer, _ = read_until_closed(sock)
    assert statuses(answer) == [b"200", b"431"], answer[:300]


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_transfer_coding_other_than_chunked_gets_501(serve, http_impl):
    # (h11 refuses the header itself: a JSON 400, as for any malformed request)

    server = serve(http_impl=http_impl)
    body = gzip.compress(json.dumps(infer_body(["abc"])).encode())
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(
            b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked
        )
        answer, _ = read_until_closed(sock)
    if http_impl == "h11":
        assert answer.startswith(b"HTTP/1.1 400 ") and b"malformed" in answer, answer[:200]
    else:
        assert answer.startswith(b"HTTP/1.1 501 "), answer[:200]
        assert b"Transfer-Encoding" in answer and b"Content-Encoding" in answer
    # the same body as Content-Encoding over chunking is what works
    with connect(server) as sock:
        sock.sendall(
            b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
            b"\r\n" + chunked
        )
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


MALFORMED = {
    "bad request line": b"GET /v2/health/ready HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "two content lengths": b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
    "bad chunk size": b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "header without a colon": b"GET /v2/health/ready HTTP/1.1\r\nHost x\r\n\r\n",
}


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_http_gets_a_json_400_and_the_server_stays_up(serve, http_impl, request_bytes):
    server = serve(http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(request_bytes)
        answer, _ = read_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["error"] == MALFORMED_ERROR
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def content_length(head: bytes) -> int:
    """A response head's Content-Length."""
    return int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])


def split_responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """Each response's head and body (by its Content-Length) in what a connection received."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = content_length(head)
        responses.append((head, rest[:length]))
        data = rest[length:]
    return responses


def response_statuses(data: bytes) -> list[bytes]:
    """The status of each response in what a connection received (answers framed by their
    Content-Length, one after another; :func:`statuses` reads status lines alone)."""
    return [head.split()[1] for head, _ in split_responses(data)]


def infer_request(sources: list[str]) -> bytes:
    body = json.dumps(infer_body(sources)).encode()
    return post_head(INFER, len(body)) + body


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("malformed", MALFORMED.values(), ids=MALFORMED.keys())
def test_requests_before_a_malformed_one_are_answered_first(serve, http_impl, malformed):
    # httptools parses a whole read at once: its 400 was written at once, ahead of the
    # earlier requests' answers, which were lost
    server = serve(http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(infer_request(["abc"]) + infer_request(["hello", "xy"]) + malformed)
        answer, _ = read_until_closed(sock)
    responses = split_responses(answer)
    assert [head.split()[1] for head, _ in responses] == [b"200", b"200", b"400"], answer
    outputs = [json.loads(body)["outputs"][0]["data"] for _, body in responses[:2]]
    assert outputs == [["cba"], ["olleh", "yx"]]
    assert json.loads(responses[2][1])["error"] == MALFORMED_ERROR


@pytest.mark.parametrize("url", [b"http://h:/", b"http://host:99999/", b"http://@/"])
def test_a_url_uvicorn_cannot_split_is_refused_after_the_requests_before_it(serve, url):
    # httptools' parser takes these; uvicorn's URL split refuses them in the headers' callback:
    # that was read as the previous request's broken body, which was dropped unanswered
    server = serve(http_impl="httptools")
    with connect(server) as sock:
        sock.sendall(HEALTH + HEALTH + b"GET " + url + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, _ = read_until_closed(sock)
    responses = split_responses(answer)
    assert [head.split()[1] for head, _ in responses] == [b"200", b"200", b"400"], answer
    assert json.loads(responses[2][1])["error"] == MALFORMED_ERROR


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_body_broken_under_its_own_early_answer_ends_the_connection_without_a_400(http_impl):
    # the 400 landed inside the answer (h11, and httptools before); deferred, it left the
    # connection open for good, the app waiting for a body that would never come
    import asyncio

    received = []

    async def answer_then_read(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"early", "more_body": True})
        while (message := await receive())["type"] == "http.request":
            received.append(message)
        received.append(message)  # http.disconnect

    async def scenario():
        protocol, transport = connected_protocol(answer_then_read, ConnectionLimits(), http_impl)
        protocol.data_received(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"
        )
        await loop_turns()
        protocol.data_received(b"zz\r\n")  # a chunk size that does not parse
        await loop_turns()
        stopped = transport.eof or transport.closed
        protocol.connection_lost(None)
        return b"".join(transport.writes), stopped

    written, stopped = asyncio.run(scenario())
    assert statuses(written) == [b"200"] and b"early" in written and b"400" not in written
    assert stopped and received[-1]["type"] == "http.disconnect", received


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_head_read_during_an_answer_is_bounded_and_refused_after_it(http_impl):
    # httptools parses a next request's head while an answer runs: it was not counted, and
    # 200 MiB of one header grew the server by 203 MB (h11 holds it unparsed in its buffer)
    import asyncio

    chunk, chunks = b"b" * (1 << 16), 1024 if http_impl == "httptools" else 4  # 64 MiB

    async def scenario():
        release = asyncio.Event()
        limits = ConnectionLimits(max_header_bytes=8192)
        protocol, transport = connected_protocol(await _stream_until(release), limits, http_impl)
        protocol.data_received(HEALTH)
        await loop_turns()
        before = rss_mb()
        protocol.data_received(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(chunks):
            protocol.data_received(chunk)
        grown = rss_mb() - before
        assert b"431" not in b"".join(transport.writes)  # not inside the answer
        return *(await release_and_end(release, protocol, transport)), grown

    written, stopped, grown = asyncio.run(scenario())
    answer, _, refusal = written.partition(b"0\r\n\r\n")  # the chunked answer's end
    assert b"last" in answer and statuses(answer) == [b"200"], written[:300]
    assert statuses(refusal) == [b"431"] and stopped, written[-300:]
    assert grown < 16, f"the server grew by {grown:.0f} MB"


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_request_begun_during_an_answer_has_the_header_timeout_not_the_keep_alive(
    serve, http_impl
):
    # uvicorn armed its keep-alive timer when the answer ended, and closed the connection,
    # part-way through that request, without an answer
    runtime = ReverseRuntime(gated=True)
    limits = ConnectionLimits(keep_alive_s=0.3, header_timeout_s=3)
    server = serve(runtime, limits=limits, http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(infer_request(["abc"]) + b"GET /v2/health/ready HTTP/1.1\r\nHo")
        assert runtime.started.acquire(timeout=10)
        runtime.release()
        time.sleep(1.0)  # past the keep-alive timeout, within the header timeout
        sock.sendall(b"st: x\r\nConnection: close\r\n\r\n")
        answer, _ = read_until_closed(sock)
    assert response_statuses(answer) == [b"200", b"200"], answer
    with connect(server) as sock:  # and the header timeout still runs for it: 408
        sock.sendall(infer_request(["abc"]) + b"GET /v2/health/ready HTTP/1.1\r\nHo")
        assert runtime.started.acquire(timeout=10)
        runtime.release()
        answer, elapsed = read_until_closed(sock, limit_s=10)
    assert response_statuses(answer) == [b"200", b"408"]


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_malformed_head_in_a_read_longer_than_the_header_limit_gets_400(serve, http_impl):
    # the whole read (its body too) was counted as the head: 431
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    with connect(server) as sock:
        try:
            sock.sendall(
                b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nX-Bad header\r\n"
                b"Content-Length: 40000\r\n\r\n" + b"a" * 40_000
            )
        except OSError:
            pass
        answer, _ = read_until_closed(sock)
    assert statuses(answer) == [b"400"], answer[:200]


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_malformed_head_read_during_an_answer_in_a_long_read_gets_400(serve, http_impl):
    # the size check of the next request's head overwrote the 400 with 431 (httptools)
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, limits=ConnectionLimits(max_header_bytes=1024), http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(infer_request(["abc"]))
        assert runtime.started.acquire(timeout=10)
        sock.sendall(b"G@T /b HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 1500)
        time.sleep(0.1)
        runtime.release()
        answer, _ = read_until_closed(sock)
    assert response_statuses(answer) == [b"200", b"400"], answer


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_head_ending_in_bare_line_feeds_is_measured_to_its_end(serve, http_impl):
    # httptools refuses bare LFs; the head's end was looked for as CRLF CRLF only, so the
    # whole read (its body too) was counted: 431 for a 50-byte head
    server = serve(limits=ConnectionLimits(max_header_bytes=1024), http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(
            b"POST " + INFER + b" HTTP/1.1\nHost: x\nContent-Length: 2000\n\n" + b"x" * 2000
        )
        answer, _ = read_until_closed(sock)
    assert statuses(answer) == [b"400"], answer[:200]


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("big", [False, True], ids=["short", "over-the-limit"])
def test_a_request_refused_behind_an_answer_arms_nothing_on_the_lingering_connection(
    serve, http_impl, big, caplog
):
    # h11 refuses the malformed request while the answer before it completes, and the
    # connection lingers; a request begun behind it was then given a header deadline (a 408
    # written after the FIN: RuntimeError), or refused at once for its size (431, likewise)
    caplog.set_level(logging.ERROR)
    limits = ConnectionLimits(header_timeout_s=0.5, max_header_bytes=1024)
    server = serve(limits=limits, http_impl=http_impl)
    begun = b"GET /v2/health/ready HTTP/1.1\r\n" + (b"X-Big: " + b"b" * 1100 if big else b"")
    with connect(server) as sock:
        sock.sendall(
            HEALTH + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
            b"Content-Length: 2\r\n\r\n" + begun
        )
        answer, _ = read_until_closed(sock)  # to the server's FIN; the socket stays open
        time.sleep(1.0)  # past the header timeout
    assert statuses(answer) == [b"200", b"400"], answer
    time.sleep(0.2)
    assert server_errors(caplog) == []


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_absolute_form_target_is_served_as_its_path(serve, http_impl):
    # RFC 9112 section 3.2.2: a server must accept it; uvicorn's h11 protocol left the scheme
    # and host in the path, and no route matched (404)
    server = serve(http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(
            b"GET http://127.0.0.1:%d/v2/health/ready HTTP/1.1\r\nHost: x\r\n"
            b"Connection: close\r\n\r\n" % server.port
        )
        answer, _ = read_until_closed(sock)
    assert statuses(answer) == [b"200"], answer[:200]


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("together", [True, False], ids=["one-read", "during-the-answer"])
def test_a_malformed_request_during_an_answer_is_refused_after_it(http_impl, together):
    # the 400 landed inside the streaming answer on httptools (or, sent in the same read as
    # the request, instead of it)
    import asyncio

    async def scenario():
        release = asyncio.Event()
        protocol, transport = connected_protocol(
            await _stream_until(release), ConnectionLimits(), http_impl
        )
        protocol.data_received(HEALTH + b"garbage\r\n\r\n" if together else HEALTH)
        await loop_turns()
        if not together:
            protocol.data_received(b"garbage\r\n\r\n")  # while the answer streams
            protocol.data_received(HEALTH)  # (dropped: nothing after a malformed request)
        await loop_turns()
        assert b"400" not in b"".join(transport.writes)
        return await release_and_end(release, protocol, transport)

    written, stopped = asyncio.run(scenario())
    answer, _, refusal = written.partition(b"0\r\n\r\n")  # the chunked answer's end
    assert b"first" in answer and b"last" in answer and statuses(answer) == [b"200"], written
    assert statuses(refusal) == [b"400"] and MALFORMED_ERROR.encode() in refusal, written
    assert stopped


@pytest.mark.parametrize("http_impl", IMPLS)
def test_half_closing_before_the_body_is_complete_closes_without_an_answer(serve, http_impl):
    # The end of a client's input is taken for its leaving (so that its queued work is
    # dropped: test_server's test_a_client_that_disconnects_leaves_no_work_behind); a close
    # and a half-close look the same from here.
    server = serve(http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{")
        sock.shutdown(socket.SHUT_WR)
        answer, elapsed = read_until_closed(sock)
    assert answer == b"" and elapsed < 3  # closed at once: the body can never complete
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def post_head(path: bytes, length: int) -> bytes:
    """The request line and headers of a JSON POST of ``length`` bytes to ``path``."""
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (path, length)
    )


def answer_early(sock, length: int) -> None:
    """Ask an unknown model with a declared body of ``length`` bytes, not sent yet: read its
    404, answered from the headers alone."""
    sock.sendall(post_head(b"/v2/models/nope/infer", length))
    assert read_response(sock)[0].startswith(b"HTTP/1.1 404 ")


def read_response(sock) -> tuple[bytes, bytes]:
    """One response's head and body (by its Content-Length) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = content_length(head)
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_early_answer_drops_the_rest_of_its_body_and_serves_the_next_request(serve, http_impl):
    # An unknown model is answered from the headers alone; the 100 kB body that follows is
    # read and dropped, not taken for the next request's headers (431 past 32 KiB, before).
    server = serve(http_impl=http_impl)
    valid = json.dumps(infer_body(["abc"])).encode()
    with connect(server) as sock:
        sock.sendall(post_head(b"/v2/models/nope/infer", 100_000))
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 404 ") and b"nope" in body
        assert b"connection: close" not in head.lower()  # 100 kB: read, dropped, kept alive
        sock.sendall(b"x" * 100_000)
        sock.sendall(post_head(INFER, len(valid)) + valid)
        head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert json.loads(body)["outputs"][0]["data"] == ["cba"]


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_after_a_dropped_body_the_connection_idles_as_kept_alive(serve, http_impl):
    # Idle between requests is keep_alive_s's, not header_timeout_s's (which closed it early)
    limits = ConnectionLimits(header_timeout_s=0.4, keep_alive_s=1.5)
    server = serve(limits=limits, http_impl=http_impl)
    valid = json.dumps(infer_body(["abc"])).encode()
    with connect(server) as sock:
        answer_early(sock, 1000)
        sock.sendall(b"x" * 1000)
        time.sleep(0.8)  # longer than the header timeout, within the keep-alive
        sock.sendall(post_head(INFER, len(valid)) + valid)
        assert read_response(sock)[0].startswith(b"HTTP/1.1 200 ")
        sock.sendall(post_head(b"/v2/models/nope/infer", 10) + b"0123456789")
        assert read_response(sock)[0].startswith(b"HTTP/1.1 404 ")
        answer, elapsed = read_until_closed(sock)  # then idle: closed after keep_alive_s
    assert answer == b"" and 1.0 < elapsed < 4


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_request_begun_where_a_dropped_body_ends_keeps_its_header_deadline(serve, http_impl):
    # Its first bytes came with the body's last: timed by header_timeout_s (2 s), not by the
    # keep-alive (1 s) that an idle connection gets, which closed it unanswered.
    limits = ConnectionLimits(header_timeout_s=2.0, keep_alive_s=1.0)
    server = serve(limits=limits, http_impl=http_impl)
    valid = json.dumps(infer_body(["abc"])).encode()
    following = post_head(INFER, len(valid)) + valid
    with connect(server) as sock:
        answer_early(sock, 1000)
        sock.sendall(b"x" * 1000 + following[:10])
        time.sleep(1.5)
        sock.sendall(following[10:])
        head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body)["outputs"][0]["data"] == ["cba"]


@pytest.mark.parametrize(
    ("path", "extra", "status"),
    [
        (b"/v2/models/nope/infer", b"", 404),  # the handler's
        (INFER, b"Origin: http://elsewhere\r\n", 403),  # the guard's refusals
        (INFER, b"Content-Type: text/plain\r\n", 415),
        (b"/v2/nothing/here", b"", 404),  # the router's
        (b"/v2/health/live", b"", 405),
        (INFER, b"", 413),  # the declared length itself
    ],
)
def test_every_early_answer_to_a_body_beyond_what_is_dropped_says_connection_close(
    serve, path, extra, status
):
    server = serve()
    cases = ((100_000_000, True), (1000, False))[: 1 if status == 413 else 2]  # 1000: no 413
    for length, closes in cases:
        with connect(server) as sock:
            head = post_head(path, length).replace(b"Host: x\r\n", b"Host: x\r\n" + extra)
            if extra.startswith(b"Content-Type"):
                head = head.replace(b"Content-Type: application/json\r\n", b"", 1)
            sock.sendall(head)
            answer, _ = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:100]
        assert (b"connection: close" in answer.lower()) is closes, (length, answer[:300])


@pytest.mark.parametrize("http_impl", IMPLS)
def test_the_dropped_rest_of_an_early_answered_body_is_bounded(serve, http_impl):
    server = serve(http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(post_head(b"/v2/models/nope/infer", 100_000_000))
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 404 ")
        assert b"connection: close" in head.lower()  # more than it reads and drops: said so
        try:
            for _ in range(100):  # 100 MB would be read and dropped to the end without a bound
                sock.sendall(b"x" * (1 << 20))
        except OSError:  # closed while we were still sending
            pass
        answer, _ = read_until_closed(sock)
    assert answer == b""  # closed with nothing more said: the request had its answer
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_at_max_connections_an_idle_connection_makes_room(serve):
    server = serve(limits=ConnectionLimits(max_connections=4, health_connections=1))
    idle = [connect(server) for _ in range(4)]
    time.sleep(0.1)
    try:
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/v2/health/ready").status_code == 200
            assert client.post(INFER.decode(), json=infer_body(["abc"])).status_code == 200
        answer, _ = read_until_closed(idle[0], limit_s=2)  # the oldest idle one was closed
        assert answer == b""
    finally:
        for sock in idle:
            sock.close()


def stalled_reader(server, requests: int = 2):
    """A client that asks ``requests`` times, pipelined, for attention maps of 256 sources (an
    answer of about a megabyte, more than the buffers take without pausing) and never reads:
    the server's writes pause, and with two or more requests the next answer waits to be
    written (a request in progress, not an idle connection)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", server.port))
    outputs = [{"name": "prediction"}, {"name": "attention"}]
    body = json.dumps(infer_body(["0123456789" * 3] * 256, outputs=outputs)).encode()
    head = b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall((head + b"Content-Length: %d\r\n\r\n" % len(body) + body) * requests)
    return sock


def open_connections(server) -> int:
    return len(server.server.server_state.connections)


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_connection_whose_answers_wait_unread_is_aborted_after_the_send_timeout(serve, http_impl):
    """No timeout covered a client that stops reading: its answers, waiting to be sent, held
    the connection (and their memory) for as long as the client kept it open."""
    server = serve(limits=ConnectionLimits(send_timeout_s=0.5), http_impl=http_impl)
    sock = stalled_reader(server, requests=1)  # answered, its answer unread: not freed either
    try:
        time.sleep(0.3)
        assert open_connections(server) == 1  # its answers wait
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and open_connections(server) > 0:
            time.sleep(0.1)
        assert open_connections(server) == 0  # aborted: the server holds nothing for it
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/v2/health/ready").status_code == 200
    finally:
        sock.close()


@pytest.mark.slow
def test_at_max_connections_a_client_that_reads_nothing_makes_room(serve):
    """Connections whose answers waited unread were neither idle nor closable: enough of them
    (520 by default, a few kilobytes each) turned every other client away with 503."""
    server = serve(limits=ConnectionLimits(max_connections=3, health_connections=0))
    stalled = [stalled_reader(server, requests=6) for _ in range(3)]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            open_connections(server) == 3  # accepted (all() of none is true: a loaded host)
            and all(c.flow.write_paused for c in server.server.server_state.connections)
        ):  # every answer waits unread, and another waits to be written
            time.sleep(0.05)
        assert open_connections(server) == 3
        time.sleep(6.5)  # their answers drained nothing for over STALL_EVICT_S (5 s)
        with httpx.Client(base_url=server.url) as client:
            assert client.post(INFER.decode(), json=infer_body(["abc"])).status_code == 200
    finally:  # closed whatever failed: left open, they warn in the next test's collection
        for sock in stalled:
            sock.close()


@pytest.mark.slow
def test_a_client_that_reads_slowly_keeps_its_answer_past_the_send_timeout(serve):
    """The timeout ran while writing was paused, not while nothing drained: a client reading
    a 5 MB answer steadily (here about 1.3 MB/s, paused for over a second) lost it at the
    timeout (at 4.0 of 5.2 MB)."""
    server = serve(limits=ConnectionLimits(send_timeout_s=0.3))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", server.port))
    with sock:
        outputs = [{"name": "prediction"}, {"name": "attention"}]
        body = json.dumps(infer_body(["0123456789" * 3] * 256, outputs=outputs)).encode()
        head = b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _length(data):
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(data)} bytes"
            data += chunk
            time.sleep(0.05)
    assert data.startswith(b"HTTP/1.1 200 ") and len(data) > 4_000_000


def _length(response: bytes) -> int:
    head, _, _ = response.partition(b"\r\n\r\n")
    return len(head) + 4 + content_length(head)


def test_a_pipelining_abort_tells_the_request_in_progress_its_client_left(serve):
    """uvicorn told only the newest (queued) request: the one in progress ran on for no one,
    and its answer went to a closed transport (an ERROR traceback)."""
    from serving.connections import MAX_PIPELINED

    runtime = ReverseRuntime(gated=True)
    server = serve(runtime)
    body = json.dumps(infer_body(["abc"])).encode()
    infer = (
        b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    with connect(server) as sock:
        sock.sendall(infer)
        assert runtime.started.acquire(timeout=10)  # in progress, held at the gate
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" * (MAX_PIPELINED + 8))
        answer, _ = read_until_closed(sock)
    assert answer == b""  # aborted
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not server.metric(
        "skattn_requests_total", model=MODEL, outcome="disconnected"
    ):
        time.sleep(0.05)
    assert server.metric("skattn_requests_total", model=MODEL, outcome="disconnected") == 1


def test_a_connection_that_pipelines_without_bound_is_aborted_and_a_few_are_served(serve):
    """uvicorn queued every request of each read: one client sending requests back to back
    grew the server by a gigabyte in five seconds."""
    from serving.connections import MAX_PIPELINED

    server = serve()
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server) as sock:  # a few deep, as clients that pipeline send them: all served
        sock.sendall(request * 8)
        answers = b""
        while answers.count(b"HTTP/1.1 200 ") < 8:
            answers += sock.recv(65536)
    with connect(server) as sock:
        sock.sendall(request * (4 * MAX_PIPELINED))
        answer, _ = read_until_closed(sock)
    assert answer.count(b"HTTP/1.1 200 ") <= MAX_PIPELINED + 2  # aborted, the rest dropped
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/v2/health/ready").status_code == 200


def test_a_connection_part_way_through_its_headers_is_not_idle(serve):
    server = serve(limits=ConnectionLimits(max_connections=2, health_connections=1))
    body = b'{"inputs":[{"name":"source","shape":[1],"datatype":"BYTES","data":["abc"]}]}'
    request = (
        b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    started = connect(server, timeout=10)
    started.sendall(request[:20])  # the oldest connection, part-way through its headers
    time.sleep(0.1)
    idle = connect(server, timeout=10)  # newer, but it has sent nothing
    time.sleep(0.1)
    newest = connect(server, timeout=10)  # over the bound: the idle one makes room
    time.sleep(0.2)
    try:
        started.sendall(request[20:])
        assert started.recv(65536).startswith(b"HTTP/1.1 200 ")
        answer, _ = read_until_closed(idle, limit_s=2)
        assert answer == b""
    finally:
        for sock in (started, idle, newest):
            sock.close()


def test_when_every_connection_is_busy_health_checks_still_get_in(serve):
    runtime = ReverseRuntime(gated=True)
    limits = ConnectionLimits(max_connections=3, health_connections=1, retry_after_s=7)
    server = serve(runtime, limits=limits)
    busy = []
    for i in range(3):  # three requests in flight, held at the runtime's gate
        sock = connect(server, timeout=10)
        body = b'{"inputs":[{"name":"source","shape":[1],"datatype":"BYTES","data":["%d"]}]}' % i
        sock.sendall(
            b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        busy.append(sock)
    assert runtime.started.acquire(timeout=10)
    time.sleep(0.1)
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:  # the health connection
            assert client.get("/v2/health/ready").status_code == 200
            refused = client.post(INFER.decode(), json=infer_body(["abc"]))
            assert refused.status_code == 503 and "health" in refused.json()["error"]
            assert refused.headers["retry-after"] == "7"
        with (
            httpx.Client(base_url=server.url, timeout=5) as a,
            httpx.Client(base_url=server.url, timeout=5) as b,
        ):
            assert a.get("/v2/health/live").status_code == 200  # the health slot, kept alive
            assert b.get("/v2/health/live").status_code == 200  # a's idle connection made room
    finally:
        runtime.release()
        for sock in busy:
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            sock.close()


def test_beyond_the_health_connections_a_new_connection_gets_503_with_retry_after(serve):
    runtime = ReverseRuntime(gated=True)
    limits = ConnectionLimits(max_connections=1, health_connections=1, retry_after_s=3)
    server = serve(runtime, limits=limits)
    busy = connect(server, timeout=10)
    body = b'{"inputs":[{"name":"source","shape":[1],"datatype":"BYTES","data":["x"]}]}'
    busy.sendall(
        b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    assert runtime.started.acquire(timeout=10)
    health = connect(server, timeout=10)  # admitted for health checks, part-way through its
    health.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # headers: not idle, so kept
    time.sleep(0.1)
    try:
        refused = connect(server, timeout=10)
        answer, _ = read_until_closed(refused)
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"\r\nretry-after: 3\r\n" in head.lower() + b"\r\n"
        assert "too many connections" in json.loads(payload)["error"]
        refused.close()
    finally:
        runtime.release()
        busy.settimeout(10)
        assert busy.recv(65536).startswith(b"HTTP/1.1 200 ")
        busy.close()
        health.close()


def test_max_connections_is_fitted_to_the_file_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 256))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: None)
    fitted = fit_to_file_limit(ConnectionLimits(max_connections=512, health_connections=8))
    assert fitted.max_connections == 256 - 8 - 64
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 4096))
    assert fit_to_file_limit(ConnectionLimits()).max_connections == 512


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        ({"header_timeout_s": 0}, "header_timeout_s"),
        ({"max_header_bytes": 10}, "max_header_bytes"),
        ({"max_connections": 0}, "max_connections"),
        ({"health_connections": -1}, "health_connections"),
        ({"keep_alive_s": float("inf")}, "keep_alive_s"),
        ({"keep_alive_s": 1e308}, "keep_alive_s"),  # finite, but the protection would be off
        ({"header_timeout_s": 3600.5}, "header_timeout_s"),
        ({"retry_after_s": 0}, "retry_after_s"),
        ({"max_connection_age_s": 0}, "max_connection_age_s"),
        ({"max_connection_age_s": float("nan")}, "max_connection_age_s"),
        ({"max_connection_age_s": 86400.5}, "max_connection_age_s"),
        ({"max_connection_age_s": "60"}, "max_connection_age_s"),
        ({"linger_s": -0.5}, "linger_s"),
        ({"linger_s": 3600.5}, "linger_s"),
        ({"linger_s": None}, "linger_s"),
    ],
)
def test_connection_limits_are_validated(limits, name):
    with pytest.raises(ValueError, match=name):
        ConnectionLimits(**limits)


def test_the_cli_maps_every_limit_to_a_flag():
    from serving.__main__ import build_parser

    args = build_parser().parse_args(
        ["--model-dir", "m", "--header-timeout-s", "2", "--body-timeout-s", "3",
         "--max-header-bytes", "4096", "--max-connections", "9", "--health-connections", "2",
         "--keep-alive-s", "1.5", "--send-timeout-s", "4", "--max-connection-age-s", "60",
         "--linger-s", "0"]
    )  # fmt: skip
    assert (args.header_timeout_s, args.body_timeout_s, args.max_header_bytes) == (2, 3, 4096)
    assert (args.max_connections, args.health_connections, args.keep_alive_s) == (9, 2, 1.5)
    assert (args.send_timeout_s, args.max_connection_age_s, args.linger_s) == (4, 60, 0)
    assert build_parser().parse_args(["--model-dir", "m"]).linger_s == 30
    assert build_parser().parse_args(["--model-dir", "m"]).max_connection_age_s is None
    none = ["--model-dir", "m", "--max-connection-age-s", "none"]
    assert build_parser().parse_args(none).max_connection_age_s is None
    assert ConnectionLimits(max_connection_age_s=7200).max_connection_age_s == 7200  # hours


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "86401"])
def test_a_bad_connection_age_on_the_command_line_is_refused_naming_its_flag(
    value, capsys, keep_logging
):
    from serving.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model-dir", "m", "--max-connection-age-s", value])
    assert exit_info.value.code == 2
    assert "--max-connection-age-s" in capsys.readouterr().err


def test_the_readme_lists_every_limit_and_timeout_with_its_default():
    from pathlib import Path

    from serving.__main__ import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### The server") : readme.index("### The attention explorer")]
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2].strip()
        for line in section.splitlines()
        if line.startswith("| `--")
    }
    parser = build_parser()
    limits = [
        action
        for action in parser._actions
        if action.option_strings
        and any(
            word in action.option_strings[0]
            for word in ("max", "timeout", "-s", "host", "connections")
        )
        and action.option_strings[0] not in ("--host",)
    ]
    assert limits
    for action in limits:
        flag = action.option_strings[0]
        assert flag in rows, f"{flag} is not in the README's table of limits"
        if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
            assert float(rows[flag]) == action.default, flag


HEALTH = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
_AB = json.dumps(infer_body(["ab"])).encode()
INFER_HEAD_AND_BODY = post_head(INFER, len(_AB)) + _AB


def closes(head: bytes) -> bool:
    return b"\r\nconnection: close" in head.lower()


@pytest.mark.parametrize("http_impl", IMPLS)
def test_the_first_answer_past_a_connections_age_says_close_and_closes_it(serve, http_impl):
    # the age is drawn within 10 % of 1 s: an answer at 0.5 s keeps the connection, the first
    # after 1.1 s says Connection: close and the connection is closed once it is sent
    server = serve(limits=ConnectionLimits(max_connection_age_s=1.0), http_impl=http_impl)
    with connect(server) as sock:
        time.sleep(0.5)
        sock.sendall(HEALTH)
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and not closes(head), head
        time.sleep(0.7)
        sock.sendall(INFER_HEAD_AND_BODY)
        answer, waited = read_until_closed(sock)
    assert statuses(answer) == [b"200"] and closes(answer.split(b"\r\n\r\n")[0]), answer
    assert b'"ba"' in answer and waited < 2.0


@pytest.mark.parametrize("http_impl", IMPLS)
def test_without_an_age_limit_a_connection_stays_open(serve, http_impl):
    server = serve(limits=ConnectionLimits(keep_alive_s=5.0), http_impl=http_impl)
    with connect(server) as sock:
        for _ in range(2):
            sock.sendall(HEALTH)
            head, _ = read_response(sock)
            assert head.startswith(b"HTTP/1.1 200") and not closes(head), head
            time.sleep(0.3)


@pytest.mark.parametrize("http_impl", IMPLS)
def test_requests_pipelined_past_the_age_are_all_answered_and_the_last_closes(serve, http_impl):
    # a close after the first answer would drop the two requests already queued behind it
    server = serve(limits=ConnectionLimits(max_connection_age_s=0.1), http_impl=http_impl)
    with connect(server) as sock:
        time.sleep(0.3)
        sock.sendall(HEALTH + INFER_HEAD_AND_BODY + HEALTH)
        answer, _ = read_until_closed(sock)
    # (the JSON body ends without a line break: the next answer's status line follows it)
    heads = [head.split(b"\r\n\r\n")[0] for head in answer.split(b"HTTP/1.1 ")[1:]]
    assert [head[:3] for head in heads] == [b"200", b"200", b"200"], answer
    assert [closes(head) for head in heads] == [False, False, True], heads


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_partly_received_request_behind_the_aged_answer_is_answered_and_closes(serve, http_impl):
    # the first answer past the age has the next request's first bytes behind it: that one,
    # once whole, is answered, and its answer closes (not the first one's, which would drop it)
    server = serve(limits=ConnectionLimits(max_connection_age_s=0.1), http_impl=http_impl)
    with connect(server) as sock:
        time.sleep(0.3)
        sock.sendall(HEALTH + INFER_HEAD_AND_BODY[:20])
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and not closes(head), head
        sock.sendall(INFER_HEAD_AND_BODY[20:])
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200") and closes(answer.split(b"\r\n\r\n")[0])
    assert b'"ba"' in answer


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_client_that_always_keeps_a_request_queued_is_closed_too(serve, http_impl):
    # the close goes with the answer to the newest request received when the age passed, not
    # always one further: a client that keeps one request queued behind the one in progress
    # would otherwise keep its connection forever
    server = serve(limits=ConnectionLimits(max_connection_age_s=0.1), http_impl=http_impl)
    with connect(server) as sock:
        sock.settimeout(5.0)
        time.sleep(0.3)
        sock.sendall(HEALTH + HEALTH)
        buffered, heads = b"", []
        while not (heads and closes(heads[-1])) and len(heads) < 10:
            while b"\r\n\r\n" not in buffered:  # (answers may come in one read)
                chunk = sock.recv(65536)
                assert chunk, f"closed without an answer saying so after {heads}"
                buffered += chunk
            head, buffered = buffered.split(b"\r\n\r\n", 1)
            buffered = buffered[content_length(head) :]  # (health answers have no body)
            heads.append(head)
            assert head.startswith(b"HTTP/1.1 200"), head
            if not closes(head):
                sock.sendall(HEALTH)  # one more queued behind the next answer
        rest, _ = read_until_closed(sock)
    # the two received when the age passed, or one more; what came after was not answered
    assert closes(heads[-1]) and len(heads) <= 3, heads
    assert buffered + rest == b""


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_aged_early_answer_to_a_request_whose_body_is_unread_closes(serve, http_impl):
    # httptools counts a request begun until its body has come: the newest request's own
    # unread body is not a request behind it
    server = serve(limits=ConnectionLimits(max_connection_age_s=0.1), http_impl=http_impl)
    with connect(server) as sock:
        time.sleep(0.3)
        sock.sendall(post_head(b"/v2/models/nope/infer", 10) + b"abc")
        answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 404") and closes(answer.split(b"\r\n\r\n")[0])


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_aged_early_answer_closes_when_its_chunked_body_stopped_mid_line(serve, http_impl):
    # h11 keeps the chunk-size line's first byte in its buffer: the newest request's body, not
    # a request behind it
    server = serve(limits=ConnectionLimits(max_connection_age_s=0.1), http_impl=http_impl)
    head = (
        b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n1"
    )
    with connect(server) as sock:
        time.sleep(0.3)
        sock.sendall(head)
        answer, waited = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 404") and closes(answer.split(b"\r\n\r\n")[0])


def test_requests_buffered_behind_an_answer_are_counted_cheaply():
    from serving.connections import MAX_PIPELINED
    from serving.http1 import requests_in

    get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    tunnel = b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"  # (a 2xx would switch)
    upgrade = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
    closing_get = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    cases = {
        b"": 0, get: 1, get + post + get: 3, get + b"GET / HT": 2, post[:-1]: 1,
        b"garbage\r\n\r\n": 1, closing_get + get: 1, b"GET / HTTP/1.0\r\n\r\n" + get: 1,
        tunnel: 1, tunnel + get: 2, get + tunnel: 2, upgrade + get: 2,
    }  # fmt: skip
    most = MAX_PIPELINED + 1
    assert {data: requests_in(data, most) for data in cases} == cases
    assert requests_in(get * 10_000, most) == most  # bounded
    one_byte_chunks = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert requests_in(one_byte_chunks + b"1\r\na\r\n" * 50_000, most) == 1  # bounded events


async def _stream_until(release):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b"last"})

    return app


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_request_sent_during_a_closing_answer_is_not_read(http_impl):
    # h11 refused the bytes of a request sent after an answer that closes had begun, and its
    # 400 was written into the middle of that (chunked) answer
    import asyncio

    async def scenario():
        release = asyncio.Event()
        limits = ConnectionLimits(max_connection_age_s=0.001)
        protocol, transport = connected_protocol(
            await _stream_until(release), limits, http_impl, "warning"
        )
        await asyncio.sleep(0.01)  # past the age
        protocol.data_received(HEALTH)
        await loop_turns()
        protocol.data_received(HEALTH)  # while the answer streams
        await loop_turns()
        return await release_and_end(release, protocol, transport)

    written, closed = asyncio.run(scenario())
    assert written.count(b"HTTP/1.1 ") == 1 and b"400" not in written, written
    assert closes(written.split(b"\r\n\r\n")[0]) and b"last" in written and closed


BODIES_COMPLETE: list[bool] = []


class RecordingTransport:
    """A transport that records each write call (``writelines`` as one)."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False  # writing shut down (a lingering close)
        self.after_eof: list[bytes] = []  # (asyncio's transports raise RuntimeError)

    def write(self, data):
        if data:  # (h11 writes an empty end of message; a transport ignores it)
            (self.after_eof if self.eof else self.writes).append(bytes(data))

    def writelines(self, chunks):
        self.write(b"".join(chunks))

    def can_write_eof(self):
        return True

    def write_eof(self):
        self.eof = True

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def set_protocol(self, protocol):
        pass


async def loop_turns(count: int = 20) -> None:
    """Let the event loop run ``count`` turns (the app's tasks, uvicorn's callbacks)."""
    import asyncio

    for _ in range(count):
        await asyncio.sleep(0)


async def release_and_end(release, protocol, transport) -> tuple[bytes, bool]:
    """Let a streaming answer (:func:`_stream_until`) end, then lose the connection: what was
    written, and whether the connection had stopped (closed, or its writing shut down)."""
    release.set()
    await loop_turns()
    stopped = transport.closed or transport.eof
    protocol.connection_lost(None)
    return b"".join(transport.writes), stopped


def connected_protocol(app, limits, http_impl: str, log_level: str = "error"):
    """The guarded protocol that ``uvicorn_config`` makes for ``app`` (with ``limits``) and a
    new :class:`RecordingTransport`, its connection made (inside a running event loop)."""
    from uvicorn.server import ServerState

    from serving.connections import uvicorn_config

    config = uvicorn_config(app, limits, http_impl=http_impl, log_level=log_level)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def drive_protocol(request: bytes, app, http_impl: str, limits=None) -> RecordingTransport:
    """Feed ``request`` to the guarded protocol over a recording transport, with ``app`` (and
    ``limits``)."""
    import asyncio

    import uvicorn

    async def scenario():
        protocol, transport = connected_protocol(app, limits, http_impl, "warning")
        protocol.data_received(request)
        await loop_turns(50)
        protocol.connection_lost(None)
        return transport

    assert uvicorn  # (imported for its server state)
    return asyncio.run(scenario())


async def answer_in_two_messages(scope, receive, send):
    if scope["type"] != "http":
        return
    BODIES_COMPLETE.append(scope[SIGNALS].body_complete)  # before the body is read
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("http_impl", IMPLS)
def test_an_answers_head_and_body_leave_in_one_write(http_impl):
    """uvicorn writes a head, then a body: the guarded protocol sends them in one system call
    (one TCP segment for a small answer); 100 Continue still goes ahead on its own. A body
    that came in the request's read is complete before the app reads it."""
    BODIES_COMPLETE.clear()
    plain = drive_protocol(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
                           answer_in_two_messages, http_impl)  # fmt: skip
    assert len(plain.writes) == 1
    assert plain.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and plain.writes[0].endswith(
        b"\r\n\r\nok"
    )
    expecting = drive_protocol(
        b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
        answer_in_two_messages,
        http_impl,
    )
    assert expecting.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert len(expecting.writes) == 2 and expecting.writes[1].endswith(b"\r\n\r\nok")
    assert BODIES_COMPLETE == [True, True]


async def answer_a_head_request(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})  # uvicorn writes no body


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_head_answer_without_a_body_write_is_sent_whole(http_impl):
    answered = drive_protocol(
        b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n",
        answer_a_head_request,
        http_impl,
    )
    both = b"".join(answered.writes)
    assert both.count(b"HTTP/1.1 200 OK") == 2 and both.endswith(b"\r\n\r\nok")  # GET's body
    assert not both.startswith(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")


def test_a_held_head_is_sent_when_its_connection_closes():
    from serving.http1 import HeadWithBody

    transport = RecordingTransport()
    held = HeadWithBody(transport)
    held.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    assert transport.writes == []  # held for the body
    held.close()  # (an app that failed after the head: uvicorn closes the connection)
    assert transport.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"]
    assert transport.closed and held.is_closing()


@pytest.mark.parametrize(
    ("head", "said"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nx: 1\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\nconnection: Upgrade, Close\r\n\r\n", "unchanged"),
        (b"HTTP/1.1 200 OK\r\nx: connection: close\r\n\r\n", None),  # (another header's)
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n", "unchanged"),  # not a whole head
    ],
)
def test_a_head_is_made_to_say_connection_close(head, said):
    from serving.http1 import with_close

    changed = with_close(head)
    if said == "unchanged":
        assert changed == head
        return
    status, *fields = changed[:-4].split(b"\r\n")
    assert changed.endswith(b"\r\n\r\n") and status == b"HTTP/1.1 200 OK"
    assert [f for f in fields if f.lower().startswith(b"connection:")] == [b"connection: close"]
    assert [f for f in fields if not f.lower().startswith(b"connection:")] == [
        f for f in head[:-4].split(b"\r\n")[1:] if not f.lower().startswith(b"connection:")
    ]


@pytest.mark.parametrize("held", [True, False], ids=["held", "not-yet-written"])
def test_a_head_held_or_written_after_say_close_says_it(held):
    from serving.http1 import HeadWithBody

    transport = RecordingTransport()
    answer = HeadWithBody(transport)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    if held:
        answer.write(head)
    answer.say_close()
    if not held:
        answer.write(head)
    answer.write(b"ok")
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    ]
    answer.say_close()  # once its head has left, nothing changes
    answer.write(b"more")
    assert transport.writes[-1] == b"more"


# -- the lingering close -------------------------------------------------------------------


def post_big_body(server, size: int) -> int:
    """POST ``size`` bytes with Python's ``http.client`` (as ``requests`` does: the whole body is
    sent before the answer is read); the answer's status."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", INFER.decode(), body=b"x" * size)
        answer = conn.getresponse()
        assert "exceeds" in json.loads(answer.read())["error"]
        return answer.status
    finally:
        conn.close()


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_client_still_sending_a_body_over_the_limit_reads_its_413(serve, http_impl):
    # closed with 16 MB unread, the socket's reset reached the client before it read the 413
    # (ConnectionResetError or BrokenPipeError, 10 times in 10 on both parsers)
    server = serve(http_impl=http_impl)
    assert [post_big_body(server, 16 << 20) for _ in range(3)] == [413] * 3


def read_431(sock) -> None:
    """Send a header over the 8 KiB limit, and read the 431 up to the server's FIN."""
    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000)
    answer, _ = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ")


def wait_until(condition, limit_s: float = 5.0) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < limit_s, "the server did not get there"
        time.sleep(0.01)


def wait_for_connections(server, count: int, limit_s: float = 5.0) -> float:
    """Seconds until the server holds ``count`` open connections."""
    started = time.monotonic()
    while open_connections(server) != count:
        assert time.monotonic() - started < limit_s, open_connections(server)
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_lingering_connection_closes_when_its_client_does(serve, http_impl):
    limits = ConnectionLimits(max_header_bytes=8192, linger_s=30)
    server = serve(limits=limits, http_impl=http_impl)
    sock = connect(server)
    read_431(sock)  # the server's FIN came after its answer
    time.sleep(0.3)
    assert open_connections(server) == 1  # lingering: it still reads
    sock.sendall(b"more of what the server will not read")
    sock.close()
    assert wait_for_connections(server, 0) < 2


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_lingering_client_that_goes_quiet_is_closed_after_the_idle_wait(
    serve, http_impl, monkeypatch
):
    monkeypatch.setattr("serving.connections.LINGER_IDLE_S", 0.5)
    server = serve(limits=ConnectionLimits(max_header_bytes=8192), http_impl=http_impl)
    with connect(server) as sock:
        started = time.monotonic()  # (before the server's linger began: a lower bound)
        read_431(sock)
        wait_for_connections(server, 0)
        assert 0.45 < time.monotonic() - started < 4


@pytest.mark.slow
@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_client_that_sends_without_end_is_closed_after_linger_s(serve, http_impl):
    limits = ConnectionLimits(max_header_bytes=8192, linger_s=0.5)
    server = serve(limits=limits, http_impl=http_impl)
    with connect(server) as sock:
        started = time.monotonic()  # (before the server's linger began: a lower bound)
        read_431(sock)
        with pytest.raises(OSError):  # a reset: the server closed with these bytes unread
            while time.monotonic() - started < 6:
                sock.sendall(b"x" * 65536)
                time.sleep(0.01)
        assert 0.45 < time.monotonic() - started < 4
    wait_for_connections(server, 0)


def test_a_lingering_connection_is_the_first_closed_for_a_new_one(serve):
    limits = ConnectionLimits(max_connections=2, health_connections=0, max_header_bytes=8192)
    server = serve(limits=limits)
    with connect(server) as idle, connect(server) as lingering:
        idle.sendall(HEALTH)  # kept alive, the longest idle once the other lingers
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")
        read_431(lingering)
        assert open_connections(server) == 2  # the one lingers
        with httpx.Client(base_url=server.url) as client:  # a third connection
            assert client.get("/v2/health/ready").status_code == 200
        idle.sendall(HEALTH)  # still open
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_connections_refused_over_capacity_read_their_503_and_stay_bounded(serve):
    runtime = ReverseRuntime(gated=True)
    limits = ConnectionLimits(max_connections=1, health_connections=0)
    server = serve(runtime, limits=limits)
    busy = connect(server, timeout=10)
    body = json.dumps(infer_body(["x"])).encode()
    busy.sendall(post_head(INFER, len(body)) + body)
    assert runtime.started.acquire(timeout=10)
    refused = []
    try:
        for _ in range(5):  # each sends a request at once, with a body too long to be read
            sock = connect(server, timeout=10)
            refused.append(sock)
            try:
                sock.sendall(post_head(INFER, 4 << 20) + b"x" * (4 << 20))
            except OSError:  # the server answered and stopped reading
                pass
            answer, _ = read_until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
            # its clients keep them open: the newest lingers, each older one was closed for it
            assert open_connections(server) <= 2
    finally:
        runtime.release()
        busy.settimeout(10)
        assert busy.recv(65536).startswith(b"HTTP/1.1 200 ")
        for sock in [busy, *refused]:
            sock.close()


@pytest.mark.parametrize("http_impl", IMPLS)
@pytest.mark.parametrize("linger_s", [30.0, 0.0])
def test_a_closing_answer_ends_the_writing_and_later_requests_are_never_started(
    http_impl, linger_s
):
    answered = drive_protocol(
        b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n",  # pipelined after it: never answered
        answer_a_head_request,
        http_impl,
        ConnectionLimits(linger_s=linger_s),
    )
    written = b"".join(answered.writes)
    assert written.count(b"HTTP/1.1 200 OK") == 1 and closes(written.split(b"\r\n\r\n")[0])
    assert answered.after_eof == []
    if linger_s:  # writing shut down (closed at the end of the drive: connection_lost)
        assert answered.eof
    else:
        assert answered.closed and not answered.eof


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_lingering_connection_outlasts_the_keep_alive_timeout(serve, http_impl):
    # (uvicorn, which sees the transport open, would arm its keep-alive timer after the answer)
    limits = ConnectionLimits(keep_alive_s=0.2, linger_s=30)
    server = serve(limits=limits, http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer, _ = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 200 ")
        for _ in range(8):  # 0.8 s, four keep-alive timeouts
            sock.sendall(b"still sending")
            time.sleep(0.1)
        assert open_connections(server) == 1
    wait_for_connections(server, 0)


#: A request refused (400) part-way through its chunked body: it is never answered.
BROKEN_CHUNKED = (
    b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nnot a chunk size\r\n"
)


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_connection_refused_part_way_through_a_body_lingers_idle(serve, http_impl):
    # its request was never answered, and it is as idle as any lingering connection
    limits = ConnectionLimits(max_connections=1, health_connections=0)
    server = serve(limits=limits, http_impl=http_impl)
    with connect(server) as broken:
        broken.sendall(BROKEN_CHUNKED)
        answer, _ = read_until_closed(broken)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert open_connections(server) == 1  # it lingers
        with httpx.Client(base_url=server.url) as client:  # closes it to come in
            assert client.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_stopping_server_does_not_wait_for_its_clients_to_close(http_impl):
    from test_server import RunningServer

    from serving.settings import ServerSettings

    runtime = ReverseRuntime(gated=True)
    server = RunningServer(runtime, ServerSettings(), ConnectionLimits(), http_impl)
    with server, connect(server) as lingering, connect(server) as in_flight:
        # refused part-way through a body: its request unanswered, the connection lingering
        lingering.sendall(BROKEN_CHUNKED)
        assert read_until_closed(lingering)[0].startswith(b"HTTP/1.1 400 ")
        body = json.dumps(infer_body(["ab"])).encode()
        in_flight.sendall(post_head(INFER, len(body)) + body)
        assert runtime.started.acquire(timeout=10)
        started = time.monotonic()
        server.server.should_exit = True  # uvicorn tells each connection, then waits for them
        time.sleep(0.3)
        runtime.release()  # the request in flight is answered
        answer, _ = read_until_closed(in_flight)  # and the connection closed after it
        assert answer.startswith(b"HTTP/1.1 200 ")
        # (uvicorn's h11 protocol closed without saying so in the answer's head)
        assert closes(answer.split(b"\r\n\r\n")[0])
        server._thread.join(timeout=10)
        # both clients keep their sockets open: neither connection lingered for them
        assert time.monotonic() - started < 3 and not server._thread.is_alive()


def server_errors(caplog) -> list[str]:
    return [
        f"{record.name}: {record.getMessage()} {record.exc_info and record.exc_info[1]}"
        for record in caplog.records
        if record.levelno >= logging.ERROR
    ]


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_request_after_the_dropped_body_bound_is_never_started(serve, http_impl, caplog):
    # the bound started the linger inside data_received, which went on to parse the read: the
    # request after the body got a task, whose answer was written after the FIN (RuntimeError)
    caplog.set_level(logging.ERROR)
    server = serve(http_impl=http_impl)
    length = 1_000_000  # at most DISCARD_BYTES: the 404 keeps the connection
    with connect(server) as sock:
        sock.sendall(post_head(b"/v2/models/nope/infer", length))
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 404 ") and not closes(head)
        sock.sendall(b"x" * (length - 1))
        time.sleep(0.3)
        later = post_head(b"/v2/models/nope/infer", 100_000) + b"y" * 100_000
        sock.sendall(b"x" + later)  # this read takes the dropped bytes past the bound
        assert read_until_closed(sock)[0] == b""  # closed, the later request unanswered
    time.sleep(0.3)
    assert server_errors(caplog) == []


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_400_inside_a_dropped_body_lingers_past_the_keep_alive_timeout(serve, http_impl):
    # h11 went on to arm uvicorn's keep-alive timer, which closed the lingering connection
    limits = ConnectionLimits(keep_alive_s=0.3, header_timeout_s=0.6)
    server = serve(limits=limits, http_impl=http_impl)
    with connect(server) as sock:
        sock.sendall(
            b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 404 ") and not closes(head)
        sock.sendall(b"2\r\n{}\r\nnot a chunk size\r\n")
        head, _ = read_response(sock)
        assert head.startswith(b"HTTP/1.1 400 ")
        for _ in range(16):  # 0.8 s: past the keep-alive and header timeouts
            sock.sendall(b"still sending")
            time.sleep(0.05)
        assert open_connections(server) == 1


def test_no_100_continue_is_written_after_the_connection_stops_writing(serve, caplog):
    # a 400 to a request that expects 100 Continue, its chunked body broken in the read that
    # completed its headers: its handler, reading its body, made uvicorn write the interim
    # answer after the FIN (RuntimeError)
    caplog.set_level(logging.ERROR)
    server = serve(http_impl="httptools")
    head = (
        b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    )
    with connect(server) as sock:
        sock.sendall(head + b"zz\r\n{}\r\n0\r\n\r\n")
        answer, _ = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"100 Continue" not in answer
    time.sleep(0.3)
    assert server_errors(caplog) == []
    assert server.metric("skattn_requests_total", model=MODEL, outcome="error") == 0


def test_an_idle_full_connection_makes_room_beside_a_health_only_one(serve):
    # the newcomer was counted against every connection, the health-only one too: 503
    runtime = ReverseRuntime(gated=True)
    server = serve(runtime, limits=ConnectionLimits(max_connections=2, health_connections=1))
    body = json.dumps(infer_body(["abc"])).encode()
    request = post_head(INFER, len(body)) + body
    connections = server.server.server_state.connections
    with connect(server) as first, connect(server) as second:
        first.sendall(request)
        second.sendall(request)
        assert runtime.started.acquire(timeout=10)
        wait_until(lambda: sum(not other._idle() for other in connections) == 2)
        with connect(server) as health:  # both busy: admitted for health checks only
            wait_until(lambda: any(other._health_only for other in connections))
            runtime.release()
            assert read_response(first)[0].startswith(b"HTTP/1.1 200 ")
            assert read_response(second)[0].startswith(b"HTTP/1.1 200 ")
            health.sendall(HEALTH)  # the most recently active
            assert read_response(health)[0].startswith(b"HTTP/1.1 200 ")
            with connect(server) as newcomer:
                newcomer.sendall(request)
                assert read_response(newcomer)[0].startswith(b"HTTP/1.1 200 ")


def test_lingering_connections_take_no_slot(serve):
    # two lingering connections on a server with one slot: the newcomer was refused
    server = serve(limits=ConnectionLimits(max_connections=1, health_connections=1))
    lingering = []
    try:
        for _ in range(2):  # one after the other: each lingers before the next comes
            sock = connect(server)
            lingering.append(sock)
            sock.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            assert read_until_closed(sock)[0].startswith(b"HTTP/1.1 200 ")
        assert open_connections(server) == 2  # both linger
        body = json.dumps(infer_body(["abc"])).encode()
        with connect(server) as newcomer:
            newcomer.sendall(post_head(INFER, len(body)) + body)
            assert read_response(newcomer)[0].startswith(b"HTTP/1.1 200 ")
            assert open_connections(server) == 2  # the longest-lingering one was closed
    finally:
        for sock in lingering:
            sock.close()


@contextlib.contextmanager
def lingering_unread_answer(http_impl: str, limits: ConnectionLimits):
    """A server whose one connection lingers with a 60 kB ``Connection: close`` answer in its
    buffer, unread by its client (under the high-water mark: writing never pauses, so the send
    timeout never runs); yields the uvicorn server and the time the request was sent."""
    import threading

    import uvicorn

    from serving.connections import uvicorn_config

    size = 60_000

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        headers = [(b"content-length", b"%d" % size), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"z" * size})

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # (accepted sockets too)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn_config(app, limits, http_impl=http_impl, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with client:
            client.connect(listener.getsockname())
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # and reads nothing
            started = time.monotonic()
            while not any(other._lingering for other in server.server_state.connections):
                assert time.monotonic() - started < 5, "the connection did not linger"
                time.sleep(0.01)
            (lingering,) = server.server_state.connections
            assert lingering.transport.get_write_buffer_size() > 0  # its answer waits, unread
            yield server, started
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_lingering_answer_its_client_never_reads_is_dropped_at_linger_s(http_impl):
    # close() waited for the buffer to drain: under the high-water mark writing never pauses,
    # so the send timeout never ran, and the connection stayed open for good
    limits = ConnectionLimits(linger_s=0.5, send_timeout_s=60)
    with lingering_unread_answer(http_impl, limits) as (server, started):
        while server.server_state.connections:
            assert time.monotonic() - started < 5, "the lingering connection stayed open"
            time.sleep(0.05)


@pytest.mark.parametrize("http_impl", IMPLS)
def test_a_stopping_server_drops_a_lingering_answer_its_client_never_reads(http_impl):
    # the stop closed a lingering connection with close(), which waited for the drain: the
    # stop waited for the linger's idle wait (5 s)
    limits = ConnectionLimits(linger_s=30, send_timeout_s=60)
    with lingering_unread_answer(http_impl, limits) as (server, _):
        started = time.monotonic()
        server.should_exit = True  # uvicorn waits for its connections to close
        while server.server_state.connections:
            assert time.monotonic() - started < 3, "the stop waited for the unread answer"
            time.sleep(0.05)
