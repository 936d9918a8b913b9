"""Continuous (iteration-level) batching: the decoder steps over a running set of items.

As LLM servers batch (Orca; vLLM): a queued item joins the running set at the next decoder
step, and an item leaves it and is answered the step it ends, without waiting for the longest
item it ran beside. The dynamic :class:`serving.batcher.Batcher` instead runs a batch's whole
search before the next batch is formed, so an item that arrives just after a batch starts
waits for all of it, and 64 answers leave at once::

    event loop                                  inference thread
    ----------                                  ----------------
    choose_admissions(queue) --admitted, left--> RunningDecode: drop the left, encode and merge
                                                   the admitted, decoder steps until one ends
                                                   or items arrive
    resolve the futures of the items <--ended--- (key, prediction, attention) of each ended item
    ... and again, while items run or wait

Every queue and future stays on the event loop. One hop to the inference thread runs the steps
until an item ends or the set may change (items arrived or left): a lone request costs one hop,
as with the dynamic batcher, not one per output token.
There is no batching delay: an item that arrives while the set runs joins at the next step, so
waiting for more buys nothing (``max_delay_ms`` and ``eager`` do not apply). Requests take
turns at the free rows, and the set holds one temperature at a time
(:func:`serving.batch_policy.choose_admissions`).

Greedy search over the step graphs only (:func:`serving.running.continuous_support`): a beam
item's rows, the Transformer decoder's cache and local-m's centre all depend on the step's
position, so the server batches those models dynamically. Results equal
``runtime.predict_batch``'s for the same sources. If a step raises, the items in the set are
decoded again with the dynamic batcher's bisection, so that only the items that fail on their
own get the error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence

from serving.batch_items import BatcherClosedError, QueuedItem
from serving.batch_policy import choose_admissions
from serving.batcher import Batcher
from serving.interface import Runtime
from serving.running import RunningDecode, continuous_support

__all__ = ["ContinuousBatcher"]

logger = logging.getLogger(__name__)


def _key(item: QueuedItem) -> tuple:
    """What items sharing a step must agree on: the temperature and the maps asked for."""
    return item.temperature, item.maps


class ContinuousBatcher(Batcher):
    """Batch concurrent requests at the level of decoder steps (see the module docstring).

    Parameters
    ----------
    runtime : serving.runtime.Runtime
        One for which :func:`serving.running.continuous_support` is None, else ValueError.
    **kwargs
        :class:`serving.batcher.Batcher`'s: ``max_batch_size`` bounds the rows of the running
        set and ``max_batch_chars`` its padded source characters; ``max_queue``, ``executor``
        and ``metrics`` as there (a hop to the inference thread, one or more steps, counts as
        a batch of its rows); ``instances`` must be 1 (one running set).
    """

    def __init__(self, runtime: Runtime, **kwargs) -> None:
        super().__init__(runtime, **kwargs)
        if self.instances != 1:
            raise ValueError(
                f"instances={self.instances}: a continuous batcher steps one running set; "
                "several batches at once are for dynamic batching (instances=1 here)"
            )
        reason = continuous_support(runtime)
        if reason is not None:
            raise ValueError(f"runtime {runtime!r} cannot batch continuously: {reason}")
        self._running: list[QueuedItem] = []  # in the search (touched on the event loop only)
        # Stepped in the inference thread; replaced on the event loop only between runs.
        self._decode: RunningDecode | None = None
        # Set (on the event loop) when items arrive or leave, or the batcher stops: the
        # inference thread then ends its run of steps so that the set can change.
        self._changed = threading.Event()

    def submit(self, sources: Sequence[str], **kwargs) -> list[asyncio.Future]:
        """Queue the sources of one request (:meth:`Batcher.submit`); they join the running
        set at its next step, when it has room and runs at their temperature."""
        futures = super().submit(sources, **kwargs)
        running = self._running
        if futures and len(running) < self.max_batch_size:
            if not running or _key(self._pending[-1]) == _key(running[0]):
                self._changed.set()
        return futures

    def withdraw(self, futures: Sequence[asyncio.Future]) -> None:
        """Withdraw a request's items (:meth:`Batcher.withdraw`); running ones leave the set
        at its next step."""
        super().withdraw(futures)
        withdrawn = {id(future) for future in futures if future.cancelled()}
        if withdrawn and any(id(item.future) in withdrawn for item in self._running):
            self._changed.set()

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting items (:meth:`Batcher.stop`); the running items finish first."""
        self._changed.set()
        await super().stop(drain)

    async def _schedule(self) -> None:
        """Admit, step and answer, a run of steps at a time, until stopped and drained."""
        try:
            while True:
                self._drop_cancelled()
                if not self._running and not self._pending:
                    if self._stopping:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._workers.acquire()  # the thread is free: admit and time from here
                try:
                    await self._tick()
                finally:
                    self._free_worker(asyncio.current_task())
        finally:  # cancelled, or a bug: whoever still waits gets an answer all the same
            self._changed.set()  # a run of steps still in flight ends after its step
            error = BatcherClosedError("the batcher stopped")
            self._fail(self._running, error)
            self._fail(self._pending, error)
            self._running.clear()
            self._pending.clear()
            self._report_depth()

    async def _tick(self) -> None:
        """One run of steps of the running set, with the queued items that may join it."""
        self._changed.clear()  # what changes from here on ends the next run of steps
        left = [item for item in self._running if item.future.cancelled()]
        running = [item for item in self._running if not item.future.cancelled()]
        longest = max((len(item.source) for item in running), default=0)
        admitted, self._pending = choose_admissions(
            self._pending,
            _key(running[0]) if running else None,
            len(running),
            longest,
            self.max_batch_size,
            self.max_batch_chars,
        )
        if admitted:
            self._rotate([item.request for item in admitted])
            self._report_depth()
            now = time.monotonic()
            if self._metrics is not None:
                for item in admitted:
                    self._metrics.queue_wait(now - item.enqueued)
        running = self._running = running + admitted
        if not running:
            if left:
                self._decode = None  # every caller left: the worker is idle, start afresh
            return
        temperature = running[0].temperature
        started = time.monotonic()
        try:
            ended = await self._in_thread(self._steps, temperature, admitted, left)
        except asyncio.CancelledError:
            raise  # _schedule's finally answers the running items
        except Exception as exc:
            self._record(len(running), started, failed=True)
            logger.warning(
                "continuous step failed; decoding its items again with bisection",
                extra={"batch_size": len(running), "error": repr(exc)},
            )
            await self._redo(running)
            return
        self._record(len(running), started, failed=False)
        if not ended:
            return
        gone = set(map(id, (item for item, _, _ in ended)))
        self._running = [item for item in running if id(item) not in gone]
        for item, prediction, attention in ended:
            self._answer(item, prediction, attention)

    def _steps(
        self, temperature: float | None, admitted: list[QueuedItem], left: list[QueuedItem]
    ) -> list:
        """In the inference thread: drop the items whose callers left, add the admitted ones,
        and step until an item ends or the set may change (:attr:`_changed`): the ended items
        with their predictions and maps. One hop from the event loop thus covers the steps
        between two changes, not one step each."""
        decode = self._decode
        if decode is not None and left:
            decode.drop(set(left))  # first: an emptied set may take another temperature
        if decode is None or (decode.size == 0 and decode.temperature != temperature):
            decode = self._decode = RunningDecode(self.runtime, temperature)
        if admitted:
            decode.admit(admitted, [item.source for item in admitted])
        while True:
            ended = decode.step()
            if ended or not decode.size or self._changed.is_set():
                return ended

    async def _redo(self, items: list[QueuedItem]) -> None:
        """A step raised: decode the set's items again with the dynamic batcher's bisection
        (:meth:`Batcher._run_group`), so that only those that fail on their own get the error."""
        self._decode = None  # its state is unknown; the next step starts a new search
        self._running = []
        items = [item for item in items if not item.future.done()]
        if items:
            with_attention = any(item.with_attention for item in items)
            await self._run_batch(items, items[0].temperature, with_attention)
