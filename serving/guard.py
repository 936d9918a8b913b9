"""The app's outermost ASGI layer: requests refused before any route sees them.

- A request that the connection's protocol marked (``scope[serving.connections.REFUSE]``:
  headers too large, a transfer coding other than chunked, an ``Upgrade`` request with a body
  on httptools, or a non-health request on a connection admitted for health checks only) is
  answered with that status and the connection closed.
- **Host allow-list** (``ServerSettings.allowed_hosts``, ``--allowed-host``): a request whose
  ``Host`` names another host gets 400, so that a DNS-rebinding page (``evil.example``
  resolving to 127.0.0.1) cannot read ``/metrics`` or the models' answers.
- **Cross-origin writes**: a POST with an ``Origin`` header that is not the server's own
  (scheme, host and port of ``Host``) gets 403; browsers send ``Origin`` with every
  cross-origin POST, tritonclient and curl send none.
- **Content-Type** of an inference request: ``application/json``, ``application/octet-stream``
  (the binary tensor extension) or none at all (tritonclient sends none); any other, such as
  the ``text/plain`` and form types a web page may POST without a CORS preflight, gets 415.
- ``HEAD`` on a GET route is answered as the GET without its body.
- Any answer that starts before the request's body was read, when the body it declares is longer
  than the connection reads and drops to serve the next request
  (:data:`serving.connections.DISCARD_BYTES`), says ``Connection: close``.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving import protocol
from serving.connections import DISCARD_BYTES, REFUSE
from serving.http1 import closing
from serving.infer import request_headers, send_answer
from serving.settings import host_name

__all__ = ["INFER_CONTENT_TYPES", "RequestGuard", "host_name"]

INFER_CONTENT_TYPES = ("application/json", "application/octet-stream")


class RequestGuard:
    """ASGI middleware in front of everything else (see the module's docstring).

    Parameters
    ----------
    app : ASGI app
    allowed_hosts : iterable of str, optional
        Host names (no ports) a request's ``Host`` may name; None, or ``"*"`` among them: any.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] | None = None) -> None:
        self.app = app
        hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        # "*" is any host wherever the list comes from (a Ray Serve argument, ServerSettings in
        # Python), not only from --allowed-host: read as a name, it refused every request
        self.allowed_hosts = None if hosts is None or "*" in hosts else hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = request_headers(scope).get("content-length", "")
        if protocol.over_limit(declared, DISCARD_BYTES) is not None:  # more than is dropped
            receive, send = _closing_if_unread(receive, send)
        refused = scope.get(REFUSE)
        if refused is not None:
            status, message, headers = refused
            headers = {**headers, "Connection": "close"}
            await send_answer(send, status, headers, protocol.error_body(message))
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await send_answer(send, refusal[0], {}, protocol.error_body(refusal[1]))
            return
        if scope["method"] == "HEAD":
            await self.app({**scope, "method": "GET"}, receive, _without_body(send))
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = request_headers(scope)
        host = headers.get("host")
        if host is not None and "," in host:  # its lines joined (request_headers): RFC 9112
            return 400, f"one Host header, holding one host, is allowed; got {host!r}"
        if self.allowed_hosts is not None and host is not None:
            if host_name(host) not in self.allowed_hosts:
                return 400, f"Host {host!r} is not allowed (--allowed-host)"
        if scope["method"] != "POST":
            return None
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host, scope.get("scheme", "http")):
            return 403, f"cross-origin request from {origin!r} refused"
        if scope["path"].endswith("/infer"):
            content_type = headers.get("content-type")
            if content_type is not None:
                media_type = content_type.split(";", 1)[0].strip().lower()
                if media_type not in INFER_CONTENT_TYPES:
                    return 415, (
                        f"unsupported Content-Type {content_type!r}; send "
                        f"{' or '.join(INFER_CONTENT_TYPES)} (or none)"
                    )
        return None


def _closing_if_unread(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """``receive`` and ``send`` of a request whose answer says ``Connection: close`` when it
    starts before the body was read to its end (any early answer: a refusal here, a 404, 405,
    413): the connection will not read that much to keep the next request, so it says so."""
    read_all = False

    async def tracked_receive() -> Message:
        nonlocal read_all
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            read_all = True
        return message

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start" and not read_all:
            message = closing(message)
        await send(message)

    return tracked_receive, closing_send


def _same_origin(origin: str, host: str | None, scheme: str) -> bool:
    parts = urlsplit(origin)
    return host is not None and parts.scheme == scheme and parts.netloc.lower() == host.lower()


def _without_body(send: Send) -> Send:
    """``send`` for a HEAD request: the GET's status and headers, no body bytes."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head_send
