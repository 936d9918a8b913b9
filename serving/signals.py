"""What the server's connection tells a request's handler: :class:`RequestSignals`.

The server's HTTP protocol (:mod:`serving.connections`) puts one in each request's ASGI scope,
under :data:`SIGNALS`, so that the handler learns that the request's body has all arrived and
that its client has gone without a timer or a task of its own (under concurrency 64 those cost
about a tenth of the batched server's CPU a request). An app served by another ASGI server
finds none, and reads the body under a timeout and watches ``receive()`` instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

__all__ = ["SIGNALS", "RequestSignals"]

logger = logging.getLogger("serving.connections")

#: The scope key of a request's :class:`RequestSignals` (absent under another server).
SIGNALS = "skattn.signals"


class RequestSignals:
    """What the connection tells one request's handler:

    - ``body_complete``: the request's whole body has arrived (the parser says so), so reading
      it cannot wait and needs no body timeout;
    - ``disconnected``, and :meth:`on_disconnect`'s callbacks: the connection has seen its
      client go, so the items still queued can be withdrawn at once.

    Parameters
    ----------
    resume_reading : callable, optional
        The connection's ``resume_reading``. uvicorn stops reading a connection while a request's
        buffered body is large or a pipelined request waits behind it, and a connection that
        reads nothing never sees its client go; :meth:`on_disconnect` resumes reading, as a
        handler waiting on ``receive()`` would.
    """

    __slots__ = ("_callbacks", "_resume_reading", "body_complete", "disconnected")

    def __init__(self, resume_reading: Callable[[], None] | None = None) -> None:
        self.body_complete = False
        self.disconnected = False
        self._callbacks: list[Callable[[], None]] = []
        self._resume_reading = resume_reading

    def on_disconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when the client goes (at once if it has gone), and read the
        connection meanwhile; returns the function that unregisters it."""
        if self.disconnected:
            callback()
            return _nothing
        self._callbacks.append(callback)
        if self._resume_reading is not None:
            self._resume_reading()
        return functools.partial(_discard_from, self._callbacks, callback)

    def disconnect(self) -> None:
        """The client has gone: tell every callback once."""
        if self.disconnected:
            return
        self.disconnected = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one broken callback must not keep the others from running
                logger.exception("a disconnect callback failed")


def _nothing() -> None:
    pass


def _discard_from(callbacks: list, callback: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):  # (told already)
        callbacks.remove(callback)
