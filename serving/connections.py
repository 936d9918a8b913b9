"""Connection limits: what uvicorn does not bound on its own (issue 14, items 2 and 3).

uvicorn closes a kept-alive connection after ``timeout_keep_alive``, but nothing else: a
connection that sends nothing, trickles its headers or sends endless headers is kept forever,
and with enough of them the process runs out of file descriptors. :func:`uvicorn_config` gives
uvicorn an HTTP protocol (its own httptools or h11 one, subclassed) that adds:

- a **header timeout**: from the connection's start, or from the first byte of a request on a
  kept-alive one (from the end of the answer before it, for a request begun while that answer
  ran), until that request's headers are complete: 408 and close (a connection that sent
  nothing is closed silently);
- a **header size limit**: past ``max_header_bytes`` of request line (its query string too)
  and headers, 431 and close, whether the headers are still arriving or came in one read, and
  for each pipelined request (one that comes while an answer runs is refused after it:
  httptools parses it at once, and its bytes are counted as they come);
- a **send timeout**: a connection whose answer stops draining (its client reads nothing,
  so the buffers are full and writing paused) for ``send_timeout_s`` is aborted, with what it
  had queued, as nginx's ``send_timeout`` (a client that reads slowly keeps its connection);
  such a connection held its slot and the memory of its answers for as long as the client
  kept it open;
- a **pipelining bound**: more than :data:`MAX_PIPELINED` requests queued behind the one in
  progress on one connection aborts it (uvicorn's httptools protocol queued every request of
  each read, so one client sending requests back to back grew the server by a gigabyte in
  five seconds);
- a **connection bound**: beyond ``max_connections`` full connections, a new one closes the
  longest-idle connection that has no request in progress (as nginx reuses idle keep-alive
  connections when it runs out; one whose buffered answer its client does not read is
  aborted), else the one whose answer has drained nothing for longest (at least
  ``STALL_EVICT_S``, 5 s: :mod:`serving.connection_bound`, with the send timeout);
  when every connection is busy, up to
  ``health_connections`` more are admitted for ``/v2/health/*`` only (other requests on them
  get 503), so that a load balancer can still see the server (an idle one makes room for
  another); beyond those, a new connection gets 503 and is closed. Both 503s carry
  ``Retry-After`` (``retry_after_s``). Lingering connections (below) are not counted; the
  longest-lingering ones are closed while the sockets are over both bounds together.

A connection older than ``max_connection_age_s`` (when set; within 10 % of it, drawn for each
connection) is told to close by the first answer that starts after it: the protocol wraps each
request's ``send``, which adds ``Connection: close`` to such an answer's head (:func:`closing`),
and uvicorn closes the connection once that answer is sent. When requests are already queued
behind that answer (pipelined, or begun), the close goes with the answer to the last of them;
requests that come after that first answer began are not answered (RFC 9112 has the client
retry them).

A connection the server closes while its client may still be sending (an answer that says
``Connection: close``, a refusal, a dropped body past its bound) **lingers**, as nginx's
``lingering_close``: closing a socket with unread bytes makes the kernel send a reset, which
can overtake the last answer (a client still sending a 16 MB body read a reset, not its 413).
The server shuts down writing after its last answer, reads and drops what comes, and closes when
the client closes, after :data:`LINGER_IDLE_S` without a byte, or after ``linger_s``. A
lingering connection takes no slot of the bounds above, and is the first closed when the
sockets are over them.

It also answers **malformed HTTP** (a request line or header the parser refuses, two
Content-Lengths, broken chunked encoding) with the server's JSON error body
(``{"error": "malformed HTTP request: ..."}``) instead of uvicorn's plain-text 400, then
closes the connection. The 400 follows the answers to the requests received before the
malformed one, as h11 has it (httptools parses a whole read at once, and uvicorn wrote its 400
at once: into an answer under way, ahead of a pipelined request's, which was lost). A
``Transfer-Encoding`` other than ``chunked`` gets 501 (compression is ``Content-Encoding``'s).
uvicorn runs without WebSocket support (``ws="none"``: no route uses it), so an ``Upgrade``
request is an HTTP request behind the same checks; httptools stops reading at its headers, so
its connection closes after the answer, and one that declares a body is refused (400): that
body would otherwise be dropped, or read as a request of its own.

The body's read timeout is the app's (``ServerSettings.body_timeout_s``): the protocol cannot
tell a slow body from a slow handler. A request answered before its body was read (an unknown
model, a declared length over the limit) keeps its connection: uvicorn reads the rest of the
body and drops it, then serves the next request. That rest is bounded too: more than
:data:`DISCARD_BYTES`, or longer than ``header_timeout_s``, and the connection is closed (the
answer was sent already; when the declared length is already longer, the answer says
``Connection: close``).

Two things keep a request cheap on the event loop: an answer's head waits for its body and the
two leave in one write (:class:`serving.http1.HeadWithBody`: uvicorn writes them apart), and
each request's scope carries a :class:`serving.signals.RequestSignals`, by which the protocol
tells the handler that the body has all come and that the client has gone, so that the handler
needs no body timer and no watcher task of its own.
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
import random
import time
from typing import Any

import h11
import uvicorn

from serving import protocol
from serving.connection_bound import BoundedConnection, end_now
from serving.http1 import HeadWithBody, closing, origin_form, requests_in, transfer_codings

# ConnectionLimits, fit_to_file_limit and MAX_TIMEOUT_S lived here until 2026-12-06: the
# old import path still works.
from serving.settings import MAX_TIMEOUT_S, ConnectionLimits, fit_to_file_limit
from serving.signals import SIGNALS, RequestSignals

__all__ = [
    "MAX_TIMEOUT_S",
    "REFUSE",
    "ConnectionLimits",
    "fit_to_file_limit",
    "protocol_class",
    "uvicorn_config",
]

logger = logging.getLogger("serving.connections")

#: The scope key under which the protocol asks the app to refuse a request:
#: ``(status, message, headers)``.
REFUSE = "skattn.refuse"

#: The spread of each connection's age limit about ``max_connection_age_s`` (gRPC's jitter).
AGE_JITTER = 0.1

#: How long a lingering connection waits for its client's next byte before it closes (nginx's
#: ``lingering_timeout``), within ``linger_s`` in all.
LINGER_IDLE_S = 5.0

HEALTH_PREFIX = "/v2/health/"

#: The most bytes of a body left unread by an early answer that the connection reads and drops
#: before the next request on it; beyond this it is closed.
DISCARD_BYTES = 1 << 20

#: The most requests one connection may have queued behind the one in progress (HTTP/1.1
#: pipelining: clients that use it send a few); beyond it the connection is aborted.
MAX_PIPELINED = 64

MALFORMED = (
    "malformed HTTP request: its request line, a header, the Content-Length or the chunked "
    "body does not parse"
)


class _GuardedProtocol(BoundedConnection):
    """The mixin of the guarded protocols: put before uvicorn's H11Protocol or
    HttpToolsProtocol (it relies only on their ``cycle``, ``transport``, ``connections`` and
    ``data_received``)."""

    limits: ConnectionLimits = ConnectionLimits()

    @property
    def cycle(self) -> Any:
        """uvicorn's newest request (``RequestResponseCycle``), or None."""
        return self.__dict__.get("_cycle")

    @cycle.setter
    def cycle(self, cycle: Any) -> None:
        """Both parsers create a request's cycle once its headers are complete, before its
        task starts, pipelined requests included: each is checked here."""
        self.__dict__["_cycle"] = cycle
        if cycle is not None:
            cycle.transport = HeadWithBody(cycle.transport, self._close)
            cycle.scope[SIGNALS] = RequestSignals(cycle.flow.resume_reading)
            self._requests += 1
            if self._close_at < math.inf:  # (uvicorn calls the app with cycle.send)
                cycle.send = self._closing_when_aged(cycle.send, self._requests)
            self._headers_complete(cycle.scope)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_deadline = 0.0  # (the loop's clock)
        self._awaiting_headers = False
        self._parser_stopped = False  # httptools stopped (an Upgrade request's headers; a refusal)
        self._refusal_after: tuple[int, str] | None = None  # sent after the earlier answers
        self._ahead_bytes = 0  # httptools: a next request's head, read while an answer runs
        self._read = b""  # the read being parsed
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._discarded = 0  # bytes of a body dropped after its early answer
        self._reading_body = False  # httptools: a request's headers came, its end did not
        self._began = False  # httptools: a request's first bytes came, its end did not
        self._running: Any = None  # httptools: the cycle in progress (self.cycle is the newest)
        self._read_began_with: Any = None  # self.cycle when the read in progress began
        self._close_at = math.inf  # (the loop's clock) when its age limit is reached
        self._requests = 0  # requests whose headers came (cycles made)
        self._last_request: int | None = None  # the one whose answer closes, once past the age
        self._lingering = False  # closed for writing: what the client sends is dropped
        self._linger_end = 0.0  # (the loop's clock) when a lingering connection closes at last
        self._heard_at = 0.0  # (the loop's clock) the lingering client's latest bytes
        self._linger_timer: asyncio.TimerHandle | None = None
        self._stopping = False  # the server stops: closes do not linger

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._await_headers()
        limits = self.limits
        if limits.max_connection_age_s is not None:
            age = limits.max_connection_age_s * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self._close_at = self.loop.time() + age
        self._admit()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_send_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self._disconnect_unanswered()
        super().connection_lost(exc)

    def _disconnect_unanswered(self) -> None:
        """Tell every unfinished request that its client has gone (its answer will not be sent).

        uvicorn tells only self.cycle, the newest request: with requests pipelined, the one in
        progress ran on for no one (its batch never withdrawn) and its answer went to a closed
        transport. Each is told through uvicorn's cycle and through its signals (which withdraw
        its queued items)."""
        queued = [cycle for cycle, _ in getattr(self, "pipeline", ())]
        for cycle in {self._running, self.cycle, *queued} - {None}:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.transport.discard()  # (uvicorn's 100 Continue, a held head, a close)
                cycle.message_event.set()
                cycle.scope[SIGNALS].disconnect()
        if queued:
            self.pipeline.clear()

    def _close(self) -> None:
        """Close the connection once what was written has been sent: every close that may leave
        bytes of the client unread (an answer that says ``Connection: close``, a refusal, a
        dropped body past its bound) comes here.

        Closing a socket with unread bytes in it makes the kernel send a reset, which discards
        what the socket had still to send and can overtake, at the client, the answer already
        sent; a client still sending a long body would read a reset, not its 413. So the
        connection lingers, as nginx's ``lingering_close`` does: it shuts down writing (a FIN
        after the last answer), reads and drops what comes, and closes when the client closes
        (the transport does, at its FIN), after :data:`LINGER_IDLE_S` without a byte, or after
        ``linger_s``. Requests still unanswered are told that their client has gone. A TLS
        transport, which cannot shut down writing alone, and a stopping server (which would
        wait for the client) close at once."""
        transport = self.transport
        if self._lingering or transport.is_closing():
            return
        if self.limits.linger_s == 0 or self._stopping or not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        self._cancel_header_timer()
        self._awaiting_headers = False
        self._unset_keepalive_if_required()
        self._disconnect_unanswered()
        self.flow.resume_reading()
        transport.write_eof()  # once its buffer is sent
        now = self.loop.time()
        self._linger_end, self._heard_at = now + self.limits.linger_s, now
        self._linger_timer = self.loop.call_at(now, self._check_linger)

    def shutdown(self) -> None:
        """The server stops (uvicorn, once for each connection): a lingering connection closes
        now, and one whose answer is in progress closes at once after it, its head saying
        ``Connection: close`` (uvicorn's h11 protocol leaves it out, and a head held for its
        body was written before)."""
        self._stopping = True
        if self._lingering:
            end_now(self.transport)
            return
        super().shutdown()
        cycle = self.cycle  # (httptools: the last one pipelined; those before it keep on)
        if cycle is not None and not cycle.response_complete:
            cycle.transport.say_close()

    def _check_linger(self) -> None:
        """Close the lingering connection once its client has been silent for
        :data:`LINGER_IDLE_S` or ``linger_s`` has passed (bytes still unread then are reset)."""
        end = min(self._linger_end, self._heard_at + LINGER_IDLE_S)
        if self.loop.time() >= end - 0.001:  # (uvloop's timers run on whole milliseconds)
            self._linger_timer = None
            end_now(self.transport)
        else:
            self._linger_timer = self.loop.call_at(end, self._check_linger)

    def on_response_complete(self) -> None:
        """A response is complete (before httptools starts a pipelined request's task): its
        head is sent if it was held (a HEAD answer has no body write to carry it). On a
        lingering connection nothing follows: uvicorn, which sees its transport open, would
        arm its keep-alive timer or start a pipelined request."""
        cycle = self._running if self._running is not None else self.cycle  # httptools', h11's
        if cycle is not None:
            cycle.transport.flush()
        if self._lingering:
            self.server_state.total_requests += 1  # (what uvicorn counts first)
            return
        refusal = self._refusal_after  # (set on httptools alone: h11 has no pipeline)
        if refusal and not getattr(self, "pipeline", ()) and not self.transport.is_closing():
            self.server_state.total_requests += 1
            self._refuse(*refusal)  # every request before the refused one answered
            return
        super().on_response_complete()
        cycle = self.cycle
        answered = cycle is None or cycle.response_complete
        closing = self._lingering or self.transport.is_closing()  # (h11 may refuse the next)
        if answered and not closing and self._next_request_begun():
            # the next request began while this answer ran: its header deadline runs from now,
            # not uvicorn's keep-alive timeout (which closed it, part-way, without an answer)
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
                self.timeout_keep_alive_task = None
            self._await_headers()
            conn = getattr(self, "conn", None)  # h11 holds its bytes unparsed
            known = self._ahead_bytes if conn is None else len(conn.trailing_data[0])
            # (at least 1: its first bytes may have come in the read of the request before it)
            self._header_bytes, self._ahead_bytes = max(known, 1), 0
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(431, self._too_large_message())

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # httptools' (h11 has none)
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's note on an ``Upgrade`` request (``ws="none"``), which told an operator to
        install a WebSocket library (that would only take such requests past the guard).

        httptools stops parsing at an Upgrade request's headers (``HttpParserUpgrade``) and
        uvicorn drops the rest of the read: a body or a pipelined request after it would be
        lost, or read later as a request of its own. So the request is answered (refused if it
        declares a body) and the connection closes, with whatever else it sends dropped. h11
        reads on: its requests are served as usual."""
        if self.cycle is None or getattr(self, "conn", None) is not None:  # h11 (_body_unread)
            return
        self._parser_stopped = True
        self.cycle.keep_alive = False
        scope = self.cycle.scope
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"0").strip() not in (b"0", b"")
        if (declared or b"transfer-encoding" in headers) and REFUSE not in scope:
            message = "an Upgrade request may not carry a body here: send it without Upgrade"
            scope[REFUSE] = (400, message, {})

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its HTTP parser refuses, in the server's JSON; 431 where
        the head was already over the limit (httptools refuses a very long request line)."""
        over = self._awaiting_headers and self._head_bytes() > self.limits.max_header_bytes
        if over and self.cycle is self._read_began_with:  # (else the body did not parse)
            self._refuse(431, self._too_large_message())
            return
        answers = self._answers_before_malformed()
        if answers == "none":
            self._refuse(400, MALFORMED)
        elif answers == "its own":
            self._close()  # (a 400 would land inside it: the client reads it cut short)
        else:
            self._refuse_after_answers(400, MALFORMED)

    def _refuse_after_answers(self, status: int, message: str) -> None:
        """Refuse the request being read once the answers under way are sent; nothing more is
        parsed (what comes is dropped)."""
        self._parser_stopped = True
        self._refusal_after = (status, message)

    def _head_bytes(self) -> int:
        """The bytes of the head being read: those before this read, and this read's up to the
        head's end (all of it when the end did not come; its body and what follows are not
        counted)."""
        data = self._read
        ends = [at + len(end) for end in (b"\r\n\r\n", b"\n\n") if (at := data.find(end)) >= 0]
        return self._header_bytes - len(data) + min(ends, default=len(data))

    def _answers_before_malformed(self) -> str:
        """Which answer is under way that the 400 must not land in: ``"earlier"``, one to a
        request received before the malformed one (httptools only: sent first, then the 400, as
        h11 has it, which parses a request only once the one before it is answered); ``"its
        own"``, the malformed request's early answer, which cannot end well (its body will not
        come); or ``"none"``. A request whose own body does not parse is the one the 400
        answers: it is dropped from httptools' queue if it waits there."""
        pipeline = getattr(self, "pipeline", None)
        if pipeline is None:  # h11: the newest request's own body, or a request after its answer
            cycle = self.cycle
            under_way = cycle is not None and cycle.response_started
            return "its own" if under_way and not cycle.response_complete else "none"
        own_body = self._reading_body  # (else a new request's line, headers or URL)
        if own_body and pipeline and pipeline[0][0] is self.cycle:
            pipeline.popleft()  # (never started)
        running = self._running
        if running is None or running.response_complete:
            return "none"
        if own_body and running is self.cycle:
            return "its own" if running.response_started else "none"
        return "earlier"

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._heard_at = self.loop.time()  # dropped
            return
        if self.transport.is_closing() or self._parser_stopped:
            return  # (after an Upgrade request on httptools: the answer closes the connection)
        conn = getattr(self, "conn", None)
        if conn is not None and conn.their_state is h11.MUST_CLOSE:
            # an answer in progress says Connection: close (or the client did): no later request
            # is read (RFC 9112); h11 would refuse the bytes, and the 400 would land inside that
            # answer
            return
        self._last_active = time.monotonic()
        before = self._read_began_with = self.cycle
        answered = before is None or before.response_complete
        discarding = answered and self._body_unread()  # the rest of an early-answered body
        if discarding:
            self._discard(len(data))
            if self._lingering or self.transport.is_closing():
                return
        elif answered and not self._awaiting_headers:
            # the first byte of the next request on this connection: its header deadline
            # starts now, and a timer is armed only if this read does not complete the headers
            self._await_headers(arm=False)
        if self._awaiting_headers:
            self._header_bytes += len(data)
        # httptools parses a next request's head while an answer runs (h11 holds it unparsed,
        # and stops reading): it is bounded too, its 431 sent after the answers
        ahead = not answered and hasattr(self, "pipeline") and not self._reading_body
        if ahead:
            self._ahead_bytes += len(data)
        self._read = data
        try:
            super().data_received(data)
        finally:
            self._read = b""
        if self._lingering:  # refused in this read (400, 431): nothing more is read or armed
            return
        if getattr(self, "conn", None) is not None:  # h11: its request's end came in this read
            self._body_completed()
        if self._awaiting_headers and self._header_timer is None:
            self._arm_header_timer()
        if len(getattr(self, "pipeline", ())) > MAX_PIPELINED:  # httptools' queued requests
            logger.info("connection aborted: too many pipelined requests")
            self._cancel_header_timer()
            self.transport.abort()  # connection_lost tells the request in progress
            return
        if self.cycle is not before and self.cycle is not None:
            return  # headers completed in this read: checked as their cycle was made
        if discarding and not self._body_unread():  # the dropped body ended in this chunk
            if self._next_request_begun():
                self._await_headers()  # and the next request began: its header deadline runs
            else:
                self._keep_alive()  # idle until the next request, as after one
        elif (
            self._awaiting_headers
            and self._header_bytes > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(431, self._too_large_message())
        elif (
            ahead
            and self._began
            and self._refusal_after is None  # (a 400 of this read's stands)
            and self._ahead_bytes > self.limits.max_header_bytes
        ):
            self._refuse_after_answers(431, self._too_large_message())

    # httptools' parser callbacks (h11's parser state is read from its connection instead)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._reading_body = True  # (not when uvicorn refused the URL: no request was made)

    def on_message_complete(self) -> None:
        self._reading_body = False
        self._began = False
        super().on_message_complete()
        self._body_completed()

    def _body_completed(self) -> None:
        """Tell the newest request that its body has all come, once uvicorn has marked it so
        (not an early answer's dropped body)."""
        cycle = self.cycle
        if cycle is not None and not cycle.more_body:
            cycle.scope[SIGNALS].body_complete = True

    def on_message_begin(self) -> None:
        self._began = True
        super().on_message_begin()

    # -- helpers -----------------------------------------------------------------------------

    def _body_unread(self) -> bool:
        """Whether the parser is inside a request's body (its headers came, its end not)."""
        conn = getattr(self, "conn", None)  # h11's connection state machine
        if conn is not None:
            return conn.their_state is h11.SEND_BODY
        return self._reading_body

    def _discard(self, size: int) -> None:
        """Count ``size`` bytes of a body read after its answer; close past the bounds."""
        if self._discarded == 0:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._discard_timeout
            )
        self._discarded += size
        if self._discarded > DISCARD_BYTES:
            self._close_after_discard()

    def _next_request_begun(self) -> bool:
        """Whether bytes of a next request came after the end of the last one's body (while
        that body is still coming, the bytes are its own)."""
        if self._body_unread():
            return False
        conn = getattr(self, "conn", None)
        if conn is not None:  # h11 keeps them in its buffer until they make a request
            return bool(conn.trailing_data[0])
        return self._began

    def _closing_when_aged(self, send: Any, request: int) -> Any:
        """The ``send`` of the connection's ``request``-th request. The first answer that
        starts past the age limit picks the last request to answer: the newest one received,
        or the one whose first bytes have come after it; that one's answer says ``Connection:
        close`` (so a client that always keeps a request queued is closed too; what it sends
        after that first answer began is left to it to retry, as RFC 9112 has it)."""

        async def aged_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                if self._last_request is None and self.loop.time() >= self._close_at:
                    self._last_request = self._requests + self._requests_behind()
                if self._last_request is not None and request >= self._last_request:
                    message = closing(message)
            await send(message)

        return aged_send

    def _requests_behind(self) -> int:
        """The requests received after the newest one whose headers were parsed: those whose
        first bytes have come (httptools parses every request of a read at once; h11 one at a
        time, the rest waiting in its buffer, counted by a parser of their own)."""
        if not self._next_request_begun():
            return 0
        conn = getattr(self, "conn", None)
        return 1 if conn is None else requests_in(conn.trailing_data[0], MAX_PIPELINED + 1)

    def _keep_alive(self) -> None:
        """Idle between requests again: uvicorn's keep-alive timer (which the dropped body's
        bytes cancelled) runs anew; the next request's header deadline starts at its first
        byte."""
        self._cancel_header_timer()
        self._discarded = 0
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _discard_timeout(self) -> None:
        self._header_timer = None
        if self._body_unread():
            self._close_after_discard()

    def _close_after_discard(self) -> None:
        self._cancel_header_timer()
        self._close()

    def _await_headers(self, arm: bool = True) -> None:
        """A request's headers are awaited from now; ``arm=False`` leaves the timer to
        :meth:`_arm_header_timer`, for a read that may complete them."""
        self._cancel_header_timer()
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        if arm:
            self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_at(self._header_deadline, self._header_timeout)

    def _headers_complete(self, scope: dict) -> None:
        self._cancel_header_timer()
        self._awaiting_headers = False
        self._discarded = 0
        self._ahead_bytes = 0
        origin_form(scope)
        size = (
            len(scope.get("raw_path", b""))
            + len(scope.get("query_string", b""))
            + sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        )
        codings = transfer_codings(scope["headers"])
        if size > self.limits.max_header_bytes:
            scope[REFUSE] = (431, self._too_large_message(), {})
        elif codings - {"chunked"}:  # the parser removed the chunking, nothing else (RFC 9112)
            message = (
                f"unsupported Transfer-Encoding {sorted(codings)}: send the body chunked or "
                "with a Content-Length, compressed with Content-Encoding: gzip or deflate"
            )
            scope[REFUSE] = (501, message, {})
        elif self._health_only and not scope.get("path", "").startswith(HEALTH_PREFIX):
            message = "too many connections: this one may ask /v2/health/* only"
            scope[REFUSE] = (503, message, self._retry_after())

    def _too_large_message(self) -> str:
        return (
            f"request headers exceed max_header_bytes={self.limits.max_header_bytes} "
            "(--max-header-bytes)"
        )

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers:
            return
        if self._header_bytes == 0:
            self.transport.close()  # nothing was asked: nothing to answer
        else:
            self._refuse(
                408,
                f"request headers took longer than header_timeout_s="
                f"{self.limits.header_timeout_s:g} (--header-timeout-s)",
            )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer ``{"error": message}`` with ``status`` (and ``headers``) and close, outside
        any request."""
        self._cancel_header_timer()
        self._awaiting_headers = False
        body = protocol.error_body(message)
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = (
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self._close()


def protocol_class(limits: ConnectionLimits, http_impl: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (``"httptools"``, ``"h11"``, or ``"auto"``: httptools when
    installed) with the limits of ``limits``."""
    if http_impl not in ("auto", "httptools", "h11"):
        raise ValueError(f"http_impl must be 'auto', 'httptools' or 'h11', got {http_impl!r}")
    base: type[asyncio.Protocol]
    if http_impl == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    elif http_impl == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    name = f"Guarded{base.__name__}"
    return type(name, (_GuardedProtocol, base), {"limits": limits})


def uvicorn_config(
    app: Any, limits: ConnectionLimits | None = None, *, http_impl: str = "auto", **kwargs: Any
) -> uvicorn.Config:
    """A ``uvicorn.Config`` for ``app`` whose connections obey ``limits``.

    ``kwargs`` go to ``uvicorn.Config`` (host, port, log settings, ...).
    """
    limits = ConnectionLimits() if limits is None else limits
    return uvicorn.Config(
        app,
        http=protocol_class(limits, http_impl),
        timeout_keep_alive=limits.keep_alive_s,
        # h11 refuses (400) a header block this large; the guard answers 431 before it.
        h11_max_incomplete_event_size=limits.max_header_bytes + (1 << 18),
        # No WebSocket routes: an upgrade request is an HTTP request (a JSON 405 or 404), not a
        # handshake the websockets library answers in plain text past the guard and its limits.
        ws="none",
        **kwargs,
    )
