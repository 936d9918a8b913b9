"""Running a batch: one runtime call in a worker thread, bisection where it fails, and the
worker it holds.

:class:`BatchRuns` is the half of :class:`serving.batcher.Batcher` that runs what the
batcher's scheduling takes out of its queue (and through whose thread calls the continuous
batcher runs its steps): :meth:`BatchRuns._run_batch` makes one ``runtime.predict_batch`` call
for a batch and, if it raises, runs its halves apart until only the items that fail on their
own get the error; each call runs in a thread of the executor, holding one of the workers (a
call cancelled while it runs frees its worker when it ends, not before); a batch no one waits
for any more is ended by the runtime's ``terminate`` (:meth:`BatchRuns._terminate_unawaited`).
It reads the batcher's ``runtime``, ``_executor``, ``_workers`` and ``_metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from serving.batch_items import BatcherClosedError, BatchError, ItemResult, Maps, QueuedItem

__all__ = ["AbandonedBatchError", "BatchRuns"]

logger = logging.getLogger("serving.batcher")  # the batcher's records, under its name


class AbandonedBatchError(Exception):
    """Raised in the worker thread for a batch no one waits for any more (not a failure)."""


class BatchRuns:
    """Run batches in worker threads (the base of :class:`serving.batcher.Batcher`)."""

    def _init_runs(self) -> None:
        # The runtime calls in progress (their futures) and their batches; those told to
        # terminate that have not ended yet; and the tasks cancelled while their call still
        # ran in a thread, whose worker that call frees when it ends (_in_thread), not the
        # task (_free_worker).
        self._in_calls: dict[asyncio.Future, list[QueuedItem]] = {}
        self._terminating: set[asyncio.Future] = set()
        self._terminated: set[asyncio.Future] = set()  # calls terminate() ended (not failed)
        self._held_by_threads: set[asyncio.Task] = set()

    async def _run(self, batch: list[QueuedItem]) -> None:
        """Run one batch in the worker thread and resolve every item's future."""
        batch = [item for item in batch if not item.future.cancelled()]
        if not batch:
            return
        started = time.monotonic()
        if self._metrics is not None:
            for item in batch:
                self._metrics.queue_wait(started - item.enqueued)
        with_attention = any(item.with_attention for item in batch)
        await self._run_batch(batch, batch[0].temperature, with_attention)

    async def _run_batch(
        self, batch: list[QueuedItem], temperature: float | None, with_attention: bool
    ) -> None:
        """:meth:`_run_group` over a batch taken out of the queue: if it is cancelled (the
        batcher stops) or raises, every item of the batch not answered yet gets an error, also
        those of a half the bisection had not reached."""
        try:
            await self._run_group(batch, temperature, with_attention)
        except BaseException:
            self._fail(batch, BatcherClosedError("the batcher stopped"))
            raise

    async def _run_group(
        self, group: list[QueuedItem], temperature: float | None, with_attention: bool
    ) -> None:
        """One runtime call for ``group``; if it raises, its halves are run apart (bisection),
        so that only the items that fail on their own get the error.

        Bounded: a batch of n items with one failing item costs at most 2 log2(n) more calls
        (12 for 64 items), and 2n - 2 when every item fails (a broken model fails fast).
        """
        sources, maps = [item.source for item in group], group[0].maps  # one maps per batch
        started = time.monotonic()
        try:
            predictions, attentions = await self._call(
                group, sources, temperature, with_attention, maps
            )
        except Exception as exc:  # (cancelled: _run_batch answers the whole batch)
            # stopped on purpose since no one waits (clients gone, a shutdown's deadline), or
            # never started for that: not a failure of the model (the requests counter has the
            # disconnects); a failure whose callers left meanwhile still counts, and is logged
            abandoned = isinstance(exc, AbandonedBatchError)
            self._record(len(group), started, failed=not abandoned)
            if all(item.future.cancelled() for item in group):  # no one waits for an answer
                if not abandoned:
                    logger.warning(
                        "batch failed after its callers left",
                        extra={"batch_size": len(group), "error": repr(exc)},
                    )
                return
            if len(group) > 1:
                logger.warning(
                    "batch failed; running its halves apart",
                    extra={"batch_size": len(group), "error": repr(exc)},
                )
                half = len(group) // 2
                for part in (group[:half], group[half:]):
                    part = [item for item in part if not item.future.cancelled()]
                    if part:
                        await self._run_group(part, temperature, with_attention)
                return
            logger.exception("item failed", extra={"error": repr(exc)})
            error = BatchError(f"inference failed: {exc}")
            error.__cause__ = exc
            self._fail(group, error)
            return
        self._record(len(group), started, failed=False)
        for i, item in enumerate(group):
            self._answer(item, predictions[i], attentions[i] if item.with_attention else None)

    async def _call(self, group: list[QueuedItem], *args) -> tuple:
        """:meth:`_predict` of ``args`` in a worker thread; ``group`` is one of the running
        batches meanwhile, which :meth:`withdraw` terminates once none of their items is
        awaited.

        A call starts only once the calls told to terminate have ended: a runtime's terminate
        is one flag for every call in it (``serving.Runtime``), which would end a call started
        meanwhile too (or, cleared by its start, let a terminated call run to its end).
        """
        while self._terminating:
            await asyncio.wait(self._terminating)
            self._terminating = {call for call in self._terminating if not call.done()}
        call = self._in_thread(self._predict_if_awaited, group, *args)
        self._in_calls[call] = group
        try:
            return await call
        except Exception as exc:
            if call in self._terminated:  # terminate() ended it: no one waited
                raise AbandonedBatchError("terminated: no one waits for this batch") from exc
            raise
        finally:
            del self._in_calls[call]
            self._terminating.discard(call)
            self._terminated.discard(call)

    def _in_thread(self, fn, *args) -> asyncio.Future:
        """``fn(*args)`` in the executor, as a future of the running loop.

        A task that holds a worker and is cancelled while its call runs (a stop cut short at
        shutdown) leaves that call running: the thread is not free before the call ends, so
        the call, not the task, frees the worker then, and the other batchers sharing the
        workers never run more calls at once than there are threads.
        """
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        running = self._executor.submit(fn, *args)
        call = asyncio.wrap_future(running, loop=loop)

        def cancelled(call: asyncio.Future) -> None:
            if call.cancelled() and not running.done():
                self._held_by_threads.add(task)
                running.add_done_callback(lambda _: _call_soon(loop, self._workers.release))

        call.add_done_callback(cancelled)
        return call

    def _free_worker(self, task: asyncio.Task) -> None:
        """``task`` ended, holding a worker: free it, unless a call of its still runs."""
        if task in self._held_by_threads:
            self._held_by_threads.discard(task)
        else:
            self._workers.release()

    def _predict_if_awaited(self, group: list[QueuedItem], *args) -> tuple:
        """:meth:`_predict`, unless every caller of ``group`` left while the call waited for a
        thread (behind another batcher's call, on an executor shared without shared
        ``workers``): ``terminate`` reaches calls in progress only, so a batch abandoned in
        that queue ran in full for no one."""
        if all(item.future.cancelled() for item in group):  # (a stale read only runs it)
            raise AbandonedBatchError("every caller of the batch left before it started")
        return self._predict(*args)

    def _predict(
        self, sources: list[str], temperature: float | None, with_attention: bool, maps: Maps
    ) -> tuple[list[str], list[np.ndarray] | None]:
        """The runtime call (in the worker thread), with its answer checked: one per item."""
        selected = {} if maps is None else dict(zip(("layer", "head"), maps, strict=True))
        predictions, attentions = self.runtime.predict_batch(
            sources, temperature=temperature, with_attention=with_attention, **selected
        )
        if len(predictions) != len(sources):
            raise RuntimeError(
                f"runtime returned {len(predictions)} predictions for {len(sources)} sources"
            )
        if with_attention and (attentions is None or len(attentions) != len(sources)):
            raise RuntimeError("runtime returned no attention map for some sources")
        return list(predictions), attentions

    def _terminate_unawaited(self) -> None:
        """End the runtime calls in progress if no one waits for any of them (runtimes that
        can; a runtime's terminate ends every call in it, so not while one still has a
        caller); no call starts before they have ended."""
        if self._in_calls and all(
            all(item.future.cancelled() for item in group) for group in self._in_calls.values()
        ):
            terminate = getattr(self.runtime, "terminate", None)
            if callable(terminate):
                terminate()
                self._terminating.update(self._in_calls)  # no call starts before they end
                self._terminated.update(self._in_calls)

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _answer(item: QueuedItem, prediction, attention: np.ndarray | None) -> None:
        """Resolve an item's future (unless its caller has gone), with its map if it asked."""
        if not item.future.done():
            item.future.set_result(
                ItemResult(prediction, attention if item.with_attention else None)
            )

    @staticmethod
    def _fail(items: list[QueuedItem], error: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

    def _record(self, size: int, started: float, failed: bool) -> None:
        if self._metrics is not None:
            self._metrics.batch(size, time.monotonic() - started, failed)


def _call_soon(loop: asyncio.AbstractEventLoop, callback) -> None:
    """``callback()`` on ``loop`` from another thread, unless the loop has closed meanwhile
    (nothing is left to run it for)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # closed
        pass
