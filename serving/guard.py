"""The app's outermost ASGI layer: requests refused before any route sees them.

- A request that the connection's protocol marked (``scope[serving.connections.REFUSE]``:
  headers too large, or a non-health request on a connection admitted for health checks
  only) is answered with that status and the connection closed.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from serving import protocol
from serving.connections import REFUSE
from serving.infer import send_answer

__all__ = ["RequestGuard"]


class RequestGuard:
    """ASGI middleware in front of everything else (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = scope.get(REFUSE)
        if refused is not None:
            status, message = refused
            await send_answer(send, status, {"Connection": "close"}, protocol.error_body(message))
            return
        await self.app(scope, receive, send)
