"""Requests a browser page could forge (issue 14, item 7): Content-Type, Host, Origin, and
HEAD on the health routes. Every server listens on 127.0.0.1."""

import re

import httpx
import pytest
from serving_doubles import ReverseRuntime
from test_server import MODEL, RunningServer, infer_body

from serving.__main__ import LOOPBACK_HOSTS, allowed_hosts
from serving.app import ServerSettings
from serving.guard import host_name

INFER = f"/v2/models/{MODEL}/infer"


@pytest.fixture
def server():
    settings = ServerSettings(allowed_hosts=LOOPBACK_HOSTS)
    with RunningServer(ReverseRuntime(), settings) as running:
        yield running


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x"],
)  # fmt: skip
def test_an_inference_request_of_a_type_a_page_may_post_gets_415(server, content_type):
    import json

    body = json.dumps(infer_body(["abc"]))
    response = httpx.post(server.url + INFER, content=body, headers={"Content-Type": content_type})
    assert response.status_code == 415
    assert "Content-Type" in response.json()["error"]
    assert server.runtime.calls == []


@pytest.mark.parametrize(
    "headers",
    [{"Content-Type": "application/json"}, {"Content-Type": "application/json; charset=utf-8"},
     {}],
)  # fmt: skip
def test_json_and_untyped_bodies_are_served(server, headers):
    import json

    body = json.dumps(infer_body(["abc"])).encode()
    response = httpx.post(server.url + INFER, content=body, headers=headers)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == ["cba"]


def test_binary_extension_requests_are_served_through_tritonclient(server):
    from test_server import source_input

    client = server.triton()
    try:
        answer = client.infer(MODEL, [source_input(["12345"])]).as_numpy("prediction")
    finally:
        client.close()
    assert answer.tolist() == [b"54321"]


@pytest.mark.parametrize("path", ["/metrics", "/v2/health/ready", "/v2/models", INFER])
def test_a_foreign_host_is_refused(server, path):
    with httpx.Client(base_url=server.url, headers={"Host": "evil.example"}) as client:
        if path == INFER:
            response = client.post(path, json=infer_body(["abc"]))
        else:
            response = client.get(path)
    assert response.status_code == 400
    assert "evil.example" in response.json()["error"]
    for host in (f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}"):
        assert httpx.get(server.url + "/metrics", headers={"Host": host}).status_code == 200


def test_a_cross_origin_post_is_refused_and_a_same_origin_one_served(server):
    evil = httpx.post(
        server.url + INFER, json=infer_body(["abc"]), headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code == 403
    same = httpx.post(server.url + INFER, json=infer_body(["abc"]), headers={"Origin": server.url})
    assert same.status_code == 200


@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2/health/live", "/v2/models/reverse"])
def test_head_answers_as_get_without_a_body(server, path):
    head = httpx.head(server.url + path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers.get("content-length") == httpx.get(server.url + path).headers.get(
        "content-length"
    )


def test_the_cli_allows_loopback_names_on_a_loopback_bind_only():
    assert allowed_hosts(None, "127.0.0.1") == LOOPBACK_HOSTS
    assert allowed_hosts(None, "::1") == LOOPBACK_HOSTS
    assert allowed_hosts(None, "0.0.0.0") is None
    assert allowed_hosts(["models.internal"], "0.0.0.0") == ("models.internal",)
    assert allowed_hosts(["*"], "127.0.0.1") is None
    # another loopback address the server binds names itself in its requests' Host
    assert allowed_hosts(None, "127.0.0.2") == (*LOOPBACK_HOSTS, "127.0.0.2")
    assert allowed_hosts(None, "localhost") == LOOPBACK_HOSTS
    # names of the loopback in other spellings: the check was off for them
    assert allowed_hosts(None, "LOCALHOST") == LOOPBACK_HOSTS
    assert allowed_hosts(None, "127.1") == (*LOOPBACK_HOSTS, "127.1")
    assert [host_name(h) for h in ("A.b:80", "[::1]:8000", "::1", "x")] == [
        "a.b",
        "::1",
        "::1",
        "x",
    ]


def test_a_star_among_the_settings_hosts_allows_any_host():
    """Only the command line read "*" as any host: ServerSettings (Python, Ray Serve's
    arguments) compared it as a name, and every request got 400."""
    with RunningServer(ReverseRuntime(), ServerSettings(allowed_hosts=("*",))) as running:
        for host in ("evil.example", "127.0.0.1"):
            response = httpx.get(running.url + "/v2/health/live", headers={"Host": host})
            assert response.status_code == 200, host


def test_allowed_hosts_are_validated():
    for bad in (["localhost"], ("",), "localhost"):
        with pytest.raises(ValueError, match="allowed_hosts"):
            ServerSettings(allowed_hosts=bad)
    # a port or brackets would never match: a Host header's port is dropped before comparing
    for bad, meant in (("127.0.0.1:8000", "'127.0.0.1'"), ("[::1]", "'::1'")):
        message = rf"--allowed-host.*{re.escape(repr(bad))}.*meaning {re.escape(meant)}"
        with pytest.raises(ValueError, match=message):
            ServerSettings(allowed_hosts=(bad,))
    assert ServerSettings(allowed_hosts=("::1", "Models.Internal")).allowed_hosts


def test_request_headers_are_decoded_once_and_a_repeated_names_lines_joined():
    from serving.infer import HEADERS, request_headers

    scope = {"headers": [(b"host", b"127.0.0.1"), (b"x-a", b"1"), (b"x-a", b"\xe9")]}
    headers = request_headers(scope)
    assert headers == {"host": "127.0.0.1", "x-a": "1, \xe9"}
    assert scope[HEADERS][1] is headers
    assert request_headers(scope) is headers  # the guard's decoding serves the handler


def test_request_headers_of_a_scope_copied_with_other_headers_are_decoded_afresh():
    """A layer between the guard and the handler that passes on ``{**scope, "headers": ...}``
    copies the guard's cached decoding too; the handler must read the new headers."""
    from serving.infer import request_headers

    scope = {"headers": [(b"content-type", b"application/octet-stream")]}
    assert request_headers(scope)["content-type"] == "application/octet-stream"
    child = {**scope, "headers": [(b"content-type", b"application/json")]}
    assert request_headers(child) == {"content-type": "application/json"}
    assert request_headers(scope)["content-type"] == "application/octet-stream"


def _raw_post(server, header_lines: list[str], body: bytes) -> tuple[int, bytes]:
    """POST ``body`` to the inference route with these header lines, repeats included (no
    client library sends a header twice); the status and the body of the answer."""
    import socket

    head = "".join(f"{line}\r\n" for line in header_lines)
    request = f"POST {INFER} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n"
    request += "Connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request.encode("latin-1") + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def test_a_repeated_header_reads_as_its_lines_joined(server):
    """RFC 9110 5.3: a field's lines are one comma-separated list. A second Host line is a
    400 whatever the order (the last line was read alone, so a foreign host first passed the
    host check), and two Content-Encoding lines are refused as the one line "gzip, identity"
    is (the last, identity, was read alone)."""
    import gzip
    import json

    body = json.dumps(infer_body(["abc"])).encode()
    port = server.port
    for hosts in (
        ["evil.example", "127.0.0.1"],
        [f"127.0.0.1:{port}", "evil.example"],
        [f"[::1]:{port}", "evil.example"],
        ["127.0.0.1", "127.0.0.1"],  # RFC 9112: any request with two Host lines is a 400
    ):
        status, answer = _raw_post(server, [f"Host: {host}" for host in hosts], body)
        assert status == 400 and b"one Host header" in answer
    status, _ = _raw_post(server, ["Host: 127.0.0.1"], body)
    assert status == 200  # the same request with one Host line
    for lines in (
        ["Content-Encoding: gzip", "Content-Encoding: identity"],
        ["Content-Encoding: gzip, identity"],
    ):
        status, answer = _raw_post(server, ["Host: 127.0.0.1", *lines], gzip.compress(body))
        assert status == 415 and b"Content-Encoding" in answer
    assert [call[0] for call in server.runtime.calls] == [["abc"]]  # the one-Host request
