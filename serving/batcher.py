"""Dynamic batching: merge the items of concurrent requests into one runtime call.

A queue of ``(item, future)`` pairs, filled by request handlers on the event loop and drained
by one scheduling task. A batch is taken when ``max_batch_size`` items wait or the oldest has
waited ``max_delay_ms``; it holds only items of its lead item's temperature and attention
layer and head (different ones never share a batch; a request that names the model's own
temperature runs with those that name none), chosen closest to the lead in source
length (in characters, a proxy for tokens) to limit padding, within ``max_batch_size`` items and
``max_batch_chars`` padded characters. Requests take turns at leading a batch, in a rotation
(:meth:`Batcher._rotate`), so that a request of many long items cannot hold the worker for
everyone queued after it, and newer requests cannot keep an item that never fits beside others
(a long one, which runs only when it leads) from its turn.

An ``eager`` batcher also stops waiting as soon as no request is being received (handlers
announce the reading of a request with :meth:`Batcher.receiving`): waiting only pays when more
items are on their way, and a lone client then gets the unbatched latency. A read counts as
coming for ``max_delay_ms`` from its start only, so that a stalled upload cannot make everyone
else wait out the delay.

The blocking runtime call runs in a worker thread (onnxruntime releases the GIL), so the
event loop keeps accepting requests meanwhile; the next batch is formed only when a worker is
free, so under load the batches grow by themselves. ``instances`` batches run at once (one by
default), each in its own thread, as Triton runs a model's instances: a model whose search
keeps one core busy then uses more, while the next batch still forms only when one of them is
free. Batchers that share an executor (the server's models) share its free threads too
(:meth:`Batcher.start`'s ``workers``): a model's batch forms when a thread is free, not when
its own previous batch ended. Every item gets exactly one result; when a
runtime call raises, the batch is split in halves and each run again (down to single items), so
that only the items that fail on their own get the error, and the batcher carries on. Items
whose caller has gone (a cancelled future) are skipped. Running a batch (the thread calls, the
bisection, the workers they hold, ending calls no one waits for) lives in :mod:`serving.batch_runs`;
this module queues, schedules and answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from serving.batch_items import (
    BatcherClosedError,
    BatchError,
    BatchMetrics,
    ItemResult,
    QueuedItem,
    QueueFullError,
)
from serving.batch_policy import choose_batch
from serving.batch_runs import BatchRuns
from serving.interface import Runtime
from skattn.core.checks import check_int, check_real

#: The longest an item may be set to wait for its batch to fill (a minute).
MAX_DELAY_MS = 60_000.0
#: The most batches a batcher runs at once (``instances``).
MAX_INSTANCES = 64

__all__ = [
    "MAX_INSTANCES",
    "BatchError",
    "BatchMetrics",
    "Batcher",
    "BatcherClosedError",
    "ItemResult",
    "QueueFullError",
]


class Batcher(BatchRuns):
    """Batch the items of concurrent requests into ``runtime.predict_batch`` calls.

    Parameters
    ----------
    runtime : serving.interface.Runtime
        Only its ``predict_batch(sources, temperature=None, with_attention=False)`` is called
        (with ``layer`` and ``head`` for items that name them).
    max_batch_size : int, default=64
        The most items in one runtime call.
    max_delay_ms : float, default=2.0
        The longest the oldest waiting item waits for more items to join its batch.
    max_queue : int, default=1024
        The most items waiting; beyond it ``submit`` raises ``QueueFullError``.
    max_batch_chars : int, default=8192
        The most padded source characters in one runtime call (items x the longest one): 64
        items of up to 128 characters make a full batch, 8 of 1,024 do. With requests taking
        turns (see :func:`serving.batch_policy.choose_batch`), this bounds how long one
        request of long items holds the worker before the next request's batch runs.
    executor : ThreadPoolExecutor, optional
        Where the runtime calls run; by default the batcher makes (and shuts down) a
        one-thread executor of its own. Several batchers may share one.
    metrics : BatchMetrics, optional
        Records batch sizes, inference time, queue wait and queue depth.
    eager : bool, default=False
        Take a batch as soon as a worker is free and no request is being received (see
        :meth:`receiving`), rather than waiting out ``max_delay_ms`` for items that may never
        come. ``max_delay_ms`` still bounds the wait while requests are being received.
    instances : int, default=1
        The most batches in the runtime at once (1 to :data:`MAX_INSTANCES`), each in a thread
        of ``executor`` (the batcher's own executor has this many). With more than one, the
        runtime must take concurrent ``predict_batch`` calls (a CPU runtime does; one with IO
        binding does not), and it is told to ``terminate`` only when no batch in it has a
        caller left.

    Examples
    --------
    >>> batcher = Batcher(runtime, max_batch_size=32)  # doctest: +SKIP
    >>> await batcher.start()  # doctest: +SKIP
    >>> results = await batcher.infer(["abc", "hello"])  # doctest: +SKIP
    >>> await batcher.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        max_batch_size: int = 64,
        max_delay_ms: float = 2.0,
        max_queue: int = 1024,
        max_batch_chars: int = 8192,
        executor: ThreadPoolExecutor | None = None,
        metrics: BatchMetrics | None = None,
        eager: bool = False,
        instances: int = 1,
    ) -> None:
        if not callable(getattr(runtime, "predict_batch", None)):
            raise ValueError("runtime must have a predict_batch method")
        self.instances = check_int(instances, "instances", 1, MAX_INSTANCES)
        self.max_batch_size = check_int(max_batch_size, "max_batch_size")
        self.max_delay_ms = check_real(max_delay_ms, "max_delay_ms", 0.0, MAX_DELAY_MS)
        self.max_queue = check_int(max_queue, "max_queue")
        self.max_batch_chars = check_int(max_batch_chars, "max_batch_chars")
        if not isinstance(eager, bool):
            raise ValueError(f"eager must be a bool, got {eager!r}")
        self.eager = eager
        # When each request announced by receiving() (and not queued yet) began to be read.
        self._reads: dict[int, float] = {}
        self._read_tokens = 0
        self.runtime = runtime
        # a request that names the model's own temperature joins the items that name none
        self._own_temperature = getattr(getattr(runtime, "manifest", None), "temperature", None)
        self._own_executor = executor is None
        self._executor = executor
        self._metrics = metrics
        self._pending: list[QueuedItem] = []  # arrival order
        self._init_runs()  # (BatchRuns: the calls in progress, those told to terminate)
        self._submits = 0  # submit() calls so far
        # The rotation's clock: a request's items are stamped with it when queued, and again
        # when the request takes its turn (_rotate), which puts them behind those queued then.
        self._clock = 0
        self._wakeup: asyncio.Event | None = None
        # The free inference threads, shared by the batchers of one executor (start()).
        self._workers: asyncio.Semaphore | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._hurrying = False  # hurry(): no more requests come, so waiting buys nothing
        self._broken = False  # a running batch's task raised (a bug in _run)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the batcher accepts items."""
        return self._task is not None and not self._stopping and not self._task.done()

    @property
    def queue_depth(self) -> int:
        """The number of items waiting for a batch (withdrawn ones leave at once)."""
        return len(self._pending)

    async def start(self, workers: asyncio.Semaphore | None = None) -> None:
        """Start the scheduling task on the running event loop.

        Parameters
        ----------
        workers : asyncio.Semaphore, optional
            The free threads of the executor, when batchers share one (the server's models
            do): a batch is taken out of the queue only once it holds one, so it starts
            running at once, its queue wait ends then, and items that arrived while another
            model's batch held the thread join it. Default: ``instances`` of its own.
        """
        if self._task is not None:
            raise RuntimeError("the batcher was already started")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.instances, thread_name_prefix="skattn-infer"
            )
        self._workers = asyncio.Semaphore(self.instances) if workers is None else workers
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._schedule(), name="skattn-batcher")

    async def stop(self, drain: bool = True) -> None:
        """Stop accepting items and wait for the scheduling task to end.

        Parameters
        ----------
        drain : bool, default=True
            Run the items already queued before stopping; when False they fail with
            ``BatcherClosedError``. The batch in flight always finishes.
        """
        if self._task is None or self._stopping:
            return
        self._stopping = True
        if not drain:
            self._fail(self._pending, BatcherClosedError("the server is shutting down"))
            self._pending.clear()
        self._wakeup.set()
        try:
            await self._task
        finally:
            if self._own_executor:
                self._executor.shutdown(wait=True)

    def hurry(self) -> None:
        """Run what is queued as soon as a worker is free, without waiting out
        ``max_delay_ms`` for more items, until the batcher stops: the server calls this as it
        starts shutting down, when no new request can come to join a batch. A batcher not
        running ignores it."""
        if not self.running:
            return
        self._hurrying = True
        if self._wakeup is not None:
            self._wakeup.set()

    # -- submitting --------------------------------------------------------------------------

    @property
    def _receiving(self) -> int:
        """The number of requests being read (announced by :meth:`receiving`)."""
        return len(self._reads)

    @contextmanager
    def receiving(self) -> Iterator[None]:
        """Announce a request being read: an eager batcher waits (up to ``max_delay_ms``) for it.

        Wrap the reading and validation of a request and its :meth:`submit` in one ``with``
        block, with no ``await`` between ``submit`` and the end of the block.

        A read counts as "more items coming" only for ``max_delay_ms`` from its start: a body
        that takes longer (a slow or stalled upload) could not have joined a batch within the
        delay anyway, and must not make every other client wait out the delay.
        """
        self._read_tokens += 1
        token = self._read_tokens
        self._reads[token] = time.monotonic()
        try:
            yield
        finally:
            del self._reads[token]
            if not self._reads and self._wakeup is not None:
                self._wakeup.set()  # a batch may be due now that nothing more is coming

    def submit(
        self,
        sources: Sequence[str],
        *,
        temperature: float | None = None,
        with_attention: bool = False,
        layer: int | None = None,
        head: int | None = None,
    ) -> list[asyncio.Future]:
        """Queue the sources of one request, all or none; call from the event loop.

        Parameters
        ----------
        sources : sequence of str
            Validated source texts (check them before: one bad item must not fail a batch).
        temperature : float, optional
            The attention temperature; None means the model's own.
        with_attention : bool, default=False
            Whether the results should carry attention maps.
        layer, head : int, optional
            The maps' layer and head (checked before: ``ModelInfo.map_selection``); passed to
            ``runtime.predict_batch`` only when one is set.

        Returns
        -------
        list of asyncio.Future
            One per source, resolving to an ``ItemResult`` or raising ``BatchError``.
            Pass them to :meth:`withdraw` to withdraw the items still queued.

        Raises
        ------
        QueueFullError
            If the queue cannot hold all the sources now.
        BatcherClosedError
            If the batcher is not running.
        """
        if not self.running:
            raise BatcherClosedError("the server is not accepting requests")
        if len(self._pending) + len(sources) > self.max_queue:
            self._drop_cancelled()
            if len(self._pending) + len(sources) > self.max_queue:
                raise QueueFullError(
                    f"the queue holds {len(self._pending)} of at most {self.max_queue} items"
                )
        loop = asyncio.get_running_loop()
        self._submits += 1
        self._clock += 1
        if temperature is not None and temperature == self._own_temperature:
            temperature = None  # the same search as the model's own: the same batches
        maps = (layer, head) if with_attention and (layer, head) != (None, None) else None
        request, turn = self._submits, self._clock
        items = [
            QueuedItem(
                source, temperature, with_attention, loop.create_future(), maps, request, turn
            )
            for source in sources
        ]
        self._pending.extend(items)
        self._report_depth()
        if items:
            self._wakeup.set()
        return [item.future for item in items]

    async def infer(
        self,
        sources: Sequence[str],
        *,
        temperature: float | None = None,
        with_attention: bool = False,
    ) -> list[ItemResult]:
        """Queue the sources of one request and wait for all their results.

        :meth:`submit` then :meth:`results`: same parameters and errors as ``submit``.
        """
        futures = self.submit(sources, temperature=temperature, with_attention=with_attention)
        return await self.results(futures)

    async def results(self, futures: Sequence[asyncio.Future]) -> list[ItemResult]:
        """Wait for the results of a request's futures (from :meth:`submit`).

        If this coroutine is cancelled (the client left), or one item fails, the request's
        items still waiting are withdrawn.
        """
        try:
            return [await future for future in futures]
        finally:
            self.withdraw(futures)

    def withdraw(self, futures: Sequence[asyncio.Future]) -> None:
        """Withdraw a request's items still queued once it is answered or abandoned: cancel
        their futures and take them out of the queue (and its depth gauge) at once. Its failed
        items' errors are marked as retrieved: one error answers it."""
        withdrawn = False
        for future in futures:
            if not future.done():
                withdrawn = future.cancel() or withdrawn
            elif not future.cancelled():
                future.exception()
        if withdrawn:
            self._drop_cancelled()
        # (a future the caller awaited is cancelled with it already)
        self._terminate_unawaited()

    # -- scheduling --------------------------------------------------------------------------

    async def _schedule(self) -> None:
        """Form batches and run them, up to ``instances`` at a time, until stopped and drained
        (the batches in flight finish first)."""
        running: set[asyncio.Task] = set()
        try:
            while True:
                if len(running) >= self.instances:  # its own bound, whatever workers it shares
                    done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a bug in _run ends the batcher, as with one instance
                    continue
                batch = await self._next_batch()  # (holding a worker)
                if batch is None:
                    break
                task = asyncio.create_task(self._run(batch), name="skattn-batch")
                task.add_done_callback(self._batch_done)  # frees the worker; a bug wakes us
                running.add(task)
            for task in [task for task in running if task.done()]:
                task.result()  # a bug (_next_batch returned None for it) ends the batcher now
            for task in running:
                await task
            running = set()
        finally:  # cancelled, or a bug: whoever still waits gets an answer all the same
            try:
                for task in running:  # each answers its own batch (_run_batch)
                    task.cancel()
                if running:
                    await asyncio.wait(running)
            finally:  # (cancelled again meanwhile: the queue is answered all the same)
                self._fail(self._pending, BatcherClosedError("the batcher stopped"))
                self._pending.clear()
                self._report_depth()

    def _batch_done(self, task: asyncio.Task) -> None:
        """A running batch ended: its worker is free; if it ended by a bug,
        :meth:`_next_batch` returns None at once."""
        self._free_worker(task)
        if not task.cancelled() and task.exception() is not None:
            self._broken = True
            self._wakeup.set()

    async def _next_batch(self) -> list[QueuedItem] | None:
        """Wait until a batch is due (full, or its oldest item has waited max_delay) and a
        worker is free; the batch holds that worker (released by :meth:`_batch_done`)."""
        while True:
            if self._broken:  # a running batch hit a bug: _schedule ends the batcher
                return None
            self._drop_cancelled()
            if not self._pending:
                if self._stopping:
                    return None
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            remaining = self._due_in()
            if remaining <= 0:
                await self._workers.acquire()  # items arriving meanwhile may join the batch
                self._drop_cancelled()  # and the batch is due still, or again waits:
                if self._broken or not self._pending or self._due_in() > 0:
                    self._workers.release()  # (a read began, an item of a full one left)
                    continue
                return self._take_batch()
            self._wakeup.clear()
            timer = asyncio.get_running_loop().call_later(remaining, self._wakeup.set)
            await self._wakeup.wait()  # a new item, stop(), or the oldest item's deadline
            timer.cancel()

    def _due_in(self) -> float:
        """Seconds until a batch of the queue is due (0 or less: now): when it is full, the
        batcher stops or hurries, or its oldest item has waited ``max_delay_ms`` (an eager
        batcher's, until no read younger than that may bring more items)."""
        if len(self._pending) >= self.max_batch_size or self._stopping or self._hurrying:
            return 0.0
        max_delay, now = self.max_delay_ms / 1000, time.monotonic()
        remaining = self._pending[0].enqueued + max_delay - now
        if self.eager:  # wait only while a read younger than max_delay may bring items
            coming = max(self._reads.values(), default=-max_delay) + max_delay - now
            remaining = min(remaining, coming)
        return remaining

    def _take_batch(self) -> list[QueuedItem]:
        """The next batch (:func:`serving.batch_policy.choose_batch`), out of the queue."""
        chosen, self._pending = choose_batch(
            self._pending, self.max_batch_size, self.max_batch_chars
        )
        self._rotate([chosen[0].request])
        self._report_depth()
        chosen.sort(key=lambda item: len(item.source))
        return chosen

    # -- helpers -----------------------------------------------------------------------------

    def _rotate(self, requests: Sequence[int]) -> None:
        """These requests took their turn: their queued items go behind every request queued
        now, in this order (newer requests then queue behind them: no item waits for ever)."""
        stamps = {}
        for request in requests:
            if request not in stamps:
                self._clock += 1
                stamps[request] = self._clock
        for item in self._pending:
            item.turn = stamps.get(item.request, item.turn)

    def _drop_cancelled(self) -> None:
        if any(item.future.cancelled() for item in self._pending):
            self._pending = [item for item in self._pending if not item.future.cancelled()]
            self._report_depth()

    def _report_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth(len(self._pending))
