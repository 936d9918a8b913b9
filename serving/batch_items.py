"""What goes through the batcher (:mod:`serving.batcher`): queued items, their results, the
errors a caller may get, and the metrics the batcher records."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

#: The ``(layer, head)`` of the attention maps an item asks for; None: the default map.
Maps = tuple[int | None, int | None] | None


class BatchMetrics(Protocol):
    """What the batcher records (``serving.metrics.ModelMetrics`` implements it)."""

    def batch(self, size: int, seconds: float, failed: bool) -> None: ...

    def queue_wait(self, seconds: float) -> None: ...

    def queue_depth(self, depth: int) -> None: ...


class QueueFullError(Exception):
    """The queue cannot take the items of a request now; the client should retry later."""


class BatcherClosedError(Exception):
    """The batcher is not running (not started yet, or stopping)."""


class BatchError(Exception):
    """The runtime call of an item's batch raised; the original error is ``__cause__``."""


@dataclass(frozen=True)
class ItemResult:
    """The answer for one source: its prediction and, when asked for, its attention map.

    ``prediction`` is a str, or a list of tokens for a model with ``output_kind="tokens"``;
    ``attention`` is ``(T_y, T_x)``.
    """

    prediction: str | list[str]
    attention: np.ndarray | None = None


@dataclass(eq=False)
class QueuedItem:
    source: str
    temperature: float | None
    with_attention: bool
    future: asyncio.Future
    maps: Maps = None
    request: int = 0  # which submit() call it came from (they count up)
    turn: int = 0  # its request's place in the rotation (Batcher._rotate), lowest first
    enqueued: float = field(default_factory=time.monotonic)
