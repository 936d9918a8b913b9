"""Which connections hold the server's sockets: the bound on connections and the send timeout
(:mod:`serving.connections` mixes :class:`BoundedConnection` into its guarded protocol).

- The **connection bound**: beyond ``max_connections`` full connections, a new one closes the
  longest-idle connection of its kind (one whose buffered answer its client does not read is
  aborted), else the one whose answer has drained nothing for longest (at least
  :data:`STALL_EVICT_S`); when every connection is busy, up to ``health_connections`` more are
  admitted for ``/v2/health/*`` only; beyond those, a new connection gets 503 and is closed.
  Lingering connections take no slot; the longest-lingering ones are closed while the sockets
  are over both bounds together.
- The **send timeout**: a connection whose answer drains nothing (its client reads nothing, so
  the buffers are full and writing paused) for ``send_timeout_s`` is aborted, as nginx's
  ``send_timeout``. How long an answer has drained nothing is also what picks a stalled
  connection to evict.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import struct
import time
from typing import Any

__all__ = ["STALL_EVICT_S", "BoundedConnection", "end_now"]

logger = logging.getLogger("serving.connections")

try:  # the kernel's unsent bytes of a socket (Linux: SIOCOUTQ)
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):
    fcntl = None  # type: ignore[assignment]
    _OUTQ = None

#: How long a connection's answer must have drained nothing, as TCP's acknowledgements show
#: it (or ``send_timeout_s``, if shorter), before it may be evicted for a new connection: a
#: slow reader's window reopens in steps, and at 10 kB/s a step took 5 s on the loopback.
STALL_EVICT_S = 5.0


class BoundedConnection:
    """The connection bound and the send timeout, as a mixin of uvicorn's HTTP protocols. Its
    host (``serving.connections``' guarded protocol) gives it uvicorn's ``cycle``,
    ``connections``, ``loop`` and ``transport``, the ``limits``, and its own header state
    (``_awaiting_headers``, ``_header_bytes``, ``_cancel_header_timer``), linger state
    (``_lingering``, ``_linger_end``) and ``_refuse``."""

    limits: Any
    connections: set[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._health_only = False
        self._last_active = time.monotonic()
        self._paused = False  # writes paused: its answer waits in the buffers
        self._buffered = 0  # the write buffer's size when it last drained some
        self._drained_at = 0.0  # when it last drained some (or writing paused)
        self._send_timer: asyncio.TimerHandle | None = None
        super().__init__(*args, **kwargs)

    def _admit(self) -> None:
        """A new connection: within the bound, or made room for by closing another, or refused
        (503)."""
        limits = self.limits
        if len(self.connections) <= limits.max_connections:
            return
        # A lingering connection holds a socket but no slot: the longest-lingering ones are
        # closed while the sockets are over max_connections + health_connections, and the slots
        # are counted without them.
        others = [
            other
            for other in self.connections
            if other is not self and isinstance(other, BoundedConnection)
        ]
        lingering = sorted(
            (other for other in others if other._lingering), key=lambda other: other._linger_end
        )
        excess = len(self.connections) - limits.max_connections - limits.health_connections
        for other in lingering[: max(excess, 0)]:
            end_now(other.transport)
            self.connections.discard(other)  # connection_lost follows on the next loop turn
        full = [other for other in others if not other._lingering and not other._health_only]
        if len(full) < limits.max_connections or self._close_an_idle_connection(full):
            return
        health = [other for other in others if not other._lingering and other._health_only]
        if len(health) < limits.health_connections or self._close_an_idle_connection(health):
            self._health_only = True
            return
        self._refuse(503, "too many connections; retry later", self._retry_after())

    def pause_writing(self) -> None:
        """The buffers are full: the send timeout runs while the answer drains nothing."""
        super().pause_writing()
        self._paused = True
        self._buffered = self._pending_bytes()
        self._drained_at = time.monotonic()
        self._arm_send_timer()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._paused = False
        self._cancel_send_timer()

    def _pending_bytes(self) -> int:
        """What the answer has still to deliver: the transport's buffer and the kernel's send
        queue (which takes megabytes on a fast link and drains as the client reads, while the
        transport's buffer moves into it only in large steps)."""
        size = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None and _OUTQ is not None:
            try:
                size += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0" * 4))[0]
            except (OSError, ValueError):  # closed, or not a TCP socket
                pass
        return size

    def _undrained_s(self) -> float:
        """Seconds since the paused answer last drained some (0 when not paused)."""
        if not self._paused:
            return 0.0
        size = self._pending_bytes()
        if size < self._buffered:  # the client read some: progress
            self._buffered, self._drained_at = size, time.monotonic()
        return time.monotonic() - self._drained_at

    def _arm_send_timer(self) -> None:
        self._cancel_send_timer()
        left = self.limits.send_timeout_s - self._undrained_s()
        self._send_timer = self.loop.call_later(min(max(left, 0.0), 1.0), self._check_send)

    def _check_send(self) -> None:
        """Every second while paused: abort once the answer drained nothing for the timeout."""
        self._send_timer = None
        if not self._paused:
            return
        if self._undrained_s() < self.limits.send_timeout_s:
            self._arm_send_timer()
            return
        logger.info(
            "connection aborted: its answer drained nothing",
            extra={"send_timeout_s": self.limits.send_timeout_s},
        )
        self.transport.abort()  # (close() would wait to send what it cannot)

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _idle(self) -> bool:
        """No request in progress: the last one (if any) was answered, and no byte of the next
        one's request line or headers has come (a request part-way through its headers is
        not idle, however long ago its last byte came)."""
        cycle = self.cycle
        answered = cycle is None or cycle.response_complete
        return answered and not (self._awaiting_headers and self._header_bytes)

    def _close_an_idle_connection(self, others: list[BoundedConnection]) -> bool:
        """Close the longest-idle connection of ``others`` (one whose writes are not paused
        first; what its buffer still holds is dropped), else abort the one whose answer has
        drained nothing for longest, at least :data:`STALL_EVICT_S` as TCP's acknowledgements
        show it (a client that stopped reading, or reads slower than about a receive window in
        that time); False when there is neither."""
        idle = [other for other in others if other._idle()]
        if idle:
            oldest = min(idle, key=lambda other: (other._paused, other._last_active))
            oldest._cancel_header_timer()
            end_now(oldest.transport)
        else:  # each paused answer's drain read once (a system call each)
            drains = ((other._undrained_s(), other) for other in others)
            undrained, oldest = max(drains, key=operator.itemgetter(0), default=(0.0, None))
            if oldest is None or undrained < min(STALL_EVICT_S, self.limits.send_timeout_s):
                return False
            oldest._cancel_header_timer()
            oldest.transport.abort()
        self.connections.discard(oldest)  # connection_lost follows on the next loop turn
        return True

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.limits.retry_after_s)}


def end_now(transport: asyncio.Transport) -> None:
    """Close ``transport`` now: what its buffer still holds is dropped (``close()`` would wait
    for a client that reads nothing, and writes under the high-water mark never pause, so the
    send timeout would never end it)."""
    if transport.get_write_buffer_size():
        transport.abort()
    else:
        transport.close()
