"""HTTP/1.1 framing that :mod:`serving.connections` needs beside uvicorn's parsers: an answer's
head held for its body (:class:`HeadWithBody`), the ``Connection: close`` of an answer
(:func:`closing`; :func:`with_close` for a head already written), a count of the requests
buffered in bytes not yet parsed (:func:`requests_in`), the transfer codings a request names
(:func:`transfer_codings`), and an absolute-form target's path (:func:`origin_form`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import h11

__all__ = [
    "COUNT_EVENTS",
    "HeadWithBody",
    "closing",
    "origin_form",
    "requests_in",
    "transfer_codings",
    "with_close",
]

_INTERIM = b"HTTP/1.1 1"  # an interim 1xx answer (uvicorn: 100 Continue, before a body)


class HeadWithBody:
    """The transport as one request's cycle sees it: the response's head (status line and
    headers) waits for the body's first write, and the two leave in one system call.

    uvicorn writes them in two (``http.response.start``, then ``http.response.body``): two
    sends and two TCP segments for every answer, where the server's small JSON answers fit in
    one. Go's ``net/http`` buffers a response's head the same way until the handler writes
    (so a streaming response's head leaves with its first chunk). The cycle's first write
    other than an interim ``1xx`` response (``100 Continue``) is its head; it is held until
    the next write, and sent at the latest when the response completes (a HEAD answer writes
    no body) or the cycle closes the connection: through ``close``, the connection's own close
    (which may linger), where given. A head held or written after :meth:`say_close` says
    ``Connection: close``.
    """

    __slots__ = ("_close", "_closes", "_head", "_state", "_transport")

    _BEFORE, _HOLDING, _SENT, _DISCARDED = 0, 1, 2, 3

    def __init__(
        self, transport: asyncio.Transport, close: Callable[[], None] | None = None
    ) -> None:
        self._transport = transport
        self._close = transport.close if close is None else close  # (the connection's close)
        self._head: bytes | None = None
        self._state = self._BEFORE
        self._closes = False

    def write(self, data: bytes) -> None:
        if self._state == self._HOLDING:
            head, self._head, self._state = self._head, None, self._SENT
            self._transport.writelines((head, data))  # one writev
        elif self._state == self._BEFORE and not data.startswith(_INTERIM):
            self._head, self._state = with_close(data) if self._closes else data, self._HOLDING
        elif self._state != self._DISCARDED:
            self._transport.write(data)

    def say_close(self) -> None:
        """The connection closes after this answer: its head says so, unless it has left
        (uvicorn's h11 protocol closes without saying it when the server stops)."""
        self._closes = True
        if self._state == self._HOLDING:
            self._head = with_close(self._head)

    def discard(self) -> None:
        """The answer will not be sent (its client has gone, or the connection closed for
        writing): a held head is dropped, and every later write is ignored, as a closed
        transport ignores it."""
        self._head, self._state = None, self._DISCARDED

    def flush(self) -> None:
        """Send a held head."""
        if self._state == self._HOLDING:
            head, self._head, self._state = self._head, None, self._SENT
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


def closing(start: dict) -> dict:
    """An ``http.response.start`` message whose answer closes its connection: ``Connection:
    close`` in place of any ``Connection`` header the app set."""
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


def with_close(head: bytes) -> bytes:
    """An answer's ``head`` (its status line and headers, to the blank line) saying
    ``Connection: close`` in place of its ``Connection`` headers (a head that says ``close``
    already is left as it is)."""
    if not head.endswith(b"\r\n\r\n"):
        return head  # (not a whole head: left as it is)
    status, *fields = head[:-4].split(b"\r\n")
    kept = [field for field in fields if field.split(b":")[0].strip().lower() != b"connection"]
    said = b",".join(field.partition(b":")[2] for field in fields if field not in kept)
    if b"close" in (token.strip().lower() for token in said.split(b",")):
        return head
    return b"\r\n".join([status, *kept, b"connection: close"]) + b"\r\n\r\n"


_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]*")


def origin_form(scope: dict) -> None:
    """Give a request made with an absolute-form target (``GET http://host/path``, RFC 9112
    section 3.2.2, which a server must accept) the ``path`` and ``raw_path`` of its origin
    form, as uvicorn's httptools protocol does; its h11 protocol left the scheme and host in
    them, so that no route matched."""
    raw_path = scope.get("raw_path") or b""
    if raw_path[:1] == b"/":
        return
    prefix = _ABSOLUTE.match(raw_path.decode("latin-1"))
    if prefix is None:
        return
    scope["raw_path"] = raw_path[prefix.end() :] or b"/"
    path = _ABSOLUTE.match(scope.get("path", ""))
    if path is not None:
        scope["path"] = scope["path"][path.end() :] or "/"


#: The most parser events :func:`requests_in` reads.
COUNT_EVENTS = 1024


def requests_in(data: bytes, most: int) -> int:
    """How many requests ``data`` holds, the last one counted if it is only begun (or does
    not parse: it will be answered 400); at most ``most``, or as many as
    :data:`COUNT_EVENTS` parser events found (a body of one-byte chunks is one event a chunk)
    and one more, so that the count stays cheap."""
    parser, complete = h11.Connection(h11.SERVER), 0
    parser.receive_data(data)
    for _ in range(COUNT_EVENTS):
        try:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                begun = parser.their_state is not h11.IDLE or bool(parser.trailing_data[0])
                return complete + begun
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return complete
            if isinstance(event, h11.EndOfMessage):
                complete += 1
                if complete >= most:
                    return complete
                # answered (not 2xx: a CONNECT's 2xx would switch protocols), so that the
                # next one is parsed
                parser.send(h11.Response(status_code=404, headers=[(b"content-length", b"0")]))
                parser.send(h11.EndOfMessage())
                if parser.their_state is not h11.DONE:  # it said Connection: close: the last
                    return complete
                parser.start_next_cycle()
        except h11.ProtocolError:  # the real parser answers it 400
            return complete + 1
    return complete + 1


def transfer_codings(headers: list[tuple[bytes, bytes]]) -> set[str]:
    """The transfer codings a request's ``Transfer-Encoding`` headers name, lowercased."""
    return {
        coding.strip().lower()
        for name, value in headers
        if name.lower() == b"transfer-encoding"
        for coding in value.decode("latin-1").split(",")
        if coding.strip()
    }
